//! A completion queue with its own completion channel, and waiting on it
//! without sleeping a fixed time.

use std::any::Any;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::BorrowedFd;
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::context::DeviceContext;
use super::convert::{self, zeroed};
use super::inline;
use super::sys::{ibv_comp_channel, ibv_cq, ibv_wc, ibv_wc_flags};
use super::{check_rc, destroy_failed, null_error};
use crate::error::{Error, Result};
use crate::platform::{Completion, Context, Cq};

/// Most completions read by one `ibv_poll_cq`.
const POLL_BATCH: usize = 64;

/// A CQ (`struct ibv_cq`) and the completion channel that only it uses.
///
/// Field order: `cq` and `channel` are destroyed by `Drop::drop`, the CQ
/// first (a channel with a CQ on it cannot be destroyed); `ctx` is dropped
/// after both, so the context outlives them.
pub struct CompletionQueue {
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    /// The channel's descriptor (non-blocking), owned by the channel.
    fd: c_int,
    /// Completions `wait` polled while closing the arm/poll race, handed
    /// out first by the next `poll`.
    early: Mutex<VecDeque<Completion>>,
    /// The `wc_flags` bits that say an rkey was invalidated, by device
    /// ([`convert::RXE_WITH_INV`]).
    with_inv: ibv_wc_flags::Type,
    ctx: Arc<DeviceContext>,
}

// SAFETY: `cq` and `channel` are used only through libibverbs calls, which
// are thread-safe on the same CQ and channel (polling, arming, reading and
// acknowledging events from several threads: "libibverbs thread safe
// level", RDMAmojo), and destroyed once, in `Drop`, after every QP on the CQ
// (each holds an `Arc` of it). `early` is behind a mutex.
unsafe impl Send for CompletionQueue {}
// SAFETY: as for `Send`.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Reads one event from the (non-blocking) channel and acknowledges it
    /// at once, so that destroying the CQ never waits for an
    /// unacknowledged event (ibv_get_cq_event(3): ibv_destroy_cq blocks
    /// until every event read is acknowledged). `false`: none was waiting.
    fn read_event(&self) -> Result<bool> {
        let mut event_cq: *mut ibv_cq = ptr::null_mut();
        let mut event_context: *mut c_void = ptr::null_mut();
        // SAFETY: `channel` is live and non-blocking; the out-pointers are
        // valid.
        let rc = unsafe {
            (self.ctx.table().get_cq_event)(self.channel, &mut event_cq, &mut event_context)
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(Error::Rdma(format!(
                "ibv_get_cq_event({}) failed: {err}",
                self.ctx.name()
            )));
        }
        // SAFETY: the channel carries events of this CQ only, so `event_cq`
        // is `self.cq`, live; one event was read.
        unsafe { (self.ctx.table().ack_cq_events)(event_cq, 1) };
        Ok(true)
    }

    /// `ibv_create_comp_channel`, made non-blocking, then `ibv_create_cq`
    /// with `depth` entries on it.
    pub(super) fn create(ctx: Arc<DeviceContext>, depth: u32) -> Result<CompletionQueue> {
        let name = ctx.name();
        let table = ctx.table();
        let Ok(cqe) = c_int::try_from(depth) else {
            return Err(Error::Rdma(format!(
                "ibv_create_cq({name}, {depth} entries) failed: more entries than an int holds"
            )));
        };
        // SAFETY: `ctx` is open while the `Arc` lives.
        let channel = unsafe { (table.create_comp_channel)(ctx.raw()) };
        if channel.is_null() {
            return Err(null_error(format_args!("ibv_create_comp_channel({name})")));
        }
        let destroy_channel = || {
            // SAFETY: `channel` was created above, has no CQ, and is not
            // used again.
            let rc = unsafe { (table.destroy_comp_channel)(channel) };
            if rc != 0 {
                destroy_failed(format_args!("ibv_destroy_comp_channel({name})"), rc);
            }
        };
        // SAFETY: `channel` is live; `fd` is set at creation, never changed.
        let fd = unsafe { (*channel).fd };
        // ibv_get_cq_event(3): the channel's fd may be made non-blocking and
        // polled; then a read with no event fails with EAGAIN instead of
        // blocking (two threads woken for one event cannot hang).
        if let Err(e) = set_nonblocking(fd) {
            destroy_channel();
            return Err(Error::Rdma(format!(
                "fcntl(O_NONBLOCK) on the completion channel of {name} failed: {e}"
            )));
        }
        // SAFETY: `ctx` is open and `channel` is a live channel of it.
        let cq = unsafe { (table.create_cq)(ctx.raw(), cqe, ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let err = null_error(format_args!("ibv_create_cq({name}, {depth} entries)"));
            destroy_channel();
            return Err(err);
        }
        let with_inv = if ctx.vendor_id() == convert::RXE_VENDOR_ID {
            convert::RXE_WITH_INV
        } else {
            convert::WITH_INV
        };
        Ok(CompletionQueue {
            cq,
            channel,
            fd,
            early: Mutex::new(VecDeque::new()),
            with_inv,
            ctx,
        })
    }

    pub(crate) fn raw(&self) -> *mut ibv_cq {
        self.cq
    }

    pub(crate) fn context(&self) -> &DeviceContext {
        &self.ctx
    }

    /// One `ibv_poll_cq` of up to `max` entries.
    fn poll_raw(&self, max: usize) -> Result<Vec<Completion>> {
        let n = max.min(POLL_BATCH);
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut wc: Vec<ibv_wc> = vec![zeroed(); n];
        let want = c_int::try_from(n).unwrap_or(c_int::MAX);
        // SAFETY: `cq` is live while `self` is; `wc` holds `want` entries.
        let got = unsafe { inline::poll_cq(self.cq, want, wc.as_mut_ptr()) };
        // ibv_poll_cq(3): negative is a failure (not an errno); the usual
        // cause is a CQ overrun, after which the CQ is unusable.
        let Ok(got) = usize::try_from(got) else {
            return Err(Error::Rdma(format!(
                "ibv_poll_cq({}) failed with {got} (CQ overrun or device error)",
                self.ctx.name()
            )));
        };
        let with_inv = self.with_inv;
        Ok(wc
            .iter()
            .take(got)
            .map(|wc| convert::completion(wc, with_inv))
            .collect())
    }
}

/// Sets `O_NONBLOCK` on `fd`.
pub(crate) fn set_nonblocking(fd: c_int) -> std::io::Result<()> {
    // SAFETY: F_GETFL on a descriptor the caller's channel owns; fcntl
    // touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above, F_SETFL with the flags just read plus O_NONBLOCK.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Milliseconds until `deadline`, rounded up (so a wait never ends just
/// before it), at most `c_int::MAX`.
pub(crate) fn poll_timeout_ms(now: Instant, deadline: Instant) -> c_int {
    let micros = deadline.saturating_duration_since(now).as_micros();
    c_int::try_from(micros.div_ceil(1000)).unwrap_or(c_int::MAX)
}

impl Cq for CompletionQueue {
    fn poll(&self, max: usize) -> Result<Vec<Completion>> {
        let mut out: Vec<Completion> = {
            let mut early = self.early.lock();
            let n = max.min(early.len());
            early.drain(..n).collect()
        };
        if out.len() < max {
            out.extend(self.poll_raw(max - out.len())?);
        }
        Ok(out)
    }

    fn wait(&self, deadline: Instant) -> Result<bool> {
        if !self.early.lock().is_empty() {
            return Ok(true);
        }
        let name = self.ctx.name();
        // 1. Arm: the next completion added produces an event.
        // SAFETY: `cq` is live while `self` is.
        let rc = unsafe { inline::req_notify_cq(self.cq, false) };
        check_rc(format_args!("ibv_req_notify_cq({name})"), rc)?;
        // 2. A completion that arrived before arming produces no event:
        // poll once, and keep what is found for the next `poll`.
        let found = self.poll_raw(1)?;
        if !found.is_empty() {
            self.early.lock().extend(found);
            return Ok(true);
        }
        // 3. Wait for the event with the time that is left.
        loop {
            let mut pfd = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = poll_timeout_ms(Instant::now(), deadline);
            // SAFETY: `pfd` is one valid pollfd; the channel's fd stays open
            // while `self` lives.
            let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
            if n > 0 {
                break;
            }
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::Rdma(format!(
                        "poll(2) on the completion channel of {name} failed: {err}"
                    )));
                }
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
        // 4. Read the event. Another thread waiting on this CQ may have
        // read it first; either way the caller polls.
        self.read_event()?;
        Ok(true)
    }

    fn arm(&self) -> Result<()> {
        // SAFETY: `cq` is live while `self` is.
        let rc = unsafe { inline::req_notify_cq(self.cq, false) };
        check_rc(format_args!("ibv_req_notify_cq({})", self.ctx.name()), rc)
    }

    fn channel_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel (and its descriptor) lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }

    fn take_events(&self) -> Result<usize> {
        // One read: an armed CQ raises one event, so after it the next read
        // would fail with EAGAIN, a system call for nothing; an event still
        // waiting leaves the channel readable for the next look.
        Ok(usize::from(self.read_event()?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        let name = self.ctx.name();
        // SAFETY: `cq` is live and this is its last reference: each QP on it
        // holds an `Arc` and is destroyed. Every event read was acknowledged.
        let rc = unsafe { (self.ctx.table().destroy_cq)(self.cq) };
        if rc != 0 {
            destroy_failed(format_args!("ibv_destroy_cq({name})"), rc);
            // The channel still has the CQ on it: leak it too.
            return;
        }
        // SAFETY: `channel` is live and no CQ uses it any more.
        let rc = unsafe { (self.ctx.table().destroy_comp_channel)(self.channel) };
        if rc != 0 {
            destroy_failed(format_args!("ibv_destroy_comp_channel({name})"), rc);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_poll_timeout_rounds_up_and_saturates() {
        let now = Instant::now();
        assert_eq!(poll_timeout_ms(now, now), 0);
        assert_eq!(poll_timeout_ms(now + Duration::from_secs(1), now), 0);
        assert_eq!(poll_timeout_ms(now, now + Duration::from_micros(1)), 1);
        assert_eq!(poll_timeout_ms(now, now + Duration::from_millis(250)), 250);
        assert_eq!(
            poll_timeout_ms(now, now + Duration::from_secs(100 * 24 * 3600)),
            c_int::MAX
        );
    }
}
