//! The fake library as an application's test program sees it: built by
//! cargo for this test run (`libhipobj_fake.so`), its SONAME and exports
//! are the release library's plus the controls of `include/hipobj_fake.h`,
//! and the C programs of `tests/c` here, compiled with strict warnings
//! against `hipobj.h` and `hipobj_fake.h`, run on its fake world with no
//! `HIPOBJ_*` variable of the caller's. A program passes by exiting 0.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// Programs get this long to finish.
const TIMEOUT: Duration = Duration::from_secs(120);

fn library() -> PathBuf {
    common::built_library_named("libhipobj_fake.so")
}

/// Every `NAME(` in `include/<header>` whose name starts with `prefix`: the
/// functions the header declares (or names in a comment, each declared
/// there too).
fn declared(header: &str, prefix: &str) -> BTreeSet<String> {
    let path = common::include_dir().join(header);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let names: BTreeSet<String> = text
        .match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            rest[end..].starts_with('(').then(|| rest[..end].to_owned())
        })
        .collect();
    assert!(names.len() >= 10, "{}: {names:?}", path.display());
    names
}

#[test]
fn its_soname_is_the_release_library_s() {
    let lib = library();
    let text = common::tool_stdout("readelf", &["-d".as_ref(), lib.as_os_str()]);
    let sonames: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("(SONAME)"))
        .collect();
    assert_eq!(sonames.len(), 1, "{text}");
    assert!(sonames[0].ends_with("[libhipobj.so.0]"), "{}", sonames[0]);
}

/// The 15 functions of `hipobj.h` and the controls of `hipobj_fake.h`,
/// and no other function of ours. (A build with the built-in S3 client
/// in the workspace, as the suite's is, also exports crc-fast's
/// `crc_fast_*`, which the release library's own check forbids.)
#[test]
fn it_exports_the_15_functions_and_the_controls() {
    let lib = library();
    let text = common::tool_stdout(
        "nm",
        &["-D".as_ref(), "--defined-only".as_ref(), lib.as_os_str()],
    );
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        .filter(|name| !name.starts_with("crc_fast_"))
        .map(str::to_owned)
        .collect();
    let mut expected = declared("hipobj.h", "hipObj");
    assert_eq!(expected.len(), 15, "{expected:?}");
    expected.extend(declared("hipobj_fake.h", "hipobjFake"));
    assert_eq!(exported, expected, "{}", lib.display());
}

/// Compiles `tests/c/<file>` here against the fake library, into a
/// scratch directory; returns the directory and the program.
fn build_program(file: &str) -> (common::Scratch, PathBuf) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let src = here.join(file);
    let stem = Path::new(file)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a file name");
    let scratch = common::Scratch::new(&format!("fake-c-{stem}"));
    let link_dir = common::link_dir_for(&library(), scratch.path());
    let exe = scratch.path().join(stem);
    let mut args = vec![
        format!("-I{}", common::include_dir().display()),
        // check.h, beside the release library's C tests.
        format!("-I{}", common::manifest_dir().join("tests/c").display()),
    ];
    args.extend(common::link_args(&link_dir));
    args.push("-pthread".to_owned());
    common::compile_c(&src, &exe, &args);
    (scratch, exe)
}

/// Fails with the program's output unless it exited 0.
fn assert_passed(file: &str, output: &Output) {
    common::assert_program_passed(file, &library(), output);
}

fn run_program(file: &str) {
    let (_scratch, exe) = build_program(file);
    let mut cmd = common::command_without_hipobj_env(&exe);
    let output = common::run_with_timeout(&mut cmd, TIMEOUT);
    assert_passed(file, &output);
}

#[test]
fn fake_world() {
    run_program("fake_world.c");
}

/// `HIPOBJ_STATS`: the same program's transfers, counted, in one line at
/// `hipObjShutdown` (and none without it).
#[test]
fn fake_world_prints_its_stats_at_shutdown() {
    let (_scratch, exe) = build_program("fake_world.c");
    let mut cmd = common::command_without_hipobj_env(&exe);
    let quiet = common::run_with_timeout(&mut cmd, TIMEOUT);
    assert_passed("fake_world.c", &quiet);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("hipobj-stats:"));
    let mut cmd = common::command_without_hipobj_env(&exe);
    cmd.env("HIPOBJ_STATS", "1");
    let output = common::run_with_timeout(&mut cmd, TIMEOUT);
    assert_passed("fake_world.c", &output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("hipobj-stats: "))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    for expected in [
        // The host buffer's two GETs and PUT, the fake GPU buffer's GET and
        // PUT (the application-driven token is not a hipObjGet).
        " direct=5 ",
        " staged=0 ",
        " failed_s3=1 ",
        " failed_other=3 ",
        " failed_rdma=0 ",
        " staging_copies=0 ",
    ] {
        assert!(lines[0].contains(expected), "{expected:?} in {}", lines[0]);
    }
    // Seven proofs: the five transfers' and the two application-driven
    // tokens'. The second token may find the first one's connection still
    // revoking, and take another (a second handshake).
    let count = |name: &str| -> u64 {
        lines[0]
            .split(' ')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {}", lines[0]))
    };
    assert_eq!(count("handshakes") + count("reused"), 7, "{}", lines[0]);
    assert!((1..=2).contains(&count("handshakes")), "{}", lines[0]);
}

/// `fork` after `hipObjInit`: the child's calls fail at once, it may
/// initialize afresh, and the parent goes on.
#[test]
fn fork() {
    run_program("fork.c");
}
