//! The real HIP loader against the ROCm 5 runtime Debian ships
//! (`libamdhip64-5`, `libamdhip64-dev`, `libhsa-runtime64-1`,
//! `libhsa-runtime-dev`: `scripts/setup.sh` installs them), on a machine
//! without a GPU.
//!
//! What needs a GPU (pointer attributes of device memory, copies and their
//! events, pinned buffers, synchronisation on another device, dma-buf
//! export) cannot run here; those run on a GPU machine. Needs a C compiler,
//! binutils (`nm`) and `ldconfig`; anything missing is a failure.

mod common;

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};

use hipobj::core::error::HIP_ERROR_NO_DEVICE;
use hipobj::platform::gpu::sys::{self, HipFns, HipPointerAttribute, PointerAbi};
use hipobj::platform::gpu::LoadedHip;
use hipobj::platform::{Gpu, PointerKind};

const HIP5: &str = "libamdhip64.so.5";
const HSA1: &str = "libhsa-runtime64.so.1";

/// `hipErrorInvalidDevice`: what every HIP 5.2 call but
/// `hipGetDeviceCount` returns here (see `without_a_gpu_...`).
const HIP_ERROR_INVALID_DEVICE: i32 = 101;

fn open_hip5() -> LoadedHip {
    LoadedHip::open(&[HIP5]).unwrap_or_else(|e| {
        panic!("{e} (install libamdhip64-5 and libhsa-runtime64-1: scripts/setup.sh)")
    })
}

/// The expectations below are for a machine without an AMD GPU: no
/// `/dev/kfd`, the ROCm kernel driver's device. On a GPU machine they do not
/// apply, and this says so instead of passing.
fn assert_no_gpu() {
    assert!(
        !Path::new("/dev/kfd").exists(),
        "/dev/kfd exists: these tests are for a machine without an AMD GPU"
    );
}

/// Where the dynamic loader finds `soname` (`ldconfig -p`).
fn library_path(soname: &str) -> PathBuf {
    let cache = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|tool| std::process::Command::new(tool).arg("-p").output().ok())
        .unwrap_or_else(|| panic!("cannot run ldconfig"));
    let text = String::from_utf8_lossy(&cache.stdout).into_owned();
    text.lines()
        .filter_map(|line| line.trim().split_once(" => "))
        .find(|(name, _)| name.split_whitespace().next() == Some(soname))
        .map(|(_, path)| PathBuf::from(path))
        .unwrap_or_else(|| panic!("{soname} is not in the loader's cache (scripts/setup.sh)"))
}

/// The functions `path` exports (`nm -D --defined-only`), without their
/// version suffixes (`hipGetDeviceCount@@hip_4.2`).
fn exported_functions(path: &Path) -> Vec<String> {
    let text = common::tool_stdout(
        "nm",
        &["-D".as_ref(), "--defined-only".as_ref(), path.as_os_str()],
    );
    text.lines()
        .filter_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [_, "T" | "W" | "i", name] => {
                    Some(name.split('@').next().unwrap_or(name).to_owned())
                }
                _ => None,
            },
        )
        .collect()
}

#[test]
fn libamdhip64_so_5_loads_and_resolves_every_function_of_the_table() {
    let hip = open_hip5();
    assert_eq!(hip.soname(), HIP5);
    assert_eq!(hip.runtime_major(), 5);
    assert_eq!(hip.pointer_abi(), PointerAbi::Rocm5);
    assert_eq!(hip.hsa_soname(), Some(HSA1));
    // `open` resolved every one of these or failed naming the missing one.
    assert_eq!(
        HipFns::SYMBOLS,
        [
            "hipGetDeviceCount",
            "hipGetDevice",
            "hipSetDevice",
            "hipDeviceGetPCIBusId",
            "hipPointerGetAttributes",
            "hipMemGetAddressRange",
            "hipHostMalloc",
            "hipHostFree",
            "hipMemcpyAsync",
            "hipEventCreateWithFlags",
            "hipEventRecord",
            "hipEventQuery",
            "hipEventDestroy",
            "hipDeviceSynchronize",
            "hipMalloc",
            "hipFree",
            "hipRuntimeGetVersion",
        ]
    );
}

#[test]
fn an_unversioned_name_takes_the_major_version_of_the_file_it_resolves_to() {
    // libamdhip64-dev's libamdhip64.so -> libamdhip64.so.5 -> .so.5.2.x
    let hip = LoadedHip::open(&["libamdhip64.so"])
        .unwrap_or_else(|e| panic!("{e} (install libamdhip64-dev: scripts/setup.sh)"));
    assert_eq!(hip.soname(), "libamdhip64.so");
    assert_eq!(hip.runtime_major(), 5);
    assert_eq!(hip.pointer_abi(), PointerAbi::Rocm5);
}

#[test]
fn without_a_gpu_device_count_is_hips_no_device_error() {
    assert_no_gpu();
    let hip = open_hip5();
    let count = hip.device_count();
    println!("hipGetDeviceCount without a GPU: {count:?}");
    // Measured on this machine: HIP 5.2's hipGetDeviceCount finds no
    // /dev/kfd and returns hipErrorNoDevice (100), the same code the library
    // reports when the runtime cannot be loaded at all. Asked again, it says
    // the same.
    assert_eq!(count, Err(HIP_ERROR_NO_DEVICE));
    assert_eq!(hip.device_count(), Err(HIP_ERROR_NO_DEVICE));
}

#[test]
fn without_a_gpu_every_other_call_fails_with_invalid_device() {
    assert_no_gpu();
    let hip = open_hip5();
    let mut host = [0u8; 64];
    let addr = host.as_mut_ptr() as usize;
    // Measured on this machine: every HIP 5.2 API that initialises a device
    // context fails with hipErrorInvalidDevice (101) when there is none;
    // the library passes each code through unchanged, and none of these
    // calls crashes. The copy fails at hipEventCreateWithFlags, so nothing
    // is queued.
    let results = [
        ("hipGetDevice", hip.current_device().err()),
        ("hipDeviceGetPCIBusId", hip.pci_bus_id(0).err()),
        ("hipPointerGetAttributes", hip.pointer_kind(addr).err()),
        ("hipMemGetAddressRange", hip.allocation_range(addr).err()),
        ("hipHostMalloc", hip.host_alloc(4096).err()),
        ("hipMemcpyAsync", hip.copy_async(addr, addr + 32, 32).err()),
        ("hipDeviceSynchronize", hip.synchronize(0).err()),
        ("hipMalloc", hip.device_alloc(0, 4096).err()),
    ];
    for (call, code) in results {
        println!("{call} without a GPU: {code:?}");
        assert_eq!(code, Some(HIP_ERROR_INVALID_DEVICE), "{call}");
    }
    // Zero bytes of pinned memory are refused before HIP is asked.
    assert_eq!(hip.host_alloc(0).err(), Some(sys::HIP_ERROR_INVALID_VALUE));
}

#[test]
fn without_a_gpu_the_runtime_still_reports_its_version() {
    assert_no_gpu();
    let hip = open_hip5();
    let info = hip.runtime();
    println!("hipRuntimeGetVersion without a GPU: {info:?}");
    let info = info.expect("hipRuntimeGetVersion needs no device");
    assert_eq!((info.name, info.library), ("HIP", HIP5));
    // Debian's ROCm 5.2: HIP_VERSION 5.2.21153 (<hip/hip_version.h>).
    assert!(
        info.version_text().starts_with("5.2."),
        "{}",
        info.version_text()
    );
}

#[test]
fn dmabuf_export_is_there_exactly_when_hsa_exports_it() {
    let hip = open_hip5();
    let hsa = exported_functions(&library_path(HSA1));
    assert!(hsa.iter().any(|f| f == "hsa_init"), "nm listed {hsa:?}");
    let export = sys::HSA_PORTABLE_EXPORT_DMABUF.to_str().expect("ASCII");
    let present = hsa.iter().any(|f| f == export);
    println!(
        "{HSA1} {} {export}",
        if present { "exports" } else { "lacks" }
    );
    assert_eq!(hip.has_dmabuf_export(), present);
    if !present {
        // ROCm 5.2 (Debian's) predates the export: no dma-buf, no call.
        let x = 0u64;
        assert!(hip.export_dmabuf(&x as *const u64 as usize, 8).is_none());
    }
}

#[test]
fn every_function_of_the_table_is_exported_by_the_installed_runtime() {
    let path = library_path(HIP5);
    let exported = exported_functions(&path);
    let missing: Vec<&str> = HipFns::SYMBOLS
        .iter()
        .copied()
        .filter(|symbol| !exported.iter().any(|e| e == symbol))
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not export {missing:?}",
        path.display()
    );
}

#[test]
fn loading_from_no_names_is_hip_missing() {
    let err = LoadedHip::open(&[]).err().expect("nothing to load");
    assert_eq!(err.hip_error(), HIP_ERROR_NO_DEVICE);
    assert!(err.to_string().contains("no names given"), "{err}");
}

#[test]
fn loading_from_names_that_do_not_exist_is_hip_missing_naming_each() {
    let names = ["libhipobj-test-nothing.so.7", "libhipobj-test-nothing.so.6"];
    let err = LoadedHip::open(&names).err().expect("nothing to load");
    assert_eq!(err.hip_error(), HIP_ERROR_NO_DEVICE);
    assert!(matches!(err, hipobj::core::Error::HipMissing(_)), "{err:?}");
    for name in names {
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn without_hsa_there_is_no_dmabuf_export() {
    let hip = LoadedHip::open_with(&[HIP5], &["libhipobj-test-no-hsa.so.1"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(hip.hsa_soname(), None);
    assert!(!hip.has_dmabuf_export());
    assert!(hip.export_dmabuf(4096, 4096).is_none());
}

/// Compiles tests/hip/pointer_attribute.c against the installed
/// `<hip/hip_runtime_api.h>` and returns what it prints, by name.
fn installed_header_facts() -> BTreeMap<String, Vec<usize>> {
    let src = common::manifest_dir().join("tests/hip/pointer_attribute.c");
    let scratch = common::Scratch::new("hip-layout");
    let exe = scratch.path().join("pointer_attribute");
    // The header refuses to be read without naming the platform.
    common::compile_c(&src, &exe, &["-D__HIP_PLATFORM_AMD__"]);
    let output = common::tool_stdout(exe.to_str().expect("a UTF-8 path"), &[] as &[&str]);
    output
        .lines()
        .map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next().expect("a name").to_owned();
            let values = words
                .map(|w| w.parse().unwrap_or_else(|_| panic!("{line:?}")))
                .collect();
            (name, values)
        })
        .collect()
}

#[test]
fn pointer_attribute_and_constants_match_the_installed_rocm5_header() {
    let facts = installed_header_facts();
    let fact = |name: &str| -> &[usize] {
        facts
            .get(name)
            .unwrap_or_else(|| panic!("{name} not printed: {facts:?}"))
    };
    assert_eq!(fact("HIP_VERSION_MAJOR"), [5], "not the ROCm 5 header");

    assert_eq!(fact("sizeof"), [size_of::<HipPointerAttribute>()]);
    assert_eq!(fact("alignof"), [align_of::<HipPointerAttribute>()]);
    let fields = [
        (
            "memoryType",
            offset_of!(HipPointerAttribute, memory_type),
            4,
        ),
        ("device", offset_of!(HipPointerAttribute, device), 4),
        (
            "devicePointer",
            offset_of!(HipPointerAttribute, device_pointer),
            8,
        ),
        (
            "hostPointer",
            offset_of!(HipPointerAttribute, host_pointer),
            8,
        ),
        ("isManaged", offset_of!(HipPointerAttribute, is_managed), 4),
        (
            "allocationFlags",
            offset_of!(HipPointerAttribute, allocation_flags),
            4,
        ),
    ];
    for (name, offset, size) in fields {
        assert_eq!(fact(name), [offset, size], "{name}: offset and size");
    }

    // The ROCm 5 numbering of hipMemoryType, as PointerAbi::Rocm5 reads it.
    let kind = |value: usize| {
        let attr = HipPointerAttribute {
            memory_type: i32::try_from(value).expect("small"),
            device: 3,
            ..HipPointerAttribute::zeroed()
        };
        PointerAbi::Rocm5.kind(&attr)
    };
    let device = PointerKind::Device { device: 3 };
    assert_eq!(kind(fact("hipMemoryTypeHost")[0]), PointerKind::PinnedHost);
    assert_eq!(kind(fact("hipMemoryTypeDevice")[0]), device);
    assert_eq!(kind(fact("hipMemoryTypeArray")[0]), device);
    assert_eq!(kind(fact("hipMemoryTypeUnified")[0]), device);

    // The enums are int-sized, and the constants are the header's.
    assert_eq!(fact("sizeof_hipMemoryType"), [4]);
    assert_eq!(fact("sizeof_hipError_t"), [4]);
    let constants = [
        ("hipErrorInvalidValue", sys::HIP_ERROR_INVALID_VALUE),
        ("hipErrorOutOfMemory", sys::HIP_ERROR_OUT_OF_MEMORY),
        ("hipErrorNotReady", sys::HIP_ERROR_NOT_READY),
        ("hipMemcpyDefault", sys::HIP_MEMCPY_DEFAULT),
        (
            "hipEventDisableTiming",
            i32::try_from(sys::HIP_EVENT_DISABLE_TIMING).expect("small"),
        ),
        (
            "hipHostMallocDefault",
            i32::try_from(sys::HIP_HOST_MALLOC_DEFAULT).expect("small"),
        ),
    ];
    for (name, value) in constants {
        let value = usize::try_from(value).expect("non-negative");
        assert_eq!(fact(name), [value], "{name}");
    }
    assert_eq!(
        fact("hipStreamPerThread"),
        [sys::HIP_STREAM_PER_THREAD.addr()]
    );
}
