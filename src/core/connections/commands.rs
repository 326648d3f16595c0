//! The driver's command queue: what transfer threads (and calls of the
//! application) ask of the connection driver, and the eventfd that wakes
//! it. Below the pool, which sends commands for its leases, and the
//! driver, which serves them.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::core::mailbox::Mailbox;
use crate::core::sync::Mutex;
use crate::error::{Error, Result};
use crate::platform::Waker;

use super::conn::Armed;

/// What transfer threads (and calls of the application) ask of the driver.
pub enum Command {
    /// A transfer on a leased slot: a server may prove its token now.
    Arm {
        /// The slot.
        index: usize,
        /// Its lease's epoch.
        epoch: u64,
        /// The transfer.
        armed: Box<Armed>,
    },
    /// The transfer's S3 conversation ended (`ok`: answered success).
    Replied {
        /// The slot.
        index: usize,
        /// Its lease's epoch.
        epoch: u64,
        /// Whether the server answered success.
        ok: bool,
    },
    /// The lease's thread gave the transfer up (or unwound): revoke, free.
    Abort {
        /// The slot.
        index: usize,
        /// Its lease's epoch.
        epoch: u64,
    },
    /// A lease dropped before its transfer was armed.
    Release {
        /// The slot.
        index: usize,
        /// Its lease's epoch.
        epoch: u64,
    },
    /// Ends every application-driven token on the buffer at `base`
    /// (deregistration revokes its access), then fills `done`.
    EndTokens {
        /// The buffer's registered address.
        base: usize,
        /// Filled once they ended.
        done: Arc<Mailbox>,
    },
    /// The application released the token with this QP and secret
    /// (`hipObjPutRdmaToken`). It ends nothing; the job is marked, so that
    /// while no server has proved it, its connection may go to a newer
    /// token when the pool runs out.
    Released {
        /// The token's QP number.
        qp_num: u32,
        /// The token's secret.
        secret: u32,
    },
    /// A token is being minted and no connection is free: end the oldest
    /// released token no server has proved, if any. `done` gets `Ok` when
    /// a connection is (or will soon be) free, `Err(Busy)` when every
    /// connection holds an application-driven token that is not released.
    Reclaim {
        /// Answered once decided.
        done: Arc<Mailbox>,
    },
    /// The instance is shut down: end every application-driven token (its
    /// access revoked), refuse any later one, then fill `done`. Transfers
    /// that threads wait on run to their end.
    Close {
        /// Filled once every token has ended.
        done: Arc<Mailbox>,
    },
    /// Shut down: end every job, disconnect every connection, exit.
    Stop,
}

struct Queue {
    commands: VecDeque<Command>,
    dead: Option<Error>,
}

/// The driver's command queue and the eventfd that wakes it.
pub struct Commands {
    queue: Mutex<Queue>,
    /// Its eventfd, which the driver waits on.
    pub(super) waker: Waker,
}

impl Commands {
    /// An empty queue.
    pub fn new() -> Result<Commands> {
        Ok(Commands {
            queue: Mutex::new(Queue {
                commands: VecDeque::new(),
                dead: None,
            }),
            waker: Waker::new()?,
        })
    }

    /// Queues `command`; `wake` makes the driver look now. Fails (and
    /// drops the command) once the driver stopped.
    pub fn send(&self, command: Command, wake: bool) -> Result<()> {
        let mut queue = self.queue.lock();
        if let Some(dead) = &queue.dead {
            return Err(dead.clone());
        }
        queue.commands.push_back(command);
        drop(queue);
        if wake {
            self.waker.wake();
        }
        Ok(())
    }

    /// Whether a command is queued.
    pub(crate) fn pending(&self) -> bool {
        !self.queue.lock().commands.is_empty()
    }

    pub(crate) fn take(&self) -> VecDeque<Command> {
        std::mem::take(&mut self.queue.lock().commands)
    }

    /// No command is accepted any more; those queued are answered `why`.
    pub(crate) fn kill(&self, why: &Error) {
        let left = {
            let mut queue = self.queue.lock();
            queue.dead.get_or_insert_with(|| why.clone());
            std::mem::take(&mut queue.commands)
        };
        for command in left {
            match command {
                Command::Arm { armed, .. } => armed.mailbox.fill(Err(why.clone())),
                Command::EndTokens { done, .. }
                | Command::Reclaim { done }
                | Command::Close { done } => done.fill(Ok(())),
                _ => {}
            }
        }
    }
}
