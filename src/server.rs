//! The server's side of the connection protocol (`docs/protocol.md`), over
//! the platform traits: what an RDMA-enabled S3 server does with a client's
//! `0x02` token. The S3 test servers, the benchmarks and
//! `hipobj-s3-server` are built on it.
//!
//! For each token it finds its established connection to the client QP the
//! token names, or connects to the client's listener with the token as
//! proof; moves the bytes with RDMA WRITEs (GET) or READs (PUT); then sends
//! the zero-length SEND with immediate carrying the transfer's secret, and
//! waits for its completion, before the S3 reply may be sent.
//!
//! A failed transfer's connection is disconnected and forgotten, and the
//! server's buffer is reported free only once no WRITE or READ on it can
//! still be running. Shutting the server side down (or dropping it)
//! disconnects every connection, so no client QP is left connected to it.
//!
//! The steps are public on their own so that tests can play a server that
//! breaks the protocol on purpose.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::core::nic::ip_of;
use crate::core::protocol::{decode_reject, final_imm, ConnectData};
use crate::core::token::{Token, Transport};
use crate::core::{Error, Result};
use crate::platform::{
    Cm, CmConnection, ConnectOutcome, ConnectRequest, Context, Cq, Gid, Mr, Pd, Qp, QpCaps, SendOp,
    SendWr, Sge, WcStatus,
};

/// The client QP a token names, as a connection's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientQp {
    /// The client's GID.
    pub gid: Gid,
    /// Its QP number.
    pub qp_num: u32,
    /// Its listener's port.
    pub port: u16,
}

impl ClientQp {
    /// The key of the QP `token` names.
    pub fn of(token: &Token) -> ClientQp {
        ClientQp {
            gid: token.gid,
            qp_num: token.qp_num,
            port: token.lid,
        }
    }
}

/// One established connection to a client QP.
pub struct ServerConn {
    /// The CM connection (active side, which owns the QP).
    pub cm: Arc<dyn CmConnection>,
    /// Its QP.
    pub qp: Arc<dyn Qp>,
    /// Its completion queue.
    pub cq: Arc<dyn Cq>,
    /// The nonce sent in the connect request.
    pub nonce: u32,
    /// Transfers completed on it.
    pub seq: u32,
}

/// The server's memory a transfer reads from or writes to.
#[derive(Clone)]
pub struct LocalBuf {
    /// Its registration.
    pub mr: Arc<dyn Mr>,
    /// First byte.
    pub addr: u64,
}

/// Which way a transfer goes, from the client's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The client reads the object: the server WRITEs into its buffer.
    Get,
    /// The client writes the object: the server READs its buffer.
    Put,
}

/// QP capacities of server connections.
const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 4,
    max_send_sge: 1,
    max_recv_sge: 1,
};

/// How long a failed transfer waits, after its connection was moved to
/// ERR, for the flush completion of a WRITE or READ still outstanding: the
/// proof that the NIC no longer touches the server's buffer.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Work request id of a transfer's data (the WRITE or READ).
const DATA_WR: u64 = 1;
/// Work request id of a transfer's final message.
const FINAL_WR: u64 = 2;

/// A transfer that failed ([`ServerSide::transfer`]).
#[derive(Debug)]
pub struct TransferFailure {
    /// What went wrong.
    pub error: Error,
    /// Whether the server's buffer is free again: no WRITE or READ on it is
    /// outstanding. When `false` (the flush did not arrive), the NIC may
    /// still read or write it, so its owner must not reuse or free it.
    pub local_quiet: bool,
}

impl std::fmt::Display for TransferFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// A work request that did not complete successfully.
struct WrFailure {
    error: Error,
    /// Posted, and no completion seen: still on the send queue.
    outstanding: bool,
}

/// One entry of the connection map: the connection, and its CM id beside
/// it, so that checking or disconnecting it never waits for the transfer
/// that holds the connection's lock.
struct Slot {
    conn: Arc<Mutex<ServerConn>>,
    cm: Arc<dyn CmConnection>,
}

/// The server side of one NIC.
///
/// Thread-safe: any number of threads serve transfers at once. The map of
/// connections is locked only to look up, insert or remove; each connection
/// has its own lock, held by the one transfer using it, and every wait
/// (for that lock, the CM, a completion) ends at the transfer's deadline.
/// A failed transfer's connection is disconnected and forgotten;
/// [`ServerSide::shutdown`] (and dropping the server side) disconnects every
/// connection, and no new one is made after it.
pub struct ServerSide {
    cm: Arc<dyn Cm>,
    ctx: Arc<dyn Context>,
    pd: Arc<dyn Pd>,
    conns: Mutex<HashMap<ClientQp, Slot>>,
    closed: AtomicBool,
    /// When connections whose client disconnected were last forgotten.
    last_sweep: Mutex<Instant>,
    /// `conn_param.retry_count`: finite, so failures surface (7 would retry
    /// forever on Soft-RoCE).
    pub retry_count: u8,
    /// Pause between the data and the final message of every transfer
    /// ([`ServerSide::transfer`]); zero unless a test wants a window in
    /// which the data has moved and the transfer has not ended.
    pub delay_before_final: Duration,
}

impl ServerSide {
    /// A server side on `ctx` / `pd`.
    pub fn new(cm: Arc<dyn Cm>, ctx: Arc<dyn Context>, pd: Arc<dyn Pd>) -> ServerSide {
        ServerSide {
            cm,
            ctx,
            pd,
            conns: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            last_sweep: Mutex::new(Instant::now()),
            retry_count: 6,
            delay_before_final: Duration::ZERO,
        }
    }

    /// The protection domain, for registering the server's memory.
    pub fn pd(&self) -> &Arc<dyn Pd> {
        &self.pd
    }

    /// Serves one transfer of the token's whole length: the whole
    /// protocol. On any failure the connection is dropped (disconnected),
    /// as the client drops its side.
    pub fn serve(&self, token: &Token, op: Op, local: &LocalBuf, deadline: Instant) -> Result<()> {
        self.transfer(token, op, local, token.length, deadline)
            .map_err(|f| f.error)
    }

    /// Serves one transfer of `len` bytes (at most the token's length)
    /// between `local` and the start of the client's range: finds or makes
    /// the connection, WRITEs (GET) or READs (PUT) and waits for it, sends
    /// the final message and waits for it. Only after `Ok` may the S3 reply
    /// be sent.
    ///
    /// On failure the connection is disconnected and forgotten, and an
    /// outstanding WRITE or READ is waited for (its flush, for at most 2 s);
    /// [`TransferFailure::local_quiet`] says whether `local` is free again.
    pub fn transfer(
        &self,
        token: &Token,
        op: Op,
        local: &LocalBuf,
        len: u64,
        deadline: Instant,
    ) -> std::result::Result<(), TransferFailure> {
        let quiet = |error| TransferFailure {
            error,
            local_quiet: true,
        };
        if len > token.length {
            return Err(quiet(Error::InvalidValue(
                "transfer longer than the token's range",
            )));
        }
        let len = u32::try_from(len)
            .map_err(|_| quiet(Error::InvalidValue("transfer larger than 4 GiB - 1")))?;
        self.sweep();
        let conn = self.connection(token, deadline).map_err(quiet)?;
        let Some(mut guard) = conn.try_lock_until(deadline) else {
            return Err(quiet(Error::Rdma(
                "the connection to this client QP stayed busy until the deadline".into(),
            )));
        };
        let outcome = post_wait(&guard, data_wr(token, op, local, len), deadline).and_then(|()| {
            if !self.delay_before_final.is_zero() {
                std::thread::sleep(self.delay_before_final.min(remaining(deadline)));
            }
            let imm = final_imm(guard.nonce, guard.seq);
            post_wait(&guard, final_wr(imm), deadline).map_err(|f| WrFailure {
                // The final message carries no data: the buffer is quiet.
                outstanding: false,
                ..f
            })
        });
        match outcome {
            Ok(()) => {
                guard.seq = guard.seq.wrapping_add(1);
                Ok(())
            }
            Err(failure) => {
                self.drop_this(&ClientQp::of(token), &conn, &guard.cm);
                // Disconnected, the QP is in ERR: an outstanding WRITE or
                // READ is flushed, unless the disconnect failed.
                let local_quiet = !failure.outstanding
                    || matches!(
                        crate::platform::wait_for_completion(
                            &*guard.cq,
                            DATA_WR,
                            Instant::now() + QUIESCE_TIMEOUT
                        ),
                        Ok(Some(_))
                    );
                Err(TransferFailure {
                    error: failure.error,
                    local_quiet,
                })
            }
        }
    }

    /// The established connection to the QP `token` names, or a new one.
    /// Fails after [`ServerSide::shutdown`].
    pub fn connection(&self, token: &Token, deadline: Instant) -> Result<Arc<Mutex<ServerConn>>> {
        if token.transport != Transport::RcCm {
            return Err(Error::InvalidValue(
                "not a 0x02 token: this server connects through RDMA CM",
            ));
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Rdma("the server side is shut down".into()));
        }
        let key = ClientQp::of(token);
        // Bound first: the map's guard must not live into the branch below.
        let existing = self
            .conns
            .lock()
            .get(&key)
            .map(|s| (s.conn.clone(), s.cm.clone()));
        if let Some((conn, cm)) = existing {
            if !cm.is_disconnected() {
                return Ok(conn);
            }
            self.drop_this(&key, &conn, &cm);
        }
        let nonce = random_u32();
        let data = ConnectData {
            token: *token,
            nonce,
        }
        .encode();
        let made = self.connect_with(token, &data, nonce, deadline)?;
        let cm = made.cm.clone();
        let conn = Arc::new(Mutex::new(made));
        let replaced = {
            let mut conns = self.conns.lock();
            // Checked under the map's lock: shutdown sets the flag before it
            // empties the map, so a connection is either seen by shutdown or
            // refused here.
            if self.closed.load(Ordering::SeqCst) {
                drop(conns);
                let _ = cm.disconnect();
                return Err(Error::Rdma("the server side is shut down".into()));
            }
            conns.insert(
                key,
                Slot {
                    conn: conn.clone(),
                    cm,
                },
            )
        };
        if let Some(old) = replaced {
            let _ = old.cm.disconnect();
        }
        Ok(conn)
    }

    /// Connects to the listener `token` names with `private_data` as the
    /// connect request's.
    pub fn connect_with(
        &self,
        token: &Token,
        private_data: &[u8],
        nonce: u32,
        deadline: Instant,
    ) -> Result<ServerConn> {
        let cq = self.ctx.create_cq(32)?;
        let addr = SocketAddr::new(ip_of(&token.gid), token.lid);
        let outcome = self.cm.connect(ConnectRequest {
            addr,
            pd: &self.pd,
            cq: &cq,
            caps: CAPS,
            private_data,
            initiator_depth: 1,
            responder_resources: 1,
            retry_count: self.retry_count,
            rnr_retry_count: 7,
            deadline,
        })?;
        match outcome {
            ConnectOutcome::Established(cm) => {
                let qp = cm
                    .qp()
                    .ok_or_else(|| Error::Internal("the active side has no QP".into()))?;
                Ok(ServerConn {
                    cm,
                    qp,
                    cq,
                    nonce,
                    seq: 0,
                })
            }
            ConnectOutcome::Rejected { private_data } => {
                Err(Error::Rdma(match decode_reject(&private_data) {
                    Some(reason) => format!("the client rejected the connection: {reason:?}"),
                    None => format!(
                        "the connection to {addr} was rejected without a hipobj reason \
                         (nothing listening there?)"
                    ),
                }))
            }
        }
    }

    /// Disconnects and forgets the connection to `key`. Does not wait for a
    /// transfer using it: that transfer fails (its QP is in ERR).
    pub fn drop_connection(&self, key: &ClientQp) {
        let removed = self.conns.lock().remove(key);
        if let Some(slot) = removed {
            let _ = slot.cm.disconnect();
        }
    }

    /// Disconnects `cm`, the CM id of `conn`, and forgets `conn` if the map
    /// still holds it for `key` (and not a newer connection).
    fn drop_this(&self, key: &ClientQp, conn: &Arc<Mutex<ServerConn>>, cm: &Arc<dyn CmConnection>) {
        {
            let mut conns = self.conns.lock();
            if conns.get(key).is_some_and(|s| Arc::ptr_eq(&s.conn, conn)) {
                conns.remove(key);
            }
        }
        let _ = cm.disconnect();
    }

    /// Forgets connections whose client disconnected (or that failed),
    /// releasing their QPs. Never waits for a transfer in progress.
    pub fn forget_disconnected(&self) {
        let gone: Vec<Slot> = {
            let mut conns = self.conns.lock();
            let keys: Vec<ClientQp> = conns
                .iter()
                .filter(|(_, s)| s.cm.is_disconnected())
                .map(|(k, _)| *k)
                .collect();
            keys.iter().filter_map(|k| conns.remove(k)).collect()
        };
        drop(gone);
    }

    /// [`ServerSide::forget_disconnected`], at most once per
    /// [`SWEEP_INTERVAL`]: clients disconnect idle connections, and a busy
    /// server must not keep their QPs.
    fn sweep(&self) {
        {
            let mut last = self.last_sweep.lock();
            if last.elapsed() < SWEEP_INTERVAL {
                return;
            }
            *last = Instant::now();
        }
        self.forget_disconnected();
    }

    /// Established connections.
    pub fn connection_count(&self) -> usize {
        self.conns.lock().len()
    }

    /// Disconnects every connection and refuses new ones. Transfers in
    /// progress fail (their QPs are in ERR). Idempotent; dropping the
    /// server side does it too.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Slot> = self.conns.lock().drain().map(|(_, s)| s).collect();
        for slot in &all {
            if let Err(e) = slot.cm.disconnect() {
                let _ = writeln!(
                    std::io::stderr(),
                    "hipobj: server connection {}: {e}",
                    slot.cm.id()
                );
            }
        }
    }

    /// Whether [`ServerSide::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The data of one transfer: WRITEs for a GET, READs for a PUT, of the
    /// token's whole length, waited for (a READ must complete before the
    /// final message says the bytes are here).
    pub fn move_data(
        &self,
        conn: &ServerConn,
        token: &Token,
        op: Op,
        local: &LocalBuf,
        deadline: Instant,
    ) -> Result<()> {
        let len = u32::try_from(token.length)
            .map_err(|_| Error::InvalidValue("transfer larger than 4 GiB - 1"))?;
        post_wait(conn, data_wr(token, op, local, len), deadline).map_err(|f| f.error)
    }

    /// The final message: a zero-length SEND with immediate, waited for.
    pub fn send_final(&self, conn: &ServerConn, imm: u32, deadline: Instant) -> Result<()> {
        post_wait(conn, final_wr(imm), deadline).map_err(|f| f.error)
    }
}

impl Drop for ServerSide {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often a transfer first forgets connections the clients ended.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The WRITE (GET) or READ (PUT) of `len` bytes between `local` and the
/// start of the token's range.
fn data_wr(token: &Token, op: Op, local: &LocalBuf, len: u32) -> SendWr {
    let op = match op {
        Op::Get => SendOp::Write {
            remote_addr: token.addr,
            rkey: token.rkey,
        },
        Op::Put => SendOp::Read {
            remote_addr: token.addr,
            rkey: token.rkey,
        },
    };
    SendWr {
        wr_id: DATA_WR,
        op,
        sge: Some(Sge {
            addr: local.addr,
            len,
            lkey: local.mr.lkey(),
        }),
        signaled: true,
    }
}

/// The final message: a zero-length SEND with immediate `imm`.
fn final_wr(imm: u32) -> SendWr {
    SendWr {
        wr_id: FINAL_WR,
        op: SendOp::SendImm { imm },
        sge: None,
        signaled: true,
    }
}

/// Posts `wr` on the connection and waits for its completion.
fn post_wait(
    conn: &ServerConn,
    wr: SendWr,
    deadline: Instant,
) -> std::result::Result<(), WrFailure> {
    let wr_id = wr.wr_id;
    conn.qp.post_send(&[wr]).map_err(|error| WrFailure {
        error,
        outstanding: false,
    })?;
    match crate::platform::wait_for_completion(&*conn.cq, wr_id, deadline) {
        Ok(Some(c)) if c.status == WcStatus::Success => Ok(()),
        Ok(Some(c)) => Err(WrFailure {
            error: Error::Rdma(format!("server work request {wr_id}: {:?}", c.status)),
            outstanding: false,
        }),
        Ok(None) => Err(WrFailure {
            error: Error::Rdma(format!(
                "server work request {wr_id}: no completion before the deadline"
            )),
            outstanding: true,
        }),
        Err(error) => Err(WrFailure {
            error,
            outstanding: true,
        }),
    }
}

/// Time left until `deadline` (zero once it passed).
fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A nonce: not secret, only different per connection.
fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos().try_into().unwrap_or(0));
    let v = h.finish().to_le_bytes();
    u32::from_le_bytes([v[0], v[1], v[2], v[3]])
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::core::args::{BufferRange, Slice, TokenOp};
    use crate::core::{Config, Current};
    use crate::platform::{Access, QpState};
    use crate::testing::world::{World, SERVER_NIC};

    const LEN: usize = 4096;

    /// A client instance on the fake fabric with one registered host
    /// buffer, and a server side of its own on the world's server device.
    struct Setup {
        /// Keeps the fabric (and the client's platform) alive.
        _world: World,
        current: Current,
        client: Box<[u8]>,
        side: Arc<ServerSide>,
        local: LocalBuf,
        server: Box<[u8]>,
    }

    impl Setup {
        fn new() -> Setup {
            let world = World::new();
            let current = Current::new();
            let options = crate::core::Options {
                max_transfers: 4,
                ..crate::core::Options::default()
            };
            let config = Config {
                gpu_device: 0,
                ..Config::default()
            };
            current
                .init_with(world.platform(), config, options)
                .expect("init on the fake platform");
            let client = vec![0xeeu8; LEN].into_boxed_slice();
            current
                .instance()
                .unwrap()
                .register(
                    BufferRange::new(client.as_ptr().expose_provenance(), LEN).unwrap(),
                    true,
                )
                .expect("client buffer registered");
            let fabric = &world.platform.fabric;
            let ctx = fabric.verbs(&[SERVER_NIC]).open(SERVER_NIC).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let mut server: Box<[u8]> = (0..LEN).map(|i| i.to_le_bytes()[0] ^ 0x5a).collect();
            let mr = pd
                .reg_mr(
                    server.as_mut_ptr().expose_provenance(),
                    LEN,
                    Access::LOCAL_WRITE,
                )
                .unwrap();
            let local = LocalBuf {
                addr: mr.addr(),
                mr,
            };
            let side = Arc::new(ServerSide::new(fabric.cm(&[SERVER_NIC]), ctx, pd));
            Setup {
                _world: world,
                current,
                client,
                side,
                local,
                server,
            }
        }

        /// A token for the whole client buffer (a lease of its own).
        fn token(&self, op: TokenOp) -> Token {
            let slice = Slice::new(self.client.as_ptr().expose_provenance(), LEN, 0).unwrap();
            self.current
                .instance()
                .unwrap()
                .mint_token(slice, op)
                .expect("a token")
        }

        fn deadline() -> Instant {
            Instant::now() + Duration::from_secs(5)
        }
    }

    /// Runs `f` on another thread; fails if it does not return in time
    /// (a wait on a lock held by this thread would never return).
    fn returns_in_time<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("returned without waiting for the busy connection")
    }

    #[test]
    fn a_transfer_shorter_than_its_token_moves_only_its_bytes() {
        let s = Setup::new();
        let token = s.token(TokenOp::Get);
        s.side
            .transfer(&token, Op::Get, &s.local, 100, Setup::deadline())
            .expect("the transfer");
        assert_eq!(&s.client[..100], &s.server[..100]);
        assert!(
            s.client[100..].iter().all(|&b| b == 0xee),
            "past its length"
        );
        let longer = s
            .side
            .transfer(
                &token,
                Op::Get,
                &s.local,
                token.length + 1,
                Setup::deadline(),
            )
            .expect_err("longer than the token");
        assert!(matches!(longer.error, Error::InvalidValue(_)));
        assert!(longer.local_quiet);
    }

    #[test]
    fn a_failed_transfer_drops_its_connection_and_reports_the_buffer_free() {
        let s = Setup::new();
        // A GET's token grants remote write only: reading it fails at the
        // client's NIC.
        let token = s.token(TokenOp::Get);
        let conn = s.side.connection(&token, Setup::deadline()).unwrap();
        let failure = s
            .side
            .transfer(&token, Op::Put, &s.local, token.length, Setup::deadline())
            .expect_err("a READ of a GET's range");
        assert!(matches!(failure.error, Error::Rdma(_)), "{failure}");
        assert!(failure.local_quiet, "the READ completed (in error)");
        assert_eq!(s.side.connection_count(), 0);
        let conn = conn.lock();
        assert!(conn.cm.is_disconnected());
        assert_eq!(conn.qp.state().unwrap(), QpState::Err);
    }

    #[test]
    fn shutdown_disconnects_every_connection_and_refuses_new_ones() {
        let s = Setup::new();
        let tokens = [s.token(TokenOp::Get), s.token(TokenOp::Get)];
        assert_ne!(tokens[0].qp_num, tokens[1].qp_num, "two leases, two QPs");
        let conns: Vec<_> = tokens
            .iter()
            .map(|t| {
                s.side
                    .serve(t, Op::Get, &s.local, Setup::deadline())
                    .unwrap();
                s.side.connection(t, Setup::deadline()).unwrap()
            })
            .collect();
        assert_eq!(s.side.connection_count(), 2);
        s.side.shutdown();
        assert!(s.side.is_shut_down());
        assert_eq!(s.side.connection_count(), 0);
        for conn in &conns {
            let conn = conn.lock();
            assert!(conn.cm.is_disconnected());
            assert_eq!(conn.qp.state().unwrap(), QpState::Err);
        }
        let third = s.token(TokenOp::Get);
        assert!(s
            .side
            .serve(&third, Op::Get, &s.local, Setup::deadline())
            .is_err());
        assert_eq!(s.side.connection_count(), 0, "no connection after shutdown");
    }

    #[test]
    fn dropping_the_server_side_disconnects_its_connections() {
        let s = Setup::new();
        let token = s.token(TokenOp::Get);
        s.side
            .serve(&token, Op::Get, &s.local, Setup::deadline())
            .unwrap();
        let conn = s.side.connection(&token, Setup::deadline()).unwrap();
        let Setup { side, local, .. } = s;
        drop(local);
        drop(side);
        let conn = conn.lock();
        assert!(conn.cm.is_disconnected());
        assert_eq!(conn.qp.state().unwrap(), QpState::Err);
    }

    #[test]
    fn a_busy_connection_blocks_neither_the_map_nor_a_transfer_past_its_deadline() {
        let s = Setup::new();
        let token = s.token(TokenOp::Get);
        s.side
            .serve(&token, Op::Get, &s.local, Setup::deadline())
            .unwrap();
        let conn = s.side.connection(&token, Setup::deadline()).unwrap();
        let held = conn.lock();
        let side = s.side.clone();
        let local = s.local.clone();
        let failure = returns_in_time(move || {
            side.transfer(
                &token,
                Op::Get,
                &local,
                token.length,
                Instant::now() + Duration::from_millis(50),
            )
        })
        .expect_err("the connection is held");
        assert!(failure.local_quiet, "nothing was posted: {failure}");
        let side = s.side.clone();
        let count = returns_in_time(move || {
            side.forget_disconnected();
            let count = side.connection_count();
            side.drop_connection(&ClientQp::of(&token));
            side.shutdown();
            count
        });
        assert_eq!(count, 1);
        assert!(held.cm.is_disconnected(), "disconnected while held");
        drop(held);
    }
}
