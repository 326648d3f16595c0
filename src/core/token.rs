//! The `x-amz-rdma-token` codec: 44 bytes serialized field by field in
//! little-endian order, carried as 88 hex digits (lowercase out, either case
//! in). The layout of transports `0x00` and `0x01` is the ABI's and never
//! changes; transport `0x02` is ours, and carries a 40-bit length and a
//! 32-bit secret where the others carry a 64-bit length and the IB port
//! (`docs/protocol.md`).

use std::fmt;

/// Bytes in a serialized token.
pub const TOKEN_BYTES: usize = 44;
/// Hex digits in an encoded token.
pub const TOKEN_HEX_LEN: usize = 2 * TOKEN_BYTES;

// Field offsets (ABI spec, section 5). Each field's end is the next one's start.
const TRANSPORT_AT: usize = 0;
const QP_NUM_AT: usize = 1;
const GID_AT: usize = 5;
const RKEY_AT: usize = 21;
const ADDR_AT: usize = 25;
const LENGTH_AT: usize = 33;
const PORT_AT: usize = 41;
const LID_AT: usize = 42;
// Transport 0x02: a 40-bit length at LENGTH_AT, then the secret, which
// covers the IB port's byte (a server that connects through RDMA CM never
// needs the client's port number).
const SECRET_AT: usize = 38;

/// Largest length a `0x02` token carries (40 bits; registrations are at
/// most 4 GiB).
pub const RC_CM_MAX_LENGTH: u64 = (1 << 40) - 1;

/// How the server reaches the client's queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `0x00`: Dynamic Connection (NVIDIA cuObject servers).
    Dc,
    /// `0x01`: Reliable Connection; the client connects its QP to the peer
    /// its reply names (the original's transport).
    Rc,
    /// `0x02`: Reliable Connection that the server connects through RDMA CM
    /// to the client's listener, whose port the LID field carries
    /// (`docs/protocol.md`). This library mints only these.
    RcCm,
}

impl Transport {
    /// The wire byte.
    pub fn to_byte(self) -> u8 {
        match self {
            Transport::Dc => 0x00,
            Transport::Rc => 0x01,
            Transport::RcCm => 0x02,
        }
    }
}

impl TryFrom<u8> for Transport {
    type Error = TokenError;
    fn try_from(byte: u8) -> Result<Self, TokenError> {
        match byte {
            0x00 => Ok(Transport::Dc),
            0x01 => Ok(Transport::Rc),
            0x02 => Ok(Transport::RcCm),
            other => Err(TokenError::UnknownTransport(other)),
        }
    }
}

/// Why a token was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The text is not exactly 88 digits long.
    #[error("a token is {TOKEN_HEX_LEN} hex digits, got {0} bytes")]
    BadLength(usize),
    /// A byte is not a hex digit.
    #[error("a token holds only hex digits")]
    NotHex,
    /// The transport byte is not one this library knows.
    #[error("unknown token transport 0x{0:02x}")]
    UnknownTransport(u8),
}

/// One decoded token: which buffer range and which queue pair a server may
/// use for one transfer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    /// How the server reaches the queue pair.
    pub transport: Transport,
    /// The client's queue pair number. A `0x02` token carries the
    /// connection's name here: the number of its first QP, which stays
    /// while the QP behind it is replaced (`docs/protocol.md`).
    pub qp_num: u32,
    /// The client's GID, raw as `ibv_query_gid` returns it.
    pub gid: [u8; 16],
    /// The remote key of the registration (or window) covering the range.
    pub rkey: u32,
    /// The first byte of the range, as the NIC addresses it.
    pub addr: u64,
    /// Bytes in the range.
    pub length: u64,
    /// The NIC's port number; not carried by `0x02` tokens (always 0 there).
    pub port: u8,
    /// The port's LID; 0 on RoCE. A `0x02` token carries the client
    /// listener's RDMA CM port here: the number itself, little-endian like
    /// every field (not in `sin_port`'s network order).
    pub lid: u16,
    /// `0x02` only (0 for the other transports): 32 bits from the operating
    /// system's CSPRNG, fresh for every token. A server proves it holds the
    /// token by presenting it whole, and the grant and final messages of
    /// the transfer carry values derived from it
    /// ([`crate::core::protocol`]).
    pub secret: u32,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("transport", &self.transport)
            .field("qp_num", &self.qp_num)
            .field("gid", &hex::encode(self.gid))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("length", &self.length)
            .field("port", &self.port)
            .field("lid", &self.lid)
            // The secret is a credential: never printed.
            .field("secret", &format_args!("<{} bits>", 32))
            .finish()
    }
}

impl Token {
    /// Serializes the token field by field. A `0x02` token's length must
    /// be at most [`RC_CM_MAX_LENGTH`] and its port 0 (what
    /// [`Token::is_encodable`] checks); beyond that, only the low 40 bits
    /// of the length are written.
    pub fn to_bytes(&self) -> [u8; TOKEN_BYTES] {
        debug_assert!(self.is_encodable(), "{self:?} has no 44-byte form");
        let mut out = [0u8; TOKEN_BYTES];
        out[TRANSPORT_AT] = self.transport.to_byte();
        out[QP_NUM_AT..GID_AT].copy_from_slice(&self.qp_num.to_le_bytes());
        out[GID_AT..RKEY_AT].copy_from_slice(&self.gid);
        out[RKEY_AT..ADDR_AT].copy_from_slice(&self.rkey.to_le_bytes());
        out[ADDR_AT..LENGTH_AT].copy_from_slice(&self.addr.to_le_bytes());
        let length = self.length.to_le_bytes();
        match self.transport {
            Transport::RcCm => {
                out[LENGTH_AT..SECRET_AT].copy_from_slice(&length[..SECRET_AT - LENGTH_AT]);
                out[SECRET_AT..LID_AT].copy_from_slice(&self.secret.to_le_bytes());
            }
            Transport::Dc | Transport::Rc => {
                out[LENGTH_AT..PORT_AT].copy_from_slice(&length);
                out[PORT_AT] = self.port;
            }
        }
        out[LID_AT..TOKEN_BYTES].copy_from_slice(&self.lid.to_le_bytes());
        out
    }

    /// Whether [`Token::to_bytes`] writes this token as it is: a `0x02`
    /// token has a 40-bit length and no port, the others no secret.
    pub fn is_encodable(&self) -> bool {
        match self.transport {
            Transport::RcCm => self.length <= RC_CM_MAX_LENGTH && self.port == 0,
            Transport::Dc | Transport::Rc => self.secret == 0,
        }
    }

    /// Deserializes 44 bytes; only the transport byte can be invalid.
    pub fn from_bytes(bytes: &[u8; TOKEN_BYTES]) -> Result<Token, TokenError> {
        let transport = Transport::try_from(bytes[TRANSPORT_AT])?;
        let (length, port, secret) = match transport {
            Transport::RcCm => {
                let mut length = [0u8; 8];
                length[..SECRET_AT - LENGTH_AT].copy_from_slice(&bytes[LENGTH_AT..SECRET_AT]);
                let secret = u32::from_le_bytes(field(bytes, SECRET_AT));
                (u64::from_le_bytes(length), 0, secret)
            }
            Transport::Dc | Transport::Rc => (
                u64::from_le_bytes(field(bytes, LENGTH_AT)),
                bytes[PORT_AT],
                0,
            ),
        };
        Ok(Token {
            transport,
            qp_num: u32::from_le_bytes(field(bytes, QP_NUM_AT)),
            gid: field(bytes, GID_AT),
            rkey: u32::from_le_bytes(field(bytes, RKEY_AT)),
            addr: u64::from_le_bytes(field(bytes, ADDR_AT)),
            length,
            port,
            lid: u16::from_le_bytes(field(bytes, LID_AT)),
            secret,
        })
    }

    /// Constant-time equality of the serialized tokens: how a proof is
    /// compared, so that its timing says nothing about how much of a guess
    /// was right.
    pub fn same_as(&self, other: &Token) -> bool {
        let (a, b) = (self.to_bytes(), other.to_bytes());
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }

    /// The 88 lowercase hex digits of the token.
    pub fn to_hex(&self) -> [u8; TOKEN_HEX_LEN] {
        let mut out = [0u8; TOKEN_HEX_LEN];
        // Cannot fail: the output is exactly twice the input's length.
        hex::encode_to_slice(self.to_bytes(), &mut out).expect("88 digits hold 44 bytes");
        out
    }

    /// Parses exactly 88 hex digits, in either case.
    pub fn parse_hex(text: &[u8]) -> Result<Token, TokenError> {
        if text.len() != TOKEN_HEX_LEN {
            return Err(TokenError::BadLength(text.len()));
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| TokenError::NotHex)?;
        Token::from_bytes(&bytes)
    }

    /// The IPv4 address in the GID, when the GID is IPv4-mapped (bytes 10
    /// and 11 both `0xff`), as RoCE v2 GIDs of IPv4 interfaces are.
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        let g = &self.gid;
        (g[10] == 0xff && g[11] == 0xff)
            .then(|| std::net::Ipv4Addr::new(g[12], g[13], g[14], g[15]))
    }
}

/// Why an `x-amz-rdma-token` header's value was refused ([`parse_header`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The 88 digits before any suffix are not a token.
    #[error("malformed token ({0})")]
    Token(#[from] TokenError),
    /// The suffix is not `:<addr>:<size>` of two numbers; says which part.
    #[error("malformed token suffix ({0})")]
    Suffix(&'static str),
    /// The suffix's size is not the token's length.
    #[error("the suffix's size {size:#x} is not the token's length {length:#x}")]
    Size {
        /// The suffix's size.
        size: u64,
        /// The token's length.
        length: u64,
    },
}

/// Parses an `x-amz-rdma-token` header's value as a server receives it: 88
/// hex digits, optionally followed by `:<addr>:<size>`, the suffix the
/// original's clients append with `"%s:%016lx:%016lx"` (sixteen lowercase
/// hex digits each, no `0x`). Each suffix number is hexadecimal, with or
/// without `0x`, one to sixteen digits, in either case; the size must be
/// the token's length. The token's own address is authoritative; the
/// suffix's is only checked to be a number.
pub fn parse_header(value: &[u8]) -> Result<Token, HeaderError> {
    let mut parts = value.split(|&b| b == b':');
    let hex = parts.next().unwrap_or_default();
    let token = Token::parse_hex(hex)?;
    match (parts.next(), parts.next(), parts.next()) {
        (None, _, _) => Ok(token),
        (Some(addr), Some(size), None) => {
            suffix_number(addr).ok_or(HeaderError::Suffix("address"))?;
            let size = suffix_number(size).ok_or(HeaderError::Suffix("size"))?;
            if size != token.length {
                return Err(HeaderError::Size {
                    size,
                    length: token.length,
                });
            }
            Ok(token)
        }
        _ => Err(HeaderError::Suffix("expected :<addr>:<size>")),
    }
}

/// A hexadecimal number of a token suffix: one to sixteen digits, with or
/// without `0x`; no sign or space.
fn suffix_number(text: &[u8]) -> Option<u64> {
    let digits = text
        .strip_prefix(b"0x")
        .or_else(|| text.strip_prefix(b"0X"))
        .unwrap_or(text);
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// Copies the `N` bytes of the field that starts at `at`.
fn field<const N: usize>(bytes: &[u8; TOKEN_BYTES], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Token {
        Token {
            transport: Transport::Rc,
            qp_num: 0x0102_0304,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
            rkey: 0xa0b0_c0d0,
            addr: 0x1122_3344_5566_7788,
            length: 4096,
            port: 1,
            lid: 0xbeef,
            secret: 0,
        }
    }

    fn rc_cm() -> Token {
        Token {
            transport: Transport::RcCm,
            port: 0,
            length: 0x12_3456_789a,
            secret: 0xfeed_f00d,
            ..sample()
        }
    }

    #[test]
    fn fields_sit_at_their_documented_offsets_in_little_endian() {
        let b = sample().to_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(&b[1..5], &[0x04, 0x03, 0x02, 0x01]);
        assert_eq!(&b[5..21], &sample().gid);
        assert_eq!(&b[21..25], &[0xd0, 0xc0, 0xb0, 0xa0]);
        assert_eq!(
            &b[25..33],
            &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]
        );
        assert_eq!(&b[33..41], &[0x00, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[41], 1);
        assert_eq!(&b[42..44], &[0xef, 0xbe]);
    }

    #[test]
    fn an_rc_cm_token_carries_a_40_bit_length_and_the_secret_over_the_port() {
        let t = rc_cm();
        let b = t.to_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(&b[33..38], &[0x9a, 0x78, 0x56, 0x34, 0x12]);
        assert_eq!(&b[38..42], &[0x0d, 0xf0, 0xed, 0xfe]);
        assert_eq!(&b[42..44], &[0xef, 0xbe]);
        assert_eq!(Token::from_bytes(&b), Ok(t));
        assert!(t.is_encodable());
        assert!(!Token { port: 1, ..t }.is_encodable());
        assert!(!Token {
            length: RC_CM_MAX_LENGTH + 1,
            ..t
        }
        .is_encodable());
        assert!(!Token {
            secret: 1,
            ..sample()
        }
        .is_encodable());
    }

    #[test]
    fn tokens_compare_whole_and_the_debug_form_hides_the_secret() {
        let t = rc_cm();
        assert!(t.same_as(&t));
        for i in 0..TOKEN_BYTES {
            let mut b = t.to_bytes();
            b[i] ^= 0x01;
            if let Ok(other) = Token::from_bytes(&b) {
                assert!(!t.same_as(&other), "byte {i} changed");
            }
        }
        let shown = format!("{t:?}");
        assert!(!shown.contains("feedf00d") && !shown.contains(&0xfeed_f00du32.to_string()));
    }

    #[test]
    fn hex_is_lowercase_and_upper_case_parses_back() {
        let hex = sample().to_hex();
        let text = std::str::from_utf8(&hex).unwrap();
        assert_eq!(text.len(), 88);
        assert_eq!(text, text.to_lowercase());
        assert!(text.starts_with("0104030201"));
        let upper = text.to_uppercase();
        assert_eq!(Token::parse_hex(upper.as_bytes()), Ok(sample()));
    }

    #[test]
    fn wrong_length_non_hex_and_unknown_transport_are_rejected() {
        let hex = sample().to_hex();
        assert_eq!(Token::parse_hex(&hex[..87]), Err(TokenError::BadLength(87)));
        let mut long = hex.to_vec();
        long.push(b'0');
        assert_eq!(Token::parse_hex(&long), Err(TokenError::BadLength(89)));
        let mut bad = hex;
        bad[50] = b'g';
        assert_eq!(Token::parse_hex(&bad), Err(TokenError::NotHex));
        let mut unknown = hex;
        unknown[..2].copy_from_slice(b"03");
        assert_eq!(
            Token::parse_hex(&unknown),
            Err(TokenError::UnknownTransport(3))
        );
    }

    #[test]
    fn ipv4_is_read_only_from_mapped_gids() {
        assert_eq!(sample().ipv4(), Some(std::net::Ipv4Addr::new(192, 0, 2, 1)));
        let mut t = sample();
        t.gid[11] = 0xfe;
        assert_eq!(t.ipv4(), None);
    }

    proptest! {
        #[test]
        fn any_token_bytes_with_a_known_transport_round_trip(
            transport in 0u8..=2,
            rest in proptest::collection::vec(any::<u8>(), TOKEN_BYTES - 1),
        ) {
            let mut bytes = [0u8; TOKEN_BYTES];
            bytes[0] = transport;
            bytes[1..].copy_from_slice(&rest);
            let token = Token::from_bytes(&bytes).unwrap();
            prop_assert_eq!(token.to_bytes(), bytes);
            prop_assert_eq!(Token::parse_hex(&token.to_hex()).unwrap(), token);
            let expected = hex::encode(bytes);
            prop_assert_eq!(expected.as_bytes(), &token.to_hex()[..]);
        }

        #[test]
        fn any_other_transport_byte_is_rejected(
            transport in 3u8..,
            rest in proptest::collection::vec(any::<u8>(), TOKEN_BYTES - 1),
        ) {
            let mut bytes = [0u8; TOKEN_BYTES];
            bytes[0] = transport;
            bytes[1..].copy_from_slice(&rest);
            prop_assert_eq!(Token::from_bytes(&bytes), Err(TokenError::UnknownTransport(transport)));
        }

        #[test]
        fn parsing_arbitrary_bytes_never_panics(text in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Token::parse_hex(&text);
        }

        #[test]
        fn mixed_case_hex_parses(bytes in proptest::collection::vec(any::<u8>(), TOKEN_BYTES - 1), mask in any::<u128>()) {
            let mut raw = [1u8; TOKEN_BYTES];
            raw[1..].copy_from_slice(&bytes);
            let mut text: Vec<u8> = hex::encode(raw).into_bytes();
            for (i, c) in text.iter_mut().enumerate() {
                if mask >> (i % 128) & 1 == 1 {
                    c.make_ascii_uppercase();
                }
            }
            prop_assert_eq!(Token::parse_hex(&text).unwrap().to_bytes(), raw);
        }
    }

    fn of_4096() -> Token {
        Token {
            length: 4096,
            ..rc_cm()
        }
    }

    fn rc_cm_hex() -> String {
        String::from_utf8(of_4096().to_hex().to_vec()).unwrap()
    }

    #[test]
    fn a_token_alone_or_with_the_originals_suffix_parses() {
        assert_eq!(parse_header(rc_cm_hex().as_bytes()), Ok(of_4096()));
        // What the original's clients send: "%s:%016lx:%016lx".
        let buffer = vec![0u8; 4096];
        let addr = buffer.as_ptr() as u64;
        let original = format!("{}:{addr:016x}:{:016x}", rc_cm_hex(), 4096u64);
        assert_eq!(original.len(), TOKEN_HEX_LEN + 34, "{original}");
        assert_eq!(
            parse_header(original.as_bytes()),
            Ok(of_4096()),
            "{original}"
        );
        for suffix in [
            ":00007f2a5c000000:0000000000001000",
            ":7f2a5c000000:1000",
            ":0x7fff0000:0x1000",
            ":0X7FFF0000:1000",
            ":ffffffffffffffff:0000000000001000",
            ":0:1000",
        ] {
            let value = format!("{}{suffix}", rc_cm_hex());
            assert_eq!(parse_header(value.as_bytes()), Ok(of_4096()), "{suffix}");
        }
    }

    #[test]
    fn a_suffix_must_be_well_formed_and_its_size_the_tokens_length() {
        for suffix in [
            // Decimal 4096 read as hex is 0x4096.
            ":1:4096",
            ":1:1001",
            ":1:fff",
            ":1",
            ":1:1000:9",
            "::1000",
            ":1:",
            ":x:1000",
            ":1:-1000",
            ":1: 1000",
            ":0x:1000",
            ":1:0x",
            // Seventeen digits, though their value would fit.
            ":00000000000000001:1000",
            ":1:00000000000001000",
            ":+1:1000",
        ] {
            let value = format!("{}{suffix}", rc_cm_hex());
            assert!(
                parse_header(value.as_bytes()).is_err(),
                "{suffix} was accepted"
            );
        }
        let size = parse_header(format!("{}:1:1001", rc_cm_hex()).as_bytes()).unwrap_err();
        assert_eq!(
            size,
            HeaderError::Size {
                size: 0x1001,
                length: 4096
            }
        );
        assert_eq!(
            size.to_string(),
            "the suffix's size 0x1001 is not the token's length 0x1000"
        );
        assert!(parse_header(b"zz").is_err());
    }
}
