//! One shard: owns the counters and the wait queues of the keys that hash to it.
//!
//! The shard lives on one thread and is used by one caller at a time (its task, or a caller on
//! the same thread deciding synchronously), so its tables need no lock. A request reaches the
//! shard as one message holding all of its ops for this shard; the shard decides them together,
//! so a request whose ops all live here is decided atomically. A message that must wait parks
//! in the FIFO of the key it waits for and is answered later through its reply channel.
//!
//! A shard is its parts, each a type owning its fields: [`Counters`] (the key table and what
//! guards it), [`Queues`] (the wait queues and the waiter budget) and its [`Mode`], memory alone
//! or a [`Link`] to a store (batch, round trips, breaker, local-first views). This file only
//! dispatches messages and timers; a message is decided by the parts borrowed together as a
//! [`Decider`](decide::Decider) (`decide.rs`, `wait.rs`, `through_store.rs`, `admin.rs`).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::clock::Clock;
use super::protocol::{Decide, Delivery, Msg, Reply};
use super::waiters::WaiterBudget;

mod admin;
mod counters;
mod decide;
mod link;
mod queues;
mod stats;
mod table;
#[cfg(test)]
mod tests;
mod through_store;
mod wait;

use counters::Counters;
pub(crate) use decide::refund_in_outcomes;
use decide::{Ambient, Decider};
pub use link::BreakerState;
pub(crate) use link::Done;
pub(crate) use link::{Link, Mode};
use queues::Queues;
pub use stats::{EngineStats, ShardCounts, ShardStats};

pub(crate) struct Shard {
    counters: Counters,
    queues: Queues,
    mode: Mode,
    cx: Ambient,
}

impl Shard {
    pub(crate) fn new(
        clock: Clock,
        budget: Arc<WaiterBudget>,
        stats: Arc<ShardStats>,
        mode: Mode,
        max_keys: usize,
    ) -> Shard {
        let now = clock.now();
        Shard {
            counters: Counters::new(max_keys, now, stats.clone()),
            queues: Queues::new(budget, stats.clone()),
            mode,
            cx: Ambient {
                clock,
                stats,
                draining: None,
                answered: None,
                held: None,
            },
        }
    }

    #[inline]
    fn decider(&mut self) -> Decider<'_> {
        Decider {
            counters: &mut self.counters,
            queues: &mut self.queues,
            mode: &mut self.mode,
            cx: &mut self.cx,
        }
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.cx.clock
    }

    /// Where the answers of the store's round trips come, for the shard's task to take (once).
    pub(crate) fn take_done_rx(&mut self) -> Option<mpsc::UnboundedReceiver<Done>> {
        match &mut self.mode {
            Mode::Store(link) => link.trips.done_rx.take(),
            Mode::Memory => None,
        }
    }

    /// When the shard must next look at its queues, sweep, or send to the store.
    pub(crate) fn next_wake(&self) -> u64 {
        let ev = self.queues.next_event().unwrap_or(u64::MAX);
        let send = match &self.mode {
            Mode::Store(link) => link.next_send(),
            Mode::Memory => u64::MAX,
        };
        ev.min(self.counters.next_sweep()).min(send)
    }

    /// After messages: due queue events, once a second the expiry sweep, and a round trip when
    /// one is due.
    pub(crate) fn tick(&mut self) {
        let now = self.cx.clock.now();
        self.decider().run_events(now);
        if now >= self.counters.next_sweep() {
            self.counters.sweep(now, &self.queues);
        }
        if matches!(&self.mode, Mode::Store(link) if link.due(now)) {
            self.decider().flush();
        }
    }

    /// Decides a message.
    #[inline]
    pub(crate) fn decide_any(&mut self, d: Decide) {
        self.decider().decide_any(d)
    }

    /// The answer a synchronous caller's message got now, or the channel it will come on.
    #[inline]
    pub(crate) fn take_answer(&mut self) -> Delivery {
        match (self.cx.answered.take(), self.cx.held.take()) {
            (Some(reply), _) => Delivery::Now(reply),
            (None, Some(rx)) => Delivery::Later(rx),
            // Every path answers or holds a message; were one to do neither, the caller sees the
            // shard as stopped rather than waiting forever.
            (None, None) => Delivery::Later(oneshot::channel::<Reply>().1),
        }
    }

    /// A round trip to the store is back.
    pub(crate) fn store_done(&mut self, done: Done) {
        self.decider().store_done(done)
    }

    /// Shutdown: answer every waiter now, admitting them or not, and queue no newcomer.
    pub(crate) fn drain(&mut self, admit: bool) {
        self.decider().drain(admit)
    }

    pub(crate) fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Decide(d) => self.decide_any(d),
            Msg::Refund {
                ops,
                in_store: true,
            } => self.decider().refund_all_in_store(&ops),
            Msg::Refund {
                ops,
                in_store: false,
            } => {
                let now = self.cx.clock.now();
                let mut decider = self.decider();
                for op in &ops {
                    decider.refund(op, now);
                }
            }
            Msg::Inspect { prefix, reply } => {
                let now = self.cx.clock.now();
                let keys = self.counters.inspect(prefix.as_deref(), &self.queues, now);
                let _ = reply.send(keys);
            }
            Msg::Drain { admit } => self.drain(admit),
            Msg::Cancelled { key } => self.decider().purge_cancelled(&key),
            Msg::Release { key, id, reply } => {
                let found = self.decider().release(key, id);
                let _ = reply.send(found);
            }
            Msg::LookUp { op, reply } => {
                let _ = reply.send(self.decider().look_up(&op));
            }
            Msg::Reset { op, delete, reply } => {
                let _ = reply.send(self.decider().reset(&op, delete));
            }
        }
    }
}
