//! The libibverbs function table.
//!
//! Prototypes are those of rdma-core's `<infiniband/verbs.h>`; `ibv_device`
//! is only ever handled by pointer here, so it stays opaque.

use std::ffi::{c_char, c_int, CStr};
use std::sync::Arc;

use crate::core::{Error, Result};
use crate::platform::dl::{self, Loaded};
use crate::platform::{Context, Verbs};

/// Runtime sonames, preferred first.
pub const SONAMES: &[&str] = &["libibverbs.so.1", "libibverbs.so"];

/// `struct ibv_device`, opaque.
#[repr(C)]
pub struct IbvDevice {
    _opaque: [u8; 0],
}

type GetDeviceList = unsafe extern "C" fn(num_devices: *mut c_int) -> *mut *mut IbvDevice;
type FreeDeviceList = unsafe extern "C" fn(list: *mut *mut IbvDevice);
type GetDeviceName = unsafe extern "C" fn(device: *mut IbvDevice) -> *const c_char;

/// libibverbs, loaded, with the functions this library calls.
pub struct LoadedVerbs {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    // Keeps the library mapped; declared last so the pointers above never
    // outlive it (and a `LoadedVerbs` is kept for the life of the process).
    loaded: Loaded,
}

impl LoadedVerbs {
    /// Opens the first of `sonames` and resolves every required symbol.
    /// The error names the library or the symbol that was missing.
    pub fn open(sonames: &[&'static str]) -> Result<LoadedVerbs> {
        let loaded = dl::open_first(sonames)
            .map_err(|e| Error::Rdma(format!("cannot load libibverbs: {e}")))?;
        // SAFETY: each type alias above is the prototype verbs.h declares for
        // that symbol, and `loaded` is stored beside the pointers and never
        // unloaded before them.
        let table = unsafe {
            (
                dl::symbol::<GetDeviceList>(&loaded, b"ibv_get_device_list\0"),
                dl::symbol::<FreeDeviceList>(&loaded, b"ibv_free_device_list\0"),
                dl::symbol::<GetDeviceName>(&loaded, b"ibv_get_device_name\0"),
            )
        };
        let missing = |e: String| Error::Rdma(e);
        Ok(LoadedVerbs {
            get_device_list: table.0.map_err(missing)?,
            free_device_list: table.1.map_err(missing)?,
            get_device_name: table.2.map_err(missing)?,
            loaded,
        })
    }

    /// The soname the library was found under.
    pub fn soname(&self) -> &'static str {
        self.loaded.name
    }
}

impl Verbs for LoadedVerbs {
    fn device_names(&self) -> Result<Vec<String>> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer; the returned array is
        // released below with ibv_free_device_list, as verbs.h requires.
        let list = unsafe { (self.get_device_list)(&mut count) };
        if list.is_null() {
            let err = std::io::Error::last_os_error();
            // ENOSYS: the kernel has no verbs support at all, which for the
            // caller means there is no device (ibv_get_device_list(3)).
            if err.raw_os_error() == Some(libc::ENOSYS) {
                return Ok(Vec::new());
            }
            return Err(Error::Rdma(format!("ibv_get_device_list failed: {err}")));
        }
        let count = usize::try_from(count).unwrap_or(0);
        let mut names = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: the list holds `count` valid device pointers (followed
            // by a NULL), alive until ibv_free_device_list.
            let device = unsafe { *list.add(i) };
            // SAFETY: `device` comes from the live list; the name is a
            // NUL-terminated string inside the device structure, copied out
            // before the list is freed.
            let name = unsafe { (self.get_device_name)(device) };
            if !name.is_null() {
                // SAFETY: non-NULL names point to NUL-terminated strings.
                names.push(
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (self.free_device_list)(list) };
        Ok(names)
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
        Err(Error::Rdma(format!(
            "found RDMA device {name}, but hipobj {} cannot open devices yet (protection domain, \
             queue pairs and memory registration are not part of this release)",
            env!("CARGO_PKG_VERSION")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named_in_the_error() {
        let err = LoadedVerbs::open(&["libhipobj-test-no-such-verbs.so.1"])
            .err()
            .unwrap();
        assert_eq!(err.code(), crate::core::Code::Rdma);
        assert!(
            err.to_string()
                .contains("libhipobj-test-no-such-verbs.so.1"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_symbol_is_named_in_the_error() {
        // libc loads everywhere and has none of the verbs.
        let err = LoadedVerbs::open(&["libc.so.6"]).err().unwrap();
        assert!(
            err.to_string()
                .contains("libc.so.6: symbol ibv_get_device_list not found"),
            "{err}"
        );
    }
}
