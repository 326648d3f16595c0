//! The safe Rust API (`hipobj::client`) on the fake platform: clients,
//! buffers as owned values, GETs and PUTs through an S3 side the test
//! supplies (the fake world's S3 test server), and what each failure leaves.

use std::time::Duration;

use hipobj::client::{Buffer, Client, ClientError, GpuSelect, Route, S3Side};
use hipobj::core::buffers::BufKind;
use hipobj::core::{Code, Error, Options};
use hipobj::server::Op;
use hipobj_testing::world::{Behaviour, TestServer, World, WorldSpec};

fn options() -> Options {
    Options {
        completion_timeout: Duration::from_millis(300),
        max_transfers: 4,
        ..Options::default()
    }
}

fn client(world: &World, gpu: GpuSelect) -> Client {
    Client::builder()
        .platform(world.platform())
        .gpu(gpu)
        .options(options())
        .build()
        .expect("a client on the fake platform")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0]).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The S3 side of the tests: the world's server handles the token at once.
struct WorldSide<'a> {
    server: &'a TestServer,
    op: Op,
    calls: usize,
}

impl<'a> WorldSide<'a> {
    fn new(server: &'a TestServer, op: Op) -> WorldSide<'a> {
        WorldSide {
            server,
            op,
            calls: 0,
        }
    }
}

impl S3Side for WorldSide<'_> {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        self.calls += 1;
        let reply = self.server.handle(token.as_bytes(), self.op);
        String::from_utf8(reply).map_err(|e| e.to_string())
    }
}

/// An S3 side whose request never reaches a server.
struct Unreachable;

impl S3Side for Unreachable {
    fn exchange(&mut self, _token: &str) -> Result<String, String> {
        Err("connection refused by 192.0.2.9:9000".to_owned())
    }
}

#[test]
fn get_and_put_of_host_memory_are_byte_exact_and_counted_as_direct() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    assert_eq!(client.gpu_device(), None, "no GPU asked, none served");
    let object = pattern(64 << 10, 5);
    world.server.set_object(&object);

    let mut buf = client.host_buffer(96 << 10).unwrap();
    assert_eq!(buf.kind(), Some(BufKind::Host));
    let mut side = WorldSide::new(&world.server, Op::Get);
    let route = client.get(&mut buf, 1000..1000 + object.len(), &mut side);
    assert_eq!(route.unwrap(), Route::Direct);
    let bytes = buf.as_slice().unwrap();
    assert_eq!(&bytes[1000..1000 + object.len()], &object[..]);
    assert!(
        bytes[..1000].iter().all(|&b| b == 0),
        "nothing before the range"
    );

    let up = pattern(32 << 10, 77);
    buf.as_mut_slice().unwrap()[..up.len()].copy_from_slice(&up);
    let mut side = WorldSide::new(&world.server, Op::Put);
    assert_eq!(
        client.put(&buf, 0..up.len(), &mut side).unwrap(),
        Route::Direct
    );
    assert_eq!(world.server.object(up.len()), up);

    let stats = client.stats();
    assert_eq!(
        (stats.library.direct, stats.library.direct_bytes),
        (2, (96 << 10))
    );
    assert_eq!((stats.fallback, stats.fallback_bytes), (0, 0));
    client.count_fallback(10);
    assert_eq!(
        (client.stats().fallback, client.stats().fallback_bytes),
        (1, 10)
    );
}

#[test]
fn a_device_buffer_is_written_read_and_transferred_through_the_gpu() {
    let world = World::new();
    let client = client(&world, GpuSelect::Device(0));
    assert_eq!(client.gpu_device(), Some(0));
    let mut buf = client.device_buffer(1 << 20).unwrap();
    assert_eq!(buf.device(), Some(0));
    assert!(buf.as_slice().is_none(), "GPU bytes are not a host slice");
    assert_eq!(
        buf.kind(),
        Some(BufKind::Device {
            device: 0,
            dmabuf: true
        })
    );

    let data = pattern(700_000, 9);
    buf.write_at(300, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    buf.read_at(300, &mut back).unwrap();
    assert!(back == data, "write_at then read_at");

    let object = pattern(256 << 10, 41);
    world.server.set_object(&object);
    let mut side = WorldSide::new(&world.server, Op::Get);
    assert_eq!(
        client
            .get(&mut buf, 4096..4096 + object.len(), &mut side)
            .unwrap(),
        Route::Direct
    );
    let mut got = vec![0u8; object.len()];
    buf.read_at(4096, &mut got).unwrap();
    assert!(got == object, "the GET landed in GPU memory");

    let mut side = WorldSide::new(&world.server, Op::Put);
    client.put(&buf, 300..300 + 3000, &mut side).unwrap();
    assert!(
        world.server.object(3000) == data[..3000],
        "the PUT read GPU memory"
    );
}

#[test]
fn a_device_buffer_the_nic_cannot_reach_goes_through_staging() {
    let mut spec = WorldSpec::default();
    spec.client.supports_dmabuf = false;
    let world = World::with(spec);
    let client = client(&world, GpuSelect::Current);
    let mut buf = client.device_buffer(128 << 10).unwrap();
    assert_eq!(buf.kind(), Some(BufKind::Staged { device: 0 }));
    let object = pattern(128 << 10, 3);
    world.server.set_object(&object);
    let mut side = WorldSide::new(&world.server, Op::Get);
    assert_eq!(
        client.get(&mut buf, 0..object.len(), &mut side).unwrap(),
        Route::Staged
    );
    let mut got = vec![0u8; object.len()];
    buf.read_at(0, &mut got).unwrap();
    assert!(got == object);
    let stats = client.stats().library;
    assert_eq!((stats.staged, stats.staged_bytes), (1, 128 << 10));
}

#[test]
fn a_declined_transfer_is_declined_with_its_status_and_changes_nothing() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    world.server.set_object(&pattern(4096, 1));
    world.server.set_behaviour(Behaviour::Status(501));
    let mut buf = client.register_host(vec![0xaa; 4096]).unwrap();
    let mut side = WorldSide::new(&world.server, Op::Get);
    match client.get(&mut buf, 0..4096, &mut side) {
        Err(ClientError::Declined { status: 501 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(buf.as_slice().unwrap().iter().all(|&b| b == 0xaa));
    assert_eq!(client.stats().library.declined, 1);
    // The client goes on: the next transfer works.
    world.server.set_behaviour(Behaviour::Normal);
    let mut side = WorldSide::new(&world.server, Op::Get);
    client.get(&mut buf, 0..4096, &mut side).unwrap();
    assert_eq!(buf.into_vec().unwrap(), pattern(4096, 1));
}

#[test]
fn an_s3_side_that_fails_is_reported_with_its_reason() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let mut buf = client.host_buffer(4096).unwrap();
    match client.get(&mut buf, 0..4096, &mut Unreachable) {
        Err(ClientError::S3(why)) => assert!(why.contains("connection refused"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(client.stats().library.failed_s3, 1);
}

#[test]
fn a_range_outside_the_buffer_is_refused_before_any_request() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let mut buf = client.host_buffer(4096).unwrap();
    let mut side = WorldSide::new(&world.server, Op::Get);
    for range in [0..4097, 4000..5000, usize::MAX - 1..usize::MAX] {
        assert!(
            matches!(
                client.get(&mut buf, range.clone(), &mut side),
                Err(ClientError::Range(_))
            ),
            "{range:?}"
        );
    }
    // An empty range is the library's own refusal (size 0).
    match client.get(&mut buf, 5..5, &mut side) {
        Err(ClientError::Library(e)) => assert_eq!(e.code(), Code::InvalidValue),
        other => panic!("{other:?}"),
    }
    assert_eq!(side.calls, 0, "no request was sent");
    assert!(buf.write_at(4000, &[0; 97]).is_err());
    assert!(buf.read_at(4096, &mut [0; 1]).is_err());
}

#[test]
fn a_buffer_serves_only_the_client_that_registered_it() {
    let world = World::new();
    let one = client(&world, GpuSelect::None);
    let two = client(&world, GpuSelect::None);
    let mut buf = one.host_buffer(4096).unwrap();
    let mut side = WorldSide::new(&world.server, Op::Get);
    match two.get(&mut buf, 0..4096, &mut side) {
        Err(ClientError::Library(Error::BufNotRegistered)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(side.calls, 0);
}

#[test]
fn device_memory_needs_a_client_that_serves_a_gpu() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    match client.device_buffer(4096) {
        Err(ClientError::Library(e)) => assert_eq!(e.code(), Code::NotSupported),
        other => panic!("{other:?}"),
    }
    let gpu = self::client(&world, GpuSelect::Device(0));
    for len in [0, (4usize << 30) + 1] {
        assert!(gpu.device_buffer(len).is_err(), "{len} bytes");
    }
    assert!(
        Client::builder()
            .platform(world.platform())
            .gpu(GpuSelect::Device(7))
            .options(options())
            .build()
            .is_err(),
        "a device that does not exist"
    );
}

#[test]
fn dropping_buffers_and_clients_releases_everything_they_made() {
    let world = World::new();
    let baseline = world.platform.counters.snapshot();
    {
        let client = client(&world, GpuSelect::Device(0));
        let bufs: Vec<Buffer> = (0..3)
            .map(|i| {
                if i % 2 == 0 {
                    client.host_buffer(8192).unwrap()
                } else {
                    client.device_buffer(8192).unwrap()
                }
            })
            .collect();
        world.server.set_object(&pattern(8192, 2));
        let mut first = bufs.into_iter().next().unwrap();
        let mut side = WorldSide::new(&world.server, Op::Get);
        client.get(&mut first, 0..8192, &mut side).unwrap();
        assert_eq!(client.registered_buffers(), 1, "two dropped, one left");
        let back = first.into_vec().unwrap();
        assert_eq!(back, pattern(8192, 2));
        assert_eq!(client.registered_buffers(), 0);
    }
    // The test server's side of the connection goes once it has seen the
    // client's disconnect.
    world.server.side().forget_disconnected();
    let live: Vec<_> = world
        .platform
        .counters
        .snapshot()
        .into_iter()
        .filter(|(kind, n)| {
            baseline
                .iter()
                .find(|(k, _)| k == kind)
                .map_or(0, |(_, b)| *b)
                != *n
        })
        .collect();
    assert!(live.is_empty(), "objects left behind: {live:?}");
}

#[test]
fn lent_memory_is_registered_while_lent_and_given_back_deregistered() {
    let world = World::new();
    let client = client(&world, GpuSelect::None);
    let object = pattern(16 << 10, 9);
    world.server.set_object(&object);
    // Memory the caller owns (a host program's buffer), lent for one GET.
    let memory: &'static mut [u8] = Box::leak(vec![0u8; 16 << 10].into_boxed_slice());
    let mut buf = client.lend(memory).map_err(|(e, _)| e).unwrap();
    assert_eq!(buf.kind(), Some(BufKind::Host));
    assert_eq!(client.registered_buffers(), 1);
    let mut side = WorldSide::new(&world.server, Op::Get);
    assert_eq!(
        client.get(&mut buf, 0..object.len(), &mut side).unwrap(),
        Route::Direct
    );
    assert_eq!(
        buf.as_slice().unwrap(),
        &object[..],
        "landed in the lent memory"
    );
    assert!(
        buf.into_vec().is_err(),
        "lent memory is never the library's to free"
    );
    let mut buf = client
        .lend(Box::leak(vec![0u8; 8].into_boxed_slice()))
        .map_err(|(e, _)| e)
        .unwrap();
    let back = buf.as_mut_slice().map(|b| b.len());
    assert_eq!(back, Some(8));
    let back = buf.into_lent().unwrap();
    assert_eq!(back.len(), 8);
    assert_eq!(client.registered_buffers(), 0, "given back deregistered");
    // The same address lent again is registered afresh.
    let again = client.lend(back).map_err(|(e, _)| e).unwrap();
    assert_eq!(client.registered_buffers(), 1);
    drop(again);
    assert_eq!(client.registered_buffers(), 0);
}
