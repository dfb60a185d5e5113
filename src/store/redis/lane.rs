//! One round trip's commands to one deployment. A hot key is asked for by many calls within a
//! round trip; their `INCRBY`s on it go as one, and each op's reply is read back from that one
//! answer as if each had gone alone, one after another.

use std::hash::BuildHasherDefault;

use super::decode::Ints;
use super::packed::Packed;
use super::scripts::{pack, Beside, Cmd, Name, Named, Then};
use crate::limiter::key::{Key, KeyHasher};

/// The commands of one deployment in one round trip, and whose answer each one is.
pub(super) struct Lane<'a> {
    /// Each command, in the order it goes.
    cmds: Vec<Cmd<'a>>,
    /// The op (its place in the batch) that each command answers first.
    first: Vec<usize>,
    /// Ops whose hits went with an earlier op's `INCRBY` of the same key, in batch order.
    joined: Vec<Joined>,
    /// The `INCRBY` commands that others may join, by their key's hash and window start.
    incrs: hashbrown::HashMap<u64, usize, BuildHasherDefault<KeyHasher>>,
}

/// An op counted by an earlier op's command: `hits` of that command's total are its own.
struct Joined {
    op: usize,
    cmd: usize,
    hits: u64,
}

impl<'a> Lane<'a> {
    pub(super) fn with_capacity(n: usize) -> Lane<'a> {
        Lane {
            cmds: Vec::with_capacity(n),
            first: Vec::with_capacity(n),
            joined: Vec::new(),
            incrs: hashbrown::HashMap::default(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// Adds op `op`'s command `c` for counter `key`. With `may_join`, an `INCRBY` of a key this
    /// round trip already increments adds its hits to that command instead of going alone. Only
    /// ops that nothing else touches in between may join: a decision's (not a refund's or a
    /// sync's, which come after every decision in a batch).
    pub(super) fn push(&mut self, op: usize, key: &Key, c: Cmd<'a>, may_join: bool) {
        if let (true, Some((name, hits))) = (may_join, counted(&c)) {
            let at = self.cmds.len();
            let tag = key.hash() ^ name.start_ms().wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let slot = *self.incrs.entry(tag).or_insert(at);
            if slot != at {
                let same = std::mem::discriminant(&self.cmds[slot]) == std::mem::discriminant(&c);
                if let (true, Some((same_name, total))) = (same, counted_mut(&mut self.cmds[slot]))
                {
                    // A different key with the same tag goes alone.
                    if same_name == name {
                        *total = total.saturating_add(hits);
                        self.joined.push(Joined {
                            op,
                            cmd: slot,
                            hits,
                        });
                        return;
                    }
                }
            }
        }
        self.cmds.push(c);
        self.first.push(op);
    }

    /// The commands packed in RESP, what follows each one's answer, and how the answers go
    /// back to the ops.
    pub(super) fn pack(self) -> (Packed, Vec<Then>, Answers) {
        let mut out = Packed::with_capacity(self.cmds.len());
        for c in &self.cmds {
            pack(c, &mut out);
        }
        let then = self.cmds.iter().map(Cmd::then).collect();
        let answers = Answers {
            first: self.first,
            joined: self.joined,
        };
        (out, then, answers)
    }
}

/// The key and hits of a command that only adds hits and answers the count after them first
/// (`INCRBY`, and `FIRST_HIT` counting, which answers the key's TTL and its holds after it):
/// others may join it. A `FIRST_HIT` that reserves or commits a named hold goes alone.
fn counted<'a>(c: &Cmd<'a>) -> Option<(Name<'a>, u64)> {
    match *c {
        Cmd::Fixed { key, hits, .. } => Some((key, hits)),
        Cmd::FirstHit {
            key, hits, holds, ..
        } if joins(holds) => Some((key, hits)),
        _ => None,
    }
}

fn counted_mut<'c, 'a>(c: &'c mut Cmd<'a>) -> Option<(Name<'a>, &'c mut u64)> {
    match c {
        Cmd::Fixed { key, hits, .. } => Some((*key, hits)),
        Cmd::FirstHit {
            key, hits, holds, ..
        } if joins(*holds) => Some((*key, hits)),
        _ => None,
    }
}

/// Whether a `FIRST_HIT` only counts (or reads) beside the named holds.
fn joins(holds: Option<Beside>) -> bool {
    holds.is_none_or(|b| b.named == Named::Count)
}

/// Which op each answer of a lane's round trip is for.
pub(super) struct Answers {
    first: Vec<usize>,
    joined: Vec<Joined>,
}

impl Answers {
    /// Puts each op's reply in `out` (by its place in the batch), from `replies` to the
    /// commands in order. An op that joined a command gets the count after its own hits: the
    /// command's count less the hits of the ops after it (and what else the command answers,
    /// a key's TTL, as it is).
    pub(super) fn answer(self, mut replies: Vec<Ints>, out: &mut [Ints]) {
        for j in self.joined.iter().rev() {
            let Some(reply) = replies.get_mut(j.cmd) else {
                continue;
            };
            let Some(count) = reply.first_mut() else {
                continue;
            };
            let own = *count;
            *count = count.saturating_sub(j.hits as i64);
            let mut mine = reply.clone();
            mine[0] = own;
            out[j.op] = mine;
        }
        for (i, r) in self.first.into_iter().zip(replies) {
            out[i] = r;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{test_op, RedisStore};
    use super::*;
    use crate::config::Algorithm;
    use crate::limiter::Op;

    fn op(key: &str, window_ms: u64, hits: u64) -> Op {
        test_op(key, Algorithm::FixedWindow, window_ms, hits)
    }

    const NOW: u64 = 1_700_000_041_000_000_000;

    fn text(p: &Packed) -> String {
        String::from_utf8(p.bytes().to_vec()).unwrap()
    }

    fn ints(n: &[i64]) -> Ints {
        Ints::from_slice(n)
    }

    #[test]
    fn a_hot_key_goes_as_one_incrby_and_each_op_reads_its_own_count() {
        let s = RedisStore::for_tests("");
        let ops = [
            op("k_", 60_000, 1),
            op("k_", 60_000, 2),
            op("k_", 60_000, 4),
        ];
        let mut lane = Lane::with_capacity(3);
        for (i, o) in ops.iter().enumerate() {
            lane.push(i, &o.key, s.cmd(o, NOW, false), true);
        }
        let (cmds, then, answers) = lane.pack();
        assert_eq!(cmds.len(), 1);
        assert_eq!(
            text(&cmds),
            "*3\r\n$6\r\nINCRBY\r\n$12\r\nk_1700000040\r\n$1\r\n7\r\n"
        );
        // The key made by this round trip (its count is all the hits) gets one TTL.
        let mut expire = Packed::default();
        then[0].follow_up(&cmds, 0, &[7], 0, &mut expire);
        assert_eq!(expire.len(), 1);
        let mut out = vec![Ints::new(); 3];
        answers.answer(vec![ints(&[17])], &mut out);
        // As if they had gone one after another on a key at 10: 11, 13, 17.
        assert_eq!(out, [ints(&[11]), ints(&[13]), ints(&[17])]);
    }

    #[test]
    fn other_keys_windows_and_ops_that_may_not_join_go_alone() {
        let s = RedisStore::for_tests("");
        let ops = [
            op("k_", 60_000, 1),
            op("other_", 60_000, 1),
            op("k_", 1_000, 1),
            op("k_", 60_000, 1),
            op("k_", 60_000, 5),
        ];
        let mut lane = Lane::with_capacity(ops.len());
        for (i, o) in ops.iter().enumerate() {
            // The last is a sync or a refund: it keeps its place after the others.
            lane.push(i, &o.key, s.cmd(o, NOW, false), i != 4);
        }
        let (cmds, _, answers) = lane.pack();
        assert_eq!(cmds.len(), 4);
        let first = cmds.args(0);
        assert_eq!(first[1], b"k_1700000040");
        assert_eq!(first[2], b"2");
        assert_eq!(cmds.args(2)[1], b"k_1700000041");
        assert_eq!(cmds.args(3)[1], b"k_1700000040");
        let mut out = vec![Ints::new(); 5];
        answers.answer(
            vec![ints(&[2]), ints(&[1]), ints(&[1]), ints(&[7])],
            &mut out,
        );
        assert_eq!(
            out,
            [ints(&[1]), ints(&[1]), ints(&[1]), ints(&[2]), ints(&[7])]
        );
    }

    #[test]
    fn first_hit_windows_join_and_each_op_reads_its_count_and_the_ttl() {
        let s = RedisStore::for_tests("");
        let ops = [
            test_op("k_", Algorithm::FromFirstHit, 60_000, 1),
            test_op("k_", Algorithm::FromFirstHit, 60_000, 2),
        ];
        let mut lane = Lane::with_capacity(2);
        for (i, o) in ops.iter().enumerate() {
            lane.push(i, &o.key, s.cmd(o, NOW, false), true);
        }
        let (cmds, _, answers) = lane.pack();
        assert_eq!(cmds.len(), 1);
        assert_eq!(cmds.args(0)[5], b"3");
        let mut out = vec![Ints::new(); 2];
        answers.answer(vec![ints(&[3, 59_000])], &mut out);
        assert_eq!(out, [ints(&[1, 59_000]), ints(&[3, 59_000])]);
    }

    #[test]
    fn a_reserve_or_a_commit_goes_alone_beside_counts_of_its_counter() {
        let s = RedisStore::for_tests("");
        let count = test_op("k_", Algorithm::FromFirstHit, 60_000, 1);
        let commit = Op {
            reserve: crate::limiter::Reservation::Named(crate::limiter::NamedHolds::Commit {
                id: 7,
            }),
            ..count.clone()
        };
        let reserve = Op {
            hits: 0,
            reserve: crate::limiter::Reservation::Named(crate::limiter::NamedHolds::Reserve {
                hits: 3,
                for_ms: 1000,
                id: 8,
            }),
            ..count.clone()
        };
        let mut lane = Lane::with_capacity(4);
        for (i, o) in [&count, &commit, &reserve, &count].into_iter().enumerate() {
            lane.push(i, &o.key, s.cmd(o, NOW, false), true);
        }
        let (cmds, _, _) = lane.pack();
        // The two counts join; the commit and the reserve keep their ids.
        assert_eq!(cmds.len(), 3);
        assert_eq!(cmds.args(0)[5], b"2");
    }

    #[test]
    fn scripts_never_join() {
        let s = RedisStore::for_tests("");
        let mut o = op("k_", 60_000, 1);
        o.params.algorithm = Algorithm::SlidingWindow;
        let mut lane = Lane::with_capacity(2);
        lane.push(0, &o.key, s.cmd(&o, NOW, false), true);
        lane.push(1, &o.key, s.cmd(&o, NOW, false), true);
        let (cmds, _, _) = lane.pack();
        assert_eq!(cmds.len(), 2);
    }
}
