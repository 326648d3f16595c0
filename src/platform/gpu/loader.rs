//! The HIP function table.
//!
//! Prototypes are those of ROCm's `<hip/hip_runtime_api.h>`: `hipError_t`
//! is a C enum, passed as `int`.

use std::ffi::c_int;

use crate::core::{Error, Result};
use crate::platform::dl::{self, Loaded};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::platform::{Gpu, GpuEvent, HipResult, HostBuffer, PointerKind};

/// Runtime sonames of the HIP runtime, newest first.
pub const SONAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

type GetDeviceCount = unsafe extern "C" fn(count: *mut c_int) -> c_int;
type GetDevice = unsafe extern "C" fn(device: *mut c_int) -> c_int;

/// The HIP runtime, loaded.
pub struct LoadedHip {
    get_device_count: GetDeviceCount,
    get_device: GetDevice,
    // Keeps the library mapped for as long as the pointers above exist.
    loaded: Loaded,
}

impl LoadedHip {
    /// Opens the first of `sonames` that loads and resolves every required
    /// symbol. A missing runtime is `hipErrorNoDevice`: no GPU can be used.
    pub fn open(sonames: &[&'static str]) -> Result<LoadedHip> {
        let missing = Error::HipMissing;
        let loaded = dl::open_first(sonames).map_err(missing)?;
        // SAFETY: the aliases match hip_runtime_api.h's prototypes, and
        // `loaded` is kept beside the pointers.
        let (count, device) = unsafe {
            (
                dl::symbol::<GetDeviceCount>(&loaded, b"hipGetDeviceCount\0"),
                dl::symbol::<GetDevice>(&loaded, b"hipGetDevice\0"),
            )
        };
        Ok(LoadedHip {
            get_device_count: count.map_err(missing)?,
            get_device: device.map_err(missing)?,
            loaded,
        })
    }

    /// The soname the runtime was found under.
    pub fn soname(&self) -> &'static str {
        self.loaded.name
    }

    fn int_out(f: unsafe extern "C" fn(*mut c_int) -> c_int) -> std::result::Result<i32, i32> {
        let mut value: c_int = 0;
        // SAFETY: `f` is one of the table's functions taking one `int *` out
        // parameter, and `value` is a valid place to write it.
        match unsafe { f(&mut value) } {
            0 => Ok(value),
            code => Err(code),
        }
    }
}

impl Gpu for LoadedHip {
    fn device_count(&self) -> HipResult<i32> {
        Self::int_out(self.get_device_count)
    }

    fn current_device(&self) -> HipResult<i32> {
        Self::int_out(self.get_device)
    }

    fn pci_bus_id(&self, _device: i32) -> HipResult<String> {
        Err(HIP_ERROR_NOT_SUPPORTED)
    }

    fn pointer_kind(&self, _addr: usize) -> HipResult<PointerKind> {
        Err(HIP_ERROR_NOT_SUPPORTED)
    }

    fn allocation_range(&self, _addr: usize) -> HipResult<(usize, usize)> {
        Err(HIP_ERROR_NOT_SUPPORTED)
    }

    fn host_alloc(&self, _len: usize) -> HipResult<Arc<dyn HostBuffer>> {
        Err(HIP_ERROR_NOT_SUPPORTED)
    }

    fn copy_async(&self, _dst: usize, _src: usize, _len: usize) -> HipResult<Arc<dyn GpuEvent>> {
        Err(HIP_ERROR_NOT_SUPPORTED)
    }

    fn synchronize(&self, _device: i32) -> HipResult<()> {
        Err(HIP_ERROR_NOT_SUPPORTED)
    }

    fn export_dmabuf(&self, _addr: usize, _len: usize) -> Option<HipResult<(OwnedFd, u64)>> {
        None
    }
}

/// `hipErrorNotSupported`: what the functions of the HIP table not yet
/// resolved by this build report.
const HIP_ERROR_NOT_SUPPORTED: i32 = 801;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runtime_is_no_device() {
        let err = LoadedHip::open(&["libhipobj-test-no-such-hip.so.6"])
            .err()
            .unwrap();
        assert_eq!(err.hip_error(), crate::core::error::HIP_ERROR_NO_DEVICE);
        assert!(
            err.to_string().contains("libhipobj-test-no-such-hip.so.6"),
            "{err}"
        );
        assert_eq!(err.code(), crate::core::Code::Rdma);
    }
}
