//! The fake RDMA CM over the fake fabric.
//!
//! It reproduces what the kernel CM and librdmacm do in the rxe lab
//! (`lab/rxe/CMTEST.md`):
//!
//! - listeners are bound to a device's IPv4 address and a port (0: an
//!   ephemeral one);
//! - `connect` creates the active QP (RESET -> INIT with local write, remote
//!   write and remote read), picks a random-looking but deterministic 24-bit
//!   PSN for each CM id, and blocks until the passive side accepts or
//!   rejects, or the deadline passes;
//! - the CONNECT_REQUEST carries the private data padded to 56 bytes, and
//!   `responder_resources` / `initiator_depth` already from the passive
//!   side's view (swapped);
//! - `init_qp_attr` returns exactly the CM's attributes and masks (RTR
//!   `0x129181`, RTS `0x12e01`), including `min_rnr_timer` 0 (655 ms, which
//!   callers must override);
//! - `accept` requires the named QP to exist on the listening device and be
//!   in RTS already (the design's order; stricter than the kernel CM, which
//!   would let the server's first packets hit a QP that drops them), then
//!   does what the REP does to the active QP (RTR, RTS with the accept's
//!   values), and both sides see ESTABLISHED;
//! - `reject` reaches the active side with the private data padded to 148
//!   bytes; a request dropped unanswered is rejected too;
//! - `disconnect` on either side: the passive side's listener gets
//!   DISCONNECTED and the active side's connection reports it; the active
//!   side's own disconnect (or its dropped id) moves its QP to ERR, as the
//!   production active side does, while the peer's leaves it alone, and
//!   the passive side's own QP is never touched;
//! - connecting where nothing listens is a REJ from the passive side's CM
//!   (`ConnectOutcome::Rejected`, 148 zero bytes), as on Soft-RoCE;
//! - a REP whose passive QP the active side's device still has a
//!   connection to (one whose disconnect handshake has not finished: a
//!   side has not called `disconnect`) is stale (the kernel CM's REP
//!   handler checks the remote QP number against its live connections,
//!   `IB_CM_REJ_STALE_CONN`): `rdma_accept` succeeds, the active side is
//!   rejected (no private data) and the passive side sees the connection
//!   fail. A server that never answers a DREQ keeps the number stale.
//!
//! Faults: "rdma_listen", "rdma_connect", "rdma_accept", "rdma_reject",
//! "rdma_disconnect", "rdma_init_qp_attr", "rdma_get_cm_event". Live CM ids
//! (listeners, pending requests, connections of either side) are counted
//! under "cm_id".
//!
//! Locking: the CM's lock is taken before the fabric's, never after, and no
//! fake object is dropped while it is held (the records hold keys, not
//! `Arc`s).

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::fabric::{roce_av, DeviceInfo, Fabric, QpKey, MAX_RD_ATOMIC, PSN_MASK};
use hipobj::error::{Error, Result};
use hipobj::platform::{
    AcceptParams, Access, Cm, CmConnection, CmEvent, CmListener, CmRequest, ConnectOutcome,
    ConnectRequest, Gid, Mtu, Qp, QpAttr, QpState, Waker, CM_REQ_PRIVATE_DATA_MAX,
};

/// Length of a CONNECT_REQUEST's private data as the passive side sees it
/// (`RDMA_PS_TCP`: 56 bytes, whatever was sent).
pub const REQ_PRIVATE_DATA_LEN: usize = CM_REQ_PRIVATE_DATA_MAX;
/// Length of a REJ's private data as the active side sees it.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// A REP's private data as it arrives: padded to 196 bytes.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// The CM's local ACK timeout for RoCE (4.096 us * 2^17, about 537 ms).
const CM_TIMEOUT: u8 = 17;
/// Access flags `rdma_create_qp` gives its QP at INIT.
const CM_QP_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
/// Linux's default ephemeral port range.
const EPHEMERAL_PORTS: (u16, u16) = (32_768, 60_999);
/// Seed of PSNs and ephemeral ports.
const SEED: u64 = 0x6869_706f_626a_434d;

/// splitmix64: a deterministic, random-looking function of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The starting PSN the CM picks for CM id `id`.
fn psn_of(id: u64) -> u32 {
    u32::try_from(mix(SEED ^ id) & u64::from(PSN_MASK)).unwrap_or(0)
}

fn padded(data: &[u8], len: usize) -> Vec<u8> {
    let mut out = data.to_vec();
    out.resize(len.max(data.len()), 0);
    out
}

fn rdma(message: String) -> Error {
    Error::Rdma(message)
}

/// The CM's state, shared by every host's [`Cm`] of one fabric.
pub(crate) struct Hub {
    state: Mutex<HubState>,
    /// Notified on every event, outcome and wake.
    changed: Condvar,
}

impl Hub {
    /// No listeners, no connections.
    pub(crate) fn new() -> Hub {
        Hub {
            state: Mutex::new(HubState::default()),
            changed: Condvar::new(),
        }
    }
}

#[derive(Default)]
struct HubState {
    /// Last CM id handed out (ids are unique across the fabric).
    last_id: u64,
    listeners: BTreeMap<u64, ListenerRec>,
    /// Pending CONNECT_REQUESTs by passive CM id.
    requests: HashMap<u64, RequestRec>,
    /// How each waiting `connect` ended, by active CM id.
    outcomes: HashMap<u64, Outcome>,
    connections: HashMap<u64, ConnRec>,
}

struct ListenerRec {
    ip: Ipv4Addr,
    port: u16,
    queue: VecDeque<Queued>,
    woken: bool,
    /// The event channel: readable while the queue is not empty.
    channel: Arc<Waker>,
    /// A sustained flood of connect requests into it, if one is on.
    flood: Option<Flood>,
}

/// An event waiting in a listener's channel.
#[derive(Clone, Copy)]
enum Queued {
    Request(u64),
    Established(u64),
    Disconnected(u64),
}

/// What the passive side learns from a REQ, and what the CM chose.
#[derive(Clone)]
struct RequestInfo {
    private_data: Vec<u8>,
    /// Passive view: the active side's `initiator_depth`.
    responder_resources: u8,
    /// Passive view: the active side's `responder_resources`.
    initiator_depth: u8,
    active_gid: Gid,
    active_qpn: u32,
    active_psn: u32,
    passive_psn: u32,
    path_mtu: Mtu,
    retry_count: u8,
    rnr_retry_count: u8,
}

struct RequestRec {
    listener: u64,
    /// The listening device.
    device: DeviceInfo,
    active_id: u64,
    active_qp: QpKey,
    info: RequestInfo,
    /// The active side stopped waiting.
    abandoned: bool,
}

enum Outcome {
    /// With the REP's private data, padded.
    Established(Vec<u8>),
    Rejected(Vec<u8>),
    Failed(String),
}

#[derive(Clone, Copy)]
enum Side {
    Active { qp: QpKey, passive: QpKey },
    Passive { listener: u64 },
}

struct ConnRec {
    side: Side,
    peer: Option<u64>,
    disconnected: bool,
    /// This side called `disconnect` (or dropped its id).
    sent: bool,
}

impl HubState {
    fn new_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    fn queue(&mut self, listener: u64, event: Queued) {
        if let Some(l) = self.listeners.get_mut(&listener) {
            l.queue.push_back(event);
            l.channel.wake();
        }
    }

    /// Connection `id`'s side disconnects (or drops its id): the first
    /// time, an active side moves its own QP to ERR (as the production
    /// active side does; the peer's disconnect leaves it alone); unless
    /// already disconnected, both sides are marked and the passive side's
    /// listener gets DISCONNECTED. Idempotent.
    fn disconnect(&mut self, fabric: &Fabric, id: u64) {
        let Some(conn) = self.connections.get_mut(&id) else {
            return;
        };
        let first_call = !conn.sent;
        conn.sent = true;
        let (side, peer, disconnected) = (conn.side, conn.peer, conn.disconnected);
        if let (true, Side::Active { qp, .. }) = (first_call, side) {
            let to_err = QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            };
            // The QP may be gone already; nothing else can fail.
            let _ = fabric.modify_qp_by_key(qp, &to_err);
        }
        if disconnected {
            return;
        }
        for id in [Some(id), peer].into_iter().flatten() {
            let Some(conn) = self.connections.get_mut(&id) else {
                continue;
            };
            conn.disconnected = true;
            if let Side::Passive { listener } = conn.side {
                self.queue(listener, Queued::Disconnected(id));
            }
        }
    }

    /// Whether active device `device` has a connection to passive QP
    /// `passive` whose disconnect handshake has not finished.
    fn is_live(&self, device: usize, passive: QpKey) -> bool {
        self.connections.values().any(|c| {
            let Side::Active { qp, passive: p } = c.side else {
                return false;
            };
            let peer_sent = c
                .peer
                .and_then(|id| self.connections.get(&id))
                .is_none_or(|peer| peer.sent);
            qp.0 == device && p == passive && !(c.sent && peer_sent)
        })
    }

    /// Ends request `id` with a rejection of the active side (unless it
    /// stopped waiting).
    fn reject(&mut self, id: u64, private_data: &[u8]) -> bool {
        let Some(request) = self.requests.remove(&id) else {
            return false;
        };
        if !request.abandoned {
            let data = padded(private_data, REJ_PRIVATE_DATA_LEN);
            self.outcomes
                .insert(request.active_id, Outcome::Rejected(data));
        }
        true
    }
}

// ---------------------------------------------------------------- Cm

/// A host's RDMA CM.
pub(crate) struct FakeCm {
    fabric: Arc<Fabric>,
    visible: Vec<String>,
}

impl FakeCm {
    /// The CM of a host that sees the devices `visible`.
    pub(crate) fn new(fabric: Arc<Fabric>, visible: Vec<String>) -> FakeCm {
        FakeCm { fabric, visible }
    }

    fn hub(&self) -> &Hub {
        &self.fabric.hub
    }

    fn sees(&self, device: &DeviceInfo) -> bool {
        self.visible.contains(&device.name)
    }
}

impl Cm for FakeCm {
    fn listen(&self, addr: SocketAddr) -> Result<Arc<dyn CmListener>> {
        self.fabric.check("rdma_listen")?;
        let SocketAddr::V4(v4) = addr else {
            return Err(rdma(format!(
                "rdma_bind_addr({addr}) failed: Address family not supported (the fake CM \
                 speaks IPv4)"
            )));
        };
        let ip = *v4.ip();
        if self
            .fabric
            .device_by_ip(ip)
            .filter(|d| self.sees(d))
            .is_none()
        {
            return Err(rdma(format!(
                "rdma_bind_addr({addr}) failed: Cannot assign requested address (no RDMA \
                 device of this host has it)"
            )));
        }
        let mut st = self.hub().state.lock();
        let taken =
            |st: &HubState, port: u16| st.listeners.values().any(|l| l.ip == ip && l.port == port);
        let port = if v4.port() != 0 {
            if taken(&st, v4.port()) {
                return Err(rdma(format!(
                    "rdma_bind_addr({addr}) failed: Address already in use"
                )));
            }
            v4.port()
        } else {
            let (low, high) = EPHEMERAL_PORTS;
            let span = u64::from(high - low) + 1;
            let start = mix(SEED ^ st.last_id) % span;
            let free = (0..span)
                .filter_map(|i| u16::try_from((start + i) % span).ok())
                .map(|offset| low + offset)
                .find(|port| !taken(&st, *port));
            let Some(port) = free else {
                return Err(rdma(format!(
                    "rdma_bind_addr({addr}) failed: no ephemeral port left"
                )));
            };
            port
        };
        let channel = Arc::new(Waker::new()?);
        let id = st.new_id();
        st.listeners.insert(
            id,
            ListenerRec {
                ip,
                port,
                queue: VecDeque::new(),
                woken: false,
                channel: channel.clone(),
                flood: None,
            },
        );
        drop(st);
        self.fabric.counters().created("cm_id");
        Ok(Arc::new(FakeListener {
            fabric: Arc::clone(&self.fabric),
            id,
            port,
            channel,
        }))
    }

    fn connect(&self, request: ConnectRequest<'_>) -> Result<ConnectOutcome> {
        self.fabric.check("rdma_connect")?;
        let addr = request.addr;
        let invalid = |why: &str| {
            rdma(format!(
                "rdma_connect({addr}) failed: Invalid argument: {why}"
            ))
        };
        if request.private_data.len() > CM_REQ_PRIVATE_DATA_MAX {
            return Err(invalid("more than 56 bytes of private data"));
        }
        if request.retry_count > 7 || request.rnr_retry_count > 7 {
            return Err(invalid("retry_count and rnr_retry_count are 0..=7"));
        }
        if request.initiator_depth > MAX_RD_ATOMIC || request.responder_resources > MAX_RD_ATOMIC {
            return Err(invalid(
                "initiator_depth and responder_resources are 0..=16",
            ));
        }
        let SocketAddr::V4(v4) = addr else {
            return Err(rdma(format!(
                "rdma_resolve_addr({addr}) failed: Address family not supported"
            )));
        };
        let Some(pd) = self.fabric.fake_pd(request.pd) else {
            return Err(invalid("the PD is not this fabric's"));
        };
        let local = self
            .fabric
            .device_info(pd.device())
            .filter(|d| self.sees(d))
            .ok_or_else(|| invalid("the PD's device is not this host's"))?;
        let remote = self
            .fabric
            .device_by_ip(*v4.ip())
            .filter(|d| d.port_active && local.port_active)
            .ok_or_else(|| {
                rdma(format!(
                    "rdma_resolve_addr({addr}) failed: No route to host (no active RDMA device \
                     has this address)"
                ))
            })?;

        let hub = self.hub();
        let mut st = hub.state.lock();
        let listener = st
            .listeners
            .iter()
            .find(|(_, l)| l.ip == *v4.ip() && l.port == v4.port())
            .map(|(id, _)| *id);
        let Some(listener) = listener else {
            // The passive side's CM answers with a REJ of its own (status
            // 8, IB_CM_REJ_INVALID_SERVICE_ID), without consumer data.
            return Ok(ConnectOutcome::Rejected {
                private_data: vec![0; REJ_PRIVATE_DATA_LEN],
            });
        };
        // rdma_create_qp: the QP, moved to INIT by the CM.
        let qp = self
            .fabric
            .create_qp_unchecked(&pd, request.cq, request.caps)?;
        let Some(active_qp) = self.fabric.qp_key(&qp) else {
            return Err(Error::Internal("fake CM: QP of another fabric".to_owned()));
        };
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(CM_QP_ACCESS),
            ..QpAttr::default()
        };
        self.fabric.modify_qp_by_key(active_qp, &init)?;

        let active_id = st.new_id();
        let passive_id = st.new_id();
        let info = RequestInfo {
            private_data: padded(request.private_data, REQ_PRIVATE_DATA_LEN),
            responder_resources: request.initiator_depth,
            initiator_depth: request.responder_resources,
            active_gid: local.gid,
            active_qpn: active_qp.1,
            active_psn: psn_of(active_id),
            passive_psn: psn_of(passive_id),
            path_mtu: local.mtu.min(remote.mtu),
            retry_count: request.retry_count,
            rnr_retry_count: request.rnr_retry_count,
        };
        st.requests.insert(
            passive_id,
            RequestRec {
                listener,
                device: remote,
                active_id,
                active_qp,
                info,
                abandoned: false,
            },
        );
        st.queue(listener, Queued::Request(passive_id));
        self.fabric.counters().created("cm_id");
        self.fabric.counters().created("cm_id");
        hub.changed.notify_all();

        let outcome = loop {
            if let Some(outcome) = st.outcomes.remove(&active_id) {
                break Some(outcome);
            }
            if hub
                .changed
                .wait_until(&mut st, request.deadline)
                .timed_out()
            {
                break st.outcomes.remove(&active_id);
            }
        };
        let result = match outcome {
            Some(Outcome::Established(reply)) => {
                return Ok(ConnectOutcome::Established(Arc::new(FakeConnection {
                    fabric: Arc::clone(&self.fabric),
                    id: active_id,
                    qp: Some(qp),
                    reply,
                })));
            }
            Some(Outcome::Rejected(private_data)) => Ok(ConnectOutcome::Rejected { private_data }),
            Some(Outcome::Failed(why)) => Err(rdma(format!("rdma_connect({addr}) failed: {why}"))),
            None => {
                if let Some(r) = st.requests.get_mut(&passive_id) {
                    r.abandoned = true;
                }
                Err(rdma(format!(
                    "rdma_connect({addr}): neither ESTABLISHED nor REJECTED before the deadline"
                )))
            }
        };
        drop(st);
        // rdma_destroy_qp and rdma_destroy_id of the failed attempt.
        drop(qp);
        self.fabric.counters().destroyed("cm_id");
        result
    }
}

// ---------------------------------------------------------------- flood

/// A sustained flood of connect requests into a listener: from the
/// device `from`, each with `private_data`.
#[derive(Clone)]
struct Flood {
    from: DeviceInfo,
    to: DeviceInfo,
    private_data: Vec<u8>,
}

impl HubState {
    /// Queues one connect request of `flood` into `listener`, as an
    /// attacker that never waits for its REJ.
    fn queue_flood(&mut self, listener: u64, flood: &Flood) {
        let active_id = self.new_id();
        let passive_id = self.new_id();
        let info = RequestInfo {
            private_data: padded(&flood.private_data, REQ_PRIVATE_DATA_LEN),
            responder_resources: 1,
            initiator_depth: 1,
            active_gid: flood.from.gid,
            // No QP behind it: a flood is refused before any is needed.
            active_qpn: 0,
            active_psn: psn_of(active_id),
            passive_psn: psn_of(passive_id),
            path_mtu: flood.from.mtu.min(flood.to.mtu),
            retry_count: 7,
            rnr_retry_count: 7,
        };
        self.requests.insert(
            passive_id,
            RequestRec {
                listener,
                device: flood.to.clone(),
                active_id,
                active_qp: (usize::MAX, 0),
                info,
                abandoned: true,
            },
        );
        self.queue(listener, Queued::Request(passive_id));
    }
}

impl Fabric {
    /// Starts (`Some(private_data)`) or stops (`None`) a flood of connect
    /// requests from the device `from` into the listener at `to`, sent at
    /// least as fast as the listener's owner reads them: while it lasts,
    /// every event read from that listener is followed by a new request,
    /// so its queue is never empty. Returns whether a listener is there.
    pub fn set_connect_flood(
        &self,
        from: &str,
        to: SocketAddr,
        private_data: Option<&[u8]>,
    ) -> bool {
        let SocketAddr::V4(v4) = to else {
            return false;
        };
        let (Some(from), Some(device)) = (self.device_by_name(from), self.device_by_ip(*v4.ip()))
        else {
            return false;
        };
        let hub = &self.hub;
        let mut st = hub.state.lock();
        let Some((&id, listener)) = st
            .listeners
            .iter_mut()
            .find(|(_, l)| l.ip == *v4.ip() && l.port == v4.port())
        else {
            return false;
        };
        listener.flood = private_data.map(|data| Flood {
            from,
            to: device,
            private_data: data.to_vec(),
        });
        if let Some(flood) = listener.flood.clone() {
            st.queue_flood(id, &flood);
            self.counters().created("cm_id");
        }
        drop(st);
        hub.changed.notify_all();
        true
    }
}

// ---------------------------------------------------------------- listener

/// A listening CM id and its event channel.
struct FakeListener {
    fabric: Arc<Fabric>,
    id: u64,
    port: u16,
    channel: Arc<Waker>,
}

impl CmListener for FakeListener {
    fn port(&self) -> u16 {
        self.port
    }

    fn next_event(&self, deadline: Instant) -> Result<Option<CmEvent>> {
        self.fabric.check("rdma_get_cm_event")?;
        let hub = &self.fabric.hub;
        let mut st = hub.state.lock();
        loop {
            let Some(listener) = st.listeners.get_mut(&self.id) else {
                return Err(Error::Internal("fake CM: listener vanished".to_owned()));
            };
            if listener.woken {
                listener.woken = false;
                return Ok(None);
            }
            let event = listener.queue.pop_front();
            if let (Some(_), Some(flood)) = (&event, listener.flood.clone()) {
                st.queue_flood(self.id, &flood);
                self.fabric.counters().created("cm_id");
            }
            let Some(listener) = st.listeners.get_mut(&self.id) else {
                return Err(Error::Internal("fake CM: listener vanished".to_owned()));
            };
            if listener.queue.is_empty() {
                listener.channel.take();
            }
            if let Some(event) = event {
                return Ok(Some(match event {
                    Queued::Established(conn) => CmEvent::Established { conn },
                    Queued::Disconnected(conn) => CmEvent::Disconnected { conn },
                    Queued::Request(id) => {
                        let Some(request) = st.requests.get(&id) else {
                            continue;
                        };
                        CmEvent::ConnectRequest(Box::new(FakeRequest {
                            fabric: Arc::clone(&self.fabric),
                            id,
                            info: request.info.clone(),
                            answered: false,
                        }))
                    }
                }));
            }
            if hub.changed.wait_until(&mut st, deadline).timed_out() {
                let idle = st
                    .listeners
                    .get(&self.id)
                    .is_none_or(|l| l.queue.is_empty() && !l.woken);
                if idle {
                    return Ok(None);
                }
            }
        }
    }

    fn wake(&self) {
        let hub = &self.fabric.hub;
        if let Some(l) = hub.state.lock().listeners.get_mut(&self.id) {
            l.woken = true;
        }
        hub.changed.notify_all();
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

impl Drop for FakeListener {
    fn drop(&mut self) {
        let hub = &self.fabric.hub;
        let mut st = hub.state.lock();
        let mut destroyed = 1;
        if let Some(listener) = st.listeners.remove(&self.id) {
            // Requests nobody took are rejected with their ids.
            for event in listener.queue {
                if let Queued::Request(id) = event {
                    if st.reject(id, &[]) {
                        destroyed += 1;
                    }
                }
            }
        }
        drop(st);
        hub.changed.notify_all();
        for _ in 0..destroyed {
            self.fabric.counters().destroyed("cm_id");
        }
    }
}

// ---------------------------------------------------------------- request

/// A CONNECT_REQUEST's new CM id, until accepted or rejected.
struct FakeRequest {
    fabric: Arc<Fabric>,
    id: u64,
    info: RequestInfo,
    /// `accept` or `reject` took over the id.
    answered: bool,
}

impl CmRequest for FakeRequest {
    fn private_data(&self) -> &[u8] {
        &self.info.private_data
    }

    fn responder_resources(&self) -> u8 {
        self.info.responder_resources
    }

    fn initiator_depth(&self) -> u8 {
        self.info.initiator_depth
    }

    fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        self.fabric.check("rdma_init_qp_attr")?;
        let info = &self.info;
        match state {
            QpState::Init => Ok(QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(CM_QP_ACCESS),
                ..QpAttr::default()
            }),
            QpState::Rtr => Ok(QpAttr {
                state: Some(QpState::Rtr),
                av: Some(roce_av(self.info.active_gid)),
                path_mtu: Some(info.path_mtu),
                dest_qp_num: Some(info.active_qpn),
                rq_psn: Some(info.active_psn),
                max_dest_rd_atomic: Some(info.responder_resources),
                // The CM always says 0, i.e. 655.36 ms per RNR NAK (P9).
                min_rnr_timer: Some(0),
                ..QpAttr::default()
            }),
            QpState::Rts => Ok(QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(info.passive_psn),
                timeout: Some(CM_TIMEOUT),
                retry_cnt: Some(info.retry_count),
                rnr_retry: Some(info.rnr_retry_count),
                max_rd_atomic: Some(info.initiator_depth),
                ..QpAttr::default()
            }),
            other => Err(rdma(format!(
                "rdma_init_qp_attr failed: Invalid argument (state {other:?})"
            ))),
        }
    }

    fn accept(mut self: Box<Self>, params: AcceptParams) -> Result<Arc<dyn CmConnection>> {
        self.fabric.check("rdma_accept")?;
        if params.rnr_retry_count > 7
            || params.private_data.len() > REP_PRIVATE_DATA_LEN
            || params.responder_resources > MAX_RD_ATOMIC
            || params.initiator_depth > MAX_RD_ATOMIC
        {
            return Err(rdma(format!(
                "rdma_accept failed: Invalid argument ({params:?})"
            )));
        }
        let hub = &self.fabric.hub;
        let mut st = hub.state.lock();
        let Some(request) = st.requests.get(&self.id) else {
            return Err(Error::Internal("fake CM: request vanished".to_owned()));
        };
        let key = (request.device.index, params.qp_num);
        match self.fabric.qp_state_by_key(key) {
            Some(QpState::Rts) => {}
            Some(state) => {
                return Err(rdma(format!(
                    "rdma_accept(qp_num {}) failed: the QP is in {state:?}; move it to RTR \
                     and RTS with init_qp_attr before accepting",
                    params.qp_num
                )))
            }
            None => {
                return Err(rdma(format!(
                    "rdma_accept(qp_num {}) failed: no such QP on {}",
                    params.qp_num, request.device.name
                )))
            }
        }
        let Some(request) = st.requests.remove(&self.id) else {
            return Err(Error::Internal("fake CM: request vanished".to_owned()));
        };
        self.answered = true;
        let passive = self.id;
        let listener = request.listener;
        let mut conn = ConnRec {
            side: Side::Passive { listener },
            peer: None,
            disconnected: false,
            sent: false,
        };

        // What the REP does on the active side.
        let stale = st.is_live(request.active_qp.0, key);
        let rep = if request.abandoned {
            Err("the active side stopped waiting".to_owned())
        } else if stale {
            Err("stale".to_owned())
        } else {
            let rtr = QpAttr {
                state: Some(QpState::Rtr),
                av: Some(roce_av(request.device.gid)),
                path_mtu: Some(self.info.path_mtu),
                dest_qp_num: Some(params.qp_num),
                rq_psn: Some(self.info.passive_psn),
                max_dest_rd_atomic: Some(params.initiator_depth),
                min_rnr_timer: Some(0),
                ..QpAttr::default()
            };
            let rts = QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(self.info.active_psn),
                timeout: Some(CM_TIMEOUT),
                retry_cnt: Some(self.info.retry_count),
                rnr_retry: Some(params.rnr_retry_count),
                max_rd_atomic: Some(params.responder_resources),
                ..QpAttr::default()
            };
            self.fabric
                .modify_qp_by_key(request.active_qp, &rtr)
                .and_then(|()| self.fabric.modify_qp_by_key(request.active_qp, &rts))
                .map_err(|e| format!("the REP could not be applied: {e}"))
        };
        match rep {
            Ok(()) => {
                conn.peer = Some(request.active_id);
                st.connections.insert(
                    request.active_id,
                    ConnRec {
                        side: Side::Active {
                            qp: request.active_qp,
                            passive: key,
                        },
                        peer: Some(passive),
                        disconnected: false,
                        sent: false,
                    },
                );
                let reply = padded(&params.private_data, REP_PRIVATE_DATA_LEN);
                st.outcomes
                    .insert(request.active_id, Outcome::Established(reply));
                st.queue(listener, Queued::Established(passive));
            }
            Err(why) if why == "stale" => {
                // The active side's CM refuses the REP: a REJ (stale
                // connection, no private data) to both sides.
                st.outcomes.insert(
                    request.active_id,
                    Outcome::Rejected(padded(&[], REJ_PRIVATE_DATA_LEN)),
                );
                conn.disconnected = true;
                st.queue(listener, Queued::Disconnected(passive));
            }
            Err(why) => {
                // rdma_accept itself succeeds; the connection then fails to
                // establish.
                if !request.abandoned {
                    st.outcomes.insert(request.active_id, Outcome::Failed(why));
                }
                conn.disconnected = true;
                st.queue(listener, Queued::Disconnected(passive));
            }
        }
        st.connections.insert(passive, conn);
        drop(st);
        hub.changed.notify_all();
        Ok(Arc::new(FakeConnection {
            fabric: Arc::clone(&self.fabric),
            id: passive,
            qp: None,
            reply: Vec::new(),
        }))
    }

    fn reject(mut self: Box<Self>, private_data: &[u8]) -> Result<()> {
        self.fabric.check("rdma_reject")?;
        if private_data.len() > REJ_PRIVATE_DATA_LEN {
            return Err(rdma(format!(
                "rdma_reject failed: Invalid argument ({} bytes of private data, at most \
                 {REJ_PRIVATE_DATA_LEN})",
                private_data.len()
            )));
        }
        let hub = &self.fabric.hub;
        let rejected = hub.state.lock().reject(self.id, private_data);
        self.answered = true;
        hub.changed.notify_all();
        if rejected {
            self.fabric.counters().destroyed("cm_id");
        }
        Ok(())
    }
}

impl Drop for FakeRequest {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // rdma_destroy_id of an unanswered request sends a REJ.
        let hub = &self.fabric.hub;
        let rejected = hub.state.lock().reject(self.id, &[]);
        hub.changed.notify_all();
        if rejected {
            self.fabric.counters().destroyed("cm_id");
        }
    }
}

// ---------------------------------------------------------------- connection

/// An established (or failed) connection's CM id, on either side.
struct FakeConnection {
    fabric: Arc<Fabric>,
    id: u64,
    /// The active side's QP; dropped after the id.
    qp: Option<Arc<dyn Qp>>,
    /// The active side: the REP's private data, padded.
    reply: Vec<u8>,
}

impl CmConnection for FakeConnection {
    fn id(&self) -> u64 {
        self.id
    }

    fn qp(&self) -> Option<Arc<dyn Qp>> {
        self.qp.clone()
    }

    fn reply_data(&self) -> &[u8] {
        &self.reply
    }

    fn disconnect(&self) -> Result<()> {
        self.fabric.check("rdma_disconnect")?;
        let hub = &self.fabric.hub;
        hub.state.lock().disconnect(&self.fabric, self.id);
        hub.changed.notify_all();
        Ok(())
    }

    fn is_disconnected(&self) -> bool {
        let st = self.fabric.hub.state.lock();
        st.connections.get(&self.id).is_none_or(|c| c.disconnected)
    }
}

impl Drop for FakeConnection {
    fn drop(&mut self) {
        // rdma_destroy_id of a connected id sends a DREQ first.
        let hub = &self.fabric.hub;
        let mut st = hub.state.lock();
        st.disconnect(&self.fabric, self.id);
        st.connections.remove(&self.id);
        drop(st);
        hub.changed.notify_all();
        self.fabric.counters().destroyed("cm_id");
    }
}

#[cfg(test)]
mod tests {
    //! What only the fake CM shows: its stricter rules, live-object
    //! counters and fault injection. What every CM does is in the contract
    //! checks (`crate::contract`), whose harness these reuse.

    use std::time::Duration;

    use super::super::contract::cm::{
        accept_like_the_design, bench, during_connect, establish, expect_disconnected,
        expect_rejected, expect_request, host, proof, recycle, request, transfer,
    };
    use super::super::contract::{Env, FAKE_DEVICE, FAKE_IP, NOWHERE};
    use super::super::fabric::DeviceSpec;
    use super::super::{Counters, Faults};
    use super::*;

    /// A fabric with the contract's one device, and the environment on it.
    fn world() -> (Arc<Fabric>, Env) {
        let fabric = Fabric::new(Arc::new(Faults::new()), Arc::new(Counters::new()));
        fabric
            .add_device(DeviceSpec::new(FAKE_DEVICE, FAKE_IP))
            .expect("device");
        let env = Env::on_fake_fabric(&fabric);
        (fabric, env)
    }

    fn deadline() -> Instant {
        // Only reached if a test is broken: nothing here waits for time.
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn cm_reject_releases_the_request_and_the_active_ids() {
        let (fabric, env) = world();
        let b = bench(&env);
        let counters = fabric.counters();
        let ((), outcome) = during_connect(&env, &b.server, &b.listener, &proof(17), |request| {
            assert_eq!(counters.live("cm_id"), 3, "listener, request, active id");
            request.reject(b"BAD_SECRET").expect("reject");
        });
        expect_rejected(outcome);
        assert_eq!(counters.live("cm_id"), 1, "only the listener");
        assert_eq!(counters.live("qp"), 1, "the active QP went with its id");
    }

    /// Stricter than the kernel CM, which would let the server's first
    /// packets hit a QP that drops them.
    #[test]
    fn cm_accept_needs_the_qp_in_rts() {
        let (_fabric, env) = world();
        let b = bench(&env);
        let data = proof(b.qp.qp_num());
        let accept_with = |qp_num: u32| {
            let (err, outcome) = during_connect(&env, &b.server, &b.listener, &data, |request| {
                let params = AcceptParams {
                    qp_num,
                    responder_resources: request.responder_resources(),
                    initiator_depth: request.initiator_depth(),
                    rnr_retry_count: 7,
                    private_data: Vec::new(),
                };
                request.accept(params).err().expect("accept must fail")
            });
            assert_eq!(expect_rejected(outcome), [0u8; REJ_PRIVATE_DATA_LEN]);
            err.to_string()
        };
        let in_init = accept_with(b.qp.qp_num());
        assert!(in_init.contains("before accepting"), "{in_init}");
        let unknown = accept_with(0x00ab_cdef);
        assert!(unknown.contains("no such QP"), "{unknown}");
    }

    #[test]
    fn cm_refused_connects_leave_no_id_and_no_qp() {
        let (fabric, env) = world();
        let server = host(&env);
        let refused = env
            .cm
            .connect(request(&env, &server, 4791, &[], deadline()));
        assert_eq!(expect_rejected(refused), [0u8; REJ_PRIVATE_DATA_LEN]);
        let mut nowhere = request(&env, &server, 4791, &[], deadline());
        nowhere.addr = SocketAddr::from((NOWHERE, 4791));
        let err = env.cm.connect(nowhere).err().expect("no route");
        assert!(err.to_string().contains("No route"), "{err}");
        assert_eq!(fabric.counters().live("cm_id"), 0);
        assert_eq!(fabric.counters().live("qp"), 0);
    }

    #[test]
    fn cm_late_accept_after_the_active_side_gave_up_disconnects() {
        let (fabric, env) = world();
        let b = bench(&env);
        let data = proof(b.qp.qp_num());
        let gave_up = env.cm.connect(request(
            &env,
            &b.server,
            b.listener.port(),
            &data,
            Instant::now(),
        ));
        let err = gave_up.err().expect("deadline");
        assert!(err.to_string().contains("before the deadline"), "{err}");
        let request = expect_request(b.listener.next_event(deadline()));
        let accepted = accept_like_the_design(request, &b.qp).expect("accept");
        assert!(accepted.conn.is_disconnected());
        let conn = accepted.conn.id();
        assert_eq!(expect_disconnected(b.listener.next_event(deadline())), conn);
        drop(accepted);
        recycle(&env, &b);
        assert_eq!(fabric.counters().live("cm_id"), 1, "the listener");
    }

    #[test]
    fn cm_listen_speaks_ipv4_only_and_counts_its_ids() {
        let (fabric, env) = world();
        let b = bench(&env);
        let other = env
            .cm
            .listen(SocketAddr::from((FAKE_IP, 0)))
            .expect("listen");
        let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0));
        assert!(env.cm.listen(v6).is_err());
        assert_eq!(fabric.counters().live("cm_id"), 2);
        drop(other);
        assert_eq!(fabric.counters().live("cm_id"), 1);
        drop(b);
        assert_eq!(fabric.counters().live("cm_id"), 0);
    }

    #[test]
    fn cm_injected_faults_fail_the_named_call() {
        let (fabric, env) = world();
        let b = bench(&env);
        let faults = Arc::clone(fabric.faults());
        let injected = |name: &str| Some(Error::Rdma(format!("{name} failed (injected)")));
        let any = SocketAddr::from((FAKE_IP, 0));

        faults.fail_nth("rdma_listen", faults.calls("rdma_listen") + 1);
        assert_eq!(env.cm.listen(any).err(), injected("rdma_listen"));
        faults.fail_nth("rdma_get_cm_event", 1);
        assert_eq!(
            b.listener.next_event(Instant::now()).err(),
            injected("rdma_get_cm_event")
        );
        faults.fail_nth("rdma_connect", 1);
        let err = env
            .cm
            .connect(request(&env, &b.server, b.listener.port(), &[], deadline()));
        assert_eq!(err.err(), injected("rdma_connect"));

        let data = proof(b.qp.qp_num());
        for name in ["rdma_init_qp_attr", "rdma_accept", "rdma_reject"] {
            recycle(&env, &b);
            let (err, outcome) = during_connect(&env, &b.server, &b.listener, &data, |request| {
                faults.fail_nth(name, faults.calls(name) + 1);
                if name == "rdma_reject" {
                    request.reject(b"no").err()
                } else {
                    accept_like_the_design(request, &b.qp).err()
                }
            });
            assert_eq!(err, injected(name));
            let rejected = expect_rejected(outcome);
            assert_eq!(
                rejected, [0u8; REJ_PRIVATE_DATA_LEN],
                "{name}: the id was destroyed"
            );
        }
        recycle(&env, &b);
        let session = establish(&env, &b);
        faults.fail_nth("rdma_disconnect", faults.calls("rdma_disconnect") + 1);
        assert_eq!(
            session.client.conn.disconnect().err(),
            injected("rdma_disconnect")
        );
        assert!(!session.server_conn.is_disconnected());
        session.client.conn.disconnect().expect("disconnect");
        assert!(session.server_conn.is_disconnected());
    }

    #[test]
    fn cm_counters_return_to_zero_after_drop() {
        let (fabric, env) = world();
        let mut b = bench(&env);
        let counters = Arc::clone(fabric.counters());
        let session = establish(&env, &b);
        transfer(&env, &mut b, &session, 5);
        assert_eq!(counters.live("cm_id"), 3, "listener and both ends");
        assert_eq!(counters.live("qp"), 2);
        let conn = session.client.conn.id();
        drop(session);
        assert_eq!(expect_disconnected(b.listener.next_event(deadline())), conn);
        assert!(b
            .listener
            .next_event(Instant::now())
            .expect("event")
            .is_none());
        drop(b);
        assert!(counters.snapshot().is_empty(), "{:?}", counters.snapshot());
    }
}
