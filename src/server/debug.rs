//! The debug port (`DEBUG_HOST:DEBUG_PORT`, as envoyproxy/ratelimit's) and the Prometheus port
//! (`PROMETHEUS_ADDR` + `PROMETHEUS_PATH`): read-only views of the live config and the metrics.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::service::RateLimiter;

const ENDPOINTS: &str = "/rlconfig: print out the currently loaded configuration for debugging\n\
                         /metrics: Prometheus exposition of the service's metrics\n";

/// `/` lists the endpoints, `/rlconfig` every loaded limit one per line, `/metrics` the metrics.
pub(crate) fn debug_router(limiter: RateLimiter) -> Router {
    Router::new()
        .route("/", get(|| async { ENDPOINTS }))
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics))
        .with_state(limiter)
}

/// The exposition alone, at `path`.
pub(crate) fn prometheus_router(limiter: RateLimiter, path: &str) -> Router {
    Router::new().route(path, get(metrics)).with_state(limiter)
}

async fn metrics(State(limiter): State<RateLimiter>) -> Response {
    let config = limiter.config().load();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        limiter.metrics().render(&config),
    )
        .into_response()
}

async fn rlconfig(State(limiter): State<RateLimiter>) -> Response {
    let config = limiter.config().load();
    let mut body = config.describe().join("\n");
    body.push('\n');
    ([(header::CONTENT_TYPE, "text/plain")], body).into_response()
}
