//! A tower layer around the gRPC router: each `ShouldRateLimit` call goes straight to the
//! rate-limit service (the router's path matching and boxed services are for the others), runs
//! in its request span (request id, Envoy's trace as parent), and its latency goes into the
//! histogram.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tower_layer::Layer;
use tower_service::Service;
use tracing::Span;

use crate::telemetry::trace::{request_span, REQUEST_TARGET};
use crate::telemetry::RequestStats;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `rls` serves `ShouldRateLimit`, called directly (the router serves every other method).
#[derive(Clone)]
pub struct RequestLayer<R> {
    pub metrics: Arc<RequestStats>,
    pub rls: R,
}

impl<S, R: Clone> Layer<S> for RequestLayer<R> {
    type Service = RequestService<S, R>;

    fn layer(&self, inner: S) -> RequestService<S, R> {
        RequestService {
            inner,
            rls: self.rls.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RequestService<S, R> {
    inner: S,
    rls: R,
    metrics: Arc<RequestStats>,
}

impl<S, R, B, RB> Service<http::Request<B>> for RequestService<S, R>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    R: Service<http::Request<B>, Response = http::Response<RB>, Error = S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        match self.rls.poll_ready(cx)? {
            Poll::Ready(()) => self.inner.poll_ready(cx),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            return ResponseFuture::Other {
                inner: self.inner.call(req),
            };
        }
        let start = Instant::now();
        let span = request_span(req.headers());
        let inner = span.in_scope(|| self.rls.call(req));
        ResponseFuture::Rls {
            inner,
            call: Some(Call {
                start,
                span,
                metrics: self.metrics.clone(),
            }),
        }
    }
}

pub struct Call {
    start: Instant,
    span: Span,
    metrics: Arc<RequestStats>,
}

pin_project_lite::pin_project! {
    #[project = Projected]
    pub enum ResponseFuture<F, G> {
        /// Any other call, through the router.
        Other { #[pin] inner: F },
        /// `ShouldRateLimit`, timed and traced.
        Rls { #[pin] inner: G, call: Option<Call> },
    }
}

const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// The call's status as its headers say (a unary error is a trailers-only answer, with its status
/// in the headers; an answer has its status in the trailers, after this point, so no
/// `grpc-status` here means OK).
///
/// Bytes the client sent that are not a request are the client's fault, so they answer
/// INVALID_ARGUMENT, keeping tonic's message (which names what is wrong): tonic refuses a message
/// over `max_decoding_message_size` with OUT_OF_RANGE (the message names the size and the
/// limit), and bytes that do not decode (a bad varint, a message cut short, a string that is
/// not UTF-8) with INTERNAL (the message names the field).
fn status_of<RB>(resp: &mut http::Response<RB>) -> i32 {
    let h = resp.headers_mut();
    let Some(status) = h.get(&GRPC_STATUS) else {
        return 0;
    };
    let status = status
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0);
    let message_has = |needle: &str| {
        h.get(&GRPC_MESSAGE).is_some_and(|m| {
            m.to_str()
                .is_ok_and(|m| m.contains(needle) || m.contains(&needle.replace(' ', "%20")))
        })
    };
    let bad_input = match status {
        11 => message_has("message length too large"),
        13 => message_has("failed to decode Protobuf message"),
        _ => false,
    };
    if bad_input {
        h.insert(GRPC_STATUS, http::HeaderValue::from_static("3"));
        return 3;
    }
    status
}

impl<F, G, RB, E> Future for ResponseFuture<F, G>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    G: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let (inner, call) = match self.project() {
            Projected::Other { inner } => return inner.poll(cx),
            Projected::Rls { inner, call } => (inner, call),
        };
        let Some(c) = call.as_ref() else {
            return inner.poll(cx);
        };
        let _entered = c.span.enter();
        let out = match inner.poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(out) => out,
        };
        let mut out = out;
        let status = match &mut out {
            Ok(resp) => status_of(resp),
            Err(_) => 2,
        };
        let elapsed = c.start.elapsed();
        c.metrics.observe_latency(elapsed);
        if status != 0 {
            c.span.record("otel.status_code", "ERROR");
        }
        tracing::debug!(
            target: REQUEST_TARGET,
            grpc_status = status,
            micros = elapsed.as_micros() as u64,
            "answered"
        );
        drop(_entered);
        *call = None;
        Poll::Ready(out)
    }
}
