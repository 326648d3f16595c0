//! The CRC64/NVME in the form S3's headers carry it, for every part of the
//! gateway that computes one (the cache, its disk tier, RDMA GETs of kept
//! bytes, the upstream's multipart uploads); and the checksum an object was
//! stored with (`Stored`), which the S3 handlers and the cache both check
//! bytes against.

use base64::Engine as _;
use s3s::dto::{Checksum, ChecksumType, GetObjectOutput};

/// The CRC64/NVME of `bytes`.
pub fn crc64nvme(bytes: &[u8]) -> u64 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, bytes)
}

/// `crc` as `x-amz-checksum-crc64nvme` carries it: the base64 of its eight
/// bytes, big-endian.
pub fn crc64nvme_header(crc: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}

/// A whole object's checksum as the backend stored it: one algorithm
/// (the first the answer carries of S3's five), and its value (base64).
pub(super) struct Stored {
    pub(super) header: &'static str,
    pub(super) value: String,
}

impl Stored {
    /// The checksum of a GET's answer that describes the object's bytes, if
    /// `whole` (the transfer moves all of the object) and it is a full
    /// object's (a composite checksum of a multipart upload's parts,
    /// `COMPOSITE` or `VALUE-N`, describes no bytes).
    pub(super) fn of(o: &GetObjectOutput, whole: bool) -> Option<Stored> {
        let composite = o
            .checksum_type
            .as_ref()
            .is_some_and(|t| t.as_str() == ChecksumType::COMPOSITE);
        if !whole || composite {
            return None;
        }
        let values = [
            ("x-amz-checksum-crc64nvme", &o.checksum_crc64nvme),
            ("x-amz-checksum-crc32c", &o.checksum_crc32c),
            ("x-amz-checksum-crc32", &o.checksum_crc32),
            ("x-amz-checksum-sha256", &o.checksum_sha256),
            ("x-amz-checksum-sha1", &o.checksum_sha1),
        ];
        values.into_iter().find_map(|(header, value)| {
            let value = value.as_ref()?;
            (!value.contains('-')).then(|| Stored {
                header,
                value: value.clone(),
            })
        })
    }

    /// A hasher for this algorithm (and CRC64/NVME if `crc`).
    pub(super) fn hasher(stored: Option<&Stored>, crc: bool) -> s3s::checksum::ChecksumHasher {
        let is = |h: &str| stored.is_some_and(|s| s.header == h);
        s3s::checksum::ChecksumHasher {
            crc64nvme: (crc || is("x-amz-checksum-crc64nvme")).then(Default::default),
            crc32c: is("x-amz-checksum-crc32c").then(Default::default),
            crc32: is("x-amz-checksum-crc32").then(Default::default),
            sha256: is("x-amz-checksum-sha256").then(Default::default),
            sha1: is("x-amz-checksum-sha1").then(Default::default),
        }
    }

    /// This algorithm's value in `sums`.
    pub(super) fn read<'a>(&self, sums: &'a Checksum) -> Option<&'a String> {
        match self.header {
            "x-amz-checksum-crc64nvme" => sums.checksum_crc64nvme.as_ref(),
            "x-amz-checksum-crc32c" => sums.checksum_crc32c.as_ref(),
            "x-amz-checksum-crc32" => sums.checksum_crc32.as_ref(),
            "x-amz-checksum-sha256" => sums.checksum_sha256.as_ref(),
            _ => sums.checksum_sha1.as_ref(),
        }
    }
}
