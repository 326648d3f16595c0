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
//! Then the reused transfers again, polling and not, with a thread spinning
//! on every core of the host: polling adapts (`core::polling`), so it must
//! not be slower there than sleeping. Last, fresh worlds one after another:
//! whether each starts polling or in the sleeping mode.
//!
//! With `HIPOBJ_BENCH_TRANSFERS=N` it runs N reused transfers (after one
//! that connects) on the world `HIPOBJ_BENCH_WORLD` names (`polling`, the
//! default, or `sleeping`) and exits: for `scripts/callgrind-transfer.sh`,
//! which counts instructions per transfer under callgrind.
//!
//! With `HIPOBJ_BENCH_FRESH_WORLDS=1` it runs the fresh worlds alone.
//!
//! `HIPOBJ_PROTOCOL=3` makes the client one of protocol version 3 (the
//! server then speaks 3 too): the same build, before and after version
//! 4's final message.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use hipobj::core::args::Slice;
use hipobj::core::transfer::Direction;
use hipobj::core::Options;
use hipobj::server::Op;
use hipobj_testing::fabric::Traffic;
use hipobj_testing::world::{HostClient, World, WorldSpec, CLIENT_NIC, SERVER_NIC};

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
        // `HIPOBJ_PROTOCOL=3`: the client of version 3, to compare with.
        let options = Options {
            completion_timeout: Duration::from_secs(5),
            max_transfers: 4,
            protocol: Options::from_env().protocol,
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
    // The same reused transfers on a host whose cores are all busy: a
    // thread that spins on every core, as a data loader's workers would.
    // Criterion's samples there spread over a factor of three, one run to
    // the next: the two worlds run in turns instead, in blocks, and the
    // medians of the blocks are compared.
    let hogs = Hogs::start();
    let (with, without) = in_turns(&polling, &sleeping);
    println!(
        "8-byte GET, reused connection, every core busy (median of {BLOCKS} blocks of \
         {BLOCK} in turns): polling {with:.1} µs, no polling {without:.1} µs, ratio {:.2}",
        with / without
    );
    wakeups_per_transfer("polling, every core busy", &polling);
    wakeups_per_transfer("no polling, every core busy", &sleeping);
    drop(hogs);
    let (with, without) = in_turns(&polling, &sleeping);
    println!(
        "8-byte GET, reused connection, cores idle (the same blocks): polling {with:.1} µs, \
         no polling {without:.1} µs"
    );
    fresh_worlds();
}

/// Fresh polling worlds with the cores idle, each started one of two ways
/// that leave its gauges missing: the way the fresh-handshake case starts
/// one (transfers whose connection the server then drops), or a spell of
/// transfers with every core busy, which ends before the idle transfers.
/// Then each world's wake-ups (both sides) and time per reused transfer,
/// block by block: a world in the sleeping mode (every party's polls
/// missing because every other party sleeps) shows a wake-up or more per
/// transfer where one that polls shows almost none.
fn fresh_worlds() {
    const WORLDS: usize = 5;
    const HANDSHAKES: usize = 20;
    const BUSY: usize = 2000;
    // Blocks of [`BLOCK`] transfers per world.
    const WORLD_BLOCKS: usize = 6;
    for busy in [false, true] {
        let start = if busy {
            format!("after {BUSY} transfers with every core busy")
        } else {
            format!("after {HANDSHAKES} fresh handshakes")
        };
        println!(
            "fresh polling worlds, cores idle, {start}: wake-ups per reused 8-byte GET and µs, \
             in blocks of {BLOCK}:"
        );
        for _ in 0..WORLDS {
            let setup = Setup::new(true, true);
            if busy {
                let hogs = Hogs::start();
                for _ in 0..BUSY {
                    setup.get();
                }
                drop(hogs);
            } else {
                for _ in 0..HANDSHAKES {
                    setup.get();
                    setup.world.server.side().disconnect_all();
                }
            }
            let mut blocks = Vec::new();
            for _ in 0..WORLD_BLOCKS {
                let client = setup.client.instance.stats().wakeups;
                let server = setup.world.server.side().sleeps();
                let took = block(&setup);
                let woken = setup.client.instance.stats().wakeups - client
                    + (setup.world.server.side().sleeps() - server);
                blocks.push(format!("{:.2} {took:.0}", woken as f64 / f64::from(BLOCK)));
            }
            println!("  {}", blocks.join(" | "));
        }
    }
}

/// The time per transfer of [`BLOCK`] reused transfers on `s` (µs).
fn block(s: &Setup) -> f64 {
    let started = std::time::Instant::now();
    for _ in 0..BLOCK {
        s.get();
    }
    started.elapsed().as_secs_f64() * 1e6 / f64::from(BLOCK)
}

/// Blocks of transfers each world runs in [`in_turns`], and their size.
const BLOCKS: usize = 25;
const BLOCK: u32 = 200;

/// The median time per transfer of `BLOCKS` blocks of `BLOCK` reused
/// transfers on each of two worlds, the blocks run in turns (µs).
fn in_turns(a: &Setup, b: &Setup) -> (f64, f64) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..BLOCKS {
        xs.push(block(a));
        ys.push(block(b));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(&mut xs), median(&mut ys))
}

/// A thread that spins on each of the host's cores until dropped.
struct Hogs {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn start() -> Hogs {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Prints, per reused transfer and per side, what it cost beyond its
/// bytes: the messages sent (SENDs and WRITEs with immediate), the send
/// work requests posted and the `ibv_post_send` calls that carried them,
/// the signaled ones, the receives posted and the completions the side's
/// CQs were given (the fake fabric's [`Traffic`]); and the sleeps that
/// something ended: the library's threads (the calling thread and the
/// connection driver) on the client, the test server's on the server.
fn wakeups_per_transfer(name: &str, setup: &Setup) {
    const N: u64 = 2000;
    setup.get();
    let fabric = &setup.world.platform.fabric;
    fabric.reset_traffic();
    let before = setup.client.instance.stats().wakeups;
    let server_before = setup.world.server.side().sleeps();
    for _ in 0..N {
        setup.get();
    }
    let woken = setup.client.instance.stats().wakeups - before;
    let server = setup.world.server.side().sleeps() - server_before;
    println!("per reused 8-byte GET, {name} (mean of {N}):");
    for (side, nic, sleeps) in [
        ("client", CLIENT_NIC, woken),
        ("server", SERVER_NIC, server),
    ] {
        let t: Traffic = fabric.traffic(nic).expect("the world's device");
        let per = |n: u64| n as f64 / N as f64;
        println!(
            "  {side}: messages {:.2}, send work requests {:.2} in {:.2} posts, signaled {:.2}, \
             receives {:.2}, completions {:.2}, wake-ups {:.3}",
            per(t.messages),
            per(t.send_wrs),
            per(t.post_sends),
            per(t.signaled),
            per(t.recvs),
            per(t.completions),
            per(sleeps)
        );
    }
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
    if std::env::var_os("HIPOBJ_BENCH_FRESH_WORLDS").is_some() {
        fresh_worlds();
        return;
    }
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
