//! The Platform seam: the library's only route to the outside world.
//!
//! `core` sees the machine only through these traits, and receives the
//! implementation by injection (`Current::init_with`): the production one
//! from `system()`, the fakes of `crate::testing` in tests. Trait methods
//! speak domain types (this module and [`crate::platform::types`]), so `core` needs no
//! `unsafe`.
//!
//! Ownership follows libibverbs: every object is handed out as an `Arc`, and
//! an implementation keeps each child's parent alive (an MR holds its PD, a
//! PD its context), so whatever order the `Arc`s are dropped in, a child is
//! destroyed before its parent. Dropping the last `Arc` destroys the object;
//! a destroy that fails is logged, counted and leaked, never a panic.

pub mod cm;
pub mod dl;
pub mod gpu;
pub mod system;
pub mod topology;
pub mod types;
pub mod verbs;
mod waker;

use std::any::Any;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;

pub use system::system;
pub use types::*;
pub use waker::{wait_readable, Waker};

/// The outside world, as one injectable bundle. Each getter loads what it
/// needs on first use and reports, as an error, a library that is missing.
pub trait Platform: Send + Sync {
    /// libibverbs, or `Error::Rdma` naming what could not be loaded.
    fn verbs(&self) -> Result<Arc<dyn Verbs>>;
    /// librdmacm, or `Error::Rdma` naming what could not be loaded.
    fn cm(&self) -> Result<Arc<dyn Cm>>;
    /// The GPU runtime `runtime` names (for [`GpuRuntime::Auto`], the one
    /// that owns the GPU), or `Error::HipMissing` (reported with
    /// `hipErrorNoDevice`) when the runtime library itself is missing.
    fn gpu(&self, runtime: GpuRuntime) -> Result<Arc<dyn Gpu>>;
    /// The NIC and PCI topology.
    fn topology(&self) -> Result<Arc<dyn Topology>>;
}

// ---------------------------------------------------------------- verbs

/// RDMA verbs (libibverbs).
pub trait Verbs: Send + Sync {
    /// Names of the RDMA devices present (`ibv_get_device_list`), in the
    /// order libibverbs lists them. No kernel support counts as no device.
    fn device_names(&self) -> Result<Vec<String>>;
    /// Opens the named device (`ibv_open_device`).
    fn open(&self, name: &str) -> Result<Arc<dyn Context>>;
}

/// An open device (`ibv_context`).
pub trait Context: Send + Sync {
    /// The device's name.
    fn name(&self) -> &str;
    /// The PCI vendor id (`ibv_query_device`'s `vendor_id`).
    fn vendor_id(&self) -> u32;
    /// `ibv_query_port`.
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// `ibv_query_gid`: entry `index` of the port's GID table.
    fn query_gid(&self, port: u8, index: u16) -> Result<Gid>;
    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<Arc<dyn Pd>>;
    /// `ibv_create_comp_channel` + `ibv_create_cq` with `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>>;
    /// Whether `ibv_reg_dmabuf_mr` is available.
    fn supports_dmabuf(&self) -> bool;
    /// Whether type-2 memory windows can be allocated on this device
    /// (`IBV_DEVICE_MEM_WINDOW_TYPE_2A` or `_2B`, and `max_mw` > 0).
    fn supports_mw(&self) -> bool;
    /// The device's limits (`ibv_query_device`), by which the library
    /// sizes its queues.
    fn limits(&self) -> DeviceLimits;
    /// The device's asynchronous event descriptor (`ibv_context.async_fd`,
    /// non-blocking): readable when [`Context::next_async_event`] may have
    /// an event.
    fn async_fd(&self) -> BorrowedFd<'_>;
    /// `ibv_get_async_event`, then `ibv_ack_async_event`, without waiting:
    /// `None` when no event is pending.
    fn next_async_event(&self) -> Result<Option<AsyncEvent>>;
    /// For downcasting by the implementation that created this object.
    fn as_any(&self) -> &dyn Any;
}

/// A protection domain (`ibv_pd`).
pub trait Pd: Send + Sync {
    /// `ibv_reg_mr` over `len` bytes of this process's memory at `addr`.
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Arc<dyn Mr>>;
    /// `ibv_reg_dmabuf_mr`: `len` bytes of the dma-buf from `offset`, to be
    /// addressed by the NIC at `iova`. The fd may be closed when this
    /// returns: the registration holds its own reference.
    fn reg_dmabuf_mr(
        &self,
        dmabuf: &OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<dyn Mr>>;
    /// `ibv_create_qp` (RC) on `cq` for both queues, in RESET.
    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps) -> Result<Arc<dyn Qp>>;
    /// `ibv_alloc_mw` of type 2.
    fn alloc_mw(&self) -> Result<Arc<dyn Mw>>;
    /// For downcasting by the implementation that created this object.
    fn as_any(&self) -> &dyn Any;
}

/// A memory region (`ibv_mr`). Never empty, so no `is_empty`.
#[allow(clippy::len_without_is_empty)]
pub trait Mr: Send + Sync {
    /// Local key, for scatter/gather entries.
    fn lkey(&self) -> u32;
    /// Remote key, for peers.
    fn rkey(&self) -> u32;
    /// First address the NIC knows the region by (the iova for dma-bufs).
    fn addr(&self) -> u64;
    /// Bytes.
    fn len(&self) -> usize;
    /// Keeps `memory` (what the region covers, owned elsewhere too) alive
    /// until the region is deregistered; when deregistration fails, the
    /// NIC may still reach the region, and `memory` is leaked with it
    /// rather than freed under the NIC.
    fn keep_until_deregistered(&self, memory: Box<dyn Any + Send + Sync>);
    /// For downcasting by the implementation that created this object.
    fn as_any(&self) -> &dyn Any;
}

/// A type-2 memory window (`ibv_mw`), bound and invalidated through work
/// requests on a QP ([`SendOp::BindMw`], [`SendOp::LocalInv`]).
pub trait Mw: Send + Sync {
    /// The rkey the window was allocated with; a bind uses
    /// [`next_rkey`] of the last rkey used.
    fn rkey(&self) -> u32;
    /// For downcasting by the implementation that created this object.
    fn as_any(&self) -> &dyn Any;
}

/// The rkey a type-2 window gets at its next bind: the low 8 bits (the
/// consumer key) incremented, as `ibv_inc_rkey` does.
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | ((rkey.wrapping_add(1)) & 0xff)
}

/// How long [`wait_for_completion`] polls before it sleeps on the
/// completion channel: the short busy poll before the channel. A local
/// operation (a window bind or invalidate) completes within microseconds on
/// hardware, and within about 35 to 60 µs on the emulated Soft-RoCE lane,
/// where one of five benchmark runs saw the channel cost 80 µs more than
/// polling and four saw no difference (`docs/performance.md`).
pub const SPIN: Duration = Duration::from_micros(100);

/// The pause between two looks of a thread that polls: a few dozen spin
/// hints, well under a microsecond, so that what it polls for is seen soon
/// after it arrives, while the looks (each a poll of a CQ, a lock on the fake
/// fabric, a read of a cache line another core writes) do not crowd out the
/// thread that makes it arrive.
pub fn pause() {
    for _ in 0..8 {
        std::hint::spin_loop();
    }
}

/// Waits on `cq` until the completion of work request `wr_id` arrives, or
/// `deadline` passes (`None`): it polls for up to [`SPIN`], then sleeps on
/// the completion channel between polls. Completions of other work requests
/// are dropped on the way (they belong to operations already given up on).
pub fn wait_for_completion(
    cq: &dyn Cq,
    wr_id: u64,
    deadline: Instant,
) -> Result<Option<Completion>> {
    let spin_until = Instant::now() + SPIN;
    loop {
        if let Some(c) = cq.poll(16)?.into_iter().find(|c| c.wr_id == wr_id) {
            return Ok(Some(c));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        if now < spin_until {
            pause();
            continue;
        }
        if !cq.wait(deadline)? {
            return Ok(None);
        }
    }
}

/// A completion queue with its completion channel.
pub trait Cq: Send + Sync {
    /// `ibv_poll_cq`: up to `max` completions, without waiting.
    fn poll(&self, max: usize) -> Result<Vec<Completion>>;
    /// Waits until the queue may hold a completion or `deadline` passes:
    /// `ibv_req_notify_cq`, then the channel's fd with `poll(2)`, then
    /// `ibv_get_cq_event` and its ack. Returns `false` at the deadline. A
    /// `true` is a hint: poll to see what arrived. Never sleeps a fixed time.
    /// For a CQ with one reader only: [`Cq::arm`], [`Cq::channel_fd`] and
    /// [`Cq::take_events`] are the parts of it for a reader that waits for
    /// several things at once.
    fn wait(&self, deadline: Instant) -> Result<bool>;
    /// `ibv_req_notify_cq`: the next completion added makes the channel
    /// readable. A completion that arrived before the call makes nothing
    /// readable, so a reader polls once more after arming.
    fn arm(&self) -> Result<()>;
    /// The completion channel's descriptor (non-blocking): readable when an
    /// event is waiting for [`Cq::take_events`].
    fn channel_fd(&self) -> BorrowedFd<'_>;
    /// Reads and acknowledges the event waiting on the channel (an armed
    /// CQ raises one), without blocking; returns how many were read (the
    /// production CQ reads one per call: a channel still readable has
    /// another). The CQ must be armed again for the next one.
    fn take_events(&self) -> Result<usize>;
    /// For downcasting by the implementation that created this object.
    fn as_any(&self) -> &dyn Any;
}

/// A Reliable Connection queue pair.
pub trait Qp: Send + Sync {
    /// The QP number.
    fn qp_num(&self) -> u32;
    /// `ibv_query_qp`'s state.
    fn state(&self) -> Result<QpState>;
    /// `ibv_modify_qp` with the attributes that are `Some` (the mask). An
    /// error names the transition and the mask bits.
    fn modify(&self, attr: &QpAttr) -> Result<()>;
    /// `ibv_post_recv` of one receive.
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    /// `ibv_post_send` of one chain of work requests, in order.
    fn post_send(&self, wrs: &[SendWr]) -> Result<()>;
    /// For downcasting by the implementation that created this object.
    fn as_any(&self) -> &dyn Any;
}

// ---------------------------------------------------------------- RDMA CM

/// The RDMA connection manager (librdmacm).
pub trait Cm: Send + Sync {
    /// Listens on `addr` (port 0: an ephemeral one) for RC connections
    /// (`rdma_create_event_channel`, `rdma_create_id(RDMA_PS_TCP)`,
    /// `rdma_bind_addr`, `rdma_listen`).
    fn listen(&self, addr: std::net::SocketAddr) -> Result<Arc<dyn CmListener>>;
    /// The active side, used by servers: resolves `addr`, creates an RC QP on
    /// the resolved device in `pd`'s context with `cq`, and connects with
    /// `private_data` (`rdma_resolve_addr`, `rdma_resolve_route`,
    /// `rdma_create_qp`, `rdma_connect`), waiting for the outcome until
    /// `deadline`.
    fn connect(&self, request: ConnectRequest<'_>) -> Result<ConnectOutcome>;
}

/// What [`Cm::connect`] needs.
pub struct ConnectRequest<'a> {
    /// The listener's address.
    pub addr: std::net::SocketAddr,
    /// Protection domain for the QP; its device must be the one the
    /// address resolves to.
    pub pd: &'a Arc<dyn Pd>,
    /// Completion queue of both queues of the new QP.
    pub cq: &'a Arc<dyn Cq>,
    /// Capacities of the new QP.
    pub caps: QpCaps,
    /// Private data of the REQ (at most [`CM_REQ_PRIVATE_DATA_MAX`] bytes).
    pub private_data: &'a [u8],
    /// `conn_param`: READs this side may have outstanding.
    pub initiator_depth: u8,
    /// `conn_param`: READs this side accepts outstanding.
    pub responder_resources: u8,
    /// `conn_param.retry_count`, 0..=7.
    pub retry_count: u8,
    /// `conn_param.rnr_retry_count`, 0..=7 (7: forever).
    pub rnr_retry_count: u8,
    /// When to give up waiting for ESTABLISHED or REJECTED.
    pub deadline: Instant,
}

/// Most private data a REQ carries on `RDMA_PS_TCP`.
pub const CM_REQ_PRIVATE_DATA_MAX: usize = 56;
/// Most private data a REP or REJ carries.
pub const CM_REP_PRIVATE_DATA_MAX: usize = 196;

/// How [`Cm::connect`] ended.
pub enum ConnectOutcome {
    /// ESTABLISHED: the connection, its QP in RTS.
    Established(Arc<dyn CmConnection>),
    /// REJECTED by the peer, with its private data (padded, as received).
    Rejected {
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
}

/// A listening id and its event channel.
pub trait CmListener: Send + Sync {
    /// The bound port.
    fn port(&self) -> u16;
    /// The next event, waiting until `deadline`; `None` at the deadline or
    /// after [`CmListener::wake`].
    fn next_event(&self, deadline: Instant) -> Result<Option<CmEvent>>;
    /// Makes a `next_event` in progress (or the next one) return `None`
    /// at once; used to stop the listener thread.
    fn wake(&self);
    /// The event channel's descriptor (non-blocking): readable when an
    /// event may be waiting. `next_event` with a deadline already past
    /// reads what is there without waiting.
    fn event_fd(&self) -> BorrowedFd<'_>;
}

/// An event on a listener's channel (already acknowledged: anything needed
/// was copied out).
pub enum CmEvent {
    /// A peer wants to connect.
    ConnectRequest(Box<dyn CmRequest>),
    /// A connection accepted on this listener is established.
    Established {
        /// [`CmConnection::id`] of the accepted connection.
        conn: u64,
    },
    /// A connection accepted on this listener was disconnected (by either
    /// side), or failed to establish.
    Disconnected {
        /// [`CmConnection::id`] of the connection.
        conn: u64,
    },
}

/// A pending CONNECT_REQUEST on the passive side.
pub trait CmRequest: Send {
    /// The REQ's private data as received: padded by the CM, so longer than
    /// what was sent.
    fn private_data(&self) -> &[u8];
    /// The event's `responder_resources` (already from this side's view).
    fn responder_resources(&self) -> u8;
    /// The event's `initiator_depth` (already from this side's view).
    fn initiator_depth(&self) -> u8;
    /// `rdma_init_qp_attr` on the new id, for the transition to `state`
    /// (RTR or RTS): every connection attribute, as the CM chose it.
    fn init_qp_attr(&self, state: QpState) -> Result<QpAttr>;
    /// `rdma_accept` with `qp_num` as the QP, which the caller has already
    /// moved to RTS.
    fn accept(self: Box<Self>, params: AcceptParams) -> Result<Arc<dyn CmConnection>>;
    /// `rdma_reject` with `private_data`, then `rdma_destroy_id`.
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<()>;
}

/// `rdma_accept`'s parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// The existing QP that serves the connection.
    pub qp_num: u32,
    /// Pass the request's value unchanged.
    pub responder_resources: u8,
    /// Pass the request's value unchanged.
    pub initiator_depth: u8,
    /// Becomes the peer's `rnr_retry`: 7 (forever).
    pub rnr_retry_count: u8,
    /// The REP's private data (at most [`CM_REP_PRIVATE_DATA_MAX`] bytes;
    /// empty: none).
    pub private_data: Vec<u8>,
}

/// An established (or establishing) connection's id.
pub trait CmConnection: Send + Sync {
    /// An id unique among this CM's connections, named by events.
    fn id(&self) -> u64;
    /// The QP the active side created (`None` on the passive side, which
    /// brought its own).
    fn qp(&self) -> Option<Arc<dyn Qp>>;
    /// `rdma_disconnect`: sends a DREQ (or the DREP to one received).
    /// Idempotent. On the active side this also moves its QP to ERR.
    fn disconnect(&self) -> Result<()>;
    /// Whether a DISCONNECTED event has been seen for this connection
    /// (active side: on its own channel).
    fn is_disconnected(&self) -> bool;
    /// The active side: the private data of the REP that established the
    /// connection, as it arrived (padded by the CM); empty on the passive
    /// side.
    fn reply_data(&self) -> &[u8] {
        &[]
    }
}

// ---------------------------------------------------------------- GPU

/// Which runtime serves the GPU (`HIPOBJ_GPU_RUNTIME`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuRuntime {
    /// HIP when it sees a GPU, else CUDA when it does, else whichever of
    /// them loads (HIP first).
    #[default]
    Auto,
    /// The HIP runtime (`libamdhip64`), for AMD GPUs.
    Hip,
    /// The CUDA driver (`libcuda.so.1`), for NVIDIA GPUs.
    Cuda,
}

/// HIP's result: the value, or a `hipError_t` (for the CUDA driver, its
/// `CUresult`, numbered as HIP numbers the same errors).
pub type HipResult<T> = std::result::Result<T, i32>;

/// The GPU runtime (HIP, and HSA for dma-buf export).
pub trait Gpu: Send + Sync {
    /// `hipGetDeviceCount`.
    fn device_count(&self) -> HipResult<i32>;
    /// `hipGetDevice`: the calling thread's current device.
    fn current_device(&self) -> HipResult<i32>;
    /// `hipDeviceGetPCIBusId`, e.g. `0000:c1:00.0`.
    fn pci_bus_id(&self, device: i32) -> HipResult<String>;
    /// `hipPointerGetAttributes`: what memory `addr` is.
    fn pointer_kind(&self, addr: usize) -> HipResult<PointerKind>;
    /// `hipMemGetAddressRange`: the allocation containing `addr`.
    fn allocation_range(&self, addr: usize) -> HipResult<(usize, usize)>;
    /// `hipHostMalloc` of `len` bytes of pinned host memory.
    fn host_alloc(&self, len: usize) -> HipResult<Arc<dyn HostBuffer>>;
    /// `hipMemcpyAsync` of `len` bytes on the per-thread default stream,
    /// then `hipEventRecord` of a new event after it.
    fn copy_async(&self, dst: usize, src: usize, len: usize) -> HipResult<Arc<dyn GpuEvent>>;
    /// `hipDeviceSynchronize` on `device`.
    fn synchronize(&self, device: i32) -> HipResult<()>;
    /// `hsa_amd_portable_export_dmabuf`: a dma-buf for `len` bytes at
    /// `addr` and the offset of `addr` inside it; `None` when the runtime
    /// has no such export.
    fn export_dmabuf(&self, addr: usize, len: usize) -> Option<HipResult<(OwnedFd, u64)>>;
    /// `hipMalloc` of `len` bytes of `device`'s memory, freed when the
    /// last `Arc` drops. The library never allocates device memory for a C
    /// program; the Rust API and the command do, for buffers of their own.
    fn device_alloc(&self, device: i32, len: usize) -> HipResult<Arc<dyn DeviceBuffer>>;
    /// Which runtime this is, where it was loaded from, and its version.
    fn runtime(&self) -> HipResult<RuntimeInfo>;
    /// The runtime's own name of the function behind `call`, for messages
    /// (HIP's unless the runtime says otherwise).
    fn call_name(&self, call: GpuCall) -> &'static str {
        call.hip_name()
    }
}

/// The [`Gpu`] calls whose failures the library reports by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuCall {
    /// [`Gpu::device_count`]
    DeviceCount,
    /// [`Gpu::current_device`]
    CurrentDevice,
    /// [`Gpu::pci_bus_id`]
    PciBusId,
    /// [`Gpu::allocation_range`]
    AllocationRange,
    /// [`Gpu::host_alloc`]
    HostAlloc,
    /// [`Gpu::export_dmabuf`]
    ExportDmabuf,
    /// [`Gpu::synchronize`]
    Synchronize,
    /// [`Gpu::device_alloc`]
    DeviceAlloc,
    /// [`Gpu::runtime`]
    Version,
}

impl GpuCall {
    /// The HIP (and HSA) function.
    pub fn hip_name(self) -> &'static str {
        match self {
            GpuCall::DeviceCount => "hipGetDeviceCount",
            GpuCall::CurrentDevice => "hipGetDevice",
            GpuCall::PciBusId => "hipDeviceGetPCIBusId",
            GpuCall::AllocationRange => "hipMemGetAddressRange",
            GpuCall::HostAlloc => "hipHostMalloc",
            GpuCall::ExportDmabuf => "hsa_amd_portable_export_dmabuf",
            GpuCall::Synchronize => "hipDeviceSynchronize",
            GpuCall::DeviceAlloc => "hipMalloc",
            GpuCall::Version => "hipRuntimeGetVersion",
        }
    }

    /// The CUDA driver function.
    pub fn cuda_name(self) -> &'static str {
        match self {
            GpuCall::DeviceCount => "cuDeviceGetCount",
            GpuCall::CurrentDevice => "cuCtxGetDevice",
            GpuCall::PciBusId => "cuDeviceGetPCIBusId",
            GpuCall::AllocationRange => "cuMemGetAddressRange",
            GpuCall::HostAlloc => "cuMemHostAlloc",
            GpuCall::ExportDmabuf => "cuMemGetHandleForAddressRange",
            GpuCall::Synchronize => "cuCtxSynchronize",
            GpuCall::DeviceAlloc => "cuMemAlloc",
            GpuCall::Version => "cuDriverGetVersion",
        }
    }
}

/// Pinned host memory from [`Gpu::host_alloc`], freed on drop unless leaked.
/// Never empty, so no `is_empty`.
#[allow(clippy::len_without_is_empty)]
pub trait HostBuffer: Send + Sync {
    /// First byte.
    fn addr(&self) -> usize;
    /// Bytes.
    fn len(&self) -> usize;
    /// Gives the memory up without freeing it: a copy may still write it.
    fn leak(&self);
    /// Copies `data` into the buffer from `offset`; `false`, copying
    /// nothing, when that would pass its end. For a caller that orders this
    /// against the GPU's copies of the same bytes (it waited for them).
    fn write(&self, offset: usize, data: &[u8]) -> bool;
    /// Copies `out.len()` bytes from `offset` into `out`; `false`, copying
    /// nothing, when that would pass its end. Ordered as [`HostBuffer::write`].
    fn read(&self, offset: usize, out: &mut [u8]) -> bool;
}

/// Device memory from [`Gpu::device_alloc`], freed on drop (a failed free
/// is logged and leaked). Never empty, so no `is_empty`.
#[allow(clippy::len_without_is_empty)]
pub trait DeviceBuffer: Send + Sync {
    /// First byte (a device address, which the host cannot dereference).
    fn addr(&self) -> usize;
    /// Bytes.
    fn len(&self) -> usize;
    /// The device it belongs to.
    fn device(&self) -> i32;
}

/// What a GPU runtime says of itself ([`Gpu::runtime`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// `HIP` or `CUDA` (the fakes say `fake`).
    pub name: &'static str,
    /// The library it was loaded from (its soname).
    pub library: &'static str,
    /// The version as the runtime encodes it: `hipRuntimeGetVersion`
    /// (`HIP_VERSION`: `major * 10000000 + minor * 100000 + patch`,
    /// `<hip/hip_version.h>`) or `cuDriverGetVersion` (`major * 1000 +
    /// minor * 10`, `<cuda.h>`).
    pub version: i32,
}

impl RuntimeInfo {
    /// The version decoded the runtime's way: `5.2.21153`, `13.0`.
    pub fn version_text(&self) -> String {
        let v = self.version;
        match self.name {
            "CUDA" => format!("{}.{}", v / 1000, (v % 1000) / 10),
            "HIP" => format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000),
            _ => v.to_string(),
        }
    }
}

/// A recorded event after an async copy.
pub trait GpuEvent: Send + Sync {
    /// Waits until the copy finished or `deadline` passed; `Ok(false)` at the
    /// deadline. HIP cannot wait on an event with a timeout, so the real one
    /// polls `hipEventQuery` with a short backoff.
    fn wait(&self, deadline: Instant) -> HipResult<bool>;
    /// Gives the event up without destroying it: its copy may still run.
    fn leak(&self);
}

// ---------------------------------------------------------------- topology

/// What is known about the machine's NICs and PCI tree.
pub trait Topology: Send + Sync {
    /// Every RDMA device, with its ports and GIDs.
    fn nics(&self) -> Result<Vec<NicInfo>>;
    /// The chain of PCI addresses from the root port down to the device
    /// `bus_id` (lowercase `dddd:bb:dd.f`), the device last; `None` if the
    /// device is unknown.
    fn pci_path(&self, bus_id: &str) -> Option<Vec<String>>;
    /// The NUMA node of PCI device `bus_id`, if known.
    fn numa_node(&self, bus_id: &str) -> Option<i32>;
}
