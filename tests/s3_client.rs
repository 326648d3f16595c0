//! The built-in S3 client (`hipobj::s3`) against the RDMA S3 server over
//! real HTTP, with a client of the library on the fake platform. This host
//! has no RDMA device, so the server declines every token (`rdma: off`):
//! these tests cover signing, the plain requests, multipart, and the
//! fallback of each transfer (the RDMA path of the same calls runs in the
//! Soft-RoCE lane, `tests/e2e.rs`).

mod common;
#[path = "common/s3.rs"]
mod s3server;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hipobj::client::{Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::objects::{self, Object, Path as Via, Plan, Rdma, TransferError};
use hipobj::s3::{Credentials, S3Config, S3Error, S3};
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
    Object {
        s3,
        bucket: BUCKET,
        key,
    }
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
        ..plan
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
        ..plan
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
        ..plan
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
        ..plan
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
