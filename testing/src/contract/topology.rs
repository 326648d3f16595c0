//! Contract check of `Topology`: what sysfs says about the device agrees
//! with what libibverbs says.

use super::Env;
use hipobj::platform::{GidKind, LinkLayer, PortState};

/// The topology lists the device with its port active on Ethernet (at the
/// MTU `ibv_query_port` reports, if it knows one); every GID entry it lists is the GID
/// `ibv_query_gid` returns at that index, with a RoCE type and its network
/// device; the environment's entry is the RoCE v2 IPv4-mapped address.
pub fn topology_lists_the_device_as_verbs_sees_it(env: &Env) {
    let nics = env
        .topology
        .nics()
        .unwrap_or_else(|e| panic!("the topology's NICs: {e}"));
    let names: Vec<&str> = nics.iter().map(|n| n.name.as_str()).collect();
    let nic = nics
        .iter()
        .find(|n| n.name == env.device)
        .unwrap_or_else(|| panic!("{} is not among the NICs {names:?}", env.device));
    let port = nic
        .ports
        .iter()
        .find(|p| p.num == env.port)
        .unwrap_or_else(|| panic!("{} has no port {}", env.device, env.port));
    assert_eq!(
        (port.state, port.link_layer),
        (PortState::Active, LinkLayer::Ethernet),
        "an active RoCE port"
    );
    let ctx = env
        .verbs
        .open(&env.device)
        .unwrap_or_else(|e| panic!("opening {}: {e}", env.device));
    let verbs_port = ctx
        .query_port(env.port)
        .unwrap_or_else(|e| panic!("port {}: {e}", env.port));
    // The kernel's port directory has no MTU file (the reader then knows
    // none); where one is known it must be the port's.
    if let Some(mtu) = port.active_mtu {
        assert_eq!(
            mtu, verbs_port.active_mtu,
            "the topology and ibv_query_port agree on the MTU"
        );
    }
    assert!(!port.gids.is_empty(), "no GID entries");
    for entry in &port.gids {
        let gid = ctx
            .query_gid(env.port, entry.index)
            .unwrap_or_else(|e| panic!("GID {}: {e}", entry.index));
        assert_eq!(
            entry.gid, gid,
            "GID {} of sysfs and libibverbs",
            entry.index
        );
        assert!(
            matches!(entry.kind, GidKind::RoceV1 | GidKind::RoceV2),
            "GID {} of a RoCE port is of type {:?}",
            entry.index,
            entry.kind
        );
        assert!(
            entry.netdev.as_deref().is_some_and(|n| !n.is_empty()),
            "GID {} names its network device",
            entry.index
        );
    }
    let ours = port
        .gids
        .iter()
        .find(|g| g.index == u16::from(env.gid_index))
        .unwrap_or_else(|| panic!("no GID entry {}", env.gid_index));
    assert_eq!(
        (ours.gid, ours.kind),
        (env.ip.to_ipv6_mapped().octets(), GidKind::RoceV2),
        "GID {} is the RoCE v2 ::ffff:{}",
        env.gid_index,
        env.ip
    );
}
