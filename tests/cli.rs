//! The `hipobj` command on this machine, against the RDMA S3 server over
//! HTTP. This host has no RDMA device: `doctor` must say so and why, and
//! every transfer goes over plain HTTP, said in the summary, or fails with
//! `--no-fallback`. The same commands by RDMA run in the Soft-RoCE lane
//! (`tests/e2e.rs`). The progress bar is checked in a real terminal (tmux);
//! tmux is required, never skipped.

mod common;
#[path = "common/http.rs"]
mod http;
#[path = "common/s3.rs"]
mod s3server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hipobj::s3::config::{Credentials, S3Config};
use hipobj::s3::objects::{self, Object};
use hipobj::s3::S3;
use s3server::{S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};

const HIPOBJ: &str = env!("CARGO_BIN_EXE_hipobj");

fn server() -> S3Server {
    S3Server::start(
        Path::new(env!("CARGO_BIN_EXE_hipobj-s3-server")),
        "127.0.0.1",
        &[],
    )
}

/// A scratch directory, and a HOME without AWS files.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = common::profile_dir()
            .join("cli-test")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hipobj(server: &S3Server, scratch: &Scratch, args: &[&str]) -> Output {
    hipobj_with(server, scratch, args, &[], None)
}

/// `hipobj args` against the scripted `endpoint`.
fn hipobj_at(endpoint: &http::Endpoint, scratch: &Scratch, args: &[&str]) -> Output {
    hipobj_env(&endpoint.url, scratch, args, &[], None)
}

fn hipobj_with(
    server: &S3Server,
    scratch: &Scratch,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> Output {
    hipobj_env(&server.endpoint, scratch, args, env, stdin)
}

/// The command with the test keys, `endpoint`, `HOME` in the scratch
/// directory, and `env` on top.
fn command(endpoint: &str, scratch: &Scratch, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(HIPOBJ);
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &scratch.0)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_ENDPOINT_URL", endpoint)
        .envs(env.iter().copied());
    command
}

fn hipobj_env(
    endpoint: &str,
    scratch: &Scratch,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> Output {
    let mut command = command(endpoint, scratch, args, env);
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("hipobj runs");
    if let Some(bytes) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "$ hipobj {}\n{}{}(exit {:?})",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        if out.stdout.len() < 4096 {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            format!("<{} bytes on stdout>\n", out.stdout.len())
        },
        out.status.code()
    );
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[2]).wrapping_add(seed))
        .collect()
}

fn stored(server: &S3Server, key: &str) -> Option<Vec<u8>> {
    std::fs::read(server.root().join(BUCKET).join(key)).ok()
}

#[test]
fn doctor_on_this_machine_finds_no_rdma_device_and_says_why() {
    let out = Command::new(HIPOBJ).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert_eq!(out.status.code(), Some(3), "unusable: {text}");
    assert!(text.contains("no RDMA device"), "{text}");
    assert!(text.contains("host memory: unusable"), "{text}");
    assert!(text.contains("rdma link add"), "what to do: {text}");
    let out = Command::new(HIPOBJ)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["verdicts"][0]["verdict"], "unusable");
    assert_eq!(report["rdma"]["devices"].as_array().map(Vec::len), Some(0));
}

#[test]
fn put_get_and_cp_without_rdma_go_over_plain_http_byte_exact_and_say_so() {
    let server = server();
    let scratch = Scratch::new("http");
    let data = pattern((9 << 20) + 77, 3);
    std::fs::write(scratch.path("in.bin"), &data).unwrap();
    let input = scratch.path("in.bin").display().to_string();

    // Multipart: 9 MiB in parts of 5 MiB.
    let out = hipobj(
        &server,
        &scratch,
        &["put", &input, "s3://bucket/d/obj", "--chunk", "5MiB"],
    );
    assert!(out.status.success());
    let text = stderr(&out);
    assert!(text.contains("multipart in 2 parts"), "{text}");
    assert!(
        text.contains("over plain HTTP 2 of 2 transfers: no RDMA (the library did not initialize"),
        "{text}"
    );
    assert!(stored(&server, "d/obj").as_deref() == Some(&data[..]));

    let output = scratch.path("out.bin").display().to_string();
    let out = hipobj(
        &server,
        &scratch,
        &[
            "get",
            "s3://bucket/d/obj",
            &output,
            "--chunk",
            "2MiB",
            "--streams",
            "3",
        ],
    );
    assert!(out.status.success());
    assert!(std::fs::read(&output).unwrap() == data, "the GET's file");
    assert!(stderr(&out).contains("over plain HTTP 5 of 5 transfers"));

    let out = hipobj(
        &server,
        &scratch,
        &[
            "get",
            "s3://bucket/d/obj",
            "-",
            "--range",
            "1000-200999",
            "--json",
        ],
    );
    assert!(out.status.success());
    assert!(
        out.stdout == data[1000..201_000],
        "the range on standard output"
    );
    let summary: serde_json::Value =
        serde_json::from_str(stderr(&out).lines().last().unwrap()).expect("JSON on stderr");
    assert_eq!(summary["bytes"], 200_000);
    assert_eq!(summary["fallback"], 1);
    assert!(summary.get("objects").is_none(), "one object's summary");
    assert!(summary["library"]
        .as_str()
        .unwrap()
        .contains("did not initialize"));

    let copy = scratch.path("copy.bin").display().to_string();
    let out = hipobj(&server, &scratch, &["cp", "s3://bucket/d/obj", &copy]);
    assert!(out.status.success());
    assert!(std::fs::read(&copy).unwrap() == data);
    let out = hipobj(&server, &scratch, &["cp", &copy, "s3://bucket/d/again"]);
    assert!(out.status.success());
    assert!(stored(&server, "d/again").as_deref() == Some(&data[..]));

    let out = hipobj_with(
        &server,
        &scratch,
        &["put", "-", "s3://bucket/stdin"],
        &[],
        Some(b"from a pipe"),
    );
    assert!(out.status.success());
    assert_eq!(
        stored(&server, "stdin").as_deref(),
        Some(&b"from a pipe"[..])
    );
}

#[test]
fn no_fallback_makes_the_missing_library_an_error_and_sends_nothing() {
    let server = server();
    let scratch = Scratch::new("strict");
    std::fs::write(scratch.path("f"), b"bytes").unwrap();
    let input = scratch.path("f").display().to_string();
    let out = hipobj(
        &server,
        &scratch,
        &["put", &input, "s3://bucket/strict", "--no-fallback"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--no-fallback"), "{}", stderr(&out));
    assert_eq!(stored(&server, "strict"), None);
    let out = hipobj(
        &server,
        &scratch,
        &["put", &input, "s3://bucket/gpu", "--device", "0"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--device needs the library"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stored(&server, "gpu"), None);
    let out = hipobj(&server, &scratch, &["bench", "s3://bucket/b"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("bench measures the library"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn failures_are_clear_and_leave_the_destination_as_it_was() {
    let server = server();
    let scratch = Scratch::new("fail");
    let dest = scratch.path("keep.txt");
    std::fs::write(&dest, b"old contents").unwrap();
    let dest_s = dest.display().to_string();
    let out = hipobj(&server, &scratch, &["get", "s3://bucket/missing", &dest_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("404"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&dest).unwrap(), b"old contents");
    let leftovers: Vec<_> = std::fs::read_dir(&scratch.0).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no partial file left behind");

    let out = hipobj_with(
        &server,
        &scratch,
        &["put", &dest_s, "s3://bucket/x"],
        &[("AWS_SECRET_ACCESS_KEY", "wrong")],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("SignatureDoesNotMatch"),
        "{}",
        stderr(&out)
    );
    // Bad arguments exit 2; a failure, 1.
    for (args, expected, code) in [
        (vec!["get", "bucket/key", "f"], "not an s3://BUCKET/KEY", 2),
        (vec!["get", "s3://bucket", "f"], "no bucket or no key", 2),
        (
            vec!["put", "/nonexistent/file", "s3://bucket/k"],
            "No such file",
            1,
        ),
        (vec!["cp", "a", "b"], "one of SOURCE and DESTINATION", 2),
        (vec!["get", "s3://bucket/missing"], "needs a DESTINATION", 2),
    ] {
        let out = hipobj(&server, &scratch, &args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let out = hipobj(
        &server,
        &scratch,
        &["get", "s3://bucket/k", "f", "--chunk", "lots"],
    );
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert_eq!(stored(&server, "x"), None);
}

#[test]
fn credentials_come_from_a_named_profile() {
    let server = server();
    let scratch = Scratch::new("profile");
    std::fs::create_dir_all(scratch.path(".aws")).unwrap();
    std::fs::write(
        scratch.path(".aws/credentials"),
        format!(
            "[tests]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        ),
    )
    .unwrap();
    std::fs::write(scratch.path("f"), b"profiled").unwrap();
    let input = scratch.path("f").display().to_string();
    // Wrong keys in the environment: a named profile wins over them.
    let env = [("AWS_SECRET_ACCESS_KEY", "wrong")];
    let out = hipobj_with(
        &server,
        &scratch,
        &["put", &input, "s3://bucket/p", "--profile", "tests"],
        &env,
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stored(&server, "p").as_deref(), Some(&b"profiled"[..]));
    let out = hipobj_with(
        &server,
        &scratch,
        &["put", &input, "s3://bucket/q", "--profile", "nope"],
        &env,
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("\"nope\""), "{}", stderr(&out));
}

/// Runs `tmux` with `args` on the test's own server socket.
fn tmux(socket: &str, args: &[&str]) -> Output {
    Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()
        .expect(
            "tmux is required for the progress bar's terminal test (scripts/setup.sh installs it)",
        )
}

#[test]
fn a_long_transfer_shows_a_progress_bar_in_a_terminal_and_none_in_a_pipe() {
    let server = server();
    let scratch = Scratch::new("tty");
    let len = 48 << 20;
    std::fs::write(scratch.path("big"), pattern(len, 5)).unwrap();
    let socket = format!("hipobj-cli-{}", std::process::id());
    let done = scratch.path("done");
    let script = format!(
        "env -i PATH=\"$PATH\" TERM=\"$TERM\" HOME={home} AWS_ACCESS_KEY_ID={ACCESS_KEY} AWS_SECRET_ACCESS_KEY={SECRET_KEY} AWS_ENDPOINT_URL={endpoint} {HIPOBJ} put {input} s3://bucket/tty --chunk 5MiB --streams 1; echo $? > {done}; sleep 120",
        home = scratch.0.display(),
        endpoint = server.endpoint,
        input = scratch.path("big").display(),
        done = done.display(),
    );
    let started = tmux(
        &socket,
        &["new-session", "-d", "-x", "160", "-y", "20", &script],
    );
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The finished bar stays on the screen.
    let screen = tmux(&socket, &["capture-pane", "-p", "-t", "0"]);
    let _ = tmux(&socket, &["kill-server"]);
    let screen = String::from_utf8_lossy(&screen.stdout).into_owned();
    println!("--- the terminal ---\n{screen}");
    assert_eq!(
        std::fs::read_to_string(&done).unwrap_or_default().trim(),
        "0",
        "{screen}"
    );
    assert!(
        screen.contains("put s3://bucket/tty ["),
        "the bar's message: {screen}"
    );
    assert!(
        screen.contains("48.00 MiB/48.00 MiB"),
        "the bar at the end: {screen}"
    );
    assert!(
        screen.contains("=]") || screen.contains("=="),
        "the bar itself: {screen}"
    );
    // The finished bar and the summary give the same rate.
    let summary = screen
        .lines()
        .find(|l| l.contains("hipobj: put"))
        .unwrap_or_else(|| panic!("the summary: {screen}"));
    let rate = summary
        .split_once(" s (")
        .and_then(|(_, r)| r.split_once(')'))
        .map(|(r, _)| r)
        .unwrap_or_else(|| panic!("the summary's rate: {summary}"));
    let bar = screen
        .lines()
        .find(|l| l.contains("put s3://bucket/tty ["))
        .unwrap();
    assert!(
        bar.contains(rate),
        "the bar says {bar:?}, the summary {rate:?}"
    );
    assert_eq!(stored(&server, "tty").map(|b| b.len()), Some(len));

    // Through a pipe, no bar: only the summary.
    let out = hipobj(
        &server,
        &scratch,
        &[
            "put",
            &scratch.path("big").display().to_string(),
            "s3://bucket/pipe",
            "--chunk",
            "5MiB",
        ],
    );
    assert!(out.status.success());
    let text = stderr(&out);
    assert!(!text.contains("MiB/48") && !text.contains('['), "{text}");
}

// ------------------------------------------------------------------ failures

/// Stops `child` (SIGKILL) if it runs past `limit`: a "did not hang" bound.
fn wait_bounded(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().unwrap();
            panic!("hipobj ran past {limit:?} (killed: {status})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (`INT`, `TERM`) to `child`.
fn signal(child: &std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill(1) runs");
    assert!(sent.success());
}

/// Waits, bounded, until `ready` holds.
fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "waited 60 s for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The hidden files (temporary downloads) in `dir`.
fn hidden(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// A scripted answer to a ranged GET of `data` with `etag`.
fn ranged(data: &[u8], request: &http::Request, etag: &str) -> http::Reply {
    let (first, last) = request
        .header("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .map(|(a, b)| (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()))
        .unwrap_or((0, data.len() - 1));
    let last = last.min(data.len() - 1);
    http::Reply::new(
        206,
        &[
            ("etag", etag),
            (
                "content-range",
                &format!("bytes {first}-{last}/{}", data.len()),
            ),
        ],
        data[first..=last].to_vec(),
    )
}

/// A HEAD's scripted answer: `len` bytes, `etag`.
fn head(len: usize, etag: &str) -> http::Reply {
    http::Reply::new(
        200,
        &[("etag", etag), ("content-length", &len.to_string())],
        Vec::new(),
    )
}

#[test]
fn a_download_whose_object_changes_midway_fails_and_keeps_nothing() {
    let scratch = Scratch::new("changed");
    let data = pattern(3 << 20, 1);
    // The HEAD sees one version, the chunks come from another.
    let served = data.clone();
    let endpoint = http::Endpoint::start(move |r| match r.method.as_str() {
        "HEAD" => head(served.len(), "\"v1\""),
        _ => ranged(&served, r, "\"v2\""),
    });
    let dest = scratch.path("out.bin");
    let dest_s = dest.display().to_string();
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &["get", "s3://bucket/obj", &dest_s, "--chunk", "1MiB"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("changed during the download"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dest.exists() && hidden(&scratch.0).is_empty(),
        "nothing kept"
    );
    let gets: Vec<_> = endpoint
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    assert!(!gets.is_empty());
    assert!(
        gets.iter().all(|r| r.header("if-match") == Some("\"v1\"")),
        "every chunk asks for the HEAD's version: {gets:?}"
    );

    // A server that honours If-Match answers 412.
    let endpoint = http::Endpoint::start(move |r| match r.method.as_str() {
        "HEAD" => head(data.len(), "\"v1\""),
        _ => http::Reply::s3_error(
            412,
            "PreconditionFailed",
            "At least one of the pre-conditions you specified did not hold",
        ),
    });
    let out = hipobj_at(&endpoint, &scratch, &["get", "s3://bucket/obj", &dest_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("changed during the download"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dest.exists() && hidden(&scratch.0).is_empty(),
        "nothing kept"
    );
}

#[test]
fn a_put_refused_before_its_body_is_sent_says_why() {
    let server = server();
    let scratch = Scratch::new("refused");
    // Larger than the sockets' buffers: the server answers before it has
    // read the body, and closes.
    std::fs::write(scratch.path("big"), pattern(24 << 20, 2)).unwrap();
    let input = scratch.path("big").display().to_string();
    let out = hipobj_with(
        &server,
        &scratch,
        &["put", &input, "s3://bucket/refused"],
        &[("AWS_ACCESS_KEY_ID", "nobody")],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    // The server's own answer: this one says NotSignedUp, AWS says
    // InvalidAccessKeyId.
    assert!(
        text.contains("HTTP 403 NotSignedUp") && text.contains("check the access key"),
        "{text}"
    );
    assert!(!text.contains("Broken pipe"), "{text}");
}

#[test]
fn a_failed_get_says_s3_s_error_code_and_what_to_check() {
    let server = server();
    let scratch = Scratch::new("codes");
    std::fs::write(server.root().join(BUCKET).join("there"), b"bytes").unwrap();
    let dest = scratch.path("f").display().to_string();
    for (what, env, key, expected) in [
        (
            "a wrong secret",
            ("AWS_SECRET_ACCESS_KEY", "wrong"),
            "there",
            &["403 SignatureDoesNotMatch", "check the secret key"][..],
        ),
        (
            "a missing key",
            ("AWS_REGION", "us-east-1"),
            "not-there",
            &["404 NoSuchKey"][..],
        ),
        (
            "a wrong region",
            ("AWS_REGION", "eu-west-3"),
            "there",
            &["400 AuthorizationHeaderMalformed", "eu-west-3", "us-east-1"][..],
        ),
    ] {
        let source = format!("s3://bucket/{key}");
        let out = hipobj_with(&server, &scratch, &["get", &source, &dest], &[env], None);
        assert_eq!(out.status.code(), Some(1), "{what}");
        for part in expected {
            assert!(stderr(&out).contains(part), "{what}: {}", stderr(&out));
        }
    }
}

#[test]
fn a_head_answered_5xx_is_retried_but_never_asked_again_as_a_get() {
    let scratch = Scratch::new("head-5xx");
    let dest = scratch.path("f").display().to_string();
    // A gateway whose store does not answer: each request costs it its
    // upstream time-out, then a 503.
    let endpoint = http::Endpoint::start(|_| {
        http::Reply::s3_error(503, "SlowDown", "the store did not answer in time")
    });
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &["get", "s3://bucket/obj", &dest, "--retries", "2"],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains("HEAD bucket/obj") && text.contains("HTTP 503"),
        "{text}"
    );
    assert_eq!(endpoint.count("HEAD"), 3, "the HEAD and its 2 retries");
    assert_eq!(
        endpoint.count("GET"),
        0,
        "no GET of the first byte for the words of a 5xx"
    );
    // A 4xx is not retried, and its words are asked for (a HEAD's answer
    // has no body).
    let endpoint = http::Endpoint::start(|_| {
        http::Reply::s3_error(404, "NoSuchKey", "The specified key does not exist.")
    });
    let out = hipobj_at(&endpoint, &scratch, &["get", "s3://bucket/obj", &dest]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("404 NoSuchKey"), "{}", stderr(&out));
    assert_eq!((endpoint.count("HEAD"), endpoint.count("GET")), (1, 1));
}

#[test]
fn network_failures_name_the_endpoint_and_what_to_check() {
    let server = server();
    let scratch = Scratch::new("network");
    let dest = scratch.path("f").display().to_string();
    // A port that nothing listens on: bound, then let go.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let out = hipobj_env(
        &closed,
        &scratch,
        &["get", "s3://bucket/x", &dest],
        &[],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains(&closed)
            && text.contains("is the server up")
            && text.contains("AWS_ENDPOINT_URL"),
        "{text}"
    );
    // https:// against a plain HTTP server.
    let https = server.endpoint.replace("http://", "https://");
    let out = hipobj_env(
        &https,
        &scratch,
        &["get", "s3://bucket/x", &dest],
        &[],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains(&https) && text.contains("write http://"),
        "{text}"
    );
}

#[test]
fn a_missing_destination_directory_is_named_not_the_temporary_file() {
    let server = server();
    let scratch = Scratch::new("nodir");
    std::fs::write(server.root().join(BUCKET).join("x.bin"), b"bytes").unwrap();
    let dest = scratch.path("nodir/x.bin").display().to_string();
    let out = hipobj(&server, &scratch, &["get", "s3://bucket/x.bin", &dest]);
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(text.contains(&dest) && !text.contains(".hipobj-"), "{text}");
}

#[test]
fn a_directory_destination_takes_the_object_s_base_name() {
    let server = server();
    let scratch = Scratch::new("dirs");
    let data = pattern(100_000, 4);
    std::fs::create_dir_all(server.root().join(BUCKET).join("d")).unwrap();
    std::fs::write(server.root().join(BUCKET).join("d/obj.bin"), &data).unwrap();
    std::fs::create_dir(scratch.path("dl")).unwrap();
    let dl = format!("{}/", scratch.path("dl").display());
    let out = hipobj(&server, &scratch, &["cp", "s3://bucket/d/obj.bin", &dl]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(scratch.path("dl/obj.bin")).unwrap() == data);
    // An existing directory without the slash, as `.` is.
    let dir = scratch.path("dl").display().to_string();
    std::fs::remove_file(scratch.path("dl/obj.bin")).unwrap();
    let out = hipobj(&server, &scratch, &["get", "s3://bucket/d/obj.bin", &dir]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(scratch.path("dl/obj.bin")).unwrap() == data);
    // An upload into a prefix.
    let input = scratch.path("dl/obj.bin").display().to_string();
    let out = hipobj(&server, &scratch, &["put", &input, "s3://bucket/up/"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stored(&server, "up/obj.bin").as_deref() == Some(&data[..]));
    // Standard input has no name to take.
    let out = hipobj_with(
        &server,
        &scratch,
        &["put", "-", "s3://bucket/up/"],
        &[],
        Some(b"x"),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn ctrl_c_of_a_download_exits_130_and_leaves_no_temporary_file() {
    let scratch = Scratch::new("sigint-get");
    let len = 32 << 20;
    // The object's bytes start, then stop coming: the download hangs.
    let endpoint = http::Endpoint::start(move |r| match r.method.as_str() {
        "HEAD" => head(len, "\"v1\""),
        _ => http::Reply::Stall {
            headers: vec![("etag".into(), "\"v1\"".into())],
            len: 8 << 20,
            sent: 1 << 20,
        },
    });
    let dest = scratch.path("big.bin");
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let mut child = command(
            &endpoint.url,
            &scratch,
            &[
                "get",
                "s3://bucket/big",
                &dest.display().to_string(),
                "--chunk",
                "8MiB",
            ],
            &[],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let gets = endpoint.count("GET");
        wait_for("the download to start", || endpoint.count("GET") > gets);
        wait_for("the temporary file", || !hidden(&scratch.0).is_empty());
        signal(&child, sig);
        let status = wait_bounded(&mut child, Duration::from_secs(60));
        assert_eq!(status.code(), Some(code), "SIG{sig}: {status}");
        assert!(
            hidden(&scratch.0).is_empty(),
            "SIG{sig}: {:?}",
            hidden(&scratch.0)
        );
        assert!(!dest.exists());
    }
}

#[test]
fn ctrl_c_of_a_multipart_upload_aborts_it() {
    use std::io::BufRead;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let server = server();
    let scratch = Scratch::new("sigint-put");
    std::fs::write(scratch.path("big"), pattern(15 << 20, 6)).unwrap();
    // In front of the real server: the second part waits for the test.
    let held = Arc::new(AtomicBool::new(false));
    let released = Arc::new(AtomicBool::new(false));
    let upstream = server.endpoint.clone();
    let endpoint = {
        let (held, released) = (held.clone(), released.clone());
        http::Endpoint::start(move |r| {
            if r.query("partNumber").is_some_and(|n| n != "1") {
                held.store(true, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(60);
                while !released.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            http::forward(&upstream, r)
        })
    };
    let input = scratch.path("big").display().to_string();
    let mut child = command(
        &endpoint.url,
        &scratch,
        &[
            "put",
            &input,
            "s3://bucket/big",
            "--chunk",
            "5MiB",
            "--streams",
            "1",
        ],
        &[],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for("the second part", || held.load(Ordering::SeqCst));
    signal(&child, "INT");
    // Released once the command says it stopped (or has died).
    let lines = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            eprintln!("{line}");
            if line.contains("interrupted") {
                let _ = tx.send(());
            }
        }
    });
    let _ = rx.recv_timeout(Duration::from_secs(60));
    released.store(true, Ordering::SeqCst);
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(
        endpoint
            .requests()
            .iter()
            .any(|r| r.method == "DELETE" && r.has_query("uploadId")),
        "the upload was aborted"
    );
    let parts: Vec<_> = std::fs::read_dir(server.root())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".upload_id-"))
        .collect();
    assert!(parts.is_empty(), "parts left on the server: {parts:?}");
    assert_eq!(stored(&server, "big"), None);
}

#[test]
fn failed_requests_are_retried_and_counted_but_never_a_4xx() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let scratch = Scratch::new("retries");
    let data = pattern(3 << 20, 8);
    // A 503, then a dropped connection, then the bytes.
    let gets = AtomicUsize::new(0);
    let served = data.clone();
    let endpoint = http::Endpoint::start(move |r| match r.method.as_str() {
        "HEAD" => head(served.len(), "\"v1\""),
        _ => match gets.fetch_add(1, Ordering::SeqCst) % 3 {
            0 => http::Reply::s3_error(503, "SlowDown", "Please reduce your request rate."),
            1 => http::Reply::Close,
            _ => ranged(&served, r, "\"v1\""),
        },
    });
    let dest = scratch.path("out.bin");
    let dest_s = dest.display().to_string();
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &["get", "s3://bucket/obj", &dest_s, "--chunk", "4MiB"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&dest).unwrap() == data);
    assert!(
        stderr(&out).contains("2 requests retried"),
        "{}",
        stderr(&out)
    );
    assert_eq!(endpoint.count("GET"), 3);

    // --retries 0: the first 503 fails the download.
    std::fs::remove_file(&dest).unwrap();
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &[
            "get",
            "s3://bucket/obj",
            &dest_s,
            "--chunk",
            "4MiB",
            "--retries",
            "0",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("503 SlowDown"), "{}", stderr(&out));
    assert!(!dest.exists());

    // A refusal is final.
    let endpoint = http::Endpoint::start(move |r| match r.method.as_str() {
        "HEAD" => head(data.len(), "\"v1\""),
        _ => http::Reply::s3_error(403, "AccessDenied", "Access Denied"),
    });
    let out = hipobj_at(&endpoint, &scratch, &["get", "s3://bucket/obj", &dest_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("403 AccessDenied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(endpoint.count("GET"), 1, "a 403 is not retried");
}

#[test]
fn range_errors_are_usage_errors_and_suffix_ranges_take_the_end() {
    let server = server();
    let scratch = Scratch::new("ranges");
    let data = pattern(1000, 9);
    std::fs::write(server.root().join(BUCKET).join("r"), &data).unwrap();
    let dest = scratch.path("r").display().to_string();
    for (range, expected) in [
        ("100-10", "before its first"),
        ("x-1", "FIRST-LAST"),
        ("5000-", "past the object's end"),
    ] {
        let arg = format!("--range={range}");
        let out = hipobj(&server, &scratch, &["get", "s3://bucket/r", &dest, &arg]);
        assert_eq!(out.status.code(), Some(2), "{range}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{range}: {}", stderr(&out));
    }
    for args in [["--range", "-100"], ["--range=-100", "--no-progress"]] {
        let mut all = vec!["get", "s3://bucket/r", &dest];
        all.extend(args);
        let out = hipobj(&server, &scratch, &all);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(
            std::fs::read(&dest).unwrap() == data[900..],
            "the last 100 bytes"
        );
    }
}

#[test]
fn a_tiny_transfer_says_its_rate_in_fitting_units_and_its_fallback_once() {
    let server = server();
    let scratch = Scratch::new("tiny");
    std::fs::write(scratch.path("f"), b"ten bytes!").unwrap();
    let input = scratch.path("f").display().to_string();
    let out = hipobj(&server, &scratch, &["put", &input, "s3://bucket/tiny"]);
    assert!(out.status.success());
    let text = stderr(&out);
    assert!(
        !text.contains("(0.0 MiB/s)") && text.contains("B/s)"),
        "{text}"
    );
    assert_eq!(text.matches("did not initialize").count(), 1, "{text}");
}

#[test]
fn bench_over_plain_http_gives_a_baseline_and_its_help_lists_its_own_options() {
    let server = server();
    let scratch = Scratch::new("bench");
    let out = hipobj(
        &server,
        &scratch,
        &[
            "bench",
            "s3://bucket/b",
            "--http",
            "--sizes",
            "64KiB",
            "--streams-list",
            "1,2",
            "--count",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("plain HTTP"), "{table}");
    assert_eq!(
        table.matches("plain HTTP").count(),
        5,
        "4 cells and the title: {table}"
    );
    // Without the library and without --http, the way out is named.
    let out = hipobj(&server, &scratch, &["bench", "s3://bucket/b"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--http"), "{}", stderr(&out));

    let help = Command::new(HIPOBJ)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for absent in ["--streams <", "--chunk", "--no-progress", "standard output"] {
        assert!(!help.contains(absent), "{absent}: {help}");
    }
}

#[test]
fn device_without_a_gpu_says_no_gpu_was_found_and_names_each_runtime() {
    let server = server();
    let scratch = Scratch::new("nogpu");
    let dest = scratch.path("f").display().to_string();
    for runtime in ["auto", "cuda"] {
        let out = hipobj_with(
            &server,
            &scratch,
            &["get", "s3://bucket/x", &dest, "--device", "0"],
            &[("HIPOBJ_GPU_RUNTIME", runtime)],
            None,
        );
        assert_eq!(out.status.code(), Some(1));
        let text = stderr(&out);
        assert!(
            text.contains("no GPU found") && text.contains("HIP: ") && text.contains("CUDA: "),
            "{runtime}: {text}"
        );
        assert!(
            !text.contains("HIP runtime unavailable: none of libcuda"),
            "{text}"
        );
    }
    let out = Command::new(HIPOBJ)
        .args(["doctor", "--gpu", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("GPU 0 does not exist"), "{text}");
    assert_eq!(out.status.code(), Some(3));
}

/// The `--json` summary on standard output.
fn summary(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn transfers_are_verified_by_default_say_so_and_no_verify_turns_it_off() {
    let server = server();
    let scratch = Scratch::new("verify");
    let data = pattern(300_000, 4);
    let file = scratch.path("in.bin");
    std::fs::write(&file, &data).unwrap();
    let file_s = file.display().to_string();
    let out = hipobj(
        &server,
        &scratch,
        &["put", &file_s, "s3://bucket/v", "--json"],
    );
    assert!(out.status.success());
    let put = summary(&out);
    assert_eq!(put["verified"], true, "{put}");
    assert!(
        put["verification"]
            .as_str()
            .unwrap()
            .contains("CRC-64/NVME"),
        "{put}"
    );

    let dest = scratch.path("out.bin");
    let dest_s = dest.display().to_string();
    let out = hipobj(
        &server,
        &scratch,
        &["get", "s3://bucket/v", &dest_s, "--json"],
    );
    assert!(out.status.success());
    let get = summary(&out);
    assert_eq!(
        get["verified"], true,
        "the object's CRC came with it: {get}"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), data);

    // In words too, on standard error.
    let out = hipobj(&server, &scratch, &["get", "s3://bucket/v", &dest_s]);
    assert!(
        stderr(&out).contains("; verified (CRC-64/NVME"),
        "{}",
        stderr(&out)
    );

    let out = hipobj(
        &server,
        &scratch,
        &["get", "s3://bucket/v", &dest_s, "--json", "--no-verify"],
    );
    let get = summary(&out);
    assert_eq!(get["verified"], false, "{get}");
    assert_eq!(get["verification"], "not verified: --no-verify", "{get}");
    let out = hipobj(
        &server,
        &scratch,
        &["put", &file_s, "s3://bucket/v", "--json", "--no-verify"],
    );
    assert_eq!(summary(&out)["verified"], false);

    // A range carries no checksum of its bytes: not verified, and why.
    let out = hipobj(
        &server,
        &scratch,
        &[
            "get",
            "s3://bucket/v",
            &dest_s,
            "--json",
            "--range",
            "0-999",
        ],
    );
    let get = summary(&out);
    assert_eq!(get["verified"], false, "{get}");
    assert!(
        get["verification"]
            .as_str()
            .unwrap()
            .contains("no checksum of its bytes"),
        "{get}"
    );
}

#[test]
fn a_download_whose_bytes_do_not_match_the_object_s_crc_fails_and_keeps_nothing() {
    let scratch = Scratch::new("corrupt");
    let data = pattern(1 << 20, 3);
    let claimed = hipobj::s3::Checksum::crc64nvme(&data).encode();
    let served = {
        let mut bytes = data.clone();
        bytes[12_345] ^= 1;
        bytes
    };
    let found = hipobj::s3::Checksum::crc64nvme(&served).encode();
    let crc = claimed.clone();
    let endpoint = http::Endpoint::start(move |r| match r.method.as_str() {
        "HEAD" => head(served.len(), "\"v\""),
        _ => {
            let mut reply = ranged(&served, r, "\"v\"");
            if let http::Reply::Respond { headers, .. } = &mut reply {
                headers.push(("x-amz-checksum-crc64nvme".into(), crc.clone()));
            }
            reply
        }
    });
    let dest = scratch.path("out.bin");
    let dest_s = dest.display().to_string();
    let out = hipobj_at(&endpoint, &scratch, &["get", "s3://bucket/obj", &dest_s]);
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains("not the bytes the server says it sent")
            && text.contains(&claimed)
            && text.contains(&found)
            && text.contains("nothing was kept"),
        "{text}"
    );
    assert!(
        !dest.exists() && hidden(&scratch.0).is_empty(),
        "nothing kept"
    );
    // Told not to check, the command keeps what came.
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &["get", "s3://bucket/obj", &dest_s, "--no-verify"],
    );
    assert!(out.status.success());
    assert!(stderr(&out).contains("not verified: --no-verify"));
}

/// Every regular file under `dir`, by its path relative to it, with its
/// bytes; hidden temporary files included (none should be left).
fn tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

#[test]
fn a_directory_goes_up_and_a_prefix_comes_down_recursively_many_at_a_time() {
    let server = server();
    let scratch = Scratch::new("recursive");
    let up = scratch.path("up");
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("top.bin", pattern(200 << 10, 1)),
        ("a/b/c.bin", pattern((3 << 20) + 11, 2)),
        ("a/x.txt", b"a small file".to_vec()),
        ("empty.bin", Vec::new()),
        ("deep/er/est/leaf.bin", pattern(70_000, 3)),
        ("z.bin", pattern(6 << 20, 4)),
    ];
    for (name, bytes) in &files {
        let path = up.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
    }
    let up_s = up.display().to_string();
    let out = hipobj(
        &server,
        &scratch,
        &[
            "cp",
            "--recursive",
            &up_s,
            "s3://bucket/tree",
            "--jobs",
            "3",
            "--chunk",
            "5MiB",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("6 objects") && text.contains("3 at a time"),
        "{text}"
    );
    assert!(text.contains("over plain HTTP"), "{text}");
    for (name, bytes) in &files {
        assert!(
            stored(&server, &format!("tree/{name}")).as_deref() == Some(&bytes[..]),
            "tree/{name}"
        );
    }

    // Down again, by `get -r` into a directory that does not exist yet.
    let back = scratch.path("back");
    let back_s = back.display().to_string();
    let out = hipobj(
        &server,
        &scratch,
        &[
            "get",
            "-r",
            "s3://bucket/tree/",
            &back_s,
            "--jobs",
            "4",
            "--chunk",
            "1MiB",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the summary as JSON");
    assert_eq!(summary["objects"], 6);
    assert_eq!(summary["objects_planned"], 6);
    assert_eq!(summary["jobs"], 4);
    assert_eq!(
        summary["operation"],
        format!("get s3://bucket/tree/ -> {back_s}")
    );
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(summary["bytes"], total);
    let want: std::collections::BTreeMap<String, Vec<u8>> = files
        .iter()
        .map(|(n, b)| ((*n).to_owned(), b.clone()))
        .collect();
    assert!(
        tree(&back) == want,
        "the same tree, byte for byte, and nothing else"
    );

    // A prefix with nothing under it copies nothing, and says so.
    let out = hipobj(
        &server,
        &scratch,
        &[
            "cp",
            "-r",
            "s3://bucket/none/",
            &scratch.path("none").display().to_string(),
        ],
    );
    assert!(out.status.success());
    assert!(stderr(&out).contains("nothing to copy"), "{}", stderr(&out));
    // --range and --recursive do not go together; --jobs is at least 1.
    let out = hipobj(
        &server,
        &scratch,
        &["cp", "-r", "s3://bucket/tree/", &back_s, "--range", "0-9"],
    );
    assert_eq!(out.status.code(), Some(2));
    let out = hipobj(
        &server,
        &scratch,
        &["cp", "-r", &up_s, "s3://bucket/t2/", "--jobs", "0"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stored(&server, "t2/top.bin").is_none());
}

/// A ListObjectsV2 answer of `(key, size)`.
fn listing(objects: &[(&str, usize)]) -> http::Reply {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>bucket</Name>",
    );
    for (key, size) in objects {
        xml.push_str(&format!(
            "<Contents><Key>{key}</Key><Size>{size}</Size><ETag>\"e-{key}\"</ETag></Contents>"
        ));
    }
    xml.push_str("<IsTruncated>false</IsTruncated></ListBucketResult>");
    http::Reply::new(200, &[("content-type", "application/xml")], xml)
}

#[test]
fn a_recursive_download_that_fails_midway_keeps_only_whole_files() {
    let scratch = Scratch::new("recursive-fail");
    let good = pattern(300_000, 5);
    let served = good.clone();
    let endpoint = http::Endpoint::start(move |r| {
        if r.method == "GET" && r.has_query("list-type") {
            return listing(&[
                ("p/a.bin", 300_000),
                ("p/b.bin", 300_000),
                ("p/c.bin", 300_000),
            ]);
        }
        match r.path() {
            "/bucket/p/b.bin" => http::Reply::s3_error(500, "InternalError", "disk on fire"),
            key => ranged(&served, r, &format!("\"e-{}\"", &key["/bucket/".len()..])),
        }
    });
    let dest = scratch.path("d");
    let dest_s = dest.display().to_string();
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &[
            "cp",
            "-r",
            "s3://bucket/p",
            &dest_s,
            "--jobs",
            "1",
            "--retries",
            "0",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains("s3://bucket/p/b.bin") && text.contains("InternalError"),
        "{text}"
    );
    assert!(
        text.contains("1 of 3 objects downloaded before it"),
        "{text}"
    );
    let left = tree(&dest);
    assert!(
        left.keys().eq(["a.bin"]),
        "only the whole file, no temporary one: {:?}",
        left.keys()
    );
    assert!(left["a.bin"] == good);
    // Every GET asked for the listed version.
    assert!(endpoint
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && !r.has_query("list-type"))
        .all(|r| r
            .header("if-match")
            .is_some_and(|e| e.starts_with("\"e-p/"))));
}

/// `reply` (a listing) without its ETags: what a store that lists none
/// (s3s-fs) answers.
fn without_etags(reply: http::Reply) -> http::Reply {
    let http::Reply::Respond {
        status,
        headers,
        body,
    } = reply
    else {
        return reply;
    };
    let mut text = String::from_utf8(body).expect("an XML listing");
    while let Some(start) = text.find("<ETag>") {
        let end = text[start..].find("</ETag>").expect("a closed ETag") + start;
        text.replace_range(start..end + "</ETag>".len(), "");
    }
    let headers = headers
        .into_iter()
        .filter(|(k, _)| k != "content-length")
        .collect();
    http::Reply::Respond {
        status,
        headers,
        body: text.into_bytes(),
    }
}

/// Checks that a recursive download failed (exit 1) naming `object` as
/// changed, and kept no file under `dest`.
fn changed_and_nothing_kept(out: &Output, object: &str, dest: &Path) {
    let text = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(object) && text.contains("changed during the download"),
        "{text}"
    );
    assert!(
        !dest.exists() || tree(dest).is_empty(),
        "nothing kept: {:?}",
        tree(dest).keys()
    );
}

#[test]
fn a_recursive_download_whose_object_is_replaced_midway_fails_naming_it_and_keeps_nothing() {
    let server = server();
    let scratch = Scratch::new("recursive-replaced");
    let old = pattern(10 << 20, 7);
    std::fs::write(scratch.path("old.bin"), &old).unwrap();
    let old_s = scratch.path("old.bin").display().to_string();
    assert!(
        hipobj(&server, &scratch, &["put", &old_s, "s3://bucket/data/a"])
            .status
            .success()
    );
    // Everything goes to the server, its listings without ETags; once the
    // first chunk of data/a has been answered (and before that answer goes
    // back), data/a is replaced by 20 MiB of other bytes.
    let upstream = server.endpoint.clone();
    let store = S3::new(S3Config {
        endpoint: upstream.clone(),
        region: "us-east-1".to_owned(),
        credentials: Credentials {
            access_key_id: ACCESS_KEY.to_owned(),
            secret_access_key: SECRET_KEY.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap();
    let replaced = AtomicBool::new(false);
    let endpoint = http::Endpoint::start(move |r| {
        let reply = http::forward(&upstream, r);
        if r.has_query("list-type") {
            return without_etags(reply);
        }
        let chunk =
            r.method == "GET" && r.path() == "/bucket/data/a" && r.header("range").is_some();
        if chunk && !replaced.swap(true, Ordering::SeqCst) {
            let object = Object::new(&store, BUCKET, "data/a");
            objects::put_http(object, &pattern(20 << 20, 99), false).expect("the replacement");
        }
        reply
    });
    let dest = scratch.path("d");
    let dest_s = dest.display().to_string();
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &[
            "cp",
            "-r",
            "s3://bucket/data",
            &dest_s,
            "--chunk",
            "5MiB",
            "--streams",
            "1",
            "--jobs",
            "1",
        ],
    );
    changed_and_nothing_kept(&out, "s3://bucket/data/a", &dest);
    let seen = endpoint.requests();
    let of_a = |method: &str| {
        seen.iter()
            .filter(|r| r.method == method && r.path() == "/bucket/data/a")
            .collect::<Vec<_>>()
    };
    assert_eq!(of_a("HEAD").len(), 1, "a HEAD found the version to pin");
    assert!(
        of_a("GET").iter().all(|r| r.header("if-match").is_some()),
        "every chunk asks for that version: {:?}",
        of_a("GET")
    );

    // A store that gives no ETag at all: the object's size pins it (each
    // answer's Content-Range total).
    let served = Arc::new(Mutex::new(pattern(3 << 20, 1)));
    let grown = pattern(6 << 20, 2);
    let endpoint = http::Endpoint::start(move |r| {
        if r.has_query("list-type") {
            return without_etags(listing(&[("p/a.bin", 3 << 20)]));
        }
        let data = served.lock().unwrap().clone();
        if r.method == "HEAD" {
            let len = data.len().to_string();
            return http::Reply::new(200, &[("content-length", &len)], Vec::new());
        }
        let mut reply = ranged(&data, r, "");
        if let http::Reply::Respond { headers, .. } = &mut reply {
            headers.retain(|(k, _)| k != "etag");
        }
        // The first chunk is the old object's; the rest the new one's.
        *served.lock().unwrap() = grown.clone();
        reply
    });
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &[
            "cp",
            "-r",
            "s3://bucket/p",
            &dest_s,
            "--chunk",
            "1MiB",
            "--streams",
            "1",
        ],
    );
    changed_and_nothing_kept(&out, "s3://bucket/p/a.bin", &dest);
}

#[test]
fn a_listing_with_a_key_that_climbs_out_copies_nothing() {
    let scratch = Scratch::new("recursive-climb");
    let endpoint = http::Endpoint::start(move |r| {
        if r.has_query("list-type") {
            return listing(&[("p/fine.bin", 10), ("p/../../escape", 10)]);
        }
        http::Reply::new(200, &[], vec![b'x'; 10])
    });
    let dest = scratch.path("d");
    let out = hipobj_at(
        &endpoint,
        &scratch,
        &["cp", "-r", "s3://bucket/p/", &dest.display().to_string()],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("does not name a file inside"),
        "{}",
        stderr(&out)
    );
    assert!(!dest.exists(), "nothing written");
    assert_eq!(endpoint.count("GET"), 1, "only the listing was asked for");
    assert!(!scratch.path("escape").exists());
}

#[test]
fn ctrl_c_of_a_recursive_download_removes_every_temporary_file() {
    let scratch = Scratch::new("sigint-recursive");
    let len: usize = 8 << 20;
    // Three objects whose bytes start, then stop coming.
    let endpoint = http::Endpoint::start(move |r| {
        if r.has_query("list-type") {
            return listing(&[("p/a.bin", len), ("p/b.bin", len), ("p/c.bin", len)]);
        }
        http::Reply::Stall {
            headers: vec![(
                "etag".into(),
                format!("\"e-{}\"", &r.path()["/bucket/".len()..]),
            )],
            len: 8 << 20,
            sent: 1 << 20,
        }
    });
    let dest = scratch.path("d");
    let mut child = command(
        &endpoint.url,
        &scratch,
        &[
            "cp",
            "-r",
            "s3://bucket/p/",
            &dest.display().to_string(),
            "--jobs",
            "3",
            "--chunk",
            "8MiB",
        ],
        &[],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_for("three downloads in flight", || {
        dest.is_dir() && hidden(&dest).len() == 3
    });
    signal(&child, "INT");
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(tree(&dest).is_empty(), "left: {:?}", tree(&dest).keys());
}
