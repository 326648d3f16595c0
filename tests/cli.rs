//! The `hipobj` command on this machine, against the RDMA S3 server over
//! HTTP. This host has no RDMA device: `doctor` must say so and why, and
//! every transfer goes over plain HTTP, said in the summary, or fails with
//! `--no-fallback`. The same commands by RDMA run in the Soft-RoCE lane
//! (`tests/e2e.rs`). The progress bar is checked in a real terminal (tmux);
//! tmux is required, never skipped.

mod common;
#[path = "common/s3.rs"]
mod s3server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

fn hipobj_with(
    server: &S3Server,
    scratch: &Scratch,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> Output {
    let mut command = Command::new(HIPOBJ);
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &scratch.0)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_ENDPOINT_URL", &server.endpoint)
        .envs(env.iter().copied())
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
    for (args, expected) in [
        (vec!["get", "bucket/key", "f"], "not an s3://BUCKET/KEY"),
        (vec!["get", "s3://bucket", "f"], "no bucket or no key"),
        (
            vec!["put", "/nonexistent/file", "s3://bucket/k"],
            "No such file",
        ),
        (vec!["cp", "a", "b"], "one of SOURCE and DESTINATION"),
        (vec!["get", "s3://bucket/missing"], "needs a DESTINATION"),
    ] {
        let out = hipobj(&server, &scratch, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
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
