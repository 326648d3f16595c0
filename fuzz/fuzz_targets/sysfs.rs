//! The sysfs file parsers (`platform::topology::parse`), which read what
//! the kernel (or a container's bind mount) puts under /sys. The input is
//! one file's text for every parser; each answers within its format.
#![no_main]

use hipobj::platform::topology::parse;
use hipobj::platform::{GidKind, LinkLayer, PortState};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(address) = parse::pci_address(text) {
        assert_eq!(address, text.to_ascii_lowercase());
        assert_eq!(parse::pci_address(&address).as_deref(), Some(&*address));
    }
    if let Some(n) = parse::number::<u64>(text) {
        assert!(!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()));
        assert_eq!(text.parse::<u64>().ok(), Some(n));
    }
    if parse::port_state(text) == PortState::Active {
        assert!(text.contains('4') || text == "ACTIVE");
    }
    if let Some(mtu) = parse::mtu(text) {
        assert!([256, 512, 1024, 2048, 4096].contains(&mtu.bytes()));
    }
    match parse::link_layer(text) {
        Some(LinkLayer::Ethernet) => assert_eq!(text, "Ethernet"),
        Some(LinkLayer::InfiniBand) => assert_eq!(text, "InfiniBand"),
        None => {}
    }
    if let Some(gid) = parse::gid(text) {
        let printed = std::net::Ipv6Addr::from(gid).to_string();
        assert_eq!(parse::gid(&printed), Some(gid));
    }
    if parse::gid_kind(text) != GidKind::Unknown {
        assert!(text == "IB/RoCE v1" || text == "RoCE v2");
    }
    if let Some(node) = parse::numa_node(text) {
        assert!(node >= 0);
    }
});
