//! Limitador's gRPC on the RLS port: Envoy's `ShouldRateLimit` answered as Limitador answers
//! it, and Kuadrant's `kuadrant.service.ratelimit.v1.RateLimitService` (`CheckRateLimit`,
//! `Report`), all on [`Limitador`]. Errors are mapped here and nowhere else.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use smallvec::SmallVec;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Response, Status};
use tonic_prost::ProstCodec;
use tower_service::Service;

use crate::descriptor::Entry;
use crate::service::limitador::{draft_03, Ask, Limitador, LimitadorError, Verdict};

/// Limitador's answers on the RLS port, and whether they carry draft 03's headers.
#[derive(Clone)]
pub struct LimitadorRls {
    pub limitador: Limitador,
    /// `--rate-limit-headers DRAFT_VERSION_03`.
    pub headers: bool,
}

impl LimitadorRls {
    /// A request as Limitador reads it: `domain` the namespace, the request's `hits_addend`
    /// (0 counts as 1), each descriptor's entries (its own `limit` and `hits_addend` ignored).
    pub async fn answer(
        &self,
        req: &RateLimitRequest,
        ask: Ask,
    ) -> Result<RateLimitResponse, Status> {
        // Limitador answers an empty domain UNKNOWN, and nothing else.
        if req.domain.is_empty() {
            return Ok(RateLimitResponse {
                overall_code: Code::Unknown.into(),
                ..RateLimitResponse::default()
            });
        }
        let entries: SmallVec<[SmallVec<[Entry<'_>; 4]>; 4]> = (req.descriptors.iter())
            .map(|d| d.entries.iter().map(Entry::from).collect())
            .collect();
        let slices: SmallVec<[&[Entry<'_>]; 4]> = entries.iter().map(|e| e.as_slice()).collect();
        let delta = match ask {
            Ask::Check => 1,
            _ => u64::from(req.hits_addend.max(1)),
        };
        let verdict = (self
            .limitador
            .call(&req.domain, &slices, delta, ask, true)
            .await)
            .map_err(status_of)?;
        Ok(self.response(&verdict, ask))
    }

    fn response(&self, v: &Verdict, ask: Ask) -> RateLimitResponse {
        let over = v.limited && ask != Ask::Report;
        let headers = if self.headers && ask == Ask::CheckAndReport {
            draft_03(&v.counters)
        } else {
            Vec::new()
        };
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            response_headers_to_add: (headers.into_iter())
                .map(|(key, value)| HeaderValue {
                    key,
                    value,
                    ..HeaderValue::default()
                })
                .collect(),
            ..RateLimitResponse::default()
        }
    }
}

/// Limitador answers every failure UNAVAILABLE, so Envoy's `failure_mode_deny` decides.
fn status_of(e: LimitadorError) -> Status {
    match e {
        LimitadorError::Eval(e) => {
            tracing::debug!(error = %e, "a limit's CEL failed the call");
            Status::unavailable("Service unavailable")
        }
        LimitadorError::Engine(e) => Status::unavailable(e.to_string()),
    }
}

const CHECK: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/CheckRateLimit";
const REPORT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Report";

/// Kuadrant's service, routed by the gRPC router by its name.
#[derive(Clone)]
pub struct KuadrantService {
    rls: LimitadorRls,
    max_message_bytes: usize,
}

impl KuadrantService {
    pub fn new(rls: LimitadorRls, max_message_bytes: usize) -> KuadrantService {
        KuadrantService {
            rls,
            max_message_bytes,
        }
    }
}

impl NamedService for KuadrantService {
    const NAME: &'static str = "kuadrant.service.ratelimit.v1.RateLimitService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<tonic::body::Body>> for KuadrantService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let ask = match req.uri().path() {
            CHECK => Some(Ask::Check),
            REPORT => Some(Ask::Report),
            _ => None,
        };
        let (rls, max) = (self.rls.clone(), self.max_message_bytes);
        Box::pin(async move {
            let Some(ask) = ask else {
                return Ok(Status::unimplemented("no such method").into_http());
            };
            let codec: ProstCodec<RateLimitResponse, RateLimitRequest> = ProstCodec::default();
            let mut grpc = Grpc::new(codec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(Unary(rls, ask), req).await)
        })
    }
}

struct Unary(LimitadorRls, Ask);

impl UnaryService<RateLimitRequest> for Unary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let (rls, ask) = (self.0.clone(), self.1);
        Box::pin(async move {
            let req = request.into_inner();
            rls.answer(&req, ask).await.map(Response::new)
        })
    }
}

/// `ShouldRateLimit` as Limitador answers it, for the RLS port's per-call layer.
pub async fn should_rate_limit(
    rls: &LimitadorRls,
    req: &RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    rls.answer(req, Ask::CheckAndReport).await
}
