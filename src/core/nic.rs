//! Choosing the NIC, its port and its GID.
//!
//! The NIC: among devices libibverbs lists that have an active port (and
//! that the hint names, if given), the one nearest the GPU in the PCI tree
//! (the deepest common upstream bridge), then one on the GPU's NUMA node,
//! then the lowest name. A GPU-less host takes the hint's order. The port is
//! the first active one; the GID the best by [`gid_rank`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Result};
use crate::platform::{Gid, GidEntry, GidKind, Mtu, NicInfo, PortState, Topology};

/// The NIC, port and GID init chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicChoice {
    /// Device name.
    pub name: String,
    /// Port number.
    pub port: u8,
    /// The port's active MTU, if known.
    pub mtu: Option<Mtu>,
    /// Index of the chosen GID.
    pub gid_index: u16,
    /// The GID as sysfs lists it (the device's own query is authoritative).
    pub gid: Gid,
}

/// What the NIC choice knows about the GPU.
pub struct GpuPlace<'a> {
    /// Its PCI bus id.
    pub bus_id: &'a str,
}

/// Chooses among `nics` those present in `present` (libibverbs' list).
pub fn choose(
    present: &[String],
    nics: &[NicInfo],
    hint: &[String],
    gpu: Option<GpuPlace<'_>>,
    topology: &dyn Topology,
) -> Result<NicChoice> {
    let mut candidates: Vec<&NicInfo> = nics
        .iter()
        .filter(|n| present.contains(&n.name))
        .filter(|n| hint.is_empty() || hint.contains(&n.name))
        .filter(|n| n.ports.iter().any(|p| p.state == PortState::Active))
        .collect();
    if candidates.is_empty() {
        return Err(not_found(present, hint));
    }
    match gpu {
        Some(gpu) => {
            let gpu_path = topology.pci_path(gpu.bus_id).unwrap_or_default();
            let gpu_numa = topology.numa_node(gpu.bus_id);
            candidates.sort_by_key(|n| {
                let path = n
                    .pci
                    .as_deref()
                    .and_then(|pci| topology.pci_path(pci))
                    .unwrap_or_default();
                let shared = common_prefix(&gpu_path, &path);
                let same_numa = gpu_numa.is_some() && n.numa_node == gpu_numa;
                (std::cmp::Reverse(shared), !same_numa, n.name.clone())
            });
        }
        None if !hint.is_empty() => {
            candidates.sort_by_key(|n| hint.iter().position(|h| *h == n.name));
        }
        None => candidates.sort_by(|a, b| a.name.cmp(&b.name)),
    }
    let nic = candidates[0];
    let port = nic
        .ports
        .iter()
        .find(|p| p.state == PortState::Active)
        .ok_or_else(|| Error::NicNotFound(format!("{} has no active port", nic.name)))?;
    let gid = port
        .gids
        .iter()
        .filter(|g| gid_rank(g).is_some())
        .min_by_key(|g| (gid_rank(g), g.index))
        .ok_or_else(|| {
            Error::Rdma(format!(
                "{} port {} has no usable RoCE GID",
                nic.name, port.num
            ))
        })?;
    Ok(NicChoice {
        name: nic.name.clone(),
        port: port.num,
        mtu: port.active_mtu,
        gid_index: gid.index,
        gid: gid.gid,
    })
}

/// The error for no usable NIC among `present` (and the `hint`).
pub fn not_found(present: &[String], hint: &[String]) -> Error {
    let listed = if present.is_empty() {
        "none".to_owned()
    } else {
        present.join(", ")
    };
    Error::NicNotFound(if hint.is_empty() {
        format!("no RDMA device with an active port (devices: {listed})")
    } else {
        format!(
            "no device named in the hint {:?} has an active port (devices: {listed})",
            hint.join(",")
        )
    })
}

/// How many leading elements two PCI paths share.
fn common_prefix(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Preference of a GID, best first: RoCE v2 IPv4-mapped, RoCE v2 global,
/// RoCE v2 link-local, RoCE v1 global, RoCE v1 link-local. Unset entries and
/// unknown kinds are not usable.
pub fn gid_rank(entry: &GidEntry) -> Option<u8> {
    if entry.gid == [0; 16] {
        return None;
    }
    let link_local = entry.gid[0] == 0xfe && entry.gid[1] & 0xc0 == 0x80;
    match (entry.kind, ipv4_of(&entry.gid).is_some(), link_local) {
        (GidKind::RoceV2, true, _) => Some(0),
        (GidKind::RoceV2, false, false) => Some(1),
        (GidKind::RoceV2, false, true) => Some(2),
        (GidKind::RoceV1, _, false) => Some(3),
        (GidKind::RoceV1, _, true) => Some(4),
        _ => None,
    }
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
pub fn ipv4_of(gid: &Gid) -> Option<Ipv4Addr> {
    (gid[..10] == [0; 10] && gid[10] == 0xff && gid[11] == 0xff)
        .then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// The IP address a GID stands for, for the RDMA CM.
pub fn ip_of(gid: &Gid) -> IpAddr {
    match ipv4_of(gid) {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(Ipv6Addr::from(*gid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{LinkLayer, PortInfo};

    fn mapped(a: u8, d: u8) -> Gid {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, a, 0, d]
    }

    fn entry(index: u16, gid: Gid, kind: GidKind) -> GidEntry {
        GidEntry {
            index,
            gid,
            kind,
            netdev: None,
        }
    }

    fn nic(name: &str, pci: Option<&str>, numa: Option<i32>, active: bool) -> NicInfo {
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[15] = 1;
        NicInfo {
            name: name.into(),
            pci: pci.map(Into::into),
            numa_node: numa,
            ports: vec![PortInfo {
                num: 1,
                state: if active {
                    PortState::Active
                } else {
                    PortState::NotActive
                },
                active_mtu: Some(Mtu::Mtu4096),
                link_layer: LinkLayer::Ethernet,
                gids: vec![
                    entry(0, ll, GidKind::RoceV2),
                    entry(1, mapped(1, 2), GidKind::RoceV2),
                ],
            }],
        }
    }

    struct Tree(Vec<(&'static str, Vec<&'static str>, Option<i32>)>);
    impl Topology for Tree {
        fn nics(&self) -> Result<Vec<NicInfo>> {
            Ok(Vec::new())
        }
        fn pci_path(&self, bus_id: &str) -> Option<Vec<String>> {
            self.0
                .iter()
                .find(|(b, _, _)| *b == bus_id)
                .map(|(_, p, _)| p.iter().map(|s| s.to_string()).collect())
        }
        fn numa_node(&self, bus_id: &str) -> Option<i32> {
            self.0
                .iter()
                .find(|(b, _, _)| *b == bus_id)
                .and_then(|(_, _, n)| *n)
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn nearest_in_the_pci_tree_wins_then_numa_then_name() {
        let tree = Tree(vec![
            (
                "0000:c1:00.0",
                vec!["0000:c0:01.0", "0000:c1:00.0"],
                Some(1),
            ),
            (
                "0000:c2:00.0",
                vec!["0000:c0:01.0", "0000:c2:00.0"],
                Some(1),
            ),
            (
                "0000:41:00.0",
                vec!["0000:40:01.0", "0000:41:00.0"],
                Some(0),
            ),
            (
                "0000:81:00.0",
                vec!["0000:80:01.0", "0000:81:00.0"],
                Some(1),
            ),
        ]);
        let nics = vec![
            nic("a_far", Some("0000:41:00.0"), Some(0), true),
            nic("z_near", Some("0000:c2:00.0"), Some(1), true),
            nic("m_numa", Some("0000:81:00.0"), Some(1), true),
        ];
        let present = names(&["a_far", "z_near", "m_numa"]);
        let gpu = || {
            Some(GpuPlace {
                bus_id: "0000:c1:00.0",
            })
        };
        assert_eq!(
            choose(&present, &nics, &[], gpu(), &tree).unwrap().name,
            "z_near"
        );
        let without_near = names(&["a_far", "m_numa"]);
        assert_eq!(
            choose(&without_near, &nics, &[], gpu(), &tree)
                .unwrap()
                .name,
            "m_numa"
        );
        assert_eq!(
            choose(&without_near, &nics, &names(&["a_far"]), gpu(), &tree)
                .unwrap()
                .name,
            "a_far"
        );
    }

    #[test]
    fn gpu_less_hosts_follow_the_hint_and_down_ports_are_skipped() {
        let tree = Tree(vec![]);
        let nics = vec![
            nic("rxe0", None, None, true),
            nic("rxe1", None, None, true),
            nic("down0", None, None, false),
        ];
        let present = names(&["rxe0", "rxe1", "down0"]);
        let c = choose(&present, &nics, &names(&["rxe1", "rxe0"]), None, &tree).unwrap();
        assert_eq!((c.name.as_str(), c.port, c.gid_index), ("rxe1", 1, 1));
        assert_eq!(
            choose(&present, &nics, &[], None, &tree).unwrap().name,
            "rxe0"
        );
        let e = choose(&present, &nics, &names(&["down0"]), None, &tree).unwrap_err();
        assert_eq!(e.code(), crate::error::Code::NicNotFound);
        let e = choose(&names(&[]), &nics, &[], None, &tree).unwrap_err();
        assert_eq!(e.code(), crate::error::Code::NicNotFound);
    }

    #[test]
    fn gid_preference_order() {
        let mut global = [0u8; 16];
        global[0] = 0x20;
        global[15] = 1;
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[15] = 1;
        assert_eq!(gid_rank(&entry(0, mapped(0, 1), GidKind::RoceV2)), Some(0));
        assert_eq!(gid_rank(&entry(0, global, GidKind::RoceV2)), Some(1));
        assert_eq!(gid_rank(&entry(0, ll, GidKind::RoceV2)), Some(2));
        assert_eq!(gid_rank(&entry(0, global, GidKind::RoceV1)), Some(3));
        assert_eq!(gid_rank(&entry(0, ll, GidKind::RoceV1)), Some(4));
        assert_eq!(gid_rank(&entry(0, global, GidKind::Unknown)), None);
        assert_eq!(gid_rank(&entry(0, [0; 16], GidKind::RoceV2)), None);
        assert_eq!(ip_of(&mapped(1, 2)), IpAddr::V4(Ipv4Addr::new(10, 1, 0, 2)));
    }
}
