//! The HTTP contract of ARCHITECTURE.md over the service: the router and its layers (tracing,
//! timeout, concurrency limit, panic catching, bearer tokens), the shared state (the service
//! and the tokens), signals and graceful shutdown. Handlers extract typed paths, ask the
//! service, evaluate ranges and conditionals, and set headers. Natural model ids
//! (`/models/org/llama/...`) are rewritten to the one-segment form before routing
//! ([`natural`]). `app(state)` is the test seam.

pub mod auth;
mod connections;
pub use connections::ConnectionLimits;
mod error;
mod models;
mod natural;
mod objects;
mod ops;
pub mod range;
mod respond;
mod zero_copy;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{RawPathParams, Request};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

pub use error::ApiError;

use crate::api::routes;
use crate::catalog::Model;
use crate::config::{Config, OnUnreadableSource};
use crate::service::{Service, ServiceError};
use crate::telemetry::names;

/// What every handler shares: the domain, and the bearer tokens the HTTP layer checks.
pub struct AppState {
    pub service: Arc<Service>,
    /// The bearer tokens accepted, if any are required.
    pub tokens: Arc<auth::Tokens>,
}

impl AppState {
    /// A state over a new [`Service`] (empty catalog, not yet ready).
    pub fn new(config: Config) -> anyhow::Result<Arc<AppState>> {
        // Installed before anything is recorded, so nothing is lost before the first scrape.
        crate::telemetry::metrics();
        let keep_s3_secrets = config.s3_listen_address().is_some();
        let tokens = Arc::new(auth::Tokens::new(&config.tokens, &config.token_file, keep_s3_secrets)?);
        Ok(Arc::new(AppState { service: Service::new(config)?, tokens }))
    }

    pub fn config(&self) -> &Config {
        &self.service.config
    }
}

/// The router with every route and layer.
pub fn app(state: Arc<AppState>) -> Router {
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
        .route(routes::OBJECT, get(objects::object))
        .route(routes::COMPONENT, get(objects::component))
        .route(routes::UNNAMED_OBJECT, get(objects::object))
        .route(routes::UNNAMED_COMPONENT, get(objects::component))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside the trace and metrics layers, so refusals are logged and counted too.
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), auth::require_token))
        .with_state(Arc::clone(&state));
    let routed = with_common_layers(router, state.config(), "unmatched");
    // Natural ids (`/models/org/llama/...`) are rewritten before the routes match: the whole
    // router sits behind the rewrite, which middleware of its own would run too late for.
    let rewrite = tower::util::MapRequestLayer::new(move |request: Request| {
        let catalog = state_for_ids.service.catalog();
        let is_model = |id: &str| {
            catalog.get(id).is_some()
                || crate::api::split_pinned(id).is_some_and(|(base, _)| catalog.get(base).is_some())
        };
        natural::rewrite_request(request, is_model)
    });
    Router::new().fallback_service(tower::Layer::layer(&rewrite, routed))
}

/// What metrics and logs call the route of a request no route pattern matched.
#[derive(Clone, Copy)]
struct RouteLabel(&'static str);

/// The layers every listener's requests pass: metrics (labelled by the matched route, else
/// `unmatched_route`), tracing, panic catching, the request timeout and the concurrency limit.
pub(crate) fn with_common_layers(router: Router, config: &Config, unmatched_route: &'static str) -> Router {
    let timeout = config.request_timeout_secs;
    let layers = ServiceBuilder::new()
        .layer(axum::Extension(RouteLabel(unmatched_route)))
        .layer(axum::middleware::from_fn(metered))
        .layer(TraceLayer::new_for_http().make_span_with(request_span).on_request(()).on_response(record_response))
        .layer(CatchPanicLayer::custom(|_: Box<dyn std::any::Any + Send>| {
            ApiError::Internal("a handler panicked".into()).into_response()
        }))
        .option_layer(
            (timeout > 0).then(|| axum::middleware::from_fn_with_state(Duration::from_secs(timeout), answer_within)),
        )
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(config.max_concurrent_requests));
    router.layer(layers)
}

/// The route a request is counted and logged under.
fn route_of(request: &Request) -> &'static str {
    match request.extensions().get::<axum::extract::MatchedPath>() {
        Some(path) => routes::ALL.iter().copied().find(|r| *r == path.as_str()).unwrap_or("unmatched"),
        None => request.extensions().get::<RouteLabel>().map_or("unmatched", |l| l.0),
    }
}

/// gzip or zstd for the JSON routes when the client accepts it: the manifest of a model of
/// thousands of tensors runs to megabytes of repetitive text. Only on these routes, so tensor
/// bytes are never touched (a stored zstd frame is passed through by its own route).
fn compressed_json() -> tower_http::compression::CompressionLayer<impl tower_http::compression::Predicate> {
    use tower_http::compression::Predicate as _;
    let json = |_: axum::http::StatusCode,
                _: axum::http::Version,
                headers: &axum::http::HeaderMap,
                _: &axum::http::Extensions| {
        headers.get(axum::http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
    };
    tower_http::compression::CompressionLayer::new()
        .compress_when(tower_http::compression::predicate::SizeAbove::new(1024).and(json))
}

/// The content codings the JSON routes may answer with, as they tag ETags.
const CODINGS: [&str; 2] = ["gzip", "zstd"];

/// A compressed manifest is a representation of its own, so its strong ETag names the coding
/// (`"…-gzip"`): a cache never takes one coding's bytes for another's. An `If-None-Match` naming
/// a coded tag is compared as the tag it was made from, and a 304 answers with the tag the
/// client sent.
async fn coded_etags(mut request: Request, next: axum::middleware::Next) -> Response {
    use axum::http::header::{CONTENT_ENCODING, ETAG, IF_NONE_MATCH};
    let uncoded = |tag: &str| {
        CODINGS.iter().find_map(|coding| {
            let base = tag.strip_suffix(&format!("-{coding}\""))?;
            Some((format!("{base}\""), *coding))
        })
    };
    // The coded tags the client sent, by the tag each was made from.
    let mut sent: Vec<(String, &'static str)> = Vec::new();
    if let Some(value) = request.headers().get(IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let tags: Vec<String> = value
            .split(',')
            .map(|tag| {
                let tag = tag.trim();
                match uncoded(tag) {
                    Some((base, coding)) => {
                        sent.push((base.clone(), coding));
                        base
                    }
                    None => tag.to_owned(),
                }
            })
            .collect();
        if !sent.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&tags.join(", ")) {
                request.headers_mut().insert(IF_NONE_MATCH, value);
            }
        }
    }
    let mut response = next.run(request).await;
    let etag = response.headers().get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let coding = match response.headers().get(CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        Some(coding) => CODINGS.iter().copied().find(|c| *c == coding),
        None if response.status() == axum::http::StatusCode::NOT_MODIFIED => {
            sent.iter().find(|(base, _)| Some(base) == etag.as_ref()).map(|(_, coding)| *coding)
        }
        None => None,
    };
    if let (Some(etag), Some(coding)) = (etag, coding) {
        if let Some(base) = etag.strip_suffix('"') {
            if let Ok(value) = HeaderValue::from_str(&format!("{base}-{coding}\"")) {
                response.headers_mut().insert(ETAG, value);
            }
        }
    }
    response
}

/// Answers `request_timeout` when the answer has not started within `limit` (a body then
/// streams for as long as the client reads it).
async fn answer_within(
    axum::extract::State(limit): axum::extract::State<Duration>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    tokio::time::timeout(limit, next.run(request)).await.unwrap_or_else(|_| ApiError::RequestTimeout.into_response())
}

/// One span per request; handlers fill in `model` and `object`, the response fills in
/// `status`, `bytes` and `duration_ms`.
fn request_span(request: &Request) -> tracing::Span {
    let route = route_of(request);
    tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        path = %request.uri().path(),
        model = tracing::field::Empty,
        object = tracing::field::Empty,
        cache = tracing::field::Empty,
        digest = tracing::field::Empty,
        status = tracing::field::Empty,
        bytes = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    )
}

/// Completes the request span and logs one line per request.
fn record_response<B: axum::body::HttpBody>(
    response: &axum::http::Response<B>,
    latency: Duration,
    span: &tracing::Span,
) {
    let declared =
        response.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let bytes = declared.or_else(|| response.body().size_hint().exact());
    span.record("status", response.status().as_u16());
    if let Some(bytes) = bytes {
        span.record("bytes", bytes);
    }
    span.record("duration_ms", latency.as_micros() as f64 / 1e3);
    tracing::info!(parent: span, "response");
}

/// Counts each request by route, method and status, and its body bytes and duration as the
/// body is sent (a streamed body's time is the time to its end, or to its abort).
async fn metered(request: Request, next: axum::middleware::Next) -> Response {
    let route = route_of(&request).to_owned();
    let method = request.method().to_string();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(names::HTTP_REQUESTS, "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    let sent = metrics::counter!(names::HTTP_RESPONSE_BYTES, "route" => route.clone());
    let duration = metrics::histogram!(names::HTTP_DURATION, "route" => route);
    response.map(|body| axum::body::Body::new(MeteredBody { body, sent, duration, started }))
}

/// A response body that counts the bytes it yields and records its duration when dropped.
struct MeteredBody {
    body: axum::body::Body,
    sent: metrics::Counter,
    duration: metrics::Histogram,
    started: std::time::Instant,
}

impl http_body::Body for MeteredBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.sent.increment(data.len() as u64);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        self.duration.record(self.started.elapsed().as_secs_f64());
    }
}

async fn fallback(request: Request) -> ApiError {
    ApiError::RouteNotFound(request.uri().path().to_owned())
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::MethodNotAllowed(request.method().to_string())
}

/// Path parameters by name, percent-decoded; invalid UTF-8 is a 400 in our JSON shape.
pub(crate) fn path_params(
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Result<Vec<(String, String)>, ApiError> {
    let params = params.map_err(|e| ApiError::BadRequest(format!("path is not valid percent-encoded UTF-8: {e}")))?;
    Ok(params.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
}

/// The parameter `name`; an object name the route leaves empty (`/objects/`) is `""`.
pub(crate) fn param<'a>(params: &'a [(String, String)], name: &str) -> &'a str {
    params.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
}

/// Looks a model up, refusing when not ready, unknown or broken. `id` may pin a version,
/// `{id}@{version}` (the `X-Zt-Model-Version` without its quotes), unless a model has that exact
/// id: a version that is no longer the model's answers `version_gone`.
/// A model outside the request's [`auth::Access`] is answered exactly as an unknown one.
pub(crate) fn ready_model(
    state: &AppState,
    access: &auth::Access,
    id: &str,
) -> Result<(Arc<Model>, Arc<crate::format::Manifest>), ApiError> {
    tracing::Span::current().record("model", id);
    let (base, pinned) = match crate::api::split_pinned(id) {
        Some((base, version)) if state.service.catalog().get(id).is_none() => (base, Some(version)),
        _ => (id, None),
    };
    if state.service.is_ready() && !access.allows(base) {
        return Err(ServiceError::ModelNotFound(id.to_owned()).into());
    }
    let (model, manifest) = state.service.model(base)?;
    match pinned {
        Some(version) if version != crate::service::version_token(&model) => Err(ServiceError::VersionGone {
            model: base.to_owned(),
            version: version.to_owned(),
            current: crate::service::version_token(&model),
        }
        .into()),
        _ => Ok((model, manifest)),
    }
}

/// `Cache-Control` of a response drawn from `model` for the id a request named: a version-pinned
/// URL never changes, so a cache may keep it for a year without asking again; any other is
/// revalidated by its ETag before each use.
pub(crate) fn cache_control(requested: &str, model: &Model) -> (axum::http::HeaderName, HeaderValue) {
    const IMMUTABLE: HeaderValue = HeaderValue::from_static("public, max-age=31536000, immutable");
    let value = if requested == model.id { respond::REVALIDATE } else { IMMUTABLE };
    (axum::http::header::CACHE_CONTROL, value)
}

pub(crate) fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Serves until SIGTERM or SIGINT, then gives in-flight requests the drain time to finish.
pub async fn serve(state: Arc<AppState>) -> anyhow::Result<()> {
    let addr = state.config().listen;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    tracing::info!(address = %listener.local_addr()?, sources = ?state.config().sources, "listening");
    let s3 = match state.config().s3_listen_address() {
        Some(addr) => {
            let s3 = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for the S3 endpoint: {e}"))?;
            let bucket = &state.config().s3_endpoint_bucket;
            tracing::info!(address = %s3.local_addr()?, bucket = %bucket, "S3 endpoint listening");
            Some(s3)
        }
        None => None,
    };
    serve_with_s3(listener, s3, state).await
}

/// [`serve`] on an already bound listener (tests bind 127.0.0.1:0).
pub async fn serve_on(listener: tokio::net::TcpListener, state: Arc<AppState>) -> anyhow::Result<()> {
    serve_with_s3(listener, None, state).await
}

/// [`serve`] on already bound listeners: the HTTP routes on `listener`, and the S3 endpoint on
/// `s3` when given. Both drain on the same signal.
pub async fn serve_with_s3(
    listener: tokio::net::TcpListener,
    s3: Option<tokio::net::TcpListener>,
    state: Arc<AppState>,
) -> anyhow::Result<()> {
    // Installed before anything else: until a handler is installed a signal keeps its default
    // action, and SIGTERM would kill the process outright rather than drain it. (Installing it
    // when the shutdown future was first polled left a window after the first answers.)
    let signals = ShutdownSignals::install()?;
    state.service.rescan().await;
    if state.config().on_unreadable_source == OnUnreadableSource::Fail {
        if let Some((source, reason)) = state.service.catalog().unreadable_sources.first() {
            anyhow::bail!(
                "source {source} cannot be listed: {reason} (set on_unreadable_source = \"degrade\" to start without it)"
            );
        }
    }
    let rescans = tokio::spawn(Arc::clone(&state.service).rescan_forever());
    let token_file = tokio::spawn(Arc::clone(&state.tokens).watch());
    let upkeep = tokio::spawn(async {
        // Folds recorded histogram samples into their buckets, so they do not pile up between scrapes.
        let mut interval = tokio::time::interval(Duration::from_secs(5));
        loop {
            interval.tick().await;
            crate::telemetry::metrics().run_upkeep();
        }
    });
    let drain = Duration::from_secs(state.config().shutdown_drain_secs);
    let limits = ConnectionLimits::from_config(state.config());
    let shutdown = futures_util::FutureExt::shared(Box::pin(signals.received()));
    let s3 = s3.map(|s3| {
        let router = crate::s3::app(Arc::clone(&state));
        tokio::spawn(connections::serve(s3, router, limits.clone(), shutdown.clone(), drain))
    });
    connections::serve(listener, app(state), limits, shutdown, drain).await;
    if let Some(s3) = s3 {
        let _ = s3.await;
    }
    rescans.abort();
    upkeep.abort();
    token_file.abort();
    Ok(())
}

/// SIGTERM and SIGINT, listened for from the moment they are installed.
struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> anyhow::Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen =
            |kind: SignalKind, name: &str| signal(kind).map_err(|e| anyhow::anyhow!("cannot listen for {name}: {e}"));
        Ok(ShutdownSignals {
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    async fn received(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

/// Answers a response-building result: the response, or the error's response.
pub(crate) fn answer(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}
