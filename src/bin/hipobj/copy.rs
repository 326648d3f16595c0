//! `hipobj get`, `put` and `cp`.

use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use parking_lot::Mutex;

use hipobj::s3::objects::{self, Object};

use crate::files::{named, Input, Partial};
use crate::setup::{failure, finish_bar, library, plan, progress_bar, rdma, MAX_CHUNK};
use crate::summary::Report;
use crate::units::human;
use crate::{interrupt, parse_s3_prefix, parse_s3_url, s3, Common, Failure, Transfer};

/// `hipobj cp`: a download or an upload, by which side is `s3://`.
pub fn cp(
    source: &str,
    destination: &str,
    range: Option<RangeSpec>,
    common: &Common,
    transfer: &Transfer,
) -> Result<(), Failure> {
    let sides = (
        source.starts_with("s3://"),
        destination.starts_with("s3://"),
    );
    if transfer.recursive {
        if range.is_some() {
            return Err(Failure::usage("--range is for one object, not --recursive"));
        }
        return match sides {
            (true, false) => crate::many::download(source, destination, common, transfer),
            (false, true) => crate::many::upload(source, destination, common, transfer),
            _ => Err(Failure::usage(
                "with --recursive, one of SOURCE and DESTINATION is s3://BUCKET/PREFIX and the other a directory",
            )),
        };
    }
    match sides {
        (true, false) => get(source, Some(destination), range, common, transfer),
        (false, true) if range.is_none() => put(source, destination, common, transfer),
        (false, true) => Err(Failure::usage("--range is for downloads")),
        _ => Err(Failure::usage(
            "one of SOURCE and DESTINATION is s3://BUCKET/KEY and the other a file (or -)",
        )),
    }
}

/// What `--range` says, before the object's size is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeSpec {
    /// `FIRST-LAST`, inclusive.
    Span(u64, u64),
    /// `FIRST-`: to the end.
    From(u64),
    /// `-N`: the last N bytes.
    Last(u64),
}

/// `FIRST-LAST`, `FIRST-` or `-N`, as HTTP writes byte ranges.
pub fn parse_range(text: &str) -> Result<RangeSpec, String> {
    let bad = || format!("{text:?} is not FIRST-LAST, FIRST- or -N (bytes, inclusive)");
    let (first, last) = text.trim().split_once('-').ok_or_else(bad)?;
    let number = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    match (first.trim(), last.trim()) {
        ("", "") => Err(bad()),
        ("", n) => match number(n)? {
            0 => Err(format!("{text:?} selects no byte")),
            n => Ok(RangeSpec::Last(n)),
        },
        (first, "") => Ok(RangeSpec::From(number(first)?)),
        (first, last) => {
            let (first, last) = (number(first)?, number(last)?);
            if last < first {
                return Err(format!(
                    "{text:?} ends (byte {last}) before its first byte ({first})"
                ));
            }
            Ok(RangeSpec::Span(first, last))
        }
    }
}

/// `range` of an object of `size` bytes, as a half-open range; LAST past
/// the end is the end, and the last N bytes of a smaller object are all of
/// it (as S3 answers).
fn resolve_range(range: Option<RangeSpec>, size: u64) -> Result<Range<u64>, Failure> {
    let (first, end) = match range {
        None => return Ok(0..size),
        Some(RangeSpec::Last(n)) => return Ok(size.saturating_sub(n)..size),
        Some(RangeSpec::From(first)) => (first, size),
        Some(RangeSpec::Span(first, last)) => (first, last.saturating_add(1).min(size)),
    };
    if first >= size {
        return Err(Failure::usage(format!(
            "--range starts at byte {first}, past the object's end ({size} bytes)"
        )));
    }
    Ok(first..end)
}

/// Where a download lands when `destination` names a directory (an
/// existing one, or a path ending in `/`): the object's base name in it.
fn destination_file(destination: &str, key: &str) -> Result<PathBuf, Failure> {
    let path = Path::new(destination);
    if !(destination.ends_with('/') || path.is_dir()) {
        return Ok(path.to_owned());
    }
    match key.rsplit('/').next() {
        Some(name) if !name.is_empty() && name != "." && name != ".." => Ok(path.join(name)),
        _ => Err(Failure::usage(format!(
            "{destination} is a directory and the key {key:?} has no name to give a file in it"
        ))),
    }
}

/// `hipobj get`.
pub fn get(
    source: &str,
    destination: Option<&str>,
    range: Option<RangeSpec>,
    common: &Common,
    transfer: &Transfer,
) -> Result<(), Failure> {
    if transfer.recursive {
        if range.is_some()
            || destination == Some("-")
            || common.device.is_some() && destination.is_none()
        {
            return Err(Failure::usage(
                "get --recursive takes whole objects into a DESTINATION directory",
            ));
        }
        return crate::many::download(source, destination.unwrap_or("."), common, transfer);
    }
    let (bucket, key) = parse_s3_url(source)?;
    let mut plan = plan(common, transfer, interrupt::cancel())?;
    if destination.is_none() && common.device.is_none() {
        return Err(Failure::usage("get needs a DESTINATION file (or - for standard output) unless --device keeps the object in GPU memory"));
    }
    let file = match destination {
        Some(d) if d != "-" => Some(destination_file(d, &key)?),
        _ => None,
    };
    let s3 = s3(common)?;
    let library = library(common)?;
    let retried = AtomicU64::new(0);
    let head = objects::retrying(plan.retries, &plan.cancel, &retried, || {
        Ok(s3.head(&bucket, &key)?)
    })
    .map_err(|e| e.to_string())?;
    let range = resolve_range(range, head.len)?;
    let total = range.end - range.start;
    let object = Object {
        s3: &s3,
        bucket: &bucket,
        key: &key,
        etag: head.etag.as_deref(),
        size: Some(head.len),
    };
    let what = format!("get {source}");
    let started = Instant::now();
    let bar = progress_bar(total, transfer, &what);
    let progress = |n| bar.inc(n);
    let (summary, landed) = match (destination, &file) {
        (None, _) => {
            // The whole object in one buffer of GPU memory.
            if total > MAX_CHUNK {
                return Err(format!(
                    "{} does not fit one GPU buffer ({} at most): give a DESTINATION to take it in chunks",
                    human(total),
                    human(MAX_CHUNK)
                )
                .into());
            }
            plan.chunk = usize::try_from(total.max(1)).map_err(|_| "size".to_owned())?;
            plan.streams = 1;
            let summary = objects::download(rdma(&library), object, range, &plan, None, &progress);
            (
                summary,
                format!("GPU {} memory", common.device.unwrap_or(0)),
            )
        }
        (Some(_), None) => {
            // In order: one stream takes the chunks one after the other.
            plan.streams = 1;
            let stdout = Mutex::new(std::io::BufWriter::with_capacity(
                1 << 20,
                std::io::stdout(),
            ));
            let sink = |_offset: u64, bytes: &[u8]| {
                stdout
                    .lock()
                    .write_all(bytes)
                    .map_err(|e| named("standard output", e))
            };
            let summary =
                objects::download(rdma(&library), object, range, &plan, Some(&sink), &progress);
            stdout
                .lock()
                .flush()
                .map_err(|e| format!("standard output: {e}"))?;
            (summary, "standard output".to_owned())
        }
        (Some(_), Some(path)) => {
            let partial = Partial::create(path, total)?;
            let sink = |offset: u64, bytes: &[u8]| partial.write_at(bytes, offset);
            let summary =
                objects::download(rdma(&library), object, range, &plan, Some(&sink), &progress);
            match summary {
                Ok(summary) => {
                    partial.keep()?;
                    (Ok(summary), path.display().to_string())
                }
                Err(e) => (Err(e), path.display().to_string()),
            }
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut summary = summary.map_err(|e| failure(e, "download"))?;
    summary.retries += retried.into_inner();
    finish_bar(&bar, summary.bytes, seconds);
    Report {
        what: &format!("get {source} -> {landed}"),
        summary: &summary,
        seconds,
        library: &library,
        put: false,
        many: None,
    }
    .print(transfer, destination == Some("-"));
    Ok(())
}

/// `hipobj put`.
pub fn put(
    source: &str,
    destination: &str,
    common: &Common,
    transfer: &Transfer,
) -> Result<(), Failure> {
    if transfer.recursive {
        return crate::many::upload(source, destination, common, transfer);
    }
    let (bucket, mut key) = parse_s3_prefix(destination)?;
    if key.is_empty() || key.ends_with('/') {
        // A prefix: the file's own name after it, as aws-cli does.
        let name = Path::new(source)
            .file_name()
            .filter(|_| source != "-")
            .ok_or_else(|| {
                Failure::usage(format!(
                    "{destination} is a prefix and {source} has no name to put after it: give the whole key"
                ))
            })?;
        key.push_str(&name.to_string_lossy());
    }
    let destination = format!("s3://{bucket}/{key}");
    let plan = plan(common, transfer, interrupt::cancel())?;
    // The input first: a missing file sends nothing.
    let input = Input::open(source)?;
    let s3 = s3(common)?;
    let library = library(common)?;
    let object = Object::new(&s3, &bucket, &key);
    let what = format!("put {destination}");
    let started = Instant::now();
    let source_fn = |offset: u64, out: &mut [u8]| input.read_at(offset, out);
    let bar = progress_bar(input.len, transfer, &what);
    if input.len > plan.chunk as u64 {
        // A multipart upload: an interrupt lets it abort.
        interrupt::graceful();
    }
    let summary = objects::upload(rdma(&library), object, input.len, &plan, &source_fn, &|n| {
        bar.inc(n)
    });
    let seconds = started.elapsed().as_secs_f64();
    let summary = summary.map_err(|e| failure(e, "upload"))?;
    finish_bar(&bar, summary.bytes, seconds);
    let from = match common.device {
        Some(n) => format!("{source} (through GPU {n} memory)"),
        None => source.to_owned(),
    };
    Report {
        what: &format!("put {from} -> {destination}"),
        summary: &summary,
        seconds,
        library: &library,
        put: true,
        many: None,
    }
    .print(transfer, false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_inclusive_clamped_to_the_object_and_may_count_from_the_end() {
        let at = |text: &str, size| resolve_range(Some(parse_range(text).unwrap()), size);
        assert_eq!(resolve_range(None, 100).unwrap(), 0..100);
        assert_eq!(at("10-19", 100).unwrap(), 10..20);
        assert_eq!(at("90-", 100).unwrap(), 90..100);
        assert_eq!(at("90-1000", 100).unwrap(), 90..100);
        assert_eq!(at("-30", 100).unwrap(), 70..100);
        assert_eq!(at("-300", 100).unwrap(), 0..100);
        assert!(at("100-", 100).is_err(), "past the end");
        for bad in ["5-4", "x-1", "7", "-", "-0", "1-2-3"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
        assert!(parse_range("100-10")
            .unwrap_err()
            .contains("before its first"));
    }
}
