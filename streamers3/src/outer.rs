//! Which streamer loaded the backend: code 19 (a transient failure) exists
//! only from 0.17 on, and an older outer misreads it. The 0.17 family's
//! `libstreamer.so` exports `runai_file_streamer_request` at version
//! `RUNAI_FILE_STREAMER_1.0`; 0.16 and older do not.

use std::ffi::{c_int, c_void, CStr, CString};

use crate::settings::code;

/// The code for transient failures, and what was found.
pub fn retryable_code() -> (i32, String) {
    let Some(path) = loaded_outer() else {
        // Loaded by something else than the streamer (a harness calling
        // the twelve functions): the current ABI.
        return (
            code::RETRYABLE_FILE_ACCESS,
            "no libstreamer.so is loaded".to_owned(),
        );
    };
    let shown = path.to_string_lossy().into_owned();
    // SAFETY: `path` is a NUL-terminated name of an object that is already
    // loaded; RTLD_NOLOAD only takes a reference to it (or returns NULL),
    // it never loads or initializes anything.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return (
            code::RETRYABLE_FILE_ACCESS,
            format!("{shown} could not be inspected"),
        );
    }
    // SAFETY: `handle` was returned by dlopen above and is open; both
    // names are NUL-terminated literals. The symbol is only compared with
    // NULL, never called.
    let versioned = unsafe {
        libc::dlvsym(
            handle,
            c"runai_file_streamer_request".as_ptr(),
            c"RUNAI_FILE_STREAMER_1.0".as_ptr(),
        )
    };
    // SAFETY: the reference taken by the dlopen above, given back once.
    unsafe { libc::dlclose(handle) };
    if versioned.is_null() {
        (
            code::FILE_ACCESS,
            format!("{shown} is older than 0.17 (no runai_file_streamer_request@RUNAI_FILE_STREAMER_1.0)"),
        )
    } else {
        (
            code::RETRYABLE_FILE_ACCESS,
            format!("{shown} is of the 0.17 family"),
        )
    }
}

/// The path of a loaded object whose name ends in `/libstreamer.so`.
fn loaded_outer() -> Option<CString> {
    let mut found: Option<CString> = None;
    // SAFETY: the callback is called by dl_iterate_phdr on this thread,
    // before it returns, with `data` the `&mut Option<CString>` passed here.
    unsafe {
        libc::dl_iterate_phdr(
            Some(visit),
            (&mut found as *mut Option<CString>).cast::<c_void>(),
        );
    }
    found
}

/// One loaded object: keeps its name if it is the streamer's library.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid `info` for the call, and
    // `data` is the `Option<CString>` of `loaded_outer`, borrowed by no one
    // else while the iteration runs.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Option<CString>>()) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: a non-NULL `dlpi_name` is a NUL-terminated string owned by
    // the loader, valid for the call.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) };
    if name.to_bytes().ends_with(b"/libstreamer.so") {
        *found = Some(name.to_owned());
        return 1;
    }
    0
}
