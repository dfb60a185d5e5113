//! A counter's keys read and deleted for the admin listener's look-up and reset, named by the
//! same code that names them for deciding (`RedisStore::cmd`), so a reset reaches exactly the
//! keys every replica counts in.

use std::time::Duration;

use super::connect::exec;
use super::decode::{self, stored};
use super::packed::Packed;
use super::scripts::{held_of as named_holds, pack, Cmd, Name};
use super::{within, RedisStore};
use crate::config::Algorithm;
use crate::limiter::{
    CountedHolds, DeleteFuture, HoldReply, Op, Reservation, StoreFuture, StoreReply,
};

impl RedisStore {
    /// The keys `op`'s algorithm reads to decide at `now` (ns): the fixed window's key of the
    /// current window; the sliding window's current and previous windows' keys; the token
    /// bucket's TAT key.
    fn keys_of<'a>(&'a self, op: &'a Op, now: u64) -> Vec<Name<'a>> {
        match self.cmd(op, now, false) {
            Cmd::Fixed { key, .. } | Cmd::FirstHit { key, .. } | Cmd::Gcra { key, .. } => {
                vec![key]
            }
            Cmd::Sliding { cur, prev, .. } => vec![cur, prev],
            other => unreachable!("a deciding command is fixed, sliding or GCRA: {other:?}"),
        }
    }

    /// The sorted set of `op`'s holds, for a limit with `reserve`.
    fn held_of<'a>(&'a self, op: &'a Op, now: u64) -> Option<Name<'a>> {
        matches!(op.reserve, Reservation::Counted(CountedHolds::Hold { .. }))
            .then(|| self.held_name(op, now))
    }

    /// `GET` of each key (`INCRBY key 0` would create a fixed window's key), decoded into the
    /// state a decision at `now` would start from; a window from the first hit is read by
    /// `FIRST_HIT` of no hits, which answers its TTL too (and creates nothing).
    pub(super) fn read_keys(
        &self,
        lane: usize,
        op: &Op,
        now: u64,
        deadline: Duration,
    ) -> StoreFuture {
        let names = self.keys_of(op, now);
        let n = names.len();
        let mut cmds = Packed::with_capacity(n + 1);
        let first_hit = op.params.algorithm == Algorithm::FromFirstHit;
        for key in names {
            match first_hit {
                true => pack(&first_hit_read(key), &mut cmds),
                false => pack(&Cmd::Get { key }, &mut cmds),
            }
        }
        // A limit with `reserve`: its holds not expired yet.
        if let Some(held) = self.held_of(op, now) {
            let now_us = now / 1000;
            pack(&Cmd::CountHeld { held, now_us }, &mut cmds);
        }
        let conn = self.deployment(&op.params).conn(lane);
        let params = op.params;
        Box::pin(async move {
            let replies = within(deadline, exec(&conn, &cmds)).await?;
            let values: Vec<Option<i64>> = replies.iter().map(|r| r.first().copied()).collect();
            let held = values.get(n).copied().flatten().unwrap_or(0).max(0);
            let before = match (first_hit, replies.first()) {
                (true, Some(r)) => {
                    let count = r.first().copied().unwrap_or(0);
                    decode::first_hit(&params, now, count, 0, r.get(1).copied())
                }
                _ => stored(&params, now, &values[..n]),
            };
            Ok(vec![StoreReply {
                before,
                allowed: None,
                holds: HoldReply {
                    held: u32::try_from(held).unwrap_or(u32::MAX),
                    ..HoldReply::default()
                },
            }])
        })
    }

    /// `DEL` of each key; answers how many were there.
    pub(super) fn delete_keys(
        &self,
        lane: usize,
        op: &Op,
        now: u64,
        deadline: Duration,
    ) -> DeleteFuture {
        let mut names = self.keys_of(op, now);
        names.extend(self.held_of(op, now));
        // A window from the first hit: its named holds (Limitador's `Reserve`) go with it.
        if op.params.algorithm == Algorithm::FromFirstHit {
            names.extend(names.first().map(named_holds));
        }
        let mut cmds = Packed::with_capacity(names.len());
        for key in names {
            pack(&Cmd::Del { key }, &mut cmds);
        }
        let conn = self.deployment(&op.params).conn(lane);
        Box::pin(async move {
            let replies = within(deadline, exec(&conn, &cmds)).await?;
            Ok(replies
                .iter()
                .filter_map(|r| r.first())
                .map(|n| (*n).max(0) as u64)
                .sum())
        })
    }
}

/// `FIRST_HIT` of no hits on `key`: reads its count and TTL.
fn first_hit_read(key: Name<'_>) -> Cmd<'_> {
    Cmd::FirstHit {
        key,
        hits: 0,
        window_ms: 1,
        holds: None,
    }
}
