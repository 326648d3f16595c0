//! The server's side of the connection protocol (`docs/protocol.md`), over
//! the platform traits: what an RDMA-enabled S3 server does with a client's
//! `0x02` token. The S3 test servers, the benchmarks and
//! `hipobj-s3-server` are built on it.
//!
//! A transfer (`ServerSide::begin`, then `Session::write` or
//! `Session::read`, then `Session::finish`):
//!
//! 1. checks the token and the dial policy: the client's address must be
//!    one this server may dial (`DialPolicy`);
//! 2. proves it holds the token before the client grants anything: on the
//!    connection it has to the QP the token names, by SENDing the token
//!    and waiting for the client's grant (a SEND with immediate derived
//!    from the token's secret); with no connection, or when that proof
//!    fails, by connecting to the client's listener with the token as the
//!    connect request's private data (the accept is the grant);
//! 3. moves the bytes in WRITEs (GET) or READs (PUT) of at most the
//!    device's `max_msg_sz` (and 1 GiB) each, a few in flight;
//! 4. sends the final message (a zero-length SEND with immediate derived
//!    from the secret) and waits for it, before the S3 reply may go out.
//!
//! Connections are kept per tenant (the S3 principal a request is signed
//! by, or any id the caller chooses: `Requester`): a transfer is proved
//! in-band only on a connection its own tenant made, so one tenant's bogus
//! token never reaches another tenant's connection (whose client would
//! drop it). Connections, dials in progress included, are bounded in all
//! and per tenant and client address; an idle one is closed to make room.
//! A dial has a deadline of its own, short beside the transfer's (a CM
//! handshake takes milliseconds). A failed transfer's connection is
//! disconnected and forgotten, and the server's buffer is reported free only once no WRITE
//! or READ on it can still be running. Shutting the server side down (or
//! dropping it) disconnects every connection.
//!
//! The lower steps are public so that tests can play a server that breaks
//! the protocol on purpose.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RawMutex};

use crate::core::nic::ip_of;
use crate::core::polling::Polling;
use crate::core::protocol::{
    decode_stripes, encode_connect, encode_connect_v, encode_proof, encode_proof_v, final_imm,
    grant_imm, is_refusal, Share, FINAL_DATA_LEN, MAX_STRIPES, NEWEST, PROOF_LEN, STRIPES_MAX_LEN,
    VERSION, VERSION_3, VERSION_4,
};
use crate::core::token::{Token, Transport};
use crate::error::{Error, Result};
use crate::platform::{
    Access, Cm, CmConnection, Completion, ConnectOutcome, ConnectRequest, Context, Cq, Gid, Mr, Pd,
    Qp, QpCaps, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
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

/// Who a transfer is for, and where its request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requester<'a> {
    /// The tenant: the S3 principal (the access key of the request's SigV4
    /// identity), or any id the caller chooses. Connections a tenant's
    /// transfers made serve only that tenant's later transfers, and the
    /// per-client limit is counted per tenant.
    pub tenant: &'a str,
    /// The HTTP request's source address (`None`: unknown).
    pub source: Option<IpAddr>,
}

impl Requester<'_> {
    /// The one tenant of [`ServerSide::begin`] and [`ServerSide::transfer`]
    /// (the empty id), from `source`.
    pub fn anyone(source: Option<IpAddr>) -> Requester<'static> {
        Requester { tenant: "", source }
    }
}

/// A kept connection's key: its tenant and the client QP.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ConnKey {
    tenant: Arc<str>,
    qp: ClientQp,
}

/// Bytes of a connection's send buffer: room for an in-band proof.
const PROOF_BUF_LEN: usize = 64;

/// One established connection to a client QP.
pub struct ServerConn {
    /// The CM connection (active side, which owns the QP).
    pub cm: Arc<dyn CmConnection>,
    /// Its QP.
    pub qp: Arc<dyn Qp>,
    /// Its completion queue.
    pub cq: Arc<dyn Cq>,
    /// The protocol version its proofs and final messages are written in:
    /// the version of the connect request that made it (a client that
    /// refused a version is sent the one below).
    pub version: u8,
    /// Where an in-band proof is written before it is sent (local only).
    proof: Box<[AtomicU8]>,
    proof_mr: Arc<dyn Mr>,
    /// Where a version-3 grant's plan arrives.
    grant: Box<[AtomicU8]>,
    grant_mr: Arc<dyn Mr>,
    next_wr: u64,
    /// When its last transfer ended.
    pub last_used: Instant,
    /// How long it polls for a completion before it sleeps (the side's).
    polling: Arc<Steps>,
    /// The side's count of sleeps.
    sleeps: Arc<AtomicU64>,
}

impl ServerConn {
    /// A fresh work request id on this connection.
    pub fn next_wr(&mut self) -> u64 {
        self.next_wr += 1;
        self.next_wr
    }

    /// The final message of a transfer through the client's window `rkey`,
    /// signaled (its completion says the client has everything before
    /// it), in this connection's version: in version 4 a SEND with
    /// invalidate of that window; before, a zero-length SEND with `imm`.
    pub fn final_wr(&mut self, imm: u32, rkey: u32) -> SendWr {
        let invalidate = (self.version >= VERSION_4).then_some(rkey);
        self.final_wr_as(imm, invalidate)
    }

    /// The final message in the form given, whatever the connection's
    /// version: with `invalidate`, a SEND with invalidate of that rkey
    /// whose data is `imm` (little-endian, written behind the proof in the
    /// proof's buffer: a repeated proof still reads its own bytes); without,
    /// a zero-length SEND with `imm`.
    pub fn final_wr_as(&mut self, imm: u32, invalidate: Option<u32>) -> SendWr {
        let wr_id = self.next_wr();
        let Some(rkey) = invalidate else {
            return SendWr {
                wr_id,
                op: SendOp::SendImm { imm },
                sge: None,
                signaled: true,
            };
        };
        let data = &self.proof[PROOF_LEN..PROOF_LEN + FINAL_DATA_LEN];
        for (slot, b) in data.iter().zip(imm.to_le_bytes()) {
            slot.store(b, Ordering::Release);
        }
        SendWr {
            wr_id,
            op: SendOp::SendInv { rkey },
            sge: Some(Sge {
                addr: data.as_ptr().expose_provenance() as u64,
                len: u32::try_from(FINAL_DATA_LEN).unwrap_or(0),
                lkey: self.proof_mr.lkey(),
            }),
            signaled: true,
        }
    }
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

/// Where the server side may connect: a token names the client's address,
/// and a server that dials whatever a token says is a confused deputy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DialPolicy {
    /// The HTTP request's own source address may be dialed.
    pub request_source: bool,
    /// Networks that may be dialed (the fabric's subnets).
    pub allow: Vec<ipnet::IpNet>,
}

impl DialPolicy {
    /// Only the address the S3 request came from.
    pub fn request_source() -> DialPolicy {
        DialPolicy {
            request_source: true,
            allow: Vec::new(),
        }
    }

    /// Any address: for tests and benchmarks that play both sides.
    pub fn any() -> DialPolicy {
        DialPolicy {
            request_source: false,
            allow: vec![
                "0.0.0.0/0".parse().expect("a network"),
                "::/0".parse().expect("a network"),
            ],
        }
    }

    /// Whether `client` may be dialed for a request from `source`.
    pub fn permits(&self, client: IpAddr, source: Option<IpAddr>) -> bool {
        let canonical = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let client = canonical(client);
        (self.request_source && source.map(canonical) == Some(client))
            || self.allow.iter().any(|net| net.contains(&client))
    }
}

/// How a server side behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where it may connect.
    pub dial: DialPolicy,
    /// Connections held at most, to all clients, dials in progress
    /// included.
    pub max_connections: usize,
    /// Connections held at most for one tenant to one client address,
    /// dials in progress included.
    pub max_connections_per_client: usize,
    /// How long a dial (the CM connect) may take, within the transfer's
    /// deadline: a client whose CM does not answer holds the transfer this
    /// long, not until its deadline. `None`: by device
    /// (`core::options::connect_timeout_for`: 2 s on a hardware NIC, the
    /// transfer's deadline alone on a software one, whose CM messages wait
    /// behind the data on the same CPUs).
    pub connect_timeout: Option<Duration>,
    /// `conn_param.retry_count`: finite, so failures surface (7 would
    /// retry forever on Soft-RoCE).
    pub retry_count: u8,
    /// How long the proof on an established connection may take before
    /// the server connects afresh instead.
    pub proof_timeout: Duration,
    /// Pause between the data and the final message of every transfer;
    /// zero unless a test wants a window in which the data has moved and
    /// the transfer has not ended.
    pub delay_before_final: Duration,
    /// How long a transfer polls for its next completion before it sleeps
    /// (`None`: by device, as the client library decides:
    /// `core::options::poll_for`).
    pub poll: Option<Duration>,
    /// The highest protocol version it speaks: 4 ends transfers with a
    /// SEND with invalidate, 3 offers clients striping (a client that
    /// refuses a version is connected again with the one below and
    /// remembered); 2 behaves as servers before them.
    pub protocol: u8,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            dial: DialPolicy::request_source(),
            max_connections: 4096,
            max_connections_per_client: 1024,
            connect_timeout: None,
            retry_count: 6,
            proof_timeout: Duration::from_secs(2),
            delay_before_final: Duration::ZERO,
            poll: None,
            protocol: NEWEST,
        }
    }
}

/// QP capacities of server connections.
const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 4,
    max_send_sge: 1,
    max_recv_sge: 1,
};
/// Data work requests in flight at most on one connection.
const DATA_IN_FLIGHT: usize = 8;

/// The largest work request this side posts, whatever the device's
/// `max_msg_sz`: ConnectX devices' own limit. rxe advertises 2 GiB, but a
/// 3 GiB PUT READ in chunks of 2 GiB never completed on the lane, where
/// chunks of 1 GiB do.
const MAX_WR_BYTES: u64 = 1 << 30;

/// How long a failed transfer waits, after its connection was moved to
/// ERR, for the flush completions of WRITEs or READs still outstanding:
/// the proof that the NIC no longer touches the server's buffer.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);

/// How a transfer's token was proven to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proven {
    /// In the connect request of a new connection.
    Connected,
    /// In-band, on the connection the server had to the client QP.
    OnItsConnection,
}

/// A transfer that failed.
#[derive(Debug)]
pub struct TransferFailure {
    /// What went wrong.
    pub error: Error,
    /// Whether the server's buffer is free again: no WRITE or READ on it is
    /// outstanding. When `false` (the flush did not arrive), the NIC may
    /// still read or write it, so its owner must not reuse or free it.
    pub local_quiet: bool,
}

impl TransferFailure {
    /// A failure that left the server's buffer free (no WRITE or READ on
    /// it outstanding).
    pub fn quiet(error: Error) -> TransferFailure {
        TransferFailure {
            error,
            local_quiet: true,
        }
    }
}

impl std::fmt::Display for TransferFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// One entry of the connection map: the connection, and its CM id beside
/// it, so that checking or disconnecting it never waits for the transfer
/// that holds the connection's lock.
struct Slot {
    conn: Arc<Mutex<ServerConn>>,
    cm: Arc<dyn CmConnection>,
    client: IpAddr,
}

/// The connections, and the dials in progress that count as connections
/// against the limits.
#[derive(Default)]
struct Conns {
    kept: HashMap<ConnKey, Slot>,
    /// Dials in progress, by tenant and client address.
    dialing: HashMap<(Arc<str>, IpAddr), usize>,
}

impl Conns {
    fn dials(&self) -> usize {
        self.dialing.values().sum()
    }
}

/// A dial in progress, counted against the limits until it is dropped.
struct Dial<'a> {
    side: &'a ServerSide,
    who: (Arc<str>, IpAddr),
}

impl Drop for Dial<'_> {
    fn drop(&mut self) {
        let mut conns = self.side.conns.lock();
        if let Some(n) = conns.dialing.get_mut(&self.who) {
            *n -= 1;
            if *n == 0 {
                conns.dialing.remove(&self.who);
            }
        }
    }
}

/// The server side of one NIC.
///
/// Thread-safe: any number of threads serve transfers at once. The map of
/// connections is locked only to look up, insert or remove; each connection
/// has its own lock, held by the one transfer using it, and every wait
/// (for that lock, the CM, a completion) ends at the transfer's deadline.
pub struct ServerSide {
    cm: Arc<dyn Cm>,
    ctx: Arc<dyn Context>,
    pd: Arc<dyn Pd>,
    conns: Mutex<Conns>,
    closed: AtomicBool,
    /// When connections whose client disconnected were last forgotten.
    last_sweep: Mutex<Instant>,
    /// The device's `max_msg_sz` (port 1), at most 1 GiB.
    max_msg_sz: u64,
    /// How long a transfer polls for a completion before it sleeps, while
    /// such polls pay (by step).
    polling: Arc<Steps>,
    /// Times a transfer slept for a completion ([`ServerSide::sleeps`]).
    sleeps: Arc<AtomicU64>,
    /// Clients (GID, listener port) that refused a connect request's
    /// version and took an older one: sent that one from then on.
    older: Mutex<HashMap<(Gid, u16), u8>>,
    /// How long a dial may take within its transfer's deadline
    /// ([`ServerConfig::connect_timeout`] for this device; `None`: the
    /// deadline alone).
    dial_limit: Option<Duration>,
    /// How it behaves.
    pub config: ServerConfig,
}

/// Clients remembered as speaking an older version; past it the memory
/// starts again (a client then costs a refused request more).
const OLDER_MEMORY: usize = 4096;

/// A transfer in progress ([`ServerSide::begin`]): the connection is
/// held, the token proved, the client's grant in. Dropped without
/// [`Session::finish`], the connection is disconnected (the client fails
/// the transfer and revokes its access).
pub struct Session<'a> {
    side: &'a ServerSide,
    key: ConnKey,
    conn: Arc<Mutex<ServerConn>>,
    guard: Option<Guard>,
    token: Token,
    deadline: Instant,
    proven: Proven,
    /// Bytes of the range the token's own connection moves: all of them,
    /// unless the client striped the transfer.
    own_len: u64,
    /// A striped transfer's other shares, in the range's order, each on
    /// its own connection, proved and granted.
    shares: Vec<ShareConn>,
}

type Guard = parking_lot::lock_api::ArcMutexGuard<RawMutex, ServerConn>;
/// A kept connection, shared through the map.
type Shared = Arc<Mutex<ServerConn>>;

/// One share of a striped transfer past the first, held by its session.
struct ShareConn {
    key: ConnKey,
    conn: Arc<Mutex<ServerConn>>,
    guard: Option<Guard>,
    /// The share, as the client's plan gives it.
    share: Share,
}

/// What is left to move on one connection of a session: `len` bytes at
/// `remote_addr` with `rkey`, from or into the local buffer at
/// `local_offset`.
#[derive(Clone, Copy, Default)]
struct Piece {
    remote_addr: u64,
    rkey: u32,
    local_offset: u64,
    len: u64,
}

/// The data work requests in flight on one connection, at most
/// [`DATA_IN_FLIGHT`], kept without allocating.
#[derive(Clone, Copy, Default)]
struct InFlight {
    ids: [u64; DATA_IN_FLIGHT],
    len: usize,
}

impl InFlight {
    fn ids(&self) -> &[u64] {
        &self.ids[..self.len]
    }

    fn is_full(&self) -> bool {
        self.len == DATA_IN_FLIGHT
    }

    fn push(&mut self, id: u64) {
        self.ids[self.len] = id;
        self.len += 1;
    }

    /// Forgets `id` (a completion of another work request changes nothing).
    fn remove(&mut self, id: u64) {
        if let Some(i) = self.ids().iter().position(|&x| x == id) {
            self.ids.copy_within(i + 1..self.len, i);
            self.len -= 1;
        }
    }
}

/// One connection's part of a data move: what is left of its piece, and
/// what it has in flight. A session has at most [`MAX_STRIPES`] of them,
/// on the stack: a transfer's data path allocates nothing.
#[derive(Clone, Copy, Default)]
struct Lane {
    left: Piece,
    flight: InFlight,
    /// The final message's work request, once posted on this lane's
    /// connection (a GET's, right behind its last WRITE).
    last: Option<u64>,
}

impl ServerSide {
    /// A server side on `ctx` / `pd`, with [`ServerConfig::default`] (it
    /// dials only a request's own source address).
    pub fn new(cm: Arc<dyn Cm>, ctx: Arc<dyn Context>, pd: Arc<dyn Pd>) -> ServerSide {
        ServerSide::with_config(cm, ctx, pd, ServerConfig::default())
    }

    /// A server side that behaves as `config` says.
    pub fn with_config(
        cm: Arc<dyn Cm>,
        ctx: Arc<dyn Context>,
        pd: Arc<dyn Pd>,
        config: ServerConfig,
    ) -> ServerSide {
        let max_msg_sz = ctx
            .query_port(1)
            .map_or(MAX_WR_BYTES, |p| u64::from(p.max_msg_sz).max(1))
            .min(MAX_WR_BYTES);
        let poll = crate::core::options::poll_for(config.poll, ctx.vendor_id(), ctx.name());
        let dial_limit = crate::core::options::connect_timeout_for(
            config.connect_timeout,
            ctx.vendor_id(),
            ctx.name(),
        );
        ServerSide {
            cm,
            ctx,
            pd,
            conns: Mutex::new(Conns::default()),
            closed: AtomicBool::new(false),
            last_sweep: Mutex::new(Instant::now()),
            max_msg_sz,
            polling: Arc::new(Steps {
                grant: Polling::new(poll),
                data: Polling::new(poll),
                last: Polling::new(poll),
            }),
            sleeps: Arc::default(),
            older: Mutex::new(HashMap::new()),
            dial_limit,
            config,
        }
    }

    /// Times a transfer slept waiting for a completion (the grant, its
    /// data, its final message) rather than finding it by polling.
    pub fn sleeps(&self) -> u64 {
        self.sleeps.load(Ordering::Relaxed)
    }

    /// Clients remembered as speaking protocol version 2 (they refused a
    /// version-3 connect request).
    pub fn version_2_clients(&self) -> usize {
        self.older
            .lock()
            .values()
            .filter(|&&v| v == VERSION)
            .count()
    }

    /// The version the client listening at `gid` and `port` is remembered
    /// to speak at most, if it refused a newer one.
    pub fn remembered_version(&self, gid: Gid, port: u16) -> Option<u8> {
        self.older.lock().get(&(gid, port)).copied()
    }

    /// The protection domain, for registering the server's memory.
    pub fn pd(&self) -> &Arc<dyn Pd> {
        &self.pd
    }

    /// The largest message one work request carries: the device's
    /// `max_msg_sz`, at most 1 GiB.
    pub fn max_msg_sz(&self) -> u64 {
        self.max_msg_sz
    }

    /// Serves one transfer of the token's whole length between `local`
    /// and the client, for a request whose source is not known (tests).
    pub fn serve(&self, token: &Token, op: Op, local: &LocalBuf, deadline: Instant) -> Result<()> {
        self.transfer(token, op, local, token.length, None, deadline)
            .map(|_| ())
            .map_err(|f| f.error)
    }

    /// Serves one transfer of `len` bytes (at most the token's length)
    /// between `local` and the start of the client's range, for an S3
    /// request from `source`: the whole protocol. Only after `Ok` may the
    /// S3 reply be sent; it says how the token was proven. One tenant's
    /// ([`Requester::anyone`]); see [`ServerSide::transfer_for`].
    pub fn transfer(
        &self,
        token: &Token,
        op: Op,
        local: &LocalBuf,
        len: u64,
        source: Option<IpAddr>,
        deadline: Instant,
    ) -> std::result::Result<Proven, TransferFailure> {
        self.transfer_for(token, op, local, len, Requester::anyone(source), deadline)
    }

    /// [`ServerSide::transfer`] for `requester`'s tenant: only connections
    /// that tenant's transfers made are reused.
    pub fn transfer_for(
        &self,
        token: &Token,
        op: Op,
        local: &LocalBuf,
        len: u64,
        requester: Requester<'_>,
        deadline: Instant,
    ) -> std::result::Result<Proven, TransferFailure> {
        if len > token.length {
            return Err(TransferFailure::quiet(Error::InvalidValue(
                "transfer longer than the token's range",
            )));
        }
        let mut session = self.begin_for(token, requester, deadline)?;
        let proven = session.proven();
        match op {
            Op::Get => session.write_and_finish(local, 0, 0, len)?,
            Op::Put => {
                session.read(local, 0, 0, len)?;
                session.finish()?;
            }
        }
        Ok(proven)
    }

    /// Starts a transfer for `token`, for an S3 request from `source`, of
    /// one tenant's ([`Requester::anyone`]); see [`ServerSide::begin_for`].
    pub fn begin(
        &self,
        token: &Token,
        source: Option<IpAddr>,
        deadline: Instant,
    ) -> std::result::Result<Session<'_>, TransferFailure> {
        self.begin_for(token, Requester::anyone(source), deadline)
    }

    /// Starts a transfer for `token`, for `requester`: checks the token and
    /// the dial policy, then proves the token on the established
    /// connection of the requester's tenant to the client QP (or, failing
    /// that or with none, connects with it; another tenant's connection to
    /// that QP is left alone). Fails after [`ServerSide::shutdown`].
    pub fn begin_for(
        &self,
        token: &Token,
        requester: Requester<'_>,
        deadline: Instant,
    ) -> std::result::Result<Session<'_>, TransferFailure> {
        let quiet = TransferFailure::quiet;
        let source = requester.source;
        if token.transport != Transport::RcCm {
            return Err(quiet(Error::InvalidValue(
                "not a 0x02 token: this server connects through RDMA CM",
            )));
        }
        let client = ip_of(&token.gid);
        if !self.config.dial.permits(client, source) {
            return Err(quiet(Error::NotSupported(
                "the token names an address this server may not dial",
            )));
        }
        if self.is_shut_down() {
            return Err(quiet(Error::Rdma("the server side is shut down".into())));
        }
        self.sweep();
        let key = ConnKey {
            tenant: Arc::from(requester.tenant),
            qp: ClientQp::of(token),
        };
        if let Some(conn) = self.established(&key) {
            let Some(mut guard) = conn.try_lock_arc_until(deadline) else {
                return Err(quiet(Error::Rdma(
                    "the connection to this client QP stayed busy until the deadline".into(),
                )));
            };
            let until = deadline.min(Instant::now() + self.config.proof_timeout);
            match prove_share(&mut guard, token, 0, until) {
                Ok(plan) => {
                    let session = Session {
                        side: self,
                        key,
                        conn,
                        guard: Some(guard),
                        token: *token,
                        deadline,
                        proven: Proven::OnItsConnection,
                        own_len: token.length,
                        shares: Vec::new(),
                    };
                    return self.stripe(session, plan, client);
                }
                Err(e) => {
                    // The client refused the proof (it re-aimed its QP, or
                    // the connection died): nothing was granted; connect
                    // afresh with the token as proof.
                    let cm = guard.cm.clone();
                    drop(guard);
                    self.drop_this(&key, &conn, &cm);
                    eprintln!(
                        "hipobj server: the proof on the connection to QP {} failed ({e}); \
                         connecting afresh",
                        token.qp_num
                    );
                }
            }
        }
        let (made, plan) = self
            .connect(&key, token, client, deadline, 0, token.qp_num)
            .map_err(quiet)?;
        let Some(guard) = made.try_lock_arc_until(deadline) else {
            return Err(quiet(Error::Rdma("the new connection is busy".into())));
        };
        let session = Session {
            side: self,
            key,
            conn: made,
            guard: Some(guard),
            token: *token,
            deadline,
            proven: Proven::Connected,
            own_len: token.length,
            shares: Vec::new(),
        };
        self.stripe(session, plan, client)
    }

    /// A striped transfer (the client's grant carried a plan): proves the
    /// token for every other share on its own connection to the client
    /// connection the plan names (kept connections first, their proofs
    /// sent at once, then connects for the rest), each granting exactly its
    /// share. Any share that cannot be proved fails the whole transfer,
    /// and every connection it holds is disconnected (the client then
    /// revokes every share).
    fn stripe<'s>(
        &'s self,
        mut session: Session<'s>,
        plan: Option<Vec<Share>>,
        client: IpAddr,
    ) -> std::result::Result<Session<'s>, TransferFailure> {
        let Some(plan) = plan else {
            return Ok(session);
        };
        session.own_len = plan[0].len;
        // The client speaks the primary's version on every connection.
        let version = session
            .guard
            .as_ref()
            .map_or(VERSION_3, |g| g.version)
            .max(VERSION_3);
        let token = session.token;
        let deadline = session.deadline;
        let tenant = session.key.tenant.clone();
        let key_of = |share: &Share| ConnKey {
            tenant: tenant.clone(),
            qp: ClientQp {
                gid: token.gid,
                qp_num: share.name,
                port: token.lid,
            },
        };
        let index = |i: usize| u16::try_from(i).unwrap_or(u16::MAX);
        // Kept connections: every proof out, then every grant awaited.
        let mut proving = Vec::new();
        let mut fresh = Vec::new();
        for (i, share) in plan.iter().enumerate().skip(1) {
            let key = key_of(share);
            let held = self
                .established(&key)
                .and_then(|conn| conn.try_lock_arc_until(deadline).map(|g| (conn, g)));
            match held {
                Some((conn, mut guard)) => {
                    guard.version = version;
                    if send_proof_share(&mut guard, &token, index(i)).is_ok() {
                        proving.push((i, *share, key, conn, guard));
                    } else {
                        let cm = guard.cm.clone();
                        drop(guard);
                        self.drop_this(&key, &conn, &cm);
                        fresh.push((i, *share, key));
                    }
                }
                None => fresh.push((i, *share, key)),
            }
        }
        let until = deadline.min(Instant::now() + self.config.proof_timeout);
        for (i, share, key, conn, guard) in proving {
            match wait_grant(&guard, until) {
                Ok((imm, 0)) if imm == grant_imm(token.secret) => {
                    session.shares.push(ShareConn {
                        key,
                        conn,
                        guard: Some(guard),
                        share,
                    });
                }
                _ => {
                    // Refused (the client re-aimed that connection) or
                    // dead: connect afresh for the share.
                    let cm = guard.cm.clone();
                    drop(guard);
                    self.drop_this(&key, &conn, &cm);
                    fresh.push((i, share, key));
                }
            }
        }
        for (i, share, key) in fresh {
            let conn = match self.connect(&key, &token, client, deadline, index(i), share.name) {
                Ok((conn, _)) => conn,
                Err(e) => {
                    let why = Error::Rdma(format!(
                        "share {i} of the striped transfer could not be proved on the \
                         client's connection {}: {e}",
                        share.name
                    ));
                    return Err(session.fail_all(why, &[]));
                }
            };
            let Some(guard) = conn.try_lock_arc_until(deadline) else {
                let why = Error::Rdma("a share's new connection is busy".into());
                return Err(session.fail_all(why, &[]));
            };
            session.shares.push(ShareConn {
                key,
                conn,
                guard: Some(guard),
                share,
            });
        }
        session.shares.sort_by_key(|s| s.share.addr);
        Ok(session)
    }

    /// The established connection to `key`, if it is still connected.
    fn established(&self, key: &ConnKey) -> Option<Arc<Mutex<ServerConn>>> {
        let existing = self
            .conns
            .lock()
            .kept
            .get(key)
            .map(|s| (s.conn.clone(), s.cm.clone()))?;
        let (conn, cm) = existing;
        if cm.is_disconnected() {
            self.drop_this(key, &conn, &cm);
            return None;
        }
        Some(conn)
    }

    /// Connects to the client's listener with the token as proof, making
    /// room within the limits first (the dial counts as a connection while
    /// it lasts, at most `dial_limit` when there is one), and records
    /// the connection under `key`.
    ///
    /// The request is for `share` of the token's transfer, on the client
    /// connection named `name` (the token's own for share 0). In version
    /// 3 unless this side speaks 2 or the client is remembered as a
    /// version-2 client; a client that refuses share 0 in version 3 is
    /// asked again at once in version 2 (a version-2 client refuses
    /// version 3 as it decodes it, before it looks at the token) and
    /// remembered. Returns the connection and, for share 0 of version 3,
    /// the plan the REP carried if the client striped the transfer.
    fn connect(
        &self,
        key: &ConnKey,
        token: &Token,
        client: IpAddr,
        deadline: Instant,
        share: u16,
        name: u32,
    ) -> Result<(Shared, Option<Vec<Share>>)> {
        let dial = self.make_room(&key.tenant, client)?;
        let limit = self.dial_limit;
        let until = limit.map_or(deadline, |l| deadline.min(Instant::now() + l));
        let by = (token.gid, token.lid);
        // A share exists only from version 3 on.
        let lowest = if share > 0 { VERSION_3 } else { VERSION };
        let remembered = self.older.lock().get(&by).copied();
        let first = self
            .config
            .protocol
            .min(remembered.unwrap_or(NEWEST))
            .max(lowest);
        let attempt = |version: u8| {
            let data = match version {
                VERSION => encode_connect(token),
                v => encode_connect_v(v, token, share, name),
            };
            self.connect_or_refused(token, &data, until)
                .map_err(|e| match (e, limit) {
                    (Error::Rdma(why), Some(l)) if until < deadline && Instant::now() >= until => {
                        Error::Rdma(format!("{why} (a dial may take {} ms)", l.as_millis()))
                    }
                    (e, _) => e,
                })
        };
        // A client refuses a version it does not speak (before it looks at
        // the token): the one below is tried, and remembered once taken.
        let mut version = first;
        let made = loop {
            match attempt(version)? {
                Some(made) => break made,
                None if version > lowest => version -= 1,
                None => {
                    return Err(Error::Rdma(format!(
                        "the client at {} refused the connection",
                        SocketAddr::new(client, token.lid)
                    )))
                }
            }
        };
        if version < first {
            let mut older = self.older.lock();
            if older.len() >= OLDER_MEMORY {
                older.clear();
            }
            older.insert(by, version);
        }
        let plan = match (share, made.version) {
            (0, v) if v >= VERSION_3 => plan_in(made.cm.reply_data(), token)?,
            _ => None,
        };
        let cm = made.cm.clone();
        let conn = Arc::new(Mutex::new(made));
        let replaced = {
            let mut conns = self.conns.lock();
            // Checked under the map's lock: shutdown sets the flag before it
            // empties the map, so a connection is either seen by shutdown or
            // refused here.
            if self.is_shut_down() {
                drop(conns);
                let _ = cm.disconnect();
                return Err(Error::Rdma("the server side is shut down".into()));
            }
            conns.kept.insert(
                key.clone(),
                Slot {
                    conn: conn.clone(),
                    cm,
                    client,
                },
            )
        };
        // Counted as a connection now (the dial's count ends with it).
        drop(dial);
        if let Some(old) = replaced {
            let _ = old.cm.disconnect();
        }
        Ok((conn, plan))
    }

    /// Keeps the connections within the limits before one more dial by
    /// `tenant` to `client`, dials in progress counted as connections:
    /// closes the least recently used idle one (of that tenant and client,
    /// when their own limit is reached) and counts the dial; `Busy` when
    /// every connection that could go is in use or still being dialed.
    fn make_room(&self, tenant: &Arc<str>, client: IpAddr) -> Result<Dial<'_>> {
        let who = (tenant.clone(), client);
        let victim = {
            let mut conns = self.conns.lock();
            let mine = |k: &ConnKey, s: &Slot| k.tenant == *tenant && s.client == client;
            let of_client = conns.kept.iter().filter(|(k, s)| mine(k, s)).count()
                + conns.dialing.get(&who).copied().unwrap_or(0);
            let full_client = of_client >= self.config.max_connections_per_client;
            let full = conns.kept.len() + conns.dials() >= self.config.max_connections;
            let victim = if full_client || full {
                // An idle connection: its lock is free (no transfer holds it).
                let idle = conns
                    .kept
                    .iter()
                    .filter(|(k, s)| !full_client || mine(k, s))
                    .filter_map(|(k, s)| s.conn.try_lock().map(|c| (c.last_used, k)))
                    .min_by_key(|(used, _)| *used)
                    .map(|(_, k)| k.clone());
                let Some(key) = idle else {
                    return Err(Error::Busy(if full_client {
                        "every connection this server may hold to this client is in use or \
                         being dialed"
                    } else {
                        "every connection this server may hold is in use or being dialed"
                    }));
                };
                conns.kept.remove(&key)
            } else {
                None
            };
            *conns.dialing.entry(who.clone()).or_insert(0) += 1;
            victim
        };
        if let Some(slot) = victim {
            let _ = slot.cm.disconnect();
        }
        Ok(Dial { side: self, who })
    }

    /// Connects to the listener `token` names with `private_data` as the
    /// connect request's (the token's encoding, or anything a test wants).
    pub fn connect_with(
        &self,
        token: &Token,
        private_data: &[u8],
        deadline: Instant,
    ) -> Result<ServerConn> {
        let addr = SocketAddr::new(ip_of(&token.gid), token.lid);
        self.connect_or_refused(token, private_data, deadline)?
            .ok_or_else(|| Error::Rdma(format!("the client at {addr} refused the connection")))
    }

    /// [`ServerSide::connect_with`], `None` when a hipobj client refused
    /// the request.
    fn connect_or_refused(
        &self,
        token: &Token,
        private_data: &[u8],
        deadline: Instant,
    ) -> Result<Option<ServerConn>> {
        let cq = self.ctx.create_cq(32)?;
        let proof: Box<[AtomicU8]> = (0..PROOF_BUF_LEN).map(|_| AtomicU8::new(0)).collect();
        let proof_mr = self.pd.reg_mr(
            proof.as_ptr().expose_provenance(),
            PROOF_BUF_LEN,
            Access::LOCAL_WRITE,
        )?;
        let grant: Box<[AtomicU8]> = (0..STRIPES_MAX_LEN).map(|_| AtomicU8::new(0)).collect();
        let grant_mr = self.pd.reg_mr(
            grant.as_ptr().expose_provenance(),
            STRIPES_MAX_LEN,
            Access::LOCAL_WRITE,
        )?;
        let addr = SocketAddr::new(ip_of(&token.gid), token.lid);
        let outcome = self.cm.connect(ConnectRequest {
            addr,
            pd: &self.pd,
            cq: &cq,
            caps: CAPS,
            private_data,
            initiator_depth: 1,
            responder_resources: 1,
            retry_count: self.config.retry_count,
            rnr_retry_count: 7,
            deadline,
        })?;
        match outcome {
            ConnectOutcome::Established(cm) => {
                let qp = cm
                    .qp()
                    .ok_or_else(|| Error::Internal("the active side has no QP".into()))?;
                Ok(Some(ServerConn {
                    cm,
                    qp,
                    cq,
                    version: match private_data.get(4) {
                        Some(&v) if (VERSION_3..=NEWEST).contains(&v) => v,
                        _ => VERSION,
                    },
                    proof,
                    proof_mr,
                    grant,
                    grant_mr,
                    next_wr: 0,
                    last_used: Instant::now(),
                    polling: self.polling.clone(),
                    sleeps: self.sleeps.clone(),
                }))
            }
            ConnectOutcome::Rejected { private_data } if is_refusal(&private_data) => Ok(None),
            ConnectOutcome::Rejected { .. } => Err(Error::Rdma(format!(
                "the connection to {addr} was rejected without a hipobj reason \
                 (nothing listening there?)"
            ))),
        }
    }

    /// Disconnects and forgets the connections to `key`, every tenant's.
    /// Does not wait for a transfer using one: that transfer fails (its QP
    /// is in ERR).
    pub fn drop_connection(&self, key: &ClientQp) {
        let removed: Vec<Slot> = {
            let mut conns = self.conns.lock();
            let keys: Vec<ConnKey> = conns
                .kept
                .keys()
                .filter(|k| k.qp == *key)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| conns.kept.remove(k)).collect()
        };
        for slot in &removed {
            let _ = slot.cm.disconnect();
        }
    }

    /// Disconnects `cm`, the CM id of `conn`, and forgets `conn` if the map
    /// still holds it for `key` (and not a newer connection).
    fn drop_this(&self, key: &ConnKey, conn: &Arc<Mutex<ServerConn>>, cm: &Arc<dyn CmConnection>) {
        {
            let mut conns = self.conns.lock();
            if conns
                .kept
                .get(key)
                .is_some_and(|s| Arc::ptr_eq(&s.conn, conn))
            {
                conns.kept.remove(key);
            }
        }
        let _ = cm.disconnect();
    }

    /// Forgets connections whose client disconnected (or that failed),
    /// releasing their QPs. Never waits for a transfer in progress.
    pub fn forget_disconnected(&self) {
        let gone: Vec<Slot> = {
            let mut conns = self.conns.lock();
            let keys: Vec<ConnKey> = conns
                .kept
                .iter()
                .filter(|(_, s)| s.cm.is_disconnected())
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| conns.kept.remove(k)).collect()
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
        self.conns.lock().kept.len()
    }

    /// Dials in progress.
    pub fn dial_count(&self) -> usize {
        self.conns.lock().dials()
    }

    /// The established connection to `key` of the one tenant of
    /// [`ServerSide::begin`], if any (for tests that play a misbehaving
    /// server on it).
    pub fn connection(&self, key: &ClientQp) -> Option<Arc<Mutex<ServerConn>>> {
        self.connection_of("", key)
    }

    /// The established connection of `tenant` to `key`, if any.
    pub fn connection_of(&self, tenant: &str, key: &ClientQp) -> Option<Arc<Mutex<ServerConn>>> {
        let key = ConnKey {
            tenant: Arc::from(tenant),
            qp: *key,
        };
        self.conns.lock().kept.get(&key).map(|s| s.conn.clone())
    }

    /// Disconnects every connection (and goes on serving: the next transfer
    /// to each client connects afresh).
    pub fn disconnect_all(&self) {
        let all: Vec<Slot> = self.conns.lock().kept.drain().map(|(_, s)| s).collect();
        for slot in &all {
            let _ = slot.cm.disconnect();
        }
    }

    /// Disconnects every connection and refuses new ones. Transfers in
    /// progress fail (their QPs are in ERR). Idempotent; dropping the
    /// server side does it too.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Slot> = self.conns.lock().kept.drain().map(|(_, s)| s).collect();
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
}

impl Drop for ServerSide {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often a transfer first forgets connections the clients ended.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Proves `token` on an established connection: SENDs it, with a receive
/// posted for the client's grant, and waits until `until` for both.
pub fn prove(conn: &mut ServerConn, token: &Token, until: Instant) -> Result<()> {
    prove_share(conn, token, 0, until).map(|_| ())
}

/// Proves `token` for `share` of its transfer on an established
/// connection, in the connection's version, and waits until `until` for
/// the grant: for share 0 of version 3, with the client's plan if it
/// striped the transfer.
pub fn prove_share(
    conn: &mut ServerConn,
    token: &Token,
    share: u16,
    until: Instant,
) -> Result<Option<Vec<Share>>> {
    send_proof_share(conn, token, share)?;
    let (grant, len) = wait_grant(conn, until)?;
    if grant != grant_imm(token.secret) {
        return Err(Error::Rdma(
            "the client's grant is not this transfer's".into(),
        ));
    }
    match (len, share, conn.version) {
        (0, ..) => Ok(None),
        (len, 0, v) if v >= VERSION_3 => {
            let data: Vec<u8> = conn.grant[..len.min(STRIPES_MAX_LEN)]
                .iter()
                .map(|b| b.load(Ordering::Acquire))
                .collect();
            plan_in(&data, token)
        }
        _ => Err(Error::Rdma(
            "the client's grant carries data where none was expected".into(),
        )),
    }
}

/// The plan of a striped transfer in a grant (or a REP's private data):
/// `None` for none (nothing, or zeros), an error for a plan that is not
/// valid for `token`.
fn plan_in(data: &[u8], token: &Token) -> Result<Option<Vec<Share>>> {
    if data.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    decode_stripes(data, token)
        .map(Some)
        .map_err(|e| Error::Rdma(format!("the client's plan of a striped transfer: {e}")))
}

/// A hostile server's move, for tests: one raw WRITE (`Op::Get`) or READ
/// of `len` bytes at `remote_addr` with `rkey` on `conn`, from or into
/// `local`; how it completed (`None`: it could not be posted, or did not
/// complete by `until`). A refused access breaks the connection (the QP
/// goes to ERR).
pub fn probe(
    conn: &ServerConn,
    op: Op,
    local: &LocalBuf,
    remote_addr: u64,
    rkey: u32,
    len: u32,
    until: Instant,
) -> Option<WcStatus> {
    const PROBE_WR: u64 = 0x7072_6f62;
    let op = match op {
        Op::Get => SendOp::Write { remote_addr, rkey },
        Op::Put => SendOp::Read { remote_addr, rkey },
    };
    let wr = SendWr {
        wr_id: PROBE_WR,
        op,
        sge: Some(Sge {
            addr: local.addr,
            len,
            lkey: local.mr.lkey(),
        }),
        signaled: true,
    };
    conn.qp.post_send(&[wr]).ok()?;
    crate::platform::wait_for_completion(&*conn.cq, PROBE_WR, until)
        .ok()
        .flatten()
        .map(|c| c.status)
}

/// Posts the receive of the grant and SENDs `token` as a proof (the first
/// half of [`prove`], for tests that do not wait for the grant).
pub fn send_proof(conn: &mut ServerConn, token: &Token) -> Result<()> {
    send_proof_share(conn, token, 0)
}

/// [`send_proof`] for `share` of the token's transfer, in the connection's
/// version (version 2 knows only share 0); a version-3 grant's receive has
/// room for a plan.
pub fn send_proof_share(conn: &mut ServerConn, token: &Token, share: u16) -> Result<()> {
    let grant_wr = conn.next_wr();
    let v3 = conn.version >= VERSION_3;
    conn.qp.post_recv(RecvWr {
        wr_id: grant_wr | GRANT_TAG,
        sge: v3.then(|| Sge {
            addr: conn.grant.as_ptr().expose_provenance() as u64,
            len: u32::try_from(STRIPES_MAX_LEN).unwrap_or(0),
            lkey: conn.grant_mr.lkey(),
        }),
    })?;
    let bytes = if v3 {
        encode_proof_v(conn.version, token, share)
    } else {
        encode_proof(token)
    };
    for (slot, b) in conn.proof.iter().zip(bytes) {
        slot.store(b, Ordering::Release);
    }
    let send_wr = conn.next_wr();
    let sge = Sge {
        addr: conn.proof.as_ptr().expose_provenance() as u64,
        len: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
        lkey: conn.proof_mr.lkey(),
    };
    // Unsignaled: the grant says the proof arrived (and its buffer was
    // read); a failed SEND completes anyway, with its error; the final
    // message's completion, signaled, retires it.
    conn.qp.post_send(&[SendWr {
        wr_id: send_wr,
        op: SendOp::Send,
        sge: Some(sge),
        signaled: false,
    }])?;
    Ok(())
}

/// Receives of grants are tagged, to tell them from send completions.
const GRANT_TAG: u64 = 1 << 63;

/// Waits until `until` for the client's grant; returns the grant's
/// immediate and the bytes it carried. The proof's SEND is unsignaled:
/// only its failure completes.
fn wait_grant(conn: &ServerConn, until: Instant) -> Result<(u32, usize)> {
    loop {
        let Some(c) = next_completion(conn, Step::Grant, until)? else {
            return Err(Error::Rdma(
                "no grant from the client before the deadline".into(),
            ));
        };
        let grant = c.wr_id & GRANT_TAG != 0;
        if c.status != WcStatus::Success {
            return Err(Error::Rdma(format!(
                "the proof's {} completed with {:?}",
                if grant { "receive" } else { "SEND" },
                c.status
            )));
        }
        if !grant {
            continue;
        }
        if c.opcode != WcOpcode::Recv {
            return Err(Error::Rdma("the client's grant is not a SEND".into()));
        }
        let imm = c
            .imm
            .ok_or_else(|| Error::Rdma("a grant without immediate".into()))?;
        return Ok((imm, usize::try_from(c.byte_len).unwrap_or(usize::MAX)));
    }
}

/// A server side's gauges of whether its polls pay ([`Polling`]), one
/// for each step a transfer waits for: the grant comes when the client's
/// driver has run, the data's and the final message's completions when the
/// NIC has, and on a busy host the first may be late where the others are
/// not.
#[derive(Debug)]
struct Steps {
    grant: Polling,
    data: Polling,
    last: Polling,
}

/// What a transfer's wait for a completion waits for ([`Steps`]).
#[derive(Clone, Copy, Debug)]
enum Step {
    /// The client's grant, once the proof is sent.
    Grant,
    /// A completion of the server's own work: a WRITE, a READ.
    Data,
    /// The final message's.
    Last,
}

/// The next completion on `conn`'s CQ for `step`, waiting until `until`:
/// polled for up to its poll first (while such polls pay), then slept for
/// on the completion channel.
fn next_completion(conn: &ServerConn, step: Step, until: Instant) -> Result<Option<Completion>> {
    let cq = &*conn.cq;
    let gauge = match step {
        Step::Grant => &conn.polling.grant,
        Step::Data => &conn.polling.data,
        Step::Last => &conn.polling.last,
    };
    let window = gauge.window();
    let spin_until = Instant::now() + window;
    let mut polling = !window.is_zero();
    loop {
        if let Some(c) = cq.poll(1)?.into_iter().next() {
            if polling {
                gauge.found(true);
            }
            return Ok(Some(c));
        }
        let now = Instant::now();
        if polling && now < spin_until && now < until {
            crate::platform::pause();
            continue;
        }
        if polling {
            gauge.found(false);
            polling = false;
        }
        if now >= until {
            return Ok(cq.poll(1)?.into_iter().next());
        }
        conn.sleeps.fetch_add(1, Ordering::Relaxed);
        if !cq.wait(until)? {
            return Ok(cq.poll(1)?.into_iter().next());
        }
    }
}

impl Session<'_> {
    /// The connection.
    pub fn conn(&mut self) -> &mut ServerConn {
        self.guard.as_mut().expect("a session holds its connection")
    }

    /// The token the session serves.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// How its token was proven.
    pub fn proven(&self) -> Proven {
        self.proven
    }

    /// The shares it moves, in the range's order: the token's own (all of
    /// the range unless the client striped the transfer), then each other
    /// share of the client's plan.
    pub fn shares(&self) -> Vec<Share> {
        let own = Share {
            name: self.token.qp_num,
            rkey: self.token.rkey,
            addr: self.token.addr,
            len: self.own_len,
        };
        std::iter::once(own)
            .chain(self.shares.iter().map(|s| s.share))
            .collect()
    }

    /// Moves the session's deadline (its data and its final message must
    /// complete by then): a transfer in chunks gives each chunk its own.
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// WRITEs `len` bytes from `local` at `local_offset` to the client's
    /// range at `remote_offset` (GET).
    pub fn write(
        &mut self,
        local: &LocalBuf,
        local_offset: u64,
        remote_offset: u64,
        len: u64,
    ) -> std::result::Result<(), TransferFailure> {
        self.data(Op::Get, local, local_offset, remote_offset, len, None)
    }

    /// READs `len` bytes of the client's range at `remote_offset` into
    /// `local` at `local_offset` (PUT).
    pub fn read(
        &mut self,
        local: &LocalBuf,
        local_offset: u64,
        remote_offset: u64,
        len: u64,
    ) -> std::result::Result<(), TransferFailure> {
        self.data(Op::Put, local, local_offset, remote_offset, len, None)
    }

    /// WRITEs `len` bytes from `local` at `local_offset` to the client's
    /// range at `remote_offset`, and the final message right behind the
    /// last WRITE on each connection, in the same post: the whole GET in
    /// one wait, for the final messages' completions. A reliable
    /// connection's responder places a WRITE's bytes before it takes the
    /// SEND behind it, so the client's buffer holds them when the final
    /// message arrives; the last WRITE is unsignaled (the final message's
    /// completion retires it; its failure completes anyway). Only after
    /// `Ok` may the S3 reply be sent.
    pub fn write_and_finish(
        mut self,
        local: &LocalBuf,
        local_offset: u64,
        remote_offset: u64,
        len: u64,
    ) -> std::result::Result<(), TransferFailure> {
        if !self.side.config.delay_before_final.is_zero() {
            self.write(local, local_offset, remote_offset, len)?;
            return self.finish();
        }
        let last = Some(final_imm(self.token.secret));
        self.data(Op::Get, local, local_offset, remote_offset, len, last)?;
        self.ended();
        Ok(())
    }

    fn data(
        &mut self,
        op: Op,
        local: &LocalBuf,
        local_offset: u64,
        remote_offset: u64,
        len: u64,
        last: Option<u32>,
    ) -> std::result::Result<(), TransferFailure> {
        let inside = remote_offset
            .checked_add(len)
            .is_some_and(|end| end <= self.token.length);
        if !inside {
            return Err(self.fail_all(Error::InvalidValue("outside the token's range"), &[]));
        }
        // Each connection moves what of the range lies in its own share.
        let own = (self.token.addr, self.own_len, self.token.rkey);
        let shares = std::iter::once(own).chain(
            self.shares
                .iter()
                .map(|s| (s.share.addr, s.share.len, s.share.rkey)),
        );
        let (from, to) = (
            self.token.addr + remote_offset,
            self.token.addr + remote_offset + len,
        );
        let mut lanes = [Lane::default(); MAX_STRIPES];
        let conns = (1 + self.shares.len()).min(MAX_STRIPES);
        for (lane, (addr, share_len, rkey)) in lanes.iter_mut().zip(shares) {
            let start = from.max(addr);
            let end = to.min(addr + share_len);
            if start < end {
                lane.left = Piece {
                    remote_addr: start,
                    rkey,
                    local_offset: local_offset + (start - from),
                    len: end - start,
                };
            }
        }
        self.move_lanes(op, local, &mut lanes[..conns], last)
    }

    /// Moves `len` bytes between `local` and the client's `remote_addr`
    /// with `rkey` on the token's own connection, without looking at the
    /// token's range: split into work requests of at most `max_msg_sz`, a
    /// few in flight. Public for tests of servers that reach past their
    /// range.
    pub fn data_unchecked(
        &mut self,
        op: Op,
        remote_addr: u64,
        rkey: u32,
        local: &LocalBuf,
        local_offset: u64,
        len: u64,
    ) -> std::result::Result<(), TransferFailure> {
        let mut lane = Lane {
            left: Piece {
                remote_addr,
                rkey,
                local_offset,
                len,
            },
            flight: InFlight::default(),
            last: None,
        };
        self.move_lanes(op, local, std::slice::from_mut(&mut lane), None)
    }

    /// The session's connection `conn` (0 the token's own, `i` share `i`).
    fn conn_at(&mut self, conn: usize) -> Option<&mut ServerConn> {
        match conn {
            0 => self.guard.as_deref_mut(),
            i => self.shares.get_mut(i - 1)?.guard.as_deref_mut(),
        }
    }

    /// Moves each lane's piece on its connection (lane 0 the token's own,
    /// `i` share `i`) in work requests of at most `max_msg_sz`, up to
    /// [`DATA_IN_FLIGHT`] in flight on each connection at once: the
    /// connections move their shares side by side. With `last`, each
    /// connection's final message (a SEND with that immediate) goes in the
    /// post of its last work request, or alone where it has none; only
    /// WRITEs may have it behind them ([`Session::write_and_finish`]).
    fn move_lanes(
        &mut self,
        op: Op,
        local: &LocalBuf,
        lanes: &mut [Lane],
        last: Option<u32>,
    ) -> std::result::Result<(), TransferFailure> {
        let max = self.side.max_msg_sz;
        let deadline = self.deadline;
        if last.is_some() && op != Op::Get {
            let why = Error::Internal("a final message behind READs".into());
            return Err(self.fail_all(why, lanes));
        }
        loop {
            for c in 0..lanes.len() {
                if let (Some(imm), None, 0) = (last, lanes[c].last, lanes[c].left.len) {
                    let rkey = lanes[c].left.rkey;
                    let Some(conn) = self.conn_at(c) else {
                        let why = Error::Internal("a share without its connection".into());
                        return Err(self.fail_all(why, lanes));
                    };
                    let wr = conn.final_wr(imm, rkey);
                    let id = wr.wr_id;
                    if let Err(e) = conn.qp.post_send(&[wr]) {
                        return Err(self.fail_all(e, lanes));
                    }
                    lanes[c].last = Some(id);
                    lanes[c].flight.push(id);
                }
                while lanes[c].left.len > 0 && !lanes[c].flight.is_full() {
                    let Some(conn) = self.conn_at(c) else {
                        let why = Error::Internal("a share without its connection".into());
                        return Err(self.fail_all(why, lanes));
                    };
                    let left = &mut lanes[c].left;
                    let n = left.len.min(max);
                    let id = conn.next_wr();
                    let (remote_addr, rkey) = (left.remote_addr, left.rkey);
                    let wr = SendWr {
                        wr_id: id,
                        op: match op {
                            Op::Get => SendOp::Write { remote_addr, rkey },
                            Op::Put => SendOp::Read { remote_addr, rkey },
                        },
                        sge: Some(Sge {
                            addr: local.addr + left.local_offset,
                            len: u32::try_from(n).unwrap_or(u32::MAX),
                            lkey: local.mr.lkey(),
                        }),
                        signaled: true,
                    };
                    // The last WRITE carries the final message behind it.
                    let behind = last.filter(|_| n == left.len).map(|imm| {
                        let last = conn.final_wr(imm, rkey);
                        (
                            last.wr_id,
                            [
                                SendWr {
                                    signaled: false,
                                    ..wr.clone()
                                },
                                last,
                            ],
                        )
                    });
                    let posted = match &behind {
                        Some((_, both)) => conn.qp.post_send(both),
                        None => conn.qp.post_send(&[wr]),
                    };
                    if let Err(e) = posted {
                        return Err(self.fail_all(e, lanes));
                    }
                    left.remote_addr += n;
                    left.local_offset += n;
                    left.len -= n;
                    match behind {
                        Some((last_id, _)) => {
                            lanes[c].last = Some(last_id);
                            lanes[c].flight.push(last_id);
                        }
                        None => lanes[c].flight.push(id),
                    }
                }
            }
            // The first connection with work out: its next completion.
            let Some(c) = lanes.iter().position(|l| l.flight.len > 0) else {
                return Ok(());
            };
            let waited = match self.conn_at(c) {
                Some(conn) => next_completion(conn, Step::Data, deadline),
                None => Err(Error::Internal("a share without its connection".into())),
            };
            let error = match waited {
                Ok(Some(done)) if done.status == WcStatus::Success => {
                    lanes[c].flight.remove(done.wr_id);
                    continue;
                }
                Ok(Some(done)) if lanes[c].last == Some(done.wr_id) => {
                    lanes[c].flight.remove(done.wr_id);
                    Error::Rdma(format!("the final message: {:?}", done.status))
                }
                Ok(Some(done)) => {
                    lanes[c].flight.remove(done.wr_id);
                    Error::Rdma(format!("server {:?}: {:?}", op, done.status))
                }
                Ok(None) => Error::Rdma("server data: no completion before the deadline".into()),
                Err(e) => e,
            };
            return Err(self.fail_all(error, lanes));
        }
    }

    /// The final message (a zero-length SEND with the immediate derived
    /// from the token's secret), waited for: only then may the S3 reply be
    /// sent. The connection stays for the next transfer. A striped
    /// transfer sends it on every share's connection.
    pub fn finish(self) -> std::result::Result<(), TransferFailure> {
        let imm = final_imm(self.token.secret);
        self.finish_with(imm)
    }

    /// [`Session::finish`] with any immediate value (tests of a wrong one).
    pub fn finish_with(self, imm: u32) -> std::result::Result<(), TransferFailure> {
        let rkey = self.token.rkey;
        self.finish_as(imm, rkey)
    }

    /// [`Session::finish_with`] naming the window `rkey` on the token's own
    /// connection (a version-4 final message invalidates it; tests of
    /// another one).
    pub fn finish_as(mut self, imm: u32, rkey: u32) -> std::result::Result<(), TransferFailure> {
        let delay = self.side.config.delay_before_final;
        if !delay.is_zero() {
            std::thread::sleep(delay.min(self.deadline.saturating_duration_since(Instant::now())));
        }
        let deadline = self.deadline;
        let conns = 1 + self.shares.len();
        for c in 0..conns {
            let rkey = match c {
                0 => rkey,
                i => self.shares[i - 1].share.rkey,
            };
            let Some(conn) = self.conn_at(c) else {
                let why = Error::Internal("a share without its connection".into());
                return Err(self.fail_all(why, &[]));
            };
            let wr = conn.final_wr(imm, rkey);
            let posted = conn.qp.post_send(&[wr]);
            if let Err(e) = posted {
                // The final messages carry no data: the buffer is quiet.
                return Err(self.fail_all(e, &[]));
            }
        }
        for c in 0..conns {
            let Some(conn) = self.conn_at(c) else {
                continue;
            };
            let outcome = match next_completion(conn, Step::Last, deadline) {
                Ok(Some(done)) if done.status == WcStatus::Success => Ok(()),
                Ok(Some(done)) => Err(Error::Rdma(format!("the final message: {:?}", done.status))),
                Ok(None) => Err(Error::Rdma(
                    "the final message: no completion before the deadline".into(),
                )),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                return Err(self.fail_all(e, &[]));
            }
        }
        self.ended();
        Ok(())
    }

    /// The transfer ended well on every connection: they stay for the
    /// next one.
    fn ended(&mut self) {
        let now = Instant::now();
        for c in 0..1 + self.shares.len() {
            if let Some(conn) = self.conn_at(c) {
                conn.last_used = now;
            }
        }
        self.guard = None;
        for share in &mut self.shares {
            share.guard = None;
        }
    }

    /// Ends the session without the final message, keeping the
    /// connections (tests of a server that never sends it).
    pub fn abandon(mut self) {
        self.guard = None;
        for share in &mut self.shares {
            share.guard = None;
        }
    }

    /// Disconnects every connection of the session and reports `error`;
    /// the data work requests still in flight on each (`lanes`, by
    /// connection) are waited for (their flush) to tell whether the
    /// buffer is quiet.
    fn fail_all(&mut self, error: Error, lanes: &[Lane]) -> TransferFailure {
        let mut held: Vec<Option<Guard>> = Vec::with_capacity(1 + self.shares.len());
        if let Some(guard) = self.guard.take() {
            self.side.drop_this(&self.key, &self.conn, &guard.cm);
            held.push(Some(guard));
        } else {
            held.push(None);
        }
        for share in &mut self.shares {
            match share.guard.take() {
                Some(guard) => {
                    self.side.drop_this(&share.key, &share.conn, &guard.cm);
                    held.push(Some(guard));
                }
                None => held.push(None),
            }
        }
        let until = Instant::now() + QUIESCE_TIMEOUT;
        let mut quiet = true;
        for (c, lane) in lanes.iter().enumerate() {
            let mut left = lane.flight;
            let Some(Some(guard)) = held.get(c) else {
                quiet &= left.len == 0;
                continue;
            };
            while left.len > 0 {
                match next_completion(guard, Step::Data, until) {
                    Ok(Some(done)) => left.remove(done.wr_id),
                    _ => break,
                }
            }
            quiet &= left.len == 0;
        }
        TransferFailure {
            error,
            local_quiet: quiet,
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.guard.is_some() || self.shares.iter().any(|s| s.guard.is_some()) {
            let _ = self.fail_all(Error::Rdma("the transfer was abandoned".into()), &[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::core::args::{BufferRange, Slice, TokenOp};
    use crate::core::transfer::Direction;
    use crate::core::{Config, Current};
    use crate::platform::{Access, CmListener, QpState};
    use crate::testing::world::{Scripted, World, WorldSpec, CLIENT_IP, CLIENT_NIC, SERVER_NIC};

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
            Setup::with(ServerConfig {
                dial: DialPolicy::any(),
                ..ServerConfig::default()
            })
        }

        fn with(config: ServerConfig) -> Setup {
            Setup::on(World::new(), config)
        }

        /// On `world` (the default one's devices are Soft-RoCE's).
        fn on(world: World, config: ServerConfig) -> Setup {
            let (current, client) = Setup::client(&world);
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
            let side = Arc::new(ServerSide::with_config(
                fabric.cm(&[SERVER_NIC]),
                ctx,
                pd,
                config,
            ));
            Setup {
                _world: world,
                current,
                client,
                side,
                local,
                server,
            }
        }

        /// A client instance on `world`'s client device, with one
        /// registered host buffer.
        fn client(world: &World) -> (Current, Box<[u8]>) {
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
            (current, client)
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

        /// A CM listener on the client's address that nobody ever answers
        /// (a client whose CM is stuck), and a token naming it.
        fn silent_client(&self) -> (Arc<dyn CmListener>, Token) {
            let cm = self._world.platform.fabric.cm(&[CLIENT_NIC]);
            let listener = cm
                .listen(SocketAddr::new(IpAddr::V4(CLIENT_IP), 0))
                .expect("a listener on the client's address");
            let token = Token {
                lid: listener.port(),
                ..self.token(TokenOp::Get)
            };
            (listener, token)
        }

        /// A GET of the whole client buffer by the client instance, served
        /// by this server side for `requester`.
        fn get_for(&self, requester: Requester<'_>) -> Result<()> {
            self.get_by(&self.current, &self.client, requester)
        }

        /// A GET into `buf` by the client instance `current`, served by
        /// this server side for `requester`.
        fn get_by(&self, current: &Current, buf: &[u8], requester: Requester<'_>) -> Result<()> {
            let slice = Slice::new(buf.as_ptr().expose_provenance(), buf.len(), 0).unwrap();
            let mut s3 = Scripted::new(|t: &Token| {
                let served = self.side.transfer_for(
                    t,
                    Op::Get,
                    &self.local,
                    t.length,
                    requester,
                    Setup::deadline(),
                );
                match served {
                    Ok(_) => b"200".to_vec(),
                    Err(_) => b"500".to_vec(),
                }
            });
            current
                .instance()
                .unwrap()
                .transfer(Direction::Get, slice, &mut s3)
        }
    }

    /// Waits (at most a generous bound) until `done` holds.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < until, "{what} never happened");
            std::thread::sleep(Duration::from_millis(5));
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
            .expect("returned in time, without waiting for what it must not wait for")
    }

    #[test]
    fn a_transfer_shorter_than_its_token_moves_only_its_bytes() {
        let s = Setup::new();
        let token = s.token(TokenOp::Get);
        s.side
            .transfer(&token, Op::Get, &s.local, 100, None, Setup::deadline())
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
                None,
                Setup::deadline(),
            )
            .expect_err("longer than the token");
        assert!(matches!(longer.error, Error::InvalidValue(_)));
        assert!(longer.local_quiet);
    }

    #[test]
    fn data_longer_than_max_msg_sz_moves_in_several_work_requests() {
        let s = Setup::new();
        assert!(s.side.max_msg_sz() >= LEN as u64);
        let mut side = ServerSide::with_config(
            s._world.platform.fabric.cm(&[SERVER_NIC]),
            s._world
                .platform
                .fabric
                .verbs(&[SERVER_NIC])
                .open(SERVER_NIC)
                .unwrap(),
            s.side.pd().clone(),
            s.side.config.clone(),
        );
        // As if the device carried 1000-byte messages at most: five work
        // requests, the last one short.
        side.max_msg_sz = 1000;
        let token = s.token(TokenOp::Get);
        side.serve(&token, Op::Get, &s.local, Setup::deadline())
            .expect("a chunked transfer");
        assert_eq!(&s.client[..], &s.server[..]);
    }

    #[test]
    fn a_failed_transfer_drops_its_connection_and_reports_the_buffer_free() {
        let s = Setup::new();
        // A GET's token grants remote write only: reading it fails at the
        // client's NIC.
        let token = s.token(TokenOp::Get);
        let failure = s
            .side
            .transfer(
                &token,
                Op::Put,
                &s.local,
                token.length,
                None,
                Setup::deadline(),
            )
            .expect_err("a READ of a GET's range");
        assert!(matches!(failure.error, Error::Rdma(_)), "{failure}");
        assert!(failure.local_quiet, "the READ completed (in error)");
        assert_eq!(s.side.connection_count(), 0);
    }

    #[test]
    fn the_dial_policy_decides_which_clients_may_be_connected_to() {
        let s = Setup::with(ServerConfig::default());
        let token = s.token(TokenOp::Get);
        let client = ip_of(&token.gid);
        let other: IpAddr = "198.51.100.7".parse().unwrap();
        let refused = s
            .side
            .transfer(&token, Op::Get, &s.local, 8, Some(other), Setup::deadline())
            .expect_err("another source");
        assert!(matches!(refused.error, Error::NotSupported(_)), "{refused}");
        assert!(s
            .side
            .transfer(&token, Op::Get, &s.local, 8, None, Setup::deadline())
            .is_err());
        assert_eq!(s.side.connection_count(), 0, "nothing was dialed");
        s.side
            .transfer(
                &token,
                Op::Get,
                &s.local,
                8,
                Some(client),
                Setup::deadline(),
            )
            .expect("the request's own source");
        let mut subnet = DialPolicy::request_source();
        subnet.allow.push("192.0.2.0/24".parse().unwrap());
        assert!(subnet.permits(client, None));
        assert!(!subnet.permits(other, Some(client)));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert!(subnet.permits(mapped, None), "an IPv4-mapped client");
    }

    #[test]
    fn connections_stay_within_the_limits_by_closing_idle_ones() {
        let s = Setup::with(ServerConfig {
            dial: DialPolicy::any(),
            max_connections: 2,
            ..ServerConfig::default()
        });
        for _ in 0..3 {
            let token = s.token(TokenOp::Get);
            s.side
                .serve(&token, Op::Get, &s.local, Setup::deadline())
                .expect("within the limits");
            assert!(s.side.connection_count() <= 2);
        }
        // With both connections busy, a third cannot be made.
        let held: Vec<_> = s
            .side
            .conns
            .lock()
            .kept
            .values()
            .map(|c| c.conn.clone())
            .collect();
        let guards: Vec<_> = held.iter().map(|c| c.lock()).collect();
        let token = s.token(TokenOp::Get);
        let busy = s
            .side
            .transfer(&token, Op::Get, &s.local, 8, None, Setup::deadline())
            .expect_err("no room");
        assert!(matches!(busy.error, Error::Busy(_)), "{busy}");
        drop(guards);
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
                s.side.connection(&ClientQp::of(t)).unwrap()
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
    fn a_busy_connection_blocks_neither_the_map_nor_a_transfer_past_its_deadline() {
        let s = Setup::new();
        let token = s.token(TokenOp::Get);
        s.side
            .serve(&token, Op::Get, &s.local, Setup::deadline())
            .unwrap();
        let conn = s.side.connection(&ClientQp::of(&token)).unwrap();
        let held = conn.lock();
        let side = s.side.clone();
        let local = s.local.clone();
        let next = s.token(TokenOp::Get);
        let next = Token {
            qp_num: token.qp_num,
            ..next
        };
        let failure = returns_in_time(move || {
            side.transfer(
                &next,
                Op::Get,
                &local,
                8,
                None,
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

    #[test]
    fn another_tenants_token_for_a_kept_qp_connects_afresh_and_leaves_its_connection_alone() {
        let s = Setup::new();
        let victim = Requester {
            tenant: "victim",
            source: None,
        };
        s.get_for(victim).expect("the victim's first GET");
        s.get_for(victim).expect("the victim's second GET");
        let victim_qp = s.side.conns.lock().kept.keys().next().unwrap().qp;
        let before = s.current.instance().unwrap().stats();
        // Another tenant names the victim's QP with a guessed secret.
        let bogus = Token {
            transport: Transport::RcCm,
            qp_num: victim_qp.qp_num,
            gid: victim_qp.gid,
            rkey: 0x1234,
            addr: s.client.as_ptr().expose_provenance() as u64,
            length: 8,
            port: 0,
            lid: victim_qp.port,
            secret: 0x0bad_5eed,
        };
        let attacker = Requester {
            tenant: "attacker",
            source: None,
        };
        let refused = s
            .side
            .transfer_for(&bogus, Op::Get, &s.local, 8, attacker, Setup::deadline())
            .expect_err("a guessed secret");
        assert!(
            refused.error.to_string().contains("refused the connection"),
            "refused by the client's CM, not proved in-band: {refused}"
        );
        assert!(s.side.connection_of("attacker", &victim_qp).is_none());
        s.get_for(victim).expect("the victim's next GET");
        let after = s.current.instance().unwrap().stats();
        assert_eq!(
            (after.handshakes, after.reused),
            (before.handshakes, before.reused + 1),
            "the victim's connection was reused, not made again"
        );
    }

    #[test]
    fn one_tenant_at_its_client_limit_does_not_evict_another_tenants_connection() {
        let s = Setup::with(ServerConfig {
            dial: DialPolicy::any(),
            max_connections_per_client: 1,
            ..ServerConfig::default()
        });
        let [a, b] = ["a", "b"].map(|tenant| Requester {
            tenant,
            source: None,
        });
        s.get_for(a).expect("tenant a's GET");
        let a_qp = s.side.conns.lock().kept.keys().next().unwrap().qp;
        // Tenant b: another process on the same client host.
        let (other, buf) = Setup::client(&s._world);
        s.get_by(&other, &buf, b)
            .expect("tenant b's GET, from the same client address");
        assert!(
            s.side.connection_of("a", &a_qp).is_some(),
            "tenant a's connection was closed to make room for tenant b's"
        );
        assert_eq!(s.side.connection_count(), 2);
        s.get_for(a).expect("tenant a's next GET");
        assert_eq!(
            s.current.instance().unwrap().stats().reused,
            1,
            "tenant a's connection served it again"
        );
    }

    #[test]
    fn dials_in_progress_count_against_the_connection_limits() {
        let s = Setup::with(ServerConfig {
            dial: DialPolicy::any(),
            max_connections_per_client: 2,
            connect_timeout: Some(Duration::from_secs(60)),
            ..ServerConfig::default()
        });
        let (listener, token) = s.silent_client();
        let far = Instant::now() + Duration::from_secs(60);
        let dials: Vec<_> = (0..2u32)
            .map(|i| {
                let (side, local) = (s.side.clone(), s.local.clone());
                let token = Token {
                    qp_num: token.qp_num + i,
                    ..token
                };
                std::thread::spawn(move || side.transfer(&token, Op::Get, &local, 8, None, far))
            })
            .collect();
        eventually("two dials in progress", || s.side.dial_count() == 2);
        let (side, local) = (s.side.clone(), s.local.clone());
        let third = Token {
            qp_num: token.qp_num + 2,
            ..token
        };
        let busy = returns_in_time(move || side.transfer(&third, Op::Get, &local, 8, None, far))
            .expect_err("no room while two dials are in progress");
        assert!(matches!(busy.error, Error::Busy(_)), "{busy}");
        // The client's CM goes away: its requests are rejected, the dials end.
        drop(listener);
        for dial in dials {
            assert!(dial.join().unwrap().is_err());
        }
        assert_eq!(s.side.dial_count(), 0);
        assert_eq!(s.side.connection_count(), 0);
    }

    #[test]
    fn a_dial_to_a_client_whose_cm_never_answers_ends_at_the_dials_own_deadline() {
        let s = Setup::with(ServerConfig {
            dial: DialPolicy::any(),
            connect_timeout: Some(Duration::from_millis(100)),
            ..ServerConfig::default()
        });
        let (_listener, token) = s.silent_client();
        let (side, local) = (s.side.clone(), s.local.clone());
        let far = Instant::now() + Duration::from_secs(60);
        let failed = returns_in_time(move || side.transfer(&token, Op::Get, &local, 8, None, far))
            .expect_err("the client never answers");
        assert!(
            failed.error.to_string().contains("a dial may take 100 ms"),
            "{failed}"
        );
        assert_eq!(s.side.dial_count(), 0);
    }

    /// By default a dial may take 2 s on a hardware NIC; on a software one
    /// (the default world's devices are Soft-RoCE's) the transfer's
    /// deadline alone, since there the CM's messages wait behind the data
    /// on the same CPUs: a dial to a client whose CM does not answer yet is
    /// not given up at 2 s.
    #[test]
    fn by_default_a_dial_may_take_2_s_on_hardware_and_the_whole_deadline_on_software() {
        let any = || ServerConfig {
            dial: DialPolicy::any(),
            ..ServerConfig::default()
        };
        let hardware = Setup::on(World::with(WorldSpec::hardware()), any());
        let (_listener, token) = hardware.silent_client();
        let (side, local) = (hardware.side.clone(), hardware.local.clone());
        let far = Instant::now() + Duration::from_secs(60);
        let started = Instant::now();
        let failed = returns_in_time(move || side.transfer(&token, Op::Get, &local, 8, None, far))
            .expect_err("the client never answers");
        assert!(
            failed.error.to_string().contains("a dial may take 2000 ms"),
            "{failed}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));

        let software = Setup::on(World::new(), any());
        let (_listener, token) = software.silent_client();
        let (side, local) = (software.side.clone(), software.local.clone());
        let started = Instant::now();
        let deadline = started + Duration::from_millis(3_000);
        let failed =
            returns_in_time(move || side.transfer(&token, Op::Get, &local, 8, None, deadline))
                .expect_err("the client never answers");
        assert!(
            started.elapsed() >= Duration::from_millis(2_900),
            "the dial was given up after {:?}, before the transfer's deadline: {failed}",
            started.elapsed()
        );
        assert!(
            !failed.error.to_string().contains("a dial may take"),
            "{failed}"
        );
        assert_eq!(software.side.dial_count(), 0);
    }
}
