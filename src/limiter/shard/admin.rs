//! Admin actions on one key, handled by the shard that owns it so they fall between its
//! decisions: a look-up (counting nothing), a reset (this replica's state, then the store's),
//! and the direct API's release of a grant.
//!
//! A reset forgets here, in this order of the shard's own bookkeeping: the table's state (set
//! fresh, so the next decision starts from zero), the key's protection from eviction and its
//! direct-API refusals, the over-limit cache entry, the local-first view with its hits not yet
//! synced, and hits waiting to be refunded in the store. Other replicas' caches and views are
//! not reached from here: their over-limit cache entries refuse until they expire (the window's
//! end, as the reference's local cache), their views take the store's count at their next sync.

use super::decide::{Decider, Hooks};
use super::link::with_hits;
use crate::limiter::algorithm::State;
use crate::limiter::key::Key;
use crate::limiter::op::{Counting, Op, Role};
use crate::limiter::protocol::{Deleting, LookedUp, Peeking, StorePeek};
use crate::limiter::store::StoreError;

impl Peeking {
    /// The key's state: the shard's, or the store's with this replica's unsynced hits.
    pub(crate) async fn finish(self) -> Result<LookedUp, StoreError> {
        let Some(StorePeek {
            read,
            unsynced,
            params,
        }) = self.store
        else {
            return Ok(self.here);
        };
        let replies = read.await?;
        let reply = replies
            .first()
            .ok_or_else(|| StoreError("the store answered nothing".into()))?;
        Ok(LookedUp {
            state: with_hits(reply.before, &params, self.here.now, unsynced),
            held: u64::from(reply.holds.held),
            ..self.here
        })
    }
}

impl<B: Hooks> Decider<'_, B> {
    /// The key's state as a decision now would start from it; with a store whose breaker lets
    /// decisions through, the store's count is read instead.
    pub(super) fn look_up(&mut self, op: &Op) -> Peeking {
        let now = self.cx.clock.now();
        let state = (self.counters.state_of(&op.key, &op.params))
            .unwrap_or_else(|| State::fresh(&op.params, now));
        let here = LookedUp {
            state,
            waiting: self.queues.len_of(&op.key.borrowed()),
            held: self.holds.peek(&op.key, &op.params, now),
            now,
        };
        let store = self.backing.peek(op, now);
        Peeking { here, store }
    }

    /// Forgets the key's state here (see the module's note) and, with `delete` and a store,
    /// starts deleting its store keys. Waiters get the room: in memory at once, with a store
    /// once the deletion is done (the second, non-deleting reset), so what they count is not
    /// deleted with the rest.
    pub(super) fn reset(&mut self, op: &Op, delete: bool) -> Deleting {
        let now = self.cx.clock.now();
        self.counters.reset(&op.key, &op.params, now);
        self.holds.forget(&op.key);
        let deleting = self.backing.forget(op, delete, now);
        if deleting.is_none() && self.queues.has_key(&op.key) {
            self.service_queue(&op.key, now);
        }
        Deleting(deleting)
    }

    /// Direct API: refunds the hit admitted as `id` on `key`, if it is still in its window;
    /// answers whether it was found.
    pub(super) fn release(&mut self, key: Key, id: u64) -> bool {
        let now = self.cx.clock.now();
        let Some(params) = self.counters.take_grant(&key, id, now) else {
            return false;
        };
        let op = Op {
            key,
            params,
            hits: 1,
            refund: true,
            role: Role::Binding,
            queue: None,
            grant: None,
            counting: Counting::IfAdmitted,
            local_first: Some(false),
            reserve: crate::limiter::Reservation::None,
        };
        self.refund(&op, now);
        true
    }
}
