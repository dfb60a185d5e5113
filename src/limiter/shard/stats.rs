//! The counters a shard keeps for metrics, read without locks.

use std::sync::atomic::AtomicU64;

/// Counters the shard keeps for metrics; read without locks.
#[derive(Debug, Default)]
pub struct ShardStats {
    pub keys: AtomicU64,
    pub waiting: AtomicU64,
    pub queued: AtomicU64,
    pub admitted_after_wait: AtomicU64,
    pub timed_out: AtomicU64,
    pub cancelled: AtomicU64,
    pub queue_full: AtomicU64,
    pub wait_ns_total: AtomicU64,
    /// Keys dropped before their window ended because the shard held its cap.
    pub evictions: AtomicU64,
    /// Redis mode: the breaker, as `BreakerState::gauge` gives it.
    pub breaker: AtomicU64,
    pub redis_errors: AtomicU64,
    /// Decisions made without Redis while its breaker was open.
    pub fallback_decisions: AtomicU64,
    /// Hits refused from the local over-limit cache, without a round trip.
    pub local_cache_hits: AtomicU64,
    /// Local-first: messages decided from memory, and sync round trips sent.
    pub local_decisions: AtomicU64,
    pub syncs: AtomicU64,
    /// Exact limits: hits decided from memory while Redis was away, sent to it once back, and
    /// those dropped instead (their window ended first, or no room to keep them).
    pub replayed_hits: AtomicU64,
    pub replay_dropped_hits: AtomicU64,
}
