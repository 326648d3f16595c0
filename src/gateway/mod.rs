//! The RDMA gateway behind `hipobj-s3-server`: an S3 server (s3s, SigV4
//! required) over a backend, that also serves hipobj clients: a GetObject,
//! PutObject or UploadPart carrying `x-amz-rdma-token` moves its payload by
//! RDMA through the server side of the protocol ([`crate::server`])
//! instead of the HTTP body.
//!
//! - [`cli`]: the settings, from the command line, a config file and the
//!   environment.
//! - [`backend`]: where objects live ([`backend::Backend`]): a directory
//!   of this machine ([`local`], `--root`) or another S3 store
//!   ([`upstream`], `--upstream`).
//! - [`s3`]: the S3 operations, the RDMA paths in front of the backend's.
//! - [`rdma`]: the server's device, its memory budget and its buffers.
//! - [`tls`]: https for the S3 leg.
//! - [`metrics`]: what `--metrics-listen` serves.
//!
//! [`run`] prints one line once it listens:
//! `hipobj-s3-server listening on http[s]://IP:PORT (rdma: DEVICE|off:
//! REASON)`, then `hipobj-s3-server metrics on http://IP:PORT/metrics` with
//! `--metrics-listen`. On standard error it logs one line per RDMA
//! transfer and one per answer of 400 or more (its S3 error code and
//! message, the method, path, peer and access key; never a secret or a
//! signature). On SIGTERM or SIGINT it stops accepting (S3 and metrics
//! alike), lets the requests in progress finish for `--shutdown-grace-ms`,
//! then disconnects every RDMA connection and returns.
//!
//! Connections ([`serve_connections`]): at most `--http-max-connections`
//! open at once, and `--http-max-connections-per-client` from one address
//! (one more is closed as it is accepted, TLS or not); a request's header
//! must arrive within `--http-header-timeout-ms` of its first byte, and a
//! connection without a request in progress is closed after
//! `--http-idle-timeout-ms` (a new one that sends nothing too). Each is
//! logged when it acts: nothing a client does holds a socket and a task
//! for ever.
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
pub mod cache;
pub mod checksum;
pub mod cli;
pub mod local;
pub mod metrics;
pub mod range;
pub mod rdma;
pub mod s3;
pub mod stream;
pub mod tls;
pub mod upstream;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_rustls::TlsAcceptor;

use cli::Options;
use rdma::Rdma;

/// Why RDMA is off when `--no-rdma` turned it off.
const NO_RDMA: &str = "--no-rdma";

/// Blocking threads that RDMA requests never hold: the file I/O of every
/// request has them (tokio's default pool is 512 threads in all).
pub const FILE_IO_THREADS: usize = 256;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the S3 listener allows a connection, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// `--http-header-timeout-ms`: from a request's first byte to the end
    /// of its header.
    pub header_timeout: Duration,
    /// `--http-idle-timeout-ms`: a connection without a request in
    /// progress, or a new one that has sent nothing.
    pub idle_timeout: Duration,
    /// `--http-max-connections`: open at once, TLS handshakes included.
    pub max_connections: usize,
    /// `--http-max-connections-per-client`: open at once from one address.
    pub max_connections_per_client: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_client: 1024,
        }
    }
}

/// The S3 service over `s3`, signed requests only, with each of
/// `credentials`; virtual-hosted-style requests for `domains` (none: every
/// request is path-style).
pub fn service(
    s3: s3::RdmaS3,
    credentials: &[cli::Credential],
    domains: &[String],
) -> s3s::service::S3Service {
    let mut builder = S3ServiceBuilder::new(s3);
    let mut auth = SimpleAuth::new();
    for c in credentials {
        auth.register(c.access_key.clone(), c.secret_key.clone().into());
    }
    builder.set_auth(auth);
    if !domains.is_empty() {
        builder.set_host(Domains(domains.to_vec()));
    }
    builder.build()
}

/// The names `--domain` gives: a request whose Host is `BUCKET.NAME`
/// addresses `BUCKET`; any other Host (`NAME` itself, an address, another
/// name) is path-style. Never s3s's `SingleDomain` fallback, which takes a
/// Host outside the domain (`localhost`, a balancer's name) for a bucket's
/// own name.
struct Domains(Vec<String>);

impl s3s::host::S3Host for Domains {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> s3s::S3Result<s3s::host::VirtualHost<'a>> {
        let name = without_port(host);
        for domain in &self.0 {
            let bucket = name
                .len()
                .checked_sub(domain.len() + 1)
                .filter(|&dot| {
                    name[dot + 1..].eq_ignore_ascii_case(domain) && name.as_bytes()[dot] == b'.'
                })
                .map(|dot| &name[..dot]);
            if let Some(bucket) = bucket.filter(|b| !b.is_empty()) {
                return Ok(s3s::host::VirtualHost::new(domain.as_str())
                    .with_bucket(bucket.to_ascii_lowercase()));
            }
        }
        Ok(s3s::host::VirtualHost::new(name))
    }
}

/// A Host header without its port (`[v6]:port` too).
fn without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(host, |(v6, _)| v6);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

/// The S3 service, with each request's TCP peer put into its extensions
/// (the dial policy compares it with the address a token names); each
/// answer is counted ([`metrics`]) and one of 400 or more is logged.
#[derive(Clone)]
struct WithPeer {
    inner: s3s::service::S3Service,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for WithPeer {
    type Response = http::Response<InFlight>;
    type Error = <s3s::service::S3Service as hyper::service::Service<
        http::Request<hyper::body::Incoming>,
    >>::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let request = Request::began(&self.activity);
        req.extensions_mut().insert(s3::Peer(self.peer));
        let exchange = metrics::Exchange::begin(&req);
        let asked = Asked::of(&req, self.peer, exchange.op());
        let answer = hyper::service::Service::call(&self.inner, req);
        Box::pin(async move {
            match answer.await {
                Ok(mut resp) => {
                    // A token request's error that is the backend's own
                    // answer (s3.rs marks it): the store's, not RDMA's.
                    let from_backend = resp.headers_mut().remove(s3::CAUSE).is_some();
                    let status = resp.status().as_u16();
                    let error = (status >= 400)
                        .then(|| s3_error(resp.body().bytes().as_deref().unwrap_or_default()));
                    // The RDMA paths log their own declines and refusals
                    // for now, with more to say (the token's address,
                    // the budget...).
                    let rdma_said = !from_backend
                        && resp
                            .headers()
                            .get("x-amz-rdma-reply")
                            .is_some_and(|r| matches!(r.as_bytes(), b"501" | b"503"));
                    if let Some(error) = error.as_ref().filter(|_| !rdma_said) {
                        asked.log(status, error);
                    }
                    let code = error.as_ref().map(|e| e.code.as_str());
                    Ok(exchange
                        .respond(resp, code, from_backend)
                        .map(|body| InFlight {
                            body,
                            _request: request,
                        }))
                }
                Err(e) => {
                    eprintln!("hipobj-s3-server: {asked}: no answer: {e:?}");
                    metrics::failed(exchange);
                    Err(e)
                }
            }
        })
    }
}

/// What a request asked, as its log line names it: never its query (a
/// presigned URL's holds its signature) nor its Authorization header's
/// signature.
struct Asked {
    method: http::Method,
    path: String,
    peer: SocketAddr,
    op: &'static str,
    /// The access key it is signed with, if it names one.
    access_key: Option<String>,
}

impl Asked {
    fn of<B>(req: &http::Request<B>, peer: SocketAddr, op: &'static str) -> Asked {
        Asked {
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
            peer,
            op,
            access_key: access_key(req),
        }
    }

    /// One line on standard error for an answer of 400 or more.
    fn log(&self, status: u16, error: &S3ErrorBody) {
        let class = match (status, error.code.as_str()) {
            (
                _,
                "SignatureDoesNotMatch"
                | "InvalidAccessKeyId"
                | "NotSignedUp"
                | "RequestTimeTooSkewed"
                | "AuthorizationHeaderMalformed"
                | "ExpiredToken"
                | "MissingSecurityHeader",
            ) => "authentication refused",
            (_, "AccessDenied") => "authorization refused",
            (500 | 502.., _) => "server error",
            _ => "refused",
        };
        let code = if error.code.is_empty() {
            "(no S3 error code)"
        } else {
            error.code.as_str()
        };
        let reason: Vec<&str> = [explain(&error.code).unwrap_or(""), &error.message]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect();
        let reason = match reason.join(": ") {
            none if none.is_empty() => String::new(),
            some => format!(": {some}"),
        };
        eprintln!("hipobj-s3-server: {self}: {status} {code}, {class}{reason}");
    }
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} ({}) from {}",
            self.method, self.path, self.op, self.peer
        )?;
        match &self.access_key {
            Some(key) => write!(f, " with access key {key}"),
            None => write!(f, " unsigned"),
        }
    }
}

/// What an S3 error code means to whoever reads the log, where s3s's
/// message does not say it.
fn explain(code: &str) -> Option<&'static str> {
    Some(match code {
        "SignatureDoesNotMatch" => {
            "the signature does not match the request (a wrong secret key, or the request was \
             changed on its way)"
        }
        "NotSignedUp" | "InvalidAccessKeyId" => "unknown access key",
        "RequestTimeTooSkewed" => "the request's time is too far from this server's clock",
        "AuthorizationHeaderMalformed" => "the request is signed for another region or malformed",
        "AccessDenied" => "not allowed",
        _ => return None,
    })
}

/// The access key a request's SigV4 (header or presigned URL) names, if
/// it looks like one (a key is not a secret; anything else is not shown).
fn access_key<B>(req: &http::Request<B>) -> Option<String> {
    let from_header = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once("Credential="))
        .and_then(|(_, rest)| rest.split('/').next());
    let from_query = || {
        req.uri()
            .query()?
            .split('&')
            .find_map(|pair| pair.strip_prefix("X-Amz-Credential="))
            .and_then(|v| v.split(['/', '%']).next())
    };
    let key = from_header.or_else(from_query)?;
    let plain = !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    Some(if plain { key } else { "(malformed)" }.to_owned())
}

/// The code and message of an S3 error answer's XML body (empty when it
/// has none, as a HEAD's).
#[derive(Debug, Default, PartialEq, Eq)]
struct S3ErrorBody {
    code: String,
    message: String,
}

/// Reads `<Code>` and `<Message>` out of an S3 error body. s3s writes the
/// body before the response leaves it, so it is whole here.
fn s3_error(body: &[u8]) -> S3ErrorBody {
    let text = String::from_utf8_lossy(body);
    let field = |tag: &str| -> String {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        text.split_once(open.as_str())
            .and_then(|(_, rest)| rest.split_once(close.as_str()))
            .map(|(value, _)| unescape(value))
            .unwrap_or_default()
    };
    let code = field("Code");
    let code = if code.bytes().all(|b| b.is_ascii_alphanumeric()) {
        code
    } else {
        String::new()
    };
    S3ErrorBody {
        code,
        message: field("Message")
            .chars()
            .filter(|c| !c.is_control())
            .collect(),
    }
}

/// XML's five escapes undone.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Prepares the backend, RDMA and the runtime, then serves until a signal.
pub fn run(options: Options) -> Result<(), String> {
    if let Some(root) = &options.root {
        make_buckets(root, &options.buckets)?;
    }
    // Before RDMA and the runtime: a bad certificate is a bad setting.
    let tls = options.tls.as_ref().map(tls::acceptor).transpose()?;
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
    let outcome = runtime.block_on(serve(&options, rdma.clone(), tls, status));
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

/// A line on standard output, flushed at once (a supervisor or a test
/// waits for it).
fn say(line: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing to standard output: {e}"))
}

/// Serves S3 (and the metrics) until SIGTERM or SIGINT, then stops
/// accepting, waits for the requests in progress (at most the grace
/// period) and ends RDMA.
async fn serve(
    options: &Options,
    rdma: Result<Arc<Rdma>, String>,
    tls: Option<TlsAcceptor>,
    status: String,
) -> Result<(), String> {
    let backend: Arc<dyn backend::Backend> = match (&options.upstream, &options.root) {
        (Some(settings), _) => cache::Cached::over(
            Arc::new(upstream::Upstream::connect(settings).await?),
            settings.cache.as_ref(),
            rdma.as_ref().ok().map(|r| r.room()),
        )?,
        (None, Some(root)) => Arc::new(local::Local::open(root)?),
        (None, None) => return Err("--root or --upstream is required".into()),
    };
    eprintln!("hipobj-s3-server: serving {}", backend.describe());
    if rdma.is_ok() {
        metrics::rdma_limits(options.rdma_memory_bytes, options.rdma_max_requests);
    }
    let service = service(
        s3::RdmaS3::new(backend, rdma.clone(), options.region.clone()),
        &options.credentials,
        &options.domains,
    );
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| format!("listening on {}: {e}", options.listen))?;
    let local: SocketAddr = listener
        .local_addr()
        .map_err(|e| format!("the listener's address: {e}"))?;
    let metrics = match options.metrics_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
            let local = listener
                .local_addr()
                .map_err(|e| format!("the metrics listener's address: {e}"))?;
            Some((listener, local))
        }
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    say(&format!(
        "hipobj-s3-server listening on {scheme}://{local} (rdma: {status})"
    ))?;
    let metrics = match metrics {
        Some((listener, local)) => {
            say(&format!(
                "hipobj-s3-server metrics on http://{local}/metrics"
            ))?;
            let gauges = rdma.clone().ok().map(|r| r as Arc<dyn metrics::RdmaGauges>);
            Some(tokio::spawn(metrics::serve(listener, gauges)))
        }
        None => None,
    };
    let stop = async {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    let graceful = serve_connections(listener, service, tls, options.http.clone(), stop).await;
    // Neither S3 nor the metrics take a connection from here on.
    if let Some(metrics) = metrics {
        metrics.abort();
        let _ = metrics.await;
    }
    let grace = options.shutdown_grace;
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            eprintln!("hipobj-s3-server: requests still running after {grace:?}; stopping anyway");
        }
    }
    // RDMA transfers in progress after the grace period fail now (their
    // QPs are in ERR) and answer 500.
    if let Ok(rdma) = &rdma {
        rdma.shutdown();
    }
    Ok(())
}

/// Accepts S3 connections on `listener` and serves `service` on each,
/// within `limits` (plain TCP, or TLS through `tls`), until `stop`
/// resolves; then stops accepting and returns the handle that waits for
/// the connections still open (each lets its request in progress finish).
pub async fn serve_connections(
    listener: TcpListener,
    service: s3s::service::S3Service,
    tls: Option<TlsAcceptor>,
    limits: HttpLimits,
    stop: impl std::future::Future<Output = ()>,
) -> GracefulShutdown {
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Open::default());
    let limits = Arc::new(limits);
    tokio::pin!(stop);
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("hipobj-s3-server: accept: {e}");
                    // Out of descriptors, say: give the others time to close.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        no_delay(&socket, peer);
        let Some(slot) = open.take(peer.ip(), &limits) else {
            // Closed as it came: the socket drops here.
            continue;
        };
        let activity = Arc::new(Activity::new());
        let service = WithPeer {
            inner: service.clone(),
            peer,
            activity: Arc::clone(&activity),
        };
        let (http, watcher, limits) = (http.clone(), graceful.watcher(), Arc::clone(&limits));
        match &tls {
            None => {
                tokio::spawn(async move {
                    connection(http, socket, service, watcher, &limits).await;
                    drop(slot);
                });
            }
            Some(tls) => {
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(socket)).await {
                        Ok(Ok(stream)) => connection(http, stream, service, watcher, &limits).await,
                        Ok(Err(e)) => {
                            eprintln!("hipobj-s3-server: TLS handshake with {peer} failed: {e}")
                        }
                        Err(_) => eprintln!(
                            "hipobj-s3-server: TLS handshake with {peer} failed: no handshake \
                             in {HANDSHAKE_TIMEOUT:?}"
                        ),
                    }
                    drop(slot);
                });
            }
        }
    }
    graceful
}

/// Sends each answer's bytes as hyper writes them (`TCP_NODELAY`). With
/// Nagle's algorithm on, an answer written in two pieces (the head, then a
/// small body: a 1-byte object, an error's XML) kept its second piece back
/// until the client acknowledged the first, which clients delay by up to
/// 40 ms: every such GET took 40 ms more. A socket that refuses is served
/// as it is, the refusal logged.
fn no_delay(socket: &tokio::net::TcpStream, peer: SocketAddr) {
    if let Err(e) = socket.set_nodelay(true) {
        eprintln!("hipobj-s3-server: TCP_NODELAY on the connection from {peer}: {e}");
    }
}

/// The S3 connections open, in all and by client address.
#[derive(Default)]
struct Open {
    counts: parking_lot::Mutex<OpenCounts>,
}

#[derive(Default)]
struct OpenCounts {
    all: usize,
    by_client: std::collections::HashMap<std::net::IpAddr, usize>,
    /// Connections refused since the last line said so, and when it did:
    /// for the cap in all, then for the cap per client.
    refused: [usize; 2],
    said: [Option<std::time::Instant>; 2],
}

/// One open connection's place among them, given back when dropped.
struct Slot {
    open: Arc<Open>,
    client: std::net::IpAddr,
}

impl Open {
    /// A place for a connection from `client`, or `None` (logged, at most
    /// a line every ten seconds) past the limits.
    fn take(self: &Arc<Open>, client: std::net::IpAddr, limits: &HttpLimits) -> Option<Slot> {
        let mut counts = self.counts.lock();
        let from_client = counts.by_client.get(&client).copied().unwrap_or(0);
        let why = if counts.all >= limits.max_connections {
            Some((
                0,
                format!(
                    "{} connections are open, as many as --http-max-connections allows",
                    counts.all
                ),
            ))
        } else if from_client >= limits.max_connections_per_client {
            Some((
                1,
                format!(
                    "{from_client} connections from {client} are open, as many as \
                     --http-max-connections-per-client allows"
                ),
            ))
        } else {
            None
        };
        if let Some((cap, why)) = why {
            counts.refused[cap] += 1;
            let now = std::time::Instant::now();
            if counts.said[cap].is_none_or(|at| now.duration_since(at) >= Duration::from_secs(10)) {
                eprintln!(
                    "hipobj-s3-server: a connection from {client} closed as it came: {why} \
                     ({} refused since the last such line)",
                    counts.refused[cap]
                );
                counts.refused[cap] = 0;
                counts.said[cap] = Some(now);
            }
            return None;
        }
        counts.all += 1;
        *counts.by_client.entry(client).or_insert(0) += 1;
        Some(Slot {
            open: Arc::clone(self),
            client,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.open.counts.lock();
        counts.all = counts.all.saturating_sub(1);
        if let Some(n) = counts.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                counts.by_client.remove(&self.client);
            }
        }
    }
}

/// What a connection is doing, for its time-outs: requests in progress
/// (from their header's end to their answer's last byte), when the next
/// request's first byte came, and since when it has been idle.
struct Activity {
    start: std::time::Instant,
    /// Requests whose header arrived and whose answer is not done.
    requests: std::sync::atomic::AtomicUsize,
    /// Milliseconds from `start` (plus one; 0: none) to the first byte of a
    /// request whose header has not ended.
    header_since: std::sync::atomic::AtomicU64,
    /// Milliseconds from `start` to the end of the last request (or 0).
    idle_since: std::sync::atomic::AtomicU64,
    /// Wakes the watchdog when a request starts or ends.
    changed: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: std::time::Instant::now(),
            requests: std::sync::atomic::AtomicUsize::new(0),
            header_since: std::sync::atomic::AtomicU64::new(0),
            idle_since: std::sync::atomic::AtomicU64::new(0),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Bytes arrived: without a request in progress, a request's header
    /// has begun.
    fn read(&self) {
        use std::sync::atomic::Ordering;
        if self.requests.load(Ordering::Acquire) == 0
            && self.header_since.load(Ordering::Acquire) == 0
        {
            let _ = self.header_since.compare_exchange(
                0,
                self.now() + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// Why the connection must close now, or when to look again (`None`:
    /// once a request ends).
    fn due(&self, limits: &HttpLimits) -> Result<Option<std::time::Instant>, String> {
        use std::sync::atomic::Ordering;
        if self.requests.load(Ordering::Acquire) > 0 {
            return Ok(None);
        }
        let at = |ms: u64| self.start + Duration::from_millis(ms);
        let header = self.header_since.load(Ordering::Acquire);
        let (deadline, why) = if header > 0 {
            (
                at(header - 1) + limits.header_timeout,
                format!(
                    "its request's header did not arrive within {} ms of its first byte \
                     (--http-header-timeout-ms)",
                    limits.header_timeout.as_millis()
                ),
            )
        } else {
            (
                at(self.idle_since.load(Ordering::Acquire)) + limits.idle_timeout,
                format!(
                    "no request came for {} ms (--http-idle-timeout-ms)",
                    limits.idle_timeout.as_millis()
                ),
            )
        };
        if std::time::Instant::now() >= deadline {
            Err(why)
        } else {
            Ok(Some(deadline))
        }
    }
}

/// A request in progress on its connection ([`Activity`]), until its
/// answer's body is done (hyper drops it).
struct Request(Arc<Activity>);

impl Request {
    fn began(activity: &Arc<Activity>) -> Request {
        use std::sync::atomic::Ordering;
        activity.requests.fetch_add(1, Ordering::AcqRel);
        activity.header_since.store(0, Ordering::Release);
        activity.changed.notify_one();
        Request(Arc::clone(activity))
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let activity = &self.0;
        activity.idle_since.store(activity.now(), Ordering::Release);
        // Bytes that came meanwhile were this request's (or a pipelined
        // one's, already read): the next header starts with the next byte.
        activity.header_since.store(0, Ordering::Release);
        activity.requests.fetch_sub(1, Ordering::AcqRel);
        activity.changed.notify_one();
    }
}

/// An answer's body, with its request's place (`Request`) until hyper
/// is done with it.
pub struct InFlight {
    body: metrics::Observed,
    _request: Request,
}

impl hyper::body::Body for InFlight {
    type Data = <metrics::Observed as hyper::body::Body>::Data;
    type Error = <metrics::Observed as hyper::body::Body>::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's stream, telling its [`Activity`] when bytes arrive.
struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Resolves, with why, once `activity`'s connection must close
/// ([`Activity::due`]).
async fn watchdog(activity: &Activity, limits: &HttpLimits) -> String {
    loop {
        let changed = activity.changed.notified();
        match activity.due(limits) {
            Err(why) => return why,
            Ok(Some(deadline)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline.into()) => {}
                    () = changed => {}
                }
            }
            Ok(None) => changed.await,
        }
    }
}

/// Serves one connection (plain TCP or TLS) until it closes, until its
/// time-outs close it ([`watchdog`]), or until the graceful shutdown lets
/// its request in progress finish.
async fn connection<I>(
    http: ConnBuilder<TokioExecutor>,
    io: I,
    service: WithPeer,
    watcher: Watcher,
    limits: &HttpLimits,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = service.peer;
    let activity = Arc::clone(&service.activity);
    let io = Watched {
        io,
        activity: Arc::clone(&activity),
    };
    let conn = watcher.watch(
        http.serve_connection(TokioIo::new(io), service)
            .into_owned(),
    );
    tokio::select! {
        served = conn => {
            if let Err(e) = served {
                // A connection that had sent no request when the drain began
                // is closed with this: nothing was refused.
                let drained = e
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::Interrupted);
                if !drained {
                    eprintln!("hipobj-s3-server: connection from {peer}: {e}");
                }
            }
        }
        why = watchdog(&activity, limits) => {
            eprintln!("hipobj-s3-server: connection from {peer} closed: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_under_a_domain_names_its_bucket_and_any_other_is_path_style() {
        use s3s::host::S3Host;
        let domains = Domains(vec!["gw.example".into(), "s3.local".into()]);
        let bucket = |host: &str| {
            domains
                .parse_host_header(host)
                .unwrap()
                .bucket()
                .map(str::to_owned)
        };
        assert_eq!(bucket("models.gw.example").as_deref(), Some("models"));
        assert_eq!(bucket("Models.GW.example:9000").as_deref(), Some("models"));
        assert_eq!(bucket("a.b.s3.local").as_deref(), Some("a.b"));
        for path_style in [
            "gw.example",
            "gw.example:9000",
            ".gw.example",
            "xgw.example",
            "localhost",
            "localhost:9000",
            "other.example.com",
            "[::1]:9000",
        ] {
            assert_eq!(bucket(path_style), None, "{path_style}");
        }
        assert_eq!(without_port("[::1]:9000"), "::1");
        assert_eq!(without_port("host:notaport"), "host:notaport");
    }

    /// An accepted connection sends as it writes: no answer waits for the
    /// client's delayed acknowledgement (`small_gets`'s `http_1B` cell: a
    /// 1-byte GET took 2.5 ms a GET with 16 in flight, 0.15 ms without).
    #[test]
    fn an_accepted_connection_has_nagle_s_algorithm_off() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (_client, accepted) =
                tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
            let (socket, peer) = accepted.unwrap();
            assert!(
                !socket.nodelay().unwrap(),
                "Nagle's algorithm on by default"
            );
            no_delay(&socket, peer);
            assert!(socket.nodelay().unwrap());
        });
    }

    #[test]
    fn an_error_body_gives_its_code_and_message_unescaped() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>\
            <Message>no &quot;a&lt;b&quot; &amp; more</Message></Error>";
        assert_eq!(
            s3_error(body),
            S3ErrorBody {
                code: "NoSuchKey".into(),
                message: "no \"a<b\" & more".into(),
            }
        );
        assert_eq!(s3_error(b""), S3ErrorBody::default());
        let odd = s3_error(b"<Code>Bad Code\n</Code><Message>line\nbreak</Message>");
        assert_eq!((odd.code.as_str(), odd.message.as_str()), ("", "linebreak"));
    }

    #[test]
    fn the_access_key_is_read_from_the_signature_and_never_more() {
        let request = |auth: Option<&str>, uri: &str| {
            let mut builder = http::Request::builder().uri(uri);
            if let Some(auth) = auth {
                builder = builder.header(http::header::AUTHORIZATION, auth);
            }
            builder.body(()).expect("a request")
        };
        let signed = request(
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240101/us-east-1/s3/aws4_request, \
                 SignedHeaders=host, Signature=0123abcd",
            ),
            "/b/k",
        );
        assert_eq!(access_key(&signed).as_deref(), Some("AKIDEXAMPLE"));
        let presigned = request(
            None,
            "/b/k?X-Amz-Credential=AKIDEXAMPLE%2F20240101%2Fus-east-1&X-Amz-Signature=0123",
        );
        assert_eq!(access_key(&presigned).as_deref(), Some("AKIDEXAMPLE"));
        let forged = request(Some("AWS4-HMAC-SHA256 Credential=a\tb c/x"), "/b/k");
        assert_eq!(access_key(&forged).as_deref(), Some("(malformed)"));
        assert_eq!(access_key(&request(None, "/b/k")), None);
    }
}
