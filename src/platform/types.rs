//! Domain types of the platform traits: what crosses the seam between
//! `core` and the vendor libraries (or their fakes). Values mirror
//! libibverbs where a value is involved, so conversions are plain tables.

use std::sync::Arc;

use super::{Mr, Mw};

/// A GID, raw as `ibv_query_gid` returns it.
pub type Gid = [u8; 16];

bitflags::bitflags! {
    /// `enum ibv_access_flags` (same bit values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`
        const MW_BIND = 1 << 4;
    }
}

/// `enum ibv_qp_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// `IBV_QPS_RESET`
    Reset,
    /// `IBV_QPS_INIT`
    Init,
    /// `IBV_QPS_RTR`
    Rtr,
    /// `IBV_QPS_RTS`
    Rts,
    /// `IBV_QPS_SQD`
    Sqd,
    /// `IBV_QPS_SQE`
    Sqe,
    /// `IBV_QPS_ERR`
    Err,
}

/// `enum ibv_mtu`: a path MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256` = 1)
    Mtu256,
    /// 512 bytes
    Mtu512,
    /// 1024 bytes
    Mtu1024,
    /// 2048 bytes
    Mtu2048,
    /// 4096 bytes (`IBV_MTU_4096` = 5)
    Mtu4096,
}

impl Mtu {
    /// Bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The `enum ibv_mtu` value, 1 to 5.
    pub fn to_ibv(self) -> u32 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// From an `enum ibv_mtu` value.
    pub fn from_ibv(value: u32) -> Option<Mtu> {
        [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .find(|m| m.to_ibv() == value)
    }
}

/// `struct ibv_ah_attr` with its global route, as RoCE needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    /// The peer's GID.
    pub dgid: Gid,
    /// Index of our GID in the port's table.
    pub sgid_index: u8,
    /// IPv6 hop limit / IPv4 TTL.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Our port number.
    pub port: u8,
    /// Service level.
    pub sl: u8,
    /// `is_global` (always 1 on RoCE).
    pub is_global: bool,
    /// The peer's LID (0 on RoCE).
    pub dlid: u16,
}

/// `struct ibv_qp_attr` with its mask: each `Some` field is in the mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// `IBV_QP_STATE`
    pub state: Option<QpState>,
    /// `IBV_QP_ACCESS_FLAGS`
    pub access: Option<Access>,
    /// `IBV_QP_PKEY_INDEX`
    pub pkey_index: Option<u16>,
    /// `IBV_QP_PORT`
    pub port: Option<u8>,
    /// `IBV_QP_AV`
    pub av: Option<AddressVector>,
    /// `IBV_QP_PATH_MTU`
    pub path_mtu: Option<Mtu>,
    /// `IBV_QP_DEST_QPN`
    pub dest_qp_num: Option<u32>,
    /// `IBV_QP_RQ_PSN`
    pub rq_psn: Option<u32>,
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`
    pub max_dest_rd_atomic: Option<u8>,
    /// `IBV_QP_MIN_RNR_TIMER`
    pub min_rnr_timer: Option<u8>,
    /// `IBV_QP_SQ_PSN`
    pub sq_psn: Option<u32>,
    /// `IBV_QP_TIMEOUT`
    pub timeout: Option<u8>,
    /// `IBV_QP_RETRY_CNT`
    pub retry_cnt: Option<u8>,
    /// `IBV_QP_RNR_RETRY`
    pub rnr_retry: Option<u8>,
    /// `IBV_QP_MAX_QP_RD_ATOMIC`
    pub max_rd_atomic: Option<u8>,
}

/// `enum ibv_qp_attr_mask` bits, for messages and conversions.
pub mod mask {
    /// `IBV_QP_STATE`
    pub const STATE: u32 = 1;
    /// `IBV_QP_ACCESS_FLAGS`
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// `IBV_QP_PKEY_INDEX`
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// `IBV_QP_PORT`
    pub const PORT: u32 = 1 << 5;
    /// `IBV_QP_AV`
    pub const AV: u32 = 1 << 7;
    /// `IBV_QP_PATH_MTU`
    pub const PATH_MTU: u32 = 1 << 8;
    /// `IBV_QP_TIMEOUT`
    pub const TIMEOUT: u32 = 1 << 9;
    /// `IBV_QP_RETRY_CNT`
    pub const RETRY_CNT: u32 = 1 << 10;
    /// `IBV_QP_RNR_RETRY`
    pub const RNR_RETRY: u32 = 1 << 11;
    /// `IBV_QP_RQ_PSN`
    pub const RQ_PSN: u32 = 1 << 12;
    /// `IBV_QP_MAX_QP_RD_ATOMIC`
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// `IBV_QP_MIN_RNR_TIMER`
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// `IBV_QP_SQ_PSN`
    pub const SQ_PSN: u32 = 1 << 16;
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// `IBV_QP_DEST_QPN`
    pub const DEST_QPN: u32 = 1 << 20;
}

impl QpAttr {
    /// The `ibv_qp_attr_mask` of the fields that are set.
    pub fn mask(&self) -> u32 {
        let bits = [
            (self.state.is_some(), mask::STATE),
            (self.access.is_some(), mask::ACCESS_FLAGS),
            (self.pkey_index.is_some(), mask::PKEY_INDEX),
            (self.port.is_some(), mask::PORT),
            (self.av.is_some(), mask::AV),
            (self.path_mtu.is_some(), mask::PATH_MTU),
            (self.timeout.is_some(), mask::TIMEOUT),
            (self.retry_cnt.is_some(), mask::RETRY_CNT),
            (self.rnr_retry.is_some(), mask::RNR_RETRY),
            (self.rq_psn.is_some(), mask::RQ_PSN),
            (self.max_rd_atomic.is_some(), mask::MAX_QP_RD_ATOMIC),
            (self.min_rnr_timer.is_some(), mask::MIN_RNR_TIMER),
            (self.sq_psn.is_some(), mask::SQ_PSN),
            (self.max_dest_rd_atomic.is_some(), mask::MAX_DEST_RD_ATOMIC),
            (self.dest_qp_num.is_some(), mask::DEST_QPN),
        ];
        bits.iter()
            .filter(|(set, _)| *set)
            .fold(0, |acc, (_, bit)| acc | bit)
    }
}

/// Capacities of a new QP (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
}

/// `enum ibv_port_state`, reduced to what matters here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// `IBV_PORT_ACTIVE`
    Active,
    /// Any other state (down, init, armed...).
    NotActive,
}

/// `enum` link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// RoCE.
    Ethernet,
    /// Native InfiniBand.
    InfiniBand,
}

/// What `ibv_query_port` says about a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Whether the port is ACTIVE.
    pub state: PortState,
    /// The active MTU.
    pub active_mtu: Mtu,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Entries in the GID table.
    pub gid_table_len: u16,
    /// The largest message the port carries (`max_msg_sz`): a WRITE, READ
    /// or SEND longer than this fails, so longer transfers are split.
    pub max_msg_sz: u32,
}

/// What `ibv_query_device` says a device can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// `max_qp`.
    pub max_qp: u32,
    /// `max_cq`.
    pub max_cq: u32,
    /// `max_cqe`: entries of one CQ.
    pub max_cqe: u32,
    /// `max_mr`.
    pub max_mr: u32,
    /// `max_mw`.
    pub max_mw: u32,
    /// `max_qp_wr`: work requests of one queue.
    pub max_qp_wr: u32,
}

/// `enum ibv_event_type`, as far as it matters here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncKind {
    /// `IBV_EVENT_CQ_ERR` (0): a CQ overran or failed.
    CqErr,
    /// `IBV_EVENT_QP_FATAL` (1): the QP went to ERR on a local error.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR` (2): the QP went to ERR on an invalid request
    /// it received.
    QpReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR` (3): the QP went to ERR on a request that
    /// broke its access rules (a bad rkey, range or access flag).
    QpAccessErr,
    /// `IBV_EVENT_COMM_EST` (4).
    CommEst,
    /// `IBV_EVENT_DEVICE_FATAL` (8): the device is gone.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE` (9).
    PortActive,
    /// `IBV_EVENT_PORT_ERR` (10): the port went down.
    PortErr,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` (16).
    QpLastWqeReached,
    /// Any other event, by value.
    Other(u32),
}

impl AsyncKind {
    /// The `enum ibv_event_type` value.
    pub fn to_ibv(self) -> u32 {
        match self {
            AsyncKind::CqErr => 0,
            AsyncKind::QpFatal => 1,
            AsyncKind::QpReqErr => 2,
            AsyncKind::QpAccessErr => 3,
            AsyncKind::CommEst => 4,
            AsyncKind::DeviceFatal => 8,
            AsyncKind::PortActive => 9,
            AsyncKind::PortErr => 10,
            AsyncKind::QpLastWqeReached => 16,
            AsyncKind::Other(v) => v,
        }
    }

    /// From an `enum ibv_event_type` value.
    pub fn from_ibv(value: u32) -> AsyncKind {
        [
            AsyncKind::CqErr,
            AsyncKind::QpFatal,
            AsyncKind::QpReqErr,
            AsyncKind::QpAccessErr,
            AsyncKind::CommEst,
            AsyncKind::DeviceFatal,
            AsyncKind::PortActive,
            AsyncKind::PortErr,
            AsyncKind::QpLastWqeReached,
        ]
        .into_iter()
        .find(|k| k.to_ibv() == value)
        .unwrap_or(AsyncKind::Other(value))
    }

    /// Whether the event's element is a QP (`ibv_async_event.element.qp`).
    pub fn names_a_qp(value: u32) -> bool {
        // IBV_EVENT_QP_FATAL..=IBV_EVENT_PATH_MIG_ERR, and
        // IBV_EVENT_QP_LAST_WQE_REACHED.
        matches!(value, 1..=7 | 16)
    }

    /// Whether it says that a QP is in ERR.
    pub fn qp_failed(self) -> bool {
        matches!(
            self,
            AsyncKind::QpFatal | AsyncKind::QpReqErr | AsyncKind::QpAccessErr
        )
    }
}

/// One asynchronous event of a device (`struct ibv_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncKind,
    /// The QP it names, for QP events.
    pub qp_num: Option<u32>,
}

/// One scatter/gather entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Address (in the MR's address space).
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// The MR's local key.
    pub lkey: u32,
}

/// A receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where a SEND's payload lands; `None` for a zero-length receive (enough
    /// for a WRITE-with-immediate).
    pub sge: Option<Sge>,
}

/// A send work request.
#[derive(Clone)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data: the payload of a WRITE or SEND, the target of a READ.
    pub sge: Option<Sge>,
    /// `IBV_SEND_SIGNALED`: produce a completion on success too.
    pub signaled: bool,
}

/// What a send work request does.
#[derive(Clone)]
pub enum SendOp {
    /// `IBV_WR_RDMA_WRITE`
    Write {
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: consumes a receive at the peer.
    WriteImm {
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
        /// Immediate data (host order; big-endian on the wire).
        imm: u32,
    },
    /// `IBV_WR_SEND`: consumes a receive at the peer.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: consumes a receive at the peer, whose
    /// completion (`IBV_WC_RECV` with `IBV_WC_WITH_IMM`) carries `imm`.
    /// Needs no remote access on the peer's QP.
    SendImm {
        /// Immediate data (host order; big-endian on the wire).
        imm: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: consumes a receive at the peer, whose NIC
    /// invalidates the memory window `rkey` (of the receiving QP's
    /// protection domain) before the receive completes, with
    /// `IBV_WC_WITH_INV` and the rkey. No room for an immediate.
    SendInv {
        /// The peer's window to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_READ`
    Read {
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW` of a type-2 window.
    BindMw {
        /// The window.
        mw: Arc<dyn Mw>,
        /// The rkey the window gets ([`super::next_rkey`] of its last one).
        rkey: u32,
        /// The region the window lies in (allocated with `MW_BIND`).
        mr: Arc<dyn Mr>,
        /// First byte.
        addr: u64,
        /// Bytes.
        len: u64,
        /// Remote access the window grants.
        access: Access,
    },
    /// `IBV_WR_LOCAL_INV`: invalidates the window with `rkey`.
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
}

impl std::fmt::Debug for SendOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendOp::Write { remote_addr, rkey } => {
                write!(f, "Write({remote_addr:#x}, rkey {rkey:#x})")
            }
            SendOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                write!(
                    f,
                    "WriteImm({remote_addr:#x}, rkey {rkey:#x}, imm {imm:#x})"
                )
            }
            SendOp::Send => write!(f, "Send"),
            SendOp::SendImm { imm } => write!(f, "SendImm(imm {imm:#x})"),
            SendOp::SendInv { rkey } => write!(f, "SendInv(rkey {rkey:#x})"),
            SendOp::Read { remote_addr, rkey } => {
                write!(f, "Read({remote_addr:#x}, rkey {rkey:#x})")
            }
            SendOp::BindMw {
                rkey,
                addr,
                len,
                access,
                ..
            } => {
                write!(f, "BindMw(rkey {rkey:#x}, {addr:#x}+{len}, {access:?})")
            }
            SendOp::LocalInv { rkey } => write!(f, "LocalInv(rkey {rkey:#x})"),
        }
    }
}

impl std::fmt::Debug for SendWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr_id)
            .field("op", &self.op)
            .field("sge", &self.sge)
            .field("signaled", &self.signaled)
            .finish()
    }
}

/// `enum ibv_wc_status` (values as in verbs.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// 0
    Success,
    /// 1: `IBV_WC_LOC_LEN_ERR`
    LocLenErr,
    /// 4: `IBV_WC_LOC_PROT_ERR`
    LocProtErr,
    /// 5: `IBV_WC_WR_FLUSH_ERR`
    WrFlushErr,
    /// 6: `IBV_WC_MW_BIND_ERR`
    MwBindErr,
    /// 9: `IBV_WC_REM_INV_REQ_ERR`
    RemInvReqErr,
    /// 10: `IBV_WC_REM_ACCESS_ERR`
    RemAccessErr,
    /// 11: `IBV_WC_REM_OP_ERR`
    RemOpErr,
    /// 12: `IBV_WC_RETRY_EXC_ERR`
    RetryExcErr,
    /// 13: `IBV_WC_RNR_RETRY_EXC_ERR`
    RnrRetryExcErr,
    /// Any other status, by value.
    Other(u32),
}

impl WcStatus {
    /// The `enum ibv_wc_status` value.
    pub fn to_ibv(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::MwBindErr => 6,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::Other(v) => v,
        }
    }

    /// From an `enum ibv_wc_status` value.
    pub fn from_ibv(value: u32) -> WcStatus {
        [
            WcStatus::Success,
            WcStatus::LocLenErr,
            WcStatus::LocProtErr,
            WcStatus::WrFlushErr,
            WcStatus::MwBindErr,
            WcStatus::RemInvReqErr,
            WcStatus::RemAccessErr,
            WcStatus::RemOpErr,
            WcStatus::RetryExcErr,
            WcStatus::RnrRetryExcErr,
        ]
        .into_iter()
        .find(|s| s.to_ibv() == value)
        .unwrap_or(WcStatus::Other(value))
    }
}

/// `enum ibv_wc_opcode`, as far as this library uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// `IBV_WC_SEND` (0)
    Send,
    /// `IBV_WC_RDMA_WRITE` (1)
    RdmaWrite,
    /// `IBV_WC_RDMA_READ` (2)
    RdmaRead,
    /// `IBV_WC_BIND_MW` (5)
    BindMw,
    /// `IBV_WC_LOCAL_INV` (6)
    LocalInv,
    /// `IBV_WC_RECV` (128): a SEND arrived (with `imm` for a SEND with
    /// immediate).
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM` (129): a WRITE-with-immediate arrived.
    RecvRdmaWithImm,
    /// Any other opcode, by value.
    Other(u32),
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed (meaningful on success).
    pub opcode: WcOpcode,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// Immediate data, for `RecvRdmaWithImm` (host order).
    pub imm: Option<u32>,
    /// The rkey the NIC invalidated for a SEND with invalidate that
    /// arrived (`IBV_WC_WITH_INV`).
    pub invalidated: Option<u32>,
    /// The local QP the completion belongs to.
    pub qp_num: u32,
    /// The vendor's error code.
    pub vendor_err: u32,
}

/// What `hipPointerGetAttributes` says about an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointerKind {
    /// Device memory of `device`.
    Device {
        /// The HIP device index.
        device: i32,
    },
    /// Host memory allocated or registered with HIP (pinned).
    PinnedHost,
    /// Ordinary host memory HIP does not know.
    UnknownHost,
}

/// The RoCE version of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// `IB/RoCE v1`
    RoceV1,
    /// `RoCE v2`
    RoceV2,
    /// Native InfiniBand.
    Ib,
    /// The type file is missing or unreadable.
    Unknown,
}

/// One GID table entry as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table.
    pub index: u16,
    /// The GID.
    pub gid: Gid,
    /// Its RoCE version.
    pub kind: GidKind,
    /// The network device it belongs to, if any.
    pub netdev: Option<String>,
}

/// One port of a NIC as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub num: u8,
    /// Whether it is ACTIVE.
    pub state: PortState,
    /// Active MTU, if known.
    pub active_mtu: Option<Mtu>,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Configured GID entries.
    pub gids: Vec<GidEntry>,
}

/// One RDMA device as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicInfo {
    /// The device name (`mlx5_0`, `bnxt_re0`, `rxe0`...).
    pub name: String,
    /// The PCI address of the function behind it; `None` for software
    /// devices (Soft-RoCE).
    pub pci: Option<String>,
    /// NUMA node, if known.
    pub numa_node: Option<i32>,
    /// Ports.
    pub ports: Vec<PortInfo>,
}
