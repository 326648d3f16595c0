//! What the library writes to stderr: one `hipobj: ` line per message, at a
//! level, kept when the process's level (`HIPOBJ_LOG`, set at `hipObjInit`)
//! lets it through. Written without panicking when stderr is closed or
//! full. No message carries a token, a key or a secret: messages name QP
//! numbers, addresses, calls and errors only.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

/// How much the library says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Failures the application's result codes cannot explain (which
    /// library, device or call failed), and leaks.
    Error = 1,
    /// Also what works but not as asked: staging instead of GPU-direct, a
    /// device without memory windows, a server that misbehaved.
    Warn = 2,
    /// Also the connections' lives: connects, disconnects, retirements.
    Info = 3,
    /// Also every refused connect request, failed dma-buf export and
    /// failed transfer, with why (`HIPOBJ_RDMA_DEBUG`).
    Debug = 4,
}

impl Level {
    /// `error`, `warn`, `info` or `debug`, in any case.
    pub fn parse(text: &[u8]) -> Option<Level> {
        [
            (&b"error"[..], Level::Error),
            (b"warn", Level::Warn),
            (b"info", Level::Info),
            (b"debug", Level::Debug),
        ]
        .into_iter()
        .find(|(name, _)| text.eq_ignore_ascii_case(name))
        .map(|(_, level)| level)
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Sets the process's level (at `hipObjInit`: the last init decides).
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether messages of `level` are written now.
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes `hipobj: ` and the message, if `level` is enabled; never panics.
pub fn write(level: Level, message: std::fmt::Arguments<'_>) {
    if enabled(level) {
        let _ = writeln!(std::io::stderr().lock(), "hipobj: {message}");
    }
}

/// `log!(Level::Warn, "format", args...)`: [`write`] with `format_args!`.
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        $crate::log::write($level, format_args!($($arg)*))
    };
}
pub(crate) use log;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case_and_order_by_verbosity() {
        assert_eq!(Level::parse(b"error"), Some(Level::Error));
        assert_eq!(Level::parse(b"WARN"), Some(Level::Warn));
        assert_eq!(Level::parse(b"Info"), Some(Level::Info));
        assert_eq!(Level::parse(b"debug"), Some(Level::Debug));
        for bad in [&b""[..], b"warning", b" warn", b"4", b"trace"] {
            assert_eq!(Level::parse(bad), None);
        }
        assert!(Level::Error < Level::Warn && Level::Info < Level::Debug);
    }
}
