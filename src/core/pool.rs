//! The connection pool: one RC queue pair per transfer in flight.
//!
//! The pool creates `HIPOBJ_MAX_TRANSFERS` connections at init and leases
//! them out. A connection keeps its RDMA CM connection to a server after its
//! lease ends, so the next transfer that reaches the same server needs no
//! handshake; a thread is given back a connection to the server its last
//! transfer used when one is free.
//!
//! Locks: the pool's `inner` (free list) may be taken before a connection's
//! `state`, never after it.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::error::{Error, Result};
use super::token::Token;
use crate::platform::{
    next_rkey, Access, Cm, CmConnection, Context, Cq, Gid, Mr, Mw, Pd, Qp, QpAttr, QpCaps, QpState,
    SendOp, SendWr,
};

/// Completion queue entries per connection.
pub const CQ_DEPTH: u32 = 16;
/// Queue capacities of a pool QP.
pub const QP_CAPS: QpCaps = QpCaps {
    max_send_wr: 8,
    max_recv_wr: 8,
    max_send_sge: 1,
    max_recv_sge: 1,
};

/// How a connection is linked to a server.
pub enum Link {
    /// No server: the QP is in INIT.
    Unconnected,
    /// The listener is moving the QP to a new server.
    Connecting,
    /// Established with a server.
    Connected(Peer),
}

/// An established connection's server side.
pub struct Peer {
    /// The CM connection (passive side).
    pub cm: Arc<dyn CmConnection>,
    /// The server's GID.
    pub gid: Gid,
    /// The nonce of the connect request.
    pub nonce: u32,
    /// Transfers completed on this connection.
    pub seq: u32,
    /// When the last transfer on it ended.
    pub last_used: Instant,
}

/// A transfer waiting for a server on this connection.
#[derive(Clone)]
pub struct Waiting {
    /// The token it minted; a server must present it to connect.
    pub token: Token,
    /// wr_id of the receive its final message will consume.
    pub recv_wr_id: u64,
    /// Remote access the transfer grants.
    pub access: Access,
    /// The memory window the listener must bind (between RTS and accept)
    /// before the server may use the token's rkey.
    pub bind: Option<BindPlan>,
}

/// A type-2 memory window binding of exactly one transfer's range.
#[derive(Clone)]
pub struct BindPlan {
    /// The window.
    pub mw: Arc<dyn Mw>,
    /// The rkey it gets (the token's rkey).
    pub rkey: u32,
    /// The region the range lies in.
    pub mr: Arc<dyn Mr>,
    /// First byte, as the NIC addresses it.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The access the transfer grants.
    pub access: Access,
}

/// wr_id of memory-window binds and invalidations (receives count from 1).
pub const WINDOW_WR_ID: u64 = u64::MAX;

impl BindPlan {
    /// Binds the window through `conn`'s QP (in RTS) and waits for the bind
    /// to complete, until `deadline`.
    pub fn bind(&self, conn: &Connection, deadline: Instant) -> Result<()> {
        let op = SendOp::BindMw {
            mw: self.mw.clone(),
            rkey: self.rkey,
            mr: self.mr.clone(),
            addr: self.addr,
            len: self.len,
            access: self.access,
        };
        conn.qp.post_send(&[SendWr {
            wr_id: WINDOW_WR_ID,
            op,
            sge: None,
            signaled: true,
        }])?;
        // Posted, it may be bound whatever the wait says: a failed wait
        // leaves the window marked bound, so that the lease's failure path
        // replaces it.
        conn.state.lock().mw_bound = Some(self.rkey);
        conn.wait_window_op(deadline)
    }
}

/// What a connection is doing, guarded by its mutex.
pub struct ConnState {
    /// The link to a server.
    pub link: Link,
    /// The transfer waiting on it, if any.
    pub waiting: Option<Waiting>,
    /// The CM reported the peer gone while the connection was leased; the
    /// lease must reset it.
    pub peer_gone: bool,
    /// Source of receive wr_ids: a completion with an older id is stale.
    pub next_wr_id: u64,
    /// The listener is moving the QP to ERR (to wake a transfer whose
    /// server left); nobody else may touch the QP until it is done.
    pub erroring: bool,
    /// This connection's type-2 memory window, where the device has them.
    pub mw: Option<Arc<dyn Mw>>,
    /// The last rkey the window was given (the next bind uses the next).
    pub mw_rkey: u32,
    /// The rkey of the window while it is bound to a transfer's range.
    pub mw_bound: Option<u32>,
}

/// One pool connection: a QP and its own CQ.
pub struct Connection {
    /// The QP (destroyed before the CQ: declared first).
    pub qp: Arc<dyn Qp>,
    /// Its completion queue.
    pub cq: Arc<dyn Cq>,
    /// Index in the pool.
    pub index: usize,
    /// What it is doing.
    pub state: Mutex<ConnState>,
    /// Signalled when `state.link` leaves `Connecting`, and when
    /// `state.erroring` ends.
    pub settled: Condvar,
}

impl Connection {
    /// Creates a QP with its CQ and moves it to INIT with no remote access;
    /// and a memory window where the device has them.
    pub fn create(ctx: &dyn Context, pd: &dyn Pd, port: u8, index: usize) -> Result<Connection> {
        let cq = ctx.create_cq(CQ_DEPTH)?;
        let qp = pd.create_qp(&cq, QP_CAPS)?;
        qp.modify(&init_attr(port))?;
        let mw = if ctx.supports_mw() {
            Some(pd.alloc_mw()?)
        } else {
            None
        };
        let mw_rkey = mw.as_ref().map_or(0, |w| w.rkey());
        Ok(Connection {
            qp,
            cq,
            index,
            state: Mutex::new(ConnState {
                link: Link::Unconnected,
                waiting: None,
                peer_gone: false,
                next_wr_id: 1,
                erroring: false,
                mw,
                mw_rkey,
                mw_bound: None,
            }),
            settled: Condvar::new(),
        })
    }

    /// Brings the QP back to INIT, unconnected: drains the CQ (a completion
    /// can sit behind a disconnect), then RESET, then INIT. Posted receives
    /// are discarded by RESET without completions.
    pub fn reset(&self, port: u8) -> Result<()> {
        self.drain();
        self.qp.modify(&QpAttr {
            state: Some(QpState::Reset),
            ..QpAttr::default()
        })?;
        self.qp.modify(&init_attr(port))?;
        Ok(())
    }

    /// Waits for the completion of the window operation (bind or
    /// invalidation) just posted; other completions are of earlier
    /// transfers and are dropped.
    pub fn wait_window_op(&self, deadline: Instant) -> Result<()> {
        let what = || format!("memory window operation on QP {}", self.qp.qp_num());
        match crate::platform::wait_for_completion(&*self.cq, WINDOW_WR_ID, deadline)? {
            Some(c) if c.status == crate::platform::WcStatus::Success => Ok(()),
            Some(c) => Err(Error::Rdma(format!("{}: {:?}", what(), c.status))),
            None => Err(Error::Rdma(format!("{}: no completion", what()))),
        }
    }

    /// Invalidates the window if it is bound; a failure leaves it bound.
    pub fn invalidate_window(&self, deadline: Instant) -> Result<()> {
        let Some(rkey) = self.state.lock().mw_bound else {
            return Ok(());
        };
        let op = SendOp::LocalInv { rkey };
        self.qp.post_send(&[SendWr {
            wr_id: WINDOW_WR_ID,
            op,
            sge: None,
            signaled: true,
        }])?;
        self.wait_window_op(deadline)?;
        self.state.lock().mw_bound = None;
        Ok(())
    }

    /// The window and rkey for the next transfer, if the device has
    /// windows.
    pub fn next_window(state: &mut ConnState) -> Option<(Arc<dyn Mw>, u32)> {
        let mw = state.mw.clone()?;
        state.mw_rkey = next_rkey(state.mw_rkey);
        Some((mw, state.mw_rkey))
    }

    /// Throws away every completion queued.
    pub fn drain(&self) {
        while let Ok(c) = self.cq.poll(CQ_DEPTH as usize) {
            if c.is_empty() {
                break;
            }
        }
    }

    /// Waits while the listener is working on this connection's QP
    /// (connecting it to a server, or moving it to ERR).
    pub fn wait_settled(&self) -> parking_lot::MutexGuard<'_, ConnState> {
        let mut state = self.state.lock();
        while matches!(state.link, Link::Connecting) || state.erroring {
            self.settled.wait(&mut state);
        }
        state
    }
}

/// RESET->INIT: pkey 0, the port, and no remote access until a transfer
/// grants the access it needs.
pub fn init_attr(port: u8) -> QpAttr {
    QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(port),
        access: Some(Access::empty()),
        ..QpAttr::default()
    }
}

/// Ends a connection's link to its server: disconnects the CM connection (if
/// any). The QP still has to be reset.
pub fn disconnect(peer: Peer) {
    if let Err(e) = peer.cm.disconnect() {
        eprintln!("hipobj: rdma_disconnect: {e}");
    }
}

struct Inner {
    free: Vec<usize>,
    closed: bool,
    /// Connections that could not be reset and were retired.
    retired: usize,
}

/// The pool.
pub struct ConnectionPool {
    slots: Vec<Arc<Connection>>,
    /// For replacing memory windows left bound by a failed transfer.
    pd: Arc<dyn Pd>,
    inner: Mutex<Inner>,
    available: Condvar,
    /// The IB port every QP uses.
    pub port: u8,
    // Keeps the CM (and its library) alive while connections exist.
    _cm: Arc<dyn Cm>,
}

thread_local! {
    /// Leases this thread holds, of any pool: a thread that holds one and
    /// finds none free gets `Busy` rather than waiting for itself.
    static HELD: Cell<usize> = const { Cell::new(0) };
    /// The server GID of this thread's last transfer.
    static LAST_PEER: Cell<Option<Gid>> = const { Cell::new(None) };
}

/// Remembers the server this thread's transfer used.
pub fn remember_peer(gid: Gid) {
    LAST_PEER.with(|p| p.set(Some(gid)));
}

impl ConnectionPool {
    /// Creates `count` connections; creating fewer is a failure.
    pub fn new(
        ctx: &dyn Context,
        pd: &Arc<dyn Pd>,
        cm: Arc<dyn Cm>,
        port: u8,
        count: u32,
    ) -> Result<ConnectionPool> {
        let count = usize::try_from(count).map_err(|_| Error::InvalidValue("pool size"))?;
        let slots = (0..count)
            .map(|i| Connection::create(ctx, &**pd, port, i).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(ConnectionPool {
            pd: pd.clone(),
            inner: Mutex::new(Inner {
                free: (0..slots.len()).rev().collect(),
                closed: false,
                retired: 0,
            }),
            slots,
            available: Condvar::new(),
            port,
            _cm: cm,
        })
    }

    /// Every connection, by index.
    pub fn slots(&self) -> &[Arc<Connection>] {
        &self.slots
    }

    /// The connection whose QP has number `qp_num`.
    pub fn by_qp_num(&self, qp_num: u32) -> Option<&Arc<Connection>> {
        self.slots.iter().find(|c| c.qp.qp_num() == qp_num)
    }

    /// Leases a connection; see [`ConnectionPool::acquire_with`].
    pub fn acquire(self: &Arc<Self>) -> Result<Lease> {
        self.acquire_with(|| None)
    }

    /// Leases a connection. When none is free: a thread that already holds a
    /// lease gets `Busy`; others wait, calling `reap` first and whenever they
    /// wake (it may return leases held by expired tokens, and says until when
    /// to wait at most). A closed pool gives `NotInitialized`.
    pub fn acquire_with(self: &Arc<Self>, reap: impl Fn() -> Option<Instant>) -> Result<Lease> {
        let wake_at = reap();
        let mut inner = self.inner.lock();
        loop {
            if inner.closed {
                return Err(Error::NotInitialized);
            }
            if let Some(index) = self.pick(&mut inner) {
                HELD.with(|h| h.set(h.get() + 1));
                return Ok(Lease {
                    pool: self.clone(),
                    index,
                    counted: true,
                    retire: false,
                });
            }
            if self.slots.len() == inner.retired {
                return Err(Error::Rdma(
                    "every pool connection failed and was retired".into(),
                ));
            }
            if HELD.with(Cell::get) > 0 {
                return Err(Error::Busy(
                    "every connection is leased, one of them by this thread",
                ));
            }
            match wake_at {
                Some(at) => {
                    let timed_out = self.available.wait_until(&mut inner, at).timed_out();
                    if timed_out {
                        drop(inner);
                        let _ = reap();
                        inner = self.inner.lock();
                    }
                }
                None => self.available.wait(&mut inner),
            }
        }
    }

    /// Chooses a free connection: one linked to this thread's last server,
    /// else (without a preference) any linked one, else an unlinked one,
    /// else any.
    fn pick(&self, inner: &mut Inner) -> Option<usize> {
        if inner.free.is_empty() {
            return None;
        }
        let prefer = LAST_PEER.with(Cell::get);
        let rank = |index: usize| -> u8 {
            let state = self.slots[index].state.lock();
            match (&state.link, prefer) {
                (Link::Connected(p), Some(gid)) if p.gid == gid => 0,
                (Link::Connected(_), None) => 1,
                (Link::Unconnected, _) => 2,
                _ => 3,
            }
        };
        let (pos, _) = inner
            .free
            .iter()
            .enumerate()
            .min_by_key(|(_, &i)| rank(i))?;
        Some(inner.free.swap_remove(pos))
    }

    /// Takes connection `index` if it is free, without counting it as this
    /// thread's lease (for the listener's maintenance).
    pub fn try_take(self: &Arc<Self>, index: usize) -> Option<Lease> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return None;
        }
        let pos = inner.free.iter().position(|&i| i == index)?;
        inner.free.swap_remove(pos);
        Some(Lease {
            pool: self.clone(),
            index,
            counted: false,
            retire: false,
        })
    }

    /// Closes the pool: leases fail with `NotInitialized` from now on,
    /// including those waiting.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.available.notify_all();
    }

    /// Whether [`ConnectionPool::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed
    }

    /// Free connections.
    pub fn free_count(&self) -> usize {
        self.inner.lock().free.len()
    }

    /// Connections retired after a failed reset.
    pub fn retired_count(&self) -> usize {
        self.inner.lock().retired
    }

    fn give_back(&self, index: usize, retire: bool) {
        let mut inner = self.inner.lock();
        if retire {
            inner.retired += 1;
        } else {
            inner.free.push(index);
        }
        drop(inner);
        self.available.notify_one();
    }
}

/// One leased connection; returned to the pool on drop.
pub struct Lease {
    pool: Arc<ConnectionPool>,
    index: usize,
    counted: bool,
    retire: bool,
}

impl Lease {
    /// The leased connection.
    pub fn conn(&self) -> &Arc<Connection> {
        &self.pool.slots[self.index]
    }

    /// The pool it came from.
    pub fn pool(&self) -> &Arc<ConnectionPool> {
        &self.pool
    }

    /// Ends the lease after a failure: disconnects the server, resets the QP
    /// to INIT and returns it; a QP that cannot be reset is retired.
    pub fn fail(mut self) {
        let conn = self.conn().clone();
        let (peer, stale_window) = {
            let mut state = conn.wait_settled();
            state.waiting = None;
            state.peer_gone = false;
            // A window still bound cannot be invalidated through a QP that
            // is not in RTS: it is deallocated (which invalidates it) and
            // replaced below.
            let stale_window = if state.mw_bound.take().is_some() {
                state.mw.take()
            } else {
                None
            };
            let peer = match std::mem::replace(&mut state.link, Link::Unconnected) {
                Link::Connected(peer) => Some(peer),
                _ => None,
            };
            (peer, stale_window)
        };
        if let Some(peer) = peer {
            disconnect(peer);
        }
        if let Some(old) = stale_window {
            drop(old);
            match self.pool.pd.alloc_mw() {
                Ok(mw) => {
                    let mut state = conn.state.lock();
                    state.mw_rkey = mw.rkey();
                    state.mw = Some(mw);
                }
                // Without a window the connection falls back to the MR's rkey.
                Err(e) => eprintln!(
                    "hipobj: replacing the memory window of connection {}: {e}",
                    conn.index
                ),
            }
        }
        if let Err(e) = conn.reset(self.pool.port) {
            eprintln!("hipobj: retiring connection {}: {e}", conn.index);
            self.retire = true;
        }
    }

    /// Detaches the lease from this thread's count: for a lease that outlives
    /// the call that took it (an application-driven token).
    pub fn detach(&mut self) {
        if std::mem::take(&mut self.counted) {
            HELD.with(|h| h.set(h.get() - 1));
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.detach();
        self.pool.give_back(self.index, self.retire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fabric::{DeviceSpec, Fabric};
    use crate::testing::{Counters, Faults};

    fn pool(count: u32) -> (Arc<Counters>, Arc<ConnectionPool>) {
        let counters = Arc::new(Counters::new());
        let fabric = Fabric::new(Arc::new(Faults::new()), counters.clone());
        fabric
            .add_device(DeviceSpec::new("d0", std::net::Ipv4Addr::new(192, 0, 2, 9)))
            .unwrap();
        let ctx = fabric.verbs(&["d0"]).open("d0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let pool = ConnectionPool::new(&*ctx, &pd, fabric.cm(&["d0"]), 1, count).unwrap();
        (counters, Arc::new(pool))
    }

    #[test]
    fn connections_start_in_init_with_no_remote_access() {
        let (counters, pool) = pool(3);
        assert_eq!(counters.live("qp"), 3);
        assert_eq!(counters.live("cq"), 3);
        for conn in pool.slots() {
            assert_eq!(conn.qp.state().unwrap(), QpState::Init);
            assert!(pool.by_qp_num(conn.qp.qp_num()).is_some());
        }
    }

    #[test]
    fn a_thread_holding_a_lease_gets_busy_instead_of_waiting_for_itself() {
        let (_, pool) = pool(1);
        let lease = pool.acquire().unwrap();
        assert!(matches!(pool.acquire(), Err(Error::Busy(_))));
        drop(lease);
        let again = pool.acquire().unwrap();
        drop(again);
        assert_eq!(pool.free_count(), 1);
    }

    #[test]
    fn close_fails_a_waiting_or_later_acquire_with_not_initialized() {
        let (_, pool) = pool(1);
        let lease = pool.acquire().unwrap();
        std::thread::scope(|s| {
            // Whether it is already waiting or not yet, nothing but the close
            // can end the other thread's acquire.
            let waiter = s.spawn(|| pool.acquire().map(|_| ()));
            pool.close();
            assert_eq!(waiter.join().unwrap().unwrap_err(), Error::NotInitialized);
        });
        drop(lease);
        assert!(
            pool.try_take(0).is_none(),
            "a closed pool hands out nothing"
        );
    }

    #[test]
    fn a_detached_lease_does_not_count_for_its_thread() {
        let (_, pool) = pool(2);
        let mut token = pool.acquire().unwrap();
        token.detach();
        let other = pool.acquire().unwrap();
        // Both taken; this thread holds only `other` as its own.
        assert!(matches!(pool.acquire(), Err(Error::Busy(_))));
        drop(other);
        drop(token);
        assert_eq!(pool.free_count(), 2);
    }

    #[test]
    fn a_failed_lease_comes_back_reset() {
        let (_, pool) = pool(1);
        let lease = pool.acquire().unwrap();
        lease
            .conn()
            .qp
            .modify(&QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            })
            .unwrap();
        lease.fail();
        assert_eq!(pool.slots()[0].qp.state().unwrap(), QpState::Init);
        assert_eq!(pool.free_count(), 1);
        assert_eq!(pool.retired_count(), 0);
    }
}
