//! `hipobj bench`: GETs and PUTs of several sizes on several streams
//! against an endpoint, as a table or JSON, with ratios to a reference run.
//!
//! Each stream is a thread with a buffer of its own (GPU memory with
//! `--device`) that moves `--count` objects one after the other; a cell's
//! figure is all its bytes over the time from the first start to the last
//! end, and its latencies are each transfer's, call to return. GETs read
//! one object per size, written first; PUTs write one object per stream.
//!
//! `--http` measures the same over plain HTTP without the library (host
//! memory, no token): the baseline the RDMA figures are to be compared
//! with, and the only figures a host without the library can give.

use std::time::Instant;

use clap::Args;
use serde::{Deserialize, Serialize};

use hipobj::client::{Buffer, Client};
use hipobj::s3::objects::{self, Object, Path as Via, Policy, Unchecked};
use hipobj::s3::S3;

use crate::units::{human, mib_per_s, parse_size};
use crate::{client, parse_s3_url, s3, Common, Failure};

#[derive(Args)]
pub struct BenchArgs {
    /// s3://BUCKET/PREFIX: the objects are PREFIX/hipobj-bench-...
    target: String,
    /// Object sizes, comma-separated.
    #[arg(long, value_name = "SIZES", default_value = "64KiB,1MiB,16MiB", value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Stream counts, comma-separated.
    #[arg(
        long = "streams-list",
        value_name = "N,...",
        default_value = "1,4,16",
        value_delimiter = ','
    )]
    streams_list: Vec<usize>,
    /// Transfers per stream in each cell.
    #[arg(long, default_value_t = 8)]
    count: usize,
    /// Operations, comma-separated: get, put.
    #[arg(long, value_delimiter = ',', default_value = "get,put")]
    ops: Vec<String>,
    /// A `--json` output of an earlier run: each cell's ratio to it.
    #[arg(long, value_name = "FILE")]
    reference: Option<String>,
    /// Over plain HTTP, without the library: a baseline (and what a host
    /// without the library can measure).
    #[arg(long, conflicts_with_all = ["device", "no_fallback"])]
    http: bool,
    /// Do not check the bytes (as get and put --no-verify): measures
    /// without the CRC-64/NVME of each transfer, and against servers that
    /// do not send theirs. GPU memory is never checked.
    #[arg(long)]
    no_verify: bool,
    /// The run as JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: Common,
}

/// One cell of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `get` or `put`.
    pub op: String,
    /// Bytes per transfer.
    pub size: u64,
    /// Streams.
    pub streams: usize,
    /// Transfers in all.
    pub transfers: u64,
    /// Seconds, first start to last end.
    pub seconds: f64,
    /// All bytes over `seconds`.
    pub mib_per_s: f64,
    /// Median transfer, µs.
    pub p50_us: u64,
    /// 99th percentile transfer, µs.
    pub p99_us: u64,
    /// Transfers by RDMA.
    pub rdma: u64,
    /// Transfers over plain HTTP.
    pub fallback: u64,
    /// Ratio of `mib_per_s` to the reference's same cell.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ratio: Option<f64>,
}

/// The whole run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Run {
    /// The endpoint.
    pub endpoint: String,
    /// Where buffers were: `host` or `gpu N`.
    pub memory: String,
    /// Whether the run was over plain HTTP without the library (`--http`).
    #[serde(default)]
    pub http: bool,
    /// Why there was no RDMA, if there was none.
    pub library: Option<String>,
    /// How each transfer's bytes were checked, or why they were not.
    #[serde(default)]
    pub verification: String,
    /// The cells.
    pub cells: Vec<Cell>,
}

pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    let (bucket, prefix) = parse_s3_url(&args.target)?;
    let common = &args.common;
    for op in &args.ops {
        if op != "get" && op != "put" {
            return Err(Failure::usage(format!(
                "--ops takes get and put, not {op:?}"
            )));
        }
    }
    if args.count == 0 || args.streams_list.contains(&0) || args.sizes.contains(&0) {
        return Err(Failure::usage(
            "--count, --streams-list and --sizes are at least 1",
        ));
    }
    if let Some(big) = args.sizes.iter().find(|s| **s > 4 << 30) {
        return Err(Failure::usage(format!(
            "{} is more than one registration (4 GiB)",
            human(*big)
        )));
    }
    let reference: Option<Run> = match &args.reference {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            Some(
                serde_json::from_str(&text)
                    .map_err(|e| format!("{path}: not a bench --json output: {e}"))?,
            )
        }
        None => None,
    };
    let s3 = s3(common)?;
    let library = if args.http {
        Err("--http: plain HTTP without the library".to_owned())
    } else {
        client(common)
    };
    let client = match &library {
        Ok(client) => Some(client),
        Err(_) if args.http => None,
        Err(why) => {
            return Err(format!(
                "{why}: bench measures the library, which is not there; --http measures plain HTTP instead, without it"
            )
            .into())
        }
    };
    if args.http && !args.json {
        eprintln!("hipobj bench: plain HTTP without the library (--http): a baseline, no RDMA");
    }
    let mut cells = Vec::new();
    for &size in &args.sizes {
        let len = usize::try_from(size).map_err(|_| "size".to_owned())?;
        let read_key = format!("{prefix}/hipobj-bench-{size}");
        if args.ops.iter().any(|o| o == "get") {
            let object = Object::new(&s3, &bucket, &read_key);
            match client {
                Some(client) => {
                    let mut buf = buffer(client, common, len)?;
                    fill(&mut buf, len)?;
                    objects::put(client, object, &buf, 0..len, policy(args))
                        .map_err(|e| e.to_string())?;
                }
                None => {
                    objects::put_http(object, &pattern(len), !args.no_verify)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        for op in &args.ops {
            for &streams in &args.streams_list {
                let target = Target {
                    s3: &s3,
                    bucket: &bucket,
                    prefix: &prefix,
                    read_key: &read_key,
                };
                let mut cell = measure(client, &target, op, len, streams, args.count, args)?;
                cell.ratio = reference.as_ref().and_then(|r| {
                    r.cells
                        .iter()
                        .find(|c| {
                            c.op == cell.op && c.size == cell.size && c.streams == cell.streams
                        })
                        .map(|c| cell.mib_per_s / c.mib_per_s)
                });
                if !args.json {
                    eprintln!(
                        "hipobj bench: {} {} x{}: {:.1} MiB/s",
                        cell.op,
                        human(cell.size),
                        cell.streams,
                        cell.mib_per_s
                    );
                }
                cells.push(cell);
            }
        }
    }
    let run = Run {
        endpoint: s3.config().endpoint.clone(),
        memory: match common.device {
            Some(n) => format!("gpu {n}"),
            None => "host".to_owned(),
        },
        http: args.http,
        library: library.as_ref().err().cloned(),
        verification: match (args.no_verify, common.device) {
            (true, _) => "not verified: --no-verify".to_owned(),
            (false, Some(_)) => Unchecked::Device.to_string(),
            (false, None) => "CRC-64/NVME of every GET and PUT".to_owned(),
        },
        cells,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&run).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", table(&run, reference.is_some()));
        if let Some(client) = client {
            println!("counters: {}", client.stats());
        }
    }
    Ok(())
}

/// What each transfer may do: the fallback unless --no-fallback, bytes
/// verified unless --no-verify.
fn policy(args: &BenchArgs) -> Policy {
    Policy {
        fallback: !args.common.no_fallback,
        verify: !args.no_verify,
    }
}

/// Where a cell's objects are.
struct Target<'a> {
    s3: &'a S3,
    bucket: &'a str,
    prefix: &'a str,
    read_key: &'a str,
}

/// A stream's memory: the library's buffer, or plain bytes for `--http`.
enum Memory {
    Registered(Buffer),
    Plain(Vec<u8>),
}

/// The bytes PUTs carry.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251).to_le_bytes()[0]).collect()
}

fn buffer(client: &Client, common: &Common, len: usize) -> Result<Buffer, Failure> {
    Ok(match common.device {
        Some(_) => client.device_buffer(len),
        None => client.host_buffer(len),
    }
    .map_err(|e| e.to_string())?)
}

/// Fills a buffer with a pattern (so that PUTs carry something).
fn fill(buf: &mut Buffer, len: usize) -> Result<(), Failure> {
    Ok(buf.write_at(0, &pattern(len)).map_err(|e| e.to_string())?)
}

fn measure(
    client: Option<&Client>,
    target: &Target<'_>,
    op: &str,
    len: usize,
    streams: usize,
    count: usize,
    args: &BenchArgs,
) -> Result<Cell, Failure> {
    let common = &args.common;
    let policy = policy(args);
    let started = Instant::now();
    let outcomes: Vec<Result<Vec<(u64, bool)>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..streams)
            .map(|stream| {
                scope.spawn(move || -> Result<Vec<(u64, bool)>, String> {
                    let mut memory = match client {
                        Some(client) => {
                            let mut buf = buffer(client, common, len).map_err(|e| e.to_string())?;
                            if op == "put" {
                                fill(&mut buf, len).map_err(|e| e.to_string())?;
                            }
                            Memory::Registered(buf)
                        }
                        None => Memory::Plain(pattern(len)),
                    };
                    let write_key = format!("{}/hipobj-bench-{len}-put-{stream}", target.prefix);
                    let key = if op == "get" {
                        target.read_key
                    } else {
                        &write_key
                    };
                    let object = Object::new(target.s3, target.bucket, key);
                    let mut times = Vec::with_capacity(count);
                    for _ in 0..count {
                        let t = Instant::now();
                        let by_rdma = match (&mut memory, client) {
                            (Memory::Registered(buf), Some(client)) => if op == "get" {
                                objects::get(client, object, 0..len as u64, buf, 0, policy)
                            } else {
                                objects::put(client, object, buf, 0..len, policy)
                            }
                            .map(|moved| matches!(moved.path, Via::Rdma(_))),
                            (Memory::Plain(bytes), _) => if op == "get" {
                                objects::get_http(object, 0..len as u64, bytes, policy.verify)
                            } else {
                                objects::put_http(object, bytes, policy.verify)
                            }
                            .map(|_| false),
                            (Memory::Registered(_), None) => {
                                unreachable!("a buffer needs a client")
                            }
                        }
                        .map_err(|e| e.to_string())?;
                        let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                        times.push((us, by_rdma));
                    }
                    Ok(times)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a stream panicked".to_owned()))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut times = Vec::new();
    for outcome in outcomes {
        times.extend(outcome?);
    }
    let mut latencies: Vec<u64> = times.iter().map(|(us, _)| *us).collect();
    latencies.sort_unstable();
    // The nearest rank at or below the quantile (per mille).
    let pick = |per_mille: usize| {
        let i = latencies.len().saturating_sub(1) * per_mille / 1000;
        latencies.get(i).copied().unwrap_or(0)
    };
    let rdma = times.iter().filter(|(_, r)| *r).count() as u64;
    let transfers = times.len() as u64;
    Ok(Cell {
        op: op.to_owned(),
        size: len as u64,
        streams,
        transfers,
        seconds,
        mib_per_s: mib_per_s(len as u64 * transfers, seconds),
        p50_us: pick(500),
        p99_us: pick(990),
        rdma,
        fallback: transfers - rdma,
        ratio: None,
    })
}

/// The run as a table.
fn table(run: &Run, with_ratio: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "endpoint {}, {} memory{}, {}",
        run.endpoint,
        run.memory,
        if run.http {
            ", plain HTTP without the library (--http)"
        } else {
            ""
        },
        run.verification
    );
    let _ = write!(
        out,
        "{:<4} {:>9} {:>7} {:>9} {:>10} {:>10} {:>10} {:>14}",
        "op", "size", "streams", "transfers", "MiB/s", "p50 ms", "p99 ms", "path"
    );
    if with_ratio {
        let _ = write!(out, " {:>7}", "ratio");
    }
    out.push('\n');
    for c in &run.cells {
        let path = match (c.rdma, c.fallback) {
            (_, 0) => "RDMA".to_owned(),
            (0, _) => "plain HTTP".to_owned(),
            (r, f) => format!("RDMA {r}, HTTP {f}"),
        };
        let _ = write!(
            out,
            "{:<4} {:>9} {:>7} {:>9} {:>10.1} {:>10.3} {:>10.3} {:>14}",
            c.op,
            human(c.size),
            c.streams,
            c.transfers,
            c.mib_per_s,
            c.p50_us as f64 / 1000.0,
            c.p99_us as f64 / 1000.0,
            path
        );
        if with_ratio {
            let _ = write!(
                out,
                " {:>7}",
                c.ratio.map_or("-".to_owned(), |r| format!("{r:.3}"))
            );
        }
        out.push('\n');
    }
    out
}
