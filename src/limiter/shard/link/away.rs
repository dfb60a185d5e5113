//! Exact limits while the store is away: the hits this replica decides from memory (the failure
//! mode `fallback`, or a queue head decided here while the breaker is open) are kept per key and
//! sent to the store once it answers again, so an outage costs no usage.
//!
//! Per key the shard keeps the hits decided here (negative: more given back than taken) and when.
//! The kept hits go in a round trip once the breaker lets one through (closed, or its cooldown
//! over: then the replay is the half-open probe), counted whatever the limit says
//! (`StoreOp::sync_at`, as local-first syncs go), and only what still weighs on a decision now:
//! a fixed or sliding window's hits while their window lasts (a window that ended meanwhile is
//! dropped), a token bucket's tokens not refilled since. A replay that fails goes again after
//! the breaker's cooldown; one abandoned at its deadline was written to the store, which counts
//! it if it ever reads it (a stalled Redis does, on waking), so it is not sent twice.
//!
//! Hits of a batch that was sent and abandoned at its deadline, then decided from memory, are not
//! kept either: the store may count that batch itself. Hits of a batch that failed otherwise
//! (refused, reset) never reached it, and are kept.
//!
//! Bounded as local-first's views are: at most `cap` keys per shard (the shard's share of
//! `TURNSTILE_MAX_KEYS`), idle ones forgotten first; a new key's hits past that are dropped and
//! counted (`ratelimit_service_redis_replay_dropped_hits_total`), as are hits whose window ended
//! before they could go. Hits sent count in `ratelimit_service_redis_replayed_hits_total`.

use std::sync::Arc;

use super::sync::{with_hits, SyncOp};
use crate::config::Algorithm;
use crate::limiter::key::{Key, KeyMap};
use crate::limiter::op::Op;
use crate::limiter::shard::counters::Counters;
use crate::limiter::shard::queues::Queues;
use crate::limiter::shard::stats::ShardStats;
use crate::limiter::store::StoreReply;

/// One key's hits decided here while the store was away.
struct Kept {
    /// The key and its limit (`hits` 0).
    op: Op,
    /// Hits not sent yet (negative: given back), decided at `at` (a window's: any time in it;
    /// a bucket's: the latest).
    delta: i64,
    at: u64,
    /// Hits the replay in flight carries, decided at `sending_at`.
    sending: i64,
    sending_at: u64,
}

pub(crate) struct Away {
    keys: KeyMap<Kept>,
    cap: usize,
    /// How long a replay that could not go, or failed, waits before it is tried again (the
    /// breaker's cooldown), ns.
    retry: u64,
    /// When the kept hits may next go (clock ns).
    next_try: u64,
    /// Some key holds hits not sent yet.
    waiting: bool,
    /// Whether decisions made now are kept: not while a batch the store may count itself (one
    /// abandoned at its deadline) is decided from memory.
    keeping: bool,
    stats: Arc<ShardStats>,
}

/// Of `hits` decided at `at` on `op`'s key, those that still weigh on a decision at `now`: a
/// window's while it lasts, a bucket's tokens not refilled since (given back ones stand).
fn still(op: &Op, hits: i64, at: u64, now: u64) -> i64 {
    let p = &op.params;
    match p.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            if p.span(at).idx == p.span(now).idx {
                hits
            } else {
                0
            }
        }
        Algorithm::TokenBucket { .. } if hits > 0 && p.requests_per_unit > 0 => {
            let interval = (p.window_ms.max(1) * 1_000_000 / u64::from(p.requests_per_unit)).max(1);
            let refilled = now.saturating_sub(at) / interval;
            hits.saturating_sub(i64::try_from(refilled).unwrap_or(i64::MAX))
                .max(0)
        }
        Algorithm::TokenBucket { .. } => hits,
    }
}

impl Away {
    pub(crate) fn new(cap: usize, retry_ns: u64, stats: Arc<ShardStats>) -> Away {
        Away {
            keys: KeyMap::default(),
            cap: cap.max(16),
            retry: retry_ns.max(1),
            next_try: 0,
            waiting: false,
            keeping: true,
            stats,
        }
    }

    /// Whether decisions made from now on are kept for the store (see `keeping`).
    pub(crate) fn keep(&mut self, on: bool) {
        self.keeping = on;
    }

    /// Counts hits decided here on an exact limit's key (negative: given back).
    pub(crate) fn record(&mut self, op: &Op, hits: i64, now: u64) {
        if !self.keeping || hits == 0 {
            return;
        }
        if !self.keys.contains_key(&op.key) {
            if self.keys.len() >= self.cap {
                self.keys.retain(|_, k| k.delta != 0 || k.sending != 0);
            }
            if self.keys.len() >= self.cap {
                self.stats.replay_dropped(hits);
                return;
            }
            let mut key_op = op.clone();
            key_op.hits = 0;
            let k = Kept {
                op: key_op,
                delta: 0,
                at: now,
                sending: 0,
                sending_at: now,
            };
            self.keys.insert(op.key.clone(), k);
        }
        let Some(k) = self.keys.get_mut(&op.key) else {
            return;
        };
        if k.delta != 0 {
            // Hits of a window that ended no longer matter; a bucket's refilled tokens neither.
            let kept = still(&k.op, k.delta, k.at, now);
            self.stats.replay_dropped(k.delta - kept.max(0));
            k.delta = kept;
        }
        if k.delta == 0 || matches!(k.op.params.algorithm, Algorithm::TokenBucket { .. }) {
            k.at = now;
        }
        k.delta = k.delta.saturating_add(hits);
        self.waiting |= k.delta != 0;
    }

    /// Hits decided here that the store has not counted yet and still weigh on `op` at `now`.
    pub(crate) fn unsynced(&self, op: &Op, now: u64) -> i64 {
        if self.keys.is_empty() {
            return 0;
        }
        self.keys.get(&op.key).map_or(0, |k| {
            still(&k.op, k.delta, k.at, now) + still(&k.op, k.sending, k.sending_at, now)
        })
    }

    /// A reset: the key's kept hits are forgotten (a replay already out still lands).
    pub(crate) fn forget(&mut self, key: &Key) {
        self.keys.remove(key);
    }

    /// When the kept hits may next go (`u64::MAX`: none waits).
    pub(crate) fn due_at(&self) -> u64 {
        if self.waiting {
            self.next_try
        } else {
            u64::MAX
        }
    }

    /// The kept hits to send with a round trip starting at `now`, if the breaker lets one
    /// through (`ready`); else they wait a cooldown.
    pub(crate) fn take(&mut self, now: u64, ready: bool, out: &mut Vec<SyncOp>) {
        if !self.waiting || now < self.next_try {
            return;
        }
        self.next_try = now.saturating_add(self.retry);
        if !ready {
            return;
        }
        self.keys.retain(|_, k| k.delta != 0 || k.sending != 0);
        let mut waiting = false;
        for k in self.keys.values_mut() {
            if k.delta == 0 {
                continue;
            }
            if k.sending != 0 {
                // One replay a key at a time: these go after it.
                waiting = true;
                continue;
            }
            let hits = still(&k.op, k.delta, k.at, now);
            self.stats.replay_dropped(k.delta - hits.max(0));
            k.delta = 0;
            if hits != 0 {
                out.push(SyncOp::new(&k.op, hits, k.at, true));
                (k.sending, k.sending_at) = (hits, k.at);
            }
        }
        self.waiting = waiting;
    }

    /// A replay failed: its hits are kept again (those still weighing on a decision), to go
    /// after the cooldown; if it was abandoned at its deadline (`landed`), the store may count
    /// it, so it is not sent again.
    pub(crate) fn failed(&mut self, s: &SyncOp, landed: bool, now: u64) {
        let hits = s.signed_hits();
        let Some(k) = self.keys.get_mut(&s.op.key) else {
            return;
        };
        if k.sending == 0 || k.sending_at != s.at {
            return;
        }
        k.sending = 0;
        if landed {
            self.stats.replayed(hits);
            if k.delta == 0 {
                self.keys.remove(&s.op.key);
            }
            return;
        }
        let back = still(&k.op, hits, s.at, now);
        self.stats.replay_dropped(hits - back.max(0));
        if back == 0 {
            return;
        }
        if k.delta == 0 {
            k.at = s.at;
        }
        k.delta = k.delta.saturating_add(back);
        self.waiting = true;
        self.next_try = now.saturating_add(self.retry);
    }

    /// A replay came back: its hits are counted in the store. The key's memory state becomes
    /// the store's total plus what was decided here since, so the next outage starts from it.
    pub(crate) fn synced(
        &mut self,
        (counters, queues): (&mut Counters, &Queues),
        (s, reply): (&SyncOp, &StoreReply),
        (started, now): (u64, u64),
        queued: i64,
    ) {
        let hits = s.signed_hits();
        self.stats.replayed(hits);
        // Kept hits decided meanwhile go at once.
        self.next_try = 0;
        let Some(k) = self.keys.get_mut(&s.op.key) else {
            return;
        };
        if k.sending_at == s.at {
            k.sending = 0;
        }
        let p = s.op.params;
        // Fixed and sliding windows counted into the window of `at`; buckets took tokens at
        // the round trip's start.
        let when = match p.algorithm {
            Algorithm::TokenBucket { .. } => started,
            _ => s.at,
        };
        let total = if hits < 0 {
            reply.before
        } else {
            reply.before.add(&p, when, hits.unsigned_abs())
        };
        let local = still(&k.op, k.delta, k.at, now) - queued;
        counters.put(&s.op.key, with_hits(total, &p, now, local), &p, now, queues);
        if k.delta == 0 && k.sending == 0 {
            // Nothing left to send: exact decisions stop looking the key up.
            self.keys.remove(&s.op.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::key::KeyRef;
    use crate::limiter::op::test_op;

    const SEC: u64 = 1_000_000_000;

    fn op(key: &str, algorithm: Algorithm) -> Op {
        Op {
            local_first: Some(false),
            reserve: crate::limiter::Reservation::None,
            ..test_op(key, algorithm, 10, 10_000)
        }
    }

    fn away(cap: usize) -> (Away, Arc<ShardStats>) {
        let stats = Arc::new(ShardStats::default());
        (Away::new(cap, SEC, stats.clone()), stats)
    }

    fn sent(out: &[SyncOp]) -> Vec<(i64, u64)> {
        let mut v: Vec<(i64, u64)> = out.iter().map(|s| (s.signed_hits(), s.at)).collect();
        v.sort();
        v
    }

    #[test]
    fn kept_hits_net_out_refunds_and_wait_for_the_breaker() {
        let (mut a, _) = away(100);
        let k = op("k", Algorithm::FixedWindow);
        let t = 100 * SEC;
        a.record(&k, 5, t);
        a.record(&k, 3, t + 1);
        a.record(&k, -2, t + 2);
        assert_eq!(a.unsynced(&k, t + 3), 6);
        let mut out = Vec::new();
        // The breaker is open: nothing goes, and the next try waits a cooldown.
        a.take(t + 3, false, &mut out);
        assert!(out.is_empty());
        assert_eq!(a.due_at(), t + 3 + SEC);
        a.take(t + 3 + SEC, true, &mut out);
        assert_eq!(sent(&out), vec![(6, t)]);
        // In flight, still unsynced; nothing else waits.
        assert_eq!(a.unsynced(&k, t + 4), 6);
        assert_eq!(a.due_at(), u64::MAX);
    }

    #[test]
    fn a_failed_replay_is_kept_again_unless_it_was_abandoned_at_its_deadline() {
        let (mut a, stats) = away(100);
        let k = op("k", Algorithm::FixedWindow);
        let t = 100 * SEC;
        a.record(&k, 4, t);
        let mut out = Vec::new();
        a.take(t, true, &mut out);
        a.record(&k, 1, t + 1);
        a.failed(&out[0], false, t + 2);
        assert_eq!(a.unsynced(&k, t + 2), 5);
        let mut again = Vec::new();
        a.take(t + 2 + SEC, true, &mut again);
        assert_eq!(sent(&again), vec![(5, t + 1)]);
        a.failed(&again[0], true, t + 3);
        assert_eq!(a.unsynced(&k, t + 3), 0);
        assert_eq!(stats.read().replayed_hits, 5);
    }

    #[test]
    fn hits_of_a_window_that_ended_are_dropped_and_counted() {
        let (mut a, stats) = away(100);
        let k = op("k", Algorithm::FixedWindow);
        let s = op("s", Algorithm::SlidingWindow);
        let t = 100 * SEC;
        a.record(&k, 7, t);
        a.record(&s, 2, t);
        // The next 10 s window: the old hits weigh nothing now.
        a.record(&k, 1, t + 10 * SEC);
        let mut out = Vec::new();
        a.take(t + 10 * SEC, true, &mut out);
        assert_eq!(sent(&out), vec![(1, t + 10 * SEC)]);
        assert_eq!(stats.read().replay_dropped_hits, 9);
    }

    #[test]
    fn a_buckets_refilled_tokens_are_not_replayed() {
        let (mut a, _) = away(100);
        // 10 tokens a 10 s: one a second.
        let b = op("b", Algorithm::TokenBucket { burst: 10 });
        let t = 100 * SEC;
        a.record(&b, 6, t);
        assert_eq!(a.unsynced(&b, t + 2 * SEC), 4);
        assert_eq!(a.unsynced(&b, t + 9 * SEC), 0);
    }

    #[test]
    fn kept_keys_are_bounded_and_what_does_not_fit_is_counted() {
        let (mut a, stats) = away(16);
        for i in 0..20 {
            a.record(&op(&format!("k{i}"), Algorithm::FixedWindow), 3, SEC);
        }
        assert_eq!(a.keys.len(), 16);
        assert!(a.keys.contains_key(&KeyRef::of("k0")));
        assert_eq!(stats.read().replay_dropped_hits, 12);
    }

    #[test]
    fn nothing_is_kept_while_a_batch_the_store_may_count_is_decided() {
        let (mut a, _) = away(16);
        let k = op("k", Algorithm::FixedWindow);
        a.keep(false);
        a.record(&k, 3, SEC);
        a.keep(true);
        assert_eq!(a.unsynced(&k, SEC), 0);
        assert_eq!(a.due_at(), u64::MAX);
    }
}
