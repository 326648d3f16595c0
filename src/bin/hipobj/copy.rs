//! `hipobj get`, `put` and `cp`.

use std::fs::File;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;

use hipobj::client::{Client, ClientStats};
use hipobj::s3::objects::{self, Object, Plan, Rdma, Summary};

use crate::units::{human, mib_per_s, rate};
use crate::{client, parse_s3_url, s3, Common, Failure};

/// The largest chunk: one registration covers at most 4 GiB.
const MAX_CHUNK: u64 = 4 << 30;
/// Transfers this long or longer get a progress bar (on a terminal).
const PROGRESS_FROM: u64 = 1 << 20;

/// `hipobj cp`: a download or an upload, by which side is `s3://`.
pub fn cp(
    source: &str,
    destination: &str,
    range: Option<&str>,
    common: &Common,
) -> Result<(), Failure> {
    match (
        source.starts_with("s3://"),
        destination.starts_with("s3://"),
    ) {
        (true, false) => get(source, Some(destination), range, common),
        (false, true) if range.is_none() => put(source, destination, common),
        (false, true) => Err("--range is for downloads".to_owned()),
        _ => Err(
            "one of SOURCE and DESTINATION is s3://BUCKET/KEY and the other a file (or -)"
                .to_owned(),
        ),
    }
}

/// `FIRST-LAST` or `FIRST-` of an object of `size` bytes, as a half-open
/// range; LAST past the end is the end (as S3 answers).
fn parse_range(text: Option<&str>, size: u64) -> Result<Range<u64>, Failure> {
    let Some(text) = text else {
        return Ok(0..size);
    };
    let bad = || format!("--range {text:?} is not FIRST-LAST or FIRST- (bytes, inclusive)");
    let (first, last) = text.split_once('-').ok_or_else(bad)?;
    let first: u64 = first.trim().parse().map_err(|_| bad())?;
    let end = match last.trim() {
        "" => size,
        last => last
            .parse::<u64>()
            .map_err(|_| bad())?
            .saturating_add(1)
            .min(size),
    };
    if first >= size {
        return Err(format!(
            "--range {text:?} starts past the object's end ({size} bytes)"
        ));
    }
    if end <= first {
        return Err(bad());
    }
    Ok(first..end)
}

/// The plan of `common`'s options.
fn plan(common: &Common) -> Result<Plan, Failure> {
    if common.chunk == 0 || common.chunk > MAX_CHUNK {
        return Err(format!("--chunk is 1 byte to {}", human(MAX_CHUNK)));
    }
    if common.streams == 0 {
        return Err("--streams is at least 1".to_owned());
    }
    Ok(Plan {
        chunk: usize::try_from(common.chunk).map_err(|_| "--chunk".to_owned())?,
        streams: common.streams,
        device: common.device.is_some(),
        fallback: !common.no_fallback,
    })
}

/// The library, or the reason transfers go without it; an error where that
/// is not allowed.
fn library(common: &Common) -> Result<Result<Client, String>, Failure> {
    match client(common) {
        Ok(client) => Ok(Ok(client)),
        Err(why) if common.no_fallback => Err(format!("{why} (and --no-fallback)")),
        Err(why) if common.device.is_some() => Err(format!("--device needs the library: {why}")),
        Err(why) => Ok(Err(why)),
    }
}

fn rdma<'a>(library: &'a Result<Client, String>) -> Rdma<'a> {
    match library {
        Ok(client) => Rdma::On(client),
        Err(why) => Rdma::Off(why),
    }
}

/// A progress bar on standard error for `total` bytes, shown only on a
/// terminal, for long transfers, unless `--no-progress`.
fn progress_bar(total: u64, common: &Common, what: &str) -> ProgressBar {
    if common.no_progress || total < PROGRESS_FROM {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

/// `hipobj get`.
pub fn get(
    source: &str,
    destination: Option<&str>,
    range: Option<&str>,
    common: &Common,
) -> Result<(), Failure> {
    let (bucket, key) = parse_s3_url(source)?;
    let mut plan = plan(common)?;
    if destination.is_none() && common.device.is_none() {
        return Err("get needs a DESTINATION file (or - for standard output) unless --device keeps the object in GPU memory".to_owned());
    }
    let s3 = s3(common)?;
    let library = library(common)?;
    let size = s3.head_object(&bucket, &key).map_err(|e| e.to_string())?;
    let range = parse_range(range, size)?;
    let total = range.end - range.start;
    let object = Object {
        s3: &s3,
        bucket: &bucket,
        key: &key,
    };
    let what = format!("get {source}");
    let started = Instant::now();
    let (summary, landed) = match destination {
        None => {
            // The whole object in one buffer of GPU memory.
            if total > MAX_CHUNK {
                return Err(format!(
                    "{} does not fit one GPU buffer ({} at most): give a DESTINATION to take it in chunks",
                    human(total),
                    human(MAX_CHUNK)
                ));
            }
            plan.chunk = usize::try_from(total.max(1)).map_err(|_| "size".to_owned())?;
            plan.streams = 1;
            let bar = progress_bar(total, common, &what);
            let summary =
                objects::download(rdma(&library), object, range, &plan, None, &|n| bar.inc(n));
            bar.finish();
            (
                summary,
                format!("GPU {} memory", common.device.unwrap_or(0)),
            )
        }
        Some("-") => {
            // In order: one stream takes the chunks one after the other.
            plan.streams = 1;
            let stdout = Mutex::new(std::io::BufWriter::with_capacity(
                1 << 20,
                std::io::stdout(),
            ));
            let sink = |_offset: u64, bytes: &[u8]| stdout.lock().write_all(bytes);
            let bar = progress_bar(total, common, &what);
            let summary =
                objects::download(rdma(&library), object, range, &plan, Some(&sink), &|n| {
                    bar.inc(n)
                });
            bar.finish();
            stdout
                .lock()
                .flush()
                .map_err(|e| format!("standard output: {e}"))?;
            (summary, "standard output".to_owned())
        }
        Some(path) => {
            let partial = Partial::create(Path::new(path), total)?;
            let sink = |offset: u64, bytes: &[u8]| partial.file.write_all_at(bytes, offset);
            let bar = progress_bar(total, common, &what);
            let summary =
                objects::download(rdma(&library), object, range, &plan, Some(&sink), &|n| {
                    bar.inc(n)
                });
            bar.finish();
            match summary {
                Ok(summary) => {
                    partial.keep()?;
                    (Ok(summary), path.to_owned())
                }
                Err(e) => (Err(e), path.to_owned()),
            }
        }
    };
    let summary = summary.map_err(|e| e.to_string())?;
    report(
        &format!("get {source} -> {landed}"),
        &summary,
        started,
        &library,
        common,
        destination == Some("-"),
    );
    Ok(())
}

/// A download written beside its destination and renamed over it only once
/// whole: a failed download leaves the destination as it was.
struct Partial {
    file: File,
    path: PathBuf,
    destination: PathBuf,
    kept: bool,
}

impl Partial {
    fn create(destination: &Path, len: u64) -> Result<Partial, Failure> {
        let name = destination
            .file_name()
            .ok_or_else(|| format!("{} is not a file name", destination.display()))?;
        let mut partial_name = std::ffi::OsString::from(".");
        partial_name.push(name);
        partial_name.push(format!(".hipobj-{}", std::process::id()));
        let path = destination.with_file_name(partial_name);
        let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let partial = Partial {
            file,
            path,
            destination: destination.to_owned(),
            kept: false,
        };
        partial
            .file
            .set_len(len)
            .map_err(|e| format!("{}: {e}", partial.path.display()))?;
        Ok(partial)
    }

    fn keep(mut self) -> Result<(), Failure> {
        self.file
            .sync_all()
            .and_then(|()| std::fs::rename(&self.path, &self.destination))
            .map_err(|e| format!("{}: {e}", self.destination.display()))?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `hipobj put`.
pub fn put(source: &str, destination: &str, common: &Common) -> Result<(), Failure> {
    let (bucket, key) = parse_s3_url(destination)?;
    let plan = plan(common)?;
    // The input first: a missing file sends nothing.
    let input = Input::open(source)?;
    let s3 = s3(common)?;
    let library = library(common)?;
    let object = Object {
        s3: &s3,
        bucket: &bucket,
        key: &key,
    };
    let what = format!("put {destination}");
    let started = Instant::now();
    let source_fn = |offset: u64, out: &mut [u8]| input.read_at(offset, out);
    let bar = progress_bar(input.len, common, &what);
    let summary = objects::upload(rdma(&library), object, input.len, &plan, &source_fn, &|n| {
        bar.inc(n)
    });
    bar.finish();
    let summary = summary.map_err(|e| e.to_string())?;
    let from = match common.device {
        Some(n) => format!("{source} (through GPU {n} memory)"),
        None => source.to_owned(),
    };
    report(
        &format!("put {from} -> {destination}"),
        &summary,
        started,
        &library,
        common,
        false,
    );
    Ok(())
}

/// What `put` reads: a file, or standard input read whole.
struct Input {
    file: Option<File>,
    bytes: Vec<u8>,
    len: u64,
}

impl Input {
    fn open(source: &str) -> Result<Input, Failure> {
        if source == "-" {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| format!("standard input: {e}"))?;
            let len = bytes.len() as u64;
            return Ok(Input {
                file: None,
                bytes,
                len,
            });
        }
        let file = File::open(source).map_err(|e| format!("{source}: {e}"))?;
        let meta = file.metadata().map_err(|e| format!("{source}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{source} is not a regular file"));
        }
        Ok(Input {
            file: Some(file),
            bytes: Vec::new(),
            len: meta.len(),
        })
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        match &self.file {
            Some(file) => file.read_exact_at(out, offset),
            None => {
                let at = usize::try_from(offset).map_err(std::io::Error::other)?;
                let bytes = self
                    .bytes
                    .get(at..at + out.len())
                    .ok_or_else(|| std::io::Error::other("past the end of standard input"))?;
                out.copy_from_slice(bytes);
                Ok(())
            }
        }
    }
}

/// The counters' `name=value` pairs as a JSON object.
fn counters_json(stats: &ClientStats) -> serde_json::Value {
    let text = stats.to_string();
    let map = text
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| {
            (
                k.to_owned(),
                serde_json::Value::from(v.parse::<u64>().unwrap_or(0)),
            )
        })
        .collect();
    serde_json::Value::Object(map)
}

/// How the transfers went, in words.
fn paths(summary: &Summary) -> String {
    let rdma = summary.direct + summary.staged;
    let mut parts = Vec::new();
    if rdma > 0 {
        parts.push(format!(
            "by RDMA {rdma} of {} transfers (direct {}, staged {})",
            summary.transfers, summary.direct, summary.staged
        ));
    }
    if summary.fallback > 0 {
        parts.push(format!(
            "over plain HTTP {} of {} transfers: {}",
            summary.fallback,
            summary.transfers,
            summary.fallback_reason.as_deref().unwrap_or("declined")
        ));
    }
    if parts.is_empty() {
        parts.push("an empty object, by a plain request".to_owned());
    }
    parts.join("; ")
}

/// Prints the summary: a line (and the counters) on standard error, or JSON.
fn report(
    what: &str,
    summary: &Summary,
    started: Instant,
    library: &Result<Client, String>,
    common: &Common,
    stdout_taken: bool,
) {
    let seconds = started.elapsed().as_secs_f64();
    if common.json {
        let value = serde_json::json!({
            "operation": what,
            "bytes": summary.bytes,
            "seconds": seconds,
            "mib_per_s": mib_per_s(summary.bytes, seconds),
            "transfers": summary.transfers,
            "rdma_direct": summary.direct,
            "rdma_staged": summary.staged,
            "fallback": summary.fallback,
            "fallback_reason": summary.fallback_reason,
            "parts": summary.parts,
            "library": library.as_ref().err(),
            "counters": library.as_ref().ok().map(|c| counters_json(&c.stats())),
        });
        if stdout_taken {
            eprintln!("{value}");
        } else {
            println!("{value}");
        }
        return;
    }
    let multipart = if summary.parts > 0 {
        format!(", multipart in {} parts", summary.parts)
    } else {
        String::new()
    };
    eprintln!(
        "hipobj: {what}: {} in {seconds:.2} s ({}){multipart}; {}",
        human(summary.bytes),
        rate(summary.bytes, seconds),
        paths(summary)
    );
    match library {
        Ok(client) => eprintln!("hipobj: counters: {}", client.stats()),
        Err(why) => eprintln!("hipobj: no RDMA: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_inclusive_and_clamped_to_the_object() {
        assert_eq!(parse_range(None, 100), Ok(0..100));
        assert_eq!(parse_range(Some("10-19"), 100), Ok(10..20));
        assert_eq!(parse_range(Some("90-"), 100), Ok(90..100));
        assert_eq!(parse_range(Some("90-1000"), 100), Ok(90..100));
        for bad in ["100-", "5-4", "x-1", "7", "-5"] {
            assert!(parse_range(Some(bad), 100).is_err(), "{bad}");
        }
    }
}
