//! GET ranges (RFC 9110, section 14.1.2) as the backend is given them.
//!
//! The filesystem backend gets two cases of suffix ranges wrong: a suffix
//! longer than the object fails (it seeks before the file's start), and on
//! an empty object it answers a range whose last byte is 2^64 - 1. So a
//! suffix is resolved here, against the object's length, into the
//! first-byte range it selects, which the backend serves right; and what
//! selects nothing is refused (416) before the backend sees it.
//!
//! Its property (below, `any_range_header_...`) was a fuzz target until
//! 2026-12-06; it runs in the host suite now, with the fuzz target's seeds
//! and its regression as fixed cases (docs/reliability.md).

use s3s::dto::{GetObjectOutput, Range};

/// The range the backend is given for `range` of an object of `len`
/// bytes, or `None` if `range` selects none of it (416 Range Not
/// Satisfiable). A suffix becomes `bytes=<first>-`, the whole object when
/// it is longer than the object; other ranges pass unchanged.
pub fn for_backend(range: Range, len: u64) -> Option<Range> {
    match range {
        Range::Suffix { length } if length == 0 || len == 0 => None,
        Range::Suffix { length } => Some(Range::Int {
            first: len - length.min(len),
            last: None,
        }),
        Range::Int { first, .. } if first >= len => None,
        int @ Range::Int { .. } => Some(int),
    }
}

/// Where a GetObject answer's bytes start in the object, and the object's
/// whole length: from its `Content-Range` (`bytes FIRST-LAST/TOTAL`), or
/// the whole object of `length` bytes without one.
pub fn span(output: &GetObjectOutput, length: u64) -> (u64, u64) {
    let parsed = output.content_range.as_deref().and_then(|r| {
        let (range, total) = r.strip_prefix("bytes ")?.split_once('/')?;
        let first = range.split_once('-')?.0.parse().ok()?;
        Some((first, total.parse().ok()?))
    });
    parsed.unwrap_or((0, length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn int(first: u64, last: Option<u64>) -> Option<Range> {
        Some(Range::Int { first, last })
    }

    #[test]
    fn a_suffix_selects_the_objects_last_bytes_or_all_of_it() {
        assert_eq!(
            for_backend(Range::Suffix { length: 10 }, 100),
            int(90, None)
        );
        assert_eq!(
            for_backend(Range::Suffix { length: 100 }, 100),
            int(0, None)
        );
        assert_eq!(
            for_backend(Range::Suffix { length: 101 }, 100),
            int(0, None)
        );
        assert_eq!(
            for_backend(Range::Suffix { length: u64::MAX }, 1),
            int(0, None)
        );
    }

    #[test]
    fn nothing_is_selected_of_an_empty_object_or_by_an_empty_suffix() {
        assert_eq!(for_backend(Range::Suffix { length: 5 }, 0), None);
        assert_eq!(for_backend(Range::Suffix { length: 0 }, 100), None);
        assert_eq!(
            for_backend(
                Range::Int {
                    first: 0,
                    last: None
                },
                0
            ),
            None
        );
        assert_eq!(
            for_backend(
                Range::Int {
                    first: 100,
                    last: Some(200)
                },
                100
            ),
            None
        );
        assert_eq!(
            for_backend(
                Range::Int {
                    first: 99,
                    last: Some(200)
                },
                100
            ),
            int(99, Some(200))
        );
    }

    /// What RFC 9110 selects of an object of `len` bytes for a parsed
    /// `header`, checked against what the backend is given: a non-empty
    /// part of the object, exactly the bytes selected, or `None` where
    /// nothing is selected (416); and a parsed range prints back to itself.
    /// Headers s3s refuses are not the server's concern (400 before here).
    fn gives_the_backend_what_is_selected(header: &str, len: u64) -> Result<(), TestCaseError> {
        let Ok(parsed) = Range::parse(header) else {
            return Ok(());
        };
        let printed = parsed.to_header_string();
        let again = Range::parse(&printed).ok().map(|r| r.to_header_string());
        prop_assert_eq!(again.as_deref(), Some(&*printed), "{:?}", header);
        let selected = match parsed {
            Range::Int { first, last } => {
                (first < len).then(|| (first, last.map_or(len - 1, |l| l.min(len - 1))))
            }
            Range::Suffix { length } => {
                (length > 0 && len > 0).then(|| (len - length.min(len), len - 1))
            }
        };
        match for_backend(parsed, len) {
            Some(given) => {
                let part = given.check(len);
                prop_assert!(
                    part.is_ok(),
                    "{:?} of {}: {:?} is not satisfiable",
                    header,
                    len,
                    given
                );
                let part = part.unwrap();
                prop_assert!(
                    part.start < part.end && part.end <= len,
                    "{:?} of {}",
                    part,
                    len
                );
                prop_assert_eq!(
                    Some((part.start, part.end - 1)),
                    selected,
                    "{:?} of {}",
                    header,
                    len
                );
            }
            None => prop_assert_eq!(selected, None, "{:?} of {}", header, len),
        }
        Ok(())
    }

    /// The former fuzz target's seeds and its regression (a suffix range of
    /// an empty object, which s3s's own check answers with `0..0`), each
    /// with the object length its first eight bytes gave; then one more
    /// suffix longer than its object.
    #[test]
    fn the_former_fuzz_targets_seeds_and_regression() {
        let cases: [(&str, u64); 9] = [
            ("bytes=2147483640-4294967300", 8 << 30),
            ("bytes=0-0", 0),
            ("bytes=0-99", 1000),
            ("bytes=10-", 1000),
            ("items=0-1", 5),
            ("bytes=20-30", 10),
            ("bytes=-5", 1000),
            ("bytes=-0013920724545138735320", 0),
            ("bytes=-20", 10),
        ];
        for (header, len) in cases {
            gives_the_backend_what_is_selected(header, len).unwrap();
        }
    }

    /// A number as headers carry them: small, near the object's length,
    /// anywhere in u64, past u64, or with leading zeros.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..300).prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            Just(u64::MAX.to_string()),
            "[0-9]{1,25}",
        ]
    }

    fn header() -> impl Strategy<Value = String> {
        prop_oneof![
            (number(), number()).prop_map(|(a, b)| format!("bytes={a}-{b}")),
            number().prop_map(|a| format!("bytes={a}-")),
            number().prop_map(|n| format!("bytes=-{n}")),
            "bytes=[-0-9, ]{0,24}",
            "[ -~]{0,32}",
        ]
    }

    fn length() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..4, 0u64..300, any::<u64>(), Just(u64::MAX)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        #[test]
        fn any_range_header_gives_the_backend_exactly_what_rfc_9110_selects(
            header in header(),
            len in length(),
        ) {
            gives_the_backend_what_is_selected(&header, len)?;
        }
    }

    #[test]
    fn an_answer_s_bytes_start_where_its_content_range_says() {
        let whole = GetObjectOutput::default();
        assert_eq!(span(&whole, 100), (0, 100));
        let ranged = GetObjectOutput {
            content_range: Some("bytes 10-19/100".to_owned()),
            ..GetObjectOutput::default()
        };
        assert_eq!(span(&ranged, 10), (10, 100));
        let odd = GetObjectOutput {
            content_range: Some("items 1-2/3".to_owned()),
            ..GetObjectOutput::default()
        };
        assert_eq!(span(&odd, 7), (0, 7), "not a byte range: the whole answer");
    }
}
