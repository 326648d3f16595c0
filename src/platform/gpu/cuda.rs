//! [`LoadedCuda`]: a [`Gpu`] for NVIDIA GPUs, over the CUDA driver API
//! (`libcuda.so.1`, the library the NVIDIA driver installs), opened with
//! `dlopen`; nothing is linked.
//!
//! # Contexts
//!
//! The driver API works on contexts, and a context is current per thread.
//! An application that uses the CUDA runtime (`cudaMalloc`, PyTorch) works
//! in each device's *primary* context, which the runtime makes current on
//! its threads. This library retains the primary context of every device it
//! touches (once, released when the runtime table is dropped) and runs each
//! call that needs a context with that device's primary context current:
//! pushed for the call and popped after it when the calling thread had
//! another one (or none) current, so the application's threads are left as
//! they were. Memory the application allocated in a context of its own
//! (`cuCtxCreate`) is still reached: with unified addressing, copies and
//! lookups take any address of the process.
//!
//! Which device an operation belongs to:
//!
//! - the current device (`gpuDevice = -1`): the device of the calling
//!   thread's current context, or device 0 when none is current (the CUDA
//!   runtime's default device);
//! - a copy: the device of its device-memory end (either one), else the
//!   current device;
//! - a pinned host buffer: the current device's context, allocated
//!   *portable* (`CU_MEMHOSTALLOC_PORTABLE`), so that every context treats
//!   it as pinned;
//! - an event: the context of the copy it follows, kept with it.
//!
//! # Memory kinds
//!
//! `cuPointerGetAttributes` (not the single-attribute call, which fails for
//! memory CUDA does not know) classifies an address: device memory is the
//! device's; host memory CUDA allocated or registered is pinned host memory;
//! anything else is host memory CUDA does not know. Managed memory
//! (`cudaMallocManaged`) counts as device memory of the device it was
//! allocated on (its `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, or the current
//! device when the driver names none): the driver exports no dma-buf for it
//! and a NIC cannot register it, so it is staged, and its pages are
//! migrated by the staging copies like any access. `HIPOBJ_REQUIRE_GPU_DIRECT`
//! refuses it.
//!
//! # Errors
//!
//! A failure is the `CUresult` itself, reported where the C ABI reports a
//! `hipError_t`: HIP numbers its errors as CUDA does for every code these
//! calls return (1 invalid value, 2 out of memory, 3 not initialized,
//! 100 no device, 101 invalid device, 201 invalid context, 600 not ready).
//!
//! The library is never unloaded (see [`super::loader`]: the same holds
//! for the driver's threads and exit handlers).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::owners::{release_failed, Backoff};
use super::sys::fn_table;
use crate::error::{Error, Result};
use crate::platform::dl::{self, Loaded};
use crate::platform::{
    DeviceBuffer, Gpu, GpuCall, GpuEvent, HipResult, HostBuffer, PointerKind, RuntimeInfo,
};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`: an ordinal.
pub type CuDevice = c_int;
/// `CUcontext`.
pub type CuContext = *mut c_void;
/// `CUstream`.
pub type CuStream = *mut c_void;
/// `CUevent`.
pub type CuEvent = *mut c_void;
/// `CUdeviceptr`: `unsigned long long` on 64-bit Linux.
pub type CuDevicePtr = c_ulonglong;

/// `CUDA_SUCCESS`
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_NO_DEVICE`
pub const CUDA_ERROR_NO_DEVICE: CuResult = 100;
/// `CUDA_ERROR_NOT_READY`: an event's work has not finished.
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_STREAM_PER_THREAD`: the calling thread's implicit stream of the
/// current context.
pub const CU_STREAM_PER_THREAD: CuStream = std::ptr::without_provenance_mut(2);
/// `CU_EVENT_DISABLE_TIMING`
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context.
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: a `CUmemorytype` (`unsigned int`).
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_uint = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`: a boolean (`unsigned int`).
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_uint = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: an `int`.
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;
/// `CU_MEMORYTYPE_HOST`
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
/// `CU_MEMORYTYPE_DEVICE`
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_MEMORYTYPE_ARRAY`
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;
/// `CU_MEMORYTYPE_UNIFIED`
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`
pub const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 0x1;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`
pub const CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`
pub const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;

/// The driver's soname.
pub const SONAMES: &[&str] = &["libcuda.so.1"];

/// The length `cuDeviceGetPCIBusId` is given (its buffer has one byte
/// more, always NUL).
const PCI_BUS_ID_LEN: c_int = 63;

fn check(code: CuResult) -> HipResult<()> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

fn_table! {
    /// The driver API functions this library calls, with the prototypes of
    /// `<cuda.h>` (CUDA 12 and 13; the `_v2` names are the ones `cuda.h`
    /// maps the plain names to).
    pub struct CudaFns {
        /// `CUresult cuInit(unsigned int Flags)`
        init: "cuInit" => unsafe extern "C" fn(flags: c_uint) -> CuResult,
        /// `CUresult cuDeviceGetCount(int* count)`
        device_get_count: "cuDeviceGetCount" =>
            unsafe extern "C" fn(count: *mut c_int) -> CuResult,
        /// `CUresult cuDeviceGet(CUdevice* device, int ordinal)`
        device_get: "cuDeviceGet" =>
            unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> CuResult,
        /// `CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev)`
        device_get_pci_bus_id: "cuDeviceGetPCIBusId" =>
            unsafe extern "C" fn(bus_id: *mut c_char, len: c_int, device: CuDevice) -> CuResult,
        /// `CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib,
        /// CUdevice dev)`
        device_get_attribute: "cuDeviceGetAttribute" =>
            unsafe extern "C" fn(value: *mut c_int, attribute: c_int, device: CuDevice) -> CuResult,
        /// `CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev)`
        primary_ctx_retain: "cuDevicePrimaryCtxRetain" =>
            unsafe extern "C" fn(ctx: *mut CuContext, device: CuDevice) -> CuResult,
        /// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)` (`_v2`)
        primary_ctx_release: "cuDevicePrimaryCtxRelease_v2" =>
            unsafe extern "C" fn(device: CuDevice) -> CuResult,
        /// `CUresult cuCtxGetCurrent(CUcontext* pctx)`
        ctx_get_current: "cuCtxGetCurrent" =>
            unsafe extern "C" fn(ctx: *mut CuContext) -> CuResult,
        /// `CUresult cuCtxGetDevice(CUdevice* device)`
        ctx_get_device: "cuCtxGetDevice" =>
            unsafe extern "C" fn(device: *mut CuDevice) -> CuResult,
        /// `CUresult cuCtxPushCurrent(CUcontext ctx)` (`_v2`)
        ctx_push_current: "cuCtxPushCurrent_v2" =>
            unsafe extern "C" fn(ctx: CuContext) -> CuResult,
        /// `CUresult cuCtxPopCurrent(CUcontext* pctx)` (`_v2`)
        ctx_pop_current: "cuCtxPopCurrent_v2" =>
            unsafe extern "C" fn(ctx: *mut CuContext) -> CuResult,
        /// `CUresult cuCtxSynchronize(void)`
        ctx_synchronize: "cuCtxSynchronize" => unsafe extern "C" fn() -> CuResult,
        /// `CUresult cuPointerGetAttributes(unsigned int numAttributes,
        /// CUpointer_attribute* attributes, void** data, CUdeviceptr ptr)`
        pointer_get_attributes: "cuPointerGetAttributes" =>
            unsafe extern "C" fn(
                count: c_uint,
                attributes: *mut c_uint,
                data: *mut *mut c_void,
                ptr: CuDevicePtr,
            ) -> CuResult,
        /// `CUresult cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize,
        /// CUdeviceptr dptr)` (`_v2`)
        mem_get_address_range: "cuMemGetAddressRange_v2" =>
            unsafe extern "C" fn(
                base: *mut CuDevicePtr,
                size: *mut usize,
                ptr: CuDevicePtr,
            ) -> CuResult,
        /// `CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags)`
        mem_host_alloc: "cuMemHostAlloc" =>
            unsafe extern "C" fn(ptr: *mut *mut c_void, len: usize, flags: c_uint) -> CuResult,
        /// `CUresult cuMemFreeHost(void* p)`
        mem_free_host: "cuMemFreeHost" => unsafe extern "C" fn(ptr: *mut c_void) -> CuResult,
        /// `CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
        /// size_t ByteCount, CUstream hStream)`
        memcpy_async: "cuMemcpyAsync" =>
            unsafe extern "C" fn(
                dst: CuDevicePtr,
                src: CuDevicePtr,
                len: usize,
                stream: CuStream,
            ) -> CuResult,
        /// `CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags)`
        event_create: "cuEventCreate" =>
            unsafe extern "C" fn(event: *mut CuEvent, flags: c_uint) -> CuResult,
        /// `CUresult cuEventRecord(CUevent hEvent, CUstream hStream)`
        event_record: "cuEventRecord" =>
            unsafe extern "C" fn(event: CuEvent, stream: CuStream) -> CuResult,
        /// `CUresult cuEventQuery(CUevent hEvent)`
        event_query: "cuEventQuery" => unsafe extern "C" fn(event: CuEvent) -> CuResult,
        /// `CUresult cuEventDestroy(CUevent hEvent)` (`_v2`)
        event_destroy: "cuEventDestroy_v2" => unsafe extern "C" fn(event: CuEvent) -> CuResult,
        /// `CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize)` (`_v2`)
        mem_alloc: "cuMemAlloc_v2" =>
            unsafe extern "C" fn(ptr: *mut CuDevicePtr, len: usize) -> CuResult,
        /// `CUresult cuMemFree(CUdeviceptr dptr)` (`_v2`)
        mem_free: "cuMemFree_v2" => unsafe extern "C" fn(ptr: CuDevicePtr) -> CuResult,
        /// `CUresult cuDriverGetVersion(int* driverVersion)`
        driver_get_version: "cuDriverGetVersion" =>
            unsafe extern "C" fn(version: *mut c_int) -> CuResult,
    }
}

/// `CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr,
/// size_t size, CUmemRangeHandleType handleType, unsigned long long flags)`
/// (CUDA 11.7 and later), hence optional.
pub type CuMemGetHandleForAddressRange = unsafe extern "C" fn(
    handle: *mut c_void,
    ptr: CuDevicePtr,
    size: usize,
    handle_type: c_int,
    flags: c_ulonglong,
) -> CuResult;

/// `CUresult cuFlushGPUDirectRDMAWrites(CUflushGPUDirectRDMAWritesTarget
/// target, CUflushGPUDirectRDMAWritesScope scope)` (CUDA 11.3 and later),
/// hence optional.
pub type CuFlushGpuDirectRdmaWrites = unsafe extern "C" fn(target: c_int, scope: c_int) -> CuResult;

/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`: a bitmask.
const ATTR_RDMA_FLUSH_WRITES_OPTIONS: c_int = 117;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`: the scope within
/// which the device orders GPUDirect RDMA writes by itself.
const ATTR_RDMA_WRITES_ORDERING: c_int = 118;
/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST`: the call is supported.
const FLUSH_OPTION_HOST: c_int = 1;
/// `CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER`, and the flush scope of the
/// same value (`CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER`).
const ORDERING_OWNER: c_int = 100;
/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX`.
const FLUSH_TARGET_CURRENT_CTX: c_int = 0;

/// The resolved table and the primary contexts retained through it,
/// shared with the buffers and events it creates.
pub(crate) struct CudaApi {
    fns: CudaFns,
    /// The primary context of every device touched, retained once.
    primary: Mutex<HashMap<CuDevice, usize>>,
    library: ManuallyDrop<Loaded>,
}

impl CudaApi {
    /// `device`'s primary context, retained on first use.
    fn primary(&self, device: CuDevice) -> HipResult<CuContext> {
        let mut primary = self.primary.lock();
        if let Some(&ctx) = primary.get(&device) {
            return Ok(ptr::with_exposed_provenance_mut(ctx));
        }
        let mut handle: CuDevice = 0;
        // SAFETY: `handle` is a valid out-parameter; the driver validates
        // the ordinal.
        check(unsafe { (self.fns.device_get)(&mut handle, device) })?;
        let mut ctx: CuContext = ptr::null_mut();
        // SAFETY: `ctx` is a valid out-parameter and `handle` a device the
        // driver just returned.
        check(unsafe { (self.fns.primary_ctx_retain)(&mut ctx, handle) })?;
        primary.insert(device, ctx.expose_provenance());
        Ok(ctx)
    }

    /// Runs `f` with `device`'s primary context current on this thread,
    /// leaving the thread's own context (or none) current afterwards.
    fn in_context<T>(&self, device: CuDevice, f: impl FnOnce() -> HipResult<T>) -> HipResult<T> {
        let ctx = self.primary(device)?;
        let mut current: CuContext = ptr::null_mut();
        // SAFETY: `current` is a valid out-parameter.
        check(unsafe { (self.fns.ctx_get_current)(&mut current) })?;
        if current == ctx {
            return f();
        }
        // SAFETY: `ctx` is a primary context this table retained and has
        // not released (release happens only when the table drops).
        check(unsafe { (self.fns.ctx_push_current)(ctx) })?;
        let outcome = f();
        let mut popped: CuContext = ptr::null_mut();
        // SAFETY: pops the context pushed above; `popped` is a valid
        // out-parameter.
        let pop = check(unsafe { (self.fns.ctx_pop_current)(&mut popped) });
        outcome.and_then(|value| pop.map(|()| value))
    }

    /// The calling thread's current device: its current context's, or 0.
    fn current_device(&self) -> HipResult<CuDevice> {
        let mut current: CuContext = ptr::null_mut();
        // SAFETY: `current` is a valid out-parameter.
        check(unsafe { (self.fns.ctx_get_current)(&mut current) })?;
        if current.is_null() {
            return Ok(0);
        }
        let mut device: CuDevice = 0;
        // SAFETY: `device` is a valid out-parameter; a context is current.
        check(unsafe { (self.fns.ctx_get_device)(&mut device) })?;
        Ok(device)
    }

    /// The raw attributes of `addr`: memory type, managed, device ordinal.
    fn attributes(&self, addr: usize) -> HipResult<(c_uint, bool, c_int)> {
        let mut memory_type: c_uint = 0;
        let mut managed: c_uint = 0;
        let mut ordinal: c_int = -1;
        let mut which = [
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_IS_MANAGED,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data: [*mut c_void; 3] = [
            (&raw mut memory_type).cast(),
            (&raw mut managed).cast(),
            (&raw mut ordinal).cast(),
        ];
        // SAFETY: three attributes, each with a place of the type the
        // driver writes for it (`unsigned int`, `unsigned int`, `int`); the
        // driver only looks the address up.
        check(unsafe {
            (self.fns.pointer_get_attributes)(
                3,
                which.as_mut_ptr(),
                data.as_mut_ptr(),
                addr as CuDevicePtr,
            )
        })?;
        Ok((memory_type, managed != 0, ordinal))
    }

    /// The device that owns a copy between `dst` and `src`.
    fn device_of_copy(&self, dst: usize, src: usize) -> HipResult<CuDevice> {
        for addr in [dst, src] {
            if let PointerKind::Device { device } = self.kind(addr)? {
                return Ok(device);
            }
        }
        self.current_device()
    }

    fn kind(&self, addr: usize) -> HipResult<PointerKind> {
        let (memory_type, managed, ordinal) = self.attributes(addr)?;
        let device = |ordinal: c_int| -> HipResult<PointerKind> {
            let device = if ordinal >= 0 {
                ordinal
            } else {
                self.current_device()?
            };
            Ok(PointerKind::Device { device })
        };
        match memory_type {
            _ if managed => device(ordinal),
            CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_ARRAY | CU_MEMORYTYPE_UNIFIED => device(ordinal),
            CU_MEMORYTYPE_HOST => Ok(PointerKind::PinnedHost),
            _ => Ok(PointerKind::UnknownHost),
        }
    }
}

impl Drop for CudaApi {
    fn drop(&mut self) {
        for (&device, _) in self.primary.get_mut().iter() {
            // SAFETY: every entry was retained once by `primary`, and
            // nothing made by this table outlives it (they hold its `Arc`).
            let code = unsafe { (self.fns.primary_ctx_release)(device) };
            if code != CUDA_SUCCESS {
                release_failed("cuDevicePrimaryCtxRelease", code);
            }
        }
    }
}

/// The CUDA driver, loaded and initialised.
pub struct LoadedCuda {
    api: Arc<CudaApi>,
    /// `cuInit`'s result: a failure (no device, no driver) is every
    /// device query's answer.
    init: HipResult<()>,
    get_handle_for_address_range: Option<CuMemGetHandleForAddressRange>,
    flush_rdma_writes: Option<CuFlushGpuDirectRdmaWrites>,
    /// Per device: whether a NIC's writes must be flushed before its
    /// context consumes them (the device does not order them itself).
    needs_flush: Mutex<HashMap<i32, bool>>,
    page: usize,
}

impl LoadedCuda {
    /// Opens the first of `sonames` that loads and resolves every function,
    /// and calls `cuInit(0)`. A missing library or function is
    /// [`Error::HipMissing`] (reported as `hipErrorNoDevice`), naming what
    /// was tried; a failed `cuInit` (no GPU) is kept, and answers every
    /// device query.
    pub fn open(sonames: &[&'static str]) -> Result<LoadedCuda> {
        let library = ManuallyDrop::new(dl::open_first(sonames).map_err(Error::HipMissing)?);
        // SAFETY: `CudaFns` is written from cuda.h, the header of the
        // library just loaded, which is never unloaded.
        let fns = unsafe { CudaFns::resolve(&library) }.map_err(Error::HipMissing)?;
        // SAFETY: as above, for the one optional function.
        let get_handle_for_address_range = unsafe {
            dl::symbol::<CuMemGetHandleForAddressRange>(
                &library,
                b"cuMemGetHandleForAddressRange\0",
            )
        }
        .ok();
        // SAFETY: as above.
        let flush_rdma_writes = unsafe {
            dl::symbol::<CuFlushGpuDirectRdmaWrites>(&library, b"cuFlushGPUDirectRDMAWrites\0")
        }
        .ok();
        // SAFETY: cuInit takes flags, which must be 0.
        let init = check(unsafe { (fns.init)(0) });
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        Ok(LoadedCuda {
            api: Arc::new(CudaApi {
                fns,
                primary: Mutex::new(HashMap::new()),
                library,
            }),
            init,
            get_handle_for_address_range,
            flush_rdma_writes,
            needs_flush: Mutex::new(HashMap::new()),
            page,
        })
    }

    /// The soname the driver was found under.
    pub fn soname(&self) -> &'static str {
        self.api.library.name
    }

    /// Whether `cuMemGetHandleForAddressRange` was found.
    pub fn has_dmabuf_export(&self) -> bool {
        self.get_handle_for_address_range.is_some()
    }

    /// `cuDeviceGetAttribute` of `device` (an ordinal).
    pub fn device_attribute(&self, device: i32, attribute: c_int) -> HipResult<i32> {
        self.init?;
        let mut handle: CuDevice = 0;
        // SAFETY: a valid out-parameter; the driver validates the ordinal.
        check(unsafe { (self.api.fns.device_get)(&mut handle, device) })?;
        let mut value: c_int = 0;
        // SAFETY: a valid out-parameter; the driver validates the attribute.
        check(unsafe { (self.api.fns.device_get_attribute)(&mut value, attribute, handle) })?;
        Ok(value)
    }

    /// Whether GPUDirect RDMA writes to `device` must be flushed before its
    /// own context consumes them: the device orders them below OWNER
    /// scope, and supports the host flush. Asked once per device.
    pub fn needs_flush(&self, device: i32) -> bool {
        if let Some(&known) = self.needs_flush.lock().get(&device) {
            return known;
        }
        let ordering = self.device_attribute(device, ATTR_RDMA_WRITES_ORDERING);
        let options = self.device_attribute(device, ATTR_RDMA_FLUSH_WRITES_OPTIONS);
        let needed = matches!((ordering, options), (Ok(o), Ok(f))
            if o < ORDERING_OWNER && f & FLUSH_OPTION_HOST != 0);
        self.needs_flush.lock().insert(device, needed);
        needed
    }

    /// Whether `cuFlushGPUDirectRDMAWrites` was found.
    pub fn has_rdma_flush(&self) -> bool {
        self.flush_rdma_writes.is_some()
    }

    /// The raw `cuPointerGetAttributes` answer for `addr`: memory type,
    /// managed, device ordinal (for the contract's record of what the
    /// driver says).
    pub fn raw_attributes(&self, addr: usize) -> HipResult<(u32, bool, i32)> {
        self.init?;
        self.api.attributes(addr)
    }
}

impl Gpu for LoadedCuda {
    fn device_count(&self) -> HipResult<i32> {
        self.init?;
        let mut count: c_int = 0;
        // SAFETY: a valid out-parameter.
        check(unsafe { (self.api.fns.device_get_count)(&mut count) })?;
        Ok(count)
    }

    fn current_device(&self) -> HipResult<i32> {
        self.init?;
        self.api.current_device()
    }

    fn pci_bus_id(&self, device: i32) -> HipResult<String> {
        self.init?;
        let mut handle: CuDevice = 0;
        // SAFETY: a valid out-parameter; the driver validates the ordinal.
        check(unsafe { (self.api.fns.device_get)(&mut handle, device) })?;
        let mut buf = [0u8; 64];
        // SAFETY: `buf` is writable for more than `PCI_BUS_ID_LEN` bytes.
        check(unsafe {
            (self.api.fns.device_get_pci_bus_id)(buf.as_mut_ptr().cast(), PCI_BUS_ID_LEN, handle)
        })?;
        let id = CStr::from_bytes_until_nul(&buf).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // The driver writes `0000:C1:00.0`; sysfs and HIP write lowercase.
        Ok(id.to_string_lossy().to_ascii_lowercase())
    }

    fn pointer_kind(&self, addr: usize) -> HipResult<PointerKind> {
        self.init?;
        if addr == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.api.kind(addr)
    }

    fn allocation_range(&self, addr: usize) -> HipResult<(usize, usize)> {
        self.init?;
        let device = match self.api.kind(addr)? {
            PointerKind::Device { device } => device,
            _ => self.api.current_device()?,
        };
        self.api.in_context(device, || {
            let mut base: CuDevicePtr = 0;
            let mut size: usize = 0;
            // SAFETY: valid out-parameters; the driver only looks the
            // address up.
            check(unsafe {
                (self.api.fns.mem_get_address_range)(&mut base, &mut size, addr as CuDevicePtr)
            })?;
            let base = usize::try_from(base).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            Ok((base, size))
        })
    }

    fn host_alloc(&self, len: usize) -> HipResult<Arc<dyn HostBuffer>> {
        self.init?;
        let device = self.api.current_device()?;
        let buffer = self
            .api
            .in_context(device, || PinnedHostBuffer::alloc(&self.api, device, len))?;
        Ok(Arc::new(buffer))
    }

    /// Creates the event first, so that a copy is never queued without
    /// one; if `cuEventRecord` fails, the copy is already queued.
    fn copy_async(&self, dst: usize, src: usize, len: usize) -> HipResult<Arc<dyn GpuEvent>> {
        self.init?;
        let device = self.api.device_of_copy(dst, src)?;
        let event = self.api.in_context(device, || {
            let event = RecordedEvent::create(&self.api, device)?;
            // SAFETY: `core` passes ranges of `len` bytes inside buffers
            // that stay allocated until the event completes or is leaked
            // with them (as for HIP, `super::loader`); the driver checks
            // that it can reach both addresses and fails the call
            // otherwise.
            check(unsafe {
                (self.api.fns.memcpy_async)(
                    dst as CuDevicePtr,
                    src as CuDevicePtr,
                    len,
                    CU_STREAM_PER_THREAD,
                )
            })?;
            // SAFETY: the event is live and belongs to the current context,
            // whose per-thread stream the copy was queued on.
            check(unsafe { (self.api.fns.event_record)(event.event, CU_STREAM_PER_THREAD) })?;
            Ok(event)
        })?;
        Ok(Arc::new(event))
    }

    /// `cuCtxSynchronize` in `device`'s primary context: every stream of
    /// it, as `hipDeviceSynchronize` waits for every stream of the device.
    /// Where the device does not order GPUDirect RDMA writes itself
    /// (`GPU_DIRECT_RDMA_WRITES_ORDERING` below OWNER) and supports the
    /// flush, `cuFlushGPUDirectRDMAWrites` to the owner follows, so that a
    /// NIC's writes are visible to the work the application queues next
    /// (elsewhere the call would be a no-op, and is not made).
    fn synchronize(&self, device: i32) -> HipResult<()> {
        self.init?;
        let flush = self.flush_rdma_writes.filter(|_| self.needs_flush(device));
        self.api.in_context(device, || {
            // SAFETY: takes no argument; a context is current.
            check(unsafe { (self.api.fns.ctx_synchronize)() })?;
            match flush {
                // SAFETY: the target and scope are the driver's enum values
                // for "the current context" and "its owner"; a context is
                // current.
                Some(flush) => check(unsafe { flush(FLUSH_TARGET_CURRENT_CTX, ORDERING_OWNER) }),
                None => Ok(()),
            }
        })
    }

    /// The dma-buf covers the pages of `[addr, addr + len)` (the driver
    /// exports page-aligned ranges only), and `addr`'s offset inside it. The
    /// fd is closed with `close(2)`, which is how the driver's dma-bufs are
    /// released. An `Err` is the `CUresult`.
    fn export_dmabuf(&self, addr: usize, len: usize) -> Option<HipResult<(OwnedFd, u64)>> {
        let export = self.get_handle_for_address_range?;
        Some((|| {
            self.init?;
            let device = match self.api.kind(addr)? {
                PointerKind::Device { device } => device,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            };
            let start = addr & !(self.page - 1);
            let end = addr
                .checked_add(len)
                .and_then(|end| end.checked_next_multiple_of(self.page))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let mut fd: c_int = -1;
            self.api.in_context(device, || {
                // SAFETY: `fd` is a valid place for the `int` the driver
                // writes for a dma-buf handle; the driver looks the range up
                // among its allocations and fails for anything else.
                check(unsafe {
                    export(
                        (&raw mut fd).cast(),
                        start as CuDevicePtr,
                        end - start,
                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                        0,
                    )
                })
            })?;
            if fd < 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: on success the driver hands over a new fd that
            // nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok((fd, (addr - start) as u64))
        })())
    }

    /// `cuMemAlloc` in `device`'s primary context.
    fn device_alloc(&self, device: i32, len: usize) -> HipResult<Arc<dyn DeviceBuffer>> {
        self.init?;
        let buffer = self
            .api
            .in_context(device, || DeviceMemory::alloc(&self.api, device, len))?;
        Ok(Arc::new(buffer))
    }

    fn runtime(&self) -> HipResult<RuntimeInfo> {
        self.init?;
        let mut version: c_int = 0;
        // SAFETY: a valid out-parameter.
        check(unsafe { (self.api.fns.driver_get_version)(&mut version) })?;
        Ok(RuntimeInfo {
            name: "CUDA",
            library: self.soname(),
            version,
        })
    }

    fn call_name(&self, call: GpuCall) -> &'static str {
        call.cuda_name()
    }
}

// ---------------------------------------------------------------- owners

/// Device memory from `cuMemAlloc`, freed with `cuMemFree` in the same
/// primary context on drop.
pub(crate) struct DeviceMemory {
    api: Arc<CudaApi>,
    device: CuDevice,
    ptr: CuDevicePtr,
    len: usize,
}

impl DeviceMemory {
    /// `cuMemAlloc` of `len` bytes in the current context, which is
    /// `device`'s. `CUDA_ERROR_INVALID_VALUE` for `len == 0`, which the
    /// driver refuses too.
    fn alloc(api: &Arc<CudaApi>, device: CuDevice, len: usize) -> HipResult<DeviceMemory> {
        if len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: a valid out-parameter; a context is current.
        check(unsafe { (api.fns.mem_alloc)(&mut ptr, len) })?;
        if ptr == 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(DeviceMemory {
            api: Arc::clone(api),
            device,
            ptr,
            len,
        })
    }
}

impl DeviceBuffer for DeviceMemory {
    fn addr(&self) -> usize {
        // A device address fits the host's pointer width (UVA, 64-bit).
        usize::try_from(self.ptr).unwrap_or(usize::MAX)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn device(&self) -> i32 {
        self.device
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let freed = self.api.in_context(self.device, || {
            // SAFETY: `ptr` came from cuMemAlloc and is freed only here;
            // whoever copied into it waited for the copy (the Rust API
            // waits for every copy it starts before the buffer can drop).
            check(unsafe { (self.api.fns.mem_free)(self.ptr) })
        });
        if let Err(code) = freed {
            release_failed("cuMemFree", code);
        }
    }
}

/// Pinned host memory from `cuMemHostAlloc` (portable), freed with
/// `cuMemFreeHost` on drop unless leaked.
pub(crate) struct PinnedHostBuffer {
    api: Arc<CudaApi>,
    /// The device whose primary context allocated it, and frees it.
    device: CuDevice,
    ptr: ptr::NonNull<c_void>,
    len: usize,
    leaked: AtomicBool,
}

// SAFETY: the buffer exclusively owns its allocation, never reads or writes
// through `ptr` (it only reports the address), and frees it once, in `Drop`.
// The driver API may be called from any thread; the free runs in the
// allocating context (`CudaApi::in_context`).
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: as for `Send`; `&self` shares only the atomic `leaked` flag.
unsafe impl Sync for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// `cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)` in the current context,
    /// which is `device`'s. `CUDA_ERROR_INVALID_VALUE` for `len == 0`: a
    /// buffer is never empty.
    fn alloc(api: &Arc<CudaApi>, device: CuDevice, len: usize) -> HipResult<PinnedHostBuffer> {
        if len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: a valid out-parameter; a context is current.
        check(unsafe { (api.fns.mem_host_alloc)(&mut ptr, len, CU_MEMHOSTALLOC_PORTABLE) })?;
        let ptr = ptr::NonNull::new(ptr).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(PinnedHostBuffer {
            api: Arc::clone(api),
            device,
            ptr,
            len,
            leaked: AtomicBool::new(false),
        })
    }
}

impl HostBuffer for PinnedHostBuffer {
    fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    fn len(&self) -> usize {
        self.len
    }

    fn leak(&self) {
        self.leaked.store(true, Ordering::Release);
    }

    fn write(&self, offset: usize, data: &[u8]) -> bool {
        // SAFETY: `len` bytes of host memory from cuMemHostAlloc, owned by `self`
        // for the call; the owner never makes a reference to them.
        unsafe { super::host_write(self.addr(), self.len, offset, data) }
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        // SAFETY: as in `write`.
        unsafe { super::host_read(self.addr(), self.len, offset, out) }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        if self.leaked.load(Ordering::Acquire) {
            return;
        }
        let freed = self.api.in_context(self.device, || {
            // SAFETY: `ptr` came from cuMemHostAlloc, is freed only here,
            // and was not leaked, so no copy the library still tracks
            // writes it.
            check(unsafe { (self.api.fns.mem_free_host)(self.ptr.as_ptr()) })
        });
        if let Err(code) = freed {
            release_failed("cuMemFreeHost", code);
        }
    }
}

/// An event created with `CU_EVENT_DISABLE_TIMING` in `device`'s primary
/// context, destroyed with `cuEventDestroy` on drop unless leaked. Waited
/// for by polling `cuEventQuery` with the [`Backoff`] HIP's events use.
pub(crate) struct RecordedEvent {
    api: Arc<CudaApi>,
    device: CuDevice,
    event: CuEvent,
    leaked: AtomicBool,
}

// SAFETY: the owner holds the only copy of the handle and destroys it once,
// in `Drop`. The driver API may be called from any thread, and each call
// on the event runs with its context current (`CudaApi::in_context`).
unsafe impl Send for RecordedEvent {}
// SAFETY: as for `Send`; the driver synchronises calls on one event, and
// `&self` otherwise shares only the atomic `leaked` flag.
unsafe impl Sync for RecordedEvent {}

impl RecordedEvent {
    /// `cuEventCreate` in the current context, which is `device`'s.
    fn create(api: &Arc<CudaApi>, device: CuDevice) -> HipResult<RecordedEvent> {
        let mut event: CuEvent = ptr::null_mut();
        // SAFETY: a valid out-parameter; a context is current.
        check(unsafe { (api.fns.event_create)(&mut event, CU_EVENT_DISABLE_TIMING) })?;
        Ok(RecordedEvent {
            api: Arc::clone(api),
            device,
            event,
            leaked: AtomicBool::new(false),
        })
    }

    /// `cuEventQuery`: `Ok(true)` done, `Ok(false)` not yet.
    fn query(&self) -> HipResult<bool> {
        self.api.in_context(self.device, || {
            // SAFETY: `event` is live (destroyed only in `Drop`).
            match unsafe { (self.api.fns.event_query)(self.event) } {
                CUDA_SUCCESS => Ok(true),
                CUDA_ERROR_NOT_READY => Ok(false),
                code => Err(code),
            }
        })
    }
}

impl GpuEvent for RecordedEvent {
    fn wait(&self, deadline: Instant) -> HipResult<bool> {
        Backoff::poll_until(deadline, || self.query())
    }

    fn leak(&self) {
        self.leaked.store(true, Ordering::Release);
    }
}

impl Drop for RecordedEvent {
    fn drop(&mut self) {
        if self.leaked.load(Ordering::Acquire) {
            return;
        }
        let destroyed = self.api.in_context(self.device, || {
            // SAFETY: `event` came from cuEventCreate and is destroyed only
            // here.
            check(unsafe { (self.api.fns.event_destroy)(self.event) })
        });
        if let Err(code) = destroyed {
            release_failed("cuEventDestroy", code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_no_device() {
        let err = LoadedCuda::open(&["libhipobj-test-no-such-cuda.so.1"])
            .err()
            .unwrap();
        assert_eq!(err.hip_error(), crate::error::HIP_ERROR_NO_DEVICE);
        assert!(
            err.to_string().contains("libhipobj-test-no-such-cuda.so.1"),
            "{err}"
        );
    }

    #[test]
    fn a_library_without_the_driver_functions_is_missing() {
        let err = LoadedCuda::open(&["libc.so.6"]).err().unwrap();
        assert!(
            err.to_string()
                .contains("libc.so.6: symbol cuInit not found"),
            "{err}"
        );
    }
}
