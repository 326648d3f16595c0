//! The cache's second tier (`--cache-dir`, `--cache-dir-bytes`): every
//! object kept in memory is also written to a file of its own in a local
//! directory, so that an object evicted from memory, or held by a gateway
//! that restarted, is read from the disk instead of the store.
//!
//! - **A file** is written whole under a temporary name and renamed into
//!   place, so that a name in the directory is never a half-written file
//!   of this process's. Its layout: the magic `hipobjc1`, the length of a
//!   JSON header (4 bytes, little-endian), the CRC64/NVME of that header
//!   (8 bytes, little-endian), the header (the bucket, the key, what a GET
//!   says of the object, the CRC64/NVME of its bytes, when it was filled),
//!   then the object's bytes.
//! - **Checked on reuse**: a restart reads every file's header (a header
//!   that does not match its CRC, or a file whose length is not the
//!   header's, is deleted); each read of a file's bytes checks them against
//!   the header's CRC64/NVME before a reader sees one of them. A file that
//!   fails is deleted and the object read from the store.
//! - **Bounded** by `--cache-dir-bytes`, with the memory tier's policy
//!   (S3-FIFO, weights the files' sizes): an evicted file is deleted.
//! - **Names** are random, not derived from keys: the header says whose
//!   bytes a file holds.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use s3s::dto::{ETag, StorageClass, Timestamp};

use super::{Head, Key};
use crate::gateway::checksum::{crc64nvme, crc64nvme_header};
use crate::gateway::metrics;

const MAGIC: &[u8; 8] = b"hipobjc1";
/// The magic, the header's length and its CRC.
const PREAMBLE: usize = 8 + 4 + 8;
/// A header longer than this is not one of ours.
const MAX_HEADER: usize = 1 << 20;

/// `--cache-dir` and `--cache-dir-bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSettings {
    /// The directory the files are kept in (created if missing).
    pub dir: PathBuf,
    /// The bytes of the files kept, at most.
    pub bytes: u64,
}

/// An object kept on disk: what its header says.
pub(super) struct Stored {
    pub(super) path: PathBuf,
    pub(super) head: Arc<Head>,
    /// The CRC64/NVME of its bytes, base64 as S3 sends it.
    pub(super) crc64nvme: String,
    /// When it was filled or last found to hold; `None` when that was
    /// too long ago to say with this process's clock.
    pub(super) checked: Mutex<Option<Instant>>,
}

#[derive(Clone)]
struct Weigh;

impl quick_cache::Weighter<Key, Arc<Stored>> for Weigh {
    fn weight(&self, _key: &Key, stored: &Arc<Stored>) -> u64 {
        stored.head.len.max(1)
    }
}

/// Deletes the files of the entries evicted.
#[derive(Clone, Default)]
struct Deletes;

impl quick_cache::Lifecycle<Key, Arc<Stored>> for Deletes {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), _key: Key, stored: Arc<Stored>) {
        metrics::cache_evicted();
        remove(&stored.path);
    }
}

/// The files kept, by key.
pub(super) struct Disk {
    settings: DiskSettings,
    files:
        quick_cache::sync::Cache<Key, Arc<Stored>, Weigh, quick_cache::DefaultHashBuilder, Deletes>,
}

impl Disk {
    /// The directory of `settings`, its files' headers read: those that
    /// do not check out deleted, with temporary files left by a process
    /// that stopped while writing.
    pub(super) fn open(settings: DiskSettings) -> std::io::Result<Disk> {
        std::fs::create_dir_all(&settings.dir)?;
        let options = quick_cache::OptionsBuilder::new()
            .shards(1)
            .weight_capacity(settings.bytes)
            .estimated_items_capacity(1024)
            .build()
            .expect("the disk tier's options are valid");
        let disk = Disk {
            files: quick_cache::sync::Cache::with_options(
                options,
                Weigh,
                quick_cache::DefaultHashBuilder::default(),
                Deletes,
            ),
            settings,
        };
        // Oldest first, so that the newest copy of a key wins.
        let mut found: Vec<(SystemTime, Key, Stored)> = Vec::new();
        for dirent in std::fs::read_dir(&disk.settings.dir)? {
            let path = dirent?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.ends_with(".obj") {
                if name.ends_with(".tmp") {
                    remove(&path);
                }
                continue;
            }
            match read_header(&path) {
                Ok((key, stored, filled)) => found.push((filled, key, stored)),
                Err(why) => {
                    eprintln!(
                        "hipobj-s3-server: cache: {}: {why}: deleted",
                        path.display()
                    );
                    metrics::cache_request("disk_corrupt");
                    remove(&path);
                }
            }
        }
        found.sort_by_key(|(filled, ..)| *filled);
        for (_, key, stored) in found {
            disk.put(key, stored);
        }
        disk.gauge();
        Ok(disk)
    }

    pub(super) fn get(&self, key: &Key) -> Option<Arc<Stored>> {
        self.files.get(key)
    }

    /// Keeps `stored` for `key`, deleting the file it replaces.
    fn put(&self, key: Key, stored: Stored) {
        if stored.head.len > self.settings.bytes {
            remove(&stored.path);
            return;
        }
        if let Some((_, old)) = self.files.remove(&key) {
            remove(&old.path);
        }
        self.files.insert(key, Arc::new(stored));
        self.gauge();
    }

    /// Forgets `key` and deletes its file.
    pub(super) fn remove(&self, key: &Key) {
        if let Some((_, old)) = self.files.remove(key) {
            remove(&old.path);
            self.gauge();
        }
    }

    /// Forgets `key` if `stored` is still its file.
    pub(super) fn remove_if(&self, key: &Key, stored: &Stored) {
        if let Some((_, old)) = self
            .files
            .remove_if(key, |kept| std::ptr::eq(Arc::as_ptr(kept), stored))
        {
            remove(&old.path);
            self.gauge();
        }
    }

    /// Writes `bytes` of the object `key` to a new file, whole: its path,
    /// to be kept by [`Disk::commit`]. Blocking.
    pub(super) fn write(
        &self,
        key: &Key,
        head: &Head,
        crc: &str,
        bytes: &[u8],
    ) -> std::io::Result<PathBuf> {
        let header = header_json(key, head, crc)?;
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| std::io::Error::other(e.to_string()))?;
        let name = hex::encode(random);
        let path = self.settings.dir.join(format!("{name}.obj"));
        let temporary = self.settings.dir.join(format!("{name}.tmp"));
        let written = (|| {
            let mut file = File::create(&temporary)?;
            file.write_all(MAGIC)?;
            file.write_all(
                &u32::try_from(header.len())
                    .map_err(std::io::Error::other)?
                    .to_le_bytes(),
            )?;
            file.write_all(&crc64nvme(&header).to_le_bytes())?;
            file.write_all(&header)?;
            file.write_all(bytes)?;
            std::fs::rename(&temporary, &path)
        })();
        if let Err(e) = written {
            remove(&temporary);
            return Err(e);
        }
        Ok(path)
    }

    /// Keeps the file `path` that [`Disk::write`] wrote for `key`.
    pub(super) fn commit(&self, key: Key, path: PathBuf, head: Arc<Head>, crc64nvme: String) {
        self.put(
            key,
            Stored {
                path,
                head,
                crc64nvme,
                checked: Mutex::new(Some(Instant::now())),
            },
        );
    }

    /// The bytes of `stored`, checked against its CRC64/NVME; `None` when
    /// its file is gone (deleted since it was found). Blocking.
    pub(super) fn read(stored: &Stored) -> Result<Option<Bytes>, String> {
        let mut file = match File::open(&stored.path) {
            Ok(file) => file,
            // Deleted since it was found: invalidated or evicted.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("open: {e}")),
        };
        let header_len = preamble(&mut file)?.0;
        let len = usize::try_from(stored.head.len).map_err(|_| "too large".to_owned())?;
        let size = file.metadata().map_err(|e| format!("stat: {e}"))?.len();
        if size != (PREAMBLE + header_len) as u64 + stored.head.len {
            return Err(format!(
                "{size} bytes, not the {} its header says",
                (PREAMBLE + header_len) as u64 + stored.head.len
            ));
        }
        std::io::Seek::seek(
            &mut file,
            std::io::SeekFrom::Start((PREAMBLE + header_len) as u64),
        )
        .map_err(|e| format!("seek: {e}"))?;
        let mut bytes = vec![0u8; len];
        file.read_exact(&mut bytes)
            .map_err(|e| format!("read: {e}"))?;
        let crc = crc64nvme_header(crc64nvme(&bytes));
        if crc != stored.crc64nvme {
            return Err(format!(
                "its bytes' CRC64NVME is {crc}, its header's {}",
                stored.crc64nvme
            ));
        }
        Ok(Some(Bytes::from(bytes)))
    }

    /// The files' bytes, in use and the limit.
    fn gauge(&self) {
        metrics::cache_disk_in_use(self.files.weight(), self.settings.bytes);
    }
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            eprintln!("hipobj-s3-server: cache: deleting {}: {e}", path.display());
        }
    }
}

fn header_json(key: &Key, head: &Head, crc64nvme: &str) -> std::io::Result<Vec<u8>> {
    let filled = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let header = serde_json::json!({
        "bucket": key.0,
        "key": key.1,
        "len": head.len,
        "crc64nvme": crc64nvme,
        "filled_unix_ms": u64::try_from(filled).unwrap_or(u64::MAX),
        "e_tag": head.e_tag,
        "last_modified": head.last_modified,
        "content_type": head.content_type,
        "content_encoding": head.content_encoding,
        "content_disposition": head.content_disposition,
        "content_language": head.content_language,
        "cache_control": head.cache_control,
        "expires": head.expires,
        "metadata": head.metadata,
        "storage_class": head.storage_class.as_ref().map(StorageClass::as_str),
    });
    serde_json::to_vec(&header).map_err(std::io::Error::other)
}

/// The header's length and CRC, checked for the magic.
fn preamble(file: &mut File) -> Result<(usize, u64), String> {
    let mut preamble = [0u8; PREAMBLE];
    file.read_exact(&mut preamble)
        .map_err(|e| format!("its preamble: {e}"))?;
    if &preamble[..8] != MAGIC {
        return Err("not a cache file (no magic)".to_owned());
    }
    let len = u32::from_le_bytes(preamble[8..12].try_into().expect("4 bytes")) as usize;
    let crc = u64::from_le_bytes(preamble[12..20].try_into().expect("8 bytes"));
    if len > MAX_HEADER {
        return Err(format!("a header of {len} bytes"));
    }
    Ok((len, crc))
}

/// What the header of the file at `path` says, checked: its key, its
/// entry, and when it was filled.
fn read_header(path: &Path) -> Result<(Key, Stored, SystemTime), String> {
    let mut file = File::open(path).map_err(|e| format!("open: {e}"))?;
    let (len, crc) = preamble(&mut file)?;
    let mut header = vec![0u8; len];
    file.read_exact(&mut header)
        .map_err(|e| format!("its header: {e}"))?;
    if crc64nvme(&header) != crc {
        return Err("its header does not match its CRC".to_owned());
    }
    let h: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| format!("its header: {e}"))?;
    let text = |name: &str| h.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    let field = |name: &str| -> Result<Option<serde_json::Value>, String> {
        Ok(h.get(name).filter(|v| !v.is_null()).cloned())
    };
    let (Some(bucket), Some(key), Some(object_len), Some(crc64nvme), Some(filled)) = (
        text("bucket"),
        text("key"),
        h.get("len").and_then(serde_json::Value::as_u64),
        text("crc64nvme"),
        h.get("filled_unix_ms").and_then(serde_json::Value::as_u64),
    ) else {
        return Err("its header lacks a field".to_owned());
    };
    let size = file.metadata().map_err(|e| format!("stat: {e}"))?.len();
    if size != (PREAMBLE + len) as u64 + object_len {
        return Err(format!(
            "{size} bytes, not the {} its header says",
            (PREAMBLE + len) as u64 + object_len
        ));
    }
    let parse = |name: &str| -> Result<Option<Timestamp>, String> {
        field(name)?
            .map(serde_json::from_value::<Timestamp>)
            .transpose()
            .map_err(|e| format!("its header's {name}: {e}"))
    };
    let e_tag = field("e_tag")?
        .map(serde_json::from_value::<ETag>)
        .transpose()
        .map_err(|e| format!("its header's e_tag: {e}"))?;
    let metadata = field("metadata")?
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| format!("its header's metadata: {e}"))?;
    let head = Head {
        len: object_len,
        e_tag,
        last_modified: parse("last_modified")?,
        content_type: text("content_type"),
        content_encoding: text("content_encoding"),
        content_disposition: text("content_disposition"),
        content_language: text("content_language"),
        cache_control: text("cache_control"),
        expires: parse("expires")?,
        metadata,
        storage_class: text("storage_class").map(StorageClass::from),
        // Checked against its own CRC64/NVME, not the store's again.
        stored: None,
    };
    let filled = SystemTime::UNIX_EPOCH + Duration::from_millis(filled);
    // As old as the file says, if this process's clock reaches that far.
    let checked = SystemTime::now()
        .duration_since(filled)
        .ok()
        .and_then(|age| Instant::now().checked_sub(age));
    Ok((
        (bucket, key),
        Stored {
            path: path.to_owned(),
            head: Arc::new(head),
            crc64nvme,
            checked: Mutex::new(checked),
        },
        filled,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file deleted after it was found (a write's invalidation, an
    /// eviction) is gone, not corrupt: no error, so no `disk_corrupt`.
    #[test]
    fn a_file_deleted_after_it_was_found_reads_as_gone_not_bad() {
        let dir = std::env::temp_dir().join(format!("hipobj-disk-gone-{}", std::process::id()));
        let disk = Disk::open(DiskSettings {
            dir: dir.clone(),
            bytes: 1 << 20,
        })
        .unwrap();
        let key: Key = ("bucket".to_owned(), "key".to_owned());
        let bytes = b"kept bytes".to_vec();
        let head = Arc::new(Head::of(
            &s3s::dto::GetObjectOutput::default(),
            bytes.len() as u64,
        ));
        let crc = crc64nvme_header(crc64nvme(&bytes));
        let path = disk.write(&key, &head, &crc, &bytes).unwrap();
        disk.commit(key.clone(), path, head, crc);
        let stored = disk.get(&key).expect("the file kept");
        assert_eq!(Disk::read(&stored).unwrap().as_deref(), Some(&bytes[..]));
        disk.remove(&key);
        assert_eq!(Disk::read(&stored), Ok(None));
        // A file whose bytes changed is bad.
        let path = disk
            .write(&key, &stored.head, &stored.crc64nvme, b"other byte")
            .unwrap();
        disk.commit(
            key.clone(),
            path,
            Arc::clone(&stored.head),
            stored.crc64nvme.clone(),
        );
        let bad = disk.get(&key).unwrap();
        assert!(Disk::read(&bad).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
