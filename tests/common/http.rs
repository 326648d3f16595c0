//! A scripted HTTP/1.1 endpoint for tests of the S3 client: every request
//! (its head and whole body) goes to a handler that answers it, drops the
//! connection, or forwards it to a real server; every request is recorded.
//! It lets a test make the server change an object between two requests,
//! fail once, or hold a request until the test says, none of which the real
//! server does on cue. Signatures are not checked (a forwarded request is
//! checked by the server it reaches: the `Host` header goes through as it
//! was signed).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as it arrived.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `PUT`...
    pub method: String,
    /// The path and query, as sent (`/bucket/key?partNumber=1&...`).
    pub target: String,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// Whether the query has this parameter.
    pub fn has_query(&self, name: &str) -> bool {
        self.target.split_once('?').is_some_and(|(_, q)| {
            q.split('&')
                .any(|p| p == name || p.starts_with(&format!("{name}=")))
        })
    }

    /// A query parameter's value.
    pub fn query(&self, name: &str) -> Option<String> {
        let (_, q) = self.target.split_once('?')?;
        q.split('&')
            .find_map(|p| p.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }
}

/// What the endpoint does with a request.
pub enum Reply {
    /// Answers with this status, these headers and this body
    /// (`Content-Length` is added).
    Respond {
        /// The status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body (none for a HEAD, whatever this says, but its length
        /// is the `Content-Length`).
        body: Vec<u8>,
    },
    /// Sends the status line, the headers and `sent` bytes of a body of
    /// `len`, then holds the connection open until the endpoint is dropped.
    Stall {
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The `Content-Length`.
        len: u64,
        /// Bytes sent before stalling.
        sent: usize,
    },
    /// Closes the connection without an answer.
    Close,
}

impl Reply {
    /// An answer with `status` and `headers`, and `body`.
    pub fn new(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Reply {
        Reply::Respond {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.into(),
        }
    }

    /// An S3 error: `status`, and the XML body with `code` and `message`.
    pub fn s3_error(status: u16, code: &str, message: &str) -> Reply {
        Reply::new(
            status,
            &[("content-type", "application/xml")],
            format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"),
        )
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// A listening endpoint; stops accepting when dropped.
pub struct Endpoint {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl Endpoint {
    /// Starts an endpoint that answers with `handler`.
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the scripted endpoint");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        {
            let seen = Arc::clone(&seen);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let handler = Arc::clone(&handler);
                    let seen = Arc::clone(&seen);
                    let stop = Arc::clone(&stop);
                    std::thread::spawn(move || serve(stream, &*handler, &seen, &stop));
                }
            });
        }
        Endpoint {
            url: format!("http://{addr}"),
            addr,
            seen,
            stop,
        }
    }

    /// The requests seen so far, in order of arrival.
    pub fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests had this method.
    pub fn count(&self, method: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method)
            .count()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, handler: &Handler, seen: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let Some(request) = read_request(&mut reader, &mut writer) else {
            return;
        };
        seen.lock().unwrap().push(request.clone());
        let head = request.method == "HEAD";
        match handler(&request) {
            Reply::Respond {
                status,
                headers,
                body,
            } => {
                let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
                for (k, v) in &headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                if !headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                {
                    out.push_str(&format!("content-length: {}\r\n", body.len()));
                }
                out.push_str("\r\n");
                let mut bytes = out.into_bytes();
                if !head {
                    bytes.extend_from_slice(&body);
                }
                if writer.write_all(&bytes).is_err() {
                    return;
                }
            }
            Reply::Stall { headers, len, sent } => {
                let mut out = "HTTP/1.1 200 OK\r\n".to_owned();
                for (k, v) in &headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str(&format!("content-length: {len}\r\n\r\n"));
                let _ = writer.write_all(out.as_bytes());
                let _ = writer.write_all(&vec![0x5a; sent]);
                let _ = writer.flush();
                // Held until the endpoint goes (bounded: tests end).
                for _ in 0..1200 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                return;
            }
            Reply::Close => return,
        }
    }
}

/// Reads one request; answers `Expect: 100-continue` before its body.
fn read_request(reader: &mut BufReader<TcpStream>, writer: &mut TcpStream) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let len: usize = find("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if len > 0
        && find("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        && writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err()
    {
        return None;
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        target,
        headers,
        body,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        412 => "Precondition Failed",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Sends `request` to the server at `upstream` (`http://IP:PORT`) as it
/// came, and returns its answer (whose body has a `Content-Length`).
pub fn forward(upstream: &str, request: &Request) -> Reply {
    let addr = upstream.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("the upstream server is up");
    let mut out = format!("{} {} HTTP/1.1\r\n", request.method, request.target);
    for (k, v) in &request.headers {
        if k == "expect" || k == "connection" {
            continue;
        }
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("connection: close\r\n\r\n");
    stream.write_all(out.as_bytes()).unwrap();
    stream.write_all(&request.body).unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_owned());
            if k == "content-length" {
                len = v.parse().unwrap_or(0);
            }
            if k != "connection" && k != "transfer-encoding" {
                headers.push((k, v));
            }
        }
    }
    let mut body = vec![0u8; if request.method == "HEAD" { 0 } else { len }];
    reader.read_exact(&mut body).unwrap();
    Reply::Respond {
        status,
        headers,
        body,
    }
}
