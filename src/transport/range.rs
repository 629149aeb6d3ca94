//! Pure evaluation of `Range`, `If-Range` and `If-None-Match` against a representation's length
//! and strong ETag, per RFC 9110 §13–14. No IO and no HTTP types: header values in, a decision
//! out, so every edge case is a row in a table test.

use std::ops::Range;

/// What to answer to a GET given its `Range` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeDecision {
    /// 200 with the whole representation: no `Range`, an unknown unit, an invalid header
    /// (RFC 9110 §14.2: a server may ignore it), or an `If-Range` that does not match.
    Full,
    /// 206 with these satisfiable ranges, in request order (one: a plain body; several:
    /// `multipart/byteranges`).
    Partial(Vec<Range<u64>>),
    /// 416: a valid header none of whose ranges overlaps the representation.
    Unsatisfiable,
    /// The header asks for more ranges than the configured limit.
    TooManyRanges { requested: usize, limit: usize },
}

/// Evaluates `Range` (already gated by `If-Range`, see [`if_range_allows`]) for a
/// representation of `len` bytes.
pub(crate) fn evaluate(range: Option<&str>, len: u64, max_ranges: usize) -> RangeDecision {
    let Some(header) = range else { return RangeDecision::Full };
    let Some(specs) = parse(header) else { return RangeDecision::Full };
    if specs.len() > max_ranges {
        return RangeDecision::TooManyRanges { requested: specs.len(), limit: max_ranges };
    }
    let satisfiable: Vec<Range<u64>> = specs.into_iter().filter_map(|spec| spec.resolve(len)).collect();
    if satisfiable.is_empty() {
        RangeDecision::Unsatisfiable
    } else {
        RangeDecision::Partial(without_overlaps(satisfiable))
    }
}

/// Ranges that overlap are merged, in ascending order (RFC 9110 §14.2 lets a server coalesce
/// them). Otherwise `bytes=0-,0-,0-…` would make a response `max_ranges` times the size of
/// the representation from a request of a few bytes. Disjoint ranges keep the client's order.
fn without_overlaps(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    let mut sorted = ranges.clone();
    sorted.sort_by_key(|r| r.start);
    if sorted.windows(2).all(|pair| pair[0].end <= pair[1].start) {
        return ranges;
    }
    ranges.clear();
    for range in sorted {
        match ranges.last_mut() {
            Some(last) if range.start < last.end => last.end = last.end.max(range.end),
            _ => ranges.push(range),
        }
    }
    ranges
}

/// One `range-spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    /// `first-last` or `first-` (last = None). Positions past u64 saturate: they are merely
    /// unsatisfiable, not malformed.
    FromTo { first: u64, last: Option<u64> },
    /// `-suffix`.
    Suffix(u64),
}

impl Spec {
    fn resolve(self, len: u64) -> Option<Range<u64>> {
        match self {
            Spec::FromTo { first, last } => {
                if first >= len {
                    return None;
                }
                let end = last.map_or(len, |last| last.saturating_add(1).min(len));
                Some(first..end)
            }
            Spec::Suffix(0) => None,
            Spec::Suffix(n) => (len > 0).then(|| len - n.min(len)..len),
        }
    }
}

/// Parses `bytes=1#range-spec`; `None` when the header is not a valid bytes range set.
fn parse(header: &str) -> Option<Vec<Spec>> {
    let (unit, set) = header.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut specs = Vec::new();
    // `#` lists tolerate empty elements (RFC 9110 §5.6.1.2).
    for element in set.split(',').map(|e| e.trim_matches([' ', '\t'])).filter(|e| !e.is_empty()) {
        let (first, last) = element.split_once('-')?;
        let spec = match (first, last) {
            ("", suffix) => Spec::Suffix(number(suffix)?),
            (first, "") => Spec::FromTo { first: number(first)?, last: None },
            (first, last) => {
                let (first, last) = (number(first)?, number(last)?);
                if last < first {
                    return None;
                }
                Spec::FromTo { first, last: Some(last) }
            }
        };
        specs.push(spec);
    }
    (!specs.is_empty()).then_some(specs)
}

/// `1*DIGIT`, saturating at u64::MAX.
fn number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.bytes().fold(0u64, |acc, d| acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
}

/// Whether `If-Range` lets the `Range` header apply: absent, or a strong ETag equal to ours.
/// A weak tag never matches (RFC 9110 §13.1.5 requires strong comparison), and neither does a
/// date: ztserve validates with ETags only, and a date cannot prove the bytes are unchanged
/// within its one-second resolution.
pub(crate) fn if_range_allows(if_range: Option<&str>, etag: &str) -> bool {
    match if_range.map(str::trim) {
        None => true,
        Some(tag) => !tag.starts_with("W/") && tag == etag,
    }
}

/// Whether `If-None-Match` matches our ETag (weak comparison, or `*`): answer 304.
pub(crate) fn if_none_match_matches(if_none_match: Option<&str>, etag: &str) -> bool {
    let Some(header) = if_none_match else { return false };
    let ours = etag.trim_start_matches("W/");
    header.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == ours)
}

#[cfg(test)]
// The tables list the ranges each header resolves to; a list of one range is a case in itself.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::RangeDecision::*;
    use super::*;

    #[test]
    fn range_headers_are_evaluated_per_rfc_9110() {
        let cases: &[(Option<&str>, u64, RangeDecision)] = &[
            (None, 100, Full),
            (Some("bytes=0-9"), 100, Partial(vec![0..10])),
            (Some("bytes=90-"), 100, Partial(vec![90..100])),
            (Some("bytes=-10"), 100, Partial(vec![90..100])),
            (Some("bytes=-1000"), 100, Partial(vec![0..100])),
            (Some("bytes=95-200"), 100, Partial(vec![95..100])),
            (Some("bytes=99-99"), 100, Partial(vec![99..100])),
            (Some("bytes=0-0,-1"), 100, Partial(vec![0..1, 99..100])),
            (Some("bytes=0-4, 10-14 ,20-"), 30, Partial(vec![0..5, 10..15, 20..30])),
            (Some("bytes=0-4,,10-14"), 30, Partial(vec![0..5, 10..15])),
            (Some("BYTES=0-4"), 30, Partial(vec![0..5])),
            (Some("bytes=0-1,50-60"), 30, Partial(vec![0..2])),
            (Some("bytes=100-"), 100, Unsatisfiable),
            (Some("bytes=100-200"), 100, Unsatisfiable),
            (Some("bytes=-0"), 100, Unsatisfiable),
            (Some("bytes=0-"), 0, Unsatisfiable),
            (Some("bytes=-5"), 0, Unsatisfiable),
            (Some("bytes=99999999999999999999999-"), 100, Unsatisfiable),
            (Some("bytes=0-99999999999999999999999"), 100, Partial(vec![0..100])),
            (Some("bytes=10-5"), 100, Full),
            (Some("bytes=abc"), 100, Full),
            (Some("bytes=1-2-3"), 100, Full),
            (Some("bytes=-"), 100, Full),
            (Some("bytes="), 100, Full),
            (Some("bytes=+1-2"), 100, Full),
            (Some("bytes=0x10-20"), 100, Full),
            (Some("items=0-5"), 100, Full),
            (Some("0-5"), 100, Full),
            (Some("bytes=0-1,0-1,0-1,0-1,0-1"), 100, TooManyRanges { requested: 5, limit: 4 }),
            // Overlapping ranges are merged, so no response exceeds the representation.
            (Some("bytes=0-,0-,0-,0-"), 100, Partial(vec![0..100])),
            (Some("bytes=50-59,0-9,5-14"), 100, Partial(vec![0..15, 50..60])),
            (Some("bytes=-10,95-"), 100, Partial(vec![90..100])),
            (Some("bytes=0-9,10-19"), 100, Partial(vec![0..10, 10..20])),
            (Some("bytes=20-29,0-9"), 100, Partial(vec![20..30, 0..10])),
        ];
        for (header, len, expected) in cases {
            assert_eq!(&evaluate(*header, *len, 4), expected, "Range: {header:?} over {len} bytes");
        }
    }

    #[test]
    fn if_range_needs_an_identical_strong_etag() {
        let etag = "\"abc\"";
        assert!(if_range_allows(None, etag));
        assert!(if_range_allows(Some("\"abc\""), etag));
        assert!(!if_range_allows(Some("\"abd\""), etag));
        assert!(!if_range_allows(Some("W/\"abc\""), etag));
        assert!(!if_range_allows(Some("Sat, 21 Nov 2026 20:00:00 GMT"), etag));
    }

    #[test]
    fn if_none_match_uses_weak_comparison_and_star() {
        let etag = "\"abc\"";
        assert!(if_none_match_matches(Some("\"abc\""), etag));
        assert!(if_none_match_matches(Some("W/\"abc\""), etag));
        assert!(if_none_match_matches(Some("\"x\", \"abc\""), etag));
        assert!(if_none_match_matches(Some("*"), etag));
        assert!(!if_none_match_matches(Some("\"abcd\""), etag));
        assert!(!if_none_match_matches(None, etag));
    }
}
