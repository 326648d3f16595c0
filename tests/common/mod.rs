//! Helpers shared by the integration tests that look at the built
//! `libhipobj.so` from the outside: finding it, compiling C and C++ programs
//! against it, running external tools and programs.
//!
//! Each test crate uses only some of these, hence the `dead_code` allowance.

#![allow(dead_code)]

pub mod layout;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The repository's root: hipobj's own manifest directory, also for the
/// tests of a workspace member (the fake library's, testing/fake-library/,
/// which share these helpers).
pub fn manifest_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|dir| dir.join("include/hipobj.h").is_file())
        .unwrap_or_else(|| panic!("no include/hipobj.h in {} or above", here.display()))
        .to_path_buf()
}

/// The directory of the committed `hipobj.h`.
pub fn include_dir() -> PathBuf {
    manifest_dir().join("include")
}

/// The directory of this test binary: `target/<profile>/deps` (or
/// `target/<triple>/<profile>/deps`).
pub fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    exe.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("unexpected test binary location {}", exe.display()))
}

/// `target/<profile>` (or `target/<triple>/<profile>`) of this test run.
pub fn profile_dir() -> PathBuf {
    let deps = deps_dir();
    deps.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("unexpected deps directory {}", deps.display()))
}

/// The `libhipobj.so` cargo built for this test run.
///
/// Cargo compiles the library (crate types cdylib and rlib) into
/// `target/<profile>/deps` before it builds the integration tests that
/// depend on it, but copies it up to `target/<profile>` only when the
/// library itself was asked for (`cargo build`, or `cargo test` of every
/// target). So `deps/libhipobj.so`, next to the test binary, is the one of
/// this run; `target/<profile>/libhipobj.so` (or
/// `$CARGO_TARGET_DIR/<profile>/libhipobj.so`) may be missing or stale and
/// is only a fallback. Panics if none exists.
pub fn built_library() -> PathBuf {
    built_library_named("libhipobj.so")
}

/// The shared library `name` that cargo built for this test run, looked
/// for as [`built_library`] looks for `libhipobj.so`: the fake library's
/// tests find `libhipobj_fake.so` this way.
pub fn built_library_named(name: &str) -> PathBuf {
    let profile = profile_dir();
    let mut tried = vec![deps_dir().join(name), profile.join(name)];
    if let (Some(target), Some(profile)) =
        (std::env::var_os("CARGO_TARGET_DIR"), profile.file_name())
    {
        tried.push(PathBuf::from(target).join(profile).join(name));
    }
    tried
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "the cdylib was not built for this test run; looked for {tried:?} \
                 (does Cargo.toml still list crate-type \"cdylib\"?)"
            )
        })
}

/// The library under test: `$HIPOBJ_LIB_UNDER_TEST` when set (for example
/// `target/release/libhipobj.so` in CI), else [`built_library`].
pub fn library_under_test() -> PathBuf {
    match std::env::var_os("HIPOBJ_LIB_UNDER_TEST") {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "HIPOBJ_LIB_UNDER_TEST={} is not a file",
                path.display()
            );
            path
        }
        _ => built_library(),
    }
}

/// Fails with the output of the program built from `file` against
/// `library` unless it exited 0.
pub fn assert_program_passed(file: &str, library: &Path, output: &Output) {
    assert!(
        output.status.success(),
        "{file} against {} failed ({}):\n--- stderr ---\n{}--- stdout ---\n{}",
        library.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
}

/// A fresh directory under the system temp dir, removed on drop unless the
/// test is failing (then it is kept, and its path printed, for a look).
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Creates `hipobj-<tag>-<pid>-<n>-<nanos>`.
    pub fn new(tag: &str) -> Scratch {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let path =
            std::env::temp_dir().join(format!("hipobj-{tag}-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        // Canonical, so that paths tools report (CMake) compare equal to ours.
        let path = std::fs::canonicalize(&path)
            .unwrap_or_else(|e| panic!("cannot canonicalize {}: {e}", path.display()));
        Scratch { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping {} for inspection", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Makes `<dir>/lib` a directory where `-lhipobj` finds `lib` at link time
/// and the dynamic loader finds its SONAME, `libhipobj.so.0`, at run time
/// (cargo's output directory has only `libhipobj.so`). Returns `<dir>/lib`.
pub fn link_dir_for(lib: &Path, dir: &Path) -> PathBuf {
    let lib = lib
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    let out = dir.join("lib");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    for name in ["libhipobj.so", "libhipobj.so.0"] {
        let link = out.join(name);
        std::os::unix::fs::symlink(&lib, &link)
            .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
    }
    out
}

/// The arguments that link a program against `libhipobj` found in
/// `link_dir` (see [`link_dir_for`]), with an rpath so it runs as is.
pub fn link_args(link_dir: &Path) -> Vec<String> {
    vec![
        format!("-L{}", link_dir.display()),
        format!("-Wl,-rpath,{}", link_dir.display()),
        "-lhipobj".to_owned(),
    ]
}

/// Compiles and links the C11 program `src` into `out` with
/// `cc -std=c11 -Wall -Wextra -Wpedantic -Werror`, then `extra_args`
/// (include directories, libraries...). With `HIPOBJ_TEST_SANITIZE` set
/// (a `-fsanitize=` list), the program is built with those sanitizers. Panics with the compiler's output
/// on failure, and if `cc` cannot be run: a missing compiler is a failure.
pub fn compile_c<S: AsRef<OsStr>>(src: &Path, out: &Path, extra_args: &[S]) {
    compile("cc", "-std=c11", src, out, extra_args);
}

/// As [`compile_c`], for C++11 with `c++ -std=c++11`.
pub fn compile_cxx<S: AsRef<OsStr>>(src: &Path, out: &Path, extra_args: &[S]) {
    compile("c++", "-std=c++11", src, out, extra_args);
}

fn compile<S: AsRef<OsStr>>(compiler: &str, std: &str, src: &Path, out: &Path, extra: &[S]) {
    let mut cmd = Command::new(compiler);
    cmd.args([std, "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-g"]);
    // The sanitizer lane of scripts/test.sh: HIPOBJ_TEST_SANITIZE=address,undefined.
    if let Some(list) = std::env::var_os("HIPOBJ_TEST_SANITIZE").filter(|v| !v.is_empty()) {
        let mut flag = std::ffi::OsString::from("-fsanitize=");
        flag.push(list);
        cmd.arg(flag)
            .args(["-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]);
    }
    cmd.arg(src).arg("-o").arg(out).args(extra);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler} (a C toolchain is required): {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A command for `program` whose environment holds no `HIPOBJ_*` variable,
/// so that the library's settings are its defaults.
pub fn command_without_hipobj_env(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("HIPOBJ_") {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// Runs `cmd` to completion, killing it after `timeout`; panics if it
/// cannot be started or times out.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // Drain both pipes on threads so a chatty child never blocks on them.
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut buf).ok();
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut buf).ok();
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = err_reader.join().unwrap_or_default();
                panic!(
                    "{cmd:?} did not finish within {timeout:?}; stderr:\n{}",
                    String::from_utf8_lossy(&stderr)
                );
            }
            Err(e) => panic!("waiting for {cmd:?}: {e}"),
        }
    };
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Runs an external tool (`readelf`, `nm`...) and returns its stdout;
/// panics if it cannot be run or fails.
pub fn tool_stdout<S: AsRef<OsStr>>(tool: &str, args: &[S]) -> String {
    let output = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool} (binutils is required): {e}"));
    assert!(
        output.status.success(),
        "{tool} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
