//! The fake library applications link their own tests against
//! (`scripts/install.sh --fake`): the 15 functions of `hipobj.h`, the
//! release library's own code, running on the fake RDMA world of
//! `hipobj_testing::c_world`, plus that world's controls
//! (`include/hipobj_fake.h`), which are not part of the ABI. The release
//! library has neither (`tests/abi_symbols.rs` holds it to the 15).
//!
//! The world reaches the C API through [`hipobj::capi::use_platform`],
//! called as this library is loaded, so that every `hipObjInit` of the
//! process runs on it.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void, CStr};

use hipobj_testing::c_world;

// SAFETY: runs as the library is loaded, before any of its functions can
// be called. It only stores a function pointer in a `OnceLock` (no
// allocation, no I/O, nothing of the standard library that needs `main`
// to have run); the world itself is made on the first `hipObjInit`.
#[ctor::ctor(unsafe)]
fn hand_the_world_to_the_c_api() {
    hipobj::capi::use_platform(c_world::platform);
}

/// `sendRequest` for the fake world: fits `hipObjOps_t.sendRequest`, with
/// `ctx` pointing to an `int` holding `HIPOBJ_RDMA_OP_GET` or
/// `HIPOBJ_RDMA_OP_PUT`. Returns 0, or -1 for a NULL or unknown argument.
///
/// # Safety
///
/// `ctx` is NULL or points to an `int`; `token` is NULL or has `len`
/// readable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeSendRequest(
    ctx: *mut c_void,
    token: *const c_char,
    len: usize,
) -> c_int {
    if ctx.is_null() || token.is_null() {
        return -1;
    }
    // SAFETY: `ctx` points to an `int`, per this function's contract.
    let Some(op) = c_world::op(unsafe { *ctx.cast::<c_int>() }) else {
        return -1;
    };
    // SAFETY: `len` readable bytes at `token`, per the contract.
    let text = unsafe { std::slice::from_raw_parts(token.cast::<u8>(), len) };
    c_world::send_request(op, text);
    0
}

/// `recvReply` for the fake world: the reply to this thread's last
/// `hipobjFakeSendRequest`. Returns 0, or -1 if it does not fit `*len`.
///
/// # Safety
///
/// `reply` is NULL or has `*len` writable bytes; `len` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeRecvReply(
    _ctx: *mut c_void,
    reply: *mut c_char,
    len: *mut usize,
) -> c_int {
    if reply.is_null() || len.is_null() {
        return -1;
    }
    let text = c_world::recv_reply();
    // SAFETY: `len` is valid per the contract.
    let room = unsafe { *len };
    if text.len() > room {
        return -1;
    }
    // SAFETY: `room` writable bytes at `reply`, and `text` fits; `len` is
    // valid.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), reply.cast::<u8>(), text.len());
        *len = text.len();
    }
    0
}

/// Writes `len` bytes of `data` at the start of the fake server's object
/// store. Returns 0, or -1 for NULL or more than
/// `hipobjFakeObjectCapacity()` bytes.
///
/// # Safety
///
/// `data` is NULL or has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeSetObject(data: *const c_void, len: usize) -> c_int {
    if data.is_null() {
        return -1;
    }
    // SAFETY: per the contract.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    if c_world::set_object(bytes) {
        0
    } else {
        -1
    }
}

/// Copies the first `len` bytes of the object store to `out`. Returns 0,
/// or -1 for NULL or past the store's end.
///
/// # Safety
///
/// `out` is NULL or has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeGetObject(out: *mut c_void, len: usize) -> c_int {
    if out.is_null() {
        return -1;
    }
    let Some(bytes) = c_world::object(len) else {
        return -1;
    };
    // SAFETY: `len` writable bytes at `out`, per the contract.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), len) };
    0
}

/// Bytes of the fake server's object store.
#[no_mangle]
pub extern "C" fn hipobjFakeObjectCapacity() -> usize {
    c_world::STORE_BYTES
}

/// Hands an application-driven token (`hipObjGetRdmaToken`'s,
/// NUL-terminated) to the fake server as the application's own S3 request
/// would; returns the reply's status (200 when the transfer was done), or
/// -1.
///
/// # Safety
///
/// `token` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeServe(token: *const c_char, op: c_int) -> c_int {
    if token.is_null() {
        return -1;
    }
    let Some(op) = c_world::op(op) else {
        return -1;
    };
    // SAFETY: NUL-terminated, per the contract.
    let text = unsafe { CStr::from_ptr(token) }.to_bytes();
    c_world::serve(op, text)
}

/// How the fake server treats later requests (`HIPOBJ_FAKE_SERVER_*`).
/// Returns 0, or -1 for an unknown value.
#[no_mangle]
pub extern "C" fn hipobjFakeSetServerBehaviour(behaviour: c_int) -> c_int {
    if c_world::set_behaviour(behaviour) {
        0
    } else {
        -1
    }
}

/// Makes the `nth` next call (from 1) of the platform function `function`
/// (`"ibv_post_send"`, `"rdma_listen"`, `"hipHostMalloc"`...) fail as the
/// real one would. Returns 0, or -1 for NULL, a function the fake platform
/// does not have, or `nth` 0.
///
/// # Safety
///
/// `function` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeFailCall(function: *const c_char, nth: c_uint) -> c_int {
    if function.is_null() {
        return -1;
    }
    // SAFETY: NUL-terminated, per the contract.
    let name = unsafe { CStr::from_ptr(function) };
    match name.to_str() {
        Ok(name) if c_world::fail_call(name, u64::from(nth)) => 0,
        _ => -1,
    }
}

/// Drops every failure planned with `hipobjFakeFailCall`.
#[no_mangle]
pub extern "C" fn hipobjFakeClearFaults() {
    c_world::clear_faults();
}

/// Requests the fake server has handled.
#[no_mangle]
pub extern "C" fn hipobjFakeRequests() -> c_ulong {
    c_world::requests()
}

/// Live fake platform objects of `kind` (`"mr"`, `"qp"`, `"cq"`, `"pd"`,
/// `"cm_id"`...), the fake server's own included; -1 for NULL.
///
/// # Safety
///
/// `kind` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeLiveObjects(kind: *const c_char) -> c_long {
    if kind.is_null() {
        return -1;
    }
    // SAFETY: NUL-terminated, per the contract.
    let kind = unsafe { CStr::from_ptr(kind) };
    kind.to_str().map_or(-1, c_world::live)
}

/// `len` zeroed bytes of the fake GPU's memory (device 0): what
/// `hipObjBufRegister` treats as GPU memory. NULL for 0 bytes or when the
/// fake refuses. Free with `hipobjFakeDeviceFree`.
#[no_mangle]
pub extern "C" fn hipobjFakeDeviceAlloc(len: usize) -> *mut c_void {
    c_world::device_alloc(len).map_or(std::ptr::null_mut(), std::ptr::with_exposed_provenance_mut)
}

/// Frees memory from `hipobjFakeDeviceAlloc`. Returns 0, or -1 for another
/// address.
#[no_mangle]
pub extern "C" fn hipobjFakeDeviceFree(ptr: *mut c_void) -> c_int {
    if c_world::device_free(ptr.expose_provenance()) {
        0
    } else {
        -1
    }
}

/// Copies `len` bytes from host memory `src` to fake GPU memory `dst` (as a
/// GPU runtime's host-to-device copy). Returns 0, or -1 for NULL or a range
/// outside one fake allocation.
///
/// # Safety
///
/// `src` is NULL or has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeDeviceWrite(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
) -> c_int {
    if dst.is_null() || src.is_null() {
        return -1;
    }
    // SAFETY: `len` readable bytes at `src`, per the contract.
    let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
    if c_world::device_write(dst.expose_provenance(), data) {
        0
    } else {
        -1
    }
}

/// Copies `len` bytes from fake GPU memory `src` to host memory `dst`.
/// Returns 0, or -1 for NULL or a range outside one fake allocation.
///
/// # Safety
///
/// `dst` is NULL or has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjFakeDeviceRead(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
) -> c_int {
    if dst.is_null() || src.is_null() {
        return -1;
    }
    let Some(bytes) = c_world::device_read(src.expose_provenance(), len) else {
        return -1;
    };
    // SAFETY: `len` writable bytes at `dst`, per the contract; `bytes` has
    // `len` of them.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast::<u8>(), len) };
    0
}
