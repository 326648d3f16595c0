//! The types and macros of `hipobj.h`, laid out as the C ABI fixes them.
//! cbindgen reads this file to write the header; names are the C names.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

/// Major version of this library (also `hipObjGetVersion`).
pub const HIPOBJ_VERSION_MAJOR: c_int = 0;
/// Minor version of this library.
pub const HIPOBJ_VERSION_MINOR: c_int = 1;
/// Patch version of this library.
pub const HIPOBJ_VERSION_PATCH: c_int = 0;

/// Kept for source compatibility; the result codes do not use it.
pub const HIPOBJ_BASE_ERR: c_int = 6000;

/// Token operation: the server will RDMA READ the buffer (an S3 PUT).
pub const HIPOBJ_RDMA_OP_PUT: c_int = 0;
/// Token operation: the server will RDMA WRITE the buffer (an S3 GET).
pub const HIPOBJ_RDMA_OP_GET: c_int = 1;

/// Reply status meaning that the server declined RDMA.
pub const HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED: c_int = 501;

/// `hipObjBufSync` direction: device to staging buffer, before a PUT.
pub const HIPOBJ_SYNC_TO_HOST: c_int = 0;
/// `hipObjBufSync` direction: staging buffer to device, after a GET.
pub const HIPOBJ_SYNC_TO_DEVICE: c_int = 1;

/// Result codes. Values never change and are never reused.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum hipObjOpError_t {
    /// The call did what it was asked.
    hipObjSuccess = 0,
    /// An argument, configuration value or reply breaks the contract.
    hipObjInvalidValue = 1,
    /// `hipObjInit` has not succeeded, or `hipObjShutdown` undid it.
    hipObjNotInitialized = 2,
    /// `hipObjInit` was called while the library is initialized.
    hipObjAlreadyInitialized = 3,
    /// libibverbs, an RDMA device, or an RDMA transfer failed.
    hipObjRdmaError = 4,
    /// A callback failed, or the server's reply was not a success.
    hipObjS3Error = 5,
    /// The address is not the exact base of a registered buffer.
    hipObjBufNotRegistered = 6,
    /// The address is already registered.
    hipObjBufAlreadyRegistered = 7,
    /// No RDMA device matched.
    hipObjNicNotFound = 8,
    /// dma-buf registration is not available.
    hipObjDmabufNotSupported = 9,
    /// A buffer is larger than 4 GiB.
    hipObjSizeTooLarge = 10,
    /// A staging copy failed or timed out, or the library failed itself.
    hipObjInternalError = 11,
    /// The operation is not supported here.
    hipObjNotSupported = 12,
    /// A buffer or connection is held by another call; try again later.
    hipObjBusy = 13,
}

/// `hipObjOpError_t` as it arrives in an argument: any `int`, since C may
/// pass values that are not enumerators, which a Rust enum must never hold.
/// cbindgen.toml renames it to `hipObjOpError_t` in the header.
pub type hipObjOpErrorValue = c_int;

/// A call's result: the operation's code, and the `hipError_t` behind it
/// where a HIP call explains the failure (else 0). Returned by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct hipObjError_t {
    /// What happened.
    pub opError: hipObjOpError_t,
    /// The HIP runtime's error code, or 0.
    pub hipError: c_int,
}

/// The application's S3 request handle; the library never looks at it.
pub type hipObjHandle_t = *mut c_void;

/// The application's S3 client, as two callbacks. Both run on the thread
/// that called `hipObjGet` / `hipObjPut`, with no library lock held, and may
/// call any function of this library.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipObjOps_t {
    /// Sends the S3 request with `token` (88 hex digits, NUL-terminated,
    /// `tokenLen` == 88) as its `x-amz-rdma-token` header. Returns 0 on
    /// success; anything else fails the transfer with `hipObjS3Error`.
    pub sendRequest: Option<
        unsafe extern "C" fn(ctx: *mut c_void, token: *const c_char, tokenLen: usize) -> c_int,
    >,
    /// Receives the `x-amz-rdma-reply` header of the response into `reply`
    /// (`*replyLen` holds the buffer's size, 512, on entry and must hold the
    /// reply's length on return). Returns 0 on success; anything else fails
    /// the transfer with `hipObjS3Error`.
    pub recvReply: Option<
        unsafe extern "C" fn(ctx: *mut c_void, reply: *mut c_char, replyLen: *mut usize) -> c_int,
    >,
}

/// The configuration `hipObjInit` copies. Strings may be NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipObjConfig_t {
    /// The S3 endpoint (copied; informational).
    pub endpoint: *const c_char,
    /// The S3 region (copied; informational).
    pub region: *const c_char,
    /// Never stored and never logged.
    pub accessKey: *const c_char,
    /// Never stored and never logged.
    pub secretKey: *const c_char,
    /// Reserved: must be 0.
    pub flags: u32,
    /// HIP device index, or -1 for the calling thread's current device.
    pub gpuDevice: c_int,
    /// Comma-separated RDMA device names to choose from, or NULL for any.
    pub nicHint: *const c_char,
}

// The layouts the ABI spec fixes (x86-64 LP64).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(std::mem::size_of::<hipObjOpError_t>() == 4);
    assert!(std::mem::size_of::<hipObjError_t>() == 8);
    assert!(std::mem::offset_of!(hipObjError_t, hipError) == 4);
    assert!(std::mem::size_of::<hipObjOps_t>() == 16);
    assert!(std::mem::offset_of!(hipObjOps_t, recvReply) == 8);
    assert!(std::mem::size_of::<hipObjConfig_t>() == 48);
    assert!(std::mem::offset_of!(hipObjConfig_t, flags) == 32);
    assert!(std::mem::offset_of!(hipObjConfig_t, gpuDevice) == 36);
    assert!(std::mem::offset_of!(hipObjConfig_t, nicHint) == 40);
};
