//! Buffer registration and staging synchronization.

use std::ffi::{c_int, c_void};

use super::boundary::enter;
use super::types::hipObjError_t;
use crate::core::args::{BufferRange, Slice, SyncDirection};
use crate::core::{Error, CURRENT};

/// Registers `size` bytes of GPU memory at `devPtr` with the NIC, so that
/// transfers can name it. GPU memory is registered as a dma-buf where
/// possible, else directly, else through a pinned host staging buffer (unless
/// `HIPOBJ_REQUIRE_GPU_DIRECT` is set). Host memory HIP knows is accepted too.
///
/// Ownership: the memory stays the caller's and must outlive the
/// registration. Thread safety: any thread, concurrently.
///
/// Returns `hipObjNotInitialized` first; `hipObjInvalidValue` for a NULL
/// `devPtr` or a `size` of 0; `hipObjSizeTooLarge` above 4 GiB (4 GiB itself
/// is allowed); `hipObjInvalidValue` if the range wraps the address space or
/// device memory is not inside one HIP allocation;
/// `hipObjBufAlreadyRegistered` if `devPtr` is registered; `hipObjRdmaError`
/// beyond 256 registrations, when registration fails, or when staging is
/// refused.
///
/// # Safety
///
/// `devPtr` is any address; the memory it names must stay allocated until it is deregistered.
#[no_mangle]
pub unsafe extern "C" fn hipObjBufRegister(devPtr: *mut c_void, size: usize) -> hipObjError_t {
    enter("hipObjBufRegister", || {
        let instance = CURRENT.instance()?;
        instance.register(BufferRange::new(devPtr.addr(), size)?, false)
    })
}

/// Registers `size` bytes of the caller's host memory at `hostPtr` as they
/// are: no staging buffer, no device synchronization.
///
/// Ownership and thread safety as `hipObjBufRegister`. Returns the codes of
/// `hipObjBufRegister` except the HIP allocation check.
///
/// # Safety
///
/// `hostPtr` is any address; the memory it names must stay allocated until it is deregistered.
#[no_mangle]
pub unsafe extern "C" fn hipObjBufRegisterHost(hostPtr: *mut c_void, size: usize) -> hipObjError_t {
    enter("hipObjBufRegisterHost", || {
        let instance = CURRENT.instance()?;
        instance.register(BufferRange::new(hostPtr.addr(), size)?, true)
    })
}

/// Deregisters the buffer registered at exactly `devPtr`, releasing its
/// registration and staging buffer. Tokens of the buffer from
/// `hipObjGetRdmaToken` still out end first: their access is revoked,
/// whatever their transfer was doing.
///
/// Thread safety: any thread. Returns `hipObjNotInitialized` first;
/// `hipObjInvalidValue` for NULL; `hipObjBufNotRegistered` if `devPtr` is not
/// a registered base address; `hipObjBusy` while a `hipObjGet` or
/// `hipObjPut` in flight or an abandoned staging copy still holds the
/// buffer, or while a token of it could not be ended yet (the connection
/// driver did not answer in time: try again).
///
/// # Safety
///
/// `devPtr` is any address; it is only compared with registered ones.
#[no_mangle]
pub unsafe extern "C" fn hipObjBufDeregister(devPtr: *mut c_void) -> hipObjError_t {
    enter("hipObjBufDeregister", || {
        let instance = CURRENT.instance()?;
        if devPtr.is_null() {
            return Err(Error::InvalidValue("buffer pointer is NULL"));
        }
        instance.deregister(devPtr.addr())
    })
}

/// For a staged buffer, copies `[offset, offset + size)` between the device
/// and the staging buffer: `HIPOBJ_SYNC_TO_HOST` before a PUT,
/// `HIPOBJ_SYNC_TO_DEVICE` after a GET. Does nothing, successfully, for a
/// buffer that is not staged. For transfers the application drives with
/// `hipObjGetRdmaToken`: before copying to the device, it waits (up to
/// `HIPOBJ_COMPLETION_TIMEOUT_MS`) for the buffer's GETs that a server has
/// started; it never ends a token.
///
/// Thread safety: any thread. Returns `hipObjNotInitialized` first;
/// `hipObjInvalidValue` for a `direction` other than 0 or 1; then the buffer
/// codes of `hipObjGet`; `hipObjRdmaError` (staged buffers only) if a GET
/// into the buffer failed since the last sync, or one a server started is
/// still running; `hipObjInternalError` if the copy fails or exceeds
/// `HIPOBJ_STAGE_TIMEOUT_MS`.
///
/// # Safety
///
/// `devPtr` is any address; it is only compared with registered ones.
#[no_mangle]
pub unsafe extern "C" fn hipObjBufSync(
    devPtr: *mut c_void,
    size: usize,
    offset: libc::off_t,
    direction: c_int,
) -> hipObjError_t {
    enter("hipObjBufSync", || {
        let instance = CURRENT.instance()?;
        let direction = SyncDirection::try_from(direction)?;
        instance.buf_sync(Slice::new(devPtr.addr(), size, offset)?, direction)
    })
}
