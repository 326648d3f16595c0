//! The S3 server's own cost of a small RDMA GET, on this host: 64 KiB
//! objects fetched by 16 threads at once from `hipobj::gateway` over a
//! local directory (what `hipobj-s3-server --root` runs), in this process,
//! RDMA on the fake fabric (whose WRITEs are copies in memory), against
//! the same server's plain-HTTP answers to the same GET and to a 1-byte
//! GET (the S3 request alone, which no RDMA protocol removes).
//!
//! Each cell prints, per GET: wall time (16 in flight: the process's
//! throughput), CPU time of the whole process (client and server), and
//! context switches of the whole process (`getrusage`), the wake-ups a
//! GET costs. `docs/performance.md` ("64 KiB through the S3 server")
//! records its figures beside the Soft-RoCE lane's.
//!
//! `cargo bench --features "s3-server s3" --bench small_gets`; set
//! `HIPOBJ_BENCH_GETS` for the GETs a cell makes (default 4000), and
//! `HIPOBJ_BENCH_CELLS` (`rdma_64KiB,http_1B`, say) to run only those
//! cells (under `perf record`, say).

#[path = "../tests/common/gateway.rs"]
mod gateway;
#[path = "common/rusage.rs"]
mod rusage;
#[path = "../tests/common/s3.rs"]
mod s3server;

use std::time::Instant;

use hipobj::s3::objects::{self, Object, Path as Via, Policy};
use hipobj::s3::Request;
use hipobj_testing::world::World;

/// RDMA only, not verified: the figures are the transfers'.
const RDMA_ONLY: Policy = Policy {
    fallback: false,
    verify: false,
};
/// GETs in flight.
const THREADS: usize = 16;
/// The object's length.
const LEN: usize = 64 << 10;

/// Runs `gets` GETs, `THREADS` at a time, each by `one` (given its
/// thread's index), and prints per GET: µs of wall time, of CPU time,
/// and context switches.
fn cell(name: &str, gets: usize, one: &(dyn Fn(usize) + Sync)) {
    if std::env::var("HIPOBJ_BENCH_CELLS").is_ok_and(|only| !only.split(',').any(|c| c == name)) {
        return;
    }
    // Untimed: connections made.
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || one(t));
        }
    });
    let before = rusage::usage();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                for _ in 0..gets / THREADS {
                    one(t);
                }
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    let after = rusage::usage();
    let n = (gets / THREADS * THREADS) as f64;
    println!("small_get_{name}_wall {:.1} us", wall / n * 1e6);
    let cpu = after.cpu.saturating_sub(before.cpu).as_secs_f64();
    println!("small_get_{name}_cpu {:.1} us", cpu / n * 1e6);
    println!(
        "small_get_{name}_switches {:.1} per GET",
        after.switches.saturating_sub(before.switches) as f64 / n
    );
}

fn main() {
    let gets: usize = std::env::var("HIPOBJ_BENCH_GETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let world = World::new();
    let gw = gateway::Gateway::start(&world);
    let s3 = gw.s3();
    let client = gateway::bench_client(&world);
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251).to_le_bytes()[0]).collect();
    objects::put_http(Object::new(&s3, s3server::BUCKET, "small"), &data, false)
        .expect("PUT the 64 KiB object");
    objects::put_http(
        Object::new(&s3, s3server::BUCKET, "byte"),
        &data[..1],
        false,
    )
    .expect("PUT the 1-byte object");
    let bufs: Vec<_> = (0..THREADS)
        .map(|_| std::sync::Mutex::new(client.register_host(vec![0u8; LEN]).unwrap()))
        .collect();

    let rdma = |t: usize| {
        let mut buf = bufs[t].lock().unwrap();
        let object = Object::new(&s3, s3server::BUCKET, "small");
        let moved = objects::get(&client, object, 0..LEN as u64, &mut buf, 0, RDMA_ONLY)
            .expect("an RDMA GET");
        assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
    };
    let plain = |key: &str, len: usize| {
        let mut out = vec![0u8; len];
        s3.send(&Request::new("GET", s3server::BUCKET, Some(key)))
            .and_then(|r| r.success())
            .expect("a plain GET")
            .read_body_into(&mut out)
            .expect("its body");
        assert_eq!(out[0], data[0]);
    };
    // In turns, twice: neither pays for the other's leftovers alone.
    for _ in 0..2 {
        cell("rdma_64KiB", gets, &rdma);
        cell("http_64KiB", gets, &|_| plain("small", LEN));
        cell("http_1B", gets, &|_| plain("byte", 1));
    }
    assert!(
        bufs[0].lock().unwrap().as_slice().unwrap() == data,
        "the RDMA GET's bytes"
    );
}
