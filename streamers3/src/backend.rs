//! The backend behind the twelve functions: clients, their reads and
//! completions, listings, and the fence that ends a removed client's
//! writes.
//!
//! A client is a queue of reads served by up to `HIPOBJ_STREAMER_READERS`
//! threads of its own, and a queue of completions its owner takes in
//! `obj_wait_for_completions`. A read goes by RDMA when the hipobj library
//! initialized (an RDMA device exists) and the gateway has not declined
//! RDMA: the streamer's buffer is lent to the library for that one request
//! and given back (deregistered) before its completion is queued, so no
//! registration outlives the request (the streamer frees and reallocates
//! its ring within one load). Otherwise the read is a plain ranged GET
//! whose body is copied into the buffer piece by piece under the client's
//! fence, so a removal stops every write at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use hipobj::client::{Client, GpuSelect};
use hipobj::s3::config::{Credentials, Overrides, S3Config};
use hipobj::s3::objects::{self, Object, Path, Policy, TransferError};
use hipobj::s3::{Request, RequestOptions, S3Error, S3};

use crate::report::{log, Level, Stats};
use crate::settings::{self, code, Settings};

/// One completion: the streamer's request id, the code, the bytes written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The streamer's id of the read.
    pub id: u64,
    /// Its response code.
    pub code: i32,
    /// Bytes written into its destination.
    pub bytes: u64,
}

/// How a wait blocks (`ObjectWaitMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Return the ready events, possibly none.
    NonBlocking,
    /// Until an event is ready, or the client is stopped or idle.
    Block,
    /// As `Block`, for at most [`TIMED_WAIT`].
    Timed,
}

impl TryFrom<i32> for WaitMode {
    type Error = i32;
    fn try_from(mode: i32) -> Result<WaitMode, i32> {
        match mode {
            0 => Ok(WaitMode::NonBlocking),
            1 => Ok(WaitMode::Block),
            2 => Ok(WaitMode::Timed),
            other => Err(other),
        }
    }
}

/// How long a `TIMED_BLOCK` wait blocks: the mode has no time-out argument,
/// so the backend picks one.
pub const TIMED_WAIT: Duration = Duration::from_millis(100);

/// The streamer's destination of one read: `len` bytes at `addr`, valid
/// until the read's completion is taken or its client removed (the
/// streamer's contract, §1.6 of the backend's specification).
#[derive(Clone, Copy, Debug)]
pub struct Dst {
    addr: usize,
    len: usize,
}

impl Dst {
    /// # Safety
    ///
    /// `addr` must point to `len` writable bytes that stay valid, and that
    /// nothing but this read writes, until the read's completion has been
    /// taken by a wait or its client has been removed.
    pub unsafe fn new(addr: *mut u8, len: usize) -> Dst {
        Dst {
            addr: addr as usize,
            len,
        }
    }
}

/// A read waiting for a reader.
struct Job {
    bucket: String,
    key: String,
    offset: u64,
    dst: Dst,
    id: u64,
}

/// What a client's threads share, under one lock.
#[derive(Default)]
struct Queues {
    /// Reads not yet started.
    jobs: VecDeque<Job>,
    /// Completions not yet taken.
    events: VecDeque<Event>,
    /// Reads accepted whose completion has not been taken.
    outstanding: usize,
    /// Reader threads alive, and those idle.
    readers: usize,
    idle: usize,
    /// RDMA reads running: the memory they lent is registered.
    rdma_running: usize,
    /// `obj_cancel_all_reads` stopped the waits.
    stopped: bool,
    /// The client was removed: nothing more starts or is delivered.
    removed: bool,
}

/// One client: its endpoint, its queues, its fence.
pub struct ClientState {
    s3: Arc<S3>,
    endpoint: String,
    /// Reads may go by RDMA (`HIPOBJ_STREAMER_RDMA` not 0).
    rdma: bool,
    readers_max: usize,
    retries: u32,
    timeout: Duration,
    queues: Mutex<Queues>,
    /// A completion is ready, or the client stopped.
    events_ready: Condvar,
    /// A job is queued, or the client was removed.
    jobs_ready: Condvar,
    /// An RDMA read ended.
    rdma_ended: Condvar,
    /// Held shared while a plain GET's piece is copied into a destination,
    /// taken exclusive (and set) by the removal: after that, no copy.
    fence: RwLock<bool>,
}

/// The process's backend: its clients and what they share.
pub struct Backend {
    clients: Mutex<HashMap<usize, Arc<ClientState>>>,
    next_handle: AtomicU64,
    /// The window reported for `max_inflight_bytes`: the last reading
    /// client's, `u64::MAX` (unbounded) before any.
    window: AtomicU64,
    library: OnceLock<Result<Client, String>>,
    /// Endpoints whose gateway declined RDMA: their reads go over HTTP.
    declined: Mutex<HashMap<String, String>>,
    /// The code of a transient failure for the outer in use.
    retryable: OnceLock<i32>,
    /// The counters.
    pub stats: Stats,
    opened: AtomicBool,
}

/// The backend of the process (never dropped: statics are not torn down
/// at exit, where threads of ours may still run).
pub fn backend() -> &'static Backend {
    static BACKEND: OnceLock<Backend> = OnceLock::new();
    BACKEND.get_or_init(|| Backend {
        clients: Mutex::new(HashMap::new()),
        next_handle: AtomicU64::new(1),
        window: AtomicU64::new(u64::MAX),
        library: OnceLock::new(),
        declined: Mutex::new(HashMap::new()),
        retryable: OnceLock::new(),
        stats: Stats::default(),
        opened: AtomicBool::new(false),
    })
}

/// Locks `m`, taking the value of a lock a panicking thread left poisoned
/// (the state it guards is counters and queues, consistent at every
/// unlock).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A client's configuration, copied out of the streamer's
/// `ObjectClientConfig_t`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientConfig {
    /// `endpoint_url`, if given.
    pub endpoint: Option<String>,
    /// `default_storage_chunk_size`.
    pub chunk: u64,
    /// `initial_params`: key and value.
    pub params: Vec<(String, Option<String>)>,
}

/// Why a client could not be made, as the streamer's code and a message.
pub type Refusal = (i32, String);

impl Backend {
    /// `obj_open_backend`: idempotent; the outer's version is looked at
    /// once.
    pub fn open(&self) {
        self.retryable.get_or_init(|| {
            let (code, what) = crate::outer::retryable_code();
            log(
                Level::Info,
                &format!("{what}: transient failures are code {code}"),
            );
            code
        });
        self.opened.store(true, Ordering::Relaxed);
    }

    /// `obj_close_backend`: logs the counters. Joins nothing, frees
    /// nothing a thread may still use.
    pub fn close(&self) {
        if self.opened.swap(false, Ordering::Relaxed) {
            self.report();
        }
    }

    /// Logs and writes the counters, with the registrations the library
    /// holds now.
    fn report(&self) {
        if let Some(Ok(library)) = self.library.get() {
            self.stats
                .registered(u64::try_from(library.registered_buffers()).unwrap_or(u64::MAX - 1));
        }
        self.stats.report();
    }

    fn retryable(&self) -> i32 {
        *self
            .retryable
            .get_or_init(|| crate::outer::retryable_code().0)
    }

    /// The window reported for `max_inflight_bytes`.
    pub fn window(&self) -> u64 {
        self.window.load(Ordering::Relaxed)
    }

    /// Initializes the hipobj library once (at the first client that may
    /// read by RDMA, so that no read waits for it); why it did not is kept
    /// and counted per read.
    fn init_library(&self) {
        self.library.get_or_init(|| {
            #[allow(unused_mut, reason = "changed by test builds only")]
            let mut builder = Client::builder().gpu(GpuSelect::None);
            // A test build on the fake world, when HIPOBJ_TEST_WORLD=1.
            #[cfg(feature = "fake-world")]
            if std::env::var_os("HIPOBJ_TEST_WORLD").is_some_and(|v| v == "1") {
                builder = builder.platform(hipobj_testing::c_world::platform());
            }
            builder
                .build()
                .map_err(|e| format!("no RDMA device (the hipobj library did not initialize: {e})"))
        });
    }

    /// `obj_create_client`: a client of the endpoint `config` names; its
    /// window becomes the one `max_inflight_bytes` reports.
    pub fn create_client(&self, config: &ClientConfig) -> Result<usize, Refusal> {
        let mut warnings = Vec::new();
        let settings = Settings::from_vars(&|name| std::env::var(name).ok(), &mut warnings);
        for warning in warnings {
            log(Level::Warning, &warning);
        }
        if let Some(path) = &settings.ca_bundle {
            if !std::path::Path::new(path).is_file() {
                return Err((
                    code::CA_FILE_NOT_FOUND,
                    format!("AWS_CA_BUNDLE names {path:?}, which is not a file"),
                ));
            }
        }
        let s3 = s3_client(config, &settings).map_err(|why| (code::UNKNOWN, why))?;
        let chunk = Settings::chunk(config.chunk);
        let window = settings::window(
            chunk,
            settings.max_inflight_mib,
            settings.target_gbps,
            settings.margin,
        );
        let state = Arc::new(ClientState {
            endpoint: s3.config().endpoint.clone(),
            s3: Arc::new(s3),
            rdma: settings.rdma,
            readers_max: settings.readers,
            retries: settings.retries,
            timeout: settings.timeout,
            queues: Mutex::new(Queues::default()),
            events_ready: Condvar::new(),
            jobs_ready: Condvar::new(),
            rdma_ended: Condvar::new(),
            fence: RwLock::new(false),
        });
        if settings.rdma {
            self.init_library();
        }
        self.window.store(window, Ordering::Relaxed);
        let handle = usize::try_from(self.next_handle.fetch_add(1, Ordering::Relaxed))
            .map_err(|_| (code::UNKNOWN, "out of client handles".to_owned()))?;
        lock(&self.clients).insert(handle, state);
        log(
            Level::Debug,
            &format!(
                "client {handle} of {}: chunk {chunk}, window {window}",
                config.endpoint.as_deref().unwrap_or("the default endpoint")
            ),
        );
        Ok(handle)
    }

    fn client(&self, handle: usize) -> Option<Arc<ClientState>> {
        lock(&self.clients).get(&handle).cloned()
    }

    /// `obj_request_read`: queues the read and returns; its completion
    /// follows exactly once, unless the client is removed first.
    pub fn request_read(&self, handle: usize, path: &str, offset: u64, dst: Dst, id: u64) -> i32 {
        let Some(client) = self.client(handle) else {
            log(
                Level::Error,
                &format!("obj_request_read: no client {handle}"),
            );
            return code::UNKNOWN;
        };
        let (bucket, key) = match settings::parse_uri(path) {
            Ok((bucket, key)) if !key.is_empty() => (bucket.to_owned(), key.to_owned()),
            Ok(_) => {
                log(
                    Level::Error,
                    &format!("obj_request_read: {path:?} names no object"),
                );
                return code::INVALID_PARAMETER;
            }
            Err(why) => {
                log(Level::Error, &format!("obj_request_read: {why}"));
                return code::INVALID_PARAMETER;
            }
        };
        let job = Job {
            bucket,
            key,
            offset,
            dst,
            id,
        };
        let mut queues = lock(&client.queues);
        if queues.removed {
            return code::UNKNOWN;
        }
        queues.jobs.push_back(job);
        queues.outstanding += 1;
        if queues.idle == 0 && queues.readers < client.readers_max {
            queues.readers += 1;
            let reader = Arc::clone(&client);
            let spawned = std::thread::Builder::new()
                .name("streamers3-read".to_owned())
                .spawn(move || reader.serve());
            if let Err(e) = spawned {
                queues.readers -= 1;
                if queues.readers == 0 {
                    queues.jobs.pop_back();
                    queues.outstanding -= 1;
                    log(Level::Error, &format!("cannot start a reader thread: {e}"));
                    return code::UNKNOWN;
                }
            }
        } else {
            client.jobs_ready.notify_one();
        }
        code::SUCCESS
    }

    /// `obj_wait_for_completions`: up to `max` events into `out`, and the
    /// code to return. BLOCK returns Success only with at least one event;
    /// a stopped or idle client answers FinishedError with none.
    pub fn wait(&self, handle: usize, out: &mut [Event], mode: WaitMode) -> (i32, usize) {
        let Some(client) = self.client(handle) else {
            return (code::UNKNOWN, 0);
        };
        let deadline = Instant::now() + TIMED_WAIT;
        let mut queues = lock(&client.queues);
        loop {
            if queues.stopped || queues.removed {
                return (code::FINISHED, 0);
            }
            if !queues.events.is_empty() {
                let n = out.len().min(queues.events.len());
                for slot in out.iter_mut().take(n) {
                    if let Some(event) = queues.events.pop_front() {
                        *slot = event;
                    }
                }
                queues.outstanding -= n;
                return (code::SUCCESS, n);
            }
            if queues.outstanding == 0 {
                return (code::FINISHED, 0);
            }
            match mode {
                WaitMode::NonBlocking => return (code::SUCCESS, 0),
                WaitMode::Block => {
                    queues = client
                        .events_ready
                        .wait(queues)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                WaitMode::Timed => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return (code::SUCCESS, 0);
                    }
                    queues = client
                        .events_ready
                        .wait_timeout(queues, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// `obj_cancel_all_reads`: stops the waits of every client there is
    /// now; their reads may still finish.
    pub fn cancel_all(&self) {
        let clients: Vec<_> = lock(&self.clients).values().cloned().collect();
        for client in clients {
            lock(&client.queues).stopped = true;
            client.events_ready.notify_all();
        }
    }

    /// `obj_remove_client`: after it returns no byte lands in any of the
    /// client's destinations. False when a handle is unknown, or an RDMA
    /// read outlived the request time-out.
    pub fn remove_client(&self, handle: usize) -> bool {
        let Some(client) = lock(&self.clients).remove(&handle) else {
            return false;
        };
        client.stop();
        client.fence()
    }

    /// `obj_remove_all_clients`: every client removed, as
    /// [`Backend::remove_client`] does; then the counters are reported.
    pub fn remove_all(&self) -> bool {
        let clients: Vec<_> = lock(&self.clients).drain().map(|(_, c)| c).collect();
        for client in &clients {
            client.stop();
        }
        // Every client fenced, even after one that could not be.
        let fenced: Vec<bool> = clients.iter().map(|client| client.fence()).collect();
        self.report();
        fenced.into_iter().all(|fenced| fenced)
    }

    /// `obj_list_files`: every object under `prefix` (an `s3://` URI), or
    /// one level of them, as full URIs with their sizes.
    pub fn list(
        &self,
        handle: usize,
        prefix: &str,
        recursive: bool,
    ) -> Result<Vec<(String, u64)>, Refusal> {
        let client = self
            .client(handle)
            .ok_or_else(|| (code::UNKNOWN, format!("obj_list_files: no client {handle}")))?;
        let (bucket, key) =
            settings::parse_uri(prefix).map_err(|why| (code::INVALID_PARAMETER, why))?;
        let delimiter = (!recursive).then_some("/");
        let listed = client
            .s3
            .list_objects_delimited(bucket, key, delimiter)
            .map_err(|e| {
                (
                    code::FILE_ACCESS,
                    format!("listing {prefix} at {}: {e}", client.endpoint),
                )
            })?;
        Ok(listed
            .into_iter()
            .map(|object| (format!("s3://{bucket}/{}", object.key), object.size))
            .collect())
    }
}

impl ClientState {
    /// Stops the client: no job starts, no event is delivered, waits end.
    fn stop(&self) {
        let mut queues = lock(&self.queues);
        queues.removed = true;
        queues.stopped = true;
        queues.jobs.clear();
        drop(queues);
        self.events_ready.notify_all();
        self.jobs_ready.notify_all();
    }

    /// Waits until no byte can land any more: plain GETs are fenced at once
    /// (the copy under way ends first); RDMA reads, whose memory the
    /// server may write until their registration is given back, are
    /// waited for, at most the request time-out.
    fn fence(&self) -> bool {
        *self
            .fence
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        let deadline = Instant::now() + self.timeout + Duration::from_secs(1);
        let mut queues = lock(&self.queues);
        while queues.rdma_running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log(
                    Level::Error,
                    &format!(
                        "{} RDMA reads of {} still run past the request time-out: their memory stays registered",
                        queues.rdma_running, self.endpoint
                    ),
                );
                return false;
            }
            queues = self
                .rdma_ended
                .wait_timeout(queues, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    /// A reader thread: takes jobs until the client is removed.
    fn serve(self: Arc<ClientState>) {
        loop {
            let job = {
                let mut queues = lock(&self.queues);
                loop {
                    if queues.removed {
                        queues.readers -= 1;
                        return;
                    }
                    if let Some(job) = queues.jobs.pop_front() {
                        break job;
                    }
                    queues.idle += 1;
                    queues = self
                        .jobs_ready
                        .wait(queues)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    queues.idle -= 1;
                }
            };
            // A panic in a read is its event's code 11, never a read that
            // does not answer (its worker would wait for it forever).
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.read(&job)));
            let event = match read {
                Ok(Some(event)) => event,
                Ok(None) => continue,
                Err(_) => {
                    log(
                        Level::Error,
                        &format!(
                            "reading s3://{}/{}: internal error (a panic), code 11",
                            job.bucket, job.key
                        ),
                    );
                    Event {
                        id: job.id,
                        code: code::UNKNOWN,
                        bytes: 0,
                    }
                }
            };
            let mut queues = lock(&self.queues);
            if queues.removed {
                continue;
            }
            queues.events.push_back(event);
            drop(queues);
            self.events_ready.notify_one();
        }
    }

    /// One read, by RDMA where it can go so, else over HTTP; `None` when
    /// the client was removed meanwhile (no event is due then).
    fn read(&self, job: &Job) -> Option<Event> {
        let backend = backend();
        let len = job.dst.len as u64;
        let mut tries = 0;
        loop {
            let outcome = match self.rdma(job) {
                Some(outcome) => outcome,
                None => self.http(job),
            };
            let code = match outcome {
                Outcome::Landed(how) => {
                    match how {
                        How::Rdma => backend.stats.rdma(len),
                        How::Http => backend.stats.http(len),
                    }
                    return Some(Event {
                        id: job.id,
                        code: code::SUCCESS,
                        bytes: len,
                    });
                }
                Outcome::Fenced => return None,
                Outcome::Failed(code, why) => {
                    if code == TRANSIENT && tries < self.retries {
                        tries += 1;
                        log(
                            Level::Warning,
                            &format!("{why}: sent again ({tries} of {})", self.retries),
                        );
                        // Backing off: 50 ms, doubled each time, at most 3.2 s.
                        std::thread::sleep(Duration::from_millis(50 << tries.min(6)));
                        continue;
                    }
                    // 19 only for an outer that knows it.
                    let code = if code == TRANSIENT {
                        backend.retryable()
                    } else {
                        code
                    };
                    log(Level::Error, &format!("{why} (code {code})"));
                    code
                }
            };
            backend.stats.failed();
            return Some(Event {
                id: job.id,
                code,
                bytes: 0,
            });
        }
    }

    /// The read by RDMA, or `None` where it goes over HTTP (the reason
    /// counted).
    fn rdma(&self, job: &Job) -> Option<Outcome> {
        let backend = backend();
        // The library, if it initialized (made by `create_client`).
        if !self.rdma {
            backend.stats.fell_back("HIPOBJ_STREAMER_RDMA=0");
            return None;
        }
        let library = match backend.library.get() {
            Some(Ok(library)) => library,
            Some(Err(why)) => {
                backend.stats.fell_back(why);
                return None;
            }
            None => return None,
        };
        if let Some(why) = lock(&backend.declined).get(&self.endpoint) {
            backend.stats.fell_back(why);
            return None;
        }
        {
            let mut queues = lock(&self.queues);
            if queues.removed {
                return Some(Outcome::Fenced);
            }
            queues.rdma_running += 1;
        }
        // Counted down even if the read panics (the panic goes on after).
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.rdma_lent(library, job)
        }));
        lock(&self.queues).rdma_running -= 1;
        self.rdma_ended.notify_all();
        outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    fn rdma_lent(&self, library: &Client, job: &Job) -> Option<Outcome> {
        let backend = backend();
        let what = format!(
            "GET s3://{}/{} bytes {}+{} by RDMA from {}",
            job.bucket, job.key, job.offset, job.dst.len, self.endpoint
        );
        // SAFETY: `Dst::new`'s contract: the streamer's destination stays
        // valid and is written by this read alone until its completion is
        // taken or the client removed; the removal waits for
        // `rdma_running`, which counts this read until the memory has been
        // given back below, so the slice does not outlive the memory.
        let memory: &'static mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(job.dst.addr as *mut u8, job.dst.len) };
        let mut buffer = match library.lend(memory) {
            Ok(buffer) => buffer,
            Err((e, _)) => {
                backend.stats.fell_back(&format!(
                    "the streamer's memory could not be registered ({e})"
                ));
                return None;
            }
        };
        let object = Object::new(&self.s3, &job.bucket, &job.key);
        let range = job.offset..job.offset + job.dst.len as u64;
        let policy = Policy {
            fallback: false,
            verify: true,
        };
        let result = objects::get(library, object, range, &mut buffer, 0, policy);
        // Given back (deregistered) before the completion is delivered.
        if let Err(buffer) = buffer.into_lent() {
            log(
                Level::Error,
                &format!("{what}: the memory could not be deregistered"),
            );
            drop(buffer);
        }
        match result {
            Ok(moved) => match moved.path {
                Path::Rdma(_) => Some(Outcome::Landed(How::Rdma)),
                Path::Fallback(_) => Some(Outcome::Landed(How::Http)),
            },
            Err(TransferError::NoFallback(why)) => {
                let why = format!("the endpoint {} does not offer RDMA ({why})", self.endpoint);
                lock(&backend.declined).insert(self.endpoint.clone(), why.clone());
                backend.stats.fell_back(&why);
                None
            }
            // The library failed (a connection to the gateway's RDMA side,
            // say): the server's access ended when the call returned and
            // the memory is given back, so the read goes over HTTP.
            Err(TransferError::Client(e)) => {
                log(
                    Level::Debug,
                    &format!("{what}: {e}: over plain HTTP instead"),
                );
                backend
                    .stats
                    .fell_back("an RDMA transfer failed (its read went over plain HTTP)");
                None
            }
            // The server's answer does not match the range: its byte count
            // differs from the range's length.
            Err(TransferError::S3(S3Error::Response { why, .. })) => Some(Outcome::Failed(
                code::FILE_TRUNCATED,
                format!("{what}: {why}"),
            )),
            Err(e) => Some(Outcome::Failed(
                settings::failure_code(&e, TRANSIENT),
                format!("{what}: {e}"),
            )),
        }
    }

    /// The read as a plain ranged GET, its body copied into the
    /// destination in pieces under the fence.
    fn http(&self, job: &Job) -> Outcome {
        let len = job.dst.len;
        let last = job.offset + len as u64 - 1;
        let what = format!(
            "GET s3://{}/{} bytes {}-{last} from {}",
            job.bucket, job.key, job.offset, self.endpoint
        );
        let mut request = Request::new("GET", &job.bucket, Some(&job.key));
        request
            .headers
            .push(("range", format!("bytes={}-{last}", job.offset)));
        let response = self
            .s3
            .send(&request)
            .and_then(hipobj::s3::Response::success);
        let mut response = match response {
            Ok(response) => response,
            Err(e) => {
                return Outcome::Failed(settings::s3_code(&e, TRANSIENT), format!("{what}: {e}"))
            }
        };
        if response.status() != 206 && job.offset != 0 {
            return Outcome::Failed(
                code::FILE_ACCESS,
                format!(
                    "{what}: the server ignored the range (HTTP {})",
                    response.status()
                ),
            );
        }
        const PIECE: usize = 256 << 10;
        let mut piece = vec![0u8; PIECE.min(len + 1)];
        let mut filled = 0usize;
        let mut body = response.body_reader();
        loop {
            let n = match std::io::Read::read(&mut body, &mut piece) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Outcome::Failed(
                        TRANSIENT,
                        format!("{what}: the body broke off after {filled} of {len} bytes: {e}"),
                    )
                }
            };
            if filled + n > len {
                return Outcome::Failed(
                    code::FILE_TRUNCATED,
                    format!("{what}: the body is longer than the {len} bytes asked for"),
                );
            }
            let fenced = self
                .fence
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *fenced {
                return Outcome::Fenced;
            }
            // SAFETY: `Dst::new`'s contract: the destination's `len` bytes
            // stay valid and are this read's alone until its completion is
            // taken or the client removed; the removal sets the fence under
            // the exclusive lock, and this copy holds the shared one and
            // found it unset, so the memory is still the streamer's to
            // lend. `filled + n <= len` was checked above.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    (job.dst.addr as *mut u8).add(filled),
                    n,
                );
            }
            drop(fenced);
            filled += n;
        }
        if filled != len {
            return Outcome::Failed(
                code::FILE_TRUNCATED,
                format!("{what}: the object gave {filled} of the {len} bytes asked for (it ends before the range does)"),
            );
        }
        Outcome::Landed(How::Http)
    }
}

/// A transient failure's code while a read runs: what the streamer sees
/// of it depends on its version ([`Backend::retryable`]).
const TRANSIENT: i32 = code::RETRYABLE_FILE_ACCESS;

/// How a read ended.
enum Outcome {
    /// Its bytes are in the destination.
    Landed(How),
    /// Its client was removed: no event.
    Fenced,
    /// Failed: the code (a transient failure as [`TRANSIENT`]) and the
    /// message.
    Failed(i32, String),
}

/// How the bytes came.
enum How {
    Rdma,
    Http,
}

/// The S3 client a client's config and the settings describe.
fn s3_client(config: &ClientConfig, settings: &Settings) -> Result<S3, String> {
    let mut overrides = Overrides {
        endpoint: config.endpoint.clone().filter(|e| !e.is_empty()),
        ..Overrides::default()
    };
    let mut access = None;
    let mut secret = None;
    let mut token = None;
    for (key, value) in &config.params {
        let Some(value) = value.clone() else { continue };
        match key.as_str() {
            "access_key_id" => access = Some(value),
            "secret_access_key" => secret = Some(value),
            "session_token" => token = Some(value),
            "region" => overrides.region = Some(value),
            other => log(
                Level::Warning,
                &format!("unknown client parameter {other:?} ignored"),
            ),
        }
    }
    match (access, secret) {
        (Some(access_key_id), Some(secret_access_key)) => {
            overrides.credentials = Some(Credentials {
                access_key_id,
                secret_access_key,
                session_token: token,
            });
        }
        (None, None) => {}
        _ => log(
            Level::Warning,
            "only one of access_key_id and secret_access_key given: the environment's keys are used",
        ),
    }
    if settings.unsigned && overrides.credentials.is_none() {
        // Anonymous requests need no keys.
        overrides.credentials = Some(Credentials {
            access_key_id: String::new(),
            secret_access_key: String::new(),
            session_token: None,
        });
    }
    let config = S3Config::resolve(&overrides).map_err(|e| format!("{e}"))?;
    let options = RequestOptions {
        timeout: settings.timeout,
        virtual_hosted: settings.virtual_hosted,
        unsigned: settings.unsigned,
        ca_bundle: settings.ca_bundle.as_ref().map(std::path::PathBuf::from),
    };
    if settings.virtual_hosted && literal_host(&config.endpoint) {
        log(
            Level::Warning,
            &format!(
                "virtual-hosted addressing (the default) puts the bucket in the host name, which {} cannot take: set RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0",
                config.endpoint
            ),
        );
    }
    S3::with_options(config, options).map_err(|e| format!("{e}"))
}

/// Whether `endpoint`'s host is an IP address or `localhost`: no bucket
/// can be a label of it.
fn literal_host(endpoint: &str) -> bool {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: &str) -> ClientConfig {
        ClientConfig {
            endpoint: Some(endpoint.to_owned()),
            chunk: 0,
            params: vec![
                ("access_key_id".to_owned(), Some("ak".to_owned())),
                ("secret_access_key".to_owned(), Some("sk".to_owned())),
            ],
        }
    }

    #[test]
    fn ip_and_localhost_endpoints_are_literal_hosts() {
        assert!(literal_host("http://127.0.0.1:9000"));
        assert!(literal_host("http://[::1]:9000"));
        assert!(literal_host("https://localhost"));
        assert!(!literal_host("https://s3.us-east-1.amazonaws.com"));
        assert!(!literal_host("http://gateway.local:9000"));
    }

    const NO_EVENT: Event = Event {
        id: 0,
        code: -1,
        bytes: 0,
    };

    /// One test: `obj_cancel_all_reads` stops every client of the process,
    /// so the steps that depend on it run in order.
    #[test]
    fn waits_never_report_success_without_events_and_cancel_stops_them() {
        let backend = backend();
        backend.open();
        // Nothing listens on port 1: the read fails as a transport error.
        let client = backend
            .create_client(&config("http://127.0.0.1:1"))
            .unwrap();
        assert_eq!(backend.window(), 187_500_000);
        let mut out = [NO_EVENT; 4];
        // Idle: FinishedError at once, in every mode.
        for mode in [WaitMode::Block, WaitMode::NonBlocking, WaitMode::Timed] {
            assert_eq!(backend.wait(client, &mut out, mode), (code::FINISHED, 0));
        }
        let mut memory = vec![0x5au8; 64];
        // SAFETY: `memory` outlives the client, removed below.
        let dst = unsafe { Dst::new(memory.as_mut_ptr(), memory.len()) };
        assert_eq!(
            backend.request_read(client, "s3://bkt/key", 0, dst, 7),
            code::SUCCESS
        );
        // BLOCK waits for the event: never Success with none.
        let (rc, n) = backend.wait(client, &mut out, WaitMode::Block);
        assert_eq!((rc, n), (code::SUCCESS, 1));
        assert_eq!(out[0].id, 7);
        assert_eq!(
            out[0].code,
            backend.retryable(),
            "a refused connection is transient"
        );
        assert_eq!(memory, vec![0x5au8; 64], "a failed read writes nothing");
        // A bad URI is refused at submission, with no event to follow.
        assert_eq!(
            backend.request_read(client, "gs://bkt/key", 0, dst, 8),
            code::INVALID_PARAMETER
        );
        assert_eq!(
            backend.wait(client, &mut out, WaitMode::Block),
            (code::FINISHED, 0)
        );
        // A cancel wakes a blocked wait, which then ends with FinishedError.
        let waiter = backend
            .create_client(&config("http://127.0.0.1:1"))
            .unwrap();
        // A read the waiter believes outstanding (never sent).
        lock(&backend.client(waiter).unwrap().queues).outstanding = 1;
        let blocked = std::thread::spawn(move || {
            let mut out = [NO_EVENT; 1];
            backend.wait(waiter, &mut out, WaitMode::Block)
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !blocked.is_finished(),
            "BLOCK waits while a read is outstanding"
        );
        backend.cancel_all();
        assert_eq!(blocked.join().unwrap(), (code::FINISHED, 0));
        // A client made after the cancel is not stopped.
        let later = backend
            .create_client(&config("http://127.0.0.1:1"))
            .unwrap();
        assert_eq!(
            backend.request_read(later, "s3://bkt/key", 0, dst, 1),
            code::SUCCESS
        );
        assert_eq!(backend.wait(later, &mut out, WaitMode::Block).1, 1);
        assert!(backend.remove_client(client));
        assert!(!backend.remove_client(client), "a handle is removed once");
        assert!(backend.remove_all());
        assert_eq!(
            backend.request_read(later, "s3://bkt/key", 0, dst, 2),
            code::UNKNOWN,
            "a removed client takes no read"
        );
        drop(memory);
    }
}
