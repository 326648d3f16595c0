//! Protection domains and the memory they register: memory regions (plain
//! and dma-buf) and type-2 memory windows, and the checks a NIC makes when
//! a key is used.
//!
//! Hardware rules: lkeys and rkeys differ, so using one for the other
//! fails; a key reaches only memory of the QP's PD, inside the region's
//! bounds, with the access the operation needs; remote write or atomic
//! access needs local write (`ibv_reg_mr(3)`); a window is bound only when
//! free, by an RTS QP of its PD, over an MR with `MW_BIND`, keeps its key
//! index, and then grants only its own range and only through the QP that
//! bound it (rxe_mw.c, stricter on bounds); an MR with bound windows and a
//! PD with live children cannot be destroyed (the destroy fails and the
//! object leaks); plain registration of device memory fails without
//! peer-memory, and dma-buf registration needs the fake GPU's fd; the
//! device's MR and MW limits give ENOMEM.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::super::memory::Span;
use super::context::FakeContext;
use super::cq::completion;
use super::qp::{Kind, Wr};
use super::transport::Outcome;
use super::{gone, to_u64, to_usize, Fabric, QpKey, State};
use hipobj::error::{Error, Result};
use hipobj::platform::{Access, Cq, Mr, Mw, Pd, Qp, QpCaps, Sge, WcOpcode, WcStatus};

/// Low byte of every MR lkey; rkeys differ, so mixing them up is caught.
const LKEY_TAG: u32 = 0x4c;
/// Low byte of every MR rkey.
const RKEY_TAG: u32 = 0x52;
/// Remote access bits a memory window may grant.
const WINDOW_ACCESS: Access = Access::REMOTE_READ
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_ATOMIC);
/// `IBV_WC_LOC_QP_OP_ERR`, which rxe reports for a failed local invalidate.
const WC_LOC_QP_OP_ERR: u32 = 2;

pub(super) struct PdRec {
    /// Live MRs, MWs and QPs.
    pub(super) children: usize,
    /// The context it was allocated on.
    pub(super) ctx: u64,
}

pub(super) struct MrRec {
    pub(super) device: usize,
    pd: u64,
    lkey: u32,
    rkey: u32,
    /// The first address the NIC knows the region by.
    iova: u64,
    len: usize,
    span: Span,
    access: Access,
    bound_windows: usize,
    /// Deregistration failed (windows were bound) and the owner is gone:
    /// the registration leaks and stays usable, as on hardware (remote
    /// accesses to it are counted, and move no bytes: its memory may be
    /// freed by now).
    zombie: bool,
}

pub(super) struct MwRec {
    pub(super) device: usize,
    pd: u64,
    /// The current rkey: the allocation's, then the last bind's.
    rkey: u32,
    binding: Option<Binding>,
}

#[derive(Clone, Copy)]
struct Binding {
    mr: u64,
    /// Type-2 windows are usable only through the QP that bound them.
    qp: QpKey,
    addr: u64,
    len: u64,
    access: Access,
}

/// A region of registered memory and an offset into it.
pub(super) type Place = (Span, usize);

/// `[addr, addr + len)` inside `[base, base + size)`: the offset of `addr`.
fn offset_within(base: u64, size: u64, addr: u64, len: u64) -> Option<usize> {
    let offset = addr.checked_sub(base)?;
    (offset.checked_add(len)? <= size).then_some(())?;
    usize::try_from(offset).ok()
}

impl State {
    /// A fresh key index on `device`: MR and MW keys are `index << 8 | key`.
    fn new_key_index(&mut self, device: usize) -> Option<u32> {
        let d = self.devices.get_mut(device)?;
        let index = d.next_key_index;
        (index < 1 << 24).then_some(())?;
        d.next_key_index += 1;
        Some(index << 8)
    }

    /// The memory behind a local scatter/gather entry of QP `key`: an MR of
    /// the QP's PD whose lkey matches, covering the whole entry, writable
    /// when the operation writes it.
    pub(super) fn local_place(&self, key: QpKey, sge: Sge, writes: bool) -> Option<Place> {
        let qp = self.qps.get(&key)?;
        let mr = self
            .mrs
            .values()
            .find(|m| m.device == key.0 && m.lkey == sge.lkey && !m.zombie)?;
        (mr.pd == qp.pd).then_some(())?;
        (!writes || mr.access.contains(Access::LOCAL_WRITE)).then_some(())?;
        let offset = offset_within(mr.iova, to_u64(mr.len), sge.addr, u64::from(sge.len))?;
        Some((mr.span, offset))
    }

    /// The memory an rkey names for responder `key`: an MR of its PD, or a
    /// window bound through this very QP, granting `need`, covering
    /// `[addr, addr + len)`.
    pub(super) fn remote_place(
        &self,
        key: QpKey,
        rkey: u32,
        addr: u64,
        len: u32,
        need: Access,
    ) -> Option<Place> {
        let qp = self.qps.get(&key)?;
        let len = u64::from(len);
        if let Some(mr) = self
            .mrs
            .values()
            .find(|m| m.device == key.0 && m.rkey == rkey)
        {
            (mr.pd == qp.pd && mr.access.contains(need)).then_some(())?;
            let offset = offset_within(mr.iova, to_u64(mr.len), addr, len)?;
            return Some((mr.span, offset));
        }
        // rxe_lookup_mw: same PD, type 2 bound through this QP, valid,
        // access granted.
        let (w, b) = self.mws.values().find_map(|w| match w.binding {
            Some(b) if w.device == key.0 && w.rkey == rkey => Some((w, b)),
            _ => None,
        })?;
        (w.pd == qp.pd && b.qp == key && b.access.contains(need)).then_some(())?;
        offset_within(b.addr, b.len, addr, len)?;
        let mr = self.mrs.get(&b.mr)?;
        let offset = offset_within(mr.iova, to_u64(mr.len), addr, len)?;
        Some((mr.span, offset))
    }

    /// Whether `rkey` reaches, for responder `key`, a registration whose
    /// deregistration failed (directly, or through a window bound over it).
    pub(super) fn reaches_leaked(&self, key: QpKey, rkey: u32) -> bool {
        let direct = self
            .mrs
            .values()
            .find(|m| m.device == key.0 && m.rkey == rkey);
        if let Some(m) = direct {
            return m.zombie;
        }
        self.mws.values().any(|w| match w.binding {
            Some(b) if w.device == key.0 && w.rkey == rkey => {
                self.mrs.get(&b.mr).is_some_and(|m| m.zombie)
            }
            _ => false,
        })
    }

    /// `IBV_WR_BIND_MW` of a type-2 window (rxe_mw.c's checks).
    pub(super) fn bind_mw(&mut self, a: QpKey, wr: Wr) -> Outcome {
        let Kind::Bind {
            mw,
            mr,
            current,
            rkey,
            addr,
            len,
            access,
        } = wr.kind
        else {
            return Outcome::Fail(WcStatus::MwBindErr);
        };
        if self.fail_binds > 0 {
            self.fail_binds -= 1;
            return Outcome::Fail(WcStatus::MwBindErr);
        }
        let checked = (|| {
            let qp = self.qps.get(&a)?;
            let (mw, mr) = (mw?, mr?);
            let w = self.mws.get(&mw)?;
            // rxe_bind_mw: the carried key must be the window's current
            // one (after a refused bind the poster's copy has moved on).
            (current == w.rkey).then_some(())?;
            // o10-36.2.2: a type-2 window is bound only when free; C10-72:
            // in the QP's PD; the rkey keeps the window's index.
            (w.device == a.0 && w.pd == qp.pd && w.binding.is_none()).then_some(())?;
            (rkey & !0xff == w.rkey & !0xff).then_some(())?;
            let m = self.mrs.get(&mr)?;
            (!m.zombie && m.device == a.0 && m.pd == qp.pd).then_some(())?;
            m.access.contains(Access::MW_BIND).then_some(())?;
            (len > 0).then_some(())?;
            offset_within(m.iova, to_u64(m.len), addr, len)?;
            WINDOW_ACCESS.contains(access).then_some(())?;
            let writes = access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
            (!writes || m.access.contains(Access::LOCAL_WRITE)).then_some(())?;
            Some((mw, mr))
        })();
        let Some((mw, mr)) = checked else {
            return Outcome::Fail(WcStatus::MwBindErr);
        };
        if let Some(w) = self.mws.get_mut(&mw) {
            w.rkey = rkey;
            w.binding = Some(Binding {
                mr,
                qp: a,
                addr,
                len,
                access,
            });
        }
        if let Some(m) = self.mrs.get_mut(&mr) {
            m.bound_windows += 1;
        }
        Outcome::Done(
            wr.signaled
                .then(|| completion(a, wr.wr_id, WcStatus::Success, WcOpcode::BindMw)),
        )
    }

    /// `IBV_WR_LOCAL_INV` of a bound window's rkey.
    pub(super) fn local_inv(&mut self, a: QpKey, wr: Wr, rkey: u32) -> Outcome {
        let Some(pd) = self.qps.get(&a).map(|q| q.pd) else {
            return Outcome::Fail(WcStatus::Other(WC_LOC_QP_OP_ERR));
        };
        let found = self
            .mws
            .values_mut()
            .find(|w| w.device == a.0 && w.pd == pd && w.rkey == rkey && w.binding.is_some());
        let Some(binding) = found.and_then(|w| w.binding.take()) else {
            return Outcome::Fail(WcStatus::Other(WC_LOC_QP_OP_ERR));
        };
        if let Some(m) = self.mrs.get_mut(&binding.mr) {
            m.bound_windows = m.bound_windows.saturating_sub(1);
        }
        Outcome::Done(
            wr.signaled
                .then(|| completion(a, wr.wr_id, WcStatus::Success, WcOpcode::LocalInv)),
        )
    }
}

impl State {
    /// A SEND with invalidate of `rkey` arrived at `b`: invalidates the
    /// bound window with that rkey in `b`'s protection domain; whether
    /// there was one. As rxe does (`rxe_check_invalidate_mw` checks the
    /// window's state and type), not as the standard has it for type 2B
    /// (only through the QP that bound it): the laxer rule, so that tests
    /// face the worse fabric.
    pub(super) fn remote_inv(&mut self, b: QpKey, rkey: u32) -> bool {
        let Some(pd) = self.qps.get(&b).map(|q| q.pd) else {
            return false;
        };
        let found = self
            .mws
            .values_mut()
            .find(|w| w.device == b.0 && w.pd == pd && w.rkey == rkey && w.binding.is_some());
        let Some(binding) = found.and_then(|w| w.binding.take()) else {
            return false;
        };
        if let Some(m) = self.mrs.get_mut(&binding.mr) {
            m.bound_windows = m.bound_windows.saturating_sub(1);
        }
        true
    }
}

/// A protection domain.
pub(crate) struct FakePd {
    pub(super) me: Weak<FakePd>,
    pub(super) fabric: Arc<Fabric>,
    pub(super) ctx: Arc<FakeContext>,
    pub(super) id: u64,
}

impl FakePd {
    /// Index of the PD's device on the fabric.
    pub(crate) fn device(&self) -> usize {
        self.ctx.device
    }

    /// The device's name.
    pub(crate) fn device_name(&self) -> &str {
        &self.ctx.spec.name
    }

    fn register(&self, span: Span, iova: u64, len: usize, access: Access) -> Result<Arc<dyn Mr>> {
        let pd = self.me.upgrade().ok_or_else(gone)?;
        let mut st = self.fabric.state.lock();
        let max_mr = self.ctx.spec.limits.max_mr;
        if st.live_on(self.device()).2 >= to_usize(max_mr) {
            return Err(Error::Rdma(format!(
                "ibv_reg_mr({}) failed: Cannot allocate memory (max_mr {max_mr} reached)",
                self.device_name()
            )));
        }
        let Some(index) = st.new_key_index(self.device()) else {
            return Err(Error::Rdma("ibv_reg_mr failed: out of keys".to_owned()));
        };
        let id = st.new_id();
        let (lkey, rkey) = (index | LKEY_TAG, index | RKEY_TAG);
        st.mrs.insert(
            id,
            MrRec {
                device: self.device(),
                pd: self.id,
                lkey,
                rkey,
                iova,
                len,
                span,
                access,
                bound_windows: 0,
                zombie: false,
            },
        );
        if let Some(p) = st.pds.get_mut(&self.id) {
            p.children += 1;
        }
        drop(st);
        self.fabric.counters.created("mr");
        Ok(Arc::new(FakeMr {
            fabric: Arc::clone(&self.fabric),
            pd,
            id,
            lkey,
            rkey,
            iova,
            len,
            keep: Mutex::new(Vec::new()),
        }))
    }
}

impl Pd for FakePd {
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Arc<dyn Mr>> {
        self.fabric.check("ibv_reg_mr")?;
        let fail = |why: &str| {
            Error::Rdma(format!(
                "ibv_reg_mr({}, {addr:#x}+{len}) failed: {why}",
                self.device_name()
            ))
        };
        let Some(span) = Span::new(addr, len) else {
            return Err(fail("Invalid argument (empty, null or wrapping range)"));
        };
        check_mr_access(access).map_err(fail)?;
        let memory = self.fabric.device_memory.lock().clone();
        if memory.is_some_and(|m| m.is_device_memory(addr, len)) {
            return Err(fail(
                "Bad address (device memory needs peer-memory support or dma-buf)",
            ));
        }
        self.register(span, to_u64(addr), len, access)
    }

    fn reg_dmabuf_mr(
        &self,
        dmabuf: &OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<dyn Mr>> {
        self.fabric.check("ibv_reg_dmabuf_mr")?;
        let fail = |why: &str| {
            Error::Rdma(format!(
                "ibv_reg_dmabuf_mr({}, offset {offset}, {len} bytes) failed: {why}",
                self.device_name()
            ))
        };
        if !self.ctx.spec.supports_dmabuf {
            return Err(fail("Operation not supported"));
        }
        check_mr_access(access).map_err(fail)?;
        let memory = self.fabric.device_memory.lock().clone();
        let Some((memory, (base, size))) =
            memory.and_then(|m| m.dmabuf_range(dmabuf).map(|range| (m, range)))
        else {
            return Err(fail("Bad file descriptor (not a dma-buf of the fake GPU)"));
        };
        let start = usize::try_from(offset)
            .ok()
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= size));
        let span = start.and_then(|o| {
            let addr = base.checked_add(o)?;
            if memory.host_accessible() {
                Span::new(addr, len)
            } else {
                Span::device(addr, len)
            }
        });
        let Some(span) = span.filter(|_| iova.checked_add(to_u64(len)).is_some()) else {
            return Err(fail("Invalid argument (range outside the dma-buf)"));
        };
        self.register(span, iova, len, access)
    }

    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps) -> Result<Arc<dyn Qp>> {
        self.fabric.check("ibv_create_qp")?;
        self.create_qp_inner(cq, caps)
    }

    fn alloc_mw(&self) -> Result<Arc<dyn Mw>> {
        self.fabric.check("ibv_alloc_mw")?;
        if !self.ctx.spec.supports_mw {
            return Err(Error::Rdma(format!(
                "ibv_alloc_mw({}) failed: Operation not supported",
                self.device_name()
            )));
        }
        let pd = self.me.upgrade().ok_or_else(gone)?;
        let mut st = self.fabric.state.lock();
        let max_mw = self.ctx.spec.limits.max_mw;
        if st.live_on(self.device()).3 >= to_usize(max_mw) {
            return Err(Error::Rdma(format!(
                "ibv_alloc_mw({}) failed: Cannot allocate memory (max_mw {max_mw} reached)",
                self.device_name()
            )));
        }
        let Some(rkey) = st.new_key_index(self.device()) else {
            return Err(Error::Rdma("ibv_alloc_mw failed: out of keys".to_owned()));
        };
        let id = st.new_id();
        st.mws.insert(
            id,
            MwRec {
                device: self.device(),
                pd: self.id,
                rkey,
                binding: None,
            },
        );
        if let Some(p) = st.pds.get_mut(&self.id) {
            p.children += 1;
        }
        drop(st);
        self.fabric.counters.created("mw");
        Ok(Arc::new(FakeMw {
            fabric: Arc::clone(&self.fabric),
            _pd: pd,
            id,
            rkey,
            carried: AtomicU32::new(rkey),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `ibv_reg_mr(3)`: remote write or atomic access needs local write.
fn check_mr_access(access: Access) -> std::result::Result<(), &'static str> {
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        && !access.contains(Access::LOCAL_WRITE)
    {
        Err("Invalid argument (REMOTE_WRITE needs LOCAL_WRITE)")
    } else {
        Ok(())
    }
}

impl Drop for FakePd {
    fn drop(&mut self) {
        let mut st = self.fabric.state.lock();
        let children = st.pds.get(&self.id).map_or(0, |p| p.children);
        if children > 0 {
            // ibv_dealloc_pd fails with EBUSY: count it and leak.
            drop(st);
            self.fabric.destroy_failed(format_args!(
                "ibv_dealloc_pd on {} failed: Device or resource busy ({children} live MRs, \
                 MWs or QPs)",
                self.ctx.spec.name
            ));
            return;
        }
        st.pds.remove(&self.id);
        drop(st);
        self.fabric.counters.destroyed("pd");
    }
}

/// A memory region.
pub(super) struct FakeMr {
    pub(super) fabric: Arc<Fabric>,
    pd: Arc<FakePd>,
    pub(super) id: u64,
    lkey: u32,
    rkey: u32,
    iova: u64,
    len: usize,
    /// Dropped after the deregistration, leaked if it fails.
    keep: Mutex<Vec<Box<dyn Any + Send + Sync>>>,
}

impl Mr for FakeMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn addr(&self) -> u64 {
        self.iova
    }

    fn len(&self) -> usize {
        self.len
    }

    fn keep_until_deregistered(&self, memory: Box<dyn Any + Send + Sync>) {
        self.keep.lock().push(memory);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        let kept = std::mem::take(&mut *self.keep.lock());
        let mut st = self.fabric.state.lock();
        let windows = st.mrs.get(&self.id).map_or(0, |m| m.bound_windows);
        if windows > 0 || st.fail_deregistrations {
            std::mem::forget(kept);
            // rxe_dereg_mr refuses while type-2 windows are bound (IBA
            // 10.6.7.2.6): the registration leaks, and stays usable.
            if let Some(m) = st.mrs.get_mut(&self.id) {
                m.zombie = true;
            }
            drop(st);
            self.fabric.destroy_failed(format_args!(
                "ibv_dereg_mr on {} failed: Invalid argument ({windows} memory windows still \
                 bound, or failure asked for)",
                self.pd.device_name()
            ));
            return;
        }
        st.mrs.remove(&self.id);
        if let Some(p) = st.pds.get_mut(&self.pd.id) {
            p.children = p.children.saturating_sub(1);
        }
        drop(st);
        self.fabric.counters.destroyed("mr");
    }
}

/// A type-2 memory window.
pub(super) struct FakeMw {
    pub(super) fabric: Arc<Fabric>,
    _pd: Arc<FakePd>,
    pub(super) id: u64,
    rkey: u32,
    /// What `ibv_mw.rkey` holds: the allocation's rkey, then that of the
    /// last bind posted (refused or not), carried by the next bind.
    pub(super) carried: AtomicU32,
}

impl Mw for FakeMw {
    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeMw {
    fn drop(&mut self) {
        let mut st = self.fabric.state.lock();
        if let Some(w) = st.mws.remove(&self.id) {
            if let Some(m) = w.binding.and_then(|b| st.mrs.get_mut(&b.mr)) {
                m.bound_windows = m.bound_windows.saturating_sub(1);
            }
            if let Some(p) = st.pds.get_mut(&w.pd) {
                p.children = p.children.saturating_sub(1);
            }
        }
        drop(st);
        self.fabric.counters.destroyed("mw");
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::support::*;
    use super::super::{DeviceMemory, DeviceSpec};
    use super::*;
    use hipobj::platform::{next_rkey, QpState, SendOp, SendWr};

    /// Stricter than rxe, which checks only the region's bounds: a window
    /// grants nothing outside its own range.
    #[test]
    fn a_window_grants_only_its_range() {
        let (_f, mut a, b) = pair();
        pattern(&mut a.buf[..16], 10);
        connect(&a, &b, Link::default());
        let mw = b.pd.alloc_mw().expect("mw");
        let rkey = next_rkey(mw.rkey());
        let bind = SendWr {
            wr_id: 20,
            op: SendOp::BindMw {
                mw: Arc::clone(&mw),
                rkey,
                mr: Arc::clone(&b.mr),
                addr: b.addr(4096),
                len: 8192,
                access: Access::REMOTE_WRITE,
            },
            sge: None,
            signaled: true,
        };
        b.qp.post_send(&[bind]).expect("bind");
        assert_eq!(statuses(&b.poll()), [WcStatus::Success]);
        a.qp.post_send(&[write(&a, 0, 16, b.addr(12288 - 8), rkey)])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemAccessErr]);
        assert!(b.buf[12280..12296].iter().all(|&x| x == 0));
        assert_eq!(b.state(), QpState::Err);
    }

    /// The fake's exact statuses of failed local operations (rxe reports
    /// them as flushed).
    #[test]
    fn failed_binds_and_invalidates_complete_with_their_own_status() {
        let (_f, a, b) = pair();
        connect(&a, &b, Link::default());
        let mw = b.pd.alloc_mw().expect("mw");
        let bind = |rkey| SendWr {
            wr_id: 20,
            op: SendOp::BindMw {
                mw: Arc::clone(&mw),
                rkey,
                mr: Arc::clone(&b.mr),
                addr: b.addr(0),
                len: 4096,
                access: Access::REMOTE_WRITE,
            },
            sge: None,
            signaled: true,
        };
        let first = next_rkey(mw.rkey());
        b.qp.post_send(&[bind(first)]).expect("bind");
        b.qp.post_send(&[bind(next_rkey(first))]).expect("rebind");
        assert_eq!(
            statuses(&b.poll()),
            [WcStatus::Success, WcStatus::MwBindErr]
        );
        reconnect(&a, &b, Link::default());
        let inv = SendWr {
            wr_id: 21,
            op: SendOp::LocalInv {
                rkey: next_rkey(first),
            },
            sge: None,
            signaled: true,
        };
        b.qp.post_send(&[inv]).expect("post");
        assert_eq!(statuses(&b.poll()), [WcStatus::Other(WC_LOC_QP_OP_ERR)]);
        assert_eq!(b.state(), QpState::Err);
    }

    /// Stricter than rxe, whose MR rkey is its lkey: the fake's differ, so
    /// a key used in the other's place is caught.
    #[test]
    fn an_lkey_is_no_rkey_and_an_rkey_no_lkey() {
        let (_f, a, b) = pair();
        let link = Link::default();
        connect(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 16, b.addr(0), b.mr.lkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemAccessErr]);
        assert_eq!(b.state(), QpState::Err);
        reconnect(&a, &b, link);
        let mut bad = write(&a, 0, 16, b.addr(0), b.mr.rkey());
        bad.sge = Some(Sge {
            lkey: a.mr.rkey(),
            ..a.sge(0, 16).expect("sge")
        });
        a.qp.post_send(&[bad]).expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::LocProtErr]);
        assert_eq!(b.state(), QpState::Rts, "local errors stay local");
    }

    #[test]
    fn device_memory_registers_only_through_dmabuf() {
        struct Gpu {
            addr: usize,
            len: usize,
            fd: i32,
        }
        impl DeviceMemory for Gpu {
            fn is_device_memory(&self, addr: usize, len: usize) -> bool {
                addr < self.addr + self.len && self.addr < addr + len
            }
            fn dmabuf_range(&self, fd: &OwnedFd) -> Option<(usize, usize)> {
                use std::os::fd::AsRawFd;
                (fd.as_raw_fd() == self.fd).then_some((self.addr, self.len))
            }
        }
        let (fabric, mut a, b) = pair();
        pattern(&mut a.buf[..4096], 12);
        let mut vram = vec![0u8; 1 << 20];
        let dmabuf = OwnedFd::from(std::fs::File::open("/dev/null").expect("fd"));
        let other = OwnedFd::from(std::fs::File::open("/dev/null").expect("fd"));
        use std::os::fd::AsRawFd;
        fabric.set_device_memory(Arc::new(Gpu {
            addr: vram.as_mut_ptr() as usize,
            len: vram.len(),
            fd: dmabuf.as_raw_fd(),
        }));
        let plain = b.pd.reg_mr(vram.as_mut_ptr() as usize + 4096, 4096, ALL);
        assert!(err_of(plain).to_string().contains("Bad address"));
        let iova = 0x7000_0000_0000;
        assert!(
            b.pd.reg_dmabuf_mr(&other, 0, 4096, iova, ALL).is_err(),
            "unknown fd"
        );
        assert!(
            b.pd.reg_dmabuf_mr(&dmabuf, (1 << 20) - 16, 4096, iova, ALL)
                .is_err(),
            "past the end"
        );
        let mr =
            b.pd.reg_dmabuf_mr(&dmabuf, 8192, 4096, iova, ALL)
                .expect("dmabuf mr");
        assert_eq!((mr.addr(), mr.len()), (iova, 4096));
        connect(&a, &b, Link::default());
        a.qp.post_send(&[write(&a, 0, 4096, iova, mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success]);
        drop(mr);
        assert_eq!(
            vram[8192..12288],
            a.buf[..4096],
            "landed at the dma-buf offset"
        );
        // A device without dma-buf support.
        fabric
            .add_device(DeviceSpec::new("rxe0", Ipv4Addr::new(192, 0, 2, 9)))
            .expect("device");
        let rxe = End::new(&fabric, "rxe0");
        let err = err_of(rxe.pd.reg_dmabuf_mr(&dmabuf, 0, 4096, iova, ALL));
        assert!(err.to_string().contains("Operation not supported"), "{err}");
    }

    #[test]
    fn destroying_an_mr_with_a_bound_window_fails_and_leaks() {
        let (fabric, a, b) = pair();
        connect(&a, &b, Link::default());
        let counters = Arc::clone(fabric.counters());
        let mut extra = vec![0u8; 4096];
        let mr =
            b.pd.reg_mr(extra.as_mut_ptr() as usize, 4096, ALL)
                .expect("mr");
        let mw = b.pd.alloc_mw().expect("mw");
        let rkey = next_rkey(mw.rkey());
        let bind = SendWr {
            wr_id: 1,
            op: SendOp::BindMw {
                mw: Arc::clone(&mw),
                rkey,
                mr: Arc::clone(&mr),
                addr: mr.addr(),
                len: 4096,
                access: Access::REMOTE_WRITE,
            },
            sge: None,
            signaled: false,
        };
        b.qp.post_send(&[bind]).expect("bind");
        drop(mr);
        assert_eq!(counters.live("destroy_failed"), 1);
        assert_eq!(counters.live("mr"), 3, "leaked");
        // The leaked registration's memory is never touched again.
        a.qp.post_send(&[write(&a, 0, 16, 0, rkey)]).expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemAccessErr]);
        drop(extra);
        drop((mw, a, b));
        // The leaked MR keeps its PD alive: that destroy fails too.
        assert_eq!(counters.live("destroy_failed"), 2);
        assert_eq!(
            counters.snapshot(),
            [("destroy_failed", 2), ("mr", 1), ("pd", 1)]
        );
    }
}
