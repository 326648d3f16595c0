//! Where the connection driver leaves a transfer's outcome for the thread
//! (or the later call) that waits for it.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::sync::{AtomicBool, Condvar, Mutex};

use crate::error::{Error, Result};
use crate::platform::Gid;

/// One outcome, filled once (later fills are ignored), read by any number
/// of waiters.
#[derive(Default)]
pub struct Mailbox {
    outcome: Mutex<Option<Result<()>>>,
    filled: Condvar,
    /// The server a successful transfer used (set before the fill).
    peer: Mutex<Option<Gid>>,
    /// A server proved the transfer's token: it may be moving bytes.
    proved: Mutex<bool>,
    /// Set once the outcome is in (read without the lock, by a thread that
    /// polls for it).
    done: AtomicBool,
}

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> Mailbox {
        Mailbox::default()
    }

    /// Leaves the outcome, unless one is there already.
    pub fn fill(&self, outcome: Result<()>) {
        let mut slot = self.outcome.lock();
        if slot.is_none() {
            *slot = Some(outcome);
            self.done.store(true, Ordering::Release);
            self.filled.notify_all();
        }
    }

    /// Records the server the transfer used.
    pub fn set_peer(&self, gid: Gid) {
        *self.peer.lock() = Some(gid);
    }

    /// Records that a server proved the transfer's token (the driver, at
    /// the grant).
    pub fn set_proved(&self) {
        *self.proved.lock() = true;
    }

    /// Whether a server proved the transfer's token.
    pub fn proved(&self) -> bool {
        *self.proved.lock()
    }

    /// The server the transfer used, if it was recorded.
    pub fn peer(&self) -> Option<Gid> {
        *self.peer.lock()
    }

    /// The outcome, if it is there.
    pub fn peek(&self) -> Option<Result<()>> {
        self.outcome.lock().clone()
    }

    /// Polls for the outcome until `until`, without sleeping or taking the
    /// lock the filler needs; whether it is in.
    pub fn poll_until(&self, until: Instant) -> bool {
        loop {
            if self.done.load(Ordering::Acquire) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            crate::platform::pause();
        }
    }

    /// Waits for the outcome until `deadline` (`None`: as long as it takes).
    pub fn wait(&self, deadline: Option<Instant>) -> Option<Result<()>> {
        self.wait_noting(deadline).0
    }

    /// [`Mailbox::wait`], saying whether the thread had to sleep (and be
    /// woken) for it.
    pub fn wait_noting(&self, deadline: Option<Instant>) -> (Option<Result<()>>, bool) {
        let mut slot = self.outcome.lock();
        let slept = slot.is_none();
        while slot.is_none() {
            match deadline {
                Some(at) => {
                    if self.filled.wait_until(&mut slot, at).timed_out() {
                        break;
                    }
                }
                None => self.filled.wait(&mut slot),
            }
        }
        (slot.clone(), slept)
    }
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("outcome", &*self.outcome.lock())
            .finish()
    }
}

/// An outcome that did not come in time.
pub fn late(what: &str) -> Error {
    Error::Rdma(format!(
        "{what}: the connection driver did not answer in time"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_first_outcome_stays_and_wakes_every_waiter() {
        let m = Arc::new(Mailbox::new());
        assert_eq!(m.wait(Some(Instant::now())), None);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || m.wait(None))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(10));
        m.fill(Ok(()));
        m.fill(Err(Error::Busy("late")));
        for w in waiters {
            assert_eq!(w.join().unwrap(), Some(Ok(())));
        }
        assert_eq!(m.peek(), Some(Ok(())));
    }
}
