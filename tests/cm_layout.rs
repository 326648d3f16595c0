//! The generated librdmacm types (`src/platform/cm/sys.rs`, from rdma-core
//! 44.0) against the `<rdma/rdma_cma.h>` installed here: a C program prints
//! the size, alignment or offset of every struct and field the library
//! touches, and the value of every constant it uses, and each is compared
//! with Rust's view. A missing header (package librdmacm-dev) or compiler is
//! a failure.

mod common;

use hipobj::platform::cm::sys::*;

/// Every expression checked, with the value Rust has for it.
fn expected() -> Vec<(&'static str, i128)> {
    let mut all: Vec<(&'static str, i128)> = Vec::new();
    for pair in [
        layout!("struct" rdma_event_channel),
        layout!("struct" rdma_cm_id),
        layout!("struct" rdma_route),
        layout!("struct" rdma_cm_event),
        layout!("struct" rdma_conn_param),
        layout!("struct" rdma_ud_param),
    ] {
        all.extend(pair);
    }
    all.extend(offsets!(rdma_event_channel { fd }));
    all.extend(offsets!(rdma_cm_id {
        verbs,
        channel,
        context,
        qp,
        route,
        ps,
        port_num,
        event,
        send_cq_channel,
        send_cq,
        recv_cq_channel,
        recv_cq,
        srq,
        pd,
        qp_type,
    }));
    all.extend(offsets!(rdma_cm_event {
        id,
        listen_id,
        event,
        status,
        param,
        param.conn,
        param.ud,
    }));
    all.extend(offsets!(rdma_conn_param {
        private_data,
        private_data_len,
        responder_resources,
        initiator_depth,
        flow_control,
        retry_count,
        rnr_retry_count,
        srq,
        qp_num,
    }));
    all.extend(constants!(rdma_port_space { RDMA_PS_TCP }));
    all.extend(constants!(rdma_cm_event_type {
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
    }));
    all
}

#[test]
fn generated_cm_types_match_the_installed_header() {
    common::layout::check(
        "rdma/rdma_cma.h",
        "librdmacm-dev",
        "src/platform/cm/sys.rs (scripts/gen-cm-sys.sh)",
        &expected(),
    );
}
