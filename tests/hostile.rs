//! Hostile servers and a hostile fabric, on the fake fabric (which, like
//! RoCE, takes a packet from any sender that has the right QP number and
//! PSN): tests for each property of `../shared/design/security.md`
//! (P1-P7). Each asserts that the attacker got nothing and that the
//! client stays usable. The same attacks on Soft-RoCE are in `tests/rxe.rs`
//! (the VM lane).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hipobj::core::args::{BufferRange, Slice, TokenOp};
use hipobj::core::protocol::{encode_connect, encode_reject, final_imm};
use hipobj::core::token::Token;
use hipobj::core::transfer::Direction;
use hipobj::core::{Code, Config, Current, Instance, Options};
use hipobj::platform::{AsyncKind, ConnectOutcome, ConnectRequest, QpCaps, WcStatus};
use hipobj::server::{ClientQp, Op, ServerConfig};
use hipobj_testing::world::{
    Behaviour, Scripted, TestServer, World, WorldSpec, CLIENT_IP, CLIENT_NIC, SERVER_NIC,
};

const LEN: usize = 8192;
const HALF: usize = LEN / 2;
const SLOTS: usize = 4;
/// How long an attacker waits for something that will not come.
const SHORT: Duration = Duration::from_millis(300);

fn options() -> Options {
    Options {
        max_transfers: 4,
        completion_timeout: Duration::from_millis(500),
        ..Options::default()
    }
}

fn config() -> Config {
    Config {
        gpu_device: 0,
        ..Config::default()
    }
}

/// A client instance on a world, with one registered host buffer.
struct Up {
    world: World,
    current: Current,
    inst: Arc<Instance>,
    buf: Box<[u8]>,
}

impl Up {
    fn new() -> Up {
        Up::with(World::new(), options())
    }

    fn with(world: World, options: Options) -> Up {
        let current = Current::new();
        current
            .init_with(world.platform(), config(), options)
            .expect("init");
        let inst = current.instance().expect("instance");
        let buf = vec![0u8; LEN].into_boxed_slice();
        inst.register(BufferRange::new(buf.as_ptr() as usize, LEN).unwrap(), true)
            .expect("register");
        Up {
            world,
            current,
            inst,
            buf,
        }
    }

    fn base(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    fn slice(&self, len: usize) -> Slice {
        Slice::new(self.base(), len, 0).unwrap()
    }

    /// A transfer of the buffer's first `len` bytes through `server`.
    fn transfer(&self, op: Op, server: &TestServer, len: usize) -> hipobj::core::Result<()> {
        self.inst
            .transfer(direction(op), self.slice(len), &mut server.session(op))
    }

    /// A second server, on a device of its own.
    fn other_server(&self, name: &str, last: u8) -> Arc<TestServer> {
        self.world
            .add_server(name, Ipv4Addr::new(192, 0, 2, last), 1 << 20)
    }

    /// Every slot is back on the free list (or retired).
    fn all_free(&self) -> bool {
        let pool = self.inst.pool();
        pool.free_count() + pool.retired_count() == SLOTS
    }

    /// Waits (briefly) until every slot is back: for jobs the driver ends
    /// on its own.
    fn settle(&self) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while !self.all_free() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.all_free()
    }
}

fn direction(op: Op) -> Direction {
    match op {
        Op::Get => Direction::Get,
        Op::Put => Direction::Put,
    }
}

/// Bytes that differ at every offset a test compares (no period of 256).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i ^ (i >> 8) ^ (i >> 11)).to_le_bytes()[0].wrapping_mul(31) ^ seed)
        .collect()
}

fn key(token: &Token) -> ClientQp {
    ClientQp::of(token)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// An S3 client whose request goes to `target` after `before` ran with its
/// token: where a test's attacker strikes while the transfer waits.
fn hooked<'a>(
    target: &'a TestServer,
    op: Op,
    mut before: impl FnMut(&Token) + 'a,
) -> Scripted<impl FnMut(&Token) -> Vec<u8> + 'a> {
    Scripted::new(move |t: &Token| {
        before(t);
        target.handle(&t.to_hex(), op)
    })
}

/// One transfer through `server`, returning the token it was sent.
fn recorded(up: &Up, server: &TestServer, op: Op, len: usize) -> Token {
    let mut seen = None;
    let mut s3 = hooked(server, op, |t: &Token| seen = Some(*t));
    up.inst
        .transfer(direction(op), up.slice(len), &mut s3)
        .expect("a transfer");
    drop(s3);
    seen.expect("a token was sent")
}

// ---------------------------------------------------------------- P1

/// What the old server of a reused connection tries while a transfer
/// that was sent to another server waits on its connection.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// The new token's own rkey and address (as if it had seen the token).
    NewRange,
    /// Its own earlier token's rkey and address.
    OldToken,
    /// The buffer's registration rkey.
    Registration,
    /// An in-band proof with its earlier token.
    ReplayedProof,
}

#[test]
fn the_old_server_of_a_reused_connection_gets_nothing_of_a_transfer_sent_elsewhere() {
    for op in [Op::Get, Op::Put] {
        for attack in [
            Attack::NewRange,
            Attack::OldToken,
            Attack::Registration,
            Attack::ReplayedProof,
        ] {
            let what = format!("{op:?} {attack:?}");
            let mut up = Up::new();
            let old = up.other_server("old0", 3);
            // The old server serves a GET: its connection to the slot stays.
            old.set_object(&pattern(LEN, 0x11));
            let first = recorded(&up, &old, Op::Get, HALF);
            let fresh = pattern(LEN, 0x22);
            up.world.server.set_object(&fresh);
            let uploaded = pattern(LEN, 0x33);
            if op == Op::Put {
                up.buf.copy_from_slice(&uploaded);
            }
            let old_store = old.object(LEN);
            let registration = up.inst.registration_rkey(up.base()).unwrap();
            let mut status = None;
            let new = up.world.server.clone();
            let mut s3 = hooked(&new, op, |t: &Token| {
                // The thread is given back its connection to the old server,
                // but this request went elsewhere.
                assert_eq!(t.qp_num, first.qp_num, "the reused slot");
                status = Some(match attack {
                    Attack::NewRange => old.probe(&key(t), op, t.addr, t.rkey, 64),
                    Attack::OldToken => old.probe(&key(t), op, first.addr, first.rkey, 64),
                    Attack::Registration => old.probe(&key(t), op, first.addr, registration, 64),
                    Attack::ReplayedProof => Some(match old.prove(&key(t), &first, SHORT) {
                        Ok(()) => WcStatus::Success,
                        Err(_) => WcStatus::RemAccessErr,
                    }),
                });
            });
            up.inst
                .transfer(direction(op), up.slice(HALF), &mut s3)
                .unwrap_or_else(|e| panic!("{what}: the transfer failed: {e}"));
            drop(s3);
            assert_ne!(
                status.expect("the attack ran"),
                Some(WcStatus::Success),
                "{what}: the old server's move succeeded"
            );
            match op {
                Op::Get => assert_eq!(&up.buf[..HALF], &fresh[..HALF], "{what}"),
                Op::Put => {
                    assert_eq!(old.object(LEN), old_store, "{what}: the old server read it");
                    assert_eq!(&new.object(HALF)[..], &uploaded[..HALF], "{what}");
                }
            }
            assert!(up.all_free(), "{what}: every slot is back");
            // The client is usable: the old server, well behaved, again.
            old.set_object(&pattern(LEN, 0x44));
            up.transfer(Op::Get, &old, HALF)
                .unwrap_or_else(|e| panic!("{what}: afterwards: {e}"));
            assert_eq!(&up.buf[..HALF], &pattern(LEN, 0x44)[..HALF], "{what}");
        }
    }
}

/// The old server of a kept connection sends a final message while a
/// transfer sent elsewhere waits on that connection: it loses its
/// connection, as for a wrong proof, and the waiting transfer goes on.
#[test]
fn a_final_message_from_the_kept_server_does_not_end_a_transfer_sent_elsewhere() {
    // Either form: an immediate, or (version 4) a SEND with invalidate
    // naming the window's rkey of the old server's own transfer (the
    // window is bound to nothing while the new transfer waits).
    for invalidating in [false, true] {
        let up = Up::new();
        let old = up.other_server("old0", 3);
        old.set_object(&pattern(LEN, 0x11));
        let first = recorded(&up, &old, Op::Get, HALF);
        let new = up.world.server.clone();
        new.set_object(&pattern(LEN, 0x22));
        let mut sent = None;
        let mut s3 = hooked(&new, Op::Get, |t: &Token| {
            assert_eq!(t.qp_num, first.qp_num, "the reused slot");
            // Whatever value it carries: the right one for this token, even.
            let rkey = invalidating.then_some(first.rkey);
            sent = Some(old.send_final_as(&key(t), final_imm(t.secret), rkey, SHORT));
        });
        up.inst
            .transfer(Direction::Get, up.slice(HALF), &mut s3)
            .expect("the transfer its own server served");
        drop(s3);
        assert!(sent.is_some(), "the old server sent its final message");
        assert_eq!(&up.buf[..HALF], &pattern(LEN, 0x22)[..HALF]);
    }
}

/// A second final message while the window is being invalidated: the
/// transfer's data is in, and it succeeds.
#[test]
fn a_second_final_message_does_not_fail_a_transfer_whose_data_is_in() {
    let up = Up::new();
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 0x31));
    recorded(&up, &server, Op::Get, HALF);
    server.set_object(&pattern(LEN, 0x32));
    let fabric = up.world.platform.fabric.clone();
    let mut second = None;
    let mut s3 = Scripted::new(|t: &Token| {
        let mut session = server.side().begin(t, None, deadline()).unwrap();
        session
            .write(&server.local(), 0, 0, t.length)
            .expect("the data");
        // The client sees neither final message until both are sent.
        fabric.hold_completions(CLIENT_NIC, true);
        session.finish().expect("the final message");
        second = Some(server.send_final(&key(t), final_imm(t.secret), SHORT));
        fabric.hold_completions(CLIENT_NIC, false);
        fabric.release_completions();
        b"200".to_vec()
    });
    let outcome = up.inst.transfer(Direction::Get, up.slice(HALF), &mut s3);
    drop(s3);
    assert!(matches!(second, Some(Ok(()))), "{second:?}");
    outcome.expect("the transfer whose data was in");
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 0x32)[..HALF]);
    assert!(up.settle());
}

#[test]
fn an_old_server_that_reaches_in_while_another_server_is_granted_lands_nothing() {
    // Re-aimed to the new server, the client QP expects the new server's
    // PSNs: the old server's packets (its own PSN counter) are not
    // executed, and the window bound through that very QP does not help.
    let up = Up::new();
    let old = up.other_server("old0", 3);
    old.set_object(&pattern(LEN, 0x11));
    recorded(&up, &old, Op::Get, HALF);
    let new = up.world.server.clone();
    new.set_object(&pattern(LEN, 0x22));
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let mut session = new.side().begin(&token, None, deadline()).expect("granted");
    // The new server writes the first 1024 bytes; the old one aims beyond.
    let beyond = token.addr + 2048;
    let _ = old.probe(&key(&token), Op::Get, beyond, token.rkey, 64);
    session
        .write(&new.local(), 0, 0, 1024)
        .expect("the new server's data");
    session.finish().expect("the final message");
    assert!(up.settle(), "the token ended at its final message");
    assert_eq!(&up.buf[..1024], &pattern(LEN, 0x22)[..1024]);
    // What the first GET left there, not the old server's first 64 bytes.
    let before = pattern(LEN, 0x11);
    assert_eq!(
        &up.buf[2048..2112],
        &before[2048..2112],
        "the old server's WRITE landed"
    );
    assert_ne!(
        &before[2048..2112],
        &old.object(64)[..],
        "a test that can fail"
    );
}

// ---------------------------------------------------------------- P2

#[test]
fn a_token_is_good_for_one_proof_only() {
    let up = Up::new();
    let server = up.world.server.clone();
    // After its transfer, a token connects nobody.
    server.set_object(&pattern(LEN, 1));
    let used = recorded(&up, &server, Op::Get, HALF);
    let again = server
        .side()
        .connect_with(&used, &encode_connect(&used), deadline());
    assert!(again.is_err(), "a used token connected again");
    // While a token's transfer is granted to its server, a hijacker with
    // the same token is refused, and the transfer goes on undisturbed.
    let hijacker = up.other_server("hijack0", 4);
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    server.set_object(&pattern(LEN, 2));
    let mut session = server
        .side()
        .begin(&token, None, deadline())
        .expect("granted");
    let hijack = hijacker
        .side()
        .connect_with(&token, &encode_connect(&token), deadline());
    assert!(
        hijack.is_err(),
        "a second connect request with the token was accepted"
    );
    session
        .write(&server.local(), 0, 0, HALF as u64)
        .expect("undisturbed");
    session.finish().expect("the final message");
    assert!(up.settle());
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 2)[..HALF]);
    // An in-band replay of the used token on the kept connection gets no
    // grant (nothing waits), and costs the replaying server its connection.
    let replay = server.prove(&key(&token), &token, SHORT);
    assert!(replay.is_err(), "a replayed proof was granted");
    server.set_object(&pattern(LEN, 3));
    up.transfer(Op::Get, &server, HALF)
        .expect("usable afterwards");
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 3)[..HALF]);
}

#[test]
fn tokens_carry_fresh_secrets_and_random_window_keys() {
    let up = Up::new();
    let mut secrets = std::collections::HashSet::new();
    let mut keys = std::collections::HashSet::new();
    let mut steps = std::collections::HashSet::new();
    let mut last_rkey = None;
    for _ in 0..300 {
        let t = up.inst.mint_token(up.slice(64), TokenOp::Get).unwrap();
        secrets.insert(t.secret);
        keys.insert(t.rkey & 0xff);
        if let Some(last) = last_rkey {
            steps.insert((t.rkey & 0xff).wrapping_sub(last) & 0xff);
        }
        last_rkey = Some(t.rkey & 0xff);
        // Released unused: the next mint takes its connection back.
        up.inst.release_token(&t);
    }
    // 300 draws of 32 bits: a repeat is a one-in-100,000 chance.
    assert_eq!(secrets.len(), 300, "every token has its own secret");
    assert!(
        keys.len() > 150,
        "window keys spread: {} distinct",
        keys.len()
    );
    assert!(steps.len() > 50, "no fixed step from one key to the next");
    up.inst.deregister(up.base()).unwrap();
    assert!(up.all_free());
}

// ---------------------------------------------------------------- P3

#[test]
fn a_granted_server_reaches_no_registration_and_nothing_outside_its_window() {
    let up = Up::new();
    let server = up.world.server.clone();
    let other = vec![0u8; LEN].into_boxed_slice();
    let other_base = other.as_ptr() as usize;
    up.inst
        .register(BufferRange::new(other_base, LEN).unwrap(), true)
        .unwrap();
    for (what, rkey_of, at) in [
        ("this buffer's registration", up.base(), HALF),
        ("another buffer's registration", other_base, 0),
    ] {
        let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
        let mut session = server
            .side()
            .begin(&token, None, deadline())
            .expect("granted");
        let rkey = up.inst.registration_rkey(rkey_of).unwrap();
        let addr = u64::try_from(rkey_of + at).unwrap();
        let status = session.data_unchecked(Op::Get, addr, rkey, &server.local(), 0, 64);
        assert!(status.is_err(), "{what}: a write with it succeeded");
        drop(session);
        assert!(up.settle(), "{what}");
    }
    assert!(up.buf[HALF..].iter().all(|&b| b == 0));
    assert!(other.iter().all(|&b| b == 0));
    // Inside the window but past the range: refused too (the fake is as
    // strict as the IB rule; rxe checks only the registration's range).
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let mut session = server.side().begin(&token, None, deadline()).unwrap();
    let past = session.data_unchecked(
        Op::Get,
        token.addr + HALF as u64,
        token.rkey,
        &server.local(),
        0,
        64,
    );
    assert!(past.is_err(), "a write past the range succeeded");
    drop(session);
    assert!(up.settle());
    assert!(up.buf[HALF..].iter().all(|&b| b == 0));
    up.inst.deregister(other_base).unwrap();
}

#[test]
fn a_token_grants_only_its_direction() {
    let up = Up::new();
    let server = up.world.server.clone();
    for (minted, wrong) in [(TokenOp::Get, Op::Put), (TokenOp::Put, Op::Get)] {
        let token = up.inst.mint_token(up.slice(HALF), minted).unwrap();
        let mut session = server.side().begin(&token, None, deadline()).unwrap();
        let moved = match wrong {
            Op::Get => session.write(&server.local(), 0, 0, 64),
            Op::Put => session.read(&server.local(), 0, 0, 64),
        };
        assert!(
            moved.is_err(),
            "a {minted:?} token allowed a {wrong:?}'s access"
        );
        drop(session);
        assert!(up.settle());
    }
    assert!(up.buf.iter().all(|&b| b == 0));
}

#[test]
fn without_windows_a_transfer_registration_is_its_connection_alone() {
    let mut spec = WorldSpec::default();
    spec.client.supports_mw = false;
    let up = Up::with(World::with(spec), options());
    let server = up.world.server.clone();
    let a = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let b = up
        .inst
        .mint_token(Slice::new(up.base(), HALF, 4096).unwrap(), TokenOp::Get)
        .unwrap();
    assert_ne!(a.qp_num, b.qp_num);
    // Granted for `a`, the server tries `b`'s registration: it lives in
    // `b`'s connection's protection domain, out of reach.
    let mut session = server.side().begin(&a, None, deadline()).unwrap();
    let cross = session.data_unchecked(Op::Get, b.addr, b.rkey, &server.local(), 0, 64);
    assert!(
        cross.is_err(),
        "another connection's registration was reachable"
    );
    drop(session);
    up.inst.deregister(up.base()).unwrap();
    assert!(up.settle());
    assert!(up.buf.iter().all(|&x| x == 0));
}

// ---------------------------------------------------------------- P4

/// After a transfer ended (however), the server that had its access
/// tries the token once more, on whatever connection it still has.
fn nothing_left(server: &TestServer, token: &Token) -> bool {
    !matches!(
        server.probe(&key(token), Op::Get, token.addr, token.rkey, 64),
        Some(WcStatus::Success)
    )
}

#[test]
fn access_ends_with_the_transfer_on_every_path() {
    for behaviour in [
        Behaviour::Normal,
        Behaviour::WrongSecret,
        Behaviour::NoFinalMessage,
        Behaviour::FailAfterData,
    ] {
        let up = Up::new();
        let server = up.world.server.clone();
        server.set_behaviour(behaviour);
        server.set_object(&pattern(LEN, 5));
        let mut seen = None;
        let mut s3 = hooked(&server, Op::Get, |t: &Token| seen = Some(*t));
        let outcome = up.inst.transfer(Direction::Get, up.slice(HALF), &mut s3);
        drop(s3);
        assert_eq!(
            outcome.is_ok(),
            behaviour == Behaviour::Normal,
            "{behaviour:?}: {outcome:?}"
        );
        let token = seen.unwrap();
        assert!(
            up.all_free(),
            "{behaviour:?}: the slot is back when the call returns"
        );
        up.world_buf_zero_after(&server, &token, behaviour);
    }
}

impl Up {
    /// The transfer is over: its server may not write its range again.
    fn world_buf_zero_after(&self, server: &TestServer, token: &Token, what: impl std::fmt::Debug) {
        let before = self.buf[..HALF].to_vec();
        server.set_object(&pattern(LEN, 0x77));
        assert!(
            nothing_left(server, token),
            "{what:?}: the range is still writable"
        );
        assert_eq!(&self.buf[..HALF], &before[..], "{what:?}");
    }
}

#[test]
fn a_callback_that_unwinds_leaves_no_access_behind() {
    let up = Up::new();
    let server = up.world.server.clone();
    let token = std::sync::Mutex::new(None);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut s3 = hooked(&server, Op::Get, |t: &Token| {
            *token.lock().unwrap() = Some(*t);
            // The server is granted, then the application's callback dies.
            let session = server.side().begin(t, None, deadline()).expect("granted");
            session.abandon();
            panic!("the application's callback panicked");
        });
        let _ = up.inst.transfer(Direction::Get, up.slice(HALF), &mut s3);
    }));
    assert!(outcome.is_err());
    let token = token.lock().unwrap().expect("a token was sent");
    assert!(up.settle(), "the unwound lease came back");
    up.world_buf_zero_after(&server, &token, "unwinding");
    server.set_object(&pattern(LEN, 6));
    up.transfer(Op::Get, &server, HALF)
        .expect("usable afterwards");
}

#[test]
fn a_token_granted_at_shutdown_loses_its_access() {
    let up = Up::new();
    let server = up.world.server.clone();
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let session = server
        .side()
        .begin(&token, None, deadline())
        .expect("granted");
    session.abandon();
    let Up { inst, current, .. } = up;
    drop(inst);
    current.shutdown();
    assert!(
        nothing_left(&server, &token),
        "the range is still writable after shutdown"
    );
}

#[test]
fn deregistration_ends_every_token_of_its_buffer_and_their_access() {
    let up = Up::new();
    let server = up.world.server.clone();
    let t1 = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let t2 = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let session = server.side().begin(&t2, None, deadline()).expect("granted");
    session.abandon();
    // t1's server never came; t2's was granted and never finished.
    up.inst.deregister(up.base()).unwrap();
    assert!(up.settle(), "both leases are back");
    assert!(nothing_left(&server, &t1) && nothing_left(&server, &t2));
    assert_ne!(server.handle(&t1.to_hex(), Op::Get), b"200");
}

#[test]
fn a_released_token_still_ends_at_its_deadline() {
    let up = Up::with(
        World::new(),
        Options {
            token_timeout: Duration::from_millis(300),
            ..options()
        },
    );
    let server = up.world.server.clone();
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    up.inst.release_token(&token);
    assert!(!up.all_free(), "the release ends nothing");
    assert!(up.settle(), "the deadline ended the token");
    assert!(nothing_left(&server, &token));
    assert_ne!(server.handle(&token.to_hex(), Op::Get), b"200");
}

/// `hipObjShutdown` while another call holds the instance (a `hipObjGet`
/// blocked in its callback, a registration on another thread): every
/// application-driven token's access ends before shutdown returns, and a
/// token's server that comes later is refused.
#[test]
fn shutdown_ends_every_token_whatever_other_calls_hold_the_instance() {
    let up = Up::new();
    let server = up.world.server.clone();
    let granted = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let waiting = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let session = server
        .side()
        .begin(&granted, None, deadline())
        .expect("granted");
    session.abandon();
    // What a call in flight holds.
    let in_flight = up.current.instance().unwrap();
    let Up {
        inst,
        current,
        buf,
        world,
    } = up;
    drop(inst);
    current.shutdown();
    assert!(!current.is_initialized());
    server.set_object(&pattern(LEN, 0x66));
    let probe = server.probe(&key(&granted), Op::Get, granted.addr, granted.rkey, 64);
    assert_ne!(
        probe,
        Some(WcStatus::Success),
        "the granted server wrote after shutdown"
    );
    assert_ne!(
        server.handle(&waiting.to_hex(), Op::Get),
        b"200",
        "a token was proved after shutdown"
    );
    assert!(buf.iter().all(|&b| b == 0), "bytes landed after shutdown");
    // A transfer the call in flight starts now is refused too.
    let later = in_flight.transfer(
        Direction::Get,
        Slice::new(buf.as_ptr() as usize, HALF, 0).unwrap(),
        &mut server.session(Op::Get),
    );
    assert_eq!(later.unwrap_err().code(), Code::NotInitialized);
    drop(in_flight);
    drop(world);
}

/// A token's job ends (its deadline) while its QP will not change state:
/// the QP is fenced (destroyed, since it would not even go to ERR) and the
/// window deallocated, so the granted server reaches nothing afterwards.
#[test]
fn a_qp_that_will_not_reset_is_fenced_when_its_token_ends() {
    let up = Up::with(
        World::new(),
        Options {
            token_timeout: Duration::from_millis(300),
            ..options()
        },
    );
    let server = up.world.server.clone();
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let mut session = server
        .side()
        .begin(&token, None, deadline())
        .expect("granted");
    let faults = &up.world.platform.faults;
    faults.fail_always("ibv_modify_qp");
    assert!(up.settle(), "the deadline ended the token");
    faults.clear();
    server.set_object(&pattern(LEN, 0x45));
    let wrote = session.data_unchecked(Op::Get, token.addr, token.rkey, &server.local(), 0, 64);
    assert!(
        wrote.is_err(),
        "the server still wrote after the token ended"
    );
    assert!(up.buf.iter().all(|&b| b == 0), "bytes landed");
    assert_eq!(up.world.platform.fabric.leaked_registrations_reached(), 0);
}

/// Deregistration ends a granted token while the QP will not change
/// state: no access is left, whatever deregistration answers, and the
/// registration never leaks with a window bound over it.
#[test]
fn a_qp_that_will_not_reset_at_deregistration_leaves_no_access() {
    let up = Up::new();
    let server = up.world.server.clone();
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let mut session = server
        .side()
        .begin(&token, None, deadline())
        .expect("granted");
    let faults = &up.world.platform.faults;
    faults.fail_always("ibv_modify_qp");
    let dereg = up.inst.deregister(up.base());
    faults.clear();
    server.set_object(&pattern(LEN, 0x44));
    let wrote = session.data_unchecked(Op::Get, token.addr, token.rkey, &server.local(), 0, 64);
    assert!(
        wrote.is_err(),
        "deregistration answered {dereg:?} and the server still wrote"
    );
    assert!(up.buf.iter().all(|&b| b == 0), "bytes landed");
    assert_eq!(up.world.platform.fabric.leaked_registrations_reached(), 0);
    assert_eq!(
        up.world.platform.counters.live("destroy_failed"),
        0,
        "a registration leaked"
    );
}

/// One failed reset (the QP would not go to RESET once) costs a new QP,
/// not the connection: it serves the next transfers.
#[test]
fn a_reset_that_fails_once_replaces_the_qp_and_keeps_the_connection() {
    let up = Up::with(
        World::new(),
        Options {
            max_transfers: 1,
            ..options()
        },
    );
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 0x21));
    up.transfer(Op::Get, &server, HALF).unwrap();
    // The server fails its next transfer (no final message): the job ends
    // at its deadline with a reset, whose first step fails.
    server.set_behaviour(Behaviour::NoFinalMessage);
    let faults = &up.world.platform.faults;
    faults.fail_nth("ibv_modify_qp", faults.calls("ibv_modify_qp") + 1);
    assert!(up.transfer(Op::Get, &server, HALF).is_err());
    faults.clear();
    server.set_behaviour(Behaviour::Normal);
    assert_eq!(up.inst.pool().retired_count(), 0);
    for _ in 0..3 {
        up.transfer(Op::Get, &server, HALF).unwrap();
    }
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 0x21)[..HALF]);
}

// ---------------------------------------------------------------- P5

/// Sends a connect request with `private_data` to the client's listener
/// and returns the rejection's private data (`None`: it was accepted).
fn connect_request(up: &Up, private_data: &[u8]) -> Option<Vec<u8>> {
    let fabric = &up.world.platform.fabric;
    let ctx = fabric.verbs(&[SERVER_NIC]).open(SERVER_NIC).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let outcome = fabric
        .cm(&[SERVER_NIC])
        .connect(ConnectRequest {
            addr: SocketAddr::new(CLIENT_IP.into(), up.inst.listener_port()),
            pd: &pd,
            cq: &cq,
            caps: QpCaps {
                max_send_wr: 2,
                max_recv_wr: 2,
                max_send_sge: 1,
                max_recv_sge: 1,
            },
            private_data,
            initiator_depth: 1,
            responder_resources: 1,
            retry_count: 6,
            rnr_retry_count: 7,
            deadline: deadline(),
        })
        .expect("the CM answered");
    match outcome {
        ConnectOutcome::Rejected { private_data } => Some(private_data),
        ConnectOutcome::Established(conn) => {
            let _ = conn.disconnect();
            None
        }
    }
}

#[test]
fn every_refusal_says_the_same() {
    let up = Up::new();
    // A transfer that ended: its connection has nothing waiting.
    let idle = recorded(&up, &up.world.server, Op::Get, HALF);
    let waiting = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let wrong_secret = Token {
        secret: waiting.secret ^ 1,
        ..waiting
    };
    let unknown_qp = Token {
        qp_num: waiting.qp_num + 1000,
        ..waiting
    };
    let mut old_version = encode_connect(&waiting);
    old_version[4] = 1;
    let attempts: Vec<(&str, Vec<u8>)> = vec![
        ("no private data", Vec::new()),
        ("another protocol", vec![0x5a; 56]),
        ("an old version", old_version.to_vec()),
        ("an unknown QP", encode_connect(&unknown_qp).to_vec()),
        ("a QP with nothing waiting", encode_connect(&idle).to_vec()),
        ("the wrong secret", encode_connect(&wrong_secret).to_vec()),
    ];
    let mut answers = Vec::new();
    for (what, data) in &attempts {
        let rej = connect_request(&up, data).unwrap_or_else(|| panic!("{what} was accepted"));
        answers.push((what, rej));
    }
    let first = answers[0].1.clone();
    assert_eq!(&first[..8], &encode_reject()[..]);
    for (what, rej) in &answers {
        assert_eq!(rej, &first, "{what}: a different refusal");
    }
    // The waiting transfer was not disturbed: its own server still gets it.
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 9));
    assert_eq!(server.handle(&waiting.to_hex(), Op::Get), b"200");
    assert!(up.settle());
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 9)[..HALF]);
}

#[test]
fn a_flood_of_bad_connect_requests_does_not_fail_a_waiting_transfer() {
    const FLOOD: usize = 10_000;
    const THREADS: usize = 4;
    let up = Up::new();
    let waiting = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let start = Instant::now();
    let refused = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let up = &up;
            let refused = &refused;
            s.spawn(move || {
                for i in 0..FLOOD / THREADS {
                    // Garbage, and names no connection has.
                    let guess = Token {
                        qp_num: waiting.qp_num + 1000 + u32::try_from(i % 7).unwrap(),
                        secret: u32::try_from(t * FLOOD + i).unwrap(),
                        ..waiting
                    };
                    let data = if i % 2 == 0 {
                        encode_connect(&guess).to_vec()
                    } else {
                        vec![0x5a; 56]
                    };
                    if connect_request(up, &data).is_some() {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        // Amid the flood, the transfer's own server connects.
        let server = up.world.server.clone();
        server.set_object(&pattern(LEN, 10));
        assert_eq!(
            server.handle(&waiting.to_hex(), Op::Get),
            b"200",
            "the transfer failed"
        );
    });
    assert_eq!(refused.into_inner(), FLOOD, "every request was refused");
    eprintln!(
        "{FLOOD} bad connect requests from {THREADS} threads in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    assert!(up.settle());
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 10)[..HALF]);
}

/// Guesses at a waiting transfer's token (its connection's name, a wrong
/// secret): each is refused, and after `MAX_WRONG_PROOFS` of them the
/// transfer is ended, so that a guesser gets that many tries at its 40
/// unknown bits, not as many as it can send before the token's deadline.
/// One guess fewer leaves the transfer alone.
#[test]
fn a_waiting_transfer_ends_after_too_many_wrong_guesses_at_its_token() {
    use hipobj::core::connections::MAX_WRONG_PROOFS;
    for guesses in [MAX_WRONG_PROOFS - 1, MAX_WRONG_PROOFS] {
        let up = Up::new();
        let server = up.world.server.clone();
        let waiting = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
        for i in 0..guesses {
            let guess = Token {
                secret: waiting.secret ^ (i + 1),
                ..waiting
            };
            assert!(
                connect_request(&up, &encode_connect(&guess)).is_some(),
                "guess {i} was accepted"
            );
        }
        server.set_object(&pattern(LEN, 15));
        let reply = server.handle(&waiting.to_hex(), Op::Get);
        if guesses < MAX_WRONG_PROOFS {
            assert_eq!(reply, b"200", "{guesses} guesses");
            assert_eq!(&up.buf[..HALF], &pattern(LEN, 15)[..HALF]);
        } else {
            assert_ne!(reply, b"200", "the transfer outlived {guesses} guesses");
            assert!(up.buf.iter().all(|&b| b == 0));
        }
        assert!(up.settle());
        // The client stays usable.
        up.transfer(Op::Get, &server, HALF).unwrap();
        assert_eq!(&up.buf[..HALF], &pattern(LEN, 15)[..HALF]);
    }
}

/// A flood of connect requests sent at least as fast as the driver reads
/// them (an attacker that never waits for its REJs) keeps the listener's
/// queue from ever emptying: the driver still reads completions and runs
/// deadlines between them, so a transfer amid the flood completes.
#[test]
fn a_sustained_flood_of_connect_requests_does_not_starve_transfers() {
    let up = Up::new();
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 13));
    let fabric = up.world.platform.fabric.clone();
    let to = SocketAddr::new(CLIENT_IP.into(), up.inst.listener_port());
    let bogus = encode_connect(&Token {
        secret: 1,
        ..up.inst.mint_token(up.slice(64), TokenOp::Put).unwrap()
    });
    assert!(fabric.set_connect_flood(SERVER_NIC, to, Some(&bogus)));
    let outcome = up.transfer(Op::Get, &server, HALF);
    assert!(fabric.set_connect_flood(SERVER_NIC, to, None));
    outcome.expect("the transfer amid the flood");
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 13)[..HALF]);
}

/// The driver's deadlines stay a few per connection however many
/// transfers and tokens have gone through (each used to leave an idle
/// timer and its completion deadline in the heap for up to a minute).
#[test]
fn the_drivers_deadlines_stay_bounded_by_the_connections() {
    let up = Up::new();
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 14));
    for i in 0..1500 {
        up.transfer(Op::Get, &server, HALF).unwrap();
        let token = up.inst.mint_token(up.slice(HALF), TokenOp::Put).unwrap();
        assert_eq!(server.handle(&token.to_hex(), Op::Put), b"200", "{i}");
    }
    assert!(up.settle());
    // Wake the driver so that it reports its heap as it is now.
    up.transfer(Op::Get, &server, HALF).unwrap();
    let pending = up.inst.timers_pending();
    assert!(
        pending <= 3 * SLOTS,
        "{pending} deadlines pending after 3000 transfers on {SLOTS} connections"
    );
}

#[test]
fn a_dead_driver_fails_transfers_at_once_and_says_why() {
    let up = Up::new();
    let server = up.world.server.clone();
    // A token waits when the driver dies.
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    // Only the client's driver reads the device's asynchronous events:
    // from now on it cannot, and after a run of failures it gives up. The
    // driver reads them when their descriptor is readable (or at its start,
    // which may be over by now): a port event makes it readable.
    up.world.platform.faults.fail_always("ibv_get_async_event");
    assert_eq!(
        up.world
            .platform
            .fabric
            .raise_async_event(CLIENT_NIC, AsyncKind::PortActive),
        1,
        "the client's one context got the event"
    );
    let until = Instant::now() + Duration::from_secs(10);
    while up.inst.pool().death().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let why = up.inst.pool().death().expect("the driver gave up");
    assert!(
        why.to_string().contains("connection driver stopped"),
        "{why}"
    );
    // The waiting token's access is gone, and its request fails.
    assert!(nothing_left(&server, &token));
    assert_ne!(server.handle(&token.to_hex(), Op::Get), b"200");
    // Every later transfer fails at once, with the reason.
    let later = up.transfer(Op::Get, &server, HALF).unwrap_err();
    assert_eq!(later.code(), Code::Rdma);
    assert!(
        later.to_string().contains("connection driver stopped"),
        "{later}"
    );
    up.world.platform.faults.clear();
    let Up {
        inst,
        current,
        world,
        buf,
    } = up;
    drop(inst);
    current.shutdown();
    // The library is usable again after a shutdown.
    current
        .init_with(world.platform(), config(), options())
        .expect("init after a dead driver");
    let inst = current.instance().unwrap();
    inst.register(BufferRange::new(buf.as_ptr() as usize, LEN).unwrap(), true)
        .unwrap();
    world.server.set_object(&pattern(LEN, 11));
    inst.transfer(
        Direction::Get,
        Slice::new(buf.as_ptr() as usize, HALF, 0).unwrap(),
        &mut world.server.session(Op::Get),
    )
    .expect("a transfer on the new instance");
}

// ---------------------------------------------------------------- P6

#[test]
fn the_final_message_must_carry_this_transfers_secret() {
    let up = Up::new();
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 12));
    let previous = recorded(&up, &server, Op::Get, HALF);
    // A final message with the previous transfer's value (a replayed
    // completion) ends nothing but the transfer, in failure.
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    let mut session = server.side().begin(&token, None, deadline()).unwrap();
    session.write(&server.local(), 0, 0, HALF as u64).unwrap();
    let _ = session.finish_with(final_imm(previous.secret));
    assert!(up.settle());
    assert!(nothing_left(&server, &token));
    // It ended in failure: its connection was reset rather than kept, so
    // the next transfer to the server connects again.
    let handshakes = up.inst.stats().handshakes;
    up.transfer(Op::Get, &server, HALF).unwrap();
    assert_eq!(up.inst.stats().handshakes, handshakes + 1);
    // The transfer's own outcome, in both forms: version 4's final data
    // (the window invalidated by it all the same) and an older server's
    // immediate.
    let config = ServerConfig {
        protocol: 3,
        ..TestServer::config()
    };
    let old = up
        .world
        .add_server_with("v3", Ipv4Addr::new(192, 0, 2, 41), 1 << 20, config);
    for server in [server, old] {
        server.set_object(&pattern(LEN, 13));
        let previous = recorded(&up, &server, Op::Get, HALF);
        let mut seen = None;
        let mut s3 = Scripted::new(|t: &Token| {
            seen = Some(*t);
            let mut session = server.side().begin(t, None, deadline()).unwrap();
            session.write(&server.local(), 0, 0, t.length).unwrap();
            let _ = session.finish_with(final_imm(previous.secret));
            b"200".to_vec()
        });
        let outcome = up.inst.transfer(Direction::Get, up.slice(HALF), &mut s3);
        drop(s3);
        let err = outcome.expect_err("a final message with another transfer's secret");
        assert!(err.to_string().contains("wrong secret"), "{err}");
        assert!(up.settle());
        assert!(nothing_left(&server, &seen.unwrap()));
    }
}

/// Version 4: a final message that invalidates another window of the
/// client than its own transfer's (Soft-RoCE lets a SEND with invalidate
/// reach any bound window of the receiving QP's protection domain, as the
/// fake fabric does; hardware refuses one bound through another QP). Its
/// own transfer fails and loses its access; the other loses its window,
/// so its server's WRITEs fail and so does it: no transfer succeeds with
/// its window still bound, and the client goes on.
#[test]
fn a_final_message_that_invalidates_another_window_fails_its_own_transfer() {
    let up = Up::new();
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 13));
    let half = |at: i64| Slice::new(up.base(), HALF, at).unwrap();
    let a = up.inst.mint_token(half(0), TokenOp::Get).unwrap();
    let b = up
        .inst
        .mint_token(half(i64::try_from(HALF).unwrap()), TokenOp::Get)
        .unwrap();
    assert_ne!(a.qp_num, b.qp_num, "two connections");
    let mut first = server.side().begin(&a, None, deadline()).unwrap();
    let mut second = server.side().begin(&b, None, deadline()).unwrap();
    second.write(&server.local(), 0, 0, HALF as u64).unwrap();
    // B's server names A's window (the worst case: it guessed the rkey).
    let _ = second.finish_as(final_imm(b.secret), a.rkey);
    assert!(
        first.write(&server.local(), 0, 0, HALF as u64).is_err(),
        "A's window was invalidated"
    );
    assert!(up.settle(), "both tokens ended");
    assert!(
        nothing_left(&server, &b),
        "B ended in failure, its window revoked"
    );
    assert!(nothing_left(&server, &a));
    server.set_object(&pattern(LEN, 14));
    up.transfer(Op::Get, &server, HALF).unwrap();
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 14)[..HALF]);
}

// ---------------------------------------------------------------- the fabric, no kinder than hardware

#[test]
fn an_idle_connection_whose_qp_fails_is_reset_before_the_next_transfer() {
    // With the device's asynchronous event (hardware) and without it
    // (rxe raises none: the flushed receives tell).
    for async_events in [true, false] {
        let mut spec = WorldSpec::default();
        spec.client.async_events = async_events;
        let up = Up::with(World::with(spec), options());
        let server = up.world.server.clone();
        server.set_object(&pattern(LEN, 13));
        let token = recorded(&up, &server, Op::Get, HALF);
        // The server, idle on its kept connection, writes with the old
        // token: refused, the client QP goes to ERR while the CM
        // connection stays up.
        assert!(nothing_left(&server, &token));
        server.set_object(&pattern(LEN, 14));
        up.transfer(Op::Get, &server, HALF)
            .unwrap_or_else(|e| panic!("async events {async_events}: {e}"));
        assert_eq!(&up.buf[..HALF], &pattern(LEN, 14)[..HALF]);
        assert!(up.all_free());
    }
}

#[test]
fn an_idle_connection_that_cannot_be_reset_is_retired_and_never_leased_again() {
    let up = Up::new();
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 15));
    let token = recorded(&up, &server, Op::Get, HALF);
    // The idle connection's QP fails (the old token is refused), and its
    // reset fails too.
    let faults = &up.world.platform.faults;
    faults.fail_always("ibv_modify_qp");
    assert!(nothing_left(&server, &token));
    let pool = up.inst.pool();
    let until = Instant::now() + Duration::from_secs(5);
    while pool.retired_count() == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    faults.clear();
    assert_eq!(pool.retired_count(), 1, "the connection was retired");
    assert_eq!(pool.free_count(), SLOTS - 1, "and is not on the free list");
    // The thread's last connection is gone: its next transfers run on the
    // others.
    for seed in 16..20 {
        server.set_object(&pattern(LEN, seed));
        up.transfer(Op::Get, &server, HALF)
            .unwrap_or_else(|e| panic!("after the retirement: {e}"));
        assert_eq!(&up.buf[..HALF], &pattern(LEN, seed)[..HALF]);
    }
    assert!(up.all_free());
}

#[test]
fn completions_that_arrive_late_change_nothing_but_their_own_operation() {
    let up = Up::new();
    let server = up.world.server.clone();
    let fabric = up.world.platform.fabric.clone();
    let client_nic = hipobj_testing::world::CLIENT_NIC;
    // The bind before the accept completes late, but in time: the server
    // waits, then the transfer runs.
    fabric.hold_completions(client_nic, true);
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    server.set_object(&pattern(LEN, 15));
    std::thread::scope(|s| {
        let served = s.spawn(|| server.handle(&token.to_hex(), Op::Get));
        while fabric.held_completions() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        fabric.hold_completions(client_nic, false);
        fabric.release_completions();
        assert_eq!(served.join().unwrap(), b"200");
    });
    assert!(up.settle());
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 15)[..HALF]);
    // Too late: the bind outlives its timeout, the transfer fails (its
    // server is refused), and the completion, when it comes, is stale.
    fabric.hold_completions(client_nic, true);
    let token = up.inst.mint_token(up.slice(HALF), TokenOp::Get).unwrap();
    assert_eq!(server.handle(&token.to_hex(), Op::Get), b"500");
    fabric.hold_completions(client_nic, false);
    assert!(fabric.release_completions() > 0);
    assert!(up.settle());
    server.set_object(&pattern(LEN, 16));
    up.transfer(Op::Get, &server, HALF)
        .expect("usable afterwards");
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 16)[..HALF]);
}

#[test]
fn a_device_too_small_for_the_pool_fails_init_and_too_few_windows_fall_back() {
    let mut spec = WorldSpec::default();
    spec.client.limits.max_qp = 2;
    let world = World::with(spec);
    let baseline = world.platform.counters.snapshot();
    let current = Current::new();
    let err = current
        .init_with(world.platform(), config(), options())
        .unwrap_err();
    assert_eq!(err.code(), Code::Rdma, "{err}");
    assert_eq!(
        world.platform.counters.snapshot(),
        baseline,
        "nothing leaked"
    );
    let mut spec = WorldSpec::default();
    spec.client.limits.max_mw = 2;
    let up = Up::with(World::with(spec), options());
    assert_eq!(up.inst.mode, hipobj::core::connections::Mode::Regions);
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 17));
    up.transfer(Op::Get, &server, HALF)
        .expect("a transfer without windows");
    assert_eq!(&up.buf[..HALF], &pattern(LEN, 17)[..HALF]);
}

#[test]
fn a_server_device_with_a_small_max_msg_sz_moves_transfers_in_pieces() {
    let mut spec = WorldSpec::default();
    spec.server.max_msg_sz = 1000;
    let mut up = Up::with(World::with(spec), options());
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 18));
    up.transfer(Op::Get, &server, LEN).expect("a GET in pieces");
    assert_eq!(&up.buf[..], &pattern(LEN, 18)[..]);
    up.buf.copy_from_slice(&pattern(LEN, 19));
    up.transfer(Op::Put, &server, LEN).expect("a PUT in pieces");
    assert_eq!(server.object(LEN), pattern(LEN, 19));
}

/// Nanoseconds this thread has spent on a CPU (scheduler statistics).
fn cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    stat.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("the first field is the time on a CPU")
}

#[test]
fn a_thread_waiting_for_a_connection_sleeps() {
    let up = Up::with(
        World::new(),
        Options {
            max_transfers: 1,
            ..options()
        },
    );
    let server = up.world.server.clone();
    server.set_object(&pattern(LEN, 20));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        // The only connection, held inside a callback until released.
        let holder = s.spawn(|| {
            let mut s3 = hooked(&server, Op::Get, |_t: &Token| {
                rx.lock().unwrap().recv().unwrap();
            });
            up.inst.transfer(Direction::Get, up.slice(HALF), &mut s3)
        });
        while up.inst.pool().free_count() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let waiter = s.spawn(|| {
            let before = cpu_ns();
            let outcome = up.transfer(Op::Get, &server, HALF);
            (outcome, cpu_ns() - before)
        });
        std::thread::sleep(Duration::from_millis(300));
        tx.send(()).unwrap();
        holder.join().unwrap().expect("the holder's transfer");
        let (outcome, cpu) = waiter.join().unwrap();
        outcome.expect("the waiter's transfer, once the connection was free");
        // A spinning waiter would have burnt the 300 ms.
        assert!(
            cpu < 60_000_000,
            "the waiter used {} ms of CPU",
            cpu / 1_000_000
        );
    });
}
