//! Envoy's door: `ShouldRateLimit` (over gRPC, and as JSON on `/json`) decided as
//! envoyproxy/ratelimit decides it, plus turnstile's algorithms and queues.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

use super::metrics::RequestStats;
use super::refusal::RefusalLog;
use super::{answer, plan, validate, AnswerSettings, Live, LiveLimits, Request, RlsError};
use crate::limiter::Engine;

/// Envoy's door's answer to a call: the protocol's own message, built whole by the service
/// (`answer.rs`), which the transports encode as it is.
pub type EnvoyAnswer = RateLimitResponse;

/// A cheap `Clone` handle: the live limits, the engine, and how to answer. `server` builds it
/// from the parts it hands the other adapters too; it hands none of them out. Its admin
/// look-ups and resets are in `admin.rs`, apart on purpose: they plan as a request does, and
/// decide nothing.
#[derive(Clone)]
pub struct EnvoyService {
    pub(super) live: LiveLimits,
    pub(super) engine: Engine,
    pub(super) answer: Arc<AnswerSettings>,
    metrics: Arc<RequestStats>,
    refusals: Arc<RefusalLog>,
}

impl EnvoyService {
    /// Decides on `live`'s limits with `engine`, answering as `answer` says and counting in
    /// `metrics`.
    pub fn new(
        live: LiveLimits,
        engine: Engine,
        answer: AnswerSettings,
        metrics: Arc<RequestStats>,
    ) -> EnvoyService {
        EnvoyService {
            live,
            engine,
            answer: Arc::new(answer),
            metrics,
            refusals: Arc::default(),
        }
    }

    /// The limits being served now.
    pub(super) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Decides a request as envoyproxy/ratelimit would, plus turnstile's algorithms and queues.
    /// The call itself is counted where the door is wired (`metrics::DoorCalls`).
    pub async fn decide(&self, req: &Request<'_>) -> Result<EnvoyAnswer, RlsError> {
        validate(req, &self.answer.request_limits)?;
        let live = self.live.load_full();
        let Some(domain) = live.config.domain(req.domain) else {
            // An unknown domain limits nothing; it is not an error.
            return Ok(answer::unknown_domain(req, &self.answer));
        };
        let mut plan = plan::Plan::default();
        let ops = plan::plan(&mut plan, domain, req, &self.answer)?;
        let decision = self
            .engine
            .decide(ops, self.answer.global_shadow_mode)
            .await?;
        let recorders = answer::Recorders {
            metrics: &self.metrics,
            stats: &live.stats,
            top: &live.top,
            refusals: &self.refusals,
        };
        Ok(answer::answer(
            req,
            &mut plan,
            &decision,
            &self.answer,
            recorders,
        ))
    }
}
