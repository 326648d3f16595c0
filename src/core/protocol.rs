//! The wire formats of the connection protocol that `docs/protocol.md`
//! describes: what the server puts in its RDMA CM connect request, what the
//! client answers in a rejection, and the immediate value of the server's
//! final message.
//!
//! Everything is little-endian and laid out field by field. Private data
//! arrives padded by the CM, so decoders read their fixed length from the
//! front and ignore the rest.

use super::token::{Token, TOKEN_BYTES};

/// "HOBJ" as a little-endian `u32`: the first field of every message here.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HOBJ");
/// Version of this protocol.
pub const VERSION: u8 = 1;

/// Bytes of a connect request's private data: magic (4), version (1),
/// reserved (3), the token (44), the server's nonce (4). This fills the 56
/// bytes a REQ can carry.
pub const CONNECT_DATA_LEN: usize = 4 + 1 + 3 + TOKEN_BYTES + 4;

/// What a server sends in its connect request: the token it was given,
/// which proves it saw this transfer's request, and a nonce from which both
/// sides derive each transfer's secret on this connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// The client's token, byte for byte.
    pub token: Token,
    /// Chosen by the server for this connection.
    pub nonce: u32,
}

/// Why a connect request was rejected; sent back in the REJ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// Not this protocol (magic or length).
    NotHipobj = 1,
    /// A version this client does not speak.
    BadVersion = 2,
    /// The token does not decode, or is not a `0x02` token.
    BadToken = 3,
    /// No pool QP has that number.
    UnknownQp = 4,
    /// The QP has no transfer waiting for a server.
    NotWaiting = 5,
    /// The token is not the one the waiting transfer minted.
    WrongToken = 6,
    /// The QP could not be connected.
    QpFailed = 7,
    /// The instance is shutting down.
    ShuttingDown = 8,
}

impl RejectReason {
    /// From the wire value.
    pub fn from_u8(value: u8) -> Option<RejectReason> {
        use RejectReason::*;
        [
            NotHipobj,
            BadVersion,
            BadToken,
            UnknownQp,
            NotWaiting,
            WrongToken,
            QpFailed,
            ShuttingDown,
        ]
        .into_iter()
        .find(|r| *r as u8 == value)
    }
}

/// Bytes of a rejection's private data: magic (4), version (1), reason (1),
/// reserved (2).
pub const REJECT_DATA_LEN: usize = 8;

impl ConnectData {
    /// The private data of the connect request.
    pub fn encode(&self) -> [u8; CONNECT_DATA_LEN] {
        let mut out = [0u8; CONNECT_DATA_LEN];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = VERSION;
        out[8..8 + TOKEN_BYTES].copy_from_slice(&self.token.to_bytes());
        out[8 + TOKEN_BYTES..].copy_from_slice(&self.nonce.to_le_bytes());
        out
    }

    /// Reads a connect request's (padded) private data.
    pub fn decode(data: &[u8]) -> Result<ConnectData, RejectReason> {
        let data = data
            .get(..CONNECT_DATA_LEN)
            .ok_or(RejectReason::NotHipobj)?;
        if data[0..4] != MAGIC.to_le_bytes() {
            return Err(RejectReason::NotHipobj);
        }
        if data[4] != VERSION {
            return Err(RejectReason::BadVersion);
        }
        let mut token = [0u8; TOKEN_BYTES];
        token.copy_from_slice(&data[8..8 + TOKEN_BYTES]);
        let token = Token::from_bytes(&token).map_err(|_| RejectReason::BadToken)?;
        let mut nonce = [0u8; 4];
        nonce.copy_from_slice(&data[8 + TOKEN_BYTES..]);
        Ok(ConnectData {
            token,
            nonce: u32::from_le_bytes(nonce),
        })
    }
}

/// The private data of a rejection.
pub fn encode_reject(reason: RejectReason) -> [u8; REJECT_DATA_LEN] {
    let mut out = [0u8; REJECT_DATA_LEN];
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4] = VERSION;
    out[5] = reason as u8;
    out
}

/// Reads a rejection's (padded) private data; `None` if it is not ours.
pub fn decode_reject(data: &[u8]) -> Option<RejectReason> {
    let data = data.get(..REJECT_DATA_LEN)?;
    (data[0..4] == MAGIC.to_le_bytes()).then_some(())?;
    RejectReason::from_u8(data[5])
}

/// The immediate value of the server's final SEND with immediate for the
/// `seq`th transfer (from 0) on a connection whose connect request carried
/// `nonce`: SplitMix64's finalizer over both, folded to 32 bits. Both sides
/// count transfers on the connection; a failed transfer ends the connection,
/// so the counts never drift apart.
pub fn final_imm(nonce: u32, seq: u32) -> u32 {
    let mut z = (u64::from(nonce) << 32 | u64::from(seq)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let folded = (z ^ (z >> 32)).to_le_bytes();
    u32::from_le_bytes([folded[0], folded[1], folded[2], folded[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::token::Transport;
    use proptest::prelude::*;

    fn token() -> Token {
        Token {
            transport: Transport::RcCm,
            qp_num: 17,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
            rkey: 0x251,
            addr: 0x7ff4_f318_e000,
            length: 4096,
            port: 1,
            lid: 56826,
        }
    }

    #[test]
    fn connect_data_fills_a_req_and_survives_padding() {
        assert_eq!(CONNECT_DATA_LEN, 56);
        let data = ConnectData {
            token: token(),
            nonce: 0xdead_beef,
        };
        let mut padded = data.encode().to_vec();
        padded.resize(56, 0);
        assert_eq!(ConnectData::decode(&padded), Ok(data));
        assert_eq!(&padded[0..4], b"HOBJ");
    }

    #[test]
    fn connect_data_rejects_what_is_not_ours() {
        let good = ConnectData {
            token: token(),
            nonce: 1,
        }
        .encode();
        assert_eq!(
            ConnectData::decode(&good[..55]),
            Err(RejectReason::NotHipobj)
        );
        let mut bad = good;
        bad[0] = b'X';
        assert_eq!(ConnectData::decode(&bad), Err(RejectReason::NotHipobj));
        let mut bad = good;
        bad[4] = 9;
        assert_eq!(ConnectData::decode(&bad), Err(RejectReason::BadVersion));
        let mut bad = good;
        bad[8] = 0x7f;
        assert_eq!(ConnectData::decode(&bad), Err(RejectReason::BadToken));
    }

    #[test]
    fn reject_reasons_round_trip() {
        for reason in [
            RejectReason::NotHipobj,
            RejectReason::WrongToken,
            RejectReason::ShuttingDown,
        ] {
            let mut padded = encode_reject(reason).to_vec();
            padded.resize(148, 0);
            assert_eq!(decode_reject(&padded), Some(reason));
        }
        assert_eq!(decode_reject(&[0; 148]), None);
    }

    #[test]
    fn final_imm_differs_per_transfer_and_per_connection() {
        let a: Vec<u32> = (0..1000).map(|seq| final_imm(7, seq)).collect();
        let mut dedup = a.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), a.len());
        assert_ne!(final_imm(7, 0), final_imm(8, 0));
        assert_eq!(final_imm(7, 3), final_imm(7, 3));
    }

    proptest! {
        #[test]
        fn decoding_any_private_data_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ConnectData::decode(&data);
            let _ = decode_reject(&data);
        }
    }
}
