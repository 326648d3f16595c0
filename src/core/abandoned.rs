//! Staging copies that timed out but may still run.
//!
//! A copy that passed its deadline cannot be stopped, and the GPU may still
//! read or write the staging buffer whenever it gets to it. So its event and
//! its buffer's entry are kept here: holding the entry keeps the staging
//! buffer allocated and makes deregistration report `hipObjBusy`, and
//! transfers on that buffer are refused with `hipObjBusy` while the copy
//! runs. Finished copies are released when next checked. Copies still
//! running when the list is destroyed are leaked, event and staging memory
//! both, rather than freed under the GPU.
//!
//! Handing a copy over must not fail, or a running copy would go
//! untracked: each copy reserves room before it starts ([`Slot`]).

use crate::log::{log, Level};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::buffers::BufEntry;
use crate::platform::GpuEvent;

struct Abandoned {
    event: Arc<dyn GpuEvent>,
    entry: Arc<BufEntry>,
}

#[derive(Default)]
struct Inner {
    copies: Vec<Abandoned>,
    reserved: usize,
}

/// The list of abandoned copies.
#[derive(Default)]
pub struct AbandonedCopies {
    inner: Mutex<Inner>,
}

/// Room for one copy in the list, taken before the copy starts.
pub struct Slot<'a> {
    list: &'a AbandonedCopies,
    used: bool,
}

impl Slot<'_> {
    /// Hands a timed-out copy over; cannot fail or allocate.
    pub fn add(mut self, event: Arc<dyn GpuEvent>, entry: Arc<BufEntry>) {
        let mut inner = self.list.inner.lock();
        inner.reserved -= 1;
        // Cannot reallocate: reserve() made room for every open slot.
        inner.copies.push(Abandoned { event, entry });
        self.used = true;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.list.inner.lock().reserved -= 1;
        }
    }
}

impl AbandonedCopies {
    /// An empty list.
    pub fn new() -> AbandonedCopies {
        AbandonedCopies::default()
    }

    /// Reserves room for one copy. Allocation happens here, before the copy
    /// starts, where failing is still harmless.
    pub fn reserve(&self) -> Slot<'_> {
        let mut inner = self.inner.lock();
        inner.reserved += 1;
        let needed = inner.copies.len() + inner.reserved;
        let have = inner.copies.capacity();
        inner.copies.reserve(needed.saturating_sub(have));
        Slot {
            list: self,
            used: false,
        }
    }

    /// Whether a copy of the buffer at `base` may still be running. Copies
    /// found finished are released. Events are queried without the lock.
    pub fn is_running(&self, base: usize) -> bool {
        self.prune(Some(base)) > 0
    }

    /// Releases every finished copy; returns how many still run.
    pub fn prune_all(&self) -> usize {
        self.prune(None)
    }

    /// Copies still listed (running or not yet checked).
    pub fn len(&self) -> usize {
        self.inner.lock().copies.len()
    }

    /// Whether no copy is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn prune(&self, base: Option<usize>) -> usize {
        let candidates: Vec<Arc<dyn GpuEvent>> = self
            .inner
            .lock()
            .copies
            .iter()
            .filter(|c| base.is_none_or(|b| c.entry.base == b))
            .map(|c| c.event.clone())
            .collect();
        let now = Instant::now();
        // A failed query leaves the copy listed: it may still run.
        let finished: Vec<Arc<dyn GpuEvent>> = candidates
            .into_iter()
            .filter(|e| e.wait(now).unwrap_or(false))
            .collect();
        let released: Vec<Abandoned>;
        let running;
        {
            let mut inner = self.inner.lock();
            let (gone, kept) = std::mem::take(&mut inner.copies)
                .into_iter()
                .partition(|c| finished.iter().any(|f| Arc::ptr_eq(f, &c.event)));
            released = gone;
            inner.copies = kept;
            let room = inner.reserved;
            inner.copies.reserve(room);
            running = inner
                .copies
                .iter()
                .filter(|c| base.is_none_or(|b| c.entry.base == b))
                .count();
        }
        // Entries (and with them MRs and staging buffers) go after the lock.
        drop(released);
        running
    }
}

impl Drop for AbandonedCopies {
    fn drop(&mut self) {
        let copies = std::mem::take(&mut self.inner.get_mut().copies);
        let now = Instant::now();
        for copy in copies {
            if copy.event.wait(now).unwrap_or(false) {
                continue;
            }
            // Still running (or unknown): the GPU may still touch the staging
            // memory, so neither it nor the event may be released.
            copy.event.leak();
            if let Some(staging) = &copy.entry.staging {
                staging.leak();
            }
            log!(
                Level::Error,
                "leaking the staging buffer of {:#x} ({} bytes): its copy is still running",
                copy.entry.base,
                copy.entry.len
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::buffers::BufKind;
    use crate::platform::{Access, Gpu};
    use crate::testing::fabric::{DeviceSpec, Fabric};
    use crate::testing::gpu::{CopyMode, FakeGpu, FakeGpuDevice};
    use crate::testing::{Counters, Faults};

    struct Setup {
        gpu: Arc<FakeGpu>,
        counters: Arc<Counters>,
        entry: Arc<BufEntry>,
        device: usize,
    }

    fn setup() -> (Setup, crate::testing::gpu::DeviceAlloc) {
        let faults = Arc::new(Faults::new());
        let counters = Arc::new(Counters::new());
        let gpu = Arc::new(FakeGpu::new(
            vec![FakeGpuDevice {
                pci_bus_id: "0000:01:00.0".into(),
            }],
            faults.clone(),
            counters.clone(),
        ));
        let fabric = Fabric::new(faults, counters.clone());
        fabric
            .add_device(DeviceSpec::new("d0", std::net::Ipv4Addr::new(192, 0, 2, 9)))
            .unwrap();
        let pd = fabric
            .verbs(&["d0"])
            .open("d0")
            .unwrap()
            .alloc_pd()
            .unwrap();
        let alloc = gpu.alloc_device(0, 4096).unwrap();
        let staging = gpu.host_alloc(4096).unwrap();
        let mr = pd
            .reg_mr(staging.addr(), 4096, Access::LOCAL_WRITE)
            .unwrap();
        let entry = Arc::new(BufEntry {
            base: alloc.addr(),
            len: 4096,
            kind: BufKind::Staged { device: 0 },
            mr,
            staging: Some(staging),
            dmabuf: None,
        });
        (
            Setup {
                device: alloc.addr(),
                gpu,
                counters,
                entry,
            },
            alloc,
        )
    }

    #[test]
    fn a_finished_copy_is_released_when_next_checked() {
        let (s, _alloc) = setup();
        s.gpu.set_copy_mode(CopyMode::Manual);
        let list = AbandonedCopies::new();
        let slot = list.reserve();
        let event = s
            .gpu
            .copy_async(s.entry.staging_addr().unwrap(), s.device, 4096)
            .unwrap();
        slot.add(event, s.entry.clone());
        assert!(list.is_running(s.device));
        assert!(!list.is_running(s.device + 1));
        assert_eq!(Arc::strong_count(&s.entry), 2, "the list holds the entry");
        assert_eq!(s.gpu.complete_all(), 1);
        assert!(!list.is_running(s.device));
        assert!(list.is_empty());
        assert_eq!(Arc::strong_count(&s.entry), 1);
    }

    #[test]
    fn an_unused_slot_gives_its_room_back() {
        let list = AbandonedCopies::new();
        drop(list.reserve());
        drop(list.reserve());
        assert_eq!(list.inner.lock().reserved, 0);
    }

    #[test]
    fn a_copy_still_running_at_destruction_is_leaked_not_freed() {
        let (s, _alloc) = setup();
        s.gpu.set_copy_mode(CopyMode::Never);
        let list = AbandonedCopies::new();
        let slot = list.reserve();
        let event = s
            .gpu
            .copy_async(s.entry.staging_addr().unwrap(), s.device, 4096)
            .unwrap();
        slot.add(event, s.entry.clone());
        drop(list);
        drop(s.entry);
        assert_eq!(s.counters.live("host_alloc_leaked"), 1);
        assert_eq!(s.counters.live("gpu_event_leaked"), 1);
    }
}
