//! Application-driven tokens (`hipObjGetRdmaToken`, `hipObjPutRdmaToken`,
//! `hipObjBufSync`) as the original's clients use them, on the fake world:
//! a released token still serves its request, minting never waits for a
//! token to expire, a sync neither waits for nor ends a token it has no
//! reason to, and the library's records of tokens stay bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hipobj::core::args::{BufferRange, Slice, SyncDirection, TokenOp};
use hipobj::core::transfer::Direction;
use hipobj::core::{Code, Config, Current, Instance, Options};
use hipobj::server::Op;
use hipobj_testing::gpu::DeviceAlloc;
use hipobj_testing::world::{Behaviour, Scripted, World, WorldSpec};

const LEN: usize = 8192;

fn options(slots: u32) -> Options {
    Options {
        max_transfers: slots,
        completion_timeout: Duration::from_millis(2000),
        token_timeout: Duration::from_secs(60),
        ..Options::default()
    }
}

fn config() -> Config {
    Config {
        gpu_device: 0,
        ..Config::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i ^ (i >> 8) ^ (i >> 11)).to_le_bytes()[0].wrapping_mul(31) ^ seed)
        .collect()
}

/// A client with one registered buffer: host memory, or fake GPU memory
/// that the NIC cannot reach (staged).
struct Up {
    world: World,
    _current: Current,
    inst: Arc<Instance>,
    host: Option<Box<[u8]>>,
    device: Option<DeviceAlloc>,
}

impl Up {
    fn host(slots: u32) -> Up {
        Up::with(World::new(), slots, false)
    }

    fn staged(slots: u32) -> Up {
        let mut spec = WorldSpec::default();
        spec.client.supports_dmabuf = false;
        Up::with(World::with(spec), slots, true)
    }

    fn with(world: World, slots: u32, staged: bool) -> Up {
        let current = Current::new();
        current
            .init_with(world.platform(), config(), options(slots))
            .expect("init");
        let inst = current.instance().expect("instance");
        let (host, device, base) = if staged {
            let alloc = world.platform.gpu.alloc_device(0, LEN).unwrap();
            let base = alloc.addr();
            (None, Some(alloc), base)
        } else {
            let buf = vec![0u8; LEN].into_boxed_slice();
            let base = buf.as_ptr() as usize;
            (Some(buf), None, base)
        };
        inst.register(BufferRange::new(base, LEN).unwrap(), !staged)
            .expect("register");
        if staged {
            assert_eq!(
                inst.buffer_kind(base),
                Some(hipobj::core::buffers::BufKind::Staged { device: 0 })
            );
        }
        Up {
            world,
            _current: current,
            inst,
            host,
            device,
        }
    }

    fn base(&self) -> usize {
        match (&self.host, &self.device) {
            (Some(buf), _) => buf.as_ptr() as usize,
            (_, Some(alloc)) => alloc.addr(),
            _ => unreachable!(),
        }
    }

    fn slice(&self, len: usize) -> Slice {
        Slice::new(self.base(), len, 0).unwrap()
    }

    /// The buffer's bytes (the device's, for GPU memory).
    fn bytes(&self, len: usize) -> Vec<u8> {
        match (&self.host, &self.device) {
            (Some(buf), _) => buf[..len].to_vec(),
            (_, Some(alloc)) => self.world.platform.gpu.read(alloc.addr(), len).unwrap(),
            _ => unreachable!(),
        }
    }

    fn mint(&self, op: TokenOp) -> hipobj::core::Result<hipobj::core::token::Token> {
        self.inst.mint_token(self.slice(LEN), op)
    }

    fn serve(&self, token: &hipobj::core::token::Token) -> String {
        let reply = self.world.server.handle(&token.to_hex(), Op::Get);
        String::from_utf8_lossy(&reply).into_owned()
    }
}

#[test]
fn releasing_a_token_ends_nothing_and_its_request_is_served_afterwards() {
    let up = Up::host(4);
    let token = up.mint(TokenOp::Get).unwrap();
    // The original's clients copy the token into their request's header
    // and release it at once, before the request is sent.
    up.inst.release_token(&token);
    up.world.server.set_object(&pattern(LEN, 1));
    assert_eq!(up.serve(&token), "200");
    assert_eq!(up.bytes(LEN), pattern(LEN, 1));
}

#[test]
fn a_released_token_no_server_proved_gives_its_connection_to_a_newer_token() {
    let up = Up::host(2);
    let released = up.mint(TokenOp::Get).unwrap();
    up.inst.release_token(&released);
    let kept = up.mint(TokenOp::Get).unwrap();
    let newer = up
        .mint(TokenOp::Get)
        .expect("the released token's connection");
    up.world.server.set_object(&pattern(LEN, 2));
    assert_eq!(up.serve(&kept), "200");
    assert_eq!(up.serve(&newer), "200");
    assert_eq!(up.bytes(LEN), pattern(LEN, 2));
    assert_eq!(up.serve(&released), "500", "the released token was ended");
}

#[test]
fn minting_when_unreleased_tokens_hold_every_connection_is_busy_at_once() {
    let up = Up::host(2);
    let first = up.mint(TokenOp::Get).unwrap();
    let _second = up.mint(TokenOp::Get).unwrap();
    let started = Instant::now();
    let third = up.mint(TokenOp::Get);
    let took = started.elapsed();
    assert_eq!(third.unwrap_err().code(), Code::Busy);
    // Far less than the completion timeout (2 s) it would otherwise wait,
    // and the 60 s token timeout before which nothing frees.
    assert!(
        took < Duration::from_millis(1000),
        "the mint waited {took:?}"
    );
    up.world.server.set_object(&pattern(LEN, 3));
    assert_eq!(up.serve(&first), "200", "no token was ended for the mint");
}

#[test]
fn a_mint_waits_for_a_transfer_that_holds_the_last_connection() {
    let up = Up::host(1);
    up.world.server.set_object(&pattern(LEN, 4));
    std::thread::scope(|s| {
        let transfer = s.spawn(|| {
            let server = up.world.server.clone();
            let mut s3 = Scripted::new(move |t: &hipobj::core::token::Token| {
                std::thread::sleep(Duration::from_millis(200));
                server.handle(&t.to_hex(), Op::Get)
            });
            up.inst.transfer(Direction::Get, up.slice(LEN), &mut s3)
        });
        std::thread::sleep(Duration::from_millis(50));
        let token = up
            .mint(TokenOp::Put)
            .expect("the transfer's connection, once it ended");
        transfer.join().unwrap().expect("the transfer");
        assert_eq!(
            String::from_utf8_lossy(&up.world.server.handle(&token.to_hex(), Op::Put)),
            "200"
        );
    });
}

#[test]
fn syncing_a_buffer_that_is_not_staged_does_nothing_and_ends_no_token() {
    let up = Up::host(4);
    let token = up.mint(TokenOp::Get).unwrap();
    let started = Instant::now();
    for direction in [SyncDirection::ToDevice, SyncDirection::ToHost] {
        up.inst.buf_sync(up.slice(LEN), direction).unwrap();
    }
    assert!(started.elapsed() < Duration::from_millis(1000));
    up.world.server.set_object(&pattern(LEN, 5));
    assert_eq!(up.serve(&token), "200", "the sync ended the token");
    assert_eq!(up.bytes(LEN), pattern(LEN, 5));
}

#[test]
fn syncing_a_staged_buffer_waits_only_for_gets_a_server_proved() {
    let up = Up::staged(4);
    let unsent = up.mint(TokenOp::Get).unwrap();
    let served = up.mint(TokenOp::Get).unwrap();
    up.world.server.set_object(&pattern(LEN, 6));
    assert_eq!(up.serve(&served), "200");
    let started = Instant::now();
    up.inst
        .buf_sync(up.slice(LEN), SyncDirection::ToDevice)
        .expect("the served GET's bytes reach the device");
    assert!(started.elapsed() < Duration::from_millis(1000));
    assert_eq!(up.bytes(LEN), pattern(LEN, 6));
    // The token whose request was not sent yet still works.
    up.world.server.set_object(&pattern(LEN, 7));
    assert_eq!(up.serve(&unsent), "200");
    up.inst
        .buf_sync(up.slice(LEN), SyncDirection::ToDevice)
        .unwrap();
    assert_eq!(up.bytes(LEN), pattern(LEN, 7));
}

#[test]
fn a_sync_never_ends_a_running_get_and_says_it_still_runs() {
    let up = Up::staged(4);
    let token = up.mint(TokenOp::Get).unwrap();
    let session = up
        .world
        .server
        .side()
        .begin(&token, None, Instant::now() + Duration::from_secs(5))
        .expect("granted");
    let error = up
        .inst
        .buf_sync(up.slice(LEN), SyncDirection::ToDevice)
        .unwrap_err();
    assert_eq!(error.code(), Code::Rdma);
    assert!(error.to_string().contains("still running"), "{error}");
    // The GET goes on: its server finishes it, and the next sync copies.
    let mut session = session;
    up.world.server.set_object(&pattern(LEN, 8));
    session
        .write(&up.world.server.local(), 0, 0, LEN as u64)
        .expect("the server still has its access");
    session.finish().expect("the final message");
    let until = Instant::now() + Duration::from_secs(5);
    let mut synced = up.inst.buf_sync(up.slice(LEN), SyncDirection::ToDevice);
    while synced.is_err() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
        synced = up.inst.buf_sync(up.slice(LEN), SyncDirection::ToDevice);
    }
    synced.unwrap();
    assert_eq!(up.bytes(LEN), pattern(LEN, 8));
}

#[test]
fn a_failed_get_into_a_staged_buffer_fails_the_next_sync_once() {
    let up = Up::staged(4);
    let token = up.mint(TokenOp::Get).unwrap();
    // The server moves the bytes but its final message carries the wrong
    // secret: the client fails the GET, whatever the server replies.
    up.world.server.set_behaviour(Behaviour::WrongSecret);
    up.serve(&token);
    let until = Instant::now() + Duration::from_secs(5);
    while up.inst.pool().free_count() < 4 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    let first = up.inst.buf_sync(up.slice(LEN), SyncDirection::ToDevice);
    assert_eq!(first.unwrap_err().code(), Code::Rdma);
    up.inst
        .buf_sync(up.slice(LEN), SyncDirection::ToDevice)
        .expect("the failure was reported once");
    assert_eq!(up.inst.token_records(), 0);
}

#[test]
fn the_records_of_tokens_stay_bounded_by_the_connections() {
    for staged in [false, true] {
        let up = if staged { Up::staged(4) } else { Up::host(4) };
        up.world.server.set_object(&pattern(LEN, 9));
        for i in 0..2000 {
            let token = up.mint(TokenOp::Get).unwrap();
            if i % 2 == 0 {
                up.inst.release_token(&token);
            }
            assert_eq!(up.serve(&token), "200", "token {i}");
            assert!(
                up.inst.token_records() <= 4,
                "staged {staged}: {} records after {i} tokens",
                up.inst.token_records()
            );
        }
        up.inst
            .buf_sync(up.slice(LEN), SyncDirection::ToDevice)
            .unwrap();
        assert_eq!(up.bytes(LEN), pattern(LEN, 9));
    }
}

#[test]
fn a_staging_buffer_outlives_a_failed_deregistration_of_its_region() {
    let up = Up::staged(4);
    let counters = &up.world.platform.counters;
    assert_eq!(counters.live("host_alloc"), 1);
    up.world.platform.fabric.fail_deregistrations(true);
    up.inst.deregister(up.base()).unwrap();
    up.world.platform.fabric.fail_deregistrations(false);
    // The region leaked: the NIC may still reach it, so its memory is
    // never freed.
    assert_eq!(counters.live("destroy_failed"), 1);
    assert_eq!(
        counters.live("host_alloc"),
        1,
        "the staging memory was freed"
    );
}
