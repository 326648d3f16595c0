//! `scripts/install.sh` installs the cdylib built for this test run into a
//! prefix with the documented file tree, and `examples/consumer` builds and
//! runs against that prefix both through the CMake package and through
//! pkg-config; the CMake package still works after the prefix is moved.
//!
//! cmake, pkg-config and a C compiler are required: a missing tool fails the
//! test, it is never skipped.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::{built_library, manifest_dir, Scratch};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const MAJOR: &str = env!("CARGO_PKG_VERSION_MAJOR");
const MINOR: &str = env!("CARGO_PKG_VERSION_MINOR");

fn c_compiler() -> String {
    std::env::var("CC")
        .ok()
        .filter(|cc| !cc.trim().is_empty())
        .unwrap_or_else(|| "cc".to_owned())
}

/// Fails, with a message saying what to install, unless `program --version` runs.
fn require_tool(program: &str) {
    let runs = Command::new(program)
        .arg("--version")
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false);
    assert!(
        runs,
        "`{program} --version` does not run: tests/install.rs needs cmake, pkg-config and a C \
         compiler. Install them (Debian/Ubuntu: `apt-get install cmake pkg-config gcc make`) \
         and run the test again."
    );
}

fn describe(cmd: &Command) -> String {
    let mut text = format!("{cmd:?}");
    if let Some(dir) = cmd.get_current_dir() {
        text.push_str(&format!(" (in {})", dir.display()));
    }
    text
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd`, panicking with its output unless it exits 0.
fn run(cmd: &mut Command) -> Output {
    let desc = describe(cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    assert!(
        out.status.success(),
        "{desc} failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// `scripts/install.sh` with a clean environment for what it reads.
fn install_cmd() -> Command {
    let mut cmd = Command::new(manifest_dir().join("scripts/install.sh"));
    cmd.current_dir(manifest_dir()).env_remove("DESTDIR");
    cmd
}

fn install(prefix: &Path, lib: &Path) {
    let out = run(install_cmd()
        .arg("--prefix")
        .arg(prefix)
        .arg("--no-build")
        .arg("--lib")
        .arg(lib));
    assert!(
        text(&out.stdout).contains(VERSION),
        "install.sh should report the version it installed; got: {}",
        text(&out.stdout)
    );
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn read_text(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn assert_symlink(link: &Path, target: &str) {
    let meta =
        fs::symlink_metadata(link).unwrap_or_else(|e| panic!("{} is missing: {e}", link.display()));
    assert!(
        meta.file_type().is_symlink(),
        "{} should be a symlink",
        link.display()
    );
    let found = fs::read_link(link).expect("read_link");
    assert_eq!(
        found,
        Path::new(target),
        "{} should point to {target}",
        link.display()
    );
}

/// Checks the installed file tree under `root` (which is the prefix, or
/// `$DESTDIR/prefix`), and that `hipobj.pc` names `prefix`.
fn check_tree(root_dir: &Path, prefix: &Path, lib: &Path) {
    let libdir = root_dir.join("lib");
    let real_name = format!("libhipobj.so.{VERSION}");
    let soname = format!("libhipobj.so.{MAJOR}");

    let real = libdir.join(&real_name);
    let meta = fs::symlink_metadata(&real)
        .unwrap_or_else(|e| panic!("{} is missing: {e}", real.display()));
    assert!(
        meta.file_type().is_file(),
        "{} should be a regular file",
        real.display()
    );
    assert!(
        read(&real) == read(lib),
        "{} differs from {}",
        real.display(),
        lib.display()
    );
    assert_eq!(mode(&real), 0o755, "mode of {}", real.display());
    assert_symlink(&libdir.join(&soname), &real_name);
    assert_symlink(&libdir.join("libhipobj.so"), &soname);

    let header = root_dir.join("include/hipobj/hipobj.h");
    assert!(
        read(&header) == read(&manifest_dir().join("include/hipobj.h")),
        "{} differs from include/hipobj.h",
        header.display()
    );
    assert_eq!(mode(&header), 0o644, "mode of {}", header.display());

    let cmake_dir = libdir.join("cmake/hipobj");
    let prefix_text = prefix.to_str().expect("UTF-8 prefix");
    for name in ["hipobjConfig.cmake", "hipobjConfigVersion.cmake"] {
        let file = cmake_dir.join(name);
        let body = read_text(&file);
        assert_eq!(mode(&file), 0o644, "mode of {}", file.display());
        assert!(
            !body.contains('@'),
            "{} has an unsubstituted @VAR@",
            file.display()
        );
        assert!(
            !body.contains(prefix_text),
            "{} must not hard-code the prefix {prefix_text}: the package must be relocatable",
            file.display()
        );
        assert!(
            body.contains(VERSION),
            "{} lacks the version",
            file.display()
        );
    }

    let pc = libdir.join("pkgconfig/hipobj.pc");
    let body = read_text(&pc);
    assert_eq!(mode(&pc), 0o644, "mode of {}", pc.display());
    for line in [
        format!("prefix={prefix_text}"),
        format!("Version: {VERSION}"),
        "Cflags: -I${includedir}/hipobj".to_owned(),
        "Libs: -L${libdir} -lhipobj".to_owned(),
    ] {
        assert!(
            body.lines().any(|l| l.trim_end() == line),
            "{} lacks the line `{line}`:\n{body}",
            pc.display()
        );
    }
}

/// Runs a consumer binary without LD_LIBRARY_PATH, so that only its rpath
/// can find the library, and checks its exit status and output.
fn run_consumer(binary: &Path) {
    let out = run(Command::new(binary).env_remove("LD_LIBRARY_PATH"));
    assert_eq!(
        text(&out.stdout),
        format!("hipobj version {VERSION}\n"),
        "output of {}",
        binary.display()
    );
}

/// Builds `examples/consumer` with CMake against `prefix` in `build`, and
/// checks that CMake found the package inside `prefix`. Returns the binary.
fn cmake_build(prefix: &Path, build: &Path) -> PathBuf {
    run(Command::new("cmake")
        .arg("-S")
        .arg(manifest_dir().join("examples/consumer"))
        .arg("-B")
        .arg(build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .env_remove("hipobj_DIR")
        .env_remove("HIPOBJ_DIR"));
    let cache = read_text(&build.join("CMakeCache.txt"));
    let expected = format!(
        "hipobj_DIR:PATH={}",
        prefix.join("lib/cmake/hipobj").display()
    );
    assert!(
        cache.lines().any(|l| l == expected),
        "CMake should have found hipobj in {} (expected `{expected}` in CMakeCache.txt)",
        prefix.display()
    );
    run(Command::new("cmake").arg("--build").arg(build));
    let binary = build.join("consumer");
    assert!(binary.is_file(), "{} was not built", binary.display());
    binary
}

/// Checks the imported target's properties and the version compatibility
/// rules with a throwaway CMake project.
fn cmake_check_package(prefix: &Path, work: &Path) {
    let major: u32 = MAJOR.parse().expect("major version");
    let minor: u32 = MINOR.parse().expect("minor version");
    let source = work.join("src");
    fs::create_dir_all(&source).expect("create project dir");
    let project = format!(
        r#"cmake_minimum_required(VERSION 3.16)
project(hipobj_package_check NONE)

find_package(hipobj {major}.{minor} CONFIG REQUIRED)
if(NOT hipobj_FOUND OR NOT hipobj_VERSION STREQUAL "{VERSION}")
  message(FATAL_ERROR "hipobj_FOUND=${{hipobj_FOUND}} hipobj_VERSION=${{hipobj_VERSION}}")
endif()
if(NOT TARGET hipobj::hipobj)
  message(FATAL_ERROR "no target hipobj::hipobj")
endif()
get_target_property(type hipobj::hipobj TYPE)
get_target_property(imported hipobj::hipobj IMPORTED)
get_target_property(location hipobj::hipobj IMPORTED_LOCATION)
get_target_property(soname hipobj::hipobj IMPORTED_SONAME)
get_target_property(includes hipobj::hipobj INTERFACE_INCLUDE_DIRECTORIES)
foreach(pair
    "type|${{type}}|SHARED_LIBRARY"
    "imported|${{imported}}|TRUE"
    "location|${{location}}|${{EXPECTED_PREFIX}}/lib/libhipobj.so.{VERSION}"
    "soname|${{soname}}|libhipobj.so.{major}"
    "includes|${{includes}}|${{EXPECTED_PREFIX}}/include/hipobj")
  string(REPLACE "|" ";" pair "${{pair}}")
  list(GET pair 0 what)
  list(GET pair 1 got)
  list(GET pair 2 want)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "hipobj::hipobj ${{what}} is '${{got}}', expected '${{want}}'")
  endif()
endforeach()

# SameMajorVersion: another major, or a newer minor, is not compatible.
foreach(request {next_major} {major}.{next_minor})
  find_package(hipobj ${{request}} CONFIG QUIET)
  if(hipobj_FOUND)
    message(FATAL_ERROR "hipobj {VERSION} accepted a request for ${{request}}")
  endif()
endforeach()
find_package(hipobj {major} CONFIG QUIET)
if(NOT hipobj_FOUND)
  message(FATAL_ERROR "hipobj {VERSION} refused a request for {major}")
endif()
find_package(hipobj {VERSION} EXACT CONFIG QUIET)
if(NOT hipobj_FOUND)
  message(FATAL_ERROR "hipobj {VERSION} refused an EXACT request for {VERSION}")
endif()
"#,
        next_major = major + 1,
        next_minor = minor + 1,
    );
    fs::write(source.join("CMakeLists.txt"), project).expect("write CMakeLists.txt");
    run(Command::new("cmake")
        .arg("-S")
        .arg(&source)
        .arg("-B")
        .arg(work.join("build"))
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .arg(format!("-DEXPECTED_PREFIX={}", prefix.display()))
        .env_remove("hipobj_DIR")
        .env_remove("HIPOBJ_DIR"));
}

/// Builds `examples/consumer/main.c` with the flags pkg-config gives for the
/// installed `hipobj.pc`, with an rpath to `prefix/lib`. Returns the binary.
fn pkg_config_build(prefix: &Path, out_dir: &Path) -> PathBuf {
    let pc_path = prefix.join("lib/pkgconfig");
    let pkg_config = |args: &[&str]| {
        let out = run(Command::new("pkg-config")
            .args(args)
            .arg("hipobj")
            .env("PKG_CONFIG_PATH", &pc_path)
            .env_remove("PKG_CONFIG_SYSROOT_DIR"));
        text(&out.stdout).trim().to_owned()
    };
    assert_eq!(pkg_config(&["--modversion"]), VERSION);
    let flags = pkg_config(&["--cflags", "--libs"]);
    let include_flag = format!("-I{}", prefix.join("include/hipobj").display());
    let lib_flag = format!("-L{}", prefix.join("lib").display());
    for want in [include_flag.as_str(), lib_flag.as_str(), "-lhipobj"] {
        assert!(
            flags.split_whitespace().any(|f| f == want),
            "pkg-config --cflags --libs hipobj gave `{flags}`, without `{want}`"
        );
    }

    let binary = out_dir.join("consumer-pkg-config");
    let cc = c_compiler();
    let mut cc_words = cc.split_whitespace();
    let mut cmd = Command::new(cc_words.next().expect("CC is not empty"));
    cmd.args(cc_words)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg(manifest_dir().join("examples/consumer/main.c"))
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .arg("-o")
        .arg(&binary);
    run(&mut cmd);
    binary
}

#[test]
fn install_then_build_consumers_with_cmake_and_pkg_config() {
    require_tool("cmake");
    require_tool("pkg-config");
    require_tool(&c_compiler());
    let lib = built_library();

    let tmp = Scratch::new("install");
    let prefix = tmp.path().join("prefix");

    // Twice: re-running over an existing installation must work.
    install(&prefix, &lib);
    install(&prefix, &lib);
    check_tree(&prefix, &prefix, &lib);

    // (a) CMake, through find_package(hipobj CONFIG).
    cmake_check_package(&prefix, &tmp.path().join("package-check"));
    let cmake_binary = cmake_build(&prefix, &tmp.path().join("build"));
    run_consumer(&cmake_binary);

    // (b) pkg-config.
    let pc_binary = pkg_config_build(&prefix, tmp.path());
    run_consumer(&pc_binary);

    // The CMake package is relocatable: move the prefix (deeper, another
    // name) and build again from the new location only.
    let moved = tmp.path().join("elsewhere/deeper/moved-prefix");
    fs::create_dir_all(moved.parent().expect("parent")).expect("create move target");
    fs::rename(&prefix, &moved).expect("move the prefix");
    assert!(!prefix.exists(), "{} should be gone", prefix.display());
    cmake_check_package(&moved, &tmp.path().join("package-check-moved"));
    let moved_binary = cmake_build(&moved, &tmp.path().join("build-moved"));
    run_consumer(&moved_binary);
}

#[test]
fn install_honours_destdir() {
    let lib = built_library();
    let tmp = Scratch::new("destdir");
    let stage = tmp.path().join("stage");
    let prefix = Path::new("/opt/hipobj-destdir-test");
    run(install_cmd()
        .env("DESTDIR", &stage)
        .arg("--prefix")
        .arg(prefix)
        .arg("--lib")
        .arg(&lib));
    let staged_root = stage.join(prefix.strip_prefix("/").expect("absolute prefix"));
    check_tree(&staged_root, prefix, &lib);
    assert!(
        !prefix.exists(),
        "nothing may be installed outside DESTDIR ({} exists)",
        prefix.display()
    );
}

#[test]
fn install_fails_clearly_on_bad_arguments() {
    let tmp = Scratch::new("badargs");
    let prefix = tmp.path().join("prefix");
    let missing_lib = tmp.path().join("no-such-libhipobj.so");

    let cases: [(&[&OsStr], &str); 4] = [
        (&[OsStr::new("--no-build")], "missing --prefix"),
        (&[OsStr::new("--prefix")], "--prefix needs a directory"),
        (
            &[
                OsStr::new("--prefix"),
                prefix.as_os_str(),
                OsStr::new("--lib"),
                missing_lib.as_os_str(),
            ],
            "not found",
        ),
        (
            &[
                OsStr::new("--prefix"),
                prefix.as_os_str(),
                OsStr::new("--bogus"),
            ],
            "unknown argument: --bogus",
        ),
    ];
    for (args, message) in cases {
        let mut cmd = install_cmd();
        cmd.args(args);
        let desc = describe(&cmd);
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{desc} should fail");
        assert!(
            stderr.contains(message),
            "{desc} should say `{message}` on stderr, said:\n{stderr}"
        );
    }
    assert!(
        !prefix.join("lib").exists(),
        "a failed install must not create the prefix's lib directory"
    );
}
