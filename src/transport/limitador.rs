//! Limitador's gRPC on the RLS port: Envoy's `ShouldRateLimit` answered as Limitador answers
//! it, and Kuadrant's `kuadrant.service.ratelimit.v1.RateLimitService` (`CheckRateLimit`,
//! `Report`, `Reserve`, `Commit`), all on [`LimitadorRls`]. Errors are mapped here and nowhere
//! else.

use std::convert::Infallible;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use smallvec::SmallVec;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Response, Status};
use tonic_prost::ProstCodec;
use tower_service::Service;

use super::BoxFuture;
use crate::descriptor::Entry;
use crate::service::limitador::{
    draft_03, LimitadorAnswer, LimitadorCall, LimitadorError, LimitadorService, Reserved,
};
use crate::service::{within_bounds, Request, RequestLimits};

/// Kuadrant's `Reserve` and `Commit` messages (`proto/kuadrant/…/kuadrantrls.proto`).
pub mod pb {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    include!(concat!(
        env!("OUT_DIR"),
        "/kuadrant.service.ratelimit.v1.rs"
    ));
}

use pb::{CommitRequest, CommitResponse, ReserveRequest, ReserveResponse};

type CallDescriptors<'a> = SmallVec<[SmallVec<[Entry<'a>; 4]>; 4]>;

/// Each descriptor's entries, as Limitador reads them (its own `limit` and `hits_addend`
/// ignored).
fn entries_of(descriptors: &[RateLimitDescriptor]) -> CallDescriptors<'_> {
    (descriptors.iter())
        .map(|d| d.entries.iter().map(Entry::from).collect())
        .collect()
}

fn slices<'a>(entries: &'a CallDescriptors<'_>) -> SmallVec<[&'a [Entry<'a>]; 4]> {
    entries.iter().map(|e| e.as_slice()).collect()
}

/// Limitador's answers on the RLS port, and whether they carry draft 03's headers.
#[derive(Clone)]
pub struct LimitadorRls {
    pub limitador: LimitadorService,
    /// `--rate-limit-headers DRAFT_VERSION_03`.
    pub headers: bool,
    /// The bounds every door keeps on what a caller sends.
    pub bounds: RequestLimits,
}

impl LimitadorRls {
    /// A request as Limitador reads it: `domain` the namespace, the request's `hits_addend`
    /// (0 counts as 1), each descriptor's entries (its own `limit` and `hits_addend` ignored).
    pub async fn answer(
        &self,
        req: &Request<'_>,
        ask: LimitadorCall,
    ) -> Result<RateLimitResponse, Status> {
        let descriptors = req.descriptors.iter().map(|d| d.entries.as_slice());
        within_bounds(req.domain, descriptors, &self.bounds)?;
        // Limitador answers an empty domain UNKNOWN, and nothing else.
        if req.domain.is_empty() {
            return Ok(RateLimitResponse {
                overall_code: Code::Unknown.into(),
                ..RateLimitResponse::default()
            });
        }
        let slices: SmallVec<[&[Entry<'_>]; 4]> = req
            .descriptors
            .iter()
            .map(|d| d.entries.as_slice())
            .collect();
        let delta = match ask {
            LimitadorCall::Check => 1,
            _ => u64::from(req.hits_addend.max(1)),
        };
        let called = (self.limitador).call(req.domain, &slices, delta, ask, true);
        let verdict = called.await.map_err(status_of)?;
        Ok(self.response(&verdict, ask))
    }

    /// `Reserve`: an empty domain is UNKNOWN, as for the other calls; with
    /// `--disable-reservations`, UNIMPLEMENTED naming the flag.
    pub async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveResponse, Status> {
        if !self.limitador.reservations().enabled {
            return Err(Status::unimplemented(
                "reservations are disabled (--disable-reservations)",
            ));
        }
        let entries = entries_of(&req.descriptors);
        within_bounds(&req.domain, slices(&entries).into_iter(), &self.bounds)?;
        if req.domain.is_empty() {
            return Ok(ReserveResponse {
                code: Code::Unknown.into(),
                ..ReserveResponse::default()
            });
        }
        // A negative ttl holds for no time.
        let ttl = (req.ttl.as_ref()).map(|d| {
            let (s, n) = (d.seconds.max(0), d.nanos.max(0));
            std::time::Duration::new(s as u64, n as u32)
        });
        let reserved = (self.limitador)
            .reserve(&req.domain, &slices(&entries), req.amount, ttl)
            .await
            .map_err(status_of)?;
        Ok(match reserved {
            Reserved::Admitted { id } => ReserveResponse {
                code: Code::Ok.into(),
                reservation_id: id,
            },
            Reserved::Refused => ReserveResponse {
                code: Code::OverLimit.into(),
                ..ReserveResponse::default()
            },
        })
    }

    /// `Commit`: `actual_amount` counted as `Report` counts, the hold ended; an empty domain
    /// counts nothing.
    pub async fn commit(&self, req: &CommitRequest) -> Result<CommitResponse, Status> {
        let entries = entries_of(&req.descriptors);
        within_bounds(&req.domain, slices(&entries).into_iter(), &self.bounds)?;
        if req.domain.is_empty() {
            return Ok(CommitResponse::default());
        }
        let released = (self.limitador)
            .commit(
                &req.domain,
                &slices(&entries),
                &req.reservation_id,
                req.actual_amount,
            )
            .await
            .map_err(status_of)?;
        Ok(CommitResponse {
            reservation_released: released,
        })
    }

    fn response(&self, v: &LimitadorAnswer, ask: LimitadorCall) -> RateLimitResponse {
        let over = v.limited && ask != LimitadorCall::Report;
        let headers = if self.headers && ask == LimitadorCall::CheckAndReport {
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
const RESERVE: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Reserve";
const COMMIT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Commit";

/// A method of Kuadrant's service.
#[derive(Clone, Copy)]
enum Method {
    Rls(LimitadorCall),
    Reserve,
    Commit,
}

/// Kuadrant's service, routed by the gRPC router by its name.
#[derive(Clone)]
pub struct LimitadorGrpc {
    rls: LimitadorRls,
    max_message_bytes: usize,
}

impl LimitadorGrpc {
    pub fn new(rls: LimitadorRls, max_message_bytes: usize) -> LimitadorGrpc {
        LimitadorGrpc {
            rls,
            max_message_bytes,
        }
    }
}

impl NamedService for LimitadorGrpc {
    const NAME: &'static str = "kuadrant.service.ratelimit.v1.RateLimitService";
}

impl Service<http::Request<tonic::body::Body>> for LimitadorGrpc {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let method = match req.uri().path() {
            CHECK => Some(Method::Rls(LimitadorCall::Check)),
            REPORT => Some(Method::Rls(LimitadorCall::Report)),
            RESERVE => Some(Method::Reserve),
            COMMIT => Some(Method::Commit),
            _ => None,
        };
        let (rls, max) = (self.rls.clone(), Some(self.max_message_bytes));
        Box::pin(async move {
            Ok(match method {
                None => Status::unimplemented("no such method").into_http(),
                Some(Method::Rls(ask)) => {
                    let codec: ProstCodec<RateLimitResponse, RateLimitRequest> =
                        ProstCodec::default();
                    let mut grpc = Grpc::new(codec).apply_max_message_size_config(max, None);
                    grpc.unary(LimitadorUnary(rls, ask), req).await
                }
                Some(Method::Reserve) => {
                    let codec: ProstCodec<ReserveResponse, ReserveRequest> = ProstCodec::default();
                    let mut grpc = Grpc::new(codec).apply_max_message_size_config(max, None);
                    grpc.unary(ReserveCall(rls), req).await
                }
                Some(Method::Commit) => {
                    let codec: ProstCodec<CommitResponse, CommitRequest> = ProstCodec::default();
                    let mut grpc = Grpc::new(codec).apply_max_message_size_config(max, None);
                    grpc.unary(CommitCall(rls), req).await
                }
            })
        })
    }
}

struct LimitadorUnary(LimitadorRls, LimitadorCall);

impl UnaryService<RateLimitRequest> for LimitadorUnary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let (rls, ask) = (self.0.clone(), self.1);
        Box::pin(async move {
            let req = request.into_inner();
            let answered = rls.answer(&Request::of(&req), ask).await;
            answered.map(Response::new)
        })
    }
}

struct ReserveCall(LimitadorRls);

impl UnaryService<ReserveRequest> for ReserveCall {
    type Response = ReserveResponse;
    type Future = BoxFuture<Result<Response<ReserveResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<ReserveRequest>) -> Self::Future {
        let rls = self.0.clone();
        Box::pin(async move {
            let req = request.into_inner();
            rls.reserve(&req).await.map(Response::new)
        })
    }
}

struct CommitCall(LimitadorRls);

impl UnaryService<CommitRequest> for CommitCall {
    type Response = CommitResponse;
    type Future = BoxFuture<Result<Response<CommitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<CommitRequest>) -> Self::Future {
        let rls = self.0.clone();
        Box::pin(async move {
            let req = request.into_inner();
            rls.commit(&req).await.map(Response::new)
        })
    }
}

/// `ShouldRateLimit` as Limitador answers it, for the RLS port's per-call layer.
pub async fn should_rate_limit(
    rls: &LimitadorRls,
    req: &Request<'_>,
) -> Result<RateLimitResponse, Status> {
    rls.answer(req, LimitadorCall::CheckAndReport).await
}
