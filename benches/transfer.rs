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
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use hipobj::core::args::Slice;
use hipobj::core::transfer::Direction;
use hipobj::core::Options;
use hipobj::server::Op;
use hipobj::testing::world::{HostClient, World, WorldSpec};

struct Setup {
    world: World,
    client: HostClient,
    slice: Slice,
}

impl Setup {
    fn new(windows: bool, polling: bool) -> Setup {
        let mut spec = if polling {
            WorldSpec::hardware()
        } else {
            WorldSpec::default()
        };
        spec.client.supports_mw = windows;
        let world = World::with(spec);
        let options = Options {
            completion_timeout: Duration::from_secs(5),
            max_transfers: 4,
            ..Options::default()
        };
        let client = HostClient::new(&world, options, 8).expect("a client");
        let slice = client.slice(0, 8).expect("slice");
        Setup {
            world,
            client,
            slice,
        }
    }

    fn get(&self) {
        self.client
            .instance
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
    let before = setup.client.instance.stats().wakeups;
    let server_before = setup.world.server.side().sleeps();
    for _ in 0..N {
        setup.get();
    }
    let woken = setup.client.instance.stats().wakeups - before;
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
