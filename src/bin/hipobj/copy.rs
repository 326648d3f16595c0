//! `hipobj get`, `put` and `cp`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;

use hipobj::client::{Client, ClientStats};
use hipobj::s3::objects::{self, Cancel, Object, Plan, Rdma, Summary, TransferError, Unchecked};

use crate::units::{human, mib_per_s, rate};
use crate::{client, interrupt, parse_s3_prefix, parse_s3_url, s3, Common, Failure, Transfer};

/// The largest chunk: one registration covers at most 4 GiB.
const MAX_CHUNK: u64 = 4 << 30;
/// Transfers this long or longer get a progress bar (on a terminal).
const PROGRESS_FROM: u64 = 1 << 20;

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

/// The plan of `transfer`'s options.
pub(crate) fn plan(common: &Common, transfer: &Transfer, cancel: Cancel) -> Result<Plan, Failure> {
    if transfer.chunk == 0 || transfer.chunk > MAX_CHUNK {
        return Err(Failure::usage(format!(
            "--chunk is 1 byte to {}",
            human(MAX_CHUNK)
        )));
    }
    if transfer.streams == 0 {
        return Err(Failure::usage("--streams is at least 1"));
    }
    Ok(Plan {
        chunk: usize::try_from(transfer.chunk).map_err(|_| Failure::usage("--chunk"))?,
        streams: transfer.streams,
        device: common.device.is_some(),
        fallback: !common.no_fallback,
        verify: !transfer.no_verify,
        retries: transfer.retries,
        cancel,
    })
}

/// The library, or the reason transfers go without it; an error where that
/// is not allowed.
pub(crate) fn library(common: &Common) -> Result<Result<Client, String>, Failure> {
    match client(common) {
        Ok(client) => Ok(Ok(client)),
        Err(why) if common.no_fallback => Err(format!("{why} (and --no-fallback)").into()),
        Err(why) if common.device.is_some() => {
            Err(format!("--device needs the library: {why}").into())
        }
        Err(why) => Ok(Err(why)),
    }
}

pub(crate) fn rdma<'a>(library: &'a Result<Client, String>) -> Rdma<'a> {
    match library {
        Ok(client) => Rdma::On(client),
        Err(why) => Rdma::Off(why),
    }
}

/// A progress bar on standard error for `total` bytes, shown only on a
/// terminal, for long transfers, unless `--no-progress`.
pub(crate) fn progress_bar(total: u64, transfer: &Transfer, what: &str) -> ProgressBar {
    if transfer.no_progress || total < PROGRESS_FROM {
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

/// Leaves the bar on the screen with the summary's own rate (the running
/// rate of the bar is a recent one, not the whole transfer's).
pub(crate) fn finish_bar(bar: &ProgressBar, bytes: u64, seconds: f64) {
    if bar.is_hidden() {
        return;
    }
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{msg}} [{{bar:30}}] {{binary_bytes}}/{{binary_total_bytes}} {}",
        rate(bytes, seconds)
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.finish();
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
    report(
        &format!("get {source} -> {landed}"),
        &summary,
        seconds,
        &library,
        transfer,
        destination == Some("-"),
    );
    Ok(())
}

/// A transfer's error, in the command's words.
pub(crate) fn failure(e: TransferError, what: &str) -> Failure {
    match e {
        TransferError::Cancelled => format!("interrupted: the {what} stopped").into(),
        TransferError::Changed { .. } | TransferError::Resized { .. } => {
            format!("{e}; nothing was kept: run the command again to get the new version").into()
        }
        TransferError::Corrupt { .. } if what == "download" => {
            format!("{e}; nothing was kept").into()
        }
        e => e.to_string().into(),
    }
}

/// `e` with `what` it happened to.
fn named(what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A download written beside its destination and renamed over it only once
/// whole: a failed download leaves the destination as it was. The file is
/// new (never one that was there: a planted link is not followed), has a
/// name no one can guess, and is readable by its owner alone until it
/// takes the destination's place, with a new file's mode.
pub(crate) struct Partial {
    file: File,
    path: PathBuf,
    destination: PathBuf,
    kept: bool,
}

impl Partial {
    pub(crate) fn create(destination: &Path, len: u64) -> Result<Partial, Failure> {
        let shown = destination.display();
        let name = destination
            .file_name()
            .ok_or_else(|| Failure::usage(format!("{shown} is not a file name")))?;
        let dir = match destination.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(format!("{shown}: the directory {} does not exist", dir.display()).into());
        }
        let mut attempts = 0;
        let (file, path) = loop {
            let mut partial_name = std::ffi::OsString::from(".");
            partial_name.push(name);
            partial_name.push(format!(".hipobj-{:016x}", random()?));
            let path = destination.with_file_name(partial_name);
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path);
            match opened {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 8 => {
                    attempts += 1;
                }
                Err(e) => {
                    return Err(format!("{shown}: cannot create a file beside it: {e}").into())
                }
            }
        };
        interrupt::partial(path.clone());
        let partial = Partial {
            file,
            path,
            destination: destination.to_owned(),
            kept: false,
        };
        partial
            .file
            .set_len(len)
            .map_err(|e| format!("{shown}: {e}"))?;
        Ok(partial)
    }

    /// Writes `bytes` at `offset`; an error names the destination.
    pub(crate) fn write_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| named(&self.destination.display().to_string(), e))
    }

    /// Gives the file a new file's mode, makes it durable and renames it
    /// over the destination, then makes the rename durable.
    pub(crate) fn keep(mut self) -> Result<(), Failure> {
        let shown = self.destination.display().to_string();
        let mode = 0o666 & !umask();
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .and_then(|()| self.file.sync_all())
            .and_then(|()| std::fs::rename(&self.path, &self.destination))
            .map_err(|e| format!("{shown}: {e}"))?;
        self.kept = true;
        interrupt::forget_partial(&self.path);
        let dir = match self.destination.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("{shown}: renamed into place, but {}: {e}", dir.display()))?;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
            interrupt::forget_partial(&self.path);
        }
    }
}

/// 64 random bits for a file name.
fn random() -> Result<u64, Failure> {
    getrandom::u64().map_err(|e| Failure::from(format!("no randomness: {e}")))
}

/// The process's umask (`Umask:` of /proc/self/status), 022 if unknown.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
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
    report(
        &format!("put {from} -> {destination}"),
        &summary,
        seconds,
        &library,
        transfer,
        false,
    );
    Ok(())
}

/// What `put` reads: a file, or standard input read whole.
pub(crate) struct Input {
    file: Option<File>,
    bytes: Vec<u8>,
    pub(crate) len: u64,
}

impl Input {
    pub(crate) fn open(source: &str) -> Result<Input, Failure> {
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
            return Err(format!("{source} is not a regular file").into());
        }
        Ok(Input {
            file: Some(file),
            bytes: Vec::new(),
            len: meta.len(),
        })
    }

    pub(crate) fn read_at(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
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
pub(crate) fn counters_json(stats: &ClientStats) -> serde_json::Value {
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
pub(crate) fn paths(summary: &Summary) -> String {
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
    match summary.retries {
        0 => {}
        1 => parts.push("1 request retried".to_owned()),
        n => parts.push(format!("{n} requests retried")),
    }
    parts.join("; ")
}

/// Whether every transfer's bytes were checked, and what was (or why
/// not), in words.
pub(crate) fn verification(summary: &Summary, put: bool) -> (bool, String) {
    let how = if put {
        "CRC-64/NVME sent with the bytes, for the server to check"
    } else {
        "CRC-64/NVME of the bytes that arrived compared with the server's"
    };
    let why = match summary.unverified_reason {
        Some(Unchecked::Off) => "--no-verify".to_owned(),
        Some(why) => why.to_string(),
        None => String::new(),
    };
    if summary.all_verified() {
        (true, format!("verified ({how})"))
    } else if summary.verified > 0 {
        (
            false,
            format!(
                "verified {} of {} transfers ({how}); not the others: {why}",
                summary.verified, summary.transfers
            ),
        )
    } else {
        (false, format!("not verified: {why}"))
    }
}

/// Prints the summary: a line (and the counters, or why there is no RDMA
/// when the line did not say it) on standard error, or JSON.
fn report(
    what: &str,
    summary: &Summary,
    seconds: f64,
    library: &Result<Client, String>,
    transfer: &Transfer,
    stdout_taken: bool,
) {
    let (verified, verification) = verification(summary, what.starts_with("put"));
    if transfer.json {
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
            "retries": summary.retries,
            "verified": verified,
            "verification": verification,
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
        "hipobj: {what}: {} in {seconds:.2} s ({}){multipart}; {}; {verification}",
        human(summary.bytes),
        rate(summary.bytes, seconds),
        paths(summary)
    );
    match library {
        Ok(client) => eprintln!("hipobj: counters: {}", client.stats()),
        // The summary gave the reason with the fallback.
        Err(_) if summary.fallback > 0 => {}
        Err(why) => eprintln!("hipobj: no RDMA: {why}"),
    }
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

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hipobj-copy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_partial_file_never_follows_a_planted_link() {
        let dir = scratch("link");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let destination = dir.join("out.bin");
        // The name the partial file once had, predictable from the pid.
        let planted = dir.join(format!(".out.bin.hipobj-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let partial = Partial::create(&destination, 4).unwrap();
        partial.write_at(b"evil", 0).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        partial.keep().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&destination).unwrap(), b"evil");
        assert!(std::fs::symlink_metadata(&destination)
            .unwrap()
            .file_type()
            .is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_partial_file_is_its_owner_s_alone_until_kept_with_a_new_file_s_mode() {
        let dir = scratch("mode");
        let destination = dir.join("out.bin");
        let partial = Partial::create(&destination, 4).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&partial.path), 0o600);
        let other = Partial::create(&destination, 4).unwrap();
        assert_ne!(partial.path, other.path, "names no one can guess");
        drop(other);
        partial.keep().unwrap();
        assert_eq!(mode(&destination), 0o666 & !umask());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the destination");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_write_names_the_destination() {
        let dir = scratch("full");
        let destination = dir.join("out.bin");
        let mut partial = Partial::create(&destination, 4).unwrap();
        // A device that is always full.
        partial.file = File::options().write(true).open("/dev/full").unwrap();
        let e = partial.write_at(b"data", 0).unwrap_err().to_string();
        assert!(
            e.contains(&destination.display().to_string()) && e.contains("No space left"),
            "{e}"
        );
        drop(partial);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
