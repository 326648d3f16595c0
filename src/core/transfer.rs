//! What an instance does for the buffer and transfer calls: registration,
//! staging copies, and the transfer sequence of `docs/protocol.md` as the
//! calling thread sees it.
//!
//! A transfer leases a slot, mints a token (a fresh secret from the
//! operating system's CSPRNG, a random window key), hands the transfer to
//! the connection driver and calls `sendRequest`. The server proves it
//! holds the token (in its connect request, or in a SEND on the connection
//! it has), the driver grants exactly the transfer's range and direction,
//! the server moves the data and sends its final message, and the driver
//! revokes the access and leaves the outcome in the transfer's mailbox,
//! which the thread reads after `recvReply`. The thread touches no QP.
//!
//! No lock is held across a callback, a verbs call or a HIP call.

use crate::log::{log, Level};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::args::Direction;
use super::args::{BufferRange, Slice, SyncDirection, TokenOp};
use super::buffers::{BufEntry, BufKind, DmabufSource};
use super::connections::{remember_peer, AbortHandle, Armed, Grant, Lease, Mode, SlotInfo};
use super::instance::Instance;
use super::keys::{fresh_window_key, random_bytes};
use super::mailbox::{late, Mailbox};
use super::reply::{parse_reply, REPLY_BUFFER_LEN};
use super::stats::DECLINED;
use super::sync::Mutex;
use super::token::{Token, Transport, TOKEN_HEX_LEN};
use crate::error::{Error, Result};
use crate::platform::{Access, GpuCall, PointerKind};

/// How much longer than its own deadline a thread waits for the driver's
/// answer before it gives up on the driver (which never happens unless the
/// driver is wedged).
const DRIVER_GRACE: Duration = Duration::from_secs(5);

/// How a transfer's bytes went between the NIC and the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// The NIC read or wrote the buffer itself (host memory, or GPU memory
    /// registered directly).
    Direct,
    /// Through a pinned host buffer and a GPU copy.
    Staged,
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

/// Ends a running transfer from another thread: an asynchronous
/// transfer's cancellation. Shared by the thread that runs the transfer
/// and whoever may cancel it.
///
/// ```text
///  Idle --the transfer is armed--> Watching(abort) --its outcome is in--> Idle
///  Idle | Watching --cancel--> Cancelled   (Watching: Abort sent: access
///                                           revoked, the mailbox filled)
/// ```
///
/// A transfer that finds `Cancelled` before its lease is armed ends at
/// once (no token was sent anywhere); one armed after it is aborted before
/// its token leaves the process.
#[derive(Default)]
pub struct Canceller {
    state: Mutex<CancelState>,
}

#[derive(Default)]
enum CancelState {
    #[default]
    Idle,
    Watching(AbortHandle),
    Cancelled,
}

impl Canceller {
    /// Not cancelled.
    pub fn new() -> Canceller {
        Canceller::default()
    }

    /// Cancels: a transfer armed now is aborted (its access revoked by the
    /// driver, never waited for here); one not yet armed will not start.
    /// Later calls do nothing.
    pub fn cancel(&self) {
        let before = std::mem::replace(&mut *self.state.lock(), CancelState::Cancelled);
        if let CancelState::Watching(abort) = before {
            abort.abort();
        }
    }

    /// Whether [`Canceller::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        matches!(*self.state.lock(), CancelState::Cancelled)
    }

    /// The transfer on `lease` is armed: watched until [`Canceller::idle`].
    /// `false` if it was cancelled already (the caller ends it).
    fn watch(&self, lease: &Lease) -> bool {
        let mut state = self.state.lock();
        match (&*state, lease.abort_handle()) {
            (CancelState::Cancelled, _) => false,
            (_, Some(abort)) => {
                *state = CancelState::Watching(abort);
                true
            }
            (_, None) => true,
        }
    }

    /// The watched transfer's outcome is in: nothing to abort any more.
    fn idle(&self) {
        let mut state = self.state.lock();
        if matches!(*state, CancelState::Watching(_)) {
            *state = CancelState::Idle;
        }
    }
}

/// The error of a transfer cancelled before it was armed.
fn cancelled() -> Error {
    Error::Rdma("the transfer was cancelled".into())
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

    /// The access of every registration: local write, and `MW_BIND` where
    /// windows grant access. Never remote access: a registration's rkey
    /// would reach the whole buffer through any QP of its protection
    /// domain. Without windows, each transfer registers exactly its range
    /// ([`BufEntry::register_range`]).
    fn mr_access(&self) -> Access {
        match self.mode {
            Mode::Windows => Access::LOCAL_WRITE | Access::MW_BIND,
            Mode::Regions => Access::LOCAL_WRITE,
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
            dmabuf: None,
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
                call: gpu.gpu.call_name(GpuCall::AllocationRange),
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
                Ok((mr, source)) => {
                    return Ok(BufEntry {
                        base: range.addr,
                        len: range.len,
                        kind: BufKind::Device {
                            device,
                            dmabuf: true,
                        },
                        mr,
                        staging: None,
                        // Kept for the per-transfer registrations of a
                        // device without windows.
                        dmabuf: (self.mode == Mode::Regions).then_some(source),
                    });
                }
                Err(e) if self.options.rdma_debug => {
                    log!(
                        Level::Debug,
                        "dma-buf registration of {:#x}: {e}",
                        range.addr
                    )
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
            call: gpu.gpu.call_name(GpuCall::HostAlloc),
            code,
        })?;
        let mr = self
            .pd
            .reg_mr(staging.addr(), range.len, self.mr_access())?;
        // Freed only once the NIC can no longer reach it.
        mr.keep_until_deregistered(Box::new(staging.clone()));
        log!(
            Level::Warn,
            "{:#x} ({} bytes) is staged through host memory: transfers are not GPU-direct",
            range.addr,
            range.len
        );
        Ok(BufEntry {
            base: range.addr,
            len: range.len,
            kind: BufKind::Staged { device },
            mr,
            staging: Some(staging),
            dmabuf: None,
        })
    }

    fn register_dmabuf(
        &self,
        range: BufferRange,
    ) -> Result<(Arc<dyn crate::platform::Mr>, DmabufSource)> {
        let gpu = self.gpu.as_ref().ok_or(Error::NotSupported("no GPU"))?;
        let (fd, offset) = match gpu.gpu.export_dmabuf(range.addr, range.len) {
            None => return Err(Error::DmabufNotSupported),
            Some(Err(code)) => {
                return Err(Error::Hip {
                    call: gpu.gpu.call_name(GpuCall::ExportDmabuf),
                    code,
                })
            }
            Some(Ok(export)) => export,
        };
        let iova = u64::try_from(range.addr).map_err(|_| Error::InvalidValue("address"))?;
        let mr = self
            .pd
            .reg_dmabuf_mr(&fd, offset, range.len, iova, self.mr_access())?;
        // The MR holds its own reference to the dma-buf; the fd is kept
        // only where transfers register their own ranges.
        Ok((mr, DmabufSource { fd, offset, iova }))
    }

    /// `hipObjBufDeregister` after the NULL check. Ends the buffer's
    /// application-driven tokens first (their access is revoked, whatever
    /// their transfer was doing), as the original's deregistration does.
    pub fn deregister(&self, base: usize) -> Result<()> {
        // Nothing to end for an address that is not registered.
        self.buffers.find(base)?;
        let within = self.options.completion_timeout + DRIVER_GRACE;
        if !self.connections.end_tokens(base, within) {
            // The buffer's tokens may still give access: it stays.
            return Err(Error::Busy(
                "the buffer's tokens could not be ended yet: the connection driver did not \
                 answer in time",
            ));
        }
        self.tokens.forget(base);
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
        self.stats.staging_copy();
        match event.wait(Instant::now() + self.options.stage_timeout) {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.stats.abandoned_copy();
                slot.add(event, entry.clone());
                Err(Error::Staging {
                    what: "the copy did not finish within HIPOBJ_STAGE_TIMEOUT_MS",
                    hip: 0,
                })
            }
            Err(hip) => {
                self.stats.abandoned_copy();
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
                    call: gpu.gpu.call_name(GpuCall::Synchronize),
                    code,
                })
            }
            _ => Ok(()),
        }
    }

    // ------------------------------------------------------------ transfers

    /// `hipObjGet` / `hipObjPut` after the argument checks; counted in
    /// the instance's stats by outcome.
    pub fn transfer(
        &self,
        direction: Direction,
        slice: Slice,
        s3: &mut dyn S3Client,
    ) -> Result<()> {
        self.transfer_routed(direction, slice, s3).map(drop)
    }

    /// [`Instance::transfer`], saying how the bytes went.
    pub fn transfer_routed(
        &self,
        direction: Direction,
        slice: Slice,
        s3: &mut dyn S3Client,
    ) -> Result<Route> {
        self.transfer_cancellable(direction, slice, s3, None)
    }

    /// [`Instance::transfer_routed`], ended early by `cancel` (from any
    /// thread) if it is given and cancelled.
    pub fn transfer_cancellable(
        &self,
        direction: Direction,
        slice: Slice,
        s3: &mut dyn S3Client,
        cancel: Option<&Canceller>,
    ) -> Result<Route> {
        let len = slice.len;
        match self.transfer_uncounted(direction, slice, s3, cancel) {
            Ok(staged) => {
                self.stats.transferred(staged, len);
                Ok(if staged { Route::Staged } else { Route::Direct })
            }
            Err(e) => {
                self.stats.failed(&e);
                Err(e)
            }
        }
    }

    /// [`Instance::transfer`]; `Ok(true)` for a transfer through the
    /// staging buffer.
    fn transfer_uncounted(
        &self,
        direction: Direction,
        slice: Slice,
        s3: &mut dyn S3Client,
        cancel: Option<&Canceller>,
    ) -> Result<bool> {
        if cancel.is_some_and(Canceller::is_cancelled) {
            return Err(cancelled());
        }
        let entry = self.lookup(&slice)?;
        let staged = entry.staging.is_some();
        if direction == Direction::Put {
            self.stage(&entry, SyncDirection::ToHost, slice.offset, slice.len)?;
        }
        let mut lease = self.connections.acquire()?;
        let (token, grant) =
            self.prepare(lease.info(), &entry, slice.offset, slice.len, direction)?;
        // The driver reads this before the first event of the slot, which
        // only the server can cause: no need to wake it.
        let mailbox = arm(&mut lease, token, direction, grant, &entry, None, false)?;
        if let Some(cancel) = cancel {
            if !cancel.watch(&lease) {
                // Dropping the unsettled lease aborts it; its token went
                // nowhere.
                return Err(cancelled());
            }
        }
        let talk = self.converse(&token, s3);
        // The server sends its reply only after its final message, so the
        // outcome is usually in by now, or about to be: the driver may be
        // revoking the access. After a success, poll for it a while (while
        // such polls pay) before telling the driver and sleeping until it
        // answers.
        if talk.is_ok() {
            let window = self.polling.window();
            if !window.is_zero() {
                let found = mailbox.poll_until(Instant::now() + window);
                self.polling.found(found);
            }
        }
        let outcome = match mailbox.peek() {
            Some(outcome) => Some(outcome),
            None => {
                let deadline = Instant::now() + self.options.completion_timeout + DRIVER_GRACE;
                lease
                    .replied(talk.is_ok())
                    .ok()
                    .and_then(|()| {
                        let (outcome, slept) = mailbox.wait_noting(Some(deadline));
                        if slept && outcome.is_some() {
                            self.stats.woken();
                        }
                        outcome
                    })
                    .or_else(|| mailbox.peek())
            }
        };
        if let Some(cancel) = cancel {
            cancel.idle();
        }
        let outcome = match outcome {
            Some(outcome) => {
                lease.settle();
                outcome
            }
            // Dropping the unsettled lease aborts the transfer.
            None => Err(self
                .connections
                .pool()
                .death()
                .unwrap_or_else(|| late("the transfer"))),
        };
        drop(lease);
        // A server that failed a proved transfer may have failed because
        // this side did: its reply's status says what it saw, this side's
        // failure why.
        match (talk, outcome) {
            (Err(Error::S3(why)), Err(here)) if mailbox.proved() => {
                return Err(Error::S3(format!("{why} (on this side: {here})")))
            }
            (talk, outcome) => {
                talk?;
                outcome?;
            }
        }
        remember_peer(mailbox.peer());
        match direction {
            Direction::Get if staged => {
                self.stage(&entry, SyncDirection::ToDevice, slice.offset, slice.len)
            }
            Direction::Get => self.sync_device(&entry),
            Direction::Put => Ok(()),
        }
        .map(|()| staged)
    }

    /// Mints the token of a transfer of `len` bytes at `offset` of `entry`
    /// on the leased slot, and what its proof will grant: a window (a
    /// random key on the slot's window) over exactly the range, or, without
    /// windows, a registration of exactly the range in the slot's PD.
    fn prepare(
        &self,
        slot: &SlotInfo,
        entry: &Arc<BufEntry>,
        offset: u64,
        len: u64,
        direction: Direction,
    ) -> Result<(Token, Grant)> {
        // One draw for both: the token's secret and the window's key.
        let random = random_bytes()?;
        let secret = u32::from_le_bytes([random[0], random[1], random[2], random[3]]);
        let addr = entry.nic_addr(offset);
        let (rkey, grant) = match slot.window_rkey {
            Some(current) => (
                fresh_window_key(
                    current,
                    u32::from_le_bytes([random[4], random[5], random[6], random[7]]),
                ),
                Grant::Window {
                    mr: entry.mr.clone(),
                    addr,
                    len,
                },
            ),
            None => {
                let mr = entry.register_range(
                    &*slot.pd,
                    offset,
                    len,
                    Access::LOCAL_WRITE | direction.access(),
                )?;
                (mr.rkey(), Grant::Region { mr })
            }
        };
        let token = Token {
            transport: Transport::RcCm,
            qp_num: slot.qp_num,
            gid: self.gid,
            rkey,
            addr,
            length: len,
            port: 0,
            lid: self.listener_port,
            secret,
        };
        Ok((token, grant))
    }

    /// The S3 conversation: the token out, the reply back.
    fn converse(&self, token: &Token, s3: &mut dyn S3Client) -> Result<()> {
        let mut text = [0u8; TOKEN_HEX_LEN + 1];
        text[..TOKEN_HEX_LEN].copy_from_slice(&token.to_hex());
        s3.send_request(&text)
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
            return Err(Error::S3(format!("{DECLINED}{}", parsed.http_code)));
        }
        Ok(())
    }

    // ------------------------------------------------------------ application-driven

    /// `hipObjGetRdmaToken` after the argument checks: leases a slot for a
    /// transfer the application drives, and returns its token. The driver
    /// ends it by itself: at the server's final message (access revoked at
    /// once) or at `HIPOBJ_TOKEN_TIMEOUT_MS`; deregistering the buffer and
    /// shutdown end it too. When no connection is free, the oldest released
    /// token that no server has proved gives its connection up; when every
    /// connection holds a token that is not released, the mint fails with
    /// `Busy` at once; otherwise it waits for a transfer to end, at most
    /// `HIPOBJ_COMPLETION_TIMEOUT_MS`.
    pub fn mint_token(&self, slice: Slice, op: TokenOp) -> Result<Token> {
        let entry = self.lookup(&slice)?;
        let mut lease = match self.connections.try_acquire()? {
            Some(lease) => lease,
            None => self.lease_for_token()?,
        };
        lease.detach();
        let direction = Direction::from(op);
        let (token, grant) = self.prepare(lease.info(), &entry, 0, slice.len, direction)?;
        let deadline = Instant::now() + self.options.token_timeout;
        let info = lease.info().clone();
        let mailbox = arm(
            &mut lease,
            token,
            direction,
            grant,
            &entry,
            Some(deadline),
            true,
        )?;
        // The job is the driver's alone now.
        lease.settle();
        if direction == Direction::Get && entry.staging.is_some() {
            self.tokens
                .add(entry.base, (info.index, info.epoch), mailbox);
        }
        Ok(token)
    }

    /// A lease for a token when none was free: asks the driver to take
    /// back a released, unproved token's connection, then waits a bounded
    /// time for a free one.
    fn lease_for_token(&self) -> Result<Lease> {
        self.connections.reclaim(DRIVER_GRACE)?;
        self.connections
            .acquire_until(Instant::now() + self.options.completion_timeout)?
            .ok_or(Error::Busy(
                "no connection came free for a token within HIPOBJ_COMPLETION_TIMEOUT_MS",
            ))
    }

    /// `hipObjBufSync` after the argument checks. A buffer that is not
    /// staged needs nothing: the NIC wrote it (or will read it) directly,
    /// and a finished GET's access ended at its final message. Before a
    /// staged buffer's copy to the device, the application-driven GETs
    /// into it that a server has proved must have ended: each is awaited
    /// up to `HIPOBJ_COMPLETION_TIMEOUT_MS` (a sync never ends one; one
    /// still running fails the sync, which may be tried again), and a GET
    /// into it that failed since the last sync fails this one. Tokens no
    /// server has proved are not waited for: their request may not have
    /// been sent yet.
    pub fn buf_sync(&self, slice: Slice, direction: SyncDirection) -> Result<()> {
        let entry = self.lookup(&slice)?;
        if entry.staging.is_none() {
            return Ok(());
        }
        if direction == SyncDirection::ToDevice {
            let deadline = Instant::now() + self.options.completion_timeout;
            for mailbox in self.tokens.live(entry.base) {
                if mailbox.proved() && mailbox.wait(Some(deadline)).is_none() {
                    return Err(Error::Rdma(format!(
                        "an application-driven GET into this buffer is still running after {} ms \
                         (HIPOBJ_COMPLETION_TIMEOUT_MS); sync again once it has ended",
                        self.options.completion_timeout.as_millis()
                    )));
                }
            }
            if let Some(e) = self.tokens.take_failure(entry.base) {
                return Err(e);
            }
        }
        self.stage(&entry, direction, slice.offset, slice.len)
    }

    /// `hipObjPutRdmaToken` of a token of this instance: ends nothing (the
    /// original's clients release a token as soon as they have copied it
    /// into their request). The driver marks it released: while no server
    /// has proved it, a newer token may take its connection when none is
    /// free. Never waits for the driver.
    pub fn release_token(&self, token: &Token) {
        if token.transport != Transport::RcCm
            || token.gid != self.gid
            || token.lid != self.listener_port
        {
            return;
        }
        self.connections.released(token.qp_num, token.secret);
    }
}

/// Hands the job to the driver on `lease`'s slot; returns where its
/// outcome will be. A `detached` job (an application-driven token: no
/// thread waits on it) wakes the driver, which must watch its deadline;
/// a transfer's Arm is read before its server can cause any event.
fn arm(
    lease: &mut Lease,
    token: Token,
    direction: Direction,
    grant: Grant,
    entry: &Arc<BufEntry>,
    deadline: Option<Instant>,
    detached: bool,
) -> Result<Arc<Mailbox>> {
    let mailbox = Arc::new(Mailbox::new());
    lease.arm(
        Box::new(Armed {
            token,
            direction,
            grant,
            entry: entry.clone(),
            mailbox: mailbox.clone(),
            deadline,
            detached,
            released: false,
        }),
        detached,
    )?;
    Ok(mailbox)
}
