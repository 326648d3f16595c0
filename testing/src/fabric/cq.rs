//! Completion queues: completions queued in order, the completion channel,
//! and completions held back to be written late.
//!
//! Hardware rules: a CQ holds its depth, and one that overflows reports an
//! overrun on every later poll; an armed CQ makes its channel readable at
//! the next completion; a CQ that QPs still use cannot be destroyed (the
//! destroy fails and the CQ leaks); a device may write completions late,
//! after a drain, a timeout or a reset ([`Fabric::hold_completions`]).

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use super::context::FakeContext;
use super::{gone, Fabric, QpKey, State};
use hipobj::error::{Error, Result};
use hipobj::platform::{Completion, Cq, Waker, WcOpcode, WcStatus};

pub(super) struct CqRec {
    pub(super) device: usize,
    pub(super) depth: usize,
    /// Armed (`ibv_req_notify_cq`): the next completion makes the channel
    /// readable.
    pub(super) armed: bool,
    /// The completion channel.
    pub(super) channel: Arc<Waker>,
    /// Completions, each with its simulated time (0 without a model).
    pub(super) entries: VecDeque<(Completion, u64)>,
    /// A completion found the queue full and was lost (sticky).
    pub(super) overrun: bool,
    /// QPs that use this CQ.
    pub(super) users: usize,
}

pub(super) fn completion(qp: QpKey, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Completion {
    Completion {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
        invalidated: None,
        qp_num: qp.1,
        vendor_err: 0,
    }
}

impl State {
    /// Queues a completion on `cq` (or holds it back), or marks the CQ
    /// overrun when it is full.
    pub(super) fn push(&mut self, cq: u64, c: Completion) {
        self.push_at(cq, c, 0);
    }

    /// [`State::push`] of a completion of simulated time `at`.
    pub(super) fn push_at(&mut self, cq: u64, c: Completion, at: u64) {
        let device = self.cqs.get(&cq).map(|c| c.device);
        if let Some(d) = device.and_then(|d| self.devices.get_mut(d)) {
            d.traffic.completions += 1;
        }
        if device.is_some_and(|d| self.hold.contains(&d)) {
            self.held.push((cq, c));
        } else {
            self.queue(cq, c, at);
        }
    }

    pub(super) fn queue(&mut self, cq: u64, c: Completion, at: u64) {
        if let Some(cq) = self.cqs.get_mut(&cq) {
            if cq.entries.len() >= cq.depth {
                cq.overrun = true;
            } else {
                cq.entries.push_back((c, at));
            }
            if std::mem::take(&mut cq.armed) {
                cq.channel.wake();
            }
        }
    }
}

/// A completion queue.
pub(super) struct FakeCq {
    pub(super) fabric: Arc<Fabric>,
    pub(super) ctx: Arc<FakeContext>,
    pub(super) id: u64,
    pub(super) channel: Arc<Waker>,
}

impl Cq for FakeCq {
    fn poll(&self, max: usize) -> Result<Vec<Completion>> {
        self.fabric.check("ibv_poll_cq")?;
        let mut st = self.fabric.state.lock();
        let cq = st.cqs.get_mut(&self.id).ok_or_else(gone)?;
        if cq.overrun {
            return Err(Error::Rdma(format!(
                "ibv_poll_cq({}) failed: CQ overrun: more than {} completions were not \
                 polled and some were lost",
                self.ctx.spec.name, cq.depth
            )));
        }
        let n = max.min(cq.entries.len());
        let polled: Vec<(Completion, u64)> = cq.entries.drain(..n).collect();
        let (device, one_qp) = (cq.device, cq.users == 1);
        if let Some(t) = st.timeline.as_mut() {
            for (c, at) in &polled {
                t.polled((device, c.qp_num), *at);
                if one_qp {
                    super::model::saw(self.fabric.id, t.span_id(), *at);
                }
            }
        }
        Ok(polled.into_iter().map(|(c, _)| c).collect())
    }

    /// Checks "ibv_req_notify_cq" first, then "ibv_get_cq_event" whenever it
    /// returns `true`.
    fn wait(&self, deadline: Instant) -> Result<bool> {
        self.fabric.check("ibv_req_notify_cq")?;
        let mut st = self.fabric.state.lock();
        let ready = |st: &State| {
            st.cqs
                .get(&self.id)
                .is_none_or(|c| c.overrun || !c.entries.is_empty())
        };
        while !ready(&st) {
            if self
                .fabric
                .completions
                .wait_until(&mut st, deadline)
                .timed_out()
            {
                if ready(&st) {
                    break;
                }
                return Ok(false);
            }
        }
        drop(st);
        self.fabric.check("ibv_get_cq_event")?;
        Ok(true)
    }

    /// Checks "ibv_req_notify_cq".
    fn arm(&self) -> Result<()> {
        self.fabric.check("ibv_req_notify_cq")?;
        if let Some(cq) = self.fabric.state.lock().cqs.get_mut(&self.id) {
            cq.armed = true;
        }
        Ok(())
    }

    fn channel_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// Checks "ibv_get_cq_event".
    fn take_events(&self) -> Result<usize> {
        self.fabric.check("ibv_get_cq_event")?;
        Ok(usize::from(self.channel.take()))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeCq {
    fn drop(&mut self) {
        let mut st = self.fabric.state.lock();
        let users = st.cqs.get(&self.id).map_or(0, |c| c.users);
        if users > 0 {
            drop(st);
            self.fabric.destroy_failed(format_args!(
                "ibv_destroy_cq on {} failed: Device or resource busy ({users} QPs use it)",
                self.ctx.spec.name
            ));
            return;
        }
        st.cqs.remove(&self.id);
        drop(st);
        self.fabric.counters.destroyed("cq");
    }
}

#[cfg(test)]
mod tests {
    use super::super::support::*;
    use hipobj::platform::{QpState, RecvWr};

    #[test]
    fn a_full_cq_reports_overrun() {
        let (_f, a, b) = pair();
        let small = a.ctx.create_cq(2).expect("cq");
        let qp = a.pd.create_qp(&small, caps()).expect("qp");
        qp.modify(&init(ALL)).expect("INIT");
        qp.modify(&state(QpState::Err)).expect("ERR");
        for id in 0..3 {
            qp.post_recv(RecvWr {
                wr_id: id,
                sge: None,
            })
            .expect("post");
        }
        let err = small.poll(8).expect_err("overrun");
        assert!(err.to_string().contains("overrun"), "{err}");
        drop(b);
    }
}
