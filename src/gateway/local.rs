//! The local backend: buckets as directories of one root on this machine
//! (`--root`), through s3s's filesystem backend (s3s-fs, pinned at 0.14.1),
//! with what s3s-fs 0.14.1 gets wrong put right in front of it
//! (`tests/gateway_local.rs` shows each):
//!
//! - **Nothing is stored whose checksum failed.** s3s-fs's PutObject
//!   renames its temporary file into place *before* it compares the body
//!   with `x-amz-checksum-*` and `Content-MD5`, so a PUT answered 400
//!   BadDigest has replaced the object all the same; its UploadPart checks
//!   nothing. Here the body is checked as it streams (`Verified`): a
//!   mismatch ends the stream with an error, so s3s-fs never renames its
//!   temporary file (its `FileWriter` removes the file when dropped), and
//!   the answer is 400 BadDigest naming the algorithm and both values.
//!   Checksums that come as aws-chunked trailers (as boto3 sends them) are
//!   read once the body has ended. A part's answer carries its checksum, as
//!   S3's does.
//! - **An object replaced by a multipart upload loses the old checksums.**
//!   s3s-fs keeps an object's ETag and checksums in an info file of its own
//!   (`Local::info_file`); its CompleteMultipartUpload writes the new ETag
//!   there next to the old object's checksums, which GET then serves, and
//!   boto3 refuses every such object. They are removed once the upload
//!   completes, and GET and HEAD serve none with a multipart ETag (an
//!   object stored before this fix). (CopyObject writes its source's info
//!   whole: no stale checksum.) CompleteMultipartUpload with a part never
//!   stored is refused before s3s-fs forgets the upload.
//! - **A multipart object has its whole CRC64/NVME.** s3s-fs keeps no
//!   checksum for it, so a client that checks what it reads (ours, by
//!   default) could not. CompleteMultipartUpload computes the CRC64/NVME of
//!   the parts it joins, refuses a request whose full-object
//!   `x-amz-checksum-crc64nvme` differs (400 BadDigest, before anything is
//!   joined: the upload and the object it would replace stay), and keeps
//!   it in the info file (`WHOLE_CRC64NVME`); GET and HEAD serve it, typed
//!   `FULL_OBJECT`.
//! - **A read is one version.** s3s-fs opens an object's file, then reads
//!   its ETag from its info file; its PutObject renames the new file into
//!   place, then writes the info; nothing orders a GET after or before a
//!   PUT of the same key. Here every write that replaces or removes an
//!   object marks its key while it commits (a PutObject from the end of its
//!   body to its answer; CompleteMultipartUpload, CopyObject, DeleteObject
//!   and DeleteObjects for their whole call), and a GET or HEAD is made
//!   while no commit of its key runs and kept only if none ended meanwhile
//!   (`Commits`); else it is made again. The file it opened goes with a
//!   GET's answer ([`ObjectFile`]), so an RDMA GET reads the bytes of the
//!   version it answered for, never a path resolved again. One gateway
//!   process per root.
//! - **Conditional reads.** s3s-fs ignores `If-Match`, `If-None-Match`,
//!   `If-Modified-Since` and `If-Unmodified-Since` on GET and HEAD; here
//!   they are evaluated on the version read, in RFC 9110's order, as S3
//!   does: 412 PreconditionFailed or 304 NotModified.
//! - **Suffix ranges** (`bytes=-N`) are resolved against the length of the
//!   version read (s3s-fs fails a suffix longer than the object, and
//!   answers one of an empty object with a last byte of 2^64 - 1;
//!   [`range::for_backend`]).
//! - **Listings carry ETags**, from the info files, as S3's do (s3s-fs's
//!   have none): a client pins the downloads of a listing to them.
//! - **Buckets are made by CreateBucket only** (or the server's
//!   `--bucket`). s3s-fs makes a bucket's directory for a PUT into it, and
//!   answers NoSuchKey for a GET in a missing bucket. Here every operation
//!   on a bucket that does not exist answers NoSuchBucket before s3s-fs
//!   sees it; a key whose path climbs out of its bucket (`../b/k`, which
//!   s3s-fs resolves under the root, not the bucket) is refused, and so is
//!   each such key of a DeleteObjects, in its answer's `Errors` (s3s-fs
//!   would delete another bucket's object, an info file or an upload's
//!   part).
//! - **A GET's body is read in 1 MiB blocks** from the file it answered
//!   from (`file_body`); s3s-fs reads 4 KiB at a time, each a trip
//!   through the runtime's blocking pool and a piece for a gateway in front
//!   to receive and send on (twelve times the CPU time per byte there).

use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{s3_error, S3Request, S3Response, S3Result, StdError, TrailingHeaders, S3};
use s3s_fs::FileSystem;

use super::backend::{delegate_s3, Backend};
use super::range;

/// Buckets as directories of `root`.
pub struct Local {
    fs: FileSystem,
    /// The root, canonical, as s3s-fs resolves paths under it.
    root: PathBuf,
    /// Names this backend's temporary files.
    next_temp: AtomicU64,
    /// The writes committing now, by key.
    commits: Arc<Commits>,
}

/// How long a read waits for the writes of its key to commit before it
/// gives up (503 SlowDown): a PutObject commits in a rename and a small
/// write; a CompleteMultipartUpload joins its parts meanwhile.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Stripes of [`Commits`]: keys that share one only wait on one another's
/// commits now and then.
const STRIPES: usize = 4096;

/// The writes that replace or remove objects, committing now, by key
/// (hashed into [`STRIPES`]), and how many have ended: a read made while
/// its stripe had no commit running, and after which none ended, saw one
/// version of its object (its file and its info alike).
struct Commits {
    stripes: Mutex<Vec<Stripe>>,
    ended: tokio::sync::Notify,
}

#[derive(Clone, Copy, Default)]
struct Stripe {
    running: usize,
    ended: u64,
}

impl Commits {
    fn new() -> Arc<Commits> {
        Arc::new(Commits {
            stripes: Mutex::new(vec![Stripe::default(); STRIPES]),
            ended: tokio::sync::Notify::new(),
        })
    }

    fn stripe(bucket: &str, key: &str) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (bucket, key).hash(&mut h);
        usize::try_from(h.finish() % STRIPES as u64).unwrap_or(0)
    }

    /// A write of `bucket/key` commits until the guard drops.
    fn begin(self: &Arc<Commits>, bucket: &str, key: &str) -> Committing {
        let stripe = Commits::stripe(bucket, key);
        self.stripes.lock()[stripe].running += 1;
        Committing {
            commits: Arc::clone(self),
            stripe,
        }
    }

    /// Once no commit of `bucket/key`'s stripe runs: how many have ended,
    /// for [`Commits::unchanged`]. SlowDown after [`SETTLE`].
    async fn settled(&self, bucket: &str, key: &str) -> S3Result<(usize, u64)> {
        let stripe = Commits::stripe(bucket, key);
        let deadline = tokio::time::Instant::now() + SETTLE;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let now = self.stripes.lock()[stripe];
            if now.running == 0 {
                return Ok((stripe, now.ended));
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return Err(s3_error!(
                    SlowDown,
                    "{bucket}/{key} has been being written for {SETTLE:?}; try again"
                ));
            }
        }
    }

    /// Whether no commit of the stripe ran or ended since `seen`.
    fn unchanged(&self, (stripe, ended): (usize, u64)) -> bool {
        let now = self.stripes.lock()[stripe];
        now.running == 0 && now.ended == ended
    }
}

/// A write committing ([`Commits::begin`]).
struct Committing {
    commits: Arc<Commits>,
    stripe: usize,
}

impl Drop for Committing {
    fn drop(&mut self) {
        {
            let mut stripes = self.commits.stripes.lock();
            let stripe = &mut stripes[self.stripe];
            stripe.running = stripe.running.saturating_sub(1);
            stripe.ended += 1;
        }
        self.commits.ended.notify_waiters();
    }
}

/// The file of the object a GetObject answered for, opened while its
/// version was read (the answer's extensions carry it, for a backend that
/// keeps objects as files of this machine): an RDMA GET reads the answer's
/// bytes from it in chunk-sized calls rather than through the backend's
/// stream, and never opens a path again (which another version may hold
/// by then). The answer's bytes start at its Content-Range's first byte.
#[derive(Clone)]
pub struct ObjectFile(pub Arc<std::fs::File>);

impl Local {
    /// The backend over `root`, which must exist.
    pub fn open(root: &Path) -> Result<Local, String> {
        let fs = FileSystem::new(root).map_err(|e| format!("opening {}: {e:?}", root.display()))?;
        let root = root
            .canonicalize()
            .map_err(|e| format!("opening {}: {e}", root.display()))?;
        Ok(Local {
            fs,
            root,
            next_temp: AtomicU64::new(0),
            commits: Commits::new(),
        })
    }

    /// Runs before every operation: the bucket it names must exist, and
    /// its key (and a copy's source) must stay inside its bucket.
    async fn before<T: Addressed>(&self, req: &S3Request<T>) -> S3Result<()> {
        let input = &req.input;
        if let Some(bucket) = input.bucket() {
            self.check_bucket(bucket)?;
            if let Some(key) = input.key() {
                check_key(bucket, key)?;
            }
        }
        if let Some((bucket, key)) = input.source() {
            self.check_bucket(bucket)?;
            check_key(bucket, key)?;
        }
        Ok(())
    }

    /// NoSuchBucket unless `bucket` is a directory of the root.
    fn check_bucket(&self, bucket: &str) -> S3Result<()> {
        let one = plain(bucket) && Path::new(bucket).components().count() == 1;
        if one && self.root.join(bucket).is_dir() {
            return Ok(());
        }
        Err(s3_error!(
            NoSuchBucket,
            "no bucket {bucket} on this server: buckets are made by CreateBucket \
             (or hipobj-s3-server --bucket)"
        ))
    }

    /// GetObject of one version ([`Commits`]), its conditions evaluated
    /// on it, a suffix range resolved against its length, without the
    /// checksums of an object a multipart upload replaced (see
    /// [`no_stale_checksums`]); with the file it was read from
    /// ([`ObjectFile`]) for a key that names a plain path.
    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let path = self.object_path(&bucket, &key);
        loop {
            let seen = self.commits.settled(&bucket, &key).await?;
            let file = match &path {
                Some(path) => open(path).await,
                None => None,
            };
            let mut input = req.input.clone();
            if let Some(range @ Range::Suffix { .. }) = input.range {
                let head = HeadObjectInput {
                    bucket: bucket.clone(),
                    key: key.clone(),
                    ..HeadObjectInput::default()
                };
                let len = self
                    .fs
                    .head_object(crate::gateway::backend::sibling(&req, head))
                    .await?
                    .output
                    .content_length
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(|| s3_error!(InternalError, "no length for {bucket}/{key}"))?;
                input.range = Some(range::for_backend(range, len).ok_or_else(|| {
                    s3_error!(
                        InvalidRange,
                        "the range selects none of the object's {len} bytes"
                    )
                })?);
            }
            let answer = self
                .fs
                .get_object(crate::gateway::backend::sibling(&req, input))
                .await;
            let mut resp = match answer {
                Ok(resp) => resp,
                Err(e) if self.commits.unchanged(seen) => return Err(e),
                Err(_) => continue,
            };
            no_stale_checksums!(resp.output);
            // A range's answer carries no whole-object checksum (as S3, and
            // as s3s-fs for a single PUT's): a client would check the
            // range's bytes against it. A range that covers the object is
            // the whole.
            let output = &resp.output;
            let whole = match (&output.content_range, output.content_length) {
                (None, _) => true,
                (Some(range), Some(len)) => {
                    range
                        .rsplit('/')
                        .next()
                        .and_then(|total| total.parse::<i64>().ok())
                        == Some(len)
                }
                (Some(_), None) => false,
            };
            if whole {
                self.serve_whole(&bucket, &key, &mut resp.output).await;
            }
            if !self.commits.unchanged(seen) {
                continue;
            }
            check_conditions(&req.input, &resp.output, &bucket, &key)?;
            if let Some(file) = file {
                let file = Arc::new(file);
                let len = resp
                    .output
                    .content_length
                    .and_then(|n| u64::try_from(n).ok());
                if let (Some(len), Some(_)) = (len, &resp.output.body) {
                    let (first, _) = range::span(&resp.output, len);
                    resp.output.body = Some(file_body(Arc::clone(&file), first, len));
                }
                resp.extensions.insert(ObjectFile(file));
            }
            return Ok(resp);
        }
    }

    /// HeadObject, as [`Local::get`].
    async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        loop {
            let seen = self.commits.settled(&bucket, &key).await?;
            let answer = self
                .fs
                .head_object(crate::gateway::backend::sibling(&req, req.input.clone()))
                .await;
            let mut resp = match answer {
                Ok(resp) => resp,
                Err(e) if self.commits.unchanged(seen) => return Err(e),
                Err(_) => continue,
            };
            no_stale_checksums!(resp.output);
            self.serve_whole(&bucket, &key, &mut resp.output).await;
            if !self.commits.unchanged(seen) {
                continue;
            }
            check_conditions(&req.input, &resp.output, &bucket, &key)?;
            return Ok(resp);
        }
    }

    /// The file s3s-fs keeps `bucket/key` in, for a key of plain path
    /// components only (s3s-fs resolves `..` and the like virtually under
    /// its root: such keys are read through its stream alone).
    fn object_path(&self, bucket: &str, key: &str) -> Option<PathBuf> {
        (plain(bucket) && plain(key)).then(|| self.root.join(bucket).join(key))
    }

    /// ListObjectsV2, each object with its ETag.
    async fn list_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let bucket = req.input.bucket.clone();
        let mut resp = self.fs.list_objects_v2(req).await?;
        for object in resp.output.contents.iter_mut().flatten() {
            self.fill_etag(&bucket, object).await;
        }
        Ok(resp)
    }

    /// ListObjects, each object with its ETag.
    async fn list_v1(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let bucket = req.input.bucket.clone();
        let mut resp = self.fs.list_objects(req).await?;
        for object in resp.output.contents.iter_mut().flatten() {
            self.fill_etag(&bucket, object).await;
        }
        Ok(resp)
    }

    /// A listed object's ETag, from its info file (an object with none,
    /// stored behind s3s-fs's back, is listed without).
    async fn fill_etag(&self, bucket: &str, object: &mut Object) {
        if object.e_tag.is_some() {
            return;
        }
        let Some(key) = object.key.as_deref() else {
            return;
        };
        let Ok(text) = tokio::fs::read(self.info_file(bucket, key)).await else {
            return;
        };
        let info: Option<serde_json::Map<String, serde_json::Value>> =
            serde_json::from_slice(&text).ok();
        object.e_tag = info
            .as_ref()
            .and_then(|info| info.get("e_tag"))
            .and_then(serde_json::Value::as_str)
            .map(|e_tag| ETag::Strong(e_tag.to_owned()));
    }

    /// CopyObject, its destination committing for the whole call.
    async fn copy(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let _committing = self.commits.begin(&req.input.bucket, &req.input.key);
        self.fs.copy_object(req).await
    }

    /// DeleteObject, committing for the whole call.
    async fn delete(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let _committing = self.commits.begin(&req.input.bucket, &req.input.key);
        self.fs.delete_object(req).await
    }

    /// DeleteObjects, each key checked as DeleteObject's: one that climbs
    /// out of its bucket is answered in `Errors` and never reaches s3s-fs;
    /// the others are deleted, committing for the whole call.
    async fn delete_many(
        &self,
        mut req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let bucket = req.input.bucket.clone();
        let mut refused = Vec::new();
        req.input
            .delete
            .objects
            .retain(|object| match check_key(&bucket, &object.key) {
                Ok(()) => true,
                Err(e) => {
                    refused.push(Error {
                        code: Some(e.code().as_str().to_owned()),
                        key: Some(object.key.clone()),
                        message: e.message().map(str::to_owned),
                        version_id: object.version_id.clone(),
                    });
                    false
                }
            });
        let mut resp = if req.input.delete.objects.is_empty() {
            S3Response::new(DeleteObjectsOutput::default())
        } else {
            let _committing: Vec<Committing> = req
                .input
                .delete
                .objects
                .iter()
                .map(|object| self.commits.begin(&bucket, &object.key))
                .collect();
            self.fs.delete_objects(req).await?
        };
        if !refused.is_empty() {
            resp.output
                .errors
                .get_or_insert_with(Vec::new)
                .extend(refused);
        }
        Ok(resp)
    }

    /// PutObject, its body checked as it streams, committing from the end
    /// of its body (when s3s-fs renames its file into place and writes the
    /// info) to its answer.
    async fn put(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let commit = Commit {
            commits: Arc::clone(&self.commits),
            bucket: req.input.bucket.clone(),
            key: req.input.key.clone(),
            slot: Arc::new(Mutex::new(None)),
        };
        let (resp, _) = self
            .checked(req, Some(&commit), |req| self.fs.put_object(req))
            .await?;
        Ok(resp)
    }

    /// UploadPart, its body checked as it streams; the answer carries the
    /// part's checksums.
    async fn part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let (mut resp, sums) = self
            .checked(req, None, |req| self.fs.upload_part(req))
            .await?;
        if let Some(sums) = sums {
            let out = &mut resp.output;
            out.checksum_crc32 = sums.checksum_crc32;
            out.checksum_crc32c = sums.checksum_crc32c;
            out.checksum_crc64nvme = sums.checksum_crc64nvme;
            out.checksum_sha1 = sums.checksum_sha1;
            out.checksum_sha256 = sums.checksum_sha256;
        }
        Ok(resp)
    }

    /// CompleteMultipartUpload, once every part it lists is known to be
    /// stored (s3s-fs forgets the upload before it reads the parts, so a
    /// part missing, say one refused for its checksum, would lose the
    /// parts stored); then the replaced object's checksums are dropped
    /// from s3s-fs's info file. An upload with no part stored at all (or
    /// none known) is s3s-fs's to answer, as before.
    async fn complete(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let listed = crate::gateway::backend::sibling(
            &req,
            ListPartsInput {
                bucket: bucket.clone(),
                key: key.clone(),
                upload_id: req.input.upload_id.clone(),
                ..ListPartsInput::default()
            },
        );
        let stored = self.fs.list_parts(listed).await?.output.parts;
        let stored = stored.unwrap_or_default();
        let asked = req
            .input
            .multipart_upload
            .as_ref()
            .and_then(|m| m.parts.as_ref());
        let missing = asked
            .into_iter()
            .flatten()
            .map(|part| part.part_number)
            .find(|n| !stored.iter().any(|p| p.part_number == *n));
        if let (Some(n), false) = (missing, stored.is_empty()) {
            return Err(s3_error!(
                InvalidPart,
                "part {} of upload {} was never stored (or was refused); \
                 upload it again, then complete",
                n.map_or_else(|| "(no number)".to_owned(), |n| n.to_string()),
                req.input.upload_id
            ));
        }
        let whole = match whole_parts(&req.input) {
            Some((id, count)) => self.parts_crc64nvme(id, count).await?,
            None => None,
        };
        if let (Some(claimed), Some(whole)) = (&req.input.checksum_crc64nvme, &whole) {
            if claimed != whole {
                return Err(s3_error!(
                    BadDigest,
                    "the CRC64NVME the request gives ({claimed}) is not that of its parts' \
                     bytes ({whole}); nothing was completed"
                ));
            }
        }
        let _committing = self.commits.begin(&bucket, &key);
        let resp = self.fs.complete_multipart_upload(req).await?;
        self.forget_checksums(&bucket, &key, whole.as_deref())
            .await?;
        Ok(resp)
    }

    /// The CRC64/NVME (base64) of parts 1 to `count` of upload `id`, read
    /// from where s3s-fs 0.14.1 keeps them (`resolve_upload_part_path`:
    /// `.upload_id-ID.part-N` at the root); `None` when a part is not there
    /// (s3s-fs then answers for itself).
    async fn parts_crc64nvme(&self, id: &str, count: i32) -> S3Result<Option<String>> {
        use tokio::io::AsyncReadExt;
        let mut hasher = ChecksumHasher {
            crc64nvme: Some(Default::default()),
            ..ChecksumHasher::default()
        };
        let mut block = vec![0u8; 1 << 20];
        for n in 1..=count {
            let path = self.root.join(format!(".upload_id-{id}.part-{n}"));
            let unread = |e: std::io::Error| {
                s3_error!(
                    InternalError,
                    "reading part {n} of upload {id} ({}): {e}",
                    path.display()
                )
            };
            let mut file = match tokio::fs::File::open(&path).await {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(unread(e)),
            };
            loop {
                let read = file.read(&mut block).await.map_err(unread)?;
                if read == 0 {
                    break;
                }
                hasher.update(&block[..read]);
            }
        }
        Ok(hasher.finalize().checksum_crc64nvme)
    }

    /// The whole CRC64/NVME kept for `bucket/key` (`WHOLE_CRC64NVME`), if
    /// its info file holds one for `e_tag`'s object.
    async fn whole_crc64nvme(&self, bucket: &str, key: &str, e_tag: &str) -> Option<String> {
        let text = tokio::fs::read(self.info_file(bucket, key)).await.ok()?;
        let info: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&text).ok()?;
        let same = info.get("e_tag").and_then(serde_json::Value::as_str) == Some(e_tag);
        same.then(|| info.get(WHOLE_CRC64NVME)?.as_str().map(str::to_owned))
            .flatten()
    }

    /// Hands `req` to `store` (s3s-fs's PutObject or UploadPart) with its
    /// body checked against what the request declares ([`Claim`]): a
    /// mismatch fails the body at its end, so s3s-fs stores nothing, and
    /// is the answer. Returns the answer and the body's checksums by the
    /// algorithms the request named, once it was read whole.
    async fn checked<I, O, F, Fut>(
        &self,
        mut req: S3Request<I>,
        commit: Option<&Commit>,
        store: F,
    ) -> S3Result<(S3Response<O>, Option<Checksum>)>
    where
        I: Payload,
        F: FnOnce(S3Request<I>) -> Fut,
        Fut: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        let claim = Claim::of(&req)?;
        if let Some(algorithm) = claim.to_name {
            // A trailer's algorithm, for s3s-fs to compute and keep.
            req.input
                .name_algorithm(ChecksumAlgorithm::from(algorithm.name().to_owned()));
        }
        let verdict = Arc::new(Mutex::new(None));
        if let Some(body) = req.input.body().take() {
            let verified = Verified::new(body, claim, Arc::clone(&verdict), commit.cloned());
            *req.input.body() = Some(StreamingBlob::new(verified));
        } else if let Some(commit) = commit {
            // No body to wait for: it commits from now on.
            commit.begin();
        }
        let answer = store(req).await;
        if let Some(commit) = commit {
            commit.slot.lock().take();
        }
        let found = verdict.lock().take();
        match (answer, found) {
            // s3s-fs saw the body fail: the refusal is why.
            (_, Some(Err(refusal))) => Err(refusal),
            (Err(e), _) => Err(e),
            (Ok(resp), sums) => Ok((resp, sums.and_then(Result::ok))),
        }
    }

    /// [`info_file`] of this backend's root.
    fn info_file(&self, bucket: &str, key: &str) -> PathBuf {
        info_file(&self.root, bucket, key)
    }

    /// Removes the `checksum_*` fields of `bucket/key`'s info file when it
    /// holds a multipart ETag (`HASH-N`), which s3s-fs gives no checksum:
    /// they are the replaced object's. (An info file a PUT wrote since
    /// holds an MD5 ETag, and its own checksums: left alone.) Keeps
    /// `whole`, the object's CRC64/NVME, as `WHOLE_CRC64NVME`. The file is
    /// replaced whole by a rename, from a temporary name that s3s-fs's
    /// start removes if this process dies first.
    async fn forget_checksums(&self, bucket: &str, key: &str, whole: Option<&str>) -> S3Result<()> {
        let path = self.info_file(bucket, key);
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            s3_error!(
                InternalError,
                "the upload of {bucket}/{key} completed, but {what} {} failed: {e}; \
                 its old checksums may still be served",
                path.display()
            )
        };
        let text = match tokio::fs::read(&path).await {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(failed("reading", &e)),
        };
        let mut info: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&text).map_err(|e| failed("parsing", &e))?;
        let multipart = info
            .get("e_tag")
            .and_then(serde_json::Value::as_str)
            .is_some_and(|e_tag| e_tag.contains('-'));
        if !multipart {
            return Ok(());
        }
        let before = info.clone();
        info.retain(|name, _| !name.starts_with("checksum_"));
        match whole {
            Some(crc) => info.insert(WHOLE_CRC64NVME.to_owned(), crc.into()),
            None => info.remove(WHOLE_CRC64NVME),
        };
        if info == before {
            return Ok(());
        }
        let text = serde_json::to_vec(&info).map_err(|e| failed("writing", &e))?;
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let temp = self.root.join(format!(
            ".tmp.local-{}-{n}.internal.part",
            std::process::id()
        ));
        let written = match tokio::fs::write(&temp, &text).await {
            Ok(()) => tokio::fs::rename(&temp, &path).await,
            Err(e) => Err(e),
        };
        written.map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            failed("rewriting", &e)
        })
    }
}

/// The info file's field for a multipart object's whole CRC64/NVME
/// (base64), which CompleteMultipartUpload computes. Not a `checksum_`
/// field: s3s-fs neither reads nor serves it, and `checksum_` fields next
/// to a multipart ETag are a replaced object's ([`no_stale_checksums`]).
const WHOLE_CRC64NVME: &str = "hipobj_full_object_crc64nvme";

/// A GetObject's or HeadObject's answer, for [`Local::serve_whole`] and
/// [`check_conditions`].
trait Served {
    fn e_tag(&self) -> Option<&ETag>;
    fn last_modified(&self) -> Option<&Timestamp>;
    fn set_whole(&mut self, crc: String);
}

macro_rules! served {
    ($($output:ty),*) => {$(
        impl Served for $output {
            fn e_tag(&self) -> Option<&ETag> {
                self.e_tag.as_ref()
            }
            fn last_modified(&self) -> Option<&Timestamp> {
                self.last_modified.as_ref()
            }
            fn set_whole(&mut self, crc: String) {
                self.checksum_crc64nvme = Some(crc);
                self.checksum_type = Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT));
            }
        }
    )*};
}
served!(GetObjectOutput, HeadObjectOutput);

impl Local {
    /// Serves a multipart object's whole CRC64/NVME, where one is kept.
    async fn serve_whole(&self, bucket: &str, key: &str, output: &mut impl Served) {
        let Some(e_tag) = output.e_tag().map(|e| e.value().to_owned()) else {
            return;
        };
        if !e_tag.contains('-') {
            return;
        }
        if let Some(crc) = self.whole_crc64nvme(bucket, key, &e_tag).await {
            output.set_whole(crc);
        }
    }
}

/// The upload id and the part count of a CompleteMultipartUpload whose
/// parts are 1 to N in order (the only list s3s-fs joins), when the id is
/// a UUID as s3s-fs makes them (it names files: nothing else may reach a
/// path).
fn whole_parts(input: &CompleteMultipartUploadInput) -> Option<(&str, i32)> {
    let id = input.upload_id.as_str();
    let uuid = id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        });
    let parts = input.multipart_upload.as_ref()?.parts.as_ref()?;
    let in_order = (1..)
        .zip(parts)
        .all(|(n, part)| part.part_number == Some(n));
    let count = i32::try_from(parts.len()).ok()?;
    (uuid && in_order && count > 0).then_some((id, count))
}

/// Drops a GetObject's or HeadObject's checksums when its ETag is a
/// multipart one (`HASH-N`): s3s-fs gives a multipart upload no checksum,
/// so they are those of an object the upload replaced, which a server
/// before [`Local::forget_checksums`] left in its info file.
macro_rules! no_stale_checksums {
    ($output:expr) => {
        let output = &mut $output;
        if output
            .e_tag
            .as_ref()
            .is_some_and(|e| e.value().contains('-'))
        {
            output.checksum_crc32 = None;
            output.checksum_crc32c = None;
            output.checksum_crc64nvme = None;
            output.checksum_sha1 = None;
            output.checksum_sha256 = None;
        }
    };
}
use no_stale_checksums;

/// Whether `p` is a path of plain components only.
fn plain(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// InvalidArgument unless `key` names a path strictly inside its bucket's
/// directory: s3s-fs joins it to the bucket and resolves `..` under the
/// root, so `../other/k` would reach (or make) another bucket. A `..` that
/// stays inside (`a/../k`) is the key it resolves to, as s3s-fs has it.
fn check_key(bucket: &str, key: &str) -> S3Result<()> {
    let mut depth = 0usize;
    for component in Path::new(key).components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir if depth > 0 => depth -= 1,
            _ => {
                depth = 0;
                break;
            }
        }
    }
    if depth > 0 {
        return Ok(());
    }
    Err(s3_error!(
        InvalidArgument,
        "the key {key:?} does not name a file inside bucket {bucket}'s directory \
         (its `..` climb out of it, or it is empty or absolute): this server \
         keeps objects as files and cannot store it"
    ))
}

/// A GET's or HEAD's conditions.
trait Conditional {
    fn if_match(&self) -> Option<&ETagCondition>;
    fn if_none_match(&self) -> Option<&ETagCondition>;
    fn if_modified_since(&self) -> Option<&Timestamp>;
    fn if_unmodified_since(&self) -> Option<&Timestamp>;
}

macro_rules! conditional {
    ($($input:ty),*) => {$(
        impl Conditional for $input {
            fn if_match(&self) -> Option<&ETagCondition> {
                self.if_match.as_ref()
            }
            fn if_none_match(&self) -> Option<&ETagCondition> {
                self.if_none_match.as_ref()
            }
            fn if_modified_since(&self) -> Option<&Timestamp> {
                self.if_modified_since.as_ref()
            }
            fn if_unmodified_since(&self) -> Option<&Timestamp> {
                self.if_unmodified_since.as_ref()
            }
        }
    )*};
}
conditional!(GetObjectInput, HeadObjectInput);

/// The conditions of a read of `bucket/key` evaluated on the version read
/// (its ETag and time), in RFC 9110's order (section 13.2.2), as S3 does:
/// `If-Match` (else `If-Unmodified-Since`) false is 412
/// PreconditionFailed; then `If-None-Match` (else `If-Modified-Since`)
/// false is 304 NotModified. Times compare to the second, as HTTP dates
/// carry them.
fn check_conditions(
    c: &impl Conditional,
    version: &impl Served,
    bucket: &str,
    key: &str,
) -> S3Result<()> {
    let (e_tag, modified) = (version.e_tag(), version.last_modified());
    let matches = |condition: &ETagCondition| match condition {
        ETagCondition::Any => e_tag.is_some(),
        ETagCondition::ETag(wanted) => e_tag.is_some_and(|e| e.value() == wanted.value()),
    };
    let modified = modified.and_then(to_second);
    let after = |at: &Timestamp| match (&modified, to_second(at)) {
        (Some(modified), Some(at)) => Some(*modified > at),
        _ => None,
    };
    let shown = || e_tag.map_or_else(|| "none".to_owned(), |e| format!("\"{}\"", e.value()));
    match (c.if_match(), c.if_unmodified_since()) {
        (Some(condition), _) if !matches(condition) => {
            return Err(s3_error!(
                PreconditionFailed,
                "If-Match: {bucket}/{key} is now at ETag {}",
                shown()
            ))
        }
        (None, Some(at)) if after(at) == Some(true) => {
            return Err(s3_error!(
                PreconditionFailed,
                "If-Unmodified-Since: {bucket}/{key} was modified since"
            ))
        }
        _ => {}
    }
    match (c.if_none_match(), c.if_modified_since()) {
        (Some(condition), _) if matches(condition) => Err(s3_error!(NotModified)),
        (None, Some(at)) if after(at) == Some(false) => Err(s3_error!(NotModified)),
        _ => Ok(()),
    }
}

/// `at`, to the second (what an HTTP date says).
fn to_second(at: &Timestamp) -> Option<Timestamp> {
    let mut text = Vec::new();
    at.format(TimestampFormat::HttpDate, &mut text).ok()?;
    Timestamp::parse(TimestampFormat::HttpDate, std::str::from_utf8(&text).ok()?).ok()
}

/// How much of an object's file one read of a GET's body takes.
const BODY_BLOCK: usize = 1 << 20;

/// The body of a GET of `len` bytes from `first` in `file`: read in blocks
/// of [`BODY_BLOCK`] on the runtime's blocking pool, where s3s-fs reads its
/// own in 4 KiB pieces, each a trip through that pool and, for a gateway in
/// front, one more piece to receive and send on. The same version as the
/// answer's: the file it was read from. A file cut short in place behind
/// the backend's back ends the body with an error, never with other bytes.
fn file_body(file: Arc<std::fs::File>, first: u64, len: u64) -> StreamingBlob {
    let blocks = futures::stream::try_unfold((file, first, len), |(file, at, left)| async move {
        if left == 0 {
            return Ok(None);
        }
        let n = usize::try_from(left).map_or(BODY_BLOCK, |left| left.min(BODY_BLOCK));
        let read = Arc::clone(&file);
        let block = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            let mut block = vec![0u8; n];
            read.read_exact_at(&mut block, at)
                .map(|()| Bytes::from(block))
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok::<_, std::io::Error>(Some((block, (file, at + n as u64, left - n as u64))))
    });
    StreamingBlob::wrap(blocks)
}

/// The object file at `path`, opened; `None` if it cannot be (there is
/// none, or a directory: s3s-fs answers for it).
async fn open(path: &Path) -> Option<std::fs::File> {
    Some(tokio::fs::File::open(path).await.ok()?.into_std().await)
}

impl Backend for Local {
    fn describe(&self) -> String {
        format!("directory {}", self.root.display())
    }
}

delegate_s3!(Local, fs, [
    create_bucket: CreateBucketInput => CreateBucketOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
], own [
    get_object: GetObjectInput => GetObjectOutput = get;
    head_object: HeadObjectInput => HeadObjectOutput = head;
    put_object: PutObjectInput => PutObjectOutput = put;
    upload_part: UploadPartInput => UploadPartOutput = part;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput = complete;
    copy_object: CopyObjectInput => CopyObjectOutput = copy;
    delete_object: DeleteObjectInput => DeleteObjectOutput = delete;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput = delete_many;
    list_objects: ListObjectsInput => ListObjectsOutput = list_v1;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output = list_v2;
]);

/// What an operation's input reaches on disk.
trait Addressed {
    /// The bucket that must exist; `None` for an operation that names none
    /// or makes it (CreateBucket), and for AbortMultipartUpload, which
    /// must still clean up an upload whose bucket went away.
    fn bucket(&self) -> Option<&str> {
        None
    }
    /// The key, which must stay inside its bucket's directory.
    fn key(&self) -> Option<&str> {
        None
    }
    /// A copy's source object (bucket, key).
    fn source(&self) -> Option<(&str, &str)> {
        None
    }
}

macro_rules! addressed {
    (
        objects: $($object:ident),*;
        copies: $($copy:ident),*;
        buckets: $($bucket:ident),*;
        none: $($none:ident),*;
    ) => {
        $(impl Addressed for $object {
            fn bucket(&self) -> Option<&str> {
                Some(&self.bucket)
            }
            fn key(&self) -> Option<&str> {
                Some(&self.key)
            }
        })*
        $(impl Addressed for $copy {
            fn bucket(&self) -> Option<&str> {
                Some(&self.bucket)
            }
            fn key(&self) -> Option<&str> {
                Some(&self.key)
            }
            fn source(&self) -> Option<(&str, &str)> {
                match &self.copy_source {
                    CopySource::Bucket { bucket, key, .. } => Some((bucket, key)),
                    _ => None,
                }
            }
        })*
        $(impl Addressed for $bucket {
            fn bucket(&self) -> Option<&str> {
                Some(&self.bucket)
            }
        })*
        $(impl Addressed for $none {})*
    };
}

addressed! {
    objects: GetObjectInput, PutObjectInput, UploadPartInput, DeleteObjectInput,
        HeadObjectInput, CreateMultipartUploadInput, ListPartsInput,
        CompleteMultipartUploadInput;
    copies: CopyObjectInput, UploadPartCopyInput;
    buckets: DeleteBucketInput, DeleteObjectsInput, GetBucketLocationInput, HeadBucketInput,
        ListObjectsInput, ListObjectsV2Input, ListMultipartUploadsInput;
    none: CreateBucketInput, ListBucketsInput, AbortMultipartUploadInput;
}

/// The algorithms of `x-amz-checksum-*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    const ALL: [Algorithm; 5] = [
        Algorithm::Crc32,
        Algorithm::Crc32c,
        Algorithm::Crc64Nvme,
        Algorithm::Sha1,
        Algorithm::Sha256,
    ];

    /// S3's name (`x-amz-sdk-checksum-algorithm`).
    fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    /// Its header (or trailer).
    fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    fn by_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    fn by_header(header: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.header().eq_ignore_ascii_case(header))
    }

    /// Turns it on in `hasher`.
    fn enable(self, hasher: &mut ChecksumHasher) {
        match self {
            Algorithm::Crc32 => hasher.crc32 = Some(Default::default()),
            Algorithm::Crc32c => hasher.crc32c = Some(Default::default()),
            Algorithm::Crc64Nvme => hasher.crc64nvme = Some(Default::default()),
            Algorithm::Sha1 => hasher.sha1 = Some(Default::default()),
            Algorithm::Sha256 => hasher.sha256 = Some(Default::default()),
        }
    }

    /// Its value in `sums`.
    fn of(self, sums: &Checksum) -> Option<&str> {
        match self {
            Algorithm::Crc32 => sums.checksum_crc32.as_deref(),
            Algorithm::Crc32c => sums.checksum_crc32c.as_deref(),
            Algorithm::Crc64Nvme => sums.checksum_crc64nvme.as_deref(),
            Algorithm::Sha1 => sums.checksum_sha1.as_deref(),
            Algorithm::Sha256 => sums.checksum_sha256.as_deref(),
        }
    }
}

/// A PUT's or UploadPart's input: its body and what it declares of it.
trait Payload {
    fn body(&mut self) -> &mut Option<StreamingBlob>;
    /// `x-amz-sdk-checksum-algorithm`.
    fn named(&self) -> Option<&str>;
    fn name_algorithm(&mut self, algorithm: ChecksumAlgorithm);
    fn content_md5(&self) -> Option<&str>;
    /// Its `x-amz-checksum-*` headers, as a [`Checksum`].
    fn checksums(&self) -> Checksum;
}

macro_rules! payload {
    ($($ty:ty),*) => {$(
        impl Payload for $ty {
            fn body(&mut self) -> &mut Option<StreamingBlob> {
                &mut self.body
            }
            fn named(&self) -> Option<&str> {
                self.checksum_algorithm.as_ref().map(ChecksumAlgorithm::as_str)
            }
            fn name_algorithm(&mut self, algorithm: ChecksumAlgorithm) {
                self.checksum_algorithm = Some(algorithm);
            }
            fn content_md5(&self) -> Option<&str> {
                self.content_md5.as_deref()
            }
            fn checksums(&self) -> Checksum {
                Checksum {
                    checksum_crc32: self.checksum_crc32.clone(),
                    checksum_crc32c: self.checksum_crc32c.clone(),
                    checksum_crc64nvme: self.checksum_crc64nvme.clone(),
                    checksum_sha1: self.checksum_sha1.clone(),
                    checksum_sha256: self.checksum_sha256.clone(),
                    ..Checksum::default()
                }
            }
        }
    )*};
}
payload!(PutObjectInput, UploadPartInput);

/// What a request says its body hashes to.
struct Claim {
    /// `x-amz-checksum-*` headers.
    headers: Vec<(Algorithm, String)>,
    /// Checksums announced in `x-amz-trailer`, and where they come once
    /// the (aws-chunked) body has ended.
    trailers: Option<(Vec<Algorithm>, TrailingHeaders)>,
    /// Content-MD5, as sent and decoded.
    md5: Option<(String, Vec<u8>)>,
    /// Every algorithm to compute.
    algorithms: Vec<Algorithm>,
    /// A trailer's algorithm that `x-amz-sdk-checksum-algorithm` does not
    /// name: named for s3s-fs, which otherwise compares the trailer with
    /// nothing (after storing the object).
    to_name: Option<Algorithm>,
}

impl Claim {
    /// What `req` declares; refuses what cannot be checked before the
    /// body is read (a malformed Content-MD5, an unknown algorithm, one
    /// named with no value to compare with).
    fn of<I: Payload>(req: &S3Request<I>) -> S3Result<Claim> {
        let input = &req.input;
        let declared = input.checksums();
        let headers: Vec<(Algorithm, String)> = Algorithm::ALL
            .into_iter()
            .filter_map(|a| a.of(&declared).map(|v| (a, v.to_owned())))
            .collect();
        let mut announced = Vec::new();
        if req.trailing_headers.is_some() {
            for value in req.headers.get_all("x-amz-trailer") {
                let value = value.to_str().unwrap_or_default();
                for name in value.split(',').map(str::trim) {
                    if !name.to_ascii_lowercase().starts_with("x-amz-checksum-") {
                        continue;
                    }
                    let algorithm = Algorithm::by_header(name).ok_or_else(|| {
                        s3_error!(
                            InvalidRequest,
                            "x-amz-trailer announces {name}, a checksum this server does not know"
                        )
                    })?;
                    announced.push(algorithm);
                }
            }
        }
        let named = input
            .named()
            .map(|name| {
                Algorithm::by_name(name).ok_or_else(|| {
                    s3_error!(
                        InvalidRequest,
                        "x-amz-sdk-checksum-algorithm {name} is none of CRC32, CRC32C, \
                         CRC64NVME, SHA1, SHA256"
                    )
                })
            })
            .transpose()?;
        let in_headers = |a: Algorithm| headers.iter().any(|(h, _)| *h == a);
        if let Some(named) = named {
            if !in_headers(named) && !announced.contains(&named) {
                return Err(s3_error!(
                    InvalidRequest,
                    "x-amz-sdk-checksum-algorithm {} came with neither an {} header nor that trailer",
                    named.name(),
                    named.header()
                ));
            }
        }
        let unnamed: Vec<Algorithm> = announced
            .iter()
            .copied()
            .filter(|a| !in_headers(*a) && Some(*a) != named)
            .collect();
        let to_name = match (named, unnamed.as_slice()) {
            (_, []) => None,
            (None, [one]) => Some(*one),
            _ => {
                let names: Vec<&str> = announced.iter().map(|a| a.header()).collect();
                return Err(s3_error!(
                    InvalidRequest,
                    "x-amz-trailer announces {}: one checksum trailer per request, of the \
                     algorithm x-amz-sdk-checksum-algorithm names",
                    names.join(", ")
                ));
            }
        };
        let md5 = input
            .content_md5()
            .map(|said| match STANDARD.decode(said) {
                Ok(digest) if digest.len() == 16 => Ok((said.to_owned(), digest)),
                _ => Err(s3_error!(
                    InvalidDigest,
                    "Content-MD5 {said:?} is not the base64 of 16 bytes"
                )),
            })
            .transpose()?;
        let mut algorithms: Vec<Algorithm> = headers.iter().map(|(a, _)| *a).collect();
        algorithms.extend(announced.iter().copied());
        algorithms.extend(named);
        let trailers = req
            .trailing_headers
            .clone()
            .filter(|_| !announced.is_empty())
            .map(|handle| (announced, handle));
        Ok(Claim {
            headers,
            trailers,
            md5,
            algorithms,
            to_name,
        })
    }

    /// A hasher of every algorithm to check.
    fn hasher(&self) -> ChecksumHasher {
        let mut hasher = ChecksumHasher::default();
        for algorithm in &self.algorithms {
            algorithm.enable(&mut hasher);
        }
        hasher
    }

    /// `sums` (and `md5`) of the whole body against the claim, once the
    /// body has ended (its trailers have come).
    fn check(&self, sums: Checksum, md5: Option<[u8; 16]>) -> S3Result<Checksum> {
        let mismatch = |algorithm: &str, is: &str, header: &str, how: &str, said: &str| {
            s3_error!(
                BadDigest,
                "the body's {algorithm} is {is}, but the request's {header} {how} says \
                 {said}; nothing was stored"
            )
        };
        for (algorithm, said) in &self.headers {
            let is = algorithm.of(&sums).unwrap_or_default();
            if is != said {
                let (name, header) = (algorithm.name(), algorithm.header());
                return Err(mismatch(name, is, header, "header", said));
            }
        }
        if let Some((announced, handle)) = &self.trailers {
            let came: Vec<(String, String)> = handle
                .read(|trailers| {
                    trailers
                        .iter()
                        .filter(|(name, _)| name.as_str().starts_with("x-amz-checksum-"))
                        .map(|(name, value)| {
                            let value = value.to_str().unwrap_or_default();
                            (name.as_str().to_owned(), value.to_owned())
                        })
                        .collect()
                })
                .unwrap_or_default();
            for (name, said) in &came {
                let algorithm = Algorithm::by_header(name)
                    .filter(|a| announced.contains(a))
                    .ok_or_else(|| {
                        s3_error!(
                            InvalidRequest,
                            "the trailer {name} was not announced in x-amz-trailer; \
                             nothing was stored"
                        )
                    })?;
                let is = algorithm.of(&sums).unwrap_or_default();
                if is != said {
                    return Err(mismatch(algorithm.name(), is, name, "trailer", said));
                }
            }
            if let Some(missing) = announced
                .iter()
                .find(|a| !came.iter().any(|(name, _)| name == a.header()))
            {
                return Err(s3_error!(
                    InvalidRequest,
                    "x-amz-trailer announces {}, but the body ended without it; \
                     nothing was stored",
                    missing.header()
                ));
            }
        }
        if let (Some((said, want)), Some(is)) = (&self.md5, md5) {
            if want[..] != is[..] {
                let is = STANDARD.encode(is);
                return Err(mismatch("MD5", &is, "Content-MD5", "header", said));
            }
        }
        Ok(sums)
    }
}

/// What a [`Verified`] body found once it ended: the body's checksums, or
/// the refusal its mismatch is answered with.
type Verdict = Arc<Mutex<Option<S3Result<Checksum>>>>;

/// A request's body, hashed as s3s-fs reads it; at its end, checked
/// against the request's [`Claim`]: a mismatch is one more item, an error,
/// so s3s-fs fails its copy and never renames its temporary file into
/// place. The refusal itself goes to the handler through the verdict.
struct Verified {
    body: StreamingBlob,
    hasher: ChecksumHasher,
    md5: Option<Md5>,
    /// `None` once the body ended.
    claim: Option<Claim>,
    verdict: Verdict,
    /// The write that commits once the body ended whole and checked.
    commit: Option<Commit>,
}

impl Verified {
    fn new(
        body: StreamingBlob,
        claim: Claim,
        verdict: Verdict,
        commit: Option<Commit>,
    ) -> Verified {
        Verified {
            body,
            hasher: claim.hasher(),
            md5: claim.md5.as_ref().map(|_| Md5::default()),
            claim: Some(claim),
            verdict,
            commit,
        }
    }
}

/// A PutObject's commit ([`Commits`]): begun when its body has ended (the
/// store renames its file into place next), held in `slot` until its
/// answer.
#[derive(Clone)]
struct Commit {
    commits: Arc<Commits>,
    bucket: String,
    key: String,
    slot: Arc<Mutex<Option<Committing>>>,
}

impl Commit {
    fn begin(&self) {
        let mut slot = self.slot.lock();
        if slot.is_none() {
            *slot = Some(self.commits.begin(&self.bucket, &self.key));
        }
    }
}

impl Stream for Verified {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.claim.is_none() {
            return Poll::Ready(None);
        }
        match this.body.poll_next_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(bytes))) => {
                this.hasher.update(&bytes);
                if let Some(md5) = &mut this.md5 {
                    md5.update(&bytes);
                }
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.claim = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                let Some(claim) = this.claim.take() else {
                    return Poll::Ready(None);
                };
                let sums = std::mem::take(&mut this.hasher).finalize();
                let md5 = this.md5.take().map(Md5::finalize);
                let outcome = claim.check(sums, md5);
                if let (Ok(_), Some(commit)) = (&outcome, &this.commit) {
                    commit.begin();
                }
                let why = outcome.as_ref().err().map(|e| {
                    e.message()
                        .unwrap_or("the body's checksum failed")
                        .to_owned()
                });
                *this.verdict.lock() = Some(outcome);
                Poll::Ready(why.map(|why| Err(why.into())))
            }
        }
    }
}

impl ByteStream for Verified {
    fn remaining_length(&self) -> RemainingLength {
        self.body.remaining_length()
    }
}

/// Where s3s-fs 0.14.1 keeps `bucket/key`'s ETag and checksums under the
/// backend's `root`: its `FileSystem::get_internal_info_path` (fs.rs)
/// names the file by the bucket's and the key's names in URL-safe base64,
/// without padding, at the root. The version is pinned (`=0.14.1`), and
/// `tests/gateway_local.rs` reads the file by that name.
pub fn info_file(root: &Path, bucket: &str, key: &str) -> PathBuf {
    let encode = |s: &str| URL_SAFE_NO_PAD.encode(s);
    root.join(format!(
        ".bucket-{}.object-{}.internal.json",
        encode(bucket),
        encode(key)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_keys_are_read_from_their_file() {
        let dir = std::env::temp_dir().join(format!("hipobj-local-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let local = Local::open(&dir).unwrap();
        let root = dir.canonicalize().unwrap();
        assert_eq!(
            local.object_path("b", "dir/key.bin"),
            Some(root.join("b/dir/key.bin"))
        );
        for key in ["../escape", "a/../b", "./k", "/abs", ""] {
            assert_eq!(local.object_path("b", key), None, "{key}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A GET's body is read from the object's file in blocks of
    /// [`BODY_BLOCK`], whole and ranged, byte for byte: a gateway in front
    /// receives and sends it in few pieces, not in s3s-fs's 4 KiB ones.
    #[tokio::test]
    async fn a_get_s_body_comes_in_large_blocks() {
        let dir = std::env::temp_dir().join(format!("hipobj-local-blocks-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("b")).unwrap();
        let data: Vec<u8> = (0..(2 * BODY_BLOCK + 4321))
            .map(|i| u8::try_from(i * 7 % 251).unwrap())
            .collect();
        std::fs::write(dir.join("b/key"), &data).unwrap();
        let local = Local::open(&dir).unwrap();
        let ranges = [
            (None, 0..data.len()),
            (
                Some(Range::Int {
                    first: 5,
                    last: Some(BODY_BLOCK as u64 + 9),
                }),
                5..(BODY_BLOCK + 10),
            ),
            (
                Some(Range::Suffix { length: 100 }),
                data.len() - 100..data.len(),
            ),
        ];
        for (range, want) in ranges {
            let input = GetObjectInput {
                bucket: "b".to_owned(),
                key: "key".to_owned(),
                range,
                ..GetObjectInput::default()
            };
            let mut body = local
                .get(crate::gateway::backend::alone(input))
                .await
                .unwrap()
                .output
                .body
                .unwrap();
            let (mut got, mut pieces) = (Vec::new(), 0);
            while let Some(piece) = body.next().await {
                got.extend_from_slice(&piece.unwrap());
                pieces += 1;
            }
            assert!(got == data[want.clone()], "{range:?}: other bytes");
            let most = want.len().div_ceil(BODY_BLOCK);
            assert!(pieces <= most, "{range:?}: {pieces} pieces, at most {most}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
