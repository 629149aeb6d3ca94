//! `ApiError` and the only place HTTP statuses are chosen for errors, the request timeout and
//! `/readyz` (byte responses' 200, 206 and 304 follow from ranges and conditionals in
//! `transport::respond`, whose refusals become errors here). Every error answers `{"error": {"code", "message"}}`; 5xx bodies stay
//! generic and their details go to the log.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::service::ServiceError;
use crate::transport::respond::ByteRefusal;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// No bearer token, or one that is not accepted (`invalid`).
    #[error("{}", if *invalid { "the bearer token is not accepted" } else { "a bearer token is required (Authorization: Bearer <token>)" })]
    Unauthorized { invalid: bool },
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("range not satisfiable: the representation is {length} bytes")]
    RangeNotSatisfiable { length: u64 },
    #[error("{requested} ranges requested; at most {limit} are served per request")]
    TooManyRanges { requested: usize, limit: usize, length: u64 },
    /// The answer did not start within `request_timeout_secs`.
    #[error("the answer did not start within the request timeout; retry shortly")]
    RequestTimeout,
    #[error("internal error: {0}")]
    Internal(String),
    /// What the service refused or failed at, with its cause.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

impl From<ByteRefusal> for ApiError {
    fn from(refusal: ByteRefusal) -> ApiError {
        match refusal {
            ByteRefusal::RangeNotSatisfiable { length } => ApiError::RangeNotSatisfiable { length },
            ByteRefusal::TooManyRanges { requested, limit, length } => {
                ApiError::TooManyRanges { requested, limit, length }
            }
            ByteRefusal::Source(e) => ApiError::Service(e),
            ByteRefusal::Internal(message) => ApiError::Internal(message),
        }
    }
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        use ServiceError as S;
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::RouteNotFound(_) => (StatusCode::NOT_FOUND, "route_not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RangeNotSatisfiable { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
            ApiError::TooManyRanges { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "too_many_ranges"),
            ApiError::RequestTimeout => (StatusCode::SERVICE_UNAVAILABLE, "request_timeout"),
            ApiError::Internal(_) | ApiError::Service(S::Internal(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
            ApiError::Service(S::ModelNotFound(_)) => (StatusCode::NOT_FOUND, "model_not_found"),
            ApiError::Service(S::ObjectNotFound { .. }) => (StatusCode::NOT_FOUND, "object_not_found"),
            ApiError::Service(S::ComponentNotFound { .. }) => (StatusCode::NOT_FOUND, "component_not_found"),
            ApiError::Service(S::FileNotFound { .. }) => (StatusCode::NOT_FOUND, "file_not_found"),
            ApiError::Service(S::VersionGone { .. }) => (StatusCode::NOT_FOUND, "version_gone"),
            ApiError::Service(S::ViewFileNotFound { .. }) => (StatusCode::NOT_FOUND, "view_file_not_found"),
            ApiError::Service(S::SeveralFiles { .. }) => (StatusCode::NOT_FOUND, "several_files"),
            ApiError::Service(S::BrokenModel { .. }) => (StatusCode::UNPROCESSABLE_ENTITY, "broken_model"),
            ApiError::Service(S::InvalidComponent { .. }) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_component"),
            ApiError::Service(S::BadSlice { source, .. }) => (StatusCode::BAD_REQUEST, source.code()),
            ApiError::Service(S::NotReady) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            ApiError::Service(S::ChangedOnDisk { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "changed_on_disk"),
            ApiError::Service(S::NotCached { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "not_cached"),
            ApiError::Service(S::DecodersBusy) => (StatusCode::SERVICE_UNAVAILABLE, "decoders_busy"),
            ApiError::Service(S::DigestPending { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "digest_pending"),
            ApiError::Service(S::Storage { source, .. }) if source.is_about_the_object() => {
                (StatusCode::SERVICE_UNAVAILABLE, "changed_in_source")
            }
            ApiError::Service(S::Storage { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "source_unavailable"),
        }
    }

    /// Seconds a client should wait before trying again, for a refusal that passes.
    fn retry_after(&self) -> Option<u64> {
        use ServiceError as S;
        match self {
            ApiError::RequestTimeout | ApiError::Service(S::NotReady | S::ChangedOnDisk { .. } | S::DecodersBusy) => {
                Some(1)
            }
            ApiError::Service(S::Storage { source, .. }) if source.is_about_the_object() => Some(1),
            ApiError::Service(S::Storage { .. } | S::NotCached { .. }) => Some(5),
            ApiError::Service(error @ S::DigestPending { .. }) => error.retry_after_secs(),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        use ServiceError as S;
        let (status, code) = self.status_and_code();
        let message = match &self {
            ApiError::RequestTimeout
            | ApiError::Service(
                S::NotReady | S::ChangedOnDisk { .. } | S::DecodersBusy | S::NotCached { .. } | S::DigestPending { .. },
            ) => self.to_string(),
            // The store's own words (endpoints, request ids) go to the log only.
            ApiError::Service(S::Storage { model, source }) => {
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
            ApiError::Service(S::BrokenModel { source, .. }) => Some(source.code()),
            ApiError::Service(S::InvalidComponent { source, .. }) => Some(source.code()),
            _ => None,
        };
        let mut body = json!({ "error": { "code": code, "message": message } });
        if let Some(detail) = detail {
            body["error"]["reason"] = json!(detail);
        }
        let retry_after = self.retry_after();
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(after) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(after));
        }
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
        let (status, json, headers) = body(ServiceError::ChangedOnDisk { model: "m".into() }.into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json["error"]["code"], "changed_on_disk");
        assert_eq!(headers.get("retry-after").unwrap(), "1");
        let unavailable = crate::storage::StorageError::Unavailable {
            source_name: "s3://b".into(),
            message: "connect to http://10.0.0.1:9000 refused".into(),
        };
        let (status, json, headers) =
            body(ServiceError::Storage { model: "m".into(), source: unavailable }.into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json["error"]["code"], "source_unavailable");
        assert!(!json["error"]["message"].as_str().unwrap().contains("10.0.0.1"), "{json}");
        assert_eq!(headers.get("retry-after").unwrap(), "5");
    }
}
