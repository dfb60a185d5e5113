//! Every door's HTTP calls, traced and counted alike: a door hands its decision routes to
//! [`counted`], and each call runs in its request span and counts in the door's calls, errors
//! (by status: 4xx but 429 the caller's, 503 unavailable) and latency.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use tracing::Instrument;

use crate::service::metrics::{Door, DoorCalls, Failed};
use crate::telemetry::trace::{request_span, REQUEST_TARGET};

/// `routes`, each call of them counted under `door` in `calls`.
pub(super) fn counted<S>(routes: Router<S>, door: Door, calls: &Arc<DoorCalls>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let calls = calls.clone();
    routes.route_layer(axum::middleware::from_fn(move |req, next| {
        count(door, calls.clone(), req, next)
    }))
}

async fn count(door: Door, calls: Arc<DoorCalls>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = (req.extensions().get::<MatchedPath>()).map_or("", |p| p.as_str());
    let span = request_span(req.headers(), "http", route);
    let resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    let took = start.elapsed();
    calls.door(door).count(Failed::of_http(status), took);
    span.in_scope(|| {
        tracing::debug!(
            target: REQUEST_TARGET,
            door = door.name(),
            http_status = status,
            micros = took.as_micros() as u64,
            "answered"
        )
    });
    resp
}
