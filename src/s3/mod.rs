//! The built-in S3 client (feature `s3`): signed requests to an S3
//! endpoint, plain and carrying RDMA tokens, and whole object transfers
//! through a [`Client`](crate::client::Client) that fall back to plain HTTP
//! when the server declines RDMA ([`objects`]).
//!
//! Signing is AWS's own SigV4 implementation (the `aws-sigv4` crate, the
//! one the AWS SDK for Rust signs with, maintained on the SDK's release
//! train and tested against AWS's SigV4 suite); HTTP is `ureq` (blocking,
//! no async runtime, rustls for `https://`). Path-style addresses
//! (`ENDPOINT/BUCKET/KEY`), as S3-compatible servers take them. The
//! `x-amz-rdma-token` header is signed like any other.

pub mod checksum;
pub mod config;
pub mod objects;

use std::io::Read;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

pub use checksum::Checksum;
pub use config::{ConfigError, Credentials, Overrides, S3Config};

/// Characters a path segment or a query value keeps as they are: SigV4's
/// unreserved set (`A-Z a-z 0-9 - . _ ~`).
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How long one request may take, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// A failed S3 request.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// The server answered with a status that is not a success: its S3
    /// error code and message, and what to check for the usual ones.
    #[error("{what}: HTTP {status}{}", describe(*.status, .code, .message))]
    Status {
        /// The request (`GET bucket/key`).
        what: String,
        /// The HTTP status.
        status: u16,
        /// S3's error `Code`, if the body had one.
        code: Option<String>,
        /// S3's error `Message`, if the body had one.
        message: Option<String>,
    },
    /// No answer, or half of one: the connection failed, broke, or timed
    /// out. The error names the endpoint and what to check.
    #[error("{what}: {error}")]
    Transport {
        /// The request.
        what: String,
        /// Why.
        error: String,
        /// Whether the same request may succeed if sent again (a refused,
        /// reset or timed-out connection; not a name that does not
        /// resolve, nor a TLS failure).
        retry: bool,
    },
    /// An answer that does not make sense for the request.
    #[error("{what}: {why}")]
    Response {
        /// The request.
        what: String,
        /// What was wrong with it.
        why: String,
    },
    /// The settings could not be resolved.
    #[error("{0}")]
    Config(#[from] ConfigError),
}

fn describe(status: u16, code: &Option<String>, message: &Option<String>) -> String {
    let hint = match code.as_deref() {
        Some("SignatureDoesNotMatch") => {
            " (check the secret key: AWS_SECRET_ACCESS_KEY or the profile's)"
        }
        Some("InvalidAccessKeyId" | "NotSignedUp") => {
            " (check the access key: AWS_ACCESS_KEY_ID or the profile's)"
        }
        Some("AuthorizationHeaderMalformed") => {
            " (the region: --region, AWS_REGION or the profile's)"
        }
        Some("RequestTimeTooSkewed") => " (check this machine's clock)",
        _ => "",
    };
    match (code, message) {
        (Some(c), Some(m)) => format!(" {c}: {m}{hint}"),
        (Some(c), None) => format!(" {c}{hint}"),
        // A HEAD's answer has no body: the status's own words.
        _ => http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .map(|r| format!(" {r}"))
            .unwrap_or_default(),
    }
}

/// One S3 request, before signing.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// `GET`, `HEAD`, `PUT`, `POST`, `DELETE`.
    pub method: &'static str,
    /// The bucket.
    pub bucket: &'a str,
    /// The key; `None` for a bucket request.
    pub key: Option<&'a str>,
    /// Query parameters (a value of `""` is a bare name, as `?uploads`).
    pub query: Vec<(&'static str, String)>,
    /// Extra headers (signed).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: &'a [u8],
    /// Sign the body's hash (small bodies); else `UNSIGNED-PAYLOAD`.
    pub sign_body: bool,
}

impl<'a> Request<'a> {
    /// A request without body, query or extra header.
    pub fn new(method: &'static str, bucket: &'a str, key: Option<&'a str>) -> Request<'a> {
        Request {
            method,
            bucket,
            key,
            query: Vec::new(),
            headers: Vec::new(),
            body: &[],
            sign_body: true,
        }
    }

    /// `GET bucket/key` and the like, for messages.
    pub fn what(&self) -> String {
        match self.key {
            Some(key) => format!("{} {}/{}", self.method, self.bucket, key),
            None => format!("{} {}", self.method, self.bucket),
        }
    }
}

/// An answer, its body not yet read.
pub struct Response {
    what: String,
    inner: http::Response<ureq::Body>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("what", &self.what)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl Response {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.inner.status().as_u16()
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        self.inner.status().is_success()
    }

    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.inner.headers().get(name)?.to_str().ok()
    }

    /// The body's length as `Content-Length` says, if it does.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.parse().ok()
    }

    /// Reads the body into `out`, which it must fill exactly.
    pub fn read_body_into(&mut self, out: &mut [u8]) -> Result<(), S3Error> {
        self.read_body_watched(out, &|_| Ok(()))
    }

    /// [`Response::read_body_into`], telling `watch` the bytes read so far
    /// as they arrive; an error of `watch` (say, the transfer was
    /// cancelled) stops the read with that error.
    pub fn read_body_watched(&mut self, out: &mut [u8], watch: Watch<'_>) -> Result<(), S3Error> {
        let what = self.what.clone();
        let mut reader = self.inner.body_mut().as_reader();
        let mut filled = 0;
        while filled < out.len() {
            match reader.read(&mut out[filled..]) {
                Ok(0) => {
                    return Err(S3Error::Transport {
                        what,
                        error: format!(
                            "the answer's body ended after {filled} of {} bytes",
                            out.len()
                        ),
                        retry: true,
                    })
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(S3Error::Transport {
                        what,
                        error: format!(
                            "the answer's body broke off after {filled} of {} bytes: {e}",
                            out.len()
                        ),
                        retry: true,
                    })
                }
            }
            watch(filled as u64).map_err(|e| S3Error::Transport {
                what: what.clone(),
                error: e.to_string(),
                retry: false,
            })?;
        }
        let mut extra = [0u8; 1];
        match reader.read(&mut extra) {
            Ok(0) => Ok(()),
            Ok(_) => Err(S3Error::Response {
                what,
                why: format!("the body is longer than {} bytes", out.len()),
            }),
            Err(e) => Err(S3Error::Transport {
                what,
                error: e.to_string(),
                retry: true,
            }),
        }
    }

    /// The body as a reader, for a caller that takes it in pieces of its
    /// own (its length is the caller's to check).
    pub fn body_reader(&mut self) -> impl Read + '_ {
        self.inner.body_mut().as_reader()
    }

    /// The body as text, at most `limit` bytes of it.
    pub fn text(&mut self, limit: u64) -> Result<String, S3Error> {
        let bytes = self
            .inner
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| S3Error::Transport {
                what: self.what.clone(),
                error: e.to_string(),
                retry: true,
            })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `Err(S3Error::Status)` with S3's error code and message unless the
    /// status is a success.
    pub fn success(mut self) -> Result<Response, S3Error> {
        if self.is_success() {
            return Ok(self);
        }
        let status = self.status();
        let text = self.text(64 << 10).unwrap_or_default();
        Err(S3Error::Status {
            what: self.what,
            status,
            code: xml_value(&text, "Code"),
            message: xml_value(&text, "Message"),
        })
    }
}

/// The insides of every `<tag>...</tag>` in `xml`, in order (not nested).
pub fn xml_blocks<'x>(xml: &'x str, tag: &str) -> Vec<&'x str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut blocks = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let inside = &rest[start + open.len()..];
        let Some(end) = inside.find(&close) else {
            break;
        };
        blocks.push(&inside[..end]);
        rest = &inside[end + close.len()..];
    }
    blocks
}

/// The text of the first `<tag>...</tag>` in `xml`.
pub fn xml_value(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(xml_unescape(&xml[start..end]))
}

fn xml_unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Told the bytes of a body moved so far; an error stops the request.
pub type Watch<'a> = &'a (dyn Fn(u64) -> std::io::Result<()> + Sync);

/// An object of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag, quoted as S3 sends it.
    pub etag: Option<String>,
}

/// What a HEAD says of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Its size in bytes.
    pub len: u64,
    /// Its ETag (quoted, as S3 sends it), if the answer had one.
    pub etag: Option<String>,
}

/// One part of a multipart upload, as CompleteMultipartUpload lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedPart {
    /// From 1.
    pub number: u32,
    /// The ETag its UploadPart's answer had.
    pub etag: String,
    /// The checksum it was uploaded with, if any.
    pub checksum: Option<Checksum>,
}

/// A request's body, read by the HTTP client, with `watch` told as it goes.
struct WatchedBody<'a> {
    bytes: &'a [u8],
    at: usize,
    watch: Watch<'a>,
}

impl Read for WatchedBody<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.bytes.len() - self.at);
        out[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        if n > 0 {
            (self.watch)(self.at as u64)?;
        }
        Ok(n)
    }
}

/// Why no answer came from `endpoint`, in words that name it and what to
/// check; and whether sending again may help.
fn transport_error(endpoint: &str, e: &ureq::Error) -> (String, bool) {
    use std::io::ErrorKind;
    let check = "is the server up, and is the endpoint right (--endpoint, AWS_ENDPOINT_URL, the profile's endpoint_url)?";
    match e {
        ureq::Error::Io(io) => match io.kind() {
            ErrorKind::ConnectionRefused => (
                format!("cannot connect to {endpoint}: {io}: {check}"),
                true,
            ),
            ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof => (
                format!("the connection to {endpoint} broke: {io}"),
                true,
            ),
            ErrorKind::TimedOut | ErrorKind::WouldBlock => (
                format!("{endpoint} did not answer in time: {io}"),
                true,
            ),
            // The transfer's own watch stopped it (a cancel).
            ErrorKind::Interrupted => (io.to_string(), false),
            ErrorKind::InvalidData if endpoint.starts_with("https://") => (
                format!("TLS with {endpoint} failed: {io}: does the server speak https? (a plain http:// server answers TLS with garbage such as InvalidContentType: write http://)"),
                false,
            ),
            _ if io.to_string().contains("lookup address") => (
                format!("cannot find the host of {endpoint}: {io}: is the endpoint right (--endpoint, AWS_ENDPOINT_URL, the profile's endpoint_url)?"),
                false,
            ),
            _ => (format!("{endpoint}: {io}"), true),
        },
        ureq::Error::HostNotFound => (
            format!("cannot find the host of {endpoint}: is the endpoint right (--endpoint, AWS_ENDPOINT_URL, the profile's endpoint_url)?"),
            false,
        ),
        ureq::Error::ConnectionFailed => (format!("cannot connect to {endpoint}: {check}"), true),
        ureq::Error::Timeout(t) => (format!("{endpoint} did not answer in time ({t})"), true),
        ureq::Error::Rustls(_) | ureq::Error::Tls(_) | ureq::Error::Pem(_) => (
            format!("TLS with {endpoint} failed: {e}: does the server speak https? (a plain http:// server answers TLS with garbage such as InvalidContentType: write http://)"),
            false,
        ),
        ureq::Error::Protocol(_) => (
            format!("{endpoint} did not answer in HTTP: {e}: is the scheme right (http:// or https://)?"),
            false,
        ),
        other => (format!("{endpoint}: {other}"), false),
    }
}

/// The certificate authorities of the PEM file at `path`.
fn ca_bundle(path: &std::path::Path) -> Result<ureq::tls::RootCerts, S3Error> {
    let pem = std::fs::read(path)
        .map_err(|e| ConfigError(format!("the CA bundle {}: {e}", path.display())))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => certs.push(cert),
            Ok(_) => {}
            Err(e) => {
                return Err(ConfigError(format!(
                    "the CA bundle {} is not PEM: {e}",
                    path.display()
                ))
                .into())
            }
        }
    }
    if certs.is_empty() {
        return Err(ConfigError(format!(
            "the CA bundle {} holds no certificate",
            path.display()
        ))
        .into());
    }
    Ok(ureq::tls::RootCerts::new_with_certs(&certs))
}

/// How an [`S3`] addresses and sends its requests, beyond its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestOptions {
    /// How long one request may take, connect to last byte (600 s by
    /// default).
    pub timeout: Duration,
    /// Virtual-hosted-style addresses (`scheme://BUCKET.host/KEY`) instead
    /// of path-style ones (`scheme://host/BUCKET/KEY`, the default).
    pub virtual_hosted: bool,
    /// Anonymous requests: none is signed (public buckets).
    pub unsigned: bool,
    /// A PEM file of the certificate authorities `https://` endpoints are
    /// checked against, instead of Mozilla's roots (`AWS_CA_BUNDLE`).
    pub ca_bundle: Option<std::path::PathBuf>,
}

impl Default for RequestOptions {
    /// 600 s, path style, signed.
    fn default() -> RequestOptions {
        RequestOptions {
            timeout: REQUEST_TIMEOUT,
            virtual_hosted: false,
            unsigned: false,
            ca_bundle: None,
        }
    }
}

/// An S3 endpoint with its keys. `Sync`: one client serves many threads.
pub struct S3 {
    agent: ureq::Agent,
    config: S3Config,
    options: RequestOptions,
    /// The endpoint's scheme and authority, for virtual-hosted addresses.
    scheme: String,
    authority: String,
}

impl std::fmt::Debug for S3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3").field("config", &self.config).finish()
    }
}

impl S3 {
    /// A client of the endpoint `config` names.
    pub fn new(config: S3Config) -> Result<S3, S3Error> {
        S3::with_options(config, RequestOptions::default())
    }

    /// A client of the endpoint `config` names, addressing and sending its
    /// requests as `options` say.
    pub fn with_options(config: S3Config, options: RequestOptions) -> Result<S3, S3Error> {
        let uri: http::Uri = config.endpoint.parse().map_err(|e| {
            ConfigError(format!(
                "the endpoint {:?} is not a URL: {e}",
                config.endpoint
            ))
        })?;
        if uri.host().is_none() || !uri.path().trim_matches('/').is_empty() {
            return Err(ConfigError(format!(
                "the endpoint {:?} must be scheme://host[:port] without a path",
                config.endpoint
            ))
            .into());
        }
        let scheme = uri.scheme_str().unwrap_or("https").to_owned();
        let authority = uri.authority().map(ToString::to_string).unwrap_or_default();
        let mut agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(options.timeout));
        if let Some(path) = &options.ca_bundle {
            agent = agent.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ca_bundle(path)?)
                    .build(),
            );
        }
        let agent = agent.build().into();
        Ok(S3 {
            agent,
            config,
            options,
            scheme,
            authority,
        })
    }

    /// How requests are addressed and sent.
    pub fn options(&self) -> &RequestOptions {
        &self.options
    }

    /// The settings in use.
    pub fn config(&self) -> &S3Config {
        &self.config
    }

    /// The URL of `request`, its path and query encoded.
    fn url(&self, request: &Request<'_>) -> String {
        let mut url = if self.options.virtual_hosted {
            // A bucket's name is a DNS label here: nothing to encode.
            format!("{}://{}.{}", self.scheme, request.bucket, self.authority)
        } else {
            format!(
                "{}/{}",
                self.config.endpoint,
                utf8_percent_encode(request.bucket, UNRESERVED)
            )
        };
        if self.options.virtual_hosted && request.key.is_none() {
            url.push('/');
        }
        if let Some(key) = request.key {
            url.push('/');
            let segments: Vec<String> = key
                .split('/')
                .map(|s| utf8_percent_encode(s, UNRESERVED).to_string())
                .collect();
            url.push_str(&segments.join("/"));
        }
        for (i, (name, value)) in request.query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(name);
            url.push('=');
            url.push_str(&utf8_percent_encode(value, UNRESERVED).to_string());
        }
        url
    }

    /// Signs and sends `request`; any status is an answer (see
    /// [`Response::success`]).
    pub fn send(&self, request: &Request<'_>) -> Result<Response, S3Error> {
        self.send_watched(request, &|_| Ok(()))
    }

    /// [`S3::send`], telling `watch` the bytes of the body sent so far; an
    /// error of `watch` (say, the transfer was cancelled) abandons the
    /// request. A request with a body asks for `100 Continue` first, so that
    /// a server that refuses it before reading the body (wrong keys, a bad
    /// key) is heard instead of a broken pipe.
    pub fn send_watched(
        &self,
        request: &Request<'_>,
        watch: Watch<'_>,
    ) -> Result<Response, S3Error> {
        let what = request.what();
        let url = self.url(request);
        let signed = if self.options.unsigned {
            Vec::new()
        } else {
            self.sign(request, &url).map_err(|why| S3Error::Response {
                what: what.clone(),
                why: format!("cannot sign: {why}"),
            })?
        };
        let mut builder = http::Request::builder().method(request.method).uri(&url);
        for (name, value) in request.headers.iter().map(|(k, v)| (*k, v.as_str())) {
            builder = builder.header(name, value);
        }
        for (name, value) in &signed {
            builder = builder.header(*name, value.as_str());
        }
        let failed = |e: http::Error| S3Error::Response {
            what: what.clone(),
            why: e.to_string(),
        };
        let sent = if request.body.is_empty() {
            self.agent.run(builder.body(request.body).map_err(failed)?)
        } else {
            // Not signed: a proxy may answer the expectation itself.
            let builder = builder
                .header("content-length", request.body.len())
                .header("expect", "100-continue");
            let mut body = WatchedBody {
                bytes: request.body,
                at: 0,
                watch,
            };
            self.agent.run(
                builder
                    .body(ureq::SendBody::from_reader(&mut body))
                    .map_err(failed)?,
            )
        };
        let inner = sent.map_err(|e| {
            let (error, retry) = transport_error(&self.config.endpoint, &e);
            S3Error::Transport {
                what: what.clone(),
                error,
                retry,
            }
        })?;
        Ok(Response { what, inner })
    }

    /// The SigV4 headers of `request` at `url`, now.
    fn sign(
        &self,
        request: &Request<'_>,
        url: &str,
    ) -> Result<Vec<(&'static str, String)>, String> {
        let c = &self.config.credentials;
        let identity = aws_credential_types::Credentials::new(
            &c.access_key_id,
            &c.secret_access_key,
            c.session_token.clone(),
            None,
            "hipobj",
        )
        .into();
        let mut settings = SigningSettings::default();
        // S3's rules: paths are encoded once and never normalized, and the
        // payload's hash travels in x-amz-content-sha256.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.config.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let body = if request.sign_body {
            SignableBody::Bytes(request.body)
        } else {
            SignableBody::UnsignedPayload
        };
        let headers = request.headers.iter().map(|(k, v)| (*k, v.as_str()));
        let signable =
            SignableRequest::new(request.method, url, headers, body).map_err(|e| e.to_string())?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| e.to_string())?
            .into_parts();
        let (headers, _query) = instructions.into_parts();
        Ok(headers
            .into_iter()
            .map(|h| (h.name(), h.value().to_owned()))
            .collect())
    }

    // ------------------------------------------------------------ plain S3

    /// `HEAD bucket/key`: the object's size.
    pub fn head_object(&self, bucket: &str, key: &str) -> Result<u64, S3Error> {
        self.head(bucket, key).map(|head| head.len)
    }

    /// `HEAD bucket/key`: the object's size and ETag. A HEAD's failure has
    /// no body to say why, so a HEAD refused with a 4xx is asked again as a
    /// GET of its first byte, whose answer carries S3's error code and
    /// message. A 5xx is not: the server (a gateway whose store is down or
    /// hung, say) would likely make the GET wait as long and fail the same
    /// way, doubling what every retry of the HEAD costs.
    pub fn head(&self, bucket: &str, key: &str) -> Result<Head, S3Error> {
        let request = Request::new("HEAD", bucket, Some(key));
        let response = self.send(&request)?;
        if !response.is_success() {
            let status = response.status();
            if status >= 500 {
                return Err(S3Error::Status {
                    what: request.what(),
                    status,
                    code: None,
                    message: None,
                });
            }
            let mut probe = Request::new("GET", bucket, Some(key));
            probe.headers.push(("range", "bytes=0-0".to_owned()));
            let (code, message) = match self.send(&probe).map(Response::success) {
                Ok(Err(S3Error::Status { code, message, .. })) => (code, message),
                _ => (None, None),
            };
            return Err(S3Error::Status {
                what: request.what(),
                status,
                code,
                message,
            });
        }
        let len = response.content_length().ok_or_else(|| S3Error::Response {
            what: request.what(),
            why: "no Content-Length".to_owned(),
        })?;
        Ok(Head {
            len,
            etag: response.header("etag").map(str::to_owned),
        })
    }

    /// `ListObjectsV2` of every object whose key starts with `prefix`, in
    /// the order S3 lists them (by key), following continuation tokens.
    /// Fails rather than returning part of a listing.
    pub fn list_objects(&self, bucket: &str, prefix: &str) -> Result<Vec<Listed>, S3Error> {
        self.list_objects_delimited(bucket, prefix, None)
    }

    /// [`S3::list_objects`] with a `delimiter`: the objects whose key has
    /// no delimiter after `prefix` (one level of a hierarchy); the common
    /// prefixes are left out.
    pub fn list_objects_delimited(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
    ) -> Result<Vec<Listed>, S3Error> {
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut request = Request::new("GET", bucket, None);
            request.query.push(("list-type", "2".to_owned()));
            request.query.push(("prefix", prefix.to_owned()));
            if let Some(delimiter) = delimiter {
                request.query.push(("delimiter", delimiter.to_owned()));
            }
            if let Some(token) = &token {
                request.query.push(("continuation-token", token.clone()));
            }
            let text = self.send(&request)?.success()?.text(64 << 20)?;
            let bad = |why: String| S3Error::Response {
                what: request.what(),
                why,
            };
            for entry in xml_blocks(&text, "Contents") {
                let key =
                    xml_value(entry, "Key").ok_or_else(|| bad("an entry without a Key".into()))?;
                let size = xml_value(entry, "Size")
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .ok_or_else(|| bad(format!("{key:?} has no Size")))?;
                objects.push(Listed {
                    key,
                    size,
                    etag: xml_value(entry, "ETag"),
                });
            }
            let truncated = xml_value(&text, "IsTruncated").is_some_and(|t| t.trim() == "true");
            if !truncated {
                return Ok(objects);
            }
            match xml_value(&text, "NextContinuationToken") {
                Some(next) if Some(&next) != token.as_ref() => token = Some(next),
                _ => {
                    return Err(bad(
                        "a truncated listing without a new continuation token".into()
                    ))
                }
            }
        }
    }

    /// `PUT bucket`: creates a bucket.
    pub fn create_bucket(&self, bucket: &str) -> Result<(), S3Error> {
        self.send(&Request::new("PUT", bucket, None))?.success()?;
        Ok(())
    }

    /// `CreateMultipartUpload`: the upload id. With `full_object_crc64nvme`
    /// the upload declares CRC-64/NVME of the whole object
    /// (`x-amz-checksum-algorithm: CRC64NVME`, `x-amz-checksum-type:
    /// FULL_OBJECT`): then every part carries its CRC and completing it
    /// the whole object's ([`S3::complete_multipart_upload`]).
    pub fn create_multipart_upload(
        &self,
        bucket: &str,
        key: &str,
        full_object_crc64nvme: bool,
    ) -> Result<String, S3Error> {
        let mut request = Request::new("POST", bucket, Some(key));
        request.query.push(("uploads", String::new()));
        if full_object_crc64nvme {
            request
                .headers
                .push((checksum::ALGORITHM, "CRC64NVME".to_owned()));
            request
                .headers
                .push((checksum::TYPE, "FULL_OBJECT".to_owned()));
        }
        let text = self.send(&request)?.success()?.text(64 << 10)?;
        xml_value(&text, "UploadId").ok_or_else(|| S3Error::Response {
            what: request.what(),
            why: "no UploadId in the answer".to_owned(),
        })
    }

    /// `CompleteMultipartUpload` of `parts`, in order; with `whole`, the
    /// whole object's checksum (S3 checks it against the parts' and
    /// answers 400 BadDigest when it is not theirs).
    pub fn complete_multipart_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[CompletedPart],
        whole: Option<Checksum>,
    ) -> Result<(), S3Error> {
        let mut xml = String::from("<CompleteMultipartUpload>");
        for part in parts {
            let etag = part.etag.replace('&', "&amp;").replace('<', "&lt;");
            xml.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber><ETag>{etag}</ETag>",
                part.number
            ));
            if let Some(Checksum::Crc64Nvme(crc)) = part.checksum {
                xml.push_str(&format!(
                    "<ChecksumCRC64NVME>{}</ChecksumCRC64NVME>",
                    Checksum::Crc64Nvme(crc).encode()
                ));
            }
            xml.push_str("</Part>");
        }
        xml.push_str("</CompleteMultipartUpload>");
        let mut request = Request::new("POST", bucket, Some(key));
        request.query.push(("uploadId", upload_id.to_owned()));
        if let Some(whole) = whole {
            request.headers.push((whole.header(), whole.encode()));
            request
                .headers
                .push((checksum::TYPE, "FULL_OBJECT".to_owned()));
        }
        request.body = xml.as_bytes();
        let mut response = self.send(&request)?.success()?;
        // S3 may answer 200 with an error in the body.
        let text = response.text(64 << 10)?;
        if let Some(code) = xml_value(&text, "Code") {
            return Err(S3Error::Status {
                what: request.what(),
                status: 200,
                code: Some(code),
                message: xml_value(&text, "Message"),
            });
        }
        Ok(())
    }

    /// `AbortMultipartUpload`.
    pub fn abort_multipart_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<(), S3Error> {
        let mut request = Request::new("DELETE", bucket, Some(key));
        request.query.push(("uploadId", upload_id.to_owned()));
        self.send(&request)?.success()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(endpoint: &str) -> Result<S3, S3Error> {
        S3::new(S3Config {
            endpoint: endpoint.to_owned(),
            region: "us-east-1".to_owned(),
            credentials: Credentials {
                access_key_id: "AKIDEXAMPLE".to_owned(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_owned(),
                session_token: None,
            },
            credentials_source: "given".to_owned(),
        })
    }

    #[test]
    fn keys_are_encoded_per_segment_and_queries_per_value() {
        let s3 = s3("http://127.0.0.1:9000").unwrap();
        let mut r = Request::new("PUT", "bucket", Some("a dir/ünï+code?.bin"));
        r.query.push(("partNumber", "3".to_owned()));
        r.query.push(("uploadId", "x/y=z".to_owned()));
        assert_eq!(
            s3.url(&r),
            "http://127.0.0.1:9000/bucket/a%20dir/%C3%BCn%C3%AF%2Bcode%3F.bin?partNumber=3&uploadId=x%2Fy%3Dz"
        );
    }

    #[test]
    fn requests_are_signed_with_the_payload_hash_and_the_token_header() {
        let s3 = s3("http://127.0.0.1:9000").unwrap();
        let mut r = Request::new("GET", "b", Some("k"));
        r.headers.push(("x-amz-rdma-token", "ab".repeat(44)));
        let url = s3.url(&r);
        let signed = s3.sign(&r, &url).unwrap();
        let get = |name: &str| {
            signed
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{name} in {signed:?}"))
        };
        let auth = get("authorization");
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
            "{auth}"
        );
        assert!(auth.contains("/us-east-1/s3/aws4_request"), "{auth}");
        assert!(
            auth.contains("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-rdma-token"),
            "{auth}"
        );
        assert_eq!(
            get("x-amz-content-sha256"),
            // SHA-256 of no bytes.
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        r.sign_body = false;
        let signed = s3.sign(&r, &url).unwrap();
        assert!(signed
            .iter()
            .any(|(k, v)| *k == "x-amz-content-sha256" && v == "UNSIGNED-PAYLOAD"));
    }

    #[test]
    fn virtual_hosted_addresses_put_the_bucket_in_the_host() {
        let config = s3("http://127.0.0.1:9000").unwrap().config.clone();
        let options = RequestOptions {
            virtual_hosted: true,
            ..RequestOptions::default()
        };
        let s3 = S3::with_options(config, options).unwrap();
        let r = Request::new("GET", "bkt", Some("dir/a b"));
        assert_eq!(s3.url(&r), "http://bkt.127.0.0.1:9000/dir/a%20b");
        let mut r = Request::new("GET", "bkt", None);
        r.query.push(("list-type", "2".to_owned()));
        assert_eq!(s3.url(&r), "http://bkt.127.0.0.1:9000/?list-type=2");
    }

    #[test]
    fn an_endpoint_must_be_a_bare_url() {
        for bad in ["http://", "http://host/path", "not a url"] {
            assert!(s3(bad).is_err(), "{bad}");
        }
        assert!(s3("https://s3.example.com:8443").is_ok());
    }

    #[test]
    fn xml_values_are_found_and_unescaped() {
        let xml = "<Error><Code>NoSuchKey</Code><Message>a &lt;b&gt; &amp; c</Message></Error>";
        assert_eq!(xml_value(xml, "Code").as_deref(), Some("NoSuchKey"));
        assert_eq!(xml_value(xml, "Message").as_deref(), Some("a <b> & c"));
        assert_eq!(xml_value(xml, "UploadId"), None);
    }
}
