//! gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService` on top of [`RateLimiter`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::server::{Grpc, UnaryService};
use tonic::{Response, Status};
use tower_service::Service;

use super::codec::{self, RlsCodec};
use crate::service::{RateLimiter, Request, RlsError};

/// The Envoy rate-limit service; a thin adapter, errors mapped here and nowhere else.
#[derive(Clone)]
pub struct RlsService {
    limiter: RateLimiter,
}

impl RlsService {
    pub fn new(limiter: RateLimiter) -> RlsService {
        RlsService { limiter }
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
        let result = self.limiter.decide(&req).await;
        self.limiter.count(&result);
        Ok(result?)
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
    rls: std::sync::Arc<RlsService>,
    max_message_bytes: usize,
}

impl ShouldRateLimit {
    pub fn new(rls: RlsService, max_message_bytes: usize) -> ShouldRateLimit {
        ShouldRateLimit {
            rls: std::sync::Arc::new(rls),
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

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let unary = Unary(self.rls.clone());
        let max = self.max_message_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(RlsCodec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(unary, req).await)
        })
    }
}

struct Unary(std::sync::Arc<RlsService>);

impl UnaryService<Bytes> for Unary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let rls = self.0.clone();
        Box::pin(async move { rls.answer(request.into_inner()).await.map(Response::new) })
    }
}
