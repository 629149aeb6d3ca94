//! `ApiError` and the only place the HTTP contract chooses statuses: for its own refusals, for
//! each kind of service failure, for the request timeout and for `/readyz` (byte responses'
//! 200, 206 and 304 follow from ranges and conditionals in `transport::respond`, whose refusals
//! become errors here). Every error answers `{"error": {"code", "message"}}`; an internal
//! error's body stays generic and its detail goes to the log, once.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::artifacts::ArtifactError;
use crate::service::{ErrorKind, ServiceError};
use crate::transport::error_parts::{ErrorClass, ErrorParts};
use crate::transport::respond::ByteRefusal;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// A request body past its limit.
    #[error("{0}")]
    RequestTooLarge(String),
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
    /// What the artifact store refused or failed at.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// A write by a token `[artifacts] writers` does not grant it.
    #[error("{0}")]
    WriteNotGranted(String),
    #[error("the artifact store holds no blob {0}")]
    NoSuchBlob(String),
}

impl From<ByteRefusal<ServiceError>> for ApiError {
    fn from(refusal: ByteRefusal<ServiceError>) -> ApiError {
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

/// The status and code of what the artifact store refused.
fn artifact_status(error: &ArtifactError) -> (StatusCode, &'static str) {
    match error {
        ArtifactError::BadName { .. } => (StatusCode::BAD_REQUEST, "bad_bundle_name"),
        ArtifactError::BadDigest(_) => (StatusCode::BAD_REQUEST, "bad_digest"),
        ArtifactError::BadBundle { .. } => (StatusCode::BAD_REQUEST, "bad_bundle"),
        ArtifactError::Cut(_) => (StatusCode::BAD_REQUEST, "upload_cut"),
        ArtifactError::DigestMismatch { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "digest_mismatch"),
        ArtifactError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        ArtifactError::Full { .. } | ArtifactError::DiskFull { .. } => (StatusCode::INSUFFICIENT_STORAGE, "store_full"),
        ArtifactError::MissingBlob { .. } => (StatusCode::CONFLICT, "missing_blob"),
        ArtifactError::Exists(_) => (StatusCode::CONFLICT, "bundle_exists"),
        ArtifactError::NoBundle(_) => (StatusCode::NOT_FOUND, "no_such_bundle"),
        ArtifactError::Unsigned(_) => (StatusCode::UNPROCESSABLE_ENTITY, "signature_required"),
        ArtifactError::Signature { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "signature_failed"),
        ArtifactError::Io { .. } | ArtifactError::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        ArtifactError::Bucket(_) => (StatusCode::SERVICE_UNAVAILABLE, "source_unavailable"),
    }
}

/// The HTTP contract's status for each kind of service failure.
fn service_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Gone => StatusCode::GONE,
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::Refused => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Busy { .. } | ErrorKind::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
    }
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::RequestTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            ApiError::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::RouteNotFound(_) => (StatusCode::NOT_FOUND, "route_not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RangeNotSatisfiable { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
            ApiError::TooManyRanges { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "too_many_ranges"),
            ApiError::RequestTimeout => (StatusCode::SERVICE_UNAVAILABLE, "request_timeout"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            ApiError::Service(error) => (service_status(error.kind()), error.code()),
            ApiError::Artifact(error) => artifact_status(error),
            ApiError::WriteNotGranted(_) => (StatusCode::FORBIDDEN, "write_not_granted"),
            ApiError::NoSuchBlob(_) => (StatusCode::NOT_FOUND, "no_such_blob"),
        }
    }

    fn class(&self) -> ErrorClass<'_> {
        match self {
            ApiError::Service(error) => ErrorClass::Service(error),
            ApiError::Internal(_)
            | ApiError::Artifact(ArtifactError::Io { .. } | ArtifactError::Failed(_) | ArtifactError::Bucket(_)) => {
                ErrorClass::Internal
            }
            ApiError::RequestTimeout => ErrorClass::TimedOut,
            ApiError::RangeNotSatisfiable { length } | ApiError::TooManyRanges { length, .. } => {
                ErrorClass::Unsatisfiable { length: *length }
            }
            _ => ErrorClass::Plain,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let parts = ErrorParts::of(&self, self.class(), "http");
        let mut body = json!({ "error": { "code": code, "message": parts.message } });
        let reason = match &self {
            ApiError::Service(error) => error.reason(),
            ApiError::Artifact(ArtifactError::Signature { refused, .. }) => Some(refused.code()),
            _ => None,
        };
        if let Some(reason) = reason {
            body["error"]["reason"] = json!(reason);
        }
        let mut response = (status, axum::Json(body)).into_response();
        parts.add_headers(response.headers_mut());
        if let ApiError::Unauthorized { invalid } = self {
            let challenge =
                if invalid { r#"Bearer realm="ztserve", error="invalid_token""# } else { r#"Bearer realm="ztserve""# };
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
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
    /// Shutting down: requests in flight finish, new ones belong elsewhere.
    Draining,
}

/// `/readyz`'s status: load balancers route only to a 200.
pub(crate) fn readiness_status(readiness: Readiness) -> StatusCode {
    match readiness {
        Readiness::Ready | Readiness::Degraded => StatusCode::OK,
        Readiness::Starting | Readiness::Unavailable | Readiness::Draining => StatusCode::SERVICE_UNAVAILABLE,
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
