//! `HIPOBJ_MAX_TRANSFERS=1024` needs a handful of file descriptors, not
//! one per connection: the pool's QPs share one CQ and one completion
//! channel (the default `ulimit -n` is 1024). Alone in its test binary, so
//! that no other test opens descriptors meanwhile. On real verbs the same
//! is checked under `ulimit -n 1024` in the Soft-RoCE lane.

use std::time::Duration;

use hipobj::core::args::{BufferRange, Slice};
use hipobj::core::transfer::Direction;
use hipobj::core::{Config, Current, Options};
use hipobj::server::Op;
use hipobj_testing::world::World;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[test]
fn a_pool_of_1024_connections_opens_a_handful_of_descriptors() {
    let world = World::new();
    let current = Current::new();
    let before = open_descriptors();
    let options = Options {
        max_transfers: 1024,
        completion_timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let config = Config {
        gpu_device: 0,
        ..Config::default()
    };
    current
        .init_with(world.platform(), config, options)
        .expect("init with 1024 connections");
    let opened = open_descriptors() - before;
    eprintln!("1024 connections: {opened} descriptors");
    assert!(opened <= 8, "init opened {opened} descriptors");
    let inst = current.instance().unwrap();
    let buf = vec![0u8; 4096].into_boxed_slice();
    let base = buf.as_ptr() as usize;
    inst.register(BufferRange::new(base, 4096).unwrap(), true)
        .unwrap();
    world.server.set_object(&[7u8; 4096]);
    for _ in 0..3 {
        inst.transfer(
            Direction::Get,
            Slice::new(base, 4096, 0).unwrap(),
            &mut world.server.session(Op::Get),
        )
        .expect("a transfer");
    }
    assert!(buf.iter().all(|&b| b == 7));
    inst.deregister(base).unwrap();
    drop(inst);
    current.shutdown();
}
