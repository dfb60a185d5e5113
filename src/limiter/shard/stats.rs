//! The counters a shard keeps for metrics, written by the shard's parts through the methods
//! below and read without locks; [`EngineStats`] renders every shard's.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::telemetry::exposition::{family, Metrics};

/// Counters the shard keeps for metrics; read without locks.
#[derive(Debug, Default)]
pub struct ShardStats {
    keys: AtomicU64,
    waiting: AtomicU64,
    queued: AtomicU64,
    admitted_after_wait: AtomicU64,
    timed_out: AtomicU64,
    cancelled: AtomicU64,
    queue_full: AtomicU64,
    wait_ns_total: AtomicU64,
    /// Keys dropped before their window ended because the shard held its cap.
    evictions: AtomicU64,
    /// Redis mode: the breaker, as `BreakerState::gauge` gives it.
    breaker: AtomicU64,
    /// Decisions made without Redis while its breaker was open.
    fallback_decisions: AtomicU64,
    /// Hits refused from the local over-limit cache, without a round trip.
    local_cache_hits: AtomicU64,
    /// Local-first: messages decided from memory, and sync round trips sent.
    local_decisions: AtomicU64,
    syncs: AtomicU64,
    /// Exact limits: hits decided from memory while Redis was away, sent to it once back, and
    /// those dropped instead (their window ended first, or no room to keep them).
    replayed_hits: AtomicU64,
    replay_dropped_hits: AtomicU64,
    /// Local-first: hits admitted here that will never reach the store (no room for their
    /// key's view, or their window ended before a sync could carry them).
    local_first_dropped_hits: AtomicU64,
    /// Reservations (`reserve`): held by admitted checks; released by their request's report,
    /// by their time passing, or withdrawn because their request was refused elsewhere.
    holds_made: AtomicU64,
    holds_reported: AtomicU64,
    holds_expired: AtomicU64,
    holds_withdrawn: AtomicU64,
}

#[inline]
fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Adds `hits` when there are any (a negative count, hits given back, adds nothing).
fn add_hits(c: &AtomicU64, hits: i64) {
    if hits > 0 {
        add(c, hits.unsigned_abs());
    }
}

impl ShardStats {
    /// The shard holds `n` keys.
    #[inline]
    pub(crate) fn set_keys(&self, n: usize) {
        self.keys.store(n as u64, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn key_added(&self) {
        add(&self.keys, 1);
    }

    /// A key read back as dropped at start.
    pub(crate) fn key_removed(&self) {
        self.keys.fetch_sub(1, Ordering::Relaxed);
    }

    /// `n` keys evicted at the key cap.
    #[inline]
    pub(crate) fn evicted(&self, n: usize) {
        add(&self.evictions, n as u64);
    }

    /// `n` requests wait in the shard's queues.
    #[inline]
    pub(crate) fn set_waiting(&self, n: usize) {
        self.waiting.store(n as u64, Ordering::Relaxed);
    }

    /// A request went into a queue.
    #[inline]
    pub(crate) fn queued(&self) {
        add(&self.queued, 1);
    }

    /// A queued request was admitted after waiting `waited_ns`.
    #[inline]
    pub(crate) fn admitted_after(&self, waited_ns: u64) {
        add(&self.admitted_after_wait, 1);
        add(&self.wait_ns_total, waited_ns);
    }

    /// A queued request was refused at its `max_wait`.
    #[inline]
    pub(crate) fn timed_out(&self) {
        add(&self.timed_out, 1);
    }

    /// `n` queued requests whose callers went away.
    #[inline]
    pub(crate) fn cancelled(&self, n: usize) {
        add(&self.cancelled, n as u64);
    }

    /// A request refused at once because its queue was full.
    #[inline]
    pub(crate) fn queue_full(&self) {
        add(&self.queue_full, 1);
    }

    /// The store's breaker is now in `gauge` (`BreakerState::gauge`).
    #[inline]
    pub(crate) fn set_breaker(&self, gauge: u64) {
        self.breaker.store(gauge, Ordering::Relaxed);
    }

    /// A message decided without the store while its breaker was open.
    #[inline]
    pub(crate) fn fallback_decision(&self) {
        add(&self.fallback_decisions, 1);
    }

    /// `hits` refused from the local over-limit cache.
    #[inline]
    pub(crate) fn refused_from_cache(&self, hits: u64) {
        add(&self.local_cache_hits, hits);
    }

    /// Local-first: a message decided from memory.
    #[inline]
    pub(crate) fn local_decision(&self) {
        add(&self.local_decisions, 1);
    }

    /// Local-first: a sync round trip sent.
    #[inline]
    pub(crate) fn synced(&self) {
        add(&self.syncs, 1);
    }

    /// Local-first: `hits` admitted here will never be sent to the store.
    pub(crate) fn local_first_dropped(&self, hits: i64) {
        add_hits(&self.local_first_dropped_hits, hits);
    }

    /// Exact limits: `hits` decided here while the store was away went to it once back.
    pub(crate) fn replayed(&self, hits: i64) {
        add_hits(&self.replayed_hits, hits);
    }

    /// Exact limits: `hits` decided here while the store was away will never go to it.
    pub(crate) fn replay_dropped(&self, hits: i64) {
        add_hits(&self.replay_dropped_hits, hits);
    }

    /// Reservations: `n` held by admitted checks.
    pub(crate) fn holds_made(&self, n: u64) {
        add(&self.holds_made, n);
    }

    /// Reservations: `n` released by a report of their request's usage.
    pub(crate) fn holds_reported(&self, n: u64) {
        add(&self.holds_reported, n);
    }

    /// Reservations: `n` released because nobody reported within `reserve_for`.
    pub(crate) fn holds_expired(&self, n: u64) {
        add(&self.holds_expired, n);
    }

    /// Reservations: `n` taken back because their request was refused after all (by a limit
    /// on another shard), or its caller went away.
    pub(crate) fn holds_withdrawn(&self, n: u64) {
        add(&self.holds_withdrawn, n);
    }

    /// Every counter as it is now, each read on its own (relaxed).
    pub fn read(&self) -> ShardCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ShardCounts {
            keys: load(&self.keys),
            waiting: load(&self.waiting),
            queued: load(&self.queued),
            admitted_after_wait: load(&self.admitted_after_wait),
            timed_out: load(&self.timed_out),
            cancelled: load(&self.cancelled),
            queue_full: load(&self.queue_full),
            wait_ns_total: load(&self.wait_ns_total),
            evictions: load(&self.evictions),
            breaker: load(&self.breaker),
            fallback_decisions: load(&self.fallback_decisions),
            local_cache_hits: load(&self.local_cache_hits),
            local_decisions: load(&self.local_decisions),
            syncs: load(&self.syncs),
            local_first_dropped_hits: load(&self.local_first_dropped_hits),
            replayed_hits: load(&self.replayed_hits),
            replay_dropped_hits: load(&self.replay_dropped_hits),
            holds_made: load(&self.holds_made),
            holds_reported: load(&self.holds_reported),
            holds_expired: load(&self.holds_expired),
            holds_withdrawn: load(&self.holds_withdrawn),
        }
    }
}

/// A shard's counters as [`ShardStats::read`] read them (the status page, the health check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardCounts {
    pub keys: u64,
    pub waiting: u64,
    pub queued: u64,
    pub admitted_after_wait: u64,
    pub timed_out: u64,
    pub cancelled: u64,
    pub queue_full: u64,
    pub wait_ns_total: u64,
    pub evictions: u64,
    /// `BreakerState::gauge`.
    pub breaker: u64,
    pub fallback_decisions: u64,
    pub local_cache_hits: u64,
    pub local_decisions: u64,
    pub syncs: u64,
    pub local_first_dropped_hits: u64,
    pub replayed_hits: u64,
    pub replay_dropped_hits: u64,
    pub holds_made: u64,
    pub holds_reported: u64,
    pub holds_expired: u64,
    pub holds_withdrawn: u64,
}

type ShardField = fn(&ShardStats) -> &AtomicU64;

/// The per-shard families: name, type, help, and the counter each reads.
const SHARD_FAMILIES: [(&str, &str, &str, ShardField); 20] = [
    (
        "ratelimit_service_shard_keys",
        "gauge",
        "Counter keys held in memory.",
        |s| &s.keys,
    ),
    (
        "ratelimit_service_queue_waiting",
        "gauge",
        "Requests waiting in a queue now.",
        |s| &s.waiting,
    ),
    (
        "ratelimit_service_queue_queued_total",
        "counter",
        "Requests that went into a queue.",
        |s| &s.queued,
    ),
    (
        "ratelimit_service_queue_admitted_after_wait_total",
        "counter",
        "Queued requests admitted.",
        |s| &s.admitted_after_wait,
    ),
    (
        "ratelimit_service_queue_timed_out_total",
        "counter",
        "Queued requests refused at their max_wait.",
        |s| &s.timed_out,
    ),
    (
        "ratelimit_service_queue_cancelled_total",
        "counter",
        "Queued requests whose caller went away.",
        |s| &s.cancelled,
    ),
    (
        "ratelimit_service_queue_full_total",
        "counter",
        "Requests refused at once because their queue was full.",
        |s| &s.queue_full,
    ),
    (
        "ratelimit_service_shard_evictions_total",
        "counter",
        "Keys evicted before their window ended because the shard held its key cap.",
        |s| &s.evictions,
    ),
    (
        "ratelimit_service_redis_breaker_state",
        "gauge",
        "Redis circuit breaker: 0 closed, 1 open, 2 half-open.",
        |s| &s.breaker,
    ),
    (
        "ratelimit_service_redis_fallback_decisions_total",
        "counter",
        "Decisions made without Redis while its breaker was open.",
        |s| &s.fallback_decisions,
    ),
    (
        "ratelimit_service_rate_limit_over_limit_with_local_cache_total",
        "counter",
        "Hits refused from the local over-limit cache without a Redis round trip (envoyproxy/ratelimit's over_limit_with_local_cache, summed over limits).",
        |s| &s.local_cache_hits,
    ),
    (
        "ratelimit_service_local_first_decisions_total",
        "counter",
        "Local-first: requests decided from memory, without a Redis round trip.",
        |s| &s.local_decisions,
    ),
    (
        "ratelimit_service_local_first_syncs_total",
        "counter",
        "Local-first: background round trips adding local hits to Redis and reading totals back.",
        |s| &s.syncs,
    ),
    (
        "ratelimit_service_local_first_dropped_hits_total",
        "counter",
        "Local-first: hits admitted here that never went to Redis: no room for their key's view while Redis was away, or their window ended before a sync could carry them.",
        |s| &s.local_first_dropped_hits,
    ),
    (
        "ratelimit_service_redis_replayed_hits_total",
        "counter",
        "Hits decided from memory on exact limits while Redis was away, sent to Redis once it answered again.",
        |s| &s.replayed_hits,
    ),
    (
        "ratelimit_service_redis_replay_dropped_hits_total",
        "counter",
        "Hits decided from memory on exact limits while Redis was away and never sent: their window ended first, or the shard held its key cap.",
        |s| &s.replay_dropped_hits,
    ),
    (
        "ratelimit_service_reservations_made_total",
        "counter",
        "Reservations held by admitted checks of limits with reserve.",
        |s| &s.holds_made,
    ),
    (
        "ratelimit_service_reservations_reported_total",
        "counter",
        "Reservations released by the report of their request's usage.",
        |s| &s.holds_reported,
    ),
    (
        "ratelimit_service_reservations_expired_total",
        "counter",
        "Reservations released because no report came within reserve_for: the estimate or the report path is wrong.",
        |s| &s.holds_expired,
    ),
    (
        "ratelimit_service_reservations_withdrawn_total",
        "counter",
        "Reservations taken back because their request was refused by another limit, or its caller went away.",
        |s| &s.holds_withdrawn,
    ),
];

/// Every shard's counters, rendered as one family per counter labelled by shard.
#[derive(Debug, Clone)]
pub struct EngineStats {
    pub shards: Arc<[Arc<ShardStats>]>,
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
            for (i, s) in shards.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{name}{{shard=\"{i}\"}} {}",
                    field(s).load(Ordering::Relaxed)
                );
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
