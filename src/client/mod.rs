//! The safe Rust API: the library as owned values, over [`crate::core`]
//! (not over the C ABI, and independent of the instance the C functions
//! use).
//!
//! - [`Client`]: one instance of the library (a NIC, its connections, the
//!   GPU it serves or none), built by [`Client::builder`](crate::client::Client::builder) and closed when
//!   dropped.
//! - [`Buffer`]: memory the client allocated (host or GPU) and registered,
//!   for as long as the value lives. Host bytes are reached as slices, GPU
//!   bytes by copies ([`Buffer::write_at`](crate::client::Buffer::write_at), [`Buffer::read_at`](crate::client::Buffer::read_at)).
//! - [`Client::get`](crate::client::Client::get) and [`Client::put`](crate::client::Client::put) move a range of a buffer with the
//!   S3 side supplied by the caller ([`S3Side`]: send the request with the
//!   token, hand back the server's `x-amz-rdma-reply`); the built-in S3
//!   client (feature `s3`, [`crate::s3`]) is one such side, and adds the
//!   plain-HTTP fallback.
//!
//! What the C ABI guarantees holds here too: a server reaches a buffer only
//! for the transfer it was sent, over that range and direction, and only
//! until the call returns; a failed call changes nothing it did not say it
//! changed.
//!
//! ```no_run
//! use hipobj::client::{Client, S3Side};
//!
//! /// The application's S3 request: sends the token, returns the reply.
//! struct MyRequest;
//! impl S3Side for MyRequest {
//!     fn exchange(&mut self, token: &str) -> Result<String, String> {
//!         // GET the object with `x-amz-rdma-token: {token}` and return
//!         // the response's `x-amz-rdma-reply` header.
//!         # let _ = token;
//!         Ok("200".to_owned())
//!     }
//! }
//!
//! # fn main() -> Result<(), hipobj::client::ClientError> {
//! let client = Client::builder().nic("mlx5_0").build()?;
//! let mut buffer = client.host_buffer(1 << 20)?;
//! let route = client.get(&mut buffer, 0..1 << 20, &mut MyRequest)?;
//! println!("{route:?}: {:?}", &buffer.as_slice().unwrap()[..16]);
//! # Ok(())
//! # }
//! ```

//!
//! On the fake platform (the crate `hipobj-testing`, testing/, a
//! dev-dependency of the tests and of an application's own), a whole GET
//! runs anywhere: a fake NIC, a fake GPU and an RDMA S3 server
//! in the same process, whose answer the S3 side hands back.
//!
//! ```
//! use hipobj::client::{Client, GpuSelect, Route, S3Side};
//! use hipobj::server::Op;
//! use hipobj_testing::world::World;
//!
//! struct WorldRequest<'a>(&'a World);
//! impl S3Side for WorldRequest<'_> {
//!     fn exchange(&mut self, token: &str) -> Result<String, String> {
//!         let reply = self.0.server.handle(token.as_bytes(), Op::Get);
//!         String::from_utf8(reply).map_err(|e| e.to_string())
//!     }
//! }
//!
//! let world = World::new();
//! world.server.set_object(b"hello, GPU");
//! let client = Client::builder()
//!     .platform(world.platform())
//!     .gpu(GpuSelect::Device(0))
//!     .build()
//!     .unwrap();
//! let mut buffer = client.device_buffer(10).unwrap(); // the fake GPU's memory
//! let route = client.get(&mut buffer, 0..10, &mut WorldRequest(&world)).unwrap();
//! assert_eq!(route, Route::Direct);
//! let mut back = [0u8; 10];
//! buffer.read_at(0, &mut back).unwrap();
//! assert_eq!(&back, b"hello, GPU");
//! ```

#![forbid(unsafe_code)]

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::core::args::{BufferRange, Slice};
use crate::core::buffers::BufKind;
use crate::core::nic::NicChoice;
use crate::core::reply::REPLY_BUFFER_LEN;
use crate::core::stats::Snapshot;
use crate::core::token::TOKEN_HEX_LEN;
use crate::core::transfer::{Canceller, Direction, S3Client};
use crate::core::{Config, Error, Instance, Options};
use crate::log::{log, Level};
use crate::platform::{DeviceBuffer, Gpu, GpuCall, Platform};

pub use crate::core::transfer::Route;
pub use ticket::{Completion, Finished, Ticket, Transfer};

mod ticket;

/// What went wrong in a call of the Rust API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The library refused or failed (its own error, with the code a C
    /// program would have seen: [`Error::code`]).
    #[error("{0}")]
    Library(#[from] Error),
    /// The server answered the token with a failure status (`501`: it
    /// does not do RDMA for this request; the transfer can go over plain
    /// HTTP instead).
    #[error("the server declined the RDMA transfer (x-amz-rdma-reply {status})")]
    Declined {
        /// The reply's status.
        status: u16,
    },
    /// The S3 side failed to send the request or read the answer.
    #[error("S3: {0}")]
    S3(String),
    /// A range or offset outside the buffer.
    #[error("{0}")]
    Range(String),
    /// The transfer was cancelled (its ticket cancelled or dropped) before
    /// it ended; nothing of it may be relied on.
    #[error("the transfer was cancelled")]
    Cancelled,
    /// The client was closed before the transfer ended (why, with the
    /// transfer's own error if it had one).
    #[error("the client was closed: {0}")]
    Closed(String),
}

/// The Rust API's result.
pub type Result<T> = std::result::Result<T, ClientError>;

/// Which GPU a client serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuSelect {
    /// None: host memory only, whatever GPU runtime is installed.
    #[default]
    None,
    /// The calling thread's current device (`gpuDevice = -1`).
    Current,
    /// This device index.
    Device(i32),
}

/// The S3 half of a transfer, supplied by the caller: the library mints
/// the token, the side carries it to the server and brings the reply back.
pub trait S3Side {
    /// Sends the S3 request (GET, PUT or UploadPart) with `token` (88 hex
    /// digits) in its `x-amz-rdma-token` header and returns, once the
    /// server has answered, the answer's `x-amz-rdma-reply` (`200`, `206`,
    /// `501`...). An answer without that header means the server does not
    /// do RDMA: return `"501"`. `Err` carries why the request failed.
    fn exchange(&mut self, token: &str) -> std::result::Result<String, String>;
}

/// Builds a [`Client`].
pub struct ClientBuilder {
    platform: Option<Arc<dyn Platform>>,
    gpu: GpuSelect,
    nics: Vec<String>,
    options: Options,
    max_in_flight: Option<usize>,
}

impl ClientBuilder {
    /// The platform to run on (the fakes of `crate::testing` in tests); the
    /// machine's by default.
    pub fn platform(mut self, platform: Arc<dyn Platform>) -> Self {
        self.platform = Some(platform);
        self
    }

    /// The GPU to serve ([`GpuSelect::None`] by default).
    pub fn gpu(mut self, gpu: GpuSelect) -> Self {
        self.gpu = gpu;
        self
    }

    /// Allows the RDMA device `name` (by default any; called more than
    /// once, any of those named, as `nicHint` lists them).
    pub fn nic(mut self, name: &str) -> Self {
        self.nics.push(name.to_owned());
        self
    }

    /// The settings (by default the `HIPOBJ_*` environment variables, as
    /// `hipObjInit` reads them).
    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// The most submitted transfers ([`Client::submit`]) that run at once;
    /// more wait in the client's queue. By default `HIPOBJ_MAX_TRANSFERS`
    /// (the connections a client keeps), at least 1.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n.max(1));
        self
    }

    /// Opens the devices and starts the client: the same steps, checks and
    /// errors as `hipObjInit`.
    pub fn build(self) -> Result<Client> {
        let gpu_device = match self.gpu {
            GpuSelect::None | GpuSelect::Current => -1,
            GpuSelect::Device(n) if n >= 0 => n,
            GpuSelect::Device(_) => {
                return Err(Error::InvalidValue("gpuDevice must be -1 or a device index").into())
            }
        };
        let config = Config {
            gpu_device,
            nic_hint: self.nics,
            no_gpu: self.gpu == GpuSelect::None,
            ..Config::default()
        };
        let platform = self.platform.unwrap_or_else(crate::platform::system);
        let instance = Instance::open(platform, config, self.options)?;
        let bound = self
            .max_in_flight
            .unwrap_or_else(|| usize::try_from(instance.options.max_transfers).unwrap_or(16));
        Ok(Client {
            instance,
            fallback: Arc::new(Fallbacks::default()),
            engine: ticket::Engine::new(bound),
        })
    }
}

/// Transfers the application moved over plain HTTP instead (the built-in
/// S3 client counts them; the library itself never sees them).
#[derive(Debug, Default)]
pub(crate) struct Fallbacks {
    count: AtomicU64,
    bytes: AtomicU64,
}

/// A client's counters: the library's ([`Snapshot`]) and the fallbacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// What the library counted: transfers and bytes by route, failures
    /// by cause, handshakes, staging copies.
    pub library: Snapshot,
    /// Transfers that went over plain HTTP instead of RDMA.
    pub fallback: u64,
    /// Their bytes.
    pub fallback_bytes: u64,
}

impl std::fmt::Display for ClientStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} fallback={} fallback_bytes={}",
            self.library, self.fallback, self.fallback_bytes
        )
    }
}

/// One instance of the library. `Send + Sync`: transfers may run on many
/// threads at once (up to `HIPOBJ_MAX_TRANSFERS`; more wait for a
/// connection, or fail with `Busy` from inside a transfer's own S3 side).
pub struct Client {
    instance: Arc<Instance>,
    fallback: Arc<Fallbacks>,
    engine: ticket::Engine,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("nic", &self.instance.nic.name)
            .field("gpu", &self.gpu_device())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A builder: the machine's platform, no GPU, any NIC, the settings of
    /// the environment.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            platform: None,
            gpu: GpuSelect::None,
            nics: Vec::new(),
            options: Options::from_env(),
            max_in_flight: None,
        }
    }

    /// The NIC, port and GID chosen.
    pub fn nic(&self) -> &NicChoice {
        &self.instance.nic
    }

    /// The GPU served, if any.
    pub fn gpu_device(&self) -> Option<i32> {
        self.instance.gpu.as_ref().map(|g| g.device)
    }

    /// Buffers registered now.
    pub fn registered_buffers(&self) -> usize {
        self.instance.buffer_count()
    }

    /// The counters now.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            library: self.instance.stats(),
            fallback: self.fallback.count.load(Ordering::Relaxed),
            fallback_bytes: self.fallback.bytes.load(Ordering::Relaxed),
        }
    }

    /// Counts a transfer of `bytes` the application moved over plain HTTP
    /// instead.
    pub fn count_fallback(&self, bytes: u64) {
        self.fallback.count.fetch_add(1, Ordering::Relaxed);
        self.fallback.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `len` zeroed bytes of host memory, registered.
    pub fn host_buffer(&self, len: usize) -> Result<Buffer> {
        self.register_host(vec![0u8; len])
    }

    /// Registers `bytes` (host memory) as a buffer; [`Buffer::into_vec`]
    /// gives them back.
    pub fn register_host(&self, bytes: Vec<u8>) -> Result<Buffer> {
        self.instance.check_process()?;
        let memory = bytes.into_boxed_slice();
        let range = BufferRange::new(memory.as_ptr() as usize, memory.len())?;
        self.instance.register(range, true)?;
        Ok(Buffer {
            instance: Arc::clone(&self.instance),
            base: range.addr,
            len: range.len,
            memory: Memory::Host(memory),
            registered: true,
        })
    }

    /// Registers host memory the caller lends (a host program's buffer) for
    /// as long as the buffer lives: [`Buffer::into_lent`] deregisters it
    /// and gives it back; a drop deregisters it. The library never frees
    /// it. Refused, it comes back with the error.
    pub fn lend(
        &self,
        bytes: &'static mut [u8],
    ) -> std::result::Result<Buffer, (ClientError, &'static mut [u8])> {
        if let Err(e) = self.instance.check_process() {
            return Err((e.into(), bytes));
        }
        let range = match BufferRange::new(bytes.as_ptr() as usize, bytes.len()) {
            Ok(range) => range,
            Err(e) => return Err((e.into(), bytes)),
        };
        if let Err(e) = self.instance.register(range, true) {
            return Err((e.into(), bytes));
        }
        Ok(Buffer {
            instance: Arc::clone(&self.instance),
            base: range.addr,
            len: range.len,
            memory: Memory::Lent(bytes),
            registered: true,
        })
    }

    /// `len` bytes of the served GPU's memory, allocated by its runtime and
    /// registered as `hipObjBufRegister` registers GPU memory (dma-buf, a
    /// plain registration, or staging: [`Buffer::kind`] says which).
    pub fn device_buffer(&self, len: usize) -> Result<Buffer> {
        self.instance.check_process()?;
        let gpu = self
            .instance
            .gpu
            .as_ref()
            .ok_or(Error::NotSupported("this client serves no GPU"))?;
        // Checked before the allocation, so that a size the library
        // refuses allocates nothing.
        BufferRange::new(1, len)?;
        let memory = gpu
            .gpu
            .device_alloc(gpu.device, len)
            .map_err(|code| Error::Hip {
                call: gpu.gpu.call_name(GpuCall::DeviceAlloc),
                code,
            })?;
        let range = BufferRange::new(memory.addr(), memory.len())?;
        self.instance.register(range, false)?;
        Ok(Buffer {
            instance: Arc::clone(&self.instance),
            base: range.addr,
            len: range.len,
            memory: Memory::Device {
                memory,
                gpu: Arc::clone(&gpu.gpu),
            },
            registered: true,
        })
    }

    /// Fills `range` of `buffer` from the S3 request `s3` sends (a GET).
    pub fn get(
        &self,
        buffer: &mut Buffer,
        range: Range<usize>,
        s3: &mut dyn S3Side,
    ) -> Result<Route> {
        self.transfer(Direction::Get, buffer, range, s3)
    }

    /// Sends `range` of `buffer` to the S3 request `s3` sends (a PUT or an
    /// UploadPart).
    pub fn put(&self, buffer: &Buffer, range: Range<usize>, s3: &mut dyn S3Side) -> Result<Route> {
        self.transfer(Direction::Put, buffer, range, s3)
    }

    fn transfer(
        &self,
        direction: Direction,
        buffer: &Buffer,
        range: Range<usize>,
        s3: &mut dyn S3Side,
    ) -> Result<Route> {
        run_transfer(&self.instance, direction, buffer, range, s3, None)
    }

    // ------------------------------------------------------------ asynchronous

    /// Submits `transfer` and returns at once (never on the network): its
    /// ticket. More than [`Client::max_in_flight`] transfers wait in the
    /// client's queue, first in, first out. A client closed, or used in a
    /// process forked from the one that built it (whose transfer threads
    /// the child does not have), hands the transfer back.
    ///
    /// ```
    /// use hipobj::client::{Client, S3Side, Transfer};
    /// use hipobj::server::Op;
    /// use hipobj_testing::world::{TestServer, World};
    /// use std::sync::Arc;
    ///
    /// /// An S3 side that owns what it needs (it runs on the client's
    /// /// transfer threads): here, the fake world's RDMA S3 server.
    /// struct Request(Arc<TestServer>, Op);
    /// impl S3Side for Request {
    ///     fn exchange(&mut self, token: &str) -> Result<String, String> {
    ///         String::from_utf8(self.0.handle(token.as_bytes(), self.1)).map_err(|e| e.to_string())
    ///     }
    /// }
    ///
    /// let world = World::new();
    /// world.server.set_object(&[7u8; 4096]);
    /// let client = Client::builder().platform(world.platform()).build().unwrap();
    /// // Eight GETs in flight from one thread, each into its own buffer.
    /// let tickets = client.submit_batch((0..8).map(|_| {
    ///     let buffer = client.host_buffer(4096).unwrap();
    ///     Transfer::get(buffer, 0..4096, Request(world.server.clone(), Op::Get))
    /// }));
    /// for mut ticket in tickets.unwrap() {
    ///     let done = ticket.wait(None).unwrap();
    ///     done.result.unwrap();
    ///     assert_eq!(done.buffer.as_slice().unwrap(), &[7u8; 4096][..]);
    /// }
    /// ```
    pub fn submit(&self, transfer: Transfer) -> std::result::Result<Ticket, Transfer> {
        self.engine.submit(&self.instance, transfer, None)
    }

    /// Submits every transfer, in order; their tickets in the same order.
    /// If the client is closed (or in a forked child), the transfers not
    /// submitted come back (the tickets already made are dropped: their
    /// transfers cancelled).
    pub fn submit_batch(
        &self,
        transfers: impl IntoIterator<Item = Transfer>,
    ) -> std::result::Result<Vec<Ticket>, Vec<Transfer>> {
        let mut tickets = Vec::new();
        let mut transfers = transfers.into_iter();
        while let Some(transfer) = transfers.next() {
            match self.submit(transfer) {
                Ok(ticket) => tickets.push(ticket),
                Err(first) => {
                    drop(tickets);
                    return Err(std::iter::once(first).chain(transfers).collect());
                }
            }
        }
        Ok(tickets)
    }

    /// Submits `transfer` with no ticket: its end comes out of
    /// [`Client::next_completion`] with `tag`. It cannot be cancelled
    /// alone; closing the client ends it. As [`Client::submit`], a closed
    /// client, or a forked child, hands the transfer back.
    pub fn submit_tagged(&self, transfer: Transfer, tag: u64) -> std::result::Result<(), Transfer> {
        // Its ticket goes: a tagged ticket's drop cancels nothing.
        self.engine
            .submit(&self.instance, transfer, Some(tag))
            .map(drop)
    }

    /// The next tagged transfer to end, in the order they end; waits at
    /// most `timeout` (`None`: as long as it takes).
    pub fn next_completion(&self, timeout: Option<std::time::Duration>) -> Option<Completion> {
        self.engine.completions(1, timeout).pop()
    }

    /// Up to `max` tagged transfers that ended, in the order they ended:
    /// all those in now, or, when none is, the first within `timeout`
    /// (`None`: as long as it takes) and any that ended with it. One
    /// wake-up for several ends, where [`Client::next_completion`] takes
    /// one each.
    pub fn completions(&self, max: usize, timeout: Option<std::time::Duration>) -> Vec<Completion> {
        self.engine.completions(max, timeout)
    }

    /// The most transfers submitted ones run at once.
    pub fn max_in_flight(&self) -> usize {
        self.engine.bound()
    }
}

/// One transfer of `range` of `buffer` on `instance`, with the caller's S3
/// side, ended early by `cancel` if given.
pub(crate) fn run_transfer(
    instance: &Instance,
    direction: Direction,
    buffer: &Buffer,
    range: Range<usize>,
    s3: &mut dyn S3Side,
    cancel: Option<&Canceller>,
) -> Result<Route> {
    instance.check_process()?;
    if !std::ptr::eq(&*buffer.instance, instance) {
        return Err(Error::BufNotRegistered.into());
    }
    let len = buffer.check(&range)?;
    let offset = i64::try_from(range.start).map_err(|_| ClientError::Range("offset".into()))?;
    let slice = Slice::new(buffer.base, len, offset)?;
    let mut side = Exchange {
        side: s3,
        reply: String::new(),
        failure: None,
    };
    match instance.transfer_cancellable(direction, slice, &mut side, cancel) {
        Ok(route) => Ok(route),
        Err(e) => Err(match (e.declined(), side.failure) {
            (Some(status), _) => ClientError::Declined { status },
            (None, Some(why)) => ClientError::S3(why),
            (None, None) => ClientError::Library(e),
        }),
    }
}

impl Drop for Client {
    /// Closes the instance: transfers still running on other threads end
    /// with `NotInitialized`; buffers still alive deregister when dropped.
    fn drop(&mut self) {
        if self.instance.forked() {
            // The parent's: never torn down here.
            Instance::abandon_in_child(&self.instance);
            return;
        }
        self.engine.close();
        self.instance.close();
    }
}

/// Adapts an [`S3Side`] to the library's two callbacks.
struct Exchange<'a> {
    side: &'a mut dyn S3Side,
    reply: String,
    failure: Option<String>,
}

impl S3Client for Exchange<'_> {
    fn send_request(&mut self, token: &[u8; TOKEN_HEX_LEN + 1]) -> std::result::Result<(), i32> {
        // The token is ASCII hex (the library wrote it) followed by a NUL.
        let text = String::from_utf8_lossy(&token[..TOKEN_HEX_LEN]);
        match self.side.exchange(&text) {
            Ok(reply) => {
                self.reply = reply;
                Ok(())
            }
            Err(why) => {
                self.failure = Some(why);
                Err(-1)
            }
        }
    }

    fn recv_reply(
        &mut self,
        reply: &mut [u8; REPLY_BUFFER_LEN],
    ) -> std::result::Result<usize, i32> {
        let bytes = self.reply.as_bytes();
        match reply.get_mut(..bytes.len()) {
            Some(out) => {
                out.copy_from_slice(bytes);
                Ok(bytes.len())
            }
            None => {
                self.failure = Some(format!("a reply of {} bytes", bytes.len()));
                Err(-1)
            }
        }
    }
}

/// What a [`Buffer`] holds.
enum Memory {
    Host(Box<[u8]>),
    /// The caller's, lent ([`Client::lend`]): never freed here.
    Lent(&'static mut [u8]),
    Device {
        memory: Arc<dyn DeviceBuffer>,
        gpu: Arc<dyn Gpu>,
    },
}

/// Memory registered with a [`Client`] for as long as this value lives;
/// deregistered, then freed, when it drops (or leaked, and said so, if the
/// library could not end every use of it).
pub struct Buffer {
    instance: Arc<Instance>,
    base: usize,
    len: usize,
    memory: Memory,
    /// Until [`Buffer::release`] succeeds.
    registered: bool,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len)
            .field("kind", &self.kind())
            .finish_non_exhaustive()
    }
}

/// How long a copy between the host and a GPU buffer may take.
const COPY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
/// The most bytes one bounce through pinned memory carries.
const BOUNCE: usize = 16 << 20;

impl Buffer {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte (never: a registration has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How the library registered it.
    pub fn kind(&self) -> Option<BufKind> {
        self.instance.buffer_kind(self.base)
    }

    /// The GPU whose memory it is, if any.
    pub fn device(&self) -> Option<i32> {
        match &self.memory {
            Memory::Host(_) | Memory::Lent(_) => None,
            Memory::Device { memory, .. } => Some(memory.device()),
        }
    }

    /// The bytes of host memory; `None` for GPU memory.
    pub fn as_slice(&self) -> Option<&[u8]> {
        match &self.memory {
            Memory::Host(bytes) => Some(bytes),
            Memory::Lent(bytes) => Some(bytes),
            Memory::Device { .. } => None,
        }
    }

    /// The bytes of host memory, to change; `None` for GPU memory.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match &mut self.memory {
            Memory::Host(bytes) => Some(bytes),
            Memory::Lent(bytes) => Some(bytes),
            Memory::Device { .. } => None,
        }
    }

    /// Deregisters host memory and gives its bytes back; GPU memory, or
    /// memory the library could not release, stays a buffer (`Err`).
    pub fn into_vec(mut self) -> std::result::Result<Vec<u8>, Buffer> {
        if !matches!(self.memory, Memory::Host(_)) || !self.release() {
            return Err(self);
        }
        match std::mem::replace(&mut self.memory, Memory::Host(Box::default())) {
            Memory::Host(bytes) => Ok(bytes.into_vec()),
            Memory::Lent(_) | Memory::Device { .. } => unreachable!("checked above"),
        }
    }

    /// Deregisters memory lent with [`Client::lend`] and gives it back;
    /// any other memory, or lent memory the library could not deregister,
    /// stays a buffer (`Err`).
    pub fn into_lent(mut self) -> std::result::Result<&'static mut [u8], Buffer> {
        if !matches!(self.memory, Memory::Lent(_)) || !self.release() {
            return Err(self);
        }
        match std::mem::replace(&mut self.memory, Memory::Host(Box::default())) {
            Memory::Lent(bytes) => Ok(bytes),
            Memory::Host(_) | Memory::Device { .. } => unreachable!("checked above"),
        }
    }

    /// Deregisters the buffer, once: whether its memory may be freed (no
    /// registration and no staging copy can reach it any more).
    fn release(&mut self) -> bool {
        if !self.registered {
            return true;
        }
        let running = self.instance.copy_running(self.base);
        match self.instance.deregister(self.base) {
            Ok(()) if !running => {
                self.registered = false;
                true
            }
            outcome => {
                log!(
                    Level::Error,
                    "a buffer of {} bytes could not be released ({})",
                    self.len,
                    match outcome {
                        Err(e) => e.to_string(),
                        Ok(()) => "a staging copy of it may still run".to_owned(),
                    }
                );
                false
            }
        }
    }

    /// Copies `data` into the buffer at `offset` (for GPU memory, through
    /// pinned host memory and the runtime's copies).
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(&(offset..offset.saturating_add(data.len())))?;
        match &mut self.memory {
            Memory::Host(bytes) => {
                bytes[offset..offset + data.len()].copy_from_slice(data);
                Ok(())
            }
            Memory::Lent(bytes) => {
                bytes[offset..offset + data.len()].copy_from_slice(data);
                Ok(())
            }
            Memory::Device { memory, gpu } => bounce(&**gpu, data.len(), |pinned, done, n| {
                if !pinned.write(0, &data[done..done + n]) {
                    return Err(Error::InvalidValue("pinned buffer").into());
                }
                copy(&**gpu, memory.addr() + offset + done, pinned.addr(), n)
            }),
        }
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(&(offset..offset.saturating_add(out.len())))?;
        match &self.memory {
            Memory::Host(bytes) => {
                out.copy_from_slice(&bytes[offset..offset + out.len()]);
                Ok(())
            }
            Memory::Lent(bytes) => {
                out.copy_from_slice(&bytes[offset..offset + out.len()]);
                Ok(())
            }
            Memory::Device { memory, gpu } => {
                let len = out.len();
                bounce(&**gpu, len, |pinned, done, n| {
                    copy(&**gpu, pinned.addr(), memory.addr() + offset + done, n)?;
                    if !pinned.read(0, &mut out[done..done + n]) {
                        return Err(Error::InvalidValue("pinned buffer").into());
                    }
                    Ok(())
                })
            }
        }
    }

    /// The length of `range` when it is a non-empty range inside the
    /// buffer.
    fn check(&self, range: &Range<usize>) -> Result<usize> {
        if range.start > range.end || range.end > self.len {
            return Err(ClientError::Range(format!(
                "{}..{} is not inside a buffer of {} bytes",
                range.start, range.end, self.len
            )));
        }
        Ok(range.end - range.start)
    }
}

/// Runs `step(pinned, done, n)` over `len` bytes in pieces of at most
/// [`BOUNCE`], with one pinned buffer.
fn bounce(
    gpu: &dyn Gpu,
    len: usize,
    mut step: impl FnMut(&dyn crate::platform::HostBuffer, usize, usize) -> Result<()>,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let pinned = gpu.host_alloc(len.min(BOUNCE)).map_err(|code| Error::Hip {
        call: gpu.call_name(GpuCall::HostAlloc),
        code,
    })?;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(BOUNCE);
        if let Err(e) = step(&*pinned, done, n) {
            // A copy that missed its deadline may still use it.
            pinned.leak();
            return Err(e);
        }
        done += n;
    }
    Ok(())
}

/// One copy through the runtime, waited for.
fn copy(gpu: &dyn Gpu, dst: usize, src: usize, len: usize) -> Result<()> {
    let event = gpu.copy_async(dst, src, len).map_err(|code| Error::Hip {
        call: "copy_async",
        code,
    })?;
    match event.wait(Instant::now() + COPY_DEADLINE) {
        Ok(true) => Ok(()),
        Ok(false) => {
            event.leak();
            Err(Error::Staging {
                what: "a copy to or from GPU memory missed its deadline",
                hip: 0,
            }
            .into())
        }
        Err(code) => Err(Error::Hip {
            call: "copy_async",
            code,
        }
        .into()),
    }
}

impl Drop for Buffer {
    /// Deregisters, then frees. Memory whose use the library could not end
    /// (a deregistration that failed, a staging copy that may still run)
    /// is leaked, never freed under a NIC or a GPU copy.
    fn drop(&mut self) {
        if self.instance.forked() {
            // Its registration is the parent's; host memory is this
            // process's own copy, GPU memory the parent's.
            Instance::abandon_in_child(&self.instance);
            if let Memory::Device { memory, .. } =
                std::mem::replace(&mut self.memory, Memory::Host(Box::default()))
            {
                std::mem::forget(memory);
            }
            return;
        }
        if self.release() {
            return;
        }
        log!(Level::Error, "its memory is leaked");
        match std::mem::replace(&mut self.memory, Memory::Host(Box::default())) {
            Memory::Host(bytes) => std::mem::forget(bytes),
            // The owner frees it: a registration whose release failed
            // keeps its pages pinned, and no server can reach them (every
            // transfer's access ends before its call returns).
            Memory::Lent(_) => {}
            Memory::Device { memory, .. } => std::mem::forget(memory),
        }
    }
}
