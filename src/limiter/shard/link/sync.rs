//! What a sync round trip carries: hits admitted here, added to the store whatever the limit
//! says (a local-first view's, or an exact limit's kept while the store was away), and how a
//! count read back takes the hits it has not seen.

use crate::limiter::algorithm::{Params, State};
use crate::limiter::op::Op;
use crate::limiter::store::StoreOp;

/// One key's part of a sync round trip: `op.hits` to add, or to give back.
pub(crate) struct SyncOp {
    pub(super) op: Op,
    pub(super) at: u64,
    pub(super) refund: bool,
    /// An exact limit's hits kept while the store was away (`away`), not a view's.
    pub(super) kept: bool,
}

impl SyncOp {
    /// As a store op (`sync_at` set).
    pub(crate) fn store_op(&self) -> StoreOp<'_> {
        StoreOp {
            op: &self.op,
            refund: self.refund,
            sync_at: Some(self.at),
            in_full: false,
        }
    }

    /// `hits` of `op`'s key (negative: given back), counted into the window holding `at`; a
    /// view's, or hits `kept` while the store was away.
    pub(super) fn new(op: &Op, hits: i64, at: u64, kept: bool) -> SyncOp {
        let mut op = op.clone();
        op.hits = hits.unsigned_abs();
        SyncOp {
            op,
            at,
            refund: hits < 0,
            kept,
        }
    }

    /// The hits it carries, negative when it gives them back.
    pub(super) fn signed_hits(&self) -> i64 {
        let hits = i64::try_from(self.op.hits).unwrap_or(i64::MAX);
        if self.refund {
            -hits
        } else {
            hits
        }
    }
}

/// `state` with `hits` added (negative: given back).
pub(crate) fn with_hits(state: State, p: &Params, now: u64, hits: i64) -> State {
    if hits >= 0 {
        state.add(p, now, hits.unsigned_abs())
    } else {
        let mut s = state;
        s.refund(p, now, hits.unsigned_abs());
        s
    }
}
