//! `decode_proof`: the in-band proof, a SEND whose bytes the server on a
//! kept connection chooses. What decodes is exactly the encoding of a
//! `0x02` token.
#![no_main]

use hipobj::core::protocol::{decode_proof, encode_proof};
use hipobj::core::token::Transport;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(token) = decode_proof(data) {
        assert_eq!(token.transport, Transport::RcCm);
        assert_eq!(encode_proof(&token)[..], data[..]);
    }
});
