//! The server's RDMA: one device, its server side of the protocol, and a
//! pool of registered buffers that payloads pass through, within a memory
//! budget set by configuration (never by what a token asks for). Every
//! call here but [`Rdma::admit`] blocks (verbs, the CM, completions): the
//! S3 layer runs them with `spawn_blocking`, each request holding an
//! [`Admission`] while any of them runs, so that RDMA requests never hold
//! more than `--rdma-max-requests` of the runtime's blocking threads.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::token::Token;
use crate::platform::{Access, Cm, Context, Mr, PortState};
use crate::server::{
    DialPolicy, LocalBuf, Proven, Requester, ServerConfig, ServerSide, Session, TransferFailure,
};
use parking_lot::{Condvar, Mutex};

/// Registered bytes the pool keeps for reuse; buffers beyond are freed.
const POOL_BYTES: usize = 256 << 20;
/// The smallest buffer registered.
pub const MIN_BUF: usize = 4096;
/// The fewest chunks a transfer may hold: a PUT keeps its last chunk until
/// the bytes' checksum is checked, the upstream keeps the piece before it
/// until it knows the body goes on, and a third must be free for the
/// transfer to go on at all.
pub const MIN_CHUNKS: usize = 3;
/// Ports looked at when choosing a device.
const MAX_PORTS: u8 = 8;

/// What the server's RDMA may do, from the command line.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Networks it may connect to besides a request's own source.
    pub allow: Vec<ipnet::IpNet>,
    /// The longest transfer served.
    pub max_bytes: u64,
    /// Registered memory that transfers in progress may hold at once.
    pub memory_bytes: u64,
    /// Connections in all.
    pub max_connections: usize,
    /// Connections of one tenant to one client address.
    pub max_connections_per_client: usize,
    /// RDMA requests in progress at once.
    pub max_requests: usize,
    /// How long connecting to a client may take (`None`: by device,
    /// [`ServerConfig::connect_timeout`]).
    pub connect_timeout: Option<Duration>,
    /// The largest chunk of a transfer, one registered buffer.
    pub chunk_bytes: usize,
    /// Chunks one transfer holds at once.
    pub chunks: usize,
    /// How long a transfer waits for its backend to hand over a GET's next
    /// chunk or to take a PUT's (a store that pauses is not a client that
    /// stopped): the upstream's own time-out, at least the RDMA one.
    pub backend_timeout: Duration,
}

/// The server's RDMA device and its server side.
pub struct Rdma {
    side: ServerSide,
    device: String,
    timeout: Duration,
    backend_timeout: Duration,
    max_bytes: u64,
    chunk_bytes: usize,
    chunks: usize,
    pool: Mutex<Pool>,
    budget: Arc<Budget>,
    gate: Arc<Gate>,
}

/// RDMA requests in progress, at most `limit`.
struct Gate {
    held: AtomicUsize,
    limit: usize,
}

/// One RDMA request's place among those in progress ([`Rdma::admit`]),
/// given back when dropped. Each blocking step of the request holds it
/// (a clone of its `Arc`), so a request whose handler was dropped keeps
/// its place until its last step ends.
pub struct Admission {
    gate: Arc<Gate>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gate.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The bytes of the buffers taken (in use by transfers), at most `limit`,
/// handed out a transfer's [`Window`] at a time and in the order asked.
///
/// A transfer reserves all it will hold at once, before it holds anything
/// (never hold-and-wait: a transfer holding part of the budget while it
/// waits for more could wait on others doing the same, until every one of
/// them timed out), and the reservations are served first come, first
/// served: one waiting for a large window is not passed over for ever by
/// smaller ones that keep fitting.
///
/// Each buffer carries its own [`Charge`], split off its window's, which
/// gives its bytes back when dropped: a request whose handler is dropped
/// half way (its client went away: hyper drops the future) frees its
/// buffers and its share of the budget alike, as one given back does.
struct Budget {
    state: Mutex<Ledger>,
    returned: Condvar,
    limit: u64,
}

/// What the budget's lock guards.
#[derive(Default)]
struct Ledger {
    in_use: u64,
    /// The reservations waiting, in the order they came.
    queue: std::collections::VecDeque<u64>,
    /// The next waiter's number.
    next: u64,
    /// Reservations that had to wait, since the start.
    waited: u64,
}

impl Budget {
    fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            state: Mutex::new(Ledger::default()),
            returned: Condvar::new(),
            limit,
        })
    }

    /// `bytes` of the budget, once every reservation that came before has
    /// been served and there is room, waiting until `deadline`; `None`
    /// when there was none by then. Holds nothing while it waits.
    fn charge(self: &Arc<Budget>, bytes: u64, deadline: Instant) -> Option<Charge> {
        let mut ledger = self.state.lock();
        if let Some(charge) = self.take_now(&mut ledger, bytes) {
            return Some(charge);
        }
        let fits = |l: &Ledger| l.in_use.saturating_add(bytes) <= self.limit;
        let me = ledger.next;
        ledger.next += 1;
        ledger.waited += 1;
        ledger.queue.push_back(me);
        let served = loop {
            if ledger.queue.front() == Some(&me) && fits(&ledger) {
                break true;
            }
            if self.returned.wait_until(&mut ledger, deadline).timed_out() {
                break ledger.queue.front() == Some(&me) && fits(&ledger);
            }
        };
        ledger.queue.retain(|&w| w != me);
        if served {
            ledger.in_use += bytes;
        }
        drop(ledger);
        // The next in line may fit now (or, after a time-out, be first).
        self.returned.notify_all();
        served.then(|| self.charged(bytes))
    }

    /// `bytes` of the budget at once, or `None`: never ahead of a
    /// reservation waiting, never beyond the limit.
    fn try_charge(self: &Arc<Budget>, bytes: u64) -> Option<Charge> {
        self.take_now(&mut self.state.lock(), bytes)
    }

    /// [`Budget::try_charge`] under the lock `ledger` already is.
    fn take_now(self: &Arc<Budget>, ledger: &mut Ledger, bytes: u64) -> Option<Charge> {
        let fits = ledger.in_use.saturating_add(bytes) <= self.limit;
        (ledger.queue.is_empty() && fits).then(|| {
            ledger.in_use += bytes;
            self.charged(bytes)
        })
    }

    fn charged(self: &Arc<Budget>, bytes: u64) -> Charge {
        Charge {
            budget: Arc::clone(self),
            bytes,
        }
    }

    fn in_use(&self) -> u64 {
        self.state.lock().in_use
    }
}

/// A share of the [`Budget`], given back when dropped. A buffer that the
/// NIC may still use is forgotten (`std::mem::forget`) with its charge:
/// memory the server cannot free stays counted.
struct Charge {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Charge {
    /// `bytes` of this share as a share of its own (for one buffer of a
    /// window); the budget's total is unchanged.
    fn split(&mut self, bytes: u64) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge {
            budget: Arc::clone(&self.budget),
            bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut ledger = self.budget.state.lock();
        ledger.in_use = ledger.in_use.saturating_sub(self.bytes);
        drop(ledger);
        self.budget.returned.notify_all();
    }
}

/// The memory budget as what the server keeps besides its transfers (the
/// cache's objects) sees it: shares taken only where they fit at once
/// ([`Room::hold`]), with a floor the keeper must leave to transfers.
#[derive(Clone)]
pub struct Room {
    budget: Arc<Budget>,
    floor: u64,
}

impl Room {
    /// `bytes` of the budget now, if they fit and no transfer waits for
    /// its window; `None` otherwise (never waits).
    pub fn hold(&self, bytes: u64) -> Option<Held> {
        self.budget
            .try_charge(bytes)
            .map(|charge| Held { _charge: charge })
    }

    /// The whole budget (`--rdma-memory-bytes`).
    pub fn limit(&self) -> u64 {
        self.budget.limit
    }

    /// One transfer's room (`--rdma-chunks` buffers of
    /// `--rdma-chunk-bytes`): what a keeper bounded below the budget by
    /// at least this never takes from transfers.
    pub fn floor(&self) -> u64 {
        self.floor
    }
}

/// A share of the budget held by a keeper ([`Room::hold`]), given back
/// when dropped.
pub struct Held {
    _charge: Charge,
}

/// What a transfer may hold of the memory budget, reserved whole before
/// it starts ([`Rdma::reserve`]): room for `left` more buffers of `size`
/// bytes, each taken without waiting ([`Rdma::take`]). What it has not
/// handed out goes back to the budget when it drops; a buffer taken keeps
/// its own share until it is given back or dropped.
pub struct Window {
    charge: Charge,
    size: usize,
    left: usize,
}

impl Window {
    /// The buffers it holds room for, not taken yet.
    pub fn left(&self) -> usize {
        self.left
    }

    /// The size of each of its buffers.
    pub fn buffer_size(&self) -> usize {
        self.size
    }
}

/// Why a buffer could not be had.
pub enum TakeError {
    /// Longer than `--rdma-max-bytes` (declined: the client may send it by
    /// HTTP).
    TooLarge(String),
    /// The memory budget stayed full until the deadline (503).
    Busy(String),
    /// Registration failed (500).
    Failed(String),
}

/// Registered buffers not in use (and charged to no one).
#[derive(Default)]
struct Pool {
    free: Vec<RegBuf>,
    bytes: usize,
}

/// Server memory registered with the device (local write only: the
/// server's own WRITEs read it, its READs fill it).
pub struct RegBuf {
    // Declared first, so deregistered before the memory below is freed.
    mr: Arc<dyn Mr>,
    mem: Box<[u8]>,
    /// Its share of the budget while a transfer holds it; `None` in the pool.
    charge: Option<Charge>,
}

impl RegBuf {
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.mem
    }

    /// Its bytes, to fill before a WRITE.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    /// The buffer as the server side moves bytes from or into it.
    pub fn local(&self) -> LocalBuf {
        LocalBuf {
            mr: self.mr.clone(),
            addr: self.mr.addr(),
        }
    }
}

/// Bytes kept elsewhere (a cached object's) that the server's WRITEs read
/// in place: registered (local access only) for as long as this lives, so
/// that a GET of them copies nothing. Charged to the budget by their
/// owner ([`Room`]), not again here.
pub struct Pinned {
    // Declared first, so deregistered before the bytes may be freed.
    mr: Arc<dyn Mr>,
    bytes: bytes::Bytes,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        crate::gateway::metrics::cache_registered(
            -i64::try_from(self.bytes.len()).unwrap_or(i64::MAX),
        );
    }
}

impl Pinned {
    /// The bytes as the server side moves bytes from them.
    pub fn local(&self) -> LocalBuf {
        LocalBuf {
            mr: self.mr.clone(),
            addr: self.mr.addr(),
        }
    }

    /// Their length.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The CRC64/NVME (as S3's header carries it) of `len` bytes from
    /// `at`, computed where they lie.
    pub fn crc64nvme(&self, at: usize, len: usize) -> String {
        use crate::gateway::checksum::{crc64nvme, crc64nvme_header};
        crc64nvme_header(crc64nvme(&self.bytes[at..at + len]))
    }
}

/// A transfer's description for the log, and where its request came from.
pub struct Label<'a> {
    /// `GET` or `PUT`.
    pub op: &'a str,
    /// `bucket/key` (and the part, for an upload part).
    pub object: &'a str,
    /// The HTTP request's source address.
    pub source: Option<IpAddr>,
    /// The S3 principal it is signed by (its access key): the tenant
    /// whose kept connections it may use.
    pub principal: &'a str,
    /// When its handler started: the log says how long the request waited
    /// before its transfer (the backend's read, room in the budget).
    pub arrived: Instant,
}

/// How a transfer failed, for the S3 answer.
pub enum Failure {
    /// The server will not serve this token (501: the client falls back).
    Declined(String),
    /// No room now (503).
    Busy(String),
    /// It failed (500).
    Failed(String),
}

impl std::fmt::Display for TakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakeError::TooLarge(why) | TakeError::Busy(why) | TakeError::Failed(why) => {
                f.write_str(why)
            }
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Declined(why) => write!(f, "declined: {why}"),
            Failure::Busy(why) => write!(f, "busy: {why}"),
            Failure::Failed(why) => write!(f, "{why}"),
        }
    }
}

impl Rdma {
    /// Opens `device` (or the first device with an active port) through
    /// the production platform: libibverbs and librdmacm, loaded now.
    pub fn open(
        device: Option<&str>,
        timeout: Duration,
        delay_final: Duration,
        limits: Limits,
    ) -> Result<Rdma, String> {
        let platform = crate::platform::system();
        let verbs = platform.verbs().map_err(|e| e.to_string())?;
        let cm = platform.cm().map_err(|e| e.to_string())?;
        let names = verbs.device_names().map_err(|e| e.to_string())?;
        let ctx: Arc<dyn Context> = match device {
            Some(name) => {
                if !names.iter().any(|n| n == name) {
                    return Err(format!("no RDMA device {name} (found: {})", list(&names)));
                }
                let ctx = verbs.open(name).map_err(|e| e.to_string())?;
                if !has_active_port(&*ctx) {
                    return Err(format!("{name} has no active port"));
                }
                ctx
            }
            None => names
                .iter()
                .filter_map(|name| verbs.open(name).ok())
                .find(|ctx| has_active_port(&**ctx))
                .ok_or_else(|| {
                    if names.is_empty() {
                        "no RDMA device".to_owned()
                    } else {
                        format!(
                            "no RDMA device with an active port (found: {})",
                            list(&names)
                        )
                    }
                })?,
        };
        Rdma::on(cm, ctx, timeout, delay_final, limits)
    }

    /// The server's RDMA on the device `ctx` opened, connecting through
    /// `cm`.
    pub fn on(
        cm: Arc<dyn Cm>,
        ctx: Arc<dyn Context>,
        timeout: Duration,
        delay_final: Duration,
        limits: Limits,
    ) -> Result<Rdma, String> {
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let device = ctx.name().to_owned();
        let config = ServerConfig {
            dial: DialPolicy {
                request_source: true,
                allow: limits.allow,
            },
            max_connections: limits.max_connections,
            max_connections_per_client: limits.max_connections_per_client,
            connect_timeout: limits.connect_timeout,
            delay_before_final: delay_final,
            // `HIPOBJ_POLL_US`, as the client library reads it.
            poll: crate::core::Options::from_env().poll,
            ..ServerConfig::default()
        };
        let side = ServerSide::with_config(cm, ctx, pd, config);
        Ok(Rdma {
            side,
            device,
            timeout,
            backend_timeout: limits.backend_timeout.max(timeout),
            max_bytes: limits.max_bytes,
            chunk_bytes: limits.chunk_bytes.max(MIN_BUF),
            chunks: limits.chunks.max(MIN_CHUNKS),
            pool: Mutex::new(Pool::default()),
            budget: Budget::new(limits.memory_bytes),
            gate: Arc::new(Gate {
                held: AtomicUsize::new(0),
                limit: limits.max_requests,
            }),
        })
    }

    /// A place among the RDMA requests in progress, without waiting; `Err`
    /// (why, for a 503) when `--rdma-max-requests` of them are.
    pub fn admit(&self) -> Result<Admission, String> {
        let limit = self.gate.limit;
        self.gate
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < limit).then_some(held + 1)
            })
            .map(|_| Admission {
                gate: Arc::clone(&self.gate),
            })
            .map_err(|_| {
                format!(
                    "{limit} RDMA requests are in progress, as many as --rdma-max-requests \
                     allows; try again"
                )
            })
    }

    /// RDMA requests in progress.
    pub fn requests_in_progress(&self) -> usize {
        self.gate.held.load(Ordering::Acquire)
    }

    /// Whether the client a token names may be connected to for a
    /// request from `source`.
    pub fn may_dial(&self, token: &Token, source: Option<IpAddr>) -> bool {
        self.side
            .config
            .dial
            .permits(crate::core::nic::ip_of(&token.gid), source)
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Whether a transfer of `len` bytes is served: `TooLarge` (declined)
    /// past `--rdma-max-bytes`.
    pub fn check_len(&self, len: u64) -> Result<(), TakeError> {
        if len > self.max_bytes {
            return Err(TakeError::TooLarge(format!(
                "{len} bytes is more than --rdma-max-bytes {}, the longest RDMA transfer this \
                 server serves",
                self.max_bytes
            )));
        }
        Ok(())
    }

    /// The deadline of a transfer, from its start (`--rdma-timeout-ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long a transfer waits for its backend's next chunk, or for the
    /// backend to take one ([`Limits::backend_timeout`]).
    pub fn backend_timeout(&self) -> Duration {
        self.backend_timeout
    }

    /// The largest chunk, one buffer (`--rdma-chunk-bytes`).
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Chunks one transfer holds at once (`--rdma-chunks`).
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Reserves the memory a transfer will hold, all at once and before
    /// it holds any (never part now and more later: `Budget`): room for
    /// `wanted` buffers of `len` bytes (each registered as
    /// `buffer_size`), fewer if the budget could never hold that many,
    /// but never fewer than `needed`. Waits its turn up to the transfer
    /// deadline (`--rdma-timeout-ms`) for room: `Busy` then. `TooLarge`
    /// (declined) when the budget could never hold `needed` of them.
    pub fn reserve(&self, len: usize, wanted: usize, needed: usize) -> Result<Window, TakeError> {
        let size = buffer_size(len);
        if wanted == 0 {
            // Nothing to move (an empty object): nothing to wait for.
            return Ok(Window {
                charge: self.budget.charged(0),
                size,
                left: 0,
            });
        }
        let fits = usize::try_from(self.budget.limit / size as u64).unwrap_or(usize::MAX);
        if fits < needed {
            return Err(TakeError::TooLarge(format!(
                "the transfer needs {needed} buffers of {size} bytes at once, more than \
                 --rdma-memory-bytes {} holds",
                self.budget.limit
            )));
        }
        let buffers = wanted.min(fits).max(needed);
        let bytes = u64::try_from(buffers.saturating_mul(size)).unwrap_or(u64::MAX);
        let deadline = Instant::now() + self.timeout;
        let Some(charge) = self.budget.charge(bytes, deadline) else {
            return Err(TakeError::Busy(format!(
                "the transfers in progress held the memory budget (--rdma-memory-bytes {}) \
                 for {} ms: no room for this transfer's {buffers} buffers of {size} bytes",
                self.budget.limit,
                self.timeout.as_millis()
            )));
        };
        Ok(Window {
            charge,
            size,
            left: buffers,
        })
    }

    /// One more registered buffer of `window` (a free one of its size
    /// reused, else one registered now), without waiting for the budget:
    /// the window holds its share already.
    pub fn take(&self, window: &mut Window) -> Result<RegBuf, TakeError> {
        if window.left == 0 {
            return Err(TakeError::Failed(
                "the transfer asked for more buffers than it reserved".into(),
            ));
        }
        let size = window.size;
        // A failure drops the share, and so gives it back.
        let charge = window.charge.split(size as u64);
        window.left -= 1;
        {
            let mut pool = self.pool.lock();
            // Only a buffer of exactly this size: a larger one would hold
            // more memory than its share says.
            if let Some(i) = pool.free.iter().position(|b| b.mem.len() == size) {
                let mut buf = pool.free.swap_remove(i);
                pool.bytes -= buf.mem.len();
                buf.charge = Some(charge);
                return Ok(buf);
            }
        }
        let mut mem = vec![0u8; size].into_boxed_slice();
        let addr = mem.as_mut_ptr().expose_provenance();
        let mr = self
            .side
            .pd()
            .reg_mr(addr, size, Access::LOCAL_WRITE)
            .map_err(|e| TakeError::Failed(format!("registering {size} bytes: {e}")))?;
        Ok(RegBuf {
            mr,
            mem,
            charge: Some(charge),
        })
    }

    /// Returns a buffer to the pool (or frees it, past the pool's size),
    /// and its bytes to the budget. Dropping a taken buffer instead frees
    /// it and gives its bytes back as well.
    pub fn give_back(&self, mut buf: RegBuf) {
        let charge = buf.charge.take();
        {
            let mut pool = self.pool.lock();
            if pool.bytes + buf.mem.len() <= POOL_BYTES {
                pool.bytes += buf.mem.len();
                pool.free.push(buf);
            }
        }
        drop(charge);
    }

    /// The budget, for a keeper of memory besides the transfers.
    pub fn room(&self) -> Room {
        Room {
            budget: Arc::clone(&self.budget),
            floor: (self.chunks as u64).saturating_mul(self.chunk_bytes as u64),
        }
    }

    /// Bytes of the budget that transfers and keepers ([`Room`]) hold now.
    pub fn memory_in_use(&self) -> u64 {
        self.budget.in_use()
    }

    /// Transfers waiting for their window now, and how many have waited
    /// since the start.
    pub fn budget_waits(&self) -> (usize, u64) {
        let ledger = self.budget.state.lock();
        (ledger.queue.len(), ledger.waited)
    }

    /// Starts a transfer for `token` (the proof, on a kept connection of
    /// the requester's or a new one), to end by `deadline`.
    pub fn begin(
        &self,
        token: &Token,
        label: &Label<'_>,
        deadline: Instant,
    ) -> Result<Session<'_>, TransferFailure> {
        let requester = Requester {
            tenant: label.principal,
            source: label.source,
        };
        self.side.begin_for(token, requester, deadline)
    }

    /// `bytes` registered with the device, for WRITEs to read in place
    /// ([`Pinned`]). Blocking.
    pub fn pin(&self, bytes: bytes::Bytes) -> Result<Pinned, String> {
        if bytes.is_empty() {
            return Err("nothing to register".into());
        }
        let addr = bytes.as_ptr().expose_provenance();
        // No access flag: the NIC only reads them, for the server's WRITEs.
        let mr = self
            .side
            .pd()
            .reg_mr(addr, bytes.len(), Access::empty())
            .map_err(|e| format!("registering {} cached bytes: {e}", bytes.len()))?;
        crate::gateway::metrics::cache_registered(i64::try_from(bytes.len()).unwrap_or(i64::MAX));
        Ok(Pinned { mr, bytes })
    }

    /// Gives `buf` back after a failed transfer if the NIC is done with it
    /// (`quiet`); else leaks it: never reused, never freed, its share of
    /// the budget still counted.
    pub fn release(&self, buf: RegBuf, quiet: bool) {
        if quiet {
            self.give_back(buf);
        } else {
            eprintln!(
                "hipobj-s3-server: the transfer's {} byte buffer is leaked (the NIC may still \
                 use it)",
                buf.mem.len()
            );
            std::mem::forget(buf);
        }
    }

    /// Logs how a transfer of `len` bytes started at `start` ended, and
    /// says how for the S3 answer.
    pub fn ended(
        &self,
        token: &Token,
        label: &Label<'_>,
        len: u64,
        start: Instant,
        outcome: Result<Proven, TransferFailure>,
    ) -> Result<(), Failure> {
        self.moved(token, label, len, start, outcome)
            .map(|line| eprintln!("hipobj-s3-server: {line}"))
    }

    /// How a transfer of `len` bytes started at `start` ended: a failure
    /// is logged, and said for the S3 answer; a success is the log line
    /// for the caller to finish with what came after it (a PUT's bytes
    /// still have to be stored).
    pub fn moved(
        &self,
        token: &Token,
        label: &Label<'_>,
        len: u64,
        start: Instant,
        outcome: Result<Proven, TransferFailure>,
    ) -> Result<String, Failure> {
        let peer = crate::core::nic::ip_of(&token.gid);
        let took = start.elapsed().as_secs_f64() * 1e3;
        let waited = start.duration_since(label.arrived).as_secs_f64() * 1e3;
        let what = format!(
            "rdma {} {}: {len} bytes, client {peer} qp {}, after {waited:.1} ms in the handler",
            label.op, label.object, token.qp_num
        );
        match outcome {
            Ok(proven) => {
                let how = match proven {
                    Proven::Connected => "connected with the token",
                    Proven::OnItsConnection => "proved on its connection",
                };
                Ok(format!("{what}: ok in {took:.1} ms ({how})"))
            }
            Err(failure) => {
                eprintln!("hipobj-s3-server: {what}: failed after {took:.1} ms: {failure}");
                Err(match failure.error {
                    // The dial policy: the token names an address this
                    // server may not connect to.
                    crate::core::Error::NotSupported(why) => Failure::Declined(why.to_owned()),
                    crate::core::Error::Busy(why) => Failure::Busy(why.to_owned()),
                    e => Failure::Failed(e.to_string()),
                })
            }
        }
    }

    /// Disconnects every connection; no transfer starts after this.
    pub fn shutdown(&self) {
        self.side.shutdown();
    }
}

/// Whether any of the first ports of `ctx` is active.
fn has_active_port(ctx: &dyn Context) -> bool {
    (1..=MAX_PORTS)
        .map_while(|port| ctx.query_port(port).ok())
        .any(|attr| attr.state == PortState::Active)
}

/// The longest transfer whose buffer (`buffer_size`) a memory budget of
/// `budget` bytes holds: whole MiB from 1 MiB, a power of two below; 0 when
/// not even [`MIN_BUF`] fits.
pub fn longest_transfer(budget: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let min = MIN_BUF as u64;
    if budget >= MIB {
        budget / MIB * MIB
    } else if budget >= min {
        1 << budget.ilog2()
    } else {
        0
    }
}

/// The size registered for `len` bytes: a power of two up to 1 MiB, whole
/// MiB beyond, never less than [`MIN_BUF`].
fn buffer_size(len: usize) -> usize {
    const MIB: usize = 1 << 20;
    let len = len.max(MIN_BUF);
    if len <= MIB {
        len.next_power_of_two()
    } else {
        len.div_ceil(MIB).saturating_mul(MIB)
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

impl crate::gateway::metrics::RdmaGauges for Rdma {
    fn now(&self) -> crate::gateway::metrics::RdmaNow {
        let (budget_waiting, budget_waited) = self.budget_waits();
        crate::gateway::metrics::RdmaNow {
            memory_in_use: self.memory_in_use(),
            requests_in_progress: self.requests_in_progress(),
            budget_waiting,
            budget_waited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_charge_gives_its_bytes_back_and_wakes_a_waiter() {
        let budget = Budget::new(100);
        let soon = || Instant::now() + Duration::from_millis(50);
        let held = budget.charge(60, soon()).expect("room");
        let mut window = budget.charge(40, soon()).expect("room");
        let one = window.split(10);
        assert_eq!((window.bytes, one.bytes), (30, 10));
        assert_eq!(budget.in_use(), 100, "a split moves a share, adds nothing");
        assert!(budget.charge(1, soon()).is_none(), "the budget is full");
        // Dropped, as a request's buffer is when its handler is dropped.
        drop(window);
        assert_eq!(budget.in_use(), 70);
        drop(one);
        assert_eq!(budget.in_use(), 60);
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || {
                let charge = budget.charge(80, Instant::now() + Duration::from_secs(10));
                charge.map(|c| c.bytes)
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert_eq!(waiter.join().unwrap(), Some(80), "woken by the drop");
        assert_eq!(budget.in_use(), 0, "the waiter's charge went with it");
        assert_eq!(
            budget.state.lock().waited,
            2,
            "the full one and the woken one"
        );
        assert!(budget.state.lock().queue.is_empty());
    }

    /// Reservations are served in the order they came: a large one first
    /// in line is not passed over by a smaller one that would fit, and a
    /// waiter that gives up leaves the line to the next.
    #[test]
    fn reservations_are_served_in_turn_and_one_that_gives_up_leaves_the_line() {
        let budget = Budget::new(100);
        let held = budget
            .charge(70, Instant::now() + Duration::from_millis(50))
            .expect("room");
        let order = Arc::new(Mutex::new(Vec::new()));
        let wait = |bytes: u64, name: &'static str, patience: Duration| {
            let (b, o) = (Arc::clone(&budget), Arc::clone(&order));
            let waiter = std::thread::spawn(move || {
                let got = b.charge(bytes, Instant::now() + patience);
                o.lock().push(name);
                got
            });
            // In line before the next one comes.
            while budget.state.lock().queue.is_empty() {
                std::thread::yield_now();
            }
            waiter
        };
        let large = wait(90, "large", Duration::from_secs(30));
        let queued = |n: usize| {
            while budget.state.lock().queue.len() < n {
                std::thread::yield_now();
            }
        };
        let small = {
            let (budget, order) = (Arc::clone(&budget), Arc::clone(&order));
            std::thread::spawn(move || {
                let got = budget.charge(20, Instant::now() + Duration::from_secs(30));
                order.lock().push("small");
                got
            })
        };
        queued(2);
        // 20 would fit beside the 70 held, but the large one is first.
        std::thread::sleep(Duration::from_millis(30));
        assert!(order.lock().is_empty(), "the small one waits its turn");
        drop(held);
        let large = large.join().unwrap().expect("the large one, first");
        assert_eq!(*order.lock(), ["large"]);
        drop(large);
        assert_eq!(small.join().unwrap().map(|c| c.bytes), Some(20));
        assert_eq!(*order.lock(), ["large", "small"]);
        // One that gives up: the next behind it is served.
        let full = budget
            .charge(100, Instant::now() + Duration::from_millis(50))
            .expect("room");
        let impatient = wait(50, "impatient", Duration::from_millis(100));
        let patient = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.charge(10, Instant::now() + Duration::from_secs(30)))
        };
        queued(2);
        assert!(impatient.join().unwrap().is_none(), "gave up");
        drop(full);
        assert_eq!(patient.join().unwrap().map(|c| c.bytes), Some(10));
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn buffers_round_up_to_powers_of_two_then_to_whole_mebibytes() {
        assert_eq!(buffer_size(0), MIN_BUF);
        assert_eq!(buffer_size(4097), 8192);
        assert_eq!(buffer_size(1 << 20), 1 << 20);
        assert_eq!(buffer_size((1 << 20) + 1), 2 << 20);
        assert_eq!(buffer_size((5 << 20) - 3), 5 << 20);
    }

    #[test]
    fn the_longest_transfer_of_a_budget_is_the_longest_whose_buffer_fits() {
        for budget in [
            4095,
            4096,
            5000,
            65_537,
            (1 << 20) - 1,
            1 << 20,
            (3 << 20) + 7,
            1 << 30,
        ] {
            let longest = longest_transfer(budget);
            if longest == 0 {
                assert!(buffer_size(1) as u64 > budget, "{budget}");
                continue;
            }
            let fits = |len: u64| buffer_size(usize::try_from(len).unwrap()) as u64 <= budget;
            assert!(fits(longest), "{budget}: {longest}");
            assert!(!fits(longest + 1), "{budget}: {longest} + 1");
        }
        assert_eq!(longest_transfer(1 << 30), 1 << 30);
        assert_eq!(longest_transfer(4095), 0);
    }
}
