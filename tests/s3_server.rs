//! `hipobj-s3-server` from the outside, on the host (no RDMA needed): plain
//! S3 through `curl --aws-sigv4`, byte-exact against the files of its root;
//! SigV4 enforced; tokens it cannot serve declined with 501 as
//! `docs/protocol.md` says; its first line; SIGTERM. What a deployment
//! needs: the config file, secrets from the environment or a file,
//! `--version` and the short usage, TLS, the log of refused requests,
//! `/metrics`, and the drain on SIGTERM.
//!
//! curl 7.88 signs but does not send `x-amz-content-sha256`, which s3s
//! requires on every SigV4 request; each request here sends it (as
//! `UNSIGNED-PAYLOAD`, or the body's SHA-256 where that is checked), and curl
//! signs it like any `x-amz-` header.

#[path = "common/s3.rs"]
mod s3;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use hipobj::core::token::{Token, Transport};
use s3::{S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hipobj-s3-server"))
}

fn start(extra: &[&str]) -> S3Server {
    S3Server::start(binary(), "127.0.0.1", extra)
}

/// One HTTP exchange as curl saw it.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.body.len().min(400);
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &String::from_utf8_lossy(&self.body[..shown]))
            .finish()
    }
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A request for curl: method, URL, extra headers, body, credentials.
struct Request<'a> {
    method: &'a str,
    url: String,
    headers: Vec<String>,
    body: Option<&'a [u8]>,
    access: &'a str,
    secret: &'a str,
    region: &'a str,
    sign: bool,
    /// The CA certificate that https is checked against.
    ca: Option<&'a Path>,
}

impl<'a> Request<'a> {
    fn new(method: &'a str, url: String) -> Request<'a> {
        Request {
            method,
            url,
            headers: Vec::new(),
            body: None,
            access: ACCESS_KEY,
            secret: SECRET_KEY,
            region: "us-east-1",
            sign: true,
            ca: None,
        }
    }

    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push(format!("{name}: {value}"));
        self
    }

    fn body(mut self, body: &'a [u8]) -> Self {
        self.body = Some(body);
        self
    }

    fn token(self, token: &str) -> Self {
        self.header("x-amz-rdma-token", token)
    }

    /// Sends it with curl; the body and the headers pass through files next
    /// to the server's root.
    fn send(self, server: &S3Server) -> Reply {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let scratch = |what: &str| -> PathBuf {
            let mut name = server.root().as_os_str().to_owned();
            name.push(format!(".{what}-{n}"));
            PathBuf::from(name)
        };
        let (header_file, body_file) = (scratch("headers"), scratch("body"));
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--http1.1", "-X", self.method])
            .arg("-D")
            .arg(&header_file)
            .arg("-o")
            .arg(&body_file);
        if self.sign {
            cmd.arg("--aws-sigv4")
                .arg(format!("aws:amz:{}:s3", self.region))
                .arg("--user")
                .arg(format!("{}:{}", self.access, self.secret))
                .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
        }
        if let Some(ca) = self.ca {
            cmd.arg("--cacert").arg(ca);
        }
        for h in &self.headers {
            cmd.args(["-H", h]);
        }
        if self.body.is_some() {
            cmd.args(["--data-binary", "@-"]);
        }
        cmd.arg(&self.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("curl is needed for these tests: {e}"));
        let mut stdin = child.stdin.take().expect("piped");
        if let Some(body) = self.body {
            stdin.write_all(body).expect("curl reads its body");
        }
        drop(stdin);
        let out = child.wait_with_output().expect("curl ran");
        assert!(
            out.status.success(),
            "curl {} {}: {}\n{}",
            self.method,
            self.url,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let raw = std::fs::read_to_string(&header_file).expect("curl wrote the headers");
        let body = std::fs::read(&body_file).unwrap_or_default();
        let _ = std::fs::remove_file(&header_file);
        let _ = std::fs::remove_file(&body_file);
        parse_headers(&raw, body)
    }
}

/// The last response's status and headers in curl's `-D` dump (which also
/// holds any `100 Continue`).
fn parse_headers(raw: &str, body: Vec<u8>) -> Reply {
    let block = raw
        .split("\r\n\r\n")
        .filter(|b| b.starts_with("HTTP/"))
        .last()
        .unwrap_or_else(|| panic!("no HTTP response in {raw:?}"));
    let mut lines = block.lines();
    let status_line = lines.next().expect("a status line");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body,
    }
}

/// Bytes of every value, in an order that shows misplaced ranges.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let [b0, b1, ..] = i.to_le_bytes();
            b0.wrapping_mul(31) ^ b1.wrapping_mul(7) ^ seed
        })
        .collect()
}

/// A well-formed `0x02` token (its client exists nowhere).
fn token_hex(transport: Transport) -> String {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[127, 0, 0, 1]);
    let token = Token {
        transport,
        qp_num: 17,
        gid,
        rkey: 0x1234,
        addr: 0x7f00_0000_0000,
        length: 4096,
        port: if transport == Transport::RcCm { 0 } else { 1 },
        lid: 4791,
        secret: if transport == Transport::RcCm {
            0x005e_c2e7
        } else {
            0
        },
    };
    String::from_utf8(token.to_hex().to_vec()).expect("hex is ASCII")
}

fn put(server: &S3Server, key: &str, data: &[u8]) {
    let reply = Request::new("PUT", server.url(key)).body(data).send(server);
    assert_eq!(reply.status, 200, "PUT {key}: {reply:?}");
}

fn object_file(server: &S3Server, key: &str) -> PathBuf {
    server.root().join(BUCKET).join(key)
}

/// The text between `<tag>` and `</tag>` in `xml`.
fn xml_field(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in {xml}"))
        + open.len();
    let end = xml[start..].find(&format!("</{tag}>")).expect("closed") + start;
    xml[start..end].to_owned()
}

#[test]
fn plain_put_then_get_is_byte_exact() {
    let server = start(&[]);
    let data = pattern(200_000, 5);
    put(&server, "dir/object.bin", &data);
    assert_eq!(
        std::fs::read(object_file(&server, "dir/object.bin")).unwrap(),
        data,
        "the stored file"
    );
    let reply = Request::new("GET", server.url("dir/object.bin")).send(&server);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, data);
    assert_eq!(reply.header("content-length"), Some("200000"));
    assert!(reply.header("etag").is_some());
    assert_eq!(reply.header("x-amz-rdma-reply"), None, "no token, no reply");
}

#[test]
fn a_ranged_get_answers_206_with_its_content_range() {
    let server = start(&[]);
    let data = pattern(10_000, 9);
    put(&server, "ranged", &data);
    let reply = Request::new("GET", server.url("ranged"))
        .header("Range", "bytes=1000-1999")
        .send(&server);
    assert_eq!(reply.status, 206);
    assert_eq!(reply.header("content-range"), Some("bytes 1000-1999/10000"));
    assert_eq!(reply.body, &data[1000..2000]);
    let suffix = Request::new("GET", server.url("ranged"))
        .header("Range", "bytes=-10")
        .send(&server);
    assert_eq!(suffix.status, 206);
    assert_eq!(suffix.body, &data[data.len() - 10..]);
}

/// RFC 9110, 14.1.2: a suffix longer than the object selects all of it; an
/// empty object satisfies no range (found by the range fuzz target: the
/// backend seeked before the file's start, and computed an empty object's
/// last byte as 2^64 - 1).
#[test]
fn a_suffix_range_past_the_start_is_the_whole_object_and_an_empty_object_satisfies_none() {
    let server = start(&[]);
    let data = pattern(10, 3);
    put(&server, "short", &data);
    let whole = Request::new("GET", server.url("short"))
        .header("Range", "bytes=-20")
        .send(&server);
    assert_eq!(whole.status, 206, "{whole:?}");
    assert_eq!(whole.header("content-range"), Some("bytes 0-9/10"));
    assert_eq!(whole.body, data);
    put(&server, "empty", &[]);
    for range in ["bytes=-5", "bytes=0-", "bytes=0-0"] {
        let none = Request::new("GET", server.url("empty"))
            .header("Range", range)
            .send(&server);
        assert_eq!(none.status, 416, "{range}: {none:?}");
    }
}

#[test]
fn a_multipart_upload_of_three_parts_reads_back_whole() {
    let server = start(&[]);
    let create = Request::new("POST", format!("{}?uploads=", server.url("multi"))).send(&server);
    assert_eq!(create.status, 200, "{create:?}");
    let upload_id = xml_field(&String::from_utf8_lossy(&create.body), "UploadId");
    // Every part but the last must be at least 5 MiB. (`?uploads=`: curl
    // 7.88 signs a bare `?uploads` differently from how S3 canonicalizes it.)
    let parts = [pattern(5 << 20, 1), pattern(5 << 20, 2), pattern(12_345, 3)];
    let mut complete = String::from("<CompleteMultipartUpload>");
    for (i, part) in parts.iter().enumerate() {
        let n = i + 1;
        let url = format!(
            "{}?partNumber={n}&uploadId={upload_id}",
            server.url("multi")
        );
        let reply = Request::new("PUT", url).body(part).send(&server);
        assert_eq!(reply.status, 200, "part {n}: {reply:?}");
        let etag = reply.header("etag").expect("a part's ETag").to_owned();
        complete.push_str(&format!(
            "<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
        ));
    }
    complete.push_str("</CompleteMultipartUpload>");
    let url = format!("{}?uploadId={upload_id}", server.url("multi"));
    let done = Request::new("POST", url)
        .body(complete.as_bytes())
        .send(&server);
    assert_eq!(done.status, 200, "{done:?}");
    let whole: Vec<u8> = parts.concat();
    let reply = Request::new("GET", server.url("multi")).send(&server);
    assert_eq!(reply.status, 200);
    assert!(
        reply.body == whole,
        "the object is the three parts in order"
    );
}

#[test]
fn a_wrong_secret_is_refused_with_403_and_stores_nothing() {
    let server = start(&[]);
    let mut request = Request::new("PUT", server.url("forged")).body(b"forged bytes");
    request.secret = "not-the-secret";
    let reply = request.send(&server);
    assert_eq!(reply.status, 403, "{reply:?}");
    assert!(!object_file(&server, "forged").exists());
}

#[test]
fn an_unsigned_request_is_refused_with_403() {
    let server = start(&[]);
    put(&server, "private", b"secret bytes");
    let mut request = Request::new("GET", server.url("private"));
    request.sign = false;
    let reply = request.send(&server);
    assert_eq!(reply.status, 403, "{reply:?}");
    assert_ne!(reply.body, b"secret bytes");
}

#[test]
fn a_request_signed_for_another_region_is_refused() {
    let server = start(&["--region", "eu-west-1"]);
    let reply = Request::new("GET", server.url("any")).send(&server);
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(String::from_utf8_lossy(&reply.body).contains("AuthorizationHeaderMalformed"));
    let mut request = Request::new("PUT", server.url("here")).body(b"x");
    request.region = "eu-west-1";
    assert_eq!(request.send(&server).status, 200);
}

#[test]
fn a_get_with_a_token_rdma_cannot_serve_gets_the_body_and_501() {
    let server = start(&["--no-rdma"]);
    let data = pattern(3000, 4);
    put(&server, "declined", &data);
    let reply = Request::new("GET", server.url("declined"))
        .token(&token_hex(Transport::RcCm))
        .send(&server);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(reply.header("x-amz-rdma-bytes-transferred"), None);
    assert_eq!(reply.body, data, "served the ordinary way");
    let ranged = Request::new("GET", server.url("declined"))
        .header("Range", "bytes=10-19")
        .token(&token_hex(Transport::RcCm))
        .send(&server);
    assert_eq!(ranged.status, 206);
    assert_eq!(ranged.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(ranged.body, &data[10..20]);
    let missing = Request::new("GET", server.url("nowhere"))
        .token(&token_hex(Transport::RcCm))
        .send(&server);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.header("x-amz-rdma-reply"), Some("501"));
}

#[test]
fn a_put_with_a_token_rdma_cannot_serve_gets_501_and_stores_nothing() {
    let server = start(&["--no-rdma"]);
    let reply = Request::new("PUT", server.url("declined"))
        .token(&token_hex(Transport::RcCm))
        .body(b"")
        .send(&server);
    assert_eq!(reply.status, 501, "{reply:?}");
    assert_eq!(reply.header("x-amz-rdma-reply"), Some("501"));
    assert!(!object_file(&server, "declined").exists());
}

#[test]
fn an_upload_part_with_a_token_rdma_cannot_serve_gets_501() {
    let server = start(&["--no-rdma"]);
    let create = Request::new("POST", format!("{}?uploads=", server.url("parts"))).send(&server);
    let upload_id = xml_field(&String::from_utf8_lossy(&create.body), "UploadId");
    let url = format!("{}?partNumber=1&uploadId={upload_id}", server.url("parts"));
    let reply = Request::new("PUT", url)
        .token(&token_hex(Transport::RcCm))
        .body(b"")
        .send(&server);
    assert_eq!(reply.status, 501, "{reply:?}");
    assert_eq!(reply.header("x-amz-rdma-reply"), Some("501"));
    let listed = Request::new(
        "GET",
        format!("{}?uploadId={upload_id}", server.url("parts")),
    )
    .send(&server);
    assert_eq!(listed.status, 200);
    assert!(
        !String::from_utf8_lossy(&listed.body).contains("<Part>"),
        "no part was stored: {}",
        String::from_utf8_lossy(&listed.body)
    );
}

#[test]
fn malformed_and_foreign_tokens_are_declined_with_501_whether_or_not_rdma_is_on() {
    let server = start(&[]);
    put(&server, "object", b"plain bytes");
    let short = "02abcdef".to_owned();
    let not_hex = "zz".repeat(44);
    let unknown_transport = format!("07{}", &token_hex(Transport::RcCm)[2..]);
    for token in [
        short,
        not_hex,
        unknown_transport,
        token_hex(Transport::Rc),
        token_hex(Transport::Dc),
    ] {
        let get = Request::new("GET", server.url("object"))
            .token(&token)
            .send(&server);
        assert_eq!(get.status, 200, "{token}");
        assert_eq!(get.header("x-amz-rdma-reply"), Some("501"), "{token}");
        assert_eq!(get.body, b"plain bytes");
        let put = Request::new("PUT", server.url("other"))
            .token(&token)
            .body(b"")
            .send(&server);
        assert_eq!(put.status, 501, "{token}: {put:?}");
        assert_eq!(put.header("x-amz-rdma-reply"), Some("501"));
        assert!(!object_file(&server, "other").exists());
    }
}

/// The original clients' form of the header, `"%s:%016lx:%016lx"`: the
/// token, then its address and size in zero-padded hex. With RDMA off the
/// token is never parsed: whatever it looks like, the decline says RDMA is
/// off.
#[test]
fn with_no_rdma_any_token_is_declined_because_rdma_is_off() {
    let root = S3Server::new_root();
    let mut log = root.clone().into_os_string();
    log.push(".log");
    let log = PathBuf::from(log);
    let server = S3Server::start_logged(binary(), "127.0.0.1", &root, &["--no-rdma"], &log);
    let data = pattern(1000, 8);
    put(&server, "object", &data);
    let original = format!(
        "{}:00007f2a5c000000:0000000001000000",
        token_hex(Transport::RcCm)
    );
    let get = Request::new("GET", server.url("object"))
        .token(&original)
        .send(&server);
    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(get.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(get.body, data, "served the ordinary way");
    let put = Request::new("PUT", server.url("other"))
        .token(&original)
        .body(b"")
        .send(&server);
    assert_eq!(put.status, 501, "{put:?}");
    assert_eq!(put.header("x-amz-rdma-reply"), Some("501"));
    let body = String::from_utf8_lossy(&put.body);
    assert!(body.contains("RDMA is off (--no-rdma)"), "{body}");
    assert!(!object_file(&server, "other").exists());
    drop(server);
    let said = std::fs::read_to_string(&log).expect("the server's log");
    let declines: Vec<&str> = said.lines().filter(|l| l.contains("declined")).collect();
    assert_eq!(declines.len(), 2, "{said}");
    for line in declines {
        assert!(line.ends_with("RDMA is off (--no-rdma)"), "{line}");
    }
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&log);
}

/// A chunk the memory budget cannot hold would never move: the server
/// refuses to start, saying what to change. (A root that cannot be made: a
/// server that got past its options would fail there, not listen.)
#[test]
fn a_chunk_above_the_memory_budget_is_refused_at_startup() {
    let out = Command::new(binary())
        .args(["--root", "/dev/null/root", "--listen", "127.0.0.1:0"])
        .args(["--access-key", "ak", "--secret-key", "sk"])
        .args(["--rdma-chunk-bytes", "2147483648"])
        .output()
        .expect("the server runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(
            "--rdma-chunk-bytes 2147483648: --rdma-memory-bytes 1073741824 holds 3 chunks of \
             at most 357564416 bytes"
        ),
        "{said}"
    );
}

#[test]
fn the_first_line_says_rdma_off_with_no_rdma() {
    let server = start(&["--no-rdma"]);
    assert!(!server.rdma);
    assert!(
        server
            .banner
            .ends_with("(rdma: off: disabled by --no-rdma)"),
        "{}",
        server.banner
    );
    assert!(server.endpoint.starts_with("http://127.0.0.1:"));
    assert_ne!(server.endpoint, "http://127.0.0.1:0", "port 0 picks a port");
}

#[test]
fn without_no_rdma_the_first_line_names_the_device_or_why_rdma_is_off() {
    let server = start(&[]);
    let (_, status) = server.banner.split_once("(rdma: ").expect("the rdma part");
    if server.rdma {
        assert!(!status.starts_with("off"), "{}", server.banner);
    } else {
        let reason = status.strip_prefix("off: ").expect("off: REASON");
        assert!(reason.len() > 1, "a reason: {}", server.banner);
    }
    // Whatever RDMA's state, plain S3 works.
    put(&server, "k", b"v");
    let reply = Request::new("GET", server.url("k")).send(&server);
    assert_eq!(reply.body, b"v");
}

#[test]
fn sigterm_stops_the_server_with_status_0() {
    let mut server = start(&[]);
    put(&server, "before", b"kept");
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(
        std::fs::read(object_file(&server, "before")).unwrap(),
        b"kept"
    );
}

#[test]
fn bad_command_lines_exit_2_before_listening() {
    let out = Command::new(binary())
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("the server runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--access-key is required"));
}

#[test]
fn buckets_named_on_the_command_line_are_created() {
    let server = start(&["--bucket", "second"]);
    assert!(server.root().join("second").is_dir());
    let list = Request::new("GET", format!("{}/", server.endpoint)).send(&server);
    assert_eq!(list.status, 200);
    let names = String::from_utf8_lossy(&list.body);
    assert!(
        names.contains("<Name>second</Name>") && names.contains(&format!("<Name>{BUCKET}</Name>")),
        "{names}"
    );
}

// What a deployment needs.

/// The server with no keys or arguments yet, and none of the key
/// variables from the test's own environment.
fn bare() -> Command {
    let mut command = Command::new(binary());
    command
        .env_remove("HIPOBJ_ACCESS_KEY")
        .env_remove("HIPOBJ_SECRET_KEY");
    command
}

/// The server with the test keys as a deployment gives them: the access
/// key on the command line, the secret key in the environment.
fn keyed() -> Command {
    let mut command = bare();
    command
        .args(["--access-key", ACCESS_KEY])
        .env("HIPOBJ_SECRET_KEY", SECRET_KEY);
    command
}

/// A file of the test's own in the temporary directory, removed when the
/// value is dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A file of the test's own in the temporary directory, with `mode`.
fn scratch(name: &str, contents: &[u8], mode: u32) -> Scratch {
    use std::os::unix::fs::PermissionsExt;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "hipobj-s3-test-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Scratch(path)
}

/// Starts `command` on a fresh root with `extra` arguments, its standard
/// error written to a file: the server and that file.
fn start_logged_by(command: Command, extra: &[&str]) -> (S3Server, Scratch) {
    let log = scratch("stderr", b"", 0o600);
    let file = std::fs::File::create(&log).expect("the log file");
    let server = S3Server::start_command(command, "127.0.0.1", extra, Stdio::from(file));
    (server, log)
}

fn text(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

fn read_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()))
}

#[test]
fn a_config_file_sets_options_and_the_command_line_overrides_them() {
    let config = scratch(
        "config.toml",
        b"# a deployment's settings\n\
          region = \"eu-west-1\"\n\
          bucket = [\"fromfile\", \"another\"]\n\
          rdma-max-requests = 16\n\
          no-rdma = true\n",
        0o644,
    );
    let server = start(&["--config", text(&config)]);
    // From the file: --no-rdma and the region.
    assert!(
        server
            .banner
            .ends_with("(rdma: off: disabled by --no-rdma)"),
        "{}",
        server.banner
    );
    let mut eu = Request::new("PUT", server.url("here")).body(b"x");
    eu.region = "eu-west-1";
    assert_eq!(eu.send(&server).status, 200);
    let us = Request::new("GET", server.url("here")).send(&server);
    assert_eq!(us.status, 400, "signed for us-east-1: {us:?}");
    // The command line's --bucket replaces the file's list.
    assert!(!server.root().join("fromfile").exists());
    drop(server);
    let server = start(&[
        "--config",
        text(&config),
        "--region",
        "us-east-1",
        "--no-rdma=false",
    ]);
    assert!(
        !server.banner.contains("disabled by --no-rdma"),
        "{}",
        server.banner
    );
    let reply = Request::new("PUT", server.url("there"))
        .body(b"y")
        .send(&server);
    assert_eq!(reply.status, 200, "{reply:?}");
}

#[test]
fn a_config_file_with_an_unknown_key_or_a_bad_value_is_refused_naming_the_file() {
    let typo = scratch("typo.toml", b"lisen = \"127.0.0.1:0\"\n", 0o644);
    let out = keyed()
        .args(["--root", "/dev/null/root", "--listen", "127.0.0.1:0"])
        .args(["--config", text(&typo)])
        .output()
        .expect("the server runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "the config file {}: unknown key \"lisen\"",
            typo.display()
        )),
        "{said}"
    );
    let bad = scratch("bad.toml", b"listen = 9000\n", 0o644);
    let out = keyed()
        .args(["--root", "/dev/null/root", "--config", text(&bad)])
        .output()
        .expect("the server runs");
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("{}: --listen 9000: ", bad.display())),
        "{said}"
    );
}

#[test]
fn the_keys_come_from_the_environment_or_files_never_needing_the_command_line() {
    // The environment alone.
    let mut from_env = bare();
    from_env
        .env("HIPOBJ_ACCESS_KEY", ACCESS_KEY)
        .env("HIPOBJ_SECRET_KEY", SECRET_KEY);
    let (server, log) = start_logged_by(from_env, &[]);
    put(&server, "from-env", b"1");
    let pid = server.pid().expect("running");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("its command line");
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(SECRET_KEY),
        "the secret key is on the command line"
    );
    drop(server);
    assert!(!read_log(&log).contains("warning"), "{}", read_log(&log));
    // A file of one line, its newline trimmed.
    let secret = scratch("secret", format!("{SECRET_KEY}\n").as_bytes(), 0o600);
    let mut from_file = bare();
    from_file.args([
        "--access-key",
        ACCESS_KEY,
        "--secret-key-file",
        text(&secret),
    ]);
    let (server, log) = start_logged_by(from_file, &[]);
    put(&server, "from-file", b"2");
    drop(server);
    assert!(!read_log(&log).contains("warning"), "{}", read_log(&log));
    // A file others may read: a warning.
    let open = scratch("open-secret", SECRET_KEY.as_bytes(), 0o644);
    let mut readable = bare();
    readable.args(["--access-key", ACCESS_KEY, "--secret-key-file", text(&open)]);
    let (server, log) = start_logged_by(readable, &[]);
    put(&server, "from-open-file", b"3");
    drop(server);
    let said = read_log(&log);
    assert!(
        said.contains(&format!(
            "warning: the secret key file {} can be read by other users (mode 0644)",
            open.display()
        )),
        "{said}"
    );
    // On the command line it still works, with a warning.
    let mut visible = bare();
    visible.args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]);
    let (server, log) = start_logged_by(visible, &[]);
    put(&server, "from-command-line", b"4");
    drop(server);
    let said = read_log(&log);
    assert!(
        said.contains("warning: --secret-key on the command line is visible to every user"),
        "{said}"
    );
}

#[test]
fn a_credentials_file_gives_one_access_key_per_tenant() {
    let tenants = scratch(
        "credentials",
        b"# tenant  secret\ntenant-a secret-of-a\n\ntenant-b   secret-of-b\n",
        0o600,
    );
    let mut command = bare();
    command.args(["--credentials-file", text(&tenants)]);
    let (server, _log) = start_logged_by(command, &[]);
    for (access, secret) in [("tenant-a", "secret-of-a"), ("tenant-b", "secret-of-b")] {
        let mut request = Request::new("PUT", server.url(access)).body(b"mine");
        (request.access, request.secret) = (access, secret);
        assert_eq!(request.send(&server).status, 200, "{access}");
    }
    let mut crossed = Request::new("PUT", server.url("crossed")).body(b"x");
    (crossed.access, crossed.secret) = ("tenant-a", "secret-of-b");
    assert_eq!(crossed.send(&server).status, 403);
}

#[test]
fn version_names_the_release_and_what_the_build_holds() {
    let out = bare().arg("--version").output().expect("the server runs");
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!(
            "hipobj-s3-server {} (rdma, s3s 0.14.1, ",
            env!("CARGO_PKG_VERSION")
        )) && said.contains("rustls")
            && said.ends_with(")\n"),
        "{said}"
    );
}

#[test]
fn a_bad_argument_prints_its_error_and_one_usage_line_and_exits_2() {
    let out = keyed()
        .args(["--root", "/dev/null/root", "--lisen", "127.0.0.1:0"])
        .output()
        .expect("the server runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let said = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert_eq!(lines[0], "hipobj-s3-server: unknown argument --lisen");
    assert!(
        lines[1].starts_with("usage: hipobj-s3-server --root DIR --listen ADDR:PORT")
            && lines[1].ends_with("; --help for all options"),
        "{said}"
    );
    let help = bare().arg("--help").output().expect("the server runs");
    assert_eq!(help.status.code(), Some(0));
    let usage = String::from_utf8_lossy(&help.stdout);
    assert!(
        usage.lines().count() > 20 && usage.contains("--tls-cert <PEM>"),
        "{usage}"
    );
}

#[test]
fn listening_beyond_loopback_without_tls_warns_that_s3_goes_in_clear_text() {
    let log = scratch("stderr", b"", 0o600);
    let file = std::fs::File::create(&log).expect("the log file");
    let server = S3Server::start_command(keyed(), "0.0.0.0", &[], Stdio::from(file));
    drop(server);
    let said = read_log(&log);
    assert!(
        said.contains("warning: --listen 0.0.0.0:0 without --tls-cert:")
            && said.contains("clear text"),
        "{said}"
    );
}

/// A self-signed certificate for 127.0.0.1: its PEM file (the CA a client
/// trusts, too) and its key's.
fn self_signed() -> (Scratch, Scratch) {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("a certificate");
    (
        scratch("cert.pem", cert.pem().as_bytes(), 0o644),
        scratch("key.pem", signing_key.serialize_pem().as_bytes(), 0o600),
    )
}

#[test]
fn https_serves_put_and_get_and_plain_http_to_its_port_fails_cleanly() {
    let (cert, key) = self_signed();
    let (server, log) = start_logged_by(
        keyed(),
        &["--tls-cert", text(&cert), "--tls-key", text(&key)],
    );
    assert!(
        server.endpoint.starts_with("https://127.0.0.1:"),
        "{}",
        server.banner
    );
    let data = pattern(300_000, 6);
    let mut request = Request::new("PUT", server.url("secure")).body(&data);
    request.ca = Some(&cert);
    assert_eq!(request.send(&server).status, 200);
    let get = |server: &S3Server| {
        let mut request = Request::new("GET", server.url("secure"));
        request.ca = Some(&cert);
        request.send(server)
    };
    let reply = get(&server);
    assert_eq!(reply.status, 200);
    assert!(reply.body == data, "the object came back whole");
    // Plain HTTP to the TLS port: the client fails, the server goes on.
    let plain = server.endpoint.replacen("https://", "http://", 1);
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(format!("{plain}/{BUCKET}/secure"))
        .output()
        .expect("curl runs");
    assert!(!out.status.success(), "plain HTTP got an answer: {out:?}");
    // A client that does not trust the certificate is refused by itself.
    let untrusted = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(server.url("secure"))
        .output()
        .expect("curl runs");
    assert!(!untrusted.status.success(), "{untrusted:?}");
    assert_eq!(get(&server).status, 200, "still serving");
    drop(server);
    let said = read_log(&log);
    assert!(
        said.contains("TLS handshake with 127.0.0.1:"),
        "the failed handshakes are logged: {said}"
    );
}

#[test]
fn a_refused_request_is_logged_once_with_its_reason_and_never_a_secret() {
    let (server, log) = start_logged_by(keyed(), &[]);
    let wrong = "wrong-secret-1234";
    let mut forged = Request::new("PUT", server.url("forged")).body(b"forged");
    forged.secret = wrong;
    assert_eq!(forged.send(&server).status, 403);
    let mut stranger = Request::new("GET", server.url("forged"));
    stranger.access = "stranger";
    assert_eq!(stranger.send(&server).status, 403);
    let mut unsigned = Request::new("GET", server.url("forged"));
    unsigned.sign = false;
    assert_eq!(unsigned.send(&server).status, 403);
    drop(server);
    let said = read_log(&log);
    let lines = |code: &str| -> Vec<&str> { said.lines().filter(|l| l.contains(code)).collect() };
    let bad_signature = lines("SignatureDoesNotMatch");
    assert_eq!(bad_signature.len(), 1, "{said}");
    let line = bad_signature[0];
    for part in [
        "PUT /bucket/forged (PutObject) from 127.0.0.1:",
        &format!("with access key {ACCESS_KEY}"),
        "403 SignatureDoesNotMatch, authentication refused: the signature does not match",
    ] {
        assert!(line.contains(part), "{part:?} is not in {line:?}");
    }
    let unknown = lines("with access key stranger");
    assert_eq!(unknown.len(), 1, "{said}");
    assert!(unknown[0].contains("unknown access key"), "{}", unknown[0]);
    let anonymous = lines("unsigned");
    assert_eq!(anonymous.len(), 1, "{said}");
    assert!(
        anonymous[0].contains("403 AccessDenied"),
        "{}",
        anonymous[0]
    );
    for secret in [SECRET_KEY, wrong, "Signature="] {
        assert!(!said.contains(secret), "{secret:?} is in the log: {said}");
    }
}

/// The metrics' text from `url`.
fn scrape(url: &str) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--fail", url])
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "GET {url}: {out:?}");
    String::from_utf8(out.stdout).expect("the metrics are text")
}

/// The value of the series `series` (name and labels as printed), 0 when
/// absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

#[test]
fn metrics_count_requests_and_bytes_by_path_and_operation() {
    let server = start(&["--no-rdma", "--metrics-listen", "127.0.0.1:0"]);
    let line = server.next_line();
    let url = line
        .strip_prefix("hipobj-s3-server metrics on ")
        .unwrap_or_else(|| panic!("the metrics line: {line:?}"))
        .to_owned();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/metrics"));
    let before = scrape(&url);
    let data = pattern(1000, 2);
    put(&server, "counted", &data);
    assert_eq!(
        Request::new("GET", server.url("counted"))
            .send(&server)
            .body,
        data
    );
    let declined = Request::new("GET", server.url("counted"))
        .token(&token_hex(Transport::RcCm))
        .send(&server);
    assert_eq!(declined.header("x-amz-rdma-reply"), Some("501"));
    let after = scrape(&url);
    let moved = |series: &str| sample(&after, series) - sample(&before, series);
    let requests =
        |op: &str| format!("hipobj_s3_requests_total{{path=\"http\",op=\"{op}\",status=\"200\"}}");
    assert_eq!(moved(&requests("PutObject")), 1.0, "{after}");
    assert_eq!(moved(&requests("GetObject")), 2.0, "{after}");
    assert_eq!(
        moved("hipobj_s3_bytes_total{path=\"http\",op=\"PutObject\"}"),
        1000.0
    );
    assert_eq!(
        moved("hipobj_s3_bytes_total{path=\"http\",op=\"GetObject\"}"),
        2000.0
    );
    assert_eq!(
        moved("hipobj_s3_rdma_refusals_total{op=\"GetObject\",reason=\"declined\"}"),
        1.0
    );
    assert_eq!(
        moved("hipobj_s3_request_duration_seconds_count{path=\"http\",op=\"GetObject\"}"),
        2.0
    );
    assert_eq!(
        sample(
            &after,
            "hipobj_s3_requests_total{path=\"rdma\",op=\"GetObject\",status=\"200\"}"
        ),
        0.0,
        "nothing went by RDMA"
    );
    assert!(
        after.contains("\nhipobj_s3_rdma_memory_in_use_bytes 0\n"),
        "{after}"
    );
    let elsewhere = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(url.replace("/metrics", "/other"))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&elsewhere.stdout), "404");
}

/// Waits up to 10 s for connections to `addr` to be refused.
fn refused_soon(addr: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        match std::net::TcpStream::connect(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    false
}

#[test]
fn sigterm_lets_a_request_in_progress_finish_refuses_new_ones_and_stops_the_metrics() {
    let mut server = start(&[
        "--metrics-listen",
        "127.0.0.1:0",
        "--shutdown-grace-ms",
        "60000",
    ]);
    let metrics = server.next_line();
    let metrics = metrics
        .strip_prefix("hipobj-s3-server metrics on http://")
        .and_then(|m| m.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("the metrics line: {metrics:?}"))
        .to_owned();
    let data = pattern(24 << 20, 1);
    put(&server, "big", &data);
    // More than the sockets' buffers hold, at 6 MB/s: the GET is still
    // being sent seconds after it began.
    let download = scratch("download", b"", 0o600);
    let mut slow = Command::new("curl")
        .args(["-sS", "--fail", "--limit-rate", "6M", "-o"])
        .arg(&download)
        .arg("--aws-sigv4")
        .arg("aws:amz:us-east-1:s3")
        .arg("--user")
        .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .arg(server.url("big"))
        .spawn()
        .expect("curl runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&download).map_or(0, |m| m.len()) == 0 {
        assert!(std::time::Instant::now() < deadline, "the GET never began");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = server.pid().expect("running").to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(kill.is_ok_and(|s| s.success()));
    let s3 = server.endpoint.trim_start_matches("http://").to_owned();
    assert!(refused_soon(&s3), "the S3 port still accepts after SIGTERM");
    assert!(
        refused_soon(&metrics),
        "the metrics port still accepts after SIGTERM"
    );
    assert!(
        slow.try_wait().expect("curl's status").is_none(),
        "the GET ended before the test could see the drain"
    );
    assert!(server.running(), "the server left before its request ended");
    let got = slow.wait().expect("curl ends");
    assert!(got.success(), "the GET in progress failed: {got}");
    assert!(
        std::fs::read(&download).expect("the download") == data,
        "the GET in progress came whole"
    );
    // (terminate's SIGTERM, a second one, changes nothing of the drain.)
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "{status}");
}
