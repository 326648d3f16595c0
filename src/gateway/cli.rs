//! The command line, and the config file that holds the same options.
//!
//! One structure, `Given`, is every option: its name, its value's form
//! and check, and its help, declared once for clap (derive), which parses
//! the command line and prints `--help`. The config file (`--config FILE`,
//! TOML, read with serde into a table) goes through the same parser: each
//! key is an option without its dashes (`listen = "0.0.0.0:9000"` is
//! `--listen=0.0.0.0:9000`, `bucket = ["a", "b"]` is `--bucket=a
//! --bucket=b`, `no-rdma = true` is `--no-rdma=true`), so every option works
//! in both, with the same checks and messages. What the command line gives
//! overrides the file (a repeatable option given on the command line
//! replaces the file's list); the access key and the secret key may also
//! come from the environment, which comes between the two, as the AWS tools
//! order their sources. (The environment is read through the function the
//! caller passes, not by clap, so that tests give it without touching the
//! process's.)
//!
//! Secrets need never be on the command line, where every user of the
//! machine reads them (`ps`): the secret key comes from a file
//! (`--secret-key-file`), from `HIPOBJ_SECRET_KEY`, or from the config
//! file; more access keys from `--credentials-file`. `--secret-key` on the
//! command line still works, with a warning.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser};

use crate::gateway::cache::Validate;
use crate::gateway::rdma::MIN_CHUNKS;
use crate::gateway::upstream::Settings;

/// What a bad command line prints after its error, instead of the whole
/// help.
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

/// What `--help` prints: every option of `Given`, with its help.
pub fn usage() -> String {
    Given::command().render_help().to_string()
}

/// The most RDMA requests served at once: each may hold a blocking thread,
/// and tokio's pool takes at most a few thousand.
const MAX_REQUESTS: usize = 4096;

/// The longest RDMA transfer served unless `--rdma-max-bytes` says:
/// S3's largest PUT.
const DEFAULT_MAX_BYTES: u64 = 5 << 30;

/// The default chunk.
const DEFAULT_CHUNK_BYTES: usize = 8 << 20;

/// Every option, as the command line and the config file give it: the
/// one place that names them, checks each value alone, and says what each
/// does. A value the command line does not give is `None` (or empty), so
/// that the file's stays; defaults are applied when the two are merged
/// ([`finish`]), each named in its option's help.
#[derive(Parser, Debug)]
#[command(
    name = "hipobj-s3-server",
    override_usage = "\
hipobj-s3-server --root DIR --listen ADDR:PORT [OPTION]...
       hipobj-s3-server --upstream URL --listen ADDR:PORT [OPTION]... (all but --bucket)
       hipobj-s3-server --help | --version",
    about = "An S3 server over a directory of this machine (--root) or over another S3 \
             store (--upstream), that also serves hipobj clients by RDMA.",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true,
    max_term_width = 100
)]
struct Given {
    /// Print this help.
    #[arg(short = 'h', long, action = ArgAction::SetTrue)]
    help: bool,
    /// Print the version and what the build holds.
    #[arg(short = 'V', long, action = ArgAction::SetTrue)]
    version: bool,
    /// A TOML file of these options, each named without its dashes
    /// (listen = "0.0.0.0:9000", bucket = ["a", "b"], no-rdma = true); the
    /// command line overrides it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where buckets and objects are stored (created if missing).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Serve the buckets and objects of this S3 store instead (http:// or
    /// https://, host, optional port: AWS, MinIO, Garage, Ceph RGW...); its
    /// credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or
    /// the shared config and credentials files (~/.aws), as the AWS tools
    /// find them. Exclusive with --root.
    #[arg(long, value_name = "URL", value_parser = endpoint)]
    upstream: Option<String>,
    /// S3 address; port 0 picks a free port.
    #[arg(long, value_name = "ADDR:PORT", value_parser = |v: &str| address("--listen", v))]
    listen: Option<SocketAddr>,
    /// The access key SigV4 requests are signed with (or HIPOBJ_ACCESS_KEY).
    #[arg(long, value_name = "AK")]
    access_key: Option<String>,
    /// A file holding its secret key, one line (or HIPOBJ_SECRET_KEY).
    #[arg(long, value_name = "PATH", conflicts_with = "secret_key")]
    secret_key_file: Option<PathBuf>,
    /// The secret key itself: on the command line, every user of the
    /// machine sees it (ps); prefer the file, the environment or the config
    /// file.
    #[arg(long, value_name = "SK")]
    secret_key: Option<String>,
    /// More access keys (one per tenant, say): a line "AK SK" each; blank
    /// lines and lines starting with # are skipped.
    #[arg(long, value_name = "PATH")]
    credentials_file: Option<PathBuf>,
    /// Serve https: the certificate chain (PEM, the server's first).
    #[arg(long, value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT",
          value_parser = |v: &str| address("--metrics-listen", v))]
    metrics_listen: Option<SocketAddr>,
    /// The region requests must be signed for (default us-east-1).
    #[arg(long, value_name = "REGION")]
    region: Option<String>,
    /// Creates this bucket (a directory of the root) if missing; repeatable.
    #[arg(long, value_name = "NAME", value_parser = bucket_name)]
    bucket: Vec<String>,
    /// RDMA device (default: the first one with an active port).
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// Decline every x-amz-rdma-token (501), as a server without RDMA.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_name = "BOOL", hide_possible_values = true,
          value_parser = |v: &str| flag("--no-rdma", v))]
    no_rdma: Option<bool>,
    /// How long an RDMA transfer may go without progress: its dial and
    /// proof, each chunk, its final message (default 10000).
    #[arg(long, value_name = "N", value_parser = |v: &str| millis("--rdma-timeout-ms", v, 1))]
    rdma_timeout_ms: Option<Duration>,
    /// How long connecting to a client may take, within that deadline
    /// (default 2000 on a hardware NIC; on a software one, Soft-RoCE or
    /// siw, the deadline alone); a client whose RDMA CM does not answer
    /// fails the transfer (500) after this long.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| millis("--rdma-connect-timeout-ms", v, 1))]
    rdma_connect_timeout_ms: Option<Duration>,
    /// Test knob: pause between the data and the final message (default 0).
    #[arg(long, value_name = "N", value_parser = |v: &str| millis("--delay-final-ms", v, 0))]
    delay_final_ms: Option<Duration>,
    /// A network whose clients the server may connect to, besides the
    /// address each request comes from (the fabric's subnet behind a load
    /// balancer); repeatable.
    #[arg(long, value_name = "CIDR", value_parser = network)]
    rdma_allow: Vec<ipnet::IpNet>,
    /// The largest RDMA transfer served (default 5368709120, S3's largest
    /// PUT); a longer token is declined (501).
    #[arg(long, value_name = "N", value_parser = |v: &str| count::<u64>("--rdma-max-bytes", v))]
    rdma_max_bytes: Option<u64>,
    /// Registered memory the transfers in progress may hold at once
    /// (default 1073741824, at least 12288): each transfer reserves all it
    /// holds (its chunks' buffers) before it starts; one that finds no room
    /// waits its turn, then fails (503 SlowDown) after --rdma-timeout-ms.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<u64>("--rdma-memory-bytes", v))]
    rdma_memory_bytes: Option<u64>,
    /// A transfer moves in chunks of at most N bytes, one registered buffer
    /// each (default 8388608, or the largest buffer of which
    /// --rdma-memory-bytes holds three if less): a GET's bytes are written
    /// to the client as the backend gives them, a PUT's are handed to the
    /// backend as they are read.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<usize>("--rdma-chunk-bytes", v))]
    rdma_chunk_bytes: Option<usize>,
    /// Chunks one transfer holds at once (default 4, at least 3): its
    /// memory is at most N x --rdma-chunk-bytes.
    #[arg(long, value_name = "N", value_parser = chunks)]
    rdma_chunks: Option<usize>,
    /// RDMA requests served at once (default 128); one more is answered 503
    /// SlowDown at once. The runtime has N + 256 blocking threads: RDMA
    /// requests hold at most N of them, the rest serve every request's file
    /// I/O.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<usize>("--rdma-max-requests", v))]
    rdma_max_requests: Option<usize>,
    /// RDMA connections held at once, to all clients, dials in progress
    /// included (default 4096).
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<usize>("--rdma-max-connections", v))]
    rdma_max_connections: Option<usize>,
    /// RDMA connections held for one access key to one client address,
    /// dials in progress included (default 1024).
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<usize>("--rdma-max-connections-per-client", v))]
    rdma_max_connections_per_client: Option<usize>,
    /// On SIGTERM or SIGINT, how long the requests in progress may take to
    /// finish (default --rdma-timeout-ms + --delay-final-ms + 1000).
    #[arg(long, value_name = "N", value_parser = |v: &str| millis("--shutdown-grace-ms", v, 0))]
    shutdown_grace_ms: Option<Duration>,
    /// How long a request's header may take to arrive once its first byte
    /// has (default 30000); then the connection is closed, and logged.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| millis("--http-header-timeout-ms", v, 1))]
    http_header_timeout_ms: Option<Duration>,
    /// How long a connection may wait for its next request, and a new one
    /// for its first byte (default 60000); then it is closed, and logged.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| millis("--http-idle-timeout-ms", v, 1))]
    http_idle_timeout_ms: Option<Duration>,
    /// S3 connections open at once, TLS handshakes included (default 4096);
    /// one more is closed at once, and logged.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<usize>("--http-max-connections", v))]
    http_max_connections: Option<usize>,
    /// S3 connections open at once from one client address (default 1024;
    /// behind a balancer, the balancer is that one client).
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<usize>("--http-max-connections-per-client", v))]
    http_max_connections_per_client: Option<usize>,
    /// Serve virtual-hosted-style requests for NAME: a request to
    /// BUCKET.NAME addresses BUCKET (and one to NAME is path-style);
    /// repeatable. Without it every request is path-style: no Host is taken
    /// for a bucket.
    #[arg(long, value_name = "NAME", value_parser = domain_name)]
    domain: Vec<String>,
    /// The region requests to the upstream are signed for (--region by
    /// default).
    #[arg(long, value_name = "REGION")]
    upstream_region: Option<String>,
    /// The profile of the shared config and credentials files to take the
    /// upstream's credentials from (default: AWS_PROFILE, else default).
    #[arg(long, value_name = "NAME")]
    upstream_profile: Option<String>,
    /// Addresses the upstream as URL/BUCKET/KEY (the default: self-hosted
    /// stores such as MinIO, Garage and Ceph RGW expect it).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_name = "BOOL", hide_possible_values = true,
          value_parser = |v: &str| flag("--upstream-path-style", v))]
    upstream_path_style: Option<bool>,
    /// Addresses the upstream as BUCKET.HOST/KEY (AWS's preferred style).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_name = "BOOL", hide_possible_values = true,
          value_parser = |v: &str| flag("--upstream-virtual-hosted-style", v))]
    upstream_virtual_hosted_style: Option<bool>,
    /// How long the gateway waits for the upstream at one stretch: to
    /// connect, to take the next piece of a body, to answer, to send the
    /// next piece of an object (default 30000; ten times that for
    /// CopyObject, UploadPartCopy and CompleteMultipartUpload); then 503.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| millis("--upstream-timeout-ms", v, 1))]
    upstream_timeout_ms: Option<Duration>,
    /// The largest PutObject sent on as one streamed request (default and
    /// at most 5368709120, S3's largest, so that its ETag stays the body's
    /// MD5); a larger one (or one of unknown length) goes as a multipart
    /// upload, whose ETag is not an MD5, aborted if anything fails.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<u64>("--upstream-multipart-bytes", v))]
    upstream_multipart_bytes: Option<u64>,
    /// The part size of those uploads (default 16777216, 5242880 to
    /// 5368709120); larger where the object needs more than 10000 parts.
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<u64>("--upstream-part-bytes", v))]
    upstream_part_bytes: Option<u64>,
    /// Keep whole objects read through the gateway in N bytes of memory and
    /// serve them from there (default: no cache); concurrent reads of one
    /// object cost the store one GET; a write through the gateway drops the
    /// object at once.
    #[arg(long, value_name = "N", value_parser = |v: &str| count::<u64>("--cache-bytes", v))]
    cache_bytes: Option<u64>,
    /// The largest object kept (default: a quarter of the cache).
    #[arg(long, value_name = "N",
          value_parser = |v: &str| count::<u64>("--cache-max-object-bytes", v))]
    cache_max_object_bytes: Option<u64>,
    /// always (the default): ask the store for the object's ETag before
    /// each hit; ttl=N: trust an entry N seconds after it was filled or
    /// checked, HEADs answered from it too (a change made behind the
    /// gateway may be served stale that long; none made through it is).
    #[arg(long, value_name = "always|ttl=SECONDS", value_parser = Validate::parse)]
    cache_validate: Option<Validate>,
    /// Keep every object the cache keeps in a file of DIR too, read from
    /// there when memory no longer holds it and after a restart; each file
    /// checked against its CRC64/NVME before use (one that fails is deleted
    /// and the object read from the store); needs --cache-dir-bytes.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The bytes the files in --cache-dir may take.
    #[arg(long, value_name = "N", value_parser = |v: &str| count::<u64>("--cache-dir-bytes", v))]
    cache_dir_bytes: Option<u64>,
}

/// How an option takes its value in the config file, from its clap
/// declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A flag (`--no-rdma`, or `--no-rdma=true|false`): `true` or `false`.
    Flag,
    /// One value: a string or a whole number.
    Value,
    /// A value each time it is given: an array (or one value).
    Repeated,
}

/// The options the config file may hold (all but `--help`, `--version` and
/// `--config`), by their long names, with how each takes its value.
fn file_options() -> Vec<(String, Kind)> {
    Given::command()
        .get_arguments()
        .filter_map(|arg| {
            let name = arg.get_long()?;
            if matches!(name, "help" | "version" | "config") {
                return None;
            }
            let kind = if matches!(arg.get_action(), ArgAction::Append) {
                Kind::Repeated
            } else if arg.get_num_args().is_some_and(|n| n.min_values() == 0) {
                Kind::Flag
            } else {
                Kind::Value
            };
            Some((name.to_owned(), kind))
        })
        .collect()
}

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
    let (mut given, cli) = parse_args(args)?;
    if given.help {
        return Ok(Command::Help);
    }
    if given.version {
        return Ok(Command::Version);
    }
    let from_command_line = Sources {
        access_key: cli.contains_id("access_key"),
        secret: cli.contains_id("secret_key") || cli.contains_id("secret_key_file"),
    };
    if let Some(path) = given.config.clone() {
        // The file first, then the command line again over it.
        let shown = path.display();
        let (mut from_file, _) =
            parse_args(&file_args(&path)?).map_err(|e| format!("{shown}: {e}"))?;
        from_file
            .update_from_arg_matches(&cli)
            .map_err(|e| said(&e))?;
        // A secret the command line gives, in either form, replaces the
        // file's.
        if cli.contains_id("secret_key") {
            from_file.secret_key_file = None;
        }
        if cli.contains_id("secret_key_file") {
            from_file.secret_key = None;
        }
        given = from_file;
    }
    let mut warnings = Vec::new();
    let options = finish(given, from_command_line, env, &mut warnings)?;
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

/// The options `args` give, and clap's record of which were given (to lay
/// them over the config file's).
fn parse_args(args: &[String]) -> Result<(Given, ArgMatches), String> {
    let matches = Given::command()
        .args_override_self(true)
        .try_get_matches_from(args)
        .map_err(|e| said(&e))?;
    let given = Given::from_arg_matches(&matches).map_err(|e| said(&e))?;
    Ok((given, matches))
}

/// clap's error as the sentence the server prints: a value's own check
/// says what is wrong with it (naming the option and the value);
/// otherwise the option at fault.
fn said(e: &clap::Error) -> String {
    let context = |kind: ContextKind| match e.get(kind) {
        Some(ContextValue::String(text)) => text.clone(),
        Some(ContextValue::Strings(texts)) => texts.join(" "),
        _ => String::new(),
    };
    // "--region <REGION>": the option's name alone.
    let option = |kind: ContextKind| {
        let text = context(kind);
        text.split([' ', '=']).next().unwrap_or_default().to_owned()
    };
    match e.kind() {
        ErrorKind::ValueValidation => match std::error::Error::source(e) {
            Some(why) => why.to_string(),
            None => format!("{}: a bad value", option(ContextKind::InvalidArg)),
        },
        ErrorKind::UnknownArgument => {
            format!("unknown argument {}", context(ContextKind::InvalidArg))
        }
        ErrorKind::InvalidValue | ErrorKind::NoEquals => {
            format!("{} needs a value", option(ContextKind::InvalidArg))
        }
        // The one pair declared exclusive within a source.
        ErrorKind::ArgumentConflict => {
            "--secret-key and --secret-key-file both given: give one".to_owned()
        }
        _ => e.kind().to_string(),
    }
}

/// Which values the command line gave, for the order of their sources.
#[derive(Clone, Copy, Debug)]
struct Sources {
    /// `--access-key`.
    access_key: bool,
    /// `--secret-key` or `--secret-key-file`.
    secret: bool,
}

/// The config file as the arguments the command line would give: each key
/// is an option of [`Given`] without its dashes.
fn file_args(path: &Path) -> Result<Vec<String>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the config file {shown}: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("the config file {shown} is not TOML: {e}"))?;
    let options = file_options();
    let mut args = Vec::new();
    for (key, value) in &table {
        let Some(&(_, kind)) = options.iter().find(|(option, _)| option == key) else {
            return Err(format!(
                "the config file {shown}: unknown key {key:?} (its keys are the options of \
                 --help without their dashes; config, help and version are not among them)"
            ));
        };
        let name = format!("--{key}");
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
fn pick<T>(given: Option<T>, on_command_line: bool, env: Option<T>) -> Option<(T, Origin)> {
    match (given, env) {
        (Some(v), _) if on_command_line => Some((v, Origin::CommandLine)),
        (_, Some(v)) => Some((v, Origin::Environment)),
        (Some(v), None) => Some((v, Origin::File)),
        (None, None) => None,
    }
}

/// A secret key as given: the key itself, or the file holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Secret {
    /// `--secret-key`, `secret-key` or `HIPOBJ_SECRET_KEY`.
    Key(String),
    /// `--secret-key-file`.
    File(PathBuf),
}

/// The settings from what was given, the environment's keys and the
/// files of secrets; what is unsafe goes to `warnings`.
fn finish(
    g: Given,
    from_command_line: Sources,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<Options, String> {
    let missing = |what: &str| format!("{what} is required");
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let access_key = pick(
        g.access_key,
        from_command_line.access_key,
        env(ACCESS_KEY_ENV),
    );
    let given_secret = match (g.secret_key, g.secret_key_file) {
        (Some(key), _) => Some(Secret::Key(key)),
        (None, Some(path)) => Some(Secret::File(path)),
        (None, None) => None,
    };
    let secret = pick(
        given_secret,
        from_command_line.secret,
        env(SECRET_KEY_ENV).map(Secret::Key),
    );
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
    let rdma_memory_bytes = g.rdma_memory_bytes.unwrap_or(1 << 30);
    let rdma_chunk_bytes = chunk_bytes(g.rdma_chunk_bytes, rdma_memory_bytes)?;
    let rdma_max_bytes = g.rdma_max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    let rdma_max_requests = g.rdma_max_requests.unwrap_or(128);
    if rdma_max_requests > MAX_REQUESTS {
        return Err(format!(
            "--rdma-max-requests {rdma_max_requests}: at most {MAX_REQUESTS}"
        ));
    }
    let rdma_timeout = g.rdma_timeout_ms.unwrap_or(Duration::from_millis(10_000));
    let delay_final = g.delay_final_ms.unwrap_or(Duration::ZERO);
    let shutdown_grace = g
        .shutdown_grace_ms
        .unwrap_or(rdma_timeout + delay_final + Duration::from_secs(1));
    let region = g.region.unwrap_or_else(|| "us-east-1".to_owned());
    let path_style = match (
        g.upstream_path_style,
        g.upstream_virtual_hosted_style
            .map(|virtual_hosted| !virtual_hosted),
    ) {
        (Some(path), Some(not_virtual)) if path != not_virtual => {
            return Err(
                "--upstream-path-style and --upstream-virtual-hosted-style are exclusive".into(),
            )
        }
        (path, not_virtual) => path.or(not_virtual),
    };
    let upstream = UpstreamArgs {
        endpoint: g.upstream,
        region: g.upstream_region,
        profile: g.upstream_profile,
        path_style,
        timeout: g.upstream_timeout_ms,
        multipart_bytes: g.upstream_multipart_bytes,
        part_bytes: g.upstream_part_bytes,
        cache_bytes: g.cache_bytes,
        cache_max_object_bytes: g.cache_max_object_bytes,
        cache_validate: g.cache_validate,
        cache_dir: g.cache_dir,
        cache_dir_bytes: g.cache_dir_bytes,
    }
    .settings(&region)?;
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
    if upstream.is_some() && !g.bucket.is_empty() {
        return Err(
            "--bucket creates directories of --root; with --upstream, create buckets in the \
             upstream store (or through this server: CreateBucket)"
                .into(),
        );
    }
    // The HTTP limits' defaults are the server's own.
    let http = crate::gateway::HttpLimits::default();
    Ok(Options {
        root,
        upstream,
        listen,
        credentials,
        tls,
        metrics_listen: g.metrics_listen,
        region,
        buckets: g.bucket,
        device: g.device,
        no_rdma: g.no_rdma.unwrap_or(false),
        rdma_timeout,
        rdma_connect_timeout: g.rdma_connect_timeout_ms,
        delay_final,
        rdma_allow: g.rdma_allow,
        rdma_max_bytes,
        rdma_memory_bytes,
        rdma_max_requests,
        rdma_max_connections: g.rdma_max_connections.unwrap_or(4096),
        rdma_max_connections_per_client: g.rdma_max_connections_per_client.unwrap_or(1024),
        rdma_chunk_bytes,
        rdma_chunks: g.rdma_chunks.unwrap_or(4),
        shutdown_grace,
        http: crate::gateway::HttpLimits {
            header_timeout: g.http_header_timeout_ms.unwrap_or(http.header_timeout),
            idle_timeout: g.http_idle_timeout_ms.unwrap_or(http.idle_timeout),
            max_connections: g.http_max_connections.unwrap_or(http.max_connections),
            max_connections_per_client: g
                .http_max_connections_per_client
                .unwrap_or(http.max_connections_per_client),
        },
        domains: g.domain,
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

/// A flag's value: given alone (clap hands `true` then), or `=true` or
/// `=false` (as the config file gives it).
fn flag(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!(
            "{name}={other}: a flag takes no value, or true or false"
        )),
    }
}

/// A `--rdma-allow` network.
fn network(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse::<ipnet::IpNet>()
        .map_err(|e| format!("--rdma-allow {text}: {e} (expected ADDR/PREFIX)"))
}

/// `--rdma-chunks`: a count of at least [`MIN_CHUNKS`].
fn chunks(text: &str) -> Result<usize, String> {
    let chunks = count::<usize>("--rdma-chunks", text)?;
    if chunks < MIN_CHUNKS {
        return Err(format!(
            "--rdma-chunks {chunks}: at least {MIN_CHUNKS} (a PUT keeps its last chunk \
             until the bytes' checksum is checked, an upstream keeps one more until \
             it knows the body goes on, and one must be free to go on)"
        ));
    }
    Ok(chunks)
}

/// The `--upstream` options as given.
struct UpstreamArgs {
    endpoint: Option<String>,
    region: Option<String>,
    profile: Option<String>,
    /// `--upstream-path-style` (true) or `--upstream-virtual-hosted-style`
    /// (false).
    path_style: Option<bool>,
    timeout: Option<Duration>,
    multipart_bytes: Option<u64>,
    part_bytes: Option<u64>,
    cache_bytes: Option<u64>,
    cache_max_object_bytes: Option<u64>,
    cache_validate: Option<Validate>,
    cache_dir: Option<PathBuf>,
    cache_dir_bytes: Option<u64>,
}

impl UpstreamArgs {
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
                    validate: self.cache_validate.unwrap_or(Validate::Always),
                    disk,
                })
            }
        };
        Ok(Some(Settings {
            endpoint,
            region: self.region.unwrap_or_else(|| region.to_owned()),
            profile: self.profile,
            path_style: self.path_style.unwrap_or(true),
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
fn bucket_name(name: &str) -> Result<String, String> {
    let chars_ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if chars_ok && (3..=63).contains(&name.len()) && !name.starts_with('.') {
        Ok(name.to_owned())
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
        assert_eq!(
            parse(&args(&dangling)).unwrap_err(),
            "--region needs a value"
        );
        // The sentences clap's errors become: the option and the value at
        // fault, as the server prints them.
        let refused = |extra: &[&str]| {
            let mut list = required();
            list.extend(extra);
            parse(&args(&list)).unwrap_err()
        };
        assert_eq!(refused(&["--verbose"]), "unknown argument --verbose");
        assert_eq!(refused(&["stray"]), "unknown argument stray");
        assert_eq!(
            refused(&["--rdma-timeout-ms", "0"]),
            "--rdma-timeout-ms 0: expected a whole number of milliseconds >= 1"
        );
        assert_eq!(
            refused(&["--no-rdma=yes"]),
            "--no-rdma=yes: a flag takes no value, or true or false"
        );
        assert!(
            refused(&["--listen", "localhost"]).starts_with("--listen localhost: "),
            "{}",
            refused(&["--listen", "localhost"])
        );
        // An option given twice: the last one counts.
        let mut twice = required();
        twice.extend(["--region", "one", "--region", "two"]);
        assert_eq!(parse(&args(&twice)).unwrap().unwrap().region, "two");
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

    /// clap's own checks of the declaration (names, value counts,
    /// conflicts), and every option but --help, --version and --config a
    /// key of the config file, read there as on the command line.
    #[test]
    fn every_option_is_declared_well_and_is_a_key_of_the_config_file() {
        Given::command().debug_assert();
        let options = file_options();
        assert!(options.len() > 40, "{options:?}");
        for (name, kind) in options {
            let value = match kind {
                Kind::Flag => "true",
                Kind::Value | Kind::Repeated => "\"x\"",
            };
            let config = Scratch::new("key.toml", &format!("{name} = {value}\n"));
            let mut list = args(&required());
            list.extend(args(&["--config", config.arg()]));
            let said = parse(&list).err().unwrap_or_default();
            assert!(
                !said.contains("unknown key"),
                "{name} is an option but not a key: {said}"
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
