//! The upstream backend: the objects of an existing S3 store (AWS, MinIO,
//! Garage, Ceph RGW, another `hipobj-s3-server`...) at `--upstream URL`, so
//! that the gateway keeps no state of its own.
//!
//! Every operation goes through s3s-aws's [`Proxy`] (s3s's S3 trait over the
//! AWS SDK's client) with S3's semantics: conditional requests, ranges,
//! ETags and `x-amz-checksum-*` pass both ways. What this module adds:
//!
//! - Errors: an upstream's S3 error comes back as the same S3 error (status
//!   and code), its message naming the upstream; a failure to reach it, or
//!   an upstream that keeps the gateway waiting longer than
//!   `--upstream-timeout-ms` at one stretch, answers 503 ServiceUnavailable
//!   naming the upstream and what happened (s3s-aws alone answers 500 with
//!   no message for all of these). An answer the SDK cannot read (a header
//!   or an XML document not in S3's form), which the SDK reports with the
//!   answer's own success status, answers 502 Bad Gateway with the SDK's
//!   reason: never a success whose body is an error.
//! - Time-outs: a call waits for the upstream at most the time-out at one
//!   stretch: to connect, to take the next piece of a request's body, to
//!   answer once the body is sent, to send the next piece of a response's
//!   body. Time spent waiting for the gateway's own client (or its RDMA
//!   transfer) to produce a request's body does not count. CopyObject,
//!   UploadPartCopy and CompleteMultipartUpload, which a store may take
//!   minutes to answer for large objects, get [`SLOW_CALLS`] times as long.
//! - PutObject from a stream: up to `--upstream-multipart-bytes` (5 GiB,
//!   S3's largest PutObject, by default: its ETag stays the body's MD5)
//!   one streamed PutObject; above (or of unknown length) a multipart
//!   upload of `--upstream-part-bytes` parts read from the stream while
//!   the previous part uploads, each with its CRC64NVME, completed with
//!   the whole object's CRC64NVME (S3's `FULL_OBJECT` checksum type), and
//!   aborted on any failure (the stream's, the upstream's, a time-out, the
//!   request dropped), so that nothing partial becomes visible. A body that ends
//!   short of its `Content-Length` or runs past it fails the request and
//!   the upload with it.
//! - GetBucketLocation answers the region the gateway's clients sign for,
//!   once the upstream's HeadBucket finds the bucket: not the upstream's
//!   own location, which they could not sign for.
//! - Checksums a client sends in headers are checked here as the body of a
//!   single PutObject or UploadPart streams (unless it came by RDMA, whose
//!   bytes were checked as they were READ) and forwarded (the upstream may
//!   check them again), a single PutObject's with its algorithm named
//!   (`x-amz-sdk-checksum-algorithm`) where the client sent a value alone.
//!   A checksum sent as a trailer (aws-chunked), and for the multipart case
//!   every checksum and `Content-MD5` of the whole object, which the
//!   upstream cannot check against parts, are checked here too. A mismatch
//!   answers 400 BadDigest before the upstream has the whole body, and
//!   nothing is stored.
//! - A GetObject that asks for the store's checksum
//!   (`x-amz-checksum-mode: ENABLED`) asks the store for it (`AskChecksum`)
//!   without the SDK checking the bytes against it on their way: whoever
//!   asked checks them, once (the gateway's RDMA GET and its cache's fills
//!   as they copy or keep them, a client of a plain GET as it reads them).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, ProvideCredentials, Region, RequestChecksumCalculation,
    ResponseChecksumValidation, StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use aws_sdk_s3::operation as op;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError, S3};
use s3s_aws::Proxy;

use super::backend::{alone, Backend};
use super::checksum::crc64nvme_header;

tokio::task_local! {
    /// Set around a GetObject call whose request asked for the store's
    /// checksum: [`AskChecksum`] asks for it.
    static ASK_CHECKSUM: bool;
}

/// Adds `x-amz-checksum-mode: ENABLED` to the request of a GetObject made
/// in an [`ASK_CHECKSUM`] scope. The SDK checks an answer's checksum as
/// the body streams when the input asks for the checksum mode (a second
/// pass over every byte, besides the gateway's own); the header asks the
/// store just the same, and the SDK still reads the checksum into the
/// output.
#[derive(Debug)]
struct AskChecksum;

impl aws_sdk_s3::config::Intercept for AskChecksum {
    fn name(&self) -> &'static str {
        "hipobj::AskChecksum"
    }

    fn modify_before_signing(
        &self,
        context: &mut aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextMut<'_>,
        _components: &aws_sdk_s3::config::RuntimeComponents,
        _cfg: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if ASK_CHECKSUM.try_with(|ask| *ask).unwrap_or(false) {
            context
                .request_mut()
                .headers_mut()
                .insert("x-amz-checksum-mode", "ENABLED");
        }
        Ok(())
    }
}

/// How long the gateway waits for the upstream at one stretch, unless
/// `--upstream-timeout-ms` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest PutObject sent as one request, unless
/// `--upstream-multipart-bytes` says otherwise: above, a multipart upload.
/// S3's largest PutObject, so that a PutObject keeps S3's semantics up to
/// it (its ETag the MD5 of its body, where a multipart upload's is
/// `"HASH-N"`); it streams, so its size costs no memory.
pub const DEFAULT_MULTIPART_BYTES: u64 = MAX_PART_BYTES;
/// The part size of a PutObject sent as a multipart upload, unless
/// `--upstream-part-bytes` says otherwise.
pub const DEFAULT_PART_BYTES: u64 = 16 << 20;
/// S3's smallest part (but the last).
pub const MIN_PART_BYTES: u64 = 5 << 20;
/// S3's largest part, and its largest PutObject.
pub const MAX_PART_BYTES: u64 = 5 << 30;
/// S3's most parts of one upload.
pub const MAX_PARTS: u64 = 10_000;
/// S3's largest object.
pub const MAX_OBJECT_BYTES: u64 = 5 << 40;
/// The header of a request whose payload moves by RDMA (`s3.rs`).
const RDMA_TOKEN: &str = "x-amz-rdma-token";
/// How many times the time-out CopyObject, UploadPartCopy and
/// CompleteMultipartUpload get: the store does the work of the whole
/// object before it answers.
pub const SLOW_CALLS: u32 = 10;
/// The pieces a part is handed to the upstream in, so that the time-out
/// sees its progress.
const PIECE: usize = 1 << 20;

/// What `--upstream` and its options say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--upstream`: `http://` or `https://`, host, optional port.
    pub endpoint: String,
    /// `--upstream-region` (the server's `--region` by default).
    pub region: String,
    /// `--upstream-profile`: the profile of the shared config and
    /// credentials files to take credentials from.
    pub profile: Option<String>,
    /// Path-style addressing (`URL/bucket/key`, the default: what
    /// self-hosted stores expect) rather than virtual-hosted style
    /// (`bucket.HOST/key`).
    pub path_style: bool,
    /// `--upstream-timeout-ms`.
    pub timeout: Duration,
    /// `--upstream-multipart-bytes`.
    pub multipart_bytes: u64,
    /// `--upstream-part-bytes`.
    pub part_bytes: u64,
    /// `--cache-bytes` and its options: the read-through cache in front
    /// of the store ([`super::cache`]), if on.
    pub cache: Option<super::cache::Settings>,
}

/// Buckets and objects of another S3 store.
pub struct Upstream {
    proxy: Proxy,
    /// The same client as the proxy's, for aborting an upload from a
    /// dropped request.
    client: aws_sdk_s3::Client,
    endpoint: Arc<str>,
    timeout: Duration,
    multipart_bytes: u64,
    part_bytes: u64,
}

impl Upstream {
    /// The backend over `settings.endpoint`, with credentials from the AWS
    /// SDK's default chain (the environment's `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`, the profile's in the shared config and
    /// credentials files, web identity, the container's or instance's
    /// role). Fails if none are found; the upstream itself is not
    /// contacted (it may come up later).
    pub async fn connect(settings: &Settings) -> Result<Upstream, String> {
        Upstream::load(settings, None).await
    }

    /// The backend over `settings.endpoint`, signing with `credentials`
    /// (for a program that gets them its own way).
    pub async fn connect_with(
        settings: &Settings,
        credentials: Credentials,
    ) -> Result<Upstream, String> {
        Upstream::load(settings, Some(credentials)).await
    }

    async fn load(
        settings: &Settings,
        credentials: Option<Credentials>,
    ) -> Result<Upstream, String> {
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(settings.timeout)
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(settings.region.clone()))
            .timeout_config(timeouts)
            // The gateway's own time-out (above) covers stalls, and knows a
            // slow client from a slow upstream.
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled());
        if let Some(profile) = &settings.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(credentials) = credentials {
            loader = loader.credentials_provider(credentials);
        }
        let shared = loader.load().await;
        let endpoint = settings.endpoint.as_str();
        let provider = shared
            .credentials_provider()
            .ok_or_else(|| format!("upstream {endpoint}: no credentials provider"))?;
        match tokio::time::timeout(settings.timeout, provider.provide_credentials()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "upstream {endpoint}: no credentials: {} (set AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY, or name a profile of ~/.aws/credentials with \
                     --upstream-profile)",
                    DisplayErrorContext(e)
                ))
            }
            Err(_) => {
                return Err(format!(
                    "upstream {endpoint}: looking for credentials took more than {} ms",
                    settings.timeout.as_millis()
                ))
            }
        }
        let config = aws_sdk_s3::config::Builder::from(&shared)
            .endpoint_url(endpoint)
            .force_path_style(settings.path_style)
            // Checksums only where the client sent one or S3 requires one:
            // not every store takes the SDK's default trailing checksums,
            // and a GET's answer is the upstream's as it is.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .interceptor(AskChecksum)
            .build();
        let client = aws_sdk_s3::Client::from_conf(config);
        Ok(Upstream {
            proxy: Proxy::from(client.clone()),
            client,
            endpoint: Arc::from(endpoint),
            timeout: settings.timeout,
            multipart_bytes: settings.multipart_bytes,
            part_bytes: settings.part_bytes,
        })
    }

    /// Runs one upstream call: bounded by the time-out (`slow`: many
    /// times it), with the proxy's error made the one a client expects.
    /// `body`: the call sends a body tracked by it (its time waiting for
    /// the body's source does not count; its own failure is the answer).
    async fn call<E, T>(
        &self,
        what: &str,
        slow: bool,
        body: Option<&Tracker>,
        call: impl Future<Output = S3Result<T>>,
    ) -> S3Result<T>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let limit = if slow {
            self.timeout * SLOW_CALLS
        } else {
            self.timeout
        };
        let start = Instant::now();
        let mut deadline = start + limit;
        tokio::pin!(call);
        let out = loop {
            tokio::select! {
                out = &mut call => break out,
                () = tokio::time::sleep_until(deadline.into()) => {
                    let waiting = body.map_or(Some(start), Tracker::waiting_since);
                    match waiting {
                        Some(since) if since + limit <= Instant::now() => {
                            observe(what, start, "network");
                            return Err(self.timed_out(what, limit));
                        }
                        Some(since) => deadline = since + limit,
                        None => deadline = Instant::now() + limit,
                    }
                }
            }
        };
        let outcome = match &out {
            Ok(_) => "ok",
            Err(e) => match e.source().and_then(|s| s.downcast_ref::<SdkError<E>>()) {
                Some(SdkError::ServiceError(s)) if s.raw().status().is_success() => "unreadable",
                Some(SdkError::ServiceError(_)) => e.code().as_str(),
                Some(SdkError::ResponseError(_)) => "unreadable",
                _ => "network",
            },
        };
        observe(what, start, outcome);
        out.map_err(|e| match body.and_then(Tracker::take_failure) {
            Some(failure) => failure,
            None => self.error::<E>(what, e),
        })
    }

    /// A time-out's answer.
    fn timed_out(&self, what: &str, limit: Duration) -> S3Error {
        let mut e = S3Error::with_message(
            S3ErrorCode::ServiceUnavailable,
            format!(
                "upstream {}: {what} got no answer within {} ms (--upstream-timeout-ms); \
                 is the store overloaded or unreachable?",
                self.endpoint,
                limit.as_millis()
            ),
        );
        e.set_status_code(http::StatusCode::SERVICE_UNAVAILABLE);
        e
    }

    /// The S3 error a client expects for the proxy's error `e` of a call
    /// whose SDK error type is `E`. s3s-aws keeps an upstream's own error
    /// (its status, code and message) but makes every other failure an
    /// InternalError with no message: those are told apart here.
    fn error<E>(&self, what: &str, mut e: S3Error) -> S3Error
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let endpoint = &self.endpoint;
        let failure = e
            .source()
            .and_then(|s| s.downcast_ref::<SdkError<E>>())
            .map(|sdk| match sdk {
                // The SDK could not read a successful answer (a header or
                // an XML document not as S3 gives them): it reports an
                // unhandled service error with the answer's own status.
                SdkError::ServiceError(service) if service.raw().status().is_success() => {
                    Failure::Unreadable(causes(sdk))
                }
                SdkError::ServiceError(service) => {
                    Failure::Answered(service.raw().status().as_u16())
                }
                SdkError::ResponseError(_) => Failure::Unreadable(causes(sdk)),
                SdkError::DispatchFailure(failure) if failure.is_timeout() => {
                    Failure::TimedOut(DisplayErrorContext(sdk).to_string())
                }
                SdkError::DispatchFailure(failure) if failure.is_io() => {
                    Failure::Unreachable(DisplayErrorContext(sdk).to_string())
                }
                SdkError::TimeoutError(_) => {
                    Failure::TimedOut(DisplayErrorContext(sdk).to_string())
                }
                _ => Failure::Other(DisplayErrorContext(sdk).to_string()),
            });
        let (code, status, message) = match failure {
            None => {
                // s3s-aws's own failure (a field it could not convert).
                let message = e.message().unwrap_or("converting the request or answer");
                let message = format!("upstream {endpoint}: {what}: {message}");
                e.set_message(message);
                return e;
            }
            Some(Failure::Answered(status)) => {
                if *e.code() == S3ErrorCode::InternalError && status != 500 {
                    // No code in the answer (a HEAD's, a 304's): the one
                    // S3 gives that status.
                    if let Some(code) = code_of_status(status) {
                        e.set_code(code);
                    }
                }
                let message = match e.message() {
                    Some(m) => format!("upstream {endpoint}: {m}"),
                    None => format!(
                        "upstream {endpoint}: {what} answered {status} {}",
                        e.code().as_str()
                    ),
                };
                e.set_message(message);
                return e;
            }
            Some(Failure::Unreadable(why)) => (
                S3ErrorCode::InternalError,
                Some(http::StatusCode::BAD_GATEWAY),
                format!("upstream {endpoint}: {what}: could not read the store's answer: {why}"),
            ),
            Some(Failure::Unreachable(why)) => (
                S3ErrorCode::ServiceUnavailable,
                None,
                format!(
                    "upstream {endpoint}: {what}: could not reach it ({why}); is it running, \
                     and is --upstream right?"
                ),
            ),
            Some(Failure::TimedOut(why)) => (
                S3ErrorCode::ServiceUnavailable,
                None,
                format!(
                    "upstream {endpoint}: {what} timed out ({why}; connecting may take {} ms, \
                     --upstream-timeout-ms); is it reachable from here?",
                    self.timeout.as_millis()
                ),
            ),
            Some(Failure::Other(why)) => (
                S3ErrorCode::InternalError,
                None,
                format!("upstream {endpoint}: {what} failed: {why}"),
            ),
        };
        let status = status.or_else(|| code.status_code());
        let mut mapped = S3Error::with_message(code, message);
        if let Some(status) = status {
            mapped.set_status_code(status);
        }
        mapped
    }

    /// GetBucketLocation: the region the request was signed for (the
    /// gateway's, `--region`), once the store's HeadBucket says the bucket
    /// is there and the gateway's key reaches it. Not the store's own
    /// location: the gateway's clients sign for the gateway's region
    /// whatever the store's (Garage answers "garage", which they would
    /// sign for and be refused), and not every store answers in a form
    /// the SDK reads (SeaweedFS's root is `CreateBucketConfiguration`).
    async fn bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let head = HeadBucketInput {
            bucket: req.input.bucket.clone(),
            expected_bucket_owner: req.input.expected_bucket_owner.clone(),
        };
        let found = self
            .call::<op::head_bucket::HeadBucketError, _>(
                "HeadBucket",
                false,
                None,
                self.proxy.head_bucket(alone(head)),
            )
            .await;
        if let Err(mut e) = found {
            // A HEAD's answer has no code: its 404 is the bucket's.
            if e.status_code().is_some_and(|s| s.as_u16() == 404) {
                e.set_code(S3ErrorCode::NoSuchBucket);
            }
            return Err(e);
        }
        // S3 names us-east-1 by no constraint at all.
        let location_constraint = req
            .region
            .as_ref()
            .map(|r| r.as_str())
            .filter(|r| *r != "us-east-1")
            .map(|r| BucketLocationConstraint::from(r.to_owned()));
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint,
        }))
    }

    /// PutObject as one streamed request.
    async fn put_single(
        &self,
        mut req: S3Request<PutObjectInput>,
        check: Option<Check>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let body = req.input.body.take().unwrap_or_else(empty_blob);
        let expected = req.input.content_length.and_then(|n| u64::try_from(n).ok());
        let tracker = Arc::new(Tracker::new());
        req.input.body = Some(StreamingBlob::new(Outgoing::new(
            body,
            expected,
            check,
            Arc::clone(&tracker),
        )));
        // A checksum given as a value alone (as the AWS SDKs and the
        // hipobj client send it) goes on with its algorithm named too:
        // AWS keeps it either way, some stores only when it is named.
        if req.input.checksum_algorithm.is_none() {
            req.input.checksum_algorithm = algorithm_of(&req.input);
        }
        self.call::<op::put_object::PutObjectError, _>(
            "PutObject",
            false,
            Some(&tracker),
            self.proxy.put_object(req),
        )
        .await
    }

    /// PutObject as a multipart upload fed from the stream (`len`: its
    /// length, if known); one streamed PutObject after all if a stream of
    /// unknown length ends within the first part.
    async fn put_multipart(
        &self,
        mut req: S3Request<PutObjectInput>,
        len: Option<u64>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let part_bytes = part_size(len, self.part_bytes)?;
        let body = req.input.body.take().unwrap_or_else(empty_blob);
        let check = Check::whole(&req.input, req.trailing_headers.clone());
        let mut parts = Parts::new(body, len, check);
        let first = parts.next(part_bytes).await?;
        if parts.ended && len.is_none() {
            // Shorter than a part: one PutObject of what was read.
            parts.finish()?;
            req.input.content_length = i64::try_from(first.len()).ok();
            req.input.body = Some(blob(first));
            req.trailing_headers = None;
            return self.put_single(req, None).await;
        }
        let input = &req.input;
        let create = CreateMultipartUploadInput {
            acl: input.acl.clone(),
            bucket: input.bucket.clone(),
            bucket_key_enabled: input.bucket_key_enabled,
            cache_control: input.cache_control.clone(),
            checksum_algorithm: Some(ChecksumAlgorithm::from_static(ChecksumAlgorithm::CRC64NVME)),
            checksum_type: Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            content_disposition: input.content_disposition.clone(),
            content_encoding: input.content_encoding.clone(),
            content_language: input.content_language.clone(),
            content_type: input.content_type.clone(),
            expected_bucket_owner: input.expected_bucket_owner.clone(),
            expires: input.expires.clone(),
            grant_full_control: input.grant_full_control.clone(),
            grant_read: input.grant_read.clone(),
            grant_read_acp: input.grant_read_acp.clone(),
            grant_write_acp: input.grant_write_acp.clone(),
            key: input.key.clone(),
            metadata: input.metadata.clone(),
            object_lock_legal_hold_status: input.object_lock_legal_hold_status.clone(),
            object_lock_mode: input.object_lock_mode.clone(),
            object_lock_retain_until_date: input.object_lock_retain_until_date.clone(),
            request_payer: input.request_payer.clone(),
            sse_customer_algorithm: input.sse_customer_algorithm.clone(),
            sse_customer_key: input.sse_customer_key.clone(),
            sse_customer_key_md5: input.sse_customer_key_md5.clone(),
            ssekms_encryption_context: input.ssekms_encryption_context.clone(),
            ssekms_key_id: input.ssekms_key_id.clone(),
            server_side_encryption: input.server_side_encryption.clone(),
            storage_class: input.storage_class.clone(),
            tagging: input.tagging.clone(),
            website_redirect_location: input.website_redirect_location.clone(),
        };
        let created = self
            .call::<op::create_multipart_upload::CreateMultipartUploadError, _>(
                "CreateMultipartUpload",
                false,
                None,
                self.proxy.create_multipart_upload(alone(create)),
            )
            .await?;
        let upload_id = created.output.upload_id.ok_or_else(|| {
            s3_error!(
                InternalError,
                "upstream {}: CreateMultipartUpload answered no upload id",
                self.endpoint
            )
        })?;
        let mut pending = Pending {
            client: self.client.clone(),
            bucket: input.bucket.clone(),
            key: input.key.clone(),
            upload_id,
            endpoint: Arc::clone(&self.endpoint),
            armed: true,
        };
        let outcome = self
            .upload_parts(&req.input, &pending.upload_id, parts, first, part_bytes)
            .await;
        match outcome {
            Ok(resp) => {
                pending.armed = false;
                Ok(resp)
            }
            Err(e) => {
                pending.abort().await;
                Err(e)
            }
        }
    }

    /// The parts of upload `upload_id` from `parts` (`first` already read),
    /// each uploaded while the next is read, then CompleteMultipartUpload.
    async fn upload_parts(
        &self,
        input: &PutObjectInput,
        upload_id: &str,
        mut parts: Parts,
        first: Bytes,
        part_bytes: usize,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let mut done = Vec::new();
        let mut whole: Option<(u64, u64)> = None;
        let mut current = first;
        loop {
            let number = i32::try_from(done.len() + 1)
                .map_err(|_| s3_error!(InternalError, "more parts than an i32 counts"))?;
            let crc = super::checksum::crc64nvme(&current);
            let len = current.len() as u64;
            whole = Some(match whole {
                None => (crc, len),
                Some((sum, total)) => (
                    crc_fast::checksum_combine(crc_fast::CrcAlgorithm::Crc64Nvme, sum, crc, len),
                    total + len,
                ),
            });
            let upload = self.upload_one(input, upload_id, number, current, crc);
            let (part, next) = if parts.ended {
                (upload.await?, None)
            } else {
                // The next part is read while this one uploads. A failed
                // upload ends the reading; a failed read waits for the
                // upload to end, so that no part request is in flight
                // when the upload is aborted (a part that lands after the
                // abort would stay).
                let read = parts.next(part_bytes);
                tokio::pin!(upload, read);
                tokio::select! {
                    part = &mut upload => {
                        let part = part?;
                        (part, Some(read.await?))
                    }
                    next = &mut read => {
                        let part = upload.await;
                        (part?, Some(next?))
                    }
                }
            };
            done.push(part);
            match next {
                Some(next) if !next.is_empty() || !parts.ended => current = next,
                _ => break,
            }
            if done.len() as u64 >= MAX_PARTS {
                return Err(s3_error!(
                    EntityTooLarge,
                    "the object needs more than {MAX_PARTS} parts of {part_bytes} bytes \
                     (--upstream-part-bytes)"
                ));
            }
        }
        parts.finish()?;
        let (crc, total) = whole.unwrap_or((0, 0));
        let crc = crc64nvme_header(crc);
        if let Some(claimed) = &input.checksum_crc64nvme {
            if *claimed != crc {
                return Err(bad_digest("CRC64NVME", claimed, &crc));
            }
        }
        let complete = CompleteMultipartUploadInput {
            bucket: input.bucket.clone(),
            checksum_crc64nvme: Some(crc.clone()),
            checksum_type: Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            expected_bucket_owner: input.expected_bucket_owner.clone(),
            if_match: input.if_match.clone(),
            if_none_match: input.if_none_match.clone(),
            key: input.key.clone(),
            mpu_object_size: i64::try_from(total).ok(),
            multipart_upload: Some(CompletedMultipartUpload { parts: Some(done) }),
            request_payer: input.request_payer.clone(),
            sse_customer_algorithm: input.sse_customer_algorithm.clone(),
            sse_customer_key: input.sse_customer_key.clone(),
            sse_customer_key_md5: input.sse_customer_key_md5.clone(),
            upload_id: upload_id.to_owned(),
            ..CompleteMultipartUploadInput::default()
        };
        let completed = self
            .call::<op::complete_multipart_upload::CompleteMultipartUploadError, _>(
                "CompleteMultipartUpload",
                true,
                None,
                self.proxy.complete_multipart_upload(alone(complete)),
            )
            .await?;
        let headers = completed.headers;
        let out = completed.output;
        let mut resp = S3Response::new(PutObjectOutput {
            bucket_key_enabled: out.bucket_key_enabled,
            checksum_crc64nvme: out.checksum_crc64nvme.or(Some(crc)),
            checksum_type: out.checksum_type,
            e_tag: out.e_tag,
            expiration: out.expiration,
            request_charged: out.request_charged,
            ssekms_key_id: out.ssekms_key_id,
            server_side_encryption: out.server_side_encryption,
            size: i64::try_from(total).ok(),
            version_id: out.version_id,
            ..PutObjectOutput::default()
        });
        resp.headers = headers;
        Ok(resp)
    }

    /// UploadPart of `data` as part `number`, with its CRC64NVME `crc`.
    async fn upload_one(
        &self,
        input: &PutObjectInput,
        upload_id: &str,
        number: i32,
        data: Bytes,
        crc: u64,
    ) -> S3Result<CompletedPart> {
        let len = data.len();
        let pieces: Vec<Result<Bytes, std::convert::Infallible>> = (0..len)
            .step_by(PIECE)
            .map(|at| Ok(data.slice(at..(at + PIECE).min(len))))
            .collect();
        let tracker = Arc::new(Tracker::new());
        let body = Outgoing::new(
            StreamingBlob::wrap(futures::stream::iter(pieces)),
            Some(len as u64),
            None,
            Arc::clone(&tracker),
        );
        let checksum = crc64nvme_header(crc);
        let part = UploadPartInput {
            body: Some(StreamingBlob::new(body)),
            bucket: input.bucket.clone(),
            checksum_crc64nvme: Some(checksum.clone()),
            content_length: i64::try_from(len).ok(),
            expected_bucket_owner: input.expected_bucket_owner.clone(),
            key: input.key.clone(),
            part_number: number,
            request_payer: input.request_payer.clone(),
            sse_customer_algorithm: input.sse_customer_algorithm.clone(),
            sse_customer_key: input.sse_customer_key.clone(),
            sse_customer_key_md5: input.sse_customer_key_md5.clone(),
            upload_id: upload_id.to_owned(),
            ..UploadPartInput::default()
        };
        let what = format!("UploadPart {number}");
        let out = self
            .call::<op::upload_part::UploadPartError, _>(
                &what,
                false,
                Some(&tracker),
                self.proxy.upload_part(alone(part)),
            )
            .await?;
        Ok(CompletedPart {
            checksum_crc64nvme: Some(checksum),
            e_tag: out.output.e_tag,
            part_number: Some(number),
            ..CompletedPart::default()
        })
    }
}

/// Records a call in the server's metrics: its operation (`what` without
/// a part's number), how long it took, its outcome.
fn observe(what: &str, start: Instant, outcome: &str) {
    let op = what.split(' ').next().unwrap_or(what);
    super::metrics::upstream_observed(op, start.elapsed().as_secs_f64(), outcome);
}

/// The checksum values (`x-amz-checksum-*`) of a PutObject's or an
/// UploadPart's input.
macro_rules! checksums {
    ($input:expr) => {
        s3s::dto::Checksum {
            checksum_crc32: $input.checksum_crc32.clone(),
            checksum_crc32c: $input.checksum_crc32c.clone(),
            checksum_crc64nvme: $input.checksum_crc64nvme.clone(),
            checksum_sha1: $input.checksum_sha1.clone(),
            checksum_sha256: $input.checksum_sha256.clone(),
            ..s3s::dto::Checksum::default()
        }
    };
}

/// How an upstream call failed, as the SDK tells.
enum Failure {
    /// The upstream answered with this status.
    Answered(u16),
    /// Connecting or talking to it failed, and why.
    Unreachable(String),
    /// Connecting (or the SDK's own time-out) timed out, and why.
    TimedOut(String),
    /// It answered, in a form the SDK could not read, and why: 502 Bad
    /// Gateway, never the answer's own success with an error for a body.
    Unreadable(String),
    /// Anything else, and why.
    Other(String),
}

/// `e` and its causes, each in its own words (not the answer's whole
/// dump, which `DisplayErrorContext` appends).
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// The code S3 answers with `status` when the answer carries none.
fn code_of_status(status: u16) -> Option<S3ErrorCode> {
    Some(match status {
        304 => S3ErrorCode::NotModified,
        400 => S3ErrorCode::InvalidRequest,
        403 => S3ErrorCode::AccessDenied,
        404 => S3ErrorCode::NoSuchKey,
        405 => S3ErrorCode::MethodNotAllowed,
        409 => S3ErrorCode::OperationAborted,
        412 => S3ErrorCode::PreconditionFailed,
        416 => S3ErrorCode::InvalidRange,
        501 => S3ErrorCode::NotImplemented,
        503 => S3ErrorCode::ServiceUnavailable,
        _ => return None,
    })
}

/// The part size for an object of `len` bytes (unknown: `None`):
/// `configured`, or more for an object that would need more than
/// [`MAX_PARTS`] of them (rounded up to a MiB).
fn part_size(len: Option<u64>, configured: u64) -> S3Result<usize> {
    let mut size = configured;
    if let Some(len) = len {
        if len > MAX_OBJECT_BYTES {
            return Err(s3_error!(
                EntityTooLarge,
                "{len} bytes: an S3 object holds at most {MAX_OBJECT_BYTES}"
            ));
        }
        let needed = len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20);
        size = size.max(needed);
    }
    usize::try_from(size.min(MAX_PART_BYTES))
        .map_err(|_| s3_error!(InternalError, "a part of {size} bytes does not fit memory"))
}

fn blob(data: Bytes) -> StreamingBlob {
    StreamingBlob::from(s3s::Body::from(data))
}

fn empty_blob() -> StreamingBlob {
    blob(Bytes::new())
}

fn bad_digest(algorithm: &str, claimed: &str, computed: &str) -> S3Error {
    s3_error!(
        BadDigest,
        "the {algorithm} checksum the request gives ({claimed}) is not that of its body \
         ({computed}); nothing was stored"
    )
}

/// An upload the gateway created: aborted unless completed, also when the
/// request is dropped half way (its client went away).
struct Pending {
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    endpoint: Arc<str>,
    armed: bool,
}

impl Pending {
    /// Aborts the upload now.
    async fn abort(&mut self) {
        self.armed = false;
        abort(
            self.client.clone(),
            self.bucket.clone(),
            self.key.clone(),
            self.upload_id.clone(),
            Arc::clone(&self.endpoint),
        )
        .await;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(abort(
                    self.client.clone(),
                    std::mem::take(&mut self.bucket),
                    std::mem::take(&mut self.key),
                    std::mem::take(&mut self.upload_id),
                    Arc::clone(&self.endpoint),
                ));
            }
            Err(_) => eprintln!(
                "hipobj-s3-server: upstream {}: the upload {} of {}/{} was dropped with no \
                 runtime to abort it: abort it by hand (AbortMultipartUpload) or let a \
                 lifecycle rule remove it",
                self.endpoint, self.upload_id, self.bucket, self.key
            ),
        }
    }
}

/// AbortMultipartUpload, saying so if it fails.
async fn abort(
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    endpoint: Arc<str>,
) {
    let sent = client
        .abort_multipart_upload()
        .bucket(&bucket)
        .key(&key)
        .upload_id(&upload_id)
        .send()
        .await;
    if let Err(e) = sent {
        eprintln!(
            "hipobj-s3-server: upstream {endpoint}: aborting the failed upload {upload_id} of \
             {bucket}/{key}: {}; its parts stay until an AbortMultipartUpload or a lifecycle \
             rule removes them",
            DisplayErrorContext(e)
        );
    }
}

/// The checksums of a client's PutObject that the gateway checks itself.
struct Check {
    hasher: ChecksumHasher,
    /// The values claimed in headers, compared at the end.
    claimed: s3s::dto::Checksum,
    md5: Option<(Md5, String)>,
    /// The request's trailer, whose checksums are compared at the end.
    trailer: Option<s3s::TrailingHeaders>,
}

impl Check {
    /// The checks of `claimed` (its values), `content_md5` and, if the
    /// request has a trailer, the trailer's checksum of `algorithm`; `None`
    /// if there is nothing to check.
    fn new(
        claimed: s3s::dto::Checksum,
        content_md5: Option<&String>,
        algorithm: Option<&ChecksumAlgorithm>,
        trailer: Option<s3s::TrailingHeaders>,
    ) -> Option<Check> {
        let mut hasher = ChecksumHasher::default();
        enable(&mut hasher, &claimed);
        if let (Some(algorithm), Some(_)) = (algorithm, &trailer) {
            enable_algorithm(&mut hasher, algorithm.as_str());
        }
        let md5 = content_md5.map(|claimed| (Md5::new(), claimed.clone()));
        let any = md5.is_some() || trailer.is_some() || hashes_any(&hasher);
        any.then_some(Check {
            hasher,
            claimed,
            md5,
            trailer,
        })
    }

    /// Every checksum of the whole object the request gives (for a
    /// multipart upload, whose whole object the upstream cannot check but
    /// by CRC64NVME, which the gateway computes anyway), or `None` if it
    /// gives none.
    fn whole(input: &PutObjectInput, trailer: Option<s3s::TrailingHeaders>) -> Option<Check> {
        let claimed = s3s::dto::Checksum {
            checksum_crc64nvme: None,
            ..checksums!(input)
        };
        let algorithm = input.checksum_algorithm.as_ref();
        Check::new(claimed, input.content_md5.as_ref(), algorithm, trailer)
    }

    /// Every checksum of a PutObject or UploadPart sent on as one request
    /// (`headers`: the request's; `claimed`, `content_md5`, `algorithm`:
    /// its input's): the values of its headers and `Content-MD5`, which a
    /// store may or may not check again, and its trailer's (aws-chunked),
    /// which the store never sees. A request with an RDMA token had its
    /// bytes checked against its headers as they were READ (`s3.rs`, which
    /// stores nothing of a token it does not serve by RDMA): its trailer
    /// alone, which describes its empty HTTP body.
    fn single(
        headers: &http::HeaderMap,
        claimed: s3s::dto::Checksum,
        content_md5: Option<&String>,
        algorithm: Option<&ChecksumAlgorithm>,
        trailer: Option<s3s::TrailingHeaders>,
    ) -> Option<Check> {
        if headers.contains_key(RDMA_TOKEN) {
            return Check::new(s3s::dto::Checksum::default(), None, algorithm, trailer);
        }
        Check::new(claimed, content_md5, algorithm, trailer)
    }

    fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
        if let Some((md5, _)) = &mut self.md5 {
            md5.update(data);
        }
    }

    /// Compares what was computed with what the request claims, its trailer
    /// included (read now: the body has ended).
    fn finish(self) -> S3Result<()> {
        let mut claimed = self.claimed;
        if let Some(trailers) = self.trailer.and_then(|t| t.take()) {
            let get = |name: &str| -> S3Result<Option<String>> {
                trailers
                    .get(name)
                    .map(|v| {
                        v.to_str().map(str::to_owned).map_err(|_| {
                            s3_error!(InvalidArgument, "the trailer {name} is not text")
                        })
                    })
                    .transpose()
            };
            claimed.checksum_crc32 = get("x-amz-checksum-crc32")?.or(claimed.checksum_crc32);
            claimed.checksum_crc32c = get("x-amz-checksum-crc32c")?.or(claimed.checksum_crc32c);
            claimed.checksum_sha1 = get("x-amz-checksum-sha1")?.or(claimed.checksum_sha1);
            claimed.checksum_sha256 = get("x-amz-checksum-sha256")?.or(claimed.checksum_sha256);
            claimed.checksum_crc64nvme =
                get("x-amz-checksum-crc64nvme")?.or(claimed.checksum_crc64nvme);
        }
        let computed = self.hasher.finalize();
        for (name, claimed, computed) in [
            ("CRC32", &claimed.checksum_crc32, &computed.checksum_crc32),
            (
                "CRC32C",
                &claimed.checksum_crc32c,
                &computed.checksum_crc32c,
            ),
            ("SHA1", &claimed.checksum_sha1, &computed.checksum_sha1),
            (
                "SHA256",
                &claimed.checksum_sha256,
                &computed.checksum_sha256,
            ),
            (
                "CRC64NVME",
                &claimed.checksum_crc64nvme,
                &computed.checksum_crc64nvme,
            ),
        ] {
            if let (Some(claimed), Some(computed)) = (claimed, computed) {
                if claimed != computed {
                    return Err(bad_digest(name, claimed, computed));
                }
            }
        }
        if let Some((md5, claimed)) = self.md5 {
            let computed = base64::engine::general_purpose::STANDARD.encode(md5.finalize());
            if claimed != computed {
                return Err(bad_digest("Content-MD5", &claimed, &computed));
            }
        }
        Ok(())
    }
}

/// The algorithm of the one checksum value a PutObject gives, if it gives
/// exactly one (S3 refuses more).
fn algorithm_of(input: &PutObjectInput) -> Option<ChecksumAlgorithm> {
    let given = [
        (&input.checksum_crc32, ChecksumAlgorithm::CRC32),
        (&input.checksum_crc32c, ChecksumAlgorithm::CRC32C),
        (&input.checksum_crc64nvme, ChecksumAlgorithm::CRC64NVME),
        (&input.checksum_sha1, ChecksumAlgorithm::SHA1),
        (&input.checksum_sha256, ChecksumAlgorithm::SHA256),
    ];
    let mut values = given.iter().filter(|(value, _)| value.is_some());
    match (values.next(), values.next()) {
        (Some((_, algorithm)), None) => Some(ChecksumAlgorithm::from_static(algorithm)),
        _ => None,
    }
}

/// Turns on the algorithms of the values `claimed` gives.
fn enable(hasher: &mut ChecksumHasher, claimed: &s3s::dto::Checksum) {
    if claimed.checksum_crc32.is_some() {
        hasher.crc32 = Some(Default::default());
    }
    if claimed.checksum_crc32c.is_some() {
        hasher.crc32c = Some(Default::default());
    }
    if claimed.checksum_sha1.is_some() {
        hasher.sha1 = Some(Default::default());
    }
    if claimed.checksum_sha256.is_some() {
        hasher.sha256 = Some(Default::default());
    }
    if claimed.checksum_crc64nvme.is_some() {
        hasher.crc64nvme = Some(Default::default());
    }
}

/// Turns on `algorithm` (a trailer's: `x-amz-sdk-checksum-algorithm`).
fn enable_algorithm(hasher: &mut ChecksumHasher, algorithm: &str) {
    match algorithm {
        ChecksumAlgorithm::CRC32 => hasher.crc32 = Some(Default::default()),
        ChecksumAlgorithm::CRC32C => hasher.crc32c = Some(Default::default()),
        ChecksumAlgorithm::SHA1 => hasher.sha1 = Some(Default::default()),
        ChecksumAlgorithm::SHA256 => hasher.sha256 = Some(Default::default()),
        ChecksumAlgorithm::CRC64NVME => hasher.crc64nvme = Some(Default::default()),
        _ => {}
    }
}

fn hashes_any(hasher: &ChecksumHasher) -> bool {
    hasher.crc32.is_some()
        || hasher.crc32c.is_some()
        || hasher.sha1.is_some()
        || hasher.sha256.is_some()
        || hasher.crc64nvme.is_some()
}

/// A request body as its upload sees it: where the call waits, and the
/// body's own failure.
struct Tracker {
    /// `Some(t)`: waiting for the upstream (to take the next piece, or to
    /// answer) since `t`; `None`: for the body's source.
    waiting: Mutex<Option<Instant>>,
    failure: Mutex<Option<S3Error>>,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            waiting: Mutex::new(Some(Instant::now())),
            failure: Mutex::new(None),
        }
    }

    fn waiting_since(&self) -> Option<Instant> {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_waiting(&self, since: Option<Instant>) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = since;
    }

    fn fail(&self, e: S3Error) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if failure.is_none() {
            *failure = Some(e);
        }
    }

    fn take_failure(&self) -> Option<S3Error> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// A request's body on its way to the upstream: exactly `expected` bytes
/// (if known), checked by `check` at its end. The latest piece is held back
/// until the next one comes or the checks at the end pass, so that a body
/// that fails, even at its very end, never reaches the upstream whole: any
/// failure is recorded in the tracker (the call's answer) and ends the
/// stream with an error, and the HTTP client abandons the request.
struct Outgoing {
    inner: StreamingBlob,
    expected: Option<u64>,
    /// Bytes taken from `inner`.
    taken: u64,
    check: Option<Check>,
    tracker: Arc<Tracker>,
    held: Option<Bytes>,
    /// `inner` has ended and every check passed: what is held goes.
    passed: bool,
    over: bool,
}

impl Outgoing {
    fn new(
        inner: StreamingBlob,
        expected: Option<u64>,
        check: Option<Check>,
        tracker: Arc<Tracker>,
    ) -> Outgoing {
        Outgoing {
            inner,
            expected,
            taken: 0,
            check,
            tracker,
            held: None,
            passed: false,
            over: false,
        }
    }

    fn fail(&mut self, e: S3Error) -> Poll<Option<Result<Bytes, StdError>>> {
        self.over = true;
        self.held = None;
        let text = e.message().unwrap_or("the request body failed").to_owned();
        self.tracker.fail(e);
        Poll::Ready(Some(Err(Box::new(std::io::Error::other(text)))))
    }

    /// Hands `chunk` to the upstream: from now on the call waits for it.
    fn send(&mut self, chunk: Option<Bytes>) -> Poll<Option<Result<Bytes, StdError>>> {
        self.tracker.set_waiting(Some(Instant::now()));
        if chunk.is_none() {
            self.over = true;
        }
        Poll::Ready(chunk.map(Ok))
    }

    /// The checks at the body's end.
    fn end(&mut self) -> S3Result<()> {
        if let Some(expected) = self.expected {
            if self.taken != expected {
                let taken = self.taken;
                return Err(s3_error!(
                    IncompleteBody,
                    "the request body ended after {taken} of its {expected} bytes; nothing \
                     was stored"
                ));
            }
        }
        match self.check.take() {
            Some(check) => check.finish(),
            None => Ok(()),
        }
    }
}

impl Stream for Outgoing {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.over {
                return Poll::Ready(None);
            }
            if this.passed {
                let held = this.held.take();
                return this.send(held);
            }
            this.tracker.set_waiting(None);
            match this.inner.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    this.taken += chunk.len() as u64;
                    if let Some(expected) = this.expected {
                        if this.taken > expected {
                            return this.fail(s3_error!(
                                IncompleteBody,
                                "the request body runs past its {expected} bytes; nothing \
                                 was stored"
                            ));
                        }
                    }
                    if let Some(check) = &mut this.check {
                        check.update(&chunk);
                    }
                    if chunk.is_empty() {
                        continue;
                    }
                    if let Some(previous) = this.held.replace(chunk) {
                        return this.send(Some(previous));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let taken = this.taken;
                    return this.fail(body_failure(e, taken));
                }
                Poll::Ready(None) => match this.end() {
                    Ok(()) => this.passed = true,
                    Err(e) => return this.fail(e),
                },
            }
        }
    }
}

impl ByteStream for Outgoing {
    fn remaining_length(&self) -> RemainingLength {
        match self.expected {
            Some(expected) => {
                let left = expected.saturating_sub(self.taken)
                    + self.held.as_ref().map_or(0, |h| h.len() as u64);
                usize::try_from(left)
                    .map(RemainingLength::new_exact)
                    .unwrap_or_else(|_| RemainingLength::unknown())
            }
            None => RemainingLength::unknown(),
        }
    }
}

/// The S3 error for a request body's own failure after `sent` bytes: the
/// body's S3 error as it is (a bad aws-chunked signature...), else 400
/// IncompleteBody with the cause.
fn body_failure(e: StdError, sent: u64) -> S3Error {
    match e.downcast::<S3Error>() {
        Ok(e) => *e,
        Err(e) => s3_error!(
            IncompleteBody,
            "the request body failed after {sent} bytes: {e}; nothing was stored"
        ),
    }
}

/// A PutObject's body read part by part, with the whole object's
/// checksums the gateway checks.
struct Parts {
    body: StreamingBlob,
    /// What was read past the last part.
    carry: Option<Bytes>,
    expected: Option<u64>,
    /// Bytes taken from the body.
    read: u64,
    /// Bytes handed out in parts.
    given: u64,
    check: Option<Check>,
    /// The body has ended.
    ended: bool,
}

impl Parts {
    fn new(body: StreamingBlob, expected: Option<u64>, check: Option<Check>) -> Parts {
        Parts {
            body,
            carry: None,
            expected,
            read: 0,
            given: 0,
            check,
            ended: false,
        }
    }

    /// The next `want` bytes, fewer only at the body's end.
    async fn next(&mut self, want: usize) -> S3Result<Bytes> {
        let Some(expected) = self.expected else {
            let part = self.fill(want).await?;
            self.given += part.len() as u64;
            return Ok(part);
        };
        let left = expected - self.given;
        let want = usize::try_from(left).map_or(want, |left| left.min(want));
        let part = self.fill(want).await?;
        self.given += part.len() as u64;
        if part.len() < want {
            let read = self.read;
            return Err(s3_error!(
                IncompleteBody,
                "the request body ended after {read} of its {expected} bytes; nothing was \
                 stored"
            ));
        }
        if self.given == expected {
            // Nothing may follow.
            if self.carry.is_some() || !self.fill(1).await?.is_empty() {
                return Err(s3_error!(
                    IncompleteBody,
                    "the request body runs past its {expected} bytes; nothing was stored"
                ));
            }
            self.ended = true;
        }
        Ok(part)
    }

    /// Up to `want` bytes, fewer only at the body's end (then `ended`).
    async fn fill(&mut self, want: usize) -> S3Result<Bytes> {
        let mut part = BytesMut::new();
        while part.len() < want {
            let chunk = match self.carry.take() {
                Some(chunk) => chunk,
                None => match self.body.next().await {
                    Some(Ok(chunk)) => {
                        self.read += chunk.len() as u64;
                        if let Some(check) = &mut self.check {
                            check.update(&chunk);
                        }
                        chunk
                    }
                    Some(Err(e)) => return Err(body_failure(e, self.read)),
                    None => {
                        self.ended = true;
                        break;
                    }
                },
            };
            let room = want - part.len();
            if chunk.len() > room {
                part.extend_from_slice(&chunk[..room]);
                self.carry = Some(chunk.slice(room..));
            } else if part.is_empty() && chunk.len() == want {
                return Ok(chunk);
            } else {
                if part.capacity() == 0 {
                    part.reserve(want);
                }
                part.extend_from_slice(&chunk);
            }
        }
        Ok(part.freeze())
    }

    /// Checks the whole object's checksums: the body has ended.
    fn finish(&mut self) -> S3Result<()> {
        match self.check.take() {
            Some(check) => check.finish(),
            None => Ok(()),
        }
    }
}

/// A response body from the upstream: each piece must come within the
/// time-out of being asked for, else the body ends with an error (and the
/// client's response is cut short, as a failed body must be).
struct Incoming {
    inner: StreamingBlob,
    timeout: Duration,
    endpoint: Arc<str>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    over: bool,
}

impl Stream for Incoming {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.over {
            return Poll::Ready(None);
        }
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(item) => {
                this.sleep = None;
                Poll::Ready(item)
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => {
                        this.over = true;
                        let text = format!(
                            "upstream {}: the object's body stalled for {} ms \
                             (--upstream-timeout-ms)",
                            this.endpoint,
                            timeout.as_millis()
                        );
                        eprintln!("hipobj-s3-server: {text}");
                        Poll::Ready(Some(Err(Box::new(std::io::Error::other(text)))))
                    }
                }
            }
        }
    }
}

impl ByteStream for Incoming {
    fn remaining_length(&self) -> RemainingLength {
        self.inner.remaining_length()
    }
}

impl Backend for Upstream {
    fn describe(&self) -> String {
        format!("upstream {}", self.endpoint)
    }
}

/// The `S3` implementation: PutObject, GetObject and UploadPart as above,
/// then every other operation the gateway serves, through the proxy (with
/// the SDK error type of each).
macro_rules! upstream_s3 {
    ($($op:ident: $input:ident => $output:ident, $error:ident, $slow:expr;)*) => {
        #[async_trait::async_trait]
        impl S3 for Upstream {
            async fn put_object(
                &self,
                req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                let len = req.input.content_length.and_then(|n| u64::try_from(n).ok());
                match len {
                    Some(len) if len <= self.multipart_bytes => {
                        let input = &req.input;
                        let check = Check::single(
                            &req.headers,
                            checksums!(input),
                            input.content_md5.as_ref(),
                            input.checksum_algorithm.as_ref(),
                            req.trailing_headers.clone(),
                        );
                        self.put_single(req, check).await
                    }
                    _ => self.put_multipart(req, len).await,
                }
            }

            async fn get_object(
                &self,
                mut req: S3Request<GetObjectInput>,
            ) -> S3Result<S3Response<GetObjectOutput>> {
                // Asked by the header, not the input: the SDK would check
                // the bytes too ([`AskChecksum`]).
                let ask = req
                    .input
                    .checksum_mode
                    .take_if(|mode| mode.as_str() == ChecksumMode::ENABLED)
                    .is_some();
                let mut resp = self
                    .call::<op::get_object::GetObjectError, _>(
                        "GetObject",
                        false,
                        None,
                        ASK_CHECKSUM.scope(ask, self.proxy.get_object(req)),
                    )
                    .await?;
                if let Some(body) = resp.output.body.take() {
                    resp.output.body = Some(StreamingBlob::new(Incoming {
                        inner: body,
                        timeout: self.timeout,
                        endpoint: Arc::clone(&self.endpoint),
                        sleep: None,
                        over: false,
                    }));
                }
                Ok(resp)
            }

            async fn upload_part(
                &self,
                mut req: S3Request<UploadPartInput>,
            ) -> S3Result<S3Response<UploadPartOutput>> {
                let body = req.input.body.take().unwrap_or_else(empty_blob);
                let expected = req.input.content_length.and_then(|n| u64::try_from(n).ok());
                let tracker = Arc::new(Tracker::new());
                let input = &req.input;
                let check = Check::single(
                    &req.headers,
                    checksums!(input),
                    input.content_md5.as_ref(),
                    input.checksum_algorithm.as_ref(),
                    req.trailing_headers.clone(),
                );
                req.input.body = Some(StreamingBlob::new(Outgoing::new(
                    body,
                    expected,
                    check,
                    Arc::clone(&tracker),
                )));
                let what = format!("UploadPart {}", req.input.part_number);
                self.call::<op::upload_part::UploadPartError, _>(
                    &what,
                    false,
                    Some(&tracker),
                    self.proxy.upload_part(req),
                )
                .await
            }

            async fn get_bucket_location(
                &self,
                req: S3Request<GetBucketLocationInput>,
            ) -> S3Result<S3Response<GetBucketLocationOutput>> {
                self.bucket_location(req).await
            }

            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.call::<op::$op::$error, _>(
                        stringify!($input).trim_end_matches("Input"),
                        $slow,
                        None,
                        self.proxy.$op(req),
                    )
                    .await
                }
            )*
        }
    };
}

upstream_s3! {
    create_bucket: CreateBucketInput => CreateBucketOutput, CreateBucketError, false;
    copy_object: CopyObjectInput => CopyObjectOutput, CopyObjectError, true;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput, DeleteBucketError, false;
    delete_object: DeleteObjectInput => DeleteObjectOutput, DeleteObjectError, false;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput, DeleteObjectsError, false;
    head_bucket: HeadBucketInput => HeadBucketOutput, HeadBucketError, false;
    head_object: HeadObjectInput => HeadObjectOutput, HeadObjectError, false;
    list_buckets: ListBucketsInput => ListBucketsOutput, ListBucketsError, false;
    list_objects: ListObjectsInput => ListObjectsOutput, ListObjectsError, false;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output, ListObjectsV2Error, false;
    list_object_versions: ListObjectVersionsInput => ListObjectVersionsOutput,
        ListObjectVersionsError, false;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput,
        CreateMultipartUploadError, false;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput, UploadPartCopyError, true;
    list_parts: ListPartsInput => ListPartsOutput, ListPartsError, false;
    list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput,
        ListMultipartUploadsError, false;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput,
        CompleteMultipartUploadError, true;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput,
        AbortMultipartUploadError, false;
    get_object_attributes: GetObjectAttributesInput => GetObjectAttributesOutput,
        GetObjectAttributesError, false;
    get_object_tagging: GetObjectTaggingInput => GetObjectTaggingOutput,
        GetObjectTaggingError, false;
    put_object_tagging: PutObjectTaggingInput => PutObjectTaggingOutput,
        PutObjectTaggingError, false;
    delete_object_tagging: DeleteObjectTaggingInput => DeleteObjectTaggingOutput,
        DeleteObjectTaggingError, false;
    get_bucket_versioning: GetBucketVersioningInput => GetBucketVersioningOutput,
        GetBucketVersioningError, false;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    fn stream(items: Vec<Result<&'static [u8], &'static str>>) -> StreamingBlob {
        let items: Vec<Result<Bytes, std::io::Error>> = items
            .into_iter()
            .map(|i| i.map(Bytes::from_static).map_err(std::io::Error::other))
            .collect();
        StreamingBlob::wrap(futures::stream::iter(items))
    }

    /// What an `Outgoing` hands on, and its recorded failure.
    fn drain(out: Outgoing) -> (Vec<Result<Bytes, String>>, Option<S3Error>) {
        let tracker = Arc::clone(&out.tracker);
        let items = block_on(out.map(|i| i.map_err(|e| e.to_string())).collect());
        (items, tracker.take_failure())
    }

    #[test]
    fn parts_are_cut_at_the_part_size_whatever_the_chunks() {
        let body = stream(vec![Ok(b"abc"), Ok(b"defgh"), Ok(b"ijklmno")]);
        let mut parts = Parts::new(body, Some(15), None);
        let mut got = Vec::new();
        block_on(async {
            while !parts.ended {
                got.push(parts.next(4).await.unwrap());
            }
        });
        assert_eq!(got, ["abcd", "efgh", "ijkl", "mno"]);
        // The last chunk read holds more than one part.
        let mut parts = Parts::new(stream(vec![Ok(b"ab"), Ok(b"cdefghij")]), Some(10), None);
        let mut got = Vec::new();
        block_on(async {
            while !parts.ended {
                got.push(parts.next(4).await.unwrap());
            }
        });
        assert_eq!(got, ["abcd", "efgh", "ij"]);
    }

    #[test]
    fn a_body_short_of_or_past_its_length_is_refused() {
        block_on(async {
            let mut short = Parts::new(stream(vec![Ok(b"abcdef")]), Some(8), None);
            assert_eq!(short.next(4).await.unwrap(), "abcd");
            let e = short.next(4).await.unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::IncompleteBody);
            let mut long = Parts::new(stream(vec![Ok(b"abcdefghi")]), Some(8), None);
            assert_eq!(long.next(4).await.unwrap(), "abcd");
            let e = long.next(4).await.unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::IncompleteBody);
            let mut failed = Parts::new(stream(vec![Ok(b"ab"), Err("lost")]), Some(8), None);
            let e = failed.next(4).await.unwrap_err();
            assert!(e.message().unwrap().contains("lost"), "{e:?}");
        });
    }

    #[test]
    fn the_last_piece_is_held_back_until_the_body_passed_its_checks() {
        let tracker = Arc::new(Tracker::new());
        let ok = Outgoing::new(
            stream(vec![Ok(b"ab"), Ok(b""), Ok(b"cd")]),
            Some(4),
            None,
            Arc::clone(&tracker),
        );
        let (items, failure) = drain(ok);
        assert_eq!(items, [Ok(Bytes::from("ab")), Ok(Bytes::from("cd"))]);
        assert!(failure.is_none());

        // A failure after the last byte: the last piece never goes.
        let failed = Outgoing::new(
            stream(vec![Ok(b"ab"), Ok(b"cd"), Err("checksum mismatch")]),
            Some(4),
            None,
            Arc::new(Tracker::new()),
        );
        let (items, failure) = drain(failed);
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(items[0], Ok(Bytes::from("ab")));
        assert!(items[1].as_ref().unwrap_err().contains("checksum mismatch"));
        assert!(failure
            .unwrap()
            .message()
            .unwrap()
            .contains("checksum mismatch"));

        // Short of its length, or past it: what came before the last
        // piece at most.
        for (chunks, sent) in [
            (vec![Ok(&b"ab"[..]), Ok(b"cd")], 1),
            (vec![Ok(b"ab"), Ok(b"cdef")], 0),
        ] {
            let (items, failure) = drain(Outgoing::new(
                stream(chunks),
                Some(5),
                None,
                Arc::new(Tracker::new()),
            ));
            assert_eq!(items.len(), sent + 1, "{items:?}");
            assert!(items[sent].is_err());
            assert_eq!(*failure.unwrap().code(), S3ErrorCode::IncompleteBody);
        }

        // A checksum that is not the body's.
        let check = Check {
            hasher: ChecksumHasher::default(),
            claimed: s3s::dto::Checksum::default(),
            md5: Some((Md5::new(), "1B2M2Y8AsgTpgAmY7PhCfg==".to_owned())),
            trailer: None,
        };
        let (items, failure) = drain(Outgoing::new(
            stream(vec![Ok(b"ab"), Ok(b"cd")]),
            Some(4),
            Some(check),
            Arc::new(Tracker::new()),
        ));
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[1].is_err());
        assert_eq!(*failure.unwrap().code(), S3ErrorCode::BadDigest);
    }

    #[test]
    fn the_time_out_counts_while_the_upstream_is_waited_for_only() {
        let tracker = Arc::new(Tracker::new());
        assert!(tracker.waiting_since().is_some(), "connecting");
        let pending = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from("ab"))])
            .chain(futures::stream::pending());
        let mut out = Outgoing::new(
            StreamingBlob::wrap(pending),
            None,
            None,
            Arc::clone(&tracker),
        );
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut out).poll_next(&mut cx).is_pending());
        assert_eq!(tracker.waiting_since(), None, "on the body's source");
    }

    #[test]
    fn parts_grow_where_ten_thousand_would_not_hold_the_object() {
        assert_eq!(part_size(Some(100 << 20), 16 << 20).unwrap(), 16 << 20);
        assert_eq!(part_size(None, 16 << 20).unwrap(), 16 << 20);
        // 1 TiB in 10000 parts: 109951163 bytes each, 105 MiB rounded up.
        assert_eq!(part_size(Some(1 << 40), 16 << 20).unwrap(), 105 << 20);
        let e = part_size(Some(MAX_OBJECT_BYTES + 1), 16 << 20).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::EntityTooLarge);
    }

    #[test]
    fn the_whole_crc64nvme_is_combined_from_the_parts() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (a, b) = data.split_at(40_000);
        let crc = |d: &[u8]| crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, d);
        let combined = crc_fast::checksum_combine(
            crc_fast::CrcAlgorithm::Crc64Nvme,
            crc(a),
            crc(b),
            b.len() as u64,
        );
        assert_eq!(combined, crc(&data));
        // S3's form: the base64 of its 8 bytes, big-endian, as s3s computes.
        let mut s3s = ChecksumHasher {
            crc64nvme: Some(Default::default()),
            ..ChecksumHasher::default()
        };
        s3s.update(&data);
        assert_eq!(
            s3s.finalize().checksum_crc64nvme.unwrap(),
            crate::gateway::checksum::crc64nvme_header(combined)
        );
    }

    #[test]
    fn an_answer_without_a_code_gets_the_one_its_status_means() {
        assert_eq!(code_of_status(304), Some(S3ErrorCode::NotModified));
        assert_eq!(code_of_status(404), Some(S3ErrorCode::NoSuchKey));
        assert_eq!(code_of_status(412), Some(S3ErrorCode::PreconditionFailed));
        assert_eq!(code_of_status(418), None);
    }
}
