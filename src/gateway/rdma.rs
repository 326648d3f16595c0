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
    /// How long connecting to a client may take.
    pub connect_timeout: Duration,
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

/// The bytes of the buffers taken (in use by transfers), at most `limit`.
/// Each taken buffer carries its [`Charge`], which gives its bytes back
/// when dropped: a request whose handler is dropped half way (its client
/// went away: hyper drops the future) frees its buffer and its share of
/// the budget alike, as one given back does.
struct Budget {
    in_use: Mutex<u64>,
    returned: Condvar,
    limit: u64,
}

impl Budget {
    fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            in_use: Mutex::new(0),
            returned: Condvar::new(),
            limit,
        })
    }

    /// `bytes` of the budget, waiting until `deadline` for room; `None`
    /// when there was none by then.
    fn charge(self: &Arc<Budget>, bytes: u64, deadline: Instant) -> Option<Charge> {
        let mut in_use = self.in_use.lock();
        while in_use.saturating_add(bytes) > self.limit {
            if self.returned.wait_until(&mut in_use, deadline).timed_out() {
                return None;
            }
        }
        *in_use += bytes;
        Some(Charge {
            budget: Arc::clone(self),
            bytes,
        })
    }

    fn in_use(&self) -> u64 {
        *self.in_use.lock()
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
    /// `more` bytes on top (a pooled buffer larger than asked).
    fn grow(&mut self, more: u64) {
        *self.budget.in_use.lock() += more;
        self.bytes += more;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut in_use = self.budget.in_use.lock();
        *in_use = in_use.saturating_sub(self.bytes);
        drop(in_use);
        self.budget.returned.notify_all();
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

    /// A registered buffer of at least `len` bytes (reused when one is
    /// free), waiting up to the transfer deadline for room in the memory
    /// budget.
    pub fn take(&self, len: usize) -> Result<RegBuf, TakeError> {
        let size = buffer_size(len);
        let charge = u64::try_from(size).unwrap_or(u64::MAX);
        if charge > self.budget.limit {
            return Err(TakeError::TooLarge(format!(
                "{len} bytes take a {size} byte buffer, more than --rdma-memory-bytes {}",
                self.budget.limit
            )));
        }
        let deadline = Instant::now() + self.timeout;
        let Some(charge) = self.budget.charge(charge, deadline) else {
            return Err(TakeError::Busy(format!(
                "the transfers in progress hold the whole memory budget \
                 (--rdma-memory-bytes {})",
                self.budget.limit
            )));
        };
        // A failure drops the charge, and so gives it back.
        self.take_charged(len, size, charge)
    }

    fn take_charged(
        &self,
        len: usize,
        size: usize,
        mut charge: Charge,
    ) -> Result<RegBuf, TakeError> {
        {
            let mut pool = self.pool.lock();
            let best = pool
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.mem.len() >= len)
                .min_by_key(|(_, b)| b.mem.len())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut buf = pool.free.swap_remove(i);
                pool.bytes -= buf.mem.len();
                // Charged for what it is, which may be more than asked.
                let extra = buf.mem.len().saturating_sub(size);
                charge.grow(u64::try_from(extra).unwrap_or(0));
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

    /// Bytes of the budget that transfers hold now.
    pub fn memory_in_use(&self) -> u64 {
        self.budget.in_use()
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
                eprintln!("hipobj-s3-server: {what}: ok in {took:.1} ms ({how})");
                Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_charge_gives_its_bytes_back_and_wakes_a_waiter() {
        let budget = Budget::new(100);
        let soon = || Instant::now() + Duration::from_millis(50);
        let held = budget.charge(60, soon()).expect("room");
        let mut grown = budget.charge(30, soon()).expect("room");
        grown.grow(10);
        assert_eq!(budget.in_use(), 100);
        assert!(budget.charge(1, soon()).is_none(), "the budget is full");
        // Dropped, as a request's buffer is when its handler is dropped.
        drop(grown);
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
