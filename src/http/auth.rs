//! HTTP's side of access control ([`crate::access`]): tokens presented as
//! `Authorization: Bearer`, checked on every request by [`require_token`], which records what
//! the request may read as its [`Access`]. `/healthz` and `/readyz` stay open, `/metrics` is
//! open unless `metrics_require_token` is set.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};
use crate::access::{Access, Refused};
use crate::transport::client_names;

/// Paths anyone may reach: probes must work without credentials.
fn is_open_path(path: &str, metrics_open: bool) -> bool {
    matches!(path, "/healthz" | "/readyz") || (metrics_open && path == "/metrics")
}

/// Middleware: admits a request with a valid token (or to an open path) and records what it
/// may read as its [`Access`]; answers 401 otherwise.
pub(super) async fn require_token(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let tokens = &state.tokens;
    let access = if is_open_path(request.uri().path(), !state.config().auth.metrics_require_token) {
        Access::Everything
    } else {
        match tokens.verdict(crate::access::bearer(request.headers()), client_names(request.extensions())).access() {
            Ok(access) => access,
            Err(refused) => return ApiError::Unauthorized { invalid: refused == Refused::Invalid }.into_response(),
        }
    };
    request.extensions_mut().insert(access);
    next.run(request).await
}
