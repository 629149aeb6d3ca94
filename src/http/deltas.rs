//! `POST /models/{m}/deltas`: the deltas from another model version (`from`, typically the
//! lineage's previous version) of many regions of this one, in one body. The request is JSON,
//! `{"from": "A" | "A@version", "regions": [{"object", "component"?, "slice"?}, ...]}`, the
//! regions and refusals of `/regions`; `from` is opened as the path's model is, with the same
//! access check (a request may only diff models it may read) and version pin. The answer is
//! each region's delta (`format::delta`) followed by its CRC32C, four bytes big-endian, back to
//! back in the order asked, chunked: each delta is computed when the body reaches it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::lookup::ready_model;
use super::models::model_version;
use super::regions::json_body;
use super::{ApiError, AppState, ReadyModel, header_value};
use crate::api;
use crate::service::{RegionLimits, RegionRequest};
use crate::transport::respond::{body_of, primed};

/// The media type of a deltas body.
const DELTAS_TYPE: &str = "application/vnd.ztserve.deltas";

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeltasJson {
    from: String,
    regions: Vec<RegionRequest>,
}

/// `POST /models/{m}/deltas`.
pub(super) async fn deltas(
    State(state): State<Arc<AppState>>,
    ready: ReadyModel,
    body: Body,
) -> Result<Response, ApiError> {
    let limits = &state.config().limits;
    let request: DeltasJson =
        json_body(body, limits.max_regions, "{\"from\": \"model[@version]\", \"regions\": [...]}").await?;
    let base = ready_model(&state, &ready.access, &request.from).await?;
    // Opening `from` named it in the request's span; the request is still B's.
    tracing::Span::current().record("model", ready.param("model"));
    let limits = RegionLimits { max_regions: limits.max_regions, max_bytes: limits.max_regions_bytes };
    let answer = ready.open.deltas(&base, request.regions, limits).await?;
    let body = primed(answer.body).await?;
    let (version_name, version) = model_version(ready.open.model());
    let from_version = crate::service::version_token(base.model());
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, DELTAS_TYPE)
        .header(header::CACHE_CONTROL, "no-store")
        .header(version_name, version)
        .header(HeaderName::from_static(api::headers::REGIONS), HeaderValue::from(answer.count))
        .header(HeaderName::from_static(api::headers::FROM_VERSION), header_value(&from_version))
        .body(body_of(body))
        .map_err(|e| ApiError::Internal(e.to_string()))
}
