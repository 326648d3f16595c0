//! Ctrl-C (SIGINT) and SIGTERM during a transfer.
//!
//! A thread of its own waits for the signals (`signal-hook`'s iterator: no
//! code of ours runs in the handler). At the first one:
//!
//! - a download's hidden temporary files (one per object in flight) are
//!   removed at once, and the command exits: nothing else is left to
//!   clean;
//! - an upload is cancelled instead ([`Cancel`]): no new part starts, the
//!   bodies in flight stop at their next write, and the transfer aborts its
//!   multipart upload before the command exits. A second signal, or
//!   [`GRACE`] without an end, exits at once.
//!
//! The exit status is 128 plus the signal's number, as a shell's: 130 for
//! SIGINT, 143 for SIGTERM.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use hipobj::s3::objects::Cancel;

/// How long an interrupted upload may take to abort before the command
/// exits anyway.
const GRACE: Duration = Duration::from_secs(20);

/// The signal that came, or 0.
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Whether the transfer must be let to clean up (an upload) rather than
/// the command exiting at the signal.
static GRACEFUL: AtomicBool = AtomicBool::new(false);
/// The temporary files of the downloads in progress.
static PARTIAL: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// The flag the transfer watches.
static CANCEL: OnceLock<Cancel> = OnceLock::new();

/// Starts watching for SIGINT and SIGTERM.
pub fn install() -> Result<(), String> {
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).map_err(|e| format!("cannot watch for Ctrl-C: {e}"))?;
    std::thread::spawn(move || {
        for signal in signals.forever() {
            let first = SIGNAL.swap(signal, Ordering::SeqCst) == 0;
            remove_partial();
            if !first || !GRACEFUL.load(Ordering::SeqCst) {
                std::process::exit(128 + signal);
            }
            eprintln!(
                "\nhipobj: interrupted: stopping the transfer and aborting the upload (again to quit at once)"
            );
            cancel().cancel();
            std::thread::spawn(move || {
                std::thread::sleep(GRACE);
                eprintln!("hipobj: the upload did not stop in {GRACE:?}: quitting");
                std::process::exit(128 + signal);
            });
        }
    });
    Ok(())
}

/// The flag a transfer watches: set at the first signal of an upload.
pub fn cancel() -> Cancel {
    CANCEL.get_or_init(Cancel::new).clone()
}

/// An upload is running: a signal cancels it and lets it abort.
pub fn graceful() {
    GRACEFUL.store(true, Ordering::SeqCst);
}

/// `path` is a download's temporary file until [`forget_partial`].
pub fn partial(path: PathBuf) {
    PARTIAL.lock().push(path);
}

/// The temporary file at `path` is gone or kept.
pub fn forget_partial(path: &std::path::Path) {
    PARTIAL.lock().retain(|p| p != path);
}

fn remove_partial() {
    for path in std::mem::take(&mut *PARTIAL.lock()) {
        let _ = std::fs::remove_file(path);
    }
}

/// The exit status of the signal that came, if one did.
pub fn exit_status() -> Option<u8> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        n => u8::try_from(128 + n).ok(),
    }
}
