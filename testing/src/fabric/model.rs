//! A modelled link: the fabric's transfers timed in simulated time, at the
//! rates and round trip of a real NIC ([`LinkModel`]), while the bytes move
//! as always (at memory speed, in the posting thread).
//!
//! The model, where [`Fabric::model_link`] sets one:
//!
//! - every device has one full-duplex port: a message's bytes hold the
//!   sender's transmit side and the receiver's receive side for
//!   `bytes / link rate`, one message after another in the order the
//!   fabric executes them. A message of one packet or less (a proof, a
//!   grant, a final message) does not wait for the port: on a real link it
//!   slips in between another message's packets;
//! - a queue pair moves at most `queue pair rate`: its next message starts
//!   when its previous one is done, so one QP cannot fill a link faster
//!   than that, and several share the link (what striping is for);
//! - a message is done when both its QP and the link have moved it; it
//!   reaches the responder half a round trip later, and its requester's
//!   completion (the ACK, or a READ's data) a whole round trip later;
//! - a window's bind or invalidation completes when it is executed;
//! - simulated time is causal: what is posted on a QP starts no earlier
//!   than the last completion polled for that QP, nor than the poster's
//!   own clock: the latest completion it polled from a CQ that serves one
//!   QP (a thread new to the fabric starts at the latest completion any
//!   thread polled). A CQ that serves several QPs (the client's pool)
//!   multiplexes independent streams, which real time orders differently
//!   from simulated time (every byte is copied under one lock), so its
//!   poller reacts to each stream at that stream's own time. CPU time is
//!   not in the model: the span of a transfer is its fabric time alone.
//!
//! [`Fabric::model_span`] is the simulated time from the first message
//! started to the last completion polled since [`Fabric::model_reset`].
//!
//! [`Fabric::model_link`]: super::Fabric::model_link
//! [`Fabric::model_span`]: super::Fabric::model_span
//! [`Fabric::model_reset`]: super::Fabric::model_reset

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use super::QpKey;

/// The rates and the round trip of a modelled NIC.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    /// A port's rate, each way, in bytes per second.
    pub link_bytes_per_sec: f64,
    /// The most one queue pair moves, in bytes per second.
    pub qp_bytes_per_sec: f64,
    /// The round trip between two ports.
    pub rtt: Duration,
}

impl LinkModel {
    /// A 400 Gb/s RoCE NIC as measured on AMD Pensando Pollara 400 (ROCm's
    /// mori): about 48.5 GB/s a port, one queue pair capped near 28 GB/s,
    /// 3 µs round trip.
    pub fn pollara_400() -> LinkModel {
        LinkModel {
            link_bytes_per_sec: 48.5e9,
            qp_bytes_per_sec: 28e9,
            rtt: Duration::from_micros(3),
        }
    }
}

std::thread_local! {
    /// This thread's simulated time on one fabric: (the fabric's id, the
    /// span it belongs to, ns), the latest completion it polled there.
    static CLOCK: Cell<(u64, u64, u64)> = const { Cell::new((0, 0, 0)) };
}

/// This thread's simulated time on fabric `fabric` in span `span` (ns): a
/// thread new to the fabric, or to the span, starts at `horizon` (the
/// latest completion any thread had polled when the span began): the
/// threads that start a span start it together.
pub(super) fn now(fabric: u64, span: u64, horizon: u64) -> u64 {
    CLOCK.with(|c| {
        let (id, of, at) = c.get();
        if (id, of) == (fabric, span) {
            at
        } else {
            c.set((fabric, span, horizon));
            horizon
        }
    })
}

/// This thread polled a completion of simulated time `at` (ns) on fabric
/// `fabric` in span `span`.
pub(super) fn saw(fabric: u64, span: u64, at: u64) {
    CLOCK.with(|c| {
        let (id, of, before) = c.get();
        let before = if (id, of) == (fabric, span) {
            before
        } else {
            0
        };
        c.set((fabric, span, before.max(at)));
    });
}

/// The largest message that slips in between another's packets: one
/// 4 KiB packet.
const PACKET: u64 = 4096;

fn nanos(bytes: u64, per_sec: f64) -> u64 {
    // Rates are positive and far below 2^53 bytes per second.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let ns = (bytes as f64 * 1e9 / per_sec).ceil() as u64;
    ns
}

/// When a message was executed: it reaches the responder at `arrives`;
/// its requester's completion is at `acked`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Timing {
    pub(super) arrives: u64,
    pub(super) acked: u64,
}

/// The model's state: when each queue pair and each port side is free.
pub(super) struct Timeline {
    model: LinkModel,
    qp_free: HashMap<QpKey, u64>,
    /// The latest completion polled for each QP.
    qp_clock: HashMap<QpKey, u64>,
    tx_free: HashMap<usize, u64>,
    rx_free: HashMap<usize, u64>,
    /// The first start and the last completion polled since the reset.
    first: Option<u64>,
    last: u64,
    /// The last completion polled ever.
    horizon: u64,
    /// The horizon when the present span began.
    began: u64,
    /// How many spans began ([`Timeline::reset`]).
    spans: u64,
    /// Payload bytes moved since the reset.
    bytes: u64,
}

impl Timeline {
    pub(super) fn new(model: LinkModel) -> Timeline {
        Timeline {
            model,
            qp_free: HashMap::new(),
            qp_clock: HashMap::new(),
            tx_free: HashMap::new(),
            rx_free: HashMap::new(),
            first: None,
            last: 0,
            horizon: 0,
            began: 0,
            spans: 0,
            bytes: 0,
        }
    }

    /// The present span's number.
    pub(super) fn span_id(&self) -> u64 {
        self.spans
    }

    /// When the present span began: the latest completion any thread
    /// had polled then.
    pub(super) fn began(&self) -> u64 {
        self.began
    }

    fn start(&mut self, at: u64) {
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
    }

    /// A message of `len` bytes on `qp`, posted at `posted`, whose bytes
    /// go from device `from` to device `to`.
    pub(super) fn message(
        &mut self,
        qp: QpKey,
        from: usize,
        to: usize,
        len: u32,
        posted: u64,
    ) -> Timing {
        let len = u64::from(len);
        let start = posted.max(self.qp_free.get(&qp).copied().unwrap_or(0));
        let qp_done = start + nanos(len, self.model.qp_bytes_per_sec);
        let done = if len <= PACKET {
            qp_done
        } else {
            let tx = self.tx_free.get(&from).copied().unwrap_or(0);
            let rx = self.rx_free.get(&to).copied().unwrap_or(0);
            let on_link = start.max(tx).max(rx);
            let link_done = on_link + nanos(len, self.model.link_bytes_per_sec);
            self.tx_free.insert(from, link_done);
            self.rx_free.insert(to, link_done);
            qp_done.max(link_done)
        };
        self.qp_free.insert(qp, done);

        self.start(start);
        self.bytes += len;
        let rtt = u64::try_from(self.model.rtt.as_nanos()).unwrap_or(u64::MAX);
        Timing {
            arrives: done + rtt / 2,
            acked: done + rtt,
        }
    }

    /// A local operation (a window's bind or invalidation) on `qp`, posted
    /// at `posted`: done when the QP gets to it.
    pub(super) fn local(&mut self, qp: QpKey, posted: u64) -> u64 {
        let at = posted.max(self.qp_free.get(&qp).copied().unwrap_or(0));

        self.qp_free.insert(qp, at);
        self.start(at);
        at
    }

    /// When a thread whose own clock is `thread` posts on `qp`.
    pub(super) fn posted(&self, qp: QpKey, thread: u64) -> u64 {
        thread.max(self.qp_clock.get(&qp).copied().unwrap_or(0))
    }

    /// A completion of `qp` of time `at` was polled.
    pub(super) fn polled(&mut self, qp: QpKey, at: u64) {
        let clock = self.qp_clock.entry(qp).or_insert(0);
        *clock = (*clock).max(at);
        self.last = self.last.max(at);
        self.horizon = self.horizon.max(at);
    }

    /// From the first start to the last completion polled, and the bytes
    /// moved, since the reset.
    pub(super) fn span(&self) -> Option<(Duration, u64)> {
        let first = self.first?;
        Some((
            Duration::from_nanos(self.last.saturating_sub(first)),
            self.bytes,
        ))
    }

    /// Begins a new span: every thread's clock starts again at the
    /// horizon (the queue pairs and ports stay as busy as they are).
    pub(super) fn reset(&mut self) {
        self.spans += 1;
        self.began = self.horizon;
        self.first = None;
        self.last = 0;
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u32 = 1 << 30;

    fn rate(bytes: u64, ns: u64) -> f64 {
        bytes as f64 / ns as f64
    }

    #[test]
    fn one_queue_pair_moves_at_its_own_cap() {
        let mut t = Timeline::new(LinkModel::pollara_400());
        let m = t.message((0, 17), 0, 1, GIB, 0);
        // 1 GiB at 28 GB/s, then the ACK's round trip.
        let gbps = rate(u64::from(GIB), m.acked - 3000);
        assert!((27.9..=28.0).contains(&gbps), "{gbps} GB/s");
        assert_eq!(m.acked - m.arrives, 1500);
    }

    #[test]
    fn four_queue_pairs_share_the_link() {
        let mut t = Timeline::new(LinkModel::pollara_400());
        // 64 KiB chunks round-robin over four QPs, as a striped transfer
        // posts them.
        let chunk = 64 << 10;
        let mut last = 0;
        for i in 0..(GIB / chunk) {
            let qp = (0, 17 + i % 4);
            last = last.max(t.message(qp, 0, 1, chunk, 0).acked);
        }
        let gbps = rate(u64::from(GIB), last - 3000);
        assert!((48.0..=48.5).contains(&gbps), "{gbps} GB/s");
    }

    #[test]
    fn a_queue_pair_waits_for_its_poster_and_the_port_for_other_traffic() {
        let mut t = Timeline::new(LinkModel::pollara_400());
        let small = t.message((0, 17), 0, 1, 8, 10_000);
        assert_eq!(small.arrives, 10_000 + 1 + 1500);
        // The receiving port is busy with another QP's 1 MiB: a second
        // message to it waits for the link, a packet does not.
        let big = t.message((2, 40), 2, 1, 1 << 20, 0);
        let next = t.message((0, 18), 0, 1, 1 << 20, 0);
        assert!(next.arrives > big.arrives);
        let proof = t.message((0, 19), 0, 1, 52, 0);
        assert_eq!(proof.arrives, 2 + 1500);
        assert_eq!(t.local((0, 17), 5), 10_000 + 1);
    }
}
