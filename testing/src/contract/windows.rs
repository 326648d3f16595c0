//! Contract checks of type-2 memory windows (`Mw`, bound and invalidated
//! by work requests on a QP in RTS).

use std::sync::Arc;

use super::support::{
    connect, expect_local_failure, pair, pattern, reaches_err, read, reconnect, write, End, Link,
};
use super::verbs::WC_LOC_QP_OP_ERR;
use super::Env;
use hipobj::platform::{next_rkey, Access, Mr, Mw, SendOp, SendWr, WcOpcode, WcStatus};

/// A signaled bind of `mw` to `[addr, addr + len)` of `mr` with `rkey`.
fn bind(
    mw: &Arc<dyn Mw>,
    mr: &Arc<dyn Mr>,
    rkey: u32,
    addr: u64,
    len: u64,
    access: Access,
) -> SendWr {
    SendWr {
        wr_id: 20,
        op: SendOp::BindMw {
            mw: Arc::clone(mw),
            rkey,
            mr: Arc::clone(mr),
            addr,
            len,
            access,
        },
        sge: None,
        signaled: true,
    }
}

/// A signaled local invalidate of `rkey`.
fn inv(rkey: u32) -> SendWr {
    SendWr {
        wr_id: 21,
        op: SendOp::LocalInv { rkey },
        sge: None,
        signaled: true,
    }
}

/// A type-2 window of `end`'s PD; fails loudly on a device without them.
fn window(end: &End) -> Arc<dyn Mw> {
    assert!(end.ctx.supports_mw(), "the device has no memory windows");
    end.pd
        .alloc_mw()
        .unwrap_or_else(|e| panic!("ibv_alloc_mw: {e}"))
}

/// Posts a bind through `end`'s QP and expects it to succeed.
fn expect_bind(end: &End, wr: SendWr, what: &str) {
    end.post(&[wr]);
    let done = end.next(what);
    assert_eq!(
        (done.status, done.opcode),
        (WcStatus::Success, WcOpcode::BindMw),
        "{what}"
    );
}

/// Posts a bind through `end`'s QP and expects the device to refuse it
/// (which moves the QP to ERR).
fn expect_refused_bind(end: &End, wr: SendWr, what: &str) {
    end.post(&[wr]);
    expect_local_failure(end, WcStatus::MwBindErr, what);
}

/// A bound window grants its access: WRITEs inside land, a READ it does
/// not grant fails with REM_ACCESS_ERR. A bound type-2 window cannot be
/// bound again; once invalidated, its rkey is refused. Invalidating a key
/// that names no bound window fails. (That a window also limits the range,
/// inside its region, is the fakes' rule only: rxe checks the region's
/// bounds.)
pub fn memory_window_bind_and_invalidate(env: &Env) {
    let (mut a, b) = pair(env);
    pattern(&mut a.buf[..8192], 10);
    let link = Link::default();
    connect(env, &a, &b, link);
    let mw = window(&b);
    let first = next_rkey(mw.rkey());
    let range = (b.addr(4096), 8192);
    expect_bind(
        &b,
        bind(&mw, &b.mr, first, range.0, range.1, Access::REMOTE_WRITE),
        "a bind",
    );
    a.post(&[write(&a, 1, 0, 8192, b.addr(4096), first)]);
    assert_eq!(a.next("a WRITE inside").status, WcStatus::Success);
    assert_eq!(b.buf[4096..12288], a.buf[..8192], "it landed");
    b.quiet("the window's side of a WRITE");
    a.post(&[read(&a, 3, 0, 16, b.addr(4096), first)]);
    assert_eq!(
        a.next("a READ through a write-only window").status,
        WcStatus::RemAccessErr
    );
    reaches_err(&b, "a READ through a write-only window");
    reconnect(env, &a, &b, link);
    // A bound type-2 window must be invalidated before it is bound again
    // (o10-37.2.30).
    expect_refused_bind(
        &b,
        bind(
            &mw,
            &b.mr,
            next_rkey(first),
            range.0,
            range.1,
            Access::REMOTE_WRITE,
        ),
        "binding a bound window",
    );
    reconnect(env, &a, &b, link);
    b.post(&[inv(first)]);
    let done = b.next("invalidating the window");
    assert_eq!(
        (done.status, done.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    a.post(&[write(&a, 4, 0, 16, b.addr(4096), first)]);
    assert_eq!(
        a.next("a WRITE with an invalidated rkey").status,
        WcStatus::RemAccessErr
    );
    reaches_err(&b, "a WRITE with an invalidated rkey");
    reconnect(env, &a, &b, link);
    // After a refused bind the window's key is stale (see
    // `a_posted_bind_carries_the_windows_current_rkey`): a fresh window,
    // for READ and WRITE.
    let fresh = window(&b);
    let key = next_rkey(fresh.rkey());
    expect_bind(
        &b,
        bind(
            &fresh,
            &b.mr,
            key,
            range.0,
            range.1,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        ),
        "binding a fresh window for READ and WRITE",
    );
    a.post(&[read(&a, 5, 16384, 16, b.addr(4096), key)]);
    assert_eq!(a.next("a READ it grants").status, WcStatus::Success);
    assert_eq!(a.buf[16384..16400], b.buf[4096..4112]);
    // A key of the window's index that is not its current one.
    b.post(&[inv(next_rkey(key))]);
    expect_local_failure(
        &b,
        WcStatus::Other(WC_LOC_QP_OP_ERR),
        "invalidating a key no window is bound with",
    );
}

/// A SEND with invalidate of a bound type-2 window in the receiving QP's
/// PD invalidates it before the receive completes: the receive says so
/// (`IBV_WC_WITH_INV`, the rkey, no immediate, the data placed), a WRITE
/// with that rkey is refused afterwards, and the window binds again with
/// its next key. An rkey that names no bound window fails the receive
/// (rxe: class J, a remote invalid request) and the receiving QP. What
/// protocol version 4's final message rests on.
pub fn a_send_with_invalidate_revokes_the_receivers_window(env: &Env) {
    let (mut a, b) = pair(env);
    pattern(&mut a.buf[..64], 12);
    let link = Link::default();
    connect(env, &a, &b, link);
    let mw = window(&b);
    let rkey = next_rkey(mw.rkey());
    let range = (b.addr(4096), 4096);
    expect_bind(
        &b,
        bind(&mw, &b.mr, rkey, range.0, range.1, Access::REMOTE_WRITE),
        "a bind",
    );
    a.post(&[write(&a, 1, 0, 16, range.0, rkey)]);
    assert_eq!(
        a.next("a WRITE through the window").status,
        WcStatus::Success
    );
    let invalidating = |wr_id: u64, rkey: u32| SendWr {
        wr_id,
        op: SendOp::SendInv { rkey },
        sge: a.sge(32, 4),
        signaled: true,
    };
    b.recv(5, b.sge(0, 64));
    a.post(&[invalidating(9, rkey)]);
    let got = b.next("the receive of a SEND with invalidate");
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len),
        (5, WcStatus::Success, WcOpcode::Recv, 4)
    );
    assert_eq!((got.imm, got.invalidated), (None, Some(rkey)));
    assert_eq!(b.buf[..4], a.buf[32..36], "its data landed");
    let sent = a.next("the SEND with invalidate");
    assert_eq!(
        (sent.status, sent.opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
    a.post(&[write(&a, 2, 0, 16, range.0, rkey)]);
    assert_eq!(
        a.next("a WRITE with the invalidated rkey").status,
        WcStatus::RemAccessErr
    );
    reaches_err(&b, "a WRITE with the invalidated rkey");
    reconnect(env, &a, &b, link);
    let again = next_rkey(rkey);
    expect_bind(
        &b,
        bind(&mw, &b.mr, again, range.0, range.1, Access::REMOTE_WRITE),
        "binding the window again after a remote invalidation",
    );
    a.post(&[write(&a, 3, 0, 16, range.0, again)]);
    assert_eq!(
        a.next("a WRITE through the window bound again").status,
        WcStatus::Success
    );
    // A key of the window's index that is not its bound one.
    b.recv(6, b.sge(0, 64));
    a.post(&[invalidating(10, next_rkey(again))]);
    let failed = b.next("the receive of a SEND that invalidates no window");
    assert_eq!(failed.wr_id, 6);
    assert_ne!(failed.status, WcStatus::Success, "{failed:?}");
    reaches_err(&b, "a SEND that invalidates no window");
}

/// A type-2 window is usable only through the QP that bound it: a peer
/// connected to another QP of the same PD is refused.
pub fn a_window_is_usable_only_through_the_qp_that_bound_it(env: &Env) {
    let (a, b) = pair(env);
    let link = Link::default();
    connect(env, &a, &b, link);
    // A second QP of B's PD, connected to a third end, binds the window.
    let mut other = End::new(env);
    let b2 = b.sibling(env);
    connect(env, &other, &b2, link);
    let mw = window(&b);
    let rkey = next_rkey(mw.rkey());
    expect_bind(
        &b2,
        bind(&mw, &b.mr, rkey, b.addr(0), 4096, Access::REMOTE_WRITE),
        "a bind through the second QP",
    );
    pattern(&mut other.buf[..16], 1);
    other.post(&[write(&other, 1, 0, 16, b.addr(0), rkey)]);
    assert_eq!(
        other
            .next("a WRITE through the QP that bound the window")
            .status,
        WcStatus::Success
    );
    assert_eq!(b.buf[..16], other.buf[..16]);
    a.post(&[write(&a, 2, 0, 16, b.addr(0), rkey)]);
    assert_eq!(
        a.next("a WRITE through another QP").status,
        WcStatus::RemAccessErr
    );
}

/// A posted type-2 bind carries the window's current rkey beside the new
/// one, and the device checks the pair (rxe: `rxe_bind_mw`): binding,
/// invalidating and binding again with the next key works, and each key
/// grants access only while it is the bound one. The carried key follows
/// every bind posted, so after a bind the device refused the window's key
/// is stale and every later bind of it fails: such a window is replaced.
pub fn a_posted_bind_carries_the_windows_current_rkey(env: &Env) {
    let (mut a, b) = pair(env);
    let link = Link::default();
    connect(env, &a, &b, link);
    let mw = window(&b);
    let range = (b.addr(0), 4096);
    let bind_with = |rkey: u32| bind(&mw, &b.mr, rkey, range.0, range.1, Access::REMOTE_WRITE);
    let mut key = mw.rkey();
    for round in 0..3u8 {
        let previous = key;
        key = next_rkey(key);
        expect_bind(&b, bind_with(key), "a bind");
        pattern(&mut a.buf[..64], round);
        a.post(&[write(&a, 1, 0, 64, b.addr(0), key)]);
        assert_eq!(
            a.next("a WRITE with the bound key").status,
            WcStatus::Success,
            "round {round}"
        );
        assert_eq!(b.buf[..64], a.buf[..64], "round {round}");
        if round > 0 {
            a.post(&[write(&a, 2, 0, 64, b.addr(0), previous)]);
            assert_eq!(
                a.next("a WRITE with the previous key").status,
                WcStatus::RemAccessErr,
                "round {round}"
            );
            reaches_err(&b, "a WRITE with the previous key");
            reconnect(env, &a, &b, link);
        }
        b.post(&[inv(key)]);
        assert_eq!(
            b.next("invalidating the bound key").status,
            WcStatus::Success
        );
    }
    // A refused bind (the window is bound) still counts as posted.
    expect_bind(&b, bind_with(next_rkey(key)), "a bind");
    expect_refused_bind(
        &b,
        bind_with(next_rkey(next_rkey(key))),
        "binding a bound window",
    );
    reconnect(env, &a, &b, link);
    b.post(&[inv(next_rkey(key))]);
    assert_eq!(
        b.next("invalidating the window after the refused bind")
            .status,
        WcStatus::Success
    );
    expect_refused_bind(
        &b,
        bind_with(next_rkey(next_rkey(next_rkey(key)))),
        "binding a window whose carried key went stale",
    );
}

/// A region registered without remote access (`LOCAL_WRITE | MW_BIND`,
/// as the library registers every buffer where windows exist) is reached
/// by no rkey, even through a QP whose access flags allow READ and WRITE;
/// a window over it grants exactly the window's access, and an
/// invalidated window, bound again after its QP went through RESET, works
/// again (the library keeps an unbound window across a reset).
pub fn a_region_without_remote_access_is_reached_only_through_a_window(env: &Env) {
    let (mut a, b) = pair(env);
    let link = Link::default();
    connect(env, &a, &b, link);
    let mut local = vec![0u8; 8192];
    let region =
        b.pd.reg_mr(
            local.as_mut_ptr() as usize,
            local.len(),
            Access::LOCAL_WRITE | Access::MW_BIND,
        )
        .unwrap_or_else(|e| panic!("ibv_reg_mr without remote access: {e}"));
    pattern(&mut a.buf[..64], 3);
    a.post(&[write(&a, 1, 0, 64, region.addr(), region.rkey())]);
    assert_eq!(
        a.next("a WRITE with the region's own rkey").status,
        WcStatus::RemAccessErr
    );
    reaches_err(&b, "a WRITE with the region's own rkey");
    reconnect(env, &a, &b, link);
    a.post(&[read(&a, 2, 0, 64, region.addr(), region.rkey())]);
    assert_eq!(
        a.next("a READ with the region's own rkey").status,
        WcStatus::RemAccessErr
    );
    reaches_err(&b, "a READ with the region's own rkey");
    reconnect(env, &a, &b, link);
    assert!(local.iter().all(|&x| x == 0), "nothing landed");
    let mw = window(&b);
    let key = next_rkey(mw.rkey());
    expect_bind(
        &b,
        bind(&mw, &region, key, region.addr(), 4096, Access::REMOTE_WRITE),
        "a window over the region",
    );
    a.post(&[write(&a, 3, 0, 64, region.addr(), key)]);
    assert_eq!(
        a.next("a WRITE through the window").status,
        WcStatus::Success
    );
    assert_eq!(local[..64], a.buf[..64]);
    b.post(&[inv(key)]);
    assert_eq!(b.next("invalidating it").status, WcStatus::Success);
    // The QP goes through RESET (a failed transfer's reset); the window,
    // unbound, is bound again with a fresh key.
    reconnect(env, &a, &b, link);
    let again = next_rkey(key);
    expect_bind(
        &b,
        bind(
            &mw,
            &region,
            again,
            region.addr(),
            4096,
            Access::REMOTE_READ,
        ),
        "binding the window again after a reset",
    );
    a.post(&[read(&a, 4, 4096, 64, region.addr(), again)]);
    assert_eq!(a.next("a READ through it").status, WcStatus::Success);
    assert_eq!(a.buf[4096..4160], local[..64]);
    b.post(&[inv(again)]);
    assert_eq!(b.next("invalidating it again").status, WcStatus::Success);
    drop(mw);
    drop(region);
}
