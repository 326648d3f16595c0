//! One pool connection's state and the transitions that change it: the
//! only code that grants or revokes a server's access to client memory.
//!
//! A [`Conn`] is owned by the connection driver (`driver.rs`) and changed
//! by no other thread; the driver calls the `on_*` transitions here as
//! events arrive (commands from transfer threads, completions, RDMA CM
//! events, asynchronous device events, timers). `docs/architecture.md`
//! draws the states.
//!
//! Two state machines move together:
//!
//! - the `Link` to a server: idle (QP in INIT), accepting a connect
//!   request (QP in RTS, window being bound), connected, retired;
//! - the `Job`: free, leased by a thread, or armed for a transfer, which
//!   is waiting for a proof, binding its window, granted, or revoking.
//!
//! Access exists only for an armed job past its proof. Every failure path
//! revokes through [`Conn::reset`], which needs no completion: the QP goes
//! to RESET and a window still bound is deallocated (which invalidates it)
//! and replaced. Only a success revokes in place (an invalidation), which
//! keeps the connection for the next transfer to the same server.

use crate::log::{log, Level};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::slots::{SlotInfo, Slots};
use crate::core::args::Direction;
use crate::core::buffers::BufEntry;
use crate::core::mailbox::Mailbox;
use crate::core::protocol::{
    self, decode_proof_up_to, encode_reject, encode_stripes, Presented, Share, FINAL_DATA_LEN,
    PROOF_LEN, STRIPES_MAX_LEN, VERSION_3, VERSION_4,
};
use crate::core::stats::Stats;
use crate::core::token::Token;
use crate::core::tokens::TokenBook;
use crate::error::{Error, Result};
use crate::platform::{
    AcceptParams, Access, CmConnection, CmRequest, Completion, Cq, Gid, Mr, Mw, Pd, Qp, QpAttr,
    QpCaps, QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

/// `min_rnr_timer` for our QPs: 1 (0.01 ms). The CM's 0 means 655 ms per
/// receiver-not-ready NAK (lab CMTEST P9/P10).
pub const MIN_RNR_TIMER: u8 = 1;
/// `rnr_retry_count` in `rdma_accept`, which becomes the server QP's
/// `rnr_retry`: 7 retries receiver-not-ready forever (IB spec), so a
/// message that races a receive being posted again waits instead of
/// failing.
pub const ACCEPT_RNR_RETRY: u8 = 7;
/// How long a window bind (between RTS and `rdma_accept`) or an
/// invalidation may take before the connection is given up.
pub const WINDOW_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes of one receive buffer: room for an in-band proof.
pub const RECV_BUF_LEN: usize = 64;
/// Bytes of a connection's send buffer: room for a striped transfer's
/// plan, which its grant carries.
pub const SEND_BUF_LEN: usize = STRIPES_MAX_LEN;
/// Unsignaled work requests a connection leaves on its send queue at most.
/// A send queue's slots come free only at a signaled completion (a NIC
/// such as mlx5 learns from it how far its queue has gone), and after a
/// version-4 final message, which invalidates the window without a local
/// invalidation, nothing signaled follows a transfer's bind and grant: a
/// grant that would leave more than this many is signaled.
pub const UNRETIRED_MAX: usize = 8;
/// Receives posted on every connection whose QP is not in ERR: one for an
/// in-band proof and one for the final message, whichever comes first.
pub const RECVS: usize = 2;
/// Queue capacities of a pool QP: on the send queue, a transfer's bind,
/// grant and invalidation, behind the unsignaled binds and grants of
/// earlier transfers that no signaled work request has retired yet (a
/// version-4 final message leaves them there: [`UNRETIRED_MAX`]); two
/// receives.
pub const QP_CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 4,
    max_send_sge: 1,
    max_recv_sge: 1,
};
/// Connect requests with a wrong token that one waiting transfer takes
/// before it is ended: an online guesser gets this many tries at a
/// token's 40 unknown bits (32 of secret, 8 of window key), not as many as
/// it can send before the token's deadline.
pub const MAX_WRONG_PROOFS: u32 = 64;
/// How long a replaced QP is kept (in RESET, reaching nothing) before it
/// is destroyed, so that the device does not hand its number to a new QP
/// while servers' CMs still remember connections to it.
pub const COOLING: Duration = Duration::from_secs(60);

/// What a work request is, in bits 40..48 of its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WrKind {
    /// Receive buffer 0.
    Recv0 = 1,
    /// Receive buffer 1.
    Recv1 = 2,
    /// A window bind.
    Bind = 3,
    /// The grant SEND.
    Grant = 4,
    /// A window invalidation.
    Invalidate = 5,
}

impl WrKind {
    fn from_u8(v: u8) -> Option<WrKind> {
        use WrKind::*;
        [Recv0, Recv1, Bind, Grant, Invalidate]
            .into_iter()
            .find(|k| *k as u8 == v)
    }
}

/// A work request id: the connection (bits 48..64), what it is (40..48)
/// and the connection's sequence number (0..40). Unique among everything a
/// connection has posted, so a completion is filed to exactly one
/// operation, and one of a QP reset since is recognised as stale.
pub fn wr_id(index: usize, kind: WrKind, seq: u64) -> u64 {
    let index = u64::try_from(index).unwrap_or(u64::MAX) & 0xffff;
    index << 48 | u64::from(kind as u8) << 40 | (seq & 0xff_ffff_ffff)
}

/// The connection and kind a work request id names.
pub fn wr_parts(id: u64) -> Option<(usize, WrKind)> {
    let index = usize::try_from(id >> 48).ok()?;
    let kind = WrKind::from_u8(u8::try_from(id >> 40 & 0xff).ok()?)?;
    Some((index, kind))
}

/// How access is granted on this instance's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Type-2 memory windows: MRs carry no remote access; a window bound
    /// over exactly a transfer's range grants it. QPs keep remote read and
    /// write in their access flags, which grant nothing without a key.
    Windows,
    /// No windows: each transfer registers exactly its range in the
    /// connection's own protection domain, and the QP's access flags grant
    /// the direction by an RTS->RTS modify after the proof.
    Regions,
}

impl Mode {
    /// The QP access flags at INIT and RTR.
    fn qp_access(self) -> Access {
        match self {
            Mode::Windows => Access::REMOTE_READ | Access::REMOTE_WRITE,
            Mode::Regions => Access::empty(),
        }
    }
}

/// What a transfer grants once its server has proved its token.
pub enum Grant {
    /// A window over `[addr, addr + len)` of `mr` with `access`, keyed
    /// with the token's rkey.
    Window {
        /// The region the range lies in (registered with `MW_BIND`).
        mr: Arc<dyn Mr>,
        /// First byte, as the NIC addresses it.
        addr: u64,
        /// Bytes.
        len: u64,
    },
    /// A registration of exactly the range (its rkey is the token's),
    /// reachable once the QP's access flags allow the direction.
    Region {
        /// The registration; deregistered when the job ends.
        mr: Arc<dyn Mr>,
    },
}

/// A transfer handed to the driver ([`super::Lease::arm`]).
pub struct Armed {
    /// The token it minted.
    pub token: Token,
    /// Which way the bytes go.
    pub direction: Direction,
    /// What a proof unlocks.
    pub grant: Grant,
    /// Keeps the buffer (and its MR) registered while a window may be
    /// bound over it.
    pub entry: Arc<BufEntry>,
    /// Where the outcome goes, once access is revoked.
    pub mailbox: Arc<Mailbox>,
    /// When the job ends by itself: a token's deadline, or the completion
    /// deadline once the reply is in.
    pub deadline: Option<Instant>,
    /// An application-driven token (no thread waits on it).
    pub detached: bool,
    /// The application released the token (`hipObjPutRdmaToken`): it
    /// runs on, but while no server has proved it, its connection may be
    /// given to a newer token when the pool runs out.
    pub released: bool,
}

/// Where an armed job is.
enum Phase {
    /// The token is out; no server has proved it holds it.
    Waiting,
    /// Proved; the window is being bound (then accepted or granted), which
    /// must be done by `until`.
    Binding { until: Instant },
    /// The server may access the range.
    Granted,
    /// The final message came; the window is being invalidated, which must
    /// be done by `until` (else the connection is reset).
    Revoking { until: Instant },
    /// A striped transfer's primary whose own share has ended (its access
    /// revoked): it waits for every other share to end.
    Joining,
}

/// What part of a transfer a connection's job is.
enum Stripe {
    /// The whole range on this connection (not striped, or not yet).
    Whole,
    /// The primary of a striped transfer: share 0 here, the other shares on
    /// the connections its plan took.
    Primary(Plan),
    /// Share `share` of the striped transfer whose primary is connection
    /// `primary` at `epoch`, through this connection's window keyed `rkey`.
    Share {
        primary: usize,
        epoch: u64,
        share: u16,
        rkey: u32,
    },
}

/// A share of a striped transfer, as its primary arms it on another
/// connection.
pub struct ShareArm {
    /// The connection's epoch on the free list.
    pub epoch: u64,
    /// The share's job: the transfer's token, a window over the share.
    pub armed: Box<Armed>,
    /// The primary connection.
    pub primary: usize,
    /// The primary's epoch.
    pub primary_epoch: u64,
    /// The share's index.
    pub share: u16,
    /// The key the share's window is bound with.
    pub rkey: u32,
}

/// A striped transfer's other shares, as its primary follows them.
struct Plan {
    /// Shares not ended yet: (connection, its epoch, share).
    pending: Vec<(usize, u64, u16)>,
    /// The first failure of any share: the transfer's outcome.
    failed: Option<Error>,
}

impl Plan {
    /// Asks the driver to end every share still pending: the striped
    /// transfer failed.
    fn end_pending(&self, env: &mut Env<'_>) {
        for &(index, epoch, _) in &self.pending {
            env.forward.push(Forward::EndShare {
                index,
                epoch,
                why: Error::Rdma("another share of the striped transfer failed".into()),
            });
        }
    }
}

/// Something a transition asks of another connection: the driver hands
/// it to that connection's [`Conn::handle`] right after the transition
/// returns, before any other event (`driver.rs`, `relay`).
pub enum Forward {
    /// Arm a share of a striped transfer on the free connection `index`,
    /// which its primary took off the free list.
    ArmShare {
        /// The connection.
        index: usize,
        /// The share.
        arm: ShareArm,
    },
    /// End a share: the striped transfer failed or was abandoned.
    EndShare {
        /// The connection.
        index: usize,
        /// Its job's epoch.
        epoch: u64,
        /// Why.
        why: Error,
    },
    /// A share ended, its access revoked: its primary learns the outcome.
    ShareEnded {
        /// The primary connection.
        primary: usize,
        /// The primary's epoch.
        epoch: u64,
        /// The share.
        share: u16,
        /// How it ended.
        outcome: Result<()>,
    },
}

/// The transfer a connection serves.
enum Job {
    /// In the pool's free list.
    Free,
    /// Taken by a thread, not armed yet.
    Leased,
    /// Armed.
    Armed(Box<Armed>, Phase),
}

/// The connection's link to a server.
enum Link {
    /// QP in INIT, receives posted.
    Idle,
    /// A connect request proved the job's token; the QP is in RTS and the
    /// window is being bound; `rdma_accept` follows the bind, with `reply`
    /// as the REP's private data (a striped transfer's plan, or nothing).
    Accepting {
        request: Box<dyn CmRequest>,
        peer: Gid,
        reply: Vec<u8>,
    },
    /// Established.
    Connected {
        cm: Arc<dyn CmConnection>,
        peer: Gid,
        /// When its last transfer ended (for the idle timeout).
        used: Instant,
    },
    /// Could not be reset: never used again.
    Retired,
}

/// A type-2 memory window and what it is doing.
struct Window {
    mw: Arc<dyn Mw>,
    /// The rkey it carries: the allocation's, then its last bind's.
    rkey: u32,
    /// Bound (or being bound, or being invalidated): it must be invalidated
    /// or replaced before the slot is free again.
    bound: bool,
}

/// When the driver must look at each connection next, earliest first:
/// (when, slot). A connection keeps at most one entry it counts on (its
/// [`Conn::timer`]); an entry that fires finds what is due by the
/// connection's own deadlines, so one left over from an earlier job does
/// nothing. The heap holds a few entries per connection, whatever the
/// transfer rate.
#[derive(Default)]
pub struct Timers(std::collections::BinaryHeap<std::cmp::Reverse<(Instant, usize)>>);

impl Timers {
    /// Looks at slot `index` at `at`.
    fn push(&mut self, at: Instant, index: usize) {
        self.0.push(std::cmp::Reverse((at, index)));
    }

    /// The earliest entry's time.
    pub fn next(&self) -> Option<Instant> {
        self.0.peek().map(|r| r.0 .0)
    }

    /// Takes the earliest entry if it is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, usize)> {
        if self.next()? > now {
            return None;
        }
        self.0.pop().map(|r| r.0)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// QPs replaced by [`Conn::reset`], oldest first, kept for [`COOLING`]
/// and at most `cap` of them.
pub struct Cooling {
    qps: std::collections::VecDeque<(Instant, Arc<dyn Qp>)>,
    cap: usize,
}

impl Cooling {
    /// Keeps at most `cap` QPs.
    pub fn new(cap: usize) -> Cooling {
        Cooling {
            qps: std::collections::VecDeque::new(),
            cap,
        }
    }

    /// Keeps `qp` (already in RESET) and destroys the QPs kept long
    /// enough, or too many.
    fn keep(&mut self, qp: Arc<dyn Qp>, now: Instant) {
        self.qps.push_back((now, qp));
        while self
            .qps
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= COOLING || self.qps.len() > self.cap)
        {
            self.qps.pop_front();
        }
    }
}

/// The driver's shared pieces that transitions use.
pub struct Env<'a> {
    /// The instance's counters.
    pub stats: &'a Stats,
    /// Where free slots go: the pool, as far as a transition may touch it.
    pub pool: &'a dyn Slots,
    /// The pool's CQ (of every QP, and of a replacement QP).
    pub cq: &'a Arc<dyn Cq>,
    /// QP number -> slot, of the QPs the connections have now (for the
    /// device's asynchronous events).
    pub by_qp: &'a mut HashMap<u32, usize>,
    /// Replaced QPs.
    pub cooling: &'a mut Cooling,
    /// The port every QP uses.
    pub port: u8,
    /// How access is granted.
    pub mode: Mode,
    /// Receive memory.
    pub recv_bufs: &'a RecvBuffers,
    /// CM connection id -> slot.
    pub by_cm: &'a mut HashMap<u64, usize>,
    /// Deadlines to watch.
    pub timers: &'a mut Timers,
    /// How long a transfer waits for its final message after the reply.
    pub completion_timeout: Duration,
    /// How long an established connection may stay unused.
    pub idle_timeout: Duration,
    /// `HIPOBJ_RDMA_DEBUG`: say why a connect request was refused.
    pub debug: bool,
    /// Where application-driven GETs into staged buffers are recorded.
    pub tokens: &'a TokenBook,
    /// The instance is shut down: application-driven tokens are ended and
    /// no new one is armed.
    pub closing: bool,
    /// What transitions ask of other connections (striped transfers).
    pub forward: &'a mut Vec<Forward>,
    /// How a transfer may be striped.
    pub striping: Striping,
}

/// How transfers are striped over several connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Striping {
    /// The highest protocol version the client accepts: 4, or 3 or 2 to
    /// behave as a client of that version (`HIPOBJ_PROTOCOL`); 3 at most
    /// without windows.
    pub protocol: u8,
    /// Connections a transfer moves over at most (`HIPOBJ_STRIPES`, by
    /// device): 1 never stripes.
    pub stripes: usize,
    /// The smallest transfer that is striped (`HIPOBJ_STRIPE_MIN`).
    pub min_len: u64,
}

/// The receive buffers of every connection: `RECVS` of `RECV_BUF_LEN`
/// bytes each, written by the NIC, read by the driver after the
/// completion. Atomic bytes: the memory is shared with the device.
pub struct RecvBuffers {
    mem: Box<[AtomicU8]>,
    /// The registration of each connection's buffers (one per protection
    /// domain: shared in [`Mode::Windows`], the connection's own in
    /// [`Mode::Regions`]).
    mrs: Vec<Arc<dyn Mr>>,
}

impl RecvBuffers {
    /// Allocates the buffers of `pds.len()` connections and registers each
    /// connection's part in its PD (local write only). `shared` says that
    /// every PD is the same one (then one registration serves all).
    pub fn new(pds: &[Arc<dyn Pd>], shared: bool) -> Result<RecvBuffers> {
        let per_conn = Self::PER_CONN;
        let mem: Box<[AtomicU8]> = (0..pds.len() * per_conn)
            .map(|_| AtomicU8::new(0))
            .collect();
        let base = mem.as_ptr().expose_provenance();
        let mrs = if shared {
            match pds.first() {
                Some(pd) => vec![pd.reg_mr(base, mem.len(), Access::LOCAL_WRITE)?],
                None => Vec::new(),
            }
        } else {
            pds.iter()
                .enumerate()
                .map(|(i, pd)| pd.reg_mr(base + i * per_conn, per_conn, Access::LOCAL_WRITE))
                .collect::<Result<Vec<_>>>()?
        };
        Ok(RecvBuffers { mem, mrs })
    }

    /// Bytes of one connection's part: its receive buffers, then its send
    /// buffer.
    const PER_CONN: usize = RECVS * RECV_BUF_LEN + SEND_BUF_LEN;

    fn offset(index: usize, buf: usize) -> usize {
        index * Self::PER_CONN + buf * RECV_BUF_LEN
    }

    /// Writes `bytes` to connection `index`'s send buffer: the gather
    /// entry of a SEND of them (the driver's thread alone writes it, and
    /// never while a SEND of it is outstanding: one grant per proof).
    fn send_sge(&self, index: usize, bytes: &[u8]) -> Option<Sge> {
        if bytes.len() > SEND_BUF_LEN {
            return None;
        }
        let at = index * Self::PER_CONN + RECVS * RECV_BUF_LEN;
        for (slot, b) in self.mem[at..at + bytes.len()].iter().zip(bytes) {
            slot.store(*b, Ordering::Release);
        }
        let mr = self.mr(index)?;
        let base = self.mem.as_ptr().expose_provenance();
        Some(Sge {
            addr: u64::try_from(base + at).ok()?,
            len: u32::try_from(bytes.len()).ok()?,
            lkey: mr.lkey(),
        })
    }

    fn mr(&self, index: usize) -> Option<&Arc<dyn Mr>> {
        self.mrs.get(index).or_else(|| self.mrs.first())
    }

    /// The scatter entry of connection `index`'s buffer `buf`.
    fn sge(&self, index: usize, buf: usize) -> Option<Sge> {
        let mr = self.mr(index)?;
        let base = self.mem.as_ptr().expose_provenance();
        let addr = u64::try_from(base + Self::offset(index, buf)).ok()?;
        Some(Sge {
            addr,
            len: u32::try_from(RECV_BUF_LEN).ok()?,
            lkey: mr.lkey(),
        })
    }

    /// The first `len` bytes received into connection `index`'s buffer.
    fn read(&self, index: usize, buf: usize, len: usize) -> Vec<u8> {
        let at = Self::offset(index, buf);
        self.mem[at..at + len.min(RECV_BUF_LEN)]
            .iter()
            .map(|b| b.load(Ordering::Acquire))
            .collect()
    }
}

/// What happens to a connection: the driver hands every event to
/// [`Conn::handle`], the one way into its transitions.
pub enum Event<'e> {
    /// A transfer is armed on the slot its thread leased.
    Arm {
        /// The lease's epoch.
        epoch: u64,
        /// The transfer.
        armed: Box<Armed>,
    },
    /// The transfer's S3 conversation ended (`ok`: answered success).
    Replied {
        /// The lease's epoch.
        epoch: u64,
        /// Whether the server answered success.
        ok: bool,
    },
    /// The job ends from outside: its lease was dropped, its buffer
    /// deregistered, its token taken back, the instance shut down.
    Abort {
        /// The lease's epoch ([`Conn::epoch`] for "whatever job is there").
        epoch: u64,
        /// The outcome the job ends with.
        why: Error,
    },
    /// The application released the token with this secret.
    Released {
        /// The token's secret.
        secret: u32,
    },
    /// A connect request named this connection.
    ConnectRequest {
        /// The token its private data carries, with its version and share.
        token: &'e Presented,
        /// The request, to accept or refuse.
        request: Box<dyn CmRequest>,
    },
    /// A completion of this connection's QP, filed by its wr_id.
    Completion {
        /// The completion.
        completion: &'e Completion,
        /// What its work request was.
        kind: WrKind,
    },
    /// The device reported the QP in error.
    QpFailed {
        /// What the device said.
        why: &'e str,
    },
    /// The server disconnected.
    Disconnected,
    /// An entry of [`Timers`] for this connection, taken at `now`.
    Timer {
        /// The entry's time.
        at: Instant,
    },
    /// Shutdown: end the job, disconnect.
    Shut {
        /// The outcome a job ends with.
        why: &'e Error,
    },
    /// A striped transfer's primary armed a share on this free connection
    /// ([`Forward::ArmShare`]).
    ArmShare(ShareArm),
    /// One of this primary's shares ended ([`Forward::ShareEnded`]).
    ShareEnded {
        /// The primary's epoch the share was armed for.
        epoch: u64,
        /// The share.
        share: u16,
        /// How it ended.
        outcome: Result<()>,
    },
}

/// A pool connection.
pub struct Conn {
    /// Index in the pool.
    pub index: usize,
    /// The number tokens give for this connection: its first QP's, for
    /// its whole life (the QP itself is replaced after each link).
    pub name: u32,
    /// The QP. Its CQ is the pool's.
    pub qp: Arc<dyn Qp>,
    /// The QP left INIT toward a server: it is replaced, not reused,
    /// when the link ends.
    aimed: bool,
    /// The PD of the QP (and of windows, or of per-transfer regions).
    pub pd: Arc<dyn Pd>,
    window: Option<Window>,
    link: Link,
    job: Job,
    /// Bumped whenever the slot goes back to the free list: commands of an
    /// older lease are ignored.
    pub epoch: u64,
    /// When the present job was armed.
    armed_at: Instant,
    /// Connect requests with a wrong token while the present job waited.
    wrong_proofs: u32,
    /// The time of the entry of [`Timers`] this connection counts on.
    timer: Option<Instant>,
    /// A retired connection whose QP may still reach this buffer keeps it
    /// registered, for good.
    pinned: Option<Arc<BufEntry>>,
    /// Posted receives, by buffer.
    recvs: [Option<u64>; RECVS],
    /// Posted send work requests (bind, grant, invalidate) not completed.
    sends: Vec<u64>,
    next_seq: u64,
    /// The armed job's part of a striped transfer.
    stripe: Stripe,
}

impl Conn {
    /// A connection over `qp` (in RESET), with `mw` where the device has
    /// windows: moves the QP to INIT with its receives posted.
    pub fn new(
        index: usize,
        qp: Arc<dyn Qp>,
        pd: Arc<dyn Pd>,
        mw: Option<Arc<dyn Mw>>,
        env: &Env<'_>,
    ) -> Result<Conn> {
        let mut conn = Conn {
            index,
            name: qp.qp_num(),
            qp,
            aimed: false,
            pd,
            window: mw.map(|mw| Window {
                rkey: mw.rkey(),
                mw,
                bound: false,
            }),
            link: Link::Idle,
            job: Job::Free,
            epoch: 0,
            armed_at: Instant::now(),
            wrong_proofs: 0,
            timer: None,
            pinned: None,
            recvs: [None; RECVS],
            sends: Vec::new(),
            next_seq: 0,
            stripe: Stripe::Whole,
        };
        conn.qp.modify(&init_attr(env.port, env.mode))?;
        conn.post_recvs(env)?;
        Ok(conn)
    }

    /// Runs the transition `event` calls for, then makes sure the driver
    /// looks at the connection again when its next deadline falls due.
    pub fn handle(&mut self, event: Event<'_>, env: &mut Env<'_>) {
        let now = Instant::now();
        match event {
            Event::Arm { epoch, armed } => self.on_arm(epoch, armed, env),
            Event::Replied { epoch, ok } => self.on_replied(epoch, ok, now, env),
            Event::Abort { epoch, why } => self.on_abort(epoch, why, env),
            Event::Released { secret } => self.on_released(secret),
            Event::ConnectRequest { token, request } => {
                self.on_connect_request(token, request, env)
            }
            Event::Completion { completion, kind } => self.on_completion(completion, kind, env),
            Event::QpFailed { why } => self.on_qp_failed(why, env),
            Event::Disconnected => self.on_disconnected(env),
            Event::Timer { at } => self.on_timer(at, now, env),
            Event::Shut { why } => self.shut(why, env),
            Event::ArmShare(arm) => {
                let stripe = Stripe::Share {
                    primary: arm.primary,
                    epoch: arm.primary_epoch,
                    share: arm.share,
                    rkey: arm.rkey,
                };
                self.on_arm_as(arm.epoch, arm.armed, stripe, env)
            }
            Event::ShareEnded {
                epoch,
                share,
                outcome,
            } => self.on_share_ended(epoch, share, outcome, env),
        }
        self.watch(env);
    }

    /// What a thread that leases this slot needs to know.
    pub fn slot_info(&self) -> SlotInfo {
        SlotInfo {
            index: self.index,
            epoch: self.epoch,
            qp_num: self.name,
            window_rkey: self.window.as_ref().map(|w| w.rkey),
            peer: match &self.link {
                Link::Connected { peer, .. } => Some(*peer),
                _ => None,
            },
            pd: self.pd.clone(),
        }
    }

    /// Whether the connection can serve transfers.
    pub fn is_retired(&self) -> bool {
        matches!(self.link, Link::Retired)
    }

    /// The CM connection id of an established link.
    pub fn cm_id(&self) -> Option<u64> {
        match &self.link {
            Link::Connected { cm, .. } => Some(cm.id()),
            _ => None,
        }
    }

    /// When something of this connection falls due: its job's deadline,
    /// the end of a window bind or invalidation, or the idle timeout of an
    /// unused established link.
    fn next_due(&self, idle_timeout: Duration) -> Option<Instant> {
        match (&self.job, &self.link) {
            (Job::Armed(a, phase), _) => {
                let step = match phase {
                    Phase::Binding { until } | Phase::Revoking { until } => Some(*until),
                    Phase::Waiting | Phase::Granted | Phase::Joining => None,
                };
                match (a.deadline, step) {
                    (Some(d), Some(s)) => Some(d.min(s)),
                    (d, s) => d.or(s),
                }
            }
            (Job::Free, Link::Connected { used, .. }) => Some(*used + idle_timeout),
            _ => None,
        }
    }

    /// Makes sure the driver looks at this connection when its next
    /// deadline falls due: one entry of [`Timers`] at a time, unless an
    /// earlier one is needed. Run after every event ([`Conn::handle`]).
    fn watch(&mut self, env: &mut Env<'_>) {
        let Some(at) = self.next_due(env.idle_timeout) else {
            return;
        };
        if self.timer.is_none_or(|pending| at < pending) {
            env.timers.push(at, self.index);
            self.timer = Some(at);
        }
    }

    /// Whether the job is application-driven, for a buffer at `base`.
    pub fn has_token_on(&self, base: usize) -> bool {
        matches!(&self.job, Job::Armed(a, _) if a.detached && a.entry.base == base)
    }

    /// Whether the job is application-driven.
    pub fn has_token(&self) -> bool {
        matches!(&self.job, Job::Armed(a, _) if a.detached)
    }

    /// Whether the connection should be free again soon: it serves a
    /// transfer a thread waits on (or a thread leased it), or a token a
    /// server has proved (it ends at its final message). A token no server
    /// has proved holds its connection until its deadline.
    pub fn frees_soon(&self, pool: &dyn Slots) -> bool {
        match &self.job {
            Job::Armed(a, phase) => !a.detached || !matches!(phase, Phase::Waiting),
            Job::Leased => true,
            Job::Free => !self.is_retired() && !pool.is_free(self.index),
        }
    }

    /// The application released the token with this secret (it ends
    /// nothing: its server may still be on its way).
    fn on_released(&mut self, secret: u32) {
        if let Job::Armed(a, _) = &mut self.job {
            if a.detached && a.token.secret == secret {
                a.released = true;
            }
        }
    }

    /// When the job was armed, if it is a released token no server has
    /// proved: one the pool may take back for a newer token.
    pub fn reclaimable_since(&self) -> Option<Instant> {
        match &self.job {
            Job::Armed(a, Phase::Waiting) if a.detached && a.released => Some(self.armed_at),
            _ => None,
        }
    }

    fn next_wr(&mut self, kind: WrKind) -> u64 {
        self.next_seq += 1;
        wr_id(self.index, kind, self.next_seq)
    }

    /// Posts every receive buffer that is not posted.
    fn post_recvs(&mut self, env: &Env<'_>) -> Result<()> {
        for buf in 0..RECVS {
            if self.recvs[buf].is_some() {
                continue;
            }
            let kind = if buf == 0 {
                WrKind::Recv0
            } else {
                WrKind::Recv1
            };
            let id = self.next_wr(kind);
            let sge = env
                .recv_bufs
                .sge(self.index, buf)
                .ok_or_else(|| Error::Internal("no receive buffer".into()))?;
            self.qp.post_recv(RecvWr {
                wr_id: id,
                sge: Some(sge),
            })?;
            self.recvs[buf] = Some(id);
        }
        Ok(())
    }

    // ------------------------------------------------------------ reset

    /// Takes the connection back to Idle, revoking whatever it granted
    /// without waiting for any completion: the CM connection (or request)
    /// is ended, the QP goes to RESET (posted work vanishes), a window
    /// still bound is deallocated, which invalidates it, and replaced, a
    /// per-transfer region goes with its job, then INIT and fresh
    /// receives. A QP that cannot be reset is fenced and replaced
    /// ([`Conn::fence_and_renew`]); a connection that cannot be brought
    /// back at all is retired.
    pub fn reset(&mut self, env: &mut Env<'_>) {
        match std::mem::replace(&mut self.link, Link::Idle) {
            Link::Connected { cm, .. } => {
                env.by_cm.remove(&cm.id());
                if let Err(e) = cm.disconnect() {
                    log!(Level::Warn, "rdma_disconnect: {e}");
                }
            }
            Link::Accepting { request, .. } => {
                if let Err(e) = request.reject(&encode_reject()) {
                    log!(Level::Warn, "rdma_reject: {e}");
                }
            }
            Link::Idle => {}
            Link::Retired => {
                self.link = Link::Retired;
                return;
            }
        }
        let outcome = match self.qp.modify(&QpAttr {
            state: Some(QpState::Reset),
            ..QpAttr::default()
        }) {
            Ok(()) => self.reset_qp(env).map_err(|e| (e, true)),
            Err(e) => {
                log!(
                    Level::Warn,
                    "connection {}: QP {} did not go to RESET ({e}); fencing it",
                    self.index,
                    self.qp.qp_num()
                );
                self.fence_and_renew(env)
            }
        };
        if let Err((e, fenced)) = outcome {
            log!(Level::Warn, "retiring connection {}: {e}", self.index);
            self.link = Link::Retired;
            env.pool.retire();
            if !fenced {
                // The old QP may still reach the job's buffer: keep the
                // buffer registered (its deregistration answers Busy)
                // and its memory alive, for good.
                if let Job::Armed(a, _) = &self.job {
                    self.pinned = Some(a.entry.clone());
                }
                log!(
                    Level::Error,
                    "connection {}: QP {} could be neither reset, moved to ERR nor replaced; \
                     its buffer stays registered",
                    self.index,
                    self.qp.qp_num()
                );
            }
        }
    }

    /// After RESET: no posted work, a bound window replaced, a QP that
    /// left INIT replaced, then INIT and receives.
    fn reset_qp(&mut self, env: &mut Env<'_>) -> Result<()> {
        self.recvs = [None; RECVS];
        self.sends.clear();
        self.replace_bound_window()?;
        if self.aimed {
            self.renew_qp(env);
        }
        self.qp.modify(&init_attr(env.port, env.mode))?;
        self.post_recvs(env)
    }

    /// A window bound through a QP that went through RESET (or ERR)
    /// cannot be invalidated through it any more, and rxe will not bind it
    /// again: deallocating it invalidates it. It is replaced by a new one;
    /// without one, it is gone all the same.
    fn replace_bound_window(&mut self) -> Result<()> {
        let Some(w) = &mut self.window else {
            return Ok(());
        };
        if !w.bound {
            return Ok(());
        }
        match self.pd.alloc_mw() {
            Ok(mw) => {
                w.rkey = mw.rkey();
                w.mw = mw;
                w.bound = false;
                Ok(())
            }
            Err(e) => {
                self.window = None;
                Err(e)
            }
        }
    }

    /// The QP did not go to RESET: it is moved to ERR (where it reaches
    /// nothing), a bound window is deallocated, and the QP is replaced by
    /// a new one (the old one cools off in ERR, or is destroyed at once if
    /// it would not even go to ERR). The error says whether the old QP is
    /// known to reach nothing any more (moved to ERR, or destroyed).
    fn fence_and_renew(&mut self, env: &mut Env<'_>) -> std::result::Result<(), (Error, bool)> {
        let erred = self
            .qp
            .modify(&QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            })
            .is_ok();
        self.recvs = [None; RECVS];
        self.sends.clear();
        let window = self.replace_bound_window();
        let qp = self.pd.create_qp(env.cq, QP_CAPS).map_err(|e| (e, erred))?;
        let old = std::mem::replace(&mut self.qp, qp);
        env.by_qp.remove(&old.qp_num());
        env.by_qp.insert(self.qp.qp_num(), self.index);
        if erred {
            env.cooling.keep(old, Instant::now());
        } else {
            drop(old);
        }
        self.aimed = false;
        window.map_err(|e| (e, true))?;
        self.qp
            .modify(&init_attr(env.port, env.mode))
            .map_err(|e| (e, true))?;
        self.post_recvs(env).map_err(|e| (e, true))
    }

    /// Replaces the QP (in RESET) that served a link with a new one: the
    /// server's CM keeps the number of a QP it was connected to in
    /// time-wait, and refuses a new connection to the same number
    /// (`IB_CM_REJ_STALE_CONN`); and the old server's packets find no QP.
    /// The old QP cools off before it is destroyed. Without a new QP the
    /// old one is used again.
    fn renew_qp(&mut self, env: &mut Env<'_>) {
        match self.pd.create_qp(env.cq, QP_CAPS) {
            Ok(qp) => {
                let old = std::mem::replace(&mut self.qp, qp);
                env.by_qp.remove(&old.qp_num());
                env.by_qp.insert(self.qp.qp_num(), self.index);
                env.cooling.keep(old, Instant::now());
                self.aimed = false;
            }
            Err(e) => log!(
                Level::Warn,
                "connection {}: no new QP ({e}); QP {} serves again",
                self.index,
                self.qp.qp_num()
            ),
        }
    }

    // ------------------------------------------------------------ jobs

    /// A transfer is armed on the slot its thread leased: from now on a
    /// server may prove its token.
    ///
    /// The driver sees a slot a thread took from the free list as
    /// `Job::Free` until its Arm (or Release) arrives, with the epoch the
    /// free list handed out.
    fn on_arm(&mut self, epoch: u64, armed: Box<Armed>, env: &mut Env<'_>) {
        self.on_arm_as(epoch, armed, Stripe::Whole, env);
    }

    /// [`Conn::on_arm`] for the job's part of a transfer: the whole, or a
    /// share a striped transfer's primary armed here (whose outcome goes to
    /// the primary, not to a mailbox).
    fn on_arm_as(&mut self, epoch: u64, armed: Box<Armed>, stripe: Stripe, env: &mut Env<'_>) {
        if epoch != self.epoch || !matches!(self.job, Job::Free) {
            log!(
                Level::Error,
                "connection {}: an Arm of epoch {epoch} found epoch {}",
                self.index,
                self.epoch
            );
            let why = Error::Internal(format!(
                "connection {} was not leased at epoch {epoch}",
                self.index
            ));
            return Self::not_armed(armed.mailbox, &stripe, why, env);
        }
        if self.is_retired() {
            let why = Error::Rdma("the connection failed and was retired".into());
            return Self::not_armed(armed.mailbox, &stripe, why, env);
        }
        if env.closing && armed.detached {
            // Minted as the library shut down: never armed.
            armed.mailbox.fill(Err(Error::NotInitialized));
            return self.release(env);
        }
        self.armed_at = Instant::now();
        self.wrong_proofs = 0;
        let rkey = match &stripe {
            Stripe::Share { rkey, .. } => *rkey,
            _ => armed.token.rkey,
        };
        let window_ok = match (&self.window, &armed.grant) {
            (Some(w), Grant::Window { .. }) => rkey & !0xff == w.rkey & !0xff,
            (None, Grant::Region { .. }) => true,
            _ => false,
        };
        self.job = Job::Armed(armed, Phase::Waiting);
        self.stripe = stripe;
        if !window_ok {
            self.finish(
                Err(Error::Internal(
                    "the token's rkey is not this connection's window".into(),
                )),
                env,
            );
        }
    }

    /// A job that could not be armed ends at once: its thread learns why,
    /// or, for a share, its primary.
    fn not_armed(mailbox: Arc<Mailbox>, stripe: &Stripe, why: Error, env: &mut Env<'_>) {
        match stripe {
            Stripe::Share {
                primary,
                epoch,
                share,
                ..
            } => env.forward.push(Forward::ShareEnded {
                primary: *primary,
                epoch: *epoch,
                share: *share,
                outcome: Err(why),
            }),
            _ => mailbox.fill(Err(why)),
        }
    }

    /// The thread's S3 conversation ended: `ok` if the server answered
    /// success. A success before any proof means the server never touched
    /// the range by RDMA; a failure ends the job at once.
    fn on_replied(&mut self, epoch: u64, ok: bool, now: Instant, env: &mut Env<'_>) {
        if epoch != self.epoch {
            return;
        }
        let Job::Armed(armed, phase) = &mut self.job else {
            return;
        };
        if !ok {
            return self.finish(Err(Error::S3("the S3 request failed".into())), env);
        }
        if matches!(phase, Phase::Waiting) {
            return self.finish(
                Err(Error::Rdma(
                    "the server replied without proving it holds this transfer's token \
                     (it never connected, or never sent its proof)"
                        .into(),
                )),
                env,
            );
        }
        let at = now + env.completion_timeout;
        if armed.deadline.is_none_or(|d| d > at) {
            armed.deadline = Some(at);
        }
    }

    /// The lease was dropped (its thread failed or unwound) or the job is
    /// ended from outside (deregistration, token release, shutdown).
    fn on_abort(&mut self, epoch: u64, why: Error, env: &mut Env<'_>) {
        if epoch != self.epoch {
            return;
        }
        match self.job {
            Job::Armed(..) => self.finish(Err(why), env),
            // A lease dropped before its Arm.
            Job::Free | Job::Leased => self.release(env),
        }
    }

    /// The driver looks at the connection at `now`, for the entry of
    /// [`Timers`] at `at`: whatever fell due is handled (a job's deadline,
    /// a window step that did not complete, an idle link).
    fn on_timer(&mut self, at: Instant, now: Instant, env: &mut Env<'_>) {
        if self.timer == Some(at) {
            self.timer = None;
        }
        match &self.job {
            Job::Armed(armed, phase) => {
                if armed.deadline.is_some_and(|d| d <= now) {
                    let why = if matches!(phase, Phase::Waiting) {
                        "no server proved this transfer's token before its deadline"
                    } else {
                        "the transfer did not end (no valid final message) before its deadline"
                    };
                    return self.finish(Err(Error::Rdma(why.into())), env);
                }
                match phase {
                    Phase::Binding { until } if *until <= now => self.finish(
                        Err(Error::Rdma(format!(
                            "binding the window of QP {} did not complete",
                            self.qp.qp_num()
                        ))),
                        env,
                    ),
                    // The data is in; the window goes with a reset.
                    Phase::Revoking { until } if *until <= now => self.succeed_by_reset(env),
                    _ => {}
                }
            }
            Job::Free => {
                let idle = matches!(&self.link, Link::Connected { used, .. }
                    if *used + env.idle_timeout <= now);
                if idle && env.pool.is_free(self.index) {
                    self.reset_free(env);
                }
            }
            Job::Leased => {}
        }
    }

    /// Resets a connection with no job: on the free list, or leased by a
    /// thread whose Arm has not arrived (the driver runs it after this
    /// transition, on the reset link). The slot stays on the free list,
    /// which is told what changed (no server any more, or retired).
    fn reset_free(&mut self, env: &mut Env<'_>) {
        self.reset(env);
        if self.is_retired() {
            env.pool.take_free(self.index);
        } else {
            env.pool.refresh(self.slot_info());
        }
    }

    /// Ends the armed job with `outcome`, revoking first. A job that never
    /// got a proof granted nothing and keeps its link; any other is reset.
    fn finish(&mut self, outcome: Result<()>, env: &mut Env<'_>) {
        if let (true, Err(e)) = (env.debug, &outcome) {
            log!(
                Level::Debug,
                "QP {}: a transfer ends: {e}",
                self.qp.qp_num()
            );
        }
        let granted = matches!(&self.job, Job::Armed(_, phase)
            if !matches!(phase, Phase::Waiting | Phase::Joining));
        if granted || matches!(self.link, Link::Accepting { .. }) {
            self.reset(env);
        }
        self.conclude(outcome, None, env);
    }

    /// This connection's part of the job is over, its access revoked, with
    /// `outcome`: a job that is the whole transfer (or a share) ends; a
    /// striped transfer's primary first ends every other share (on a
    /// failure) and waits for all of them ([`Phase::Joining`]).
    fn conclude(&mut self, outcome: Result<()>, peer: Option<Gid>, env: &mut Env<'_>) {
        let Stripe::Primary(plan) = &mut self.stripe else {
            return self.end_job(outcome, peer, env);
        };
        if let Err(e) = outcome {
            plan.failed.get_or_insert(e);
        }
        if plan.failed.is_some() {
            plan.end_pending(env);
        }
        if let Job::Armed(_, phase) = &mut self.job {
            *phase = Phase::Joining;
        }
        self.join(env);
    }

    /// A striped transfer's primary whose own share is over: ends the job
    /// once no other share is pending, with the first failure, if any.
    fn join(&mut self, env: &mut Env<'_>) {
        let Stripe::Primary(plan) = &mut self.stripe else {
            return;
        };
        if !plan.pending.is_empty() || !matches!(self.job, Job::Armed(_, Phase::Joining)) {
            return;
        }
        let outcome = plan.failed.take().map_or(Ok(()), Err);
        let peer = match (&outcome, &self.link) {
            (Ok(()), Link::Connected { peer, .. }) => Some(*peer),
            _ => None,
        };
        self.end_job(outcome, peer, env);
    }

    /// One of this primary's shares ended, its access revoked.
    fn on_share_ended(&mut self, epoch: u64, share: u16, outcome: Result<()>, env: &mut Env<'_>) {
        if epoch != self.epoch {
            return;
        }
        let Stripe::Primary(plan) = &mut self.stripe else {
            return;
        };
        let Some(pos) = plan.pending.iter().position(|p| p.2 == share) else {
            return;
        };
        plan.pending.swap_remove(pos);
        let Err(e) = outcome else {
            return self.join(env);
        };
        let first = plan.failed.is_none();
        plan.failed.get_or_insert(e.clone());
        match &self.job {
            // The primary's own share is still live: it ends too, and with
            // it every other share.
            Job::Armed(_, phase) if !matches!(phase, Phase::Joining) => self.finish(Err(e), env),
            _ => {
                if first {
                    plan.end_pending(env);
                }
                self.join(env)
            }
        }
    }

    /// Takes the job (its access is revoked already), frees the slot, and
    /// tells the outcome (with the server's GID on success).
    fn end_job(&mut self, outcome: Result<()>, peer: Option<Gid>, env: &mut Env<'_>) {
        let key = (self.index, self.epoch);
        let armed = std::mem::replace(&mut self.job, Job::Leased);
        let stripe = std::mem::replace(&mut self.stripe, Stripe::Whole);
        // The slot is free again before the outcome is told, so that a
        // thread that has its outcome finds its connection back.
        self.release(env);
        if let Job::Armed(armed, _) = armed {
            let Armed {
                mailbox,
                grant,
                entry,
                detached,
                ..
            } = *armed;
            if detached {
                env.tokens.ended(entry.base, key, &outcome);
            }
            // Access is gone (or never was): the region (if any) and the
            // buffer may go, and the outcome may be told.
            drop(grant);
            drop(entry);
            if let Stripe::Share {
                primary,
                epoch,
                share,
                ..
            } = stripe
            {
                env.forward.push(Forward::ShareEnded {
                    primary,
                    epoch,
                    share,
                    outcome,
                });
                return;
            }
            if let Some(peer) = peer {
                mailbox.set_peer(peer);
            }
            mailbox.fill(outcome);
        }
    }

    /// Returns a leased slot to the free list at a new epoch.
    fn release(&mut self, env: &mut Env<'_>) {
        self.job = Job::Free;
        self.release_free(env);
    }

    fn release_free(&mut self, env: &mut Env<'_>) {
        self.epoch += 1;
        if self.is_retired() {
            return;
        }
        if let Link::Connected { used, .. } = &mut self.link {
            *used = Instant::now();
        }
        env.pool.put_back(self.slot_info());
    }

    // ------------------------------------------------------------ peers

    /// A connect request whose private data named this slot's QP.
    fn on_connect_request(
        &mut self,
        presented: &Presented,
        request: Box<dyn CmRequest>,
        env: &mut Env<'_>,
    ) {
        let proved = matches!(&self.job, Job::Armed(a, Phase::Waiting)
            if proves(&self.stripe, a, presented));
        if !proved || self.is_retired() {
            // Not waiting, another token, or a second request with a token
            // already proved: refused, and the job is not disturbed. The
            // refusal goes out before anything else is done, the same for
            // every reason.
            let wrong = matches!(&self.job, Job::Armed(_, Phase::Waiting)) && !self.is_retired();
            let source = (wrong && self.wrong_proofs + 1 == MAX_WRONG_PROOFS)
                .then(|| request_source(&*request));
            refuse(request);
            if env.debug {
                log!(
                    Level::Debug,
                    "QP {}: refused a connect request: {}",
                    self.qp.qp_num(),
                    self.why_not_proved(presented)
                );
            }
            if wrong {
                self.wrong_proofs += 1;
                if self.wrong_proofs >= MAX_WRONG_PROOFS {
                    log!(
                        Level::Warn,
                        "QP {}: {MAX_WRONG_PROOFS} connect requests with a wrong token for one \
                         waiting transfer (the last from {}): the transfer is ended",
                        self.qp.qp_num(),
                        source.unwrap_or_else(|| "an unknown source".into())
                    );
                    return self.finish(
                        Err(Error::Rdma(format!(
                            "{MAX_WRONG_PROOFS} connect requests with a wrong token reached this \
                             transfer's connection: it was ended so that its token cannot be \
                             guessed; the transfer may be tried again"
                        ))),
                        env,
                    );
                }
            }
            return;
        }
        if let Job::Armed(a, _) = &self.job {
            a.mailbox.set_proved();
        }
        // Re-aiming an RC QP: away from its old server first (the old
        // server's packets no longer reach it).
        if !matches!(self.link, Link::Idle) {
            self.reset(env);
            if self.is_retired() {
                refuse(request);
                return self.finish(
                    Err(Error::Rdma("the connection could not be reset".into())),
                    env,
                );
            }
        }
        let peer = match self.connect_qp(&*request, env.mode) {
            Ok(peer) => peer,
            Err(e) => {
                refuse(request);
                log!(Level::Warn, "connecting QP {}: {e}", self.qp.qp_num());
                // The QP may be half way (RTR): back to INIT (a new QP)
                // before the slot serves again.
                self.reset(env);
                return self.finish(Err(e), env);
            }
        };
        let plan = match presented.version >= VERSION_3 && presented.share == 0 {
            true => self.plan(Some(peer), env),
            false => None,
        };
        let Job::Armed(armed, phase) = &mut self.job else {
            return refuse(request);
        };
        match &armed.grant {
            Grant::Window { mr, addr, len } => {
                let len = plan.as_ref().map_or(*len, |shares| shares[0].len);
                let (mr, addr, rkey) = (mr.clone(), *addr, key_of(&self.stripe, armed));
                let access = armed.direction.access();
                let until = Instant::now() + WINDOW_TIMEOUT;
                *phase = Phase::Binding { until };
                // The plan goes to the server in the REP, once the bind of
                // share 0 is done.
                let reply = plan
                    .map(|shares| encode_stripes(&shares))
                    .unwrap_or_default();
                self.link = Link::Accepting {
                    request,
                    peer,
                    reply,
                };
                if let Err(e) = self.post_bind(mr, addr, len, rkey, access, None, env) {
                    self.finish(Err(e), env);
                }
            }
            Grant::Region { .. } => {
                *phase = Phase::Granted;
                self.accept(request, peer, Vec::new(), env);
            }
        }
    }

    /// Why a connect request's token is no proof for this connection (for
    /// the local log; the peer is told only "refused").
    fn why_not_proved(&self, presented: &Presented) -> String {
        let token = &presented.token;
        match &self.job {
            _ if self.is_retired() => "the connection is retired".into(),
            Job::Free | Job::Leased => format!("no transfer is armed (epoch {})", self.epoch),
            Job::Armed(_, phase) if !matches!(phase, Phase::Waiting) => {
                "its transfer was proved already".into()
            }
            Job::Armed(a, _) if a.token.same_as(token) => format!(
                "the token of this transfer, for share {} (version {}), which is not this \
                 connection's",
                presented.share, presented.version
            ),
            Job::Armed(a, _) => format!(
                "another token (armed rkey {:#x} length {}, presented rkey {:#x} length {})",
                a.token.rkey, a.token.length, token.rkey, token.length
            ),
        }
    }

    /// RTR and RTS toward the requesting server, with every attribute the
    /// CM chose (lab CMTEST P1-P5). Returns the server's GID.
    fn connect_qp(&mut self, request: &dyn CmRequest, mode: Mode) -> Result<Gid> {
        let mut rtr = request.init_qp_attr(QpState::Rtr)?;
        self.aimed = true;
        rtr.min_rnr_timer = Some(MIN_RNR_TIMER);
        rtr.access = Some(match (&self.job, mode) {
            (Job::Armed(a, _), Mode::Regions) => a.direction.access(),
            _ => mode.qp_access(),
        });
        self.qp.modify(&rtr)?;
        let rts = request.init_qp_attr(QpState::Rts)?;
        self.qp.modify(&rts)?;
        Ok(rtr.av.map(|av| av.dgid).unwrap_or_default())
    }

    /// `rdma_accept` with this slot's QP: the server's grant on a fresh
    /// connection.
    fn accept(
        &mut self,
        request: Box<dyn CmRequest>,
        peer: Gid,
        reply: Vec<u8>,
        env: &mut Env<'_>,
    ) {
        let params = AcceptParams {
            qp_num: self.qp.qp_num(),
            responder_resources: request.responder_resources(),
            initiator_depth: request.initiator_depth(),
            rnr_retry_count: ACCEPT_RNR_RETRY,
            private_data: reply,
        };
        match request.accept(params) {
            Ok(cm) => {
                env.stats.handshake();
                log!(
                    Level::Info,
                    "QP {}: a server connected (connection {})",
                    self.qp.qp_num(),
                    self.index
                );
                env.by_cm.insert(cm.id(), self.index);
                self.link = Link::Connected {
                    cm,
                    peer,
                    used: Instant::now(),
                };
                if let Job::Armed(_, phase) = &mut self.job {
                    *phase = Phase::Granted;
                }
            }
            Err(e) => {
                log!(Level::Warn, "rdma_accept: {e}");
                self.finish(Err(e), env);
            }
        }
    }

    /// Posts the bind of the job's window (and, for an in-band proof, the
    /// grant SEND behind it in the same chain: the server hears of the
    /// grant only after the bind is done, or never if it fails).
    ///
    /// Alone (a fresh connection's bind, which the accept waits for), the
    /// bind is signaled. With the grant, neither is: a send queue executes
    /// in order, so the grant leaves only behind a done bind; a failed bind
    /// completes anyway (with its error, and the grant flushed behind it);
    /// and the window's invalidation after the final message, signaled,
    /// retires both. That saves the client two completions a transfer.
    #[allow(clippy::too_many_arguments)]
    fn post_bind(
        &mut self,
        mr: Arc<dyn Mr>,
        addr: u64,
        len: u64,
        rkey: u32,
        access: Access,
        grant: Option<(u32, Option<Vec<u8>>)>,
        env: &Env<'_>,
    ) -> Result<()> {
        let Some(w) = &mut self.window else {
            return Err(Error::Internal("no window to bind".into()));
        };
        let mw = w.mw.clone();
        w.bound = true;
        w.rkey = rkey;
        let bind = wr_id(self.index, WrKind::Bind, {
            self.next_seq += 1;
            self.next_seq
        });
        let mut wrs = vec![SendWr {
            wr_id: bind,
            op: SendOp::BindMw {
                mw,
                rkey,
                mr,
                addr,
                len,
                access,
            },
            sge: None,
            signaled: grant.is_none(),
        }];
        if let Some((imm, payload)) = grant {
            let sge = match payload {
                Some(bytes) => Some(
                    env.recv_bufs
                        .send_sge(self.index, &bytes)
                        .ok_or_else(|| Error::Internal("a plan longer than its buffer".into()))?,
                ),
                None => None,
            };
            let id = self.next_wr(WrKind::Grant);
            wrs.push(SendWr {
                wr_id: id,
                op: SendOp::SendImm { imm },
                sge,
                signaled: self.sends.len() + 2 > UNRETIRED_MAX,
            });
        }
        self.post_sends(&wrs)
    }

    /// Posts `wrs` and files them for retirement. Refused when the send
    /// queue could overflow on a NIC that frees slots only at signaled
    /// completions.
    fn post_sends(&mut self, wrs: &[SendWr]) -> Result<()> {
        if self.sends.len() + wrs.len() > QP_CAPS.max_send_wr as usize {
            return Err(Error::Internal(format!(
                "QP {}: {} work requests not retired, {} more would overflow its send queue",
                self.qp.qp_num(),
                self.sends.len(),
                wrs.len()
            )));
        }
        self.qp.post_send(wrs)?;
        self.sends.extend(wrs.iter().map(|w| w.wr_id));
        Ok(())
    }

    /// A completion of this connection (the driver filed it by wr_id).
    fn on_completion(&mut self, c: &Completion, kind: WrKind, env: &mut Env<'_>) {
        match kind {
            WrKind::Recv0 | WrKind::Recv1 => {
                let buf = usize::from(kind == WrKind::Recv1);
                if self.recvs[buf] != Some(c.wr_id) {
                    return; // of a QP reset since
                }
                self.recvs[buf] = None;
                if c.status != WcStatus::Success {
                    return self
                        .on_qp_failed(&format!("a receive completed with {:?}", c.status), env);
                }
                self.on_message(c, buf, env);
            }
            WrKind::Bind | WrKind::Grant | WrKind::Invalidate => {
                let Some(pos) = self.sends.iter().position(|&id| id == c.wr_id) else {
                    return;
                };
                // A send queue completes in order: this completion retires
                // the unsignaled work requests posted before it too.
                self.sends.drain(..=pos);
                if c.status != WcStatus::Success {
                    return self
                        .on_qp_failed(&format!("a {kind:?} completed with {:?}", c.status), env);
                }
                match kind {
                    WrKind::Bind => self.on_bound(env),
                    WrKind::Invalidate => self.on_invalidated(env),
                    _ => {}
                }
            }
        }
    }

    /// A SEND arrived in receive buffer `buf`: an in-band proof, a final
    /// message, or something that is neither.
    fn on_message(&mut self, c: &Completion, buf: usize, env: &mut Env<'_>) {
        if let (Some(rkey), Some(w)) = (c.invalidated, &mut self.window) {
            // The NIC has invalidated a window of this protection domain
            // already: if this connection's, it is bound no more.
            if w.bound && w.rkey == rkey {
                w.bound = false;
            }
        }
        let len = usize::try_from(c.byte_len).unwrap_or(usize::MAX);
        let v4 = env.striping.protocol >= VERSION_4;
        let message = match (c.opcode, c.imm, c.invalidated) {
            (WcOpcode::Recv, None, None) if len == PROOF_LEN => {
                let data = env.recv_bufs.read(self.index, buf, PROOF_LEN);
                Message::Proof(decode_proof_up_to(&data, self.name, env.striping.protocol))
            }
            (WcOpcode::Recv, Some(imm), None) if len == 0 => Message::Final {
                value: imm,
                invalidated: None,
            },
            (WcOpcode::Recv, None, Some(rkey)) if v4 && len == FINAL_DATA_LEN => {
                let data = env.recv_bufs.read(self.index, buf, FINAL_DATA_LEN);
                Message::Final {
                    value: u32::from_le_bytes([data[0], data[1], data[2], data[3]]),
                    invalidated: Some(rkey),
                }
            }
            _ => {
                return self.on_garbage(
                    &format!(
                        "a {:?} of {} bytes (immediate: {}, invalidating: {})",
                        c.opcode,
                        c.byte_len,
                        c.imm.is_some(),
                        c.invalidated.is_some()
                    ),
                    env,
                )
            }
        };
        if let Err(e) = self.post_recvs(env) {
            return self.on_qp_failed(&format!("posting a receive: {e}"), env);
        }
        match message {
            Message::Proof(Ok(token)) => self.on_proof(&token, env),
            Message::Proof(Err(e)) => {
                self.on_garbage(&format!("a proof that does not decode ({e})"), env)
            }
            Message::Final { value, invalidated } => self.on_final(value, invalidated, env),
        }
    }

    /// An in-band proof from the server this QP is connected to: of the
    /// whole transfer or its share 0 (a version-3 server's, which may
    /// stripe it), or of the share this connection holds.
    fn on_proof(&mut self, presented: &Presented, env: &mut Env<'_>) {
        let Job::Armed(armed, phase) = &self.job else {
            return self.on_garbage("a proof with no transfer waiting", env);
        };
        if !matches!(phase, Phase::Waiting) {
            // Proved already: a second proof is refused (ignored) and the
            // job goes on undisturbed.
            return;
        }
        let Link::Connected { peer, .. } = &self.link else {
            return self.on_garbage("a proof on a QP that is not connected", env);
        };
        let peer = *peer;
        if !proves(&self.stripe, armed, presented) {
            // The connected server was not sent this request (or not for
            // this share): it gets nothing, loses its connection, and the
            // job waits for its server's proof.
            log!(
                Level::Warn,
                "QP {}: the connected server's proof is not this transfer's token{}; \
                 disconnecting it",
                self.qp.qp_num(),
                if presented.share == 0 {
                    String::new()
                } else {
                    format!(" for share {}", presented.share)
                }
            );
            return self.reset(env);
        }
        env.stats.reuse();
        armed.mailbox.set_proved();
        let plan = match presented.version >= VERSION_3 && presented.share == 0 {
            true => self.plan(Some(peer), env),
            false => None,
        };
        let Job::Armed(armed, phase) = &mut self.job else {
            return;
        };
        let imm = protocol::grant_imm(armed.token.secret);
        let access = armed.direction.access();
        let outcome = match &armed.grant {
            Grant::Window { mr, addr, len } => {
                let len = plan.as_ref().map_or(*len, |shares| shares[0].len);
                let (mr, addr, rkey) = (mr.clone(), *addr, key_of(&self.stripe, armed));
                // Granted once posted: the grant leaves behind the bind,
                // and a failed bind completes with its error.
                *phase = Phase::Granted;
                let payload = plan.map(|shares| encode_stripes(&shares));
                self.post_bind(mr, addr, len, rkey, access, Some((imm, payload)), env)
            }
            Grant::Region { .. } => {
                *phase = Phase::Granted;
                self.qp
                    .modify(&QpAttr {
                        access: Some(access),
                        ..QpAttr::default()
                    })
                    .and_then(|()| self.post_grant(imm))
            }
        };
        if let Err(e) = outcome {
            self.finish(Err(e), env);
        }
    }

    /// At a version-3 proof of a transfer's share 0, from the server at
    /// `peer`: whether to stripe it. A transfer of at least
    /// [`Striping::min_len`] bytes through a window takes up to
    /// [`Striping::stripes`] - 1 free connections (those established with
    /// `peer` first, then unconnected ones; none that another server
    /// keeps), arms a share of its range on each (forwarded: they wait for
    /// their own proofs before any access), and returns the plan, share 0
    /// (this connection) first, for its grant. `None`: the transfer stays
    /// whole.
    fn plan(&mut self, peer: Option<Gid>, env: &mut Env<'_>) -> Option<Vec<Share>> {
        let Job::Armed(armed, _) = &self.job else {
            return None;
        };
        let Grant::Window { mr, addr, len } = &armed.grant else {
            return None;
        };
        let (addr, len) = (*addr, *len);
        if env.striping.stripes < 2
            || len < env.striping.min_len.max(2)
            || !matches!(self.stripe, Stripe::Whole)
        {
            return None;
        }
        let (mut taken, windowless): (Vec<_>, Vec<_>) = env
            .pool
            .take_for_stripes(env.striping.stripes - 1, peer, self.index)
            .into_iter()
            .partition(|info| info.window_rkey.is_some());
        for info in windowless {
            env.pool.put_back(info);
        }
        let mut keys = Vec::with_capacity(taken.len());
        for _ in &taken {
            let Ok(random) = crate::core::keys::random_bytes() else {
                break;
            };
            keys.push(u32::from_le_bytes([
                random[0], random[1], random[2], random[3],
            ]));
        }
        // Equal shares of whole pages, the last one shorter; never an
        // empty one.
        let mut count = 1 + taken.len().min(keys.len());
        let share_len = loop {
            let each = len.div_ceil(count as u64).next_multiple_of(4096);
            if count == 1 || (count as u64 - 1) * each < len {
                break each;
            }
            count -= 1;
        };
        for info in taken.drain(count - 1..) {
            env.pool.put_back(info);
        }
        if count < 2 {
            return None;
        }
        let mut shares = vec![Share {
            name: self.name,
            rkey: armed.token.rkey,
            addr,
            len: share_len,
        }];
        let mut pending = Vec::with_capacity(taken.len());
        for (i, (info, random)) in taken.into_iter().zip(keys).enumerate() {
            let share = u16::try_from(i + 1).unwrap_or(u16::MAX);
            let at = share_len * (i as u64 + 1);
            let current = info.window_rkey.unwrap_or_default();
            let part = Share {
                name: info.qp_num,
                rkey: crate::core::keys::fresh_window_key(current, random),
                addr: addr + at,
                len: share_len.min(len - at),
            };
            let job = Armed {
                token: armed.token,
                direction: armed.direction,
                grant: Grant::Window {
                    mr: mr.clone(),
                    addr: part.addr,
                    len: part.len,
                },
                entry: armed.entry.clone(),
                mailbox: Arc::new(Mailbox::new()),
                deadline: None,
                detached: false,
                released: false,
            };
            env.forward.push(Forward::ArmShare {
                index: info.index,
                arm: ShareArm {
                    epoch: info.epoch,
                    armed: Box::new(job),
                    primary: self.index,
                    primary_epoch: self.epoch,
                    share,
                    rkey: part.rkey,
                },
            });
            pending.push((info.index, info.epoch, share));
            shares.push(part);
        }
        self.stripe = Stripe::Primary(Plan {
            pending,
            failed: None,
        });
        Some(shares)
    }

    fn post_grant(&mut self, imm: u32) -> Result<()> {
        let id = self.next_wr(WrKind::Grant);
        self.post_sends(&[SendWr {
            wr_id: id,
            op: SendOp::SendImm { imm },
            sge: None,
            signaled: true,
        }])
    }

    /// The job's window is bound: accept the connect request that proved
    /// the token. Only that bind is signaled: an in-band proof's bind and
    /// grant are posted unsignaled, and the job is granted from the post
    /// ([`Conn::post_bind`]).
    fn on_bound(&mut self, env: &mut Env<'_>) {
        if let Link::Accepting { .. } = self.link {
            if let Link::Accepting {
                request,
                peer,
                reply,
            } = std::mem::replace(&mut self.link, Link::Idle)
            {
                return self.accept(request, peer, reply, env);
            }
        }
        if let Job::Armed(_, phase @ Phase::Binding { .. }) = &mut self.job {
            *phase = Phase::Granted;
        }
    }

    /// The final message, with its value, and the rkey of the window the
    /// NIC invalidated as it arrived (a version-4 final message).
    fn on_final(&mut self, imm: u32, invalidated: Option<u32>, env: &mut Env<'_>) {
        let Job::Armed(armed, phase) = &mut self.job else {
            return self.on_garbage("a final message with no transfer", env);
        };
        match phase {
            Phase::Granted => {}
            // From the kept connection's server, which this job's token
            // was not sent to (it has not proved it): that server loses
            // its connection, the job waits for its own.
            Phase::Waiting => {
                return self.on_garbage("a final message while a transfer waits for its proof", env)
            }
            // A second final message: the data is in; the window goes
            // with the connection.
            Phase::Revoking { .. } | Phase::Joining => {
                return self.on_garbage("a second final message", env)
            }
            Phase::Binding { .. } => {
                return self.finish(
                    Err(Error::Rdma(
                        "a final message before the transfer was granted".into(),
                    )),
                    env,
                )
            }
        }
        if imm != protocol::final_imm(armed.token.secret) {
            return self.finish(
                Err(Error::Rdma(
                    "the final message carried the wrong secret".into(),
                )),
                env,
            );
        }
        if let Some(rkey) = invalidated {
            let why = match &armed.grant {
                Grant::Window { .. } if rkey == key_of(&self.stripe, armed) => {
                    // Revoked already, by the NIC, before the message's
                    // receive completed: the transfer succeeded.
                    return self.succeed(env);
                }
                Grant::Window { .. } => {
                    "the final message invalidated another window than this transfer's"
                }
                Grant::Region { .. } => {
                    "a final message that invalidates, for a transfer without a window"
                }
            };
            return self.finish(Err(Error::Rdma(why.into())), env);
        }
        match &armed.grant {
            Grant::Window { .. } => {
                // Revoke in place, keeping the connection: invalidate the
                // window through the QP that bound it.
                let until = Instant::now() + WINDOW_TIMEOUT;
                *phase = Phase::Revoking { until };
                let rkey = key_of(&self.stripe, armed);
                let id = self.next_wr(WrKind::Invalidate);
                let posted = self.post_sends(&[SendWr {
                    wr_id: id,
                    op: SendOp::LocalInv { rkey },
                    sge: None,
                    signaled: true,
                }]);
                if posted.is_err() {
                    // The data is in; the window goes with a reset.
                    self.succeed_by_reset(env);
                }
            }
            Grant::Region { .. } => {
                let revoked = self.qp.modify(&QpAttr {
                    access: Some(Access::empty()),
                    ..QpAttr::default()
                });
                if revoked.is_err() {
                    self.reset(env);
                }
                self.succeed(env);
            }
        }
    }

    /// The window is invalidated: the transfer succeeded, with no access
    /// left.
    fn on_invalidated(&mut self, env: &mut Env<'_>) {
        if let Some(w) = &mut self.window {
            w.bound = false;
        }
        if matches!(self.job, Job::Armed(_, Phase::Revoking { .. })) {
            self.succeed(env);
        }
    }

    fn succeed_by_reset(&mut self, env: &mut Env<'_>) {
        self.reset(env);
        self.succeed(env);
    }

    fn succeed(&mut self, env: &mut Env<'_>) {
        let peer = match &self.link {
            Link::Connected { peer, .. } => Some(*peer),
            _ => None,
        };
        self.conclude(Ok(()), peer, env);
    }

    /// The QP is in ERR: a receive or a send failed (flushed, or a remote
    /// error), or the device reported it. A waiting job keeps waiting on a
    /// fresh QP; any other ends.
    fn on_qp_failed(&mut self, why: &str, env: &mut Env<'_>) {
        if env.debug {
            let phase = match &self.job {
                Job::Free => "free",
                Job::Leased => "leased",
                Job::Armed(_, Phase::Waiting) => "waiting",
                Job::Armed(_, Phase::Binding { .. }) => "binding",
                Job::Armed(_, Phase::Granted) => "granted",
                Job::Armed(_, Phase::Revoking { .. }) => "revoking",
                Job::Armed(_, Phase::Joining) => "joining",
            };
            log!(
                Level::Warn,
                "QP {}: failed ({why}) while {phase}, link {:?}",
                self.qp.qp_num(),
                self.cm_id()
            );
        }
        match &self.job {
            Job::Armed(_, Phase::Revoking { .. }) => self.succeed_by_reset(env),
            // Waiting: nothing granted, the job waits on a fresh QP;
            // joining: this share's access is gone already.
            Job::Armed(_, Phase::Waiting | Phase::Joining) => self.reset(env),
            Job::Armed(..) => self.finish(
                Err(Error::Rdma(format!(
                    "the connection of QP {} failed: {why}",
                    self.qp.qp_num()
                ))),
                env,
            ),
            Job::Free | Job::Leased => self.reset_free(env),
        }
    }

    /// The server disconnected (its DREQ, or its CM connection failed).
    fn on_disconnected(&mut self, env: &mut Env<'_>) {
        self.on_qp_failed("the server disconnected", env);
    }

    /// A message from the connected server that the protocol has no place
    /// for: the server loses its connection; a job past its proof fails.
    fn on_garbage(&mut self, what: &str, env: &mut Env<'_>) {
        log!(
            Level::Warn,
            "QP {}: unexpected message from the server ({what}); disconnecting it",
            self.qp.qp_num()
        );
        self.on_qp_failed(what, env);
    }

    /// Shutdown or a dead driver: ends every job, disconnects the link.
    fn shut(&mut self, why: &Error, env: &mut Env<'_>) {
        if matches!(self.job, Job::Armed(..)) {
            self.finish(Err(why.clone()), env);
        }
        if !matches!(self.link, Link::Idle | Link::Retired) {
            self.reset(env);
        }
    }

    /// The last resort of a dying driver: no server may reach anything.
    /// Moves the QP to ERR and deallocates a bound window, without
    /// replacing anything. Returns the mailbox of the job's thread, for the
    /// driver to fill once every connection is fenced (a striped transfer's
    /// other shares are on other connections).
    pub fn fence(&mut self) -> Option<Arc<Mailbox>> {
        let _ = self.qp.modify(&QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        });
        if self.window.as_ref().is_some_and(|w| w.bound) {
            self.window = None;
        }
        if let Link::Connected { cm, .. } = std::mem::replace(&mut self.link, Link::Retired) {
            let _ = cm.disconnect();
        }
        let stripe = std::mem::replace(&mut self.stripe, Stripe::Whole);
        match std::mem::replace(&mut self.job, Job::Leased) {
            Job::Armed(armed, _) if !matches!(stripe, Stripe::Share { .. }) => Some(armed.mailbox),
            _ => None,
        }
    }
}

/// What a SEND that arrived on a connection is.
enum Message {
    /// An in-band proof (or what failed to decode as one).
    Proof(std::result::Result<Presented, protocol::Malformed>),
    /// A final message: its value (the immediate, or a version-4 final
    /// message's data) and the rkey the NIC invalidated with it.
    Final {
        value: u32,
        invalidated: Option<u32>,
    },
}

/// Whether `presented` proves the job `armed` (part `stripe` of its
/// transfer): the same token (compared in constant time), for this
/// connection's share: share 0 for a whole transfer (either version), the
/// share it holds for a share of a striped one (version 3 and later).
fn proves(stripe: &Stripe, armed: &Armed, presented: &Presented) -> bool {
    let share_ok = match stripe {
        Stripe::Share { share, .. } => presented.version >= VERSION_3 && presented.share == *share,
        Stripe::Whole | Stripe::Primary(_) => presented.share == 0,
    };
    // Both compared, whatever the first says.
    let same = armed.token.same_as(&presented.token);
    share_ok & same
}

/// The key of the window a job binds: its share's, or its token's.
fn key_of(stripe: &Stripe, armed: &Armed) -> u32 {
    match stripe {
        Stripe::Share { rkey, .. } => *rkey,
        _ => armed.token.rkey,
    }
}

/// RESET->INIT: pkey 0, the port, and the mode's access flags.
fn init_attr(port: u8, mode: Mode) -> QpAttr {
    QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(port),
        access: Some(mode.qp_access()),
        ..QpAttr::default()
    }
}

/// Where a connect request came from, for the log: its source GID.
fn request_source(request: &dyn CmRequest) -> String {
    match request.init_qp_attr(QpState::Rtr).ok().and_then(|a| a.av) {
        Some(av) => match av.dgid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
            true => std::net::Ipv4Addr::new(av.dgid[12], av.dgid[13], av.dgid[14], av.dgid[15])
                .to_string(),
            false => std::net::Ipv6Addr::from(av.dgid).to_string(),
        },
        None => "an unknown source".into(),
    }
}

/// The one rejection, whatever was wrong.
pub fn refuse(request: Box<dyn CmRequest>) {
    if let Err(e) = request.reject(&encode_reject()) {
        log!(Level::Warn, "rdma_reject: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_name_their_connection_and_kind() {
        for index in [0, 1, 1023] {
            for kind in [
                WrKind::Recv0,
                WrKind::Recv1,
                WrKind::Bind,
                WrKind::Grant,
                WrKind::Invalidate,
            ] {
                let id = wr_id(index, kind, 0xff_ffff_ffff);
                assert_eq!(wr_parts(id), Some((index, kind)));
                assert_ne!(id, wr_id(index, kind, 1));
            }
        }
        assert_eq!(wr_parts(0), None);
        assert_eq!(wr_parts(u64::MAX), None);
    }
}
