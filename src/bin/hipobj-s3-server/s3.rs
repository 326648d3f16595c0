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
//!   501 NotImplemented with `x-amz-rdma-reply: 501`. Unusable: it does not
//!   decode, its transport is not `0x02`, RDMA is off, it names an address
//!   the server may not connect to (`--rdma-allow`, else only the
//!   request's own source), or it is longer than `--rdma-max-bytes`.
//! - No room in the memory budget until the deadline: 503 SlowDown with
//!   `x-amz-rdma-reply: 503`.
//!
//! A token may carry the suffix `:<addr>:<size>` that the original's
//! clients append (decimal or `0x` hex): its size must be the token's
//! length; its address is ignored (the token's own is the one the NIC
//! knows).
//!
//! Every request must be signed (SigV4) for the configured region.

use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use hipobj::core::token::{parse_header, Token, Transport};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;

use crate::range;
use crate::rdma::{Failure, Label, Rdma, TakeError};

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

/// s3s-fs, with the RDMA paths.
pub struct RdmaS3 {
    fs: FileSystem,
    /// The backend's root, canonical, as s3s-fs resolves paths under it.
    root: PathBuf,
    rdma: Option<Arc<Rdma>>,
    region: String,
}

/// What a request's token asks for.
enum Ask {
    /// No token: plain S3.
    Plain,
    /// A token this server cannot serve, and why.
    Decline(String),
    /// A token to serve, for a request from `source`.
    Rdma(Token, Arc<Rdma>, Option<IpAddr>),
}

impl RdmaS3 {
    /// The operations over `fs` (whose root is `root`, canonical); `rdma`
    /// is `None` when RDMA is off.
    pub fn new(fs: FileSystem, root: PathBuf, rdma: Option<Arc<Rdma>>, region: String) -> RdmaS3 {
        RdmaS3 {
            fs,
            root,
            rdma,
            region,
        }
    }

    /// The file s3s-fs keeps `bucket/key` in, for a key of plain path
    /// components only (s3s-fs resolves `..` and the like virtually under
    /// its root: such keys take the backend's own stream instead).
    fn object_file(&self, bucket: &str, key: &str) -> Option<PathBuf> {
        let plain = |p: &str| {
            !p.is_empty()
                && Path::new(p)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)))
        };
        (plain(bucket) && plain(key)).then(|| self.root.join(bucket).join(key))
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
                .fs
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
        self.fs.get_object(req).await
    }

    /// What the request's `x-amz-rdma-token` asks for. A decline is logged.
    fn ask<T>(&self, req: &S3Request<T>, what: &str) -> Ask {
        let Some(value) = req.headers.get(TOKEN) else {
            return Ask::Plain;
        };
        let source = req.extensions.get::<Peer>().map(|p| p.0.ip());
        let why = match parse_header(value.as_bytes()) {
            Err(e) => e.to_string(),
            Ok(token) if token.transport != Transport::RcCm => format!(
                "transport {:#04x}: this server connects through RDMA CM (0x02) only",
                token.transport.to_byte()
            ),
            Ok(token) => match &self.rdma {
                Some(rdma) if !rdma.may_dial(&token, source) => format!(
                    "the token names {}, which this server may not connect to for a request \
                     from {} (see --rdma-allow)",
                    hipobj::core::nic::ip_of(&token.gid),
                    source.map_or("an unknown address".to_owned(), |s| s.to_string())
                ),
                Some(rdma) => return Ask::Rdma(token, rdma.clone(), source),
                None => "RDMA is off".to_owned(),
            },
        };
        eprintln!("hipobj-s3-server: {what}: declined {TOKEN}: {why}");
        Ask::Decline(why)
    }

    /// GetObject with a usable token.
    async fn get_by_rdma(
        &self,
        req: S3Request<GetObjectInput>,
        token: Token,
        rdma: Arc<Rdma>,
        source: Option<IpAddr>,
        what: String,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let arrived = Instant::now();
        let file = self.object_file(&req.input.bucket, &req.input.key);
        let mut resp = self.backend_get(req).await.map_err(echo_status)?;
        let length = resp
            .output
            .content_length
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| failed("the backend gave no content length".into()))?;
        let len = length.min(token.length);
        let want = usize::try_from(len)
            .map_err(|_| failed(format!("{len} bytes do not fit this machine's memory")))?;
        let taken = blocking({
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
                let (n, back) = blocking(move || {
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
        let (outcome, kept) = blocking({
            let rdma = rdma.clone();
            move || {
                let label = Label {
                    op: "GET",
                    object: &what,
                    source,
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
        token: Token,
        rdma: Arc<Rdma>,
        source: Option<IpAddr>,
        what: String,
    ) -> S3Result<Bytes> {
        let arrived = Instant::now();
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
        blocking(move || {
            let buf = rdma.take(len).map_err(take_failed)?;
            let label = Label {
                op: "PUT",
                object: &what,
                source,
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
    buf: Option<crate::rdma::RegBuf>,
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

/// Runs a blocking call (verbs, the CM) off the async workers.
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
        TakeError::Busy(why) => with_reply(s3_error!(SlowDown, "{why}"), 503),
        TakeError::Failed(why) => failed(why),
    }
}

/// A failed transfer: 500, or 503 when the server has no connection to
/// spare, or 501 when it may not connect.
fn transfer_failed(f: Failure) -> S3Error {
    match f {
        Failure::Declined(why) => declined(&why),
        Failure::Busy(why) => with_reply(s3_error!(SlowDown, "{why}"), 503),
        Failure::Failed(why) => failed(format!("RDMA transfer failed: {why}")),
    }
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
                    Ask::Rdma(token, rdma, source) => {
                        self.get_by_rdma(req, token, rdma, source, what).await
                    }
                }
            }

            async fn put_object(
                &self,
                mut req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                self.check_region(&req)?;
                let what = object(&req.input.bucket, &req.input.key);
                let (token, rdma, source) = match self.ask(&req, &format!("PUT {what}")) {
                    Ask::Plain => return self.fs.put_object(req).await,
                    Ask::Decline(why) => return Err(declined(&why)),
                    Ask::Rdma(token, rdma, source) => (token, rdma, source),
                };
                let body = req.input.body.take();
                let data = self.read_by_rdma(body, token, rdma, source, what).await?;
                let len = data.len();
                req.input.content_length = i64::try_from(len).ok();
                req.input.body = Some(StreamingBlob::from(s3s::Body::from(data)));
                clear_checksums!(req.input);
                let mut resp = self.fs.put_object(req).await.map_err(echo_status)?;
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
                let (token, rdma, source) = match self.ask(&req, &format!("PUT {what}")) {
                    Ask::Plain => return self.fs.upload_part(req).await,
                    Ask::Decline(why) => return Err(declined(&why)),
                    Ask::Rdma(token, rdma, source) => (token, rdma, source),
                };
                let body = req.input.body.take();
                let data = self.read_by_rdma(body, token, rdma, source, what).await?;
                let len = data.len();
                req.input.content_length = i64::try_from(len).ok();
                req.input.body = Some(StreamingBlob::from(s3s::Body::from(data)));
                clear_checksums!(req.input);
                let mut resp = self.fs.upload_part(req).await.map_err(echo_status)?;
                resp.headers.insert(REPLY, HeaderValue::from(200u16));
                resp.headers.insert(BYTES, HeaderValue::from(len));
                Ok(resp)
            }

            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.check_region(&req)?;
                    self.fs.$op(req).await
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
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn only_plain_keys_are_read_from_their_file() {
        let fs_root = std::env::temp_dir().join(format!("hipobj-s3-keys-{}", std::process::id()));
        std::fs::create_dir_all(&fs_root).unwrap();
        let s3 = RdmaS3 {
            fs: FileSystem::new(&fs_root).unwrap(),
            root: PathBuf::from("/srv/root"),
            rdma: None,
            region: "us-east-1".to_owned(),
        };
        assert_eq!(
            s3.object_file("b", "dir/key.bin"),
            Some(PathBuf::from("/srv/root/b/dir/key.bin"))
        );
        for key in ["../escape", "a/../b", "./k", "/abs", ""] {
            assert_eq!(s3.object_file("b", key), None, "{key}");
        }
        std::fs::remove_dir_all(&fs_root).unwrap();
    }
}
