//! The NIC and PCI topology, read from sysfs below a configurable root.
//!
//! Production reads below `/`; tests point [`SysfsTopology::new`] at a
//! fixture tree (`tests/fixtures/sysfs/<case>`, made by the `make.sh` there)
//! laid out as Linux lays out sysfs, so the fixtures exercise this parser.
//! Paths below the root:
//!
//! - `sys/class/infiniband/<name>`: one entry (a symlink into `sys/devices`)
//!   per RDMA device. Its `device` link leads to the PCI function behind
//!   it; a Soft-RoCE device has none on current kernels, and on older ones
//!   its netdev's parent, which need not be a PCI function.
//! - `<name>/ports/<n>/`: `state`, `active_mtu`, `link_layer`, `gids/<i>`
//!   (all zeros for an unused entry), `gid_attrs/types/<i>` and
//!   `gid_attrs/ndevs/<i>` (reading these fails for an unused entry).
//! - `sys/bus/pci/devices/<bus_id>`: a symlink to the function's directory
//!   `sys/devices/pci<domain>:<bus>/<root port>/.../<bus_id>`, whose path
//!   names every bridge between the root port and the function; its
//!   `numa_node` (also read through `<name>/device`).
//!
//! A missing, unreadable or malformed file never fails a query: the entry is
//! skipped, or the field is `None` or [`GidKind::Unknown`]. Only a
//! `sys/class/infiniband` that exists but cannot be listed is an error.

#![forbid(unsafe_code)]

pub mod parse;

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::platform::{GidEntry, GidKind, LinkLayer, NicInfo, PortInfo, PortState, Topology};

/// sysfs attributes are at most a page; anything longer is not one.
const MAX_ATTRIBUTE: u64 = 4096;

/// The sysfs reader. It keeps nothing between queries: each one reads the
/// tree afresh, so hot-plugged devices and port state changes are seen.
#[derive(Clone, Debug)]
pub struct SysfsTopology {
    root: PathBuf,
}

impl SysfsTopology {
    /// Reads the tree below `root` (`root/sys/class/infiniband`, ...).
    pub fn new(root: impl Into<PathBuf>) -> SysfsTopology {
        SysfsTopology { root: root.into() }
    }

    /// Reads the machine's own sysfs.
    pub fn system() -> SysfsTopology {
        SysfsTopology::new("/")
    }

    /// The directory the `sys/...` paths are read below.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The PCI addresses among the components of `resolved` (a canonical
    /// path) below the root, outermost first.
    fn pci_chain(&self, resolved: &Path) -> Vec<String> {
        let root = fs::canonicalize(&self.root).ok();
        let below = root
            .and_then(|root| resolved.strip_prefix(root).ok())
            .unwrap_or(resolved);
        below
            .components()
            .filter_map(|component| match component {
                Component::Normal(name) => parse::pci_address(name.to_str()?),
                _ => None,
            })
            .collect()
    }

    /// `sys/bus/pci/devices/<bus_id>`, with `bus_id` lowercased; `None` if
    /// `bus_id` is not a PCI address (so it cannot name another path).
    fn pci_device(&self, bus_id: &str) -> Option<(String, PathBuf)> {
        let bus_id = parse::pci_address(bus_id.trim())?;
        let path = self.root.join("sys/bus/pci/devices").join(&bus_id);
        Some((bus_id, path))
    }
}

impl Topology for SysfsTopology {
    /// Every device under `sys/class/infiniband`, by name. No such
    /// directory (no RDMA driver loaded, or a root that does not exist) is
    /// no device.
    fn nics(&self) -> Result<Vec<NicInfo>> {
        let class = self.root.join("sys/class/infiniband");
        let entries = match fs::read_dir(&class) {
            Ok(entries) => entries,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(Error::Rdma(format!("listing {}: {e}", class.display()))),
        };
        let mut nics: Vec<NicInfo> = entries
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                let dir = entry.path();
                dir.is_dir().then(|| nic(name, &dir))
            })
            .collect();
        nics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nics)
    }

    fn pci_path(&self, bus_id: &str) -> Option<Vec<String>> {
        let (bus_id, link) = self.pci_device(bus_id)?;
        let chain = self.pci_chain(&fs::canonicalize(link).ok()?);
        (chain.last() == Some(&bus_id)).then_some(chain)
    }

    fn numa_node(&self, bus_id: &str) -> Option<i32> {
        let (_, link) = self.pci_device(bus_id)?;
        parse::numa_node(&read(&link.join("numa_node"))?)
    }
}

/// The RDMA device `name`, whose directory is `dir`.
fn nic(name: String, dir: &Path) -> NicInfo {
    let device = dir.join("device");
    let pci = fs::canonicalize(&device)
        .ok()
        .and_then(|target| parse::pci_address(target.file_name()?.to_str()?));
    NicInfo {
        name,
        pci,
        numa_node: read(&device.join("numa_node")).and_then(|t| parse::numa_node(&t)),
        ports: ports(&dir.join("ports")),
    }
}

/// The ports under `dir` (`<name>/ports`), by number.
fn ports(dir: &Path) -> Vec<PortInfo> {
    numbered::<u8>(dir)
        .into_iter()
        .map(|(num, path)| port(num, &path))
        .collect()
}

/// Port `num`, whose directory is `dir`. A port whose `state` cannot be read
/// is not active. An unreadable or `Unknown` link layer is taken as
/// Ethernet, so that the port's GID types decide whether it is usable.
fn port(num: u8, dir: &Path) -> PortInfo {
    let link_layer = read(&dir.join("link_layer"))
        .and_then(|t| parse::link_layer(&t))
        .unwrap_or(LinkLayer::Ethernet);
    PortInfo {
        num,
        state: read(&dir.join("state")).map_or(PortState::NotActive, |t| parse::port_state(&t)),
        active_mtu: read(&dir.join("active_mtu")).and_then(|t| parse::mtu(&t)),
        link_layer,
        gids: gids(dir, link_layer),
    }
}

/// The used entries of the GID table of the port whose directory is `dir`,
/// by index. On an InfiniBand port every entry is [`GidKind::Ib`] (the
/// kernel labels them `IB/RoCE v1` there too).
fn gids(dir: &Path, link_layer: LinkLayer) -> Vec<GidEntry> {
    let attrs = dir.join("gid_attrs");
    numbered::<u16>(&dir.join("gids"))
        .into_iter()
        .filter_map(|(index, path)| {
            let gid = parse::gid(&read(&path)?)?;
            if gid == [0; 16] {
                return None;
            }
            let name = index.to_string();
            let kind = match link_layer {
                LinkLayer::InfiniBand => GidKind::Ib,
                LinkLayer::Ethernet => read(&attrs.join("types").join(&name))
                    .map_or(GidKind::Unknown, |t| parse::gid_kind(&t)),
            };
            let netdev = read(&attrs.join("ndevs").join(&name)).filter(|t| !t.is_empty());
            Some(GidEntry {
                index,
                gid,
                kind,
                netdev,
            })
        })
        .collect()
}

/// The entries of `dir` named by a number that fits `T`, by number; none if
/// `dir` cannot be listed.
fn numbered<T: std::str::FromStr + Ord>(dir: &Path) -> Vec<(T, PathBuf)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut numbered: Vec<(T, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let number = parse::number(entry.file_name().to_str()?)?;
            Some((number, entry.path()))
        })
        .collect();
    numbered.sort_by(|a, b| a.0.cmp(&b.0));
    numbered
}

/// The trimmed text of the attribute at `path`, or `None` if it cannot be
/// read, is longer than an attribute can be, or is not UTF-8.
fn read(path: &Path) -> Option<String> {
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(MAX_ATTRIBUTE + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() > usize::try_from(MAX_ATTRIBUTE).ok()? {
        return None;
    }
    String::from_utf8(bytes)
        .ok()
        .map(|text| text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{Gid, Mtu};

    fn fixture(case: &str) -> SysfsTopology {
        SysfsTopology::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/sysfs/{case}")),
        )
    }

    fn gid(text: &str) -> Gid {
        parse::gid(text).unwrap()
    }

    fn entry(index: u16, text: &str, kind: GidKind, netdev: Option<&str>) -> GidEntry {
        GidEntry {
            index,
            gid: gid(text),
            kind,
            netdev: netdev.map(str::to_owned),
        }
    }

    /// `text` at `index` as RoCE v1 and at `index + 1` as RoCE v2.
    fn roce(index: u16, text: &str, netdev: &str) -> [GidEntry; 2] {
        [
            entry(index, text, GidKind::RoceV1, Some(netdev)),
            entry(index + 1, text, GidKind::RoceV2, Some(netdev)),
        ]
    }

    fn active(num: u8, mtu: Mtu, gids: Vec<GidEntry>) -> PortInfo {
        PortInfo {
            num,
            state: PortState::Active,
            active_mtu: Some(mtu),
            link_layer: LinkLayer::Ethernet,
            gids,
        }
    }

    fn nic(name: &str, pci: Option<&str>, numa_node: Option<i32>, ports: Vec<PortInfo>) -> NicInfo {
        NicInfo {
            name: name.to_owned(),
            pci: pci.map(str::to_owned),
            numa_node,
            ports,
        }
    }

    fn path(addresses: &[&str]) -> Option<Vec<String>> {
        Some(addresses.iter().map(|a| a.to_string()).collect())
    }

    /// A NIC at `pci` on `numa` with one ACTIVE 4096-byte Ethernet port
    /// listing each of `addresses` as a RoCE v1 and v2 pair on `netdev`.
    fn roce_nic(name: &str, pci: &str, numa: i32, netdev: &str, addresses: &[&str]) -> NicInfo {
        let gids = addresses
            .iter()
            .zip((0..).step_by(2))
            .flat_map(|(address, index)| roce(index, address, netdev))
            .collect();
        let port = active(1, Mtu::Mtu4096, gids);
        nic(name, Some(pci), Some(numa), vec![port])
    }

    #[test]
    fn switch_fixture_lists_both_nics_with_their_v1_v2_gid_pairs() {
        let expected = vec![
            roce_nic(
                "bnxt_re0",
                "0000:41:00.0",
                0,
                "enp65s0f0np0",
                &["fe80::5e6f:69ff:fe80:1a20", "::ffff:10.2.0.11"],
            ),
            roce_nic(
                "ionic_0",
                "0000:04:00.0",
                0,
                "enp4s0np0",
                &["fe80::ac0:ebff:fe21:4c10", "::ffff:10.1.0.11"],
            ),
        ];
        assert_eq!(fixture("switch").nics().unwrap(), expected);
    }

    #[test]
    fn pci_path_runs_from_the_root_port_down_to_the_device() {
        let topology = fixture("switch");
        let gpu = [
            "0000:00:01.1",
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0",
        ];
        assert_eq!(topology.pci_path("0000:03:00.0"), path(&gpu));
        assert_eq!(
            topology.pci_path("0000:04:00.0"),
            path(&[
                "0000:00:01.1",
                "0000:01:00.0",
                "0000:02:01.0",
                "0000:04:00.0"
            ])
        );
        assert_eq!(
            topology.pci_path("0000:41:00.0"),
            path(&["0000:40:01.1", "0000:41:00.0"])
        );
        assert_eq!(topology.pci_path("0000:00:01.1"), path(&["0000:00:01.1"]));
        assert_eq!(topology.pci_path(" 0000:03:00.0\n"), path(&gpu));
        assert_eq!(topology.numa_node("0000:03:00.0"), Some(0));
    }

    #[test]
    fn bus_ids_are_matched_lowercased() {
        let topology = fixture("two-sockets");
        assert_eq!(
            topology.pci_path("0000:80:03.1".to_uppercase().as_str()),
            path(&["0000:80:03.1"])
        );
        assert_eq!(topology.numa_node("0000:8A:00.0"), None);
        assert_eq!(
            topology.numa_node("0000:81:00.0".to_uppercase().as_str()),
            Some(1)
        );
    }

    #[test]
    fn two_sockets_fixture_reads_each_devices_numa_node() {
        let topology = fixture("two-sockets");
        let expected = vec![
            roce_nic(
                "bnxt_re0",
                "0000:02:00.0",
                0,
                "enp2s0f0np0",
                &["fe80::5e6f:69ff:fe80:200", "::ffff:192.168.10.1"],
            ),
            roce_nic(
                "bnxt_re1",
                "0000:82:00.0",
                1,
                "enp130s0f0np0",
                &[
                    "fe80::5e6f:69ff:fe80:8200",
                    "2001:db8:1::11",
                    "::ffff:192.168.11.1",
                ],
            ),
        ];
        assert_eq!(topology.nics().unwrap(), expected);
        assert_eq!(topology.numa_node("0000:01:00.0"), Some(0));
        assert_eq!(topology.numa_node("0000:81:00.0"), Some(1));
        assert_eq!(
            topology.pci_path("0000:81:00.0"),
            path(&["0000:80:01.1", "0000:81:00.0"])
        );
    }

    #[test]
    fn softroce_fixture_has_no_pci_parent_and_skips_unused_gids() {
        let expected = vec![nic(
            "rxe0",
            None,
            None,
            vec![active(
                1,
                Mtu::Mtu1024,
                vec![
                    entry(
                        0,
                        "fe80::a8c3:5aff:fe12:3401",
                        GidKind::RoceV2,
                        Some("dummy0"),
                    ),
                    entry(1, "::ffff:192.0.2.1", GidKind::RoceV2, Some("dummy0")),
                ],
            )],
        )];
        let topology = fixture("softroce");
        assert_eq!(topology.nics().unwrap(), expected);
        assert_eq!(topology.pci_path("0000:00:00.0"), None);
    }

    #[test]
    fn port_down_fixture_reads_a_down_infiniband_port_and_an_active_ethernet_one() {
        let expected = vec![nic(
            "mlx4_0",
            Some("0000:05:00.0"),
            Some(0),
            vec![
                PortInfo {
                    num: 1,
                    state: PortState::NotActive,
                    active_mtu: Some(Mtu::Mtu4096),
                    link_layer: LinkLayer::InfiniBand,
                    gids: vec![entry(0, "fe80::f452:1403:11:2231", GidKind::Ib, None)],
                },
                active(
                    2,
                    Mtu::Mtu1024,
                    [
                        roce(0, "fe80::f652:14ff:fe11:2232", "enp5s0d1"),
                        roce(2, "::ffff:192.168.20.5", "enp5s0d1"),
                    ]
                    .concat(),
                ),
            ],
        )];
        assert_eq!(fixture("port-down").nics().unwrap(), expected);
    }

    #[test]
    fn garbage_is_skipped_or_read_as_unknown() {
        let topology = fixture("garbage");
        let expected = vec![
            nic(
                "bad0",
                None,
                None,
                vec![
                    PortInfo {
                        num: 1,
                        state: PortState::NotActive,
                        active_mtu: None,
                        link_layer: LinkLayer::Ethernet,
                        gids: vec![
                            entry(1, "fe80::1", GidKind::Unknown, None),
                            entry(4, "::ffff:198.51.100.9", GidKind::Unknown, Some("eth9")),
                        ],
                    },
                    PortInfo {
                        num: 2,
                        state: PortState::Active,
                        active_mtu: None,
                        link_layer: LinkLayer::Ethernet,
                        gids: Vec::new(),
                    },
                ],
            ),
            nic("bad1", None, None, Vec::new()),
        ];
        assert_eq!(topology.nics().unwrap(), expected);
        assert_eq!(topology.numa_node("0000:09:00.0"), None);
        assert_eq!(topology.numa_node("0000:0a:00.0"), None);
        assert_eq!(
            topology.pci_path("0000:0a:00.0"),
            path(&["0000:00:02.1", "0000:0a:00.0"])
        );
        assert_eq!(topology.pci_path("0000:0b:00.0"), None);
        assert_eq!(topology.numa_node("0000:0b:00.0"), None);
        for bad in [
            "",
            "../../../etc",
            "0000:09:00.0/..",
            "0000:09:00.0/numa_node",
        ] {
            assert_eq!(topology.pci_path(bad), None, "{bad:?}");
            assert_eq!(topology.numa_node(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn nonexistent_root_has_no_nics_and_no_pci_devices() {
        let topology = fixture("no-such-case");
        assert_eq!(topology.nics().unwrap(), Vec::new());
        assert_eq!(topology.pci_path("0000:03:00.0"), None);
        assert_eq!(topology.numa_node("0000:03:00.0"), None);
    }

    #[test]
    fn a_root_that_is_a_file_has_no_nics() {
        let topology = fixture("make.sh");
        assert_eq!(topology.nics().unwrap(), Vec::new());
        assert_eq!(topology.pci_path("0000:03:00.0"), None);
    }

    #[test]
    fn system_reads_below_the_filesystem_root() {
        assert_eq!(SysfsTopology::system().root(), Path::new("/"));
    }
}
