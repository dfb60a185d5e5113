//! What a sync round trip carries: hits the ledger sends, added to the store whatever the limit
//! says (a local-first sync's, or a fallback replay's), and how a count read back takes the
//! hits it has not seen.

use crate::limiter::algorithm::{Params, State};
use crate::limiter::op::Op;
use crate::limiter::store::StoreOp;

/// The ledger a sync's hits come from: how they came to be decided here, and so how they
/// wait and go (`ledger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Local-first limits: synced every interval, read back whether or not hits wait.
    LocalFirst,
    /// Exact limits decided while the store was away: replayed once the breaker lets a round
    /// trip through; a bucket's tokens refill while they wait.
    Fallback,
}

/// One key's part of a sync round trip: `op.hits` to add, or to refund.
pub(crate) struct SyncOp {
    pub(super) op: Op,
    pub(super) at: u64,
    pub(super) refund: bool,
    /// The ledger it came from.
    pub(super) mode: Mode,
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

    /// `hits` of `op`'s key (negative: refunded), counted into the window holding `at`, from
    /// the ledger of `mode`.
    pub(super) fn new(op: &Op, hits: i64, at: u64, mode: Mode) -> SyncOp {
        let mut op = op.clone();
        op.hits = hits.unsigned_abs();
        SyncOp {
            op,
            at,
            refund: hits < 0,
            mode,
        }
    }

    /// The hits it carries, negative for a refund.
    pub(super) fn signed_hits(&self) -> i64 {
        let hits = i64::try_from(self.op.hits).unwrap_or(i64::MAX);
        if self.refund {
            -hits
        } else {
            hits
        }
    }
}

/// `state` with `hits` added (negative: refunded).
pub(crate) fn with_hits(state: State, p: &Params, now: u64, hits: i64) -> State {
    if hits >= 0 {
        state.add(p, now, hits.unsigned_abs())
    } else {
        let mut s = state;
        s.refund(p, now, hits.unsigned_abs());
        s
    }
}
