//! The backend's log (the streamer's `RUNAI_STREAMER_LOG_*` variables) and
//! its counters: reads by RDMA, reads over plain HTTP, and why a read went
//! over HTTP.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// How much a message matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Every call's detail.
    Debug,
    /// What a user wants to know once.
    Info,
    /// Something is not as configured, and the backend carries on.
    Warning,
    /// A read or a call failed.
    Error,
}

impl Level {
    fn parse(text: &str) -> Option<Level> {
        match text.trim().to_ascii_uppercase().as_str() {
            "TRACE" | "DEBUG" | "SPAM" => Some(Level::Debug),
            "INFO" => Some(Level::Info),
            "WARN" | "WARNING" => Some(Level::Warning),
            "ERROR" | "FATAL" => Some(Level::Error),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warning => "WARNING",
            Level::Error => "ERROR",
        }
    }
}

/// Where messages go: `RUNAI_STREAMER_LOG_FILE` when set, else standard
/// error when `RUNAI_STREAMER_LOG_TO_STDERR=1`; warnings and errors go to
/// standard error in any case. `RUNAI_STREAMER_LOG_LEVEL` (default INFO)
/// sets the least level written.
struct Sink {
    level: Level,
    file: Option<Mutex<std::fs::File>>,
    stderr: bool,
}

fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| {
        let level = std::env::var("RUNAI_STREAMER_LOG_LEVEL")
            .ok()
            .and_then(|v| Level::parse(&v))
            .unwrap_or(Level::Info);
        let file = std::env::var_os("RUNAI_STREAMER_LOG_FILE").and_then(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| {
                    eprintln!(
                        "[streamers3] WARNING cannot open RUNAI_STREAMER_LOG_FILE {}: {e}",
                        path.to_string_lossy()
                    );
                })
                .ok()
                .map(Mutex::new)
        });
        let stderr = std::env::var("RUNAI_STREAMER_LOG_TO_STDERR").is_ok_and(|v| v.trim() == "1");
        Sink {
            level,
            file,
            stderr,
        }
    })
}

/// Writes `message` at `level`. Never fails: a message that cannot be
/// written is lost.
pub fn log(level: Level, message: &str) {
    let sink = sink();
    if level < sink.level {
        return;
    }
    let line = format!("[streamers3] {} {message}\n", level.name());
    if let Some(file) = &sink.file {
        if let Ok(mut file) = file.lock() {
            let _ = file.write_all(line.as_bytes());
        }
        if level < Level::Warning {
            return;
        }
    }
    if sink.stderr || level >= Level::Warning {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// The counters of the process's reads.
pub struct Stats {
    rdma_reads: AtomicU64,
    rdma_bytes: AtomicU64,
    http_reads: AtomicU64,
    http_bytes: AtomicU64,
    failed_reads: AtomicU64,
    /// Memory registered with the hipobj library when last reported (no
    /// read runs then, so anything but 0 is a registration left behind);
    /// `u64::MAX` while the library is not in use.
    registered: AtomicU64,
    /// Why reads went over HTTP: each reason and its count.
    reasons: Mutex<BTreeMap<String, u64>>,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            rdma_reads: AtomicU64::new(0),
            rdma_bytes: AtomicU64::new(0),
            http_reads: AtomicU64::new(0),
            http_bytes: AtomicU64::new(0),
            failed_reads: AtomicU64::new(0),
            registered: AtomicU64::new(u64::MAX),
            reasons: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Stats {
    /// The library has `n` buffers registered (at a report).
    pub fn registered(&self, n: u64) {
        self.registered.store(n, Ordering::Relaxed);
    }

    /// A read of `bytes` landed by RDMA.
    pub fn rdma(&self, bytes: u64) {
        self.rdma_reads.fetch_add(1, Ordering::Relaxed);
        self.rdma_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A read of `bytes` landed over plain HTTP.
    pub fn http(&self, bytes: u64) {
        self.http_reads.fetch_add(1, Ordering::Relaxed);
        self.http_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A read was delivered with an error code.
    pub fn failed(&self) {
        self.failed_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// A read goes over HTTP because of `reason`; the first time a reason
    /// is seen it is logged.
    pub fn fell_back(&self, reason: &str) {
        let Ok(mut reasons) = self.reasons.lock() else {
            return;
        };
        let count = reasons.entry(reason.to_owned()).or_insert(0);
        *count += 1;
        if *count == 1 {
            drop(reasons);
            log(Level::Info, &format!("reads go over plain HTTP: {reason}"));
        }
    }

    /// The counters as JSON.
    pub fn json(&self) -> serde_json::Value {
        let reasons = self.reasons.lock().map(|r| r.clone()).unwrap_or_default();
        let registered = match self.registered.load(Ordering::Relaxed) {
            u64::MAX => serde_json::Value::Null,
            n => n.into(),
        };
        serde_json::json!({
            "rdma_reads": self.rdma_reads.load(Ordering::Relaxed),
            "rdma_bytes": self.rdma_bytes.load(Ordering::Relaxed),
            "http_reads": self.http_reads.load(Ordering::Relaxed),
            "http_bytes": self.http_bytes.load(Ordering::Relaxed),
            "failed_reads": self.failed_reads.load(Ordering::Relaxed),
            "fallback_reasons": reasons,
            "registered_buffers": registered,
        })
    }

    /// Logs the counters, and writes them to `HIPOBJ_STREAMER_STATS` (a
    /// file name) when it is set.
    pub fn report(&self) {
        let json = self.json();
        log(Level::Info, &format!("reads so far: {json}"));
        if let Some(path) = std::env::var_os("HIPOBJ_STREAMER_STATS") {
            if let Err(e) = std::fs::write(&path, format!("{json}\n")) {
                log(
                    Level::Warning,
                    &format!(
                        "cannot write HIPOBJ_STREAMER_STATS {}: {e}",
                        path.to_string_lossy()
                    ),
                );
            }
        }
    }
}
