//! Whole transfers through the C API on Soft-RoCE, for comparison with
//! perftest on the same device (`scripts/vm/bench.sh` runs both in the VM
//! lane and prints the ratios; `docs/performance.md` records them).
//!
//! The library runs GPU-less on `rxe0` (or the device the hardware lane names:
//! `tests/common/lane.rs`) with host buffers. The application's
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
//! starts PROCS copies of this program, each with its own instance and
//! THREADS streams (`throughput ... --gate --server SOCKET`), lets them all
//! start at once when every one has checked its bytes, and reports their
//! aggregate throughput, from the start to the last one's end, and each
//! per-transfer mean of theirs (where the time went) averaged over them, the
//! CPUs' time by kind over the timed transfers (`/proc/stat`), and the
//! processes' own CPU time (the children's added up, and the parent's). The parent
//! is their one server, as an S3 server is for a host's processes: one
//! context and one server side, a thread per stream, reached over a Unix
//! socket per stream that carries the token and the verdict (`--server`).
//!
//! Many in flight from one thread: `inflight get|put BYTES N` moves the
//! same transfers through the Rust API as N threads with one transfer each
//! and as one thread that keeps N tickets in flight (`Client::submit_tagged`,
//! `Client::completions`, resubmitting as they end), alternating twice, and reports both and
//! their ratio, with the process's CPU time per ticket.
//!
//! Run (inside the VM, as root): `rxe [latency | throughput get|put BYTES
//! STREAMS [--gate] | processes get|put BYTES PROCS THREADS | inflight
//! get|put BYTES N] [--volume-mib
//! N] [--latency-iters N] [--handshake-iters N]`: everything, only the
//! latency figures (with the handshakes and the verbs), one throughput
//! configuration, or one split of streams over processes, so that a script
//! can alternate them with perftest's. `--gate` (for `processes`): after
//! the check, print `ready` and wait for a line on stdin before timing;
//! print `done` when the timed transfers end. `--server SOCKET` (for
//! `throughput`): the server side is the process listening there.
//!
//! `HIPOBJ_POLL_US` sets how long both sides poll before they sleep, the
//! library and the server side alike (0 on Soft-RoCE unless set).

use std::ffi::{c_char, c_int, c_void, CString};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use hipobj::capi::*;
use hipobj::core::token::Token;
use hipobj::core::{Instance, CURRENT};
use hipobj::platform::{self, next_rkey, Access, Cq, QpAttr, SendOp, SendWr, WcStatus};
use hipobj::server::{ClientQp, DialPolicy, LocalBuf, Op, ServerConfig, ServerSide};

#[path = "../tests/common/lane.rs"]
mod lane;
#[path = "common/rusage.rs"]
mod rusage;

use lane::device;
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
/// The device's counters (rdma_rxe's `rxe_hw_counters.c`: packets,
/// retransmissions, sequence errors, RNR NAKs; a hardware device's own).
fn counters_dir() -> String {
    format!("/sys/class/infiniband/{}/ports/1/hw_counters", device())
}

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
    /// `streams` transfers in flight through the Rust API, two ways in one
    /// process: `streams` threads with one each, and one thread with
    /// `streams` tickets.
    InFlight { op: Op, size: usize, streams: usize },
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
    /// The server process's socket (`--server`); `None`: in process.
    server: Option<PathBuf>,
}

fn parse_args() -> Outcome<Settings> {
    let mut settings = Settings {
        what: What::All,
        volume: 64 << 20,
        latency_iters: 2000,
        handshake_iters: 40,
        gate: false,
        server: None,
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
            "--server" => {
                settings.server = Some(args.next().ok_or("--server needs a socket path")?.into())
            }
            "latency" => settings.what = What::Latency,
            mode @ ("throughput" | "processes" | "inflight") => {
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
                    "inflight" => What::InFlight { op, size, streams },
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
    if settings.server.is_some() && !matches!(settings.what, What::Throughput { .. }) {
        return Err("--server is for throughput".into());
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

/// Where a stream's requests are served.
#[derive(Clone, Copy)]
enum Server<'a> {
    /// By the server side in this process, on the calling thread.
    Here(&'a ServerSide),
    /// By the server process listening on this socket.
    Process(&'a Path),
}

/// One stream's way to its server.
enum Serving<'a> {
    /// The server side in this process, and the stream's buffer there.
    Here {
        side: &'a ServerSide,
        local: LocalBuf,
    },
    /// A connection to the server process: a line out (`SEED TOKEN`),
    /// a line back (`200`, or `500` and why).
    Process {
        to: UnixStream,
        from: BufReader<UnixStream>,
    },
}

impl<'a> Serving<'a> {
    /// The way to `server` for `stream`.
    fn new(server: Server<'a>, stream: &Stream) -> Outcome<Serving<'a>> {
        match (server, &stream.here) {
            (Server::Here(side), Some(here)) => Ok(Serving::Here {
                side,
                local: here.local.clone(),
            }),
            (Server::Process(path), None) => {
                let to = UnixStream::connect(path)
                    .map_err(|e| format!("the server process at {}: {e}", path.display()))?;
                let from = BufReader::new(to.try_clone().map_err(|e| e.to_string())?);
                Ok(Serving::Process { to, from })
            }
            _ => Err("a stream's buffers are where its server is".into()),
        }
    }
}

/// The application's S3 client of one thread: the `ctx` of its callbacks.
struct App<'a> {
    server: Serving<'a>,
    op: Op,
    /// The seed the server process fills the next GET's source from, or
    /// checks the next PUT's bytes against; 0: neither.
    check: u64,
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
    fn new(server: Serving<'a>, op: Op) -> App<'a> {
        App {
            server,
            op,
            check: 0,
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
        let parsed = Token::parse_hex(token).map_err(|e| format!("token: {e:?}"))?;
        self.last_token = Some(parsed);
        let start = Instant::now();
        let served = match &mut self.server {
            Serving::Here { side, local } => {
                let (served, begun) = serve_here(side, local, self.op, &parsed);
                self.times.begin += begun;
                served
            }
            Serving::Process { to, from } => {
                let mut line = format!("{} ", self.check).into_bytes();
                line.extend_from_slice(token);
                line.push(b'\n');
                let mut verdict = String::new();
                to.write_all(&line)
                    .and_then(|()| from.read_line(&mut verdict))
                    .map_err(|e| format!("the server process: {e}"))
                    .and_then(|n| match verdict.trim_end() {
                        _ if n == 0 => Err("the server process left".into()),
                        "200" => Ok(()),
                        other => Err(format!("the server process: {other}")),
                    })
            }
        };
        self.times.serve += start.elapsed();
        served
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

/// The server side's work for one request: the proof (or the handshake),
/// the data and the final message. Returns the outcome and the time the
/// first took.
fn serve_here(
    side: &ServerSide,
    local: &LocalBuf,
    op: Op,
    token: &Token,
) -> (Outcome<()>, Duration) {
    let deadline = Instant::now() + SERVE_TIMEOUT;
    let start = Instant::now();
    let mut session = match side.begin(token, None, deadline) {
        Ok(s) => s,
        Err(e) => return (Err(format!("begin: {e}")), start.elapsed()),
    };
    let begun = start.elapsed();
    let moved = match op {
        Op::Get => session.write(local, 0, 0, token.length),
        Op::Put => session.read(local, 0, 0, token.length),
    };
    let served = moved.and_then(|()| session.finish());
    (served.map_err(|e| format!("serve: {e}")), begun)
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

/// A server side's buffer, registered on its PD.
struct ServerBuf {
    /// The registration, released before the memory.
    local: LocalBuf,
    bytes: Box<[u8]>,
}

impl ServerBuf {
    fn new(side: &ServerSide, len: usize) -> Outcome<ServerBuf> {
        let mut bytes = vec![0u8; len].into_boxed_slice();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = side
            .pd()
            .reg_mr(bytes.as_mut_ptr() as usize, len, all)
            .map_err(|e| format!("server MR: {e}"))?;
        let local = LocalBuf {
            addr: mr.addr(),
            mr,
        };
        Ok(ServerBuf { local, bytes })
    }
}

/// One stream's memory: the client buffer, registered with the library,
/// and, when the server side is in this process, the server's.
struct Stream {
    here: Option<ServerBuf>,
    client: Box<[u8]>,
}

impl Stream {
    /// A buffer of `len` bytes registered with the library, and one on
    /// `server`'s PD if it is in this process.
    fn new(server: Server, len: usize) -> Outcome<Stream> {
        let mut client = vec![0u8; len].into_boxed_slice();
        let here = match server {
            Server::Here(side) => Some(ServerBuf::new(side, len)?),
            Server::Process(_) => None,
        };
        // Last, so that nothing can fail between this and the `Stream`
        // whose `Drop` deregisters it.
        // SAFETY: the buffer is registered for its whole length and is
        // deregistered in `Drop` before it is freed (fields drop after).
        let r = unsafe { hipObjBufRegisterHost(client.as_mut_ptr().cast(), len) };
        if r.opError != hipObjOpError_t::hipObjSuccess {
            return Err(format!("hipObjBufRegisterHost: {:?}", r.opError));
        }
        Ok(Stream { here, client })
    }

    /// One transfer of `size` bytes whose bytes are checked: the source is
    /// filled from `seed` (nonzero), the destination cleared first. The
    /// server process fills and checks its side itself.
    fn checked(&mut self, app: &mut App, size: usize, seed: u64) -> Outcome<()> {
        let Some(here) = &mut self.here else {
            let mut expected = vec![0u8; size];
            fill(&mut expected, seed);
            match app.op {
                Op::Get => self.client[..size].fill(0),
                Op::Put => self.client[..size].copy_from_slice(&expected),
            }
            app.check = seed;
            let moved = app.transfer(&mut self.client, size);
            app.check = 0;
            moved?;
            if app.op == Op::Get && self.client[..size] != expected[..] {
                return Err(format!("get of {size} bytes: the bytes differ"));
            }
            return Ok(());
        };
        let (src, dst) = match app.op {
            Op::Get => (&mut here.bytes, &mut self.client),
            Op::Put => (&mut self.client, &mut here.bytes),
        };
        fill(&mut src[..size], seed);
        dst[..size].fill(0);
        app.transfer(&mut self.client, size)?;
        let (src, dst) = match app.op {
            Op::Get => (&here.bytes, &self.client),
            Op::Put => (&self.client, &here.bytes),
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
    let dir = match std::fs::read_dir(counters_dir()) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("bench: no device counters: {}: {e}", counters_dir());
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

/// This process's time on a CPU so far, user and system, every thread's
/// together (ended threads included).
fn process_cpu() -> Duration {
    rusage::usage().cpu
}

/// The host's CPU time by kind, from the `cpu` line of `/proc/stat` (both
/// CPUs together, in clock ticks of `sysconf(_SC_CLK_TCK)`): user, nice,
/// system, idle, iowait, irq, softirq, steal.
const CPU_KINDS: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

fn host_cpu() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(CPU_KINDS.len())
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Reports the host's CPU time by kind since `before`, in ms, as
/// `{name}_cpu_{kind}`.
fn report_host_cpu(name: &str, before: &[u64]) {
    // SAFETY: sysconf reads a constant of the C library; no memory is
    // passed.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return;
    }
    for ((kind, after), was) in CPU_KINDS.iter().zip(host_cpu()).zip(before) {
        let ms = after.saturating_sub(*was) as f64 * 1000.0 / ticks as f64;
        report(&format!("{name}_cpu_{kind}"), ms, "ms");
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
    server: Server,
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
    let process_cpu_start = std::sync::OnceLock::new();
    let runs: Vec<Outcome<Run>> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter_mut()
            .enumerate()
            .map(|(i, stream)| {
                let (barrier, gate_passed, gate_failure) = (&barrier, &gate_passed, &gate_failure);
                let process_cpu_start = &process_cpu_start;
                s.spawn(move || -> Outcome<Run> {
                    let mut app = Serving::new(server, stream).map(|serving| App::new(serving, op));
                    let checked = match &mut app {
                        Ok(app) => stream.checked(app, size, seed ^ ((i as u64 + 1) << 32)),
                        Err(e) => Err(e.clone()),
                    };
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
                    let mut app = app?;
                    if let Some(e) = gate_failure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone()
                    {
                        return Err(e);
                    }
                    let (cpu, waited) = sched_times()?;
                    if i == 0 {
                        process_cpu_start.get_or_init(process_cpu);
                    }
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
    // Every thread of this process (the library's too) during the timed
    // transfers; read before the streams and their instance close.
    let process_cpu_used =
        process_cpu().saturating_sub(process_cpu_start.get().copied().unwrap_or_default());
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
    report(
        &format!("{name}_process_cpu_sum"),
        process_cpu_used.as_secs_f64() * 1000.0,
        "ms",
    );
    report_counters(&name, &before);
    Ok(())
}

/// 8-byte GETs on a reused connection, one at a time. Returns the median
/// and the token of the last one.
fn latency(side: &ServerSide, stream: &mut Stream, iters: usize) -> Outcome<(Duration, Token)> {
    let mut app = App::new(Serving::new(Server::Here(side), stream)?, Op::Get);
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
    let mut app = App::new(Serving::new(Server::Here(side), stream)?, Op::Get);
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

/// The server process's side of one stream: each line is a request (the
/// check's seed, 0 for none, and the token in hex), served on this thread
/// into or from this stream's own buffer, and answered with a line. Ends
/// when the stream's process closes its end.
fn serve_stream(side: &ServerSide, op: Op, conn: UnixStream) -> Outcome<()> {
    let mut to = conn.try_clone().map_err(|e| e.to_string())?;
    let mut from = BufReader::new(conn);
    let mut buf: Option<ServerBuf> = None;
    let mut line = String::new();
    loop {
        line.clear();
        if from.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Ok(());
        }
        let verdict = (|| -> Outcome<()> {
            let (seed, hex) = line
                .trim_end()
                .split_once(' ')
                .ok_or("a request is a seed and a token")?;
            let seed: u64 = seed.parse().map_err(|_| format!("seed {seed:?}"))?;
            let token = Token::parse_hex(hex.as_bytes()).map_err(|e| format!("token: {e:?}"))?;
            let len = to_usize(token.length)?;
            if len > SIZES[SIZES.len() - 1] {
                return Err(format!("{len} bytes is more than this bench moves"));
            }
            if buf.as_ref().is_none_or(|b| b.bytes.len() < len) {
                // The old registration goes before the new one is made.
                buf = None;
                buf = Some(ServerBuf::new(side, len)?);
            }
            let here = buf.as_mut().ok_or("no buffer")?;
            if seed != 0 && op == Op::Get {
                fill(&mut here.bytes[..len], seed);
            }
            serve_here(side, &here.local, op, &token).0?;
            if seed != 0 && op == Op::Put {
                let mut expected = vec![0u8; len];
                fill(&mut expected, seed);
                if here.bytes[..len] != expected[..] {
                    return Err(format!("put of {len} bytes: the bytes differ"));
                }
            }
            Ok(())
        })();
        let answer = match verdict {
            Ok(()) => "200\n".to_owned(),
            Err(e) => format!("500 {}\n", e.replace('\n', " ")),
        };
        to.write_all(answer.as_bytes())
            .map_err(|e| format!("answer: {e}"))?;
    }
}

/// `procs` processes of `threads` streams each, all timed from one start:
/// the aggregate throughput is every process's bytes over the time from
/// the go to the last `done`. This process serves them all (see the
/// module's documentation).
fn processes(
    settings: &Settings,
    op: Op,
    size: usize,
    procs: usize,
    threads: usize,
) -> Outcome<()> {
    let exe = std::env::current_exe().map_err(|e| format!("this program: {e}"))?;
    let side = open_side()?;
    let socket = std::env::temp_dir().join(format!("hipobj-bench-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let volume_mib = (settings.volume >> 20).div_ceil(procs as u64).max(1);
    let closing = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Every stream connects once, before its check.
        let server = s.spawn(|| -> Outcome<()> {
            let mut served = Vec::with_capacity(procs * threads);
            for _ in 0..procs * threads {
                let (conn, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
                if closing.load(Ordering::SeqCst) {
                    // The connection below: a child failed before its own.
                    break;
                }
                let side = &side;
                served.push(s.spawn(move || serve_stream(side, op, conn)));
            }
            for (i, h) in served.into_iter().enumerate() {
                h.join()
                    .unwrap_or_else(|_| Err("panicked".into()))
                    .map_err(|e| format!("serving stream {i}: {e}"))?;
            }
            Ok(())
        });
        let children = run_children(&exe, &socket, op, size, procs, threads, volume_mib);
        if !server.is_finished() {
            // Unblocks the accepts a failed child never made.
            closing.store(true, Ordering::SeqCst);
            let _ = UnixStream::connect(&socket);
        }
        let served = server
            .join()
            .unwrap_or_else(|_| Err("the server thread panicked".into()));
        let _ = std::fs::remove_file(&socket);
        children.and(served)
    })
}

/// Starts the children, lets them go at once, reports their figures.
fn run_children(
    exe: &Path,
    socket: &Path,
    op: Op,
    size: usize,
    procs: usize,
    threads: usize,
    volume_mib: u64,
) -> Outcome<()> {
    use std::process::{Command, Stdio};
    let mut children = Vec::with_capacity(procs);
    for _ in 0..procs {
        let child = Command::new(exe)
            .args([
                "throughput",
                op_name(op),
                &size.to_string(),
                &threads.to_string(),
            ])
            .args(["--volume-mib", &volume_mib.to_string(), "--gate"])
            .arg("--server")
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        match child {
            Ok(child) => children.push(child),
            Err(e) => {
                for mut started in children {
                    let _ = started.kill();
                    let _ = started.wait();
                }
                return Err(format!("starting {}: {e}", exe.display()));
            }
        }
    }
    let outcome = (|| -> Outcome<()> {
        let mut outs = Vec::with_capacity(procs);
        for (i, child) in children.iter_mut().enumerate() {
            let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
            read_until(&mut out, "ready", i)?;
            outs.push(out);
        }
        let host_before = host_cpu();
        let server_before = process_cpu();
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
        let server_cpu = process_cpu().saturating_sub(server_before);
        let name = format!("{}_{}_p{procs}x{threads}", op_name(op), size_name(size));
        report_host_cpu(&name, &host_before);
        report(
            &format!("{name}_server_process_cpu"),
            server_cpu.as_secs_f64() * 1000.0,
            "ms",
        );
        let mut transfers = 0.0;
        // The children's own CPU time over their timed transfers, added up.
        let mut clients_cpu = 0.0;
        // Each child's per-transfer means (where the time went), by the
        // part of their names after `get_1MiB_xN_`, to be averaged.
        let mut means: Vec<(String, f64, String)> = Vec::new();
        for (i, out) in outs.iter_mut().enumerate() {
            let lines: Vec<String> = out
                .lines()
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            for line in &lines {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (Some(name), Some(value), Some(unit)) = (f.first(), f.get(1), f.get(2)) else {
                    continue;
                };
                let part = name.splitn(4, '_').nth(3).filter(|p| p.ends_with("_mean"));
                if let (Some(part), Ok(value)) = (part, value.parse::<f64>()) {
                    means.push((part.to_owned(), value, (*unit).to_owned()));
                }
                if name.ends_with("_process_cpu_sum") {
                    clients_cpu += value.parse::<f64>().unwrap_or(0.0);
                }
            }
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
        report(&format!("{name}_client_processes_cpu"), clients_cpu, "ms");
        report(
            &format!("{name}_throughput"),
            transfers * size as f64 / wall / f64::from(1 << 20),
            "MiB/s",
        );
        report(&format!("{name}_transfers"), transfers, "count");
        report(&format!("{name}_seconds"), wall, "s");
        let mut parts: Vec<&str> = means.iter().map(|m| m.0.as_str()).collect();
        parts.sort_unstable();
        parts.dedup();
        for part in parts {
            let values: Vec<&(String, f64, String)> =
                means.iter().filter(|m| m.0 == part).collect();
            let mean = values.iter().map(|m| m.1).sum::<f64>() / values.len() as f64;
            report(&format!("{name}_{part}"), mean, &values[0].2);
        }
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

/// A server side on a context of its own on the lane's device.
fn open_side() -> Outcome<ServerSide> {
    let platform = platform::system();
    let verbs = platform.verbs().map_err(|e| format!("libibverbs: {e}"))?;
    let names = verbs.device_names().map_err(|e| format!("devices: {e}"))?;
    if !names.iter().any(|n| n == device()) {
        return Err(format!(
            "no {} (devices: {names:?}): run in the VM lane, or name the device (HIPOBJ_LANE_DEVICE)",
            device()
        ));
    }
    let ctx = verbs
        .open(device())
        .map_err(|e| format!("open {}: {e}", device()))?;
    let pd = ctx.alloc_pd().map_err(|e| format!("PD: {e}"))?;
    let cm = platform.cm().map_err(|e| format!("librdmacm: {e}"))?;
    let config = ServerConfig {
        // Both sides are on this host, on one device.
        dial: DialPolicy::any(),
        // The client's grant may wait as long as a transfer may: with 16
        // streams of 16 MiB in one server process on two emulated CPUs,
        // a grant once took longer than the default 2 s, the server
        // connected afresh, and the client rightly refused a second use of
        // the token (docs/performance.md). The bench measures throughput,
        // not that edge.
        proof_timeout: SERVE_TIMEOUT,
        // `HIPOBJ_POLL_US`, as the library (and the gateway's server side)
        // reads it: 0 on Soft-RoCE unless set.
        poll: hipobj::core::Options::from_env().poll,
        ..ServerConfig::default()
    };
    Ok(ServerSide::with_config(cm, ctx, pd, config))
}

fn run(settings: &Settings) -> Outcome<()> {
    let side = match settings.server {
        None => Some(open_side()?),
        Some(_) => None,
    };
    let server = match (&side, &settings.server) {
        (Some(side), _) => Server::Here(side),
        (None, Some(path)) => Server::Process(path),
        (None, None) => unreachable!("a side is opened without a server process"),
    };
    let hint = CString::new(device()).map_err(|e| e.to_string())?;
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
            What::Processes { .. } | What::InFlight { .. } => {
                return Err("processes and inflight run apart".into())
            }
        };
        let mut streams = (0..count)
            .map(|_| Stream::new(server, len))
            .collect::<Outcome<Vec<_>>>()?;
        if let (Some(side), What::All | What::Latency) = (&side, settings.what) {
            eprintln!("bench: latency");
            let (reused, token) = latency(side, &mut streams[0], settings.latency_iters)?;
            eprintln!("bench: verbs");
            primitives(side, &token, settings.latency_iters.div_ceil(4))?;
            eprintln!("bench: handshakes");
            handshake(side, &mut streams[0], settings.handshake_iters, reused)?;
        }
        let configs: Vec<(Op, usize, usize)> = match settings.what {
            What::All => [Op::Get, Op::Put]
                .into_iter()
                .flat_map(|op| SIZES.into_iter().map(move |size| (op, size)))
                .flat_map(|(op, size)| [(op, size, 1), (op, size, STREAMS)])
                .collect(),
            What::Latency | What::Processes { .. } | What::InFlight { .. } => Vec::new(),
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
                server,
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

// ------------------------------------------------------------ in flight

/// The S3 side of one asynchronous transfer: the server side in this
/// process serves the token on the client's transfer thread that runs it.
struct TicketSide {
    side: &'static ServerSide,
    local: LocalBuf,
    op: Op,
}

impl hipobj::client::S3Side for TicketSide {
    fn exchange(&mut self, token: &str) -> Result<String, String> {
        let token = Token::parse_hex(token.as_bytes()).map_err(|e| format!("token: {e:?}"))?;
        match serve_here(self.side, &self.local, self.op, &token).0 {
            Ok(()) => Ok("200".into()),
            Err(e) => Err(e),
        }
    }
}

/// `streams` transfers of `size` bytes in flight through the Rust API,
/// each way twice, alternating (threads, tickets, threads, tickets), so
/// that both see the same load: `streams` threads with one transfer each
/// (`Client::get`/`put`), and one thread that keeps `streams` tickets in
/// flight (`submit_tagged`, `completions`, resubmitted as they end).
/// Each lane has its own buffers on both sides; the bytes of one transfer
/// per lane are checked first.
fn in_flight(settings: &Settings, op: Op, size: usize, streams: usize) -> Outcome<()> {
    use hipobj::client::{Client, Transfer};
    // The server side lives as long as the process: the client's transfer
    // threads reach it.
    let side: &'static ServerSide = Box::leak(Box::new(open_side()?));
    let client = Client::builder()
        .nic(device())
        .max_in_flight(streams)
        .build()
        .map_err(|e| format!("client: {e}"))?;
    let count = to_usize(settings.volume.div_ceil((size * streams) as u64))?.max(1);
    let mut lanes = Vec::with_capacity(streams);
    for i in 0..streams {
        let mut server = ServerBuf::new(side, size)?;
        let mut buffer = client.host_buffer(size).map_err(|e| e.to_string())?;
        let seed = 0x1f11_9000 ^ i as u64;
        let (src, dst): (&mut [u8], &mut [u8]) = match op {
            Op::Get => (&mut server.bytes, buffer.as_mut_slice().ok_or("host")?),
            Op::Put => (buffer.as_mut_slice().ok_or("host")?, &mut server.bytes),
        };
        fill(src, seed);
        dst.fill(0);
        let mut s3 = TicketSide {
            side,
            local: server.local.clone(),
            op,
        };
        match op {
            Op::Get => client.get(&mut buffer, 0..size, &mut s3),
            Op::Put => client.put(&buffer, 0..size, &mut s3),
        }
        .map_err(|e| format!("lane {i}: {e}"))?;
        if server.bytes[..] != buffer.as_slice().ok_or("host")?[..] {
            return Err(format!("lane {i}: the bytes differ"));
        }
        lanes.push((Some(buffer), server));
    }
    let name = format!("{}_{}_x{streams}", op_name(op), size_name(size));
    for round in 1..=2 {
        // Threads: one transfer each at a time.
        let start = Instant::now();
        std::thread::scope(|s| -> Outcome<()> {
            let handles: Vec<_> = lanes
                .iter_mut()
                .map(|(buffer, server)| {
                    let client = &client;
                    s.spawn(move || -> Outcome<()> {
                        let buffer = buffer.as_mut().ok_or("a lane without its buffer")?;
                        let mut s3 = TicketSide {
                            side,
                            local: server.local.clone(),
                            op,
                        };
                        for _ in 0..count {
                            match op {
                                Op::Get => client.get(buffer, 0..size, &mut s3),
                                Op::Put => client.put(buffer, 0..size, &mut s3),
                            }
                            .map_err(|e| e.to_string())?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
        })?;
        let threads = start.elapsed();
        // Tickets: one thread, `streams` in flight.
        let cpu_before = process_cpu();
        let start = Instant::now();
        let mut left = vec![count; streams];
        let submit = |lane: usize, buffer: hipobj::client::Buffer, server: &ServerBuf| {
            let s3 = TicketSide {
                side,
                local: server.local.clone(),
                op,
            };
            let transfer = match op {
                Op::Get => Transfer::get(buffer, 0..size, s3),
                Op::Put => Transfer::put(buffer, 0..size, s3),
            };
            client
                .submit_tagged(transfer, lane as u64)
                .map_err(|_| "the client refused a submission".to_owned())
        };
        for (lane, (buffer, server)) in lanes.iter_mut().enumerate() {
            submit(
                lane,
                buffer.take().ok_or("a lane without its buffer")?,
                server,
            )?;
            left[lane] -= 1;
        }
        let mut in_flight = streams;
        while in_flight > 0 {
            let ended = client.completions(streams, Some(SERVE_TIMEOUT));
            if ended.is_empty() {
                return Err("no transfer ended in time".into());
            }
            for done in ended {
                let lane = usize::try_from(done.tag).map_err(|e| e.to_string())?;
                done.finished
                    .result
                    .map_err(|e| format!("lane {lane}: {e}"))?;
                in_flight -= 1;
                if left[lane] > 0 {
                    left[lane] -= 1;
                    submit(lane, done.finished.buffer, &lanes[lane].1)?;
                    in_flight += 1;
                } else {
                    lanes[lane].0 = Some(done.finished.buffer);
                }
            }
        }
        let tickets = start.elapsed();
        let cpu = process_cpu().saturating_sub(cpu_before);
        let bytes = (count * streams * size) as f64 / f64::from(1 << 20);
        let suffix = format!("_round{round}");
        report(
            &format!("inflight_{name}_threads_throughput{suffix}"),
            bytes / threads.as_secs_f64(),
            "MiB/s",
        );
        report(
            &format!("inflight_{name}_tickets_throughput{suffix}"),
            bytes / tickets.as_secs_f64(),
            "MiB/s",
        );
        report(
            &format!("inflight_{name}_tickets_over_threads{suffix}"),
            threads.as_secs_f64() / tickets.as_secs_f64(),
            "ratio",
        );
        let transfers = u32::try_from(count * streams).map_err(|_| "too many transfers")?;
        report_us(
            &format!("inflight_{name}_tickets_process_cpu_per_transfer{suffix}"),
            cpu / transfers,
        );
    }
    drop(lanes);
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
        What::InFlight { op, size, streams } => in_flight(&settings, op, size, streams),
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
