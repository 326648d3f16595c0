//! Tokens and replies, for transfers the application drives itself.

use std::ffi::{c_char, c_int, c_void};
use std::io::Write;

use super::args::bytes;
use super::boundary::enter;
use super::types::hipObjError_t;
use crate::core::args::{Slice, TokenOp};
use crate::core::reply::parse_reply;
use crate::core::token::{Token, TOKEN_HEX_LEN};
use crate::core::{Error, CURRENT};

/// Mints a token for the first `size` bytes of the registered buffer
/// `devPtr`, for an operation `op` (`HIPOBJ_RDMA_OP_PUT` or `_GET`) that the
/// application drives itself, with `hipObjBufSync` around it for staged
/// buffers.
///
/// Ownership: on success `*outToken` receives a `malloc`ed, NUL-terminated
/// string of 88 hex digits, which the caller releases with
/// `hipObjPutRdmaToken`. On any error `*outToken` is left untouched.
///
/// Thread safety: any thread. Returns `hipObjNotInitialized` first;
/// `hipObjInvalidValue` for a NULL `outToken` or an `op` other than 0 or 1;
/// then the buffer codes of `hipObjGet` with an offset of 0. When no pool
/// connection is free, a released token that no server has used gives its
/// connection up; `hipObjBusy` when every connection holds such a token
/// not released (at most `HIPOBJ_MAX_TRANSFERS` are outstanding), or when
/// none came free within `HIPOBJ_COMPLETION_TIMEOUT_MS`.
///
/// # Safety
///
/// `outToken` is NULL or points to a writable `char *`.
#[no_mangle]
pub unsafe extern "C" fn hipObjGetRdmaToken(
    devPtr: *const c_void,
    size: usize,
    op: c_int,
    outToken: *mut *mut c_char,
) -> hipObjError_t {
    enter("hipObjGetRdmaToken", || {
        let instance = CURRENT.instance()?;
        if outToken.is_null() {
            return Err(Error::InvalidValue("outToken is NULL"));
        }
        let op = TokenOp::try_from(op)?;
        let token = instance.mint_token(Slice::new(devPtr.addr(), size, 0)?, op)?;
        let text = malloc_token(&token.to_hex());
        if text.is_null() {
            return Err(Error::Internal("malloc of 89 bytes failed".into()));
        }
        // SAFETY: `outToken` is non-NULL (checked above) and writable by the
        // caller's contract; written last, after everything that can fail.
        unsafe { outToken.write(text) };
        Ok(())
    })
}

/// A `malloc`ed, NUL-terminated copy of `hex`, or NULL.
fn malloc_token(hex: &[u8; TOKEN_HEX_LEN]) -> *mut c_char {
    // SAFETY: malloc may be called with any size; the result is checked.
    let text = unsafe { libc::malloc(TOKEN_HEX_LEN + 1) }.cast::<u8>();
    if !text.is_null() {
        // SAFETY: `text` holds TOKEN_HEX_LEN + 1 bytes just allocated, which
        // nothing else references.
        let out = unsafe { std::slice::from_raw_parts_mut(text, TOKEN_HEX_LEN + 1) };
        out[..TOKEN_HEX_LEN].copy_from_slice(hex);
        out[TOKEN_HEX_LEN] = 0;
    }
    text.cast()
}

/// Releases the string of a token from `hipObjGetRdmaToken`. It ends
/// nothing: a server may still use the token (applications copy it into
/// their request and release it before sending). The token ends at the
/// server's final message, at `HIPOBJ_TOKEN_TIMEOUT_MS`, when its buffer
/// is deregistered, or at `hipObjShutdown`; a released token no server has
/// used also gives its connection to a newer token when none is free.
/// Never waits.
///
/// Needs no initialized library (then it only frees); any thread. Returns
/// `hipObjInvalidValue` for NULL, else `hipObjSuccess`.
///
/// # Safety
///
/// `token` is NULL or a token from `hipObjGetRdmaToken` not yet released.
#[no_mangle]
pub unsafe extern "C" fn hipObjPutRdmaToken(token: *mut c_char) -> hipObjError_t {
    enter("hipObjPutRdmaToken", || {
        if token.is_null() {
            return Err(Error::InvalidValue("token is NULL"));
        }
        // SAFETY: `token` is a NUL-terminated string (the caller's
        // contract); strnlen stops at its NUL or after TOKEN_HEX_LEN + 1
        // bytes, whichever comes first.
        let len = unsafe { libc::strnlen(token, TOKEN_HEX_LEN + 1) };
        // SAFETY: `len` bytes at `token` were just found readable.
        let text = unsafe { bytes(token, len) }?;
        if let (Ok(parsed), Ok(instance)) = (Token::parse_hex(text), CURRENT.instance()) {
            instance.release_token(&parsed);
        }
        // SAFETY: the caller passes a token that hipObjGetRdmaToken
        // allocated with malloc and that has not been released yet.
        unsafe { libc::free(token.cast()) };
        Ok(())
    })
}

/// Parses the `replyLen` bytes of an `x-amz-rdma-reply` value: `ok` (200),
/// `err` (-1), a status from 100 to 599, or `200:` followed by an 88-digit
/// token (200). Trailing NUL, CR and LF bytes are ignored; anything else is
/// rejected.
///
/// Needs no initialized library; any thread. Returns `hipObjInvalidValue`
/// for a NULL `reply` or `httpCode`, or a reply outside the grammar;
/// `*httpCode` is written only on success.
///
/// # Safety
///
/// `reply` is NULL or points to `replyLen` readable bytes; `httpCode` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hipObjParseRdmaReply(
    reply: *const c_char,
    replyLen: usize,
    httpCode: *mut c_int,
) -> hipObjError_t {
    enter("hipObjParseRdmaReply", || {
        if reply.is_null() || httpCode.is_null() {
            return Err(Error::InvalidValue("reply or httpCode is NULL"));
        }
        // SAFETY: the caller passes `replyLen` readable bytes at `reply`.
        let text = unsafe { bytes(reply, replyLen) }?;
        let parsed = parse_reply(text).map_err(|_| Error::InvalidValue("malformed reply"))?;
        // SAFETY: non-NULL, and the caller passes a writable int.
        unsafe { httpCode.write(parsed.http_code) };
        Ok(())
    })
}

/// Writes into `nicIp` the IPv4 address of the NIC a token names, as a
/// NUL-terminated dotted quad, when the token's GID is IPv4-mapped (bytes 10
/// and 11 both 0xff); for any other GID it writes an empty string.
///
/// Needs no initialized library; any thread. Returns `hipObjInvalidValue`
/// for a NULL argument or a `nicIpLen` of 0 (nothing written); otherwise
/// `nicIp[0]` is set to 0 first, and a malformed token or a buffer too small
/// for the address gives `hipObjInvalidValue` with an empty string.
///
/// # Safety
///
/// `token` is NULL or a NUL-terminated string; `nicIp` is NULL or points to `nicIpLen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hipObjTokenClientNic(
    token: *const c_char,
    nicIp: *mut c_char,
    nicIpLen: usize,
) -> hipObjError_t {
    enter("hipObjTokenClientNic", || {
        if token.is_null() || nicIp.is_null() || nicIpLen == 0 {
            return Err(Error::InvalidValue(
                "token or nicIp is NULL, or nicIpLen is 0",
            ));
        }
        // `from_raw_parts_mut` needs at most isize::MAX bytes; 16 are used.
        let nicIpLen = nicIpLen.min(64);
        // SAFETY: the caller passes `nicIpLen` (> 0) writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(nicIp.cast::<u8>(), nicIpLen) };
        out[0] = 0;
        // Reads at most one byte past a valid token, never further.
        // SAFETY: `token` is a NUL-terminated string; strnlen stops at its
        // NUL or after TOKEN_HEX_LEN + 1 bytes, whichever comes first.
        let len = unsafe { libc::strnlen(token, TOKEN_HEX_LEN + 1) };
        // SAFETY: `len` bytes at `token` were just found readable.
        let text = unsafe { bytes(token, len) }?;
        let token = Token::parse_hex(text).map_err(|_| Error::InvalidValue("malformed token"))?;
        let Some(ip) = token.ipv4() else {
            return Ok(());
        };
        let mut cursor = std::io::Cursor::new(&mut out[..]);
        let written = write!(cursor, "{ip}\0").is_ok();
        if !written {
            out[0] = 0;
            return Err(Error::InvalidValue("nicIp is too small for the address"));
        }
        Ok(())
    })
}
