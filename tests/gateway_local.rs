//! The directory backend (`hipobj::gateway::local::Local`), driven through
//! s3s's `S3` trait as the gateway drives it, and over HTTP through
//! `hipobj-s3-server` where only a real request can say it (checksums that
//! come as aws-chunked trailers). What it must do that s3s-fs 0.14.1 alone
//! does not:
//!
//! - an object replaced by a multipart upload is served without the old
//!   object's checksums, which boto3 would refuse on every GET;
//! - a PUT or UploadPart whose body does not match its checksum or
//!   Content-MD5 is answered 400 BadDigest and stores nothing: the previous
//!   object or part stays byte for byte, and no temporary file is left;
//! - an operation on a bucket that does not exist answers NoSuchBucket and
//!   makes nothing: buckets are made by CreateBucket only.
//!
//! Every test compares the whole root (every file and directory, hidden
//! ones included, with their bytes) before and after what must change
//! nothing.

#[path = "common/s3.rs"]
mod s3;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use hipobj::gateway::local::Local;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result, S3};

const BUCKET: &str = "bucket";
/// A bucket no test makes.
const NO_BUCKET: &str = "nobucket";
/// The smallest part but the last that S3 accepts.
const PART: usize = 5 << 20;

/// A root holding [`BUCKET`], and the backend over it.
struct Store {
    root: PathBuf,
    local: Local,
}

impl Store {
    fn new(tag: &str) -> Store {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "hipobj-local-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        let local = Local::open(&root).unwrap();
        Store { root, local }
    }

    /// Every file and directory under the root, with each file's bytes.
    fn snapshot(&self) -> BTreeMap<String, Option<Vec<u8>>> {
        snapshot(&self.root)
    }

    async fn put(
        &self,
        key: &str,
        data: &[u8],
        with: impl FnOnce(&mut PutObjectInput),
    ) -> S3Result<s3s::S3Response<PutObjectOutput>> {
        let mut input = PutObjectInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            content_length: i64::try_from(data.len()).ok(),
            body: Some(blob(data)),
            ..PutObjectInput::default()
        };
        with(&mut input);
        self.local.put_object(request(input)).await
    }

    /// The object's bytes and its answer (without its body).
    async fn get(&self, key: &str) -> (Vec<u8>, GetObjectOutput) {
        self.get_range(key, None).await
    }

    /// A GET of `range` (`None`: all of it).
    async fn get_range(
        &self,
        key: &str,
        range: Option<s3s::dto::Range>,
    ) -> (Vec<u8>, GetObjectOutput) {
        let input = GetObjectInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            range,
            ..GetObjectInput::default()
        };
        let mut output = self
            .local
            .get_object(request(input))
            .await
            .unwrap_or_else(|e| panic!("GET {key}: {e:?}"))
            .output;
        let mut body = output.body.take().expect("a body");
        let mut bytes = Vec::new();
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk.expect("the body reads"));
        }
        (bytes, output)
    }

    async fn head(&self, key: &str) -> HeadObjectOutput {
        let input = HeadObjectInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            ..HeadObjectInput::default()
        };
        self.local
            .head_object(request(input))
            .await
            .unwrap_or_else(|e| panic!("HEAD {key}: {e:?}"))
            .output
    }

    async fn create_upload(&self, bucket: &str, key: &str) -> S3Result<String> {
        let input = CreateMultipartUploadInput {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            ..CreateMultipartUploadInput::default()
        };
        let output = self
            .local
            .create_multipart_upload(request(input))
            .await?
            .output;
        Ok(output.upload_id.expect("an upload id"))
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        n: i32,
        data: &[u8],
        with: impl FnOnce(&mut UploadPartInput),
    ) -> S3Result<UploadPartOutput> {
        let mut input = UploadPartInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            upload_id: upload_id.to_owned(),
            part_number: n,
            content_length: i64::try_from(data.len()).ok(),
            body: Some(blob(data)),
            ..UploadPartInput::default()
        };
        with(&mut input);
        Ok(self.local.upload_part(request(input)).await?.output)
    }

    async fn complete(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(i32, Option<ETag>)],
    ) -> S3Result<()> {
        self.complete_with(bucket, key, upload_id, parts, |_| {})
            .await
    }

    async fn complete_with(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(i32, Option<ETag>)],
        with: impl FnOnce(&mut CompleteMultipartUploadInput),
    ) -> S3Result<()> {
        let parts = parts
            .iter()
            .map(|(n, e_tag)| CompletedPart {
                part_number: Some(*n),
                e_tag: e_tag.clone(),
                ..CompletedPart::default()
            })
            .collect();
        let mut input = CompleteMultipartUploadInput {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            upload_id: upload_id.to_owned(),
            multipart_upload: Some(CompletedMultipartUpload { parts: Some(parts) }),
            ..CompleteMultipartUploadInput::default()
        };
        with(&mut input);
        let output = self
            .local
            .complete_multipart_upload(request(input))
            .await?
            .output;
        // The answer comes from a future (S3's keep-alive form).
        if let Some(future) = output.future {
            future.await?;
        }
        Ok(())
    }

    async fn part_numbers(&self, key: &str, upload_id: &str) -> Vec<i32> {
        let input = ListPartsInput {
            bucket: BUCKET.to_owned(),
            key: key.to_owned(),
            upload_id: upload_id.to_owned(),
            ..ListPartsInput::default()
        };
        let output = self.local.list_parts(request(input)).await.unwrap().output;
        let mut numbers: Vec<i32> = output
            .parts
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.part_number)
            .collect();
        numbers.sort_unstable();
        numbers
    }

    /// A multipart upload of `parts` to `key`, completed.
    async fn multipart(&self, key: &str, parts: &[&[u8]]) {
        let id = self.create_upload(BUCKET, key).await.unwrap();
        let mut done = Vec::new();
        for (n, part) in (1..).zip(parts) {
            let output = self.upload_part(key, &id, n, part, |_| {}).await.unwrap();
            done.push((n, output.e_tag));
        }
        self.complete(BUCKET, key, &id, &done).await.unwrap();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Every file and directory under `root` (relative paths), with each
/// file's bytes.
fn snapshot(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut all = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if path.is_dir() {
                all.insert(format!("{name}/"), None);
                dirs.push(path);
            } else {
                all.insert(name, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    all
}

/// Files s3s-fs writes before renaming them into place.
fn temp_files(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_keys()
        .filter(|name| name.contains(".tmp."))
        .collect()
}

fn request<T>(input: T) -> S3Request<T> {
    S3Request {
        input,
        method: http::Method::PUT,
        uri: http::Uri::from_static("/"),
        headers: http::HeaderMap::new(),
        extensions: http::Extensions::new(),
        credentials: Some(s3s::auth::Credentials {
            access_key: "tenant".to_owned(),
            secret_key: "secret".into(),
        }),
        region: None,
        service: None,
        trailing_headers: None,
    }
}

fn blob(data: &[u8]) -> StreamingBlob {
    StreamingBlob::from(s3s::Body::from(Bytes::copy_from_slice(data)))
}

/// Bytes of every value, in an order that shows misplaced ranges.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let [b0, b1, ..] = i.to_le_bytes();
            b0.wrapping_mul(31) ^ b1.wrapping_mul(7) ^ seed
        })
        .collect()
}

/// The algorithms a checksum header may name, as S3 spells them.
const ALGORITHMS: [&str; 5] = ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"];

/// `data`'s checksum by `algorithm` (one of [`ALGORITHMS`]), base64, as
/// the `x-amz-checksum-*` headers carry it.
fn checksum(algorithm: &str, data: &[u8]) -> String {
    let mut hasher = ChecksumHasher::default();
    match algorithm {
        "CRC32" => hasher.crc32 = Some(Default::default()),
        "CRC32C" => hasher.crc32c = Some(Default::default()),
        "CRC64NVME" => hasher.crc64nvme = Some(Default::default()),
        "SHA1" => hasher.sha1 = Some(Default::default()),
        "SHA256" => hasher.sha256 = Some(Default::default()),
        other => panic!("no algorithm {other}"),
    }
    hasher.update(data);
    let sums = hasher.finalize();
    [
        sums.checksum_crc32,
        sums.checksum_crc32c,
        sums.checksum_crc64nvme,
        sums.checksum_sha1,
        sums.checksum_sha256,
    ]
    .into_iter()
    .flatten()
    .next()
    .expect("one checksum")
}

/// `data`'s MD5, base64, as Content-MD5 carries it.
fn content_md5(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s3s::crypto::Md5::checksum(data))
}

/// Sets `algorithm`'s checksum field of a PUT's or UploadPart's input.
macro_rules! set_checksum {
    ($input:expr, $algorithm:expr, $value:expr) => {{
        let value = Some($value);
        $input.checksum_algorithm = Some(ChecksumAlgorithm::from($algorithm.to_owned()));
        match $algorithm {
            "CRC32" => $input.checksum_crc32 = value,
            "CRC32C" => $input.checksum_crc32c = value,
            "CRC64NVME" => $input.checksum_crc64nvme = value,
            "SHA1" => $input.checksum_sha1 = value,
            "SHA256" => $input.checksum_sha256 = value,
            other => panic!("no algorithm {other}"),
        }
    }};
}

/// A GET or HEAD answer's checksum by `algorithm`.
fn served(
    algorithm: &str,
    crc32: &Option<String>,
    crc32c: &Option<String>,
    crc64nvme: &Option<String>,
    sha1: &Option<String>,
    sha256: &Option<String>,
) -> Option<String> {
    match algorithm {
        "CRC32" => crc32.clone(),
        "CRC32C" => crc32c.clone(),
        "CRC64NVME" => crc64nvme.clone(),
        "SHA1" => sha1.clone(),
        "SHA256" => sha256.clone(),
        other => panic!("no algorithm {other}"),
    }
}

fn assert_code(result: &Result<impl std::fmt::Debug, S3Error>, code: S3ErrorCode, what: &str) {
    match result {
        Err(e) => assert_eq!(*e.code(), code, "{what}: {e:?}"),
        Ok(ok) => panic!("{what}: answered {ok:?}, not {code:?}"),
    }
}

/// An object PUT with a checksum (as boto3 does by default), then replaced
/// by a multipart upload, is served with the new object's checksum or
/// none, never the old one (boto3 refuses every GET otherwise); and the
/// file s3s-fs keeps it in no longer holds it.
#[tokio::test]
async fn a_multipart_overwrite_drops_the_old_object_s_checksums() {
    let store = Store::new("b1");
    let old = pattern(1 << 20, 1);
    let new = [pattern(PART, 2), pattern(1000, 3)];
    for algorithm in ALGORITHMS {
        store
            .put("stale", &old, |i| {
                set_checksum!(i, algorithm, checksum(algorithm, &old))
            })
            .await
            .unwrap_or_else(|e| panic!("PUT with {algorithm}: {e:?}"));
        let (_, before) = store.get("stale").await;
        let had = served(
            algorithm,
            &before.checksum_crc32,
            &before.checksum_crc32c,
            &before.checksum_crc64nvme,
            &before.checksum_sha1,
            &before.checksum_sha256,
        );
        assert_eq!(had, Some(checksum(algorithm, &old)), "{algorithm}");
        store.multipart("stale", &[&new[0], &new[1]]).await;
        let whole = new.concat();
        let (bytes, get) = store.get("stale").await;
        assert!(bytes == whole, "the new object's bytes");
        let head = store.head("stale").await;
        for (what, sum) in [
            (
                "GET",
                served(
                    algorithm,
                    &get.checksum_crc32,
                    &get.checksum_crc32c,
                    &get.checksum_crc64nvme,
                    &get.checksum_sha1,
                    &get.checksum_sha256,
                ),
            ),
            (
                "HEAD",
                served(
                    algorithm,
                    &head.checksum_crc32,
                    &head.checksum_crc32c,
                    &head.checksum_crc64nvme,
                    &head.checksum_sha1,
                    &head.checksum_sha256,
                ),
            ),
        ] {
            assert!(
                sum.is_none() || sum == Some(checksum(algorithm, &whole)),
                "{what} after a multipart overwrite of a PUT with {algorithm}: {sum:?} \
                 (the old object's is {:?})",
                had
            );
        }
        // Where s3s-fs 0.14.1 keeps an object's ETag and checksums (its
        // `get_internal_info_path`: the bucket's and the key's names in
        // URL-safe base64): the wrapper rewrites this file, so a change of
        // layout must show here.
        let info = store
            .root
            .join(".bucket-YnVja2V0.object-c3RhbGU.internal.json");
        let info =
            std::fs::read_to_string(&info).unwrap_or_else(|e| panic!("{}: {e}", info.display()));
        assert!(info.contains("-2\""), "a two-part ETag: {info}");
        assert!(!info.contains("checksum_"), "no checksum kept: {info}");
    }
}

/// A multipart object has its whole CRC64/NVME: a Complete whose
/// full-object `x-amz-checksum-crc64nvme` is not that of its parts is
/// refused with nothing joined (the upload and the object it would replace
/// stay); completed, the object is served with it (GET and HEAD, typed
/// FULL_OBJECT), and so is one completed without a checksum.
#[tokio::test]
async fn a_multipart_object_is_served_with_its_whole_crc64nvme() {
    let store = Store::new("whole");
    let old = pattern(1000, 9);
    store.put("whole", &old, |_| {}).await.unwrap();
    let parts = [pattern(PART, 7), pattern(3000, 8)];
    let whole = parts.concat();
    let right = checksum("CRC64NVME", &whole);
    let id = store.create_upload(BUCKET, "whole").await.unwrap();
    let mut done = Vec::new();
    for (n, part) in (1..).zip(&parts) {
        let output = store
            .upload_part("whole", &id, n, part, |_| {})
            .await
            .unwrap();
        done.push((n, output.e_tag));
    }
    let before = store.snapshot();
    let wrong = checksum("CRC64NVME", &whole[1..]);
    let refused = store
        .complete_with(BUCKET, "whole", &id, &done, |i| {
            i.checksum_crc64nvme = Some(wrong.clone());
            i.checksum_type = Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT));
        })
        .await;
    assert_code(&refused, S3ErrorCode::BadDigest, "a wrong whole CRC64NVME");
    let said = format!("{:?}", refused.unwrap_err());
    assert!(said.contains(&wrong) && said.contains(&right), "{said}");
    assert!(
        store.snapshot() == before,
        "nothing joined, nothing changed"
    );
    assert_eq!(store.part_numbers("whole", &id).await, vec![1, 2]);
    assert!(store.get("whole").await.0 == old, "the old object stays");

    store
        .complete_with(BUCKET, "whole", &id, &done, |i| {
            i.checksum_crc64nvme = Some(right.clone());
            i.checksum_type = Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT));
        })
        .await
        .expect("the right whole CRC64NVME");
    let (bytes, get) = store.get("whole").await;
    assert!(bytes == whole, "the joined object");
    let head = store.head("whole").await;
    for (what, crc, kind) in [
        ("GET", &get.checksum_crc64nvme, &get.checksum_type),
        ("HEAD", &head.checksum_crc64nvme, &head.checksum_type),
    ] {
        assert_eq!(crc.as_deref(), Some(right.as_str()), "{what}");
        assert_eq!(
            kind.as_ref().map(ChecksumType::as_str),
            Some(ChecksumType::FULL_OBJECT),
            "{what}"
        );
    }

    // A range of it is not the whole object: no whole checksum (as S3,
    // and as s3s-fs for a single PUT's), which a client would check the
    // range's bytes against. A range that covers it all is the whole.
    let (bytes, ranged) = store
        .get_range(
            "whole",
            Some(s3s::dto::Range::Int {
                first: 10,
                last: Some(4009),
            }),
        )
        .await;
    assert!(bytes == whole[10..4010]);
    assert_eq!(ranged.checksum_crc64nvme, None, "a range's answer");
    assert_eq!(ranged.checksum_type, None, "a range's answer");
    let all = u64::try_from(whole.len() - 1).unwrap();
    let (_, covering) = store
        .get_range(
            "whole",
            Some(s3s::dto::Range::Int {
                first: 0,
                last: Some(all),
            }),
        )
        .await;
    assert_eq!(covering.checksum_crc64nvme.as_deref(), Some(right.as_str()));

    // Without a checksum in the request, the object still has its own.
    store.multipart("again", &[&parts[0], &parts[1]]).await;
    let (_, get) = store.get("again").await;
    assert_eq!(get.checksum_crc64nvme.as_deref(), Some(right.as_str()));
    // Replaced by a PUT, it is served with the PUT's checksums only.
    store.put("again", &old, |_| {}).await.unwrap();
    let (bytes, get) = store.get("again").await;
    assert!(bytes == old);
    assert_eq!(get.checksum_crc64nvme, None, "not the replaced object's");
}

/// A root that s3s-fs alone wrote (the server before this fix): an
/// object PUT with a checksum, then replaced by a multipart upload, whose
/// info file still holds the old checksums. Served now, it has none.
#[tokio::test]
async fn an_object_replaced_by_multipart_before_the_fix_is_served_without_stale_checksums() {
    let store = Store::new("legacy");
    let old = pattern(4096, 12);
    let new = [pattern(PART, 13), pattern(10, 14)];
    let unfixed = s3s_fs::FileSystem::new(&store.root).unwrap();
    let mut put = PutObjectInput {
        bucket: BUCKET.to_owned(),
        key: "legacy".to_owned(),
        body: Some(blob(&old)),
        ..PutObjectInput::default()
    };
    set_checksum!(put, "CRC32", checksum("CRC32", &old));
    unfixed.put_object(request(put)).await.unwrap();
    let create = CreateMultipartUploadInput {
        bucket: BUCKET.to_owned(),
        key: "legacy".to_owned(),
        ..CreateMultipartUploadInput::default()
    };
    let id = unfixed
        .create_multipart_upload(request(create))
        .await
        .unwrap()
        .output
        .upload_id
        .unwrap();
    let mut parts = Vec::new();
    for (n, data) in (1..).zip(&new) {
        let part = UploadPartInput {
            bucket: BUCKET.to_owned(),
            key: "legacy".to_owned(),
            upload_id: id.clone(),
            part_number: n,
            body: Some(blob(data)),
            ..UploadPartInput::default()
        };
        let e_tag = unfixed
            .upload_part(request(part))
            .await
            .unwrap()
            .output
            .e_tag;
        parts.push(CompletedPart {
            part_number: Some(n),
            e_tag,
            ..CompletedPart::default()
        });
    }
    let complete = CompleteMultipartUploadInput {
        bucket: BUCKET.to_owned(),
        key: "legacy".to_owned(),
        upload_id: id,
        multipart_upload: Some(CompletedMultipartUpload { parts: Some(parts) }),
        ..CompleteMultipartUploadInput::default()
    };
    unfixed
        .complete_multipart_upload(request(complete))
        .await
        .unwrap();
    let info = store
        .root
        .join(".bucket-YnVja2V0.object-bGVnYWN5.internal.json");
    let info = std::fs::read_to_string(&info).unwrap();
    assert!(
        info.contains("checksum_crc32"),
        "s3s-fs alone kept it: {info}"
    );
    let (bytes, get) = store.get("legacy").await;
    assert!(bytes == new.concat());
    assert_eq!(get.checksum_crc32, None, "GET");
    assert_eq!(store.head("legacy").await.checksum_crc32, None, "HEAD");
}

/// CopyObject over an object that was PUT with a checksum: the copy is
/// served with its source's checksums, not the replaced object's.
#[tokio::test]
async fn a_copy_over_an_object_is_served_with_its_source_s_checksums() {
    let store = Store::new("copy");
    let old = pattern(4096, 4);
    let source = pattern(3000, 5);
    store
        .put("target", &old, |i| {
            set_checksum!(i, "CRC32", checksum("CRC32", &old))
        })
        .await
        .unwrap();
    store.put("source", &source, |_| {}).await.unwrap();
    let input = CopyObjectInput::builder()
        .bucket(BUCKET.to_owned())
        .key("target".to_owned())
        .copy_source(CopySource::Bucket {
            bucket: BUCKET.into(),
            key: "source".into(),
            version_id: None,
        })
        .build()
        .unwrap();
    store.local.copy_object(request(input)).await.unwrap();
    let (bytes, get) = store.get("target").await;
    assert_eq!(bytes, source);
    assert_eq!(get.checksum_crc32, None, "the source has none");
}

/// A PUT whose `x-amz-checksum-*` header or Content-MD5 does not match its
/// body: 400 BadDigest naming the algorithm and both values, and the root
/// exactly as it was: an object it would have replaced byte for byte, none
/// made where there was none, no temporary file.
#[tokio::test]
async fn a_put_with_a_wrong_checksum_header_is_bad_digest_and_changes_nothing() {
    let store = Store::new("put-digest");
    let old = pattern(100_000, 6);
    let body = pattern(70_000, 7);
    let other = b"not the body";
    store.put("kept", &old, |_| {}).await.unwrap();
    for algorithm in ALGORITHMS.into_iter().chain(["MD5"]) {
        let (said, is) = if algorithm == "MD5" {
            (content_md5(other), content_md5(&body))
        } else {
            (checksum(algorithm, other), checksum(algorithm, &body))
        };
        let before = store.snapshot();
        for key in ["kept", "new"] {
            let value = said.clone();
            let answer = store
                .put(key, &body, |i| {
                    if algorithm == "MD5" {
                        i.content_md5 = Some(value);
                    } else {
                        set_checksum!(i, algorithm, value);
                    }
                })
                .await;
            let what = format!("PUT {key} with a wrong {algorithm}");
            assert!(store.snapshot() == before, "{what}: the root changed");
            assert_code(&answer, S3ErrorCode::BadDigest, &what);
            let message = answer.unwrap_err().message().unwrap_or_default().to_owned();
            for part in [algorithm, &said, &is] {
                assert!(message.contains(part), "{what}: {message:?} names {part}");
            }
        }
        assert_eq!(store.get("kept").await.0, old, "{algorithm}");
    }
    // The right values are taken, and the answer carries the checksum.
    for algorithm in ALGORITHMS {
        let output = store
            .put("kept", &body, |i| {
                set_checksum!(i, algorithm, checksum(algorithm, &body))
            })
            .await
            .unwrap_or_else(|e| panic!("PUT with the right {algorithm}: {e:?}"))
            .output;
        let sum = served(
            algorithm,
            &output.checksum_crc32,
            &output.checksum_crc32c,
            &output.checksum_crc64nvme,
            &output.checksum_sha1,
            &output.checksum_sha256,
        );
        assert_eq!(sum, Some(checksum(algorithm, &body)), "{algorithm}");
    }
    store
        .put("kept", &old, |i| i.content_md5 = Some(content_md5(&old)))
        .await
        .expect("the right Content-MD5");
    assert_eq!(store.get("kept").await.0, old);
    assert_eq!(temp_files(&store.root), Vec::<String>::new());
}

/// A malformed Content-MD5 is refused before anything is written.
#[tokio::test]
async fn a_put_with_a_malformed_content_md5_is_refused_and_changes_nothing() {
    let store = Store::new("put-md5");
    store.put("kept", b"old bytes", |_| {}).await.unwrap();
    let before = store.snapshot();
    let answer = store
        .put("kept", b"new bytes", |i| {
            i.content_md5 = Some("not base64!".to_owned())
        })
        .await;
    assert!(store.snapshot() == before, "the root changed");
    assert_code(
        &answer,
        S3ErrorCode::InvalidDigest,
        "a malformed Content-MD5",
    );
}

/// An UploadPart whose checksum does not match its body: BadDigest, the
/// part not stored (ListParts does not show it; a part of the same number
/// stored before stays as it was, and completing with a part refused
/// fails). A part whose checksum matches is answered with it, as S3 does.
#[tokio::test]
async fn an_upload_part_with_a_wrong_checksum_is_bad_digest_and_not_stored() {
    let store = Store::new("part-digest");
    let id = store.create_upload(BUCKET, "multi").await.unwrap();
    let first = pattern(PART, 8);
    let output = store
        .upload_part("multi", &id, 1, &first, |i| {
            set_checksum!(i, "CRC32", checksum("CRC32", &first));
        })
        .await
        .expect("a part with the right CRC32");
    let first_tag = output.e_tag.clone();
    let second = pattern(1234, 9);
    for algorithm in ALGORITHMS.into_iter().chain(["MD5"]) {
        let before = store.snapshot();
        for n in [1, 2] {
            let answer = store
                .upload_part("multi", &id, n, &second, |i| {
                    if algorithm == "MD5" {
                        i.content_md5 = Some(content_md5(b"other"));
                    } else {
                        set_checksum!(i, algorithm, checksum(algorithm, b"other"));
                    }
                })
                .await;
            let what = format!("part {n} with a wrong {algorithm}");
            assert!(store.snapshot() == before, "{what}: the root changed");
            assert_code(&answer, S3ErrorCode::BadDigest, &what);
        }
        assert_eq!(store.part_numbers("multi", &id).await, [1], "{algorithm}");
    }
    // Completing with a part refused fails, and loses nothing.
    let refused = store
        .complete(BUCKET, "multi", &id, &[(1, first_tag.clone()), (2, None)])
        .await;
    assert_code(
        &refused,
        S3ErrorCode::InvalidPart,
        "completed with a part refused",
    );
    assert!(!store.root.join(BUCKET).join("multi").exists());
    store
        .complete(BUCKET, "multi", &id, &[(1, first_tag)])
        .await
        .expect("the stored part completes");
    assert!(
        store.get("multi").await.0 == first,
        "part 1 as it was first sent"
    );
    assert_eq!(temp_files(&store.root), Vec::<String>::new());
    assert_eq!(
        output.checksum_crc32,
        Some(checksum("CRC32", &first)),
        "the part's answer carries its checksum"
    );
}

/// Every operation on a bucket that does not exist answers
/// NoSuchBucket and makes nothing; buckets are made by CreateBucket only.
#[tokio::test]
async fn an_operation_on_a_missing_bucket_is_no_such_bucket_and_makes_nothing() {
    let store = Store::new("nobucket");
    store.put("source", b"source bytes", |_| {}).await.unwrap();
    // An upload whose bucket went away once it was started.
    let gone = "gone";
    std::fs::create_dir(store.root.join(gone)).unwrap();
    let upload = store.create_upload(gone, "object").await.unwrap();
    std::fs::remove_dir(store.root.join(gone)).unwrap();
    let before = store.snapshot();
    let l = &store.local;
    let copy = |bucket: &str, key: &str, from_bucket: &str| {
        request(
            CopyObjectInput::builder()
                .bucket(bucket.to_owned())
                .key(key.to_owned())
                .copy_source(CopySource::Bucket {
                    bucket: from_bucket.into(),
                    key: "source".into(),
                    version_id: None,
                })
                .build()
                .unwrap(),
        )
    };
    let put = PutObjectInput {
        bucket: NO_BUCKET.to_owned(),
        key: "x".to_owned(),
        body: Some(blob(b"bytes")),
        ..PutObjectInput::default()
    };
    assert_code(
        &l.put_object(request(put)).await,
        S3ErrorCode::NoSuchBucket,
        "PutObject",
    );
    let dir_put = PutObjectInput {
        bucket: NO_BUCKET.to_owned(),
        key: "dir/".to_owned(),
        body: Some(blob(b"")),
        ..PutObjectInput::default()
    };
    assert_code(
        &l.put_object(request(dir_put)).await,
        S3ErrorCode::NoSuchBucket,
        "PutObject of a directory key",
    );
    assert_code(
        &store.create_upload(NO_BUCKET, "x").await,
        S3ErrorCode::NoSuchBucket,
        "CreateMultipartUpload",
    );
    assert_code(
        &l.copy_object(copy(NO_BUCKET, "x", BUCKET)).await,
        S3ErrorCode::NoSuchBucket,
        "CopyObject into a missing bucket",
    );
    assert_code(
        &l.copy_object(copy(BUCKET, "x", NO_BUCKET)).await,
        S3ErrorCode::NoSuchBucket,
        "CopyObject from a missing bucket",
    );
    let part = UploadPartInput {
        bucket: gone.to_owned(),
        key: "object".to_owned(),
        upload_id: upload.clone(),
        part_number: 1,
        body: Some(blob(b"part")),
        ..UploadPartInput::default()
    };
    assert_code(
        &l.upload_part(request(part)).await,
        S3ErrorCode::NoSuchBucket,
        "UploadPart",
    );
    assert_code(
        &store.complete(gone, "object", &upload, &[(1, None)]).await,
        S3ErrorCode::NoSuchBucket,
        "CompleteMultipartUpload",
    );
    let get = GetObjectInput {
        bucket: NO_BUCKET.to_owned(),
        key: "x".to_owned(),
        ..GetObjectInput::default()
    };
    assert_code(
        &l.get_object(request(get)).await,
        S3ErrorCode::NoSuchBucket,
        "GetObject",
    );
    let head = HeadObjectInput {
        bucket: NO_BUCKET.to_owned(),
        key: "x".to_owned(),
        ..HeadObjectInput::default()
    };
    assert_code(
        &l.head_object(request(head)).await,
        S3ErrorCode::NoSuchBucket,
        "HeadObject",
    );
    let list = ListObjectsInput {
        bucket: NO_BUCKET.to_owned(),
        ..ListObjectsInput::default()
    };
    assert_code(
        &l.list_objects(request(list)).await,
        S3ErrorCode::NoSuchBucket,
        "ListObjects",
    );
    let list2 = ListObjectsV2Input {
        bucket: NO_BUCKET.to_owned(),
        ..ListObjectsV2Input::default()
    };
    assert_code(
        &l.list_objects_v2(request(list2)).await,
        S3ErrorCode::NoSuchBucket,
        "ListObjectsV2",
    );
    let delete = DeleteObjectInput {
        bucket: NO_BUCKET.to_owned(),
        key: "x".to_owned(),
        ..DeleteObjectInput::default()
    };
    assert_code(
        &l.delete_object(request(delete)).await,
        S3ErrorCode::NoSuchBucket,
        "DeleteObject",
    );
    let deletes = DeleteObjectsInput::builder()
        .bucket(NO_BUCKET.to_owned())
        .delete(Delete {
            objects: vec![ObjectIdentifier {
                key: "x".to_owned(),
                ..ObjectIdentifier::default()
            }],
            quiet: None,
        })
        .build()
        .unwrap();
    assert_code(
        &l.delete_objects(request(deletes)).await,
        S3ErrorCode::NoSuchBucket,
        "DeleteObjects",
    );
    assert!(store.snapshot() == before, "the root changed");
    // CreateBucket makes one; then a PUT goes in.
    let create = CreateBucketInput {
        bucket: NO_BUCKET.to_owned(),
        ..CreateBucketInput::default()
    };
    l.create_bucket(request(create)).await.unwrap();
    let put = PutObjectInput {
        bucket: NO_BUCKET.to_owned(),
        key: "x".to_owned(),
        body: Some(blob(b"bytes")),
        ..PutObjectInput::default()
    };
    l.put_object(request(put)).await.unwrap();
    assert_eq!(
        std::fs::read(store.root.join(NO_BUCKET).join("x")).unwrap(),
        b"bytes"
    );
}

/// A key whose path leaves its bucket's directory (s3s-fs resolves `..`
/// under the root, not under the bucket) is refused: it would write into
/// another bucket, or make one.
#[tokio::test]
async fn a_key_that_leaves_its_bucket_is_refused_and_makes_nothing() {
    let store = Store::new("escape");
    let before = store.snapshot();
    for key in ["../other/x", "a/../../other/y", "..", "a/.."] {
        let answer = store.put(key, b"bytes", |_| {}).await;
        assert_code(&answer, S3ErrorCode::InvalidArgument, key);
        assert!(store.snapshot() == before, "{key}: the root changed");
    }
    // A `..` that stays inside the bucket is the key it names.
    store.put("a/../inside", b"bytes", |_| {}).await.unwrap();
    assert_eq!(
        std::fs::read(store.root.join(BUCKET).join("inside")).unwrap(),
        b"bytes"
    );
}

/// A GET or HEAD with conditions is answered as S3 answers it (RFC 9110's
/// order): `If-Match` another ETag, or `If-Unmodified-Since` before the
/// object's time without `If-Match`, is 412 PreconditionFailed;
/// `If-None-Match` its ETag, or `If-Modified-Since` at or after its time
/// without `If-None-Match`, is 304 NotModified; nothing else changes the
/// answer.
#[tokio::test]
async fn conditional_gets_and_heads_are_answered_412_or_304_as_s3_answers_them() {
    let store = Store::new("conditions");
    store.put("k", b"version one", |_| {}).await.unwrap();
    let (_, current) = store.get("k").await;
    let etag = current.e_tag.clone().expect("an ETag");
    let modified = current.last_modified.clone().expect("a time");
    let stale = ETagCondition::ETag(ETag::Strong("0123456789abcdef0123456789abcdef".into()));
    let this = ETagCondition::ETag(etag.clone());
    let hour = |ahead: bool| {
        let at = std::time::SystemTime::now();
        let hour = std::time::Duration::from_secs(3600);
        Timestamp::from(if ahead { at + hour } else { at - hour })
    };
    type Case = (
        &'static str,
        fn(&mut GetObjectInput, &ETagCondition, &ETagCondition, &Timestamp, &Timestamp),
        Option<S3ErrorCode>,
    );
    let cases: [Case; 10] = [
        (
            "If-Match another ETag",
            |i, _, stale, _, _| i.if_match = Some(stale.clone()),
            Some(S3ErrorCode::PreconditionFailed),
        ),
        (
            "If-Match its ETag",
            |i, this, _, _, _| i.if_match = Some(this.clone()),
            None,
        ),
        (
            "If-Match *",
            |i, _, _, _, _| i.if_match = Some(ETagCondition::Any),
            None,
        ),
        (
            "If-None-Match its ETag",
            |i, this, _, _, _| i.if_none_match = Some(this.clone()),
            Some(S3ErrorCode::NotModified),
        ),
        (
            "If-None-Match another ETag",
            |i, _, stale, _, _| i.if_none_match = Some(stale.clone()),
            None,
        ),
        (
            "If-Unmodified-Since an hour ago",
            |i, _, _, _, ago| i.if_unmodified_since = Some(ago.clone()),
            Some(S3ErrorCode::PreconditionFailed),
        ),
        (
            "If-Match its ETag and If-Unmodified-Since an hour ago",
            |i, this, _, _, ago| {
                i.if_match = Some(this.clone());
                i.if_unmodified_since = Some(ago.clone());
            },
            None,
        ),
        (
            "If-Modified-Since an hour ahead",
            |i, _, _, ahead, _| i.if_modified_since = Some(ahead.clone()),
            Some(S3ErrorCode::NotModified),
        ),
        (
            "If-Modified-Since an hour ago",
            |i, _, _, _, ago| i.if_modified_since = Some(ago.clone()),
            None,
        ),
        (
            "If-None-Match another ETag and If-Modified-Since an hour ahead",
            |i, _, stale, ahead, _| {
                i.if_none_match = Some(stale.clone());
                i.if_modified_since = Some(ahead.clone());
            },
            None,
        ),
    ];
    let (ahead, ago) = (hour(true), hour(false));
    for (what, set, expected) in cases {
        let mut input = GetObjectInput {
            bucket: BUCKET.to_owned(),
            key: "k".to_owned(),
            ..GetObjectInput::default()
        };
        set(&mut input, &this, &stale, &ahead, &ago);
        let head = HeadObjectInput {
            bucket: BUCKET.to_owned(),
            key: "k".to_owned(),
            if_match: input.if_match.clone(),
            if_none_match: input.if_none_match.clone(),
            if_modified_since: input.if_modified_since.clone(),
            if_unmodified_since: input.if_unmodified_since.clone(),
            ..HeadObjectInput::default()
        };
        let got = store.local.get_object(request(input)).await;
        let headed = store.local.head_object(request(head)).await;
        match expected {
            Some(code) => {
                assert_code(&got, code.clone(), &format!("GET {what}"));
                assert_code(&headed, code, &format!("HEAD {what}"));
            }
            None => {
                let got = got.unwrap_or_else(|e| panic!("GET {what}: {e:?}"));
                assert_eq!(got.output.e_tag.as_ref(), Some(&etag), "GET {what}");
                let headed = headed.unwrap_or_else(|e| panic!("HEAD {what}: {e:?}"));
                assert_eq!(headed.output.e_tag.as_ref(), Some(&etag), "HEAD {what}");
            }
        }
    }
    assert!(modified <= hour(true));
}

/// A GET made while PUTs replace its object answers one version: its
/// bytes are those its ETag (their MD5) names, and so is its file for an
/// RDMA GET, however the PUTs fall between the file it opens and the ETag
/// it reads.
#[test]
fn gets_during_puts_of_the_same_key_answer_one_version() {
    let store = std::sync::Arc::new(Store::new("one-version"));
    let versions: Vec<Vec<u8>> = (0..4u8).map(|v| vec![b'a' + v; 4096]).collect();
    let md5 = |bytes: &[u8]| {
        let mut h = s3s::crypto::Md5::new();
        h.update(bytes);
        hex_lower(&h.finalize())
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        store.put("k", &versions[0], |_| {}).await.unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (store, versions, done) = (store.clone(), versions.clone(), done.clone());
            tokio::spawn(async move {
                // Until the reader has read enough: every read meets PUTs.
                let mut i = 0usize;
                while !done.load(Ordering::Acquire) {
                    store.put("k", &versions[i % 4], |_| {}).await.unwrap();
                    i += 1;
                }
                i
            })
        };
        let mut reads = 0usize;
        let mut mixed = Vec::new();
        while reads < 400 {
            let input = GetObjectInput {
                bucket: BUCKET.to_owned(),
                key: "k".to_owned(),
                ..GetObjectInput::default()
            };
            let mut resp = store.local.get_object(request(input)).await.unwrap();
            let file = resp
                .extensions
                .remove::<hipobj::gateway::local::ObjectFile>()
                .expect("the file answered from");
            let mut body = resp.output.body.take().expect("a body");
            let mut bytes = Vec::new();
            while let Some(chunk) = body.next().await {
                bytes.extend_from_slice(&chunk.unwrap());
            }
            let mut from_file = vec![0u8; 4096];
            std::os::unix::fs::FileExt::read_exact_at(&*file.0, &mut from_file, 0).unwrap();
            reads += 1;
            let etag = resp.output.e_tag.as_ref().map(|e| e.value().to_owned());
            if etag.as_deref() != Some(md5(&bytes).as_str()) || from_file != bytes {
                mixed.push((etag, bytes[0] as char, from_file[0] as char));
            }
        }
        done.store(true, Ordering::Release);
        let puts = writer.await.unwrap();
        assert!(puts > 0, "no PUT ran during the reads");
        assert!(
            mixed.is_empty(),
            "{} of {reads} GETs answered one version's bytes under another's ETag: {:?}",
            mixed.len(),
            &mixed[..mixed.len().min(5)]
        );
    });
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// ListObjectsV2 and ListObjects give each object's ETag, as S3 does (a
/// client pins the downloads of a listing to the versions it lists).
#[tokio::test]
async fn listings_give_each_object_s_etag() {
    let store = Store::new("list-etags");
    store.put("a", b"first", |_| {}).await.unwrap();
    store.put("dir/b", b"second", |_| {}).await.unwrap();
    let (_, a) = store.get("a").await;
    let (_, b) = store.get("dir/b").await;
    let v2 = store
        .local
        .list_objects_v2(request(ListObjectsV2Input {
            bucket: BUCKET.to_owned(),
            ..ListObjectsV2Input::default()
        }))
        .await
        .unwrap()
        .output;
    let listed: Vec<(String, Option<ETag>)> = v2
        .contents
        .unwrap_or_default()
        .into_iter()
        .map(|o| (o.key.unwrap_or_default(), o.e_tag))
        .collect();
    assert_eq!(
        listed,
        [
            ("a".to_owned(), a.e_tag.clone()),
            ("dir/b".to_owned(), b.e_tag.clone())
        ]
    );
    let v1 = store
        .local
        .list_objects(request(ListObjectsInput {
            bucket: BUCKET.to_owned(),
            ..ListObjectsInput::default()
        }))
        .await
        .unwrap()
        .output;
    let etags: Vec<Option<ETag>> = v1
        .contents
        .unwrap_or_default()
        .into_iter()
        .map(|o| o.e_tag)
        .collect();
    assert_eq!(etags, [a.e_tag, b.e_tag]);
}

/// DeleteObjects checks every key as DeleteObject does: a key that climbs
/// out of its bucket is refused in the answer's Errors and deletes
/// nothing (another bucket's object, another object's info file, another
/// upload's part, an empty bucket), while the other keys are deleted.
#[tokio::test]
async fn delete_objects_refuses_keys_that_leave_their_bucket_and_deletes_only_the_others() {
    let store = Store::new("delete-many");
    std::fs::create_dir_all(store.root.join("other")).unwrap();
    std::fs::create_dir_all(store.root.join("empty")).unwrap();
    std::fs::write(store.root.join("other/secret"), b"another bucket's object").unwrap();
    store.put("mine", b"to delete", |_| {}).await.unwrap();
    store.put("kept", b"to keep", |_| {}).await.unwrap();
    let info = std::fs::read_dir(&store.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.ends_with(".internal.json"))
        .expect("an info file");
    let escaping = [
        "../other/secret".to_owned(),
        format!("../{info}"),
        "../empty/".to_owned(),
        "a/../../other/secret".to_owned(),
    ];
    let before = store.snapshot();
    let mut objects: Vec<ObjectIdentifier> = escaping
        .iter()
        .map(|key| ObjectIdentifier {
            key: key.clone(),
            ..ObjectIdentifier::default()
        })
        .collect();
    objects.push(ObjectIdentifier {
        key: "mine".into(),
        ..ObjectIdentifier::default()
    });
    let answer = store
        .local
        .delete_objects(request(DeleteObjectsInput {
            bucket: BUCKET.to_owned(),
            delete: Delete {
                objects,
                quiet: None,
            },
            bypass_governance_retention: None,
            checksum_algorithm: None,
            expected_bucket_owner: None,
            mfa: None,
            request_payer: None,
        }))
        .await
        .expect("answered");
    let errors: Vec<String> = answer
        .output
        .errors
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            assert_eq!(e.code.as_deref(), Some("InvalidArgument"), "{e:?}");
            e.key.unwrap_or_default()
        })
        .collect();
    assert_eq!(errors, escaping, "each escaping key refused in Errors");
    let deleted: Vec<String> = answer
        .output
        .deleted
        .unwrap_or_default()
        .into_iter()
        .filter_map(|d| d.key)
        .collect();
    assert_eq!(deleted, ["mine"]);
    let mut after = store.snapshot();
    assert!(
        after.contains_key("other/secret"),
        "another bucket's object kept"
    );
    assert!(after.contains_key(&info), "the info file kept");
    assert!(after.contains_key("empty/"), "the empty bucket kept");
    // Only `mine` (its file and its info file) went.
    let gone: Vec<String> = before
        .keys()
        .filter(|k| !after.contains_key(*k))
        .cloned()
        .collect();
    assert!(gone.iter().any(|k| k == "bucket/mine"), "{gone:?}");
    assert!(
        gone.iter()
            .all(|k| k == "bucket/mine" || k.ends_with(".internal.json")),
        "{gone:?}"
    );
    after.retain(|k, _| k == "bucket/kept");
    assert_eq!(after.len(), 1, "the other object kept");
}

// Over HTTP: checksums that come as aws-chunked trailers, as boto3 sends
// them (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`: unsigned chunks, then
// `x-amz-checksum-ALG:VALUE` after the last).

fn server() -> s3::S3Server {
    let binary = Path::new(env!("CARGO_BIN_EXE_hipobj-s3-server"));
    s3::S3Server::start(binary, "127.0.0.1", &["--no-rdma"])
}

/// A PUT to `url` (an object or a part) of `data` in aws-chunked encoding
/// with the trailer `x-amz-checksum-ALGORITHM: value` after the last
/// chunk; returns the status and what curl printed (headers, then body).
fn put_with_trailer(url: &str, data: &[u8], algorithm: &str, value: &str) -> (u16, String) {
    let name = format!("x-amz-checksum-{}", algorithm.to_lowercase());
    let mut body = Vec::new();
    for chunk in data.chunks(64 << 10) {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("0\r\n{name}:{value}\r\n\r\n").as_bytes());
    let mut child = Command::new("curl")
        .args(["-sS", "--http1.1", "-D", "-", "-X", "PUT"])
        .arg("--aws-sigv4")
        .arg("aws:amz:us-east-1:s3")
        .arg("--user")
        .arg(format!("{}:{}", s3::ACCESS_KEY, s3::SECRET_KEY))
        .args([
            "-H",
            "x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        ])
        .args(["-H", "Content-Encoding: aws-chunked"])
        .args([
            "-H",
            &format!("x-amz-decoded-content-length: {}", data.len()),
        ])
        .args(["-H", &format!("x-amz-trailer: {name}")])
        .args(["-H", &format!("x-amz-sdk-checksum-algorithm: {algorithm}")])
        .args(["--data-binary", "@-", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("curl is needed for these tests: {e}"));
    let mut stdin = child.stdin.take().expect("piped");
    std::io::Write::write_all(&mut stdin, &body).expect("curl reads its body");
    drop(stdin);
    let out = child.wait_with_output().expect("curl ran");
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = text
        .split("\r\n\r\n")
        .filter(|b| b.starts_with("HTTP/"))
        .last()
        .unwrap_or_else(|| panic!("no HTTP response in {text:?}"))
        .to_owned();
    let status = last
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {last:?}"));
    (status, text)
}

/// A trailing checksum that matches is taken (and served back); one that
/// does not is 400 BadDigest naming both values, and the object it would
/// have replaced stays byte for byte, none is made where there was none,
/// and no temporary file is left.
#[test]
fn a_put_with_a_wrong_trailing_checksum_is_bad_digest_and_changes_nothing() {
    let server = server();
    let old = pattern(300_000, 10);
    let body = pattern(200_000, 11);
    for algorithm in ["CRC32", "CRC32C", "CRC64NVME", "SHA256"] {
        let right = checksum(algorithm, &old);
        let (status, said) = put_with_trailer(&server.url("kept"), &old, algorithm, &right);
        assert_eq!(status, 200, "the right {algorithm} trailer: {said}");
        let header = format!("x-amz-checksum-{}: {right}", algorithm.to_lowercase());
        assert!(
            said.to_lowercase().contains(&header.to_lowercase()),
            "{said}"
        );
        let before = snapshot(server.root());
        let (wrong, is) = (checksum(algorithm, b"other"), checksum(algorithm, &body));
        for key in ["kept", "new"] {
            let (status, said) = put_with_trailer(&server.url(key), &body, algorithm, &wrong);
            let what = format!("PUT {key} with a wrong {algorithm} trailer");
            assert!(
                snapshot(server.root()) == before,
                "{what}: the root changed"
            );
            assert_eq!(status, 400, "{what}: {said}");
            for part in ["BadDigest", algorithm, &wrong, &is] {
                assert!(said.contains(part), "{what}: {said} names {part}");
            }
        }
        let file = server.root().join(BUCKET).join("kept");
        assert!(std::fs::read(&file).unwrap() == old, "{algorithm}");
    }
    assert_eq!(temp_files(server.root()), Vec::<String>::new());
}

/// The same for UploadPart: a wrong trailing checksum stores no part.
#[test]
fn an_upload_part_with_a_wrong_trailing_checksum_is_bad_digest_and_not_stored() {
    let server = server();
    let create = s3::curl(
        &format!("{}?uploads=", server.url("multi")),
        &["-X", "POST"],
    )
    .unwrap();
    let said = String::from_utf8_lossy(&create.stdout).into_owned();
    let id = said
        .split("<UploadId>")
        .nth(1)
        .and_then(|s| s.split("</UploadId>").next())
        .unwrap_or_else(|| panic!("no upload id in {said}"))
        .to_owned();
    let url = |n: u32| format!("{}?partNumber={n}&uploadId={id}", server.url("multi"));
    let part = pattern(100_000, 12);
    let right = checksum("CRC32", &part);
    let (status, said) = put_with_trailer(&url(1), &part, "CRC32", &right);
    assert_eq!(status, 200, "{said}");
    let answered = said;
    let before = snapshot(server.root());
    let wrong = checksum("CRC32", b"other");
    for n in [1, 2] {
        let (status, said) = put_with_trailer(&url(n), &part, "CRC32", &wrong);
        assert!(
            snapshot(server.root()) == before,
            "part {n}: the root changed"
        );
        assert_eq!(status, 400, "part {n}: {said}");
        assert!(said.contains("BadDigest"), "part {n}: {said}");
    }
    let listed = s3::curl(&format!("{}?uploadId={id}", server.url("multi")), &[]).unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert_eq!(listed.matches("<Part>").count(), 1, "{listed}");
    assert!(
        answered
            .to_lowercase()
            .contains(&format!("x-amz-checksum-crc32: {}", right.to_lowercase())),
        "the part's answer carries its checksum: {answered}"
    );
}
