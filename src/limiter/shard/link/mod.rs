//! The shard's link to a store (Redis): what `Backing::Store` holds. New messages wait in a batch
//! and go in round trips, judged in the order they were sent (`round_trip`); a breaker stands
//! between the shard and the store (`breaker`); local-first keys are decided on views the
//! store's counts refresh in the background (`views`); exact limits' hits decided from memory
//! while the store is away are kept and sent once it is back (`away`); keys known to be full are
//! remembered, so a lone op on one is refused without a round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Algorithm;
use crate::limiter::algorithm::Params;
use crate::limiter::key::{Key, KeyMap, KeySet};
use crate::limiter::op::{Counting, Op};
use crate::limiter::protocol::Decide;
use crate::limiter::shard::counters::Counters;
use crate::limiter::shard::queues::{Queues, Waiter};
use crate::limiter::shard::stats::ShardStats;
use crate::limiter::store::{
    DeleteFuture, Store, StoreError, StoreFuture, StoreOp, StorePolicy, StoreReply,
};

mod away;
mod breaker;
mod round_trip;
mod sync;
mod views;

pub use breaker::BreakerState;
use round_trip::RoundTrips;
pub(crate) use round_trip::{Done, InFlight, StoreBound};
pub(crate) use sync::{with_hits, SyncOp};
pub(crate) use views::{refund_views, Views};

/// The least time an admin look-up or reset waits for the store.
const ADMIN_DEADLINE: Duration = Duration::from_secs(1);

pub(crate) struct Link {
    store: Arc<dyn Store>,
    pub(crate) policy: StorePolicy,
    /// The store connection this shard uses (its index).
    lane: usize,
    breaker: breaker::Breaker,
    /// New messages (and queue heads) waiting for the next round trip.
    batch: Vec<StoreBound>,
    /// Hits to give back in the next round trip.
    refunds: Vec<Op>,
    /// Round trips out, and answers back before an older one's.
    pub(crate) trips: RoundTrips,
    /// Keys known to have no room, until when, and under which limit (`LOCAL_CACHE_SIZE_IN_BYTES`):
    /// a request carrying a higher limit on the same key (an override, a reload) is not full.
    over: KeyMap<(u64, Params)>,
    over_cap: usize,
    /// Keys whose queue head is being decided in the store: newcomers still queue behind it.
    heads: KeySet,
    last_error_log: Option<Instant>,
    /// Local-first views and their syncs.
    pub(crate) views: Views,
    /// New messages wait in `batch` for the shard's task to send them.
    deferred: bool,
}

impl Link {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        policy: StorePolicy,
        lane: usize,
        shards: usize,
        (max_keys, stats): (usize, Arc<ShardStats>),
    ) -> Link {
        // About 96 bytes a cached key (the key, until when, the limit it was full under; its
        // text besides), the budget split between shards.
        let over_cap = policy.local_cache_bytes / 96 / shards.max(1);
        let times = (
            policy.sync_interval.as_nanos() as u64,
            policy.cooldown.as_nanos() as u64,
        );
        let views = Views::new(policy.local_first, times, max_keys, stats);
        Link {
            views,
            deferred: false,
            store,
            policy,
            lane,
            breaker: breaker::Breaker::default(),
            batch: Vec::new(),
            refunds: Vec::new(),
            trips: RoundTrips::new(),
            over: KeyMap::default(),
            over_cap,
            heads: KeySet::default(),
            last_error_log: None,
        }
    }

    /// Whether decisions go to the store now (its breaker lets them through).
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        self.breaker.ready()
    }

    /// Whether a round trip must start: new messages wait, or a sync is due.
    pub(crate) fn due(&self, now: u64) -> bool {
        self.deferred || now >= self.views.next_sync()
    }

    /// Queues a new message for the next round trip, sent when the shard's task next runs.
    pub(crate) fn defer(&mut self, d: Decide) {
        self.batch.push(StoreBound::New(d));
        self.deferred = true;
    }

    /// Queues the head waiter of `key`'s queue for the next round trip; newcomers to the key
    /// queue behind it meanwhile.
    pub(crate) fn send_head(&mut self, w: Waiter, key: &Key) {
        self.heads.insert(key.clone());
        self.batch.push(StoreBound::Head(w, key.clone()));
    }

    /// The head of `key`'s queue is back from the store.
    pub(crate) fn head_back(&mut self, key: &Key) {
        self.heads.remove(key);
    }

    /// Whether `key`'s queue head is out, being decided in the store.
    #[inline]
    pub(crate) fn head_out(&self, key: &Key) -> bool {
        !self.heads.is_empty() && self.heads.contains(key)
    }

    /// Queues the hits of `ops` to give back in the store.
    pub(crate) fn queue_refunds(&mut self, ops: &[Op], done: &[usize]) {
        for &i in done {
            self.refunds.push(ops[i].clone());
        }
    }

    /// The op of a lone-op message whose key is known to be full under a limit no lower than the
    /// op's (a check, hits 0, fits even a full window), and until when it is: refused without a
    /// round trip, whatever its role
    /// (shadow mode reports it, as envoyproxy/ratelimit's local cache does). A request with
    /// other descriptors goes to the store, which answers what is left on them. Usage always
    /// goes (it is stored in full), and so do hits kept when refused unless more of them change
    /// nothing (a full fixed window).
    pub(crate) fn known_full(&self, d: &Decide, now: u64) -> Option<(usize, u64)> {
        if d.ops.len() != 1 || self.over.is_empty() {
            return None;
        }
        let op = &d.ops[0];
        let counts = match op.counting {
            Counting::IfAdmitted => false,
            Counting::Always => op.params.algorithm != Algorithm::FixedWindow,
            Counting::Usage => true,
        };
        if op.refund || counts || op.hits == 0 || op.queue.is_some() {
            return None;
        }
        let (until, full) = *self.over.get(&op.key)?;
        (until > now && op.params.no_roomier_than(&full)).then_some((0, until))
    }

    /// Remembers that `op`'s key has no room under `op`'s limit until `until`.
    pub(crate) fn remember_full(&mut self, op: &Op, until: u64, now: u64) {
        if self.over.len() >= self.over_cap {
            self.over.retain(|_, (until, _)| *until > now);
        }
        if self.over.len() < self.over_cap {
            self.over.insert(op.key.clone(), (until, op.params));
        }
    }

    /// Admin reset: forgets the key's over-limit cache entry, its local-first view with its
    /// hits not yet synced, and hits waiting to be given back to the store.
    pub(crate) fn forget(&mut self, key: &Key) {
        self.over.remove(key);
        self.views.forget(key);
        self.refunds.retain(|u| &u.key != key);
    }

    /// Admin: the store's read of `op`'s key, on this shard's connection. Off the request
    /// path, so it gets a second at least whatever the round trips' deadline.
    pub(crate) fn peek(&self, op: &Op, now: u64) -> StoreFuture {
        let deadline = self.policy.deadline.max(ADMIN_DEADLINE);
        self.store.peek(self.lane, op, now, deadline)
    }

    /// Admin: the deletion of `op`'s store keys, on this shard's connection (so it reaches
    /// the store after every round trip this shard sent before it).
    pub(crate) fn delete(&self, op: &Op, now: u64) -> DeleteFuture {
        let deadline = self.policy.deadline.max(ADMIN_DEADLINE);
        self.store.delete(self.lane, op, now, deadline)
    }

    /// Whether a round trip may start now with what waits: one more may go while another is out,
    /// unless the breaker is not closed or what waits carries a queue head or a sync.
    fn may_send(&self, now: u64) -> bool {
        self.trips.none_out()
            || (self.trips.room_beside()
                && self.breaker.is_closed()
                && now < self.views.next_sync()
                && self.batch.iter().all(|m| matches!(m, StoreBound::New(_))))
    }

    /// When the shard's task must next start a round trip: at once for new messages, at the next
    /// sync when none is out, else when the oldest one out is back (not a timer).
    pub(crate) fn next_send(&self) -> u64 {
        if self.deferred {
            0
        } else if self.trips.none_out() {
            self.views.next_sync()
        } else {
            u64::MAX
        }
    }

    /// Starts a round trip with everything waiting, if one may go now (`may_send`).
    pub(crate) fn send(&mut self, now: u64, stats: &ShardStats) {
        // What cannot go now goes when the oldest round trip out is back (`next_back`).
        self.deferred = false;
        if !self.may_send(now) {
            return;
        }
        let ready = self.breaker.ready();
        let sync = self.views.take_due(now, ready);
        if self.batch.is_empty() && self.refunds.is_empty() && sync.is_empty() {
            return;
        }
        // Half-open: this batch is the probe.
        self.breaker.probe();
        let messages = std::mem::take(&mut self.batch);
        let refunds = std::mem::take(&mut self.refunds);
        let mut batch = Vec::with_capacity(messages.len() + refunds.len() + sync.len());
        for op in messages.iter().flat_map(|m| m.ops()) {
            batch.push(StoreOp {
                op,
                refund: op.refund,
                sync_at: None,
                in_full: op.counts_in_full(),
            });
        }
        for op in &refunds {
            batch.push(StoreOp {
                op,
                refund: true,
                sync_at: None,
                in_full: false,
            });
        }
        batch.extend(sync.iter().map(SyncOp::store_op));
        let round_trip = self.store.run(self.lane, &batch, now, self.policy.deadline);
        if !sync.is_empty() {
            stats.synced();
        }
        self.trips.start(round_trip, (messages, refunds, sync), now);
        stats.set_breaker(self.breaker.state().gauge());
    }

    /// The oldest round trip out, if its answer is back, with that answer; the breaker takes
    /// note of how it went.
    pub(crate) fn next_back(
        &mut self,
        stats: &ShardStats,
    ) -> Option<(InFlight, Result<Vec<StoreReply>, StoreError>)> {
        let (mut flight, result, latency) = self.trips.next_back()?;
        self.note(&result, latency, stats);
        // Abandoned at its deadline: the batch was written, and the store counts it if it ever
        // reads it (a stalled Redis does, on waking).
        flight.abandoned = result.is_err() && latency >= self.policy.deadline;
        Some((flight, result))
    }

    /// The breaker takes note of a round trip: an error or a slow answer counts as a failure.
    fn note(
        &mut self,
        result: &Result<Vec<StoreReply>, StoreError>,
        latency: Duration,
        stats: &ShardStats,
    ) {
        let ok = result.as_ref().is_ok_and(|_| latency <= self.policy.slow);
        let b = &mut self.breaker;
        if ok {
            b.succeeded();
        } else {
            b.failed(self.policy.breaker_failures, self.policy.cooldown);
            self.store.failed(self.lane);
            let log = (self.last_error_log).is_none_or(|t| t.elapsed() > Duration::from_secs(1));
            if log {
                self.last_error_log = Some(Instant::now());
                let (store, open) = (self.store.name(), !b.is_closed());
                match result {
                    Err(e) => tracing::warn!(error = %e, open, "{store} round trip failed"),
                    Ok(_) => tracing::warn!(?latency, open, "{store} round trip was slow"),
                }
            }
        }
        stats.set_breaker(self.breaker.state().gauge());
    }

    /// A sync came back: each key's view becomes the store's total (see `Views::synced`).
    pub(crate) fn synced(
        &mut self,
        parts: (&mut Counters, &Queues),
        (sent, replies): (Vec<SyncOp>, &[StoreReply]),
        times: (u64, u64),
    ) {
        let (refunds, trips) = (&self.refunds, &self.trips);
        let queued = |k: &Key| queued_refunds(refunds, trips, k);
        self.views.synced(parts, (sent, replies), times, queued);
    }

    /// An exact round trip read local-first keys: their views become its counts (see
    /// `Views::viewed`).
    pub(crate) fn viewed(
        &mut self,
        parts: (&mut Counters, &Queues),
        answered: (&[Op], &[StoreReply]),
        counted: &[usize],
        times: (u64, u64),
    ) {
        let (refunds, trips) = (&self.refunds, &self.trips);
        let queued = |k: &Key| queued_refunds(refunds, trips, k);
        self.views.viewed(parts, answered, counted, times, queued);
    }
}

/// Hits of `key` given back in the store after the round trip being judged read it: waiting in
/// `refunds` to go, or in a round trip out (sent later).
fn queued_refunds(refunds: &[Op], trips: &RoundTrips, key: &Key) -> i64 {
    let waiting: i64 = (refunds.iter())
        .filter(|u| &u.key == key)
        .map(|u| u.hits as i64)
        .sum();
    waiting + trips.refunds_of(key)
}
