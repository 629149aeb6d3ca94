//! Model routes: the list, one model's manifest as JSON, and the stored file itself.

use std::sync::Arc;

use axum::extract::{RawPathParams, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Value};

use super::objects::add_urls;
use super::respond::{bytes_response, Representation};
use super::{answer, param, path_params, ready_model, segment, ApiError, AppState};
use crate::catalog::Model;
use crate::json::manifest_json;

/// `GET /models`: every model with its status.
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    if !state.is_ready() {
        return Err(ApiError::NotReady);
    }
    let catalog = state.catalog();
    let models: Vec<Value> = catalog
        .models()
        .map(|m| {
            let mut entry = json!({
                "id": m.id,
                "source": m.source,
                "size": m.identity.size,
                "url": format!("/models/{}", segment(&m.id)),
            });
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

/// `GET /models/{m}`: the manifest with each component's URL, rendered once per manifest.
pub async fn manifest(
    State(state): State<Arc<AppState>>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Response {
    answer((|| {
        let params = path_params(params)?;
        let (model, manifest) = ready_model(&state, param(&params, "model"))?;
        let body = model.manifest_json.get_or_init(|| {
            let mut doc = manifest_json(&manifest);
            doc["id"] = json!(model.id);
            let base = format!("/models/{}", segment(&model.id));
            if let Some(objects) = doc["objects"].as_array_mut() {
                for (object, rendered) in manifest.objects.iter().zip(objects) {
                    add_urls(rendered, object, &base);
                }
            }
            Bytes::from(serde_json::to_vec(&doc).expect("JSON values serialize"))
        });
        Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.clone()).into_response())
    })())
}

/// The file's bytes, mapped once per model (off the async runtime) and checked against the
/// file's current length, so a file truncated in place is refused rather than read.
pub(crate) async fn file_bytes(model: &Arc<Model>, expected_len: u64) -> Result<Bytes, ApiError> {
    let mapping = match model.mapping.get() {
        Some(mapping) => Arc::clone(mapping),
        None => {
            let path = model.path.clone();
            let mapped = tokio::task::spawn_blocking(move || crate::storage::local::MappedFile::open(&path))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .map_err(|_| ApiError::ChangedOnDisk { model: model.id.clone() })?;
            Arc::clone(model.mapping.get_or_init(|| Arc::new(mapped)))
        }
    };
    let current = mapping.current_len().map_err(|_| ApiError::ChangedOnDisk { model: model.id.clone() })?;
    if mapping.len() as u64 != expected_len || current < expected_len {
        return Err(ApiError::ChangedOnDisk { model: model.id.clone() });
    }
    Ok(Bytes::from_owner(ArcBytes(mapping)))
}

/// Lets `Bytes` share ownership of a mapping.
struct ArcBytes(Arc<crate::storage::local::MappedFile>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A strong ETag for the file version, plus a discriminator for what part of it is served.
pub(crate) fn etag(model: &Model, part: &str) -> String {
    use sha2::Digest;
    let id = &model.identity;
    let mut hasher = sha2::Sha256::new();
    hasher.update(part.as_bytes());
    let tag = hex::encode(&hasher.finalize()[..6]);
    format!("\"{:x}-{:x}-{:x}-{tag}\"", id.inode, id.size, id.mtime_ns)
}

/// `GET /models/{m}/file`: the stored `.zt` file, byte for byte, with range support.
pub async fn file(
    State(state): State<Arc<AppState>>,
    method: axum::http::Method,
    headers: HeaderMap,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let (model, manifest) = ready_model(&state, param(&params, "model"))?;
            let bytes = file_bytes(&model, manifest.file_len).await?;
            let representation = Representation {
                source: Arc::new(bytes),
                etag: etag(&model, "file"),
                content_type: "application/octet-stream",
                headers: Vec::new(),
                guard: None,
            };
            bytes_response(&headers, method == axum::http::Method::HEAD, representation, state.config.max_ranges).await
        }
        .await,
    )
}
