//! Model routes: the list, one model's manifest as JSON (rendered once per model version,
//! with an ETag), the stored files with ranges, and the files of its safetensors view.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::{ApiError, AppState, ReadyModel, header_value};
use crate::access::Access;
use crate::api;
use crate::catalog::Model;
use crate::service::{self, Held, ServiceError};
use crate::transport::range::if_none_match_matches;
use crate::transport::respond::{Representation, bytes_response};

/// `GET /models`: every model the request may read, with its status.
pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
) -> Result<Json<Value>, ApiError> {
    if !state.service.is_ready() {
        return Err(ServiceError::NotReady.into());
    }
    let listing = state.service.listing();
    let models: Vec<Value> = listing
        .models()
        .filter(|m| access.allows(&m.id))
        .map(|m| {
            let mut entry = json!({
                "id": m.id,
                "source": m.source.name,
                "size": m.size,
                "files": m.files.len(),
                "url": api::model_url(&m.id),
            });
            if let Some(container) = m.container {
                entry["container"] = json!(container.id());
            }
            if m.source.is_cached() {
                // Its stored files and the files beside it, as a prefetch fetches them.
                let held = listing.held(m);
                entry["disk_cache"] = json!({ "bytes": held.bytes, "complete": held.bytes == held.total });
                if m.source.failure().is_some() {
                    entry["serving_from"] = json!("disk_cache");
                }
            }
            let signature = listing.signature(m);
            if let Some(json) = signature.to_json() {
                entry["signature"] = json;
            }
            match (&m.state, listing.refusal(m)) {
                (Ok(_), Some(refused)) => {
                    entry["status"] = json!("broken");
                    let code = refused.reason().unwrap_or(refused.code());
                    entry["reason"] = json!({ "code": code, "message": refused.to_string() });
                }
                (Ok(manifest), None) => {
                    entry["status"] = json!("ok");
                    entry["objects"] = json!(manifest.objects.len());
                    entry["digests"] = listing.digest_progress(m).to_json();
                }
                (Err(e), _) => {
                    entry["status"] = json!("broken");
                    entry["reason"] = json!({ "code": e.code(), "message": e.to_string() });
                }
            }
            entry
        })
        .collect();
    Ok(Json(json!({ "models": models })))
}

/// `X-Zt-Model-Version` of `model`, on every response drawn from it.
pub(crate) fn model_version(model: &Model) -> (HeaderName, HeaderValue) {
    (HeaderName::from_static(api::headers::MODEL_VERSION), header_value(&service::model_version(model)))
}

/// `GET /models/{m}`: the manifest with each component's URL, rendered once per manifest.
pub(super) async fn manifest(ready: ReadyModel, headers: HeaderMap) -> Result<Response, ApiError> {
    let ReadyModel { open, cache, .. } = ready;
    // Not yet rendered, it is rendered on the blocking pool: a model of 100k tensors is tens of
    // MB of JSON (usually rendered already, in the background after the scan that found it).
    let rendered = match open.rendered_manifest_if_ready() {
        Some(rendered) => rendered,
        None => {
            let open = open.clone();
            tokio::task::spawn_blocking(move || open.rendered_manifest())
                .await
                .map_err(|e| ApiError::Internal(format!("rendering a manifest failed: {e}")))?
        }
    };
    let model = open.model();
    let (tag, body, len) = match open.signature().to_json() {
        Some(signature) => {
            let (tag, pieces) = super::manifest::with_signature(&rendered, &signature);
            let len = pieces.iter().map(|p| p.len()).sum::<usize>();
            let pieces = futures_util::stream::iter(pieces.map(Ok::<_, std::convert::Infallible>));
            (tag, axum::body::Body::from_stream(pieces), len)
        }
        None => (rendered.etag.clone(), axum::body::Body::from(rendered.body.clone()), rendered.body.len()),
    };
    let etag = (header::ETAG, header_value(&tag));
    let if_none_match = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok());
    if if_none_match_matches(if_none_match, &tag) {
        return Ok((StatusCode::NOT_MODIFIED, [etag, cache, model_version(model)]).into_response());
    }
    // Two pieces have no length of their own: it is said, not chunked.
    let length = (header::CONTENT_LENGTH, HeaderValue::from(len));
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            etag,
            cache,
            model_version(model),
            length,
        ],
        body,
    )
        .into_response())
}

/// `GET /models/{m}/file` and `/files/{name}`: a stored file, or a file beside the model
/// (config, tokenizer: its path below the model's directory, `/` written `%2F`), byte for byte,
/// with ranges. A file beside the model is not covered by the model version, so it is
/// revalidated by its own ETag even under a version-pinned URL.
pub(super) async fn file(
    State(state): State<Arc<AppState>>,
    ready: ReadyModel,
    method: axum::http::Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (file, kind) = match ready.params.iter().find(|(key, _)| key == "name") {
        Some((_, name)) => ready.open.file_named(name).await?,
        None => (ready.open.stored_file().await?, service::FoundFile::Stored),
    };
    let cache = match kind {
        service::FoundFile::Stored => ready.cache.clone(),
        service::FoundFile::Companion => (header::CACHE_CONTROL, crate::transport::respond::REVALIDATE),
    };
    file_response(&state, &headers, &method, &ready, file, cache, "application/octet-stream").await
}

/// The name of a file of a model's safetensors view a request names; any other name under a
/// model is no route. Extracted before the model, so a wrong name answers as no route would.
pub(crate) struct ViewFileName(String);

impl axum::extract::FromRequestParts<Arc<AppState>> for ViewFileName {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<AppState>,
    ) -> Result<ViewFileName, ApiError> {
        let params = axum::extract::RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("path is not valid percent-encoded UTF-8: {e}")))?;
        match params.iter().find(|(key, _)| *key == "view_file") {
            Some((_, name)) if crate::format::view::is_view_file_name(name) => Ok(ViewFileName(name.to_owned())),
            _ => Err(ApiError::RouteNotFound(parts.uri.path().to_owned())),
        }
    }
}

/// `GET /models/{m}/model.safetensors` (or the view's index and shards): a file of the model's
/// safetensors view, with ranges.
pub(super) async fn view_file(
    State(state): State<Arc<AppState>>,
    ViewFileName(name): ViewFileName,
    ready: ReadyModel,
    method: axum::http::Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let file = ready.open.view_file(&name).await?;
    let cache = ready.cache.clone();
    file_response(&state, &headers, &method, &ready, file, cache, crate::format::view::media_type(&name)).await
}

/// A whole file's answer (a stored file, a file of the view): ranges, conditionals, HEAD, and
/// the model's version and cache headers.
async fn file_response(
    state: &AppState,
    request: &HeaderMap,
    method: &axum::http::Method,
    ready: &ReadyModel,
    file: service::StoredBytes,
    cache: (HeaderName, HeaderValue),
    content_type: &'static str,
) -> Result<Response, ApiError> {
    let representation = Representation {
        source: file.source,
        etag: file.etag,
        content_type,
        headers: vec![model_version(ready.open.model()), cache],
        guard: None,
    };
    bytes_response(request, method == axum::http::Method::HEAD, representation, state.config().limits.max_ranges)
        .await
        .map_err(ApiError::from)
}

/// How much of `model` the disk cache holds, as JSON.
fn held_json(model: &Model, held: Held) -> Value {
    json!({
        "model": model.id,
        "cached_bytes": held.bytes,
        "total_bytes": held.total,
        "complete": held.bytes == held.total,
        "disk_cache": model.source.is_cached(),
    })
}

/// `GET /models/{m}/prefetch`: how much of the model (stored files and the files beside it)
/// the disk cache holds.
pub(super) async fn prefetch_progress(ready: ReadyModel) -> Response {
    let mut body = held_json(ready.open.model(), ready.open.held());
    body["done"] = json!(body["complete"]);
    (Json(body)).into_response()
}

/// `POST /models/{m}/prefetch`: fetches the whole model into the disk cache (or joins the
/// fetch under way) and streams its progress as JSON lines, one every half second; the last
/// has `done: true`, and `error` when the fetch failed. A model of a source without a disk
/// cache is done at once.
pub(super) async fn prefetch(State(state): State<Arc<AppState>>, ready: ReadyModel) -> Response {
    let ReadyModel { open, .. } = ready;
    let running = open.model().source.is_cached().then(|| open.prefetch());
    // Each line reads the current catalog: a prefetch may outlast the snapshot it was opened at.
    let (service, model) = (Arc::clone(&state.service), Arc::clone(open.model()));
    drop(open);
    let lines = futures_util::stream::unfold(false, move |finished| {
        let (service, model, running) = (Arc::clone(&service), Arc::clone(&model), running.clone());
        async move {
            if finished {
                return None;
            }
            let outcome = match &running {
                None => Some(Ok(())),
                Some(prefetch) => tokio::select! {
                    outcome = prefetch.finished() => Some(outcome),
                    () = tokio::time::sleep(std::time::Duration::from_millis(500)) => None,
                },
            };
            let mut line = held_json(&model, service.listing().held(&model));
            line["done"] = json!(outcome.is_some());
            if let Some(Err(reason)) = &outcome {
                line["error"] = json!(reason);
            }
            let line = bytes::Bytes::from(format!("{line}\n"));
            Some((Ok::<_, std::convert::Infallible>(line), outcome.is_some()))
        }
    });
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"))], axum::body::Body::from_stream(lines))
        .into_response()
}
