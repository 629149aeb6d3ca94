//! Object and component routes: a component's decoded little-endian bytes with ranges (or its
//! stored zstd frame, negotiated), a slice of a dense object (`?slice=` or `?shard=&dim=`), or
//! an object's JSON description when it has several components. The bytes, digests and
//! versions come from the service; this reads the query and sets headers.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};

use super::models::model_version;
use super::{ApiError, AppState, ReadyModel, header_value};
use crate::api;
use crate::catalog::Model;
use crate::format::json::object_json;
use crate::format::slice::SliceError;
use crate::format::{Component, Object};
use crate::service::{ComponentRequest, Cut, OpenModel, ResolvedSlice, ServiceError, SliceRequest};
use crate::transport::respond::{ExtraHeaders, Representation, bytes_response};

type QueryPairs = Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>;

/// The slice a query asks for: `slice=SPEC`, or `shard=RANK/WORLD` with `dim=D`; `None` when
/// it names neither. Each key at most once, and never both forms.
fn slice_request(pairs: &[(String, String)]) -> Result<Option<SliceRequest<'_>>, SliceError> {
    let syntax = |detail: &str| SliceError::Syntax { spec: String::new(), detail: detail.to_owned() };
    let one = |key: &str| -> Result<Option<&str>, SliceError> {
        let mut values = pairs.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let first = values.next();
        match values.next() {
            Some(_) => Err(syntax(&format!("{key} is given more than once"))),
            None => Ok(first),
        }
    };
    match (one("slice")?, one("shard")?, one("dim")?) {
        (None, None, None) => Ok(None),
        (Some(spec), None, None) => Ok(Some(SliceRequest::Spec(spec))),
        (None, Some(split), Some(dim)) => Ok(Some(SliceRequest::Shard { split, dim })),
        (None, Some(_), None) => Err(syntax("shard needs dim, the dimension to split")),
        (None, None, Some(_)) => Err(syntax("dim is given without shard")),
        (Some(_), _, _) => Err(syntax("give slice or shard with dim, not both")),
    }
}

/// The query's pairs, or a 400 for a query that is not `key=value&…`.
fn query_pairs(query: QueryPairs) -> Result<Vec<(String, String)>, ApiError> {
    query.map(|Query(pairs)| pairs).map_err(|e| ApiError::BadRequest(format!("the query string is malformed: {e}")))
}

/// The slice of `object` the query asks for, checked against it (refused at once unless
/// `object` is one dense tensor and the slice lies within it), its refusal naming the object.
fn slice_of(model: &Model, object: &Object, pairs: &[(String, String)]) -> Result<Option<ResolvedSlice>, ApiError> {
    let request = slice_request(pairs).map_err(|source| ServiceError::BadSlice {
        model: model.id.clone(),
        object: object.name.clone(),
        source,
    })?;
    Ok(request.map(|request| ResolvedSlice::resolve(model, object, request)).transpose()?)
}

/// `GET /models/{m}/objects/{o}`: the only component's bytes, or the object's description.
pub(super) async fn object(
    State(state): State<Arc<AppState>>,
    ready: ReadyModel,
    method: Method,
    headers: HeaderMap,
    query: QueryPairs,
) -> Result<Response, ApiError> {
    let pairs = query_pairs(query)?;
    let open = &ready.open;
    let model = open.model();
    let object = find_object(open, ready.param("object"))?;
    let slice = slice_of(model, object, &pairs)?;
    match &object.components[..] {
        // A slice is only ever of a dense object's one component (`slice_of`).
        [only] => {
            let part = Part { open, object, component: only };
            component_bytes(&state, &method, &headers, ready.cache.clone(), part, slice.as_ref()).await
        }
        _ => {
            let mut doc = object_json(object);
            super::manifest::add_urls(&mut doc, model, object);
            Ok(([model_version(model), ready.cache.clone()], Json(doc)).into_response())
        }
    }
}

/// `GET /models/{m}/objects/{o}/components/{role}`: that component's bytes.
pub(super) async fn component(
    State(state): State<Arc<AppState>>,
    ready: ReadyModel,
    method: Method,
    headers: HeaderMap,
    query: QueryPairs,
) -> Result<Response, ApiError> {
    let pairs = query_pairs(query)?;
    let open = &ready.open;
    let object = find_object(open, ready.param("object"))?;
    let component = open.component(object, ready.param("role"))?;
    let slice = slice_of(open.model(), object, &pairs)?;
    let part = Part { open, object, component };
    component_bytes(&state, &method, &headers, ready.cache.clone(), part, slice.as_ref()).await
}

fn find_object<'m>(open: &'m OpenModel, name: &str) -> Result<&'m Object, ApiError> {
    tracing::Span::current().record("object", name);
    Ok(open.object(name)?)
}

/// Whether the request accepts the `zstd` content coding (listed with a non-zero weight).
fn accepts_zstd(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            coding.eq_ignore_ascii_case("zstd")
                && parts.all(|p| match p.trim().split_once('=') {
                    Some((name, weight)) if name.trim().eq_ignore_ascii_case("q") => {
                        weight.trim().parse::<f32>().is_ok_and(|q| q > 0.0)
                    }
                    _ => true,
                })
        },
    )
}

/// `sha-256=:<base64>:`, the RFC 9530 form.
fn repr_digest(sha256: &[u8; 32]) -> HeaderValue {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(sha256);
    HeaderValue::from_str(&format!("sha-256=:{encoded}:")).expect("base64 is a valid header value")
}

/// The component a request is for.
struct Part<'a> {
    open: &'a OpenModel,
    object: &'a Object,
    component: &'a Component,
}

/// A component's bytes, or a slice of them, with the contract's headers.
async fn component_bytes(
    state: &Arc<AppState>,
    method: &Method,
    headers: &HeaderMap,
    cache: (HeaderName, HeaderValue),
    Part { open, object, component }: Part<'_>,
    slice: Option<&ResolvedSlice>,
) -> Result<Response, ApiError> {
    let head = method == Method::HEAD;
    let cut = match slice {
        Some(slice) => Cut::Slice(slice),
        None if headers.contains_key(header::RANGE) => Cut::Ranges,
        None => Cut::Whole,
    };
    let request = ComponentRequest { cut, head, accepts_zstd: accepts_zstd(headers) };
    let bytes = open.component_bytes(object, component, request).await?;
    let model = open.model();
    let shape = slice.map_or_else(|| object.shape.clone(), |s| s.slice.shape());
    let span = tracing::Span::current();
    if let Some(digest) = bytes.digest {
        span.record("digest", digest.as_str());
    }
    if let Some(cache) = bytes.cache {
        span.record("cache", cache.as_str());
    }
    let mut extra: ExtraHeaders = vec![
        model_version(model),
        cache,
        (HeaderName::from_static(api::headers::DTYPE), header_value(component.dtype.name())),
        (HeaderName::from_static(api::headers::FORMAT), header_value(&api::segment(&object.format))),
        (
            HeaderName::from_static(api::headers::SHAPE),
            header_value(&shape.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        ),
    ];
    if let Some(slice) = slice {
        extra.push((HeaderName::from_static(api::headers::SLICE), header_value(&slice.slice.to_string())));
    }
    if let Some(logical) = &component.logical_type {
        extra.push((HeaderName::from_static(api::headers::TYPE), header_value(&api::segment(logical))));
    }
    if bytes.varies_with_encoding {
        extra.push((header::VARY, HeaderValue::from_static("accept-encoding")));
    }
    if bytes.zstd_passthrough {
        extra.push((header::CONTENT_ENCODING, HeaderValue::from_static("zstd")));
    }
    if let Some(sha256) = &bytes.sha256 {
        extra.push((HeaderName::from_static(api::headers::REPR_DIGEST), repr_digest(sha256)));
    }
    let representation = Representation {
        source: bytes.source,
        etag: bytes.etag,
        content_type: "application/octet-stream",
        headers: extra,
        guard: bytes.guard,
    };
    bytes_response(headers, head, representation, state.config().limits.max_ranges).await.map_err(ApiError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(value: &str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
        accepts_zstd(&headers)
    }

    #[test]
    fn zstd_is_accepted_only_when_listed_with_a_non_zero_weight() {
        assert!(accepts("zstd"));
        assert!(accepts("gzip, ZSTD;q=0.5, br"));
        assert!(accepts("zstd ; q=1.0"));
        assert!(!accepts("zstd;q=0"));
        assert!(!accepts("zstd;q=0.000"));
        assert!(!accepts("gzip, br"));
        assert!(!accepts("*"));
        assert!(!accepts("zstdx"));
        assert!(!accepts("zstd;q=abc"));
    }

    #[test]
    fn repr_digest_is_base64_between_colons() {
        let value = repr_digest(&[0u8; 32]);
        assert_eq!(value, "sha-256=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:");
    }
}
