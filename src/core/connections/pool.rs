//! The pool's free list and the leases transfer threads hold.
//!
//! A lease is a handle to a slot at an epoch, not a license to touch its
//! QP: only the connection driver changes a connection, and only the
//! driver puts a slot back on the free list, once it is clean (no access,
//! window unbound). A lease that is dropped without an outcome (an error
//! or an unwinding panic in its thread) tells the driver, which revokes
//! whatever the lease's transfer was granted before the slot is free.
//!
//! Locks: the free list's mutex is never held across a command, a verbs
//! call or a callback.

use std::cell::Cell;
use std::sync::Arc;

use crate::core::sync::{Condvar, Mutex};

use super::commands::{Command, Commands};
use super::conn::Armed;
use super::slots::{SlotInfo, Slots};
use crate::error::{Error, Result};
use crate::platform::Gid;

struct Inner {
    free: Vec<SlotInfo>,
    closed: bool,
    /// Why the driver stopped, once it has.
    dead: Option<Error>,
    retired: usize,
}

/// How long a lease may wait for a free slot.
#[derive(Clone, Copy)]
enum Wait {
    No,
    Forever,
    Until(std::time::Instant),
}

/// The free list.
pub struct Pool {
    inner: Mutex<Inner>,
    available: Condvar,
    total: usize,
    commands: Arc<Commands>,
}

// Not `const` initializers: loom's `thread_local!` (under `--cfg loom`,
// core/sync.rs) does not take them.
crate::core::sync::thread_local! {
    /// Leases this thread holds, of any pool: a thread that holds one and
    /// finds none free gets `Busy` rather than waiting for itself.
    #[allow(clippy::missing_const_for_thread_local)]
    static HELD: Cell<usize> = Cell::new(0);
    /// The server GID of this thread's last transfer.
    #[allow(clippy::missing_const_for_thread_local)]
    static LAST_PEER: Cell<Option<Gid>> = Cell::new(None);
}

/// Remembers the server this thread's transfer used.
pub fn remember_peer(gid: Option<Gid>) {
    LAST_PEER.with(|p| p.set(gid));
}

impl Pool {
    /// An empty free list for `total` connections, whose leases talk to the
    /// driver through `commands`.
    pub fn new(total: usize, commands: Arc<Commands>) -> Pool {
        Pool {
            inner: Mutex::new(Inner {
                free: Vec::with_capacity(total),
                closed: false,
                dead: None,
                retired: 0,
            }),
            available: Condvar::new(),
            total,
            commands,
        }
    }

    /// Leases a free slot, preferring one established with the server this
    /// thread's last transfer used, then one with no server. When none is
    /// free: a thread that already holds a lease gets `Busy`; others wait
    /// (the driver frees slots by itself: transfers end, tokens expire). A
    /// closed pool gives `NotInitialized`, a dead driver its error.
    pub fn acquire(&self) -> Result<Lease> {
        self.lease(Wait::Forever)?
            .ok_or_else(|| Error::Internal("a lease that waits came back empty".into()))
    }

    /// [`Pool::acquire`] without waiting: `None` when no slot is free.
    pub fn try_acquire(&self) -> Result<Option<Lease>> {
        self.lease(Wait::No)
    }

    /// [`Pool::acquire`], waiting until `deadline` at most: `None` if no
    /// slot came free by then.
    pub fn acquire_until(&self, deadline: std::time::Instant) -> Result<Option<Lease>> {
        self.lease(Wait::Until(deadline))
    }

    fn lease(&self, mut wait: Wait) -> Result<Option<Lease>> {
        let mut inner = self.inner.lock();
        loop {
            if inner.closed {
                return Err(Error::NotInitialized);
            }
            if let Some(dead) = &inner.dead {
                return Err(dead.clone());
            }
            if let Some(info) = Self::pick(&mut inner.free) {
                HELD.with(|h| h.set(h.get() + 1));
                return Ok(Some(Lease {
                    info,
                    commands: self.commands.clone(),
                    counted: true,
                    state: LeaseState::Unarmed,
                }));
            }
            if inner.retired >= self.total {
                return Err(Error::Rdma(
                    "every pool connection failed and was retired".into(),
                ));
            }
            if HELD.with(Cell::get) > 0 {
                return Err(Error::Busy(
                    "every connection is leased, one of them by this thread",
                ));
            }
            match wait {
                Wait::No => return Ok(None),
                Wait::Forever => self.available.wait(&mut inner),
                Wait::Until(at) => {
                    if self.available.wait_until(&mut inner, at).timed_out() {
                        // One last look at the list, then give up.
                        wait = Wait::No;
                    }
                }
            }
        }
    }

    fn pick(free: &mut Vec<SlotInfo>) -> Option<SlotInfo> {
        let prefer = LAST_PEER.with(Cell::get);
        let rank = |s: &SlotInfo| match (s.peer, prefer) {
            (Some(p), Some(q)) if p == q => 0,
            (None, _) => 1,
            _ => 2,
        };
        let (pos, _) = free.iter().enumerate().min_by_key(|(_, s)| rank(s))?;
        Some(free.swap_remove(pos))
    }

    /// Closes the pool: leases fail with `NotInitialized` from now on,
    /// including those waiting.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.available.notify_all();
    }

    /// The driver stopped with `why`: every lease fails with it from now
    /// on, including those waiting.
    pub fn kill(&self, why: Error) {
        let mut inner = self.inner.lock();
        inner.dead.get_or_insert(why);
        inner.free.clear();
        drop(inner);
        self.available.notify_all();
    }

    /// Why the driver stopped, if it did.
    pub fn death(&self) -> Option<Error> {
        self.inner.lock().dead.clone()
    }

    /// Free slots.
    pub fn free_count(&self) -> usize {
        self.inner.lock().free.len()
    }

    /// Free slots still established with a server.
    pub fn connected_free_count(&self) -> usize {
        self.inner
            .lock()
            .free
            .iter()
            .filter(|s| s.peer.is_some())
            .count()
    }

    /// Connections retired after a failed reset.
    pub fn retired_count(&self) -> usize {
        self.inner.lock().retired
    }

    /// Connections in the pool.
    pub fn total(&self) -> usize {
        self.total
    }
}

impl Slots for Pool {
    fn put_back(&self, info: SlotInfo) {
        let mut inner = self.inner.lock();
        if !inner.free.iter().any(|s| s.index == info.index) {
            inner.free.push(info);
        }
        drop(inner);
        self.available.notify_one();
    }

    fn take_for_stripes(&self, count: usize, peer: Option<Gid>, primary: usize) -> Vec<SlotInfo> {
        let mut inner = self.inner.lock();
        let mut taken = Vec::with_capacity(count);
        for want in [peer, None] {
            if want.is_none() && peer.is_none() && !taken.is_empty() {
                break;
            }
            while taken.len() < count {
                let Some(pos) = inner
                    .free
                    .iter()
                    .position(|s| s.peer == want && s.index != primary)
                else {
                    break;
                };
                taken.push(inner.free.swap_remove(pos));
            }
        }
        taken
    }

    fn take_free(&self, index: usize) {
        let mut inner = self.inner.lock();
        if let Some(pos) = inner.free.iter().position(|s| s.index == index) {
            inner.free.swap_remove(pos);
        }
    }

    fn is_free(&self, index: usize) -> bool {
        self.inner.lock().free.iter().any(|s| s.index == index)
    }

    fn refresh(&self, info: SlotInfo) {
        let mut inner = self.inner.lock();
        if let Some(slot) = inner.free.iter_mut().find(|s| s.index == info.index) {
            *slot = info;
        }
    }

    fn retire(&self) {
        self.inner.lock().retired += 1;
        self.available.notify_all();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    /// Taken; the driver has not been told of a transfer.
    Unarmed,
    /// The driver holds the transfer; its outcome is not in.
    Armed,
    /// The outcome is in, or the driver owns the job alone (a token).
    Settled,
}

/// One leased slot. Dropped unarmed, it goes back to the free list; dropped
/// armed and unsettled, its transfer is aborted (access revoked first).
pub struct Lease {
    info: SlotInfo,
    commands: Arc<Commands>,
    counted: bool,
    state: LeaseState,
}

impl Lease {
    /// The slot.
    pub fn info(&self) -> &SlotInfo {
        &self.info
    }

    /// Detaches the lease from this thread's count: for a lease that
    /// outlives the call that took it (an application-driven token).
    pub fn detach(&mut self) {
        if std::mem::take(&mut self.counted) {
            HELD.with(|h| h.set(h.get().saturating_sub(1)));
        }
    }

    /// Hands the transfer to the driver. `wake` says whether the driver
    /// must look now (a deadline to watch); otherwise it finds the command
    /// before the first event of the slot, which the transfer's server
    /// causes. On failure (the driver is gone) the lease is settled.
    pub fn arm(&mut self, armed: Box<Armed>, wake: bool) -> Result<()> {
        let command = Command::Arm {
            index: self.info.index,
            epoch: self.info.epoch,
            armed,
        };
        let sent = self.commands.send(command, wake);
        self.state = if sent.is_ok() {
            LeaseState::Armed
        } else {
            LeaseState::Settled
        };
        sent
    }

    /// Tells the driver the S3 conversation ended (`ok`: the server
    /// answered success).
    pub fn replied(&self, ok: bool) -> Result<()> {
        self.commands.send(
            Command::Replied {
                index: self.info.index,
                epoch: self.info.epoch,
                ok,
            },
            true,
        )
    }

    /// A handle that ends this lease's transfer from another thread, once
    /// the transfer is armed (`None` before: an Abort that overtook the Arm
    /// would free the slot under this lease). The driver reads its
    /// commands in order, so the handle's Abort comes after the Arm; one
    /// that comes after the transfer ended names an epoch that is gone and
    /// ends nothing.
    pub fn abort_handle(&self) -> Option<AbortHandle> {
        (self.state == LeaseState::Armed).then(|| AbortHandle {
            commands: self.commands.clone(),
            index: self.info.index,
            epoch: self.info.epoch,
        })
    }

    /// The outcome is in (or the job is the driver's alone): dropping the
    /// lease no longer aborts anything.
    pub fn settle(&mut self) {
        self.state = LeaseState::Settled;
    }
}

/// Ends one armed transfer (its slot at its epoch) from any thread:
/// [`Lease::abort_handle`].
#[derive(Clone)]
pub struct AbortHandle {
    commands: Arc<Commands>,
    index: usize,
    epoch: u64,
}

impl AbortHandle {
    /// Asks the driver to end the transfer: its access is revoked and its
    /// mailbox filled, as for a lease dropped unsettled. Never waits.
    pub fn abort(&self) {
        let command = Command::Abort {
            index: self.index,
            epoch: self.epoch,
        };
        // A dead driver ended every transfer already.
        let _ = self.commands.send(command, true);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.detach();
        let (index, epoch) = (self.info.index, self.info.epoch);
        let command = match self.state {
            LeaseState::Unarmed => Command::Release { index, epoch },
            LeaseState::Armed => Command::Abort { index, epoch },
            LeaseState::Settled => return,
        };
        // A dead driver freed everything already.
        let _ = self.commands.send(command, true);
    }
}
