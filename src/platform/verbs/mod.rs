//! libibverbs, opened with `dlopen`.

pub mod loader;

pub use loader::LoadedVerbs;
