//! The built `libhipobj.so` as the dynamic linker sees it (ABI spec section
//! 1): its SONAME, its exported symbols, their (absent) versions, and its
//! link-time dependencies. Reads the library cargo built for this test run,
//! or `$HIPOBJ_LIB_UNDER_TEST` (e.g. `target/release/libhipobj.so` in CI).
//! Needs binutils (`readelf`, `nm`); a missing tool is a failure.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The 15 functions of spec section 4, the only symbols we may export.
const EXPORTS: [&str; 15] = [
    "hipObjGetErrorString",
    "hipObjInit",
    "hipObjShutdown",
    "hipObjBufRegister",
    "hipObjBufRegisterHost",
    "hipObjBufDeregister",
    "hipObjGet",
    "hipObjPut",
    "hipObjBufSync",
    "hipObjGetRdmaToken",
    "hipObjPutRdmaToken",
    "hipObjParseRdmaReply",
    "hipObjTokenClientNic",
    "hipObjGetVersionString",
    "hipObjGetVersion",
];

/// The only libraries the library may need at link time: glibc and the gcc
/// runtime. Vendor libraries are dlopen'ed.
const ALLOWED_NEEDED: [&str; 6] = [
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
];

fn lib() -> PathBuf {
    common::library_under_test()
}

/// The `readelf -d` entries: each tag (without its parentheses) and the
/// rest of its line.
fn dynamic_section() -> Vec<(String, String)> {
    let lib = lib();
    let text = common::tool_stdout("readelf", &["-d".as_ref(), lib.as_os_str()]);
    text.lines()
        .filter_map(|line| {
            // " 0x000000000000000e (SONAME)             Library soname: [x]"
            let rest = line.trim_start().strip_prefix("0x")?;
            let (_, rest) = rest.split_once(' ')?;
            let rest = rest.trim_start().strip_prefix('(')?;
            let (tag, value) = rest.split_once(')')?;
            Some((tag.to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The `[value]` of each `readelf -d` entry tagged `tag`.
fn dynamic_entries(tag: &str) -> Vec<String> {
    dynamic_section()
        .into_iter()
        .filter(|(t, _)| t == tag)
        .map(|(_, value)| {
            let open = value.find('[');
            let close = value.rfind(']');
            match (open, close) {
                (Some(open), Some(close)) if open < close => value[open + 1..close].to_owned(),
                _ => panic!("unexpected readelf -d {tag} entry: {value:?}"),
            }
        })
        .collect()
}

#[test]
fn soname_is_libhipobj_so_0() {
    assert_eq!(
        dynamic_entries("SONAME"),
        vec!["libhipobj.so.0".to_owned()],
        "{}",
        lib().display()
    );
}

/// The 15 functions, as a set. The library this crate's tests build has
/// nothing else: the controls of `hipobj_fake.h` are the fake library's
/// (testing/fake-library/, whose own tests check its exports).
fn expected_exports() -> BTreeSet<String> {
    EXPORTS.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn exports_exactly_the_15_functions() {
    let lib = lib();
    let text = common::tool_stdout(
        "nm",
        &["-D".as_ref(), "--defined-only".as_ref(), lib.as_os_str()],
    );
    let mut exported = BTreeSet::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        // A defined symbol is "<value> <type> <name>"; nm prints nothing
        // else here but blank lines.
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [value, kind, name] = fields[..] else {
            panic!("unexpected nm line: {line:?}");
        };
        assert!(
            value.chars().all(|c| c.is_ascii_hexdigit()),
            "unexpected nm line: {line:?}"
        );
        assert!(
            !name.starts_with("rust_") && !name.starts_with("__rust_"),
            "Rust runtime symbol exported: {line:?}"
        );
        assert_eq!(kind, "T", "{name} is not a text (function) symbol");
        assert!(exported.insert(name.to_owned()), "{name} listed twice");
    }
    let expected = expected_exports();
    // A library built with the built-in S3 client (feature `s3`, never the
    // release library, which CI checks with HIPOBJ_LIB_UNDER_TEST) links
    // crc-fast, whose C API s3s turns on: its `crc_fast_*` functions are
    // exported beside ours. Only from such a build are they let through.
    let under_test_is_release = std::env::var_os("HIPOBJ_LIB_UNDER_TEST").is_some();
    if cfg!(feature = "s3") && !under_test_is_release {
        exported.retain(|name| !name.starts_with("crc_fast_"));
    }
    let extra: Vec<_> = exported.difference(&expected).collect();
    let missing: Vec<_> = expected.difference(&exported).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{}: extra exports {extra:?}, missing exports {missing:?}",
        lib.display()
    );
}

#[test]
fn exports_carry_no_symbol_versions() {
    let lib = lib();
    let text = common::tool_stdout(
        "readelf",
        &["--dyn-syms".as_ref(), "-W".as_ref(), lib.as_os_str()],
    );
    // "Num: Value Size Type Bind Vis Ndx Name [(version)]"
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(name) = fields.get(7) else { continue };
        if !name.starts_with("hipObj") && !name.starts_with("hipobj") {
            continue;
        }
        assert!(!name.contains('@'), "versioned export: {line:?}");
        assert_eq!(fields.len(), 8, "unexpected readelf line: {line:?}");
        assert_eq!(&fields[3..6], ["FUNC", "GLOBAL", "DEFAULT"], "{line:?}");
        assert_ne!(fields[6], "UND", "{line:?}");
        seen.insert((*name).to_owned());
    }
    let expected = expected_exports();
    assert_eq!(seen, expected, "{}", lib.display());
    // No version definitions at all: the version script is anonymous.
    let tags: Vec<String> = dynamic_section().into_iter().map(|(tag, _)| tag).collect();
    assert!(
        !tags.iter().any(|tag| tag == "VERDEF" || tag == "VERDEFNUM"),
        "{} defines symbol versions: {tags:?}",
        lib.display()
    );
}

#[test]
fn needs_only_the_c_runtime() {
    let needed = dynamic_entries("NEEDED");
    assert!(
        needed.iter().any(|lib| lib == "libc.so.6"),
        "NEEDED lacks libc.so.6: {needed:?}"
    );
    for lib in &needed {
        let lower = lib.to_ascii_lowercase();
        for vendor in ["ibverbs", "rdmacm", "amdhip", "hsa"] {
            assert!(
                !lower.contains(vendor),
                "links {lib} at build time; it must be dlopen'ed"
            );
        }
        assert!(
            ALLOWED_NEEDED.contains(&lib.as_str()),
            "NEEDED {lib} is not a glibc/gcc runtime library (all: {needed:?})"
        );
    }
}
