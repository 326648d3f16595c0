//! `parse_reply`: the bytes an application's `recvReply` hands back, which
//! the server wrote. A reply that parses stands for `err` or a status of
//! 100 to 599, carries a token only as `200:<token>`, and parses the same
//! with more trailing NUL, CR or LF bytes.
#![no_main]

use hipobj::core::reply::parse_reply;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(reply) = parse_reply(data) else {
        return;
    };
    assert!(reply.http_code == -1 || (100..=599).contains(&reply.http_code));
    if reply.peer.is_some() {
        assert_eq!(reply.http_code, 200);
    }
    let mut padded = data.to_vec();
    padded.extend_from_slice(b"\r\n\0");
    assert_eq!(parse_reply(&padded), Ok(reply));
});
