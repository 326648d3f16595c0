//! The C examples (`examples/get-object.c`, `put-object.c`, `token-get.c`)
//! against the S3 server, over their plain HTTP path: this host has no RDMA
//! device, so `hipObjInit` fails and every transfer falls back (the RDMA
//! path runs in the Soft-RoCE VM lane).
//!
//! The programs are built once by `scripts/build-examples.sh` against the
//! library of this test run, with AddressSanitizer and
//! UndefinedBehaviorSanitizer (LeakSanitizer included), so a leak or an
//! undefined behaviour fails the run that shows it. The bytes the server
//! stores are compared with the pattern as `examples/s3common.h` documents
//! it, computed here independently of the C code.
//!
//! A C compiler, pkg-config and libcurl's development files are required; a
//! missing one fails the build step, it is never skipped.

mod common;
#[path = "common/s3.rs"]
mod s3;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use s3::{S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};

/// Each program run gets this long (sanitizers slow the programs down).
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

const MIB: usize = 1024 * 1024;

/// The three programs, built once for every test of this binary.
struct Examples {
    dir: PathBuf,
}

fn examples() -> &'static Examples {
    static BUILT: OnceLock<Examples> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Under target/<profile>, rebuilt from scratch by each run.
        let work = common::profile_dir().join("examples-test");
        if work.exists() {
            std::fs::remove_dir_all(&work)
                .unwrap_or_else(|e| panic!("removing {}: {e}", work.display()));
        }
        let prefix = work.join("prefix");
        let dir = work.join("bin");
        let lib = common::library_under_test();
        let out = Command::new("bash")
            .arg(common::manifest_dir().join("scripts/build-examples.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--out")
            .arg(&dir)
            .arg("--lib")
            .arg(&lib)
            .env(
                "HIPOBJ_EXAMPLES_CFLAGS",
                "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all",
            )
            .env_remove("DESTDIR")
            .output()
            .unwrap_or_else(|e| panic!("cannot run scripts/build-examples.sh: {e}"));
        assert!(
            out.status.success(),
            "scripts/build-examples.sh failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for prog in ["get-object", "put-object", "token-get"] {
            assert!(dir.join(prog).is_file(), "{prog} was not built");
        }
        Examples { dir }
    })
}

fn server() -> S3Server {
    S3Server::start(
        Path::new(env!("CARGO_BIN_EXE_hipobj-s3-server")),
        "127.0.0.1",
        &[],
    )
}

/// What a program run printed, and how it ended.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Asserts exit 0 and exactly one stdout line; returns it.
    fn summary(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success: {}", self.describe());
        let lines: Vec<&str> = self.stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "expected one summary line: {}",
            self.describe()
        );
        lines[0]
    }
}

/// Runs `prog` against `srv` with the test keys, `args`, then BUCKET and `key`.
fn run(srv: &S3Server, prog: &str, args: &[&str], key: &str) -> Run {
    run_with_secret(srv, prog, args, key, SECRET_KEY)
}

fn run_with_secret(srv: &S3Server, prog: &str, args: &[&str], key: &str, secret: &str) -> Run {
    let exe = examples().dir.join(prog);
    let mut cmd = common::command_without_hipobj_env(&exe);
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .args(["--endpoint", &srv.endpoint])
        .args(["--access-key", ACCESS_KEY, "--secret-key", secret])
        .args(args)
        .args([BUCKET, key]);
    let Output {
        status,
        stdout,
        stderr,
    } = common::run_with_timeout(&mut cmd, RUN_TIMEOUT);
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// The pattern of `examples/s3common.h`: byte `j mod 8` (least significant
/// first) of SplitMix64's finalizer over `j / 8 + seed * 0x9E3779B97F4A7C15`.
fn pattern(seed: u64, start: u64, len: usize) -> Vec<u8> {
    fn mix64(mut z: u64) -> u64 {
        z ^= z >> 30;
        z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z ^= z >> 27;
        z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    (start..)
        .take(len)
        .map(|j| {
            let word = mix64((j / 8).wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            word.to_le_bytes()[usize::try_from(j % 8).expect("below 8")]
        })
        .collect()
}

/// The object `key` as the server stored it.
fn stored(srv: &S3Server, key: &str) -> Vec<u8> {
    let path = srv.root().join(BUCKET).join(key);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Asserts that `line` is `OP BUCKET/KEY: N bytes<middle> in T ms (R MiB/s)<tail> via fallback (...)`.
fn assert_fallback_summary(
    line: &str,
    op: &str,
    key: &str,
    bytes: usize,
    middle: &str,
    tail: &str,
) {
    let head = format!("{op} {BUCKET}/{key}: {bytes} bytes{middle} in ");
    let rest = line
        .strip_prefix(&head)
        .unwrap_or_else(|| panic!("summary {line:?} does not start with {head:?}"));
    let (ms, rest) = rest
        .split_once(" ms (")
        .unwrap_or_else(|| panic!("no time in {line:?}"));
    let ms: f64 = ms
        .parse()
        .unwrap_or_else(|_| panic!("time {ms:?} in {line:?}"));
    assert!(ms >= 0.0, "{line:?}");
    let (rate, rest) = rest
        .split_once(" MiB/s)")
        .unwrap_or_else(|| panic!("no rate in {line:?}"));
    let _: f64 = rate
        .parse()
        .unwrap_or_else(|_| panic!("rate {rate:?} in {line:?}"));
    let how = rest
        .strip_prefix(tail)
        .unwrap_or_else(|| panic!("{line:?} lacks {tail:?} after the rate"));
    // No RDMA device on this host: the library cannot initialize.
    assert!(
        how.starts_with(" via fallback (") && how.ends_with(')'),
        "{line:?} does not end with `via fallback (REASON)`"
    );
}

#[test]
fn put_then_get_a_mebibyte_of_pattern_byte_exact() {
    let srv = server();
    let put = run(
        &srv,
        "put-object",
        &["--pattern", "11", "--size", "1048576"],
        "one",
    );
    assert_fallback_summary(put.summary(), "PUT", "one", MIB, "", "");
    assert!(
        stored(&srv, "one") == pattern(11, 0, MIB),
        "the stored object is not the documented pattern of seed 11"
    );

    let scratch = common::Scratch::new("examples-get");
    let file = scratch.path().join("one.bin");
    let file_arg = file.to_str().expect("a UTF-8 path");
    let get = run(
        &srv,
        "get-object",
        &["--pattern", "11", "--size", "1048576", "--file", file_arg],
        "one",
    );
    assert_fallback_summary(get.summary(), "GET", "one", MIB, "", "");
    let written = std::fs::read(&file).expect("get-object wrote --file");
    assert!(
        written == stored(&srv, "one"),
        "--file differs from the object"
    );
}

#[test]
fn ranged_get_at_an_odd_offset_is_checked_against_the_same_pattern() {
    let srv = server();
    run(
        &srv,
        "put-object",
        &["--pattern", "3", "--size", "1048576"],
        "ranged",
    )
    .summary();

    let get = run(
        &srv,
        "get-object",
        &["--pattern", "3", "--offset", "12345", "--size", "100001"],
        "ranged",
    );
    assert_fallback_summary(get.summary(), "GET", "ranged", 100_001, "", "");

    // The same range checked with another seed differs at once: exit 2, and
    // the first differing object offset is named.
    let wrong = run(
        &srv,
        "get-object",
        &["--pattern", "4", "--offset", "12345", "--size", "100001"],
        "ranged",
    );
    let first_bad = pattern(3, 12345, 100_001)
        .iter()
        .zip(pattern(4, 12345, 100_001))
        .position(|(a, b)| *a != b)
        .expect("seeds 3 and 4 differ")
        + 12345;
    assert_eq!(wrong.code, Some(2), "{}", wrong.describe());
    assert!(
        wrong
            .stderr
            .contains(&format!("pattern mismatch at object offset {first_bad}:")),
        "{}",
        wrong.describe()
    );
}

#[test]
fn token_get_reads_a_range_through_its_fallback() {
    let srv = server();
    run(
        &srv,
        "put-object",
        &["--pattern", "21", "--size", "65536"],
        "tok",
    )
    .summary();
    let get = run(
        &srv,
        "token-get",
        &["--pattern", "21", "--offset", "7", "--size", "60001"],
        "tok",
    );
    assert_fallback_summary(get.summary(), "GET", "tok", 60_001, "", "");
}

#[test]
fn multipart_upload_in_three_parts_reads_back_whole() {
    let srv = server();
    // S3 wants every part but the last to hold at least 5 MiB.
    let size = 16 * MIB + 1;
    let size_arg = size.to_string();
    let put = run(
        &srv,
        "put-object",
        &["--pattern", "5", "--size", &size_arg, "--parts", "3"],
        "multi",
    );
    assert_fallback_summary(put.summary(), "PUT", "multi", size, " in 3 parts", "");
    assert!(
        stored(&srv, "multi") == pattern(5, 0, size),
        "the completed upload is not the pattern"
    );
    let get = run(
        &srv,
        "get-object",
        &["--pattern", "5", "--size", &size_arg],
        "multi",
    );
    assert_fallback_summary(get.summary(), "GET", "multi", size, "", "");
}

#[test]
fn four_threads_use_their_own_keys_and_seeds() {
    let srv = server();
    let args = [
        "--pattern",
        "100",
        "--size",
        "262144",
        "--threads",
        "4",
        "--iterations",
        "2",
    ];
    let put = run(&srv, "put-object", &args, "t");
    let tail = " with 4 threads x 2 iterations";
    assert_fallback_summary(put.summary(), "PUT", "t", 8 * 262_144, "", tail);
    for i in 0..4u64 {
        let key = format!("t.{i}");
        assert!(
            stored(&srv, &key) == pattern(100 + i, 0, 262_144),
            "{key} does not hold the pattern of seed {}",
            100 + i
        );
    }
    let get = run(&srv, "get-object", &args, "t");
    assert_fallback_summary(get.summary(), "GET", "t", 8 * 262_144, "", tail);
    let tok = run(&srv, "token-get", &args, "t");
    assert_fallback_summary(tok.summary(), "GET", "t", 8 * 262_144, "", tail);
}

#[test]
fn no_rdma_goes_over_plain_http_without_the_library() {
    let srv = server();
    let put = run(
        &srv,
        "put-object",
        &["--no-rdma", "--pattern", "8", "--size", "4096"],
        "plain",
    );
    let line = put.summary();
    assert!(line.ends_with(" via fallback (--no-rdma)"), "{line:?}");
    let get = run(
        &srv,
        "get-object",
        &["--no-rdma", "--pattern", "8", "--size", "4096"],
        "plain",
    );
    let line = get.summary();
    assert!(line.ends_with(" via fallback (--no-rdma)"), "{line:?}");
}

#[test]
fn a_wrong_secret_fails_with_exit_1_and_stores_nothing() {
    let srv = server();
    let put = run_with_secret(
        &srv,
        "put-object",
        &["--pattern", "1", "--size", "4096"],
        "secret",
        "not-the-secret",
    );
    assert_eq!(put.code, Some(1), "{}", put.describe());
    assert!(put.stdout.is_empty(), "{}", put.describe());
    assert!(
        put.stderr.contains("HTTP 403"),
        "the message names the HTTP status: {}",
        put.describe()
    );
    assert!(
        !srv.root().join(BUCKET).join("secret").exists(),
        "a rejected PUT stored its object"
    );

    run(
        &srv,
        "put-object",
        &["--pattern", "1", "--size", "4096"],
        "secret",
    )
    .summary();
    for prog in ["get-object", "token-get"] {
        let get = run_with_secret(
            &srv,
            prog,
            &["--pattern", "1", "--size", "4096"],
            "secret",
            "not-the-secret",
        );
        assert_eq!(get.code, Some(1), "{prog}: {}", get.describe());
        assert!(get.stdout.is_empty(), "{prog}: {}", get.describe());
        assert!(
            get.stderr.contains("HTTP 403"),
            "{prog}: {}",
            get.describe()
        );
    }
}

#[test]
fn a_bad_command_line_fails_with_exit_1_and_help_exits_0() {
    let exe = examples().dir.join("put-object");
    let help = common::run_with_timeout(Command::new(&exe).arg("--help"), RUN_TIMEOUT);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("--parts P"));

    // No payload named.
    let bad = common::run_with_timeout(
        Command::new(&exe).args(["--access-key", "a", "--secret-key", "b", "bucket", "key"]),
        RUN_TIMEOUT,
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(bad.stdout.is_empty());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--pattern SEED"));
}

/// `--device` on this machine, whose HIP runtime sees no GPU and which has
/// no CUDA driver: the examples say why each runtime cannot serve, and
/// exit 1 before any request.
#[test]
fn device_memory_without_a_gpu_is_refused_naming_both_runtimes() {
    let srv = server();
    let r = run(
        &srv,
        "get-object",
        &["--device", "--size", "4096", "--pattern", "1"],
        "none",
    );
    assert_eq!(r.code, Some(1), "{}", r.describe());
    assert!(
        r.stderr.contains("--device needs a GPU"),
        "{}",
        r.describe()
    );
    assert!(r.stderr.contains("HIP sees no GPU"), "{}", r.describe());
    assert!(
        r.stderr.contains("cannot load libcuda.so.1"),
        "{}",
        r.describe()
    );
}
