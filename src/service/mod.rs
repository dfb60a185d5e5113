//! A request's way through: validate → plan (descriptors → ops) → engine → answer. The gRPC
//! adapter and the HTTP `/json` endpoint both call [`RateLimiter::decide`], which counts the
//! call and its latency; the direct APIs' decisions (`throttle`) use the same engine, and so do
//! the admin listener's look-ups and resets (`admin`), planned as a request is. The live limits
//! (`live`) and the stats of the config loads that replace them (`reloads`) are here too.

mod admin;
mod answer;
mod error;
#[cfg(test)]
mod fixtures;
pub mod limitador;
mod live;
pub mod metrics;
mod plan;
pub mod rate;
mod refusal;
mod reloads;
mod request;
mod settings;
pub mod throttle;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

pub use admin::{Acted, AdminError, Applies, Usage};
pub use answer::WAITED_HEADER;
pub use error::RlsError;
pub use live::{ConfigCheck, Live, LiveLimits};
use refusal::RefusalLog;
pub use reloads::{ConfigLoad, ReloadLog, ReloadStats};
pub use request::{validate, within_bounds, Descriptor, Override, Request, RequestLimits};
pub use settings::{AnswerSettings, CountingRule, HeaderNames};
pub use throttle::{ThrottleLimits, ThrottleService, ThrottleStats};

use crate::limiter::Engine;
use metrics::RequestStats;

/// A cheap `Clone` handle: the live limits, the engine, and how to answer. `server` builds it
/// from the parts it hands the other adapters too; it hands none of them out. Its admin
/// look-ups and resets are in `admin.rs`, apart on purpose: they plan as a request does, and
/// decide nothing.
#[derive(Clone)]
pub struct RateLimiter {
    live: LiveLimits,
    engine: Engine,
    answer: Arc<AnswerSettings>,
    metrics: Arc<RequestStats>,
    refusals: Arc<RefusalLog>,
}

impl RateLimiter {
    /// Decides on `live`'s limits with `engine`, answering as `answer` says and counting in
    /// `metrics`.
    pub fn new(
        live: LiveLimits,
        engine: Engine,
        answer: AnswerSettings,
        metrics: Arc<RequestStats>,
    ) -> RateLimiter {
        RateLimiter {
            live,
            engine,
            answer: Arc::new(answer),
            metrics,
            refusals: Arc::default(),
        }
    }

    /// For the direct APIs and admin look-ups, which decide on the same engine.
    fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The limits being served now.
    fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Decides a request as envoyproxy/ratelimit would, plus turnstile's algorithms and queues.
    /// The call itself is counted where the door is wired (`metrics::DoorCalls`).
    pub async fn decide(&self, req: &Request<'_>) -> Result<RateLimitResponse, RlsError> {
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
