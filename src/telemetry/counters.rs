//! Every subsystem's counters side by side, as `server` gathers them for the exposition.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::admin::AdminStats;
use super::push_stats::StatsdStats;
use super::{QuotaStats, ReloadStats, RequestStats, StateStats, ThrottleStats, TlsStats};
use crate::limiter::ShardStats;

/// What the Prometheus text and the statsd push read. Each part is held and updated by its
/// subsystem; this is a set of handles on them, cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// The request path's (`service`).
    pub service: Arc<RequestStats>,
    /// The engine's, one per shard (`limiter`).
    pub shards: Arc<[Arc<ShardStats>]>,
    /// The statsd push's own (`statsd::run`).
    pub statsd: Arc<StatsdStats>,
    /// Config loads (`server::reload`).
    pub reloads: Arc<ReloadStats>,
    /// gRPC's TLS (`server`'s TLS listener).
    pub tls: Arc<TlsStats>,
    /// The direct APIs and RESP connections (`service::ThrottleService`, `transport::resp`).
    pub throttle: Arc<ThrottleStats>,
    /// The admin listener's look-ups and resets (`transport::http`'s admin router).
    pub admin: Arc<AdminStats>,
    /// RLQS streams and shares (`quota::QuotaHub`).
    pub quota: Arc<QuotaStats>,
    /// Tries of the first Redis connection that failed and were retried (`server`'s start).
    pub redis_startup_retries: Arc<AtomicU64>,
    /// The durable counters' syncs (`durable::Journal`).
    pub state: Arc<StateStats>,
}
