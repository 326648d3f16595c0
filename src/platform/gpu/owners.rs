//! RAII owners of what HIP hands out: pinned host buffers, device memory
//! and events.
//!
//! Each owner holds an `Arc` of the HIP table, so the functions that free it
//! stay resolved for as long as it lives (the library itself is never
//! unloaded: [`super::loader`]). A free or destroy that fails is logged on
//! stderr, counted ([`release_failures`]) and leaked; `Drop` never panics.
//!
//! # Threads
//!
//! Owners are `Send + Sync`: the library creates a buffer or event on the
//! thread of one call and may free, query or wait on it from another (an
//! abandoned copy is pruned by whichever call comes next). HIP places no
//! thread affinity on these handles: its header says of the runtime that it
//! "may be called from any host thread" and that "multiple host threads may
//! use the same device" (`hipSetDevice`, `<hip/hip_runtime_api.h>`); the only
//! per-thread state is the current device and the per-thread stream, which
//! these owners do not depend on after creation. The runtime serialises
//! concurrent calls on one event itself: `hip::Event::query` takes the
//! event's own lock (ROCm's CLR, `hipamd/src/hip_event.cpp`).

use crate::log::{log, Level};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::loader::HipApi;
use super::sys::{
    check, HipError, HipEvent, HipStream, HIP_ERROR_INVALID_VALUE, HIP_ERROR_NOT_READY,
    HIP_ERROR_OUT_OF_MEMORY, HIP_EVENT_DISABLE_TIMING, HIP_HOST_MALLOC_DEFAULT, HIP_SUCCESS,
};
use crate::platform::{DeviceBuffer, GpuEvent, HipResult, HostBuffer};

static RELEASE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many `hipHostFree` or `hipEventDestroy` calls failed in this process
/// (each logged, its object leaked).
pub fn release_failures() -> u64 {
    RELEASE_FAILURES.load(Ordering::Relaxed)
}

pub(crate) fn release_failed(call: &str, code: HipError) {
    RELEASE_FAILURES.fetch_add(1, Ordering::Relaxed);
    log!(
        Level::Error,
        "{call} failed with hipError_t {code}; the object is leaked"
    );
}

// ---------------------------------------------------------------- host buffer

/// Pinned host memory from `hipHostMalloc`, freed with `hipHostFree` on
/// drop unless leaked.
pub(crate) struct PinnedHostBuffer {
    hip: Arc<HipApi>,
    ptr: NonNull<c_void>,
    len: usize,
    leaked: AtomicBool,
}

// SAFETY: the buffer exclusively owns its allocation, never reads or writes
// through `ptr` (it only reports the address), and frees it once, in `Drop`.
// `hipHostFree` may be called from any host thread (see the module's
// "Threads"), so the owner may move to and be shared with other threads.
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: as for `Send`; the only state shared by `&self` is the atomic
// `leaked` flag.
unsafe impl Sync for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// `hipHostMalloc` of `len` bytes with `hipHostMallocDefault`.
    /// `hipErrorInvalidValue` for `len == 0`: HIP would return success and
    /// NULL, and a buffer is never empty.
    pub(crate) fn alloc(hip: &Arc<HipApi>, len: usize) -> HipResult<PinnedHostBuffer> {
        if len == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host_malloc` has hipHostMalloc's prototype; `ptr` is a
        // valid place for the out-pointer.
        check(unsafe { (hip.fns.host_malloc)(&mut ptr, len, HIP_HOST_MALLOC_DEFAULT) })?;
        let ptr = NonNull::new(ptr).ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        Ok(PinnedHostBuffer {
            hip: Arc::clone(hip),
            ptr,
            len,
            leaked: AtomicBool::new(false),
        })
    }
}

impl HostBuffer for PinnedHostBuffer {
    fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    fn len(&self) -> usize {
        self.len
    }

    fn leak(&self) {
        self.leaked.store(true, Ordering::Release);
    }

    fn write(&self, offset: usize, data: &[u8]) -> bool {
        // SAFETY: `len` bytes of host memory from hipHostMalloc, owned by `self`
        // for the call; the owner never makes a reference to them.
        unsafe { super::host_write(self.addr(), self.len, offset, data) }
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        // SAFETY: as in `write`.
        unsafe { super::host_read(self.addr(), self.len, offset, out) }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        if self.leaked.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: `ptr` came from hipHostMalloc, is freed only here, and was
        // not leaked, so no copy the library still tracks writes it.
        let code = unsafe { (self.hip.fns.host_free)(self.ptr.as_ptr()) };
        if code != HIP_SUCCESS {
            release_failed("hipHostFree", code);
        }
    }
}

// ---------------------------------------------------------------- device memory

/// Device memory from `hipMalloc`, freed with `hipFree` on drop.
pub(crate) struct DeviceMemory {
    hip: Arc<HipApi>,
    ptr: NonNull<c_void>,
    len: usize,
    device: i32,
}

// SAFETY: the owner exclusively owns its allocation, never reads or writes
// through `ptr` (a device address the host cannot dereference; it only
// reports it), and frees it once, in `Drop`. `hipFree` may be called from
// any host thread (the module's "Threads"), for memory of any device.
unsafe impl Send for DeviceMemory {}
// SAFETY: as for `Send`; `&self` gives out only plain values.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// `hipMalloc` of `len` bytes on the current device, which is
    /// `device`. `hipErrorInvalidValue` for `len == 0`: HIP would return
    /// success and NULL, and a buffer is never empty.
    pub(crate) fn alloc(hip: &Arc<HipApi>, device: i32, len: usize) -> HipResult<DeviceMemory> {
        if len == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `malloc` has hipMalloc's prototype; `ptr` is a valid
        // place for the out-pointer.
        check(unsafe { (hip.fns.malloc)(&mut ptr, len) })?;
        let ptr = NonNull::new(ptr).ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        Ok(DeviceMemory {
            hip: Arc::clone(hip),
            ptr,
            len,
            device,
        })
    }
}

impl DeviceBuffer for DeviceMemory {
    fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    fn len(&self) -> usize {
        self.len
    }

    fn device(&self) -> i32 {
        self.device
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from hipMalloc and is freed only here; whoever
        // copied into it waited for the copy (the Rust API waits for every
        // copy it starts before the buffer can drop).
        let code = unsafe { (self.hip.fns.free)(self.ptr.as_ptr()) };
        if code != HIP_SUCCESS {
            release_failed("hipFree", code);
        }
    }
}

// ---------------------------------------------------------------- event

/// An event created with `hipEventDisableTiming`, destroyed with
/// `hipEventDestroy` on drop unless leaked.
///
/// HIP cannot wait on an event with a timeout (`hipEventSynchronize` blocks
/// until the event completes, however long that is), so [`GpuEvent::wait`]
/// polls `hipEventQuery` with a [`Backoff`].
pub(crate) struct RecordedEvent {
    hip: Arc<HipApi>,
    event: HipEvent,
    leaked: AtomicBool,
}

// SAFETY: the owner holds the only copy of the handle and destroys it once,
// in `Drop`. `hipEventQuery` and `hipEventDestroy` may be called from any
// host thread and the runtime locks its event state (see the module's
// "Threads"), so the owner may move to and be shared with other threads.
unsafe impl Send for RecordedEvent {}
// SAFETY: as for `Send`; `&self` shares only the handle, which HIP
// synchronises, and the atomic `leaked` flag.
unsafe impl Sync for RecordedEvent {}

impl RecordedEvent {
    /// `hipEventCreateWithFlags(hipEventDisableTiming)`.
    pub(crate) fn create(hip: &Arc<HipApi>) -> HipResult<RecordedEvent> {
        let mut event: HipEvent = std::ptr::null_mut();
        // SAFETY: `event_create_with_flags` has hipEventCreateWithFlags's
        // prototype; `event` is a valid place for the handle.
        check(unsafe { (hip.fns.event_create_with_flags)(&mut event, HIP_EVENT_DISABLE_TIMING) })?;
        Ok(RecordedEvent {
            hip: Arc::clone(hip),
            event,
            leaked: AtomicBool::new(false),
        })
    }

    /// `hipEventRecord` on `stream`: the event completes once the work
    /// queued on `stream` before it has.
    pub(crate) fn record(&self, stream: HipStream) -> HipResult<()> {
        // SAFETY: `event` is live (destroyed only in `Drop`); `stream` is a
        // stream handle or one of HIP's special handles.
        check(unsafe { (self.hip.fns.event_record)(self.event, stream) })
    }

    /// `hipEventQuery`: `Ok(true)` done, `Ok(false)` not yet.
    fn query(&self) -> HipResult<bool> {
        // SAFETY: `event` is live (destroyed only in `Drop`).
        match unsafe { (self.hip.fns.event_query)(self.event) } {
            HIP_SUCCESS => Ok(true),
            HIP_ERROR_NOT_READY => Ok(false),
            code => Err(code),
        }
    }
}

impl GpuEvent for RecordedEvent {
    /// Queries at least once, then polls with a [`Backoff`] (never sleeping
    /// past `deadline`) until the event is done, fails, or the deadline
    /// passes.
    fn wait(&self, deadline: Instant) -> HipResult<bool> {
        Backoff::poll_until(deadline, || self.query())
    }

    fn leak(&self) {
        self.leaked.store(true, Ordering::Release);
    }
}

impl Drop for RecordedEvent {
    fn drop(&mut self) {
        if self.leaked.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: `event` came from hipEventCreateWithFlags and is destroyed
        // only here.
        let code = unsafe { (self.hip.fns.event_destroy)(self.event) };
        if code != HIP_SUCCESS {
            release_failed("hipEventDestroy", code);
        }
    }
}

// ---------------------------------------------------------------- backoff

/// One step of a [`Backoff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pause {
    /// A CPU spin-loop hint: the copy is likely a few microseconds from done.
    Spin,
    /// Give the CPU to another thread.
    Yield,
    /// Sleep this long (at most).
    Sleep(Duration),
}

/// The polling schedule of [`RecordedEvent::wait`]: a few spins, a few
/// yields, then sleeps doubling from [`Backoff::FIRST_SLEEP`] to
/// [`Backoff::MAX_SLEEP`]. A short copy is seen done within microseconds; a
/// long one costs at most one wake-up a millisecond.
pub(crate) struct Backoff {
    step: u32,
    sleep: Duration,
}

impl Backoff {
    const SPINS: u32 = 16;
    const YIELDS: u32 = 4;
    /// The first sleep.
    pub(crate) const FIRST_SLEEP: Duration = Duration::from_micros(20);
    /// The longest sleep.
    pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(1);

    pub(crate) fn new() -> Backoff {
        Backoff {
            step: 0,
            sleep: Backoff::FIRST_SLEEP,
        }
    }

    /// The next pause of the schedule.
    pub(crate) fn next_pause(&mut self) -> Pause {
        let step = self.step;
        self.step = self.step.saturating_add(1);
        if step < Backoff::SPINS {
            Pause::Spin
        } else if step < Backoff::SPINS + Backoff::YIELDS {
            Pause::Yield
        } else {
            let sleep = self.sleep;
            self.sleep = (sleep * 2).min(Backoff::MAX_SLEEP);
            Pause::Sleep(sleep)
        }
    }

    /// Calls `query` at least once, then again after each pause of a new
    /// schedule (never sleeping past `deadline`), until it says done
    /// (`Ok(true)`), fails, or the deadline passes (`Ok(false)`): how both
    /// runtimes' events are waited for, neither having a timed wait.
    pub(crate) fn poll_until(
        deadline: Instant,
        mut query: impl FnMut() -> HipResult<bool>,
    ) -> HipResult<bool> {
        let mut backoff = Backoff::new();
        loop {
            if query()? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            backoff.pause(deadline - now);
        }
    }

    /// Takes the next pause, sleeping no longer than `remaining`.
    fn pause(&mut self, remaining: Duration) {
        match self.next_pause() {
            Pause::Spin => std::hint::spin_loop(),
            Pause::Yield => thread::yield_now(),
            Pause::Sleep(sleep) => thread::sleep(sleep.min(remaining)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_then_yields_then_sleeps_doubling_up_to_a_millisecond() {
        let mut backoff = Backoff::new();
        let pauses: Vec<Pause> = (0..40).map(|_| backoff.next_pause()).collect();
        assert!(pauses[..16].iter().all(|p| *p == Pause::Spin));
        assert!(pauses[16..20].iter().all(|p| *p == Pause::Yield));
        let sleeps: Vec<u64> = pauses[20..]
            .iter()
            .map(|p| match p {
                Pause::Sleep(d) => u64::try_from(d.as_micros()).unwrap(),
                other => panic!("expected a sleep, got {other:?}"),
            })
            .collect();
        assert_eq!(
            &sleeps[..8],
            &[20, 40, 80, 160, 320, 640, 1000, 1000],
            "{sleeps:?}"
        );
        assert!(sleeps[8..].iter().all(|&us| us == 1000));
    }
}
