//! The summary a copy prints when it ends, of one object or of many: a
//! line on standard error (and the library's counters, or why there was no
//! RDMA), or JSON.

use hipobj::client::{Client, ClientStats};
use hipobj::s3::objects::{Summary, Unchecked};

use crate::units::{human, mib_per_s, rate};
use crate::Transfer;

/// The counters' `name=value` pairs as a JSON object.
fn counters_json(stats: &ClientStats) -> serde_json::Value {
    let text = stats.to_string();
    let map = text
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| {
            (
                k.to_owned(),
                serde_json::Value::from(v.parse::<u64>().unwrap_or(0)),
            )
        })
        .collect();
    serde_json::Value::Object(map)
}

/// How the transfers went, in words.
fn paths(summary: &Summary) -> String {
    let rdma = summary.direct + summary.staged;
    let mut parts = Vec::new();
    if rdma > 0 {
        parts.push(format!(
            "by RDMA {rdma} of {} transfers (direct {}, staged {})",
            summary.transfers, summary.direct, summary.staged
        ));
    }
    if summary.fallback > 0 {
        parts.push(format!(
            "over plain HTTP {} of {} transfers: {}",
            summary.fallback,
            summary.transfers,
            summary.fallback_reason.as_deref().unwrap_or("declined")
        ));
    }
    if parts.is_empty() {
        parts.push("an empty object, by a plain request".to_owned());
    }
    match summary.retries {
        0 => {}
        1 => parts.push("1 request retried".to_owned()),
        n => parts.push(format!("{n} requests retried")),
    }
    parts.join("; ")
}

/// Whether every transfer's bytes were checked, and what was (or why
/// not), in words.
fn verification(summary: &Summary, put: bool) -> (bool, String) {
    let how = if put {
        "CRC-64/NVME sent with the bytes, for the server to check"
    } else {
        "CRC-64/NVME of the bytes that arrived compared with the server's"
    };
    let why = match summary.unverified_reason {
        Some(Unchecked::Off) => "--no-verify".to_owned(),
        Some(why) => why.to_string(),
        None => String::new(),
    };
    if summary.all_verified() {
        (true, format!("verified ({how})"))
    } else if summary.verified > 0 {
        (
            false,
            format!(
                "verified {} of {} transfers ({how}); not the others: {why}",
                summary.verified, summary.transfers
            ),
        )
    } else {
        (false, format!("not verified: {why}"))
    }
}

/// A copy of many objects (`--recursive`): the objects that ended, those
/// planned, and how many ran at a time.
pub(crate) struct Many {
    pub(crate) objects: u64,
    pub(crate) planned: usize,
    pub(crate) jobs: usize,
}

/// What a copy did, as its summary tells it.
pub(crate) struct Report<'a> {
    /// `get SOURCE -> DESTINATION`, `put SOURCE -> DESTINATION`.
    pub(crate) what: &'a str,
    /// Its transfers, all of them.
    pub(crate) summary: &'a Summary,
    pub(crate) seconds: f64,
    /// The library, or why transfers went without it.
    pub(crate) library: &'a Result<Client, String>,
    /// An upload (its bytes were checked by the server) or a download.
    pub(crate) put: bool,
    /// A copy of many objects; `None` for one.
    pub(crate) many: Option<Many>,
}

impl Report<'_> {
    /// Prints it: JSON on standard output (on standard error where the
    /// object itself went to standard output), else a line on standard
    /// error and the library's counters, or why there was no RDMA where
    /// the line did not say it.
    pub(crate) fn print(&self, transfer: &Transfer, stdout_taken: bool) {
        let Report {
            what,
            summary,
            seconds,
            library,
            put,
            ref many,
        } = *self;
        let (verified, verification) = verification(summary, put);
        if transfer.json {
            let mut value = serde_json::json!({
                "operation": what,
                "bytes": summary.bytes,
                "seconds": seconds,
                "mib_per_s": mib_per_s(summary.bytes, seconds),
                "transfers": summary.transfers,
                "rdma_direct": summary.direct,
                "rdma_staged": summary.staged,
                "fallback": summary.fallback,
                "fallback_reason": summary.fallback_reason,
                "parts": summary.parts,
                "retries": summary.retries,
                "verified": verified,
                "verification": verification,
                "library": library.as_ref().err(),
                "counters": library.as_ref().ok().map(|c| counters_json(&c.stats())),
            });
            if let (Some(many), Some(fields)) = (many, value.as_object_mut()) {
                fields.insert("objects".into(), many.objects.into());
                fields.insert("objects_planned".into(), many.planned.into());
                fields.insert("jobs".into(), many.jobs.into());
            }
            if stdout_taken {
                eprintln!("{value}");
            } else {
                println!("{value}");
            }
            return;
        }
        let (objects, after) = match many {
            Some(many) => (
                format!("{} objects, ", many.objects),
                format!(", {} at a time", many.jobs),
            ),
            None if summary.parts > 0 => (
                String::new(),
                format!(", multipart in {} parts", summary.parts),
            ),
            None => (String::new(), String::new()),
        };
        eprintln!(
            "hipobj: {what}: {objects}{} in {seconds:.2} s ({}){after}; {}; {verification}",
            human(summary.bytes),
            rate(summary.bytes, seconds),
            paths(summary)
        );
        match library {
            Ok(client) => eprintln!("hipobj: counters: {}", client.stats()),
            // The summary gave the reason with the fallback.
            Err(_) if summary.fallback > 0 => {}
            Err(why) => eprintln!("hipobj: no RDMA: {why}"),
        }
    }
}
