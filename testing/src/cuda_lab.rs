//! The application's part of the GPU checks on a real NVIDIA GPU: device and
//! managed memory from the CUDA driver, byte access to it, and GPU work
//! that keeps a stream busy (a kernel that spins on the GPU's clock).
//!
//! Everything runs in each device's primary context, made current on the
//! calling thread as the CUDA runtime makes it current for an application.
//! A failure panics: this is test code on a machine that has a GPU.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use parking_lot::Mutex;

use super::contract::{GpuEnv, GpuLab, LabMemory, GPU_BUSY};
use hipobj::fn_table;
use hipobj::platform::dl::{self, Loaded};
use hipobj::platform::gpu::cuda::{
    CuContext, CuDevice, CuDevicePtr, CuResult, CuStream, LoadedCuda, CUDA_SUCCESS,
    CU_STREAM_PER_THREAD, SONAMES,
};

/// `CUmodule`.
type CuModule = *mut c_void;
/// `CUfunction`.
type CuFunction = *mut c_void;
/// `CU_MEM_ATTACH_GLOBAL`
const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;

/// A kernel of one thread that returns once `ns` nanoseconds of the GPU's
/// global timer have passed since it started: real work that holds its
/// stream for as long as asked. PTX ISA 7.0 for sm_75 and later, which the
/// driver compiles for the GPU at hand.
const SPIN_PTX: &str = "\
.version 7.0
.target sm_75
.address_size 64
.visible .entry hipobj_spin(.param .u64 ns)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
SPIN:
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra SPIN;
    ret;
}
\0";

fn_table! {
    /// The driver functions the lab needs (`<cuda.h>`).
    pub struct LabFns {
        /// `CUresult cuInit(unsigned int Flags)`
        init: "cuInit" => unsafe extern "C" fn(flags: c_uint) -> CuResult,
        /// `CUresult cuDeviceGet(CUdevice* device, int ordinal)`
        device_get: "cuDeviceGet" =>
            unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> CuResult,
        /// `CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev)`
        primary_ctx_retain: "cuDevicePrimaryCtxRetain" =>
            unsafe extern "C" fn(ctx: *mut CuContext, device: CuDevice) -> CuResult,
        /// `CUresult cuCtxSetCurrent(CUcontext ctx)`
        ctx_set_current: "cuCtxSetCurrent" => unsafe extern "C" fn(ctx: CuContext) -> CuResult,
        /// `CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize)` (`_v2`)
        mem_alloc: "cuMemAlloc_v2" =>
            unsafe extern "C" fn(ptr: *mut CuDevicePtr, len: usize) -> CuResult,
        /// `CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
        /// unsigned int flags)`
        mem_alloc_managed: "cuMemAllocManaged" =>
            unsafe extern "C" fn(ptr: *mut CuDevicePtr, len: usize, flags: c_uint) -> CuResult,
        /// `CUresult cuMemFree(CUdeviceptr dptr)` (`_v2`)
        mem_free: "cuMemFree_v2" => unsafe extern "C" fn(ptr: CuDevicePtr) -> CuResult,
        /// `CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n)` (`_v2`)
        memcpy_htod: "cuMemcpyHtoD_v2" =>
            unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, len: usize) -> CuResult,
        /// `CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n)` (`_v2`)
        memcpy_dtoh: "cuMemcpyDtoH_v2" =>
            unsafe extern "C" fn(dst: *mut c_void, src: CuDevicePtr, len: usize) -> CuResult,
        /// `CUresult cuModuleLoadData(CUmodule* module, const void* image)`
        module_load_data: "cuModuleLoadData" =>
            unsafe extern "C" fn(module: *mut CuModule, image: *const c_void) -> CuResult,
        /// `CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod,
        /// const char* name)`
        module_get_function: "cuModuleGetFunction" =>
            unsafe extern "C" fn(
                function: *mut CuFunction,
                module: CuModule,
                name: *const c_char,
            ) -> CuResult,
        /// `CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned
        /// gridDimY, unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY,
        /// unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream,
        /// void** kernelParams, void** extra)`
        launch_kernel: "cuLaunchKernel" =>
            unsafe extern "C" fn(
                function: CuFunction,
                grid_x: c_uint,
                grid_y: c_uint,
                grid_z: c_uint,
                block_x: c_uint,
                block_y: c_uint,
                block_z: c_uint,
                shared: c_uint,
                stream: CuStream,
                params: *mut *mut c_void,
                extra: *mut *mut c_void,
            ) -> CuResult,
    }
}

fn ok(call: &str, code: CuResult) {
    assert_eq!(code, CUDA_SUCCESS, "{call} failed with CUresult {code}");
}

/// The CUDA lab: the driver, each device's primary context, and the spin
/// kernel of each (loaded on first use).
pub struct CudaLab {
    fns: LabFns,
    contexts: Mutex<Vec<(CuDevice, usize, usize)>>,
    _library: ManuallyDrop<Loaded>,
}

// SAFETY: the lab holds driver handles (contexts, functions) that the driver
// lets any thread use; the table of handles is behind a mutex.
unsafe impl Send for CudaLab {}
// SAFETY: as for `Send`.
unsafe impl Sync for CudaLab {}

impl CudaLab {
    /// Opens the driver and initialises it; panics without one.
    pub fn open() -> CudaLab {
        let library = ManuallyDrop::new(
            dl::open_first(SONAMES).unwrap_or_else(|e| panic!("the CUDA driver: {e}")),
        );
        // SAFETY: `LabFns` is written from cuda.h, the header of the library
        // just loaded, which is never unloaded.
        let fns = unsafe { LabFns::resolve(&library) }.unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: cuInit takes flags, which must be 0.
        ok("cuInit", unsafe { (fns.init)(0) });
        CudaLab {
            fns,
            contexts: Mutex::new(Vec::new()),
            _library: library,
        }
    }

    /// Makes `device`'s primary context current on this thread; returns
    /// the spin kernel of that context.
    fn enter(&self, device: CuDevice) -> CuFunction {
        let mut contexts = self.contexts.lock();
        let (ctx, kernel) = match contexts.iter().find(|c| c.0 == device) {
            Some(&(_, ctx, kernel)) => (ctx, kernel),
            None => {
                let mut handle: CuDevice = 0;
                // SAFETY: a valid out-parameter; the driver checks the ordinal.
                ok("cuDeviceGet", unsafe {
                    (self.fns.device_get)(&mut handle, device)
                });
                let mut ctx: CuContext = ptr::null_mut();
                // SAFETY: a valid out-parameter and a device of the driver.
                ok("cuDevicePrimaryCtxRetain", unsafe {
                    (self.fns.primary_ctx_retain)(&mut ctx, handle)
                });
                // SAFETY: a context just retained (never released: the lab
                // lives for the test process).
                ok("cuCtxSetCurrent", unsafe {
                    (self.fns.ctx_set_current)(ctx)
                });
                let mut module: CuModule = ptr::null_mut();
                // SAFETY: a valid out-parameter and NUL-terminated PTX text.
                ok("cuModuleLoadData", unsafe {
                    (self.fns.module_load_data)(&mut module, SPIN_PTX.as_ptr().cast())
                });
                let mut kernel: CuFunction = ptr::null_mut();
                // SAFETY: a valid out-parameter, a loaded module, a
                // NUL-terminated name the PTX defines.
                ok("cuModuleGetFunction", unsafe {
                    (self.fns.module_get_function)(&mut kernel, module, c"hipobj_spin".as_ptr())
                });
                let entry = (ctx.expose_provenance(), kernel.expose_provenance());
                contexts.push((device, entry.0, entry.1));
                entry
            }
        };
        // SAFETY: a primary context the lab retained.
        ok("cuCtxSetCurrent", unsafe {
            (self.fns.ctx_set_current)(ptr::with_exposed_provenance_mut(ctx))
        });
        ptr::with_exposed_provenance_mut(kernel)
    }
}

/// Device or managed memory from the lab, freed with `cuMemFree`.
struct CudaMemory {
    lab: Arc<CudaLab>,
    device: CuDevice,
    ptr: CuDevicePtr,
}

impl LabMemory for CudaMemory {
    fn addr(&self) -> usize {
        usize::try_from(self.ptr).expect("a 64-bit address")
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        self.lab.enter(self.device);
        // SAFETY: `ptr` came from cuMemAlloc or cuMemAllocManaged and is
        // freed only here.
        let code = unsafe { (self.lab.fns.mem_free)(self.ptr) };
        if code != CUDA_SUCCESS && !std::thread::panicking() {
            panic!("cuMemFree failed with CUresult {code}");
        }
    }
}

/// The lab behind an `Arc`, so that its memory can hold it.
struct SharedLab(Arc<CudaLab>);

impl GpuLab for SharedLab {
    fn device_alloc(&self, device: i32, len: usize) -> Box<dyn LabMemory> {
        self.0.enter(device);
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: a valid out-parameter; a context is current.
        ok("cuMemAlloc", unsafe {
            (self.0.fns.mem_alloc)(&mut ptr, len)
        });
        Box::new(CudaMemory {
            lab: Arc::clone(&self.0),
            device,
            ptr,
        })
    }

    fn managed_alloc(&self, len: usize) -> Option<Box<dyn LabMemory>> {
        self.0.enter(0);
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: a valid out-parameter; a context is current.
        ok("cuMemAllocManaged", unsafe {
            (self.0.fns.mem_alloc_managed)(&mut ptr, len, CU_MEM_ATTACH_GLOBAL)
        });
        Some(Box::new(CudaMemory {
            lab: Arc::clone(&self.0),
            device: 0,
            ptr,
        }))
    }

    fn write(&self, addr: usize, data: &[u8]) {
        self.0.enter(0);
        // SAFETY: `data` is readable for its length; the driver checks that
        // the destination is memory it knows.
        ok("cuMemcpyHtoD", unsafe {
            (self.0.fns.memcpy_htod)(addr as CuDevicePtr, data.as_ptr().cast(), data.len())
        });
    }

    fn read(&self, addr: usize, len: usize) -> Vec<u8> {
        self.0.enter(0);
        let mut out = vec![0u8; len];
        // SAFETY: `out` is writable for `len` bytes; the driver checks the
        // source.
        ok("cuMemcpyDtoH", unsafe {
            (self.0.fns.memcpy_dtoh)(out.as_mut_ptr().cast(), addr as CuDevicePtr, len)
        });
        out
    }

    fn occupy(&self, device: i32) {
        let kernel = self.0.enter(device);
        let mut ns: u64 = u64::try_from(GPU_BUSY.as_nanos()).unwrap_or(u64::MAX);
        let mut params: [*mut c_void; 1] = [(&raw mut ns).cast()];
        // SAFETY: the kernel takes one u64, which `params` points to for the
        // duration of the call (the driver copies parameters at launch).
        ok("cuLaunchKernel", unsafe {
            (self.0.fns.launch_kernel)(
                kernel,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                CU_STREAM_PER_THREAD,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        });
    }

    fn release(&self) {}
}

impl GpuEnv {
    /// The CUDA driver on this machine's GPU, with the lab; panics without
    /// a driver or GPU.
    pub fn cuda() -> GpuEnv {
        let gpu = LoadedCuda::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        GpuEnv {
            gpu: Arc::new(gpu),
            lab: Arc::new(SharedLab(Arc::new(CudaLab::open()))),
        }
    }
}
