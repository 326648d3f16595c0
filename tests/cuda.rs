//! On a machine with an NVIDIA GPU and its driver (`--features
//! cuda-device`; the lane has no GPU, so CI builds this and runs it only
//! where `scripts/gpu/test.sh` runs it): the GPU contract checks against
//! the CUDA driver, and whole transfers of device memory through the
//! library on the fake fabric with the real runtime (`testing::real_gpu`):
//! staged, through a real dma-buf export, and a staging copy that misses
//! its deadline behind real GPU work. Without a driver or a GPU every test
//! fails.

use std::sync::Arc;
use std::time::Duration;

use hipobj::core::args::{BufferRange, Slice, SyncDirection};
use hipobj::core::transfer::Direction;
use hipobj::core::{Code, Config, Current, Instance, Options};
use hipobj::platform::gpu::cuda::{
    LoadedCuda, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, SONAMES,
};
use hipobj::platform::Gpu;
use hipobj::server::Op;
use hipobj_testing::contract::{GpuEnv, GPU_BUSY};
use hipobj_testing::real_gpu::RealGpu;
use hipobj_testing::world::{World, WorldSpec, CLIENT_NIC};

mod contract {
    hipobj_testing::gpu_contract_tests!(hipobj_testing::contract::GpuEnv::cuda);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            i.to_le_bytes()[0].wrapping_mul(13).wrapping_add(seed) ^ (i >> 16).to_le_bytes()[0]
        })
        .collect()
}

/// What the driver says, printed for the record (`docs/gpu.md`).
#[test]
fn the_driver_reports_its_devices_and_what_they_support() {
    let cuda = LoadedCuda::open(SONAMES).expect("the CUDA driver");
    let n = cuda.device_count().expect("a GPU");
    assert!(n >= 1);
    for device in 0..n {
        let bus = cuda.pci_bus_id(device).expect("bus id");
        let dmabuf = cuda
            .device_attribute(device, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
            .expect("DMA_BUF_SUPPORTED");
        let gdr = cuda
            .device_attribute(device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)
            .expect("GPU_DIRECT_RDMA_SUPPORTED");
        println!("cuda device {device}: {bus} dma_buf_supported {dmabuf} gpu_direct_rdma_supported {gdr}");
    }
    println!("cuda dmabuf_export_symbol {}", cuda.has_dmabuf_export());
    let env = GpuEnv::cuda();
    let managed = env.lab.managed_alloc(1 << 20).expect("managed memory");
    println!(
        "cuda managed raw_attributes {:?} kind {:?} export {:?}",
        cuda.raw_attributes(managed.addr()),
        cuda.pointer_kind(managed.addr()),
        cuda.export_dmabuf(managed.addr(), 1 << 20)
            .map(|r| r.map(|(_, o)| o))
    );
    let device = env.lab.device_alloc(0, 1 << 20);
    println!(
        "cuda device raw_attributes {:?}",
        cuda.raw_attributes(device.addr())
    );
}

/// After a GET of device memory the library synchronizes the device, and
/// flushes GPUDirect RDMA writes where the device does not order them
/// itself (below OWNER scope): the decision follows the driver's own
/// attributes, and the call succeeds either way.
#[test]
fn gpudirect_rdma_writes_are_flushed_only_where_the_device_does_not_order_them() {
    let cuda = LoadedCuda::open(SONAMES).expect("the CUDA driver");
    assert!(
        cuda.has_rdma_flush(),
        "CUDA 11.3+ has cuFlushGPUDirectRDMAWrites"
    );
    for device in 0..cuda.device_count().expect("a GPU") {
        let ordering = cuda.device_attribute(device, 118).expect("WRITES_ORDERING");
        let options = cuda
            .device_attribute(device, 117)
            .expect("FLUSH_WRITES_OPTIONS");
        let needed = cuda.needs_flush(device);
        println!(
            "cuda device {device}: gpu_direct_rdma_writes_ordering {ordering} \
             flush_writes_options {options:#x} flush_after_get {needed}"
        );
        assert_eq!(needed, ordering < 100 && options & 1 != 0);
        cuda.synchronize(device).expect("synchronize (and flush)");
    }
}

fn options(dmabuf: bool) -> Options {
    Options {
        completion_timeout: Duration::from_secs(5),
        max_transfers: 4,
        dmabuf,
        ..Options::default()
    }
}

/// A fake world whose client GPU is the real one; its instance, on GPU 0.
struct Setup {
    world: World,
    real: Arc<RealGpu>,
    env: GpuEnv,
    current: Current,
}

/// A fake world whose client GPU is the real one (the CUDA driver's).
fn real_gpu_world() -> (GpuEnv, Arc<RealGpu>, World) {
    let env = GpuEnv::cuda();
    let real = Arc::new(RealGpu::new(env.gpu.clone()));
    let world = World::with(WorldSpec {
        server_bytes: 64 << 20,
        ..WorldSpec::default()
    });
    world.use_real_gpu(real.clone());
    (env, real, world)
}

impl Setup {
    fn new(options: Options) -> Setup {
        let (env, real, world) = real_gpu_world();
        let current = Current::new();
        let config = Config {
            gpu_device: 0,
            nic_hint: vec![CLIENT_NIC.to_owned()],
            ..Config::default()
        };
        current
            .init_with(world.platform(), config, options)
            .expect("init with the real GPU");
        Setup {
            world,
            real,
            env,
            current,
        }
    }

    fn instance(&self) -> Arc<Instance> {
        self.current.instance().expect("an instance")
    }

    fn get(&self, base: usize, len: usize) -> hipobj::core::Result<()> {
        let slice = Slice::new(base, len, 0)?;
        self.instance().transfer(
            Direction::Get,
            slice,
            &mut self.world.server.session(Op::Get),
        )
    }

    fn put(&self, base: usize, len: usize) -> hipobj::core::Result<()> {
        let slice = Slice::new(base, len, 0)?;
        self.instance().transfer(
            Direction::Put,
            slice,
            &mut self.world.server.session(Op::Put),
        )
    }
}

const LEN: usize = 16 << 20;

#[test]
fn staged_get_and_put_of_device_memory_are_byte_exact() {
    let s = Setup::new(options(false));
    let mem = s.env.lab.device_alloc(0, LEN);
    s.instance()
        .register(BufferRange::new(mem.addr(), LEN).unwrap(), false)
        .expect("registration");
    assert_eq!(
        s.world.platform.faults.calls("ibv_reg_dmabuf_mr"),
        0,
        "staged, not dma-buf"
    );
    assert_eq!(s.real.exports(), 0);
    let data = pattern(LEN, 1);
    s.world.server.set_object(&data);
    s.get(mem.addr(), LEN).expect("GET");
    assert!(
        s.env.lab.read(mem.addr(), LEN) == data,
        "the GPU has the object"
    );
    let back = pattern(LEN, 2);
    s.env.lab.write(mem.addr(), &back);
    s.put(mem.addr(), LEN).expect("PUT");
    assert!(
        s.world.server.object(LEN) == back,
        "the server has the GPU's bytes"
    );
    s.instance().deregister(mem.addr()).expect("deregistration");
}

#[test]
fn dmabuf_registration_moves_the_bytes_through_the_real_export() {
    let s = Setup::new(options(true));
    let mem = s.env.lab.device_alloc(0, LEN);
    // Past the allocation's first page, at an address no page starts at.
    let (base, len) = (mem.addr() + 4096 + 512, LEN - 8192);
    s.instance()
        .register(BufferRange::new(base, len).unwrap(), false)
        .expect("registration");
    assert_eq!(s.world.platform.faults.calls("ibv_reg_dmabuf_mr"), 1);
    assert_eq!(s.real.exports(), 1, "the driver exported a dma-buf");
    let data = pattern(len, 3);
    s.world.server.set_object(&data);
    s.get(base, len).expect("GET");
    assert!(s.env.lab.read(base, len) == data, "the GPU has the object");
    let back = pattern(len, 4);
    s.env.lab.write(base, &back);
    s.put(base, len).expect("PUT");
    assert!(
        s.world.server.object(len) == back,
        "the server has the GPU's bytes"
    );
    s.instance().deregister(base).expect("deregistration");
}

#[test]
fn require_gpu_direct_takes_the_dmabuf_path_and_refuses_staging() {
    let direct = Setup::new(Options {
        require_gpu_direct: true,
        ..options(true)
    });
    let mem = direct.env.lab.device_alloc(0, 1 << 20);
    direct
        .instance()
        .register(BufferRange::new(mem.addr(), 1 << 20).unwrap(), false)
        .expect("registration through dma-buf");
    let data = pattern(1 << 20, 5);
    direct.world.server.set_object(&data);
    direct.get(mem.addr(), 1 << 20).expect("GET");
    assert!(direct.env.lab.read(mem.addr(), 1 << 20) == data);

    let refused = Setup::new(Options {
        require_gpu_direct: true,
        ..options(false)
    });
    let mem = refused.env.lab.device_alloc(0, 1 << 20);
    let err = refused
        .instance()
        .register(BufferRange::new(mem.addr(), 1 << 20).unwrap(), false)
        .expect_err("no dma-buf, no staging");
    assert_eq!(err.code(), Code::Rdma);
    assert_eq!(refused.instance().buffer_count(), 0);
}

#[test]
fn a_staging_copy_behind_real_gpu_work_is_abandoned_then_released() {
    let s = Setup::new(Options {
        stage_timeout: Duration::from_millis(50),
        ..options(false)
    });
    let mem = s.env.lab.device_alloc(0, LEN);
    let inst = s.instance();
    inst.register(BufferRange::new(mem.addr(), LEN).unwrap(), false)
        .expect("registration");
    let data = pattern(LEN, 6);
    s.env.lab.write(mem.addr(), &data);
    // The kernel runs on this thread's stream, where the PUT's staging
    // copy to the host queues behind it.
    s.env.lab.occupy(0);
    let err = s
        .put(mem.addr(), LEN)
        .expect_err("the copy misses its deadline");
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert_eq!(inst.abandoned_count(), 1);
    assert_eq!(
        s.world
            .server
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    let slice = Slice::new(mem.addr(), LEN, 0).unwrap();
    assert_eq!(
        inst.buf_sync(slice, SyncDirection::ToHost)
            .unwrap_err()
            .code(),
        Code::Busy,
        "the buffer is held while its copy may run"
    );
    std::thread::sleep(GPU_BUSY + Duration::from_millis(200));
    s.put(mem.addr(), LEN).expect("PUT once the GPU is free");
    assert_eq!(inst.abandoned_count(), 0, "the finished copy was released");
    assert!(s.world.server.object(LEN) == data);
    inst.deregister(mem.addr()).expect("deregistration");
}

/// The S3 side of the Rust API's tests: the world's server, at once.
struct WorldSide<'a> {
    world: &'a World,
    op: Op,
}

impl hipobj::client::S3Side for WorldSide<'_> {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        let reply = self.world.server.handle(token.as_bytes(), self.op);
        String::from_utf8(reply).map_err(|e| e.to_string())
    }
}

#[test]
fn the_rust_api_allocates_fills_and_transfers_real_gpu_memory() {
    use hipobj::client::{Client, GpuSelect, Route};
    use hipobj::core::buffers::BufKind;
    for dmabuf in [true, false] {
        let (_env, _real, world) = real_gpu_world();
        let client = Client::builder()
            .platform(world.platform())
            .gpu(GpuSelect::Device(0))
            .options(options(dmabuf))
            .build()
            .expect("a client on the real GPU");
        // The runtime's own allocation (cuMemAlloc), registered.
        let mut buf = client.device_buffer(LEN).expect("device memory");
        let kind = buf.kind().expect("registered");
        println!("rust api, dmabuf {dmabuf}: {kind:?}");
        let route = if dmabuf {
            assert_eq!(
                kind,
                BufKind::Device {
                    device: 0,
                    dmabuf: true
                }
            );
            Route::Direct
        } else {
            assert_eq!(kind, BufKind::Staged { device: 0 });
            Route::Staged
        };
        // write_at and read_at through pinned memory and the driver's copies.
        let data = pattern(LEN - 4096, 17);
        buf.write_at(4096, &data).expect("write_at");
        let mut back = vec![0u8; data.len()];
        buf.read_at(4096, &mut back).expect("read_at");
        assert!(back == data, "write_at then read_at, dmabuf {dmabuf}");
        // A PUT from GPU memory, then a GET into it.
        let mut put = WorldSide {
            world: &world,
            op: Op::Put,
        };
        assert_eq!(client.put(&buf, 4096..LEN, &mut put).expect("PUT"), route);
        assert!(
            world.server.object(LEN - 4096) == data,
            "the server has the bytes"
        );
        let object = pattern(LEN, 23);
        world.server.set_object(&object);
        let mut get = WorldSide {
            world: &world,
            op: Op::Get,
        };
        assert_eq!(client.get(&mut buf, 0..LEN, &mut get).expect("GET"), route);
        let mut landed = vec![0u8; LEN];
        buf.read_at(0, &mut landed).expect("read_at");
        assert!(
            landed == object,
            "the GET landed in GPU memory, dmabuf {dmabuf}"
        );
        let stats = client.stats().library;
        assert_eq!(stats.direct + stats.staged, 2);
        drop(buf);
        assert_eq!(client.registered_buffers(), 0);
    }
}
