//! Contract checks of the platform traits, written once and run against
//! every implementation: the fakes of this crate (`tests/contract.rs`) and
//! the production libibverbs, librdmacm and sysfs readers on Soft-RoCE
//! (`tests/rxe.rs`, in the VM lane).
//!
//! Each check is a plain `pub fn name(env: &Env)` that uses nothing but the
//! traits of [`hipobj::platform`] and panics, naming the rule, when the
//! implementation breaks it. A check holds for real RC hardware: what only
//! one device does (rxe's retry count 7 that never gives up, exact timings,
//! key layouts) and what only a fake can show (fault injection, live-object
//! counters) stays in the fakes' own unit tests.
//!
//! Everything happens on one device, as on the lane's single `rxe0`: the two
//! ends of a connection are two contexts of the same device (loopback), the
//! RDMA CM listens and connects on the same address.
//!
//! Real hardware completes work asynchronously: a check waits for what must
//! happen (up to [`PATIENCE`]) and watches for [`Env::quiet`] for what must
//! not. The fakes complete work while it is posted, so they need no quiet
//! time at all.
//!
//! [`contract_tests!`](crate::contract_tests) turns the list of checks into
//! one `#[test]` per check; both runners use it, so a new check runs on both
//! sides or on neither.

pub(crate) mod cm;
mod gpu;
mod support;
mod topology;
mod verbs;
mod windows;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

pub use cm::*;
pub use gpu::*;
pub use topology::*;
pub use verbs::*;
pub use windows::*;

use super::fabric::{DeviceSpec, Fabric};
use super::topology::FakeTopology;
use super::{Counters, Faults};
use hipobj::error::Result;
use hipobj::platform::{Cm, Platform, Topology, Verbs};

/// How long a check waits for something that must happen (a completion, a
/// CM event) before it fails. Only a broken implementation waits this long.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The device of [`Env::fake`], named as the lane's.
pub const FAKE_DEVICE: &str = "rxe0";
/// The address of [`Env::fake`]'s device, as the lane's `rxe0`.
pub const FAKE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// An address no host of a check has (TEST-NET-2, RFC 5737), for the CM's
/// "no such address" and "no route" rules.
pub const NOWHERE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

/// What the checks run against: the trait objects, and which device, port,
/// GID and address to use.
pub struct Env {
    /// libibverbs (or its fake).
    pub verbs: Arc<dyn Verbs>,
    /// librdmacm (or its fake).
    pub cm: Arc<dyn Cm>,
    /// The NIC topology (or its fake).
    pub topology: Arc<dyn Topology>,
    /// The RDMA device both ends of every connection use.
    pub device: String,
    /// Its port.
    pub port: u8,
    /// The GID index of the port's RoCE v2 IPv4-mapped GID.
    pub gid_index: u8,
    /// The port's IPv4 address, where the CM listens and connects.
    pub ip: Ipv4Addr,
    /// How long a check watches for something that must not happen: long
    /// enough for the implementation to have done it if it were going to.
    pub quiet: Duration,
}

impl Env {
    /// The fakes: one fabric with one Soft-RoCE-like device, [`FAKE_DEVICE`]
    /// at [`FAKE_IP`] (GID index 1, memory windows, MTU 1024), its CM, and a
    /// topology that lists it as sysfs would.
    pub fn fake() -> Env {
        let fabric = Fabric::new(Arc::new(Faults::new()), Arc::new(Counters::new()));
        let spec = DeviceSpec::new(FAKE_DEVICE, FAKE_IP);
        fabric
            .add_device(spec)
            .unwrap_or_else(|e| panic!("the fake device: {e}"));
        Env::on_fake_fabric(&fabric)
    }

    /// The fakes of `fabric`, which has a device [`FAKE_DEVICE`] at
    /// [`FAKE_IP`] (for the fakes' own tests, which look at its counters and
    /// inject faults).
    pub(crate) fn on_fake_fabric(fabric: &Arc<Fabric>) -> Env {
        let faults = Arc::clone(fabric.faults());
        Env {
            verbs: fabric.verbs(&[FAKE_DEVICE]),
            cm: fabric.cm(&[FAKE_DEVICE]),
            topology: Arc::new(FakeTopology::single(faults, FAKE_DEVICE, FAKE_IP)),
            device: FAKE_DEVICE.to_owned(),
            port: 1,
            gid_index: 1,
            ip: FAKE_IP,
            quiet: Duration::ZERO,
        }
    }

    /// `platform`'s verbs, CM and topology, on `device` (port 1, GID index
    /// 1: the IPv4-mapped RoCE v2 GID of `ip`, as on Soft-RoCE). Fails when
    /// a library cannot be loaded.
    pub fn on(platform: &dyn Platform, device: &str, ip: Ipv4Addr, quiet: Duration) -> Result<Env> {
        Ok(Env {
            verbs: platform.verbs()?,
            cm: platform.cm()?,
            topology: platform.topology()?,
            device: device.to_owned(),
            port: 1,
            gid_index: 1,
            ip,
            quiet,
        })
    }
}

/// Calls the macro `$callback` with `$args` (one token tree) and the name
/// of every contract check: the one list of checks, shared by every runner.
#[doc(hidden)]
#[macro_export]
macro_rules! __hipobj_contract_checks {
    ($($callback:ident)::+ ; $args:tt) => {
        $($callback)::+! {
            $args;
            // verbs.rs
            the_device_is_listed_and_describes_its_port,
            send_lands_in_the_posted_receive,
            one_sided_operations_complete_only_on_the_requester,
            write_with_imm_waits_for_a_receive_when_rnr_retry_is_7,
            write_with_imm_without_a_receive_is_rnr,
            write_to_a_qp_in_init_is_dropped_and_the_requester_gives_up,
            read_needs_max_dest_rd_atomic_at_the_responder,
            read_with_zero_initiator_depth_never_leaves,
            rts_cannot_be_re_aimed_without_reset,
            modify_checks_the_attribute_mask_of_each_transition,
            reset_discards_receives_without_completions,
            error_flushes_receives_and_outstanding_sends,
            sends_need_rts_and_receives_need_init,
            rkey_bounds_and_access_are_checked,
            cq_wait_wakes_when_a_completion_arrives,
            a_posted_receive_is_flushed_when_a_peer_breaks_the_qp,
            // windows.rs
            memory_window_bind_and_invalidate,
            a_window_is_usable_only_through_the_qp_that_bound_it,
            a_send_with_invalidate_revokes_the_receivers_window,
            a_posted_bind_carries_the_windows_current_rkey,
            a_region_without_remote_access_is_reached_only_through_a_window,
            // cm.rs
            cm_accept_with_an_existing_qp_connects_both_sides,
            cm_request_private_data_is_padded_to_56_bytes,
            cm_reject_reaches_the_active_side_with_its_private_data,
            cm_dropped_request_rejects_the_active_side,
            cm_disconnect_reaches_both_sides,
            cm_pool_qp_is_reused_after_reset_and_init,
            cm_connect_without_listener_is_refused,
            cm_listener_wake_and_deadline,
            cm_listen_binds_addresses_and_ports,
            // topology.rs
            topology_lists_the_device_as_verbs_sees_it,
        }
    };
}

/// One `#[test]` per contract check, each running the check on a fresh
/// `$env()` (an expression callable with no argument that returns an
/// [`Env`](crate::contract::Env)):
///
/// ```text
/// hipobj_testing::contract_tests!(hipobj_testing::contract::Env::fake);
/// ```
#[macro_export]
macro_rules! contract_tests {
    ($env:expr) => {
        $crate::__hipobj_contract_checks!($crate::__hipobj_contract_test_fns; ($env));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __hipobj_contract_test_fns {
    (($env:expr); $($check:ident),+ $(,)?) => {
        $(
            #[test]
            fn $check() {
                let env: $crate::contract::Env = ($env)();
                $crate::contract::$check(&env);
            }
        )+
    };
}
