//! Operational routes: liveness, readiness and Prometheus metrics.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;

/// 200 while the process lives.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// 503 until the first index completes, then 200 with the catalog's counts.
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    if !state.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "starting" })));
    }
    let catalog = state.catalog();
    let broken = catalog.models().filter(|m| m.state.is_err()).count();
    let unreadable: Vec<Value> =
        catalog.unreadable_sources.iter().map(|(source, reason)| json!({ "source": source, "reason": reason })).collect();
    (
        StatusCode::OK,
        Json(json!({ "status": "ready", "models": catalog.models().count(), "broken": broken, "unreadable_sources": unreadable })),
    )
}

/// Prometheus text exposition of every metric the process records.
pub async fn metrics() -> impl axum::response::IntoResponse {
    let handle = crate::telemetry::metrics();
    handle.run_upkeep();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render())
}
