//! `hipobj doctor`: what this host can do with the library, and why, found
//! by the code the library itself runs.
//!
//! The facts come through the platform traits (the runtimes, the devices,
//! the sysfs topology), the NIC and GID through the library's own choice
//! ([`nic::choose`], [`nic::gid_rank`]), and dma-buf export, registration
//! and memory windows are tried for real on small allocations. Each
//! verdict comes from a [`Client`] built as `hipObjInit` builds an instance
//! (so a NIC without an active port, a listener that cannot bind or a
//! missing library fails it exactly as it would fail the application), and
//! from how that client registers a buffer of the GPU's memory
//! ([`BufKind`]): straight to the GPU (dma-buf or peer memory), through
//! staging, or host memory only.
//!
//! Verdicts, worst last, and the exit status of `hipobj doctor`:
//! [`Verdict::GpuDirect`] 0, [`Verdict::Staged`] 1, [`Verdict::HostOnly`] 2,
//! [`Verdict::Unusable`] 3.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::client::{Client, GpuSelect};
use crate::core::buffers::BufKind;
use crate::core::nic::{self, GpuPlace};
use crate::core::Options;
use crate::platform::{
    Access, Gid, GidKind, Gpu, GpuRuntime, LinkLayer, Mtu, NicInfo, Platform, PortState, Topology,
    Verbs,
};

/// Bytes of GPU memory each probe allocates.
const PROBE_LEN: usize = 2 << 20;

/// A check's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Whether it worked.
    pub ok: bool,
    /// What was seen, or why it failed.
    pub detail: String,
}

impl Check {
    fn ok(detail: impl Into<String>) -> Check {
        Check {
            ok: true,
            detail: detail.into(),
        }
    }

    fn failed(detail: impl Into<String>) -> Check {
        Check {
            ok: false,
            detail: detail.into(),
        }
    }
}

/// A GPU runtime, loaded or not.
#[derive(Clone, Debug, Serialize)]
pub struct Runtime {
    /// `HIP` or `CUDA`.
    pub name: &'static str,
    /// Whether it loaded.
    pub loaded: bool,
    /// Its library and version, or why it did not load.
    pub detail: String,
    /// GPUs it sees.
    pub devices: i32,
}

/// One GPU.
#[derive(Clone, Debug, Serialize)]
pub struct GpuReport {
    /// The device index, as `gpuDevice` and `--device` take it.
    pub index: i32,
    /// The runtime that serves it.
    pub runtime: &'static str,
    /// Its PCI address.
    pub bus_id: Option<String>,
    /// Its NUMA node, from sysfs.
    pub numa_node: Option<i32>,
    /// The NIC the library chooses for it.
    pub nic: Option<NicForGpu>,
    /// `export_dmabuf` of a small allocation.
    pub dmabuf_export: Check,
    /// That dma-buf registered with the chosen NIC (`ibv_reg_dmabuf_mr`).
    pub dmabuf_registration: Check,
    /// The allocation registered with a plain `ibv_reg_mr` (peer memory).
    pub plain_registration: Check,
}

/// The NIC chosen for a GPU, and how near it is.
#[derive(Clone, Debug, Serialize)]
pub struct NicForGpu {
    /// The device.
    pub name: String,
    /// PCIe hops between the GPU and the NIC (`None`: not both in the PCI
    /// tree, as a software device is not).
    pub pcie_hops: Option<usize>,
    /// Whether they share a NUMA node.
    pub same_numa: Option<bool>,
    /// Why this one: the library's rule.
    pub why: String,
}

/// One GID table entry.
#[derive(Clone, Debug, Serialize)]
pub struct GidRow {
    /// Index.
    pub index: u16,
    /// The GID, as an IPv6 address.
    pub gid: String,
    /// `RoCE v2`, `RoCE v1`, `IB`, `unknown`.
    pub kind: &'static str,
    /// Its network device.
    pub netdev: Option<String>,
    /// Whether the library can use it (and how much it likes it: lower is
    /// better), by [`nic::gid_rank`].
    pub rank: Option<u8>,
}

/// One port.
#[derive(Clone, Debug, Serialize)]
pub struct PortReport {
    /// Port number.
    pub num: u8,
    /// Whether it is ACTIVE.
    pub active: bool,
    /// The active MTU: the largest path MTU a connection through it gets.
    pub mtu: Option<u32>,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: &'static str,
    /// The GID table.
    pub gids: Vec<GidRow>,
    /// The GID the library picks, and why.
    pub chosen_gid: Option<u16>,
}

/// One RDMA device.
#[derive(Clone, Debug, Serialize)]
pub struct NicReport {
    /// Its name.
    pub name: String,
    /// The PCI function behind it (`None` for software devices).
    pub pci: Option<String>,
    /// Its NUMA node.
    pub numa_node: Option<i32>,
    /// Opening it (`ibv_open_device`), with its vendor id.
    pub open: Check,
    /// Type-2 memory windows: advertised, and one allocated for real.
    pub memory_windows: Check,
    /// Whether `ibv_reg_dmabuf_mr` is there.
    pub dmabuf_mr: bool,
    /// Its ports.
    pub ports: Vec<PortReport>,
}

/// The RDMA side.
#[derive(Clone, Debug, Serialize)]
pub struct RdmaReport {
    /// libibverbs.
    pub libibverbs: Check,
    /// librdmacm.
    pub librdmacm: Check,
    /// The devices libibverbs lists, with what sysfs says of them.
    pub devices: Vec<NicReport>,
    /// Whether the RDMA CM can listen on the chosen NIC's address.
    pub listener: Check,
}

/// The process's limits against what the library needs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Limits {
    /// `RLIMIT_MEMLOCK` (soft), bytes; `None` for unlimited.
    pub memlock: Option<u64>,
    /// Whether the process may lock memory past it (`CAP_IPC_LOCK`).
    pub cap_ipc_lock: bool,
    /// `RLIMIT_NOFILE` (soft).
    pub nofile: Option<u64>,
    /// `HIPOBJ_MAX_TRANSFERS`.
    pub max_transfers: u32,
    /// Descriptors an instance took when the verdicts were made.
    pub descriptors_used: Option<u64>,
    /// What that means.
    pub note: String,
}

/// What the host can do for a GPU (or, without one, for host memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The NIC reads and writes the GPU's memory itself.
    GpuDirect,
    /// Transfers of GPU memory go through pinned host memory.
    Staged,
    /// RDMA works for host memory only (no GPU, or none usable).
    HostOnly,
    /// The library cannot initialize here.
    Unusable,
}

impl Verdict {
    /// The exit status of `hipobj doctor` for this verdict.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::GpuDirect => 0,
            Verdict::Staged => 1,
            Verdict::HostOnly => 2,
            Verdict::Unusable => 3,
        }
    }

    /// As the report prints it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::GpuDirect => "GPU-direct",
            Verdict::Staged => "staged",
            Verdict::HostOnly => "host memory only",
            Verdict::Unusable => "unusable",
        }
    }
}

/// One verdict.
#[derive(Clone, Debug, Serialize)]
pub struct VerdictEntry {
    /// The GPU; `None` for host memory on a host without one.
    pub gpu: Option<i32>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why.
    pub reason: String,
    /// The NIC the library initialized on.
    pub nic: Option<String>,
}

/// The whole diagnosis.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// This library's version.
    pub version: &'static str,
    /// The GPU runtimes.
    pub runtimes: Vec<Runtime>,
    /// The GPUs.
    pub gpus: Vec<GpuReport>,
    /// RDMA.
    pub rdma: RdmaReport,
    /// Limits.
    pub limits: Limits,
    /// One per GPU, or one for host memory.
    pub verdicts: Vec<VerdictEntry>,
}

impl Report {
    /// The worst verdict: what the exit status says.
    pub fn worst(&self) -> Verdict {
        self.verdicts
            .iter()
            .map(|v| v.verdict)
            .max()
            .unwrap_or(Verdict::Unusable)
    }
}

/// What to diagnose.
pub struct Inputs {
    /// The platform (the machine's, or fakes).
    pub platform: Arc<dyn Platform>,
    /// Settings, as `hipObjInit` reads them.
    pub options: Options,
    /// Only these RDMA devices (`--nic`); empty for any.
    pub nics: Vec<String>,
    /// Only this GPU (`--gpu`).
    pub gpu: Option<i32>,
    /// The text of `/proc/self/limits`.
    pub limits: Option<String>,
    /// The text of `/proc/self/status` (for `CapEff`).
    pub status: Option<String>,
    /// Counts this process's open descriptors (`/proc/self/fd`).
    pub count_fds: fn() -> Option<u64>,
}

impl Inputs {
    /// This machine, this process.
    pub fn system(options: Options, nics: Vec<String>, gpu: Option<i32>) -> Inputs {
        Inputs {
            platform: crate::platform::system(),
            options,
            nics,
            gpu,
            limits: std::fs::read_to_string("/proc/self/limits").ok(),
            status: std::fs::read_to_string("/proc/self/status").ok(),
            count_fds: || Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64),
        }
    }
}

/// Runs every check.
pub fn diagnose(inputs: &Inputs) -> Report {
    let platform = &*inputs.platform;
    let runtimes = runtimes(platform);
    let gpu = serving_gpu(platform, inputs.options.gpu_runtime);
    let topology = platform.topology().ok();
    let rdma = rdma(platform, topology.as_deref(), &inputs.nics);
    let verbs = platform.verbs().ok();
    let gpus = match &gpu {
        Some((name, gpu)) => gpus(
            name,
            gpu,
            inputs,
            topology.as_deref(),
            verbs.as_deref(),
            &rdma,
        ),
        None => Vec::new(),
    };
    let (mut verdicts, fds) = verdicts(inputs, &gpus);
    if let Some(n) = inputs.gpu.filter(|n| !gpus.iter().any(|g| g.index == *n)) {
        // `--gpu N` of a GPU no runtime sees: said first, not left to a
        // host-memory verdict that reads as if GPU N were fine.
        verdicts.insert(
            0,
            VerdictEntry {
                gpu: Some(n),
                verdict: Verdict::Unusable,
                reason: format!("GPU {n} does not exist ({})", runtime_summary(platform)),
                nic: None,
            },
        );
    }
    let limits = limits(inputs, fds);
    Report {
        version: env!("CARGO_PKG_VERSION"),
        runtimes,
        gpus,
        rdma,
        limits,
        verdicts,
    }
}

fn runtimes(platform: &dyn Platform) -> Vec<Runtime> {
    [("HIP", GpuRuntime::Hip), ("CUDA", GpuRuntime::Cuda)]
        .into_iter()
        .map(|(name, which)| match platform.gpu(which) {
            Ok(gpu) => {
                let detail = match gpu.runtime() {
                    Ok(info) => format!("{} {}", info.library, info.version_text()),
                    Err(code) => format!("loaded; its version call failed with {code}"),
                };
                let devices = gpu.device_count().unwrap_or(0);
                Runtime {
                    name,
                    loaded: true,
                    detail,
                    devices,
                }
            }
            Err(e) => Runtime {
                name,
                loaded: false,
                detail: match e {
                    crate::core::Error::HipMissing(text) => text,
                    other => other.to_string(),
                },
                devices: 0,
            },
        })
        .collect()
}

/// Each GPU runtime in a few words, for a message that says why no GPU was
/// found: `HIP: libamdhip64.so.5 5.2, 0 GPU(s); CUDA: none of libcuda.so.1
/// could be loaded`.
pub fn runtime_summary(platform: &dyn Platform) -> String {
    runtimes(platform)
        .iter()
        .map(|r| {
            if r.loaded {
                format!("{}: {}, {} GPU(s)", r.name, r.detail, r.devices)
            } else {
                format!("{}: {}", r.name, r.detail)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The runtime the library would serve the GPU with, if it sees one.
fn serving_gpu(
    platform: &dyn Platform,
    runtime: GpuRuntime,
) -> Option<(&'static str, Arc<dyn Gpu>)> {
    let gpu = platform.gpu(runtime).ok()?;
    if gpu.device_count().ok()? < 1 {
        return None;
    }
    let name = gpu.runtime().map(|r| r.name).unwrap_or("GPU");
    Some((name, gpu))
}

fn gid_text(gid: &Gid) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

fn kind_name(kind: GidKind) -> &'static str {
    match kind {
        GidKind::RoceV2 => "RoCE v2",
        GidKind::RoceV1 => "RoCE v1",
        GidKind::Ib => "IB",
        GidKind::Unknown => "unknown",
    }
}

fn mtu_bytes(mtu: Mtu) -> u32 {
    mtu.bytes()
}

fn rdma(platform: &dyn Platform, topology: Option<&dyn Topology>, hint: &[String]) -> RdmaReport {
    let verbs = platform.verbs();
    let libibverbs = match &verbs {
        Ok(_) => Check::ok("loaded"),
        Err(e) => Check::failed(e.to_string()),
    };
    let librdmacm = match platform.cm() {
        Ok(_) => Check::ok("loaded"),
        Err(e) => Check::failed(e.to_string()),
    };
    let present = verbs
        .as_ref()
        .ok()
        .and_then(|v| v.device_names().ok())
        .unwrap_or_default();
    let sysfs: Vec<NicInfo> = topology.and_then(|t| t.nics().ok()).unwrap_or_default();
    let devices = present
        .iter()
        .filter(|name| hint.is_empty() || hint.contains(name))
        .map(|name| {
            nic_report(
                verbs.as_ref().ok(),
                name,
                sysfs.iter().find(|n| &n.name == name),
            )
        })
        .collect();
    let listener = listener(platform, &present, &sysfs, hint, topology);
    RdmaReport {
        libibverbs,
        librdmacm,
        devices,
        listener,
    }
}

fn nic_report(verbs: Option<&Arc<dyn Verbs>>, name: &str, info: Option<&NicInfo>) -> NicReport {
    let ctx = verbs.map(|v| v.open(name));
    let open = match &ctx {
        Some(Ok(ctx)) => Check::ok(format!("vendor id {:#x}", ctx.vendor_id())),
        Some(Err(e)) => Check::failed(e.to_string()),
        None => Check::failed("libibverbs is not loaded"),
    };
    let (memory_windows, dmabuf_mr) = match &ctx {
        Some(Ok(ctx)) => {
            let windows = if !ctx.supports_mw() {
                Check::failed("the device does not advertise type-2 windows: each transfer registers its own range instead")
            } else {
                match ctx.alloc_pd().and_then(|pd| pd.alloc_mw()) {
                    Ok(_) => Check::ok("type 2, one allocated"),
                    Err(e) => Check::failed(format!("advertised, but allocating one failed: {e}")),
                }
            };
            (windows, ctx.supports_dmabuf())
        }
        _ => (Check::failed("not checked: the device did not open"), false),
    };
    let ports = info
        .map(|info| {
            info.ports
                .iter()
                .map(|p| {
                    let chosen = p
                        .gids
                        .iter()
                        .filter(|g| nic::gid_rank(g).is_some())
                        .min_by_key(|g| (nic::gid_rank(g), g.index))
                        .map(|g| g.index);
                    PortReport {
                        num: p.num,
                        active: p.state == PortState::Active,
                        // The device's own answer (ibv_query_port), as the
                        // library's connections get it; sysfs's where the
                        // device did not open (rxe has no active_mtu file).
                        mtu: match &ctx {
                            Some(Ok(ctx)) => ctx.query_port(p.num).ok().map(|a| a.active_mtu),
                            _ => None,
                        }
                        .or(p.active_mtu)
                        .map(mtu_bytes),
                        link_layer: match p.link_layer {
                            LinkLayer::Ethernet => "Ethernet",
                            LinkLayer::InfiniBand => "InfiniBand",
                        },
                        gids: p
                            .gids
                            .iter()
                            .map(|g| GidRow {
                                index: g.index,
                                gid: gid_text(&g.gid),
                                kind: kind_name(g.kind),
                                netdev: g.netdev.clone(),
                                rank: nic::gid_rank(g),
                            })
                            .collect(),
                        chosen_gid: chosen,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    NicReport {
        name: name.to_owned(),
        pci: info.and_then(|i| i.pci.clone()),
        numa_node: info.and_then(|i| i.numa_node),
        open,
        memory_windows,
        dmabuf_mr,
        ports,
    }
}

fn listener(
    platform: &dyn Platform,
    present: &[String],
    sysfs: &[NicInfo],
    hint: &[String],
    topology: Option<&dyn Topology>,
) -> Check {
    let Some(topology) = topology else {
        return Check::failed("no topology");
    };
    let choice = match nic::choose(present, sysfs, hint, None, topology) {
        Ok(choice) => choice,
        Err(e) => return Check::failed(format!("no NIC to listen on: {e}")),
    };
    let addr = SocketAddr::new(nic::ip_of(&choice.gid), 0);
    match platform.cm().and_then(|cm| cm.listen(addr)) {
        Ok(listener) => Check::ok(format!(
            "listening on {addr} ({}) works (port {} was free)",
            choice.name,
            listener.port()
        )),
        Err(e) => Check::failed(format!("cannot listen on {addr} ({}): {e}", choice.name)),
    }
}

fn gpus(
    runtime: &'static str,
    gpu: &Arc<dyn Gpu>,
    inputs: &Inputs,
    topology: Option<&dyn Topology>,
    verbs: Option<&dyn Verbs>,
    rdma: &RdmaReport,
) -> Vec<GpuReport> {
    let count = gpu.device_count().unwrap_or(0);
    let present: Vec<String> = rdma.devices.iter().map(|d| d.name.clone()).collect();
    let sysfs: Vec<NicInfo> = topology.and_then(|t| t.nics().ok()).unwrap_or_default();
    (0..count)
        .filter(|index| inputs.gpu.is_none_or(|only| only == *index))
        .map(|index| {
            let bus_id = gpu.pci_bus_id(index).ok();
            let numa_node = bus_id
                .as_deref()
                .and_then(|b| topology.and_then(|t| t.numa_node(b)));
            let nic = topology.and_then(|t| {
                nic_for_gpu(
                    &present,
                    &sysfs,
                    &inputs.nics,
                    bus_id.as_deref(),
                    numa_node,
                    t,
                )
            });
            let (dmabuf_export, dmabuf_registration, plain_registration) =
                probe_registrations(gpu, index, verbs, nic.as_ref().map(|n| n.name.as_str()));
            GpuReport {
                index,
                runtime,
                bus_id,
                numa_node,
                nic,
                dmabuf_export,
                dmabuf_registration,
                plain_registration,
            }
        })
        .collect()
}

fn nic_for_gpu(
    present: &[String],
    sysfs: &[NicInfo],
    hint: &[String],
    bus_id: Option<&str>,
    numa_node: Option<i32>,
    topology: &dyn Topology,
) -> Option<NicForGpu> {
    let place = bus_id.map(|bus_id| GpuPlace { bus_id });
    let choice = nic::choose(present, sysfs, hint, place, topology).ok()?;
    let nic = sysfs.iter().find(|n| n.name == choice.name);
    let gpu_path = bus_id.and_then(|b| topology.pci_path(b));
    let nic_path = nic
        .and_then(|n| n.pci.as_deref())
        .and_then(|p| topology.pci_path(p));
    let pcie_hops = match (&gpu_path, &nic_path) {
        (Some(g), Some(n)) => {
            let shared = g.iter().zip(n).take_while(|(a, b)| a == b).count();
            Some(g.len() + n.len() - 2 * shared)
        }
        _ => None,
    };
    let same_numa = match (numa_node, nic.and_then(|n| n.numa_node)) {
        (Some(a), Some(b)) => Some(a == b),
        _ => None,
    };
    let why = if !hint.is_empty() {
        format!(
            "the nearest active device among those named ({})",
            hint.join(",")
        )
    } else {
        match (pcie_hops, same_numa) {
            (Some(h), _) => format!("the active device nearest the GPU in the PCI tree ({h} hops)"),
            (None, Some(true)) => "an active device on the GPU's NUMA node".to_owned(),
            _ => "the first active device by name (no PCI or NUMA relation known)".to_owned(),
        }
    };
    Some(NicForGpu {
        name: choice.name,
        pcie_hops,
        same_numa,
        why,
    })
}

/// Tries dma-buf export, its registration on `nic`, and a plain
/// registration, each on a fresh allocation of device `index`.
fn probe_registrations(
    gpu: &Arc<dyn Gpu>,
    index: i32,
    verbs: Option<&dyn Verbs>,
    nic: Option<&str>,
) -> (Check, Check, Check) {
    let memory = match gpu.device_alloc(index, PROBE_LEN) {
        Ok(m) => m,
        Err(code) => {
            let why = format!("cannot allocate {PROBE_LEN} bytes on GPU {index}: error {code}");
            return (
                Check::failed(why.clone()),
                Check::failed(why.clone()),
                Check::failed(why),
            );
        }
    };
    let export = gpu.export_dmabuf(memory.addr(), PROBE_LEN);
    let dmabuf_export = match &export {
        None => Check::failed("the runtime has no dma-buf export"),
        Some(Err(code)) => Check::failed(format!("the export failed with error {code}")),
        Some(Ok((_, offset))) => {
            Check::ok(format!("a dma-buf of {PROBE_LEN} bytes at offset {offset}"))
        }
    };
    let pd = match (verbs, nic) {
        (Some(verbs), Some(nic)) => verbs.open(nic).and_then(|ctx| {
            let dmabuf = ctx.supports_dmabuf();
            ctx.alloc_pd().map(|pd| (pd, dmabuf, ctx))
        }),
        _ => {
            let why = "no NIC to register with";
            return (dmabuf_export, Check::failed(why), Check::failed(why));
        }
    };
    let (pd, dmabuf, _ctx) = match pd {
        Ok(parts) => parts,
        Err(e) => {
            let why = format!("the NIC did not open: {e}");
            return (
                dmabuf_export,
                Check::failed(why.clone()),
                Check::failed(why),
            );
        }
    };
    let access = Access::LOCAL_WRITE;
    let dmabuf_registration = match (&export, dmabuf) {
        (_, false) => Check::failed("the NIC's libibverbs has no ibv_reg_dmabuf_mr"),
        (Some(Ok((fd, offset))), true) => {
            match pd.reg_dmabuf_mr(fd, *offset, PROBE_LEN, memory.addr() as u64, access) {
                Ok(_) => Check::ok("ibv_reg_dmabuf_mr of the export works"),
                Err(e) => Check::failed(e.to_string()),
            }
        }
        _ => Check::failed("no dma-buf to register"),
    };
    let plain_registration = match pd.reg_mr(memory.addr(), PROBE_LEN, access) {
        Ok(_) => Check::ok("ibv_reg_mr of GPU memory works (peer memory)"),
        Err(e) => Check::failed(e.to_string()),
    };
    (dmabuf_export, dmabuf_registration, plain_registration)
}

/// One verdict per GPU (or one for host memory), each from a client built
/// as `hipObjInit` builds an instance; and the descriptors the first took.
fn verdicts(inputs: &Inputs, gpus: &[GpuReport]) -> (Vec<VerdictEntry>, Option<u64>) {
    let build = |gpu: GpuSelect| {
        let mut builder = Client::builder()
            .platform(Arc::clone(&inputs.platform))
            .gpu(gpu)
            .options(inputs.options.clone());
        for nic in &inputs.nics {
            builder = builder.nic(nic);
        }
        let before = (inputs.count_fds)();
        let client = builder.build();
        let after = (inputs.count_fds)();
        let used = before
            .zip(after)
            .filter(|_| client.is_ok())
            .map(|(b, a)| a.saturating_sub(b));
        (client, used)
    };
    let mut fds = None;
    if gpus.is_empty() {
        let (client, used) = build(GpuSelect::None);
        fds = used;
        let entry = match client {
            Ok(client) => VerdictEntry {
                gpu: None,
                verdict: Verdict::HostOnly,
                reason: "no GPU: RDMA of host memory works".to_owned(),
                nic: Some(client.nic().name.clone()),
            },
            Err(e) => VerdictEntry {
                gpu: None,
                verdict: Verdict::Unusable,
                reason: unusable(&e.to_string(), inputs),
                nic: None,
            },
        };
        return (vec![entry], fds);
    }
    let entries = gpus
        .iter()
        .map(|g| {
            let (client, used) = build(GpuSelect::Device(g.index));
            fds = fds.or(used);
            let client = match client {
                Ok(c) => c,
                Err(e) => {
                    // The GPU may be what failed: see whether host memory
                    // would still work.
                    let host = build(GpuSelect::None).0;
                    return match host {
                        Ok(host) => VerdictEntry {
                            gpu: Some(g.index),
                            verdict: Verdict::HostOnly,
                            reason: format!("with this GPU the library does not initialize ({e}); without it, it does"),
                            nic: Some(host.nic().name.clone()),
                        },
                        Err(_) => VerdictEntry {
                            gpu: Some(g.index),
                            verdict: Verdict::Unusable,
                            reason: unusable(&e.to_string(), inputs),
                            nic: None,
                        },
                    };
                }
            };
            let nic = Some(client.nic().name.clone());
            let (verdict, reason) = match client.device_buffer(PROBE_LEN) {
                Ok(buffer) => match buffer.kind() {
                    Some(BufKind::Device { dmabuf: true, .. }) => (
                        Verdict::GpuDirect,
                        "GPU memory is registered as a dma-buf: the NIC reads and writes it".to_owned(),
                    ),
                    Some(BufKind::Device { dmabuf: false, .. }) => (
                        Verdict::GpuDirect,
                        "GPU memory is registered directly (peer memory): the NIC reads and writes it".to_owned(),
                    ),
                    _ => (
                        Verdict::Staged,
                        format!(
                            "the NIC cannot reach this GPU's memory (dma-buf: {}; plain: {}): transfers go through pinned host memory",
                            detail(&g.dmabuf_registration, &g.dmabuf_export),
                            g.plain_registration.detail
                        ),
                    ),
                },
                Err(e) => (
                    Verdict::HostOnly,
                    format!("GPU memory cannot be registered at all: {e}"),
                ),
            };
            VerdictEntry {
                gpu: Some(g.index),
                verdict,
                reason,
                nic,
            }
        })
        .collect();
    (entries, fds)
}

/// Why the library cannot initialize, with what to do when no device is
/// there at all.
fn unusable(error: &str, inputs: &Inputs) -> String {
    let none = inputs
        .platform
        .verbs()
        .and_then(|v| v.device_names())
        .is_ok_and(|names| names.is_empty());
    if none {
        format!("{error}: libibverbs lists no RDMA device (is the NIC's driver loaded? Soft-RoCE: `rdma link add rxe0 type rxe netdev IFACE`)")
    } else {
        error.to_owned()
    }
}

fn detail(registration: &Check, export: &Check) -> String {
    if export.ok {
        registration.detail.clone()
    } else {
        export.detail.clone()
    }
}

/// The value of a `/proc/self/limits` row: `None` for unlimited.
fn limit_value(limits: &str, row: &str) -> Option<Option<u64>> {
    let line = limits.lines().find(|l| l.starts_with(row))?;
    let soft = line[row.len()..].split_whitespace().next()?;
    Some(if soft == "unlimited" {
        None
    } else {
        Some(soft.parse().ok()?)
    })
}

/// Whether `CapEff` of `/proc/self/status` has `CAP_IPC_LOCK` (bit 14).
fn has_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

fn limits(inputs: &Inputs, fds: Option<u64>) -> Limits {
    let text = inputs.limits.as_deref().unwrap_or("");
    let memlock = limit_value(text, "Max locked memory").flatten();
    let nofile = limit_value(text, "Max open files").flatten();
    let cap_ipc_lock = inputs.status.as_deref().is_some_and(has_ipc_lock);
    let mut notes = Vec::new();
    match (memlock, cap_ipc_lock) {
        (Some(bytes), true) => notes.push(format!(
            "memlock limit {}, but this process has CAP_IPC_LOCK, so it does not apply",
            human(bytes)
        )),
        (None, _) => notes.push("memory locking is unlimited".to_owned()),
        (Some(bytes), false) => notes.push(format!(
            "registrations pin memory: at most {} in all can be registered (raise `ulimit -l`)",
            human(bytes)
        )),
    }
    match (nofile, fds) {
        (Some(limit), Some(used)) => notes.push(format!(
            "an instance took {used} descriptors with HIPOBJ_MAX_TRANSFERS={} (a constant few, whatever the pool's size), of {limit} allowed",
            inputs.options.max_transfers
        )),
        (Some(limit), None) => notes.push(format!("{limit} descriptors allowed")),
        _ => {}
    }
    Limits {
        memlock,
        cap_ipc_lock,
        nofile,
        max_transfers: inputs.options.max_transfers,
        descriptors_used: fds,
        note: notes.join("; "),
    }
}

/// `1.5 GiB`, `64 KiB`, `10 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The report as text, for a terminal.
pub fn render(report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mark = |ok: bool| if ok { "ok  " } else { "FAIL" };
    let _ = writeln!(out, "hipobj {} doctor", report.version);
    let _ = writeln!(out, "\nGPU runtimes");
    for r in &report.runtimes {
        let _ = writeln!(
            out,
            "  {} {:<5} {}{}",
            mark(r.loaded),
            r.name,
            r.detail,
            if r.loaded {
                format!(", {} GPU(s)", r.devices)
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(out, "\nRDMA");
    let _ = writeln!(
        out,
        "  {} libibverbs {}",
        mark(report.rdma.libibverbs.ok),
        report.rdma.libibverbs.detail
    );
    let _ = writeln!(
        out,
        "  {} librdmacm  {}",
        mark(report.rdma.librdmacm.ok),
        report.rdma.librdmacm.detail
    );
    if report.rdma.devices.is_empty() {
        let _ = writeln!(out, "  no RDMA device");
    }
    for d in &report.rdma.devices {
        let _ = writeln!(
            out,
            "  {} {} ({}{}): {}",
            mark(d.open.ok),
            d.name,
            d.pci.as_deref().unwrap_or("no PCI function"),
            d.numa_node
                .map(|n| format!(", NUMA {n}"))
                .unwrap_or_default(),
            d.open.detail
        );
        let _ = writeln!(
            out,
            "       memory windows: {}{}",
            if d.memory_windows.ok { "" } else { "none: " },
            d.memory_windows.detail
        );
        let _ = writeln!(
            out,
            "       dma-buf registration (ibv_reg_dmabuf_mr): {}",
            if d.dmabuf_mr {
                "available"
            } else {
                "not available"
            }
        );
        for p in &d.ports {
            let _ = writeln!(
                out,
                "       port {}: {}, {}, MTU {}",
                p.num,
                if p.active { "ACTIVE" } else { "not active" },
                p.link_layer,
                p.mtu.map_or("unknown".to_owned(), |m| m.to_string())
            );
            for g in &p.gids {
                let chosen = p.chosen_gid == Some(g.index);
                let _ = writeln!(
                    out,
                    "         {} gid {} {} {}{}{}",
                    if chosen { "*" } else { " " },
                    g.index,
                    g.gid,
                    g.kind,
                    g.netdev
                        .as_deref()
                        .map(|n| format!(" {n}"))
                        .unwrap_or_default(),
                    match (chosen, g.rank) {
                        (true, _) =>
                            "  <- chosen: the best RoCE GID (v2 IPv4, v2 global, v2 link-local, v1)",
                        (false, None) => "  (not usable)",
                        _ => "",
                    }
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "  {} RDMA CM listener: {}",
        mark(report.rdma.listener.ok),
        report.rdma.listener.detail
    );
    if !report.gpus.is_empty() {
        let _ = writeln!(out, "\nGPUs");
    }
    for g in &report.gpus {
        let _ = writeln!(
            out,
            "  GPU {} ({}, {}{})",
            g.index,
            g.runtime,
            g.bus_id.as_deref().unwrap_or("bus id unknown"),
            g.numa_node
                .map(|n| format!(", NUMA {n}"))
                .unwrap_or_default()
        );
        match &g.nic {
            Some(n) => {
                let _ = writeln!(
                    out,
                    "       NIC {}: {}{}",
                    n.name,
                    n.why,
                    match n.same_numa {
                        Some(true) => ", same NUMA node",
                        Some(false) => ", another NUMA node",
                        None => "",
                    }
                );
            }
            None => {
                let _ = writeln!(out, "       no NIC");
            }
        }
        // A path not taken because another works is not a failure.
        let direct = g.dmabuf_registration.ok || g.plain_registration.ok;
        for (what, c) in [
            ("dma-buf export", &g.dmabuf_export),
            ("dma-buf registration", &g.dmabuf_registration),
            ("plain registration", &g.plain_registration),
        ] {
            let status = if !c.ok && direct { "--  " } else { mark(c.ok) };
            let _ = writeln!(out, "  {status} {what}: {}", c.detail);
        }
    }
    let l = &report.limits;
    let _ = writeln!(out, "\nLimits");
    let _ = writeln!(
        out,
        "  memlock {}, open files {}, HIPOBJ_MAX_TRANSFERS {}: {}",
        l.memlock.map_or("unlimited".to_owned(), human),
        l.nofile.map_or("unlimited".to_owned(), |n| n.to_string()),
        l.max_transfers,
        l.note
    );
    let _ = writeln!(out, "\nVerdict");
    for v in &report.verdicts {
        let _ = writeln!(
            out,
            "  {}: {} ({}{})",
            v.gpu
                .map_or("host memory".to_owned(), |g| format!("GPU {g}")),
            v.verdict.name(),
            v.reason,
            v.nic
                .as_deref()
                .map(|n| format!("; NIC {n}"))
                .unwrap_or_default()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_capabilities_are_read_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
            Max open files            1024                 524288               files\n\
            Max locked memory         8388608              8388608              bytes\n";
        assert_eq!(
            limit_value(limits, "Max locked memory"),
            Some(Some(8_388_608))
        );
        assert_eq!(limit_value(limits, "Max open files"), Some(Some(1024)));
        let unlimited =
            "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(limit_value(unlimited, "Max locked memory"), Some(None));
        assert_eq!(limit_value("", "Max locked memory"), None);
        assert!(has_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!has_ipc_lock("CapEff:\t0000000000000000\n"));
        assert!(!has_ipc_lock("CapEff:\tnot hex\n"));
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(10), "10 B");
        assert_eq!(human(64 << 10), "64.0 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }

    #[test]
    fn verdicts_order_from_best_to_worst_with_their_exit_codes() {
        let all = [
            Verdict::GpuDirect,
            Verdict::Staged,
            Verdict::HostOnly,
            Verdict::Unusable,
        ];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(all.map(Verdict::exit_code), [0, 1, 2, 3]);
    }
}
