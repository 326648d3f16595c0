//! The Reliable Connection queue pair: its state machine, its send and
//! receive queues, and the work requests posted to them.
//!
//! Hardware rules: `modify` follows the kernel's RC transition table
//! (required and allowed attributes per transition, the IB ranges of their
//! values) and names the transition and mask bits when it refuses; RESET
//! discards posted work without completions, ERR flushes it with
//! `WR_FLUSH_ERR`, and work posted in ERR is flushed at once; sends need
//! RTS, receives INIT, RTR or RTS; queues have their depths and
//! scatter/gather entries; a QP's CQ is of its device; the device's QP
//! limit gives ENOMEM.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::cq::{completion, FakeCq};
use super::mr::{FakeMr, FakeMw, FakePd};
use super::{gone, to_usize, Fabric, QpKey, State, MAX_QP_WR, MAX_RD_ATOMIC, PSN_MASK};
use hipobj::error::{Error, Result};
use hipobj::platform::{
    mask, Access, Cq, Gid, Mtu, Mw, Qp, QpAttr, QpCaps, QpState, RecvWr, SendOp, SendWr, Sge,
    WcOpcode, WcStatus,
};

/// Most scatter/gather entries per work request (`max_sge`).
const MAX_SGE: u32 = 32;

/// The connection attributes `ibv_modify_qp` sets.
#[derive(Clone, Copy)]
pub(super) struct ConnAttrs {
    pub(super) access: Access,
    pub(super) av_dgid: Option<Gid>,
    pub(super) sgid_index: u8,
    pub(super) path_mtu: Option<Mtu>,
    pub(super) dest_qp_num: u32,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) max_rd_atomic: u8,
}

impl Default for ConnAttrs {
    fn default() -> ConnAttrs {
        ConnAttrs {
            access: Access::empty(),
            av_dgid: None,
            sgid_index: 0,
            path_mtu: None,
            dest_qp_num: 0,
            max_dest_rd_atomic: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        }
    }
}

pub(super) struct QpRec {
    pub(super) pd: u64,
    pub(super) cq: u64,
    caps: QpCaps,
    pub(super) state: QpState,
    pub(super) attrs: ConnAttrs,
    /// PSN of the next new request.
    pub(super) next_psn: u32,
    /// PSN the responder expects next.
    pub(super) expected_psn: u32,
    pub(super) recvs: VecDeque<RecvWr>,
    /// Posted sends that have not completed, oldest first.
    pub(super) sends: VecDeque<Pending>,
    next_seq: u64,
}

/// A send work request converted at post time: it holds ids, never `Arc`s,
/// so nothing is dropped (and no object's `Drop` runs) under the lock.
#[derive(Clone, Copy, Debug)]
pub(super) struct Wr {
    pub(super) wr_id: u64,
    pub(super) signaled: bool,
    pub(super) sge: Option<Sge>,
    pub(super) kind: Kind,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// A SEND, with immediate data when `imm` is set, invalidating the
    /// responder's window `inv` when that is set.
    Send {
        imm: Option<u32>,
        inv: Option<u32>,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    /// `mw` / `mr` are `None` when the objects are not this fabric's.
    Bind {
        mw: Option<u64>,
        mr: Option<u64>,
        /// The window's current rkey as the poster knows it (`ibv_mw.rkey`),
        /// carried beside the new one.
        current: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    },
    LocalInv {
        rkey: u32,
    },
}

impl Kind {
    pub(super) fn opcode(self) -> WcOpcode {
        match self {
            Kind::Write { .. } | Kind::WriteImm { .. } => WcOpcode::RdmaWrite,
            Kind::Send { .. } => WcOpcode::Send,
            Kind::Read { .. } => WcOpcode::RdmaRead,
            Kind::Bind { .. } => WcOpcode::BindMw,
            Kind::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// Remote address, rkey and the access it needs, for RDMA operations.
    pub(super) fn remote(self) -> Option<(u64, u32, Access)> {
        match self {
            Kind::Write { remote_addr, rkey }
            | Kind::WriteImm {
                remote_addr, rkey, ..
            } => Some((remote_addr, rkey, Access::REMOTE_WRITE)),
            Kind::Read { remote_addr, rkey } => Some((remote_addr, rkey, Access::REMOTE_READ)),
            _ => None,
        }
    }

    pub(super) fn is_read(self) -> bool {
        matches!(self, Kind::Read { .. })
    }

    pub(super) fn consumes_receive(self) -> bool {
        matches!(self, Kind::Send { .. } | Kind::WriteImm { .. })
    }
}

#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) wr: Wr,
    /// Assigned at the first transmission; retransmissions reuse it.
    pub(super) psn: Option<u32>,
    /// Tells this entry from a later one at the head of the queue.
    pub(super) seq: u64,
    /// The poster's simulated time (`model.rs`).
    pub(super) posted: u64,
}

fn state_name(state: QpState) -> &'static str {
    match state {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

/// The `IBV_QP_*` names of the bits of `bits`, e.g. `STATE|AV`.
fn mask_names(bits: u32) -> String {
    const NAMES: [(u32, &str); 15] = [
        (mask::STATE, "STATE"),
        (mask::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (mask::PKEY_INDEX, "PKEY_INDEX"),
        (mask::PORT, "PORT"),
        (mask::AV, "AV"),
        (mask::PATH_MTU, "PATH_MTU"),
        (mask::TIMEOUT, "TIMEOUT"),
        (mask::RETRY_CNT, "RETRY_CNT"),
        (mask::RNR_RETRY, "RNR_RETRY"),
        (mask::RQ_PSN, "RQ_PSN"),
        (mask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (mask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (mask::SQ_PSN, "SQ_PSN"),
        (mask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (mask::DEST_QPN, "DEST_QPN"),
    ];
    let names: Vec<&str> = NAMES
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join("|")
    }
}

/// The RC rows of the kernel's `qp_state_table`
/// (drivers/infiniband/core/verbs.c): required and optional attributes of
/// each allowed transition, `IBV_QP_STATE` aside. SQD/SQE are not modelled.
fn transition(cur: QpState, next: QpState) -> Option<(u32, u32)> {
    use QpState::{Err, Init, Reset, Rtr, Rts};
    let init = mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS;
    match (cur, next) {
        (_, Reset | Err) => Some((0, 0)),
        (Reset, Init) => Some((init, 0)),
        (Init, Init) => Some((0, init)),
        (Init, Rtr) => Some((
            mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER,
            mask::ACCESS_FLAGS | mask::PKEY_INDEX,
        )),
        (Rtr, Rts) => Some((
            mask::TIMEOUT
                | mask::RETRY_CNT
                | mask::RNR_RETRY
                | mask::SQ_PSN
                | mask::MAX_QP_RD_ATOMIC,
            mask::ACCESS_FLAGS | mask::MIN_RNR_TIMER,
        )),
        (Rts, Rts) => Some((0, mask::ACCESS_FLAGS | mask::MIN_RNR_TIMER)),
        _ => None,
    }
}

/// Why a transition is not allowed, for the error message.
fn transition_hint(cur: QpState, next: QpState) -> &'static str {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    match (cur, next) {
        (Rtr | Rts, Init | Rtr) => "; an RC QP cannot be re-aimed without RESET",
        (Err, _) => "; a QP in ERR must go through RESET",
        (Reset, Rtr | Rts) => "; go through INIT first",
        (Init, Rts) => "; go through RTR first",
        (_, Sqd | Sqe) => "; the fake fabric has no SQD/SQE",
        _ => "",
    }
}

/// Checks the values of the attributes in `attr` against the device.
fn check_values(attr: &QpAttr, port_mtu: Mtu, gids: u16) -> std::result::Result<(), String> {
    let bad = |what: String| Err(what);
    if let Some(port) = attr.port {
        if port != 1 {
            return bad(format!("port {port} (the device has port 1 only)"));
        }
    }
    if let Some(index) = attr.pkey_index {
        if index != 0 {
            return bad(format!(
                "pkey_index {index} (the P_Key table has one entry)"
            ));
        }
    }
    if let Some(mtu) = attr.path_mtu {
        if mtu > port_mtu {
            return bad(format!(
                "path_mtu {} exceeds the port's active MTU {}",
                mtu.bytes(),
                port_mtu.bytes()
            ));
        }
    }
    if let Some(av) = attr.av {
        if av.port != 1 {
            return bad(format!("av.port {} (the device has port 1 only)", av.port));
        }
        if u16::from(av.sgid_index) >= gids {
            return bad(format!("av.sgid_index {} (no such GID)", av.sgid_index));
        }
        if !av.is_global {
            return bad("av.is_global is 0; RoCE needs a global route".to_owned());
        }
    }
    for (name, value) in [
        ("dest_qp_num", attr.dest_qp_num),
        ("rq_psn", attr.rq_psn),
        ("sq_psn", attr.sq_psn),
    ] {
        if let Some(v) = value {
            if v > PSN_MASK {
                return bad(format!("{name} {v:#x} has more than 24 bits"));
            }
        }
    }
    for (name, value, max) in [
        ("max_dest_rd_atomic", attr.max_dest_rd_atomic, MAX_RD_ATOMIC),
        ("max_rd_atomic", attr.max_rd_atomic, MAX_RD_ATOMIC),
        ("min_rnr_timer", attr.min_rnr_timer, 31),
        ("timeout", attr.timeout, 31),
        ("retry_cnt", attr.retry_cnt, 7),
        ("rnr_retry", attr.rnr_retry, 7),
    ] {
        if let Some(v) = value {
            if v > max {
                return bad(format!("{name} {v} exceeds {max}"));
            }
        }
    }
    Ok(())
}

impl State {
    /// Moves `key` to ERR: every outstanding send and posted receive
    /// completes with `WR_FLUSH_ERR`.
    pub(super) fn enter_error(&mut self, key: QpKey) {
        let Some(qp) = self.qps.get_mut(&key) else {
            return;
        };
        qp.state = QpState::Err;
        let sends: Vec<Pending> = qp.sends.drain(..).collect();
        let recvs: Vec<RecvWr> = qp.recvs.drain(..).collect();
        let cq = qp.cq;
        for s in sends {
            let c = completion(key, s.wr.wr_id, WcStatus::WrFlushErr, s.wr.kind.opcode());
            self.push(cq, c);
        }
        for r in recvs {
            self.push(
                cq,
                completion(key, r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv),
            );
        }
    }

    /// `ibv_modify_qp` of `key`.
    pub(super) fn modify(&mut self, key: QpKey, attr: &QpAttr) -> Result<()> {
        let Some(device) = self.devices.get(key.0) else {
            return Err(Error::Internal(format!("fake fabric: no device {}", key.0)));
        };
        let (port_mtu, name) = (device.spec.port_mtu, device.spec.name.clone());
        let gids = u16::try_from(device.gids.len()).unwrap_or(u16::MAX);
        let Some(qp) = self.qps.get(&key) else {
            return Err(Error::Internal(format!(
                "fake fabric: no QP {} on {name}",
                key.1
            )));
        };
        let cur = qp.state;
        let next = attr.state.unwrap_or(cur);
        let bits = attr.mask();
        let fail = |why: String| {
            Error::Rdma(format!(
                "ibv_modify_qp(QP {} on {name}: {} -> {}, mask {bits:#x} = {}) failed: \
                 Invalid argument: {why}",
                key.1,
                state_name(cur),
                state_name(next),
                mask_names(bits),
            ))
        };
        let Some((required, optional)) = transition(cur, next) else {
            return Err(fail(format!(
                "transition not allowed{}",
                transition_hint(cur, next)
            )));
        };
        let missing = required & !bits;
        if missing != 0 {
            return Err(fail(format!("missing {}", mask_names(missing))));
        }
        let extra = bits & !(required | optional | mask::STATE);
        if extra != 0 {
            return Err(fail(format!(
                "{} not allowed in this transition",
                mask_names(extra)
            )));
        }
        check_values(attr, port_mtu, gids).map_err(fail)?;
        match next {
            QpState::Err => self.enter_error(key),
            QpState::Reset => {
                // Posted work vanishes without completions; the CQ keeps
                // what it already holds.
                if let Some(qp) = self.qps.get_mut(&key) {
                    qp.state = QpState::Reset;
                    qp.attrs = ConnAttrs::default();
                    qp.next_psn = 0;
                    qp.expected_psn = 0;
                    qp.sends.clear();
                    qp.recvs.clear();
                }
            }
            _ => {
                if let Some(qp) = self.qps.get_mut(&key) {
                    let a = &mut qp.attrs;
                    if let Some(v) = attr.access {
                        a.access = v;
                    }
                    if let Some(av) = attr.av {
                        a.av_dgid = Some(av.dgid);
                        a.sgid_index = av.sgid_index;
                    }
                    a.path_mtu = attr.path_mtu.or(a.path_mtu);
                    a.dest_qp_num = attr.dest_qp_num.unwrap_or(a.dest_qp_num);
                    a.max_dest_rd_atomic = attr.max_dest_rd_atomic.unwrap_or(a.max_dest_rd_atomic);
                    a.retry_cnt = attr.retry_cnt.unwrap_or(a.retry_cnt);
                    a.rnr_retry = attr.rnr_retry.unwrap_or(a.rnr_retry);
                    a.max_rd_atomic = attr.max_rd_atomic.unwrap_or(a.max_rd_atomic);
                    if let Some(psn) = attr.rq_psn {
                        qp.expected_psn = psn;
                    }
                    if let Some(psn) = attr.sq_psn {
                        qp.next_psn = psn;
                    }
                    qp.state = next;
                }
            }
        }
        Ok(())
    }
}

impl FakePd {
    pub(super) fn create_qp_inner(&self, cq: &Arc<dyn Cq>, caps: QpCaps) -> Result<Arc<dyn Qp>> {
        let pd = self.me.upgrade().ok_or_else(gone)?;
        let name = self.device_name();
        let Some(fake_cq) = cq
            .as_any()
            .downcast_ref::<FakeCq>()
            .filter(|c| c.fabric.id == self.fabric.id && c.ctx.device == self.device())
        else {
            return Err(Error::Rdma(format!(
                "ibv_create_qp({name}) failed: Invalid argument (the CQ is not of this device)"
            )));
        };
        if caps.max_send_wr > MAX_QP_WR
            || caps.max_recv_wr > MAX_QP_WR
            || caps.max_send_sge > MAX_SGE
            || caps.max_recv_sge > MAX_SGE
        {
            return Err(Error::Rdma(format!(
                "ibv_create_qp({name}) failed: Invalid argument ({caps:?} exceeds \
                 {MAX_QP_WR} work requests / {MAX_SGE} entries)"
            )));
        }
        let mut st = self.fabric.state.lock();
        let max_qp = self.ctx.spec.limits.max_qp;
        if st.live_on(self.device()).0 >= to_usize(max_qp) {
            return Err(Error::Rdma(format!(
                "ibv_create_qp({name}) failed: Cannot allocate memory (max_qp {max_qp} reached)"
            )));
        }
        let Some(device) = st.devices.get_mut(self.device()) else {
            return Err(gone());
        };
        let qpn = device.next_qpn;
        if qpn > PSN_MASK {
            return Err(Error::Rdma(format!(
                "ibv_create_qp({name}) failed: out of QP numbers"
            )));
        }
        device.next_qpn += 1;
        let key = (self.device(), qpn);
        st.qps.insert(
            key,
            QpRec {
                pd: self.id,
                cq: fake_cq.id,
                caps,
                state: QpState::Reset,
                attrs: ConnAttrs::default(),
                next_psn: 0,
                expected_psn: 0,
                recvs: VecDeque::new(),
                sends: VecDeque::new(),
                next_seq: 0,
            },
        );
        if let Some(p) = st.pds.get_mut(&self.id) {
            p.children += 1;
        }
        if let Some(c) = st.cqs.get_mut(&fake_cq.id) {
            c.users += 1;
        }
        drop(st);
        self.fabric.counters.created("qp");
        Ok(Arc::new(FakeQp {
            fabric: Arc::clone(&self.fabric),
            name: format!("QP {qpn} on {name}"),
            _pd: pd,
            _cq: Arc::clone(cq),
            key,
        }))
    }
}

/// A Reliable Connection queue pair.
pub(super) struct FakeQp {
    pub(super) fabric: Arc<Fabric>,
    /// "QP n on device", for messages (without taking the lock).
    name: String,
    _pd: Arc<FakePd>,
    _cq: Arc<dyn Cq>,
    pub(super) key: QpKey,
}

impl FakeQp {
    /// `mw` as this fabric's window, if it is one.
    fn fake_mw<'w>(&self, mw: &'w Arc<dyn Mw>) -> Option<&'w FakeMw> {
        mw.as_any()
            .downcast_ref::<FakeMw>()
            .filter(|w| w.fabric.id == self.fabric.id)
    }

    /// After a successful post: each posted bind's new rkey becomes its
    /// window's carried one, whatever the device makes of the bind (the
    /// production verbs write `ibv_mw.rkey` the same way).
    fn carry_bound_rkeys(&self, wrs: &[SendWr]) {
        for wr in wrs {
            if let SendOp::BindMw { mw, rkey, .. } = &wr.op {
                if let Some(w) = self.fake_mw(mw) {
                    w.carried.store(*rkey, Ordering::SeqCst);
                }
            }
        }
    }

    /// Converts a work request, resolving windows and regions to ids.
    fn convert(&self, wr: &SendWr) -> Wr {
        let kind = match &wr.op {
            SendOp::Write { remote_addr, rkey } => Kind::Write {
                remote_addr: *remote_addr,
                rkey: *rkey,
            },
            SendOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => Kind::WriteImm {
                remote_addr: *remote_addr,
                rkey: *rkey,
                imm: *imm,
            },
            SendOp::Send => Kind::Send {
                imm: None,
                inv: None,
            },
            SendOp::SendImm { imm } => Kind::Send {
                imm: Some(*imm),
                inv: None,
            },
            SendOp::SendInv { rkey } => Kind::Send {
                imm: None,
                inv: Some(*rkey),
            },
            SendOp::Read { remote_addr, rkey } => Kind::Read {
                remote_addr: *remote_addr,
                rkey: *rkey,
            },
            SendOp::BindMw {
                mw,
                rkey,
                mr,
                addr,
                len,
                access,
            } => Kind::Bind {
                mw: self.fake_mw(mw).map(|w| w.id),
                current: self
                    .fake_mw(mw)
                    .map_or(0, |w| w.carried.load(Ordering::SeqCst)),
                mr: mr
                    .as_any()
                    .downcast_ref::<FakeMr>()
                    .filter(|m| m.fabric.id == self.fabric.id)
                    .map(|m| m.id),
                rkey: *rkey,
                addr: *addr,
                len: *len,
                access: *access,
            },
            SendOp::LocalInv { rkey } => Kind::LocalInv { rkey: *rkey },
        };
        Wr {
            wr_id: wr.wr_id,
            signaled: wr.signaled,
            sge: wr.sge,
            kind,
        }
    }
}

impl Qp for FakeQp {
    fn qp_num(&self) -> u32 {
        self.key.1
    }

    fn state(&self) -> Result<QpState> {
        self.fabric.check("ibv_query_qp")?;
        self.fabric.qp_state_by_key(self.key).ok_or_else(gone)
    }

    fn modify(&self, attr: &QpAttr) -> Result<()> {
        self.fabric.check("ibv_modify_qp")?;
        self.fabric.modify_qp_by_key(self.key, attr)
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.fabric.check("ibv_post_recv")?;
        let mut st = self.fabric.state.lock();
        let qp = st.qps.get_mut(&self.key).ok_or_else(gone)?;
        let fail = |why: String| Error::Rdma(format!("ibv_post_recv({}) failed: {why}", self.name));
        match qp.state {
            QpState::Init | QpState::Rtr | QpState::Rts => {}
            QpState::Err => {
                // Receives posted in ERR are flushed at once.
                let (cq, c) = (
                    qp.cq,
                    completion(self.key, wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv),
                );
                st.push(cq, c);
                drop(st);
                self.fabric.completions.notify_all();
                return Ok(());
            }
            s => {
                return Err(fail(format!(
                    "Invalid argument (QP in {}; receives need INIT, RTR or RTS)",
                    state_name(s)
                )))
            }
        }
        if wr.sge.is_some() && qp.caps.max_recv_sge == 0 {
            return Err(fail("Invalid argument (max_recv_sge is 0)".to_owned()));
        }
        if qp.recvs.len() >= to_usize(qp.caps.max_recv_wr) {
            return Err(fail(format!(
                "Cannot allocate memory (receive queue full: {} posted)",
                qp.recvs.len()
            )));
        }
        qp.recvs.push_back(wr);
        if let Some(d) = st.devices.get_mut(self.key.0) {
            d.traffic.recvs += 1;
        }
        st.progress();
        drop(st);
        self.fabric.completions.notify_all();
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        self.fabric.check("ibv_post_send")?;
        let converted: Vec<Wr> = wrs.iter().map(|wr| self.convert(wr)).collect();
        let mut st = self.fabric.state.lock();
        let qp = st.qps.get_mut(&self.key).ok_or_else(gone)?;
        let fail = |why: String| Error::Rdma(format!("ibv_post_send({}) failed: {why}", self.name));
        match qp.state {
            QpState::Rts => {}
            QpState::Err => {
                // Sends posted in ERR are flushed at once (how ib_drain_qp
                // finds the end of a queue).
                let cq = qp.cq;
                for wr in converted {
                    let c = completion(self.key, wr.wr_id, WcStatus::WrFlushErr, wr.kind.opcode());
                    st.push(cq, c);
                }
                drop(st);
                self.carry_bound_rkeys(wrs);
                self.fabric.completions.notify_all();
                return Ok(());
            }
            s => {
                return Err(fail(format!(
                    "Invalid argument (QP in {}; sends need RTS)",
                    state_name(s)
                )))
            }
        }
        if converted.iter().any(|w| w.sge.is_some()) && qp.caps.max_send_sge == 0 {
            return Err(fail("Invalid argument (max_send_sge is 0)".to_owned()));
        }
        if qp.sends.len() + converted.len() > to_usize(qp.caps.max_send_wr) {
            return Err(fail(format!(
                "Cannot allocate memory (send queue full: {} outstanding, {} more, depth {})",
                qp.sends.len(),
                converted.len(),
                qp.caps.max_send_wr
            )));
        }
        let posted = st.timeline.as_ref().map_or(0, |t| {
            let thread = super::model::now(self.fabric.id, t.span_id(), t.began());
            t.posted(self.key, thread)
        });
        if let Some(d) = st.devices.get_mut(self.key.0) {
            let t = &mut d.traffic;
            t.post_sends += 1;
            for wr in wrs {
                t.send_wrs += 1;
                t.messages += u64::from(matches!(
                    wr.op,
                    SendOp::Send
                        | SendOp::SendImm { .. }
                        | SendOp::SendInv { .. }
                        | SendOp::WriteImm { .. }
                ));
                t.signaled += u64::from(wr.signaled);
            }
        }
        let qp = st.qps.get_mut(&self.key).ok_or_else(gone)?;
        for wr in converted {
            let seq = qp.next_seq;
            qp.next_seq += 1;
            qp.sends.push_back(Pending {
                wr,
                psn: None,
                seq,
                posted,
            });
        }
        st.progress();
        drop(st);
        self.carry_bound_rkeys(wrs);
        self.fabric.completions.notify_all();
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        // Destroying a QP discards its work without completions.
        let mut st = self.fabric.state.lock();
        if let Some(qp) = st.qps.remove(&self.key) {
            if let Some(p) = st.pds.get_mut(&qp.pd) {
                p.children = p.children.saturating_sub(1);
            }
            if let Some(c) = st.cqs.get_mut(&qp.cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        drop(st);
        self.fabric.counters.destroyed("qp");
    }
}

#[cfg(test)]
mod tests {
    use super::super::support::*;
    use super::*;
    use hipobj::error::Error;

    #[test]
    fn re_aiming_an_rts_qp_names_the_rule_and_the_mask() {
        let (_f, a, b) = pair();
        connect(&a, &b, Link::default());
        let again = rtr(&b, B_SQ_PSN, Mtu::Mtu1024, 4);
        let err = a.qp.modify(&again).expect_err("RTS -> RTR");
        let Error::Rdma(message) = err else {
            panic!("not an RDMA error: {err:?}");
        };
        assert!(message.contains("RTS -> RTR"), "{message}");
        assert!(message.contains("re-aimed without RESET"), "{message}");
        assert!(
            message.contains(&format!("mask {:#x}", again.mask())),
            "{message}"
        );
        assert!(message.contains("STATE|AV|PATH_MTU"), "{message}");
    }

    #[test]
    fn modify_names_missing_and_extra_attributes_and_checks_values() {
        let (_f, a, b) = pair();
        let qp = &a.qp;
        qp.modify(&state(QpState::Reset)).expect("RESET");
        let no_access = QpAttr {
            access: None,
            ..init(ALL)
        };
        let err = qp.modify(&no_access).expect_err("missing");
        assert!(err.to_string().contains("missing ACCESS_FLAGS"), "{err}");
        qp.modify(&init(ALL)).expect("INIT");
        let extra = QpAttr {
            sq_psn: Some(1),
            ..init(ALL)
        };
        let err = qp.modify(&extra).expect_err("extra");
        assert!(err.to_string().contains("SQ_PSN not allowed"), "{err}");
        // Values rxe takes (it masks PSNs, allows 128 READs) but the IB
        // ranges do not.
        let bad = [
            QpAttr {
                rq_psn: Some(1 << 24),
                ..rtr(&b, 1, Mtu::Mtu1024, 4)
            },
            QpAttr {
                max_dest_rd_atomic: Some(17),
                ..rtr(&b, 1, Mtu::Mtu1024, 4)
            },
        ];
        assert!(qp.modify(&bad[0]).is_err(), "a 25-bit PSN");
        assert!(qp.modify(&bad[1]).is_err(), "17 READs");
        let at_port_mtu = QpAttr {
            path_mtu: Some(Mtu::Mtu4096),
            ..rtr(&b, 1, Mtu::Mtu1024, 4)
        };
        qp.modify(&at_port_mtu).expect("RTR at the port's MTU");
    }

    #[test]
    fn queues_have_depths_and_cqs_belong_to_their_device() {
        let (fabric, a, _b) = pair();
        let small = QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 0,
        };
        let qp = a.pd.create_qp(&a.cq, small).expect("qp");
        qp.modify(&init(ALL)).expect("INIT");
        assert!(
            qp.post_recv(RecvWr {
                wr_id: 1,
                sge: a.sge(0, 8)
            })
            .is_err(),
            "no SGE room"
        );
        qp.post_recv(RecvWr {
            wr_id: 1,
            sge: None,
        })
        .expect("one");
        assert!(
            qp.post_recv(RecvWr {
                wr_id: 2,
                sge: None
            })
            .is_err(),
            "full"
        );
        let other = fabric.verbs(&["b"]).open("b").expect("open");
        let foreign_cq = other.create_cq(4).expect("cq");
        assert!(
            a.pd.create_qp(&foreign_cq, caps()).is_err(),
            "CQ of another device"
        );
    }
}
