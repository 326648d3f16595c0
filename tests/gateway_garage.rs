//! The gateway in front of a real distributed S3 store: a three-node Garage
//! cluster (replication factor 3) that `scripts/vm/garage-guest.sh` starts
//! around this test binary (`scripts/garage-test.sh` runs it so, on the
//! host; docs/reliability.md, "The gateway in front of Garage").
//!
//! Every store's lane runs the tests of `tests/common/store.rs` (RDMA and
//! plain requests through the gateway in this process, checked against the
//! store's own copy, a checksum mismatch at each hop, a store that pauses
//! or stalls); this file runs them against Garage, and adds what a cluster
//! with a quorum does: a node killed (SIGKILL, through
//! `garage-guest.sh kill-node`) while transfers go on, and two nodes of
//! three down.
//!
//! Without the cluster's settings in the environment the tests fail, saying
//! how to run them: they never pass by skipping.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/s3.rs"]
mod s3server;
#[path = "common/store.rs"]
mod store;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use hipobj::s3::objects::{self, Object};
use hipobj_testing::world::World;
use store::{client, pattern, unique, via, wait_until, Lane, Store, NO_FALLBACK};

/// Garage's lane: its settings are `HIPOBJ_GARAGE_*`.
static GARAGE: Lane = Lane {
    name: "Garage",
    prefix: "GARAGE",
    script: "scripts/garage-test.sh",
    pid_files: &["node0/pid", "node1/pid", "node2/pid"],
    // Past 2^31 bytes (a token length and byte counts past 31 bits),
    // which is what 3 GiB proved, at two thirds of the time.
    big_mib: 2049,
};

fn garage() -> Store {
    Store::from_env(&GARAGE)
}

store::store_tests!(garage);

/// `garage-guest.sh HELPER N`: kill-node or start-node.
fn node(helper: &str, n: usize) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vm/garage-guest.sh");
    let status = Command::new("bash")
        .arg(script)
        .args([helper, &n.to_string()])
        .status()
        .expect("garage-guest.sh");
    assert!(status.success(), "garage-guest.sh {helper} {n}: {status}");
}

#[test]
fn a_storage_node_killed_mid_run_leaves_transfers_going_on() {
    let garage = garage();
    let world = World::new();
    let gateway = garage.gateway(
        &world,
        &garage.endpoint,
        &["--upstream-timeout-ms", "20000"],
    );
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = garage.bucket.as_str();
    let running = AtomicBool::new(true);
    let done = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let after_kill = AtomicUsize::new(0);
    let killed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut i = 0u8;
            while running.load(Ordering::SeqCst) {
                i = i.wrapping_add(1);
                let key = unique("node-down");
                let data = pattern(2 << 20, i);
                let mut buf = client.register_host(data.clone()).unwrap();
                let object = Object::new(&s3, bucket, &key);
                let outcome = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK)
                    .and_then(|_| {
                        buf.as_mut_slice().unwrap().fill(0);
                        let object = Object::new(&s3, bucket, &key);
                        objects::get(
                            &client,
                            object,
                            0..data.len() as u64,
                            &mut buf,
                            0,
                            NO_FALLBACK,
                        )
                    });
                match outcome {
                    Ok(_) => {
                        assert!(buf.as_slice().unwrap() == data, "{key}: byte for byte");
                        done.fetch_add(1, Ordering::SeqCst);
                        if killed.load(Ordering::SeqCst) {
                            after_kill.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) => failures.lock().unwrap().push(format!("{key}: {e}")),
                }
            }
        });
        wait_until(
            || done.load(Ordering::SeqCst) >= 3,
            "three transfers before the kill",
        );
        node("kill-node", 2);
        killed.store(true, Ordering::SeqCst);
        wait_until(
            || after_kill.load(Ordering::SeqCst) >= 5,
            "five transfers with node 2 down",
        );
        node("start-node", 2);
        running.store(false, Ordering::SeqCst);
    });
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "{} transfers, {} with node 2 down; failed: {failures:?}",
        done.load(Ordering::SeqCst),
        after_kill.load(Ordering::SeqCst)
    );
    // A request in flight to the node as it died may fail (cleanly, with
    // an S3 error); every later one goes on.
    assert!(failures.len() <= 1, "{failures:?}");
}

/// Two of three nodes down: no write quorum, Garage answers 503 (after
/// its own time-outs: a gateway that waits for them), and the client's
/// PUT fails with it; nothing stored, and the gateway goes on once they
/// are back.
#[test]
fn without_a_write_quorum_a_put_fails_with_garage_s_503_and_stores_nothing() {
    let garage = garage();
    let world = World::new();
    let gateway = garage.gateway(
        &world,
        &garage.endpoint,
        &["--upstream-timeout-ms", "60000"],
    );
    let s3 = via(&gateway);
    let client = client(&world);
    let bucket = garage.bucket.as_str();
    let key = unique("quorum");
    let data = pattern(1 << 20, 6);
    let mut buf = client.register_host(data.clone()).unwrap();
    let object = Object::new(&s3, bucket, &key);
    objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK).unwrap();

    node("kill-node", 1);
    node("kill-node", 2);
    let lost = unique("no-quorum");
    let object = Object::new(&s3, bucket, &lost);
    let outcome = objects::put(&client, object, &buf, 0..data.len(), NO_FALLBACK);
    node("start-node", 1);
    node("start-node", 2);
    let e = outcome.expect_err("a PUT without a write quorum");
    eprintln!("no quorum: {e}");
    let text = e.to_string();
    assert!(text.contains("HTTP 503"), "{text}");
    assert!(text.contains("quorum"), "Garage's own answer: {text}");
    wait_until(|| !garage.holds(&lost), "Garage answers HEAD again");
    assert!(!garage.holds(&lost), "nothing stored");

    store::reads_back(&client, Object::new(&s3, bucket, &key), &mut buf, &data);
}

/// Garage keeps no object tags (its own 501 NotImplemented): the gateway
/// answers the store's 501 as it came, naming the store, not a failure of
/// its own.
#[test]
fn object_tags_are_garage_s_501_through_the_gateway() {
    let garage = garage();
    let (status, code, message) =
        store::tags_through_the_gateway(&garage).expect_err("Garage keeps no tags");
    assert_eq!(
        (status, code.as_str()),
        (501, "NotImplemented"),
        "{message}"
    );
    assert!(message.contains(&garage.endpoint), "{message}");
}
