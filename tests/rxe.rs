//! Real verbs on Soft-RoCE: run inside the VM lane only (`scripts/vm/lane.sh`
//! builds this with `--features vm-lane` and runs it in a VM where `rxe0`
//! sits on a dummy netdev at 192.0.2.1), or on a host's own RDMA device by
//! the hardware lane (`scripts/hw/run.sh`, which names the device and its
//! address: `tests/common/lane.rs`). Outside the lanes it is not built;
//! inside, a missing device fails every test.

use std::ffi::{c_char, CStr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hipobj::capi::*;
use hipobj::platform::{
    self, Access, AddressVector, Completion, Cq, Mtu, QpAttr, QpCaps, QpState, RecvWr, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};

#[path = "common/lane.rs"]
mod lane;

use lane::device;

/// The index of the device's RoCE v2 GID that carries its IPv4 address
/// (`::ffff:a.b.c.d`): 1 on the VM's rxe0; hardware keeps its own order
/// (a RoCE v1 entry of the same address first, on some).
fn ipv4_gid_index(ctx: &Arc<dyn platform::Context>) -> (u8, platform::Gid) {
    let octets = lane::ipv4().octets();
    let mut found = None;
    for index in 0..=u8::MAX {
        let Ok(gid) = ctx.query_gid(1, index.into()) else {
            break;
        };
        if gid[10..12] != [0xff, 0xff] || gid[12..] != octets {
            continue;
        }
        let kind = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{}/ports/1/gid_attrs/types/{index}",
            device()
        ))
        .unwrap_or_default();
        if kind.trim().eq_ignore_ascii_case("RoCE v2") {
            return (index, gid);
        }
        found.get_or_insert((index, gid));
    }
    found.unwrap_or_else(|| panic!("{} has no GID ::ffff:{}", device(), lane::ip()))
}

// ---------------------------------------------------------------- contract
//
// The platform contract checks (`hipobj_testing::contract`), one test per
// check, from the list `tests/contract.rs` runs against the fakes, here
// against the production verbs, CM and sysfs topology on rxe0.

mod contract {
    use std::time::Duration;

    use hipobj_testing::contract::Env;

    /// Long enough for Soft-RoCE, emulated, to have done what it must not.
    const QUIET: Duration = Duration::from_millis(500);

    fn rxe0() -> Env {
        Env::on(
            &*hipobj::platform::system(),
            super::device(),
            super::lane::ipv4(),
            QUIET,
        )
        .unwrap_or_else(|e| panic!("the production platform: {e}"))
    }

    hipobj_testing::contract_tests!(rxe0);
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
        verbs.device_names().unwrap().contains(&device().to_owned()),
        "the lane has its device"
    );
    let ctx = verbs.open(device()).expect("open the lane's device");
    let port = ctx.query_port(1).expect("port 1");
    let (gid_index, gid) = ipv4_gid_index(&ctx);
    if device() == "rxe0" {
        assert_eq!(gid_index, 1, "the VM's rxe0: GID 1 is ::ffff:192.0.2.1");
    }
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
            sgid_index: gid_index,
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
    let hint = std::ffi::CString::new(device()).unwrap();
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
        assert_eq!(CStr::from_ptr(ip.as_ptr()).to_str().unwrap(), lane::ip());
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

/// The application of the transfer tests below: the server side on a
/// context of its own on rxe0, serving GETs from and PUTs into `store`
/// (registered here), and the library initialized GPU-less on rxe0. Returns
/// the application and the callbacks that reach it.
fn app_serving(
    platform: &std::sync::Arc<dyn hipobj::platform::Platform>,
    store: &mut [u8],
) -> (App, hipObjOps_t) {
    let verbs = platform.verbs().expect("libibverbs");
    let ctx = verbs.open(device()).expect("the server's context");
    let pd = ctx.alloc_pd().expect("PD");
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
    let app = App {
        side: in_process_server(platform, ctx, pd),
        local,
        op: hipobj::server::Op::Get,
        reply: Vec::new(),
    };
    let hint = std::ffi::CString::new(device()).unwrap();
    let mut config = gpu_less_config(&hint);
    // SAFETY: a valid config whose strings outlive the call.
    let init = unsafe { hipObjInit(&mut config) };
    assert_eq!(init.opError, hipObjOpError_t::hipObjSuccess);
    let ops = hipObjOps_t {
        sendRequest: Some(send_request),
        recvReply: Some(recv_reply),
    };
    (app, ops)
}

#[test]
fn get_and_put_move_bytes_over_soft_roce() {
    let platform = platform::system();
    let mut store = vec![0u8; 1 << 20];
    for (i, byte) in store.iter_mut().enumerate() {
        *byte = (i * 7 % 253).to_le_bytes()[0];
    }
    let (mut app, mut ops) = app_serving(&platform, &mut store);
    let mut buf = vec![0u8; 1 << 20];
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

/// The device's count of packets it sent (both sides of every transfer
/// here: the client and the server side share rxe0). The kernel answers
/// from a copy it refreshes at most once per the counters' `lifespan`
/// (milliseconds), so this waits a lifespan first: two reads closer
/// together than that see the same count.
fn sent_packets() -> u64 {
    let sent = lane::sent_packets_file();
    let read = |path: &std::path::Path| -> u64 {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {text:?}: {e}", path.display()))
    };
    let lifespan = sent.with_file_name("lifespan");
    let wait = if lifespan.exists() {
        read(&lifespan)
    } else {
        0
    };
    std::thread::sleep(Duration::from_millis(wait + 20));
    read(&sent)
}

/// The lane boots at a path MTU (`scripts/vm/guest.sh --mtu`: 4096 with a
/// 9000-byte netdev, as RoCE fabrics run, and 1024 with a 1500-byte one):
/// the port runs at it, and whole GETs and PUTs on a kept connection move
/// their data in packets of that size, the server side's CM connection
/// included (a QP left at 1024 would send four times the packets at 4096).
#[test]
fn transfers_move_in_packets_of_the_lanes_path_mtu() {
    let expected: u32 = std::env::var("HIPOBJ_LANE_PATH_MTU")
        .expect("HIPOBJ_LANE_PATH_MTU: set by the lane's guest (scripts/vm/guest.sh)")
        .parse()
        .expect("HIPOBJ_LANE_PATH_MTU is a number");
    let platform = platform::system();
    let port = platform
        .verbs()
        .expect("libibverbs")
        .open(device())
        .expect("a context")
        .query_port(1)
        .expect("port 1");
    assert_eq!(port.active_mtu.bytes(), expected, "the device's active MTU");
    let len = 1usize << 20;
    let mut store: Vec<u8> = (0..len).map(|i| (i * 13 % 251).to_le_bytes()[0]).collect();
    let (mut app, mut ops) = app_serving(&platform, &mut store);
    let mut buf = vec![0u8; len];
    let ctx_ptr: *mut std::ffi::c_void = (&mut app as *mut App).cast();
    let transfer =
        |op: hipobj::server::Op, size: usize, buf: &mut Vec<u8>, ops: &mut hipObjOps_t| {
            // SAFETY: ctx_ptr is the App above, which outlives the call, as
            // do the buffer (registered below) and the ops.
            unsafe {
                (*ctx_ptr.cast::<App>()).op = op;
                let r = match op {
                    hipobj::server::Op::Get => hipObjGet(
                        std::ptr::null_mut(),
                        buf.as_mut_ptr().cast(),
                        size,
                        0,
                        ops,
                        ctx_ptr,
                    ),
                    hipobj::server::Op::Put => hipObjPut(
                        std::ptr::null_mut(),
                        buf.as_ptr().cast(),
                        size,
                        0,
                        ops,
                        ctx_ptr,
                    ),
                };
                assert_eq!(
                    r.opError,
                    hipObjOpError_t::hipObjSuccess,
                    "{op:?} of {size} bytes"
                );
            }
        };
    // SAFETY: the buffer outlives its registration, deregistered below.
    let reg = unsafe { hipObjBufRegisterHost(buf.as_mut_ptr().cast(), len) };
    assert_eq!(reg.opError, hipObjOpError_t::hipObjSuccess);
    // The connection is made by a first small GET, outside the counts.
    transfer(hipobj::server::Op::Get, 4096, &mut buf, &mut ops);
    let data = u64::try_from(len).unwrap() / u64::from(expected);
    for op in [hipobj::server::Op::Get, hipobj::server::Op::Put] {
        let before = sent_packets();
        transfer(op, len, &mut buf, &mut ops);
        let sent = sent_packets() - before;
        // The data's packets, rxe's acknowledgements (one per 64 packets
        // at most) and the proof, grant, final message and their ACKs.
        assert!(
            (data..=data + data / 16 + 32).contains(&sent),
            "{op:?} of {len} bytes at path MTU {expected}: {sent} packets sent, {data} of data"
        );
    }
    assert_eq!(buf, store, "the GET's bytes, PUT back");
    // SAFETY: registered above.
    let dereg = unsafe { hipObjBufDeregister(buf.as_mut_ptr().cast()) };
    assert_eq!(dereg.opError, hipObjOpError_t::hipObjSuccess);
    assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
    // The server side (and its registration of the store) goes first.
    drop(app);
    drop(store);
}

// ---------------------------------------------------------------- hostile servers
//
// The attacks of `tests/hostile.rs` that rxe can show, on real queue pairs:
// one client instance (GPU-less on rxe0) and servers of this process, each
// on a context of its own.

mod hostile {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use hipobj::core::args::{BufferRange, Slice, SyncDirection, TokenOp};
    use hipobj::core::protocol::encode_connect;
    use hipobj::core::token::Token;
    use hipobj::core::transfer::Direction;
    use hipobj::core::{Code, Config, Current, Instance, Options};
    use hipobj::platform::{self, Access, WcStatus};
    use hipobj::server::{ClientQp, DialPolicy, LocalBuf, Op, ServerConfig, ServerSide};
    use hipobj_testing::world::Scripted;

    const LEN: usize = 65536;
    const HALF: usize = LEN / 2;

    /// A server of this process on a context of its own, with a store.
    struct Server {
        side: ServerSide,
        local: LocalBuf,
        store: Box<[u8]>,
    }

    impl Server {
        fn new() -> Server {
            let platform = platform::system();
            let ctx = platform
                .verbs()
                .expect("libibverbs")
                .open(super::device())
                .expect("the lane's device");
            let pd = ctx.alloc_pd().expect("PD");
            let mut store = vec![0u8; LEN].into_boxed_slice();
            let mr = pd
                .reg_mr(store.as_mut_ptr() as usize, LEN, Access::LOCAL_WRITE)
                .expect("the server's MR");
            let config = ServerConfig {
                dial: DialPolicy::any(),
                ..ServerConfig::default()
            };
            let side = ServerSide::with_config(platform.cm().expect("librdmacm"), ctx, pd, config);
            Server {
                side,
                local: LocalBuf {
                    addr: mr.addr(),
                    mr,
                },
                store,
            }
        }

        /// Fills the store (no transfer runs).
        fn fill(&mut self, seed: u8) {
            self.store.copy_from_slice(&pattern(LEN, seed));
        }

        /// The whole protocol for `token`; the reply's text.
        fn serve(&self, token: &Token, op: Op) -> Vec<u8> {
            match self.side.serve(token, op, &self.local, deadline()) {
                Ok(()) => b"200".to_vec(),
                Err(e) => {
                    eprintln!("server: {e}");
                    b"500".to_vec()
                }
            }
        }

        /// One raw WRITE (`Op::Get`) or READ of 64 bytes on this server's
        /// established connection to `client`: how it completed.
        fn probe(
            &self,
            client: &ClientQp,
            op: Op,
            remote_addr: u64,
            rkey: u32,
        ) -> Option<WcStatus> {
            let conn = self.side.connection(client)?;
            let conn = conn.lock();
            hipobj::server::probe(&conn, op, &self.local, remote_addr, rkey, 64, deadline())
        }
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(20)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i ^ (i >> 8) ^ (i >> 11)).to_le_bytes()[0].wrapping_mul(31) ^ seed)
            .collect()
    }

    /// The client: an instance GPU-less on rxe0 with one host buffer.
    struct Client {
        current: Current,
        inst: Arc<Instance>,
        buf: Box<[u8]>,
    }

    impl Client {
        fn new(options: Options) -> Client {
            let current = Current::new();
            let config = Config {
                gpu_device: -1,
                nic_hint: vec![super::device().to_owned()],
                ..Config::default()
            };
            current
                .init_with(platform::system(), config, options)
                .expect("init on the lane's device");
            let inst = current.instance().unwrap();
            let buf = vec![0u8; LEN].into_boxed_slice();
            inst.register(BufferRange::new(buf.as_ptr() as usize, LEN).unwrap(), true)
                .expect("register");
            Client { current, inst, buf }
        }

        fn base(&self) -> usize {
            self.buf.as_ptr() as usize
        }

        fn slice(&self, len: usize) -> Slice {
            Slice::new(self.base(), len, 0).unwrap()
        }

        /// A transfer of the first `len` bytes answered by `answer`.
        fn transfer(
            &self,
            op: Op,
            len: usize,
            answer: impl FnMut(&Token) -> Vec<u8>,
        ) -> hipobj::core::Result<()> {
            let direction = match op {
                Op::Get => Direction::Get,
                Op::Put => Direction::Put,
            };
            self.inst
                .transfer(direction, self.slice(len), &mut Scripted::new(answer))
        }

        /// A GET of `HALF` bytes that `server` serves as it should; the
        /// token it was sent.
        fn served_get(&self, server: &Server, what: &str) -> Token {
            let mut seen = None;
            self.transfer(Op::Get, HALF, |t| {
                seen = Some(*t);
                server.serve(t, Op::Get)
            })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            seen.expect("the server was sent a token")
        }

        /// Waits until every slot is back.
        fn settle(&self) -> bool {
            let until = Instant::now() + Duration::from_secs(20);
            let pool = self.inst.pool();
            while pool.free_count() + pool.retired_count() < pool.total() && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            pool.free_count() + pool.retired_count() == pool.total()
        }
    }

    impl Drop for Client {
        fn drop(&mut self) {
            self.current.shutdown();
        }
    }

    /// The environment's settings (`HIPOBJ_RDMA_DEBUG` says why a connect
    /// request is refused), with four connections.
    fn options() -> Options {
        Options {
            max_transfers: 4,
            completion_timeout: Duration::from_secs(5),
            ..Options::from_env()
        }
    }

    #[test]
    fn the_old_server_of_a_reused_connection_gets_nothing_on_rxe() {
        for op in [Op::Get, Op::Put] {
            for attack in [
                "the new token's rkey",
                "the registration's rkey",
                "a replayed proof",
            ] {
                let what = format!("{op:?} with {attack}");
                let mut client = Client::new(options());
                let mut old = Server::new();
                let mut new = Server::new();
                old.fill(1);
                let first = client.served_get(&old, "the old server's GET");
                new.fill(2);
                let uploaded = pattern(LEN, 3);
                if op == Op::Put {
                    client.buf.copy_from_slice(&uploaded);
                }
                old.fill(4);
                let registration = client.inst.registration_rkey(client.base()).unwrap();
                let mut status = None;
                client
                    .transfer(op, HALF, |t| {
                        assert_eq!(t.qp_num, first.qp_num, "{what}: the reused slot");
                        let key = ClientQp::of(t);
                        status = Some(match attack {
                            "the new token's rkey" => old.probe(&key, op, t.addr, t.rkey),
                            "the registration's rkey" => {
                                old.probe(&key, op, first.addr, registration)
                            }
                            _ => {
                                let conn = old.side.connection(&key).expect("kept");
                                let mut conn = conn.lock();
                                let until = Instant::now() + Duration::from_secs(2);
                                Some(match hipobj::server::prove(&mut conn, &first, until) {
                                    Ok(()) => WcStatus::Success,
                                    Err(_) => WcStatus::RemAccessErr,
                                })
                            }
                        });
                        new.serve(t, op)
                    })
                    .unwrap_or_else(|e| panic!("{what}: the transfer failed: {e}"));
                assert_ne!(
                    status.unwrap(),
                    Some(WcStatus::Success),
                    "{what}: it worked"
                );
                match op {
                    Op::Get => assert!(client.buf[..HALF] == new.store[..HALF], "{what}"),
                    Op::Put => {
                        assert!(
                            old.store[..] == pattern(LEN, 4)[..],
                            "{what}: read by the old"
                        );
                        assert!(new.store[..HALF] == uploaded[..HALF], "{what}");
                    }
                }
                assert!(client.settle(), "{what}");
                old.fill(5);
                client
                    .transfer(Op::Get, HALF, |t| old.serve(t, Op::Get))
                    .unwrap_or_else(|e| panic!("{what}: afterwards: {e}"));
                assert!(client.buf[..HALF] == old.store[..HALF], "{what}");
            }
        }
    }

    #[test]
    fn a_used_token_connects_nobody_and_a_hijacker_is_refused_on_rxe() {
        let client = Client::new(options());
        let mut server = Server::new();
        let hijacker = Server::new();
        server.fill(6);
        let used = client.served_get(&server, "a GET");
        assert!(server
            .side
            .connect_with(&used, &encode_connect(&used), deadline())
            .is_err());
        let token = client
            .inst
            .mint_token(client.slice(HALF), TokenOp::Get)
            .unwrap();
        let mut session = server
            .side
            .begin(&token, None, deadline())
            .expect("granted");
        assert!(
            hijacker
                .side
                .connect_with(&token, &encode_connect(&token), deadline())
                .is_err(),
            "a second connect request with the token was accepted"
        );
        session
            .write(&server.local, 0, 0, HALF as u64)
            .expect("undisturbed");
        session.finish().expect("the final message");
        assert!(client.settle());
        assert!(client.buf[..HALF] == server.store[..HALF]);
    }

    #[test]
    fn a_window_limits_the_direction_the_registration_and_on_hardware_the_range() {
        let client = Client::new(options());
        let server = Server::new();
        // A GET's window refuses a READ.
        let token = client
            .inst
            .mint_token(client.slice(HALF), TokenOp::Get)
            .unwrap();
        let mut session = server.side.begin(&token, None, deadline()).unwrap();
        assert!(
            session.read(&server.local, 0, 0, 64).is_err(),
            "a READ through a GET's window"
        );
        drop(session);
        assert!(client.settle());
        // The registration's rkey reaches nothing.
        let token = client
            .inst
            .mint_token(client.slice(HALF), TokenOp::Get)
            .unwrap();
        let mut session = server.side.begin(&token, None, deadline()).unwrap();
        let rkey = client.inst.registration_rkey(client.base()).unwrap();
        assert!(session
            .data_unchecked(Op::Get, token.addr, rkey, &server.local, 0, 64)
            .is_err());
        drop(session);
        assert!(client.settle());
        // rxe does not enforce a type-2 window's range (rxe_resp.c checks
        // the registration's bounds, not the window's): a WRITE past the
        // range but inside the buffer's registration lands there. A
        // hardware NIC (the hardware lane, scripts/hw/run.sh) must refuse
        // it, and nothing may land; the fake fabric does the same.
        let token = client
            .inst
            .mint_token(client.slice(HALF), TokenOp::Get)
            .unwrap();
        let before = client.buf[HALF..HALF + 64].to_vec();
        let mut session = server.side.begin(&token, None, deadline()).unwrap();
        let past = session.data_unchecked(
            Op::Get,
            token.addr + HALF as u64,
            token.rkey,
            &server.local,
            0,
            64,
        );
        if super::device().starts_with("rxe") {
            assert!(
                past.is_ok(),
                "rxe refused a WRITE past the window: it now enforces the range"
            );
            session.finish().unwrap();
        } else {
            assert!(
                past.is_err(),
                "{} let a WRITE past the window's range through",
                super::device()
            );
            drop(session);
        }
        assert!(client.settle());
        if !super::device().starts_with("rxe") {
            assert!(
                client.buf[HALF..HALF + 64] == before[..],
                "bytes past the range changed on {}",
                super::device()
            );
        }
    }

    #[test]
    fn access_ends_with_the_transfer_on_rxe() {
        let client = Client::new(options());
        let mut server = Server::new();
        server.fill(7);
        let token = client.served_get(&server, "a GET");
        // On its kept connection, the server writes with the ended token.
        let status = server.probe(&ClientQp::of(&token), Op::Get, token.addr, token.rkey);
        assert_ne!(
            status,
            Some(WcStatus::Success),
            "the window was still bound"
        );
        // A server that never sends its final message: the transfer fails
        // at its deadline, and the access is gone.
        let short = Client::new(Options {
            completion_timeout: Duration::from_millis(300),
            ..options()
        });
        drop(client);
        let mut seen = None;
        let failed = short.transfer(Op::Get, HALF, |t| {
            seen = Some(*t);
            let mut session = server.side.begin(t, None, deadline()).expect("granted");
            session.write(&server.local, 0, 0, 64).expect("data");
            session.abandon();
            b"200".to_vec()
        });
        assert_eq!(failed.unwrap_err().code(), Code::Rdma);
        let token = seen.unwrap();
        let status = server.probe(&ClientQp::of(&token), Op::Get, token.addr, token.rkey);
        assert_ne!(
            status,
            Some(WcStatus::Success),
            "access outlived a failed transfer"
        );
        assert!(short.settle());
        // The client is usable.
        server.fill(8);
        short
            .transfer(Op::Get, HALF, |t| server.serve(t, Op::Get))
            .expect("afterwards");
        assert!(short.buf[..HALF] == server.store[..HALF]);
        let sync = short
            .inst
            .buf_sync(short.slice(HALF), SyncDirection::ToDevice);
        assert!(sync.is_ok());
    }

    #[test]
    fn bad_connect_requests_do_not_fail_a_waiting_transfer_on_rxe() {
        // Fewer than the wrong proofs a waiting transfer tolerates
        // (MAX_WRONG_PROOFS, 64): past them the client ends the transfer
        // on purpose (tests/hostile.rs covers that limit).
        const FLOOD: usize = 60;
        const THREADS: usize = 4;
        let client = Client::new(options());
        let server = Server::new();
        let waiting = client
            .inst
            .mint_token(client.slice(HALF), TokenOp::Get)
            .unwrap();
        let start = Instant::now();
        let refused = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (server, refused) = (&server, &refused);
                s.spawn(move || {
                    for i in 0..FLOOD / THREADS {
                        let guess = Token {
                            secret: u32::try_from(t * FLOOD + i).unwrap(),
                            ..waiting
                        };
                        if server
                            .side
                            .connect_with(&waiting, &encode_connect(&guess), deadline())
                            .is_err()
                        {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(
                server.serve(&waiting, Op::Get),
                b"200",
                "the transfer failed"
            );
        });
        assert_eq!(refused.into_inner(), FLOOD, "every guess was refused");
        eprintln!(
            "rxe: {FLOOD} bad connect requests from {THREADS} threads in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        assert!(client.settle());
        assert!(client.buf[..HALF] == server.store[..HALF]);
    }

    #[test]
    fn a_pool_of_1024_connections_fits_the_default_descriptor_limit_on_rxe() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-struct.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        assert_eq!(read, 0);
        let saved = limit;
        limit.rlim_cur = 1024.min(limit.rlim_max);
        // SAFETY: a valid limit (the soft one at most the hard one).
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        let outcome = std::panic::catch_unwind(|| {
            let client = Client::new(Options {
                max_transfers: 1024,
                ..options()
            });
            assert_eq!(client.inst.pool().total(), 1024);
            let mut server = Server::new();
            server.fill(9);
            for _ in 0..4 {
                client
                    .transfer(Op::Get, HALF, |t| server.serve(t, Op::Get))
                    .expect("a GET with 1024 connections");
            }
            assert!(client.buf[..HALF] == server.store[..HALF]);
        });
        // SAFETY: the limit read above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &saved) };
        if let Err(e) = outcome {
            std::panic::resume_unwind(e);
        }
    }
}
