//! What a transfer on a kept connection costs beyond its bytes, counted on
//! the fake fabric: the work requests each side posts, the ones it asks a
//! completion of, the completions it is given. Each figure is the least the
//! protocol allows (`docs/protocol.md`, "The sequence"); and the work
//! requests left unsignaled still report their failures.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use hipobj::core::transfer::Direction;
use hipobj::core::Options;
use hipobj::server::ServerConfig;
use hipobj_testing::fabric::Traffic;
use hipobj_testing::world::{HostClient, TestServer, World, WorldSpec, CLIENT_NIC, SERVER_NIC};

const LEN: usize = 65536;
const N: u64 = 50;

/// A world whose client speaks up to version `client`, with a server
/// (its device's name) that speaks up to `server`.
fn up_to(client: u8, server: u8) -> (World, HostClient, Arc<TestServer>, &'static str) {
    let world = World::with(WorldSpec::default());
    let (server, nic) = match server {
        4 => (world.server.clone(), SERVER_NIC),
        v => {
            let config = ServerConfig {
                protocol: v,
                ..TestServer::config()
            };
            let old = world.add_server_with("old", Ipv4Addr::new(192, 0, 2, 33), LEN, config);
            (old, "old")
        }
    };
    let options = Options {
        completion_timeout: Duration::from_secs(2),
        max_transfers: 1,
        protocol: client,
        ..Options::default()
    };
    let client = HostClient::new(&world, options, LEN).expect("init on the fake platform");
    (world, client, server, nic)
}

fn up() -> (World, HostClient) {
    let (world, client, ..) = up_to(4, 4);
    (world, client)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[1] ^ i.to_le_bytes()[0]).wrapping_add(seed))
        .collect()
}

/// (posts, send work requests, signaled, completions) of each side, in
/// all, over `N` transfers on the kept connection.
fn counted(
    world: &World,
    client: &mut HostClient,
    (server, nic): (&TestServer, &str),
    direction: Direction,
) -> [[u64; 4]; 2] {
    client.transfer(server, direction, 0, LEN).unwrap();
    let fabric = &world.platform.fabric;
    fabric.reset_traffic();
    for i in 0..N {
        let data = pattern(LEN, u8::try_from(i).unwrap());
        match direction {
            Direction::Get => {
                server.set_object(&data);
                client.transfer(server, direction, 0, LEN).unwrap();
                assert_eq!(&client.buf[..], &data[..], "GET {i}");
            }
            Direction::Put => {
                client.buf.copy_from_slice(&data);
                client.transfer(server, direction, 0, LEN).unwrap();
                assert_eq!(server.object(LEN), data, "PUT {i}");
            }
        }
    }
    assert_eq!(
        client.instance.stats().handshakes,
        1,
        "one handshake, then kept"
    );
    [CLIENT_NIC, nic].map(|nic| {
        let t: Traffic = fabric.traffic(nic).expect("the world's device");
        [t.post_sends, t.send_wrs, t.signaled, t.completions]
    })
}

/// Holds each side of `N` transfers in `direction`, client and server of
/// the versions given, to its (posts, send work requests, signaled,
/// completions) in all.
fn costs(versions: (u8, u8), direction: Direction, client_side: [u64; 4], server_side: [u64; 4]) {
    let (world, mut client, server, nic) = up_to(versions.0, versions.1);
    let [c, s] = counted(&world, &mut client, (&server, nic), direction);
    let what = "posts, work requests, signaled, completions over 50 transfers";
    assert_eq!(c, client_side, "{direction:?} {versions:?}, client: {what}");
    assert_eq!(s, server_side, "{direction:?} {versions:?}, server: {what}");
}

/// Transfers per signaled grant in version 4: the bind and grant of four
/// transfers stay unretired (8, `UNRETIRED_MAX`), the fifth's grant is
/// signaled and retires them all.
const PER_SIGNALED: u64 = 5;

#[test]
fn a_get_costs_the_client_its_messages_alone_and_the_server_one_completion() {
    // The client: bind and grant in one post, the grant signaled one time
    // in five. Given: the proof and the final message, which invalidated
    // the window as it arrived. The server: the proof (unsignaled); the
    // WRITE (unsignaled) and the final message behind it in one post.
    // Given: the grant and the final message's completion.
    let signaled = N / PER_SIGNALED;
    let client = [N, 2 * N, signaled, 2 * N + signaled];
    costs((4, 4), Direction::Get, client, [2 * N, 3 * N, N, 2 * N]);
}

#[test]
fn a_put_waits_for_its_reads_before_the_final_message() {
    // A READ may be retried after its response is lost: the final message
    // follows only its completion, so that the client never revokes a
    // range a READ still needs.
    let signaled = N / PER_SIGNALED;
    let client = [N, 2 * N, signaled, 2 * N + signaled];
    costs((4, 4), Direction::Put, client, [3 * N, 3 * N, 2 * N, 3 * N]);
}

#[test]
fn before_version_4_the_client_invalidates_its_window_itself() {
    // A version-3 client, or a version-3 server: a final message with an
    // immediate, and the client's own invalidation, signaled, which
    // retires the bind and grant before it.
    for versions in [(3, 4), (4, 3)] {
        let client = [2 * N, 3 * N, N, 3 * N];
        costs(versions, Direction::Get, client, [2 * N, 3 * N, N, 2 * N]);
        costs(
            versions,
            Direction::Put,
            client,
            [3 * N, 3 * N, 2 * N, 3 * N],
        );
    }
}

#[test]
fn a_bind_that_fails_unsignaled_fails_its_transfer_and_names_the_bind() {
    let (world, client) = up();
    let first = pattern(LEN, 1);
    world.server.set_object(&first);
    client
        .transfer(&world.server, Direction::Get, 0, LEN)
        .unwrap();
    // The kept connection's next bind fails: the grant behind it is never
    // sent, the server writes nothing, and the error says why.
    world.platform.fabric.fail_binds(1);
    world.server.set_object(&pattern(LEN, 2));
    let err = client
        .transfer(&world.server, Direction::Get, 0, LEN)
        .expect_err("a transfer whose bind failed");
    let text = err.to_string();
    assert!(
        text.contains("Bind") && text.contains("MwBindErr"),
        "the error names the bind: {text}"
    );
    assert_eq!(
        &client.buf[..],
        &first[..],
        "nothing written without a grant"
    );
    // The library goes on: the next transfer connects afresh.
    let next = pattern(LEN, 3);
    world.server.set_object(&next);
    client
        .transfer(&world.server, Direction::Get, 0, LEN)
        .unwrap();
    assert_eq!(&client.buf[..], &next[..]);
}
