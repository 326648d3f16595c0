//! `--recursive`: a whole prefix down into a directory, or a directory up
//! under a prefix, `--jobs` objects at a time (each in `--chunk` transfers
//! on its own `--streams`), with one progress bar for the whole copy and
//! one summary of what carried the bytes.
//!
//! Nothing half-written stays: a downloaded file is written beside its
//! destination and renamed into place only once whole (as one object's
//! download), an uploaded object appears in S3 only once whole (a PUT, or a
//! multipart upload completed; aborted on failure). At the first failure,
//! no new object starts and the ones in flight stop; the objects that had
//! ended stay, and the summary says how many.
//!
//! The plan is made before any byte moves: every key of the listing must
//! name a file inside the destination (no `..`, no empty or absolute
//! component, no file that another key needs as a directory), every file
//! of the directory a key (UTF-8 names); otherwise nothing is copied.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use hipobj::client::Client;
use hipobj::s3::objects::{self, Object, Plan, Summary, TransferError};
use hipobj::s3::S3;

use crate::files::{Input, Partial};
use crate::setup::{failure, finish_bar, library, plan, progress_bar, rdma};
use crate::summary::{Many, Report};
use crate::{interrupt, s3, Common, Failure, Transfer};

/// One object of the copy.
struct Item {
    /// Its key.
    key: String,
    /// The file.
    path: PathBuf,
    /// Bytes.
    size: u64,
    /// The listing's ETag (downloads: every chunk asks for this version;
    /// without one, the version a HEAD finds).
    etag: Option<String>,
}

/// `s3://BUCKET`, `s3://BUCKET/` or `s3://BUCKET/PREFIX`: the bucket, and
/// the prefix as a directory (ending in `/`, or empty).
fn parse_prefix(url: &str) -> Result<(String, String), Failure> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| Failure::usage(format!("{url:?} is not an s3://BUCKET/PREFIX address")))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Failure::usage(format!("{url:?} has no bucket")));
    }
    let mut prefix = prefix.to_owned();
    if !prefix.is_empty() && !prefix.ends_with('/') {
        prefix.push('/');
    }
    Ok((bucket.to_owned(), prefix))
}

/// The file under `root` that `key` (under `prefix`) lands in: its
/// components after the prefix, each a plain name.
fn file_of(root: &Path, prefix: &str, key: &str) -> Result<PathBuf, String> {
    let rest = key
        .strip_prefix(prefix)
        .ok_or_else(|| format!("{key:?} is not under {prefix:?}"))?;
    let mut path = root.to_owned();
    for part in rest.split('/') {
        if part.is_empty() || part == "." || part == ".." || part.contains('\0') {
            return Err(format!(
                "the key {key:?} does not name a file inside {} (an empty, \".\" or \"..\" component): \
                 nothing was copied; copy the other objects by a narrower prefix",
                root.display()
            ));
        }
        path.push(part);
    }
    Ok(path)
}

/// Checks that no file of the plan is a directory of another's path.
fn no_file_is_a_directory(items: &[Item]) -> Result<(), String> {
    let files: BTreeSet<&Path> = items.iter().map(|i| i.path.as_path()).collect();
    for item in items {
        for dir in item.path.ancestors().skip(1) {
            if files.contains(dir) {
                return Err(format!(
                    "{} would be both a file and the directory of {}: nothing was copied",
                    dir.display(),
                    item.path.display()
                ));
            }
        }
    }
    Ok(())
}

/// The copy's totals.
#[derive(Default)]
struct Totals {
    objects: u64,
    summary: Summary,
}

impl Totals {
    fn add(&mut self, one: &Summary) {
        self.objects += 1;
        let s = &mut self.summary;
        s.bytes += one.bytes;
        s.transfers += one.transfers;
        s.direct += one.direct;
        s.staged += one.staged;
        s.fallback += one.fallback;
        s.parts += one.parts;
        s.retries += one.retries;
        s.verified += one.verified;
        if s.fallback_reason.is_none() {
            s.fallback_reason.clone_from(&one.fallback_reason);
        }
        if s.unverified_reason.is_none() {
            s.unverified_reason = one.unverified_reason;
        }
    }
}

/// Runs `one` on every item, `jobs` at a time, until all are done or one
/// fails (then no new one starts, and those running are cancelled). The
/// totals of those that ended, and the first failure.
fn run_jobs(
    items: &[Item],
    jobs: usize,
    cancel: &objects::Cancel,
    one: &(dyn Fn(&Item) -> Result<Summary, Failure> + Sync),
) -> (Totals, Option<Failure>) {
    let next = AtomicUsize::new(0);
    let totals = Mutex::new(Totals::default());
    let first: Mutex<Option<Failure>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(items.len()) {
            s.spawn(|| loop {
                if cancel.is_cancelled() {
                    return;
                }
                let Some(item) = items.get(next.fetch_add(1, Ordering::SeqCst)) else {
                    return;
                };
                match one(item) {
                    Ok(summary) => totals.lock().add(&summary),
                    Err(e) => {
                        let mut first = first.lock();
                        if first.is_none() {
                            *first = Some(e);
                        }
                        // The others stop at their next step.
                        cancel.cancel();
                        return;
                    }
                }
            });
        }
    });
    (totals.into_inner(), first.into_inner())
}

/// A copy of many objects that ran: what it was.
struct Ran<'a> {
    what: &'a str,
    planned: usize,
    jobs: usize,
    started: Instant,
    put: bool,
}

impl Ran<'_> {
    /// Its end: the first failure, with what was copied before it, or the
    /// bar finished and the summary printed.
    fn conclude(
        &self,
        (totals, first): (Totals, Option<Failure>),
        bar: &indicatif::ProgressBar,
        library: &Result<Client, String>,
        transfer: &Transfer,
    ) -> Result<(), Failure> {
        let seconds = self.started.elapsed().as_secs_f64();
        if let Some(e) = first {
            bar.abandon();
            let verb = if self.put { "uploaded" } else { "downloaded" };
            return Err(stopped(e, &totals, self.planned, verb));
        }
        finish_bar(bar, totals.summary.bytes, seconds);
        Report {
            what: self.what,
            summary: &totals.summary,
            seconds,
            library,
            put: self.put,
            many: Some(Many {
                objects: totals.objects,
                planned: self.planned,
                jobs: self.jobs,
            }),
        }
        .print(transfer, false);
        Ok(())
    }
}

fn jobs(transfer: &Transfer) -> Result<usize, Failure> {
    match transfer.jobs {
        0 => Err(Failure::usage("--jobs is at least 1")),
        n => Ok(n),
    }
}

/// The first failure of a copy, with what had been copied by then.
fn stopped(e: Failure, totals: &Totals, planned: usize, what: &str) -> Failure {
    format!(
        "{e} ({} of {planned} objects {what} before it, each whole; nothing else was kept)",
        totals.objects
    )
    .into()
}

/// The version of `item` to download: the listing's ETag; where the
/// listing has none (s3s-fs lists none), the one a HEAD finds, which must
/// still be of the listed size. Either way every chunk is pinned to it
/// (`If-Match`, each answer's ETag) and to the size (each answer's
/// `Content-Range` total). The HEAD's retries are counted in `retried`.
fn pinned(
    s3: &S3,
    bucket: &str,
    item: &Item,
    plan: &Plan,
    retried: &std::sync::atomic::AtomicU64,
) -> Result<Option<String>, TransferError> {
    if item.etag.is_some() {
        return Ok(item.etag.clone());
    }
    let head = objects::retrying(plan.retries, &plan.cancel, retried, || {
        Ok(s3.head(bucket, &item.key)?)
    })?;
    if head.len != item.size {
        return Err(TransferError::Resized {
            what: format!("HEAD {bucket}/{}", item.key),
            expected: item.size,
            found: head.len,
        });
    }
    Ok(head.etag)
}

/// `cp --recursive s3://BUCKET/PREFIX DIR`: every object under the prefix
/// into a file under `destination`, by its key after the prefix.
pub fn download(
    source: &str,
    destination: &str,
    common: &Common,
    transfer: &Transfer,
) -> Result<(), Failure> {
    let jobs = jobs(transfer)?;
    let (bucket, prefix) = parse_prefix(source)?;
    let plan = plan(common, transfer, interrupt::cancel())?;
    let root = Path::new(destination);
    if root.exists() && !root.is_dir() {
        return Err(Failure::usage(format!(
            "{destination} is not a directory: --recursive copies into one"
        )));
    }
    let s3 = s3(common)?;
    let listed = s3
        .list_objects(&bucket, &prefix)
        .map_err(|e| Failure::from(format!("{e}")))?;
    let mut items = Vec::new();
    for object in listed {
        // A folder's marker ("dir/", empty) is no file.
        if object.key.ends_with('/') && object.size == 0 {
            continue;
        }
        items.push(Item {
            path: file_of(root, &prefix, &object.key)?,
            key: object.key,
            size: object.size,
            etag: object.etag,
        });
    }
    no_file_is_a_directory(&items)?;
    let what = format!("get {source} -> {destination}");
    if items.is_empty() {
        eprintln!("hipobj: {what}: no object under s3://{bucket}/{prefix}: nothing to copy");
        return Ok(());
    }
    let library = library(common)?;
    let total: u64 = items.iter().map(|i| i.size).sum();
    let bar = progress_bar(total, transfer, &what);
    let started = Instant::now();
    let one = |item: &Item| -> Result<Summary, Failure> {
        if let Some(dir) = item.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let partial = Partial::create(&item.path, item.size)?;
        if item.size == 0 {
            partial.keep()?;
            return Ok(Summary::default());
        }
        let named = |e: TransferError| {
            Failure::from(format!(
                "s3://{bucket}/{}: {}",
                item.key,
                failure(e, "download")
            ))
        };
        let retried = std::sync::atomic::AtomicU64::new(0);
        let etag = pinned(&s3, &bucket, item, &plan, &retried).map_err(named)?;
        let object = Object {
            s3: &s3,
            bucket: &bucket,
            key: &item.key,
            etag: etag.as_deref(),
            size: Some(item.size),
        };
        let sink = |offset: u64, bytes: &[u8]| partial.write_at(bytes, offset);
        let mut summary = objects::download(
            rdma(&library),
            object,
            0..item.size,
            &plan,
            Some(&sink),
            &|n| bar.inc(n),
        )
        .map_err(named)?;
        summary.retries += retried.into_inner();
        partial.keep()?;
        Ok(summary)
    };
    let ended = run_jobs(&items, jobs, &plan.cancel, &one);
    let ran = Ran {
        what: &what,
        planned: items.len(),
        jobs,
        started,
        put: false,
    };
    ran.conclude(ended, &bar, &library, transfer)
}

/// The regular files under `root`, sorted, each with its path relative
/// to it (`/`-separated). Directories that are links are not followed.
fn walk(root: &Path) -> Result<Vec<(PathBuf, String, u64)>, Failure> {
    let mut files = Vec::new();
    let mut dirs = vec![(root.to_owned(), String::new())];
    while let Some((dir, rel)) = dirs.pop() {
        let mut entries = std::fs::read_dir(&dir)
            .and_then(|entries| entries.collect::<std::io::Result<Vec<_>>>())
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            let path = entry.path();
            let name = entry.file_name().into_string().map_err(|name| {
                format!(
                    "{}: {name:?} is not UTF-8 and cannot be an S3 key: nothing was copied",
                    dir.display()
                )
            })?;
            let kind = entry
                .file_type()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let key = format!("{rel}{name}");
            if kind.is_dir() {
                dirs.push((path, format!("{key}/")));
                continue;
            }
            // A link to a file is copied as that file.
            let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if meta.is_file() {
                files.push((path, key, meta.len()));
            }
        }
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(files)
}

/// `cp --recursive DIR s3://BUCKET/PREFIX`: every regular file under
/// `source` as an object under the prefix, by its path in the directory.
pub fn upload(
    source: &str,
    destination: &str,
    common: &Common,
    transfer: &Transfer,
) -> Result<(), Failure> {
    let jobs = jobs(transfer)?;
    let (bucket, prefix) = parse_prefix(destination)?;
    let plan = plan(common, transfer, interrupt::cancel())?;
    let root = Path::new(source);
    if !root.is_dir() {
        return Err(Failure::usage(format!(
            "{source} is not a directory: --recursive copies one"
        )));
    }
    let items: Vec<Item> = walk(root)?
        .into_iter()
        .map(|(path, rel, size)| Item {
            key: format!("{prefix}{rel}"),
            path,
            size,
            etag: None,
        })
        .collect();
    let what = format!("put {source} -> {destination}");
    if items.is_empty() {
        eprintln!("hipobj: {what}: no file under {source}: nothing to copy");
        return Ok(());
    }
    let s3: S3 = s3(common)?;
    let library = library(common)?;
    // An interrupt stops new objects and lets the multipart uploads abort.
    interrupt::graceful();
    let total: u64 = items.iter().map(|i| i.size).sum();
    let bar = progress_bar(total, transfer, &what);
    let started = Instant::now();
    let one = |item: &Item| -> Result<Summary, Failure> {
        let shown = item.path.display().to_string();
        let input = Input::open(&shown)?;
        let object = Object::new(&s3, &bucket, &item.key);
        let source_fn = |offset: u64, out: &mut [u8]| input.read_at(offset, out);
        objects::upload(rdma(&library), object, input.len, &plan, &source_fn, &|n| {
            bar.inc(n)
        })
        .map_err(|e| Failure::from(format!("{shown}: {}", failure(e, "upload"))))
    };
    let ended = run_jobs(&items, jobs, &plan.cancel, &one);
    let ran = Ran {
        what: &what,
        planned: items.len(),
        jobs,
        started,
        put: true,
    };
    ran.conclude(ended, &bar, &library, transfer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_a_directory_of_keys() {
        assert_eq!(parse_prefix("s3://b").unwrap(), ("b".into(), String::new()));
        assert_eq!(
            parse_prefix("s3://b/").unwrap(),
            ("b".into(), String::new())
        );
        assert_eq!(
            parse_prefix("s3://b/data").unwrap(),
            ("b".into(), "data/".into())
        );
        assert_eq!(
            parse_prefix("s3://b/data/").unwrap(),
            ("b".into(), "data/".into())
        );
        assert!(parse_prefix("s3:///x").is_err());
        assert!(parse_prefix("b/x").is_err());
    }

    #[test]
    fn every_key_lands_inside_the_destination_or_nothing_is_copied() {
        let root = Path::new("/dest");
        assert_eq!(
            file_of(root, "data/", "data/a/b.bin").unwrap(),
            Path::new("/dest/a/b.bin")
        );
        for key in [
            "data/../etc/passwd",
            "data/a/../../x",
            "data//x",
            "data/./x",
            "data/",
            "data/x/",
            "other/x",
        ] {
            assert!(file_of(root, "data/", key).is_err(), "{key}");
        }
        let item = |p: &str| Item {
            key: String::new(),
            path: PathBuf::from(p),
            size: 1,
            etag: None,
        };
        assert!(no_file_is_a_directory(&[item("/d/a"), item("/d/b/c")]).is_ok());
        let clash = no_file_is_a_directory(&[item("/d/a"), item("/d/a/c")]).unwrap_err();
        assert!(clash.contains("both a file and the directory"), "{clash}");
    }
}
