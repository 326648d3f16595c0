//! Where a gateway's objects live.
//!
//! A backend is an S3 implementation (s3s's [`S3`] trait: every operation
//! it serves; the others answer `NotImplemented`) plus what the RDMA paths
//! may know of it. The gateway ([`crate::gateway::s3::RdmaS3`]) puts the
//! RDMA paths of GetObject, PutObject and UploadPart in front of it and
//! hands every other operation to it unchanged, after the region check.

use s3s::S3;

/// A gateway's backend. One that keeps objects as files of this machine
/// puts the file a GetObject's answer was read from into the answer's
/// extensions ([`ObjectFile`](super::local::ObjectFile)): an RDMA GET then
/// reads the answer's bytes from it in chunk-sized calls rather than
/// through the answer's stream.
pub trait Backend: S3 {
    /// What it is, for the line the server prints once it listens and
    /// for logs: `directory /srv/objects`, `upstream https://...`.
    fn describe(&self) -> String;
}

/// An S3 request carrying `input` alone, for a backend that reads nothing
/// else (the upstream's proxy).
pub fn alone<T>(input: T) -> s3s::S3Request<T> {
    s3s::S3Request {
        input,
        method: http::Method::PUT,
        uri: http::Uri::from_static("/"),
        headers: http::HeaderMap::new(),
        extensions: http::Extensions::new(),
        credentials: None,
        region: None,
        service: None,
        trailing_headers: None,
    }
}

/// A request for another operation (`input`) in the context of `req`:
/// its method, URI, headers, credentials and region, without its
/// extensions or trailers. For a wrapper that asks its backend something
/// on the way (a HEAD before a suffix range, the parts before a
/// completion).
pub fn sibling<T, U>(req: &s3s::S3Request<T>, input: U) -> s3s::S3Request<U> {
    s3s::S3Request {
        input,
        method: req.method.clone(),
        uri: req.uri.clone(),
        headers: req.headers.clone(),
        extensions: http::Extensions::new(),
        credentials: req.credentials.clone(),
        region: req.region.clone(),
        service: req.service.clone(),
        trailing_headers: None,
    }
}

/// Implements [`S3`] for `$ty` by handing each listed operation to the
/// `S3` value its field `$inner` holds, and each operation of the optional
/// `own` list to `$ty`'s own method named after `=` (same request and
/// answer); `$ty` may put `before` (a method `fn before<T>(&self,
/// &S3Request<T>) -> S3Result<()>`, which may bound `T`) in front of each.
macro_rules! delegate_s3 {
    ($ty:ty, $inner:ident, [$($op:ident: $input:ident => $output:ident;)*]
     $(, own [$($own:ident: $own_input:ident => $own_output:ident = $method:ident;)*])?) => {
        #[async_trait::async_trait]
        impl s3s::S3 for $ty {
            $(
                async fn $op(
                    &self,
                    req: s3s::S3Request<s3s::dto::$input>,
                ) -> s3s::S3Result<s3s::S3Response<s3s::dto::$output>> {
                    self.before(&req).await?;
                    self.$inner.$op(req).await
                }
            )*
            $($(
                async fn $own(
                    &self,
                    req: s3s::S3Request<s3s::dto::$own_input>,
                ) -> s3s::S3Result<s3s::S3Response<s3s::dto::$own_output>> {
                    self.before(&req).await?;
                    self.$method(req).await
                }
            )*)?
        }
    };
}
pub(crate) use delegate_s3;
