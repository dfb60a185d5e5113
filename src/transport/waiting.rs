//! What the ports answer while the start waits (for Redis, or for the durable counters to be
//! read back), before the server proper serves them: at once, never a held connection. HTTP
//! answers 503 naming the wait (`/healthcheck` included, so readiness fails), `/metrics` serves
//! the start's stats (its Redis retries: a liveness probe there passes), gRPC health
//! answers NOT_SERVING and every door's calls UNAVAILABLE (Envoy's `failure_mode_deny` decides).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

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

/// An HTTP port during the wait: `metrics` (the stats, at `/metrics`) or 503 naming the wait
/// for anything else. Every answer closes its connection, so no client keeps one to the
/// waiting port past the wait.
pub fn http_router(wait: StartWait, metrics: Option<Registry>) -> Router {
    let mut router = Router::new();
    if let Some(stats) = metrics {
        let render = move || {
            // The wait's stats carry no client value.
            let body = stats.render(Shown::Digest);
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

/// Every door's gRPC calls during the wait (health and reflection aside, which answer as they
/// do once serving): UNAVAILABLE, naming the wait, whichever service and method was called, so
/// no door answers UNIMPLEMENTED while the server starts.
#[derive(Debug, Clone)]
pub struct NotYetLayer(pub StartWait);

impl<S> tower_layer::Layer<S> for NotYetLayer {
    type Service = NotYet<S>;

    fn layer(&self, inner: S) -> NotYet<S> {
        NotYet {
            inner,
            wait: self.0.clone(),
        }
    }
}

/// See [`NotYetLayer`].
#[derive(Debug, Clone)]
pub struct NotYet<S> {
    inner: S,
    wait: StartWait,
}

/// Services that answer during the wait as they do once serving.
const ANSWERED_WHILE_WAITING: [&str; 2] = ["/grpc.health.", "/grpc.reflection."];

impl<S, B, RB> tower_service::Service<http::Request<B>> for NotYet<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        S::Future,
        std::future::Ready<Result<http::Response<RB>, S::Error>>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        if ANSWERED_WHILE_WAITING.iter().any(|p| path.starts_with(p)) {
            return futures_util::future::Either::Left(self.inner.call(req));
        }
        let status = tonic::Status::unavailable(self.wait.text());
        futures_util::future::Either::Right(std::future::ready(Ok(status.into_http())))
    }
}

/// The RESP transport's answer during the wait, before it closes the connection.
pub fn resp_error(wait: &StartWait) -> Vec<u8> {
    format!("-ERR {}\r\n", wait.text()).into_bytes()
}
