//! The GPU runtimes, opened with `dlopen`: HIP (and HSA's dma-buf export)
//! for AMD GPUs, the CUDA driver API for NVIDIA GPUs.
//!
//! - [`sys`]: the C types, constants and prototypes, from ROCm's headers.
//! - [`loader`]: the library tables and [`LoadedHip`], the production
//!   [`crate::platform::Gpu`].
//! - `owners`: pinned host buffers and events, freed on drop.
//! - [`cuda`]: [`LoadedCuda`], the CUDA driver's [`crate::platform::Gpu`],
//!   with its own owners.

pub mod cuda;
pub mod loader;
mod owners;
pub mod sys;

pub use cuda::LoadedCuda;
pub use loader::LoadedHip;
pub use owners::release_failures;

/// Copies `data` into host memory `[addr + offset, ..)`, inside `len`
/// bytes at `addr`; `false` when it would pass the end.
///
/// # Safety
///
/// `[addr, addr + len)` is host memory that stays allocated for the call,
/// and no Rust reference to it exists (the owners only report its address).
pub(crate) unsafe fn host_write(addr: usize, len: usize, offset: usize, data: &[u8]) -> bool {
    if offset.checked_add(data.len()).is_none_or(|end| end > len) {
        return false;
    }
    // SAFETY: inside the allocation (checked above), which the caller
    // keeps alive; `data` is a Rust slice, so it cannot overlap memory no
    // reference points to.
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            std::ptr::with_exposed_provenance_mut::<u8>(addr + offset),
            data.len(),
        );
    }
    true
}

/// Copies `out.len()` bytes from host memory `[addr + offset, ..)` inside
/// `len` bytes at `addr`; `false` when it would pass the end.
///
/// # Safety
///
/// As [`host_write`].
pub(crate) unsafe fn host_read(addr: usize, len: usize, offset: usize, out: &mut [u8]) -> bool {
    if offset.checked_add(out.len()).is_none_or(|end| end > len) {
        return false;
    }
    // SAFETY: as in `host_write`, the other way.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::with_exposed_provenance::<u8>(addr + offset),
            out.as_mut_ptr(),
            out.len(),
        );
    }
    true
}
