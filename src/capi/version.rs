//! Version and error strings.

use std::ffi::{c_int, CStr};

use super::boundary::{enter, ErrorString, VersionString};
use super::types::{
    hipObjError_t, hipObjOpErrorValue, HIPOBJ_VERSION_MAJOR, HIPOBJ_VERSION_MINOR,
    HIPOBJ_VERSION_PATCH,
};
use crate::error::Error;

/// `"M.m.p"`, from the package version the header's macros are made from.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the package version holds a NUL"),
    };

/// The strings of the result codes, by value.
const ERROR_STRINGS: [&CStr; 14] = [
    c"Success",
    c"Invalid value",
    c"Not initialized",
    c"Already initialized",
    c"RDMA error",
    c"S3 error",
    c"Buffer not registered",
    c"Buffer already registered",
    c"NIC not found",
    c"dmabuf not supported",
    c"Size too large",
    c"Internal error",
    c"Not supported",
    c"Busy",
];

/// Returns the static, NUL-terminated description of `err`; any value that
/// is not a result code gives `"Unknown error"`.
///
/// Needs no initialized library; any thread. The string is never freed.
#[no_mangle]
pub extern "C" fn hipObjGetErrorString(err: hipObjOpErrorValue) -> *const std::ffi::c_char {
    enter("hipObjGetErrorString", || {
        let text = usize::try_from(err)
            .ok()
            .and_then(|i| ERROR_STRINGS.get(i))
            .copied()
            .unwrap_or(c"Unknown error");
        ErrorString(text)
    })
}

/// Returns this library's version as a static `"M.m.p"` string.
///
/// Needs no initialized library; any thread. The string is never freed.
#[no_mangle]
pub extern "C" fn hipObjGetVersionString() -> *const std::ffi::c_char {
    enter("hipObjGetVersionString", || VersionString(VERSION))
}

/// Writes this library's major, minor and patch version numbers.
///
/// Needs no initialized library; any thread. Returns `hipObjInvalidValue`,
/// writing nothing, if any pointer is NULL.
///
/// # Safety
///
/// Each pointer is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hipObjGetVersion(
    major: *mut c_int,
    minor: *mut c_int,
    patch: *mut c_int,
) -> hipObjError_t {
    enter("hipObjGetVersion", || {
        if major.is_null() || minor.is_null() || patch.is_null() {
            return Err(Error::InvalidValue("a version pointer is NULL"));
        }
        // SAFETY: all three are non-NULL, and the caller passes writable ints.
        unsafe {
            major.write(HIPOBJ_VERSION_MAJOR);
            minor.write(HIPOBJ_VERSION_MINOR);
            patch.write(HIPOBJ_VERSION_PATCH);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_macros_match_the_package_version() {
        let expected =
            format!("{HIPOBJ_VERSION_MAJOR}.{HIPOBJ_VERSION_MINOR}.{HIPOBJ_VERSION_PATCH}");
        assert_eq!(VERSION.to_str().unwrap(), expected);
        assert_eq!(env!("CARGO_PKG_VERSION"), expected);
    }
}
