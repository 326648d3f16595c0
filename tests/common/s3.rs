//! Starts the built `hipobj-s3-server` for a test: a fresh temporary root
//! holding [`BUCKET`], the test keys (the access key on the command line,
//! the secret key in the environment, as a deployment gives it), a
//! listener on port 0, and the endpoint read from the server's first line.
//!
//! The root is made under `std::env::temp_dir()` (so `TMPDIR` decides where;
//! inside the VM lane point it at a writable directory such as
//! `target/vm/out`). The server's standard error goes to the test's, so its
//! per-transfer log lines show with a failing test's output.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The access key the server is started with.
pub const ACCESS_KEY: &str = "hipobj-test";
/// The secret key the server is started with.
pub const SECRET_KEY: &str = "hipobj-test-secret";
/// The bucket every server starts with.
pub const BUCKET: &str = "bucket";

/// How long the server may take to print its first line (the VM is slow).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `hipobj-s3-server` and its temporary root.
pub struct S3Server {
    /// `http://IP:PORT` (or `https://`), as the server printed it.
    pub endpoint: String,
    /// Whether the server serves tokens (`rdma: DEVICE`) or declines them
    /// (`rdma: off: ...`).
    pub rdma: bool,
    /// The server's whole first line.
    pub banner: String,
    child: Option<Child>,
    /// The lines the server printed after its first.
    later: Mutex<mpsc::Receiver<std::io::Result<String>>>,
    root: PathBuf,
    /// Whether the root is this server's to remove (not one lent by
    /// [`S3Server::start_at`]).
    owns_root: bool,
}

impl S3Server {
    /// Starts `binary` listening on `ip` (port 0), with a fresh temporary
    /// root holding [`BUCKET`], the test keys, and `extra` arguments. Panics
    /// (killing the server) if it does not print its first line in time.
    pub fn start(binary: &Path, ip: &str, extra: &[&str]) -> S3Server {
        let root = unique_root();
        std::fs::create_dir_all(root.join(BUCKET))
            .unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
        S3Server::launch(binary, ip, root, true, extra, Stdio::inherit())
    }

    /// Starts a server as [`S3Server::start`] does, but on an existing
    /// `root` (say, a killed server's, to serve its objects again), which
    /// it leaves in place when dropped.
    pub fn start_at(binary: &Path, ip: &str, root: &Path, extra: &[&str]) -> S3Server {
        S3Server::launch(
            binary,
            ip,
            root.to_path_buf(),
            false,
            extra,
            Stdio::inherit(),
        )
    }

    /// [`S3Server::start_at`], with the server's standard error (its
    /// per-transfer log) written to `log` instead of the test's.
    pub fn start_logged(
        binary: &Path,
        ip: &str,
        root: &Path,
        extra: &[&str],
        log: &Path,
    ) -> S3Server {
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        S3Server::launch(
            binary,
            ip,
            root.to_path_buf(),
            false,
            extra,
            Stdio::from(file),
        )
    }

    /// A fresh temporary root holding [`BUCKET`].
    pub fn new_root() -> PathBuf {
        let root = unique_root();
        std::fs::create_dir_all(root.join(BUCKET))
            .unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
        root
    }

    /// A root of its own for a server whose [`BUCKET`] is `shared`'s: the
    /// filesystem backend names its temporary files by a counter of its
    /// process, so servers must not share a root, only the bucket's
    /// directory (a symbolic link here).
    pub fn root_sharing(shared: &Path) -> PathBuf {
        let root = unique_root();
        std::fs::create_dir_all(&root)
            .unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
        std::os::unix::fs::symlink(shared.join(BUCKET), root.join(BUCKET))
            .unwrap_or_else(|e| panic!("linking {}'s bucket: {e}", root.display()));
        root
    }

    fn launch(
        binary: &Path,
        ip: &str,
        root: PathBuf,
        owns_root: bool,
        extra: &[&str],
        stderr: Stdio,
    ) -> S3Server {
        let mut command = Command::new(binary);
        command
            .args(["--access-key", ACCESS_KEY])
            .env("HIPOBJ_SECRET_KEY", SECRET_KEY);
        S3Server::launch_command(command, ip, root, owns_root, extra, stderr)
    }

    /// Starts `command` (the server, with whatever keys, environment and
    /// arguments it already has) on a fresh temporary root holding
    /// [`BUCKET`], listening on `ip` (port 0), with `extra` arguments and
    /// its standard error to `stderr`.
    pub fn start_command(command: Command, ip: &str, extra: &[&str], stderr: Stdio) -> S3Server {
        S3Server::launch_command(command, ip, S3Server::new_root(), true, extra, stderr)
    }

    fn launch_command(
        mut command: Command,
        ip: &str,
        root: PathBuf,
        owns_root: bool,
        extra: &[&str],
        stderr: Stdio,
    ) -> S3Server {
        let listen = format!("{ip}:0");
        let program = PathBuf::from(command.get_program());
        let mut child = command
            .arg("--root")
            .arg(&root)
            .args(["--listen", &listen])
            .args(["--bucket", BUCKET])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Every line goes to the test (the first is the banner); those
            // after the first also to its output.
            let mut first = true;
            for line in BufReader::new(stdout).lines() {
                if let (false, Ok(line)) = (first, &line) {
                    println!("{line}");
                }
                first = false;
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = S3Server {
            endpoint: String::new(),
            rdma: false,
            banner: String::new(),
            child: Some(child),
            later: Mutex::new(mpsc::channel().1),
            root,
            owns_root,
        };
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) if !line.is_empty() => line,
            Ok(Ok(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = server.terminate();
                panic!("hipobj-s3-server exited without its first line: {status}");
            }
            Ok(Err(e)) => panic!("reading hipobj-s3-server's first line: {e}"),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("hipobj-s3-server printed nothing in {START_TIMEOUT:?}")
            }
        };
        let line = line.trim_end().to_string();
        let (endpoint, rdma) = parse_banner(&line)
            .unwrap_or_else(|| panic!("unexpected first line from hipobj-s3-server: {line:?}"));
        server.endpoint = endpoint;
        server.rdma = rdma;
        server.banner = line;
        server.later = Mutex::new(rx);
        server
    }

    /// The next line the server prints on standard output after its first
    /// (`hipobj-s3-server metrics on ...`), waiting up to `START_TIMEOUT`.
    pub fn next_line(&self) -> String {
        let later = self.later.lock().expect("not poisoned");
        match later.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => panic!("reading hipobj-s3-server's output: {e}"),
            Err(e) => panic!("no further line from hipobj-s3-server: {e}"),
        }
    }

    /// The server's root: the object `BUCKET/key` is the file
    /// `root/BUCKET/key`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `ENDPOINT/BUCKET/key`.
    pub fn url(&self, key: &str) -> String {
        format!("{}/{BUCKET}/{key}", self.endpoint)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server has not exited yet.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM, waits for the server to exit (SIGKILL after 30 s) and
    /// returns its status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the server is still running");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
        // SAFETY: `pid` is our own child, not yet reaped (we hold its
        // `Child` and have not waited), so the id still names it.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let status = child.wait().expect("reaping the killed server");
                    panic!("hipobj-s3-server ignored SIGTERM for 30 s (killed: {status})");
                }
                Err(e) => panic!("waiting for hipobj-s3-server: {e}"),
            }
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
        if self.owns_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Runs `curl` on `url` with `args`, signed (SigV4) with the test keys for
/// `us-east-1`, with the `x-amz-content-sha256: UNSIGNED-PAYLOAD` header s3s
/// requires (curl 7.88 signs but does not send it). Standard output holds
/// the response headers (`-D -`), then the body. Pass `-X METHOD`, `-H`
/// headers, `--data-binary`... in `args`; do not pass `-H
/// x-amz-content-sha256` again, or an empty header such as `-H Expect:`,
/// which curl signs and then drops.
pub fn curl(url: &str, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("curl")
        .args(["-sS", "-D", "-"])
        .arg("--aws-sigv4")
        .arg("aws:amz:us-east-1:s3")
        .arg("--user")
        .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
}

/// `(endpoint, rdma)` from `hipobj-s3-server listening on
/// http[s]://IP:PORT (rdma: DEVICE|off: REASON)`.
pub fn parse_banner(line: &str) -> Option<(String, bool)> {
    let rest = line.strip_prefix("hipobj-s3-server listening on ")?;
    let (endpoint, rdma) = rest.split_once(" (rdma: ")?;
    let rdma = rdma.strip_suffix(')')?;
    let web = endpoint.starts_with("http://") || endpoint.starts_with("https://");
    if !web || rdma.is_empty() {
        return None;
    }
    Some((endpoint.to_string(), !rdma.starts_with("off")))
}

/// A directory name no other test or run uses.
fn unique_root() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!(
        "hipobj-s3-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}
