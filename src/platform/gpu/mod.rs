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
