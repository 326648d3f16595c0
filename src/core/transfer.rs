//! What an instance does for the buffer and transfer calls: registration,
//! staging copies, and the transfer sequence of `docs/protocol.md`.
//!
//! A transfer leases a connection, posts the receive the server's final
//! message will consume, records the lease as waiting with the token it
//! mints, and calls `sendRequest`. The server connects to the listener with
//! that token (or reuses the connection it has to this QP), moves the data
//! with RDMA WRITEs or READs, then sends a zero-length SEND with immediate
//! whose immediate is this transfer's secret, and only then replies. After
//! `recvReply`, the transfer succeeds on that completion alone.
//!
//! No lock is held across a callback, a verbs call or a HIP call.

use std::sync::Arc;
use std::time::Instant;

use super::args::{BufferRange, Slice, SyncDirection, TokenOp};
use super::buffers::{BufEntry, BufKind};
use super::error::{Error, Result};
use super::instance::Instance;
use super::pool::{self, BindPlan, Connection, Lease, Link, Waiting};
use super::protocol::final_imm;
use super::reply::{parse_reply, REPLY_BUFFER_LEN};
use super::token::{Token, Transport, TOKEN_HEX_LEN};
use crate::platform::{Access, PointerKind, QpAttr, RecvWr, WcOpcode, WcStatus};

/// Every MR allows what any transfer may need: the server writes it for a
/// GET and reads it for a PUT.
const MR_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Object to buffer: the server RDMA WRITEs.
    Get,
    /// Buffer to object: the server RDMA READs.
    Put,
}

impl Direction {
    /// The remote access a transfer grants its server.
    fn access(self) -> Access {
        match self {
            Direction::Get => Access::REMOTE_WRITE,
            Direction::Put => Access::REMOTE_READ,
        }
    }
}

impl From<TokenOp> for Direction {
    fn from(op: TokenOp) -> Direction {
        match op {
            TokenOp::Get => Direction::Get,
            TokenOp::Put => Direction::Put,
        }
    }
}

/// The application's S3 client: the two callbacks of `hipObjOps_t`.
pub trait S3Client {
    /// `sendRequest`: `token` is 88 hex digits followed by a NUL. Returns the
    /// callback's non-zero result as the error.
    fn send_request(&mut self, token: &[u8; TOKEN_HEX_LEN + 1]) -> std::result::Result<(), i32>;
    /// `recvReply` into `reply`; returns the reply's length.
    fn recv_reply(&mut self, reply: &mut [u8; REPLY_BUFFER_LEN])
        -> std::result::Result<usize, i32>;
}

/// A transfer armed on a lease: what its completion must match.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    token: Token,
    recv_wr_id: u64,
}

/// An application-driven transfer in flight: its token is out, and its
/// lease ends when the final message arrives, or at its deadline.
pub(crate) struct Detached {
    pub(crate) lease: Lease,
    ticket: Ticket,
    entry: Arc<BufEntry>,
    deadline: Instant,
}

impl Instance {
    // ------------------------------------------------------------ buffers

    /// `hipObjBufRegister` / `hipObjBufRegisterHost` after the argument
    /// checks: registers `range` as `memory`.
    pub fn register(&self, range: BufferRange, host_only: bool) -> Result<()> {
        self.buffers.precheck(range.addr)?;
        let entry = if host_only {
            self.register_plain(range, BufKind::Host)?
        } else {
            self.register_memory(range)?
        };
        self.buffers.insert(entry)
    }

    /// The access of every MR: [`MR_ACCESS`], and `MW_BIND` where the device
    /// has memory windows.
    fn mr_access(&self) -> Access {
        if self.ctx.supports_mw() {
            MR_ACCESS | Access::MW_BIND
        } else {
            MR_ACCESS
        }
    }

    fn register_plain(&self, range: BufferRange, kind: BufKind) -> Result<BufEntry> {
        let mr = self.pd.reg_mr(range.addr, range.len, self.mr_access())?;
        Ok(BufEntry {
            base: range.addr,
            len: range.len,
            kind,
            mr,
            staging: None,
        })
    }

    /// GPU memory: a dma-buf MR, else a plain MR, else a staging buffer.
    fn register_memory(&self, range: BufferRange) -> Result<BufEntry> {
        let Some(gpu) = &self.gpu else {
            // GPU-less host: the memory can only be host memory.
            return self.register_plain(range, BufKind::Host);
        };
        let device = match gpu.gpu.pointer_kind(range.addr) {
            Ok(PointerKind::Device { device }) => device,
            // Host memory, or memory HIP does not know at all.
            Ok(_) | Err(_) => return self.register_plain(range, BufKind::Host),
        };
        let (base, len) = gpu
            .gpu
            .allocation_range(range.addr)
            .map_err(|code| Error::Hip {
                call: "hipMemGetAddressRange",
                code,
            })?;
        let inside = range.addr >= base
            && range.addr - base <= len
            && range.len <= len - (range.addr - base);
        if !inside {
            return Err(Error::InvalidValue(
                "the range is not inside one HIP allocation",
            ));
        }
        if self.options.dmabuf && self.ctx.supports_dmabuf() {
            match self.register_dmabuf(range) {
                Ok(mr) => {
                    return Ok(BufEntry {
                        base: range.addr,
                        len: range.len,
                        kind: BufKind::Device {
                            device,
                            dmabuf: true,
                        },
                        mr,
                        staging: None,
                    })
                }
                Err(e) if self.options.rdma_debug => {
                    eprintln!("hipobj: dma-buf registration of {:#x}: {e}", range.addr)
                }
                Err(_) => {}
            }
        }
        if let Ok(entry) = self.register_plain(
            range,
            BufKind::Device {
                device,
                dmabuf: false,
            },
        ) {
            return Ok(entry);
        }
        if self.options.require_gpu_direct {
            return Err(Error::Rdma(format!(
                "{:#x}: the NIC cannot reach this GPU memory and HIPOBJ_REQUIRE_GPU_DIRECT refuses staging",
                range.addr
            )));
        }
        let staging = gpu.gpu.host_alloc(range.len).map_err(|code| Error::Hip {
            call: "hipHostMalloc",
            code,
        })?;
        let mr = self
            .pd
            .reg_mr(staging.addr(), range.len, self.mr_access())?;
        eprintln!(
            "hipobj: {:#x} ({} bytes) is staged through host memory: transfers are not GPU-direct",
            range.addr, range.len
        );
        Ok(BufEntry {
            base: range.addr,
            len: range.len,
            kind: BufKind::Staged { device },
            mr,
            staging: Some(staging),
        })
    }

    fn register_dmabuf(&self, range: BufferRange) -> Result<Arc<dyn crate::platform::Mr>> {
        let gpu = self.gpu.as_ref().ok_or(Error::NotSupported("no GPU"))?;
        let (fd, offset) = match gpu.gpu.export_dmabuf(range.addr, range.len) {
            None => return Err(Error::DmabufNotSupported),
            Some(Err(code)) => {
                return Err(Error::Hip {
                    call: "hsa_amd_portable_export_dmabuf",
                    code,
                })
            }
            Some(Ok(export)) => export,
        };
        let iova = u64::try_from(range.addr).map_err(|_| Error::InvalidValue("address"))?;
        // The fd is closed when `fd` drops: the MR holds its own reference.
        self.pd
            .reg_dmabuf_mr(&fd, offset, range.len, iova, self.mr_access())
    }

    /// `hipObjBufDeregister` after the NULL check.
    pub fn deregister(&self, base: usize) -> Result<()> {
        self.reap_detached();
        self.abandoned.prune_all();
        self.buffers.remove(base)
    }

    /// Finds the registration of a slice and checks the slice against it,
    /// and that no abandoned copy of it still runs.
    fn lookup(&self, slice: &Slice) -> Result<Arc<BufEntry>> {
        let entry = self.buffers.find(slice.base)?;
        slice.check_within(u64::try_from(entry.len).map_err(|_| Error::InvalidValue("length"))?)?;
        if entry.staging.is_some() && self.abandoned.is_running(entry.base) {
            return Err(Error::Busy(
                "a staging copy of this buffer timed out and may still be running",
            ));
        }
        Ok(entry)
    }

    // ------------------------------------------------------------ staging

    /// Copies a slice between the device and the staging buffer, within
    /// `HIPOBJ_STAGE_TIMEOUT_MS`. A copy that times out is handed to the
    /// abandoned-copy list.
    fn stage(
        &self,
        entry: &Arc<BufEntry>,
        direction: SyncDirection,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let (Some(staging), Some(gpu)) = (entry.staging_addr(), &self.gpu) else {
            return Ok(());
        };
        let offset = usize::try_from(offset).map_err(|_| Error::InvalidValue("offset"))?;
        let len = usize::try_from(len).map_err(|_| Error::InvalidValue("size"))?;
        let (device, host) = (entry.base + offset, staging + offset);
        let (dst, src) = match direction {
            SyncDirection::ToHost => (host, device),
            SyncDirection::ToDevice => (device, host),
        };
        let slot = self.abandoned.reserve();
        let event = gpu
            .gpu
            .copy_async(dst, src, len)
            .map_err(|hip| Error::Staging {
                what: "hipMemcpyAsync failed",
                hip,
            })?;
        match event.wait(Instant::now() + self.options.stage_timeout) {
            Ok(true) => Ok(()),
            Ok(false) => {
                slot.add(event, entry.clone());
                Err(Error::Staging {
                    what: "the copy did not finish within HIPOBJ_STAGE_TIMEOUT_MS",
                    hip: 0,
                })
            }
            Err(hip) => {
                slot.add(event, entry.clone());
                Err(Error::Staging {
                    what: "hipEventQuery failed",
                    hip,
                })
            }
        }
    }

    /// After the server wrote a directly registered GPU buffer.
    fn sync_device(&self, entry: &BufEntry) -> Result<()> {
        match (entry.kind, &self.gpu) {
            (BufKind::Device { device, .. }, Some(gpu)) => {
                gpu.gpu.synchronize(device).map_err(|code| Error::Hip {
                    call: "hipDeviceSynchronize",
                    code,
                })
            }
            _ => Ok(()),
        }
    }

    // ------------------------------------------------------------ transfers

    /// `hipObjGet` / `hipObjPut` after the argument checks.
    pub fn transfer(
        &self,
        direction: Direction,
        slice: Slice,
        s3: &mut dyn S3Client,
    ) -> Result<()> {
        self.reap_detached();
        let entry = self.lookup(&slice)?;
        if direction == Direction::Put {
            self.stage(&entry, SyncDirection::ToHost, slice.offset, slice.len)?;
        }
        let lease = self.pool.acquire_with(|| self.reap_detached())?;
        let outcome = self
            .arm(&lease, &entry, slice.offset, slice.len, direction)
            .and_then(|ticket| self.converse(ticket, s3).map(|()| ticket))
            .and_then(|ticket| {
                self.await_final(
                    &lease,
                    ticket,
                    Instant::now() + self.options.completion_timeout,
                )
            });
        match outcome {
            Ok(()) => self.finish(lease),
            Err(e) => {
                lease.fail();
                return Err(e);
            }
        }
        match direction {
            Direction::Get if entry.staging.is_some() => {
                self.stage(&entry, SyncDirection::ToDevice, slice.offset, slice.len)
            }
            Direction::Get => self.sync_device(&entry),
            Direction::Put => Ok(()),
        }
    }

    /// Prepares a leased connection for one transfer: a connection whose
    /// server went away is reset first; the receive for the final message is
    /// posted; an established QP is given the access this transfer needs;
    /// the lease is recorded as waiting with the token it returns.
    fn arm(
        &self,
        lease: &Lease,
        entry: &BufEntry,
        offset: u64,
        len: u64,
        direction: Direction,
    ) -> Result<Ticket> {
        let conn = lease.conn();
        // A connection whose server went away (the listener saw it go, or
        // moved the QP to ERR to wake a transfer) is reset before use, with
        // or without a peer left to disconnect.
        let (stale, peer, connected, recv_wr_id, window) = {
            let mut state = conn.wait_settled();
            let stale = state.peer_gone
                || matches!(&state.link, Link::Connected(p) if p.cm.is_disconnected());
            let peer = if stale {
                state.peer_gone = false;
                match std::mem::replace(&mut state.link, Link::Unconnected) {
                    Link::Connected(peer) => Some(peer),
                    _ => None,
                }
            } else {
                None
            };
            let connected = matches!(state.link, Link::Connected(_));
            let id = state.next_wr_id;
            state.next_wr_id += 1;
            let window = Connection::next_window(&mut state);
            (stale, peer, connected, id, window)
        };
        if let Some(peer) = peer {
            pool::disconnect(peer);
        }
        if stale {
            conn.reset(self.pool.port)?;
        }
        conn.qp.post_recv(RecvWr {
            wr_id: recv_wr_id,
            sge: None,
        })?;
        let access = direction.access();
        let addr = entry.nic_addr(offset);
        // Where the device has memory windows, the token's rkey is a window
        // bound to exactly this transfer's range with only its access; it is
        // invalidated when the transfer ends.
        let bind = window.map(|(mw, rkey)| BindPlan {
            mw,
            rkey,
            mr: entry.mr.clone(),
            addr,
            len,
            access,
        });
        let rkey = bind.as_ref().map_or_else(|| entry.mr.rkey(), |b| b.rkey);
        if connected {
            conn.qp.modify(&QpAttr {
                access: Some(access),
                ..QpAttr::default()
            })?;
            // On a fresh connection the listener binds, between RTS and the
            // accept; the plan stays in `Waiting` either way, so that a
            // server connecting anew gets the window bound again.
            if let Some(plan) = &bind {
                plan.bind(conn, Instant::now() + self.options.completion_timeout)?;
            }
        }
        let token = Token {
            transport: Transport::RcCm,
            qp_num: conn.qp.qp_num(),
            gid: self.gid,
            rkey,
            addr,
            length: len,
            port: self.nic.port,
            lid: self.listener_port(),
        };
        conn.state.lock().waiting = Some(Waiting {
            token,
            recv_wr_id,
            access,
            bind,
        });
        Ok(Ticket { token, recv_wr_id })
    }

    /// The S3 conversation: the token out, the reply back.
    fn converse(&self, ticket: Ticket, s3: &mut dyn S3Client) -> Result<()> {
        let mut token = [0u8; TOKEN_HEX_LEN + 1];
        token[..TOKEN_HEX_LEN].copy_from_slice(&ticket.token.to_hex());
        s3.send_request(&token)
            .map_err(|rc| Error::S3(format!("sendRequest returned {rc}")))?;
        let mut reply = [0u8; REPLY_BUFFER_LEN];
        let len = s3
            .recv_reply(&mut reply)
            .map_err(|rc| Error::S3(format!("recvReply returned {rc}")))?;
        let text = reply.get(..len).ok_or_else(|| {
            Error::S3(format!(
                "recvReply reported {len} bytes in a 512-byte buffer"
            ))
        })?;
        let parsed = parse_reply(text).map_err(|e| Error::S3(format!("unparsable reply: {e}")))?;
        if !parsed.is_success() {
            return Err(Error::S3(format!(
                "the server replied {}",
                parsed.http_code
            )));
        }
        Ok(())
    }

    /// Waits for the server's final message on the lease's CQ: success only
    /// on a SEND with immediate that consumed this transfer's receive and
    /// carries this transfer's secret.
    fn await_final(&self, lease: &Lease, ticket: Ticket, deadline: Instant) -> Result<()> {
        let conn = lease.conn();
        loop {
            for c in conn.cq.poll(pool::CQ_DEPTH as usize)? {
                if c.wr_id != ticket.recv_wr_id {
                    continue; // a completion of an earlier transfer's receive
                }
                if c.status != WcStatus::Success {
                    return Err(Error::Rdma(format!(
                        "the final message failed: {:?} (vendor error {:#x})",
                        c.status, c.vendor_err
                    )));
                }
                if c.opcode != WcOpcode::Recv {
                    return Err(Error::Rdma(format!(
                        "the final message was a {:?}, not a SEND with immediate",
                        c.opcode
                    )));
                }
                // The server may finish before the listener thread records
                // the connection it accepted: wait for that first.
                let expected = match &conn.wait_settled().link {
                    Link::Connected(p) => final_imm(p.nonce, p.seq),
                    _ => {
                        return Err(Error::Rdma(
                            "a final message arrived from no connected server".into(),
                        ))
                    }
                };
                if c.imm != Some(expected) {
                    return Err(Error::Rdma(
                        "the final message carried the wrong secret".into(),
                    ));
                }
                return Ok(());
            }
            if matches!(conn.state.lock().link, Link::Unconnected) {
                return Err(Error::Rdma(
                    "the server replied without connecting to this client".into(),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::Rdma(format!(
                    "no final message from the server within {} ms",
                    self.options.completion_timeout.as_millis()
                )));
            }
            conn.cq.wait(deadline)?;
        }
    }

    /// Ends a successful transfer's lease: the connection stays established
    /// for the next transfer to the same server, with no remote access.
    fn finish(&self, lease: Lease) {
        let conn = lease.conn().clone();
        let connected = {
            let mut state = conn.wait_settled();
            if state.peer_gone {
                // The server left right after this transfer: start afresh.
                drop(state);
                lease.fail();
                return;
            }
            state.waiting = None;
            match &mut state.link {
                Link::Connected(peer) => {
                    peer.seq = peer.seq.wrapping_add(1);
                    peer.last_used = Instant::now();
                    pool::remember_peer(peer.gid);
                    true
                }
                _ => false,
            }
        };
        if connected {
            let revoked = conn
                .invalidate_window(Instant::now() + self.options.completion_timeout)
                .and_then(|()| {
                    conn.qp.modify(&QpAttr {
                        access: Some(Access::empty()),
                        ..QpAttr::default()
                    })
                });
            if let Err(e) = revoked {
                eprintln!(
                    "hipobj: revoking remote access on QP {}: {e}",
                    conn.qp.qp_num()
                );
                lease.fail();
            }
        }
    }

    // ------------------------------------------------------------ application-driven

    /// `hipObjGetRdmaToken` after the argument checks: leases a connection
    /// for a transfer the application drives, and returns its token. The
    /// lease ends when the server's final message arrives (noticed by the
    /// next call into the library) or after `HIPOBJ_TOKEN_TIMEOUT_MS`.
    pub fn mint_token(&self, slice: Slice, op: TokenOp) -> Result<Token> {
        self.reap_detached();
        let entry = self.lookup(&slice)?;
        let mut lease = self.pool.acquire_with(|| self.reap_detached())?;
        lease.detach();
        let ticket = match self.arm(&lease, &entry, 0, slice.len, op.into()) {
            Ok(ticket) => ticket,
            Err(e) => {
                lease.fail();
                return Err(e);
            }
        };
        let deadline = Instant::now() + self.options.token_timeout;
        self.detached.lock().push(Detached {
            lease,
            ticket,
            entry,
            deadline,
        });
        Ok(ticket.token)
    }

    /// `hipObjBufSync` after the argument checks.
    pub fn buf_sync(&self, slice: Slice, direction: SyncDirection) -> Result<()> {
        let entry = self.lookup(&slice)?;
        if direction == SyncDirection::ToDevice {
            // The data of application-driven GETs into this buffer must have
            // landed: their final messages are awaited first.
            let mine: Vec<Detached> = {
                let mut all = self.detached.lock();
                let (mine, rest) = std::mem::take(&mut *all)
                    .into_iter()
                    .partition(|d| d.entry.base == entry.base);
                *all = rest;
                mine
            };
            for d in mine {
                let deadline = Instant::now() + self.options.completion_timeout;
                match self.await_final(&d.lease, d.ticket, deadline) {
                    Ok(()) => self.finish(d.lease),
                    Err(e) => {
                        d.lease.fail();
                        return Err(e);
                    }
                }
            }
        }
        self.stage(&entry, direction, slice.offset, slice.len)
    }

    /// Ends the leases of application-driven transfers that completed or
    /// expired. Returns the earliest deadline of those still out.
    pub(crate) fn reap_detached(&self) -> Option<Instant> {
        let all = std::mem::take(&mut *self.detached.lock());
        if all.is_empty() {
            return None;
        }
        let now = Instant::now();
        let mut kept = Vec::new();
        for d in all {
            // While the listener connects the QP (and binds its window), the
            // CQ is the listener's to read.
            if matches!(d.lease.conn().state.lock().link, Link::Connecting) {
                kept.push(d);
                continue;
            }
            // A deadline of now polls once without waiting.
            match self.await_final(&d.lease, d.ticket, now) {
                Ok(()) => self.finish(d.lease),
                Err(_) if d.deadline > now && !self.final_failed(&d) => kept.push(d),
                Err(_) => d.lease.fail(),
            }
        }
        let next = kept.iter().map(|d| d.deadline).min();
        self.detached.lock().extend(kept);
        next
    }

    /// Whether an application-driven transfer has failed for good (as
    /// opposed to not having finished yet): its server went away.
    fn final_failed(&self, d: &Detached) -> bool {
        d.lease.conn().state.lock().peer_gone
    }
}
