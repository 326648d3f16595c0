//! [`LoadedHip`]: the production [`Gpu`], over `libamdhip64` and (for
//! dma-buf export) `libhsa-runtime64`, both opened with `dlopen`.
//!
//! Neither library is ever unloaded, not even when a `LoadedHip` is
//! dropped: once the HIP runtime has initialised, its threads and exit
//! handlers point into its code, so `dlclose` could pull it from under
//! them. The handles are held in `ManuallyDrop` for that reason.
//!
//! HSA needs no initialisation of its own here: `libamdhip64` links
//! `libhsa-runtime64.so.1`, so the `dlopen` below finds the copy HIP
//! already mapped, and HIP's first call (`hipGetDeviceCount` at init) has
//! run `hsa_init` by the time anything is exported.

use std::ffi::{c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use super::owners::{DeviceMemory, PinnedHostBuffer, RecordedEvent};
use super::sys::{
    self, check, HipFns, HipPointerAttribute, HsaPortableExportDmabuf, PointerAbi,
    HIP_ERROR_INVALID_VALUE, HIP_MEMCPY_DEFAULT, HIP_STREAM_PER_THREAD, HIP_SUCCESS,
    HSA_STATUS_ERROR, HSA_STATUS_SUCCESS,
};
use crate::error::{Error, Result};
use crate::platform::dl::{self, Loaded};
use crate::platform::{
    DeviceBuffer, Gpu, GpuEvent, HipResult, HostBuffer, PointerKind, RuntimeInfo,
};

/// Runtime sonames of the HIP runtime, newest first. The unversioned
/// development name comes last; its major version is read from the file it
/// resolves to.
pub const SONAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

/// The length `hipDeviceGetPCIBusId` is given: `dddd:bb:dd.f` and its NUL
/// fit many times over. Its buffer has one byte more, always NUL.
const PCI_BUS_ID_LEN: c_int = 63;

/// The resolved HIP table, shared with the buffers and events it creates
/// so that they can free themselves.
pub(crate) struct HipApi {
    pub(crate) fns: HipFns,
    library: ManuallyDrop<Loaded>,
}

/// The HIP runtime, loaded, with HSA's dma-buf export when the runtime has
/// one.
pub struct LoadedHip {
    hip: Arc<HipApi>,
    major: u32,
    abi: PointerAbi,
    export_dmabuf: Option<HsaPortableExportDmabuf>,
    /// Keeps HSA mapped for `export_dmabuf`; `None` without HSA.
    hsa: Option<ManuallyDrop<Loaded>>,
}

impl LoadedHip {
    /// Opens the first of `sonames` that loads and resolves every HIP
    /// function, then HSA's export from [`sys::HSA_SONAMES`] if it is
    /// there. A missing runtime or function is [`Error::HipMissing`]
    /// (reported as `hipErrorNoDevice`), naming what was tried.
    pub fn open(sonames: &[&'static str]) -> Result<LoadedHip> {
        LoadedHip::open_with(sonames, sys::HSA_SONAMES)
    }

    /// [`LoadedHip::open`] with HSA looked for under `hsa_sonames`; none
    /// loading means no dma-buf export, not an error.
    pub fn open_with(sonames: &[&'static str], hsa_sonames: &[&'static str]) -> Result<LoadedHip> {
        let library = ManuallyDrop::new(dl::open_first(sonames).map_err(Error::HipMissing)?);
        // SAFETY: `HipFns` is written from hip_runtime_api.h, the header of
        // the library just loaded, which is never unloaded.
        let fns = unsafe { HipFns::resolve(&library) }.map_err(Error::HipMissing)?;
        let major = runtime_major(&library, fns.get_device_count as *const c_void)?;
        let hip = Arc::new(HipApi { fns, library });

        let hsa = dl::open_first(hsa_sonames).ok().map(ManuallyDrop::new);
        let export_dmabuf = hsa.as_ref().and_then(|hsa| {
            // SAFETY: `HsaPortableExportDmabuf` is the prototype of
            // hsa_ext_amd.h, and `hsa` is never unloaded.
            unsafe {
                dl::symbol::<HsaPortableExportDmabuf>(
                    hsa,
                    sys::HSA_PORTABLE_EXPORT_DMABUF.to_bytes_with_nul(),
                )
            }
            .ok()
        });
        Ok(LoadedHip {
            hip,
            major,
            abi: PointerAbi::for_major(major),
            export_dmabuf,
            hsa,
        })
    }

    /// The soname the runtime was found under.
    pub fn soname(&self) -> &'static str {
        self.hip.library.name
    }

    /// The runtime's major version (ROCm's), which decides
    /// [`LoadedHip::pointer_abi`].
    pub fn runtime_major(&self) -> u32 {
        self.major
    }

    /// How `hipPointerAttribute_t` is read for this runtime.
    pub fn pointer_abi(&self) -> PointerAbi {
        self.abi
    }

    /// The soname HSA was found under, if it was.
    pub fn hsa_soname(&self) -> Option<&'static str> {
        self.hsa.as_ref().map(|hsa| hsa.name)
    }

    /// Whether `hsa_amd_portable_export_dmabuf` was found.
    pub fn has_dmabuf_export(&self) -> bool {
        self.export_dmabuf.is_some()
    }

    /// Runs `f` with `device` current on this thread, then makes the
    /// thread's own device current again. The current device is per thread
    /// (`hipSetDevice`, "stored in thread-local-storage", cheap and without
    /// synchronisation), so this leaves the application's thread as it was.
    /// The first failure is reported.
    fn on_device<T>(&self, device: i32, f: impl FnOnce() -> HipResult<T>) -> HipResult<T> {
        let fns = &self.hip.fns;
        let current = Self::int_out(fns.get_device)?;
        if current == device {
            return f();
        }
        // SAFETY: hipSetDevice takes a device index, which it validates.
        check(unsafe { (fns.set_device)(device) })?;
        let outcome = f();
        // SAFETY: `current` is the index hipGetDevice just returned.
        let restored = check(unsafe { (fns.set_device)(current) });
        outcome.and_then(|value| restored.map(|()| value))
    }

    fn int_out(f: unsafe extern "C" fn(*mut c_int) -> c_int) -> HipResult<i32> {
        let mut value: c_int = 0;
        // SAFETY: `f` is one of the table's functions taking one `int *` out
        // parameter, and `value` is a valid place to write it.
        check(unsafe { f(&mut value) })?;
        Ok(value)
    }
}

/// The major version of the loaded runtime: the `N` of the soname
/// `libamdhip64.so.N`, or for an unversioned name, of the file that name
/// resolves to (found through `sym`, one of its functions).
fn runtime_major(library: &Loaded, sym: *const c_void) -> Result<u32> {
    if let Some(major) = major_of(library.name) {
        return Ok(major);
    }
    let mut info = libc::Dl_info {
        dli_fname: ptr::null(),
        dli_fbase: ptr::null_mut(),
        dli_sname: ptr::null(),
        dli_saddr: ptr::null_mut(),
    };
    // SAFETY: `sym` is the address of a function of a loaded library, and
    // `info` is a valid place for dladdr's answer.
    let found = unsafe { libc::dladdr(sym, &mut info) } != 0 && !info.dli_fname.is_null();
    let file = found.then(|| {
        // SAFETY: dladdr succeeded, so `dli_fname` is the NUL-terminated
        // path of the mapped file, valid while it stays mapped (forever).
        let path = unsafe { CStr::from_ptr(info.dli_fname) };
        let path = Path::new(path.to_str().unwrap_or_default());
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
    });
    let major = file
        .as_ref()
        .and_then(|file| file.file_name()?.to_str())
        .and_then(major_of);
    major.ok_or_else(|| {
        Error::HipMissing(format!(
            "{}: cannot tell the HIP runtime's major version (file {})",
            library.name,
            file.as_ref()
                .map_or("unknown".into(), |f| f.display().to_string())
        ))
    })
}

/// `N` of a file name `lib<name>.so.N[.M...]`.
fn major_of(file_name: &str) -> Option<u32> {
    let (_, version) = file_name.split_once(".so.")?;
    version.split('.').next()?.parse().ok()
}

impl Gpu for LoadedHip {
    fn device_count(&self) -> HipResult<i32> {
        Self::int_out(self.hip.fns.get_device_count)
    }

    fn current_device(&self) -> HipResult<i32> {
        Self::int_out(self.hip.fns.get_device)
    }

    fn pci_bus_id(&self, device: i32) -> HipResult<String> {
        let mut buf = [0u8; 64];
        // SAFETY: `buf` is writable for more than `PCI_BUS_ID_LEN` bytes.
        check(unsafe {
            (self.hip.fns.device_get_pci_bus_id)(buf.as_mut_ptr().cast(), PCI_BUS_ID_LEN, device)
        })?;
        let id = CStr::from_bytes_until_nul(&buf).map_err(|_| HIP_ERROR_INVALID_VALUE)?;
        Ok(id.to_string_lossy().into_owned())
    }

    /// `hipErrorInvalidValue` for a non-NULL address is memory HIP does not
    /// know: "the API cannot handle the pointer and returns
    /// hipErrorInvalidValue", the behaviour of CUDA before 11.0 (HIP's
    /// reference of `hipPointerGetAttributes`, ROCm 5 to 7).
    fn pointer_kind(&self, addr: usize) -> HipResult<PointerKind> {
        let mut attr = HipPointerAttribute::zeroed();
        // SAFETY: `attr` is a valid hipPointerAttribute_t to fill in (its
        // layout is that of the loaded runtime's header); HIP only looks the
        // address up, never dereferences it.
        let code = unsafe {
            (self.hip.fns.pointer_get_attributes)(&mut attr, ptr::with_exposed_provenance(addr))
        };
        match code {
            HIP_SUCCESS => Ok(self.abi.kind(&attr)),
            HIP_ERROR_INVALID_VALUE if addr != 0 => Ok(PointerKind::UnknownHost),
            code => Err(code),
        }
    }

    fn allocation_range(&self, addr: usize) -> HipResult<(usize, usize)> {
        let mut base: *mut c_void = ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: `base` and `size` are valid out-parameters; HIP only looks
        // the address up.
        check(unsafe {
            (self.hip.fns.mem_get_address_range)(
                &mut base,
                &mut size,
                ptr::with_exposed_provenance_mut(addr),
            )
        })?;
        Ok((base.addr(), size))
    }

    fn host_alloc(&self, len: usize) -> HipResult<Arc<dyn HostBuffer>> {
        Ok(Arc::new(PinnedHostBuffer::alloc(&self.hip, len)?))
    }

    /// Creates the event first, so that a copy is never queued without
    /// one; if `hipEventRecord` fails, the copy is already queued.
    fn copy_async(&self, dst: usize, src: usize, len: usize) -> HipResult<Arc<dyn GpuEvent>> {
        let event = RecordedEvent::create(&self.hip)?;
        // SAFETY: `core` passes ranges of `len` bytes inside buffers that
        // stay allocated until the event completes or is leaked with them
        // (registered buffers, which the application keeps until it
        // deregisters them, and staging buffers it owns); HIP checks that it
        // can reach both pointers and fails the call otherwise.
        check(unsafe {
            (self.hip.fns.memcpy_async)(
                ptr::with_exposed_provenance_mut(dst),
                ptr::with_exposed_provenance(src),
                len,
                HIP_MEMCPY_DEFAULT,
                HIP_STREAM_PER_THREAD,
            )
        })?;
        event.record(HIP_STREAM_PER_THREAD)?;
        Ok(Arc::new(event))
    }

    /// `hipDeviceSynchronize` waits for the calling thread's current device
    /// only, so for another device: switch, synchronise, and switch back.
    fn synchronize(&self, device: i32) -> HipResult<()> {
        self.on_device(device, || {
            // SAFETY: hipDeviceSynchronize takes no argument.
            check(unsafe { (self.hip.fns.device_synchronize)() })
        })
    }

    /// `hipMalloc` with `device` current for the call.
    fn device_alloc(&self, device: i32, len: usize) -> HipResult<Arc<dyn DeviceBuffer>> {
        let memory = self.on_device(device, || DeviceMemory::alloc(&self.hip, device, len))?;
        Ok(Arc::new(memory))
    }

    fn runtime(&self) -> HipResult<RuntimeInfo> {
        Ok(RuntimeInfo {
            name: "HIP",
            library: self.soname(),
            version: Self::int_out(self.hip.fns.runtime_get_version)?,
        })
    }

    /// The dma-buf covers the whole allocation; ROCR's
    /// `hsa_amd_portable_close_dmabuf` is a plain `close(2)` of the fd
    /// (`Runtime::DmaBufClose`), so an [`OwnedFd`] releases it correctly.
    /// An `Err` is the `hsa_status_t`.
    fn export_dmabuf(&self, addr: usize, len: usize) -> Option<HipResult<(OwnedFd, u64)>> {
        let export = self.export_dmabuf?;
        let mut fd: c_int = -1;
        let mut offset: u64 = 0;
        // SAFETY: `fd` and `offset` are valid out-parameters; HSA looks the
        // range up among its allocations and fails for anything else.
        let status = unsafe {
            export(
                ptr::with_exposed_provenance(addr),
                len,
                &mut fd,
                &mut offset,
            )
        };
        Some(match status {
            HSA_STATUS_SUCCESS if fd >= 0 => {
                // SAFETY: on success HSA hands over a new fd that nothing
                // else owns.
                Ok((unsafe { OwnedFd::from_raw_fd(fd) }, offset))
            }
            HSA_STATUS_SUCCESS => Err(HSA_STATUS_ERROR),
            status => Err(status),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runtime_is_no_device() {
        let err = LoadedHip::open(&["libhipobj-test-no-such-hip.so.6"])
            .err()
            .unwrap();
        assert_eq!(err.hip_error(), crate::error::HIP_ERROR_NO_DEVICE);
        assert!(
            err.to_string().contains("libhipobj-test-no-such-hip.so.6"),
            "{err}"
        );
        assert_eq!(err.code(), crate::error::Code::Rdma);
    }

    #[test]
    fn a_runtime_without_the_hip_functions_is_missing() {
        // libc loads everywhere and has none of them.
        let err = LoadedHip::open(&["libc.so.6"]).err().unwrap();
        assert!(
            err.to_string()
                .contains("libc.so.6: symbol hipGetDeviceCount not found"),
            "{err}"
        );
        assert_eq!(err.hip_error(), crate::error::HIP_ERROR_NO_DEVICE);
    }

    #[test]
    fn the_major_version_is_the_first_number_after_so() {
        assert_eq!(major_of("libamdhip64.so.5"), Some(5));
        assert_eq!(major_of("libamdhip64.so.6.2.60200"), Some(6));
        assert_eq!(major_of("libamdhip64.so.7"), Some(7));
        assert_eq!(major_of("libamdhip64.so"), None);
        assert_eq!(major_of("libamdhip64.so.x"), None);
    }
}
