//! The stats a shard keeps for metrics, written by the shard's parts through the methods
//! below and read without locks; its link's are beside the link (`link::LinkStats`), and
//! `engine_stats.rs` renders both for every shard.

use std::sync::atomic::{AtomicU64, Ordering};

/// Stats the shard keeps for metrics; read without locks.
#[derive(Debug, Default)]
pub struct ShardStats {
    pub(super) keys: AtomicU64,
    pub(super) waiting: AtomicU64,
    pub(super) queued: AtomicU64,
    pub(super) admitted_after_wait: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) queue_full: AtomicU64,
    pub(super) wait_ns_total: AtomicU64,
    /// Keys dropped before their window ended because the shard held its cap.
    pub(super) evictions: AtomicU64,
    /// Reservations (`reserve`): held by admitted checks; released by their request's report,
    /// by their time passing, or withdrawn because their request was refused elsewhere.
    pub(super) holds_made: AtomicU64,
    pub(super) holds_reported: AtomicU64,
    pub(super) holds_expired: AtomicU64,
    pub(super) holds_withdrawn: AtomicU64,
}

#[inline]
fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
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

    /// Every stat as it is now, each read on its own (relaxed).
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
            holds_made: load(&self.holds_made),
            holds_reported: load(&self.holds_reported),
            holds_expired: load(&self.holds_expired),
            holds_withdrawn: load(&self.holds_withdrawn),
        }
    }
}

/// A shard's stats as [`ShardStats::read`] read them (the status page, the health check).
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
    pub holds_made: u64,
    pub holds_reported: u64,
    pub holds_expired: u64,
    pub holds_withdrawn: u64,
}
