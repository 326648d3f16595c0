//! The process-wide current instance, and initialization and shutdown.
//!
//! The current instance lives in a [`Current`]: an `Arc<Instance>` behind a
//! shared lock, plus a mutex that serializes init and shutdown. A call copies
//! the `Arc` under the shared lock and releases it, so the instance it found
//! stays alive for the rest of that call even if another thread shuts the
//! library down. Shutdown does not wait for calls in flight: the instance is
//! dropped when the last call holding it returns.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use std::net::SocketAddr;

use super::abandoned::AbandonedCopies;
use super::buffers::BufferMap;
use super::connections::{Connections, Mode, Pool, Settings, Striping};
use super::nic::{self, GpuPlace, NicChoice};
use super::options::{poll_for, stripes_for, Options};
use super::polling::Polling;
use super::stats::{Snapshot, Stats};
use super::tokens::TokenBook;
use crate::error::{Error, Result, HIP_ERROR_NO_DEVICE};
use crate::log;
use crate::platform::{Cm, Context, Gid, Gpu, GpuCall, GpuRuntime, Pd, Platform, PortState};

/// What `hipObjInit` was given, copied out of the caller's `hipObjConfig_t`.
/// The access and secret keys are never stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `endpoint`, if given.
    pub endpoint: Option<String>,
    /// `region`, if given.
    pub region: Option<String>,
    /// HIP device index, or -1 for the calling thread's current device.
    pub gpu_device: i32,
    /// RDMA device names allowed (empty: any).
    pub nic_hint: Vec<String>,
    /// No GPU at all: host memory only, whatever runtime is installed and
    /// without a NIC hint (the Rust API's choice; a C program cannot ask
    /// for it, and gets a GPU-less instance only with a hint).
    pub no_gpu: bool,
}

impl Config {
    /// Checks the value rules of `hipObjConfig_t` that come before the
    /// already-initialized check: `flags` must be 0, `gpuDevice` >= -1.
    pub fn check_values(flags: u32, gpu_device: i32) -> Result<()> {
        if flags != 0 {
            return Err(Error::InvalidValue(
                "config flags are reserved and must be 0",
            ));
        }
        if gpu_device < -1 {
            return Err(Error::InvalidValue(
                "gpuDevice must be -1 or a device index",
            ));
        }
        Ok(())
    }

    /// Splits a `nicHint` into device names; empty entries are ignored.
    pub fn parse_nic_hint(hint: &str) -> Vec<String> {
        hint.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// The GPU an instance serves.
pub struct GpuChoice {
    /// The runtime.
    pub gpu: Arc<dyn Gpu>,
    /// The HIP device index.
    pub device: i32,
}

/// How long shutdown waits for the driver to confirm that every token
/// ended (it takes microseconds unless the driver is wedged).
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// One initialized library: everything `hipObjInit` built. Built whole by
/// [`Current::init_with`] or not at all.
///
/// Field order is teardown order: the connection driver stops first (it
/// ends every job, revoking its access, and disconnects every connection;
/// its thread drops the QPs, windows and CQ); abandoned copies leak what
/// may still be written; buffers deregister; then the protection domain
/// and the device; the platform outlives them all.
pub struct Instance {
    /// Settings read at init.
    pub options: Options,
    /// The caller's configuration.
    pub config: Config,
    /// The NIC, port and GID chosen.
    pub nic: NicChoice,
    /// The GID the device reports at the chosen index.
    pub gid: Gid,
    /// The port servers connect to (the listener's).
    pub listener_port: u16,
    /// How access is granted on this device.
    pub mode: Mode,
    /// The connections and their driver (stopped first).
    pub(crate) connections: Connections,
    /// What moved the bytes, and what failed ([`Instance::stats`]).
    pub(crate) stats: Arc<Stats>,
    /// How long a calling thread polls for its transfer's outcome before
    /// it sleeps (`HIPOBJ_POLL_US`, by device, while such polls pay).
    pub polling: Polling,
    pub(crate) tokens: Arc<TokenBook>,
    timers_pending: Arc<std::sync::atomic::AtomicUsize>,
    /// The process that built it: a forked child must not use (nor tear
    /// down) what belongs to its parent.
    pid: u32,
    pub(crate) abandoned: AbandonedCopies,
    pub(crate) buffers: BufferMap,
    pub(crate) pd: Arc<dyn Pd>,
    pub(crate) ctx: Arc<dyn Context>,
    /// The GPU; `None` on a GPU-less host (with a NIC hint).
    pub gpu: Option<GpuChoice>,
    _cm: Arc<dyn Cm>,
    _platform: Arc<dyn Platform>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("options", &self.options)
            .field("nic", &self.nic)
            .field("gpu", &self.gpu.as_ref().map(|g| g.device))
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// Builds an instance in the order of the ABI spec: libibverbs, the GPU,
    /// the NIC, the device and what hangs off it. Everything is built in
    /// locals; a failure drops what was built, in reverse.
    fn build(
        platform: Arc<dyn Platform>,
        mut config: Config,
        options: Options,
    ) -> Result<Instance> {
        log::set_level(options.log);
        if config.nic_hint.is_empty() {
            if let Some(hint) = &options.nic_hint {
                config.nic_hint = Config::parse_nic_hint(hint);
            }
        }
        let verbs = platform.verbs()?;
        let gpu = resolve_gpu(&*platform, &config, options.gpu_runtime).map_err(|e| {
            match (&e, config.nic_hint.is_empty()) {
                (Error::Hip { .. } | Error::HipMissing(_), true) => Error::NoGpuNoNic {
                    why: e.to_string(),
                    code: e.hip_error(),
                    devices: match verbs.device_names() {
                        Ok(names) if names.is_empty() => {
                            "no RDMA device is present on this host either".to_owned()
                        }
                        Ok(names) => format!("present: {}", names.join(", ")),
                        Err(why) => format!("the RDMA devices could not be listed: {why}"),
                    },
                },
                _ => e,
            }
        })?;
        let present = verbs.device_names()?;
        if !present
            .iter()
            .any(|name| config.nic_hint.is_empty() || config.nic_hint.contains(name))
        {
            // The original opens a hinted device by name when nothing else
            // chooses it, so a hint naming no present device is a failure
            // to open it (hipObjRdmaError); with no hint and no device
            // there is no NIC to find.
            return Err(if config.nic_hint.is_empty() {
                nic::not_found(&present, &config.nic_hint)
            } else {
                Error::Rdma(format!(
                    "cannot open RDMA device {}: no such device (present: {})",
                    config.nic_hint.join(","),
                    if present.is_empty() {
                        "none".to_owned()
                    } else {
                        present.join(", ")
                    }
                ))
            });
        }
        let topology = platform.topology()?;
        let nics = topology.nics()?;
        let bus_id = match &gpu {
            Some(g) => Some(g.gpu.pci_bus_id(g.device).map_err(|code| Error::Hip {
                call: g.gpu.call_name(GpuCall::PciBusId),
                code,
            })?),
            None => None,
        };
        let place = bus_id.as_deref().map(|bus_id| GpuPlace { bus_id });
        let nic = nic::choose(&present, &nics, &config.nic_hint, place, &*topology)?;
        let ctx = verbs.open(&nic.name)?;
        let port = ctx.query_port(nic.port)?;
        if port.state != PortState::Active {
            return Err(Error::NicNotFound(format!(
                "{} port {} is not active",
                nic.name, nic.port
            )));
        }
        let gid = ctx.query_gid(nic.port, nic.gid_index)?;
        let pd = ctx.alloc_pd()?;
        let cm = platform.cm()?;
        let listener = cm.listen(SocketAddr::new(nic::ip_of(&gid), 0))?;
        let count = usize::try_from(options.max_transfers)
            .map_err(|_| Error::InvalidValue("HIPOBJ_MAX_TRANSFERS"))?;
        let settings = Settings {
            port: nic.port,
            completion_timeout: options.completion_timeout,
            idle_timeout: options.idle_timeout,
            debug: options.rdma_debug,
            poll: poll_for(options.poll, ctx.vendor_id(), ctx.name()),
            striping: Striping {
                protocol: options.protocol,
                stripes: stripes_for(options.stripes, ctx.vendor_id(), ctx.name()),
                min_len: options.stripe_min,
            },
            stats: Arc::new(Stats::default()),
            tokens: Arc::new(TokenBook::new()),
            timers_pending: Arc::default(),
        };
        let stats = settings.stats.clone();
        let polling = Polling::new(settings.poll);
        let tokens = settings.tokens.clone();
        let timers_pending = settings.timers_pending.clone();
        let listener_port = listener.port();
        let connections = Connections::start(ctx.clone(), &pd, listener, count, settings)?;
        let mode = connections.mode();
        Ok(Instance {
            options,
            config,
            nic,
            gid,
            listener_port,
            mode,
            connections,
            stats,
            polling,
            tokens,
            timers_pending,
            pid: std::process::id(),
            abandoned: AbandonedCopies::new(),
            buffers: BufferMap::new(),
            pd,
            ctx,
            gpu,
            _cm: cm,
            _platform: platform,
        })
    }

    /// Builds an instance of its own, outside any [`Current`] (the Rust
    /// API's): call [`Instance::close`] when done with it, as
    /// [`Current::shutdown`] does.
    pub fn open(
        platform: Arc<dyn Platform>,
        config: Config,
        options: Options,
    ) -> Result<Arc<Instance>> {
        Ok(Arc::new(Instance::build(platform, config, options)?))
    }

    /// `Err(Forked)` in a process forked from the one that built this
    /// instance: its driver thread does not run there, and its connections
    /// and registrations are the parent's.
    pub fn check_process(&self) -> Result<()> {
        let child = std::process::id();
        if child == self.pid {
            Ok(())
        } else {
            Err(Error::Forked {
                parent: self.pid,
                child,
            })
        }
    }

    /// Whether this process is a fork of the one that built the instance.
    pub fn forked(&self) -> bool {
        self.check_process().is_err()
    }

    /// Gives up this reference without dropping it, in a forked child: the
    /// instance is never torn down there (its teardown would act on the
    /// parent's device objects through the inherited descriptors).
    pub fn abandon_in_child(this: &Arc<Instance>) {
        std::mem::forget(Arc::clone(this));
    }

    /// The port servers connect to.
    pub fn listener_port(&self) -> u16 {
        self.listener_port
    }

    /// The free list of connections.
    pub fn pool(&self) -> &Arc<Pool> {
        self.connections.pool()
    }

    /// The rkey of the registration of the buffer at `base`. It grants
    /// no remote access (only a transfer's window or range does); tests
    /// hand it to a server that tries it.
    pub fn registration_rkey(&self, base: usize) -> Option<u32> {
        self.buffers.find(base).ok().map(|e| e.mr.rkey())
    }

    /// How the buffer at `base` was registered, if it is.
    pub fn buffer_kind(&self, base: usize) -> Option<crate::core::buffers::BufKind> {
        self.buffers.find(base).ok().map(|e| e.kind)
    }

    /// Whether an abandoned staging copy of the buffer at `base` may still
    /// run (its memory must not be freed yet).
    pub fn copy_running(&self, base: usize) -> bool {
        self.abandoned.is_running(base)
    }

    /// Registered buffers.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// The instance's counters now.
    pub fn stats(&self) -> Snapshot {
        self.stats.snapshot()
    }

    /// Records of application-driven GETs into staged buffers that a
    /// later `hipObjBufSync` may need: the running ones, and one failure
    /// per buffer not reported yet.
    pub fn token_records(&self) -> usize {
        self.tokens.len()
    }

    /// Deadlines the connection driver watches (its timer heap's entries,
    /// as it last looked): a few per connection, whatever the transfer
    /// rate.
    pub fn timers_pending(&self) -> usize {
        self.timers_pending
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Abandoned staging copies still listed.
    pub fn abandoned_count(&self) -> usize {
        self.abandoned.len()
    }

    /// Closes the instance: calls waiting for a connection return
    /// `NotInitialized`, no new transfer starts, and every
    /// application-driven token ends (its access revoked: no server
    /// reaches its buffer after this returns) whatever other calls still
    /// hold the instance; a proof arriving later is refused. Transfers
    /// that calls in progress wait on run to their end.
    pub fn close(&self) {
        if !self.connections.close(CLOSE_GRACE) {
            log::log!(
                log::Level::Error,
                "shutdown: the connection driver did not confirm within {} s that the \
                 application-driven tokens ended",
                CLOSE_GRACE.as_secs()
            );
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Then the connections' driver (the first field to go) stops:
        // application-driven tokens end, established connections are
        // disconnected so that their servers see the end at once.
        self.connections.pool().close();
    }
}

/// Finds the GPU to serve. Having none at all is acceptable only with a NIC
/// hint, which then names the device to open.
fn resolve_gpu(
    platform: &dyn Platform,
    config: &Config,
    runtime: GpuRuntime,
) -> Result<Option<GpuChoice>> {
    if config.no_gpu {
        return Ok(None);
    }
    let gpu_less_ok = !config.nic_hint.is_empty();
    let gpu = match platform.gpu(runtime) {
        Ok(gpu) => gpu,
        Err(_) if gpu_less_ok => return Ok(None),
        Err(e) => return Err(e),
    };
    let count = match gpu.device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) | Err(_) if gpu_less_ok => return Ok(None),
        Ok(_) => {
            return Err(hip(
                gpu.call_name(GpuCall::DeviceCount),
                HIP_ERROR_NO_DEVICE,
            ))
        }
        Err(code) => return Err(hip(gpu.call_name(GpuCall::DeviceCount), code)),
    };
    let device = if config.gpu_device == -1 {
        gpu.current_device()
            .map_err(|code| hip(gpu.call_name(GpuCall::CurrentDevice), code))?
    } else if config.gpu_device >= count {
        return Err(Error::InvalidValue(
            "gpuDevice is not less than the GPU count",
        ));
    } else {
        config.gpu_device
    };
    Ok(Some(GpuChoice { gpu, device }))
}

fn hip(call: &'static str, code: i32) -> Error {
    Error::Hip { call, code }
}

/// The process-wide current instance, and the lock that serializes init and
/// shutdown. Lock order: `init_lock` before `instance`.
pub struct Current {
    init_lock: Mutex<()>,
    instance: RwLock<Option<Arc<Instance>>>,
}

impl Default for Current {
    fn default() -> Self {
        Current::new()
    }
}

impl Current {
    /// An empty slot.
    pub const fn new() -> Current {
        Current {
            init_lock: Mutex::new(()),
            instance: RwLock::new(None),
        }
    }

    /// The current instance, kept alive by the returned `Arc` for as long as
    /// the caller holds it. In a process forked from the one that built it,
    /// the instance is unpublished (and never torn down) and the call fails
    /// with `Forked`: the child may initialize afresh.
    pub fn instance(&self) -> Result<Arc<Instance>> {
        let found = self.instance.read().clone().ok_or(Error::NotInitialized)?;
        if let Err(forked) = found.check_process() {
            self.forget_forked();
            Instance::abandon_in_child(&found);
            return Err(forked);
        }
        Ok(found)
    }

    /// Unpublishes an instance inherited from the parent process, without
    /// tearing it down, and says so once.
    fn forget_forked(&self) {
        let mut slot = self.instance.write();
        if let Some(old) = slot.take_if(|i| i.forked()) {
            if let Err(why) = old.check_process() {
                log::log!(log::Level::Warn, "{why}");
            }
            Instance::abandon_in_child(&old);
        }
    }

    /// Whether an instance is published (for this process).
    pub fn is_initialized(&self) -> bool {
        self.instance().is_ok()
    }

    /// Builds an instance on `platform` and publishes it; on any failure
    /// nothing is published.
    pub fn init_with(
        &self,
        platform: Arc<dyn Platform>,
        config: Config,
        options: Options,
    ) -> Result<()> {
        let _serialized = self.init_lock.lock();
        self.forget_forked();
        if self.is_initialized() {
            return Err(Error::AlreadyInitialized);
        }
        let instance = Instance::open(platform, config, options)?;
        *self.instance.write() = Some(instance);
        Ok(())
    }

    /// Unpublishes the current instance, if any. Calls in flight keep the
    /// instance they hold; it is dropped when the last of them returns.
    pub fn shutdown(&self) {
        let _serialized = self.init_lock.lock();
        self.forget_forked();
        let old = self.instance.write().take();
        if let Some(instance) = &old {
            instance.close();
            if instance.options.stats {
                use std::io::Write;
                // Not eprintln!, which panics if stderr cannot be written.
                let _ = writeln!(std::io::stderr(), "hipobj-stats: {}", instance.stats());
            }
        }
        // Dropped after the write lock is released: if this was the last
        // reference, teardown runs without any lock of ours held.
        drop(old);
    }
}

/// The instance the exported functions use.
pub static CURRENT: Current = Current::new();
