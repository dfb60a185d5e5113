//! The link's stats: the breaker, decisions made without a round trip, and the ledger's
//! hits sent to the store or dropped. Held by every shard (`ShardStats::link`), so the Redis
//! families read zeros in memory mode, and rendered with the shard's.

use std::sync::atomic::{AtomicU64, Ordering};

#[inline]
fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Adds `hits` when there are any (a negative count, a refund, adds nothing).
fn add_hits(c: &AtomicU64, hits: i64) {
    if hits > 0 {
        add(c, hits.unsigned_abs());
    }
}

/// Stats the link keeps for metrics; read without locks.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// The breaker, as `BreakerState::gauge` gives it.
    pub(crate) breaker: AtomicU64,
    /// Decisions made without the store while its breaker was open.
    pub(crate) fallback_decisions: AtomicU64,
    /// Hits refused from the local over-limit cache, without a round trip.
    pub(crate) local_cache_hits: AtomicU64,
    /// Local-first: messages decided from memory, and sync round trips sent.
    pub(crate) local_decisions: AtomicU64,
    pub(crate) syncs: AtomicU64,
    /// The ledger, local-first entries: hits admitted here that will never reach the store (no
    /// room for their key's entry, or their window ended before a sync could carry them).
    pub(crate) local_first_dropped_hits: AtomicU64,
    /// The ledger, fallback entries: hits decided from memory while the store was away, sent
    /// to it once back (replayed), and those dropped instead (their window ended first, or no
    /// room to keep them).
    pub(crate) replayed_hits: AtomicU64,
    pub(crate) replay_dropped_hits: AtomicU64,
}

impl LinkStats {
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

    /// Fallback: `hits` decided here while the store was away went to it once back.
    pub(crate) fn replayed(&self, hits: i64) {
        add_hits(&self.replayed_hits, hits);
    }

    /// Fallback: `hits` decided here while the store was away will never go to it.
    pub(crate) fn replay_dropped(&self, hits: i64) {
        add_hits(&self.replay_dropped_hits, hits);
    }

    /// Every stat as it is now, each read on its own (relaxed).
    pub fn read(&self) -> LinkCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkCounts {
            breaker: load(&self.breaker),
            fallback_decisions: load(&self.fallback_decisions),
            local_cache_hits: load(&self.local_cache_hits),
            local_decisions: load(&self.local_decisions),
            syncs: load(&self.syncs),
            local_first_dropped_hits: load(&self.local_first_dropped_hits),
            replayed_hits: load(&self.replayed_hits),
            replay_dropped_hits: load(&self.replay_dropped_hits),
        }
    }
}

/// A link's stats as [`LinkStats::read`] read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkCounts {
    /// `BreakerState::gauge`.
    pub breaker: u64,
    pub fallback_decisions: u64,
    pub local_cache_hits: u64,
    pub local_decisions: u64,
    pub syncs: u64,
    pub local_first_dropped_hits: u64,
    pub replayed_hits: u64,
    pub replay_dropped_hits: u64,
}
