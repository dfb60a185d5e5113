//! Deciding through the store (Redis, `Backing::Store`): round trips sent and their answers judged,
//! the local over-limit cache, and fallback while the breaker is open.
//!
//! Redis counts first (INCRBY, or a script that counts only what fits); the shard then judges
//! each message with the same rules as in memory, and refunds, in the next pipeline, whatever
//! a message that is refused or must wait had counted. Queues stay in this shard: a waiter at the head of its
//! queue is decided through Redis again when it may fit, so FIFO holds among the waiters of one
//! replica, and across replicas the first to ask Redis after a rollover wins.

use smallvec::SmallVec;

use super::decide::{beside, check_holding, judge, less_held, Action, Commit, Decider, Hooks};
use super::link::{with_hits, Done, InFlight, Link, ShardKeys, StoreBound, TripTimes};
use super::queues::Waiter;
use super::stats::ShardStats;
use crate::limiter::algorithm::{Eval, State};
use crate::limiter::key::Key;
use crate::limiter::op::{CountedHolds, NamedHolds, Op, Outcome, Outcomes, Reservation};
use crate::limiter::protocol::{Decide, Hits, Reply, StorePeek};
use crate::limiter::store::{DeleteFuture, FailureMode, StoreError, StoreReply};

/// What the memory path tells the link, and asks of it.
impl Hooks for Link {
    fn head_out(&self, key: &Key) -> bool {
        Link::head_out(self, key)
    }

    fn record(&mut self, op: &Op, hits: i64, now: u64) {
        Link::record(self, op, hits, now);
    }

    fn take_head(&mut self, w: Waiter, key: &Key, now: u64, _: &ShardStats) -> Option<Waiter> {
        if !self.ready() {
            return Some(w);
        }
        self.send_head(w, key);
        self.send(now);
        None
    }

    fn peek(&self, op: &Op, now: u64) -> Option<StorePeek> {
        let unsynced = Link::unsynced(self, op, now);
        self.ready().then(|| StorePeek {
            read: Link::peek(self, op, now),
            unsynced,
            params: op.params,
        })
    }

    fn forget(&mut self, op: &Op, delete: bool, now: u64) -> Option<DeleteFuture> {
        Link::forget(self, &op.key);
        delete.then(|| self.delete(op, now))
    }

    fn refund_counted(d: &mut Decider<'_, Link>, ops: &[Op], done: &[usize]) {
        d.refund_in_store(ops, done);
    }
}

impl Decider<'_, Link> {
    /// Starts a round trip with everything waiting, if one may go now.
    pub(super) fn flush(&mut self) {
        let now = self.cx.clock.now();
        self.backing.send(now);
    }

    /// A round trip finished: judge it and any later ones already back, oldest first, then send
    /// what accumulated meanwhile.
    pub(super) fn store_done(&mut self, done: Done) {
        self.backing.trips.arrive(done);
        loop {
            let Some((flight, result)) = self.backing.next_back() else {
                break;
            };
            self.round_trip_done(flight, result);
        }
        self.flush();
    }

    fn round_trip_done(&mut self, flight: InFlight, result: Result<Vec<StoreReply>, StoreError>) {
        if let Ok(replies) = result {
            return self.apply(flight, replies);
        }
        // Nothing is known of this batch: decide it as the failure mode says. One abandoned at
        // its deadline was written, and the store may count it yet: what is decided from memory
        // is not kept for it, nor are its refunds. Otherwise it reached nothing: its refunds
        // wait with the hits kept for the store (and net out against them).
        let now = self.cx.clock.now();
        let landed = flight.abandoned;
        let link = &mut *self.backing;
        link.failed(flight.sync, now, landed);
        if !landed {
            for u in &flight.refunds {
                link.record(u, -(u.hits as i64), flight.now);
            }
        }
        link.fallback.keep(!landed);
        self.decide_failed(flight.messages, flight.now);
        self.backing.fallback.keep(true);
    }

    /// Decides the messages of a failed round trip as the failure mode says.
    fn decide_failed(&mut self, messages: Vec<StoreBound>, sent_at: u64) {
        let now = self.cx.clock.now();
        for p in messages {
            match p {
                // Local-first limits stay local while the store is away.
                StoreBound::New(d) if self.backing.local(&d.ops, now, false) => self.decide(d),
                StoreBound::New(d) => self.decide_without_store(d),
                StoreBound::Head(w, key) => {
                    self.backing.head_back(&key);
                    self.requeue_head(w, &key, sent_at);
                    self.service_queue(&key, self.cx.clock.now());
                }
            }
        }
    }

    /// A new message with a store.
    pub(super) fn decide_via_store(&mut self, d: Decide) {
        let now = self.cx.clock.now();
        let link = &mut *self.backing;
        let ready = link.ready();
        if link.local(&d.ops, now, ready) {
            link.stats.local_decision();
            return self.decide(d);
        }
        if !ready {
            return self.decide_without_store(d);
        }
        if let Some((i, until)) = link.known_full(&d, now) {
            self.backing.stats.refused_from_cache(d.ops[i].hits);
            let outcomes: Outcomes = (0..d.ops.len())
                .map(|j| Outcome {
                    over: j == i,
                    remaining: 0,
                    reset_ns: if j == i { until - now } else { 0 },
                    retry_ns: if j == i { until - now } else { 0 },
                    blocked: false,
                    released: false,
                    past: u64::MAX,
                })
                .collect();
            // Over its limit, as the store last said; whether that refuses is the op's role's
            // to say (a shadow limit answered from the cache is admitted, uncounted, as
            // envoyproxy/ratelimit's local cache answers it).
            let refused = d.refuses(outcomes.iter().map(|o| o.over));
            if refused {
                self.counters.count_denied(&d.ops, now);
                self.answer(d.reply, Reply::refused(outcomes, 0));
            } else {
                self.answer(d.reply, Reply::admitted_uncounted(outcomes));
            }
            return;
        }
        // A limit raised since its waiters queued: they go to the store first, judged by it.
        for op in d.ops.iter().filter(|op| op.queue.is_some()) {
            if self.queues.raise_limit(&op.key, &op.params) && !self.backing.head_out(&op.key) {
                self.service_queue(&op.key, now);
            }
        }
        let mut d = d;
        self.answer_later(&mut d);
        // Sent when the shard's task next runs, after the calls that are ready on this thread:
        // they join the same pipeline instead of one call going alone.
        self.backing.defer(d);
    }

    /// The breaker is open: decide as the failure mode says.
    fn decide_without_store(&mut self, d: Decide) {
        self.backing.stats.fallback_decision();
        match self.backing.policy.failure_mode {
            FailureMode::Fallback => self.decide(d),
            // A request none of whose limits can refuse it (shadow mode) is not failed for
            // want of a store: it is admitted uncounted, as fail-open admits it.
            FailureMode::FailClosed if d.never_refuses() => self.admit_uncounted(d),
            FailureMode::FailOpen => self.admit_uncounted(d),
            FailureMode::FailClosed => {
                self.answer(
                    d.reply,
                    Reply {
                        outcomes: SmallVec::new(),
                        hits: Hits::StoreFailed,
                        waited_ns: 0,
                        refused: false,
                    },
                );
            }
        }
    }

    /// Answers `d` admitted without counting it, each op as a fresh window would see it.
    fn admit_uncounted(&mut self, d: Decide) {
        let now = self.cx.clock.now();
        let outcomes = (d.ops.iter())
            .map(|op| {
                let e = State::fresh(&op.params, now).eval(&op.params, now, 0);
                Outcome {
                    over: false,
                    remaining: e.remaining,
                    reset_ns: e.reset_ns,
                    retry_ns: 0,
                    blocked: false,
                    released: false,
                    past: 0,
                }
            })
            .collect();
        self.answer(d.reply, Reply::admitted_uncounted(outcomes));
    }

    /// Refunds, through Redis, what the ops at `done` counted there.
    pub(super) fn refund_in_store(&mut self, ops: &[Op], done: &[usize]) {
        if done.is_empty() {
            return;
        }
        let link = &mut *self.backing;
        // Usage counted in full stays counted.
        let done: SmallVec<[usize; 2]> = done
            .iter()
            .copied()
            .filter(|&i| !ops[i].counts_in_full())
            .collect();
        if done.is_empty() {
            return;
        }
        let withdrawn = (done.iter())
            .filter(|&&i| {
                matches!(
                    ops[i].reserve,
                    Reservation::Counted(CountedHolds::Hold { .. })
                        | Reservation::Named(NamedHolds::Reserve { .. })
                )
            })
            .count();
        self.cx.stats.holds_withdrawn(withdrawn as u64);
        link.queue_refunds(ops, &done);
        let now = self.cx.clock.now();
        link.refund_local_first(self.counters, ops, &done, now);
        self.flush();
    }

    /// Refunds, in the store, every op of a request another shard refused.
    pub(super) fn refund_all_in_store(&mut self, ops: &[Op]) {
        let all: SmallVec<[usize; 2]> = (0..ops.len()).collect();
        self.refund_in_store(ops, &all);
    }

    fn apply(&mut self, flight: InFlight, replies: Vec<StoreReply>) {
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
        // The sync went last in the pipeline: its counts are the latest, and make the keys' state.
        let sync_at = (n_msgs + refunded).min(replies.len());
        let times = self.judged_now(now);
        let (link, keys) = self.link_and_keys();
        link.synced(keys, sync, &replies[sync_at..], times);
    }

    /// The times of a round trip that started at `started`, judged now.
    fn judged_now(&self, started: u64) -> TripTimes {
        let now = self.cx.clock.now();
        TripTimes { started, now }
    }

    /// The link, with the parts its ledger writes to.
    fn link_and_keys(&mut self) -> (&mut Link, ShardKeys<'_>) {
        let keys = ShardKeys {
            counters: &mut *self.counters,
            queues: &*self.queues,
        };
        (&mut *self.backing, keys)
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
            let (mut outcomes, action) = judge(&d, &evals);
            for ((o, op), reply) in outcomes.iter_mut().zip(&d.ops).zip(mine) {
                o.released = matches!(op.reserve, Reservation::Named(NamedHolds::Commit { .. }))
                    && reply.holds.released;
            }
            // With what the store counted; whatever is refunded leaves the local-first keys too.
            let times = self.judged_now(now);
            let (link, keys) = self.link_and_keys();
            link.read_local_first(keys, &d.ops, mine, &counted, times);
            match head {
                None => self.conclude(d, outcomes, action, Commit::InStore(counted), now, None),
                Some((op, enqueued, deadline, key)) => {
                    let w = Waiter {
                        msg: d,
                        op,
                        enqueued,
                        deadline,
                    };
                    self.judged_head(w, &key, outcomes, action, counted, now);
                }
            }
        }
    }

    /// A queue's head waiter back from the store, judged (`outcomes`, `action`): it waits again
    /// at this key, or moves on (to wait at another key, or answered), and the queue goes on.
    fn judged_head(
        &mut self,
        w: Waiter,
        key: &Key,
        outcomes: Outcomes,
        action: Action,
        counted: SmallVec<[usize; 2]>,
        now: u64,
    ) {
        self.backing.head_back(key);
        if w.msg.reply.is_closed() {
            self.queues.left();
            self.cx.stats.cancelled(1);
            self.refund_in_store(&w.msg.ops, &counted);
        } else {
            match action {
                Action::Wait(i) if i == w.op => {
                    self.refund_in_store(&w.msg.ops, &counted);
                    let retry = outcomes[i].retry_ns;
                    return self.requeue_head(w, key, now.saturating_add(retry));
                }
                // Moving on to wait at another key, or answered (then it leaves).
                action => {
                    if !matches!(action, Action::Wait(_)) {
                        self.queues.left();
                    }
                    let since = Some(w.queued());
                    let commit = Commit::InStore(counted);
                    self.conclude(w.msg, outcomes, action, commit, now, since);
                }
            }
        }
        self.service_queue(key, self.cx.clock.now());
    }

    /// Puts a head waiter back at the front of its queue, to be looked at again at `at`.
    fn requeue_head(&mut self, w: Waiter, key: &Key, at: u64) {
        let at = at.min(w.deadline);
        let params = w.msg.ops[w.op].params;
        let now = self.cx.clock.now();
        self.counters.slot(key, params, now, self.queues);
        self.queues.push_head(key, w, at);
    }
    /// Turns the store's answer to one op into the same evaluation the memory engine makes, and
    /// whether the store counted its hits.
    fn eval_stored(&mut self, op: &Op, reply: &StoreReply, now: u64) -> (Eval, bool) {
        let p = &op.params;
        if op.refund {
            return (reply.before.eval(p, now, 0), false);
        }
        if let Reservation::Counted(CountedHolds::Hold { hits, .. }) = op.reserve {
            return self.eval_check_holding(op, reply, hits, now);
        }
        let hits = op.hits;
        let (before, allowed) = (reply.before, reply.allowed);
        // Local-first hits Redis has not seen yet weigh on an exact decision of the same key.
        let unsynced = self.backing.unsynced(op, now);
        let before = if unsynced == 0 {
            before
        } else {
            with_hits(before, p, now, unsynced)
        };
        // Limitador's calls are judged beside the counter's named holds, as the store read them:
        // a `Reserve` as if it took its own hits too (the store judged it, and holds).
        let held = reply.holds.named;
        let mut e = match op.reserve {
            Reservation::Named(NamedHolds::Reserve { hits: own, .. }) => {
                beside(&before, p, now, 0, held.saturating_add(u64::from(own)))
            }
            _ => beside(&before, p, now, hits, held),
        };
        // Room for these hits (at least one) is room for one: the key is not full.
        let room = hits > 0 && !e.over;
        e = with_store_verdict(e, allowed.filter(|_| unsynced == 0), &op.reserve, allowed);
        let counted = match op.reserve {
            // Admitted, it holds in the store: taken back if its request is refused elsewhere.
            Reservation::Named(NamedHolds::Reserve { .. }) => allowed == Some(true),
            _ => hits > 0 && allowed.unwrap_or(true),
        };
        match op.reserve {
            Reservation::Named(NamedHolds::Reserve { .. }) if counted => {
                self.cx.stats.holds_made(1)
            }
            Reservation::Named(NamedHolds::Commit { .. }) if reply.holds.released => {
                self.cx.stats.holds_reported(1)
            }
            _ => {}
        }
        // Remember keys with no room left at all, until room comes back: one with no room for
        // a single hit, or one these hits, counted in full, took past its limit (as
        // envoyproxy/ratelimit's local cache remembers a key once it answers it over).
        let full = if counted && op.counts_in_full() && e.over {
            Some(before.add(p, now, hits).eval(p, now, 1))
        } else if room {
            None
        } else {
            Some(before.eval(p, now, 1))
        };
        if let Some(full) = full.filter(|f| f.over && f.retry_ns != u64::MAX) {
            self.backing.remember_full(op, now + full.retry_ns, now);
        }
        if let Reservation::Counted(CountedHolds::Release { hits }) = op.reserve {
            let h = reply.holds;
            self.cx.stats.holds_expired(u64::from(h.expired));
            if h.released {
                self.cx.stats.holds_reported(1);
            }
            let left = h.held.saturating_sub(u32::from(h.released));
            e = less_held(e, u64::from(left), hits);
        }
        // A `Commit` is usage counted unchecked: never over, so even one of no hits on a
        // counter reported past its limit ends its hold.
        if matches!(op.reserve, Reservation::Named(NamedHolds::Commit { .. })) {
            e.over = false;
        }
        (e, counted)
    }

    /// A check of a limit with `reserve`, on the store's answer: judged against what is used
    /// and held there; the store's verdict stands (it judged in microseconds), and an admitted
    /// check holds there already (refunded if its request is refused after all).
    fn eval_check_holding(
        &mut self,
        op: &Op,
        reply: &StoreReply,
        hits: u32,
        now: u64,
    ) -> (Eval, bool) {
        let h = reply.holds;
        self.cx.stats.holds_expired(u64::from(h.expired));
        let held = u64::from(h.held);
        let mut e = check_holding(&reply.before, &op.params, now, held, hits);
        let holds = reply.allowed == Some(true);
        if holds {
            self.cx.stats.holds_made(1);
        }
        e.over = !holds;
        if e.over {
            e.remaining = 0;
        }
        (e, holds)
    }
}

/// `e`, made from the store's count, with the verdict the store's script gave, `given` (none when
/// local hits it could not see weigh on the op): it stands (its arithmetic is in milliseconds or
/// microseconds). A `Reserve` the store refused, `allowed` false, holds nothing there, whatever
/// local hits say.
fn with_store_verdict(
    mut e: Eval,
    given: Option<bool>,
    reserve: &Reservation,
    allowed: Option<bool>,
) -> Eval {
    if let Some(allowed) = given {
        if allowed && e.over {
            e.over = false;
            e.remaining = 0;
        } else if !allowed && !e.over {
            e.over = true;
            e.remaining = 0;
        }
    }
    if matches!(reserve, Reservation::Named(NamedHolds::Reserve { .. })) && allowed == Some(false) {
        e.over = true;
        e.remaining = 0;
    }
    e
}
