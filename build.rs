//! Link settings for the shared library.
//!
//! The C ABI promises a SONAME of `libhipobj.so.0`. The export list needs no
//! script of ours: rustc already gives a `cdylib` an anonymous version script
//! that exports the `#[no_mangle]` functions and hides everything else, and
//! `tests/abi_symbols.rs` checks that the result is exactly the 15 functions.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // Without the C functions (feature capi off) hipobj is linked into
    // another library, whose SONAME is its own.
    let capi = std::env::var_os("CARGO_FEATURE_CAPI").is_some();
    if target_os == "linux" && capi {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhipobj.so.{major}");
    }
}
