//! Contract checks of `Verbs`, `Context`, `Pd`, `Mr`, `Cq` and `Qp`: the
//! RC rules real queue pairs follow.

use std::time::Instant;

use super::support::{
    aim_a, caps, connect, deadline, expect_local_failure, init, pair, pattern, reaches_err, read,
    reconnect, rtr, rts, send, sorted_ids, statuses, to, write, write_imm, Link, ALL, A_SQ_PSN,
    BUF, B_SQ_PSN,
};
use super::Env;
use hipobj::platform::{
    Access, LinkLayer, PortState, QpAttr, QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

/// `IBV_WC_LOC_QP_OP_ERR`.
pub(super) const WC_LOC_QP_OP_ERR: u32 = 2;

/// The device is listed and opens; its port is an active Ethernet (RoCE)
/// port whose GID at the environment's index is the IPv4-mapped address;
/// GIDs past the table, other ports and unknown devices are errors.
pub fn the_device_is_listed_and_describes_its_port(env: &Env) {
    let names = env
        .verbs
        .device_names()
        .unwrap_or_else(|e| panic!("ibv_get_device_list: {e}"));
    assert!(
        names.contains(&env.device),
        "{} is not among the devices {names:?}",
        env.device
    );
    let ctx = env
        .verbs
        .open(&env.device)
        .unwrap_or_else(|e| panic!("opening {}: {e}", env.device));
    assert_eq!(ctx.name(), env.device);
    let port = ctx
        .query_port(env.port)
        .unwrap_or_else(|e| panic!("port {}: {e}", env.port));
    assert_eq!(
        (port.state, port.link_layer, port.lid),
        (PortState::Active, LinkLayer::Ethernet, 0),
        "an active RoCE port, without LID"
    );
    assert!(
        port.gid_table_len > u16::from(env.gid_index),
        "GID table of {} entries",
        port.gid_table_len
    );
    let gid = ctx
        .query_gid(env.port, u16::from(env.gid_index))
        .unwrap_or_else(|e| panic!("GID {}: {e}", env.gid_index));
    assert_eq!(
        gid,
        env.ip.to_ipv6_mapped().octets(),
        "GID {} is ::ffff:{}",
        env.gid_index,
        env.ip
    );
    assert!(
        ctx.query_gid(env.port, port.gid_table_len).is_err(),
        "a GID past the table"
    );
    assert!(ctx.query_port(env.port + 1).is_err(), "a port it lacks");
    assert!(
        env.verbs.open("no-such-device0").is_err(),
        "an unknown device opens"
    );
}

/// A SEND lands in the posted receive, whose completion carries its length
/// (and immediate data, for a SEND with immediate); a payload larger than
/// the receive fails on both sides.
pub fn send_lands_in_the_posted_receive(env: &Env) {
    let (mut a, b) = pair(env);
    pattern(&mut a.buf[..100], 8);
    connect(env, &a, &b, Link::default());
    b.recv(5, b.sge(4096, 128));
    a.post(&[send(&a, 9, 100)]);
    let got = b.next("the receive of a SEND");
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len, got.imm),
        (5, WcStatus::Success, WcOpcode::Recv, 100, None)
    );
    assert_eq!(got.qp_num, b.qp.qp_num(), "the receiving QP's number");
    assert_eq!(b.buf[4096..4196], a.buf[..100], "the payload landed");
    assert!(b.buf[4196..4224].iter().all(|&x| x == 0), "and no more");
    let sent = a.next("the SEND");
    assert_eq!(
        (sent.wr_id, sent.status, sent.opcode),
        (9, WcStatus::Success, WcOpcode::Send)
    );

    b.recv(6, None);
    let with_imm = SendWr {
        wr_id: 10,
        op: SendOp::SendImm { imm: 0xfeed_f00d },
        sge: None,
        signaled: true,
    };
    a.post(&[with_imm]);
    let got = b.next("the receive of a SEND with immediate");
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len, got.imm),
        (6, WcStatus::Success, WcOpcode::Recv, 0, Some(0xfeed_f00d))
    );
    assert_eq!(a.next("the SEND with immediate").status, WcStatus::Success);

    // A payload larger than the receive: both sides fail. IB says the
    // receive ends with a local length error and the requester gets an
    // invalid request NAK; rxe (Linux 6.12) reports a local QP operation
    // error and a remote operation error.
    b.recv(7, b.sge(4096, 64));
    a.post(&[send(&a, 11, 100)]);
    let failed = b.next("a receive too small");
    assert_eq!(failed.wr_id, 7);
    assert!(
        matches!(
            failed.status,
            WcStatus::LocLenErr | WcStatus::RemInvReqErr | WcStatus::Other(WC_LOC_QP_OP_ERR)
        ),
        "a receive too small ends with {:?}",
        failed.status
    );
    let nak = a.next("a SEND too large").status;
    assert!(
        matches!(nak, WcStatus::RemInvReqErr | WcStatus::RemOpErr),
        "a SEND too large for the receive ends with {nak:?}"
    );
}

/// RDMA WRITE and READ complete on the requester only; the side whose
/// memory they touch sees nothing. An unsignaled success completes
/// silently.
pub fn one_sided_operations_complete_only_on_the_requester(env: &Env) {
    let (mut a, mut b) = pair(env);
    pattern(&mut a.buf[..4096], 6);
    pattern(&mut b.buf[8192..12288], 60);
    connect(env, &a, &b, Link::default());
    let wr = write(&a, 1, 0, 4096, b.addr(0), b.mr.rkey());
    let rd = read(&a, 2, 16384, 4096, b.addr(8192), b.mr.rkey());
    a.post(&[wr, rd]);
    let done = a.take(2, "a WRITE and a READ");
    assert_eq!(statuses(&done), [WcStatus::Success; 2]);
    assert_eq!(
        (done[0].wr_id, done[0].opcode),
        (1, WcOpcode::RdmaWrite),
        "in order"
    );
    assert_eq!(
        (done[1].wr_id, done[1].opcode, done[1].byte_len),
        (2, WcOpcode::RdmaRead, 4096)
    );
    assert_eq!(b.buf[..4096], a.buf[..4096], "the WRITE landed");
    assert_eq!(
        a.buf[16384..20480],
        b.buf[8192..12288],
        "the READ came back"
    );
    b.quiet("the target of a WRITE and a READ");

    let mut unsignaled = write(&a, 3, 0, 8, b.addr(0), b.mr.rkey());
    unsignaled.signaled = false;
    a.post(&[unsignaled, write(&a, 4, 0, 8, b.addr(0), b.mr.rkey())]);
    let done = a.next("a signaled WRITE after an unsignaled one");
    assert_eq!((done.wr_id, done.status), (4, WcStatus::Success));
    a.quiet("an unsignaled success");
}

/// With `rnr_retry` 7 a WRITE with immediate waits, without an error, for
/// the responder to post a receive, then lands and completes on both sides.
pub fn write_with_imm_waits_for_a_receive_when_rnr_retry_is_7(env: &Env) {
    let (mut a, b) = pair(env);
    pattern(&mut a.buf[..4096], 5);
    connect(env, &a, &b, Link::default());
    a.post(&[write_imm(&a, 2, 4096, b.addr(0), b.mr.rkey(), 0xc0ffee)]);
    a.quiet("a WRITE with immediate with no receive at the responder");
    assert_eq!(a.state(), QpState::Rts, "no error while it waits");
    b.recv(77, None);
    let got = b.next("the receive of a WRITE with immediate");
    assert_eq!(
        (got.wr_id, got.status, got.opcode),
        (77, WcStatus::Success, WcOpcode::RecvRdmaWithImm)
    );
    assert_eq!((got.imm, got.byte_len), (Some(0xc0ffee), 4096));
    assert_eq!(got.qp_num, b.qp.qp_num());
    let done = a.next("the WRITE with immediate");
    assert_eq!((done.wr_id, done.status), (2, WcStatus::Success));
    assert_eq!(b.buf[..4096], a.buf[..4096]);
}

/// A (single-packet) WRITE with immediate that finds no receive is
/// refused with RNR NAKs until `rnr_retry` runs out: the requester fails
/// with RNR_RETRY_EXC_ERR, nothing lands, the responder stays in RTS.
pub fn write_with_imm_without_a_receive_is_rnr(env: &Env) {
    let (mut a, b) = pair(env);
    pattern(&mut a.buf[..256], 4);
    let link = Link {
        rnr_retry: 1,
        ..Link::default()
    };
    connect(env, &a, &b, link);
    a.post(&[write_imm(&a, 2, 256, b.addr(0), b.mr.rkey(), 0xc0ffee)]);
    let done = a.next("a WRITE with immediate without a receive");
    assert_eq!((done.wr_id, done.status), (2, WcStatus::RnrRetryExcErr));
    // rxe's completer delivers the error completion, then moves the QP to
    // ERR: a query right after the completion may still see RTS.
    reaches_err(&a, "the requester of an RNR");
    b.quiet("the responder of an RNR");
    assert!(b.buf[..256].iter().all(|&x| x == 0), "nothing landed");
    assert_eq!(b.state(), QpState::Rts, "RNR leaves the responder alone");
}

/// A QP below RTR drops what reaches it: the requester retransmits until
/// `retry_cnt` runs out and fails with RETRY_EXC_ERR; the target sees
/// nothing and stays in INIT.
pub fn write_to_a_qp_in_init_is_dropped_and_the_requester_gives_up(env: &Env) {
    let (mut a, b) = pair(env);
    pattern(&mut a.buf[..4096], 7);
    aim_a(env, &a, &b, Link::default());
    a.post(&[write(&a, 1, 0, 4096, b.addr(0), b.mr.rkey())]);
    let done = a.next("a WRITE to a QP in INIT");
    assert_eq!((done.wr_id, done.status), (1, WcStatus::RetryExcErr));
    // As above: the completion may come before the QP is in ERR (seen once
    // on rxe: RTS right after the RETRY_EXC_ERR completion).
    reaches_err(&a, "the requester of a WRITE to a QP in INIT");
    assert_eq!(b.state(), QpState::Init);
    b.quiet("a QP in INIT");
    assert!(b.buf[..4096].iter().all(|&x| x == 0), "nothing landed");
}

/// A responder with `max_dest_rd_atomic` 0 refuses READs: the requester
/// fails with REM_INV_REQ_ERR and the responder goes to ERR.
pub fn read_needs_max_dest_rd_atomic_at_the_responder(env: &Env) {
    let (a, b) = pair(env);
    let link = Link {
        max_dest_rd_atomic: 0,
        ..Link::default()
    };
    connect(env, &a, &b, link);
    a.post(&[read(&a, 3, 0, 4096, b.addr(0), b.mr.rkey())]);
    let done = a.next("a READ of a responder without READ resources");
    assert_eq!((done.wr_id, done.status), (3, WcStatus::RemInvReqErr));
    reaches_err(&b, "a READ of a responder without READ resources");
}

/// A requester with `max_rd_atomic` 0 never sends a READ, nor anything
/// after it, and reports no error; moved to ERR, it flushes both in order.
pub fn read_with_zero_initiator_depth_never_leaves(env: &Env) {
    let (a, b) = pair(env);
    let link = Link {
        max_rd_atomic: 0,
        ..Link::default()
    };
    connect(env, &a, &b, link);
    let rd = read(&a, 3, 0, 4096, b.addr(0), b.mr.rkey());
    let wr = write(&a, 1, 0, 16, b.addr(0), b.mr.rkey());
    a.post(&[rd, wr]);
    a.quiet("a READ without initiator depth");
    assert_eq!(a.state(), QpState::Rts, "without an error");
    a.to(QpState::Err);
    let flushed = a.take(2, "the flush of the READ and the WRITE");
    assert_eq!(statuses(&flushed), [WcStatus::WrFlushErr; 2]);
    let ids: Vec<u64> = flushed.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [3, 1], "in the order posted");
}

/// A connected QP cannot be moved back to RTR (to aim it at another peer):
/// the modify fails naming the transition and leaves it in RTS. Through
/// RESET and INIT it connects again.
pub fn rts_cannot_be_re_aimed_without_reset(env: &Env) {
    let (mut a, b) = pair(env);
    connect(env, &a, &b, Link::default());
    let again = rtr(env, &b, B_SQ_PSN, 4);
    let err = a.qp.modify(&again).expect_err("RTS -> RTR");
    assert!(err.to_string().contains("RTS -> RTR"), "{err}");
    assert_eq!(a.state(), QpState::Rts, "unchanged");
    reconnect(env, &a, &b, Link::default());
    pattern(&mut a.buf[..64], 3);
    a.post(&[write(&a, 1, 0, 64, b.addr(0), b.mr.rkey())]);
    assert_eq!(
        a.next("a WRITE after reconnecting").status,
        WcStatus::Success
    );
    assert_eq!(b.buf[..64], a.buf[..64]);
}

/// `ibv_modify_qp` refuses a transition without its required attributes,
/// with attributes the transition does not take, an address vector without
/// global route on RoCE, and transitions the state machine lacks.
pub fn modify_checks_the_attribute_mask_of_each_transition(env: &Env) {
    let (a, b) = pair(env);
    let qp =
        a.pd.create_qp(&a.cq, caps())
            .unwrap_or_else(|e| panic!("QP: {e}"));
    assert_eq!(qp.state().ok(), Some(QpState::Reset), "created in RESET");
    let no_access = QpAttr {
        access: None,
        ..init(env, ALL)
    };
    assert!(
        qp.modify(&no_access).is_err(),
        "RESET -> INIT without access flags"
    );
    qp.modify(&init(env, ALL))
        .unwrap_or_else(|e| panic!("INIT: {e}"));
    let extra = QpAttr {
        sq_psn: Some(1),
        ..init(env, ALL)
    };
    assert!(qp.modify(&extra).is_err(), "INIT -> INIT with an SQ PSN");
    let mut no_grh = rtr(env, &b, 1, 4);
    if let Some(av) = no_grh.av.as_mut() {
        av.is_global = false;
    }
    assert!(qp.modify(&no_grh).is_err(), "RTR without GRH on RoCE");
    let no_dest = QpAttr {
        dest_qp_num: None,
        ..rtr(env, &b, 1, 4)
    };
    assert!(qp.modify(&no_dest).is_err(), "RTR without a destination");
    assert_eq!(qp.state().ok(), Some(QpState::Init), "none of that took");
    qp.modify(&rtr(env, &b, 1, 4))
        .unwrap_or_else(|e| panic!("RTR: {e}"));
    assert!(qp.modify(&to(QpState::Init)).is_err(), "RTR -> INIT");
    qp.modify(&rts(1, Link::default(), 4))
        .unwrap_or_else(|e| panic!("RTS: {e}"));
    assert!(qp.modify(&to(QpState::Rtr)).is_err(), "RTS -> RTR");
    qp.modify(&to(QpState::Reset))
        .unwrap_or_else(|e| panic!("RTS -> RESET: {e}"));
    assert_eq!(qp.state().ok(), Some(QpState::Reset));
}

/// RESET discards posted receives without completions (a completion
/// already queued stays on the CQ), and a QP in RESET takes no receive;
/// brought back, its receive queue is empty.
pub fn reset_discards_receives_without_completions(env: &Env) {
    let (a, b) = pair(env);
    connect(env, &a, &b, Link::default());
    for id in 0..4 {
        b.recv(id, None);
    }
    a.post(&[write_imm(&a, 1, 0, 0, 0, 7)]);
    assert_eq!(a.next("a WRITE with immediate").status, WcStatus::Success);
    // The responder completed the receive before it acknowledged.
    b.to(QpState::Reset);
    let got = b.next("the one receive consumed");
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.imm),
        (0, WcStatus::Success, WcOpcode::RecvRdmaWithImm, Some(7))
    );
    b.quiet("the other three receives after RESET");
    let refused = b.qp.post_recv(RecvWr {
        wr_id: 9,
        sge: None,
    });
    assert!(refused.is_err(), "a receive posted in RESET");
    reconnect(env, &a, &b, Link::default());
    // B's receive queue is empty now: with rnr_retry 7 the IMM waits.
    a.post(&[write_imm(&a, 2, 0, 0, 0, 8)]);
    a.quiet("a WRITE with immediate to a QP whose receives were discarded");
    b.quiet("a QP whose receives were discarded");
    b.recv(10, None);
    let got = b.next("a receive posted after RESET");
    assert_eq!((got.wr_id, got.imm), (10, Some(8)));
    assert_eq!(a.next("the WRITE with immediate").status, WcStatus::Success);
}

/// Moving to ERR completes every posted receive and outstanding send with
/// WR_FLUSH_ERR; work posted in ERR is flushed too, signaled or not.
pub fn error_flushes_receives_and_outstanding_sends(env: &Env) {
    let (a, b) = pair(env);
    connect(env, &a, &b, Link::default());
    // B has no receive: with rnr_retry 7 this stays outstanding.
    a.post(&[write_imm(&a, 1, 0, 0, 0, 1)]);
    a.recv(11, None);
    a.recv(12, None);
    a.quiet("an outstanding WRITE with immediate and two receives");
    a.to(QpState::Err);
    let flushed = a.take(3, "the flush");
    assert_eq!(statuses(&flushed), [WcStatus::WrFlushErr; 3]);
    assert_eq!(sorted_ids(&flushed), [1, 11, 12]);
    // A send posted in ERR is flushed too, signaled or not. (A receive
    // posted in ERR is not checked: rxe flushed one late or not at all in
    // one lane run of three.)
    let mut unsignaled = write(&a, 13, 0, 8, b.addr(0), b.mr.rkey());
    unsignaled.signaled = false;
    a.post(&[unsignaled]);
    let flushed = a.take(1, "an unsignaled send posted in ERR");
    assert_eq!(statuses(&flushed), [WcStatus::WrFlushErr]);
    assert_eq!(sorted_ids(&flushed), [13]);
}

/// Sends need RTS: a QP in RESET, INIT or RTR refuses them. Receives need
/// INIT at least.
pub fn sends_need_rts_and_receives_need_init(env: &Env) {
    let (a, b) = pair(env);
    // A QP of its own: a refused send may stay queued on some providers.
    let qp =
        a.pd.create_qp(&a.cq, caps())
            .unwrap_or_else(|e| panic!("QP: {e}"));
    let probe = || write(&a, 1, 0, 8, b.addr(0), b.mr.rkey());
    assert!(qp.post_send(&[probe()]).is_err(), "a send in RESET");
    let recv = |wr_id| RecvWr { wr_id, sge: None };
    assert!(qp.post_recv(recv(1)).is_err(), "a receive in RESET");
    qp.modify(&init(env, ALL))
        .unwrap_or_else(|e| panic!("INIT: {e}"));
    assert!(qp.post_send(&[probe()]).is_err(), "a send in INIT");
    qp.post_recv(recv(2))
        .unwrap_or_else(|e| panic!("a receive in INIT: {e}"));
    qp.modify(&rtr(env, &b, A_SQ_PSN, 4))
        .unwrap_or_else(|e| panic!("RTR: {e}"));
    assert!(qp.post_send(&[probe()]).is_err(), "a send in RTR");
    qp.post_recv(recv(3))
        .unwrap_or_else(|e| panic!("a receive in RTR: {e}"));
    a.quiet("refused sends");
}

/// The responder checks rkeys, bounds and access: a WRITE past or before a
/// region, with another PD's rkey, a READ of a region without remote read,
/// a WRITE to a QP without remote write fail and move the responder to
/// ERR; a zero-length WRITE needs no rkey. The requester checks its own
/// keys: another PD's lkey, a READ into memory without local write fail
/// locally and leave the responder alone.
pub fn rkey_bounds_and_access_are_checked(env: &Env) {
    let (a, b) = pair(env);
    let link = Link::default();
    connect(env, &a, &b, link);
    let rkey = b.mr.rkey();
    let cases: [(&str, _); 3] = [
        ("past the end", write(&a, 1, 0, 16, b.addr(BUF - 8), rkey)),
        ("before the start", write(&a, 1, 0, 16, b.addr(0) - 1, rkey)),
        (
            "an rkey of another PD",
            write(&a, 1, 0, 16, a.addr(0), a.mr.rkey()),
        ),
    ];
    for (what, wr) in cases {
        a.post(&[wr]);
        assert_eq!(a.next(what).status, WcStatus::RemAccessErr, "{what}");
        reaches_err(&b, what);
        reconnect(env, &a, &b, link);
    }
    // Zero bytes: the rkey is not looked at (C9-88).
    a.post(&[write(&a, 1, 0, 0, 0, 0xdead_beef)]);
    assert_eq!(
        a.next("a zero-length WRITE with a bad rkey").status,
        WcStatus::Success
    );
    // A region without remote read cannot be read.
    let mut extra = vec![0u8; 4096];
    let write_only =
        b.pd.reg_mr(
            extra.as_mut_ptr() as usize,
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap_or_else(|e| panic!("MR: {e}"));
    a.post(&[read(&a, 2, 0, 16, write_only.addr(), write_only.rkey())]);
    assert_eq!(
        a.next("a READ of a region without remote read").status,
        WcStatus::RemAccessErr
    );
    reaches_err(&b, "a READ of a region without remote read");
    reconnect(env, &a, &b, link);
    // A QP without remote write refuses WRITEs whatever the region allows
    // (rxe's check_op_valid: an invalid request).
    b.to(QpState::Reset);
    b.qp.modify(&init(env, Access::LOCAL_WRITE | Access::REMOTE_READ))
        .unwrap_or_else(|e| panic!("INIT: {e}"));
    super::support::aim_b(env, &a, &b, link);
    a.post(&[write(&a, 1, 0, 16, b.addr(0), rkey)]);
    assert_eq!(
        a.next("a WRITE to a QP without remote write").status,
        WcStatus::RemInvReqErr
    );
    reaches_err(&b, "a WRITE to a QP without remote write");
    reconnect(env, &a, &b, link);
    // Local keys: the lkey of another PD's region.
    let mut bad = write(&a, 1, 0, 16, b.addr(0), rkey);
    bad.sge = Some(Sge {
        lkey: b.mr.lkey(),
        ..a.sge(0, 16).unwrap_or_else(|| unreachable!())
    });
    a.post(&[bad]);
    expect_local_failure(&a, WcStatus::LocProtErr, "a WRITE from another PD's region");
    assert_eq!(b.state(), QpState::Rts, "local errors stay local");
    reconnect(env, &a, &b, link);
    // A READ into memory registered without local write.
    let mut ro = vec![0u8; 4096];
    let read_only =
        a.pd.reg_mr(ro.as_mut_ptr() as usize, 4096, Access::empty())
            .unwrap_or_else(|e| panic!("MR: {e}"));
    let into_ro = SendWr {
        sge: Some(Sge {
            addr: read_only.addr(),
            len: 16,
            lkey: read_only.lkey(),
        }),
        ..read(&a, 3, 0, 16, b.addr(0), rkey)
    };
    a.post(&[into_ro]);
    expect_local_failure(
        &a,
        WcStatus::LocProtErr,
        "a READ into memory without local write",
    );
    assert!(ro.iter().all(|&x| x == 0), "nothing was written there");
    assert_eq!(b.state(), QpState::Rts, "local errors stay local");
    drop((read_only, write_only));
    drop((ro, extra));
}

/// `Cq::wait` returns `false` at its deadline on an empty queue, and wakes
/// up with `true` when a completion arrives while it waits.
pub fn cq_wait_wakes_when_a_completion_arrives(env: &Env) {
    let (a, b) = pair(env);
    connect(env, &a, &b, Link::default());
    assert!(
        !b.cq
            .wait(Instant::now())
            .unwrap_or_else(|e| panic!("wait: {e}")),
        "an empty queue at the deadline"
    );
    b.recv(1, None);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.cq.wait(deadline()));
        a.post(&[write_imm(&a, 2, 0, 0, 0, 7)]);
        let woken = waiter
            .join()
            .unwrap_or_else(|_| panic!("the waiting thread panicked"))
            .unwrap_or_else(|e| panic!("wait: {e}"));
        assert!(woken, "woken by the completion");
    });
    let got = b.next("the completion that woke the waiter");
    assert_eq!((got.wr_id, got.imm), (1, Some(7)));
    assert_eq!(a.next("the WRITE with immediate").status, WcStatus::Success);
}

/// A receive posted before its QP goes to ERR through a peer's invalid
/// request is flushed: how the library notices that an idle connection's
/// QP failed on a device that raises no asynchronous event (rxe).
pub fn a_posted_receive_is_flushed_when_a_peer_breaks_the_qp(env: &Env) {
    let (a, b) = pair(env);
    let link = Link::default();
    connect(env, &a, &b, link);
    b.recv(7, b.sge(0, 64));
    // An rkey of nothing: the responder NAKs it and goes to ERR.
    a.post(&[write(&a, 1, 0, 64, b.addr(0), b.mr.rkey() ^ 0x0100_0000)]);
    assert_eq!(
        a.next("a WRITE with an rkey of nothing").status,
        WcStatus::RemAccessErr
    );
    let flushed = b.next("the posted receive");
    assert_eq!((flushed.wr_id, flushed.status), (7, WcStatus::WrFlushErr));
    assert_eq!(b.state(), QpState::Err);
}
