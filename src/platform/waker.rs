//! Waiting for several descriptors at once, and an eventfd to be woken by.
//!
//! The client's connection driver waits on the RDMA CM channel, the pool's
//! completion channel, the device's asynchronous events and its own
//! command queue in one `poll(2)`: [`wait_readable`]. The fakes hand out
//! real descriptors (a [`Waker`] each), so the same wait serves both.

use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Instant;

use crate::error::{Error, Result};

/// An eventfd, readable from [`Waker::wake`] until [`Waker::take`].
#[derive(Debug)]
pub struct Waker(OwnedFd);

impl Waker {
    /// A new, unsignalled eventfd (non-blocking, close-on-exec).
    pub fn new() -> Result<Waker> {
        // SAFETY: eventfd takes no pointers; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return Err(Error::Rdma(format!("eventfd failed: {err}")));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(Waker(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable until [`Waker::take`].
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from `one` to the open eventfd. A full
        // counter (EAGAIN) means a wake is pending already, which is enough.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Whether a wake was pending; clears it.
    pub fn take(&self) -> bool {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `count` from the open,
        // non-blocking eventfd; reading resets its counter.
        let n = unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        n > 0
    }
}

impl AsFd for Waker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Milliseconds until `deadline`, rounded up (a wait never ends just before
/// it), at most `c_int::MAX`; -1 (forever) without a deadline.
fn timeout_ms(deadline: Option<Instant>) -> c_int {
    let Some(deadline) = deadline else {
        return -1;
    };
    let micros = deadline
        .saturating_duration_since(Instant::now())
        .as_micros();
    c_int::try_from(micros.div_ceil(1000)).unwrap_or(c_int::MAX)
}

/// Waits until one of `fds` is readable (or hung up), or `deadline`
/// passes; returns which are. All `false` means the deadline passed.
/// Interrupted waits are resumed with the time that is left.
pub fn wait_readable(fds: &[BorrowedFd<'_>], deadline: Option<Instant>) -> Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let count = libc::nfds_t::try_from(pfds.len())
        .map_err(|_| Error::Internal("too many descriptors to poll".into()))?;
    loop {
        // SAFETY: `pfds` holds `count` valid pollfds whose descriptors are
        // borrowed, so open, for the whole call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), count, timeout_ms(deadline)) };
        if n >= 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::Rdma(format!("poll(2) failed: {err}")));
        }
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_wake_makes_its_waker_readable_until_taken() {
        let (a, b) = (Waker::new().unwrap(), Waker::new().unwrap());
        let now = Some(Instant::now());
        assert_eq!(
            wait_readable(&[a.as_fd(), b.as_fd()], now).unwrap(),
            [false, false]
        );
        b.wake();
        b.wake();
        assert_eq!(
            wait_readable(&[a.as_fd(), b.as_fd()], now).unwrap(),
            [false, true]
        );
        assert!(b.take());
        assert!(!b.take(), "two wakes are one");
        assert_eq!(
            wait_readable(&[a.as_fd(), b.as_fd()], now).unwrap(),
            [false, false]
        );
    }

    #[test]
    fn a_wake_from_another_thread_ends_a_wait_without_deadline() {
        let w = std::sync::Arc::new(Waker::new().unwrap());
        let other = w.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.wake();
        });
        assert_eq!(wait_readable(&[w.as_fd()], None).unwrap(), [true]);
        t.join().unwrap();
    }

    #[test]
    fn the_timeout_rounds_up_and_saturates() {
        assert_eq!(timeout_ms(None), -1);
        let now = Instant::now();
        assert_eq!(timeout_ms(Some(now - Duration::from_secs(1))), 0);
        assert!(timeout_ms(Some(now + Duration::from_micros(1))) >= 0);
        assert_eq!(
            timeout_ms(Some(now + Duration::from_secs(100 * 24 * 3600))),
            c_int::MAX
        );
    }
}
