//! One shard: owns the counters and the queues of the keys that hash to it.
//!
//! The shard lives on one thread and is used by one caller at a time (its task, or a caller on
//! the same thread deciding synchronously), so its tables need no lock. A request reaches the
//! shard as one message holding all of its ops for this shard; the shard decides them together,
//! so a request whose ops all live here is decided atomically. A message that must wait parks
//! in the FIFO of the key it waits for and is answered later through its reply channel.
//!
//! A shard is its parts, each a type owning its fields: [`Counters`] (the key table and what guards
//! it), [`Queues`] (the queues and the process's budget of waiters) and its [`Backing`], memory
//! alone or a [`Link`] to a store (batch, round trips, breaker, the ledger of hits the store has
//! not counted yet). This file only dispatches messages and timers; a message is decided by the
//! parts borrowed together as a [`Decider`] over the backing's type (`decide.rs`,
//! `queueing.rs`, `admin.rs` for both, `through_store.rs` for a link only). The durable
//! counters' side, a save's page and a start's restore, is `saving.rs`.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::algorithm::State;
use super::clock::Clock;
use super::key::Key;
use super::protocol::{Decide, Delivery, Msg, Reply};
use super::queue_budget::QueueBudget;

mod admin;
mod counters;
mod decide;
mod engine_stats;
mod holds;
mod link;
mod queueing;
mod queues;
mod saving;
mod stats;
mod table;
#[cfg(test)]
mod tests;
mod through_store;

use counters::Counters;
pub(crate) use decide::refund_in_outcomes;
use decide::{Ambient, Decider, Memory};
use holds::Holds;
pub use link::BreakerState;
pub(crate) use link::Done;
pub(crate) use link::Link;

/// What a shard's counters stand for: themselves alone, or a store's (through a link).
pub(crate) enum Backing {
    Memory,
    /// Boxed: memory keeps no link, so its shard stays small.
    Store(Box<Link>),
}

/// Runs `$body` with `$d`, the shard's parts borrowed as a decider over its backing: `$memory`
/// with memory alone, `$store` with a link (`$body` for both when one is given). A macro, not a
/// method taking a closure: the body is compiled once per backing type.
macro_rules! with_decider {
    ($shard:expr, |$d:ident| $body:expr) => {
        with_decider!($shard, |$d| memory => $body, store => $body)
    };
    ($shard:expr, |$d:ident| memory => $memory:expr, store => $store:expr) => {{
        let s = &mut *$shard;
        match &mut s.backing {
            Backing::Memory => {
                #[allow(unused_mut)]
                let mut $d = Decider {
                    counters: &mut s.counters,
                    holds: &mut s.holds,
                    queues: &mut s.queues,
                    backing: &mut Memory,
                    cx: &mut s.cx,
                };
                $memory
            }
            Backing::Store(link) => {
                #[allow(unused_mut)]
                let mut $d = Decider {
                    counters: &mut s.counters,
                    holds: &mut s.holds,
                    queues: &mut s.queues,
                    backing: &mut **link,
                    cx: &mut s.cx,
                };
                $store
            }
        }
    }};
}
pub use engine_stats::EngineStats;
pub use link::{LinkCounts, LinkStats};
use queues::Queues;
pub use stats::{ShardCounts, ShardStats};

pub(crate) struct Shard {
    counters: Counters,
    holds: Holds,
    queues: Queues,
    backing: Backing,
    cx: Ambient,
}

impl Shard {
    pub(crate) fn new(
        clock: Clock,
        budget: Arc<QueueBudget>,
        stats: Arc<ShardStats>,
        backing: Backing,
        max_keys: usize,
    ) -> Shard {
        let now = clock.now();
        Shard {
            counters: Counters::new(max_keys, now, stats.clone()),
            holds: Holds::new(max_keys, stats.clone()),
            queues: Queues::new(budget, stats.clone()),
            backing,
            cx: Ambient {
                clock,
                stats,
                draining: None,
                answered: None,
                later: None,
            },
        }
    }

    /// Runs `f` on the parts with the link to the store, when the shard has one.
    fn with_link(&mut self, f: impl FnOnce(&mut Decider<'_, Link>)) {
        if let Backing::Store(link) = &mut self.backing {
            f(&mut Decider {
                counters: &mut self.counters,
                holds: &mut self.holds,
                queues: &mut self.queues,
                backing: &mut **link,
                cx: &mut self.cx,
            });
        }
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.cx.clock
    }

    /// Where the answers of the store's round trips come, for the shard's task to take (once).
    pub(crate) fn take_done_rx(&mut self) -> Option<mpsc::UnboundedReceiver<Done>> {
        match &mut self.backing {
            Backing::Store(link) => link.trips.done_rx.take(),
            Backing::Memory => None,
        }
    }

    /// When the shard must next look at its queues, sweep, or send to the store.
    pub(crate) fn next_wake(&self) -> u64 {
        let ev = self.queues.next_event().unwrap_or(u64::MAX);
        let send = match &self.backing {
            Backing::Store(link) => link.next_send(),
            Backing::Memory => u64::MAX,
        };
        ev.min(self.counters.next_sweep()).min(send)
    }

    /// After messages: due queue events, once a second the expiry sweep, and a round trip when
    /// one is due.
    pub(crate) fn tick(&mut self) {
        let now = self.cx.clock.now();
        with_decider!(self, |d| d.run_events(now));
        if now >= self.counters.next_sweep() {
            self.counters.sweep(now, &self.queues);
            self.holds.sweep(now);
        }
        if matches!(&self.backing, Backing::Store(link) if link.due(now)) {
            self.with_link(|d| d.flush());
        }
    }

    /// Decides a message.
    #[inline]
    pub(crate) fn decide_any(&mut self, msg: Decide) {
        with_decider!(self, |d| memory => d.decide(msg), store => d.decide_via_store(msg))
    }

    /// The answer a synchronous caller's message got now, or the channel it will come on.
    #[inline]
    pub(crate) fn take_answer(&mut self) -> Delivery {
        match (self.cx.answered.take(), self.cx.later.take()) {
            (Some(reply), _) => Delivery::Now(reply),
            (None, Some(rx)) => Delivery::Later(rx),
            // Every path answers a message now or later; were one to do neither, the caller sees the
            // shard as stopped rather than waiting forever.
            (None, None) => Delivery::Later(oneshot::channel::<Reply>().1),
        }
    }

    /// A round trip to the store is back.
    pub(crate) fn store_done(&mut self, done: Done) {
        self.with_link(|d| d.store_done(done))
    }

    /// A key's state read back from the durable counters at start (`None`: forget the key).
    pub(crate) fn restore(&mut self, key: &Key, state: Option<State>, expires_s: u32) {
        let now = self.cx.clock.now();
        saving::restore(&mut self.counters, key, state, expires_s, now, &self.queues);
    }

    pub(crate) fn keys(&self) -> u64 {
        self.counters.len() as u64
    }

    /// Shutdown: answer every waiter now, admitting them or not, and queue no newcomer.
    pub(crate) fn drain(&mut self, admit: bool) {
        with_decider!(self, |d| d.drain(admit))
    }

    pub(crate) fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Decide(d) => self.decide_any(d),
            Msg::Refund {
                ops,
                in_store: true,
            } => self.with_link(|d| d.refund_all_in_store(&ops)),
            Msg::Refund {
                ops,
                in_store: false,
            } => {
                let now = self.cx.clock.now();
                with_decider!(self, |d| for op in &ops {
                    d.refund(op, now);
                })
            }
            Msg::Inspect { prefix, reply } => {
                let now = self.cx.clock.now();
                let keys = self.counters.inspect(prefix.as_deref(), &self.queues, now);
                let _ = reply.send(keys);
            }
            Msg::Drain { admit } => self.drain(admit),
            Msg::Cancelled { key } => with_decider!(self, |d| d.purge_cancelled(&key)),
            Msg::Release { key, id, reply } => {
                let found = with_decider!(self, |d| d.release(key, id));
                let _ = reply.send(found);
            }
            Msg::LookUp { op, reply } => {
                let _ = reply.send(with_decider!(self, |d| d.look_up(&op)));
            }
            Msg::Save(save) => saving::answer(&mut self.counters, save, self.cx.clock.now()),
            Msg::Reset { op, delete, reply } => {
                let _ = reply.send(with_decider!(self, |d| d.reset(&op, delete)));
            }
        }
    }
}
