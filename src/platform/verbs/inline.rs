//! The `static inline` verbs of rdma-core 44's `<infiniband/verbs.h>`, which
//! `dlopen` cannot find: each calls the provider's function pointer in the
//! context's ops table (`ctx->ops`) with the arguments the header passes.
//!
//! | verbs.h                  | body                                          |
//! |--------------------------|-----------------------------------------------|
//! | `ibv_post_send`          | `qp->context->ops.post_send(qp, wr, bad_wr)`  |
//! | `ibv_post_recv`          | `qp->context->ops.post_recv(qp, wr, bad_wr)`  |
//! | `ibv_poll_cq`            | `cq->context->ops.poll_cq(cq, n, wc)`         |
//! | `ibv_req_notify_cq`      | `cq->context->ops.req_notify_cq(cq, solicited_only)` |
//! | `ibv_alloc_mw`           | `EOPNOTSUPP` if `ops.alloc_mw` is NULL, else `pd->context->ops.alloc_mw(pd, type)` |
//! | `ibv_dealloc_mw`         | `mw->context->ops.dealloc_mw(mw)`             |
//!
//! A type-2 window is bound with an `IBV_WR_BIND_MW` work request through
//! [`post_send`]; the header's `ibv_bind_mw` is for type 1 only.
//!
//! One difference: the header calls the other pointers without a check (a
//! NULL one crashes); here a NULL pointer fails with `EOPNOTSUPP`, as the
//! header's own `ibv_alloc_mw` does.
//!
//! The ops table is filled by libibverbs and the provider when the context
//! is opened and never written again, so reading it from any thread is not a
//! race.

use std::ffi::c_int;
use std::ptr::NonNull;

use super::sys::{ibv_context, ibv_cq, ibv_mw, ibv_mw_type, ibv_pd, ibv_qp, ibv_recv_wr};
use super::sys::{ibv_send_wr, ibv_wc};

/// `ibv_post_send`: returns 0 or an errno, and on failure points `*bad_wr`
/// at the first request not posted.
///
/// # Safety
///
/// `qp` is a live QP (not yet destroyed) of an open context. `wr` is a chain
/// of valid requests (each `next` valid or NULL, each `sg_list` valid for
/// `num_sge` entries, each window and region live) that outlives the call,
/// and `bad_wr` is valid for a write.
pub(super) unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller guarantees `qp` is live, so `qp->context` is the
    // open context it was created in, whose ops table is never rewritten.
    let op = unsafe { (*(*qp).context).ops.post_send };
    match op {
        // SAFETY: the provider's post_send with verbs.h's arguments; their
        // validity is the caller's contract.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv`: returns 0 or an errno, and on failure points `*bad_wr`
/// at the first request not posted.
///
/// # Safety
///
/// `qp` is a live QP of an open context; `wr` is a chain of valid requests
/// (each `next` valid or NULL, each `sg_list` valid for `num_sge` entries)
/// that outlives the call; `bad_wr` is valid for a write.
pub(super) unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is live (caller), so its context and ops table are.
    let op = unsafe { (*(*qp).context).ops.post_recv };
    match op {
        // SAFETY: the provider's post_recv with verbs.h's arguments, valid
        // per the caller's contract.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`: the number of completions written to `wc` (at most
/// `num_entries`), or a negative value on failure.
///
/// # Safety
///
/// `cq` is a live CQ of an open context and `wc` is valid for writing
/// `num_entries` entries.
pub(super) unsafe fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live (caller), so its context and ops table are.
    let op = unsafe { (*(*cq).context).ops.poll_cq };
    match op {
        // SAFETY: the provider's poll_cq; `wc` holds `num_entries` entries
        // (caller).
        Some(f) => unsafe { f(cq, num_entries, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_req_notify_cq`: arms the CQ so that its next completion (or next
/// solicited one) produces an event on its channel. Returns 0 or an errno.
///
/// # Safety
///
/// `cq` is a live CQ of an open context.
pub(super) unsafe fn req_notify_cq(cq: *mut ibv_cq, solicited_only: bool) -> c_int {
    // SAFETY: `cq` is live (caller), so its context and ops table are.
    let op = unsafe { (*(*cq).context).ops.req_notify_cq };
    match op {
        // SAFETY: the provider's req_notify_cq on a live CQ.
        Some(f) => unsafe { f(cq, c_int::from(solicited_only)) },
        None => libc::EOPNOTSUPP,
    }
}

/// Whether the context's provider implements memory windows at all
/// (`ops.alloc_mw` is set), the test `ibv_alloc_mw` starts with.
///
/// # Safety
///
/// `ctx` is an open context.
pub(super) unsafe fn has_alloc_mw(ctx: *mut ibv_context) -> bool {
    // SAFETY: `ctx` is open (caller); its ops table is never rewritten.
    unsafe { (*ctx).ops.alloc_mw.is_some() }
}

/// `ibv_alloc_mw`: the new window, or the errno (`EOPNOTSUPP` when the
/// provider has no windows, as verbs.h sets it).
///
/// # Safety
///
/// `pd` is a live PD of an open context.
pub(super) unsafe fn alloc_mw(
    pd: *mut ibv_pd,
    kind: ibv_mw_type::Type,
) -> Result<NonNull<ibv_mw>, c_int> {
    // SAFETY: `pd` is live (caller), so its context and ops table are.
    let op = unsafe { (*(*pd).context).ops.alloc_mw };
    let Some(f) = op else {
        return Err(libc::EOPNOTSUPP);
    };
    // SAFETY: the provider's alloc_mw on a live PD.
    let mw = unsafe { f(pd, kind) };
    // Read errno at once, before anything else can overwrite it.
    NonNull::new(mw).ok_or_else(|| {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    })
}

/// `ibv_dealloc_mw`: returns 0 or an errno.
///
/// # Safety
///
/// `mw` is a live window from [`alloc_mw`], not used again after a success.
pub(super) unsafe fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: `mw` is live (caller), so `mw->context` is its open context.
    let op = unsafe { (*(*mw).context).ops.dealloc_mw };
    match op {
        // SAFETY: the provider's dealloc_mw on a live window it allocated.
        Some(f) => unsafe { f(mw) },
        None => libc::EOPNOTSUPP,
    }
}
