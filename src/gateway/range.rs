//! GET ranges (RFC 9110, section 14.1.2) as the backend is given them.
//!
//! The filesystem backend gets two cases of suffix ranges wrong: a suffix
//! longer than the object fails (it seeks before the file's start), and on
//! an empty object it answers a range whose last byte is 2^64 - 1. So a
//! suffix is resolved here, against the object's length, into the
//! first-byte range it selects, which the backend serves right; and what
//! selects nothing is refused (416) before the backend sees it.
//!
//! Also compiled into the `range` fuzz target (`fuzz/`).

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
