//! The command line, and the config file that holds the same options.
//!
//! One parser reads both: the config file (`--config FILE`, TOML) is turned
//! into the option list the command line would give (`listen =
//! "0.0.0.0:9000"` is `--listen=0.0.0.0:9000`, `bucket = ["a", "b"]` is
//! `--bucket=a --bucket=b`, `no-rdma = true` is `--no-rdma=true`), so every
//! option works in both, with the same checks and messages. What the
//! command line gives overrides the file (a repeatable option given on
//! the command line replaces the file's list); the access key and the
//! secret key may also come from the environment, which comes between the
//! two, as the AWS tools order their sources.
//!
//! Secrets need never be on the command line, where every user of the
//! machine reads them (`ps`): the secret key comes from a file
//! (`--secret-key-file`), from `HIPOBJ_SECRET_KEY`, or from the config
//! file; more access keys from `--credentials-file`. `--secret-key` on the
//! command line still works, with a warning.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::gateway::rdma::MIN_CHUNKS;
use crate::gateway::upstream::Settings;

/// What `--help` prints.
pub const USAGE: &str = "\
usage: hipobj-s3-server --root DIR --listen ADDR:PORT [--config FILE]
                        [--access-key AK] [--secret-key-file PATH] [--credentials-file PATH]
                        [--tls-cert PEM --tls-key PEM] [--metrics-listen ADDR:PORT]
                        [--region REGION] [--bucket NAME]... [--device NAME] [--no-rdma]
                        [--rdma-timeout-ms N] [--rdma-connect-timeout-ms N]
                        [--delay-final-ms N] [--rdma-allow CIDR]...
                        [--rdma-max-bytes N] [--rdma-memory-bytes N] [--rdma-max-requests N]
                        [--rdma-max-connections N] [--rdma-max-connections-per-client N]
                        [--rdma-chunk-bytes N] [--rdma-chunks N] [--shutdown-grace-ms N]
                        [--http-header-timeout-ms N] [--http-idle-timeout-ms N]
                        [--http-max-connections N] [--http-max-connections-per-client N]
                        [--domain NAME]...
       hipobj-s3-server --upstream URL --listen ADDR:PORT [the options above but --bucket]
                        [--upstream-region REGION] [--upstream-profile NAME]
                        [--upstream-path-style | --upstream-virtual-hosted-style]
                        [--upstream-timeout-ms N] [--upstream-multipart-bytes N]
                        [--upstream-part-bytes N] [--cache-bytes N]
                        [--cache-max-object-bytes N] [--cache-validate always|ttl=SECONDS]
       hipobj-s3-server --help | --version

  --root DIR            where buckets and objects are stored (created if missing)
  --upstream URL        serve the buckets and objects of this S3 store instead (http:// or
                        https://, host, optional port: AWS, MinIO, Garage, Ceph RGW...); its
                        credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or
                        the shared config and credentials files (~/.aws), as the AWS tools
                        find them. Exclusive with --root
  --listen ADDR:PORT    S3 address; port 0 picks a free port
  --config FILE         a TOML file of these options, each named without its dashes
                        (listen = \"0.0.0.0:9000\", bucket = [\"a\", \"b\"], no-rdma = true);
                        the command line overrides it
  --access-key AK       the access key SigV4 requests are signed with (or HIPOBJ_ACCESS_KEY)
  --secret-key-file PATH
                        a file holding its secret key, one line (or HIPOBJ_SECRET_KEY)
  --secret-key SK       the secret key itself: on the command line, every user of the machine
                        sees it (ps); prefer the file, the environment or the config file
  --credentials-file PATH
                        more access keys (one per tenant, say): a line \"AK SK\" each; blank
                        lines and lines starting with # are skipped
  --tls-cert PEM        serve https: the certificate chain (PEM, the server's first)
  --tls-key PEM         the certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1)
  --metrics-listen ADDR:PORT
                        serve Prometheus metrics at http://ADDR:PORT/metrics
  --region REGION       the region requests must be signed for (default us-east-1)
  --bucket NAME         creates this bucket (a directory of the root) if missing; repeatable
  --device NAME         RDMA device (default: the first one with an active port)
  --no-rdma             decline every x-amz-rdma-token (501), as a server without RDMA
  --rdma-timeout-ms N   how long an RDMA transfer may go without progress: its dial and proof,
                        each chunk, its final message (default 10000)
  --rdma-connect-timeout-ms N
                        how long connecting to a client may take, within that deadline
                        (default 2000 on a hardware NIC; on a software one, Soft-RoCE or
                        siw, the deadline alone); a client whose RDMA CM does not answer
                        fails the transfer (500) after this long
  --delay-final-ms N    test knob: pause between the data and the final message (default 0)
  --rdma-allow CIDR     a network whose clients the server may connect to, besides the address
                        each request comes from (the fabric's subnet behind a load balancer);
                        repeatable
  --rdma-max-bytes N    the largest RDMA transfer served (default 5368709120, S3's largest PUT);
                        a longer token is declined (501)
  --rdma-memory-bytes N registered memory the transfers in progress may hold at once (default
                        1073741824, at least 12288): each transfer reserves all it holds (its
                        chunks' buffers) before it starts; one that finds no room waits its
                        turn, then fails (503 SlowDown) after --rdma-timeout-ms
  --rdma-chunk-bytes N  a transfer moves in chunks of at most N bytes, one registered buffer
                        each (default 8388608, or the largest buffer of which
                        --rdma-memory-bytes holds three if less): a GET's bytes are written to
                        the client as the backend gives them, a PUT's are handed to the backend
                        as they are read
  --rdma-chunks N       chunks one transfer holds at once (default 4, at least 3): its memory
                        is at most N x --rdma-chunk-bytes
  --rdma-max-requests N RDMA requests served at once (default 128); one more is answered 503
                        SlowDown at once. The runtime has N + 256 blocking threads: RDMA requests
                        hold at most N of them, the rest serve every request's file I/O
  --rdma-max-connections N
                        RDMA connections held at once, to all clients, dials in progress
                        included (default 4096)
  --rdma-max-connections-per-client N
                        RDMA connections held for one access key to one client address,
                        dials in progress included (default 1024)
  --shutdown-grace-ms N on SIGTERM or SIGINT, how long the requests in progress may take to
                        finish (default --rdma-timeout-ms + --delay-final-ms + 1000)
  --http-header-timeout-ms N
                        how long a request's header may take to arrive once its first byte
                        has (default 30000); then the connection is closed, and logged
  --http-idle-timeout-ms N
                        how long a connection may wait for its next request, and a new one
                        for its first byte (default 60000); then it is closed, and logged
  --http-max-connections N
                        S3 connections open at once, TLS handshakes included (default 4096);
                        one more is closed at once, and logged
  --http-max-connections-per-client N
                        S3 connections open at once from one client address (default 1024;
                        behind a balancer, the balancer is that one client)
  --domain NAME         serve virtual-hosted-style requests for NAME: a request to
                        BUCKET.NAME addresses BUCKET (and one to NAME is path-style);
                        repeatable. Without it every request is path-style: no Host is
                        taken for a bucket
  --version             print the version and what the build holds
  --upstream-region REGION
                        the region requests to the upstream are signed for (--region by default)
  --upstream-profile NAME
                        the profile of the shared config and credentials files to take the
                        upstream's credentials from (default: AWS_PROFILE, else default)
  --upstream-path-style addresses the upstream as URL/BUCKET/KEY (the default: self-hosted
                        stores such as MinIO, Garage and Ceph RGW expect it)
  --upstream-virtual-hosted-style
                        addresses the upstream as BUCKET.HOST/KEY (AWS's preferred style)
  --upstream-timeout-ms N
                        how long the gateway waits for the upstream at one stretch: to
                        connect, to take the next piece of a body, to answer, to send the next
                        piece of an object (default 30000; ten times that for CopyObject,
                        UploadPartCopy and CompleteMultipartUpload); then 503
  --upstream-multipart-bytes N
                        the largest PutObject sent on as one streamed request (default and at
                        most 5368709120, S3's largest, so that its ETag stays the body's MD5);
                        a larger one (or one of unknown length) goes as a multipart upload,
                        whose ETag is not an MD5, aborted if anything fails
  --upstream-part-bytes N
                        the part size of those uploads (default 16777216, 5242880 to
                        5368709120); larger where the object needs more than 10000 parts
  --cache-bytes N       keep whole objects read through the gateway in N bytes of memory
                        and serve them from there (default: no cache); concurrent reads of
                        one object cost the store one GET; a write through the gateway drops
                        the object at once
  --cache-max-object-bytes N
                        the largest object kept (default: a quarter of the cache)
  --cache-validate always|ttl=SECONDS
                        always (the default): ask the store for the object's ETag before
                        each hit; ttl=N: trust an entry N seconds after it was filled or
                        checked, HEADs answered from it too (a change made behind the
                        gateway may be served stale that long; none made through it is)
  --cache-dir DIR       keep every object the cache keeps in a file of DIR too, read from
                        there when memory no longer holds it and after a restart; each file
                        checked against its CRC64/NVME before use (one that fails is deleted
                        and the object read from the store); needs --cache-dir-bytes
  --cache-dir-bytes N   the bytes the files in --cache-dir may take
";

/// What a bad command line prints after its error, instead of [`USAGE`].
pub const SHORT_USAGE: &str =
    "usage: hipobj-s3-server --root DIR --listen ADDR:PORT [--config FILE] [OPTION]... \
     (or --upstream URL instead of --root); --help for all options";

/// The environment variable holding the access key of the server's own
/// clients. Not `AWS_ACCESS_KEY_ID`: a backend in front of another store
/// reads the AWS variables as its own credentials for that store.
pub const ACCESS_KEY_ENV: &str = "HIPOBJ_ACCESS_KEY";
/// The environment variable holding that access key's secret key.
pub const SECRET_KEY_ENV: &str = "HIPOBJ_SECRET_KEY";

/// The s3s version this server is built on (Cargo.toml pins it; a unit
/// test keeps the two equal).
const S3S_VERSION: &str = "0.14.1";

/// What `--version` prints: the crate's version and what the build holds.
pub fn version() -> String {
    format!(
        "hipobj-s3-server {} (rdma, s3s {S3S_VERSION}, tls: rustls 0.23 with ring, \
         metrics: prometheus-client 0.26)",
        env!("CARGO_PKG_VERSION")
    )
}

/// How an option takes its value; the config file's values are checked
/// against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// No value on the command line (`--no-rdma`, or `--no-rdma=true|false`);
    /// `true` or `false` in the file.
    Flag,
    /// One value: a string or a whole number in the file.
    Value,
    /// A value each time it is given: an array in the file.
    Repeated,
}

/// Every option the config file may hold, with how it takes its value.
/// An option added to the parser (`apply`) and to [`USAGE`] goes here too
/// (a unit test compares the three).
const OPTIONS: &[(&str, Kind)] = &[
    ("--root", Kind::Value),
    ("--listen", Kind::Value),
    ("--access-key", Kind::Value),
    ("--secret-key", Kind::Value),
    ("--secret-key-file", Kind::Value),
    ("--credentials-file", Kind::Value),
    ("--tls-cert", Kind::Value),
    ("--tls-key", Kind::Value),
    ("--metrics-listen", Kind::Value),
    ("--region", Kind::Value),
    ("--bucket", Kind::Repeated),
    ("--device", Kind::Value),
    ("--no-rdma", Kind::Flag),
    ("--rdma-timeout-ms", Kind::Value),
    ("--rdma-connect-timeout-ms", Kind::Value),
    ("--delay-final-ms", Kind::Value),
    ("--rdma-allow", Kind::Repeated),
    ("--rdma-max-bytes", Kind::Value),
    ("--rdma-memory-bytes", Kind::Value),
    ("--rdma-max-requests", Kind::Value),
    ("--rdma-max-connections", Kind::Value),
    ("--rdma-max-connections-per-client", Kind::Value),
    ("--rdma-chunk-bytes", Kind::Value),
    ("--rdma-chunks", Kind::Value),
    ("--shutdown-grace-ms", Kind::Value),
    ("--http-header-timeout-ms", Kind::Value),
    ("--http-idle-timeout-ms", Kind::Value),
    ("--http-max-connections", Kind::Value),
    ("--http-max-connections-per-client", Kind::Value),
    ("--domain", Kind::Repeated),
    ("--upstream", Kind::Value),
    ("--upstream-region", Kind::Value),
    ("--upstream-profile", Kind::Value),
    ("--upstream-path-style", Kind::Flag),
    ("--upstream-virtual-hosted-style", Kind::Flag),
    ("--upstream-timeout-ms", Kind::Value),
    ("--upstream-multipart-bytes", Kind::Value),
    ("--upstream-part-bytes", Kind::Value),
    ("--cache-bytes", Kind::Value),
    ("--cache-max-object-bytes", Kind::Value),
    ("--cache-validate", Kind::Value),
    ("--cache-dir", Kind::Value),
    ("--cache-dir-bytes", Kind::Value),
];

/// An access key requests may be signed with, and its secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The access key.
    pub access_key: String,
    /// Its secret key.
    pub secret_key: String,
}

impl std::fmt::Debug for Credential {
    /// The access key only: settings are printed in messages and logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// `--tls-cert` and `--tls-key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    /// The certificate chain's PEM file.
    pub cert: PathBuf,
    /// The private key's PEM file.
    pub key: PathBuf,
}

/// The server's settings.
#[derive(Debug)]
pub struct Options {
    /// `--root`; `None` with `--upstream`.
    pub root: Option<PathBuf>,
    /// `--upstream` and its options; `None` with `--root`.
    pub upstream: Option<Settings>,
    /// `--listen`.
    pub listen: SocketAddr,
    /// The access keys and their secret keys: `--access-key`'s (from
    /// wherever its secret key came) first, then `--credentials-file`'s.
    pub credentials: Vec<Credential>,
    /// `--tls-cert` and `--tls-key`: https, else plain http.
    pub tls: Option<Tls>,
    /// `--metrics-listen`.
    pub metrics_listen: Option<SocketAddr>,
    /// `--region`.
    pub region: String,
    /// `--bucket`, each.
    pub buckets: Vec<String>,
    /// `--device`.
    pub device: Option<String>,
    /// `--no-rdma`.
    pub no_rdma: bool,
    /// `--rdma-timeout-ms`.
    pub rdma_timeout: Duration,
    /// `--rdma-connect-timeout-ms` (`None`: by device).
    pub rdma_connect_timeout: Option<Duration>,
    /// `--delay-final-ms`.
    pub delay_final: Duration,
    /// `--rdma-allow`, each.
    pub rdma_allow: Vec<ipnet::IpNet>,
    /// `--rdma-max-bytes`.
    pub rdma_max_bytes: u64,
    /// `--rdma-memory-bytes`.
    pub rdma_memory_bytes: u64,
    /// `--rdma-max-requests`.
    pub rdma_max_requests: usize,
    /// `--rdma-max-connections`.
    pub rdma_max_connections: usize,
    /// `--rdma-max-connections-per-client`.
    pub rdma_max_connections_per_client: usize,
    /// `--rdma-chunk-bytes`.
    pub rdma_chunk_bytes: usize,
    /// `--rdma-chunks`.
    pub rdma_chunks: usize,
    /// `--shutdown-grace-ms`, or its default.
    pub shutdown_grace: Duration,
    /// `--http-header-timeout-ms`, `--http-idle-timeout-ms`,
    /// `--http-max-connections`, `--http-max-connections-per-client`.
    pub http: crate::gateway::HttpLimits,
    /// `--domain`, each.
    pub domains: Vec<String>,
}

impl Options {
    /// What the server's RDMA may do.
    pub fn limits(&self) -> crate::gateway::rdma::Limits {
        crate::gateway::rdma::Limits {
            allow: self.rdma_allow.clone(),
            max_bytes: self.rdma_max_bytes,
            memory_bytes: self.rdma_memory_bytes,
            max_connections: self.rdma_max_connections,
            max_connections_per_client: self.rdma_max_connections_per_client,
            max_requests: self.rdma_max_requests,
            connect_timeout: self.rdma_connect_timeout,
            chunk_bytes: self.rdma_chunk_bytes,
            chunks: self.rdma_chunks,
            backend_timeout: self
                .upstream
                .as_ref()
                .map_or(self.rdma_timeout, |upstream| upstream.timeout),
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Serve with these settings, after printing the warnings (each a
    /// sentence, on standard error).
    Run {
        /// The settings (boxed: the other variants are empty).
        options: Box<Options>,
        /// What is allowed but unsafe: a secret on the command line or in
        /// a file others may read, S3 in clear text on a network.
        warnings: Vec<String>,
    },
    /// `--help`.
    Help,
    /// `--version`.
    Version,
}

/// Parses the arguments (without the program name), the config file they
/// name, and the environment's secrets (`env` looks a variable up). An
/// error is a sentence naming the option, key or file at fault.
pub fn command(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Command, String> {
    let mut given = Given::new(Source::CommandLine);
    match apply(&mut given, args)? {
        Flow::Help => return Ok(Command::Help),
        Flow::Version => return Ok(Command::Version),
        Flow::Go => {}
    }
    if let Some(path) = given.config.clone() {
        // The file first, then the command line again over it.
        let from_file = file_args(&path)?;
        given = Given::new(Source::File);
        apply(&mut given, &from_file).map_err(|e| format!("{}: {e}", path.display()))?;
        given.source = Source::CommandLine;
        apply(&mut given, args)?;
    }
    let mut warnings = Vec::new();
    let options = finish(given, env, &mut warnings)?;
    Ok(Command::Run {
        options: Box::new(options),
        warnings,
    })
}

/// [`command`] without an environment: the settings, or `None` for
/// `--help` or `--version`.
pub fn parse(args: &[String]) -> Result<Option<Options>, String> {
    match command(args, &|_| None)? {
        Command::Run { options, .. } => Ok(Some(*options)),
        Command::Help | Command::Version => Ok(None),
    }
}

/// Where a value was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The config file.
    File,
    /// The command line.
    CommandLine,
}

/// A secret key as given: the key itself, or the file holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Secret {
    /// `--secret-key`, `secret-key` or `HIPOBJ_SECRET_KEY`.
    Key(String),
    /// `--secret-key-file`.
    File(PathBuf),
}

/// The values of a repeatable option, and where they were given: the
/// command line's replace the file's.
#[derive(Debug)]
struct Listed<T> {
    items: Vec<T>,
    from: Option<Source>,
}

impl<T> Listed<T> {
    fn new() -> Listed<T> {
        Listed {
            items: Vec::new(),
            from: None,
        }
    }

    fn push(&mut self, from: Source, item: T) {
        if self.from != Some(from) {
            self.items.clear();
            self.from = Some(from);
        }
        self.items.push(item);
    }
}

/// What the arguments gave, before the environment and the checks that
/// span several options.
struct Given {
    /// Where the arguments being applied come from.
    source: Source,
    config: Option<PathBuf>,
    root: Option<PathBuf>,
    listen: Option<SocketAddr>,
    access_key: Option<(String, Source)>,
    secret: Option<(Secret, Source)>,
    credentials_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    metrics_listen: Option<SocketAddr>,
    region: String,
    buckets: Listed<String>,
    device: Option<String>,
    no_rdma: bool,
    rdma_timeout: Duration,
    rdma_connect_timeout: Option<Duration>,
    delay_final: Duration,
    rdma_allow: Listed<ipnet::IpNet>,
    rdma_max_bytes: Option<u64>,
    rdma_memory_bytes: u64,
    rdma_max_requests: usize,
    rdma_max_connections: usize,
    rdma_max_connections_per_client: usize,
    rdma_chunk_bytes: Option<usize>,
    rdma_chunks: usize,
    shutdown_grace: Option<Duration>,
    http: crate::gateway::HttpLimits,
    domains: Listed<String>,
    upstream: UpstreamArgs,
}

impl Given {
    /// The defaults.
    fn new(source: Source) -> Given {
        Given {
            source,
            config: None,
            root: None,
            listen: None,
            access_key: None,
            secret: None,
            credentials_file: None,
            tls_cert: None,
            tls_key: None,
            metrics_listen: None,
            region: "us-east-1".to_owned(),
            buckets: Listed::new(),
            device: None,
            no_rdma: false,
            rdma_timeout: Duration::from_millis(10_000),
            rdma_connect_timeout: None,
            delay_final: Duration::ZERO,
            rdma_allow: Listed::new(),
            rdma_max_bytes: None,
            rdma_memory_bytes: 1 << 30,
            rdma_max_requests: 128,
            rdma_max_connections: 4096,
            rdma_max_connections_per_client: 1024,
            rdma_chunk_bytes: None,
            rdma_chunks: 4,
            shutdown_grace: None,
            http: crate::gateway::HttpLimits::default(),
            domains: Listed::new(),
            upstream: UpstreamArgs::default(),
        }
    }

    /// `--secret-key` or `--secret-key-file`: one of the two in each
    /// source.
    fn set_secret(&mut self, secret: Secret) -> Result<(), String> {
        if let Some((old, from)) = &self.secret {
            if *from == self.source
                && std::mem::discriminant(old) != std::mem::discriminant(&secret)
            {
                return Err("--secret-key and --secret-key-file both given: give one".into());
            }
        }
        self.secret = Some((secret, self.source));
        Ok(())
    }
}

/// What the arguments ask for besides settings.
enum Flow {
    Go,
    Help,
    Version,
}

/// Applies the arguments to `g`. Options take their value as the next
/// argument or after `=`; a flag takes none, or `=true`/`=false`.
fn apply(g: &mut Given, args: &[String]) -> Result<Flow, String> {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or(format!("{name} needs a value")),
            }
        };
        let source = g.source;
        match name {
            "--help" | "-h" => return Ok(Flow::Help),
            "--version" | "-V" => return Ok(Flow::Version),
            "--config" => g.config = Some(PathBuf::from(value()?)),
            "--root" => g.root = Some(PathBuf::from(value()?)),
            "--listen" => g.listen = Some(address(name, &value()?)?),
            "--access-key" => g.access_key = Some((value()?, source)),
            "--secret-key" => g.set_secret(Secret::Key(value()?))?,
            "--secret-key-file" => g.set_secret(Secret::File(PathBuf::from(value()?)))?,
            "--credentials-file" => g.credentials_file = Some(PathBuf::from(value()?)),
            "--tls-cert" => g.tls_cert = Some(PathBuf::from(value()?)),
            "--tls-key" => g.tls_key = Some(PathBuf::from(value()?)),
            "--metrics-listen" => g.metrics_listen = Some(address(name, &value()?)?),
            "--region" => g.region = value()?,
            "--bucket" => g.buckets.push(source, bucket_name(value()?)?),
            "--device" => g.device = Some(value()?),
            "--no-rdma" => g.no_rdma = flag(name, inline.as_deref())?,
            "--rdma-timeout-ms" => g.rdma_timeout = millis(name, &value()?, 1)?,
            "--rdma-connect-timeout-ms" => {
                g.rdma_connect_timeout = Some(millis(name, &value()?, 1)?)
            }
            "--delay-final-ms" => g.delay_final = millis(name, &value()?, 0)?,
            "--rdma-allow" => {
                let v = value()?;
                let net = v
                    .parse::<ipnet::IpNet>()
                    .map_err(|e| format!("--rdma-allow {v}: {e} (expected ADDR/PREFIX)"))?;
                g.rdma_allow.push(source, net);
            }
            "--rdma-max-bytes" => g.rdma_max_bytes = Some(count(name, &value()?)?),
            "--rdma-memory-bytes" => g.rdma_memory_bytes = count(name, &value()?)?,
            "--rdma-max-requests" => g.rdma_max_requests = count(name, &value()?)?,
            "--rdma-max-connections" => g.rdma_max_connections = count(name, &value()?)?,
            "--rdma-max-connections-per-client" => {
                g.rdma_max_connections_per_client = count(name, &value()?)?
            }
            "--rdma-chunk-bytes" => g.rdma_chunk_bytes = Some(count(name, &value()?)?),
            "--rdma-chunks" => {
                g.rdma_chunks = count(name, &value()?)?;
                if g.rdma_chunks < MIN_CHUNKS {
                    return Err(format!(
                        "--rdma-chunks {}: at least {MIN_CHUNKS} (a PUT keeps its last chunk \
                         until the bytes' checksum is checked, an upstream keeps one more until \
                         it knows the body goes on, and one must be free to go on)",
                        g.rdma_chunks
                    ));
                }
            }
            "--shutdown-grace-ms" => g.shutdown_grace = Some(millis(name, &value()?, 0)?),
            "--http-header-timeout-ms" => g.http.header_timeout = millis(name, &value()?, 1)?,
            "--http-idle-timeout-ms" => g.http.idle_timeout = millis(name, &value()?, 1)?,
            "--http-max-connections" => g.http.max_connections = count(name, &value()?)?,
            "--http-max-connections-per-client" => {
                g.http.max_connections_per_client = count(name, &value()?)?
            }
            "--domain" => g.domains.push(source, domain_name(&value()?)?),
            "--upstream" => g.upstream.endpoint = Some(endpoint(&value()?)?),
            "--upstream-region" => g.upstream.region = Some(value()?),
            "--upstream-profile" => g.upstream.profile = Some(value()?),
            "--upstream-path-style" => {
                let path = flag(name, inline.as_deref())?;
                g.upstream.style(name, path)?;
            }
            "--upstream-virtual-hosted-style" => {
                let path = !flag(name, inline.as_deref())?;
                g.upstream.style(name, path)?;
            }
            "--upstream-timeout-ms" => g.upstream.timeout = Some(millis(name, &value()?, 1)?),
            "--upstream-multipart-bytes" => {
                g.upstream.multipart_bytes = Some(count(name, &value()?)?)
            }
            "--upstream-part-bytes" => g.upstream.part_bytes = Some(count(name, &value()?)?),
            "--cache-bytes" => g.upstream.cache_bytes = Some(count(name, &value()?)?),
            "--cache-max-object-bytes" => {
                g.upstream.cache_max_object_bytes = Some(count(name, &value()?)?)
            }
            "--cache-validate" => {
                g.upstream.cache_validate = Some(crate::gateway::cache::Validate::parse(&value()?)?)
            }
            "--cache-dir" => g.upstream.cache_dir = Some(PathBuf::from(value()?)),
            "--cache-dir-bytes" => g.upstream.cache_dir_bytes = Some(count(name, &value()?)?),
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    Ok(Flow::Go)
}

/// The config file as the arguments the command line would give: each key
/// is an option of [`OPTIONS`] without its dashes.
fn file_args(path: &Path) -> Result<Vec<String>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the config file {shown}: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("the config file {shown} is not TOML: {e}"))?;
    let mut args = Vec::new();
    for (key, value) in &table {
        let name = format!("--{key}");
        let Some(&(_, kind)) = OPTIONS.iter().find(|(option, _)| *option == name) else {
            return Err(format!(
                "the config file {shown}: unknown key {key:?} (its keys are the options of \
                 --help without their dashes; config, help and version are not among them)"
            ));
        };
        // Values are never echoed: one may be a secret key.
        let scalar = |v: &toml::Value| match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(n) => Ok(n.to_string()),
            other => Err(format!(
                "the config file {shown}: {key} is {} {}: expected a string or a whole number",
                article(other.type_str()),
                other.type_str()
            )),
        };
        match (kind, value) {
            (Kind::Flag, toml::Value::Boolean(b)) => args.push(format!("{name}={b}")),
            (Kind::Flag, other) => {
                return Err(format!(
                    "the config file {shown}: {key} is {} {}: expected true or false",
                    article(other.type_str()),
                    other.type_str()
                ))
            }
            (Kind::Repeated, toml::Value::Array(items)) => {
                for item in items {
                    args.push(format!("{name}={}", scalar(item)?));
                }
            }
            (Kind::Value | Kind::Repeated, value) => {
                args.push(format!("{name}={}", scalar(value)?))
            }
        }
    }
    Ok(args)
}

/// "a" or "an" before a TOML type's name.
fn article(type_name: &str) -> &'static str {
    if type_name.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Where a value in effect came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    CommandLine,
    Environment,
    File,
}

/// The command line's value, else the environment's, else the file's.
fn pick<T>(given: Option<(T, Source)>, env: Option<T>) -> Option<(T, Origin)> {
    match (given, env) {
        (Some((v, Source::CommandLine)), _) => Some((v, Origin::CommandLine)),
        (_, Some(v)) => Some((v, Origin::Environment)),
        (Some((v, Source::File)), None) => Some((v, Origin::File)),
        (None, None) => None,
    }
}

/// The settings from what was given, the environment's keys and the
/// files of secrets; what is unsafe goes to `warnings`.
fn finish(
    g: Given,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<Options, String> {
    let missing = |what: &str| format!("{what} is required");
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let access_key = pick(g.access_key, env(ACCESS_KEY_ENV));
    let secret = pick(g.secret, env(SECRET_KEY_ENV).map(Secret::Key));
    let secret_key = match secret {
        None => None,
        Some((Secret::Key(key), origin)) => {
            match origin {
                Origin::CommandLine => warnings.push(format!(
                    "--secret-key on the command line is visible to every user of this machine \
                     (ps, /proc/PID/cmdline): use --secret-key-file, {SECRET_KEY_ENV} or the \
                     config file instead"
                )),
                Origin::File => {
                    if let Some(config) = &g.config {
                        warnings.extend(readable_by_others(
                            config,
                            "the config file, which holds secret-key,",
                        ));
                    }
                }
                Origin::Environment => {}
            }
            Some(key)
        }
        Some((Secret::File(path), _)) => {
            warnings.extend(readable_by_others(&path, "the secret key file"));
            Some(read_secret(&path)?)
        }
    };
    let mut credentials = Vec::new();
    match (access_key, secret_key) {
        (Some((access_key, _)), Some(secret_key)) => credentials.push(Credential {
            access_key,
            secret_key,
        }),
        (Some(_), None) => {
            return Err(format!(
                "--access-key has no secret key: give --secret-key-file PATH, {SECRET_KEY_ENV} \
                 in the environment, or secret-key-file in the config file"
            ))
        }
        (None, Some(_)) => {
            return Err(format!(
                "a secret key without its access key: give --access-key (or {ACCESS_KEY_ENV})"
            ))
        }
        (None, None) => {}
    }
    if let Some(path) = &g.credentials_file {
        warnings.extend(readable_by_others(path, "the credentials file"));
        for credential in read_credentials(path)? {
            if credentials
                .iter()
                .any(|c| c.access_key == credential.access_key)
            {
                return Err(format!(
                    "access key {} is given twice ({} holds it again)",
                    credential.access_key,
                    path.display()
                ));
            }
            credentials.push(credential);
        }
    }
    if credentials.is_empty() {
        return Err(format!(
            "--access-key is required, with its secret key (--secret-key-file, \
             {SECRET_KEY_ENV}, or the config file), or --credentials-file"
        ));
    }
    if credentials
        .iter()
        .any(|c| c.access_key.is_empty() || c.secret_key.is_empty())
    {
        return Err("--access-key and --secret-key must not be empty".into());
    }
    let tls = match (g.tls_cert, g.tls_key) {
        (Some(cert), Some(key)) => {
            warnings.extend(readable_by_others(&key, "the TLS private key"));
            Some(Tls { cert, key })
        }
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together: give both, or neither".into()),
    };
    let listen = g.listen.ok_or_else(|| missing("--listen"))?;
    if tls.is_none() && !listen.ip().is_loopback() {
        warnings.push(format!(
            "--listen {listen} without --tls-cert: S3 requests, their signatures and the \
             objects' bytes sent over HTTP cross the network in clear text (a signed request \
             can be replayed for 15 minutes); give --tls-cert and --tls-key, or listen on \
             127.0.0.1 behind a TLS proxy"
        ));
    }
    let rdma_chunk_bytes = chunk_bytes(g.rdma_chunk_bytes, g.rdma_memory_bytes)?;
    let rdma_max_bytes = g.rdma_max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if g.rdma_max_requests > MAX_REQUESTS {
        return Err(format!(
            "--rdma-max-requests {}: at most {MAX_REQUESTS}",
            g.rdma_max_requests
        ));
    }
    let shutdown_grace = g
        .shutdown_grace
        .unwrap_or(g.rdma_timeout + g.delay_final + Duration::from_secs(1));
    let upstream = g.upstream.settings(&g.region)?;
    let root = match (g.root, &upstream) {
        (Some(_), Some(_)) => {
            return Err(
                "--root and --upstream are exclusive: the server serves either a \
                        directory of this machine (--root) or another S3 store (--upstream)"
                    .into(),
            )
        }
        (None, None) => return Err("--root or --upstream is required".into()),
        (root, _) => root,
    };
    if upstream.is_some() && !g.buckets.items.is_empty() {
        return Err(
            "--bucket creates directories of --root; with --upstream, create buckets in the \
             upstream store (or through this server: CreateBucket)"
                .into(),
        );
    }
    Ok(Options {
        root,
        upstream,
        listen,
        credentials,
        tls,
        metrics_listen: g.metrics_listen,
        region: g.region,
        buckets: g.buckets.items,
        device: g.device,
        no_rdma: g.no_rdma,
        rdma_timeout: g.rdma_timeout,
        rdma_connect_timeout: g.rdma_connect_timeout,
        delay_final: g.delay_final,
        rdma_allow: g.rdma_allow.items,
        rdma_max_bytes,
        rdma_memory_bytes: g.rdma_memory_bytes,
        rdma_max_requests: g.rdma_max_requests,
        rdma_max_connections: g.rdma_max_connections,
        rdma_max_connections_per_client: g.rdma_max_connections_per_client,
        rdma_chunk_bytes,
        rdma_chunks: g.rdma_chunks,
        shutdown_grace,
        http: g.http,
        domains: g.domains.items,
    })
}

/// A `--domain`: a DNS name (letters, digits, hyphens, dots), lowercased;
/// no port (a request's port is not part of its bucket's name).
fn domain_name(text: &str) -> Result<String, String> {
    let name = text.trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "--domain {text}: expected a DNS name (gw.example.com), without a port"
        ));
    }
    Ok(name)
}

/// A warning if `path`, which holds a secret, may be read by users other
/// than its owner. (A warning, not a refusal: mounted secrets, such as
/// Kubernetes', are often 0644 inside a directory only the service sees.)
fn readable_by_others(path: &Path, what: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & 0o044 != 0).then(|| {
        format!(
            "{what} {} can be read by other users (mode {mode:04o}): chmod 600 it",
            path.display()
        )
    })
}

/// The secret key in `path`: its one line, without the newline ending it.
fn read_secret(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the secret key file {shown}: {e}"))?;
    let key = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if key.is_empty() {
        return Err(format!("the secret key file {shown} is empty"));
    }
    if key.contains(['\n', '\r']) {
        return Err(format!(
            "the secret key file {shown} holds more than one line: it must hold the secret key \
             alone"
        ));
    }
    Ok(key.to_owned())
}

/// The access keys in a credentials file: `AK SK` a line, blank lines and
/// `#` comments skipped. A bad line is named by its number, never shown.
fn read_credentials(path: &Path) -> Result<Vec<Credential>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the credentials file {shown}: {e}"))?;
    let mut credentials: Vec<Credential> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(access_key), Some(secret_key), None) = (words.next(), words.next(), words.next())
        else {
            return Err(format!(
                "the credentials file {shown}, line {}: expected an access key and its secret \
                 key, separated by spaces",
                i + 1
            ));
        };
        if credentials.iter().any(|c| c.access_key == access_key) {
            return Err(format!(
                "the credentials file {shown}, line {}: access key {access_key} is given twice",
                i + 1
            ));
        }
        credentials.push(Credential {
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
        });
    }
    if credentials.is_empty() {
        return Err(format!("the credentials file {shown} holds no access key"));
    }
    Ok(credentials)
}

/// `IP:PORT`.
fn address(name: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>()
        .map_err(|e| format!("{name} {text}: {e} (expected IP:PORT)"))
}

/// A flag: given alone, or `=true`/`=false` (as the config file gives it).
fn flag(name: &str, inline: Option<&str>) -> Result<bool, String> {
    match inline {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(format!(
            "{name}={other}: a flag takes no value, or true or false"
        )),
    }
}

/// The `--upstream` options as given.
#[derive(Default)]
struct UpstreamArgs {
    endpoint: Option<String>,
    region: Option<String>,
    profile: Option<String>,
    /// `--upstream-path-style` (true) or `--upstream-virtual-hosted-style`
    /// (false), and which.
    path_style: Option<(bool, String)>,
    timeout: Option<Duration>,
    multipart_bytes: Option<u64>,
    part_bytes: Option<u64>,
    cache_bytes: Option<u64>,
    cache_max_object_bytes: Option<u64>,
    cache_validate: Option<crate::gateway::cache::Validate>,
    cache_dir: Option<PathBuf>,
    cache_dir_bytes: Option<u64>,
}

impl UpstreamArgs {
    fn style(&mut self, name: &str, path: bool) -> Result<(), String> {
        match &self.path_style {
            Some((other, given)) if *other != path => {
                Err(format!("{given} and {name} are exclusive"))
            }
            _ => {
                self.path_style = Some((path, name.to_owned()));
                Ok(())
            }
        }
    }

    /// The settings, if `--upstream` was given; its options without it are
    /// refused, as are sizes outside S3's limits.
    fn settings(self, region: &str) -> Result<Option<Settings>, String> {
        use crate::gateway::upstream::{
            DEFAULT_MULTIPART_BYTES, DEFAULT_PART_BYTES, DEFAULT_TIMEOUT, MAX_PART_BYTES,
            MIN_PART_BYTES,
        };
        let Some(endpoint) = self.endpoint else {
            let given = [
                ("--upstream-region", self.region.is_some()),
                ("--upstream-profile", self.profile.is_some()),
                ("--upstream-path-style", self.path_style.is_some()),
                ("--upstream-timeout-ms", self.timeout.is_some()),
                ("--upstream-multipart-bytes", self.multipart_bytes.is_some()),
                ("--upstream-part-bytes", self.part_bytes.is_some()),
                ("--cache-bytes", self.cache_bytes.is_some()),
                (
                    "--cache-max-object-bytes",
                    self.cache_max_object_bytes.is_some(),
                ),
                ("--cache-validate", self.cache_validate.is_some()),
                ("--cache-dir", self.cache_dir.is_some()),
                ("--cache-dir-bytes", self.cache_dir_bytes.is_some()),
            ];
            return match given.iter().find(|(_, given)| *given) {
                Some((name, _)) => Err(format!("{name} applies to --upstream only")),
                None => Ok(None),
            };
        };
        let multipart_bytes = self.multipart_bytes.unwrap_or(DEFAULT_MULTIPART_BYTES);
        if multipart_bytes > MAX_PART_BYTES {
            return Err(format!(
                "--upstream-multipart-bytes {multipart_bytes}: at most {MAX_PART_BYTES} \
                 (S3's largest PutObject)"
            ));
        }
        let part_bytes = self.part_bytes.unwrap_or(DEFAULT_PART_BYTES);
        if !(MIN_PART_BYTES..=MAX_PART_BYTES).contains(&part_bytes) {
            return Err(format!(
                "--upstream-part-bytes {part_bytes}: S3's parts are {MIN_PART_BYTES} to \
                 {MAX_PART_BYTES} bytes"
            ));
        }
        let cache = match self.cache_bytes.unwrap_or(0) {
            0 => {
                let given = [
                    (
                        "--cache-max-object-bytes",
                        self.cache_max_object_bytes.is_some(),
                    ),
                    ("--cache-validate", self.cache_validate.is_some()),
                    ("--cache-dir", self.cache_dir.is_some()),
                    ("--cache-dir-bytes", self.cache_dir_bytes.is_some()),
                ];
                if let Some((name, _)) = given.iter().find(|(_, given)| *given) {
                    return Err(format!("{name} applies to a cache: give --cache-bytes too"));
                }
                None
            }
            bytes => {
                let max_object_bytes = self.cache_max_object_bytes.unwrap_or((bytes / 4).max(1));
                if max_object_bytes == 0 || max_object_bytes > bytes {
                    return Err(format!(
                        "--cache-max-object-bytes {max_object_bytes}: 1 to --cache-bytes ({bytes})"
                    ));
                }
                let disk = match (self.cache_dir, self.cache_dir_bytes) {
                    (Some(dir), Some(bytes)) if bytes > 0 => {
                        Some(crate::gateway::cache::DiskSettings { dir, bytes })
                    }
                    (Some(_), Some(_)) => return Err("--cache-dir-bytes: at least 1".to_owned()),
                    (Some(dir), None) => {
                        return Err(format!(
                            "--cache-dir {}: give --cache-dir-bytes too (the disk tier is bounded)",
                            dir.display()
                        ))
                    }
                    (None, Some(_)) => {
                        return Err("--cache-dir-bytes applies to a --cache-dir".to_owned())
                    }
                    (None, None) => None,
                };
                Some(crate::gateway::cache::Settings {
                    bytes,
                    max_object_bytes,
                    validate: self
                        .cache_validate
                        .unwrap_or(crate::gateway::cache::Validate::Always),
                    disk,
                })
            }
        };
        Ok(Some(Settings {
            endpoint,
            region: self.region.unwrap_or_else(|| region.to_owned()),
            profile: self.profile,
            path_style: self.path_style.is_none_or(|(path, _)| path),
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            multipart_bytes,
            part_bytes,
            cache,
        }))
    }
}

/// An `--upstream` URL: `http://` or `https://`, a host, an optional port,
/// nothing after (a trailing `/` is dropped).
fn endpoint(text: &str) -> Result<String, String> {
    let bad = |why: &str| {
        format!("--upstream {text}: {why} (expected http://HOST[:PORT] or https://HOST[:PORT])")
    };
    let uri: http::Uri = text.parse().map_err(|e| bad(&format!("{e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("not http or https"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err(bad("a path or query"));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// The most RDMA requests served at once: each may hold a blocking thread,
/// and tokio's pool takes at most a few thousand.
const MAX_REQUESTS: usize = 4096;

/// The longest RDMA transfer served unless `--rdma-max-bytes` says:
/// S3's largest PUT.
const DEFAULT_MAX_BYTES: u64 = 5 << 30;

/// The default chunk.
const DEFAULT_CHUNK_BYTES: usize = 8 << 20;

/// A transfer's chunk: `--rdma-chunk-bytes` if given, else 8 MiB or the
/// largest buffer of which the memory budget holds [`MIN_CHUNKS`], if less
/// (a PUT of several chunks reserves that many at once). A chunk of which
/// the budget cannot hold that many would never move: refused, with what
/// to change.
fn chunk_bytes(given: Option<usize>, memory_bytes: u64) -> Result<usize, String> {
    let per_chunk = memory_bytes / MIN_CHUNKS as u64;
    let fits =
        usize::try_from(crate::gateway::rdma::longest_transfer(per_chunk)).unwrap_or(usize::MAX);
    if fits == 0 {
        return Err(format!(
            "--rdma-memory-bytes {memory_bytes}: no transfer fits (a transfer may hold \
             {MIN_CHUNKS} buffers of at least {} bytes at once)",
            crate::gateway::rdma::MIN_BUF
        ));
    }
    match given {
        None => Ok(fits.min(DEFAULT_CHUNK_BYTES)),
        Some(chunk) if chunk > fits => Err(format!(
            "--rdma-chunk-bytes {chunk}: --rdma-memory-bytes {memory_bytes} holds {MIN_CHUNKS} \
             chunks of at most {fits} bytes, and a PUT of several chunks holds {MIN_CHUNKS} at \
             once, so it would never move: raise --rdma-memory-bytes or lower \
             --rdma-chunk-bytes"
        )),
        Some(chunk) => Ok(chunk.max(crate::gateway::rdma::MIN_BUF)),
    }
}

/// A whole number of at least 1, in plain decimal digits.
fn count<T: TryFrom<u64>>(name: &str, text: &str) -> Result<T, String> {
    let bad = || format!("{name} {text}: expected a whole number of at least 1");
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u64>() {
        Ok(n) if n >= 1 => T::try_from(n).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// A duration in milliseconds of at least `min`, in plain decimal digits.
fn millis(name: &str, text: &str, min: u64) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(n) if n >= min && text.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(Duration::from_millis(n))
        }
        _ => Err(format!(
            "{name} {text}: expected a whole number of milliseconds >= {min}"
        )),
    }
}

/// A bucket name that names one directory of the root: S3's characters
/// (lowercase letters, digits, `.` and `-`), 3 to 63 of them, not `.` or
/// `..`.
fn bucket_name(name: String) -> Result<String, String> {
    let chars_ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if chars_ok && (3..=63).contains(&name.len()) && !name.starts_with('.') {
        Ok(name)
    } else {
        Err(format!("--bucket {name}: not a valid bucket name"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The arguments as the program gets them.
    pub fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The options every command line needs.
    pub fn required() -> Vec<&'static str> {
        vec![
            "--root",
            "/r",
            "--listen",
            "127.0.0.1:0",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
        ]
    }

    #[test]
    fn defaults_apply_when_only_the_required_options_are_given() {
        let o = parse(&args(&required())).unwrap().expect("not --help");
        assert_eq!(o.root, Some(PathBuf::from("/r")));
        assert!(o.upstream.is_none());
        assert_eq!(o.listen.port(), 0);
        assert_eq!(o.region, "us-east-1");
        assert!(o.buckets.is_empty() && o.device.is_none() && !o.no_rdma);
        assert_eq!(o.rdma_timeout, Duration::from_secs(10));
        assert_eq!(o.rdma_connect_timeout, None, "by device");
        assert_eq!(o.delay_final, Duration::ZERO);
        assert!(o.rdma_allow.is_empty());
        assert_eq!(o.rdma_max_requests, 128);
        assert_eq!(o.rdma_memory_bytes, 1 << 30);
        assert_eq!(o.rdma_max_bytes, 5 << 30, "S3's largest PUT");
        assert_eq!((o.rdma_chunk_bytes, o.rdma_chunks), (8 << 20, 4));
        assert_eq!(
            (o.rdma_max_connections, o.rdma_max_connections_per_client),
            (4096, 1024)
        );
    }

    #[test]
    fn every_option_is_read_with_a_separate_or_inline_value() {
        let mut list = required();
        list.extend([
            "--bucket",
            "one",
            "--bucket=two",
            "--region=eu-west-1",
            "--device",
            "rxe0",
            "--no-rdma",
            "--rdma-timeout-ms",
            "250",
            "--rdma-connect-timeout-ms=75",
            "--rdma-max-requests",
            "16",
            "--delay-final-ms=3000",
            "--rdma-allow",
            "192.0.2.0/24",
            "--rdma-allow=2001:db8::/32",
            "--rdma-max-bytes",
            "1048576",
            "--rdma-memory-bytes=4194304",
            "--rdma-max-connections",
            "8",
            "--rdma-max-connections-per-client=2",
        ]);
        let o = parse(&args(&list)).unwrap().expect("not --help");
        assert_eq!(o.buckets, ["one", "two"]);
        assert_eq!(o.region, "eu-west-1");
        assert_eq!(o.device.as_deref(), Some("rxe0"));
        assert!(o.no_rdma);
        assert_eq!(o.rdma_timeout, Duration::from_millis(250));
        assert_eq!(o.rdma_connect_timeout, Some(Duration::from_millis(75)));
        assert_eq!(o.rdma_max_requests, 16);
        assert_eq!(o.delay_final, Duration::from_secs(3));
        assert_eq!(o.rdma_allow.len(), 2);
        assert_eq!((o.rdma_max_bytes, o.rdma_memory_bytes), (1 << 20, 4 << 20));
        assert_eq!(
            (o.rdma_max_connections, o.rdma_max_connections_per_client),
            (8, 2)
        );
    }

    #[test]
    fn missing_unknown_and_malformed_arguments_are_refused() {
        assert!(parse(&args(&["--root", "/r"])).is_err());
        let mut unknown = required();
        unknown.push("--verbose");
        assert!(parse(&args(&unknown)).is_err());
        for bad in [
            ["--listen", "localhost"],
            ["--rdma-timeout-ms", "0"],
            ["--rdma-timeout-ms", "+5"],
            ["--bucket", "../up"],
            ["--bucket", "UPPER"],
            ["--rdma-allow", "192.0.2.1"],
            ["--rdma-max-bytes", "0"],
            ["--rdma-memory-bytes", "1e9"],
            ["--rdma-max-connections", "-1"],
            ["--rdma-connect-timeout-ms", "0"],
            ["--rdma-max-requests", "0"],
            ["--rdma-max-requests", "1000000"],
        ] {
            let mut list = required();
            list.extend(bad);
            assert!(parse(&args(&list)).is_err(), "{bad:?} was accepted");
        }
        let mut dangling = required();
        dangling.push("--region");
        assert!(parse(&args(&dangling)).is_err());
    }

    #[test]
    fn http_limits_and_domains_are_read_and_checked() {
        let with = |extra: &[&str]| {
            let mut list = required();
            list.extend(extra);
            parse(&args(&list)).map(|o| o.expect("not --help"))
        };
        let defaults = with(&[]).unwrap();
        assert_eq!(defaults.http, crate::gateway::HttpLimits::default());
        assert!(defaults.domains.is_empty());
        let o = with(&[
            "--http-header-timeout-ms",
            "1500",
            "--http-idle-timeout-ms=2500",
            "--http-max-connections",
            "10",
            "--http-max-connections-per-client",
            "3",
            "--domain",
            "GW.Example.",
            "--domain=s3.local",
        ])
        .unwrap();
        assert_eq!(o.http.header_timeout, Duration::from_millis(1500));
        assert_eq!(o.http.idle_timeout, Duration::from_millis(2500));
        assert_eq!(
            (o.http.max_connections, o.http.max_connections_per_client),
            (10, 3)
        );
        assert_eq!(o.domains, ["gw.example", "s3.local"]);
        for bad in ["gw.example:9000", "", "a..b", "under_score.example", "-"] {
            let refused = with(&["--domain", bad]).unwrap_err();
            assert!(refused.contains("--domain"), "{bad}: {refused}");
        }
        assert!(with(&["--http-max-connections", "0"]).is_err());
        assert!(with(&["--http-header-timeout-ms", "0"]).is_err());
    }

    #[test]
    fn a_chunk_is_8_mib_or_the_largest_buffer_the_memory_budget_holds() {
        let with = |extra: &[&str]| {
            let mut list = required();
            list.extend(extra);
            parse(&args(&list)).map(|o| {
                let o = o.expect("not --help");
                (o.rdma_chunk_bytes, o.rdma_memory_bytes, o.rdma_max_bytes)
            })
        };
        assert_eq!(
            with(&["--rdma-memory-bytes", "8589934592"]),
            Ok((8 << 20, 8 << 30, 5 << 30))
        );
        // Whole MiB above 1 MiB, powers of two below: what a buffer takes.
        // Three chunks fit: a PUT of several chunks holds three at once.
        assert_eq!(
            with(&["--rdma-memory-bytes", "17825792"]),
            Ok((5 << 20, 17825792, 5 << 30))
        );
        assert_eq!(
            with(&["--rdma-memory-bytes", "5767168"]),
            Ok((1 << 20, 5767168, 5 << 30))
        );
        assert_eq!(
            with(&["--rdma-memory-bytes", "15000"]),
            Ok((4096, 15000, 5 << 30))
        );
        assert_eq!(
            with(&["--rdma-chunk-bytes", "65536", "--rdma-chunks", "3"]).map(|t| t.0),
            Ok(65536)
        );
        // A transfer longer than the budget moves in chunks: allowed.
        assert_eq!(
            with(&[
                "--rdma-max-bytes",
                "1073741824",
                "--rdma-memory-bytes",
                "3145728"
            ]),
            Ok((1 << 20, 3 << 20, 1 << 30))
        );
        let refused = with(&[
            "--rdma-chunk-bytes",
            "2097152",
            "--rdma-memory-bytes",
            "1048576",
        ])
        .unwrap_err();
        assert!(refused.contains("raise --rdma-memory-bytes"), "{refused}");
        let refused = with(&[
            "--rdma-chunk-bytes",
            "1048576",
            "--rdma-memory-bytes",
            "2097152",
        ])
        .unwrap_err();
        assert!(refused.contains("holds 3 at once"), "{refused}");
        assert!(with(&["--rdma-memory-bytes", "12287"]).is_err());
        assert!(with(&["--rdma-memory-bytes", "12288"]).is_ok());
        assert!(with(&["--rdma-chunks", "0"]).is_err());
        // Fewer than three would leave a PUT through an upstream waiting
        // on itself (docs/architecture.md, "The RDMA gateway", stream.rs).
        let refused = with(&["--rdma-chunks", "2"]).unwrap_err();
        assert!(refused.contains("at least 3"), "{refused}");
    }

    /// The required options with `--upstream URL` instead of `--root`.
    fn with_upstream(extra: &[&str]) -> Result<Options, String> {
        let mut list = vec![
            "--upstream",
            "http://127.0.0.1:9000",
            "--listen",
            "127.0.0.1:0",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
        ];
        list.extend(extra);
        parse(&args(&list)).map(|o| o.expect("not --help"))
    }

    #[test]
    fn upstream_options_are_read_with_their_defaults() {
        let o = with_upstream(&["--region", "eu-west-1"]).unwrap();
        assert_eq!(o.root, None);
        let u = o.upstream.expect("the upstream's settings");
        assert_eq!(u.endpoint, "http://127.0.0.1:9000");
        assert_eq!(u.region, "eu-west-1", "the server's region by default");
        assert_eq!(u.profile, None);
        assert!(u.path_style);
        assert_eq!(u.timeout, Duration::from_secs(30));
        assert_eq!((u.multipart_bytes, u.part_bytes), (5 << 30, 16 << 20));
        let o = with_upstream(&[
            "--upstream-region=garage",
            "--upstream-profile",
            "store",
            "--upstream-virtual-hosted-style",
            "--upstream-timeout-ms",
            "1500",
            "--upstream-multipart-bytes=1",
            "--upstream-part-bytes",
            "5242880",
        ])
        .unwrap();
        let u = o.upstream.unwrap();
        assert_eq!(u.region, "garage");
        assert_eq!(u.profile.as_deref(), Some("store"));
        assert!(!u.path_style);
        assert_eq!(u.timeout, Duration::from_millis(1500));
        assert_eq!((u.multipart_bytes, u.part_bytes), (1, 5 << 20));
        let mut list = required();
        list.splice(0..2, ["--upstream", "https://s3.example.com:8443/"]);
        let o = parse(&args(&list)).unwrap().unwrap();
        assert_eq!(o.upstream.unwrap().endpoint, "https://s3.example.com:8443");
    }

    #[test]
    fn cache_options_are_read_checked_and_need_an_upstream() {
        use crate::gateway::cache::Validate;
        let u = with_upstream(&[]).unwrap().upstream.unwrap();
        assert_eq!(u.cache, None, "no cache by default");
        let u = with_upstream(&["--cache-bytes", "1000"])
            .unwrap()
            .upstream
            .unwrap();
        let cache = u.cache.expect("a cache");
        assert_eq!((cache.bytes, cache.max_object_bytes), (1000, 250));
        assert_eq!(cache.validate, Validate::Always);
        let u = with_upstream(&[
            "--cache-bytes=1000",
            "--cache-max-object-bytes",
            "1000",
            "--cache-validate",
            "ttl=90",
        ])
        .unwrap()
        .upstream
        .unwrap();
        let cache = u.cache.unwrap();
        assert_eq!(cache.max_object_bytes, 1000);
        assert_eq!(cache.validate, Validate::Ttl(Duration::from_secs(90)));
        assert_eq!(cache.disk, None, "no disk tier by default");
        let u = with_upstream(&[
            "--cache-bytes",
            "1000",
            "--cache-dir",
            "/var/cache/hipobj",
            "--cache-dir-bytes",
            "5000",
        ])
        .unwrap()
        .upstream
        .unwrap();
        let disk = u.cache.unwrap().disk.expect("a disk tier");
        assert_eq!(
            (disk.dir, disk.bytes),
            (PathBuf::from("/var/cache/hipobj"), 5000)
        );
        for (bad, says) in [
            (
                &["--cache-bytes", "10", "--cache-dir", "/d"][..],
                "give --cache-dir-bytes too",
            ),
            (
                &["--cache-bytes", "10", "--cache-dir-bytes", "10"][..],
                "--cache-dir-bytes applies to a --cache-dir",
            ),
            (
                &["--cache-dir", "/d", "--cache-dir-bytes", "10"][..],
                "--cache-dir applies to a cache: give --cache-bytes too",
            ),
            (
                &["--cache-validate", "sometimes"][..],
                "expected always or ttl=SECONDS",
            ),
            (
                &["--cache-validate", "ttl=-1"][..],
                "expected always or ttl=SECONDS",
            ),
            (
                &["--cache-max-object-bytes", "10"][..],
                "give --cache-bytes too",
            ),
            (&["--cache-bytes", "0"][..], "at least 1"),
            (
                &["--cache-bytes", "10", "--cache-max-object-bytes", "11"][..],
                "1 to --cache-bytes (10)",
            ),
        ] {
            let e = with_upstream(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let mut stray = required();
        stray.extend(["--cache-bytes", "1000"]);
        let e = parse(&args(&stray)).unwrap_err();
        assert!(
            e.contains("--cache-bytes applies to --upstream only"),
            "{e}"
        );
    }

    #[test]
    fn root_and_upstream_exclude_each_other_and_one_is_required() {
        let mut both = required();
        both.extend(["--upstream", "http://127.0.0.1:9000"]);
        let e = parse(&args(&both)).unwrap_err();
        assert!(e.contains("--root and --upstream are exclusive"), "{e}");
        let neither = parse(&args(&required()[2..])).unwrap_err();
        assert!(
            neither.contains("--root or --upstream is required"),
            "{neither}"
        );
        let e = with_upstream(&["--bucket", "one"]).unwrap_err();
        assert!(e.contains("--bucket"), "{e}");
        let mut stray = required();
        stray.extend(["--upstream-timeout-ms", "10"]);
        let e = parse(&args(&stray)).unwrap_err();
        assert!(
            e.contains("--upstream-timeout-ms applies to --upstream only"),
            "{e}"
        );
    }

    #[test]
    fn bad_upstream_urls_and_sizes_are_refused() {
        for url in [
            "127.0.0.1:9000",
            "ftp://host",
            "http://",
            "http://host/bucket",
            "http://host/?x=1",
        ] {
            let mut list = required();
            list.splice(0..2, ["--upstream", url]);
            assert!(parse(&args(&list)).is_err(), "{url} was accepted");
        }
        for bad in [
            ["--upstream-part-bytes", "5242879"],
            ["--upstream-part-bytes", "5368709121"],
            ["--upstream-multipart-bytes", "5368709121"],
            ["--upstream-multipart-bytes", "0"],
            ["--upstream-timeout-ms", "0"],
        ] {
            assert!(with_upstream(&bad).is_err(), "{bad:?} was accepted");
        }
        let e = with_upstream(&["--upstream-path-style", "--upstream-virtual-hosted-style"])
            .unwrap_err();
        assert!(e.contains("exclusive"), "{e}");
    }

    #[test]
    fn help_wins() {
        assert!(matches!(parse(&args(&["--help"])), Ok(None)));
    }

    /// The required options but the secret key.
    fn access_key_alone() -> Vec<String> {
        args(&[
            "--root",
            "/r",
            "--listen",
            "127.0.0.1:0",
            "--access-key",
            "a",
        ])
    }

    /// A file of this test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str, contents: &str) -> Scratch {
            let path =
                std::env::temp_dir().join(format!("hipobj-cli-{}-{name}", std::process::id()));
            std::fs::write(&path, contents).expect("a scratch file");
            Scratch(path)
        }

        fn arg(&self) -> &str {
            self.0.to_str().expect("UTF-8")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn the_option_table_the_usage_and_the_parser_name_the_same_options() {
        let in_usage: std::collections::BTreeSet<&str> = USAGE
            .split(|c: char| c.is_whitespace() || "[]|".contains(c))
            .filter(|w| w.starts_with("--"))
            .map(|w| w.split('=').next().unwrap_or(w))
            .filter(|w| !matches!(*w, "--help" | "--version" | "--config"))
            .collect();
        let in_table: std::collections::BTreeSet<&str> =
            OPTIONS.iter().map(|(name, _)| *name).collect();
        assert_eq!(in_usage, in_table);
        for (name, kind) in OPTIONS {
            let list = match kind {
                Kind::Flag => args(&[name]),
                Kind::Value | Kind::Repeated => args(&[name, "x"]),
            };
            let said = apply(&mut Given::new(Source::CommandLine), &list).err();
            assert!(
                !said
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("unknown argument"),
                "{name} is in the table but not in the parser"
            );
        }
    }

    #[test]
    fn the_version_names_the_s3s_that_cargo_toml_pins() {
        let manifest = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
        assert!(
            manifest.contains(&format!("s3s = {{ version = \"={S3S_VERSION}\"")),
            "Cargo.toml pins another s3s than {S3S_VERSION}"
        );
        assert!(version().contains(&format!("s3s {S3S_VERSION}")));
    }

    #[test]
    fn the_command_line_beats_the_environment_which_beats_the_config_file() {
        let config = Scratch::new(
            "precedence.toml",
            "access-key = \"file-ak\"\nsecret-key = \"file-sk\"\nregion = \"eu-west-1\"\n\
             bucket = [\"from-file\"]\nrdma-allow = \"192.0.2.0/24\"\nno-rdma = true\n",
        );
        let base = [
            "--root",
            "/r",
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.arg(),
        ];
        let run = |extra: &[&str], env: &[(&str, &str)]| {
            let mut list = args(&base);
            list.extend(args(extra));
            let env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            match command(&list, &|name| {
                env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            }) {
                Ok(Command::Run { options, warnings }) => (*options, warnings),
                other => panic!("{other:?}"),
            }
        };
        let (o, _) = run(&[], &[]);
        assert_eq!(
            (
                o.credentials[0].access_key.as_str(),
                o.credentials[0].secret_key.as_str()
            ),
            ("file-ak", "file-sk")
        );
        assert_eq!(o.region, "eu-west-1");
        assert_eq!(o.buckets, ["from-file"]);
        assert_eq!(o.rdma_allow.len(), 1);
        assert!(o.no_rdma);
        let (o, warnings) = run(
            &[],
            &[(ACCESS_KEY_ENV, "env-ak"), (SECRET_KEY_ENV, "env-sk")],
        );
        assert_eq!(
            (
                o.credentials[0].access_key.as_str(),
                o.credentials[0].secret_key.as_str()
            ),
            ("env-ak", "env-sk")
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        let (o, warnings) = run(
            &[
                "--access-key",
                "cli-ak",
                "--secret-key",
                "cli-sk",
                "--bucket",
                "from-cli",
                "--no-rdma=false",
            ],
            &[(ACCESS_KEY_ENV, "env-ak"), (SECRET_KEY_ENV, "env-sk")],
        );
        assert_eq!(
            (
                o.credentials[0].access_key.as_str(),
                o.credentials[0].secret_key.as_str()
            ),
            ("cli-ak", "cli-sk")
        );
        assert_eq!(
            o.buckets,
            ["from-cli"],
            "the command line's list replaces the file's"
        );
        assert_eq!(
            o.rdma_allow.len(),
            1,
            "a list the command line does not give stays"
        );
        assert!(!o.no_rdma);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("--secret-key on the command line")),
            "{warnings:?}"
        );
    }

    #[test]
    fn config_values_of_the_wrong_shape_are_refused_without_showing_them() {
        for (contents, said) in [
            (
                "no-rdma = \"yes\"",
                "no-rdma is a string: expected true or false",
            ),
            (
                "secret-key = 1.5",
                "secret-key is a float: expected a string or a whole number",
            ),
            (
                "bucket = [[\"a\"]]",
                "bucket is an array: expected a string or a whole number",
            ),
            ("config = \"other.toml\"", "unknown key \"config\""),
            ("listen = ", "is not TOML"),
        ] {
            let config = Scratch::new("shape.toml", contents);
            let mut list = args(&required());
            list.extend(args(&["--config", config.arg()]));
            let e = parse(&list).unwrap_err();
            assert!(e.contains(said), "{contents}: {e}");
            assert!(!e.contains("1.5"), "{e}");
        }
    }

    #[test]
    fn a_secret_key_file_holds_one_line_its_newline_trimmed() {
        for (contents, key) in [("sk\n", "sk"), ("sk\r\n", "sk"), ("s k", "s k")] {
            let file = Scratch::new("secret", contents);
            assert_eq!(read_secret(&file.0).as_deref(), Ok(key));
        }
        for contents in ["", "\n", "one\ntwo\n"] {
            let file = Scratch::new("secret", contents);
            assert!(read_secret(&file.0).is_err(), "{contents:?}");
        }
        let mut both = access_key_alone();
        both.extend(args(&["--secret-key", "s", "--secret-key-file", "/f"]));
        assert!(parse(&both).unwrap_err().contains("give one"));
    }

    #[test]
    fn keys_and_tls_files_must_come_in_pairs() {
        let only_key = access_key_alone();
        assert!(parse(&only_key)
            .unwrap_err()
            .contains("--access-key has no secret key"));
        let mut half_tls = args(&required());
        half_tls.extend(args(&["--tls-cert", "/c.pem"]));
        assert!(parse(&half_tls).unwrap_err().contains("go together"));
        let credentials = Scratch::new("credentials", "# none\nak\n");
        let mut bad_line = args(&required());
        bad_line.extend(args(&["--credentials-file", credentials.arg()]));
        let e = parse(&bad_line).unwrap_err();
        assert!(e.contains("line 2") && !e.contains("ak\n"), "{e}");
    }
}
