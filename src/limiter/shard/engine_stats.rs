//! The engine's part of the exposition: every shard's stats (`stats.rs`) and its link's
//! (`link::LinkStats`), one family per stat labelled by shard.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::link::LinkStats;
use super::stats::ShardStats;
use crate::telemetry::exposition::{family, Metrics};

/// Where a family's stat lives: in the shard's stats or its link's.
#[derive(Clone, Copy)]
enum Field {
    Shard(fn(&ShardStats) -> &AtomicU64),
    Link(fn(&LinkStats) -> &AtomicU64),
}

/// The per-shard families: name, type, help, and the stat each reads.
const SHARD_FAMILIES: [(&str, &str, &str, Field); 20] = [
    (
        "ratelimit_service_shard_keys",
        "gauge",
        "Counter keys held in memory.",
        Field::Shard(|s| &s.keys),
    ),
    (
        "ratelimit_service_queue_waiting",
        "gauge",
        "Requests waiting in a queue now.",
        Field::Shard(|s| &s.waiting),
    ),
    (
        "ratelimit_service_queue_queued_total",
        "counter",
        "Requests that went into a queue.",
        Field::Shard(|s| &s.queued),
    ),
    (
        "ratelimit_service_queue_admitted_after_wait_total",
        "counter",
        "Queued requests admitted.",
        Field::Shard(|s| &s.admitted_after_wait),
    ),
    (
        "ratelimit_service_queue_timed_out_total",
        "counter",
        "Queued requests refused at their max_wait.",
        Field::Shard(|s| &s.timed_out),
    ),
    (
        "ratelimit_service_queue_cancelled_total",
        "counter",
        "Queued requests whose caller went away.",
        Field::Shard(|s| &s.cancelled),
    ),
    (
        "ratelimit_service_queue_full_total",
        "counter",
        "Requests refused at once because their queue was full.",
        Field::Shard(|s| &s.queue_full),
    ),
    (
        "ratelimit_service_shard_evictions_total",
        "counter",
        "Keys evicted before their window ended because the shard held its key cap.",
        Field::Shard(|s| &s.evictions),
    ),
    (
        "ratelimit_service_redis_breaker_state",
        "gauge",
        "Redis circuit breaker: 0 closed, 1 open, 2 half-open.",
        Field::Link(|s| &s.breaker),
    ),
    (
        "ratelimit_service_redis_fallback_decisions_total",
        "counter",
        "Decisions made without Redis while its breaker was open.",
        Field::Link(|s| &s.fallback_decisions),
    ),
    (
        "ratelimit_service_rate_limit_over_limit_with_local_cache_total",
        "counter",
        "Hits refused from the local over-limit cache without a Redis round trip (envoyproxy/ratelimit's over_limit_with_local_cache, summed over limits).",
        Field::Link(|s| &s.local_cache_hits),
    ),
    (
        "ratelimit_service_local_first_decisions_total",
        "counter",
        "Local-first: requests decided from memory, without a Redis round trip.",
        Field::Link(|s| &s.local_decisions),
    ),
    (
        "ratelimit_service_local_first_syncs_total",
        "counter",
        "Local-first: background round trips adding local hits to Redis and reading totals back.",
        Field::Link(|s| &s.syncs),
    ),
    (
        "ratelimit_service_local_first_dropped_hits_total",
        "counter",
        "Local-first: hits admitted here that never went to Redis: no room for their key's view while Redis was away, or their window ended before a sync could carry them.",
        Field::Link(|s| &s.local_first_dropped_hits),
    ),
    (
        "ratelimit_service_redis_replayed_hits_total",
        "counter",
        "Hits decided from memory on exact limits while Redis was away, sent to Redis once it answered again.",
        Field::Link(|s| &s.replayed_hits),
    ),
    (
        "ratelimit_service_redis_replay_dropped_hits_total",
        "counter",
        "Hits decided from memory on exact limits while Redis was away and never sent: their window ended first, or the shard held its key cap.",
        Field::Link(|s| &s.replay_dropped_hits),
    ),
    (
        "ratelimit_service_reservations_made_total",
        "counter",
        "Reservations held by admitted checks of limits with reserve.",
        Field::Shard(|s| &s.holds_made),
    ),
    (
        "ratelimit_service_reservations_reported_total",
        "counter",
        "Reservations released by the report of their request's usage.",
        Field::Shard(|s| &s.holds_reported),
    ),
    (
        "ratelimit_service_reservations_expired_total",
        "counter",
        "Reservations released because no report came within reserve_for: the estimate or the report path is wrong.",
        Field::Shard(|s| &s.holds_expired),
    ),
    (
        "ratelimit_service_reservations_withdrawn_total",
        "counter",
        "Reservations taken back because their request was refused by another limit, or its caller went away.",
        Field::Shard(|s| &s.holds_withdrawn),
    ),
];

/// Every shard's stats and its link's, rendered as one family per stat labelled by
/// shard (the link's read zeros in memory mode).
#[derive(Debug, Clone)]
pub struct EngineStats {
    pub shards: Arc<[Arc<ShardStats>]>,
    pub links: Arc<[Arc<LinkStats>]>,
}

impl EngineStats {
    /// Each shard's breaker, as `BreakerState::gauge` gives it (the health check, the status
    /// page).
    pub fn breakers(&self) -> impl Iterator<Item = u64> + '_ {
        (self.links.iter()).map(|l| l.breaker.load(Ordering::Relaxed))
    }
}

impl Metrics for EngineStats {
    fn render(&self, out: &mut String) {
        // An engine has a shard at least: none means no engine to show.
        let shards = &self.shards;
        if shards.is_empty() {
            return;
        }
        for (name, kind, help, field) in SHARD_FAMILIES {
            family(out, name, help, kind);
            for (i, (s, l)) in shards.iter().zip(self.links.iter()).enumerate() {
                let n = match field {
                    Field::Shard(f) => f(s),
                    Field::Link(f) => f(l),
                };
                let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", n.load(Ordering::Relaxed));
            }
        }
        let name = "ratelimit_service_queue_wait_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Time queued requests spent waiting.\n# TYPE {name} counter"
        );
        for (i, s) in shards.iter().enumerate() {
            let secs = s.wait_ns_total.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {secs}");
        }
    }
}
