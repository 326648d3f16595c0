//! `libstreamers3.so`: the Run:ai model streamer's S3 backend over hipobj.
//!
//! The streamer's `libstreamer.so` loads this file by name for `s3://`
//! paths and calls its twelve `obj_*` functions (the ABI is described in
//! `docs/ml.md`). Reads go by RDMA through a hipobj gateway into the
//! streamer's buffer when an RDMA device exists and the gateway offers
//! RDMA, and as plain ranged GETs otherwise.
//!
//! Layout: this file holds every exported function (the only
//! `#[no_mangle]` code, each one call to `enter`, which catches panics),
//! and the pointer handling; `backend` the clients, reads and listings;
//! `settings` the pure parts (URIs, the window, codes, the environment);
//! `report` the log and the counters; `outer` the streamer's version.

mod backend;
// The test build (feature fake-world) exports the fake world's controls
// (include/hipobj_fake.h) to the test's S3 look-alike: the fake library's
// crate, linked in for its exports.
#[cfg(feature = "fake-world")]
extern crate hipobj_fake;
mod outer;
mod report;
mod settings;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use backend::{backend, ClientConfig, Dst, Event, WaitMode};
use report::{log, Level};
use settings::code;

/// `ObjectConfigParam_t`.
#[repr(C)]
pub struct ObjectConfigParam {
    key: *const c_char,
    value: *const c_char,
}

/// `ObjectClientConfig_t`.
#[repr(C)]
pub struct ObjectClientConfig {
    endpoint_url: *const c_char,
    default_storage_chunk_size: usize,
    initial_params: *const ObjectConfigParam,
    num_initial_params: c_uint,
}

/// `ObjectRange_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ObjectRange {
    offset: usize,
    length: usize,
}

/// `ObjectCompletionEvent_t`.
#[repr(C)]
pub struct ObjectCompletionEvent {
    request_id: u64,
    response_code: c_int,
    bytes_transferred: usize,
}

/// `ObjectFileEntry_t`.
#[repr(C)]
pub struct ObjectFileEntry {
    path: *mut c_char,
    size: usize,
}

/// Runs an export's body: a panic becomes code 11, never an unwind into C.
fn enter(name: &str, body: impl FnOnce() -> i32) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(code) => code,
        Err(_) => {
            log(
                Level::Error,
                &format!("{name}: internal error (a panic), code 11"),
            );
            code::UNKNOWN
        }
    }
}

/// A client handle as the streamer holds it: the backend's number.
fn handle_of(client: *mut c_void) -> usize {
    client as usize
}

/// # Safety
///
/// `text`, if not NULL, points to a NUL-terminated string valid for the
/// call.
unsafe fn string(text: *const c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Opens the backend: idempotent; leaves `*out_backend_handle` NULL (the
/// backend is the process's).
///
/// # Safety
///
/// `out_backend_handle` is NULL or points to a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn obj_open_backend(out_backend_handle: *mut *mut c_void) -> c_int {
    enter("obj_open_backend", || {
        backend().open();
        if !out_backend_handle.is_null() {
            // SAFETY: the caller's contract: a writable pointer.
            unsafe { out_backend_handle.write(std::ptr::null_mut()) };
        }
        code::SUCCESS
    })
}

/// Closes the backend: reports the counters; joins no thread.
#[no_mangle]
pub extern "C" fn obj_close_backend(_backend_handle: *mut c_void) -> c_int {
    enter("obj_close_backend", || {
        backend().close();
        code::SUCCESS
    })
}

/// 0: the backend stays loaded until the process exits (reader threads may
/// outlive a streamer, stalled on a server, and must never run unmapped
/// code).
#[no_mangle]
pub extern "C" fn obj_get_backend_shutdown_policy() -> c_int {
    0
}

/// `max_inflight_bytes`: the in-flight budget per client, in decimal.
///
/// # Safety
///
/// `key` is NULL or a NUL-terminated string; `out` has room for
/// `*in_out_len` bytes; `in_out_len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn obj_get_backend_config(
    _backend_handle: *mut c_void,
    key: *const c_char,
    out: *mut c_char,
    in_out_len: *mut c_uint,
) -> c_int {
    enter("obj_get_backend_config", || {
        if out.is_null() || in_out_len.is_null() {
            return code::UNKNOWN;
        }
        // SAFETY: the caller's contract.
        let Some(key) = (unsafe { string(key) }) else {
            return code::UNKNOWN;
        };
        if key != "max_inflight_bytes" {
            log(
                Level::Debug,
                &format!("obj_get_backend_config: unknown key {key:?}"),
            );
            return code::UNKNOWN;
        }
        let value = backend().window().to_string();
        // SAFETY: `in_out_len` is not NULL and writable (the contract).
        let room = unsafe { in_out_len.read() };
        let Ok(len) = c_uint::try_from(value.len()) else {
            return code::UNKNOWN;
        };
        if usize::try_from(room).map_or(true, |room| room < value.len() + 1) {
            // SAFETY: as above.
            unsafe { in_out_len.write(len + 1) };
            return code::UNKNOWN;
        }
        // SAFETY: `out` has room for `room` bytes, checked to hold the value
        // and its NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(value.as_ptr(), out.cast::<u8>(), value.len());
            out.add(value.len()).write(0);
            in_out_len.write(len);
        }
        code::SUCCESS
    })
}

/// Creates a client of the endpoint `cfg` names.
///
/// # Safety
///
/// `cfg` is NULL or a valid `ObjectClientConfig_t` for the call (its
/// strings NUL-terminated, its params array of `num_initial_params`
/// entries); `out_client` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn obj_create_client(
    _backend_handle: *mut c_void,
    cfg: *const ObjectClientConfig,
    out_client: *mut *mut c_void,
) -> c_int {
    enter("obj_create_client", || {
        if cfg.is_null() || out_client.is_null() {
            return code::UNKNOWN;
        }
        // SAFETY: `cfg` is a valid config for the call (the contract).
        let cfg = unsafe { &*cfg };
        let mut config = ClientConfig {
            // SAFETY: a NUL-terminated string or NULL (the contract).
            endpoint: unsafe { string(cfg.endpoint_url) },
            chunk: cfg.default_storage_chunk_size as u64,
            params: Vec::new(),
        };
        if !cfg.initial_params.is_null() {
            let Ok(n) = usize::try_from(cfg.num_initial_params) else {
                return code::UNKNOWN;
            };
            // SAFETY: `initial_params` points to `num_initial_params`
            // entries valid for the call (the contract).
            let params = unsafe { std::slice::from_raw_parts(cfg.initial_params, n) };
            for param in params {
                // SAFETY: each key and value is NULL or NUL-terminated.
                if let Some(key) = unsafe { string(param.key) } {
                    // SAFETY: as above.
                    config.params.push((key, unsafe { string(param.value) }));
                }
            }
        }
        match backend().create_client(&config) {
            Ok(handle) => {
                // SAFETY: `out_client` is writable (the contract).
                unsafe { out_client.write(handle as *mut c_void) };
                code::SUCCESS
            }
            Err((code, why)) => {
                log(
                    Level::Error,
                    &format!("obj_create_client: {why} (code {code})"),
                );
                code
            }
        }
    })
}

/// Removes a client: returns when no byte can land in its destinations.
#[no_mangle]
pub extern "C" fn obj_remove_client(client: *mut c_void) -> c_int {
    enter("obj_remove_client", || {
        if backend().remove_client(handle_of(client)) {
            code::SUCCESS
        } else {
            code::UNKNOWN
        }
    })
}

/// Removes every client, as `obj_remove_client` does.
#[no_mangle]
pub extern "C" fn obj_remove_all_clients() -> c_int {
    enter("obj_remove_all_clients", || {
        if backend().remove_all() {
            code::SUCCESS
        } else {
            code::UNKNOWN
        }
    })
}

/// Wakes every wait of every client there is; their waits end.
#[no_mangle]
pub extern "C" fn obj_cancel_all_reads() -> c_int {
    enter("obj_cancel_all_reads", || {
        backend().cancel_all();
        code::SUCCESS
    })
}

/// Queues a read of `range` of `path` into `dst`; never blocks.
///
/// # Safety
///
/// `path` is NULL or NUL-terminated; `dst` points to `range.length`
/// writable bytes that stay valid until the read's completion is taken or
/// the client is removed.
#[no_mangle]
pub unsafe extern "C" fn obj_request_read(
    client: *mut c_void,
    path: *const c_char,
    range: ObjectRange,
    dst: *mut c_char,
    request_id: u64,
) -> c_int {
    enter("obj_request_read", || {
        if client.is_null() || dst.is_null() || range.length == 0 {
            return code::UNKNOWN;
        }
        // SAFETY: NULL or NUL-terminated (the contract).
        let Some(path) = (unsafe { string(path) }) else {
            return code::UNKNOWN;
        };
        // SAFETY: the contract passed on: `dst` is valid and the read's
        // until its completion is taken or the client removed.
        let dst = unsafe { Dst::new(dst.cast::<u8>(), range.length) };
        backend().request_read(
            handle_of(client),
            &path,
            range.offset as u64,
            dst,
            request_id,
        )
    })
}

/// Takes up to `max` completions (§1.7 of the ABI: BLOCK returns Success
/// only with events; a stopped or idle client gives FinishedError).
///
/// # Safety
///
/// `events` points to `max` writable events; `out_n` is writable.
#[no_mangle]
pub unsafe extern "C" fn obj_wait_for_completions(
    client: *mut c_void,
    events: *mut ObjectCompletionEvent,
    max: c_uint,
    out_n: *mut c_uint,
    mode: c_int,
) -> c_int {
    enter("obj_wait_for_completions", || {
        if client.is_null() || events.is_null() || out_n.is_null() || max == 0 {
            return code::UNKNOWN;
        }
        let Ok(mode) = WaitMode::try_from(mode) else {
            return code::INVALID_PARAMETER;
        };
        let Ok(max) = usize::try_from(max) else {
            return code::UNKNOWN;
        };
        let mut taken = vec![
            Event {
                id: 0,
                code: 0,
                bytes: 0
            };
            max.min(1024)
        ];
        let (code, n) = backend().wait(handle_of(client), &mut taken, mode);
        for (i, event) in taken.iter().take(n).enumerate() {
            // SAFETY: `events` has room for `max` events and `i < n <=
            // max` (the contract).
            unsafe {
                events.add(i).write(ObjectCompletionEvent {
                    request_id: event.id,
                    response_code: event.code,
                    bytes_transferred: usize::try_from(event.bytes).unwrap_or(usize::MAX),
                });
            }
        }
        // SAFETY: writable (the contract); n <= 1024 fits.
        unsafe { out_n.write(c_uint::try_from(n).unwrap_or(0)) };
        code
    })
}

/// Lists the objects under `prefix` (an `s3://` URI): all of them, or one
/// level; full URIs with their sizes, freed by `obj_free_file_list`.
///
/// # Safety
///
/// `prefix` is NULL or NUL-terminated; `out_entries` and `out_num` are NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn obj_list_files(
    client: *mut c_void,
    prefix: *const c_char,
    is_recursive: c_int,
    out_entries: *mut *mut ObjectFileEntry,
    out_num: *mut c_uint,
) -> c_int {
    enter("obj_list_files", || {
        if client.is_null() || out_entries.is_null() || out_num.is_null() {
            return code::INVALID_PARAMETER;
        }
        // SAFETY: NULL or NUL-terminated (the contract).
        let Some(prefix) = (unsafe { string(prefix) }) else {
            return code::INVALID_PARAMETER;
        };
        let listed = match backend().list(handle_of(client), &prefix, is_recursive != 0) {
            Ok(listed) => listed,
            Err((code, why)) => {
                log(
                    Level::Error,
                    &format!("obj_list_files: {why} (code {code})"),
                );
                return code;
            }
        };
        let Ok(num) = c_uint::try_from(listed.len()) else {
            return code::UNKNOWN;
        };
        let mut entries = Vec::with_capacity(listed.len());
        for (path, size) in listed {
            let Ok(path) = CString::new(path) else {
                // A key with a NUL cannot be handed over: free what was made.
                free_entries(&entries);
                return code::UNKNOWN;
            };
            entries.push(ObjectFileEntry {
                path: path.into_raw(),
                size: usize::try_from(size).unwrap_or(usize::MAX),
            });
        }
        let pointer = if entries.is_empty() {
            std::ptr::null_mut()
        } else {
            // A boxed slice: its length is the count handed out, so
            // `obj_free_file_list` rebuilds it exactly.
            Box::into_raw(entries.into_boxed_slice()).cast::<ObjectFileEntry>()
        };
        // SAFETY: both writable (the contract); written only on success.
        unsafe {
            out_entries.write(pointer);
            out_num.write(num);
        }
        code::SUCCESS
    })
}

/// Frees what `obj_list_files` returned; `(NULL, 0)` is accepted.
///
/// # Safety
///
/// `entries` and `num` are NULL and 0, or exactly what one successful
/// `obj_list_files` returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn obj_free_file_list(entries: *mut ObjectFileEntry, num: c_uint) {
    enter("obj_free_file_list", || {
        let Ok(num) = usize::try_from(num) else {
            return code::UNKNOWN;
        };
        if entries.is_null() || num == 0 {
            return code::SUCCESS;
        }
        // SAFETY: the contract: a boxed slice of `num` entries made by
        // `obj_list_files`, handed back once.
        let entries = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(entries, num)) };
        free_entries(&entries);
        code::SUCCESS
    });
}

/// Frees the path strings of `entries` (made by `CString::into_raw`); the
/// caller drops the entries.
fn free_entries(entries: &[ObjectFileEntry]) {
    for entry in entries.iter() {
        if !entry.path.is_null() {
            // SAFETY: every non-NULL path of an entry was made by
            // `CString::into_raw` in `obj_list_files` and is freed here
            // once, with its entries.
            drop(unsafe { CString::from_raw(entry.path) });
        }
    }
}
