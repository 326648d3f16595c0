//! Real verbs on Soft-RoCE: run inside the VM lane only (`scripts/vm/lane.sh`
//! builds this with `--features vm-lane` and runs it in a VM where `rxe0`
//! sits on a dummy netdev at 192.0.2.1). Outside the lane it is not built;
//! inside, a missing device fails every test.

use std::ffi::{c_char, CStr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hipobj::capi::*;
use hipobj::platform::{
    self, Access, AddressVector, Completion, Cq, Mtu, QpAttr, QpCaps, QpState, RecvWr, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};

const DEVICE: &str = "rxe0";

// ---------------------------------------------------------------- contract
//
// The platform contract checks (`hipobj::testing::contract`), one test per
// check, from the list `tests/contract.rs` runs against the fakes, here
// against the production verbs, CM and sysfs topology on rxe0.

mod contract {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use hipobj::testing::contract::Env;

    /// rxe0's address in the lane's VM.
    const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    /// Long enough for Soft-RoCE, emulated, to have done what it must not.
    const QUIET: Duration = Duration::from_millis(500);

    fn rxe0() -> Env {
        Env::on(&*hipobj::platform::system(), super::DEVICE, IP, QUIET)
            .unwrap_or_else(|e| panic!("the production platform: {e}"))
    }

    hipobj::contract_tests!(rxe0);
}

// ---------------------------------------------------------------- end of contract

/// A configuration for the current GPU, or none, with `hint` as the NIC.
fn gpu_less_config(hint: &std::ffi::CStr) -> hipObjConfig_t {
    hipObjConfig_t {
        endpoint: std::ptr::null(),
        region: std::ptr::null(),
        accessKey: std::ptr::null(),
        secretKey: std::ptr::null(),
        flags: 0,
        gpuDevice: -1,
        nicHint: hint.as_ptr(),
    }
}

fn wait_for(cq: &Arc<dyn Cq>, what: &str) -> Completion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = cq.poll(1).expect("poll").into_iter().next() {
            return c;
        }
        assert!(
            cq.wait(deadline).expect("wait"),
            "no completion for {what} within 10 s"
        );
    }
}

#[test]
fn verbs_objects_move_bytes_between_two_queue_pairs() {
    let verbs = platform::system().verbs().expect("libibverbs");
    assert!(
        verbs.device_names().unwrap().contains(&DEVICE.to_owned()),
        "the lane has rxe0"
    );
    let ctx = verbs.open(DEVICE).expect("open rxe0");
    let port = ctx.query_port(1).expect("port 1");
    let gid = ctx.query_gid(1, 1).expect("GID 1");
    assert_eq!(
        &gid[10..],
        &[0xff, 0xff, 192, 0, 2, 1],
        "GID 1 is ::ffff:192.0.2.1"
    );
    let pd = ctx.alloc_pd().expect("PD");
    let (cq_a, cq_b) = (
        ctx.create_cq(16).expect("CQ"),
        ctx.create_cq(16).expect("CQ"),
    );
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let (a, b) = (
        pd.create_qp(&cq_a, caps).expect("QP"),
        pd.create_qp(&cq_b, caps).expect("QP"),
    );
    let mut src = vec![0u8; 65536];
    for (i, byte) in src.iter_mut().enumerate() {
        *byte = (i % 251).to_le_bytes()[0];
    }
    let mut dst = vec![0u8; 65536];
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr_src = pd
        .reg_mr(src.as_mut_ptr() as usize, src.len(), all)
        .expect("MR");
    let mr_dst = pd
        .reg_mr(dst.as_mut_ptr() as usize, dst.len(), all)
        .expect("MR");
    for (qp, peer) in [(&a, b.qp_num()), (&b, a.qp_num())] {
        qp.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(all),
            ..QpAttr::default()
        })
        .expect("INIT");
        let av = AddressVector {
            dgid: gid,
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            port: 1,
            sl: 0,
            is_global: true,
            dlid: 0,
        };
        qp.modify(&QpAttr {
            state: Some(QpState::Rtr),
            av: Some(av),
            path_mtu: Some(port.active_mtu.min(Mtu::Mtu1024)),
            dest_qp_num: Some(peer),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(1),
            ..QpAttr::default()
        })
        .expect("RTR");
        qp.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(6),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        })
        .expect("RTS");
        assert_eq!(qp.state().unwrap(), QpState::Rts);
    }
    b.post_recv(RecvWr {
        wr_id: 7,
        sge: None,
    })
    .expect("post_recv");
    let write = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: mr_dst.addr(),
            rkey: mr_dst.rkey(),
        },
        sge: Some(Sge {
            addr: mr_src.addr(),
            len: 65536,
            lkey: mr_src.lkey(),
        }),
        signaled: false,
    };
    let fin = SendWr {
        wr_id: 2,
        op: SendOp::SendImm { imm: 0xfeed_f00d },
        sge: None,
        signaled: true,
    };
    a.post_send(&[write, fin]).expect("post_send");
    let sent = wait_for(&cq_a, "the SEND");
    assert_eq!((sent.wr_id, sent.status), (2, WcStatus::Success));
    let got = wait_for(&cq_b, "the receive");
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.imm),
        (7, WcStatus::Success, WcOpcode::Recv, Some(0xfeed_f00d))
    );
    assert_eq!(dst, src, "the WRITE landed before the SEND completed");
    // And a READ back into a cleared source.
    src.iter_mut().for_each(|b| *b = 0);
    let read = SendWr {
        wr_id: 3,
        op: SendOp::Read {
            remote_addr: mr_dst.addr(),
            rkey: mr_dst.rkey(),
        },
        sge: Some(Sge {
            addr: mr_src.addr(),
            len: 65536,
            lkey: mr_src.lkey(),
        }),
        signaled: true,
    };
    a.post_send(&[read]).expect("post READ");
    let r = wait_for(&cq_a, "the READ");
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (3, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(src, dst);
    // Type-2 windows allocate on rxe.
    assert!(ctx.supports_mw());
    drop(pd.alloc_mw().expect("MW"));
}

#[test]
fn the_library_initializes_on_soft_roce_without_a_gpu() {
    let hint = std::ffi::CString::new(DEVICE).unwrap();
    let mut config = gpu_less_config(&hint);
    // SAFETY: a valid config whose strings outlive the call.
    let init = unsafe { hipObjInit(&mut config) };
    assert_eq!(
        (init.opError, init.hipError),
        (hipObjOpError_t::hipObjSuccess, 0)
    );
    let mut buf = vec![0u8; 1 << 20];
    let mut token: *mut c_char = std::ptr::null_mut();
    let mut ip = [0 as c_char; 16];
    // SAFETY: a valid buffer, out-pointer and token.
    unsafe {
        assert_eq!(
            hipObjBufRegisterHost(buf.as_mut_ptr().cast(), buf.len()).opError,
            hipObjOpError_t::hipObjSuccess
        );
        assert_eq!(
            hipObjGetRdmaToken(
                buf.as_ptr().cast(),
                buf.len(),
                HIPOBJ_RDMA_OP_GET,
                &mut token
            )
            .opError,
            hipObjOpError_t::hipObjSuccess
        );
        assert_eq!(
            hipObjTokenClientNic(token, ip.as_mut_ptr(), 16).opError,
            hipObjOpError_t::hipObjSuccess
        );
        assert_eq!(CStr::from_ptr(ip.as_ptr()).to_str().unwrap(), "192.0.2.1");
        assert!(CStr::from_ptr(token).to_bytes().starts_with(b"02"));
        assert_eq!(
            hipObjPutRdmaToken(token).opError,
            hipObjOpError_t::hipObjSuccess
        );
    }
    assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
    // Shut down, the token's lease is gone with the instance; init again works.
    // SAFETY: as above.
    let again = unsafe { hipObjInit(&mut config) };
    assert_eq!(again.opError, hipObjOpError_t::hipObjSuccess);
    assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
}

/// The server side of the protocol in this process, on `ctx`: it serves
/// tokens of this process's instance, whose address it may dial.
fn in_process_server(
    platform: &std::sync::Arc<dyn hipobj::platform::Platform>,
    ctx: std::sync::Arc<dyn hipobj::platform::Context>,
    pd: std::sync::Arc<dyn hipobj::platform::Pd>,
) -> hipobj::server::ServerSide {
    let config = hipobj::server::ServerConfig {
        dial: hipobj::server::DialPolicy::any(),
        ..hipobj::server::ServerConfig::default()
    };
    hipobj::server::ServerSide::with_config(platform.cm().expect("librdmacm"), ctx, pd, config)
}

/// The application's S3 client in this test: the server side of the
/// protocol on a second context of the same rxe0, in process.
struct App {
    side: hipobj::server::ServerSide,
    local: hipobj::server::LocalBuf,
    op: hipobj::server::Op,
    reply: Vec<u8>,
}

unsafe extern "C" fn send_request(
    ctx: *mut std::ffi::c_void,
    token: *const c_char,
    len: usize,
) -> std::ffi::c_int {
    // SAFETY: ctx is the &mut App this test passes; token has `len` bytes.
    let (app, text) = unsafe {
        (
            &mut *ctx.cast::<App>(),
            std::slice::from_raw_parts(token.cast::<u8>(), len),
        )
    };
    let token = hipobj::core::token::Token::parse_hex(text).expect("a token");
    let deadline = Instant::now() + Duration::from_secs(10);
    app.reply = match app.side.serve(&token, app.op, &app.local, deadline) {
        Ok(()) => b"200".to_vec(),
        Err(e) => {
            eprintln!("server: {e}");
            b"500".to_vec()
        }
    };
    0
}

unsafe extern "C" fn recv_reply(
    ctx: *mut std::ffi::c_void,
    reply: *mut c_char,
    len: *mut usize,
) -> std::ffi::c_int {
    // SAFETY: as above; `reply` has `*len` (512) writable bytes.
    unsafe {
        let app = &mut *ctx.cast::<App>();
        std::ptr::copy_nonoverlapping(app.reply.as_ptr(), reply.cast::<u8>(), app.reply.len());
        *len = app.reply.len();
    }
    0
}

#[test]
fn get_and_put_move_bytes_over_soft_roce() {
    let platform = platform::system();
    let verbs = platform.verbs().expect("libibverbs");
    let ctx = verbs.open(DEVICE).expect("the server's context");
    let pd = ctx.alloc_pd().expect("PD");
    let mut store = vec![0u8; 1 << 20];
    for (i, byte) in store.iter_mut().enumerate() {
        *byte = (i * 7 % 253).to_le_bytes()[0];
    }
    let mr = pd
        .reg_mr(
            store.as_mut_ptr() as usize,
            store.len(),
            Access::LOCAL_WRITE,
        )
        .expect("server MR");
    let local = hipobj::server::LocalBuf {
        addr: mr.addr(),
        mr,
    };
    let side = in_process_server(&platform, ctx, pd);
    let mut app = App {
        side,
        local,
        op: hipobj::server::Op::Get,
        reply: Vec::new(),
    };

    let hint = std::ffi::CString::new(DEVICE).unwrap();
    let mut config = gpu_less_config(&hint);
    // SAFETY: a valid config whose strings outlive the call.
    let init = unsafe { hipObjInit(&mut config) };
    assert_eq!(init.opError, hipObjOpError_t::hipObjSuccess);
    let mut buf = vec![0u8; 1 << 20];
    let mut ops = hipObjOps_t {
        sendRequest: Some(send_request),
        recvReply: Some(recv_reply),
    };
    let ctx_ptr: *mut std::ffi::c_void = (&mut app as *mut App).cast();
    // SAFETY: the buffer, ops and ctx outlive every call below.
    unsafe {
        assert_eq!(
            hipObjBufRegisterHost(buf.as_mut_ptr().cast(), buf.len()).opError,
            hipObjOpError_t::hipObjSuccess
        );
        for round in 0..5 {
            let r = hipObjGet(
                std::ptr::null_mut(),
                buf.as_mut_ptr().cast(),
                65536,
                4096,
                &mut ops,
                ctx_ptr,
            );
            assert_eq!(
                r.opError,
                hipObjOpError_t::hipObjSuccess,
                "GET round {round}"
            );
        }
    }
    assert_eq!(
        &buf[4096..4096 + 65536],
        &store[..65536],
        "the GET landed at its offset"
    );
    assert!(
        buf[..4096].iter().all(|b| *b == 0),
        "nothing before the range"
    );
    assert_eq!(app.side.connection_count(), 1, "five GETs, one connection");
    // PUT the whole MiB back into a cleared store.
    for (i, byte) in buf.iter_mut().enumerate() {
        *byte = (i % 241).to_le_bytes()[0];
    }
    app.op = hipobj::server::Op::Put;
    // SAFETY: as above. The store is only written by the server's READ.
    unsafe {
        let r = hipObjPut(
            std::ptr::null_mut(),
            buf.as_ptr().cast(),
            buf.len(),
            0,
            &mut ops,
            ctx_ptr,
        );
        assert_eq!(r.opError, hipObjOpError_t::hipObjSuccess, "PUT");
        assert_eq!(
            hipObjBufDeregister(buf.as_mut_ptr().cast()).opError,
            hipObjOpError_t::hipObjSuccess
        );
    }
    assert_eq!(store, buf, "the PUT's bytes are at the server");
    assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
}
