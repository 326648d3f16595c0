//! The wire formats of the connection protocol that `docs/protocol.md`
//! describes, versions 2 to 4: what a server puts in its RDMA CM connect
//! request, the in-band proof it SENDs on an established connection, the
//! client's one rejection, the immediate values of the client's grant and
//! the server's final message, (version 3) the client's plan of a striped
//! transfer, and (version 4) the data of a final message that invalidates
//! the client's window.
//!
//! Every message starts with the same 8-byte header: magic `HOBJ`, the
//! version, the message's kind, two bytes that are zero in version 2 and
//! in version 3 the share a proof is for (or the shares a plan has). Everything is
//! little-endian and laid out field by field; the immediate values are
//! numbers here, and travel in network byte order as verbs carries them
//! (`imm_data = htonl(value)`). Private data arrives padded by the CM, so
//! decoders read their fixed length from the front and ignore the rest.

use super::token::{Token, Transport, TOKEN_BYTES};

/// "HOBJ" as a little-endian `u32`: the first field of every message here.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HOBJ");
/// Version 2: tokens carry a secret and every transfer is proven (version
/// 1 sent the token with a server nonce). What every client of this
/// library accepts, and what a server sends to a client that refused
/// version 3.
pub const VERSION: u8 = 2;
/// Version 3: version 2, and a transfer may be striped over several of the
/// client's connections, each proving the token for its own share.
pub const VERSION_3: u8 = 3;
/// Version 4: version 3, and the final message may be a SEND with
/// invalidate of the transfer's window, carrying [`final_data`].
pub const VERSION_4: u8 = 4;
/// The newest version this side speaks.
pub const NEWEST: u8 = VERSION_4;
/// Bytes of a version-4 final message's data: [`final_imm`], little-endian.
pub const FINAL_DATA_LEN: usize = 4;
/// Shares a striped transfer has at most (connections it moves over).
pub const MAX_STRIPES: usize = 8;
/// Bytes of one share's entry in a plan: name, rkey, length.
pub const SHARE_LEN: usize = 16;
/// Bytes of the largest plan: the header and [`MAX_STRIPES`] entries
/// (it fits a REP's 196 bytes of private data).
pub const STRIPES_MAX_LEN: usize = HEADER_LEN + MAX_STRIPES * SHARE_LEN;
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
    /// Version 3: the client's plan of a striped transfer, in its grant.
    Stripes = 4,
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
    #[error("protocol version {0}, this side speaks {VERSION} to {NEWEST}")]
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
    /// Version 3: a share index or a plan that cannot be (a share 0 for
    /// another connection than the token's, shares that do not tile the
    /// token's range, too many, twice the same connection).
    #[error("a striped transfer's share or plan is not valid: {0}")]
    Stripes(&'static str),
}

fn header(kind: Kind) -> [u8; HEADER_LEN] {
    header_v(VERSION, kind, 0)
}

fn header_v(version: u8, kind: Kind, extra: u16) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4] = version;
    out[5] = kind as u8;
    out[6..8].copy_from_slice(&extra.to_le_bytes());
    out
}

/// Checks the header of `data` (at least `len` bytes) for `kind`, version
/// 2 only (what a version-2 peer checks).
fn check_header(data: &[u8], len: usize, kind: Kind) -> Result<&[u8], Malformed> {
    let (data, version, extra) = check_header_v(data, len, kind)?;
    if version != VERSION {
        return Err(Malformed::Version(version));
    }
    if extra != 0 {
        return Err(Malformed::NotZero);
    }
    Ok(data)
}

/// Checks the header of `data` (at least `len` bytes) for `kind` in any
/// version this side speaks: the data, the version, and the header's last
/// two bytes (zero in version 2).
fn check_header_v(data: &[u8], len: usize, kind: Kind) -> Result<(&[u8], u8, u16), Malformed> {
    let data = data.get(..len).ok_or(Malformed::NotHipobj)?;
    if data[0..4] != MAGIC.to_le_bytes() {
        return Err(Malformed::NotHipobj);
    }
    let version = data[4];
    if !(VERSION..=NEWEST).contains(&version) {
        return Err(Malformed::Version(version));
    }
    if data[5] != kind as u8 {
        return Err(Malformed::Kind(data[5]));
    }
    let extra = u16::from_le_bytes([data[6], data[7]]);
    if version == VERSION && extra != 0 {
        return Err(Malformed::NotZero);
    }
    Ok((data, version, extra))
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

/// A token presented by a server (CONNECT or PROOF), in either version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Presented {
    /// The token.
    pub token: Token,
    /// The version the server wrote: 3 says it stripes.
    pub version: u8,
    /// The share the proof is for: 0 for the transfer's own connection
    /// (always, in version 2).
    pub share: u16,
    /// The name of the client connection the proof is for: the token's
    /// own for share 0; another connection of the plan for a later share.
    pub name: u32,
}

/// Version 3's connect request for `share` of the transfer of `token`, on
/// the client connection named `name` (the token's own for share 0): the
/// header carries the share, the reserved bytes the name.
pub fn encode_connect_v3(token: &Token, share: u16, name: u32) -> [u8; CONNECT_DATA_LEN] {
    encode_connect_v(VERSION_3, token, share, name)
}

/// [`encode_connect_v3`] in `version` (3 or later).
pub fn encode_connect_v(
    version: u8,
    token: &Token,
    share: u16,
    name: u32,
) -> [u8; CONNECT_DATA_LEN] {
    let mut out = [0u8; CONNECT_DATA_LEN];
    out[..HEADER_LEN].copy_from_slice(&header_v(version, Kind::Connect, share));
    out[HEADER_LEN..HEADER_LEN + TOKEN_BYTES].copy_from_slice(&token.to_bytes());
    out[HEADER_LEN + TOKEN_BYTES..].copy_from_slice(&name.to_le_bytes());
    out
}

/// Version 3's in-band proof for `share` of the transfer of `token`.
pub fn encode_proof_v3(token: &Token, share: u16) -> [u8; PROOF_LEN] {
    encode_proof_v(VERSION_3, token, share)
}

/// [`encode_proof_v3`] in `version` (3 or later).
pub fn encode_proof_v(version: u8, token: &Token, share: u16) -> [u8; PROOF_LEN] {
    let mut out = [0u8; PROOF_LEN];
    out[..HEADER_LEN].copy_from_slice(&header_v(version, Kind::Proof, share));
    out[HEADER_LEN..].copy_from_slice(&token.to_bytes());
    out
}

/// Checks a share index against the name it is for.
fn presented(token: Token, version: u8, share: u16, name: u32) -> Result<Presented, Malformed> {
    if usize::from(share) >= MAX_STRIPES {
        return Err(Malformed::Stripes("a share index past the most shares"));
    }
    if share == 0 && name != token.qp_num {
        return Err(Malformed::Stripes(
            "share 0 is for the token's own connection",
        ));
    }
    Ok(Presented {
        token,
        version,
        share,
        name,
    })
}

/// Reads a connect request's (padded) private data, of any version this
/// side speaks.
pub fn decode_connect_any(data: &[u8]) -> Result<Presented, Malformed> {
    let (data, version, share) = check_header_v(data, CONNECT_DATA_LEN, Kind::Connect)?;
    let token = token_at(data)?;
    let mut tail = [0u8; 4];
    tail.copy_from_slice(&data[HEADER_LEN + TOKEN_BYTES..CONNECT_DATA_LEN]);
    if version == VERSION {
        if tail != [0; 4] {
            return Err(Malformed::NotZero);
        }
        return presented(token, version, 0, token.qp_num);
    }
    presented(token, version, share, u32::from_le_bytes(tail))
}

/// Reads an in-band proof of any version this side speaks, received on the connection
/// named `name`: exactly [`PROOF_LEN`] bytes.
pub fn decode_proof_any(data: &[u8], name: u32) -> Result<Presented, Malformed> {
    if data.len() != PROOF_LEN {
        return Err(Malformed::NotHipobj);
    }
    let (data, version, share) = check_header_v(data, PROOF_LEN, Kind::Proof)?;
    let token = token_at(data)?;
    if share == 0 && name != token.qp_num {
        // The token's own share on another connection: not this
        // connection's proof at all.
        return Err(Malformed::Stripes(
            "share 0 is for the token's own connection",
        ));
    }
    presented(token, version, share, name)
}

/// What a peer that speaks versions up to `highest` makes of a connect
/// request: version 2 alone (as clients before version 3 read it) when
/// `highest` is 2, any version up to `highest` otherwise (a later one is
/// refused at its version, as a client of `highest` refuses it).
pub fn decode_connect_up_to(data: &[u8], highest: u8) -> Result<Presented, Malformed> {
    if highest >= VERSION_3 {
        return decode_connect_any(data).and_then(|p| at_most(p, highest));
    }
    decode_connect(data).map(|token| Presented {
        token,
        version: VERSION,
        share: 0,
        name: token.qp_num,
    })
}

/// [`decode_connect_up_to`] for an in-band proof received on the
/// connection named `name`.
pub fn decode_proof_up_to(data: &[u8], name: u32, highest: u8) -> Result<Presented, Malformed> {
    if highest >= VERSION_3 {
        return decode_proof_any(data, name).and_then(|p| at_most(p, highest));
    }
    decode_proof(data).map(|token| Presented {
        token,
        version: VERSION,
        share: 0,
        name,
    })
}

fn at_most(presented: Presented, highest: u8) -> Result<Presented, Malformed> {
    if presented.version > highest {
        return Err(Malformed::Version(presented.version));
    }
    Ok(presented)
}

/// One share of a striped transfer, as the plan gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// The client connection it moves over (its name).
    pub name: u32,
    /// The rkey of that connection's window for this share.
    pub rkey: u32,
    /// First byte, as the client's NIC addresses it.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// The plan of a striped transfer (the client's grant of share 0 carries
/// it): the header with the number of shares, then each share's name,
/// rkey and length (the shares tile the token's range in order).
pub fn encode_stripes(shares: &[Share]) -> Vec<u8> {
    let count = u16::try_from(shares.len()).unwrap_or(u16::MAX);
    let mut out = header_v(VERSION_3, Kind::Stripes, count).to_vec();
    for share in shares {
        out.extend_from_slice(&share.name.to_le_bytes());
        out.extend_from_slice(&share.rkey.to_le_bytes());
        out.extend_from_slice(&share.len.to_le_bytes());
    }
    out
}

/// Reads a plan for `token`'s transfer: at least 2 and at most
/// [`MAX_STRIPES`] shares, share 0 the token's own connection and rkey,
/// every share of some bytes, on connections all different, tiling the
/// token's range in order. Bytes past the plan are ignored (a REP's
/// private data arrives padded).
pub fn decode_stripes(data: &[u8], token: &Token) -> Result<Vec<Share>, Malformed> {
    let (_, version, count) = check_header_v(data, HEADER_LEN, Kind::Stripes)?;
    if version != VERSION_3 {
        return Err(Malformed::Version(version));
    }
    let count = usize::from(count);
    if !(2..=MAX_STRIPES).contains(&count) {
        return Err(Malformed::Stripes(
            "a plan of fewer than 2 or more than 8 shares",
        ));
    }
    let body = data
        .get(HEADER_LEN..HEADER_LEN + count * SHARE_LEN)
        .ok_or(Malformed::NotHipobj)?;
    let mut shares: Vec<Share> = Vec::with_capacity(count);
    let mut addr = token.addr;
    for entry in body.chunks_exact(SHARE_LEN) {
        let word = |at: usize| {
            u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
        };
        let mut len = [0u8; 8];
        len.copy_from_slice(&entry[8..16]);
        let share = Share {
            name: word(0),
            rkey: word(4),
            addr,
            len: u64::from_le_bytes(len),
        };
        if share.len == 0 {
            return Err(Malformed::Stripes("a share of no bytes"));
        }
        if shares.iter().any(|s| s.name == share.name) {
            return Err(Malformed::Stripes("two shares on one connection"));
        }
        addr = addr.checked_add(share.len).ok_or(Malformed::Stripes(
            "shares past the end of the address space",
        ))?;
        shares.push(share);
    }
    if shares[0].name != token.qp_num || shares[0].rkey != token.rkey {
        return Err(Malformed::Stripes(
            "share 0 is not the token's own connection and key",
        ));
    }
    if addr - token.addr != token.length {
        return Err(Malformed::Stripes(
            "the shares do not tile the token's range",
        ));
    }
    Ok(shares)
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

/// The data of a version-4 final message (a SEND with invalidate, which
/// has no room for an immediate): [`final_imm`], little-endian.
pub fn final_data(secret: u32) -> [u8; FINAL_DATA_LEN] {
    final_imm(secret).to_le_bytes()
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

    #[test]
    fn version_4_messages_are_refused_by_a_version_3_peer_and_the_final_data_is_the_final_imm() {
        let t = token();
        let connect = encode_connect_v(VERSION_4, &t, 0, t.qp_num);
        assert_eq!(&connect[0..8], b"HOBJ\x04\x01\x00\x00");
        let got = decode_connect_up_to(&connect, VERSION_4).unwrap();
        assert_eq!((got.token, got.version, got.share), (t, 4, 0));
        assert_eq!(
            decode_connect_up_to(&connect, VERSION_3),
            Err(Malformed::Version(4))
        );
        assert_eq!(decode_connect(&connect), Err(Malformed::Version(4)));
        let proof = encode_proof_v(VERSION_4, &t, 1);
        assert_eq!(
            decode_proof_up_to(&proof, 55, VERSION_4).unwrap().version,
            4
        );
        assert_eq!(
            decode_proof_up_to(&proof, 55, VERSION_3),
            Err(Malformed::Version(4))
        );
        // The example secret of docs/protocol.md: final_imm 0x7de12942.
        assert_eq!(final_data(0x89ab_cdef), [0x42, 0x29, 0xe1, 0x7d]);
    }

    #[test]
    fn version_3_proofs_carry_their_share_and_version_2_peers_refuse_them() {
        let t = token();
        let connect = encode_connect_v3(&t, 2, 99);
        assert_eq!(&connect[0..8], b"HOBJ\x03\x01\x02\x00");
        assert_eq!(&connect[52..56], &99u32.to_le_bytes());
        let got = decode_connect_any(&connect).unwrap();
        assert_eq!((got.token, got.version, got.share, got.name), (t, 3, 2, 99));
        // What a version-2 client does with it: refused at the version.
        assert_eq!(decode_connect(&connect), Err(Malformed::Version(3)));
        let proof = encode_proof_v3(&t, 1);
        assert_eq!(decode_proof(&proof), Err(Malformed::Version(3)));
        let got = decode_proof_any(&proof, 55).unwrap();
        assert_eq!((got.share, got.name), (1, 55));
        // Version 2 reads as share 0 of the token's own connection.
        let got = decode_connect_any(&encode_connect(&t)).unwrap();
        assert_eq!((got.version, got.share, got.name), (2, 0, t.qp_num));
        let got = decode_proof_any(&encode_proof(&t), t.qp_num).unwrap();
        assert_eq!((got.version, got.share), (2, 0));
        // Share 0 belongs to the token's own connection only.
        assert!(decode_connect_any(&encode_connect_v3(&t, 0, 99)).is_err());
        assert!(decode_proof_any(&encode_proof_v3(&t, 0), 55).is_err());
        assert!(decode_proof_any(&encode_proof(&t), 55).is_err());
        assert!(decode_connect_any(&encode_connect_v3(&t, 8, 99)).is_err());
        // Version 2 keeps its zero bytes zero.
        let mut bad = encode_connect(&t);
        bad[53] = 1;
        assert_eq!(decode_connect_any(&bad), Err(Malformed::NotZero));
        let mut bad = encode_proof(&t);
        bad[6] = 1;
        assert_eq!(decode_proof_any(&bad, t.qp_num), Err(Malformed::NotZero));
        let mut bad = connect;
        bad[4] = 5;
        assert_eq!(decode_connect_any(&bad), Err(Malformed::Version(5)));
    }

    fn plan(t: &Token, lens: &[u64]) -> Vec<Share> {
        let mut addr = t.addr;
        lens.iter()
            .enumerate()
            .map(|(i, &len)| {
                let share = Share {
                    name: if i == 0 {
                        t.qp_num
                    } else {
                        100 + u32::try_from(i).unwrap()
                    },
                    rkey: if i == 0 {
                        t.rkey
                    } else {
                        0x500 + u32::try_from(i).unwrap()
                    },
                    addr,
                    len,
                };
                addr += len;
                share
            })
            .collect()
    }

    #[test]
    fn a_plan_round_trips_and_must_tile_the_tokens_range() {
        let t = token();
        let good = plan(&t, &[1024, 1024, 2048]);
        let bytes = encode_stripes(&good);
        assert_eq!(bytes.len(), HEADER_LEN + 3 * SHARE_LEN);
        assert_eq!(&bytes[0..8], b"HOBJ\x03\x04\x03\x00");
        let mut padded = bytes.clone();
        padded.resize(196, 0);
        assert_eq!(decode_stripes(&padded, &t), Ok(good.clone()));
        assert!(encode_stripes(&plan(&t, &[512; MAX_STRIPES])).len() <= STRIPES_MAX_LEN);
        let bad_plans: Vec<(&str, Vec<Share>)> = vec![
            ("short", plan(&t, &[1024, 1024, 1024])),
            ("long", plan(&t, &[1024, 1024, 4096])),
            ("one share", plan(&t, &[4096])),
            ("too many", plan(&t, &[512; 9])),
            ("an empty share", plan(&t, &[4096, 0])),
            ("share 0 elsewhere", {
                let mut p = good.clone();
                p[0].name = 7;
                p
            }),
            ("share 0 with another key", {
                let mut p = good.clone();
                p[0].rkey ^= 1;
                p
            }),
            ("one connection twice", {
                let mut p = good.clone();
                p[2].name = p[1].name;
                p
            }),
        ];
        for (what, bad) in bad_plans {
            assert!(decode_stripes(&encode_stripes(&bad), &t).is_err(), "{what}");
        }
        assert!(decode_stripes(&bytes[..bytes.len() - 1], &t).is_err());
        let mut v2 = bytes.clone();
        v2[4] = 2;
        assert!(decode_stripes(&v2, &t).is_err());
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_connect(&data);
            let _ = decode_proof(&data);
            let _ = decode_connect_any(&data);
            let _ = decode_proof_any(&data, 17);
            let _ = decode_stripes(&data, &token());
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
