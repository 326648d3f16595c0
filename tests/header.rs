//! The committed `include/hipobj.h` is exactly what the pinned cbindgen
//! generates from `src/capi`, and compiles alone as C11 and C++11.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let root = root();
    let config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml parses");
    // src/capi alone: the other modules are not the ABI, and reading only
    // this tree keeps their items (and their constants) out of the header
    // without a marker on each, which rustdoc would show as the first
    // words of their summaries.
    let bindings = cbindgen::Builder::new()
        .with_src(root.join("src/capi/mod.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

#[test]
fn committed_header_matches_cbindgen_output() {
    let path = root().join("include/hipobj.h");
    let generated = generate();
    if std::env::var_os("HIPOBJ_BLESS").is_some() {
        let staged = path.with_extension("h.new");
        std::fs::write(&staged, &generated).unwrap();
        std::fs::rename(&staged, &path).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/hipobj.h differs from cbindgen's output; run HIPOBJ_BLESS=1 cargo test --test header and commit"
    );
}

fn compile_alone(compiler: &str, std: &str, ext: &str) {
    let dir = std::env::temp_dir().join(format!("hipobj-header-{}-{std}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("only_header.{ext}"));
    std::fs::write(
        &src,
        "#include <hipobj.h>\nint main(void) { return hipObjSuccess; }\n",
    )
    .unwrap();
    let include: &Path = &root().join("include");
    let out = Command::new(compiler)
        .args([
            &format!("-std={std}"),
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-fsyntax-only",
        ])
        .arg("-I")
        .arg(include)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} -std={std}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn header_compiles_alone_as_c11() {
    compile_alone("cc", "c11", "c");
}

#[test]
fn header_compiles_alone_as_cxx11() {
    compile_alone("c++", "c++11", "cpp");
}
