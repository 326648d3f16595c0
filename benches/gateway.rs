//! The gateway against its own store: the same objects fetched from a
//! three-node Garage cluster by plain HTTP GETs (the built-in S3 client,
//! straight to node 0) and by RDMA GETs through the gateway in front of it
//! (`hipobj::gateway` in this process, `--upstream` node 0, RDMA on the fake
//! fabric, whose WRITEs are copies in memory: the figure is the gateway's
//! own cost over its upstream's, not a NIC's).
//!
//! `scripts/garage-test.sh` runs it inside the cluster after the tests;
//! `docs/performance.md` records its figures.
//!
//! Measured for 16 MiB and 256 MiB objects, each GET repeated (the two
//! kinds in turns) and the medians taken: throughput both ways and their ratio (the gateway must
//! not store and forward: at least 0.9 of its upstream's); the same
//! gateway's own plain-HTTP GET of the object (an RDMA GET through the
//! gateway must not be slower than it); and the time to
//! first byte: for the upstream, from sending the request to the first body
//! bytes read; for the gateway, from the request's arrival to its first
//! chunk WRITTEN to the client (the server's metric
//! `hipobj_s3_rdma_get_first_byte_seconds`), against the upstream's first
//! byte plus the time the upstream takes to send one chunk (the bound: the
//! first byte at most one upstream chunk later).
//!
//! The same objects by RDMA GETs through a second gateway with the cache
//! on (`--cache-bytes`, `ttl`: each GET after the first served from its
//! memory), and through a third over a local directory holding a copy
//! (`--root`): what a hit costs against the local backend's RDMA GET, and
//! against the store's own HTTP.
//!
//! Output: one `name value unit` line per figure on stdout.

#[path = "../tests/common/gateway.rs"]
mod gateway;
#[path = "../tests/common/s3.rs"]
mod s3server;

use std::sync::Mutex;
use std::time::Instant;

use hipobj::s3::objects::{self, Object, Path as Via, Policy};
use hipobj::s3::{Request, S3};
use hipobj_testing::world::World;

/// RDMA only, not verified: the figures are the transfers'.
const RDMA_ONLY: Policy = Policy {
    fallback: false,
    verify: false,
};

/// The gateway's chunk (`--rdma-chunk-bytes`, its default).
const CHUNK: u64 = 8 << 20;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("{name} is not set: run this inside scripts/vm/garage-guest.sh (scripts/garage-test.sh does)");
        std::process::exit(1)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The gateway's first-byte histogram: (sum of seconds, count).
fn first_byte_totals() -> (f64, u64) {
    let text = hipobj::gateway::metrics::render(None);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or("0")
            .to_owned()
    };
    let sum = value("hipobj_s3_rdma_get_first_byte_seconds_sum");
    let count = value("hipobj_s3_rdma_get_first_byte_seconds_count");
    (sum.parse().unwrap(), count.parse().unwrap())
}

/// One plain GET of `len` bytes straight from the store: (seconds to the
/// first body bytes, seconds in all).
fn upstream_get(store: &S3, bucket: &str, key: &str, out: &mut [u8]) -> (f64, f64) {
    let start = Instant::now();
    let first = Mutex::new(None);
    let mut response = store
        .send(&Request::new("GET", bucket, Some(key)))
        .and_then(|r| r.success())
        .expect("GET from the store");
    let watch = |_n: u64| {
        let mut first = first.lock().unwrap();
        if first.is_none() {
            *first = Some(start.elapsed().as_secs_f64());
        }
        Ok(())
    };
    response
        .read_body_watched(out, &watch)
        .expect("the store's body");
    let total = start.elapsed().as_secs_f64();
    let first = first.into_inner().unwrap().unwrap_or(total);
    (first, total)
}

fn main() {
    let endpoint = env("HIPOBJ_GARAGE_ENDPOINT");
    let region = env("HIPOBJ_GARAGE_REGION");
    let bucket = env("HIPOBJ_GARAGE_BUCKET");
    let key_id = env("AWS_ACCESS_KEY_ID");
    let secret = env("AWS_SECRET_ACCESS_KEY");
    let store = gateway::s3(&endpoint, &region, &key_id, &secret);

    let world = World::new();
    let gw = gateway::Gateway::upstream(&world, &endpoint, &["--upstream-region", &region]);
    let via = gw.s3();
    // The cache: room for the 256 MiB object inside the default RDMA
    // memory budget (1 GiB, which holds the cache), trusted (each GET
    // after the first a hit that asks the store nothing).
    let cached = gateway::Gateway::upstream(
        &world,
        &endpoint,
        &[
            "--upstream-region",
            &region,
            "--cache-bytes",
            "805306368",
            "--cache-max-object-bytes",
            "536870912",
            "--cache-validate",
            "ttl=3600",
        ],
    );
    let via_cache = cached.s3();
    let local = gateway::Gateway::start(&world);
    let via_local = local.s3();
    let client = gateway::bench_client(&world);

    for (mib, rounds) in [(16usize, 25), (256, 7)] {
        let len = mib << 20;
        let key = format!("bench-gateway-{mib}-{}", std::process::id());
        let data: Vec<u8> = (0..len).map(|i| (i % 251).to_le_bytes()[0]).collect();
        objects::put_http(Object::new(&store, &bucket, &key), &data, false)
            .expect("PUT to the store");
        objects::put_http(
            Object::new(&via_local, s3server::BUCKET, &key),
            &data,
            false,
        )
        .expect("PUT to the local gateway");
        let mut buf = client.register_host(vec![0u8; len]).unwrap();
        let mut plain = vec![0u8; len];
        // One of each first, untimed: connections made, caches warm.
        upstream_get(&store, &bucket, &key, &mut plain);
        assert!(plain == data, "the store's bytes");
        let object = Object::new(&via, &bucket, &key);
        let moved = objects::get(&client, object, 0..len as u64, &mut buf, 0, RDMA_ONLY)
            .expect("GET through the gateway");
        assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
        assert!(buf.as_slice().unwrap() == data, "the gateway's bytes");
        // The cache's miss, and the local gateway's first GET, untimed.
        let rdma_get = |s3: &S3, bucket: &str, buf: &mut hipobj::client::Buffer| {
            let start = Instant::now();
            let moved = objects::get(
                &client,
                Object::new(s3, bucket, &key),
                0..len as u64,
                buf,
                0,
                RDMA_ONLY,
            )
            .expect("an RDMA GET");
            assert!(matches!(moved.path, Via::Rdma(_)), "{moved:?}");
            start.elapsed().as_secs_f64()
        };
        for (s3, bucket) in [
            (&via_cache, bucket.as_str()),
            (&via_local, s3server::BUCKET),
        ] {
            buf.as_mut_slice().unwrap().fill(0);
            rdma_get(s3, bucket, &mut buf);
            assert!(
                buf.as_slice().unwrap() == data,
                "the cache's and the local gateway's bytes"
            );
        }
        let (mut hits, mut locals, mut plains) = (Vec::new(), Vec::new(), Vec::new());

        let (mut up_first, mut up_total, mut gw_first, mut gw_total) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            // Each first in turn: neither pays for the other's leftovers.
            for upstream_first in [round % 2 == 0, round % 2 == 1] {
                if upstream_first {
                    let (first, total) = upstream_get(&store, &bucket, &key, &mut plain);
                    up_first.push(first);
                    up_total.push(total);
                    continue;
                }
                let before = first_byte_totals();
                let start = Instant::now();
                let object = Object::new(&via, &bucket, &key);
                objects::get(&client, object, 0..len as u64, &mut buf, 0, RDMA_ONLY)
                    .expect("GET through the gateway");
                gw_total.push(start.elapsed().as_secs_f64());
                let after = first_byte_totals();
                assert_eq!(after.1, before.1 + 1, "one first byte recorded");
                gw_first.push(after.0 - before.0);
            }
            hits.push(rdma_get(&via_cache, &bucket, &mut buf));
            locals.push(rdma_get(&via_local, s3server::BUCKET, &mut buf));
            plains.push(upstream_get(&via, &bucket, &key, &mut plain).1);
        }
        assert!(plain == data, "the gateway's plain-HTTP bytes");
        assert!(buf.as_slice().unwrap() == data, "the last GET's bytes");
        let (uf, ut, gf, gt) = (
            median(up_first),
            median(up_total),
            median(gw_first),
            median(gw_total),
        );
        let rate = |s: f64| mib as f64 / s;
        // The upstream's time for one chunk at its own rate.
        let chunk_s = ut * (CHUNK.min(len as u64) as f64 / len as f64);
        println!("gateway_get_{mib}MiB_upstream_http {:.1} MiB/s", rate(ut));
        println!(
            "gateway_get_{mib}MiB_rdma_through_gateway {:.1} MiB/s",
            rate(gt)
        );
        println!("gateway_get_{mib}MiB_ratio {:.3} x", ut / gt);
        println!(
            "gateway_get_{mib}MiB_upstream_first_byte {:.2} ms",
            uf * 1e3
        );
        println!("gateway_get_{mib}MiB_gateway_first_byte {:.2} ms", gf * 1e3);
        println!(
            "gateway_get_{mib}MiB_first_byte_bound {:.2} ms",
            (uf + chunk_s) * 1e3
        );
        let plain_get = median(plains);
        println!(
            "gateway_get_{mib}MiB_gateway_http {:.1} MiB/s",
            rate(plain_get)
        );
        println!(
            "gateway_get_{mib}MiB_rdma_vs_gateway_http {:.3} x",
            plain_get / gt
        );
        let (hit, local_get) = (median(hits), median(locals));
        println!("gateway_get_{mib}MiB_rdma_cached {:.1} MiB/s", rate(hit));
        println!(
            "gateway_get_{mib}MiB_rdma_local {:.1} MiB/s",
            rate(local_get)
        );
        println!(
            "gateway_get_{mib}MiB_cached_vs_local {:.3} x",
            local_get / hit
        );
        println!(
            "gateway_get_{mib}MiB_cached_vs_upstream_http {:.3} x",
            ut / hit
        );
        let _ = store.send(&Request::new("DELETE", &bucket, Some(&key)));
    }
}
