//! `parse_header`: the `x-amz-rdma-token` header's value as an S3 server
//! receives it, with the original clients' `:<addr>:<size>` suffix
//! (`"%s:%016lx:%016lx"`). What parses is the token of its first 88 digits,
//! and a suffix is two hexadecimal numbers (with or without `0x`, one to
//! sixteen digits) whose size is the token's length.
#![no_main]

use hipobj::core::token::{parse_header, Token, TOKEN_HEX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(token) = parse_header(data) else {
        return;
    };
    assert_eq!(Token::parse_hex(&data[..TOKEN_HEX_LEN]), Ok(token));
    let suffix = &data[TOKEN_HEX_LEN..];
    if !suffix.is_empty() {
        let parts: Vec<&[u8]> = suffix[1..].split(|&b| b == b':').collect();
        assert_eq!(suffix[0], b':');
        assert_eq!(parts.len(), 2);
        let mut numbers = parts.iter().map(|part| {
            let text = std::str::from_utf8(part).unwrap();
            let digits = text
                .strip_prefix("0x")
                .or_else(|| text.strip_prefix("0X"))
                .unwrap_or(text);
            assert!((1..=16).contains(&digits.len()), "{text}");
            u64::from_str_radix(digits, 16).unwrap()
        });
        numbers.next();
        let size = numbers.next().unwrap();
        assert_eq!(size, token.length);
    }
});
