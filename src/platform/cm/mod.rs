//! librdmacm, opened with `dlopen`: the production [`Cm`].
//!
//! - [`sys`]: the ABI types, generated from rdma-core 44.0's `rdma_cma.h`.
//! - `loader`: the function table, resolved at load ([`LoadedCm::open`]).
//! - this module: the owners behind [`Cm`], [`CmListener`], [`CmRequest`] and
//!   [`CmConnection`].
//!
//! # Ownership
//!
//! Every `rdma_cm_id` is held by one `Id`, which destroys it (and the QP
//! librdmacm created on it, if any) in `Drop`, and holds an `Arc` of its
//! event channel, so the channel is destroyed after its last id, as
//! `rdma_destroy_event_channel(3)` requires. A listener's channel carries the
//! listening id and every id its CONNECT_REQUESTs created (librdmacm gives a
//! new id its listener's channel); an active connection has a channel of its
//! own, so its events never mix with anyone else's.
//!
//! Events are acknowledged (`rdma_ack_cm_event`) as soon as what is needed
//! was copied out, before anyone acts on them: `rdma_destroy_id` blocks until
//! every event of its id was acknowledged (`rdma_destroy_id(3)`), so an event
//! held across a callback could deadlock a destroy. Acknowledging a
//! CONNECT_REQUEST does not destroy the id it created (`rdma_ack_cm_event(3)`).
//!
//! # Threads
//!
//! librdmacm serializes its own state per id and per channel with internal
//! locks (rdma-core `librdmacm/cma.c`: `id_priv->mut`, the channel's fd read
//! one event at a time), so its calls may come from any thread. This module
//! adds: calls that read events from one channel are serialized by that
//! channel's mutex; the calls on one id that change its connection state
//! (`rdma_accept`/`rdma_reject`, `rdma_disconnect`) are made by the one
//! owner of the id, behind a mutex where the owner is shared; and an id is
//! destroyed only by its owner's `Drop`, when no other reference exists.
//!
//! `unsafe` in the platform's RDMA CM lives only in this directory.

pub mod loader;
pub mod sys;

use crate::log::{log, Level};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use self::loader::CmTable;
use self::sys::{
    rdma_cm_event, rdma_cm_event_type, rdma_cm_id, rdma_conn_param, rdma_event_channel,
    rdma_port_space,
};
use super::verbs::convert;
use super::verbs::cq::{poll_timeout_ms, set_nonblocking};
use super::verbs::sys::ibv_qp_attr;
use super::verbs::ProtectionDomain;
use super::{
    wait_readable, AcceptParams, Cm, CmConnection, CmEvent, CmListener, CmRequest, ConnectOutcome,
    ConnectRequest, Qp, QpAttr, QpState, Waker, CM_REP_PRIVATE_DATA_MAX, CM_REQ_PRIVATE_DATA_MAX,
};
use crate::error::{Error, Result};

pub use loader::SONAMES;

/// Ids and channels whose destroy failed and which were leaked.
static LEAKED: AtomicU64 = AtomicU64::new(0);

/// The next [`CmConnection::id`]; 0 is never handed out.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// How many librdmacm objects were leaked because their destroy failed.
pub fn leaked_objects() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

/// The error of `call`, which failed: librdmacm returns -1 (or NULL) and
/// leaves the reason in errno (`rdma_cm(7)`), read now.
fn cm_error(call: std::fmt::Arguments<'_>) -> Error {
    let err = std::io::Error::last_os_error();
    Error::Rdma(format!("{call} failed: {err}"))
}

/// `Ok(())` for a zero return, else [`cm_error`].
fn check(call: std::fmt::Arguments<'_>, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(cm_error(call))
    }
}

/// Records a destroy that failed in a `Drop`: logged, counted, leaked.
fn destroy_failed(call: std::fmt::Arguments<'_>) {
    let err = cm_error(call);
    LEAKED.fetch_add(1, Ordering::Relaxed);
    log!(Level::Error, "{err}; leaked");
}

/// The name of an event type, for messages.
fn event_name(kind: rdma_cm_event_type::Type) -> String {
    use rdma_cm_event_type::*;
    let name = match kind {
        RDMA_CM_EVENT_ADDR_RESOLVED => "ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => "ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => "ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => "ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => "CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => "CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => "CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => "UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => "REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => "ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => "DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => "DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => "MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => "MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => "ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => "TIMEWAIT_EXIT",
        other => return format!("event {other}"),
    };
    name.to_owned()
}

// ---------------------------------------------------------------- addresses

/// A socket address in the C layout `rdma_bind_addr` and
/// `rdma_resolve_addr` take.
enum SockAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl SockAddr {
    fn new(addr: SocketAddr) -> SockAddr {
        match addr {
            SocketAddr::V4(a) => SockAddr::V4(libc::sockaddr_in {
                sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or_default(),
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    // Network order: the octets as they are in memory.
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => SockAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::sa_family_t::try_from(libc::AF_INET6).unwrap_or_default(),
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }

    /// The address as `struct sockaddr *`, valid while `self` is.
    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        match self {
            SockAddr::V4(a) => ptr::from_mut(a).cast(),
            SockAddr::V6(a) => ptr::from_mut(a).cast(),
        }
    }
}

// ---------------------------------------------------------------- waiting

/// Waits with `poll(2)` until `fd` or `extra` is readable (or in error), or
/// `deadline` passes. Returns whether each was ready.
fn poll_in(fd: c_int, extra: Option<&Waker>, deadline: Instant) -> Result<(bool, bool)> {
    // SAFETY: the caller keeps `fd` (a channel's descriptor) open for the
    // call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let ready = match extra {
        Some(waker) => wait_readable(&[fd, waker.as_fd()], Some(deadline))?,
        None => wait_readable(&[fd], Some(deadline))?,
    };
    Ok((ready[0], ready.get(1).copied().unwrap_or(false)))
}

// ---------------------------------------------------------------- channel

/// An event channel (`struct rdma_event_channel`), destroyed on drop, after
/// every id on it (each holds an `Arc` of it).
struct Channel {
    raw: *mut rdma_event_channel,
    /// The channel's descriptor (non-blocking), owned by the channel.
    fd: c_int,
    /// Serializes reading and acknowledging events.
    events: Mutex<()>,
    table: Arc<CmTable>,
}

// SAFETY: `raw` is passed only to librdmacm: rdma_get_cm_event (serialized
// by `events`), rdma_create_id, and rdma_destroy_event_channel once, in
// `Drop`, when no id is left on it (each id holds an `Arc` of the channel).
unsafe impl Send for Channel {}
// SAFETY: as for `Send`.
unsafe impl Sync for Channel {}

/// What was copied out of an event before it was acknowledged.
struct Event {
    kind: rdma_cm_event_type::Type,
    status: c_int,
    /// The id the event is for; for CONNECT_REQUEST, the new id, now owned
    /// by the receiver of the event.
    id: *mut rdma_cm_id,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
}

impl Channel {
    /// `rdma_create_event_channel`, made non-blocking
    /// (`rdma_create_event_channel(3)` shows the `fcntl`).
    fn create(table: &Arc<CmTable>) -> Result<Arc<Channel>> {
        // SAFETY: no arguments; a NULL return is handled below.
        let raw = unsafe { (table.create_event_channel)() };
        if raw.is_null() {
            return Err(cm_error(format_args!("rdma_create_event_channel")));
        }
        // SAFETY: `raw` was just created; `fd` is set at creation.
        let fd = unsafe { (*raw).fd };
        let channel = Arc::new(Channel {
            raw,
            fd,
            events: Mutex::new(()),
            table: Arc::clone(table),
        });
        set_nonblocking(fd).map_err(|e| {
            Error::Rdma(format!(
                "making the RDMA CM event channel non-blocking failed: {e}"
            ))
        })?;
        Ok(channel)
    }

    /// `rdma_create_id` on this channel, in `RDMA_PS_TCP` (RC).
    fn create_id(self: &Arc<Channel>) -> Result<Id> {
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is live; `raw` is a valid out-pointer; the
        // context is NULL (never read by this library).
        let rc = unsafe {
            (self.table.create_id)(
                self.raw,
                &mut raw,
                ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check(format_args!("rdma_create_id(RDMA_PS_TCP)"), rc)?;
        // SAFETY: `raw` was just created on this channel and is owned by
        // nothing else.
        Ok(unsafe { Id::from_raw(raw, Arc::clone(self)) })
    }

    /// The next event, without waiting: `rdma_get_cm_event`, copy, then
    /// `rdma_ack_cm_event`. `before_ack` sees the event while its id is
    /// still guaranteed alive (`rdma_destroy_id` waits for the ack).
    fn try_event<T>(&self, before_ack: impl FnOnce(&Event) -> T) -> Result<Option<(Event, T)>> {
        let _serial = self.events.lock();
        let mut raw: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; `raw` is a valid
        // out-pointer; event reads are serialized by `events`.
        let rc = unsafe { (self.table.get_cm_event)(self.raw, &mut raw) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error::Rdma(format!("rdma_get_cm_event failed: {err}")));
        }
        // SAFETY: rdma_get_cm_event succeeded, so `raw` is a valid event
        // until it is acknowledged below.
        let ev = unsafe { &*raw };
        let mut copied = Event {
            kind: ev.event,
            status: ev.status,
            id: ev.id,
            private_data: Vec::new(),
            responder_resources: 0,
            initiator_depth: 0,
        };
        // Every id of this library is RDMA_PS_TCP (RC), so the parameter
        // union holds `conn` (rdma_get_cm_event(3)); it is meaningful for
        // these events only. CONNECT_RESPONSE (an id without a QP of
        // librdmacm's) carries the REP's private data: a striped
        // transfer's plan.
        if matches!(
            ev.event,
            rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST
                | rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE
                | rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED
                | rdma_cm_event_type::RDMA_CM_EVENT_REJECTED
        ) {
            // SAFETY: `conn` is the active member for RC ids (above).
            let conn = unsafe { ev.param.conn };
            copied.responder_resources = conn.responder_resources;
            copied.initiator_depth = conn.initiator_depth;
            if !conn.private_data.is_null() && conn.private_data_len > 0 {
                // SAFETY: librdmacm points `private_data` at
                // `private_data_len` bytes inside the event, alive until the
                // ack below; they are copied now.
                let data = unsafe {
                    std::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        usize::from(conn.private_data_len),
                    )
                };
                copied.private_data = data.to_vec();
            }
        }
        let seen = before_ack(&copied);
        // SAFETY: `raw` came from rdma_get_cm_event and is acknowledged once;
        // nothing of it is used after (everything needed was copied).
        let rc = unsafe { (self.table.ack_cm_event)(raw) };
        check(format_args!("rdma_ack_cm_event"), rc)?;
        Ok(Some((copied, seen)))
    }

    /// The next event until `deadline`: `None` when it passed.
    fn next_until(&self, deadline: Instant) -> Result<Option<Event>> {
        loop {
            if let Some((event, ())) = self.try_event(|_| ())? {
                return Ok(Some(event));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            poll_in(self.fd, None, deadline)?;
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: the channel is live, every id on it is destroyed (each
        // held an `Arc` of it) and every event acknowledged (`try_event`
        // acks before returning); it is destroyed once. The function
        // returns nothing.
        unsafe { (self.table.destroy_event_channel)(self.raw) };
    }
}

// ---------------------------------------------------------------- ids

/// One `rdma_cm_id`, destroyed on drop. No id ever has a QP of librdmacm's:
/// both sides bring their own (see `connect`).
///
/// Field order: `raw` is destroyed by `Drop::drop`; `channel` is dropped
/// after, so it outlives the id.
struct Id {
    raw: *mut rdma_cm_id,
    channel: Arc<Channel>,
}

// SAFETY: `raw` is passed only to librdmacm, whose calls on one id are
// serialized by its owners (module docs), and destroyed once, in `Drop`.
unsafe impl Send for Id {}
// SAFETY: as for `Send`. An `Id` is shared (by `Arc`) only on the active
// side: by its connection, which makes every call on it and its channel
// behind its `state` mutex.
unsafe impl Sync for Id {}

impl Id {
    /// Takes ownership of `raw`.
    ///
    /// # Safety
    ///
    /// `raw` is a live id on `channel`, destroyed by nothing else.
    unsafe fn from_raw(raw: *mut rdma_cm_id, channel: Arc<Channel>) -> Id {
        Id { raw, channel }
    }

    fn table(&self) -> &CmTable {
        &self.channel.table
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and this is its only owner; every event of
        // it was acknowledged (`Channel::try_event`), so this does not block.
        let rc = unsafe { (self.table().destroy_id)(self.raw) };
        if rc != 0 {
            destroy_failed(format_args!("rdma_destroy_id"));
        }
    }
}

// ---------------------------------------------------------------- the CM

/// librdmacm, loaded, with the functions this library calls.
pub struct LoadedCm {
    table: Arc<CmTable>,
}

impl LoadedCm {
    /// Opens the first of `sonames` and resolves every symbol. The error
    /// names the library or the symbol that was missing.
    pub fn open(sonames: &[&'static str]) -> Result<LoadedCm> {
        Ok(LoadedCm {
            table: Arc::new(CmTable::open(sonames)?),
        })
    }

    /// The soname the library was found under.
    pub fn soname(&self) -> &'static str {
        self.table.loaded.name
    }
}

impl Cm for LoadedCm {
    fn listen(&self, addr: SocketAddr) -> Result<Arc<dyn CmListener>> {
        let channel = Channel::create(&self.table)?;
        let id = channel.create_id()?;
        let mut sa = SockAddr::new(addr);
        // SAFETY: `id` is live; `sa` is a valid address for the call.
        let rc = unsafe { (self.table.bind_addr)(id.raw, sa.as_mut_ptr()) };
        check(format_args!("rdma_bind_addr({addr})"), rc)?;
        // SAFETY: `id` is live and bound.
        let rc = unsafe { (self.table.listen)(id.raw, LISTEN_BACKLOG) };
        check(format_args!("rdma_listen({addr})"), rc)?;
        // SAFETY: `id` is live and bound; the port is in network order.
        let port = u16::from_be(unsafe { (self.table.get_src_port)(id.raw) });
        let wake = Waker::new()?;
        Ok(Arc::new(Listener {
            id,
            port,
            wake,
            registry: Arc::new(Mutex::new(HashMap::new())),
        }))
    }

    fn connect(&self, request: ConnectRequest<'_>) -> Result<ConnectOutcome> {
        connect(&self.table, request)
    }
}

/// `rdma_listen`'s backlog of CONNECT_REQUESTs not yet retrieved.
const LISTEN_BACKLOG: c_int = 128;

// ---------------------------------------------------------------- passive side

/// The accepted connections of one listener, by the address of their id:
/// a DISCONNECTED event names the id, and this finds the connection. An
/// entry is removed before its id is destroyed, and looked up before the
/// event is acknowledged (while the id cannot be destroyed), so an address
/// found here is never a reused one.
type Registry = Mutex<HashMap<usize, (u64, Arc<AtomicBool>)>>;

/// A listening id on its own channel, with an eventfd for [`CmListener::wake`].
///
/// Field order: `id` (the listening id) is destroyed first; the channel it
/// holds goes when the last id on it does.
struct Listener {
    id: Id,
    port: u16,
    wake: Waker,
    registry: Arc<Registry>,
}

impl Listener {
    /// What an event means to the caller; `None`: nothing (skipped).
    fn translate(
        &self,
        event: Event,
        conn: Option<(u64, Arc<AtomicBool>)>,
    ) -> Result<Option<CmEvent>> {
        use rdma_cm_event_type::*;
        match event.kind {
            RDMA_CM_EVENT_CONNECT_REQUEST => {
                // SAFETY: librdmacm created this id for the request, on the
                // listener's channel, and hands it to the event's receiver.
                let id = unsafe { Id::from_raw(event.id, Arc::clone(&self.id.channel)) };
                Ok(Some(CmEvent::ConnectRequest(Box::new(Request {
                    id: Some(id),
                    private_data: event.private_data,
                    responder_resources: event.responder_resources,
                    initiator_depth: event.initiator_depth,
                    registry: Arc::clone(&self.registry),
                }))))
            }
            RDMA_CM_EVENT_ESTABLISHED => Ok(conn.map(|(conn, _)| CmEvent::Established { conn })),
            RDMA_CM_EVENT_DISCONNECTED
            | RDMA_CM_EVENT_CONNECT_ERROR
            | RDMA_CM_EVENT_UNREACHABLE
            | RDMA_CM_EVENT_REJECTED
            | RDMA_CM_EVENT_DEVICE_REMOVAL
                if conn.is_some() =>
            {
                Ok(conn.map(|(conn, flag)| {
                    flag.store(true, Ordering::SeqCst);
                    CmEvent::Disconnected { conn }
                }))
            }
            RDMA_CM_EVENT_DEVICE_REMOVAL if event.id == self.id.raw => Err(Error::Rdma(format!(
                "RDMA CM listener on port {}: the device was removed",
                self.port
            ))),
            // TIMEWAIT_EXIT, ADDR_CHANGE, and events of ids not accepted.
            _ => Ok(None),
        }
    }
}

impl CmListener for Listener {
    fn port(&self) -> u16 {
        self.port
    }

    fn next_event(&self, deadline: Instant) -> Result<Option<CmEvent>> {
        let channel = &self.id.channel;
        wait_for_event(channel.fd, &self.wake, deadline, || {
            // The registry is read before the ack: see `Registry`.
            let Some((event, conn)) = channel
                .try_event(|event| self.registry.lock().get(&(event.id as usize)).cloned())?
            else {
                return Ok(None);
            };
            Ok(Some(self.translate(event, conn)?))
        })
    }

    fn wake(&self) {
        self.wake.wake();
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel (and its descriptor) lives as long as the
        // listening id, which lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.id.channel.fd) }
    }
}

/// Calls `next` (which must not block) until it returns `Some(Some(_))`,
/// waiting on `fd` in between; `None` once `deadline` passes or `waker` was
/// woken. `next` returning `Some(None)` means an event was consumed and
/// skipped.
fn wait_for_event<T>(
    fd: c_int,
    waker: &Waker,
    deadline: Instant,
    mut next: impl FnMut() -> Result<Option<Option<T>>>,
) -> Result<Option<T>> {
    loop {
        let (_, woken) = poll_in(fd, Some(waker), deadline)?;
        if woken && waker.take() {
            return Ok(None);
        }
        match next()? {
            Some(Some(event)) => return Ok(Some(event)),
            Some(None) => {}
            None if Instant::now() >= deadline => return Ok(None),
            None => {}
        }
    }
}

/// A CONNECT_REQUEST's new id, until it is accepted or rejected; dropped
/// unanswered, it is rejected without data.
struct Request {
    /// `None` once answered.
    id: Option<Id>,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    registry: Arc<Registry>,
}

impl Request {
    fn id(&self) -> Result<&Id> {
        self.id
            .as_ref()
            .ok_or_else(|| Error::Internal("RDMA CM request used after its answer".to_owned()))
    }

    /// `rdma_reject`, then the id is destroyed (by dropping it).
    fn reject_id(id: Id, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .ok()
            .filter(|&l| usize::from(l) <= CM_REP_PRIVATE_DATA_MAX)
            .ok_or(Error::InvalidValue(
                "REJ private data longer than 196 bytes",
            ))?;
        let data = if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast::<c_void>()
        };
        // SAFETY: `id` is a live, unanswered request id; `data` points at
        // `len` readable bytes (or is NULL with 0), copied by the call.
        let rc = unsafe { (id.table().reject)(id.raw, data, len) };
        check(format_args!("rdma_reject"), rc)
    }
}

impl CmRequest for Request {
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn responder_resources(&self) -> u8 {
        self.responder_resources
    }

    fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        let id = self.id()?;
        id_qp_attr(id.table(), id, state)
    }

    fn accept(mut self: Box<Self>, params: AcceptParams) -> Result<Arc<dyn CmConnection>> {
        let id = self
            .id
            .take()
            .ok_or_else(|| Error::Internal("RDMA CM request answered twice".to_owned()))?;
        let conn = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
        let disconnected = Arc::new(AtomicBool::new(false));
        let key = id.raw as usize;
        // Registered first: ESTABLISHED may follow the accept at once.
        self.registry
            .lock()
            .insert(key, (conn, Arc::clone(&disconnected)));
        // The connection owns the id from here: a failure below removes the
        // entry and destroys the id through its Drop.
        let connection = PassiveConnection {
            conn,
            disconnected,
            disconnect_sent: Mutex::new(false),
            registry: Arc::clone(&self.registry),
            id,
        };
        let mut param = rdma_conn_param {
            private_data: if params.private_data.is_empty() {
                ptr::null()
            } else {
                params.private_data.as_ptr().cast()
            },
            private_data_len: u8::try_from(params.private_data.len())
                .ok()
                .filter(|&n| usize::from(n) <= CM_REP_PRIVATE_DATA_MAX)
                .ok_or_else(|| {
                    Error::Rdma(format!(
                        "rdma_accept(QP {}) failed: Invalid argument (private data longer \
                         than {CM_REP_PRIVATE_DATA_MAX} bytes)",
                        params.qp_num
                    ))
                })?,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            flow_control: 0,
            retry_count: 0,
            rnr_retry_count: params.rnr_retry_count,
            srq: 0,
            qp_num: params.qp_num,
        };
        // SAFETY: the id is a live request id with no QP, so librdmacm
        // sends `qp_num` in the REP and touches no QP (rdma_accept(3));
        // `param` and the private data it points at (`params`, alive for
        // the call) are valid for the call; librdmacm copies them.
        let rc = unsafe { (connection.id.table().accept)(connection.id.raw, &mut param) };
        check(format_args!("rdma_accept(QP {})", params.qp_num), rc)?;
        Ok(Arc::new(connection))
    }

    fn reject(mut self: Box<Self>, private_data: &[u8]) -> Result<()> {
        let id = self
            .id
            .take()
            .ok_or_else(|| Error::Internal("RDMA CM request answered twice".to_owned()))?;
        Request::reject_id(id, private_data)
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            if let Err(e) = Request::reject_id(id, &[]) {
                let _ = writeln!(std::io::stderr(), "hipobj: unanswered request: {e}");
            }
        }
    }
}

/// An accepted connection: its id, and the flag the listener sets at its
/// DISCONNECTED.
///
/// Field order: `Drop::drop` removes the registry entry; `id` is destroyed
/// after.
struct PassiveConnection {
    conn: u64,
    disconnected: Arc<AtomicBool>,
    /// Whether `rdma_disconnect` was called; the lock serializes it.
    disconnect_sent: Mutex<bool>,
    registry: Arc<Registry>,
    id: Id,
}

impl CmConnection for PassiveConnection {
    fn id(&self) -> u64 {
        self.conn
    }

    fn qp(&self) -> Option<Arc<dyn Qp>> {
        None
    }

    fn disconnect(&self) -> Result<()> {
        let mut sent = self.disconnect_sent.lock();
        if !*sent {
            // SAFETY: the id is live and accepted; the lock makes this the
            // only state-changing call on it.
            let rc = unsafe { (self.id.table().disconnect)(self.id.raw) };
            check(
                format_args!("rdma_disconnect(connection {})", self.conn),
                rc,
            )?;
            *sent = true;
        }
        Ok(())
    }

    fn is_disconnected(&self) -> bool {
        self.disconnected.load(Ordering::SeqCst)
    }
}

impl Drop for PassiveConnection {
    fn drop(&mut self) {
        self.registry.lock().remove(&(self.id.raw as usize));
    }
}

// ---------------------------------------------------------------- active side

/// [`Cm::connect`]: every step on a channel of the connection's own.
fn connect(table: &Arc<CmTable>, request: ConnectRequest<'_>) -> Result<ConnectOutcome> {
    let addr = request.addr;
    let invalid = |why: &str| {
        Error::Rdma(format!(
            "rdma_connect({addr}) failed: Invalid argument ({why})"
        ))
    };
    if request.private_data.len() > CM_REQ_PRIVATE_DATA_MAX {
        return Err(invalid("private data longer than 56 bytes"));
    }
    // The QP is created in this PD and connected through librdmacm: both
    // must be the production ones.
    if request
        .pd
        .as_any()
        .downcast_ref::<ProtectionDomain>()
        .is_none()
    {
        return Err(invalid("the protection domain is not libibverbs'"));
    }
    let channel = Channel::create(table)?;
    let id = channel.create_id()?;
    let wait = |want: rdma_cm_event_type::Type, step: &str| -> Result<()> {
        match channel.next_until(request.deadline)? {
            Some(e) if e.kind == want => Ok(()),
            Some(e) => Err(Error::Rdma(format!(
                "{step}({addr}) failed: {} (status {})",
                event_name(e.kind),
                e.status
            ))),
            None => Err(Error::Rdma(format!(
                "{step}({addr}): no {} before the deadline",
                event_name(want)
            ))),
        }
    };

    let mut dst = SockAddr::new(addr);
    let timeout = poll_timeout_ms(Instant::now(), request.deadline).max(1);
    // SAFETY: `id` is live; the source is NULL (any), `dst` valid for the
    // call.
    let rc = unsafe { (table.resolve_addr)(id.raw, ptr::null_mut(), dst.as_mut_ptr(), timeout) };
    check(format_args!("rdma_resolve_addr({addr})"), rc)?;
    wait(
        rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        "rdma_resolve_addr",
    )?;
    let timeout = poll_timeout_ms(Instant::now(), request.deadline).max(1);
    // SAFETY: `id` is live with its address resolved.
    let rc = unsafe { (table.resolve_route)(id.raw, timeout) };
    check(format_args!("rdma_resolve_route({addr})"), rc)?;
    wait(
        rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        "rdma_resolve_route",
    )?;

    // The id gets no QP of its own: librdmacm's rdma_create_qp wants a PD of
    // the context librdmacm opened itself (cma.c: `id->verbs != pd->context`
    // is EINVAL), and ours come from `Verbs::open`, another context of the
    // same device. So the active side mirrors the passive one: our own QP,
    // named in `conn_param.qp_num`, moved to RTR and RTS with the CM's
    // attributes on CONNECT_RESPONSE, then `rdma_establish` sends the RTU
    // (rdma_establish(3)).
    let qp = request.pd.create_qp(request.cq, request.caps)?;
    let init = id_qp_attr(table, &id, QpState::Init)?;
    qp.modify(&init)?;
    let mut param = rdma_conn_param {
        private_data: if request.private_data.is_empty() {
            ptr::null()
        } else {
            request.private_data.as_ptr().cast()
        },
        private_data_len: u8::try_from(request.private_data.len())
            .map_err(|_| invalid("private data longer than 56 bytes"))?,
        responder_resources: request.responder_resources,
        initiator_depth: request.initiator_depth,
        flow_control: 0,
        retry_count: request.retry_count,
        rnr_retry_count: request.rnr_retry_count,
        srq: 0,
        qp_num: qp.qp_num(),
    };
    // SAFETY: `id` is live with its route resolved; `param` and the private
    // data it points at are valid for the call (librdmacm copies them).
    let rc = unsafe { (table.connect)(id.raw, &mut param) };
    check(format_args!("rdma_connect({addr})"), rc)?;
    let outcome = channel.next_until(request.deadline)?;
    let reply = match outcome {
        Some(e) if e.kind == rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE => e.private_data,
        Some(e) if e.kind == rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => {
            return Ok(ConnectOutcome::Rejected {
                private_data: e.private_data,
            });
        }
        Some(e) => {
            return Err(Error::Rdma(format!(
                "rdma_connect({addr}) failed: {} (status {})",
                event_name(e.kind),
                e.status
            )))
        }
        None => {
            return Err(Error::Rdma(format!(
                "rdma_connect({addr}): neither CONNECT_RESPONSE nor REJECTED before the deadline"
            )))
        }
    };
    // PSNs, path MTU and read depths as the CM negotiated them.
    qp.modify(&id_qp_attr(table, &id, QpState::Rtr)?)?;
    qp.modify(&id_qp_attr(table, &id, QpState::Rts)?)?;
    // SAFETY: `id` is live, has no QP, and has just had its CONNECT_RESPONSE.
    let rc = unsafe { (table.establish)(id.raw) };
    check(format_args!("rdma_establish({addr})"), rc)?;
    Ok(ConnectOutcome::Established(Arc::new(ActiveConnection {
        conn: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
        qp,
        reply,
        state: Mutex::new(ActiveState::default()),
        id: Arc::new(id),
    })))
}

/// `rdma_init_qp_attr` on `id` for the transition to `state`.
fn id_qp_attr(table: &CmTable, id: &Id, state: QpState) -> Result<QpAttr> {
    // SAFETY: ibv_qp_attr is plain C data (integers, a union of integers, no
    // references); all zeroes is a valid value.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = convert::qp_state_to_ibv(state);
    let mut mask: c_int = 0;
    let call = format_args!("rdma_init_qp_attr(-> {})", convert::state_name(Some(state)));
    // SAFETY: `id` is live; `attr` and `mask` are valid out-values.
    let rc = unsafe { (table.init_qp_attr)(id.raw, &mut attr, &mut mask) };
    check(call, rc)?;
    let bits = u32::try_from(mask)
        .map_err(|_| Error::Rdma(format!("rdma_init_qp_attr: negative mask {mask}")))?;
    convert::qp_attr_from_ibv(&attr, bits)
        .map_err(|why| Error::Rdma(format!("rdma_init_qp_attr: {why}")))
}

/// What an active connection knows of itself.
#[derive(Default)]
struct ActiveState {
    disconnected: bool,
    disconnect_sent: bool,
}

/// An established active connection: its id (with the QP) and channel.
struct ActiveConnection {
    conn: u64,
    qp: Arc<dyn Qp>,
    /// The REP's private data.
    reply: Vec<u8>,
    /// Serializes the calls on the id and its channel.
    state: Mutex<ActiveState>,
    id: Arc<Id>,
}

impl CmConnection for ActiveConnection {
    fn id(&self) -> u64 {
        self.conn
    }

    fn qp(&self) -> Option<Arc<dyn Qp>> {
        Some(Arc::clone(&self.qp))
    }

    fn reply_data(&self) -> &[u8] {
        &self.reply
    }

    fn disconnect(&self) -> Result<()> {
        let mut state = self.state.lock();
        if !state.disconnect_sent {
            // SAFETY: the id is live and connected; `state` serializes the
            // calls on it.
            let rc = unsafe { (self.id.table().disconnect)(self.id.raw) };
            check(
                format_args!("rdma_disconnect(connection {})", self.conn),
                rc,
            )?;
            state.disconnect_sent = true;
            // The QP is ours, not the id's, so librdmacm does not move it to
            // ERR as it would its own: done here, so nothing more is sent.
            if let Err(e) = self.qp.modify(&QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            }) {
                let _ = writeln!(std::io::stderr(), "hipobj: connection {}: {e}", self.conn);
            }
        }
        Ok(())
    }

    fn is_disconnected(&self) -> bool {
        let mut state = self.state.lock();
        while !state.disconnected {
            match self.id.channel.try_event(|_| ()) {
                Ok(Some((e, ()))) => {
                    state.disconnected |= e.kind == rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
                        || e.kind == rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL;
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "hipobj: connection {}: {e}", self.conn);
                    break;
                }
            }
        }
        state.disconnected
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::platform::{Cq, Pd};
    use std::any::Any;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A pipe whose read end never becomes readable while the test runs:
    /// a stand-in for an event channel with no events.
    fn quiet_pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe2.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned here.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// Far enough that reaching it means the wake was lost.
    fn far() -> Instant {
        Instant::now() + Duration::from_secs(600)
    }

    #[test]
    fn a_wake_ends_a_wait_with_none_even_when_it_came_first() {
        let (quiet, _writer) = quiet_pipe();
        let waker = Waker::new().unwrap();
        waker.wake();
        waker.wake();
        let mut calls = 0;
        let got = wait_for_event(quiet.as_raw_fd(), &waker, far(), || {
            calls += 1;
            Ok(None::<Option<()>>)
        });
        assert_eq!(got.unwrap(), None);
        assert_eq!(calls, 0, "a pending wake wins over reading events");
        // Consumed: the next wait runs to its deadline (now) and reads once.
        let got = wait_for_event(quiet.as_raw_fd(), &waker, Instant::now(), || {
            calls += 1;
            Ok(None::<Option<()>>)
        });
        assert_eq!(got.unwrap(), None);
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_wake_from_another_thread_ends_a_wait_in_progress() {
        let (quiet, _writer) = quiet_pipe();
        let waker = Waker::new().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| waker.wake());
            let got = wait_for_event(quiet.as_raw_fd(), &waker, far(), || Ok(None::<Option<()>>));
            assert_eq!(got.unwrap(), None);
        });
    }

    #[test]
    fn skipped_events_are_read_past_and_the_next_one_is_returned() {
        let (readable, writer) = quiet_pipe();
        assert_eq!(
            // SAFETY: writes one byte from a live buffer to the open pipe.
            unsafe { libc::write(writer.as_raw_fd(), b"x".as_ptr().cast(), 1) },
            1
        );
        let waker = Waker::new().unwrap();
        let mut queue = vec![Some(Some(7)), Some(None), Some(None)];
        let got = wait_for_event(readable.as_raw_fd(), &waker, far(), || {
            Ok(queue.pop().unwrap())
        });
        assert_eq!(got.unwrap(), Some(7));
        assert!(queue.is_empty());
    }

    #[test]
    fn socket_addresses_are_in_network_order() {
        let SockAddr::V4(v4) = SockAddr::new("192.0.2.1:4791".parse().unwrap()) else {
            panic!("IPv4 expected");
        };
        assert_eq!(i32::from(v4.sin_family), libc::AF_INET);
        assert_eq!(v4.sin_port.to_ne_bytes(), 4791u16.to_be_bytes());
        assert_eq!(v4.sin_addr.s_addr.to_ne_bytes(), [192, 0, 2, 1]);
        let SockAddr::V6(v6) = SockAddr::new("[fe80::1%3]:20".parse().unwrap()) else {
            panic!("IPv6 expected");
        };
        assert_eq!(i32::from(v6.sin6_family), libc::AF_INET6);
        assert_eq!(v6.sin6_port.to_ne_bytes(), 20u16.to_be_bytes());
        assert_eq!(v6.sin6_addr.s6_addr[0..2], [0xfe, 0x80]);
        assert_eq!(v6.sin6_addr.s6_addr[15], 1);
        assert_eq!(v6.sin6_scope_id, 3);
    }

    #[test]
    fn listening_is_an_rdma_error_exactly_when_there_is_no_rdma_device() {
        let cm = LoadedCm::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        let devices = match std::fs::read_dir("/sys/class/infiniband") {
            Ok(dir) => dir.count(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => panic!("reading /sys/class/infiniband: {e}"),
        };
        let leaked = leaked_objects();
        let listened = cm.listen("127.0.0.1:0".parse().unwrap());
        if devices == 0 {
            // Here: no /dev/infiniband/rdma_cm, so no event channel.
            let err = listened
                .err()
                .expect("no RDMA device, yet listening worked");
            assert_eq!(err.code(), crate::error::Code::Rdma, "{err}");
            assert!(err.to_string().contains("rdma_"), "{err}");
        } else {
            // The Soft-RoCE lane: the kernel CM binds loopback to a device.
            let listener = listened.unwrap_or_else(|e| panic!("{e}"));
            assert_ne!(listener.port(), 0);
            listener.wake();
            assert!(listener.next_event(far()).unwrap().is_none());
        }
        assert_eq!(leaked_objects(), leaked);
    }

    /// A PD and CQ of no libibverbs: `connect` must refuse them.
    struct Foreign;

    impl Pd for Foreign {
        fn reg_mr(
            &self,
            _: usize,
            _: usize,
            _: crate::platform::Access,
        ) -> Result<Arc<dyn crate::platform::Mr>> {
            unreachable!("connect never registers memory")
        }
        fn reg_dmabuf_mr(
            &self,
            _: &OwnedFd,
            _: u64,
            _: usize,
            _: u64,
            _: crate::platform::Access,
        ) -> Result<Arc<dyn crate::platform::Mr>> {
            unreachable!("connect never registers memory")
        }
        fn create_qp(&self, _: &Arc<dyn Cq>, _: crate::platform::QpCaps) -> Result<Arc<dyn Qp>> {
            unreachable!("connect creates its QP through librdmacm")
        }
        fn alloc_mw(&self) -> Result<Arc<dyn crate::platform::Mw>> {
            unreachable!("connect never allocates windows")
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    impl Cq for Foreign {
        fn poll(&self, _: usize) -> Result<Vec<crate::platform::Completion>> {
            unreachable!("connect never polls")
        }
        fn wait(&self, _: Instant) -> Result<bool> {
            unreachable!("connect never waits for completions")
        }
        fn arm(&self) -> Result<()> {
            unreachable!("connect never arms")
        }
        fn channel_fd(&self) -> BorrowedFd<'_> {
            unreachable!("connect never waits for completions")
        }
        fn take_events(&self) -> Result<usize> {
            unreachable!("connect never waits for completions")
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn connecting_with_a_foreign_protection_domain_or_long_private_data_is_refused() {
        let cm = LoadedCm::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        let pd: Arc<dyn Pd> = Arc::new(Foreign);
        let cq: Arc<dyn Cq> = Arc::new(Foreign);
        let request = |data: &'static [u8]| ConnectRequest {
            addr: "192.0.2.1:4791".parse().unwrap(),
            pd: &pd,
            cq: &cq,
            caps: crate::platform::QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
            },
            private_data: data,
            initiator_depth: 4,
            responder_resources: 4,
            retry_count: 7,
            rnr_retry_count: 7,
            deadline: far(),
        };
        let err = cm.connect(request(&[0; 8])).err().expect("a foreign PD");
        assert_eq!(
            err,
            Error::Rdma(
                "rdma_connect(192.0.2.1:4791) failed: Invalid argument (the protection domain \
                 is not libibverbs')"
                    .to_owned()
            )
        );
        let err = cm.connect(request(&[0; 57])).err().expect("57 bytes");
        assert!(err.to_string().contains("longer than 56 bytes"), "{err}");
    }
}
