//! One shard actor: owns the state and the wait queues of the keys that hash to it.
//!
//! The shard lives on one thread and is used by one caller at a time (its task, or a caller on
//! the same thread deciding synchronously, see [`SameThreadShard`]), so the table needs no lock. A request
//! reaches the shard as one message holding all of its ops for this shard; the shard decides them
//! together, so a request whose ops all live here is decided atomically. A message that must wait
//! parks in the FIFO of the key it waits for and is answered later through its reply channel.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::clock::Clock;
use super::key::{Key, KeyMap};
use super::op::Op;
use super::protocol::{Decide, Msg, Reply, ReplyTo};
use super::waiters::WaiterBudget;

mod actor;
mod admin;
mod breaker;
mod decide;
mod evict;
mod grants;
mod inspect;
mod queue;
mod round_trip;
mod same_thread;
mod synced;
mod table;
#[cfg(test)]
mod tests;
mod through_store;

pub(crate) use actor::run;
pub use breaker::BreakerState;
pub(crate) use decide::refund_in_outcomes;
use grants::Grant;
pub(crate) use round_trip::StoreLink;
pub(crate) use same_thread::{find_on_this_thread, OnThisThread, SameThreadShard};
use table::Table;

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
    /// Redis mode: the breaker, as [`BreakerState::gauge`] gives it.
    pub breaker: AtomicU64,
    pub redis_errors: AtomicU64,
    /// Decisions made without Redis while its breaker was open.
    pub fallback_decisions: AtomicU64,
    /// Hits refused from the local over-limit cache, without a round trip.
    pub local_cache_hits: AtomicU64,
    /// Local-first: messages decided from memory, and sync round trips sent.
    pub local_decisions: AtomicU64,
    pub syncs: AtomicU64,
}

/// A message parked in a key's queue.
pub(super) struct Waiter {
    pub(super) msg: Decide,
    /// Which op of `msg` waits for this key.
    pub(super) op: usize,
    pub(super) enqueued: u64,
    pub(super) deadline: u64,
}

pub(crate) struct Shard {
    table: Table,
    /// FIFO wait queues, by key. A key with waiters keeps its entry in `table`: the sweep and
    /// evictions pass it by.
    queues: KeyMap<VecDeque<Waiter>>,
    clock: Clock,
    /// Times at which some key's queue must be looked at again (head's deadline or retry time).
    events: BinaryHeap<Reverse<(u64, Key)>>,
    /// Waiters queued in this shard (the `waiting` gauge).
    waiters: usize,
    /// The process-wide cap on waiters, shared by every shard.
    budget: Arc<WaiterBudget>,
    next_sweep: u64,
    sweep_every: u64,
    draining: Option<bool>,
    stats: Arc<ShardStats>,
    grants: fnv::FnvHashMap<u64, Grant>,
    /// Direct API refusals per key in the current window: (window index, count).
    denied: KeyMap<(u64, u64)>,
    /// Redis mode; `None` keeps every counter in `table`.
    link: Option<StoreLink>,
    /// Keys this shard may hold; past it, keys are evicted (see `make_room`).
    max_keys: usize,
    /// Keys refused in their current window (by hash, until the window ends): never evicted, so
    /// an attacker flooding new keys cannot make the shard forget who is over the limit.
    refused: fnv::FnvHashMap<u64, u64>,
    /// The answer to a synchronous caller's message ([`ReplyTo::InPlace`]).
    answered: Option<Reply>,
    /// Where a synchronous caller whose message was held waits for its answer.
    held: Option<oneshot::Receiver<Reply>>,
}

const NS_PER_SEC: u64 = 1_000_000_000;

impl Shard {
    pub(crate) fn new(
        clock: Clock,
        budget: Arc<WaiterBudget>,
        stats: Arc<ShardStats>,
        link: Option<StoreLink>,
        max_keys: usize,
    ) -> Shard {
        let now = clock.now();
        Shard {
            table: Table::default(),
            queues: Default::default(),
            clock,
            events: BinaryHeap::new(),
            waiters: 0,
            budget,
            next_sweep: now + NS_PER_SEC,
            sweep_every: NS_PER_SEC,
            draining: None,
            stats,
            grants: Default::default(),
            denied: Default::default(),
            link,
            max_keys: max_keys.max(16),
            refused: Default::default(),
            answered: None,
            held: None,
        }
    }

    /// When the shard must next look at its queues or sweep.
    pub(crate) fn next_wake(&self) -> u64 {
        let ev = self.events.peek().map(|Reverse((t, _))| *t);
        let sync = self.link.as_ref().map_or(u64::MAX, |r| r.next_send());
        ev.unwrap_or(u64::MAX).min(self.next_sweep).min(sync)
    }

    /// After messages: due queue events and, once a second, the expiry sweep.
    pub(super) fn tick(&mut self) {
        let now = self.clock.now();
        self.run_events(now);
        if now >= self.next_sweep {
            self.sweep(now);
        }
        if self
            .link
            .as_ref()
            .is_some_and(|r| r.deferred || now >= r.synced.next_sync())
        {
            self.flush();
        }
    }

    pub(crate) fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Decide(d) => self.decide_any(d),
            Msg::Refund {
                ops,
                in_store: true,
            } => self.refund_all_in_store(&ops),
            Msg::Refund {
                ops,
                in_store: false,
            } => {
                let now = self.clock.now();
                for op in &ops {
                    self.refund(op, now);
                }
            }
            Msg::Inspect { prefix, reply } => {
                let _ = reply.send(self.inspect(prefix.as_deref()));
            }
            Msg::Drain { admit } => self.drain(admit),
            Msg::Cancelled { key } => self.purge_cancelled(&key),
            Msg::Release { key, id, reply } => {
                let found = self.release(key, id);
                let _ = reply.send(found);
            }
            Msg::LookUp { op, reply } => {
                let _ = reply.send(self.look_up(&op));
            }
            Msg::Reset { op, delete, reply } => {
                let _ = reply.send(self.reset(&op, delete));
            }
        }
    }

    /// Delivers a message's answer; false when its caller went away. Always inlined: on the
    /// synchronous path it is one store into `answered`, and a call would copy the reply twice
    /// (measured: 3 % of a decide in `cargo bench --bench engine`).
    #[inline(always)]
    pub(super) fn answer(&mut self, to: ReplyTo, reply: Reply) -> bool {
        match to {
            ReplyTo::Caller(tx) => tx.send(reply).is_ok(),
            ReplyTo::InPlace => {
                self.answered = Some(reply);
                true
            }
        }
    }

    /// A message about to be held (in a queue, or for Redis): a synchronous caller gets a
    /// channel to wait on.
    pub(super) fn hold(&mut self, d: &mut Decide) {
        if matches!(d.reply, ReplyTo::InPlace) {
            let (tx, rx) = oneshot::channel();
            d.reply = ReplyTo::Caller(tx);
            self.held = Some(rx);
        }
    }

    pub(super) fn has_waiters(&self, op: &Op) -> bool {
        self.queues.get(&op.key).is_some_and(|q| !q.is_empty())
            || self
                .link
                .as_ref()
                .is_some_and(|r| r.heads.contains(&op.key))
    }

    fn find(&self, key: &Key) -> Option<&table::Entry> {
        self.table
            .find(key.as_str(), key.hash())
            .map(|at| self.table.get(at))
    }
}
