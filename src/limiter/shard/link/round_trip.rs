//! Round trips to the store, in order.
//!
//! New messages wait in the batch and go together in the next pipeline, so one connection
//! carries many decisions per round trip. Up to two round trips are out at once, so the worker
//! is not idle while the store answers; their answers are judged in the order they were sent,
//! whatever order they arrive in (a later one that is back first waits in `arrived`). A pipeline
//! that carries a queue head or a local-first sync goes only when none is out, because their
//! bookkeeping (`heads`, a ledger entry's one sync in flight) holds one round trip at a time; nothing
//! else goes ahead of it meanwhile. Refunded hits go in the next pipeline; a count read before
//! they went is that much too high (`RoundTrips::refunds_of`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::sync::SyncOp;
use crate::limiter::key::Key;
use crate::limiter::op::Op;
use crate::limiter::protocol::Decide;
use crate::limiter::shard::queues::Waiter;
use crate::limiter::store::{StoreError, StoreFuture, StoreReply};

/// What a finished round trip reports to its shard.
pub(crate) struct Done {
    /// Its place in the order round trips are sent (`InFlight::seq`).
    seq: u64,
    /// The store's answers.
    result: Result<Vec<StoreReply>, StoreError>,
    /// How long it took.
    latency: Duration,
}

/// When a round trip started (as its messages were read) and when its answer is judged (clock
/// ns).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TripTimes {
    pub(crate) started: u64,
    pub(crate) now: u64,
}

/// Round trips out at once per shard.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// A message being decided through the store.
pub(crate) enum StoreBound {
    New(Decide),
    /// The head of `key`'s queue, taken off it while the store decides.
    Head(Waiter, Key),
}

impl StoreBound {
    pub(crate) fn ops(&self) -> &[Op] {
        match self {
            StoreBound::New(d) => &d.ops,
            StoreBound::Head(w, ..) => &w.msg.ops,
        }
    }
}

pub(crate) struct InFlight {
    /// Its place in the order round trips are sent and judged.
    seq: u64,
    /// Whether it carries a queue head (then nothing else goes until it is back).
    has_head: bool,
    pub(crate) messages: Vec<StoreBound>,
    /// Hits refunded in this round trip, after its messages' ops.
    pub(crate) refunds: Vec<Op>,
    pub(crate) sync: Vec<SyncOp>,
    pub(crate) now: u64,
    /// Failed at its deadline, its batch written: the store may count it yet.
    pub(crate) abandoned: bool,
}

/// The round trips out, oldest first, and the answers back before an older one's.
pub(crate) struct RoundTrips {
    in_flight: VecDeque<InFlight>,
    arrived: Vec<Done>,
    next_seq: u64,
    done_tx: mpsc::UnboundedSender<Done>,
    pub(crate) done_rx: Option<mpsc::UnboundedReceiver<Done>>,
}

impl RoundTrips {
    pub(crate) fn new() -> RoundTrips {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        RoundTrips {
            in_flight: VecDeque::with_capacity(MAX_IN_FLIGHT),
            arrived: Vec::with_capacity(MAX_IN_FLIGHT),
            next_seq: 0,
            done_tx,
            done_rx: Some(done_rx),
        }
    }

    /// Whether none is out.
    pub(crate) fn none_out(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Whether another may go beside those out as far as they are concerned: one is out at
    /// most, and it carries no queue head.
    pub(crate) fn room_beside(&self) -> bool {
        self.in_flight.len() < MAX_IN_FLIGHT && !self.in_flight.iter().any(|f| f.has_head)
    }

    /// Sends `round_trip`, carrying `messages`, `refunds` and `sync` as read at `now`.
    pub(crate) fn start(
        &mut self,
        round_trip: StoreFuture,
        messages: Vec<StoreBound>,
        refunds: Vec<Op>,
        sync: Vec<SyncOp>,
        now: u64,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let has_head = messages.iter().any(|m| matches!(m, StoreBound::Head(..)));
        self.in_flight.push_back(InFlight {
            seq,
            has_head,
            messages,
            refunds,
            sync,
            now,
            abandoned: false,
        });
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = round_trip.await;
            let latency = started.elapsed();
            let _ = tx.send(Done {
                seq,
                result,
                latency,
            });
        });
    }

    /// A round trip finished: its answer waits until the older ones are back.
    pub(crate) fn arrive(&mut self, done: Done) {
        self.arrived.push(done);
    }

    /// The oldest round trip out with its answer and latency, if that is back.
    pub(crate) fn next_back(
        &mut self,
    ) -> Option<(InFlight, Result<Vec<StoreReply>, StoreError>, Duration)> {
        let Some(oldest) = self.in_flight.front().map(|f| f.seq) else {
            self.arrived.clear();
            return None;
        };
        let i = self.arrived.iter().position(|d| d.seq == oldest)?;
        let Done {
            result, latency, ..
        } = self.arrived.swap_remove(i);
        let flight = self.in_flight.pop_front().expect("oldest");
        Some((flight, result, latency))
    }

    /// Hits of `key` refunded in the round trips out.
    pub(crate) fn refunds_of(&self, key: &Key) -> i64 {
        let out = self.in_flight.iter().flat_map(|f| f.refunds.iter());
        out.filter(|u| &u.key == key).map(|u| u.hits as i64).sum()
    }
}
