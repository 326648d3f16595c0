//! A fake world for C test programs (fake-platform builds only).
//!
//! When `HIPOBJ_TEST_WORLD=1` is set, `hipObjInit` builds its instance on
//! one process-wide [`World`] instead of the real platform, and the
//! functions below, exported by test builds only, let a C program play the
//! application's S3 client against the world's test server: they fit
//! `hipObjOps_t` directly, with `ctx` pointing to an `int` holding
//! `HIPOBJ_RDMA_OP_GET` or `HIPOBJ_RDMA_OP_PUT`. They are not part of the
//! ABI and never in a release library.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};

use super::world::World;
use crate::platform::Platform;
use crate::server::Op;

/// The process's test world, made on first use.
fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(World::new)
}

/// The platform `hipObjInit` uses: the test world's when
/// `HIPOBJ_TEST_WORLD=1`.
pub fn platform_for_init() -> Option<Arc<dyn Platform>> {
    (std::env::var_os("HIPOBJ_TEST_WORLD").as_deref() == Some("1".as_ref()))
        .then(|| world().platform())
}

thread_local! {
    static REPLY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `sendRequest` for the test world: the server handles the token at once.
///
/// # Safety
///
/// `ctx` points to an `int` op; `token` to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjTestWorldSendRequest(
    ctx: *mut c_void,
    token: *const c_char,
    len: usize,
) -> c_int {
    if ctx.is_null() || token.is_null() {
        return -1;
    }
    // SAFETY: per this function's contract.
    let op = match unsafe { *ctx.cast::<c_int>() } {
        0 => Op::Put,
        1 => Op::Get,
        _ => return -1,
    };
    // SAFETY: `len` readable bytes at `token`, per the contract.
    let text = unsafe { std::slice::from_raw_parts(token.cast::<u8>(), len) };
    let reply = world().server.handle(text, op);
    REPLY.with(|r| *r.borrow_mut() = reply);
    0
}

/// `recvReply` for the test world: the reply of this thread's last request.
///
/// # Safety
///
/// `reply` has `*len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjTestWorldRecvReply(
    _ctx: *mut c_void,
    reply: *mut c_char,
    len: *mut usize,
) -> c_int {
    if reply.is_null() || len.is_null() {
        return -1;
    }
    let text = REPLY.with(|r| std::mem::take(&mut *r.borrow_mut()));
    // SAFETY: `len` is valid per the contract.
    let room = unsafe { *len };
    if text.len() > room {
        return -1;
    }
    // SAFETY: `room` writable bytes at `reply`, and `text` fits.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), reply.cast::<u8>(), text.len());
        *len = text.len();
    }
    0
}

/// Sets the first `len` bytes of the server's object store.
///
/// # Safety
///
/// `data` has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjTestWorldSetObject(data: *const c_void, len: usize) -> c_int {
    if data.is_null() {
        return -1;
    }
    // SAFETY: per the contract.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    world().server.set_object(bytes);
    0
}

/// Copies the first `len` bytes of the server's object store to `out`.
///
/// # Safety
///
/// `out` has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipobjTestWorldGetObject(out: *mut c_void, len: usize) -> c_int {
    if out.is_null() {
        return -1;
    }
    let bytes = world().server.object(len);
    // SAFETY: per the contract.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), len) };
    0
}

/// Sends the token in `token` (NUL-terminated) to the server as the
/// application's own request would, for application-driven transfers;
/// returns the reply's status or -1.
///
/// # Safety
///
/// `token` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hipobjTestWorldServe(token: *const c_char, op: c_int) -> c_int {
    if token.is_null() {
        return -1;
    }
    let op = match op {
        0 => Op::Put,
        1 => Op::Get,
        _ => return -1,
    };
    // SAFETY: per the contract.
    let text = unsafe { CStr::from_ptr(token) }.to_bytes();
    let reply = world().server.handle(text, op);
    std::str::from_utf8(&reply)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1)
}
