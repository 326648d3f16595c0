//! The generated libibverbs types (`src/platform/verbs/sys.rs`, from
//! rdma-core 44.0) against the `<infiniband/verbs.h>` installed here: a C
//! program prints the size or offset of every struct and field the library
//! touches, and the value of every constant it uses, and each is compared
//! with Rust's view. A missing header (package libibverbs-dev) or compiler
//! is a failure.

mod common;

use std::mem::offset_of;

use common::layout::wide;
use hipobj::platform::verbs::sys::*;

/// Every expression checked, with the value Rust has for it.
fn expected() -> Vec<(&'static str, i128)> {
    let mut all: Vec<(&'static str, i128)> = Vec::new();
    for pair in [
        layout!("struct" ibv_device),
        layout!("struct" ibv_context),
        layout!("struct" ibv_context_ops),
        layout!("struct" ibv_device_attr),
        layout!("struct" ibv_port_attr),
        layout!("union" ibv_gid),
        layout!("struct" ibv_pd),
        layout!("struct" ibv_mr),
        layout!("struct" ibv_mw),
        layout!("struct" ibv_cq),
        layout!("struct" ibv_comp_channel),
        layout!("struct" ibv_qp),
        layout!("struct" ibv_qp_init_attr),
        layout!("struct" ibv_qp_cap),
        layout!("struct" ibv_qp_attr),
        layout!("struct" ibv_ah_attr),
        layout!("struct" ibv_global_route),
        layout!("struct" ibv_sge),
        layout!("struct" ibv_send_wr),
        layout!("struct" ibv_recv_wr),
        layout!("struct" ibv_mw_bind_info),
        layout!("struct" ibv_mw_bind),
        layout!("struct" ibv_wc),
        layout!("struct" ibv_srq),
        layout!("struct" ibv_ah),
    ] {
        all.extend(pair);
    }
    all.extend(offsets!(ibv_context {
        device,
        ops,
        cmd_fd,
        async_fd,
        num_comp_vectors,
        mutex,
        abi_compat,
        ops.alloc_mw,
        ops.bind_mw,
        ops.dealloc_mw,
        ops.poll_cq,
        ops.req_notify_cq,
        ops.post_send,
        ops.post_recv,
    }));
    all.extend(offsets!(ibv_device_attr {
        fw_ver,
        vendor_id,
        vendor_part_id,
        max_qp_wr,
        max_mw,
        max_pkeys,
        phys_port_cnt,
    }));
    all.extend(offsets!(ibv_port_attr {
        state,
        max_mtu,
        active_mtu,
        gid_tbl_len,
        pkey_tbl_len,
        lid,
        link_layer,
        flags,
        port_cap_flags2,
    }));
    all.extend(offsets!(ibv_pd { context, handle }));
    all.extend(offsets!(ibv_mr {
        context,
        pd,
        addr,
        length,
        handle,
        lkey,
        rkey
    }));
    all.push((
        "offsetof(struct ibv_mw, type)",
        wide(offset_of!(ibv_mw, type_)),
    ));
    all.extend(offsets!(ibv_mw {
        context,
        pd,
        rkey,
        handle
    }));
    all.extend(offsets!(ibv_comp_channel {
        context,
        fd,
        refcnt
    }));
    all.extend(offsets!(ibv_cq {
        context,
        channel,
        cq_context,
        handle,
        cqe,
        mutex,
        cond,
        comp_events_completed,
        async_events_completed,
    }));
    all.extend(offsets!(ibv_qp {
        context,
        qp_context,
        pd,
        send_cq,
        recv_cq,
        srq,
        handle,
        qp_num,
        state,
        qp_type,
        mutex,
        cond,
        events_completed,
    }));
    all.extend(offsets!(ibv_qp_cap {
        max_send_wr,
        max_recv_wr,
        max_send_sge,
        max_recv_sge,
        max_inline_data,
    }));
    all.extend(offsets!(ibv_qp_init_attr {
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type,
        sq_sig_all,
    }));
    all.extend(offsets!(ibv_global_route {
        dgid,
        flow_label,
        sgid_index,
        hop_limit,
        traffic_class,
    }));
    all.extend(offsets!(ibv_ah_attr {
        grh,
        dlid,
        sl,
        src_path_bits,
        static_rate,
        is_global,
        port_num,
    }));
    all.extend(offsets!(ibv_qp_attr {
        qp_state,
        cur_qp_state,
        path_mtu,
        path_mig_state,
        qkey,
        rq_psn,
        sq_psn,
        dest_qp_num,
        qp_access_flags,
        cap,
        ah_attr,
        alt_ah_attr,
        pkey_index,
        alt_pkey_index,
        en_sqd_async_notify,
        sq_draining,
        max_rd_atomic,
        max_dest_rd_atomic,
        min_rnr_timer,
        port_num,
        timeout,
        retry_cnt,
        rnr_retry,
        alt_port_num,
        alt_timeout,
        rate_limit,
    }));
    all.extend(offsets!(ibv_sge { addr, length, lkey }));
    all.extend(offsets!(ibv_send_wr {
        wr_id,
        next,
        sg_list,
        num_sge,
        opcode,
        send_flags,
        wr,
        wr.rdma.remote_addr,
        wr.rdma.rkey,
        qp_type,
    }));
    // The anonymous unions: bindgen names them, C does not.
    all.extend([
        (
            "offsetof(struct ibv_send_wr, imm_data)",
            wide(offset_of!(ibv_send_wr, __bindgen_anon_1.imm_data)),
        ),
        (
            "offsetof(struct ibv_send_wr, invalidate_rkey)",
            wide(offset_of!(ibv_send_wr, __bindgen_anon_1.invalidate_rkey)),
        ),
        (
            "offsetof(struct ibv_send_wr, bind_mw.mw)",
            wide(offset_of!(ibv_send_wr, __bindgen_anon_2.bind_mw.mw)),
        ),
        (
            "offsetof(struct ibv_send_wr, bind_mw.rkey)",
            wide(offset_of!(ibv_send_wr, __bindgen_anon_2.bind_mw.rkey)),
        ),
        (
            "offsetof(struct ibv_send_wr, bind_mw.bind_info)",
            wide(offset_of!(ibv_send_wr, __bindgen_anon_2.bind_mw.bind_info)),
        ),
        (
            "offsetof(struct ibv_wc, imm_data)",
            wide(offset_of!(ibv_wc, __bindgen_anon_1.imm_data)),
        ),
    ]);
    all.extend(offsets!(ibv_mw_bind_info {
        mr,
        addr,
        length,
        mw_access_flags,
    }));
    all.extend(offsets!(ibv_recv_wr {
        wr_id,
        next,
        sg_list,
        num_sge
    }));
    all.extend(offsets!(ibv_wc {
        wr_id,
        status,
        opcode,
        vendor_err,
        byte_len,
        qp_num,
        src_qp,
        wc_flags,
        pkey_index,
        slid,
        sl,
        dlid_path_bits,
    }));

    all.extend(constants!(ibv_qp_state {
        IBV_QPS_RESET,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_SQD,
        IBV_QPS_SQE,
        IBV_QPS_ERR,
        IBV_QPS_UNKNOWN,
    }));
    all.extend(constants!(ibv_mtu {
        IBV_MTU_256,
        IBV_MTU_512,
        IBV_MTU_1024,
        IBV_MTU_2048,
        IBV_MTU_4096,
    }));
    all.extend(constants!(ibv_port_state {
        IBV_PORT_DOWN,
        IBV_PORT_ACTIVE
    }));
    all.extend([
        (
            "IBV_LINK_LAYER_UNSPECIFIED",
            i128::from(IBV_LINK_LAYER_UNSPECIFIED),
        ),
        (
            "IBV_LINK_LAYER_INFINIBAND",
            i128::from(IBV_LINK_LAYER_INFINIBAND),
        ),
        (
            "IBV_LINK_LAYER_ETHERNET",
            i128::from(IBV_LINK_LAYER_ETHERNET),
        ),
    ]);
    all.extend(constants!(ibv_qp_type { IBV_QPT_RC }));
    all.extend(constants!(ibv_mw_type {
        IBV_MW_TYPE_1,
        IBV_MW_TYPE_2
    }));
    all.extend(constants!(ibv_wr_opcode {
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
    }));
    all.extend(constants!(ibv_send_flags { IBV_SEND_SIGNALED }));
    all.extend(constants!(ibv_wc_flags { IBV_WC_WITH_IMM }));
    all.extend(constants!(ibv_wc_status {
        IBV_WC_SUCCESS,
        IBV_WC_LOC_LEN_ERR,
        IBV_WC_LOC_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR,
        IBV_WC_MW_BIND_ERR,
        IBV_WC_REM_INV_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR,
        IBV_WC_RETRY_EXC_ERR,
        IBV_WC_RNR_RETRY_EXC_ERR,
    }));
    all.extend(constants!(ibv_wc_opcode {
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_BIND_MW,
        IBV_WC_LOCAL_INV,
        IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM,
    }));
    all.extend(constants!(ibv_access_flags {
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_MW_BIND,
    }));
    all.extend(constants!(ibv_qp_attr_mask {
        IBV_QP_STATE,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_DEST_QPN,
    }));
    all
}

#[test]
fn generated_verbs_types_match_the_installed_header() {
    common::layout::check(
        "infiniband/verbs.h",
        "libibverbs-dev",
        "src/platform/verbs/sys.rs (scripts/gen-verbs-sys.sh)",
        &expected(),
    );
}
