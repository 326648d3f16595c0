//! The NIC choice of `core::nic` on the sysfs fixture trees
//! (`tests/fixtures/sysfs`, see `make.sh` there), read by the real sysfs
//! reader: the NIC, port and GID a GPU (or a hint) ends up with.

use std::path::Path;

use hipobj::core::nic::{choose, GpuPlace, NicChoice};
use hipobj::core::Code;
use hipobj::platform::topology::SysfsTopology;
use hipobj::platform::{Mtu, Topology};

fn fixture(case: &str) -> SysfsTopology {
    SysfsTopology::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/sysfs/{case}")),
    )
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Chooses among every NIC of `case` (all present), for the GPU at
/// `gpu_bus_id` if any, with `hint`.
fn choose_in(case: &str, hint: &[&str], gpu_bus_id: Option<&str>) -> NicChoice {
    let topology = fixture(case);
    let nics = topology.nics().unwrap();
    let present: Vec<String> = nics.iter().map(|n| n.name.clone()).collect();
    let gpu = gpu_bus_id.map(|bus_id| GpuPlace { bus_id });
    choose(&present, &nics, &names(hint), gpu, &topology).unwrap()
}

fn summary(choice: &NicChoice) -> (&str, u8, u16) {
    (choice.name.as_str(), choice.port, choice.gid_index)
}

#[test]
fn gpu_behind_a_switch_gets_the_nic_under_the_same_switch() {
    // ionic_0 shares the GPU's switch; bnxt_re0 sorts first by name but
    // hangs off another root port on the same NUMA node.
    let choice = choose_in("switch", &[], Some("0000:03:00.0"));
    assert_eq!(summary(&choice), ("ionic_0", 1, 3));
    assert_eq!(choice.mtu, Some(Mtu::Mtu4096));
    assert_eq!(choice.gid[10..], [0xff, 0xff, 10, 1, 0, 11]);
}

#[test]
fn each_socket_s_gpu_gets_the_nic_on_its_numa_node() {
    assert_eq!(
        summary(&choose_in("two-sockets", &[], Some("0000:81:00.0"))),
        ("bnxt_re1", 1, 5)
    );
    assert_eq!(
        summary(&choose_in("two-sockets", &[], Some("0000:01:00.0"))),
        ("bnxt_re0", 1, 3)
    );
}

#[test]
fn a_hint_overrides_the_nearest_nic() {
    assert_eq!(
        summary(&choose_in(
            "two-sockets",
            &["bnxt_re0"],
            Some("0000:81:00.0")
        )),
        ("bnxt_re0", 1, 3)
    );
}

#[test]
fn softroce_without_a_gpu_gets_the_ipv4_mapped_rocev2_gid() {
    let choice = choose_in("softroce", &["rxe0"], None);
    assert_eq!(summary(&choice), ("rxe0", 1, 1));
    assert_eq!(choice.mtu, Some(Mtu::Mtu1024));
    assert_eq!(choice.gid[10..], [0xff, 0xff, 192, 0, 2, 1]);
}

#[test]
fn a_down_first_port_leaves_the_second_active_one() {
    let choice = choose_in("port-down", &[], Some("0000:01:00.0"));
    assert_eq!(summary(&choice), ("mlx4_0", 2, 3));
    assert_eq!(choice.mtu, Some(Mtu::Mtu1024));
}

#[test]
fn a_gpu_unknown_to_sysfs_still_gets_a_nic() {
    assert_eq!(
        summary(&choose_in("switch", &[], Some("0000:ff:00.0"))),
        ("bnxt_re0", 1, 3)
    );
}

#[test]
fn nonexistent_root_lists_no_nics_so_none_is_chosen() {
    let topology = fixture("no-such-case");
    let nics = topology.nics().unwrap();
    assert!(nics.is_empty());
    assert_eq!(topology.pci_path("0000:03:00.0"), None);
    assert_eq!(topology.numa_node("0000:03:00.0"), None);
    let gpu = Some(GpuPlace {
        bus_id: "0000:03:00.0",
    });
    let err = choose(&names(&["rxe0"]), &nics, &[], gpu, &topology).unwrap_err();
    assert_eq!(err.code(), Code::NicNotFound);
}

#[test]
fn garbage_sysfs_is_read_without_panicking_and_yields_no_usable_gid() {
    let topology = fixture("garbage");
    let nics = topology.nics().unwrap();
    let listed: Vec<&str> = nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(listed, ["bad0", "bad1"]);
    // bad0's port 2 is active but has no GID table; nothing usable is
    // reported as an error, never a panic.
    let present = names(&listed);
    let err = choose(&present, &nics, &[], None, &topology).unwrap_err();
    assert_eq!(err.code(), Code::Rdma);
}
