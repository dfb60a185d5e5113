//! Algorithms (time is a parameter), shard actors and their queues, and the engine handle
//! that routes a request's ops to the shards owning their keys. The vocabulary of a decision is
//! in `op`, the messages between callers and shards in `protocol`.

mod actor;
mod algorithm;
mod clock;
pub mod key;
mod op;
mod protocol;
mod queue_budget;
mod same_thread;
mod saved;
mod shard;
mod spread;
mod store;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

pub use algorithm::{Eval, Params, State, Tat};
pub use clock::{Clock, ManualClock};
#[cfg(test)]
pub(crate) use op::test_op;
pub use op::{
    hold_id, refuses, CountedHolds, Counting, JointGroup, NamedHolds, Op, Outcome, Outcomes,
    Reservation, Role,
};
pub use protocol::LookedUp;
use protocol::{Decide, Delivery, Msg, ReplyTo};
use same_thread::{find_on_this_thread, OnThisThread, SameThreadShard};
use saved::Save;
pub use saved::Saved;
use shard::{Backing, Link, Shard};
pub use shard::{BreakerState, EngineStats, LinkCounts, LinkStats, ShardCounts, ShardStats};
pub use store::{
    DeleteFuture, Denied, FailureMode, HoldReply, KeyInfo, ScanFuture, SharedStore, Store,
    StoreError, StoreFuture, StoreOp, StorePolicy, StoreReply,
};

use key::{shard_of, Key};
use queue_budget::QueueBudget;

/// What the engine says about a whole request.
#[derive(Debug, Default)]
pub struct Decision {
    /// In the order of the ops given.
    pub outcomes: Outcomes,
    pub waited_ns: u64,
    pub timed_out: bool,
    /// The request's verdict ([`refuses`]): refused requests consumed nothing (but usage
    /// counted in full).
    pub refused: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("overloaded: shard queue is full")]
    Overloaded,
    #[error("shard stopped")]
    Stopped,
    #[error("store unavailable")]
    Unavailable,
    /// An admin look-up or reset could not reach the store (the message says why).
    #[error("{0}")]
    Store(String),
}

/// How the engine is laid out over its shards, and what they hold at most.
#[derive(Debug, Clone, Copy)]
pub struct EngineSizes {
    /// Shard actors (at least one); keys are spread over them by their hash.
    pub shards: usize,
    /// Messages a shard may have waiting before callers are shed ([`EngineError::Overloaded`]).
    pub messages: usize,
    /// Requests waiting in the shards' queues, in all.
    pub max_waiters: usize,
    /// Keys held in memory, in all (spread over the shards; a key flood evicts past it).
    pub max_keys: usize,
}

/// A cheap `Clone` handle to the shard actors. A request whose ops live on several shards is
/// decided by the methods in `spread.rs`, kept apart on purpose: the path of one shard is here.
#[derive(Clone, Debug)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

#[derive(Debug)]
struct EngineInner {
    /// Tells this engine's shards apart from another engine's on the same thread.
    id: u64,
    senders: Vec<mpsc::Sender<Msg>>,
    clock: Clock,
    stats: Vec<Arc<ShardStats>>,
    /// Each shard's link's stats, kept in memory mode too (the Redis families read zeros).
    links: Vec<Arc<LinkStats>>,
    /// The store the shards count in, and how long a listing of it may take.
    store: Option<Listing>,
}

/// The store listed by [`Engine::stored_first_hits`].
struct Listing {
    store: Arc<dyn Store>,
    deadline: std::time::Duration,
}

impl std::fmt::Debug for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.store.name())
    }
}

/// A shard actor not yet started: the server spawns it on the runtime it belongs to.
pub struct ShardTask {
    engine: u64,
    index: usize,
    shard: Shard,
    rx: mpsc::Receiver<Msg>,
}

impl ShardTask {
    /// Keys the shard holds.
    pub fn keys(&self) -> u64 {
        self.shard.keys()
    }

    /// The shard's task. It stays on the thread it starts on (the future is not `Send`: spawn it
    /// with `tokio::task::spawn_local`), and callers on that thread decide synchronously.
    pub async fn run(self) {
        let cell = Rc::new(RefCell::new(SameThreadShard::new(self.shard, self.rx)));
        let _listed = OnThisThread::new(self.engine, self.index, cell.clone());
        actor::run(cell).await
    }
}

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

impl Engine {
    /// `shards` actors with `capacity` queued messages each and at most `max_waiters` queued
    /// requests in all.
    pub fn new(
        shards: usize,
        capacity: usize,
        max_waiters: usize,
        clock: Clock,
    ) -> (Engine, Vec<ShardTask>) {
        let sizes = EngineSizes {
            shards,
            messages: capacity,
            max_waiters,
            max_keys: usize::MAX,
        };
        Self::with_store(sizes, clock, None)
    }

    /// Like [`Engine::new`], of `sizes`, deciding through a shared store (Redis) when `store` is
    /// given, used as its policy says.
    pub fn with_store(
        sizes: EngineSizes,
        clock: Clock,
        store: Option<SharedStore>,
    ) -> (Engine, Vec<ShardTask>) {
        let EngineSizes {
            shards,
            messages,
            max_waiters,
            max_keys,
        } = sizes;
        let shards = shards.max(1);
        let id = NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed);
        let budget = Arc::new(QueueBudget::new(max_waiters));
        let mut senders = Vec::with_capacity(shards);
        let mut tasks = Vec::with_capacity(shards);
        let mut stats = Vec::with_capacity(shards);
        let mut links = Vec::with_capacity(shards);
        for i in 0..shards {
            let (tx, rx) = mpsc::channel(messages.max(1));
            let st = Arc::new(ShardStats::default());
            let link_stats = Arc::new(LinkStats::default());
            senders.push(tx);
            let backing = match &store {
                Some(SharedStore { store, policy }) => Backing::Store(Box::new(Link::new(
                    store.clone(),
                    policy.clone(),
                    i,
                    shards,
                    max_keys / shards,
                    link_stats.clone(),
                ))),
                None => Backing::Memory,
            };
            tasks.push(ShardTask {
                engine: id,
                index: i,
                shard: Shard::new(
                    clock.clone(),
                    budget.clone(),
                    st.clone(),
                    backing,
                    max_keys / shards,
                ),
                rx,
            });
            stats.push(st);
            links.push(link_stats);
        }
        // A listing is off the request path: a second at least, whatever the round trips' deadline.
        let listing = |SharedStore { store, policy }| Listing {
            store,
            deadline: policy.deadline.max(std::time::Duration::from_secs(1)),
        };
        let engine = Engine {
            inner: Arc::new(EngineInner {
                id,
                senders,
                clock,
                stats,
                links,
                store: store.map(listing),
            }),
        };
        (engine, tasks)
    }

    /// Whether the shards decide through a store shared by replicas (Redis).
    pub fn has_store(&self) -> bool {
        self.inner.store.is_some()
    }

    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    pub fn shard_count(&self) -> usize {
        self.inner.senders.len()
    }

    pub fn stats(&self) -> &[Arc<ShardStats>] {
        &self.inner.stats
    }

    /// Each shard's link's stats (zeros in memory mode).
    pub fn link_stats(&self) -> &[Arc<LinkStats>] {
        &self.inner.links
    }

    /// Every shard's stats, as one part of the exposition.
    pub fn metrics(&self) -> EngineStats {
        EngineStats {
            shards: self.inner.stats.clone().into(),
            links: self.inner.links.clone().into(),
        }
    }

    pub fn shard_for(&self, hash: u64) -> usize {
        shard_of(hash, self.inner.senders.len())
    }

    /// Decides a request's ops: one message per shard involved (handled synchronously for shards
    /// on this thread). When the request is refused, nothing it consumed anywhere is kept; when
    /// the caller goes away, the same holds.
    pub async fn decide(&self, ops: Vec<Op>, global_shadow: bool) -> Result<Decision, EngineError> {
        if ops.is_empty() {
            return Ok(Decision::default());
        }
        let first = self.shard_for(ops[0].key.hash());
        if ops.iter().all(|o| self.shard_for(o.key.hash()) == first) {
            // The common case: one message, decided atomically by one shard.
            let queued = ops
                .iter()
                .find(|o| o.queue.is_some())
                .map(|o| o.key.clone());
            let answer = self.submit(
                first,
                Decide {
                    ops,
                    whole: true,
                    global_shadow,
                    may_wait: true,
                    reply: ReplyTo::InPlace,
                },
            )?;
            let reply = match answer {
                Delivery::Now(reply) => reply,
                Delivery::Later(rx) => {
                    let guard = CancelOnDrop {
                        engine: self,
                        shard: first,
                        key: queued,
                    };
                    let reply = rx.await.map_err(|_| EngineError::Stopped)?;
                    guard.disarm();
                    reply
                }
            };
            if reply.failed() {
                return Err(EngineError::Unavailable);
            }
            return Ok(Decision {
                timed_out: reply.timed_out(),
                outcomes: reply.outcomes,
                waited_ns: reply.waited_ns,
                refused: reply.refused,
            });
        }
        // Boxed: its state is large, and a future holds the state of every branch, so inlining
        // it would make every call (most touch one shard) allocate and copy kilobytes.
        Box::pin(self.decide_spread(ops, global_shadow)).await
    }

    /// Lists keys (all, or those starting with `prefix`) with their state, for `/debug`.
    pub async fn inspect(&self, prefix: Option<String>) -> Result<Vec<KeyInfo>, EngineError> {
        let mut out = Vec::new();
        for s in 0..self.inner.senders.len() {
            let (tx, rx) = oneshot::channel();
            self.send(
                s,
                Msg::Inspect {
                    prefix: prefix.clone(),
                    reply: tx,
                },
            )?;
            out.extend(rx.await.map_err(|_| EngineError::Stopped)?);
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// With a store, its windows from the first hit under `prefix`, at most `cap` (the counts
    /// every replica shares, which the shards do not keep); `None` in memory, where `inspect`
    /// lists the shards' own.
    pub async fn stored_first_hits(
        &self,
        prefix: &str,
        cap: usize,
    ) -> Option<Result<Vec<KeyInfo>, EngineError>> {
        let l = self.inner.store.as_ref()?;
        let now = self.inner.clock.now();
        let listed = l.store.scan_first_hit(prefix, now, cap, l.deadline).await;
        Some(listed.map_err(|e| EngineError::Store(e.0)))
    }

    /// Direct API: refunds the hit admitted as `id` on `key`, if it is still in its window.
    pub async fn release(&self, key: Key, id: u64) -> Result<bool, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.send(
            self.shard_for(key.hash()),
            Msg::Release { key, id, reply: tx },
        )?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Admin: the state of `op`'s key now, counting nothing. With a store, the store's count
    /// plus this replica's local-first hits it has not seen yet; in memory (or while the
    /// store's breaker is open), the shard's own.
    pub async fn look_up(&self, op: Op) -> Result<LookedUp, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.send(self.shard_for(op.key.hash()), Msg::LookUp { op, reply: tx })?;
        let peeking = rx.await.map_err(|_| EngineError::Stopped)?;
        peeking.finish().await.map_err(|e| EngineError::Store(e.0))
    }

    /// Admin: counts `op`'s key from zero again. The owning shard forgets the key's state, its
    /// over-limit cache entry and its local-first view (waiters get the room, which in memory
    /// they take at once); with a store it then deletes the key's store keys, and forgets
    /// once more what answers in flight across the deletion put back. Answers how many store
    /// keys were deleted (`None` without a store).
    pub async fn reset(&self, op: Op) -> Result<Option<u64>, EngineError> {
        let shard = self.shard_for(op.key.hash());
        let forget = |op: Op, delete: bool| {
            let (tx, rx) = oneshot::channel();
            self.send(
                shard,
                Msg::Reset {
                    op,
                    delete,
                    reply: tx,
                },
            )
            .map(|()| rx)
        };
        let deleting = forget(op.clone(), true)?
            .await
            .map_err(|_| EngineError::Stopped)?;
        let Some(deleting) = deleting.0 else {
            return Ok(None);
        };
        let deleted = deleting.await.map_err(|e| EngineError::Store(e.0))?;
        forget(op, false)?.await.map_err(|_| EngineError::Stopped)?;
        Ok(Some(deleted))
    }

    /// One page of the durable counters' save of one shard (`shard` below
    /// [`Engine::shard_count`]), from `from` (0 to begin, then the page's `Saved::next`): the
    /// keys whose state changed since they were last saved, or every key when `all`. Waits for
    /// room in a busy shard's mailbox.
    pub async fn save(&self, shard: usize, all: bool, from: usize) -> Result<Saved, EngineError> {
        let tx = &self.inner.senders[shard];
        let (reply, rx) = oneshot::channel();
        let msg = Msg::Save(Save { all, from, reply });
        // Handled in place when the shard lives on this thread (and is not busy).
        let msg = {
            let here = find_on_this_thread(self.inner.id, shard);
            let borrowed = here.as_ref().map(|cell| cell.try_borrow_mut());
            match borrowed {
                Some(Ok(mut shard)) => {
                    shard.handle_in_place(msg);
                    None
                }
                _ => Some(msg),
            }
        };
        if let Some(msg) = msg {
            tx.send(msg).await.map_err(|_| EngineError::Stopped)?;
        }
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Puts a key's state read back from the durable counters into the shard that owns it, in
    /// whatever layout this engine has; before the shards start. Expired states are dropped;
    /// `None` forgets the key (it was evicted).
    pub fn restore(
        &self,
        tasks: &mut [ShardTask],
        key: &str,
        state: Option<State>,
        expires_s: u32,
    ) {
        let key = Key::new(key);
        let shard = self.shard_for(key.hash());
        if let Some(t) = tasks.iter_mut().find(|t| t.index == shard) {
            t.shard.restore(&key, state, expires_s);
        }
    }

    /// Shutdown: every shard answers its waiters now, admitting them or not.
    pub async fn drain(&self, admit: bool) {
        for tx in &self.inner.senders {
            let _ = tx.send(Msg::Drain { admit }).await;
        }
    }

    /// Delivers `msg` to `shard`: handled at once when the shard lives on this thread and is
    /// not busy, otherwise through its mailbox.
    fn send(&self, shard: usize, msg: Msg) -> Result<(), EngineError> {
        if let Some(cell) = find_on_this_thread(self.inner.id, shard) {
            if let Ok(mut shard_here) = cell.try_borrow_mut() {
                shard_here.handle_in_place(msg);
                return Ok(());
            }
        }
        self.mail(shard, msg)
    }

    /// Sends a decide (made with [`ReplyTo::InPlace`]): decided now when the shard lives on this
    /// thread and is not busy, otherwise answered later through a channel.
    fn submit(&self, shard: usize, mut d: Decide) -> Result<Delivery, EngineError> {
        if let Some(cell) = find_on_this_thread(self.inner.id, shard) {
            if let Ok(mut shard_here) = cell.try_borrow_mut() {
                return Ok(shard_here.decide_in_place(d));
            }
        }
        let (tx, rx) = oneshot::channel();
        d.reply = ReplyTo::Caller(tx);
        self.mail(shard, Msg::Decide(d))?;
        Ok(Delivery::Later(rx))
    }

    fn mail(&self, shard: usize, msg: Msg) -> Result<(), EngineError> {
        self.inner.senders[shard]
            .try_send(msg)
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => EngineError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
            })
    }
}

/// Tells the shard when a caller waiting in a queue goes away, so its place frees at once.
struct CancelOnDrop<'e> {
    engine: &'e Engine,
    shard: usize,
    key: Option<Key>,
}

impl CancelOnDrop<'_> {
    fn disarm(mut self) {
        self.key = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let _ = self.engine.send(self.shard, Msg::Cancelled { key });
        }
    }
}
