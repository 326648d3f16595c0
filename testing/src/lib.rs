//! Fakes of every platform trait of hipobj, for tests: the crate
//! `hipobj-testing`, beside the library and never in it (a dev-dependency
//! of the library's tests and of applications' own; the library's unit
//! tests compile this source as a module, `docs/architecture.md`, "Fakes").
//! One concern: the fake fabric holds its CM hub, the CM reaches the
//! fabric's devices, the world holds both.
//!
//! The fakes are stricter than hardware where hardware is lenient by
//! accident, and as strict as hardware everywhere else: a test that passes
//! here should pass on real RC queue pairs.
//!
//! - [`fabric`]: an in-memory RC fabric of devices, QPs, MRs, MWs and CQs,
//!   addressed by (GID, QP number), with the IB state machine, PSNs, rkey,
//!   bounds and access checks, RNR and retry semantics.
//! - [`cm`]: an RDMA CM over that fabric.
//! - [`gpu`]: a GPU whose device memory is host memory, with copies and
//!   events the test completes.
//! - [`topology`]: a NIC/PCI topology given by the test.
//! - [`faults`]: fault injection (fail the Nth call of any function) and
//!   live-object counters.

pub mod c_world;
pub mod cm;
pub mod contract;
pub mod cuda_lab;
pub mod fabric;
pub mod faults;
pub mod gpu;
pub mod real_gpu;
pub mod topology;
pub mod world;

mod memory;

use std::os::fd::OwnedFd;

pub use faults::{Counters, Faults};

/// What the fabric needs to know about fake device memory, so that plain
/// registration of device memory fails as it does on real NICs and dma-buf
/// registration checks its fd. Implemented by the fake GPU.
pub trait DeviceMemory: Send + Sync {
    /// Whether any byte of `[addr, addr + len)` is fake device memory.
    fn is_device_memory(&self, addr: usize, len: usize) -> bool;
    /// The range `(addr, len)` of device memory that `fd`, a dma-buf from
    /// the fake GPU's export, stands for; `None` for any other fd.
    fn dmabuf_range(&self, fd: &OwnedFd) -> Option<(usize, usize)>;
    /// Whether the host can read and write the device memory itself (the
    /// fake GPU's is host memory). When it cannot (a real GPU's), the bytes
    /// of a dma-buf registration move through [`DeviceMemory::copy`].
    fn host_accessible(&self) -> bool {
        true
    }
    /// Copies `len` bytes from `src` to `dst`, either of them device
    /// memory, through the GPU runtime, and returns once they are there;
    /// `false` if the runtime refused.
    fn copy(&self, _dst: usize, _src: usize, _len: usize) -> bool {
        false
    }
}
