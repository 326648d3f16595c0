//! Scenario tests of the core on the fake fabric: whole transfers between an
//! instance and the test server, byte-exact, and every misbehaviour ending
//! in its documented error with the pool whole.

use std::sync::Arc;
use std::time::Duration;

use hipobj::core::args::{BufferRange, Slice, SyncDirection, TokenOp};
use hipobj::core::transfer::Direction;
use hipobj::core::{Code, Config, Current, Instance, Options};
use hipobj::server::Op;
use hipobj_testing::world::{Behaviour, World, CLIENT_NIC, SERVER_NIC};

fn options() -> Options {
    Options {
        completion_timeout: Duration::from_millis(300),
        max_transfers: 4,
        ..Options::default()
    }
}

fn gpu_config() -> Config {
    Config {
        gpu_device: 0,
        ..Config::default()
    }
}

fn hint_config() -> Config {
    Config {
        gpu_device: -1,
        nic_hint: vec![CLIENT_NIC.to_owned()],
        ..Config::default()
    }
}

struct Up {
    world: World,
    current: Current,
}

impl Up {
    fn new(world: World) -> Up {
        let current = Current::new();
        current
            .init_with(world.platform(), gpu_config(), options())
            .expect("init on the fake platform");
        Up { world, current }
    }

    fn instance(&self) -> Arc<Instance> {
        self.current.instance().unwrap()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0]).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn host_buffer(len: usize) -> Box<[u8]> {
    vec![0u8; len].into_boxed_slice()
}

fn get(inst: &Instance, up: &Up, base: usize, len: usize, offset: i64) -> hipobj::core::Result<()> {
    let slice = Slice::new(base, len, offset)?;
    inst.transfer(Direction::Get, slice, &mut up.world.server.session(Op::Get))
}

fn put(inst: &Instance, up: &Up, base: usize, len: usize, offset: i64) -> hipobj::core::Result<()> {
    let slice = Slice::new(base, len, offset)?;
    inst.transfer(Direction::Put, slice, &mut up.world.server.session(Op::Put))
}

#[test]
fn get_into_host_memory_is_byte_exact() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let data = pattern(64 * 1024, 3);
    up.world.server.set_object(&data);
    let buf = host_buffer(64 * 1024);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, buf.len()).unwrap(), true)
        .unwrap();
    get(&inst, &up, base, data.len(), 0).unwrap();
    assert_eq!(&buf[..], &data[..]);
    assert_eq!(
        up.world
            .server
            .served
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[test]
fn put_from_host_memory_is_byte_exact() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let data = pattern(100_000, 9);
    let buf = data.clone().into_boxed_slice();
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, buf.len()).unwrap(), true)
        .unwrap();
    put(&inst, &up, base, data.len(), 0).unwrap();
    assert_eq!(up.world.server.object(data.len()), data);
}

#[test]
fn device_memory_registers_as_dmabuf_and_is_synchronized_after_a_get() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let gpu = &up.world.platform.gpu;
    let alloc = gpu.alloc_device(0, 256 * 1024).unwrap();
    let data = pattern(256 * 1024, 1);
    up.world.server.set_object(&data);
    inst.register(BufferRange::new(alloc.addr(), alloc.len()).unwrap(), false)
        .unwrap();
    get(&inst, &up, alloc.addr(), data.len(), 0).unwrap();
    assert_eq!(gpu.read(alloc.addr(), data.len()).unwrap(), data);
    assert_eq!(
        gpu.synchronized(),
        vec![0],
        "a direct GPU buffer is synchronized after a GET"
    );
    assert_eq!(up.world.platform.faults.calls("ibv_reg_dmabuf_mr"), 1);
    // And back: PUT from the device.
    let back = pattern(256 * 1024, 77);
    gpu.write(alloc.addr(), &back).unwrap();
    put(&inst, &up, alloc.addr(), back.len(), 0).unwrap();
    assert_eq!(up.world.server.object(back.len()), back);
}

fn staged_world() -> World {
    let mut spec = hipobj_testing::world::WorldSpec::default();
    spec.client.supports_dmabuf = false;
    World::with(spec)
}

#[test]
fn device_memory_the_nic_cannot_reach_is_staged_both_ways() {
    let up = Up::new(staged_world());
    let inst = up.instance();
    let gpu = &up.world.platform.gpu;
    let alloc = gpu.alloc_device(0, 128 * 1024).unwrap();
    inst.register(BufferRange::new(alloc.addr(), alloc.len()).unwrap(), false)
        .unwrap();
    assert_eq!(
        up.world.platform.counters.live("host_alloc"),
        1,
        "one staging buffer"
    );
    let data = pattern(128 * 1024, 5);
    up.world.server.set_object(&data);
    get(&inst, &up, alloc.addr(), data.len(), 0).unwrap();
    assert_eq!(gpu.read(alloc.addr(), data.len()).unwrap(), data);
    let back = pattern(128 * 1024, 6);
    gpu.write(alloc.addr(), &back).unwrap();
    put(&inst, &up, alloc.addr(), back.len(), 0).unwrap();
    assert_eq!(up.world.server.object(back.len()), back);
    let stats = inst.stats();
    assert_eq!(
        (
            stats.staged,
            stats.staged_bytes,
            stats.direct,
            stats.staging_copies
        ),
        (2, 2 * 128 * 1024, 0, 2),
        "both transfers staged, each with its copy"
    );
    inst.deregister(alloc.addr()).unwrap();
    assert_eq!(
        up.world.platform.counters.live("host_alloc"),
        0,
        "the staging buffer is freed"
    );
}

#[test]
fn require_gpu_direct_refuses_the_staging_fallback() {
    let world = staged_world();
    let current = Current::new();
    let opts = Options {
        require_gpu_direct: true,
        ..options()
    };
    current
        .init_with(world.platform(), gpu_config(), opts)
        .unwrap();
    let inst = current.instance().unwrap();
    let alloc = world.platform.gpu.alloc_device(0, 4096).unwrap();
    let err = inst
        .register(BufferRange::new(alloc.addr(), 4096).unwrap(), false)
        .unwrap_err();
    assert_eq!(err.code(), Code::Rdma);
    assert_eq!(inst.buffer_count(), 0);
    assert_eq!(world.platform.counters.live("host_alloc"), 0);
}

#[test]
fn ranges_at_the_edges_of_a_registration() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let data = pattern(8192, 2);
    up.world.server.set_object(&data);
    let buf = host_buffer(8192);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 8192).unwrap(), true)
        .unwrap();
    // The last byte alone.
    get(&inst, &up, base, 1, 8191).unwrap();
    assert_eq!(buf[8191], data[0]);
    // The last 100 bytes, ending exactly at the end.
    get(&inst, &up, base, 100, 8092).unwrap();
    assert_eq!(&buf[8092..], &data[..100]);
    for (len, offset) in [(1usize, 8192i64), (2, 8191), (8193, 0), (usize::MAX, 1)] {
        let err = get(&inst, &up, base, len, offset).unwrap_err();
        assert_eq!(err.code(), Code::InvalidValue, "len {len} offset {offset}");
    }
    assert_eq!(
        get(&inst, &up, base + 1, 1, 0).unwrap_err().code(),
        Code::BufNotRegistered
    );
    assert_eq!(
        up.world
            .server
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        2,
        "no request for a bad range"
    );
}

#[test]
fn a_second_transfer_reuses_the_established_connection() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let buf = host_buffer(4096);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    for i in 0..5u8 {
        up.world.server.set_object(&pattern(4096, i));
        get(&inst, &up, base, 4096, 0).unwrap();
        assert_eq!(&buf[..], &pattern(4096, i)[..]);
    }
    assert_eq!(
        up.world.platform.faults.calls("rdma_connect"),
        1,
        "one handshake for five transfers"
    );
    assert_eq!(up.world.server.side().connection_count(), 1);
}

#[test]
fn application_driven_get_and_put() {
    let up = Up::new(staged_world());
    let inst = up.instance();
    let gpu = &up.world.platform.gpu;
    let alloc = gpu.alloc_device(0, 16384).unwrap();
    inst.register(BufferRange::new(alloc.addr(), 16384).unwrap(), false)
        .unwrap();
    // GET: token, the application's own request, then sync to the device.
    let data = pattern(16384, 4);
    up.world.server.set_object(&data);
    let token = inst
        .mint_token(Slice::new(alloc.addr(), 16384, 0).unwrap(), TokenOp::Get)
        .unwrap();
    assert_eq!(up.world.server.handle(&token.to_hex(), Op::Get), b"200");
    inst.buf_sync(
        Slice::new(alloc.addr(), 16384, 0).unwrap(),
        SyncDirection::ToDevice,
    )
    .unwrap();
    assert_eq!(gpu.read(alloc.addr(), 16384).unwrap(), data);
    // PUT: sync to the host first, then the token.
    let back = pattern(16384, 8);
    gpu.write(alloc.addr(), &back).unwrap();
    inst.buf_sync(
        Slice::new(alloc.addr(), 16384, 0).unwrap(),
        SyncDirection::ToHost,
    )
    .unwrap();
    let token = inst
        .mint_token(Slice::new(alloc.addr(), 16384, 0).unwrap(), TokenOp::Put)
        .unwrap();
    assert_eq!(up.world.server.handle(&token.to_hex(), Op::Put), b"200");
    assert_eq!(up.world.server.object(16384), back);
    // The token holds the buffer until its lease ends; the next call reaps it.
    inst.deregister(alloc.addr()).unwrap();
    assert_eq!(inst.pool().free_count(), 4);
}

#[test]
fn an_unused_token_ends_at_its_deadline_without_any_further_call() {
    let world = World::new();
    let current = Current::new();
    let opts = Options {
        token_timeout: Duration::from_millis(50),
        ..options()
    };
    current
        .init_with(world.platform(), gpu_config(), opts)
        .unwrap();
    let inst = current.instance().unwrap();
    let buf = host_buffer(4096);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    let token = inst
        .mint_token(Slice::new(base, 4096, 0).unwrap(), TokenOp::Get)
        .unwrap();
    assert_eq!(inst.pool().free_count(), 3, "the token holds a connection");
    // No call into the library: the deadline alone ends the token.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while inst.pool().free_count() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(inst.pool().free_count(), 4, "the driver ended the token");
    // Its server comes too late: refused, nothing written.
    world.server.set_object(&pattern(4096, 1));
    let reply = world.server.handle(&token.to_hex(), Op::Get);
    assert_eq!(reply, b"500", "the server could not use the expired token");
    assert!(buf.iter().all(|b| *b == 0));
    inst.deregister(base).unwrap();
}

#[test]
fn deregistering_a_buffer_ends_its_tokens_first() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let buf = host_buffer(4096);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    let token = inst
        .mint_token(Slice::new(base, 4096, 0).unwrap(), TokenOp::Get)
        .unwrap();
    // The original revokes a buffer's access when it is deregistered; so
    // does this library, tokens included.
    inst.deregister(base).unwrap();
    assert_eq!(inst.pool().free_count(), 4);
    up.world.server.set_object(&pattern(4096, 2));
    assert_eq!(up.world.server.handle(&token.to_hex(), Op::Get), b"500");
    assert!(buf.iter().all(|b| *b == 0), "nothing reached the buffer");
}

fn misbehaving(behaviour: Behaviour, expected: Code) {
    let up = Up::new(World::new());
    let inst = up.instance();
    let data = pattern(32768, 7);
    up.world.server.set_object(&data);
    let buf = host_buffer(32768);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 32768).unwrap(), true)
        .unwrap();
    up.world.server.set_behaviour(behaviour);
    let started = std::time::Instant::now();
    let err = get(&inst, &up, base, 32768, 0).unwrap_err();
    assert_eq!(err.code(), expected, "{behaviour:?}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{behaviour:?} took {:?}",
        started.elapsed()
    );
    assert_eq!(
        inst.pool().free_count(),
        4,
        "{behaviour:?}: the lease came back"
    );
    assert_eq!(inst.pool().retired_count(), 0);
    // The library stays usable: the next transfer, well behaved, works.
    up.world.server.set_behaviour(Behaviour::Normal);
    get(&inst, &up, base, 32768, 0).unwrap();
    assert_eq!(&buf[..], &data[..]);
    // Counted: one failure by its cause, then one direct success.
    let stats = inst.stats();
    let failures = [
        stats.declined,
        stats.failed_s3,
        stats.failed_rdma,
        stats.failed_busy,
        stats.failed_staging,
        stats.failed_other,
    ];
    assert_eq!(failures.iter().sum::<u64>(), 1, "{behaviour:?}: {stats:?}");
    if let Behaviour::Status(_) = behaviour {
        assert_eq!(
            stats.declined, 1,
            "a reply that is not a success is a decline"
        );
    }
    match expected {
        Code::Rdma => assert_eq!(stats.failed_rdma, 1, "{behaviour:?}"),
        Code::S3 => assert_eq!(stats.declined + stats.failed_s3, 1, "{behaviour:?}"),
        _ => {}
    }
    assert_eq!((stats.direct, stats.direct_bytes), (1, 32768));
}

#[test]
fn a_server_that_never_connects_fails_the_transfer() {
    misbehaving(Behaviour::NeverConnect, Code::Rdma);
}

#[test]
fn a_server_without_the_token_is_rejected() {
    misbehaving(Behaviour::WrongProof, Code::Rdma);
}

#[test]
fn a_reply_without_the_final_message_fails_at_the_deadline() {
    misbehaving(Behaviour::NoFinalMessage, Code::Rdma);
}

#[test]
fn a_final_message_with_the_wrong_secret_fails() {
    misbehaving(Behaviour::WrongSecret, Code::Rdma);
}

#[test]
fn a_server_that_disappears_mid_transfer_fails_it() {
    misbehaving(Behaviour::Disappear, Code::Rdma);
}

#[test]
fn the_original_ordering_fails_as_on_hardware() {
    misbehaving(Behaviour::OriginalOrder, Code::Rdma);
}

#[test]
fn a_declined_request_is_an_s3_error() {
    misbehaving(Behaviour::Status(501), Code::S3);
    misbehaving(Behaviour::Status(404), Code::S3);
}

#[test]
fn a_reply_with_a_peer_token_is_accepted() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let data = pattern(4096, 1);
    up.world.server.set_object(&data);
    let buf = host_buffer(4096);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    up.world.server.set_behaviour(Behaviour::PeerTokenReply);
    get(&inst, &up, base, 4096, 0).unwrap();
    assert_eq!(&buf[..], &data[..]);
}

#[test]
fn init_failures_publish_nothing_and_report_the_documented_codes() {
    // No libibverbs.
    let world = World::new();
    world.platform.absent.lock().verbs = true;
    let current = Current::new();
    assert_eq!(
        current
            .init_with(world.platform(), gpu_config(), options())
            .unwrap_err()
            .code(),
        Code::Rdma
    );
    assert!(!current.is_initialized());
    // No HIP runtime: an error with hipErrorNoDevice, unless a hint names the NIC.
    let world = World::new();
    world.platform.absent.lock().gpu = true;
    let err = current
        .init_with(world.platform(), gpu_config(), options())
        .unwrap_err();
    assert_eq!((err.code(), err.hip_error()), (Code::Rdma, 100));
    current
        .init_with(world.platform(), hint_config(), options())
        .unwrap();
    assert!(current.instance().unwrap().gpu.is_none());
    current.shutdown();
    // A GPU index past the count.
    let world = World::new();
    let cfg = Config {
        gpu_device: 1,
        ..Config::default()
    };
    assert_eq!(
        current
            .init_with(world.platform(), cfg, options())
            .unwrap_err()
            .code(),
        Code::InvalidValue
    );
    // A hint naming no present device.
    let cfg = Config {
        gpu_device: 0,
        nic_hint: vec!["mlx5_9".into()],
        ..Config::default()
    };
    // A hint naming no present device: opening it fails.
    assert_eq!(
        current
            .init_with(world.platform(), cfg, options())
            .unwrap_err()
            .code(),
        Code::Rdma
    );
    // No librdmacm.
    world.platform.absent.lock().cm = true;
    assert_eq!(
        current
            .init_with(world.platform(), gpu_config(), options())
            .unwrap_err()
            .code(),
        Code::Rdma
    );
    assert!(!current.is_initialized());
    assert!(
        world
            .platform
            .counters
            .snapshot()
            .iter()
            .all(|(kind, _)| kind.starts_with("server") || ["context", "pd", "mr"].contains(kind)),
        "only the test server's objects are alive: {:?}",
        world.platform.counters.snapshot()
    );
}

#[test]
fn registration_rules() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let gpu = &up.world.platform.gpu;
    let alloc = gpu.alloc_device(0, 8192).unwrap();
    // A range that leaves its HIP allocation.
    let err = inst
        .register(BufferRange::new(alloc.addr() + 4096, 8192).unwrap(), false)
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidValue);
    inst.register(BufferRange::new(alloc.addr(), 8192).unwrap(), false)
        .unwrap();
    assert_eq!(
        inst.register(BufferRange::new(alloc.addr(), 16).unwrap(), false)
            .unwrap_err()
            .code(),
        Code::BufAlreadyRegistered
    );
    // 256 buffers at most.
    let host = host_buffer(4096);
    let base = host.as_ptr() as usize;
    for i in 1..256 {
        inst.register(BufferRange::new(base + i, 1).unwrap(), true)
            .unwrap();
    }
    assert_eq!(
        inst.register(BufferRange::new(base + 256, 1).unwrap(), true)
            .unwrap_err()
            .code(),
        Code::Rdma
    );
    assert_eq!(inst.buffer_count(), 256);
    for i in 1..256 {
        inst.deregister(base + i).unwrap();
    }
    assert_eq!(
        inst.deregister(base + 1).unwrap_err().code(),
        Code::BufNotRegistered
    );
    inst.deregister(alloc.addr()).unwrap();
    assert_eq!(gpu.open_dmabufs(), 0, "the MR released its dma-buf");
}

#[test]
fn a_staging_copy_past_its_deadline_is_abandoned_and_holds_its_buffer() {
    use hipobj_testing::gpu::CopyMode;
    let world = staged_world();
    let current = Current::new();
    let opts = Options {
        stage_timeout: Duration::from_millis(30),
        ..options()
    };
    current
        .init_with(world.platform(), gpu_config(), opts)
        .unwrap();
    let inst = current.instance().unwrap();
    let gpu = world.platform.gpu.clone();
    let alloc = gpu.alloc_device(0, 8192).unwrap();
    inst.register(BufferRange::new(alloc.addr(), 8192).unwrap(), false)
        .unwrap();
    gpu.set_copy_mode(CopyMode::Manual);
    let slice = || Slice::new(alloc.addr(), 8192, 0).unwrap();
    let err = inst.buf_sync(slice(), SyncDirection::ToHost).unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert_eq!(inst.abandoned_count(), 1);
    // While the copy may run: transfers, syncs and deregistration are Busy.
    let err = inst
        .transfer(Direction::Put, slice(), &mut world.server.session(Op::Put))
        .unwrap_err();
    assert_eq!(err.code(), Code::Busy);
    assert_eq!(
        inst.buf_sync(slice(), SyncDirection::ToDevice)
            .unwrap_err()
            .code(),
        Code::Busy
    );
    assert_eq!(
        inst.deregister(alloc.addr()).unwrap_err().code(),
        Code::Busy
    );
    assert_eq!(
        world
            .server
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // Once it finishes, the buffer is free again.
    gpu.set_copy_mode(CopyMode::Immediate);
    assert_eq!(gpu.complete_all(), 1);
    inst.buf_sync(slice(), SyncDirection::ToHost).unwrap();
    assert_eq!(inst.abandoned_count(), 0);
    let stats = inst.stats();
    assert_eq!(
        (
            stats.abandoned_copies,
            stats.staging_copies,
            stats.failed_busy
        ),
        (1, 2, 1),
        "one copy abandoned, one that finished, the PUT refused while it ran"
    );
    inst.deregister(alloc.addr()).unwrap();
}

#[test]
fn a_copy_still_running_at_teardown_leaks_its_staging_buffer() {
    use hipobj_testing::gpu::CopyMode;
    let world = staged_world();
    let current = Current::new();
    let opts = Options {
        stage_timeout: Duration::from_millis(10),
        ..options()
    };
    current
        .init_with(world.platform(), gpu_config(), opts)
        .unwrap();
    let inst = current.instance().unwrap();
    let gpu = world.platform.gpu.clone();
    let alloc = gpu.alloc_device(0, 4096).unwrap();
    inst.register(BufferRange::new(alloc.addr(), 4096).unwrap(), false)
        .unwrap();
    gpu.set_copy_mode(CopyMode::Never);
    assert_eq!(
        inst.buf_sync(
            Slice::new(alloc.addr(), 4096, 0).unwrap(),
            SyncDirection::ToHost
        )
        .unwrap_err()
        .code(),
        Code::Internal
    );
    drop(inst);
    current.shutdown();
    assert_eq!(
        world.platform.counters.live("host_alloc_leaked"),
        1,
        "leaked, not freed under the copy"
    );
    assert_eq!(gpu.copies_on_freed_memory(), 0);
}

#[test]
fn a_callback_that_starts_a_transfer_with_no_connection_free_gets_busy() {
    struct Nested<'a> {
        inst: &'a Instance,
        up: &'a Up,
        base: usize,
        inner: Option<hipobj::core::Result<()>>,
        session: hipobj_testing::world::Session<'a>,
    }
    impl hipobj::core::transfer::S3Client for Nested<'_> {
        fn send_request(&mut self, token: &[u8; 89]) -> Result<(), i32> {
            // Re-entrant: a transfer from inside a callback.
            self.inner = Some(get(self.inst, self.up, self.base, 16, 0));
            self.session.send_request(token)
        }
        fn recv_reply(&mut self, reply: &mut [u8; 512]) -> Result<usize, i32> {
            self.session.recv_reply(reply)
        }
    }
    let world = World::new();
    let current = Current::new();
    current
        .init_with(
            world.platform(),
            gpu_config(),
            Options {
                max_transfers: 1,
                ..options()
            },
        )
        .unwrap();
    let up = Up { world, current };
    let inst = up.instance();
    let buf = host_buffer(4096);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    let mut nested = Nested {
        inst: &inst,
        up: &up,
        base,
        inner: None,
        session: up.world.server.session(Op::Get),
    };
    inst.transfer(
        Direction::Get,
        Slice::new(base, 4096, 0).unwrap(),
        &mut nested,
    )
    .unwrap();
    assert_eq!(nested.inner.unwrap().unwrap_err().code(), Code::Busy);
    // With a connection free, the nested transfer works.
    let current = Current::new();
    let world = World::new();
    current
        .init_with(world.platform(), gpu_config(), options())
        .unwrap();
    let up = Up { world, current };
    let inst = up.instance();
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    let mut nested = Nested {
        inst: &inst,
        up: &up,
        base,
        inner: None,
        session: up.world.server.session(Op::Get),
    };
    inst.transfer(
        Direction::Get,
        Slice::new(base, 4096, 0).unwrap(),
        &mut nested,
    )
    .unwrap();
    nested.inner.unwrap().unwrap();
}

#[test]
fn sixteen_threads_of_transfers_keep_every_byte_and_every_lease() {
    let world = World::with(hipobj_testing::world::WorldSpec {
        server_bytes: 16 * 4096,
        ..Default::default()
    });
    let current = Current::new();
    current
        .init_with(
            world.platform(),
            gpu_config(),
            Options {
                max_transfers: 16,
                ..options()
            },
        )
        .unwrap();
    let inst = current.instance().unwrap();
    let store: Vec<u8> = pattern(16 * 4096, 11);
    world.server.set_object(&store);
    let rounds: usize = std::env::var("HIPOBJ_TEST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    std::thread::scope(|s| {
        for t in 0..16usize {
            let inst = inst.clone();
            let world = &world;
            let store = &store;
            s.spawn(move || {
                let buf = host_buffer(4096);
                let base = buf.as_ptr() as usize;
                inst.register(BufferRange::new(base, 4096).unwrap(), true)
                    .unwrap();
                for round in 0..rounds {
                    // Each GET reads the whole 4 KiB the server holds at the
                    // start of its store; a PUT of thread t writes there too,
                    // so only GETs run concurrently here.
                    let len = 1 + (round * 37 + t) % 4096;
                    let slice = Slice::new(base, len, 0).unwrap();
                    inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
                        .unwrap();
                    assert_eq!(&buf[..len], &store[..len], "thread {t} round {round}");
                }
                inst.deregister(base).unwrap();
            });
        }
    });
    assert_eq!(inst.pool().free_count(), 16);
    assert_eq!(inst.pool().retired_count(), 0);
    assert_eq!(
        world
            .server
            .served
            .load(std::sync::atomic::Ordering::SeqCst),
        16 * rounds
    );
    assert!(
        world.platform.faults.calls("rdma_connect") <= 16 * 2,
        "connections are reused: {}",
        world.platform.faults.calls("rdma_connect")
    );
}

#[test]
fn shutdown_racing_transfers_leaves_nothing_behind() {
    let world = World::new();
    let baseline = world.platform.counters.snapshot();
    let current = Arc::new(Current::new());
    current
        .init_with(world.platform(), gpu_config(), options())
        .unwrap();
    let data = pattern(4096, 3);
    world.server.set_object(&data);
    let done: usize = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let current = current.clone();
                let world = &world;
                s.spawn(move || {
                    let buf = host_buffer(4096);
                    let base = buf.as_ptr() as usize;
                    let mut done = 0;
                    for _ in 0..200 {
                        let Ok(inst) = current.instance() else { break };
                        if inst
                            .register(BufferRange::new(base, 4096).unwrap(), true)
                            .is_err()
                        {
                            continue;
                        }
                        match inst.transfer(
                            Direction::Get,
                            Slice::new(base, 4096, 0).unwrap(),
                            &mut world.server.session(Op::Get),
                        ) {
                            Ok(()) => done += 1,
                            Err(e) => {
                                assert!(
                                    matches!(e.code(), Code::NotInitialized | Code::Busy),
                                    "{e}"
                                )
                            }
                        }
                        let _ = inst.deregister(base);
                    }
                    done
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        current.shutdown();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert!(done > 0, "no transfer ran before the shutdown");
    assert!(!current.is_initialized());
    // The client disconnected every connection at teardown; the server lets
    // go of its side once it sees that.
    world.server.side().forget_disconnected();
    assert_eq!(world.server.side().connection_count(), 0);
    assert_eq!(
        world.platform.counters.snapshot(),
        baseline,
        "every object was released"
    );
}

/// An instance with one connection and a registered 4 KiB host buffer.
struct OneConnection {
    world: World,
    _current: Current,
    inst: Arc<Instance>,
    buf: Box<[u8]>,
    slice: Slice,
}

fn one_connection() -> OneConnection {
    let world = World::new();
    let current = Current::new();
    current
        .init_with(
            world.platform(),
            gpu_config(),
            Options {
                max_transfers: 1,
                ..options()
            },
        )
        .unwrap();
    let inst = current.instance().unwrap();
    let buf = host_buffer(4096);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    let slice = Slice::new(base, 4096, 0).unwrap();
    OneConnection {
        world,
        _current: current,
        inst,
        buf,
        slice,
    }
}

#[test]
fn a_connection_is_re_aimed_at_another_server_only_through_disconnect_and_a_new_qp() {
    let OneConnection {
        world,
        _current,
        inst,
        buf,
        slice,
    } = one_connection();
    let other = world.add_server("server1", std::net::Ipv4Addr::new(192, 0, 2, 3), 1 << 16);
    world.server.set_object(&pattern(4096, 1));
    other.set_object(&pattern(4096, 2));
    // One connection serves both servers in turn, on a new QP each time.
    let qps = world.platform.faults.calls("ibv_create_qp");
    for round in 0..3u8 {
        inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
            .unwrap();
        assert_eq!(
            &buf[..],
            &pattern(4096, 1)[..],
            "round {round}, first server"
        );
        inst.transfer(Direction::Get, slice, &mut other.session(Op::Get))
            .unwrap();
        assert_eq!(
            &buf[..],
            &pattern(4096, 2)[..],
            "round {round}, second server"
        );
    }
    // Each switch disconnected the previous server: at most one server still
    // holds a live connection to the QP.
    world.server.side().forget_disconnected();
    other.side().forget_disconnected();
    assert_eq!(
        world.server.side().connection_count() + other.side().connection_count(),
        1
    );
    assert_eq!(
        world.platform.faults.calls("rdma_connect"),
        6,
        "a handshake per switch"
    );
    assert_eq!(
        world.platform.faults.calls("ibv_create_qp") - qps,
        5,
        "each switch gave the client's connection a new QP"
    );
}

#[test]
fn a_connection_is_re_aimed_at_a_server_beside_an_old_one_that_never_answers_the_disconnect() {
    // Two S3 servers on one node share its CM. The first keeps its
    // connection to the client's QP (it has not noticed the disconnect):
    // its CM refuses a connection to that QP number as stale, so the
    // client's next link, to the second server, needs a QP of its own.
    let OneConnection {
        world,
        _current,
        inst,
        buf,
        slice,
    } = one_connection();
    let beside = world.add_server_beside(SERVER_NIC, 1 << 16);
    world.server.set_object(&pattern(4096, 5));
    beside.set_object(&pattern(4096, 6));
    for round in 0..3u8 {
        inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
            .unwrap_or_else(|e| panic!("round {round}, the first server: {e}"));
        assert_eq!(&buf[..], &pattern(4096, 5)[..], "round {round}");
        inst.transfer(Direction::Get, slice, &mut beside.session(Op::Get))
            .unwrap_or_else(|e| panic!("round {round}, the server beside it: {e}"));
        assert_eq!(&buf[..], &pattern(4096, 6)[..], "round {round}");
    }
    assert_eq!(inst.pool().free_count(), 1, "the connection is back");
}

#[test]
fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let world = World::new();
    let current = Current::new();
    current
        .init_with(
            world.platform(),
            gpu_config(),
            Options {
                idle_timeout: Duration::from_millis(40),
                ..options()
            },
        )
        .unwrap();
    let inst = current.instance().unwrap();
    let buf = host_buffer(64);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 64).unwrap(), true)
        .unwrap();
    inst.transfer(
        Direction::Get,
        Slice::new(base, 64, 0).unwrap(),
        &mut world.server.session(Op::Get),
    )
    .unwrap();
    assert_eq!(world.server.side().connection_count(), 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        world.server.side().forget_disconnected();
        if world.server.side().connection_count() == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the idle connection was never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The next transfer connects afresh.
    inst.transfer(
        Direction::Get,
        Slice::new(base, 64, 0).unwrap(),
        &mut world.server.session(Op::Get),
    )
    .unwrap();
    assert_eq!(world.platform.faults.calls("rdma_connect"), 2);
}

#[test]
fn the_token_rkey_is_a_window_over_exactly_the_transfer() {
    let up = Up::new(World::new());
    let inst = up.instance();
    let buf = host_buffer(8192);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 8192).unwrap(), true)
        .unwrap();
    let object = pattern(8192, 3);
    up.world.server.set_object(&object);
    // A server that writes past its range is refused by the NIC: nothing
    // beyond the range changes, and the transfer fails.
    up.world.server.set_behaviour(Behaviour::Overreach);
    let err = get(&inst, &up, base, 4096, 0).unwrap_err();
    assert_eq!(err.code(), Code::S3, "{err}");
    assert!(
        buf[4096..].iter().all(|b| *b == 0),
        "no byte past the range was written"
    );
    assert_eq!(inst.pool().free_count(), 4);
    // The same server, well behaved, on the same (window-replacing) path.
    up.world.server.set_behaviour(Behaviour::Normal);
    get(&inst, &up, base, 4096, 0).unwrap();
    assert_eq!(&buf[..4096], &object[..4096]);
    let token = inst
        .mint_token(Slice::new(base, 8192, 0).unwrap(), TokenOp::Get)
        .unwrap();
    let mr_rkey_probe = inst
        .mint_token(Slice::new(base, 8192, 0).unwrap(), TokenOp::Get)
        .unwrap();
    assert_ne!(
        token.rkey, mr_rkey_probe.rkey,
        "each transfer gets its own window rkey"
    );
}

#[test]
fn without_memory_windows_each_transfer_registers_exactly_its_range() {
    let mut spec = hipobj_testing::world::WorldSpec::default();
    spec.client.supports_mw = false;
    let up = Up::new(World::with(spec));
    let inst = up.instance();
    let buf = host_buffer(8192);
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 8192).unwrap(), true)
        .unwrap();
    up.world.server.set_object(&pattern(4096, 8));
    get(&inst, &up, base, 4096, 0).unwrap();
    assert_eq!(&buf[..4096], &pattern(4096, 8)[..]);
    // The first transfer made the server's connection (and its buffer).
    let mrs = up.world.platform.counters.live("mr");
    up.world.server.set_object(&pattern(4096, 9));
    get(&inst, &up, base, 4096, 0).unwrap();
    assert_eq!(&buf[..4096], &pattern(4096, 9)[..]);
    assert_eq!(
        up.world.platform.counters.live("mr"),
        mrs,
        "the transfer's own registration went with it"
    );
    // A server that reaches past its range is refused by the NIC: the
    // registration covers the range and no more.
    up.world.server.set_behaviour(Behaviour::Overreach);
    assert_eq!(get(&inst, &up, base, 4096, 0).unwrap_err().code(), Code::S3);
    assert!(buf[4096..].iter().all(|b| *b == 0));
    up.world.server.set_behaviour(Behaviour::Normal);
    let a = inst
        .mint_token(Slice::new(base, 4096, 0).unwrap(), TokenOp::Get)
        .unwrap();
    let b = inst
        .mint_token(Slice::new(base, 4096, 0).unwrap(), TokenOp::Get)
        .unwrap();
    assert_ne!(a.rkey, b.rkey, "a registration each, not the buffer's");
}
