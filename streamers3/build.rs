//! Links `libstreamers3.so` as the file it replaces is found: SONAME
//! `libstreamers3.so`, so that a copy loaded first (a preload, or
//! `ctypes.CDLL` by path) is the one the streamer's `dlopen` of the bare
//! name returns; `-z nodelete`, so that an unload (the streamer's
//! `dlclose` at exit, or per streamer under shutdown policy 1) never
//! unmaps code that a thread of ours may still run; and a version script
//! that exports the twelve `obj_*` functions and nothing else (the
//! `#[no_mangle]` functions of the hipobj library linked in would
//! otherwise be exported too).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = format!("{dir}/exports.map");
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libstreamers3.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // A fake-world test build exports the world's controls as well (every
    // `#[no_mangle]` function, as rustc's own list has them).
    if std::env::var_os("CARGO_FEATURE_FAKE_WORLD").is_none() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={script}");
    }
}
