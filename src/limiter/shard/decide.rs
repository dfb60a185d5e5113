//! Deciding a message: each op evaluated against the counters, the message judged as a whole, then
//! admitted (committed), refused, or parked in a queue. A [`Decider`] is the shard's parts borrowed
//! together for one message, with its backing `B`: the memory path is here, the queues' side in
//! `queueing.rs`, admin actions in `admin.rs`; the store's path in `through_store.rs` exists only
//! for `Decider<Link>`, so store-only code cannot run in memory mode. Where the memory path must
//! tell a backing something (hits committed or refunded, a queue head to decide, a look-up, a
//! reset), it calls the [`Hooks`], which [`Memory`] answers with nothing.

use std::sync::Arc;

use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::counters::Counters;
use super::holds::{Holds, NamedHold};
use super::queues::{Queued, Queues, Waiter};
use super::stats::ShardStats;
use crate::limiter::algorithm::{Eval, Params, State};
use crate::limiter::clock::Clock;
use crate::limiter::key::Key;
use crate::limiter::op::{CountedHolds, NamedHolds, Op, Outcome, Outcomes, Reservation, Role};
use crate::limiter::protocol::{Decide, Hits, Reply, ReplyTo, StorePeek};
use crate::limiter::store::DeleteFuture;

/// What the memory path tells the shard's backing, and asks of it. Memory alone answers every
/// hook with nothing; a link to a store keeps its ledger, decides queue heads in the store, reads
/// and deletes the store's keys.
pub(super) trait Hooks: Sized {
    /// Whether the head of `key`'s queue is being decided out in the store.
    fn head_out(&self, _key: &Key) -> bool {
        false
    }

    /// `hits` of `op` committed here (negative: refunded).
    fn record(&mut self, _op: &Op, _hits: i64, _now: u64) {}

    /// Takes the head waiter of `key` to decide it elsewhere; gives it back when it is decided
    /// here.
    fn take_head(
        &mut self,
        w: Waiter,
        _key: &Key,
        _now: u64,
        _stats: &ShardStats,
    ) -> Option<Waiter> {
        Some(w)
    }

    /// A look-up's read of the store.
    fn peek(&self, _op: &Op, _now: u64) -> Option<StorePeek> {
        None
    }

    /// A reset: forgets the key, and with `delete` starts deleting its store keys.
    fn forget(&mut self, _op: &Op, _delete: bool, _now: u64) -> Option<DeleteFuture> {
        None
    }

    /// Refunds what the ops at `done` of a message counted in the store.
    fn refund_counted(_d: &mut Decider<'_, Self>, _ops: &[Op], _done: &[usize]) {}
}

/// No backing: the shard's counters are the only ones.
pub(super) struct Memory;

impl Hooks for Memory {}

/// What a shard keeps besides its counters, queues and mode: its clock and metrics, whether it
/// is draining, and the answer for a synchronous caller.
pub(super) struct Ambient {
    pub(super) clock: Clock,
    pub(super) stats: Arc<ShardStats>,
    /// Shutdown: every waiter is answered now (admitted when `Some(true)`), none queues.
    pub(super) draining: Option<bool>,
    /// The answer to a synchronous caller's message ([`ReplyTo::InPlace`]).
    pub(super) answered: Option<Reply>,
    /// Where a synchronous caller whose message is answered later waits for its answer.
    pub(super) later: Option<oneshot::Receiver<Reply>>,
}

/// The shard's parts, borrowed together to decide one message, over its backing `B` (`Memory`,
/// or a `Link` to the store).
///
/// Its methods are split by path, on purpose, each file one way a message goes: judging and
/// committing here, waiting in `queueing.rs`, look-ups and resets in `admin.rs`, and, for a
/// `Decider<'_, Link>` only, round trips to the store in `through_store.rs`.
pub(super) struct Decider<'a, B> {
    pub(super) counters: &'a mut Counters,
    pub(super) holds: &'a mut Holds,
    pub(super) queues: &'a mut Queues,
    pub(super) backing: &'a mut B,
    pub(super) cx: &'a mut Ambient,
}

/// (op index, next state, the key's position in the table if it has one) of the ops of a
/// message that fit, to store if the message is admitted.
pub(super) type Scratch = SmallVec<[(usize, State, Option<usize>); 2]>;

/// A message evaluated against the table, nothing committed yet.
pub(super) struct Evaluated {
    pub(super) outcomes: Outcomes,
    pub(super) scratch: Scratch,
    pub(super) action: Action,
}

/// What a message does, once judged: the request's verdict, or waiting for room first.
pub(super) enum Action {
    Admit,
    Refuse,
    /// Wait in the queue of op `n`'s key.
    Wait(usize),
}

/// Where the hits of an admitted message are counted.
pub(super) enum Commit {
    /// In the shard's table: these next states, stored when the message is admitted.
    Memory(Scratch),
    /// Already in Redis: these ops (by index) were counted, and are refunded unless admitted.
    InStore(SmallVec<[usize; 2]>),
}

/// What the message as a whole does, from each op's evaluation and whether a queue blocks it.
pub(super) fn judge(d: &Decide, evals: &[(Eval, bool)]) -> (Outcomes, Action) {
    // A binding op over its limit waits for room instead of refusing, when it may. Usage
    // counted in full never waits: it is counted already.
    let waits = |op: &Op, e: &Eval| {
        d.may_wait
            && op.queue.is_some()
            && e.retry_ns != u64::MAX
            && !d.global_shadow
            && !op.counts_in_full()
    };
    let mut outcomes: Outcomes = SmallVec::with_capacity(evals.len());
    let mut wait: Option<usize> = None;
    for (i, (op, (e, blocked))) in d.ops.iter().zip(evals).enumerate() {
        outcomes.push(Outcome {
            over: e.over,
            remaining: e.remaining,
            reset_ns: e.reset_ns,
            retry_ns: e.retry_ns,
            blocked: *blocked,
            released: false,
            past: e.past,
        });
        if op.role == Role::Binding && (e.over || *blocked) && waits(op, e) {
            wait.get_or_insert(i);
        }
    }
    // A binding op that may wait does not refuse the request (yet).
    let over = d
        .ops
        .iter()
        .zip(evals)
        .map(|(op, (e, blocked))| match op.role {
            Role::Binding => (e.over || *blocked) && !waits(op, e),
            Role::Joint(_) | Role::Shadow => e.over,
        });
    let action = if d.refuses(over) {
        Action::Refuse
    } else if let Some(i) = wait {
        Action::Wait(i)
    } else {
        Action::Admit
    };
    (outcomes, action)
}

impl<B: Hooks> Decider<'_, B> {
    /// Delivers a message's answer; false when its caller went away. Always inlined: on the
    /// synchronous path it is one store into `answered`, and a call would copy the reply twice.
    #[inline(always)]
    pub(super) fn answer(&mut self, to: ReplyTo, reply: Reply) -> bool {
        match to {
            ReplyTo::Caller(tx) => tx.send(reply).is_ok(),
            ReplyTo::InPlace => {
                self.cx.answered = Some(reply);
                true
            }
        }
    }

    /// A message answered later (it waits in a queue, or for the store): a synchronous caller
    /// gets a channel to wait on.
    pub(super) fn answer_later(&mut self, d: &mut Decide) {
        if matches!(d.reply, ReplyTo::InPlace) {
            let (tx, rx) = oneshot::channel();
            d.reply = ReplyTo::Caller(tx);
            self.cx.later = Some(rx);
        }
    }

    /// Whether someone waits for `op`'s key: in its queue, or at its head out in the store.
    pub(super) fn has_waiters(&self, op: &Op) -> bool {
        self.queues.has_waiters(&op.key) || self.backing.head_out(&op.key)
    }

    pub(super) fn decide(&mut self, d: Decide) {
        let now = self.cx.clock.now();
        // Refunds first: capacity refunded goes to the head of the queue before anyone else.
        for op in d.ops.iter().filter(|o| o.refund) {
            self.refund(op, now);
        }
        // Waiters of these keys go before this newcomer, judged by its limit if it is higher.
        for i in 0..d.ops.len() {
            if d.ops[i].queue.is_some() && self.has_waiters(&d.ops[i]) {
                let key = d.ops[i].key.clone();
                self.queues.raise_limit(&key, &d.ops[i].params);
                self.service_queue(&key, now);
            }
        }
        self.settle(d, now, None, None);
    }

    /// Evaluates a message (a newcomer, or a waiter taken off the head of `head_of`'s queue) and
    /// answers it, commits it, or parks it.
    pub(super) fn settle(
        &mut self,
        d: Decide,
        now: u64,
        head_of: Option<usize>,
        since: Option<Queued>,
    ) {
        let Evaluated {
            outcomes,
            scratch,
            action,
        } = self.evaluate(&d, now, head_of);
        self.conclude(d, outcomes, action, Commit::Memory(scratch), now, since);
    }

    /// Acts on what the message does: commits and answers, answers a refusal, or parks the message in a
    /// queue. What was already counted (in Redis) is refunded unless the message is admitted.
    pub(super) fn conclude(
        &mut self,
        d: Decide,
        outcomes: Outcomes,
        action: Action,
        commit: Commit,
        now: u64,
        since: Option<Queued>,
    ) {
        let action = match action {
            Action::Wait(_) if self.cx.draining.is_some() => Action::Refuse,
            v => v,
        };
        if !matches!(action, Action::Admit) {
            // Usage counted in full stays counted; the rest of the message consumes nothing.
            match &commit {
                Commit::InStore(done) => B::refund_counted(self, &d.ops, done),
                Commit::Memory(scratch) => self.commit_in_full(&d.ops, scratch, now),
            }
        }
        match action {
            Action::Admit => self.admit(d, outcomes, &commit, now, since),
            Action::Refuse => {
                let mut outcomes = outcomes;
                refund_in_outcomes(&d.ops, &mut outcomes);
                self.counters.count_denied(&d.ops, now);
                self.counters.protect(&d.ops, &outcomes, now);
                self.answer(
                    d.reply,
                    Reply::refused(
                        outcomes,
                        since.map_or(0, |q| now.saturating_sub(q.enqueued)),
                    ),
                );
            }
            Action::Wait(i) => self.park(d, outcomes, i, now, since),
        }
    }

    /// Commits an admitted message (unless counted already in the store) and answers it; if its
    /// caller went away meanwhile, refunds what it counted.
    fn admit(
        &mut self,
        d: Decide,
        outcomes: Outcomes,
        commit: &Commit,
        now: u64,
        since: Option<Queued>,
    ) {
        if let Commit::Memory(scratch) = commit {
            self.commit(&d.ops, scratch, now);
        }
        let waited = since.map_or(0, |q| now.saturating_sub(q.enqueued));
        let reply = Reply {
            outcomes,
            hits: match commit {
                Commit::Memory(_) => Hits::InMemory,
                Commit::InStore(_) => Hits::InStore,
            },
            waited_ns: waited,
            refused: false,
        };
        if since.is_some() {
            self.cx.stats.admitted_after(waited);
        }
        if !self.answer(d.reply, reply) {
            // The caller left between our decision and the answer: consume nothing.
            match commit {
                Commit::Memory(_) => {
                    for op in d.ops.iter().filter(|o| !o.refund && !o.counts_in_full()) {
                        self.refund(op, now);
                    }
                }
                Commit::InStore(done) => B::refund_counted(self, &d.ops, done),
            }
        }
    }

    /// Evaluates every op against the table (and against earlier ops of the same message on the
    /// same key), and decides what the message as a whole should do.
    pub(super) fn evaluate(&mut self, d: &Decide, now: u64, head_of: Option<usize>) -> Evaluated {
        let mut evals: SmallVec<[(Eval, bool); 2]> = SmallVec::with_capacity(d.ops.len());
        // Ops that fit, in order; later ops on one key see earlier ones.
        let mut scratch = Scratch::new();
        // Commits whose hold is there to end.
        let mut released: SmallVec<[usize; 1]> = SmallVec::new();
        for (i, op) in d.ops.iter().enumerate() {
            let earlier = scratch
                .iter()
                .rev()
                .find(|(j, ..)| d.ops[*j].key == op.key)
                .map(|&(_, s, at)| (Some(s), at));
            let (base, at) = earlier.unwrap_or_else(|| {
                let at = self.counters.find(&op.key);
                let state = at
                    .map(|at| self.counters.state(at))
                    .filter(|s| s.fits(&op.params));
                (state, at)
            });
            let base = base.unwrap_or_else(|| State::fresh(&op.params, now));
            let e = self.eval_op(op, &base, now);
            if let Reservation::Named(NamedHolds::Commit { id }) = op.reserve {
                if self.holds.named_hold(&op.key, id, now).is_some() {
                    released.push(i);
                }
            }
            if op.counts_in_full() {
                // Counted whatever the action, past the limit if need be.
                let next = if e.over {
                    base.add(&op.params, now, op.hits)
                } else {
                    e.next
                };
                scratch.push((i, next, at));
                evals.push((e, false));
                continue;
            }
            let blocked = self.is_blocked(op, i, head_of);
            if !(e.over || blocked || op.refund) {
                scratch.push((i, e.next, at));
            }
            evals.push((e, blocked));
        }
        let (mut outcomes, action) = judge(d, &evals);
        for i in released {
            outcomes[i].released = true;
        }
        Evaluated {
            outcomes,
            scratch,
            action,
        }
    }

    /// `op` on `base` at `now`, beside the holds of its key where its reservation says so.
    fn eval_op(&mut self, op: &Op, base: &State, now: u64) -> Eval {
        let (key, p) = (&op.key, &op.params);
        match op.reserve {
            Reservation::Counted(CountedHolds::Hold { hits, .. }) => {
                let held = self.holds.held(key, p, now);
                check_holding(base, p, now, held, hits)
            }
            Reservation::Counted(CountedHolds::Release { hits }) => {
                // What is left once this report released one hold.
                let held = self.holds.held(key, p, now).saturating_sub(1);
                let e = base.eval(p, now, op.hits);
                less_held(e, held, hits)
            }
            Reservation::Named(NamedHolds::Reserve { hits, .. }) => {
                let held = self.holds.named(key, p, now);
                beside(base, p, now, 0, held + u64::from(hits))
            }
            Reservation::Named(NamedHolds::Commit { id }) => {
                // What is left once this commit ended its hold. Usage counted unchecked, it is
                // never over, so even one of no hits on a counter reported past its limit ends
                // its hold.
                let own = self.holds.named_hold(key, id, now).map_or(0, u64::from);
                let held = self.holds.named(key, p, now).saturating_sub(own);
                Eval {
                    over: false,
                    ..beside(base, p, now, op.hits, held)
                }
            }
            Reservation::Named(NamedHolds::Beside) => {
                let held = self.holds.named(key, p, now);
                beside(base, p, now, op.hits, held)
            }
            Reservation::None if op.refund => base.eval(p, now, 0),
            Reservation::None => base.eval(p, now, op.hits),
        }
    }

    /// Returns `op.hits` to its key and lets the queue head take them.
    pub(super) fn refund(&mut self, op: &Op, now: u64) {
        match op.reserve {
            Reservation::Counted(CountedHolds::Hold { .. }) => {
                self.holds.withdraw(&op.key, &op.params, now)
            }
            Reservation::Named(NamedHolds::Reserve { id, .. }) => {
                self.holds.end_named(&op.key, &op.params, now, id, false);
            }
            _ => {}
        }
        self.backing.record(op, -(op.hits as i64), now);
        if !self.counters.refund(&op.key, &op.params, now, op.hits) {
            return;
        }
        if self.queues.has_key(&op.key) {
            let key = op.key.clone();
            self.service_queue(&key, now);
        }
    }

    /// Stores the usage of a message that is not admitted but counts in full.
    fn commit_in_full(&mut self, ops: &[Op], scratch: &Scratch, now: u64) {
        if ops.iter().any(Op::counts_in_full) {
            let kept: Scratch = scratch
                .iter()
                .filter(|(i, ..)| ops[*i].counts_in_full())
                .copied()
                .collect();
            self.commit(ops, &kept, now);
        }
    }

    /// A newcomer does not pass the waiters of a queued key, even if capacity is free.
    pub(super) fn is_blocked(&self, op: &Op, i: usize, head_of: Option<usize>) -> bool {
        op.queue.is_some() && head_of != Some(i) && !op.refund && self.has_waiters(op)
    }

    /// Stores the next states of an admitted message: first into the entries found when it was
    /// evaluated, then new keys (whose insertion may evict others and move entries).
    pub(super) fn commit(&mut self, ops: &[Op], scratch: &Scratch, now: u64) {
        for &(i, state, _) in scratch {
            let op = &ops[i];
            self.backing.record(op, op.hits as i64, now);
            match op.reserve {
                Reservation::None => {}
                Reservation::Counted(CountedHolds::Hold { for_ms, .. }) => {
                    self.holds.hold(&op.key, &op.params, now, for_ms)
                }
                Reservation::Counted(CountedHolds::Release { .. }) => {
                    self.holds.release(&op.key, &op.params, now)
                }
                Reservation::Named(NamedHolds::Reserve { hits, for_ms, id }) => {
                    // Until `for_ms` passes or the key's window ends, whichever is first.
                    let window = state.eval(&op.params, now, 0).reset_ns;
                    let until = now.saturating_add((u64::from(for_ms) * 1_000_000).min(window));
                    let named = NamedHold { id, hits, until };
                    (self.holds).hold_named(&op.key, &op.params, now, named);
                }
                Reservation::Named(NamedHolds::Commit { id }) => {
                    self.holds.end_named(&op.key, &op.params, now, id, true);
                }
                Reservation::Named(NamedHolds::Beside) => {}
            }
        }
        for &(i, state, at) in scratch {
            let op = &ops[i];
            if let Some(at) = at {
                self.counters.set(at, state, &op.params, now);
            }
            if let Some(id) = op.grant {
                self.counters.remember_grant(id, op, now);
            }
        }
        for &(i, state, _) in scratch.iter().filter(|(.., at)| at.is_none()) {
            let op = &ops[i];
            self.counters
                .put(&op.key, state, &op.params, now, self.queues);
        }
    }
}

/// A check of a limit with `reserve`, on `base` at `now` with `held` reservations of `hits`
/// each: judged as if it took its own and every held reservation's hits; stores nothing.
pub(super) fn check_holding(base: &State, p: &Params, now: u64, held: u64, hits: u32) -> Eval {
    let own = u64::from(hits);
    let e = base.eval(p, now, held.saturating_mul(own).saturating_add(own));
    Eval {
        next: base.eval(p, now, 0).next,
        ..e
    }
}

/// `hits` on `base` at `now` beside `held` hits held: over, remaining and past as if it took the
/// held hits too; the state to store has its own hits alone.
pub(super) fn beside(base: &State, p: &Params, now: u64, hits: u64, held: u64) -> Eval {
    let e = base.eval(p, now, hits);
    if held == 0 {
        return e;
    }
    Eval {
        next: e.next,
        ..base.eval(p, now, hits.saturating_add(held))
    }
}

/// `e` of a report, its `remaining` less what `held` reservations of `hits` each hold.
pub(super) fn less_held(e: Eval, held: u64, hits: u32) -> Eval {
    let held = u32::try_from(held.saturating_mul(u64::from(hits))).unwrap_or(u32::MAX);
    Eval {
        remaining: e.remaining.saturating_sub(held),
        ..e
    }
}

/// A refused message's ops that fit report what is left without their hits, which were not
/// counted (usage counted in full excepted).
pub(crate) fn refund_in_outcomes(ops: &[Op], outcomes: &mut [Outcome]) {
    for (op, out) in ops.iter().zip(outcomes.iter_mut()) {
        if !(out.over || out.blocked || op.refund || op.counts_in_full()) {
            // A check's hold was not made either.
            let hits = match op.reserve {
                Reservation::Counted(CountedHolds::Hold { hits, .. }) => hits,
                _ => u32::try_from(op.hits).unwrap_or(u32::MAX),
            };
            out.remaining = out.remaining.saturating_add(hits);
        }
    }
}
