//! Devices as a host opens them: the device list it sees, contexts with
//! their one port and its GID table, and each context's asynchronous
//! events.
//!
//! Hardware rules: a device has port 1 only, and a GID index past its table
//! fails; a QP that a remote request moves to ERR raises `QP_ACCESS_ERR` or
//! `QP_REQ_ERR` on the context of its PD unless the device spec says the
//! device raises none (rxe); a context's event descriptor is readable while
//! events wait, as libibverbs' `async_fd` is; a CQ has 1 to `max_cqe`
//! entries, and the device's CQ limit gives ENOMEM.

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Weak};

use super::cq::{CqRec, FakeCq};
use super::mr::{FakePd, PdRec};
use super::{gone, to_usize, DeviceSpec, Fabric, QpKey, State, GID_TABLE_LEN};
use hipobj::error::{Error, Result};
use hipobj::platform::{
    AsyncEvent, AsyncKind, Context, Cq, DeviceLimits, Gid, LinkLayer, Pd, PortAttr, PortState,
    Verbs, Waker,
};

/// An open context: where asynchronous events of its QPs go.
pub(super) struct CtxRec {
    /// The device the context was opened on.
    pub(super) device: usize,
    events: VecDeque<AsyncEvent>,
    waker: Arc<Waker>,
}

impl CtxRec {
    /// Queues `event` and makes the context's event descriptor readable.
    pub(super) fn raise(&mut self, event: AsyncEvent) {
        self.events.push_back(event);
        self.waker.wake();
    }
}

impl State {
    /// Moves the responder `key` to ERR for a remote request that broke
    /// its rules, with the asynchronous event hardware raises.
    pub(super) fn remote_error(&mut self, key: QpKey, kind: AsyncKind) {
        self.enter_error(key);
        let raises = self.devices.get(key.0).is_some_and(|d| d.spec.async_events);
        let ctx = self
            .qps
            .get(&key)
            .and_then(|q| self.pds.get(&q.pd))
            .map(|p| p.ctx);
        if let Some(c) = ctx
            .filter(|_| raises)
            .and_then(|c| self.contexts.get_mut(&c))
        {
            c.raise(AsyncEvent {
                kind,
                qp_num: Some(key.1),
            });
        }
    }
}

/// A host's view of the fabric's devices.
pub(super) struct FakeVerbs {
    pub(super) fabric: Arc<Fabric>,
    pub(super) visible: Vec<String>,
}

impl Verbs for FakeVerbs {
    fn device_names(&self) -> Result<Vec<String>> {
        self.fabric.check("ibv_get_device_list")?;
        let st = self.fabric.state.lock();
        Ok(st
            .devices
            .iter()
            .map(|d| &d.spec.name)
            .filter(|n| self.visible.contains(n))
            .cloned()
            .collect())
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
        self.fabric.check("ibv_open_device")?;
        let st = self.fabric.state.lock();
        let found = st
            .devices
            .iter()
            .position(|d| d.spec.name == name)
            .filter(|_| self.visible.iter().any(|v| v == name));
        let Some(index) = found else {
            return Err(Error::Rdma(format!(
                "ibv_open_device({name}) failed: No such device"
            )));
        };
        let spec = st.devices[index].spec.clone();
        drop(st);
        let async_waker = Arc::new(Waker::new()?);
        let id = {
            let mut st = self.fabric.state.lock();
            let id = st.new_id();
            st.contexts.insert(
                id,
                CtxRec {
                    device: index,
                    events: VecDeque::new(),
                    waker: async_waker.clone(),
                },
            );
            id
        };
        self.fabric.counters.created("context");
        Ok(Arc::new_cyclic(|me| FakeContext {
            me: me.clone(),
            fabric: Arc::clone(&self.fabric),
            device: index,
            id,
            spec,
            async_waker,
        }))
    }
}

/// An open device.
pub(super) struct FakeContext {
    me: Weak<FakeContext>,
    fabric: Arc<Fabric>,
    pub(super) device: usize,
    id: u64,
    pub(super) spec: DeviceSpec,
    async_waker: Arc<Waker>,
}

impl Context for FakeContext {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn vendor_id(&self) -> u32 {
        self.spec.vendor_id
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.fabric.check("ibv_query_port")?;
        if port != 1 {
            return Err(Error::Rdma(format!(
                "ibv_query_port({}, port {port}) failed: Invalid argument (one port)",
                self.spec.name
            )));
        }
        Ok(PortAttr {
            state: if self.spec.port_active {
                PortState::Active
            } else {
                PortState::NotActive
            },
            active_mtu: self.spec.port_mtu,
            lid: 0,
            link_layer: LinkLayer::Ethernet,
            gid_table_len: self
                .fabric
                .state
                .lock()
                .devices
                .get(self.device)
                .and_then(|d| u16::try_from(d.gids.len()).ok())
                .unwrap_or(GID_TABLE_LEN),
            max_msg_sz: self.spec.max_msg_sz,
        })
    }

    fn query_gid(&self, port: u8, index: u16) -> Result<Gid> {
        self.fabric.check("ibv_query_gid")?;
        let st = self.fabric.state.lock();
        let gid = st
            .devices
            .get(self.device)
            .and_then(|d| d.gids.get(usize::from(index)))
            .filter(|_| port == 1);
        gid.copied().ok_or_else(|| {
            Error::Rdma(format!(
                "ibv_query_gid({}, port {port}, index {index}) failed: Invalid argument",
                self.spec.name
            ))
        })
    }

    fn alloc_pd(&self) -> Result<Arc<dyn Pd>> {
        self.fabric.check("ibv_alloc_pd")?;
        let ctx = self.me.upgrade().ok_or_else(gone)?;
        let id = {
            let mut st = self.fabric.state.lock();
            let id = st.new_id();
            st.pds.insert(
                id,
                PdRec {
                    children: 0,
                    ctx: self.id,
                },
            );
            id
        };
        self.fabric.counters.created("pd");
        Ok(Arc::new_cyclic(|me| FakePd {
            me: me.clone(),
            fabric: Arc::clone(&self.fabric),
            ctx,
            id,
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>> {
        self.fabric.check("ibv_create_cq")?;
        let max_cqe = self.spec.limits.max_cqe;
        if depth == 0 || depth > max_cqe {
            return Err(Error::Rdma(format!(
                "ibv_create_cq({}, {depth} entries) failed: Invalid argument (1 to {max_cqe})",
                self.spec.name
            )));
        }
        let ctx = self.me.upgrade().ok_or_else(gone)?;
        let channel = Arc::new(Waker::new()?);
        let id = {
            let mut st = self.fabric.state.lock();
            if st.live_on(self.device).1 >= to_usize(self.spec.limits.max_cq) {
                return Err(Error::Rdma(format!(
                    "ibv_create_cq({}) failed: Cannot allocate memory (max_cq {} reached)",
                    self.spec.name, self.spec.limits.max_cq
                )));
            }
            let id = st.new_id();
            st.cqs.insert(
                id,
                CqRec {
                    device: self.device,
                    depth: to_usize(depth),
                    armed: false,
                    channel: channel.clone(),
                    entries: VecDeque::new(),
                    overrun: false,
                    users: 0,
                },
            );
            id
        };
        self.fabric.counters.created("cq");
        Ok(Arc::new(FakeCq {
            fabric: Arc::clone(&self.fabric),
            ctx,
            id,
            channel,
        }))
    }

    fn supports_dmabuf(&self) -> bool {
        self.spec.supports_dmabuf
    }

    fn supports_mw(&self) -> bool {
        self.spec.supports_mw
    }

    fn limits(&self) -> DeviceLimits {
        self.spec.limits
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_waker.as_fd()
    }

    /// Checks "ibv_get_async_event".
    fn next_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.fabric.check("ibv_get_async_event")?;
        let mut st = self.fabric.state.lock();
        let Some(c) = st.contexts.get_mut(&self.id) else {
            return Ok(None);
        };
        let event = c.events.pop_front();
        if c.events.is_empty() {
            c.waker.take();
        }
        Ok(event)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FakeContext {
    fn drop(&mut self) {
        self.fabric.state.lock().contexts.remove(&self.id);
        self.fabric.counters.destroyed("context");
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::ipv4_gid;
    use super::super::support::*;
    use super::*;
    use hipobj::platform::Mtu;

    #[test]
    fn devices_have_the_rxe_gid_layout() {
        let fabric = fabric();
        assert!(fabric
            .add_device(DeviceSpec::new("a", Ipv4Addr::new(10, 0, 0, 1)))
            .is_err());
        assert!(fabric.add_device(DeviceSpec::new("c", A_IP)).is_err());
        let verbs = fabric.verbs(&["b", "zz"]);
        assert_eq!(verbs.device_names().expect("names"), ["b"]);
        assert!(verbs.open("a").is_err(), "not this host's");
        let ctx = verbs.open("b").expect("open");
        let port = ctx.query_port(1).expect("port");
        assert_eq!(
            (port.state, port.active_mtu, port.link_layer),
            (PortState::Active, Mtu::Mtu4096, LinkLayer::Ethernet)
        );
        assert_eq!(ctx.query_gid(1, 1).expect("gid"), ipv4_gid(B_IP));
        let link_local = ctx.query_gid(1, 0).expect("gid");
        assert_eq!(link_local[..2], [0xfe, 0x80]);
        assert!(ctx.query_gid(1, 2).is_err());
        assert!(ctx.query_port(2).is_err());
        assert_eq!(fabric.gid("b", 1), Some(ipv4_gid(B_IP)));
    }
}
