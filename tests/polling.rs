//! Transfers where the library's threads poll for a transfer's next step
//! before sleeping (`HIPOBJ_POLL_US`; by default on a hardware NIC): the
//! polling paths give the same outcomes as the sleeping ones, every
//! misbehaviour of a kept connection's server included, and they save the
//! wake-ups they are for.
//!
//! The fake devices model a hardware NIC here (a PCI vendor id that is not
//! a software NIC's), so the test server polls too.

use std::time::Duration;

use hipobj::core::transfer::Direction;
use hipobj::core::{Code, Options};
use hipobj_testing::world::{Behaviour, HostClient, World, WorldSpec};

const LEN: usize = 32768;

struct Up {
    world: World,
    client: HostClient,
}

impl Up {
    /// An instance on a hardware-like fabric, polling for `poll` (`None`:
    /// the device's default), with one registered host buffer.
    fn new(poll: Option<Duration>) -> Up {
        let world = World::with(WorldSpec::hardware());
        let options = Options {
            completion_timeout: Duration::from_millis(300),
            max_transfers: 4,
            poll,
            ..Options::default()
        };
        let client = HostClient::new(&world, options, LEN).expect("init on the fake platform");
        Up { world, client }
    }

    fn transfer(&self, direction: Direction, len: usize) -> hipobj::core::Result<()> {
        self.client.transfer(&self.world.server, direction, 0, len)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0]).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn a_hardware_nic_polls_by_default_and_a_software_one_does_not() {
    assert_eq!(
        Up::new(None).client.instance.polling.limit(),
        Duration::from_micros(50)
    );
    let up = Up::new(Some(Duration::from_micros(7)));
    assert_eq!(up.client.instance.polling.limit(), Duration::from_micros(7));
    let world = World::new();
    let soft = HostClient::new(&world, Options::default(), 8).unwrap();
    assert_eq!(soft.instance.polling.limit(), Duration::ZERO);
}

#[test]
fn polling_transfers_move_every_byte_and_save_the_wake_ups() {
    // A poll far longer than a transfer on the fake: back to back, the
    // driver never needs to sleep, nor the calling thread.
    let up = Up::new(Some(Duration::from_millis(10)));
    const N: u64 = 200;
    for i in 0..N {
        let seed = u8::try_from(i % 251).unwrap();
        let data = pattern(LEN, seed);
        up.world.server.set_object(&data);
        up.transfer(Direction::Get, LEN).unwrap();
        assert_eq!(&up.client.buf[..], &data[..], "GET {i}");
    }
    let stats = up.client.instance.stats();
    assert_eq!(stats.direct, N);
    assert_eq!(stats.handshakes, 1, "one handshake, then kept");
    // Without polling each reused transfer costs two or three (the driver
    // woken by the proof and by the final message, the caller by the
    // outcome); polling, none where nothing else wants the CPUs, and on a
    // loaded machine some, when a thread that polls loses its CPU for the
    // whole poll: fewer than one a transfer (a count, not a time).
    assert!(
        stats.wakeups < N,
        "{} wake-ups for {N} transfers while polling",
        stats.wakeups
    );
    let sleeping = Up::new(Some(Duration::ZERO));
    for _ in 0..20 {
        sleeping.transfer(Direction::Get, 4096).unwrap();
    }
    assert!(
        sleeping.client.instance.stats().wakeups >= 20,
        "without polling every transfer wakes a thread: {:?}",
        sleeping.client.instance.stats()
    );
}

#[test]
fn a_polling_put_reads_exactly_its_range() {
    let mut up = Up::new(Some(Duration::from_millis(10)));
    for seed in 0..20u8 {
        let data = pattern(LEN, seed);
        up.client.buf.copy_from_slice(&data);
        up.transfer(Direction::Put, LEN).unwrap();
        assert_eq!(up.world.server.object(LEN), data, "PUT {seed}");
    }
}

/// A kept connection's server misbehaves while both sides poll: the
/// transfer ends in its error as when they sleep, within its deadline, the
/// pool whole and the next transfer fine.
fn misbehaving(behaviour: Behaviour, expected: Code) {
    let up = Up::new(Some(Duration::from_millis(10)));
    let data = pattern(LEN, 5);
    up.world.server.set_object(&data);
    up.transfer(Direction::Get, LEN).unwrap();
    up.world.server.set_object(&pattern(LEN, 6));
    up.world.server.set_behaviour(behaviour);
    let started = std::time::Instant::now();
    let err = up.transfer(Direction::Get, LEN).unwrap_err();
    assert_eq!(err.code(), expected, "{behaviour:?}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{behaviour:?} took {:?}",
        started.elapsed()
    );
    assert_eq!(up.client.instance.pool().free_count(), 4, "{behaviour:?}");
    up.world.server.set_behaviour(Behaviour::Normal);
    let data = pattern(LEN, 9);
    up.world.server.set_object(&data);
    up.transfer(Direction::Get, LEN).unwrap();
    assert_eq!(
        &up.client.buf[..],
        &data[..],
        "{behaviour:?}: then a good one"
    );
}

#[test]
fn a_reply_without_the_final_message_fails_while_polling() {
    misbehaving(Behaviour::NoFinalMessage, Code::Rdma);
}

#[test]
fn a_wrong_final_secret_fails_while_polling() {
    misbehaving(Behaviour::WrongSecret, Code::Rdma);
}

#[test]
fn a_wrong_proof_on_a_kept_connection_fails_while_polling() {
    misbehaving(Behaviour::WrongProof, Code::Rdma);
}

#[test]
fn a_server_that_disappears_fails_while_polling() {
    misbehaving(Behaviour::Disappear, Code::Rdma);
}

#[test]
fn a_failure_after_the_data_is_declined_while_polling() {
    misbehaving(Behaviour::FailAfterData, Code::S3);
}

#[test]
fn a_server_that_reaches_past_its_range_gets_nothing_while_polling() {
    let up = Up::new(Some(Duration::from_millis(10)));
    up.world.server.set_object(&pattern(LEN, 1));
    up.transfer(Direction::Get, 4096).unwrap();
    let before = up.client.buf[4096..].to_vec();
    up.world.server.set_object(&pattern(LEN, 2));
    up.world.server.set_behaviour(Behaviour::Overreach);
    let err = up.transfer(Direction::Get, 4096).unwrap_err();
    assert_eq!(err.code(), Code::S3, "{err}");
    assert_eq!(
        &up.client.buf[4096..],
        &before[..],
        "nothing past the range"
    );
    assert_eq!(up.client.instance.pool().free_count(), 4);
}
