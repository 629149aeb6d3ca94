//! Operational routes: liveness, readiness and Prometheus metrics.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;
use super::error::{Readiness, readiness_status};
use crate::storage::StorageError;

/// 200 while the process lives.
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// 503 until the first index completes, and 503 `draining` from the moment shutdown begins.
/// Otherwise each source with its health: 200 `ready` when every source answers, 200
/// `degraded` when some do not (their models answer 503 while the others serve), 503
/// `unavailable` when none does.
pub(super) async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    if state.service.is_draining() {
        return (readiness_status(Readiness::Draining), Json(json!({ "status": "draining" })));
    }
    if !state.service.is_ready() {
        return (readiness_status(Readiness::Starting), Json(json!({ "status": "starting" })));
    }
    let listing = state.service.listing();
    let broken = listing.models().filter(|m| m.state.is_err()).count();
    let sources: Vec<Value> = state
        .service
        .sources()
        .iter()
        .map(|source| {
            let mut entry = json!({ "source": source.name, "backend": source.kind(), "status": "ok" });
            if source.is_cached() {
                entry["disk_cache"] = json!(true);
            }
            if let Some(failure) = source.failure() {
                let status = if matches!(failure, StorageError::Refused { .. }) { "refused" } else { "unavailable" };
                entry["status"] = json!(status);
                entry["reason"] = json!(failure.to_string());
                if source.is_cached() {
                    entry["serving_from"] = json!("disk_cache");
                }
            }
            entry
        })
        .collect();
    let failing = sources.iter().filter(|s| s["status"] != "ok").count();
    // A failing source with a disk cache still serves what the cache holds.
    let unserved = sources.iter().filter(|s| s["status"] != "ok" && s["serving_from"].is_null()).count();
    let (readiness, word) = match (failing, unserved) {
        (0, _) => (Readiness::Ready, "ready"),
        (_, n) if n < sources.len() => (Readiness::Degraded, "degraded"),
        _ => (Readiness::Unavailable, "unavailable"),
    };
    // Digests are computed in the background: readiness never waits for them.
    let digests = listing.digest_totals().to_json();
    let body = json!({
        "status": word,
        "models": listing.models().count(),
        "broken": broken,
        "sources": sources,
        "digests": digests,
    });
    (readiness_status(readiness), Json(body))
}

/// Prometheus text exposition of every metric the process records.
pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> impl axum::response::IntoResponse {
    state.service.listing().publish_signature_gauge();
    let handle = crate::telemetry::metrics();
    handle.run_upkeep();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render())
}
