//! The built-in S3 client (`hipobj::s3`) against the RDMA S3 server over
//! real HTTP, with a client of the library on the fake platform. This host
//! has no RDMA device, so the server declines every token (`rdma: off`):
//! these tests cover signing, the plain requests, multipart, and the
//! fallback of each transfer (the RDMA path of the same calls runs in the
//! Soft-RoCE lane, `tests/e2e.rs`).

mod common;
#[path = "common/http.rs"]
mod http;
#[path = "common/s3.rs"]
mod s3server;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hipobj::client::{Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::objects::{self, Object, Path as Via, Plan, Rdma, TransferError};
use hipobj::s3::{Credentials, S3Config, S3Error, S3};
use hipobj::server::Op;
use hipobj::testing::world::World;
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
    S3::new(S3Config {
        endpoint: server.endpoint.clone(),
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

fn obj<'a>(s3: &'a S3, key: &'a str) -> Object<'a> {
    Object::new(s3, BUCKET, key)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[1]).wrapping_add(seed))
        .collect()
}

fn stored(server: &S3Server, key: &str) -> Vec<u8> {
    std::fs::read(server.root().join(BUCKET).join(key)).unwrap()
}

#[test]
fn a_declined_put_and_get_fall_back_to_plain_http_byte_exact() {
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let data = pattern(300_000, 7);
    let mut buf = client.register_host(data.clone()).unwrap();

    let moved = objects::put(&client, obj(&s3, "dir/obj one"), &buf, 0..data.len(), true).unwrap();
    assert_eq!(moved.bytes, data.len() as u64);
    assert!(
        matches!(&moved.path, Via::Fallback(why) if why.contains("x-amz-rdma-reply 501")),
        "{moved:?}"
    );
    assert!(stored(&server, "dir/obj one") == data, "the PUT's bytes");
    assert_eq!(
        s3.head_object(BUCKET, "dir/obj one").unwrap(),
        data.len() as u64
    );

    buf.as_mut_slice().unwrap().fill(0);
    let moved = objects::get(
        &client,
        obj(&s3, "dir/obj one"),
        1000..201_000,
        &mut buf,
        5,
        true,
    )
    .unwrap();
    assert!(matches!(moved.path, Via::Fallback(_)), "{moved:?}");
    let bytes = buf.as_slice().unwrap();
    assert!(
        bytes[5..200_005] == data[1000..201_000],
        "the ranged GET's bytes"
    );
    assert!(bytes[..5].iter().chain(&bytes[200_005..]).all(|&b| b == 0));

    let stats = client.stats();
    assert_eq!((stats.fallback, stats.fallback_bytes), (2, 500_000));
    assert_eq!(stats.library.declined, 2, "the library saw both declines");
    assert_eq!(stats.library.direct + stats.library.staged, 0);
}

#[test]
fn without_the_fallback_a_declined_transfer_fails_and_stores_nothing() {
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let mut buf = client.register_host(pattern(4096, 1)).unwrap();
    match objects::put(&client, obj(&s3, "never"), &buf, 0..4096, false) {
        Err(TransferError::NoFallback(why)) => assert!(why.contains("declined"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(!server.root().join(BUCKET).join("never").exists());
    std::fs::write(server.root().join(BUCKET).join("there"), pattern(4096, 9)).unwrap();
    match objects::get(&client, obj(&s3, "there"), 0..4096, &mut buf, 0, false) {
        Err(TransferError::NoFallback(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        buf.as_slice().unwrap() == pattern(4096, 1),
        "the buffer is unchanged"
    );
    assert_eq!(client.stats().fallback, 0);
}

#[test]
fn s3_errors_come_back_as_s3_says_them() {
    let server = server();
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let mut buf = client.host_buffer(4096).unwrap();
    let good = s3(&server, SECRET_KEY);
    match objects::get(&client, obj(&good, "missing"), 0..4096, &mut buf, 0, true) {
        Err(TransferError::S3(S3Error::Status {
            status: 404, code, ..
        })) => {
            assert_eq!(code.as_deref(), Some("NoSuchKey"))
        }
        other => panic!("{other:?}"),
    }
    let bad = s3(&server, "not-the-secret");
    match bad.head_object(BUCKET, "missing") {
        Err(S3Error::Status { status: 403, .. }) => {}
        other => panic!("{other:?}"),
    }
    match objects::put(&client, obj(&bad, "k"), &buf, 0..10, true) {
        Err(TransferError::S3(S3Error::Status {
            status: 403, code, ..
        })) => {
            assert_eq!(code.as_deref(), Some("SignatureDoesNotMatch"))
        }
        other => panic!("{other:?}"),
    }
    assert!(!server.root().join(BUCKET).join("k").exists());
}

#[test]
fn an_upload_above_one_chunk_is_multipart_and_a_download_reassembles_it() {
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let world = World::new();
    let client = client(&world, GpuSelect::Device(0));
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
    let source = |offset: u64, out: &mut [u8]| {
        let at = usize::try_from(offset).unwrap();
        out.copy_from_slice(&data[at..at + out.len()]);
        Ok(())
    };
    let summary = objects::upload(
        Rdma::On(&client),
        obj(&s3, "big"),
        data.len() as u64,
        &plan,
        &source,
        &progress,
    )
    .unwrap();
    assert_eq!(summary.parts, 3);
    assert_eq!((summary.bytes, summary.fallback), (data.len() as u64, 3));
    assert_eq!(progressed.load(Ordering::Relaxed), data.len() as u64);
    assert!(stored(&server, "big") == data, "three parts, in order");

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
        Rdma::On(&client),
        obj(&s3, "big"),
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
    let server = server();
    let s3 = s3(&server, SECRET_KEY);
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let plan = Plan {
        chunk: 5 << 20,
        streams: 2,
        device: false,
        fallback: true,
        ..Plan::default()
    };
    let summary = objects::upload(
        Rdma::On(&client),
        obj(&s3, "empty"),
        0,
        &plan,
        &|_, _| Ok(()),
        &|_| {},
    )
    .unwrap();
    assert_eq!(summary.transfers, 1);
    assert!(stored(&server, "empty").is_empty());

    let failing = |offset: u64, out: &mut [u8]| {
        if offset > 0 {
            return Err(std::io::Error::other("the disk went away"));
        }
        out.fill(1);
        Ok(())
    };
    match objects::upload(
        Rdma::On(&client),
        obj(&s3, "half"),
        11 << 20,
        &plan,
        &failing,
        &|_| {},
    ) {
        Err(TransferError::Io(why)) => assert!(why.contains("disk went away"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        !server.root().join(BUCKET).join("half").exists(),
        "nothing completed"
    );
    let small = Plan {
        chunk: 1 << 20,
        ..plan.clone()
    };
    assert!(matches!(
        objects::upload(Rdma::On(&client), obj(&s3, "x"), 3 << 20, &small, &failing, &|_| {}),
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
    let source = |offset: u64, out: &mut [u8]| {
        let at = usize::try_from(offset).unwrap();
        out.copy_from_slice(&data[at..at + out.len()]);
        Ok(())
    };
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
    S3::new(S3Config {
        endpoint: endpoint.url.clone(),
        region: "us-east-1".to_owned(),
        credentials: Credentials {
            access_key_id: ACCESS_KEY.to_owned(),
            secret_access_key: SECRET_KEY.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap()
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
        let got = objects::get(&client, obj(&s3, "k"), 0..4096, &mut buf, 0, true);
        assert_eq!(endpoint.count("GET"), 1, "no plain GET after a {status}");
        let text = format!("{:?}", got.as_ref().map(|m| &m.path));
        match got {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(&format!("{status} {code}")), "{e}");
            }
            Ok(_) => panic!("{status}: {text}"),
        }
        let put = objects::put(&client, obj(&s3, "k"), &buf, 0..4096, true);
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
    let moved = objects::get(&client, obj(&s3, "k"), 0..4096, &mut buf, 0, true).unwrap();
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
        http::Reply::new(
            206,
            &[
                ("x-amz-rdma-reply", &reply),
                ("x-amz-rdma-bytes-transferred", "4096"),
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
    let moved = objects::get(&client, at("\"v2\""), 0..4096, &mut buf, 0, false).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap() == data);
    match objects::get(&client, at("\"v1\""), 0..4096, &mut buf, 0, true) {
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
