//! Asynchronous transfers of the Rust API (`Client::submit`, tickets, the
//! completion queue) on the fake platform: many in flight from one thread,
//! the bound, waiting by poll, wait and await, and every way a ticket can
//! end (cancelled in each phase, dropped while a server writes, the client
//! closed under it, servers that answer some requests and not others),
//! each exactly once, with no access or registration outliving it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use hipobj::client::{Client, ClientError, Route, S3Side, Ticket, Transfer};
use hipobj::core::token::parse_header;
use hipobj::core::Options;
use hipobj::server::Op;
use hipobj_testing::world::{TestServer, World};

const LONG: Option<Duration> = Some(Duration::from_secs(20));

fn client(world: &World, in_flight: usize) -> Client {
    Client::builder()
        .platform(world.platform())
        .options(Options {
            completion_timeout: Duration::from_secs(2),
            max_transfers: 16,
            ..Options::default()
        })
        .max_in_flight(in_flight)
        .build()
        .expect("a client on the fake platform")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0]).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// The world's server serves the request at once.
struct Serve(Arc<TestServer>, Op);

impl S3Side for Serve {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        String::from_utf8(self.0.handle(token.as_bytes(), self.1)).map_err(|e| e.to_string())
    }
}

/// Serves, counting the requests that run at once.
struct Counted {
    server: Arc<TestServer>,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    order: Option<(usize, Sender<usize>)>,
}

impl S3Side for Counted {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        if let Some((n, order)) = &self.order {
            let _ = order.send(*n);
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        let reply = self.server.handle(token.as_bytes(), Op::Get);
        self.now.fetch_sub(1, Ordering::SeqCst);
        String::from_utf8(reply).map_err(|e| e.to_string())
    }
}

/// A server that proves the token, says so, waits to be told to go on,
/// then writes the object and sends its final message; it reports whether
/// its write went through.
struct Held {
    server: Arc<TestServer>,
    proved: Sender<()>,
    go: Receiver<()>,
    wrote: Sender<bool>,
}

impl S3Side for Held {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        let token = parse_header(token.as_bytes()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut session = self
            .server
            .side()
            .begin(&token, None, deadline)
            .map_err(|f| f.error.to_string())?;
        let _ = self.proved.send(());
        let _ = self.go.recv();
        let wrote = session
            .write(&self.server.local(), 0, 0, token.length)
            .is_ok();
        let _ = self.wrote.send(wrote);
        if !wrote {
            return Ok("500".to_owned());
        }
        session.finish().map_err(|f| f.error.to_string())?;
        Ok("200".to_owned())
    }
}

/// What a held server's test keeps.
struct Hold {
    proved: Receiver<()>,
    go: Sender<()>,
    wrote: Receiver<bool>,
}

fn held(server: &Arc<TestServer>) -> (Held, Hold) {
    let (proved_tx, proved) = channel();
    let (go, go_rx) = channel();
    let (wrote_tx, wrote) = channel();
    (
        Held {
            server: server.clone(),
            proved: proved_tx,
            go: go_rx,
            wrote: wrote_tx,
        },
        Hold { proved, go, wrote },
    )
}

/// Submits a GET of the object's first `len` bytes into a new host buffer,
/// which a held server of the world's serves: the ticket, and what the
/// test keeps of the server.
fn submit_held(client: &Client, world: &World, len: usize) -> (Ticket, Hold) {
    let (side, hold) = held(&world.server);
    let ticket = client
        .submit(Transfer::get(
            client.host_buffer(len).unwrap(),
            0..len,
            side,
        ))
        .unwrap();
    (ticket, hold)
}

/// A GET of the object's first `len` bytes into a new host buffer, which
/// the world's server serves at once.
fn served_get(client: &Client, world: &World, len: usize) -> Transfer {
    Transfer::get(
        client.host_buffer(len).unwrap(),
        0..len,
        Serve(world.server.clone(), Op::Get),
    )
}

/// An S3 side that counts its calls and answers success without serving:
/// for a transfer whose request must never be sent.
struct Never(Arc<AtomicUsize>);

impl S3Side for Never {
    fn exchange(&mut self, _: &str) -> Result<String, String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok("200".into())
    }
}

/// An S3 request that fails, and one whose server answers success without
/// ever connecting.
enum Faulty {
    Fails,
    Silent,
}

impl S3Side for Faulty {
    fn exchange(&mut self, _token: &str) -> Result<String, String> {
        match self {
            Faulty::Fails => Err("connection reset by 192.0.2.7:9000".to_owned()),
            Faulty::Silent => Ok("200".to_owned()),
        }
    }
}

/// The time the driver takes to act on a command, with a wide margin.
fn settle() {
    std::thread::sleep(Duration::from_millis(200));
}

#[test]
fn sixteen_gets_in_flight_from_one_thread_are_each_byte_exact() {
    let world = World::new();
    let object = pattern(64 << 10, 3);
    world.server.set_object(&object);
    let client = client(&world, 16);
    assert_eq!(client.max_in_flight(), 16);
    // Each GET takes its own length, so that every buffer shows its own
    // transfer and nothing of another's.
    let tickets = client
        .submit_batch((1..=16).map(|n| {
            let buffer = client.host_buffer(64 << 10).unwrap();
            Transfer::get(buffer, 0..n * 4096, Serve(world.server.clone(), Op::Get))
        }))
        .unwrap();
    for (n, mut ticket) in (1..=16).zip(tickets) {
        let done = ticket.wait(LONG).expect("every ticket ends");
        assert_eq!(done.result.unwrap(), Route::Direct);
        let bytes = done.buffer.as_slice().unwrap();
        assert_eq!(&bytes[..n * 4096], &object[..n * 4096], "GET {n}");
        assert!(
            bytes[n * 4096..].iter().all(|&b| b == 0),
            "GET {n}: past its range"
        );
        assert!(ticket.poll().is_none(), "an end is handed out once");
    }
    assert_eq!(client.stats().library.direct, 16);
}

#[test]
fn puts_in_flight_send_their_buffers() {
    let world = World::new();
    let client = client(&world, 4);
    let data = pattern(32 << 10, 91);
    let mut buffer = client.host_buffer(32 << 10).unwrap();
    buffer.as_mut_slice().unwrap().copy_from_slice(&data);
    let mut ticket = client
        .submit(Transfer::put(
            buffer,
            0..data.len(),
            Serve(world.server.clone(), Op::Put),
        ))
        .unwrap();
    let done = ticket.wait(LONG).unwrap();
    done.result.unwrap();
    assert_eq!(world.server.object(data.len()), data);
}

#[test]
fn no_more_than_the_bound_run_at_once_and_the_queue_is_first_in_first_out() {
    let world = World::new();
    world.server.set_object(&pattern(4096, 1));
    let client = client(&world, 3);
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (order_tx, order) = channel();
    let tickets: Vec<_> = (0..12)
        .map(|n| {
            let side = Counted {
                server: world.server.clone(),
                now: now.clone(),
                most: most.clone(),
                // Only the queue's order is deterministic past the first
                // three, which start together.
                order: Some((n, order_tx.clone())),
            };
            client
                .submit(Transfer::get(
                    client.host_buffer(4096).unwrap(),
                    0..4096,
                    side,
                ))
                .unwrap()
        })
        .collect();
    for mut ticket in tickets {
        ticket.wait(LONG).unwrap().result.unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        3,
        "the bound is reached, never passed"
    );
    let started: Vec<usize> = order.try_iter().collect();
    assert_eq!(started.len(), 12);
    // Within the bound's slack, the transfers start in submission order.
    for (i, n) in started.iter().enumerate() {
        assert!(n.abs_diff(i) < 3, "transfer {n} started {i}th: {started:?}");
    }
}

/// A waker that unparks the thread that waits on it.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to its end on this thread, parking between polls: no
/// runtime, as a caller without one would.
fn block_on<F: std::future::Future>(future: F) -> (F::Output, usize) {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut polls = 0;
    loop {
        polls += 1;
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return (out, polls);
        }
        std::thread::park_timeout(Duration::from_secs(20));
    }
}

#[test]
fn a_ticket_is_awaited_through_its_waker() {
    let world = World::new();
    let object = pattern(16 << 10, 77);
    world.server.set_object(&object);
    let client = client(&world, 2);
    let (ticket, hold) = submit_held(&client, &world, 16 << 10);
    // The server waits for the first poll to have stored the waker.
    let go = std::thread::spawn(move || {
        hold.proved.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        hold.go.send(()).unwrap();
        hold.wrote.recv().unwrap()
    });
    let (done, polls) = block_on(ticket);
    assert!(go.join().unwrap());
    assert_eq!(done.result.unwrap(), Route::Direct);
    assert_eq!(done.buffer.as_slice().unwrap(), &object[..]);
    assert!(polls >= 2, "ready only after a wake-up ({polls} polls)");
}

#[test]
fn tagged_transfers_come_out_of_the_completion_queue_in_the_order_they_end() {
    let world = World::new();
    world.server.set_object(&pattern(8192, 5));
    let client = client(&world, 4);
    let (first, hold) = held(&world.server);
    client
        .submit_tagged(
            Transfer::get(client.host_buffer(8192).unwrap(), 0..8192, first),
            100,
        )
        .unwrap();
    hold.proved.recv().unwrap();
    for tag in 1..=3 {
        client
            .submit_tagged(served_get(&client, &world, 8192), tag)
            .unwrap();
    }
    let mut tags = Vec::new();
    for _ in 0..3 {
        let c = client.next_completion(LONG).unwrap();
        c.finished.result.unwrap();
        tags.push(c.tag);
    }
    tags.sort_unstable();
    assert_eq!(tags, [1, 2, 3], "the three quick ones first");
    assert!(client
        .next_completion(Some(Duration::from_millis(50)))
        .is_none());
    hold.go.send(()).unwrap();
    let last = client.next_completion(LONG).unwrap();
    assert_eq!(last.tag, 100);
    last.finished.result.unwrap();
    assert_eq!(
        last.finished.buffer.as_slice().unwrap(),
        &pattern(8192, 5)[..]
    );
}

#[test]
fn a_queued_ticket_cancelled_ends_at_once_with_its_buffer_and_no_request() {
    let world = World::new();
    let client = client(&world, 1);
    let (mut running, hold) = submit_held(&client, &world, 4096);
    hold.proved.recv().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut queued = client
        .submit(Transfer::get(
            client.host_buffer(4096).unwrap(),
            0..4096,
            Never(calls.clone()),
        ))
        .unwrap();
    assert!(queued.poll().is_none(), "queued behind the bound");
    queued.cancel();
    let done = queued.wait(Some(Duration::ZERO)).expect("ended at once");
    assert!(
        matches!(done.result, Err(ClientError::Cancelled)),
        "{:?}",
        done.result
    );
    assert_eq!(done.buffer.len(), 4096, "its buffer back");
    hold.go.send(()).unwrap();
    running.wait(LONG).unwrap().result.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "its request was never sent"
    );
}

/// The hostile case: a server that proved its token and is about to
/// write when the ticket is cancelled (or dropped) gets no access at all.
fn cancelled_while_the_server_writes(drop_it: bool) {
    let world = World::new();
    world.server.set_object(&pattern(32 << 10, 200));
    let client = client(&world, 2);
    let baseline = client.registered_buffers();
    let (mut ticket, hold) = submit_held(&client, &world, 32 << 10);
    hold.proved.recv().unwrap();
    if drop_it {
        drop(ticket);
        settle();
        hold.go.send(()).unwrap();
        assert!(
            !hold.wrote.recv().unwrap(),
            "a dropped ticket's server could still write"
        );
        // The worker drops the buffer once the outcome is in.
        let until = Instant::now() + Duration::from_secs(10);
        while client.registered_buffers() != baseline && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            client.registered_buffers(),
            baseline,
            "the buffer is released"
        );
    } else {
        ticket.cancel();
        settle();
        hold.go.send(()).unwrap();
        assert!(
            !hold.wrote.recv().unwrap(),
            "a cancelled ticket's server could still write"
        );
        let done = ticket.wait(LONG).unwrap();
        assert!(
            matches!(done.result, Err(ClientError::Cancelled)),
            "{:?}",
            done.result
        );
        assert!(
            done.buffer.as_slice().unwrap().iter().all(|&b| b == 0),
            "no byte of the object landed"
        );
    }
    // The library stays usable: the next transfer goes through.
    let mut next = client.submit(served_get(&client, &world, 4096)).unwrap();
    next.wait(LONG).unwrap().result.unwrap();
}

#[test]
fn a_ticket_cancelled_while_its_server_writes_revokes_the_access() {
    cancelled_while_the_server_writes(false);
}

#[test]
fn a_ticket_dropped_while_its_server_writes_revokes_the_access_and_frees_the_buffer() {
    cancelled_while_the_server_writes(true);
}

#[test]
fn a_ticket_that_ended_keeps_its_end_when_cancelled() {
    let world = World::new();
    world.server.set_object(&pattern(4096, 9));
    let client = client(&world, 1);
    let mut ticket = client.submit(served_get(&client, &world, 4096)).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !ticket.is_done() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    ticket.cancel();
    let done = ticket.wait(Some(Duration::ZERO)).unwrap();
    done.result.unwrap();
    assert_eq!(done.buffer.as_slice().unwrap(), &pattern(4096, 9)[..]);
}

#[test]
fn servers_that_answer_some_requests_and_not_others_end_each_ticket_once_with_its_cause() {
    let world = World::new();
    let object = pattern(8192, 44);
    world.server.set_object(&object);
    let client = client(&world, 6);
    let baseline = client.registered_buffers();
    let tickets = client
        .submit_batch((0..18).map(|n| {
            let buffer = client.host_buffer(8192).unwrap();
            match n % 3 {
                0 => Transfer::get(buffer, 0..8192, Serve(world.server.clone(), Op::Get)),
                1 => Transfer::get(buffer, 0..8192, Faulty::Fails),
                _ => Transfer::get(buffer, 0..8192, Faulty::Silent),
            }
        }))
        .unwrap();
    for (n, mut ticket) in tickets.into_iter().enumerate() {
        let done = ticket.wait(LONG).expect("every ticket ends");
        match (n % 3, &done.result) {
            (0, Ok(Route::Direct)) => assert_eq!(done.buffer.as_slice().unwrap(), &object[..]),
            (1, Err(ClientError::S3(why))) => assert!(why.contains("192.0.2.7:9000"), "{why}"),
            (2, Err(ClientError::Library(e))) => {
                assert!(
                    done.buffer.as_slice().unwrap().iter().all(|&b| b == 0),
                    "{e}"
                )
            }
            (_, other) => panic!("transfer {n}: {other:?}"),
        }
        assert!(ticket.poll().is_none() && ticket.wait(Some(Duration::ZERO)).is_none());
    }
    assert_eq!(
        client.registered_buffers(),
        baseline,
        "every buffer went with its end"
    );
    let stats = client.stats().library;
    assert_eq!(stats.direct, 6);
    // A synchronous transfer after them all still goes through.
    let mut buffer = client.host_buffer(8192).unwrap();
    client
        .get(
            &mut buffer,
            0..8192,
            &mut Serve(world.server.clone(), Op::Get),
        )
        .unwrap();
}

#[test]
fn closing_the_client_ends_every_ticket_and_revokes_the_running_ones() {
    let world = World::new();
    world.server.set_object(&pattern(8192, 12));
    let client = client(&world, 1);
    let (mut running, hold) = submit_held(&client, &world, 8192);
    hold.proved.recv().unwrap();
    let mut queued: Vec<_> = (0..3)
        .map(|_| client.submit(served_get(&client, &world, 8192)).unwrap())
        .collect();
    drop(client);
    for ticket in &mut queued {
        let done = ticket
            .wait(Some(Duration::ZERO))
            .expect("ended by the close");
        assert!(
            matches!(&done.result, Err(ClientError::Closed(_))),
            "{:?}",
            done.result
        );
    }
    settle();
    hold.go.send(()).unwrap();
    assert!(
        !hold.wrote.recv().unwrap(),
        "a closed client's server could still write"
    );
    let done = running.wait(LONG).unwrap();
    assert!(
        matches!(&done.result, Err(ClientError::Closed(_))),
        "{:?}",
        done.result
    );
    assert!(done.buffer.as_slice().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn a_completion_queue_whose_client_is_gone_drops_its_ends_without_leaking() {
    let world = World::new();
    world.server.set_object(&pattern(4096, 8));
    let baseline = world.platform.counters.snapshot();
    let hold = {
        let client = client(&world, 2);
        let (side, hold) = held(&world.server);
        client
            .submit_tagged(
                Transfer::get(client.host_buffer(4096).unwrap(), 0..4096, side),
                1,
            )
            .unwrap();
        hold.proved.recv().unwrap();
        for tag in 2..5 {
            client
                .submit_tagged(served_get(&client, &world, 4096), tag)
                .unwrap();
        }
        hold
    };
    settle();
    hold.go.send(()).unwrap();
    assert!(!hold.wrote.recv().unwrap(), "access outlived the client");
    // Every object the client made goes once its last transfer ended.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        world.server.side().forget_disconnected();
        let now = world.platform.counters.snapshot();
        if now == baseline {
            break;
        }
        assert!(
            Instant::now() < until,
            "objects left behind: {now:?} against {baseline:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_bad_range_ends_its_ticket_with_the_reason_and_the_buffer_back() {
    let world = World::new();
    let client = client(&world, 1);
    let calls = Arc::new(AtomicUsize::new(0));
    let buffer = client.host_buffer(4096).unwrap();
    let mut ticket = client
        .submit(Transfer::get(buffer, 4000..5000, Never(calls.clone())))
        .unwrap();
    let done = ticket.wait(LONG).unwrap();
    assert!(
        matches!(&done.result, Err(ClientError::Range(_))),
        "{:?}",
        done.result
    );
    assert_eq!(done.buffer.len(), 4096);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[test]
fn completions_hands_out_every_end_that_is_in_with_one_call() {
    let world = World::new();
    world.server.set_object(&pattern(4096, 21));
    let client = client(&world, 4);
    for tag in 0..5 {
        client
            .submit_tagged(served_get(&client, &world, 4096), tag)
            .unwrap();
    }
    let until = Instant::now() + Duration::from_secs(20);
    while client.stats().library.direct < 5 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    // The last end is queued just after the transfer is counted.
    std::thread::sleep(Duration::from_millis(50));
    let first = client.completions(3, Some(Duration::ZERO));
    assert_eq!(first.len(), 3, "at most the number asked for");
    let rest = client.completions(10, Some(Duration::ZERO));
    assert_eq!(rest.len(), 2, "then the others, without waiting");
    let mut tags: Vec<u64> = first.iter().chain(&rest).map(|c| c.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, [0, 1, 2, 3, 4]);
    assert!(client
        .completions(10, Some(Duration::from_millis(20)))
        .is_empty());
    assert!(
        client.completions(0, None).is_empty(),
        "asking for none never waits"
    );
}

#[test]
fn a_transfer_submitted_in_a_forked_child_is_handed_back() {
    let world = World::new();
    world.server.set_object(&pattern(4096, 5));
    // One transfer thread, started in the parent by a first transfer: the
    // child inherits the count of it, not the thread.
    let client = client(&world, 1);
    let mut first = client.submit(served_get(&client, &world, 4096)).unwrap();
    first.wait(LONG).unwrap().result.unwrap();
    let (one, tagged) = (
        served_get(&client, &world, 4096),
        served_get(&client, &world, 4096),
    );
    // SAFETY: the child only submits (no lock of another thread's is
    // taken: the client's queue is free, glibc's allocator is fork-safe)
    // and leaves by _exit, running no destructor of the parent's.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // Exit codes: 0 both handed back; 1 or 2, a ticket that ended (with
        // an error, or a success); 42, a ticket that never ended; 43, a
        // tagged transfer accepted.
        let mut code = match client.submit(one) {
            Err(_) => 0,
            Ok(mut ticket) => match ticket.wait(Some(Duration::from_secs(3))) {
                Some(done) if done.result.is_err() => 1,
                Some(_) => 2,
                None => 42,
            },
        };
        if code == 0 && client.submit_tagged(tagged, 7).is_ok() {
            code = 43;
        }
        // SAFETY: ends the child at once, as a forked child of a threaded
        // process must.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `pid` is this process's child; `status` is a writable int.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status),
        "the child ended by a signal: {status}"
    );
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "a transfer submitted in a forked child is handed back (42: its ticket never ended)"
    );
}
