//! The fake library's SONAME is the release library's, `libhipobj.so.0`:
//! an application's test program links against it under that name.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhipobj.so.0");
    }
}
