//! The CRC64/NVME in the form S3's headers carry it, for every part of the
//! gateway that computes one (the cache, its disk tier, RDMA GETs of kept
//! bytes, the upstream's multipart uploads).

use base64::Engine as _;

/// The CRC64/NVME of `bytes`.
pub fn crc64nvme(bytes: &[u8]) -> u64 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, bytes)
}

/// `crc` as `x-amz-checksum-crc64nvme` carries it: the base64 of its eight
/// bytes, big-endian.
pub fn crc64nvme_header(crc: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}
