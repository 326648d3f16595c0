//! `hipObjGet` and `hipObjPut`.

use std::ffi::{c_char, c_int, c_void};

use super::boundary::enter;
use super::types::{hipObjError_t, hipObjHandle_t, hipObjOps_t};
use crate::core::args::Slice;
use crate::core::reply::REPLY_BUFFER_LEN;
use crate::core::token::TOKEN_HEX_LEN;
use crate::core::transfer::{Direction, S3Client};
use crate::core::{Error, Result, CURRENT};

/// The application's callbacks as the transfer sequence sees them.
struct Callbacks {
    send: SendRequest,
    recv: RecvReply,
    ctx: *mut c_void,
}

type SendRequest = unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> c_int;
type RecvReply = unsafe extern "C" fn(*mut c_void, *mut c_char, *mut usize) -> c_int;

impl S3Client for Callbacks {
    fn send_request(&mut self, token: &[u8; TOKEN_HEX_LEN + 1]) -> std::result::Result<(), i32> {
        // SAFETY: the callback came from the caller's hipObjOps_t with its
        // `ctx`; `token` is 88 digits and a NUL, valid for the call.
        match unsafe { (self.send)(self.ctx, token.as_ptr().cast(), TOKEN_HEX_LEN) } {
            0 => Ok(()),
            rc => Err(rc),
        }
    }

    fn recv_reply(
        &mut self,
        reply: &mut [u8; REPLY_BUFFER_LEN],
    ) -> std::result::Result<usize, i32> {
        let mut len = REPLY_BUFFER_LEN;
        // SAFETY: as above; `reply` is writable for REPLY_BUFFER_LEN bytes,
        // which `len` tells the callback.
        match unsafe { (self.recv)(self.ctx, reply.as_mut_ptr().cast(), &mut len) } {
            0 => Ok(len),
            rc => Err(rc),
        }
    }
}

/// The checks `hipObjGet` and `hipObjPut` share, in the spec's order, with
/// no callback called on failure; then the transfer.
///
/// # Safety
///
/// `ops` is NULL or points to a valid `hipObjOps_t` whose callbacks may be
/// called with `ctx`.
unsafe fn transfer(
    direction: Direction,
    dev_ptr: usize,
    size: usize,
    offset: libc::off_t,
    ops: *const hipObjOps_t,
    ctx: *mut c_void,
) -> Result<()> {
    let instance = CURRENT.instance()?;
    // SAFETY: NULL or valid, per this function's contract.
    let ops = unsafe { ops.as_ref() }.ok_or(Error::InvalidValue("ops is NULL"))?;
    let (Some(send), Some(recv)) = (ops.sendRequest, ops.recvReply) else {
        return Err(Error::InvalidValue("a callback in ops is NULL"));
    };
    let slice = Slice::new(dev_ptr, size, offset)?;
    instance.transfer(direction, slice, &mut Callbacks { send, recv, ctx })
}

/// Reads `size` bytes of an S3 object into the registered buffer `devPtr`,
/// starting `offset` bytes into the buffer. The library mints a token for
/// that range and calls `ops->sendRequest(ctx, token, 88)`; the application
/// sends its S3 GET with the token and hands back the `x-amz-rdma-reply`
/// header through `ops->recvReply`. On success the bytes are in the buffer.
///
/// `handle` is the application's and is not used. Callbacks run on this
/// thread with no library lock held and may call any function. They must
/// return: a C++ exception thrown through them, or a `longjmp` out of
/// them, crosses the library's frames, which is undefined behaviour
/// (catch it in the callback and return non-zero instead).
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
    let _ = handle;
    // SAFETY: `ops` is NULL or valid with `ctx`, per this function's contract.
    enter("hipObjGet", || unsafe {
        transfer(Direction::Get, devPtr.addr(), size, offset, ops, ctx)
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
    let _ = handle;
    // SAFETY: `ops` is NULL or valid with `ctx`, per this function's contract.
    enter("hipObjPut", || unsafe {
        transfer(Direction::Put, devPtr.addr(), size, offset, ops, ctx)
    })
}
