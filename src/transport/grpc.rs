//! `ShouldRateLimit` over gRPC, on top of [`RateLimiter`]. A tower layer in front of tonic's
//! router sends each call straight to [`ShouldRateLimit`] (the router's path matching and boxed
//! services are for the other methods), runs it in its request span (request id, Envoy's trace
//! as parent) and logs its time; [`ShouldRateLimit`] takes the call's arrival, from which
//! [`RateLimiter::decide`] counts its latency. The request is read where it lies and the answer
//! written in one pass (`codec`); errors are mapped here and nowhere else.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::server::{Grpc, UnaryService};
use tonic::{Response, Status};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Span;

use super::codec::{self, RlsCodec};
use super::kuadrant::{self, LimitadorRls};
use crate::service::{RateLimiter, Request, RlsError};
use crate::telemetry::trace::{request_span, REQUEST_TARGET};

/// The Envoy rate-limit service; a thin adapter, errors mapped here and nowhere else.
#[derive(Clone)]
pub struct RlsService {
    limiter: RateLimiter,
    /// Served as `limitador-server`: Limitador's limits and answers instead.
    limitador: Option<LimitadorRls>,
}

impl RlsService {
    pub fn new(limiter: RateLimiter, limitador: Option<LimitadorRls>) -> RlsService {
        RlsService { limiter, limitador }
    }

    /// Answers the request in `body`, read where it lies (prost decodes what the reader does
    /// not take; bytes that are not a request are refused before anything is counted).
    async fn answer(&self, body: Bytes, arrived: Instant) -> Result<RateLimitResponse, Status> {
        let decoded;
        let req = match codec::read_request(&body) {
            Some(req) => req,
            None => {
                decoded = codec::decode_request(&body)?;
                Request::of(&decoded)
            }
        };
        if let Some(l) = &self.limitador {
            return kuadrant::should_rate_limit(l, &req).await;
        }
        Ok(self.limiter.decide(&req, arrived).await?)
    }
}

impl From<RlsError> for Status {
    fn from(e: RlsError) -> Status {
        match e {
            RlsError::InvalidArgument(m) => Status::invalid_argument(m),
            // Shed load: Envoy applies failure_mode_deny, clients may retry.
            RlsError::Overloaded => Status::resource_exhausted(e.to_string()),
            RlsError::Unavailable => Status::unavailable(e.to_string()),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// `ShouldRateLimit` as an HTTP service, called by the per-call layer: tonic's unary handling
/// with [`RlsCodec`], and two boxed futures a call where the generated server has three.
#[derive(Clone)]
pub struct ShouldRateLimit {
    rls: Arc<RlsService>,
    max_message_bytes: usize,
}

impl ShouldRateLimit {
    pub fn new(rls: RlsService, max_message_bytes: usize) -> ShouldRateLimit {
        ShouldRateLimit {
            rls: Arc::new(rls),
            max_message_bytes,
        }
    }
}

impl Service<http::Request<tonic::body::Body>> for ShouldRateLimit {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    /// Called by the per-call layer as the call arrives, before its body is read: the call's
    /// latency runs from here, decoding included.
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let unary = Unary(self.rls.clone(), Instant::now());
        let max = self.max_message_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(RlsCodec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(unary, req).await)
        })
    }
}

/// The service and the call's arrival.
struct Unary(Arc<RlsService>, Instant);

impl UnaryService<Bytes> for Unary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (rls, arrived) = (self.0.clone(), self.1);
        Box::pin(async move {
            let answer = rls.answer(request.into_inner(), arrived).await;
            answer.map(Response::new)
        })
    }
}

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `rls` serves `ShouldRateLimit`, called directly (the router serves every other method).
#[derive(Clone)]
pub struct RequestLayer<R> {
    pub rls: R,
}

impl<S, R: Clone> Layer<S> for RequestLayer<R> {
    type Service = RequestService<S, R>;

    fn layer(&self, inner: S) -> RequestService<S, R> {
        RequestService {
            inner,
            rls: self.rls.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RequestService<S, R> {
    inner: S,
    rls: R,
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
            call: Some(Call { start, span }),
        }
    }
}

pub struct Call {
    start: Instant,
    span: Span,
}

pin_project_lite::pin_project! {
    #[project = Projected]
    pub enum ResponseFuture<F, G> {
        /// Any other call, through the router.
        Other { #[pin] inner: F },
        /// `ShouldRateLimit`, traced and logged with its time.
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
        if status != 0 {
            c.span.record("otel.status_code", "ERROR");
        }
        // The clock is read only when the line is logged.
        tracing::debug!(
            target: REQUEST_TARGET,
            grpc_status = status,
            micros = c.start.elapsed().as_micros() as u64,
            "answered"
        );
        drop(_entered);
        *call = None;
        Poll::Ready(out)
    }
}
