//! The shard's counters: the key table with its cap (expired keys swept, a key flood evicted,
//! keys over their limit protected), the direct API's grants and its refusals per key.

use std::sync::Arc;

use super::queues::Queues;
use super::stats::ShardStats;
use super::table::{to_secs_ceil, Table};
use crate::limiter::algorithm::{Params, State};
use crate::limiter::key::{Key, KeyMap, KeyRef};
use crate::limiter::op::{Op, Outcome};
use crate::limiter::saved::Saved;
use crate::limiter::store::{Denied, KeyInfo};

const NS_PER_SEC: u64 = 1_000_000_000;

pub(crate) struct Counters {
    table: Table,
    /// Keys this shard may hold; past it, keys are evicted (see `make_room`).
    max_keys: usize,
    /// Keys refused in their current window (by hash, until the window ends): never evicted, so
    /// an attacker flooding new keys cannot make the shard forget who is over the limit.
    refused: fnv::FnvHashMap<u64, u64>,
    grants: fnv::FnvHashMap<u64, Grant>,
    /// Direct API refusals per key in the current window.
    denied: KeyMap<Denied>,
    next_sweep: u64,
    stats: Arc<ShardStats>,
    /// Keys evicted before they expired since the durable counters last asked, once they have
    /// asked (until then nothing needs to know); `saving.rs` takes them.
    evicted: Option<Saved>,
    /// More keys were evicted since then than the shard may hold: the list is not whole.
    evicted_too_many: bool,
}

/// Grants remembered per shard; past this, admitted hits cannot be released (the window
/// still ends, so nothing is lost but the early release).
const MAX_GRANTS: usize = 100_000;

/// A hit admitted through the direct API, so `DELETE /rate/{key}/{id}` can give it back.
struct Grant {
    key: Key,
    window: u64,
    params: Params,
}

impl Counters {
    pub(super) fn new(max_keys: usize, now: u64, stats: Arc<ShardStats>) -> Counters {
        Counters {
            table: Table::default(),
            max_keys: max_keys.max(16),
            refused: Default::default(),
            grants: Default::default(),
            denied: Default::default(),
            next_sweep: now + NS_PER_SEC,
            stats,
            evicted: None,
            evicted_too_many: false,
        }
    }

    /// The position of `key`'s entry, if it has one.
    #[inline]
    pub(super) fn find(&self, key: &Key) -> Option<usize> {
        self.table.find(key.as_str(), key.hash())
    }

    /// The state at `at` (a position from `find` or `slot`).
    #[inline]
    pub(super) fn state(&self, at: usize) -> State {
        self.table.get(at).state
    }

    /// The state of `key` if it has one that `params` can use.
    pub(super) fn state_of(&self, key: &Key, params: &Params) -> Option<State> {
        (self.find(key))
            .map(|at| self.state(at))
            .filter(|s| s.fits(params))
    }

    /// Stores `state` at `at`, to expire as `params` say.
    #[inline]
    pub(super) fn set(&mut self, at: usize, state: State, params: &Params, now: u64) {
        let e = self.table.get_mut(at);
        e.state = state;
        e.expires_s = to_secs_ceil(state.expires_at(params, now));
    }

    /// Stores `state` for `key`, making its entry if need be (and if room can be made).
    pub(super) fn put(&mut self, key: &Key, state: State, params: &Params, now: u64, q: &Queues) {
        if let Some(at) = self.slot(key, *params, now, q) {
            self.set(at, state, params, now);
        }
    }

    /// Gives `hits` back to `key`, if it has a state `params` can use; whether it has an entry.
    pub(super) fn refund(&mut self, key: &Key, params: &Params, now: u64, hits: u64) -> bool {
        let Some(at) = self.find(key) else {
            return false;
        };
        let e = self.table.get_mut(at);
        if e.state.fits(params) {
            e.state.refund(params, now, hits);
        }
        true
    }

    /// When the next sweep is due.
    pub(super) fn next_sweep(&self) -> u64 {
        self.next_sweep
    }

    /// Drops keys whose state no longer matters, so memory follows the active keys.
    pub(super) fn sweep(&mut self, now: u64, q: &Queues) {
        self.drop_expired(now, q);
        self.refused.retain(|_, until| *until > now);
        self.grants
            .retain(|_, g| g.window >= g.params.span(now).idx);
        let table = &self.table;
        self.denied
            .retain(|k, _| table.find(k.as_str(), k.hash()).is_some());
        self.stats.set_keys(self.table.len());
        self.next_sweep = now + NS_PER_SEC;
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
    fn make_room(&mut self, now: u64, q: &Queues) {
        self.drop_expired(now, q);
        self.refused.retain(|_, until| *until > now);
        let target = self.max_keys - self.max_keys / 10;
        if self.table.len() > target {
            let refused = &self.refused;
            let mut candidates: Vec<(u32, u64)> = self
                .table
                .iter()
                .map(|(k, e)| (e.expires_s, KeyRef::of(k)))
                .filter(|(_, k)| !q.has(k) && !refused.contains_key(&k.hash))
                .map(|(expires_s, k)| (expires_s, k.hash))
                .collect();
            let n = (self.table.len() - target).min(candidates.len());
            if n > 0 {
                candidates.select_nth_unstable(n - 1);
                let victims: fnv::FnvHashSet<u64> = candidates[..n].iter().map(|c| c.1).collect();
                let (evicted, too_many) = (&mut self.evicted, &mut self.evicted_too_many);
                let cap = self.max_keys;
                self.table.retain(|text, _| {
                    let k = KeyRef::of(text);
                    let keep = !victims.contains(&k.hash) || q.has(&k);
                    match evicted.as_mut() {
                        Some(d) if !keep && d.len() < cap => d.push(text, None, 0),
                        Some(_) if !keep => *too_many = true,
                        _ => {}
                    }
                    keep
                });
                self.stats.evicted(n);
            }
        }
        self.stats.set_keys(self.table.len());
    }

    /// Drops the entries whose state has expired, except those of keys with waiters.
    fn drop_expired(&mut self, now: u64, q: &Queues) {
        let now_s = now / NS_PER_SEC;
        self.table.retain(|k, e| {
            u64::from(e.expires_s) > now_s || (!q.is_empty() && q.has(&KeyRef::of(k)))
        });
    }

    /// The position of `key`'s entry, made (fresh) if it has none; at the key cap, room is made
    /// first. `None` only if no room can be made (every key has waiters or was refused).
    pub(super) fn slot(
        &mut self,
        key: &Key,
        params: Params,
        now: u64,
        q: &Queues,
    ) -> Option<usize> {
        let (hash, key) = (key.hash(), key.as_str());
        if let Some(at) = self.table.find(key, hash) {
            return Some(at);
        }
        if self.table.len() >= self.max_keys {
            self.make_room(now, q);
        }
        let state = State::fresh(&params, now);
        let expires = to_secs_ceil(state.expires_at(&params, now));
        let at = match self.table.insert(key, hash, state, expires) {
            Some(at) => at,
            None => {
                // The key arena is full (4 GiB): evict, as at the key cap, and try again.
                self.make_room(now, q);
                self.table.insert(key, hash, state, expires)?
            }
        };
        self.stats.key_added();
        Some(at)
    }

    /// The keys evicted before they expired since the last call (`None` before the first),
    /// and whether there were more than the shard may list; from now on they are kept.
    pub(super) fn take_evicted(&mut self) -> (Option<Saved>, bool) {
        let too_many = std::mem::take(&mut self.evicted_too_many);
        (self.evicted.replace(Saved::default()), too_many)
    }

    /// The key table, for a save to walk (`saving.rs`).
    pub(super) fn table_mut(&mut self) -> &mut Table {
        &mut self.table
    }

    /// Stores `state` for `key` as it is, to expire at `expires_s`, making its entry if need be
    /// (and if room can be made).
    pub(super) fn place(&mut self, key: &Key, state: State, expires_s: u32, now: u64, q: &Queues) {
        if let Some(at) = self.find(key) {
            let e = self.table.get_mut(at);
            e.state = state;
            e.expires_s = expires_s;
            return;
        }
        if self.table.len() >= self.max_keys {
            self.make_room(now, q);
        }
        if self
            .table
            .insert(key.as_str(), key.hash(), state, expires_s)
            .is_some()
        {
            self.stats.key_added();
        }
    }

    /// Drops `key`'s entry (read back as evicted).
    pub(super) fn forget(&mut self, key: &Key) {
        if self.table.forget(key.as_str(), key.hash()) {
            self.stats.key_removed();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Admin reset: the key's state set fresh (so its next decision starts from zero), its
    /// protection from eviction and its direct-API refusals forgotten.
    pub(super) fn reset(&mut self, key: &Key, params: &Params, now: u64) {
        if let Some(at) = self.find(key) {
            self.set(at, State::fresh(params, now), params, now);
        }
        self.refused.remove(&key.hash());
        self.denied.remove(key);
    }

    /// Remembers the hit `op` admitted as grant `id`.
    pub(super) fn remember_grant(&mut self, id: u64, op: &Op, now: u64) {
        if self.grants.len() < MAX_GRANTS {
            self.grants.insert(
                id,
                Grant {
                    key: op.key.clone(),
                    window: op.params.span(now).idx,
                    params: op.params,
                },
            );
        }
    }

    /// Takes back grant `id` on `key` if it is still in its window: the limit its hit counted
    /// under, to give the hit back with.
    pub(super) fn take_grant(&mut self, key: &Key, id: u64, now: u64) -> Option<Params> {
        let found = match self.grants.get(&id) {
            Some(g) if g.key == *key => g.window == g.params.span(now).idx,
            _ => false,
        };
        self.grants.remove(&id).filter(|_| found).map(|g| g.params)
    }

    /// Counts direct API refusals, for `/debug`.
    pub(super) fn count_denied(&mut self, ops: &[Op], now: u64) {
        for op in ops.iter().filter(|o| o.grant.is_some()) {
            let window = op.params.span(now).idx;
            let e = (self.denied.entry_ref(&op.key)).or_insert(Denied { window, count: 0 });
            if e.window != window {
                *e = Denied { window, count: 0 };
            }
            e.count += 1;
        }
    }

    /// Every key (or those starting with `prefix`) with its state, sorted by key.
    pub(super) fn inspect(&self, prefix: Option<&str>, q: &Queues, now: u64) -> Vec<KeyInfo> {
        let mut out: Vec<KeyInfo> = self
            .table
            .iter()
            .filter(|(k, _)| prefix.is_none_or(|p| k.starts_with(p)))
            .map(|(k, e)| {
                let key = KeyRef::of(k);
                KeyInfo {
                    key: k.to_string(),
                    state: e.state,
                    denied: self.denied.get(&key).copied().unwrap_or_default(),
                    waiting: q.len_of(&key),
                    now,
                }
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}
