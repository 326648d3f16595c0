//! The gateway in front of a real distributed S3 store: a three-node Garage
//! cluster (replication factor 3) that `scripts/vm/garage-guest.sh` starts
//! around this test binary (`scripts/garage-test.sh` runs it so, on the
//! host; docs/reliability.md, "The gateway in front of Garage").
//!
//! The gateway is `hipobj::gateway` in this process (`--upstream`, Garage's
//! node 0), its RDMA on the fake fabric's server device; the client is the
//! Rust API on the fake fabric's client device. Every transfer goes by RDMA
//! between the client and the gateway and over HTTP between the gateway and
//! Garage; what reached Garage is read from Garage directly. A TCP relay
//! between the gateway and Garage that flips one byte shows the checks of
//! the middle hop; nodes are killed (SIGKILL) and stalled (SIGSTOP) through
//! their process ids.
//!
//! Without the cluster's settings in the environment the tests fail, saying
//! how to run them: they never pass by skipping.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/s3.rs"]
mod s3server;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hipobj::client::{Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::objects::{self, Object, Path as Via, Plan, Policy, Rdma, Verified};
use hipobj::s3::{Checksum, Credentials, Request, S3Config, S3Error, S3};
use hipobj::testing::world::World;
use s3server::{ACCESS_KEY, SECRET_KEY};

/// Verified, without the fallback: every byte goes by RDMA or not at all.
const NO_FALLBACK: Policy = Policy {
    fallback: false,
    verify: true,
};

/// The cluster's settings, from `garage-guest.sh`'s environment.
struct Cluster {
    endpoint: String,
    region: String,
    bucket: String,
    dir: PathBuf,
    key: String,
    secret: String,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests need the Garage cluster of \
             scripts/vm/garage-guest.sh; run them with `bash scripts/garage-test.sh`"
        )
    })
}

fn cluster() -> Cluster {
    Cluster {
        endpoint: env("HIPOBJ_GARAGE_ENDPOINT"),
        region: env("HIPOBJ_GARAGE_REGION"),
        bucket: env("HIPOBJ_GARAGE_BUCKET"),
        dir: PathBuf::from(env("HIPOBJ_GARAGE_DIR")),
        key: env("AWS_ACCESS_KEY_ID"),
        secret: env("AWS_SECRET_ACCESS_KEY"),
    }
}

impl Cluster {
    /// A client of Garage itself (node 0), with the cluster's key.
    fn direct(&self) -> S3 {
        self.direct_at(&self.endpoint)
    }

    fn direct_at(&self, endpoint: &str) -> S3 {
        s3_at(endpoint, &self.region, &self.key, &self.secret)
    }

    /// The gateway's options for this cluster, then `extra`.
    fn options<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["--upstream-region", &self.region];
        args.extend_from_slice(extra);
        args
    }

    /// Node `n`'s process id.
    fn pid(&self, n: usize) -> String {
        let file = self.dir.join(format!("node{n}/pid"));
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .trim()
            .to_owned()
    }

    /// `garage-guest.sh HELPER N`: kill-node or start-node.
    fn node(&self, helper: &str, n: usize) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vm/garage-guest.sh");
        let status = Command::new("bash")
            .arg(script)
            .args([helper, &n.to_string()])
            .status()
            .expect("garage-guest.sh");
        assert!(status.success(), "garage-guest.sh {helper} {n}: {status}");
    }

    /// Sends `signal` (STOP or CONT) to every node.
    fn signal_all(&self, signal: &str) {
        for n in 0..3 {
            let status = Command::new("kill")
                .args([&format!("-{signal}"), &self.pid(n)])
                .status()
                .expect("kill");
            assert!(status.success(), "kill -{signal} node {n}");
        }
    }

    /// Whether Garage holds `key` (a HEAD straight to node 0).
    fn holds(&self, key: &str) -> bool {
        match self.direct().head(&self.bucket, key) {
            Ok(_) => true,
            Err(S3Error::Status { status: 404, .. }) => false,
            Err(e) => panic!("HEAD {key} at Garage: {e}"),
        }
    }

    /// `key`'s bytes, straight from Garage.
    fn read(&self, key: &str, len: usize) -> Vec<u8> {
        let s3 = self.direct();
        let mut out = vec![0u8; len];
        objects::get_http(
            Object::new(&s3, &self.bucket, key),
            0..len as u64,
            &mut out,
            true,
        )
        .unwrap_or_else(|e| panic!("GET {key} at Garage: {e}"));
        out
    }
}

fn s3_at(endpoint: &str, region: &str, key: &str, secret: &str) -> S3 {
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
fn via(gateway: &gateway::Gateway) -> S3 {
    s3_at(&gateway.endpoint, "us-east-1", ACCESS_KEY, SECRET_KEY)
}

/// A client of the library on the fake fabric; a token lives as long as a
/// transfer through Garage may take.
fn client(world: &World) -> Client {
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

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[2]).wrapping_add(seed))
        .collect()
}

/// A key no other test (or earlier run) uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{name}-{}-{nanos}", std::process::id())
}

#[test]
fn gets_ranges_puts_and_multipart_go_by_rdma_through_the_gateway_byte_exact() {
    let garage = cluster();
    let world = World::new();
    let gateway = gateway::Gateway::upstream(&world, &garage.endpoint, &garage.options(&[]));
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = garage.bucket.as_str();

    // PUT by RDMA: Garage holds the bytes.
    let key = unique("put");
    let data = pattern((5 << 20) + 77, 1);
    let mut buf = client.register_host(data.clone()).unwrap();
    let object = Object::new(&s3, bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert!(garage.read(&key, data.len()) == data, "Garage's copy");

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

    // An object Garage was given directly, with its CRC64/NVME, read by
    // RDMA through the gateway (which checks it on the way).
    let direct = unique("direct");
    let other = pattern(3 << 20, 2);
    let garage_s3 = garage.direct();
    objects::put_http(Object::new(&garage_s3, bucket, &direct), &other, true).unwrap();
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
    // own upload at Garage.
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
    assert!(garage.read(&parts, big.len()) == big, "Garage's copy");
}

#[test]
fn a_checksum_mismatch_is_refused_at_each_hop_and_nothing_is_stored() {
    let garage = cluster();
    let world = World::new();
    let client = client(&world);
    let bucket = garage.bucket.as_str();
    let data = pattern(1 << 20, 4);
    let buf = client.register_host(data.clone()).unwrap();

    // The client's hop: a CRC of other bytes than those the gateway READs.
    let gateway = gateway::Gateway::upstream(&world, &garage.endpoint, &garage.options(&[]));
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
    assert!(!garage.holds(&key), "nothing stored");

    // The gateway's hop to Garage: a relay flips a byte of the PUT's body
    // on its way; Garage checks the client's CRC (which the gateway
    // forwards) and refuses it.
    let to_garage = Relay::start(&garage.endpoint, Fault::Flip(Way::Up, 300 << 10));
    let gateway = gateway::Gateway::upstream(&world, &to_garage.url(), &garage.options(&[]));
    let s3 = via(&gateway);
    let key = unique("bad-upstream-put");
    let object = Object::new(&s3, bucket, &key);
    let e = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK)
        .expect_err("a PUT whose bytes changed on the way to Garage");
    eprintln!("refused on the way to Garage: {e}");
    assert!(to_garage.done() >= 1, "the relay changed a byte");
    assert!(!garage.holds(&key), "nothing stored");

    // Garage's hop back: a relay flips a byte of a GET's body; the
    // gateway checks the object's stored checksum and fails the transfer.
    let key = unique("bad-upstream-get");
    let gateway = gateway::Gateway::upstream(&world, &garage.endpoint, &garage.options(&[]));
    let s3 = via(&gateway);
    let object = Object::new(&s3, bucket, &key);
    objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();
    let from_garage = Relay::start(&garage.endpoint, Fault::Flip(Way::Down, 300 << 10));
    let gateway = gateway::Gateway::upstream(&world, &from_garage.url(), &garage.options(&[]));
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
    .expect_err("a GET whose bytes changed on the way from Garage");
    let text = e.to_string();
    eprintln!("refused on the way from Garage: {text}");
    assert!(from_garage.done() >= 1, "the relay changed a byte");
    assert!(
        text.contains("do not match its x-amz-checksum-crc64nvme"),
        "{text}"
    );
}

/// A store that pauses for longer than `--rdma-timeout-ms` (but less than
/// `--upstream-timeout-ms`) in the middle of a PUT's body or of a GET's
/// answer is waited for: the RDMA time-out bounds what the client does, not
/// what the store does, so both transfers complete byte for byte.
#[test]
fn a_store_that_pauses_longer_than_the_rdma_timeout_is_waited_for() {
    let garage = cluster();
    let world = World::new();
    let client = client(&world);
    let bucket = garage.bucket.as_str();
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
    let to_garage = Relay::start(&garage.endpoint, Fault::Pause(Way::Up, 2 << 20, pause));
    let gateway = gateway::Gateway::upstream(&world, &to_garage.url(), &garage.options(&options));
    let s3 = via(&gateway);
    let start = Instant::now();
    let object = Object::new(&s3, bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..buf.len(), NO_FALLBACK)
        .expect("a PUT whose store pauses");
    eprintln!("PUT with Garage paused {pause:?}: {:?}", start.elapsed());
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(to_garage.done(), 1, "the store paused in the PUT's body");
    assert_eq!(Checksum::crc64nvme(&garage.read(&key, buf.len())), crc);

    let from_garage = Relay::start(&garage.endpoint, Fault::Pause(Way::Down, 2 << 20, pause));
    let gateway = gateway::Gateway::upstream(&world, &from_garage.url(), &garage.options(&options));
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
    eprintln!("GET with Garage paused {pause:?}: {:?}", start.elapsed());
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert_eq!(moved.verified, Verified::Yes);
    assert!(
        from_garage.done() >= 1,
        "the store paused in the GET's answer"
    );
    assert_eq!(Checksum::crc64nvme(buf.as_slice().unwrap()), crc);
}

#[test]
fn a_large_object_streams_through_the_gateway_both_ways() {
    let mib: usize = std::env::var("HIPOBJ_GARAGE_BIG_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3072);
    let garage = cluster();
    let world = World::new();
    let gateway = gateway::Gateway::upstream(&world, &garage.endpoint, &garage.options(&[]));
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
    let object = Object::new(&s3, &garage.bucket, &key);
    let moved = objects::put(&client, object, &buf, 0..len, NO_FALLBACK).unwrap();
    let put = start.elapsed();
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    buf.as_mut_slice().unwrap().fill(0);
    let start = Instant::now();
    let object = Object::new(&s3, &garage.bucket, &key);
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
        "{mib} MiB through the gateway: PUT {:.1} s ({:.1} MiB/s), GET {:.1} s ({:.1} MiB/s)",
        put.as_secs_f64(),
        rate(put),
        get.as_secs_f64(),
        rate(get)
    );
    garage
        .direct()
        .send(&Request::new("DELETE", &garage.bucket, Some(&key)))
        .and_then(|r| r.success())
        .expect("deleted");
}

#[test]
fn a_storage_node_killed_mid_run_leaves_transfers_going_on() {
    let garage = cluster();
    let world = World::new();
    let gateway = gateway::Gateway::upstream(
        &world,
        &garage.endpoint,
        &garage.options(&["--upstream-timeout-ms", "20000"]),
    );
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = garage.bucket.as_str();
    let running = AtomicBool::new(true);
    let done = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let after_kill = AtomicUsize::new(0);
    let killed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut i = 0u8;
            while running.load(Ordering::SeqCst) {
                i = i.wrapping_add(1);
                let key = unique("node-down");
                let data = pattern(2 << 20, i);
                let mut buf = client.register_host(data.clone()).unwrap();
                let object = Object::new(&s3, bucket, &key);
                let outcome = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK)
                    .and_then(|_| {
                        buf.as_mut_slice().unwrap().fill(0);
                        let object = Object::new(&s3, bucket, &key);
                        objects::get(
                            &client,
                            object,
                            0..data.len() as u64,
                            &mut buf,
                            0,
                            NO_FALLBACK,
                        )
                    });
                match outcome {
                    Ok(_) => {
                        assert!(buf.as_slice().unwrap() == data, "{key}: byte for byte");
                        done.fetch_add(1, Ordering::SeqCst);
                        if killed.load(Ordering::SeqCst) {
                            after_kill.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) => failures.lock().unwrap().push(format!("{key}: {e}")),
                }
            }
        });
        wait_until(
            || done.load(Ordering::SeqCst) >= 3,
            "three transfers before the kill",
        );
        garage.node("kill-node", 2);
        killed.store(true, Ordering::SeqCst);
        wait_until(
            || after_kill.load(Ordering::SeqCst) >= 5,
            "five transfers with node 2 down",
        );
        garage.node("start-node", 2);
        running.store(false, Ordering::SeqCst);
    });
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "{} transfers, {} with node 2 down; failed: {failures:?}",
        done.load(Ordering::SeqCst),
        after_kill.load(Ordering::SeqCst)
    );
    // A request in flight to the node as it died may fail (cleanly, with
    // an S3 error); every later one goes on.
    assert!(failures.len() <= 1, "{failures:?}");
}

#[test]
fn a_store_that_stalls_or_answers_503_fails_transfers_cleanly() {
    let garage = cluster();
    let world = World::new();
    let gateway = gateway::Gateway::upstream(
        &world,
        &garage.endpoint,
        &garage.options(&["--upstream-timeout-ms", "3000"]),
    );
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = garage.bucket.as_str();
    let key = unique("stall");
    let data = pattern(1 << 20, 6);
    let mut buf = client.register_host(data.clone()).unwrap();
    let object = Object::new(&s3, bucket, &key);
    objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();

    // Every node stopped: the gateway's time-out ends the GET, 503.
    garage.signal_all("STOP");
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
    garage.signal_all("CONT");
    let e = outcome.expect_err("a GET from a stalled store");
    eprintln!("stalled store, after {took:?}: {e}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(e.to_string().contains("503"), "{e}");

    // Two of three nodes down: no write quorum, Garage answers 503 (after
    // its own time-outs: a gateway that waits for them), and the client's
    // PUT fails with it; nothing stored.
    let patient = gateway::Gateway::upstream(
        &world,
        &garage.endpoint,
        &garage.options(&["--upstream-timeout-ms", "60000"]),
    );
    let s3_patient = via(&patient);
    garage.node("kill-node", 1);
    garage.node("kill-node", 2);
    let lost = unique("no-quorum");
    let object = Object::new(&s3_patient, bucket, &lost);
    let outcome = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK);
    garage.node("start-node", 1);
    garage.node("start-node", 2);
    let e = outcome.expect_err("a PUT without a write quorum");
    eprintln!("no quorum: {e}");
    let text = e.to_string();
    assert!(text.contains("HTTP 503"), "{text}");
    assert!(text.contains("quorum"), "Garage's own answer: {text}");
    wait_until(|| !garage.holds(&lost), "Garage answers HEAD again");
    assert!(!garage.holds(&lost), "nothing stored");

    // And the gateway goes on.
    let object = Object::new(&s3, bucket, &key);
    objects::get(
        &client,
        object,
        0..data.len() as u64,
        &mut buf,
        0,
        NO_FALLBACK,
    )
    .expect("a GET once the store is back");
    assert!(buf.as_slice().unwrap() == data);
}

/// Waits up to two minutes for `done`.
fn wait_until(done: impl Fn() -> bool, what: &str) {
    let end = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < end, "{what}: not within two minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a [`Relay`] does to each connection's stream, one way, at one
/// offset.
#[derive(Clone, Copy)]
enum Fault {
    /// Flips the byte at this offset.
    Flip(Way, u64),
    /// Stops passing bytes at this offset for a while, as a store that
    /// pauses (a collection, a compaction, a slow disk).
    Pause(Way, u64, Duration),
}

/// Which way: what the gateway sends (`Up`) or what Garage answers.
#[derive(Clone, Copy, PartialEq)]
enum Way {
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

/// A TCP relay in front of Garage that does its [`Fault`] to each
/// connection.
struct Relay {
    addr: SocketAddr,
    /// How many times the fault was done.
    done: Arc<AtomicUsize>,
}

impl Relay {
    fn start(endpoint: &str, fault: Fault) -> Relay {
        let target: SocketAddr = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("Garage's endpoint is http://IP:PORT");
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

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn done(&self) -> usize {
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
