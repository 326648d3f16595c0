//! Whole 8-byte transfers on the fake fabric, with the test server in
//! process and trivial callbacks: the library's own cost per transfer, with
//! a fresh RDMA CM handshake and on a reused connection.
//!
//! Run: `cargo bench --bench transfer`. Figures are printed, never asserted
//! (goals: 10 µs reused, at most one wake-up of a library thread per
//! reused transfer); `docs/performance.md` records them.
//!
//! The fake devices model a hardware NIC (a PCI vendor id that is not a
//! software NIC's), so both sides poll for a transfer's next step before
//! sleeping (`HIPOBJ_POLL_US`'s default); the "no polling" case is the same
//! fabric as a software NIC, where neither side polls.
//!
//! With `HIPOBJ_BENCH_TRANSFERS=N` it runs N reused transfers (after one
//! that connects) on the world `HIPOBJ_BENCH_WORLD` names (`polling`, the
//! default, or `sleeping`) and exits: for `scripts/callgrind-transfer.sh`,
//! which counts instructions per transfer under callgrind.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use hipobj::core::args::{BufferRange, Slice};
use hipobj::core::transfer::Direction;
use hipobj::core::{Config, Current, Instance, Options};
use hipobj::server::Op;
use hipobj::testing::fabric::RXE_VENDOR_ID;
use hipobj::testing::world::{World, WorldSpec};

/// AMD Pensando's PCI vendor id: a hardware NIC, for the fake devices.
const HARDWARE_VENDOR_ID: u32 = 0x1dd8;

struct Setup {
    world: World,
    _current: Current,
    instance: Arc<Instance>,
    _buf: Box<[u8]>,
    slice: Slice,
}

impl Setup {
    fn new(windows: bool, polling: bool) -> Setup {
        let vendor = if polling {
            HARDWARE_VENDOR_ID
        } else {
            RXE_VENDOR_ID
        };
        let mut spec = WorldSpec::default();
        spec.client.supports_mw = windows;
        spec.client.vendor_id = vendor;
        spec.server.vendor_id = vendor;
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
        let slice = Slice::new(buf.as_ptr() as usize, 8, 0).expect("slice");
        Setup {
            world,
            _current: current,
            instance,
            _buf: buf,
            slice,
        }
    }

    fn get(&self) {
        self.instance
            .transfer(
                Direction::Get,
                black_box(self.slice),
                &mut self.world.server.session(Op::Get),
            )
            .expect("transfer")
    }
}

fn transfers(c: &mut Criterion) {
    let polling = Setup::new(true, true);
    let sleeping = Setup::new(true, false);
    let plain = Setup::new(false, true);
    let mut group = c.benchmark_group("8-byte GET");
    group.bench_function("reused connection", |b| b.iter(|| polling.get()));
    group.bench_function("reused connection, no polling (software NIC)", |b| {
        b.iter(|| sleeping.get())
    });
    group.bench_function("fresh CM handshake", |b| {
        b.iter(|| {
            // The server drops its connection after each transfer, so the
            // next one starts with a handshake (the disconnect is counted).
            polling.get();
            polling.world.server.side().disconnect_all();
        })
    });
    group.bench_function("reused connection, no memory windows", |b| {
        b.iter(|| plain.get())
    });
    group.finish();
    wakeups_per_transfer("polling", &polling);
    wakeups_per_transfer("no polling", &sleeping);
    calls_per_transfer(&sleeping);
}

/// Prints the wake-ups per reused transfer: the library's threads (the
/// calling thread and the connection driver) that slept and were woken,
/// and apart from them the in-process test server's sleeps.
fn wakeups_per_transfer(name: &str, setup: &Setup) {
    const N: u64 = 2000;
    setup.get();
    let before = setup.instance.stats().wakeups;
    let server_before = setup.world.server.side().sleeps();
    for _ in 0..N {
        setup.get();
    }
    let woken = setup.instance.stats().wakeups - before;
    let server = setup.world.server.side().sleeps() - server_before;
    println!(
        "wake-ups per reused 8-byte GET, {name} (mean of {N}): library {:.3}, test server {:.3}",
        woken as f64 / N as f64,
        server as f64 / N as f64
    );
}

/// Prints the fake platform's calls per reused transfer, by function (the
/// client's and the in-process server's together), where neither polls:
/// what the reused path costs in verbs, CM and GPU calls, whatever the
/// machine.
fn calls_per_transfer(setup: &Setup) {
    const N: u64 = 1000;
    // Once first, so that the connection is established.
    setup.get();
    let faults = &setup.world.platform.faults;
    faults.reset();
    for _ in 0..N {
        setup.get();
    }
    let mut by_function = std::collections::BTreeMap::new();
    for function in faults.log() {
        *by_function.entry(function).or_insert(0u64) += 1;
    }
    println!("calls per reused 8-byte GET (client and server together, no polling, mean of {N}):");
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

fn main() {
    if let Some(n) = std::env::var("HIPOBJ_BENCH_TRANSFERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    {
        let polling = std::env::var("HIPOBJ_BENCH_WORLD").as_deref() != Ok("sleeping");
        let setup = Setup::new(true, polling);
        setup.get();
        for _ in 0..n {
            setup.get();
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
