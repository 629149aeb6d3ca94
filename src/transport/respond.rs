//! Byte responses, shared by every protocol that answers plain HTTP GETs for bytes (the HTTP
//! routes, the Hub API's `resolve`): applies the pure range and conditional decisions of
//! [`super::range`] to one representation whose bytes come from a [`ByteSource`] (a slice of a
//! file's mapping, or a decode), and builds 200, 206 (single or `multipart/byteranges`) and
//! 304; what it refuses is a [`ByteRefusal`], which each protocol words in its own errors.
//! Bodies stream: the first piece is taken before the headers are sent, so a source that
//! fails at once answers a clean error; a later failure, or a failed [`Guard`], aborts the
//! body before its last byte so it never ends cleanly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::{self};

use super::range::{RangeDecision, evaluate, if_none_match_matches, if_range_allows};
use crate::served::{BodyAborted, ByteSource, ByteStream, Guard, guarded};

/// Why a byte response could not be given; `E` is how its source fails.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ByteRefusal<E> {
    #[error("range not satisfiable: the representation is {length} bytes")]
    RangeNotSatisfiable { length: u64 },
    #[error("{requested} ranges requested; at most {limit} are served per request")]
    TooManyRanges { requested: usize, limit: usize, length: u64 },
    /// The source failed before the first byte.
    #[error(transparent)]
    Source(#[from] E),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Headers every byte response carries besides the standard ones (`X-Zt-*`, `Vary`, …).
pub(crate) type ExtraHeaders = Vec<(HeaderName, HeaderValue)>;

/// One representation of a resource and how to answer for it, its bytes failing with `E`.
pub(crate) struct Representation<E> {
    pub source: Arc<dyn ByteSource<Error = E>>,
    pub etag: String,
    pub content_type: &'static str,
    pub headers: ExtraHeaders,
    pub guard: Option<Guard>,
}

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

/// Takes the first piece before any header is sent, so a source that fails at once is
/// answered with its error rather than a broken body.
pub(crate) async fn primed<E: Send + 'static>(mut body: ByteStream<E>) -> Result<ByteStream<E>, ByteRefusal<E>> {
    match body.next().await {
        None => Ok(stream::empty().boxed()),
        Some(Err(e)) => Err(e.into()),
        Some(Ok(first)) => Ok(stream::once(async { Ok(first) }).chain(body).boxed()),
    }
}

/// A body whose errors are logged and turned into the aborted connection hyper makes of them.
pub(crate) fn body_of<E: std::fmt::Display + Send + 'static>(stream: ByteStream<E>) -> Body {
    Body::from_stream(stream.map(|piece| {
        piece.map_err(|e| {
            tracing::warn!(error = %e, "response body aborted");
            std::io::Error::other(e.to_string())
        })
    }))
}

/// `Cache-Control` of every model response: a shared cache may store it, and revalidates it by
/// its ETag before each use (so a replaced model is never served stale, and each use is checked
/// against the requester's token by the origin).
pub(crate) const REVALIDATE: HeaderValue = HeaderValue::from_static("public, no-cache");

/// Answers a GET (or, when `head`, a HEAD) for `representation`.
pub(crate) async fn bytes_response<E: BodyAborted + std::fmt::Display + Send + 'static>(
    request: &HeaderMap,
    head: bool,
    representation: Representation<E>,
    max_ranges: usize,
) -> Result<Response, ByteRefusal<E>> {
    let Representation { source, etag, content_type, headers: extra, guard } = representation;
    let len = source.byte_len();
    let etag_value =
        HeaderValue::from_str(&etag).map_err(|e| ByteRefusal::Internal(format!("bad etag {etag:?}: {e}")))?;
    let mut builder = Response::builder().header(header::ETAG, etag_value).header(header::ACCEPT_RANGES, "bytes");
    if !extra.iter().any(|(name, _)| name == header::CACHE_CONTROL) {
        builder = builder.header(header::CACHE_CONTROL, REVALIDATE);
    }
    for (name, value) in extra {
        builder = builder.header(name, value);
    }
    if if_none_match_matches(header_str(request, &header::IF_NONE_MATCH), &etag) {
        return Ok(builder.status(StatusCode::NOT_MODIFIED).body(Body::empty()).expect("valid response"));
    }
    let range =
        header_str(request, &header::RANGE).filter(|_| if_range_allows(header_str(request, &header::IF_RANGE), &etag));
    let (builder, content_length, body): (_, u64, Option<ByteStream<E>>) = match evaluate(range, len, max_ranges) {
        RangeDecision::Full => {
            let body = if head { None } else { Some(primed(source.open_range(0..len)).await?) };
            (builder.status(StatusCode::OK).header(header::CONTENT_TYPE, content_type), len, body)
        }
        RangeDecision::Partial(ranges) if ranges.len() == 1 => {
            let r = ranges[0].clone();
            let builder = builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_TYPE, content_type)
                .header(header::CONTENT_RANGE, format!("bytes {}-{}/{len}", r.start, r.end - 1));
            let body = if head { None } else { Some(primed(source.open_range(r.clone())).await?) };
            (builder, r.end - r.start, body)
        }
        RangeDecision::Partial(ranges) => {
            let boundary = boundary();
            let heads: Vec<Bytes> = ranges
                .iter()
                .map(|r| {
                    Bytes::from(format!(
                        "\r\n--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {}-{}/{len}\r\n\r\n",
                        r.start,
                        r.end - 1
                    ))
                })
                .collect();
            let tail = Bytes::from(format!("\r\n--{boundary}--\r\n"));
            let total = heads.iter().map(|h| h.len() as u64).sum::<u64>()
                + ranges.iter().map(|r| r.end - r.start).sum::<u64>()
                + tail.len() as u64;
            let builder = builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_TYPE, format!("multipart/byteranges; boundary={boundary}"));
            let body = (!head).then(|| {
                // Each part is opened only when the previous one is sent.
                let parts = heads.into_iter().zip(ranges).map(move |(head, r)| {
                    let source = Arc::clone(&source);
                    stream::once(async move { Ok(head) })
                        .chain(stream::once(async move { source.open_range(r) }).flatten())
                });
                stream::iter(parts).flatten().chain(stream::once(async move { Ok(tail) })).boxed()
            });
            (builder, total, body)
        }
        RangeDecision::Unsatisfiable => return Err(ByteRefusal::RangeNotSatisfiable { length: len }),
        RangeDecision::TooManyRanges { requested, limit } => {
            return Err(ByteRefusal::TooManyRanges { requested, limit, length: len });
        }
    };
    let body = match (body, guard) {
        (None, _) => Body::empty(),
        (Some(body), Some(guard)) => body_of(guarded(body, guard)),
        (Some(body), None) => body_of(body),
    };
    builder.header(header::CONTENT_LENGTH, content_length).body(body).map_err(|e| ByteRefusal::Internal(e.to_string()))
}
