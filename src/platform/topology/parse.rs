//! The text of single sysfs files, as the kernel writes it.
//!
//! Each function takes a file's contents, already trimmed, and returns what
//! it means or `None` (never an error): a caller skips what it cannot read.
//! Formats are those of `drivers/infiniband/core/sysfs.c` and
//! `drivers/pci/pci-sysfs.c`.

use std::net::Ipv6Addr;
use std::str::FromStr;

use crate::platform::{Gid, GidKind, LinkLayer, Mtu, PortState};

/// `IB_PORT_ACTIVE` in `enum ib_port_state`.
const IB_PORT_ACTIVE: u32 = 4;

/// The lowercased PCI address `text` names (`dddd:bb:dd.f`), or `None` if it
/// is not one. The domain may be longer than four digits: the kernel prints
/// it with `%04x`, and Intel VMD domains start at `10000`.
pub fn pci_address(text: &str) -> Option<String> {
    let address = text.to_ascii_lowercase();
    let (domain, rest) = address.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, len: std::ops::RangeInclusive<usize>| {
        len.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let valid = hex(domain, 4..=8)
        && hex(bus, 2..=2)
        && hex(device, 2..=2)
        && matches!(function.as_bytes(), [b'0'..=b'7']);
    valid.then_some(address)
}

/// A directory entry named by a plain decimal number (`ports/1`,
/// `gids/12`); `"+1"` or `"01x"` are not numbers here, though `FromStr`
/// accepts the first.
pub fn number<T: FromStr>(name: &str) -> Option<T> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// `state`: `"4: ACTIVE"` (`"%d: %s"` of `enum ib_port_state`). The number
/// decides; a bare name is accepted too.
pub fn port_state(text: &str) -> PortState {
    let active = match text.split_once(':') {
        Some((number, _)) => number.trim().parse::<u32>().ok() == Some(IB_PORT_ACTIVE),
        None => text == "ACTIVE",
    };
    if active {
        PortState::Active
    } else {
        PortState::NotActive
    }
}

/// `active_mtu`: `"4096 (5)"`, the bytes then the `enum ib_mtu` value; the
/// bytes decide.
pub fn mtu(text: &str) -> Option<Mtu> {
    let bytes: u32 = text.split_whitespace().next()?.parse().ok()?;
    (1..=5)
        .filter_map(Mtu::from_ibv)
        .find(|mtu| mtu.bytes() == bytes)
}

/// `link_layer`: `"Ethernet"` or `"InfiniBand"`; the kernel writes
/// `"Unknown"` for anything else.
pub fn link_layer(text: &str) -> Option<LinkLayer> {
    match text {
        "Ethernet" => Some(LinkLayer::Ethernet),
        "InfiniBand" => Some(LinkLayer::InfiniBand),
        _ => None,
    }
}

/// `gids/<i>`: eight groups of four hex digits (`%pI6`).
pub fn gid(text: &str) -> Option<Gid> {
    Ipv6Addr::from_str(text).ok().map(|addr| addr.octets())
}

/// `gid_attrs/types/<i>` on an Ethernet port: `"IB/RoCE v1"` or
/// `"RoCE v2"` (`ib_cache_gid_type_str`).
pub fn gid_kind(text: &str) -> GidKind {
    match text {
        "IB/RoCE v1" => GidKind::RoceV1,
        "RoCE v2" => GidKind::RoceV2,
        _ => GidKind::Unknown,
    }
}

/// `numa_node`: `"%d"`, `-1` (`NUMA_NO_NODE`) when the firmware does not
/// say.
pub fn numa_node(text: &str) -> Option<i32> {
    text.parse().ok().filter(|node: &i32| *node >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_validated_and_lowercased() {
        assert_eq!(pci_address("0000:c1:00.0").as_deref(), Some("0000:c1:00.0"));
        assert_eq!(pci_address("0000:C1:0A.7").as_deref(), Some("0000:c1:0a.7"));
        assert_eq!(
            pci_address("10000:01:00.0").as_deref(),
            Some("10000:01:00.0")
        );
        for bad in [
            "",
            "pci0000:00",
            "c1:00.0",
            "0000:c1:00.8",
            "0000:c1:00",
            "0000:c1:0.0",
            "0000:g1:00.0",
            "0000:c1:00.0/..",
            "../../etc",
        ] {
            assert_eq!(pci_address(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn entry_numbers_are_plain_decimal() {
        assert_eq!(number::<u8>("1"), Some(1));
        assert_eq!(number::<u16>("255"), Some(255));
        assert_eq!(number::<u8>("300"), None);
        assert_eq!(number::<u8>("+1"), None);
        assert_eq!(number::<u8>(""), None);
        assert_eq!(number::<u8>("abc"), None);
    }

    #[test]
    fn only_state_4_is_active() {
        assert_eq!(port_state("4: ACTIVE"), PortState::Active);
        assert_eq!(port_state("ACTIVE"), PortState::Active);
        assert_eq!(port_state("1: DOWN"), PortState::NotActive);
        assert_eq!(port_state("2: INIT"), PortState::NotActive);
        assert_eq!(port_state("5: ACTIVE_DEFER"), PortState::NotActive);
        assert_eq!(port_state("x: ACTIVE"), PortState::NotActive);
        assert_eq!(port_state(""), PortState::NotActive);
    }

    #[test]
    fn mtu_is_read_from_its_byte_count() {
        assert_eq!(mtu("4096 (5)"), Some(Mtu::Mtu4096));
        assert_eq!(mtu("1024 (3)"), Some(Mtu::Mtu1024));
        assert_eq!(mtu("256"), Some(Mtu::Mtu256));
        assert_eq!(mtu("9000 (6)"), None);
        assert_eq!(mtu("huge"), None);
        assert_eq!(mtu(""), None);
    }

    #[test]
    fn link_layers_and_gid_kinds_are_exact_names() {
        assert_eq!(link_layer("Ethernet"), Some(LinkLayer::Ethernet));
        assert_eq!(link_layer("InfiniBand"), Some(LinkLayer::InfiniBand));
        assert_eq!(link_layer("Unknown"), None);
        assert_eq!(gid_kind("RoCE v2"), GidKind::RoceV2);
        assert_eq!(gid_kind("IB/RoCE v1"), GidKind::RoceV1);
        assert_eq!(gid_kind("RoCE v3"), GidKind::Unknown);
        assert_eq!(gid_kind(""), GidKind::Unknown);
    }

    #[test]
    fn gids_are_eight_groups_of_hex() {
        let mapped = gid("0000:0000:0000:0000:0000:ffff:c000:0201").unwrap();
        assert_eq!(mapped[10..], [0xff, 0xff, 192, 0, 2, 1]);
        let link_local = gid("fe80:0000:0000:0000:a8c3:5aff:fe12:3401").unwrap();
        assert_eq!(link_local[..2], [0xfe, 0x80]);
        assert_eq!(gid("not a gid"), None);
        assert_eq!(gid("fe80:0000"), None);
    }

    #[test]
    fn negative_numa_nodes_are_unknown() {
        assert_eq!(numa_node("1"), Some(1));
        assert_eq!(numa_node("-1"), None);
        assert_eq!(numa_node("garbage"), None);
    }
}
