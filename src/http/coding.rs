//! The JSON routes' content codings: gzip or zstd when the client accepts it, and strong
//! ETags that name the coding, so a cache never takes one coding's bytes for another's.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;

/// gzip or zstd for the JSON routes when the client accepts it: the manifest of a model of
/// thousands of tensors runs to megabytes of repetitive text. Only on these routes, so tensor
/// bytes are never touched (a stored zstd frame is passed through by its own route).
pub(super) fn compressed_json() -> tower_http::compression::CompressionLayer<impl tower_http::compression::Predicate> {
    use tower_http::compression::Predicate as _;
    let json = |_: axum::http::StatusCode,
                _: axum::http::Version,
                headers: &axum::http::HeaderMap,
                _: &axum::http::Extensions| {
        headers.get(axum::http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
    };
    tower_http::compression::CompressionLayer::new()
        .compress_when(tower_http::compression::predicate::SizeAbove::new(1024).and(json))
}

/// The content codings the JSON routes may answer with, as they tag ETags.
const CODINGS: [&str; 2] = ["gzip", "zstd"];

/// A compressed manifest is a representation of its own, so its strong ETag names the coding
/// (`"…-gzip"`): a cache never takes one coding's bytes for another's. An `If-None-Match` naming
/// a coded tag is compared as the tag it was made from, and a 304 answers with the tag the
/// client sent.
pub(super) async fn coded_etags(mut request: Request, next: axum::middleware::Next) -> Response {
    use axum::http::header::{CONTENT_ENCODING, ETAG, IF_NONE_MATCH};
    let uncoded = |tag: &str| {
        CODINGS.iter().find_map(|coding| {
            let base = tag.strip_suffix(&format!("-{coding}\""))?;
            Some((format!("{base}\""), *coding))
        })
    };
    // The coded tags the client sent, by the tag each was made from.
    let mut sent: Vec<(String, &'static str)> = Vec::new();
    if let Some(value) = request.headers().get(IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let tags: Vec<String> = value
            .split(',')
            .map(|tag| {
                let tag = tag.trim();
                match uncoded(tag) {
                    Some((base, coding)) => {
                        sent.push((base.clone(), coding));
                        base
                    }
                    None => tag.to_owned(),
                }
            })
            .collect();
        if !sent.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&tags.join(", ")) {
                request.headers_mut().insert(IF_NONE_MATCH, value);
            }
        }
    }
    let mut response = next.run(request).await;
    let etag = response.headers().get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let coding = match response.headers().get(CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        Some(coding) => CODINGS.iter().copied().find(|c| *c == coding),
        None if response.status() == axum::http::StatusCode::NOT_MODIFIED => {
            sent.iter().find(|(base, _)| Some(base) == etag.as_ref()).map(|(_, coding)| *coding)
        }
        None => None,
    };
    if let (Some(etag), Some(coding)) = (etag, coding) {
        if let Some(base) = etag.strip_suffix('"') {
            if let Ok(value) = HeaderValue::from_str(&format!("{base}-{coding}\"")) {
                response.headers_mut().insert(ETAG, value);
            }
        }
    }
    response
}
