//! A do-nothing `envoy.service.ratelimit.v3.RateLimitService`: the baseline
//! for the load harness in `benches/load/`.
//!
//! It answers every `ShouldRateLimit` with `overall_code = OK` and one `OK`
//! status per descriptor, without looking at a counter. Whatever turnstile
//! costs on top of this server is the cost of actually rate limiting; the
//! gRPC/HTTP2/prost cost is shared by both and shows up here.
//!
//! It runs on the layout that is fastest for a server this small: one
//! current-thread tokio runtime (no work stealing, no cross-thread wakeups).
//!
//! Usage: `noop_rls [ADDR]` (default `127.0.0.1:0`). Once the socket is bound
//! it prints exactly one line, `noop_rls: listening grpc=IP:PORT`, so a
//! script can wait for readiness and learn the port in one read.

use std::io::Write as _;
use std::net::SocketAddr;

/// mimalloc: glibc malloc is a measurable share of every call of the tonic stack (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::{Code, DescriptorStatus},
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
    RateLimitRequest, RateLimitResponse,
};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

struct NoopRls;

#[tonic::async_trait]
impl RateLimitService for NoopRls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let descriptors = request.get_ref().descriptors.len();
        let statuses = (0..descriptors)
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..Default::default()
        }))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|e| format!("bad ADDR {a:?}: {e}"))?,
        None => "127.0.0.1:0".parse()?,
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    runtime.block_on(async move {
        // Bind before announcing, so the printed port is already accepting.
        // TCP_NODELAY: gRPC responses are small; Nagle would add latency.
        let incoming = TcpIncoming::bind(addr)?.with_nodelay(Some(true));
        let local = incoming.local_addr()?;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "noop_rls: listening grpc={local}")?;
            out.flush()?;
        }
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(NoopRls))
            .serve_with_incoming(incoming)
            .await?;
        Ok(())
    })
}
