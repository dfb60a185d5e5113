//! Admin actions on one key, handled by the shard that owns it so they fall between its
//! decisions: a look-up (counting nothing) and a reset (this replica's state, then the store's).
//!
//! A reset forgets here, in this order of the shard's own bookkeeping: the table's state (set
//! fresh, so the next decision starts from zero), the key's protection from eviction and its
//! direct-API refusals, the over-limit cache entry, the local-first view with its hits not yet
//! synced, and hits waiting to be given back to the store. Other replicas' caches and views are
//! not reached from here: their over-limit cache entries refuse until they expire (the window's
//! end, as the reference's local cache), their views take the store's count at their next sync.

use super::synced::with_hits;
use super::table::to_secs_ceil;
use super::Shard;
use crate::limiter::algorithm::State;
use crate::limiter::op::Op;
use crate::limiter::protocol::{Deleting, LookedUp, Peeking};
use crate::limiter::store::StoreError;

impl Peeking {
    /// The key's state: the shard's, or the store's with this replica's unsynced hits.
    pub(crate) async fn finish(self) -> Result<LookedUp, StoreError> {
        let Some((read, unsynced, params)) = self.store else {
            return Ok(self.here);
        };
        let replies = read.await?;
        let before = replies
            .first()
            .ok_or_else(|| StoreError("the store answered nothing".into()))?
            .before;
        Ok(LookedUp {
            state: with_hits(before, &params, self.here.now, unsynced),
            ..self.here
        })
    }
}

impl Shard {
    /// The key's state as a decision now would start from it; with a store whose breaker lets
    /// decisions through, the store's count is read instead.
    pub(super) fn look_up(&self, op: &Op) -> Peeking {
        let now = self.clock.now();
        let state = (self.find(&op.key))
            .map(|e| e.state)
            .filter(|s| s.fits(&op.params))
            .unwrap_or_else(|| State::fresh(&op.params, now));
        let here = LookedUp {
            state,
            waiting: self.queues.get(&op.key).map_or(0, |q| q.len()),
            now,
        };
        let store = (self.link.as_ref())
            .filter(|r| r.breaker.ready())
            .map(|r| (r.peek(op, now), r.synced.unsynced(op, now), op.params));
        Peeking { here, store }
    }

    /// Forgets the key's state here (see the module's note) and, with `delete` and a store,
    /// starts deleting its store keys. Waiters get the room: in memory at once, with a store
    /// once the deletion is done (the second, non-deleting reset), so what they count is not
    /// deleted with the rest.
    pub(super) fn reset(&mut self, op: &Op, delete: bool) -> Deleting {
        let now = self.clock.now();
        if let Some(at) = self.table.find(op.key.as_str(), op.key.hash()) {
            let e = self.table.get_mut(at);
            e.state = State::fresh(&op.params, now);
            e.expires_s = to_secs_ceil(e.state.expires_at(&op.params, now));
        }
        self.refused.remove(&op.key.hash());
        self.denied.remove(&op.key);
        let deleting = match self.link.as_mut() {
            Some(r) => {
                r.over.remove(&op.key);
                r.synced.forget(&op.key);
                r.refunds.retain(|u| u.key != op.key);
                delete.then(|| r.delete(op, now))
            }
            None => None,
        };
        if deleting.is_none() && self.queues.contains_key(&op.key) {
            self.service_queue(&op.key, now);
        }
        Deleting(deleting)
    }
}
