//! Object and component routes: a component's decoded little-endian bytes with ranges, or an
//! object's JSON description when it has several components.

use std::sync::Arc;

use axum::extract::{RawPathParams, State};
use axum::http::{HeaderMap, HeaderName};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::json;

use super::models::{etag, file_bytes};
use super::respond::{bytes_response, ExtraHeaders};
use super::{answer, header_value, param, path_params, ready_model, segment, ApiError, AppState};
use crate::catalog::Model;
use crate::format::{Component, Manifest, Object};
use crate::json::object_json;

type Params = Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>;

/// `GET /models/{m}/objects/{o}`: the only component's bytes, or the object's description.
pub async fn object(State(state): State<Arc<AppState>>, headers: HeaderMap, params: Params) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let (model, manifest) = ready_model(&state, param(&params, "model"))?;
            let object = find_object(&model, &manifest, param(&params, "object"))?;
            match &object.components[..] {
                [only] => component_bytes(&state, &headers, &model, &manifest, object, only).await,
                _ => {
                    let mut doc = object_json(object);
                    add_urls(&mut doc, object, &format!("/models/{}", segment(&model.id)));
                    Ok(Json(doc).into_response())
                }
            }
        }
        .await,
    )
}

/// `GET /models/{m}/objects/{o}/components/{role}`: that component's bytes.
pub async fn component(State(state): State<Arc<AppState>>, headers: HeaderMap, params: Params) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let (model, manifest) = ready_model(&state, param(&params, "model"))?;
            let object = find_object(&model, &manifest, param(&params, "object"))?;
            let role = param(&params, "role");
            let component = object.component(role).ok_or_else(|| ApiError::ComponentNotFound {
                model: model.id.clone(),
                object: object.name.clone(),
                role: role.to_owned(),
                available: object.components.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", "),
            })?;
            component_bytes(&state, &headers, &model, &manifest, object, component).await
        }
        .await,
    )
}

/// Adds the object's URL and each component's URL to its rendered JSON.
pub(crate) fn add_urls(rendered: &mut serde_json::Value, object: &Object, model_url: &str) {
    let object_url = format!("{model_url}/objects/{}", segment(&object.name));
    if let Some(components) = rendered["components"].as_array_mut() {
        for (component, rendered) in object.components.iter().zip(components) {
            rendered["url"] = json!(format!("{object_url}/components/{}", segment(&component.role)));
        }
    }
    rendered["url"] = json!(object_url);
}

fn find_object<'m>(model: &Model, manifest: &'m Manifest, name: &str) -> Result<&'m Object, ApiError> {
    tracing::Span::current().record("object", name);
    manifest.object(name).ok_or_else(|| ApiError::ObjectNotFound { model: model.id.clone(), object: name.to_owned() })
}

/// Whether an object has content the format can check beyond its manifest.
fn has_content_rules(object: &Object) -> bool {
    matches!(object.format.as_str(), "sparse_csr" | "sparse_coo") || object.components.iter().any(|c| c.dtype == crate::format::DType::Bool)
}

/// Runs the format's content checks (bool bytes are 0 or 1, sparse indices consistent and in
/// range) before any component of the object is served as valid; once per object and file
/// version, off the async runtime.
async fn check_content_once(model: &Arc<Model>, object: &Object, file: &Bytes) -> Result<(), ApiError> {
    if !has_content_rules(object) {
        return Ok(());
    }
    let cached = model.content_checks.lock().expect("never poisoned").get(&object.name).cloned();
    let result = match cached {
        Some(result) => result,
        None => {
            let (object_owned, file) = (object.clone(), file.clone());
            let result = tokio::task::spawn_blocking(move || {
                // Verbatim components are checked in place, borrowed from the mapping.
                let file: &[u8] = &file;
                crate::format::validate::check_content(&object_owned, |c| {
                    let stored = crate::format::decode::stored_bytes(file, &object_owned.name, c)?;
                    crate::format::decode::decode_component(&object_owned.name, c, stored)
                })
            })
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
            model.content_checks.lock().expect("never poisoned").insert(object.name.clone(), result.clone());
            result
        }
    };
    result.map_err(|source| ApiError::InvalidComponent { model: model.id.clone(), source })
}

/// Decoded bytes of a component: a zero-copy slice of the mapping when stored verbatim,
/// otherwise decoded off the async runtime.
async fn component_bytes(
    state: &AppState,
    headers: &HeaderMap,
    model: &Arc<Model>,
    manifest: &Manifest,
    object: &Object,
    component: &Component,
) -> Result<Response, ApiError> {
    let file = file_bytes(model, manifest.file_len).await?;
    check_content_once(model, object, &file).await?;
    let range = component.stored_range();
    let stored = file.slice(range.start as usize..range.end as usize);
    let body = if component.is_verbatim() {
        stored
    } else {
        let (name, component_owned) = (object.name.clone(), component.clone());
        let decoded = tokio::task::spawn_blocking(move || {
            crate::format::decode::decode_component(&name, &component_owned, &stored).map(|d| Bytes::from(d.into_owned()))
        })
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
        decoded.map_err(|source| ApiError::InvalidComponent { model: model.id.clone(), source })?
    };
    let mut extra: ExtraHeaders = vec![
        (HeaderName::from_static("x-zt-dtype"), header_value(component.dtype.name())),
        (HeaderName::from_static("x-zt-format"), header_value(&segment(&object.format))),
        (
            HeaderName::from_static("x-zt-shape"),
            header_value(&object.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        ),
    ];
    if let Some(logical) = &component.logical_type {
        extra.push((HeaderName::from_static("x-zt-type"), header_value(&segment(logical))));
    }
    let tag = etag(model, &format!("{}\0{}", object.name, component.role));
    bytes_response(headers, body, &tag, "application/octet-stream", extra, state.config.max_ranges)
}
