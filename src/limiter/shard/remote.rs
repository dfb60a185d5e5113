//! The shard's store mode (Redis): batching, the breaker, the local over-limit cache, and fallback.
//!
//! Messages that arrive while a round trip is in flight wait in `batch` and go together in the
//! next pipeline, so one connection carries many decisions per round trip. Redis counts first
//! (INCRBY, or a script that counts only what fits); the shard then judges each message with
//! the same rules as in memory, and gives back, in the next pipeline, whatever a message that is
//! refused or must wait had counted. Queues stay in this shard: a waiter at the head of its
//! queue is decided through Redis again when it may fit, so FIFO holds among the waiters of one
//! replica, and across replicas the first to ask Redis after a rollover wins.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fnv::{FnvHashMap, FnvHashSet};
use smallvec::SmallVec;
use tokio::sync::mpsc;

use super::decide::{judge, Commit, Verdict};
use super::synced::{with_hits, SyncOp, Synced};
use super::{Decide, Shard, Waiter};
use crate::limiter::algorithm::{Eval, State};
use crate::limiter::store::{FailureMode, Store, StoreError, StoreOp, StorePolicy, StoreReply};
use crate::limiter::{Hits, Op, Outcome, Reply, Role};

/// What a finished round trip reports to its shard.
pub(crate) type Done = (Result<Vec<StoreReply>, StoreError>, Duration);

/// Breaker states as the shard's stats show them.
pub const BREAKER_CLOSED: u64 = 0;
pub const BREAKER_OPEN: u64 = 1;
pub const BREAKER_HALF_OPEN: u64 = 2;

/// Opens after consecutive failures (errors, deadlines, or slow round trips); after a cooldown
/// one batch goes to Redis as a probe, and its success closes it again.
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

impl Breaker {
    /// Whether decisions may go to Redis; reads the clock only while the breaker is open.
    fn ready(&self) -> bool {
        match self.open_until {
            None => true,
            Some(t) => !self.probing && Instant::now() >= t,
        }
    }

    fn state(&self) -> u64 {
        match (self.open_until, self.probing) {
            (None, _) => BREAKER_CLOSED,
            (Some(_), true) => BREAKER_HALF_OPEN,
            (Some(_), false) => BREAKER_OPEN,
        }
    }
}

/// A message being decided through Redis.
enum StoreBound {
    New(Decide),
    /// The head of `key`'s queue, taken off it while Redis decides.
    Head(Waiter, Box<str>, u64),
}

impl StoreBound {
    fn ops(&self) -> &[Op] {
        match self {
            StoreBound::New(d) => &d.ops,
            StoreBound::Head(w, ..) => &w.msg.ops,
        }
    }
}

struct InFlight {
    messages: Vec<StoreBound>,
    /// Replies to skip between the messages' and the sync's: the undo ops'.
    undone: usize,
    sync: Vec<SyncOp>,
    now: u64,
}

pub(crate) struct Remote {
    store: Arc<dyn Store>,
    policy: StorePolicy,
    /// The store connection this shard uses (its index).
    lane: usize,
    breaker: Breaker,
    batch: Vec<StoreBound>,
    undo: Vec<Op>,
    in_flight: Option<InFlight>,
    done_tx: mpsc::UnboundedSender<Done>,
    pub(crate) done_rx: Option<mpsc::UnboundedReceiver<Done>>,
    /// Keys known to have no room, and until when (`LOCAL_CACHE_SIZE_IN_BYTES`).
    over: FnvHashMap<Box<str>, u64>,
    over_cap: usize,
    /// Keys whose queue head is being decided in Redis: newcomers still queue behind it.
    pub(super) heads: FnvHashSet<Box<str>>,
    last_error_log: Option<Instant>,
    /// Local-first views and their syncs.
    pub(super) synced: Synced,
    /// New messages wait in `batch` for the shard's task to send them.
    pub(super) deferred: bool,
}

impl Remote {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        policy: StorePolicy,
        lane: usize,
        shards: usize,
        max_keys: usize,
    ) -> Remote {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        // About 64 bytes a cached key, the budget split between shards.
        let over_cap = policy.local_cache_bytes / 64 / shards.max(1);
        let synced = Synced::new(
            policy.local_first,
            policy.sync_interval.as_nanos() as u64,
            max_keys,
        );
        Remote {
            synced,
            deferred: false,
            store,
            policy,
            lane,
            breaker: Breaker {
                failures: 0,
                open_until: None,
                probing: false,
            },
            batch: Vec::new(),
            undo: Vec::new(),
            in_flight: None,
            done_tx,
            done_rx: Some(done_rx),
            over: FnvHashMap::default(),
            over_cap,
            heads: FnvHashSet::default(),
            last_error_log: None,
        }
    }
}

impl Remote {
    pub(super) fn in_flight_none(&self) -> bool {
        self.in_flight.is_none()
    }

    /// Hits of `key` waiting to be given back in Redis: a count read before they go is that
    /// much too high.
    pub(super) fn queued_undo(&self, key: &str) -> i64 {
        self.undo
            .iter()
            .filter(|u| u.key == key)
            .map(|u| u.hits as i64)
            .sum()
    }
}

impl Shard {
    /// Whether decisions go to Redis now (a backend is set and its breaker lets them through).
    pub(super) fn remote_ready(&self) -> bool {
        self.remote.as_ref().is_some_and(|r| r.breaker.ready())
    }

    /// A new message in Redis mode.
    pub(super) fn decide_remote(&mut self, d: Decide) {
        let now = self.clock.now();
        let ready = self.remote_ready();
        let r = self.remote.as_mut().expect("remote mode");
        if r.synced.local(&d.ops, now, ready) {
            self.stats.local_decisions.fetch_add(1, Ordering::Relaxed);
            return self.decide(d);
        }
        if !ready {
            return self.decide_without_store(d);
        }
        // A key known to be full refuses at once, without a round trip; a check (hits 0) fits
        // even a full window, as in memory.
        let cached = d.ops.iter().position(|op| {
            !op.refund
                && op.hits > 0
                && op.queue.is_none()
                && op.role == Role::Binding
                && !d.global_shadow
                && r.over
                    .get(op.key.as_str())
                    .is_some_and(|until| *until > now)
        });
        if let Some(i) = cached {
            let until = r.over[d.ops[i].key.as_str()];
            self.stats.local_cache_hits.fetch_add(1, Ordering::Relaxed);
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
                })
                .collect();
            self.count_denied(&d.ops, now);
            self.answer(d.reply, Reply::refused(outcomes, 0));
            return;
        }
        let mut d = d;
        self.hold(&mut d);
        self.remote
            .as_mut()
            .expect("remote mode")
            .batch
            .push(StoreBound::New(d));
        // Sent when the shard's task next runs, after the calls that are ready on this thread:
        // they join the same pipeline instead of one call going alone.
        self.remote.as_mut().expect("remote mode").deferred = true;
    }

    fn synced_local(&mut self, d: &Decide, now: u64) -> bool {
        let r = self.remote.as_mut().expect("remote mode");
        r.synced.local(&d.ops, now, false)
    }

    /// The breaker is open: decide as the failure mode says.
    fn decide_without_store(&mut self, d: Decide) {
        self.stats
            .fallback_decisions
            .fetch_add(1, Ordering::Relaxed);
        let mode = self
            .remote
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
    pub(super) fn remote_head(&mut self, w: Waiter, key: &str, hash: u64) {
        let r = self.remote.as_mut().expect("remote mode");
        r.heads.insert(key.into());
        r.batch.push(StoreBound::Head(w, key.into(), hash));
        self.flush();
    }

    /// Gives back, through Redis, what the ops at `done` counted there.
    pub(super) fn remote_undo(&mut self, ops: &[Op], done: &[usize]) {
        if done.is_empty() {
            return;
        }
        let Some(r) = self.remote.as_mut() else {
            return;
        };
        for &i in done {
            r.undo.push(ops[i].clone());
        }
        self.unview(ops, done);
        self.flush();
    }

    /// Gives back ops that another shard's refusal undid; `remote` says where they counted.
    pub(super) fn undo_remote_ops(&mut self, ops: &[Op]) {
        let all: SmallVec<[usize; 2]> = (0..ops.len()).collect();
        self.remote_undo(ops, &all);
    }

    /// Starts a round trip with everything waiting, if none is in flight.
    pub(super) fn flush(&mut self) {
        let now = self.clock.now();
        let Some(r) = self.remote.as_mut() else {
            return;
        };
        if r.in_flight.is_some() {
            return;
        }
        r.deferred = false;
        let sync = r.synced.take_due(now);
        if r.batch.is_empty() && r.undo.is_empty() && sync.is_empty() {
            return;
        }
        if r.breaker.open_until.is_some() {
            // Half-open: this batch is the probe.
            r.breaker.probing = true;
        }
        let messages = std::mem::take(&mut r.batch);
        let undo = std::mem::take(&mut r.undo);
        let mut batch = Vec::new();
        for p in &messages {
            let d = match p {
                StoreBound::New(d) => d,
                StoreBound::Head(w, ..) => &w.msg,
            };
            for op in &d.ops {
                batch.push(StoreOp {
                    op,
                    give_back: op.refund,
                    sync_at: None,
                });
            }
        }
        for op in &undo {
            batch.push(StoreOp {
                op,
                give_back: true,
                sync_at: None,
            });
        }
        Shard::sync_batch(&sync, &mut batch);
        let round_trip = r.store.run(r.lane, &batch, now, r.policy.deadline);
        if !sync.is_empty() {
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        r.in_flight = Some(InFlight {
            messages,
            undone: undo.len(),
            sync,
            now,
        });
        let tx = r.done_tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = round_trip.await;
            let _ = tx.send((result, started.elapsed()));
        });
        self.stats.breaker.store(
            self.remote.as_ref().expect("remote").breaker.state(),
            Ordering::Relaxed,
        );
    }

    /// A round trip finished: judge its messages, then send what accumulated meanwhile.
    pub(super) fn remote_done(&mut self, (result, latency): Done) {
        let r = self.remote.as_mut().expect("remote mode");
        let Some(flight) = r.in_flight.take() else {
            return;
        };
        let ok = result.as_ref().is_ok_and(|_| latency <= r.policy.slow);
        let b = &mut r.breaker;
        if ok {
            b.failures = 0;
            b.open_until = None;
            b.probing = false;
        } else {
            b.probing = false;
            b.failures += 1;
            if b.failures >= r.policy.breaker_failures || b.open_until.is_some() {
                b.open_until = Some(Instant::now() + r.policy.cooldown);
            }
            self.stats.redis_errors.fetch_add(1, Ordering::Relaxed);
            let log = r
                .last_error_log
                .is_none_or(|t| t.elapsed() > Duration::from_secs(1));
            if log {
                r.last_error_log = Some(Instant::now());
                match &result {
                    Err(e) => {
                        tracing::warn!(error = %e, open = b.open_until.is_some(), "Redis round trip failed")
                    }
                    Ok(_) => tracing::warn!(
                        ?latency,
                        open = b.open_until.is_some(),
                        "Redis round trip was slow"
                    ),
                }
            }
        }
        self.stats
            .breaker
            .store(r.breaker.state(), Ordering::Relaxed);
        match result {
            Ok(replies) => self.apply(flight, replies),
            Err(_) => {
                // Nothing is known of this batch: decide it as the failure mode says.
                let now = self.clock.now();
                let r = self.remote.as_mut().expect("remote");
                r.synced.failed(flight.sync, now);
                for p in flight.messages {
                    match p {
                        // Local-first limits stay local while the store is away.
                        StoreBound::New(d) if self.synced_local(&d, now) => self.decide(d),
                        StoreBound::New(d) => self.decide_without_store(d),
                        StoreBound::Head(w, key, hash) => {
                            self.remote.as_mut().expect("remote").heads.remove(&key);
                            self.requeue_head(w, &key, flight.now);
                            self.service_queue(&key, hash, self.clock.now());
                        }
                    }
                }
            }
        }
        self.flush();
    }

    fn apply(&mut self, flight: InFlight, replies: Vec<StoreReply>) {
        let InFlight {
            messages,
            undone,
            sync,
            now,
        } = flight;
        let n_msgs: usize = messages.iter().map(|p| p.ops().len()).sum();
        self.judge_stored(messages, &replies, now);
        // The sync went last in the pipeline: its counts are the latest, and make the views.
        let sync_at = (n_msgs + undone).min(replies.len());
        self.synced(sync, &replies[sync_at..], now);
    }

    /// Judges the messages of a round trip on Redis's answers, in order.
    fn judge_stored(&mut self, messages: Vec<StoreBound>, replies: &[StoreReply], now: u64) {
        let mut at = 0;
        for p in messages {
            let (d, head) = match p {
                StoreBound::New(d) => (d, None),
                StoreBound::Head(w, key, hash) => {
                    let Waiter {
                        msg,
                        op,
                        enqueued,
                        deadline,
                    } = w;
                    (msg, Some((op, enqueued, deadline, key, hash)))
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
                None => self.conclude(d, outcomes, verdict, Commit::Remote(counted), now, None),
                Some((op, enqueued, deadline, key, hash)) => {
                    self.remote.as_mut().expect("remote").heads.remove(&key);
                    let w = Waiter {
                        msg: d,
                        op,
                        enqueued,
                        deadline,
                    };
                    if w.msg.reply.is_closed() {
                        self.left_queue();
                        self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                        self.remote_undo(&w.msg.ops, &counted);
                    } else {
                        match verdict {
                            Verdict::Wait(i) if i == op => {
                                self.remote_undo(&w.msg.ops, &counted);
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
                                    Commit::Remote(counted),
                                    now,
                                    since,
                                );
                            }
                        }
                    }
                    self.service_queue(&key, hash, self.clock.now());
                }
            }
        }
    }

    /// Puts a head waiter back at the front of its queue, to be looked at again at `at`.
    fn requeue_head(&mut self, w: Waiter, key: &str, at: u64) {
        let at = at.min(w.deadline);
        let hash = crate::descriptor::key_hash(key);
        let params = w.msg.ops[w.op].params;
        let now = self.clock.now();
        self.slot(key, hash, params, now);
        self.queues.entry(key.into()).or_default().push_front(w);
        self.events.push(std::cmp::Reverse((at, key.into())));
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
        let unsynced = self
            .remote
            .as_ref()
            .map_or(0, |r| r.synced.unsynced(op, now));
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
        // Remember keys with no room left at all, until room comes back.
        let full = before.eval(p, now, 1);
        if op.role == Role::Binding && full.over && full.retry_ns != u64::MAX {
            let r = self.remote.as_mut().expect("remote mode");
            if r.over.len() >= r.over_cap {
                r.over.retain(|_, until| *until > now);
            }
            if r.over.len() < r.over_cap {
                r.over.insert(op.key.as_str().into(), now + full.retry_ns);
            }
        }
        (e, counted)
    }
}
