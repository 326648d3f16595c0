//! Asynchronous transfers: submit, get a [`Ticket`], poll, wait or await
//! it, drop it to cancel.
//!
//! A submitted transfer runs on the client's engine: a small pool of
//! threads (at most [`ClientBuilder::max_in_flight`](super::ClientBuilder::max_in_flight)
//! of them, started as work comes) that run the transfer's steps (lease,
//! token, the caller's S3 side, the driver's outcome), so that the
//! submitting thread never waits on the network. Submitting past the bound
//! queues the transfer (first in, first out).
//!
//! Every ticket's state has one owner, its [`Slot`], and every transition
//! happens in [`Slot::advance`]:
//!
//! ```text
//!  Queued --a worker takes it--> Running --the transfer returns--> Done
//!  Queued --cancel, or the client closes--> Done(Cancelled | Closed)
//!  Running --cancel, or the client closes--> Running, its transfer aborted
//!      (access revoked by the driver at once) --> Done(its outcome)
//!  Done --poll, wait or await--> Taken
//! ```
//!
//! A ticket owns what its transfer uses: the [`Buffer`] goes in with the
//! submission and comes back in [`Finished`], so nothing can touch its
//! bytes while a server may write them. Dropping a ticket that is not done
//! cancels its transfer and does not wait: the worker drops the buffer
//! (deregistered, then freed) once the transfer's outcome is in, which the
//! driver gives only after the server's access is revoked. A forgotten
//! ticket (`std::mem::forget`) leaks nothing it could free early: the
//! transfer runs to its end and its buffer is dropped then.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::core::sync::{Condvar, Mutex};
use crate::core::transfer::{Canceller, Direction, Route};
use crate::core::Instance;

use super::{run_transfer, Buffer, ClientError, Result, S3Side};

/// One transfer to submit: a direction, a buffer (owned until the ticket
/// hands it back), a range of it, and the S3 side that carries the token.
pub struct Transfer {
    direction: Direction,
    buffer: Buffer,
    range: Range<usize>,
    side: Box<dyn S3Side + Send>,
}

impl Transfer {
    /// Fills `range` of `buffer` from the S3 request `side` sends (a GET).
    pub fn get(buffer: Buffer, range: Range<usize>, side: impl S3Side + Send + 'static) -> Self {
        Transfer {
            direction: Direction::Get,
            buffer,
            range,
            side: Box::new(side),
        }
    }

    /// Sends `range` of `buffer` to the S3 request `side` sends (a PUT or
    /// an UploadPart).
    pub fn put(buffer: Buffer, range: Range<usize>, side: impl S3Side + Send + 'static) -> Self {
        Transfer {
            direction: Direction::Put,
            buffer,
            range,
            side: Box::new(side),
        }
    }
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("direction", &self.direction)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// A transfer's end: its buffer back, and how it went.
#[derive(Debug)]
pub struct Finished {
    /// The buffer the transfer was submitted with.
    pub buffer: Buffer,
    /// The route its bytes took, or why it failed
    /// ([`ClientError::Cancelled`], [`ClientError::Closed`] among the
    /// causes).
    pub result: Result<Route>,
}

/// A tagged transfer's end, from [`Client::next_completion`](super::Client::next_completion).
#[derive(Debug)]
pub struct Completion {
    /// The tag it was submitted with.
    pub tag: u64,
    /// Its end.
    pub finished: Finished,
}

/// Where a ticket is.
enum Phase {
    /// Waiting for a worker.
    Queued(Box<Job>),
    /// A worker runs it.
    Running,
    /// Its end, not yet taken.
    Done(Finished),
    /// Its end was handed out (or went to the completion queue, or was
    /// dropped with the ticket).
    Taken,
}

/// What moves a ticket from one phase to the next.
enum Step {
    /// A worker takes the job: `Some` if it was still queued.
    Start,
    /// The worker's transfer returned.
    End(Finished),
    /// The ticket's owner cancels (`dropped`: and will never look again).
    Cancel { dropped: bool },
    /// The client closes (or nothing can run the job): why.
    Close(String),
    /// The owner takes the end, if it is in (storing `waker` otherwise).
    Take(Option<Waker>),
}

/// What a transition leaves for its caller to do outside the lock.
#[derive(Default)]
struct After {
    /// The job a worker now runs.
    job: Option<Box<Job>>,
    /// The end the owner takes.
    finished: Option<Finished>,
    /// Dropped outside the lock: a buffer's deregistration waits on the
    /// driver.
    discard: Option<Finished>,
    /// To the completion queue.
    complete: Option<(u64, Finished)>,
    /// Woken outside the lock.
    wake: Option<Waker>,
}

struct Inner {
    phase: Phase,
    /// The ticket is gone: its end is dropped when it comes.
    dropped: bool,
    /// The client closed while it ran: its end says so.
    closed: bool,
    /// Its end goes to the client's completion queue with this tag.
    tag: Option<u64>,
    waker: Option<Waker>,
}

/// A ticket's shared state: the one owner of its phase.
pub(crate) struct Slot {
    inner: Mutex<Inner>,
    done: Condvar,
    cancel: Canceller,
}

struct Job {
    instance: Arc<Instance>,
    transfer: Transfer,
}

impl Slot {
    fn new(job: Job, tag: Option<u64>) -> Slot {
        Slot {
            inner: Mutex::new(Inner {
                phase: Phase::Queued(Box::new(job)),
                dropped: false,
                closed: false,
                tag,
                waker: None,
            }),
            done: Condvar::new(),
            cancel: Canceller::new(),
        }
    }

    /// Every transition of a ticket, under its lock; the caller does what
    /// [`After`] holds once the lock is released.
    fn advance(&self, step: Step) -> After {
        let mut after = After::default();
        let mut inner = self.inner.lock();
        let ended = match step {
            Step::Start => match std::mem::replace(&mut inner.phase, Phase::Running) {
                Phase::Queued(job) => {
                    after.job = Some(job);
                    None
                }
                other => {
                    inner.phase = other;
                    None
                }
            },
            Step::End(mut finished) => {
                if inner.closed {
                    if let Err(e) = &finished.result {
                        finished.result = Err(ClientError::Closed(e.to_string()));
                    }
                } else if self.cancel.is_cancelled() && finished.result.is_err() {
                    finished.result = Err(ClientError::Cancelled);
                }
                Some(finished)
            }
            Step::Cancel { dropped } => {
                inner.dropped |= dropped;
                self.cancel.cancel();
                match std::mem::replace(&mut inner.phase, Phase::Taken) {
                    Phase::Queued(job) => Some(Finished {
                        buffer: job.transfer.buffer,
                        result: Err(ClientError::Cancelled),
                    }),
                    Phase::Done(finished) if dropped => {
                        after.discard = Some(finished);
                        None
                    }
                    other => {
                        inner.phase = other;
                        None
                    }
                }
            }
            Step::Close(why) => {
                inner.closed = true;
                self.cancel.cancel();
                match std::mem::replace(&mut inner.phase, Phase::Taken) {
                    Phase::Queued(job) => Some(Finished {
                        buffer: job.transfer.buffer,
                        result: Err(ClientError::Closed(why)),
                    }),
                    other => {
                        inner.phase = other;
                        None
                    }
                }
            }
            Step::Take(waker) => {
                match std::mem::replace(&mut inner.phase, Phase::Taken) {
                    Phase::Done(finished) => after.finished = Some(finished),
                    other => {
                        if matches!(other, Phase::Queued(_) | Phase::Running) {
                            if let Some(waker) = waker {
                                inner.waker = Some(waker);
                            }
                        }
                        inner.phase = other;
                    }
                }
                None
            }
        };
        if let Some(finished) = ended {
            // Exactly once: the phases before Done are left only here.
            if inner.dropped {
                after.discard = Some(finished);
                inner.phase = Phase::Taken;
            } else if let Some(tag) = inner.tag {
                after.complete = Some((tag, finished));
                inner.phase = Phase::Taken;
            } else {
                inner.phase = Phase::Done(finished);
            }
            after.wake = inner.waker.take();
            self.done.notify_all();
        }
        after
    }

    /// Whether the end is in (or was taken).
    fn is_done(&self) -> bool {
        matches!(self.inner.lock().phase, Phase::Done(_) | Phase::Taken)
    }

    /// Waits until the end is in or `deadline` passes.
    fn wait_done(&self, deadline: Option<Instant>) {
        let mut inner = self.inner.lock();
        while matches!(inner.phase, Phase::Queued(_) | Phase::Running) {
            match deadline {
                Some(at) => {
                    if self.done.wait_until(&mut inner, at).timed_out() {
                        return;
                    }
                }
                None => self.done.wait(&mut inner),
            }
        }
    }
}

/// A submitted transfer. Poll it, wait for it, or `.await` it (no runtime
/// needed: the engine wakes the stored waker); it hands its [`Finished`]
/// out once. Dropping it before then cancels the transfer (without
/// waiting) and drops its buffer once the server's access is revoked.
pub struct Ticket {
    slot: Arc<Slot>,
    engine: Arc<Shared>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("done", &self.is_done())
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// Whether the transfer has ended (its end may have been taken).
    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    /// The end, if it is in and not taken yet; never blocks.
    pub fn poll(&mut self) -> Option<Finished> {
        self.take(None)
    }

    /// Waits for the end, at most `timeout` (`None`: as long as it takes);
    /// `None` if it did not come in time (or was taken already).
    pub fn wait(&mut self, timeout: Option<Duration>) -> Option<Finished> {
        self.slot.wait_done(timeout.map(|t| Instant::now() + t));
        self.take(None)
    }

    /// Cancels the transfer: one still queued ends at once, one running
    /// is aborted (the server's access revoked by the driver) and ends
    /// when its S3 request returns; one that ended already keeps its end.
    /// The end still comes through [`Ticket::wait`]: a transfer that
    /// completed before the cancel took effect says so.
    pub fn cancel(&self) {
        let after = self.slot.advance(Step::Cancel { dropped: false });
        self.engine.after(after);
    }

    fn take(&mut self, waker: Option<Waker>) -> Option<Finished> {
        let mut after = self.slot.advance(Step::Take(waker));
        let finished = after.finished.take();
        self.engine.after(after);
        finished
    }
}

impl Future for Ticket {
    type Output = Finished;

    /// Ready once the end is in. Polled again after it was ready (or after
    /// [`Ticket::poll`] took the end), it stays pending.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        match self.take(Some(cx.waker().clone())) {
            Some(finished) => Poll::Ready(finished),
            None => Poll::Pending,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.slot.inner.lock().tag.is_some() {
            // A tagged transfer's ticket is the engine's: its end goes to
            // the completion queue.
            return;
        }
        let after = self.slot.advance(Step::Cancel { dropped: true });
        self.engine.after(after);
    }
}

// ---------------------------------------------------------------- the engine

struct Queue {
    jobs: VecDeque<Arc<Slot>>,
    /// What each worker runs now.
    running: Vec<Arc<Slot>>,
    workers: usize,
    idle: usize,
    closed: bool,
}

/// The engine's state, shared by the client, its tickets and its workers.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    bound: usize,
    completions: Mutex<VecDeque<Completion>>,
    completed: Condvar,
}

/// The client's pool of transfer threads and its completion queue.
pub(crate) struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    /// At most `bound` transfers in flight (at least one).
    pub(crate) fn new(bound: usize) -> Engine {
        Engine {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    running: Vec::new(),
                    workers: 0,
                    idle: 0,
                    closed: false,
                }),
                work: Condvar::new(),
                bound: bound.max(1),
                completions: Mutex::new(VecDeque::new()),
                completed: Condvar::new(),
            }),
        }
    }

    /// The bound on transfers in flight.
    pub(crate) fn bound(&self) -> usize {
        self.shared.bound
    }

    /// Queues `transfer` for `instance`; its ticket (whose end, `tag`ged,
    /// goes to the completion queue instead). The transfer comes back when
    /// the engine is closed, or in a process forked from the one that made
    /// it: the counts of workers it holds there are the parent's, whose
    /// threads the child does not have, so a queued job would never run.
    pub(crate) fn submit(
        &self,
        instance: &Arc<Instance>,
        transfer: Transfer,
        tag: Option<u64>,
    ) -> std::result::Result<Ticket, Transfer> {
        if instance.forked() {
            return Err(transfer);
        }
        let mut queue = self.shared.queue.lock();
        if queue.closed {
            return Err(transfer);
        }
        let slot = Arc::new(Slot::new(
            Job {
                instance: Arc::clone(instance),
                transfer,
            },
            tag,
        ));
        queue.jobs.push_back(Arc::clone(&slot));
        let spawn = queue.idle == 0 && queue.workers < self.shared.bound;
        if spawn {
            queue.workers += 1;
        } else {
            self.shared.work.notify_one();
        }
        drop(queue);
        if spawn {
            let shared = Arc::clone(&self.shared);
            let started = std::thread::Builder::new()
                .name("hipobj-transfer".into())
                .spawn(move || shared.work());
            if let Err(e) = started {
                let mut queue = self.shared.queue.lock();
                queue.workers -= 1;
                // With no worker at all, nothing would ever run it.
                let alone = queue.workers == 0;
                if alone {
                    queue.jobs.retain(|s| !Arc::ptr_eq(s, &slot));
                }
                drop(queue);
                if alone {
                    let why = format!("no transfer thread could be started: {e}");
                    self.shared.after(slot.advance(Step::Close(why)));
                }
            }
        }
        Ok(Ticket {
            slot,
            engine: Arc::clone(&self.shared),
        })
    }

    /// Up to `max` tagged ends, in the order they ended: those in now,
    /// or, if none is, the first to come within `timeout` (`None`: as long
    /// as it takes) and those with it.
    pub(crate) fn completions(&self, max: usize, timeout: Option<Duration>) -> Vec<Completion> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut completions = self.shared.completions.lock();
        while completions.is_empty() && max > 0 {
            match deadline {
                Some(at) => {
                    if self
                        .shared
                        .completed
                        .wait_until(&mut completions, at)
                        .timed_out()
                    {
                        break;
                    }
                }
                None => self.shared.completed.wait(&mut completions),
            }
        }
        let n = completions.len().min(max);
        completions.drain(..n).collect()
    }

    /// Closes: every queued transfer ends with [`ClientError::Closed`],
    /// every running one is aborted (its access revoked) and ends with it;
    /// later submissions are refused. Does not wait for the workers.
    pub(crate) fn close(&self) {
        let (queued, running) = {
            let mut queue = self.shared.queue.lock();
            queue.closed = true;
            self.shared.work.notify_all();
            (std::mem::take(&mut queue.jobs), queue.running.clone())
        };
        for slot in queued.iter().chain(running.iter()) {
            let why = "the client was closed before the transfer ended".to_owned();
            self.shared.after(slot.advance(Step::Close(why)));
        }
    }
}

impl Shared {
    /// Does what a transition left to do, outside every lock.
    fn after(&self, after: After) {
        if let Some((tag, finished)) = after.complete {
            self.completions
                .lock()
                .push_back(Completion { tag, finished });
            self.completed.notify_one();
        }
        if let Some(waker) = after.wake {
            waker.wake();
        }
        drop(after.discard);
        drop(after.job);
    }

    /// A worker: runs queued transfers until the engine is closed and its
    /// queue empty.
    fn work(self: Arc<Self>) {
        loop {
            let slot = {
                let mut queue = self.queue.lock();
                loop {
                    if let Some(slot) = queue.jobs.pop_front() {
                        queue.running.push(Arc::clone(&slot));
                        break slot;
                    }
                    if queue.closed {
                        queue.workers -= 1;
                        return;
                    }
                    queue.idle += 1;
                    self.work.wait(&mut queue);
                    queue.idle -= 1;
                }
            };
            if let Some(job) = slot.advance(Step::Start).job {
                let Job {
                    instance,
                    transfer:
                        Transfer {
                            direction,
                            buffer,
                            range,
                            mut side,
                        },
                } = *job;
                let result = run_transfer(
                    &instance,
                    direction,
                    &buffer,
                    range,
                    &mut *side,
                    Some(&slot.cancel),
                );
                drop(side);
                let after = slot.advance(Step::End(Finished { buffer, result }));
                self.after(after);
            }
            self.queue.lock().running.retain(|s| !Arc::ptr_eq(s, &slot));
        }
    }
}
