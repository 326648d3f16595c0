//! Whole transfers through the C API on Soft-RoCE, for comparison with
//! perftest on the same device (`scripts/vm/bench.sh` runs both in the VM
//! lane and prints the ratios; `docs/performance.md` records them).
//!
//! The library runs GPU-less on `rxe0` with host buffers. The application's
//! S3 client is played in process: `sendRequest` hands the token to a
//! [`ServerSide`] on a second context of the same device, which moves the
//! bytes and sends the final message on the calling thread; `recvReply`
//! answers "200". Every configuration first checks the bytes of one
//! transfer per stream, then times whole `hipObjGet` / `hipObjPut` calls.
//!
//! Measured: throughput at 64 KiB, 1 MiB and 16 MiB, one stream and 16
//! (one thread and one buffer each); 8-byte GET latency on a reused
//! connection, with the time spent in the callbacks (the server side's
//! work) apart; and 8-byte GETs that each need a fresh RDMA CM handshake
//! (the server side drops every connection before each one). And, to
//! explain the reused connection's figure, the verbs its path is made of,
//! timed on the server side's connection: an RTS->RTS modify of the access
//! flags, and a memory window's bind and invalidation, each waited for as
//! the library waits, on the completion channel alone, and by polling.
//!
//! Each throughput configuration also says where the time went, per
//! transfer: in the server side, in the library before `sendRequest` and
//! after `recvReply`, and the calling threads' time on a CPU and waiting
//! for one (their scheduler statistics); and which of the device's
//! counters moved (retransmissions, duplicates).
//!
//! Output: one `name value unit` line per figure on stdout; progress and
//! failures on stderr. A missing device or a failed transfer or check ends
//! the run with status 1.
//!
//! Many processes on one host: `processes get|put BYTES PROCS THREADS`
//! starts PROCS copies of this program, each with its own instance, its own
//! server side and THREADS streams (`throughput ... --gate`), lets them all
//! start at once when every one has checked its bytes, and reports their
//! aggregate throughput, from the start to the last one's end.
//!
//! Run (inside the VM, as root): `rxe [latency | throughput get|put BYTES
//! STREAMS [--gate] | processes get|put BYTES PROCS THREADS] [--volume-mib
//! N] [--latency-iters N] [--handshake-iters N]`: everything, only the
//! latency figures (with the handshakes and the verbs), one throughput
//! configuration, or one split of streams over processes, so that a script
//! can alternate them with perftest's. `--gate` (for `processes`): after
//! the check, print `ready` and wait for a line on stdin before timing;
//! print `done` when the timed transfers end.

use std::ffi::{c_char, c_int, c_void, CString};
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use hipobj::capi::*;
use hipobj::core::token::Token;
use hipobj::core::{Instance, CURRENT};
use hipobj::platform::{self, next_rkey, Access, Cq, QpAttr, SendOp, SendWr, WcStatus};
use hipobj::server::{ClientQp, DialPolicy, LocalBuf, Op, ServerConfig, ServerSide};

/// The Soft-RoCE device the VM lane brings up.
const DEVICE: &str = "rxe0";
/// Concurrent streams, and the pool's connections (`HIPOBJ_MAX_TRANSFERS`).
const STREAMS: usize = 16;
/// The throughput sizes.
const SIZES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];
/// The small transfer of the latency figures.
const SMALL: usize = 8;
/// How long the server side may take over one transfer: 16 streams of
/// 16 MiB share a software device in an emulated machine.
const SERVE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the client may take to notice that the server side left.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// The device's counters (rdma_rxe's `rxe_hw_counters.c`): packets,
/// retransmissions, sequence errors, RNR NAKs.
const COUNTERS: &str = "/sys/class/infiniband/rxe0/ports/1/hw_counters";

type Outcome<T> = std::result::Result<T, String>;

/// What to measure.
#[derive(Clone, Copy)]
enum What {
    /// Everything.
    All,
    /// The latency figures: reused connection, the verbs, handshakes.
    Latency,
    /// One throughput configuration.
    Throughput { op: Op, size: usize, streams: usize },
    /// One throughput configuration over `procs` processes of `threads`
    /// streams each.
    Processes {
        op: Op,
        size: usize,
        procs: usize,
        threads: usize,
    },
}

/// Command-line settings.
struct Settings {
    what: What,
    /// Bytes each throughput configuration moves at least (every stream
    /// does the same number of transfers, at least one).
    volume: u64,
    /// Timed 8-byte GETs on a reused connection.
    latency_iters: usize,
    /// Timed 8-byte GETs, each on a fresh connection.
    handshake_iters: usize,
    /// Start the timed transfers on a line from stdin (`--gate`).
    gate: bool,
}

fn parse_args() -> Outcome<Settings> {
    let mut settings = Settings {
        what: What::All,
        volume: 64 << 20,
        latency_iters: 2000,
        handshake_iters: 40,
        gate: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| -> Outcome<u64> {
            let text = args.next().ok_or(format!("{arg} needs {what}"))?;
            match text.parse::<u64>() {
                Ok(v) if v > 0 => Ok(v),
                _ => Err(format!("{arg}: {text:?} is not a positive integer")),
            }
        };
        match arg.as_str() {
            // `cargo bench` passes --bench to a harness-less bench.
            "--bench" => {}
            "--volume-mib" => settings.volume = value("a size")? << 20,
            "--latency-iters" => settings.latency_iters = to_usize(value("a count")?)?,
            "--handshake-iters" => settings.handshake_iters = to_usize(value("a count")?)?,
            "--gate" => settings.gate = true,
            "latency" => settings.what = What::Latency,
            mode @ ("throughput" | "processes") => {
                let op = match args.next().as_deref() {
                    Some("get") => Op::Get,
                    Some("put") => Op::Put,
                    other => return Err(format!("{mode}: get or put, not {other:?}")),
                };
                let mut value = |what: &str| -> Outcome<usize> {
                    let text = args.next().ok_or(format!("{mode} needs {what}"))?;
                    text.parse::<usize>()
                        .map_err(|_| format!("{mode}: {text:?} is not a {what}"))
                };
                let size = value("size in bytes")?;
                if size == 0 || size > u32::MAX as usize {
                    return Err(format!("{mode}: {size} bytes is out of range"));
                }
                let (procs, streams) = match mode {
                    "processes" => (value("process count")?, value("thread count")?),
                    _ => (1, value("stream count")?),
                };
                if !(1..=STREAMS).contains(&streams) || !(1..=STREAMS).contains(&procs) {
                    return Err(format!(
                        "{mode}: 1 to {STREAMS} processes and streams, not {procs} and {streams}"
                    ));
                }
                settings.what = match mode {
                    "processes" => What::Processes {
                        op,
                        size,
                        procs,
                        threads: streams,
                    },
                    _ => What::Throughput { op, size, streams },
                };
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(settings)
}

fn to_usize(v: u64) -> Outcome<usize> {
    usize::try_from(v).map_err(|_| format!("{v} is too large"))
}

/// One figure, machine-readable.
fn report(name: &str, value: f64, unit: &str) {
    println!("{name} {value:.3} {unit}");
}

/// One duration, in µs.
fn report_us(name: &str, d: Duration) {
    report(name, d.as_secs_f64() * 1e6, "us");
}

/// The size as the figures' names spell it.
fn size_name(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{}MiB", size >> 20)
    } else if size >= 1 << 10 {
        format!("{}KiB", size >> 10)
    } else {
        format!("{size}B")
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Get => "get",
        Op::Put => "put",
    }
}

/// Fills `buf` with bytes that depend on `seed` and on their position, so
/// that a transfer landing at the wrong place or from the wrong stream
/// shows.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for word in buf.chunks_mut(8) {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

// ------------------------------------------------------------ the application

/// Where the time of one transfer went.
#[derive(Clone, Copy, Default)]
struct CallTimes {
    /// Inside `sendRequest` and `recvReply`.
    callbacks: Duration,
    /// In the server side: the proof (or the handshake), the data and the
    /// final message.
    serve: Duration,
    /// In the server side's `begin`: the in-band proof and the client's
    /// grant on a reused connection, the handshake on a fresh one.
    begin: Duration,
    /// The library's, from the call to `sendRequest`: the lease, the
    /// receive, the access grant, the window's bind.
    before: Duration,
    /// The library's, from `recvReply`'s return to the call's: the final
    /// message, the window's invalidation, the access revoked.
    after: Duration,
}

/// The application's S3 client of one thread: the `ctx` of its callbacks.
struct App<'a> {
    side: &'a ServerSide,
    local: &'a LocalBuf,
    op: Op,
    reply: &'static [u8],
    /// The server side's failure, if the last transfer had one.
    failure: Option<String>,
    times: CallTimes,
    /// The token of the last request.
    last_token: Option<Token>,
    /// When the library first called back, and when it was last called
    /// back from, in the current transfer.
    entered: Option<Instant>,
    left: Option<Instant>,
}

impl<'a> App<'a> {
    fn new(side: &'a ServerSide, local: &'a LocalBuf, op: Op) -> App<'a> {
        App {
            side,
            local,
            op,
            reply: b"500",
            failure: None,
            times: CallTimes::default(),
            last_token: None,
            entered: None,
            left: None,
        }
    }

    /// What the S3 server does with a request carrying `token`.
    fn serve(&mut self, token: &[u8]) -> Outcome<()> {
        let token = Token::parse_hex(token).map_err(|e| format!("token: {e:?}"))?;
        self.last_token = Some(token);
        let deadline = Instant::now() + SERVE_TIMEOUT;
        let start = Instant::now();
        let mut session = self
            .side
            .begin(&token, None, deadline)
            .map_err(|e| format!("begin: {e}"))?;
        self.times.begin += start.elapsed();
        let moved = match self.op {
            Op::Get => session.write(self.local, 0, 0, token.length),
            Op::Put => session.read(self.local, 0, 0, token.length),
        };
        let served = moved.and_then(|()| session.finish());
        self.times.serve += start.elapsed();
        served.map_err(|e| format!("serve: {e}"))
    }

    /// One whole `hipObjGet` or `hipObjPut` of `size` bytes at the start of
    /// `buf`. Returns its time and where it went.
    fn transfer(&mut self, buf: &mut [u8], size: usize) -> Outcome<(Duration, CallTimes)> {
        assert!(size <= buf.len(), "a transfer inside its buffer");
        self.times = CallTimes::default();
        self.failure = None;
        self.entered = None;
        self.left = None;
        let mut ops = hipObjOps_t {
            sendRequest: Some(send_request),
            recvReply: Some(recv_reply),
        };
        let ctx: *mut c_void = (self as *mut App).cast();
        let start = Instant::now();
        // SAFETY: `buf` is registered for its whole length and `size` fits
        // in it; `ops` and `ctx` (this App, reached only through the
        // callbacks while the call runs) outlive the call, which runs the
        // callbacks on this thread before it returns.
        let result = unsafe {
            match self.op {
                Op::Get => hipObjGet(
                    std::ptr::null_mut(),
                    buf.as_mut_ptr().cast(),
                    size,
                    0,
                    &mut ops,
                    ctx,
                ),
                Op::Put => hipObjPut(
                    std::ptr::null_mut(),
                    buf.as_ptr().cast(),
                    size,
                    0,
                    &mut ops,
                    ctx,
                ),
            }
        };
        let end = Instant::now();
        let elapsed = end - start;
        if let (Some(entered), Some(left)) = (self.entered, self.left) {
            self.times.before = entered - start;
            self.times.after = end - left;
        }
        if result.opError != hipObjOpError_t::hipObjSuccess {
            return Err(format!(
                "{} of {size} bytes: {:?} (server side: {})",
                op_name(self.op),
                result.opError,
                self.failure.as_deref().unwrap_or("no failure")
            ));
        }
        Ok((elapsed, self.times))
    }
}

/// `sendRequest`: the server side serves the token on this thread.
unsafe extern "C" fn send_request(ctx: *mut c_void, token: *const c_char, len: usize) -> c_int {
    let start = Instant::now();
    // SAFETY: `ctx` is the `App` whose `transfer` made this call, not
    // otherwise borrowed while the call runs; `token` holds `len` bytes.
    let (app, text) = unsafe {
        (
            &mut *ctx.cast::<App>(),
            std::slice::from_raw_parts(token.cast::<u8>(), len),
        )
    };
    app.entered.get_or_insert(start);
    app.reply = match app.serve(text) {
        Ok(()) => b"200",
        Err(e) => {
            app.failure = Some(e);
            b"500"
        }
    };
    app.times.callbacks += start.elapsed();
    0
}

/// `recvReply`: the server side's verdict.
unsafe extern "C" fn recv_reply(ctx: *mut c_void, reply: *mut c_char, len: *mut usize) -> c_int {
    let start = Instant::now();
    // SAFETY: as in `send_request`; `reply` has `*len` (512) writable bytes,
    // more than the three written.
    let app = unsafe {
        let app = &mut *ctx.cast::<App>();
        std::ptr::copy_nonoverlapping(app.reply.as_ptr(), reply.cast::<u8>(), app.reply.len());
        *len = app.reply.len();
        app
    };
    let end = Instant::now();
    app.times.callbacks += end - start;
    app.left = Some(end);
    0
}

// ------------------------------------------------------------ buffers

/// One stream's memory: the client buffer, registered with the library,
/// and the server side's, registered on its PD.
struct Stream {
    /// The server buffer's registration, released before the memory.
    local: LocalBuf,
    client: Box<[u8]>,
    server: Box<[u8]>,
}

impl Stream {
    /// Two buffers of `len` bytes, registered.
    fn new(side: &ServerSide, len: usize) -> Outcome<Stream> {
        let mut client = vec![0u8; len].into_boxed_slice();
        let mut server = vec![0u8; len].into_boxed_slice();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = side
            .pd()
            .reg_mr(server.as_mut_ptr() as usize, len, all)
            .map_err(|e| format!("server MR: {e}"))?;
        let local = LocalBuf {
            addr: mr.addr(),
            mr,
        };
        // Last, so that nothing can fail between this and the `Stream`
        // whose `Drop` deregisters it.
        // SAFETY: the buffer is registered for its whole length and is
        // deregistered in `Drop` before it is freed (fields drop after).
        let r = unsafe { hipObjBufRegisterHost(client.as_mut_ptr().cast(), len) };
        if r.opError != hipObjOpError_t::hipObjSuccess {
            return Err(format!("hipObjBufRegisterHost: {:?}", r.opError));
        }
        Ok(Stream {
            local,
            client,
            server,
        })
    }

    /// One transfer of `size` bytes whose bytes are checked: the source is
    /// filled from `seed`, the destination cleared first.
    fn checked(&mut self, app: &mut App, size: usize, seed: u64) -> Outcome<()> {
        let (src, dst) = match app.op {
            Op::Get => (&mut self.server, &mut self.client),
            Op::Put => (&mut self.client, &mut self.server),
        };
        fill(&mut src[..size], seed);
        dst[..size].fill(0);
        app.transfer(&mut self.client, size)?;
        let (src, dst) = match app.op {
            Op::Get => (&self.server, &self.client),
            Op::Put => (&self.client, &self.server),
        };
        if src[..size] != dst[..size] {
            return Err(format!(
                "{} of {size} bytes: the bytes differ",
                op_name(app.op)
            ));
        }
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the address is only compared with registered ones.
        let r = unsafe { hipObjBufDeregister(self.client.as_mut_ptr().cast()) };
        if r.opError != hipObjOpError_t::hipObjSuccess {
            eprintln!("bench: hipObjBufDeregister: {:?}", r.opError);
        }
    }
}

// ------------------------------------------------------------ figures

/// Sorted samples.
struct Samples(Vec<Duration>);

impl Samples {
    fn new(mut v: Vec<Duration>) -> Samples {
        v.sort_unstable();
        Samples(v)
    }

    /// The sample at `per_mille` of the way from the least to the
    /// greatest, by the nearest rank.
    fn quantile(&self, per_mille: usize) -> Duration {
        let last = self.0.len().saturating_sub(1);
        let rank = (last * per_mille + 500) / 1000;
        self.0.get(rank.min(last)).copied().unwrap_or_default()
    }

    fn median(&self) -> Duration {
        self.quantile(500)
    }

    fn mean(&self) -> Duration {
        let n = u32::try_from(self.0.len()).unwrap_or(u32::MAX).max(1);
        self.0.iter().sum::<Duration>() / n
    }
}

/// The device's counters now, by name.
fn counters() -> Vec<(String, u64)> {
    let dir = match std::fs::read_dir(COUNTERS) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("bench: no device counters: {COUNTERS}: {e}");
            return Vec::new();
        }
    };
    let mut all: Vec<(String, u64)> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let value = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), value))
        })
        .collect();
    all.sort();
    all
}

/// The calling thread's time on a CPU and time waiting for one, from
/// `/proc/thread-self/schedstat` (the kernel's
/// `Documentation/scheduler/sched-stats.rst`: nanoseconds, then
/// nanoseconds, then timeslices).
fn sched_times() -> Outcome<(Duration, Duration)> {
    let path = "/proc/thread-self/schedstat";
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    match (fields.next(), fields.next()) {
        (Some(Ok(on_cpu)), Some(Ok(waiting))) => {
            Ok((Duration::from_nanos(on_cpu), Duration::from_nanos(waiting)))
        }
        _ => Err(format!("{path}: unexpected {text:?}")),
    }
}

/// Reports the counters that moved since `before`, as `{name}_rxe_{counter}`.
fn report_counters(name: &str, before: &[(String, u64)]) {
    for (counter, after) in counters() {
        let was = before
            .iter()
            .find(|(c, _)| *c == counter)
            .map_or(0, |(_, v)| *v);
        if after > was {
            report(
                &format!("{name}_rxe_{counter}"),
                (after - was) as f64,
                "count",
            );
        }
    }
}

/// Whole transfers of `size` bytes on `streams.len()` threads at once,
/// `count` each, after one checked transfer each.
fn throughput(
    side: &ServerSide,
    streams: &mut [Stream],
    op: Op,
    size: usize,
    count: usize,
    seed: u64,
    gate: bool,
) -> Outcome<()> {
    let n = streams.len();
    let barrier = Barrier::new(n);
    let gate_passed = Barrier::new(n);
    let gate_failure = std::sync::Mutex::new(None::<String>);
    let before = counters();
    /// A thread's start and end, its transfers, and its time on a CPU and
    /// waiting for one meanwhile.
    type Run = (
        Instant,
        Instant,
        Vec<(Duration, CallTimes)>,
        (Duration, Duration),
    );
    let runs: Vec<Outcome<Run>> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter_mut()
            .enumerate()
            .map(|(i, stream)| {
                let (barrier, gate_passed, gate_failure) = (&barrier, &gate_passed, &gate_failure);
                s.spawn(move || -> Outcome<Run> {
                    let local = stream.local.clone();
                    let mut app = App::new(side, &local, op);
                    let checked = stream.checked(&mut app, size, seed ^ ((i as u64 + 1) << 32));
                    // Every thread reaches the barriers, even after a
                    // failure, so that the others are not left waiting.
                    barrier.wait();
                    if gate && i == 0 {
                        if let Err(e) = wait_at_gate() {
                            *gate_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        }
                    }
                    gate_passed.wait();
                    checked?;
                    if let Some(e) = gate_failure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone()
                    {
                        return Err(e);
                    }
                    let (cpu, waited) = sched_times()?;
                    let start = Instant::now();
                    let mut times = Vec::with_capacity(count);
                    for _ in 0..count {
                        times.push(app.transfer(&mut stream.client, size)?);
                    }
                    let end = Instant::now();
                    let (cpu_end, waited_end) = sched_times()?;
                    Ok((start, end, times, (cpu_end - cpu, waited_end - waited)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    if gate {
        println!("done");
    }
    let runs = runs.into_iter().collect::<Outcome<Vec<Run>>>()?;
    let start = runs.iter().map(|r| r.0).min().ok_or("no stream")?;
    let end = runs.iter().map(|r| r.1).max().ok_or("no stream")?;
    let on_cpu: Duration = runs.iter().map(|r| r.3 .0).sum();
    let waited: Duration = runs.iter().map(|r| r.3 .1).sum();
    let all: Vec<(Duration, CallTimes)> = runs.into_iter().flat_map(|r| r.2).collect();
    let bytes = (all.len() * size) as f64;
    let wall = (end - start).as_secs_f64();
    let name = format!("{}_{}_x{n}", op_name(op), size_name(size));
    report(
        &format!("{name}_throughput"),
        bytes / wall / f64::from(1 << 20),
        "MiB/s",
    );
    let transfer = Samples::new(all.iter().map(|t| t.0).collect());
    let serve = Samples::new(all.iter().map(|t| t.1.serve).collect());
    let own = Samples::new(
        all.iter()
            .map(|t| t.0.saturating_sub(t.1.callbacks))
            .collect(),
    );
    report_us(&format!("{name}_transfer_mean"), transfer.mean());
    report_us(&format!("{name}_server_side_mean"), serve.mean());
    report_us(&format!("{name}_library_mean"), own.mean());
    let before_calls = Samples::new(all.iter().map(|t| t.1.before).collect());
    let after_calls = Samples::new(all.iter().map(|t| t.1.after).collect());
    report_us(&format!("{name}_library_before_mean"), before_calls.mean());
    report_us(&format!("{name}_library_after_mean"), after_calls.mean());
    let transfers = u32::try_from(all.len()).map_err(|_| "too many transfers")?;
    report_us(&format!("{name}_on_cpu_mean"), on_cpu / transfers);
    report_us(&format!("{name}_runqueue_wait_mean"), waited / transfers);
    report(&format!("{name}_transfers"), all.len() as f64, "count");
    report(&format!("{name}_seconds"), wall, "s");
    report_counters(&name, &before);
    Ok(())
}

/// 8-byte GETs on a reused connection, one at a time. Returns the median
/// and the token of the last one.
fn latency(side: &ServerSide, stream: &mut Stream, iters: usize) -> Outcome<(Duration, Token)> {
    let local = stream.local.clone();
    let mut app = App::new(side, &local, Op::Get);
    stream.checked(&mut app, SMALL, 0x5eed)?;
    // Warm the path (the connection exists after the check).
    for _ in 0..iters.div_ceil(20) {
        app.transfer(&mut stream.client, SMALL)?;
    }
    let mut all = Vec::with_capacity(iters);
    for _ in 0..iters {
        all.push(app.transfer(&mut stream.client, SMALL)?);
    }
    let total = Samples::new(all.iter().map(|t| t.0).collect());
    let callbacks = Samples::new(all.iter().map(|t| t.1.callbacks).collect());
    let serve = Samples::new(all.iter().map(|t| t.1.serve).collect());
    let own = Samples::new(
        all.iter()
            .map(|t| t.0.saturating_sub(t.1.callbacks))
            .collect(),
    );
    let name = format!("latency_get_{}", size_name(SMALL));
    report_us(&format!("{name}_median"), total.median());
    report_us(&format!("{name}_p99"), total.quantile(990));
    report_us(&format!("{name}_mean"), total.mean());
    report_us(&format!("{name}_callbacks_median"), callbacks.median());
    report_us(&format!("{name}_server_side_median"), serve.median());
    let proof = Samples::new(all.iter().map(|t| t.1.begin).collect());
    report_us(&format!("{name}_proof_median"), proof.median());
    report_us(&format!("{name}_library_median"), own.median());
    let before_calls = Samples::new(all.iter().map(|t| t.1.before).collect());
    let after_calls = Samples::new(all.iter().map(|t| t.1.after).collect());
    report_us(
        &format!("{name}_library_before_median"),
        before_calls.median(),
    );
    report_us(
        &format!("{name}_library_after_median"),
        after_calls.median(),
    );
    report(&format!("{name}_iterations"), iters as f64, "count");
    let token = app.last_token.ok_or("no token was sent")?;
    Ok((total.median(), token))
}

/// How a work request's completion is waited for.
#[derive(Clone, Copy)]
enum Completion {
    /// `platform::wait_for_completion`, as the library waits for its
    /// window operations (it polls for up to `platform::SPIN`, then sleeps
    /// on the completion channel).
    Library,
    /// A poll, then the completion channel between polls (`Cq::wait`).
    Channel,
    /// Polling the CQ until the completion is there.
    Spin,
}

/// Posts `op` on `qp` and waits for its completion on `cq`.
fn post_and_complete(
    qp: &dyn hipobj::platform::Qp,
    cq: &dyn Cq,
    op: SendOp,
    how: Completion,
) -> Outcome<()> {
    const WR_ID: u64 = 0xbe_0c;
    qp.post_send(&[SendWr {
        wr_id: WR_ID,
        op,
        sge: None,
        signaled: true,
    }])
    .map_err(|e| format!("post: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let completion = match how {
        Completion::Library => {
            platform::wait_for_completion(cq, WR_ID, deadline).map_err(|e| format!("wait: {e}"))?
        }
        Completion::Channel | Completion::Spin => loop {
            let polled = cq.poll(16).map_err(|e| format!("poll: {e}"))?;
            if let Some(c) = polled.into_iter().find(|c| c.wr_id == WR_ID) {
                break Some(c);
            }
            if Instant::now() >= deadline {
                break None;
            }
            if matches!(how, Completion::Spin) {
                std::hint::spin_loop();
            } else if !cq.wait(deadline).map_err(|e| format!("wait: {e}"))? {
                break None;
            }
        },
    };
    match completion {
        Some(c) if c.status == WcStatus::Success => Ok(()),
        Some(c) => Err(format!("work request failed: {:?}", c.status)),
        None => Err("no completion within 5 s".into()),
    }
}

/// The verbs of the reused connection's path, on the server side's
/// connection to the client QP `token` names: no transfer runs meanwhile.
fn primitives(side: &ServerSide, token: &Token, iters: usize) -> Outcome<()> {
    let conn = side
        .connection(&ClientQp::of(token))
        .ok_or("no connection to the client QP")?;
    let conn = conn.lock();
    let mut region = vec![0u8; 4096].into_boxed_slice();
    let mr = side
        .pd()
        .reg_mr(
            region.as_mut_ptr() as usize,
            region.len(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::MW_BIND,
        )
        .map_err(|e| format!("MR: {e}"))?;
    let mw = side.pd().alloc_mw().map_err(|e| format!("MW: {e}"))?;
    let mut rkey = mw.rkey();
    let mut modify = Vec::with_capacity(2 * iters);
    for _ in 0..iters {
        for access in [Access::REMOTE_WRITE, Access::empty()] {
            let start = Instant::now();
            conn.qp
                .modify(&QpAttr {
                    access: Some(access),
                    ..QpAttr::default()
                })
                .map_err(|e| format!("modify: {e}"))?;
            modify.push(start.elapsed());
        }
    }
    report_us("verbs_modify_access_median", Samples::new(modify).median());
    for (how, name) in [
        (Completion::Library, "library"),
        (Completion::Channel, "channel"),
        (Completion::Spin, "spin"),
    ] {
        let (mut bind, mut inval) = (Vec::new(), Vec::new());
        for _ in 0..iters {
            rkey = next_rkey(rkey);
            let op = SendOp::BindMw {
                mw: mw.clone(),
                rkey,
                mr: mr.clone(),
                addr: mr.addr(),
                len: 4096,
                access: Access::REMOTE_WRITE,
            };
            let start = Instant::now();
            post_and_complete(&*conn.qp, &*conn.cq, op, how)?;
            bind.push(start.elapsed());
            let start = Instant::now();
            post_and_complete(&*conn.qp, &*conn.cq, SendOp::LocalInv { rkey }, how)?;
            inval.push(start.elapsed());
        }
        report_us(
            &format!("verbs_bind_{name}_median"),
            Samples::new(bind).median(),
        );
        report_us(
            &format!("verbs_invalidate_{name}_median"),
            Samples::new(inval).median(),
        );
    }
    drop(mw);
    drop(mr);
    drop(region);
    Ok(())
}

/// Disconnects the server side from every pool connection, then waits
/// until the library has noticed, so that the next transfer must connect.
fn drop_all(side: &ServerSide, instance: &Instance) -> Outcome<()> {
    side.disconnect_all();
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        if instance.pool().connected_free_count() == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err("the library did not notice the server side leaving".into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// 8-byte GETs that each start with an RDMA CM handshake.
fn handshake(
    side: &ServerSide,
    stream: &mut Stream,
    iters: usize,
    reused_median: Duration,
) -> Outcome<()> {
    let instance = CURRENT
        .instance()
        .map_err(|e| format!("no instance: {e}"))?;
    let local = stream.local.clone();
    let mut app = App::new(side, &local, Op::Get);
    drop_all(side, &instance)?;
    stream.checked(&mut app, SMALL, 0xface)?;
    let mut all = Vec::with_capacity(iters);
    let mut teardown = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        drop_all(side, &instance)?;
        teardown.push(start.elapsed());
        all.push(app.transfer(&mut stream.client, SMALL)?);
    }
    let total = Samples::new(all.iter().map(|t| t.0).collect());
    let connect = Samples::new(all.iter().map(|t| t.1.begin).collect());
    let callbacks = Samples::new(all.iter().map(|t| t.1.callbacks).collect());
    let teardown = Samples::new(teardown);
    let name = format!("handshake_get_{}", size_name(SMALL));
    report_us(&format!("{name}_median"), total.median());
    report_us(&format!("{name}_p99"), total.quantile(990));
    report_us(&format!("{name}_connect_median"), connect.median());
    report_us(&format!("{name}_callbacks_median"), callbacks.median());
    report_us(
        &format!("{name}_extra_median"),
        total.median().saturating_sub(reused_median),
    );
    report_us(&format!("{name}_teardown_median"), teardown.median());
    report(&format!("{name}_iterations"), iters as f64, "count");
    Ok(())
}

// ------------------------------------------------------------ processes

/// `--gate`: tells the parent this process is ready, and waits for its go.
fn wait_at_gate() -> Outcome<()> {
    use std::io::{BufRead, Write};
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")
        .and_then(|()| out.flush())
        .map_err(|e| format!("gate: {e}"))?;
    drop(out);
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) => Err("gate: the parent closed stdin".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("gate: {e}")),
    }
}

/// Reads `child`'s stdout up to a line `want`; the lines before it are
/// returned.
fn read_until(out: &mut impl std::io::BufRead, want: &str, child: usize) -> Outcome<Vec<String>> {
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        match out.read_line(&mut line) {
            Ok(0) => return Err(format!("process {child} ended before {want:?}")),
            Ok(_) if line.trim_end() == want => return Ok(seen),
            Ok(_) => seen.push(line.trim_end().to_owned()),
            Err(e) => return Err(format!("process {child}: {e}")),
        }
    }
}

/// `procs` processes of `threads` streams each, all timed from one start:
/// the aggregate throughput is every process's bytes over the time from
/// the go to the last `done`.
fn processes(
    settings: &Settings,
    op: Op,
    size: usize,
    procs: usize,
    threads: usize,
) -> Outcome<()> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().map_err(|e| format!("this program: {e}"))?;
    let volume_mib = (settings.volume >> 20).div_ceil(procs as u64).max(1);
    let mut children = Vec::with_capacity(procs);
    for _ in 0..procs {
        let child = Command::new(&exe)
            .args([
                "throughput",
                op_name(op),
                &size.to_string(),
                &threads.to_string(),
            ])
            .args(["--volume-mib", &volume_mib.to_string(), "--gate"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        children.push(child);
    }
    let outcome = (|| -> Outcome<()> {
        let mut outs = Vec::with_capacity(procs);
        for (i, child) in children.iter_mut().enumerate() {
            let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
            read_until(&mut out, "ready", i)?;
            outs.push(out);
        }
        let start = Instant::now();
        for child in &mut children {
            let stdin = child.stdin.as_mut().ok_or("no stdin")?;
            stdin
                .write_all(b"go\n")
                .and_then(|()| stdin.flush())
                .map_err(|e| format!("go: {e}"))?;
        }
        for (i, out) in outs.iter_mut().enumerate() {
            read_until(out, "done", i)?;
        }
        let wall = start.elapsed().as_secs_f64();
        let mut transfers = 0.0;
        for (i, out) in outs.iter_mut().enumerate() {
            let lines: Vec<String> = out
                .lines()
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            let count = lines
                .iter()
                .filter_map(|l| {
                    let mut f = l.split_whitespace();
                    let name = f.next()?;
                    name.ends_with("_transfers")
                        .then(|| f.next()?.parse::<f64>().ok())?
                })
                .next()
                .ok_or(format!("process {i} reported no transfers"))?;
            transfers += count;
        }
        let name = format!("{}_{}_p{procs}x{threads}", op_name(op), size_name(size));
        report(
            &format!("{name}_throughput"),
            transfers * size as f64 / wall / f64::from(1 << 20),
            "MiB/s",
        );
        report(&format!("{name}_transfers"), transfers, "count");
        report(&format!("{name}_seconds"), wall, "s");
        Ok(())
    })();
    // Every child is waited for; on a failure the others are stopped.
    let mut failed = Vec::new();
    for (i, mut child) in children.into_iter().enumerate() {
        if outcome.is_err() {
            let _ = child.kill();
        }
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => failed.push(format!("process {i}: {status}")),
            Err(e) => failed.push(format!("process {i}: {e}")),
        }
    }
    outcome?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

// ------------------------------------------------------------ main

fn run(settings: &Settings) -> Outcome<()> {
    let platform = platform::system();
    let verbs = platform.verbs().map_err(|e| format!("libibverbs: {e}"))?;
    let names = verbs.device_names().map_err(|e| format!("devices: {e}"))?;
    if !names.iter().any(|n| n == DEVICE) {
        return Err(format!(
            "no {DEVICE} (devices: {names:?}): run in the VM lane"
        ));
    }
    let ctx = verbs
        .open(DEVICE)
        .map_err(|e| format!("open {DEVICE}: {e}"))?;
    let pd = ctx.alloc_pd().map_err(|e| format!("PD: {e}"))?;
    let cm = platform.cm().map_err(|e| format!("librdmacm: {e}"))?;
    let config = ServerConfig {
        // Both sides are this process, on one device.
        dial: DialPolicy::any(),
        ..ServerConfig::default()
    };
    let side = ServerSide::with_config(cm, ctx, pd, config);

    let hint = CString::new(DEVICE).map_err(|e| e.to_string())?;
    let mut config = hipObjConfig_t {
        endpoint: std::ptr::null(),
        region: std::ptr::null(),
        accessKey: std::ptr::null(),
        secretKey: std::ptr::null(),
        flags: 0,
        gpuDevice: -1,
        nicHint: hint.as_ptr(),
    };
    // SAFETY: a valid config whose strings outlive the call.
    let init = unsafe { hipObjInit(&mut config) };
    if init.opError != hipObjOpError_t::hipObjSuccess {
        return Err(format!("hipObjInit: {:?}", init.opError));
    }
    let outcome = (|| -> Outcome<()> {
        let (count, len) = match settings.what {
            What::All => (STREAMS, SIZES[SIZES.len() - 1]),
            What::Latency => (1, SMALL),
            What::Throughput { size, streams, .. } => (streams, size),
            What::Processes { .. } => return Err("processes runs in the parent".into()),
        };
        let mut streams = (0..count)
            .map(|_| Stream::new(&side, len))
            .collect::<Outcome<Vec<_>>>()?;
        if matches!(settings.what, What::All | What::Latency) {
            eprintln!("bench: latency");
            let (reused, token) = latency(&side, &mut streams[0], settings.latency_iters)?;
            eprintln!("bench: verbs");
            primitives(&side, &token, settings.latency_iters.div_ceil(4))?;
            eprintln!("bench: handshakes");
            handshake(&side, &mut streams[0], settings.handshake_iters, reused)?;
        }
        let configs: Vec<(Op, usize, usize)> = match settings.what {
            What::All => [Op::Get, Op::Put]
                .into_iter()
                .flat_map(|op| SIZES.into_iter().map(move |size| (op, size)))
                .flat_map(|(op, size)| [(op, size, 1), (op, size, STREAMS)])
                .collect(),
            What::Latency | What::Processes { .. } => Vec::new(),
            What::Throughput { op, size, streams } => vec![(op, size, streams)],
        };
        for (seed, (op, size, n)) in (1..).zip(configs) {
            let count = to_usize(settings.volume.div_ceil((size * n) as u64))?.max(1);
            eprintln!(
                "bench: {} {} x{n}: {count} each",
                op_name(op),
                size_name(size)
            );
            throughput(
                &side,
                &mut streams[..n],
                op,
                size,
                count,
                seed,
                settings.gate,
            )?;
        }
        Ok(())
    })();
    let shutdown = hipObjShutdown();
    outcome?;
    if shutdown.opError != hipObjOpError_t::hipObjSuccess {
        return Err(format!("hipObjShutdown: {:?}", shutdown.opError));
    }
    Ok(())
}

fn main() -> ExitCode {
    let settings = match parse_args() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    // One connection per stream. No other thread runs yet.
    std::env::set_var("HIPOBJ_MAX_TRANSFERS", STREAMS.to_string());
    let outcome = match settings.what {
        What::Processes {
            op,
            size,
            procs,
            threads,
        } => processes(&settings, op, size, procs, threads),
        _ => run(&settings),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
