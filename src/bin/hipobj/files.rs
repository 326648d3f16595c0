//! The files a copy reads and writes: a download's [`Partial`] file, kept
//! only once whole, and an upload's [`Input`].

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{interrupt, Failure};

/// `e` with `what` it happened to.
pub(crate) fn named(what: &str, e: std::io::Error) -> std::io::Error {
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

#[cfg(test)]
mod tests {
    use super::*;

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
