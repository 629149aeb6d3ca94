//! `HubError` and the only place the Hub API chooses statuses and error codes. Each answers as
//! the Hub does, so `huggingface_hub` raises the same exception it would against the Hub:
//! `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound` with `X-Repo-Commit`),
//! `X-Error-Message`, and a JSON body `{"error": "..."}`. Service failures are placed by their
//! kind; an internal error's body stays generic and its detail goes to the log, once.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::service::{ErrorKind, ServiceError};
use crate::transport::error_parts::{ErrorClass, ErrorParts};
use crate::transport::respond::ByteRefusal;

#[derive(Debug, thiserror::Error)]
pub(crate) enum HubError {
    /// No such repository for this caller: one that does not exist or that the caller's token
    /// does not allow, alike. `anonymous`: the request had no token where one is needed.
    #[error("Repository Not Found for {repo:?}")]
    RepoNotFound { repo: String, anonymous: bool },
    #[error("Invalid credentials in Authorization header")]
    InvalidCredentials,
    /// A listing asked without a token, where tokens are needed.
    #[error("a token is required to list repositories (Authorization: Bearer <token>)")]
    TokenRequired,
    #[error("Invalid rev id: {revision}")]
    RevisionNotFound { repo: String, revision: String },
    #[error("Entry not found: {path:?} in {repo:?} at {commit}")]
    EntryNotFound { repo: String, path: String, commit: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("no Hub API route {0}")]
    RouteNotFound(String),
    /// A route of the Hub's API that ztserve does not serve (writes, discussions, …): the
    /// Hub's answer for what it does not have, not a failure of ours.
    #[error(
        "{0} is not served by ztserve's Hub API (it serves model listings and info, trees, paths-info and resolve)"
    )]
    NotServed(String),
    #[error("method {method} is not allowed here; {allowed} is")]
    MethodNotAllowed { method: String, allowed: &'static str },
    /// The answer did not start within `request_timeout_secs`.
    #[error("the answer did not start within the request timeout; retry shortly")]
    RequestTimeout,
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Bytes(#[from] ByteRefusal<ServiceError>),
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// The Hub's status for each kind of service failure, whether a handler or a body's source
/// met it.
fn service_status(kind: ErrorKind) -> StatusCode {
    match kind {
        // huggingface_hub knows no 410: a version no longer kept is a repository it cannot find.
        ErrorKind::NotFound | ErrorKind::Gone => StatusCode::NOT_FOUND,
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::Refused => StatusCode::UNPROCESSABLE_ENTITY,
        // huggingface_hub retries a 503 (2.x after Retry-After plus a second); it sees no 429.
        ErrorKind::Busy { .. } | ErrorKind::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
    }
}

impl HubError {
    fn status_and_code(&self) -> (StatusCode, Option<&'static str>) {
        match self {
            HubError::RepoNotFound { anonymous: true, .. } => (StatusCode::UNAUTHORIZED, Some("RepoNotFound")),
            HubError::RepoNotFound { .. } => (StatusCode::NOT_FOUND, Some("RepoNotFound")),
            HubError::InvalidCredentials | HubError::TokenRequired => (StatusCode::UNAUTHORIZED, None),
            HubError::RevisionNotFound { .. } => (StatusCode::NOT_FOUND, Some("RevisionNotFound")),
            HubError::EntryNotFound { .. } => (StatusCode::NOT_FOUND, Some("EntryNotFound")),
            HubError::BadRequest(_) => (StatusCode::BAD_REQUEST, None),
            HubError::RouteNotFound(_) => (StatusCode::NOT_FOUND, None),
            HubError::NotServed(_) => (StatusCode::NOT_FOUND, None),
            HubError::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, None),
            HubError::Bytes(ByteRefusal::RangeNotSatisfiable { .. } | ByteRefusal::TooManyRanges { .. }) => {
                (StatusCode::RANGE_NOT_SATISFIABLE, None)
            }
            HubError::RequestTimeout => (StatusCode::SERVICE_UNAVAILABLE, None),
            HubError::Service(error) | HubError::Bytes(ByteRefusal::Source(error)) => {
                (service_status(error.kind()), None)
            }
            HubError::Internal(_) | HubError::Bytes(ByteRefusal::Internal(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, None)
            }
        }
    }
}

impl HubError {
    fn class(&self) -> ErrorClass<'_> {
        match self {
            HubError::Service(error) => ErrorClass::Service(error),
            HubError::Bytes(refusal) => refusal.class(),
            HubError::Internal(_) => ErrorClass::Internal,
            HubError::RequestTimeout => ErrorClass::TimedOut,
            _ => ErrorClass::Plain,
        }
    }
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let parts = ErrorParts::of(&self, self.class(), "hub");
        let mut response = (status, axum::Json(serde_json::json!({ "error": parts.message }))).into_response();
        let headers = response.headers_mut();
        // huggingface_hub 2.x waits Retry-After (plus 1 s) before each of its retries.
        parts.add_headers(headers);
        // A header value holds no control characters; the JSON body has the message whole.
        let printable: String = parts.message.chars().map(|c| if c.is_ascii_graphic() { c } else { ' ' }).collect();
        headers.insert(HeaderName::from_static("x-error-message"), HeaderValue::from_str(&printable).expect("ASCII"));
        if let Some(code) = code {
            headers.insert(HeaderName::from_static("x-error-code"), HeaderValue::from_static(code));
        }
        match self {
            HubError::EntryNotFound { commit, .. } => {
                headers.insert(HeaderName::from_static("x-repo-commit"), HeaderValue::from_str(&commit).expect("hex"));
            }
            HubError::MethodNotAllowed { allowed, .. } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
            }
            HubError::RepoNotFound { anonymous: true, .. } | HubError::InvalidCredentials | HubError::TokenRequired => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(r#"Bearer realm="ztserve""#));
            }
            _ => {}
        }
        response
    }
}
