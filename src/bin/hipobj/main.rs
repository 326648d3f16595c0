//! `hipobj`: the command for people who deploy and use the library.
//!
//! - `hipobj doctor`: what this host can do, and why (`hipobj::doctor`).
//! - `hipobj get`, `put`, `cp`: one object between S3 and a file or GPU
//!   memory, by RDMA, with the plain-HTTP fallback made visible (or an
//!   error, with `--no-fallback`).
//! - `hipobj bench`: sizes by streams against an endpoint.
//!
//! Built on the safe Rust API (`hipobj::client`) and the built-in S3
//! client (`hipobj::s3`). Exit status: 0 success; 1 a failed transfer or
//! check; 2 bad arguments; 130 or 143 interrupted by SIGINT or SIGTERM;
//! `doctor` exits with its verdict (0 GPU-direct, 1 staged, 2 host memory
//! only, 3 unusable).

mod bench;
mod copy;
mod files;
mod interrupt;
mod many;
mod setup;
mod summary;
mod units;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use hipobj::client::{Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::{Overrides, S3Config, S3};

use crate::copy::RangeSpec;

#[derive(Parser)]
#[command(
    name = "hipobj",
    version,
    about = "Moves S3 objects between an S3 server and GPU or host memory by RDMA",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What this host can do: GPU runtimes, GPUs, RDMA devices, the NIC for
    /// each GPU, dma-buf, memory windows, limits; a verdict per GPU.
    Doctor(DoctorArgs),
    /// Downloads s3://BUCKET/KEY to a file (- for standard output) or into
    /// GPU memory (--device).
    Get(GetArgs),
    /// Uploads a file (- for standard input) to s3://BUCKET/KEY, from host
    /// or GPU memory (--device).
    Put(PutArgs),
    /// Copies between s3://BUCKET/KEY and a file, either way.
    Cp(CpArgs),
    /// Measures GETs and PUTs of several sizes on several streams.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct DoctorArgs {
    /// Only this RDMA device (repeatable), as HIPOBJ_NIC_HINT names them.
    #[arg(long = "nic", value_name = "NAME")]
    nics: Vec<String>,
    /// Only this GPU.
    #[arg(long, value_name = "N")]
    gpu: Option<i32>,
    /// The report as JSON on standard output.
    #[arg(long)]
    json: bool,
}

/// How to reach S3 and the library: shared by get, put, cp and bench.
#[derive(Args, Clone)]
pub struct Common {
    /// The S3 endpoint (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
    /// profile's endpoint_url, or AWS's for the region).
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The signing region (default: AWS_REGION, AWS_DEFAULT_REGION, the
    /// profile's, us-east-1).
    #[arg(long)]
    region: Option<String>,
    /// The profile of ~/.aws/credentials and ~/.aws/config (default:
    /// AWS_PROFILE, or the environment's keys, or `default`).
    #[arg(long)]
    profile: Option<String>,
    /// Buffers in this GPU's memory (the object moves between the server
    /// and the GPU); by default host memory.
    #[arg(long, value_name = "N")]
    device: Option<i32>,
    /// Only this RDMA device (repeatable).
    #[arg(long = "nic", value_name = "NAME")]
    nics: Vec<String>,
    /// A transfer the server declines, or a host without the library, is an
    /// error instead of going over plain HTTP.
    #[arg(long)]
    no_fallback: bool,
}

/// How get, put and cp move one object.
#[derive(Args, Clone)]
pub struct Transfer {
    /// Bytes per transfer and per part of a multipart upload (at least 5 MiB
    /// for uploads larger than one chunk).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = units::parse_size)]
    chunk: u64,
    /// Transfers at once.
    #[arg(long, value_name = "N", default_value_t = 4)]
    streams: usize,
    /// Times a request is sent again after a lost connection or a 500,
    /// 502, 503 or 504 (never after a 4xx), with a growing, jittered wait;
    /// 0: never.
    #[arg(long, value_name = "N", default_value_t = 3)]
    retries: u32,
    /// Do not check the bytes. By default a PUT from host memory carries
    /// the CRC-64/NVME of its bytes (the server refuses bytes that do not
    /// match it), and a GET into host memory asks for the server's CRC of
    /// what it sent and compares it with what arrived (an RDMA reply
    /// without one is an error: a server that does not send
    /// x-amz-rdma-checksum-crc64nvme needs --no-verify). GPU memory
    /// (--device) is never checked: it cannot be read without a copy.
    #[arg(long)]
    no_verify: bool,
    /// A whole prefix into a directory, or a directory under a prefix:
    /// every object (file) under it, by its key (path) after it, as the
    /// AWS CLI's `--recursive`.
    #[arg(long, short = 'r')]
    recursive: bool,
    /// With --recursive: objects copied at once (each on its own
    /// --streams).
    #[arg(long, value_name = "N", default_value_t = 4)]
    jobs: usize,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// The summary as JSON on standard output (on standard error when the
    /// object goes to standard output).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct GetArgs {
    /// s3://BUCKET/KEY
    source: String,
    /// A file, a directory (the object's base name inside it; so does a
    /// path ending in /), or - for standard output; with --device, may be
    /// left out (the object lands in GPU memory and stays there until the
    /// command ends).
    destination: Option<String>,
    /// Only these bytes of the object: FIRST-LAST (inclusive, as HTTP
    /// ranges), FIRST- (to the end) or -N (the last N bytes).
    #[arg(long, value_name = "RANGE", allow_hyphen_values = true, value_parser = copy::parse_range)]
    range: Option<RangeSpec>,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    transfer: Transfer,
}

#[derive(Args)]
struct PutArgs {
    /// A file, or - for standard input.
    source: String,
    /// s3://BUCKET/KEY, or s3://BUCKET/PREFIX/ (the file's name after it).
    destination: String,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    transfer: Transfer,
}

#[derive(Args)]
struct CpArgs {
    /// s3://BUCKET/KEY or a file.
    source: String,
    /// A file, a directory, s3://BUCKET/KEY or s3://BUCKET/PREFIX/.
    destination: String,
    /// For a download: only these bytes (as `get --range`).
    #[arg(long, value_name = "RANGE", allow_hyphen_values = true, value_parser = copy::parse_range)]
    range: Option<RangeSpec>,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    transfer: Transfer,
}

/// A failure the command reports: exit status 1, or 2 for bad arguments.
#[derive(Debug)]
pub struct Failure {
    message: String,
    usage: bool,
}

impl Failure {
    /// Bad arguments: exit status 2.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            usage: true,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            usage: false,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::from(message.to_owned())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Doctor(_)) {
        if let Err(why) = interrupt::install() {
            eprintln!("hipobj: {why}");
        }
    }
    let outcome = match cli.command {
        Command::Doctor(args) => return doctor(&args),
        Command::Get(args) => copy::get(
            &args.source,
            args.destination.as_deref(),
            args.range,
            &args.common,
            &args.transfer,
        ),
        Command::Put(args) => copy::put(
            &args.source,
            &args.destination,
            &args.common,
            &args.transfer,
        ),
        Command::Cp(args) => copy::cp(
            &args.source,
            &args.destination,
            args.range,
            &args.common,
            &args.transfer,
        ),
        Command::Bench(args) => bench::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("hipobj: {why}");
            match interrupt::exit_status() {
                Some(status) => ExitCode::from(status),
                None if why.usage => ExitCode::from(2),
                None => ExitCode::FAILURE,
            }
        }
    }
}

fn doctor(args: &DoctorArgs) -> ExitCode {
    let inputs = hipobj::doctor::Inputs::system(Options::from_env(), args.nics.clone(), args.gpu);
    let report = hipobj::doctor::diagnose(&inputs);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("hipobj: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", hipobj::doctor::render(&report));
    }
    let code = report.worst().exit_code();
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// The S3 endpoint the options and the environment name.
pub fn s3(common: &Common) -> Result<S3, Failure> {
    let overrides = Overrides {
        profile: common.profile.clone(),
        endpoint: common.endpoint.clone(),
        region: common.region.clone(),
        credentials: None,
    };
    let config = S3Config::resolve(&overrides).map_err(|e| e.to_string())?;
    Ok(S3::new(config).map_err(|e| e.to_string())?)
}

/// The library, or why it is not there (then every transfer is a
/// fallback, or, with --no-fallback, the command fails).
pub fn client(common: &Common) -> Result<Client, String> {
    let mut builder = Client::builder().gpu(match common.device {
        Some(n) => GpuSelect::Device(n),
        None => GpuSelect::None,
    });
    for nic in &common.nics {
        builder = builder.nic(nic);
    }
    builder.build().map_err(|e| match common.device {
        Some(n) if no_gpu(&e) => {
            format!("no GPU found for --device {n} ({})", runtimes())
        }
        _ => format!("the library did not initialize: {e}"),
    })
}

/// Whether `e` says no GPU runtime sees a GPU.
fn no_gpu(e: &hipobj::client::ClientError) -> bool {
    match e {
        hipobj::client::ClientError::Library(e) => {
            e.hip_error() == hipobj::core::error::HIP_ERROR_NO_DEVICE
        }
        _ => false,
    }
}

/// What each GPU runtime says on this host: `HIP: ..., CUDA: ...`.
fn runtimes() -> String {
    let inputs = hipobj::doctor::Inputs::system(Options::from_env(), Vec::new(), None);
    hipobj::doctor::runtime_summary(&*inputs.platform)
}

/// `s3://BUCKET/KEY` split.
pub fn parse_s3_url(url: &str) -> Result<(String, String), Failure> {
    match parse_s3_prefix(url)? {
        (bucket, key) if !key.is_empty() && !key.ends_with('/') => Ok((bucket, key)),
        _ => Err(Failure::usage(format!(
            "{url:?} has no bucket or no key: s3://BUCKET/KEY"
        ))),
    }
}

/// `s3://BUCKET/KEY` or `s3://BUCKET/PREFIX/` (or `s3://BUCKET/`) split:
/// the key may be empty or end with `/`.
pub fn parse_s3_prefix(url: &str) -> Result<(String, String), Failure> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| Failure::usage(format!("{url:?} is not an s3://BUCKET/KEY address")))?;
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() => Ok((bucket.to_owned(), key.to_owned())),
        _ => Err(Failure::usage(format!(
            "{url:?} has no bucket or no key: s3://BUCKET/KEY"
        ))),
    }
}
