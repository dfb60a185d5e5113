//! The store contract: what the shards need from a store shared by replicas, and their policy for it.
//!
//! A store counts a batch of ops in one round trip and answers, per op, the key's state as the
//! shard's own table would hold it, so the shard judges a stored decision with the same rules
//! as one made in memory. The store decides its own encoding, key layout and scripts; the limiter
//! never sees them (`store::redis` implements it over Redis).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::limiter::algorithm::State;

use crate::limiter::op::Op;

/// A store shared by replicas (Redis): counts batches of ops.
pub trait Store: Send + Sync + 'static {
    /// Counts `batch` at `now` (ns since the epoch) in one round trip, within `deadline`, over
    /// connection `lane` (the shard's index; the store takes it modulo its pool). The batch is
    /// turned into commands before this returns; the future only does the round trip. Answers
    /// one [`StoreReply`] per op, in order.
    fn run(&self, lane: usize, batch: &[StoreOp<'_>], now: u64, deadline: Duration) -> StoreFuture;

    /// Reads the state of `op`'s key at `now` without counting, creating or touching anything
    /// (a look-up): one [`StoreReply`] whose `before` is the state now, `allowed` `None`.
    fn peek(&self, lane: usize, op: &Op, now: u64, deadline: Duration) -> StoreFuture;

    /// Deletes every key the store holds for `op`'s counter at `now` (all its algorithm reads
    /// to decide), so every replica counts it from zero again (a reset). Answers how many keys
    /// there were.
    fn delete(&self, lane: usize, op: &Op, now: u64, deadline: Duration) -> DeleteFuture;

    /// A round trip over `lane` failed, or took longer than the shards' policy allows (its
    /// `slow`): the store counts it in an error counter of its own, which it renders itself
    /// (Redis: `ratelimit_service_redis_errors_total`, labelled by shard).
    fn failed(&self, lane: usize);

    /// The store's name in the shards' logs ("Redis").
    fn name(&self) -> &'static str;

    /// Lists the keys of windows from the first hit whose counter key starts with `prefix`,
    /// as the shards' `inspect` lists theirs, read at `now` (ns): at most `cap` of them, found
    /// by a bounded walk of the store (the store's docs say how bounded). A store that cannot
    /// list keys answers none.
    fn scan_first_hit(&self, prefix: &str, now: u64, cap: usize, deadline: Duration) -> ScanFuture {
        let _ = (prefix, now, cap, deadline);
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// A listing of the store's keys in flight.
pub type ScanFuture = Pin<Box<dyn Future<Output = Result<Vec<KeyInfo>, StoreError>> + Send>>;

/// A reset's deletion in flight: how many keys were deleted.
pub type DeleteFuture = Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send>>;

/// A round trip in flight.
pub type StoreFuture = Pin<Box<dyn Future<Output = Result<Vec<StoreReply>, StoreError>> + Send>>;

/// One op of a batch.
#[derive(Debug, Clone, Copy)]
pub struct StoreOp<'a> {
    pub op: &'a Op,
    /// Give `op.hits` back instead of taking them: an op with `refund`, or the refund of hits a
    /// refused request had counted.
    pub refund: bool,
    /// Local-first sync: add `op.hits`, admitted here already, whatever the limit says, to the
    /// window holding this time (ns); the reply's `before` is the store's state before them.
    pub sync_at: Option<u64>,
    /// Count `op.hits` whatever the limit says (usage counted in full); the reply's `before`
    /// is the store's state before them, and `allowed` is `None`.
    pub in_full: bool,
}

/// The store's answer to one op, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreReply {
    /// The key's state before this op's hits (for an op that gives hits back: after they were
    /// refunded), as the shard's table would hold it.
    pub before: State,
    /// The store's own verdict, when it judged the op itself (a script that counts only what
    /// fits): `true` when it admitted and counted the hits. `None` when it counted them
    /// unconditionally (fixed windows), leaving the verdict to the shard.
    pub allowed: Option<bool>,
    /// An op of a limit with `reserve`: the key's holds as the store saw them.
    pub holds: HoldReply,
}

/// The holds of an op's key in the store (ops of limits with `reserve`, and Limitador's named
/// holds of windows from the first hit; zeros otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HoldReply {
    /// Holds before this op (expired ones released).
    pub held: u32,
    /// Holds this op found expired, and released.
    pub expired: u32,
    /// A report released one hold; a Limitador `Commit` ended its named hold.
    pub released: bool,
    /// The hits the key's named holds (Limitador's `Reserve`) hold beside this op, expired ones
    /// dropped: before a `Reserve`'s own, after a `Commit` ended its own.
    pub named: u64,
}

/// A round trip that failed or took too long: nothing is known of its batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

/// How decisions are made while the store cannot be reached (the breaker is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Decide on this replica's own in-memory counters (limits become per replica).
    Fallback,
    /// Admit everything.
    FailOpen,
    /// Answer UNAVAILABLE, so Envoy's `failure_mode_deny` decides.
    FailClosed,
}

/// How the shards use a store: deadlines, the breaker, and the local over-limit cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePolicy {
    /// Every round trip is abandoned after this; the breaker counts it as a failure.
    pub deadline: Duration,
    /// A round trip slower than this counts as a failure too.
    pub slow: Duration,
    /// Consecutive failures (errors, or round trips slower than `slow`) that open the breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before a half-open probe.
    pub cooldown: Duration,
    pub failure_mode: FailureMode,
    /// Memory for keys known to be over until their window ends, split between the shards, so
    /// they are refused without a round trip.
    pub local_cache_bytes: usize,
    /// Local-first for limits that do not say (`local_first` in the YAML): decide from memory,
    /// sync with the store every `sync_interval` (see `Link::synced` in `limiter/shard/link/mod.rs`).
    pub local_first: bool,
    pub sync_interval: Duration,
}

/// A store shared by replicas (Redis), and how the shards use it.
#[derive(Clone)]
pub struct SharedStore {
    pub store: Arc<dyn Store>,
    pub policy: StorePolicy,
}

/// A key's state as `/debug` shows it, from a shard or a store's scan; the caller knows the limit, so it interprets the state.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    pub key: String,
    pub state: State,
    /// Direct API refusals.
    pub denied: Denied,
    pub waiting: usize,
    /// The shard's time when it answered.
    pub now: u64,
}

/// A key's direct API refusals in one window: the window's index, and how many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Denied {
    pub window: u64,
    pub count: u64,
}
