//! A NIC and PCI topology given by the test, in place of the sysfs reader.
//!
//! The test adds NICs (as [`NicInfo`], what sysfs would show) and PCI
//! devices (GPUs, with their path from the root port and NUMA node); the
//! queries answer from that and nothing else. The GID helpers here are the
//! ones the fake fabric uses too, so a NIC built with [`roce_nic`] has
//! exactly the GIDs its fabric device answers `ibv_query_gid` with.
//!
//! Fault points ([`Faults::check`]): `topology_nics` (fails with
//! `Error::Rdma`), `topology_pci_path` and `topology_numa_node` (answer
//! `None`, as an unreadable sysfs file does).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Faults;
use hipobj::error::{Error, Result};
use hipobj::platform::{
    Gid, GidEntry, GidKind, LinkLayer, Mtu, NicInfo, PortInfo, PortState, Topology,
};

/// The IPv4-mapped GID of `ip`: `::ffff:a.b.c.d` (bytes 10 and 11 are
/// `0xff`, bytes 12 to 15 the address), as RoCE v2 lists an IPv4 address.
pub fn ipv4_gid(ip: Ipv4Addr) -> Gid {
    ip.to_ipv6_mapped().octets()
}

/// A deterministic link-local GID for the NIC with address `ip`: `fe80::`,
/// zeros, and the IPv4 address in the last 4 bytes. (A real one ends with
/// the EUI-64 of the MAC; only the `fe80::/64` prefix matters for GID
/// selection.)
pub fn link_local_gid(ip: Ipv4Addr) -> Gid {
    let mut gid = [0; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[12..].copy_from_slice(&ip.octets());
    gid
}

/// A software RoCE NIC (no PCI address, no NUMA node) named `name`, with
/// one ACTIVE Ethernet port (number 1) at `mtu` whose GID table is: index
/// 0, [`link_local_gid`] of `ip`; index 1, [`ipv4_gid`] of `ip`; both RoCE
/// v2 on the network device `eth-<name>`.
pub fn roce_nic(name: &str, ip: Ipv4Addr, mtu: Mtu) -> NicInfo {
    let netdev = Some(format!("eth-{name}"));
    NicInfo {
        name: name.to_owned(),
        pci: None,
        numa_node: None,
        ports: vec![PortInfo {
            num: 1,
            state: PortState::Active,
            active_mtu: Some(mtu),
            link_layer: LinkLayer::Ethernet,
            gids: vec![
                GidEntry {
                    index: 0,
                    gid: link_local_gid(ip),
                    kind: GidKind::RoceV2,
                    netdev: netdev.clone(),
                },
                GidEntry {
                    index: 1,
                    gid: ipv4_gid(ip),
                    kind: GidKind::RoceV2,
                    netdev,
                },
            ],
        }],
    }
}

/// The fake topology. Safe to share between threads; the test may add
/// devices at any time, and later queries see them.
pub struct FakeTopology {
    faults: Arc<Faults>,
    state: Mutex<TopologyState>,
}

#[derive(Default)]
struct TopologyState {
    /// In the order added, as sysfs lists them in directory order.
    nics: Vec<NicInfo>,
    /// By PCI address, exactly as given.
    pci: HashMap<String, PciDevice>,
}

struct PciDevice {
    path: Option<Vec<String>>,
    numa: Option<i32>,
}

impl FakeTopology {
    /// No NICs, no PCI devices.
    pub fn new(faults: Arc<Faults>) -> FakeTopology {
        FakeTopology {
            faults,
            state: Mutex::new(TopologyState::default()),
        }
    }

    /// One NIC, [`roce_nic`]`(nic_name, ip, Mtu::Mtu1024)`: what a
    /// Soft-RoCE lane looks like.
    pub fn single(faults: Arc<Faults>, nic_name: &str, ip: Ipv4Addr) -> FakeTopology {
        let topology = FakeTopology::new(faults);
        topology.add_nic(roce_nic(nic_name, ip, Mtu::Mtu1024), None);
        topology
    }

    /// Adds `nic`, replacing a NIC of the same name. If the NIC has a PCI
    /// address, that address becomes known with `pci_path` (root port
    /// first, the NIC's address last) and the NIC's NUMA node; a
    /// `pci_path` for a NIC without a PCI address is ignored.
    pub fn add_nic(&self, nic: NicInfo, pci_path: Option<Vec<String>>) {
        let mut state = self.state.lock();
        if let Some(bus_id) = &nic.pci {
            let device = PciDevice {
                path: pci_path,
                numa: nic.numa_node,
            };
            state.pci.insert(bus_id.clone(), device);
        }
        match state.nics.iter_mut().find(|known| known.name == nic.name) {
            Some(known) => *known = nic,
            None => state.nics.push(nic),
        }
    }

    /// Makes PCI device `bus_id` (a GPU, say) known, with its `path` from
    /// the root port (the device last) and its NUMA node; replaces what was
    /// known about it.
    pub fn add_pci_device(&self, bus_id: &str, path: Vec<String>, numa: Option<i32>) {
        let device = PciDevice {
            path: Some(path),
            numa,
        };
        self.state.lock().pci.insert(bus_id.to_owned(), device);
    }
}

impl Topology for FakeTopology {
    fn nics(&self) -> Result<Vec<NicInfo>> {
        if self.faults.check("topology_nics") {
            return Err(Error::Rdma("topology_nics: injected fault".to_owned()));
        }
        Ok(self.state.lock().nics.clone())
    }

    fn pci_path(&self, bus_id: &str) -> Option<Vec<String>> {
        if self.faults.check("topology_pci_path") {
            return None;
        }
        self.state.lock().pci.get(bus_id)?.path.clone()
    }

    fn numa_node(&self, bus_id: &str) -> Option<i32> {
        if self.faults.check("topology_numa_node") {
            return None;
        }
        self.state.lock().pci.get(bus_id)?.numa
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(192, 168, 7, 21);

    fn faults() -> Arc<Faults> {
        Arc::new(Faults::new())
    }

    #[test]
    fn ipv4_gid_is_the_ipv4_mapped_address() {
        let gid = ipv4_gid(IP);
        assert_eq!(&gid[..10], &[0; 10]);
        assert_eq!(&gid[10..12], &[0xff, 0xff]);
        assert_eq!(&gid[12..], &[192, 168, 7, 21]);
    }

    #[test]
    fn link_local_gid_is_fe80_then_zeros_then_the_address() {
        let gid = link_local_gid(IP);
        assert_eq!(&gid[..2], &[0xfe, 0x80]);
        assert_eq!(&gid[2..12], &[0; 10]);
        assert_eq!(&gid[12..], &[192, 168, 7, 21]);
    }

    #[test]
    fn single_nic_has_one_active_port_with_link_local_then_ipv4_gids() {
        let topology = FakeTopology::single(faults(), "rxe0", IP);
        let nics = topology.nics().unwrap();
        assert_eq!(nics.len(), 1);
        let nic = &nics[0];
        assert_eq!(nic.name, "rxe0");
        assert_eq!((nic.pci.as_deref(), nic.numa_node), (None, None));
        assert_eq!(nic.ports.len(), 1);
        let port = &nic.ports[0];
        assert_eq!(port.num, 1);
        assert_eq!(port.state, PortState::Active);
        assert_eq!(port.active_mtu, Some(Mtu::Mtu1024));
        assert_eq!(port.link_layer, LinkLayer::Ethernet);
        let gids: Vec<_> = port.gids.iter().map(|g| (g.index, g.gid, g.kind)).collect();
        assert_eq!(
            gids,
            vec![
                (0, link_local_gid(IP), GidKind::RoceV2),
                (1, ipv4_gid(IP), GidKind::RoceV2),
            ]
        );
    }

    #[test]
    fn pci_path_and_numa_node_are_known_for_added_devices_only() {
        let topology = FakeTopology::new(faults());
        let mut nic = roce_nic("mlx5_0", IP, Mtu::Mtu4096);
        nic.pci = Some("0000:c2:00.0".to_owned());
        nic.numa_node = Some(1);
        let nic_path = vec!["0000:c0:01.1".to_owned(), "0000:c2:00.0".to_owned()];
        topology.add_nic(nic, Some(nic_path.clone()));
        let gpu_path = vec!["0000:c0:01.1".to_owned(), "0000:c1:00.0".to_owned()];
        topology.add_pci_device("0000:c1:00.0", gpu_path.clone(), Some(1));

        assert_eq!(topology.pci_path("0000:c2:00.0"), Some(nic_path));
        assert_eq!(topology.numa_node("0000:c2:00.0"), Some(1));
        assert_eq!(topology.pci_path("0000:c1:00.0"), Some(gpu_path));
        assert_eq!(topology.numa_node("0000:c1:00.0"), Some(1));
        assert_eq!(topology.pci_path("0000:c3:00.0"), None);
        assert_eq!(topology.numa_node("0000:c3:00.0"), None);
        // The trait's bus ids are lowercase; the fake does not fold case.
        assert_eq!(topology.pci_path("0000:C1:00.0"), None);
    }

    #[test]
    fn a_nic_without_pci_address_has_no_pci_path() {
        let topology = FakeTopology::new(faults());
        topology.add_nic(roce_nic("rxe0", IP, Mtu::Mtu1024), Some(vec!["x".into()]));
        assert_eq!(topology.pci_path("x"), None);
    }

    #[test]
    fn adding_a_nic_of_the_same_name_replaces_it() {
        let topology = FakeTopology::single(faults(), "rxe0", IP);
        let mut down = roce_nic("rxe0", IP, Mtu::Mtu1024);
        down.ports[0].state = PortState::NotActive;
        topology.add_nic(down, None);
        topology.add_nic(roce_nic("rxe1", IP, Mtu::Mtu1024), None);
        let nics = topology.nics().unwrap();
        let states: Vec<_> = nics
            .iter()
            .map(|n| (n.name.as_str(), n.ports[0].state))
            .collect();
        assert_eq!(
            states,
            vec![("rxe0", PortState::NotActive), ("rxe1", PortState::Active)]
        );
    }

    #[test]
    fn injected_faults_fail_each_query() {
        let f = faults();
        let topology = FakeTopology::single(Arc::clone(&f), "rxe0", IP);
        topology.add_pci_device("0000:c1:00.0", vec!["0000:c1:00.0".into()], Some(0));
        f.fail_always("topology_nics");
        f.fail_always("topology_pci_path");
        f.fail_always("topology_numa_node");
        assert!(matches!(topology.nics(), Err(Error::Rdma(_))));
        assert_eq!(topology.pci_path("0000:c1:00.0"), None);
        assert_eq!(topology.numa_node("0000:c1:00.0"), None);
        assert_eq!(
            f.failed(),
            vec!["topology_nics", "topology_pci_path", "topology_numa_node"]
        );
        f.clear();
        assert_eq!(topology.nics().unwrap().len(), 1);
        assert_eq!(topology.numa_node("0000:c1:00.0"), Some(0));
    }
}
