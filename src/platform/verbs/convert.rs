//! Domain types (`platform::types`) to and from libibverbs' structs: plain
//! tables, no calls. The few `unsafe` blocks read members of C unions whose
//! members are all plain integers or bytes.

use std::ffi::c_int;
use std::ptr;
use std::sync::Arc;

use super::sys::{
    ibv_ah_attr, ibv_async_event, ibv_device_attr, ibv_gid, ibv_global_route, ibv_mr, ibv_mw,
    ibv_port_attr, ibv_port_state, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state,
    ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_send_wr__bindgen_ty_2__bindgen_ty_1,
    ibv_send_wr__bindgen_ty_4__bindgen_ty_1, ibv_sge, ibv_wc, ibv_wc_flags, ibv_wc_opcode,
    ibv_wr_opcode, IBV_LINK_LAYER_ETHERNET,
};
use crate::platform::types::mask;
use crate::platform::{
    Access, AddressVector, Completion, LinkLayer, Mr, Mtu, Mw, PortAttr, PortState, QpAttr,
    QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

/// C structs for which all-zero bytes are a valid value.
///
/// # Safety
///
/// Every field of an implementor, recursively, must be an integer, a raw
/// pointer (zero is NULL), an `Option` of a function pointer (zero is
/// `None`), or an array or union of such: never a reference or a `NonNull`.
pub(super) unsafe trait Zeroed: Sized {
    /// The all-zero value, as C's `memset(&x, 0, sizeof x)` or `= {0}`.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract: zero bytes are a valid `Self`.
        unsafe { std::mem::zeroed() }
    }
}

// SAFETY (all below): generated from verbs.h by bindgen; their fields are
// integers, raw pointers, unions of those and byte arrays (see sys.rs).
// SAFETY: see above.
unsafe impl Zeroed for ibv_qp_attr {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_qp_init_attr {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_port_attr {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_device_attr {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_send_wr {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_recv_wr {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_wc {}
// SAFETY: see above.
unsafe impl Zeroed for ibv_gid {}
// SAFETY: see above (its element union holds pointers and an int; all-zero
// is the NULL pointer).
unsafe impl Zeroed for ibv_async_event {}

/// The zero value of `T`.
pub(super) fn zeroed<T: Zeroed>() -> T {
    T::zeroed()
}

/// The bytes of a GID.
pub(super) fn gid_bytes(gid: &ibv_gid) -> [u8; 16] {
    // SAFETY: both members of `union ibv_gid` are 16 bytes of plain
    // integers, so any bit pattern is a valid `raw`.
    unsafe { gid.raw }
}

/// Flag bits as the `int` a verb takes: C's `(int)flags`, the same bits.
pub(super) fn flags_int(bits: u32) -> c_int {
    c_int::from_ne_bytes(bits.to_ne_bytes())
}

/// `enum ibv_access_flags` of `access`, as the `int` the verbs take.
pub(super) fn access_int(access: Access) -> c_int {
    flags_int(access.bits())
}

// ---------------------------------------------------------------- QP state

/// `enum ibv_qp_state` of `state`.
pub(crate) fn qp_state_to_ibv(state: QpState) -> ibv_qp_state::Type {
    match state {
        QpState::Reset => ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
        QpState::Sqd => ibv_qp_state::IBV_QPS_SQD,
        QpState::Sqe => ibv_qp_state::IBV_QPS_SQE,
        QpState::Err => ibv_qp_state::IBV_QPS_ERR,
    }
}

/// The state of an `enum ibv_qp_state` value (`None` for
/// `IBV_QPS_UNKNOWN` and anything else).
pub(super) fn qp_state_from_ibv(value: ibv_qp_state::Type) -> Option<QpState> {
    [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ]
    .into_iter()
    .find(|s| qp_state_to_ibv(*s) == value)
}

/// `RESET`, `INIT`...: the state as the IB spec and verbs.h name it.
pub(crate) fn state_name(state: Option<QpState>) -> &'static str {
    match state {
        Some(QpState::Reset) => "RESET",
        Some(QpState::Init) => "INIT",
        Some(QpState::Rtr) => "RTR",
        Some(QpState::Rts) => "RTS",
        Some(QpState::Sqd) => "SQD",
        Some(QpState::Sqe) => "SQE",
        Some(QpState::Err) => "ERR",
        None => "?",
    }
}

/// The attribute-mask bits `QpAttr` can set, with their `IBV_QP_*` names.
const MASK_BITS: [(u32, &str); 15] = [
    (ibv_qp_attr_mask::IBV_QP_STATE, "STATE"),
    (ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS, "ACCESS_FLAGS"),
    (ibv_qp_attr_mask::IBV_QP_PKEY_INDEX, "PKEY_INDEX"),
    (ibv_qp_attr_mask::IBV_QP_PORT, "PORT"),
    (ibv_qp_attr_mask::IBV_QP_AV, "AV"),
    (ibv_qp_attr_mask::IBV_QP_PATH_MTU, "PATH_MTU"),
    (ibv_qp_attr_mask::IBV_QP_TIMEOUT, "TIMEOUT"),
    (ibv_qp_attr_mask::IBV_QP_RETRY_CNT, "RETRY_CNT"),
    (ibv_qp_attr_mask::IBV_QP_RNR_RETRY, "RNR_RETRY"),
    (ibv_qp_attr_mask::IBV_QP_RQ_PSN, "RQ_PSN"),
    (
        ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
        "MAX_QP_RD_ATOMIC",
    ),
    (ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER, "MIN_RNR_TIMER"),
    (ibv_qp_attr_mask::IBV_QP_SQ_PSN, "SQ_PSN"),
    (
        ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
        "MAX_DEST_RD_ATOMIC",
    ),
    (ibv_qp_attr_mask::IBV_QP_DEST_QPN, "DEST_QPN"),
];

/// `0x1a1 = STATE|AV|...`: a mask with the names of its bits, for messages.
pub(super) fn describe_mask(bits: u32) -> String {
    let mut names: Vec<String> = MASK_BITS
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| (*name).to_owned())
        .collect();
    let unnamed = MASK_BITS.iter().fold(bits, |rest, (bit, _)| rest & !bit);
    if unnamed != 0 {
        names.push(format!("{unnamed:#x}"));
    }
    if names.is_empty() {
        names.push("none".to_owned());
    }
    format!("{bits:#x} = {}", names.join("|"))
}

// ---------------------------------------------------------------- QP attributes

fn global_route(av: &AddressVector) -> ibv_global_route {
    ibv_global_route {
        dgid: ibv_gid { raw: av.dgid },
        flow_label: av.flow_label,
        sgid_index: av.sgid_index,
        hop_limit: av.hop_limit,
        traffic_class: av.traffic_class,
    }
}

fn ah_attr(av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: global_route(av),
        dlid: av.dlid,
        sl: av.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(av.is_global),
        port_num: av.port,
    }
}

fn address_vector(ah: &ibv_ah_attr) -> AddressVector {
    AddressVector {
        dgid: gid_bytes(&ah.grh.dgid),
        sgid_index: ah.grh.sgid_index,
        hop_limit: ah.grh.hop_limit,
        traffic_class: ah.grh.traffic_class,
        flow_label: ah.grh.flow_label,
        port: ah.port_num,
        sl: ah.sl,
        is_global: ah.is_global != 0,
        dlid: ah.dlid,
    }
}

/// `ibv_modify_qp`'s arguments for `attr`: the struct, and the mask of the
/// fields that are `Some`. Fields outside the mask are zero.
pub(super) fn qp_attr(attr: &QpAttr) -> (ibv_qp_attr, c_int) {
    let mut out: ibv_qp_attr = zeroed();
    if let Some(state) = attr.state {
        out.qp_state = qp_state_to_ibv(state);
    }
    if let Some(access) = attr.access {
        out.qp_access_flags = access.bits();
    }
    if let Some(v) = attr.pkey_index {
        out.pkey_index = v;
    }
    if let Some(v) = attr.port {
        out.port_num = v;
    }
    if let Some(av) = &attr.av {
        out.ah_attr = ah_attr(av);
    }
    if let Some(mtu) = attr.path_mtu {
        out.path_mtu = mtu.to_ibv();
    }
    if let Some(v) = attr.dest_qp_num {
        out.dest_qp_num = v;
    }
    if let Some(v) = attr.rq_psn {
        out.rq_psn = v;
    }
    if let Some(v) = attr.max_dest_rd_atomic {
        out.max_dest_rd_atomic = v;
    }
    if let Some(v) = attr.min_rnr_timer {
        out.min_rnr_timer = v;
    }
    if let Some(v) = attr.sq_psn {
        out.sq_psn = v;
    }
    if let Some(v) = attr.timeout {
        out.timeout = v;
    }
    if let Some(v) = attr.retry_cnt {
        out.retry_cnt = v;
    }
    if let Some(v) = attr.rnr_retry {
        out.rnr_retry = v;
    }
    if let Some(v) = attr.max_rd_atomic {
        out.max_rd_atomic = v;
    }
    // The mask's bits are verbs.h's (checked by a test).
    (out, flags_int(attr.mask()))
}

/// The attributes of `attr` that `mask` selects (what `ibv_query_qp` or
/// `rdma_init_qp_attr` filled in); fails on a state or MTU verbs.h does not
/// define.
pub(crate) fn qp_attr_from_ibv(attr: &ibv_qp_attr, mask_bits: u32) -> Result<QpAttr, String> {
    let has = |bit: u32| mask_bits & bit != 0;
    let state = if has(mask::STATE) {
        Some(
            qp_state_from_ibv(attr.qp_state)
                .ok_or_else(|| format!("unknown QP state {}", attr.qp_state))?,
        )
    } else {
        None
    };
    let path_mtu = if has(mask::PATH_MTU) {
        Some(Mtu::from_ibv(attr.path_mtu).ok_or_else(|| format!("unknown MTU {}", attr.path_mtu))?)
    } else {
        None
    };
    Ok(QpAttr {
        state,
        access: has(mask::ACCESS_FLAGS).then(|| Access::from_bits_retain(attr.qp_access_flags)),
        pkey_index: has(mask::PKEY_INDEX).then_some(attr.pkey_index),
        port: has(mask::PORT).then_some(attr.port_num),
        av: has(mask::AV).then(|| address_vector(&attr.ah_attr)),
        path_mtu,
        dest_qp_num: has(mask::DEST_QPN).then_some(attr.dest_qp_num),
        rq_psn: has(mask::RQ_PSN).then_some(attr.rq_psn),
        max_dest_rd_atomic: has(mask::MAX_DEST_RD_ATOMIC).then_some(attr.max_dest_rd_atomic),
        min_rnr_timer: has(mask::MIN_RNR_TIMER).then_some(attr.min_rnr_timer),
        sq_psn: has(mask::SQ_PSN).then_some(attr.sq_psn),
        timeout: has(mask::TIMEOUT).then_some(attr.timeout),
        retry_cnt: has(mask::RETRY_CNT).then_some(attr.retry_cnt),
        rnr_retry: has(mask::RNR_RETRY).then_some(attr.rnr_retry),
        max_rd_atomic: has(mask::MAX_QP_RD_ATOMIC).then_some(attr.max_rd_atomic),
    })
}

// ---------------------------------------------------------------- ports

/// What `ibv_query_port` said, or why it cannot be used.
pub(super) fn port_attr(attr: &ibv_port_attr) -> Result<PortAttr, String> {
    let active_mtu = Mtu::from_ibv(attr.active_mtu)
        .ok_or_else(|| format!("unknown active MTU {}", attr.active_mtu))?;
    Ok(PortAttr {
        state: if attr.state == ibv_port_state::IBV_PORT_ACTIVE {
            PortState::Active
        } else {
            PortState::NotActive
        },
        active_mtu,
        lid: attr.lid,
        // verbs.h: IBV_LINK_LAYER_UNSPECIFIED is what kernels that predate
        // RoCE report, which were InfiniBand-only.
        link_layer: if u32::from(attr.link_layer) == IBV_LINK_LAYER_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        },
        gid_table_len: u16::try_from(attr.gid_tbl_len.max(0)).unwrap_or(u16::MAX),
        max_msg_sz: attr.max_msg_sz,
    })
}

// ---------------------------------------------------------------- completions

/// The `enum ibv_wc_opcode` value as a [`WcOpcode`].
pub(super) fn wc_opcode_from_ibv(value: ibv_wc_opcode::Type) -> WcOpcode {
    match value {
        ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
        ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ibv_wc_opcode::IBV_WC_BIND_MW => WcOpcode::BindMw,
        ibv_wc_opcode::IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
        ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        other => WcOpcode::Other(other),
    }
}

/// The `wc_flags` bit of a receive whose SEND invalidated an rkey:
/// `IBV_WC_WITH_INV`.
pub(super) const WITH_INV: ibv_wc_flags::Type = ibv_wc_flags::IBV_WC_WITH_INV;
/// The same on Soft-RoCE: also the kernel's `IB_WC_WITH_INVALIDATE`
/// (`1 << 2`, where libibverbs has `IBV_WC_IP_CSUM_OK`). rxe's provider
/// hands out the kernel's work completions as they are (its poll copies
/// each `ib_uverbs_wc`), and the kernel's and libibverbs' flags part ways
/// at that bit; rxe sets no checksum flag.
pub(super) const RXE_WITH_INV: ibv_wc_flags::Type = WITH_INV | 1 << 2;
/// rxe's `vendor_id` (`RXE_VENDOR_ID`).
pub(super) const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// One work completion. The immediate data, big-endian on the wire and in
/// `imm_data`, is returned in host order, present when `IBV_WC_WITH_IMM` is;
/// an invalidated rkey, when one of the `with_inv` bits is.
pub(super) fn completion(wc: &ibv_wc, with_inv: ibv_wc_flags::Type) -> Completion {
    let imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM != 0).then(|| {
        // SAFETY: both members of the union (imm_data, invalidated_rkey)
        // are u32, so either reads any bit pattern validly.
        u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })
    });
    // SAFETY: as above; `invalidated_rkey` is in host order.
    let invalidated =
        (wc.wc_flags & with_inv != 0).then_some(unsafe { wc.__bindgen_anon_1.invalidated_rkey });
    Completion {
        wr_id: wc.wr_id,
        status: WcStatus::from_ibv(wc.status),
        opcode: wc_opcode_from_ibv(wc.opcode),
        byte_len: wc.byte_len,
        imm,
        invalidated,
        qp_num: wc.qp_num,
        vendor_err: wc.vendor_err,
    }
}

// ---------------------------------------------------------------- work requests

/// `struct ibv_sge` of `sge`.
pub(super) fn sge(sge: Sge) -> ibv_sge {
    ibv_sge {
        addr: sge.addr,
        length: sge.len,
        lkey: sge.lkey,
    }
}

/// `struct ibv_recv_wr` of `wr`, its one entry (if any) at `sg_list`, and
/// `next` NULL.
pub(super) fn recv_wr(wr: &RecvWr, sg_list: *mut ibv_sge) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id: wr.wr_id,
        next: ptr::null_mut(),
        sg_list: if wr.sge.is_some() {
            sg_list
        } else {
            ptr::null_mut()
        },
        num_sge: c_int::from(wr.sge.is_some()),
    }
}

/// The raw window and region a bind names, found by the caller.
pub(super) type BindTarget = (*mut ibv_mw, *mut ibv_mr);

/// `struct ibv_send_wr` of `wr`, its one entry (if any) at `sg_list`, and
/// `next` NULL. A bind's window and region are resolved with `resolve`,
/// whose error is returned.
pub(super) fn send_wr<E>(
    wr: &SendWr,
    sg_list: *mut ibv_sge,
    resolve: impl FnOnce(&Arc<dyn Mw>, &Arc<dyn Mr>) -> Result<BindTarget, E>,
) -> Result<ibv_send_wr, E> {
    let mut out: ibv_send_wr = zeroed();
    out.wr_id = wr.wr_id;
    out.next = ptr::null_mut();
    if wr.sge.is_some() {
        out.sg_list = sg_list;
        out.num_sge = 1;
    }
    if wr.signaled {
        out.send_flags = ibv_send_flags::IBV_SEND_SIGNALED;
    }
    let rdma =
        |remote_addr: u64, rkey: u32| ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    match &wr.op {
        SendOp::Write { remote_addr, rkey } => {
            out.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            out.wr.rdma = rdma(*remote_addr, *rkey);
        }
        SendOp::WriteImm {
            remote_addr,
            rkey,
            imm,
        } => {
            out.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            out.wr.rdma = rdma(*remote_addr, *rkey);
            out.__bindgen_anon_1.imm_data = imm.to_be();
        }
        SendOp::Send => out.opcode = ibv_wr_opcode::IBV_WR_SEND,
        SendOp::SendImm { imm } => {
            out.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
            out.__bindgen_anon_1.imm_data = imm.to_be();
        }
        SendOp::SendInv { rkey } => {
            out.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
            out.__bindgen_anon_1.invalidate_rkey = *rkey;
        }
        SendOp::Read { remote_addr, rkey } => {
            out.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            out.wr.rdma = rdma(*remote_addr, *rkey);
        }
        SendOp::BindMw {
            mw,
            rkey,
            mr,
            addr,
            len,
            access,
        } => {
            let (raw_mw, raw_mr) = resolve(mw, mr)?;
            out.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
            out.__bindgen_anon_2.bind_mw = ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                mw: raw_mw,
                rkey: *rkey,
                bind_info: super::sys::ibv_mw_bind_info {
                    mr: raw_mr,
                    addr: *addr,
                    length: *len,
                    mw_access_flags: access.bits(),
                },
            };
        }
        SendOp::LocalInv { rkey } => {
            out.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
            out.__bindgen_anon_1.invalidate_rkey = *rkey;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::verbs::sys::{ibv_access_flags, ibv_mtu, ibv_mw_type, ibv_wc_status};

    fn av() -> AddressVector {
        AddressVector {
            dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7],
            sgid_index: 3,
            hop_limit: 64,
            traffic_class: 0x68,
            flow_label: 0x1_2345,
            port: 1,
            sl: 2,
            is_global: true,
            dlid: 0,
        }
    }

    fn every_attribute() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            access: Some(Access::LOCAL_WRITE | Access::REMOTE_READ | Access::MW_BIND),
            pkey_index: Some(0),
            port: Some(1),
            av: Some(av()),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qp_num: Some(0x11),
            rq_psn: Some(0x00b9_d84f),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            sq_psn: Some(0x0010_b6b5),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
        }
    }

    #[test]
    fn the_domain_mask_bits_are_verbs_h_values() {
        use ibv_qp_attr_mask as m;
        let pairs = [
            (mask::STATE, m::IBV_QP_STATE),
            (mask::ACCESS_FLAGS, m::IBV_QP_ACCESS_FLAGS),
            (mask::PKEY_INDEX, m::IBV_QP_PKEY_INDEX),
            (mask::PORT, m::IBV_QP_PORT),
            (mask::AV, m::IBV_QP_AV),
            (mask::PATH_MTU, m::IBV_QP_PATH_MTU),
            (mask::TIMEOUT, m::IBV_QP_TIMEOUT),
            (mask::RETRY_CNT, m::IBV_QP_RETRY_CNT),
            (mask::RNR_RETRY, m::IBV_QP_RNR_RETRY),
            (mask::RQ_PSN, m::IBV_QP_RQ_PSN),
            (mask::MAX_QP_RD_ATOMIC, m::IBV_QP_MAX_QP_RD_ATOMIC),
            (mask::MIN_RNR_TIMER, m::IBV_QP_MIN_RNR_TIMER),
            (mask::SQ_PSN, m::IBV_QP_SQ_PSN),
            (mask::MAX_DEST_RD_ATOMIC, m::IBV_QP_MAX_DEST_RD_ATOMIC),
            (mask::DEST_QPN, m::IBV_QP_DEST_QPN),
        ];
        for (ours, theirs) in pairs {
            assert_eq!(ours, theirs);
        }
        assert_eq!(
            every_attribute().mask(),
            MASK_BITS.iter().fold(0, |a, (b, _)| a | b)
        );
    }

    #[test]
    fn access_flags_and_statuses_are_verbs_h_values() {
        use ibv_access_flags as a;
        assert_eq!(Access::LOCAL_WRITE.bits(), a::IBV_ACCESS_LOCAL_WRITE);
        assert_eq!(Access::REMOTE_WRITE.bits(), a::IBV_ACCESS_REMOTE_WRITE);
        assert_eq!(Access::REMOTE_READ.bits(), a::IBV_ACCESS_REMOTE_READ);
        assert_eq!(Access::REMOTE_ATOMIC.bits(), a::IBV_ACCESS_REMOTE_ATOMIC);
        assert_eq!(Access::MW_BIND.bits(), a::IBV_ACCESS_MW_BIND);
        assert_eq!(access_int(Access::all()), 0x1f);
        assert_eq!(flags_int(1 << 31), c_int::MIN);
        use ibv_wc_status as s;
        for (ours, theirs) in [
            (WcStatus::Success, s::IBV_WC_SUCCESS),
            (WcStatus::LocLenErr, s::IBV_WC_LOC_LEN_ERR),
            (WcStatus::LocProtErr, s::IBV_WC_LOC_PROT_ERR),
            (WcStatus::WrFlushErr, s::IBV_WC_WR_FLUSH_ERR),
            (WcStatus::MwBindErr, s::IBV_WC_MW_BIND_ERR),
            (WcStatus::RemInvReqErr, s::IBV_WC_REM_INV_REQ_ERR),
            (WcStatus::RemAccessErr, s::IBV_WC_REM_ACCESS_ERR),
            (WcStatus::RemOpErr, s::IBV_WC_REM_OP_ERR),
            (WcStatus::RetryExcErr, s::IBV_WC_RETRY_EXC_ERR),
            (WcStatus::RnrRetryExcErr, s::IBV_WC_RNR_RETRY_EXC_ERR),
        ] {
            assert_eq!(ours.to_ibv(), theirs);
            assert_eq!(WcStatus::from_ibv(theirs), ours);
        }
        assert_eq!(Mtu::Mtu4096.to_ibv(), ibv_mtu::IBV_MTU_4096);
        assert_eq!(Mtu::Mtu256.to_ibv(), ibv_mtu::IBV_MTU_256);
        assert_eq!(ibv_mw_type::IBV_MW_TYPE_2, 2);
    }

    #[test]
    fn qp_attr_round_trips_with_its_mask() {
        let full = every_attribute();
        let (raw, bits) = qp_attr(&full);
        assert_eq!(u32::try_from(bits).unwrap(), full.mask());
        assert_eq!(raw.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(raw.path_mtu, ibv_mtu::IBV_MTU_1024);
        assert_eq!(raw.ah_attr.is_global, 1);
        assert_eq!(raw.ah_attr.port_num, 1);
        assert_eq!(raw.ah_attr.grh.sgid_index, 3);
        assert_eq!(gid_bytes(&raw.ah_attr.grh.dgid), av().dgid);
        assert_eq!(qp_attr_from_ibv(&raw, full.mask()), Ok(full));

        // Each transition's subset comes back as itself, nothing more.
        let init = QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::REMOTE_WRITE | Access::LOCAL_WRITE),
            pkey_index: Some(0),
            port: Some(1),
            ..QpAttr::default()
        };
        let rts = QpAttr {
            state: Some(QpState::Rts),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            sq_psn: Some(5),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        };
        for attr in [init, rts, QpAttr::default()] {
            let (raw, bits) = qp_attr(&attr);
            let bits = u32::try_from(bits).unwrap();
            assert_eq!(bits, attr.mask());
            assert_eq!(qp_attr_from_ibv(&raw, bits), Ok(attr));
        }
    }

    #[test]
    fn unknown_states_and_mtus_are_errors() {
        let mut raw: ibv_qp_attr = zeroed();
        raw.qp_state = ibv_qp_state::IBV_QPS_UNKNOWN;
        assert!(qp_attr_from_ibv(&raw, mask::STATE).is_err());
        raw.path_mtu = 9;
        assert!(qp_attr_from_ibv(&raw, mask::PATH_MTU).is_err());
        // Outside the mask, the values are not looked at.
        assert_eq!(qp_attr_from_ibv(&raw, 0), Ok(QpAttr::default()));
        for state in [QpState::Reset, QpState::Sqd, QpState::Sqe, QpState::Err] {
            assert_eq!(qp_state_from_ibv(qp_state_to_ibv(state)), Some(state));
        }
    }

    #[test]
    fn masks_are_described_by_name() {
        let bits = mask::STATE | mask::AV | mask::DEST_QPN;
        assert_eq!(describe_mask(bits), "0x100081 = STATE|AV|DEST_QPN");
        assert_eq!(describe_mask(0), "0x0 = none");
        assert_eq!(describe_mask(1 << 30), "0x40000000 = 0x40000000");
        assert_eq!(state_name(Some(QpState::Rtr)), "RTR");
    }

    #[test]
    fn port_attributes_are_read_as_roce_reports_them() {
        let mut raw: ibv_port_attr = zeroed();
        raw.state = ibv_port_state::IBV_PORT_ACTIVE;
        raw.active_mtu = ibv_mtu::IBV_MTU_1024;
        raw.link_layer = 2;
        raw.gid_tbl_len = 128;
        raw.max_msg_sz = 1 << 31;
        assert_eq!(
            port_attr(&raw),
            Ok(PortAttr {
                state: PortState::Active,
                active_mtu: Mtu::Mtu1024,
                lid: 0,
                link_layer: LinkLayer::Ethernet,
                gid_table_len: 128,
                max_msg_sz: 1 << 31,
            })
        );
        raw.state = ibv_port_state::IBV_PORT_DOWN;
        raw.link_layer = 0;
        let down = port_attr(&raw).unwrap();
        assert_eq!(down.state, PortState::NotActive);
        assert_eq!(down.link_layer, LinkLayer::InfiniBand);
        raw.active_mtu = 0;
        assert!(port_attr(&raw).is_err());
    }

    #[test]
    fn completions_carry_immediate_data_in_host_order() {
        let mut wc: ibv_wc = zeroed();
        wc.wr_id = 42;
        wc.status = ibv_wc_status::IBV_WC_SUCCESS;
        wc.opcode = ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
        wc.byte_len = 4096;
        wc.qp_num = 0x11;
        wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM;
        wc.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        assert_eq!(
            completion(&wc, WITH_INV),
            Completion {
                wr_id: 42,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: 4096,
                imm: Some(0x1234_5678),
                invalidated: None,
                qp_num: 0x11,
                vendor_err: 0,
            }
        );
        // A SEND with invalidate: the rkey, in host order, and no immediate.
        wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
        wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV;
        wc.__bindgen_anon_1.invalidated_rkey = 0x0002_51a7;
        let c = completion(&wc, WITH_INV);
        assert_eq!((c.imm, c.invalidated), (None, Some(0x0002_51a7)));
        // rxe's: the kernel's bit, which elsewhere is a checksum's.
        wc.wc_flags = 1 << 2;
        assert_eq!(completion(&wc, WITH_INV).invalidated, None);
        assert_eq!(completion(&wc, RXE_WITH_INV).invalidated, Some(0x0002_51a7));
        // Without the flag the union is not immediate data.
        wc.wc_flags = 0;
        wc.opcode = ibv_wc_opcode::IBV_WC_RDMA_WRITE;
        wc.status = ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
        wc.vendor_err = 0x88;
        let c = completion(&wc, WITH_INV);
        assert_eq!(c.imm, None);
        assert_eq!(c.status, WcStatus::RemAccessErr);
        assert_eq!(c.opcode, WcOpcode::RdmaWrite);
        assert_eq!(c.vendor_err, 0x88);
        for (raw, ours) in [
            (ibv_wc_opcode::IBV_WC_SEND, WcOpcode::Send),
            (ibv_wc_opcode::IBV_WC_RDMA_READ, WcOpcode::RdmaRead),
            (ibv_wc_opcode::IBV_WC_BIND_MW, WcOpcode::BindMw),
            (ibv_wc_opcode::IBV_WC_LOCAL_INV, WcOpcode::LocalInv),
            (ibv_wc_opcode::IBV_WC_RECV, WcOpcode::Recv),
            (ibv_wc_opcode::IBV_WC_COMP_SWAP, WcOpcode::Other(3)),
        ] {
            assert_eq!(wc_opcode_from_ibv(raw), ours);
        }
    }

    struct TestMw;
    impl Mw for TestMw {
        fn rkey(&self) -> u32 {
            0x100
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    struct TestMr;
    impl Mr for TestMr {
        fn lkey(&self) -> u32 {
            1
        }
        fn rkey(&self) -> u32 {
            2
        }
        fn addr(&self) -> u64 {
            0x1000
        }
        fn len(&self) -> usize {
            0x1000
        }
        fn keep_until_deregistered(&self, _: Box<dyn std::any::Any + Send + Sync>) {}
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn no_bind(_: &Arc<dyn Mw>, _: &Arc<dyn Mr>) -> Result<BindTarget, String> {
        Err("no bind expected".to_owned())
    }

    fn wr(op: SendOp, with_sge: bool) -> SendWr {
        SendWr {
            wr_id: 7,
            op,
            sge: with_sge.then_some(Sge {
                addr: 0x1000,
                len: 64,
                lkey: 9,
            }),
            signaled: true,
        }
    }

    /// The immediate data or rkey to invalidate (one `u32` union).
    fn imm_or_rkey(w: &ibv_send_wr) -> u32 {
        // SAFETY: both members of the union are u32, so reading either is
        // valid for any bytes, and `send_wr` starts from all zeroes.
        unsafe { w.__bindgen_anon_1.imm_data }
    }

    /// The `wr.rdma` member of a WRITE or READ.
    fn rdma_of(w: &ibv_send_wr) -> (u64, u32) {
        // SAFETY: every member of `wr` is plain integers (or a pointer, for
        // `ud`, which an integer read of the bytes does not dereference), and
        // `send_wr` starts from all zeroes, so any read is initialized.
        let rdma = unsafe { w.wr.rdma };
        (rdma.remote_addr, rdma.rkey)
    }

    #[test]
    fn each_send_operation_fills_its_part_of_the_request() {
        let mut entry = sge(Sge {
            addr: 0x1000,
            len: 64,
            lkey: 9,
        });
        let sg: *mut ibv_sge = &mut entry;

        let w = send_wr(
            &wr(
                SendOp::Write {
                    remote_addr: 0xabc,
                    rkey: 5,
                },
                true,
            ),
            sg,
            no_bind,
        )
        .unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!((w.wr_id, w.num_sge, w.sg_list), (7, 1, sg));
        assert_eq!(w.send_flags, ibv_send_flags::IBV_SEND_SIGNALED);
        assert!(w.next.is_null());
        assert_eq!(rdma_of(&w), (0xabc, 5));

        let w = send_wr(
            &wr(
                SendOp::WriteImm {
                    remote_addr: 0xdef,
                    rkey: 6,
                    imm: 0x0102_0304,
                },
                false,
            ),
            sg,
            no_bind,
        )
        .unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!((w.num_sge, w.sg_list), (0, ptr::null_mut()));
        assert_eq!(imm_or_rkey(&w), 0x0102_0304u32.to_be());
        assert_eq!(rdma_of(&w), (0xdef, 6));

        let w = send_wr(&wr(SendOp::Send, true), sg, no_bind).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_SEND);

        let w = send_wr(&wr(SendOp::SendImm { imm: 0xaabb_ccdd }, true), sg, no_bind).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
        assert_eq!(u32::from_be(imm_or_rkey(&w)), 0xaabb_ccdd);

        // The rkey to invalidate goes in host order (the union's other half).
        let w = send_wr(
            &wr(SendOp::SendInv { rkey: 0x0002_51a7 }, true),
            sg,
            no_bind,
        )
        .unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_SEND_WITH_INV);
        assert_eq!(imm_or_rkey(&w), 0x0002_51a7);

        let w = send_wr(
            &wr(
                SendOp::Read {
                    remote_addr: 0x77,
                    rkey: 8,
                },
                true,
            ),
            sg,
            no_bind,
        )
        .unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_RDMA_READ);
        assert_eq!(rdma_of(&w), (0x77, 8));

        let mut unsignaled = wr(SendOp::LocalInv { rkey: 0x101 }, false);
        unsignaled.signaled = false;
        let w = send_wr(&unsignaled, sg, no_bind).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_LOCAL_INV);
        assert_eq!(w.send_flags, 0);
        assert_eq!(imm_or_rkey(&w), 0x101);
    }

    #[test]
    fn a_bind_names_the_window_region_range_and_access() {
        let (fake_mw, fake_mr) = (0x10usize, 0x20usize);
        let op = SendOp::BindMw {
            mw: Arc::new(TestMw),
            rkey: 0x101,
            mr: Arc::new(TestMr),
            addr: 0x1800,
            len: 0x200,
            access: Access::REMOTE_READ | Access::REMOTE_WRITE,
        };
        let resolve = |_: &Arc<dyn Mw>, _: &Arc<dyn Mr>| -> Result<BindTarget, String> {
            Ok((
                ptr::with_exposed_provenance_mut(fake_mw),
                ptr::with_exposed_provenance_mut(fake_mr),
            ))
        };
        let w = send_wr(&wr(op.clone(), false), ptr::null_mut(), resolve).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_BIND_MW);
        assert_eq!(w.num_sge, 0);
        // SAFETY: `bind_mw` is the member a bind writes.
        let bind = unsafe { w.__bindgen_anon_2.bind_mw };
        assert_eq!(bind.mw.addr(), fake_mw);
        assert_eq!(bind.rkey, 0x101);
        assert_eq!(bind.bind_info.mr.addr(), fake_mr);
        assert_eq!(
            (bind.bind_info.addr, bind.bind_info.length),
            (0x1800, 0x200)
        );
        assert_eq!(
            bind.bind_info.mw_access_flags,
            ibv_access_flags::IBV_ACCESS_REMOTE_READ | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        );
        // A window the caller cannot resolve is the resolver's error.
        assert_eq!(
            send_wr(&wr(op, false), ptr::null_mut(), no_bind).err(),
            Some("no bind expected".to_owned())
        );
    }

    #[test]
    fn receives_have_zero_or_one_entry() {
        let mut entry = sge(Sge {
            addr: 1,
            len: 2,
            lkey: 3,
        });
        let sg: *mut ibv_sge = &mut entry;
        let with = recv_wr(
            &RecvWr {
                wr_id: 1,
                sge: Some(Sge {
                    addr: 1,
                    len: 2,
                    lkey: 3,
                }),
            },
            sg,
        );
        assert_eq!((with.wr_id, with.num_sge, with.sg_list), (1, 1, sg));
        let without = recv_wr(
            &RecvWr {
                wr_id: 2,
                sge: None,
            },
            sg,
        );
        assert_eq!((without.num_sge, without.sg_list), (0, ptr::null_mut()));
        assert!(without.next.is_null());
    }
}
