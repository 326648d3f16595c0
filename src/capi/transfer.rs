//! `hipObjGet` and `hipObjPut`.

use std::ffi::c_void;

use super::boundary::enter;
use super::types::{hipObjError_t, hipObjHandle_t, hipObjOps_t};
use crate::core::args::Slice;
use crate::core::{Error, Result, CURRENT};

/// The checks `hipObjGet` and `hipObjPut` share, in the spec's order, with
/// no callback called on failure.
///
/// # Safety
///
/// `ops` is NULL or points to a valid `hipObjOps_t`.
unsafe fn transfer(
    dev_ptr: usize,
    size: usize,
    offset: libc::off_t,
    ops: *const hipObjOps_t,
) -> Result<()> {
    let instance = CURRENT.instance()?;
    // SAFETY: NULL or valid, per this function's contract.
    let ops = unsafe { ops.as_ref() }.ok_or(Error::InvalidValue("ops is NULL"))?;
    if ops.sendRequest.is_none() || ops.recvReply.is_none() {
        return Err(Error::InvalidValue("a callback in ops is NULL"));
    }
    let slice = Slice::new(dev_ptr, size, offset)?;
    instance.check_slice(&slice)?;
    Err(Error::NotSupported(
        "RDMA transfers are not part of this release",
    ))
}

/// Reads `size` bytes of an S3 object into the registered buffer `devPtr`,
/// starting `offset` bytes into the buffer. The library mints a token for
/// that range and calls `ops->sendRequest(ctx, token, 88)`; the application
/// sends its S3 GET with the token and hands back the `x-amz-rdma-reply`
/// header through `ops->recvReply`. On success the bytes are in the buffer.
///
/// `handle` is the application's and is not used. Callbacks run on this
/// thread with no library lock held and may call any function.
///
/// Thread safety: any thread, concurrently, up to `HIPOBJ_MAX_TRANSFERS`
/// transfers at once. Returns `hipObjNotInitialized` first;
/// `hipObjInvalidValue` if `ops` or a callback is NULL, then for a NULL
/// `devPtr`, a `size` of 0 or a negative `offset`; `hipObjBufNotRegistered`
/// if `devPtr` is not a registered base; `hipObjInvalidValue` if the range
/// is not inside the registration; `hipObjBusy` while an abandoned staging
/// copy of the buffer runs, or when a callback starts a transfer while every
/// connection is taken; `hipObjS3Error` if a callback returns non-zero or the
/// reply is not ok/200/204/206; `hipObjRdmaError` if the transport fails;
/// `hipObjInternalError` if a staging copy fails or times out.
///
/// # Safety
///
/// `ops` is NULL or points to a readable `hipObjOps_t` whose callbacks are NULL or callable with `ctx`.
#[no_mangle]
pub unsafe extern "C" fn hipObjGet(
    handle: hipObjHandle_t,
    devPtr: *mut c_void,
    size: usize,
    offset: libc::off_t,
    ops: *mut hipObjOps_t,
    ctx: *mut c_void,
) -> hipObjError_t {
    let _ = (handle, ctx);
    // SAFETY: `ops` is NULL or valid, per this function's contract.
    enter("hipObjGet", || unsafe {
        transfer(devPtr.addr(), size, offset, ops)
    })
}

/// Writes `size` bytes of the registered buffer `devPtr`, starting `offset`
/// bytes into it, to an S3 object, as `hipObjGet` does in the other
/// direction: on success the server holds the bytes.
///
/// Arguments, thread safety and codes as `hipObjGet`.
///
/// # Safety
///
/// `ops` is NULL or points to a readable `hipObjOps_t` whose callbacks are NULL or callable with `ctx`.
#[no_mangle]
pub unsafe extern "C" fn hipObjPut(
    handle: hipObjHandle_t,
    devPtr: *const c_void,
    size: usize,
    offset: libc::off_t,
    ops: *mut hipObjOps_t,
    ctx: *mut c_void,
) -> hipObjError_t {
    let _ = (handle, ctx);
    // SAFETY: `ops` is NULL or valid, per this function's contract.
    enter("hipObjPut", || unsafe {
        transfer(devPtr.addr(), size, offset, ops)
    })
}
