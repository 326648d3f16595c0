//! The checksums of S3's own headers, over the bytes a transfer moves
//! (`docs/protocol.md`, *Checksums*).
//!
//! A value travels as S3 writes it: base64 of the CRC's big-endian bytes
//! (8 for CRC-64/NVME, 4 for CRC-32C and CRC-32). The CRCs are crc-fast's
//! (carry-less multiplication where the processor has it).
//!
//! - A PUT or UploadPart carries [`CRC64NVME`] of the bytes it stores; with
//!   a token, of the bytes the server will READ by RDMA (the empty HTTP
//!   body is not what it describes).
//! - A GET that carries a token and [`MODE`] `ENABLED` is answered, by a
//!   server that honours it, with [`RDMA_CRC64NVME`]: the CRC of exactly
//!   the bytes the server WROTE to the start of the client's range.
//! - A plain answer that holds the whole object may carry the object's
//!   stored checksum ([`whole_object`]).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use crc_fast::CrcAlgorithm;

use super::Response;

/// The CRC-64/NVME of the bytes a PUT or part stores (or of a whole
/// object, on CompleteMultipartUpload and in a GET's answer).
pub const CRC64NVME: &str = "x-amz-checksum-crc64nvme";
/// The CRC-32C (Castagnoli, CRC-32/ISCSI) of the same.
pub const CRC32C: &str = "x-amz-checksum-crc32c";
/// The CRC-32 (CRC-32/ISO-HDLC) of the same.
pub const CRC32: &str = "x-amz-checksum-crc32";
/// A GET's request for the checksum: `ENABLED`.
pub const MODE: &str = "x-amz-checksum-mode";
/// The algorithm of a multipart upload's checksums (CreateMultipartUpload).
pub const ALGORITHM: &str = "x-amz-checksum-algorithm";
/// `FULL_OBJECT` (the whole object's CRC) or `COMPOSITE` (a checksum of
/// the parts' checksums, which describes no byte range).
pub const TYPE: &str = "x-amz-checksum-type";
/// The CRC-64/NVME of the bytes a server WROTE to the client by RDMA, in
/// its reply to a GET that asked for it with [`MODE`].
pub const RDMA_CRC64NVME: &str = "x-amz-rdma-checksum-crc64nvme";

/// A checksum as S3's headers carry one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checksum {
    /// CRC-64/NVME.
    Crc64Nvme(u64),
    /// CRC-32C (CRC-32/ISCSI).
    Crc32c(u32),
    /// CRC-32 (CRC-32/ISO-HDLC).
    Crc32(u32),
}

impl Checksum {
    /// The CRC-64/NVME of `bytes`.
    pub fn crc64nvme(bytes: &[u8]) -> Checksum {
        Checksum::Crc64Nvme(crc_fast::crc64_nvme(bytes))
    }

    /// The checksum of `bytes` by the same algorithm as `self`.
    pub fn same_of(&self, bytes: &[u8]) -> Checksum {
        match self {
            Checksum::Crc64Nvme(_) => Checksum::crc64nvme(bytes),
            Checksum::Crc32c(_) => Checksum::Crc32c(crc_fast::crc32_iscsi(bytes)),
            Checksum::Crc32(_) => Checksum::Crc32(crc_fast::crc32_iso_hdlc(bytes)),
        }
    }

    /// The S3 header that carries it.
    pub fn header(&self) -> &'static str {
        match self {
            Checksum::Crc64Nvme(_) => CRC64NVME,
            Checksum::Crc32c(_) => CRC32C,
            Checksum::Crc32(_) => CRC32,
        }
    }

    /// The algorithm's name, for messages.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Checksum::Crc64Nvme(_) => "CRC-64/NVME",
            Checksum::Crc32c(_) => "CRC-32C",
            Checksum::Crc32(_) => "CRC-32",
        }
    }

    /// The header's value: base64 of the big-endian bytes.
    pub fn encode(&self) -> String {
        match self {
            Checksum::Crc64Nvme(v) => STANDARD.encode(v.to_be_bytes()),
            Checksum::Crc32c(v) | Checksum::Crc32(v) => STANDARD.encode(v.to_be_bytes()),
        }
    }

    /// The value of header `name` (one of [`CRC64NVME`], [`RDMA_CRC64NVME`],
    /// [`CRC32C`], [`CRC32`]); `None` for another header or a value that is
    /// not base64 of the algorithm's width (a composite checksum's
    /// `...-N` included).
    pub fn parse(name: &str, value: &str) -> Option<Checksum> {
        let bytes = STANDARD.decode(value.trim()).ok()?;
        if name.eq_ignore_ascii_case(CRC64NVME) || name.eq_ignore_ascii_case(RDMA_CRC64NVME) {
            return Some(Checksum::Crc64Nvme(u64::from_be_bytes(
                bytes.try_into().ok()?,
            )));
        }
        let v = u32::from_be_bytes(bytes.try_into().ok()?);
        if name.eq_ignore_ascii_case(CRC32C) {
            Some(Checksum::Crc32c(v))
        } else if name.eq_ignore_ascii_case(CRC32) {
            Some(Checksum::Crc32(v))
        } else {
            None
        }
    }
}

/// The CRC-64/NVME of `a` followed by `b`, from `a`'s and `b`'s CRCs and
/// `b`'s length: how a multipart upload's whole-object checksum comes from
/// its parts' (S3's `FULL_OBJECT` checksum type).
pub fn crc64nvme_combine(a: u64, b: u64, b_len: u64) -> u64 {
    crc_fast::checksum_combine(CrcAlgorithm::Crc64Nvme, a, b, b_len)
}

/// A checksum that the bytes here do not match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The algorithm.
    pub algorithm: &'static str,
    /// How many bytes were checked.
    pub len: u64,
    /// The checksum of the bytes here, as its header would carry it.
    pub found: String,
    /// The checksum the server sent.
    pub expected: String,
}

/// Whether `bytes` have the checksum `expected`.
pub fn check(expected: Checksum, bytes: &[u8]) -> Result<(), Mismatch> {
    let found = expected.same_of(bytes);
    if found == expected {
        return Ok(());
    }
    Err(Mismatch {
        algorithm: expected.algorithm(),
        len: bytes.len() as u64,
        found: found.encode(),
        expected: expected.encode(),
    })
}

/// The checksum of the whole object that a plain answer carries, if its
/// body is the whole object: a 200 without `Content-Range`, or a 206 whose
/// `Content-Range` covers every byte. A composite checksum (of the parts'
/// checksums, `x-amz-checksum-type: COMPOSITE`) describes no byte range and
/// is not one. CRC-64/NVME first, then CRC-32C, then CRC-32.
pub fn whole_object(response: &Response) -> Option<Checksum> {
    if response
        .header(TYPE)
        .is_some_and(|t| !t.trim().eq_ignore_ascii_case("FULL_OBJECT"))
    {
        return None;
    }
    let whole = match response.header("content-range") {
        None => response.status() == 200,
        Some(range) => covers_all(range),
    };
    if !whole {
        return None;
    }
    [CRC64NVME, CRC32C, CRC32]
        .into_iter()
        .find_map(|name| Checksum::parse(name, response.header(name)?))
}

/// Whether `bytes FIRST-LAST/SIZE` covers bytes 0 to SIZE - 1.
fn covers_all(content_range: &str) -> bool {
    let Some(spec) = content_range.trim().strip_prefix("bytes ") else {
        return false;
    };
    let Some((span, size)) = spec.split_once('/') else {
        return false;
    };
    let Some((first, last)) = span.split_once('-') else {
        return false;
    };
    match (
        first.trim().parse::<u64>(),
        last.trim().parse::<u64>(),
        size.trim().parse::<u64>(),
    ) {
        (Ok(0), Ok(last), Ok(size)) => last.checked_add(1) == Some(size),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_base64_of_the_big_endian_crc_as_s3_writes_them() {
        // The check values of the CRC catalogue ("123456789").
        let digits = b"123456789";
        assert_eq!(
            Checksum::crc64nvme(digits),
            Checksum::Crc64Nvme(0xae8b_1486_0a79_9888)
        );
        assert_eq!(
            Checksum::Crc32c(0).same_of(digits),
            Checksum::Crc32c(0xe306_9283)
        );
        assert_eq!(
            Checksum::Crc32(0).same_of(digits),
            Checksum::Crc32(0xcbf4_3926)
        );
        assert_eq!(
            Checksum::Crc64Nvme(0xae8b_1486_0a79_9888).encode(),
            "rosUhgp5mIg="
        );
        // No bytes: 0, the value S3 gives an empty object.
        assert_eq!(Checksum::crc64nvme(b"").encode(), "AAAAAAAAAAA=");
        for c in [
            Checksum::crc64nvme(digits),
            Checksum::Crc32c(0xe306_9283),
            Checksum::Crc32(0xcbf4_3926),
        ] {
            assert_eq!(Checksum::parse(c.header(), &c.encode()), Some(c));
        }
        assert_eq!(
            Checksum::parse(RDMA_CRC64NVME, "rosUhgp5mIg="),
            Some(Checksum::crc64nvme(digits))
        );
    }

    #[test]
    fn a_value_of_another_width_or_a_composite_one_is_not_a_checksum() {
        assert_eq!(Checksum::parse(CRC64NVME, "4wOSgw=="), None, "4 bytes");
        assert_eq!(Checksum::parse(CRC32C, "rosUhgp5mIg="), None, "8 bytes");
        assert_eq!(Checksum::parse(CRC32C, "4wOSgw==-3"), None, "composite");
        assert_eq!(Checksum::parse("x-amz-checksum-sha256", "4wOSgw=="), None);
    }

    #[test]
    fn parts_combine_into_the_whole_object_s_crc() {
        let object: Vec<u8> = (0..3_000_001u32).map(|i| (i * 7 % 251) as u8).collect();
        let (a, b) = object.split_at(1_048_576);
        let (b, c) = b.split_at(1_048_576);
        let crc = |x: &[u8]| crc_fast::crc64_nvme(x);
        let ab = crc64nvme_combine(crc(a), crc(b), b.len() as u64);
        let abc = crc64nvme_combine(ab, crc(c), c.len() as u64);
        assert_eq!(abc, crc(&object));
    }

    #[test]
    fn a_mismatch_says_both_values() {
        let sent = Checksum::crc64nvme(b"what the server wrote");
        assert_eq!(check(sent, b"what the server wrote"), Ok(()));
        let e = check(sent, b"what arrived instead!").unwrap_err();
        assert_eq!(e.expected, sent.encode());
        assert_eq!(
            e.found,
            Checksum::crc64nvme(b"what arrived instead!").encode()
        );
        assert_eq!((e.algorithm, e.len), ("CRC-64/NVME", 21));
    }

    #[test]
    fn only_a_range_of_every_byte_is_the_whole_object() {
        assert!(covers_all("bytes 0-99/100"));
        assert!(!covers_all("bytes 0-98/100"));
        assert!(!covers_all("bytes 1-99/100"));
        assert!(!covers_all("bytes 0-99/*"));
        assert!(!covers_all("items 0-99/100"));
    }
}
