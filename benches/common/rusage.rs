//! This process's resource use so far, every thread's together (ended
//! threads included): `getrusage(RUSAGE_SELF)`.

#![allow(dead_code)]

use std::time::Duration;

/// What `getrusage` counts.
pub struct Usage {
    /// Time on a CPU, user and system.
    pub cpu: Duration,
    /// Context switches, voluntary and not.
    pub switches: u64,
}

/// The process's use so far; all zero if `getrusage` fails.
pub fn usage() -> Usage {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live, writable rusage for the call's duration.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Usage {
            cpu: Duration::ZERO,
            switches: 0,
        };
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Usage {
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        switches: u64::try_from(usage.ru_nvcsw + usage.ru_nivcsw).unwrap_or(0),
    }
}
