//! Whole transfers on a modelled 400 Gb/s link (the fake fabric in
//! simulated time: 48.5 GB/s a port, 28 GB/s a queue pair, 3 µs round
//! trip; `testing/src/fabric/model.rs`), with the test server in process:
//! what the protocol's messages and one queue pair's cap cost a transfer on
//! a fast NIC, whatever this machine's CPUs do.
//!
//! Run: `cargo bench --bench model`. Figures are printed, never asserted;
//! `docs/performance.md` records them. The span of a transfer is its
//! fabric time alone: from the first message (the server's proof) to the
//! last completion; the library's own CPU time per transfer is what
//! `benches/transfer.rs` measures.

use std::time::Duration;

use hipobj::core::transfer::Direction;
use hipobj::core::Options;
use hipobj_testing::fabric::LinkModel;
use hipobj_testing::world::{HostClient, World, WorldSpec};

const GIB: usize = 1 << 30;

struct Setup {
    world: World,
    client: HostClient,
}

impl Setup {
    /// A client on the modelled link whose transfers move over at most
    /// `stripes` connections (from 4 MiB on, the default threshold).
    fn new(len: usize, stripes: usize) -> Setup {
        let world = World::with(WorldSpec {
            server_bytes: len,
            ..WorldSpec::hardware()
        });
        world
            .platform
            .fabric
            .model_link(Some(LinkModel::pollara_400()));
        let options = Options {
            completion_timeout: Duration::from_secs(30),
            max_transfers: 16,
            stripes: Some(stripes),
            ..Options::default()
        };
        let client = HostClient::new(&world, options, len).expect("a client");
        Setup { world, client }
    }

    /// `streams` GETs of `len` bytes each at once, each from its own
    /// thread on its own connection (established by a GET before); the
    /// span of all of them in simulated time.
    fn span(&self, streams: usize, len: usize) -> (Duration, u64) {
        self.world
            .model_span(streams, |i| {
                self.client
                    .transfer(&self.world.server, Direction::Get, i * len, len)
                    .expect("transfer");
            })
            .expect("a span")
    }
}

fn report(what: &str, (span, bytes): (Duration, u64)) {
    let secs = span.as_secs_f64();
    println!(
        "{what:<52} {:>10.2} µs  {:>6.2} GB/s",
        secs * 1e6,
        bytes as f64 / secs / 1e9
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let model = LinkModel::pollara_400();
    println!(
        "modelled link: {:.1} GB/s a port, {:.1} GB/s a queue pair, {:?} round trip",
        model.link_bytes_per_sec / 1e9,
        model.qp_bytes_per_sec / 1e9,
        model.rtt
    );
    let small = Setup::new(16 << 20, 1);
    report("8-byte GET, reused connection", small.span(1, 8));
    report("64 KiB GET, reused connection", small.span(1, 64 << 10));
    report("1 MiB GET, reused connection", small.span(1, 1 << 20));
    report("4 MiB GET, reused connection", small.span(1, 4 << 20));
    report("16 MiB GET, reused connection", small.span(1, 16 << 20));
    report(
        "16 GETs of 1 MiB at once, one connection each",
        small.span(16, 1 << 20),
    );
    drop(small);
    let striped = Setup::new(16 << 20, 4);
    report(
        "4 MiB GET striped over 4 connections",
        striped.span(1, 4 << 20),
    );
    report(
        "16 MiB GET striped over 4 connections",
        striped.span(1, 16 << 20),
    );
    drop(striped);
    let big = Setup::new(GIB, 1);
    report("1 GiB GET, one connection", big.span(1, GIB));
    report(
        "4 GETs of 256 MiB at once, one connection each",
        big.span(4, GIB / 4),
    );
    report(
        "8 GETs of 128 MiB at once, one connection each",
        big.span(8, GIB / 8),
    );
    drop(big);
    for stripes in [2, 4, 8] {
        let big = Setup::new(GIB, stripes);
        report(
            &format!("1 GiB GET striped over {stripes} connections"),
            big.span(1, GIB),
        );
    }
}
