//! The layers every listener's requests pass, whatever its protocol: metrics per request
//! (count by route, method and status; body bytes and duration as the body is sent), one
//! tracing span and log line per request, panic catching, the request timeout and the
//! concurrency limit. Each protocol says how it words the two refusals ([`Refusals`]).

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::config::Config;
use crate::telemetry::names;

/// What metrics and logs call the route of a request: the route pattern it matched, among
/// the protocol's `routes`, or what `unmatched` calls its URI. Each protocol gives its own, so
/// nothing here knows a route.
#[derive(Clone, Copy)]
pub(crate) struct RouteLabels {
    pub routes: &'static [&'static str],
    pub unmatched: fn(&axum::http::Uri) -> &'static str,
}

/// How a protocol answers what the layers refuse, in its own error format: a handler that
/// panicked, and an answer not started within `request_timeout_secs`.
#[derive(Clone, Copy)]
pub(crate) struct Refusals {
    pub panicked: fn() -> Response,
    pub timed_out: fn() -> Response,
}

/// The layers every listener's requests pass: metrics and logs (labelled as `labels` says),
/// tracing, panic catching, the request timeout and the concurrency limit.
pub(crate) fn with_common_layers(router: Router, config: &Config, labels: RouteLabels, refusals: Refusals) -> Router {
    let timeout = config.limits.request_timeout_secs;
    let layers = ServiceBuilder::new()
        .layer(axum::Extension(labels))
        .layer(axum::middleware::from_fn(metered))
        .layer(
            // No `on_failure`: every response is logged once by `record_response`, and each
            // protocol logs a 5xx's detail where it answers it; a retryable 503 is no error.
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(record_response)
                .on_failure(()),
        )
        .layer(CatchPanicLayer::custom(move |_: Box<dyn std::any::Any + Send>| (refusals.panicked)()))
        .option_layer(timeout.map(|timeout| {
            axum::middleware::from_fn_with_state((Duration::from_secs(timeout), refusals.timed_out), answer_within)
        }))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(config.limits.max_concurrent_requests));
    router.layer(layers)
}

/// The route a request is counted and logged under.
fn route_of(request: &Request) -> &'static str {
    let Some(labels) = request.extensions().get::<RouteLabels>() else { return "unmatched" };
    match request.extensions().get::<axum::extract::MatchedPath>() {
        Some(path) => labels.routes.iter().copied().find(|r| *r == path.as_str()).unwrap_or("unmatched"),
        None => (labels.unmatched)(request.uri()),
    }
}

/// Answers `timed_out()` when the answer has not started within `limit` (a body then streams
/// for as long as the client reads it).
async fn answer_within(
    axum::extract::State((limit, timed_out)): axum::extract::State<(Duration, fn() -> Response)>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    tokio::time::timeout(limit, next.run(request)).await.unwrap_or_else(|_| timed_out())
}

/// One span per request; handlers fill in `model` and `object`, the response fills in
/// `status`, `bytes` and `duration_ms`. Its path is the one the client sent, before a nested
/// router took its prefix (`/hf`, `/v2`) or a natural id was rewritten.
fn request_span(request: &Request) -> tracing::Span {
    let route = route_of(request);
    let sent = request.extensions().get::<axum::extract::OriginalUri>().map(|original| original.path());
    let client = request.extensions().get::<std::sync::Arc<super::ClientIdentity>>().map(|c| c.display_name());
    tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        path = %sent.unwrap_or(request.uri().path()),
        client,
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
