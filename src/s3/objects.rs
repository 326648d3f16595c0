//! Objects moved by RDMA through a [`Client`], with the S3 requests of the
//! built-in client, falling back to plain HTTP where the server declines.
//!
//! - [`RdmaRequest`]: the [`S3Side`] of one GET, PUT or UploadPart that
//!   carries the token; it keeps the answer, so that a declined GET's body
//!   (the server sends the object when it declines) lands without a second
//!   request.
//! - [`get`], [`put`], [`put_part`]: one transfer of a buffer's range,
//!   with the fallback when allowed; [`Moved`] says which path carried the
//!   bytes, and the client counts fallbacks ([`Client::count_fallback`]).
//! - [`download`], [`upload`]: a whole object (or a range) in chunks on
//!   several streams, each with buffers of its own, through a sink or from
//!   a source (a file, or nothing), multipart above one chunk.
//!
//! Bytes are checked by default ([`Policy::verify`], `docs/protocol.md`,
//! *Checksums*): a PUT or part from host memory carries the CRC-64/NVME of
//! its bytes (`x-amz-checksum-crc64nvme`, which the server compares with
//! the bytes it stores; a multipart upload declares a whole-object
//! CRC-64/NVME and sends it on completion); an RDMA GET into host memory
//! asks for the server's CRC of the bytes it wrote
//! (`x-amz-checksum-mode: ENABLED`, answered with
//! `x-amz-rdma-checksum-crc64nvme`) and compares it with the bytes in the
//! buffer; a plain answer that holds the whole object is compared with the
//! checksum it carries. GPU memory is neither checked nor checksummed: the
//! client cannot read it without a copy. [`Moved::verified`] and
//! [`Summary::verified`] say what was checked.
//!
//! A server answer without `x-amz-rdma-reply` is a server without RDMA: a
//! 2xx is read as a decline (`501`), anything else as the S3 error it is.
//! Only a decline (`501`: the server does not do RDMA for this request)
//! falls back to plain HTTP; any other status of an RDMA transfer (a 500,
//! a 503 SlowDown, a 403) is an error that names it.
//!
//! An [`Object`] with an ETag is read at that version only: every GET
//! carries `If-Match`, and the ETag of every answer (RDMA ones included)
//! must be it, else [`TransferError::Changed`]. An [`Object`] with a size
//! is read at that size only: the total of every answer's `Content-Range`
//! must be it, else [`TransferError::Resized`] (a store that answers with
//! no ETag, or ignores `If-Match`, still cannot hand over another
//! version's bytes of another length). [`download`] and [`upload`]
//! retry a chunk on failures that a second try may cure (a lost
//! connection, 500, 502, 503, 504; never a 4xx), a retried RDMA transfer
//! with a fresh token; they stop when their [`Plan`]'s [`Cancel`] is set.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::checksum::{self, Checksum, Mismatch};
use super::{CompletedPart, Request, Response, S3Error, S3};
use crate::client::{Buffer, Client, ClientError, Route, S3Side};

/// The header that carries the token.
pub const TOKEN_HEADER: &str = "x-amz-rdma-token";
/// The header of the server's reply.
pub const REPLY_HEADER: &str = "x-amz-rdma-reply";
/// The header that says how many bytes the server moved by RDMA.
pub const BYTES_HEADER: &str = "x-amz-rdma-bytes-transferred";
/// The smallest part of a multipart upload but the last (S3's rule).
pub const MIN_PART: usize = 5 << 20;
/// The most parts an upload may have (S3's rule).
pub const MAX_PARTS: u64 = 10_000;

/// How one transfer's bytes moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Path {
    /// By RDMA, directly or through staging.
    Rdma(Route),
    /// Over plain HTTP, and why.
    Fallback(String),
}

/// One transfer's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// Bytes moved.
    pub bytes: u64,
    /// How.
    pub path: Path,
    /// Whether its bytes were checked.
    pub verified: Verified,
}

/// Whether a transfer's bytes were checked against a CRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// A GET's bytes matched the CRC the server sent; a PUT carried the
    /// CRC of its bytes, which the server compares with what it stores.
    Yes,
    /// Not checked, and why.
    No(Unchecked),
}

/// Why a transfer's bytes were not checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unchecked {
    /// Verification is off ([`Policy::verify`]).
    Off,
    /// The buffer is GPU memory, which the client cannot read without a
    /// copy: a GET into it is not compared, a PUT from it carries no CRC.
    Device,
    /// A plain-HTTP answer carried no checksum of its bytes (S3 sends one
    /// only with a whole object, and only if the object was stored with
    /// one).
    NoChecksum,
}

impl std::fmt::Display for Unchecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unchecked::Off => "verification is off",
            Unchecked::Device => {
                "GPU memory is not verified (the client cannot read it without a copy)"
            }
            Unchecked::NoChecksum => {
                "a plain-HTTP answer carried no checksum of its bytes (S3 sends one only with a whole object)"
            }
        })
    }
}

/// What a transfer may do besides RDMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Whether a declined transfer goes over plain HTTP.
    pub fallback: bool,
    /// Whether bytes in host memory are checked: a PUT sends their
    /// CRC-64/NVME, a GET compares them with the server's CRC and fails
    /// when they differ, or when an RDMA reply carries none (a server that
    /// does not send `x-amz-rdma-checksum-crc64nvme` needs this off).
    pub verify: bool,
}

impl Default for Policy {
    /// The fallback allowed, bytes verified.
    fn default() -> Policy {
        Policy {
            fallback: true,
            verify: true,
        }
    }
}

impl Policy {
    /// The bytes of `span` of `buf` that a transfer checks, or why none. A
    /// span outside the buffer checks no byte (the client refuses its
    /// transfer before any request).
    fn checked<'b>(&self, buf: &'b Buffer, span: Range<usize>) -> Result<&'b [u8], Unchecked> {
        if !self.verify {
            return Err(Unchecked::Off);
        }
        match buf.as_slice() {
            Some(bytes) => Ok(bytes.get(span).unwrap_or_default()),
            None => Err(Unchecked::Device),
        }
    }
}

/// A failed object transfer.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The S3 request failed.
    #[error(transparent)]
    S3(#[from] S3Error),
    /// The library failed (or a range was wrong).
    #[error(transparent)]
    Client(ClientError),
    /// The transfer needed the plain-HTTP fallback, which is off.
    #[error("{0}, and the fallback to plain HTTP is off")]
    NoFallback(String),
    /// The sink or the source (a file) failed.
    #[error("{0}")]
    Io(String),
    /// The object is no longer the version the transfer started on: an
    /// answer had another ETag, or the server refused `If-Match` (412).
    #[error("{what}: the object changed during the download (its ETag was {expected}, {})", .found.as_ref().map_or("and the server says it no longer is".to_owned(), |f| format!("now {f}")))]
    Changed {
        /// The request.
        what: String,
        /// The ETag it started with.
        expected: String,
        /// The ETag an answer had, if it said.
        found: Option<String>,
    },
    /// The bytes here are not the bytes the server says it sent: by RDMA,
    /// the data did not arrive or arrived corrupted; over HTTP, the body
    /// is not the object's.
    #[error("{what}: {}", corrupt(.header, .mismatch))]
    Corrupt {
        /// The request.
        what: String,
        /// The header whose checksum the bytes did not match.
        header: &'static str,
        /// Both checksums.
        mismatch: Mismatch,
    },
    /// Verification was asked for, and the server's RDMA reply carried no
    /// checksum of the bytes it wrote.
    #[error("{what}: the server's RDMA reply carries no {}, so the bytes it wrote cannot be verified; a server that does not send it needs verification off (the command's --no-verify, Policy::verify in the Rust API)", checksum::RDMA_CRC64NVME)]
    Unverifiable {
        /// The request.
        what: String,
    },
    /// The object is no longer the size the transfer started on: an
    /// answer's `Content-Range` gives another total.
    #[error(
        "{what}: the object changed during the download (it was {expected} bytes, now {found})"
    )]
    Resized {
        /// The request.
        what: String,
        /// The size it started with.
        expected: u64,
        /// The size the answer gave.
        found: u64,
    },
    /// The transfer was cancelled ([`Cancel::cancel`]).
    #[error("interrupted")]
    Cancelled,
}

fn corrupt(header: &str, m: &Mismatch) -> String {
    let claim = if header == checksum::RDMA_CRC64NVME {
        "the bytes in memory are not the bytes the server says it wrote by RDMA (the data did not arrive, or arrived corrupted)"
    } else {
        "the bytes received are not the bytes the server says it sent (corrupted on the way, or not the object's)"
    };
    format!(
        "{claim}: the {} of the {} bytes here is {}, the server's {header} says {}",
        m.algorithm, m.len, m.found, m.expected
    )
}

impl TransferError {
    /// Whether sending the same request again may succeed: a connection
    /// that failed or broke, or a 500, 502, 503 (SlowDown) or 504. Never a
    /// 4xx, a changed object, or a local failure.
    pub fn retryable(&self) -> bool {
        match self {
            TransferError::S3(S3Error::Transport { retry, .. }) => *retry,
            TransferError::S3(S3Error::Status { status, .. }) => {
                matches!(status, 500 | 502 | 503 | 504)
            }
            _ => false,
        }
    }
}

impl From<ClientError> for TransferError {
    fn from(e: ClientError) -> TransferError {
        TransferError::Client(e)
    }
}

/// An object of an S3 endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Object<'a> {
    /// The endpoint.
    pub s3: &'a S3,
    /// The bucket.
    pub bucket: &'a str,
    /// The key.
    pub key: &'a str,
    /// The version to read, as its ETag (quoted, as S3 sends it): GETs
    /// carry `If-Match` and their answers must have it, else
    /// [`TransferError::Changed`]. `None` reads whatever is there.
    pub etag: Option<&'a str>,
    /// The object's size at that version, if known: an answer whose
    /// `Content-Range` gives another total is of another version
    /// ([`TransferError::Resized`]). `None` checks no size.
    pub size: Option<u64>,
}

impl<'a> Object<'a> {
    /// `bucket/key` of `s3`, any version.
    pub fn new(s3: &'a S3, bucket: &'a str, key: &'a str) -> Object<'a> {
        Object {
            s3,
            bucket,
            key,
            etag: None,
            size: None,
        }
    }

    /// Whether `response` is of the version asked for: its ETag (if it has
    /// one) the one asked for, and the total of its `Content-Range` (if it
    /// has one) the size.
    fn check_version(&self, what: &str, response: &Response) -> Result<(), TransferError> {
        if let (Some(expected), Some(found)) = (self.etag, response.header("etag")) {
            if found != expected {
                return Err(TransferError::Changed {
                    what: what.to_owned(),
                    expected: expected.to_owned(),
                    found: Some(found.to_owned()),
                });
            }
        }
        let total = response.header("content-range").and_then(range_total);
        match (self.size, total) {
            (Some(expected), Some(found)) if found != expected => Err(TransferError::Resized {
                what: what.to_owned(),
                expected,
                found,
            }),
            _ => Ok(()),
        }
    }

    /// `e`, or [`TransferError::Changed`] for a 412 to a GET at a version.
    fn changed(&self, e: TransferError) -> TransferError {
        match (self.etag, e) {
            (
                Some(expected),
                TransferError::S3(S3Error::Status {
                    what, status: 412, ..
                }),
            ) => TransferError::Changed {
                what,
                expected: expected.to_owned(),
                found: None,
            },
            (_, e) => e,
        }
    }
}

/// The object's size that a `Content-Range` (`bytes FIRST-LAST/TOTAL`)
/// gives; `None` for an unknown total (`*`) or another form.
fn range_total(content_range: &str) -> Option<u64> {
    let spec = content_range.trim().strip_prefix("bytes ")?;
    let (_, total) = spec.split_once('/')?;
    total.trim().parse().ok()
}

/// What an [`RdmaRequest`] asks for.
#[derive(Clone, Debug)]
pub enum Op<'a> {
    /// GetObject of a byte range.
    Get(Range<u64>),
    /// PutObject.
    Put,
    /// UploadPart `number` of `upload_id`.
    Part {
        /// The upload.
        upload_id: &'a str,
        /// From 1.
        number: u32,
    },
}

/// The S3 side of one transfer: the request with the token, and the answer.
pub struct RdmaRequest<'a> {
    object: Object<'a>,
    op: Op<'a>,
    /// A PUT's or part's checksum of its bytes.
    checksum: Option<Checksum>,
    /// A GET's `x-amz-checksum-mode: ENABLED`.
    ask_checksum: bool,
    response: Option<Response>,
    error: Option<S3Error>,
}

impl<'a> RdmaRequest<'a> {
    /// A request of `op` on `object`.
    pub fn new(object: Object<'a>, op: Op<'a>) -> RdmaRequest<'a> {
        RdmaRequest {
            object,
            op,
            checksum: None,
            ask_checksum: false,
            response: None,
            error: None,
        }
    }

    /// A PUT or part that carries `checksum` of the bytes it stores (with
    /// a token, of the bytes the server will READ).
    pub fn with_checksum(mut self, checksum: Checksum) -> RdmaRequest<'a> {
        self.checksum = Some(checksum);
        self
    }

    /// A GET that asks for the server's checksum
    /// (`x-amz-checksum-mode: ENABLED`): by RDMA, of the bytes it wrote.
    pub fn asking_checksum(mut self) -> RdmaRequest<'a> {
        self.ask_checksum = true;
        self
    }

    /// The request, with `token` if given, and the body `body`.
    fn request(&self, token: Option<&str>, body: &'a [u8]) -> Request<'a> {
        let method = match self.op {
            Op::Get(_) => "GET",
            Op::Put | Op::Part { .. } => "PUT",
        };
        let mut request = Request::new(method, self.object.bucket, Some(self.object.key));
        match &self.op {
            Op::Get(range) => {
                request.headers.push((
                    "range",
                    format!("bytes={}-{}", range.start, range.end.saturating_sub(1)),
                ));
                if let Some(etag) = self.object.etag {
                    request.headers.push(("if-match", etag.to_owned()));
                }
                if self.ask_checksum {
                    request.headers.push((checksum::MODE, "ENABLED".to_owned()));
                }
            }
            Op::Put => {}
            Op::Part { upload_id, number } => {
                request.query.push(("partNumber", number.to_string()));
                request.query.push(("uploadId", (*upload_id).to_owned()));
            }
        }
        if let (Op::Put | Op::Part { .. }, Some(c)) = (&self.op, self.checksum) {
            request.headers.push((c.header(), c.encode()));
        }
        if let Some(token) = token {
            request.headers.push((TOKEN_HEADER, token.to_owned()));
        }
        request.body = body;
        request.sign_body = body.is_empty();
        request
    }

    /// The answer to the request, once sent.
    pub fn response(&mut self) -> Option<&mut Response> {
        self.response.as_mut()
    }

    /// The S3 error the request ended with, if it did.
    pub fn take_error(&mut self) -> Option<S3Error> {
        self.error.take()
    }
}

impl S3Side for RdmaRequest<'_> {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        let request = self.request(Some(token), &[]);
        let response = match self.object.s3.send(&request) {
            Ok(response) => response,
            Err(e) => {
                let why = e.to_string();
                self.error = Some(e);
                return Err(why);
            }
        };
        let reply = match response.header(REPLY_HEADER) {
            Some(reply) => reply.trim().to_owned(),
            None if response.is_success() => "501".to_owned(),
            None => {
                let e = response.success().expect_err("not a success");
                let why = e.to_string();
                self.error = Some(e);
                return Err(why);
            }
        };
        self.response = Some(response);
        Ok(reply)
    }
}

/// What an [`OwnedRequest`] asks for.
#[derive(Clone, Debug)]
pub enum OwnedOp {
    /// GetObject of a byte range.
    Get(Range<u64>),
    /// PutObject.
    Put,
    /// UploadPart `number` of `upload_id`.
    Part {
        /// The upload.
        upload_id: String,
        /// From 1.
        number: u32,
    },
}

/// Where an [`OwnedRequest`] leaves its answer (or its S3 error) for the
/// caller, once the transfer's ticket has ended. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct Answer(Arc<Mutex<Option<Result<Response, S3Error>>>>);

impl Answer {
    /// The answer, once: `None` before the request was sent (or after an
    /// earlier take).
    pub fn take(&self) -> Option<Result<Response, S3Error>> {
        self.0.lock().take()
    }
}

/// The S3 side of an asynchronous transfer ([`Client::submit`]): an
/// [`RdmaRequest`] that owns its endpoint and names, so that it can run on
/// the client's transfer threads, and leaves its answer in an [`Answer`].
/// Many of them over one [`S3`] (shared by `Arc`) send their requests
/// concurrently, on the agent's connection pool.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use hipobj::client::{Client, Transfer};
/// use hipobj::s3::objects::{OwnedOp, OwnedRequest};
/// use hipobj::s3::{config::S3Config, S3};
///
/// let s3 = Arc::new(S3::new(S3Config::resolve(&Default::default())?)?);
/// let client = Client::builder().build()?;
/// let mut tickets = Vec::new();
/// for key in ["shard-1", "shard-2", "shard-3"] {
///     let request = OwnedRequest::new(s3.clone(), "models", key, OwnedOp::Get(0..64 << 20))
///         .asking_checksum();
///     let answer = request.answer();
///     let buffer = client.host_buffer(64 << 20)?;
///     let ticket = client.submit(Transfer::get(buffer, 0..64 << 20, request)).ok().unwrap();
///     tickets.push((ticket, answer, key));
/// }
/// for (mut ticket, answer, key) in tickets {
///     let done = ticket.wait(None).unwrap();
///     done.result?;
///     let response = answer.take().unwrap()?;
///     let verified = hipobj::s3::objects::verify_get(key, &response, done.buffer.as_slice().unwrap())?;
///     println!("{key}: {verified:?}");
/// }
/// # Ok(())
/// # }
/// ```
pub struct OwnedRequest {
    s3: Arc<S3>,
    bucket: String,
    key: String,
    etag: Option<String>,
    op: OwnedOp,
    checksum: Option<Checksum>,
    ask_checksum: bool,
    answer: Answer,
}

impl OwnedRequest {
    /// A request of `op` on `bucket`/`key` of `s3`.
    pub fn new(s3: Arc<S3>, bucket: &str, key: &str, op: OwnedOp) -> OwnedRequest {
        OwnedRequest {
            s3,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            etag: None,
            op,
            checksum: None,
            ask_checksum: false,
            answer: Answer::default(),
        }
    }

    /// A GET of this version only (its ETag, quoted): `If-Match`.
    pub fn at_version(mut self, etag: &str) -> OwnedRequest {
        self.etag = Some(etag.to_owned());
        self
    }

    /// A PUT or part that carries `checksum` of the bytes it stores.
    pub fn with_checksum(mut self, checksum: Checksum) -> OwnedRequest {
        self.checksum = Some(checksum);
        self
    }

    /// A GET that asks for the server's checksum of the bytes it writes.
    pub fn asking_checksum(mut self) -> OwnedRequest {
        self.ask_checksum = true;
        self
    }

    /// Where the answer will be.
    pub fn answer(&self) -> Answer {
        self.answer.clone()
    }
}

impl S3Side for OwnedRequest {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        let object = Object {
            s3: &self.s3,
            bucket: &self.bucket,
            key: &self.key,
            etag: self.etag.as_deref(),
            size: None,
        };
        let op = match &self.op {
            OwnedOp::Get(range) => Op::Get(range.clone()),
            OwnedOp::Put => Op::Put,
            OwnedOp::Part { upload_id, number } => Op::Part {
                upload_id,
                number: *number,
            },
        };
        let mut request = RdmaRequest::new(object, op);
        request.checksum = self.checksum;
        request.ask_checksum = self.ask_checksum;
        let reply = request.exchange(token);
        let answer = match (request.response.take(), request.error.take()) {
            (Some(response), _) => Some(Ok(response)),
            (None, Some(error)) => Some(Err(error)),
            (None, None) => None,
        };
        *self.answer.0.lock() = answer;
        reply
    }
}

/// Checks the bytes an RDMA GET wrote into host memory (`bytes`, the
/// range asked for) against the CRC its `response` says the server wrote
/// (and the object's own, where the answer holds the whole object), as
/// [`get`] does: for transfers run by tickets with an [`OwnedRequest`]
/// that asked for the checksum.
pub fn verify_get(
    what: &str,
    response: &Response,
    bytes: &[u8],
) -> Result<Verified, TransferError> {
    verify_rdma(what, response, bytes)
}

/// The outcome of a transfer the client ran with `request` as its S3 side:
/// the RDMA route, or the decline (501) for the fallback to handle. Any
/// other status of the reply is an error naming the S3 status: the server
/// tried RDMA and failed, or refused the request.
fn settle(
    outcome: Result<Route, ClientError>,
    request: &mut RdmaRequest<'_>,
    len: u64,
) -> Result<Result<Route, u16>, TransferError> {
    match outcome {
        Ok(route) => {
            let moved = request
                .response()
                .and_then(|r| r.header(BYTES_HEADER).map(str::to_owned));
            match moved.map(|m| m.parse::<u64>()) {
                None => Ok(Ok(route)),
                Some(Ok(n)) if n == len => Ok(Ok(route)),
                Some(_) => Err(S3Error::Response {
                    what: request.request(None, &[]).what(),
                    why: format!(
                        "the server moved {} of {len} bytes",
                        request
                            .response()
                            .and_then(|r| r.header(BYTES_HEADER))
                            .unwrap_or("?")
                    ),
                }
                .into()),
            }
        }
        Err(ClientError::Declined { status: DECLINE }) => Ok(Err(DECLINE)),
        Err(ClientError::Declined { status }) => Err(failed_by_rdma(request, status)),
        Err(e) => Err(match request.take_error() {
            Some(s3) => s3.into(),
            None => e.into(),
        }),
    }
}

/// The reply status of a server that does not do RDMA for a request: the
/// only one that falls back to plain HTTP.
const DECLINE: u16 = 501;

/// The error of an RDMA transfer the server answered with `status` (not a
/// decline): its S3 code and message where the answer has them.
fn failed_by_rdma(request: &mut RdmaRequest<'_>, status: u16) -> TransferError {
    let what = format!("{} by RDMA", request.request(None, &[]).what());
    match request.response.take().map(Response::success) {
        Some(Err(S3Error::Status { code, message, .. })) => S3Error::Status {
            what,
            status,
            code,
            message,
        },
        _ => S3Error::Status {
            what,
            status,
            code: None,
            message: Some(format!("x-amz-rdma-reply {status}")),
        },
    }
    .into()
}

fn declined(status: u16) -> String {
    format!("the server declined RDMA (x-amz-rdma-reply {status})")
}

/// What one transfer reports while it runs: bytes so far (told to
/// [`Progress`] as increments, never twice for the same byte, retries
/// included), and whether to stop.
struct Tick<'a> {
    progress: Progress<'a>,
    seen: AtomicU64,
    cancel: &'a Cancel,
}

impl<'a> Tick<'a> {
    fn new(progress: Progress<'a>, cancel: &'a Cancel) -> Tick<'a> {
        Tick {
            progress,
            seen: AtomicU64::new(0),
            cancel,
        }
    }

    /// `n` bytes of the transfer have moved.
    fn upto(&self, n: u64) {
        let before = self.seen.fetch_max(n, Ordering::Relaxed);
        if n > before {
            (self.progress)(n - before);
        }
    }

    /// A body's watch: the bytes so far, or the error that stops it.
    fn watch(&self, n: u64) -> std::io::Result<()> {
        if self.cancel.is_cancelled() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "interrupted",
            ));
        }
        self.upto(n);
        Ok(())
    }
}

/// GETs `range` of `object` into `buf` from `at`, by RDMA, or (when
/// `policy.fallback`) over plain HTTP if the server declines; bytes in
/// host memory verified when `policy.verify`.
pub fn get(
    client: &Client,
    object: Object<'_>,
    range: Range<u64>,
    buf: &mut Buffer,
    at: usize,
    policy: Policy,
) -> Result<Moved, TransferError> {
    let cancel = Cancel::new();
    let tick = Tick::new(&|_| {}, &cancel);
    get_ticked(client, object, range, buf, at, policy, &tick)
}

fn get_ticked(
    client: &Client,
    object: Object<'_>,
    range: Range<u64>,
    buf: &mut Buffer,
    at: usize,
    policy: Policy,
    tick: &Tick<'_>,
) -> Result<Moved, TransferError> {
    let len = range.end.saturating_sub(range.start);
    let span = at..at + usize::try_from(len).map_err(|_| TransferError::Io("size".into()))?;
    let mut request = RdmaRequest::new(object, Op::Get(range.clone()));
    if policy.verify && buf.as_slice().is_some() {
        request = request.asking_checksum();
    }
    let what = request.request(None, &[]).what();
    let outcome = client.get(buf, span.clone(), &mut request);
    let status = match settle(outcome, &mut request, len).map_err(|e| object.changed(e))? {
        Ok(route) => {
            let mut verified = Verified::No(Unchecked::Off);
            if let Some(response) = request.response() {
                object.check_version(&what, response)?;
                verified = match policy.checked(buf, span) {
                    Ok(bytes) => verify_rdma(&what, response, bytes)?,
                    Err(why) => Verified::No(why),
                };
            }
            tick.upto(len);
            return Ok(Moved {
                bytes: len,
                path: Path::Rdma(route),
                verified,
            });
        }
        Err(status) => status,
    };
    let why = declined(status);
    if !policy.fallback {
        return Err(TransferError::NoFallback(why));
    }
    // The server that declined a GET sent the object with the decline.
    let response = match request.response.take() {
        Some(r) if r.is_success() => r,
        _ => object
            .s3
            .send(&request.request(None, &[]))?
            .success()
            .map_err(|e| object.changed(e.into()))?,
    };
    object.check_version(&what, &response)?;
    let sent = checksum::whole_object(&response);
    land(response, buf, span.clone(), tick)?;
    let verified = match policy.checked(buf, span) {
        Ok(bytes) => verify_body(&what, sent, bytes)?,
        Err(why) => Verified::No(why),
    };
    client.count_fallback(len);
    Ok(Moved {
        bytes: len,
        path: Path::Fallback(why),
        verified,
    })
}

/// Checks the bytes an RDMA GET wrote into host memory against the CRC
/// its server says it wrote (`x-amz-rdma-checksum-crc64nvme`, required),
/// and, where the answer holds the whole object, the object's own
/// checksum.
fn verify_rdma(what: &str, response: &Response, bytes: &[u8]) -> Result<Verified, TransferError> {
    let header = checksum::RDMA_CRC64NVME;
    let value = response
        .header(header)
        .ok_or_else(|| TransferError::Unverifiable {
            what: what.to_owned(),
        })?;
    let wrote = Checksum::parse(header, value).ok_or_else(|| S3Error::Response {
        what: what.to_owned(),
        why: format!("{header} {value:?} is not base64 of 8 bytes"),
    })?;
    checksum::check(wrote, bytes).map_err(|mismatch| TransferError::Corrupt {
        what: what.to_owned(),
        header,
        mismatch,
    })?;
    if let Some(stored) = checksum::whole_object(response) {
        verify_body(what, Some(stored), bytes)?;
    }
    Ok(Verified::Yes)
}

/// Checks bytes received over HTTP against the checksum their answer
/// carried, if it carried one of them all.
fn verify_body(
    what: &str,
    sent: Option<Checksum>,
    bytes: &[u8],
) -> Result<Verified, TransferError> {
    let Some(sent) = sent else {
        return Ok(Verified::No(Unchecked::NoChecksum));
    };
    checksum::check(sent, bytes).map_err(|mismatch| TransferError::Corrupt {
        what: what.to_owned(),
        header: sent.header(),
        mismatch,
    })?;
    Ok(Verified::Yes)
}

/// Reads a plain GET's body into `span` of `buf`.
fn land(
    mut response: Response,
    buf: &mut Buffer,
    span: Range<usize>,
    tick: &Tick<'_>,
) -> Result<(), TransferError> {
    let watch = |n| tick.watch(n);
    match buf.as_mut_slice() {
        Some(bytes) => response.read_body_watched(&mut bytes[span], &watch)?,
        None => {
            let mut host = vec![0u8; span.len()];
            response.read_body_watched(&mut host, &watch)?;
            buf.write_at(span.start, &host)?;
        }
    }
    Ok(())
}

/// GETs `range` of `object` over plain HTTP into `out` (its length), with
/// no library: what a fallback does, and a baseline to compare RDMA with.
/// With `verify`, an answer that carries the whole object's checksum is
/// compared with it.
pub fn get_http(
    object: Object<'_>,
    range: Range<u64>,
    out: &mut [u8],
    verify: bool,
) -> Result<Verified, TransferError> {
    let cancel = Cancel::new();
    get_plain(object, range, out, verify, &Tick::new(&|_| {}, &cancel))
}

fn get_plain(
    object: Object<'_>,
    range: Range<u64>,
    out: &mut [u8],
    verify: bool,
    tick: &Tick<'_>,
) -> Result<Verified, TransferError> {
    let mut request = RdmaRequest::new(object, Op::Get(range));
    if verify {
        request = request.asking_checksum();
    }
    let request = request.request(None, &[]);
    let mut response = object
        .s3
        .send(&request)?
        .success()
        .map_err(|e| object.changed(e.into()))?;
    object.check_version(&request.what(), &response)?;
    let sent = checksum::whole_object(&response);
    response.read_body_watched(out, &|n| tick.watch(n))?;
    if !verify {
        return Ok(Verified::No(Unchecked::Off));
    }
    verify_body(&request.what(), sent, out)
}

/// PUTs `bytes` as `object` over plain HTTP, with no library; with
/// `verify`, carrying their CRC-64/NVME.
pub fn put_http(object: Object<'_>, bytes: &[u8], verify: bool) -> Result<Verified, TransferError> {
    let cancel = Cancel::new();
    let checksum = verify.then(|| Checksum::crc64nvme(bytes));
    put_plain(
        object,
        Op::Put,
        bytes,
        checksum,
        &Tick::new(&|_| {}, &cancel),
    )?;
    Ok(sent(checksum, Unchecked::Off))
}

/// Whether a PUT that carried `checksum` (or not, because `otherwise`) was
/// verified.
fn sent(checksum: Option<Checksum>, otherwise: Unchecked) -> Verified {
    match checksum {
        Some(_) => Verified::Yes,
        None => Verified::No(otherwise),
    }
}

/// PUTs (or uploads as a part) `bytes` over plain HTTP, with `checksum` of
/// them if given: the answer's ETag.
fn put_plain(
    object: Object<'_>,
    op: Op<'_>,
    bytes: &[u8],
    checksum: Option<Checksum>,
    tick: &Tick<'_>,
) -> Result<Option<String>, TransferError> {
    let mut request = RdmaRequest::new(object, op);
    if let Some(c) = checksum {
        request = request.with_checksum(c);
    }
    let request = request.request(None, bytes);
    let response = object
        .s3
        .send_watched(&request, &|n| tick.watch(n))?
        .success()?;
    Ok(response.header("etag").map(str::to_owned))
}

/// The bytes of `span` of `buf` on the host (a copy for GPU memory).
fn host_bytes(
    buf: &Buffer,
    span: Range<usize>,
) -> Result<std::borrow::Cow<'_, [u8]>, TransferError> {
    match buf.as_slice() {
        Some(bytes) => Ok(std::borrow::Cow::Borrowed(&bytes[span])),
        None => {
            let mut host = vec![0u8; span.len()];
            buf.read_at(span.start, &mut host)?;
            Ok(std::borrow::Cow::Owned(host))
        }
    }
}

/// What one PUT or part did: its outcome, the answer's ETag, and the
/// checksum it carried.
type Stored = (Moved, Option<String>, Option<Checksum>);

/// PUTs `span` of `buf` as `object` (or as a part, `op`), by RDMA, or
/// over plain HTTP if the server declines and `policy.fallback`; from host
/// memory with the CRC-64/NVME of its bytes when `policy.verify`.
fn put_op(
    client: &Client,
    object: Object<'_>,
    op: Op<'_>,
    buf: &Buffer,
    span: Range<usize>,
    policy: Policy,
    tick: &Tick<'_>,
) -> Result<Stored, TransferError> {
    let len = span.len() as u64;
    let checked = policy.checked(buf, span.clone()).map(Checksum::crc64nvme);
    let checksum = checked.ok();
    let verified = match checked {
        Ok(_) => Verified::Yes,
        Err(why) => Verified::No(why),
    };
    let mut request = RdmaRequest::new(object, op.clone());
    if let Some(c) = checksum {
        request = request.with_checksum(c);
    }
    let outcome = client.put(buf, span.clone(), &mut request);
    let status = match settle(outcome, &mut request, len)? {
        Ok(route) => {
            let etag = request
                .response()
                .and_then(|r| r.header("etag").map(str::to_owned));
            let moved = Moved {
                bytes: len,
                path: Path::Rdma(route),
                verified,
            };
            tick.upto(len);
            return Ok((moved, etag, checksum));
        }
        Err(status) => status,
    };
    let why = declined(status);
    if !policy.fallback {
        return Err(TransferError::NoFallback(why));
    }
    let body = host_bytes(buf, span)?;
    let etag = put_plain(object, op, &body, checksum, tick)?;
    client.count_fallback(len);
    let moved = Moved {
        bytes: len,
        path: Path::Fallback(why),
        verified,
    };
    Ok((moved, etag, checksum))
}

/// PUTs `span` of `buf` as `object`.
pub fn put(
    client: &Client,
    object: Object<'_>,
    buf: &Buffer,
    span: Range<usize>,
    policy: Policy,
) -> Result<Moved, TransferError> {
    let cancel = Cancel::new();
    let tick = Tick::new(&|_| {}, &cancel);
    put_op(client, object, Op::Put, buf, span, policy, &tick).map(|(moved, _, _)| moved)
}

/// Uploads `span` of `buf` as part `number` of `upload_id`: the outcome
/// and the part as [`S3::complete_multipart_upload`] lists it (its ETag,
/// and its checksum if it carried one).
pub fn put_part(
    client: &Client,
    object: Object<'_>,
    upload_id: &str,
    number: u32,
    buf: &Buffer,
    span: Range<usize>,
    policy: Policy,
) -> Result<(Moved, CompletedPart), TransferError> {
    let op = Op::Part { upload_id, number };
    let cancel = Cancel::new();
    let tick = Tick::new(&|_| {}, &cancel);
    let (moved, etag, checksum) = put_op(client, object, op, buf, span, policy, &tick)?;
    let part = completed(object, number, etag, checksum)?;
    Ok((moved, part))
}

/// Part `number` as CompleteMultipartUpload lists it; an error if its
/// answer had no ETag.
fn completed(
    object: Object<'_>,
    number: u32,
    etag: Option<String>,
    checksum: Option<Checksum>,
) -> Result<CompletedPart, TransferError> {
    let etag = etag.ok_or_else(|| S3Error::Response {
        what: format!("PUT {}/{} part {number}", object.bucket, object.key),
        why: "no ETag in the answer".to_owned(),
    })?;
    Ok(CompletedPart {
        number,
        etag,
        checksum,
    })
}

// ---------------------------------------------------------------- retries

/// The first wait before a retry; each next one doubles, up to
/// [`MAX_BACKOFF`], and a random part of it is taken (jitter), so that
/// clients that failed together do not come back together.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait before a retry.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Runs `op`, and again, up to `retries` more times, while it fails in a
/// way a retry may cure ([`TransferError::retryable`]), after a backoff
/// with jitter; `retried` counts the retries. Stops at once when `cancel`
/// is set. Each run of `op` must be a whole request of its own (an RDMA
/// transfer with a fresh token: a token is never sent twice).
pub fn retrying<T>(
    retries: u32,
    cancel: &Cancel,
    retried: &AtomicU64,
    mut op: impl FnMut() -> Result<T, TransferError>,
) -> Result<T, TransferError> {
    let mut attempt = 0u32;
    loop {
        match op() {
            Err(_) if cancel.is_cancelled() => return Err(TransferError::Cancelled),
            Err(e) if attempt < retries && e.retryable() => {
                let ceiling = FIRST_BACKOFF
                    .saturating_mul(1u32 << attempt.min(16))
                    .min(MAX_BACKOFF);
                let half = u64::try_from(ceiling.as_millis() / 2).unwrap_or(u64::MAX);
                let jitter = getrandom::u64().unwrap_or(0) % half.saturating_add(1);
                let wait = ceiling / 2 + Duration::from_millis(jitter);
                let until = Instant::now() + wait;
                while Instant::now() < until {
                    if cancel.is_cancelled() {
                        return Err(TransferError::Cancelled);
                    }
                    std::thread::sleep(Duration::from_millis(10).min(wait));
                }
                attempt += 1;
                retried.fetch_add(1, Ordering::Relaxed);
            }
            other => return other,
        }
    }
}

/// A flag that stops [`download`] and [`upload`]: no new chunk starts, and
/// the bodies in flight over plain HTTP stop at their next read or write;
/// an upload's multipart upload is aborted. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not set.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Sets the flag (from any thread, a signal handler's included).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the flag is set.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------- whole objects

/// How [`download`] and [`upload`] run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Bytes per transfer (and per part of a multipart upload).
    pub chunk: usize,
    /// Transfers at once, each on its own thread with its own buffer.
    pub streams: usize,
    /// Buffers in GPU memory of the client's GPU (else host memory).
    pub device: bool,
    /// Whether a declined transfer goes over plain HTTP.
    pub fallback: bool,
    /// Whether bytes in host memory are verified ([`Policy::verify`]); a
    /// multipart upload from host memory then declares and sends the
    /// whole object's CRC-64/NVME.
    pub verify: bool,
    /// How many times a chunk's request is sent again after a failure a
    /// retry may cure ([`retrying`]); 0: never.
    pub retries: u32,
    /// Stops the transfer when set.
    pub cancel: Cancel,
}

impl Default for Plan {
    /// 64 MiB chunks on 4 streams in host memory, the fallback allowed,
    /// bytes verified, 3 retries.
    fn default() -> Plan {
        Plan {
            chunk: 64 << 20,
            streams: 4,
            device: false,
            fallback: true,
            verify: true,
            retries: 3,
            cancel: Cancel::new(),
        }
    }
}

impl Plan {
    /// What each transfer may do.
    pub fn policy(&self) -> Policy {
        Policy {
            fallback: self.fallback,
            verify: self.verify,
        }
    }
}

/// What a [`download`] or [`upload`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Bytes moved.
    pub bytes: u64,
    /// Transfers (chunks or parts).
    pub transfers: u64,
    /// Those by RDMA straight to or from the buffer.
    pub direct: u64,
    /// Those by RDMA through staging.
    pub staged: u64,
    /// Those over plain HTTP.
    pub fallback: u64,
    /// Why the first fallback happened.
    pub fallback_reason: Option<String>,
    /// Parts of a multipart upload (0 for a single PUT and for GETs).
    pub parts: u32,
    /// Requests sent again after a failure ([`Plan::retries`]).
    pub retries: u64,
    /// Transfers whose bytes were checked ([`Verified::Yes`]).
    pub verified: u64,
    /// Why the first transfer that was not checked was not.
    pub unverified_reason: Option<Unchecked>,
}

impl Summary {
    fn add(&mut self, moved: &Moved) {
        self.bytes += moved.bytes;
        self.transfers += 1;
        self.count_verified(moved.verified);
        match &moved.path {
            Path::Rdma(Route::Direct) => self.direct += 1,
            Path::Rdma(Route::Staged) => self.staged += 1,
            Path::Fallback(why) => {
                self.fallback += 1;
                self.fallback_reason.get_or_insert_with(|| why.clone());
            }
        }
    }

    fn count_verified(&mut self, verified: Verified) {
        match verified {
            Verified::Yes => self.verified += 1,
            Verified::No(why) => {
                self.unverified_reason.get_or_insert(why);
            }
        }
    }

    /// Whether every transfer's bytes were checked (and there was one).
    pub fn all_verified(&self) -> bool {
        self.transfers > 0 && self.verified == self.transfers
    }
}

/// Where downloaded bytes go: `(offset in the object range, bytes)`.
pub type Sink<'a> = &'a (dyn Fn(u64, &[u8]) -> std::io::Result<()> + Sync);
/// Where uploaded bytes come from: fills the slice with the bytes at the
/// offset.
pub type Source<'a> = &'a (dyn Fn(u64, &mut [u8]) -> std::io::Result<()> + Sync);
/// Told the bytes moved, as increments: as they arrive or leave over plain
/// HTTP, at its end for an RDMA transfer. Each byte is told once, however
/// often its request was retried.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Whether [`download`] and [`upload`] have the library.
#[derive(Clone, Copy, Debug)]
pub enum Rdma<'a> {
    /// Transfers go through this client (and fall back where declined).
    On(&'a Client),
    /// No client, for this reason (the library did not initialize): every
    /// transfer is a fallback, if allowed.
    Off(&'a str),
}

/// One stream's memory: a registered buffer, or plain host memory when
/// the library is not there.
enum Slot {
    Registered(Buffer),
    Plain(Vec<u8>),
}

impl Slot {
    /// The first `len` bytes on the host (a copy for GPU memory).
    fn host(&self, len: usize) -> Result<std::borrow::Cow<'_, [u8]>, TransferError> {
        match self {
            Slot::Registered(buf) => host_bytes(buf, 0..len),
            Slot::Plain(bytes) => Ok(std::borrow::Cow::Borrowed(&bytes[..len])),
        }
    }

    /// Fills the first `len` bytes from `source` at `offset`.
    fn fill(&mut self, source: Source<'_>, offset: u64, len: usize) -> Result<(), TransferError> {
        let io = |e: std::io::Error| TransferError::Io(e.to_string());
        match self {
            Slot::Plain(bytes) => source(offset, &mut bytes[..len]).map_err(io),
            Slot::Registered(buf) => match buf.as_mut_slice() {
                Some(bytes) => source(offset, &mut bytes[..len]).map_err(io),
                None => {
                    let mut host = vec![0u8; len];
                    source(offset, &mut host).map_err(io)?;
                    Ok(buf.write_at(0, &host)?)
                }
            },
        }
    }
}

/// The fallback of a transfer that never reached the library.
fn unaided(why: &str, fallback: bool) -> Result<String, TransferError> {
    let why = format!("no RDMA ({why})");
    if fallback {
        Ok(why)
    } else {
        Err(TransferError::NoFallback(why))
    }
}

/// One chunk's work: given its stream's slot, its index and its tick.
type Work<'a> = dyn Fn(&mut Slot, u64, &Tick<'_>) -> Result<Moved, TransferError> + Sync + 'a;

/// Runs `work(slot, chunk index, tick)` for the chunks of `total` bytes on
/// `plan.streams` threads, each with one slot of `plan.chunk` bytes (or
/// less), until all are done, one fails, or the plan is cancelled.
fn run_chunks(
    rdma: Rdma<'_>,
    plan: &Plan,
    total: u64,
    work: &Work<'_>,
    progress: Progress<'_>,
) -> Result<Summary, TransferError> {
    let chunk = plan.chunk.max(1) as u64;
    let count = total.div_ceil(chunk);
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let summary = Mutex::new(Summary::default());
    let first_error: Mutex<Option<TransferError>> = Mutex::new(None);
    let slot_len = usize::try_from(chunk.min(total).max(1)).unwrap_or(usize::MAX);
    let streams = plan
        .streams
        .clamp(1, usize::try_from(count.max(1)).unwrap_or(1));
    std::thread::scope(|scope| {
        for _ in 0..streams {
            scope.spawn(|| {
                let fail = |e: TransferError| {
                    failed.store(true, Ordering::Relaxed);
                    first_error.lock().get_or_insert(e);
                };
                let slot = match rdma {
                    Rdma::On(client) if plan.device => {
                        client.device_buffer(slot_len).map(Slot::Registered)
                    }
                    Rdma::On(client) => client.host_buffer(slot_len).map(Slot::Registered),
                    Rdma::Off(_) => Ok(Slot::Plain(vec![0u8; slot_len])),
                };
                let mut slot = match slot {
                    Ok(slot) => slot,
                    Err(e) => return fail(e.into()),
                };
                while !failed.load(Ordering::Relaxed) {
                    if plan.cancel.is_cancelled() {
                        return fail(TransferError::Cancelled);
                    }
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= count {
                        break;
                    }
                    let tick = Tick::new(progress, &plan.cancel);
                    match work(&mut slot, index, &tick) {
                        Ok(moved) => {
                            tick.upto(moved.bytes);
                            summary.lock().add(&moved);
                        }
                        Err(_) if plan.cancel.is_cancelled() => {
                            return fail(TransferError::Cancelled)
                        }
                        Err(e) => return fail(e),
                    }
                }
            });
        }
    });
    match first_error.into_inner() {
        Some(e) => Err(e),
        None => Ok(summary.into_inner()),
    }
}

/// The `index`th chunk of `total` bytes: its offset and length.
fn chunk_span(plan: &Plan, total: u64, index: u64) -> (u64, usize) {
    let chunk = plan.chunk.max(1) as u64;
    let offset = index * chunk;
    let len = chunk.min(total - offset);
    (offset, usize::try_from(len).unwrap_or(usize::MAX))
}

/// Checks that a plan can run: GPU buffers need the library.
fn check_plan(rdma: Rdma<'_>, plan: &Plan) -> Result<(), TransferError> {
    match rdma {
        Rdma::Off(why) if plan.device => Err(TransferError::Io(format!(
            "GPU memory needs the library, which did not initialize: {why}"
        ))),
        _ => Ok(()),
    }
}

/// Downloads `range` of `object` in chunks, handing each to `sink` (when
/// given: GPU bytes are copied to the host for it). With `object.etag`,
/// every chunk is of that version, or the download fails with
/// [`TransferError::Changed`].
pub fn download(
    rdma: Rdma<'_>,
    object: Object<'_>,
    range: Range<u64>,
    plan: &Plan,
    sink: Option<Sink<'_>>,
    progress: Progress<'_>,
) -> Result<Summary, TransferError> {
    check_plan(rdma, plan)?;
    let total = range.end.saturating_sub(range.start);
    let retried = AtomicU64::new(0);
    let work = |slot: &mut Slot, index: u64, tick: &Tick<'_>| {
        let (offset, len) = chunk_span(plan, total, index);
        let start = range.start + offset;
        let span = start..start + len as u64;
        let moved = retrying(plan.retries, &plan.cancel, &retried, || {
            match (rdma, &mut *slot) {
                (Rdma::On(client), Slot::Registered(buffer)) => {
                    get_ticked(client, object, span.clone(), buffer, 0, plan.policy(), tick)
                }
                (Rdma::Off(why), Slot::Plain(bytes)) => {
                    let why = unaided(why, plan.fallback)?;
                    let verified =
                        get_plain(object, span.clone(), &mut bytes[..len], plan.verify, tick)?;
                    Ok(Moved {
                        bytes: len as u64,
                        path: Path::Fallback(why),
                        verified,
                    })
                }
                _ => unreachable!("a client's slots are registered, and only a client's"),
            }
        })?;
        if let Some(sink) = sink {
            sink(offset, &slot.host(len)?).map_err(|e| TransferError::Io(e.to_string()))?;
        }
        Ok(moved)
    };
    let mut summary = run_chunks(rdma, plan, total, &work, progress)?;
    summary.retries = retried.into_inner();
    Ok(summary)
}

/// PUTs (or uploads as a part) the first `len` bytes of `slot`.
fn put_slot(
    rdma: Rdma<'_>,
    object: Object<'_>,
    op: Op<'_>,
    slot: &Slot,
    len: usize,
    policy: Policy,
    tick: &Tick<'_>,
) -> Result<Stored, TransferError> {
    match (rdma, slot) {
        (Rdma::On(client), Slot::Registered(buffer)) => {
            put_op(client, object, op, buffer, 0..len, policy, tick)
        }
        (Rdma::Off(why), Slot::Plain(bytes)) => {
            let why = unaided(why, policy.fallback)?;
            let bytes = &bytes[..len];
            let checksum = policy.verify.then(|| Checksum::crc64nvme(bytes));
            let etag = put_plain(object, op, bytes, checksum, tick)?;
            let moved = Moved {
                bytes: len as u64,
                path: Path::Fallback(why),
                verified: sent(checksum, Unchecked::Off),
            };
            Ok((moved, etag, checksum))
        }
        _ => unreachable!("a client's slots are registered, and only a client's"),
    }
}

/// Uploads `total` bytes from `source` as `object`: one PUT up to one
/// chunk, a multipart upload of chunk-sized parts above (aborted if any
/// part fails, or the plan is cancelled). With `plan.verify` from host
/// memory, every request carries the CRC-64/NVME of its bytes, and a
/// multipart upload declares and completes with the whole object's
/// (`FULL_OBJECT`).
pub fn upload(
    rdma: Rdma<'_>,
    object: Object<'_>,
    total: u64,
    plan: &Plan,
    source: Source<'_>,
    progress: Progress<'_>,
) -> Result<Summary, TransferError> {
    check_plan(rdma, plan)?;
    let retried = AtomicU64::new(0);
    if total == 0 {
        // RDMA moves no empty transfer: an empty object is a plain PUT.
        let tick = Tick::new(progress, &plan.cancel);
        let checksum = plan.verify.then(|| Checksum::crc64nvme(&[]));
        retrying(plan.retries, &plan.cancel, &retried, || {
            put_plain(object, Op::Put, &[], checksum, &tick)
        })?;
        let mut summary = Summary {
            transfers: 1,
            retries: retried.into_inner(),
            ..Summary::default()
        };
        summary.count_verified(sent(checksum, Unchecked::Off));
        return Ok(summary);
    }
    if total <= plan.chunk as u64 {
        let single = Plan {
            streams: 1,
            ..plan.clone()
        };
        let work = |slot: &mut Slot, _index: u64, tick: &Tick<'_>| {
            let len = usize::try_from(total).unwrap_or(usize::MAX);
            slot.fill(source, 0, len)?;
            retrying(plan.retries, &plan.cancel, &retried, || {
                put_slot(rdma, object, Op::Put, slot, len, plan.policy(), tick)
            })
            .map(|(moved, _, _)| moved)
        };
        let mut summary = run_chunks(rdma, &single, total, &work, progress)?;
        summary.retries = retried.into_inner();
        return Ok(summary);
    }
    if plan.chunk < MIN_PART {
        return Err(TransferError::Io(format!(
            "parts of a multipart upload are at least {MIN_PART} bytes, not {}",
            plan.chunk
        )));
    }
    if total.div_ceil(plan.chunk as u64) > MAX_PARTS {
        return Err(TransferError::Io(format!(
            "{total} bytes in parts of {} would be more than {MAX_PARTS} parts",
            plan.chunk
        )));
    }
    let (s3, bucket, key) = (object.s3, object.bucket, object.key);
    // GPU memory is not read for a CRC: its parts carry none, and the
    // upload declares none.
    let full_object = plan.verify && !plan.device;
    let upload_id = s3.create_multipart_upload(bucket, key, full_object)?;
    let parts = Mutex::new(Vec::new());
    let work = |slot: &mut Slot, index: u64, tick: &Tick<'_>| {
        let (offset, len) = chunk_span(plan, total, index);
        slot.fill(source, offset, len)?;
        let number = u32::try_from(index + 1).unwrap_or(u32::MAX);
        let op = Op::Part {
            upload_id: &upload_id,
            number,
        };
        let (moved, etag, checksum) = retrying(plan.retries, &plan.cancel, &retried, || {
            put_slot(rdma, object, op.clone(), slot, len, plan.policy(), tick)
        })?;
        let part = completed(object, number, etag, checksum)?;
        parts.lock().push((part, len as u64));
        Ok(moved)
    };
    let outcome = run_chunks(rdma, plan, total, &work, progress).and_then(|mut summary| {
        let mut parts = parts.lock().clone();
        parts.sort_by_key(|(part, _)| part.number);
        let whole = if full_object {
            whole_object_crc(&parts)
        } else {
            None
        };
        let parts: Vec<CompletedPart> = parts.into_iter().map(|(part, _)| part).collect();
        s3.complete_multipart_upload(bucket, key, &upload_id, &parts, whole)?;
        summary.parts = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        summary.retries = retried.load(Ordering::Relaxed);
        Ok(summary)
    });
    if outcome.is_err() {
        // Best effort: the parts already stored are the server's to drop.
        let _ = s3.abort_multipart_upload(bucket, key, &upload_id);
    }
    outcome
}

/// The CRC-64/NVME of the object that `parts` (in order, with their
/// lengths) make, from theirs; `None` if one has none.
fn whole_object_crc(parts: &[(CompletedPart, u64)]) -> Option<Checksum> {
    let mut whole: Option<u64> = None;
    for (part, len) in parts {
        let Some(Checksum::Crc64Nvme(crc)) = part.checksum else {
            return None;
        };
        whole = Some(match whole {
            None => crc,
            Some(before) => checksum::crc64nvme_combine(before, crc, *len),
        });
    }
    whole.map(Checksum::Crc64Nvme)
}
