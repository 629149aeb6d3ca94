//! `HubError` and the only place the Hub API chooses statuses and error codes. Each answers as
//! the Hub does, so `huggingface_hub` raises the same exception it would against the Hub:
//! `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound` with `X-Repo-Commit`),
//! `X-Error-Message`, and a JSON body `{"error": "..."}`. 5xx bodies stay generic; details go to
//! the log.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::service::ServiceError;
use crate::transport::respond::ByteRefusal;

#[derive(Debug, thiserror::Error)]
pub(crate) enum HubError {
    /// No such repository for this caller: one that does not exist or that the caller's token
    /// does not allow, alike. `anonymous`: the request had no token where one is needed.
    #[error("Repository Not Found for {repo:?}")]
    RepoNotFound { repo: String, anonymous: bool },
    #[error("Invalid credentials in Authorization header")]
    InvalidCredentials,
    #[error("Invalid rev id: {revision}")]
    RevisionNotFound { repo: String, revision: String },
    #[error("Entry not found: {path:?} in {repo:?} at {commit}")]
    EntryNotFound { repo: String, path: String, commit: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("no Hub API route {0}")]
    RouteNotFound(String),
    #[error("{0} is not served by ztserve's Hub API (it serves model info, trees, paths-info and resolve)")]
    NotServed(String),
    #[error("method {method} is not allowed here; {allowed} is")]
    MethodNotAllowed { method: String, allowed: &'static str },
    /// The answer did not start within `request_timeout_secs`.
    #[error("the answer did not start within the request timeout; retry shortly")]
    RequestTimeout,
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Bytes(#[from] ByteRefusal),
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// The status of an error of the service, whether a handler or a body's source met it.
fn service_status(error: &ServiceError) -> StatusCode {
    use ServiceError as S;
    match error {
        S::NotReady
        | S::ChangedOnDisk { .. }
        | S::DecodersBusy
        | S::Storage { .. }
        | S::NotCached { .. }
        | S::DigestPending { .. } => StatusCode::SERVICE_UNAVAILABLE,
        S::BrokenModel { .. } | S::InvalidComponent { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl HubError {
    fn status_and_code(&self) -> (StatusCode, Option<&'static str>) {
        match self {
            HubError::RepoNotFound { anonymous: true, .. } => (StatusCode::UNAUTHORIZED, Some("RepoNotFound")),
            HubError::RepoNotFound { .. } => (StatusCode::NOT_FOUND, Some("RepoNotFound")),
            HubError::InvalidCredentials => (StatusCode::UNAUTHORIZED, None),
            HubError::RevisionNotFound { .. } => (StatusCode::NOT_FOUND, Some("RevisionNotFound")),
            HubError::EntryNotFound { .. } => (StatusCode::NOT_FOUND, Some("EntryNotFound")),
            HubError::BadRequest(_) => (StatusCode::BAD_REQUEST, None),
            HubError::RouteNotFound(_) => (StatusCode::NOT_FOUND, None),
            HubError::NotServed(_) => (StatusCode::NOT_IMPLEMENTED, None),
            HubError::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, None),
            HubError::Bytes(ByteRefusal::RangeNotSatisfiable { .. } | ByteRefusal::TooManyRanges { .. }) => {
                (StatusCode::RANGE_NOT_SATISFIABLE, None)
            }
            HubError::RequestTimeout => (StatusCode::SERVICE_UNAVAILABLE, None),
            HubError::Service(error) | HubError::Bytes(ByteRefusal::Source(error)) => (service_status(error), None),
            HubError::Internal(_) | HubError::Bytes(_) => (StatusCode::INTERNAL_SERVER_ERROR, None),
        }
    }
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %self, "Hub API request failed");
            "internal error; see the server log".to_owned()
        } else {
            if let HubError::Service(ServiceError::Storage { .. }) = &self {
                tracing::warn!(error = %self, "storage failed");
            }
            match &self {
                // The store's own words (endpoints, request ids) go to the log only.
                HubError::Service(ServiceError::Storage { model, .. }) => {
                    format!("the source of model {model:?} is unavailable; retry later")
                }
                _ => self.to_string(),
            }
        };
        let mut response = (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
        let headers = response.headers_mut();
        // A header value holds no control characters; the JSON body has the message whole.
        let printable: String = message.chars().map(|c| if c.is_ascii_graphic() { c } else { ' ' }).collect();
        headers.insert(HeaderName::from_static("x-error-message"), HeaderValue::from_str(&printable).expect("ASCII"));
        if let Some(code) = code {
            headers.insert(HeaderName::from_static("x-error-code"), HeaderValue::from_static(code));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // huggingface_hub 2.x waits Retry-After (plus 1 s) before each of its retries.
            let after = match &self {
                HubError::Service(error) | HubError::Bytes(ByteRefusal::Source(error)) => error.retry_after_secs(),
                _ => None,
            };
            headers.insert(header::RETRY_AFTER, HeaderValue::from(after.unwrap_or(1)));
        }
        match self {
            HubError::EntryNotFound { commit, .. } => {
                headers.insert(HeaderName::from_static("x-repo-commit"), HeaderValue::from_str(&commit).expect("hex"));
            }
            HubError::Bytes(
                ByteRefusal::RangeNotSatisfiable { length } | ByteRefusal::TooManyRanges { length, .. },
            ) => {
                let value = HeaderValue::from_str(&format!("bytes */{length}")).expect("ASCII");
                headers.insert(header::CONTENT_RANGE, value);
            }
            HubError::MethodNotAllowed { allowed, .. } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
            }
            HubError::RepoNotFound { anonymous: true, .. } | HubError::InvalidCredentials => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(r#"Bearer realm="ztserve""#));
            }
            _ => {}
        }
        response
    }
}
