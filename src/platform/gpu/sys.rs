//! The C side of HIP and HSA: types, constants and prototypes as ROCm's
//! `<hip/hip_runtime_api.h>`, `<hip/driver_types.h>`, `<hsa/hsa.h>` and
//! `<hsa/hsa_ext_amd.h>` declare them, and the function tables this library
//! resolves with `dlopen`.
//!
//! C enums (`hipError_t`, `hipMemcpyKind`, `hipMemoryType`, `hsa_status_t`)
//! are `int`-sized on the Linux ABIs ROCm supports and are passed as
//! [`c_int`].

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::platform::dl::{self, Loaded};
use crate::platform::PointerKind;

/// `hipError_t`.
pub type HipError = c_int;
/// `hipStream_t`: `struct ihipStream_t *`, opaque.
pub type HipStream = *mut c_void;
/// `hipEvent_t`: `struct ihipEvent_t *`, opaque.
pub type HipEvent = *mut c_void;
/// `hsa_status_t`.
pub type HsaStatus = c_int;

/// `hipSuccess`
pub const HIP_SUCCESS: HipError = 0;
/// `hipErrorInvalidValue`: also what `hipPointerGetAttributes` returns for
/// memory HIP does not know (see [`PointerAbi`]).
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
/// `hipErrorOutOfMemory`
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
/// `hipErrorNotReady`: `hipEventQuery`'s "not yet", not a failure.
pub const HIP_ERROR_NOT_READY: HipError = 600;

/// `Ok(())` for `hipSuccess`, else the code.
pub fn check(code: HipError) -> crate::platform::HipResult<()> {
    match code {
        HIP_SUCCESS => Ok(()),
        code => Err(code),
    }
}

/// `hipMemcpyDefault`: the runtime infers the direction from the pointers
/// (unified virtual addressing).
pub const HIP_MEMCPY_DEFAULT: c_int = 4;
/// `hipEventDisableTiming`: no timestamps, the cheapest event to record
/// and query.
pub const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `hipHostMallocDefault`
pub const HIP_HOST_MALLOC_DEFAULT: c_uint = 0;
/// `hipStreamPerThread`, `((hipStream_t)2)`: the calling thread's implicit
/// stream on its current device, which does not synchronise with other
/// threads' work the way the legacy NULL stream does.
pub const HIP_STREAM_PER_THREAD: HipStream = std::ptr::without_provenance_mut(2);

/// `HSA_STATUS_SUCCESS`
pub const HSA_STATUS_SUCCESS: HsaStatus = 0;
/// `HSA_STATUS_ERROR`: the generic failure, reported when an export claims
/// success without a file descriptor.
pub const HSA_STATUS_ERROR: HsaStatus = 0x1000;

/// `hipPointerAttribute_t`, the same 32 bytes in every ROCm from 5 on.
///
/// ROCm 5 (`hip_runtime_api.h` of ROCm 5.2, the Debian package the layout
/// test compiles against):
///
/// ```c
/// typedef struct hipPointerAttribute_t {
///     enum hipMemoryType memoryType;
///     int device;
///     void* devicePointer;
///     void* hostPointer;
///     int isManaged;
///     unsigned allocationFlags;
/// } hipPointerAttribute_t;
/// ```
///
/// ROCm 6 and 7 renamed the first field and renumbered its enum, keeping
/// every field's type, order and offset:
///
/// ```c
/// typedef struct hipPointerAttribute_t {
///     enum hipMemoryType type;
///     int device;
///     void* devicePointer;
///     void* hostPointer;
///     int isManaged;
///     unsigned allocationFlags;
/// } hipPointerAttribute_t;
/// ```
///
/// So one Rust struct serves both; what differs is how
/// [`HipPointerAttribute::memory_type`] is read ([`PointerAbi`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipPointerAttribute {
    /// `memoryType` (ROCm 5) or `type` (ROCm 6+): an `enum hipMemoryType`.
    pub memory_type: c_int,
    /// `device`: the device the memory belongs to.
    pub device: c_int,
    /// `devicePointer`
    pub device_pointer: *mut c_void,
    /// `hostPointer`
    pub host_pointer: *mut c_void,
    /// `isManaged`
    pub is_managed: c_int,
    /// `allocationFlags`
    pub allocation_flags: c_uint,
}

impl HipPointerAttribute {
    /// All zeroes, as `hipPointerGetAttributes` itself starts (it `memset`s
    /// the struct before filling it in).
    pub fn zeroed() -> HipPointerAttribute {
        HipPointerAttribute {
            memory_type: 0,
            device: 0,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        }
    }
}

/// Which numbering of `enum hipMemoryType` the loaded runtime uses, chosen
/// by the major version of `libamdhip64.so`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointerAbi {
    /// ROCm 5 and older: `hipMemoryTypeHost` 0, `Device` 1, `Array` 2,
    /// `Unified` 3 (documented as unused).
    Rocm5,
    /// ROCm 6 and newer: `hipMemoryTypeUnregistered` 0, `Host` 1,
    /// `Device` 2, `Managed` 3, `Array` 10, `Unified` 11.
    Rocm6,
}

impl PointerAbi {
    /// The numbering of runtime major version `major` (the `N` of
    /// `libamdhip64.so.N`).
    pub fn for_major(major: u32) -> PointerAbi {
        if major >= 6 {
            PointerAbi::Rocm6
        } else {
            PointerAbi::Rocm5
        }
    }

    /// What a successful `hipPointerGetAttributes` says about an address.
    /// Device, array, managed and unified memory all belong to the device
    /// named by `attr.device`; a value this build does not know is treated
    /// as memory HIP does not know.
    pub fn kind(self, attr: &HipPointerAttribute) -> PointerKind {
        let device = PointerKind::Device {
            device: attr.device,
        };
        match (self, attr.memory_type) {
            (PointerAbi::Rocm5, 0) => PointerKind::PinnedHost,
            (PointerAbi::Rocm5, 1..=3) => device,
            (PointerAbi::Rocm6, 1) => PointerKind::PinnedHost,
            (PointerAbi::Rocm6, 2 | 3 | 10 | 11) => device,
            _ => PointerKind::UnknownHost,
        }
    }
}

/// Declares a table of required functions: the struct of function
/// pointers, the list of its symbol names, and `resolve`. The caller has
/// `dl` and `Loaded` of [`crate::platform::dl`] in scope. Exported for the
/// CUDA lab of the tests (`hipobj_testing::cuda_lab`), which declares the
/// driver functions an application uses the same way.
#[macro_export]
#[doc(hidden)]
macro_rules! fn_table {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident: $symbol:literal => $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// The symbol of every function in the table, in order.
            pub const SYMBOLS: &'static [&'static str] = &[$($symbol),*];

            /// Resolves every function of the table in `loaded`; the error
            /// names the first missing symbol.
            ///
            /// # Safety
            ///
            /// `loaded` must be the library these prototypes were written
            /// for, and must stay loaded while the table is used.
            pub(crate) unsafe fn resolve(loaded: &Loaded) -> Result<$name, String> {
                Ok($name {
                    $(
                        // SAFETY: the field's type is the prototype the
                        // vendor header declares for this symbol (copied
                        // beside each field), and the caller keeps
                        // `loaded` mapped.
                        $field: unsafe {
                            dl::symbol::<$ty>(loaded, concat!($symbol, "\0").as_bytes())?
                        },
                    )*
                })
            }
        }
    };
}

pub use crate::fn_table;

fn_table! {
    /// The HIP runtime functions this library calls, with the prototypes of
    /// `<hip/hip_runtime_api.h>`.
    pub struct HipFns {
        /// `hipError_t hipGetDeviceCount(int* count)`
        get_device_count: "hipGetDeviceCount" =>
            unsafe extern "C" fn(count: *mut c_int) -> HipError,
        /// `hipError_t hipGetDevice(int* deviceId)`
        get_device: "hipGetDevice" =>
            unsafe extern "C" fn(device: *mut c_int) -> HipError,
        /// `hipError_t hipSetDevice(int deviceId)`
        set_device: "hipSetDevice" =>
            unsafe extern "C" fn(device: c_int) -> HipError,
        /// `hipError_t hipDeviceGetPCIBusId(char* pciBusId, int len, int device)`
        device_get_pci_bus_id: "hipDeviceGetPCIBusId" =>
            unsafe extern "C" fn(pci_bus_id: *mut c_char, len: c_int, device: c_int) -> HipError,
        /// `hipError_t hipPointerGetAttributes(hipPointerAttribute_t* attributes,
        /// const void* ptr)`
        pointer_get_attributes: "hipPointerGetAttributes" =>
            unsafe extern "C" fn(
                attributes: *mut HipPointerAttribute,
                ptr: *const c_void,
            ) -> HipError,
        /// `hipError_t hipMemGetAddressRange(hipDeviceptr_t* pbase, size_t* psize,
        /// hipDeviceptr_t dptr)`, with `typedef void* hipDeviceptr_t`
        mem_get_address_range: "hipMemGetAddressRange" =>
            unsafe extern "C" fn(
                base: *mut *mut c_void,
                size: *mut usize,
                ptr: *mut c_void,
            ) -> HipError,
        /// `hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags)`
        host_malloc: "hipHostMalloc" =>
            unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> HipError,
        /// `hipError_t hipHostFree(void* ptr)`
        host_free: "hipHostFree" =>
            unsafe extern "C" fn(ptr: *mut c_void) -> HipError,
        /// `hipError_t hipMemcpyAsync(void* dst, const void* src, size_t sizeBytes,
        /// hipMemcpyKind kind, hipStream_t stream)`
        memcpy_async: "hipMemcpyAsync" =>
            unsafe extern "C" fn(
                dst: *mut c_void,
                src: *const c_void,
                size: usize,
                kind: c_int,
                stream: HipStream,
            ) -> HipError,
        /// `hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags)`
        event_create_with_flags: "hipEventCreateWithFlags" =>
            unsafe extern "C" fn(event: *mut HipEvent, flags: c_uint) -> HipError,
        /// `hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)`
        event_record: "hipEventRecord" =>
            unsafe extern "C" fn(event: HipEvent, stream: HipStream) -> HipError,
        /// `hipError_t hipEventQuery(hipEvent_t event)`
        event_query: "hipEventQuery" =>
            unsafe extern "C" fn(event: HipEvent) -> HipError,
        /// `hipError_t hipEventDestroy(hipEvent_t event)`
        event_destroy: "hipEventDestroy" =>
            unsafe extern "C" fn(event: HipEvent) -> HipError,
        /// `hipError_t hipDeviceSynchronize(void)`
        device_synchronize: "hipDeviceSynchronize" =>
            unsafe extern "C" fn() -> HipError,
        /// `hipError_t hipMalloc(void** ptr, size_t size)`
        malloc: "hipMalloc" =>
            unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize) -> HipError,
        /// `hipError_t hipFree(void* ptr)`
        free: "hipFree" => unsafe extern "C" fn(ptr: *mut c_void) -> HipError,
        /// `hipError_t hipRuntimeGetVersion(int* runtimeVersion)`
        runtime_get_version: "hipRuntimeGetVersion" =>
            unsafe extern "C" fn(version: *mut c_int) -> HipError,
    }
}

/// `hsa_status_t hsa_amd_portable_export_dmabuf(const void* ptr, size_t size,
/// int* dmabuf, uint64_t* offset)` of `<hsa/hsa_ext_amd.h>`. Older
/// runtimes (ROCm 5.2, Debian's) lack it, hence optional.
pub type HsaPortableExportDmabuf = unsafe extern "C" fn(
    ptr: *const c_void,
    size: usize,
    dmabuf: *mut c_int,
    offset: *mut u64,
) -> HsaStatus;

/// Symbol of [`HsaPortableExportDmabuf`].
pub const HSA_PORTABLE_EXPORT_DMABUF: &CStr = c"hsa_amd_portable_export_dmabuf";

/// Runtime sonames of the HSA runtime.
pub const HSA_SONAMES: &[&str] = &["libhsa-runtime64.so.1"];

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn pointer_attribute_layout_is_the_rocm_headers() {
        // Offsets of both headers' struct on LP64 (the ROCm 5 one is also
        // checked against the installed header by tests/hip_loader.rs).
        assert_eq!(size_of::<HipPointerAttribute>(), 32);
        assert_eq!(align_of::<HipPointerAttribute>(), 8);
        assert_eq!(offset_of!(HipPointerAttribute, memory_type), 0);
        assert_eq!(offset_of!(HipPointerAttribute, device), 4);
        assert_eq!(offset_of!(HipPointerAttribute, device_pointer), 8);
        assert_eq!(offset_of!(HipPointerAttribute, host_pointer), 16);
        assert_eq!(offset_of!(HipPointerAttribute, is_managed), 24);
        assert_eq!(offset_of!(HipPointerAttribute, allocation_flags), 28);
    }

    fn attr(memory_type: c_int, device: c_int) -> HipPointerAttribute {
        HipPointerAttribute {
            memory_type,
            device,
            ..HipPointerAttribute::zeroed()
        }
    }

    #[test]
    fn rocm5_memory_types_are_numbered_from_host() {
        let abi = PointerAbi::for_major(5);
        assert_eq!(abi, PointerAbi::Rocm5);
        assert_eq!(abi.kind(&attr(0, 0)), PointerKind::PinnedHost);
        for value in 1..=3 {
            assert_eq!(abi.kind(&attr(value, 2)), PointerKind::Device { device: 2 });
        }
        assert_eq!(abi.kind(&attr(10, 0)), PointerKind::UnknownHost);
    }

    #[test]
    fn rocm6_memory_types_start_with_unregistered() {
        for major in [6, 7] {
            let abi = PointerAbi::for_major(major);
            assert_eq!(abi, PointerAbi::Rocm6);
            assert_eq!(abi.kind(&attr(0, 0)), PointerKind::UnknownHost);
            assert_eq!(abi.kind(&attr(1, 0)), PointerKind::PinnedHost);
            for value in [2, 3, 10, 11] {
                assert_eq!(abi.kind(&attr(value, 1)), PointerKind::Device { device: 1 });
            }
            assert_eq!(abi.kind(&attr(4, 0)), PointerKind::UnknownHost);
        }
    }

    #[test]
    fn per_thread_stream_is_handle_two() {
        assert_eq!(HIP_STREAM_PER_THREAD.addr(), 2);
    }
}
