//! Direct API grants: hits admitted under a request id, so `DELETE /rate/{key}/{id}` can give
//! them back while their window lasts.

use super::Shard;
use crate::limiter::algorithm::Params;
use crate::limiter::key::Key;
use crate::limiter::op::{Op, Role};

/// A hit admitted through the direct API, so `DELETE /rate/{key}/{id}` can give it back.
pub(super) struct Grant {
    key: Key,
    pub(super) window: u64,
    pub(super) params: Params,
}

/// Grants remembered per shard; past this, admitted hits cannot be released (the window
/// still ends, so nothing is lost but the early release).
const MAX_GRANTS: usize = 100_000;

impl Shard {
    /// Remembers the hit `op` admitted as grant `id`.
    pub(super) fn remember_grant(&mut self, id: u64, op: &Op, now: u64) {
        if self.grants.len() < MAX_GRANTS {
            self.grants.insert(
                id,
                Grant {
                    key: op.key.clone(),
                    window: now / op.params.window_ns(),
                    params: op.params,
                },
            );
        }
    }

    /// Gives back the hit admitted as `id` on `key`, if it is still in its window; answers
    /// whether it was found.
    pub(super) fn release(&mut self, key: Key, id: u64) -> bool {
        let now = self.clock.now();
        let found = match self.grants.get(&id) {
            Some(g) if g.key == key => g.window == now / g.params.window_ns(),
            _ => false,
        };
        if let Some(g) = self.grants.remove(&id).filter(|_| found) {
            let op = Op {
                key,
                params: g.params,
                hits: 1,
                refund: true,
                role: Role::Binding,
                queue: None,
                grant: None,
                counting: crate::limiter::Counting::IfAdmitted,
                local_first: Some(false),
            };
            self.refund(&op, now);
        }
        found
    }
}
