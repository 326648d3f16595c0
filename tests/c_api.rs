//! The C ABI as a C (and C++) program sees it: each program in `tests/c`
//! is compiled with strict warnings against the committed `include/hipobj.h`,
//! linked against the `libhipobj.so` built for this test run (or
//! `$HIPOBJ_LIB_UNDER_TEST`), and run with no `HIPOBJ_*` variable in its
//! environment. A program passes by exiting 0; otherwise its output is the
//! failure message. One test per program, so failures are named.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Programs get this long to finish (the thread test is the slowest).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Compiles `tests/c/<file>` (C11 or C++11 by extension) with `extra`
/// linker arguments, against the library under test, into a scratch
/// directory; returns the directory and the program.
fn build_program(file: &str, extra: &[&str]) -> (common::Scratch, PathBuf) {
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
    (scratch, exe)
}

/// Fails with the program's output unless it exited 0.
fn assert_passed(file: &str, output: &Output) {
    common::assert_program_passed(file, &common::library_under_test(), output);
}

/// Compiles `tests/c/<file>` (see [`build_program`]), runs it, and fails
/// with its output if it fails.
fn run_program(file: &str, extra: &[&str]) {
    let (_scratch, exe) = build_program(file, extra);
    let mut cmd = common::command_without_hipobj_env(&exe);
    let output = common::run_with_timeout(&mut cmd, TIMEOUT);
    assert_passed(file, &output);
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
    "missing_libraries.c",
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
fn cxx_consumer() {
    run_program("cxx_consumer.cpp", &[]);
}

/// `tests/c/missing_libraries.c` where the dynamic loader finds nothing but
/// the C runtime, the program and libhipobj: chrooted into a directory
/// that holds exactly the files `ldd` lists for the program (at the paths
/// it lists them), so no libibverbs, librdmacm or HIP runtime is anywhere
/// to be found. Needs root (CI runs as root) and fails, never skips,
/// without it.
#[test]
fn missing_libraries() {
    let uid = common::tool_stdout("id", &["-u"]);
    assert_eq!(
        uid.trim(),
        "0",
        "missing_libraries must run as root: it chroots the program into a directory \
         holding only the program, libhipobj and the C runtime"
    );
    let file = "missing_libraries.c";
    let (scratch, exe) = build_program(file, &["-ldl"]);
    let root = scratch.path().join("root");
    let program = Path::new("/missing_libraries");
    copy_into(&root, &exe, program);
    let ldd = common::tool_stdout("ldd", &[&exe]);
    let libraries = ldd_paths(&ldd);
    assert!(
        libraries
            .iter()
            .any(|p| p.to_string_lossy().contains("libhipobj")),
        "ldd does not list libhipobj:\n{ldd}"
    );
    for library in &libraries {
        copy_into(&root, library, library);
    }
    // AddressSanitizer reads /proc/self/maps at start-up.
    let _proc = std::env::var_os("HIPOBJ_TEST_SANITIZE")
        .filter(|v| !v.is_empty())
        .map(|_| ProcMount::new(&root));

    // Found before the environment is cleared: the program gets none.
    let mut cmd = Command::new(on_path("chroot"));
    cmd.arg(&root).arg(program).env_clear();
    let output = common::run_with_timeout(&mut cmd, TIMEOUT);
    assert_passed(file, &output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("hipObjInit") && stderr.contains("libibverbs.so.1"),
        "the failed init names the missing library on stderr:\n{stderr}"
    );
}

/// Where `tool` is on `PATH`; fails if it is nowhere.
fn on_path(tool: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{tool} is not on PATH ({path:?}): it is required"))
}

/// The absolute paths of the files `ldd` resolved (not the vDSO).
fn ldd_paths(ldd: &str) -> Vec<PathBuf> {
    ldd.lines()
        .filter_map(|line| {
            let resolved = line.split("=>").last()?.trim();
            let path = resolved.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Copies `file` (following links) to `root` + `at`.
fn copy_into(root: &Path, file: &Path, at: &Path) {
    let relative = at.strip_prefix("/").unwrap_or(at);
    let target = root.join(relative);
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    std::fs::copy(file, &target)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", file.display(), target.display()));
}

/// `proc` mounted at `<root>/proc` until dropped.
struct ProcMount(PathBuf);

impl ProcMount {
    fn new(root: &Path) -> ProcMount {
        let dir = root.join("proc");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let status = Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(&dir)
            .status()
            .unwrap_or_else(|e| panic!("cannot run mount: {e}"));
        assert!(
            status.success(),
            "mounting proc at {}: {status}",
            dir.display()
        );
        ProcMount(dir)
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
