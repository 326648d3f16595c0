//! `Token::from_bytes`: a token's 44 bytes, as the connect request's
//! private data and the in-band proof carry them. Only the transport byte
//! can be invalid, and a token that decodes encodes back to the same bytes.
#![no_main]

use hipobj::core::token::{Token, TOKEN_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(bytes) = <[u8; TOKEN_BYTES]>::try_from(data) else {
        return;
    };
    match Token::from_bytes(&bytes) {
        Ok(token) => {
            assert!(bytes[0] <= 2, "transport {:#04x} accepted", bytes[0]);
            assert!(token.is_encodable());
            assert_eq!(token.to_bytes(), bytes);
        }
        Err(_) => assert!(bytes[0] > 2, "transport {:#04x} refused", bytes[0]),
    }
});
