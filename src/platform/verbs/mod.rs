//! libibverbs, opened with `dlopen`: the production [`Verbs`](super::Verbs).
//!
//! - [`sys`]: the ABI types, generated from rdma-core 44.0's `verbs.h`.
//! - [`loader`]: the function table ([`LoadedVerbs`]) and device lookup.
//! - `inline`: the header's `static inline` verbs, re-implemented through
//!   the context's ops table.
//! - `convert`: domain types (`platform::types`) to and from `sys` types.
//! - `context`, `cq`, `qp`: the RAII owners behind the traits. Each owns its
//!   raw pointer and an `Arc` of its parent, so a child is destroyed before
//!   its parent; a destroy that fails is logged, counted
//!   ([`leaked_objects`]) and leaked.
//!
//! `unsafe` in the platform's verbs lives only in this directory.

mod context;
pub(crate) mod convert;
pub(crate) mod cq;
mod inline;
pub mod loader;
mod qp;
pub mod sys;

use crate::log::{log, Level};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

pub use context::{DeviceContext, MemoryRegion, MemoryWindow, ProtectionDomain};
pub use cq::CompletionQueue;
pub use loader::LoadedVerbs;
pub use qp::QueuePair;

/// Objects whose destroy failed and which were leaked, since the process
/// started.
static LEAKED: AtomicU64 = AtomicU64::new(0);

/// How many verbs objects were leaked because their destroy call failed.
pub fn leaked_objects() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

/// Records a destroy call that returned `rc` in a `Drop`: the object is
/// logged, counted and leaked (never touched again, never a panic).
fn destroy_failed(call: std::fmt::Arguments<'_>, rc: c_int) {
    let err = rc_error(call, rc);
    LEAKED.fetch_add(1, Ordering::Relaxed);
    log!(Level::Error, "{err}; leaked");
}

/// Why a verb that returns an `int` failed: 0 is success and anything else
/// the errno (`ibv_modify_qp(3)` and friends: "the value of errno on
/// failure"). A few providers return `-errno` or -1; the magnitude is taken,
/// and -1 means errno, read now.
fn rc_cause(rc: c_int) -> std::io::Error {
    if rc == -1 {
        std::io::Error::last_os_error()
    } else {
        std::io::Error::from_raw_os_error(rc.checked_abs().unwrap_or(c_int::MAX))
    }
}

/// The error of `call`, which returned `rc` (see [`rc_cause`]).
fn rc_error(call: std::fmt::Arguments<'_>, rc: c_int) -> Error {
    Error::Rdma(format!("{call} failed: {}", rc_cause(rc)))
}

/// The error of a verb that returned NULL: the reason is in errno, read now
/// (before anything else can overwrite it).
fn null_error(call: std::fmt::Arguments<'_>) -> Error {
    let err = std::io::Error::last_os_error();
    Error::Rdma(format!("{call} failed: {err}"))
}

/// `Ok(())` for a zero return, else [`rc_error`].
fn check_rc(call: std::fmt::Arguments<'_>, rc: c_int) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(rc_error(call, rc))
    }
}
