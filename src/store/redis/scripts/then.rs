//! What follows a command's answer in the same round trip, before the decision is answered.

use super::{Packed, DEL, PEXPIRE};

/// What to do once a packed command is answered: a fixed window's `INCRBY` that made its key
/// (it answers exactly its own hits) gives the key its TTL; a refund's `DECRBY` that made its
/// key deletes it.
#[derive(Debug, Clone, Copy)]
pub(in crate::store::redis) enum Then {
    Nothing,
    ExpireIfCreated {
        hits: u64,
        window_ms: u64,
    },
    /// A `DECRBY` that answered below zero made its key: `DEL` it (no key counts zero).
    DeleteIfMade,
}

impl Then {
    /// Adds to `out` the `PEXPIRE` of the key of command `i` of `sent` when its reply shows it
    /// made the key: TTL one window plus up to `jitter_max_secs` (drawn only for keys being
    /// created); or the `DEL` of a key a `DECRBY` made.
    pub(in crate::store::redis) fn follow_up(
        &self,
        sent: &Packed,
        i: usize,
        reply: &[i64],
        jitter_max_secs: u64,
        out: &mut Packed,
    ) {
        let (hits, window_ms) = match *self {
            Then::Nothing => return,
            Then::ExpireIfCreated { hits, window_ms } => (hits, window_ms),
            Then::DeleteIfMade => {
                if reply.first().is_some_and(|&n| n < 0) {
                    out.start(2);
                    out.encoded(&DEL);
                    out.arg(sent.args(i).get(1).copied().unwrap_or_default());
                }
                return;
            }
        };
        if reply.first() != Some(&(hits as i64)) {
            return;
        }
        let jitter = if jitter_max_secs > 0 {
            rand::random_range(0..jitter_max_secs) * 1000
        } else {
            0
        };
        let args = sent.args(i);
        out.start(3);
        out.encoded(&PEXPIRE);
        out.arg(args.get(1).copied().unwrap_or_default());
        out.int(window_ms.max(1) + jitter);
    }
}
