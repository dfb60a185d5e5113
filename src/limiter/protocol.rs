//! The message protocol between callers and shards: every message a shard takes, and every
//! answer it gives.

use std::fmt;

use tokio::sync::oneshot;

use super::algorithm::{Params, State};
use super::key::Key;
use super::op::{refuses, Op, Outcomes, Role};
use super::saved::Save;
use super::store::{DeleteFuture, KeyInfo, StoreFuture};

/// What callers send a shard.
#[derive(Debug)]
pub(crate) enum Msg {
    Decide(Decide),
    /// Refunds what a request consumed here when another shard refused it.
    Refund {
        ops: Vec<Op>,
        /// Counted in the store rather than in the shard's table.
        in_store: bool,
    },
    /// Lists keys for `/debug`: every key, or the ones starting with the prefix.
    Inspect {
        prefix: Option<String>,
        reply: oneshot::Sender<Vec<KeyInfo>>,
    },
    /// Shutdown: answer every waiter now (admitting them or not) and stop queueing newcomers.
    Drain {
        admit: bool,
    },
    /// A caller waiting on this key went away: drop it from the queue now.
    Cancelled {
        key: Key,
    },
    /// Direct API: refund the hit admitted under `id`; answers whether it was found.
    Release {
        key: Key,
        id: u64,
        reply: oneshot::Sender<bool>,
    },
    /// Admin: the key's state, counting nothing (with a store, a read to finish).
    LookUp {
        op: Op,
        reply: oneshot::Sender<Peeking>,
    },
    /// The durable counters: a page of what changed since the last save (`saved.rs`).
    Save(Save),
    /// Admin: forget the key's state here; with `delete` and a store, answer the deletion of
    /// its store keys to wait for.
    Reset {
        op: Op,
        delete: bool,
        reply: oneshot::Sender<Deleting>,
    },
}

#[derive(Debug)]
pub(crate) struct Decide {
    pub(crate) ops: Vec<Op>,
    /// All ops of the request are in this message, so the shard can decide the request alone.
    pub(crate) whole: bool,
    pub(crate) global_shadow: bool,
    /// Whether an over-limit queued op may wait; when false it is refused like any other.
    pub(crate) may_wait: bool,
    pub(crate) reply: ReplyTo,
}

impl Decide {
    /// The verdict this message can give, from whether each of its ops is over: every path
    /// that answers a message (the counters, the store's answers, the local over-limit cache,
    /// a store that cannot decide) asks here, so a shadow op never refuses and nothing refuses
    /// under `global_shadow`. Joint ops are judged only when the message holds the whole
    /// request; the engine judges them across the parts otherwise.
    pub(crate) fn refuses(&self, over: impl IntoIterator<Item = bool>) -> bool {
        let whole = self.whole;
        let ops = self
            .ops
            .iter()
            .zip(over)
            .filter_map(|(op, over)| match op.role {
                Role::Joint(_) if !whole => None,
                role => Some((role, over)),
            });
        refuses(ops, self.global_shadow)
    }

    /// Whether no op of this message can refuse its request, however over: every limit in
    /// shadow mode, or `global_shadow`.
    pub(crate) fn never_refuses(&self) -> bool {
        self.global_shadow || self.ops.iter().all(|op| op.role == Role::Shadow)
    }
}

/// Where a message's answer goes.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    /// A caller on another thread, or one that is waiting.
    Caller(oneshot::Sender<Reply>),
    /// A caller on this thread, deciding synchronously: the answer is left in the shard for it.
    /// A message answered later (it waits in a queue, or for Redis) gets a channel first.
    InPlace,
}

impl ReplyTo {
    /// Whether the caller went away.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            ReplyTo::Caller(tx) => tx.is_closed(),
            ReplyTo::InPlace => false,
        }
    }
}

/// A synchronous caller's answer: now, or on a channel when its message is answered later.
#[derive(Debug)]
pub(crate) enum Delivery {
    Now(Reply),
    Later(oneshot::Receiver<Reply>),
}

/// A shard's reply to one message.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) outcomes: Outcomes,
    pub(crate) hits: Hits,
    pub(crate) waited_ns: u64,
    /// The request's verdict, when the message carried the whole request; a part's refusal
    /// otherwise (the engine judges the joint groups across the parts).
    pub(crate) refused: bool,
}

/// What became of the hits of a message's ops that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hits {
    /// Not counted: the message was refused, or answered without counting (fail-open, a part
    /// cancelled or refunded).
    NotCounted,
    /// Not counted: the message waited in a queue until its deadline.
    TimedOut,
    /// Counted in the shard's table (so a refund goes there).
    InMemory,
    /// Counted in the store (so a refund goes there).
    InStore,
    /// Not counted: the store could not decide (failure mode `fail_closed`), so the request fails.
    StoreFailed,
}

impl Reply {
    /// A refusal: it consumed nothing (but usage counted in full).
    pub(crate) fn refused(outcomes: Outcomes, waited_ns: u64) -> Reply {
        Reply {
            outcomes,
            hits: Hits::NotCounted,
            waited_ns,
            refused: true,
        }
    }

    /// Admitted without counting (the store is away and the failure mode is `fail_open`).
    pub(crate) fn admitted_uncounted(outcomes: Outcomes) -> Reply {
        Reply {
            outcomes,
            hits: Hits::NotCounted,
            waited_ns: 0,
            refused: false,
        }
    }

    /// Whether the shard consumed the hits of the ops that fit.
    pub(crate) fn committed(&self) -> bool {
        matches!(self.hits, Hits::InMemory | Hits::InStore)
    }

    pub(crate) fn timed_out(&self) -> bool {
        self.hits == Hits::TimedOut
    }

    pub(crate) fn failed(&self) -> bool {
        self.hits == Hits::StoreFailed
    }
}

/// What a look-up found of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookedUp {
    /// The state the key's next decision starts from (fresh when the key is unknown).
    pub state: State,
    /// Requests waiting in this replica's queue of the key.
    pub waiting: usize,
    /// Reservations the key holds (limits with `reserve`; the store's, with one).
    pub held: u64,
    /// The shard's time when it looked (ns since the epoch).
    pub now: u64,
}

/// A shard's answer to a look-up: what it holds, and with a store the read to finish it.
pub(crate) struct Peeking {
    pub(crate) here: LookedUp,
    pub(crate) store: Option<StorePeek>,
}

/// A look-up's read of the store, and what to add to the count it reads.
pub(crate) struct StorePeek {
    /// The store's read of the key.
    pub(crate) read: StoreFuture,
    /// This replica's local-first hits the store has not counted yet.
    pub(crate) unsynced: i64,
    /// The limit to add them with.
    pub(crate) params: Params,
}

/// A shard's answer to a reset: the deletion of the key's store keys to wait for, if any.
pub(crate) struct Deleting(pub(crate) Option<DeleteFuture>);

impl fmt::Debug for Peeking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peeking")
            .field("here", &self.here)
            .field("store", &self.store.is_some())
            .finish()
    }
}

impl fmt::Debug for Deleting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Deleting").field(&self.0.is_some()).finish()
    }
}
