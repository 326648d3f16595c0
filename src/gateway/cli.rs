//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What `--help` prints.
pub const USAGE: &str = "\
usage: hipobj-s3-server --root DIR --listen ADDR:PORT --access-key AK --secret-key SK
                        [--region REGION] [--bucket NAME]... [--device NAME] [--no-rdma]
                        [--rdma-timeout-ms N] [--rdma-connect-timeout-ms N]
                        [--delay-final-ms N] [--rdma-allow CIDR]...
                        [--rdma-max-bytes N] [--rdma-memory-bytes N] [--rdma-max-requests N]
                        [--rdma-max-connections N] [--rdma-max-connections-per-client N]
                        [--rdma-chunk-bytes N] [--rdma-chunks N]

  --root DIR            where buckets and objects are stored (created if missing)
  --listen ADDR:PORT    HTTP address; port 0 picks a free port
  --access-key AK       the one access key SigV4 requests must be signed with
  --secret-key SK       its secret key
  --region REGION       the region requests must be signed for (default us-east-1)
  --bucket NAME         creates this bucket (a directory of the root) if missing; repeatable
  --device NAME         RDMA device (default: the first one with an active port)
  --no-rdma             decline every x-amz-rdma-token (501), as a server without RDMA
  --rdma-timeout-ms N   how long an RDMA transfer may go without progress: its dial and proof,
                        each chunk, its final message (default 10000)
  --rdma-connect-timeout-ms N
                        how long connecting to a client may take, within that deadline
                        (default 2000); a client whose RDMA CM does not answer fails the
                        transfer (500) after this long
  --delay-final-ms N    test knob: pause between the data and the final message (default 0)
  --rdma-allow CIDR     a network whose clients the server may connect to, besides the address
                        each request comes from (the fabric's subnet behind a load balancer);
                        repeatable
  --rdma-max-bytes N    the largest RDMA transfer served (default 5368709120, S3's largest PUT);
                        a longer token is declined (501)
  --rdma-memory-bytes N registered memory the transfers in progress may hold at once (default
                        1073741824, at least 4096); a transfer that finds no room for its next
                        chunk waits, then fails (503 before its first chunk)
  --rdma-chunk-bytes N  a transfer moves in chunks of at most N bytes, one registered buffer
                        each (default 8388608, or the largest buffer --rdma-memory-bytes
                        holds if less): a GET's bytes are written to the client as the backend
                        gives them, a PUT's are handed to the backend as they are read
  --rdma-chunks N       chunks one transfer holds at once (default 4): its memory is at most
                        N x --rdma-chunk-bytes
  --rdma-max-requests N RDMA requests served at once (default 128); one more is answered 503
                        SlowDown at once. The runtime has N + 256 blocking threads: RDMA requests
                        hold at most N of them, the rest serve every request's file I/O
  --rdma-max-connections N
                        RDMA connections held at once, to all clients, dials in progress
                        included (default 4096)
  --rdma-max-connections-per-client N
                        RDMA connections held for one access key to one client address,
                        dials in progress included (default 1024)
";

/// The server's settings.
#[derive(Debug)]
pub struct Options {
    /// `--root`.
    pub root: PathBuf,
    /// `--listen`.
    pub listen: SocketAddr,
    /// `--access-key`.
    pub access_key: String,
    /// `--secret-key`.
    pub secret_key: String,
    /// `--region`.
    pub region: String,
    /// `--bucket`, each.
    pub buckets: Vec<String>,
    /// `--device`.
    pub device: Option<String>,
    /// `--no-rdma`.
    pub no_rdma: bool,
    /// `--rdma-timeout-ms`.
    pub rdma_timeout: Duration,
    /// `--rdma-connect-timeout-ms`.
    pub rdma_connect_timeout: Duration,
    /// `--delay-final-ms`.
    pub delay_final: Duration,
    /// `--rdma-allow`, each.
    pub rdma_allow: Vec<ipnet::IpNet>,
    /// `--rdma-max-bytes`.
    pub rdma_max_bytes: u64,
    /// `--rdma-memory-bytes`.
    pub rdma_memory_bytes: u64,
    /// `--rdma-max-requests`.
    pub rdma_max_requests: usize,
    /// `--rdma-max-connections`.
    pub rdma_max_connections: usize,
    /// `--rdma-max-connections-per-client`.
    pub rdma_max_connections_per_client: usize,
    /// `--rdma-chunk-bytes`.
    pub rdma_chunk_bytes: usize,
    /// `--rdma-chunks`.
    pub rdma_chunks: usize,
}

impl Options {
    /// What the server's RDMA may do.
    pub fn limits(&self) -> crate::gateway::rdma::Limits {
        crate::gateway::rdma::Limits {
            allow: self.rdma_allow.clone(),
            max_bytes: self.rdma_max_bytes,
            memory_bytes: self.rdma_memory_bytes,
            max_connections: self.rdma_max_connections,
            max_connections_per_client: self.rdma_max_connections_per_client,
            max_requests: self.rdma_max_requests,
            connect_timeout: self.rdma_connect_timeout,
            chunk_bytes: self.rdma_chunk_bytes,
            chunks: self.rdma_chunks,
        }
    }
}

/// Parses the arguments (without the program name): the settings, or
/// `None` for `--help`. Options take their value as the next argument or
/// after `=`.
pub fn parse(args: &[String]) -> Result<Option<Options>, String> {
    let mut root = None;
    let mut listen = None;
    let mut access_key = None;
    let mut secret_key = None;
    let mut region = "us-east-1".to_owned();
    let mut buckets = Vec::new();
    let mut device = None;
    let mut no_rdma = false;
    let mut rdma_timeout = Duration::from_millis(10_000);
    let mut rdma_connect_timeout = Duration::from_millis(2_000);
    let mut delay_final = Duration::ZERO;
    let mut rdma_allow = Vec::new();
    let mut rdma_max_bytes: Option<u64> = None;
    let mut rdma_memory_bytes: u64 = 1 << 30;
    let mut rdma_max_requests = 128;
    let mut rdma_max_connections = 4096;
    let mut rdma_max_connections_per_client = 1024;
    let mut rdma_chunk_bytes: Option<usize> = None;
    let mut rdma_chunks = 4;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or(format!("{name} needs a value")),
            }
        };
        match name {
            "--help" | "-h" => return Ok(None),
            "--root" => root = Some(PathBuf::from(value()?)),
            "--listen" => {
                let v = value()?;
                listen = Some(
                    v.parse::<SocketAddr>()
                        .map_err(|e| format!("--listen {v}: {e} (expected IP:PORT)"))?,
                );
            }
            "--access-key" => access_key = Some(value()?),
            "--secret-key" => secret_key = Some(value()?),
            "--region" => region = value()?,
            "--bucket" => buckets.push(bucket_name(value()?)?),
            "--device" => device = Some(value()?),
            "--no-rdma" if inline.is_none() => no_rdma = true,
            "--rdma-timeout-ms" => rdma_timeout = millis(name, &value()?, 1)?,
            "--rdma-connect-timeout-ms" => rdma_connect_timeout = millis(name, &value()?, 1)?,
            "--delay-final-ms" => delay_final = millis(name, &value()?, 0)?,
            "--rdma-allow" => {
                let v = value()?;
                rdma_allow.push(
                    v.parse::<ipnet::IpNet>()
                        .map_err(|e| format!("--rdma-allow {v}: {e} (expected ADDR/PREFIX)"))?,
                );
            }
            "--rdma-max-bytes" => rdma_max_bytes = Some(count(name, &value()?)?),
            "--rdma-memory-bytes" => rdma_memory_bytes = count(name, &value()?)?,
            "--rdma-max-requests" => rdma_max_requests = count(name, &value()?)?,
            "--rdma-max-connections" => rdma_max_connections = count(name, &value()?)?,
            "--rdma-max-connections-per-client" => {
                rdma_max_connections_per_client = count(name, &value()?)?
            }
            "--rdma-chunk-bytes" => rdma_chunk_bytes = Some(count(name, &value()?)?),
            "--rdma-chunks" => rdma_chunks = count(name, &value()?)?,
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    let missing = |what: &str| format!("{what} is required");
    let access_key = access_key.ok_or_else(|| missing("--access-key"))?;
    let secret_key = secret_key.ok_or_else(|| missing("--secret-key"))?;
    if access_key.is_empty() || secret_key.is_empty() {
        return Err("--access-key and --secret-key must not be empty".into());
    }
    let rdma_chunk_bytes = chunk_bytes(rdma_chunk_bytes, rdma_memory_bytes)?;
    let rdma_max_bytes = rdma_max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if rdma_max_requests > MAX_REQUESTS {
        return Err(format!(
            "--rdma-max-requests {rdma_max_requests}: at most {MAX_REQUESTS}"
        ));
    }
    Ok(Some(Options {
        root: root.ok_or_else(|| missing("--root"))?,
        listen: listen.ok_or_else(|| missing("--listen"))?,
        access_key,
        secret_key,
        region,
        buckets,
        device,
        no_rdma,
        rdma_timeout,
        rdma_connect_timeout,
        delay_final,
        rdma_allow,
        rdma_max_bytes,
        rdma_memory_bytes,
        rdma_max_requests,
        rdma_max_connections,
        rdma_max_connections_per_client,
        rdma_chunk_bytes,
        rdma_chunks,
    }))
}

/// The most RDMA requests served at once: each may hold a blocking thread,
/// and tokio's pool takes at most a few thousand.
const MAX_REQUESTS: usize = 4096;

/// The longest RDMA transfer served unless `--rdma-max-bytes` says:
/// S3's largest PUT.
const DEFAULT_MAX_BYTES: u64 = 5 << 30;

/// The default chunk.
const DEFAULT_CHUNK_BYTES: usize = 8 << 20;

/// A transfer's chunk: `--rdma-chunk-bytes` if given, else 8 MiB or the
/// largest buffer the memory budget holds, if less. A chunk the budget
/// cannot hold would never move: refused, with what to change.
fn chunk_bytes(given: Option<usize>, memory_bytes: u64) -> Result<usize, String> {
    let fits =
        usize::try_from(crate::gateway::rdma::longest_transfer(memory_bytes)).unwrap_or(usize::MAX);
    if fits == 0 {
        return Err(format!(
            "--rdma-memory-bytes {memory_bytes}: no transfer fits (a transfer's buffer is at \
             least {} bytes)",
            crate::gateway::rdma::MIN_BUF
        ));
    }
    match given {
        None => Ok(fits.min(DEFAULT_CHUNK_BYTES)),
        Some(chunk) if chunk > fits => Err(format!(
            "--rdma-chunk-bytes {chunk} is more than --rdma-memory-bytes {memory_bytes} holds \
             ({fits} bytes), so no transfer would move: raise --rdma-memory-bytes or lower \
             --rdma-chunk-bytes"
        )),
        Some(chunk) => Ok(chunk.max(crate::gateway::rdma::MIN_BUF)),
    }
}

/// A whole number of at least 1, in plain decimal digits.
fn count<T: TryFrom<u64>>(name: &str, text: &str) -> Result<T, String> {
    let bad = || format!("{name} {text}: expected a whole number of at least 1");
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u64>() {
        Ok(n) if n >= 1 => T::try_from(n).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// A duration in milliseconds of at least `min`, in plain decimal digits.
fn millis(name: &str, text: &str, min: u64) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(n) if n >= min && text.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(Duration::from_millis(n))
        }
        _ => Err(format!(
            "{name} {text}: expected a whole number of milliseconds >= {min}"
        )),
    }
}

/// A bucket name that names one directory of the root: S3's characters
/// (lowercase letters, digits, `.` and `-`), 3 to 63 of them, not `.` or
/// `..`.
fn bucket_name(name: String) -> Result<String, String> {
    let chars_ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if chars_ok && (3..=63).contains(&name.len()) && !name.starts_with('.') {
        Ok(name)
    } else {
        Err(format!("--bucket {name}: not a valid bucket name"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The arguments as the program gets them.
    pub fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The options every command line needs.
    pub fn required() -> Vec<&'static str> {
        vec![
            "--root",
            "/r",
            "--listen",
            "127.0.0.1:0",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
        ]
    }

    #[test]
    fn defaults_apply_when_only_the_required_options_are_given() {
        let o = parse(&args(&required())).unwrap().expect("not --help");
        assert_eq!(o.root, PathBuf::from("/r"));
        assert_eq!(o.listen.port(), 0);
        assert_eq!(o.region, "us-east-1");
        assert!(o.buckets.is_empty() && o.device.is_none() && !o.no_rdma);
        assert_eq!(o.rdma_timeout, Duration::from_secs(10));
        assert_eq!(o.rdma_connect_timeout, Duration::from_secs(2));
        assert_eq!(o.delay_final, Duration::ZERO);
        assert!(o.rdma_allow.is_empty());
        assert_eq!(o.rdma_max_requests, 128);
        assert_eq!(o.rdma_memory_bytes, 1 << 30);
        assert_eq!(o.rdma_max_bytes, 5 << 30, "S3's largest PUT");
        assert_eq!((o.rdma_chunk_bytes, o.rdma_chunks), (8 << 20, 4));
        assert_eq!(
            (o.rdma_max_connections, o.rdma_max_connections_per_client),
            (4096, 1024)
        );
    }

    #[test]
    fn every_option_is_read_with_a_separate_or_inline_value() {
        let mut list = required();
        list.extend([
            "--bucket",
            "one",
            "--bucket=two",
            "--region=eu-west-1",
            "--device",
            "rxe0",
            "--no-rdma",
            "--rdma-timeout-ms",
            "250",
            "--rdma-connect-timeout-ms=75",
            "--rdma-max-requests",
            "16",
            "--delay-final-ms=3000",
            "--rdma-allow",
            "192.0.2.0/24",
            "--rdma-allow=2001:db8::/32",
            "--rdma-max-bytes",
            "1048576",
            "--rdma-memory-bytes=4194304",
            "--rdma-max-connections",
            "8",
            "--rdma-max-connections-per-client=2",
        ]);
        let o = parse(&args(&list)).unwrap().expect("not --help");
        assert_eq!(o.buckets, ["one", "two"]);
        assert_eq!(o.region, "eu-west-1");
        assert_eq!(o.device.as_deref(), Some("rxe0"));
        assert!(o.no_rdma);
        assert_eq!(o.rdma_timeout, Duration::from_millis(250));
        assert_eq!(o.rdma_connect_timeout, Duration::from_millis(75));
        assert_eq!(o.rdma_max_requests, 16);
        assert_eq!(o.delay_final, Duration::from_secs(3));
        assert_eq!(o.rdma_allow.len(), 2);
        assert_eq!((o.rdma_max_bytes, o.rdma_memory_bytes), (1 << 20, 4 << 20));
        assert_eq!(
            (o.rdma_max_connections, o.rdma_max_connections_per_client),
            (8, 2)
        );
    }

    #[test]
    fn missing_unknown_and_malformed_arguments_are_refused() {
        assert!(parse(&args(&["--root", "/r"])).is_err());
        let mut unknown = required();
        unknown.push("--verbose");
        assert!(parse(&args(&unknown)).is_err());
        for bad in [
            ["--listen", "localhost"],
            ["--rdma-timeout-ms", "0"],
            ["--rdma-timeout-ms", "+5"],
            ["--bucket", "../up"],
            ["--bucket", "UPPER"],
            ["--rdma-allow", "192.0.2.1"],
            ["--rdma-max-bytes", "0"],
            ["--rdma-memory-bytes", "1e9"],
            ["--rdma-max-connections", "-1"],
            ["--rdma-connect-timeout-ms", "0"],
            ["--rdma-max-requests", "0"],
            ["--rdma-max-requests", "1000000"],
        ] {
            let mut list = required();
            list.extend(bad);
            assert!(parse(&args(&list)).is_err(), "{bad:?} was accepted");
        }
        let mut dangling = required();
        dangling.push("--region");
        assert!(parse(&args(&dangling)).is_err());
    }

    #[test]
    fn a_chunk_is_8_mib_or_the_largest_buffer_the_memory_budget_holds() {
        let with = |extra: &[&str]| {
            let mut list = required();
            list.extend(extra);
            parse(&args(&list)).map(|o| {
                let o = o.expect("not --help");
                (o.rdma_chunk_bytes, o.rdma_memory_bytes, o.rdma_max_bytes)
            })
        };
        assert_eq!(
            with(&["--rdma-memory-bytes", "8589934592"]),
            Ok((8 << 20, 8 << 30, 5 << 30))
        );
        // Whole MiB above 1 MiB, powers of two below: what a buffer takes.
        assert_eq!(
            with(&["--rdma-memory-bytes", "5767168"]),
            Ok((5 << 20, 5767168, 5 << 30))
        );
        assert_eq!(
            with(&["--rdma-memory-bytes", "5000"]),
            Ok((4096, 5000, 5 << 30))
        );
        assert_eq!(
            with(&["--rdma-chunk-bytes", "65536", "--rdma-chunks", "3"]).map(|t| t.0),
            Ok(65536)
        );
        // A transfer longer than the budget moves in chunks: allowed.
        assert_eq!(
            with(&[
                "--rdma-max-bytes",
                "1073741824",
                "--rdma-memory-bytes",
                "1048576"
            ]),
            Ok((1 << 20, 1 << 20, 1 << 30))
        );
        let refused = with(&[
            "--rdma-chunk-bytes",
            "2097152",
            "--rdma-memory-bytes",
            "1048576",
        ])
        .unwrap_err();
        assert!(refused.contains("raise --rdma-memory-bytes"), "{refused}");
        assert!(with(&["--rdma-memory-bytes", "4095"]).is_err());
        assert!(with(&["--rdma-chunks", "0"]).is_err());
    }
    #[test]
    fn help_wins() {
        assert!(matches!(parse(&args(&["--help"])), Ok(None)));
    }
}
