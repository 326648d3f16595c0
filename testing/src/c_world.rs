//! The fake world of C programs: what the controls of `hipobj_fake.h`
//! (exported by the fake library, `hipobj-fake`) do.
//!
//! One process-wide [`World`] serves `hipObjInit` in the fake library
//! applications link their tests against (which hands [`platform`] to
//! the C API when it is loaded), and the model streamer's backend in its
//! test build (`hipobj-streamers3`, feature `fake-world`, when
//! `HIPOBJ_TEST_WORLD=1`). The world is an RDMA S3 server
//! of the fake fabric, in process, with an object store of
//! [`STORE_BYTES`]; the application's S3 client is replaced by
//! [`send_request`] and [`recv_reply`], which hand the token to that
//! server at once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::gpu::DeviceAlloc;
use super::world::{Behaviour, World, WorldSpec};
use hipobj::platform::Platform;
use hipobj::server::Op;

/// Bytes of the fake server's object store.
pub const STORE_BYTES: usize = 16 << 20;

/// The functions of the fake platform whose calls can be made to fail
/// ([`fail_call`]): libibverbs, librdmacm and the GPU runtime, by their C
/// names.
pub const FAILABLE: &[&str] = &[
    "ibv_get_device_list",
    "ibv_open_device",
    "ibv_query_port",
    "ibv_query_gid",
    "ibv_alloc_pd",
    "ibv_reg_mr",
    "ibv_reg_dmabuf_mr",
    "ibv_alloc_mw",
    "ibv_create_cq",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_query_qp",
    "ibv_post_send",
    "ibv_post_recv",
    "ibv_poll_cq",
    "ibv_req_notify_cq",
    "ibv_get_cq_event",
    "ibv_get_async_event",
    "rdma_listen",
    "rdma_get_cm_event",
    "rdma_accept",
    "rdma_reject",
    "rdma_disconnect",
    "rdma_init_qp_attr",
    "hipGetDeviceCount",
    "hipGetDevice",
    "hipDeviceGetPCIBusId",
    "hipPointerGetAttributes",
    "hipMemGetAddressRange",
    "hipHostMalloc",
    "hipMemcpyAsync",
    "hipEventRecord",
    "hipEventQuery",
    "hipDeviceSynchronize",
    "hsa_amd_portable_export_dmabuf",
];

/// The process's world, made on first use. With
/// `HIPOBJ_FAKE_REAL_GPU=cuda`, its client GPU is this machine's, through
/// the CUDA driver ([`super::real_gpu`]): the fake fabric moves bytes to
/// and from real device memory, so that a program's GPU tensors take the
/// library's GPU paths on a GPU machine without an RDMA device. Without a
/// driver then, the world keeps its fake GPU and says why on standard
/// error.
fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let world = World::with(WorldSpec {
            server_bytes: STORE_BYTES,
            ..WorldSpec::default()
        });
        if std::env::var("HIPOBJ_FAKE_REAL_GPU").as_deref() == Ok("cuda") {
            use hipobj::platform::gpu::cuda::{LoadedCuda, SONAMES};
            match LoadedCuda::open(SONAMES) {
                Ok(cuda) => {
                    world.use_real_gpu(Arc::new(super::real_gpu::RealGpu::new(Arc::new(cuda))))
                }
                Err(e) => eprintln!("hipobj fake world: HIPOBJ_FAKE_REAL_GPU=cuda, but {e}"),
            }
        }
        world
    })
}

/// The world's platform, made on first use: what `hipObjInit` runs on in
/// the fake library.
pub fn platform() -> Arc<dyn Platform> {
    world().platform()
}

thread_local! {
    static REPLY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The op of `hipObjOps_t`'s `ctx` value: `HIPOBJ_RDMA_OP_PUT` (0) or
/// `HIPOBJ_RDMA_OP_GET` (1).
pub fn op(value: i32) -> Option<Op> {
    match value {
        0 => Some(Op::Put),
        1 => Some(Op::Get),
        _ => None,
    }
}

/// `sendRequest`: the server handles `token` at once; its reply waits for
/// [`recv_reply`] on this thread.
pub fn send_request(op: Op, token: &[u8]) {
    let reply = world().server.handle(token, op);
    REPLY.with(|r| *r.borrow_mut() = reply);
}

/// `recvReply`: this thread's last reply, taken.
pub fn recv_reply() -> Vec<u8> {
    REPLY.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Writes `data` at the start of the object store; `false` if it does not
/// fit.
pub fn set_object(data: &[u8]) -> bool {
    data.len() <= STORE_BYTES && {
        world().server.set_object(data);
        true
    }
}

/// The first `len` bytes of the object store; `None` past its end.
pub fn object(len: usize) -> Option<Vec<u8>> {
    (len <= STORE_BYTES).then(|| world().server.object(len))
}

/// An application-driven token's request: the reply's status, or -1.
pub fn serve(op: Op, token: &[u8]) -> i32 {
    let reply = world().server.handle(token, op);
    std::str::from_utf8(&reply)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1)
}

/// The server's behaviour for later requests, by the number
/// `hipobj_fake.h` gives it; `false` for an unknown one.
pub fn set_behaviour(value: i32) -> bool {
    let behaviour = match value {
        0 => Behaviour::Normal,
        1 => Behaviour::Status(501),
        2 => Behaviour::NoFinalMessage,
        3 => Behaviour::NeverConnect,
        4 => Behaviour::Status(500),
        _ => return false,
    };
    world().server.set_behaviour(behaviour);
    true
}

/// Makes the `nth` (from 1) next call of `function` fail; `false` for a
/// function the fake platform does not know or an `nth` of 0. Calls are
/// counted over the whole world: the in-process server's verbs calls
/// count too.
pub fn fail_call(function: &str, nth: u64) -> bool {
    let Some(name) = FAILABLE.iter().find(|f| **f == function) else {
        return false;
    };
    if nth == 0 {
        return false;
    }
    let faults = &world().platform.faults;
    faults.fail_nth(name, faults.calls(name) + nth);
    true
}

/// Drops every planned failure.
pub fn clear_faults() {
    world().platform.faults.clear();
}

/// Requests the server has handled.
pub fn requests() -> u64 {
    world().server.requests.load(Ordering::SeqCst) as u64
}

/// Live fake objects of `kind` (`mr`, `qp`, `cq`, `pd`, `cm_id`...), the
/// server's own included, once the server has let go of the connections
/// of clients that are gone.
pub fn live(kind: &str) -> i64 {
    let world = world();
    world.server.side().forget_disconnected();
    world.platform.counters.live(kind)
}

/// Fake GPU memory handed out by [`device_alloc`], by address.
fn device_allocs() -> &'static Mutex<HashMap<usize, DeviceAlloc>> {
    static ALLOCS: OnceLock<Mutex<HashMap<usize, DeviceAlloc>>> = OnceLock::new();
    ALLOCS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `len` bytes of the fake GPU's memory (device 0, zeroed): an address
/// `hipObjBufRegister` classifies as device memory, which the host cannot
/// touch but through [`device_write`] and [`device_read`]; `None` for 0
/// bytes or when the fake refuses.
pub fn device_alloc(len: usize) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let alloc = world().platform.gpu.alloc_device(0, len).ok()?;
    let addr = alloc.addr();
    device_allocs().lock().insert(addr, alloc);
    Some(addr)
}

/// Frees memory from [`device_alloc`]; `false` for another address.
pub fn device_free(addr: usize) -> bool {
    device_allocs().lock().remove(&addr).is_some()
}

/// Writes `data` at `addr`, inside one fake GPU allocation.
pub fn device_write(addr: usize, data: &[u8]) -> bool {
    world().platform.gpu.write(addr, data).is_ok()
}

/// The `len` bytes at `addr`, inside one fake GPU allocation.
pub fn device_read(addr: usize, len: usize) -> Option<Vec<u8>> {
    world().platform.gpu.read(addr, len).ok()
}
