//! What handlers share before they answer: path parameters, and [`ReadyModel`], the extractor
//! that opens the model a request names (ready, known, allowed, at the version it pins:
//! opening is admission, so a handler then only asks the [`OpenModel`] it holds) with its
//! cache policy, or refuses the request.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};

use super::{ApiError, AppState};
use crate::access::Access;
use crate::catalog::Model;
use crate::service::{OpenModel, ServiceError};
use crate::transport::respond;

/// The model a request names, opened (ready to serve and allowed to the request), with the
/// request's path parameters and the `Cache-Control` its answers carry.
pub(crate) struct ReadyModel {
    pub params: Vec<(String, String)>,
    pub open: OpenModel,
    pub cache: (HeaderName, HeaderValue),
    /// What the request may read: a handler that opens another model checks it the same way.
    pub access: Access,
}

impl ReadyModel {
    /// The path parameter `name` (`""` when absent).
    pub(crate) fn param(&self, name: &str) -> &str {
        param(&self.params, name)
    }
}

impl FromRequestParts<Arc<AppState>> for ReadyModel {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<ReadyModel, ApiError> {
        let params = path_params(RawPathParams::from_request_parts(parts, state).await)?;
        // Recorded by `auth::require_token`, which every routed request passes first.
        let access = parts.extensions.get::<Access>().cloned().unwrap_or(Access::Under(Arc::from([])));
        let id = param(&params, "model");
        let open = ready_model(state, &access, id).await?;
        let cache = cache_control(id, open.model());
        Ok(ReadyModel { params, open, cache, access })
    }
}

/// Path parameters by name, percent-decoded; invalid UTF-8 is a 400 in our JSON shape.
fn path_params(
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Result<Vec<(String, String)>, ApiError> {
    let params = params.map_err(|e| ApiError::BadRequest(format!("path is not valid percent-encoded UTF-8: {e}")))?;
    Ok(params.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
}

/// The parameter `name`; an object name the route leaves empty (`/objects/`) is `""`.
fn param<'a>(params: &'a [(String, String)], name: &str) -> &'a str {
    params.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
}

/// Opens a model, refusing when not ready, unknown, broken or refused by its signature. `id` may pin a version,
/// `{id}@{version}` (the `X-Zt-Model-Version` without its quotes), unless a model has that exact
/// id: a version that is no longer the model's answers `version_gone`.
/// A model outside the request's [`Access`] is answered exactly as an unknown one.
pub(super) async fn ready_model(state: &AppState, access: &Access, id: &str) -> Result<OpenModel, ApiError> {
    tracing::Span::current().record("model", id);
    let listing = state.service.listing();
    let (base, pinned) = match crate::api::split_pinned(id) {
        Some((base, version)) if listing.get(id).is_none() => (base, Some(version)),
        _ => (id, None),
    };
    if !access.allows(base) {
        // Not yet ready, every model is answered alike; then, as an unknown one. Decided here,
        // not by the readiness `open` sees later, which a rescan may turn in between.
        let refusal =
            if state.service.is_ready() { ServiceError::ModelNotFound(id.to_owned()) } else { ServiceError::NotReady };
        return Err(refusal.into());
    }
    let open = listing.open(base).await?;
    match pinned {
        Some(version) if version != crate::service::version_token(open.model()) => Err(ServiceError::VersionGone {
            model: base.to_owned(),
            version: version.to_owned(),
            current: crate::service::version_token(open.model()),
        }
        .into()),
        _ => Ok(open),
    }
}

/// `Cache-Control` of a response drawn from `model` for the id a request named: a version-pinned
/// URL never changes, so a cache may keep it for a year without asking again; any other is
/// revalidated by its ETag before each use.
fn cache_control(requested: &str, model: &Model) -> (axum::http::HeaderName, HeaderValue) {
    const IMMUTABLE: HeaderValue = HeaderValue::from_static("public, max-age=31536000, immutable");
    let value = if requested == model.id { respond::REVALIDATE } else { IMMUTABLE };
    (axum::http::header::CACHE_CONTROL, value)
}

pub(crate) fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}
