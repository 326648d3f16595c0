//! Polling that adapts: a thread polls for a transfer's next step only
//! while its recent polls found the step ready, and sleeps at once
//! otherwise.
//!
//! A poll pays where the step comes within the window, from another core:
//! the thread that would have slept and been woken (tens of µs) sees it in
//! a few. It costs where the step does not come: on a host whose cores are
//! all busy, the thread polling takes the CPU that the thread it waits for
//! needs, and sleeps after its window anyway (on the fake fabric, a reused
//! transfer took 212 µs with polling against 26 µs without). So the gauge
//! counts misses in a row (up to 9); after a miss the next
//! 2^(misses - 1) - 1 waits sleep at once (0, 1, 3, 7 ... up to
//! [`MAX_SKIP`]) before a poll tries again, and a find forgets them all:
//! one probe in [`MAX_SKIP`] + 1 waits on a host where polls keep missing,
//! every wait on an idle one. A single miss costs nothing more (an
//! application that pauses between transfers has the driver's poll after
//! each transfer miss, while the transfer's own steps find theirs). Where
//! finds and misses come by turns the gauge keeps polling, so a place that
//! waits for steps of different kinds keeps one gauge per kind: a server
//! side's wait for the grant misses on a busy host (the client's driver
//! must be scheduled first) where its waits for its own completions find
//! theirs.
//!
//! A step found at all within the window counts as found, however late,
//! and a find forgets every miss: where every party sleeps, a probe's step
//! waits for another party's wake-up, and a stricter test keeps them all
//! asleep (on the fake fabric, counting a step found after a quarter of
//! the window as a miss kept an idle host at 148 µs per reused transfer;
//! with a find forgetting one miss only, a fresh world once slept through
//! its first 2000 transfers, 1.2 wake-ups each).
//!
//! One gauge is shared by the threads of one waiting place (the calling
//! threads of an instance, its connection driver, each step of a server
//! side's transfers), read and written without a lock: a count off by a
//! race only moves a probe.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The most waits in a row that sleep at once after misses.
pub const MAX_SKIP: u32 = 255;

/// The misses in a row after which the run of waits that sleep at once
/// stops growing (`2^(MAX_MISSES - 1) - 1` = [`MAX_SKIP`]).
const MAX_MISSES: u32 = MAX_SKIP.count_ones() + 1;

/// How long one waiting place polls before it sleeps, from what its
/// recent polls found.
#[derive(Debug)]
pub struct Polling {
    /// The longest poll (`HIPOBJ_POLL_US`, by device); zero: never polls.
    limit: Duration,
    /// Misses in a row (since the last find), up to [`MAX_MISSES`].
    misses: AtomicU32,
    /// Waits left that sleep at once.
    skip: AtomicU32,
}

impl Polling {
    /// A gauge that polls for up to `limit` while polling pays.
    pub fn new(limit: Duration) -> Polling {
        Polling {
            limit,
            misses: AtomicU32::new(0),
            skip: AtomicU32::new(0),
        }
    }

    /// The configured longest poll.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// How long the next wait polls before it sleeps: the limit, or zero
    /// while a run of misses has it sleep at once. A wait that is given a
    /// non-zero window tells [`Polling::found`] what it found.
    pub fn window(&self) -> Duration {
        if self.limit.is_zero() {
            return Duration::ZERO;
        }
        let skipped = self
            .skip
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if skipped {
            Duration::ZERO
        } else {
            self.limit
        }
    }

    /// What a poll given a window found: its step (polling pays: the
    /// misses are forgotten), or nothing before its window ended (a miss:
    /// from the second in a row, the next run of waits, twice the last,
    /// sleeps at once).
    pub fn found(&self, found: bool) {
        if found {
            if self.misses.load(Ordering::Relaxed) != 0 {
                self.misses.store(0, Ordering::Relaxed);
            }
            return;
        }
        let misses = self
            .misses
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m + 1).min(MAX_MISSES))
            })
            .map_or(MAX_MISSES, |m| (m + 1).min(MAX_MISSES));
        self.skip.store((1 << (misses - 1)) - 1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_micros(50);

    /// The windows of the next `n` waits.
    fn windows(p: &Polling, n: usize) -> Vec<bool> {
        (0..n).map(|_| !p.window().is_zero()).collect()
    }

    #[test]
    fn polls_that_find_their_step_keep_polling() {
        let p = Polling::new(LIMIT);
        for _ in 0..1000 {
            assert_eq!(p.window(), LIMIT);
            p.found(true);
        }
    }

    #[test]
    fn each_miss_after_the_first_doubles_the_waits_that_sleep_at_once() {
        let p = Polling::new(LIMIT);
        for run in [0usize, 1, 3, 7, 15, 31, 63, 127, 255, 255, 255] {
            assert_eq!(p.window(), LIMIT, "the poll before a run of {run}");
            p.found(false);
            assert_eq!(windows(&p, run), vec![false; run], "run {run}");
        }
        // A probe that finds its step: every wait polls again, and the
        // misses start again from none: one alone skips nothing.
        assert_eq!(p.window(), LIMIT);
        p.found(true);
        assert_eq!(windows(&p, 3), vec![true; 3]);
        p.found(false);
        assert_eq!(windows(&p, 1), vec![true]);
        p.found(false);
        assert_eq!(windows(&p, 2), vec![false, true]);
    }

    #[test]
    fn a_zero_limit_never_polls() {
        let p = Polling::new(Duration::ZERO);
        assert_eq!(windows(&p, 5), vec![false; 5]);
        p.found(true);
        assert_eq!(windows(&p, 5), vec![false; 5]);
    }
}
