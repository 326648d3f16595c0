//! Fault-injection sweeps: for init, registration and a whole transfer,
//! fail each platform call in turn (the kth call of each function the
//! operation makes). Every run must return a documented code, leak nothing
//! (live counters back where they started), and leave the library usable.

use std::collections::BTreeMap;
use std::time::Duration;

use hipobj::core::args::{BufferRange, Slice};
use hipobj::core::transfer::Direction;
use hipobj::core::{Code, Config, Current, Options};
use hipobj::server::Op;
use hipobj_testing::world::{World, WorldSpec};

fn options() -> Options {
    Options {
        completion_timeout: Duration::from_millis(200),
        max_transfers: 2,
        ..Options::default()
    }
}

fn config() -> Config {
    Config {
        gpu_device: 0,
        ..Config::default()
    }
}

/// Every (function, kth call) an operation makes, from its call log.
fn calls(log: &[&'static str]) -> Vec<(&'static str, u64)> {
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    for f in log {
        *counts.entry(f).or_default() += 1;
    }
    counts
        .into_iter()
        .flat_map(|(f, n)| (1..=n).map(move |k| (f, k)))
        .collect()
}

/// Functions the connection driver calls on its own schedule, whenever it
/// wakes: failing their kth call is not tied to an operation the driver
/// takes no part in (init, registration). A transfer's sweep includes them.
fn asynchronous(function: &str) -> bool {
    matches!(
        function,
        "rdma_get_cm_event"
            | "ibv_poll_cq"
            | "ibv_req_notify_cq"
            | "ibv_get_cq_event"
            | "ibv_get_async_event"
    )
}

const DOCUMENTED: [Code; 7] = [
    Code::InvalidValue,
    Code::Rdma,
    Code::NicNotFound,
    Code::Internal,
    Code::S3,
    Code::Busy,
    Code::DmabufNotSupported,
];

/// Calls whose failure init may survive: topology lookups are hints, and a
/// device whose windows cannot be allocated is served with per-transfer
/// registrations.
const TOLERATED: [&str; 3] = ["topology_pci_path", "topology_numa_node", "ibv_alloc_mw"];

#[test]
fn init_survives_the_failure_of_each_call() {
    let world = World::new();
    let baseline = world.platform.counters.snapshot();
    let faults = world.platform.faults.clone();
    let current = Current::new();
    faults.reset();
    current
        .init_with(world.platform(), config(), options())
        .unwrap();
    current.shutdown();
    let plan = calls(&faults.log());
    assert!(plan.len() > 10, "init makes its calls: {plan:?}");
    eprintln!("init: sweeping {} calls", plan.len());
    assert_eq!(world.platform.counters.snapshot(), baseline);
    for (function, k) in plan.into_iter().filter(|(f, _)| !asynchronous(f)) {
        faults.reset();
        faults.fail_nth(function, k);
        match current.init_with(world.platform(), config(), options()) {
            // Topology lookups are hints: without them the choice falls back
            // to NUMA and names.
            Ok(()) if TOLERATED.contains(&function) => current.shutdown(),
            Ok(()) => panic!("init succeeded although call {k} of {function} failed"),
            Err(e) => assert!(DOCUMENTED.contains(&e.code()), "{function}#{k}: {e}"),
        }
        assert!(
            !current.is_initialized(),
            "{function}#{k}: nothing published"
        );
        assert_eq!(
            world.platform.counters.snapshot(),
            baseline,
            "{function}#{k}: leaked"
        );
        faults.clear();
        current
            .init_with(world.platform(), config(), options())
            .unwrap_or_else(|e| panic!("after {function}#{k}: {e}"));
        current.shutdown();
        assert_eq!(
            world.platform.counters.snapshot(),
            baseline,
            "{function}#{k}: teardown leaked"
        );
    }
}

#[test]
fn registration_survives_the_failure_of_each_call() {
    for staged in [false, true] {
        let world = World::with(WorldSpec {
            client: {
                let mut c = WorldSpec::default().client;
                c.supports_dmabuf = !staged;
                c
            },
            ..WorldSpec::default()
        });
        let current = Current::new();
        current
            .init_with(world.platform(), config(), options())
            .unwrap();
        let inst = current.instance().unwrap();
        let faults = world.platform.faults.clone();
        let alloc = world.platform.gpu.alloc_device(0, 65536).unwrap();
        let range = BufferRange::new(alloc.addr(), alloc.len()).unwrap();
        let baseline = world.platform.counters.snapshot();
        faults.reset();
        inst.register(range, false).unwrap();
        inst.deregister(alloc.addr()).unwrap();
        let plan = calls(&faults.log());
        let needed = if staged {
            "hipHostMalloc"
        } else {
            "ibv_reg_dmabuf_mr"
        };
        assert!(
            plan.iter().any(|(f, _)| *f == needed),
            "staged {staged}: the sweep covers {needed}: {plan:?}"
        );
        for (function, k) in plan.into_iter().filter(|(f, _)| !asynchronous(f)) {
            faults.reset();
            faults.fail_nth(function, k);
            if let Err(e) = inst.register(range, false) {
                assert!(DOCUMENTED.contains(&e.code()), "{function}#{k}: {e}");
                assert_eq!(inst.buffer_count(), 0, "{function}#{k}");
            } else {
                // A failed dma-buf export falls back to another way.
                inst.deregister(alloc.addr()).unwrap();
            }
            world.platform.gpu.open_dmabufs();
            assert_eq!(
                world.platform.counters.snapshot(),
                baseline,
                "staged {staged} {function}#{k}: leaked"
            );
            faults.clear();
            inst.register(range, false).unwrap();
            inst.deregister(alloc.addr()).unwrap();
        }
    }
}

#[test]
fn a_transfer_survives_the_failure_of_each_call() {
    for direction in [Direction::Get, Direction::Put] {
        let world = World::new();
        let current = Current::new();
        current
            .init_with(world.platform(), config(), options())
            .unwrap();
        let inst = current.instance().unwrap();
        let faults = world.platform.faults.clone();
        let data: Vec<u8> = (0..8192u32).map(|i| i.to_le_bytes()[0] ^ 0x5a).collect();
        let buf = data.clone().into_boxed_slice();
        let base = buf.as_ptr() as usize;
        inst.register(BufferRange::new(base, 8192).unwrap(), true)
            .unwrap();
        world.server.set_object(&data);
        let op = if direction == Direction::Get {
            Op::Get
        } else {
            Op::Put
        };
        let slice = Slice::new(base, 8192, 0).unwrap();
        // A first transfer establishes the connection; the sweep runs on the
        // second, and each failure may force the next one to reconnect.
        inst.transfer(direction, slice, &mut world.server.session(op))
            .unwrap();
        faults.reset();
        inst.transfer(direction, slice, &mut world.server.session(op))
            .unwrap();
        let reused = calls(&faults.log());
        let functions: Vec<&str> = reused.iter().map(|(f, _)| *f).collect();
        // A reused connection needs no modify: its window grants the access
        // (the proof, the bind and the grant, the final message, the
        // invalidation).
        for needed in ["ibv_post_recv", "ibv_post_send", "ibv_poll_cq"] {
            assert!(
                functions.contains(&needed),
                "{direction:?}: the sweep covers {needed}: {functions:?}"
            );
        }
        eprintln!("{direction:?}: sweeping {} calls", reused.len());
        let pool_size = usize::try_from(options().max_transfers).unwrap();
        for (function, k) in reused {
            faults.reset();
            faults.fail_nth(function, k);
            if let Err(e) = inst.transfer(direction, slice, &mut world.server.session(op)) {
                assert!(
                    DOCUMENTED.contains(&e.code()),
                    "{direction:?} {function}#{k}: {e}"
                );
            }
            let pool = inst.pool();
            assert_eq!(
                pool.free_count() + pool.retired_count(),
                pool_size,
                "{direction:?} {function}#{k}: lost a lease"
            );
            faults.clear();
            world.server.set_object(&data);
            inst.transfer(direction, slice, &mut world.server.session(op))
                .unwrap_or_else(|e| panic!("{direction:?} after {function}#{k}: {e}"));
            assert_eq!(&buf[..], &data[..], "{direction:?} after {function}#{k}");
            assert_eq!(
                world.server.object(8192),
                data,
                "{direction:?} after {function}#{k}"
            );
        }
        inst.deregister(base).unwrap();
        drop(inst);
        current.shutdown();
        world.server.side().forget_disconnected();
        let live = world.platform.counters.snapshot();
        assert!(
            live.iter()
                .all(|(kind, n)| matches!(*kind, "context" | "pd" | "mr") && *n == 1),
            "{direction:?}: only the test server's own objects remain: {live:?}"
        );
    }
}

#[test]
fn a_first_transfer_with_its_handshake_survives_the_failure_of_each_call() {
    let setup = || {
        let world = World::new();
        let current = Current::new();
        current
            .init_with(world.platform(), config(), options())
            .unwrap();
        (world, current)
    };
    let data: Vec<u8> = (0..4096u32).map(|i| i.to_le_bytes()[0]).collect();
    let buf = vec![0u8; 4096].into_boxed_slice();
    let base = buf.as_ptr() as usize;
    let slice = Slice::new(base, 4096, 0).unwrap();
    let plan = {
        let (world, current) = setup();
        let inst = current.instance().unwrap();
        inst.register(BufferRange::new(base, 4096).unwrap(), true)
            .unwrap();
        world.server.set_object(&data);
        world.platform.faults.reset();
        inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
            .unwrap();
        calls(&world.platform.faults.log())
    };
    let functions: Vec<&str> = plan.iter().map(|(f, _)| *f).collect();
    for needed in [
        "rdma_connect",
        "rdma_accept",
        "rdma_init_qp_attr",
        "ibv_modify_qp",
        "ibv_create_cq",
    ] {
        assert!(
            functions.contains(&needed),
            "the handshake sweep covers {needed}: {functions:?}"
        );
    }
    eprintln!("first transfer: sweeping {} calls", plan.len());
    for (function, k) in plan {
        let (world, current) = setup();
        let inst = current.instance().unwrap();
        inst.register(BufferRange::new(base, 4096).unwrap(), true)
            .unwrap();
        world.server.set_object(&data);
        world.platform.faults.reset();
        world.platform.faults.fail_nth(function, k);
        if let Err(e) = inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get)) {
            assert!(DOCUMENTED.contains(&e.code()), "{function}#{k}: {e}");
        }
        let pool = inst.pool();
        assert_eq!(
            pool.free_count() + pool.retired_count(),
            2,
            "{function}#{k}: lost a lease"
        );
        world.platform.faults.clear();
        inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
            .unwrap_or_else(|e| panic!("after {function}#{k}: {e}"));
        assert_eq!(&buf[..], &data[..], "after {function}#{k}");
    }
}

/// A QP transition that fails while a server's connect request is being
/// accepted (the RTR or RTS step, or the attributes before them) fails
/// that transfer only: with one connection in the pool, every later
/// transfer works on it.
#[test]
fn a_failed_transition_at_a_connect_request_leaves_the_connection_usable() {
    let data: Vec<u8> = (0..4096u32).map(|i| i.to_le_bytes()[0] ^ 0x3c).collect();
    for (function, k) in [
        ("ibv_modify_qp", 1),
        ("ibv_modify_qp", 2),
        ("rdma_init_qp_attr", 1),
        ("rdma_init_qp_attr", 2),
    ] {
        let world = World::new();
        let current = Current::new();
        let one = Options {
            max_transfers: 1,
            ..options()
        };
        current.init_with(world.platform(), config(), one).unwrap();
        let inst = current.instance().unwrap();
        let buf = vec![0u8; 4096].into_boxed_slice();
        let base = buf.as_ptr() as usize;
        inst.register(BufferRange::new(base, 4096).unwrap(), true)
            .unwrap();
        let slice = Slice::new(base, 4096, 0).unwrap();
        world.server.set_object(&data);
        let faults = &world.platform.faults;
        faults.fail_nth(function, faults.calls(function) + k);
        let first = inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get));
        assert!(first.is_err(), "{function}#{k}: the failure was not hit");
        faults.clear();
        for attempt in 0..3 {
            inst.transfer(Direction::Get, slice, &mut world.server.session(Op::Get))
                .unwrap_or_else(|e| panic!("{function}#{k}, transfer {attempt} after: {e}"));
        }
        assert_eq!(&buf[..], &data[..]);
        assert_eq!(inst.pool().retired_count(), 0, "{function}#{k}");
    }
}
