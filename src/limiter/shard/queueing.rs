//! Deciding with the queues: FIFO per key, served as capacity comes back, timed out,
//! cancelled or drained.

use super::decide::{Action, Decider, Evaluated, Hooks};
use super::queues::{Queued, Waiter};
use crate::limiter::algorithm::State;
use crate::limiter::key::Key;
use crate::limiter::op::{Op, Outcomes};
use crate::limiter::protocol::{Decide, Hits, Reply};

impl<B: Hooks> Decider<'_, B> {
    /// Answers what can be answered at the head of `key`'s queue: cancelled and timed-out
    /// waiters leave, waiters that fit are admitted in arrival order.
    pub(super) fn service_queue(&mut self, key: &Key, now: u64) {
        while let Some(w) = self.queues.pop_head(key) {
            if w.msg.reply.is_closed() {
                self.queues.left();
                self.cx.stats.cancelled(1);
                continue;
            }
            if let Some(admit) = self.cx.draining {
                self.queues.left();
                self.answer_drained(w, admit, now);
                continue;
            }
            if now >= w.deadline {
                self.queues.left();
                self.cx.stats.timed_out();
                self.time_out(w, now);
                continue;
            }
            // With a store, the store decides the head; newcomers queue behind it meanwhile.
            let Some(w) = self.backing.take_head(w, key, now, &self.cx.stats) else {
                return;
            };
            let Evaluated {
                outcomes, action, ..
            } = self.evaluate(&w.msg, now, Some(w.op));
            match action {
                Action::Wait(i) if i == w.op => {
                    // Still the head, still waiting: look again when it may fit or must give up.
                    let at = w.deadline.min(now.saturating_add(outcomes[i].retry_ns));
                    self.queues.push_head(key, w, at);
                    return;
                }
                Action::Wait(_) => {
                    // Its own key has room now, but another queued key of the request has not:
                    // it moves on to wait there.
                    let since = Some(w.queued());
                    self.settle(w.msg, now, None, since);
                }
                Action::Admit | Action::Refuse => {
                    self.queues.left();
                    let since = Some(w.queued());
                    self.settle(w.msg, now, Some(w.op), since);
                }
            }
        }
    }

    /// Removes waiters whose callers went away, wherever they are in the queue.
    pub(super) fn purge_cancelled(&mut self, key: &Key) {
        if !self.queues.has_key(key) {
            return;
        }
        self.queues.purge_closed(key);
        // The new head may fit now.
        let now = self.cx.clock.now();
        self.service_queue(key, now);
    }

    fn time_out(&mut self, w: Waiter, now: u64) {
        self.counters.count_denied(&w.msg.ops, now);
        let mut outcomes = self.evaluate(&w.msg, now, Some(w.op)).outcomes;
        for o in outcomes.iter_mut() {
            if o.blocked || o.over {
                o.over = true;
                o.remaining = 0;
            }
        }
        self.answer_waiter(w, outcomes, Hits::TimedOut, now);
    }

    fn answer_drained(&mut self, w: Waiter, admit: bool, now: u64) {
        let Evaluated {
            mut outcomes,
            scratch,
            ..
        } = self.evaluate(&w.msg, now, Some(w.op));
        if admit {
            self.commit(&w.msg.ops, &scratch, now);
            for o in outcomes.iter_mut() {
                o.over = false;
                o.blocked = false;
            }
            let hits = Hits::InMemory;
            return self.answer_waiter(w, outcomes, hits, now);
        }
        self.answer_waiter(w, outcomes, Hits::NotCounted, now);
    }

    /// Answers a waiter with how long it waited; refused, the op it waited for is reported
    /// over, whatever its count says now.
    fn answer_waiter(&mut self, w: Waiter, mut outcomes: Outcomes, hits: Hits, now: u64) {
        if hits != Hits::InMemory {
            outcomes[w.op].over = true;
            outcomes[w.op].remaining = 0;
        }
        let waited_ns = now.saturating_sub(w.enqueued);
        let reply = Reply {
            outcomes,
            hits,
            waited_ns,
            refused: hits != Hits::InMemory,
        };
        self.answer(w.msg.reply, reply);
    }

    /// Looks again at the queues whose events are due.
    pub(super) fn run_events(&mut self, now: u64) {
        while let Some(key) = self.queues.pop_due(now) {
            self.service_queue(&key, now);
        }
    }

    pub(super) fn drain(&mut self, admit: bool) {
        self.cx.draining = Some(admit);
        let now = self.cx.clock.now();
        for k in self.queues.keys() {
            self.service_queue(&k, now);
        }
    }

    /// Parks a message in the queue of op `i`'s key, or refuses it when there is no room to wait.
    pub(super) fn park(
        &mut self,
        d: Decide,
        mut outcomes: Outcomes,
        i: usize,
        now: u64,
        since: Option<Queued>,
    ) {
        let op = &d.ops[i];
        let spec = op.queue.expect("waiting op has a queue");
        let Queued { enqueued, deadline } = since.unwrap_or(Queued {
            enqueued: now,
            deadline: now.saturating_add(spec.max_wait.as_nanos() as u64),
        });
        let is_new = since.is_none();
        // Over its limit, the op itself is admitted no sooner than its retry time (the state
        // that says so may live in the store, not in the table).
        let at_least = if outcomes[i].over {
            outcomes[i].retry_ns
        } else {
            0
        };
        if is_new && !self.room_to_wait(op, now, deadline, at_least) {
            self.cx.stats.queue_full();
            self.counters.count_denied(&d.ops, now);
            self.counters.protect(&d.ops, &outcomes, now);
            for o in outcomes.iter_mut() {
                if o.blocked {
                    o.over = true;
                    o.remaining = 0;
                }
            }
            self.answer(d.reply, Reply::refused(outcomes, 0));
            return;
        }
        let key = op.key.clone();
        let params = op.params;
        let mut d = d;
        // Usage counted in full was counted on arrival: it waits as a check.
        for o in d.ops.iter_mut().filter(|o| o.counts_in_full()) {
            o.hits = 0;
        }
        self.answer_later(&mut d);
        self.counters.slot(&key, params, now, self.queues);
        let at = deadline.min(now.saturating_add(outcomes[i].retry_ns));
        let w = Waiter {
            msg: d,
            op: i,
            enqueued,
            deadline,
        };
        self.queues.push_back(key, w, at, is_new);
    }

    /// Whether a newcomer may join the queue of `op`'s key: there is room in it and in the
    /// process (taking its place there), and it can be admitted before `deadline` at all (predicted from the window and the
    /// hits already waiting ahead of it, and no sooner than `at_least` from now).
    fn room_to_wait(&mut self, op: &Op, now: u64, deadline: u64, at_least: u64) -> bool {
        let spec = op.queue.expect("queued op");
        let (ahead_len, ahead_hits, state) = match self.counters.find(&op.key) {
            None => (0, 0, State::fresh(&op.params, now)),
            Some(at) => {
                let (len, hits) = self.queues.ahead(&op.key);
                let s = Some(self.counters.state(at))
                    .filter(|s| s.fits(&op.params))
                    .unwrap_or_else(|| State::fresh(&op.params, now));
                (len, hits, s)
            }
        };
        if ahead_len >= spec.max_waiting as usize {
            return false;
        }
        let in_time = match state.min_wait(&op.params, now, ahead_hits + op.hits) {
            Some(w) => now.saturating_add(w.max(at_least)) <= deadline,
            None => false,
        };
        // Last, so a place in the process-wide budget is taken only by a waiter that queues.
        in_time && self.queues.take_place()
    }
}
