//! The ledger: hits decided here that the store has not counted yet, per key, and how they go
//! to it. A link keeps one ledger per way a hit comes to be decided here (`Mode`):
//!
//! - **Local-first** (`Mode::LocalFirst`): local-first limits are decided from memory and meet
//!   the store in the background. Per key the entry is the hits admitted here since the last
//!   sync; the store's count as last read is in the shard's table. Every `sync_interval` one
//!   pipeline adds each key's hits to the store unconditionally and reads back the total, which
//!   becomes the key's state (plus whatever was admitted here while the round trip was out).
//!   A message is decided locally only when every op is local-first and its key was read
//!   within 1.5 intervals; a key seen for the first time, or idle for a while, goes the exact
//!   way once (one round trip through the store), which also reads it. So every local decision
//!   rests on a count at most 1.5 T old, and what this replica cannot see is only what the
//!   other replicas admitted in the last 2.5 T: with R replicas, a window admits at most the
//!   limit plus what R − 1 replicas admit in 2.5 T, and never more than R × the limit. While
//!   the store cannot be reached, decisions stay local on the last count read and the hits
//!   wait for the store to come back; a fixed window's hits whose window ended before its sync
//!   went out are sent on their own (`late`).
//! - **Fallback** (`Mode::Fallback`): exact limits' hits decided from memory while the store
//!   is away (the failure mode `fallback`, or a queue head decided here while the breaker is
//!   open) are sent once it answers again, so an outage costs no usage: a *replay*, in a round
//!   trip the breaker lets through (closed, or its cooldown over: then the replay is the
//!   half-open probe), one replay a key at a time. Only what still weighs on a decision now is
//!   replayed: a window's hits while it lasts, a token bucket's tokens not refilled since. A
//!   replay that fails goes again after the breaker's cooldown. Hits of a batch that was sent
//!   and abandoned at its deadline, then decided from memory, are not kept (`keep`): the store
//!   may count that batch itself.
//!
//! Both modes send hits counted whatever the limit says (`StoreOp::sync_at`). A round trip
//! abandoned at its deadline was written, and the store counts it if it ever reads it (a
//! stalled Redis does, on waking): it is not sent again, so no hit is counted twice. Each
//! ledger holds at most `cap` keys (the shard's share of `TURNSTILE_MAX_KEYS`), idle ones
//! forgotten first; hits that find no room, or whose window ended before they could go, are
//! dropped and counted (`LinkStats`).

use std::sync::Arc;

use super::round_trip::TripTimes;
use super::stats::LinkStats;
use super::sync::{with_hits, Mode, SyncOp};
use crate::config::Algorithm;
use crate::limiter::algorithm::{Params, State};
use crate::limiter::key::{Key, KeyMap};
use crate::limiter::op::Op;
use crate::limiter::shard::counters::Counters;
use crate::limiter::shard::queues::Queues;
use crate::limiter::store::StoreReply;

#[cfg(test)]
mod tests;

/// The shard's parts a ledger puts a key's state into: its counters, and its queues (a key
/// with waiters is not evicted to make room).
pub(crate) struct ShardKeys<'a> {
    pub(crate) counters: &'a mut Counters,
    pub(crate) queues: &'a Queues,
}

impl ShardKeys<'_> {
    /// The same parts, borrowed again (for one key of many).
    #[inline]
    pub(crate) fn reborrow(&mut self) -> ShardKeys<'_> {
        ShardKeys {
            counters: &mut *self.counters,
            queues: self.queues,
        }
    }

    /// Puts `state` for `key`, as `Counters::put` does.
    #[inline]
    fn put(&mut self, key: &Key, state: State, params: &Params, now: u64) {
        self.counters.put(key, state, params, now, self.queues);
    }
}

/// Counts `hits` of a `mode` ledger that will never reach the store.
fn dropped(mode: Mode, stats: &LinkStats, hits: i64) {
    match mode {
        Mode::LocalFirst => stats.local_first_dropped(hits),
        Mode::Fallback => stats.replay_dropped(hits),
    }
}

/// Of `hits` decided at `at` on `op`'s key, those that still weigh on a decision at `now`:
/// a window's while it lasts; a bucket's all of them for local-first (the sync reads the
/// bucket back), the tokens not refilled since for fallback (refunded ones stand).
fn weigh(mode: Mode, op: &Op, hits: i64, at: u64, now: u64) -> i64 {
    let p = &op.params;
    if !same_window(op, at, now) {
        return 0;
    }
    match p.algorithm {
        Algorithm::TokenBucket { .. }
            if mode == Mode::Fallback && hits > 0 && p.requests_per_unit > 0 =>
        {
            let per = u64::from(p.requests_per_unit);
            let interval = (p.window_ms.max(1) * 1_000_000 / per).max(1);
            let refilled = now.saturating_sub(at) / interval;
            hits.saturating_sub(i64::try_from(refilled).unwrap_or(i64::MAX))
                .max(0)
        }
        _ => hits,
    }
}

/// One key's hits decided here that the store has not counted yet.
struct Uncounted {
    /// The key and its limit (`hits` 0).
    op: Op,
    /// Hits not sent yet (negative: more refunded than taken), decided at `at` (a window's:
    /// any time in it, its first for local-first; a fallback bucket's: the latest).
    delta: i64,
    at: u64,
    /// Hits the round trip in flight carries, decided at `sending_at`.
    sending: i64,
    sending_at: u64,
    /// Local-first: when the store's count in the shard's table was read (its round trip's
    /// start); 0: never.
    read_at: u64,
    /// Local-first: decided on since the last sync went out, so the next sync reads it back.
    used: bool,
}

pub(crate) struct Ledger {
    mode: Mode,
    /// Local-first: whether ops that do not say are local-first.
    default_on: bool,
    entries: KeyMap<Uncounted>,
    cap: usize,
    /// Local-first: the sync interval; fallback: how long a replay that could not go, or
    /// failed, waits before it is tried again (the breaker's cooldown). Clock ns.
    period: u64,
    /// When hits may next go (clock ns).
    next_due: u64,
    /// Local-first: hits of a window that ended before its sync went out, sent with the next.
    late: Vec<SyncOp>,
    /// Fallback: some entry holds hits not sent yet.
    waiting: bool,
    /// Whether decisions made now are recorded: not while a batch the store may count itself
    /// (one abandoned at its deadline) is decided from memory.
    keeping: bool,
    stats: Arc<LinkStats>,
}

/// Whether `a` and `b` fall in one window of `op`'s (token buckets have none, and a window
/// from the first hit is the store's to place).
fn same_window(op: &Op, a: u64, b: u64) -> bool {
    let p = &op.params;
    match p.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => p.span(a).idx == p.span(b).idx,
        Algorithm::TokenBucket { .. } | Algorithm::FromFirstHit => true,
    }
}

impl Ledger {
    /// A ledger of at most `cap` keys whose hits go every `period_ns` (see `period`).
    pub(crate) fn new(mode: Mode, period_ns: u64, cap: usize, stats: Arc<LinkStats>) -> Ledger {
        Ledger {
            mode,
            default_on: false,
            entries: KeyMap::default(),
            cap: cap.max(16),
            period: period_ns.max(1),
            next_due: 0,
            late: Vec::new(),
            waiting: false,
            keeping: true,
            stats,
        }
    }

    /// Whether decisions made from now on are recorded (see `keeping`).
    pub(crate) fn keep(&mut self, on: bool) {
        self.keeping = on;
    }

    /// The entry of `op`'s key, made if it has none and there is room.
    fn entry(&mut self, op: &Op, now: u64) -> Option<&mut Uncounted> {
        if !self.entries.contains_key(&op.key) {
            if self.entries.len() >= self.cap {
                (self.entries).retain(|_, e| e.delta != 0 || e.sending != 0 || e.used);
            }
            if self.entries.len() >= self.cap {
                return None;
            }
            let mut key_op = op.clone();
            key_op.hits = 0;
            let e = Uncounted {
                op: key_op,
                delta: 0,
                at: now,
                sending: 0,
                sending_at: now,
                read_at: 0,
                used: self.mode == Mode::LocalFirst,
            };
            self.entries.insert(op.key.clone(), e);
        }
        self.entries.get_mut(&op.key)
    }

    /// Records hits decided here on `op`'s key (negative: refunded).
    pub(crate) fn record(&mut self, op: &Op, hits: i64, now: u64) {
        if !self.keeping || hits == 0 {
            return;
        }
        let (mode, stats) = (self.mode, self.stats.clone());
        let Some(e) = self.entry(op, now) else {
            return dropped(mode, &stats, hits);
        };
        let mut late = None;
        match mode {
            Mode::LocalFirst => {
                // Syncs count by the limit the latest request carried (an override, a
                // reload), over the same window.
                if e.op.params.window_ms == op.params.window_ms {
                    e.op.params = op.params;
                }
                if e.delta != 0 && !same_window(&e.op, e.at, now) {
                    // A new fixed window: the old one's hits go on their own.
                    late = Some(SyncOp::new(&e.op, e.delta, e.at, mode));
                    e.delta = 0;
                }
                e.used = true;
            }
            Mode::Fallback if e.delta != 0 => {
                // Hits of a window that ended no longer matter; a bucket's refilled tokens
                // neither.
                let kept = weigh(mode, &e.op, e.delta, e.at, now);
                dropped(mode, &stats, e.delta - kept.max(0));
                e.delta = kept;
            }
            Mode::Fallback => {}
        }
        let bucket = matches!(e.op.params.algorithm, Algorithm::TokenBucket { .. });
        if e.delta == 0 || (mode == Mode::Fallback && bucket) {
            e.at = now;
        }
        e.delta = e.delta.saturating_add(hits);
        self.waiting |= e.delta != 0;
        self.late.extend(late);
    }

    /// Hits decided here that the store has not counted yet and still weigh on `op` at `now`:
    /// those of the round trip in flight (it goes after the exact ops of its own) and since.
    pub(crate) fn unsynced(&self, op: &Op, now: u64) -> i64 {
        if self.entries.is_empty() {
            return 0;
        }
        self.entries.get(&op.key).map_or(0, |e| {
            let m = self.mode;
            weigh(m, &e.op, e.sending, e.sending_at, now) + weigh(m, &e.op, e.delta, e.at, now)
        })
    }

    /// A reset: forgets `key`'s entry and the hits waiting to go with it (those of a round
    /// trip already out still land).
    pub(crate) fn forget(&mut self, key: &Key) {
        self.entries.remove(key);
        self.late.retain(|s| &s.op.key != key);
    }

    /// When hits may next go (`u64::MAX`: none waits).
    pub(crate) fn due_at(&self) -> u64 {
        let work = match self.mode {
            Mode::LocalFirst => !self.entries.is_empty() || !self.late.is_empty(),
            Mode::Fallback => self.waiting,
        };
        if work {
            self.next_due
        } else {
            u64::MAX
        }
    }
}

impl Ledger {
    /// The hits to send with a round trip starting at `now`, if they are due. Local-first: every
    /// key used since the last sync, with its hits (0: only read back); keys idle since are
    /// forgotten. Fallback: every key's hits that still weigh, if the breaker lets a round
    /// trip through (`ready`); else they wait a period.
    pub(crate) fn take(&mut self, now: u64, ready: bool, out: &mut Vec<SyncOp>) {
        if self.due_at() == u64::MAX || now < self.next_due {
            return;
        }
        self.next_due = now.saturating_add(self.period);
        let mode = self.mode;
        if mode == Mode::Fallback && !ready {
            return;
        }
        out.append(&mut self.late);
        (self.entries).retain(|_, e| e.used || e.delta != 0 || e.sending != 0);
        let mut waiting = false;
        for e in self.entries.values_mut() {
            if !(e.used || e.delta != 0) {
                continue;
            }
            if mode == Mode::Fallback && e.sending != 0 {
                // One replay a key at a time: these go after it.
                waiting = true;
                continue;
            }
            let (hits, at) = match mode {
                Mode::LocalFirst => (e.delta, if e.delta != 0 { e.at } else { now }),
                Mode::Fallback => {
                    let hits = weigh(mode, &e.op, e.delta, e.at, now);
                    dropped(mode, &self.stats, e.delta - hits.max(0));
                    (hits, e.at)
                }
            };
            e.delta = 0;
            e.used = false;
            if hits != 0 || mode == Mode::LocalFirst {
                out.push(SyncOp::new(&e.op, hits, at, mode));
                (e.sending, e.sending_at) = (hits, at);
            }
        }
        self.waiting = waiting;
    }

    /// A round trip carrying `s` failed: its hits wait for the next one (those still weighing
    /// on a decision), unless it was abandoned at its deadline (`landed`): the store may count
    /// it then, so it is not sent again.
    pub(crate) fn failed(&mut self, s: SyncOp, landed: bool, now: u64) {
        let (mode, hits) = (self.mode, s.signed_hits());
        let entry = (self.entries.get_mut(&s.op.key)).filter(|e| e.sending_at == s.at);
        let Some(e) = entry.filter(|e| e.sending != 0 || landed) else {
            // Local-first: a late window's hits, no entry's.
            if mode == Mode::LocalFirst && !landed {
                if s.op.hits > 0 && same_window(&s.op, s.at, now) {
                    self.late.push(s);
                } else if !s.refund {
                    dropped(mode, &self.stats, hits);
                }
            }
            return;
        };
        let was_sending = e.sending != 0;
        e.sending = 0;
        if landed {
            if mode == Mode::Fallback && was_sending {
                self.stats.replayed(hits);
                if e.delta == 0 {
                    self.entries.remove(&s.op.key);
                }
            }
            return;
        }
        let back = weigh(mode, &e.op, hits, s.at, now);
        dropped(mode, &self.stats, hits - back.max(0));
        if back == 0 {
            return;
        }
        if e.delta == 0 || !same_window(&e.op, e.at, s.at) {
            e.at = s.at;
        }
        e.delta = e.delta.saturating_add(back);
        if mode == Mode::Fallback {
            self.waiting = true;
            self.next_due = now.saturating_add(self.period);
        }
    }

    /// A round trip carrying `s` came back: its hits are counted in the store. The key's state
    /// in the shard's table becomes the store's total plus what was decided here since, less
    /// the hits `queued` says are on their way back as refunds.
    pub(crate) fn synced(
        &mut self,
        mut keys: ShardKeys<'_>,
        s: &SyncOp,
        reply: &StoreReply,
        times: TripTimes,
        queued: i64,
    ) {
        let TripTimes { started, now } = times;
        let (mode, hits) = (self.mode, s.signed_hits());
        if mode == Mode::Fallback {
            self.stats.replayed(hits);
            // Hits decided meanwhile go at once.
            self.next_due = 0;
        }
        let Some(e) = self.entries.get_mut(&s.op.key) else {
            return;
        };
        if e.sending_at == s.at {
            e.sending = 0;
        } else if mode == Mode::LocalFirst {
            // A late window's hits: counted, nothing to read back.
            return;
        }
        let p = s.op.params;
        // Windows counted into the window of `at`; buckets took tokens at the round trip's
        // start.
        let when = match p.algorithm {
            Algorithm::TokenBucket { .. } => started,
            _ => s.at,
        };
        // A refund answers the state after it; an add, the state before.
        let total = if hits < 0 {
            reply.before
        } else {
            reply.before.add(&p, when, hits.unsigned_abs())
        };
        e.read_at = started;
        let local = weigh(mode, &e.op, e.delta, e.at, now) - queued;
        keys.put(&s.op.key, with_hits(total, &p, now, local), &p, now);
        if mode == Mode::Fallback && e.delta == 0 && e.sending == 0 {
            // Nothing left to send: exact decisions stop looking the key up.
            self.entries.remove(&s.op.key);
        }
    }
}

/// Local-first only: which ops it decides, and the freshness of what the shard's table holds.
impl Ledger {
    /// Ops that do not say are local-first (`LOCAL_FIRST`).
    pub(crate) fn on_by_default(mut self, on: bool) -> Ledger {
        self.default_on = on;
        self
    }

    /// Whether `op` is decided local-first (sliding windows never are: `check` refuses them).
    pub(crate) fn applies(&self, op: &Op) -> bool {
        self.mode == Mode::LocalFirst
            && op.local_first.unwrap_or(self.default_on)
            && op.grant.is_none()
            && op.params.algorithm != Algorithm::SlidingWindow
    }

    /// Whether every op of a message may be decided from memory now: local-first, with a
    /// fresh count; without the store (`store_ready` false), the last count (or none) is all
    /// there is. Marks the keys used, so the next sync reads them back.
    pub(crate) fn local(&mut self, ops: &[Op], now: u64, store_ready: bool) -> bool {
        if ops.is_empty() || !ops.iter().all(|op| self.applies(op)) {
            return false;
        }
        self.fresh(ops, now) || !store_ready
    }

    /// Whether every op's key was read within 1.5 sync intervals. Marks the keys used, so the
    /// next sync reads them back.
    fn fresh(&mut self, ops: &[Op], now: u64) -> bool {
        let fresh_for = self.period + self.period / 2;
        let mut fresh = true;
        for op in ops {
            match self.entries.get_mut(&op.key) {
                Some(e) => {
                    e.used = true;
                    fresh &= e.read_at > 0 && now.saturating_sub(e.read_at) <= fresh_for;
                }
                None => fresh = false,
            }
        }
        fresh
    }

    /// An exact round trip read `op`'s key (`before` its hits): the key's state becomes that
    /// count, with the op's hits if it was admitted (`counted`), and the hits decided here
    /// since, less `queued` refunds on their way.
    pub(crate) fn read(
        &mut self,
        mut keys: ShardKeys<'_>,
        op: &Op,
        reply: &StoreReply,
        counted: bool,
        times: TripTimes,
        queued: i64,
    ) {
        let TripTimes { started, now } = times;
        let mode = self.mode;
        let Some(e) = self.entry(op, started) else {
            return;
        };
        e.read_at = started;
        let mut state = reply.before;
        if counted {
            state = state.add(&op.params, started, op.hits);
        }
        let local = weigh(mode, &e.op, e.delta, e.at, now) - queued;
        let state = with_hits(state, &op.params, now, local);
        keys.put(&op.key, state, &op.params, now);
    }

    /// Whether the ledger holds `key`.
    pub(crate) fn holds(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }
}
