//! The pool's connections: the one home of the connection state machine.
//!
//! Everything that grants or revokes a server's access to client memory
//! lives here, and nothing outside reaches in. A transfer (or a token)
//! goes through a narrow interface:
//!
//! - [`Connections::acquire`] (or [`Connections::try_acquire`],
//!   [`Connections::acquire_until`]) leases a slot: a [`Lease`], a handle to
//!   a connection at an epoch, never the connection itself;
//! - [`Lease::arm`] hands the driver an [`Armed`] transfer (its token, the
//!   [`Grant`] a proof unlocks, its buffer, where its outcome goes);
//! - [`Lease::replied`] says the S3 conversation ended; the outcome then
//!   arrives in the transfer's mailbox, only after its access is revoked;
//! - [`Lease::settle`] once the outcome is in; dropping an unsettled lease
//!   aborts the transfer (revoking first);
//! - for application-driven tokens and the buffers they use:
//!   [`Connections::end_tokens`], [`Connections::released`],
//!   [`Connections::reclaim`]; and [`Connections::close`] at shutdown.
//!
//! Inside: `conn` is one connection's state and its transitions (one entry
//! point, `Conn::handle`), `driver` the one thread that owns every
//! connection and hands each event to its transition, `pool` the free list
//! and the leases. `docs/architecture.md` draws the states.

mod commands;
mod conn;
mod driver;
mod pool;
mod slots;

#[cfg(all(test, loom))]
mod loom_models;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use conn::{Armed, Grant, Mode, Striping, MAX_WRONG_PROOFS};
pub use driver::Settings;
pub use pool::{remember_peer, AbortHandle, Lease, Pool};
pub use slots::SlotInfo;

use crate::core::mailbox::Mailbox;
use crate::core::protocol::VERSION_3;
use crate::error::Result;
use crate::platform::{CmListener, Context, Pd};
use commands::{Command, Commands};
use driver::Driver;

/// A pool of connections and the driver thread that owns them. Dropping it
/// stops the driver (which ends every job, revoking its access, and
/// disconnects every connection) before the free list goes.
pub struct Connections {
    driver: Driver,
    pool: Arc<Pool>,
    mode: Mode,
}

impl Connections {
    /// `count` connections on `ctx` (QPs in INIT, receives posted, windows
    /// in `pd` where the device has them), served by a driver thread that
    /// also serves `listener`.
    pub fn start(
        ctx: Arc<dyn Context>,
        pd: &Arc<dyn Pd>,
        listener: Arc<dyn CmListener>,
        count: usize,
        settings: Settings,
    ) -> Result<Connections> {
        let commands = Arc::new(Commands::new()?);
        let pool = Arc::new(Pool::new(count, commands.clone()));
        let parts = driver::build(&*ctx, pd, count, &pool, settings.clone())?;
        let mode = parts.mode();
        let mut settings = settings;
        if mode == Mode::Regions {
            // Version 4's final message invalidates a window: without
            // windows, this client speaks version 3 at most.
            settings.striping.protocol = settings.striping.protocol.min(VERSION_3);
        }
        let driver = Driver::start(parts, listener, ctx, pool.clone(), commands, settings)?;
        Ok(Connections { driver, pool, mode })
    }

    /// How access is granted on this device.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The free list.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// See [`Pool::acquire`].
    pub fn acquire(&self) -> Result<Lease> {
        self.pool.acquire()
    }

    /// See [`Pool::try_acquire`].
    pub fn try_acquire(&self) -> Result<Option<Lease>> {
        self.pool.try_acquire()
    }

    /// See [`Pool::acquire_until`].
    pub fn acquire_until(&self, deadline: Instant) -> Result<Option<Lease>> {
        self.pool.acquire_until(deadline)
    }

    /// Ends every application-driven token on the buffer at `base`
    /// (revoking its access), waiting up to `within` for the driver:
    /// `false` if it did not answer in time.
    pub fn end_tokens(&self, base: usize, within: Duration) -> bool {
        self.driver_does(|done| Command::EndTokens { base, done }, within)
    }

    /// The application released the token with this QP and secret: it is
    /// only marked (while no server has proved it, [`Connections::reclaim`]
    /// may end it for a newer token). Never waits.
    pub fn released(&self, qp_num: u32, secret: u32) {
        // A stopped driver has ended every token already.
        let _ = self
            .driver
            .commands()
            .send(Command::Released { qp_num, secret }, false);
    }

    /// No slot is free for a token: the driver ends the oldest released
    /// token no server has proved, if any. `Err(Busy)` when every
    /// connection holds a token that will not free it soon; `Ok` when one
    /// is (or soon will be) free, or the driver did not answer in `within`.
    pub fn reclaim(&self, within: Duration) -> Result<()> {
        let done = Arc::new(Mailbox::new());
        let sent = self
            .driver
            .commands()
            .send(Command::Reclaim { done: done.clone() }, true);
        match sent {
            Ok(()) => done.wait(Some(Instant::now() + within)).unwrap_or(Ok(())),
            Err(_) => Ok(()),
        }
    }

    /// Shutdown: leases fail with `NotInitialized` from now on, and every
    /// application-driven token ends (its access revoked) before this
    /// returns, unless the driver does not answer in `within` (`false`).
    pub fn close(&self, within: Duration) -> bool {
        self.pool.close();
        self.driver_does(|done| Command::Close { done }, within)
    }

    /// Sends the driver the command `make` builds around a mailbox it
    /// fills when done, and waits up to `within` for that. `false` only if
    /// the driver took the command and did not answer in time (a stopped
    /// driver has ended every job already).
    fn driver_does(&self, make: impl FnOnce(Arc<Mailbox>) -> Command, within: Duration) -> bool {
        let done = Arc::new(Mailbox::new());
        if self
            .driver
            .commands()
            .send(make(done.clone()), true)
            .is_err()
        {
            return true;
        }
        done.wait(Some(Instant::now() + within)).is_some()
    }
}
