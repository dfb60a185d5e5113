//! The shard's round trips to the store: what waits for the next pipeline and the round trips
//! out; their breaker is in `breaker.rs`.
//!
//! New messages wait in `batch` and go together in the next pipeline, so one connection carries
//! many decisions per round trip. Up to two round trips are out at once, so the worker is not
//! idle while Redis answers; their answers are judged in the order they were sent, whatever
//! order they arrive in (a later one that is back first waits in `arrived`). A pipeline that
//! carries a queue head or a local-first sync goes only when none is out, because their
//! bookkeeping (`heads`, a view's one sync in flight) holds one round trip at a time; nothing
//! else goes ahead of it meanwhile. Hits given back go in the next pipeline; a count read before
//! they went is that much too high (`StoreLink::queued_refunds`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::breaker::Breaker;
use super::synced::{SyncOp, Synced};
use super::{Shard, Waiter};
use crate::limiter::key::{Key, KeyMap, KeySet};
use crate::limiter::op::Op;
use crate::limiter::protocol::Decide;
use crate::limiter::store::{
    DeleteFuture, Store, StoreError, StoreFuture, StoreOp, StorePolicy, StoreReply,
};

/// What a finished round trip reports to its shard: its number, Redis's answers, its latency.
pub(crate) type Done = (u64, Result<Vec<StoreReply>, StoreError>, Duration);

/// Round trips out at once per shard.
const MAX_IN_FLIGHT: usize = 2;

/// The least time an admin look-up or reset waits for the store.
const ADMIN_DEADLINE: Duration = Duration::from_secs(1);

/// A message being decided through Redis.
pub(super) enum StoreBound {
    New(Decide),
    /// The head of `key`'s queue, taken off it while Redis decides.
    Head(Waiter, Key),
}

impl StoreBound {
    pub(super) fn ops(&self) -> &[Op] {
        match self {
            StoreBound::New(d) => &d.ops,
            StoreBound::Head(w, ..) => &w.msg.ops,
        }
    }
}

pub(super) struct InFlight {
    /// Its place in the order round trips are sent and judged.
    pub(super) seq: u64,
    /// Whether it carries a queue head (then nothing else goes until it is back).
    pub(super) has_head: bool,
    pub(super) messages: Vec<StoreBound>,
    /// Hits given back in this round trip, after its messages' ops.
    pub(super) refunds: Vec<Op>,
    pub(super) sync: Vec<SyncOp>,
    pub(super) now: u64,
}

pub(crate) struct StoreLink {
    store: Arc<dyn Store>,
    pub(super) policy: StorePolicy,
    /// The store connection this shard uses (its index).
    lane: usize,
    pub(super) breaker: Breaker,
    pub(super) batch: Vec<StoreBound>,
    pub(super) refunds: Vec<Op>,
    /// Round trips out, oldest first; answers that came before an older one's wait in `arrived`.
    in_flight: VecDeque<InFlight>,
    arrived: Vec<Done>,
    next_seq: u64,
    done_tx: mpsc::UnboundedSender<Done>,
    pub(crate) done_rx: Option<mpsc::UnboundedReceiver<Done>>,
    /// Keys known to have no room, and until when (`LOCAL_CACHE_SIZE_IN_BYTES`).
    pub(super) over: KeyMap<u64>,
    pub(super) over_cap: usize,
    /// Keys whose queue head is being decided in Redis: newcomers still queue behind it.
    pub(super) heads: KeySet,
    last_error_log: Option<Instant>,
    /// Local-first views and their syncs.
    pub(super) synced: Synced,
    /// New messages wait in `batch` for the shard's task to send them.
    pub(super) deferred: bool,
}

impl StoreLink {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        policy: StorePolicy,
        lane: usize,
        shards: usize,
        max_keys: usize,
    ) -> StoreLink {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        // About 64 bytes a cached key, the budget split between shards.
        let over_cap = policy.local_cache_bytes / 64 / shards.max(1);
        let synced = Synced::new(
            policy.local_first,
            policy.sync_interval.as_nanos() as u64,
            max_keys,
        );
        StoreLink {
            synced,
            deferred: false,
            store,
            policy,
            lane,
            breaker: Breaker::default(),
            batch: Vec::new(),
            refunds: Vec::new(),
            in_flight: VecDeque::with_capacity(MAX_IN_FLIGHT),
            arrived: Vec::with_capacity(MAX_IN_FLIGHT),
            next_seq: 0,
            done_tx,
            done_rx: Some(done_rx),
            over: KeyMap::default(),
            over_cap,
            heads: KeySet::default(),
            last_error_log: None,
        }
    }
}

impl StoreLink {
    /// Whether a round trip may start now with what waits: one more may go while another is out,
    /// unless the breaker is not closed or what waits carries a queue head or a sync.
    pub(super) fn may_send(&self, now: u64) -> bool {
        match self.in_flight.len() {
            0 => true,
            n if n >= MAX_IN_FLIGHT => false,
            _ => {
                self.breaker.is_closed()
                    && now < self.synced.next_sync()
                    && !self.in_flight.iter().any(|f| f.has_head)
                    && self.batch.iter().all(|m| matches!(m, StoreBound::New(_)))
            }
        }
    }

    /// When the shard's task must next start a round trip: at once for new messages, at the next
    /// sync when none is out, else when the oldest one out is back (not a timer).
    pub(super) fn next_send(&self) -> u64 {
        if self.deferred {
            0
        } else if self.in_flight.is_empty() {
            self.synced.next_sync()
        } else {
            u64::MAX
        }
    }

    /// Admin: the store's read of `op`'s key, on this shard's connection. Off the request
    /// path, so it gets a second at least whatever the round trips' deadline.
    pub(super) fn peek(&self, op: &Op, now: u64) -> StoreFuture {
        let deadline = self.policy.deadline.max(ADMIN_DEADLINE);
        self.store.peek(self.lane, op, now, deadline)
    }

    /// Admin: the deletion of `op`'s store keys, on this shard's connection (so it reaches
    /// Redis after every round trip this shard sent before it).
    pub(super) fn delete(&self, op: &Op, now: u64) -> DeleteFuture {
        let deadline = self.policy.deadline.max(ADMIN_DEADLINE);
        self.store.delete(self.lane, op, now, deadline)
    }

    /// Hits of `key` given back in Redis after the round trip being judged read it (waiting to
    /// go, or in a round trip sent later): that count is that much too high.
    pub(super) fn queued_refunds(&self, key: &Key) -> i64 {
        let later = self.in_flight.iter().flat_map(|f| f.refunds.iter());
        self.refunds
            .iter()
            .chain(later)
            .filter(|u| &u.key == key)
            .map(|u| u.hits as i64)
            .sum()
    }
}

impl Shard {
    /// Starts a round trip with everything waiting, if one may go now (`StoreLink::may_send`).
    pub(super) fn flush(&mut self) {
        let now = self.clock.now();
        let Some(r) = self.link.as_mut() else {
            return;
        };
        // What cannot go now goes when the oldest round trip out is back (`store_done`).
        r.deferred = false;
        if !r.may_send(now) {
            return;
        }
        let sync = r.synced.take_due(now);
        if r.batch.is_empty() && r.refunds.is_empty() && sync.is_empty() {
            return;
        }
        // Half-open: this batch is the probe.
        r.breaker.probe();
        let messages = std::mem::take(&mut r.batch);
        let refunds = std::mem::take(&mut r.refunds);
        let mut batch = Vec::with_capacity(messages.len() + refunds.len() + sync.len());
        for p in &messages {
            let d = match p {
                StoreBound::New(d) => d,
                StoreBound::Head(w, ..) => &w.msg,
            };
            for op in &d.ops {
                batch.push(StoreOp {
                    op,
                    refund: op.refund,
                    sync_at: None,
                    in_full: op.counts_in_full(),
                });
            }
        }
        for op in &refunds {
            batch.push(StoreOp {
                op,
                refund: true,
                sync_at: None,
                in_full: false,
            });
        }
        Shard::sync_batch(&sync, &mut batch);
        let round_trip = r.store.run(r.lane, &batch, now, r.policy.deadline);
        if !sync.is_empty() {
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        let seq = r.next_seq;
        r.next_seq += 1;
        let has_head = messages.iter().any(|m| matches!(m, StoreBound::Head(..)));
        r.in_flight.push_back(InFlight {
            seq,
            has_head,
            messages,
            refunds,
            sync,
            now,
        });
        let tx = r.done_tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = round_trip.await;
            let _ = tx.send((seq, result, started.elapsed()));
        });
        self.stats.breaker.store(
            self.link
                .as_ref()
                .expect("store mode")
                .breaker
                .state()
                .gauge(),
            Ordering::Relaxed,
        );
    }

    /// A round trip finished: judge it and any later ones already back, oldest first, then send
    /// what accumulated meanwhile.
    pub(super) fn store_done(&mut self, done: Done) {
        let r = self.link.as_mut().expect("store mode");
        r.arrived.push(done);
        loop {
            let r = self.link.as_mut().expect("store mode");
            let Some(oldest) = r.in_flight.front().map(|f| f.seq) else {
                r.arrived.clear();
                break;
            };
            let Some(i) = r.arrived.iter().position(|d| d.0 == oldest) else {
                break;
            };
            let (_, result, latency) = r.arrived.swap_remove(i);
            let flight = r.in_flight.pop_front().expect("oldest");
            self.round_trip_done(flight, result, latency);
        }
        self.flush();
    }

    fn round_trip_done(
        &mut self,
        flight: InFlight,
        result: Result<Vec<StoreReply>, StoreError>,
        latency: Duration,
    ) {
        let r = self.link.as_mut().expect("store mode");
        let ok = result.as_ref().is_ok_and(|_| latency <= r.policy.slow);
        let b = &mut r.breaker;
        if ok {
            b.succeeded();
        } else {
            b.failed(r.policy.breaker_failures, r.policy.cooldown);
            self.stats.redis_errors.fetch_add(1, Ordering::Relaxed);
            let log = r
                .last_error_log
                .is_none_or(|t| t.elapsed() > Duration::from_secs(1));
            if log {
                r.last_error_log = Some(Instant::now());
                match &result {
                    Err(e) => {
                        tracing::warn!(error = %e, open = !b.is_closed(), "Redis round trip failed")
                    }
                    Ok(_) => {
                        tracing::warn!(?latency, open = !b.is_closed(), "Redis round trip was slow")
                    }
                }
            }
        }
        self.stats
            .breaker
            .store(r.breaker.state().gauge(), Ordering::Relaxed);
        match result {
            Ok(replies) => self.apply(flight, replies),
            Err(_) => {
                // Nothing is known of this batch: decide it as the failure mode says.
                let now = self.clock.now();
                let r = self.link.as_mut().expect("store mode");
                r.synced.failed(flight.sync, now);
                for p in flight.messages {
                    match p {
                        // Local-first limits stay local while the store is away.
                        StoreBound::New(d) if self.synced_local(&d, now) => self.decide(d),
                        StoreBound::New(d) => self.decide_without_store(d),
                        StoreBound::Head(w, key) => {
                            self.link.as_mut().expect("store mode").heads.remove(&key);
                            self.requeue_head(w, &key, flight.now);
                            self.service_queue(&key, self.clock.now());
                        }
                    }
                }
            }
        }
    }
}
