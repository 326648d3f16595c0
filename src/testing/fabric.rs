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

#![forbid(unsafe_code)]

use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use std::os::fd::{AsFd, BorrowedFd};

use super::cm::{FakeCm, Hub};
use super::memory::{self, Span};
use super::{Counters, DeviceMemory, Faults};
use crate::error::{Error, Result};
use crate::platform::{
    mask, Access, AddressVector, AsyncEvent, AsyncKind, Cm, Completion, Context, Cq, DeviceLimits,
    Gid, LinkLayer, Mr, Mtu, Mw, Pd, PortAttr, PortState, Qp, QpAttr, QpCaps, QpState, RecvWr,
    SendOp, SendWr, Sge, Verbs, Waker, WcOpcode, WcStatus,
};

/// PSNs and QP numbers are 24-bit.
pub(crate) const PSN_MASK: u32 = 0x00ff_ffff;
/// Half the PSN space: a PSN this far or farther "ahead" is really behind.
const PSN_HALF: u32 = 1 << 23;
/// Most outstanding RDMA READs per QP, either direction (`max_qp_rd_atom`).
pub(crate) const MAX_RD_ATOMIC: u8 = 16;
/// Most work requests per queue (`max_qp_wr`).
const MAX_QP_WR: u32 = 16_384;
/// Most scatter/gather entries per work request (`max_sge`).
const MAX_SGE: u32 = 32;
/// Most entries per CQ (`max_cqe`).
const MAX_CQE: u32 = 65_536;
/// rxe's first QP number (0 and 1 are special, rxe reserves up to 16).
const FIRST_QPN: u32 = 17;
/// GID entries per port: 0 = link-local, 1 = the IPv4-mapped RoCE v2 GID.
const GID_TABLE_LEN: u16 = 2;
/// Low byte of every MR lkey; rkeys differ, so mixing them up is caught.
const LKEY_TAG: u32 = 0x4c;
/// Low byte of every MR rkey.
const RKEY_TAG: u32 = 0x52;
/// Remote access bits a memory window may grant.
const WINDOW_ACCESS: Access = Access::REMOTE_READ
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_ATOMIC);
/// `IBV_WC_LOC_QP_OP_ERR`, which rxe reports for a failed local invalidate.
const WC_LOC_QP_OP_ERR: u32 = 2;
/// The PCI vendor id rxe reports.
pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

static NEXT_FABRIC_ID: AtomicU64 = AtomicU64::new(1);

/// A QP's address on the fabric: (device index, QP number).
pub(crate) type QpKey = (usize, u32);

// ---------------------------------------------------------------- public

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

    /// Queues every completion held back, in order, and notifies.
    pub fn release_completions(&self) -> usize {
        let mut st = self.state.lock();
        let held = std::mem::take(&mut st.held);
        let n = held.len();
        for (cq, c) in held {
            st.queue(cq, c);
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
}

/// An open context: where asynchronous events of its QPs go.
struct CtxRec {
    /// The device the context was opened on.
    device: usize,
    events: VecDeque<AsyncEvent>,
    waker: Arc<Waker>,
}

impl CtxRec {
    /// Queues `event` and makes the context's event descriptor readable.
    fn raise(&mut self, event: AsyncEvent) {
        self.events.push_back(event);
        self.waker.wake();
    }
}

struct Device {
    spec: DeviceSpec,
    /// Port 1's GID table: at least [`GID_TABLE_LEN`] entries.
    gids: Vec<Gid>,
    next_qpn: u32,
    next_key_index: u32,
}

struct PdRec {
    /// Live MRs, MWs and QPs.
    children: usize,
    /// The context it was allocated on.
    ctx: u64,
}

struct CqRec {
    device: usize,
    depth: usize,
    /// Armed (`ibv_req_notify_cq`): the next completion makes the channel
    /// readable.
    armed: bool,
    /// The completion channel.
    channel: Arc<Waker>,
    entries: VecDeque<Completion>,
    /// A completion found the queue full and was lost (sticky).
    overrun: bool,
    /// QPs that use this CQ.
    users: usize,
}

struct MrRec {
    device: usize,
    pd: u64,
    lkey: u32,
    rkey: u32,
    /// The first address the NIC knows the region by.
    iova: u64,
    len: usize,
    span: Span,
    access: Access,
    bound_windows: usize,
    /// Deregistration failed (windows were bound) and the owner is gone:
    /// the registration leaks, and its memory is no longer touched.
    zombie: bool,
}

struct MwRec {
    device: usize,
    pd: u64,
    /// The current rkey: the allocation's, then the last bind's.
    rkey: u32,
    binding: Option<Binding>,
}

#[derive(Clone, Copy)]
struct Binding {
    mr: u64,
    /// Type-2 windows are usable only through the QP that bound them.
    qp: QpKey,
    addr: u64,
    len: u64,
    access: Access,
}

/// The connection attributes `ibv_modify_qp` sets.
#[derive(Clone, Copy)]
struct ConnAttrs {
    access: Access,
    av_dgid: Option<Gid>,
    sgid_index: u8,
    path_mtu: Option<Mtu>,
    dest_qp_num: u32,
    max_dest_rd_atomic: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
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

struct QpRec {
    pd: u64,
    cq: u64,
    caps: QpCaps,
    state: QpState,
    attrs: ConnAttrs,
    /// PSN of the next new request.
    next_psn: u32,
    /// PSN the responder expects next.
    expected_psn: u32,
    recvs: VecDeque<RecvWr>,
    /// Posted sends that have not completed, oldest first.
    sends: VecDeque<Pending>,
    next_seq: u64,
}

/// A send work request converted at post time: it holds ids, never `Arc`s,
/// so nothing is dropped (and no object's `Drop` runs) under the lock.
#[derive(Clone, Copy, Debug)]
struct Wr {
    wr_id: u64,
    signaled: bool,
    sge: Option<Sge>,
    kind: Kind,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// A SEND, with immediate data when `imm` is set.
    Send {
        imm: Option<u32>,
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
    fn opcode(self) -> WcOpcode {
        match self {
            Kind::Write { .. } | Kind::WriteImm { .. } => WcOpcode::RdmaWrite,
            Kind::Send { .. } => WcOpcode::Send,
            Kind::Read { .. } => WcOpcode::RdmaRead,
            Kind::Bind { .. } => WcOpcode::BindMw,
            Kind::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// Remote address, rkey and the access it needs, for RDMA operations.
    fn remote(self) -> Option<(u64, u32, Access)> {
        match self {
            Kind::Write { remote_addr, rkey }
            | Kind::WriteImm {
                remote_addr, rkey, ..
            } => Some((remote_addr, rkey, Access::REMOTE_WRITE)),
            Kind::Read { remote_addr, rkey } => Some((remote_addr, rkey, Access::REMOTE_READ)),
            _ => None,
        }
    }

    fn is_read(self) -> bool {
        matches!(self, Kind::Read { .. })
    }

    fn consumes_receive(self) -> bool {
        matches!(self, Kind::Send { .. } | Kind::WriteImm { .. })
    }
}

#[derive(Clone, Copy)]
struct Pending {
    wr: Wr,
    /// Assigned at the first transmission; retransmissions reuse it.
    psn: Option<u32>,
    /// Tells this entry from a later one at the head of the queue.
    seq: u64,
}

/// What became of the work request at the head of a send queue.
enum Outcome {
    /// Completed successfully; the completion, if signaled.
    Done(Option<Completion>),
    /// Completed with this error; the QP goes to ERR.
    Fail(WcStatus),
    /// Waiting: retransmitted whenever the fabric changes.
    Stall,
}

/// A region of registered memory and an offset into it.
type Place = (Span, usize);

fn completion(qp: QpKey, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Completion {
    Completion {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: qp.1,
        vendor_err: 0,
    }
}

/// Packets of a `len`-byte message at `mtu` (at least one).
fn packets(len: u32, mtu: Mtu) -> u32 {
    len.div_ceil(mtu.bytes()).max(1)
}

/// `[addr, addr + len)` inside `[base, base + size)`: the offset of `addr`.
fn offset_within(base: u64, size: u64, addr: u64, len: u64) -> Option<usize> {
    let offset = addr.checked_sub(base)?;
    (offset.checked_add(len)? <= size).then_some(())?;
    usize::try_from(offset).ok()
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn to_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
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

    /// A fresh key index on `device`: MR and MW keys are `index << 8 | key`.
    fn new_key_index(&mut self, device: usize) -> Option<u32> {
        let d = self.devices.get_mut(device)?;
        let index = d.next_key_index;
        (index < 1 << 24).then_some(())?;
        d.next_key_index += 1;
        Some(index << 8)
    }

    /// Queues a completion on `cq` (or holds it back), or marks the CQ
    /// overrun when it is full.
    fn push(&mut self, cq: u64, c: Completion) {
        let device = self.cqs.get(&cq).map(|c| c.device);
        if device.is_some_and(|d| self.hold.contains(&d)) {
            self.held.push((cq, c));
        } else {
            self.queue(cq, c);
        }
    }

    fn queue(&mut self, cq: u64, c: Completion) {
        if let Some(cq) = self.cqs.get_mut(&cq) {
            if cq.entries.len() >= cq.depth {
                cq.overrun = true;
            } else {
                cq.entries.push_back(c);
            }
            if std::mem::take(&mut cq.armed) {
                cq.channel.wake();
            }
        }
    }

    /// Moves the responder `key` to ERR for a remote request that broke
    /// its rules, with the asynchronous event hardware raises.
    fn remote_error(&mut self, key: QpKey, kind: AsyncKind) {
        self.enter_error(key);
        let raises = self.devices.get(key.0).is_some_and(|d| d.spec.async_events);
        let ctx = self
            .qps
            .get(&key)
            .and_then(|q| self.pds.get(&q.pd))
            .map(|p| p.ctx);
        if let Some(c) = ctx
            .filter(|_| raises)
            .and_then(|c| self.contexts.get_mut(&c))
        {
            c.raise(AsyncEvent {
                kind,
                qp_num: Some(key.1),
            });
        }
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

    /// Moves `key` to ERR: every outstanding send and posted receive
    /// completes with `WR_FLUSH_ERR`.
    fn enter_error(&mut self, key: QpKey) {
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

    /// The memory behind a local scatter/gather entry of QP `key`: an MR of
    /// the QP's PD whose lkey matches, covering the whole entry, writable
    /// when the operation writes it.
    fn local_place(&self, key: QpKey, sge: Sge, writes: bool) -> Option<Place> {
        let qp = self.qps.get(&key)?;
        let mr = self
            .mrs
            .values()
            .find(|m| m.device == key.0 && m.lkey == sge.lkey && !m.zombie)?;
        (mr.pd == qp.pd).then_some(())?;
        (!writes || mr.access.contains(Access::LOCAL_WRITE)).then_some(())?;
        let offset = offset_within(mr.iova, to_u64(mr.len), sge.addr, u64::from(sge.len))?;
        Some((mr.span, offset))
    }

    /// The memory an rkey names for responder `key`: an MR of its PD, or a
    /// window bound through this very QP, granting `need`, covering
    /// `[addr, addr + len)`.
    fn remote_place(
        &self,
        key: QpKey,
        rkey: u32,
        addr: u64,
        len: u32,
        need: Access,
    ) -> Option<Place> {
        let qp = self.qps.get(&key)?;
        let len = u64::from(len);
        if let Some(mr) = self
            .mrs
            .values()
            .find(|m| m.device == key.0 && m.rkey == rkey && !m.zombie)
        {
            (mr.pd == qp.pd && mr.access.contains(need)).then_some(())?;
            let offset = offset_within(mr.iova, to_u64(mr.len), addr, len)?;
            return Some((mr.span, offset));
        }
        // rxe_lookup_mw: same PD, type 2 bound through this QP, valid,
        // access granted.
        let (w, b) = self.mws.values().find_map(|w| match w.binding {
            Some(b) if w.device == key.0 && w.rkey == rkey => Some((w, b)),
            _ => None,
        })?;
        (w.pd == qp.pd && b.qp == key && b.access.contains(need)).then_some(())?;
        offset_within(b.addr, b.len, addr, len)?;
        let mr = self.mrs.get(&b.mr).filter(|m| !m.zombie)?;
        let offset = offset_within(mr.iova, to_u64(mr.len), addr, len)?;
        Some((mr.span, offset))
    }

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
    fn progress(&mut self) {
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
        let outcome = match self.execute_head(key) {
            None | Some(Outcome::Stall) => return false,
            Some(outcome) => outcome,
        };
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
                    self.push(cq, c);
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
            Kind::Bind { .. } => return Some(self.bind_mw(a, wr)),
            Kind::LocalInv { rkey } => return Some(self.local_inv(a, wr, rkey)),
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
        Some(self.deliver(a, attrs, wr, local, psn, npkts))
    }

    /// The responder's side of a request from `a` with PSN `psn`.
    fn deliver(
        &mut self,
        a: QpKey,
        attrs: ConnAttrs,
        wr: Wr,
        local: Option<Place>,
        psn: u32,
        npkts: u32,
    ) -> Outcome {
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

        // Execute.
        let copied = match wr.kind {
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
                if len > 0 {
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
                }
            }
            Kind::Bind { .. } | Kind::LocalInv { .. } => true,
        };
        if !copied {
            self.remote_error(b, AsyncKind::QpAccessErr);
            return Outcome::Fail(WcStatus::RemAccessErr);
        }
        if let Some(recv) = first_recv.filter(|_| wr.kind.consumes_receive()) {
            if let Some(q) = self.qps.get_mut(&b) {
                q.recvs.pop_front();
            }
            let (opcode, imm) = match wr.kind {
                Kind::WriteImm { imm, .. } => (WcOpcode::RecvRdmaWithImm, Some(imm)),
                Kind::Send { imm } => (WcOpcode::Recv, imm),
                _ => (WcOpcode::Recv, None),
            };
            let c = Completion {
                byte_len: len,
                imm,
                ..completion(b, recv.wr_id, WcStatus::Success, opcode)
            };
            self.push(b_cq, c);
        }
        if let Some(q) = self.qps.get_mut(&b) {
            q.expected_psn = psn.wrapping_add(npkts) & PSN_MASK;
        }
        Outcome::Done(success())
    }

    /// `IBV_WR_BIND_MW` of a type-2 window (rxe_mw.c's checks).
    fn bind_mw(&mut self, a: QpKey, wr: Wr) -> Outcome {
        let Kind::Bind {
            mw,
            mr,
            current,
            rkey,
            addr,
            len,
            access,
        } = wr.kind
        else {
            return Outcome::Fail(WcStatus::MwBindErr);
        };
        let checked = (|| {
            let qp = self.qps.get(&a)?;
            let (mw, mr) = (mw?, mr?);
            let w = self.mws.get(&mw)?;
            // rxe_bind_mw: the carried key must be the window's current
            // one (after a refused bind the poster's copy has moved on).
            (current == w.rkey).then_some(())?;
            // o10-36.2.2: a type-2 window is bound only when free; C10-72:
            // in the QP's PD; the rkey keeps the window's index.
            (w.device == a.0 && w.pd == qp.pd && w.binding.is_none()).then_some(())?;
            (rkey & !0xff == w.rkey & !0xff).then_some(())?;
            let m = self.mrs.get(&mr)?;
            (!m.zombie && m.device == a.0 && m.pd == qp.pd).then_some(())?;
            m.access.contains(Access::MW_BIND).then_some(())?;
            (len > 0).then_some(())?;
            offset_within(m.iova, to_u64(m.len), addr, len)?;
            WINDOW_ACCESS.contains(access).then_some(())?;
            let writes = access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
            (!writes || m.access.contains(Access::LOCAL_WRITE)).then_some(())?;
            Some((mw, mr))
        })();
        let Some((mw, mr)) = checked else {
            return Outcome::Fail(WcStatus::MwBindErr);
        };
        if let Some(w) = self.mws.get_mut(&mw) {
            w.rkey = rkey;
            w.binding = Some(Binding {
                mr,
                qp: a,
                addr,
                len,
                access,
            });
        }
        if let Some(m) = self.mrs.get_mut(&mr) {
            m.bound_windows += 1;
        }
        Outcome::Done(
            wr.signaled
                .then(|| completion(a, wr.wr_id, WcStatus::Success, WcOpcode::BindMw)),
        )
    }

    /// `IBV_WR_LOCAL_INV` of a bound window's rkey.
    fn local_inv(&mut self, a: QpKey, wr: Wr, rkey: u32) -> Outcome {
        let Some(pd) = self.qps.get(&a).map(|q| q.pd) else {
            return Outcome::Fail(WcStatus::Other(WC_LOC_QP_OP_ERR));
        };
        let found = self
            .mws
            .values_mut()
            .find(|w| w.device == a.0 && w.pd == pd && w.rkey == rkey && w.binding.is_some());
        let Some(binding) = found.and_then(|w| w.binding.take()) else {
            return Outcome::Fail(WcStatus::Other(WC_LOC_QP_OP_ERR));
        };
        if let Some(m) = self.mrs.get_mut(&binding.mr) {
            m.bound_windows = m.bound_windows.saturating_sub(1);
        }
        Outcome::Done(
            wr.signaled
                .then(|| completion(a, wr.wr_id, WcStatus::Success, WcOpcode::LocalInv)),
        )
    }

    /// `ibv_modify_qp` of `key`.
    fn modify(&mut self, key: QpKey, attr: &QpAttr) -> Result<()> {
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

// ---------------------------------------------------------------- objects

/// A host's view of the fabric's devices.
struct FakeVerbs {
    fabric: Arc<Fabric>,
    visible: Vec<String>,
}

impl Verbs for FakeVerbs {
    fn device_names(&self) -> Result<Vec<String>> {
        self.fabric.check("ibv_get_device_list")?;
        let st = self.fabric.state.lock();
        Ok(st
            .devices
            .iter()
            .map(|d| &d.spec.name)
            .filter(|n| self.visible.contains(n))
            .cloned()
            .collect())
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
        self.fabric.check("ibv_open_device")?;
        let st = self.fabric.state.lock();
        let found = st
            .devices
            .iter()
            .position(|d| d.spec.name == name)
            .filter(|_| self.visible.iter().any(|v| v == name));
        let Some(index) = found else {
            return Err(Error::Rdma(format!(
                "ibv_open_device({name}) failed: No such device"
            )));
        };
        let spec = st.devices[index].spec.clone();
        drop(st);
        let async_waker = Arc::new(Waker::new()?);
        let id = {
            let mut st = self.fabric.state.lock();
            let id = st.new_id();
            st.contexts.insert(
                id,
                CtxRec {
                    device: index,
                    events: VecDeque::new(),
                    waker: async_waker.clone(),
                },
            );
            id
        };
        self.fabric.counters.created("context");
        Ok(Arc::new_cyclic(|me| FakeContext {
            me: me.clone(),
            fabric: Arc::clone(&self.fabric),
            device: index,
            id,
            spec,
            async_waker,
        }))
    }
}

/// An open device.
struct FakeContext {
    me: Weak<FakeContext>,
    fabric: Arc<Fabric>,
    device: usize,
    id: u64,
    spec: DeviceSpec,
    async_waker: Arc<Waker>,
}

impl Context for FakeContext {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn vendor_id(&self) -> u32 {
        self.spec.vendor_id
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.fabric.check("ibv_query_port")?;
        if port != 1 {
            return Err(Error::Rdma(format!(
                "ibv_query_port({}, port {port}) failed: Invalid argument (one port)",
                self.spec.name
            )));
        }
        Ok(PortAttr {
            state: if self.spec.port_active {
                PortState::Active
            } else {
                PortState::NotActive
            },
            active_mtu: self.spec.port_mtu,
            lid: 0,
            link_layer: LinkLayer::Ethernet,
            gid_table_len: self
                .fabric
                .state
                .lock()
                .devices
                .get(self.device)
                .and_then(|d| u16::try_from(d.gids.len()).ok())
                .unwrap_or(GID_TABLE_LEN),
            max_msg_sz: self.spec.max_msg_sz,
        })
    }

    fn query_gid(&self, port: u8, index: u16) -> Result<Gid> {
        self.fabric.check("ibv_query_gid")?;
        let st = self.fabric.state.lock();
        let gid = st
            .devices
            .get(self.device)
            .and_then(|d| d.gids.get(usize::from(index)))
            .filter(|_| port == 1);
        gid.copied().ok_or_else(|| {
            Error::Rdma(format!(
                "ibv_query_gid({}, port {port}, index {index}) failed: Invalid argument",
                self.spec.name
            ))
        })
    }

    fn alloc_pd(&self) -> Result<Arc<dyn Pd>> {
        self.fabric.check("ibv_alloc_pd")?;
        let ctx = self.me.upgrade().ok_or_else(gone)?;
        let id = {
            let mut st = self.fabric.state.lock();
            let id = st.new_id();
            st.pds.insert(
                id,
                PdRec {
                    children: 0,
                    ctx: self.id,
                },
            );
            id
        };
        self.fabric.counters.created("pd");
        Ok(Arc::new_cyclic(|me| FakePd {
            me: me.clone(),
            fabric: Arc::clone(&self.fabric),
            ctx,
            id,
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>> {
        self.fabric.check("ibv_create_cq")?;
        let max_cqe = self.spec.limits.max_cqe;
        if depth == 0 || depth > max_cqe {
            return Err(Error::Rdma(format!(
                "ibv_create_cq({}, {depth} entries) failed: Invalid argument (1 to {max_cqe})",
                self.spec.name
            )));
        }
        let ctx = self.me.upgrade().ok_or_else(gone)?;
        let channel = Arc::new(Waker::new()?);
        let id = {
            let mut st = self.fabric.state.lock();
            if st.live_on(self.device).1 >= to_usize(self.spec.limits.max_cq) {
                return Err(Error::Rdma(format!(
                    "ibv_create_cq({}) failed: Cannot allocate memory (max_cq {} reached)",
                    self.spec.name, self.spec.limits.max_cq
                )));
            }
            let id = st.new_id();
            st.cqs.insert(
                id,
                CqRec {
                    device: self.device,
                    depth: to_usize(depth),
                    armed: false,
                    channel: channel.clone(),
                    entries: VecDeque::new(),
                    overrun: false,
                    users: 0,
                },
            );
            id
        };
        self.fabric.counters.created("cq");
        Ok(Arc::new(FakeCq {
            fabric: Arc::clone(&self.fabric),
            ctx,
            id,
            channel,
        }))
    }

    fn supports_dmabuf(&self) -> bool {
        self.spec.supports_dmabuf
    }

    fn supports_mw(&self) -> bool {
        self.spec.supports_mw
    }

    fn limits(&self) -> DeviceLimits {
        self.spec.limits
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_waker.as_fd()
    }

    /// Checks "ibv_get_async_event".
    fn next_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.fabric.check("ibv_get_async_event")?;
        let mut st = self.fabric.state.lock();
        let Some(c) = st.contexts.get_mut(&self.id) else {
            return Ok(None);
        };
        let event = c.events.pop_front();
        if c.events.is_empty() {
            c.waker.take();
        }
        Ok(event)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeContext {
    fn drop(&mut self) {
        self.fabric.state.lock().contexts.remove(&self.id);
        self.fabric.counters.destroyed("context");
    }
}

fn gone() -> Error {
    Error::Internal("fake fabric: object used while being destroyed".to_owned())
}

/// A protection domain.
pub(crate) struct FakePd {
    me: Weak<FakePd>,
    fabric: Arc<Fabric>,
    ctx: Arc<FakeContext>,
    id: u64,
}

impl FakePd {
    /// Index of the PD's device on the fabric.
    pub(crate) fn device(&self) -> usize {
        self.ctx.device
    }

    /// The device's name.
    pub(crate) fn device_name(&self) -> &str {
        &self.ctx.spec.name
    }

    fn register(&self, span: Span, iova: u64, len: usize, access: Access) -> Result<Arc<dyn Mr>> {
        let pd = self.me.upgrade().ok_or_else(gone)?;
        let mut st = self.fabric.state.lock();
        let max_mr = self.ctx.spec.limits.max_mr;
        if st.live_on(self.device()).2 >= to_usize(max_mr) {
            return Err(Error::Rdma(format!(
                "ibv_reg_mr({}) failed: Cannot allocate memory (max_mr {max_mr} reached)",
                self.device_name()
            )));
        }
        let Some(index) = st.new_key_index(self.device()) else {
            return Err(Error::Rdma("ibv_reg_mr failed: out of keys".to_owned()));
        };
        let id = st.new_id();
        let (lkey, rkey) = (index | LKEY_TAG, index | RKEY_TAG);
        st.mrs.insert(
            id,
            MrRec {
                device: self.device(),
                pd: self.id,
                lkey,
                rkey,
                iova,
                len,
                span,
                access,
                bound_windows: 0,
                zombie: false,
            },
        );
        if let Some(p) = st.pds.get_mut(&self.id) {
            p.children += 1;
        }
        drop(st);
        self.fabric.counters.created("mr");
        Ok(Arc::new(FakeMr {
            fabric: Arc::clone(&self.fabric),
            pd,
            id,
            lkey,
            rkey,
            iova,
            len,
        }))
    }

    fn create_qp_inner(&self, cq: &Arc<dyn Cq>, caps: QpCaps) -> Result<Arc<dyn Qp>> {
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

impl Pd for FakePd {
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Arc<dyn Mr>> {
        self.fabric.check("ibv_reg_mr")?;
        let fail = |why: &str| {
            Error::Rdma(format!(
                "ibv_reg_mr({}, {addr:#x}+{len}) failed: {why}",
                self.device_name()
            ))
        };
        let Some(span) = Span::new(addr, len) else {
            return Err(fail("Invalid argument (empty, null or wrapping range)"));
        };
        check_mr_access(access).map_err(fail)?;
        let memory = self.fabric.device_memory.lock().clone();
        if memory.is_some_and(|m| m.is_device_memory(addr, len)) {
            return Err(fail(
                "Bad address (device memory needs peer-memory support or dma-buf)",
            ));
        }
        self.register(span, to_u64(addr), len, access)
    }

    fn reg_dmabuf_mr(
        &self,
        dmabuf: &OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<dyn Mr>> {
        self.fabric.check("ibv_reg_dmabuf_mr")?;
        let fail = |why: &str| {
            Error::Rdma(format!(
                "ibv_reg_dmabuf_mr({}, offset {offset}, {len} bytes) failed: {why}",
                self.device_name()
            ))
        };
        if !self.ctx.spec.supports_dmabuf {
            return Err(fail("Operation not supported"));
        }
        check_mr_access(access).map_err(fail)?;
        let memory = self.fabric.device_memory.lock().clone();
        let Some((memory, (base, size))) =
            memory.and_then(|m| m.dmabuf_range(dmabuf).map(|range| (m, range)))
        else {
            return Err(fail("Bad file descriptor (not a dma-buf of the fake GPU)"));
        };
        let start = usize::try_from(offset)
            .ok()
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= size));
        let span = start.and_then(|o| {
            let addr = base.checked_add(o)?;
            if memory.host_accessible() {
                Span::new(addr, len)
            } else {
                Span::device(addr, len)
            }
        });
        let Some(span) = span.filter(|_| iova.checked_add(to_u64(len)).is_some()) else {
            return Err(fail("Invalid argument (range outside the dma-buf)"));
        };
        self.register(span, iova, len, access)
    }

    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps) -> Result<Arc<dyn Qp>> {
        self.fabric.check("ibv_create_qp")?;
        self.create_qp_inner(cq, caps)
    }

    fn alloc_mw(&self) -> Result<Arc<dyn Mw>> {
        self.fabric.check("ibv_alloc_mw")?;
        if !self.ctx.spec.supports_mw {
            return Err(Error::Rdma(format!(
                "ibv_alloc_mw({}) failed: Operation not supported",
                self.device_name()
            )));
        }
        let pd = self.me.upgrade().ok_or_else(gone)?;
        let mut st = self.fabric.state.lock();
        let max_mw = self.ctx.spec.limits.max_mw;
        if st.live_on(self.device()).3 >= to_usize(max_mw) {
            return Err(Error::Rdma(format!(
                "ibv_alloc_mw({}) failed: Cannot allocate memory (max_mw {max_mw} reached)",
                self.device_name()
            )));
        }
        let Some(rkey) = st.new_key_index(self.device()) else {
            return Err(Error::Rdma("ibv_alloc_mw failed: out of keys".to_owned()));
        };
        let id = st.new_id();
        st.mws.insert(
            id,
            MwRec {
                device: self.device(),
                pd: self.id,
                rkey,
                binding: None,
            },
        );
        if let Some(p) = st.pds.get_mut(&self.id) {
            p.children += 1;
        }
        drop(st);
        self.fabric.counters.created("mw");
        Ok(Arc::new(FakeMw {
            fabric: Arc::clone(&self.fabric),
            _pd: pd,
            id,
            rkey,
            carried: AtomicU32::new(rkey),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `ibv_reg_mr(3)`: remote write or atomic access needs local write.
fn check_mr_access(access: Access) -> std::result::Result<(), &'static str> {
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        && !access.contains(Access::LOCAL_WRITE)
    {
        Err("Invalid argument (REMOTE_WRITE needs LOCAL_WRITE)")
    } else {
        Ok(())
    }
}

impl Drop for FakePd {
    fn drop(&mut self) {
        let mut st = self.fabric.state.lock();
        let children = st.pds.get(&self.id).map_or(0, |p| p.children);
        if children > 0 {
            // ibv_dealloc_pd fails with EBUSY: count it and leak.
            drop(st);
            self.fabric.destroy_failed(format_args!(
                "ibv_dealloc_pd on {} failed: Device or resource busy ({children} live MRs, \
                 MWs or QPs)",
                self.ctx.spec.name
            ));
            return;
        }
        st.pds.remove(&self.id);
        drop(st);
        self.fabric.counters.destroyed("pd");
    }
}

/// A completion queue.
struct FakeCq {
    fabric: Arc<Fabric>,
    ctx: Arc<FakeContext>,
    id: u64,
    channel: Arc<Waker>,
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
        Ok(cq.entries.drain(..n).collect())
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

/// A memory region.
struct FakeMr {
    fabric: Arc<Fabric>,
    pd: Arc<FakePd>,
    id: u64,
    lkey: u32,
    rkey: u32,
    iova: u64,
    len: usize,
}

impl Mr for FakeMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn addr(&self) -> u64 {
        self.iova
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        let mut st = self.fabric.state.lock();
        let windows = st.mrs.get(&self.id).map_or(0, |m| m.bound_windows);
        if windows > 0 {
            // rxe_dereg_mr refuses while type-2 windows are bound (IBA
            // 10.6.7.2.6): leak, and never touch the memory again.
            if let Some(m) = st.mrs.get_mut(&self.id) {
                m.zombie = true;
            }
            drop(st);
            self.fabric.destroy_failed(format_args!(
                "ibv_dereg_mr on {} failed: Invalid argument ({windows} memory windows still \
                 bound)",
                self.pd.device_name()
            ));
            return;
        }
        st.mrs.remove(&self.id);
        if let Some(p) = st.pds.get_mut(&self.pd.id) {
            p.children = p.children.saturating_sub(1);
        }
        drop(st);
        self.fabric.counters.destroyed("mr");
    }
}

/// A type-2 memory window.
struct FakeMw {
    fabric: Arc<Fabric>,
    _pd: Arc<FakePd>,
    id: u64,
    rkey: u32,
    /// What `ibv_mw.rkey` holds: the allocation's rkey, then that of the
    /// last bind posted (refused or not), carried by the next bind.
    carried: AtomicU32,
}

impl Mw for FakeMw {
    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeMw {
    fn drop(&mut self) {
        let mut st = self.fabric.state.lock();
        if let Some(w) = st.mws.remove(&self.id) {
            if let Some(m) = w.binding.and_then(|b| st.mrs.get_mut(&b.mr)) {
                m.bound_windows = m.bound_windows.saturating_sub(1);
            }
            if let Some(p) = st.pds.get_mut(&w.pd) {
                p.children = p.children.saturating_sub(1);
            }
        }
        drop(st);
        self.fabric.counters.destroyed("mw");
    }
}

/// A Reliable Connection queue pair.
struct FakeQp {
    fabric: Arc<Fabric>,
    /// "QP n on device", for messages (without taking the lock).
    name: String,
    _pd: Arc<FakePd>,
    _cq: Arc<dyn Cq>,
    key: QpKey,
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
            SendOp::Send => Kind::Send { imm: None },
            SendOp::SendImm { imm } => Kind::Send { imm: Some(*imm) },
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
        for wr in converted {
            let seq = qp.next_seq;
            qp.next_seq += 1;
            qp.sends.push_back(Pending { wr, psn: None, seq });
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
    use super::*;
    use crate::platform::next_rkey;

    const A_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const B_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
    const A_SQ_PSN: u32 = 0x00b9_d84f;
    const B_SQ_PSN: u32 = 0x0010_b6b5;
    const BUF: usize = 256 * 1024;
    const KIB64: u32 = 64 * 1024;
    const ALL: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
        .union(Access::MW_BIND);

    /// One end: a device's context, PD, CQ, an INIT QP and a registered
    /// buffer. Field order: the MR goes before the buffer it covers.
    struct End {
        qp: Arc<dyn Qp>,
        mr: Arc<dyn Mr>,
        buf: Vec<u8>,
        cq: Arc<dyn Cq>,
        pd: Arc<dyn Pd>,
        ctx: Arc<dyn Context>,
    }

    impl End {
        fn new(fabric: &Arc<Fabric>, device: &str) -> End {
            let ctx = fabric.verbs(&[device]).open(device).expect("open");
            let pd = ctx.alloc_pd().expect("pd");
            let cq = ctx.create_cq(64).expect("cq");
            let mut buf = vec![0u8; BUF];
            let mr = pd.reg_mr(buf.as_mut_ptr() as usize, BUF, ALL).expect("mr");
            let qp = pd.create_qp(&cq, caps()).expect("qp");
            qp.modify(&init(ALL)).expect("init");
            End {
                qp,
                mr,
                buf,
                cq,
                pd,
                ctx,
            }
        }

        fn addr(&self, offset: usize) -> u64 {
            self.mr.addr() + to_u64(offset)
        }

        fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
            Some(Sge {
                addr: self.addr(offset),
                len,
                lkey: self.mr.lkey(),
            })
        }

        fn gid(&self) -> Gid {
            self.ctx.query_gid(1, 1).expect("gid")
        }

        fn poll(&self) -> Vec<Completion> {
            self.cq.poll(64).expect("poll")
        }

        fn state(&self) -> QpState {
            self.qp.state().expect("state")
        }

        fn recv(&self, wr_id: u64, sge: Option<Sge>) {
            self.qp.post_recv(RecvWr { wr_id, sge }).expect("post_recv");
        }
    }

    fn caps() -> QpCaps {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
        }
    }

    fn init(access: Access) -> QpAttr {
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(access),
            ..QpAttr::default()
        }
    }

    fn state(state: QpState) -> QpAttr {
        QpAttr {
            state: Some(state),
            ..QpAttr::default()
        }
    }

    /// How two ends are connected.
    #[derive(Clone, Copy)]
    struct Link {
        retry_cnt: u8,
        rnr_retry: u8,
        /// A's `max_rd_atomic`.
        max_rd_atomic: u8,
        /// B's `max_dest_rd_atomic`.
        max_dest_rd_atomic: u8,
        a_mtu: Mtu,
        b_mtu: Mtu,
        /// Added to B's `rq_psn` (24-bit).
        b_rq_psn_offset: u32,
    }

    impl Default for Link {
        fn default() -> Link {
            Link {
                retry_cnt: 6,
                rnr_retry: 7,
                max_rd_atomic: 4,
                max_dest_rd_atomic: 4,
                a_mtu: Mtu::Mtu1024,
                b_mtu: Mtu::Mtu1024,
                b_rq_psn_offset: 0,
            }
        }
    }

    fn rtr(peer: &End, rq_psn: u32, mtu: Mtu, max_dest_rd_atomic: u8) -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(roce_av(peer.gid())),
            path_mtu: Some(mtu),
            dest_qp_num: Some(peer.qp.qp_num()),
            rq_psn: Some(rq_psn),
            max_dest_rd_atomic: Some(max_dest_rd_atomic),
            min_rnr_timer: Some(1),
            ..QpAttr::default()
        }
    }

    fn rts(sq_psn: u32, link: Link, max_rd_atomic: u8) -> QpAttr {
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: Some(14),
            retry_cnt: Some(link.retry_cnt),
            rnr_retry: Some(link.rnr_retry),
            max_rd_atomic: Some(max_rd_atomic),
            ..QpAttr::default()
        }
    }

    /// A (INIT) to RTR and RTS aimed at B; B untouched.
    fn aim_a(a: &End, b: &End, link: Link) {
        a.qp.modify(&rtr(b, B_SQ_PSN, link.a_mtu, 4))
            .expect("A RTR");
        a.qp.modify(&rts(A_SQ_PSN, link, link.max_rd_atomic))
            .expect("A RTS");
    }

    /// B (INIT) to RTR and RTS aimed at A.
    fn aim_b(a: &End, b: &End, link: Link) {
        let rq_psn = A_SQ_PSN.wrapping_add(link.b_rq_psn_offset) & PSN_MASK;
        b.qp.modify(&rtr(a, rq_psn, link.b_mtu, link.max_dest_rd_atomic))
            .expect("B RTR");
        b.qp.modify(&rts(B_SQ_PSN, link, 4)).expect("B RTS");
    }

    fn connect(a: &End, b: &End, link: Link) {
        aim_a(a, b, link);
        aim_b(a, b, link);
    }

    /// Both ends back through RESET and INIT, then connected again.
    fn reconnect(a: &End, b: &End, link: Link) {
        for end in [a, b] {
            end.qp.modify(&state(QpState::Reset)).expect("RESET");
            end.qp.modify(&init(ALL)).expect("INIT");
        }
        connect(a, b, link);
    }

    /// A fabric with devices a (192.0.2.1) and b (192.0.2.2), port MTU 4096.
    fn fabric() -> Arc<Fabric> {
        let fabric = Fabric::new(Arc::new(Faults::new()), Arc::new(Counters::new()));
        for (name, ip) in [("a", A_IP), ("b", B_IP)] {
            let spec = DeviceSpec {
                port_mtu: Mtu::Mtu4096,
                supports_dmabuf: true,
                ..DeviceSpec::new(name, ip)
            };
            fabric.add_device(spec).expect("device");
        }
        fabric
    }

    fn pair() -> (Arc<Fabric>, End, End) {
        let fabric = fabric();
        let a = End::new(&fabric, "a");
        let b = End::new(&fabric, "b");
        (fabric, a, b)
    }

    fn pattern(buf: &mut [u8], seed: u8) {
        for (byte, n) in buf.iter_mut().zip((0..251u8).cycle()) {
            *byte = seed.wrapping_add(n);
        }
    }

    fn write(a: &End, offset: usize, len: u32, remote: u64, rkey: u32) -> SendWr {
        SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: remote,
                rkey,
            },
            sge: a.sge(offset, len),
            signaled: true,
        }
    }

    fn write_imm(a: &End, len: u32, remote: u64, rkey: u32, imm: u32) -> SendWr {
        SendWr {
            wr_id: 2,
            op: SendOp::WriteImm {
                remote_addr: remote,
                rkey,
                imm,
            },
            sge: if len == 0 { None } else { a.sge(0, len) },
            signaled: true,
        }
    }

    fn read(a: &End, offset: usize, len: u32, remote: u64, rkey: u32) -> SendWr {
        SendWr {
            wr_id: 3,
            op: SendOp::Read {
                remote_addr: remote,
                rkey,
            },
            sge: a.sge(offset, len),
            signaled: true,
        }
    }

    /// The error of a call that must fail (for results whose value has no
    /// `Debug`).
    fn err_of<T>(result: Result<T>) -> Error {
        match result {
            Ok(_) => panic!("the call succeeded"),
            Err(e) => e,
        }
    }

    fn statuses(c: &[Completion]) -> Vec<WcStatus> {
        c.iter().map(|c| c.status).collect()
    }

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

    /// Stricter than rxe, which checks only the region's bounds: a window
    /// grants nothing outside its own range.
    #[test]
    fn a_window_grants_only_its_range() {
        let (_f, mut a, b) = pair();
        pattern(&mut a.buf[..16], 10);
        connect(&a, &b, Link::default());
        let mw = b.pd.alloc_mw().expect("mw");
        let rkey = next_rkey(mw.rkey());
        let bind = SendWr {
            wr_id: 20,
            op: SendOp::BindMw {
                mw: Arc::clone(&mw),
                rkey,
                mr: Arc::clone(&b.mr),
                addr: b.addr(4096),
                len: 8192,
                access: Access::REMOTE_WRITE,
            },
            sge: None,
            signaled: true,
        };
        b.qp.post_send(&[bind]).expect("bind");
        assert_eq!(statuses(&b.poll()), [WcStatus::Success]);
        a.qp.post_send(&[write(&a, 0, 16, b.addr(12288 - 8), rkey)])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemAccessErr]);
        assert!(b.buf[12280..12296].iter().all(|&x| x == 0));
        assert_eq!(b.state(), QpState::Err);
    }

    /// The fake's exact statuses of failed local operations (rxe reports
    /// them as flushed).
    #[test]
    fn failed_binds_and_invalidates_complete_with_their_own_status() {
        let (_f, a, b) = pair();
        connect(&a, &b, Link::default());
        let mw = b.pd.alloc_mw().expect("mw");
        let bind = |rkey| SendWr {
            wr_id: 20,
            op: SendOp::BindMw {
                mw: Arc::clone(&mw),
                rkey,
                mr: Arc::clone(&b.mr),
                addr: b.addr(0),
                len: 4096,
                access: Access::REMOTE_WRITE,
            },
            sge: None,
            signaled: true,
        };
        let first = next_rkey(mw.rkey());
        b.qp.post_send(&[bind(first)]).expect("bind");
        b.qp.post_send(&[bind(next_rkey(first))]).expect("rebind");
        assert_eq!(
            statuses(&b.poll()),
            [WcStatus::Success, WcStatus::MwBindErr]
        );
        reconnect(&a, &b, Link::default());
        let inv = SendWr {
            wr_id: 21,
            op: SendOp::LocalInv {
                rkey: next_rkey(first),
            },
            sge: None,
            signaled: true,
        };
        b.qp.post_send(&[inv]).expect("post");
        assert_eq!(statuses(&b.poll()), [WcStatus::Other(WC_LOC_QP_OP_ERR)]);
        assert_eq!(b.state(), QpState::Err);
    }

    /// Stricter than rxe, whose MR rkey is its lkey: the fake's differ, so
    /// a key used in the other's place is caught.
    #[test]
    fn an_lkey_is_no_rkey_and_an_rkey_no_lkey() {
        let (_f, a, b) = pair();
        let link = Link::default();
        connect(&a, &b, link);
        a.qp.post_send(&[write(&a, 0, 16, b.addr(0), b.mr.lkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemAccessErr]);
        assert_eq!(b.state(), QpState::Err);
        reconnect(&a, &b, link);
        let mut bad = write(&a, 0, 16, b.addr(0), b.mr.rkey());
        bad.sge = Some(Sge {
            lkey: a.mr.rkey(),
            ..a.sge(0, 16).expect("sge")
        });
        a.qp.post_send(&[bad]).expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::LocProtErr]);
        assert_eq!(b.state(), QpState::Rts, "local errors stay local");
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

    #[test]
    fn device_memory_registers_only_through_dmabuf() {
        struct Gpu {
            addr: usize,
            len: usize,
            fd: i32,
        }
        impl DeviceMemory for Gpu {
            fn is_device_memory(&self, addr: usize, len: usize) -> bool {
                addr < self.addr + self.len && self.addr < addr + len
            }
            fn dmabuf_range(&self, fd: &OwnedFd) -> Option<(usize, usize)> {
                use std::os::fd::AsRawFd;
                (fd.as_raw_fd() == self.fd).then_some((self.addr, self.len))
            }
        }
        let (fabric, mut a, b) = pair();
        pattern(&mut a.buf[..4096], 12);
        let mut vram = vec![0u8; 1 << 20];
        let dmabuf = OwnedFd::from(std::fs::File::open("/dev/null").expect("fd"));
        let other = OwnedFd::from(std::fs::File::open("/dev/null").expect("fd"));
        use std::os::fd::AsRawFd;
        fabric.set_device_memory(Arc::new(Gpu {
            addr: vram.as_mut_ptr() as usize,
            len: vram.len(),
            fd: dmabuf.as_raw_fd(),
        }));
        let plain = b.pd.reg_mr(vram.as_mut_ptr() as usize + 4096, 4096, ALL);
        assert!(err_of(plain).to_string().contains("Bad address"));
        let iova = 0x7000_0000_0000;
        assert!(
            b.pd.reg_dmabuf_mr(&other, 0, 4096, iova, ALL).is_err(),
            "unknown fd"
        );
        assert!(
            b.pd.reg_dmabuf_mr(&dmabuf, (1 << 20) - 16, 4096, iova, ALL)
                .is_err(),
            "past the end"
        );
        let mr =
            b.pd.reg_dmabuf_mr(&dmabuf, 8192, 4096, iova, ALL)
                .expect("dmabuf mr");
        assert_eq!((mr.addr(), mr.len()), (iova, 4096));
        connect(&a, &b, Link::default());
        a.qp.post_send(&[write(&a, 0, 4096, iova, mr.rkey())])
            .expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::Success]);
        drop(mr);
        assert_eq!(
            vram[8192..12288],
            a.buf[..4096],
            "landed at the dma-buf offset"
        );
        // A device without dma-buf support.
        fabric
            .add_device(DeviceSpec::new("rxe0", Ipv4Addr::new(192, 0, 2, 9)))
            .expect("device");
        let rxe = End::new(&fabric, "rxe0");
        let err = err_of(rxe.pd.reg_dmabuf_mr(&dmabuf, 0, 4096, iova, ALL));
        assert!(err.to_string().contains("Operation not supported"), "{err}");
    }

    #[test]
    fn destroying_an_mr_with_a_bound_window_fails_and_leaks() {
        let (fabric, a, b) = pair();
        connect(&a, &b, Link::default());
        let counters = Arc::clone(fabric.counters());
        let mut extra = vec![0u8; 4096];
        let mr =
            b.pd.reg_mr(extra.as_mut_ptr() as usize, 4096, ALL)
                .expect("mr");
        let mw = b.pd.alloc_mw().expect("mw");
        let rkey = next_rkey(mw.rkey());
        let bind = SendWr {
            wr_id: 1,
            op: SendOp::BindMw {
                mw: Arc::clone(&mw),
                rkey,
                mr: Arc::clone(&mr),
                addr: mr.addr(),
                len: 4096,
                access: Access::REMOTE_WRITE,
            },
            sge: None,
            signaled: false,
        };
        b.qp.post_send(&[bind]).expect("bind");
        drop(mr);
        assert_eq!(counters.live("destroy_failed"), 1);
        assert_eq!(counters.live("mr"), 3, "leaked");
        // The leaked registration's memory is never touched again.
        a.qp.post_send(&[write(&a, 0, 16, 0, rkey)]).expect("post");
        assert_eq!(statuses(&a.poll()), [WcStatus::RemAccessErr]);
        drop(extra);
        drop((mw, a, b));
        // The leaked MR keeps its PD alive: that destroy fails too.
        assert_eq!(counters.live("destroy_failed"), 2);
        assert_eq!(
            counters.snapshot(),
            [("destroy_failed", 2), ("mr", 1), ("pd", 1)]
        );
    }

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
    fn devices_have_the_rxe_gid_layout() {
        let fabric = fabric();
        assert!(fabric
            .add_device(DeviceSpec::new("a", Ipv4Addr::new(10, 0, 0, 1)))
            .is_err());
        assert!(fabric.add_device(DeviceSpec::new("c", A_IP)).is_err());
        let verbs = fabric.verbs(&["b", "zz"]);
        assert_eq!(verbs.device_names().expect("names"), ["b"]);
        assert!(verbs.open("a").is_err(), "not this host's");
        let ctx = verbs.open("b").expect("open");
        let port = ctx.query_port(1).expect("port");
        assert_eq!(
            (port.state, port.active_mtu, port.link_layer),
            (PortState::Active, Mtu::Mtu4096, LinkLayer::Ethernet)
        );
        assert_eq!(ctx.query_gid(1, 1).expect("gid"), ipv4_gid(B_IP));
        let link_local = ctx.query_gid(1, 0).expect("gid");
        assert_eq!(link_local[..2], [0xfe, 0x80]);
        assert!(ctx.query_gid(1, 2).is_err());
        assert!(ctx.query_port(2).is_err());
        assert_eq!(fabric.gid("b", 1), Some(ipv4_gid(B_IP)));
    }
}
