//! HTTP: `/healthcheck`, `/metrics`, `/rlconfig`; each door's endpoints, in a file of its name
//! (`envoy`'s `/json`, `gocc`'s `/rate`, `throttle`'s `/throttle`, `limitador`'s API); the debug,
//! Prometheus and admin ports' routers.

mod admin;
mod admin_stats;
mod bounds;
mod calls;
mod envoy;
mod gocc;
mod limitador;
mod status;
mod throttle;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRef, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

pub use admin::{admin_router, AdminSettings, AdminState, AdminToken, DEFAULT_ADMIN_ADDR};
pub use admin_stats::AdminStats;
pub use bounds::{bound_body, HttpBounds};
pub use envoy::{response_json, JsonError, JsonRequest};
pub use limitador::{describe_limits, limitador_router, LimitadorHttp};
pub use status::StatusStats;

use crate::hitters::TopTable;
use crate::limiter::{Clock, EngineStats};
use crate::service::gocc::GoccService;
use crate::service::metrics::{Door, DoorCalls};
use crate::service::{
    EnvoyService, LiveLimits, Request, RlsError, ThrottleLimits, ThrottleService,
};
use crate::telemetry::mapped::Exposition;
use crate::telemetry::{Registry, Shown};

/// What `/metrics` and `/rlconfig` read: every part's stats (the live limits' per-limit
/// series among them), and the live limits' text.
#[derive(Clone)]
pub struct MetricsState {
    pub registry: Registry,
    pub live: LiveLimits,
    /// The limits a door serves besides the live config (Limitador's), one per line.
    pub described: Option<Described>,
    /// How the port shows the client values some series carry (RLQS's bucket values).
    pub shown: Shown,
}

/// The limits a door serves, one per line, as `/rlconfig` and the status page list them.
pub type Described = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

impl MetricsState {
    /// The limits served, one per line: the door's, or the live config's.
    pub fn describe(&self) -> Vec<String> {
        match &self.described {
            Some(d) => d(),
            None => self.live.load_full().config.describe(),
        }
    }
}

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// `/json`: decided as `ShouldRateLimit` is.
    pub envoy: EnvoyService,
    /// False from the moment shutdown starts.
    pub serving: Arc<AtomicBool>,
    /// `POST /throttle`'s decisions.
    pub throttle: ThrottleService,
    /// Caps on what a `POST /throttle` caller may ask.
    pub throttle_limits: ThrottleLimits,
    /// GoCC's `/rate` API, with its defaults and sticky overrides.
    pub gocc: GoccService,
    pub metrics: MetricsState,
    /// How the port shows client values (GoCC's `/debug`, error messages).
    pub shown: Shown,
    /// The shards' counters: the health check names breakers that are open.
    pub shards: EngineStats,
    /// Every door's calls: `/json`, `/rate` and `/throttle` count in their door's.
    pub calls: Arc<DoorCalls>,
}

impl FromRef<HttpState> for MetricsState {
    fn from_ref(s: &HttpState) -> MetricsState {
        s.metrics.clone()
    }
}

/// What the debug port's handlers share.
#[derive(Clone)]
pub struct DebugState {
    pub metrics: MetricsState,
    /// What the status page counts.
    pub status: StatusStats,
    /// The heavy hitters, and the clock their windows turn with.
    pub top: Arc<TopTable>,
    pub clock: Clock,
    /// Where counters live, by name (`memory`, `redis`; the status page shows a store's breaker).
    pub storage: &'static str,
    /// How the port shows client values (`/debug/top`, the status page).
    pub shown: Shown,
}

impl FromRef<DebugState> for MetricsState {
    fn from_ref(s: &DebugState) -> MetricsState {
        s.metrics.clone()
    }
}

/// The debug port (`DEBUG_HOST:DEBUG_PORT`, as envoyproxy/ratelimit's): `/` the status page
/// for browsers and the list of endpoints for other clients, `/rlconfig` every loaded limit
/// one per line, `/metrics` the metrics (with `metrics`: `USE_PROMETHEUS` on), `/debug/top` and
/// `/debug/status` what the page shows.
pub fn debug_router(state: DebugState, metrics: bool) -> Router {
    let router = Router::new()
        .route("/", get(status::root))
        .route("/rlconfig", get(rlconfig))
        .route("/debug/top", get(status::top))
        .route("/debug/status", get(status::status));
    with_metrics(router, metrics).with_state(state)
}

/// `/metrics` on `router` when the series are on (`USE_PROMETHEUS`, the default).
fn with_metrics<S>(router: Router<S>, on: bool) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    MetricsState: FromRef<S>,
{
    if on {
        router.route("/metrics", get(metrics))
    } else {
        router
    }
}

/// The Prometheus port (`PROMETHEUS_ADDR` + `PROMETHEUS_PATH`): envoyproxy/ratelimit's series
/// alone, its statsd stats through the mapping, at `path`.
pub fn prometheus_router(state: Exposition, path: &str) -> Router {
    Router::new().route(path, get(mapped)).with_state(state)
}

async fn mapped(State(x): State<Exposition>) -> Response {
    let text = x.render(std::time::Instant::now());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The HTTP port (`HOST:PORT`); `/metrics` with `metrics` (`USE_PROMETHEUS` on).
pub fn router(state: HttpState, metrics: bool) -> Router {
    let envoy = Router::new().route("/json", post(json));
    let gocc = Router::new()
        .route("/rate/{key}", get(gocc::take).post(gocc::take))
        .route("/rate/", get(gocc::empty_key).post(gocc::empty_key))
        .route("/rate/{key}/{request_id}", delete(gocc::release))
        .route("/rate/{key}/", delete(gocc::empty_id));
    let throttle = Router::new().route("/throttle", post(throttle::handle));
    let calls = &state.calls;
    let router = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/rlconfig", get(rlconfig))
        .route("/debug", get(gocc::debug_all))
        .route("/debug/{key}", get(gocc::debug_key))
        .route("/healthz", get(gocc::healthz))
        .merge(calls::counted(envoy, Door::Envoy, calls))
        .merge(calls::counted(gocc, Door::Gocc, calls))
        .merge(calls::counted(throttle, Door::Throttle, calls));
    with_metrics(router, metrics).with_state(state)
}

/// 200 while serving. With Redis, the body says when its breaker is open: the service still
/// answers (from memory, or as the failure mode says), so it stays healthy.
async fn healthcheck(State(s): State<HttpState>) -> Response {
    if s.serving.load(Ordering::Acquire) {
        let states: Vec<u64> = s.shards.breakers().collect();
        let open = states
            .iter()
            .filter(|b| **b != crate::limiter::BreakerState::Closed.gauge())
            .count();
        if open == 0 {
            (StatusCode::OK, "OK").into_response()
        } else {
            let body = format!(
                "OK (redis breaker open on {open} of {} shards: deciding without Redis)",
                states.len()
            );
            (StatusCode::OK, body).into_response()
        }
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT_SERVING").into_response()
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(JsonError { error: message })).into_response()
}

/// A JSON `RateLimitRequest`: 200 (OK), 429 (OVER_LIMIT), 400 (bad body), 503 (no decision).
async fn json(State(s): State<HttpState>, body: Bytes) -> Response {
    let parsed: JsonRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}")),
    };
    let req = match parsed.into_proto() {
        Ok(r) => r,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let result = s.envoy.decide(&Request::of(&req)).await;
    match result {
        Ok(resp) => {
            let status = if resp.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(response_json(&resp))).into_response()
        }
        Err(RlsError::InvalidArgument(m)) => error(StatusCode::BAD_REQUEST, m),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn metrics(State(s): State<MetricsState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.registry.render(s.shown),
    )
        .into_response()
}

async fn rlconfig(State(s): State<MetricsState>) -> Response {
    let mut body = s.describe().join("\n");
    body.push('\n');
    ([(header::CONTENT_TYPE, "text/plain")], body).into_response()
}
