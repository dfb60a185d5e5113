//! The shard's link to a store (Redis): what `Backing::Store` holds. New messages wait in a batch
//! and go in round trips, judged in the order they were sent (`round_trip`); a breaker stands
//! between the shard and the store (`breaker`); hits decided here that the store has not
//! counted yet wait in a ledger (`ledger`): local-first keys' hits, synced in the background,
//! and exact limits' hits decided while the store is away, replayed once it is back; keys known
//! to be full are remembered, so a lone op on one is refused without a round trip. Its
//! stats are beside it (`stats`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Algorithm;
use crate::limiter::algorithm::Params;
use crate::limiter::key::{Key, KeyMap, KeySet};
use crate::limiter::op::{Counting, Op, Reservation};
use crate::limiter::protocol::Decide;
use crate::limiter::shard::counters::Counters;
use crate::limiter::shard::queues::Waiter;
use crate::limiter::store::{
    DeleteFuture, Store, StoreError, StoreFuture, StoreOp, StorePolicy, StoreReply,
};

mod breaker;
mod ledger;
mod round_trip;
mod stats;
mod sync;

pub use breaker::BreakerState;
use ledger::Ledger;
pub(crate) use ledger::ShardKeys;
use round_trip::RoundTrips;
pub(crate) use round_trip::{Done, InFlight, StoreBound, TripTimes};
pub use stats::{LinkCounts, LinkStats};
pub(crate) use sync::{with_hits, Mode, SyncOp};

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
    /// Hits to refund in the next round trip.
    refunds: Vec<Op>,
    /// Round trips out, and answers back before an older one's.
    pub(crate) trips: RoundTrips,
    /// Keys known to have no room, until when, and under which limit (`LOCAL_CACHE_SIZE_IN_BYTES`):
    /// a request carrying a higher limit on the same key (an override, a reload) is not full.
    over: KeyMap<Full>,
    over_cap: usize,
    /// Keys whose queue head is being decided in the store: newcomers still queue behind it.
    heads: KeySet,
    last_error_log: Option<Instant>,
    /// Hits decided here that the store has not counted yet: local-first keys', and exact
    /// limits' decided while the store was away (`fallback`).
    local_first: Ledger,
    pub(crate) fallback: Ledger,
    pub(crate) stats: Arc<LinkStats>,
    /// New messages wait in `batch` for the shard's task to send them.
    deferred: bool,
}

/// A key known to have no room: until when, and under which limit.
#[derive(Debug, Clone, Copy)]
struct Full {
    until: u64,
    limit: Params,
}

impl Link {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        policy: StorePolicy,
        lane: usize,
        shards: usize,
        max_keys: usize,
        stats: Arc<LinkStats>,
    ) -> Link {
        // About 96 bytes a cached key (the key, until when, the limit it was full under; its
        // text besides), the budget split between shards.
        let over_cap = policy.local_cache_bytes / 96 / shards.max(1);
        let (interval, cooldown) = (
            policy.sync_interval.as_nanos() as u64,
            policy.cooldown.as_nanos() as u64,
        );
        let local_first = Ledger::new(Mode::LocalFirst, interval, max_keys, stats.clone())
            .on_by_default(policy.local_first);
        let fallback = Ledger::new(Mode::Fallback, cooldown, max_keys, stats.clone());
        Link {
            local_first,
            fallback,
            stats,
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
        self.deferred || now >= self.next_sync()
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

    /// Queues the hits of `ops` to refund in the store.
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
        let full = self.over.get(&op.key)?;
        let until = full.until;
        (until > now && op.params.no_roomier_than(&full.limit)).then_some((0, until))
    }

    /// Remembers that `op`'s key has no room under `op`'s limit until `until`.
    pub(crate) fn remember_full(&mut self, op: &Op, until: u64, now: u64) {
        // The store places a window from the first hit and answers its end (the key's TTL),
        // but for a limit with `reserve`, whose holds' script answers no TTL: there the end is
        // an estimate, and a later one than the store's would refuse past the window.
        let holds_script = matches!(op.reserve, Reservation::Counted(_));
        if op.params.algorithm == Algorithm::FromFirstHit && holds_script {
            return;
        }
        if self.over.len() >= self.over_cap {
            self.over.retain(|_, full| full.until > now);
        }
        if self.over.len() < self.over_cap {
            let limit = op.params;
            self.over.insert(op.key.clone(), Full { until, limit });
        }
    }

    /// Admin reset: forgets the key's over-limit cache entry, its hits in the ledger, and hits
    /// waiting to be refunded in the store.
    pub(crate) fn forget(&mut self, key: &Key) {
        self.over.remove(key);
        self.local_first.forget(key);
        self.fallback.forget(key);
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
                && now < self.next_sync()
                && self.batch.iter().all(|m| matches!(m, StoreBound::New(_))))
    }

    /// When the shard's task must next start a round trip: at once for new messages, at the next
    /// sync when none is out, else when the oldest one out is back (not a timer).
    pub(crate) fn next_send(&self) -> u64 {
        if self.deferred {
            0
        } else if self.trips.none_out() {
            self.next_sync()
        } else {
            u64::MAX
        }
    }

    /// Starts a round trip with everything waiting, if one may go now (`may_send`).
    pub(crate) fn send(&mut self, now: u64) {
        // What cannot go now goes when the oldest round trip out is back (`next_back`).
        self.deferred = false;
        if !self.may_send(now) {
            return;
        }
        let ready = self.breaker.ready();
        let mut sync = Vec::new();
        self.local_first.take(now, ready, &mut sync);
        self.fallback.take(now, ready, &mut sync);
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
            self.stats.synced();
        }
        self.trips.start(round_trip, messages, refunds, sync, now);
        self.stats.set_breaker(self.breaker.state().gauge());
    }

    /// The oldest round trip out, if its answer is back, with that answer; the breaker takes
    /// note of how it went.
    pub(crate) fn next_back(&mut self) -> Option<(InFlight, Result<Vec<StoreReply>, StoreError>)> {
        let (mut flight, result, latency) = self.trips.next_back()?;
        self.note(&result, latency);
        // Abandoned at its deadline: the batch was written, and the store counts it if it ever
        // reads it (a stalled Redis does, on waking).
        flight.abandoned = result.is_err() && latency >= self.policy.deadline;
        Some((flight, result))
    }

    /// The breaker takes note of a round trip: an error or a slow answer counts as a failure.
    fn note(&mut self, result: &Result<Vec<StoreReply>, StoreError>, latency: Duration) {
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
        self.stats.set_breaker(self.breaker.state().gauge());
    }

    /// The ledger `op`'s hits go to when decided here.
    fn ledger(&mut self, op: &Op) -> &mut Ledger {
        if self.local_first.applies(op) {
            &mut self.local_first
        } else {
            &mut self.fallback
        }
    }

    /// Records hits decided here (negative: refunded) in the ledger, until the store counts
    /// them.
    pub(crate) fn record(&mut self, op: &Op, hits: i64, now: u64) {
        self.ledger(op).record(op, hits, now);
    }

    /// Hits decided here on `op`'s key that the store has not counted yet.
    pub(crate) fn unsynced(&self, op: &Op, now: u64) -> i64 {
        if self.local_first.applies(op) {
            self.local_first.unsynced(op, now)
        } else {
            self.fallback.unsynced(op, now)
        }
    }

    /// Whether every op of a message may be decided from memory now (see `Ledger::local`).
    pub(crate) fn local(&mut self, ops: &[Op], now: u64, store_ready: bool) -> bool {
        self.local_first.local(ops, now, store_ready)
    }

    /// When the ledger's hits are next due to go.
    fn next_sync(&self) -> u64 {
        self.local_first.due_at().min(self.fallback.due_at())
    }

    /// A round trip carrying the ledger's hits failed (see `Ledger::failed`).
    pub(crate) fn failed(&mut self, sent: Vec<SyncOp>, now: u64, landed: bool) {
        for s in sent {
            match s.mode {
                Mode::LocalFirst => self.local_first.failed(s, landed, now),
                Mode::Fallback => self.fallback.failed(s, landed, now),
            }
        }
    }

    /// A round trip carrying the ledger's hits came back: each key's state becomes the store's
    /// total (see `Ledger::synced`).
    pub(crate) fn synced(
        &mut self,
        mut keys: ShardKeys<'_>,
        sent: Vec<SyncOp>,
        replies: &[StoreReply],
        times: TripTimes,
    ) {
        for (s, reply) in sent.iter().zip(replies) {
            let queued = queued_refunds(&self.refunds, &self.trips, &s.op.key);
            let ledger = match s.mode {
                Mode::LocalFirst => &mut self.local_first,
                Mode::Fallback => &mut self.fallback,
            };
            ledger.synced(keys.reborrow(), s, reply, times, queued);
        }
    }

    /// An exact round trip read local-first keys: their state becomes its counts, with this
    /// message's hits if it was admitted (`counted`; see `Ledger::read`).
    pub(crate) fn read_local_first(
        &mut self,
        mut keys: ShardKeys<'_>,
        ops: &[Op],
        replies: &[StoreReply],
        counted: &[usize],
        times: TripTimes,
    ) {
        for (i, (op, reply)) in ops.iter().zip(replies).enumerate() {
            if !self.local_first.applies(op) {
                continue;
            }
            let queued = queued_refunds(&self.refunds, &self.trips, &op.key);
            let counts = counted.contains(&i);
            (self.local_first).read(keys.reborrow(), op, reply, counts, times, queued);
        }
    }

    /// Hits counted in the store are being refunded there: the local-first keys whose state
    /// holds them are refunded too (nothing to sync).
    pub(crate) fn refund_local_first(
        &self,
        counters: &mut Counters,
        ops: &[Op],
        done: &[usize],
        now: u64,
    ) {
        for &i in done {
            let op = &ops[i];
            if self.local_first.applies(op) && self.local_first.holds(&op.key) {
                counters.refund(&op.key, &op.params, now, op.hits);
            }
        }
    }
}

/// Hits of `key` refunded in the store after the round trip being judged read it: waiting in
/// `refunds` to go, or in a round trip out (sent later).
fn queued_refunds(refunds: &[Op], trips: &RoundTrips, key: &Key) -> i64 {
    let waiting: i64 = (refunds.iter())
        .filter(|u| &u.key == key)
        .map(|u| u.hits as i64)
        .sum();
    waiting + trips.refunds_of(key)
}
