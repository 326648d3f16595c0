//! The wire between queue pairs: routing a request to its responder, PSNs,
//! retransmission, and the responder's checks before it executes a request
//! and moves its bytes.
//!
//! Hardware rules (in the order of rxe_resp.c): a request reaches whichever
//! QP in RTR or RTS its address vector and destination QP number name, from
//! any sender, as RoCE authenticates no source; a request that reaches no
//! one is retried (`retry_cnt` 7 forever, otherwise `RETRY_EXC_ERR`); PSNs
//! are 24-bit, one per path-MTU packet: a duplicate is ACKed and not
//! executed, one ahead is retried; the responder checks its QP's access
//! flags, `max_msg_sz`, a receive for what consumes one (RNR otherwise),
//! READ credit, equal path MTUs for multi-packet messages, then the rkey
//! (not for a zero-length request), and a remote error puts both QPs in
//! ERR; WRITE and READ complete only on the requester.

use super::super::memory;
use super::cq::completion;
use super::mr::Place;
use super::qp::{ConnAttrs, Kind, Pending};
use super::{to_usize, DeviceMemory, QpKey, State, PSN_MASK};
use hipobj::platform::{AsyncKind, Completion, Mtu, QpState, WcOpcode, WcStatus};

/// Half the PSN space: a PSN this far or farther "ahead" is really behind.
const PSN_HALF: u32 = 1 << 23;

/// What became of the work request at the head of a send queue.
pub(super) enum Outcome {
    /// Completed successfully; the completion, if signaled.
    Done(Option<Completion>),
    /// Completed with this error; the QP goes to ERR.
    Fail(WcStatus),
    /// Waiting: retransmitted whenever the fabric changes.
    Stall,
}

/// Packets of a `len`-byte message at `mtu` (at least one).
fn packets(len: u32, mtu: Mtu) -> u32 {
    len.div_ceil(mtu.bytes()).max(1)
}

/// Copies `len` bytes, through `runtime` where a side is a real GPU's
/// memory; `false` if a side is missing or out of its span.
fn transfer(
    runtime: Option<&dyn DeviceMemory>,
    dst: Option<Place>,
    src: Option<Place>,
    len: u32,
) -> bool {
    if len == 0 {
        return true;
    }
    let via = |d: usize, s: usize, n: usize| runtime.is_some_and(|r| r.copy(d, s, n));
    match (dst, src) {
        (Some((dst, dst_off)), Some((src, src_off))) => {
            memory::copy_via(&via, dst, dst_off, src, src_off, to_usize(len))
        }
        _ => false,
    }
}

impl State {
    /// The responder a request from `a` reaches, if any: the QP named by
    /// `a`'s AV and `dest_qp_num`, in RTR or RTS, over ports that are up.
    /// Who sent it does not matter (RoCE checks no source); the PSN is
    /// checked on delivery.
    fn route(&self, a: QpKey) -> Option<QpKey> {
        let qp = self.qps.get(&a)?;
        let src = self.devices.get(a.0)?;
        src.spec.port_active.then_some(())?;
        src.gids
            .get(usize::from(qp.attrs.sgid_index))
            .filter(|gid| **gid != [0u8; 16])?;
        let dgid = qp.attrs.av_dgid.filter(|gid| *gid != [0u8; 16])?;
        let device = self
            .devices
            .iter()
            .position(|d| d.spec.port_active && d.gids.contains(&dgid))?;
        let b = (device, qp.attrs.dest_qp_num);
        let responder = self.qps.get(&b)?;
        matches!(responder.state, QpState::Rtr | QpState::Rts).then_some(b)
    }

    /// Runs every send queue until nothing moves.
    pub(super) fn progress(&mut self) {
        loop {
            let ready: Vec<QpKey> = self
                .qps
                .iter()
                .filter(|(_, q)| q.state == QpState::Rts && !q.sends.is_empty())
                .map(|(k, _)| *k)
                .collect();
            let mut moved = false;
            for key in ready {
                while self.step(key) {
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// Tries the head of `key`'s send queue; whether it completed.
    fn step(&mut self, key: QpKey) -> bool {
        let Some(head) = self.qps.get(&key).and_then(|q| q.sends.front().copied()) else {
            return false;
        };
        self.stamp = 0;
        let outcome = match self.execute_head(key) {
            None | Some(Outcome::Stall) => return false,
            Some(outcome) => outcome,
        };
        let stamp = std::mem::take(&mut self.stamp);
        let Some(qp) = self.qps.get_mut(&key) else {
            return true;
        };
        if qp.sends.front().map(|p| p.seq) != Some(head.seq) {
            // The request was flushed meanwhile (a QP looped back to itself
            // and went to ERR): its completion is already queued.
            return true;
        }
        qp.sends.pop_front();
        let cq = qp.cq;
        match outcome {
            Outcome::Done(c) => {
                if let Some(c) = c {
                    self.push_at(cq, c, stamp);
                }
            }
            Outcome::Fail(status) => {
                let c = completion(key, head.wr.wr_id, status, head.wr.kind.opcode());
                self.push(cq, c);
                self.enter_error(key);
            }
            Outcome::Stall => {}
        }
        true
    }

    /// Executes (or retransmits) the request at the head of `a`'s send
    /// queue; `None` when there is nothing to do.
    fn execute_head(&mut self, a: QpKey) -> Option<Outcome> {
        let qp = self.qps.get(&a)?;
        if qp.state != QpState::Rts {
            return None;
        }
        let head = *qp.sends.front()?;
        let attrs = qp.attrs;
        let wr = head.wr;
        match wr.kind {
            Kind::Bind { .. } | Kind::LocalInv { .. } => {
                if let Some(t) = self.timeline.as_mut() {
                    self.stamp = t.local(a, head.posted);
                }
                return Some(match wr.kind {
                    Kind::LocalInv { rkey } => self.local_inv(a, wr, rkey),
                    _ => self.bind_mw(a, wr),
                });
            }
            _ => {}
        }
        let len = wr.sge.map_or(0, |s| s.len);
        if self
            .devices
            .get(a.0)
            .is_some_and(|d| len > d.spec.max_msg_sz)
        {
            return Some(Outcome::Fail(WcStatus::LocLenErr));
        }
        let local = match wr.sge {
            Some(sge) if sge.len > 0 => match self.local_place(a, sge, wr.kind.is_read()) {
                Some(place) => Some(place),
                None => return Some(Outcome::Fail(WcStatus::LocProtErr)),
            },
            _ => None,
        };
        if wr.kind.is_read() && attrs.max_rd_atomic == 0 {
            // No READ credit: the request never leaves (rxe, P7).
            return Some(Outcome::Stall);
        }
        let npkts = packets(len, attrs.path_mtu.unwrap_or(Mtu::Mtu256));
        let psn = match head.psn {
            Some(psn) => psn,
            None => {
                let qp = self.qps.get_mut(&a)?;
                let psn = qp.next_psn;
                qp.next_psn = psn.wrapping_add(npkts) & PSN_MASK;
                qp.sends.front_mut()?.psn = Some(psn);
                psn
            }
        };
        Some(self.deliver(a, attrs, head, local, psn, npkts))
    }

    /// The responder's side of a request from `a` with PSN `psn`.
    fn deliver(
        &mut self,
        a: QpKey,
        attrs: ConnAttrs,
        head: Pending,
        local: Option<Place>,
        psn: u32,
        npkts: u32,
    ) -> Outcome {
        let (wr, posted) = (head.wr, head.posted);
        let len = wr.sge.map_or(0, |s| s.len);
        let retry = || {
            if attrs.retry_cnt == 7 {
                Outcome::Stall
            } else {
                Outcome::Fail(WcStatus::RetryExcErr)
            }
        };
        let success = || {
            wr.signaled.then(|| Completion {
                byte_len: if wr.kind.is_read() { len } else { 0 },
                ..completion(a, wr.wr_id, WcStatus::Success, wr.kind.opcode())
            })
        };
        let Some(b) = self.route(a) else {
            return retry();
        };
        let Some(responder) = self.qps.get(&b) else {
            return retry();
        };
        let (b_attrs, b_cq) = (responder.attrs, responder.cq);
        let first_recv = responder.recvs.front().copied();

        // PSN check (rxe_resp.c check_psn).
        let diff = psn.wrapping_sub(responder.expected_psn) & PSN_MASK;
        if diff != 0 {
            if diff >= PSN_HALF && !wr.kind.is_read() {
                // A duplicate: ACKed again, not executed (P1). A duplicate
                // READ finds no cached response and is dropped.
                return Outcome::Done(success());
            }
            // Ahead: NAK sequence error, then retransmissions (P2).
            return retry();
        }
        // The QP must allow the operation (rxe's check_op_valid: an
        // unsupported opcode, NAKed as an invalid request).
        let remote = wr.kind.remote();
        if let Some((_, _, need)) = remote {
            if !b_attrs.access.contains(need) {
                self.remote_error(b, AsyncKind::QpReqErr);
                return Outcome::Fail(WcStatus::RemInvReqErr);
            }
        }
        if self
            .devices
            .get(b.0)
            .is_some_and(|d| len > d.spec.max_msg_sz)
        {
            self.remote_error(b, AsyncKind::QpReqErr);
            return Outcome::Fail(WcStatus::RemInvReqErr);
        }
        // Resources (check_resource): a receive, or READ credit.
        if wr.kind.consumes_receive() && first_recv.is_none() {
            return if attrs.rnr_retry == 7 {
                Outcome::Stall
            } else {
                Outcome::Fail(WcStatus::RnrRetryExcErr)
            };
        }
        if wr.kind.is_read() && b_attrs.max_dest_rd_atomic == 0 {
            self.remote_error(b, AsyncKind::QpReqErr);
            return Outcome::Fail(WcStatus::RemInvReqErr);
        }
        // Length (check_length): first and middle packets must be exactly
        // the responder's path MTU.
        if npkts > 1 && b_attrs.path_mtu != attrs.path_mtu {
            self.remote_error(b, AsyncKind::QpReqErr);
            return Outcome::Fail(WcStatus::RemInvReqErr);
        }
        // rkey, unless zero-length (C9-88).
        let target = match remote {
            Some((addr, rkey, need)) if len > 0 => {
                match self.remote_place(b, rkey, addr, len, need) {
                    Some(place) => Some(place),
                    None => {
                        self.remote_error(b, AsyncKind::QpAccessErr);
                        return Outcome::Fail(WcStatus::RemAccessErr);
                    }
                }
            }
            _ => None,
        };

        // A leaked registration is reached as on hardware; its memory,
        // which the test may have freed, is not touched.
        let leaked = match remote {
            Some((_, rkey, _)) if len > 0 && self.reaches_leaked(b, rkey) => {
                self.leaked_reached += 1;
                true
            }
            _ => false,
        };

        // Execute.
        let copied = match wr.kind {
            Kind::Write { .. } | Kind::WriteImm { .. } if leaked => true,
            Kind::Read { .. } if leaked => true,
            Kind::Write { .. } | Kind::WriteImm { .. } => {
                transfer(self.device_memory.as_deref(), target, local, len)
            }
            Kind::Read { .. } => transfer(self.device_memory.as_deref(), local, target, len),
            Kind::Send { .. } => {
                let recv = first_recv.map(|r| (r.wr_id, r.sge));
                let Some((recv_id, recv_sge)) = recv else {
                    return retry();
                };
                let fail_recv = |st: &mut State, status: WcStatus| {
                    if let Some(q) = st.qps.get_mut(&b) {
                        q.recvs.pop_front();
                    }
                    st.push(b_cq, completion(b, recv_id, status, WcOpcode::Recv));
                    st.enter_error(b);
                };
                let placed = if len > 0 {
                    let Some(sge) = recv_sge.filter(|s| s.len >= len) else {
                        fail_recv(self, WcStatus::LocLenErr);
                        return Outcome::Fail(WcStatus::RemInvReqErr);
                    };
                    let Some(dst) = self.local_place(b, sge, true) else {
                        fail_recv(self, WcStatus::LocProtErr);
                        return Outcome::Fail(WcStatus::RemOpErr);
                    };
                    transfer(self.device_memory.as_deref(), Some(dst), local, len)
                } else {
                    true
                };
                // A SEND with invalidate: the responder's window goes after
                // the data is placed (rxe_resp.c execute; class J when the
                // rkey names no window this QP may invalidate).
                if let (
                    true,
                    Kind::Send {
                        inv: Some(rkey), ..
                    },
                ) = (placed, wr.kind)
                {
                    if !self.remote_inv(b, rkey) {
                        fail_recv(self, WcStatus::RemInvReqErr);
                        return Outcome::Fail(WcStatus::RemInvReqErr);
                    }
                }
                placed
            }
            Kind::Bind { .. } | Kind::LocalInv { .. } => true,
        };
        if !copied {
            self.remote_error(b, AsyncKind::QpAccessErr);
            return Outcome::Fail(WcStatus::RemAccessErr);
        }
        // Timed on the modelled link: a READ's bytes come back from the
        // responder, everything else's go to it.
        let timing = self.timeline.as_mut().map(|t| {
            let (from, to) = if wr.kind.is_read() {
                (b.0, a.0)
            } else {
                (a.0, b.0)
            };
            t.message(a, from, to, len, posted)
        });
        self.stamp = timing.map_or(0, |t| t.acked);
        if let Some(recv) = first_recv.filter(|_| wr.kind.consumes_receive()) {
            if let Some(q) = self.qps.get_mut(&b) {
                q.recvs.pop_front();
            }
            let (opcode, imm, invalidated) = match wr.kind {
                Kind::WriteImm { imm, .. } => (WcOpcode::RecvRdmaWithImm, Some(imm), None),
                Kind::Send { imm, inv } => (WcOpcode::Recv, imm, inv),
                _ => (WcOpcode::Recv, None, None),
            };
            let c = Completion {
                byte_len: len,
                imm,
                invalidated,
                ..completion(b, recv.wr_id, WcStatus::Success, opcode)
            };
            self.push_at(b_cq, c, timing.map_or(0, |t| t.arrives));
        }
        if let Some(q) = self.qps.get_mut(&b) {
            q.expected_psn = psn.wrapping_add(npkts) & PSN_MASK;
        }
        Outcome::Done(success())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::support::*;
    use super::*;
    use hipobj::platform::{QpState, WcOpcode};

    #[test]
    fn retry_count_7_never_gives_up_and_delivers_after_rtr() {
        let (_f, mut a, b) = pair();
        pattern(&mut a.buf[..4096], 9);
        let link = Link {
            retry_cnt: 7,
            ..Link::default()
        };
        aim_a(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 4096, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert!(!a.cq.wait(Instant::now()).expect("wait"));
        assert!(a.poll().is_empty(), "still outstanding");
        assert_eq!(a.state(), QpState::Rts);
        // B reaches RTR only: that is enough for the retransmission to land.
        let rq_psn = A_SQ_PSN;
        b.qp.modify(&rtr(&a, rq_psn, Mtu::Mtu1024, 4))
            .expect("B RTR");
        let done = a.poll();
        assert_eq!(statuses(&done), [WcStatus::Success]);
        assert_eq!(done[0].opcode, WcOpcode::RdmaWrite);
        assert_eq!(b.buf[..4096], a.buf[..4096]);
        assert!(b.poll().is_empty());
    }

    #[test]
    fn duplicate_psn_acks_without_landing() {
        let (_f, mut a, b) = pair();
        pattern(&mut a.buf[..4096], 1);
        let link = Link {
            b_rq_psn_offset: 300,
            ..Link::default()
        };
        connect(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 4096, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success], "ACKed");
        assert!(b.buf[..4096].iter().all(|&x| x == 0), "but nothing landed");
        // A duplicate READ finds no cached response and is dropped.
        a.qp.post_send(&[read(&a, 8192, 16, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RetryExcErr]);
    }

    #[test]
    fn psn_ahead_fails_the_requester() {
        let (_f, mut a, b) = pair();
        pattern(&mut a.buf[..4096], 2);
        let link = Link {
            b_rq_psn_offset: PSN_MASK + 1 - 256,
            ..Link::default()
        };
        connect(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 4096, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RetryExcErr]);
        assert!(b.buf[..4096].iter().all(|&x| x == 0));
        assert_eq!(a.state(), QpState::Err);
    }

    #[test]
    fn mtu_mismatch_breaks_only_multi_packet_writes() {
        let (_f, mut a, b) = pair();
        pattern(&mut a.buf[..KIB64 as usize], 3);
        let link = Link {
            a_mtu: Mtu::Mtu4096,
            b_mtu: Mtu::Mtu1024,
            ..Link::default()
        };
        connect(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 1024, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success]);
        assert_eq!(b.buf[..1024], a.buf[..1024], "one packet: fine (P5)");
        b.recv(50, None);
        a.qp.post_send(&[write(&a, 0, KIB64, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemInvReqErr], "P4");
        assert_ne!(b.buf[1024..KIB64 as usize], a.buf[1024..KIB64 as usize]);
        assert_eq!(b.state(), QpState::Err, "the responder goes to ERR");
        assert_eq!(statuses(&b.poll()), [WcStatus::WrFlushErr]);
    }

    #[test]
    fn any_sender_with_the_qp_number_and_the_expected_psn_reaches_a_responder() {
        // RoCE authenticates no source: B, connected to C, takes A's
        // packets as soon as their PSN is the one B expects.
        let (f, a, b) = pair();
        let c = End::new(&f, "a");
        b.qp.modify(&rtr(&c, 0x12_3456, Mtu::Mtu1024, 4))
            .expect("B RTR");
        // A's own PSN is half a PSN space "behind" B's: taken for a
        // duplicate, ACKed and not executed (P1).
        let link = Link::default();
        aim_a(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 16, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success]);
        assert!(
            b.buf[..16].iter().all(|&x| x == 0),
            "a wrong PSN lands nothing"
        );
        // D knows B's PSN (sniffed, or 24 bits guessed): its WRITE lands,
        // though B was never connected to it.
        let d = End::new(&f, "a");
        let expected = f.expected_psn("b", b.qp.qp_num()).expect("B's PSN");
        assert_eq!(expected, 0x12_3456);
        d.qp.modify(&rtr(&b, 0, Mtu::Mtu1024, 4)).expect("D RTR");
        d.qp.modify(&rts(expected, link, 4)).expect("D RTS");
        let mut d_buf = d.buf;
        pattern(&mut d_buf[..16], 9);
        let d = End { buf: d_buf, ..d };
        d.qp.post_send(&[write(&d, 0, 16, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&d.poll()), [WcStatus::Success]);
        assert_eq!(&b.buf[..16], &d.buf[..16], "the injected WRITE landed");
        assert_eq!(b.state(), QpState::Rtr);
    }
}
