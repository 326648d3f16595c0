//! The library's logic in safe Rust: errors and codes, settings, the
//! argument rules, the token and reply codecs, and the current instance.
//! It reaches the machine only through [`crate::platform`].

#![forbid(unsafe_code)]

pub mod args;
pub mod error;
pub mod instance;
pub mod options;
pub mod protocol;
pub mod reply;
pub mod token;

pub use error::{Code, Error, Result};
pub use instance::{Config, Current, Instance, CURRENT};
pub use options::Options;
