//! The gateway (`hipobj::gateway`, what `hipobj-s3-server` runs) in this
//! process, its RDMA on the fake fabric, over real HTTP, driven by the
//! Rust API's S3 client as an application drives it, and by raw sockets
//! where a client misbehaves: the memory budget under concurrent
//! transfers, the version a pinned read is served, the connections'
//! time-outs and caps, virtual-hosted-style requests, what the log says.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/s3.rs"]
mod s3server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hipobj::client::{Client, GpuSelect};
use hipobj::s3::objects::{self, Object, Path as Via, Policy};
use hipobj::s3::{Credentials, S3Config, S3};
use hipobj_testing::world::World;
use s3server::{ACCESS_KEY, BUCKET, SECRET_KEY};

const MIB: usize = 1 << 20;

fn s3(endpoint: &str) -> S3 {
    S3::new(S3Config {
        endpoint: endpoint.to_owned(),
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

fn client(world: &World) -> Client {
    Client::builder()
        .platform(world.platform())
        .gpu(GpuSelect::None)
        .build()
        .unwrap()
}

/// Verified, without the fallback: a transfer that does not go by RDMA
/// fails.
const NO_FALLBACK: Policy = Policy {
    fallback: false,
    verify: true,
};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[2]).wrapping_add(seed))
        .collect()
}

/// Eight GETs and eight PUTs of 64 MiB at once, through a gateway whose
/// memory budget holds three transfers' windows: every one finishes by
/// RDMA, those the budget cannot hold yet waiting their turn (none
/// answered 503 while the budget is merely busy, none holding part of it
/// while it waits, so none waits on another), and the budget is never
/// over its limit.
#[test]
fn concurrent_gets_and_puts_under_a_budget_of_a_few_windows_all_finish_in_turn() {
    const N: usize = 8;
    const LEN: usize = 64 * MIB;
    // 1 MiB chunks, three a transfer: a window is 3 MiB; the budget three.
    let budget = 9 * MIB;
    let world = World::new();
    let gateway = gateway::Gateway::start_with(
        &world,
        &[
            "--rdma-chunk-bytes",
            &MIB.to_string(),
            "--rdma-chunks",
            "3",
            "--rdma-memory-bytes",
            &budget.to_string(),
            "--rdma-timeout-ms",
            "20000",
        ],
    );
    let s3 = s3(&gateway.endpoint);
    let client = client(&world);
    let objects: Vec<Vec<u8>> = (0..N)
        .map(|i| pattern(LEN, u8::try_from(i).unwrap()))
        .collect();
    for (i, data) in objects.iter().enumerate() {
        let key = format!("get-{i}");
        objects::put_http(Object::new(&s3, BUCKET, &key), data, false).expect("a plain PUT");
    }
    let peak = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                peak.fetch_max(gateway.rdma.memory_in_use(), Ordering::AcqRel);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let mut transfers = Vec::new();
        for (i, data) in objects.iter().enumerate() {
            let (s3, client) = (&s3, &client);
            transfers.push(scope.spawn(move || {
                let key = format!("get-{i}");
                let mut buf = client.host_buffer(LEN).unwrap();
                let moved = objects::get(
                    client,
                    Object::new(s3, BUCKET, &key),
                    0..LEN as u64,
                    &mut buf,
                    0,
                    NO_FALLBACK,
                )
                .map_err(|e| format!("GET {key}: {e}"))?;
                if !matches!(moved.path, Via::Rdma(_)) {
                    return Err(format!("GET {key}: {moved:?}"));
                }
                if buf.as_slice().unwrap() != &data[..] {
                    return Err(format!("GET {key}: other bytes"));
                }
                Ok(())
            }));
            transfers.push(scope.spawn(move || {
                let key = format!("put-{i}");
                let buf = client.register_host(data.clone()).unwrap();
                let moved = objects::put(
                    client,
                    Object::new(s3, BUCKET, &key),
                    &buf,
                    0..LEN,
                    NO_FALLBACK,
                )
                .map_err(|e| format!("PUT {key}: {e}"))?;
                if !matches!(moved.path, Via::Rdma(_)) {
                    return Err(format!("PUT {key}: {moved:?}"));
                }
                Ok(())
            }));
        }
        let failed: Vec<String> = transfers
            .into_iter()
            .filter_map(|t| t.join().unwrap().err())
            .collect();
        done.store(true, Ordering::Release);
        sampler.join().unwrap();
        assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
    });
    for (i, data) in objects.iter().enumerate() {
        let stored = gateway.stored(&format!("put-{i}")).expect("stored");
        assert!(stored == *data, "put-{i}: other bytes stored");
    }
    let (waiting, waited) = gateway.rdma.budget_waits();
    assert_eq!(waiting, 0);
    assert!(
        waited > 0,
        "sixteen transfers of three windows' budget: some must have waited their turn"
    );
    let peak = peak.load(Ordering::Acquire);
    assert!(
        peak <= budget as u64,
        "{peak} bytes held at once, past the budget of {budget}"
    );
    assert_eq!(gateway.rdma.memory_in_use(), 0, "every share given back");
}

/// A backend that replaces `bucket/key`'s file with other bytes right
/// after its first GetObject answered (what a PUT of the same key does
/// between the answer and its bytes): the race an RDMA GET must not lose.
struct Racy {
    inner: hipobj::gateway::local::Local,
    root: std::path::PathBuf,
    armed: parking_lot::Mutex<Option<(String, Vec<u8>)>>,
    /// Replace after a HeadObject too (what a PUT between a HEAD and the
    /// GET that follows it does).
    after_head: bool,
}

impl Racy {
    /// A gateway over a fresh root through a racy backend (`after_head`:
    /// it replaces the object after a HEAD too).
    fn gateway(world: &World, after_head: bool) -> (Arc<Racy>, gateway::Gateway) {
        let root = gateway::Gateway::fresh_root();
        let racy = Arc::new(Racy {
            inner: hipobj::gateway::local::Local::open(&root).unwrap(),
            root: root.clone(),
            armed: parking_lot::Mutex::new(None),
            after_head,
        });
        let gateway = gateway::Gateway::over(world, racy.clone(), root, &[]);
        (racy, gateway)
    }

    fn overwrite(&self) {
        if let Some((key, bytes)) = self.armed.lock().take() {
            let dir = self.root.join(BUCKET);
            let temp = dir.join(format!(".racy-{key}"));
            std::fs::write(&temp, bytes).unwrap();
            std::fs::rename(&temp, dir.join(&key)).unwrap();
        }
    }
}

#[async_trait::async_trait]
impl s3s::S3 for Racy {
    async fn get_object(
        &self,
        req: s3s::S3Request<s3s::dto::GetObjectInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::GetObjectOutput>> {
        let answer = self.inner.get_object(req).await;
        self.overwrite();
        answer
    }

    async fn head_object(
        &self,
        req: s3s::S3Request<s3s::dto::HeadObjectInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::HeadObjectOutput>> {
        let answer = self.inner.head_object(req).await;
        if self.after_head {
            self.overwrite();
        }
        answer
    }

    async fn put_object(
        &self,
        req: s3s::S3Request<s3s::dto::PutObjectInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::PutObjectOutput>> {
        self.inner.put_object(req).await
    }
}

impl hipobj::gateway::backend::Backend for Racy {
    fn describe(&self) -> String {
        "racy".into()
    }
}

/// The quoted hex MD5 of `bytes`: a single PUT's ETag.
fn etag_of(bytes: &[u8]) -> String {
    use s3s::crypto::Checksum as _;
    let mut md5 = s3s::crypto::Md5::new();
    md5.update(bytes);
    format!("\"{}\"", hex::encode(md5.finalize()))
}

/// A ranged RDMA GET pinned to a version (If-Match, its answer's ETag
/// checked) gets that version's bytes, or fails: never another version's
/// bytes under the pinned ETag, though the object is replaced between the
/// backend's answer and the transfer.
#[test]
fn a_ranged_rdma_get_at_a_version_gets_that_versions_bytes() {
    let world = World::new();
    let (racy, gateway) = Racy::gateway(&world, false);
    let s3 = s3(&gateway.endpoint);
    let client = client(&world);
    let a = vec![b'A'; 64 << 10];
    objects::put_http(Object::new(&s3, BUCKET, "k"), &a, false).expect("a plain PUT");
    let etag = etag_of(&a);
    *racy.armed.lock() = Some(("k".into(), vec![b'B'; 64 << 10]));
    let mut buf = client.host_buffer(32 << 10).unwrap();
    let pinned = Object {
        etag: Some(&etag),
        ..Object::new(&s3, BUCKET, "k")
    };
    let got = objects::get(&client, pinned, 0..32 << 10, &mut buf, 0, NO_FALLBACK);
    assert!(racy.armed.lock().is_none(), "the object was replaced");
    if let Ok(moved) = got {
        assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
        let bytes = buf.as_slice().unwrap();
        assert!(
            bytes.iter().all(|&b| b == b'A'),
            "the GET pinned to version A ({etag}) got {} bytes of version B",
            bytes.iter().filter(|&&b| b == b'B').count()
        );
    }
}

/// A suffix range (`bytes=-N`, how readers ask for a file's footer) is
/// answered with the last N bytes of one version, however the object
/// changes while it is served: never a range resolved against another
/// version's length.
#[test]
fn a_suffix_range_gets_that_many_bytes_of_one_version() {
    let world = World::new();
    let (racy, gateway) = Racy::gateway(&world, true);
    let s3 = s3(&gateway.endpoint);
    let short: Vec<u8> = (0..100u8).collect();
    objects::put_http(Object::new(&s3, BUCKET, "k"), &short, false).expect("a plain PUT");
    let long: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    *racy.armed.lock() = Some(("k".into(), long.clone()));
    let mut get = hipobj::s3::Request::new("GET", BUCKET, Some("k"));
    get.headers.push(("range", "bytes=-10".into()));
    let mut answer = s3.send(&get).expect("answered").success().expect("206");
    let range = answer.header("content-range").map(str::to_owned);
    let len = answer.content_length().expect("a length");
    let mut body = vec![0u8; usize::try_from(len).unwrap()];
    answer.read_body_into(&mut body).expect("the body");
    assert_eq!(
        body.len(),
        10,
        "answered {range:?} with {} bytes",
        body.len()
    );
    assert!(
        body == short[90..] || body == long[990..],
        "not the last 10 bytes of either version: {range:?}"
    );
}

/// The keys a gateway in front of another in this process signs with:
/// the test keys, as the AWS tools find them (the environment). Every test
/// of this binary sets the same values.
fn upstream_keys() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    });
}

/// An RDMA GET through a gateway in front of another store (its bytes
/// from the store's stream) logs its transfer's line, and nothing for
/// each piece of the body. The test harness captures what threads of a
/// test print, so the transfer runs in a child: this binary again, on this
/// test alone, in `HIPOBJ_TEST_CHILD` mode, its standard error read here.
#[test]
fn an_rdma_get_through_an_upstream_logs_its_line_and_no_line_per_piece() {
    let Some(log) = in_child(
        "an_rdma_get_through_an_upstream_logs_its_line_and_no_line_per_piece",
        get_through_an_upstream,
    ) else {
        return;
    };
    assert!(
        log.contains("rdma GET bucket/logged: 4194304 bytes"),
        "the transfer's own line: {log}"
    );
    let debug: Vec<&str> = log.lines().filter(|l| l.contains("DEBUG")).collect();
    assert!(
        debug.is_empty(),
        "{} debug lines: {:?}",
        debug.len(),
        &debug[..debug.len().min(3)]
    );
}

fn get_through_an_upstream() {
    upstream_keys();
    let world = World::new();
    let store = gateway::Gateway::start(&world);
    let gateway = gateway::Gateway::upstream(&world, &store.endpoint, &[]);
    let s3_store = s3(&store.endpoint);
    let data = pattern(4 * MIB, 9);
    objects::put_http(Object::new(&s3_store, BUCKET, "logged"), &data, false).expect("a PUT");
    let client = client(&world);
    let mut buf = client.host_buffer(data.len()).unwrap();
    let s3 = s3(&gateway.endpoint);
    let moved = objects::get(
        &client,
        Object::new(&s3, BUCKET, "logged"),
        0..data.len() as u64,
        &mut buf,
        0,
        NO_FALLBACK,
    )
    .expect("the GET");
    assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    assert!(buf.as_slice().unwrap() == &data[..]);
}

/// Runs `scenario` in a child (this binary again, on test `name` alone,
/// in `HIPOBJ_TEST_CHILD` mode) and returns its standard error, which the
/// test harness would otherwise capture from the gateway's threads; in the
/// child, runs it and returns `None`. The child failing fails the test.
fn in_child(name: &str, scenario: fn()) -> Option<String> {
    if std::env::var_os("HIPOBJ_TEST_CHILD").is_some() {
        scenario();
        return None;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("HIPOBJ_TEST_CHILD", "1")
        .output()
        .expect("the test binary runs");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the child failed: {log}");
    Some(log)
}

/// Whether the gateway closes `socket` (it reads EOF, or a reset) within
/// ten seconds, reading and dropping whatever it answers first.
fn closed_soon(socket: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while std::time::Instant::now() < until {
        match socket.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Whether `socket` is still open (nothing to read, no EOF) now.
fn still_open(socket: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 1];
    matches!(
        socket.read(&mut buf),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    )
}

/// A client connected to `endpoint` (`http://ADDR:PORT`) from `from` (an
/// address of the loopback, so that one test has several clients).
fn connect_from(endpoint: &str, from: std::net::IpAddr) -> std::net::TcpStream {
    let to: std::net::SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::new(from, 0)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(socket.connect(to)).unwrap();
    let std = stream.into_std().unwrap();
    std.set_nonblocking(false).unwrap();
    std
}

/// A request's header sent in part and never finished, a header trickled
/// a byte at a time, a connection that sends nothing and one kept alive
/// after its request are each closed by their time-out, and said so; a
/// connection past the caps (in all, from one client) is closed as it
/// comes while the others stay open, and said so.
#[test]
fn connections_are_closed_by_their_time_outs_and_past_their_caps() {
    let Some(log) = in_child(
        "connections_are_closed_by_their_time_outs_and_past_their_caps",
        connection_limits,
    ) else {
        return;
    };
    for said in [
        "closed: its request's header did not arrive within 300 ms of its first byte \
         (--http-header-timeout-ms)",
        "closed: no request came for 600 ms (--http-idle-timeout-ms)",
        "closed as it came: 2 connections from 127.0.0.1 are open, as many as \
         --http-max-connections-per-client allows",
        "closed as it came: 3 connections are open, as many as --http-max-connections allows",
    ] {
        assert!(log.contains(said), "the log does not say {said:?}: {log}");
    }
}

fn connection_limits() {
    use std::io::Write;
    let world = World::new();
    let timed = gateway::Gateway::start_with(
        &world,
        &[
            "--http-header-timeout-ms",
            "300",
            "--http-idle-timeout-ms",
            "600",
        ],
    );
    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let mut half = connect_from(&timed.endpoint, local);
    half.write_all(b"GET /bucket/k HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    assert!(
        closed_soon(&mut half),
        "a half-sent request's connection stays open"
    );
    let mut trickle = connect_from(&timed.endpoint, local);
    let header = b"GET /bucket/k HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let mut closed = false;
    for (i, byte) in header.iter().chain(std::iter::repeat(&b'a')).enumerate() {
        if trickle.write_all(&[*byte]).is_err() || i > 100 {
            closed = i <= 100;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        closed || closed_soon(&mut trickle),
        "a header trickled a byte at a time keeps its connection"
    );
    let mut silent = connect_from(&timed.endpoint, local);
    assert!(
        closed_soon(&mut silent),
        "a connection that sends nothing stays open"
    );
    let mut kept = connect_from(&timed.endpoint, local);
    kept.write_all(b"GET /bucket/k HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        closed_soon(&mut kept),
        "an idle kept-alive connection stays open"
    );
    drop(timed);

    let capped = gateway::Gateway::start_with(
        &world,
        &[
            "--http-max-connections",
            "3",
            "--http-max-connections-per-client",
            "2",
        ],
    );
    let mut first = connect_from(&capped.endpoint, local);
    let mut second = connect_from(&capped.endpoint, local);
    let mut third = connect_from(&capped.endpoint, local);
    assert!(
        closed_soon(&mut third),
        "a third from one client, past its cap of two"
    );
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let mut elsewhere = connect_from(&capped.endpoint, other);
    let mut fourth = connect_from(&capped.endpoint, other);
    assert!(
        closed_soon(&mut fourth),
        "a fourth in all, past the cap of three"
    );
    for (what, socket) in [
        ("the first", &mut first),
        ("the second", &mut second),
        ("another client's", &mut elsewhere),
    ] {
        assert!(still_open(socket), "{what} connection was closed");
    }
    // One closed: its place is free again.
    drop(first);
    std::thread::sleep(Duration::from_millis(200));
    let mut again = connect_from(&capped.endpoint, local);
    assert!(still_open(&mut again), "a place given back is taken again");
}

/// Sends `method path` with `body` to `endpoint`'s socket, SigV4-signed
/// with the test keys for `host` as its Host header (what a client of a
/// name that resolves to the gateway sends); returns the answer's status.
fn signed_to(endpoint: &str, host: &str, method: &str, path: &str, body: &[u8]) -> u16 {
    use aws_sigv4::http_request::{
        sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
        SigningSettings,
    };
    use std::io::{Read, Write};
    let identity =
        aws_credential_types::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test").into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(std::time::SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let url = format!("http://{host}{path}");
    let signable =
        SignableRequest::new(method, &url, std::iter::empty(), SignableBody::Bytes(body)).unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let (headers, _) = instructions.into_parts();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    for h in &headers {
        head.push_str(&format!("{}: {}\r\n", h.name(), h.value()));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut socket = std::net::TcpStream::connect(endpoint.trim_start_matches("http://")).unwrap();
    socket.write_all(head.as_bytes()).unwrap();
    socket.write_all(body).unwrap();
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"))
}

/// With `--domain`, a request to `BUCKET.DOMAIN` addresses `BUCKET`
/// (virtual-hosted style, its path all key), one to the domain itself or
/// to any other name is path-style: no Host outside the domain is taken
/// for a bucket. Without `--domain`, every request is path-style.
#[test]
fn virtual_hosted_requests_address_the_host_s_bucket_for_the_given_domains() {
    let world = World::new();
    let gateway = gateway::Gateway::start_with(&world, &["--domain", "gw.test"]);
    let root = gateway.root().to_path_buf();
    for bucket in ["models", "llm"] {
        std::fs::create_dir_all(root.join(bucket)).unwrap();
    }
    let port = gateway.endpoint.rsplit(':').next().unwrap().to_owned();
    let status = signed_to(
        &gateway.endpoint,
        &format!("models.gw.test:{port}"),
        "PUT",
        "/llm/a.bin",
        b"virtual",
    );
    assert_eq!(status, 200);
    assert_eq!(
        std::fs::read(root.join("models/llm/a.bin")).ok().as_deref(),
        Some(&b"virtual"[..]),
        "stored in bucket models, key llm/a.bin"
    );
    assert!(!root.join("llm/a.bin").exists(), "not in bucket llm");
    for host in [
        format!("gw.test:{port}"),
        format!("elsewhere.example:{port}"),
    ] {
        let status = signed_to(&gateway.endpoint, &host, "PUT", "/llm/b.bin", b"path");
        assert_eq!(status, 200, "{host}");
        assert_eq!(
            std::fs::read(root.join("llm/b.bin")).ok().as_deref(),
            Some(&b"path"[..]),
            "{host}: path-style, bucket llm"
        );
        std::fs::remove_file(root.join("llm/b.bin")).unwrap();
    }
    let plain = gateway::Gateway::start(&world);
    let root = plain.root().to_path_buf();
    std::fs::create_dir_all(root.join("llm")).unwrap();
    let port = plain.endpoint.rsplit(':').next().unwrap().to_owned();
    let status = signed_to(
        &plain.endpoint,
        &format!("models.gw.test:{port}"),
        "PUT",
        "/llm/c.bin",
        b"no domain",
    );
    assert_eq!(status, 200);
    assert!(
        root.join("llm/c.bin").exists(),
        "without --domain: path-style"
    );
}

/// A store that takes a PUT's body whole, then fails it (what a store
/// that stopped answering gives once the gateway's time-out passed).
struct Down;

#[async_trait::async_trait]
impl s3s::S3 for Down {
    async fn put_object(
        &self,
        mut req: s3s::S3Request<s3s::dto::PutObjectInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::PutObjectOutput>> {
        use futures::StreamExt;
        if let Some(mut body) = req.input.body.take() {
            while body.next().await.is_some() {}
        }
        Err(s3s::s3_error!(
            ServiceUnavailable,
            "upstream http://store.test: no answer within 100 ms"
        ))
    }
}

impl hipobj::gateway::backend::Backend for Down {
    fn describe(&self) -> String {
        "down".into()
    }
}

/// An RDMA PUT whose bytes moved but which the store did not take is
/// logged as what the client was told (the store's status, nothing
/// stored), never "ok"; it is counted as the store's error, not as RDMA
/// busy, and its answer of 503 gets the log line every such answer gets.
#[test]
fn an_rdma_put_the_store_did_not_take_is_logged_and_counted_as_the_store_s_failure() {
    let Some(log) = in_child(
        "an_rdma_put_the_store_did_not_take_is_logged_and_counted_as_the_store_s_failure",
        put_to_a_store_that_is_down,
    ) else {
        return;
    };
    let transfer: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("rdma PUT bucket/down"))
        .collect();
    assert!(!transfer.is_empty(), "no transfer line: {log}");
    for line in &transfer {
        assert!(
            line.contains("but the backend answered 503 ServiceUnavailable")
                && line.contains("nothing stored; the client is told 503"),
            "the transfer's line does not say what the client was told: {line}"
        );
    }
    assert!(
        log.contains("PUT /bucket/down (PutObject)") && log.contains(": 503 ServiceUnavailable"),
        "the answer's own line: {log}"
    );
    let metrics = log
        .lines()
        .filter(|l| l.starts_with("hipobj_s3_rdma_refusals_total"))
        .collect::<Vec<_>>();
    assert!(
        metrics
            .iter()
            .any(|l| l.contains("reason=\"s3_error\"") && l.contains("PutObject")),
        "{metrics:?}"
    );
    assert!(
        !metrics.iter().any(|l| l.contains("reason=\"busy\"")),
        "a store's failure counted as RDMA busy: {metrics:?}"
    );
}

fn put_to_a_store_that_is_down() {
    let world = World::new();
    let root = gateway::Gateway::fresh_root();
    let down = Arc::new(Down);
    let gateway = gateway::Gateway::over(&world, down, root, &[]);
    let s3 = s3(&gateway.endpoint);
    let client = client(&world);
    let data = pattern(MIB, 3);
    let buf = client.register_host(data.clone()).unwrap();
    let put = objects::put(
        &client,
        Object::new(&s3, BUCKET, "down"),
        &buf,
        0..data.len(),
        NO_FALLBACK,
    );
    assert!(put.is_err(), "{put:?}");
    assert!(gateway.stored("down").is_none(), "nothing stored");
    // What the metrics endpoint serves, for the parent to read.
    for line in hipobj::gateway::metrics::render(None).lines() {
        if line.starts_with("hipobj_s3_rdma_refusals_total") {
            eprintln!("{line}");
        }
    }
}
