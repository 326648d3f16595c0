//! A whole fake world for scenario tests: a client platform (fabric view,
//! CM, GPU, topology) and an S3 test server on another device of the same
//! fabric that plays the server's part of the protocol, and breaks it on
//! request.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::fabric::{DeviceSpec, Fabric};
use super::gpu::{FakeGpu, FakeGpuDevice};
use super::real_gpu::RealGpu;
use super::topology::{roce_nic, FakeTopology};
use super::{Counters, Faults};
use hipobj::core::args::{BufferRange, Slice};
use hipobj::core::protocol::{encode_connect, final_imm};
use hipobj::core::reply::REPLY_BUFFER_LEN;
use hipobj::core::token::{Token, TOKEN_HEX_LEN};
use hipobj::core::transfer::{Direction, S3Client};
use hipobj::core::{Config, Current, Instance, Options};
use hipobj::error::HIP_ERROR_NO_DEVICE;
use hipobj::error::{Error, Result};
use hipobj::platform::{
    Access, Cm, Gpu, GpuRuntime, Mr, Mtu, Platform, QpAttr, QpCaps, QpState, SendOp, SendWr, Sge,
    Topology, Verbs, WcStatus,
};
use hipobj::server::{ClientQp, DialPolicy, LocalBuf, Op, ServerConfig, ServerSide};

/// The client's device and address.
pub const CLIENT_NIC: &str = "client0";
/// The client's IPv4 address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The server's device.
pub const SERVER_NIC: &str = "server0";
/// The server's IPv4 address.
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The fake GPU's PCI address.
pub const GPU_BUS_ID: &str = "0000:c1:00.0";

/// Libraries a [`FakePlatform`] pretends are not installed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Absent {
    /// libibverbs.
    pub verbs: bool,
    /// librdmacm.
    pub cm: bool,
    /// The HIP runtime.
    pub gpu: bool,
}

/// The client's platform: every trait backed by a fake.
pub struct FakePlatform {
    /// Fault plan shared by every fake.
    pub faults: Arc<Faults>,
    /// Live-object counters shared by every fake.
    pub counters: Arc<Counters>,
    /// The fabric.
    pub fabric: Arc<Fabric>,
    /// The GPU.
    pub gpu: Arc<FakeGpu>,
    /// The topology.
    pub topology: Arc<FakeTopology>,
    verbs: Arc<dyn Verbs>,
    cm: Arc<dyn Cm>,
    /// What is missing.
    pub absent: Mutex<Absent>,
    /// A real GPU runtime that serves instead of [`FakePlatform::gpu`]
    /// ([`World::use_real_gpu`]).
    pub real_gpu: Mutex<Option<Arc<RealGpu>>>,
}

impl Platform for FakePlatform {
    fn verbs(&self) -> Result<Arc<dyn Verbs>> {
        if self.absent.lock().verbs {
            return Err(Error::Rdma(
                "cannot load libibverbs: none of libibverbs.so.1 could be loaded (fake)".into(),
            ));
        }
        Ok(self.verbs.clone())
    }

    fn cm(&self) -> Result<Arc<dyn Cm>> {
        if self.absent.lock().cm {
            return Err(Error::Rdma("cannot load librdmacm (fake)".into()));
        }
        Ok(self.cm.clone())
    }

    fn gpu(&self, _runtime: GpuRuntime) -> Result<Arc<dyn Gpu>> {
        if self.absent.lock().gpu {
            return Err(Error::HipMissing("libamdhip64.so.6 (fake)".into()));
        }
        if let Some(real) = self.real_gpu.lock().as_ref() {
            return Ok(real.clone());
        }
        Ok(self.gpu.clone())
    }

    fn topology(&self) -> Result<Arc<dyn Topology>> {
        Ok(self.topology.clone())
    }
}

/// How a world is built.
#[derive(Clone, Debug)]
pub struct WorldSpec {
    /// The client's device.
    pub client: DeviceSpec,
    /// The server's device.
    pub server: DeviceSpec,
    /// GPUs on the client.
    pub gpus: usize,
    /// Bytes of server memory (the object store).
    pub server_bytes: usize,
}

impl Default for WorldSpec {
    fn default() -> Self {
        let mut client = DeviceSpec::new(CLIENT_NIC, CLIENT_IP);
        client.supports_dmabuf = true;
        WorldSpec {
            client,
            server: DeviceSpec::new(SERVER_NIC, SERVER_IP),
            gpus: 1,
            server_bytes: 1 << 20,
        }
    }
}

/// A client platform and an S3 test server on one fabric.
pub struct World {
    /// The client's platform.
    pub platform: Arc<FakePlatform>,
    /// The S3 server.
    pub server: Arc<TestServer>,
}

impl World {
    /// The default world: one GPU, dma-buf capable client NIC, 1 MiB store.
    pub fn new() -> World {
        World::with(WorldSpec::default())
    }

    /// A world as `spec` says.
    pub fn with(spec: WorldSpec) -> World {
        let faults = Arc::new(Faults::new());
        let counters = Arc::new(Counters::new());
        let fabric = Fabric::new(faults.clone(), counters.clone());
        let client_mtu = spec.client.port_mtu;
        fabric
            .add_device(spec.client.clone())
            .expect("client device");
        fabric
            .add_device(spec.server.clone())
            .expect("server device");
        let devices = (0..spec.gpus)
            .map(|i| FakeGpuDevice {
                pci_bus_id: if i == 0 {
                    GPU_BUS_ID.to_owned()
                } else {
                    format!("0000:{:02x}:00.0", 0xc2 + i)
                },
            })
            .collect();
        let gpu = Arc::new(FakeGpu::new(devices, faults.clone(), counters.clone()));
        fabric.set_device_memory(gpu.clone());
        let topology = Arc::new(FakeTopology::new(faults.clone()));
        topology.add_nic(
            roce_nic(&spec.client.name, spec.client.ipv4, client_mtu),
            None,
        );
        let platform = Arc::new(FakePlatform {
            verbs: fabric.verbs(&[&spec.client.name]),
            cm: fabric.cm(&[&spec.client.name]),
            faults,
            counters,
            fabric: fabric.clone(),
            gpu,
            topology,
            absent: Mutex::new(Absent::default()),
            real_gpu: Mutex::new(None),
        });
        let server = Arc::new(TestServer::new(
            &fabric,
            &spec.server.name,
            spec.server_bytes,
        ));
        World { platform, server }
    }

    /// Another S3 server on a device of its own, at `ip`.
    pub fn add_server(&self, name: &str, ip: Ipv4Addr, bytes: usize) -> Arc<TestServer> {
        self.add_server_with(name, ip, bytes, TestServer::config())
    }

    /// [`World::add_server`] with the server side's `config` (its
    /// protocol version, its limits).
    pub fn add_server_with(
        &self,
        name: &str,
        ip: Ipv4Addr,
        bytes: usize,
        config: ServerConfig,
    ) -> Arc<TestServer> {
        self.platform
            .fabric
            .add_device(DeviceSpec::new(name, ip))
            .expect("a new device");
        Arc::new(TestServer::with_config(
            &self.platform.fabric,
            name,
            bytes,
            config,
        ))
    }

    /// Another S3 server on the device of an existing one (`device`): a
    /// second server process on the same node, behind the same CM.
    pub fn add_server_beside(&self, device: &str, bytes: usize) -> Arc<TestServer> {
        Arc::new(TestServer::new(&self.platform.fabric, device, bytes))
    }

    /// Serves the client's GPU calls from `real` (a real runtime) instead
    /// of the fake GPU, and lets the fabric reach its memory as a NIC
    /// would (see [`RealGpu`]). For instances built after the call.
    pub fn use_real_gpu(&self, real: Arc<RealGpu>) {
        self.platform.fabric.set_device_memory(real.clone());
        *self.platform.real_gpu.lock() = Some(real);
    }

    /// The platform as the trait object `Current::init_with` takes.
    pub fn platform(&self) -> Arc<dyn Platform> {
        self.platform.clone()
    }

    /// Runs `each(stream)` for `streams` streams, each on a thread of its
    /// own, twice: once to establish its connections, then, all together,
    /// from a new span of the modelled link ([`Fabric::model_reset`]).
    /// Returns that span and its bytes ([`Fabric::model_span`]); `None`
    /// without a model.
    pub fn model_span(
        &self,
        streams: usize,
        each: impl Fn(usize) + Sync,
    ) -> Option<(Duration, u64)> {
        let fabric = &self.platform.fabric;
        let ready = std::sync::Barrier::new(streams + 1);
        let go = std::sync::Barrier::new(streams + 1);
        std::thread::scope(|s| {
            for stream in 0..streams {
                let (ready, go, each) = (&ready, &go, &each);
                s.spawn(move || {
                    each(stream);
                    ready.wait();
                    go.wait();
                    each(stream);
                });
            }
            ready.wait();
            fabric.model_reset();
            go.wait();
        });
        fabric.model_span()
    }
}

/// AMD Pensando's PCI vendor id: fake devices with it model a hardware NIC,
/// where the library and the server poll before sleeping by default
/// (`HIPOBJ_POLL_US`); the default devices are Soft-RoCE's, where they do
/// not.
pub const HARDWARE_VENDOR_ID: u32 = 0x1dd8;

impl WorldSpec {
    /// The default world, its two devices modelling a hardware NIC
    /// ([`HARDWARE_VENDOR_ID`]).
    pub fn hardware() -> WorldSpec {
        let mut spec = WorldSpec::default();
        spec.client.vendor_id = HARDWARE_VENDOR_ID;
        spec.server.vendor_id = HARDWARE_VENDOR_ID;
        spec
    }
}

/// An instance on a world's client platform (GPU 0) with one registered
/// host buffer: what tests and benchmarks of whole transfers start from.
pub struct HostClient {
    _current: Current,
    /// The instance.
    pub instance: Arc<Instance>,
    /// The registered buffer.
    pub buf: Box<[u8]>,
}

impl HostClient {
    /// An instance on `world` with `options`, and `len` bytes of host
    /// memory registered.
    pub fn new(world: &World, options: Options, len: usize) -> Result<HostClient> {
        let current = Current::new();
        let config = Config {
            gpu_device: 0,
            ..Config::default()
        };
        current.init_with(world.platform(), config, options)?;
        let instance = current.instance()?;
        let buf = vec![0u8; len].into_boxed_slice();
        instance.register(BufferRange::new(buf.as_ptr() as usize, len)?, true)?;
        Ok(HostClient {
            _current: current,
            instance,
            buf,
        })
    }

    /// The slice of `len` bytes at `offset` of the buffer.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Slice> {
        let offset = i64::try_from(offset).map_err(|_| Error::InvalidValue("offset"))?;
        Slice::new(self.buf.as_ptr() as usize, len, offset)
    }

    /// A whole transfer of `len` bytes at `offset` of the buffer, with
    /// `server` as the S3 server.
    pub fn transfer(
        &self,
        server: &TestServer,
        direction: Direction,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let op = match direction {
            Direction::Get => Op::Get,
            Direction::Put => Op::Put,
        };
        self.instance
            .transfer(direction, self.slice(offset, len)?, &mut server.session(op))
    }
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

/// How the test server treats a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// The protocol, as it should be.
    Normal,
    /// Replies 200 without ever connecting.
    NeverConnect,
    /// Connects with a token other than the one it was sent.
    WrongProof,
    /// Connects and moves the data, but replies 200 without the final
    /// message.
    NoFinalMessage,
    /// Sends the final message with the wrong secret.
    WrongSecret,
    /// Connects, then disconnects before moving any data, and replies 200.
    Disappear,
    /// The original's ordering: aims its own QP at the client QP named in
    /// the token without any connection and WRITEs (it gives up: the
    /// client's QP is not ready), then replies 200.
    OriginalOrder,
    /// Replies with this status without doing anything.
    Status(u16),
    /// Does the transfer, then replies `200:<a peer token>`.
    PeerTokenReply,
    /// Connects properly, then writes (or reads) 64 bytes past the range
    /// its token grants, with the token's rkey, and replies 200.
    Overreach,
    /// Does the transfer, then replies 500 (the request failed after the
    /// data moved).
    FailAfterData,
    /// Connects properly, moves no byte, sends the final message and
    /// replies 200: a server that says it wrote what it did not.
    FinalWithoutData,
}

/// The S3 server of the tests: one object store (its registered memory),
/// served over the protocol of [`ServerSide`].
pub struct TestServer {
    side: ServerSide,
    fabric: Arc<Fabric>,
    /// The object store. Tests read and write it between transfers; during
    /// a transfer only the fabric touches it, through the MR.
    store: Mutex<Box<[u8]>>,
    mr: Arc<dyn Mr>,
    behaviour: Mutex<Behaviour>,
    /// Requests seen.
    pub requests: AtomicUsize,
    /// Transfers completed by the protocol.
    pub served: AtomicUsize,
    /// Deadline of each server step.
    pub step_timeout: Duration,
}

impl TestServer {
    fn new(fabric: &Arc<Fabric>, device: &str, bytes: usize) -> TestServer {
        TestServer::with_config(fabric, device, bytes, TestServer::config())
    }

    /// The test server's configuration: it plays every S3 request itself,
    /// so there is no request source to check a dial against.
    pub fn config() -> ServerConfig {
        ServerConfig {
            dial: DialPolicy::any(),
            ..ServerConfig::default()
        }
    }

    fn with_config(
        fabric: &Arc<Fabric>,
        device: &str,
        bytes: usize,
        config: ServerConfig,
    ) -> TestServer {
        let verbs = fabric.verbs(&[device]);
        let ctx = verbs.open(device).expect("server device opens");
        let pd = ctx.alloc_pd().expect("server PD");
        let mut store = vec![0u8; bytes].into_boxed_slice();
        // Local only: a server's own memory needs no remote access.
        let mr = pd
            .reg_mr(
                store.as_mut_ptr().expose_provenance(),
                bytes,
                Access::LOCAL_WRITE,
            )
            .expect("server MR");
        TestServer {
            side: ServerSide::with_config(fabric.cm(&[device]), ctx, pd, config),
            fabric: fabric.clone(),
            store: Mutex::new(store),
            mr,
            behaviour: Mutex::new(Behaviour::Normal),
            requests: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            step_timeout: Duration::from_secs(5),
        }
    }

    /// The object store as the server's local buffer of a transfer.
    pub fn local(&self) -> LocalBuf {
        LocalBuf {
            mr: self.mr.clone(),
            addr: self.mr.addr(),
        }
    }

    /// Sets how later requests are treated.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.behaviour.lock() = behaviour;
    }

    /// The server side (connections).
    pub fn side(&self) -> &ServerSide {
        &self.side
    }

    /// Bytes `[0, len)` of the object store.
    pub fn object(&self, len: usize) -> Vec<u8> {
        self.store.lock()[..len].to_vec()
    }

    /// Fills the object store's first bytes with `data`.
    pub fn set_object(&self, data: &[u8]) {
        self.store.lock()[..data.len()].copy_from_slice(data);
    }

    /// Serves one request as the current behaviour says; returns the reply.
    pub fn handle(&self, token_text: &[u8], op: Op) -> Vec<u8> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        // The header's value as a real server receives it: the token,
        // perhaps with the original clients' `:<addr>:<size>` suffix.
        let Ok(token) = hipobj::core::token::parse_header(token_text) else {
            return b"400".to_vec();
        };
        let deadline = Instant::now() + self.step_timeout;
        let local = LocalBuf {
            mr: self.mr.clone(),
            addr: self.mr.addr(),
        };
        let behaviour = *self.behaviour.lock();
        let data = |session: &mut hipobj::server::Session<'_>, len: u64| match op {
            Op::Get => session.write(&local, 0, 0, len),
            Op::Put => session.read(&local, 0, 0, len),
        };
        let failed = |f: hipobj::server::TransferFailure| f.error;
        let outcome: Result<Vec<u8>> = match behaviour {
            Behaviour::Normal => self
                .side
                .serve(&token, op, &local, deadline)
                .map(|()| b"200".to_vec()),
            Behaviour::FailAfterData => self
                .side
                .serve(&token, op, &local, deadline)
                .map(|()| b"500".to_vec()),
            Behaviour::PeerTokenReply => self.side.serve(&token, op, &local, deadline).map(|()| {
                let mut peer = token;
                peer.transport = hipobj::core::token::Transport::Rc;
                peer.secret = 0;
                let mut reply = b"200:".to_vec();
                reply.extend_from_slice(&peer.to_hex());
                reply
            }),
            Behaviour::Status(code) => Ok(code.to_string().into_bytes()),
            Behaviour::NeverConnect => Ok(b"200".to_vec()),
            Behaviour::WrongProof => {
                let mut other = token;
                other.rkey ^= 1;
                let _ = self
                    .side
                    .connect_with(&token, &encode_connect(&other), deadline);
                Ok(b"200".to_vec())
            }
            Behaviour::NoFinalMessage => self
                .side
                .begin(&token, None, deadline)
                .and_then(|mut session| {
                    data(&mut session, token.length)?;
                    session.abandon();
                    Ok(())
                })
                .map(|()| b"200".to_vec())
                .map_err(failed),
            Behaviour::WrongSecret => self
                .side
                .begin(&token, None, deadline)
                .and_then(|mut session| {
                    data(&mut session, token.length)?;
                    session.finish_with(final_imm(token.secret) ^ 0x5a5a)
                })
                .map(|()| b"200".to_vec())
                .map_err(failed),
            Behaviour::Disappear => self
                .side
                .begin(&token, None, deadline)
                .map(|mut session| {
                    let _ = session.conn().cm.disconnect();
                    session.abandon();
                    b"200".to_vec()
                })
                .map_err(failed),
            Behaviour::OriginalOrder => self
                .original_order(&token, &local)
                .map(|()| b"200".to_vec()),
            Behaviour::FinalWithoutData => self
                .side
                .begin(&token, None, deadline)
                .and_then(|session| session.finish())
                .map(|()| b"200".to_vec())
                .map_err(failed),
            Behaviour::Overreach => self
                .side
                .begin(&token, None, deadline)
                .and_then(|mut session| {
                    let len = token.length + 64;
                    session.data_unchecked(op, token.addr, token.rkey, &local, 0, len)?;
                    session.finish()
                })
                .map(|()| b"200".to_vec())
                .map_err(failed),
        };
        match outcome {
            Ok(reply) => {
                if matches!(
                    behaviour,
                    Behaviour::Normal | Behaviour::PeerTokenReply | Behaviour::FailAfterData
                ) {
                    self.served.fetch_add(1, Ordering::SeqCst);
                }
                reply
            }
            Err(e) => {
                eprintln!("test server: {behaviour:?}: {e}");
                b"500".to_vec()
            }
        }
    }

    /// The original's sequence: the server's own QP, aimed by hand at the
    /// client QP of the token, WRITEs at once (retry count 6).
    fn original_order(&self, token: &Token, local: &LocalBuf) -> Result<()> {
        let verbs = self.fabric.verbs(&[SERVER_NIC]);
        let ctx = verbs.open(SERVER_NIC)?;
        let cq = ctx.create_cq(8)?;
        let qp = self.side.pd().create_qp(
            &cq,
            QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
            },
        )?;
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(Access::empty()),
            ..QpAttr::default()
        };
        qp.modify(&init)?;
        let av = super::fabric::roce_av(token.gid);
        qp.modify(&QpAttr {
            state: Some(QpState::Rtr),
            av: Some(av),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qp_num: Some(token.qp_num),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(1),
            ..QpAttr::default()
        })?;
        qp.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(6),
            rnr_retry: Some(6),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        })?;
        let len = u32::try_from(token.length).unwrap_or(u32::MAX);
        let op = SendOp::Write {
            remote_addr: token.addr,
            rkey: token.rkey,
        };
        qp.post_send(&[SendWr {
            wr_id: 9,
            op,
            sge: Some(Sge {
                addr: local.addr,
                len,
                lkey: local.mr.lkey(),
            }),
            signaled: true,
        }])?;
        // The server ignores the outcome and replies 200, as the original's
        // test server does; its completion says the WRITE never landed.
        let _ = cq.wait(Instant::now() + self.step_timeout);
        let _ = cq.poll(8);
        Ok(())
    }

    /// A hostile server's move: one WRITE (`Op::Get`'s direction) or READ
    /// of `len` bytes at `remote_addr` with `rkey`, posted on this
    /// server's established connection to `client`, from or into the
    /// object store; returns how it completed (`None`: no connection).
    /// A refused access breaks the connection (the QP goes to ERR).
    pub fn probe(
        &self,
        client: &ClientQp,
        op: Op,
        remote_addr: u64,
        rkey: u32,
        len: u32,
    ) -> Option<WcStatus> {
        let conn = self.side.connection(client)?;
        let conn = conn.lock();
        let until = Instant::now() + self.step_timeout;
        hipobj::server::probe(&conn, op, &self.local(), remote_addr, rkey, len, until)
    }

    /// A hostile server's move: an in-band proof of `token` on this
    /// server's established connection to `client`, waiting `within` for
    /// the grant (which a client gives only to its waiting transfer's own
    /// token).
    pub fn prove(&self, client: &ClientQp, token: &Token, within: Duration) -> Result<()> {
        let conn = self
            .side
            .connection(client)
            .ok_or_else(|| Error::Rdma("no connection to that client QP".into()))?;
        let mut conn = conn.lock();
        hipobj::server::prove(&mut conn, token, Instant::now() + within)
    }

    /// Sends a final message (a zero-length SEND with `imm`) on the
    /// connection kept to `client`, as a misbehaving server would at any
    /// moment; returns once it completed.
    pub fn send_final(&self, client: &ClientQp, imm: u32, within: Duration) -> Result<()> {
        self.send_final_as(client, imm, None, within)
    }

    /// [`TestServer::send_final`], or with `Some(rkey)` a version-4 final
    /// message: a SEND with invalidate of the client's window `rkey`,
    /// carrying `imm` as its data.
    pub fn send_final_as(
        &self,
        client: &ClientQp,
        imm: u32,
        rkey: Option<u32>,
        within: Duration,
    ) -> Result<()> {
        let conn = self
            .side
            .connection(client)
            .ok_or_else(|| Error::Rdma("no connection to that client QP".into()))?;
        let mut conn = conn.lock();
        let wr = conn.final_wr_as(imm, rkey);
        conn.qp.post_send(&[wr])?;
        let until = Instant::now() + within;
        loop {
            if let Some(c) = conn.cq.poll(1)?.into_iter().next() {
                return match c.status {
                    hipobj::platform::WcStatus::Success => Ok(()),
                    status => Err(Error::Rdma(format!("the final message: {status:?}"))),
                };
            }
            if Instant::now() >= until || !conn.cq.wait(until)? {
                return Err(Error::Rdma("the final message did not complete".into()));
            }
        }
    }

    /// An S3 client session for one request of direction `op`.
    pub fn session(&self, op: Op) -> Session<'_> {
        Session {
            server: self,
            op,
            reply: None,
        }
    }
}

/// One request/response exchange with the test server, as the application's
/// callbacks would carry it.
pub struct Session<'a> {
    server: &'a TestServer,
    op: Op,
    reply: Option<Vec<u8>>,
}

impl S3Client for Session<'_> {
    fn send_request(&mut self, token: &[u8; TOKEN_HEX_LEN + 1]) -> std::result::Result<(), i32> {
        self.reply = Some(self.server.handle(&token[..TOKEN_HEX_LEN], self.op));
        Ok(())
    }

    fn recv_reply(
        &mut self,
        reply: &mut [u8; REPLY_BUFFER_LEN],
    ) -> std::result::Result<usize, i32> {
        let Some(text) = self.reply.take() else {
            return Err(-1);
        };
        reply[..text.len()].copy_from_slice(&text);
        Ok(text.len())
    }
}

/// An S3 client whose request is answered by a closure that plays the S3
/// server (and whatever a test wants to happen while the request is out):
/// it gets the token and returns the reply's text.
pub struct Scripted<F: FnMut(&Token) -> Vec<u8>> {
    answer: F,
    reply: Option<Vec<u8>>,
}

impl<F: FnMut(&Token) -> Vec<u8>> Scripted<F> {
    /// A client answered by `answer`.
    pub fn new(answer: F) -> Scripted<F> {
        Scripted {
            answer,
            reply: None,
        }
    }
}

impl<F: FnMut(&Token) -> Vec<u8>> S3Client for Scripted<F> {
    fn send_request(&mut self, token: &[u8; TOKEN_HEX_LEN + 1]) -> std::result::Result<(), i32> {
        let parsed = Token::parse_hex(&token[..TOKEN_HEX_LEN]).map_err(|_| -1)?;
        self.reply = Some((self.answer)(&parsed));
        Ok(())
    }

    fn recv_reply(
        &mut self,
        reply: &mut [u8; REPLY_BUFFER_LEN],
    ) -> std::result::Result<usize, i32> {
        let text = self.reply.take().ok_or(-1)?;
        reply[..text.len()].copy_from_slice(&text);
        Ok(text.len())
    }
}

/// `hipErrorNoDevice`, re-exported for tests.
pub const NO_DEVICE: i32 = HIP_ERROR_NO_DEVICE;
