//! gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService` on top of [`RateLimiter`].

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::service::{RateLimiter, RlsError};

/// The Envoy rate-limit service; a thin adapter, errors mapped here and nowhere else.
#[derive(Clone)]
pub struct RlsService {
    limiter: RateLimiter,
}

impl RlsService {
    pub fn new(limiter: RateLimiter) -> RlsService {
        RlsService { limiter }
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

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let result = self.limiter.decide(request.into_inner()).await;
        self.limiter.count(&result);
        Ok(Response::new(result?))
    }
}
