//! What the fabric's unit tests share: two ends (a device's context, PD,
//! CQ, an INIT QP and a registered buffer), how they are connected, and
//! work requests.

use std::net::Ipv4Addr;
use std::sync::Arc;

use super::super::{Counters, Faults};
use super::{roce_av, to_u64, DeviceSpec, Fabric, PSN_MASK};
use hipobj::error::{Error, Result};
use hipobj::platform::{
    Access, Completion, Context, Cq, Gid, Mr, Mtu, Pd, Qp, QpAttr, QpCaps, QpState, RecvWr, SendOp,
    SendWr, Sge, WcStatus,
};

pub(super) const A_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub(super) const B_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub(super) const A_SQ_PSN: u32 = 0x00b9_d84f;
pub(super) const B_SQ_PSN: u32 = 0x0010_b6b5;
pub(super) const BUF: usize = 256 * 1024;
pub(super) const KIB64: u32 = 64 * 1024;
pub(super) const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::MW_BIND);

/// One end: a device's context, PD, CQ, an INIT QP and a registered
/// buffer. Field order: the MR goes before the buffer it covers.
pub(super) struct End {
    pub(super) qp: Arc<dyn Qp>,
    pub(super) mr: Arc<dyn Mr>,
    pub(super) buf: Vec<u8>,
    pub(super) cq: Arc<dyn Cq>,
    pub(super) pd: Arc<dyn Pd>,
    pub(super) ctx: Arc<dyn Context>,
}

impl End {
    pub(super) fn new(fabric: &Arc<Fabric>, device: &str) -> End {
        let ctx = fabric.verbs(&[device]).open(device).expect("open");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(64).expect("cq");
        let mut buf = vec![0u8; BUF];
        let mr = pd.reg_mr(buf.as_mut_ptr() as usize, BUF, ALL).expect("mr");
        let qp = pd.create_qp(&cq, caps()).expect("qp");
        qp.modify(&init(ALL)).expect("init");
        End {
            qp,
            mr,
            buf,
            cq,
            pd,
            ctx,
        }
    }

    pub(super) fn addr(&self, offset: usize) -> u64 {
        self.mr.addr() + to_u64(offset)
    }

    pub(super) fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        Some(Sge {
            addr: self.addr(offset),
            len,
            lkey: self.mr.lkey(),
        })
    }

    pub(super) fn gid(&self) -> Gid {
        self.ctx.query_gid(1, 1).expect("gid")
    }

    pub(super) fn poll(&self) -> Vec<Completion> {
        self.cq.poll(64).expect("poll")
    }

    pub(super) fn state(&self) -> QpState {
        self.qp.state().expect("state")
    }

    pub(super) fn recv(&self, wr_id: u64, sge: Option<Sge>) {
        self.qp.post_recv(RecvWr { wr_id, sge }).expect("post_recv");
    }
}

pub(super) fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
    }
}

pub(super) fn init(access: Access) -> QpAttr {
    QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        access: Some(access),
        ..QpAttr::default()
    }
}

pub(super) fn state(state: QpState) -> QpAttr {
    QpAttr {
        state: Some(state),
        ..QpAttr::default()
    }
}

/// How two ends are connected.
#[derive(Clone, Copy)]
pub(super) struct Link {
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    /// A's `max_rd_atomic`.
    pub(super) max_rd_atomic: u8,
    /// B's `max_dest_rd_atomic`.
    pub(super) max_dest_rd_atomic: u8,
    pub(super) a_mtu: Mtu,
    pub(super) b_mtu: Mtu,
    /// Added to B's `rq_psn` (24-bit).
    pub(super) b_rq_psn_offset: u32,
}

impl Default for Link {
    fn default() -> Link {
        Link {
            retry_cnt: 6,
            rnr_retry: 7,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            a_mtu: Mtu::Mtu1024,
            b_mtu: Mtu::Mtu1024,
            b_rq_psn_offset: 0,
        }
    }
}

pub(super) fn rtr(peer: &End, rq_psn: u32, mtu: Mtu, max_dest_rd_atomic: u8) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rtr),
        av: Some(roce_av(peer.gid())),
        path_mtu: Some(mtu),
        dest_qp_num: Some(peer.qp.qp_num()),
        rq_psn: Some(rq_psn),
        max_dest_rd_atomic: Some(max_dest_rd_atomic),
        min_rnr_timer: Some(1),
        ..QpAttr::default()
    }
}

pub(super) fn rts(sq_psn: u32, link: Link, max_rd_atomic: u8) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(sq_psn),
        timeout: Some(14),
        retry_cnt: Some(link.retry_cnt),
        rnr_retry: Some(link.rnr_retry),
        max_rd_atomic: Some(max_rd_atomic),
        ..QpAttr::default()
    }
}

/// A (INIT) to RTR and RTS aimed at B; B untouched.
pub(super) fn aim_a(a: &End, b: &End, link: Link) {
    a.qp.modify(&rtr(b, B_SQ_PSN, link.a_mtu, 4))
        .expect("A RTR");
    a.qp.modify(&rts(A_SQ_PSN, link, link.max_rd_atomic))
        .expect("A RTS");
}

/// B (INIT) to RTR and RTS aimed at A.
pub(super) fn aim_b(a: &End, b: &End, link: Link) {
    let rq_psn = A_SQ_PSN.wrapping_add(link.b_rq_psn_offset) & PSN_MASK;
    b.qp.modify(&rtr(a, rq_psn, link.b_mtu, link.max_dest_rd_atomic))
        .expect("B RTR");
    b.qp.modify(&rts(B_SQ_PSN, link, 4)).expect("B RTS");
}

pub(super) fn connect(a: &End, b: &End, link: Link) {
    aim_a(a, b, link);
    aim_b(a, b, link);
}

/// Both ends back through RESET and INIT, then connected again.
pub(super) fn reconnect(a: &End, b: &End, link: Link) {
    for end in [a, b] {
        end.qp.modify(&state(QpState::Reset)).expect("RESET");
        end.qp.modify(&init(ALL)).expect("INIT");
    }
    connect(a, b, link);
}

/// A fabric with devices a (192.0.2.1) and b (192.0.2.2), port MTU 4096.
pub(super) fn fabric() -> Arc<Fabric> {
    let fabric = Fabric::new(Arc::new(Faults::new()), Arc::new(Counters::new()));
    for (name, ip) in [("a", A_IP), ("b", B_IP)] {
        let spec = DeviceSpec {
            port_mtu: Mtu::Mtu4096,
            supports_dmabuf: true,
            ..DeviceSpec::new(name, ip)
        };
        fabric.add_device(spec).expect("device");
    }
    fabric
}

pub(super) fn pair() -> (Arc<Fabric>, End, End) {
    let fabric = fabric();
    let a = End::new(&fabric, "a");
    let b = End::new(&fabric, "b");
    (fabric, a, b)
}

pub(super) fn pattern(buf: &mut [u8], seed: u8) {
    for (byte, n) in buf.iter_mut().zip((0..251u8).cycle()) {
        *byte = seed.wrapping_add(n);
    }
}

pub(super) fn write(a: &End, offset: usize, len: u32, remote: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: remote,
            rkey,
        },
        sge: a.sge(offset, len),
        signaled: true,
    }
}

pub(super) fn write_imm(a: &End, len: u32, remote: u64, rkey: u32, imm: u32) -> SendWr {
    SendWr {
        wr_id: 2,
        op: SendOp::WriteImm {
            remote_addr: remote,
            rkey,
            imm,
        },
        sge: if len == 0 { None } else { a.sge(0, len) },
        signaled: true,
    }
}

pub(super) fn read(a: &End, offset: usize, len: u32, remote: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id: 3,
        op: SendOp::Read {
            remote_addr: remote,
            rkey,
        },
        sge: a.sge(offset, len),
        signaled: true,
    }
}

/// The error of a call that must fail (for results whose value has no
/// `Debug`).
pub(super) fn err_of<T>(result: Result<T>) -> Error {
    match result {
        Ok(_) => panic!("the call succeeded"),
        Err(e) => e,
    }
}

pub(super) fn statuses(c: &[Completion]) -> Vec<WcStatus> {
    c.iter().map(|c| c.status).collect()
}
