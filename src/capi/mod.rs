//! The C ABI of `hipobj.h`: the only `#[no_mangle]` code in the library.
//!
//! Each export is one call to `boundary::enter`; the files follow the
//! header's sections. Raw pointers are turned into Rust values here, and
//! nothing below this module calls an export. The fake library
//! (`hipobj-fake`) links this module and adds the controls of
//! `hipobj_fake.h`, which are not part of the ABI.

#![allow(non_snake_case)]

mod args;
mod boundary;
pub mod buffers;
pub mod lifecycle;
pub mod tokens;
pub mod transfer;
pub mod types;
pub mod version;

pub use buffers::*;
pub use lifecycle::*;
pub use tokens::*;
pub use transfer::*;
pub use types::*;
pub use version::*;
