//! `hipObjInit` and `hipObjShutdown`, and the platform `hipObjInit` runs
//! on.

use std::sync::{Arc, OnceLock};

use super::args::opt_string;
use super::boundary::enter;
use super::types::{hipObjConfig_t, hipObjError_t};
use crate::core::{Config, Error, Options, CURRENT};
use crate::platform::{self, Platform};

/// Where `hipObjInit` takes its platform from: [`platform::system`] unless
/// a library built over this one handed it another with
/// [`use_platform`].
static PLATFORM: OnceLock<fn() -> Arc<dyn Platform>> = OnceLock::new();

/// Makes every later `hipObjInit` of this process run on the platform
/// `source` gives instead of the system's. For a library that links this
/// one into a shared object of its own and calls this as it is loaded,
/// before any `hipObjInit`: the fake library applications link their
/// tests against (`hipobj-fake`) hands over its fake world this way. The
/// release library never calls it. Returns `false`, changing nothing, if a
/// source was already given.
pub fn use_platform(source: fn() -> Arc<dyn Platform>) -> bool {
    PLATFORM.set(source).is_ok()
}

/// Initializes the library: reads the `HIPOBJ_*` environment, loads
/// libibverbs, resolves the GPU, chooses the RDMA NIC nearest to it (among
/// those `nicHint` names, if given) and opens it.
///
/// Ownership: `config` and its strings are only read during the call;
/// `endpoint`, `region` and `nicHint` are copied, `accessKey` and `secretKey`
/// are never stored or logged.
///
/// Thread safety: may race with any call; init and shutdown are serialized.
///
/// Returns `hipObjInvalidValue` for a NULL `config`, non-zero `flags` or
/// `gpuDevice` < -1 (checked before the next rule); `hipObjAlreadyInitialized`
/// if initialized; `hipObjRdmaError` if libibverbs cannot be loaded, if no GPU
/// can be used and no `nicHint` is given (with `hipError` set), or if the
/// device cannot be opened; `hipObjInvalidValue` if `gpuDevice` is not below
/// the GPU count; `hipObjNicNotFound` if no RDMA device matches. Nothing is
/// initialized when it fails.
///
/// # Safety
///
/// `config` is NULL or points to a readable `hipObjConfig_t` whose strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hipObjInit(config: *mut hipObjConfig_t) -> hipObjError_t {
    enter("hipObjInit", || {
        // SAFETY: the caller passes NULL or a valid hipObjConfig_t.
        let raw = unsafe { config.as_ref() }.ok_or(Error::InvalidValue("config is NULL"))?;
        Config::check_values(raw.flags, raw.gpuDevice)?;
        if CURRENT.is_initialized() {
            return Err(Error::AlreadyInitialized);
        }
        // SAFETY: the config's string members are NULL or NUL-terminated
        // strings, per the hipObjConfig_t contract.
        let config = unsafe {
            Config {
                endpoint: opt_string(raw.endpoint),
                region: opt_string(raw.region),
                gpu_device: raw.gpuDevice,
                nic_hint: opt_string(raw.nicHint)
                    .as_deref()
                    .map(Config::parse_nic_hint)
                    .unwrap_or_default(),
                no_gpu: false,
            }
        };
        let platform = PLATFORM
            .get()
            .map_or_else(platform::system, |source| source());
        CURRENT.init_with(platform, config, Options::from_env())
    })
}

/// Shuts the library down: later calls see it uninitialized, and calls
/// waiting for a connection return `hipObjNotInitialized`. Calls in progress
/// are not waited for; they finish on the state they started with, which is
/// released when the last of them returns.
///
/// Thread safety: may race with any call. Returns `hipObjSuccess`, also when
/// the library was not initialized.
#[no_mangle]
pub extern "C" fn hipObjShutdown() -> hipObjError_t {
    enter("hipObjShutdown", || {
        CURRENT.shutdown();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first source given is the one `hipObjInit` keeps: a later one
    /// is refused and changes nothing. (The system's platform stands for
    /// both, so that no other test of this process sees a change.)
    #[test]
    fn a_platform_source_is_given_once() {
        assert!(PLATFORM.get().is_none(), "no source before one is given");
        assert!(use_platform(platform::system));
        assert!(
            !use_platform(platform::system),
            "a second source is refused"
        );
        assert!(PLATFORM.get().is_some());
    }
}
