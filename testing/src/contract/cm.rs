//! Contract checks of the RDMA CM (`Cm`, `CmListener`, `CmRequest`,
//! `CmConnection`) as the protocol uses it: the client listens and accepts
//! with a pool QP of its own; the server connects with a QP the CM's
//! attributes bring to RTS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::support::{caps, deadline, err_of, eventually, init, quiet, take, to};
use super::{Env, NOWHERE};
use hipobj::error::Result;
use hipobj::platform::{
    AcceptParams, Access, CmConnection, CmEvent, CmListener, CmRequest, Completion, ConnectOutcome,
    ConnectRequest, Context, Cq, Mr, Mtu, Pd, Qp, QpAttr, QpState, RecvWr, SendOp, SendWr, Sge,
    WcOpcode, WcStatus, CM_REQ_PRIVATE_DATA_MAX,
};

/// Bytes a transfer moves.
const LEN: usize = 64 * 1024;
/// The final message's immediate data.
const SECRET: u32 = 0xedc7_8361;
/// The server's `conn_param`: deliberately asymmetric, to see the swap.
const SERVER_INITIATOR_DEPTH: u8 = 3;
const SERVER_RESPONDER_RESOURCES: u8 = 5;
/// The pool QP's receive for the final message.
const RECV_WR_ID: u64 = 100;
/// A REJ's private data as the active side sees it (IB: 148 bytes).
const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Linux's default ephemeral port range, which the RDMA CM's port spaces
/// use too.
const EPHEMERAL_PORTS: std::ops::RangeInclusive<u16> = 32_768..=60_999;

/// One side: a context of its own, a PD, a CQ and a registered buffer of
/// `4 * LEN` bytes (the MR is declared before the buffer, so it goes
/// first).
pub(crate) struct Host {
    pub(crate) mr: Arc<dyn Mr>,
    pub(crate) buf: Vec<u8>,
    pub(crate) cq: Arc<dyn Cq>,
    pub(crate) pd: Arc<dyn Pd>,
    pub(crate) _ctx: Arc<dyn Context>,
}

/// A [`Host`] on the environment's device.
pub(crate) fn host(env: &Env) -> Host {
    let ctx = env
        .verbs
        .open(&env.device)
        .unwrap_or_else(|e| panic!("opening {}: {e}", env.device));
    let pd = ctx.alloc_pd().unwrap_or_else(|e| panic!("PD: {e}"));
    let cq = ctx.create_cq(256).unwrap_or_else(|e| panic!("CQ: {e}"));
    let mut buf = vec![0u8; 4 * LEN];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd
        .reg_mr(buf.as_mut_ptr() as usize, buf.len(), access)
        .unwrap_or_else(|e| panic!("MR: {e}"));
    Host {
        mr,
        buf,
        cq,
        pd,
        _ctx: ctx,
    }
}

impl Host {
    /// A scatter/gather entry of `len` bytes at `offset` of the buffer.
    fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        Some(Sge {
            addr: self.mr.addr() + u64::try_from(offset).unwrap_or(u64::MAX),
            len: u32::try_from(len).unwrap_or(u32::MAX),
            lkey: self.mr.lkey(),
        })
    }
}

/// 32 bytes, as the lab's cmtest sends: magic, QP number, secret, zeros.
pub(crate) fn proof(qp_num: u32) -> Vec<u8> {
    let mut data = b"HOBJ".to_vec();
    data.extend_from_slice(&qp_num.to_le_bytes());
    data.extend_from_slice(&SECRET.to_le_bytes());
    data.resize(32, 0);
    data
}

/// The server's connect request to the client's listener on `port`.
pub(crate) fn request<'a>(
    env: &Env,
    server: &'a Host,
    port: u16,
    data: &'a [u8],
    deadline: Instant,
) -> ConnectRequest<'a> {
    ConnectRequest {
        addr: SocketAddr::from((env.ip, port)),
        pd: &server.pd,
        cq: &server.cq,
        caps: caps(),
        private_data: data,
        initiator_depth: SERVER_INITIATOR_DEPTH,
        responder_resources: SERVER_RESPONDER_RESOURCES,
        retry_count: 6,
        rnr_retry_count: 7,
        deadline,
    }
}

/// An event, for messages.
fn describe(event: &Option<CmEvent>) -> String {
    match event {
        Some(CmEvent::ConnectRequest(_)) => "CONNECT_REQUEST".to_owned(),
        Some(CmEvent::Established { conn }) => format!("ESTABLISHED {conn}"),
        Some(CmEvent::Disconnected { conn }) => format!("DISCONNECTED {conn}"),
        None => "no event".to_owned(),
    }
}

/// The CONNECT_REQUEST `event` must be.
pub(crate) fn expect_request(event: Result<Option<CmEvent>>) -> Box<dyn CmRequest> {
    match event.unwrap_or_else(|e| panic!("next_event: {e}")) {
        Some(CmEvent::ConnectRequest(request)) => request,
        other => panic!("expected a CONNECT_REQUEST, got {}", describe(&other)),
    }
}

/// The connection an ESTABLISHED `event` names.
fn expect_established(event: Result<Option<CmEvent>>) -> u64 {
    match event.unwrap_or_else(|e| panic!("next_event: {e}")) {
        Some(CmEvent::Established { conn }) => conn,
        other => panic!("expected ESTABLISHED, got {}", describe(&other)),
    }
}

/// The connection a DISCONNECTED `event` names.
pub(crate) fn expect_disconnected(event: Result<Option<CmEvent>>) -> u64 {
    match event.unwrap_or_else(|e| panic!("next_event: {e}")) {
        Some(CmEvent::Disconnected { conn }) => conn,
        other => panic!("expected DISCONNECTED, got {}", describe(&other)),
    }
}

/// The REJ's private data of a connect that must have been rejected.
pub(crate) fn expect_rejected(outcome: Result<ConnectOutcome>) -> Vec<u8> {
    match outcome.unwrap_or_else(|e| panic!("connect: {e}")) {
        ConnectOutcome::Rejected { private_data } => private_data,
        ConnectOutcome::Established(_) => panic!("established, expected a rejection"),
    }
}

/// The client's listener on an ephemeral port and its pool QP (INIT, with
/// the access the CM gives its own QPs), and the server's host. Field
/// order: the QP and the listener go first.
pub(crate) struct Bench {
    pub(crate) qp: Arc<dyn Qp>,
    pub(crate) listener: Arc<dyn CmListener>,
    pub(crate) server: Host,
    pub(crate) client: Host,
}

/// A [`Bench`] on the environment's device.
pub(crate) fn bench(env: &Env) -> Bench {
    let client = host(env);
    let server = host(env);
    let listener = env
        .cm
        .listen(SocketAddr::from((env.ip, 0)))
        .unwrap_or_else(|e| panic!("listen: {e}"));
    let qp = client
        .pd
        .create_qp(&client.cq, caps())
        .unwrap_or_else(|e| panic!("QP: {e}"));
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    qp.modify(&init(env, access))
        .unwrap_or_else(|e| panic!("INIT: {e}"));
    Bench {
        qp,
        listener,
        server,
        client,
    }
}

/// The server connects with `data` (in its own thread: `connect` blocks)
/// while `client_side` handles the CONNECT_REQUEST; returns what
/// `client_side` returned and how `connect` ended.
pub(crate) fn during_connect<T>(
    env: &Env,
    server: &Host,
    listener: &Arc<dyn CmListener>,
    data: &[u8],
    client_side: impl FnOnce(Box<dyn CmRequest>) -> T,
) -> (T, Result<ConnectOutcome>) {
    thread::scope(|s| {
        let port = listener.port();
        let connecting =
            s.spawn(move || env.cm.connect(request(env, server, port, data, deadline())));
        let client = client_side(expect_request(listener.next_event(deadline())));
        let outcome = connecting
            .join()
            .unwrap_or_else(|_| panic!("the connecting thread panicked"));
        (client, outcome)
    })
}

/// What the client saw while accepting.
pub(crate) struct Accepted {
    pub(crate) conn: Arc<dyn CmConnection>,
    /// `init_qp_attr` as the CM returned them, before any override.
    pub(crate) rtr: QpAttr,
    pub(crate) rts: QpAttr,
    pub(crate) private_data: Vec<u8>,
}

/// The listener thread's part of the protocol, in its order: copy the
/// private data, post the receive, RTR with `min_rnr_timer` overridden to
/// 1, RTS, then accept with the request's values and `rnr_retry_count` 7.
pub(crate) fn accept_like_the_design(
    request: Box<dyn CmRequest>,
    qp: &Arc<dyn Qp>,
) -> Result<Accepted> {
    let private_data = request.private_data().to_vec();
    qp.post_recv(RecvWr {
        wr_id: RECV_WR_ID,
        sge: None,
    })?;
    let rtr = request.init_qp_attr(QpState::Rtr)?;
    qp.modify(&QpAttr {
        min_rnr_timer: Some(1),
        ..rtr
    })?;
    let rts = request.init_qp_attr(QpState::Rts)?;
    qp.modify(&rts)?;
    let params = AcceptParams {
        qp_num: qp.qp_num(),
        responder_resources: request.responder_resources(),
        initiator_depth: request.initiator_depth(),
        rnr_retry_count: 7,
        private_data: Vec::new(),
    };
    let conn = request.accept(params)?;
    Ok(Accepted {
        conn,
        rtr,
        rts,
        private_data,
    })
}

/// Both ends of one connection. Field order: the server's connection
/// (which holds its QP) goes first.
pub(crate) struct Session {
    pub(crate) server_conn: Arc<dyn CmConnection>,
    pub(crate) server_qp: Arc<dyn Qp>,
    pub(crate) client: Accepted,
}

/// The server connects to the client's listener; the client accepts with
/// its pool QP; both see ESTABLISHED.
pub(crate) fn establish(env: &Env, b: &Bench) -> Session {
    let data = proof(b.qp.qp_num());
    let (client, outcome) = during_connect(env, &b.server, &b.listener, &data, |request| {
        accept_like_the_design(request, &b.qp).unwrap_or_else(|e| panic!("accept: {e}"))
    });
    let ConnectOutcome::Established(server_conn) =
        outcome.unwrap_or_else(|e| panic!("connect: {e}"))
    else {
        panic!("the server was rejected");
    };
    let established = expect_established(b.listener.next_event(deadline()));
    assert_eq!(
        established,
        client.conn.id(),
        "ESTABLISHED names the connection"
    );
    let server_qp = server_conn
        .qp()
        .unwrap_or_else(|| panic!("the active side has no QP"));
    Session {
        server_conn,
        server_qp,
        client,
    }
}

/// The next completion of `cq`.
fn one(cq: &Arc<dyn Cq>, what: &str) -> Completion {
    take(&**cq, 1, what)[0]
}

/// The server's part of a transfer: a 64 KiB WRITE and a SEND with
/// immediate carrying the secret, posted together with only the SEND
/// signaled, then a READ back; byte-exact on both sides, and nothing on
/// the client but its receive.
pub(crate) fn transfer(env: &Env, b: &mut Bench, session: &Session, seed: u8) {
    for (byte, n) in b.server.buf[..LEN].iter_mut().zip((0..253u8).cycle()) {
        *byte = seed.wrapping_add(n);
    }
    let remote = b.client.mr.addr();
    let rkey = b.client.mr.rkey();
    let write = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: remote,
            rkey,
        },
        sge: b.server.sge(0, LEN),
        signaled: false,
    };
    let fin = SendWr {
        wr_id: 2,
        op: SendOp::SendImm { imm: SECRET },
        sge: None,
        signaled: true,
    };
    session
        .server_qp
        .post_send(&[write, fin])
        .unwrap_or_else(|e| panic!("post: {e}"));
    let done = one(&b.server.cq, "the final SEND");
    assert_eq!((done.wr_id, done.status), (2, WcStatus::Success));
    let got = one(&b.client.cq, "the final message");
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.imm),
        (RECV_WR_ID, WcStatus::Success, WcOpcode::Recv, Some(SECRET))
    );
    assert_eq!(got.qp_num, b.qp.qp_num());
    assert_eq!(b.client.buf[..LEN], b.server.buf[..LEN], "the WRITE landed");
    let read = SendWr {
        wr_id: 3,
        op: SendOp::Read {
            remote_addr: remote,
            rkey,
        },
        sge: b.server.sge(LEN, LEN),
        signaled: true,
    };
    session
        .server_qp
        .post_send(&[read])
        .unwrap_or_else(|e| panic!("post: {e}"));
    let done = one(&b.server.cq, "the READ");
    assert_eq!(
        (done.wr_id, done.status, done.byte_len),
        (3, WcStatus::Success, 64 * 1024)
    );
    assert_eq!(
        b.server.buf[LEN..2 * LEN],
        b.server.buf[..LEN],
        "the READ came back"
    );
    quiet(
        &*b.client.cq,
        env.quiet,
        "the client of one-sided operations",
    );
}

/// The client's SEND to the server: its `sq_psn` matches the server's
/// `rq_psn`.
fn ack(b: &Bench, session: &Session) {
    session
        .server_qp
        .post_recv(RecvWr {
            wr_id: 7,
            sge: b.server.sge(3 * LEN, 8),
        })
        .unwrap_or_else(|e| panic!("post_recv: {e}"));
    let send = SendWr {
        wr_id: 8,
        op: SendOp::Send,
        sge: b.client.sge(0, 8),
        signaled: false,
    };
    b.qp.post_send(&[send])
        .unwrap_or_else(|e| panic!("post: {e}"));
    let got = one(&b.server.cq, "the client's SEND");
    assert_eq!(
        (got.wr_id, got.status, got.byte_len),
        (7, WcStatus::Success, 8)
    );
}

/// The end of a lease: drain, RESET, INIT.
pub(crate) fn recycle(env: &Env, b: &Bench) {
    b.client
        .cq
        .poll(64)
        .unwrap_or_else(|e| panic!("drain: {e}"));
    b.qp.modify(&to(QpState::Reset))
        .unwrap_or_else(|e| panic!("RESET: {e}"));
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    b.qp.modify(&init(env, access))
        .unwrap_or_else(|e| panic!("INIT: {e}"));
}

/// The passive side accepts with a QP of its own, moved to RTR and RTS
/// with the CM's attributes (`rdma_init_qp_attr`: the masks of the lab's
/// cmtest, the read depths swapped to the passive side's view, the CM's
/// `min_rnr_timer` 0 for the caller to override); both sides see the
/// connection established, and bytes move both ways.
pub fn cm_accept_with_an_existing_qp_connects_both_sides(env: &Env) {
    let mut b = bench(env);
    let session = establish(env, &b);
    let (rtr, rts) = (session.client.rtr, session.client.rts);
    assert_eq!(
        (rtr.mask(), rts.mask()),
        (0x12_9181, 0x1_2e01),
        "the CM's masks"
    );
    assert_eq!(rtr.dest_qp_num, Some(session.server_qp.qp_num()));
    assert_eq!(rtr.path_mtu, Some(port_mtu(env)), "the port's MTU");
    assert_eq!(rtr.min_rnr_timer, Some(0), "the CM's 655 ms");
    assert_eq!(
        rtr.max_dest_rd_atomic,
        Some(SERVER_INITIATOR_DEPTH),
        "the server's initiator depth"
    );
    assert_eq!(
        rts.max_rd_atomic,
        Some(SERVER_RESPONDER_RESOURCES),
        "the server's responder resources"
    );
    assert_eq!((rts.retry_cnt, rts.rnr_retry), (Some(6), Some(7)));
    let av = rtr
        .av
        .unwrap_or_else(|| panic!("RTR without an address vector"));
    assert_eq!(
        av.dgid,
        env.ip.to_ipv6_mapped().octets(),
        "the server's GID"
    );
    assert_eq!(
        (av.sgid_index, av.port, av.is_global),
        (env.gid_index, env.port, true)
    );
    for psn in [rtr.rq_psn, rts.sq_psn] {
        assert!(psn.is_some_and(|p| p <= 0x00ff_ffff), "a 24-bit PSN");
    }
    assert_eq!(b.qp.state().ok(), Some(QpState::Rts));
    assert_eq!(session.server_qp.state().ok(), Some(QpState::Rts));
    assert!(!session.client.conn.is_disconnected());
    assert!(!session.server_conn.is_disconnected());
    assert!(
        session.client.conn.qp().is_none(),
        "the passive side brought its own"
    );
    transfer(env, &mut b, &session, 11);
    ack(&b, &session);
}

/// The port's active MTU: the path MTU the CM chooses on one device.
fn port_mtu(env: &Env) -> Mtu {
    let ctx = env
        .verbs
        .open(&env.device)
        .unwrap_or_else(|e| panic!("opening {}: {e}", env.device));
    ctx.query_port(env.port)
        .unwrap_or_else(|e| panic!("port: {e}"))
        .active_mtu
}

/// A REQ's private data reaches the passive side padded to 56 bytes; more
/// than 56 bytes cannot be sent.
pub fn cm_request_private_data_is_padded_to_56_bytes(env: &Env) {
    let b = bench(env);
    let session = establish(env, &b);
    let received = &session.client.private_data;
    assert_eq!(received.len(), CM_REQ_PRIVATE_DATA_MAX);
    assert_eq!(received[..32], proof(b.qp.qp_num()));
    assert!(received[32..].iter().all(|&x| x == 0), "padded with zeros");
    let too_long = [0u8; CM_REQ_PRIVATE_DATA_MAX + 1];
    let refused = env.cm.connect(request(
        env,
        &b.server,
        b.listener.port(),
        &too_long,
        deadline(),
    ));
    assert!(refused.is_err(), "57 bytes of private data");
}

/// A rejection reaches the active side with the REJ's private data, padded
/// to 148 bytes.
pub fn cm_reject_reaches_the_active_side_with_its_private_data(env: &Env) {
    let b = bench(env);
    let ((), outcome) = during_connect(env, &b.server, &b.listener, &proof(17), |request| {
        request
            .reject(b"BAD_SECRET")
            .unwrap_or_else(|e| panic!("reject: {e}"));
    });
    let rejected = expect_rejected(outcome);
    assert_eq!(rejected.len(), REJ_PRIVATE_DATA_LEN);
    assert_eq!(&rejected[..10], b"BAD_SECRET");
    assert!(rejected[10..].iter().all(|&x| x == 0), "padded with zeros");
}

/// A request dropped unanswered rejects the active side, without data.
pub fn cm_dropped_request_rejects_the_active_side(env: &Env) {
    let b = bench(env);
    let ((), outcome) = during_connect(env, &b.server, &b.listener, &proof(17), drop);
    assert_eq!(expect_rejected(outcome), [0u8; REJ_PRIVATE_DATA_LEN]);
}

/// A disconnect from either side reaches the other: the passive side's
/// listener reports DISCONNECTED (once), the active side's connection
/// reports it, and the side that received the DREQ answers with its own
/// disconnect. The active side's own disconnect (not the peer's) moves
/// its QP to ERR, which flushes its receives; the CM leaves the passive
/// side's QP (which it did not create) alone. Dropping the active side's
/// connection disconnects too. Disconnecting again is harmless.
pub fn cm_disconnect_reaches_both_sides(env: &Env) {
    let b = bench(env);

    // The client (passive side) disconnects; the server answers.
    let session = establish(env, &b);
    session
        .client
        .conn
        .disconnect()
        .unwrap_or_else(|e| panic!("disconnect: {e}"));
    eventually("the server seeing the client's disconnect", || {
        session.server_conn.is_disconnected()
    });
    assert_eq!(
        session.server_qp.state().ok(),
        Some(QpState::Rts),
        "the active QP stays as it is until its own side disconnects"
    );
    session
        .server_conn
        .disconnect()
        .unwrap_or_else(|e| panic!("the server's answer: {e}"));
    assert_eq!(session.server_qp.state().ok(), Some(QpState::Err));
    let conn = session.client.conn.id();
    assert_eq!(expect_disconnected(b.listener.next_event(deadline())), conn);
    assert!(session.client.conn.is_disconnected());
    assert_eq!(
        b.qp.state().ok(),
        Some(QpState::Rts),
        "the CM leaves a QP it did not create alone"
    );
    session
        .client
        .conn
        .disconnect()
        .unwrap_or_else(|e| panic!("again: {e}"));
    let more = b
        .listener
        .next_event(Instant::now() + env.quiet)
        .unwrap_or_else(|e| panic!("next_event: {e}"));
    assert!(more.is_none(), "a second event: {}", describe(&more));
    drop(session);

    // The server (active side) disconnects: its QP goes to ERR.
    recycle(env, &b);
    let session = establish(env, &b);
    session
        .server_qp
        .post_recv(RecvWr {
            wr_id: 1,
            sge: None,
        })
        .unwrap_or_else(|e| panic!("post_recv: {e}"));
    session
        .server_conn
        .disconnect()
        .unwrap_or_else(|e| panic!("disconnect: {e}"));
    assert_eq!(session.server_qp.state().ok(), Some(QpState::Err));
    let flushed = one(&b.server.cq, "the server's receive");
    assert_eq!((flushed.wr_id, flushed.status), (1, WcStatus::WrFlushErr));
    let conn = session.client.conn.id();
    assert_eq!(expect_disconnected(b.listener.next_event(deadline())), conn);
    assert!(session.client.conn.is_disconnected());
    session
        .client
        .conn
        .disconnect()
        .unwrap_or_else(|e| panic!("the client's answer: {e}"));
    eventually("the server's connection reporting the disconnect", || {
        session.server_conn.is_disconnected()
    });
    session
        .server_conn
        .disconnect()
        .unwrap_or_else(|e| panic!("again: {e}"));
    drop(session);

    // Dropping the active side's connection disconnects too.
    recycle(env, &b);
    let session = establish(env, &b);
    let conn = session.client.conn.id();
    drop(session.server_conn);
    drop(session.server_qp);
    assert_eq!(expect_disconnected(b.listener.next_event(deadline())), conn);
    assert!(session.client.conn.is_disconnected());
}

/// A pool QP still connected (RTS) cannot accept another connection: the
/// move to RTR fails and the server is rejected. Once the disconnect is
/// complete on both sides (the DREQ answered), through RESET and INIT it
/// accepts again, with new PSNs and the new server QP, and moves bytes.
pub fn cm_pool_qp_is_reused_after_reset_and_init(env: &Env) {
    let mut b = bench(env);
    let first = establish(env, &b);
    transfer(env, &mut b, &first, 1);
    first
        .server_conn
        .disconnect()
        .unwrap_or_else(|e| panic!("disconnect: {e}"));
    expect_disconnected(b.listener.next_event(deadline()));
    // The client answers the DREQ, as the library's listener does: until
    // the server's CM has the answer it keeps the pool QP's number as a
    // live connection's, and refuses a new REP from it as stale.
    first
        .client
        .conn
        .disconnect()
        .unwrap_or_else(|e| panic!("the client's answer: {e}"));
    eventually("the server's CM receiving the answer", || {
        first.server_conn.is_disconnected()
    });

    let (err, outcome) = during_connect(
        env,
        &b.server,
        &b.listener,
        &proof(b.qp.qp_num()),
        |request| {
            err_of(
                accept_like_the_design(request, &b.qp),
                "accepting with an RTS QP",
            )
        },
    );
    assert!(err.to_string().contains("RTS -> RTR"), "{err}");
    assert_eq!(expect_rejected(outcome).len(), REJ_PRIVATE_DATA_LEN);

    recycle(env, &b);
    let second = establish(env, &b);
    assert_ne!(
        second.client.rtr.rq_psn, first.client.rtr.rq_psn,
        "new PSNs per connection"
    );
    assert_ne!(second.server_qp.qp_num(), first.server_qp.qp_num());
    transfer(env, &mut b, &second, 2);
    ack(&b, &second);
}

/// Connecting where nothing listens is refused by the passive side's CM
/// (a REJ without consumer data); connecting to an address no device has
/// fails.
pub fn cm_connect_without_listener_is_refused(env: &Env) {
    let server = host(env);
    // A port that was just free: listen on it, then stop.
    let port = env
        .cm
        .listen(SocketAddr::from((env.ip, 0)))
        .unwrap_or_else(|e| panic!("listen: {e}"))
        .port();
    let refused = env.cm.connect(request(env, &server, port, &[], deadline()));
    assert_eq!(expect_rejected(refused), [0u8; REJ_PRIVATE_DATA_LEN]);
    let mut nowhere = request(env, &server, port, &[], deadline());
    nowhere.addr = SocketAddr::from((NOWHERE, port));
    assert!(
        env.cm.connect(nowhere).is_err(),
        "connecting to an address no device has"
    );
}

/// `next_event` returns `None` at its deadline, and at once after `wake`
/// (called before or during the wait).
pub fn cm_listener_wake_and_deadline(env: &Env) {
    let listener = env
        .cm
        .listen(SocketAddr::from((env.ip, 0)))
        .unwrap_or_else(|e| panic!("listen: {e}"));
    let event = |until| {
        listener
            .next_event(until)
            .unwrap_or_else(|e| panic!("next_event: {e}"))
    };
    assert!(event(Instant::now()).is_none(), "the deadline");
    listener.wake();
    let before = Instant::now();
    assert!(event(deadline()).is_none(), "woken before the wait");
    assert!(before.elapsed() < super::PATIENCE, "at once");
    thread::scope(|s| {
        let waiting = s.spawn(|| listener.next_event(deadline()));
        listener.wake();
        let got = waiting
            .join()
            .unwrap_or_else(|_| panic!("the waiting thread panicked"))
            .unwrap_or_else(|e| panic!("next_event: {e}"));
        assert!(got.is_none(), "woken while waiting");
    });
}

/// Listeners bind the device's address: port 0 picks a free ephemeral
/// port, a given port is used as is, a port in use is refused, and an
/// address no device has cannot be bound.
pub fn cm_listen_binds_addresses_and_ports(env: &Env) {
    let listen = |ip, port| env.cm.listen(SocketAddr::from((ip, port)));
    let one = listen(env.ip, 0).unwrap_or_else(|e| panic!("listen: {e}"));
    let two = listen(env.ip, 0).unwrap_or_else(|e| panic!("listen: {e}"));
    for port in [one.port(), two.port()] {
        assert!(EPHEMERAL_PORTS.contains(&port), "ephemeral port {port}");
    }
    assert_ne!(one.port(), two.port());
    let taken = err_of(listen(env.ip, two.port()), "a port in use");
    assert!(taken.to_string().contains("in use"), "{taken}");
    let fixed = listen(env.ip, 4791).unwrap_or_else(|e| panic!("listen on 4791: {e}"));
    assert_eq!(fixed.port(), 4791);
    assert!(listen(NOWHERE, 0).is_err(), "an address no device has");
}
