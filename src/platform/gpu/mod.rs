//! The HIP runtime, opened with `dlopen`.

pub mod loader;

pub use loader::LoadedHip;
