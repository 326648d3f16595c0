//! `Token::parse_hex`: the `x-amz-rdma-token` text a server receives and
//! the `200:<token>` form of a reply. A token that parses prints back as
//! the same digits, lowercased, and parses again to itself.
#![no_main]

use hipobj::core::token::{Token, TOKEN_HEX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(token) = Token::parse_hex(data) else {
        return;
    };
    assert_eq!(data.len(), TOKEN_HEX_LEN);
    let printed = token.to_hex();
    assert_eq!(printed.to_vec(), data.to_ascii_lowercase());
    assert_eq!(Token::parse_hex(&printed), Ok(token));
    assert!(token.same_as(&token));
});
