//! The exported C functions on an instance of the fake platform: every
//! argument rule in its order (no callback is called on a rejected call),
//! whole transfers through `hipObjOps_t` callbacks, and the
//! application-driven path. The process-wide instance is shared, so the
//! tests take turns.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hipobj::capi::*;
use hipobj::core::{Code, Config, Options, CURRENT};
use hipobj::server::Op;
use hipobj_testing::world::{TestServer, World};
use parking_lot::Mutex;

static TURN: Mutex<()> = Mutex::new(());

/// What the callbacks see through `ctx`.
struct App {
    server: Arc<TestServer>,
    op: Op,
    reply: Vec<u8>,
    calls: AtomicUsize,
}

unsafe extern "C" fn send_request(ctx: *mut c_void, token: *const c_char, len: usize) -> c_int {
    // SAFETY: ctx is the &mut App the test passed with these callbacks.
    let app = unsafe { &mut *ctx.cast::<App>() };
    app.calls.fetch_add(1, Ordering::SeqCst);
    assert_eq!(len, 88);
    // SAFETY: the library passes 88 digits and a NUL.
    let text = unsafe { CStr::from_ptr(token) }.to_bytes();
    assert_eq!(text.len(), 88);
    app.reply = app.server.handle(text, app.op);
    0
}

unsafe extern "C" fn recv_reply(ctx: *mut c_void, reply: *mut c_char, len: *mut usize) -> c_int {
    // SAFETY: as above; `reply` holds `*len` (512) writable bytes.
    let app = unsafe { &mut *ctx.cast::<App>() };
    app.calls.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the library passes a valid length pointer.
    unsafe {
        assert_eq!(*len, 512);
        std::ptr::copy_nonoverlapping(app.reply.as_ptr(), reply.cast::<u8>(), app.reply.len());
        *len = app.reply.len();
    }
    0
}

unsafe extern "C" fn failing_send(_: *mut c_void, _: *const c_char, _: usize) -> c_int {
    7
}

const OPS: hipObjOps_t = hipObjOps_t {
    sendRequest: Some(send_request),
    recvReply: Some(recv_reply),
};

struct Session {
    world: World,
    _turn: parking_lot::MutexGuard<'static, ()>,
}

impl Session {
    fn start() -> Session {
        let turn = TURN.lock();
        let world = World::new();
        let options = Options {
            completion_timeout: Duration::from_millis(300),
            ..Options::default()
        };
        CURRENT
            .init_with(
                world.platform(),
                Config {
                    gpu_device: 0,
                    ..Config::default()
                },
                options,
            )
            .unwrap();
        Session { world, _turn: turn }
    }

    fn app(&self, op: Op) -> App {
        App {
            server: self.world.server.clone(),
            op,
            reply: Vec::new(),
            calls: AtomicUsize::new(0),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        assert_eq!(hipObjShutdown().opError, hipObjOpError_t::hipObjSuccess);
    }
}

fn code(e: hipObjError_t) -> hipObjOpError_t {
    e.opError
}

use hipObjOpError_t::*;

fn get(
    ptr: *mut u8,
    size: usize,
    offset: i64,
    ops: *mut hipObjOps_t,
    app: &mut App,
) -> hipObjOpError_t {
    // SAFETY: ops is NULL or a valid table whose callbacks take an App.
    code(unsafe {
        hipObjGet(
            std::ptr::null_mut(),
            ptr.cast(),
            size,
            offset,
            ops,
            (app as *mut App).cast(),
        )
    })
}

fn put(
    ptr: *mut u8,
    size: usize,
    offset: i64,
    ops: *mut hipObjOps_t,
    app: &mut App,
) -> hipObjOpError_t {
    // SAFETY: as in `get`.
    code(unsafe {
        hipObjPut(
            std::ptr::null_mut(),
            ptr.cast(),
            size,
            offset,
            ops,
            (app as *mut App).cast(),
        )
    })
}

#[test]
fn transfer_arguments_are_checked_in_order_before_any_callback() {
    let s = Session::start();
    let mut buf = vec![0u8; 4096];
    let p = buf.as_mut_ptr();
    // SAFETY: a valid buffer of 4096 bytes.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        code(unsafe { hipObjBufRegisterHost(p.cast(), 4096) }),
        hipObjSuccess
    );
    let mut app = s.app(Op::Get);
    let mut ops = OPS;
    let mut no_send = hipObjOps_t {
        sendRequest: None,
        ..OPS
    };
    let mut no_recv = hipObjOps_t {
        recvReply: None,
        ..OPS
    };
    let cases: Vec<(*mut u8, usize, i64, *mut hipObjOps_t, hipObjOpError_t)> = vec![
        (p, 4096, 0, std::ptr::null_mut(), hipObjInvalidValue),
        (
            std::ptr::null_mut(),
            0,
            -1,
            std::ptr::null_mut(),
            hipObjInvalidValue,
        ),
        (p, 4096, 0, &mut no_send, hipObjInvalidValue),
        (p, 4096, 0, &mut no_recv, hipObjInvalidValue),
        (std::ptr::null_mut(), 4096, 0, &mut ops, hipObjInvalidValue),
        (p, 0, 0, &mut ops, hipObjInvalidValue),
        (p, 1, -1, &mut ops, hipObjInvalidValue),
        // SAFETY-free arithmetic: an address inside the buffer, not its base.
        (p.wrapping_add(1), 1, 0, &mut ops, hipObjBufNotRegistered),
        (p, 4097, 0, &mut ops, hipObjInvalidValue),
        (p, 1, 4096, &mut ops, hipObjInvalidValue),
        (p, usize::MAX, i64::MAX, &mut ops, hipObjInvalidValue),
    ];
    for (ptr, size, offset, ops, expected) in cases {
        assert_eq!(
            get(ptr, size, offset, ops, &mut app),
            expected,
            "get({size}, {offset})"
        );
        assert_eq!(
            put(ptr, size, offset, ops, &mut app),
            expected,
            "put({size}, {offset})"
        );
    }
    assert_eq!(
        app.calls.load(Ordering::SeqCst),
        0,
        "no callback on a rejected call"
    );
    // A failing sendRequest is an S3 error, and the library stays usable.
    let mut failing = hipObjOps_t {
        sendRequest: Some(failing_send),
        ..OPS
    };
    assert_eq!(get(p, 4096, 0, &mut failing, &mut app), hipObjS3Error);
    s.world.server.set_object(&[9u8; 4096]);
    assert_eq!(get(p, 4096, 0, &mut ops, &mut app), hipObjSuccess);
    assert_eq!(buf, vec![9u8; 4096]);
}

#[test]
fn register_deregister_and_sync_rules() {
    let _s = Session::start();
    let mut buf = vec![0u8; 8192];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: (all calls below) `p` is a valid buffer, other pointers are
    // NULL or addresses that are only compared.
    unsafe {
        assert_eq!(
            code(hipObjBufRegister(std::ptr::null_mut(), 1)),
            hipObjInvalidValue
        );
        assert_eq!(code(hipObjBufRegister(p, 0)), hipObjInvalidValue);
        assert_eq!(
            code(hipObjBufRegister(p, (1 << 32) + 1)),
            hipObjSizeTooLarge
        );
        assert_eq!(
            code(hipObjBufRegister(usize::MAX as *mut c_void, 2)),
            hipObjInvalidValue
        );
        assert_eq!(code(hipObjBufRegister(p, 8192)), hipObjSuccess);
        assert_eq!(code(hipObjBufRegister(p, 8192)), hipObjBufAlreadyRegistered);
        assert_eq!(
            code(hipObjBufRegisterHost(p, 16)),
            hipObjBufAlreadyRegistered
        );
        assert_eq!(code(hipObjBufSync(p, 8192, 0, 2)), hipObjInvalidValue);
        assert_eq!(
            code(hipObjBufSync(std::ptr::null_mut(), 8192, 0, 7)),
            hipObjInvalidValue,
            "direction first"
        );
        assert_eq!(
            code(hipObjBufSync(p, 8192, 0, HIPOBJ_SYNC_TO_HOST)),
            hipObjSuccess,
            "not staged: no-op"
        );
        assert_eq!(
            code(hipObjBufSync(p, 1, 8192, HIPOBJ_SYNC_TO_DEVICE)),
            hipObjInvalidValue
        );
        assert_eq!(
            code(hipObjBufDeregister(std::ptr::null_mut())),
            hipObjInvalidValue
        );
        assert_eq!(
            code(hipObjBufDeregister(p.cast::<u8>().add(1).cast())),
            hipObjBufNotRegistered
        );
        assert_eq!(code(hipObjBufDeregister(p)), hipObjSuccess);
        assert_eq!(code(hipObjBufDeregister(p)), hipObjBufNotRegistered);
    }
}

#[test]
fn get_and_put_through_the_callbacks_are_byte_exact() {
    let s = Session::start();
    let gpu = &s.world.platform.gpu;
    let alloc = gpu.alloc_device(0, 1 << 16).unwrap();
    let dev = alloc.addr() as *mut u8;
    // SAFETY: fake device memory is this process's memory.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        code(unsafe { hipObjBufRegister(dev.cast(), 1 << 16) }),
        hipObjSuccess
    );
    let object: Vec<u8> = (0..1u32 << 16)
        .map(|i| (i % 251).to_le_bytes()[0])
        .collect();
    s.world.server.set_object(&object);
    let mut ops = OPS;
    let mut app = s.app(Op::Get);
    // The second half of the object lands in the second half of the buffer.
    assert_eq!(
        get(dev, 1 << 15, 1 << 15, &mut ops, &mut app),
        hipObjSuccess
    );
    assert_eq!(
        gpu.read(alloc.addr() + (1 << 15), 1 << 15).unwrap(),
        object[..1 << 15]
    );
    let mut app = s.app(Op::Put);
    gpu.write(alloc.addr(), &object).unwrap();
    assert_eq!(put(dev, 1 << 16, 0, &mut ops, &mut app), hipObjSuccess);
    assert_eq!(s.world.server.object(1 << 16), object);
    // SAFETY: registered above.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        code(unsafe { hipObjBufDeregister(dev.cast()) }),
        hipObjSuccess
    );
}

#[test]
fn application_driven_token_sync_and_release() {
    let s = Session::start();
    let mut buf = vec![0u8; 4096];
    let p = buf.as_mut_ptr().cast::<c_void>();
    let mut token: *mut c_char = std::ptr::null_mut();
    // SAFETY: valid buffer and out-pointer.
    unsafe {
        assert_eq!(code(hipObjBufRegisterHost(p, 4096)), hipObjSuccess);
        assert_eq!(
            code(hipObjGetRdmaToken(p, 4096, 2, &mut token)),
            hipObjInvalidValue
        );
        assert_eq!(
            code(hipObjGetRdmaToken(
                p,
                4096,
                HIPOBJ_RDMA_OP_GET,
                std::ptr::null_mut()
            )),
            hipObjInvalidValue
        );
        assert_eq!(
            code(hipObjGetRdmaToken(p, 4097, HIPOBJ_RDMA_OP_GET, &mut token)),
            hipObjInvalidValue
        );
        assert!(token.is_null(), "untouched on errors");
        assert_eq!(
            code(hipObjGetRdmaToken(p, 4096, HIPOBJ_RDMA_OP_GET, &mut token)),
            hipObjSuccess
        );
    }
    // SAFETY: the library returned a NUL-terminated token.
    let text = unsafe { CStr::from_ptr(token) }.to_bytes().to_vec();
    assert_eq!(text.len(), 88);
    assert!(text.starts_with(b"02"), "an RC-through-CM token");
    let mut ip = [0 as c_char; 16];
    // SAFETY: valid token and buffer.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        code(unsafe { hipObjTokenClientNic(token, ip.as_mut_ptr(), 16) }),
        hipObjSuccess
    );
    // SAFETY: NUL-terminated by the call.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        unsafe { CStr::from_ptr(ip.as_ptr()) }.to_str().unwrap(),
        "192.0.2.1"
    );
    s.world.server.set_object(&[0x42; 4096]);
    assert_eq!(s.world.server.handle(&text, Op::Get), b"200");
    // SAFETY: registered buffer; the token came from hipObjGetRdmaToken.
    unsafe {
        assert_eq!(
            code(hipObjBufSync(p, 4096, 0, HIPOBJ_SYNC_TO_DEVICE)),
            hipObjSuccess
        );
        assert_eq!(code(hipObjPutRdmaToken(token)), hipObjSuccess);
        assert_eq!(code(hipObjBufDeregister(p)), hipObjSuccess);
    }
    assert_eq!(buf, vec![0x42; 4096]);
}

#[test]
fn shutdown_makes_every_call_not_initialized_and_a_new_instance_works() {
    let s = Session::start();
    let mut buf = vec![0u8; 64];
    let p = buf.as_mut_ptr();
    // SAFETY: valid buffer.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        code(unsafe { hipObjBufRegisterHost(p.cast(), 64) }),
        hipObjSuccess
    );
    assert_eq!(hipObjShutdown().opError, hipObjSuccess);
    let mut ops = OPS;
    let mut app = s.app(Op::Get);
    assert_eq!(get(p, 64, 0, &mut ops, &mut app), hipObjNotInitialized);
    // SAFETY: compared only.
    assert_eq!(
        // SAFETY: the test's own buffers and tables; other pointers are NULL or only compared.
        code(unsafe { hipObjBufDeregister(p.cast()) }),
        hipObjNotInitialized
    );
    CURRENT
        .init_with(
            s.world.platform(),
            Config {
                gpu_device: 0,
                ..Config::default()
            },
            Options::default(),
        )
        .unwrap();
    // The new instance starts with no buffer.
    assert_eq!(get(p, 64, 0, &mut ops, &mut app), hipObjBufNotRegistered);
}

/// The original's clients mint a token, try their server and, when it
/// declines, release the token and deregister the buffer at once. The
/// release only frees the string (they also release a token before its
/// request is sent); the deregistration ends the token.
#[test]
fn a_released_token_keeps_its_connection_and_deregistration_ends_tokens() {
    let s = Session::start();
    let mut buf = vec![0u8; 4096];
    let p = buf.as_mut_ptr().cast::<c_void>();
    let free = || CURRENT.instance().unwrap().pool().free_count();
    let all = free();
    let mut token: *mut c_char = std::ptr::null_mut();
    // SAFETY: valid buffer and out-pointer; the token is released once.
    unsafe {
        assert_eq!(code(hipObjBufRegisterHost(p, 4096)), hipObjSuccess);
        assert_eq!(
            code(hipObjGetRdmaToken(p, 4096, HIPOBJ_RDMA_OP_PUT, &mut token)),
            hipObjSuccess
        );
        assert_eq!(free(), all - 1);
        // The server declined (501): the application releases the token,
        // which ends nothing...
        assert_eq!(code(hipObjPutRdmaToken(token)), hipObjSuccess);
        assert_eq!(free(), all - 1, "the release ended the token");
        // ...and deregisters the buffer, which does.
        assert_eq!(code(hipObjBufDeregister(p)), hipObjSuccess);
        assert_eq!(free(), all, "the deregistration ended the token");
        // Deregistering a buffer with a token still out ends the token
        // (its access first) instead of answering hipObjBusy, a code the
        // original's clients do not know.
        assert_eq!(code(hipObjBufRegisterHost(p, 4096)), hipObjSuccess);
        token = std::ptr::null_mut();
        assert_eq!(
            code(hipObjGetRdmaToken(p, 4096, HIPOBJ_RDMA_OP_GET, &mut token)),
            hipObjSuccess
        );
        assert_eq!(code(hipObjBufDeregister(p)), hipObjSuccess);
        assert_eq!(free(), all);
        // SAFETY: the library returned a NUL-terminated token.
        let text = CStr::from_ptr(token).to_bytes().to_vec();
        assert_eq!(
            s.world.server.handle(&text, Op::Get),
            b"500",
            "the token is dead"
        );
        assert_eq!(code(hipObjPutRdmaToken(token)), hipObjSuccess);
    }
    assert!(buf.iter().all(|&b| b == 0));
}

/// With `nicHint` NULL, `HIPOBJ_NIC_HINT` names the NIC (the original's
/// later versions read it themselves); a GPU-less host needs one.
#[test]
fn a_null_nic_hint_is_read_from_the_environment() {
    let _turn = TURN.lock();
    let world = World::new();
    world.platform.absent.lock().gpu = true;
    let init = |hint: Option<&str>| {
        let options = Options {
            nic_hint: hint.map(str::to_owned),
            ..Options::default()
        };
        let outcome = CURRENT.init_with(world.platform(), Config::default(), options);
        if outcome.is_ok() {
            CURRENT.shutdown();
        }
        outcome
    };
    let refused = init(None).expect_err("GPU-less, and no hint at all");
    // The original's code, and a message that says the way out.
    assert_eq!((refused.code(), refused.hip_error()), (Code::Rdma, 100));
    let said = refused.to_string();
    for needed in [
        "no GPU",
        "nicHint",
        "HIPOBJ_NIC_HINT",
        hipobj_testing::world::CLIENT_NIC,
    ] {
        assert!(said.contains(needed), "{needed:?} in {said}");
    }
    init(Some(hipobj_testing::world::CLIENT_NIC)).expect("the hint from the environment");
    assert_eq!(
        Options::from_lookup(|name| (name == "HIPOBJ_NIC_HINT").then(|| "rxe0".into())).nic_hint,
        Some("rxe0".to_owned())
    );
    assert_eq!(Options::from_lookup(|_| Some("  ".into())).nic_hint, None);
}
