//! Striped transfers (protocol version 3) on the fake fabric: a large
//! transfer moves over several of the client's connections at once, each
//! proving the token for its own share and granting exactly that share;
//! and versions 2 and 3 serve each other. The hostile cases play the
//! server by hand (`Scripted`): a share's proof on the wrong connection,
//! for another share or token, twice; a final message before a share's
//! proof; a WRITE past a share; a share never proved; a share's
//! connection failing. Each ends with no access left on any share and a
//! client that still works.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hipobj::core::protocol::{decode_stripes, encode_connect, encode_connect_v3, final_imm, Share};
use hipobj::core::token::Token;
use hipobj::core::transfer::{Direction, S3Client};
use hipobj::core::Options;
use hipobj::platform::{SendOp, SendWr, WcStatus};
use hipobj::server::{probe, ClientQp, LocalBuf, Op, ServerConfig, ServerConn};
use hipobj_testing::world::{HostClient, Scripted, TestServer, World, WorldSpec};

/// The transfer: 1 MiB, striped over four connections of 256 KiB each.
const LEN: usize = 1 << 20;
const STRIPES: usize = 4;
const SLOTS: u32 = 8;
const SHORT: Duration = Duration::from_millis(300);

fn options() -> Options {
    Options {
        max_transfers: SLOTS,
        stripes: Some(STRIPES),
        stripe_min: 64 << 10,
        completion_timeout: Duration::from_millis(500),
        ..Options::default()
    }
}

fn world() -> World {
    World::with(WorldSpec {
        server_bytes: LEN,
        ..WorldSpec::default()
    })
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// Bytes that differ at every offset a test compares (no period of 256).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0]).wrapping_mul(31) ^ (i >> 8).to_le_bytes()[0] ^ seed)
        .collect()
}

fn client(world: &World, options: Options) -> HostClient {
    HostClient::new(world, options, LEN).expect("a client")
}

/// A client after a first striped GET, which leaves a kept connection on
/// every share's slot.
fn warmed() -> (World, std::sync::Arc<TestServer>, HostClient) {
    let world = world();
    let server = world.server.clone();
    let c = client(&world, options());
    c.transfer(&server, Direction::Get, 0, LEN).expect("warm");
    (world, server, c)
}

fn all_free(c: &HostClient) -> bool {
    let pool = c.instance.pool();
    let until = Instant::now() + Duration::from_secs(5);
    while pool.free_count() + pool.retired_count() != pool.total() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    pool.free_count() + pool.retired_count() == pool.total()
}

fn key(token: &Token, name: u32) -> ClientQp {
    ClientQp {
        gid: token.gid,
        qp_num: name,
        port: token.lid,
    }
}

/// Whether `rkey` still reaches `addr` through `server`'s kept connection
/// to the client connection `name` (a probe that fails breaks that
/// connection).
fn reaches(server: &TestServer, token: &Token, name: u32, addr: u64, rkey: u32) -> bool {
    matches!(
        server.probe(&key(token, name), Op::Get, addr, rkey, 64),
        Some(WcStatus::Success)
    )
}

#[test]
fn large_gets_and_puts_move_over_every_share_byte_exact() {
    let world = world();
    let server = world.server.clone();
    let c = client(&world, options());
    let object = pattern(LEN, 1);
    server.set_object(&object);

    c.transfer(&server, Direction::Get, 0, LEN)
        .expect("a striped GET");
    assert_eq!(&c.buf[..], &object[..]);
    let stats = c.instance.stats();
    assert_eq!(stats.handshakes, STRIPES as u64, "one connection per share");
    assert_eq!(server.side().connection_count(), STRIPES);
    assert!(all_free(&c));

    // Again, on the kept connections: every share proved in-band.
    let mut again = c.buf.to_vec();
    again.iter_mut().for_each(|b| *b = 0);
    server.set_object(&pattern(LEN, 2));
    c.transfer(&server, Direction::Get, 0, LEN).expect("again");
    assert_eq!(&c.buf[..], &pattern(LEN, 2)[..]);
    let stats = c.instance.stats();
    assert_eq!(stats.handshakes, STRIPES as u64);
    assert_eq!(stats.reused, STRIPES as u64);

    // A PUT, and a range that starts and ends inside shares.
    let mut local = c.buf.clone();
    local.copy_from_slice(&pattern(LEN, 3));
    let ptr = c.buf.as_ptr() as *mut u8;
    // SAFETY: the buffer is the client's own, and no transfer runs now.
    unsafe { std::ptr::copy_nonoverlapping(local.as_ptr(), ptr, LEN) };
    c.transfer(&server, Direction::Put, 0, LEN)
        .expect("a striped PUT");
    assert_eq!(server.object(LEN), pattern(LEN, 3));
    server.set_object(&pattern(LEN, 4));
    let (at, n) = (12_345, LEN - 70_000);
    c.transfer(&server, Direction::Get, at, n).expect("a range");
    assert_eq!(&c.buf[at..at + n], &pattern(LEN, 4)[..n]);
    assert_eq!(&c.buf[..at], &pattern(LEN, 3)[..at], "nothing before it");
    assert!(all_free(&c));
    assert_eq!(server.side().connection_count(), STRIPES);
}

#[test]
fn small_transfers_and_a_single_stripe_stay_on_one_connection() {
    let world = world();
    let server = world.server.clone();
    server.set_object(&pattern(LEN, 5));
    let c = client(&world, options());
    c.transfer(&server, Direction::Get, 0, 32 << 10)
        .expect("below the threshold");
    assert_eq!(server.side().connection_count(), 1);
    let one = client(
        &world,
        Options {
            stripes: Some(1),
            ..options()
        },
    );
    let other = world.add_server("srv1", Ipv4Addr::new(192, 0, 2, 31), LEN);
    other.set_object(&pattern(LEN, 6));
    one.transfer(&other, Direction::Get, 0, LEN)
        .expect("one stripe");
    assert_eq!(&one.buf[..], &pattern(LEN, 6)[..]);
    assert_eq!(other.side().connection_count(), 1);
}

#[test]
fn a_version_2_server_serves_a_striping_client_whole() {
    let world = world();
    let old = world.add_server_with(
        "srv2",
        Ipv4Addr::new(192, 0, 2, 32),
        LEN,
        ServerConfig {
            protocol: 2,
            ..TestServer::config()
        },
    );
    old.set_object(&pattern(LEN, 7));
    let c = client(&world, options());
    for _ in 0..2 {
        c.transfer(&old, Direction::Get, 0, LEN).expect("a GET");
        assert_eq!(&c.buf[..], &pattern(LEN, 7)[..]);
    }
    assert_eq!(old.side().connection_count(), 1, "never striped");
    let stats = c.instance.stats();
    assert_eq!((stats.handshakes, stats.reused), (1, 1));
}

#[test]
fn a_striping_server_serves_a_version_2_client_and_remembers_it() {
    let world = world();
    let server = world.server.clone();
    server.set_object(&pattern(LEN, 8));
    let old = client(
        &world,
        Options {
            protocol: 2,
            ..options()
        },
    );
    old.transfer(&server, Direction::Get, 0, LEN)
        .expect("a GET");
    assert_eq!(&old.buf[..], &pattern(LEN, 8)[..]);
    assert_eq!(server.side().connection_count(), 1, "never striped");
    assert_eq!(server.side().version_2_clients(), 1, "remembered");
    // In-band on the kept connection, then afresh in version 2 at once.
    server.set_object(&pattern(LEN, 9));
    old.transfer(&server, Direction::Get, 0, LEN)
        .expect("again");
    assert_eq!(&old.buf[..], &pattern(LEN, 9)[..]);
    server.side().disconnect_all();
    server.set_object(&pattern(LEN, 10));
    old.transfer(&server, Direction::Get, 0, LEN)
        .expect("after a disconnect");
    assert_eq!(&old.buf[..], &pattern(LEN, 10)[..]);
    let stats = old.instance.stats();
    assert_eq!((stats.handshakes, stats.reused), (2, 1));
}

/// Share 0 proved on the server's kept connection: the client's plan.
fn prove_share_0_in_band(server: &TestServer, token: &Token) -> Vec<Share> {
    let c0 = server
        .side()
        .connection(&key(token, token.qp_num))
        .expect("kept");
    let mut c0 = c0.lock();
    hipobj::server::prove_share(&mut c0, token, 0, deadline())
        .expect("share 0")
        .expect("a plan")
}

/// A hand-played transfer that must fail: `s3` plays the server. Nothing
/// lands in the buffer, every connection comes back, and the client's
/// next GET (of `server`'s object, seeded `seed`) works.
fn fails_and_stays_usable(c: &HostClient, server: &TestServer, s3: &mut dyn S3Client, seed: u8) {
    let before = c.buf.to_vec();
    let outcome = c
        .instance
        .transfer(Direction::Get, c.slice(0, LEN).unwrap(), s3);
    assert!(outcome.is_err(), "{outcome:?}");
    assert_eq!(&c.buf[..], &before[..], "nothing landed");
    assert!(all_free(c));
    server.set_object(&pattern(LEN, seed));
    c.transfer(server, Direction::Get, 0, LEN).expect("usable");
    assert_eq!(&c.buf[..], &pattern(LEN, seed)[..]);
}

/// What a hand-played server has after share 0's connect: that
/// connection and the client's plan.
fn share_0(server: &TestServer, token: &Token) -> (ServerConn, Vec<Share>) {
    let conn = server
        .side()
        .connect_with(
            token,
            &encode_connect_v3(token, 0, token.qp_num),
            deadline(),
        )
        .expect("share 0 connects");
    let plan = decode_stripes(conn.cm.reply_data(), token).expect("the REP carries a plan");
    assert_eq!(plan.len(), STRIPES);
    (conn, plan)
}

fn connect_share(
    server: &TestServer,
    token: &Token,
    share: u16,
    name: u32,
) -> hipobj::core::Result<ServerConn> {
    server
        .side()
        .connect_with(token, &encode_connect_v3(token, share, name), deadline())
}

/// One raw WRITE of `len` bytes of the object store at `offset` to the
/// client's `addr` with `rkey`.
fn write(
    server: &TestServer,
    conn: &ServerConn,
    offset: u64,
    addr: u64,
    rkey: u32,
    len: u64,
) -> Option<WcStatus> {
    let local = LocalBuf {
        addr: server.local().addr + offset,
        ..server.local()
    };
    probe(
        conn,
        Op::Get,
        &local,
        addr,
        rkey,
        u32::try_from(len).unwrap(),
        deadline(),
    )
}

/// A final message on `conn`, waited for.
fn send_final(conn: &mut ServerConn, imm: u32) -> bool {
    let id = conn.next_wr();
    if conn
        .qp
        .post_send(&[SendWr {
            wr_id: id,
            op: SendOp::SendImm { imm },
            sge: None,
            signaled: true,
        }])
        .is_err()
    {
        return false;
    }
    let until = deadline();
    loop {
        if let Ok(Some(c)) = conn.cq.poll(1).map(|v| v.into_iter().next()) {
            return c.status == WcStatus::Success;
        }
        if Instant::now() >= until || !conn.cq.wait(until).unwrap_or(false) {
            return false;
        }
    }
}

#[test]
fn every_share_must_be_proved_on_its_own_connection_for_its_own_index() {
    let world = world();
    let server = world.server.clone();
    let object = pattern(LEN, 11);
    server.set_object(&object);
    let c = client(&world, options());
    let mut s3 = Scripted::new(|t: &Token| {
        let (mut c0, plan) = share_0(&server, t);
        let mut wrong = *t;
        wrong.secret ^= 1;
        let refused = [
            (
                "share 1 on share 2's connection",
                connect_share(&server, t, 1, plan[2].name),
            ),
            (
                "share 1 on the token's own connection",
                connect_share(&server, t, 1, t.qp_num),
            ),
            (
                "share 1 with another secret",
                connect_share(&server, &wrong, 1, plan[1].name),
            ),
            (
                "share 1 in version 2",
                server
                    .side()
                    .connect_with(t, &encode_connect(t), deadline()),
            ),
        ];
        for (what, outcome) in refused {
            assert!(outcome.is_err(), "{what}: accepted");
        }
        let mut conns: Vec<ServerConn> = Vec::new();
        for (i, share) in plan.iter().enumerate().skip(1) {
            conns.push(
                connect_share(&server, t, u16::try_from(i).unwrap(), share.name)
                    .expect("its own share"),
            );
        }
        assert!(
            connect_share(&server, t, 1, plan[1].name).is_err(),
            "a share is proved once"
        );
        // Each share's data through its own connection and key.
        assert_eq!(
            write(&server, &c0, 0, plan[0].addr, plan[0].rkey, plan[0].len),
            Some(WcStatus::Success)
        );
        for (i, conn) in conns.iter().enumerate() {
            let s = plan[i + 1];
            let offset = s.addr - t.addr;
            assert_eq!(
                write(&server, conn, offset, s.addr, s.rkey, s.len),
                Some(WcStatus::Success)
            );
        }
        assert!(send_final(&mut c0, final_imm(t.secret)));
        for conn in &mut conns {
            assert!(send_final(conn, final_imm(t.secret)));
        }
        b"200".to_vec()
    });
    c.instance
        .transfer(Direction::Get, c.slice(0, LEN).unwrap(), &mut s3)
        .expect("the shares proved properly");
    assert_eq!(&c.buf[..], &object[..]);
    assert!(all_free(&c));
    // The client is as usable as before.
    server.set_object(&pattern(LEN, 12));
    c.transfer(&server, Direction::Get, 0, LEN).expect("next");
    assert_eq!(&c.buf[..], &pattern(LEN, 12)[..]);
}

#[test]
fn a_share_reaches_only_its_own_range_and_a_write_past_it_fails_the_whole() {
    let world = world();
    let server = world.server.clone();
    let c = client(&world, options());
    let mut seen = None;
    let mut s3 = Scripted::new(|t: &Token| {
        seen = Some(*t);
        let (_c0, plan) = share_0(&server, t);
        let c1 = connect_share(&server, t, 1, plan[1].name).expect("share 1");
        // One byte past share 1, with share 1's key: refused.
        let past = write(
            &server,
            &c1,
            0,
            plan[1].addr + plan[1].len - 32,
            plan[1].rkey,
            64,
        );
        assert_ne!(
            past,
            Some(WcStatus::Success),
            "a WRITE past its share landed"
        );
        b"200".to_vec()
    });
    fails_and_stays_usable(&c, &server, &mut s3, 13);
    drop(s3);
    seen.expect("a token");
}

#[test]
fn a_share_never_proved_fails_the_whole_and_revokes_every_other_share() {
    let (_world, server, c) = warmed();
    let mut plan_seen = Vec::new();
    let mut token_seen = None;
    let mut s3 = Scripted::new(|t: &Token| {
        token_seen = Some(*t);
        let side = server.side();
        let plan = prove_share_0_in_band(&server, t);
        // Shares 1 and 2 proved, share 3 never.
        for (i, share) in plan.iter().enumerate().take(3).skip(1) {
            let conn = side.connection(&key(t, share.name)).expect("kept");
            let mut conn = conn.lock();
            hipobj::server::prove_share(&mut conn, t, u16::try_from(i).unwrap(), deadline())
                .expect("granted");
        }
        plan_seen = plan;
        b"200".to_vec()
    });
    let started = Instant::now();
    let outcome = c
        .instance
        .transfer(Direction::Get, c.slice(0, LEN).unwrap(), &mut s3);
    let err = outcome.expect_err("a share was never proved");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "ended at the deadline"
    );
    assert!(err.to_string().contains("did not end"), "{err}");
    assert!(all_free(&c));
    let t = token_seen.unwrap();
    for share in &plan_seen {
        assert!(
            !reaches(&server, &t, share.name, share.addr, share.rkey),
            "share at {:#x} still reachable",
            share.addr
        );
    }
    c.transfer(&server, Direction::Get, 0, LEN).expect("usable");
}

#[test]
fn a_final_message_before_a_shares_proof_gets_its_server_nothing() {
    let world = world();
    let server = world.server.clone();
    let object = pattern(LEN, 14);
    server.set_object(&object);
    let c = client(&world, options());
    c.transfer(&server, Direction::Get, 0, LEN).expect("warm");
    let mut s3 = Scripted::new(|t: &Token| {
        let side = server.side();
        let plan = prove_share_0_in_band(&server, t);
        // Share 1's final message first: its connection is dropped, and a
        // proof on it afterwards gets no grant.
        assert!(server
            .send_final(&key(t, plan[1].name), final_imm(t.secret), SHORT)
            .is_ok());
        let conn = side.connection(&key(t, plan[1].name)).expect("kept");
        let mut conn = conn.lock();
        assert!(hipobj::server::prove_share(&mut conn, t, 1, Instant::now() + SHORT).is_err());
        b"500".to_vec()
    });
    fails_and_stays_usable(&c, &server, &mut s3, 15);
}

#[test]
fn a_share_whose_connection_fails_mid_transfer_fails_the_whole() {
    let (_world, server, c) = warmed();
    let mut plan_seen = Vec::new();
    let mut token_seen = None;
    let mut s3 = Scripted::new(|t: &Token| {
        token_seen = Some(*t);
        let side = server.side();
        let mut conns = Vec::new();
        let plan = prove_share_0_in_band(&server, t);
        for (i, share) in plan.iter().enumerate().skip(1) {
            let conn = side.connection(&key(t, share.name)).expect("kept");
            hipobj::server::prove_share(&mut conn.lock(), t, u16::try_from(i).unwrap(), deadline())
                .expect("granted");
            conns.push(conn);
        }
        // Share 2's connection dies.
        let _ = conns[1].lock().cm.disconnect();
        std::thread::sleep(Duration::from_millis(50));
        plan_seen = plan;
        b"200".to_vec()
    });
    fails_and_stays_usable(&c, &server, &mut s3, 17);
    drop(s3);
    let t = token_seen.unwrap();
    for share in &plan_seen {
        assert!(!reaches(&server, &t, share.name, share.addr, share.rkey));
    }
}

#[test]
fn after_a_striped_transfer_no_share_is_reachable() {
    let (_world, server, c) = warmed();
    let mut token_seen = None;
    let mut plan_seen = Vec::new();
    let mut s3 = Scripted::new(|t: &Token| {
        token_seen = Some(*t);
        // Our server, in full; the plan is read back from the connections.
        let mut session = server.side().begin(t, None, deadline()).expect("proved");
        plan_seen = session.shares();
        session
            .write(&server.local(), 0, 0, t.length)
            .expect("the data");
        session.finish().expect("the final messages");
        b"200".to_vec()
    });
    c.instance
        .transfer(Direction::Get, c.slice(0, LEN).unwrap(), &mut s3)
        .expect("a striped GET");
    let t = token_seen.unwrap();
    assert_eq!(plan_seen.len(), STRIPES);
    assert_eq!(server.side().connection_count(), STRIPES);
    // Through each share's kept connection, still established: its key
    // reaches nothing once the transfer is over.
    let before = c.buf.to_vec();
    server.set_object(&pattern(LEN, 16));
    for share in &plan_seen {
        assert!(
            !reaches(&server, &t, share.name, share.addr, share.rkey),
            "share at {:#x} still reachable",
            share.addr
        );
    }
    assert_eq!(&c.buf[..], &before[..]);
}
