//! A GET's `Range` header as hipobj-s3-server reads it: s3s's parser, the
//! server's resolution of suffixes against the object's length (its own
//! `range.rs`, compiled in here) and the backend's satisfiability check;
//! the object's length is the input's first eight bytes. Whatever the
//! header, the server gives the backend a non-empty part of the object or
//! refuses the range, and a parsed range prints back to itself.
#![no_main]

#[path = "../../src/gateway/range.rs"]
#[allow(dead_code)]
mod range;

use libfuzzer_sys::fuzz_target;
use s3s::dto::Range;

fuzz_target!(|data: &[u8]| {
    let Some((length, header)) = data.split_first_chunk::<8>() else {
        return;
    };
    let len = u64::from_le_bytes(*length);
    let Ok(header) = std::str::from_utf8(header) else {
        return;
    };
    let Ok(parsed) = Range::parse(header) else {
        return;
    };
    let printed = parsed.to_header_string();
    let again = Range::parse(&printed).ok().map(|r| r.to_header_string());
    assert_eq!(again.as_deref(), Some(&*printed));
    // What RFC 9110 selects: the first and last byte of the part.
    let selected = match parsed {
        Range::Int { first, last } => {
            (first < len).then(|| (first, last.map_or(len - 1, |l| l.min(len - 1))))
        }
        Range::Suffix { length } => {
            (length > 0 && len > 0).then(|| (len - length.min(len), len - 1))
        }
    };
    match range::for_backend(parsed, len) {
        Some(given) => {
            let part = given
                .check(len)
                .expect("what the backend is given is satisfiable");
            assert!(
                part.start < part.end && part.end <= len,
                "{part:?} of {len}"
            );
            assert_eq!(Some((part.start, part.end - 1)), selected);
        }
        None => assert_eq!(selected, None),
    }
});
