//! What the ports answer while the start waits (for Redis, or for the durable counters to be
//! read back), before the server proper serves them: at once, never a held connection. HTTP
//! answers 503 naming the wait (`/healthcheck` included, so readiness fails), `/metrics` serves
//! the start's counters (its Redis retries: a liveness probe there passes), gRPC health
//! answers NOT_SERVING and `ShouldRateLimit` UNAVAILABLE (Envoy's `failure_mode_deny` decides).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::telemetry::{Registry, Shown};

/// What a start waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingFor {
    /// The first Redis connection (`REDIS_STARTUP_*`).
    Redis = 1,
    /// The durable counters read back from `TURNSTILE_STATE_DIR`.
    State = 2,
}

impl WaitingFor {
    pub fn what(self) -> &'static str {
        match self {
            WaitingFor::Redis => "Redis",
            WaitingFor::State => "the durable counters to be read back",
        }
    }
}

/// What the start waits for now, if anything: set by the start, read by the ports answering
/// meanwhile and by the stop that ends the wait. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct StartWait(Arc<AtomicU8>);

impl StartWait {
    pub fn set(&self, w: Option<WaitingFor>) {
        self.0.store(w.map_or(0, |w| w as u8), Ordering::Release);
    }

    pub fn now(&self) -> Option<WaitingFor> {
        match self.0.load(Ordering::Acquire) {
            1 => Some(WaitingFor::Redis),
            2 => Some(WaitingFor::State),
            _ => None,
        }
    }

    /// `waiting for Redis`, as the ports answer it.
    pub fn text(&self) -> String {
        match self.now() {
            Some(w) => format!("waiting for {}", w.what()),
            None => "starting".to_owned(),
        }
    }
}

/// An HTTP port during the wait: `metrics` (the counters, at `/metrics`) or 503 naming the wait
/// for anything else. Every answer closes its connection, so no client keeps one to the
/// waiting port past the wait.
pub fn http_router(wait: StartWait, metrics: Option<Registry>) -> Router {
    let mut router = Router::new();
    if let Some(counters) = metrics {
        let render = move || {
            // The wait's counters carry no client value.
            let body = counters.render(Shown::Digest);
            let close = (header::CONNECTION, "close");
            async move {
                let kind = (header::CONTENT_TYPE, "text/plain; version=0.0.4");
                ([kind, close], body)
            }
        };
        router = router.route("/metrics", get(render));
    }
    router.fallback(move || {
        let body = format!("{}\n", wait.text());
        let close = [(header::CONNECTION, "close")];
        async move { (StatusCode::SERVICE_UNAVAILABLE, close, body).into_response() }
    })
}

/// `ShouldRateLimit` during the wait: UNAVAILABLE, naming the wait.
#[derive(Debug, Clone)]
pub struct NotYet(pub StartWait);

#[tonic::async_trait]
impl RateLimitService for NotYet {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Err(tonic::Status::unavailable(self.0.text()))
    }
}

/// The RESP transport's answer during the wait, before it closes the connection.
pub fn resp_error(wait: &StartWait) -> Vec<u8> {
    format!("-ERR {}\r\n", wait.text()).into_bytes()
}
