//! The map of registered buffers.
//!
//! Entries are found by the exact address they were registered at; a
//! transfer picks its part of the buffer with an offset. Lookups copy the
//! entry's `Arc` under a shared lock and release it, so the lock guards the
//! map, never the work. An entry that anyone else holds (a transfer, a token,
//! an abandoned copy) cannot be removed: since copies are only made under
//! the map's lock, the check cannot miss one.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use parking_lot::RwLock;

use super::args::MAX_BUFFERS;
use crate::error::{Error, Result};
use crate::platform::{Access, HostBuffer, Mr, Pd};

/// How a buffer was registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufKind {
    /// `hipObjBufRegisterHost`, or host memory given to `hipObjBufRegister`:
    /// the caller's memory, registered as it is.
    Host,
    /// GPU memory the NIC reaches directly; `dmabuf` tells how it was
    /// registered. The device is synchronized after a transfer.
    Device {
        /// The HIP device.
        device: i32,
        /// Registered as a dma-buf (else with a plain MR).
        dmabuf: bool,
    },
    /// GPU memory the NIC cannot reach: transfers go through a pinned host
    /// staging buffer of the same size.
    Staged {
        /// The HIP device.
        device: i32,
    },
}

/// One registered buffer.
///
/// Field order is teardown order: the MR is deregistered before the staging
/// memory it covers is freed.
pub struct BufEntry {
    /// The address the caller registered.
    pub base: usize,
    /// Bytes.
    pub len: usize,
    /// How it was registered.
    pub kind: BufKind,
    /// The registration the NIC uses (of the staging buffer when staged).
    pub mr: Arc<dyn Mr>,
    /// The staging buffer, when staged.
    pub staging: Option<Arc<dyn HostBuffer>>,
    /// The dma-buf of a GPU buffer registered through one, kept where
    /// transfers register their own ranges (a device without windows).
    pub dmabuf: Option<DmabufSource>,
}

/// Where a dma-buf registration came from: enough to register a part of it
/// again.
#[derive(Debug)]
pub struct DmabufSource {
    /// The exported dma-buf.
    pub fd: OwnedFd,
    /// Where the buffer starts inside it.
    pub offset: u64,
    /// The address the NIC knows the buffer's first byte by.
    pub iova: u64,
}

impl std::fmt::Debug for BufEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufEntry")
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl BufEntry {
    /// The address the NIC knows byte `offset` of the buffer by: in the
    /// staging buffer when staged.
    pub fn nic_addr(&self, offset: u64) -> u64 {
        self.mr.addr() + offset
    }

    /// The staging buffer's address, when staged.
    pub fn staging_addr(&self) -> Option<usize> {
        self.staging.as_ref().map(|s| s.addr())
    }

    /// Registers exactly `len` bytes at `offset` of the buffer (of its
    /// staging buffer when staged) in `pd`, addressed by the NIC as
    /// [`BufEntry::nic_addr`] says: a transfer's own registration on a
    /// device without memory windows.
    pub fn register_range(
        &self,
        pd: &dyn Pd,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<Arc<dyn Mr>> {
        let len = usize::try_from(len).map_err(|_| Error::InvalidValue("size"))?;
        if let Some(src) = &self.dmabuf {
            return pd.reg_dmabuf_mr(&src.fd, src.offset + offset, len, src.iova + offset, access);
        }
        let addr = self.staging_addr().unwrap_or(self.base);
        let addr = usize::try_from(offset)
            .ok()
            .and_then(|o| addr.checked_add(o))
            .ok_or(Error::InvalidValue("offset"))?;
        pd.reg_mr(addr, len, access)
    }
}

/// The registered buffers, at most [`MAX_BUFFERS`].
#[derive(Default)]
pub struct BufferMap {
    entries: RwLock<BTreeMap<usize, Arc<BufEntry>>>,
}

impl BufferMap {
    /// An empty map.
    pub fn new() -> BufferMap {
        BufferMap::default()
    }

    /// The entry registered at exactly `base`.
    pub fn find(&self, base: usize) -> Result<Arc<BufEntry>> {
        self.entries
            .read()
            .get(&base)
            .cloned()
            .ok_or(Error::BufNotRegistered)
    }

    /// Whether `base` could be registered now: not registered, map not full.
    /// Checked before registering, so a duplicate costs no registration; and
    /// again by [`BufferMap::insert`].
    pub fn precheck(&self, base: usize) -> Result<()> {
        Self::check(&self.entries.read(), base)
    }

    fn check(entries: &BTreeMap<usize, Arc<BufEntry>>, base: usize) -> Result<()> {
        if entries.contains_key(&base) {
            return Err(Error::BufAlreadyRegistered);
        }
        if entries.len() >= MAX_BUFFERS {
            return Err(Error::Rdma(format!(
                "{MAX_BUFFERS} buffers are registered already"
            )));
        }
        Ok(())
    }

    /// Inserts a registered entry. If another thread registered the same
    /// address meanwhile, or filled the map, the entry is released (after
    /// the lock) and the error returned.
    pub fn insert(&self, entry: BufEntry) -> Result<()> {
        let mut entries = self.entries.write();
        if let Err(e) = Self::check(&entries, entry.base) {
            drop(entries);
            drop(entry);
            return Err(e);
        }
        entries.insert(entry.base, Arc::new(entry));
        Ok(())
    }

    /// Removes the entry at `base` unless something else holds it. The entry
    /// is released after the lock.
    pub fn remove(&self, base: usize) -> Result<()> {
        let mut entries = self.entries.write();
        let entry = entries.get(&base).ok_or(Error::BufNotRegistered)?;
        if Arc::strong_count(entry) > 1 {
            return Err(Error::Busy(
                "the buffer is in use by a transfer, a token or a staging copy",
            ));
        }
        let removed = entries.remove(&base);
        drop(entries);
        drop(removed);
        Ok(())
    }

    /// Registered buffers.
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.read().is_empty()
    }

    /// Takes every entry out (at instance teardown).
    pub fn drain(&self) -> Vec<Arc<BufEntry>> {
        std::mem::take(&mut *self.entries.write())
            .into_values()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{Access, Pd};
    use crate::testing::fabric::{DeviceSpec, Fabric};
    use crate::testing::{Counters, Faults};

    fn pd() -> (Arc<Counters>, Arc<dyn Pd>) {
        let counters = Arc::new(Counters::new());
        let fabric = Fabric::new(Arc::new(Faults::new()), counters.clone());
        fabric
            .add_device(DeviceSpec::new("d0", std::net::Ipv4Addr::new(192, 0, 2, 9)))
            .unwrap();
        let ctx = fabric.verbs(&["d0"]).open("d0").unwrap();
        (counters, ctx.alloc_pd().unwrap())
    }

    fn entry(pd: &Arc<dyn Pd>, mem: &[u8], base_offset: usize) -> BufEntry {
        let base = mem.as_ptr() as usize + base_offset;
        let mr = pd
            .reg_mr(base, 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        BufEntry {
            base,
            len: 16,
            kind: BufKind::Host,
            mr,
            staging: None,
            dmabuf: None,
        }
    }

    #[test]
    fn lookups_are_by_exact_base_and_a_duplicate_is_released() {
        let (counters, pd) = pd();
        let mem = vec![0u8; 64];
        let map = BufferMap::new();
        map.insert(entry(&pd, &mem, 0)).unwrap();
        assert!(map.find(mem.as_ptr() as usize).is_ok());
        assert_eq!(
            map.find(mem.as_ptr() as usize + 1).unwrap_err(),
            Error::BufNotRegistered
        );
        assert_eq!(
            map.precheck(mem.as_ptr() as usize),
            Err(Error::BufAlreadyRegistered)
        );
        // The loser of a registration race: its MR is released, not leaked.
        assert_eq!(
            map.insert(entry(&pd, &mem, 0)),
            Err(Error::BufAlreadyRegistered)
        );
        assert_eq!(counters.live("mr"), 1);
    }

    #[test]
    fn a_held_entry_cannot_be_removed() {
        let (counters, pd) = pd();
        let mem = vec![0u8; 64];
        let map = BufferMap::new();
        map.insert(entry(&pd, &mem, 0)).unwrap();
        let held = map.find(mem.as_ptr() as usize).unwrap();
        assert!(matches!(
            map.remove(mem.as_ptr() as usize),
            Err(Error::Busy(_))
        ));
        drop(held);
        map.remove(mem.as_ptr() as usize).unwrap();
        assert_eq!(counters.live("mr"), 0, "the MR went with the entry");
        assert_eq!(
            map.remove(mem.as_ptr() as usize),
            Err(Error::BufNotRegistered)
        );
    }

    #[test]
    fn the_map_holds_256_buffers() {
        let (_, pd) = pd();
        let mem = vec![0u8; 4096];
        let map = BufferMap::new();
        for i in 0..MAX_BUFFERS {
            map.insert(entry(&pd, &mem, i)).unwrap();
        }
        assert!(matches!(
            map.precheck(mem.as_ptr() as usize + 300),
            Err(Error::Rdma(_))
        ));
        assert!(matches!(
            map.insert(entry(&pd, &mem, 300)),
            Err(Error::Rdma(_))
        ));
        assert_eq!(map.drain().len(), MAX_BUFFERS);
        assert!(map.is_empty());
    }
}
