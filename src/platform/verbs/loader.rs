//! The libibverbs function table, and device lookup.
//!
//! Prototypes are those of rdma-core 44's `<infiniband/verbs.h>`, over the
//! generated [`sys`](super::sys) types. Where the header wraps an exported
//! function in a macro or an inline, the exported symbol is used directly:
//!
//! - `ibv_reg_mr` is a macro choosing between the exported `ibv_reg_mr` and
//!   `ibv_reg_mr_iova2`; with access flags outside the optional range (ours
//!   always are) it calls `ibv_reg_mr`.
//! - `ibv_query_port` is a macro over an inline that calls the provider's
//!   extended `query_port` when the context has one, else the exported
//!   `ibv_query_port` (default version `IBVERBS_1.1`, the one `dlsym`
//!   returns), which fills the leading `struct _compat_ibv_port_attr` part
//!   of a zeroed `struct ibv_port_attr` — every field this library reads.
//! - `ibv_get_device_list` is a macro only for static providers
//!   (`RDMA_STATIC_PROVIDERS`), not in a shared build.
//!
//! The header's `static inline` verbs are in `inline.rs`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use super::context::DeviceContext;
use super::sys::{
    _compat_ibv_port_attr, ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_device,
    ibv_device_attr, ibv_gid, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
};
use crate::error::{Error, Result};
use crate::platform::dl::{self, Loaded};
use crate::platform::{Context, Verbs};

/// Runtime sonames, preferred first.
pub const SONAMES: &[&str] = &["libibverbs.so.1", "libibverbs.so"];

type GetDeviceList = unsafe extern "C" fn(num_devices: *mut c_int) -> *mut *mut ibv_device;
type FreeDeviceList = unsafe extern "C" fn(list: *mut *mut ibv_device);
type GetDeviceName = unsafe extern "C" fn(device: *mut ibv_device) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(device: *mut ibv_device) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(context: *mut ibv_context) -> c_int;
type QueryDevice =
    unsafe extern "C" fn(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
type QueryPort = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut _compat_ibv_port_attr,
) -> c_int;
type QueryGid = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int;
type AllocPd = unsafe extern "C" fn(context: *mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr;
type RegDmabufMr = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(mr: *mut ibv_mr) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(context: *mut ibv_context) -> *mut ibv_comp_channel;
type DestroyCompChannel = unsafe extern "C" fn(channel: *mut ibv_comp_channel) -> c_int;
type CreateCq = unsafe extern "C" fn(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int;
type GetCqEvent = unsafe extern "C" fn(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int;
type AckCqEvents = unsafe extern "C" fn(cq: *mut ibv_cq, nevents: c_uint);
type GetAsyncEvent =
    unsafe extern "C" fn(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int;
type AckAsyncEvent = unsafe extern "C" fn(event: *mut ibv_async_event);
type CreateQp =
    unsafe extern "C" fn(pd: *mut ibv_pd, init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
type DestroyQp = unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int;
type ModifyQp =
    unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
type QueryQp = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int;

/// The functions of libibverbs this library calls, resolved at load. Shared
/// (by `Arc`) by every object opened through it, so the library stays mapped
/// while any of them lives.
pub(super) struct VerbsTable {
    pub(super) get_device_list: GetDeviceList,
    pub(super) free_device_list: FreeDeviceList,
    pub(super) get_device_name: GetDeviceName,
    pub(super) open_device: OpenDevice,
    pub(super) close_device: CloseDevice,
    pub(super) query_device: QueryDevice,
    pub(super) query_port: QueryPort,
    pub(super) query_gid: QueryGid,
    pub(super) alloc_pd: AllocPd,
    pub(super) dealloc_pd: DeallocPd,
    pub(super) reg_mr: RegMr,
    pub(super) dereg_mr: DeregMr,
    pub(super) create_comp_channel: CreateCompChannel,
    pub(super) destroy_comp_channel: DestroyCompChannel,
    pub(super) create_cq: CreateCq,
    pub(super) destroy_cq: DestroyCq,
    pub(super) get_cq_event: GetCqEvent,
    pub(super) ack_cq_events: AckCqEvents,
    pub(super) create_qp: CreateQp,
    pub(super) destroy_qp: DestroyQp,
    pub(super) modify_qp: ModifyQp,
    pub(super) query_qp: QueryQp,
    pub(super) get_async_event: GetAsyncEvent,
    pub(super) ack_async_event: AckAsyncEvent,
    /// rdma-core 34 and later (`IBVERBS_1.12`).
    pub(super) reg_dmabuf_mr: Option<RegDmabufMr>,
    // Keeps the library mapped; declared last so the pointers above never
    // outlive it.
    loaded: Loaded,
}

/// A required symbol, or `Error::Rdma` naming the library and the symbol.
///
/// # Safety
///
/// As [`dl::symbol`]: `T` is the symbol's C type, and the value is not used
/// after `loaded` is dropped.
unsafe fn required<T: Copy>(loaded: &Loaded, name: &'static [u8]) -> Result<T> {
    // SAFETY: forwarded from the caller.
    unsafe { dl::symbol(loaded, name) }.map_err(Error::Rdma)
}

impl VerbsTable {
    fn open(sonames: &[&'static str]) -> Result<VerbsTable> {
        let loaded = dl::open_first(sonames)
            .map_err(|e| Error::Rdma(format!("cannot load libibverbs: {e}")))?;
        // SAFETY: each field's type alias above is the prototype verbs.h
        // declares for the symbol named beside it, and `loaded` is moved into
        // the same table, which drops it after the pointers.
        unsafe {
            Ok(VerbsTable {
                get_device_list: required(&loaded, b"ibv_get_device_list\0")?,
                free_device_list: required(&loaded, b"ibv_free_device_list\0")?,
                get_device_name: required(&loaded, b"ibv_get_device_name\0")?,
                open_device: required(&loaded, b"ibv_open_device\0")?,
                close_device: required(&loaded, b"ibv_close_device\0")?,
                query_device: required(&loaded, b"ibv_query_device\0")?,
                query_port: required(&loaded, b"ibv_query_port\0")?,
                query_gid: required(&loaded, b"ibv_query_gid\0")?,
                alloc_pd: required(&loaded, b"ibv_alloc_pd\0")?,
                dealloc_pd: required(&loaded, b"ibv_dealloc_pd\0")?,
                reg_mr: required(&loaded, b"ibv_reg_mr\0")?,
                dereg_mr: required(&loaded, b"ibv_dereg_mr\0")?,
                create_comp_channel: required(&loaded, b"ibv_create_comp_channel\0")?,
                destroy_comp_channel: required(&loaded, b"ibv_destroy_comp_channel\0")?,
                create_cq: required(&loaded, b"ibv_create_cq\0")?,
                destroy_cq: required(&loaded, b"ibv_destroy_cq\0")?,
                get_cq_event: required(&loaded, b"ibv_get_cq_event\0")?,
                ack_cq_events: required(&loaded, b"ibv_ack_cq_events\0")?,
                create_qp: required(&loaded, b"ibv_create_qp\0")?,
                destroy_qp: required(&loaded, b"ibv_destroy_qp\0")?,
                modify_qp: required(&loaded, b"ibv_modify_qp\0")?,
                query_qp: required(&loaded, b"ibv_query_qp\0")?,
                get_async_event: required(&loaded, b"ibv_get_async_event\0")?,
                ack_async_event: required(&loaded, b"ibv_ack_async_event\0")?,
                reg_dmabuf_mr: dl::symbol(&loaded, b"ibv_reg_dmabuf_mr\0").ok(),
                loaded,
            })
        }
    }

    /// Calls `f` with the current device list (`ibv_get_device_list`), and
    /// frees the list after. No kernel support (`ENOSYS`) is an empty list.
    fn with_devices<T>(&self, f: impl FnOnce(&[*mut ibv_device]) -> T) -> Result<T> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer; the array is released
        // below with ibv_free_device_list, as verbs.h requires.
        let list = unsafe { (self.get_device_list)(&mut count) };
        if list.is_null() {
            let err = std::io::Error::last_os_error();
            // ENOSYS: the kernel has no verbs support at all, which for the
            // caller means there is no device (ibv_get_device_list(3)).
            if err.raw_os_error() == Some(libc::ENOSYS) {
                return Ok(f(&[]));
            }
            return Err(Error::Rdma(format!("ibv_get_device_list failed: {err}")));
        }
        let count = usize::try_from(count).unwrap_or(0);
        // SAFETY: the list holds `count` valid device pointers (then a NULL)
        // and stays alive until ibv_free_device_list below; `f` cannot keep
        // the slice.
        let devices = unsafe { std::slice::from_raw_parts(list, count) };
        let result = f(devices);
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (self.free_device_list)(list) };
        Ok(result)
    }

    /// The name of a device of a live list.
    fn device_name(&self, device: *mut ibv_device) -> Option<String> {
        // SAFETY: `device` comes from a list that is still alive (only
        // `with_devices` hands them out); the name lives inside it.
        let name = unsafe { (self.get_device_name)(device) };
        if name.is_null() {
            return None;
        }
        // SAFETY: a non-NULL name is a NUL-terminated string in the device
        // structure, copied out here while the list is alive.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// libibverbs, loaded, with the functions this library calls.
pub struct LoadedVerbs {
    table: Arc<VerbsTable>,
}

impl LoadedVerbs {
    /// Opens the first of `sonames` and resolves every required symbol
    /// (`ibv_reg_dmabuf_mr` is optional). The error names the library or
    /// the symbol that was missing.
    pub fn open(sonames: &[&'static str]) -> Result<LoadedVerbs> {
        Ok(LoadedVerbs {
            table: Arc::new(VerbsTable::open(sonames)?),
        })
    }

    /// The soname the library was found under.
    pub fn soname(&self) -> &'static str {
        self.table.loaded.name
    }

    /// Whether this libibverbs exports `ibv_reg_dmabuf_mr`.
    pub fn has_reg_dmabuf_mr(&self) -> bool {
        self.table.reg_dmabuf_mr.is_some()
    }
}

impl Verbs for LoadedVerbs {
    fn device_names(&self) -> Result<Vec<String>> {
        self.table.with_devices(|devices| {
            devices
                .iter()
                .filter_map(|&d| self.table.device_name(d))
                .collect()
        })
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
        // ibv_free_device_list(3): devices must be opened before the list
        // is freed, so the open happens inside.
        let opened = self.table.with_devices(|devices| {
            let device = devices
                .iter()
                .copied()
                .find(|&d| self.table.device_name(d).as_deref() == Some(name))?;
            // SAFETY: `device` is in the live list.
            let ctx = unsafe { (self.table.open_device)(device) };
            Some(if ctx.is_null() {
                Err(super::null_error(format_args!("ibv_open_device({name})")))
            } else {
                Ok(ctx)
            })
        })?;
        let Some(ctx) = opened else {
            return Err(Error::Rdma(format!(
                "ibv_open_device({name}) failed: No such device"
            )));
        };
        // SAFETY: `ctx` was just opened by ibv_open_device of this table and
        // is handed over to the owner, which closes it exactly once.
        let owner = unsafe { DeviceContext::from_raw(Arc::clone(&self.table), ctx?, name) }?;
        Ok(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::dl::stub::StubDir;

    /// Every required symbol, in the order the table resolves them.
    const REQUIRED: [&str; 24] = [
        "ibv_get_device_list",
        "ibv_free_device_list",
        "ibv_get_device_name",
        "ibv_open_device",
        "ibv_close_device",
        "ibv_query_device",
        "ibv_query_port",
        "ibv_query_gid",
        "ibv_alloc_pd",
        "ibv_dealloc_pd",
        "ibv_reg_mr",
        "ibv_dereg_mr",
        "ibv_create_comp_channel",
        "ibv_destroy_comp_channel",
        "ibv_create_cq",
        "ibv_destroy_cq",
        "ibv_get_cq_event",
        "ibv_ack_cq_events",
        "ibv_create_qp",
        "ibv_destroy_qp",
        "ibv_modify_qp",
        "ibv_query_qp",
        "ibv_get_async_event",
        "ibv_ack_async_event",
    ];

    #[test]
    fn a_missing_library_is_named_in_the_error() {
        let err = LoadedVerbs::open(&["libhipobj-test-no-such-verbs.so.1"])
            .err()
            .unwrap();
        assert_eq!(err.code(), crate::error::Code::Rdma);
        assert!(
            err.to_string()
                .contains("libhipobj-test-no-such-verbs.so.1"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_symbol_is_named_in_the_error() {
        // libc loads everywhere and has none of the verbs.
        let err = LoadedVerbs::open(&["libc.so.6"]).err().unwrap();
        assert!(
            err.to_string()
                .contains("libc.so.6: symbol ibv_get_device_list not found"),
            "{err}"
        );
    }

    #[test]
    fn every_required_symbol_is_checked_at_load() {
        let dir = StubDir::new("verbs-missing");
        for missing in 0..REQUIRED.len() {
            let mut symbols = REQUIRED.to_vec();
            let gone = symbols.remove(missing);
            let lib = dir.library(&format!("without-{gone}"), &symbols);
            let err = LoadedVerbs::open(&[lib]).err().unwrap();
            assert_eq!(
                err,
                Error::Rdma(format!("{lib}: symbol {gone} not found")),
                "{err}"
            );
        }
    }

    #[test]
    fn ibv_reg_dmabuf_mr_is_optional() {
        let dir = StubDir::new("verbs-optional");
        let without = dir.library("required-only", &REQUIRED);
        let verbs = LoadedVerbs::open(&[without]).unwrap();
        assert!(!verbs.has_reg_dmabuf_mr());
        let mut all = REQUIRED.to_vec();
        all.push("ibv_reg_dmabuf_mr");
        let with = dir.library("with-dmabuf", &all);
        assert!(LoadedVerbs::open(&[with]).unwrap().has_reg_dmabuf_mr());
    }

    #[test]
    fn the_installed_libibverbs_has_every_function() {
        // libibverbs1 (rdma-core 44) is installed by scripts/setup.sh.
        let verbs = LoadedVerbs::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(verbs.soname(), "libibverbs.so.1");
        assert!(
            verbs.has_reg_dmabuf_mr(),
            "rdma-core 34 and later export ibv_reg_dmabuf_mr"
        );
    }

    #[test]
    fn device_names_are_the_devices_sysfs_lists() {
        let verbs = LoadedVerbs::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        let mut names = verbs.device_names().unwrap();
        names.sort();
        // Here: none (no RDMA device, no /sys/class/infiniband). On the
        // Soft-RoCE lane: rxe0.
        let mut sysfs: Vec<String> = match std::fs::read_dir("/sys/class/infiniband") {
            Ok(dir) => dir
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("reading /sys/class/infiniband: {e}"),
        };
        sysfs.sort();
        assert_eq!(names, sysfs);
    }

    #[test]
    fn opening_an_unknown_device_is_a_clean_error() {
        let verbs = LoadedVerbs::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        let err = verbs.open("hipobj-no-such-device").err().unwrap();
        assert_eq!(
            err,
            Error::Rdma("ibv_open_device(hipobj-no-such-device) failed: No such device".to_owned())
        );
    }
}
