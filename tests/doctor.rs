//! `hipobj doctor`'s diagnosis (`hipobj::doctor`) on the sysfs fixtures
//! (`tests/fixtures/sysfs`, read by the production topology reader) with
//! fake devices, GPUs and CM of the same names and addresses: the NIC it
//! picks for each GPU and why, the GID, the checks it makes for real on the
//! fakes, and each verdict with its exit status. The command on this
//! machine (no RDMA device) and in the Soft-RoCE VM are tested by
//! `tests/cli.rs` and `tests/e2e.rs`.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use hipobj::core::{Error, Options, Result};
use hipobj::doctor::{diagnose, render, Inputs, Report, Verdict};
use hipobj::platform::topology::SysfsTopology;
use hipobj::platform::{Cm, Gpu, GpuRuntime, Mtu, Platform, Topology, Verbs};
use hipobj_testing::fabric::{DeviceSpec, Fabric};
use hipobj_testing::gpu::{FakeGpu, FakeGpuDevice};
use hipobj_testing::{Counters, Faults};

/// A fake NIC named as in a fixture, at the address of the GID the
/// library picks there (the IPv4-mapped RoCE v2 one), at its index.
struct Nic {
    name: &'static str,
    ip: Ipv4Addr,
    gid_index: u16,
    dmabuf: bool,
    /// The port's MTU, as the fixture's sysfs says it.
    mtu: Mtu,
}

/// Fakes for the devices, the GPUs and the CM; the fixture for the rest.
struct FixturePlatform {
    verbs: Arc<dyn Verbs>,
    cm: Arc<dyn Cm>,
    gpu: Option<Arc<FakeGpu>>,
    topology: Arc<SysfsTopology>,
}

impl Platform for FixturePlatform {
    fn verbs(&self) -> Result<Arc<dyn Verbs>> {
        Ok(self.verbs.clone())
    }
    fn cm(&self) -> Result<Arc<dyn Cm>> {
        Ok(self.cm.clone())
    }
    fn gpu(&self, runtime: GpuRuntime) -> Result<Arc<dyn Gpu>> {
        match (&self.gpu, runtime) {
            (Some(gpu), GpuRuntime::Auto | GpuRuntime::Hip) => Ok(gpu.clone()),
            _ => Err(Error::HipMissing("not installed (fake)".to_owned())),
        }
    }
    fn topology(&self) -> Result<Arc<dyn Topology>> {
        Ok(self.topology.clone())
    }
}

fn platform(case: &str, nics: &[Nic], gpus: &[&str]) -> Arc<dyn Platform> {
    let faults = Arc::new(Faults::new());
    let counters = Arc::new(Counters::new());
    let fabric = Fabric::new(faults.clone(), counters.clone());
    for nic in nics {
        let spec = DeviceSpec {
            ipv4_gid_index: nic.gid_index,
            supports_dmabuf: nic.dmabuf,
            port_mtu: nic.mtu,
            ..DeviceSpec::new(nic.name, nic.ip)
        };
        fabric.add_device(spec).unwrap();
    }
    let names: Vec<&str> = nics.iter().map(|n| n.name).collect();
    let gpu = (!gpus.is_empty()).then(|| {
        let devices = gpus
            .iter()
            .map(|id| FakeGpuDevice {
                pci_bus_id: (*id).to_owned(),
            })
            .collect();
        let gpu = Arc::new(FakeGpu::new(devices, faults, counters));
        fabric.set_device_memory(gpu.clone());
        gpu
    });
    let root: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests/fixtures/sysfs", case]
        .iter()
        .collect();
    Arc::new(FixturePlatform {
        verbs: fabric.verbs(&names),
        cm: fabric.cm(&names),
        gpu,
        topology: Arc::new(SysfsTopology::new(root)),
    })
}

fn run(platform: Arc<dyn Platform>, gpu: Option<i32>) -> Report {
    let report = diagnose(&Inputs {
        platform,
        options: Options::default(),
        nics: Vec::new(),
        gpu,
        limits: Some("Max locked memory         65536                65536                bytes\nMax open files            1024                 1024                 files\n".to_owned()),
        status: Some("CapEff:\t0000000000000000\n".to_owned()),
        count_fds: || None,
    });
    // Every report renders, and as JSON.
    let text = render(&report);
    assert!(text.contains("Verdict"), "{text}");
    serde_json::to_string(&report).expect("JSON");
    println!("{text}");
    report
}

/// ionic_0 under the GPU's PCIe switch; bnxt_re0 behind another root port.
fn switch(dmabuf: bool) -> Arc<dyn Platform> {
    platform(
        "switch",
        &[
            Nic {
                name: "ionic_0",
                ip: Ipv4Addr::new(10, 1, 0, 11),
                gid_index: 3,
                dmabuf,
                mtu: Mtu::Mtu4096,
            },
            Nic {
                name: "bnxt_re0",
                ip: Ipv4Addr::new(10, 2, 0, 11),
                gid_index: 3,
                dmabuf,
                mtu: Mtu::Mtu4096,
            },
        ],
        &["0000:03:00.0"],
    )
}

#[test]
fn a_gpu_behind_a_switch_gets_its_nic_and_is_gpu_direct_through_dmabuf() {
    let report = run(switch(true), None);
    assert_eq!(report.gpus.len(), 1);
    let gpu = &report.gpus[0];
    let nic = gpu.nic.as_ref().expect("a NIC");
    assert_eq!(nic.name, "ionic_0");
    assert_eq!(nic.pcie_hops, Some(4), "up two bridges, down two");
    assert!(
        nic.why.contains("nearest the GPU in the PCI tree"),
        "{}",
        nic.why
    );
    assert!(
        gpu.dmabuf_export.ok && gpu.dmabuf_registration.ok,
        "{gpu:?}"
    );
    assert!(
        !gpu.plain_registration.ok,
        "the fake NIC has no peer memory"
    );
    let ionic = report
        .rdma
        .devices
        .iter()
        .find(|d| d.name == "ionic_0")
        .unwrap();
    assert_eq!(ionic.pci.as_deref(), Some("0000:04:00.0"));
    assert!(ionic.memory_windows.ok && ionic.dmabuf_mr);
    let port = &ionic.ports[0];
    assert_eq!((port.active, port.mtu), (true, Some(4096)));
    assert_eq!(port.chosen_gid, Some(3), "the IPv4-mapped RoCE v2 GID");
    assert_eq!(
        port.gids.iter().find(|g| g.index == 3).unwrap().gid,
        "::ffff:10.1.0.11"
    );
    assert!(report.rdma.listener.ok, "{:?}", report.rdma.listener);
    assert_eq!(report.verdicts.len(), 1);
    let v = &report.verdicts[0];
    assert_eq!((v.gpu, v.verdict), (Some(0), Verdict::GpuDirect));
    assert!(v.reason.contains("dma-buf"), "{}", v.reason);
    assert_eq!(v.nic.as_deref(), Some("ionic_0"));
    assert_eq!(report.worst().exit_code(), 0);
    assert!(
        report.limits.note.contains("64.0 KiB"),
        "{}",
        report.limits.note
    );
}

#[test]
fn a_nic_that_cannot_reach_gpu_memory_makes_the_gpu_staged() {
    let report = run(switch(false), None);
    let gpu = &report.gpus[0];
    assert!(gpu.dmabuf_export.ok, "the GPU exports");
    assert!(!gpu.dmabuf_registration.ok && !gpu.plain_registration.ok);
    let v = &report.verdicts[0];
    assert_eq!(v.verdict, Verdict::Staged);
    assert!(v.reason.contains("pinned host memory"), "{}", v.reason);
    assert_eq!(report.worst().exit_code(), 1);
}

fn two_sockets() -> Arc<dyn Platform> {
    platform(
        "two-sockets",
        &[
            Nic {
                name: "bnxt_re0",
                ip: Ipv4Addr::new(192, 168, 10, 1),
                gid_index: 3,
                dmabuf: true,
                mtu: Mtu::Mtu4096,
            },
            Nic {
                name: "bnxt_re1",
                ip: Ipv4Addr::new(192, 168, 11, 1),
                gid_index: 5,
                dmabuf: true,
                mtu: Mtu::Mtu4096,
            },
        ],
        &["0000:01:00.0", "0000:81:00.0"],
    )
}

#[test]
fn each_socket_s_gpu_gets_the_nic_of_its_numa_node() {
    let report = run(two_sockets(), None);
    let picks: Vec<(i32, &str, Option<bool>)> = report
        .gpus
        .iter()
        .map(|g| {
            let nic = g.nic.as_ref().unwrap();
            (g.index, nic.name.as_str(), nic.same_numa)
        })
        .collect();
    assert_eq!(
        picks,
        [(0, "bnxt_re0", Some(true)), (1, "bnxt_re1", Some(true))]
    );
    assert_eq!(report.gpus[1].numa_node, Some(1));
    let verdicts: Vec<_> = report
        .verdicts
        .iter()
        .map(|v| (v.gpu, v.verdict, v.nic.clone()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (Some(0), Verdict::GpuDirect, Some("bnxt_re0".to_owned())),
            (Some(1), Verdict::GpuDirect, Some("bnxt_re1".to_owned()))
        ]
    );
    let only = run(two_sockets(), Some(1));
    assert_eq!(only.gpus.len(), 1);
    assert_eq!(
        (only.verdicts[0].gpu, only.verdicts[0].verdict),
        (Some(1), Verdict::GpuDirect)
    );
}

#[test]
fn soft_roce_without_a_gpu_is_host_memory_only() {
    let report = run(
        platform(
            "softroce",
            &[Nic {
                name: "rxe0",
                ip: Ipv4Addr::new(192, 0, 2, 1),
                gid_index: 1,
                dmabuf: false,
                mtu: Mtu::Mtu1024,
            }],
            &[],
        ),
        None,
    );
    assert!(report.gpus.is_empty());
    let rxe = &report.rdma.devices[0];
    assert_eq!(rxe.pci, None, "a software device");
    assert_eq!(
        (rxe.ports[0].mtu, rxe.ports[0].chosen_gid),
        (Some(1024), Some(1))
    );
    assert!(report.runtimes.iter().all(|r| !r.loaded));
    let v = &report.verdicts[0];
    assert_eq!((v.gpu, v.verdict), (None, Verdict::HostOnly));
    assert_eq!(v.nic.as_deref(), Some("rxe0"));
    assert_eq!(report.worst().exit_code(), 2);
}

#[test]
fn a_host_without_an_rdma_device_is_unusable_and_says_what_to_do() {
    let report = run(platform("softroce", &[], &["0000:03:00.0"]), None);
    assert!(report.rdma.devices.is_empty());
    assert!(!report.rdma.listener.ok);
    let v = &report.verdicts[0];
    assert_eq!((v.gpu, v.verdict), (Some(0), Verdict::Unusable));
    assert!(v.reason.contains("lists no RDMA device"), "{}", v.reason);
    assert!(
        !report.gpus[0].dmabuf_registration.ok,
        "no NIC to register with"
    );
    assert_eq!(report.worst().exit_code(), 3);
}

#[test]
fn a_gpu_asked_for_that_does_not_exist_is_said_to_be_missing() {
    let rxe = Nic {
        name: "rxe0",
        ip: Ipv4Addr::new(192, 0, 2, 1),
        gid_index: 1,
        dmabuf: false,
        mtu: Mtu::Mtu1024,
    };
    let report = run(platform("softroce", &[rxe], &[]), Some(0));
    let v = &report.verdicts[0];
    assert_eq!((v.gpu, v.verdict), (Some(0), Verdict::Unusable));
    assert!(v.reason.contains("GPU 0 does not exist"), "{}", v.reason);
    assert!(
        v.reason.contains("HIP: ") && v.reason.contains("CUDA: "),
        "{}",
        v.reason
    );
    assert_eq!(report.worst().exit_code(), 3);
}

#[test]
fn a_memlock_limit_that_cap_ipc_lock_lifts_is_said_not_to_apply() {
    let report = diagnose(&Inputs {
        platform: switch(true),
        options: Options::default(),
        nics: Vec::new(),
        gpu: None,
        limits: Some(
            "Max locked memory         8388608              8388608              bytes\n"
                .to_owned(),
        ),
        // CapEff with bit 14 (CAP_IPC_LOCK).
        status: Some("CapEff:\t0000000000004000\n".to_owned()),
        count_fds: || None,
    });
    let text = render(&report);
    assert!(
        text.contains(
            "memlock limit 8.0 MiB, but this process has CAP_IPC_LOCK, so it does not apply"
        ),
        "{text}"
    );
    assert!(!text.contains("not limited"), "{text}");
}
