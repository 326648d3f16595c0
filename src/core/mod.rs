//! The library's logic in safe Rust: errors and codes, settings, the
//! argument rules, the token and reply codecs, and the current instance.
//! It reaches the machine only through [`crate::platform`].

#![forbid(unsafe_code)]

pub mod abandoned;
pub mod args;
pub mod buffers;
pub mod connections;
pub mod instance;
pub mod keys;
pub mod mailbox;
pub mod nic;
pub mod options;
pub mod polling;
pub mod protocol;
pub mod reply;
pub mod stats;
pub mod sync;
pub mod token;
pub mod tokens;
pub mod transfer;

pub use crate::error::{self, Code, Error, Result};
pub use crate::log;
pub use instance::{Config, Current, Instance, CURRENT};
pub use options::Options;
