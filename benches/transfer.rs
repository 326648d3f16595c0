//! Whole 8-byte transfers on the fake fabric, with the test server in
//! process and trivial callbacks: the library's own cost per transfer, with
//! a fresh RDMA CM handshake and on a reused connection.
//!
//! Run: `cargo bench --bench transfer`. Figures are printed, never asserted
//! (goals: 20 µs with a handshake, 2 µs reused); `docs/performance.md`
//! records them.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use hipobj::core::args::{BufferRange, Slice};
use hipobj::core::transfer::Direction;
use hipobj::core::{Config, Current, Instance, Options};
use hipobj::server::Op;
use hipobj::testing::world::{World, WorldSpec};

fn setup(windows: bool) -> (World, Current, Arc<Instance>, Box<[u8]>) {
    let mut spec = WorldSpec::default();
    spec.client.supports_mw = windows;
    let world = World::with(spec);
    let current = Current::new();
    let options = Options {
        completion_timeout: Duration::from_secs(5),
        max_transfers: 4,
        ..Options::default()
    };
    current
        .init_with(
            world.platform(),
            Config {
                gpu_device: 0,
                ..Config::default()
            },
            options,
        )
        .expect("init");
    let instance = current.instance().expect("instance");
    let buf = vec![0u8; 8].into_boxed_slice();
    instance
        .register(
            BufferRange::new(buf.as_ptr() as usize, 8).expect("range"),
            true,
        )
        .expect("register");
    (world, current, instance, buf)
}

fn transfers(c: &mut Criterion) {
    let (world, _current, instance, buf) = setup(true);
    let slice = Slice::new(buf.as_ptr() as usize, 8, 0).expect("slice");
    let mut group = c.benchmark_group("8-byte GET");
    group.bench_function("reused connection", |b| {
        b.iter(|| {
            instance
                .transfer(
                    Direction::Get,
                    black_box(slice),
                    &mut world.server.session(Op::Get),
                )
                .expect("transfer")
        })
    });
    group.bench_function("fresh CM handshake", |b| {
        b.iter(|| {
            // The server drops its connection after each transfer, so the
            // next one starts with a handshake (the disconnect is counted).
            instance
                .transfer(
                    Direction::Get,
                    black_box(slice),
                    &mut world.server.session(Op::Get),
                )
                .expect("transfer");
            world.server.side().disconnect_all();
        })
    });
    let (plain_world, _plain_current, plain, plain_buf) = setup(false);
    let plain_slice = Slice::new(plain_buf.as_ptr() as usize, 8, 0).expect("slice");
    group.bench_function("reused connection, no memory windows", |b| {
        b.iter(|| {
            plain
                .transfer(
                    Direction::Get,
                    black_box(plain_slice),
                    &mut plain_world.server.session(Op::Get),
                )
                .expect("transfer")
        })
    });
    group.finish();
    calls_per_transfer(&world, &instance, slice);
}

/// Prints the fake platform's calls per reused transfer, by function (the
/// client's and the in-process server's together): what the reused path
/// costs in verbs, CM and GPU calls, whatever the machine.
fn calls_per_transfer(world: &World, instance: &Instance, slice: Slice) {
    const N: u64 = 1000;
    // Once first, so that the connection is established.
    instance
        .transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
        .expect("transfer");
    let faults = &world.platform.faults;
    faults.reset();
    for _ in 0..N {
        instance
            .transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
            .expect("transfer");
    }
    let mut by_function = std::collections::BTreeMap::new();
    for function in faults.log() {
        *by_function.entry(function).or_insert(0u64) += 1;
    }
    println!("calls per reused 8-byte GET (client and server together, mean of {N}):");
    for (function, calls) in &by_function {
        println!("  {function:<24} {:.2}", *calls as f64 / N as f64);
    }
    println!(
        "  {:<24} {:.2}",
        "all",
        faults.total_calls() as f64 / N as f64
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(3));
    targets = transfers
}
criterion_main!(benches);
