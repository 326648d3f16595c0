//! The fake verbs fabric: an in-memory RoCE v2 network of one-port devices
//! on which Reliable Connection queue pairs move real bytes between
//! registered memory of this process.
//!
//! It follows what kernel Soft-RoCE (`rdma_rxe`) and the IB specification do
//! (evidence: `lab/rxe/README.md` "Answers 3a-3e" and `lab/rxe/CMTEST.md`,
//! whose pitfalls P1-P16 are reproduced here), and is stricter where
//! hardware is lenient only by accident:
//!
//! - a packet reaches a QP if that QP is in RTR or RTS, whoever sent it:
//!   RoCE v2 authenticates no source, and a responder looks only at the
//!   destination QP number and the PSN (ReDMArk, USENIX Security 2021), so
//!   neither does the fake — a QP that is not connected to the sender, or
//!   connected to someone else, accepts its packets when their PSN is the
//!   one it expects. (The fake hands the requester its ACK or READ data,
//!   which real RoCE sends to the responder's own peer: kinder to an
//!   attacker than the wire, never kinder to the victim.) A packet to a QP
//!   below RTR, or to nowhere, is dropped without a word, and the sender
//!   retries: `retry_cnt` 7 forever (the work request stays outstanding and
//!   is retransmitted whenever any QP changes, as rxe does), 0 to 6 fails
//!   at once with `RETRY_EXC_ERR`;
//! - PSNs are 24-bit, a message takes one PSN per path-MTU packet: a
//!   request behind the responder's expected PSN is a duplicate, ACKed but
//!   not executed (the WRITE "succeeds" and nothing lands, P1); one ahead is
//!   NAKed and retried (P2);
//! - a multi-packet message between QPs whose path MTUs differ fails with
//!   `REM_INV_REQ_ERR` (P4, P5);
//! - WRITE and READ complete only on the requester; WRITE-with-immediate and
//!   SEND consume a receive and complete on both sides; without a receive
//!   the responder sends RNR NAKs (`rnr_retry` 7: wait for a receive,
//!   otherwise `RNR_RETRY_EXC_ERR`);
//! - a READ needs `max_dest_rd_atomic` > 0 at the responder (P6) and never
//!   leaves a requester whose `max_rd_atomic` is 0 (P7);
//! - lkeys, rkeys, PDs, bounds and access flags of MRs, type-2 memory
//!   windows and QPs are checked; remote errors put both QPs in ERR. A
//!   zero-length WRITE or READ does not look at its rkey (C9-88). MR lkeys
//!   and rkeys differ, so using one for the other fails;
//! - a QP whose access flags lack what a request needs NAKs it as an
//!   invalid request (`REM_INV_REQ_ERR`, rxe's `check_op_valid`);
//! - type-2 windows (rxe_mw.c): a bind needs an RTS QP of the window's PD,
//!   a free window (invalidate before rebinding), an MR with `MW_BIND`, and
//!   keeps the window's key index; it carries the window's current rkey as
//!   the poster knows it (`ibv_mw.rkey`: the allocation's, then the last
//!   bind posted, refused or not), which must be the window's; the window
//!   is then usable only through the QP that bound it, and only inside its
//!   range (stricter than rxe, which checks the MR's bounds); an MR with
//!   bound windows cannot be deregistered;
//! - `modify` follows the kernel's RC transition table (required and
//!   allowed attributes per transition) and names the transition and mask
//!   bits when it refuses; RESET discards posted work without completions,
//!   ERR flushes it with `WR_FLUSH_ERR`, and work posted in ERR is flushed
//!   at once;
//! - a message longer than the requester's or the responder's port
//!   `max_msg_sz` fails (`LOC_LEN_ERR` at the requester; the responder
//!   NAKs it as an invalid request);
//! - a QP that a remote request moves to ERR (an access or invalid-request
//!   violation) raises an asynchronous event (`QP_ACCESS_ERR`,
//!   `QP_REQ_ERR`) on its context, as hardware does, unless the device
//!   spec says it does not (rxe raises none);
//! - each device has limits (QPs, CQs, CQ entries, MRs, MWs): a creation
//!   beyond them fails with ENOMEM, as on hardware;
//! - completions can be held back ([`Fabric::hold_completions`]) and
//!   released later, after a drain, a timeout or a reset, as a real device
//!   may write them;
//! - a CQ that overflows reports an overrun on every later poll;
//! - with [`DeviceMemory`] set, plain registration of device memory fails
//!   (no peer-memory) and dma-buf registration needs the fake GPU's fd.
//!
//! All delivery happens synchronously inside `post_send`, `post_recv` and
//! `modify`, under one lock, in a fixed order: the fabric is deterministic
//! and never sleeps. `Cq::wait` blocks on a condition variable; each CQ's
//! completion channel and each context's asynchronous events are real
//! descriptors (eventfds), readable as libibverbs' are.
//!
//! Fault injection: every verb first calls [`Faults::check`] with its
//! libibverbs name and fails with `"<name> failed (injected)"` when told:
//! "ibv_get_device_list", "ibv_open_device", "ibv_query_port",
//! "ibv_query_gid", "ibv_alloc_pd", "ibv_create_cq", "ibv_reg_mr",
//! "ibv_reg_dmabuf_mr", "ibv_create_qp", "ibv_alloc_mw", "ibv_modify_qp",
//! "ibv_query_qp" (`Qp::state`), "ibv_post_send", "ibv_post_recv",
//! "ibv_poll_cq", and for `Cq::wait` "ibv_req_notify_cq" then
//! "ibv_get_cq_event".
//! Live objects are counted in [`Counters`] under "context", "pd", "cq",
//! "qp", "mr" and "mw"; a destroy that the rules forbid (a PD with live
//! children, an MR with bound windows) is counted under "destroy_failed" and
//! leaks, as the real owners do.
//!
//! One file per concern:
//!
//! - this one: the [`Fabric`] and its public API, the devices
//!   ([`DeviceSpec`]) and the state every object shares under the fabric's
//!   lock;
//! - `context.rs`: opening devices, ports and GIDs, asynchronous events;
//! - `mr.rs`: protection domains, memory regions and windows, and the
//!   lkey/rkey, bounds and access checks;
//! - `qp.rs`: the queue pair's state machine and its queues;
//! - `transport.rs`: routing, PSNs, retries and the responder's checks;
//! - `cq.rs`: completion queues and completions held back;
//! - `model.rs`: a modelled link ([`Fabric::model_link`]): transfers timed
//!   in simulated time at a real NIC's rates and round trip.

#![forbid(unsafe_code)]

mod context;
mod cq;
mod model;
mod mr;
mod qp;
#[cfg(test)]
mod support;
mod transport;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::cm::{FakeCm, Hub};
use super::{Counters, DeviceMemory, Faults};
use hipobj::error::{Error, Result};
use hipobj::platform::{
    AddressVector, AsyncEvent, AsyncKind, Cm, Completion, Cq, DeviceLimits, Gid, Mtu, Pd, Qp,
    QpAttr, QpCaps, QpState, Verbs,
};

use context::{CtxRec, FakeVerbs};
use cq::CqRec;
pub(crate) use mr::FakePd;
use mr::{MrRec, MwRec, PdRec};
use qp::{FakeQp, QpRec};

pub use model::LinkModel;

/// PSNs and QP numbers are 24-bit.
pub(crate) const PSN_MASK: u32 = 0x00ff_ffff;
/// Most outstanding RDMA READs per QP, either direction (`max_qp_rd_atom`).
pub(crate) const MAX_RD_ATOMIC: u8 = 16;
/// Most work requests per queue (`max_qp_wr`).
const MAX_QP_WR: u32 = 16_384;
/// Most entries per CQ (`max_cqe`).
const MAX_CQE: u32 = 65_536;
/// rxe's first QP number (0 and 1 are special, rxe reserves up to 16).
const FIRST_QPN: u32 = 17;
/// GID entries per port: 0 = link-local, 1 = the IPv4-mapped RoCE v2 GID.
const GID_TABLE_LEN: u16 = 2;
/// The PCI vendor id rxe reports.
pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

static NEXT_FABRIC_ID: AtomicU64 = AtomicU64::new(1);

/// A QP's address on the fabric: (device index, QP number).
pub(crate) type QpKey = (usize, u32);

// ---------------------------------------------------------------- public

/// What one device's QPs posted and its CQs were given
/// ([`Fabric::traffic`]): the fixed cost of a transfer, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// `ibv_post_send` calls that were taken.
    pub post_sends: u64,
    /// Send work requests in them.
    pub send_wrs: u64,
    /// Of those, messages to the peer: SENDs and WRITEs with immediate,
    /// each consuming a receive there.
    pub messages: u64,
    /// Of those, signaled ones.
    pub signaled: u64,
    /// Receives posted (`ibv_post_recv` calls that were taken).
    pub recvs: u64,
    /// Completions queued to its CQs (held ones when queued).
    pub completions: u64,
}

/// One fake RDMA device: a single RoCE v2 port with an IPv4 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Device name (`rxe0`, `mlx5_0`...), unique on the fabric.
    pub name: String,
    /// The port's IPv4 address, unique on the fabric; GID index
    /// [`DeviceSpec::ipv4_gid_index`] is `::ffff:<ipv4>`.
    pub ipv4: Ipv4Addr,
    /// Where the IPv4-mapped GID sits in the table (1 by default; a real
    /// NIC's list, as sysfs fixtures show it, may put it further down).
    /// Index 0 is always the link-local GID; entries between are unused
    /// (all zeros, as `ibv_query_gid` reports unused entries).
    pub ipv4_gid_index: u16,
    /// PCI vendor id (`ibv_query_device`).
    pub vendor_id: u32,
    /// The port's active (and largest) MTU.
    pub port_mtu: Mtu,
    /// Whether `ibv_reg_dmabuf_mr` works.
    pub supports_dmabuf: bool,
    /// Whether type-2 memory windows can be allocated.
    pub supports_mw: bool,
    /// Whether the port is ACTIVE; traffic to or from a port that is not
    /// is dropped.
    pub port_active: bool,
    /// The port's `max_msg_sz`.
    pub max_msg_sz: u32,
    /// Whether a QP that a remote request moves to ERR raises an
    /// asynchronous event (hardware does; rxe does not).
    pub async_events: bool,
    /// The device's limits.
    pub limits: DeviceLimits,
}

impl DeviceSpec {
    /// A Soft-RoCE-like device: rxe's vendor id, MTU 1024 (a 1500-byte
    /// netdev), memory windows, no dma-buf, port active.
    pub fn new(name: &str, ipv4: Ipv4Addr) -> DeviceSpec {
        DeviceSpec {
            name: name.to_owned(),
            ipv4,
            ipv4_gid_index: 1,
            vendor_id: RXE_VENDOR_ID,
            port_mtu: Mtu::Mtu1024,
            supports_dmabuf: false,
            supports_mw: true,
            port_active: true,
            max_msg_sz: 1 << 31,
            async_events: true,
            limits: DeviceLimits {
                max_qp: 16_384,
                max_cq: 16_384,
                max_cqe: MAX_CQE,
                max_mr: 65_536,
                max_mw: 65_536,
                max_qp_wr: MAX_QP_WR,
            },
        }
    }
}

/// The RoCE v2 GID of an IPv4 address, `::ffff:a.b.c.d` (GID index 1 of a
/// fake device).
pub fn ipv4_gid(ip: Ipv4Addr) -> Gid {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&ip.octets());
    gid
}

/// The address vector RoCE v2 needs toward `dgid`, as the CM builds it:
/// source GID index 1 (the IPv4-mapped one), hop limit 64, port 1, global
/// route.
pub fn roce_av(dgid: Gid) -> AddressVector {
    AddressVector {
        dgid,
        sgid_index: 1,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        port: 1,
        sl: 0,
        is_global: true,
        dlid: 0,
    }
}

/// The in-memory fabric. Hosts share it through an `Arc`; each host sees the
/// devices it names through [`Fabric::verbs`] and [`Fabric::cm`].
pub struct Fabric {
    /// Tells this fabric's objects from another fabric's.
    id: u64,
    faults: Arc<Faults>,
    counters: Arc<Counters>,
    device_memory: Mutex<Option<Arc<dyn DeviceMemory>>>,
    state: Mutex<State>,
    /// Notified whenever completions are queued, for `Cq::wait`.
    completions: Condvar,
    /// The RDMA CM's shared state (listeners, pending requests,
    /// connections), see `cm.rs`.
    pub(crate) hub: Hub,
}

impl Fabric {
    /// An empty fabric whose objects check `faults` and count themselves in
    /// `counters`.
    pub fn new(faults: Arc<Faults>, counters: Arc<Counters>) -> Arc<Fabric> {
        Arc::new(Fabric {
            id: NEXT_FABRIC_ID.fetch_add(1, Ordering::Relaxed),
            faults,
            counters,
            device_memory: Mutex::new(None),
            state: Mutex::new(State::default()),
            completions: Condvar::new(),
            hub: Hub::new(),
        })
    }

    /// Adds a device. Names and addresses must be unique.
    pub fn add_device(&self, spec: DeviceSpec) -> Result<()> {
        let mut st = self.state.lock();
        if spec.name.is_empty() || st.devices.iter().any(|d| d.spec.name == spec.name) {
            return Err(Error::Rdma(format!(
                "fake fabric: device name {:?} is empty or taken",
                spec.name
            )));
        }
        if st.devices.iter().any(|d| d.spec.ipv4 == spec.ipv4) {
            return Err(Error::Rdma(format!(
                "fake fabric: address {} is taken",
                spec.ipv4
            )));
        }
        let index = usize::from(spec.ipv4_gid_index.max(1));
        let mut gids = vec![[0u8; 16]; index + 1];
        gids[0] = super::topology::link_local_gid(spec.ipv4);
        gids[index] = ipv4_gid(spec.ipv4);
        st.devices.push(Device {
            gids,
            spec,
            next_qpn: FIRST_QPN,
            next_key_index: 1,
            traffic: Traffic::default(),
        });
        Ok(())
    }

    /// Makes plain registration of fake device memory fail, as on NICs
    /// without peer-memory support, and lets `reg_dmabuf_mr` recognise the
    /// fake GPU's dma-buf fds.
    pub fn set_device_memory(&self, memory: Arc<dyn DeviceMemory>) {
        *self.device_memory.lock() = Some(Arc::clone(&memory));
        self.state.lock().device_memory = Some(memory);
    }

    /// The verbs of a host that sees the devices `device_names` (those
    /// that exist on the fabric, in the fabric's order).
    pub fn verbs(self: &Arc<Self>, device_names: &[&str]) -> Arc<dyn Verbs> {
        Arc::new(FakeVerbs {
            fabric: Arc::clone(self),
            visible: device_names.iter().map(|s| (*s).to_owned()).collect(),
        })
    }

    /// The RDMA CM of a host that sees the devices `device_names`.
    pub fn cm(self: &Arc<Self>, device_names: &[&str]) -> Arc<dyn Cm> {
        Arc::new(FakeCm::new(
            Arc::clone(self),
            device_names.iter().map(|s| (*s).to_owned()).collect(),
        ))
    }

    /// The fault plan every object checks.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    /// The live-object counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Holds back every completion of the device `name` from now on
    /// (`true`), or queues them as they come again (`false`, without
    /// releasing those held): a device may write a completion late, after
    /// a drain, a reset or a timeout.
    pub fn hold_completions(&self, name: &str, hold: bool) {
        let mut st = self.state.lock();
        let Some(device) = st.devices.iter().position(|d| d.spec.name == name) else {
            return;
        };
        st.hold.retain(|&d| d != device);
        if hold {
            st.hold.push(device);
        }
    }

    /// What device `name`'s QPs posted and its CQs were given since the
    /// last [`Fabric::reset_traffic`] (`None`: no such device).
    pub fn traffic(&self, name: &str) -> Option<Traffic> {
        let st = self.state.lock();
        st.devices
            .iter()
            .find(|d| d.spec.name == name)
            .map(|d| d.traffic)
    }

    /// Zeroes every device's [`Traffic`].
    pub fn reset_traffic(&self) {
        for d in &mut self.state.lock().devices {
            d.traffic = Traffic::default();
        }
    }

    /// Times every transfer from now on on `model` (`None`: no model), in
    /// simulated time (`model.rs`).
    pub fn model_link(&self, model: Option<LinkModel>) {
        self.state.lock().timeline = model.map(model::Timeline::new);
    }

    /// The simulated time from the first message started to the last
    /// completion polled since [`Fabric::model_reset`], and the payload
    /// bytes moved; `None` without a model or before any message.
    pub fn model_span(&self) -> Option<(std::time::Duration, u64)> {
        self.state.lock().timeline.as_ref()?.span()
    }

    /// Starts a new span ([`Fabric::model_span`]): every thread's
    /// simulated clock starts again at the latest completion polled, so
    /// that threads that start transfers now start them together.
    pub fn model_reset(&self) {
        if let Some(t) = self.state.lock().timeline.as_mut() {
            t.reset();
        }
    }

    /// Queues every completion held back, in order, and notifies.
    pub fn release_completions(&self) -> usize {
        let mut st = self.state.lock();
        let held = std::mem::take(&mut st.held);
        let n = held.len();
        for (cq, c) in held {
            st.queue(cq, c, 0);
        }
        drop(st);
        self.completions.notify_all();
        n
    }

    /// Completions held back.
    pub fn held_completions(&self) -> usize {
        self.state.lock().held.len()
    }

    /// Raises an unaffiliated asynchronous event (`kind`, no QP) on every
    /// context open on the device `name`, as a port changing state does:
    /// each context's event descriptor becomes readable. Returns how many
    /// contexts got it.
    pub fn raise_async_event(&self, name: &str, kind: AsyncKind) -> usize {
        let mut st = self.state.lock();
        let Some(device) = st.devices.iter().position(|d| d.spec.name == name) else {
            return 0;
        };
        let mut raised = 0;
        for c in st.contexts.values_mut().filter(|c| c.device == device) {
            c.raise(AsyncEvent { kind, qp_num: None });
            raised += 1;
        }
        raised
    }

    /// The PSN the responder QP `qp_num` of device `name` expects next:
    /// what an attacker on the fabric must match (by sniffing or by
    /// guessing its 24 bits) to have its packets accepted.
    pub fn expected_psn(&self, name: &str, qp_num: u32) -> Option<u32> {
        let st = self.state.lock();
        let device = st.devices.iter().position(|d| d.spec.name == name)?;
        st.qps.get(&(device, qp_num)).map(|q| q.expected_psn)
    }

    /// Entry `index` of port 1's GID table of the device `name`.
    pub fn gid(&self, name: &str, index: u16) -> Option<Gid> {
        let st = self.state.lock();
        let device = st.devices.iter().find(|d| d.spec.name == name)?;
        device.gids.get(usize::from(index)).copied()
    }

    // ------------------------------------------------ for the fake CM

    /// `Err("<function> failed (injected)")` when the plan fails this call.
    pub(crate) fn check(&self, function: &'static str) -> Result<()> {
        if self.faults.check(function) {
            Err(Error::Rdma(format!("{function} failed (injected)")))
        } else {
            Ok(())
        }
    }

    /// A destroy the rules refuse: counted under "destroy_failed", logged,
    /// and the object leaks.
    /// Remote accesses that reached a registration whose deregistration
    /// failed. Hardware keeps such a registration (and the windows bound
    /// over it) usable, so the fabric completes those accesses as hardware
    /// would, counting them here; only the bytes are not moved, since the
    /// test may have freed the memory behind it.
    pub fn leaked_registrations_reached(&self) -> u64 {
        self.state.lock().leaked_reached
    }

    /// Makes every later `ibv_dereg_mr` fail (`true`) as a device in
    /// trouble might, or succeed again: the region leaks and stays usable.
    pub fn fail_deregistrations(&self, fail: bool) {
        self.state.lock().fail_deregistrations = fail;
    }

    /// Makes the next `count` memory-window binds executed on the fabric
    /// complete with `IBV_WC_MW_BIND_ERR`, as a device that refuses a bind
    /// would (whether the bind was signaled or not).
    pub fn fail_binds(&self, count: u32) {
        self.state.lock().fail_binds = count;
    }

    fn destroy_failed(&self, message: std::fmt::Arguments<'_>) {
        self.counters.created("destroy_failed");
        eprintln!("fake fabric: {message}; leaked");
    }

    /// What the CM needs to know of the device owning `ip`.
    pub(crate) fn device_by_ip(&self, ip: Ipv4Addr) -> Option<DeviceInfo> {
        let st = self.state.lock();
        let index = st.devices.iter().position(|d| d.spec.ipv4 == ip)?;
        st.device_info(index)
    }

    /// What the CM needs to know of the device called `name`.
    pub(crate) fn device_by_name(&self, name: &str) -> Option<DeviceInfo> {
        let st = self.state.lock();
        let index = st.devices.iter().position(|d| d.spec.name == name)?;
        st.device_info(index)
    }

    /// What the CM needs to know of the `index`th device.
    pub(crate) fn device_info(&self, index: usize) -> Option<DeviceInfo> {
        self.state.lock().device_info(index)
    }

    /// `pd` as this fabric's PD, if it is one.
    pub(crate) fn fake_pd(&self, pd: &Arc<dyn Pd>) -> Option<Arc<FakePd>> {
        let pd = pd.as_any().downcast_ref::<FakePd>()?;
        (pd.fabric.id == self.id).then(|| pd.me.upgrade())?
    }

    /// The key of `qp` if it is this fabric's QP.
    pub(crate) fn qp_key(&self, qp: &Arc<dyn Qp>) -> Option<QpKey> {
        let qp = qp.as_any().downcast_ref::<FakeQp>()?;
        (qp.fabric.id == self.id).then_some(qp.key)
    }

    /// `ibv_modify_qp` as librdmacm calls it internally: no fault check.
    pub(crate) fn modify_qp_by_key(&self, key: QpKey, attr: &QpAttr) -> Result<()> {
        let mut st = self.state.lock();
        let result = st.modify(key, attr);
        st.progress();
        drop(st);
        self.completions.notify_all();
        result
    }

    /// The state of the QP `key`, if it exists.
    pub(crate) fn qp_state_by_key(&self, key: QpKey) -> Option<QpState> {
        self.state.lock().qps.get(&key).map(|q| q.state)
    }

    /// `ibv_create_qp` as librdmacm's `rdma_create_qp` calls it: no fault
    /// check.
    pub(crate) fn create_qp_unchecked(
        &self,
        pd: &Arc<FakePd>,
        cq: &Arc<dyn Cq>,
        caps: QpCaps,
    ) -> Result<Arc<dyn Qp>> {
        pd.create_qp_inner(cq, caps)
    }
}

/// A device as the CM sees it.
#[derive(Clone, Debug)]
pub(crate) struct DeviceInfo {
    /// Index on the fabric.
    pub(crate) index: usize,
    /// Name.
    pub(crate) name: String,
    /// The RoCE v2 GID (index 1).
    pub(crate) gid: Gid,
    /// The port's MTU.
    pub(crate) mtu: Mtu,
    /// Whether the port is ACTIVE.
    pub(crate) port_active: bool,
}

// ---------------------------------------------------------------- state

#[derive(Default)]
struct State {
    /// What moves the bytes of device spans ([`Fabric::set_device_memory`]).
    device_memory: Option<Arc<dyn DeviceMemory>>,
    devices: Vec<Device>,
    next_id: u64,
    contexts: HashMap<u64, CtxRec>,
    pds: HashMap<u64, PdRec>,
    cqs: HashMap<u64, CqRec>,
    mrs: BTreeMap<u64, MrRec>,
    mws: BTreeMap<u64, MwRec>,
    /// Ordered, so that delivery order is deterministic.
    qps: BTreeMap<QpKey, QpRec>,
    /// Devices whose completions are held back (not queued).
    hold: Vec<usize>,
    /// Completions held back, in order, with their CQ.
    held: Vec<(u64, Completion)>,
    /// Remote accesses that reached a registration whose deregistration
    /// failed ([`Fabric::leaked_registrations_reached`]).
    leaked_reached: u64,
    /// Every deregistration fails ([`Fabric::fail_deregistrations`]).
    fail_deregistrations: bool,
    /// Binds still to fail ([`Fabric::fail_binds`]).
    fail_binds: u32,
    /// The modelled link, if any ([`Fabric::model_link`]).
    timeline: Option<model::Timeline>,
    /// The simulated time of the completion the work request being
    /// executed gets (0 without a model).
    stamp: u64,
}

struct Device {
    spec: DeviceSpec,
    /// What its QPs and CQs did since the last [`Fabric::reset_traffic`].
    traffic: Traffic,
    /// Port 1's GID table: at least [`GID_TABLE_LEN`] entries.
    gids: Vec<Gid>,
    next_qpn: u32,
    next_key_index: u32,
}

impl State {
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn device_info(&self, index: usize) -> Option<DeviceInfo> {
        let d = self.devices.get(index)?;
        Some(DeviceInfo {
            index,
            name: d.spec.name.clone(),
            gid: d.gids[usize::from(d.spec.ipv4_gid_index.max(1))],
            mtu: d.spec.port_mtu,
            port_active: d.spec.port_active,
        })
    }

    /// Live objects of `device`: (QPs, CQs, MRs, MWs).
    fn live_on(&self, device: usize) -> (usize, usize, usize, usize) {
        (
            self.qps.keys().filter(|k| k.0 == device).count(),
            self.cqs.values().filter(|c| c.device == device).count(),
            self.mrs.values().filter(|m| m.device == device).count(),
            self.mws.values().filter(|m| m.device == device).count(),
        )
    }
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn to_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn gone() -> Error {
    Error::Internal("fake fabric: object used while being destroyed".to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;
    use std::time::Instant;

    use super::support::*;
    use super::*;
    use hipobj::platform::{RecvWr, WcStatus};

    #[test]
    fn injected_faults_fail_the_named_call() {
        let (fabric, a, b) = pair();
        connect(&a, &b, Link::default());
        let faults = Arc::clone(fabric.faults());
        let verbs = fabric.verbs(&["a"]);
        let calls: [(&'static str, &dyn Fn() -> Result<()>); 15] = [
            ("ibv_get_device_list", &|| verbs.device_names().map(drop)),
            ("ibv_open_device", &|| verbs.open("a").map(drop)),
            ("ibv_query_port", &|| a.ctx.query_port(1).map(drop)),
            ("ibv_query_gid", &|| a.ctx.query_gid(1, 1).map(drop)),
            ("ibv_alloc_pd", &|| a.ctx.alloc_pd().map(drop)),
            ("ibv_create_cq", &|| a.ctx.create_cq(4).map(drop)),
            ("ibv_reg_mr", &|| {
                a.pd.reg_mr(a.buf.as_ptr() as usize, 8, ALL).map(drop)
            }),
            ("ibv_create_qp", &|| a.pd.create_qp(&a.cq, caps()).map(drop)),
            ("ibv_alloc_mw", &|| a.pd.alloc_mw().map(drop)),
            ("ibv_modify_qp", &|| a.qp.modify(&state(QpState::Rts))),
            ("ibv_query_qp", &|| a.qp.state().map(drop)),
            ("ibv_post_recv", &|| {
                a.qp.post_recv(RecvWr {
                    wr_id: 0,
                    sge: None,
                })
            }),
            ("ibv_post_send", &|| a.qp.post_send(&[])),
            ("ibv_poll_cq", &|| a.cq.poll(1).map(drop)),
            ("ibv_req_notify_cq", &|| a.cq.wait(Instant::now()).map(drop)),
        ];
        for (name, call) in calls {
            call().unwrap_or_else(|e| panic!("{name} without a fault: {e}"));
            faults.fail_nth(name, faults.calls(name) + 1);
            let err = call().expect_err(name);
            assert_eq!(err, Error::Rdma(format!("{name} failed (injected)")));
            call().unwrap_or_else(|e| panic!("{name} after the fault: {e}"));
        }
        let dmabuf = OwnedFd::from(std::fs::File::open("/dev/null").expect("fd"));
        faults.fail_always("ibv_reg_dmabuf_mr");
        let err = err_of(a.pd.reg_dmabuf_mr(&dmabuf, 0, 8, 0, ALL));
        assert_eq!(
            err,
            Error::Rdma("ibv_reg_dmabuf_mr failed (injected)".to_owned())
        );
        // ibv_get_cq_event: checked when a wait returns true.
        b.recv(1, None);
        a.qp.post_send(&[write_imm(&a, 0, 0, 0, 1)]).expect("post");
        faults.fail_always("ibv_get_cq_event");
        assert!(b.cq.wait(Instant::now()).is_err());
    }

    #[test]
    fn counters_return_to_zero_after_drop() {
        let (fabric, mut a, b) = pair();
        let counters = Arc::clone(fabric.counters());
        pattern(&mut a.buf[..KIB64 as usize], 13);
        connect(&a, &b, Link::default());
        let mw = b.pd.alloc_mw().expect("mw");
        b.recv(1, None);
        a.qp.post_send(&[
            write(&a, 0, KIB64, b.addr(0), b.mr.rkey()),
            write_imm(&a, 0, 0, 0, 1),
            read(&a, KIB64 as usize, KIB64, b.addr(0), b.mr.rkey()),
        ])
        .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success; 3]);
        assert_eq!(
            a.buf[..KIB64 as usize],
            a.buf[KIB64 as usize..2 * KIB64 as usize]
        );
        let live = counters.snapshot();
        assert_eq!(
            live,
            [
                ("context", 2),
                ("cq", 2),
                ("mr", 2),
                ("mw", 1),
                ("pd", 2),
                ("qp", 2)
            ]
        );
        drop((mw, a, b));
        assert!(counters.snapshot().is_empty(), "{:?}", counters.snapshot());
    }

    #[test]
    fn traffic_counts_each_device_s_posts_messages_and_completions() {
        let (fabric, a, b) = pair();
        connect(&a, &b, Link::default());
        fabric.reset_traffic();
        b.recv(1, None);
        let mut unsignaled = write(&a, 0, 8, b.addr(0), b.mr.rkey());
        unsignaled.signaled = false;
        a.qp.post_send(&[unsignaled, write_imm(&a, 0, 0, 0, 1)])
            .expect("post");
        a.qp.post_send(&[read(&a, 64, 8, b.addr(0), b.mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success; 2]);
        assert_eq!(statuses(&b.poll()), [WcStatus::Success]);
        assert_eq!(
            fabric.traffic("a"),
            Some(Traffic {
                post_sends: 2,
                send_wrs: 3,
                messages: 1,
                signaled: 2,
                recvs: 0,
                completions: 2,
            })
        );
        let b_side = Traffic {
            recvs: 1,
            completions: 1,
            ..Traffic::default()
        };
        assert_eq!(fabric.traffic("b"), Some(b_side));
        assert_eq!(fabric.traffic("c"), None);
        fabric.reset_traffic();
        assert_eq!(fabric.traffic("a"), Some(Traffic::default()));
    }
}
