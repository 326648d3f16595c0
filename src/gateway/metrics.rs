//! The server's Prometheus metrics, served at `GET /metrics` on
//! `--metrics-listen` (OpenMetrics text).
//!
//! Every S3 request is observed at the HTTP layer, from what its response
//! says (its status, `x-amz-rdma-reply`, `x-amz-rdma-bytes-transferred`,
//! the S3 error code of an error's body) and, for a body sent over HTTP,
//! from the bytes that went out; the S3 operations themselves know nothing
//! of it. A request is counted when its response has been sent (or given
//! up), with the time from its arrival until then.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `hipobj_s3_requests_total` | `path`, `op`, `status` | requests answered |
//! | `hipobj_s3_bytes_total` | `path`, `op` | payload bytes moved: by RDMA (`x-amz-rdma-bytes-transferred`), or in an HTTP body of a successful answer (a GET's as sent, a PUT's as declared) |
//! | `hipobj_s3_request_duration_seconds` | `path`, `op` | from the request's arrival to its response's last byte |
//! | `hipobj_s3_requests_in_progress` | | S3 requests being answered |
//! | `hipobj_s3_errors_total` | `op`, `status`, `code` | answers of 400 or more, by S3 error code |
//! | `hipobj_s3_rdma_refusals_total` | `op`, `reason` | tokens not served by RDMA: `declined` (501: RDMA off, a token it cannot use), `busy` (503), `failed` (500), `bad_digest` (400), `s3_error` (the S3 error of the request itself: the backend's answer, whatever its status) |
//! | `hipobj_s3_rdma_memory_in_use_bytes` | | the memory budget that transfers and the cache's objects hold ([`Rdma::memory_in_use`](crate::gateway::rdma::Rdma::memory_in_use)) |
//! | `hipobj_s3_rdma_requests_in_progress` | | RDMA requests admitted ([`Rdma::requests_in_progress`](crate::gateway::rdma::Rdma::requests_in_progress)) |
//! | `hipobj_s3_rdma_budget_waiting`, `hipobj_s3_rdma_budget_waits_total` | | RDMA transfers waiting their turn for room in the memory budget now, and those that have waited ([`Rdma::budget_waits`](crate::gateway::rdma::Rdma::budget_waits)) |
//! | `hipobj_s3_rdma_memory_limit_bytes`, `hipobj_s3_rdma_requests_limit` | | `--rdma-memory-bytes` and `--rdma-max-requests` (0 with RDMA off) |
//! | `hipobj_s3_upstream_request_duration_seconds` | `op`, `outcome` | requests to the store behind the server ([`upstream_observed`]) |
//! | `hipobj_s3_cache_requests_total` | `outcome` | GETs and HEADs the cache saw (`--cache-bytes`): `hit`, `miss`, `head_hit` (a HEAD answered from a fresh entry under `ttl`), `bypass` (a GET it does not answer: a version, a part, conditions, overridden headers), `too_large` (an object not kept), `corrupt` (a fill whose bytes failed the store's checksum), `no_memory` (a fill not kept: transfers held the RDMA memory budget), `disk_corrupt` (a file of the disk tier that failed its checks, deleted) |
//! | `hipobj_s3_cache_bytes_total` | `source` | object bytes sent to clients from the cache's memory (`cache`: hits, and readers of a fill), and read into it from the store (`upstream`) or from the disk tier's files (`disk`) |
//! | `hipobj_s3_cache_coalesced_readers_total` | | GETs that joined a fill in progress instead of asking the store |
//! | `hipobj_s3_cache_fills_in_progress` | | whole-object GETs to the store whose bytes are being kept |
//! | `hipobj_s3_cache_evictions_total`, `hipobj_s3_cache_invalidations_total` | | entries evicted for room; dropped by a write through the gateway |
//! | `hipobj_s3_cache_validations_total` | `outcome` | entries asked the store about: `same`, `changed`, `gone`, `failed` |
//! | `hipobj_s3_cache_in_use_bytes`, `hipobj_s3_cache_limit_bytes` | | the bytes of the entries and fills in progress; `--cache-bytes` |
//! | `hipobj_s3_cache_disk_in_use_bytes`, `hipobj_s3_cache_disk_limit_bytes` | | the bytes of the disk tier's files; `--cache-dir-bytes` |
//! | `hipobj_s3_cache_rdma_in_place_bytes_total` | | bytes of hits WRITTEN by RDMA from the cache's own memory, no copy ([`cache_in_place`]) |
//! | `hipobj_s3_cache_registered_bytes` | | cached objects' bytes registered with the RDMA device now (inside `--rdma-memory-bytes`) |
//! | `hipobj_s3_build_info` | `version` | 1 |
//!
//! `path` is `rdma` (the payload went by RDMA: `x-amz-rdma-reply` 200 or
//! 206) or `http` (everything else, a declined token included); the
//! host-staged copies of a GPU buffer are the client's business and do not
//! show here. `op` is the S3 operation, told from the method, the path
//! and the query (`GetObject`, `PutObject`, `UploadPart`,
//! `CompleteMultipartUpload`...; `Other` otherwise).
//!
//! The metrics are the process's ([`upstream_observed`] needs no handle):
//! one server a process.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The content type of the OpenMetrics text format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The response header of a token request.
const RDMA_REPLY: &str = "x-amz-rdma-reply";
/// Bytes an RDMA transfer moved.
const RDMA_BYTES: &str = "x-amz-rdma-bytes-transferred";

/// Records that the store behind the server (an upstream backend)
/// answered one request: its S3 operation (`GetObject`, `PutObject`...),
/// how long it took in seconds, and its outcome: `ok`, the S3 error code
/// it answered (`NoSuchKey`, `SlowDown`...), `network` when no answer
/// came, or `unreadable` for an answer the gateway could not read (502).
/// Keep both to a small set of values: each pair is a series.
pub fn upstream_observed(op: &str, seconds: f64, outcome: &str) {
    METRICS
        .upstream
        .get_or_create(&UpstreamLabels {
            op: op.to_owned(),
            outcome: outcome.to_owned(),
        })
        .observe(seconds);
}

/// Records an RDMA GET's first chunk WRITTEN to its client, `seconds`
/// after the request arrived: what chunking buys (the first bytes reach
/// the client before the last are fetched).
pub fn rdma_first_byte(seconds: f64) {
    METRICS.rdma_first_byte.observe(seconds);
}

/// A GET or HEAD the cache saw, by outcome (`hit`, `miss`, `head_hit`,
/// `bypass`, `too_large`, `corrupt`, `no_memory`, `disk_corrupt`).
pub fn cache_request(outcome: &'static str) {
    METRICS
        .cache_requests
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

/// An entry asked the store about, by outcome (`same`, `changed`, `gone`,
/// `failed`).
pub fn cache_validated(outcome: &'static str) {
    METRICS
        .cache_validations
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

/// A GET joined a fill in progress.
pub fn cache_coalesced() {
    METRICS.cache_coalesced.inc();
}

/// An entry was evicted for room.
pub fn cache_evicted() {
    METRICS.cache_evictions.inc();
}

/// An entry was dropped by a write through the gateway.
pub fn cache_invalidated() {
    METRICS.cache_invalidations.inc();
}

/// A fill began (`1`) or ended (`-1`).
pub fn cache_fills(delta: i64) {
    METRICS.cache_fills.inc_by(delta);
}

/// `bytes` read from the store into a fill.
pub fn cache_filled(bytes: u64) {
    cache_bytes("upstream", bytes);
}

/// `bytes` sent to a client from the cache's memory.
pub fn cache_served(bytes: u64) {
    cache_bytes("cache", bytes);
}

/// `bytes` of a hit WRITTEN by RDMA from the cache's own memory, in place.
pub fn cache_in_place(bytes: u64) {
    METRICS.cache_in_place.inc_by(bytes);
}

/// Cached bytes registered with the RDMA device now: `delta` more (or
/// fewer).
pub fn cache_registered(delta: i64) {
    METRICS.cache_registered.inc_by(delta);
}

/// `bytes` read from the disk tier's files into a fill.
pub fn cache_from_disk(bytes: u64) {
    cache_bytes("disk", bytes);
}

fn cache_bytes(source: &'static str, bytes: u64) {
    METRICS
        .cache_bytes
        .get_or_create(&SourceLabels { source })
        .inc_by(bytes);
}

/// The bytes the cache holds now, and its limit (`--cache-bytes`).
pub fn cache_in_use(bytes: u64, limit: u64) {
    let m = &*METRICS;
    m.cache_in_use.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    m.cache_limit.set(i64::try_from(limit).unwrap_or(i64::MAX));
}

/// The bytes of the disk tier's files now, and its limit
/// (`--cache-dir-bytes`).
pub fn cache_disk_in_use(bytes: u64, limit: u64) {
    let m = &*METRICS;
    m.cache_disk_in_use
        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    m.cache_disk_limit
        .set(i64::try_from(limit).unwrap_or(i64::MAX));
}

/// The RDMA limits the gauges in use are measured against
/// (`--rdma-memory-bytes`, `--rdma-max-requests`), set once RDMA is on.
pub fn rdma_limits(memory_bytes: u64, max_requests: usize) {
    let m = &*METRICS;
    m.rdma_memory_limit
        .set(i64::try_from(memory_bytes).unwrap_or(i64::MAX));
    m.rdma_requests_limit
        .set(i64::try_from(max_requests).unwrap_or(i64::MAX));
}

/// The RDMA side's gauges as a scrape reads them.
#[derive(Clone, Copy, Debug, Default)]
pub struct RdmaNow {
    /// The memory budget held by transfers and the cache's objects.
    pub memory_in_use: u64,
    /// RDMA requests admitted.
    pub requests_in_progress: usize,
    /// Transfers waiting their turn for room in the budget now.
    pub budget_waiting: usize,
    /// Transfers that have waited so far.
    pub budget_waited: u64,
}

/// Where a scrape reads the RDMA gauges (the gateway's RDMA side, which
/// this module knows only as this).
pub trait RdmaGauges: Send + Sync {
    /// The gauges now.
    fn now(&self) -> RdmaNow;
}

/// The metrics in OpenMetrics text, the RDMA gauges read now.
pub fn render(rdma: Option<&dyn RdmaGauges>) -> String {
    let m = &*METRICS;
    let now = rdma.map(RdmaGauges::now);
    if let Some(now) = now {
        m.rdma_budget_waiting
            .set(i64::try_from(now.budget_waiting).unwrap_or(i64::MAX));
        let seen = m
            .rdma_budget_waits_seen
            .fetch_max(now.budget_waited, std::sync::atomic::Ordering::AcqRel);
        m.rdma_budget_waits
            .inc_by(now.budget_waited.saturating_sub(seen));
    }
    let now = now.unwrap_or_default();
    m.rdma_memory
        .set(i64::try_from(now.memory_in_use).unwrap_or(i64::MAX));
    m.rdma_requests
        .set(i64::try_from(now.requests_in_progress).unwrap_or(i64::MAX));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
    out
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, rdma: Option<Arc<dyn RdmaGauges>>) {
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(e) => {
                eprintln!("hipobj-s3-server: metrics: accept: {e}");
                // Out of descriptors, say: give the others time to close.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let rdma = rdma.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<_>| {
                let answer = answer(req.method(), req.uri(), rdma.as_deref());
                async move { Ok::<_, Infallible>(answer) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}

/// The metrics endpoint's answer.
fn answer(method: &Method, uri: &Uri, rdma: Option<&dyn RdmaGauges>) -> Response<s3s::Body> {
    let (status, content_type, body) = match (method, uri.path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => (StatusCode::OK, CONTENT_TYPE, render(rdma)),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics only\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "the metrics are at /metrics\n".to_owned(),
        ),
    };
    let mut response = Response::new(s3s::Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// One S3 request being answered, from its arrival.
pub struct Exchange {
    counted: InProgress,
    arrived: Instant,
    op: &'static str,
    /// The payload length the request declares (`x-amz-decoded-content-length`
    /// of a chunked upload, else `Content-Length`).
    declared: u64,
}

impl Exchange {
    /// A request arrives.
    pub fn begin<B>(req: &Request<B>) -> Exchange {
        let headers = req.headers();
        let declared = number(headers, "x-amz-decoded-content-length")
            .or_else(|| number(headers, "content-length"))
            .unwrap_or(0);
        Exchange {
            counted: InProgress::new(),
            arrived: Instant::now(),
            op: operation(req.method(), req.uri(), headers),
            declared,
        }
    }

    /// The S3 operation the request is.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The response is ready; `code` is its S3 error code, if any, and
    /// `from_backend` whether a token request's error is the backend's own
    /// answer (a store's 503 is not RDMA busy: `s3_error`). It is counted
    /// once its body has gone (or been given up).
    pub fn respond(
        self,
        resp: Response<s3s::Body>,
        code: Option<&str>,
        from_backend: bool,
    ) -> Response<Observed> {
        let status = resp.status().as_u16();
        let headers = resp.headers();
        let reply = headers
            .get(RDMA_REPLY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u16>().ok());
        let by_rdma = matches!(reply, Some(200 | 206));
        let m = &*METRICS;
        if let Some(reply) = reply.filter(|_| !by_rdma) {
            let reason = match reply {
                _ if from_backend => "s3_error",
                501 => "declined",
                503 => "busy",
                500 => "failed",
                400 if code.is_none_or(is_digest_code) => "bad_digest",
                _ => "s3_error",
            };
            m.rdma_refusals
                .get_or_create(&RefusalLabels {
                    op: self.op,
                    reason,
                })
                .inc();
        }
        if status >= 400 {
            m.errors
                .get_or_create(&ErrorLabels {
                    op: self.op,
                    status,
                    code: code.unwrap_or("").to_owned(),
                })
                .inc();
        }
        let success = (200..300).contains(&status);
        let (path, bytes, count_body) = if by_rdma {
            ("rdma", number(headers, RDMA_BYTES).unwrap_or(0), false)
        } else if success && self.op != "GetObject" && carries_payload(self.op) {
            ("http", self.declared, false)
        } else {
            // A GET's body is counted as it goes out.
            ("http", 0, success && self.op == "GetObject")
        };
        resp.map(|inner| Observed {
            inner,
            record: Some(Record {
                _counted: self.counted,
                path,
                op: self.op,
                status,
                arrived: self.arrived,
                bytes,
                count_body,
            }),
        })
    }
}

/// Whether the operation's request carries object bytes.
fn carries_payload(op: &str) -> bool {
    matches!(op, "PutObject" | "UploadPart")
}

/// The S3 error codes of a payload that does not match its digest.
fn is_digest_code(code: &str) -> bool {
    matches!(
        code,
        "BadDigest" | "InvalidDigest" | "XAmzContentChecksumMismatch" | "XAmzContentSHA256Mismatch"
    )
}

/// A response body that counts what it sends and, when dropped (sent or
/// given up), the request it answers.
pub struct Observed {
    inner: s3s::Body,
    record: Option<Record>,
}

/// A request counted in `requests_in_progress` while this lives (a
/// request whose client went away before its answer included).
struct InProgress;

impl InProgress {
    fn new() -> InProgress {
        METRICS.in_progress.inc();
        InProgress
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        METRICS.in_progress.dec();
    }
}

/// What is counted of a request when its response is done.
struct Record {
    /// Held until the response is done.
    _counted: InProgress,
    path: &'static str,
    op: &'static str,
    status: u16,
    arrived: Instant,
    bytes: u64,
    /// Whether the body's bytes are the payload (a GET over HTTP).
    count_body: bool,
}

impl hyper::body::Body for Observed {
    type Data = Bytes;
    type Error = <s3s::Body as hyper::body::Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(record)) = (&polled, &mut this.record) {
            if let Some(data) = frame.data_ref().filter(|_| record.count_body) {
                record.bytes += u64::try_from(data.len()).unwrap_or(u64::MAX);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        let Some(r) = self.record.take() else { return };
        let m = &*METRICS;
        m.requests
            .get_or_create(&RequestLabels {
                path: r.path,
                op: r.op,
                status: r.status,
            })
            .inc();
        let path = PathLabels {
            path: r.path,
            op: r.op,
        };
        if r.bytes > 0 {
            m.bytes.get_or_create(&path).inc_by(r.bytes);
        }
        m.duration
            .get_or_create(&path)
            .observe(r.arrived.elapsed().as_secs_f64());
    }
}

/// A request that got no response (the S3 service failed): counted as a
/// 500 of the HTTP path.
pub fn failed(exchange: Exchange) {
    let mut resp = Response::new(s3s::Body::empty());
    *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    drop(exchange.respond(resp, Some("InternalError"), false));
}

/// A header's value as a whole number.
fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The S3 operation of a path-style request, from its method, path and
/// query (and the copy source header): a small set of names, `Other` for
/// the rest (a sub-resource such as `?acl` or `?tagging`, say).
pub fn operation(method: &Method, uri: &Uri, headers: &HeaderMap) -> &'static str {
    let path = uri.path().trim_start_matches('/');
    let keys = || {
        uri.query()
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| pair.split('=').next().unwrap_or(""))
    };
    let has = |key: &str| keys().any(|k| k == key);
    // A parameter of the operations named here, or of a presigned URL;
    // anything else names a sub-resource.
    let sub = keys().any(|k| {
        !matches!(
            k,
            "prefix"
                | "delimiter"
                | "marker"
                | "max-keys"
                | "encoding-type"
                | "list-type"
                | "continuation-token"
                | "fetch-owner"
                | "start-after"
                | "uploads"
                | "uploadId"
                | "partNumber"
                | "versionId"
                | "max-parts"
                | "part-number-marker"
                | "key-marker"
                | "upload-id-marker"
                | "max-uploads"
                // The AWS SDKs name their operation in the query
                // (`?x-id=PutObject`).
                | "x-id"
                | "delete"
        ) && !k.starts_with("response-")
            && !k.to_ascii_lowercase().starts_with("x-amz-")
    });
    let copy = headers.contains_key("x-amz-copy-source");
    let object = path.split_once('/').is_some_and(|(_, key)| !key.is_empty());
    match *method {
        _ if sub => "Other",
        Method::GET if path.is_empty() => "ListBuckets",
        _ if path.is_empty() => "Other",
        Method::GET if !object && has("uploads") => "ListMultipartUploads",
        Method::GET if !object && has("list-type") => "ListObjectsV2",
        Method::GET if !object => "ListObjects",
        Method::HEAD if !object => "HeadBucket",
        Method::PUT if !object => "CreateBucket",
        Method::DELETE if !object => "DeleteBucket",
        Method::GET if has("uploadId") => "ListParts",
        Method::GET => "GetObject",
        Method::HEAD => "HeadObject",
        Method::PUT if has("uploadId") && copy => "UploadPartCopy",
        Method::PUT if has("uploadId") => "UploadPart",
        Method::PUT if copy => "CopyObject",
        Method::PUT => "PutObject",
        Method::POST if !object && has("delete") => "DeleteObjects",
        _ if has("delete") => "Other",
        Method::POST if has("uploads") => "CreateMultipartUpload",
        Method::POST if has("uploadId") => "CompleteMultipartUpload",
        Method::DELETE if has("uploadId") => "AbortMultipartUpload",
        Method::DELETE => "DeleteObject",
        _ => "Other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    path: &'static str,
    op: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    op: &'static str,
    status: u16,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    op: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    op: String,
    outcome: String,
}

/// Latency buckets: 0.5 ms to about 33 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

/// The process's metrics and the registry that names them.
struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    bytes: Family<PathLabels, Counter>,
    duration: Family<PathLabels, Histogram, fn() -> Histogram>,
    in_progress: Gauge,
    errors: Family<ErrorLabels, Counter>,
    rdma_refusals: Family<RefusalLabels, Counter>,
    rdma_memory: Gauge,
    rdma_requests: Gauge,
    rdma_memory_limit: Gauge,
    rdma_requests_limit: Gauge,
    upstream: Family<UpstreamLabels, Histogram, fn() -> Histogram>,
    rdma_first_byte: Histogram,
    rdma_budget_waiting: Gauge,
    rdma_budget_waits: Counter,
    /// The budget's count of waits when last rendered.
    rdma_budget_waits_seen: std::sync::atomic::AtomicU64,
    cache_requests: Family<OutcomeLabels, Counter>,
    cache_validations: Family<OutcomeLabels, Counter>,
    cache_bytes: Family<SourceLabels, Counter>,
    cache_coalesced: Counter,
    cache_evictions: Counter,
    cache_invalidations: Counter,
    cache_fills: Gauge,
    cache_in_use: Gauge,
    cache_limit: Gauge,
    cache_disk_in_use: Gauge,
    cache_disk_limit: Gauge,
    cache_in_place: Counter,
    cache_registered: Gauge,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("hipobj_s3");
        let m = Metrics {
            requests: Family::default(),
            bytes: Family::default(),
            duration: Family::new_with_constructor(latency),
            in_progress: Gauge::default(),
            errors: Family::default(),
            rdma_refusals: Family::default(),
            rdma_memory: Gauge::default(),
            rdma_requests: Gauge::default(),
            rdma_memory_limit: Gauge::default(),
            rdma_requests_limit: Gauge::default(),
            upstream: Family::new_with_constructor(latency),
            rdma_first_byte: latency(),
            rdma_budget_waiting: Gauge::default(),
            rdma_budget_waits: Counter::default(),
            rdma_budget_waits_seen: std::sync::atomic::AtomicU64::new(0),
            cache_requests: Family::default(),
            cache_validations: Family::default(),
            cache_bytes: Family::default(),
            cache_coalesced: Counter::default(),
            cache_evictions: Counter::default(),
            cache_invalidations: Counter::default(),
            cache_fills: Gauge::default(),
            cache_in_use: Gauge::default(),
            cache_limit: Gauge::default(),
            cache_disk_in_use: Gauge::default(),
            cache_disk_limit: Gauge::default(),
            cache_in_place: Counter::default(),
            cache_registered: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "S3 requests answered, by the path of their payload (rdma, http), operation and status",
            m.requests.clone(),
        );
        registry.register(
            "bytes",
            "Payload bytes moved, by path (rdma, http) and operation",
            m.bytes.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its response's last byte, by path and operation",
            prometheus_client::registry::Unit::Seconds,
            m.duration.clone(),
        );
        registry.register(
            "requests_in_progress",
            "S3 requests being answered",
            m.in_progress.clone(),
        );
        registry.register(
            "errors",
            "Answers with a status of 400 or more, by operation, status and S3 error code",
            m.errors.clone(),
        );
        registry.register(
            "rdma_refusals",
            "Tokens not served by RDMA, by operation and reason (declined 501, busy 503, \
             failed 500, bad_digest 400, s3_error)",
            m.rdma_refusals.clone(),
        );
        registry.register_with_unit(
            "rdma_memory_in_use",
            "Registered memory held by RDMA transfers",
            prometheus_client::registry::Unit::Bytes,
            m.rdma_memory.clone(),
        );
        registry.register(
            "rdma_requests_in_progress",
            "RDMA requests admitted and not yet done",
            m.rdma_requests.clone(),
        );
        registry.register_with_unit(
            "rdma_memory_limit",
            "Registered memory RDMA transfers may hold at once (--rdma-memory-bytes)",
            prometheus_client::registry::Unit::Bytes,
            m.rdma_memory_limit.clone(),
        );
        registry.register(
            "rdma_requests_limit",
            "RDMA requests served at once (--rdma-max-requests)",
            m.rdma_requests_limit.clone(),
        );
        registry.register_with_unit(
            "upstream_request_duration",
            "Requests to the store behind the server, by operation and outcome",
            prometheus_client::registry::Unit::Seconds,
            m.upstream.clone(),
        );
        registry.register_with_unit(
            "rdma_get_first_byte",
            "Time from an RDMA GET's arrival to its first chunk written to the client",
            prometheus_client::registry::Unit::Seconds,
            m.rdma_first_byte.clone(),
        );
        registry.register(
            "rdma_budget_waiting",
            "RDMA transfers waiting their turn for room in the memory budget now",
            m.rdma_budget_waiting.clone(),
        );
        registry.register(
            "rdma_budget_waits",
            "RDMA transfers that had to wait for room in the memory budget",
            m.rdma_budget_waits.clone(),
        );
        registry.register(
            "cache_requests",
            "GETs and HEADs the cache saw, by outcome (hit, miss, head_hit, bypass, too_large, corrupt, no_memory, disk_corrupt)",
            m.cache_requests.clone(),
        );
        registry.register(
            "cache_validations",
            "Cache entries asked the store about, by outcome (same, changed, gone, failed)",
            m.cache_validations.clone(),
        );
        registry.register(
            "cache_bytes",
            "Object bytes sent from the cache's memory (cache) and read from the store into it (upstream)",
            m.cache_bytes.clone(),
        );
        registry.register(
            "cache_coalesced_readers",
            "GETs that joined a fill in progress instead of asking the store",
            m.cache_coalesced.clone(),
        );
        registry.register(
            "cache_evictions",
            "Cache entries evicted for room",
            m.cache_evictions.clone(),
        );
        registry.register(
            "cache_invalidations",
            "Cache entries dropped by a write through the gateway",
            m.cache_invalidations.clone(),
        );
        registry.register_with_unit(
            "cache_rdma_in_place",
            "Bytes of cache hits WRITTEN by RDMA from the cache's own registered memory, \
             with no copy",
            prometheus_client::registry::Unit::Bytes,
            m.cache_in_place.clone(),
        );
        registry.register(
            "cache_fills_in_progress",
            "Whole-object GETs to the store whose bytes are being kept",
            m.cache_fills.clone(),
        );
        for (name, help, gauge) in [
            (
                "cache_in_use",
                "The bytes of the cache's entries and of its fills in progress",
                &m.cache_in_use,
            ),
            (
                "cache_limit",
                "The bytes the cache may hold (--cache-bytes)",
                &m.cache_limit,
            ),
            (
                "cache_disk_in_use",
                "The bytes of the cache's files on disk (--cache-dir)",
                &m.cache_disk_in_use,
            ),
            (
                "cache_disk_limit",
                "The bytes the cache's files may take (--cache-dir-bytes)",
                &m.cache_disk_limit,
            ),
            (
                "cache_registered",
                "The bytes of cached objects registered with the RDMA device, which RDMA GETs \
                 WRITE from in place",
                &m.cache_registered,
            ),
        ] {
            registry.register_with_unit(
                name,
                help,
                prometheus_client::registry::Unit::Bytes,
                gauge.clone(),
            );
        }
        registry.register(
            "build",
            "The server's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics { registry, ..m }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operation_is_told_from_the_method_the_path_and_the_query() {
        let none = HeaderMap::new();
        let mut copy = HeaderMap::new();
        copy.insert(
            "x-amz-copy-source",
            http::HeaderValue::from_static("/b/src"),
        );
        for (method, uri, headers, op) in [
            (Method::GET, "/", &none, "ListBuckets"),
            (Method::GET, "/b", &none, "ListObjects"),
            (Method::GET, "/b/?prefix=a&max-keys=2", &none, "ListObjects"),
            (Method::GET, "/b?list-type=2", &none, "ListObjectsV2"),
            (Method::PUT, "/b/k?x-id=PutObject", &none, "PutObject"),
            (
                Method::GET,
                "/b/k?uploadId=u&x-id=ListParts",
                &none,
                "ListParts",
            ),
            (Method::POST, "/b?delete", &none, "DeleteObjects"),
            (Method::POST, "/b/k?delete", &none, "Other"),
            (Method::GET, "/b?uploads", &none, "ListMultipartUploads"),
            (Method::GET, "/b?location", &none, "Other"),
            (Method::PUT, "/b", &none, "CreateBucket"),
            (Method::HEAD, "/b", &none, "HeadBucket"),
            (Method::GET, "/b/k/e/y", &none, "GetObject"),
            (
                Method::GET,
                "/b/k?X-Amz-Signature=abc&response-content-type=x",
                &none,
                "GetObject",
            ),
            (Method::GET, "/b/k?tagging", &none, "Other"),
            (Method::HEAD, "/b/k", &none, "HeadObject"),
            (Method::PUT, "/b/k", &none, "PutObject"),
            (Method::PUT, "/b/k", &copy, "CopyObject"),
            (
                Method::PUT,
                "/b/k?partNumber=1&uploadId=u",
                &none,
                "UploadPart",
            ),
            (
                Method::PUT,
                "/b/k?partNumber=1&uploadId=u",
                &copy,
                "UploadPartCopy",
            ),
            (
                Method::POST,
                "/b/k?uploads=",
                &none,
                "CreateMultipartUpload",
            ),
            (
                Method::POST,
                "/b/k?uploadId=u",
                &none,
                "CompleteMultipartUpload",
            ),
            (Method::GET, "/b/k?uploadId=u", &none, "ListParts"),
            (
                Method::DELETE,
                "/b/k?uploadId=u",
                &none,
                "AbortMultipartUpload",
            ),
            (Method::DELETE, "/b/k", &none, "DeleteObject"),
        ] {
            let uri: Uri = uri.parse().expect("a URI");
            assert_eq!(operation(&method, &uri, headers), op, "{method} {uri}");
        }
    }
}
