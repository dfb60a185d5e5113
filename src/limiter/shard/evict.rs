//! The key cap: expired keys swept, a key flood evicted, and keys over their limit protected.

use std::sync::atomic::Ordering;

use super::table::to_secs_ceil;
use super::Shard;
use crate::limiter::algorithm::{Params, State};
use crate::limiter::key::{Key, KeyRef};
use crate::limiter::op::{Op, Outcome};

impl Shard {
    /// Drops keys whose state no longer matters, so memory follows the active keys.
    pub(super) fn sweep(&mut self, now: u64) {
        self.drop_expired(now);
        self.refused.retain(|_, until| *until > now);
        self.grants
            .retain(|_, g| g.window >= now / g.params.window_ns());
        let table = &self.table;
        self.denied
            .retain(|k, _| table.find(k.as_str(), k.hash()).is_some());
        self.stats
            .keys
            .store(self.table.len() as u64, Ordering::Relaxed);
        self.next_sweep = now + self.sweep_every;
    }

    /// Remembers keys refused for being over their limit, until their window ends. Keys that no
    /// state could ever admit (`requests_per_unit: 0`, hits above the limit) need no memory.
    pub(super) fn protect(&mut self, ops: &[Op], outcomes: &[Outcome], now: u64) {
        for (op, o) in ops.iter().zip(outcomes) {
            if o.over
                && !o.blocked
                && o.retry_ns != u64::MAX
                && self.refused.len() < self.max_keys / 10
            {
                self.refused
                    .insert(op.key.hash(), now.saturating_add(o.reset_ns));
            }
        }
    }

    /// Key flood defence, run when the shard holds `max_keys` and a new key arrives. Expired keys
    /// go first; if that frees less than a tenth of the cap, the keys whose state expires soonest
    /// are evicted until a tenth is free. Never evicted: keys with waiters, and keys refused in
    /// their current window (so no one over the limit is forgotten early). Evicting a key that
    /// is under its limit restarts its count, so it may admit up to its limit again in that
    /// window: a bounded error, counted in `evictions`. Runs once per tenth of the cap of new
    /// keys, so its cost per key is constant.
    pub(super) fn make_room(&mut self, now: u64) {
        self.drop_expired(now);
        self.refused.retain(|_, until| *until > now);
        let target = self.max_keys - self.max_keys / 10;
        if self.table.len() > target {
            let (refused, queues) = (&self.refused, &self.queues);
            let mut candidates: Vec<(u32, u64)> = self
                .table
                .iter()
                .map(|(k, e)| (e.expires_s, KeyRef::of(k)))
                .filter(|(_, k)| !queues.contains_key(k) && !refused.contains_key(&k.hash))
                .map(|(expires_s, k)| (expires_s, k.hash))
                .collect();
            let n = (self.table.len() - target).min(candidates.len());
            if n > 0 {
                candidates.select_nth_unstable(n - 1);
                let victims: fnv::FnvHashSet<u64> = candidates[..n].iter().map(|c| c.1).collect();
                let queues = &self.queues;
                self.table.retain(|k, _| {
                    let k = KeyRef::of(k);
                    !victims.contains(&k.hash) || queues.contains_key(&k)
                });
                self.stats.evictions.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        self.stats
            .keys
            .store(self.table.len() as u64, Ordering::Relaxed);
    }

    /// Drops the entries whose state has expired, except those of keys with waiters.
    pub(super) fn drop_expired(&mut self, now: u64) {
        let now_s = now / 1_000_000_000;
        let queues = &self.queues;
        self.table.retain(|k, e| {
            u64::from(e.expires_s) > now_s
                || (!queues.is_empty() && queues.contains_key(&KeyRef::of(k)))
        });
    }

    /// The position of `key`'s entry, made (fresh) if it has none; at the key cap, room is made
    /// first. `None` only if no room can be made (every key has waiters or was refused).
    pub(super) fn slot(&mut self, key: &Key, params: Params, now: u64) -> Option<usize> {
        let (hash, key) = (key.hash(), key.as_str());
        if let Some(at) = self.table.find(key, hash) {
            return Some(at);
        }
        if self.table.len() >= self.max_keys {
            self.make_room(now);
        }
        let state = State::fresh(&params, now);
        let expires = to_secs_ceil(state.expires_at(&params, now));
        let at = match self.table.insert(key, hash, state, expires) {
            Some(at) => at,
            None => {
                // The key arena is full (4 GiB): evict, as at the key cap, and try again.
                self.make_room(now);
                self.table.insert(key, hash, state, expires)?
            }
        };
        self.stats.keys.fetch_add(1, Ordering::Relaxed);
        Some(at)
    }
}
