//! Helpers that turn raw C arguments into Rust values.

use std::ffi::{c_char, CStr};

use crate::error::{Error, Result};

/// Copies an optional C string; NULL gives `None`. Invalid UTF-8 is
/// replaced, since the values are names and labels, never keys.
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string valid for this call.
pub(crate) unsafe fn opt_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The bytes of `len` bytes at `p`; a length above `isize::MAX` (no
/// object is that long) is `InvalidValue`.
///
/// # Safety
///
/// `p` is non-NULL and valid for reads of `len` bytes for the returned
/// lifetime, and nothing writes them meanwhile.
pub(crate) unsafe fn bytes<'a>(p: *const c_char, len: usize) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    // `from_raw_parts` needs a length of at most isize::MAX bytes; no
    // object the caller can hand over is longer.
    if isize::try_from(len).is_err() {
        return Err(Error::InvalidValue("a length above isize::MAX"));
    }
    // SAFETY: the caller guarantees `len` readable bytes at `p`; `c_char`
    // and `u8` have the same size and alignment; `len` fits an isize.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}
