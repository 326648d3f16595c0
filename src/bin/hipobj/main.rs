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
//! check; 2 bad arguments; `doctor` exits with its verdict (0 GPU-direct,
//! 1 staged, 2 host memory only, 3 unusable).

mod bench;
mod copy;
mod units;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use hipobj::client::{Client, GpuSelect};
use hipobj::core::Options;
use hipobj::s3::{Overrides, S3Config, S3};

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
    /// Bytes per transfer and per part of a multipart upload (at least 5 MiB
    /// for uploads larger than one chunk).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = units::parse_size)]
    chunk: u64,
    /// Transfers at once.
    #[arg(long, value_name = "N", default_value_t = 4)]
    streams: usize,
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
    /// A file, or - for standard output; with --device, may be left out
    /// (the object lands in GPU memory and stays there until the command
    /// ends).
    destination: Option<String>,
    /// Only these bytes of the object: FIRST-LAST (inclusive, as HTTP
    /// ranges) or FIRST- (to the end).
    #[arg(long, value_name = "RANGE")]
    range: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct PutArgs {
    /// A file, or - for standard input.
    source: String,
    /// s3://BUCKET/KEY
    destination: String,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct CpArgs {
    /// s3://BUCKET/KEY or a file.
    source: String,
    /// A file or s3://BUCKET/KEY.
    destination: String,
    /// For a download: only these bytes (as `get --range`).
    #[arg(long, value_name = "RANGE")]
    range: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// A failure the command reports and exits 1 for.
pub type Failure = String;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Doctor(args) => return doctor(&args),
        Command::Get(args) => copy::get(
            &args.source,
            args.destination.as_deref(),
            args.range.as_deref(),
            &args.common,
        ),
        Command::Put(args) => copy::put(&args.source, &args.destination, &args.common),
        Command::Cp(args) => copy::cp(
            &args.source,
            &args.destination,
            args.range.as_deref(),
            &args.common,
        ),
        Command::Bench(args) => bench::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("hipobj: {why}");
            ExitCode::FAILURE
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
    S3::new(config).map_err(|e| e.to_string())
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
    builder
        .build()
        .map_err(|e| format!("the library did not initialize: {e}"))
}

/// `s3://BUCKET/KEY` split.
pub fn parse_s3_url(url: &str) -> Result<(String, String), Failure> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url:?} is not an s3://BUCKET/KEY address"))?;
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => {
            Ok((bucket.to_owned(), key.to_owned()))
        }
        _ => Err(format!("{url:?} has no bucket or no key: s3://BUCKET/KEY")),
    }
}
