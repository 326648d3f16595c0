//! The RDMA gateway behind `hipobj-s3-server`: an S3 server (s3s, SigV4
//! required) over a backend, that also serves hipobj clients: a GetObject,
//! PutObject or UploadPart carrying `x-amz-rdma-token` moves its payload by
//! RDMA through the server side of the protocol ([`crate::server`])
//! instead of the HTTP body.
//!
//! - [`cli`]: the settings, from the command line.
//! - [`backend`]: where objects live ([`backend::Backend`]): a directory
//!   of this machine ([`local`]).
//! - [`s3`]: the S3 operations, the RDMA paths in front of the backend's.
//! - [`rdma`]: the server's device, its memory budget and its buffers.
//!
//! [`run`] prints one line once it listens:
//! `hipobj-s3-server listening on http://IP:PORT (rdma: DEVICE|off: REASON)`,
//! logs one line per RDMA transfer on standard error, and on SIGTERM or
//! SIGINT stops accepting, disconnects every RDMA connection (a transfer in
//! progress fails and answers 500), lets the HTTP requests in progress
//! finish and returns.
//!
//! Threads: every blocking step (the backend's file I/O through
//! `tokio::fs`, and each RDMA request's buffer, file read, dial and
//! transfer) runs on tokio's blocking pool. An RDMA request's steps may
//! each wait up to `--rdma-timeout-ms` for a client, and at most
//! `--rdma-max-requests` RDMA requests run at once (one more is answered
//! 503 at once), so the pool is sized that many plus [`FILE_IO_THREADS`]:
//! however slow the RDMA clients, those threads stay for the file I/O of
//! every request, plain S3 included.

pub mod backend;
pub mod cli;
pub mod local;
pub mod range;
pub mod rdma;
pub mod s3;
pub mod stream;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::server::graceful::GracefulShutdown;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use cli::Options;
use rdma::Rdma;

/// Why RDMA is off when `--no-rdma` turned it off.
const NO_RDMA: &str = "--no-rdma";

/// Blocking threads that RDMA requests never hold: the file I/O of every
/// request has them (tokio's default pool is 512 threads in all).
pub const FILE_IO_THREADS: usize = 256;

/// The S3 service, with each request's TCP peer put into its extensions:
/// the dial policy compares it with the address a token names.
#[derive(Clone)]
struct WithPeer {
    inner: s3s::service::S3Service,
    peer: SocketAddr,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for WithPeer {
    type Response = <s3s::service::S3Service as hyper::service::Service<
        http::Request<hyper::body::Incoming>,
    >>::Response;
    type Error = <s3s::service::S3Service as hyper::service::Service<
        http::Request<hyper::body::Incoming>,
    >>::Error;
    type Future = <s3s::service::S3Service as hyper::service::Service<
        http::Request<hyper::body::Incoming>,
    >>::Future;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> Self::Future {
        req.extensions_mut().insert(s3::Peer(self.peer));
        hyper::service::Service::call(&self.inner, req)
    }
}

/// Prepares the backend, RDMA and the runtime, then serves until a signal.
pub fn run(options: Options) -> Result<(), String> {
    make_buckets(&options.root, &options.buckets)?;
    let rdma = if options.no_rdma {
        Err(NO_RDMA.to_owned())
    } else {
        Rdma::open(
            options.device.as_deref(),
            options.rdma_timeout,
            options.delay_final,
            options.limits(),
        )
        .map(Arc::new)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(options.rdma_max_requests + FILE_IO_THREADS)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let status = rdma_status(&rdma);
    let outcome = runtime.block_on(serve(&options, rdma.clone(), status));
    // Requests still running (past the grace period) end with the runtime;
    // then no transfer can start, and every connection is disconnected.
    runtime.shutdown_timeout(Duration::from_secs(1));
    if let Ok(rdma) = &rdma {
        rdma.shutdown();
        // What no transfer gave back: buffers the NIC might still have used
        // when their transfer failed (each said so when it happened).
        eprintln!(
            "hipobj-s3-server: stopped; {} bytes of the RDMA memory budget still held",
            rdma.memory_in_use()
        );
    }
    outcome
}

/// The `rdma: ...` part of the first line.
fn rdma_status(rdma: &Result<Arc<Rdma>, String>) -> String {
    match rdma {
        Ok(rdma) => rdma.device().to_owned(),
        Err(reason) if reason == NO_RDMA => format!("off: disabled by {NO_RDMA}"),
        Err(reason) => format!("off: {reason}"),
    }
}

/// Creates the root and each bucket's directory if missing.
fn make_buckets(root: &Path, buckets: &[String]) -> Result<(), String> {
    std::fs::create_dir_all(root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    for bucket in buckets {
        let dir = root.join(bucket);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Serves HTTP on the listener until SIGTERM or SIGINT, then ends RDMA and
/// waits for the requests in progress (at most the RDMA deadline, the
/// final-message delay and a second).
async fn serve(
    options: &Options,
    rdma: Result<Arc<Rdma>, String>,
    status: String,
) -> Result<(), String> {
    let backend = Arc::new(local::Local::open(&options.root)?);
    let service = {
        let s3 = s3::RdmaS3::new(backend, rdma.clone(), options.region.clone());
        let mut builder = S3ServiceBuilder::new(s3);
        builder.set_auth(SimpleAuth::from_single(
            options.access_key.clone(),
            options.secret_key.clone(),
        ));
        builder.build()
    };
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| format!("listening on {}: {e}", options.listen))?;
    let local: SocketAddr = listener
        .local_addr()
        .map_err(|e| format!("the listener's address: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "hipobj-s3-server listening on http://{local} (rdma: {status})"
        )
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing to standard output: {e}"))?;
    }
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("hipobj-s3-server: accept: {e}");
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        let service = WithPeer {
            inner: service.clone(),
            peer,
        };
        let conn = http.serve_connection(TokioIo::new(socket), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    // Transfers in progress fail now (their QPs are in ERR) and answer 500;
    // no new one starts.
    if let Ok(rdma) = &rdma {
        rdma.shutdown();
    }
    let grace = options.rdma_timeout + options.delay_final + Duration::from_secs(1);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            eprintln!("hipobj-s3-server: requests still running after {grace:?}; stopping anyway");
        }
    }
    Ok(())
}
