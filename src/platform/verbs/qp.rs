//! A Reliable Connection queue pair.

use std::any::Any;
use std::ptr;
use std::sync::Arc;

use super::context::{MemoryRegion, MemoryWindow, ProtectionDomain};
use super::convert::{self, zeroed, BindTarget};
use super::inline;
use super::sys::{ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_send_wr, ibv_sge};
use super::{check_rc, destroy_failed, rc_cause, rc_error};
use crate::error::{Error, Result};
use crate::platform::{Context, Cq, Mr, Mw, Qp, QpAttr, QpState, RecvWr, SendOp, SendWr};

/// An RC QP (`struct ibv_qp`), destroyed on drop.
///
/// Field order: `qp` is destroyed by `Drop::drop`; then `_cq` and `pd` are
/// dropped, both of which must outlive the QP (and do, in either order).
pub struct QueuePair {
    qp: *mut ibv_qp,
    qp_num: u32,
    /// `QP n on device`, for messages.
    name: String,
    /// Both queues' CQ, kept alive while the QP is.
    _cq: Arc<dyn Cq>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: `qp` is used only through libibverbs calls, which are thread-safe
// on the same QP (posting from several threads, querying and modifying:
// "libibverbs thread safe level", RDMAmojo), and destroyed once, in `Drop`.
// `qp_num` is copied at creation.
unsafe impl Send for QueuePair {}
// SAFETY: as for `Send`.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Takes ownership of `qp`.
    ///
    /// # Safety
    ///
    /// `qp` was just created by `ibv_create_qp` in `pd` with `cq` (a
    /// [`super::CompletionQueue`]) for both queues, and nothing else
    /// destroys it.
    pub(super) unsafe fn from_raw(
        qp: *mut ibv_qp,
        pd: Arc<ProtectionDomain>,
        cq: Arc<dyn Cq>,
    ) -> QueuePair {
        // SAFETY: `qp` is live (caller); `qp_num` is set at creation and
        // never changes.
        let qp_num = unsafe { (*qp).qp_num };
        QueuePair {
            qp,
            qp_num,
            name: format!("QP {qp_num} on {}", pd.context().name()),
            _cq: cq,
            pd,
        }
    }

    /// The raw window and region a bind names: both must be this
    /// library's, and of this QP's protection domain.
    fn bind_target(&self, mw: &Arc<dyn Mw>, mr: &Arc<dyn Mr>) -> Result<BindTarget> {
        let same_pd = |pd: &ProtectionDomain| pd.raw() == self.pd.raw();
        let mw = mw
            .as_any()
            .downcast_ref::<MemoryWindow>()
            .filter(|w| same_pd(w.pd()));
        let mr = mr
            .as_any()
            .downcast_ref::<MemoryRegion>()
            .filter(|m| same_pd(m.pd()));
        match (mw, mr) {
            (Some(mw), Some(mr)) => Ok((mw.raw(), mr.raw())),
            _ => Err(Error::Rdma(format!(
                "ibv_post_send({}) failed: Invalid argument (a bind's window and region must be \
                 of the QP's protection domain)",
                self.name
            ))),
        }
    }
}

impl Qp for QueuePair {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn state(&self) -> Result<QpState> {
        let mut attr: ibv_qp_attr = zeroed();
        let mut init: ibv_qp_init_attr = zeroed();
        let bits = ibv_qp_attr_mask::IBV_QP_STATE;
        let mask = convert::flags_int(bits);
        // SAFETY: `qp` is live while `self` is; both out-structs are valid.
        let rc =
            unsafe { (self.pd.context().table().query_qp)(self.qp, &mut attr, mask, &mut init) };
        check_rc(format_args!("ibv_query_qp({})", self.name), rc)?;
        let queried = convert::qp_attr_from_ibv(&attr, bits)
            .map_err(|why| Error::Rdma(format!("ibv_query_qp({}): {why}", self.name)))?;
        queried
            .state
            .ok_or_else(|| Error::Internal("ibv_query_qp: no state in the mask".to_owned()))
    }

    fn modify(&self, attr: &QpAttr) -> Result<()> {
        let (mut raw, bits) = convert::qp_attr(attr);
        // SAFETY: `qp` is live; `raw` holds every attribute `bits` names.
        let rc = unsafe { (self.pd.context().table().modify_qp)(self.qp, &mut raw, bits) };
        if rc == 0 {
            return Ok(());
        }
        // The cause first (it may be errno), then the state for the message.
        let cause = rc_cause(rc);
        let cur = self.state().ok();
        let next = attr.state.or(cur);
        Err(Error::Rdma(format!(
            "ibv_modify_qp({}: {} -> {}, mask {}) failed: {cause}",
            self.name,
            convert::state_name(cur),
            convert::state_name(next),
            convert::describe_mask(attr.mask()),
        )))
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let mut sge: ibv_sge = wr.sge.map_or(
            ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            convert::sge,
        );
        let mut raw = convert::recv_wr(&wr, &mut sge);
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` is live; `raw` is one request (next NULL) whose entry,
        // if any, is `sge`, both alive for the call; `bad` is writable.
        let rc = unsafe { inline::post_recv(self.qp, &mut raw, &mut bad) };
        check_rc(format_args!("ibv_post_recv({})", self.name), rc)
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        // Two buffers that do not move once their pointers are taken: each
        // request's one entry, and the chained requests themselves.
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|w| {
                w.sge.map_or(
                    ibv_sge {
                        addr: 0,
                        length: 0,
                        lkey: 0,
                    },
                    convert::sge,
                )
            })
            .collect();
        let sge_base = sges.as_mut_ptr();
        let mut chain: Vec<ibv_send_wr> = Vec::with_capacity(wrs.len());
        let base = chain.as_mut_ptr();
        for (i, wr) in wrs.iter().enumerate() {
            let mut raw = convert::send_wr(wr, sge_base.wrapping_add(i), |mw, mr| {
                self.bind_target(mw, mr)
            })?;
            if i + 1 < wrs.len() {
                // Within the capacity reserved above: `chain` never
                // reallocates, so the address stays valid.
                raw.next = base.wrapping_add(i + 1);
            }
            chain.push(raw);
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: `qp` is live. `base` heads a chain of `wrs.len()` valid
        // requests in `chain`, each pointing at its entry in `sges`; both
        // vectors live until the end of this function and are not touched
        // while the provider reads them. Windows and regions of binds are
        // live: `wrs` holds `Arc`s of them. `bad` is writable.
        let rc = unsafe { inline::post_send(self.qp, base, &mut bad) };
        if rc == 0 {
            // A type-2 bind carries the window's current rkey
            // (`ibv_mw.rkey`) beside the new one, and providers check the
            // pair (rxe: rxe_bind_mw compares it with the window's key,
            // EINVAL otherwise). Libibverbs updates `ibv_mw.rkey` only for
            // `ibv_bind_mw` (type 1); for a posted bind the caller does it,
            // once the bind is queued. A bind that then fails leaves the
            // window to be deallocated and replaced (core/conn.rs).
            for wr in wrs {
                if let SendOp::BindMw { mw, rkey, .. } = &wr.op {
                    if let Some(window) = mw.as_any().downcast_ref::<super::MemoryWindow>() {
                        // SAFETY: the window is live (`wrs` holds an `Arc`
                        // of it). The plain store does not race: libibverbs
                        // writes `ibv_mw.rkey` only in `ibv_bind_mw` (type
                        // 1, never called here), and every post of a bind
                        // of one window comes from one thread, the
                        // connection driver that owns the window
                        // (core/driver.rs), so no two stores or a store and
                        // a provider's read of this field overlap.
                        unsafe { (*window.raw()).rkey = *rkey };
                    }
                }
            }
            return Ok(());
        }
        let at = (0..wrs.len())
            .find(|&i| base.wrapping_add(i) == bad)
            .map_or_else(String::new, |i| {
                format!(" at work request {i} of {} ({:?})", wrs.len(), wrs[i].op)
            });
        // `sges` and `chain` were alive for the call; they are dropped here.
        Err(rc_error(
            format_args!("ibv_post_send({}){at}", self.name),
            rc,
        ))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: `qp` is live and this is its last reference. Destroying a
        // QP discards its outstanding work without completions.
        let rc = unsafe { (self.pd.context().table().destroy_qp)(self.qp) };
        if rc != 0 {
            destroy_failed(format_args!("ibv_destroy_qp({})", self.name), rc);
        }
    }
}
