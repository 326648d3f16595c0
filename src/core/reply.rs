//! The `x-amz-rdma-reply` grammar (ABI spec, section 6).
//!
//! ```text
//! reply  = body *( NUL / CR / LF )      ; only the trailing bytes are ignored
//! body   = "ok" / "err" / status / "200:" token
//! status = 3DIGIT                        ; 100..599
//! token  = 88HEXDIG                      ; a valid token (known transport)
//! ```
//!
//! Anything else is rejected rather than guessed at.

use super::token::{Token, TokenError, Transport};

/// Bytes of the buffer handed to `recvReply`.
pub const REPLY_BUFFER_LEN: usize = 512;

/// A parsed reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The HTTP status the reply stands for: 200 for `ok`, -1 for `err`.
    pub http_code: i32,
    /// The server's own token, from the `200:<token>` form.
    pub peer: Option<Token>,
}

impl Reply {
    /// Whether the reply reports a completed RDMA transfer: `ok`, 200, 204
    /// or 206. A 501 means the server declined RDMA and is a failure too.
    pub fn is_success(&self) -> bool {
        matches!(self.http_code, 200 | 204 | 206)
    }
}

/// Why a reply was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// Not one of the forms of the grammar.
    #[error("reply is not ok, err, a status 100-599 or 200:<token>")]
    Malformed,
    /// `200:` followed by something that is not a valid token.
    #[error("reply token: {0}")]
    Token(#[from] TokenError),
}

/// Parses a reply of `bytes` (exactly `replyLen` bytes of the caller's).
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, ReplyError> {
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b'\0' | b'\r' | b'\n'))
        .map_or(0, |last| last + 1);
    let body = &bytes[..end];
    let plain = |http_code| {
        Ok(Reply {
            http_code,
            peer: None,
        })
    };
    match body {
        b"ok" => plain(200),
        b"err" => plain(-1),
        [a, b, c] if body.iter().all(u8::is_ascii_digit) => {
            let code = [a, b, c]
                .iter()
                .fold(0i32, |acc, d| acc * 10 + i32::from(**d - b'0'));
            if (100..=599).contains(&code) {
                plain(code)
            } else {
                Err(ReplyError::Malformed)
            }
        }
        _ => match body.strip_prefix(b"200:") {
            Some(token) => {
                let peer = Token::parse_hex(token)?;
                // A server names its own QP with the original transports;
                // 0x02 describes a client's listener and has no place here.
                if peer.transport == Transport::RcCm {
                    return Err(ReplyError::Token(TokenError::UnknownTransport(0x02)));
                }
                Ok(Reply {
                    http_code: 200,
                    peer: Some(peer),
                })
            }
            None => Err(ReplyError::Malformed),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::token::TOKEN_BYTES;
    use proptest::prelude::*;

    fn token_hex(transport: u8) -> String {
        let mut raw = [0x5au8; TOKEN_BYTES];
        raw[0] = transport;
        hex::encode(raw)
    }

    fn code(text: &[u8]) -> Result<i32, ReplyError> {
        parse_reply(text).map(|r| r.http_code)
    }

    #[test]
    fn accepted_forms_give_their_status() {
        assert_eq!(code(b"ok"), Ok(200));
        assert_eq!(code(b"err"), Ok(-1));
        assert_eq!(code(b"100"), Ok(100));
        assert_eq!(code(b"200"), Ok(200));
        assert_eq!(code(b"501"), Ok(501));
        assert_eq!(code(b"599"), Ok(599));
        assert_eq!(code(b"ok\r\n\0\0"), Ok(200));
        assert_eq!(code(b"206\n"), Ok(206));
    }

    #[test]
    fn peer_token_follows_only_a_200() {
        let reply = parse_reply(format!("200:{}\r\n", token_hex(1)).as_bytes()).unwrap();
        assert_eq!(reply.http_code, 200);
        let peer = reply.peer.unwrap();
        assert_eq!(peer.transport, Transport::Rc);
        assert_eq!(peer.qp_num, 0x5a5a_5a5a);
        assert_eq!(
            code(format!("204:{}", token_hex(1)).as_bytes()),
            Err(ReplyError::Malformed)
        );
        assert_eq!(
            code(format!("ok:{}", token_hex(1)).as_bytes()),
            Err(ReplyError::Malformed)
        );
        assert_eq!(
            code(format!("200:{}", token_hex(9)).as_bytes()),
            Err(ReplyError::Token(TokenError::UnknownTransport(9)))
        );
        assert!(code(format!("200:{}0", token_hex(1)).as_bytes()).is_err());
        assert_eq!(
            code(format!("200:{}", token_hex(2)).as_bytes()),
            Err(ReplyError::Token(TokenError::UnknownTransport(2)))
        );
        assert_eq!(code(format!("200:{}", token_hex(0)).as_bytes()), Ok(200));
        assert!(code(b"200:").is_err());
    }

    #[test]
    fn everything_else_is_rejected() {
        for bad in [
            &b""[..],
            b"\r\n",
            b"\0",
            b"OK",
            b"Ok",
            b"okay",
            b"ok ",
            b" ok",
            b"0200",
            b"2000",
            b"099",
            b"000",
            b"600",
            b"999",
            b"+200",
            b"-1",
            b"20",
            b"2 0",
            b"o\0k",
            b"ok\0x",
            b"err\r\nx",
            b"\n200",
            b"200 ",
        ] {
            assert_eq!(
                code(bad),
                Err(ReplyError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn success_is_200_204_and_206_only() {
        for (text, ok) in [
            (&b"ok"[..], true),
            (b"200", true),
            (b"204", true),
            (b"206", true),
            (b"201", false),
            (b"501", false),
            (b"err", false),
        ] {
            assert_eq!(parse_reply(text).unwrap().is_success(), ok);
        }
    }

    proptest! {
        #[test]
        fn no_input_makes_the_parser_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_reply(&bytes);
        }

        #[test]
        fn every_three_digit_status_in_range_parses(n in 100i32..=599, tail in "[\r\n\0]{0,4}") {
            let text = format!("{n}{tail}");
            prop_assert_eq!(code(text.as_bytes()), Ok(n));
        }
    }
}
