//! The shard's queues: a FIFO per key of the messages waiting for room, the times at which
//! a queue must be looked at again, the shard's count of waiters and the process-wide budget of
//! them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use super::stats::ShardStats;
use crate::limiter::algorithm::Params;
use crate::limiter::key::{Key, KeyMap, KeyRef};
use crate::limiter::protocol::Decide;
use crate::limiter::queue_budget::QueueBudget;

/// A message parked in a key's queue.
pub(crate) struct Waiter {
    pub(super) msg: Decide,
    /// Which op of `msg` waits for this key.
    pub(super) op: usize,
    pub(super) enqueued: u64,
    pub(super) deadline: u64,
}

/// A message that waited in a queue already: when it was queued, and when it gives up (ns).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queued {
    pub(super) enqueued: u64,
    pub(super) deadline: u64,
}

impl Waiter {
    /// When this waiter was queued, and when it gives up.
    pub(super) fn queued(&self) -> Queued {
        Queued {
            enqueued: self.enqueued,
            deadline: self.deadline,
        }
    }
}

/// When `key`'s queue must be looked at again. Ordered by time, then key (fields in that
/// order): the events' heap takes the earliest first.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct QueueEvent {
    at: u64,
    key: Key,
}

pub(crate) struct Queues {
    /// FIFO queues, by key. A key with waiters keeps its entry in the counters: the sweep
    /// and evictions pass it by.
    map: KeyMap<VecDeque<Waiter>>,
    /// Times at which some key's queue must be looked at again (head's deadline or retry time).
    events: BinaryHeap<Reverse<QueueEvent>>,
    /// Waiters queued in this shard (the `waiting` gauge).
    waiters: usize,
    /// The process-wide cap on waiters, shared by every shard.
    budget: Arc<QueueBudget>,
    stats: Arc<ShardStats>,
}

impl Queues {
    pub(super) fn new(budget: Arc<QueueBudget>, stats: Arc<ShardStats>) -> Queues {
        Queues {
            map: KeyMap::default(),
            events: BinaryHeap::new(),
            waiters: 0,
            budget,
            stats,
        }
    }

    /// Whether no key has a queue.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `key` has a queue (waiters, or a head out deciding).
    #[inline]
    pub(super) fn has(&self, key: &KeyRef<'_>) -> bool {
        self.map.contains_key(key)
    }

    /// Whether `key` has a queue.
    #[inline]
    pub(super) fn has_key(&self, key: &Key) -> bool {
        !self.map.is_empty() && self.map.contains_key(key)
    }

    /// Whether someone waits in `key`'s queue.
    #[inline]
    pub(super) fn has_waiters(&self, key: &Key) -> bool {
        self.map.get(key).is_some_and(|q| !q.is_empty())
    }

    /// How many wait in `key`'s queue.
    pub(super) fn len_of(&self, key: &KeyRef<'_>) -> usize {
        self.map.get(key).map_or(0, |q| q.len())
    }

    /// The waiters ahead in `key`'s queue whose callers are still there, and the hits of the
    /// ops they wait with.
    pub(super) fn ahead(&self, key: &Key) -> (usize, u64) {
        let mut len = 0;
        let mut hits = 0u64;
        if let Some(q) = self.map.get(key) {
            for w in q.iter().filter(|w| !w.msg.reply.is_closed()) {
                len += 1;
                hits += w.msg.ops[w.op].hits;
            }
        }
        (len, hits)
    }

    /// A newcomer to `key` carries `limit`: waiters that wait there under a lower one of the
    /// same kind (a reload raised it since) are judged by it from now on, as the newcomer is.
    /// Whether any was.
    pub(super) fn raise_limit(&mut self, key: &Key, limit: &Params) -> bool {
        if self.map.is_empty() {
            return false;
        }
        let Some(q) = self.map.get_mut(key) else {
            return false;
        };
        let mut raised = false;
        for w in q.iter_mut() {
            for op in w.msg.ops.iter_mut().filter(|op| &op.key == key) {
                if op.params != *limit && op.params.no_roomier_than(limit) {
                    op.params = *limit;
                    raised = true;
                }
            }
        }
        raised
    }

    /// Takes the head of `key`'s queue; a queue left empty is dropped. `None` when `key` has no
    /// queue, or an empty one (dropped then).
    pub(super) fn pop_head(&mut self, key: &Key) -> Option<Waiter> {
        let q = self.map.get_mut(key)?;
        let head = q.pop_front();
        if head.is_none() {
            self.map.remove(key);
        }
        head
    }

    /// Puts a waiter back at the head of `key`'s queue, to be looked at again at `at`.
    pub(super) fn push_head(&mut self, key: &Key, w: Waiter, at: u64) {
        self.map.entry_ref(key).or_default().push_front(w);
        let key = key.clone();
        self.events.push(Reverse(QueueEvent { at, key }));
    }

    /// Parks a waiter at the back of `key`'s queue; the first of a queue is looked at again at
    /// `at`. A newcomer (not one moving on from another key's queue) is counted.
    pub(super) fn push_back(&mut self, key: Key, w: Waiter, at: u64, is_new: bool) {
        let q = self.map.entry_ref(&key).or_default();
        let was_empty = q.is_empty();
        q.push_back(w);
        if is_new {
            self.waiters += 1;
            self.stats.set_waiting(self.waiters);
            self.stats.queued();
        }
        if was_empty {
            self.events.push(Reverse(QueueEvent { at, key }));
        }
    }

    /// Removes waiters whose callers went away, wherever they are in `key`'s queue; how many.
    pub(super) fn purge_closed(&mut self, key: &Key) -> usize {
        let Some(q) = self.map.get_mut(key) else {
            return 0;
        };
        let before = q.len();
        q.retain(|w| !w.msg.reply.is_closed());
        let gone = before - q.len();
        if q.is_empty() {
            self.map.remove(key);
        }
        for _ in 0..gone {
            self.left();
        }
        self.stats.cancelled(gone);
        gone
    }

    /// A waiter left its queue: its place in the budget is free again.
    pub(super) fn left(&mut self) {
        self.budget.free();
        self.waiters = self.waiters.saturating_sub(1);
        self.stats.set_waiting(self.waiters);
    }

    /// Takes a place in the process-wide budget of waiters, if there is one.
    pub(super) fn take_place(&self) -> bool {
        self.budget.try_take()
    }

    /// When some queue must next be looked at.
    pub(super) fn next_event(&self) -> Option<u64> {
        self.events.peek().map(|Reverse(e)| e.at)
    }

    /// The key of the next queue event due at `now`, if any (taken off the events).
    pub(super) fn pop_due(&mut self, now: u64) -> Option<Key> {
        match self.events.peek() {
            Some(Reverse(e)) if e.at <= now => {
                let Reverse(e) = self.events.pop().expect("peeked");
                Some(e.key)
            }
            _ => None,
        }
    }

    /// Every key with a queue.
    pub(super) fn keys(&self) -> Vec<Key> {
        self.map.keys().cloned().collect()
    }
}
