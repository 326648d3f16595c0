//! The gateway in front of a real S3 store that a script started around the
//! test binary: what every store's lane checks (this module's test bodies,
//! made `#[test]`s by [`store_tests!`]) and what they share. Each store's
//! own file (`tests/gateway_garage.rs`: Garage's three nodes,
//! `scripts/garage-test.sh`; `tests/gateway_seaweedfs.rs`: SeaweedFS's
//! cluster, `scripts/seaweedfs-test.sh`) names its store and adds what only
//! that store does (a node lost with a quorum left, say).
//!
//! The tests expect S3's behaviour, never one store's: where a store does
//! not give it, the test fails, and the store's own file (and
//! `docs/deploy.md`) says so.
//!
//! The gateway is `hipobj::gateway` in this process (`--upstream`), its
//! RDMA on the fake fabric's server device; the client is the Rust API on
//! the fake fabric's client device, or the AWS SDK over plain HTTP. What
//! reached the store is read from the store directly. A TCP relay between
//! the gateway and the store that flips one byte or pauses shows the
//! checks and the time-outs of the middle hop; the store's processes are
//! stopped (SIGSTOP) through their process ids.
//!
//! Without the store's settings in the environment the tests fail, saying
//! how to run them: they never pass by skipping.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use hipobj::client::{Buffer, Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::objects::{self, Object, Path as Via, Plan, Policy, Rdma, Verified};
use hipobj::s3::{Checksum, Credentials, Request, S3Config, S3Error, S3};
use hipobj_testing::world::World;

use crate::gateway;
use crate::s3server::{ACCESS_KEY, SECRET_KEY};

/// Verified, without the fallback: every byte goes by RDMA or not at all.
pub const NO_FALLBACK: Policy = Policy {
    fallback: false,
    verify: true,
};

/// What a store's lane is: how its tests find the store.
pub struct Lane {
    /// The store's name, for messages ("Garage", "SeaweedFS").
    pub name: &'static str,
    /// Its settings are `HIPOBJ_<prefix>_...`.
    pub prefix: &'static str,
    /// The script that starts it around the tests.
    pub script: &'static str,
    /// Its processes' pid files, relative to its directory.
    pub pid_files: &'static [&'static str],
    /// The large object's size in MiB unless `HIPOBJ_<prefix>_BIG_MIB`
    /// says otherwise.
    pub big_mib: usize,
}

/// A store the script started: its settings, from the environment.
pub struct Store {
    /// Its name, for messages.
    pub name: &'static str,
    /// Its S3 endpoint, `http://IP:PORT`.
    pub endpoint: String,
    /// The region it signs in.
    pub region: String,
    /// A bucket the key may read and write.
    pub bucket: String,
    /// The script's directory of the store's processes.
    pub dir: PathBuf,
    pub key: String,
    pub secret: String,
    lane: &'static Lane,
}

/// The variable `name` of the script's environment; `script` runs the
/// tests with it.
fn env(name: &str, script: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests need the store that {script} starts around \
             them; run them with `bash {script}`"
        )
    })
}

impl Store {
    /// The store of `lane`, whose settings are `HIPOBJ_<prefix>_ENDPOINT`,
    /// `_REGION`, `_BUCKET`, `_DIR` and the key in `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` (what the gateway signs with too).
    pub fn from_env(lane: &'static Lane) -> Store {
        let var = |suffix: &str| env(&format!("HIPOBJ_{}_{suffix}", lane.prefix), lane.script);
        Store {
            name: lane.name,
            endpoint: var("ENDPOINT"),
            region: var("REGION"),
            bucket: var("BUCKET"),
            dir: PathBuf::from(var("DIR")),
            key: env("AWS_ACCESS_KEY_ID", lane.script),
            secret: env("AWS_SECRET_ACCESS_KEY", lane.script),
            lane,
        }
    }

    /// `HIPOBJ_<PREFIX>_<suffix>` parsed, or `default`.
    pub fn setting<T: std::str::FromStr>(&self, suffix: &str, default: T) -> T {
        let name = format!("HIPOBJ_{}_{suffix}", self.lane.prefix);
        match std::env::var(&name) {
            Ok(value) => value
                .parse()
                .unwrap_or_else(|_| panic!("{name}={value:?} is not a valid value")),
            Err(_) => default,
        }
    }

    /// A client of the store itself, with its key.
    pub fn direct(&self) -> S3 {
        self.direct_at(&self.endpoint)
    }

    pub fn direct_at(&self, endpoint: &str) -> S3 {
        s3_at(endpoint, &self.region, &self.key, &self.secret)
    }

    /// The gateway's options for this store, then `extra`.
    pub fn options<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["--upstream-region", &self.region];
        args.extend_from_slice(extra);
        args
    }

    /// A gateway in front of the store at `endpoint` (the store's own, or
    /// a relay's), with `extra` options, its RDMA on `world`.
    pub fn gateway(&self, world: &World, endpoint: &str, extra: &[&str]) -> gateway::Gateway {
        gateway::Gateway::upstream(world, endpoint, &self.options(extra))
    }

    /// The process id in pid file `file`.
    pub fn pid(&self, file: &str) -> String {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    /// Sends `signal` (STOP or CONT) to every process of the store.
    pub fn signal_all(&self, signal: &str) {
        for file in self.lane.pid_files {
            let pid = self.pid(file);
            let status = Command::new("kill")
                .args([&format!("-{signal}"), &pid])
                .status()
                .expect("kill");
            assert!(status.success(), "kill -{signal} {pid} ({file})");
        }
    }

    /// Whether the store holds `key` (a HEAD straight to it).
    pub fn holds(&self, key: &str) -> bool {
        match self.direct().head(&self.bucket, key) {
            Ok(_) => true,
            Err(S3Error::Status { status: 404, .. }) => false,
            Err(e) => panic!("HEAD {key} at {}: {e}", self.name),
        }
    }

    /// `key`'s bytes, straight from the store.
    pub fn read(&self, key: &str, len: usize) -> Vec<u8> {
        let s3 = self.direct();
        let mut out = vec![0u8; len];
        objects::get_http(
            Object::new(&s3, &self.bucket, key),
            0..len as u64,
            &mut out,
            true,
        )
        .unwrap_or_else(|e| panic!("GET {key} at {}: {e}", self.name));
        out
    }

    /// The CRC64/NVME the store keeps with `key`: a HEAD straight to it
    /// with `x-amz-checksum-mode: ENABLED`.
    pub fn kept_crc64nvme(&self, key: &str) -> Option<String> {
        let mut head = Request::new("HEAD", &self.bucket, Some(key));
        head.headers
            .push(("x-amz-checksum-mode", "ENABLED".to_owned()));
        let answer = self
            .direct()
            .send(&head)
            .and_then(|r| r.success())
            .unwrap_or_else(|e| panic!("HEAD {key} at {}: {e}", self.name));
        answer.header("x-amz-checksum-crc64nvme").map(str::to_owned)
    }

    /// Deletes `key` at the store.
    pub fn delete(&self, key: &str) {
        self.direct()
            .send(&Request::new("DELETE", &self.bucket, Some(key)))
            .and_then(|r| r.success())
            .unwrap_or_else(|e| panic!("DELETE {key} at {}: {e}", self.name));
    }
}

/// The built-in S3 client of `endpoint`.
pub fn s3_at(endpoint: &str, region: &str, key: &str, secret: &str) -> S3 {
    S3::new(S3Config {
        endpoint: endpoint.to_owned(),
        region: region.to_owned(),
        credentials: Credentials {
            access_key_id: key.to_owned(),
            secret_access_key: secret.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap()
}

/// A client of the gateway with the test keys.
pub fn via(gateway: &gateway::Gateway) -> S3 {
    s3_at(&gateway.endpoint, "us-east-1", ACCESS_KEY, SECRET_KEY)
}

/// An AWS SDK client of the gateway with the test keys, as an application
/// has one: no retries (every answer is the gateway's first), checksums
/// only where asked.
pub fn sdk(gateway: &gateway::Gateway) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&gateway.endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            ACCESS_KEY, SECRET_KEY, None, None, "test",
        ))
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A client of the library on the fake fabric; a token lives as long as a
/// transfer through the store may take.
pub fn client(world: &World) -> Client {
    Client::builder()
        .platform(world.platform())
        .gpu(GpuSelect::None)
        .options(Options {
            token_timeout: Duration::from_secs(900),
            ..Options::default()
        })
        .build()
        .unwrap()
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[2]).wrapping_add(seed))
        .collect()
}

/// A key no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Waits up to two minutes for `done`.
pub fn wait_until(done: impl Fn() -> bool, what: &str) {
    let end = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < end, "{what}: not within two minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `#[test]`s every store's lane runs: one per test body of this
/// module, on the store `$store()` gives. The module must be `store` at the
/// test crate's root.
macro_rules! store_tests {
    ($store:path) => {
        $crate::store::store_tests!(
            $store:
            gets_ranges_puts_and_multipart_go_by_rdma_through_the_gateway_byte_exact,
            a_checksum_mismatch_is_refused_at_each_hop_and_nothing_is_stored,
            the_store_keeps_the_crc64nvme_of_a_put_through_the_gateway,
            plain_requests_through_the_gateway_keep_s3_s_semantics,
            a_store_that_pauses_longer_than_the_rdma_timeout_is_waited_for,
            a_large_object_streams_through_the_gateway_both_ways,
            a_stalled_store_fails_transfers_within_the_time_out_and_serves_again_after,
        );
    };
    ($store:path: $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                $crate::store::$test(&$store());
            }
        )*
    };
}
pub(crate) use store_tests;

pub fn gets_ranges_puts_and_multipart_go_by_rdma_through_the_gateway_byte_exact(store: &Store) {
    let world = World::new();
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = store.bucket.as_str();

    // PUT by RDMA: the store holds the bytes.
    let key = unique("put");
    let data = pattern((5 << 20) + 77, 1);
    let mut buf = client.register_host(data.clone()).unwrap();
    let object = Object::new(&s3, bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert!(store.read(&key, data.len()) == data, "the store's copy");

    // GET by RDMA, whole (checked against the gateway's CRC) and a range.
    buf.as_mut_slice().unwrap().fill(0);
    let all = 0..data.len() as u64;
    let object = Object::new(&s3, bucket, &key);
    let moved = objects::get(&client, object, all, &mut buf, 0, NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert!(buf.as_slice().unwrap() == data);
    let object = Object::new(&s3, bucket, &key);
    let (a, b) = (1_234_567usize, 3_456_789usize);
    let range = a as u64..b as u64;
    let moved = objects::get(&client, object, range, &mut buf, 9, NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap()[9..9 + b - a] == data[a..b]);

    // An object the store was given directly, with its CRC64/NVME, read by
    // RDMA through the gateway (which checks it on the way).
    let direct = unique("direct");
    let other = pattern(3 << 20, 2);
    let store_s3 = store.direct();
    objects::put_http(Object::new(&store_s3, bucket, &direct), &other, true).unwrap();
    let object = Object::new(&s3, bucket, &direct);
    let moved = objects::get(
        &client,
        object,
        0..other.len() as u64,
        &mut buf,
        0,
        NO_FALLBACK,
    )
    .unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap()[..other.len()] == other[..]);

    // A multipart upload by RDMA, its parts UploadParts into the client's
    // own upload at the store.
    let parts = unique("parts");
    let big = pattern((11 << 20) + 5, 3);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 2,
        fallback: false,
        ..Plan::default()
    };
    let source = |offset: u64, out: &mut [u8]| {
        let at = usize::try_from(offset).unwrap();
        out.copy_from_slice(&big[at..at + out.len()]);
        Ok(())
    };
    let object = Object::new(&s3, bucket, &parts);
    let len = big.len() as u64;
    let summary = objects::upload(Rdma::On(&client), object, len, &plan, &source, &|_| {}).unwrap();
    assert!(summary.all_verified(), "{summary:?}");
    assert!(store.read(&parts, big.len()) == big, "the store's copy");
}

pub fn a_checksum_mismatch_is_refused_at_each_hop_and_nothing_is_stored(store: &Store) {
    let world = World::new();
    let client = client(&world);
    let bucket = store.bucket.as_str();
    let data = pattern(1 << 20, 4);
    let buf = client.register_host(data.clone()).unwrap();

    // The client's hop: a CRC of other bytes than those the gateway READs.
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let s3 = via(&gateway);
    let key = unique("bad-client");
    let mut request = objects::RdmaRequest::new(Object::new(&s3, bucket, &key), objects::Op::Put)
        .with_checksum(Checksum::crc64nvme(&data[1..]));
    match client.put(&buf, 0..data.len(), &mut request) {
        Err(hipobj::client::ClientError::Declined { status: 400 }) => {}
        other => panic!("{other:?}"),
    }
    let text = request.response().unwrap().text(64 << 10).unwrap();
    assert!(text.contains("<Code>BadDigest</Code>"), "{text}");
    assert!(!store.holds(&key), "nothing stored");

    // The gateway's hop to the store: a relay flips a byte of the PUT's
    // body on its way; the store checks the client's CRC (which the
    // gateway forwards) and refuses it.
    let to_store = Relay::start(&store.endpoint, Fault::Flip(Way::Up, 300 << 10));
    let gateway = store.gateway(&world, &to_store.url(), &[]);
    let s3 = via(&gateway);
    let key = unique("bad-upstream-put");
    let object = Object::new(&s3, bucket, &key);
    let e = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK)
        .expect_err("a PUT whose bytes changed on the way to the store");
    eprintln!("refused on the way to {}: {e}", store.name);
    assert!(to_store.done() >= 1, "the relay changed a byte");
    assert!(!store.holds(&key), "nothing stored");

    // The store's hop back: a relay flips a byte of a GET's body; the
    // gateway checks the object's stored checksum and fails the transfer.
    let key = unique("bad-upstream-get");
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let s3 = via(&gateway);
    let object = Object::new(&s3, bucket, &key);
    objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();
    let from_store = Relay::start(&store.endpoint, Fault::Flip(Way::Down, 300 << 10));
    let gateway = store.gateway(&world, &from_store.url(), &[]);
    let s3 = via(&gateway);
    let mut into = client.host_buffer(data.len()).unwrap();
    let object = Object::new(&s3, bucket, &key);
    let e = objects::get(
        &client,
        object,
        0..data.len() as u64,
        &mut into,
        0,
        NO_FALLBACK,
    )
    .expect_err("a GET whose bytes changed on the way from the store");
    let text = e.to_string();
    eprintln!("refused on the way from {}: {text}", store.name);
    assert!(from_store.done() >= 1, "the relay changed a byte");
    assert!(
        text.contains("do not match its x-amz-checksum-crc64nvme"),
        "{text}"
    );
}

/// The CRC64/NVME a client sends with a PUT through the gateway (by RDMA,
/// and plain) is kept by the store with the object: a HEAD straight to
/// the store with checksum mode answers it, so a later GET can be checked.
pub fn the_store_keeps_the_crc64nvme_of_a_put_through_the_gateway(store: &Store) {
    let world = World::new();
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let s3 = via(&gateway);
    let client = client(&world);
    let data = pattern((1 << 20) + 3, 17);
    let crc = Checksum::crc64nvme(&data).encode();
    let key = unique("kept-rdma");
    let buf = client.register_host(data.clone()).unwrap();
    let object = Object::new(&s3, &store.bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(store.kept_crc64nvme(&key), Some(crc.clone()), "by RDMA");

    let key = unique("kept-plain");
    let object = Object::new(&s3, &store.bucket, &key);
    objects::put_http(object, &data, true).unwrap();
    assert_eq!(store.kept_crc64nvme(&key), Some(crc), "plain");
}

/// What an application's AWS SDK asks of S3 goes through the gateway to
/// the store and back with S3's answers: a PutObject's ETag is its body's
/// MD5, HEAD and GET agree with it, ranges and conditions hold, listings,
/// copies, a multipart upload and its listing, the bucket's versioning
/// and location, deletes; a wrong checksum is refused with nothing stored. (Tags are
/// each store's file's: not every store keeps them.)
pub fn plain_requests_through_the_gateway_keep_s3_s_semantics(store: &Store) {
    use s3s::crypto::{Checksum as _, Md5};
    let world = World::new();
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let c = sdk(&gateway);
    let bucket = store.bucket.as_str();
    let prefix = unique("plain");
    let key = format!("{prefix}/object");
    let data = pattern((2 << 20) + 11, 18);
    let md5 = Md5::checksum(&data);
    let etag = format!("\"{}\"", hex::encode(md5));
    runtime().block_on(async {
        let put = c
            .put_object()
            .bucket(bucket)
            .key(&key)
            .content_md5(base64_of(&md5))
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("PutObject: {e:?}"));
        assert_eq!(
            put.e_tag(),
            Some(etag.as_str()),
            "PutObject's ETag: the MD5"
        );

        let head = c
            .head_object()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("HeadObject: {e:?}"));
        let len = i64::try_from(data.len()).unwrap();
        assert_eq!(head.content_length(), Some(len));
        assert_eq!(head.e_tag(), Some(etag.as_str()));
        assert!(head.last_modified().is_some(), "HeadObject's Last-Modified");

        let got = c
            .get_object()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetObject: {e:?}"));
        assert_eq!(got.e_tag(), Some(etag.as_str()));
        assert!(got.body.collect().await.unwrap().to_vec() == data);
        let ranged = c
            .get_object()
            .bucket(bucket)
            .key(&key)
            .range("bytes=1000-1999")
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetObject of a range: {e:?}"));
        assert_eq!(
            ranged.content_range(),
            Some(format!("bytes 1000-1999/{}", data.len()).as_str())
        );
        assert!(ranged.body.collect().await.unwrap().to_vec() == data[1000..2000]);

        let e = c
            .get_object()
            .bucket(bucket)
            .key(&key)
            .if_none_match(&etag)
            .send()
            .await
            .expect_err("If-None-Match its own ETag");
        assert_eq!(sdk_status(&e), Some(304), "{e:?}");
        let e = c
            .get_object()
            .bucket(bucket)
            .key(&key)
            .if_match("\"0123456789abcdef0123456789abcdef\"")
            .send()
            .await
            .expect_err("If-Match another ETag");
        assert_eq!(sdk_status(&e), Some(412), "{e:?}");
        let e = c
            .get_object()
            .bucket(bucket)
            .key(format!("{prefix}/missing"))
            .send()
            .await
            .expect_err("a missing key");
        assert_eq!(
            (sdk_status(&e), e.code()),
            (Some(404), Some("NoSuchKey")),
            "{e:?}"
        );

        // A checksum that is not the body's: refused, nothing stored.
        let bad = format!("{prefix}/bad");
        let e = c
            .put_object()
            .bucket(bucket)
            .key(&bad)
            .checksum_crc64_nvme(Checksum::crc64nvme(b"other bytes").encode())
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .expect_err("a wrong CRC64NVME");
        assert_eq!(
            (sdk_status(&e), e.code()),
            (Some(400), Some("BadDigest")),
            "{e:?}"
        );

        let copy = format!("{prefix}/copy");
        c.copy_object()
            .bucket(bucket)
            .key(&copy)
            .copy_source(format!("{bucket}/{key}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("CopyObject: {e:?}"));

        // A multipart upload, listed while in progress.
        let multi = format!("{prefix}/multi");
        let parts = [pattern(5 << 20, 19), pattern(70_001, 20)];
        let created = c
            .create_multipart_upload()
            .bucket(bucket)
            .key(&multi)
            .send()
            .await
            .unwrap_or_else(|e| panic!("CreateMultipartUpload: {e:?}"));
        let id = created.upload_id().expect("an upload id").to_owned();
        let mut done = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let n = i32::try_from(i + 1).unwrap();
            let out = c
                .upload_part()
                .bucket(bucket)
                .key(&multi)
                .upload_id(&id)
                .part_number(n)
                .body(ByteStream::from(part.clone()))
                .send()
                .await
                .unwrap_or_else(|e| panic!("UploadPart {n}: {e:?}"));
            done.push(
                CompletedPart::builder()
                    .part_number(n)
                    .e_tag(out.e_tag().expect("a part's ETag"))
                    .build(),
            );
        }
        let listed = c
            .list_parts()
            .bucket(bucket)
            .key(&multi)
            .upload_id(&id)
            .send()
            .await
            .unwrap_or_else(|e| panic!("ListParts: {e:?}"));
        let mut numbers: Vec<_> = listed
            .parts()
            .iter()
            .filter_map(|p| p.part_number())
            .collect();
        numbers.sort_unstable();
        assert_eq!(numbers, [1, 2], "ListParts");
        let uploads = c
            .list_multipart_uploads()
            .bucket(bucket)
            .prefix(&prefix)
            .send()
            .await
            .unwrap_or_else(|e| panic!("ListMultipartUploads: {e:?}"));
        let ids: Vec<_> = uploads
            .uploads()
            .iter()
            .filter_map(|u| u.upload_id())
            .collect();
        assert_eq!(ids, [id.as_str()], "ListMultipartUploads");
        let completed = c
            .complete_multipart_upload()
            .bucket(bucket)
            .key(&multi)
            .upload_id(&id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(done))
                    .build(),
            )
            .send()
            .await
            .unwrap_or_else(|e| panic!("CompleteMultipartUpload: {e:?}"));
        assert!(
            completed.e_tag().is_some_and(|t| t.ends_with("-2\"")),
            "a multipart upload's ETag: {:?}",
            completed.e_tag()
        );
        let got = c
            .get_object()
            .bucket(bucket)
            .key(&multi)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetObject of the upload: {e:?}"));
        assert!(got.body.collect().await.unwrap().to_vec() == parts.concat());

        let listed = c
            .list_objects_v2()
            .bucket(bucket)
            .prefix(format!("{prefix}/"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("ListObjectsV2: {e:?}"));
        let keys: Vec<_> = listed.contents().iter().filter_map(|o| o.key()).collect();
        assert_eq!(keys, [copy.as_str(), multi.as_str(), key.as_str()]);
        let sizes: Vec<_> = listed.contents().iter().filter_map(|o| o.size()).collect();
        let multi_len = i64::try_from(parts.concat().len()).unwrap();
        assert_eq!(sizes, [len, multi_len, len]);

        c.get_bucket_versioning()
            .bucket(bucket)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetBucketVersioning: {e:?}"));
        // The region the gateway's clients sign for (us-east-1: an empty
        // constraint, as S3 says it), whatever the store's own.
        let location = c
            .get_bucket_location()
            .bucket(bucket)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetBucketLocation: {e:?}"));
        let constraint = location.location_constraint().map(|c| c.as_str());
        assert_eq!(
            constraint.unwrap_or_default(),
            "",
            "GetBucketLocation: {constraint:?}"
        );

        c.delete_object()
            .bucket(bucket)
            .key(&copy)
            .send()
            .await
            .unwrap_or_else(|e| panic!("DeleteObject: {e:?}"));
        let deleted = c
            .delete_objects()
            .bucket(bucket)
            .delete(
                aws_sdk_s3::types::Delete::builder()
                    .objects(
                        aws_sdk_s3::types::ObjectIdentifier::builder()
                            .key(&key)
                            .build()
                            .unwrap(),
                    )
                    .objects(
                        aws_sdk_s3::types::ObjectIdentifier::builder()
                            .key(&multi)
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap_or_else(|e| panic!("DeleteObjects: {e:?}"));
        assert!(deleted.errors().is_empty(), "{:?}", deleted.errors());
        // Gone, as a HEAD of each key says (a listing right after a delete
        // is not what this checks: Garage once listed a deleted object
        // with a node just restarted, docs/reliability.md).
        for gone in [&copy, &key, &multi] {
            let e = c
                .head_object()
                .bucket(bucket)
                .key(gone)
                .send()
                .await
                .expect_err("a deleted key");
            assert_eq!(sdk_status(&e), Some(404), "HEAD {gone}: {e:?}");
        }
    });
    assert!(!store.holds(&format!("{prefix}/bad")), "nothing stored");
}

/// PutObjectTagging then GetObjectTagging of a new object through the
/// gateway, plain: the tags the store gives back, or the failure of the
/// first that failed (its status, code and message).
pub fn tags_through_the_gateway(
    store: &Store,
) -> Result<Vec<(String, String)>, (u16, String, String)> {
    let world = World::new();
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let c = sdk(&gateway);
    let key = unique("tagged");
    let failed = |e: &dyn ProvideErrorMetadata, status: Option<u16>| {
        (
            status.unwrap_or_default(),
            e.code().unwrap_or_default().to_owned(),
            e.message().unwrap_or_default().to_owned(),
        )
    };
    runtime().block_on(async {
        c.put_object()
            .bucket(&store.bucket)
            .key(&key)
            .body(ByteStream::from_static(b"tagged"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("PutObject: {e:?}"));
        let tag = aws_sdk_s3::types::Tag::builder()
            .key("model")
            .value("llm")
            .build()
            .unwrap();
        c.put_object_tagging()
            .bucket(&store.bucket)
            .key(&key)
            .tagging(
                aws_sdk_s3::types::Tagging::builder()
                    .tag_set(tag)
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .map_err(|e| failed(&e, sdk_status(&e)))?;
        let tags = c
            .get_object_tagging()
            .bucket(&store.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| failed(&e, sdk_status(&e)))?;
        Ok(tags
            .tag_set()
            .iter()
            .map(|t| (t.key().to_owned(), t.value().to_owned()))
            .collect())
    })
}

/// A store that pauses for longer than `--rdma-timeout-ms` (but less than
/// `--upstream-timeout-ms`) in the middle of a PUT's body or of a GET's
/// answer is waited for: the RDMA time-out bounds what the client does, not
/// what the store does, so both transfers complete byte for byte.
pub fn a_store_that_pauses_longer_than_the_rdma_timeout_is_waited_for(store: &Store) {
    let world = World::new();
    let client = client(&world);
    let bucket = store.bucket.as_str();
    // More than the sockets on the way hold, so that the pause reaches
    // the gateway; chunks of 1 MiB, three held, 1 s of RDMA time-out each.
    let data = pattern(24 << 20, 6);
    let crc = Checksum::crc64nvme(&data);
    let mut buf = client.register_host(data).unwrap();
    let pause = Duration::from_millis(2500);
    let options = [
        "--rdma-timeout-ms",
        "1000",
        "--rdma-chunk-bytes",
        "1048576",
        "--rdma-chunks",
        "3",
        "--upstream-timeout-ms",
        "20000",
    ];
    let key = unique("paused");
    let to_store = Relay::start(&store.endpoint, Fault::Pause(Way::Up, 2 << 20, pause));
    let gateway = store.gateway(&world, &to_store.url(), &options);
    let s3 = via(&gateway);
    let start = Instant::now();
    let object = Object::new(&s3, bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..buf.len(), NO_FALLBACK)
        .expect("a PUT whose store pauses");
    eprintln!(
        "PUT with {} paused {pause:?}: {:?}",
        store.name,
        start.elapsed()
    );
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(to_store.done(), 1, "the store paused in the PUT's body");
    assert_eq!(Checksum::crc64nvme(&store.read(&key, buf.len())), crc);

    let from_store = Relay::start(&store.endpoint, Fault::Pause(Way::Down, 2 << 20, pause));
    let gateway = store.gateway(&world, &from_store.url(), &options);
    let s3 = via(&gateway);
    buf.as_mut_slice().unwrap().fill(0);
    let start = Instant::now();
    let object = Object::new(&s3, bucket, &key);
    let moved = objects::get(
        &client,
        object,
        0..buf.len() as u64,
        &mut buf,
        0,
        NO_FALLBACK,
    )
    .expect("a GET whose store pauses");
    eprintln!(
        "GET with {} paused {pause:?}: {:?}",
        store.name,
        start.elapsed()
    );
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert!(
        from_store.done() >= 1,
        "the store paused in the GET's answer"
    );
    assert_eq!(Checksum::crc64nvme(buf.as_slice().unwrap()), crc);
}

/// An object of `HIPOBJ_<PREFIX>_BIG_MIB` MiB (the lane's size by
/// default) by RDMA both ways, byte for byte.
pub fn a_large_object_streams_through_the_gateway_both_ways(store: &Store) {
    let mib: usize = store.setting("BIG_MIB", store.lane.big_mib);
    let world = World::new();
    let gateway = store.gateway(&world, &store.endpoint, &[]);
    let s3 = via(&gateway);
    let client = client(&world);
    let key = unique("large");
    let len = mib << 20;
    let mut data = vec![0u8; len];
    for (i, block) in data.chunks_mut(1 << 20).enumerate() {
        block.copy_from_slice(&pattern(block.len(), i.to_le_bytes()[0]));
    }
    let crc = Checksum::crc64nvme(&data);
    let mut buf = client.register_host(data).unwrap();
    let start = Instant::now();
    let object = Object::new(&s3, &store.bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..len, NO_FALLBACK).unwrap();
    let put = start.elapsed();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    buf.as_mut_slice().unwrap().fill(0);
    let start = Instant::now();
    let object = Object::new(&s3, &store.bucket, &key);
    let moved = objects::get(&client, object, 0..len as u64, &mut buf, 0, NO_FALLBACK).unwrap();
    let get = start.elapsed();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert_eq!(
        Checksum::crc64nvme(buf.as_slice().unwrap()),
        crc,
        "byte for byte"
    );
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();
    eprintln!(
        "{mib} MiB through the gateway into {}: PUT {:.1} s ({:.1} MiB/s), GET {:.1} s \
         ({:.1} MiB/s)",
        store.name,
        put.as_secs_f64(),
        rate(put),
        get.as_secs_f64(),
        rate(get)
    );
    store.delete(&key);
}

/// Every process of the store stopped (SIGSTOP): the gateway's time-out
/// ends a transfer with 503 within it, and once they run again the same
/// gateway serves the object.
pub fn a_stalled_store_fails_transfers_within_the_time_out_and_serves_again_after(store: &Store) {
    let world = World::new();
    let gateway = store.gateway(&world, &store.endpoint, &["--upstream-timeout-ms", "3000"]);
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = store.bucket.as_str();
    let key = unique("stall");
    let data = pattern(1 << 20, 6);
    let mut buf = client.register_host(data.clone()).unwrap();
    let object = Object::new(&s3, bucket, &key);
    objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();

    store.signal_all("STOP");
    let start = Instant::now();
    let object = Object::new(&s3, bucket, &key);
    let outcome = objects::get(
        &client,
        object,
        0..data.len() as u64,
        &mut buf,
        0,
        NO_FALLBACK,
    );
    let took = start.elapsed();
    store.signal_all("CONT");
    let e = outcome.expect_err("a GET from a stalled store");
    eprintln!("stalled {}, after {took:?}: {e}", store.name);
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(e.to_string().contains("503"), "{e}");

    reads_back(&client, Object::new(&s3, bucket, &key), &mut buf, &data);
}

/// GETs `object` whole by RDMA into `buf` and checks that it is `data`.
pub fn reads_back(client: &Client, object: Object<'_>, buf: &mut Buffer, data: &[u8]) {
    let what = format!("GET {}", object.key);
    objects::get(client, object, 0..data.len() as u64, buf, 0, NO_FALLBACK)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        buf.as_slice().unwrap()[..data.len()] == *data,
        "{what}: byte for byte"
    );
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// What a [`Relay`] does to each connection's stream, one way, at one
/// offset.
#[derive(Clone, Copy)]
pub enum Fault {
    /// Flips the byte at this offset.
    Flip(Way, u64),
    /// Stops passing bytes at this offset for a while, as a store that
    /// pauses (a collection, a compaction, a slow disk).
    Pause(Way, u64, Duration),
}

/// Which way: what the gateway sends (`Up`) or what the store answers.
#[derive(Clone, Copy, PartialEq)]
pub enum Way {
    Up,
    Down,
}

impl Fault {
    fn way(self) -> Way {
        match self {
            Fault::Flip(way, _) | Fault::Pause(way, ..) => way,
        }
    }
}

/// A TCP relay in front of the store that does its [`Fault`] to each
/// connection.
pub struct Relay {
    addr: SocketAddr,
    /// How many times the fault was done.
    done: Arc<AtomicUsize>,
}

impl Relay {
    pub fn start(endpoint: &str, fault: Fault) -> Relay {
        let target: SocketAddr = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("the store's endpoint is http://IP:PORT");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let counted = done.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(down) = conn else { return };
                let Ok(up) = TcpStream::connect(target) else {
                    continue;
                };
                let (up2, down2) = (up.try_clone().unwrap(), down.try_clone().unwrap());
                let on = move |way| (fault.way() == way).then_some(fault);
                let (c1, c2) = (counted.clone(), counted.clone());
                std::thread::spawn(move || pump(down, up, on(Way::Up), &c1));
                std::thread::spawn(move || pump(up2, down2, on(Way::Down), &c2));
            }
        });
        Relay { addr, done }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn done(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to`, doing `fault` on the way.
fn pump(mut from: TcpStream, mut to: TcpStream, fault: Option<Fault>, done: &AtomicUsize) {
    let mut offset = 0u64;
    let mut block = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut block) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let here = offset..offset + n as u64;
        match fault {
            Some(Fault::Flip(_, at)) if here.contains(&at) => {
                block[usize::try_from(at - offset).unwrap()] ^= 0x01;
                done.fetch_add(1, Ordering::SeqCst);
            }
            Some(Fault::Pause(_, at, pause)) if here.contains(&at) => {
                std::thread::sleep(pause);
                done.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        offset += n as u64;
        if to.write_all(&block[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// An SDK error's status, for a message.
pub fn sdk_status<E: ProvideErrorMetadata>(e: &SdkError<E>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}
