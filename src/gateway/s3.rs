//! The S3 operations: s3s-fs's, with GetObject, PutObject and UploadPart
//! moving their payload by RDMA when the request carries a usable
//! `x-amz-rdma-token`.
//!
//! - No token: plain S3, exactly s3s-fs.
//! - A usable token (it decodes, transport `0x02`, RDMA on): GET reads the
//!   object (or range) through the backend, WRITEs min(its length, the
//!   token's) to the client and answers 200 (206 for a range) with an empty
//!   body, `x-amz-rdma-reply: 200|206` and `x-amz-rdma-bytes-transferred`;
//!   PUT and UploadPart require an empty body, READ the token's length from
//!   the client and store it through the backend, answering as S3 does plus
//!   the same two headers. A failed transfer answers 500 with
//!   `x-amz-rdma-reply: 500` and stores nothing. An error of the backend
//!   (no such key, a bad range...) is answered as S3 does, with
//!   `x-amz-rdma-reply` set to its status.
//! - An unusable token: GET is answered the ordinary way plus
//!   `x-amz-rdma-reply: 501`; PUT and UploadPart store nothing and answer
//!   501 NotImplemented with `x-amz-rdma-reply: 501`. Unusable: RDMA is off
//!   (whatever the token looks like), it does not decode, its transport is
//!   not `0x02`, it names an address the server may not connect to
//!   (`--rdma-allow`, else only the request's own source), or it is longer
//!   than `--rdma-max-bytes`.
//! - `--rdma-max-requests` RDMA requests in progress already: 503 SlowDown
//!   with `x-amz-rdma-reply: 503` at once, before anything blocks. A
//!   request admitted holds its place until its last blocking step ends,
//!   so RDMA requests never hold more of the runtime's blocking threads
//!   than that, whatever their clients do.
//! - No room in the memory budget until the deadline: 503 SlowDown with
//!   `x-amz-rdma-reply: 503`.
//!
//! Connections a transfer made are reused only by transfers of the same S3
//! principal (the access key the request is signed with).
//!
//! A token may carry the suffix `:<addr>:<size>` that the original's
//! clients append (decimal or `0x` hex): its size must be the token's
//! length; its address is ignored (the token's own is the one the NIC
//! knows).
//!
//! Every request must be signed (SigV4) for the configured region.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use crate::core::token::{parse_header, Token, Transport};
use bytes::Bytes;
use futures::StreamExt;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};

use crate::gateway::backend::Backend;
use crate::gateway::checksum::Stored;
use crate::gateway::local::ObjectFile;
use crate::gateway::range;
use crate::gateway::rdma::{Admission, Failure, Label, Rdma, RegBuf, TakeError, Window};
use crate::gateway::stream::{self, ReadFailure};

/// The TCP peer of an HTTP request, put into its extensions by the
/// connection's service (`main.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// The request header carrying the client's token.
const TOKEN: &str = "x-amz-rdma-token";
/// The response header the client hands to `hipObjParseRdmaReply`.
const REPLY: HeaderName = HeaderName::from_static("x-amz-rdma-reply");
/// Bytes the transfer moved.
const BYTES: HeaderName = HeaderName::from_static("x-amz-rdma-bytes-transferred");
/// The CRC64/NVME of the bytes an RDMA GET wrote (base64), when asked.
const RDMA_CRC64NVME: HeaderName = HeaderName::from_static("x-amz-rdma-checksum-crc64nvme");
/// Marks an error answer of a token request as the backend's own (a
/// store's 503 is not RDMA busy): read and removed by the server's
/// connection layer before the answer leaves (`gateway::WithPeer`).
pub const CAUSE: HeaderName = HeaderName::from_static("x-hipobj-cause");

/// A token request's payload: its checksums (`x-amz-checksum-*`) describe
/// the bytes RDMA moves, not its empty HTTP body (docs/protocol.md,
/// "Checksums"). PutObject and UploadPart inputs have the same fields by
/// other types.
trait Payload {
    fn body(&mut self) -> &mut Option<StreamingBlob>;
    fn content_length(&mut self) -> &mut Option<i64>;
    /// What the client declared of the payload.
    fn declared(&self) -> Checksum;
    /// Content-MD5 describes the empty HTTP body: dropped.
    fn drop_md5(&mut self);
}

macro_rules! payload {
    ($($ty:ty),*) => {$(
        impl Payload for $ty {
            fn body(&mut self) -> &mut Option<StreamingBlob> {
                &mut self.body
            }
            fn content_length(&mut self) -> &mut Option<i64> {
                &mut self.content_length
            }
            fn declared(&self) -> Checksum {
                Checksum {
                    checksum_crc32: self.checksum_crc32.clone(),
                    checksum_crc32c: self.checksum_crc32c.clone(),
                    checksum_crc64nvme: self.checksum_crc64nvme.clone(),
                    checksum_sha1: self.checksum_sha1.clone(),
                    checksum_sha256: self.checksum_sha256.clone(),
                    ..Checksum::default()
                }
            }
            fn drop_md5(&mut self) {
                self.content_md5 = None;
            }
        }
    )*};
}
payload!(PutObjectInput, UploadPartInput);

/// A backend, with the RDMA paths in front.
pub struct RdmaS3 {
    backend: Arc<dyn Backend>,
    /// The server's RDMA, or why it is off.
    rdma: Result<Arc<Rdma>, String>,
    region: String,
}

/// What a request's token asks for.
enum Ask {
    /// No token: plain S3.
    Plain,
    /// A token this server cannot serve, and why.
    Decline(String),
    /// A token it could serve, but as many RDMA requests as it serves at
    /// once are in progress (503), and why.
    Busy(String),
    /// A token to serve.
    Rdma(Job),
}

/// An RDMA request admitted: its token, for whom, and its place among the
/// requests in progress.
struct Job {
    token: Token,
    rdma: Arc<Rdma>,
    /// The HTTP request's source address.
    source: Option<IpAddr>,
    /// The access key it is signed with.
    principal: String,
    admission: Arc<Admission>,
}

impl Job {
    /// Runs a blocking step (verbs, the CM, a file) off the async workers,
    /// holding the request's place until it ends, even if the handler is
    /// dropped meanwhile.
    async fn blocking<T, F>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let held = Arc::clone(&self.admission);
        blocking(move || {
            let out = f();
            drop(held);
            out
        })
        .await
    }
}

impl RdmaS3 {
    /// The operations over `backend`; `rdma` is why RDMA is off when it
    /// is.
    pub fn new(
        backend: Arc<dyn Backend>,
        rdma: Result<Arc<Rdma>, String>,
        region: String,
    ) -> RdmaS3 {
        RdmaS3 {
            backend,
            rdma,
            region,
        }
    }

    /// Refuses a request signed for another region, as S3 does.
    fn check_region<T>(&self, req: &S3Request<T>) -> S3Result<()> {
        match &req.region {
            Some(region) if region.as_str() != self.region => Err(s3_error!(
                AuthorizationHeaderMalformed,
                "the request is signed for region {region}; this server is {}",
                self.region
            )),
            _ => Ok(()),
        }
    }

    /// GetObject from the backend, ranges as they came: a suffix range
    /// (`bytes=-N`) is the backend's to resolve against the version it
    /// serves (S3 stores do; the local backend resolves it itself), never
    /// here against a length a HEAD found before (another version's, if
    /// the object changed in between; and a request more for the store).
    async fn backend_get(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.backend.get_object(req).await
    }

    /// What the request's `x-amz-rdma-token` asks for; a token to serve
    /// takes its place among the RDMA requests in progress. A decline or a
    /// refusal is logged.
    fn ask<T>(&self, req: &S3Request<T>, what: &str) -> Ask {
        let mut tokens = req.headers.get_all(TOKEN).iter();
        let Some(value) = tokens.next() else {
            return Ask::Plain;
        };
        let more = tokens.count();
        let source = req.extensions.get::<Peer>().map(|p| p.0.ip());
        // RDMA off first: whatever the token looks like, that is the reason.
        let why = match (&self.rdma, parse_header(value.as_bytes())) {
            (Err(off), _) => format!("RDMA is off ({off})"),
            // Which buffer the client meant is not for the server to pick.
            _ if more > 0 => format!(
                "{TOKEN} is given {} times: a request names one buffer",
                more + 1
            ),
            (_, Err(e)) => e.to_string(),
            (_, Ok(token)) if token.transport != Transport::RcCm => format!(
                "transport {:#04x}: this server connects through RDMA CM (0x02) only",
                token.transport.to_byte()
            ),
            (Ok(rdma), Ok(token)) if !rdma.may_dial(&token, source) => format!(
                "the token names {}, which this server may not connect to for a request \
                 from {} (see --rdma-allow)",
                crate::core::nic::ip_of(&token.gid),
                source.map_or("an unknown address".to_owned(), |s| s.to_string())
            ),
            (Ok(rdma), Ok(token)) => match rdma.admit() {
                Ok(admission) => {
                    return Ask::Rdma(Job {
                        token,
                        rdma: rdma.clone(),
                        source,
                        principal: req
                            .credentials
                            .as_ref()
                            .map_or_else(String::new, |c| c.access_key.clone()),
                        admission: Arc::new(admission),
                    })
                }
                Err(why) => {
                    eprintln!("hipobj-s3-server: {what}: {TOKEN} refused for now: {why}");
                    return Ask::Busy(why);
                }
            },
        };
        eprintln!("hipobj-s3-server: {what}: declined {TOKEN}: {why}");
        Ask::Decline(why)
    }

    /// The backend's answer to an RDMA GET. A range from the object's
    /// first byte, open or of at least [`WHOLE_FROM`] bytes (what clients
    /// send for a whole object: they may not know its length), is asked of
    /// the backend as the whole object, in one request whose answer says
    /// the version and the length: stores answer a range without the
    /// object's stored checksum, and some serve it by a slower path (Garage:
    /// 40 ms more before the first byte). The answer gets the Content-Range
    /// the client's range asks for when that range reaches the object's
    /// last byte; when it ends before (the start of a larger object), that
    /// answer is dropped and the range asked as it came. Any other request
    /// goes as it came.
    async fn get_for_rdma(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let last = match req.input.range {
            Some(Range::Int { first: 0, last }) if last.is_none_or(|l| l + 1 >= WHOLE_FROM) => last,
            _ => return self.backend_get(req).await,
        };
        let mut input = req.input.clone();
        input.range = None;
        let mut resp = self
            .backend_get(crate::gateway::backend::sibling(&req, input))
            .await?;
        let n = resp
            .output
            .content_length
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        if n == 0 || last.is_some_and(|last| last < n - 1) {
            // An empty object (whose range the store refuses as it
            // should), or a range short of its end.
            drop(resp);
            return self.backend_get(req).await;
        }
        resp.output.content_range = Some(format!("bytes 0-{}/{n}", n - 1));
        Ok(resp)
    }

    /// GetObject with a usable token: the backend's answer (or range),
    /// WRITTEN to the client in chunks as the backend gives them
    /// ([`stream::write_chunks`]), with the CRC64/NVME of the bytes written
    /// in the reply when the request asks for checksums.
    async fn get_by_rdma(
        &self,
        mut req: S3Request<GetObjectInput>,
        job: Job,
        what: String,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let arrived = Instant::now();
        let verify = wants_checksum(&req.headers);
        // The backend's stored checksum, whatever the client asked: the
        // bytes of a whole object are checked against it on their way.
        req.input.checksum_mode = Some(ChecksumMode::from_static(ChecksumMode::ENABLED));
        let (token, rdma, source) = (job.token, job.rdma.clone(), job.source);
        let mut resp = self.get_for_rdma(req).await.map_err(echo_status)?;
        let file = resp.extensions.remove::<ObjectFile>();
        let kept = resp.extensions.remove::<crate::gateway::cache::Kept>();
        let length = resp
            .output
            .content_length
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| failed("the backend gave no content length".into()))?;
        let len = length.min(token.length);
        if let Err(TakeError::TooLarge(why)) = rdma.check_len(len) {
            // Declined: the object goes in the body, as without a token.
            eprintln!("hipobj-s3-server: GET {what}: declined {TOKEN}: {why}");
            resp.headers.insert(REPLY, HeaderValue::from(501u16));
            return Ok(resp);
        }
        let want = usize::try_from(len)
            .map_err(|_| failed(format!("{len} bytes do not fit this machine's memory")))?;
        let (first, total) = range::span(&resp.output, length);
        let whole = first == 0 && len == total;
        let stored = Stored::of(&resp.output, whole);
        // A backend that keeps the object in a file of its own hands over
        // the file it answered from, read straight into the registered
        // chunks in chunk-sized blocking calls (its body would be read into
        // memory of its own first), where its answer (length, range) says
        // which bytes it holds: the version answered for, never a path
        // opened again.
        let bytes_from = match (file, resp.output.body.take()) {
            (Some(ObjectFile(file)), _) => Source::File {
                span: FileSpan { file, first, total },
                checked: false,
            },
            (None, Some(body)) => Source::Body {
                body,
                pending: Bytes::new(),
            },
            (None, None) => Source::Body {
                body: StreamingBlob::from(s3s::Body::empty()),
                pending: Bytes::new(),
            },
        };
        let sums = Wanted {
            crc: verify,
            stored,
        };
        let getting = Getting {
            token,
            len,
            want,
            what: what.clone(),
            source,
            principal: job.principal.clone(),
            arrived,
        };
        let ((written, filled), in_place) = match (kept.filter(|_| want > 0), bytes_from) {
            (None, Source::File { span, .. }) if get_chunks(want, rdma.chunk_bytes()) <= 1 => {
                (get_in_one(&job, getting, span, sums).await?, false)
            }
            (kept, bytes_from) => {
                // A cached object's bytes are WRITTEN from where the cache
                // keeps them, registered once for all its GETs: no buffers,
                // no copy.
                let feed = match kept {
                    Some(kept) => {
                        let pinned = match kept.pinned.get() {
                            Some(pinned) => Arc::clone(pinned),
                            None => {
                                let (rdma, bytes) = (rdma.clone(), kept.bytes.clone());
                                let pinned = job
                                    .blocking(move || rdma.pin(bytes))
                                    .await
                                    .map_err(failed)?
                                    .map_err(failed)?;
                                Arc::clone(kept.pinned.get_or_init(|| Arc::new(pinned)))
                            }
                        };
                        let at = usize::try_from(kept.first).map_err(|e| failed(e.to_string()))?;
                        let whole_crc = resp.output.checksum_crc64nvme.clone().filter(|_| whole);
                        Feed::Pinned {
                            pinned,
                            at,
                            whole_crc,
                        }
                    }
                    // The transfer's whole share of the budget, before the
                    // writer proves the token (which holds a connection):
                    // never part of it while waiting for more.
                    None => Feed::Chunks({
                        let (chunk, depth) = (rdma.chunk_bytes(), rdma.chunks());
                        let wanted = get_chunks(want, chunk).min(depth);
                        let rdma = rdma.clone();
                        job.blocking(move || rdma.reserve(chunk.min(want), wanted, wanted.min(1)))
                            .await
                            .map_err(failed)?
                            .map_err(take_failed)?
                    }),
                };
                let in_place = matches!(feed, Feed::Pinned { .. });
                (
                    get_in_chunks(&job, getting, feed, bytes_from, sums).await,
                    in_place,
                )
            }
        };
        let crc = match filled {
            Ok(crc) => crc,
            Err(Fill::NoBuffer(e)) => return Err(take_failed(e)),
            Err(Fill::Failed(why)) => {
                return Err(failed(format!("reading {what} from the backend: {why}")))
            }
            Err(Fill::Corrupt {
                header,
                stored,
                read,
            }) => {
                let why = format!(
                    "the backend's bytes of {what} do not match its {header}: stored {stored}, \
                     read {read}; the transfer was not completed"
                );
                eprintln!("hipobj-s3-server: GET {what}: {why}");
                return Err(failed(why));
            }
            // The writer ended first: its outcome says why.
            Err(Fill::WriterGone) => None,
        };
        written.map_err(failed)?.map_err(transfer_failed)?;
        if in_place {
            crate::gateway::metrics::cache_in_place(len);
        }
        resp.output.content_length = Some(0);
        // The object's checksums describe an HTTP body, which is empty here.
        resp.output.checksum_crc32 = None;
        resp.output.checksum_crc32c = None;
        resp.output.checksum_crc64nvme = None;
        resp.output.checksum_sha1 = None;
        resp.output.checksum_sha256 = None;
        resp.output.checksum_type = None;
        // s3s answers 206 exactly when there is a Content-Range.
        let status: u16 = if resp.output.content_range.is_some() {
            206
        } else {
            200
        };
        resp.headers.insert(REPLY, HeaderValue::from(status));
        resp.headers.insert(BYTES, HeaderValue::from(len));
        if let Some(crc) = crc {
            resp.headers.insert(
                RDMA_CRC64NVME,
                HeaderValue::from_str(&crc).map_err(|e| failed(e.to_string()))?,
            );
        }
        Ok(resp)
    }

    /// PutObject or UploadPart with a usable token: drains the (empty)
    /// body, which checks its signed hash, then READs the token's range
    /// from the client in chunks ([`stream::read_chunks`]) and hands them
    /// to `store` (the backend's operation) as the request's body while
    /// they come, each in its transfer buffer (no copy). The bytes are
    /// checked against the request's `x-amz-checksum-*`: a mismatch is 400
    /// BadDigest and the backend never sees the whole body, so it stores
    /// nothing.
    async fn put_by_rdma<I, O, F, Fut>(
        &self,
        mut req: S3Request<I>,
        job: Job,
        what: String,
        store: F,
    ) -> S3Result<S3Response<O>>
    where
        I: Payload,
        F: FnOnce(S3Request<I>) -> Fut,
        Fut: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        let arrived = Instant::now();
        let (token, rdma, source) = (job.token, job.rdma.clone(), job.source);
        if let Some(mut body) = req.input.body().take() {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    with_reply(
                        s3_error!(IncompleteBody, "reading the request body: {e}"),
                        400,
                    )
                })?;
                if !chunk.is_empty() {
                    return Err(with_reply(
                        s3_error!(
                            InvalidRequest,
                            "a request with {TOKEN} must have an empty body"
                        ),
                        400,
                    ));
                }
            }
        }
        rdma.check_len(token.length).map_err(take_failed)?;
        let len = usize::try_from(token.length).map_err(|_| {
            failed(format!(
                "{} bytes do not fit this machine's memory",
                token.length
            ))
        })?;
        let declared = stream::Declared {
            expected: req.input.declared(),
        };
        req.input.drop_md5();
        // Trailing checksums, like Content-MD5, describe the empty HTTP body.
        req.trailing_headers = None;
        let (chunk, depth) = (rdma.chunk_bytes(), rdma.chunks());
        let (tx, body) = stream::ChunkStream::new(len, depth);
        *req.input.body() = Some(StreamingBlob::new(body));
        *req.input.content_length() = i64::try_from(len).ok();
        let principal = job.principal.clone();
        let what_ = what.clone();
        let reading = job.blocking(move || {
            let label = Label {
                op: "PUT",
                object: &what,
                source,
                principal: &principal,
                arrived,
            };
            stream::read_chunks(&rdma, &token, &label, chunk, depth, &declared, &tx)
        });
        let (read, stored) = tokio::join!(reading, store(req));
        // The transfer's line says what the client is told: the bytes may
        // have moved while the backend (a store that stopped, say) did not
        // take them.
        let store_failed = |line: &str, e: S3Error| {
            let status = e.status_code().map_or(500, |s| s.as_u16());
            let said = match e.message() {
                Some(message) => format!("{} ({message})", e.code().as_str()),
                None => e.code().as_str().to_owned(),
            };
            let moved = if line.is_empty() {
                format!("rdma PUT {what_}")
            } else {
                format!("{line}, but")
            };
            eprintln!(
                "hipobj-s3-server: {moved} the backend answered {status} {said}: nothing \
                 stored; the client is told {status}"
            );
            echo_status(e)
        };
        match read.map_err(failed)? {
            Ok((_, line)) => match stored {
                Ok(mut resp) => {
                    eprintln!("hipobj-s3-server: {line}, stored");
                    resp.headers.insert(REPLY, HeaderValue::from(200u16));
                    resp.headers.insert(BYTES, HeaderValue::from(len));
                    Ok(resp)
                }
                Err(e) => Err(store_failed(&line, e)),
            },
            Err(ReadFailure::Digest(why)) => Err(with_reply(
                s3_error!(BadDigest, "{why}; nothing was stored"),
                400,
            )),
            Err(ReadFailure::Transfer(f)) => Err(transfer_failed(f)),
            Err(ReadFailure::NoBuffer(e)) => Err(take_failed(e)),
            Err(ReadFailure::BackendGone(line)) => match stored {
                Err(e) => Err(store_failed(&line, e)),
                Ok(_) => Err(failed(
                    "the backend answered before it took the whole body".to_owned(),
                )),
            },
        }
    }
}

/// Whether a GetObject asks for checksums (`x-amz-checksum-mode:
/// ENABLED`): an RDMA reply then carries the CRC64/NVME of the bytes
/// written.
fn wants_checksum(headers: &HeaderMap) -> bool {
    headers
        .get("x-amz-checksum-mode")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("ENABLED"))
}

/// Where a GET's bytes come from.
enum Source {
    /// The file the backend answered from (its length `checked` at the
    /// first chunk).
    File { span: FileSpan, checked: bool },
    /// The backend's stream, and what is left of its last piece.
    Body { body: StreamingBlob, pending: Bytes },
}

/// Why a GET's chunks stopped.
enum Fill {
    /// No buffer: declined, no room or failed.
    NoBuffer(TakeError),
    /// The backend's bytes failed or ended short.
    Failed(String),
    /// The backend's bytes do not match the checksum it stored with them.
    Corrupt {
        header: &'static str,
        stored: String,
        read: String,
    },
    /// The writer ended (its outcome says why).
    WriterGone,
}

/// What a GET computes over the bytes it hands to the writer: the
/// CRC64/NVME the client asked for, and the check against the backend's
/// stored checksum.
struct Wanted {
    crc: bool,
    stored: Option<Stored>,
}

/// How many chunks a GET of `want` bytes moves in: the first an eighth of
/// `chunk` (at least 64 KiB), the others `chunk` ([`fill_chunks`]).
fn get_chunks(want: usize, chunk: usize) -> usize {
    let first = first_chunk(chunk);
    if want == 0 {
        0
    } else if want <= first {
        1
    } else {
        1 + (want - first).div_ceil(chunk)
    }
}

/// The chunks of a GET of `want` bytes: (offset, length) each, the first
/// [`first_chunk`], the others `chunk`.
fn spans(want: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut offset = 0usize;
    std::iter::from_fn(move || {
        let size = if offset == 0 {
            first_chunk(chunk)
        } else {
            chunk
        };
        let n = want.checked_sub(offset)?.min(size);
        let span = (offset, n);
        offset += n;
        (n > 0).then_some(span)
    })
}

/// The first chunk of a GET: an eighth of the others (at least 64 KiB), so
/// that the client's first bytes wait for it, not for a whole chunk.
fn first_chunk(chunk: usize) -> usize {
    (chunk / 8).max(64 << 10).min(chunk)
}

/// Fills chunks of `want` bytes from `source` into buffers of `window`
/// (new ones while it has room, else those the writer hands back through
/// `free`; never more from the budget) and hands each to the writer, then
/// [`Chunk::Done`](stream::Chunk::Done). Returns the CRC64/NVME of the
/// bytes (base64, as S3 writes it) when `sums.crc`. Where the backend
/// stored a checksum of them all, the bytes must match it before `Done`
/// goes: a mismatch ends the transfer without its final message.
async fn fill_chunks(
    job: &Job,
    mut window: Window,
    mut source: Source,
    want: usize,
    sums: Wanted,
    writer: std::sync::mpsc::Sender<stream::Chunk>,
    free: &mut tokio::sync::mpsc::UnboundedReceiver<RegBuf>,
) -> Result<Option<String>, Fill> {
    let rdma = &job.rdma;
    let mut hasher = hasher_for(&sums);
    for (offset, n) in spans(want, rdma.chunk_bytes()) {
        let buf = match free.try_recv() {
            Ok(buf) => buf,
            Err(_) if window.left() > 0 => {
                let rdma = rdma.clone();
                let (back, taken) = job
                    .blocking(move || {
                        let taken = rdma.take(&mut window);
                        (window, taken)
                    })
                    .await
                    .map_err(Fill::Failed)?;
                window = back;
                taken.map_err(Fill::NoBuffer)?
            }
            Err(_) => free.recv().await.ok_or(Fill::WriterGone)?,
        };
        let (got, buf, rest) = fill_one(job, source, buf, offset, n).await?;
        source = rest;
        if let Err(e) = got {
            rdma.give_back(buf);
            return Err(Fill::Failed(e));
        }
        if let Some(hasher) = &mut hasher {
            hasher.update(&buf.bytes()[..n]);
        }
        let data = stream::Chunk::Data {
            buf,
            offset: offset as u64,
            len: n,
        };
        if let Err(back) = writer.send(data) {
            if let stream::Chunk::Data { buf, .. } = back.0 {
                rdma.give_back(buf);
            }
            return Err(Fill::WriterGone);
        }
    }
    let crc = verdict(&sums, hasher)?;
    writer
        .send(stream::Chunk::Done)
        .map_err(|_| Fill::WriterGone)?;
    Ok(crc)
}

/// What a GET moves, to whom and for whom: its writer's token and label.
struct Getting {
    token: Token,
    /// The bytes it moves, as the token counts them and as this machine
    /// does.
    len: u64,
    want: usize,
    /// `bucket/key`.
    what: String,
    source: Option<IpAddr>,
    principal: String,
    arrived: Instant,
}

impl Getting {
    fn label(&self) -> Label<'_> {
        Label {
            op: "GET",
            object: &self.what,
            source: self.source,
            principal: &self.principal,
            arrived: self.arrived,
        }
    }
}

/// How a GET ended: its writer's outcome (or why its thread failed), and
/// the verdict on its bytes (their CRC64/NVME when asked).
type Got = (
    Result<Result<(), Failure>, String>,
    Result<Option<String>, Fill>,
);

/// The bytes at `first` of a file `total` bytes long: a backend's answer.
#[derive(Clone)]
struct FileSpan {
    file: Arc<std::fs::File>,
    first: u64,
    total: u64,
}

impl FileSpan {
    /// Reads `out.len()` bytes at `offset` of the answer; the file must be
    /// `total` bytes long (looked at unless `checked`: a file changed in
    /// place behind the backend's back fails the request).
    fn read(&self, checked: bool, offset: usize, out: &mut [u8]) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        if !checked {
            let now = self.file.metadata().map_err(|e| e.to_string())?.len();
            if now != self.total {
                return Err(format!(
                    "the object's file is {now} bytes, the backend said {}: it changed \
                     meanwhile",
                    self.total
                ));
            }
        }
        self.file
            .read_exact_at(out, self.first + offset as u64)
            .map_err(|e| format!("reading the object's file: {e}"))
    }
}

/// A GET of at most one chunk from a file, whole in one blocking call:
/// the buffer reserved, the token proven, the chunk read, checked and
/// WRITTEN, the final message sent, all on the writer's thread
/// ([`OneChunk`]). The hand-offs between threads of [`get_in_chunks`]
/// cost a small GET more than its bytes do (`benches/small_gets.rs`).
async fn get_in_one(job: &Job, getting: Getting, span: FileSpan, sums: Wanted) -> S3Result<Got> {
    let rdma = job.rdma.clone();
    let (written, filled) = job
        .blocking(move || {
            let want = getting.want;
            let chunks = get_chunks(want, rdma.chunk_bytes());
            // The transfer's whole share of the budget before the writer
            // proves the token, as in chunks.
            let mut window = rdma.reserve(want, chunks, chunks)?;
            let buf = match chunks {
                0 => None,
                _ => Some(rdma.take(&mut window)?),
            };
            let mut one = OneChunk {
                rdma: &rdma,
                span: &span,
                want,
                sums: &sums,
                buf,
                out: None,
            };
            let label = getting.label();
            let written =
                stream::write_chunks(&rdma, &getting.token, getting.len, &label, &mut one);
            // Never handed over: the writer failed before.
            if let Some(buf) = one.buf.take() {
                rdma.give_back(buf);
            }
            Ok((written, one.out.unwrap_or(Err(Fill::WriterGone))))
        })
        .await
        .map_err(failed)?
        .map_err(take_failed)?;
    Ok((Ok(written), filled))
}

/// A GET in chunks: its writer on a blocking thread ([`stream::Handed`]),
/// fed by this task from `feed` while it WRITEs, a chunk ahead.
async fn get_in_chunks(
    job: &Job,
    getting: Getting,
    feed: Feed,
    bytes_from: Source,
    sums: Wanted,
) -> Got {
    let want = getting.want;
    let (chunk_tx, chunk_rx) = std::sync::mpsc::channel();
    let (free_tx, mut free_rx) = tokio::sync::mpsc::unbounded_channel();
    let rdma = job.rdma.clone();
    let writing = job.blocking(move || {
        let mut handed = stream::Handed {
            chunks: &chunk_rx,
            free: &free_tx,
            rdma: &rdma,
        };
        let label = getting.label();
        stream::write_chunks(&rdma, &getting.token, getting.len, &label, &mut handed)
    });
    let filling = async {
        match feed {
            Feed::Chunks(window) => {
                fill_chunks(job, window, bytes_from, want, sums, chunk_tx, &mut free_rx).await
            }
            Feed::Pinned {
                pinned,
                at,
                whole_crc,
            } => feed_pinned(job, pinned, at, want, sums.crc, whole_crc, chunk_tx).await,
        }
    };
    let got = tokio::join!(writing, filling);
    // Buffers the writer handed back: to the pool.
    free_rx.close();
    while let Ok(buf) = free_rx.try_recv() {
        job.rdma.give_back(buf);
    }
    got
}

/// The hasher a GET's bytes go through, if `sums` asks for one.
fn hasher_for(sums: &Wanted) -> Option<s3s::checksum::ChecksumHasher> {
    (sums.crc || sums.stored.is_some()).then(|| Stored::hasher(sums.stored.as_ref(), sums.crc))
}

/// The verdict on a GET's bytes, all through `hasher` ([`hasher_for`]):
/// [`Fill::Corrupt`] where they do not match the checksum the backend
/// stored with them; else their CRC64/NVME (base64) when `sums.crc`.
fn verdict(
    sums: &Wanted,
    hasher: Option<s3s::checksum::ChecksumHasher>,
) -> Result<Option<String>, Fill> {
    let computed = hasher.map(|h| h.finalize());
    if let (Some(stored), Some(computed)) = (&sums.stored, &computed) {
        let read = stored.read(computed).cloned().unwrap_or_default();
        if read != stored.value {
            return Err(Fill::Corrupt {
                header: stored.header,
                stored: stored.value.clone(),
                read,
            });
        }
    }
    Ok(computed
        .filter(|_| sums.crc)
        .and_then(|c| c.checksum_crc64nvme))
}

/// A GET of at most one chunk from a file, as its writer's
/// [`Supply`](stream::Supply), on the writer's thread: the chunk is read
/// into its buffer once the token is proven and handed over only if its
/// bytes match the checksum the backend stored, as the
/// [`Last`](stream::Chunk::Last) one (its verdict given, the final message
/// goes right behind its WRITE); an empty object's is
/// [`Done`](stream::Chunk::Done).
struct OneChunk<'a> {
    rdma: &'a Rdma,
    /// The file the backend answered from.
    span: &'a FileSpan,
    /// The chunk's length (0: an empty object, no buffer).
    want: usize,
    sums: &'a Wanted,
    /// The chunk's buffer, until handed over.
    buf: Option<RegBuf>,
    /// The bytes' verdict ([`verdict`]), once read.
    out: Option<Result<Option<String>, Fill>>,
}

impl stream::Supply for OneChunk<'_> {
    fn next(
        &mut self,
        _: std::time::Duration,
    ) -> Result<stream::Chunk, std::sync::mpsc::RecvTimeoutError> {
        use std::sync::mpsc::RecvTimeoutError::Disconnected;
        if self.out.is_some() {
            // Never asked again after `Last` or an error.
            return Err(Disconnected);
        }
        let mut hasher = hasher_for(self.sums);
        let chunk = match self.buf.take() {
            None => None,
            Some(mut buf) => {
                let out = &mut buf.bytes_mut()[..self.want];
                if let Err(e) = self.span.read(false, 0, out) {
                    self.rdma.give_back(buf);
                    self.out = Some(Err(Fill::Failed(e)));
                    return Err(Disconnected);
                }
                if let Some(hasher) = &mut hasher {
                    hasher.update(&buf.bytes()[..self.want]);
                }
                Some(buf)
            }
        };
        match verdict(self.sums, hasher) {
            Err(corrupt) => {
                if let Some(buf) = chunk {
                    self.rdma.give_back(buf);
                }
                self.out = Some(Err(corrupt));
                Err(Disconnected)
            }
            Ok(crc) => {
                self.out = Some(Ok(crc));
                Ok(match chunk {
                    Some(buf) => stream::Chunk::Last {
                        buf,
                        offset: 0,
                        len: self.want,
                    },
                    None => stream::Chunk::Done,
                })
            }
        }
    }

    fn written(&mut self, buf: RegBuf) {
        self.rdma.give_back(buf);
    }
}

/// The least length of a range from an object's first byte that an RDMA
/// GET asks of the backend as the whole object ([`RdmaS3::get_for_rdma`]).
const WHOLE_FROM: u64 = 1 << 20;

/// Where a GET's chunks come from.
enum Feed {
    /// Buffers of the budget (this window of it), filled from the answer.
    Chunks(Window),
    /// A cached object's registered bytes, from `at` on; their CRC64/NVME
    /// when the GET is of the whole object.
    Pinned {
        pinned: Arc<crate::gateway::rdma::Pinned>,
        at: usize,
        whole_crc: Option<String>,
    },
}

/// Hands the writer `want` bytes of `pinned` from `at`, in the chunks
/// [`fill_chunks`] would make, then [`Chunk::Done`](stream::Chunk::Done).
/// Returns the CRC64/NVME of the bytes (base64) when `crc`: the entry's
/// own for the whole object, else computed over them in place.
async fn feed_pinned(
    job: &Job,
    pinned: Arc<crate::gateway::rdma::Pinned>,
    at: usize,
    want: usize,
    crc: bool,
    whole_crc: Option<String>,
    writer: std::sync::mpsc::Sender<stream::Chunk>,
) -> Result<Option<String>, Fill> {
    for (offset, n) in spans(want, job.rdma.chunk_bytes()) {
        writer
            .send(stream::Chunk::Pinned {
                pinned: Arc::clone(&pinned),
                at: at + offset,
                offset: offset as u64,
                len: n,
            })
            .map_err(|_| Fill::WriterGone)?;
    }
    let sum = match (crc, whole_crc) {
        (false, _) => None,
        (true, Some(whole)) => Some(whole),
        (true, None) => {
            let pinned = Arc::clone(&pinned);
            Some(
                job.blocking(move || pinned.crc64nvme(at, want))
                    .await
                    .map_err(Fill::Failed)?,
            )
        }
    };
    writer
        .send(stream::Chunk::Done)
        .map_err(|_| Fill::WriterGone)?;
    Ok(sum)
}

/// A chunk filled, how, and where the next one comes from.
type Filled = (Result<(), String>, RegBuf, Source);

/// Fills the first `n` bytes of `buf` with the bytes at `offset` of the
/// answer.
async fn fill_one(
    job: &Job,
    source: Source,
    mut buf: RegBuf,
    offset: usize,
    n: usize,
) -> Result<Filled, Fill> {
    match source {
        Source::File { span, checked } => {
            let read = span.clone();
            let (got, buf) = job
                .blocking(move || {
                    let out = &mut buf.bytes_mut()[..n];
                    let got = read.read(checked, offset, out);
                    (got, buf)
                })
                .await
                .map_err(Fill::Failed)?;
            let rest = Source::File {
                checked: checked || got.is_ok(),
                span,
            };
            Ok((got, buf, rest))
        }
        Source::Body {
            mut body,
            mut pending,
        } => {
            let out = &mut buf.bytes_mut()[..n];
            let mut filled = 0;
            let mut got = Ok(());
            while filled < n {
                if pending.is_empty() {
                    match body.next().await {
                        Some(Ok(piece)) => pending = piece,
                        Some(Err(e)) => {
                            got = Err(e.to_string());
                            break;
                        }
                        None => {
                            got = Err(format!("the object ended after {} bytes", offset + filled));
                            break;
                        }
                    }
                }
                let k = pending.len().min(n - filled);
                out[filled..filled + k].copy_from_slice(&pending[..k]);
                pending = pending.slice(k..);
                filled += k;
            }
            Ok((got, buf, Source::Body { body, pending }))
        }
    }
}

/// Runs a blocking call off the async workers (through [`Job::blocking`],
/// which holds the request's place while it runs).
async fn blocking<T, F>(f: F) -> Result<T, String>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the transfer's thread failed: {e}"))
}

/// `e` answered with `x-amz-rdma-reply: status`.
fn with_reply(mut e: S3Error, status: u16) -> S3Error {
    let mut headers = HeaderMap::new();
    // The error's headers replace the response's: keep its content type.
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/xml"));
    headers.insert(REPLY, HeaderValue::from(status));
    e.set_headers(headers);
    e
}

/// A backend error, with its own status as `x-amz-rdma-reply`, marked as
/// the backend's ([`CAUSE`]: logged and counted as the store's answer, not
/// as RDMA's refusal, whatever its status).
fn echo_status(e: S3Error) -> S3Error {
    let status = e.status_code().map_or(500, |s| s.as_u16());
    let mut e = with_reply(e, status);
    let mut headers = e.headers().cloned().unwrap_or_default();
    headers.insert(CAUSE, HeaderValue::from_static("backend"));
    e.set_headers(headers);
    e
}

/// A failed transfer: 500 InternalError, `x-amz-rdma-reply: 500`.
fn failed(why: String) -> S3Error {
    with_reply(s3_error!(InternalError, "{why}"), 500)
}

/// No buffer for the transfer: declined (501), no room (503), or failed
/// (500).
fn take_failed(e: TakeError) -> S3Error {
    let why = match &e {
        TakeError::TooLarge(why) | TakeError::Busy(why) | TakeError::Failed(why) => why,
    };
    eprintln!("hipobj-s3-server: no buffer for an RDMA transfer: {why}");
    match e {
        TakeError::TooLarge(why) => declined(&why),
        TakeError::Busy(why) => slow_down(&why),
        TakeError::Failed(why) => failed(why),
    }
}

/// A failed transfer: 500, or 503 when the server has no connection to
/// spare, or 501 when it may not connect.
fn transfer_failed(f: Failure) -> S3Error {
    match f {
        Failure::Declined(why) => declined(&why),
        Failure::Busy(why) => slow_down(&why),
        Failure::Failed(why) => failed(format!("RDMA transfer failed: {why}")),
    }
}

/// Too many RDMA requests in progress: 503 SlowDown, `x-amz-rdma-reply:
/// 503` (the client retries later, or falls back to HTTP).
fn slow_down(why: &str) -> S3Error {
    with_reply(s3_error!(SlowDown, "{why}"), 503)
}

/// A declined token: 501 NotImplemented, `x-amz-rdma-reply: 501`.
fn declined(why: &str) -> S3Error {
    with_reply(s3_error!(NotImplemented, "{TOKEN} declined: {why}"), 501)
}

/// `bucket/key`.
fn object(bucket: &str, key: &str) -> String {
    format!("{bucket}/{key}")
}

/// The `S3` implementation: the operations with an RDMA path, then every
/// other operation s3s-fs implements, delegated after the region check.
macro_rules! rdma_s3 {
    ($($op:ident: $input:ident => $output:ident;)*) => {
        #[async_trait::async_trait]
        impl S3 for RdmaS3 {
            async fn get_object(
                &self,
                req: S3Request<GetObjectInput>,
            ) -> S3Result<S3Response<GetObjectOutput>> {
                self.check_region(&req)?;
                let what = object(&req.input.bucket, &req.input.key);
                match self.ask(&req, &format!("GET {what}")) {
                    Ask::Plain => self.backend_get(req).await,
                    Ask::Decline(_) => match self.backend_get(req).await {
                        Ok(mut resp) => {
                            resp.headers.insert(REPLY, HeaderValue::from(501u16));
                            Ok(resp)
                        }
                        Err(e) => Err(with_reply(e, 501)),
                    },
                    Ask::Busy(why) => Err(slow_down(&why)),
                    Ask::Rdma(job) => self.get_by_rdma(req, job, what).await,
                }
            }

            async fn put_object(
                &self,
                req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                self.check_region(&req)?;
                let what = object(&req.input.bucket, &req.input.key);
                let job = match self.ask(&req, &format!("PUT {what}")) {
                    Ask::Plain => return self.backend.put_object(req).await,
                    Ask::Decline(why) => return Err(declined(&why)),
                    Ask::Busy(why) => return Err(slow_down(&why)),
                    Ask::Rdma(job) => job,
                };
                let backend = &self.backend;
                self.put_by_rdma(req, job, what, |req| backend.put_object(req)).await
            }

            async fn upload_part(
                &self,
                req: S3Request<UploadPartInput>,
            ) -> S3Result<S3Response<UploadPartOutput>> {
                self.check_region(&req)?;
                let what = format!(
                    "{} part {}",
                    object(&req.input.bucket, &req.input.key),
                    req.input.part_number
                );
                let job = match self.ask(&req, &format!("PUT {what}")) {
                    Ask::Plain => return self.backend.upload_part(req).await,
                    Ask::Decline(why) => return Err(declined(&why)),
                    Ask::Busy(why) => return Err(slow_down(&why)),
                    Ask::Rdma(job) => job,
                };
                let backend = &self.backend;
                self.put_by_rdma(req, job, what, |req| backend.upload_part(req)).await
            }

            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.check_region(&req)?;
                    self.backend.$op(req).await
                }
            )*
        }
    };
}

rdma_s3! {
    create_bucket: CreateBucketInput => CreateBucketOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
    list_object_versions: ListObjectVersionsInput => ListObjectVersionsOutput;
    get_object_attributes: GetObjectAttributesInput => GetObjectAttributesOutput;
    get_object_tagging: GetObjectTaggingInput => GetObjectTaggingOutput;
    put_object_tagging: PutObjectTaggingInput => PutObjectTaggingOutput;
    delete_object_tagging: DeleteObjectTaggingInput => DeleteObjectTaggingOutput;
    get_bucket_versioning: GetBucketVersioningInput => GetBucketVersioningOutput;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::testing::world::{World, CLIENT_IP, CLIENT_NIC, SERVER_NIC};

    use super::*;
    use crate::gateway::rdma::Limits;

    #[test]
    fn a_file_is_read_at_its_offset_and_refused_once_it_changed() {
        let dir = std::env::temp_dir().join(format!("hipobj-s3-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("object");
        let bytes: Vec<u8> = (0..=255).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let span = |first, total| FileSpan {
            file: Arc::clone(&file),
            first,
            total,
        };
        // Another version renamed over the path: the open file is still
        // the one answered for.
        std::fs::write(dir.join("other"), [0u8; 256]).unwrap();
        std::fs::rename(dir.join("other"), &path).unwrap();
        let mut out = [0u8; 16];
        span(100, 256).read(false, 0, &mut out).expect("read");
        assert_eq!(out[..], bytes[100..116]);
        span(100, 256)
            .read(true, 16, &mut out)
            .expect("the next chunk");
        assert_eq!(out[..], bytes[116..132]);
        let changed = span(0, 300).read(false, 0, &mut out).unwrap_err();
        assert!(changed.contains("changed meanwhile"), "{changed}");
        assert!(
            span(250, 256).read(true, 0, &mut out).is_err(),
            "past the end"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Copies the first `out.len()` bytes of `body` into `out`; returns how
    /// many there were.
    async fn fill(body: &mut StreamingBlob, out: &mut [u8]) -> Result<usize, String> {
        let mut filled = 0;
        while filled < out.len() {
            match body.next().await {
                Some(Ok(chunk)) => {
                    let n = chunk.len().min(out.len() - filled);
                    out[filled..filled + n].copy_from_slice(&chunk[..n]);
                    filled += n;
                }
                Some(Err(e)) => return Err(e.to_string()),
                None => break,
            }
        }
        Ok(filled)
    }

    /// A bound no answer that comes "at once" gets near, far below the
    /// deadlines the slow requests have.
    const AT_ONCE: Duration = Duration::from_secs(20);
    const BUCKET: &str = "bucket";

    fn request<T>(input: T, method: http::Method, token: Option<&str>) -> S3Request<T> {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            headers.insert(TOKEN, HeaderValue::from_str(token).unwrap());
        }
        let mut extensions = http::Extensions::new();
        extensions.insert(Peer(SocketAddr::new(IpAddr::V4(CLIENT_IP), 40_000)));
        S3Request {
            input,
            method,
            uri: http::Uri::from_static("/"),
            headers,
            extensions,
            credentials: Some(s3s::auth::Credentials {
                access_key: "tenant".to_owned(),
                secret_key: "secret".into(),
            }),
            region: None,
            service: None,
            trailing_headers: None,
        }
    }

    fn get(key: &str, token: Option<&str>) -> S3Request<GetObjectInput> {
        let input = GetObjectInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            ..GetObjectInput::default()
        };
        request(input, http::Method::GET, token)
    }

    fn put(key: &str, data: &[u8], token: Option<&str>) -> S3Request<PutObjectInput> {
        let input = PutObjectInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            content_length: i64::try_from(data.len()).ok(),
            body: Some(StreamingBlob::from(s3s::Body::from(
                Bytes::copy_from_slice(data),
            ))),
            ..PutObjectInput::default()
        };
        request(input, http::Method::PUT, token)
    }

    /// A token of `length` bytes naming a client QP behind the client's
    /// `port` on the fake fabric, as the header carries it.
    fn token(port: u16, length: u64) -> String {
        let mut gid = [0u8; 16];
        gid[10..12].copy_from_slice(&[0xff, 0xff]);
        gid[12..].copy_from_slice(&CLIENT_IP.octets());
        let token = Token {
            transport: Transport::RcCm,
            qp_num: 17,
            gid,
            rkey: 0x1234,
            addr: 0x7f00_0000_0000,
            length,
            port: 0,
            lid: port,
            secret: 0x005e_c2e7,
        };
        String::from_utf8(token.to_hex().to_vec()).unwrap()
    }

    /// The S3 server over a fresh root, with RDMA on the fake fabric's
    /// server device within `limits`.
    struct Fake {
        world: World,
        rdma: Arc<Rdma>,
        s3: Arc<RdmaS3>,
        root: std::path::PathBuf,
    }

    impl Fake {
        fn new(name: &str, limits: Limits, timeout: Duration) -> Fake {
            let world = World::new();
            let fabric = &world.platform.fabric;
            let ctx = fabric.verbs(&[SERVER_NIC]).open(SERVER_NIC).unwrap();
            let rdma = Rdma::on(
                fabric.cm(&[SERVER_NIC]),
                ctx,
                timeout,
                Duration::ZERO,
                limits,
            );
            let rdma = Arc::new(rdma.expect("RDMA on the fake server device"));
            let dir = format!("hipobj-s3-{name}-{}", std::process::id());
            let root = std::env::temp_dir().join(dir);
            std::fs::create_dir_all(root.join(BUCKET)).unwrap();
            let s3 = Arc::new(RdmaS3::new(
                Arc::new(crate::gateway::local::Local::open(&root).unwrap()),
                Ok(rdma.clone()),
                "us-east-1".to_owned(),
            ));
            Fake {
                world,
                rdma,
                s3,
                root,
            }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// A plain PUT, then a plain GET of it, each answered well within
    /// [`AT_ONCE`].
    async fn plain_put_and_get(s3: &RdmaS3, key: &str, data: &[u8]) {
        tokio::time::timeout(AT_ONCE, s3.put_object(put(key, data, None)))
            .await
            .expect("a plain PUT was answered in time")
            .expect("a plain PUT");
        let got = tokio::time::timeout(AT_ONCE, s3.get_object(get(key, None)))
            .await
            .expect("a plain GET was answered in time")
            .expect("a plain GET");
        let mut body = got.output.body.expect("a body");
        let mut back = vec![0u8; data.len()];
        assert_eq!(fill(&mut body, &mut back).await, Ok(data.len()));
        assert_eq!(back, data);
    }

    /// The next answer of `answers`, within [`AT_ONCE`]: an error.
    async fn refused(
        answers: &mut tokio::sync::mpsc::UnboundedReceiver<S3Result<()>>,
        what: &str,
    ) -> S3Error {
        let answer = tokio::time::timeout(AT_ONCE, answers.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer in {AT_ONCE:?}"))
            .expect("the requests' channel is open");
        answer.expect_err(what)
    }

    /// Requests whose client's RDMA CM never answers hold their places
    /// until their deadline: at most `--rdma-max-requests` of them run,
    /// the others are answered 503 at once, and plain S3 goes on, on a
    /// blocking pool only two threads larger than that cap.
    #[test]
    fn rdma_requests_past_the_cap_get_503_at_once_and_plain_s3_goes_on() {
        const CAP: usize = 3;
        const PAST: usize = 3;
        let slow = Duration::from_secs(120);
        let limits = Limits {
            allow: Vec::new(),
            max_bytes: 1 << 20,
            memory_bytes: 4 << 20,
            max_connections: 64,
            max_connections_per_client: 64,
            max_requests: CAP,
            connect_timeout: Some(slow),
            chunk_bytes: 1 << 20,
            chunks: 2,
            backend_timeout: slow,
        };
        let fake = Fake::new("cap", limits, slow);
        let (s3, rdma) = (fake.s3.clone(), fake.rdma.clone());
        // The client: a CM listener on its address that nobody answers.
        let listener = fake
            .world
            .platform
            .fabric
            .cm(&[CLIENT_NIC])
            .listen(SocketAddr::new(IpAddr::V4(CLIENT_IP), 0))
            .expect("the client's listener");
        let token = token(listener.port(), 4096);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(CAP + 2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let object: Vec<u8> = (0..4096u32).map(|i| i.to_le_bytes()[0]).collect();
            plain_put_and_get(&s3, "object", &object).await;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for _ in 0..CAP + PAST {
                let (s3, tx, token) = (s3.clone(), tx.clone(), token.clone());
                tokio::spawn(async move {
                    let answer = s3.get_object(get("object", Some(&token))).await;
                    let _ = tx.send(answer.map(|_| ()));
                });
            }
            for _ in 0..PAST {
                let e = refused(&mut rx, "a request past the cap was answered at once").await;
                assert_eq!(*e.code(), s3s::S3ErrorCode::SlowDown, "{e:?}");
                let reply = e.headers().and_then(|h| h.get(REPLY)).cloned();
                assert_eq!(reply, Some(HeaderValue::from(503u16)));
            }
            assert_eq!(rdma.requests_in_progress(), CAP);
            plain_put_and_get(&s3, "meanwhile", b"plain bytes").await;
            assert!(rx.try_recv().is_err(), "the silent client's requests wait");
            // The client's CM goes away: its connect requests are rejected.
            drop(listener);
            for _ in 0..CAP {
                let e = refused(&mut rx, "a request ended once its dial did").await;
                assert_eq!(*e.code(), s3s::S3ErrorCode::InternalError, "{e:?}");
            }
        });
        assert_eq!(rdma.requests_in_progress(), 0, "every place given back");
    }

    /// A token longer than `--rdma-max-bytes` is declined naming it, and
    /// the server's budget is untouched.
    /// Two tokens in one request: the server serves neither (which buffer
    /// the client meant is not its to pick) and declines, naming why,
    /// with nothing reserved and nothing stored.
    #[test]
    fn a_request_with_two_tokens_is_declined_naming_it() {
        use crate::gateway::cli::tests::{args, required};
        let o = crate::gateway::cli::parse(&args(&required()))
            .unwrap()
            .unwrap();
        let fake = Fake::new("twice", o.limits(), o.rdma_timeout);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let one = token(4791, 4096);
        let mut twice = put("twice", b"", Some(&one));
        twice
            .headers
            .append(TOKEN, HeaderValue::from_str(&token(4792, 4096)).unwrap());
        let answer = runtime.block_on(fake.s3.put_object(twice));
        assert_put_declined(
            &fake,
            answer,
            "twice",
            "x-amz-rdma-token is given 2 times: a request names one buffer",
        );
    }

    /// `answer` to the PUT of `key` is a decline (501) naming `why`, with
    /// nothing reserved, nothing in progress and nothing stored.
    fn assert_put_declined(
        fake: &Fake,
        answer: S3Result<S3Response<PutObjectOutput>>,
        key: &str,
        why: &str,
    ) {
        let e = answer.expect_err("declined");
        assert_eq!(*e.code(), s3s::S3ErrorCode::NotImplemented, "{e:?}");
        let said = e.message().unwrap_or_default();
        assert!(said.contains(why), "{said}");
        assert_eq!(fake.rdma.memory_in_use(), 0);
        assert_eq!(fake.rdma.requests_in_progress(), 0);
        assert!(!fake.root.join(BUCKET).join(key).exists());
    }

    #[test]
    fn a_token_longer_than_rdma_max_bytes_is_declined_naming_it() {
        use crate::gateway::cli::tests::{args, required};
        let mut list = required();
        list.extend([
            "--rdma-memory-bytes",
            "1048576",
            "--rdma-max-bytes",
            "1048576",
        ]);
        let o = crate::gateway::cli::parse(&args(&list)).unwrap().unwrap();
        let fake = Fake::new("max", o.limits(), o.rdma_timeout);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let long = token(4791, 2 << 20);
        let answer = runtime.block_on(fake.s3.put_object(put("long", b"", Some(&long))));
        assert_put_declined(
            &fake,
            answer,
            "long",
            "2097152 bytes is more than --rdma-max-bytes 1048576",
        );
    }

    /// Limits whose memory budget is smaller than the objects below: a
    /// transfer fits only because it moves in chunks.
    fn small_budget() -> Limits {
        Limits {
            allow: Vec::new(),
            max_bytes: 1 << 30,
            memory_bytes: 16 << 10,
            max_connections: 64,
            max_connections_per_client: 64,
            max_requests: 8,
            connect_timeout: Some(Duration::from_secs(5)),
            chunk_bytes: 4096,
            chunks: 2,
            backend_timeout: Duration::from_secs(5),
        }
    }

    /// A client instance on the fake world's client device with a host
    /// buffer of `len` bytes (filled with `fill`), registered.
    fn client(world: &World, len: usize, fill: u8) -> (crate::core::Current, Box<[u8]>) {
        use crate::core::args::BufferRange;
        let current = crate::core::Current::new();
        let config = crate::core::Config {
            gpu_device: 0,
            ..crate::core::Config::default()
        };
        current
            .init_with(world.platform(), config, crate::core::Options::default())
            .expect("init on the fake platform");
        let buf = vec![fill; len].into_boxed_slice();
        current
            .instance()
            .unwrap()
            .register(
                BufferRange::new(buf.as_ptr().expose_provenance(), len).unwrap(),
                true,
            )
            .expect("client buffer registered");
        (current, buf)
    }

    /// One transfer of the client's whole buffer in `direction`, its S3
    /// request made by `request` from the token's header value and sent
    /// to the gateway; returns the gateway's answer (headers, or error).
    fn transfer<O: Send + 'static>(
        current: &crate::core::Current,
        buf: &[u8],
        direction: crate::core::args::Direction,
        mut request: impl FnMut(String) -> S3Result<S3Response<O>>,
    ) -> (crate::core::Result<()>, Option<S3Result<HeaderMap>>) {
        use crate::core::args::Slice;
        let slice = Slice::new(buf.as_ptr().expose_provenance(), buf.len(), 0).unwrap();
        let mut answer = None;
        let mut s3 = crate::testing::world::Scripted::new(|t: &Token| {
            let header = String::from_utf8(t.to_hex().to_vec()).unwrap();
            let got = request(header);
            let reply = match &got {
                Ok(resp) => resp.headers.get(REPLY).cloned(),
                Err(e) => e.headers().and_then(|h| h.get(REPLY)).cloned(),
            };
            answer = Some(got.map(|r| r.headers));
            reply.map_or(b"500".to_vec(), |r| r.as_bytes().to_vec())
        });
        let moved = current
            .instance()
            .unwrap()
            .transfer(direction, slice, &mut s3);
        (moved, answer)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// An object longer than the memory budget is written to the client
    /// in chunks, whole and byte for byte, and so is a range of it; asked
    /// for checksums, the reply carries the CRC64/NVME of the bytes
    /// written (pinned by the standard check value of "123456789").
    #[test]
    fn a_get_longer_than_the_budget_moves_in_chunks_with_the_crc_of_its_bytes() {
        use crate::core::args::Direction;
        let fake = Fake::new("chunks-get", small_budget(), Duration::from_secs(10));
        let rt = runtime();
        let object: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        rt.block_on(plain_put_and_get(&fake.s3, "big", &object));
        rt.block_on(plain_put_and_get(&fake.s3, "check", b"123456789"));
        let (current, buf) = client(&fake.world, 64 << 10, 0xee);
        let (moved, answer) = transfer(&current, &buf, Direction::Get, |token| {
            let mut req = get("big", Some(&token));
            req.headers
                .insert("x-amz-checksum-mode", HeaderValue::from_static("ENABLED"));
            rt.block_on(fake.s3.get_object(req))
        });
        moved.expect("the GET");
        let headers = answer.unwrap().expect("answered 200");
        assert_eq!(headers.get(BYTES).unwrap(), "50000");
        assert_eq!(&buf[..object.len()], &object[..], "byte for byte");
        assert!(
            buf[object.len()..].iter().all(|&b| b == 0xee),
            "past the object"
        );
        let mut crc = s3s::checksum::ChecksumHasher {
            crc64nvme: Some(Default::default()),
            ..Default::default()
        };
        crc.update(&object);
        let crc = crc.finalize().checksum_crc64nvme.unwrap();
        assert_eq!(headers.get(RDMA_CRC64NVME).unwrap().to_str().unwrap(), crc);
        // The check value.
        let (moved, answer) = transfer(&current, &buf, Direction::Get, |token| {
            let mut req = get("check", Some(&token));
            req.headers
                .insert("x-amz-checksum-mode", HeaderValue::from_static("enabled"));
            rt.block_on(fake.s3.get_object(req))
        });
        moved.expect("the GET");
        let headers = answer.unwrap().expect("answered 200");
        assert_eq!(headers.get(RDMA_CRC64NVME).unwrap(), "rosUhgp5mIg=");
        let first_bytes = crate::gateway::metrics::render(None);
        assert!(
            first_bytes.lines().any(|l| l
                .starts_with("hipobj_s3_rdma_get_first_byte_seconds_count ")
                && !l.ends_with(" 0")),
            "{first_bytes}"
        );
        // A range, and no checksum unasked.
        let (moved, answer) = transfer(&current, &buf, Direction::Get, |token| {
            let mut req = get("big", Some(&token));
            req.input.range = Some(Range::Int {
                first: 1000,
                last: Some(30_999),
            });
            rt.block_on(fake.s3.get_object(req))
        });
        moved.expect("the ranged GET");
        let headers = answer.unwrap().expect("answered 206");
        assert_eq!(headers.get(REPLY).unwrap(), "206");
        assert_eq!(&buf[..30_000], &object[1000..31_000]);
        assert!(headers.get(RDMA_CRC64NVME).is_none());
        assert_eq!(fake.rdma.memory_in_use(), 0, "every chunk given back");
        assert_eq!(fake.rdma.requests_in_progress(), 0);
    }

    /// A whole object's bytes are checked, on their way to the client,
    /// against the checksum the backend stored with them: bytes that went
    /// bad in the store fail the GET (no final message), naming the header
    /// and both values. A range cannot be checked and moves as it is.
    #[test]
    fn a_get_of_bytes_that_do_not_match_the_stored_checksum_fails() {
        // In chunks (4 KiB each), and in one: the two ways a GET moves.
        for len in [20_000, 3_000] {
            a_get_of_bytes_that_do_not_match_the_stored_checksum_fails_at(len);
        }
    }

    fn a_get_of_bytes_that_do_not_match_the_stored_checksum_fails_at(len: usize) {
        use crate::core::args::Direction;
        let fake = Fake::new(
            &format!("stored-sum-{len}"),
            small_budget(),
            Duration::from_secs(10),
        );
        let rt = runtime();
        let object: Vec<u8> = (0..len).map(|i| (i * 13 % 241).to_le_bytes()[0]).collect();
        let mut crc = s3s::checksum::ChecksumHasher {
            crc32c: Some(Default::default()),
            ..Default::default()
        };
        crc.update(&object);
        let mut req = put("kept", &object, None);
        req.input.checksum_crc32c = crc.finalize().checksum_crc32c;
        rt.block_on(fake.s3.put_object(req))
            .expect("stored with its CRC32C");
        let (current, buf) = client(&fake.world, 32 << 10, 0x11);
        let (moved, _) = transfer(&current, &buf, Direction::Get, |token| {
            rt.block_on(fake.s3.get_object(get("kept", Some(&token))))
        });
        moved.expect("intact bytes pass the check");
        assert_eq!(&buf[..object.len()], &object[..]);
        // A range from the first byte past the last, as clients ask for a
        // whole object: answered as a range (206).
        let all = |token: &str| {
            let mut req = get("kept", Some(token));
            req.input.range = Some(Range::Int {
                first: 0,
                last: Some(31_999),
            });
            req
        };
        let (moved, answer) = transfer(&current, &buf, Direction::Get, |token| {
            rt.block_on(fake.s3.get_object(all(&token)))
        });
        moved.expect("intact bytes pass the check");
        let headers = answer.unwrap().expect("answered");
        assert_eq!(headers.get(REPLY).unwrap(), "206");
        assert_eq!(headers.get(BYTES).unwrap(), len.to_string().as_str());
        // The store's copy goes bad.
        let path = fake.root.join(BUCKET).join("kept");
        let mut bad = std::fs::read(&path).unwrap();
        bad[len * 3 / 5] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let (moved, answer) = transfer(&current, &buf, Direction::Get, |token| {
            rt.block_on(fake.s3.get_object(get("kept", Some(&token))))
        });
        moved.expect_err("the client is never told the transfer completed");
        let e = answer.unwrap().expect_err("answered 500");
        assert_eq!(*e.code(), s3s::S3ErrorCode::InternalError, "{e:?}");
        let why = e.message().unwrap_or_default();
        assert!(
            why.contains("do not match its x-amz-checksum-crc32c"),
            "{why}"
        );
        let (moved, answer) = transfer(&current, &buf, Direction::Get, |token| {
            rt.block_on(fake.s3.get_object(all(&token)))
        });
        moved.expect_err("a range that is the whole object is checked too");
        let e = answer.unwrap().expect_err("answered 500");
        assert!(
            e.message().unwrap_or_default().contains("do not match"),
            "{e:?}"
        );
        // A range has no checksum of its own.
        let (moved, _) = transfer(&current, &buf, Direction::Get, |token| {
            let mut req = get("kept", Some(&token));
            req.input.range = Some(Range::Int {
                first: len as u64 / 2,
                last: Some(len as u64 * 3 / 4 - 1),
            });
            rt.block_on(fake.s3.get_object(req))
        });
        moved.expect("the ranged GET");
        assert_eq!(&buf[..len / 4], &bad[len / 2..len * 3 / 4]);
        assert_eq!(fake.rdma.memory_in_use(), 0, "every chunk given back");
        assert_eq!(fake.rdma.requests_in_progress(), 0);
    }

    /// A PUT longer than the memory budget is read in chunks and stored
    /// whole when its bytes match the client's checksum; when they do not,
    /// it is answered 400 BadDigest (`x-amz-rdma-reply: 400`) and nothing
    /// is stored: neither a new object nor over an old one.
    #[test]
    fn a_put_is_stored_only_when_its_bytes_match_the_client_s_checksum() {
        use crate::core::args::Direction;
        let fake = Fake::new("chunks-put", small_budget(), Duration::from_secs(10));
        let rt = runtime();
        let (current, buf) = client(&fake.world, 40_000, 0x3c);
        let mut crc = s3s::checksum::ChecksumHasher {
            crc64nvme: Some(Default::default()),
            crc32c: Some(Default::default()),
            ..Default::default()
        };
        crc.update(&buf);
        let right = crc.finalize();
        let wrong = "AAAAAAAAAAA=".to_owned();
        let path = fake.root.join(BUCKET).join("object");
        for (what, crc64, crc32c) in [
            ("a wrong CRC64NVME", Some(wrong.clone()), None),
            ("a wrong CRC32C", None, Some("AAAAAA==".to_owned())),
        ] {
            let (_, answer) = transfer(&current, &buf, Direction::Put, |token| {
                let mut req = put("object", b"", Some(&token));
                req.input.checksum_crc64nvme = crc64.clone();
                req.input.checksum_crc32c = crc32c.clone();
                rt.block_on(fake.s3.put_object(req))
            });
            let e = answer.unwrap().expect_err(what);
            assert_eq!(*e.code(), s3s::S3ErrorCode::BadDigest, "{what}: {e:?}");
            let reply = e.headers().and_then(|h| h.get(REPLY)).cloned();
            assert_eq!(reply, Some(HeaderValue::from(400u16)), "{what}");
            assert!(!path.exists(), "{what}: nothing stored");
        }
        let (moved, answer) = transfer(&current, &buf, Direction::Put, |token| {
            let mut req = put("object", b"", Some(&token));
            req.input.checksum_crc64nvme = right.checksum_crc64nvme.clone();
            req.input.checksum_crc32c = right.checksum_crc32c.clone();
            rt.block_on(fake.s3.put_object(req))
        });
        moved.expect("the PUT");
        answer.unwrap().expect("stored");
        assert_eq!(std::fs::read(&path).unwrap(), &buf[..]);
        // Over the object now: a mismatch leaves it as it was.
        let (other, other_buf) = client(&fake.world, 40_000, 0x77);
        let (_, answer) = transfer(&other, &other_buf, Direction::Put, |token| {
            let mut req = put("object", b"", Some(&token));
            req.input.checksum_crc64nvme = right.checksum_crc64nvme.clone();
            rt.block_on(fake.s3.put_object(req))
        });
        let e = answer
            .unwrap()
            .expect_err("the other bytes' checksum differs");
        assert_eq!(*e.code(), s3s::S3ErrorCode::BadDigest, "{e:?}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            &buf[..],
            "the old object intact"
        );
        assert_eq!(fake.rdma.memory_in_use(), 0, "every chunk given back");
        assert_eq!(fake.rdma.requests_in_progress(), 0);
        drop(other);
    }
}
