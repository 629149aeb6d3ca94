//! The HTTP contract (`openapi.yaml`) over the service: the router, its bearer-token check
//! ([`auth`]) and the layers of its JSON routes ([`coding`]: compression, coded ETags), the
//! handlers (models, objects, regions, deltas, operations), the lookups they share ([`lookup`]), and errors (the only place HTTP statuses are chosen). Handlers extract typed
//! paths, ask the service, evaluate ranges and conditionals, and set headers. Natural model ids
//! (`/models/org/llama/...`) are rewritten to the one-segment form before routing
//! ([`natural`]). The connection loop and the layers every protocol shares are
//! [`crate::transport`]'s; the server builds [`app`] and runs it.

pub(crate) mod artifacts;
mod auth;
mod coding;
mod deltas;
mod error;
mod lookup;
mod manifest;
mod models;
mod natural;
mod objects;
mod ops;
mod regions;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::get;

pub(crate) use error::ApiError;

use self::coding::{coded_etags, compressed_json};
pub(crate) use self::lookup::{ReadyModel, header_value};
use crate::access::Tokens;
use crate::api::routes;
use crate::config::Config;
use crate::service::Service;
use crate::transport::Refusals;

pub(crate) use self::manifest::render as render_manifest;

/// What every handler shares: the domain, the bearer tokens the HTTP layer checks, and the
/// configuration the composition root read.
pub(crate) struct AppState {
    pub service: Arc<Service>,
    /// The bearer tokens accepted, if any are required.
    pub tokens: Arc<Tokens>,
    config: Arc<Config>,
}

impl AppState {
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }
}

/// The router with every route and layer, over `service`, checking `tokens`, as `config` says.
pub(crate) fn app(service: Arc<Service>, tokens: Arc<Tokens>, config: Arc<Config>) -> Router {
    let state = Arc::new(AppState { service, tokens, config });
    let state_for_ids = Arc::clone(&state);
    let router = Router::new()
        .route(routes::HEALTHZ, get(ops::healthz))
        .route(routes::READYZ, get(ops::readyz))
        .route(routes::METRICS, get(ops::metrics))
        .route(routes::MODELS, get(models::list).layer(compressed_json()))
        .route(
            routes::MANIFEST,
            get(models::manifest).layer(compressed_json()).layer(axum::middleware::from_fn(coded_etags)),
        )
        .route(routes::FILE, get(models::file))
        .route(routes::STORED_FILE, get(models::file))
        .route(routes::VIEW_FILE, get(models::view_file))
        .route(routes::PREFETCH, get(models::prefetch_progress).post(models::prefetch))
        .route(routes::REGIONS, axum::routing::post(regions::regions))
        .route(routes::DELTAS, axum::routing::post(deltas::deltas))
        .route(routes::OBJECT, get(objects::object))
        .route(routes::COMPONENT, get(objects::component))
        .route(routes::UNNAMED_OBJECT, get(objects::object))
        .route(routes::UNNAMED_COMPONENT, get(objects::component))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside the trace and metrics layers, so refusals are logged and counted too.
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), auth::require_token))
        .with_state(Arc::clone(&state));
    let refusals = Refusals {
        panicked: || ApiError::Internal("a handler panicked".into()).into_response(),
        timed_out: || ApiError::RequestTimeout.into_response(),
    };
    let labels = crate::transport::RouteLabels { routes: routes::ALL, unmatched: |_| "unmatched" };
    let routed = crate::transport::with_common_layers(router, state.config(), labels, refusals);
    // Natural ids (`/models/org/llama/...`) are rewritten before the routes match: the whole
    // router sits behind the rewrite, which middleware of its own would run too late for.
    let rewrite = tower::util::MapRequestLayer::new(move |request: Request| {
        let listing = state_for_ids.service.listing();
        let is_model = |id: &str| {
            listing.get(id).is_some()
                || crate::api::split_pinned(id).is_some_and(|(base, _)| listing.get(base).is_some())
        };
        natural::rewrite_request(request, is_model)
    });
    Router::new().fallback_service(tower::Layer::layer(&rewrite, routed))
}

async fn fallback(request: Request) -> ApiError {
    ApiError::RouteNotFound(request.uri().path().to_owned())
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::MethodNotAllowed(request.method().to_string())
}
