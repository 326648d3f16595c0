//! What the checks share: two ends on the environment's device, how they
//! are connected, work requests, and waiting for completions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Env, PATIENCE};
use hipobj::error::{Error, Result};
use hipobj::platform::{
    Access, AddressVector, Completion, Context, Cq, Gid, Mr, Mtu, Pd, Qp, QpAttr, QpCaps, QpState,
    RecvWr, SendOp, SendWr, Sge, WcStatus,
};

/// The PSN an end's send queue starts at (24 bits, deliberately not 0).
pub(super) const A_SQ_PSN: u32 = 0x00b9_d84f;
/// The PSN B's send queue starts at.
pub(super) const B_SQ_PSN: u32 = 0x0010_b6b5;
/// Bytes of registered memory per end.
pub(super) const BUF: usize = 256 * 1024;
/// Every access an end's region and QP grant.
pub(super) const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::MW_BIND);

/// When a wait for something that must happen gives up.
pub(super) fn deadline() -> Instant {
    Instant::now() + PATIENCE
}

/// The error of a call that must fail (for results whose value has no
/// `Debug`).
pub(super) fn err_of<T>(result: Result<T>, what: &str) -> Error {
    match result {
        Ok(_) => panic!("{what}: the call succeeded"),
        Err(e) => e,
    }
}

/// Fills `buf` with a pattern that depends on `seed`.
pub(super) fn pattern(buf: &mut [u8], seed: u8) {
    for (byte, n) in buf.iter_mut().zip((0..251u8).cycle()) {
        *byte = seed.wrapping_add(n);
    }
}

/// The statuses of `completions`, in order.
pub(super) fn statuses(completions: &[Completion]) -> Vec<WcStatus> {
    completions.iter().map(|c| c.status).collect()
}

/// The work request ids of `completions`, sorted (the order of completions
/// of different queues of one QP is not specified).
pub(super) fn sorted_ids(completions: &[Completion]) -> Vec<u64> {
    let mut ids: Vec<u64> = completions.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    ids
}

/// Queue depths of every QP of the checks.
pub(super) fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
    }
}

/// RESET -> INIT with `access`.
pub(super) fn init(env: &Env, access: Access) -> QpAttr {
    QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(env.port),
        access: Some(access),
        ..QpAttr::default()
    }
}

/// A transition to `state` with no other attribute.
pub(super) fn to(state: QpState) -> QpAttr {
    QpAttr {
        state: Some(state),
        ..QpAttr::default()
    }
}

/// One end: a context of its own, a PD, a CQ, a registered buffer and a QP
/// in INIT with every access. Field order: the QP goes first, the MR before
/// the buffer it covers.
pub(super) struct End {
    pub(super) qp: Arc<dyn Qp>,
    pub(super) mr: Arc<dyn Mr>,
    pub(super) buf: Vec<u8>,
    pub(super) cq: Arc<dyn Cq>,
    pub(super) pd: Arc<dyn Pd>,
    pub(super) ctx: Arc<dyn Context>,
    /// The environment's GID, as this end's context reads it.
    pub(super) gid: Gid,
    /// The path MTU of every connection: the port's, at most 1024.
    pub(super) mtu: Mtu,
    /// When a wait for something that must not happen stops watching.
    quiet: Duration,
}

impl End {
    /// A new end on the environment's device.
    pub(super) fn new(env: &Env) -> End {
        let ctx = env
            .verbs
            .open(&env.device)
            .unwrap_or_else(|e| panic!("opening {}: {e}", env.device));
        let port = ctx
            .query_port(env.port)
            .unwrap_or_else(|e| panic!("port {}: {e}", env.port));
        let gid = ctx
            .query_gid(env.port, u16::from(env.gid_index))
            .unwrap_or_else(|e| panic!("GID {}: {e}", env.gid_index));
        let pd = ctx.alloc_pd().unwrap_or_else(|e| panic!("PD: {e}"));
        let cq = ctx.create_cq(64).unwrap_or_else(|e| panic!("CQ: {e}"));
        let mut buf = vec![0u8; BUF];
        let mr = pd
            .reg_mr(buf.as_mut_ptr() as usize, BUF, ALL)
            .unwrap_or_else(|e| panic!("MR: {e}"));
        let qp = pd
            .create_qp(&cq, caps())
            .unwrap_or_else(|e| panic!("QP: {e}"));
        qp.modify(&init(env, ALL))
            .unwrap_or_else(|e| panic!("INIT: {e}"));
        End {
            qp,
            mr,
            buf,
            cq,
            pd,
            ctx,
            gid,
            mtu: port.active_mtu.min(Mtu::Mtu1024),
            quiet: env.quiet,
        }
    }

    /// Another QP (in INIT) on this end's context, PD, CQ and region; the
    /// region's memory stays this end's, so the sibling must go first.
    pub(super) fn sibling(&self, env: &Env) -> End {
        let qp = self
            .pd
            .create_qp(&self.cq, caps())
            .unwrap_or_else(|e| panic!("QP: {e}"));
        qp.modify(&init(env, ALL))
            .unwrap_or_else(|e| panic!("INIT: {e}"));
        End {
            qp,
            mr: Arc::clone(&self.mr),
            buf: Vec::new(),
            cq: Arc::clone(&self.cq),
            pd: Arc::clone(&self.pd),
            ctx: Arc::clone(&self.ctx),
            gid: self.gid,
            mtu: self.mtu,
            quiet: self.quiet,
        }
    }

    /// The address of `offset` in the buffer, as the NIC knows it.
    pub(super) fn addr(&self, offset: usize) -> u64 {
        self.mr.addr() + u64::try_from(offset).unwrap_or(u64::MAX)
    }

    /// A scatter/gather entry of `len` bytes at `offset` of the buffer.
    pub(super) fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        Some(Sge {
            addr: self.addr(offset),
            len,
            lkey: self.mr.lkey(),
        })
    }

    /// The QP's state.
    pub(super) fn state(&self) -> QpState {
        self.qp
            .state()
            .unwrap_or_else(|e| panic!("ibv_query_qp: {e}"))
    }

    /// Posts a receive.
    pub(super) fn recv(&self, wr_id: u64, sge: Option<Sge>) {
        self.qp
            .post_recv(RecvWr { wr_id, sge })
            .unwrap_or_else(|e| panic!("post_recv {wr_id}: {e}"));
    }

    /// Posts a chain of sends.
    pub(super) fn post(&self, wrs: &[SendWr]) {
        self.qp
            .post_send(wrs)
            .unwrap_or_else(|e| panic!("post_send {wrs:?}: {e}"));
    }

    /// Moves the QP to `state` (no other attribute).
    pub(super) fn to(&self, state: QpState) {
        self.qp
            .modify(&to(state))
            .unwrap_or_else(|e| panic!("to {state:?}: {e}"));
    }

    /// The next `n` completions of the CQ (see [`take`]).
    pub(super) fn take(&self, n: usize, what: &str) -> Vec<Completion> {
        take(&*self.cq, n, what)
    }

    /// The next completion (see [`take`]).
    pub(super) fn next(&self, what: &str) -> Completion {
        take(&*self.cq, 1, what)[0]
    }

    /// Fails if a completion arrives within the quiet time (see [`quiet`]).
    pub(super) fn quiet(&self, what: &str) {
        quiet(&*self.cq, self.quiet, what);
    }
}

/// The next `n` completions of `cq`, waiting up to [`PATIENCE`] for them;
/// fails naming `what` if they do not come, or more come at once.
pub(super) fn take(cq: &dyn Cq, n: usize, what: &str) -> Vec<Completion> {
    let until = deadline();
    let mut got = Vec::new();
    loop {
        got.extend(
            cq.poll(n + 1 - got.len())
                .unwrap_or_else(|e| panic!("{what}: poll: {e}")),
        );
        assert!(
            got.len() <= n,
            "{what}: expected {n} completions, got {got:?}"
        );
        if got.len() == n {
            return got;
        }
        let woken = cq
            .wait(until)
            .unwrap_or_else(|e| panic!("{what}: wait: {e}"));
        if !woken && Instant::now() >= until {
            panic!("{what}: expected {n} completions within {PATIENCE:?}, got {got:?}");
        }
    }
}

/// Fails if a completion arrives on `cq` within `time`.
pub(super) fn quiet(cq: &dyn Cq, time: Duration, what: &str) {
    let until = Instant::now() + time;
    loop {
        let got = cq.poll(16).unwrap_or_else(|e| panic!("{what}: poll: {e}"));
        assert!(got.is_empty(), "{what}: unexpected completions {got:?}");
        let woken = cq
            .wait(until)
            .unwrap_or_else(|e| panic!("{what}: wait: {e}"));
        if !woken && Instant::now() >= until {
            let got = cq.poll(16).unwrap_or_else(|e| panic!("{what}: poll: {e}"));
            assert!(got.is_empty(), "{what}: unexpected completions {got:?}");
            return;
        }
    }
}

/// Waits up to [`PATIENCE`] for `done()`; fails naming `what` otherwise.
/// For what real hardware does after the call that causes it (a QP's move
/// to ERR after its NAK, a CM event on another channel).
pub(super) fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = deadline();
    while !done() {
        assert!(Instant::now() < until, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Takes `end`'s next completion, of a work request that fails locally
/// with `status`, and waits for its QP to reach ERR. rxe (Linux 6.12)
/// completes such a request with WR_FLUSH_ERR instead, as it flushes the
/// queue it fails: either is accepted, never a success.
pub(super) fn expect_local_failure(end: &End, status: WcStatus, what: &str) {
    let done = end.next(what);
    assert!(
        done.status == status || done.status == WcStatus::WrFlushErr,
        "{what}: {:?}, expected {status:?} (or WR_FLUSH_ERR)",
        done.status
    );
    reaches_err(end, what);
}

/// Waits for `end`'s QP to reach ERR: a responder moves there after its
/// NAK, asynchronously on real hardware (and must be there before it is
/// reset, or its error could land after the reset).
pub(super) fn reaches_err(end: &End, what: &str) {
    eventually(&format!("{what}: the QP reaching ERR"), || {
        end.state() == QpState::Err
    });
}

/// How two ends are connected.
#[derive(Clone, Copy)]
pub(super) struct Link {
    /// Both ends' `retry_cnt`.
    pub(super) retry_cnt: u8,
    /// Both ends' `rnr_retry`.
    pub(super) rnr_retry: u8,
    /// A's `max_rd_atomic` (its READ initiator depth).
    pub(super) max_rd_atomic: u8,
    /// B's `max_dest_rd_atomic` (the READs it accepts).
    pub(super) max_dest_rd_atomic: u8,
}

impl Default for Link {
    fn default() -> Link {
        Link {
            retry_cnt: 6,
            rnr_retry: 7,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
        }
    }
}

/// The address vector toward `peer` on the environment's port and GID.
pub(super) fn av(env: &Env, peer: &End) -> AddressVector {
    AddressVector {
        dgid: peer.gid,
        sgid_index: env.gid_index,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        port: env.port,
        sl: 0,
        is_global: true,
        dlid: 0,
    }
}

/// INIT -> RTR aimed at `peer`'s QP.
pub(super) fn rtr(env: &Env, peer: &End, rq_psn: u32, max_dest_rd_atomic: u8) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rtr),
        av: Some(av(env, peer)),
        path_mtu: Some(peer.mtu),
        dest_qp_num: Some(peer.qp.qp_num()),
        rq_psn: Some(rq_psn),
        max_dest_rd_atomic: Some(max_dest_rd_atomic),
        min_rnr_timer: Some(1),
        ..QpAttr::default()
    }
}

/// RTR -> RTS.
pub(super) fn rts(sq_psn: u32, link: Link, max_rd_atomic: u8) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(sq_psn),
        timeout: Some(14),
        retry_cnt: Some(link.retry_cnt),
        rnr_retry: Some(link.rnr_retry),
        max_rd_atomic: Some(max_rd_atomic),
        ..QpAttr::default()
    }
}

/// A (INIT) to RTR and RTS aimed at B; B untouched.
pub(super) fn aim_a(env: &Env, a: &End, b: &End, link: Link) {
    a.qp.modify(&rtr(env, b, B_SQ_PSN, 4))
        .unwrap_or_else(|e| panic!("A to RTR: {e}"));
    a.qp.modify(&rts(A_SQ_PSN, link, link.max_rd_atomic))
        .unwrap_or_else(|e| panic!("A to RTS: {e}"));
}

/// B (INIT) to RTR and RTS aimed at A.
pub(super) fn aim_b(env: &Env, a: &End, b: &End, link: Link) {
    b.qp.modify(&rtr(env, a, A_SQ_PSN, link.max_dest_rd_atomic))
        .unwrap_or_else(|e| panic!("B to RTR: {e}"));
    b.qp.modify(&rts(B_SQ_PSN, link, 4))
        .unwrap_or_else(|e| panic!("B to RTS: {e}"));
}

/// Both ends (in INIT) connected to each other.
pub(super) fn connect(env: &Env, a: &End, b: &End, link: Link) {
    aim_a(env, a, b, link);
    aim_b(env, a, b, link);
}

/// Both ends back through RESET and INIT (their CQs drained), then
/// connected again: how a check goes on after an error moved one to ERR.
pub(super) fn reconnect(env: &Env, a: &End, b: &End, link: Link) {
    for end in [a, b] {
        // rxe finishes a failed request in its own kernel tasks, and one
        // may still move the QP to ERR just after the reset: seen once on
        // the lane at path MTU 1024, a WRITE with a bad rkey completed in
        // error twice (`make_send_cqe: non-flush error status = 10` in the
        // kernel log, 3 ms apart) and INIT found the QP in ERR again. Such a
        // QP is reset again, a few times at most.
        let mut late_errors = 0;
        loop {
            end.to(QpState::Reset);
            match end.qp.modify(&init(env, ALL)) {
                Ok(()) => break,
                Err(e) if late_errors < 5 && end.state() == QpState::Err => {
                    late_errors += 1;
                    eprintln!("reconnect: back in ERR after its reset ({e}); reset again");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("INIT: {e}"),
            }
        }
        // Flushes of the ERR state may still arrive on real hardware; they
        // belong to the work given up on.
        while !end
            .cq
            .poll(16)
            .unwrap_or_else(|e| panic!("poll: {e}"))
            .is_empty()
        {}
    }
    connect(env, a, b, link);
}

/// Two ends on the environment's device, in INIT.
pub(super) fn pair(env: &Env) -> (End, End) {
    (End::new(env), End::new(env))
}

/// A signaled RDMA WRITE of `len` bytes from `offset` of `a`'s buffer.
pub(super) fn write(
    a: &End,
    wr_id: u64,
    offset: usize,
    len: u32,
    remote: u64,
    rkey: u32,
) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr: remote,
            rkey,
        },
        sge: if len == 0 { None } else { a.sge(offset, len) },
        signaled: true,
    }
}

/// A signaled RDMA WRITE with immediate of `len` bytes from the start of
/// `a`'s buffer.
pub(super) fn write_imm(a: &End, wr_id: u64, len: u32, remote: u64, rkey: u32, imm: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::WriteImm {
            remote_addr: remote,
            rkey,
            imm,
        },
        sge: if len == 0 { None } else { a.sge(0, len) },
        signaled: true,
    }
}

/// A signaled RDMA READ of `len` bytes into `offset` of `a`'s buffer.
pub(super) fn read(a: &End, wr_id: u64, offset: usize, len: u32, remote: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read {
            remote_addr: remote,
            rkey,
        },
        sge: a.sge(offset, len),
        signaled: true,
    }
}

/// A signaled SEND of `len` bytes from the start of `a`'s buffer.
pub(super) fn send(a: &End, wr_id: u64, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send,
        sge: if len == 0 { None } else { a.sge(0, len) },
        signaled: true,
    }
}
