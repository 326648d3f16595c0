//! What a transfer on a kept connection costs beyond its bytes, counted on
//! the fake fabric: the work requests each side posts, the ones it asks a
//! completion of, the completions it is given. Each figure is the least the
//! protocol allows (`docs/protocol.md`, "The sequence"); and the work
//! requests left unsignaled still report their failures.

use std::time::Duration;

use hipobj::core::transfer::Direction;
use hipobj::core::Options;
use hipobj::testing::fabric::Traffic;
use hipobj::testing::world::{HostClient, World, WorldSpec, CLIENT_NIC, SERVER_NIC};

const LEN: usize = 65536;
const N: u64 = 50;

fn up() -> (World, HostClient) {
    let world = World::with(WorldSpec::default());
    let options = Options {
        completion_timeout: Duration::from_secs(2),
        max_transfers: 1,
        ..Options::default()
    };
    let client = HostClient::new(&world, options, LEN).expect("init on the fake platform");
    (world, client)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[1] ^ i.to_le_bytes()[0]).wrapping_add(seed))
        .collect()
}

/// Per transfer: (posts, send work requests, signaled, completions) of
/// each side, over `N` transfers on the kept connection.
fn counted(world: &World, client: &mut HostClient, direction: Direction) -> [[u64; 4]; 2] {
    client.transfer(&world.server, direction, 0, LEN).unwrap();
    let fabric = &world.platform.fabric;
    fabric.reset_traffic();
    for i in 0..N {
        let data = pattern(LEN, u8::try_from(i).unwrap());
        match direction {
            Direction::Get => {
                world.server.set_object(&data);
                client.transfer(&world.server, direction, 0, LEN).unwrap();
                assert_eq!(&client.buf[..], &data[..], "GET {i}");
            }
            Direction::Put => {
                client.buf.copy_from_slice(&data);
                client.transfer(&world.server, direction, 0, LEN).unwrap();
                assert_eq!(world.server.object(LEN), data, "PUT {i}");
            }
        }
    }
    assert_eq!(
        client.instance.stats().handshakes,
        1,
        "one handshake, then kept"
    );
    [CLIENT_NIC, SERVER_NIC].map(|nic| {
        let t: Traffic = fabric.traffic(nic).expect("the world's device");
        for n in [t.post_sends, t.send_wrs, t.signaled, t.completions] {
            assert_eq!(n % N, 0, "{nic}: {t:?} over {N} transfers");
        }
        [t.post_sends, t.send_wrs, t.signaled, t.completions].map(|n| n / N)
    })
}

/// Holds each side of `N` transfers in `direction` to its (posts, send
/// work requests, signaled, completions) per transfer.
fn costs(direction: Direction, client_side: [u64; 4], server_side: [u64; 4]) {
    let (world, mut client) = up();
    let [c, s] = counted(&world, &mut client, direction);
    let what = "posts, work requests, signaled, completions";
    assert_eq!(c, client_side, "{direction:?}, client: {what}");
    assert_eq!(s, server_side, "{direction:?}, server: {what}");
}

#[test]
fn a_get_costs_the_client_one_completion_of_its_own_and_the_server_one() {
    // The client: bind and grant in one post, neither signaled; the
    // window's invalidation, signaled. Given: the proof, the final
    // message, the invalidation. The server: the proof (unsignaled); the
    // WRITE (unsignaled) and the final message behind it in one post.
    // Given: the grant and the final message's completion.
    costs(Direction::Get, [2, 3, 1, 3], [2, 3, 1, 2]);
}

#[test]
fn a_put_waits_for_its_reads_before_the_final_message() {
    // A READ may be retried after its response is lost: the final message
    // follows only its completion, so that the client never revokes a
    // range a READ still needs.
    costs(Direction::Put, [2, 3, 1, 3], [3, 3, 2, 3]);
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
