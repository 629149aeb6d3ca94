//! Model routes: the list, one model's manifest as JSON (rendered once per model version,
//! with an ETag), the stored files with ranges, and the files of its safetensors view.

use std::sync::Arc;

use axum::extract::{RawPathParams, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::range::if_none_match_matches;
use super::respond::{Representation, bytes_response};
use super::{ApiError, AppState, answer, cache_control, header_value, param, path_params, ready_model};
use crate::access::Access;
use crate::api;
use crate::catalog::Model;
use crate::service::{self, ServiceError};

/// `GET /models`: every model the request may read, with its status.
pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
) -> Result<Json<Value>, ApiError> {
    if !state.service.is_ready() {
        return Err(ServiceError::NotReady.into());
    }
    let catalog = state.service.catalog();
    let models: Vec<Value> = catalog
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
            match &m.state {
                Ok(manifest) => {
                    entry["status"] = json!("ok");
                    entry["objects"] = json!(manifest.objects.len());
                }
                Err(e) => {
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
pub async fn manifest(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Response {
    answer((|| {
        let params = path_params(params)?;
        let (model, manifest) = ready_model(&state, &access, param(&params, "model"))?;
        let rendered = service::rendered_manifest(&model, &manifest, &state.service.view(&model, &manifest));
        let etag = (header::ETAG, header_value(&rendered.etag));
        let if_none_match = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok());
        let cache = cache_control(param(&params, "model"), &model);
        if if_none_match_matches(if_none_match, &rendered.etag) {
            return Ok((StatusCode::NOT_MODIFIED, [etag, cache, model_version(&model)]).into_response());
        }
        Ok((
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json")), etag, cache, model_version(&model)],
            rendered.body.clone(),
        )
            .into_response())
    })())
}

/// `GET /models/{m}/file`: the stored `.zt` file, byte for byte, with range support.
pub async fn file(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
    method: axum::http::Method,
    headers: HeaderMap,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let (model, manifest) = ready_model(&state, &access, param(&params, "model"))?;
            let stored = match params.iter().find(|(key, _)| key == "name") {
                Some((_, name)) => state.service.stored_file_named(&model, &manifest, name).await?,
                None => state.service.stored_file(&model, &manifest).await?,
            };
            let cache = cache_control(param(&params, "model"), &model);
            file_response(&state, &headers, &method, &model, cache, stored, "application/octet-stream").await
        }
        .await,
    )
}

/// `GET /models/{m}/model.safetensors` (or the view's index and shards): a file of the model's
/// safetensors view, with ranges; any other name under a model is no route.
pub async fn view_file(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let name = param(&params, "view_file");
            if !crate::format::view::is_view_file_name(name) {
                return Err(ApiError::RouteNotFound(uri.path().to_owned()));
            }
            let (model, manifest) = ready_model(&state, &access, param(&params, "model"))?;
            let file = state.service.view_file(&model, &manifest, name).await?;
            let content_type = crate::format::view::media_type(name);
            let cache = cache_control(param(&params, "model"), &model);
            file_response(&state, &headers, &method, &model, cache, file, content_type).await
        }
        .await,
    )
}

/// A whole file's answer (a stored file, a file of the view): ranges, conditionals, HEAD, and
/// the model's version and cache headers.
async fn file_response(
    state: &AppState,
    request: &HeaderMap,
    method: &axum::http::Method,
    model: &Model,
    cache: (HeaderName, HeaderValue),
    file: service::StoredBytes,
    content_type: &'static str,
) -> Result<Response, ApiError> {
    let representation = Representation {
        source: file.source,
        etag: file.etag,
        content_type,
        headers: vec![model_version(model), cache],
        guard: None,
    };
    bytes_response(request, method == axum::http::Method::HEAD, representation, state.config().max_ranges).await
}
