//! The RDMA S3 server of this repository (`hipobj::gateway`, what
//! `hipobj-s3-server` runs) in this process, with RDMA on the fake
//! fabric's server device, serving S3 over real HTTP on 127.0.0.1: the
//! client's RDMA paths end to end on a host without an RDMA device.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_s3::config::Credentials;
use hipobj::gateway::backend::Backend;
use hipobj::gateway::cache::Cached;
use hipobj::gateway::local::Local;
use hipobj::gateway::rdma::Rdma;
use hipobj::gateway::s3::RdmaS3;
use hipobj::gateway::upstream::Upstream;
use hipobj_testing::world::{World, SERVER_NIC};

use crate::s3server::{ACCESS_KEY, BUCKET, SECRET_KEY};

/// A running gateway and its temporary root, if it has one; stops when
/// dropped.
pub struct Gateway {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Its RDMA: the memory budget, the requests in progress.
    pub rdma: Arc<Rdma>,
    root: Option<PathBuf>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Gateway {
    /// The gateway over a fresh root holding [`BUCKET`], its RDMA on
    /// `world`'s server device, dialing the fake client's network (the
    /// HTTP requests come from 127.0.0.1, not from the fabric).
    pub fn start(world: &World) -> Gateway {
        Gateway::start_with(world, &[])
    }

    /// [`Gateway::start`] with `extra` options (`--rdma-memory-bytes`...).
    pub fn start_with(world: &World, extra: &[&str]) -> Gateway {
        let root = Gateway::fresh_root();
        let root_s = root.display().to_string();
        let mut args = vec!["--root", &root_s];
        args.extend_from_slice(extra);
        Gateway::with(world, &args, Some(root))
    }

    /// The gateway in front of the S3 store at `upstream` (`--upstream`,
    /// with `extra` options: region, time-outs...), signing for it with the
    /// credentials of this process's environment.
    pub fn upstream(world: &World, upstream: &str, extra: &[&str]) -> Gateway {
        let mut args = vec!["--upstream", upstream];
        args.extend_from_slice(extra);
        Gateway::serve(world, &args, None, Backing::Options(None))
    }

    /// [`Gateway::upstream`], signing for the store with `credentials`.
    pub fn upstream_signed(
        world: &World,
        upstream: &str,
        extra: &[&str],
        credentials: Credentials,
    ) -> Gateway {
        let mut args = vec!["--upstream", upstream];
        args.extend_from_slice(extra);
        Gateway::serve(world, &args, None, Backing::Options(Some(credentials)))
    }

    /// The gateway over `backend` (a wrapper of [`Local`] over `root`, say),
    /// with `extra` options.
    pub fn over(
        world: &World,
        backend: Arc<dyn Backend>,
        root: PathBuf,
        extra: &[&str],
    ) -> Gateway {
        let root_s = root.display().to_string();
        let mut args = vec!["--root", &root_s];
        args.extend_from_slice(extra);
        Gateway::serve(world, &args, Some(root), Backing::Given(backend))
    }

    /// A fresh root holding [`BUCKET`], for [`Gateway::over`].
    pub fn fresh_root() -> PathBuf {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let root =
            std::env::temp_dir().join(format!("hipobj-gateway-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        root
    }

    fn with(world: &World, backend: &[&str], root: Option<PathBuf>) -> Gateway {
        Gateway::serve(world, backend, root, Backing::Options(None))
    }

    fn serve(world: &World, backend: &[&str], root: Option<PathBuf>, backing: Backing) -> Gateway {
        let args: Vec<String> = backend
            .iter()
            .chain(&[
                "--listen",
                "127.0.0.1:0",
                "--access-key",
                ACCESS_KEY,
                "--secret-key",
                SECRET_KEY,
                "--rdma-allow",
                "192.0.2.0/24",
            ])
            .map(|s| (*s).to_owned())
            .collect();
        let options = hipobj::gateway::cli::parse(&args)
            .expect("the gateway's options")
            .expect("not --help");
        let fabric = &world.platform.fabric;
        let ctx = fabric.verbs(&[SERVER_NIC]).open(SERVER_NIC).unwrap();
        let rdma = Rdma::on(
            fabric.cm(&[SERVER_NIC]),
            ctx,
            options.rdma_timeout,
            Duration::ZERO,
            options.limits(),
        )
        .expect("RDMA on the fake server device");
        let rdma = Arc::new(rdma);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let backend: Arc<dyn Backend> = match (backing, &options.upstream, &root) {
            (Backing::Given(given), _, _) => given,
            (Backing::Options(credentials), Some(settings), _) => Cached::over(
                Arc::new(
                    runtime
                        .block_on(async {
                            match credentials {
                                Some(credentials) => {
                                    Upstream::connect_with(settings, credentials).await
                                }
                                None => Upstream::connect(settings).await,
                            }
                        })
                        .expect("the upstream's client"),
                ),
                settings.cache.as_ref(),
                Some(rdma.room()),
            )
            .expect("the cache"),
            (Backing::Options(_), None, Some(root)) => Arc::new(Local::open(root).unwrap()),
            (Backing::Options(_), None, None) => unreachable!("a root or an upstream"),
        };
        let s3 = RdmaS3::new(backend, Ok(Arc::clone(&rdma)), options.region.clone());
        // The server's own service and connections: its SigV4 keys, its
        // domains, its time-outs and caps.
        let credentials = [hipobj::gateway::cli::Credential {
            access_key: ACCESS_KEY.to_owned(),
            secret_key: SECRET_KEY.to_owned(),
        }];
        let service = hipobj::gateway::service(s3, &credentials, &options.domains);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let local: SocketAddr = listener.local_addr().unwrap();
        let limits = options.http.clone();
        runtime.spawn(async move {
            let graceful = hipobj::gateway::serve_connections(
                listener,
                service,
                None,
                limits,
                std::future::pending(),
            )
            .await;
            drop(graceful);
        });
        Gateway {
            endpoint: format!("http://{local}"),
            rdma,
            root,
            runtime: Some(runtime),
        }
    }

    /// The object `BUCKET/key`'s file, if stored.
    pub fn stored(&self, key: &str) -> Option<Vec<u8>> {
        let root = self.root.as_ref().expect("a gateway over a root");
        std::fs::read(root.join(BUCKET).join(key)).ok()
    }

    /// The built-in S3 client of this gateway, signing with its keys.
    pub fn s3(&self) -> hipobj::s3::S3 {
        s3(&self.endpoint, "us-east-1", ACCESS_KEY, SECRET_KEY)
    }

    /// The root.
    pub fn root(&self) -> &Path {
        self.root.as_ref().expect("a gateway over a root")
    }
}

/// Where a gateway's backend comes from.
enum Backing {
    /// Its options (`--root`, or `--upstream` signing with these
    /// credentials, else the environment's).
    Options(Option<Credentials>),
    /// A backend a test made.
    Given(Arc<dyn Backend>),
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        if let Some(root) = &self.root {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

/// A client on `world`'s fake client device, host memory only, its tokens
/// good for 10 minutes (a bench's longest transfer).
pub fn bench_client(world: &World) -> hipobj::client::Client {
    hipobj::client::Client::builder()
        .platform(world.platform())
        .gpu(hipobj::client::GpuSelect::None)
        .options(hipobj::core::Options {
            token_timeout: Duration::from_secs(600),
            ..hipobj::core::Options::default()
        })
        .build()
        .unwrap()
}

/// The built-in S3 client of `endpoint` in `region`, signing with `key`
/// and `secret`.
pub fn s3(endpoint: &str, region: &str, key: &str, secret: &str) -> hipobj::s3::S3 {
    hipobj::s3::S3::new(hipobj::s3::S3Config {
        endpoint: endpoint.to_owned(),
        region: region.to_owned(),
        credentials: hipobj::s3::Credentials {
            access_key_id: key.to_owned(),
            secret_access_key: secret.to_owned(),
            session_token: None,
        },
        credentials_source: "given".to_owned(),
    })
    .unwrap()
}
