//! The server's side of the connection protocol (`docs/protocol.md`), over
//! the platform traits: what an RDMA-enabled S3 server does with a client's
//! `0x02` token. The S3 test servers and the benchmarks are built on it.
//!
//! For each token it finds its established connection to the client QP the
//! token names, or connects to the client's listener with the token as
//! proof; moves the bytes with RDMA WRITEs (GET) or READs (PUT); then sends
//! the zero-length SEND with immediate carrying the transfer's secret, and
//! waits for its completion, before the S3 reply may be sent.
//!
//! The steps are public on their own so that tests can play a server that
//! breaks the protocol on purpose.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::core::nic::ip_of;
use crate::core::protocol::{decode_reject, final_imm, ConnectData};
use crate::core::token::{Token, Transport};
use crate::core::{Error, Result};
use crate::platform::{
    Cm, CmConnection, ConnectOutcome, ConnectRequest, Context, Cq, Gid, Mr, Pd, Qp, QpCaps, SendOp,
    SendWr, Sge, WcStatus,
};

/// The client QP a token names, as a connection's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientQp {
    /// The client's GID.
    pub gid: Gid,
    /// Its QP number.
    pub qp_num: u32,
    /// Its listener's port.
    pub port: u16,
}

impl ClientQp {
    /// The key of the QP `token` names.
    pub fn of(token: &Token) -> ClientQp {
        ClientQp {
            gid: token.gid,
            qp_num: token.qp_num,
            port: token.lid,
        }
    }
}

/// One established connection to a client QP.
pub struct ServerConn {
    /// The CM connection (active side, which owns the QP).
    pub cm: Arc<dyn CmConnection>,
    /// Its QP.
    pub qp: Arc<dyn Qp>,
    /// Its completion queue.
    pub cq: Arc<dyn Cq>,
    /// The nonce sent in the connect request.
    pub nonce: u32,
    /// Transfers completed on it.
    pub seq: u32,
}

/// The server's memory a transfer reads from or writes to.
#[derive(Clone)]
pub struct LocalBuf {
    /// Its registration.
    pub mr: Arc<dyn Mr>,
    /// First byte.
    pub addr: u64,
}

/// Which way a transfer goes, from the client's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The client reads the object: the server WRITEs into its buffer.
    Get,
    /// The client writes the object: the server READs its buffer.
    Put,
}

/// QP capacities of server connections.
const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 4,
    max_send_sge: 1,
    max_recv_sge: 1,
};

/// The server side of one NIC.
pub struct ServerSide {
    cm: Arc<dyn Cm>,
    ctx: Arc<dyn Context>,
    pd: Arc<dyn Pd>,
    conns: Mutex<HashMap<ClientQp, Arc<Mutex<ServerConn>>>>,
    /// `conn_param.retry_count`: finite, so failures surface (7 would retry
    /// forever on Soft-RoCE).
    pub retry_count: u8,
}

impl ServerSide {
    /// A server side on `ctx` / `pd`.
    pub fn new(cm: Arc<dyn Cm>, ctx: Arc<dyn Context>, pd: Arc<dyn Pd>) -> ServerSide {
        ServerSide {
            cm,
            ctx,
            pd,
            conns: Mutex::new(HashMap::new()),
            retry_count: 6,
        }
    }

    /// The protection domain, for registering the server's memory.
    pub fn pd(&self) -> &Arc<dyn Pd> {
        &self.pd
    }

    /// Serves one transfer: the whole protocol. On any failure the
    /// connection is dropped (disconnected), as the client drops its side.
    pub fn serve(&self, token: &Token, op: Op, local: &LocalBuf, deadline: Instant) -> Result<()> {
        let conn = self.connection(token, deadline)?;
        let mut guard = conn.lock();
        let outcome = self
            .move_data(&guard, token, op, local, deadline)
            .and_then(|()| {
                let imm = final_imm(guard.nonce, guard.seq);
                self.send_final(&guard, imm, deadline)
            });
        match outcome {
            Ok(()) => {
                guard.seq = guard.seq.wrapping_add(1);
                Ok(())
            }
            Err(e) => {
                drop(guard);
                self.drop_connection(&ClientQp::of(token));
                Err(e)
            }
        }
    }

    /// The established connection to the QP `token` names, or a new one.
    pub fn connection(&self, token: &Token, deadline: Instant) -> Result<Arc<Mutex<ServerConn>>> {
        if token.transport != Transport::RcCm {
            return Err(Error::InvalidValue(
                "not a 0x02 token: this server connects through RDMA CM",
            ));
        }
        let key = ClientQp::of(token);
        // Bound first: the map's guard must not live into the branch below.
        let existing = self.conns.lock().get(&key).cloned();
        if let Some(conn) = existing {
            if !conn.lock().cm.is_disconnected() {
                return Ok(conn);
            }
            self.drop_connection(&key);
        }
        let nonce = random_u32();
        let data = ConnectData {
            token: *token,
            nonce,
        }
        .encode();
        let conn = Arc::new(Mutex::new(
            self.connect_with(token, &data, nonce, deadline)?,
        ));
        self.conns.lock().insert(key, conn.clone());
        Ok(conn)
    }

    /// Connects to the listener `token` names with `private_data` as the
    /// connect request's.
    pub fn connect_with(
        &self,
        token: &Token,
        private_data: &[u8],
        nonce: u32,
        deadline: Instant,
    ) -> Result<ServerConn> {
        let cq = self.ctx.create_cq(32)?;
        let addr = SocketAddr::new(ip_of(&token.gid), token.lid);
        let outcome = self.cm.connect(ConnectRequest {
            addr,
            pd: &self.pd,
            cq: &cq,
            caps: CAPS,
            private_data,
            initiator_depth: 1,
            responder_resources: 1,
            retry_count: self.retry_count,
            rnr_retry_count: 7,
            deadline,
        })?;
        match outcome {
            ConnectOutcome::Established(cm) => {
                let qp = cm
                    .qp()
                    .ok_or_else(|| Error::Internal("the active side has no QP".into()))?;
                Ok(ServerConn {
                    cm,
                    qp,
                    cq,
                    nonce,
                    seq: 0,
                })
            }
            ConnectOutcome::Rejected { private_data } => Err(Error::Rdma(format!(
                "the client rejected the connection: {:?}",
                decode_reject(&private_data)
            ))),
        }
    }

    /// Disconnects and forgets the connection to `key`.
    pub fn drop_connection(&self, key: &ClientQp) {
        let removed = self.conns.lock().remove(key);
        if let Some(conn) = removed {
            let _ = conn.lock().cm.disconnect();
        }
    }

    /// Forgets connections whose client disconnected (or that failed),
    /// releasing their QPs.
    pub fn forget_disconnected(&self) {
        let gone: Vec<Arc<Mutex<ServerConn>>> = {
            let mut conns = self.conns.lock();
            let keys: Vec<ClientQp> = conns
                .iter()
                .filter(|(_, c)| c.lock().cm.is_disconnected())
                .map(|(k, _)| *k)
                .collect();
            keys.iter().filter_map(|k| conns.remove(k)).collect()
        };
        drop(gone);
    }

    /// Established connections.
    pub fn connection_count(&self) -> usize {
        self.conns.lock().len()
    }

    /// The data of one transfer: WRITEs for a GET, READs for a PUT, waited
    /// for (a READ must complete before the final message says the bytes
    /// are here).
    pub fn move_data(
        &self,
        conn: &ServerConn,
        token: &Token,
        op: Op,
        local: &LocalBuf,
        deadline: Instant,
    ) -> Result<()> {
        let len = u32::try_from(token.length)
            .map_err(|_| Error::InvalidValue("transfer larger than 4 GiB - 1"))?;
        let sge = Some(Sge {
            addr: local.addr,
            len,
            lkey: local.mr.lkey(),
        });
        let op = match op {
            Op::Get => SendOp::Write {
                remote_addr: token.addr,
                rkey: token.rkey,
            },
            Op::Put => SendOp::Read {
                remote_addr: token.addr,
                rkey: token.rkey,
            },
        };
        conn.qp.post_send(&[SendWr {
            wr_id: 1,
            op,
            sge,
            signaled: true,
        }])?;
        wait_send(conn, 1, deadline)
    }

    /// The final message: a zero-length SEND with immediate, waited for.
    pub fn send_final(&self, conn: &ServerConn, imm: u32, deadline: Instant) -> Result<()> {
        let op = SendOp::SendImm { imm };
        conn.qp.post_send(&[SendWr {
            wr_id: 2,
            op,
            sge: None,
            signaled: true,
        }])?;
        wait_send(conn, 2, deadline)
    }
}

/// Waits for the send completion `wr_id` on a server connection.
fn wait_send(conn: &ServerConn, wr_id: u64, deadline: Instant) -> Result<()> {
    match crate::platform::wait_for_completion(&*conn.cq, wr_id, deadline)? {
        Some(c) if c.status == WcStatus::Success => Ok(()),
        Some(c) => Err(Error::Rdma(format!(
            "server work request {wr_id}: {:?}",
            c.status
        ))),
        None => Err(Error::Rdma(format!(
            "server work request {wr_id}: no completion before the deadline"
        ))),
    }
}

/// A nonce: not secret, only different per connection.
fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos().try_into().unwrap_or(0));
    let v = h.finish().to_le_bytes();
    u32::from_le_bytes([v[0], v[1], v[2], v[3]])
}
