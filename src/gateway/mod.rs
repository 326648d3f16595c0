//! The RDMA gateway behind `hipobj-s3-server`: an S3 server (s3s, SigV4
//! required) over a backend, that also serves hipobj clients: a GetObject,
//! PutObject or UploadPart carrying `x-amz-rdma-token` moves its payload by
//! RDMA through the server side of the protocol ([`crate::server`])
//! instead of the HTTP body.
//!
//! - [`cli`]: the settings, from the command line, a config file and the
//!   environment.
//! - [`backend`]: where objects live ([`backend::Backend`]): a directory
//!   of this machine ([`local`]).
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
pub mod metrics;
pub mod range;
pub mod rdma;
pub mod s3;
pub mod stream;
pub mod tls;

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

/// The S3 service, with each request's TCP peer put into its extensions
/// (the dial policy compares it with the address a token names); each
/// answer is counted ([`metrics`]) and one of 400 or more is logged.
#[derive(Clone)]
struct WithPeer {
    inner: s3s::service::S3Service,
    peer: SocketAddr,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for WithPeer {
    type Response = http::Response<metrics::Observed>;
    type Error = <s3s::service::S3Service as hyper::service::Service<
        http::Request<hyper::body::Incoming>,
    >>::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> Self::Future {
        req.extensions_mut().insert(s3::Peer(self.peer));
        let exchange = metrics::Exchange::begin(&req);
        let asked = Asked::of(&req, self.peer, exchange.op());
        let answer = hyper::service::Service::call(&self.inner, req);
        Box::pin(async move {
            match answer.await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let error = (status >= 400)
                        .then(|| s3_error(resp.body().bytes().as_deref().unwrap_or_default()));
                    // The RDMA paths log their own declines and refusals
                    // for now, with more to say (the token's address,
                    // the budget...).
                    let rdma_said = resp
                        .headers()
                        .get("x-amz-rdma-reply")
                        .is_some_and(|r| matches!(r.as_bytes(), b"501" | b"503"));
                    if let Some(error) = error.as_ref().filter(|_| !rdma_said) {
                        asked.log(status, error);
                    }
                    let code = error.as_ref().map(|e| e.code.as_str());
                    Ok(exchange.respond(resp, code))
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
    make_buckets(&options.root, &options.buckets)?;
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
    let backend = Arc::new(local::Local::open(&options.root)?);
    if rdma.is_ok() {
        metrics::rdma_limits(options.rdma_memory_bytes, options.rdma_max_requests);
    }
    let service = {
        let s3 = s3::RdmaS3::new(backend, rdma.clone(), options.region.clone());
        let mut builder = S3ServiceBuilder::new(s3);
        let mut auth = SimpleAuth::new();
        for c in &options.credentials {
            auth.register(c.access_key.clone(), c.secret_key.clone().into());
        }
        builder.set_auth(auth);
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
            Some(tokio::spawn(metrics::serve(listener, rdma.clone().ok())))
        }
        None => None,
    };
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
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
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        let service = WithPeer {
            inner: service.clone(),
            peer,
        };
        let (http, watcher) = (http.clone(), graceful.watcher());
        match &tls {
            None => {
                tokio::spawn(connection(http, socket, service, watcher));
            }
            Some(tls) => {
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(socket)).await {
                        Ok(Ok(stream)) => connection(http, stream, service, watcher).await,
                        Ok(Err(e)) => {
                            eprintln!("hipobj-s3-server: TLS handshake with {peer} failed: {e}")
                        }
                        Err(_) => eprintln!(
                            "hipobj-s3-server: TLS handshake with {peer} failed: no handshake \
                             in {HANDSHAKE_TIMEOUT:?}"
                        ),
                    }
                });
            }
        }
    }
    // Neither S3 nor the metrics take a connection from here on.
    drop(listener);
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

/// Serves one connection (plain TCP or TLS) until it closes, or until the
/// graceful shutdown lets its request in progress finish.
async fn connection<I>(http: ConnBuilder<TokioExecutor>, io: I, service: WithPeer, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = service.peer;
    let conn = http.serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        // A connection that had sent no request when the drain began is
        // closed with this: nothing was refused.
        let drained = e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::Interrupted);
        if !drained {
            eprintln!("hipobj-s3-server: connection from {peer}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
