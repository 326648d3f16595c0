//! The pure parts: object URIs, the in-flight window, the settings read
//! from the environment, and how a read's failure becomes a response code.
//! Nothing here touches the network or a raw pointer.

#![forbid(unsafe_code)]

use std::time::Duration;

use hipobj::s3::objects::TransferError;
use hipobj::s3::S3Error;

/// The streamer's response codes this backend returns (the outer's
/// `ResponseCode_t`, frozen).
pub mod code {
    /// The call or the read succeeded.
    pub const SUCCESS: i32 = 0;
    /// No more responses: a stopped or idle client's wait.
    pub const FINISHED: i32 = 1;
    /// A storage error that retrying does not cure (403, 404, other 4xx).
    pub const FILE_ACCESS: i32 = 2;
    /// NULL arguments of a listing.
    pub const INVALID_PARAMETER: i32 = 7;
    /// `AWS_CA_BUNDLE` names a file that does not exist.
    pub const CA_FILE_NOT_FOUND: i32 = 10;
    /// An internal failure, or NULL arguments of a read or a wait.
    pub const UNKNOWN: i32 = 11;
    /// The object has fewer (or more) bytes than the range asked for.
    pub const FILE_TRUNCATED: i32 = 15;
    /// A transient storage error (transport, 5xx, 408, 429): 0.17 and later.
    pub const RETRYABLE_FILE_ACCESS: i32 = 19;
}

/// The streamer's default chunk, and the smallest it sends.
pub const DEFAULT_CHUNK: u64 = 8 << 20;
const MIN_CHUNK: u64 = 5 << 20;

/// `s3://bucket/key` split: the bucket is the text after the scheme up to
/// the first `/`, the key all the rest (it may hold `/`, it may be empty
/// for a listing's prefix).
pub fn parse_uri(uri: &str) -> Result<(&str, &str), String> {
    let rest = uri
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{uri:?} is not an s3:// URI"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{uri:?} names no bucket"));
    }
    Ok((bucket, key))
}

/// The backend's in-flight byte budget per client: `max_inflight_mib`
/// MiB when set, else `target_gbps` for 0.1 s times `margin`, in bytes,
/// and never less than two chunks.
pub fn window(chunk: u64, max_inflight_mib: Option<u64>, target_gbps: f64, margin: f64) -> u64 {
    if let Some(mib) = max_inflight_mib {
        return mib.saturating_mul(1 << 20).max(1);
    }
    let bytes = whole((target_gbps * 1e9 * 0.1 * margin / 8.0).round());
    bytes.max(chunk.max(MIN_CHUNK).saturating_mul(2))
}

/// The whole part of `n`, 0 for a negative or NaN `n`, `u64::MAX` past it.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the cast saturates: Rust's float-to-integer `as` clamps into the target's range and maps NaN to 0, which is the meaning wanted"
)]
fn whole(n: f64) -> u64 {
    n.floor() as u64
}

/// How one read's failure reaches the streamer: the code of its event.
/// `retryable` is the outer's code for a transient failure (19 from 0.17
/// on, 2 before).
pub fn failure_code(e: &TransferError, retryable: i32) -> i32 {
    match e {
        TransferError::S3(s3) => s3_code(s3, retryable),
        TransferError::Corrupt { .. } => retryable,
        TransferError::Resized { .. } => code::FILE_TRUNCATED,
        _ => code::FILE_ACCESS,
    }
}

/// [`failure_code`] of an S3 request's failure.
pub fn s3_code(e: &S3Error, retryable: i32) -> i32 {
    match e {
        S3Error::Status { status, .. } => status_code(*status, retryable),
        S3Error::Transport { .. } => retryable,
        S3Error::Response { .. } | S3Error::Config(_) => code::FILE_ACCESS,
    }
}

/// The code of an HTTP status that is not a success: a range past the
/// object's end (416) is a truncated file; 408, 429 and 5xx are
/// transient; any other status is a storage error.
pub fn status_code(status: u16, retryable: i32) -> i32 {
    match status {
        416 => code::FILE_TRUNCATED,
        408 | 429 | 500..=599 => retryable,
        _ => code::FILE_ACCESS,
    }
}

/// The backend's settings from the environment (the stock backend's
/// variables, and two of hipobj's own).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING` (default 1).
    pub virtual_hosted: bool,
    /// `RUNAI_STREAMER_S3_UNSIGNED` (default 0).
    pub unsigned: bool,
    /// `RUNAI_STREAMER_S3_MAX_INFLIGHT_MIB`.
    pub max_inflight_mib: Option<u64>,
    /// `RUNAI_STREAMER_S3_TARGET_GBPS` (default 10).
    pub target_gbps: f64,
    /// `RUNAI_STREAMER_INFLIGHT_WINDOW_MARGIN` (default 1.5).
    pub margin: f64,
    /// `RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS` (default 600 s).
    pub timeout: Duration,
    /// `RUNAI_STREAMER_S3_MAX_RETRIES`: how often a transient failure is
    /// sent again before its code is delivered (default 0: the outer's
    /// own retries, `RUNAI_STREAMER_S3_TIMEOUT`, are the place for them).
    pub retries: u32,
    /// `AWS_CA_BUNDLE`.
    pub ca_bundle: Option<String>,
    /// `HIPOBJ_STREAMER_READERS`: threads per client that send its reads
    /// (default 8).
    pub readers: usize,
    /// `HIPOBJ_STREAMER_RDMA` (default 1): 0 sends every read over plain
    /// HTTP without trying the library.
    pub rdma: bool,
}

/// The 600 s of a request when nothing says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

impl Settings {
    /// The settings `var` gives (the process environment in use); a value
    /// that does not parse is reported in `warnings` and the default kept.
    pub fn from_vars(var: &dyn Fn(&str) -> Option<String>, warnings: &mut Vec<String>) -> Settings {
        let mut number = |name: &str, default: f64| -> f64 {
            match var(name) {
                None => default,
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(n) if n.is_finite() && n >= 0.0 => n,
                    _ => {
                        warnings.push(format!("{name}={v:?} is not a number: {default} used"));
                        default
                    }
                },
            }
        };
        let target_gbps = number("RUNAI_STREAMER_S3_TARGET_GBPS", 10.0);
        let margin = number("RUNAI_STREAMER_INFLIGHT_WINDOW_MARGIN", 1.5);
        let timeout_ms = number(
            "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS",
            DEFAULT_TIMEOUT.as_secs_f64() * 1e3,
        );
        let retries = number("RUNAI_STREAMER_S3_MAX_RETRIES", 0.0);
        let readers = number("HIPOBJ_STREAMER_READERS", 8.0);
        let max_inflight_mib = var("RUNAI_STREAMER_S3_MAX_INFLIGHT_MIB")
            .map(|_| number("RUNAI_STREAMER_S3_MAX_INFLIGHT_MIB", 0.0))
            .filter(|&n| n >= 1.0);
        let flag = |name: &str, default: bool| match var(name).as_deref().map(str::trim) {
            None | Some("") => default,
            Some(v) => !matches!(v, "0" | "false" | "False" | "FALSE" | "no" | "off"),
        };
        Settings {
            virtual_hosted: flag("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", true),
            unsigned: flag("RUNAI_STREAMER_S3_UNSIGNED", false),
            max_inflight_mib: max_inflight_mib.map(whole),
            target_gbps,
            margin,
            timeout: Duration::from_millis(whole(timeout_ms).max(1)),
            retries: u32::try_from(whole(retries)).unwrap_or(u32::MAX),
            ca_bundle: var("AWS_CA_BUNDLE").filter(|v| !v.is_empty()),
            readers: usize::try_from(whole(readers)).unwrap_or(64).clamp(1, 64),
            rdma: flag("HIPOBJ_STREAMER_RDMA", true),
        }
    }

    /// The chunk a client's config gives: the default for 0, and never
    /// less than the streamer's 5 MiB.
    pub fn chunk(configured: u64) -> u64 {
        if configured == 0 {
            DEFAULT_CHUNK
        } else {
            configured.max(MIN_CHUNK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_split_at_the_first_slash_after_the_bucket() {
        assert_eq!(
            parse_uri("s3://bkt/a/b.safetensors"),
            Ok(("bkt", "a/b.safetensors"))
        );
        assert_eq!(parse_uri("s3://bkt/model/"), Ok(("bkt", "model/")));
        assert_eq!(parse_uri("s3://bkt"), Ok(("bkt", "")));
        assert_eq!(parse_uri("s3://bkt/"), Ok(("bkt", "")));
        assert!(parse_uri("gs://bkt/a").is_err());
        assert!(parse_uri("s3:///a").is_err());
        assert!(parse_uri("bkt/a").is_err());
    }

    #[test]
    fn the_window_is_a_tenth_of_a_second_at_the_target_rate_with_margin() {
        // The stock backend's default: 10 Gbps, 1.5.
        assert_eq!(window(DEFAULT_CHUNK, None, 10.0, 1.5), 187_500_000);
        assert_eq!(window(DEFAULT_CHUNK, Some(64), 10.0, 1.5), 64 << 20);
        // Never less than two chunks.
        assert_eq!(window(DEFAULT_CHUNK, None, 0.1, 1.0), 2 * DEFAULT_CHUNK);
        assert_eq!(window(DEFAULT_CHUNK, None, 0.0, 0.0), 2 * DEFAULT_CHUNK);
    }

    #[test]
    fn chunks_below_five_mib_are_raised() {
        assert_eq!(Settings::chunk(0), DEFAULT_CHUNK);
        assert_eq!(Settings::chunk(1 << 20), 5 << 20);
        assert_eq!(Settings::chunk(16 << 20), 16 << 20);
    }

    #[test]
    fn statuses_map_to_the_streamers_codes() {
        for (status, want) in [
            (403, code::FILE_ACCESS),
            (404, code::FILE_ACCESS),
            (400, code::FILE_ACCESS),
            (416, code::FILE_TRUNCATED),
            (408, code::RETRYABLE_FILE_ACCESS),
            (429, code::RETRYABLE_FILE_ACCESS),
            (500, code::RETRYABLE_FILE_ACCESS),
            (503, code::RETRYABLE_FILE_ACCESS),
        ] {
            assert_eq!(
                status_code(status, code::RETRYABLE_FILE_ACCESS),
                want,
                "{status}"
            );
        }
        // An outer before 0.17 knows no 19: transient failures are 2.
        assert_eq!(status_code(503, code::FILE_ACCESS), code::FILE_ACCESS);
        let transport = S3Error::Transport {
            what: "GET b/k".into(),
            error: "connection refused".into(),
            retry: true,
        };
        assert_eq!(
            failure_code(&transport.into(), code::RETRYABLE_FILE_ACCESS),
            code::RETRYABLE_FILE_ACCESS
        );
        let cancelled = TransferError::Cancelled;
        assert_eq!(failure_code(&cancelled, 19), code::FILE_ACCESS);
    }

    #[test]
    fn settings_read_the_stock_variables() {
        let vars = [
            ("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0"),
            ("RUNAI_STREAMER_S3_UNSIGNED", "1"),
            ("RUNAI_STREAMER_S3_MAX_INFLIGHT_MIB", "32"),
            ("RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS", "2500"),
            ("RUNAI_STREAMER_S3_TARGET_GBPS", "fast"),
        ];
        let var = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let mut warnings = Vec::new();
        let s = Settings::from_vars(&var, &mut warnings);
        assert!(!s.virtual_hosted);
        assert!(s.unsigned);
        assert_eq!(s.max_inflight_mib, Some(32));
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!(s.target_gbps, 10.0);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let s = Settings::from_vars(&|_| None, &mut Vec::new());
        assert!(s.virtual_hosted, "virtual-hosted addressing by default");
        assert!(!s.unsigned);
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.max_inflight_mib, None);
    }
}
