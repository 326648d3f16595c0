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
//! A server answer without `x-amz-rdma-reply` is a server without RDMA: a
//! 2xx is read as a decline (`501`), anything else as the S3 error it is.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Request, Response, S3Error, S3};
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
    response: Option<Response>,
    error: Option<S3Error>,
}

impl<'a> RdmaRequest<'a> {
    /// A request of `op` on `object`.
    pub fn new(object: Object<'a>, op: Op<'a>) -> RdmaRequest<'a> {
        RdmaRequest {
            object,
            op,
            response: None,
            error: None,
        }
    }

    /// The request, with `token` if given, and the body `body`.
    fn request(&self, token: Option<&str>, body: &'a [u8]) -> Request<'a> {
        let method = match self.op {
            Op::Get(_) => "GET",
            Op::Put | Op::Part { .. } => "PUT",
        };
        let mut request = Request::new(method, self.object.bucket, Some(self.object.key));
        match &self.op {
            Op::Get(range) => request.headers.push((
                "range",
                format!("bytes={}-{}", range.start, range.end.saturating_sub(1)),
            )),
            Op::Put => {}
            Op::Part { upload_id, number } => {
                request.query.push(("partNumber", number.to_string()));
                request.query.push(("uploadId", (*upload_id).to_owned()));
            }
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

/// The outcome of a transfer the client ran with `request` as its S3 side:
/// the RDMA route, or the declined status for the fallback to handle.
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
        Err(ClientError::Declined { status }) => Ok(Err(status)),
        Err(e) => Err(match request.take_error() {
            Some(s3) => s3.into(),
            None => e.into(),
        }),
    }
}

fn declined(status: u16) -> String {
    format!("the server declined RDMA (x-amz-rdma-reply {status})")
}

/// GETs `range` of `object` into `buf` from `at`, by RDMA, or (when
/// `fallback`) over plain HTTP if the server declines.
pub fn get(
    client: &Client,
    object: Object<'_>,
    range: Range<u64>,
    buf: &mut Buffer,
    at: usize,
    fallback: bool,
) -> Result<Moved, TransferError> {
    let len = range.end.saturating_sub(range.start);
    let span = at..at + usize::try_from(len).map_err(|_| TransferError::Io("size".into()))?;
    let mut request = RdmaRequest::new(object, Op::Get(range.clone()));
    let outcome = client.get(buf, span.clone(), &mut request);
    let status = match settle(outcome, &mut request, len)? {
        Ok(route) => {
            return Ok(Moved {
                bytes: len,
                path: Path::Rdma(route),
            })
        }
        Err(status) => status,
    };
    let why = declined(status);
    if !fallback {
        return Err(TransferError::NoFallback(why));
    }
    // The server that declined a GET sent the object with the decline.
    let response = match request.response.take() {
        Some(r) if r.is_success() => r,
        _ => object.s3.send(&request.request(None, &[]))?.success()?,
    };
    land(response, buf, span)?;
    client.count_fallback(len);
    Ok(Moved {
        bytes: len,
        path: Path::Fallback(why),
    })
}

/// Reads a plain GET's body into `span` of `buf`.
fn land(mut response: Response, buf: &mut Buffer, span: Range<usize>) -> Result<(), TransferError> {
    match buf.as_mut_slice() {
        Some(bytes) => response.read_body_into(&mut bytes[span])?,
        None => {
            let mut host = vec![0u8; span.len()];
            response.read_body_into(&mut host)?;
            buf.write_at(span.start, &host)?;
        }
    }
    Ok(())
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

/// PUTs `span` of `buf` as `object` (or as a part, `op`), by RDMA, or
/// over plain HTTP if the server declines and `fallback`; the answer's
/// ETag with the outcome.
fn put_op(
    client: &Client,
    object: Object<'_>,
    op: Op<'_>,
    buf: &Buffer,
    span: Range<usize>,
    fallback: bool,
) -> Result<(Moved, Option<String>), TransferError> {
    let len = span.len() as u64;
    let mut request = RdmaRequest::new(object, op);
    let outcome = client.put(buf, span.clone(), &mut request);
    let status = match settle(outcome, &mut request, len)? {
        Ok(route) => {
            let etag = request
                .response()
                .and_then(|r| r.header("etag").map(str::to_owned));
            let moved = Moved {
                bytes: len,
                path: Path::Rdma(route),
            };
            return Ok((moved, etag));
        }
        Err(status) => status,
    };
    let why = declined(status);
    if !fallback {
        return Err(TransferError::NoFallback(why));
    }
    let body = host_bytes(buf, span)?;
    let response = object.s3.send(&request.request(None, &body))?.success()?;
    client.count_fallback(len);
    Ok((
        Moved {
            bytes: len,
            path: Path::Fallback(why),
        },
        response.header("etag").map(str::to_owned),
    ))
}

/// PUTs `span` of `buf` as `object`.
pub fn put(
    client: &Client,
    object: Object<'_>,
    buf: &Buffer,
    span: Range<usize>,
    fallback: bool,
) -> Result<Moved, TransferError> {
    put_op(client, object, Op::Put, buf, span, fallback).map(|(moved, _)| moved)
}

/// Uploads `span` of `buf` as part `number` of `upload_id`: the outcome
/// and the part's ETag.
pub fn put_part(
    client: &Client,
    object: Object<'_>,
    upload_id: &str,
    number: u32,
    buf: &Buffer,
    span: Range<usize>,
    fallback: bool,
) -> Result<(Moved, String), TransferError> {
    let op = Op::Part { upload_id, number };
    let (moved, etag) = put_op(client, object, op, buf, span, fallback)?;
    let etag = etag.ok_or_else(|| S3Error::Response {
        what: format!("PUT {}/{} part {number}", object.bucket, object.key),
        why: "no ETag in the answer".to_owned(),
    })?;
    Ok((moved, etag))
}

// ---------------------------------------------------------------- whole objects

/// How [`download`] and [`upload`] run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Bytes per transfer (and per part of a multipart upload).
    pub chunk: usize,
    /// Transfers at once, each on its own thread with its own buffer.
    pub streams: usize,
    /// Buffers in GPU memory of the client's GPU (else host memory).
    pub device: bool,
    /// Whether a declined transfer goes over plain HTTP.
    pub fallback: bool,
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
}

impl Summary {
    fn add(&mut self, moved: &Moved) {
        self.bytes += moved.bytes;
        self.transfers += 1;
        match &moved.path {
            Path::Rdma(Route::Direct) => self.direct += 1,
            Path::Rdma(Route::Staged) => self.staged += 1,
            Path::Fallback(why) => {
                self.fallback += 1;
                self.fallback_reason.get_or_insert_with(|| why.clone());
            }
        }
    }
}

/// Where downloaded bytes go: `(offset in the object range, bytes)`.
pub type Sink<'a> = &'a (dyn Fn(u64, &[u8]) -> std::io::Result<()> + Sync);
/// Where uploaded bytes come from: fills the slice with the bytes at the
/// offset.
pub type Source<'a> = &'a (dyn Fn(u64, &mut [u8]) -> std::io::Result<()> + Sync);
/// Told the bytes of each transfer as it ends.
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

/// Runs `work(slot, chunk index)` for the chunks of `total` bytes on
/// `plan.streams` threads, each with one slot of `plan.chunk` bytes (or
/// less), until all are done or one fails.
fn run_chunks(
    rdma: Rdma<'_>,
    plan: &Plan,
    total: u64,
    work: &(dyn Fn(&mut Slot, u64) -> Result<Moved, TransferError> + Sync),
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
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= count {
                        break;
                    }
                    match work(&mut slot, index) {
                        Ok(moved) => {
                            progress(moved.bytes);
                            summary.lock().add(&moved);
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
/// given: GPU bytes are copied to the host for it).
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
    let work = |slot: &mut Slot, index: u64| {
        let (offset, len) = chunk_span(plan, total, index);
        let start = range.start + offset;
        let span = start..start + len as u64;
        let moved = match (rdma, &mut *slot) {
            (Rdma::On(client), Slot::Registered(buffer)) => {
                get(client, object, span, buffer, 0, plan.fallback)?
            }
            (_, slot) => {
                let why = match rdma {
                    Rdma::Off(why) => unaided(why, plan.fallback)?,
                    Rdma::On(_) => unreachable!("a client's slots are registered"),
                };
                let Slot::Plain(bytes) = slot else {
                    unreachable!("no client, plain slots")
                };
                let request = RdmaRequest::new(object, Op::Get(span)).request(None, &[]);
                let mut response = object.s3.send(&request)?.success()?;
                response.read_body_into(&mut bytes[..len])?;
                Moved {
                    bytes: len as u64,
                    path: Path::Fallback(why),
                }
            }
        };
        if let Some(sink) = sink {
            sink(offset, &slot.host(len)?).map_err(|e| TransferError::Io(e.to_string()))?;
        }
        Ok(moved)
    };
    run_chunks(rdma, plan, total, &work, progress)
}

/// PUTs (or uploads as a part) the first `len` bytes of `slot`.
fn put_slot(
    rdma: Rdma<'_>,
    object: Object<'_>,
    op: Op<'_>,
    slot: &Slot,
    len: usize,
    fallback: bool,
) -> Result<(Moved, Option<String>), TransferError> {
    match (rdma, slot) {
        (Rdma::On(client), Slot::Registered(buffer)) => {
            put_op(client, object, op, buffer, 0..len, fallback)
        }
        (Rdma::Off(why), Slot::Plain(bytes)) => {
            let why = unaided(why, fallback)?;
            let request = RdmaRequest::new(object, op).request(None, &bytes[..len]);
            let response = object.s3.send(&request)?.success()?;
            let moved = Moved {
                bytes: len as u64,
                path: Path::Fallback(why),
            };
            Ok((moved, response.header("etag").map(str::to_owned)))
        }
        _ => unreachable!("a client's slots are registered, and only a client's"),
    }
}

/// Uploads `total` bytes from `source` as `object`: one PUT up to one
/// chunk, a multipart upload of chunk-sized parts above (aborted if any
/// part fails).
pub fn upload(
    rdma: Rdma<'_>,
    object: Object<'_>,
    total: u64,
    plan: &Plan,
    source: Source<'_>,
    progress: Progress<'_>,
) -> Result<Summary, TransferError> {
    check_plan(rdma, plan)?;
    if total == 0 {
        // RDMA moves no empty transfer: an empty object is a plain PUT.
        let request = RdmaRequest::new(object, Op::Put);
        object.s3.send(&request.request(None, &[]))?.success()?;
        return Ok(Summary {
            transfers: 1,
            ..Summary::default()
        });
    }
    if total <= plan.chunk as u64 {
        let single = Plan {
            streams: 1,
            ..*plan
        };
        let work = |slot: &mut Slot, _index: u64| {
            let len = usize::try_from(total).unwrap_or(usize::MAX);
            slot.fill(source, 0, len)?;
            put_slot(rdma, object, Op::Put, slot, len, plan.fallback).map(|(moved, _)| moved)
        };
        return run_chunks(rdma, &single, total, &work, progress);
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
    let upload_id = s3.create_multipart_upload(bucket, key)?;
    let etags = Mutex::new(Vec::new());
    let work = |slot: &mut Slot, index: u64| {
        let (offset, len) = chunk_span(plan, total, index);
        slot.fill(source, offset, len)?;
        let number = u32::try_from(index + 1).unwrap_or(u32::MAX);
        let op = Op::Part {
            upload_id: &upload_id,
            number,
        };
        let (moved, etag) = put_slot(rdma, object, op, slot, len, plan.fallback)?;
        let etag = etag.ok_or_else(|| S3Error::Response {
            what: format!("PUT {bucket}/{key} part {number}"),
            why: "no ETag in the answer".to_owned(),
        })?;
        etags.lock().push((number, etag));
        Ok(moved)
    };
    let outcome = run_chunks(rdma, plan, total, &work, progress).and_then(|mut summary| {
        let mut parts = etags.lock().clone();
        parts.sort();
        s3.complete_multipart_upload(bucket, key, &upload_id, &parts)?;
        summary.parts = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        Ok(summary)
    });
    if outcome.is_err() {
        // Best effort: the parts already stored are the server's to drop.
        let _ = s3.abort_multipart_upload(bucket, key, &upload_id);
    }
    outcome
}
