//! Where the real-verbs tests and the RDMA bench run: the VM lane's
//! Soft-RoCE device (`rxe0` at 192.0.2.1, brought up by
//! `scripts/vm/guest.sh`), or a host's own RDMA device that the hardware
//! lane names (`scripts/hw/run.sh` sets `HIPOBJ_LANE_DEVICE` and
//! `HIPOBJ_LANE_IP`, and `HIPOBJ_LANE_BIN` to where it carried the programs
//! the tests start). The end-to-end tests' S3 servers may sit on another
//! device of the host (`HIPOBJ_LANE_SERVER_DEVICE`, `HIPOBJ_LANE_SERVER_IP`:
//! two ports or two NICs, or the VM's rxe1 across a veth pair).

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::LazyLock;

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The RDMA device: `HIPOBJ_LANE_DEVICE`, or the VM's `rxe0`.
pub fn device() -> &'static str {
    static NAME: LazyLock<String> = LazyLock::new(|| setting("HIPOBJ_LANE_DEVICE", "rxe0"));
    &NAME
}

/// The device's IPv4 address: `HIPOBJ_LANE_IP`, or the VM's 192.0.2.1.
pub fn ip() -> &'static str {
    static IP: LazyLock<String> = LazyLock::new(|| setting("HIPOBJ_LANE_IP", "192.0.2.1"));
    &IP
}

/// The device the tests' S3 servers use: `HIPOBJ_LANE_SERVER_DEVICE`, or
/// the client's own [`device`].
pub fn server_device() -> &'static str {
    static NAME: LazyLock<String> =
        LazyLock::new(|| setting("HIPOBJ_LANE_SERVER_DEVICE", device()));
    &NAME
}

/// The servers' address: `HIPOBJ_LANE_SERVER_IP`, or the client's [`ip`].
pub fn server_ip() -> &'static str {
    static IP: LazyLock<String> = LazyLock::new(|| setting("HIPOBJ_LANE_SERVER_IP", ip()));
    &IP
}

/// [`ip`] parsed.
pub fn ipv4() -> Ipv4Addr {
    ip().parse()
        .unwrap_or_else(|e| panic!("HIPOBJ_LANE_IP {:?}: {e}", ip()))
}

/// The program `name`: in `HIPOBJ_LANE_BIN` where the hardware lane
/// carried it, else where cargo built it (`built`).
pub fn program(name: &str, built: &str) -> PathBuf {
    match std::env::var_os("HIPOBJ_LANE_BIN") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => PathBuf::from(built),
    }
}

/// The device's port 1 counter of packets sent: Soft-RoCE's `sent_pkts`
/// (`hw_counters`), else the standard `port_xmit_packets` that hardware
/// devices keep (`counters`).
pub fn sent_packets_file() -> PathBuf {
    let port = PathBuf::from(format!("/sys/class/infiniband/{}/ports/1", device()));
    let rxe = port.join("hw_counters/sent_pkts");
    if rxe.exists() {
        rxe
    } else {
        port.join("counters/port_xmit_packets")
    }
}
