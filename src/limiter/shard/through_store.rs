//! The shard's store mode (Redis): deciding through round trips (`round_trip`), the local
//! over-limit cache, and fallback while the breaker is open.
//!
//! Redis counts first (INCRBY, or a script that counts only what fits); the shard then judges
//! each message with the same rules as in memory, and gives back, in the next pipeline, whatever
//! a message that is refused or must wait had counted. Queues stay in this shard: a waiter at the head of its
//! queue is decided through Redis again when it may fit, so FIFO holds among the waiters of one
//! replica, and across replicas the first to ask Redis after a rollover wins.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::decide::{judge, Commit, Verdict};
use super::round_trip::{InFlight, StoreBound};
use super::synced::with_hits;
use super::{Shard, Waiter};
use crate::config::Algorithm;
use crate::limiter::algorithm::{Eval, State};
use crate::limiter::key::Key;
use crate::limiter::op::{Counting, Op, Outcome};
use crate::limiter::protocol::Decide;
use crate::limiter::protocol::{Hits, Reply};
use crate::limiter::store::{FailureMode, StoreReply};

impl Shard {
    /// Whether decisions go to Redis now (a backend is set and its breaker lets them through).
    pub(super) fn store_ready(&self) -> bool {
        self.link.as_ref().is_some_and(|r| r.breaker.ready())
    }

    /// A new message in Redis mode.
    pub(super) fn decide_via_store(&mut self, d: Decide) {
        let now = self.clock.now();
        let ready = self.store_ready();
        let r = self.link.as_mut().expect("store mode");
        if r.synced.local(&d.ops, now, ready) {
            self.stats.local_decisions.fetch_add(1, Ordering::Relaxed);
            return self.decide(d);
        }
        if !ready {
            return self.decide_without_store(d);
        }
        // A key known to be full refuses a lone op at once, without a round trip (whatever its
        // role: shadow mode reports it, as envoyproxy/ratelimit's local cache does); a check
        // (hits 0) fits even a full window, as in memory. A request with other descriptors goes
        // to Redis, which answers what is left on them. Usage always goes (it is stored in
        // full), and so do hits kept when refused unless more of them change nothing (a full
        // fixed window).
        let cached = d.ops.iter().position(|op| {
            let counts = match op.counting {
                Counting::IfAdmitted => false,
                Counting::Always => op.params.algorithm != Algorithm::FixedWindow,
                Counting::Usage => true,
            };
            d.ops.len() == 1
                && !op.refund
                && !counts
                && op.hits > 0
                && op.queue.is_none()
                && r.over.get(&op.key).is_some_and(|until| *until > now)
        });
        if let Some(i) = cached {
            let until = r.over[&d.ops[i].key];
            (self.stats.local_cache_hits).fetch_add(d.ops[i].hits, Ordering::Relaxed);
            let outcomes = d
                .ops
                .iter()
                .enumerate()
                .map(|(j, _)| Outcome {
                    over: j == i,
                    remaining: 0,
                    reset_ns: if j == i { until - now } else { 0 },
                    retry_ns: if j == i { until - now } else { 0 },
                    blocked: false,
                    past: u64::MAX,
                })
                .collect();
            self.count_denied(&d.ops, now);
            self.answer(d.reply, Reply::refused(outcomes, 0));
            return;
        }
        let mut d = d;
        self.hold(&mut d);
        self.link
            .as_mut()
            .expect("store mode")
            .batch
            .push(StoreBound::New(d));
        // Sent when the shard's task next runs, after the calls that are ready on this thread:
        // they join the same pipeline instead of one call going alone.
        self.link.as_mut().expect("store mode").deferred = true;
    }

    pub(super) fn synced_local(&mut self, d: &Decide, now: u64) -> bool {
        let r = self.link.as_mut().expect("store mode");
        r.synced.local(&d.ops, now, false)
    }

    /// The breaker is open: decide as the failure mode says.
    pub(super) fn decide_without_store(&mut self, d: Decide) {
        self.stats
            .fallback_decisions
            .fetch_add(1, Ordering::Relaxed);
        let mode = self
            .link
            .as_ref()
            .map_or(FailureMode::Fallback, |r| r.policy.failure_mode);
        match mode {
            FailureMode::Fallback => self.decide(d),
            FailureMode::FailOpen => {
                let now = self.clock.now();
                let outcomes = d
                    .ops
                    .iter()
                    .map(|op| {
                        let e = State::fresh(&op.params, now).eval(&op.params, now, 0);
                        Outcome {
                            over: false,
                            remaining: e.remaining,
                            reset_ns: e.reset_ns,
                            retry_ns: 0,
                            blocked: false,
                            past: 0,
                        }
                    })
                    .collect();
                self.answer(d.reply, Reply::refused(outcomes, 0));
            }
            FailureMode::FailClosed => {
                self.answer(
                    d.reply,
                    Reply {
                        outcomes: SmallVec::new(),
                        hits: Hits::StoreFailed,
                        waited_ns: 0,
                    },
                );
            }
        }
    }

    /// Sends the head waiter of `key` to Redis.
    pub(super) fn store_head(&mut self, w: Waiter, key: &Key) {
        let r = self.link.as_mut().expect("store mode");
        r.heads.insert(key.clone());
        r.batch.push(StoreBound::Head(w, key.clone()));
        self.flush();
    }

    /// Gives back, through Redis, what the ops at `done` counted there.
    pub(super) fn refund_in_store(&mut self, ops: &[Op], done: &[usize]) {
        if done.is_empty() {
            return;
        }
        let Some(r) = self.link.as_mut() else {
            return;
        };
        // Usage counted in full stays counted.
        let done: SmallVec<[usize; 2]> = done
            .iter()
            .copied()
            .filter(|&i| !ops[i].counts_in_full())
            .collect();
        if done.is_empty() {
            return;
        }
        for &i in &done {
            r.refunds.push(ops[i].clone());
        }
        self.refund_views(ops, &done);
        self.flush();
    }

    /// Refunds, in the store, every op of a request another shard refused.
    pub(super) fn refund_all_in_store(&mut self, ops: &[Op]) {
        let all: SmallVec<[usize; 2]> = (0..ops.len()).collect();
        self.refund_in_store(ops, &all);
    }

    pub(super) fn apply(&mut self, flight: InFlight, replies: Vec<StoreReply>) {
        let InFlight {
            messages,
            refunds,
            sync,
            now,
            ..
        } = flight;
        let refunded = refunds.len();
        let n_msgs: usize = messages.iter().map(|p| p.ops().len()).sum();
        self.judge_stored(messages, &replies, now);
        // The sync went last in the pipeline: its counts are the latest, and make the views.
        let sync_at = (n_msgs + refunded).min(replies.len());
        self.synced(sync, &replies[sync_at..], now);
    }

    /// Judges the messages of a round trip on Redis's answers, in order.
    fn judge_stored(&mut self, messages: Vec<StoreBound>, replies: &[StoreReply], now: u64) {
        let mut at = 0;
        for p in messages {
            let (d, head) = match p {
                StoreBound::New(d) => (d, None),
                StoreBound::Head(w, key) => {
                    let Waiter {
                        msg,
                        op,
                        enqueued,
                        deadline,
                    } = w;
                    (msg, Some((op, enqueued, deadline, key)))
                }
            };
            let n = d.ops.len();
            let mine = &replies[at..at + n];
            at += n;
            let head_of = head.as_ref().map(|h| h.0);
            let mut evals: SmallVec<[(Eval, bool); 2]> = SmallVec::with_capacity(n);
            let mut counted: SmallVec<[usize; 2]> = SmallVec::new();
            for (i, (op, reply)) in d.ops.iter().zip(mine).enumerate() {
                let (e, did_count) = self.eval_stored(op, reply, now);
                if did_count {
                    counted.push(i);
                }
                evals.push((e, self.is_blocked(op, i, head_of)));
            }
            let (outcomes, verdict) = judge(&d, &evals);
            // With what Redis counted; whatever is given back leaves the views too.
            self.viewed(&d.ops, mine, &counted, now);
            match head {
                None => self.conclude(d, outcomes, verdict, Commit::InStore(counted), now, None),
                Some((op, enqueued, deadline, key)) => {
                    self.link.as_mut().expect("store mode").heads.remove(&key);
                    let w = Waiter {
                        msg: d,
                        op,
                        enqueued,
                        deadline,
                    };
                    if w.msg.reply.is_closed() {
                        self.left_queue();
                        self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                        self.refund_in_store(&w.msg.ops, &counted);
                    } else {
                        match verdict {
                            Verdict::Wait(i) if i == op => {
                                self.refund_in_store(&w.msg.ops, &counted);
                                let retry = outcomes[i].retry_ns;
                                self.requeue_head(w, &key, now.saturating_add(retry));
                                continue;
                            }
                            // Moving on to wait at another key, or answered (then it leaves).
                            verdict => {
                                if !matches!(verdict, Verdict::Wait(_)) {
                                    self.left_queue();
                                }
                                let since = Some((w.enqueued, w.deadline));
                                self.conclude(
                                    w.msg,
                                    outcomes,
                                    verdict,
                                    Commit::InStore(counted),
                                    now,
                                    since,
                                );
                            }
                        }
                    }
                    self.service_queue(&key, self.clock.now());
                }
            }
        }
    }

    /// Puts a head waiter back at the front of its queue, to be looked at again at `at`.
    pub(super) fn requeue_head(&mut self, w: Waiter, key: &Key, at: u64) {
        let at = at.min(w.deadline);
        let params = w.msg.ops[w.op].params;
        let now = self.clock.now();
        self.slot(key, params, now);
        self.queues.entry_ref(key).or_default().push_front(w);
        self.events.push(std::cmp::Reverse((at, key.clone())));
    }

    /// Turns the store's answer to one op into the same evaluation the memory engine makes, and
    /// whether the store counted its hits.
    fn eval_stored(&mut self, op: &Op, reply: &StoreReply, now: u64) -> (Eval, bool) {
        let p = &op.params;
        if op.refund {
            return (reply.before.eval(p, now, 0), false);
        }
        let hits = op.hits;
        let (before, allowed) = (reply.before, reply.allowed);
        // Local-first hits Redis has not seen yet weigh on an exact decision of the same key.
        let unsynced = self.link.as_ref().map_or(0, |r| r.synced.unsynced(op, now));
        let before = if unsynced == 0 {
            before
        } else {
            with_hits(before, p, now, unsynced)
        };
        let mut e = before.eval(p, now, hits);
        // The script's verdict stands (its arithmetic is in milliseconds or microseconds),
        // unless local hits it could not see make the op over.
        if let Some(allowed) = allowed.filter(|_| unsynced == 0) {
            if allowed && e.over {
                e.over = false;
                e.remaining = 0;
            } else if !allowed && !e.over {
                e.over = true;
                e.remaining = 0;
            }
        }
        let counted = hits > 0 && allowed.unwrap_or(true);
        // Remember keys with no room left at all, until room comes back: one with no room for
        // a single hit, or one these hits, counted in full, took past its limit (as
        // envoyproxy/ratelimit's local cache remembers a key once it answers it over).
        let full = if counted && op.counts_in_full() && e.over {
            before.add(p, now, hits).eval(p, now, 1)
        } else {
            before.eval(p, now, 1)
        };
        if full.over && full.retry_ns != u64::MAX {
            let r = self.link.as_mut().expect("store mode");
            if r.over.len() >= r.over_cap {
                r.over.retain(|_, until| *until > now);
            }
            if r.over.len() < r.over_cap {
                r.over.insert(op.key.clone(), now + full.retry_ns);
            }
        }
        (e, counted)
    }
}
