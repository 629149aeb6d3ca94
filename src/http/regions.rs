//! `POST /models/{m}/regions`: many regions of one model version (a rank's whole plan) in one
//! body. The request is JSON, `{"regions": [{"object", "component"?, "slice"?}, ...]}`; the
//! answer is each region's bytes (as its own route would send them) followed by their CRC32C,
//! four bytes big-endian, back to back in the order asked. A model id pinned to its version
//! (`{id}@{version}`) makes every byte of the body that version's, or the request fails with
//! `version_gone`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::models::model_version;
use super::{ApiError, AppState, ReadyModel};
use crate::api;
use crate::service::{RegionLimits, RegionRequest};
use crate::transport::respond::{body_of, primed};

/// The media type of a regions body.
const REGIONS_TYPE: &str = "application/vnd.ztserve.regions";

/// The request body a region may take, on average: a long tensor name and its slice.
const BODY_BYTES_PER_REGION: usize = 1 << 10;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionsJson {
    regions: Vec<RegionRequest>,
}

/// The JSON body of a request for at most `max_regions` regions (1 KiB each at most, on
/// average), read whole and parsed as `T`, whose shape `expected` shows.
pub(super) async fn json_body<T: serde::de::DeserializeOwned>(
    body: Body,
    max_regions: usize,
    expected: &str,
) -> Result<T, ApiError> {
    let allowed = max_regions.saturating_mul(BODY_BYTES_PER_REGION);
    let bytes = axum::body::to_bytes(body, allowed).await.map_err(|e| match e.into_inner() {
        cause if cause.is::<http_body_util::LengthLimitError>() => {
            ApiError::RequestTooLarge(format!("a regions request body may hold at most {allowed} bytes"))
        }
        cause => ApiError::BadRequest(format!("the request body could not be read: {cause}")),
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not a request of the form {expected}: {e}")))
}

/// `POST /models/{m}/regions`.
pub(super) async fn regions(
    State(state): State<Arc<AppState>>,
    ready: ReadyModel,
    body: Body,
) -> Result<Response, ApiError> {
    let request: RegionsJson = json_body(body, state.config().limits.max_regions, "{\"regions\": [...]}").await?;
    let limits = &state.config().limits;
    let limits = RegionLimits { max_regions: limits.max_regions, max_bytes: limits.max_regions_bytes };
    let answer = ready.open.regions(request.regions, limits).await?;
    let body = primed(answer.body).await?;
    metrics::counter!(crate::telemetry::names::REGIONS).increment(answer.count as u64);
    let (version_name, version) = model_version(ready.open.model());
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, REGIONS_TYPE)
        .header(header::CONTENT_LENGTH, answer.len)
        .header(header::CACHE_CONTROL, "no-store")
        .header(version_name, version)
        .header(HeaderName::from_static(api::headers::REGIONS), HeaderValue::from(answer.count))
        .body(body_of(body))
        .map_err(|e| ApiError::Internal(e.to_string()))
}
