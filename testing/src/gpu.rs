//! A fake GPU whose device memory is host memory, with copies and events
//! the test completes.
//!
//! Device allocations ([`FakeGpu::alloc_device`]) and pinned host buffers
//! ([`Gpu::host_alloc`]) are real, zeroed, page-aligned heap memory, so the
//! fake fabric can read and write them by address. The fake keeps a map of
//! them (and of host ranges the test registers), which answers
//! `hipPointerGetAttributes`, `hipMemGetAddressRange` and
//! [`DeviceMemory`].
//!
//! Copies run as the test says ([`CopyMode`]): at once, when the test
//! completes them, never, or not at all. A copy only moves bytes between
//! memory the fake owns (device allocations and host buffers, leaked ones
//! included), never to or from memory it was merely told about; a queued
//! copy whose memory was freed before it ran moves nothing and is counted
//! ([`FakeGpu::copies_on_freed_memory`]), which is how a test catches a
//! staging buffer freed under a running copy.
//!
//! A dma-buf export is one end of a fresh Unix socket pair: a real fd with
//! an inode of its own, which [`DeviceMemory::dmabuf_range`] recognises by
//! `(st_dev, st_ino)` through any duplicate, and stops recognising once
//! every duplicate is closed. A dma-buf stands for the whole allocation, as
//! HSA's does: `export_dmabuf` returns the offset of the address in it.
//!
//! Fault points ([`Faults::check`]), each failing with `hipErrorOutOfMemory`
//! (`hipHostMalloc`) or `hipErrorInvalidValue` (the others) unless
//! [`FakeGpu::set_fault_code`] says otherwise: `hipGetDeviceCount`,
//! `hipGetDevice`, `hipDeviceGetPCIBusId`, `hipPointerGetAttributes`,
//! `hipMemGetAddressRange`, `hipHostMalloc`, `hipMemcpyAsync`,
//! `hipEventRecord` (the copy is already queued or done when it fails, as
//! on a real stream), `hipEventQuery` (in [`GpuEvent::wait`]),
//! `hipDeviceSynchronize`, `hsa_amd_portable_export_dmabuf` (not called
//! when the export is [`DmabufMode::Absent`]: the symbol does not exist).
//! The test helpers (`alloc_device`, `read`, `write`, `register_host`...)
//! are not fault points.
//!
//! Counters ([`Counters`]) of live objects: `device_alloc`, `host_alloc`,
//! `gpu_event`, `dmabuf` (exports still tracked: dropped when every
//! duplicate of the fd is found closed, or when the allocation is freed).
//! A leaked host buffer or event still exists, so it stays counted live,
//! and `host_alloc_leaked` / `gpu_event_leaked` count the leaks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, ThreadId};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::{Counters, DeviceMemory, Faults};
use hipobj::platform::{
    DeviceBuffer, Gpu, GpuEvent, HipResult, HostBuffer, PointerKind, RuntimeInfo,
};

/// `hipErrorInvalidValue`
pub const HIP_ERROR_INVALID_VALUE: i32 = 1;
/// `hipErrorOutOfMemory`
pub const HIP_ERROR_OUT_OF_MEMORY: i32 = 2;
/// `hipErrorNoDevice`: what `hipGetDeviceCount` and `hipGetDevice` return
/// on a machine without GPUs.
pub const HIP_ERROR_NO_DEVICE: i32 = hipobj::error::HIP_ERROR_NO_DEVICE;
/// `hipErrorInvalidDevice`
pub const HIP_ERROR_INVALID_DEVICE: i32 = 101;
/// `hipErrorHostMemoryAlreadyRegistered`
pub const HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
/// `hipErrorHostMemoryNotRegistered`
pub const HIP_ERROR_HOST_MEMORY_NOT_REGISTERED: i32 = 713;

/// Alignment of every fake allocation: a page, at least what `hipMalloc`
/// and `hipHostMalloc` give.
pub const ALLOC_ALIGN: usize = 4096;

/// One fake GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeGpuDevice {
    /// What `hipDeviceGetPCIBusId` reports, e.g. `0000:c1:00.0`.
    pub pci_bus_id: String,
}

/// How [`Gpu::copy_async`] behaves; set with [`FakeGpu::set_copy_mode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMode {
    /// The bytes are copied during the call and the event is done.
    #[default]
    Immediate,
    /// The copy is queued; [`FakeGpu::complete_next`] and
    /// [`FakeGpu::complete_all`] perform it and signal its event.
    Manual,
    /// The copy is accepted but never runs and its event never completes
    /// (a DMA that hangs). It is not queued.
    Never,
    /// `hipMemcpyAsync` returns this `hipError_t`.
    Fail(i32),
}

/// What [`Gpu::export_dmabuf`] does; set with [`FakeGpu::set_dmabuf_mode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DmabufMode {
    /// Exports device memory.
    #[default]
    Supported,
    /// The runtime has no export: `None`.
    Absent,
    /// Every export fails with this error.
    Fails(i32),
}

/// The fake GPU runtime: [`Gpu`] for the library, [`DeviceMemory`] for the
/// fake fabric, and helpers for the test. Safe to share between threads.
pub struct FakeGpu {
    devices: Vec<FakeGpuDevice>,
    inner: Arc<Inner>,
    current: Mutex<HashMap<ThreadId, i32>>,
    device_count_error: Mutex<Option<i32>>,
    copy_mode: Mutex<CopyMode>,
    dmabuf_mode: Mutex<DmabufMode>,
    queue: Mutex<VecDeque<QueuedCopy>>,
    copies_on_freed_memory: AtomicU64,
    synchronized: Mutex<Vec<i32>>,
}

/// What allocations, buffers and events share with the fake.
struct Inner {
    faults: Arc<Faults>,
    counters: Arc<Counters>,
    codes: Mutex<HashMap<&'static str, i32>>,
    memory: Mutex<Memory>,
}

impl Inner {
    /// Counts a call of `function`; its error code if the plan fails it.
    fn fault(&self, function: &'static str) -> HipResult<()> {
        if !self.faults.check(function) {
            return Ok(());
        }
        let default = match function {
            "hipHostMalloc" => HIP_ERROR_OUT_OF_MEMORY,
            _ => HIP_ERROR_INVALID_VALUE,
        };
        Err(self.codes.lock().get(function).copied().unwrap_or(default))
    }

    /// `len` zeroed bytes of `kind`; the address.
    fn allocate(&self, len: usize, kind: Kind) -> HipResult<usize> {
        let mem = raw::RawMem::zeroed(len, ALLOC_ALIGN).ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        let addr = mem.addr();
        let region = Region { len, kind, mem };
        self.memory.lock().regions.insert(addr, region);
        Ok(addr)
    }

    /// Frees the allocation at `base`, and forgets its dma-buf exports.
    fn free(&self, base: usize) {
        let mut memory = self.memory.lock();
        // The memory is freed here, under the lock, so no copy is running
        // on it.
        memory.regions.remove(&base);
        let before = memory.exports.len();
        memory.exports.retain(|export| export.base != base);
        for _ in memory.exports.len()..before {
            self.counters.destroyed("dmabuf");
        }
    }
}

/// The fake's map of memory. Regions never overlap: each is a distinct
/// live (or leaked) heap allocation of at least one byte.
#[derive(Default)]
struct Memory {
    /// Device allocations and pinned host buffers, by first address.
    regions: BTreeMap<usize, Region>,
    /// Host ranges registered by the test: first address -> bytes.
    registered: BTreeMap<usize, usize>,
    /// dma-bufs handed out and not yet known to be closed.
    exports: Vec<Export>,
}

struct Region {
    len: usize,
    kind: Kind,
    mem: raw::RawMem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Device(i32),
    Host,
}

struct Export {
    /// `(st_dev, st_ino)` of the exported socket.
    identity: (u64, u64),
    /// The allocation the dma-buf stands for.
    base: usize,
    len: usize,
    /// The other end, non-blocking: reads end of file once every duplicate
    /// of the exported end is closed. Until then the exported socket's
    /// inode is in use, so no other file can have its identity.
    peer: UnixStream,
}

impl Export {
    fn is_open(&self) -> bool {
        let mut byte = [0u8; 1];
        match (&self.peer).read(&mut byte) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }
}

impl Memory {
    /// The region containing `addr`, with its first address.
    fn containing(&self, addr: usize) -> Option<(usize, &Region)> {
        let (&base, region) = self.regions.range(..=addr).next_back()?;
        (addr - base < region.len).then_some((base, region))
    }

    /// A pointer to `addr` if `[addr, addr + len)`, `len > 0`, lies inside
    /// one region.
    fn span(&self, addr: usize, len: usize) -> Option<*mut u8> {
        let (base, region) = self.containing(addr)?;
        let offset = addr - base;
        (len > 0 && len <= region.len - offset).then(|| region.mem.ptr().wrapping_add(offset))
    }

    fn can_copy(&self, dst: usize, src: usize, len: usize) -> bool {
        len == 0 || (self.span(dst, len).is_some() && self.span(src, len).is_some())
    }

    /// Copies `len` bytes from `src` to `dst` if both ranges lie inside
    /// regions; whether it did.
    fn copy(&self, dst: usize, src: usize, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let (Some(to), Some(from)) = (self.span(dst, len), self.span(src, len)) else {
            return false;
        };
        // SAFETY: `span` found each range inside one region of this map, so
        // inside a live allocation of at least `len` bytes from `offset`. A
        // region's memory is freed only after its removal from the map,
        // which needs the lock whose guard `&self` borrows, so neither is
        // freed during the copy. What else touches these bytes (the fake
        // fabric's RDMA) orders itself against copies as it would against
        // a real DMA engine.
        unsafe { raw::copy(to, from, len) };
        true
    }

    fn read(&self, addr: usize, len: usize) -> Option<Vec<u8>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let from = self.span(addr, len)?;
        let mut bytes = vec![0u8; len];
        // SAFETY: `from` is valid for `len` bytes and stays allocated while
        // the lock is held (see `copy`); `bytes` is a fresh buffer of `len`
        // bytes that nothing else can see.
        unsafe { raw::copy(bytes.as_mut_ptr(), from, len) };
        Some(bytes)
    }

    fn write(&self, addr: usize, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        let Some(to) = self.span(addr, data.len()) else {
            return false;
        };
        // SAFETY: `to` is valid for `data.len()` bytes and stays allocated
        // while the lock is held (see `copy`); `data` is a live slice of
        // that length. `raw::copy` tolerates overlap.
        unsafe { raw::copy(to, data.as_ptr(), data.len()) };
        true
    }

    fn overlaps_anything(&self, addr: usize, end: usize) -> bool {
        let overlaps = |base: usize, len: usize| base < end && addr < base.saturating_add(len);
        self.regions.iter().any(|(&b, r)| overlaps(b, r.len))
            || self.registered.iter().any(|(&b, &l)| overlaps(b, l))
    }

    fn is_registered(&self, addr: usize) -> bool {
        self.registered
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &len)| addr - base < len)
    }

    /// Forgets exports whose fd is closed everywhere.
    fn purge_closed_exports(&mut self, counters: &Counters) {
        self.exports.retain(|export| {
            let open = export.is_open();
            if !open {
                counters.destroyed("dmabuf");
            }
            open
        });
    }
}

/// `(st_dev, st_ino)` of the file `fd` refers to.
pub(crate) fn identity(fd: &OwnedFd) -> Option<(u64, u64)> {
    let meta = File::from(fd.try_clone().ok()?).metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The completion state of a copy, shared by its event and its queue entry.
#[derive(Default)]
struct EventState {
    done: Mutex<bool>,
    signal: Condvar,
}

impl EventState {
    fn complete(&self) {
        *self.done.lock() = true;
        self.signal.notify_all();
    }
}

struct QueuedCopy {
    dst: usize,
    src: usize,
    len: usize,
    state: Arc<EventState>,
}

impl FakeGpu {
    /// A runtime with `devices` (device `i` is `devices[i]`), every thread
    /// on device 0, [`CopyMode::Immediate`] and [`DmabufMode::Supported`].
    /// With no devices, `hipGetDeviceCount` and `hipGetDevice` fail with
    /// `hipErrorNoDevice`, as HIP does.
    pub fn new(
        devices: Vec<FakeGpuDevice>,
        faults: Arc<Faults>,
        counters: Arc<Counters>,
    ) -> FakeGpu {
        FakeGpu {
            devices,
            inner: Arc::new(Inner {
                faults,
                counters,
                codes: Mutex::new(HashMap::new()),
                memory: Mutex::new(Memory::default()),
            }),
            current: Mutex::new(HashMap::new()),
            device_count_error: Mutex::new(None),
            copy_mode: Mutex::new(CopyMode::default()),
            dmabuf_mode: Mutex::new(DmabufMode::default()),
            queue: Mutex::new(VecDeque::new()),
            copies_on_freed_memory: AtomicU64::new(0),
            synchronized: Mutex::new(Vec::new()),
        }
    }

    /// The fault plan this fake checks.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.inner.faults
    }

    /// The live-object counters this fake maintains.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.inner.counters
    }

    /// Makes an injected failure of `function` return `code` instead of the
    /// default.
    pub fn set_fault_code(&self, function: &'static str, code: i32) {
        self.inner.codes.lock().insert(function, code);
    }

    /// Makes `hipGetDeviceCount` fail with `code` (after its fault check);
    /// 0 (`hipSuccess`) makes it succeed again.
    pub fn fail_device_count(&self, code: i32) {
        *self.device_count_error.lock() = (code != 0).then_some(code);
    }

    /// Makes `device` the calling thread's current device. Not checked, so
    /// a test can give the library a device that does not exist.
    pub fn set_current(&self, device: i32) {
        self.current.lock().insert(thread::current().id(), device);
    }

    /// Sets how later copies behave; queued copies are unaffected.
    pub fn set_copy_mode(&self, mode: CopyMode) {
        *self.copy_mode.lock() = mode;
    }

    /// Sets how later dma-buf exports behave.
    pub fn set_dmabuf_mode(&self, mode: DmabufMode) {
        *self.dmabuf_mode.lock() = mode;
    }

    /// `len` zeroed bytes of device memory on `device`, at an address
    /// aligned to [`ALLOC_ALIGN`]; freed when the handle is dropped.
    /// `hipErrorInvalidDevice` for an unknown device, `hipErrorOutOfMemory`
    /// when the heap refuses. A zero-length allocation has an address but
    /// contains no byte.
    pub fn alloc_device(&self, device: i32, len: usize) -> HipResult<DeviceAlloc> {
        self.device(device)?;
        let addr = self.inner.allocate(len, Kind::Device(device))?;
        self.inner.counters.created("device_alloc");
        Ok(DeviceAlloc {
            inner: Arc::clone(&self.inner),
            addr,
            len,
            device,
        })
    }

    /// Makes `[addr, addr + len)` pinned host memory to
    /// `hipPointerGetAttributes`, as `hipHostRegister` would. The fake
    /// never reads or writes registered memory. `hipErrorInvalidValue` for
    /// an empty or wrapping range, `hipErrorHostMemoryAlreadyRegistered` if
    /// it overlaps a registered range or a fake allocation.
    pub fn register_host(&self, addr: usize, len: usize) -> HipResult<()> {
        let end = addr
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(HIP_ERROR_INVALID_VALUE)?;
        let mut memory = self.inner.memory.lock();
        if memory.overlaps_anything(addr, end) {
            return Err(HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        memory.registered.insert(addr, len);
        Ok(())
    }

    /// Undoes [`FakeGpu::register_host`] of the range starting at `addr`;
    /// `hipErrorHostMemoryNotRegistered` if there is none.
    pub fn unregister_host(&self, addr: usize) -> HipResult<()> {
        match self.inner.memory.lock().registered.remove(&addr) {
            Some(_) => Ok(()),
            None => Err(HIP_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    /// The `len` bytes at `addr`, which must lie inside one device
    /// allocation or host buffer (else `hipErrorInvalidValue`).
    pub fn read(&self, addr: usize, len: usize) -> HipResult<Vec<u8>> {
        self.inner
            .memory
            .lock()
            .read(addr, len)
            .ok_or(HIP_ERROR_INVALID_VALUE)
    }

    /// Writes `data` at `addr`, which must lie inside one device allocation
    /// or host buffer (else `hipErrorInvalidValue`).
    pub fn write(&self, addr: usize, data: &[u8]) -> HipResult<()> {
        match self.inner.memory.lock().write(addr, data) {
            true => Ok(()),
            false => Err(HIP_ERROR_INVALID_VALUE),
        }
    }

    /// Copies queued by [`CopyMode::Manual`] and not yet completed.
    pub fn pending_copies(&self) -> usize {
        self.queue.lock().len()
    }

    /// Performs the oldest queued copy and signals its event; `false` if
    /// none was queued. If either side's memory was freed meanwhile, no
    /// byte moves, [`FakeGpu::copies_on_freed_memory`] counts it, and the
    /// event is signalled all the same.
    pub fn complete_next(&self) -> bool {
        let Some(copy) = self.queue.lock().pop_front() else {
            return false;
        };
        let copied = self.inner.memory.lock().copy(copy.dst, copy.src, copy.len);
        if !copied {
            self.copies_on_freed_memory.fetch_add(1, Ordering::Relaxed);
        }
        copy.state.complete();
        true
    }

    /// Completes every queued copy, oldest first; how many.
    pub fn complete_all(&self) -> usize {
        let mut completed = 0;
        while self.complete_next() {
            completed += 1;
        }
        completed
    }

    /// Queued copies that found their memory freed when completed: each
    /// would have been a use after free on a real GPU.
    pub fn copies_on_freed_memory(&self) -> u64 {
        self.copies_on_freed_memory.load(Ordering::Relaxed)
    }

    /// The devices `hipDeviceSynchronize` succeeded on, in order.
    pub fn synchronized(&self) -> Vec<i32> {
        self.synchronized.lock().clone()
    }

    /// Exported dma-bufs with an fd still open somewhere (in the library,
    /// the fabric, or the test) and their allocation alive.
    pub fn open_dmabufs(&self) -> usize {
        let mut memory = self.inner.memory.lock();
        memory.purge_closed_exports(&self.inner.counters);
        memory.exports.len()
    }

    fn device(&self, device: i32) -> HipResult<&FakeGpuDevice> {
        usize::try_from(device)
            .ok()
            .and_then(|index| self.devices.get(index))
            .ok_or(HIP_ERROR_INVALID_DEVICE)
    }

    fn export(&self, addr: usize, len: usize, mode: DmabufMode) -> HipResult<(OwnedFd, u64)> {
        self.inner.fault("hsa_amd_portable_export_dmabuf")?;
        if let DmabufMode::Fails(code) = mode {
            return Err(code);
        }
        let mut memory = self.inner.memory.lock();
        memory.purge_closed_exports(&self.inner.counters);
        let (base, region) = memory
            .containing(addr)
            .filter(|(_, region)| matches!(region.kind, Kind::Device(_)))
            .ok_or(HIP_ERROR_INVALID_VALUE)?;
        let offset = addr - base;
        let alloc_len = region.len;
        if len == 0 || len > alloc_len - offset {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let (exported, peer) = UnixStream::pair().map_err(|_| HIP_ERROR_OUT_OF_MEMORY)?;
        peer.set_nonblocking(true)
            .map_err(|_| HIP_ERROR_OUT_OF_MEMORY)?;
        let fd = OwnedFd::from(exported);
        let identity = identity(&fd).ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        let offset = u64::try_from(offset).map_err(|_| HIP_ERROR_INVALID_VALUE)?;
        memory.exports.push(Export {
            identity,
            base,
            len: alloc_len,
            peer,
        });
        self.inner.counters.created("dmabuf");
        Ok((fd, offset))
    }
}

impl Gpu for FakeGpu {
    fn device_count(&self) -> HipResult<i32> {
        self.inner.fault("hipGetDeviceCount")?;
        if let Some(code) = *self.device_count_error.lock() {
            return Err(code);
        }
        if self.devices.is_empty() {
            return Err(HIP_ERROR_NO_DEVICE);
        }
        i32::try_from(self.devices.len()).map_err(|_| HIP_ERROR_INVALID_VALUE)
    }

    fn current_device(&self) -> HipResult<i32> {
        self.inner.fault("hipGetDevice")?;
        // Measured on HIP 5.2 without a GPU (tests/hip_loader.rs): every call
        // but hipGetDeviceCount fails with hipErrorInvalidDevice.
        if self.devices.is_empty() {
            return Err(HIP_ERROR_INVALID_DEVICE);
        }
        let current = self.current.lock();
        Ok(current.get(&thread::current().id()).copied().unwrap_or(0))
    }

    fn pci_bus_id(&self, device: i32) -> HipResult<String> {
        self.inner.fault("hipDeviceGetPCIBusId")?;
        Ok(self.device(device)?.pci_bus_id.clone())
    }

    fn pointer_kind(&self, addr: usize) -> HipResult<PointerKind> {
        self.inner.fault("hipPointerGetAttributes")?;
        let memory = self.inner.memory.lock();
        Ok(match memory.containing(addr) {
            Some((_, region)) => match region.kind {
                Kind::Device(device) => PointerKind::Device { device },
                Kind::Host => PointerKind::PinnedHost,
            },
            None if memory.is_registered(addr) => PointerKind::PinnedHost,
            None => PointerKind::UnknownHost,
        })
    }

    fn allocation_range(&self, addr: usize) -> HipResult<(usize, usize)> {
        self.inner.fault("hipMemGetAddressRange")?;
        let memory = self.inner.memory.lock();
        let (base, region) = memory.containing(addr).ok_or(HIP_ERROR_INVALID_VALUE)?;
        Ok((base, region.len))
    }

    /// `hipErrorInvalidValue` for `len == 0` (a HostBuffer is never empty).
    fn host_alloc(&self, len: usize) -> HipResult<Arc<dyn HostBuffer>> {
        self.inner.fault("hipHostMalloc")?;
        if len == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let addr = self.inner.allocate(len, Kind::Host)?;
        self.inner.counters.created("host_alloc");
        Ok(Arc::new(FakeHostBuffer {
            inner: Arc::clone(&self.inner),
            addr,
            len,
            leaked: AtomicBool::new(false),
        }))
    }

    /// `hipErrorInvalidValue` unless both ranges lie inside fake device
    /// allocations or host buffers (or `len` is 0).
    fn copy_async(&self, dst: usize, src: usize, len: usize) -> HipResult<Arc<dyn GpuEvent>> {
        self.inner.fault("hipMemcpyAsync")?;
        let mode = *self.copy_mode.lock();
        if let CopyMode::Fail(code) = mode {
            return Err(code);
        }
        let state = Arc::new(EventState::default());
        {
            let memory = self.inner.memory.lock();
            if !memory.can_copy(dst, src, len) {
                return Err(HIP_ERROR_INVALID_VALUE);
            }
            if mode == CopyMode::Immediate {
                memory.copy(dst, src, len);
                state.complete();
            }
        }
        if mode == CopyMode::Manual {
            let copy = QueuedCopy {
                dst,
                src,
                len,
                state: Arc::clone(&state),
            };
            self.queue.lock().push_back(copy);
        }
        self.inner.fault("hipEventRecord")?;
        self.inner.counters.created("gpu_event");
        Ok(Arc::new(FakeEvent {
            inner: Arc::clone(&self.inner),
            state,
            leaked: AtomicBool::new(false),
        }))
    }

    /// Completes the queued copies first (all of them: the fake does not
    /// tell devices' queues apart), as a real device synchronization
    /// returns only once the work queued before it is done. Copies of
    /// [`CopyMode::Never`] are not queued: a real GPU would hang here.
    fn synchronize(&self, device: i32) -> HipResult<()> {
        self.inner.fault("hipDeviceSynchronize")?;
        self.device(device)?;
        self.complete_all();
        self.synchronized.lock().push(device);
        Ok(())
    }

    fn export_dmabuf(&self, addr: usize, len: usize) -> Option<HipResult<(OwnedFd, u64)>> {
        let mode = *self.dmabuf_mode.lock();
        match mode {
            DmabufMode::Absent => None,
            _ => Some(self.export(addr, len, mode)),
        }
    }

    /// [`FakeGpu::alloc_device`]; `hipErrorInvalidValue` for `len == 0`,
    /// as the real owners refuse an empty buffer.
    fn device_alloc(&self, device: i32, len: usize) -> HipResult<Arc<dyn DeviceBuffer>> {
        self.inner.fault("hipMalloc")?;
        if len == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        Ok(Arc::new(self.alloc_device(device, len)?))
    }

    fn runtime(&self) -> HipResult<RuntimeInfo> {
        self.inner.fault("hipRuntimeGetVersion")?;
        Ok(RuntimeInfo {
            name: "fake",
            library: "fake GPU",
            version: 1,
        })
    }
}

impl DeviceMemory for FakeGpu {
    fn is_device_memory(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len);
        self.inner
            .memory
            .lock()
            .regions
            .iter()
            .any(|(&base, region)| {
                matches!(region.kind, Kind::Device(_))
                    && base < end
                    && addr < base.saturating_add(region.len)
            })
    }

    /// The whole allocation the dma-buf was exported from.
    fn dmabuf_range(&self, fd: &OwnedFd) -> Option<(usize, usize)> {
        let wanted = identity(fd)?;
        let mut memory = self.inner.memory.lock();
        memory.purge_closed_exports(&self.inner.counters);
        let export = memory.exports.iter().find(|e| e.identity == wanted)?;
        Some((export.base, export.len))
    }
}

/// Fake device memory from [`FakeGpu::alloc_device`], freed on drop (and
/// its dma-bufs forgotten).
pub struct DeviceAlloc {
    inner: Arc<Inner>,
    addr: usize,
    len: usize,
    device: i32,
}

impl DeviceAlloc {
    /// The first byte's address, aligned to [`ALLOC_ALIGN`].
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it is on.
    pub fn device(&self) -> i32 {
        self.device
    }
}

impl DeviceBuffer for DeviceAlloc {
    fn addr(&self) -> usize {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn device(&self) -> i32 {
        self.device
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        self.inner.free(self.addr);
        self.inner.counters.destroyed("device_alloc");
    }
}

/// A pinned host buffer from [`Gpu::host_alloc`].
struct FakeHostBuffer {
    inner: Arc<Inner>,
    addr: usize,
    len: usize,
    leaked: AtomicBool,
}

impl HostBuffer for FakeHostBuffer {
    fn addr(&self) -> usize {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The memory stays allocated and known to the fake (copies may still
    /// use it) for the life of the process.
    fn leak(&self) {
        if self.leaked.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(region) = self.inner.memory.lock().regions.get_mut(&self.addr) {
            region.mem.leak();
        }
        self.inner.counters.created("host_alloc_leaked");
    }

    fn write(&self, offset: usize, data: &[u8]) -> bool {
        offset
            .checked_add(data.len())
            .is_some_and(|end| end <= self.len)
            && self.inner.memory.lock().write(self.addr + offset, data)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        let fits = offset
            .checked_add(out.len())
            .is_some_and(|end| end <= self.len);
        match self.inner.memory.lock().read(self.addr + offset, out.len()) {
            Some(bytes) if fits => {
                out.copy_from_slice(&bytes);
                true
            }
            _ => false,
        }
    }
}

impl Drop for FakeHostBuffer {
    fn drop(&mut self) {
        if !self.leaked.load(Ordering::Acquire) {
            self.inner.free(self.addr);
            self.inner.counters.destroyed("host_alloc");
        }
    }
}

/// The event recorded after a copy.
struct FakeEvent {
    inner: Arc<Inner>,
    state: Arc<EventState>,
    leaked: AtomicBool,
}

impl GpuEvent for FakeEvent {
    fn wait(&self, deadline: Instant) -> HipResult<bool> {
        self.inner.fault("hipEventQuery")?;
        let mut done = self.state.done.lock();
        while !*done {
            if self
                .state
                .signal
                .wait_until(&mut done, deadline)
                .timed_out()
            {
                return Ok(*done);
            }
        }
        Ok(true)
    }

    fn leak(&self) {
        if !self.leaked.swap(true, Ordering::AcqRel) {
            self.inner.counters.created("gpu_event_leaked");
        }
    }
}

impl Drop for FakeEvent {
    fn drop(&mut self) {
        if !self.leaked.load(Ordering::Acquire) {
            self.inner.counters.destroyed("gpu_event");
        }
    }
}

/// The only unsafe code of the fakes: heap memory handed out by address,
/// and byte copies into it.
mod raw {
    use std::alloc::{self, Layout};
    use std::ptr::NonNull;

    /// Zeroed heap memory, owned like a `Box<[u8]>` and freed on drop
    /// unless leaked.
    pub(super) struct RawMem {
        ptr: NonNull<u8>,
        layout: Layout,
        leaked: bool,
    }

    // SAFETY: a RawMem exclusively owns its allocation, as a Box<[u8]>
    // does, and plain bytes have no thread affinity. It gives out no
    // references, only the address and a raw pointer; the fake touches the
    // bytes only under its memory lock (`Memory::copy`).
    unsafe impl Send for RawMem {}
    // SAFETY: `&RawMem` only reads `ptr`, `layout` and `leaked`, which
    // never change behind a shared reference.
    unsafe impl Sync for RawMem {}

    impl RawMem {
        /// `len` zeroed bytes (at least one is allocated) aligned to
        /// `align`; `None` if the layout is invalid or the heap refuses.
        pub(super) fn zeroed(len: usize, align: usize) -> Option<RawMem> {
            let layout = Layout::from_size_align(len.max(1), align).ok()?;
            // SAFETY: `layout` has a non-zero size, as `alloc_zeroed`
            // requires; a null result (refusal) is handled below.
            let ptr = unsafe { alloc::alloc_zeroed(layout) };
            let ptr = NonNull::new(ptr)?;
            Some(RawMem {
                ptr,
                layout,
                leaked: false,
            })
        }

        /// The first byte's address, exposed so that the fabric may turn
        /// it back into a pointer.
        pub(super) fn addr(&self) -> usize {
            self.ptr.as_ptr().expose_provenance()
        }

        /// The first byte.
        pub(super) fn ptr(&self) -> *mut u8 {
            self.ptr.as_ptr()
        }

        /// Makes the drop keep the memory: it is never freed.
        pub(super) fn leak(&mut self) {
            self.leaked = true;
        }
    }

    impl Drop for RawMem {
        fn drop(&mut self) {
            if self.leaked {
                return;
            }
            // SAFETY: `ptr` came from `alloc_zeroed` with `layout` in
            // `zeroed`, and this drop is the only place it is freed.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    /// Copies `len` bytes from `src` to `dst`; the ranges may overlap.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads and `dst` for writes of `len` bytes,
    /// and neither may be freed during the call.
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: validity is the caller's guarantee; `ptr::copy` allows
        // overlap, and `u8` needs no alignment.
        unsafe { std::ptr::copy(src, dst, len) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    struct Setup {
        gpu: Arc<FakeGpu>,
        faults: Arc<Faults>,
        counters: Arc<Counters>,
    }

    fn setup() -> Setup {
        let faults = Arc::new(Faults::new());
        let counters = Arc::new(Counters::new());
        let devices = vec![
            FakeGpuDevice {
                pci_bus_id: "0000:c1:00.0".to_owned(),
            },
            FakeGpuDevice {
                pci_bus_id: "0000:c2:00.0".to_owned(),
            },
        ];
        let gpu = FakeGpu::new(devices, Arc::clone(&faults), Arc::clone(&counters));
        Setup {
            gpu: Arc::new(gpu),
            faults,
            counters,
        }
    }

    impl Setup {
        /// Device memory on device 0 and a pinned host buffer, `len` bytes
        /// each.
        fn pair(&self, len: usize) -> (DeviceAlloc, Arc<dyn HostBuffer>) {
            let device = self.gpu.alloc_device(0, len).unwrap();
            (device, self.gpu.host_alloc(len).unwrap())
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(20)
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn device_allocation_is_zeroed_aligned_and_device_memory() {
        let s = setup();
        let a = s.gpu.alloc_device(1, 10_000).unwrap();
        assert_eq!(a.addr() % ALLOC_ALIGN, 0);
        assert_eq!((a.len(), a.device()), (10_000, 1));
        assert_eq!(s.gpu.read(a.addr(), 10_000).unwrap(), vec![0; 10_000]);
        for addr in [a.addr(), a.addr() + 9_999] {
            assert_eq!(
                s.gpu.pointer_kind(addr),
                Ok(PointerKind::Device { device: 1 })
            );
        }
        assert_eq!(
            s.gpu.pointer_kind(a.addr() + 10_000),
            Ok(PointerKind::UnknownHost)
        );
        assert_eq!(s.counters.live("device_alloc"), 1);
    }

    #[test]
    fn allocation_on_an_unknown_device_is_invalid_device() {
        let s = setup();
        for device in [-1, 2] {
            assert_eq!(
                s.gpu.alloc_device(device, 8).err(),
                Some(HIP_ERROR_INVALID_DEVICE)
            );
        }
    }

    #[test]
    fn an_impossible_allocation_is_out_of_memory() {
        let s = setup();
        assert_eq!(
            s.gpu.alloc_device(0, usize::MAX).err(),
            Some(HIP_ERROR_OUT_OF_MEMORY)
        );
    }

    #[test]
    fn allocation_range_is_the_allocation_containing_the_address() {
        let s = setup();
        let a = s.gpu.alloc_device(0, 4096).unwrap();
        let h = s.gpu.host_alloc(100).unwrap();
        assert_eq!(s.gpu.allocation_range(a.addr() + 17), Ok((a.addr(), 4096)));
        assert_eq!(s.gpu.allocation_range(h.addr() + 99), Ok((h.addr(), 100)));
        assert_eq!(
            s.gpu.allocation_range(a.addr() + 4096),
            Err(HIP_ERROR_INVALID_VALUE)
        );
        let local = [0u8; 8];
        assert_eq!(
            s.gpu.allocation_range(local.as_ptr() as usize),
            Err(HIP_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn freed_device_allocation_is_forgotten() {
        let s = setup();
        let a = s.gpu.alloc_device(0, 64).unwrap();
        let addr = a.addr();
        drop(a);
        assert_eq!(s.gpu.pointer_kind(addr), Ok(PointerKind::UnknownHost));
        assert!(!s.gpu.is_device_memory(addr, 64));
        assert_eq!(s.gpu.read(addr, 1), Err(HIP_ERROR_INVALID_VALUE));
        assert!(s.counters.snapshot().is_empty());
    }

    #[test]
    fn pinned_and_registered_host_memory_is_pinned_and_the_rest_unknown() {
        let s = setup();
        let h = s.gpu.host_alloc(4096).unwrap();
        assert_eq!(h.addr() % ALLOC_ALIGN, 0);
        assert_eq!(s.gpu.read(h.addr(), 4096).unwrap(), vec![0; 4096]);
        assert_eq!(s.gpu.pointer_kind(h.addr()), Ok(PointerKind::PinnedHost));

        let user = vec![0u8; 256];
        let addr = user.as_ptr() as usize;
        assert_eq!(s.gpu.pointer_kind(addr), Ok(PointerKind::UnknownHost));
        s.gpu.register_host(addr, 256).unwrap();
        assert_eq!(s.gpu.pointer_kind(addr + 255), Ok(PointerKind::PinnedHost));
        assert_eq!(s.gpu.pointer_kind(addr + 256), Ok(PointerKind::UnknownHost));
        assert_eq!(
            s.gpu.register_host(addr + 8, 8),
            Err(HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        );
        assert_eq!(s.gpu.register_host(addr, 0), Err(HIP_ERROR_INVALID_VALUE));
        assert_eq!(
            s.gpu.register_host(usize::MAX, 2),
            Err(HIP_ERROR_INVALID_VALUE)
        );
        // Registered memory is only classified, never copied to or from.
        assert_eq!(s.gpu.read(addr, 1), Err(HIP_ERROR_INVALID_VALUE));
        s.gpu.unregister_host(addr).unwrap();
        assert_eq!(s.gpu.pointer_kind(addr), Ok(PointerKind::UnknownHost));
        assert_eq!(
            s.gpu.unregister_host(addr),
            Err(HIP_ERROR_HOST_MEMORY_NOT_REGISTERED)
        );
    }

    #[test]
    fn is_device_memory_when_any_byte_overlaps_an_allocation() {
        let s = setup();
        let (a, h) = s.pair(4096);
        assert!(s.gpu.is_device_memory(a.addr(), 1));
        assert!(s.gpu.is_device_memory(a.addr() - 10, 11));
        assert!(s.gpu.is_device_memory(a.addr() + 4095, usize::MAX));
        assert!(!s.gpu.is_device_memory(a.addr() - 10, 10));
        assert!(!s.gpu.is_device_memory(a.addr() + 4096, 100));
        assert!(!s.gpu.is_device_memory(a.addr(), 0));
        assert!(!s.gpu.is_device_memory(h.addr(), 4096));
    }

    #[test]
    fn host_buffer_is_freed_when_dropped() {
        let s = setup();
        let h = s.gpu.host_alloc(512).unwrap();
        let addr = h.addr();
        assert_eq!((s.counters.live("host_alloc"), h.len()), (1, 512));
        drop(h);
        assert_eq!(s.gpu.pointer_kind(addr), Ok(PointerKind::UnknownHost));
        assert!(s.counters.snapshot().is_empty());
    }

    #[test]
    fn leaked_host_buffer_stays_allocated_and_counted() {
        let s = setup();
        let h = s.gpu.host_alloc(512).unwrap();
        let addr = h.addr();
        h.leak();
        h.leak();
        drop(h);
        assert_eq!(s.gpu.pointer_kind(addr), Ok(PointerKind::PinnedHost));
        s.gpu.write(addr, b"still here").unwrap();
        assert_eq!(s.gpu.read(addr, 10).unwrap(), b"still here");
        assert_eq!(
            s.counters.snapshot(),
            vec![("host_alloc", 1), ("host_alloc_leaked", 1)]
        );
    }

    #[test]
    fn zero_length_host_alloc_is_invalid() {
        let s = setup();
        assert_eq!(s.gpu.host_alloc(0).err(), Some(HIP_ERROR_INVALID_VALUE));
    }

    #[test]
    fn immediate_copy_moves_the_bytes_and_its_event_is_done() {
        let s = setup();
        let (a, h) = s.pair(4096);
        s.gpu.write(a.addr() + 100, b"payload").unwrap();
        let event = s.gpu.copy_async(h.addr(), a.addr() + 100, 7).unwrap();
        assert_eq!(s.gpu.read(h.addr(), 7).unwrap(), b"payload");
        assert_eq!(event.wait(Instant::now()), Ok(true));
        assert_eq!(s.counters.live("gpu_event"), 1);
        drop(event);
        assert_eq!(s.counters.live("gpu_event"), 0);
    }

    #[test]
    fn manual_copy_moves_the_bytes_only_when_completed() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Manual);
        let (a, h) = s.pair(4096);
        s.gpu.write(h.addr(), b"to device").unwrap();
        let first = s.gpu.copy_async(a.addr(), h.addr(), 9).unwrap();
        let second = s.gpu.copy_async(a.addr() + 9, h.addr(), 2).unwrap();
        assert_eq!(s.gpu.pending_copies(), 2);
        assert_eq!(first.wait(soon()), Ok(false));
        assert_eq!(s.gpu.read(a.addr(), 9).unwrap(), vec![0; 9]);

        assert!(s.gpu.complete_next());
        assert_eq!(first.wait(Instant::now()), Ok(true));
        assert_eq!(second.wait(Instant::now()), Ok(false));
        assert_eq!(s.gpu.read(a.addr(), 9).unwrap(), b"to device");
        assert_eq!(s.gpu.complete_all(), 1);
        assert_eq!(s.gpu.read(a.addr(), 11).unwrap(), b"to deviceto");
        assert_eq!(second.wait(Instant::now()), Ok(true));
        assert!(!s.gpu.complete_next());
        assert_eq!(s.gpu.copies_on_freed_memory(), 0);
    }

    #[test]
    fn wait_returns_when_another_thread_completes_the_copy() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Manual);
        let (a, h) = s.pair(64);
        let event = s.gpu.copy_async(h.addr(), a.addr(), 64).unwrap();
        let waiter = thread::spawn(move || event.wait(far()));
        // Completing before the waiter blocks is fine too: it then finds
        // the event done.
        assert_eq!(s.gpu.complete_all(), 1);
        assert_eq!(waiter.join().unwrap(), Ok(true));
    }

    #[test]
    fn a_copy_that_never_finishes_times_out_at_the_deadline() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Never);
        let (a, h) = s.pair(64);
        s.gpu.write(a.addr(), &[7; 64]).unwrap();
        let event = s.gpu.copy_async(h.addr(), a.addr(), 64).unwrap();
        assert_eq!(event.wait(soon()), Ok(false));
        assert_eq!(s.gpu.pending_copies(), 0);
        assert_eq!(s.gpu.complete_all(), 0);
        assert_eq!(event.wait(Instant::now()), Ok(false));
        assert_eq!(s.gpu.read(h.addr(), 64).unwrap(), vec![0; 64]);
    }

    #[test]
    fn failing_copy_mode_returns_its_error() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Fail(700));
        let (a, h) = s.pair(64);
        assert_eq!(s.gpu.copy_async(h.addr(), a.addr(), 64).err(), Some(700));
        assert_eq!(s.counters.live("gpu_event"), 0);
    }

    #[test]
    fn copy_outside_fake_memory_or_past_an_allocation_is_invalid() {
        let s = setup();
        let (a, h) = s.pair(64);
        let user = [0u8; 64];
        let user = user.as_ptr() as usize;
        for (dst, src, len) in [
            (h.addr(), user, 64),
            (user, a.addr(), 64),
            (h.addr(), a.addr(), 65),
            (h.addr() + 1, a.addr(), 64),
            (h.addr(), usize::MAX, 2),
        ] {
            assert_eq!(
                s.gpu.copy_async(dst, src, len).err(),
                Some(HIP_ERROR_INVALID_VALUE),
                "{dst:#x} <- {src:#x} ({len})"
            );
        }
        assert!(s.gpu.copy_async(h.addr(), a.addr(), 0).is_ok());
    }

    #[test]
    fn queued_copy_into_freed_memory_moves_nothing_and_is_counted() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Manual);
        let (a, h) = s.pair(64);
        let event = s.gpu.copy_async(h.addr(), a.addr(), 64).unwrap();
        drop(h);
        assert!(s.gpu.complete_next());
        assert_eq!(s.gpu.copies_on_freed_memory(), 1);
        assert_eq!(event.wait(Instant::now()), Ok(true));
    }

    #[test]
    fn queued_copy_into_a_leaked_buffer_still_lands() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Manual);
        let a = s.gpu.alloc_device(0, 64).unwrap();
        s.gpu.write(a.addr(), &[9; 64]).unwrap();
        let h = s.gpu.host_alloc(64).unwrap();
        let addr = h.addr();
        let event = s.gpu.copy_async(addr, a.addr(), 64).unwrap();
        h.leak();
        event.leak();
        drop((h, event));
        assert_eq!(s.gpu.complete_all(), 1);
        assert_eq!(s.gpu.copies_on_freed_memory(), 0);
        assert_eq!(s.gpu.read(addr, 64).unwrap(), vec![9; 64]);
        assert_eq!(s.counters.live("gpu_event"), 1);
        assert_eq!(s.counters.live("gpu_event_leaked"), 1);
    }

    #[test]
    fn failed_event_record_leaves_the_copy_queued() {
        let s = setup();
        s.gpu.set_copy_mode(CopyMode::Manual);
        let (a, h) = s.pair(64);
        s.faults.fail_nth("hipEventRecord", 1);
        assert_eq!(
            s.gpu.copy_async(h.addr(), a.addr(), 64).err(),
            Some(HIP_ERROR_INVALID_VALUE)
        );
        assert_eq!(s.gpu.pending_copies(), 1);
        assert_eq!(s.counters.live("gpu_event"), 0);
    }

    #[test]
    fn dmabuf_export_is_recognised_with_its_allocation_and_offset() {
        let s = setup();
        let a = s.gpu.alloc_device(0, 8192).unwrap();
        let (fd, offset) = s.gpu.export_dmabuf(a.addr() + 4096, 4096).unwrap().unwrap();
        assert_eq!(offset, 4096);
        assert_eq!(s.gpu.dmabuf_range(&fd), Some((a.addr(), 8192)));
        assert_eq!(s.counters.live("dmabuf"), 1);

        // A duplicate names the same dma-buf, also once the original is
        // closed.
        let dup = fd.try_clone().unwrap();
        drop(fd);
        assert_eq!(s.gpu.dmabuf_range(&dup), Some((a.addr(), 8192)));
        assert_eq!(s.gpu.open_dmabufs(), 1);
        drop(dup);
        assert_eq!(s.gpu.open_dmabufs(), 0);
        assert_eq!(s.counters.live("dmabuf"), 0);
    }

    #[test]
    fn a_foreign_fd_is_not_a_dmabuf() {
        let s = setup();
        let a = s.gpu.alloc_device(0, 4096).unwrap();
        let (_fd, _) = s.gpu.export_dmabuf(a.addr(), 4096).unwrap().unwrap();
        let null = OwnedFd::from(File::open("/dev/null").unwrap());
        assert_eq!(s.gpu.dmabuf_range(&null), None);
        let (socket, _) = UnixStream::pair().unwrap();
        assert_eq!(s.gpu.dmabuf_range(&OwnedFd::from(socket)), None);
    }

    #[test]
    fn freeing_the_allocation_forgets_its_dmabufs() {
        let s = setup();
        let a = s.gpu.alloc_device(0, 4096).unwrap();
        let (fd, _) = s.gpu.export_dmabuf(a.addr(), 4096).unwrap().unwrap();
        drop(a);
        assert_eq!(s.gpu.dmabuf_range(&fd), None);
        assert!(s.counters.snapshot().is_empty());
    }

    #[test]
    fn dmabuf_export_of_anything_but_device_memory_is_invalid() {
        let s = setup();
        let (a, h) = s.pair(4096);
        for (addr, len) in [
            (h.addr(), 4096),
            (a.addr(), 0),
            (a.addr() + 1, 4096),
            (a.addr() + 4096, 1),
        ] {
            let result = s.gpu.export_dmabuf(addr, len).unwrap();
            assert_eq!(result.err(), Some(HIP_ERROR_INVALID_VALUE));
        }
        assert_eq!(s.counters.live("dmabuf"), 0);
    }

    #[test]
    fn dmabuf_modes_absent_and_failing() {
        let s = setup();
        let a = s.gpu.alloc_device(0, 4096).unwrap();
        s.gpu.set_dmabuf_mode(DmabufMode::Absent);
        assert!(s.gpu.export_dmabuf(a.addr(), 4096).is_none());
        assert_eq!(s.faults.calls("hsa_amd_portable_export_dmabuf"), 0);
        s.gpu.set_dmabuf_mode(DmabufMode::Fails(4096));
        let result = s.gpu.export_dmabuf(a.addr(), 4096).unwrap();
        assert_eq!(result.err(), Some(4096));
    }

    #[test]
    fn current_device_is_per_thread() {
        let s = setup();
        s.gpu.set_current(1);
        assert_eq!(s.gpu.current_device(), Ok(1));
        let gpu = Arc::clone(&s.gpu);
        let other = thread::spawn(move || gpu.current_device());
        assert_eq!(other.join().unwrap(), Ok(0));
    }

    #[test]
    fn device_queries() {
        let s = setup();
        assert_eq!(s.gpu.device_count(), Ok(2));
        assert_eq!(s.gpu.pci_bus_id(1).as_deref(), Ok("0000:c2:00.0"));
        assert_eq!(s.gpu.pci_bus_id(2), Err(HIP_ERROR_INVALID_DEVICE));
        assert_eq!(s.gpu.synchronize(1), Ok(()));
        assert_eq!(s.gpu.synchronize(-1), Err(HIP_ERROR_INVALID_DEVICE));
        assert_eq!(s.gpu.synchronized(), vec![1]);
        s.gpu.fail_device_count(HIP_ERROR_NO_DEVICE);
        assert_eq!(s.gpu.device_count(), Err(HIP_ERROR_NO_DEVICE));
        s.gpu.fail_device_count(0);
        assert_eq!(s.gpu.device_count(), Ok(2));
    }

    #[test]
    fn a_machine_without_gpus_has_no_device() {
        let faults = Arc::new(Faults::new());
        let gpu = FakeGpu::new(Vec::new(), faults, Arc::new(Counters::new()));
        assert_eq!(gpu.device_count(), Err(HIP_ERROR_NO_DEVICE));
        assert_eq!(gpu.current_device(), Err(HIP_ERROR_INVALID_DEVICE));
    }

    #[test]
    fn injected_faults_fail_each_call_with_its_code() {
        let s = setup();
        let (a, h) = s.pair(64);
        let event = s.gpu.copy_async(h.addr(), a.addr(), 64).unwrap();
        s.faults.reset();
        for name in [
            "hipGetDeviceCount",
            "hipGetDevice",
            "hipDeviceGetPCIBusId",
            "hipPointerGetAttributes",
            "hipMemGetAddressRange",
            "hipHostMalloc",
            "hipMemcpyAsync",
            "hipEventQuery",
            "hipDeviceSynchronize",
            "hsa_amd_portable_export_dmabuf",
        ] {
            s.faults.fail_always(name);
        }
        s.gpu.set_fault_code("hipDeviceSynchronize", 719);
        let g = &s.gpu;
        assert_eq!(g.device_count(), Err(1));
        assert_eq!(g.current_device(), Err(1));
        assert_eq!(g.pci_bus_id(0), Err(1));
        assert_eq!(g.pointer_kind(a.addr()), Err(1));
        assert_eq!(g.allocation_range(a.addr()), Err(1));
        assert_eq!(g.host_alloc(64).err(), Some(HIP_ERROR_OUT_OF_MEMORY));
        assert_eq!(g.copy_async(h.addr(), a.addr(), 64).err(), Some(1));
        assert_eq!(event.wait(Instant::now()), Err(1));
        assert_eq!(g.synchronize(0), Err(719));
        assert_eq!(g.export_dmabuf(a.addr(), 64).unwrap().err(), Some(1));
        assert_eq!(s.faults.failed().len(), 10);
        assert_eq!(s.counters.live("gpu_event"), 1);
        assert_eq!(s.counters.live("host_alloc"), 1);
    }

    #[test]
    fn nothing_is_live_once_everything_is_dropped() {
        let s = setup();
        {
            let (a, h) = s.pair(4096);
            let _event = s.gpu.copy_async(h.addr(), a.addr(), 4096).unwrap();
            let _dmabuf = s.gpu.export_dmabuf(a.addr(), 4096).unwrap().unwrap();
        }
        assert!(s.counters.snapshot().is_empty());
    }
}
