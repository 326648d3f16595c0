//! The locks that transfer threads and the connection driver share (the
//! free list, the mailboxes, the command queue), behind one name so that
//! the model checker can take their place.
//!
//! Normally these are `parking_lot`'s. Built with `--cfg loom`
//! (`scripts/loom.sh`), they are loom's, with the same methods, and
//! `src/core/loom_models.rs` explores every interleaving of small models of
//! the free list, the mailbox and the command queue (`docs/reliability.md`).
//! Timed waits are loom's too: a wait may time out at any point.

#[cfg(not(loom))]
pub use parking_lot::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::thread_local;

#[cfg(not(loom))]
pub use std::sync::atomic::AtomicBool;

#[cfg(loom)]
pub use loom::sync::atomic::AtomicBool;

#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(loom)]
pub use model::{Condvar, Mutex, MutexGuard, WaitTimeoutResult};

#[cfg(loom)]
mod model {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    /// loom's mutex, locked as `parking_lot`'s is (no poisoning).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// Its guard; empty only while a condition variable waits with it.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        /// A mutex holding `value`.
        pub fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }

        /// Locks it.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(|p| p.into_inner())))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("a guard holds its lock")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("a guard holds its lock")
        }
    }

    /// Whether a timed wait ended by its deadline.
    pub struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        /// True if the wait timed out.
        pub fn timed_out(&self) -> bool {
            self.0
        }
    }

    /// loom's condition variable, waited on as `parking_lot`'s is.
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A condition variable.
        pub fn new() -> Condvar {
            Condvar(loom::sync::Condvar::new())
        }

        /// Waits for a notification.
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let held = guard.0.take().expect("a guard holds its lock");
            guard.0 = Some(self.0.wait(held).unwrap_or_else(|p| p.into_inner()));
        }

        /// Waits for a notification or the deadline; loom may end the wait
        /// by the deadline at any point.
        pub fn wait_until<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            deadline: Instant,
        ) -> WaitTimeoutResult {
            let held = guard.0.take().expect("a guard holds its lock");
            let left = deadline.saturating_duration_since(Instant::now());
            let (held, result) = self
                .0
                .wait_timeout(held, left)
                .unwrap_or_else(|p| p.into_inner());
            guard.0 = Some(held);
            WaitTimeoutResult(result.timed_out())
        }

        /// Wakes one waiter.
        pub fn notify_one(&self) {
            self.0.notify_one();
        }

        /// Wakes every waiter.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}
