//! Per-instance counters: what moved the bytes, and what went wrong, so that
//! no fallback is silent. Counted with relaxed atomics where the event
//! happens (the calling thread for transfers and copies, the connection
//! driver for handshakes and in-band proofs); read as one [`Snapshot`].
//! C programs get them as one `hipobj-stats:` line on stderr at
//! `hipObjShutdown` when `HIPOBJ_STATS` is set.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Code, Error};

/// The live counters of one instance.
#[derive(Debug, Default)]
pub struct Stats {
    direct: AtomicU64,
    direct_bytes: AtomicU64,
    staged: AtomicU64,
    staged_bytes: AtomicU64,
    declined: AtomicU64,
    failed_s3: AtomicU64,
    failed_rdma: AtomicU64,
    failed_busy: AtomicU64,
    failed_staging: AtomicU64,
    failed_other: AtomicU64,
    handshakes: AtomicU64,
    reused: AtomicU64,
    staging_copies: AtomicU64,
    abandoned_copies: AtomicU64,
    wakeups: AtomicU64,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Transfers that succeeded with the NIC reading or writing the
    /// buffer itself (host memory, or GPU memory registered directly).
    pub direct: u64,
    /// Their bytes.
    pub direct_bytes: u64,
    /// Transfers that succeeded through a host staging buffer.
    pub staged: u64,
    /// Their bytes.
    pub staged_bytes: u64,
    /// Transfers the server answered with a failure status (it declined,
    /// or failed): the application falls back or gives up.
    pub declined: u64,
    /// Transfers whose S3 conversation failed otherwise (a callback
    /// failed, or the reply could not be read).
    pub failed_s3: u64,
    /// Transfers that failed on the RDMA side (the connection, the server's
    /// data or final message, the device).
    pub failed_rdma: u64,
    /// Transfers refused because every connection, or the buffer, was busy.
    pub failed_busy: u64,
    /// Transfers whose staging copy failed or missed its deadline.
    pub failed_staging: u64,
    /// Transfers that failed for another reason (arguments, shutdown).
    pub failed_other: u64,
    /// Servers that connected afresh (an RDMA CM handshake accepted).
    pub handshakes: u64,
    /// Servers that proved a token on a connection they kept (no handshake).
    pub reused: u64,
    /// Staging copies started.
    pub staging_copies: u64,
    /// Staging copies that missed their deadline and were abandoned.
    pub abandoned_copies: u64,
    /// Times a thread of the library (a transfer's, or the connection
    /// driver) went to sleep waiting for a transfer's next step and was
    /// woken by another thread or the device: the hand-offs that cost a
    /// wake-up each (`docs/performance.md`). Where the library does not
    /// poll (`HIPOBJ_POLL_US` 0), a wait of the driver that found something
    /// at once is counted too.
    pub wakeups: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    /// A transfer of `bytes` succeeded, `staged` or not.
    pub fn transferred(&self, staged: bool, bytes: u64) {
        let (count, total) = if staged {
            (&self.staged, &self.staged_bytes)
        } else {
            (&self.direct, &self.direct_bytes)
        };
        add(count, 1);
        add(total, bytes);
    }

    /// A transfer failed with `error`.
    pub fn failed(&self, error: &Error) {
        let counter = match (error, error.code()) {
            (Error::S3(why), _) if why.starts_with(DECLINED) => &self.declined,
            (Error::Staging { .. }, _) => &self.failed_staging,
            (_, Code::S3) => &self.failed_s3,
            (_, Code::Rdma) => &self.failed_rdma,
            (_, Code::Busy) => &self.failed_busy,
            _ => &self.failed_other,
        };
        add(counter, 1);
    }

    /// A server's connect request was accepted.
    pub fn handshake(&self) {
        add(&self.handshakes, 1);
    }

    /// A server proved a token on the connection it kept.
    pub fn reuse(&self) {
        add(&self.reused, 1);
    }

    /// A staging copy started.
    pub fn staging_copy(&self) {
        add(&self.staging_copies, 1);
    }

    /// A staging copy was abandoned.
    pub fn abandoned_copy(&self) {
        add(&self.abandoned_copies, 1);
    }

    /// A thread of the library slept and was woken.
    pub fn woken(&self) {
        add(&self.wakeups, 1);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            direct: get(&self.direct),
            direct_bytes: get(&self.direct_bytes),
            staged: get(&self.staged),
            staged_bytes: get(&self.staged_bytes),
            declined: get(&self.declined),
            failed_s3: get(&self.failed_s3),
            failed_rdma: get(&self.failed_rdma),
            failed_busy: get(&self.failed_busy),
            failed_staging: get(&self.failed_staging),
            failed_other: get(&self.failed_other),
            handshakes: get(&self.handshakes),
            reused: get(&self.reused),
            staging_copies: get(&self.staging_copies),
            abandoned_copies: get(&self.abandoned_copies),
            wakeups: get(&self.wakeups),
        }
    }
}

pub(crate) use crate::error::DECLINED;

impl fmt::Display for Snapshot {
    /// `name=value` pairs, space-separated, in a fixed order: the body of
    /// the `hipobj-stats:` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs = [
            ("direct", self.direct),
            ("direct_bytes", self.direct_bytes),
            ("staged", self.staged),
            ("staged_bytes", self.staged_bytes),
            ("declined", self.declined),
            ("failed_s3", self.failed_s3),
            ("failed_rdma", self.failed_rdma),
            ("failed_busy", self.failed_busy),
            ("failed_staging", self.failed_staging),
            ("failed_other", self.failed_other),
            ("handshakes", self.handshakes),
            ("reused", self.reused),
            ("staging_copies", self.staging_copies),
            ("abandoned_copies", self.abandoned_copies),
            ("wakeups", self.wakeups),
        ];
        for (i, (name, value)) in pairs.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{name}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_by_cause() {
        let s = Stats::default();
        s.failed(&Error::S3(format!("{DECLINED}501")));
        s.failed(&Error::S3("sendRequest returned -1".into()));
        s.failed(&Error::Rdma("the connection broke".into()));
        s.failed(&Error::Busy("every connection is in use"));
        s.failed(&Error::Staging {
            what: "late",
            hip: 0,
        });
        s.failed(&Error::NotInitialized);
        let n = s.snapshot();
        assert_eq!(
            (
                n.declined,
                n.failed_s3,
                n.failed_rdma,
                n.failed_busy,
                n.failed_staging,
                n.failed_other
            ),
            (1, 1, 1, 1, 1, 1)
        );
    }

    #[test]
    fn the_line_names_every_counter_in_order() {
        let s = Stats::default();
        s.transferred(false, 10);
        s.transferred(true, 7);
        s.transferred(true, 5);
        s.handshake();
        s.reuse();
        s.reuse();
        s.staging_copy();
        s.abandoned_copy();
        s.woken();
        assert_eq!(
            s.snapshot().to_string(),
            "direct=1 direct_bytes=10 staged=2 staged_bytes=12 declined=0 failed_s3=0 \
             failed_rdma=0 failed_busy=0 failed_staging=0 failed_other=0 handshakes=1 \
             reused=2 staging_copies=1 abandoned_copies=1 wakeups=1"
        );
    }
}
