//! The wire formats of the connection protocol that `docs/protocol.md`
//! describes, version 2: what a server puts in its RDMA CM connect request,
//! the in-band proof it SENDs on an established connection, the client's
//! one rejection, and the immediate values of the client's grant and the
//! server's final message.
//!
//! Every message starts with the same 8-byte header: magic `HOBJ`, the
//! version, the message's kind, two zero bytes. Everything is
//! little-endian and laid out field by field; the immediate values are
//! numbers here, and travel in network byte order as verbs carries them
//! (`imm_data = htonl(value)`). Private data arrives padded by the CM, so
//! decoders read their fixed length from the front and ignore the rest.

use super::token::{Token, Transport, TOKEN_BYTES};

/// "HOBJ" as a little-endian `u32`: the first field of every message here.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HOBJ");
/// Version of this protocol: 2 since tokens carry a secret and every
/// transfer is proven (version 1 sent the token with a server nonce).
pub const VERSION: u8 = 2;
/// Bytes of the header every message starts with.
pub const HEADER_LEN: usize = 8;

/// What a message is (byte 5 of the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A connect request's private data: the token, on a fresh connection.
    Connect = 1,
    /// A SEND on an established connection: the token, before the client
    /// grants the transfer any access.
    Proof = 2,
    /// A rejection's private data.
    Refused = 3,
}

/// Bytes of a connect request's private data: the header, the token (44),
/// 4 reserved bytes, which must be zero (a request with anything else
/// there is refused). This fills the 56 bytes a REQ can carry.
pub const CONNECT_DATA_LEN: usize = HEADER_LEN + TOKEN_BYTES + 4;
/// Bytes of an in-band proof: the header and the token.
pub const PROOF_LEN: usize = HEADER_LEN + TOKEN_BYTES;
/// Bytes of a rejection's private data: the header alone.
pub const REJECT_DATA_LEN: usize = HEADER_LEN;

/// Why a message was not accepted: for the log of the side that read it,
/// never sent to the peer (a rejection says only "refused").
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Shorter than the message, or another magic: not this protocol.
    #[error("not a hipobj message")]
    NotHipobj,
    /// A version this side does not speak.
    #[error("protocol version {0}, this side speaks {VERSION}")]
    Version(u8),
    /// Another kind of message than expected.
    #[error("a message of kind {0} where another was expected")]
    Kind(u8),
    /// The token does not decode, or is not a `0x02` token.
    #[error("the token is not a valid 0x02 token")]
    BadToken,
    /// A byte this version sends as zero (the header's last two, a
    /// connect request's reserved four) is not: not a message this side
    /// wrote, or a later version's under this version's number.
    #[error("a byte that is zero in version {VERSION} is not")]
    NotZero,
}

fn header(kind: Kind) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4] = VERSION;
    out[5] = kind as u8;
    out
}

/// Checks the header of `data` (at least `len` bytes) for `kind`.
fn check_header(data: &[u8], len: usize, kind: Kind) -> Result<&[u8], Malformed> {
    let data = data.get(..len).ok_or(Malformed::NotHipobj)?;
    if data[0..4] != MAGIC.to_le_bytes() {
        return Err(Malformed::NotHipobj);
    }
    if data[4] != VERSION {
        return Err(Malformed::Version(data[4]));
    }
    if data[5] != kind as u8 {
        return Err(Malformed::Kind(data[5]));
    }
    if data[6..HEADER_LEN] != [0, 0] {
        return Err(Malformed::NotZero);
    }
    Ok(data)
}

/// The `0x02` token at `data[HEADER_LEN..]`.
fn token_at(data: &[u8]) -> Result<Token, Malformed> {
    let mut bytes = [0u8; TOKEN_BYTES];
    bytes.copy_from_slice(&data[HEADER_LEN..HEADER_LEN + TOKEN_BYTES]);
    match Token::from_bytes(&bytes) {
        Ok(token) if token.transport == Transport::RcCm => Ok(token),
        _ => Err(Malformed::BadToken),
    }
}

/// The private data of a connect request: the token the server was sent,
/// which proves it saw this transfer's request.
pub fn encode_connect(token: &Token) -> [u8; CONNECT_DATA_LEN] {
    let mut out = [0u8; CONNECT_DATA_LEN];
    out[..HEADER_LEN].copy_from_slice(&header(Kind::Connect));
    out[HEADER_LEN..HEADER_LEN + TOKEN_BYTES].copy_from_slice(&token.to_bytes());
    out
}

/// Reads a connect request's (padded) private data.
pub fn decode_connect(data: &[u8]) -> Result<Token, Malformed> {
    let data = check_header(data, CONNECT_DATA_LEN, Kind::Connect)?;
    if data[HEADER_LEN + TOKEN_BYTES..] != [0; CONNECT_DATA_LEN - HEADER_LEN - TOKEN_BYTES] {
        return Err(Malformed::NotZero);
    }
    token_at(data)
}

/// The payload of an in-band proof.
pub fn encode_proof(token: &Token) -> [u8; PROOF_LEN] {
    let mut out = [0u8; PROOF_LEN];
    out[..HEADER_LEN].copy_from_slice(&header(Kind::Proof));
    out[HEADER_LEN..].copy_from_slice(&token.to_bytes());
    out
}

/// Reads an in-band proof: exactly [`PROOF_LEN`] bytes were received.
pub fn decode_proof(data: &[u8]) -> Result<Token, Malformed> {
    if data.len() != PROOF_LEN {
        return Err(Malformed::NotHipobj);
    }
    token_at(check_header(data, PROOF_LEN, Kind::Proof)?)
}

/// The private data of every rejection: one answer for whatever was wrong,
/// so that a peer that has not proved anything learns nothing (which QP
/// numbers exist, which transfers wait).
pub fn encode_reject() -> [u8; REJECT_DATA_LEN] {
    header(Kind::Refused)
}

/// Whether a rejection's (padded) private data is ours.
pub fn is_refusal(data: &[u8]) -> bool {
    check_header(data, REJECT_DATA_LEN, Kind::Refused).is_ok()
}

/// Domain of [`grant_imm`].
const GRANT_DOMAIN: u32 = u32::from_le_bytes(*b"GRNT");
/// Domain of [`final_imm`].
const FINAL_DOMAIN: u32 = u32::from_le_bytes(*b"DONE");

/// One SplitMix64 step over `domain << 32 | secret` (its increment, then
/// its finalizer), folded to 32 bits: the upper half XORed into the lower.
fn derive(domain: u32, secret: u32) -> u32 {
    let mut z = (u64::from(domain) << 32 | u64::from(secret)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let folded = (z ^ (z >> 32)).to_le_bytes();
    u32::from_le_bytes([folded[0], folded[1], folded[2], folded[3]])
}

/// The immediate value of the client's grant (a zero-length SEND with
/// immediate answering an in-band proof): tells the server that this
/// transfer's access is in place.
pub fn grant_imm(secret: u32) -> u32 {
    derive(GRANT_DOMAIN, secret)
}

/// The immediate value of the server's final message (a zero-length SEND
/// with immediate): ties the completion that ends the transfer to its
/// token's secret, which only a holder of the token knows.
pub fn final_imm(secret: u32) -> u32 {
    derive(FINAL_DOMAIN, secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn token() -> Token {
        Token {
            transport: Transport::RcCm,
            qp_num: 17,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
            rkey: 0x251,
            addr: 0x7ff4_f318_e000,
            length: 4096,
            port: 0,
            lid: 56826,
            secret: 0x1234_5678,
        }
    }

    #[test]
    fn connect_data_fills_a_req_and_survives_padding() {
        assert_eq!(CONNECT_DATA_LEN, 56);
        let mut padded = encode_connect(&token()).to_vec();
        assert_eq!(&padded[0..8], b"HOBJ\x02\x01\0\0");
        padded.resize(56, 0);
        assert_eq!(decode_connect(&padded), Ok(token()));
    }

    #[test]
    fn connect_data_rejects_what_is_not_ours() {
        let good = encode_connect(&token());
        assert_eq!(decode_connect(&good[..55]), Err(Malformed::NotHipobj));
        let mut bad = good;
        bad[0] = b'X';
        assert_eq!(decode_connect(&bad), Err(Malformed::NotHipobj));
        let mut bad = good;
        bad[4] = 1;
        assert_eq!(decode_connect(&bad), Err(Malformed::Version(1)));
        let mut bad = good;
        bad[5] = Kind::Proof as u8;
        assert_eq!(decode_connect(&bad), Err(Malformed::Kind(2)));
        let mut bad = good;
        bad[8] = 0x01; // an RC token is no proof for this protocol
        assert_eq!(decode_connect(&bad), Err(Malformed::BadToken));
        let mut bad = good;
        bad[8] = 0x7f;
        assert_eq!(decode_connect(&bad), Err(Malformed::BadToken));
    }

    /// Found by the connect_data and proof fuzz targets: decoders took any
    /// value in the bytes docs/protocol.md gives as zero.
    #[test]
    fn the_bytes_that_are_zero_must_be_zero() {
        for at in [6, 7, 52, 53, 54, 55] {
            let mut bad = encode_connect(&token());
            bad[at] = 0x5b;
            assert_eq!(decode_connect(&bad), Err(Malformed::NotZero), "byte {at}");
        }
        for at in [6, 7] {
            let mut bad = encode_proof(&token());
            bad[at] = 0x34;
            assert_eq!(decode_proof(&bad), Err(Malformed::NotZero), "byte {at}");
            let mut bad = encode_reject();
            bad[at] = 1;
            assert!(!is_refusal(&bad), "byte {at}");
        }
    }

    #[test]
    fn a_proof_is_exactly_its_length_and_of_its_kind() {
        let proof = encode_proof(&token());
        assert_eq!(proof.len(), 52);
        assert_eq!(decode_proof(&proof), Ok(token()));
        assert_eq!(decode_proof(&proof[..51]), Err(Malformed::NotHipobj));
        let mut long = proof.to_vec();
        long.push(0);
        assert_eq!(decode_proof(&long), Err(Malformed::NotHipobj));
        let connect = encode_connect(&token());
        assert_eq!(
            decode_proof(&connect[..PROOF_LEN]),
            Err(Malformed::Kind(Kind::Connect as u8))
        );
    }

    #[test]
    fn every_rejection_is_the_same_refusal() {
        let mut padded = encode_reject().to_vec();
        padded.resize(148, 0);
        assert!(is_refusal(&padded));
        assert!(!is_refusal(&[0; 148]));
        assert!(!is_refusal(&padded[..7]));
    }

    #[test]
    fn grant_and_final_values_differ_per_secret_and_from_each_other() {
        let finals: Vec<u32> = (0..10_000).map(final_imm).collect();
        let mut dedup = finals.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), finals.len());
        for secret in [0, 1, 0xffff_ffff, 0x1234_5678] {
            assert_ne!(grant_imm(secret), final_imm(secret));
            assert_ne!(final_imm(secret), secret, "not the secret itself");
        }
        assert_eq!(final_imm(7), final_imm(7));
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_connect(&data);
            let _ = decode_proof(&data);
            let _ = is_refusal(&data);
        }

        #[test]
        fn any_rc_cm_token_round_trips_through_both_messages(
            qp_num in any::<u32>(), rkey in any::<u32>(), addr in any::<u64>(),
            length in 0..=crate::core::token::RC_CM_MAX_LENGTH, lid in any::<u16>(), secret in any::<u32>(),
            gid in any::<[u8; 16]>(),
        ) {
            let t = Token { transport: Transport::RcCm, qp_num, gid, rkey, addr, length, port: 0, lid, secret };
            prop_assert_eq!(decode_connect(&encode_connect(&t)), Ok(t));
            prop_assert_eq!(decode_proof(&encode_proof(&t)), Ok(t));
        }
    }
}
