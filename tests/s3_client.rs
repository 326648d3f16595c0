//! The built-in S3 client (`hipobj::s3`) against the RDMA S3 server over
//! real HTTP, with a client of the library on the fake platform. This host
//! has no RDMA device, so the server declines every token (`rdma: off`):
//! these tests cover signing, the plain requests, multipart, and the
//! fallback of each transfer (the RDMA path of the same calls runs in the
//! Soft-RoCE lane, `tests/e2e.rs`).

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/http.rs"]
mod http;
#[path = "common/s3.rs"]
mod s3server;

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hipobj::client::{Buffer, Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::objects::{
    self, Moved, Object, Path as Via, Plan, Policy, Rdma, TransferError, Unchecked, Verified,
};
use hipobj::s3::{Checksum, Credentials, S3Config, S3Error, S3};
use hipobj::server::Op;
use hipobj_testing::world::{Behaviour, World};
use parking_lot::Mutex;
use s3server::{S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};

fn server() -> S3Server {
    let server = S3Server::start(
        Path::new(env!("CARGO_BIN_EXE_hipobj-s3-server")),
        "127.0.0.1",
        &[],
    );
    assert!(
        !server.rdma,
        "this host has no RDMA device: {}",
        server.banner
    );
    server
}

fn s3(server: &S3Server, secret: &str) -> S3 {
    s3_with(&server.endpoint, secret)
}

/// A client of `endpoint` with the test access key and `secret`.
fn s3_with(endpoint: &str, secret: &str) -> S3 {
    S3::new(S3Config {
        endpoint: endpoint.to_owned(),
        region: "us-east-1".to_owned(),
        credentials: Credentials {
            access_key_id: ACCESS_KEY.to_owned(),
            secret_access_key: secret.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap()
}

fn client(world: &World, gpu: GpuSelect) -> Client {
    Client::builder()
        .platform(world.platform())
        .gpu(gpu)
        .options(Options {
            completion_timeout: Duration::from_millis(500),
            ..Options::default()
        })
        .build()
        .unwrap()
}

/// Verified, without the fallback.
const NO_FALLBACK: Policy = Policy {
    fallback: false,
    verify: true,
};

fn obj<'a>(s3: &'a S3, key: &'a str) -> Object<'a> {
    Object::new(s3, BUCKET, key)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[1]).wrapping_add(seed))
        .collect()
}

/// `x-amz-checksum-crc64nvme` of `bytes`, as S3 writes it.
fn crc(bytes: &[u8]) -> String {
    Checksum::crc64nvme(bytes).encode()
}

fn stored(server: &S3Server, key: &str) -> Vec<u8> {
    std::fs::read(server.root().join(BUCKET).join(key)).unwrap()
}

/// An upload's source that reads `data`: each chunk, the bytes at its
/// offset.
fn source_of(data: &[u8]) -> impl Fn(u64, &mut [u8]) -> std::io::Result<()> + Sync + '_ {
    move |offset, out| {
        let at = usize::try_from(offset).unwrap();
        out.copy_from_slice(&data[at..at + out.len()]);
        Ok(())
    }
}

/// `objects::get` of `range` of `object` into the start of `buf`, with
/// the default policy (verified, falling back on a decline): the GET most
/// tests make.
fn get_default(
    client: &Client,
    object: Object<'_>,
    range: Range<u64>,
    buf: &mut Buffer,
) -> Result<Moved, TransferError> {
    objects::get(client, object, range, buf, 0, Policy::default())
}

/// What the tests against the S3 server start from: the server, an S3
/// client of it with the test keys, and a library client on a fresh fake
/// world. The fields drop in the order they are declared: the client
/// before its world, the server last.
struct Fixture {
    client: Client,
    _world: World,
    s3: S3,
    server: S3Server,
}

/// The S3 server, and a library client (serving `gpu`) of a fresh world.
fn fixture(gpu: GpuSelect) -> Fixture {
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let world = World::new();
    let client = client(&world, gpu);
    Fixture {
        client,
        _world: world,
        s3,
        server,
    }
}

impl Fixture {
    /// PUTs the whole of `buf` to the server as `key`, as `policy` says.
    fn put_whole(&self, key: &str, buf: &Buffer, policy: Policy) -> Result<Moved, TransferError> {
        objects::put(&self.client, obj(&self.s3, key), buf, 0..buf.len(), policy)
    }
}

#[test]
fn a_declined_put_and_get_fall_back_to_plain_http_byte_exact() {
    let fx = fixture(GpuSelect::None);
    let data = pattern(300_000, 7);
    let mut buf = fx.client.register_host(data.clone()).unwrap();

    let moved = fx
        .put_whole("dir/obj one", &buf, Policy::default())
        .unwrap();
    assert_eq!(moved.bytes, data.len() as u64);
    assert!(
        matches!(&moved.path, Via::Fallback(why) if why.contains("x-amz-rdma-reply 501")),
        "{moved:?}"
    );
    assert!(stored(&fx.server, "dir/obj one") == data, "the PUT's bytes");
    assert_eq!(
        fx.s3.head_object(BUCKET, "dir/obj one").unwrap(),
        data.len() as u64
    );

    buf.as_mut_slice().unwrap().fill(0);
    let moved = objects::get(
        &fx.client,
        obj(&fx.s3, "dir/obj one"),
        1000..201_000,
        &mut buf,
        5,
        Policy::default(),
    )
    .unwrap();
    assert!(matches!(moved.path, Via::Fallback(_)), "{moved:?}");
    let bytes = buf.as_slice().unwrap();
    assert!(
        bytes[5..200_005] == data[1000..201_000],
        "the ranged GET's bytes"
    );
    assert!(bytes[..5].iter().chain(&bytes[200_005..]).all(|&b| b == 0));

    let stats = fx.client.stats();
    assert_eq!((stats.fallback, stats.fallback_bytes), (2, 500_000));
    assert_eq!(stats.library.declined, 2, "the library saw both declines");
    assert_eq!(stats.library.direct + stats.library.staged, 0);
}

#[test]
fn without_the_fallback_a_declined_transfer_fails_and_stores_nothing() {
    let fx = fixture(GpuSelect::None);
    let mut buf = fx.client.register_host(pattern(4096, 1)).unwrap();
    match fx.put_whole("never", &buf, NO_FALLBACK) {
        Err(TransferError::NoFallback(why)) => assert!(why.contains("declined"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(!fx.server.root().join(BUCKET).join("never").exists());
    std::fs::write(
        fx.server.root().join(BUCKET).join("there"),
        pattern(4096, 9),
    )
    .unwrap();
    match objects::get(
        &fx.client,
        obj(&fx.s3, "there"),
        0..4096,
        &mut buf,
        0,
        NO_FALLBACK,
    ) {
        Err(TransferError::NoFallback(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        buf.as_slice().unwrap() == pattern(4096, 1),
        "the buffer is unchanged"
    );
    assert_eq!(fx.client.stats().fallback, 0);
}

#[test]
fn s3_errors_come_back_as_s3_says_them() {
    let fx = fixture(GpuSelect::None);
    let mut buf = fx.client.host_buffer(4096).unwrap();
    let good = &fx.s3;
    match get_default(&fx.client, obj(good, "missing"), 0..4096, &mut buf) {
        Err(TransferError::S3(S3Error::Status {
            status: 404, code, ..
        })) => {
            assert_eq!(code.as_deref(), Some("NoSuchKey"))
        }
        other => panic!("{other:?}"),
    }
    let bad = s3(&fx.server, "not-the-secret");
    match bad.head_object(BUCKET, "missing") {
        Err(S3Error::Status { status: 403, .. }) => {}
        other => panic!("{other:?}"),
    }
    match objects::put(&fx.client, obj(&bad, "k"), &buf, 0..10, Policy::default()) {
        Err(TransferError::S3(S3Error::Status {
            status: 403, code, ..
        })) => {
            assert_eq!(code.as_deref(), Some("SignatureDoesNotMatch"))
        }
        other => panic!("{other:?}"),
    }
    assert!(!fx.server.root().join(BUCKET).join("k").exists());
}

#[test]
fn an_upload_above_one_chunk_is_multipart_and_a_download_reassembles_it() {
    let fx = fixture(GpuSelect::Device(0));
    let data = pattern((12 << 20) + 12_345, 3);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 3,
        device: true,
        fallback: true,
        ..Plan::default()
    };
    let progressed = AtomicU64::new(0);
    let progress = |n: u64| {
        progressed.fetch_add(n, Ordering::Relaxed);
    };
    let source = source_of(&data);
    let summary = objects::upload(
        Rdma::On(&fx.client),
        obj(&fx.s3, "big"),
        data.len() as u64,
        &plan,
        &source,
        &progress,
    )
    .unwrap();
    assert_eq!(summary.parts, 3);
    assert_eq!((summary.bytes, summary.fallback), (data.len() as u64, 3));
    assert_eq!(progressed.load(Ordering::Relaxed), data.len() as u64);
    assert!(stored(&fx.server, "big") == data, "three parts, in order");

    let got = Mutex::new(vec![0u8; 10 << 20]);
    let sink = |offset: u64, bytes: &[u8]| {
        let at = usize::try_from(offset).unwrap();
        got.lock()[at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    };
    let plan = Plan {
        chunk: 3 << 20,
        ..plan.clone()
    };
    let range = 777..777 + (10 << 20);
    let summary = objects::download(
        Rdma::On(&fx.client),
        obj(&fx.s3, "big"),
        range.clone(),
        &plan,
        Some(&sink),
        &|_| {},
    )
    .unwrap();
    assert_eq!((summary.transfers, summary.fallback), (4, 4));
    let (start, end) = (777, 777 + (10 << 20));
    assert!(
        got.into_inner() == data[start..end],
        "four chunks, in place"
    );
}

#[test]
fn an_empty_object_is_a_plain_put_and_a_failed_part_aborts_the_upload() {
    let fx = fixture(GpuSelect::None);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 2,
        device: false,
        fallback: true,
        ..Plan::default()
    };
    let summary = objects::upload(
        Rdma::On(&fx.client),
        obj(&fx.s3, "empty"),
        0,
        &plan,
        &|_, _| Ok(()),
        &|_| {},
    )
    .unwrap();
    assert_eq!(summary.transfers, 1);
    assert!(stored(&fx.server, "empty").is_empty());

    let failing = |offset: u64, out: &mut [u8]| {
        if offset > 0 {
            return Err(std::io::Error::other("the disk went away"));
        }
        out.fill(1);
        Ok(())
    };
    match objects::upload(
        Rdma::On(&fx.client),
        obj(&fx.s3, "half"),
        11 << 20,
        &plan,
        &failing,
        &|_| {},
    ) {
        Err(TransferError::Io(why)) => assert!(why.contains("disk went away"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        !fx.server.root().join(BUCKET).join("half").exists(),
        "nothing completed"
    );
    let small = Plan {
        chunk: 1 << 20,
        ..plan.clone()
    };
    assert!(matches!(
        objects::upload(Rdma::On(&fx.client), obj(&fx.s3, "x"), 3 << 20, &small, &failing, &|_| {}),
        Err(TransferError::Io(why)) if why.contains("at least")
    ));
}

#[test]
fn without_the_library_every_chunk_goes_over_plain_http_if_allowed() {
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let data = pattern((6 << 20) + 3, 11);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 2,
        device: false,
        fallback: true,
        ..Plan::default()
    };
    let why = "no RDMA device";
    let source = source_of(&data);
    let summary = objects::upload(
        Rdma::Off(why),
        obj(&s3, "plain"),
        data.len() as u64,
        &plan,
        &source,
        &|_| {},
    )
    .unwrap();
    assert_eq!((summary.parts, summary.fallback), (2, 2));
    assert_eq!(
        summary.fallback_reason.as_deref(),
        Some("no RDMA (no RDMA device)")
    );
    assert!(stored(&server, "plain") == data);

    let got = Mutex::new(vec![0u8; data.len()]);
    let sink = |offset: u64, bytes: &[u8]| {
        let at = usize::try_from(offset).unwrap();
        got.lock()[at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    };
    let total = data.len() as u64;
    objects::download(
        Rdma::Off(why),
        obj(&s3, "plain"),
        0..total,
        &plan,
        Some(&sink),
        &|_| {},
    )
    .unwrap();
    assert!(got.into_inner() == data);

    let strict = Plan {
        fallback: false,
        ..plan.clone()
    };
    match objects::download(
        Rdma::Off(why),
        obj(&s3, "plain"),
        0..total,
        &strict,
        None,
        &|_| {},
    ) {
        Err(TransferError::NoFallback(reason)) => assert!(reason.contains(why), "{reason}"),
        other => panic!("{other:?}"),
    }
    let device = Plan {
        device: true,
        ..plan.clone()
    };
    match objects::upload(
        Rdma::Off(why),
        obj(&s3, "gpu"),
        10,
        &device,
        &source,
        &|_| {},
    ) {
        Err(TransferError::Io(reason)) => assert!(reason.contains("GPU memory needs"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(!server.root().join(BUCKET).join("gpu").exists());
}

/// A client of the scripted `endpoint` with the test keys.
fn s3_at(endpoint: &http::Endpoint) -> S3 {
    s3_with(&endpoint.url, SECRET_KEY)
}

#[test]
fn an_rdma_failure_is_an_error_naming_the_s3_status_and_only_501_falls_back() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let mut buf = client.register_host(pattern(4096, 1)).unwrap();
    // The server tried and failed (503 SlowDown, 500): an error that says
    // so, not a silent second request over plain HTTP.
    for (status, code) in [(503, "SlowDown"), (500, "InternalError")] {
        let endpoint = http::Endpoint::start(move |_| {
            let mut reply = http::Reply::s3_error(status, code, "the transfer failed");
            if let http::Reply::Respond { headers, .. } = &mut reply {
                headers.push(("x-amz-rdma-reply".into(), status.to_string()));
            }
            reply
        });
        let s3 = s3_at(&endpoint);
        let got = get_default(&client, obj(&s3, "k"), 0..4096, &mut buf);
        assert_eq!(endpoint.count("GET"), 1, "no plain GET after a {status}");
        let text = format!("{:?}", got.as_ref().map(|m| &m.path));
        match got {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(&format!("{status} {code}")), "{e}");
            }
            Ok(_) => panic!("{status}: {text}"),
        }
        let put = objects::put(&client, obj(&s3, "k"), &buf, 0..4096, Policy::default());
        assert!(put.is_err(), "{status}: {put:?}");
        assert_eq!(endpoint.count("PUT"), 1, "no plain PUT after a {status}");
    }
    // A decline (501) falls back: the GET's body came with it.
    let endpoint = http::Endpoint::start(|r| {
        let mut reply = http::Reply::new(200, &[("x-amz-rdma-reply", "501")], vec![7u8; 4096]);
        if r.method == "PUT" {
            reply = http::Reply::new(
                200,
                &[("x-amz-rdma-reply", "501"), ("etag", "\"e\"")],
                Vec::new(),
            );
        }
        reply
    });
    let s3 = s3_at(&endpoint);
    let moved = get_default(&client, obj(&s3, "k"), 0..4096, &mut buf).unwrap();
    assert!(matches!(moved.path, Via::Fallback(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap().iter().all(|&b| b == 7));
}

#[test]
fn a_plain_download_reports_progress_as_bytes_arrive() {
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let data = pattern(8 << 20, 12);
    std::fs::write(server.root().join(BUCKET).join("progress"), &data).unwrap();
    let calls = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let progress = |n: u64| {
        calls.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(n, Ordering::Relaxed);
    };
    // One chunk: the whole object in one request.
    let plan = Plan {
        chunk: 8 << 20,
        streams: 1,
        device: false,
        fallback: true,
        ..Plan::default()
    };
    objects::download(
        Rdma::Off("no library"),
        obj(&s3, "progress"),
        0..data.len() as u64,
        &plan,
        None,
        &progress,
    )
    .unwrap();
    assert_eq!(bytes.load(Ordering::Relaxed), data.len() as u64);
    assert!(
        calls.load(Ordering::Relaxed) >= 8,
        "told {} times for one 8 MiB chunk",
        calls.load(Ordering::Relaxed)
    );
}

#[test]
fn an_rdma_get_answered_with_another_etag_is_a_changed_object() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern(4096, 3);
    world.server.set_object(&data);
    let mut buf = client.host_buffer(4096).unwrap();
    // The server moves the bytes by RDMA, and its answer names the version
    // it read: "v2".
    let server = world.server.clone();
    let endpoint = http::Endpoint::start(move |r| {
        let token = r.header("x-amz-rdma-token").unwrap_or("").to_owned();
        let reply = String::from_utf8(server.handle(token.as_bytes(), Op::Get)).unwrap();
        let data = pattern(4096, 3);
        http::Reply::new(
            206,
            &[
                ("x-amz-rdma-reply", &reply),
                ("x-amz-rdma-bytes-transferred", "4096"),
                ("x-amz-rdma-checksum-crc64nvme", &crc(&data)),
                ("etag", "\"v2\""),
            ],
            Vec::new(),
        )
    });
    let s3 = s3_at(&endpoint);
    let at = |etag| Object {
        etag: Some(etag),
        ..obj(&s3, "k")
    };
    let moved = objects::get(&client, at("\"v2\""), 0..4096, &mut buf, 0, NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap() == data);
    match get_default(&client, at("\"v1\""), 0..4096, &mut buf) {
        Err(TransferError::Changed {
            expected, found, ..
        }) => assert_eq!(
            (expected.as_str(), found.as_deref()),
            ("\"v1\"", Some("\"v2\""))
        ),
        other => panic!("{other:?}"),
    }
    let gets = endpoint.requests();
    assert_eq!(gets.len(), 2, "no fallback after a changed object");
    assert_eq!(gets[1].header("if-match"), Some("\"v1\""));
}

// ---------------------------------------------------------------- checksums

/// Uploads `data` as `object` through `client` as `plan` says.
fn upload_all(client: &Client, object: Object<'_>, data: &[u8], plan: &Plan) -> objects::Summary {
    let source = source_of(data);
    let len = data.len() as u64;
    objects::upload(Rdma::On(client), object, len, plan, &source, &|_| {}).unwrap()
}

/// A scripted endpoint whose GETs the fake world's server serves by RDMA
/// (as its behaviour says), answering with the reply, the bytes moved and
/// `extra` headers; it keeps each request's headers.
fn rdma_get_endpoint(world: &World, len: usize, extra: Vec<(String, String)>) -> http::Endpoint {
    let server = world.server.clone();
    http::Endpoint::start(move |r| {
        let token = r.header("x-amz-rdma-token").unwrap_or("").to_owned();
        let reply = String::from_utf8(server.handle(token.as_bytes(), Op::Get)).unwrap();
        let mut headers = vec![
            ("x-amz-rdma-reply".to_owned(), reply),
            ("x-amz-rdma-bytes-transferred".to_owned(), len.to_string()),
        ];
        headers.extend(extra.iter().cloned());
        http::Reply::Respond {
            status: 206,
            headers,
            body: Vec::new(),
        }
    })
}

#[test]
fn an_rdma_get_into_host_memory_asks_for_the_server_s_crc_and_checks_the_bytes_against_it() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern(100_000, 21);
    world.server.set_object(&data);
    let wrote = vec![(
        "x-amz-rdma-checksum-crc64nvme".to_owned(),
        crc(&data[..60_000]),
    )];
    let endpoint = rdma_get_endpoint(&world, 60_000, wrote);
    let s3 = s3_at(&endpoint);
    let mut buf = client.host_buffer(60_000).unwrap();
    let moved = get_default(&client, obj(&s3, "k"), 0..60_000, &mut buf).unwrap();
    assert_eq!(moved.verified, Verified::Yes, "{moved:?}");
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap() == &data[..60_000]);
    let asked = endpoint.requests();
    assert_eq!(asked[0].header("x-amz-checksum-mode"), Some("ENABLED"));
}

#[test]
fn a_server_that_sends_its_final_message_without_writing_fails_the_get_with_both_crcs() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern(8192, 5);
    world.server.set_object(&data);
    // It says it wrote the object (the right CRC), and wrote nothing.
    world.server.set_behaviour(Behaviour::FinalWithoutData);
    let endpoint = rdma_get_endpoint(
        &world,
        8192,
        vec![("x-amz-rdma-checksum-crc64nvme".to_owned(), crc(&data))],
    );
    let s3 = s3_at(&endpoint);
    let mut buf = client.host_buffer(8192).unwrap();
    let got = get_default(&client, obj(&s3, "k"), 0..8192, &mut buf);
    match got {
        Err(e @ TransferError::Corrupt { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("not the bytes the server says it wrote")
                    && text.contains(&crc(&data))
                    && text.contains(&crc(&[0u8; 8192]))
                    && text.contains("x-amz-rdma-checksum-crc64nvme"),
                "{text}"
            );
        }
        other => panic!("a GET whose bytes never came succeeded: {other:?}"),
    }
    assert_eq!(endpoint.count("GET"), 1, "no plain GET after a corrupt one");
}

#[test]
fn an_rdma_reply_without_the_crc_fails_a_verified_get_naming_the_option_that_turns_it_off() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern(4096, 8);
    world.server.set_object(&data);
    let endpoint = rdma_get_endpoint(&world, 4096, Vec::new());
    let s3 = s3_at(&endpoint);
    let mut buf = client.host_buffer(4096).unwrap();
    match get_default(&client, obj(&s3, "k"), 0..4096, &mut buf) {
        Err(e @ TransferError::Unverifiable { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("x-amz-rdma-checksum-crc64nvme") && text.contains("--no-verify"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    let off = Policy {
        verify: false,
        ..Policy::default()
    };
    let moved = objects::get(&client, obj(&s3, "k"), 0..4096, &mut buf, 0, off).unwrap();
    assert_eq!(moved.verified, Verified::No(Unchecked::Off));
    assert!(buf.as_slice().unwrap() == data);
    let asked = endpoint.requests();
    assert_eq!(asked[1].header("x-amz-checksum-mode"), None, "not asked");
}

#[test]
fn a_get_into_gpu_memory_is_neither_asked_for_a_crc_nor_checked() {
    let world = World::new();
    let client = client(&world, GpuSelect::Device(0));
    let data = pattern(4096, 9);
    world.server.set_object(&data);
    // A CRC that matches nothing: GPU memory is not compared with it.
    let endpoint = rdma_get_endpoint(
        &world,
        4096,
        vec![("x-amz-rdma-checksum-crc64nvme".to_owned(), crc(b"other"))],
    );
    let s3 = s3_at(&endpoint);
    let mut buf = client.device_buffer(4096).unwrap();
    let moved = get_default(&client, obj(&s3, "k"), 0..4096, &mut buf).unwrap();
    assert_eq!(moved.verified, Verified::No(Unchecked::Device));
    let mut back = vec![0u8; 4096];
    buf.read_at(0, &mut back).unwrap();
    assert!(back == data);
    assert_eq!(endpoint.requests()[0].header("x-amz-checksum-mode"), None);
}

#[test]
fn a_put_from_host_memory_carries_the_crc_of_the_bytes_the_server_reads_and_gpu_memory_none() {
    let world = World::new();
    let client = client(&world, GpuSelect::Device(0));
    let server = world.server.clone();
    let endpoint = http::Endpoint::start(move |r| {
        let token = r.header("x-amz-rdma-token").unwrap_or("").to_owned();
        let reply = String::from_utf8(server.handle(token.as_bytes(), Op::Put)).unwrap();
        http::Reply::new(
            200,
            &[
                ("x-amz-rdma-reply", &reply),
                ("x-amz-rdma-bytes-transferred", "3000"),
                ("etag", "\"p\""),
            ],
            Vec::new(),
        )
    });
    let s3 = s3_at(&endpoint);
    let data = pattern(5000, 4);
    let host = client.register_host(data.clone()).unwrap();
    let moved = objects::put(&client, obj(&s3, "k"), &host, 1000..4000, Policy::default()).unwrap();
    assert_eq!(moved.verified, Verified::Yes);
    assert!(world.server.object(3000) == data[1000..4000]);
    let mut device = client.device_buffer(3000).unwrap();
    device.write_at(0, &data[..3000]).unwrap();
    let moved = objects::put(&client, obj(&s3, "k"), &device, 0..3000, Policy::default()).unwrap();
    assert_eq!(moved.verified, Verified::No(Unchecked::Device));
    let off = Policy {
        verify: false,
        ..Policy::default()
    };
    objects::put(&client, obj(&s3, "k"), &host, 0..3000, off).unwrap();
    let puts = endpoint.requests();
    assert_eq!(
        puts[0].header("x-amz-checksum-crc64nvme"),
        Some(crc(&data[1000..4000]).as_str()),
        "the bytes the server READ, not the empty body"
    );
    assert!(puts[0].body.is_empty());
    for (i, put) in puts.iter().enumerate().skip(1) {
        assert!(
            !put.headers
                .iter()
                .any(|(k, _)| k.starts_with("x-amz-checksum")),
            "request {i}: {:?}",
            put.headers
        );
    }
}

#[test]
fn the_fallback_sends_the_crc_and_a_whole_object_comes_back_checked_against_it() {
    let fx = fixture(GpuSelect::None);
    let data = pattern(200_000, 2);
    let mut buf = fx.client.register_host(data.clone()).unwrap();
    let moved = fx.put_whole("whole", &buf, Policy::default()).unwrap();
    assert!(matches!(moved.path, Via::Fallback(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    buf.as_mut_slice().unwrap().fill(0);
    let whole = 0..data.len() as u64;
    let moved = get_default(&fx.client, obj(&fx.s3, "whole"), whole, &mut buf).unwrap();
    assert_eq!(
        moved.verified,
        Verified::Yes,
        "the stored CRC came back with the whole object"
    );
    assert!(buf.as_slice().unwrap() == data);
    // A range carries no checksum of its bytes: not checked, and said so.
    let moved = get_default(&fx.client, obj(&fx.s3, "whole"), 10..1000, &mut buf).unwrap();
    assert_eq!(moved.verified, Verified::No(Unchecked::NoChecksum));
}

#[test]
fn a_whole_object_whose_body_does_not_match_its_crc_fails_the_get() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern(4096, 1);
    let claimed = crc(&data);
    // A declined GET's body, and an object read over HTTP alone, both with
    // a checksum of other bytes than the body's.
    let endpoint = http::Endpoint::start(move |_| {
        let mut body = pattern(4096, 1);
        body[100] ^= 0x40;
        http::Reply::new(
            200,
            &[
                ("x-amz-rdma-reply", "501"),
                ("x-amz-checksum-crc64nvme", &claimed),
            ],
            body,
        )
    });
    let s3 = s3_at(&endpoint);
    let mut buf = client.host_buffer(4096).unwrap();
    match get_default(&client, obj(&s3, "k"), 0..4096, &mut buf) {
        Err(e @ TransferError::Corrupt { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&crc(&data)) && text.contains("x-amz-checksum-crc64nvme"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    let mut out = vec![0u8; 4096];
    match objects::get_http(obj(&s3, "k"), 0..4096, &mut out, true) {
        Err(TransferError::Corrupt { header, .. }) => {
            assert_eq!(header, "x-amz-checksum-crc64nvme")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        objects::get_http(obj(&s3, "k"), 0..4096, &mut out, false).unwrap(),
        Verified::No(Unchecked::Off)
    );
}

#[test]
fn a_multipart_upload_declares_a_full_object_crc64nvme_and_completes_with_the_whole_object_s() {
    let server = server();
    let upstream = server.endpoint.clone();
    let endpoint = http::Endpoint::start(move |r| http::forward(&upstream, r));
    let s3 = s3_at(&endpoint);
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern((11 << 20) + 333, 8);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 2,
        ..Plan::default()
    };
    let summary = upload_all(&client, obj(&s3, "parts"), &data, &plan);
    assert_eq!((summary.parts, summary.verified), (3, 3));
    assert!(summary.all_verified());
    assert!(stored(&server, "parts") == data);
    let requests = endpoint.requests();
    let create = requests
        .iter()
        .find(|r| r.method == "POST" && r.has_query("uploads"))
        .unwrap();
    assert_eq!(create.header("x-amz-checksum-algorithm"), Some("CRC64NVME"));
    assert_eq!(create.header("x-amz-checksum-type"), Some("FULL_OBJECT"));
    for part in requests.iter().filter(|r| r.has_query("partNumber")) {
        let number: usize = part.query("partNumber").unwrap().parse().unwrap();
        let start = (number - 1) * (5 << 20);
        let end = (start + (5 << 20)).min(data.len());
        assert_eq!(
            part.header("x-amz-checksum-crc64nvme"),
            Some(crc(&data[start..end]).as_str()),
            "part {number}"
        );
    }
    let complete = requests
        .iter()
        .find(|r| r.method == "POST" && r.has_query("uploadId"))
        .unwrap();
    assert_eq!(
        complete.header("x-amz-checksum-crc64nvme"),
        Some(crc(&data).as_str()),
        "the whole object's CRC, from its parts'"
    );
    assert_eq!(complete.header("x-amz-checksum-type"), Some("FULL_OBJECT"));
    let xml = String::from_utf8_lossy(&complete.body);
    assert!(
        xml.contains(&format!(
            "<ChecksumCRC64NVME>{}</ChecksumCRC64NVME>",
            crc(&data[..5 << 20])
        )),
        "{xml}"
    );
}

// ---------------------------------------------------------------- checksums end to end

#[test]
fn against_the_gateway_rdma_puts_and_gets_are_verified_end_to_end() {
    let world = World::new();
    let gateway = gateway::Gateway::start(&world);
    let s3 = s3_with(&gateway.endpoint, SECRET_KEY);
    let client = client(&world, GpuSelect::None);
    let data = pattern(3 << 20, 13);
    let mut buf = client.register_host(data.clone()).unwrap();
    let moved = objects::put(&client, obj(&s3, "e2e"), &buf, 0..data.len(), NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert!(gateway.stored("e2e").unwrap() == data);

    buf.as_mut_slice().unwrap().fill(0);
    let all = 0..data.len() as u64;
    let moved = objects::get(&client, obj(&s3, "e2e"), all, &mut buf, 0, NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(
        moved.verified,
        Verified::Yes,
        "the gateway's CRC of what it wrote"
    );
    assert!(buf.as_slice().unwrap() == data);
    let moved = objects::get(
        &client,
        obj(&s3, "e2e"),
        777..100_777,
        &mut buf,
        5,
        NO_FALLBACK,
    )
    .unwrap();
    assert_eq!(moved.verified, Verified::Yes, "a range's too");
    assert!(buf.as_slice().unwrap()[5..100_005] == data[777..100_777]);

    // A multipart upload by RDMA, its whole object's CRC from its parts'.
    let big = pattern((11 << 20) + 99, 14);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 2,
        fallback: false,
        ..Plan::default()
    };
    let summary = upload_all(&client, obj(&s3, "parts"), &big, &plan);
    assert_eq!((summary.parts, summary.direct, summary.verified), (3, 3, 3));
    assert!(gateway.stored("parts").unwrap() == big);
}

#[test]
fn against_the_gateway_an_rdma_put_whose_crc_is_not_its_bytes_is_refused_bad_digest_and_stores_nothing(
) {
    let world = World::new();
    let gateway = gateway::Gateway::start(&world);
    let s3 = s3_with(&gateway.endpoint, SECRET_KEY);
    let client = client(&world, GpuSelect::None);
    let data = pattern(1 << 20, 15);
    let buf = client.register_host(data.clone()).unwrap();
    // The CRC of other bytes than those the gateway READs.
    let mut request = objects::RdmaRequest::new(obj(&s3, "bad"), objects::Op::Put)
        .with_checksum(Checksum::crc64nvme(&data[1..]));
    match client.put(&buf, 0..data.len(), &mut request) {
        Err(hipobj::client::ClientError::Declined { status: 400 }) => {}
        other => panic!("{other:?}"),
    }
    let answer = request.response().unwrap();
    assert_eq!(
        (answer.status(), answer.header("x-amz-rdma-reply")),
        (400, Some("400"))
    );
    let text = request.response().unwrap().text(64 << 10).unwrap();
    assert!(text.contains("<Code>BadDigest</Code>"), "{text}");
    assert_eq!(gateway.stored("bad"), None, "nothing stored");
}
