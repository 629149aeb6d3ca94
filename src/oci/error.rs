//! The distribution API's errors: the spec's JSON body `{"errors": [{"code", "message",
//! "detail"}]}` and status for each code (service failures placed by their kind), the bearer
//! challenge on 401, `Allow` on 405. The only place the registry's statuses and codes are chosen.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::service::{ErrorKind, ServiceError};
use crate::transport::error_parts::{ErrorClass, ErrorParts};
use crate::transport::respond::ByteRefusal;

#[derive(Debug, thiserror::Error)]
pub(crate) enum OciError {
    #[error("repository name not known to registry: {name:?}")]
    NameUnknown { name: String },
    #[error("manifest unknown: {reference:?} of {name:?} (tags: latest and the model's current version)")]
    ManifestUnknown { name: String, reference: String },
    #[error("blob unknown to registry: {digest:?} is no layer or config of {name:?}'s current manifest")]
    BlobUnknown { name: String, digest: String },
    #[error("provided digest did not match the expected form sha256:<64 lowercase hex>: {0:?}")]
    DigestInvalid(String),
    #[error("authentication required")]
    Unauthorized {
        /// The `WWW-Authenticate` challenge.
        challenge: String,
    },
    #[error("requested access to the resource is denied: the token may not read {name:?}")]
    Denied { name: String },
    #[error("the registry is read-only: {method} is not supported here; {allowed} is")]
    Unsupported { method: String, allowed: &'static str },
    #[error("no such route of the distribution API: {0}")]
    RouteUnknown(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the answer did not start within the request timeout; retry shortly")]
    RequestTimeout,
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Bytes(#[from] ByteRefusal<ServiceError>),
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// How each kind of service failure reads to a registry client.
fn service_status(error: &ServiceError) -> (StatusCode, &'static str) {
    match error.kind() {
        ErrorKind::NotFound if matches!(error, ServiceError::ModelNotFound(_) | ServiceError::VersionGone { .. }) => {
            (StatusCode::NOT_FOUND, "NAME_UNKNOWN")
        }
        // The distribution API has no 410: a lineage's version no longer kept is a name unknown.
        ErrorKind::Gone => (StatusCode::NOT_FOUND, "NAME_UNKNOWN"),
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, "BLOB_UNKNOWN"),
        ErrorKind::BadInput => (StatusCode::BAD_REQUEST, "UNSUPPORTED"),
        ErrorKind::Refused => (StatusCode::UNPROCESSABLE_ENTITY, "MANIFEST_INVALID"),
        // 429, not 503: containers/image (skopeo, podman, CRI-O) retries a 429 by itself, after
        // its Retry-After (up to 60 s, five tries), and nothing else.
        ErrorKind::Busy { .. } => (StatusCode::TOO_MANY_REQUESTS, "TOOMANYREQUESTS"),
        ErrorKind::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN"),
        ErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "SIZE_INVALID"),
    }
}

impl OciError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            OciError::NameUnknown { .. } => (StatusCode::NOT_FOUND, "NAME_UNKNOWN"),
            OciError::ManifestUnknown { .. } => (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN"),
            OciError::BlobUnknown { .. } => (StatusCode::NOT_FOUND, "BLOB_UNKNOWN"),
            OciError::DigestInvalid(_) => (StatusCode::BAD_REQUEST, "DIGEST_INVALID"),
            OciError::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            OciError::Denied { .. } => (StatusCode::FORBIDDEN, "DENIED"),
            OciError::Unsupported { .. } => (StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED"),
            OciError::RouteUnknown(_) => (StatusCode::NOT_FOUND, "UNSUPPORTED"),
            OciError::BadRequest(_) => (StatusCode::BAD_REQUEST, "UNSUPPORTED"),
            OciError::RequestTimeout => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
            OciError::Bytes(ByteRefusal::RangeNotSatisfiable { .. } | ByteRefusal::TooManyRanges { .. }) => {
                (StatusCode::RANGE_NOT_SATISFIABLE, "BLOB_UNKNOWN")
            }
            OciError::Bytes(ByteRefusal::Source(error)) | OciError::Service(error) => service_status(error),
            OciError::Internal(_) | OciError::Bytes(ByteRefusal::Internal(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN")
            }
        }
    }
}

impl OciError {
    fn class(&self) -> ErrorClass<'_> {
        match self {
            OciError::Service(error) => ErrorClass::Service(error),
            OciError::Bytes(refusal) => refusal.class(),
            OciError::Internal(_) => ErrorClass::Internal,
            OciError::RequestTimeout => ErrorClass::TimedOut,
            _ => ErrorClass::Plain,
        }
    }
}

impl IntoResponse for OciError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let parts = ErrorParts::of(&self, self.class(), "oci");
        let body = serde_json::json!({ "errors": [{ "code": code, "message": parts.message, "detail": null }] });
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        parts.add_headers(headers);
        // Also on the layers' refusals (a panic, a timeout), which answer without `dispatch`.
        headers.insert(super::API_VERSION.0, HeaderValue::from_static(super::API_VERSION.1));
        match self {
            OciError::Unauthorized { challenge } => {
                if let Ok(value) = HeaderValue::from_str(&challenge) {
                    headers.insert(header::WWW_AUTHENTICATE, value);
                }
            }
            OciError::Unsupported { allowed, .. } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
            }
            _ => {}
        }
        response
    }
}
