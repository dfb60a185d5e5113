//! `ShouldRateLimit` over gRPC, answered by the RLS port's answerer (Envoy's [`EnvoyService`] or
//! Limitador's, chosen at start), and the per-call layer every gRPC door is served through. The
//! layer sends each `ShouldRateLimit` straight to [`ShouldRateLimit`] (the router's path
//! matching and boxed services are for the other methods); every door's call (Kuadrant's
//! methods too) runs in its request span (request id, Envoy's trace as parent), has one set of
//! codes for bytes that are not a request, and is counted in the door's calls, errors and
//! latency (`DoorCalls`). The request is read where it lies and the answer written in one pass
//! (`codec`); errors are mapped here and nowhere else.

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
use super::limitador::{self, LimitadorRls};
use super::BoxFuture;
use crate::service::metrics::{Door, DoorCalls, Failed};
use crate::service::{EnvoyService, Request, RlsError};
use crate::telemetry::trace::{request_span, REQUEST_TARGET};

/// Who answers `ShouldRateLimit` on the RLS port, chosen once at start: a match, not a
/// dynamic call, on the hot path.
#[derive(Clone)]
pub enum RlsAnswerer {
    /// Envoy's door: the limits of the YAML, xDS or GoCC config.
    Envoy(EnvoyService),
    /// As `limitador-server`: Limitador's limits and answers.
    Limitador(LimitadorRls),
}

impl RlsAnswerer {
    /// The door its calls are counted under.
    pub fn door(&self) -> Door {
        match self {
            RlsAnswerer::Envoy(_) => Door::Envoy,
            RlsAnswerer::Limitador(_) => Door::Limitador,
        }
    }
}

/// The Envoy rate-limit service; a thin adapter, errors mapped here and nowhere else.
#[derive(Clone)]
pub struct RlsService {
    answerer: RlsAnswerer,
}

impl RlsService {
    pub fn new(answerer: RlsAnswerer) -> RlsService {
        RlsService { answerer }
    }

    /// Answers the request in `body`, read where it lies (prost decodes what the reader does
    /// not take; bytes that are not a request are refused before anything is counted).
    async fn answer(&self, body: Bytes) -> Result<RateLimitResponse, Status> {
        let decoded;
        let req = match codec::read_request(&body) {
            Some(req) => req,
            None => {
                decoded = codec::decode_request(&body)?;
                Request::of(&decoded)
            }
        };
        match &self.answerer {
            RlsAnswerer::Envoy(limiter) => Ok(limiter.decide(&req).await?),
            RlsAnswerer::Limitador(l) => limitador::should_rate_limit(l, &req).await,
        }
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

    /// Called by the per-call layer as the call arrives, before its body is read.
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let unary = EnvoyUnary(self.rls.clone());
        let max = self.max_message_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(RlsCodec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(unary, req).await)
        })
    }
}

struct EnvoyUnary(Arc<RlsService>);

impl UnaryService<Bytes> for EnvoyUnary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let rls = self.0.clone();
        Box::pin(async move {
            let answer = rls.answer(request.into_inner()).await;
            answer.map(Response::new)
        })
    }
}

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// Kuadrant's service, served as `limitador-server`.
const KUADRANT: &str = "/kuadrant.service.ratelimit.v1.";

/// The per-call layer every gRPC door is served through: `rls` serves `ShouldRateLimit`, called
/// directly (the router serves every other method); each door's call is traced and counted in
/// `calls`, `ShouldRateLimit`'s under `rls_door`.
#[derive(Clone)]
pub struct CallLayer<R> {
    pub rls: R,
    pub rls_door: Door,
    pub calls: Arc<DoorCalls>,
}

impl<S, R: Clone> Layer<S> for CallLayer<R> {
    type Service = CallService<S, R>;

    fn layer(&self, inner: S) -> CallService<S, R> {
        CallService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct CallService<S, R> {
    inner: S,
    layer: CallLayer<R>,
}

impl<S, R, B, RB> Service<http::Request<B>> for CallService<S, R>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    R: Service<http::Request<B>, Response = http::Response<RB>, Error = S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        match self.layer.rls.poll_ready(cx)? {
            Poll::Ready(()) => self.inner.poll_ready(cx),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        let rls = path == SHOULD_RATE_LIMIT;
        let door = if rls {
            self.layer.rls_door
        } else if path.starts_with(KUADRANT) {
            Door::Limitador
        } else {
            return ResponseFuture::Other {
                inner: self.inner.call(req),
            };
        };
        let span = request_span(req.headers(), "grpc", &path[1..]);
        let call = Some(Call {
            start: Instant::now(),
            span: span.clone(),
            door,
            calls: self.layer.calls.clone(),
        });
        if rls {
            let inner = span.in_scope(|| self.layer.rls.call(req));
            return ResponseFuture::Rls { inner, call };
        }
        ResponseFuture::Routed {
            inner: span.in_scope(|| self.inner.call(req)),
            call,
        }
    }
}

pub struct Call {
    start: Instant,
    span: Span,
    door: Door,
    calls: Arc<DoorCalls>,
}

pin_project_lite::pin_project! {
    #[project = Projected]
    pub enum ResponseFuture<F, G> {
        /// Health, reflection, RLQS: through the router, not counted.
        Other { #[pin] inner: F },
        /// A door's call through the router (Kuadrant's), traced and counted.
        Routed { #[pin] inner: F, call: Option<Call> },
        /// `ShouldRateLimit`, traced and counted.
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
        let (out, call) = match self.project() {
            Projected::Other { inner } => return inner.poll(cx),
            Projected::Routed { inner, call } => {
                let entered = call.as_ref().map(|c| c.span.enter());
                let out = std::task::ready!(inner.poll(cx));
                drop(entered);
                (out, call)
            }
            Projected::Rls { inner, call } => {
                let entered = call.as_ref().map(|c| c.span.enter());
                let out = std::task::ready!(inner.poll(cx));
                drop(entered);
                (out, call)
            }
        };
        let Some(c) = call.take() else {
            return Poll::Ready(out);
        };
        let _entered = c.span.enter();
        let mut out = out;
        let status = match &mut out {
            Ok(resp) => status_of(resp),
            Err(_) => 2,
        };
        if status != 0 {
            c.span.record("otel.status_code", "ERROR");
        }
        let took = c.start.elapsed();
        c.calls.door(c.door).count(Failed::of_grpc(status), took);
        tracing::debug!(
            target: REQUEST_TARGET,
            door = c.door.name(),
            grpc_status = status,
            micros = took.as_micros() as u64,
            "answered"
        );
        Poll::Ready(out)
    }
}
