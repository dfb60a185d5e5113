//! Reservations held in this shard's memory (`reserve`): per key, how many checks hold hits for
//! their requests, until a report of the request's usage releases one or `reserve_for` passes;
//! and Limitador's named holds (`Reserve`), each of its own hits under its id, until a `Commit`
//! of that id ends it or its time passes.
//! A store shared by replicas keeps its own (the shard asks it); these are memory's, a
//! local-first replica's, and those made while the store is away.

use std::collections::VecDeque;
use std::sync::Arc;

use super::stats::ShardStats;
use crate::config::Algorithm;
use crate::limiter::algorithm::Params;
use crate::limiter::key::{Key, KeyMap};

const NS_PER_MS: u64 = 1_000_000;

/// Holds made within this share of `reserve_for` of each other expire together (with the
/// oldest of them), so a key keeps at most this many groups however many checks it holds.
const GROUPS: u64 = 64;

/// The holds of every key with one.
pub(super) struct Holds {
    keys: KeyMap<Held>,
    /// Keys that may hold reservations at once; past it, a check is admitted without holding.
    max_keys: usize,
    stats: Arc<ShardStats>,
}

/// A named hold (Limitador's `Reserve`): its id, its hits, and when it ends (ns).
#[derive(Debug, Clone, Copy)]
pub(super) struct NamedHold {
    pub(super) id: u64,
    pub(super) hits: u32,
    pub(super) until: u64,
}

/// Counted holds (YAML's `reserve`) made close in time: how many, and when they end (ns).
#[derive(Debug, Clone, Copy)]
struct HoldGroup {
    until: u64,
    count: u32,
}

/// One key's holds: counted ones in groups, oldest first; named ones, in the order made.
#[derive(Debug, Default)]
struct Held {
    /// Fixed windows: the window the holds were made in (a new window starts with none held,
    /// as the store's per-window ledger does).
    window: Option<u64>,
    groups: VecDeque<HoldGroup>,
    /// Limitador's holds. Few at a time per counter (one per request in flight), so a list.
    named: Vec<NamedHold>,
}

impl Held {
    fn count(&self) -> u64 {
        self.groups.iter().map(|g| u64::from(g.count)).sum()
    }

    fn named_hits(&self) -> u64 {
        self.named.iter().map(|h| u64::from(h.hits)).sum()
    }

    fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.named.is_empty()
    }

    /// Drops the holds expired at `now`, and those of an ended fixed window; how many expired.
    fn prune(&mut self, window: Option<u64>, now: u64) -> u64 {
        if self.window != window {
            self.groups.clear();
            self.named.clear();
            self.window = window;
            return 0;
        }
        let before = self.named.len();
        self.named.retain(|h| h.until > now);
        let mut expired = (before - self.named.len()) as u64;
        while let Some(&g) = self.groups.front() {
            if g.until > now {
                break;
            }
            expired += u64::from(g.count);
            self.groups.pop_front();
        }
        expired
    }
}

/// The fixed window holding `now`, for a fixed-window limit.
fn window_of(p: &Params, now: u64) -> Option<u64> {
    (p.algorithm == Algorithm::FixedWindow).then(|| p.span(now).idx)
}

impl Holds {
    pub(super) fn new(max_keys: usize, stats: Arc<ShardStats>) -> Holds {
        Holds {
            keys: KeyMap::default(),
            max_keys: max_keys.max(16),
            stats,
        }
    }

    /// How many reservations `key` holds at `now` (expired ones released first).
    pub(super) fn held(&mut self, key: &Key, p: &Params, now: u64) -> u64 {
        let Some(h) = self.keys.get_mut(key) else {
            return 0;
        };
        let expired = h.prune(window_of(p, now), now);
        self.stats.holds_expired(expired);
        h.count()
    }

    /// The hits `key`'s named holds hold at `now` (expired ones released first).
    pub(super) fn named(&mut self, key: &Key, p: &Params, now: u64) -> u64 {
        let Some(h) = self.keys.get_mut(key) else {
            return 0;
        };
        let expired = h.prune(window_of(p, now), now);
        self.stats.holds_expired(expired);
        h.named_hits()
    }

    /// Whether `key` holds the named hold `id` at `now`, and its hits.
    pub(super) fn named_hold(&self, key: &Key, id: u64, now: u64) -> Option<u32> {
        let h = self.keys.get(key)?;
        (h.named.iter())
            .find(|h| h.id == id && h.until > now)
            .map(|h| h.hits)
    }

    /// A named hold (Limitador's `Reserve`): `named.hits` on `key` until `named.until`, under
    /// `named.id`.
    pub(super) fn hold_named(&mut self, key: &Key, p: &Params, now: u64, named: NamedHold) {
        let Some(h) = self.held_for(key, p, now) else {
            return;
        };
        h.named.push(named);
        self.stats.holds_made(1);
    }

    /// `key`'s holds, pruned at `now`, made when there is room for one more key: `None` when
    /// `max_keys` keys hold already (a check is then admitted without holding).
    fn held_for(&mut self, key: &Key, p: &Params, now: u64) -> Option<&mut Held> {
        if !self.keys.contains_key(key) && self.keys.len() >= self.max_keys {
            self.sweep(now);
            if self.keys.len() >= self.max_keys {
                return None;
            }
        }
        let window = window_of(p, now);
        let h = self.keys.entry(key.clone()).or_default();
        let expired = h.prune(window, now);
        self.stats.holds_expired(expired);
        Some(h)
    }

    /// Ends the named hold `id` of `key`: a `Commit` (`reported`) or its request refused after
    /// all. Whether the key held it.
    pub(super) fn end_named(
        &mut self,
        key: &Key,
        p: &Params,
        now: u64,
        id: u64,
        reported: bool,
    ) -> bool {
        let Some(h) = self.keys.get_mut(key) else {
            return false;
        };
        let expired = h.prune(window_of(p, now), now);
        self.stats.holds_expired(expired);
        let found = h.named.iter().position(|h| h.id == id);
        if let Some(at) = found {
            h.named.swap_remove(at);
            if reported {
                self.stats.holds_reported(1);
            } else {
                self.stats.holds_withdrawn(1);
            }
        }
        if h.is_empty() {
            self.keys.remove(key);
        }
        found.is_some()
    }

    /// How many reservations `key` holds, for a look-up (nothing released).
    pub(super) fn peek(&self, key: &Key, p: &Params, now: u64) -> u64 {
        self.keys.get(key).map_or(0, |h| {
            if h.window != window_of(p, now) {
                return 0;
            }
            (h.groups.iter())
                .filter(|g| g.until > now)
                .map(|g| u64::from(g.count))
                .sum()
        })
    }

    /// One more reservation on `key`, held `for_ms` from `now`.
    pub(super) fn hold(&mut self, key: &Key, p: &Params, now: u64, for_ms: u32) {
        let Some(h) = self.held_for(key, p, now) else {
            return;
        };
        let for_ns = u64::from(for_ms) * NS_PER_MS;
        let until = now.saturating_add(for_ns);
        match h.groups.back_mut() {
            Some(last) if until - last.until.min(until) < (for_ns / GROUPS).max(1) => {
                last.count += 1
            }
            _ => h.groups.push_back(HoldGroup { until, count: 1 }),
        }
        self.stats.holds_made(1);
    }

    /// A report of `key`'s usage: releases its oldest reservation, if it holds one.
    pub(super) fn release(&mut self, key: &Key, p: &Params, now: u64) {
        if self.take(key, p, now, true) {
            self.stats.holds_reported(1);
        }
    }

    /// Takes back the newest reservation of `key`: its request was refused after all.
    pub(super) fn withdraw(&mut self, key: &Key, p: &Params, now: u64) {
        if self.take(key, p, now, false) {
            self.stats.holds_withdrawn(1);
        }
    }

    fn take(&mut self, key: &Key, p: &Params, now: u64, oldest: bool) -> bool {
        let Some(h) = self.keys.get_mut(key) else {
            return false;
        };
        let expired = h.prune(window_of(p, now), now);
        self.stats.holds_expired(expired);
        let group = if oldest {
            h.groups.front_mut()
        } else {
            h.groups.back_mut()
        };
        let Some(g) = group else {
            if h.is_empty() {
                self.keys.remove(key);
            }
            return false;
        };
        g.count -= 1;
        if g.count == 0 {
            if oldest {
                h.groups.pop_front();
            } else {
                h.groups.pop_back();
            }
        }
        if h.is_empty() {
            self.keys.remove(key);
        }
        true
    }

    /// Forgets `key`'s reservations (a reset).
    pub(super) fn forget(&mut self, key: &Key) {
        self.keys.remove(key);
    }

    /// Releases every reservation expired at `now`, and forgets keys holding none.
    pub(super) fn sweep(&mut self, now: u64) {
        let mut expired = 0;
        self.keys.retain(|_, h| {
            // The window is the key's own: an ended fixed window is dropped when next read.
            expired += h.prune(h.window, now);
            !h.is_empty()
        });
        self.stats.holds_expired(expired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::test_op;

    const SEC: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    fn named(id: u64, hits: u32, until: u64) -> NamedHold {
        NamedHold { id, hits, until }
    }

    fn holds() -> (Holds, Arc<ShardStats>) {
        let stats = Arc::new(ShardStats::default());
        (Holds::new(100, stats.clone()), stats)
    }

    #[test]
    fn a_report_releases_the_oldest_and_time_releases_the_rest() {
        let (mut h, stats) = holds();
        let op = test_op("k", Algorithm::SlidingWindow, 1000, 86_400_000);
        h.hold(&op.key, &op.params, T0, 10_000);
        h.hold(&op.key, &op.params, T0 + 5 * SEC, 10_000);
        assert_eq!(h.held(&op.key, &op.params, T0 + 6 * SEC), 2);
        h.release(&op.key, &op.params, T0 + 6 * SEC);
        assert_eq!(h.held(&op.key, &op.params, T0 + 6 * SEC), 1);
        // The one left was made at 5 s and held 10 s: gone at 15 s, as expired.
        assert_eq!(h.held(&op.key, &op.params, T0 + 14 * SEC), 1);
        assert_eq!(h.held(&op.key, &op.params, T0 + 15 * SEC), 0);
        let c = stats.read();
        assert_eq!((c.holds_made, c.holds_reported, c.holds_expired), (2, 1, 1));
        // A report with nothing held releases nothing.
        h.release(&op.key, &op.params, T0 + 16 * SEC);
        assert_eq!(stats.read().holds_reported, 1);
    }

    #[test]
    fn holds_close_in_time_share_a_group_and_a_key_keeps_few() {
        let (mut h, _) = holds();
        let op = test_op("k", Algorithm::TokenBucket { burst: 10 }, 10, 1000);
        for i in 0..10_000 {
            h.hold(&op.key, &op.params, T0 + i * SEC / 100, 600_000);
        }
        assert_eq!(h.held(&op.key, &op.params, T0 + 100 * SEC), 10_000);
        assert!(h.keys[&op.key].groups.len() <= 2 * GROUPS as usize);
    }

    #[test]
    fn a_fixed_window_starts_with_nothing_held() {
        let (mut h, stats) = holds();
        let op = test_op("k", Algorithm::FixedWindow, 10, 60_000);
        let start = T0 / (60 * SEC) * (60 * SEC);
        h.hold(&op.key, &op.params, start + 50 * SEC, 600_000);
        assert_eq!(h.held(&op.key, &op.params, start + 59 * SEC), 1);
        assert_eq!(h.held(&op.key, &op.params, start + 61 * SEC), 0);
        assert_eq!(stats.read().holds_expired, 0);
    }

    #[test]
    fn keys_past_the_cap_hold_nothing_until_room_is_made() {
        let (mut h, stats) = holds();
        let p = test_op("k", Algorithm::SlidingWindow, 10, 60_000).params;
        for i in 0..200 {
            h.hold(&Key::new(format!("k{i}")), &p, T0, 1000);
        }
        assert_eq!(h.keys.len(), 100);
        assert_eq!(stats.read().holds_made, 100);
        // Once the first ones expired, a new key gets room.
        h.hold(&Key::new("late"), &p, T0 + 2 * SEC, 1000);
        assert_eq!(h.peek(&Key::new("late"), &p, T0 + 2 * SEC), 1);
        assert_eq!(stats.read().holds_expired, 100);
    }

    #[test]
    fn a_named_hold_ends_by_its_id_and_its_time_not_by_age() {
        let (mut h, stats) = holds();
        let op = test_op("k", Algorithm::FromFirstHit, 1000, 60_000);
        let (k, p) = (&op.key, &op.params);
        h.hold_named(k, p, T0, named(1, 300, T0 + 10 * SEC));
        h.hold_named(k, p, T0, named(2, 200, T0 + 5 * SEC));
        h.hold_named(k, p, T0, named(3, 100, T0 + 20 * SEC));
        assert_eq!(h.named(k, p, T0), 600);
        // The second ends by its id, the oldest stays.
        assert!(h.end_named(k, p, T0 + SEC, 2, true));
        assert!(!h.end_named(k, p, T0 + SEC, 2, true), "ended once");
        assert_eq!(h.named_hold(k, 1, T0 + SEC), Some(300));
        assert_eq!(h.named(k, p, T0 + SEC), 400);
        // Each expires at its own time.
        assert_eq!(h.named(k, p, T0 + 10 * SEC), 100);
        assert_eq!(h.named_hold(k, 1, T0 + 10 * SEC), None);
        assert!(h.end_named(k, p, T0 + 11 * SEC, 3, false));
        assert!(h.keys.is_empty(), "a key holding nothing is forgotten");
        let c = stats.read();
        let counts = (
            c.holds_made,
            c.holds_reported,
            c.holds_expired,
            c.holds_withdrawn,
        );
        assert_eq!(counts, (3, 1, 1, 1));
    }
}
