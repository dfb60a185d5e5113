//! Local-first: a shard with a store decides local-first limits from memory and meets the store
//! in the background.
//!
//! Per key the shard keeps a *view*: the store's count as last read (held in the shard's table)
//! plus the hits admitted here since. Every `sync_interval` one pipeline adds each key's local
//! hits to the store unconditionally and reads back the total, which becomes the new view (plus
//! whatever was admitted here while the round trip was out).
//!
//! A message is decided locally only when every op is local-first and its key's view was read
//! within 1.5 intervals; a key seen for the first time, or idle for a while, goes the exact way
//! once (one round trip through the store), which also gives it a view. So every local decision
//! rests on a count at most 1.5 T old, and what this replica cannot see is only what the other
//! replicas admitted in the last 2.5 T: with R replicas, a window admits at most the limit plus
//! what R − 1 replicas admit in 2.5 T, and never more than R × the limit (each replica's view
//! stops it at the limit). While the store cannot be reached, decisions stay local on the last
//! view (each replica then holds the limit on its own) and the hits wait, per key, for the
//! store to come back; hits of fixed windows that ended meanwhile are not replayed.
//!
//! Exact limits' hits decided from memory while the store is away wait beside the views, per
//! key, and go with the same round trips (`away`).

use std::sync::Arc;

use super::away::Away;
use super::sync::{with_hits, SyncOp};
use crate::config::Algorithm;
use crate::limiter::key::{Key, KeyMap};
use crate::limiter::op::Op;
use crate::limiter::shard::counters::Counters;
use crate::limiter::shard::queues::Queues;
use crate::limiter::shard::stats::ShardStats;
use crate::limiter::store::StoreReply;

/// A key's local-first bookkeeping.
struct View {
    /// The key and its limit; `hits` is set to what a sync sends.
    op: Op,
    /// Hits admitted here since the last sync went out (negative: more given back than taken,
    /// a refund), all in the window holding `delta_at`.
    delta: i64,
    delta_at: u64,
    /// Hits the sync in flight carries (given back to `delta` if it fails).
    sending: i64,
    sending_at: u64,
    /// When the store's count this view holds was read (its round trip's start); 0: never.
    read_at: u64,
    /// Decided on since the last sync went out: the next sync refreshes it.
    used: bool,
}

pub(crate) struct Views {
    /// Local-first for ops that do not say.
    default_on: bool,
    interval: u64,
    next_sync: u64,
    views: KeyMap<View>,
    /// Hits of a window that ended before its sync went out, sent with the next one.
    late: Vec<SyncOp>,
    cap: usize,
    /// Exact limits' hits decided here while the store was away.
    pub(crate) away: Away,
    stats: Arc<ShardStats>,
}

impl Views {
    /// Views of at most `cap` keys, synced every `interval_ns`; kept exact hits wait
    /// `retry_ns` after a replay that could not go.
    pub(crate) fn new(
        default_on: bool,
        (interval_ns, retry_ns): (u64, u64),
        cap: usize,
        stats: Arc<ShardStats>,
    ) -> Views {
        Views {
            default_on,
            interval: interval_ns.max(1),
            next_sync: 0,
            views: KeyMap::default(),
            late: Vec::new(),
            cap: cap.max(16),
            away: Away::new(cap, retry_ns, stats.clone()),
            stats,
        }
    }

    /// Whether `op` is decided local-first (sliding windows never are: `check` refuses them).
    pub(crate) fn applies(&self, op: &Op) -> bool {
        op.local_first.unwrap_or(self.default_on)
            && op.grant.is_none()
            && op.params.algorithm != Algorithm::SlidingWindow
    }

    /// Whether every op of a message may be decided from memory now: local-first, with a
    /// fresh view. Marks the keys used, so the next sync refreshes them.
    pub(crate) fn local(&mut self, ops: &[Op], now: u64, store_ready: bool) -> bool {
        if ops.is_empty() || !ops.iter().all(|op| self.applies(op)) {
            return false;
        }
        let fresh_for = self.interval + self.interval / 2;
        let mut fresh = true;
        for op in ops {
            match self.views.get_mut(&op.key) {
                Some(v) => {
                    v.used = true;
                    fresh &= v.read_at > 0 && now.saturating_sub(v.read_at) <= fresh_for;
                }
                None => fresh = false,
            }
        }
        // Without the store, the last view (or none) is all there is.
        fresh || !store_ready
    }

    /// The view of `op`'s key, made if it has none and there is room.
    fn view(&mut self, op: &Op, now: u64) -> Option<&mut View> {
        if !self.views.contains_key(&op.key) {
            if self.views.len() >= self.cap {
                self.views
                    .retain(|_, v| v.delta != 0 || v.sending != 0 || v.used);
            }
            if self.views.len() >= self.cap {
                return None;
            }
            let mut key_op = op.clone();
            key_op.hits = 0;
            self.views.insert(
                op.key.clone(),
                View {
                    op: key_op,
                    delta: 0,
                    delta_at: now,
                    sending: 0,
                    sending_at: now,
                    read_at: 0,
                    used: true,
                },
            );
        }
        self.views.get_mut(&op.key)
    }

    /// Hits admitted here since the last sync that still count at `now`.
    fn pending(v: &View, now: u64) -> i64 {
        if same_window(&v.op, v.delta_at, now) {
            v.delta
        } else {
            0
        }
    }

    /// Hits admitted here that Redis has not counted yet: the sync in flight (it goes after the
    /// exact ops of its round trip) and those since.
    pub(crate) fn unsynced(&self, op: &Op, now: u64) -> i64 {
        if !self.applies(op) {
            return self.away.unsynced(op, now);
        }
        self.views.get(&op.key).map_or(0, |v| {
            let sending = if same_window(&v.op, v.sending_at, now) {
                v.sending
            } else {
                0
            };
            sending + Views::pending(v, now)
        })
    }

    /// Counts hits admitted here (negative: given back) on a local-first op's key; on an exact
    /// op's key (decided here only while the store is away) they are kept for it (`away`).
    pub(crate) fn record(&mut self, op: &Op, hits: i64, now: u64) {
        if !self.applies(op) {
            return self.away.record(op, hits, now);
        }
        if hits == 0 {
            return;
        }
        let mut late = None;
        let Some(v) = self.view(op, now) else {
            self.stats.local_first_dropped(hits);
            return;
        };
        // Syncs count by the limit the latest request carried (an override, a reload), over
        // the same window.
        if v.op.params.window_ms == op.params.window_ms {
            v.op.params = op.params;
        }
        if v.delta != 0 && !same_window(&v.op, v.delta_at, now) {
            // A new fixed window: the old one's hits go on their own.
            late = Some(SyncOp::new(&v.op, v.delta, v.delta_at, false));
            v.delta = 0;
        }
        if v.delta == 0 {
            v.delta_at = now;
        }
        v.delta = v.delta.saturating_add(hits);
        v.used = true;
        self.late.extend(late);
    }

    /// A reset: forgets `key`'s view and the hits waiting to go to the store with it (those of
    /// a sync already out still land).
    pub(crate) fn forget(&mut self, key: &Key) {
        self.views.remove(key);
        self.late.retain(|s| &s.op.key != key);
        self.away.forget(key);
    }

    /// When the next sync is due.
    pub(crate) fn next_sync(&self) -> u64 {
        let views = if self.views.is_empty() && self.late.is_empty() {
            u64::MAX
        } else {
            self.next_sync
        };
        views.min(self.away.due_at())
    }

    /// The keys to send if a sync is due at `now`: each used key with its local hits (0: only
    /// read back), and kept exact hits if the breaker lets them through (`ready`). Keys idle
    /// since the last sync are forgotten.
    pub(crate) fn take_due(&mut self, now: u64, ready: bool) -> Vec<SyncOp> {
        let mut out = self.take_views(now);
        self.away.take(now, ready, &mut out);
        out
    }

    fn take_views(&mut self, now: u64) -> Vec<SyncOp> {
        if now < self.next_sync || (self.views.is_empty() && self.late.is_empty()) {
            return Vec::new();
        }
        self.next_sync = now + self.interval;
        let mut out = std::mem::take(&mut self.late);
        self.views
            .retain(|_, v| v.used || v.delta != 0 || v.sending != 0);
        for v in self.views.values_mut() {
            if !(v.used || v.delta != 0) {
                continue;
            }
            let at = if v.delta != 0 { v.delta_at } else { now };
            out.push(SyncOp::new(&v.op, v.delta, at, false));
            v.sending = v.delta;
            v.sending_at = at;
            v.delta = 0;
            v.used = false;
        }
        out
    }

    /// A sync failed: its hits wait for the next one, unless their fixed window is over. A
    /// sync abandoned at the deadline (`landed`) was written, and the store counts it if it
    /// ever reads it (a stalled Redis does, on waking): it is not sent again, local hits and
    /// kept exact hits alike (see `away`), so no hit is counted twice.
    pub(crate) fn failed(&mut self, sent: Vec<SyncOp>, now: u64, landed: bool) {
        for s in sent {
            if s.kept {
                self.away.failed(&s, landed, now);
                continue;
            }
            if landed {
                if let Some(v) = self.views.get_mut(&s.op.key) {
                    if s.at == v.sending_at {
                        v.sending = 0;
                    }
                }
                continue;
            }
            match self.views.get_mut(&s.op.key) {
                Some(v) if v.sending != 0 && s.at == v.sending_at => {
                    if same_window(&v.op, v.sending_at, now) {
                        if v.delta == 0 || !same_window(&v.op, v.delta_at, v.sending_at) {
                            v.delta_at = v.sending_at;
                        }
                        v.delta = v.delta.saturating_add(v.sending);
                    } else {
                        self.stats.local_first_dropped(v.sending);
                    }
                    v.sending = 0;
                }
                Some(_) | None if s.op.hits > 0 && same_window(&s.op, s.at, now) => {
                    self.late.push(s)
                }
                _ if !s.refund => self.stats.local_first_dropped(s.op.hits as i64),
                _ => {}
            }
        }
    }
}

/// Whether `a` and `b` fall in one window of `op`'s fixed window (token buckets have none).
fn same_window(op: &Op, a: u64, b: u64) -> bool {
    match op.params.algorithm {
        Algorithm::FixedWindow => op.params.span(a).idx == op.params.span(b).idx,
        _ => true,
    }
}

impl Views {
    /// A sync came back: each key's view becomes the store's total, plus what was admitted here
    /// while the round trip was out, less the hits `queued` says are on their way back.
    pub(crate) fn synced(
        &mut self,
        (counters, queues): (&mut Counters, &Queues),
        (sent, replies): (Vec<SyncOp>, &[StoreReply]),
        (started, now): (u64, u64),
        queued: impl Fn(&Key) -> i64,
    ) {
        for (s, reply) in sent.into_iter().zip(replies) {
            if s.kept {
                let queued = queued(&s.op.key);
                let parts = (&mut *counters, queues);
                self.away.synced(parts, (&s, reply), (started, now), queued);
                continue;
            }
            let p = s.op.params;
            let Some(v) = self.views.get_mut(&s.op.key) else {
                continue;
            };
            if s.at != v.sending_at {
                // A late window's hits: counted, nothing to read back.
                continue;
            }
            // Fixed windows counted into the window of `at`; buckets took tokens at the start.
            let when = match p.algorithm {
                Algorithm::TokenBucket { .. } => started,
                _ => s.at,
            };
            // A give-back answers the state after it; an add, the state before.
            let total = if s.refund {
                reply.before
            } else {
                reply.before.add(&p, when, v.sending.unsigned_abs())
            };
            v.sending = 0;
            v.read_at = started;
            let local = Views::pending(v, now) - queued(&s.op.key);
            let state = with_hits(total, &p, now, local);
            counters.put(&s.op.key, state, &p, now, queues);
        }
    }

    /// An exact round trip decided local-first ops (keys without a fresh view): each key's view
    /// becomes the store's count, with this message's hits if it was admitted (`counted`).
    pub(crate) fn viewed(
        &mut self,
        (counters, queues): (&mut Counters, &Queues),
        (ops, replies): (&[Op], &[StoreReply]),
        counted: &[usize],
        (started, now): (u64, u64),
        queued: impl Fn(&Key) -> i64,
    ) {
        for (i, (op, reply)) in ops.iter().zip(replies).enumerate() {
            if !self.applies(op) {
                continue;
            }
            let refunds = queued(&op.key);
            let Some(v) = self.view(op, started) else {
                continue;
            };
            v.read_at = started;
            let mut state = reply.before;
            if counted.contains(&i) {
                state = state.add(&op.params, started, op.hits);
            }
            let state = with_hits(state, &op.params, now, Views::pending(v, now) - refunds);
            counters.put(&op.key, state, &op.params, now, queues);
        }
    }
}

/// Hits counted in the store are being given back there: the views of local-first keys that
/// hold them give them back too (their counters' state; nothing to sync).
pub(crate) fn refund_views(
    views: &Views,
    counters: &mut Counters,
    (ops, done): (&[Op], &[usize]),
    now: u64,
) {
    for &i in done {
        let op = &ops[i];
        if views.applies(op) && views.views.contains_key(&op.key) {
            counters.refund(&op.key, &op.params, now, op.hits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::key::KeyRef;
    use crate::limiter::op::test_op;

    fn op(key: &str, algorithm: Algorithm, local_first: Option<bool>) -> Op {
        Op {
            local_first,
            reserve: crate::limiter::Reservation::None,
            ..test_op(key, algorithm, 10, 1000)
        }
    }

    const SEC: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn views(default_on: bool, cap: usize) -> Views {
        let stats = Arc::new(ShardStats::default());
        Views::new(default_on, (100 * MS, SEC), cap, stats)
    }

    #[test]
    fn only_local_first_fixed_windows_and_buckets_apply() {
        let s = views(true, 100);
        assert!(s.applies(&op("a", Algorithm::FixedWindow, None)));
        assert!(s.applies(&op("a", Algorithm::TokenBucket { burst: 3 }, None)));
        assert!(!s.applies(&op("a", Algorithm::SlidingWindow, None)));
        assert!(!s.applies(&op("a", Algorithm::FixedWindow, Some(false))));
        let s = views(false, 100);
        assert!(!s.applies(&op("a", Algorithm::FixedWindow, None)));
        assert!(s.applies(&op("a", Algorithm::FixedWindow, Some(true))));
    }

    #[test]
    fn a_key_without_a_fresh_view_goes_exact_unless_the_store_is_away() {
        let mut s = views(true, 100);
        let a = op("a", Algorithm::FixedWindow, None);
        assert!(!s.local(std::slice::from_ref(&a), 10 * SEC, true));
        assert!(s.local(std::slice::from_ref(&a), 10 * SEC, false));
        s.record(&a, 1, 10 * SEC);
        s.views.get_mut(&KeyRef::of("a")).unwrap().read_at = 10 * SEC;
        assert!(s.local(std::slice::from_ref(&a), 10 * SEC + 150 * MS, true));
        assert!(!s.local(std::slice::from_ref(&a), 10 * SEC + 151 * MS, true));
    }

    #[test]
    fn a_sync_sends_local_hits_and_refreshes_used_keys() {
        let mut s = views(true, 100);
        let a = op("a", Algorithm::FixedWindow, None);
        let t = 10 * SEC;
        s.record(&a, 1, t);
        s.record(&a, 1, t + MS);
        s.record(&a, -1, t + 2 * MS);
        let due = s.take_due(t + 3 * MS, true);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].op.hits, due[0].at), (1, t));
        // Not due again before the interval; an unused key is forgotten at the next sync.
        assert!(s.take_due(t + 50 * MS, true).is_empty());
        s.views.get_mut(&KeyRef::of("a")).unwrap().sending = 0;
        assert!(s.take_due(t + 103 * MS, true).is_empty());
        assert!(s.views.is_empty());
    }

    #[test]
    fn hits_of_an_ended_window_go_on_their_own_and_are_dropped_if_the_sync_fails_late() {
        let mut s = views(true, 100);
        let a = op("a", Algorithm::FixedWindow, None);
        let t = 10 * SEC + 950 * MS;
        s.record(&a, 2, t);
        s.record(&a, 1, t + 100 * MS);
        let due = s.take_due(t + 110 * MS, true);
        let mut sent: Vec<(u64, u64)> = due.iter().map(|d| (d.op.hits, d.at)).collect();
        sent.sort();
        assert_eq!(sent, vec![(1, t + 100 * MS), (2, t)]);
        // The store was away: the current window's hit waits, the ended window's is dropped.
        s.failed(due, t + 120 * MS, false);
        assert!(s.late.is_empty());
        assert_eq!(s.views[&KeyRef::of("a")].delta, 1);
        assert_eq!(s.stats.read().local_first_dropped_hits, 2);
    }

    #[test]
    fn a_sync_that_failed_goes_again_unless_it_was_abandoned_at_the_deadline() {
        let a = op("a", Algorithm::FixedWindow, None);
        let t = 10 * SEC;
        for (landed, again) in [(false, Some(3)), (true, None)] {
            let mut s = views(true, 100);
            s.record(&a, 3, t);
            let due = s.take_due(t + MS, true);
            s.failed(due, t + 2 * MS, landed);
            let next: Vec<u64> = s
                .take_due(t + 150 * MS, true)
                .iter()
                .map(|d| d.op.hits)
                .collect();
            assert_eq!(next, Vec::from_iter(again), "landed {landed}");
        }
    }

    #[test]
    fn views_are_bounded_and_hits_without_one_are_counted_as_dropped() {
        let mut s = views(true, 16);
        for i in 0..1000 {
            s.record(&op(&format!("k{i}"), Algorithm::FixedWindow, None), 1, SEC);
        }
        assert_eq!(s.views.len(), 16);
        assert_eq!(s.stats.read().local_first_dropped_hits, 984);
    }
}
