//! The HIP runtime (and HSA's dma-buf export), opened with `dlopen`.
//!
//! - [`sys`]: the C types, constants and prototypes, from ROCm's headers.
//! - [`loader`]: the library tables and [`LoadedHip`], the production
//!   [`crate::platform::Gpu`].
//! - `owners`: pinned host buffers and events, freed on drop.

pub mod loader;
mod owners;
pub mod sys;

pub use loader::LoadedHip;
pub use owners::release_failures;
