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
use std::path::Path;
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
use crate::gateway::range;
use crate::gateway::rdma::{Admission, Failure, Label, Rdma, TakeError};

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

/// Drops a token request's checksums: they describe its empty HTTP body,
/// not the bytes RDMA moved (docs/protocol.md), which the backend would
/// otherwise check them against. PutObject and UploadPart inputs have the
/// same fields by other types.
macro_rules! clear_checksums {
    ($input:expr) => {
        $input.content_md5 = None;
        $input.checksum_algorithm = None;
        $input.checksum_crc32 = None;
        $input.checksum_crc32c = None;
        $input.checksum_crc64nvme = None;
        $input.checksum_sha1 = None;
        $input.checksum_sha256 = None;
    };
}

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

    /// GetObject from the backend, with a suffix range resolved first
    /// (`range::for_backend`).
    async fn backend_get(
        &self,
        mut req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        if let Some(range @ Range::Suffix { .. }) = req.input.range {
            let head = S3Request {
                input: HeadObjectInput {
                    bucket: req.input.bucket.clone(),
                    key: req.input.key.clone(),
                    ..HeadObjectInput::default()
                },
                method: req.method.clone(),
                uri: req.uri.clone(),
                headers: req.headers.clone(),
                extensions: http::Extensions::new(),
                credentials: req.credentials.clone(),
                region: req.region.clone(),
                service: req.service.clone(),
                trailing_headers: None,
            };
            let len = self
                .backend
                .head_object(head)
                .await?
                .output
                .content_length
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| s3_error!(InternalError, "the backend gave no content length"))?;
            req.input.range = Some(range::for_backend(range, len).ok_or_else(|| {
                s3_error!(
                    InvalidRange,
                    "the range selects none of the object's {len} bytes"
                )
            })?);
        }
        self.backend.get_object(req).await
    }

    /// What the request's `x-amz-rdma-token` asks for; a token to serve
    /// takes its place among the RDMA requests in progress. A decline or a
    /// refusal is logged.
    fn ask<T>(&self, req: &S3Request<T>, what: &str) -> Ask {
        let Some(value) = req.headers.get(TOKEN) else {
            return Ask::Plain;
        };
        let source = req.extensions.get::<Peer>().map(|p| p.0.ip());
        // RDMA off first: whatever the token looks like, that is the reason.
        let why = match (&self.rdma, parse_header(value.as_bytes())) {
            (Err(off), _) => format!("RDMA is off ({off})"),
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

    /// GetObject with a usable token.
    async fn get_by_rdma(
        &self,
        req: S3Request<GetObjectInput>,
        job: Job,
        what: String,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let arrived = Instant::now();
        let (token, rdma, source) = (job.token, job.rdma.clone(), job.source);
        let file = self.backend.object_file(&req.input.bucket, &req.input.key);
        let mut resp = self.backend_get(req).await.map_err(echo_status)?;
        let length = resp
            .output
            .content_length
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| failed("the backend gave no content length".into()))?;
        let len = length.min(token.length);
        let want = usize::try_from(len)
            .map_err(|_| failed(format!("{len} bytes do not fit this machine's memory")))?;
        let taken = job
            .blocking({
                let rdma = rdma.clone();
                move || rdma.take(want)
            })
            .await
            .map_err(failed)?;
        let mut buf = match taken {
            Ok(buf) => buf,
            Err(TakeError::TooLarge(why)) => {
                // Declined: the object goes in the body, as without a token.
                eprintln!("hipobj-s3-server: GET {what}: declined {TOKEN}: {why}");
                resp.headers.insert(REPLY, HeaderValue::from(501u16));
                return Ok(resp);
            }
            Err(e) => return Err(take_failed(e)),
        };
        // The backend's body comes in 4 KiB reads, each a trip through the
        // runtime's blocking pool: under load, seconds for a few MiB. The
        // object's file is read in one blocking call instead, where the
        // backend's answer (length, range) says which bytes it holds.
        let (first, total) = span(&resp.output, length);
        let filled = match (file, resp.output.body.take()) {
            (Some(path), _) => {
                let (n, back) = job
                    .blocking(move || {
                        let n = read_file(&path, first, total, &mut buf.bytes_mut()[..want]);
                        (n, buf)
                    })
                    .await
                    .map_err(failed)?;
                buf = back;
                n
            }
            (None, Some(mut body)) => fill(&mut body, &mut buf.bytes_mut()[..want]).await,
            (None, None) => Ok(0),
        };
        match filled {
            Ok(n) if n == want => {}
            other => {
                rdma.give_back(buf);
                let why = match other {
                    Err(e) => e,
                    Ok(n) => format!("the object ended after {n} of {want} bytes"),
                };
                return Err(failed(format!("reading {what}: {why}")));
            }
        }
        let principal = job.principal.clone();
        let (outcome, kept) = job
            .blocking({
                let rdma = rdma.clone();
                move || {
                    let label = Label {
                        op: "GET",
                        object: &what,
                        source,
                        principal: &principal,
                        arrived,
                    };
                    rdma.write_to_client(&token, buf, len, &label)
                }
            })
            .await
            .map_err(failed)?;
        if let Some(buf) = kept {
            rdma.give_back(buf);
        }
        outcome.map_err(transfer_failed)?;
        resp.output.content_length = Some(0);
        // s3s answers 206 exactly when there is a Content-Range.
        let status: u16 = if resp.output.content_range.is_some() {
            206
        } else {
            200
        };
        resp.headers.insert(REPLY, HeaderValue::from(status));
        resp.headers.insert(BYTES, HeaderValue::from(len));
        Ok(resp)
    }

    /// Drains a PUT's (empty) body, which checks its signed hash, then READs
    /// the token's range from the client: the object's bytes, in the
    /// transfer's own buffer (no copy), which goes back to the memory budget
    /// once the backend has stored them.
    async fn read_by_rdma(
        &self,
        body: Option<StreamingBlob>,
        job: Job,
        what: String,
    ) -> S3Result<Bytes> {
        let arrived = Instant::now();
        let (token, rdma, source) = (job.token, job.rdma.clone(), job.source);
        if let Some(mut body) = body {
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
        let len = usize::try_from(token.length).map_err(|_| {
            failed(format!(
                "{} bytes do not fit this machine's memory",
                token.length
            ))
        })?;
        let principal = job.principal.clone();
        job.blocking(move || {
            let buf = rdma.take(len).map_err(take_failed)?;
            let label = Label {
                op: "PUT",
                object: &what,
                source,
                principal: &principal,
                arrived,
            };
            match rdma.read_from_client(&token, buf, &label) {
                (Ok(()), Some(buf)) => Ok(Bytes::from_owner(Lent {
                    buf: Some(buf),
                    rdma: rdma.clone(),
                    len,
                })),
                // A successful transfer always gives its buffer back.
                (Ok(()), None) => Err(failed("the transfer kept its buffer".to_owned())),
                (Err(e), kept) => {
                    if let Some(buf) = kept {
                        rdma.give_back(buf);
                    }
                    Err(transfer_failed(e))
                }
            }
        })
        .await
        .map_err(failed)?
    }
}

/// A PUT's bytes as they arrived, in the transfer's registered buffer, lent
/// to the backend; the buffer goes back to the server's memory budget when
/// the backend lets go of them.
struct Lent {
    buf: Option<crate::gateway::rdma::RegBuf>,
    rdma: Arc<Rdma>,
    len: usize,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf
            .as_ref()
            .map_or(&[], |buf| &buf.bytes()[..self.len])
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.rdma.give_back(buf);
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

/// Where a GetObject answer's bytes start in the object, and the object's
/// whole length: from its `Content-Range` (`bytes FIRST-LAST/TOTAL`), or
/// the whole object of `length` bytes without one.
fn span(output: &GetObjectOutput, length: u64) -> (u64, u64) {
    let parsed = output.content_range.as_deref().and_then(|r| {
        let (range, total) = r.strip_prefix("bytes ")?.split_once('/')?;
        let first = range.split_once('-')?.0.parse().ok()?;
        Some((first, total.parse().ok()?))
    });
    parsed.unwrap_or((0, length))
}

/// Reads `out.len()` bytes at `first` of the file at `path`, which must be
/// `total` bytes long (else the object changed since the backend looked:
/// an error, and the request fails); returns how many it read.
fn read_file(path: &Path, first: u64, total: u64, out: &mut [u8]) -> Result<usize, String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let now = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if now != total {
        return Err(format!(
            "{} is {now} bytes, the backend said {total}: it changed meanwhile",
            path.display()
        ));
    }
    file.read_exact_at(out, first)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(out.len())
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

/// `e` answered with `x-amz-rdma-reply: status`.
fn with_reply(mut e: S3Error, status: u16) -> S3Error {
    let mut headers = HeaderMap::new();
    // The error's headers replace the response's: keep its content type.
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/xml"));
    headers.insert(REPLY, HeaderValue::from(status));
    e.set_headers(headers);
    e
}

/// A backend error, with its own status as `x-amz-rdma-reply`.
fn echo_status(e: S3Error) -> S3Error {
    let status = e.status_code().map_or(500, |s| s.as_u16());
    with_reply(e, status)
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
                mut req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                self.check_region(&req)?;
                let what = object(&req.input.bucket, &req.input.key);
                let job = match self.ask(&req, &format!("PUT {what}")) {
                    Ask::Plain => return self.backend.put_object(req).await,
                    Ask::Decline(why) => return Err(declined(&why)),
                    Ask::Busy(why) => return Err(slow_down(&why)),
                    Ask::Rdma(job) => job,
                };
                let body = req.input.body.take();
                let data = self.read_by_rdma(body, job, what).await?;
                let len = data.len();
                req.input.content_length = i64::try_from(len).ok();
                req.input.body = Some(StreamingBlob::from(s3s::Body::from(data)));
                clear_checksums!(req.input);
                let mut resp = self.backend.put_object(req).await.map_err(echo_status)?;
                resp.headers.insert(REPLY, HeaderValue::from(200u16));
                resp.headers.insert(BYTES, HeaderValue::from(len));
                Ok(resp)
            }

            async fn upload_part(
                &self,
                mut req: S3Request<UploadPartInput>,
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
                let body = req.input.body.take();
                let data = self.read_by_rdma(body, job, what).await?;
                let len = data.len();
                req.input.content_length = i64::try_from(len).ok();
                req.input.body = Some(StreamingBlob::from(s3s::Body::from(data)));
                clear_checksums!(req.input);
                let mut resp = self.backend.upload_part(req).await.map_err(echo_status)?;
                resp.headers.insert(REPLY, HeaderValue::from(200u16));
                resp.headers.insert(BYTES, HeaderValue::from(len));
                Ok(resp)
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
    fn an_answer_s_bytes_start_where_its_content_range_says() {
        let whole = GetObjectOutput::default();
        assert_eq!(span(&whole, 100), (0, 100));
        let ranged = GetObjectOutput {
            content_range: Some("bytes 10-19/100".to_owned()),
            ..GetObjectOutput::default()
        };
        assert_eq!(span(&ranged, 10), (10, 100));
        let odd = GetObjectOutput {
            content_range: Some("items 1-2/3".to_owned()),
            ..GetObjectOutput::default()
        };
        assert_eq!(span(&odd, 7), (0, 7), "not a byte range: the whole answer");
    }

    #[test]
    fn a_file_is_read_at_its_offset_and_refused_once_it_changed() {
        let dir = std::env::temp_dir().join(format!("hipobj-s3-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("object");
        let bytes: Vec<u8> = (0..=255).collect();
        std::fs::write(&path, &bytes).unwrap();
        let mut out = [0u8; 16];
        assert_eq!(read_file(&path, 100, 256, &mut out), Ok(16));
        assert_eq!(out[..], bytes[100..116]);
        let changed = read_file(&path, 0, 300, &mut out).unwrap_err();
        assert!(changed.contains("changed meanwhile"), "{changed}");
        assert!(
            read_file(&path, 250, 256, &mut out).is_err(),
            "past the end"
        );
        assert!(read_file(&dir.join("gone"), 0, 1, &mut out).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
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
            connect_timeout: slow,
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

    /// With the default limits for a memory budget, a token longer than
    /// the budget holds is declined naming `--rdma-max-bytes`, the limit
    /// that applies, and the server's budget is untouched.
    #[test]
    fn a_token_longer_than_the_budget_holds_is_declined_for_rdma_max_bytes() {
        use crate::gateway::cli::tests::{args, required};
        let mut list = required();
        list.extend(["--rdma-memory-bytes", "1048576"]);
        let o = crate::gateway::cli::parse(&args(&list)).unwrap().unwrap();
        let fake = Fake::new("max", o.limits(), o.rdma_timeout);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let long = token(4791, 2 << 20);
        let e = runtime
            .block_on(fake.s3.put_object(put("long", b"", Some(&long))))
            .expect_err("declined");
        assert_eq!(*e.code(), s3s::S3ErrorCode::NotImplemented, "{e:?}");
        let why = e.message().unwrap_or_default();
        assert!(
            why.contains("2097152 bytes is more than --rdma-max-bytes 1048576"),
            "{why}"
        );
        assert_eq!(fake.rdma.memory_in_use(), 0);
        assert_eq!(fake.rdma.requests_in_progress(), 0);
        assert!(!fake.root.join(BUCKET).join("long").exists());
    }
}
