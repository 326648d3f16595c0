//! End to end on Soft-RoCE: the RDMA-enabled S3 server
//! (`hipobj-s3-server`) and the C examples (`examples/*.c`, built against the
//! installed `libhipobj.so` by `scripts/build-examples.sh`) moving objects
//! over the kernel's rdma_rxe. Runs inside the VM lane only
//! (`scripts/vm/lane.sh`, features `vm-lane` and `s3-server`), where `rxe0`
//! sits on `dummy0` at 192.0.2.1; outside it a missing device fails every
//! test.
//!
//! The examples print one summary line that says whether RDMA or the plain
//! HTTP fallback carried the bytes; every test here says which it expects.

#[path = "common/lane.rs"]
mod lane;
#[path = "common/s3.rs"]
mod s3;

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hipobj::capi::*;
use lane::{device, ip, server_device, server_ip};
use s3::S3Server;

const MIB: usize = 1 << 20;

fn server_binary() -> PathBuf {
    lane::program("hipobj-s3-server", env!("CARGO_BIN_EXE_hipobj-s3-server"))
}

/// A server with RDMA on rxe0; the lane has nothing else, so RDMA must be on.
fn rdma_server(extra: &[&str]) -> S3Server {
    let mut args = vec!["--device", server_device()];
    args.extend_from_slice(extra);
    let server = S3Server::start(&server_binary(), server_ip(), &args);
    assert!(
        server.rdma,
        "the server found no RDMA on {}",
        server_device()
    );
    server
}

/// `target/examples`, where `scripts/build-examples.sh` puts the programs:
/// two levels above this test binary (`target/<profile>/deps`); where the
/// hardware lane carried them, `HIPOBJ_LANE_EXAMPLES`.
fn examples_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HIPOBJ_LANE_EXAMPLES") {
        return dir.into();
    }
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary lives in target/<profile>/deps");
    target.join("examples")
}

/// Runs example `name` against `server` and returns its output, after
/// checking that it exited 0 and printed one summary line carried `via`.
fn example(
    server: &S3Server,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    via: &str,
) -> String {
    let output = run_example(&server.endpoint, name, args, env);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout.trim_end();
    assert_eq!(
        line.lines().count(),
        1,
        "{name} prints one summary line: {stdout}"
    );
    assert!(
        line.contains(&format!("via {via}")),
        "{name} {args:?} was to go via {via}: {line}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{line}");
    line.to_owned()
}

fn run_example(endpoint: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let program = examples_dir().join(name);
    assert!(
        program.is_file(),
        "{} is missing: scripts/build-examples.sh builds it",
        program.display()
    );
    let mut command = Command::new(&program);
    command
        .args(["--endpoint", endpoint])
        .args([
            "--access-key",
            s3::ACCESS_KEY,
            "--secret-key",
            s3::SECRET_KEY,
        ])
        .args(args)
        .env_remove("HIPOBJ_MAX_TRANSFERS");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the example runs")
}

#[test]
fn put_then_get_16_mib_byte_exact() {
    let server = rdma_server(&[]);
    let size = (16 * MIB).to_string();
    let rdma = ["--nic", device(), "--size", &size, "--pattern", "11"];
    example(
        &server,
        "put-object",
        &[&rdma[..], &[s3::BUCKET, "big"]].concat(),
        &[],
        "rdma",
    );
    let stored = std::fs::metadata(server.root().join(s3::BUCKET).join("big")).expect("stored");
    assert_eq!(stored.len(), 16 * MIB as u64);
    example(
        &server,
        "get-object",
        &[&rdma[..], &[s3::BUCKET, "big"]].concat(),
        &[],
        "rdma",
    );
    // The pattern check is the example's; a wrong seed must fail it, so the
    // check above is not vacuous.
    let wrong = run_example(
        &server.endpoint,
        "get-object",
        &[
            "--nic",
            device(),
            "--size",
            "4096",
            "--pattern",
            "12",
            s3::BUCKET,
            "big",
        ],
        &[],
    );
    assert_eq!(wrong.status.code(), Some(2), "a pattern mismatch exits 2");
}

/// Striping on real RC queue pairs (protocol version 3): with
/// `HIPOBJ_STRIPES=4` (Soft-RoCE's own default is 1), a 16 MiB PUT and GET
/// each move over four of the client's connections, each proved and
/// granted on its own, byte-exact: four handshakes per process, one per
/// share.
#[test]
fn a_transfer_striped_over_four_connections_is_byte_exact_on_rxe() {
    let server = rdma_server(&[]);
    let size = (16 * MIB).to_string();
    let rdma = ["--nic", device(), "--size", &size, "--pattern", "23"];
    let env = [
        ("HIPOBJ_STRIPES", "4"),
        ("HIPOBJ_STRIPE_MIN", "1048576"),
        ("HIPOBJ_STATS", "1"),
    ];
    for name in ["put-object", "get-object"] {
        let args = [&rdma[..], &[s3::BUCKET, "striped"]].concat();
        let out = run_example(&server.endpoint, name, &args, &env);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success() && stdout.contains("via rdma"),
            "{name}: {}\n{stdout}\n{stderr}",
            out.status
        );
        let stats = stderr
            .lines()
            .find(|l| l.starts_with("hipobj-stats:"))
            .unwrap_or_else(|| panic!("{name}: no stats line: {stderr}"));
        assert!(
            stats.split_whitespace().any(|p| p == "handshakes=4"),
            "{name}: one connection per share: {stats}"
        );
        eprintln!("{name}: {}", stdout.trim_end());
    }
    let stored = std::fs::metadata(server.root().join(s3::BUCKET).join("striped")).expect("stored");
    assert_eq!(stored.len(), 16 * MIB as u64);
    // A client of version 2 (as before striping) refuses the server's
    // version-3 connect request; the server asks again in version 2 at
    // once: the GET goes through on one connection.
    let args = [&rdma[..], &[s3::BUCKET, "striped"]].concat();
    let env = [
        ("HIPOBJ_PROTOCOL", "2"),
        ("HIPOBJ_STRIPES", "4"),
        ("HIPOBJ_STATS", "1"),
    ];
    let out = run_example(&server.endpoint, "get-object", &args, &env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("via rdma"),
        "a version-2 client: {}\n{stderr}",
        out.status
    );
    assert!(stderr.contains("handshakes=1 "), "{stderr}");
}

#[test]
fn ranged_gets_at_odd_offsets() {
    let server = rdma_server(&[]);
    let size = MIB + 12_345;
    let size_arg = size.to_string();
    example(
        &server,
        "put-object",
        &[
            "--nic",
            device(),
            "--size",
            &size_arg,
            "--pattern",
            "5",
            s3::BUCKET,
            "ranged",
        ],
        &[],
        "rdma",
    );
    for (offset, len) in [(1, 4097), (65_537, 333_333), (size - 7, 7), (3, size - 3)] {
        let (offset, len) = (offset.to_string(), len.to_string());
        example(
            &server,
            "get-object",
            &[
                "--nic",
                device(),
                "--offset",
                &offset,
                "--size",
                &len,
                "--pattern",
                "5",
                s3::BUCKET,
                "ranged",
            ],
            &[],
            "rdma",
        );
    }
}

#[test]
fn three_part_multipart_upload_reads_back_whole() {
    let server = rdma_server(&[]);
    let size = (15 * MIB + 4321).to_string();
    let line = example(
        &server,
        "put-object",
        &[
            "--nic",
            device(),
            "--parts",
            "3",
            "--size",
            &size,
            "--pattern",
            "23",
            s3::BUCKET,
            "parts",
        ],
        &[],
        "rdma",
    );
    assert!(line.contains("in 3 parts"), "{line}");
    example(
        &server,
        "get-object",
        &[
            "--nic",
            device(),
            "--size",
            &size,
            "--pattern",
            "23",
            s3::BUCKET,
            "parts",
        ],
        &[],
        "rdma",
    );
}

#[test]
fn sixteen_threads_share_eight_connections() {
    let server = rdma_server(&[]);
    let env = [("HIPOBJ_MAX_TRANSFERS", "8")];
    let common = [
        "--nic",
        device(),
        "--threads",
        "16",
        "--iterations",
        "4",
        "--size",
        "262147",
        "--pattern",
        "31",
    ];
    example(
        &server,
        "put-object",
        &[&common[..], &[s3::BUCKET, "threads"]].concat(),
        &env,
        "rdma",
    );
    example(
        &server,
        "get-object",
        &[&common[..], &[s3::BUCKET, "threads"]].concat(),
        &env,
        "rdma",
    );
}

#[test]
fn the_application_driven_token_path_moves_bytes() {
    let server = rdma_server(&[]);
    let size = (3 * MIB + 5).to_string();
    example(
        &server,
        "put-object",
        &[
            "--nic",
            device(),
            "--size",
            &size,
            "--pattern",
            "41",
            s3::BUCKET,
            "token",
        ],
        &[],
        "rdma",
    );
    example(
        &server,
        "token-get",
        &[
            "--nic",
            device(),
            "--size",
            &size,
            "--pattern",
            "41",
            s3::BUCKET,
            "token",
        ],
        &[],
        "rdma",
    );
}

#[test]
fn a_server_without_transport_0x02_ends_in_the_http_fallback() {
    let server = S3Server::start(&server_binary(), server_ip(), &["--no-rdma"]);
    assert!(!server.rdma);
    let size = (2 * MIB + 1).to_string();
    let args = [
        "--nic",
        device(),
        "--size",
        &size,
        "--pattern",
        "7",
        s3::BUCKET,
        "plain",
    ];
    example(&server, "put-object", &args, &[], "fallback");
    example(&server, "get-object", &args, &[], "fallback");
    let ranged = [
        "--nic",
        device(),
        "--offset",
        "99",
        "--size",
        "1001",
        "--pattern",
        "7",
        s3::BUCKET,
        "plain",
    ];
    example(&server, "get-object", &ranged, &[], "fallback");
}

/// `hipObjInit` with `rxe0` as the NIC and no GPU, as the in-process tests
/// need it.
fn init_gpu_less_on_rxe0() {
    let hint = CString::new(device()).unwrap();
    let mut config = hipObjConfig_t {
        endpoint: std::ptr::null(),
        region: std::ptr::null(),
        accessKey: std::ptr::null(),
        secretKey: std::ptr::null(),
        flags: 0,
        gpuDevice: -1,
        nicHint: hint.as_ptr(),
    };
    // SAFETY: a valid config whose strings outlive the call.
    let init = unsafe { hipObjInit(&mut config) };
    assert_eq!(init.opError, hipObjOpError_t::hipObjSuccess);
}

/// The application of the in-process tests: signed requests through the
/// `curl` command, the token in `x-amz-rdma-token`.
struct CurlApp {
    endpoint: String,
    key: String,
    reply: Vec<u8>,
}

impl CurlApp {
    /// GETs the object with `token`, keeping `x-amz-rdma-reply`; false if
    /// the HTTP exchange itself failed.
    fn get_with_token(&mut self, token: &str) -> bool {
        let url = format!("{}/{}/{}", self.endpoint, s3::BUCKET, self.key);
        let output = s3::curl(
            &url,
            &["-X", "GET", "-H", &format!("x-amz-rdma-token: {token}")],
        )
        .expect("curl runs");
        if !output.status.success() {
            eprintln!(
                "curl: {}",
                String::from_utf8_lossy(&output.stderr).trim_end()
            );
            return false;
        }
        let headers = String::from_utf8_lossy(&output.stdout).into_owned();
        self.reply = headers
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("x-amz-rdma-reply")
                    .then(|| value.trim().as_bytes().to_vec())
            })
            .unwrap_or_else(|| b"err".to_vec());
        true
    }
}

unsafe extern "C" fn curl_send(ctx: *mut c_void, token: *const c_char, len: usize) -> c_int {
    // SAFETY: ctx is the &mut CurlApp the test passes; `token` has `len`
    // bytes of hex digits.
    let (app, token) = unsafe {
        (
            &mut *ctx.cast::<CurlApp>(),
            std::slice::from_raw_parts(token.cast::<u8>(), len),
        )
    };
    let token = std::str::from_utf8(token).expect("hex digits");
    if app.get_with_token(token) {
        0
    } else {
        -1
    }
}

unsafe extern "C" fn curl_recv(ctx: *mut c_void, reply: *mut c_char, len: *mut usize) -> c_int {
    // SAFETY: as above; `reply` has `*len` (512) writable bytes, more than
    // any reply value the server sends.
    unsafe {
        let app = &*ctx.cast::<CurlApp>();
        assert!(app.reply.len() <= *len);
        std::ptr::copy_nonoverlapping(app.reply.as_ptr(), reply.cast::<u8>(), app.reply.len());
        *len = app.reply.len();
    }
    0
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let [low, ..] = i.to_le_bytes();
            let [page, ..] = (i >> 11).to_le_bytes();
            low.wrapping_mul(31).wrapping_add(seed) ^ page
        })
        .collect()
}

#[test]
fn a_server_killed_mid_transfer_fails_the_transfer_and_the_next_one_succeeds() {
    const TIMEOUT_MS: u64 = 3000;
    // Read at init: the deadline of every wait of a transfer.
    std::env::set_var("HIPOBJ_COMPLETION_TIMEOUT_MS", TIMEOUT_MS.to_string());
    let object = pattern(MIB, 3);
    // The dying server moves the data, then waits before its final message:
    // the kill lands between the two, while the client waits.
    let mut dying = rdma_server(&["--delay-final-ms", "20000"]);
    std::fs::write(dying.root().join(s3::BUCKET).join("k"), &object).expect("the object");

    init_gpu_less_on_rxe0();
    let mut buf = vec![0u8; MIB];
    let mut ops = hipObjOps_t {
        sendRequest: Some(curl_send),
        recvReply: Some(curl_recv),
    };
    let mut app = CurlApp {
        endpoint: dying.endpoint.clone(),
        key: "k".into(),
        reply: Vec::new(),
    };
    // SAFETY: the buffer is valid for its length and outlives its registration.
    let registered = unsafe { hipObjBufRegisterHost(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(registered.opError, hipObjOpError_t::hipObjSuccess);

    // The buffer is reached through this address only while a transfer or
    // the killer may touch it: no Rust reference to it is live meanwhile.
    let (addr, len) = (buf.as_mut_ptr() as usize, buf.len());
    let get = |app: &mut CurlApp, ops: &mut hipObjOps_t| {
        // SAFETY: the buffer (registered), ops and app outlive the call.
        unsafe {
            hipObjGet(
                std::ptr::null_mut(),
                addr as *mut c_void,
                len,
                0,
                ops,
                (app as *mut CurlApp).cast(),
            )
        }
    };
    // The kill must land while the client waits for the final message:
    // after the server's WRITE landed (the last non-zero byte of the object
    // is in the buffer), before the final message it holds back.
    let last = object
        .iter()
        .rposition(|b| *b != 0)
        .expect("a non-zero byte");
    let (failed, killed_at) = std::thread::scope(|scope| {
        let killer = scope.spawn(|| {
            let give_up = Instant::now() + Duration::from_secs(60);
            loop {
                // SAFETY: `addr + last` is inside the live buffer; a volatile
                // read of a byte the NIC may be writing yields some u8.
                let byte = unsafe { std::ptr::read_volatile((addr + last) as *const u8) };
                if byte == object[last] {
                    break;
                }
                assert!(Instant::now() < give_up, "the server's WRITE never landed");
                std::thread::sleep(Duration::from_millis(5));
            }
            dying.kill();
            Instant::now()
        });
        let result = get(&mut app, &mut ops);
        (result, killer.join().expect("the killer"))
    });
    let took = killed_at.elapsed();
    assert_ne!(
        failed.opError,
        hipObjOpError_t::hipObjSuccess,
        "the killed transfer failed"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS + 2000),
        "the killed transfer ended {took:?} after the kill, past its deadline"
    );
    eprintln!(
        "killed mid-transfer: {:?}, {took:?} after the kill",
        failed.opError
    );

    // A new server on the same objects; the same instance serves the next
    // transfer.
    // SAFETY: the buffer is live and no transfer runs.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0, len) };
    let fresh = S3Server::start_at(
        &server_binary(),
        server_ip(),
        dying.root(),
        &["--device", server_device()],
    );
    app.endpoint = fresh.endpoint.clone();
    let again = get(&mut app, &mut ops);
    assert_eq!(
        again.opError,
        hipObjOpError_t::hipObjSuccess,
        "the next transfer"
    );
    assert_eq!(app.reply, b"200");
    assert!(buf == object, "the next transfer's bytes are the object's");
    // SAFETY: registered above.
    let deregistered = unsafe { hipObjBufDeregister(buf.as_mut_ptr().cast()) };
    assert_eq!(deregistered.opError, hipObjOpError_t::hipObjSuccess);
    assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
    std::env::remove_var("HIPOBJ_COMPLETION_TIMEOUT_MS");
}

#[test]
fn a_connection_attempt_without_the_proof_is_refused() {
    use hipobj::core::protocol::encode_connect;
    use hipobj::core::token::Token;
    use hipobj::platform::Access;
    use hipobj::server::{DialPolicy, LocalBuf, Op, ServerConfig, ServerSide};

    init_gpu_less_on_rxe0();
    let mut buf = vec![0u8; 65_536];
    let mut text: *mut c_char = std::ptr::null_mut();
    // SAFETY: a valid buffer, registered before its token is asked for.
    unsafe {
        let r = hipObjBufRegisterHost(buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(r.opError, hipObjOpError_t::hipObjSuccess);
        let r = hipObjGetRdmaToken(
            buf.as_ptr().cast(),
            buf.len(),
            HIPOBJ_RDMA_OP_GET,
            &mut text,
        );
        assert_eq!(r.opError, hipObjOpError_t::hipObjSuccess);
    }
    // SAFETY: the library returned a NUL-terminated token.
    let hex = unsafe { std::ffi::CStr::from_ptr(text) }
        .to_bytes()
        .to_vec();
    let token = Token::parse_hex(&hex).expect("the library's token");

    // The server's side, on a second context of the same device (or the
    // servers' own).
    let platform = hipobj::platform::system();
    let ctx = platform
        .verbs()
        .expect("libibverbs")
        .open(server_device())
        .expect("the lane's device");
    let pd = ctx.alloc_pd().expect("PD");
    let mut object = pattern(buf.len(), 9);
    let mr = pd
        .reg_mr(
            object.as_mut_ptr() as usize,
            object.len(),
            Access::LOCAL_WRITE,
        )
        .expect("the server's MR");
    let local = LocalBuf {
        addr: mr.addr(),
        mr,
    };
    let config = ServerConfig {
        dial: DialPolicy::any(),
        ..ServerConfig::default()
    };
    let side = ServerSide::with_config(platform.cm().expect("librdmacm"), ctx, pd, config);
    let deadline = || Instant::now() + Duration::from_secs(10);

    let mut other = token;
    other.rkey ^= 0x100;
    let mut longer = token;
    longer.length += 1;
    let attempts: [(&str, Vec<u8>); 4] = [
        ("no private data", Vec::new()),
        ("a request of another protocol", vec![0x5a; 56]),
        ("another rkey", encode_connect(&other).to_vec()),
        ("another length", encode_connect(&longer).to_vec()),
    ];
    for (what, data) in attempts {
        let refused = side.connect_with(&token, &data, deadline());
        assert!(
            refused.is_err(),
            "a connect request with {what} was accepted"
        );
        eprintln!("refused, {what}: {}", refused.err().unwrap());
    }
    assert_eq!(side.connection_count(), 0);

    // The waiting transfer survived the attempts: with the proof, it runs.
    side.serve(&token, Op::Get, &local, deadline())
        .expect("the transfer with the proof");
    // A proof is good once: the same token again is refused.
    let replayed = side.connect_with(&token, &encode_connect(&token), deadline());
    assert!(replayed.is_err(), "a replayed connect request was accepted");
    // SAFETY: the registered buffer and the token of this test.
    unsafe {
        let r = hipObjBufSync(buf.as_mut_ptr().cast(), buf.len(), 0, HIPOBJ_SYNC_TO_DEVICE);
        assert_eq!(
            r.opError,
            hipObjOpError_t::hipObjSuccess,
            "the final message arrived"
        );
        assert_eq!(
            hipObjPutRdmaToken(text).opError,
            hipObjOpError_t::hipObjSuccess
        );
    }
    assert!(buf == object, "the GET's bytes landed");
    drop(side);
    // SAFETY: registered above.
    let r = unsafe { hipObjBufDeregister(buf.as_mut_ptr().cast()) };
    assert_eq!(r.opError, hipObjOpError_t::hipObjSuccess);
    assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
}

/// haproxy in front of `servers`: Debian's package, round robin per HTTP
/// request (`option http-server-close`), in the foreground. Killed on drop.
struct Haproxy {
    child: std::process::Child,
    endpoint: String,
    _config: PathBuf,
}

impl Haproxy {
    fn start(servers: &[&S3Server], dir: &std::path::Path) -> Haproxy {
        let port = std::net::TcpListener::bind((ip(), 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let backends: String = servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let addr = s.endpoint.trim_start_matches("http://");
                format!("    server s{i} {addr}\n")
            })
            .collect();
        let config = dir.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n    maxconn 512\n\ndefaults\n    mode http\n    timeout connect 10s\n    \
                 timeout client 120s\n    timeout server 120s\n    option http-server-close\n\n\
                 frontend s3\n    bind {}:{port}\n    default_backend servers\n\n\
                 backend servers\n    balance roundrobin\n{backends}",
                ip()
            ),
        )
        .expect("haproxy's configuration");
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&config)
            .spawn()
            .expect("haproxy runs (scripts/vm/setup.sh installs it)");
        let endpoint = format!("http://{}:{port}", ip());
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect((ip(), port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "haproxy did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Haproxy {
            child,
            endpoint,
            _config: config,
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An example run against `endpoint` (not a server of ours directly);
/// a failure shows the servers' `logs`.
fn example_at(
    endpoint: &str,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    logs: &[PathBuf],
) -> String {
    let output = run_example(endpoint, name, args, env);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let server_logs = || {
        logs.iter()
            .map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                format!("== {}\n{text}", log.display())
            })
            .collect::<String>()
    };
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        server_logs()
    );
    assert!(
        stdout.contains("via rdma"),
        "{name} {args:?}: {stdout}\n{}",
        server_logs()
    );
    stdout
}

#[test]
fn three_servers_behind_haproxy_serve_mixed_threads_every_transfer_proven() {
    let root = S3Server::new_root();
    let logs: Vec<PathBuf> = (0..3)
        .map(|i| root.join(format!("server{i}.log")))
        .collect();
    // The servers dial the client's address on the fabric: behind a load
    // balancer, a request's source is the balancer, not the client.
    let allow = format!("{}/32", ip());
    let extra = ["--device", server_device(), "--rdma-allow", &allow];
    let roots: Vec<PathBuf> = (0..3).map(|_| S3Server::root_sharing(&root)).collect();
    let servers: Vec<S3Server> = logs
        .iter()
        .zip(&roots)
        .map(|(log, own)| S3Server::start_logged(&server_binary(), server_ip(), own, &extra, log))
        .collect();
    assert!(servers.iter().all(|s| s.rdma));
    let proxy = Haproxy::start(&servers.iter().collect::<Vec<_>>(), &root);
    let env = [("HIPOBJ_MAX_TRANSFERS", "16")];
    let args = |key: &'static str, pattern: &'static str| {
        vec![
            "--nic",
            device(),
            "--threads",
            "8",
            "--iterations",
            "6",
            "--size",
            "262147",
            "--pattern",
            pattern,
            s3::BUCKET,
            key,
        ]
    };
    // The objects the GETs read, first.
    example_at(
        &proxy.endpoint,
        "put-object",
        &args("readers", "51"),
        &env,
        &logs,
    );
    // 16 threads at once, 8 of GETs and 8 of PUTs, in two processes:
    // consecutive requests of a thread land on different servers.
    std::thread::scope(|s| {
        let getter = s.spawn(|| {
            example_at(
                &proxy.endpoint,
                "get-object",
                &args("readers", "51"),
                &env,
                &logs,
            )
        });
        let putter = s.spawn(|| {
            example_at(
                &proxy.endpoint,
                "put-object",
                &args("writers", "52"),
                &env,
                &logs,
            )
        });
        eprintln!("{}", getter.join().unwrap().trim_end());
        eprintln!("{}", putter.join().unwrap().trim_end());
    });
    // What was PUT reads back, byte for byte (the pattern is checked).
    example_at(
        &proxy.endpoint,
        "get-object",
        &args("writers", "52"),
        &env,
        &logs,
    );
    drop(proxy);
    drop(servers);
    // Every RDMA transfer ended with its proof checked by the client; the
    // servers' logs say how each was proven, and each served some.
    let mut total = 0;
    for log in &logs {
        let text = std::fs::read_to_string(log).expect("a server's log");
        let ok = text.lines().filter(|l| l.contains(": ok in ")).count();
        let failed = text.lines().filter(|l| l.contains("failed after")).count();
        let connected = text
            .lines()
            .filter(|l| l.contains("(connected with the token)"))
            .count();
        let proved = text
            .lines()
            .filter(|l| l.contains("(proved on its connection)"))
            .count();
        eprintln!(
            "{}: {ok} transfers ({connected} connected with the token, {proved} proved on a \
             kept connection), {failed} failed",
            log.display()
        );
        assert!(ok > 0, "{}: the balancer sent it nothing", log.display());
        assert_eq!(failed, 0, "{}:\n{text}", log.display());
        assert_eq!(ok, connected + proved);
        total += ok;
    }
    // 3 runs of 8 threads x 6 iterations, plus the concurrent PUTs.
    assert_eq!(total, 4 * 8 * 6, "every transfer went by RDMA");
    for dir in roots.iter().chain([&root]) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

const GIB: u64 = 1 << 30;

/// Byte `j` of the examples' `--pattern SEED` payload (`ex_pattern_byte`
/// in examples/s3common.c): a function of the object offset alone.
fn example_pattern_byte(seed: u64, j: u64) -> u8 {
    let mut z = (j / 8).wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z ^= z >> 30;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> (8 * (j % 8))).to_le_bytes()[0]
}

/// An object past 2^31 bytes (2 GiB + 3 MiB + 7), PUT and GET whole by
/// RDMA: a registration, a window, a token length (40 bits) and byte
/// counts past 31 bits, the server's work requests at offsets past them;
/// then a ranged GET across the 2 GiB mark; every byte checked by the
/// examples. (What 3 GiB would prove, at two thirds of the bytes under the
/// lane's emulation.)
#[test]
fn an_object_past_2_gib_moves_whole_and_ranged_by_rdma_byte_exact() {
    // Room for the object, and time: the server's deadline is per
    // transfer (10 s by default), and rxe in the emulated VM moves tens of
    // MiB/s.
    let server = rdma_server(&[
        "--rdma-memory-bytes",
        &(4 * GIB).to_string(),
        "--rdma-timeout-ms",
        "600000",
    ]);
    let len = 2 * GIB + 3 * MIB as u64 + 7;
    let size = len.to_string();
    // An RDMA transfer's HTTP response is silent until its data has moved:
    // minutes here.
    let stall = ["--stall-seconds", "1200"];
    let rdma = [
        "--nic",
        device(),
        "--size",
        &size,
        "--pattern",
        "21",
        stall[0],
        stall[1],
    ];
    example(
        &server,
        "put-object",
        &[&rdma[..], &[s3::BUCKET, "huge"]].concat(),
        &[],
        "rdma",
    );
    let stored = std::fs::metadata(server.root().join(s3::BUCKET).join("huge")).expect("stored");
    assert_eq!(stored.len(), len);
    example(
        &server,
        "get-object",
        &[&rdma[..], &[s3::BUCKET, "huge"]].concat(),
        &[],
        "rdma",
    );
    let (offset, len) = (
        (2 * GIB - MIB as u64 - 3).to_string(),
        (2 * MIB + 5).to_string(),
    );
    example(
        &server,
        "get-object",
        &[
            "--nic",
            device(),
            "--offset",
            &offset,
            "--size",
            &len,
            "--pattern",
            "21",
            "--stall-seconds",
            "1200",
            s3::BUCKET,
            "huge",
        ],
        &[],
        "rdma",
    );
}

/// A ranged GET across the 4 GiB mark of a 4 GiB + 2 MiB object (sparse
/// on the server's disk but for the 2 MiB around the mark, which hold the
/// examples' pattern): the server reads and WRITEs a range at offsets past
/// 32 bits. A registration is at most 4 GiB (the ABI's limit), so client
/// memory has no 4 GiB mark to cross: the mark is the object's, and the
/// client's buffer is the range's. (The 2 GiB mark: the test above.) The
/// object is stored as the backend stores one, with its info file: without
/// it, the backend hashes all 4 GiB for the ETag before every GET (108 s
/// of the lane's emulated CPUs, for a 2 MiB range).
#[test]
fn a_ranged_get_across_the_4_gib_mark_of_a_larger_object() {
    use std::os::unix::fs::FileExt;
    let server = rdma_server(&["--rdma-timeout-ms", "600000"]);
    let seed = 33;
    let object_len = 4 * GIB + 2 * MIB as u64;
    let path = server.root().join(s3::BUCKET).join("sparse");
    let file = std::fs::File::create(&path).expect("the object's file");
    file.set_len(object_len).expect("the object's length");
    let range = 4 * GIB - MIB as u64..4 * GIB + MIB as u64;
    let bytes: Vec<u8> = range
        .clone()
        .map(|j| example_pattern_byte(seed, j))
        .collect();
    file.write_all_at(&bytes, range.start)
        .expect("the bytes around the mark");
    drop(file);
    // The local backend's info file, with an ETag of the form a multipart
    // upload's has, which is not a hash of the body.
    std::fs::write(
        hipobj::gateway::local::info_file(server.root(), s3::BUCKET, "sparse"),
        r#"{"e_tag":"4a0f5c1b2e3d4c5b6a798877665544ff-2"}"#,
    )
    .expect("the object's info file");
    let (offset, len) = (
        range.start.to_string(),
        (range.end - range.start).to_string(),
    );
    example(
        &server,
        "get-object",
        &[
            "--nic",
            device(),
            "--offset",
            &offset,
            "--size",
            &len,
            "--pattern",
            "33",
            "--stall-seconds",
            "1200",
            s3::BUCKET,
            "sparse",
        ],
        &[],
        "rdma",
    );
}

// ---------------------------------------------------------------- the command

/// The `hipobj` command, built with this test binary.
/// The command.
fn command_path() -> PathBuf {
    lane::program("hipobj", env!("CARGO_BIN_EXE_hipobj"))
}

/// A scratch directory for the command's files and its HOME.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hipobj-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Runs `hipobj ARGS` against `server`, keys from the environment.
fn hipobj(server: &S3Server, home: &Path, args: &[&str]) -> Output {
    let out = Command::new(command_path())
        .args(args)
        .env("HOME", home)
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_KEY)
        .env("AWS_ENDPOINT_URL", &server.endpoint)
        .env_remove("AWS_PROFILE")
        .env_remove("HIPOBJ_MAX_TRANSFERS")
        .output()
        .expect("hipobj runs");
    eprintln!(
        "$ hipobj {}\n{}(exit {:?})",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        out.status.code()
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `counters:` line's `name=value` pairs.
fn counter(out: &Output, name: &str) -> u64 {
    let stderr = text(out);
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("hipobj: counters: "))
        .unwrap_or_else(|| panic!("no counters line: {stderr}"));
    line.split_whitespace()
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

#[test]
fn the_command_moves_objects_by_rdma_byte_exact_and_says_so() {
    let server = rdma_server(&[]);
    let home = scratch("rdma");
    let data = pattern(20 * MIB + 5, 29);
    let input = home.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    let input = input.display().to_string();

    // doctor on rxe0: RDMA works, no GPU.
    let out = Command::new(command_path())
        .args(["doctor", "--nic", device()])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{report}");
    assert_eq!(out.status.code(), Some(2), "host memory only: {report}");
    assert!(report.contains("host memory: host memory only"), "{report}");
    assert!(report.contains(&format!("ok   {}", device())), "{report}");
    assert!(report.contains("ok   RDMA CM listener"), "{report}");
    assert!(report.contains("<- chosen"), "{report}");
    let out = Command::new(command_path())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert_eq!(json["verdicts"][0]["verdict"], "host-only");
    assert_eq!(json["verdicts"][0]["nic"], device());
    assert_eq!(json["rdma"]["devices"][0]["memory_windows"]["ok"], true);

    // A multipart PUT by RDMA, three parts on three streams.
    let args = [
        "put",
        &input,
        "s3://bucket/cmd/obj",
        "--nic",
        device(),
        "--chunk",
        "8MiB",
        "--streams",
        "3",
    ];
    let out = hipobj(&server, &home, &args);
    assert!(out.status.success());
    assert!(
        text(&out).contains("multipart in 3 parts; by RDMA 3 of 3 transfers (direct 3"),
        "{}",
        text(&out)
    );
    assert_eq!((counter(&out, "direct"), counter(&out, "fallback")), (3, 0));
    let stored = std::fs::read(server.root().join(s3::BUCKET).join("cmd/obj")).unwrap();
    assert!(stored == data, "the PUT's bytes");

    // GETs by RDMA: in chunks to a file, a range to standard output.
    let output = home.join("out.bin").display().to_string();
    let out = hipobj(
        &server,
        &home,
        &["get", "s3://bucket/cmd/obj", &output, "--chunk", "4MiB"],
    );
    assert!(out.status.success());
    assert!(
        text(&out).contains("by RDMA 6 of 6 transfers"),
        "{}",
        text(&out)
    );
    assert!(std::fs::read(&output).unwrap() == data, "the GET's file");
    let out = hipobj(
        &server,
        &home,
        &[
            "get",
            "s3://bucket/cmd/obj",
            "-",
            "--range",
            "12345-1012344",
            "--json",
        ],
    );
    assert!(out.status.success());
    assert!(out.stdout == data[12_345..1_012_345], "the range");
    let summary: serde_json::Value =
        serde_json::from_str(text(&out).lines().last().unwrap()).unwrap();
    assert_eq!(
        (
            summary["rdma_direct"].as_u64(),
            summary["fallback"].as_u64()
        ),
        (Some(1), Some(0))
    );
    assert_eq!(summary["counters"]["direct_bytes"], 1_000_000);

    // cp, both ways.
    let copy = home.join("copy.bin").display().to_string();
    assert!(
        hipobj(&server, &home, &["cp", "s3://bucket/cmd/obj", &copy])
            .status
            .success()
    );
    assert!(std::fs::read(&copy).unwrap() == data);
    let out = hipobj(
        &server,
        &home,
        &["cp", &copy, "s3://bucket/cmd/copy", "--chunk", "32MiB"],
    );
    assert!(text(&out).contains("by RDMA 1 of 1"), "{}", text(&out));
    let stored = std::fs::read(server.root().join(s3::BUCKET).join("cmd/copy")).unwrap();
    assert!(stored == data);

    // bench, with a reference run.
    let bench = [
        "bench",
        "s3://bucket/bench",
        "--sizes",
        "64KiB,1MiB",
        "--streams-list",
        "1,4",
        "--count",
        "4",
        "--json",
    ];
    let out = hipobj(&server, &home, &bench);
    assert!(out.status.success());
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench --json");
    let cells = run["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 8, "2 ops x 2 sizes x 2 stream counts");
    for cell in cells {
        assert_eq!(cell["fallback"], 0, "{cell}");
        assert_eq!(cell["rdma"], cell["transfers"], "{cell}");
        assert!(cell["mib_per_s"].as_f64().unwrap() > 0.0, "{cell}");
    }
    let reference = home.join("reference.json");
    std::fs::write(&reference, &out.stdout).unwrap();
    let reference = reference.display().to_string();
    let out = hipobj(
        &server,
        &home,
        &[
            "bench",
            "s3://bucket/bench",
            "--sizes",
            "1MiB",
            "--streams-list",
            "4",
            "--count",
            "4",
            "--reference",
            &reference,
        ],
    );
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{table}");
    assert!(
        table.contains("ratio")
            && table
                .lines()
                .filter(|l| l.starts_with("get ") || l.starts_with("put "))
                .all(|l| !l.ends_with(" -")),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn the_command_shows_the_fallback_against_a_server_without_rdma() {
    let server = S3Server::start(&server_binary(), server_ip(), &["--no-rdma"]);
    assert!(!server.rdma);
    let home = scratch("fallback");
    let data = pattern(3 * MIB, 31);
    let input = home.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    let input = input.display().to_string();
    let out = hipobj(&server, &home, &["put", &input, "s3://bucket/plain"]);
    assert!(out.status.success());
    assert!(
        text(&out).contains(
            "over plain HTTP 1 of 1 transfers: the server declined RDMA (x-amz-rdma-reply 501)"
        ),
        "{}",
        text(&out)
    );
    assert_eq!(
        (counter(&out, "declined"), counter(&out, "fallback")),
        (1, 1)
    );
    let output = home.join("out.bin").display().to_string();
    let out = hipobj(&server, &home, &["get", "s3://bucket/plain", &output]);
    assert!(out.status.success());
    assert!(std::fs::read(&output).unwrap() == data);
    assert_eq!(counter(&out, "fallback_bytes"), 3 * MIB as u64);
    let out = hipobj(
        &server,
        &home,
        &["put", &input, "s3://bucket/strict", "--no-fallback"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("the fallback to plain HTTP is off"),
        "{}",
        text(&out)
    );
    assert!(!server.root().join(s3::BUCKET).join("strict").exists());
    let _ = std::fs::remove_dir_all(&home);
}

/// The built-in S3 client for `server`.
fn s3_client(server: &S3Server) -> std::sync::Arc<hipobj::s3::S3> {
    use hipobj::s3::config::{Credentials, S3Config};
    std::sync::Arc::new(
        hipobj::s3::S3::new(S3Config {
            endpoint: server.endpoint.clone(),
            region: "us-east-1".to_owned(),
            credentials: Credentials {
                access_key_id: s3::ACCESS_KEY.to_owned(),
                secret_access_key: s3::SECRET_KEY.to_owned(),
                session_token: None,
            },
            credentials_source: "given".to_owned(),
        })
        .expect("an S3 client"),
    )
}

#[test]
fn gets_in_flight_from_one_thread_by_rdma_each_verified_and_dropped_ones_cancelled() {
    use hipobj::client::{Client, Transfer};
    use hipobj::s3::objects::{self, Object, OwnedOp, OwnedRequest, Verified};

    let server = rdma_server(&[]);
    let s3 = s3_client(&server);
    const N: usize = 16;
    const LEN: usize = MIB + 5;
    let datas: Vec<Vec<u8>> = (0..N)
        .map(|i| pattern(LEN, 40 + u8::try_from(i).unwrap()))
        .collect();
    for (i, data) in datas.iter().enumerate() {
        objects::put_http(Object::new(&s3, "bucket", &format!("many/{i}")), data, true)
            .expect("a plain PUT");
    }
    let client = Client::builder()
        .nic(device())
        .max_in_flight(N)
        .build()
        .expect("a client on the lane's device");
    let submit = |i: usize| {
        let request = OwnedRequest::new(
            s3.clone(),
            "bucket",
            &format!("many/{i}"),
            OwnedOp::Get(0..LEN as u64),
        )
        .asking_checksum();
        let answer = request.answer();
        let buffer = client.host_buffer(LEN).unwrap();
        let ticket = client
            .submit(Transfer::get(buffer, 0..LEN, request))
            .expect("submitted");
        (ticket, answer)
    };
    // Sixteen in flight from this thread, each checked against the CRC
    // its server says it wrote.
    let tickets: Vec<_> = (0..N).map(submit).collect();
    for (i, (mut ticket, answer)) in tickets.into_iter().enumerate() {
        let done = ticket.wait(Some(Duration::from_secs(120))).expect("ends");
        assert_eq!(done.result.unwrap(), hipobj::client::Route::Direct);
        let response = answer.take().expect("answered").expect("no S3 error");
        let bytes = done.buffer.as_slice().unwrap();
        let verified = objects::verify_get(&format!("many/{i}"), &response, bytes).unwrap();
        assert_eq!(verified, Verified::Yes);
        assert!(bytes == &datas[i][..], "GET {i}");
    }
    assert_eq!(client.stats().library.direct, N as u64);
    // Half of the next sixteen dropped at once: cancelled, whatever their
    // servers were doing; the others land whole.
    let mut kept = Vec::new();
    for i in 0..N {
        let (ticket, answer) = submit(i);
        if i % 2 == 0 {
            kept.push((i, ticket, answer));
        } else {
            drop(ticket);
        }
    }
    for (i, mut ticket, _) in kept {
        let done = ticket.wait(Some(Duration::from_secs(120))).expect("ends");
        done.result.unwrap();
        assert!(done.buffer.as_slice().unwrap() == &datas[i][..], "GET {i}");
    }
    // Every buffer, the dropped ones' too, is released once its transfer
    // ended; the library goes on.
    let until = Instant::now() + Duration::from_secs(60);
    while client.registered_buffers() != 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        client.registered_buffers(),
        0,
        "no registration outlives its ticket"
    );
    let mut buffer = client.host_buffer(LEN).unwrap();
    let mut request =
        OwnedRequest::new(s3.clone(), "bucket", "many/3", OwnedOp::Get(0..LEN as u64));
    client.get(&mut buffer, 0..LEN, &mut request).unwrap();
    assert!(buffer.as_slice().unwrap() == &datas[3][..]);
}

#[test]
fn the_command_copies_a_tree_by_rdma_many_objects_at_a_time() {
    let server = rdma_server(&[]);
    let home = scratch("tree");
    let up = home.join("up");
    let files: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| {
            (
                format!("d{}/f{i}.bin", i % 3),
                pattern(MIB * (i % 4 + 1) + i, u8::try_from(i).unwrap()),
            )
        })
        .chain([("top.bin".to_owned(), pattern(7 * MIB, 99))])
        .collect();
    for (name, data) in &files {
        let path = up.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
    let up_s = up.display().to_string();
    let out = hipobj(
        &server,
        &home,
        &[
            "cp",
            "-r",
            &up_s,
            "s3://bucket/tree/",
            "--jobs",
            "4",
            "--chunk",
            "5MiB",
        ],
    );
    assert!(out.status.success());
    let said = text(&out);
    assert!(
        said.contains("11 objects") && said.contains("by RDMA"),
        "{said}"
    );
    assert!(!said.contains("plain HTTP"), "{said}");
    let back = home.join("back");
    let back_s = back.display().to_string();
    let out = hipobj(
        &server,
        &home,
        &[
            "cp",
            "-r",
            "s3://bucket/tree",
            &back_s,
            "--jobs",
            "4",
            "--chunk",
            "2MiB",
        ],
    );
    assert!(out.status.success());
    let said = text(&out);
    assert!(
        said.contains("11 objects") && said.contains("by RDMA"),
        "{said}"
    );
    assert!(said.contains("verified"), "{said}");
    for (name, data) in &files {
        assert!(
            std::fs::read(back.join(name)).unwrap() == *data,
            "{name} came back whole"
        );
    }
    let _ = std::fs::remove_dir_all(&home);
}
