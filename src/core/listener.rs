//! The RDMA CM listener: where servers connect to the client's pool QPs.
//!
//! One background thread per instance waits on the listener's event channel
//! and, for each connect request, checks that it names a pool QP whose
//! transfer is waiting and that it carries that transfer's exact token, then
//! moves the existing QP to RTR and RTS with every attribute the CM chose
//! and accepts with that QP's number. It also resets connections whose
//! server disconnected and closes connections left idle too long.
//!
//! Order matters on real hardware (see `docs/protocol.md`): the receive is
//! posted and the QP is in RTS before `rdma_accept`, since the server may
//! write as soon as its side is established.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{Error, Result};
use super::pool::{disconnect, Connection, ConnectionPool, Link, Peer, Waiting};
use super::protocol::{encode_reject, ConnectData, RejectReason};
use super::token::Transport;
use crate::platform::{AcceptParams, CmEvent, CmListener, CmRequest, Gid, QpAttr, QpState, RecvWr};

/// `min_rnr_timer` for our QPs: 1 (0.01 ms). The CM's 0 means 655 ms per
/// receiver-not-ready NAK (lab CMTEST P9/P10).
pub const MIN_RNR_TIMER: u8 = 1;
/// `rnr_retry_count` in `rdma_accept`, which becomes the server QP's
/// `rnr_retry`: 7 retries receiver-not-ready forever (IB spec), so a final
/// message that races its receive waits instead of failing.
pub const ACCEPT_RNR_RETRY: u8 = 7;
/// How long the listener waits for a memory-window bind or invalidation.
const WINDOW_TIMEOUT: Duration = Duration::from_secs(1);
/// Consecutive event errors after which the thread gives up.
const MAX_EVENT_ERRORS: u32 = 64;

struct Shared {
    pool: Arc<ConnectionPool>,
    cm: Arc<dyn CmListener>,
    stop: AtomicBool,
    idle_timeout: Duration,
}

/// The listener thread; stopped and joined on drop.
pub struct Listener {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Starts the thread serving `cm` for `pool`.
    pub fn start(
        pool: Arc<ConnectionPool>,
        cm: Arc<dyn CmListener>,
        idle_timeout: Duration,
    ) -> Result<Listener> {
        let shared = Arc::new(Shared {
            pool,
            cm,
            stop: AtomicBool::new(false),
            idle_timeout,
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("hipobj-listener".into())
                .spawn(move || run(&shared))
                .map_err(|e| Error::Internal(format!("cannot start the listener thread: {e}")))?
        };
        Ok(Listener {
            shared,
            thread: Some(thread),
        })
    }

    /// The port servers connect to.
    pub fn port(&self) -> u16 {
        self.shared.cm.port()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cm.wake();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                eprintln!("hipobj: the listener thread panicked");
            }
        }
    }
}

fn run(shared: &Shared) {
    let mut errors = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        let deadline = next_idle_check(shared);
        match shared.cm.next_event(deadline) {
            Ok(Some(event)) => {
                errors = 0;
                // A panic in one event must not end the thread for all.
                let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle(shared, event)
                }));
                if handled.is_err() {
                    eprintln!("hipobj: listener: panic while handling an event");
                }
            }
            Ok(None) => errors = 0,
            Err(e) => {
                errors += 1;
                eprintln!("hipobj: listener: {e}");
                if errors >= MAX_EVENT_ERRORS {
                    eprintln!("hipobj: listener: giving up after {errors} errors in a row");
                    return;
                }
            }
        }
        close_idle(shared);
    }
}

fn handle(shared: &Shared, event: CmEvent) {
    match event {
        CmEvent::ConnectRequest(request) => on_connect_request(shared, request),
        CmEvent::Established { .. } => {}
        CmEvent::Disconnected { conn } => on_disconnected(shared, conn),
    }
}

fn reject(request: Box<dyn CmRequest>, reason: RejectReason) {
    if let Err(e) = request.reject(&encode_reject(reason)) {
        eprintln!("hipobj: listener: rdma_reject: {e}");
    }
}

fn on_connect_request(shared: &Shared, request: Box<dyn CmRequest>) {
    let data = match ConnectData::decode(request.private_data()) {
        Ok(data) if data.token.transport == Transport::RcCm => data,
        Ok(_) => return reject(request, RejectReason::BadToken),
        Err(reason) => return reject(request, reason),
    };
    if shared.pool.is_closed() {
        return reject(request, RejectReason::ShuttingDown);
    }
    let Some(conn) = shared.pool.by_qp_num(data.token.qp_num).cloned() else {
        return reject(request, RejectReason::UnknownQp);
    };
    let (waiting, old) = {
        let mut state = conn.state.lock();
        let Some(waiting) = state.waiting.clone() else {
            drop(state);
            return reject(request, RejectReason::NotWaiting);
        };
        if waiting.token != data.token {
            drop(state);
            return reject(request, RejectReason::WrongToken);
        }
        if matches!(state.link, Link::Connecting) || state.erroring {
            drop(state);
            return reject(request, RejectReason::NotWaiting);
        }
        (
            waiting,
            std::mem::replace(&mut state.link, Link::Connecting),
        )
    };
    let port = shared.pool.port;
    let outcome = connect_qp(&conn, port, &*request, &waiting, old);
    let link = match outcome {
        Ok(gid) => {
            let params = AcceptParams {
                qp_num: conn.qp.qp_num(),
                responder_resources: request.responder_resources(),
                initiator_depth: request.initiator_depth(),
                rnr_retry_count: ACCEPT_RNR_RETRY,
            };
            match request.accept(params) {
                Ok(cm) => Link::Connected(Peer {
                    cm,
                    gid,
                    nonce: data.nonce,
                    seq: 0,
                    last_used: Instant::now(),
                }),
                Err(e) => {
                    eprintln!("hipobj: listener: rdma_accept: {e}");
                    back_to_init(&conn, port, waiting.recv_wr_id);
                    Link::Unconnected
                }
            }
        }
        Err(e) => {
            eprintln!("hipobj: listener: connecting QP {}: {e}", conn.qp.qp_num());
            reject(request, RejectReason::QpFailed);
            back_to_init(&conn, port, waiting.recv_wr_id);
            Link::Unconnected
        }
    };
    conn.state.lock().link = link;
    conn.settled.notify_all();
}

/// Moves `conn` to the requesting server: away from its old server first (if
/// any), then RTR and RTS with the CM's attributes. Returns the server's GID.
fn connect_qp(
    conn: &Connection,
    port: u8,
    request: &dyn CmRequest,
    waiting: &Waiting,
    old: Link,
) -> Result<Gid> {
    if let Link::Connected(peer) = old {
        // Re-aiming an RC QP: the transfer's window (bound through the old
        // connection) is invalidated while the QP can still do it, the old
        // server is disconnected, then the QP goes through RESET, which also
        // discards the posted receive.
        conn.invalidate_window(Instant::now() + WINDOW_TIMEOUT)?;
        disconnect(peer);
        conn.reset(port)?;
        conn.qp.post_recv(RecvWr {
            wr_id: waiting.recv_wr_id,
            sge: None,
        })?;
    }
    let mut rtr = request.init_qp_attr(QpState::Rtr)?;
    rtr.min_rnr_timer = Some(MIN_RNR_TIMER);
    rtr.access = Some(waiting.access);
    conn.qp.modify(&rtr)?;
    let rts = request.init_qp_attr(QpState::Rts)?;
    conn.qp.modify(&rts)?;
    // The token's rkey names a window: bound now, before the accept lets
    // the server use it.
    if let Some(plan) = &waiting.bind {
        plan.bind(conn, Instant::now() + WINDOW_TIMEOUT)?;
    }
    Ok(rtr.av.map(|av| av.dgid).unwrap_or_default())
}

/// After a failed connect: back to INIT with the transfer's receive posted,
/// so another server may still connect within the transfer's deadline.
fn back_to_init(conn: &Connection, port: u8, recv_wr_id: u64) {
    let result = conn.reset(port).and_then(|()| {
        conn.qp.post_recv(RecvWr {
            wr_id: recv_wr_id,
            sge: None,
        })
    });
    if let Err(e) = result {
        // The transfer will time out and its lease's reset retire the QP.
        eprintln!("hipobj: listener: resetting QP {}: {e}", conn.qp.qp_num());
    }
}

fn on_disconnected(shared: &Shared, id: u64) {
    let Some(conn) = shared
        .pool
        .slots()
        .iter()
        .find(|c| matches!(&c.state.lock().link, Link::Connected(p) if p.cm.id() == id))
    else {
        return;
    };
    if let Some(lease) = shared.pool.try_take(conn.index) {
        // Idle: answer the DREQ and make the QP ready for another server.
        lease.fail();
        return;
    }
    // Leased: a transfer may be waiting for this server's final message.
    // Moving the QP to ERR flushes the receive, which wakes it at once;
    // its lease then resets the QP. Checked again under the lock: the lease
    // may have reset the connection meanwhile, and then the QP must be left
    // alone. `erroring` keeps the lease off the QP until ERR is reached.
    {
        let mut state = conn.state.lock();
        let same = matches!(&state.link, Link::Connected(p) if p.cm.id() == id);
        if !same || state.erroring {
            return;
        }
        state.peer_gone = true;
        state.erroring = true;
    }
    if let Err(e) = conn.qp.modify(&QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    }) {
        eprintln!(
            "hipobj: listener: moving QP {} to ERR: {e}",
            conn.qp.qp_num()
        );
    }
    conn.state.lock().erroring = false;
    conn.settled.notify_all();
}

/// When the next idle connection expires (or a full idle period from now).
fn next_idle_check(shared: &Shared) -> Instant {
    let now = Instant::now();
    shared
        .pool
        .slots()
        .iter()
        .filter_map(|c| match &c.state.lock().link {
            Link::Connected(p) => Some(p.last_used + shared.idle_timeout),
            _ => None,
        })
        .min()
        .unwrap_or(now + shared.idle_timeout)
        .max(now)
}

/// Disconnects free connections unused for the idle timeout.
fn close_idle(shared: &Shared) {
    let now = Instant::now();
    for conn in shared.pool.slots() {
        let expired = matches!(&conn.state.lock().link,
            Link::Connected(p) if p.last_used + shared.idle_timeout <= now);
        if expired {
            if let Some(lease) = shared.pool.try_take(conn.index) {
                lease.fail();
            }
        }
    }
}
