//! gRPC adapter: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` on top of
//! [`RlqsHub`]. One bidirectional stream per Envoy: its usage reports go to the hub, and the
//! hub's bucket actions (sent when shares change, not only in answer to a report) come back.

use std::pin::Pin;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::service::rlqs::hub::Opened;
use crate::service::rlqs::RlqsHub;

/// How often an open stream lets the hub do its periodic work (refreshes, retries).
const TICK: Duration = Duration::from_secs(1);

/// The RLQS service; a thin adapter, errors mapped here.
#[derive(Clone)]
pub struct RlqsService {
    hub: RlqsHub,
    /// Turns true when the server stops: every stream ends, so draining does not wait on them.
    stop: watch::Receiver<bool>,
}

impl RlqsService {
    pub fn new(hub: RlqsHub, stop: watch::Receiver<bool>) -> RlqsService {
        RlqsService { hub, stop }
    }
}

type Outbound = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Outbound;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Outbound>, Status> {
        let Some(Opened { id, tx, rx }) = self.hub.open() else {
            return Err(Status::resource_exhausted(format!(
                "too many RLQS streams open (at most {})",
                crate::service::rlqs::hub::MAX_STREAMS
            )));
        };
        let (hub, mut stop) = (self.hub.clone(), self.stop.clone());
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    m = inbound.message() => match m {
                        Ok(Some(reports)) => {
                            if let Err(e) = hub.report(id, reports) {
                                tracing::warn!(stream = id, error = %e, "RLQS: bad report; stream ended");
                                let _ = tx.try_send(Err(e));
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(stream = id, error = %e, "RLQS stream broken");
                            break;
                        }
                    },
                    _ = tick.tick() => {
                        hub.tick();
                        if hub.shares_fleet() {
                            let h = hub.clone();
                            tokio::spawn(async move { h.sync_fleet().await });
                        }
                    }
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
            hub.close(id);
        });
        let out = ReceiverStream::new(rx).map(|m| m.map_err(|e| Status::invalid_argument(e.0)));
        Ok(Response::new(Box::pin(out)))
    }
}
