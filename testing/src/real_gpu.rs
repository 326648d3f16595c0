//! A real GPU runtime in the fake world: the library's [`Gpu`] calls go to
//! the runtime (the CUDA driver on a GPU machine), and the fake fabric
//! learns what it needs as a NIC would ([`DeviceMemory`]): which addresses
//! are device memory, which dma-buf stands for which range, and how bytes
//! reach device memory, which the host cannot touch: through the runtime's
//! own copies, as a test device. A real NIC reads and writes the GPU's
//! memory over PCIe; this fake does it with `copy_async`, waited for.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::gpu::identity;
use super::DeviceMemory;
use hipobj::platform::{
    DeviceBuffer, Gpu, GpuCall, GpuEvent, HipResult, HostBuffer, PointerKind, RuntimeInfo,
};

/// How long one fabric copy through the runtime may take.
const COPY_PATIENCE: Duration = Duration::from_secs(30);

/// A real runtime, with what it exported remembered for the fabric.
pub struct RealGpu {
    gpu: Arc<dyn Gpu>,
    /// Each exported dma-buf's identity, with the device range it starts
    /// at and its size.
    exports: Mutex<HashMap<(u64, u64), (usize, usize)>>,
}

impl RealGpu {
    /// Wraps `gpu`.
    pub fn new(gpu: Arc<dyn Gpu>) -> RealGpu {
        RealGpu {
            gpu,
            exports: Mutex::new(HashMap::new()),
        }
    }

    /// How many dma-bufs the library had exported.
    pub fn exports(&self) -> usize {
        self.exports.lock().len()
    }
}

impl Gpu for RealGpu {
    fn device_count(&self) -> HipResult<i32> {
        self.gpu.device_count()
    }

    fn current_device(&self) -> HipResult<i32> {
        self.gpu.current_device()
    }

    fn pci_bus_id(&self, device: i32) -> HipResult<String> {
        self.gpu.pci_bus_id(device)
    }

    fn pointer_kind(&self, addr: usize) -> HipResult<PointerKind> {
        self.gpu.pointer_kind(addr)
    }

    fn allocation_range(&self, addr: usize) -> HipResult<(usize, usize)> {
        self.gpu.allocation_range(addr)
    }

    fn host_alloc(&self, len: usize) -> HipResult<Arc<dyn HostBuffer>> {
        self.gpu.host_alloc(len)
    }

    fn copy_async(&self, dst: usize, src: usize, len: usize) -> HipResult<Arc<dyn GpuEvent>> {
        self.gpu.copy_async(dst, src, len)
    }

    fn synchronize(&self, device: i32) -> HipResult<()> {
        self.gpu.synchronize(device)
    }

    fn device_alloc(&self, device: i32, len: usize) -> HipResult<Arc<dyn DeviceBuffer>> {
        self.gpu.device_alloc(device, len)
    }

    fn runtime(&self) -> HipResult<RuntimeInfo> {
        self.gpu.runtime()
    }

    fn call_name(&self, call: GpuCall) -> &'static str {
        self.gpu.call_name(call)
    }

    /// The runtime's export; the fd's size is its length (a dma-buf's
    /// `lseek` to the end gives it).
    fn export_dmabuf(&self, addr: usize, len: usize) -> Option<HipResult<(OwnedFd, u64)>> {
        let exported = self.gpu.export_dmabuf(addr, len)?;
        if let Ok((fd, offset)) = &exported {
            let size = fd
                .try_clone()
                .ok()
                .map(File::from)
                .and_then(|mut f| f.seek(SeekFrom::End(0)).ok())
                .and_then(|size| usize::try_from(size).ok());
            let start = usize::try_from(*offset)
                .ok()
                .and_then(|o| addr.checked_sub(o));
            if let (Some(id), Some(size), Some(start)) = (identity(fd), size, start) {
                self.exports.lock().insert(id, (start, size));
            }
        }
        Some(exported)
    }
}

impl DeviceMemory for RealGpu {
    fn is_device_memory(&self, addr: usize, len: usize) -> bool {
        let last = addr.saturating_add(len.saturating_sub(1));
        [addr, last]
            .iter()
            .any(|&a| matches!(self.gpu.pointer_kind(a), Ok(PointerKind::Device { .. })))
    }

    fn dmabuf_range(&self, fd: &OwnedFd) -> Option<(usize, usize)> {
        self.exports.lock().get(&identity(fd)?).copied()
    }

    fn host_accessible(&self) -> bool {
        false
    }

    fn copy(&self, dst: usize, src: usize, len: usize) -> bool {
        self.gpu
            .copy_async(dst, src, len)
            .and_then(|event| event.wait(Instant::now() + COPY_PATIENCE))
            == Ok(true)
    }
}
