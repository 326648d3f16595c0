//! The Platform seam: the library's only route to the outside world.
//!
//! `core` sees the machine only through these traits, and receives the
//! implementation by injection (`Current::init_with`): the production one
//! from `system()`, fakes in tests. Trait methods speak domain types, so
//! `core` needs no `unsafe`.
//!
//! This release covers what initialization needs to find out whether the
//! machine can run the library at all: loading libibverbs and listing its
//! devices, and loading HIP to resolve the GPU.

mod dl;
pub mod gpu;
pub mod system;
pub mod verbs;

use std::sync::Arc;

use crate::core::Result;

pub use system::system;

/// The outside world, as one injectable bundle. Each getter loads what it
/// needs on first use and reports, as an error, a library that is missing.
pub trait Platform: Send + Sync {
    /// libibverbs, or `Error::Rdma` naming what could not be loaded.
    fn verbs(&self) -> Result<Arc<dyn Verbs>>;
    /// The HIP runtime, or `Error::HipMissing` (reported with
    /// `hipErrorNoDevice`) when the runtime library itself is missing.
    fn gpu(&self) -> Result<Arc<dyn Gpu>>;
}

/// RDMA verbs (libibverbs).
pub trait Verbs: Send + Sync {
    /// Names of the RDMA devices present (`ibv_get_device_list`), in the
    /// order libibverbs lists them. No kernel support counts as no device.
    fn device_names(&self) -> Result<Vec<String>>;
    /// Opens the named device with everything a transfer needs.
    fn open_device(&self, name: &str) -> Result<Arc<dyn RdmaDevice>>;
}

/// An open RDMA device.
pub trait RdmaDevice: Send + Sync {
    /// The device's name, as libibverbs reports it.
    fn name(&self) -> &str;
}

/// The GPU runtime (HIP). Errors are `hipError_t` values.
pub trait Gpu: Send + Sync {
    /// `hipGetDeviceCount`.
    fn device_count(&self) -> std::result::Result<i32, i32>;
    /// `hipGetDevice`: the calling thread's current device.
    fn current_device(&self) -> std::result::Result<i32, i32>;
}
