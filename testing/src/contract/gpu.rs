//! Contract checks of [`Gpu`]: what the library relies on from a GPU
//! runtime, written once over the trait and run against the fake GPU
//! (`tests/contract.rs`, always) and the CUDA driver on a real GPU
//! (`tests/cuda.rs`, on a GPU machine).
//!
//! The library never allocates device memory for a C program (the
//! application does), so each environment brings a [`GpuLab`] that plays
//! the application: it allocates device and managed memory, reads and
//! writes it, and keeps the GPU busy. The trait's own allocator
//! ([`Gpu::device_alloc`], for the Rust API and the command) is checked
//! against the lab's reading of the memory it gives.
//!
//! [`gpu_contract_tests!`](crate::gpu_contract_tests) turns the list into
//! one `#[test]` per check, as [`contract_tests!`](crate::contract_tests)
//! does for the fabric's.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::gpu::{CopyMode, DeviceAlloc, FakeGpu, FakeGpuDevice};
use super::super::{Counters, Faults};
use hipobj::platform::{Gpu, PointerKind};

/// Long enough for any copy of a check to finish on a real GPU.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long [`GpuLab::occupy`] keeps the GPU busy: far past the short
/// deadline the checks give a copy queued behind it.
pub const GPU_BUSY: Duration = Duration::from_millis(500);
/// The short deadline.
const SHORT: Duration = Duration::from_millis(5);
/// The size of the checks' allocations: 4 MiB, several pages and more
/// than one dma-buf sub-range.
const LEN: usize = 4 << 20;

/// Memory a [`GpuLab`] allocated, freed when dropped.
pub trait LabMemory: Send + Sync {
    /// First byte.
    fn addr(&self) -> usize;
}

/// The application's part: memory and work the trait does not make.
pub trait GpuLab: Send + Sync {
    /// `len` bytes of device memory on `device`.
    fn device_alloc(&self, device: i32, len: usize) -> Box<dyn LabMemory>;
    /// `len` bytes of managed memory, if the runtime has it.
    fn managed_alloc(&self, len: usize) -> Option<Box<dyn LabMemory>>;
    /// Writes `data` at `addr` (device memory) and waits until it is there.
    fn write(&self, addr: usize, data: &[u8]);
    /// The `len` bytes at `addr` (device memory), once earlier work on the
    /// calling thread's stream is done.
    fn read(&self, addr: usize, len: usize) -> Vec<u8>;
    /// Queues work on `device` that keeps the calling thread's per-thread
    /// stream busy for at least [`GPU_BUSY`] (the fake: until [`GpuLab::release`]).
    fn occupy(&self, device: i32);
    /// Lets the fake's occupying work finish; a real GPU's ends by itself.
    fn release(&self);
}

/// What the GPU checks run against.
pub struct GpuEnv {
    /// The runtime under test.
    pub gpu: Arc<dyn Gpu>,
    /// The application's part.
    pub lab: Arc<dyn GpuLab>,
}

impl GpuEnv {
    /// The fake GPU: two devices, with dma-buf export.
    pub fn fake() -> GpuEnv {
        let devices = ["0000:c1:00.0", "0000:c2:00.0"]
            .iter()
            .map(|id| FakeGpuDevice {
                pci_bus_id: (*id).to_owned(),
            })
            .collect();
        let gpu = Arc::new(FakeGpu::new(
            devices,
            Arc::new(Faults::new()),
            Arc::new(Counters::new()),
        ));
        GpuEnv {
            gpu: gpu.clone(),
            lab: Arc::new(FakeLab { gpu }),
        }
    }
}

/// The fake GPU's lab.
struct FakeLab {
    gpu: Arc<FakeGpu>,
}

impl LabMemory for DeviceAlloc {
    fn addr(&self) -> usize {
        DeviceAlloc::addr(self)
    }
}

impl GpuLab for FakeLab {
    fn device_alloc(&self, device: i32, len: usize) -> Box<dyn LabMemory> {
        Box::new(
            self.gpu
                .alloc_device(device, len)
                .unwrap_or_else(|e| panic!("fake device memory: {e}")),
        )
    }

    fn managed_alloc(&self, _len: usize) -> Option<Box<dyn LabMemory>> {
        None
    }

    fn write(&self, addr: usize, data: &[u8]) {
        self.gpu
            .write(addr, data)
            .unwrap_or_else(|e| panic!("fake write: {e}"));
    }

    fn read(&self, addr: usize, len: usize) -> Vec<u8> {
        self.gpu
            .read(addr, len)
            .unwrap_or_else(|e| panic!("fake read: {e}"))
    }

    fn occupy(&self, _device: i32) {
        self.gpu.set_copy_mode(CopyMode::Manual);
    }

    fn release(&self) {
        self.gpu.set_copy_mode(CopyMode::Immediate);
        self.gpu.complete_all();
    }
}

/// Bytes that depend on `seed` and their position.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let [low, ..] = i.to_le_bytes();
            let [page, ..] = (i >> 12).to_le_bytes();
            low.wrapping_mul(31).wrapping_add(seed) ^ page
        })
        .collect()
}

/// A pinned host buffer of `len` bytes as a slice (it lives as long as
/// `buf`, which the caller holds). Mutable from a shared handle because the
/// buffer is memory the runtime handed out, not a Rust value: each check
/// holds one such slice at a time and copies into the buffer only when it
/// holds none.
#[allow(clippy::mut_from_ref)]
fn host_slice(buf: &Arc<dyn hipobj::platform::HostBuffer>) -> &mut [u8] {
    // SAFETY: the buffer is `buf.len()` bytes of host memory owned by
    // `buf`, which outlives the slice; the checks never copy into it while
    // they hold the slice.
    unsafe { std::slice::from_raw_parts_mut(buf.addr() as *mut u8, buf.len()) }
}

fn device_count(env: &GpuEnv) -> i32 {
    let n = env
        .gpu
        .device_count()
        .unwrap_or_else(|e| panic!("device_count: error {e}"));
    assert!(n >= 1, "a GPU environment has a GPU, not {n}");
    n
}

/// Every device has a PCI bus id `dddd:bb:dd.f` in lowercase hex (the form
/// sysfs uses, which the NIC choice compares with); a device past the count
/// is an error.
pub fn gpu_devices_report_lowercase_pci_bus_ids(env: &GpuEnv) {
    let n = device_count(env);
    for device in 0..n {
        let id = env
            .gpu
            .pci_bus_id(device)
            .unwrap_or_else(|e| panic!("pci_bus_id({device}): error {e}"));
        let parts: Vec<&str> = id.split([':', '.']).collect();
        let widths: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert_eq!(widths, [4, 2, 2, 1], "{id:?} is dddd:bb:dd.f");
        assert!(
            id.chars()
                .all(|c| c == ':' || c == '.' || c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "{id:?} is lowercase hex"
        );
    }
    assert!(env.gpu.pci_bus_id(n).is_err(), "device {n} does not exist");
}

/// The current device is one of the devices, on this thread and on a
/// thread that never touched the GPU.
pub fn gpu_current_device_is_one_of_the_devices(env: &GpuEnv) {
    let n = device_count(env);
    let here = env.gpu.current_device().expect("current_device");
    assert!((0..n).contains(&here), "current device {here} of {n}");
    let gpu = Arc::clone(&env.gpu);
    let there = std::thread::spawn(move || gpu.current_device())
        .join()
        .expect("the thread")
        .expect("current_device on a fresh thread");
    assert!(
        (0..n).contains(&there),
        "fresh thread's device {there} of {n}"
    );
}

/// Device memory (any byte of it) is its device's; pinned buffers are
/// pinned host memory; ordinary heap and stack memory is unknown host
/// memory; address 0 is an error or unknown, never device memory.
pub fn gpu_pointer_kinds_tell_device_pinned_and_unknown_memory(env: &GpuEnv) {
    let n = device_count(env);
    for device in 0..n {
        let mem = env.lab.device_alloc(device, LEN);
        for addr in [mem.addr(), mem.addr() + 1, mem.addr() + LEN - 1] {
            assert_eq!(
                env.gpu.pointer_kind(addr),
                Ok(PointerKind::Device { device }),
                "device memory of {device} at {addr:#x}"
            );
        }
    }
    let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
    assert_eq!(
        env.gpu.pointer_kind(pinned.addr() + 100),
        Ok(PointerKind::PinnedHost)
    );
    let heap = vec![7u8; LEN];
    let stack = [0u8; 64];
    for addr in [heap.as_ptr() as usize, stack.as_ptr() as usize] {
        assert_eq!(
            env.gpu.pointer_kind(addr),
            Ok(PointerKind::UnknownHost),
            "plain host memory at {addr:#x}"
        );
    }
    assert!(
        !matches!(env.gpu.pointer_kind(0), Ok(PointerKind::Device { .. })),
        "address 0 is not device memory"
    );
}

/// Any address inside a device allocation gives the whole allocation.
pub fn gpu_allocation_range_is_the_whole_allocation(env: &GpuEnv) {
    let mem = env.lab.device_alloc(0, LEN);
    for addr in [mem.addr(), mem.addr() + 4097, mem.addr() + LEN - 1] {
        let (base, len) = env
            .gpu
            .allocation_range(addr)
            .unwrap_or_else(|e| panic!("allocation_range({addr:#x}): error {e}"));
        assert_eq!(base, mem.addr(), "the allocation's start");
        assert!(len >= LEN, "at least the {LEN} bytes asked for, not {len}");
    }
}

/// A pinned buffer has the size asked for and can be written and read by
/// the host, directly and through its `write` and `read`, which refuse to
/// pass its end; an empty one is refused.
pub fn gpu_pinned_buffers_are_host_memory_of_the_size_asked(env: &GpuEnv) {
    let buf = env.gpu.host_alloc(12_345).expect("host_alloc");
    assert_eq!(buf.len(), 12_345);
    let bytes = host_slice(&buf);
    bytes.copy_from_slice(&pattern(12_345, 3));
    assert_eq!(bytes[12_344], pattern(12_345, 3)[12_344]);
    assert!(buf.write(12_000, &[9; 345]), "a write up to the end");
    let mut back = [0u8; 346];
    assert!(buf.read(11_999, &mut back), "a read up to the end");
    assert_eq!(back[0], pattern(12_345, 3)[11_999]);
    assert!(back[1..].iter().all(|&b| b == 9), "read what was written");
    assert!(!buf.write(12_000, &[1; 346]), "a write past the end");
    assert!(!buf.read(12_000, &mut back), "a read past the end");
    assert!(!buf.write(usize::MAX, &[1]), "an offset that wraps");
    assert_eq!(
        host_slice(&buf)[12_344],
        9,
        "a refused write changed nothing"
    );
    assert!(env.gpu.host_alloc(0).is_err(), "an empty pinned buffer");
}

/// Copies between device memory and a pinned buffer move the bytes, both
/// ways, at offsets, and their events say so.
pub fn gpu_copies_move_bytes_both_ways_and_signal_their_events(env: &GpuEnv) {
    let mem = env.lab.device_alloc(0, LEN);
    let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
    let up = pattern(LEN, 11);
    host_slice(&pinned).copy_from_slice(&up);
    let event = env
        .gpu
        .copy_async(mem.addr(), pinned.addr(), LEN)
        .expect("host to device");
    assert_eq!(event.wait(Instant::now() + PATIENCE), Ok(true));
    assert!(
        env.lab.read(mem.addr(), LEN) == up,
        "the device has the bytes"
    );

    let down = pattern(LEN / 2, 29);
    env.lab.write(mem.addr() + 4096, &down);
    host_slice(&pinned).fill(0);
    let event = env
        .gpu
        .copy_async(pinned.addr() + 8, mem.addr() + 4096, LEN / 2)
        .expect("device to host");
    assert_eq!(event.wait(Instant::now() + PATIENCE), Ok(true));
    let host = host_slice(&pinned);
    assert!(host[8..8 + LEN / 2] == down[..], "the host has the bytes");
    assert!(
        host[..8].iter().all(|&b| b == 0),
        "nothing before the range"
    );
}

/// A copy queued behind GPU work misses a short deadline (its event is not
/// done), and completes, bytes and all, once the work is done.
pub fn gpu_copy_behind_gpu_work_misses_a_short_deadline_then_completes(env: &GpuEnv) {
    let mem = env.lab.device_alloc(0, LEN);
    let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
    let bytes = pattern(LEN, 47);
    env.lab.write(mem.addr(), &bytes);
    env.lab.occupy(0);
    let event = env
        .gpu
        .copy_async(pinned.addr(), mem.addr(), LEN)
        .expect("device to host");
    let early = event.wait(Instant::now() + SHORT);
    env.lab.release();
    assert_eq!(
        early,
        Ok(false),
        "done within {SHORT:?} behind {GPU_BUSY:?} of work"
    );
    assert_eq!(event.wait(Instant::now() + PATIENCE), Ok(true));
    assert!(
        host_slice(&pinned)[..] == bytes[..],
        "the host has the bytes"
    );
}

/// Synchronizing a device returns once the work queued on it is done: a
/// copy queued behind GPU work has landed, without waiting on its event.
pub fn gpu_synchronize_waits_for_queued_work(env: &GpuEnv) {
    let mem = env.lab.device_alloc(0, LEN);
    let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
    let bytes = pattern(LEN, 61);
    host_slice(&pinned).copy_from_slice(&bytes);
    env.lab.occupy(0);
    let event = env
        .gpu
        .copy_async(mem.addr(), pinned.addr(), LEN)
        .expect("host to device");
    let synchronized = env.gpu.synchronize(0);
    // Looked at before the fake's work is let go.
    let done = event.wait(Instant::now());
    let landed = env.lab.read(mem.addr(), LEN) == bytes;
    env.lab.release();
    assert_eq!(synchronized, Ok(()));
    assert_eq!(done, Ok(true), "the copy is done when synchronize returns");
    assert!(landed, "the device has the bytes");
    let n = device_count(env);
    assert!(env.gpu.synchronize(n).is_err(), "device {n} does not exist");
}

/// Where the runtime exports dma-bufs: device memory, whole or a sub-range
/// at an unaligned address, gives a new fd each time and the offset of the
/// address inside it (below the range's own length from its start); host
/// memory gives an error.
pub fn gpu_dmabuf_export_covers_the_range(env: &GpuEnv) {
    let mem = env.lab.device_alloc(0, LEN);
    let Some(whole) = env.gpu.export_dmabuf(mem.addr(), LEN) else {
        // No export in this runtime: nothing more to check.
        return;
    };
    let (whole, offset) = whole.unwrap_or_else(|e| panic!("export of the allocation: error {e}"));
    assert_eq!(offset, 0, "the allocation's own start is at offset 0");
    let addr = mem.addr() + (1 << 20) + 123;
    let (part, offset) = env
        .gpu
        .export_dmabuf(addr, 1 << 20)
        .expect("an export")
        .unwrap_or_else(|e| panic!("export of a sub-range: error {e}"));
    assert_ne!(whole.as_raw_fd(), part.as_raw_fd(), "a new fd");
    let offset = usize::try_from(offset).expect("offset");
    assert!(
        offset <= addr - mem.addr() && (addr - offset - mem.addr()) % 4096 == 0,
        "offset {offset} puts the fd's start at a page of the allocation"
    );
    let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
    assert!(
        matches!(env.gpu.export_dmabuf(pinned.addr(), 4096), Some(Err(_))),
        "host memory has no dma-buf"
    );
}

/// Every call works on a thread that never touched the GPU (a thread of
/// the library's or the application's that made no GPU call): lookups,
/// pinned buffers, copies, their events, synchronization.
pub fn gpu_calls_work_on_a_thread_that_never_touched_the_gpu(env: &GpuEnv) {
    let mem = env.lab.device_alloc(0, LEN);
    let bytes = pattern(LEN, 73);
    env.lab.write(mem.addr(), &bytes);
    let gpu = Arc::clone(&env.gpu);
    let addr = mem.addr();
    let copied = std::thread::spawn(move || {
        assert_eq!(
            gpu.pointer_kind(addr),
            Ok(PointerKind::Device { device: 0 })
        );
        assert_eq!(gpu.allocation_range(addr + 5).map(|r| r.0), Ok(addr));
        let pinned = gpu.host_alloc(LEN).expect("host_alloc");
        let event = gpu.copy_async(pinned.addr(), addr, LEN).expect("copy");
        assert_eq!(event.wait(Instant::now() + PATIENCE), Ok(true));
        assert_eq!(gpu.synchronize(0), Ok(()));
        host_slice(&pinned).to_vec()
    })
    .join()
    .expect("the fresh thread's calls");
    assert!(copied == bytes, "the fresh thread's copy has the bytes");
}

/// Managed memory, where the runtime has it, is device memory of a device
/// (so it is staged, or refused by `HIPOBJ_REQUIRE_GPU_DIRECT`), with an
/// allocation range, and copies reach it.
pub fn gpu_managed_memory_is_device_memory(env: &GpuEnv) {
    let Some(mem) = env.lab.managed_alloc(LEN) else {
        return;
    };
    let n = device_count(env);
    match env.gpu.pointer_kind(mem.addr()) {
        Ok(PointerKind::Device { device }) => assert!((0..n).contains(&device)),
        other => panic!("managed memory is {other:?}"),
    }
    assert_eq!(
        env.gpu.allocation_range(mem.addr() + 9).map(|r| r.0),
        Ok(mem.addr())
    );
    let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
    let bytes = pattern(LEN, 83);
    host_slice(&pinned).copy_from_slice(&bytes);
    let event = env
        .gpu
        .copy_async(mem.addr(), pinned.addr(), LEN)
        .expect("host to managed");
    assert_eq!(event.wait(Instant::now() + PATIENCE), Ok(true));
    assert!(
        env.lab.read(mem.addr(), LEN) == bytes,
        "managed memory has the bytes"
    );
}

/// The runtime's own device memory ([`Gpu::device_alloc`]) is device
/// memory of the device asked for, of at least the size asked, reached by
/// copies both ways; an empty allocation and an unknown device are errors.
pub fn gpu_device_alloc_gives_memory_of_the_device_asked(env: &GpuEnv) {
    let n = device_count(env);
    for device in 0..n {
        let mem = env
            .gpu
            .device_alloc(device, LEN)
            .unwrap_or_else(|e| panic!("device_alloc({device}): error {e}"));
        assert_eq!(mem.len(), LEN);
        assert_eq!(mem.device(), device);
        assert_eq!(
            env.gpu.pointer_kind(mem.addr() + LEN - 1),
            Ok(PointerKind::Device { device }),
            "the allocation's last byte"
        );
        let bytes = pattern(LEN, 41u8.wrapping_add(device.to_le_bytes()[0]));
        let pinned = env.gpu.host_alloc(LEN).expect("host_alloc");
        host_slice(&pinned).copy_from_slice(&bytes);
        let event = env
            .gpu
            .copy_async(mem.addr(), pinned.addr(), LEN)
            .expect("host to device");
        assert_eq!(event.wait(Instant::now() + PATIENCE), Ok(true));
        assert!(env.lab.read(mem.addr(), LEN) == bytes, "the bytes arrived");
    }
    assert!(env.gpu.device_alloc(0, 0).is_err(), "an empty allocation");
    assert!(env.gpu.device_alloc(n, 4096).is_err(), "device {n}");
}

/// The runtime names itself, the library it came from, and a version that
/// decodes to something other than zero.
pub fn gpu_runtime_reports_its_name_and_version(env: &GpuEnv) {
    let info = env.gpu.runtime().expect("runtime");
    assert!(
        !info.name.is_empty() && !info.library.is_empty(),
        "{info:?}"
    );
    assert!(info.version > 0, "version {info:?}");
    let text = info.version_text();
    assert!(
        text.chars().any(|c| c.is_ascii_digit() && c != '0'),
        "{text:?}"
    );
}

/// Calls the macro `$callback` with `$args` and the name of every GPU
/// check: the one list, shared by every runner.
#[doc(hidden)]
#[macro_export]
macro_rules! __hipobj_gpu_contract_checks {
    ($($callback:ident)::+ ; $args:tt) => {
        $($callback)::+! {
            $args;
            gpu_devices_report_lowercase_pci_bus_ids,
            gpu_current_device_is_one_of_the_devices,
            gpu_pointer_kinds_tell_device_pinned_and_unknown_memory,
            gpu_allocation_range_is_the_whole_allocation,
            gpu_pinned_buffers_are_host_memory_of_the_size_asked,
            gpu_copies_move_bytes_both_ways_and_signal_their_events,
            gpu_copy_behind_gpu_work_misses_a_short_deadline_then_completes,
            gpu_synchronize_waits_for_queued_work,
            gpu_dmabuf_export_covers_the_range,
            gpu_calls_work_on_a_thread_that_never_touched_the_gpu,
            gpu_managed_memory_is_device_memory,
            gpu_device_alloc_gives_memory_of_the_device_asked,
            gpu_runtime_reports_its_name_and_version,
        }
    };
}

/// One `#[test]` per GPU check, each on a fresh `$env()` (returning a
/// [`GpuEnv`](crate::contract::GpuEnv)):
///
/// ```text
/// hipobj_testing::gpu_contract_tests!(hipobj_testing::contract::GpuEnv::fake);
/// ```
#[macro_export]
macro_rules! gpu_contract_tests {
    ($env:expr) => {
        $crate::__hipobj_gpu_contract_checks!($crate::__hipobj_gpu_contract_test_fns; ($env));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __hipobj_gpu_contract_test_fns {
    (($env:expr); $($check:ident),+ $(,)?) => {
        $(
            #[test]
            fn $check() {
                let env: $crate::contract::GpuEnv = ($env)();
                $crate::contract::$check(&env);
            }
        )+
    };
}
