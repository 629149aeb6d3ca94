//! Byte responses: applies the pure range and conditional decisions of `range.rs` to one
//! representation held as `Bytes` (a slice of the file's mapping, or decoded bytes), so raw
//! local bytes reach the socket without a copy. Builds 200, 206 (single or
//! `multipart/byteranges`), 304 and the 416 errors.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;

use super::error::ApiError;
use super::range::{evaluate, if_none_match_matches, if_range_allows, RangeDecision};

/// Headers every byte response carries besides the standard ones (`X-Zt-*`).
pub type ExtraHeaders = Vec<(HeaderName, HeaderValue)>;

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A multipart boundary that cannot occur by accident: unique per response.
fn boundary() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("ztserve-{nanos:x}-{n:x}")
}

/// Answers a GET or HEAD for `body` (the whole representation) under `etag`.
pub fn bytes_response(
    request: &HeaderMap,
    body: Bytes,
    etag: &str,
    content_type: &'static str,
    extra: ExtraHeaders,
    max_ranges: usize,
) -> Result<Response, ApiError> {
    let len = body.len() as u64;
    let etag_value = HeaderValue::from_str(etag).map_err(|e| ApiError::Internal(format!("bad etag {etag:?}: {e}")))?;
    let mut builder = Response::builder()
        .header(header::ETAG, etag_value)
        .header(header::ACCEPT_RANGES, "bytes");
    for (name, value) in extra {
        builder = builder.header(name, value);
    }
    if if_none_match_matches(header_str(request, &header::IF_NONE_MATCH), etag) {
        return Ok(builder.status(StatusCode::NOT_MODIFIED).body(Body::empty()).expect("valid response"));
    }
    let range = header_str(request, &header::RANGE).filter(|_| if_range_allows(header_str(request, &header::IF_RANGE), etag));
    let response = match evaluate(range, len, max_ranges) {
        RangeDecision::Full => builder
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, content_type)
            .header(header::CONTENT_LENGTH, len)
            .body(Body::from(body)),
        RangeDecision::Partial(ranges) if ranges.len() == 1 => {
            let r = &ranges[0];
            builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_TYPE, content_type)
                .header(header::CONTENT_RANGE, format!("bytes {}-{}/{len}", r.start, r.end - 1))
                .header(header::CONTENT_LENGTH, r.end - r.start)
                .body(Body::from(body.slice(r.start as usize..r.end as usize)))
        }
        RangeDecision::Partial(ranges) => {
            let boundary = boundary();
            let mut parts: Vec<Bytes> = Vec::with_capacity(ranges.len() * 2 + 1);
            for r in &ranges {
                let head = format!(
                    "\r\n--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {}-{}/{len}\r\n\r\n",
                    r.start,
                    r.end - 1
                );
                parts.push(Bytes::from(head));
                parts.push(body.slice(r.start as usize..r.end as usize));
            }
            parts.push(Bytes::from(format!("\r\n--{boundary}--\r\n")));
            let total: usize = parts.iter().map(Bytes::len).sum();
            let stream = futures_util::stream::iter(parts.into_iter().map(Ok::<_, std::convert::Infallible>));
            builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_TYPE, format!("multipart/byteranges; boundary={boundary}"))
                .header(header::CONTENT_LENGTH, total)
                .body(Body::from_stream(stream))
        }
        RangeDecision::Unsatisfiable => return Err(ApiError::RangeNotSatisfiable { length: len }),
        RangeDecision::TooManyRanges { requested, limit } => {
            return Err(ApiError::TooManyRanges { requested, limit, length: len });
        }
    };
    response.map_err(|e| ApiError::Internal(e.to_string()))
}
