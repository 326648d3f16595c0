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

use super::args::{BufferRange, Slice};
use super::error::{Error, Result, HIP_ERROR_NO_DEVICE};
use super::options::Options;
use crate::platform::{Context, Platform, Verbs};

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

/// One initialized library: the platform it runs on, its settings, and the
/// device it opened. Built whole by [`Current::init_with`] or not at all.
pub struct Instance {
    /// Settings read at init.
    pub options: Options,
    /// The caller's configuration.
    pub config: Config,
    /// The GPU chosen at init; `None` on a GPU-less host (with a NIC hint).
    pub gpu: Option<i32>,
    /// The open RDMA device.
    pub device: Arc<dyn Context>,
    // Declared last so it is dropped last: everything above came from it.
    _platform: Arc<dyn Platform>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("options", &self.options)
            .field("gpu", &self.gpu)
            .field("device", &self.device.name())
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// Builds an instance in the order of the ABI spec: libibverbs, the GPU,
    /// the NIC, the device. Everything is built in locals; a failure drops
    /// what was built.
    fn build(platform: Arc<dyn Platform>, config: Config, options: Options) -> Result<Instance> {
        let verbs = platform.verbs()?;
        let gpu = resolve_gpu(&*platform, &config)?;
        let nic = choose_nic(&*verbs, &config)?;
        let device = verbs.open(&nic)?;
        Ok(Instance {
            options,
            config,
            gpu,
            device,
            _platform: platform,
        })
    }
}

/// A registered buffer, as a transfer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Bytes registered.
    pub len: u64,
}

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// `hipObjBufRegister`: GPU memory (or host memory HIP knows).
    Device,
    /// `hipObjBufRegisterHost`: the caller's host memory.
    Host,
}

impl Instance {
    /// Registers `range`. Memory registration needs the verbs objects of an
    /// open device, which this release cannot create yet: no instance can be
    /// built by the production platform, so this is reached only through
    /// injected platforms.
    pub fn register(&self, range: BufferRange, memory: Memory) -> Result<()> {
        let _ = (range, memory);
        Err(Error::NotSupported(
            "memory registration is not part of this release",
        ))
    }

    /// The registration whose base address is exactly `base`. Nothing can be
    /// registered in this release, so no address is.
    pub fn registration(&self, base: usize) -> Result<Registration> {
        let _ = base;
        Err(Error::BufNotRegistered)
    }

    /// Removes the registration at `base`.
    pub fn deregister(&self, base: usize) -> Result<()> {
        self.registration(base).map(|_| ())
    }

    /// Checks a transfer's slice against its registration.
    pub fn check_slice(&self, slice: &Slice) -> Result<Registration> {
        let registration = self.registration(slice.base)?;
        slice.check_within(registration.len)?;
        Ok(registration)
    }
}

/// Finds the GPU to serve. Having none at all is acceptable only with a NIC
/// hint, which then names the device to open.
fn resolve_gpu(platform: &dyn Platform, config: &Config) -> Result<Option<i32>> {
    let gpu_less_ok = !config.nic_hint.is_empty();
    let gpu = match platform.gpu() {
        Ok(gpu) => gpu,
        Err(_) if gpu_less_ok => return Ok(None),
        Err(e) => return Err(e),
    };
    let count = match gpu.device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) | Err(_) if gpu_less_ok => return Ok(None),
        Ok(_) => return Err(hip("hipGetDeviceCount", HIP_ERROR_NO_DEVICE)),
        Err(code) => return Err(hip("hipGetDeviceCount", code)),
    };
    if config.gpu_device == -1 {
        return gpu
            .current_device()
            .map(Some)
            .map_err(|code| hip("hipGetDevice", code));
    }
    if config.gpu_device >= count {
        return Err(Error::InvalidValue(
            "gpuDevice is not less than the GPU count",
        ));
    }
    Ok(Some(config.gpu_device))
}

fn hip(call: &'static str, code: i32) -> Error {
    Error::Hip { call, code }
}

/// Chooses the RDMA device: the first one by name among those the hint
/// allows.
fn choose_nic(verbs: &dyn Verbs, config: &Config) -> Result<String> {
    let mut names = verbs.device_names()?;
    let present = names.join(", ");
    if !config.nic_hint.is_empty() {
        names.retain(|name| config.nic_hint.contains(name));
    }
    names.sort();
    names.into_iter().next().ok_or_else(|| {
        let present = if present.is_empty() {
            "none".to_owned()
        } else {
            present
        };
        if config.nic_hint.is_empty() {
            Error::NicNotFound(format!("no RDMA device present (found: {present})"))
        } else {
            Error::NicNotFound(format!(
                "no device named in the hint {:?} is present (found: {present})",
                config.nic_hint.join(",")
            ))
        }
    })
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
    /// the caller holds it.
    pub fn instance(&self) -> Result<Arc<Instance>> {
        self.instance.read().clone().ok_or(Error::NotInitialized)
    }

    /// Whether an instance is published.
    pub fn is_initialized(&self) -> bool {
        self.instance.read().is_some()
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
        if self.is_initialized() {
            return Err(Error::AlreadyInitialized);
        }
        let instance = Arc::new(Instance::build(platform, config, options)?);
        *self.instance.write() = Some(instance);
        Ok(())
    }

    /// Unpublishes the current instance, if any. Calls in flight keep the
    /// instance they hold; it is dropped when the last of them returns.
    pub fn shutdown(&self) {
        let _serialized = self.init_lock.lock();
        let old = self.instance.write().take();
        // Dropped after the write lock is released: if this was the last
        // reference, teardown runs without any lock of ours held.
        drop(old);
    }
}

/// The instance the exported functions use.
pub static CURRENT: Current = Current::new();

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A scripted platform: which libraries load, what they report, and
    /// counters of what was opened and dropped.
    #[derive(Default)]
    struct Script {
        no_verbs: bool,
        devices: Vec<&'static str>,
        open_fails: bool,
        gpu: Option<std::result::Result<i32, i32>>,
        current: i32,
        opened: AtomicUsize,
        dropped: Arc<AtomicUsize>,
    }

    struct Dev(String, Arc<AtomicUsize>);
    impl Context for Dev {
        fn name(&self) -> &str {
            &self.0
        }
        fn vendor_id(&self) -> u32 {
            0
        }
        fn query_port(&self, _: u8) -> Result<crate::platform::PortAttr> {
            Err(Error::Rdma("unused".into()))
        }
        fn query_gid(&self, _: u8, _: u16) -> Result<crate::platform::Gid> {
            Err(Error::Rdma("unused".into()))
        }
        fn alloc_pd(&self) -> Result<Arc<dyn crate::platform::Pd>> {
            Err(Error::Rdma("unused".into()))
        }
        fn create_cq(&self, _: u32) -> Result<Arc<dyn crate::platform::Cq>> {
            Err(Error::Rdma("unused".into()))
        }
        fn supports_dmabuf(&self) -> bool {
            false
        }
        fn supports_mw(&self) -> bool {
            false
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    impl Drop for Dev {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct P(Arc<Script>);
    impl Platform for P {
        fn verbs(&self) -> Result<Arc<dyn Verbs>> {
            if self.0.no_verbs {
                return Err(Error::Rdma("libibverbs.so.1: not found".into()));
            }
            Ok(Arc::new(P(self.0.clone())))
        }
        fn cm(&self) -> Result<Arc<dyn crate::platform::Cm>> {
            Err(Error::Rdma("unused".into()))
        }
        fn topology(&self) -> Result<Arc<dyn crate::platform::Topology>> {
            Err(Error::Rdma("unused".into()))
        }
        fn gpu(&self) -> Result<Arc<dyn crate::platform::Gpu>> {
            match self.0.gpu {
                None => Err(Error::HipMissing("libamdhip64.so.6".into())),
                Some(_) => Ok(Arc::new(P(self.0.clone()))),
            }
        }
    }
    impl Verbs for P {
        fn device_names(&self) -> Result<Vec<String>> {
            Ok(self.0.devices.iter().map(|s| s.to_string()).collect())
        }
        fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
            if self.0.open_fails {
                return Err(Error::Rdma(format!("ibv_open_device({name}) failed")));
            }
            self.0.opened.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(Dev(name.to_owned(), self.0.dropped.clone())))
        }
    }
    impl crate::platform::Gpu for P {
        fn device_count(&self) -> std::result::Result<i32, i32> {
            self.0.gpu.unwrap()
        }
        fn current_device(&self) -> std::result::Result<i32, i32> {
            Ok(self.0.current)
        }
        fn pci_bus_id(&self, _: i32) -> crate::platform::HipResult<String> {
            Err(1)
        }
        fn pointer_kind(
            &self,
            _: usize,
        ) -> crate::platform::HipResult<crate::platform::PointerKind> {
            Err(1)
        }
        fn allocation_range(&self, _: usize) -> crate::platform::HipResult<(usize, usize)> {
            Err(1)
        }
        fn host_alloc(
            &self,
            _: usize,
        ) -> crate::platform::HipResult<Arc<dyn crate::platform::HostBuffer>> {
            Err(1)
        }
        fn copy_async(
            &self,
            _: usize,
            _: usize,
            _: usize,
        ) -> crate::platform::HipResult<Arc<dyn crate::platform::GpuEvent>> {
            Err(1)
        }
        fn synchronize(&self, _: i32) -> crate::platform::HipResult<()> {
            Err(1)
        }
        fn export_dmabuf(
            &self,
            _: usize,
            _: usize,
        ) -> Option<crate::platform::HipResult<(std::os::fd::OwnedFd, u64)>> {
            None
        }
    }

    fn config(gpu_device: i32, hint: &str) -> Config {
        Config {
            gpu_device,
            nic_hint: Config::parse_nic_hint(hint),
            ..Config::default()
        }
    }

    fn init(script: Script, cfg: Config) -> (Current, Result<()>, Arc<Script>) {
        let script = Arc::new(script);
        let current = Current::new();
        let r = current.init_with(Arc::new(P(script.clone())), cfg, Options::default());
        (current, r, script)
    }

    #[test]
    fn missing_libibverbs_is_an_rdma_error_and_publishes_nothing() {
        let (current, r, _) = init(
            Script {
                no_verbs: true,
                ..Script::default()
            },
            config(0, ""),
        );
        assert_eq!(r.unwrap_err().code(), crate::core::Code::Rdma);
        assert_eq!(current.instance().unwrap_err(), Error::NotInitialized);
    }

    #[test]
    fn no_gpu_without_a_hint_reports_the_hip_error() {
        let (_, r, _) = init(
            Script {
                devices: vec!["mlx0"],
                ..Script::default()
            },
            config(0, ""),
        );
        assert_eq!(r.unwrap_err().hip_error(), HIP_ERROR_NO_DEVICE);
        let (_, r, _) = init(
            Script {
                devices: vec!["mlx0"],
                gpu: Some(Err(35)),
                ..Script::default()
            },
            config(0, ""),
        );
        assert_eq!(r.unwrap_err().hip_error(), 35);
        let (_, r, _) = init(
            Script {
                devices: vec!["mlx0"],
                gpu: Some(Ok(0)),
                ..Script::default()
            },
            config(-1, ""),
        );
        assert_eq!(r.unwrap_err().hip_error(), HIP_ERROR_NO_DEVICE);
    }

    #[test]
    fn no_gpu_with_a_hint_opens_the_hinted_device() {
        let (current, r, _) = init(
            Script {
                devices: vec!["a0", "rxe0"],
                ..Script::default()
            },
            config(3, " rxe0 ,"),
        );
        r.unwrap();
        let inst = current.instance().unwrap();
        assert_eq!(inst.gpu, None);
        assert_eq!(inst.device.name(), "rxe0");
    }

    #[test]
    fn gpu_index_must_be_below_the_count_and_minus_one_is_current() {
        let s = || Script {
            devices: vec!["b1", "a1"],
            gpu: Some(Ok(2)),
            current: 1,
            ..Script::default()
        };
        let (_, r, _) = init(s(), config(2, ""));
        assert_eq!(r.unwrap_err().code(), crate::core::Code::InvalidValue);
        let (current, r, _) = init(s(), config(-1, ""));
        r.unwrap();
        let inst = current.instance().unwrap();
        assert_eq!(inst.gpu, Some(1));
        assert_eq!(inst.device.name(), "a1", "lowest name wins");
    }

    #[test]
    fn no_matching_nic_is_nic_not_found() {
        let (_, r, _) = init(
            Script {
                gpu: Some(Ok(1)),
                ..Script::default()
            },
            config(0, ""),
        );
        assert_eq!(r.unwrap_err().code(), crate::core::Code::NicNotFound);
        let (_, r, _) = init(
            Script {
                devices: vec!["x0"],
                gpu: Some(Ok(1)),
                ..Script::default()
            },
            config(0, "y0,z0"),
        );
        let e = r.unwrap_err();
        assert_eq!(e.code(), crate::core::Code::NicNotFound);
        assert!(e.to_string().contains("x0"), "{e}");
    }

    #[test]
    fn failed_open_publishes_nothing_and_a_retry_works() {
        let script = Arc::new(Script {
            devices: vec!["a0"],
            gpu: Some(Ok(1)),
            open_fails: true,
            ..Script::default()
        });
        let current = Current::new();
        let r = current.init_with(
            Arc::new(P(script.clone())),
            config(0, ""),
            Options::default(),
        );
        assert_eq!(r.unwrap_err().code(), crate::core::Code::Rdma);
        assert!(!current.is_initialized());
        let ok = Arc::new(Script {
            devices: vec!["a0"],
            gpu: Some(Ok(1)),
            ..Script::default()
        });
        current
            .init_with(Arc::new(P(ok)), config(0, ""), Options::default())
            .unwrap();
        assert!(current.is_initialized());
    }

    #[test]
    fn second_init_is_refused_and_shutdown_waits_for_no_one() {
        let s = || Script {
            devices: vec!["a0"],
            gpu: Some(Ok(1)),
            ..Script::default()
        };
        let (current, r, script) = init(s(), config(0, ""));
        r.unwrap();
        let again = current.init_with(
            Arc::new(P(Arc::new(s()))),
            config(0, ""),
            Options::default(),
        );
        assert_eq!(again, Err(Error::AlreadyInitialized));
        let held = current.instance().unwrap();
        current.shutdown();
        assert_eq!(current.instance().unwrap_err(), Error::NotInitialized);
        assert_eq!(
            script.dropped.load(Ordering::SeqCst),
            0,
            "a call in flight keeps its instance"
        );
        // A new init may run while the old instance is still held.
        current
            .init_with(
                Arc::new(P(Arc::new(s()))),
                config(0, ""),
                Options::default(),
            )
            .unwrap();
        drop(held);
        assert_eq!(
            script.dropped.load(Ordering::SeqCst),
            1,
            "the last holder drops it"
        );
        assert_eq!(script.opened.load(Ordering::SeqCst), 1);
        current.shutdown();
        current.shutdown();
    }

    #[test]
    fn config_values_are_checked() {
        assert!(Config::check_values(0, -1).is_ok());
        assert!(Config::check_values(1, 0).is_err());
        assert!(Config::check_values(0, -2).is_err());
        assert_eq!(Config::parse_nic_hint(",, ,"), Vec::<String>::new());
        assert_eq!(Config::parse_nic_hint("a,b"), vec!["a", "b"]);
    }

    #[test]
    fn racing_inits_publish_exactly_one_instance() {
        let current = Arc::new(Current::new());
        let wins: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let current = current.clone();
                    s.spawn(move || {
                        let script = Arc::new(Script {
                            devices: vec!["a0"],
                            gpu: Some(Ok(1)),
                            ..Script::default()
                        });
                        let r = current.init_with(
                            Arc::new(P(script)),
                            config(0, ""),
                            Options::default(),
                        );
                        usize::from(r.is_ok())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1);
    }
}
