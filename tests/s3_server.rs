//! `hipobj-s3-server` from the outside, on the host (no RDMA needed): plain
//! S3 through `curl --aws-sigv4`, byte-exact against the files of its root;
//! SigV4 enforced; tokens it cannot serve declined with 501 as
//! `docs/protocol.md` says; its first line; SIGTERM.
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
    secret: &'a str,
    region: &'a str,
    sign: bool,
}

impl<'a> Request<'a> {
    fn new(method: &'a str, url: String) -> Request<'a> {
        Request {
            method,
            url,
            headers: Vec::new(),
            body: None,
            secret: SECRET_KEY,
            region: "us-east-1",
            sign: true,
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
                .arg(format!("{ACCESS_KEY}:{}", self.secret))
                .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
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
            "--rdma-chunk-bytes 2147483648 is more than --rdma-memory-bytes 1073741824 holds"
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
