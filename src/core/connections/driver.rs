//! The connection driver: the one thread that owns every pool connection.
//!
//! It waits in one `poll(2)` on the RDMA CM listener's channel, the pool's
//! completion channel (one CQ for every pool QP), the device's
//! asynchronous events and its own command queue's eventfd, with the
//! earliest deadline it watches as the timeout; and it hands each event to
//! the transition of the connection it concerns (`conn.rs`). Transfer
//! threads reach connections only through [`Command`]s.
//!
//! Per event the work is bounded: a connect request is decoded, its slot
//! found by QP number in a map, its token compared, and it is accepted or
//! refused without waiting for anything (a window bind before the accept
//! is an event of its own); a completion is filed by its work-request id.
//!
//! A panic or a fatal error here stops the driver loudly: every QP is
//! fenced (ERR, bound windows deallocated), every waiting transfer and
//! every later lease fails with the reason.

use crate::log::{log, Level};
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::stats::Stats;
use crate::core::tokens::TokenBook;

use super::commands::{Command, Commands};
use super::conn::{
    refuse, wr_parts, Conn, Cooling, Env, Event, Forward, Mode, RecvBuffers, Striping, Timers,
    QP_CAPS,
};
use super::pool::Pool;
use super::slots::Slots;
use crate::core::polling::Polling;
use crate::core::protocol::decode_connect_up_to;
use crate::error::{Error, Result};
use crate::platform::{wait_readable, AsyncKind, CmEvent, CmListener, Context, Cq, Mw, Pd};
/// Completion entries per connection on the pool's CQ: more than a
/// connection ever has outstanding (its receives and three sends).
const CQES_PER_CONN: u32 = 8;
/// Completions read by one poll.
const POLL_BATCH: usize = 64;
/// RDMA CM events served before the driver looks at its other sources
/// (completions, device events, timers) again: a flood of connect
/// requests delays them by at most this many.
const CM_BATCH: usize = 64;
/// Consecutive failures reading events after which the driver gives up.
const MAX_EVENT_ERRORS: u32 = 64;
/// How soon the driver looks again after a failure to read events.
const RETRY_AFTER_TROUBLE: Duration = Duration::from_millis(10);

/// What the driver serves, built by [`build`].
pub struct Parts {
    conns: Vec<Conn>,
    by_qp: HashMap<u32, usize>,
    cooling: Cooling,
    cq: Arc<dyn Cq>,
    recv_bufs: RecvBuffers,
    mode: Mode,
}

impl Parts {
    /// How access is granted on this device.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// Settings the driver needs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The IB port of every QP.
    pub port: u8,
    /// `HIPOBJ_COMPLETION_TIMEOUT_MS`.
    pub completion_timeout: Duration,
    /// `HIPOBJ_IDLE_TIMEOUT_MS`.
    pub idle_timeout: Duration,
    /// `HIPOBJ_RDMA_DEBUG`.
    pub debug: bool,
    /// How long the driver polls for the next event, after each round of
    /// work, before it sleeps (`HIPOBJ_POLL_US`, by device).
    pub poll: Duration,
    /// The instance's counters (handshakes, in-band proofs).
    pub stats: Arc<Stats>,
    /// Application-driven GETs into staged buffers, told when they end.
    pub tokens: Arc<TokenBook>,
    /// Entries the driver's timer heap holds (after each look at it).
    pub timers_pending: Arc<std::sync::atomic::AtomicUsize>,
    /// How transfers are striped (`HIPOBJ_PROTOCOL`, `HIPOBJ_STRIPES`,
    /// `HIPOBJ_STRIPE_MIN`).
    pub striping: Striping,
}

/// Creates `count` connections on `ctx`: one CQ for all, a window each
/// where the device has type-2 windows (all in `pd`), else a protection
/// domain each; QPs in INIT with their receives posted, on the free list.
/// If any window cannot be allocated, the device is treated as having
/// none (said on stderr).
pub fn build(
    ctx: &dyn Context,
    pd: &Arc<dyn Pd>,
    count: usize,
    pool: &Pool,
    settings: Settings,
) -> Result<Parts> {
    let limits = ctx.limits();
    let want = u32::try_from(count)
        .unwrap_or(u32::MAX)
        .saturating_mul(CQES_PER_CONN)
        .max(64);
    let cq = ctx.create_cq(want.min(limits.max_cqe.max(64)))?;
    let windows: Option<Vec<Arc<dyn Mw>>> = if ctx.supports_mw() {
        match (0..count)
            .map(|_| pd.alloc_mw())
            .collect::<Result<Vec<_>>>()
        {
            Ok(w) => Some(w),
            Err(e) => {
                log!(
                    Level::Warn,
                    "{}: allocating {count} memory windows failed ({e}); transfers \
                     register their ranges one by one instead",
                    ctx.name()
                );
                None
            }
        }
    } else {
        None
    };
    let mode = if windows.is_some() {
        Mode::Windows
    } else {
        Mode::Regions
    };
    let pds: Vec<Arc<dyn Pd>> = match mode {
        Mode::Windows => vec![pd.clone(); count],
        Mode::Regions => (0..count)
            .map(|_| ctx.alloc_pd())
            .collect::<Result<Vec<_>>>()?,
    };
    let recv_bufs = RecvBuffers::new(&pds, mode == Mode::Windows)?;
    let mut by_cm = HashMap::new();
    let mut by_qp = HashMap::new();
    let mut cooling = Cooling::new(count);
    let mut timers = Timers::default();
    let mut forward = Vec::new();
    let env = Env {
        pool,
        cq: &cq,
        by_qp: &mut by_qp,
        cooling: &mut cooling,
        port: settings.port,
        mode,
        recv_bufs: &recv_bufs,
        by_cm: &mut by_cm,
        timers: &mut timers,
        completion_timeout: settings.completion_timeout,
        idle_timeout: settings.idle_timeout,
        debug: settings.debug,
        stats: &settings.stats,
        tokens: &settings.tokens,
        closing: false,
        forward: &mut forward,
        striping: settings.striping,
    };
    let mut windows = windows.map(Vec::into_iter);
    let mut conns = Vec::with_capacity(count);
    for (index, pd) in pds.into_iter().enumerate() {
        let qp = pd.create_qp(&cq, QP_CAPS)?;
        let mw = windows.as_mut().and_then(Iterator::next);
        let conn = Conn::new(index, qp, pd, mw, &env)?;
        env.by_qp.insert(conn.qp.qp_num(), index);
        conns.push(conn);
    }
    for conn in &conns {
        pool.put_back(conn.slot_info());
    }
    Ok(Parts {
        conns,
        by_qp,
        cooling,
        cq,
        recv_bufs,
        mode,
    })
}

/// The driver's thread; stopped and joined on drop.
pub struct Driver {
    commands: Arc<Commands>,
    thread: Option<JoinHandle<()>>,
    /// The process whose thread it is.
    pid: u32,
}

impl Driver {
    /// Starts the thread that serves `parts` and `listener`.
    pub fn start(
        parts: Parts,
        listener: Arc<dyn CmListener>,
        ctx: Arc<dyn Context>,
        pool: Arc<Pool>,
        commands: Arc<Commands>,
        settings: Settings,
    ) -> Result<Driver> {
        let by_name = parts.conns.iter().map(|c| (c.name, c.index)).collect();
        let polling = Polling::new(settings.poll);
        let mut state = State {
            conns: parts.conns,
            shared: Shared {
                by_name,
                by_qp: parts.by_qp,
                cooling: parts.cooling,
                by_cm: HashMap::new(),
                timers: Timers::default(),
                cq: parts.cq,
                cq_armed: false,
                listener,
                ctx,
                recv_bufs: parts.recv_bufs,
                pool,
                commands: commands.clone(),
                mode: parts.mode,
                settings,
                event_errors: 0,
                stopping: false,
                closing: false,
                forward: Vec::new(),
            },
            polling,
        };
        let thread = std::thread::Builder::new()
            .name("hipobj-driver".into())
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| state.run()));
                let why = match ran {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e,
                    Err(_) => Error::Internal("it panicked".into()),
                };
                state.die(&why);
            })
            .map_err(|e| Error::Internal(format!("cannot start the connection driver: {e}")))?;
        Ok(Driver {
            commands,
            thread: Some(thread),
            pid: std::process::id(),
        })
    }

    /// The command queue.
    pub fn commands(&self) -> &Arc<Commands> {
        &self.commands
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child: the thread is the parent's (joining it here
            // would wait for nothing that exists).
            std::mem::forget(self.thread.take());
            return;
        }
        let _ = self.commands.send(Command::Stop, true);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log!(Level::Error, "the connection driver thread panicked");
            }
        }
    }
}

/// Hands each connection what the last transitions asked of it (the
/// shares of striped transfers: armed, ended, and their ends told to their
/// primaries), in order, until nothing more is asked: before the driver
/// looks at any other event, so that a share is armed before its server
/// can prove it, and every share is revoked before its primary tells the
/// transfer's outcome.
fn relay(conns: &mut [Conn], shared: &mut Shared) {
    while !shared.forward.is_empty() {
        for forward in std::mem::take(&mut shared.forward) {
            let (index, event) = match forward {
                Forward::ArmShare { index, arm } => (index, Event::ArmShare(arm)),
                Forward::EndShare { index, epoch, why } => (index, Event::Abort { epoch, why }),
                Forward::ShareEnded {
                    primary,
                    epoch,
                    share,
                    outcome,
                } => (
                    primary,
                    Event::ShareEnded {
                        epoch,
                        share,
                        outcome,
                    },
                ),
            };
            if let Some(conn) = conns.get_mut(index) {
                conn.handle(event, &mut shared.env());
            }
        }
    }
}

/// Everything but the connections, so that a transition can borrow a
/// connection and these at once.
struct Shared {
    /// A connection's name (the QP number its tokens give) -> slot.
    by_name: HashMap<u32, usize>,
    /// The QP number of a connection's present QP -> slot.
    by_qp: HashMap<u32, usize>,
    cooling: Cooling,
    by_cm: HashMap<u64, usize>,
    timers: Timers,
    cq: Arc<dyn Cq>,
    cq_armed: bool,
    listener: Arc<dyn CmListener>,
    ctx: Arc<dyn Context>,
    recv_bufs: RecvBuffers,
    pool: Arc<Pool>,
    commands: Arc<Commands>,
    mode: Mode,
    settings: Settings,
    event_errors: u32,
    /// A Stop command was read.
    stopping: bool,
    /// A Close command was read.
    closing: bool,
    /// What the last transition asked of other connections.
    forward: Vec<Forward>,
}

impl Shared {
    fn env(&mut self) -> Env<'_> {
        Env {
            pool: &*self.pool,
            cq: &self.cq,
            by_qp: &mut self.by_qp,
            cooling: &mut self.cooling,
            port: self.settings.port,
            mode: self.mode,
            recv_bufs: &self.recv_bufs,
            by_cm: &mut self.by_cm,
            timers: &mut self.timers,
            completion_timeout: self.settings.completion_timeout,
            idle_timeout: self.settings.idle_timeout,
            debug: self.settings.debug,
            stats: &self.settings.stats,
            tokens: &self.settings.tokens,
            closing: self.closing,
            forward: &mut self.forward,
            striping: self.settings.striping,
        }
    }

    /// Counts a failure to read events; too many in a row is fatal.
    /// Returns whether `outcome` was a failure.
    fn tolerate(&mut self, what: &str, outcome: Result<()>) -> Result<bool> {
        let Err(e) = outcome else {
            return Ok(false);
        };
        self.event_errors += 1;
        log!(Level::Warn, "connection driver: {what}: {e}");
        if self.event_errors >= MAX_EVENT_ERRORS {
            return Err(Error::Rdma(format!(
                "{what} failed {} times in a row: {e}",
                self.event_errors
            )));
        }
        Ok(true)
    }
}

struct State {
    conns: Vec<Conn>,
    shared: Shared,
    /// Whether the driver's polls after a round of work pay.
    polling: Polling,
}

impl State {
    fn run(&mut self) -> Result<()> {
        // Which descriptors to read: those the last wait found readable
        // (all of them at first, and after trouble). Each is
        // level-triggered and read until it has nothing, so one not
        // readable has nothing to read, and reading it anyway is a system
        // call for nothing (one per source per wake-up).
        let mut ready = vec![true; 4];
        loop {
            self.commands();
            // A failed read of events is retried soon; only a run of
            // failures is fatal.
            let mut trouble = false;
            if !self.shared.stopping {
                // Polling the CQ reads the device's queue, not a descriptor.
                let polled = self.completions();
                trouble |= self.shared.tolerate("ibv_poll_cq", polled)?;
                if ready[2] {
                    let events = self.async_events();
                    trouble |= self.shared.tolerate("ibv_get_async_event", events)?;
                }
                if ready[0] {
                    let cm = self.cm_events();
                    trouble |= self.shared.tolerate("the RDMA CM listener", cm)?;
                }
                self.timers();
            }
            if self.shared.stopping {
                self.shut();
                return Ok(());
            }
            // Something just happened (the loop woke for it, or found it
            // polling): the next event is likely near (a transfer's next
            // step, the next transfer of a thread that runs them back to
            // back), so poll for it a while rather than sleep and be woken.
            if !trouble && !self.shared.settings.poll.is_zero() {
                match self.spin() {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => {
                        self.shared.tolerate("ibv_poll_cq", Err(e))?;
                        ready = vec![true; 4];
                        continue;
                    }
                }
            }
            if !self.shared.cq_armed {
                let armed = self.shared.cq.arm();
                self.shared.cq_armed = armed.is_ok();
                trouble |= self.shared.tolerate("ibv_req_notify_cq", armed)?;
                // What arrived before arming made the channel no sign.
                let polled = self.completions();
                trouble |= self.shared.tolerate("ibv_poll_cq", polled)?;
            }
            let s = &self.shared;
            let next = s.timers.next();
            let soon = Instant::now() + RETRY_AFTER_TROUBLE;
            let fds = [
                s.listener.event_fd(),
                s.cq.channel_fd(),
                s.ctx.async_fd(),
                s.commands.waker.as_fd(),
            ];
            let until = if trouble {
                Some(next.map_or(soon, |t| t.min(soon)))
            } else {
                next
            };
            // Where the driver polls, a look without waiting first, so that
            // only a sleep that something ends is counted as a wake-up
            // (`Stats::woken`); where it does not (a software NIC, whose
            // path stays as it was), every wait that something ends is.
            let polls = !s.settings.poll.is_zero();
            ready = if polls {
                wait_readable(&fds, Some(Instant::now()))?
            } else {
                vec![false; fds.len()]
            };
            if !ready.contains(&true) && until.is_none_or(|t| t > Instant::now()) {
                ready = wait_readable(&fds, until)?;
                if ready.contains(&true) {
                    s.settings.stats.woken();
                }
            }
            if ready[1] {
                let taken = self.shared.cq.take_events().map(|_| ());
                // Re-armed before the next wait either way.
                self.shared.cq_armed = false;
                self.shared.tolerate("ibv_get_cq_event", taken)?;
            }
            if ready[3] {
                self.shared.commands.waker.take();
            }
            if trouble {
                ready = vec![true; 4];
            }
        }
    }

    /// Runs every queued command (until a Stop, which the loop acts on).
    fn commands(&mut self) {
        if self.shared.stopping {
            return;
        }
        for command in self.shared.commands.take() {
            self.command(command);
            if self.shared.stopping {
                return;
            }
        }
    }

    fn command(&mut self, command: Command) {
        let (conns, shared) = (&mut self.conns, &mut self.shared);
        match command {
            Command::Arm {
                index,
                epoch,
                armed,
            } => match conns.get_mut(index) {
                Some(conn) => conn.handle(Event::Arm { epoch, armed }, &mut shared.env()),
                None => armed
                    .mailbox
                    .fill(Err(Error::Internal(format!("no connection {index}")))),
            },
            Command::Replied { index, epoch, ok } => {
                if let Some(conn) = conns.get_mut(index) {
                    conn.handle(Event::Replied { epoch, ok }, &mut shared.env());
                }
            }
            Command::Abort { index, epoch } | Command::Release { index, epoch } => {
                if let Some(conn) = conns.get_mut(index) {
                    let why = Error::Rdma("the transfer was abandoned".into());
                    conn.handle(Event::Abort { epoch, why }, &mut shared.env());
                }
            }
            Command::EndTokens { base, done } => {
                for conn in conns.iter_mut().filter(|c| c.has_token_on(base)) {
                    let why = Error::Rdma("the token's buffer was deregistered".into());
                    let epoch = conn.epoch;
                    conn.handle(Event::Abort { epoch, why }, &mut shared.env());
                }
                relay(conns, shared);
                done.fill(Ok(()));
            }
            Command::Released { qp_num, secret } => {
                let found = shared.by_name.get(&qp_num).copied();
                if let Some(conn) = found.and_then(|i| conns.get_mut(i)) {
                    conn.handle(Event::Released { secret }, &mut shared.env());
                }
            }
            Command::Reclaim { done } => {
                let oldest = conns
                    .iter()
                    .filter_map(|c| c.reclaimable_since().map(|at| (at, c.index)))
                    .min();
                if let Some(conn) = oldest.and_then(|(_, i)| conns.get_mut(i)) {
                    let why = Error::Rdma(
                        "the token was released and no server had used it when a newer \
                         token needed its connection"
                            .into(),
                    );
                    let epoch = conn.epoch;
                    conn.handle(Event::Abort { epoch, why }, &mut shared.env());
                    relay(conns, shared);
                    done.fill(Ok(()));
                } else if conns.iter().any(|c| c.frees_soon(&*shared.pool)) {
                    // A transfer will end soon and free its connection.
                    done.fill(Ok(()));
                } else {
                    done.fill(Err(Error::Busy(
                        "every connection holds an application-driven token that no server \
                         has used and that is not released (at most HIPOBJ_MAX_TRANSFERS \
                         tokens are outstanding)",
                    )));
                }
            }
            Command::Close { done } => {
                shared.closing = true;
                for conn in conns.iter_mut().filter(|c| c.has_token()) {
                    let epoch = conn.epoch;
                    let why = Error::NotInitialized;
                    conn.handle(Event::Abort { epoch, why }, &mut shared.env());
                }
                relay(conns, shared);
                done.fill(Ok(()));
            }
            Command::Stop => shared.stopping = true,
        }
        relay(conns, shared);
    }

    /// Polls the CQ and the command queue without sleeping, for up to
    /// `HIPOBJ_POLL_US` while such polls pay ([`Polling`]); `true` once
    /// something came (completions are filed, commands left for the
    /// loop), `false` if nothing did (or the poll was skipped).
    fn spin(&mut self) -> Result<bool> {
        let window = self.polling.window();
        if window.is_zero() {
            return Ok(false);
        }
        let until = Instant::now() + window;
        loop {
            if self.shared.commands.pending() || self.poll_once()? {
                self.polling.found(true);
                return Ok(true);
            }
            if Instant::now() >= until {
                self.polling.found(false);
                return Ok(false);
            }
            crate::platform::pause();
        }
    }

    /// Reads the pool's CQ until it is empty, filing each completion to
    /// its connection. Commands queued meanwhile run first (an Arm comes
    /// before the first completion of its slot).
    fn completions(&mut self) -> Result<()> {
        while self.poll_once()? {}
        Ok(())
    }

    /// Reads one batch of the pool's CQ and files it ([`State::completions`]);
    /// `false` if the CQ was empty.
    fn poll_once(&mut self) -> Result<bool> {
        let batch = self.shared.cq.poll(POLL_BATCH)?;
        if batch.is_empty() {
            return Ok(false);
        }
        self.commands();
        for c in &batch {
            let Some((index, kind)) = wr_parts(c.wr_id) else {
                continue;
            };
            if let Some(conn) = self.conns.get_mut(index) {
                let event = Event::Completion {
                    completion: c,
                    kind,
                };
                conn.handle(event, &mut self.shared.env());
                relay(&mut self.conns, &mut self.shared);
            }
        }
        Ok(true)
    }

    /// Handles the device's asynchronous events: a QP in ERR is treated as
    /// a failed connection; a CQ error or a dead device is fatal.
    fn async_events(&mut self) -> Result<()> {
        loop {
            let Some(event) = self.shared.ctx.next_async_event()? else {
                return Ok(());
            };
            match event.kind {
                AsyncKind::CqErr | AsyncKind::DeviceFatal => {
                    return Err(Error::Rdma(format!("the device reported {:?}", event.kind)))
                }
                kind if kind.qp_failed() => {
                    let index = event
                        .qp_num
                        .and_then(|q| self.shared.by_qp.get(&q).copied());
                    if let Some(conn) = index.and_then(|i| self.conns.get_mut(i)) {
                        let why = format!("the device reported {kind:?}");
                        conn.handle(Event::QpFailed { why: &why }, &mut self.shared.env());
                        relay(&mut self.conns, &mut self.shared);
                    }
                }
                _ => {}
            }
        }
    }

    /// Serves the listener's events until none is waiting, or
    /// [`CM_BATCH`] of them (the channel stays readable: the loop comes
    /// back at once, after the other sources).
    fn cm_events(&mut self) -> Result<()> {
        for _ in 0..CM_BATCH {
            let Some(event) = self.shared.listener.next_event(Instant::now())? else {
                return Ok(());
            };
            self.shared.event_errors = 0;
            match event {
                CmEvent::ConnectRequest(request) => {
                    // An Arm queued just before its server's request.
                    self.commands();
                    let data = request.private_data();
                    let highest = self.shared.settings.striping.protocol;
                    let token = match decode_connect_up_to(data, highest) {
                        Ok(token) => token,
                        Err(why) => {
                            refuse(request);
                            if self.shared.settings.debug {
                                log!(Level::Debug, "refused a connect request: {why}");
                            }
                            continue;
                        }
                    };
                    // The connection the request is for: the token's own,
                    // or (version 3) the one the plan gave a later share.
                    let index = self.shared.by_name.get(&token.name).copied();
                    match index.and_then(|i| self.conns.get_mut(i)) {
                        Some(conn) => {
                            let event = Event::ConnectRequest {
                                token: &token,
                                request,
                            };
                            conn.handle(event, &mut self.shared.env());
                            relay(&mut self.conns, &mut self.shared);
                        }
                        None => {
                            refuse(request);
                            if self.shared.settings.debug {
                                log!(
                                    Level::Debug,
                                    "refused a connect request: no connection is named QP {}",
                                    token.name
                                );
                            }
                        }
                    }
                }
                CmEvent::Established { .. } => {}
                CmEvent::Disconnected { conn } => {
                    // What the server sent before it disconnected (its final
                    // message) is in the CQ already: read first.
                    let polled = self.completions();
                    self.shared.tolerate("ibv_poll_cq", polled)?;
                    let index = self.shared.by_cm.get(&conn).copied();
                    log!(
                        Level::Info,
                        "CM connection {conn} disconnected (slot {index:?})"
                    );
                    if let Some(c) = index.and_then(|i| self.conns.get_mut(i)) {
                        if c.cm_id() == Some(conn) {
                            c.handle(Event::Disconnected, &mut self.shared.env());
                            relay(&mut self.conns, &mut self.shared);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs the deadlines that are due.
    fn timers(&mut self) {
        let now = Instant::now();
        while let Some((at, index)) = self.shared.timers.pop_due(now) {
            if let Some(conn) = self.conns.get_mut(index) {
                conn.handle(Event::Timer { at }, &mut self.shared.env());
                relay(&mut self.conns, &mut self.shared);
            }
        }
        self.shared.settings.timers_pending.store(
            self.shared.timers.len(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Shutdown: every job ends, every connection is disconnected, and no
    /// command is taken any more.
    fn shut(&mut self) {
        let why = Error::NotInitialized;
        self.shared.commands.kill(&why);
        self.shared.pool.kill(why.clone());
        for conn in &mut self.conns {
            conn.handle(Event::Shut { why: &why }, &mut self.shared.env());
        }
        relay(&mut self.conns, &mut self.shared);
    }

    /// The driver cannot go on: says so, fences every QP, and fails every
    /// transfer and every later lease with the reason.
    fn die(&mut self, why: &Error) {
        let why = Error::Rdma(format!("the connection driver stopped: {why}"));
        log!(Level::Error, "{why}; RDMA transfers fail from now on");
        self.shared.commands.kill(&why);
        self.shared.pool.kill(why);
        let mailboxes: Vec<_> = self.conns.iter_mut().filter_map(Conn::fence).collect();
        for mailbox in mailboxes {
            mailbox.fill(Err(Error::Rdma("the connection driver stopped".into())));
        }
    }
}
