//! The gateway's RDMA paths (`hipobj::gateway`, what `hipobj-s3-server`
//! runs) on the fake fabric, over real HTTP, driven by the Rust API's S3
//! client as an application drives it: the memory budget under concurrent
//! transfers, the version a pinned read is served, what the log says.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/s3.rs"]
mod s3server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hipobj::client::{Client, GpuSelect};
use hipobj::s3::objects::{self, Object, Path as Via, Policy};
use hipobj::s3::{Credentials, S3Config, S3};
use hipobj::testing::world::World;
use s3server::{ACCESS_KEY, BUCKET, SECRET_KEY};

const MIB: usize = 1 << 20;

fn s3(endpoint: &str) -> S3 {
    S3::new(S3Config {
        endpoint: endpoint.to_owned(),
        region: "us-east-1".to_owned(),
        credentials: Credentials {
            access_key_id: ACCESS_KEY.to_owned(),
            secret_access_key: SECRET_KEY.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap()
}

fn client(world: &World) -> Client {
    Client::builder()
        .platform(world.platform())
        .gpu(GpuSelect::None)
        .build()
        .unwrap()
}

/// Verified, without the fallback: a transfer that does not go by RDMA
/// fails.
const NO_FALLBACK: Policy = Policy {
    fallback: false,
    verify: true,
};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[2]).wrapping_add(seed))
        .collect()
}

/// Eight GETs and eight PUTs of 64 MiB at once, through a gateway whose
/// memory budget holds three transfers' windows: every one finishes by
/// RDMA, those the budget cannot hold yet waiting their turn (none
/// answered 503 while the budget is merely busy, none holding part of it
/// while it waits, so none waits on another), and the budget is never
/// over its limit.
#[test]
fn concurrent_gets_and_puts_under_a_budget_of_a_few_windows_all_finish_in_turn() {
    const N: usize = 8;
    const LEN: usize = 64 * MIB;
    // 1 MiB chunks, three a transfer: a window is 3 MiB; the budget three.
    let budget = 9 * MIB;
    let world = World::new();
    let gateway = gateway::Gateway::start_with(
        &world,
        &[
            "--rdma-chunk-bytes",
            &MIB.to_string(),
            "--rdma-chunks",
            "3",
            "--rdma-memory-bytes",
            &budget.to_string(),
            "--rdma-timeout-ms",
            "20000",
        ],
    );
    let s3 = s3(&gateway.endpoint);
    let client = client(&world);
    let objects: Vec<Vec<u8>> = (0..N).map(|i| pattern(LEN, i as u8)).collect();
    for (i, data) in objects.iter().enumerate() {
        let key = format!("get-{i}");
        objects::put_http(Object::new(&s3, BUCKET, &key), data, false).expect("a plain PUT");
    }
    let peak = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                peak.fetch_max(gateway.rdma.memory_in_use(), Ordering::AcqRel);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let mut transfers = Vec::new();
        for (i, data) in objects.iter().enumerate() {
            let (s3, client) = (&s3, &client);
            transfers.push(scope.spawn(move || {
                let key = format!("get-{i}");
                let mut buf = client.host_buffer(LEN).unwrap();
                let moved = objects::get(
                    client,
                    Object::new(s3, BUCKET, &key),
                    0..LEN as u64,
                    &mut buf,
                    0,
                    NO_FALLBACK,
                )
                .map_err(|e| format!("GET {key}: {e}"))?;
                if !matches!(moved.path, Via::Rdma(_)) {
                    return Err(format!("GET {key}: {moved:?}"));
                }
                if buf.as_slice().unwrap() != &data[..] {
                    return Err(format!("GET {key}: other bytes"));
                }
                Ok(())
            }));
            transfers.push(scope.spawn(move || {
                let key = format!("put-{i}");
                let buf = client.register_host(data.clone()).unwrap();
                let moved = objects::put(
                    client,
                    Object::new(s3, BUCKET, &key),
                    &buf,
                    0..LEN,
                    NO_FALLBACK,
                )
                .map_err(|e| format!("PUT {key}: {e}"))?;
                if !matches!(moved.path, Via::Rdma(_)) {
                    return Err(format!("PUT {key}: {moved:?}"));
                }
                Ok(())
            }));
        }
        let failed: Vec<String> = transfers
            .into_iter()
            .filter_map(|t| t.join().unwrap().err())
            .collect();
        done.store(true, Ordering::Release);
        sampler.join().unwrap();
        assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
    });
    for (i, data) in objects.iter().enumerate() {
        let stored = gateway.stored(&format!("put-{i}")).expect("stored");
        assert!(stored == *data, "put-{i}: other bytes stored");
    }
    let (waiting, waited) = gateway.rdma.budget_waits();
    assert_eq!(waiting, 0);
    assert!(
        waited > 0,
        "sixteen transfers of three windows' budget: some must have waited their turn"
    );
    let peak = peak.load(Ordering::Acquire);
    assert!(
        peak <= budget as u64,
        "{peak} bytes held at once, past the budget of {budget}"
    );
    assert_eq!(gateway.rdma.memory_in_use(), 0, "every share given back");
}
