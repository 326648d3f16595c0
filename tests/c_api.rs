//! The C ABI as a C (and C++) program sees it: each program in `tests/c`
//! is compiled with strict warnings against the committed `include/hipobj.h`,
//! linked against the `libhipobj.so` built for this test run (or
//! `$HIPOBJ_LIB_UNDER_TEST`), and run with no `HIPOBJ_*` variable in its
//! environment. A program passes by exiting 0; otherwise its output is the
//! failure message. One test per program, so failures are named.

mod common;

use std::path::Path;
use std::time::Duration;

/// Programs get this long to finish (the thread test is the slowest).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Compiles `tests/c/<file>` (C11 or C++11 by extension) with `extra`
/// linker arguments, runs it, and fails with its output if it fails.
fn run_program(file: &str, extra: &[&str]) {
    let src = common::manifest_dir().join("tests/c").join(file);
    assert!(src.is_file(), "{} is missing", src.display());
    let stem = Path::new(file)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a file name");
    let lib = common::library_under_test();
    let scratch = common::Scratch::new(&format!("c-{stem}"));
    let link_dir = common::link_dir_for(&lib, scratch.path());
    let exe = scratch.path().join(stem);

    let mut args = vec![format!("-I{}", common::include_dir().display())];
    args.extend(common::link_args(&link_dir));
    args.push("-pthread".to_owned());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    if file.ends_with(".cpp") {
        common::compile_cxx(&src, &exe, &args);
    } else {
        common::compile_c(&src, &exe, &args);
    }

    let mut cmd = common::command_without_hipobj_env(&exe);
    let output = common::run_with_timeout(&mut cmd, TIMEOUT);
    assert!(
        output.status.success(),
        "{file} against {} failed ({}):\n--- stderr ---\n{}--- stdout ---\n{}",
        lib.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
}

/// The programs with a test below; `every_program_has_a_test` keeps this
/// list and `tests/c` in step.
const PROGRAMS: &[&str] = &[
    "error_strings.c",
    "version.c",
    "layout.c",
    "not_initialized.c",
    "init.c",
    "parse_reply.c",
    "token_client_nic.c",
    "put_rdma_token.c",
    "threads.c",
    "cxx_consumer.cpp",
    "fake_world.c",
];

#[test]
fn every_program_has_a_test() {
    let dir = common::manifest_dir().join("tests/c");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".c") || name.ends_with(".cpp"))
        .collect();
    found.sort();
    let mut listed: Vec<String> = PROGRAMS.iter().map(|s| (*s).to_owned()).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "tests/c and PROGRAMS in tests/c_api.rs differ"
    );
}

#[test]
fn error_strings() {
    run_program("error_strings.c", &[]);
}

#[test]
fn version() {
    run_program("version.c", &[]);
}

#[test]
fn layout() {
    run_program("layout.c", &[]);
}

#[test]
fn not_initialized() {
    run_program("not_initialized.c", &[]);
}

#[test]
fn init() {
    run_program("init.c", &["-ldl"]);
}

#[test]
fn parse_reply() {
    run_program("parse_reply.c", &[]);
}

#[test]
fn token_client_nic() {
    run_program("token_client_nic.c", &[]);
}

#[test]
fn put_rdma_token() {
    run_program("put_rdma_token.c", &[]);
}

#[test]
fn threads() {
    run_program("threads.c", &[]);
}

#[test]
fn fake_world() {
    run_program("fake_world.c", &[]);
}

#[test]
fn cxx_consumer() {
    run_program("cxx_consumer.cpp", &[]);
}
