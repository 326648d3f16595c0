//! hipobj: a drop-in replacement for `libhipobj.so`, the client library that
//! moves S3 object data between an S3 server and GPU or host memory by RDMA.
//!
//! # Layers
//!
//! ```text
//!            C application (hipobj.h)
//!                 |            ^ hipObjOps_t callbacks
//!                 v            |
//!   capi      exports: argument conversion, the panic boundary
//!                 |
//!   core      Current/Instance, Options, argument rules, token and
//!             reply codecs (no unsafe)
//!                 |
//!   platform  traits Platform, Verbs, Gpu; production implementations
//!             over dlopen'd libibverbs and libamdhip64
//! ```
//!
//! Calls go down the diagram or across a row, never up: nothing below `capi`
//! calls an exported function, and only `platform` touches vendor libraries.
//! `docs/architecture.md` describes each layer as built.

#[cfg(feature = "capi")]
pub mod capi;
pub mod client;
pub mod core;
#[cfg(feature = "cli")]
pub mod doctor;
pub mod error;
#[cfg(feature = "s3-server")]
pub mod gateway;
pub mod log;
pub mod platform;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "server")]
pub mod server;

// The fakes (testing/, the crate hipobj-testing) in this crate's own unit
// tests. A unit test is compiled into a second build of this crate, whose
// traits are not those of the hipobj that hipobj-testing implements them
// for, so the fakes' source is compiled into that build as a module; it
// names this crate `hipobj`, as it does in its own crate. Nothing of it is
// in a build that is not this crate's unit tests.
#[cfg(test)]
extern crate self as hipobj;
// The unit tests use only some of the fakes.
#[cfg(test)]
#[path = "../testing/src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod testing;
