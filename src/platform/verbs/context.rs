//! Owners of an open device, its protection domains, memory regions and
//! memory windows.
//!
//! # Threads
//!
//! Every owner here is `Send` and `Sync`. The raw pointers they hold are
//! only ever passed to libibverbs (or read for fields libibverbs set at
//! creation and never changes: keys, the ops table), and libibverbs with its
//! providers is thread-safe: any verb may be called from any thread, on the
//! same resource concurrently, with the library's and provider's own locks
//! ("libibverbs thread safe level", RDMAmojo, 2013-07-26, by one of the
//! library's maintainers; rdma-core keeps that contract). What the library
//! does not do is keep a destroyed object usable, and the owners make sure it
//! never has to: each pointer is destroyed once, in `Drop`, when no other
//! reference to the owner exists, and after every child (which holds an `Arc`
//! of its parent).

use std::any::Any;
use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;
use std::sync::{Arc, Weak};

use super::convert::{self, access_int, zeroed};
use super::cq::CompletionQueue;
use super::inline;
use super::loader::VerbsTable;
use super::qp::QueuePair;
use super::sys::{
    ibv_async_event, ibv_context, ibv_device_attr, ibv_device_cap_flags, ibv_gid, ibv_mr, ibv_mw,
    ibv_mw_type, ibv_pd, ibv_port_attr, ibv_qp_cap, ibv_qp_init_attr, ibv_qp_type,
};
use super::{check_rc, destroy_failed, null_error};
use crate::error::{Error, Result};
use crate::platform::{
    Access, AsyncEvent, AsyncKind, Context, Cq, DeviceLimits, Gid, Mr, Mw, Pd, PortAttr, Qp, QpCaps,
};

/// An open device (`struct ibv_context`), closed on drop.
pub struct DeviceContext {
    ctx: *mut ibv_context,
    name: String,
    vendor_id: u32,
    supports_mw: bool,
    limits: DeviceLimits,
    me: Weak<DeviceContext>,
    table: Arc<VerbsTable>,
}

// SAFETY: see the module docs: `ctx` is used only through thread-safe
// libibverbs calls and the read-only ops table, and closed once, in `Drop`.
unsafe impl Send for DeviceContext {}
// SAFETY: as for `Send`; `&DeviceContext` methods only call verbs.
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// Takes ownership of `ctx`, after `ibv_query_device` for the vendor id,
    /// the limits and memory-window support, and with its asynchronous
    /// event descriptor made non-blocking. A failure closes `ctx`.
    ///
    /// # Safety
    ///
    /// `ctx` was returned by `table`'s `ibv_open_device`, is open, and is
    /// closed by nothing else.
    pub(super) unsafe fn from_raw(
        table: Arc<VerbsTable>,
        ctx: *mut ibv_context,
        name: &str,
    ) -> Result<Arc<DeviceContext>> {
        let mut attr: ibv_device_attr = zeroed();
        // SAFETY: `ctx` is open (caller) and `attr` is a valid out-struct of
        // the type ibv_query_device fills.
        let rc = unsafe { (table.query_device)(ctx, &mut attr) };
        // SAFETY: `ctx` is open; `async_fd` is set at open and never changes.
        let async_fd = unsafe { (*ctx).async_fd };
        // ibv_get_async_event(3): the descriptor may be made non-blocking,
        // and then a read with no event fails with EAGAIN.
        let checked = check_rc(format_args!("ibv_query_device({name})"), rc).and_then(|()| {
            super::cq::set_nonblocking(async_fd).map_err(|e| {
                Error::Rdma(format!(
                    "fcntl(O_NONBLOCK) on the async event descriptor of {name} failed: {e}"
                ))
            })
        });
        if let Err(e) = checked {
            // SAFETY: `ctx` is open and owned here (caller); it is not used
            // again.
            let rc = unsafe { (table.close_device)(ctx) };
            if rc != 0 {
                destroy_failed(format_args!("ibv_close_device({name})"), rc);
            }
            return Err(e);
        }
        // SAFETY: `ctx` is open (caller).
        let has_alloc_mw = unsafe { inline::has_alloc_mw(ctx) };
        // verbs.h: a device that can bind type-2 windows says so in its
        // capability flags; max_mw alone counts type-1 windows too, and the
        // provider's alloc_mw entry may be libibverbs' stub.
        let type_2 = ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A
            | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B;
        let count = |v: c_int| u32::try_from(v).unwrap_or(0);
        let limits = DeviceLimits {
            max_qp: count(attr.max_qp),
            max_cq: count(attr.max_cq),
            max_cqe: count(attr.max_cqe),
            max_mr: count(attr.max_mr),
            max_mw: count(attr.max_mw),
            max_qp_wr: count(attr.max_qp_wr),
        };
        Ok(Arc::new_cyclic(|me| DeviceContext {
            ctx,
            name: name.to_owned(),
            vendor_id: attr.vendor_id,
            supports_mw: attr.max_mw > 0 && has_alloc_mw && attr.device_cap_flags & type_2 != 0,
            limits,
            me: me.clone(),
            table,
        }))
    }

    pub(crate) fn raw(&self) -> *mut ibv_context {
        self.ctx
    }

    pub(super) fn table(&self) -> &VerbsTable {
        &self.table
    }

    fn arc(&self) -> Result<Arc<DeviceContext>> {
        self.me
            .upgrade()
            .ok_or_else(|| Error::Internal("verbs context used while being closed".to_owned()))
    }
}

impl Context for DeviceContext {
    fn name(&self) -> &str {
        &self.name
    }

    fn vendor_id(&self) -> u32 {
        self.vendor_id
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr: ibv_port_attr = zeroed();
        // SAFETY: `self.ctx` is open while `self` lives. The exported
        // ibv_query_port fills the leading `_compat_ibv_port_attr` part of
        // the zeroed, larger `ibv_port_attr`, as verbs.h's own fallback does.
        let rc =
            unsafe { (self.table.query_port)(self.ctx, port, ptr::from_mut(&mut attr).cast()) };
        check_rc(
            format_args!("ibv_query_port({}, port {port})", self.name),
            rc,
        )?;
        convert::port_attr(&attr).map_err(|why| {
            Error::Rdma(format!("ibv_query_port({}, port {port}): {why}", self.name))
        })
    }

    fn query_gid(&self, port: u8, index: u16) -> Result<Gid> {
        let mut gid: ibv_gid = zeroed();
        // SAFETY: `self.ctx` is open; `gid` is a valid out-union.
        let rc = unsafe { (self.table.query_gid)(self.ctx, port, c_int::from(index), &mut gid) };
        check_rc(
            format_args!("ibv_query_gid({}, port {port}, index {index})", self.name),
            rc,
        )?;
        Ok(convert::gid_bytes(&gid))
    }

    fn alloc_pd(&self) -> Result<Arc<dyn Pd>> {
        let ctx = self.arc()?;
        // SAFETY: `self.ctx` is open.
        let pd = unsafe { (self.table.alloc_pd)(self.ctx) };
        if pd.is_null() {
            return Err(null_error(format_args!("ibv_alloc_pd({})", self.name)));
        }
        Ok(Arc::new_cyclic(|me| ProtectionDomain {
            pd,
            me: me.clone(),
            ctx,
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>> {
        Ok(Arc::new(CompletionQueue::create(self.arc()?, depth)?))
    }

    fn supports_dmabuf(&self) -> bool {
        self.table.reg_dmabuf_mr.is_some()
    }

    fn supports_mw(&self) -> bool {
        self.supports_mw
    }

    fn limits(&self) -> DeviceLimits {
        self.limits
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `async_fd` belongs to the open context, which outlives the
        // borrow (it is closed only in `Drop`).
        unsafe { BorrowedFd::borrow_raw((*self.ctx).async_fd) }
    }

    fn next_async_event(&self) -> Result<Option<AsyncEvent>> {
        let mut event: ibv_async_event = zeroed();
        // SAFETY: `self.ctx` is open and its descriptor non-blocking (set at
        // open), so this returns at once; `event` is a valid out-struct.
        let rc = unsafe { (self.table.get_async_event)(self.ctx, &mut event) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error::Rdma(format!(
                "ibv_get_async_event({}) failed: {err}",
                self.name
            )));
        }
        let kind = event.event_type;
        let qp_num = if AsyncKind::names_a_qp(kind) {
            // SAFETY: for QP events the element is the QP, which stays valid
            // until the event is acknowledged below (ibv_destroy_qp waits for
            // its events' acks); `qp_num` is set at creation.
            let qp = unsafe { event.element.qp };
            // SAFETY: as above: a live QP of this context.
            (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
        } else {
            None
        };
        // SAFETY: `event` was filled by ibv_get_async_event and is
        // acknowledged exactly once.
        unsafe { (self.table.ack_async_event)(&mut event) };
        Ok(Some(AsyncEvent {
            kind: AsyncKind::from_ibv(kind),
            qp_num,
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: `ctx` is open, and this is the last reference: every child
        // holds an `Arc` of this context, so all are already destroyed.
        let rc = unsafe { (self.table.close_device)(self.ctx) };
        if rc != 0 {
            destroy_failed(format_args!("ibv_close_device({})", self.name), rc);
        }
    }
}

/// A protection domain (`struct ibv_pd`), deallocated on drop.
pub struct ProtectionDomain {
    pd: *mut ibv_pd,
    me: Weak<ProtectionDomain>,
    ctx: Arc<DeviceContext>,
}

// SAFETY: see the module docs: `pd` is used only through thread-safe verbs
// and deallocated once, in `Drop`, after its children.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as for `Send`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub(crate) fn raw(&self) -> *mut ibv_pd {
        self.pd
    }

    pub(crate) fn context(&self) -> &DeviceContext {
        &self.ctx
    }

    pub(crate) fn arc(&self) -> Result<Arc<ProtectionDomain>> {
        self.me.upgrade().ok_or_else(|| {
            Error::Internal("protection domain used while being deallocated".to_owned())
        })
    }

    /// Owns the region `mr` that `call` returned, or reads errno for NULL.
    /// `pd` is this domain's `Arc`, taken before the call so that nothing
    /// can fail between a registration and its owner.
    fn region(
        pd: Arc<ProtectionDomain>,
        mr: *mut ibv_mr,
        call: std::fmt::Arguments<'_>,
        addr: u64,
        len: usize,
    ) -> Result<Arc<dyn Mr>> {
        if mr.is_null() {
            return Err(null_error(call));
        }
        // SAFETY: `mr` was just registered and is live; its keys are set by
        // the provider at registration and never change.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Arc::new(MemoryRegion {
            mr,
            lkey,
            rkey,
            addr,
            len,
            pd,
            keep: std::sync::Mutex::new(Vec::new()),
        }))
    }
}

impl Pd for ProtectionDomain {
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Arc<dyn Mr>> {
        let pd = self.arc()?;
        let table = self.ctx.table();
        // SAFETY: `self.pd` is live. ibv_reg_mr pins and maps the pages of
        // the range and never dereferences the pointer itself; an invalid
        // range fails with EFAULT. What the NIC may later write there is
        // bounded by `access` and decided by the caller.
        let mr = unsafe {
            (table.reg_mr)(
                self.pd,
                ptr::with_exposed_provenance_mut(addr),
                len,
                access_int(access),
            )
        };
        Self::region(
            pd,
            mr,
            format_args!("ibv_reg_mr({}, {addr:#x}+{len})", self.ctx.name),
            u64::try_from(addr).unwrap_or(u64::MAX),
            len,
        )
    }

    fn reg_dmabuf_mr(
        &self,
        dmabuf: &OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<dyn Mr>> {
        let pd = self.arc()?;
        let name = &self.ctx.name;
        let Some(reg_dmabuf_mr) = self.ctx.table().reg_dmabuf_mr else {
            return Err(Error::Rdma(format!(
                "ibv_reg_dmabuf_mr({name}) failed: Operation not supported (this libibverbs \
                 predates rdma-core 34)"
            )));
        };
        // SAFETY: `self.pd` is live and `dmabuf` is an open descriptor for
        // the call's duration; the kernel takes its own reference to the
        // dma-buf, so the fd may be closed afterwards (ibv_reg_dmabuf_mr(3)).
        let mr = unsafe {
            reg_dmabuf_mr(
                self.pd,
                offset,
                len,
                iova,
                dmabuf.as_raw_fd(),
                access_int(access),
            )
        };
        Self::region(
            pd,
            mr,
            format_args!("ibv_reg_dmabuf_mr({name}, offset {offset}, {len} bytes)"),
            iova,
            len,
        )
    }

    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps) -> Result<Arc<dyn Qp>> {
        let name = &self.ctx.name;
        let Some(ours) = cq
            .as_any()
            .downcast_ref::<CompletionQueue>()
            .filter(|c| c.context().raw() == self.ctx.raw())
        else {
            return Err(Error::Rdma(format!(
                "ibv_create_qp({name}) failed: Invalid argument (the CQ is not of this device)"
            )));
        };
        let pd = self.arc()?;
        let mut init: ibv_qp_init_attr = zeroed();
        init.send_cq = ours.raw();
        init.recv_cq = ours.raw();
        init.cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: 0,
        };
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: `self.pd` and the CQ (same context, checked above) are
        // live; `init` is a valid in/out struct (the provider writes the
        // actual capacities back).
        let qp = unsafe { (self.ctx.table().create_qp)(self.pd, &mut init) };
        if qp.is_null() {
            return Err(null_error(format_args!("ibv_create_qp({name}, {caps:?})")));
        }
        // SAFETY: `qp` was just created in this PD on `cq` and is owned by
        // nothing else.
        let qp = unsafe { QueuePair::from_raw(qp, pd, Arc::clone(cq)) };
        Ok(Arc::new(qp))
    }

    fn alloc_mw(&self) -> Result<Arc<dyn Mw>> {
        let pd = self.arc()?;
        // SAFETY: `self.pd` is live.
        let mw = unsafe { inline::alloc_mw(self.pd, ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = mw.map_err(|errno| {
            Error::Rdma(format!(
                "ibv_alloc_mw({}) failed: {}",
                self.ctx.name,
                std::io::Error::from_raw_os_error(errno)
            ))
        })?;
        // SAFETY: `mw` was just allocated and is live; its rkey is set at
        // allocation and changes only through binds, which report the new
        // one in the work request.
        let rkey = unsafe { mw.as_ref().rkey };
        Ok(Arc::new(MemoryWindow {
            mw: mw.as_ptr(),
            rkey,
            pd,
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: `pd` is live and this is its last reference; every region,
        // window and QP in it holds an `Arc` of it and is already destroyed.
        let rc = unsafe { (self.ctx.table().dealloc_pd)(self.pd) };
        if rc != 0 {
            destroy_failed(format_args!("ibv_dealloc_pd({})", self.ctx.name), rc);
        }
    }
}

/// A registered memory region (`struct ibv_mr`), deregistered on drop.
pub struct MemoryRegion {
    mr: *mut ibv_mr,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    pd: Arc<ProtectionDomain>,
    /// What [`Mr::keep_until_deregistered`] was given: dropped after a
    /// successful deregistration, leaked after a failed one.
    keep: std::sync::Mutex<Vec<Box<dyn Any + Send + Sync>>>,
}

// SAFETY: see the module docs: `mr` is passed only to thread-safe verbs (as
// a bind's region) and deregistered once, in `Drop`.
unsafe impl Send for MemoryRegion {}
// SAFETY: as for `Send`.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub(super) fn raw(&self) -> *mut ibv_mr {
        self.mr
    }

    pub(super) fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
}

impl Mr for MemoryRegion {
    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn addr(&self) -> u64 {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn keep_until_deregistered(&self, memory: Box<dyn Any + Send + Sync>) {
        self.keep
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(memory);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `mr` is live and this is its last reference. A region with
        // type-2 windows still bound fails (EINVAL on rxe, IBA 10.6.7.2.6);
        // it then stays valid, and those windows still reach its memory:
        // the core deallocates (or fences with their QP) every window bound
        // over a region before it drops the region, and what the region
        // keeps alive is leaked below rather than freed under the NIC.
        let rc = unsafe { (self.pd.ctx.table().dereg_mr)(self.mr) };
        let kept = std::mem::take(
            &mut *self
                .keep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if rc != 0 {
            std::mem::forget(kept);
            destroy_failed(
                format_args!(
                    "ibv_dereg_mr({}, {:#x}+{})",
                    self.pd.ctx.name, self.addr, self.len
                ),
                rc,
            );
        }
    }
}

/// A type-2 memory window (`struct ibv_mw`), deallocated on drop.
pub struct MemoryWindow {
    mw: *mut ibv_mw,
    rkey: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: see the module docs: `mw` is passed only to thread-safe verbs (a
// bind work request) and deallocated once, in `Drop`.
unsafe impl Send for MemoryWindow {}
// SAFETY: as for `Send`.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    pub(crate) fn raw(&self) -> *mut ibv_mw {
        self.mw
    }

    pub(super) fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
}

impl Mw for MemoryWindow {
    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: `mw` is live and this is its last reference.
        let rc = unsafe { inline::dealloc_mw(self.mw) };
        if rc != 0 {
            destroy_failed(format_args!("ibv_dealloc_mw({})", self.pd.ctx.name), rc);
        }
    }
}
