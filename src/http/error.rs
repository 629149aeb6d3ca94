//! `ApiError` and the only place HTTP statuses are chosen for errors, the request timeout and
//! `/readyz` (byte responses' 200, 206 and 304 follow from ranges and conditionals in
//! `respond.rs`). Every error answers `{"error": {"code", "message"}}`; 5xx bodies stay
//! generic and their details go to the log.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::catalog::CatalogError;
use crate::format::FormatError;
use crate::service::ServiceError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// No bearer token, or one that is not accepted (`invalid`).
    #[error("{}", if *invalid { "the bearer token is not accepted" } else { "a bearer token is required (Authorization: Bearer <token>)" })]
    Unauthorized { invalid: bool },
    #[error("no model {0:?}")]
    ModelNotFound(String),
    #[error("model {model:?} has no object {object:?}")]
    ObjectNotFound { model: String, object: String },
    #[error("object {object:?} of model {model:?} has no component {role:?}; its components are {available}")]
    ComponentNotFound { model: String, object: String, role: String, available: String },
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("range not satisfiable: the representation is {length} bytes")]
    RangeNotSatisfiable { length: u64 },
    #[error("{requested} ranges requested; at most {limit} are served per request")]
    TooManyRanges { requested: usize, limit: usize, length: u64 },
    #[error("model {model:?} is broken: {source}")]
    BrokenModel { model: String, source: Box<CatalogError> },
    #[error("model {model:?}: {source}")]
    InvalidComponent { model: String, source: Box<FormatError> },
    #[error("the catalog is not ready yet")]
    NotReady,
    /// The answer did not start within `request_timeout_secs`.
    #[error("the answer did not start within the request timeout; retry shortly")]
    RequestTimeout,
    /// Every decoder stayed busy for `decode_wait_ms`.
    #[error("every decoder is busy; retry shortly")]
    DecodersBusy,
    #[error("model {model:?} changed on disk; it is served again after the next rescan")]
    ChangedOnDisk { model: String },
    /// Storage could not give a model's bytes: its source is unavailable or refuses access,
    /// or the object changed since it was listed.
    #[error("model {model:?}: {source}")]
    Storage { model: String, source: crate::storage::StorageError },
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> ApiError {
        match error {
            ServiceError::NotReady => ApiError::NotReady,
            ServiceError::ModelNotFound(model) => ApiError::ModelNotFound(model),
            ServiceError::ObjectNotFound { model, object } => ApiError::ObjectNotFound { model, object },
            ServiceError::ComponentNotFound { model, object, role, available } => {
                ApiError::ComponentNotFound { model, object, role, available }
            }
            ServiceError::BrokenModel { model, source } => ApiError::BrokenModel { model, source },
            ServiceError::InvalidComponent { model, source } => ApiError::InvalidComponent { model, source },
            ServiceError::DecodersBusy => ApiError::DecodersBusy,
            ServiceError::ChangedOnDisk { model } => ApiError::ChangedOnDisk { model },
            ServiceError::Storage { model, source } => ApiError::Storage { model, source },
            ServiceError::Internal(reason) => ApiError::Internal(reason),
        }
    }
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::ModelNotFound(_) => (StatusCode::NOT_FOUND, "model_not_found"),
            ApiError::ObjectNotFound { .. } => (StatusCode::NOT_FOUND, "object_not_found"),
            ApiError::ComponentNotFound { .. } => (StatusCode::NOT_FOUND, "component_not_found"),
            ApiError::RouteNotFound(_) => (StatusCode::NOT_FOUND, "route_not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RangeNotSatisfiable { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
            ApiError::TooManyRanges { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "too_many_ranges"),
            ApiError::BrokenModel { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "broken_model"),
            ApiError::InvalidComponent { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_component"),
            ApiError::NotReady => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            ApiError::RequestTimeout => (StatusCode::SERVICE_UNAVAILABLE, "request_timeout"),
            ApiError::ChangedOnDisk { .. } => (StatusCode::SERVICE_UNAVAILABLE, "changed_on_disk"),
            ApiError::DecodersBusy => (StatusCode::SERVICE_UNAVAILABLE, "decoders_busy"),
            ApiError::Storage { source, .. } if source.is_about_the_object() => {
                (StatusCode::SERVICE_UNAVAILABLE, "changed_in_source")
            }
            ApiError::Storage { .. } => (StatusCode::SERVICE_UNAVAILABLE, "source_unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            ApiError::NotReady | ApiError::RequestTimeout | ApiError::ChangedOnDisk { .. } | ApiError::DecodersBusy => {
                self.to_string()
            }
            // The store's own words (endpoints, request ids) go to the log only.
            ApiError::Storage { model, source } => {
                tracing::warn!(error = %self, "storage failed");
                if source.is_about_the_object() {
                    format!("model {model:?} changed in its source; it is served again after the next rescan")
                } else {
                    format!("the source of model {model:?} is unavailable; retry later")
                }
            }
            _ if status.is_server_error() => {
                tracing::error!(error = %self, "request failed");
                "internal error; see the server log".to_owned()
            }
            _ => self.to_string(),
        };
        let detail = match &self {
            ApiError::BrokenModel { source, .. } => Some(source.code()),
            ApiError::InvalidComponent { source, .. } => Some(source.code()),
            _ => None,
        };
        let mut body = json!({ "error": { "code": code, "message": message } });
        if let Some(detail) = detail {
            body["error"]["reason"] = json!(detail);
        }
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        match self {
            ApiError::RangeNotSatisfiable { length } | ApiError::TooManyRanges { length, .. } => {
                let value = HeaderValue::from_str(&format!("bytes */{length}")).expect("ASCII");
                headers.insert(header::CONTENT_RANGE, value);
            }
            ApiError::Unauthorized { invalid } => {
                let challenge = if invalid {
                    r#"Bearer realm="ztserve", error="invalid_token""#
                } else {
                    r#"Bearer realm="ztserve""#
                };
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
            }
            ApiError::NotReady | ApiError::RequestTimeout | ApiError::ChangedOnDisk { .. } | ApiError::DecodersBusy => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::Storage { source, .. } => {
                let after = if source.is_about_the_object() { "1" } else { "5" };
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static(after));
            }
            _ => {}
        }
        response
    }
}

/// How ready the service is, as `/readyz` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// The first index has not completed.
    Starting,
    Ready,
    /// Some sources do not answer; their models answer 503 while the others serve.
    Degraded,
    /// No source answers.
    Unavailable,
}

/// `/readyz`'s status: load balancers route only to a 200.
pub(crate) fn readiness_status(readiness: Readiness) -> StatusCode {
    match readiness {
        Readiness::Ready | Readiness::Degraded => StatusCode::OK,
        Readiness::Starting | Readiness::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(error: ApiError) -> (StatusCode, serde_json::Value, axum::http::HeaderMap) {
        let response = error.into_response();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap(), headers)
    }

    #[tokio::test]
    async fn internal_errors_answer_500_with_a_generic_message() {
        let (status, json, _) = body(ApiError::Internal("secret path /srv/x failed".into())).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(json["error"]["code"], "internal");
        assert!(!json["error"]["message"].as_str().unwrap().contains("secret"));
    }

    #[tokio::test]
    async fn unavailable_errors_say_when_to_retry() {
        let (status, json, headers) = body(ApiError::ChangedOnDisk { model: "m".into() }).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json["error"]["code"], "changed_on_disk");
        assert_eq!(headers.get("retry-after").unwrap(), "1");
        let unavailable = crate::storage::StorageError::Unavailable {
            source_name: "s3://b".into(),
            message: "connect to http://10.0.0.1:9000 refused".into(),
        };
        let (status, json, headers) = body(ApiError::Storage { model: "m".into(), source: unavailable }).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json["error"]["code"], "source_unavailable");
        assert!(!json["error"]["message"].as_str().unwrap().contains("10.0.0.1"), "{json}");
        assert_eq!(headers.get("retry-after").unwrap(), "5");
    }
}
