//! The librdmacm function table.
//!
//! Prototypes are those of rdma-core 44's `<rdma/rdma_cma.h>`, over the
//! generated [`sys`](super::sys) types, the verbs types of
//! [`verbs::sys`](crate::platform::verbs::sys) and libc's socket addresses.
//! Every function here returns 0 or a pointer on success, and -1 (or NULL)
//! with the reason in errno on failure (`rdma_cm(7)`, "RETURN CODES").

use std::ffi::{c_int, c_void};

use super::sys::{rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel, rdma_port_space};
use crate::error::{Error, Result};
use crate::platform::dl::{self, Loaded};
use crate::platform::verbs::sys::ibv_qp_attr;

/// Runtime sonames, preferred first.
pub const SONAMES: &[&str] = &["librdmacm.so.1", "librdmacm.so"];

type CreateEventChannel = unsafe extern "C" fn() -> *mut rdma_event_channel;
type DestroyEventChannel = unsafe extern "C" fn(channel: *mut rdma_event_channel);
type CreateId = unsafe extern "C" fn(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space::Type,
) -> c_int;
type DestroyId = unsafe extern "C" fn(id: *mut rdma_cm_id) -> c_int;
type BindAddr = unsafe extern "C" fn(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
type Listen = unsafe extern "C" fn(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
type GetCmEvent =
    unsafe extern "C" fn(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
type AckCmEvent = unsafe extern "C" fn(event: *mut rdma_cm_event) -> c_int;
type Accept = unsafe extern "C" fn(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
type Reject = unsafe extern "C" fn(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int;
type Disconnect = unsafe extern "C" fn(id: *mut rdma_cm_id) -> c_int;
type InitQpAttr = unsafe extern "C" fn(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int;
type ResolveAddr = unsafe extern "C" fn(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int;
type ResolveRoute = unsafe extern "C" fn(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
type Connect = unsafe extern "C" fn(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
type Establish = unsafe extern "C" fn(id: *mut rdma_cm_id) -> c_int;
/// Returns the port in network byte order (`__be16`).
type GetSrcPort = unsafe extern "C" fn(id: *mut rdma_cm_id) -> u16;

/// The functions of librdmacm this library calls, resolved at load. Shared
/// (by `Arc`) by every channel and id, so the library stays mapped while
/// any of them lives.
pub(super) struct CmTable {
    pub(super) create_event_channel: CreateEventChannel,
    pub(super) destroy_event_channel: DestroyEventChannel,
    pub(super) create_id: CreateId,
    pub(super) destroy_id: DestroyId,
    pub(super) bind_addr: BindAddr,
    pub(super) listen: Listen,
    pub(super) get_cm_event: GetCmEvent,
    pub(super) ack_cm_event: AckCmEvent,
    pub(super) accept: Accept,
    pub(super) reject: Reject,
    pub(super) disconnect: Disconnect,
    pub(super) init_qp_attr: InitQpAttr,
    pub(super) resolve_addr: ResolveAddr,
    pub(super) resolve_route: ResolveRoute,
    pub(super) connect: Connect,
    pub(super) get_src_port: GetSrcPort,
    pub(super) establish: Establish,
    // Keeps the library mapped; declared last so the pointers above never
    // outlive it.
    pub(super) loaded: Loaded,
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

impl CmTable {
    pub(super) fn open(sonames: &[&'static str]) -> Result<CmTable> {
        let loaded = dl::open_first(sonames)
            .map_err(|e| Error::Rdma(format!("cannot load librdmacm: {e}")))?;
        // SAFETY: each field's type alias above is the prototype rdma_cma.h
        // declares for the symbol named beside it, and `loaded` is moved into
        // the same table, which drops it after the pointers.
        unsafe {
            Ok(CmTable {
                create_event_channel: required(&loaded, b"rdma_create_event_channel\0")?,
                destroy_event_channel: required(&loaded, b"rdma_destroy_event_channel\0")?,
                create_id: required(&loaded, b"rdma_create_id\0")?,
                destroy_id: required(&loaded, b"rdma_destroy_id\0")?,
                bind_addr: required(&loaded, b"rdma_bind_addr\0")?,
                listen: required(&loaded, b"rdma_listen\0")?,
                get_cm_event: required(&loaded, b"rdma_get_cm_event\0")?,
                ack_cm_event: required(&loaded, b"rdma_ack_cm_event\0")?,
                accept: required(&loaded, b"rdma_accept\0")?,
                reject: required(&loaded, b"rdma_reject\0")?,
                disconnect: required(&loaded, b"rdma_disconnect\0")?,
                init_qp_attr: required(&loaded, b"rdma_init_qp_attr\0")?,
                resolve_addr: required(&loaded, b"rdma_resolve_addr\0")?,
                resolve_route: required(&loaded, b"rdma_resolve_route\0")?,
                connect: required(&loaded, b"rdma_connect\0")?,
                get_src_port: required(&loaded, b"rdma_get_src_port\0")?,
                establish: required(&loaded, b"rdma_establish\0")?,
                loaded,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::dl::stub::StubDir;

    /// Every symbol, in the order the table resolves them.
    const REQUIRED: [&str; 17] = [
        "rdma_create_event_channel",
        "rdma_destroy_event_channel",
        "rdma_create_id",
        "rdma_destroy_id",
        "rdma_bind_addr",
        "rdma_listen",
        "rdma_get_cm_event",
        "rdma_ack_cm_event",
        "rdma_accept",
        "rdma_reject",
        "rdma_disconnect",
        "rdma_init_qp_attr",
        "rdma_resolve_addr",
        "rdma_resolve_route",
        "rdma_connect",
        "rdma_get_src_port",
        "rdma_establish",
    ];

    #[test]
    fn a_missing_librdmacm_is_named_in_the_error() {
        let err = CmTable::open(&["libhipobj-test-no-such-rdmacm.so.1"])
            .err()
            .unwrap();
        assert_eq!(err.code(), crate::error::Code::Rdma);
        let text = err.to_string();
        assert!(text.contains("cannot load librdmacm"), "{text}");
        assert!(
            text.contains("libhipobj-test-no-such-rdmacm.so.1"),
            "{text}"
        );
    }

    #[test]
    fn every_librdmacm_symbol_is_checked_at_load() {
        let dir = StubDir::new("cm-missing");
        let all = dir.library("rdmacm-complete", &REQUIRED);
        assert!(CmTable::open(&[all]).is_ok());
        for missing in 0..REQUIRED.len() {
            let mut symbols = REQUIRED.to_vec();
            let gone = symbols.remove(missing);
            let lib = dir.library(&format!("rdmacm-without-{gone}"), &symbols);
            let err = CmTable::open(&[lib]).err().unwrap();
            assert_eq!(
                err,
                Error::Rdma(format!("{lib}: symbol {gone} not found")),
                "{err}"
            );
        }
    }

    #[test]
    fn the_installed_librdmacm_has_every_function() {
        // librdmacm1 (rdma-core 44) is installed by scripts/setup.sh.
        let table = CmTable::open(SONAMES).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(table.loaded.name, "librdmacm.so.1");
    }
}
