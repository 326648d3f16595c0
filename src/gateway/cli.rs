//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::gateway::upstream::Settings;

/// What `--help` prints.
pub const USAGE: &str = "\
usage: hipobj-s3-server (--root DIR | --upstream URL) --listen ADDR:PORT
                        --access-key AK --secret-key SK
                        [--region REGION] [--bucket NAME]... [--device NAME] [--no-rdma]
                        [--rdma-timeout-ms N] [--rdma-connect-timeout-ms N]
                        [--delay-final-ms N] [--rdma-allow CIDR]...
                        [--rdma-max-bytes N] [--rdma-memory-bytes N] [--rdma-max-requests N]
                        [--rdma-max-connections N] [--rdma-max-connections-per-client N]
                        [--upstream-region REGION] [--upstream-profile NAME]
                        [--upstream-path-style | --upstream-virtual-hosted-style]
                        [--upstream-timeout-ms N] [--upstream-multipart-bytes N]
                        [--upstream-part-bytes N]

  --root DIR            where buckets and objects are stored (created if missing)
  --upstream URL        serve the buckets and objects of this S3 store instead (http:// or
                        https://, host, optional port: AWS, MinIO, Garage, Ceph RGW...); its
                        credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or
                        the shared config and credentials files (~/.aws), as the AWS tools
                        find them. Exclusive with --root
  --listen ADDR:PORT    HTTP address; port 0 picks a free port
  --access-key AK       the one access key SigV4 requests must be signed with
  --secret-key SK       its secret key
  --region REGION       the region requests must be signed for (default us-east-1)
  --bucket NAME         creates this bucket (a directory of the root) if missing; repeatable
  --device NAME         RDMA device (default: the first one with an active port)
  --no-rdma             decline every x-amz-rdma-token (501), as a server without RDMA
  --rdma-timeout-ms N   deadline of each RDMA transfer (default 10000)
  --rdma-connect-timeout-ms N
                        how long connecting to a client may take, within that deadline
                        (default 2000); a client whose RDMA CM does not answer fails the
                        transfer (500) after this long
  --delay-final-ms N    test knob: pause between the data and the final message (default 0)
  --rdma-allow CIDR     a network whose clients the server may connect to, besides the address
                        each request comes from (the fabric's subnet behind a load balancer);
                        repeatable
  --rdma-max-bytes N    the largest RDMA transfer served (default 5368709120, S3's largest PUT,
                        or the largest that --rdma-memory-bytes holds if less); a longer token
                        is declined (501); more than --rdma-memory-bytes holds is refused here
  --rdma-memory-bytes N registered memory the transfers in progress may hold at once (default
                        1073741824, at least 4096); a transfer that does not fit waits, then
                        gets 503
  --rdma-max-requests N RDMA requests served at once (default 128); one more is answered 503
                        SlowDown at once. The runtime has N + 256 blocking threads: RDMA requests
                        hold at most N of them, the rest serve every request's file I/O
  --rdma-max-connections N
                        RDMA connections held at once, to all clients, dials in progress
                        included (default 4096)
  --rdma-max-connections-per-client N
                        RDMA connections held for one access key to one client address,
                        dials in progress included (default 1024)
  --upstream-region REGION
                        the region requests to the upstream are signed for (default: --region)
  --upstream-profile NAME
                        the profile of the shared config and credentials files to take the
                        upstream's credentials from (default: AWS_PROFILE, else default)
  --upstream-path-style addresses the upstream as URL/BUCKET/KEY (the default: self-hosted
                        stores such as MinIO, Garage and Ceph RGW expect it)
  --upstream-virtual-hosted-style
                        addresses the upstream as BUCKET.HOST/KEY (AWS's preferred style)
  --upstream-timeout-ms N
                        how long the gateway waits for the upstream at one stretch: to
                        connect, to take the next piece of a body, to answer, to send the next
                        piece of an object (default 30000; ten times that for CopyObject,
                        UploadPartCopy and CompleteMultipartUpload); then 503
  --upstream-multipart-bytes N
                        the largest PutObject sent on as one request (default 67108864, at
                        most 5368709120); a larger one (or one of unknown length) goes as a
                        multipart upload, aborted if anything fails
  --upstream-part-bytes N
                        the part size of those uploads (default 16777216, 5242880 to
                        5368709120); larger where the object needs more than 10000 parts
";

/// The server's settings.
#[derive(Debug)]
pub struct Options {
    /// `--root`; `None` with `--upstream`.
    pub root: Option<PathBuf>,
    /// `--upstream` and its options; `None` with `--root`.
    pub upstream: Option<crate::gateway::upstream::Settings>,
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
    let mut upstream = UpstreamArgs::default();
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
            "--upstream" => upstream.endpoint = Some(endpoint(&value()?)?),
            "--upstream-region" => upstream.region = Some(value()?),
            "--upstream-profile" => upstream.profile = Some(value()?),
            "--upstream-path-style" if inline.is_none() => upstream.style(name, true)?,
            "--upstream-virtual-hosted-style" if inline.is_none() => upstream.style(name, false)?,
            "--upstream-timeout-ms" => upstream.timeout = Some(millis(name, &value()?, 1)?),
            "--upstream-multipart-bytes" => {
                upstream.multipart_bytes = Some(count(name, &value()?)?)
            }
            "--upstream-part-bytes" => upstream.part_bytes = Some(count(name, &value()?)?),
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    let missing = |what: &str| format!("{what} is required");
    let access_key = access_key.ok_or_else(|| missing("--access-key"))?;
    let secret_key = secret_key.ok_or_else(|| missing("--secret-key"))?;
    if access_key.is_empty() || secret_key.is_empty() {
        return Err("--access-key and --secret-key must not be empty".into());
    }
    let rdma_max_bytes = max_bytes(rdma_max_bytes, rdma_memory_bytes)?;
    if rdma_max_requests > MAX_REQUESTS {
        return Err(format!(
            "--rdma-max-requests {rdma_max_requests}: at most {MAX_REQUESTS}"
        ));
    }
    let upstream = upstream.settings(&region)?;
    let root = match (root, &upstream) {
        (Some(_), Some(_)) => {
            return Err(
                "--root and --upstream are exclusive: the server serves either a \
                        directory of this machine (--root) or another S3 store (--upstream)"
                    .into(),
            )
        }
        (None, None) => return Err("--root or --upstream is required".into()),
        (root, _) => root,
    };
    if upstream.is_some() && !buckets.is_empty() {
        return Err(
            "--bucket creates directories of --root; with --upstream, create buckets in the \
             upstream store (or through this server: CreateBucket)"
                .into(),
        );
    }
    Ok(Some(Options {
        root,
        upstream,
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
    }))
}

/// The `--upstream` options as given.
#[derive(Default)]
struct UpstreamArgs {
    endpoint: Option<String>,
    region: Option<String>,
    profile: Option<String>,
    /// `--upstream-path-style` (true) or `--upstream-virtual-hosted-style`
    /// (false), and which.
    path_style: Option<(bool, String)>,
    timeout: Option<Duration>,
    multipart_bytes: Option<u64>,
    part_bytes: Option<u64>,
}

impl UpstreamArgs {
    fn style(&mut self, name: &str, path: bool) -> Result<(), String> {
        match &self.path_style {
            Some((other, given)) if *other != path => {
                Err(format!("{given} and {name} are exclusive"))
            }
            _ => {
                self.path_style = Some((path, name.to_owned()));
                Ok(())
            }
        }
    }

    /// The settings, if `--upstream` was given; its options without it are
    /// refused, as are sizes outside S3's limits.
    fn settings(self, region: &str) -> Result<Option<Settings>, String> {
        use crate::gateway::upstream::{
            DEFAULT_MULTIPART_BYTES, DEFAULT_PART_BYTES, DEFAULT_TIMEOUT, MAX_PART_BYTES,
            MIN_PART_BYTES,
        };
        let Some(endpoint) = self.endpoint else {
            let given = [
                ("--upstream-region", self.region.is_some()),
                ("--upstream-profile", self.profile.is_some()),
                ("--upstream-path-style", self.path_style.is_some()),
                ("--upstream-timeout-ms", self.timeout.is_some()),
                ("--upstream-multipart-bytes", self.multipart_bytes.is_some()),
                ("--upstream-part-bytes", self.part_bytes.is_some()),
            ];
            return match given.iter().find(|(_, given)| *given) {
                Some((name, _)) => Err(format!("{name} applies to --upstream only")),
                None => Ok(None),
            };
        };
        let multipart_bytes = self.multipart_bytes.unwrap_or(DEFAULT_MULTIPART_BYTES);
        if multipart_bytes > MAX_PART_BYTES {
            return Err(format!(
                "--upstream-multipart-bytes {multipart_bytes}: at most {MAX_PART_BYTES} \
                 (S3's largest PutObject)"
            ));
        }
        let part_bytes = self.part_bytes.unwrap_or(DEFAULT_PART_BYTES);
        if !(MIN_PART_BYTES..=MAX_PART_BYTES).contains(&part_bytes) {
            return Err(format!(
                "--upstream-part-bytes {part_bytes}: S3's parts are {MIN_PART_BYTES} to \
                 {MAX_PART_BYTES} bytes"
            ));
        }
        Ok(Some(Settings {
            endpoint,
            region: self.region.unwrap_or_else(|| region.to_owned()),
            profile: self.profile,
            path_style: self.path_style.is_none_or(|(path, _)| path),
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            multipart_bytes,
            part_bytes,
        }))
    }
}

/// An `--upstream` URL: `http://` or `https://`, a host, an optional port,
/// nothing after (a trailing `/` is dropped).
fn endpoint(text: &str) -> Result<String, String> {
    let bad = |why: &str| {
        format!("--upstream {text}: {why} (expected http://HOST[:PORT] or https://HOST[:PORT])")
    };
    let uri: http::Uri = text.parse().map_err(|e| bad(&format!("{e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("not http or https"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err(bad("a path or query"));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// The most RDMA requests served at once: each may hold a blocking thread,
/// and tokio's pool takes at most a few thousand.
const MAX_REQUESTS: usize = 4096;

/// The longest RDMA transfer served: `--rdma-max-bytes` if given, else 5
/// GiB (S3's largest PUT) or the longest transfer whose buffer the memory
/// budget holds, if less. A maximum the budget cannot hold would never
/// apply (the budget would decline first): refused, with what to change.
fn max_bytes(given: Option<u64>, memory_bytes: u64) -> Result<u64, String> {
    let fits = crate::gateway::rdma::longest_transfer(memory_bytes);
    if fits == 0 {
        return Err(format!(
            "--rdma-memory-bytes {memory_bytes}: no transfer fits (a transfer's buffer is at \
             least {} bytes)",
            crate::gateway::rdma::MIN_BUF
        ));
    }
    match given {
        None => Ok(fits.min(5 << 30)),
        Some(max) if max > fits => Err(format!(
            "--rdma-max-bytes {max} is more than --rdma-memory-bytes {memory_bytes} holds for \
             one transfer ({fits} bytes), so it would never apply: raise --rdma-memory-bytes \
             or lower --rdma-max-bytes"
        )),
        Some(max) => Ok(max),
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
        assert_eq!(o.root, Some(PathBuf::from("/r")));
        assert!(o.upstream.is_none());
        assert_eq!(o.listen.port(), 0);
        assert_eq!(o.region, "us-east-1");
        assert!(o.buckets.is_empty() && o.device.is_none() && !o.no_rdma);
        assert_eq!(o.rdma_timeout, Duration::from_secs(10));
        assert_eq!(o.rdma_connect_timeout, Duration::from_secs(2));
        assert_eq!(o.delay_final, Duration::ZERO);
        assert!(o.rdma_allow.is_empty());
        assert_eq!(o.rdma_max_requests, 128);
        assert_eq!(o.rdma_memory_bytes, 1 << 30);
        assert_eq!(
            o.rdma_max_bytes,
            1 << 30,
            "the largest transfer the default memory budget holds"
        );
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
    fn the_largest_transfer_is_5_gib_or_what_the_memory_budget_holds_if_less() {
        let with = |extra: &[&str]| {
            let mut list = required();
            list.extend(extra);
            parse(&args(&list)).map(|o| {
                let o = o.expect("not --help");
                (o.rdma_max_bytes, o.rdma_memory_bytes)
            })
        };
        assert_eq!(
            with(&["--rdma-memory-bytes", "8589934592"]),
            Ok((5 << 30, 8 << 30))
        );
        // Whole MiB above 1 MiB, powers of two below: what a buffer takes.
        assert_eq!(
            with(&["--rdma-memory-bytes", "5767168"]),
            Ok((5 << 20, 5767168))
        );
        assert_eq!(with(&["--rdma-memory-bytes", "5000"]), Ok((4096, 5000)));
        assert_eq!(
            with(&[
                "--rdma-max-bytes",
                "1048576",
                "--rdma-memory-bytes",
                "1048576"
            ]),
            Ok((1 << 20, 1 << 20))
        );
        let never = with(&["--rdma-max-bytes", "5368709120"]).unwrap_err();
        assert!(
            never.contains("--rdma-max-bytes 5368709120 is more than --rdma-memory-bytes")
                && never.contains("raise --rdma-memory-bytes or lower --rdma-max-bytes"),
            "{never}"
        );
        let tiny = with(&["--rdma-memory-bytes", "4095"]).unwrap_err();
        assert!(tiny.contains("no transfer fits"), "{tiny}");
    }

    /// The required options with `--upstream URL` instead of `--root`.
    fn with_upstream(extra: &[&str]) -> Result<Options, String> {
        let mut list = vec![
            "--upstream",
            "http://127.0.0.1:9000",
            "--listen",
            "127.0.0.1:0",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
        ];
        list.extend(extra);
        parse(&args(&list)).map(|o| o.expect("not --help"))
    }

    #[test]
    fn upstream_options_are_read_with_their_defaults() {
        let o = with_upstream(&["--region", "eu-west-1"]).unwrap();
        assert_eq!(o.root, None);
        let u = o.upstream.expect("the upstream's settings");
        assert_eq!(u.endpoint, "http://127.0.0.1:9000");
        assert_eq!(u.region, "eu-west-1", "the server's region by default");
        assert_eq!(u.profile, None);
        assert!(u.path_style);
        assert_eq!(u.timeout, Duration::from_secs(30));
        assert_eq!((u.multipart_bytes, u.part_bytes), (64 << 20, 16 << 20));
        let o = with_upstream(&[
            "--upstream-region=garage",
            "--upstream-profile",
            "store",
            "--upstream-virtual-hosted-style",
            "--upstream-timeout-ms",
            "1500",
            "--upstream-multipart-bytes=1",
            "--upstream-part-bytes",
            "5242880",
        ])
        .unwrap();
        let u = o.upstream.unwrap();
        assert_eq!(u.region, "garage");
        assert_eq!(u.profile.as_deref(), Some("store"));
        assert!(!u.path_style);
        assert_eq!(u.timeout, Duration::from_millis(1500));
        assert_eq!((u.multipart_bytes, u.part_bytes), (1, 5 << 20));
        let mut list = required();
        list.splice(0..2, ["--upstream", "https://s3.example.com:8443/"]);
        let o = parse(&args(&list)).unwrap().unwrap();
        assert_eq!(o.upstream.unwrap().endpoint, "https://s3.example.com:8443");
    }

    #[test]
    fn root_and_upstream_exclude_each_other_and_one_is_required() {
        let mut both = required();
        both.extend(["--upstream", "http://127.0.0.1:9000"]);
        let e = parse(&args(&both)).unwrap_err();
        assert!(e.contains("--root and --upstream are exclusive"), "{e}");
        let neither = parse(&args(&required()[2..])).unwrap_err();
        assert!(
            neither.contains("--root or --upstream is required"),
            "{neither}"
        );
        let e = with_upstream(&["--bucket", "one"]).unwrap_err();
        assert!(e.contains("--bucket"), "{e}");
        let mut stray = required();
        stray.extend(["--upstream-timeout-ms", "10"]);
        let e = parse(&args(&stray)).unwrap_err();
        assert!(
            e.contains("--upstream-timeout-ms applies to --upstream only"),
            "{e}"
        );
    }

    #[test]
    fn bad_upstream_urls_and_sizes_are_refused() {
        for url in [
            "127.0.0.1:9000",
            "ftp://host",
            "http://",
            "http://host/bucket",
            "http://host/?x=1",
        ] {
            let mut list = required();
            list.splice(0..2, ["--upstream", url]);
            assert!(parse(&args(&list)).is_err(), "{url} was accepted");
        }
        for bad in [
            ["--upstream-part-bytes", "5242879"],
            ["--upstream-part-bytes", "5368709121"],
            ["--upstream-multipart-bytes", "5368709121"],
            ["--upstream-multipart-bytes", "0"],
            ["--upstream-timeout-ms", "0"],
        ] {
            assert!(with_upstream(&bad).is_err(), "{bad:?} was accepted");
        }
        let e = with_upstream(&["--upstream-path-style", "--upstream-virtual-hosted-style"])
            .unwrap_err();
        assert!(e.contains("exclusive"), "{e}");
    }

    #[test]
    fn help_wins() {
        assert!(matches!(parse(&args(&["--help"])), Ok(None)));
    }
}
