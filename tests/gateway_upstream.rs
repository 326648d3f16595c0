//! `hipobj-s3-server --upstream`: a gateway in front of another S3 store.
//!
//! Two servers run: the upstream, a `hipobj-s3-server --root DIR` with keys
//! of its own, and the gateway, `hipobj-s3-server --upstream URL` with the
//! upstream's keys in its environment and the test keys for its clients.
//! Requests go to the gateway through the AWS SDK's client (retries off, so
//! that every answer is the gateway's first); what reached the upstream is
//! read from its directory. A fake upstream (a TCP listener answering what
//! a test says, or nothing) shows the headers that reach an upstream and
//! the answers that a directory cannot give. Where a test needs the RDMA
//! path, the gateway runs in this process with RDMA on the fake fabric
//! (`tests/common/gateway.rs`); over real verbs it is the VM lane's.
//!
//! The second half calls `Upstream::put_object` directly with bodies that
//! fail: nothing of them may become visible upstream.

#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/s3.rs"]
mod s3server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumMode, CompletedMultipartUpload, CompletedPart};
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use hipobj::gateway::upstream::{Settings, Upstream};
use s3s::dto::{PutObjectInput, StreamingBlob};
use s3s::S3;
use s3server::{parse_banner, S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};

/// The upstream's own keys, which only the gateway has.
const UPSTREAM_KEY: &str = "upstream-key";
const UPSTREAM_SECRET: &str = "upstream-secret";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hipobj-s3-server"))
}

/// The upstream: a directory server with keys of its own.
fn upstream() -> S3Server {
    S3Server::start(
        binary(),
        "127.0.0.1",
        &[
            "--no-rdma",
            "--access-key",
            UPSTREAM_KEY,
            "--secret-key",
            UPSTREAM_SECRET,
        ],
    )
}

/// A running `hipobj-s3-server --upstream`.
struct Gateway {
    endpoint: String,
    child: Child,
    /// What it printed on standard error, a line each (also passed on to
    /// the test's).
    log: Arc<Mutex<Vec<String>>>,
    /// The lines it printed on standard output after its first.
    later: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts a gateway in front of `upstream`, signing for it with the
    /// upstream's key and `secret`, serving the test keys, with `extra`
    /// arguments. The environment holds nothing else the SDK would read.
    fn start(upstream: &str, secret: &str, extra: &[&str]) -> Gateway {
        let home = std::env::temp_dir().join(format!("hipobj-gw-home-{}", std::process::id()));
        let mut child = Command::new(binary())
            .args([
                "--upstream",
                upstream,
                "--listen",
                "127.0.0.1:0",
                "--no-rdma",
            ])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .args(extra)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("AWS_ACCESS_KEY_ID", UPSTREAM_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            // Nothing but the loopback: no instance metadata service.
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the gateway");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                lines.lock().unwrap().push(line);
            }
        });
        let later = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let lines = Arc::clone(&later);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = tx.send(reader.read_line(&mut line).map(|_| line));
            for line in reader.lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(line)) if !line.is_empty() => line,
            other => {
                let _ = child.kill();
                let status = child.wait();
                panic!("the gateway printed no first line: {other:?}, {status:?}");
            }
        };
        let (endpoint, _) = parse_banner(line.trim_end())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Gateway {
            endpoint,
            child,
            log,
            later,
        }
    }

    /// The lines of its log that contain `text`.
    fn logged(&self, text: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(text)).cloned().collect()
    }

    /// Its metrics' text, from `--metrics-listen`'s line.
    fn metrics(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = loop {
            let found = self.later.lock().unwrap().iter().find_map(|l| {
                l.strip_prefix("hipobj-s3-server metrics on ")
                    .map(str::to_owned)
            });
            if let Some(url) = found {
                break url;
            }
            assert!(Instant::now() < deadline, "no metrics line");
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = Command::new("curl")
            .args(["-sS", "--fail", &url])
            .output()
            .expect("curl is needed for this test");
        assert!(out.status.success(), "GET {url}: {out:?}");
        String::from_utf8(out.stdout).expect("the metrics are text")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An SDK client of `endpoint` with the test keys: no retries, checksums
/// only where asked, and no time-out of its own below a minute.
fn client(endpoint: &str) -> aws_sdk_s3::Client {
    client_in(endpoint, "us-east-1")
}

/// [`client`], signing for `region`.
fn client_in(endpoint: &str, region: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new(region.to_owned()))
        .credentials_provider(Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test"))
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        // The client waits for the gateway as long as it takes: only the
        // gateway's own time-outs may end a request.
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .timeout_config(
            aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(60))
                .build(),
        )
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// An error's status, code and message.
fn failure<E: ProvideErrorMetadata + std::fmt::Debug>(e: SdkError<E>) -> (u16, String, String) {
    let status = e
        .raw_response()
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|| panic!("no answer: {e:?}"));
    let code = e.code().unwrap_or_default().to_owned();
    let message = e.message().unwrap_or_default().to_owned();
    (status, code, message)
}

/// Bytes of every value, in an order that shows misplaced ranges.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let [b0, b1, b2, ..] = i.to_le_bytes();
            b0.wrapping_mul(31) ^ b1.wrapping_mul(7) ^ b2 ^ seed
        })
        .collect()
}

fn crc64nvme(data: &[u8]) -> String {
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, data);
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}

/// The upstream's root entries that belong to multipart uploads.
fn uploads_in(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .expect("the upstream's root")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.contains(".upload"))
        .collect()
}

fn object_file(server: &S3Server, key: &str) -> PathBuf {
    server.root().join(BUCKET).join(key)
}

async fn get(client: &aws_sdk_s3::Client, key: &str) -> Vec<u8> {
    let out = client
        .get_object()
        .bucket(BUCKET)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {key}: {e:?}"));
    out.body.collect().await.expect("the body").to_vec()
}

async fn put(client: &aws_sdk_s3::Client, key: &str, data: &[u8]) -> String {
    client
        .put_object()
        .bucket(BUCKET)
        .key(key)
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("PUT {key}: {e:?}"))
        .e_tag
        .expect("an ETag")
}

#[test]
fn objects_pass_through_byte_exact() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let data = pattern(300_000, 1);
        let etag = put(&c, "dir/object.bin", &data).await;
        assert_eq!(
            std::fs::read(object_file(&up, "dir/object.bin")).unwrap(),
            data,
            "the upstream holds the bytes"
        );
        assert_eq!(get(&c, "dir/object.bin").await, data);

        let ranged = c
            .get_object()
            .bucket(BUCKET)
            .key("dir/object.bin")
            .range("bytes=1000-1999")
            .send()
            .await
            .unwrap();
        assert_eq!(
            ranged.content_range.as_deref(),
            Some("bytes 1000-1999/300000")
        );
        assert_eq!(
            ranged.body.collect().await.unwrap().to_vec(),
            &data[1000..2000]
        );

        let head = c
            .head_object()
            .bucket(BUCKET)
            .key("dir/object.bin")
            .send()
            .await
            .unwrap();
        assert_eq!(head.content_length, Some(300_000));
        assert_eq!(head.e_tag.as_deref(), Some(etag.as_str()));

        put(&c, "dir/second", b"2").await;
        let v2 = c
            .list_objects_v2()
            .bucket(BUCKET)
            .prefix("dir/")
            .send()
            .await
            .unwrap();
        let keys: Vec<_> = v2.contents().iter().filter_map(|o| o.key()).collect();
        assert_eq!(keys, ["dir/object.bin", "dir/second"]);
        let v1 = c
            .list_objects()
            .bucket(BUCKET)
            .delimiter("/")
            .send()
            .await
            .unwrap();
        let prefixes: Vec<_> = v1
            .common_prefixes()
            .iter()
            .filter_map(|p| p.prefix())
            .collect();
        assert_eq!(prefixes, ["dir/"]);

        c.delete_object()
            .bucket(BUCKET)
            .key("dir/second")
            .send()
            .await
            .unwrap();
        assert!(!object_file(&up, "dir/second").exists());
        let gone = c
            .get_object()
            .bucket(BUCKET)
            .key("dir/second")
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(gone);
        assert_eq!((status, code.as_str()), (404, "NoSuchKey"), "{message}");
        assert!(
            message.contains(&up.endpoint),
            "names the upstream: {message}"
        );
    });
}

#[test]
fn multipart_uploads_pass_through_and_abort() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let parts = [pattern(5 << 20, 2), pattern(70_001, 3)];
        let created = c
            .create_multipart_upload()
            .bucket(BUCKET)
            .key("multi")
            .send()
            .await
            .unwrap();
        let id = created.upload_id().expect("an upload id").to_owned();
        let mut done = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let n = i32::try_from(i + 1).unwrap();
            let out = c
                .upload_part()
                .bucket(BUCKET)
                .key("multi")
                .upload_id(&id)
                .part_number(n)
                .body(ByteStream::from(part.clone()))
                .send()
                .await
                .unwrap();
            done.push(
                CompletedPart::builder()
                    .part_number(n)
                    .e_tag(out.e_tag().unwrap())
                    .build(),
            );
        }
        let listed = c
            .list_parts()
            .bucket(BUCKET)
            .key("multi")
            .upload_id(&id)
            .send()
            .await
            .unwrap();
        let mut numbers: Vec<_> = listed
            .parts()
            .iter()
            .filter_map(|p| p.part_number())
            .collect();
        numbers.sort_unstable(); // this upstream lists them in no order
        assert_eq!(numbers, [1, 2]);
        c.complete_multipart_upload()
            .bucket(BUCKET)
            .key("multi")
            .upload_id(&id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(done))
                    .build(),
            )
            .send()
            .await
            .unwrap();
        assert!(
            get(&c, "multi").await == parts.concat(),
            "the parts in order"
        );

        let created = c
            .create_multipart_upload()
            .bucket(BUCKET)
            .key("aborted")
            .send()
            .await
            .unwrap();
        let id = created.upload_id().unwrap().to_owned();
        c.upload_part()
            .bucket(BUCKET)
            .key("aborted")
            .upload_id(&id)
            .part_number(1)
            .body(ByteStream::from(pattern(1000, 4)))
            .send()
            .await
            .unwrap();
        c.abort_multipart_upload()
            .bucket(BUCKET)
            .key("aborted")
            .upload_id(&id)
            .send()
            .await
            .unwrap();
        assert_eq!(uploads_in(up.root()), Vec::<String>::new());
        assert!(!object_file(&up, "aborted").exists());
    });
}

/// This upstream (s3s's filesystem backend) does not list uploads: its
/// 501 comes back as it is, not as the gateway's own failure.
#[test]
fn list_multipart_uploads_reaches_the_upstream() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .list_multipart_uploads()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (501, "NotImplemented"),
            "{message}"
        );
        assert!(
            message.contains(&up.endpoint),
            "the upstream's answer: {message}"
        );
    });
    let fake = Fake::answering(&xml_answer(
        200,
        "<ListMultipartUploadsResult><Bucket>bucket</Bucket><KeyMarker></KeyMarker>\
         <UploadIdMarker></UploadIdMarker><MaxUploads>1000</MaxUploads>\
         <IsTruncated>false</IsTruncated><Upload><Key>big</Key><UploadId>u-1</UploadId>\
         </Upload></ListMultipartUploadsResult>",
    ));
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let listed = client(&gw.endpoint)
            .list_multipart_uploads()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap();
        let uploads: Vec<_> = listed
            .uploads()
            .iter()
            .map(|u| (u.key().unwrap(), u.upload_id().unwrap()))
            .collect();
        assert_eq!(uploads, [("big", "u-1")]);
    });
    let head = &fake.heads()[0];
    assert!(
        head.starts_with("GET /bucket") && head.contains("?uploads"),
        "{head}"
    );
}

/// Above `--upstream-multipart-bytes` a PUT goes as a multipart upload of
/// `--upstream-part-bytes` parts with CRC64NVME checksums, completed with
/// the whole object's; conditions apply at completion.
#[test]
fn a_put_above_the_threshold_goes_as_a_multipart_upload() {
    let up = upstream();
    let gw = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &[
            "--upstream-multipart-bytes",
            "6291456",
            "--upstream-part-bytes",
            "5242880",
        ],
    );
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let data = pattern(12 << 20, 5);
        let out = c
            .put_object()
            .bucket(BUCKET)
            .key("big")
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        assert!(
            out.e_tag().unwrap().ends_with("-3\""),
            "three parts: {:?}",
            out.e_tag()
        );
        assert_eq!(out.checksum_crc64_nvme(), Some(crc64nvme(&data).as_str()));
        assert!(std::fs::read(object_file(&up, "big")).unwrap() == data);
        assert!(get(&c, "big").await == data);
        assert_eq!(uploads_in(up.root()), Vec::<String>::new());

        // A condition that fails at completion: the upload is aborted.
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("big")
            .if_none_match("*")
            .body(ByteStream::from(pattern(7 << 20, 6)))
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (412, "PreconditionFailed"),
            "{message}"
        );
        assert!(
            std::fs::read(object_file(&up, "big")).unwrap() == data,
            "unchanged"
        );
        assert_eq!(uploads_in(up.root()), Vec::<String>::new());

        // A whole-object checksum that is not the body's: BadDigest, and
        // nothing completes.
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("sha")
            .checksum_sha256(base64::engine::general_purpose::STANDARD.encode([0u8; 32]))
            .body(ByteStream::from(pattern(7 << 20, 7)))
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!((status, code.as_str()), (400, "BadDigest"), "{message}");
        assert!(!object_file(&up, "sha").exists());
        assert_eq!(uploads_in(up.root()), Vec::<String>::new());
    });
}

#[test]
fn conditional_puts_and_ranges_fail_as_the_upstream_says() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        put(&c, "kept", b"first").await;
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("kept")
            .if_none_match("*")
            .body(ByteStream::from_static(b"second"))
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (412, "PreconditionFailed"),
            "{message}"
        );
        assert_eq!(std::fs::read(object_file(&up, "kept")).unwrap(), b"first");

        let e = c
            .get_object()
            .bucket(BUCKET)
            .key("kept")
            .range("bytes=100-200")
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!((status, code.as_str()), (416, "InvalidRange"), "{message}");

        let e = c
            .list_objects_v2()
            .bucket("no-such-bucket")
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!((status, code.as_str()), (404, "NoSuchBucket"), "{message}");
        assert!(message.contains(&up.endpoint), "{message}");

        let e = c
            .head_object()
            .bucket(BUCKET)
            .key("missing")
            .send()
            .await
            .unwrap_err();
        assert_eq!(failure(e).0, 404);
    });
}

/// Header checksums go to the upstream, which checks and keeps them; a GET
/// with checksum mode gets them back.
#[test]
fn checksums_pass_through_both_ways() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let data = pattern(4096, 8);
        let crc = crc64nvme(&data);
        let out = c
            .put_object()
            .bucket(BUCKET)
            .key("summed")
            .checksum_crc64_nvme(&crc)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        assert_eq!(out.checksum_crc64_nvme(), Some(crc.as_str()));
        let got = c
            .get_object()
            .bucket(BUCKET)
            .key("summed")
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(got.checksum_crc64_nvme(), Some(crc.as_str()));
        assert_eq!(got.body.collect().await.unwrap().to_vec(), data);

        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("bad")
            .checksum_crc64_nvme(crc64nvme(b"other bytes"))
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!((status, code.as_str()), (400, "BadDigest"), "{message}");
    });
}

/// A checksum sent as a trailer (aws-chunked) that is not the body's: the
/// gateway finds it before the upstream has the whole body, so nothing is
/// stored. (curl signs the headers; the payload is unsigned.)
#[test]
fn a_wrong_trailing_checksum_stores_nothing() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, UPSTREAM_SECRET, &[]);
    let data = pattern(3000, 9);
    let send = |key: &str, checksum: &str| {
        let mut body = format!("{:x}\r\n", data.len()).into_bytes();
        body.extend_from_slice(&data);
        body.extend_from_slice(
            format!("\r\n0\r\nx-amz-checksum-crc64nvme:{checksum}\r\n\r\n").as_bytes(),
        );
        let file =
            std::env::temp_dir().join(format!("hipobj-gw-trailer-{}-{key}", std::process::id()));
        std::fs::write(&file, &body).unwrap();
        let out = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
            .arg("--aws-sigv4")
            .arg("aws:amz:us-east-1:s3")
            .arg("--user")
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
            .args([
                "-H",
                "x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            ])
            .args(["-H", "content-encoding: aws-chunked"])
            .args([
                "-H",
                &format!("x-amz-decoded-content-length: {}", data.len()),
            ])
            .args(["-H", "x-amz-trailer: x-amz-checksum-crc64nvme"])
            .args(["-H", "x-amz-sdk-checksum-algorithm: CRC64NVME"])
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg(format!("{}/{BUCKET}/{key}", gw.endpoint))
            .output()
            .expect("curl is needed for this test");
        let _ = std::fs::remove_file(&file);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(send("right", &crc64nvme(&data)), "200");
    assert!(std::fs::read(object_file(&up, "right")).unwrap() == data);
    assert_eq!(send("wrong", &crc64nvme(b"not these bytes")), "400");
    assert!(!object_file(&up, "wrong").exists());
}

#[test]
fn wrong_upstream_credentials_come_back_as_403_naming_the_upstream() {
    let up = upstream();
    let gw = Gateway::start(&up.endpoint, "not-the-upstream-secret", &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("any")
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(status, 403, "{code}: {message}");
        assert_eq!(code, "SignatureDoesNotMatch", "{message}");
        assert!(message.contains(&up.endpoint), "{message}");
    });
}

#[test]
fn an_upstream_that_is_down_answers_503_naming_it() {
    // A port that was free a moment ago, and nothing listens on it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let gw = Gateway::start(&endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("any")
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (503, "ServiceUnavailable"),
            "{message}"
        );
        assert!(
            message.contains(&endpoint) && message.contains("could not reach"),
            "{message}"
        );
    });
}

#[test]
fn an_upstream_that_stalls_times_out_within_the_configured_time() {
    let fake = Fake::silent();
    let gw = Gateway::start(
        &fake.endpoint,
        UPSTREAM_SECRET,
        &["--upstream-timeout-ms", "1500"],
    );
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let start = Instant::now();
        let e = c
            .get_object()
            .bucket(BUCKET)
            .key("any")
            .send()
            .await
            .unwrap_err();
        let waited = start.elapsed();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (503, "ServiceUnavailable"),
            "{message}"
        );
        assert!(message.contains("1500 ms"), "{message}");
        assert_eq!(message.matches(&fake.endpoint).count(), 1, "{message}");
        assert!(
            waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        // A PUT whose body the upstream never takes: the same.
        let start = Instant::now();
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("any")
            .body(ByteStream::from(pattern(8 << 20, 1)))
            .send()
            .await
            .unwrap_err();
        let waited = start.elapsed();
        assert_eq!(failure(e).0, 503);
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    });
}

/// An object whose body stops coming: the client's answer is cut short
/// once the time-out has passed, not left waiting.
#[test]
fn an_object_whose_body_stalls_is_cut_short_within_the_time_out() {
    let fake =
        Fake::stalling_after("HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: \"e1\"\r\n\r\nabc");
    let gw = Gateway::start(
        &fake.endpoint,
        UPSTREAM_SECRET,
        &["--upstream-timeout-ms", "1500"],
    );
    runtime().block_on(async {
        let start = Instant::now();
        let got = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("k")
            .send()
            .await
            .unwrap();
        assert_eq!(got.content_length(), Some(10));
        let body = tokio::time::timeout(Duration::from_secs(20), got.body.collect()).await;
        assert!(!matches!(body, Ok(Ok(_))), "a body cut short");
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
    });
}

/// What the upstream answers, headers included, comes back; what the
/// client asks for (conditions, checksum mode) reaches the upstream.
#[test]
fn conditional_gets_and_their_answers_pass_through() {
    let fake = Fake::answering(&xml_answer(
        412,
        "<Error><Code>PreconditionFailed</Code><Message>At least one of the \
         pre-conditions you specified did not hold</Message></Error>",
    ));
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("k")
            .if_match("\"0123456789abcdef\"")
            .if_unmodified_since(aws_sdk_s3::primitives::DateTime::from_secs(1_000_000_000))
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (412, "PreconditionFailed"),
            "{message}"
        );
    });
    let head = fake.heads().remove(0).to_ascii_lowercase();
    for header in [
        "if-match: \"0123456789abcdef\"",
        "if-unmodified-since: sun, 09 sep 2001 01:46:40 gmt",
        "x-amz-checksum-mode: enabled",
    ] {
        assert!(head.contains(header), "{header} in {head}");
    }

    let fake =
        Fake::answering("HTTP/1.1 304 Not Modified\r\nETag: \"0123\"\r\nConnection: close\r\n\r\n");
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("k")
            .if_none_match("\"0123\"")
            .send()
            .await
            .unwrap_err();
        assert_eq!(failure(e).0, 304);
    });
    assert!(fake.heads()[0]
        .to_ascii_lowercase()
        .contains("if-none-match: \"0123\""));

    let crc = crc64nvme(b"abc");
    let fake = Fake::answering(&format!(
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nETag: \"e1\"\r\n\
         x-amz-checksum-crc64nvme: {crc}\r\nx-amz-checksum-type: FULL_OBJECT\r\n\
         Connection: close\r\n\r\nabc"
    ));
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let got = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("k")
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(got.checksum_crc64_nvme(), Some(crc.as_str()));
        assert_eq!(got.e_tag(), Some("\"e1\""));
        assert_eq!(got.body.collect().await.unwrap().to_vec(), b"abc");
    });
}

#[test]
fn slow_down_comes_back_as_503_slow_down() {
    let fake = Fake::answering(&xml_answer(
        503,
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    ));
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .head_bucket()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap_err();
        assert_eq!(failure(e).0, 503);
        let e = client(&gw.endpoint)
            .get_object()
            .bucket(BUCKET)
            .key("k")
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!((status, code.as_str()), (503, "SlowDown"), "{message}");
    });
}

/// What the store says, in words the gateway's SDK cannot read: a
/// GetObject whose Last-Modified is ISO 8601 rather than an HTTP date, or
/// whose parts count is not a number.
const UNREADABLE_GETS: [&str; 2] = [
    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nETag: \"e1\"\r\n\
     Last-Modified: 2026-12-04T10:00:00.000Z\r\nConnection: close\r\n\r\nabc",
    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nETag: \"e1\"\r\n\
     Last-Modified: Fri, 04 Dec 2026 10:00:00 GMT\r\nx-amz-mp-parts-count: many\r\n\
     Connection: close\r\n\r\nabc",
];

/// A GET of `key` through `gw` with curl (`--aws-sigv4`, as a plain HTTP
/// client): its status, whether `--fail` would fail, and its body.
fn curl_get(gw: &Gateway, key: &str) -> (String, bool, String) {
    let file = std::env::temp_dir().join(format!("hipobj-gw-curl-{}-{key}", std::process::id()));
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "-o"])
        .arg(&file)
        .args(["-w", "%{http_code}", "--aws-sigv4", "aws:amz:us-east-1:s3"])
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .arg("--user")
        .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
        .arg(format!("{}/{BUCKET}/{key}", gw.endpoint))
        .output()
        .expect("curl is needed for this test");
    let body = std::fs::read(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        !out.status.success(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// A store's answer the gateway cannot read is 502 Bad Gateway with the
/// SDK's reason, logged and counted as every answer of 400 or more (and
/// the store's request as `unreadable`): never a success whose body is an
/// error (for GetObject, the object's bytes).
#[test]
fn an_answer_the_gateway_cannot_read_is_502_never_a_success() {
    for answer in UNREADABLE_GETS {
        let fake = Fake::answering(answer);
        let gw = Gateway::start(
            &fake.endpoint,
            UPSTREAM_SECRET,
            &["--metrics-listen", "127.0.0.1:0"],
        );
        let (status, failed, body) = curl_get(&gw, "k");
        assert_eq!(status, "502", "{body}");
        assert!(failed, "curl --fail fails");
        assert!(
            body.contains("could not read the store&apos;s answer")
                || body.contains("could not read the store's answer"),
            "{body}"
        );
        assert!(body.contains(&fake.endpoint), "names the store: {body}");
        // Logged once the answer has gone.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !gw
            .logged("(GetObject)")
            .iter()
            .any(|l| l.contains(": 502 InternalError"))
        {
            assert!(
                Instant::now() < deadline,
                "the log line of an answer of 400 or more: {:?}",
                gw.logged("")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let counted = |metrics: &str| {
            let has = |series: &str, labels: [&str; 2]| {
                metrics
                    .lines()
                    .any(|l| l.starts_with(series) && labels.iter().all(|x| l.contains(x)))
            };
            has(
                "hipobj_s3_requests_total{",
                ["op=\"GetObject\"", "status=\"502\""],
            ) && has(
                "hipobj_s3_upstream_request_duration_seconds_count{",
                ["op=\"GetObject\"", "outcome=\"unreadable\""],
            )
        };
        let mut metrics = gw.metrics();
        while !counted(&metrics) {
            assert!(Instant::now() < deadline, "counted as a 502: {metrics}");
            std::thread::sleep(Duration::from_millis(20));
            metrics = gw.metrics();
        }
    }

    // Answers of other operations whose XML root is not S3's.
    let fake = Fake::answering(&xml_answer(
        200,
        "<ListPartsOutput><Bucket>bucket</Bucket><Key>k</Key><UploadId>u-1</UploadId>\
         </ListPartsOutput>",
    ));
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .list_parts()
            .bucket(BUCKET)
            .key("k")
            .upload_id("u-1")
            .send()
            .await
            .unwrap_err();
        let (status, _, message) = failure(e);
        assert_eq!(status, 502, "{message}");
        assert!(
            message.contains("ListParts: could not read the store's answer"),
            "{message}"
        );
    });
    let fake = Fake::answering(&xml_answer(
        200,
        "<BucketVersioning><Status>Enabled</Status></BucketVersioning>",
    ));
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .get_bucket_versioning()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap_err();
        let (status, _, message) = failure(e);
        assert_eq!(status, 502, "{message}");
        assert!(
            message.contains("could not read the store's answer"),
            "{message}"
        );
    });
}

/// By RDMA (the gateway in this process, on the fake fabric), the same
/// answers fail the transfer with the store's 502 in the RDMA reply: the
/// client is told what the store did, not that RDMA failed.
#[test]
fn an_rdma_get_of_an_answer_the_gateway_cannot_read_fails_with_502() {
    use hipobj::s3::objects::{self, Object, Policy};
    for answer in UNREADABLE_GETS {
        let fake = Fake::answering(answer);
        let world = hipobj_testing::world::World::new();
        let credentials = Credentials::new(UPSTREAM_KEY, UPSTREAM_SECRET, None, None, "test");
        let gw = gateway::Gateway::upstream_signed(&world, &fake.endpoint, &[], credentials);
        let client = rdma_client(&world);
        let s3 = gateway_s3(&gw);
        let mut buf = client.host_buffer(3).unwrap();
        let policy = Policy {
            fallback: false,
            verify: true,
        };
        let e = objects::get(
            &client,
            Object::new(&s3, BUCKET, "k"),
            0..3,
            &mut buf,
            0,
            policy,
        )
        .expect_err("a GET of an answer the gateway cannot read");
        let text = e.to_string();
        assert!(text.contains("502"), "{text}");
        assert!(text.contains("could not read the store's answer"), "{text}");
        assert!(
            fake.heads().iter().any(|h| h.starts_with("GET /bucket/k")),
            "asked of the store: {:?}",
            fake.heads()
        );
    }
}

/// A PutObject up to S3's single-PUT limit (5 GiB) keeps S3's semantics
/// through the gateway: one streamed PutObject at the store, whose ETag
/// (the body's MD5) is the client's answer. The body streams: the client
/// sends 48 of its 65 MiB and holds the rest back until the store has 32
/// MiB of them, which a gateway that held the body (or more than 16 MiB of
/// it) before sending it on would never give.
#[test]
fn a_put_object_up_to_5_gib_is_one_streamed_put_answered_with_its_md5() {
    use s3s::crypto::{Checksum as _, Md5};
    let taker = Taker::start();
    let gw = Gateway::start(&taker.endpoint, UPSTREAM_SECRET, &[]);
    let data = Bytes::from(pattern(65 << 20, 14));
    let md5 = Md5::checksum(&data);
    let content_md5 = base64::engine::general_purpose::STANDARD.encode(md5);
    let (sent_first, held_until) = (48 << 20, 32 << 20);
    runtime().block_on(async {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let body = ByteStream::from_body_1_x(Channel {
            rx,
            left: data.len() as u64,
        });
        let received = Arc::clone(&taker.received);
        let feed = tokio::spawn({
            let data = data.clone();
            async move {
                let pieces = |range: std::ops::Range<usize>| {
                    (range.clone().step_by(1 << 20))
                        .map(|at| data.slice(at..(at + (1 << 20)).min(range.end)))
                        .collect::<Vec<_>>()
                };
                for piece in pieces(0..sent_first) {
                    tx.send(piece).await.expect("the body is read");
                }
                // Within the client's own time-out (a minute).
                let deadline = Instant::now() + Duration::from_secs(30);
                while received.load(Ordering::SeqCst) < held_until {
                    assert!(
                        Instant::now() < deadline,
                        "the store had {} bytes of the first {sent_first} sent, not {held_until}: \
                         the gateway holds the body back",
                        received.load(Ordering::SeqCst)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                for piece in pieces(sent_first..data.len()) {
                    tx.send(piece).await.expect("the body is read");
                }
            }
        });
        let out = client(&gw.endpoint)
            .put_object()
            .bucket(BUCKET)
            .key("big")
            .content_length(i64::try_from(data.len()).unwrap())
            .content_md5(&content_md5)
            .body(body)
            .send()
            .await;
        feed.abort();
        if let Err(e) = feed.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        let out = out.unwrap_or_else(|e| panic!("PUT: {e:?}"));
        assert_eq!(
            out.e_tag(),
            Some(format!("\"{}\"", hex::encode(md5)).as_str()),
            "the body's MD5"
        );
    });
    let heads = taker.heads();
    assert_eq!(heads.len(), 1, "one request to the store: {heads:?}");
    let head = heads[0].to_ascii_lowercase();
    // PutObject: PUT of the key, no upload's query (the SDK adds x-id).
    let target = head.split(' ').nth(1).unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    assert!(head.starts_with("put ") && path == "/bucket/big", "{head}");
    assert!(
        !query.contains("upload") && !query.contains("partnumber"),
        "{head}"
    );
    assert!(
        head.contains(&format!("content-length: {}\r\n", data.len())),
        "{head}"
    );
    assert!(
        head.contains(&format!(
            "content-md5: {}\r\n",
            content_md5.to_ascii_lowercase()
        )),
        "{head}"
    );
    assert_eq!(taker.received.load(Ordering::SeqCst), data.len() as u64);
}

/// A request body fed from a channel, of a length given in advance.
struct Channel {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    left: u64,
}

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|piece| {
            piece.map(|piece| {
                self.left = self.left.saturating_sub(piece.len() as u64);
                Ok(hyper::body::Frame::data(piece))
            })
        })
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// A fake store that takes bodies, as S3 takes a PutObject: it records
/// each request's head, reads its body (`Content-Length`) as it comes,
/// counting the bytes received, and answers 200 with the body's MD5 as
/// its ETag.
struct Taker {
    endpoint: String,
    heads: Arc<Mutex<Vec<String>>>,
    received: Arc<AtomicU64>,
    /// The bodies received whole.
    whole: Arc<AtomicUsize>,
}

impl Taker {
    fn start() -> Taker {
        use s3s::crypto::{Checksum as _, Md5};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let received = Arc::new(AtomicU64::new(0));
        let whole = Arc::new(AtomicUsize::new(0));
        let (seen, counted, bodies) = (
            Arc::clone(&heads),
            Arc::clone(&received),
            Arc::clone(&whole),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(120)));
                let Some(head) = read_head(&mut conn) else {
                    continue;
                };
                let length = content_length(&head);
                seen.lock().unwrap().push(head);
                let mut md5 = Md5::new();
                let mut block = vec![0u8; 64 << 10];
                let mut left = length;
                while left > 0 {
                    let want = usize::try_from(left.min(block.len() as u64)).unwrap();
                    match conn.read(&mut block[..want]) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            md5.update(&block[..n]);
                            left -= n as u64;
                            counted.fetch_add(n as u64, Ordering::SeqCst);
                        }
                    }
                }
                if left > 0 {
                    continue;
                }
                bodies.fetch_add(1, Ordering::SeqCst);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nETag: \"{}\"\r\nContent-Length: 0\r\n\
                     Connection: close\r\n\r\n",
                    hex::encode(md5.finalize())
                );
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        Taker {
            endpoint,
            heads,
            received,
            whole,
        }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// A single PUT whose checksum comes as a value alone (the AWS SDKs and
/// the hipobj client send `x-amz-checksum-crc64nvme` without
/// `x-amz-sdk-checksum-algorithm`) reaches the store with its algorithm
/// named too: some stores keep a checksum only when it is named. Plain
/// and by RDMA.
#[test]
fn a_single_put_names_the_algorithm_of_its_checksum() {
    let ok = "HTTP/1.1 200 OK\r\nETag: \"e1\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let data = pattern(4096, 15);
    let crc = crc64nvme(&data);
    let named = |head: &str| {
        let head = head.to_ascii_lowercase();
        assert!(
            head.contains(&format!(
                "x-amz-checksum-crc64nvme: {}\r\n",
                crc.to_ascii_lowercase()
            )),
            "{head}"
        );
        assert!(
            head.contains("x-amz-sdk-checksum-algorithm: crc64nvme\r\n"),
            "{head}"
        );
    };

    let fake = Fake::answering(ok);
    let gw = Gateway::start(&fake.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        client(&gw.endpoint)
            .put_object()
            .bucket(BUCKET)
            .key("summed")
            .checksum_crc64_nvme(&crc)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
    });
    let heads = fake.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    named(&heads[0]);

    let fake = Fake::answering(ok);
    let world = hipobj_testing::world::World::new();
    let credentials = Credentials::new(UPSTREAM_KEY, UPSTREAM_SECRET, None, None, "test");
    let gw = gateway::Gateway::upstream_signed(&world, &fake.endpoint, &[], credentials);
    let client = rdma_client(&world);
    let s3 = gateway_s3(&gw);
    let buf = client.register_host(data.clone()).unwrap();
    let object = hipobj::s3::objects::Object::new(&s3, BUCKET, "summed");
    let mut request = hipobj::s3::objects::RdmaRequest::new(object, hipobj::s3::objects::Op::Put)
        .with_checksum(hipobj::s3::Checksum::crc64nvme(&data));
    client
        .put(&buf, 0..data.len(), &mut request)
        .expect("a PUT by RDMA");
    let heads = fake.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    named(&heads[0]);
}

/// A plain PutObject or UploadPart whose header checksum is not its
/// body's is refused by the gateway itself (400 BadDigest), its body never
/// reaching the store whole: integrity does not rest on the store checking
/// what the gateway forwards (this fake store checks nothing).
#[test]
fn a_plain_put_whose_header_checksum_is_wrong_never_reaches_the_store_whole() {
    let taker = Taker::start();
    let gw = Gateway::start(&taker.endpoint, UPSTREAM_SECRET, &[]);
    let data = pattern(3 << 20, 16);
    let wrong_crc = crc64nvme(b"other bytes");
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let refused = |e: SdkError<_>, what: &str| {
            let (status, code, message) = failure(e);
            assert_eq!(
                (status, code.as_str()),
                (400, "BadDigest"),
                "{what}: {message}"
            );
        };
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("crc")
            .checksum_crc64_nvme(&wrong_crc)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap_err();
        refused(e, "CRC64NVME");
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("sha256")
            .checksum_sha256(base64::engine::general_purpose::STANDARD.encode([7u8; 32]))
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap_err();
        refused(e, "SHA256");
        let e = c
            .put_object()
            .bucket(BUCKET)
            .key("md5")
            .content_md5("1B2M2Y8AsgTpgAmY7PhCfg==")
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap_err();
        refused(e, "Content-MD5");
        let e = c
            .upload_part()
            .bucket(BUCKET)
            .key("part")
            .upload_id("u-1")
            .part_number(1)
            .checksum_crc64_nvme(&wrong_crc)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!(
            (status, code.as_str()),
            (400, "BadDigest"),
            "UploadPart: {message}"
        );
        // The same with its own checksum: stored.
        c.put_object()
            .bucket(BUCKET)
            .key("right")
            .checksum_crc64_nvme(crc64nvme(&data))
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
    });
    assert_eq!(
        taker.whole.load(Ordering::SeqCst),
        1,
        "only the right body reached the store whole: {:?}",
        taker.heads()
    );
}

/// A client of the library on `world`'s fake fabric, without a GPU.
fn rdma_client(world: &hipobj_testing::world::World) -> hipobj::client::Client {
    hipobj::client::Client::builder()
        .platform(world.platform())
        .gpu(hipobj::client::GpuSelect::None)
        .build()
        .unwrap()
}

/// The built-in S3 client of `gw` (in this process), with the test keys.
fn gateway_s3(gw: &gateway::Gateway) -> hipobj::s3::S3 {
    hipobj::s3::S3::new(hipobj::s3::S3Config {
        endpoint: gw.endpoint.clone(),
        region: "us-east-1".to_owned(),
        credentials: hipobj::s3::Credentials {
            access_key_id: ACCESS_KEY.to_owned(),
            secret_access_key: SECRET_KEY.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap()
}

/// GetBucketLocation through the gateway answers the region its clients
/// sign for (the request's), once the store's HeadBucket says the bucket
/// is there: the store's own location (Garage answers its region,
/// "garage") would send clients to sign for a region the gateway refuses,
/// and SeaweedFS's answer (the root `CreateBucketConfiguration`, not S3's
/// `LocationConstraint`) is one the SDK cannot read.
#[test]
fn get_bucket_location_answers_the_gateway_s_region_for_a_bucket_the_store_has() {
    use aws_sdk_s3::types::BucketLocationConstraint;
    let seaweedfs = Fake::answering(&xml_answer(
        200,
        "<CreateBucketConfiguration><LocationConstraint></LocationConstraint>\
         </CreateBucketConfiguration>",
    ));
    let gw = Gateway::start(
        &seaweedfs.endpoint,
        UPSTREAM_SECRET,
        &["--region", "eu-central-1"],
    );
    runtime().block_on(async {
        let out = client_in(&gw.endpoint, "eu-central-1")
            .get_bucket_location()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            out.location_constraint(),
            Some(&BucketLocationConstraint::EuCentral1)
        );
    });
    let heads = seaweedfs.heads();
    assert!(
        heads.len() == 1 && heads[0].starts_with("HEAD /bucket"),
        "the store's HeadBucket: {heads:?}"
    );

    let garage = Fake::answering(&xml_answer(
        200,
        "<LocationConstraint>garage</LocationConstraint>",
    ));
    let gw = Gateway::start(&garage.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let out = client(&gw.endpoint)
            .get_bucket_location()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        // us-east-1, as S3 says it: an empty constraint.
        let constraint = out.location_constraint().map(|c| c.as_str());
        assert_eq!(constraint.unwrap_or_default(), "", "{constraint:?}");
    });

    let missing =
        Fake::answering("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let gw = Gateway::start(&missing.endpoint, UPSTREAM_SECRET, &[]);
    runtime().block_on(async {
        let e = client(&gw.endpoint)
            .get_bucket_location()
            .bucket(BUCKET)
            .send()
            .await
            .unwrap_err();
        let (status, code, message) = failure(e);
        assert_eq!((status, code.as_str()), (404, "NoSuchBucket"), "{message}");
        assert!(message.contains(&missing.endpoint), "{message}");
    });
}

/// An HTTP answer with an XML body.
fn xml_answer(status: u16, xml: &str) -> String {
    format!(
        "HTTP/1.1 {status} Whatever\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{xml}",
        xml.len()
    )
}

/// A fake upstream on the loopback: it records each request's head and
/// answers every request with one canned answer (then closes the
/// connection, or holds it open), or never answers.
struct Fake {
    endpoint: String,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    fn answering(answer: &str) -> Fake {
        Fake::start(Some(answer.to_owned()), false)
    }

    /// Sends `answer` (the start of one) and then nothing more.
    fn stalling_after(answer: &str) -> Fake {
        Fake::start(Some(answer.to_owned()), true)
    }

    /// Takes connections and requests, and never answers.
    fn silent() -> Fake {
        Fake::start(None, true)
    }

    fn start(answer: Option<String>, hold: bool) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let Some(head) = read_request(&mut conn) else {
                    continue;
                };
                seen.lock().unwrap().push(head);
                if let Some(answer) = &answer {
                    let _ = conn.write_all(answer.as_bytes());
                }
                if hold {
                    held.push(conn);
                }
            }
        });
        Fake { endpoint, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// A request's head, its body (of `Content-Length`) read and dropped; a
/// body the sender streams without end is read for at most two seconds.
fn read_request(conn: &mut TcpStream) -> Option<String> {
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let head = read_head(conn)?;
    let length = content_length(&head);
    let _ = std::io::copy(&mut conn.take(length), &mut std::io::sink());
    Some(head)
}

/// A request's head, up to its blank line.
fn read_head(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// A head's `Content-Length`, 0 without one.
fn content_length(head: &str) -> u64 {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<u64>().ok())?
        })
        .unwrap_or(0)
}

// Upstream::put_object from a stream, called directly.

/// The backend over `up`, with its keys; multipart above 6 MiB, parts of
/// 5; a time-out of 10 s.
async fn backend(up: &S3Server) -> Upstream {
    backend_waiting(up, Duration::from_secs(10)).await
}

/// The backend over `up` with the time-out `timeout`.
async fn backend_waiting(up: &S3Server, timeout: Duration) -> Upstream {
    let settings = Settings {
        endpoint: up.endpoint.clone(),
        region: "us-east-1".into(),
        profile: None,
        path_style: true,
        timeout,
        multipart_bytes: 6 << 20,
        part_bytes: 5 << 20,
        cache: None,
    };
    let credentials = Credentials::new(UPSTREAM_KEY, UPSTREAM_SECRET, None, None, "test");
    Upstream::connect_with(&settings, credentials)
        .await
        .expect("the backend")
}

/// A PutObject of `len` bytes whose body yields `chunks`, then `tail`.
fn put_request(
    key: &str,
    len: usize,
    chunks: Vec<Bytes>,
    tail: Option<std::io::Error>,
) -> s3s::S3Request<PutObjectInput> {
    let items: Vec<Result<Bytes, std::io::Error>> =
        chunks.into_iter().map(Ok).chain(tail.map(Err)).collect();
    let input = PutObjectInput {
        bucket: BUCKET.into(),
        key: key.into(),
        content_length: Some(i64::try_from(len).unwrap()),
        body: Some(StreamingBlob::wrap(futures::stream::iter(items))),
        ..PutObjectInput::default()
    };
    hipobj::gateway::backend::alone(input)
}

fn chunks(data: &[u8], size: usize) -> Vec<Bytes> {
    data.chunks(size).map(Bytes::copy_from_slice).collect()
}

fn broken() -> Option<std::io::Error> {
    Some(std::io::Error::other("the RDMA READ failed"))
}

/// Whether the upstream lists `key` (ListObjectsV2 with its own keys).
async fn listed(up: &S3Server, key: &str) -> bool {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&up.endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            UPSTREAM_KEY,
            UPSTREAM_SECRET,
            None,
            None,
            "t",
        ))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
        .list_objects_v2()
        .bucket(BUCKET)
        .send()
        .await
        .unwrap()
        .contents()
        .iter()
        .any(|o| o.key() == Some(key))
}

#[test]
fn a_stream_failing_midway_above_the_threshold_leaves_nothing_upstream() {
    let up = upstream();
    let data = pattern(12 << 20, 10);
    runtime().block_on(async {
        let gw = backend(&up).await;
        // Two parts' worth, then the transfer fails.
        let req = put_request(
            "failed",
            data.len(),
            chunks(&data[..11 << 20], 1 << 20),
            broken(),
        );
        let e = gw.put_object(req).await.unwrap_err();
        assert!(
            e.message()
                .unwrap_or_default()
                .contains("the RDMA READ failed"),
            "{e:?}"
        );
        assert!(!listed(&up, "failed").await);
        assert_eq!(uploads_in(up.root()), Vec::<String>::new());
        // Short of its length, and past it: the same.
        let req = put_request(
            "short",
            data.len(),
            chunks(&data[..11 << 20], 1 << 20),
            None,
        );
        let e = gw.put_object(req).await.unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::IncompleteBody, "{e:?}");
        let req = put_request("long", 11 << 20, chunks(&data, 1 << 20), None);
        let e = gw.put_object(req).await.unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::IncompleteBody, "{e:?}");
        assert!(!listed(&up, "short").await && !listed(&up, "long").await);
        assert_eq!(uploads_in(up.root()), Vec::<String>::new());
        // The same stream whole: stored.
        let req = put_request("whole", data.len(), chunks(&data, 1 << 20), None);
        gw.put_object(req).await.unwrap();
        assert!(std::fs::read(object_file(&up, "whole")).unwrap() == data);
    });
}

/// Below the threshold one PutObject carries the stream: a body that fails
/// (even after its last byte) or ends short never reaches the upstream
/// whole.
#[test]
fn a_single_put_whose_stream_fails_stores_nothing() {
    let up = upstream();
    let data = pattern(3 << 20, 11);
    runtime().block_on(async {
        let gw = backend(&up).await;
        for (key, tail) in [("midway", true), ("at-the-end", false)] {
            let sent = if tail { &data[..1 << 20] } else { &data[..] };
            let req = put_request(key, data.len(), chunks(sent, 64 << 10), broken());
            let e = gw.put_object(req).await.unwrap_err();
            assert!(
                e.message()
                    .unwrap_or_default()
                    .contains("the RDMA READ failed"),
                "{key}: {e:?}"
            );
            assert!(!object_file(&up, key).exists(), "{key}");
        }
        let req = put_request(
            "short",
            data.len(),
            chunks(&data[..2 << 20], 64 << 10),
            None,
        );
        let e = gw.put_object(req).await.unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::IncompleteBody, "{e:?}");
        assert!(!object_file(&up, "short").exists());
        assert!(!listed(&up, "midway").await && !listed(&up, "at-the-end").await);
    });
}

/// A request dropped half way (its client went away) aborts its upload.
#[test]
fn a_dropped_multipart_put_is_aborted() {
    let up = upstream();
    let data = pattern(6 << 20, 12);
    runtime().block_on(async {
        let gw = Arc::new(backend(&up).await);
        // One part, then a body that never goes on.
        let first: Vec<Result<Bytes, std::io::Error>> =
            chunks(&data, 1 << 20).into_iter().map(Ok).collect();
        let stalled = futures::stream::iter(first).chain(futures::stream::pending());
        let mut req = put_request("dropped", 20 << 20, Vec::new(), None);
        req.input.body = Some(StreamingBlob::wrap(stalled));
        let task = {
            let gw = Arc::clone(&gw);
            tokio::spawn(async move { gw.put_object(req).await })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !uploads_in(up.root()).iter().any(|n| n.contains(".part-1")) {
            assert!(Instant::now() < deadline, "no part was uploaded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !uploads_in(up.root()).is_empty() {
            assert!(
                Instant::now() < deadline,
                "still there: {:?}",
                uploads_in(up.root())
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// A body whose source pauses longer than the time-out (and than the SDK's
/// own stall grace of 5 s) is not the upstream's stall: waiting on the
/// source does not count.
#[test]
fn a_slow_body_source_is_not_taken_for_a_stalled_upstream() {
    let up = upstream();
    let data = pattern(7 << 20, 13);
    runtime().block_on(async {
        let gw = backend_waiting(&up, Duration::from_secs(2)).await;
        for (key, len) in [("single", 1 << 20), ("parts", 7 << 20)] {
            let (first, rest) = data[..len].split_at(len / 2);
            let (first, rest) = (Bytes::copy_from_slice(first), Bytes::copy_from_slice(rest));
            let paused = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
                .chain(futures::stream::once(async move {
                    tokio::time::sleep(Duration::from_secs(6)).await;
                    Ok(rest)
                }));
            let mut req = put_request(key, len, Vec::new(), None);
            req.input.body = Some(StreamingBlob::wrap(paused));
            gw.put_object(req)
                .await
                .unwrap_or_else(|e| panic!("{key}: {e:?}"));
            assert!(std::fs::read(object_file(&up, key)).unwrap() == data[..len]);
        }
    });
}

// ---------------------------------------------------------------- the cache

/// Panics unless `got` is `want`, saying how they differ (not printing
/// them: objects are large).
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes, not the {} expected (first difference at {at:?})",
            got.len(),
            want.len()
        );
    }
}

/// Panics unless a GET of `key` answers 404.
async fn assert_gone(client: &aws_sdk_s3::Client, key: &str, what: &str) {
    let gone = client
        .get_object()
        .bucket(BUCKET)
        .key(key)
        .send()
        .await
        .unwrap_err();
    assert_eq!(failure(gone).0, 404, "{what}");
}

/// The upstream with its metrics on: (the server, its metrics URL).
fn counted_upstream() -> (S3Server, String) {
    let up = S3Server::start(
        binary(),
        "127.0.0.1",
        &[
            "--no-rdma",
            "--access-key",
            UPSTREAM_KEY,
            "--secret-key",
            UPSTREAM_SECRET,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let line = up.next_line();
    let url = line
        .strip_prefix("hipobj-s3-server metrics on ")
        .unwrap_or_else(|| panic!("the upstream's metrics line: {line:?}"))
        .to_owned();
    (up, url)
}

/// The sum of the metric `name`'s series whose labels contain `labels`
/// (each `key="value"`), in the text at `url`.
fn metric_at(url: &str, name: &str, labels: &[&str]) -> u64 {
    let out = Command::new("curl")
        .args(["-sS", "--fail", url])
        .output()
        .expect("curl is needed for this test");
    assert!(out.status.success(), "GET {url}: {out:?}");
    metric_in(&String::from_utf8_lossy(&out.stdout), name, labels)
}

fn metric_in(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && labels.iter().all(|label| l.contains(label))
        })
        // Counters and gauges of whole numbers ("5", or "5.0").
        .filter_map(|l| l.rsplit(' ').next()?.split('.').next()?.parse::<u64>().ok())
        .sum()
}

/// GetObject requests the upstream answered.
fn upstream_gets(url: &str) -> u64 {
    metric_at(url, "hipobj_s3_requests_total", &["op=\"GetObject\""])
}

/// A client of the upstream itself, with its own keys: a change made
/// behind the gateway.
fn behind(up: &S3Server) -> aws_sdk_s3::Client {
    behind_with(up, RequestChecksumCalculation::WhenRequired)
}

/// [`behind`], computing request checksums as `calculation` says (the
/// SDK's default, `WhenSupported`, sends the checksum a PUT names).
fn behind_with(up: &S3Server, calculation: RequestChecksumCalculation) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&up.endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            UPSTREAM_KEY,
            UPSTREAM_SECRET,
            None,
            None,
            "test",
        ))
        .force_path_style(true)
        .request_checksum_calculation(calculation)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

async fn get_range(client: &aws_sdk_s3::Client, key: &str, range: &str) -> Vec<u8> {
    let out = client
        .get_object()
        .bucket(BUCKET)
        .key(key)
        .range(range)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {key} {range}: {e:?}"));
    out.body.collect().await.expect("the body").to_vec()
}

#[test]
fn cached_objects_are_served_from_memory_the_store_asked_once() {
    let (up, up_metrics) = counted_upstream();
    let gw = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &[
            "--cache-bytes",
            "67108864",
            "--cache-validate",
            "ttl=3600",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let data = pattern(3 << 20, 7);
        put(&c, "hot.bin", &data).await;
        let before = upstream_gets(&up_metrics);
        same_bytes(&get(&c, "hot.bin").await, &data, "the miss");
        same_bytes(&get(&c, "hot.bin").await, &data, "a hit");
        same_bytes(
            &get_range(&c, "hot.bin", "bytes=1000-2999999").await,
            &data[1000..3_000_000],
            "a range",
        );
        same_bytes(
            &get_range(&c, "hot.bin", "bytes=-17").await,
            &data[data.len() - 17..],
            "a suffix",
        );
        let head = c
            .head_object()
            .bucket(BUCKET)
            .key("hot.bin")
            .send()
            .await
            .unwrap();
        assert_eq!(
            head.content_length,
            Some(i64::try_from(data.len()).unwrap())
        );
        let checked = c
            .get_object()
            .bucket(BUCKET)
            .key("hot.bin")
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(
            checked.checksum_crc64_nvme.as_deref(),
            Some(crc64nvme(&data).as_str())
        );
        assert_eq!(
            upstream_gets(&up_metrics) - before,
            1,
            "one GET reached the store"
        );
    });
    let text = gw.metrics();
    assert_eq!(
        metric_in(
            &text,
            "hipobj_s3_cache_requests_total",
            &["outcome=\"miss\""]
        ),
        1
    );
    assert!(
        metric_in(
            &text,
            "hipobj_s3_cache_requests_total",
            &["outcome=\"hit\""]
        ) >= 4,
        "{text}"
    );
    assert_eq!(
        metric_in(
            &text,
            "hipobj_s3_cache_bytes_total",
            &["source=\"upstream\""]
        ),
        3 << 20
    );
    assert!(metric_in(&text, "hipobj_s3_cache_in_use_bytes", &[]) >= 3 << 20);
}

#[test]
fn concurrent_readers_of_a_cold_object_cost_the_store_one_get() {
    let (up, up_metrics) = counted_upstream();
    let gw = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &[
            "--cache-bytes",
            "134217728",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let data = pattern(24 << 20, 3);
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        put(&c, "cold.bin", &data).await;
        let before = upstream_gets(&up_metrics);
        let readers = (0..8).map(|i| {
            let c = c.clone();
            async move {
                if i % 2 == 0 {
                    get(&c, "cold.bin").await
                } else {
                    get_range(&c, "cold.bin", &format!("bytes={}-", i << 20)).await
                }
            }
        });
        let got = futures::future::join_all(readers).await;
        for (i, bytes) in got.iter().enumerate() {
            let want = if i % 2 == 0 {
                &data[..]
            } else {
                &data[i << 20..]
            };
            assert!(
                bytes == want,
                "reader {i}: {} bytes, not the object's",
                bytes.len()
            );
        }
        // Validation (always) asks HEADs of the store, never GETs.
        assert_eq!(
            upstream_gets(&up_metrics) - before,
            1,
            "one GET reached the store"
        );
    });
    let text = gw.metrics();
    let coalesced = metric_in(&text, "hipobj_s3_cache_coalesced_readers_total", &[]);
    let hits = metric_in(
        &text,
        "hipobj_s3_cache_requests_total",
        &["outcome=\"hit\""],
    );
    assert_eq!(coalesced + hits, 7, "{text}");
}

#[test]
fn a_write_through_the_gateway_is_never_served_stale() {
    let (up, _) = counted_upstream();
    // Trusted for an hour: only the gateway's own invalidation can keep
    // a reader from the old bytes.
    let gw = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &["--cache-bytes", "67108864", "--cache-validate", "ttl=3600"],
    );
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let (one, two, three) = (pattern(100_000, 1), pattern(90_000, 2), pattern(80_000, 3));
        put(&c, "k", &one).await;
        same_bytes(&get(&c, "k").await, &one, "GET");
        put(&c, "k", &two).await;
        same_bytes(&get(&c, "k").await, &two, "PutObject through the gateway");
        put(&c, "source", &three).await;
        c.copy_object()
            .bucket(BUCKET)
            .key("k")
            .copy_source(format!("{BUCKET}/source"))
            .send()
            .await
            .unwrap();
        same_bytes(&get(&c, "k").await, &three, "CopyObject onto it");
        let upload = c
            .create_multipart_upload()
            .bucket(BUCKET)
            .key("k")
            .send()
            .await
            .unwrap();
        let id = upload.upload_id.unwrap();
        let part = c
            .upload_part()
            .bucket(BUCKET)
            .key("k")
            .upload_id(&id)
            .part_number(1)
            .body(ByteStream::from(one.clone()))
            .send()
            .await
            .unwrap();
        c.complete_multipart_upload()
            .bucket(BUCKET)
            .key("k")
            .upload_id(&id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .parts(
                        CompletedPart::builder()
                            .part_number(1)
                            .e_tag(part.e_tag.unwrap())
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await
            .unwrap();
        same_bytes(&get(&c, "k").await, &one, "CompleteMultipartUpload");
        c.delete_object()
            .bucket(BUCKET)
            .key("k")
            .send()
            .await
            .unwrap();
        assert_gone(&c, "k", "DeleteObject").await;
        put(&c, "k", &two).await;
        same_bytes(&get(&c, "k").await, &two, "GET");
        c.delete_objects()
            .bucket(BUCKET)
            .delete(
                aws_sdk_s3::types::Delete::builder()
                    .objects(
                        aws_sdk_s3::types::ObjectIdentifier::builder()
                            .key("k")
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_gone(&c, "k", "DeleteObjects").await;
    });
}

#[test]
fn a_change_behind_the_gateway_is_seen_under_always_and_after_the_ttl() {
    let (up, _) = counted_upstream();
    let always = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &["--cache-bytes", "67108864"],
    );
    let trusting = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &["--cache-bytes", "67108864", "--cache-validate", "ttl=2"],
    );
    runtime().block_on(async {
        let (a, t) = (client(&always.endpoint), client(&trusting.endpoint));
        let (one, two) = (pattern(50_000, 4), pattern(60_000, 5));
        put(&a, "moved", &one).await;
        same_bytes(&get(&a, "moved").await, &one, "GET");
        same_bytes(&get(&t, "moved").await, &one, "GET");
        behind(&up)
            .put_object()
            .bucket(BUCKET)
            .key("moved")
            .body(ByteStream::from(two.clone()))
            .send()
            .await
            .unwrap();
        same_bytes(
            &get(&a, "moved").await,
            &two,
            "always: the store's ETag asked first",
        );
        same_bytes(
            &get(&t, "moved").await,
            &one,
            "ttl: trusted until it expires",
        );
        tokio::time::sleep(Duration::from_millis(2100)).await;
        same_bytes(
            &get(&t, "moved").await,
            &two,
            "ttl: asked again once expired",
        );
    });
}

#[test]
fn with_the_store_down_ttl_serves_what_it_holds_and_always_answers_503() {
    let (mut up, _) = counted_upstream();
    let always = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &["--cache-bytes", "67108864"],
    );
    let trusting = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &["--cache-bytes", "67108864", "--cache-validate", "ttl=3600"],
    );
    let data = pattern(200_000, 9);
    runtime().block_on(async {
        let (a, t) = (client(&always.endpoint), client(&trusting.endpoint));
        put(&a, "kept", &data).await;
        same_bytes(&get(&a, "kept").await, &data, "GET");
        same_bytes(&get(&t, "kept").await, &data, "GET");
    });
    up.kill();
    runtime().block_on(async {
        let (a, t) = (client(&always.endpoint), client(&trusting.endpoint));
        same_bytes(&get(&t, "kept").await, &data, "ttl: served from memory");
        let started = Instant::now();
        let down = a
            .get_object()
            .bucket(BUCKET)
            .key("kept")
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            failure(down).0,
            503,
            "always: the store cannot say the entry holds"
        );
        assert!(started.elapsed() < Duration::from_secs(30));
    });
}

#[test]
fn a_scan_of_objects_read_once_leaves_a_hot_object_cached() {
    let (up, up_metrics) = counted_upstream();
    // 8 MiB, objects up to 1 MiB: the scan below is four times that.
    let gw = Gateway::start(
        &up.endpoint,
        UPSTREAM_SECRET,
        &[
            "--cache-bytes",
            "8388608",
            "--cache-max-object-bytes",
            "1048576",
            "--cache-validate",
            "ttl=3600",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let hot = pattern(1 << 20, 11);
        put(&c, "model", &hot).await;
        for _ in 0..3 {
            same_bytes(&get(&c, "model").await, &hot, "GET");
        }
        let scan = pattern(1 << 20, 12);
        for i in 0..32 {
            put(&c, &format!("scan/{i}"), &scan).await;
            same_bytes(&get(&c, &format!("scan/{i}")).await, &scan, "GET");
        }
        let before = upstream_gets(&up_metrics);
        same_bytes(&get(&c, "model").await, &hot, "GET");
        assert_eq!(
            upstream_gets(&up_metrics),
            before,
            "the hot object still served from memory"
        );
    });
    let text = gw.metrics();
    assert!(
        metric_in(&text, "hipobj_s3_cache_evictions_total", &[]) >= 20,
        "{text}"
    );
}

#[test]
fn a_fill_whose_bytes_fail_the_store_s_checksum_is_not_kept() {
    // A store whose bytes rotted: its answer's checksum is that of other
    // bytes of the same length, in the algorithm the object was stored
    // with. The gateway asks for it (the header) and checks it itself.
    let good = "abcdefgh".repeat(40_000);
    let mut rotten = good.clone().into_bytes();
    rotten[200_000] = b'z';
    let rotten = String::from_utf8(rotten).unwrap();
    let crc32c = base64::engine::general_purpose::STANDARD.encode(
        u32::try_from(crc_fast::checksum(
            crc_fast::CrcAlgorithm::Crc32Iscsi,
            good.as_bytes(),
        ))
        .unwrap()
        .to_be_bytes(),
    );
    for (header, value) in [
        ("x-amz-checksum-crc64nvme", crc64nvme(good.as_bytes())),
        ("x-amz-checksum-crc32c", crc32c),
    ] {
        let fake = Fake::answering(&format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"0123456789abcdef\"\r\n\
             Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\n{header}: {value}\r\n\
             x-amz-checksum-type: FULL_OBJECT\r\nConnection: close\r\n\r\n{rotten}",
            rotten.len(),
        ));
        let gw = Gateway::start(
            &fake.endpoint,
            UPSTREAM_SECRET,
            &["--cache-bytes", "67108864", "--cache-validate", "ttl=3600"],
        );
        runtime().block_on(async {
            let c = client(&gw.endpoint);
            for attempt in 0..2 {
                let read = c.get_object().bucket(BUCKET).key("rot").send().await;
                let got = match read {
                    Ok(out) => out.body.collect().await.map(|b| b.to_vec()),
                    Err(e) => panic!("GET rot: {e:?}"),
                };
                assert!(
                    got.is_err(),
                    "{header}: GET {attempt}: the rotten bytes were delivered whole: {:?}",
                    got.map(|b| b.len())
                );
            }
        });
        let gets: Vec<String> = fake
            .heads()
            .into_iter()
            .filter(|h| h.starts_with("GET "))
            .collect();
        assert_eq!(
            gets.len(),
            2,
            "{header}: each GET asked the store: nothing was kept"
        );
        for get in &gets {
            assert!(
                get.to_ascii_lowercase()
                    .contains("x-amz-checksum-mode: enabled"),
                "the fill asks for the store's checksum: {get}"
            );
        }
    }
}

/// The files of a disk tier's directory (`*.obj`), once `count` are there
/// (they are written in the background after a fill).
fn cache_files(dir: &std::path::Path, count: usize) -> Vec<std::path::PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let files: Vec<_> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "obj"))
                    .collect()
            })
            .unwrap_or_default();
        if files.len() == count {
            return files;
        }
        assert!(
            Instant::now() < deadline,
            "{} files in {}, not {count}",
            files.len(),
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_disk_tier_survives_a_restart_and_a_file_corrupted_while_down_is_not_served() {
    let (up, up_metrics) = counted_upstream();
    let dir = std::env::temp_dir().join(format!(
        "hipobj-cache-dir-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let dir_arg = dir.to_str().unwrap().to_owned();
    let options = |validate: &'static str| {
        vec![
            "--cache-bytes".to_owned(),
            "67108864".to_owned(),
            "--cache-validate".to_owned(),
            validate.to_owned(),
            "--cache-dir".to_owned(),
            dir_arg.clone(),
            "--cache-dir-bytes".to_owned(),
            "67108864".to_owned(),
            "--metrics-listen".to_owned(),
            "127.0.0.1:0".to_owned(),
        ]
    };
    let start = |validate: &'static str| {
        let options = options(validate);
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        Gateway::start(&up.endpoint, UPSTREAM_SECRET, &options)
    };
    let kept = pattern(3 << 20, 21);
    let rotted = pattern(2 << 20, 22);
    {
        let gw = start("ttl=3600");
        runtime().block_on(async {
            let c = client(&gw.endpoint);
            put(&c, "kept", &kept).await;
            put(&c, "rotted", &rotted).await;
            same_bytes(&get(&c, "kept").await, &kept, "the fill");
            same_bytes(&get(&c, "rotted").await, &rotted, "the fill");
        });
        cache_files(&dir, 2);
    }
    // While the gateway is down, one byte of "rotted"'s file flips.
    let files = cache_files(&dir, 2);
    let victim = files
        .iter()
        .find(|f| {
            let text = std::fs::read(f).unwrap();
            text.windows(8).any(|w| w == b"\"rotted\"")
        })
        .expect("the file of rotted");
    let mut bytes = std::fs::read(victim).unwrap();
    let at = bytes.len() - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(victim, &bytes).unwrap();

    let gw = start("ttl=3600");
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        let before = upstream_gets(&up_metrics);
        same_bytes(&get(&c, "kept").await, &kept, "kept, after the restart");
        assert_eq!(
            upstream_gets(&up_metrics),
            before,
            "kept: read from the disk, not the store"
        );
        same_bytes(
            &get(&c, "rotted").await,
            &rotted,
            "rotted, after the restart",
        );
        assert_eq!(
            upstream_gets(&up_metrics),
            before + 1,
            "rotted: its file failed its check, the store was asked"
        );
        same_bytes(&get(&c, "rotted").await, &rotted, "rotted, again");
        // A write through the gateway drops the file too: its next GET is
        // the new object, not the file's.
        let replaced = pattern(1 << 20, 24);
        put(&c, "rotted", &replaced).await;
        same_bytes(&get(&c, "rotted").await, &replaced, "rotted, rewritten");
        put(&c, "rotted", &rotted).await;
        same_bytes(&get(&c, "rotted").await, &rotted, "rotted, as it was");
    });
    let text = gw.metrics();
    assert_eq!(
        metric_in(
            &text,
            "hipobj_s3_cache_requests_total",
            &["outcome=\"disk_corrupt\""]
        ),
        1,
        "{text}"
    );
    assert_eq!(
        metric_in(&text, "hipobj_s3_cache_bytes_total", &["source=\"disk\""]),
        3 << 20,
        "{text}"
    );
    // The bad file is gone, the refilled one written.
    assert!(!victim.exists(), "the corrupted file was deleted");
    cache_files(&dir, 2);
    drop(gw);

    // Under `always`, a file is checked with the store after a restart
    // too: a change made behind the gateway meanwhile is not served.
    let newer = pattern(1 << 20, 23);
    runtime().block_on(async {
        behind(&up)
            .put_object()
            .bucket(BUCKET)
            .key("kept")
            .body(newer.clone().into())
            .send()
            .await
            .unwrap();
    });
    let gw = start("always");
    runtime().block_on(async {
        let c = client(&gw.endpoint);
        same_bytes(
            &get(&c, "kept").await,
            &newer,
            "always: the store's newer object",
        );
        same_bytes(
            &get(&c, "rotted").await,
            &rotted,
            "always: rotted, from the disk",
        );
    });
    let text = gw.metrics();
    assert_eq!(
        metric_in(&text, "hipobj_s3_cache_bytes_total", &["source=\"disk\""]),
        2 << 20,
        "{text}"
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The requests of operation `op` the upstream answered.
fn upstream_ops(url: &str, op: &str) -> u64 {
    metric_at(url, "hipobj_s3_requests_total", &[&format!("op=\"{op}\"")])
}

/// A gateway in this process on `world`'s fake fabric, in front of the
/// upstream at `endpoint` (signing with the upstream's keys), with `extra`
/// options.
fn gateway_in_front(
    world: &hipobj_testing::world::World,
    endpoint: &str,
    extra: &[&str],
) -> gateway::Gateway {
    let credentials = Credentials::new(UPSTREAM_KEY, UPSTREAM_SECRET, None, None, "test");
    gateway::Gateway::upstream_signed(world, endpoint, extra, credentials)
}

/// `range` of `key` by RDMA (never by plain HTTP), checked by the
/// client's CRC: its bytes.
fn rdma_get(
    client: &hipobj::client::Client,
    s3: &hipobj::s3::S3,
    key: &str,
    range: std::ops::Range<usize>,
) -> Vec<u8> {
    use hipobj::s3::objects::{self, Object, Policy};
    let policy = Policy {
        fallback: false,
        verify: true,
    };
    let len = range.end - range.start;
    let mut buf = client.host_buffer(len).unwrap();
    let got = objects::get(
        client,
        Object::new(s3, BUCKET, key),
        range.start as u64..range.end as u64,
        &mut buf,
        0,
        policy,
    )
    .unwrap_or_else(|e| panic!("RDMA GET {key} {range:?}: {e}"));
    assert!(
        matches!(got.path, objects::Path::Rdma(_)),
        "RDMA GET {key} {range:?}: {:?}",
        got.path
    );
    buf.as_slice().unwrap()[..len].to_vec()
}

#[test]
fn an_rdma_get_of_a_whole_object_costs_the_store_one_get_and_no_head() {
    let (up, up_metrics) = counted_upstream();
    let world = hipobj_testing::world::World::new();
    let gw = gateway_in_front(&world, &up.endpoint, &[]);
    let data = pattern(5 << 20, 41);
    runtime().block_on(async { put(&client(&gw.endpoint), "whole", &data).await });
    let client = rdma_client(&world);
    let s3 = gateway_s3(&gw);
    // The whole object (one GET, no HEAD), a range from the first byte
    // short of the end (the whole answer dropped, the range asked), and a
    // small first range (asked as it came).
    for (range, gets, heads) in [(0..data.len(), 1, 0), (0..(2 << 20), 2, 0), (0..4096, 1, 0)] {
        let (get_before, head_before) = (
            upstream_ops(&up_metrics, "GetObject"),
            upstream_ops(&up_metrics, "HeadObject"),
        );
        same_bytes(
            &rdma_get(&client, &s3, "whole", range.clone()),
            &data[range.clone()],
            "an RDMA GET",
        );
        assert_eq!(
            (
                upstream_ops(&up_metrics, "GetObject") - get_before,
                upstream_ops(&up_metrics, "HeadObject") - head_before
            ),
            (gets, heads),
            "{range:?}: the store's GETs and HEADs"
        );
    }
}

#[test]
fn concurrent_rdma_readers_of_a_cold_object_land_byte_exact_the_store_asked_once() {
    let (up, up_metrics) = counted_upstream();
    let world = hipobj_testing::world::World::new();
    let gw = gateway_in_front(&world, &up.endpoint, &["--cache-bytes", "134217728"]);
    let data = pattern(24 << 20, 31);
    runtime().block_on(async { put(&client(&gw.endpoint), "cold", &data).await });
    let before = upstream_gets(&up_metrics);
    let client = rdma_client(&world);
    let s3 = gateway_s3(&gw);
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let (client, s3, data) = (&client, &s3, &data);
                scope.spawn(move || {
                    same_bytes(
                        &rdma_get(client, s3, "cold", 0..data.len()),
                        data,
                        "a cold RDMA reader",
                    );
                })
            })
            .collect();
        for reader in readers {
            reader.join().unwrap();
        }
    });
    assert_eq!(
        upstream_gets(&up_metrics) - before,
        1,
        "one GET reached the store"
    );
}

/// An object the cache does not keep (larger than
/// `--cache-max-object-bytes`) costs the store one GET per whole-object
/// read, by HTTP or by RDMA: the fill's answer goes to its reader, not
/// asked again; a range is still served right.
#[test]
fn a_read_of_an_object_too_large_to_keep_costs_the_store_one_get() {
    let (up, up_metrics) = counted_upstream();
    let world = hipobj_testing::world::World::new();
    let gw = gateway_in_front(
        &world,
        &up.endpoint,
        &["--cache-bytes", "4194304", "--cache-validate", "ttl=3600"],
    );
    let data = pattern(3 << 20, 29);
    let c = client(&gw.endpoint);
    // Into the store itself, with its CRC64/NVME.
    runtime().block_on(async {
        let store = behind_with(&up, RequestChecksumCalculation::WhenSupported);
        store
            .put_object()
            .bucket(BUCKET)
            .key("large")
            .body(ByteStream::from(data.clone()))
            .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc64Nvme)
            .send()
            .await
            .expect("PUT with its CRC64/NVME");
    });
    // A GET that asks for the store's checksum gets it.
    let asked = runtime().block_on(async {
        c.get_object()
            .bucket(BUCKET)
            .key("large")
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .expect("a GET asking for the checksum")
    });
    assert!(
        asked.checksum_crc64_nvme().is_some(),
        "the store's checksum"
    );
    drop(asked);
    let before = upstream_gets(&up_metrics);
    let got = runtime().block_on(async {
        let got = c.get_object().bucket(BUCKET).key("large").send().await;
        let got = got.expect("a GET through the cache");
        let sums = [
            got.checksum_crc32(),
            got.checksum_crc32_c(),
            got.checksum_crc64_nvme(),
            got.checksum_sha1(),
            got.checksum_sha256(),
        ];
        assert!(
            sums.iter().all(Option::is_none),
            "no checksum asked, none sent: {sums:?}"
        );
        got.body.collect().await.unwrap().into_bytes()
    });
    same_bytes(&got, &data, "a plain GET of an object not kept");
    assert_eq!(upstream_gets(&up_metrics) - before, 1, "a plain GET");
    let client = rdma_client(&world);
    let s3 = gateway_s3(&gw);
    let before = upstream_gets(&up_metrics);
    same_bytes(
        &rdma_get(&client, &s3, "large", 0..data.len()),
        &data,
        "an RDMA GET of an object not kept",
    );
    assert_eq!(upstream_gets(&up_metrics) - before, 1, "an RDMA GET");
    let range = 1000..(2 << 20);
    same_bytes(
        &rdma_get(&client, &s3, "large", range.clone()),
        &data[range],
        "a range of an object not kept",
    );
}

/// The cache's bytes are the gateway's RDMA memory budget's: a kept
/// object holds its share until it is dropped; a fill that finds the
/// budget held by transfers serves its readers and keeps nothing; and a
/// `--cache-bytes` that would leave no room for a transfer is refused at
/// the start.
#[test]
fn the_cache_s_bytes_are_charged_to_the_rdma_memory_budget() {
    let (up, up_metrics) = counted_upstream();
    let world = hipobj_testing::world::World::new();
    let options = [
        "--rdma-memory-bytes",
        "25165824",
        "--rdma-chunk-bytes",
        "1048576",
        "--cache-bytes",
        "16777216",
        "--cache-max-object-bytes",
        "8388608",
        "--cache-validate",
        "ttl=3600",
    ];
    let gw = gateway_in_front(&world, &up.endpoint, &options);
    let data = pattern(5 << 20, 23);
    let c = client(&gw.endpoint);
    runtime().block_on(async { put(&c, "charged", &data).await });
    let client = rdma_client(&world);
    let s3 = gateway_s3(&gw);
    // What the budget holds once the transfers have let go of theirs.
    let settles_at = |want: u64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while gw.rdma.memory_in_use() != want {
            assert!(
                Instant::now() < deadline,
                "{what}: the budget holds {} bytes, not {want}",
                gw.rdma.memory_in_use()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    settles_at(0, "before any GET");
    let get = |what: &str| {
        same_bytes(
            &rdma_get(&client, &s3, "charged", 0..data.len()),
            &data,
            what,
        );
    };
    get("the miss");
    settles_at(data.len() as u64, "the object kept");
    get("a hit");
    settles_at(data.len() as u64, "after a hit");
    // A write through the gateway drops the entry, and its share.
    runtime().block_on(async {
        c.delete_object()
            .bucket(BUCKET)
            .key("charged")
            .send()
            .await
            .expect("DELETE through the gateway");
        put(&c, "charged", &data).await;
    });
    settles_at(0, "the entry invalidated");

    // Transfers (here: the test) hold all but 2 MiB: the fill serves its
    // reader and keeps nothing; the next GET asks the store again.
    let in_process = |labels: &[&str]| {
        metric_in(
            &hipobj::gateway::metrics::render(None),
            "hipobj_s3_cache_requests_total",
            labels,
        )
    };
    let room = gw.rdma.room();
    let taken = room
        .hold(room.limit() - (2 << 20))
        .expect("the budget's room");
    let no_memory = in_process(&["outcome=\"no_memory\""]);
    // A plain GET: an RDMA one would find no room for its own buffers.
    let plain = runtime().block_on(async {
        let got = c.get_object().bucket(BUCKET).key("charged").send().await;
        got.expect("a GET with the budget held")
            .body
            .collect()
            .await
            .unwrap()
            .into_bytes()
    });
    same_bytes(&plain, &data, "a GET whose fill found no room");
    assert_eq!(in_process(&["outcome=\"no_memory\""]) - no_memory, 1);
    drop(taken);
    settles_at(0, "nothing kept while the budget was held");
    let before = upstream_gets(&up_metrics);
    get("after the budget came back");
    settles_at(data.len() as u64, "kept once there was room");
    assert_eq!(
        upstream_gets(&up_metrics) - before,
        1,
        "nothing had been kept: the store was asked again"
    );

    // The cache may not take the room of the last transfer: 24 MiB of
    // budget, 4 buffers of 1 MiB per transfer, a 21 MiB cache.
    let settings = hipobj::gateway::cache::Settings {
        bytes: 21 << 20,
        max_object_bytes: 1 << 20,
        validate: hipobj::gateway::cache::Validate::Always,
        disk: None,
    };
    let local = hipobj::gateway::local::Local::open(&gateway::Gateway::fresh_root()).unwrap();
    let refused = hipobj::gateway::cache::Cached::new(Arc::new(local), settings, Some(room))
        .err()
        .expect("a cache that leaves no room for a transfer is refused");
    assert!(
        refused.contains("raise --rdma-memory-bytes to 26214400 or more"),
        "{refused}"
    );
}

#[test]
fn rdma_gets_through_the_cache_land_byte_exact_the_store_asked_once() {
    let (up, up_metrics) = counted_upstream();
    let world = hipobj_testing::world::World::new();
    let gw = gateway_in_front(
        &world,
        &up.endpoint,
        &["--cache-bytes", "67108864", "--cache-validate", "ttl=3600"],
    );
    let data = pattern(5 << 20, 21);
    runtime().block_on(async { put(&client(&gw.endpoint), "weights", &data).await });
    let before = upstream_gets(&up_metrics);
    // This process's metrics: the gateway runs in it.
    let in_process = |name: &str| metric_in(&hipobj::gateway::metrics::render(None), name, &[]);
    let (in_place, registered) = (
        in_process("hipobj_s3_cache_rdma_in_place_bytes_total"),
        in_process("hipobj_s3_cache_registered_bytes"),
    );
    let client = rdma_client(&world);
    let s3 = gateway_s3(&gw);
    // The miss (its bytes as they come from the store), then two hits: the
    // whole object, and a range whose CRC64/NVME is computed in place.
    for range in [0..data.len(), 0..data.len(), 4096..(3 << 20)] {
        same_bytes(
            &rdma_get(&client, &s3, "weights", range.clone()),
            &data[range],
            "an RDMA GET through the cache",
        );
    }
    assert_eq!(
        upstream_gets(&up_metrics) - before,
        1,
        "one GET reached the store"
    );
    assert_eq!(
        in_process("hipobj_s3_cache_rdma_in_place_bytes_total") - in_place,
        (data.len() + (3 << 20) - 4096) as u64,
        "the hits were WRITTEN from the cache's own memory, not copied"
    );
    assert_eq!(
        in_process("hipobj_s3_cache_registered_bytes") - registered,
        data.len() as u64,
        "the entry registered once, for both hits"
    );
}
