//! Where a gateway's objects live.
//!
//! A backend is an S3 implementation (s3s's [`S3`] trait: every operation
//! it serves; the others answer `NotImplemented`) plus what the RDMA paths
//! may know of it. The gateway ([`crate::gateway::s3::RdmaS3`]) puts the
//! RDMA paths of GetObject, PutObject and UploadPart in front of it and
//! hands every other operation to it unchanged, after the region check.

use std::path::PathBuf;

use s3s::S3;

/// A gateway's backend.
pub trait Backend: S3 {
    /// What it is, for the line the server prints once it listens and
    /// for logs: `directory /srv/objects`, `upstream https://...`.
    fn describe(&self) -> String;

    /// The file that holds `bucket/key`'s bytes whole, for a backend that
    /// keeps objects as plain files of this machine: an RDMA GET reads it
    /// in one call rather than through the backend's stream. `None` (the
    /// default): the stream.
    fn object_file(&self, _bucket: &str, _key: &str) -> Option<PathBuf> {
        None
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
