//! `decode_connect` and `is_refusal`: a connect request's private data (any
//! peer on the fabric can send one to the client's listener) and a
//! rejection's (which a server reads). What decodes is a `0x02` token that
//! encodes back to the same 56 bytes, and a refusal is exactly the header.
#![no_main]

use hipobj::core::protocol::{
    decode_connect, encode_connect, encode_reject, is_refusal, CONNECT_DATA_LEN, REJECT_DATA_LEN,
};
use hipobj::core::token::Transport;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(token) = decode_connect(data) {
        assert_eq!(token.transport, Transport::RcCm);
        let encoded = encode_connect(&token);
        assert_eq!(encoded[..], data[..CONNECT_DATA_LEN]);
        assert_eq!(decode_connect(&encoded), Ok(token));
    }
    if is_refusal(data) {
        assert_eq!(data[..REJECT_DATA_LEN], encode_reject());
    }
});
