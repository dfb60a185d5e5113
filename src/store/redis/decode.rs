//! Redis's replies read back: integers, then the key's state and the script's verdict per op.

use redis::Value;
use smallvec::SmallVec;

use crate::config::Algorithm;
use crate::limiter::{CountedHolds, HoldReply, NamedHolds, Params, Reservation, State, StoreReply};

/// What an op asked of Redis, kept to read its reply.
pub(super) struct Asked {
    pub(super) params: Params,
    pub(super) hits: u64,
    pub(super) refund: bool,
    /// Counted whatever the limit says: the reply holds the hits, and the shard judges.
    pub(super) in_full: bool,
    /// The time the op was counted at (its window), ns since the epoch.
    pub(super) at: u64,
    /// When its round trip went (ns since the epoch): a TTL Redis answers counts from then
    /// (`at` is older for a local-first sync).
    pub(super) sent: u64,
    /// Asked of `HOLD` (a check holding, or a report releasing): its reply is that script's.
    pub(super) holds: Option<CountedHolds>,
    /// The op's reservation: a window from the first hit's reply tells a `Reserve` whether it
    /// holds, a `Commit` whether it ended its hold.
    pub(super) reserve: Reservation,
}

impl Asked {
    /// Turns the reply to this op (the integers of a script's array, or INCRBY's count) into
    /// the key's state before the op's hits and the script's verdict.
    pub(super) fn decode(&self, reply: &[i64]) -> StoreReply {
        let p = &self.params;
        let now = self.at;
        let w = p.window_ms.max(1) * 1_000_000;
        // States keep the window index modulo 2^32 (see `State`).
        let idx = p.span(now).idx as u32;
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let first = reply.first().copied().unwrap_or(0);
        if let Some(r) = self.holds {
            return decode_hold(p, idx, now, r, reply);
        }
        if self.refund {
            return decode_refund(p, idx, now, first);
        }
        let hits = self.hits;
        match p.algorithm {
            // FIRST_HIT answers {count after, PTTL in ms, held, done}: the window ends when the
            // key does (a key that is not there, -2, holds no window).
            Algorithm::FromFirstHit => {
                let at = |i: usize| reply.get(i).copied().unwrap_or(0).max(0) as u64;
                let done = at(3) == 1;
                let named = self.reserve.named();
                StoreReply {
                    before: first_hit(p, self.sent, first, hits, reply.get(1).copied()),
                    allowed: matches!(named, Some(NamedHolds::Reserve { .. })).then_some(done),
                    holds: HoldReply {
                        named: at(2),
                        released: done && matches!(named, Some(NamedHolds::Commit { .. })),
                        ..HoldReply::default()
                    },
                }
            }
            // INCRBY answers the count after the hits.
            Algorithm::FixedWindow => StoreReply {
                before: State::Fixed {
                    window: idx,
                    count: clamp((first.max(0) as u64).saturating_sub(hits)),
                },
                allowed: None,
                holds: HoldReply::default(),
            },
            // SLIDING answers {allowed, current count after, previous count}.
            Algorithm::SlidingWindow => {
                let allowed = first == 1 || self.in_full;
                let cur = reply.get(1).copied().unwrap_or(0).max(0) as u64;
                let prev = reply.get(2).copied().unwrap_or(0).max(0) as u64;
                let cur = if allowed {
                    cur.saturating_sub(hits)
                } else {
                    cur
                };
                StoreReply {
                    before: State::Sliding {
                        window: idx,
                        prev: clamp(prev),
                        cur: clamp(cur),
                    },
                    allowed: Some(allowed).filter(|_| !self.in_full),
                    holds: HoldReply::default(),
                }
            }
            // GCRA and GCRA_ADD answer {allowed, TAT after (µs)}.
            Algorithm::TokenBucket { .. } => {
                let allowed = first == 1 || self.in_full;
                let tat = reply.get(1).copied().unwrap_or(0).max(0) as u64 * 1000;
                let interval = w / u64::from(p.requests_per_unit.max(1));
                let tat = if allowed {
                    tat.saturating_sub(interval.saturating_mul(hits))
                } else {
                    tat
                };
                StoreReply {
                    before: State::Gcra { tat },
                    allowed: Some(allowed).filter(|_| !self.in_full),
                    holds: HoldReply::default(),
                }
            }
        }
    }
}

/// FIRST_HIT's `{count after, PTTL}` as the state before `hits`: the window ends when the key
/// does, measured from `sent` (when the op went: never later than Redis's own end).
pub(super) fn first_hit(p: &Params, sent: u64, count: i64, hits: u64, pttl: Option<i64>) -> State {
    let count = u32::try_from((count.max(0) as u64).saturating_sub(hits)).unwrap_or(u32::MAX);
    match pttl {
        // A read that found no key: no window.
        Some(-2) => State::FromFirstHit { count: 0, end: 0 },
        Some(ms) if ms >= 0 => State::FromFirstHit {
            count,
            end: sent.saturating_add((ms as u64).saturating_mul(1_000_000)),
        },
        // A key without a TTL (another writer's): no later than a window from now.
        _ => State::FromFirstHit {
            count,
            end: sent.saturating_add(p.window_ns()),
        },
    }
}

/// A refund's reply: REFUND_COUNT and REFUND_GCRA answer the state after (-1: the key is gone).
fn decode_refund(p: &Params, idx: u32, now: u64, first: i64) -> StoreReply {
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let before = match p.algorithm {
        Algorithm::FixedWindow => State::Fixed {
            window: idx,
            count: clamp(first.max(0) as u64),
        },
        Algorithm::FromFirstHit => State::FromFirstHit {
            count: clamp(first.max(0) as u64),
            end: now.saturating_add(p.window_ns()),
        },
        Algorithm::SlidingWindow => State::Sliding {
            window: idx,
            prev: 0,
            cur: first.max(0) as u32,
        },
        Algorithm::TokenBucket { .. } => State::Gcra {
            tat: if first < 0 { now } else { first as u64 * 1000 },
        },
    };
    StoreReply {
        before,
        allowed: None,
        holds: HoldReply::default(),
    }
}

/// `HOLD`'s reply `{done, holds before, holds expired, a, b}`: the counter before the op (fixed:
/// a count; sliding: current and previous counts; token bucket: the TAT in µs) and its holds.
fn decode_hold(p: &Params, idx: u32, now: u64, r: CountedHolds, reply: &[i64]) -> StoreReply {
    let at = |i: usize| reply.get(i).copied().unwrap_or(0).max(0) as u64;
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let before = match p.algorithm {
        Algorithm::FixedWindow => State::Fixed {
            window: idx,
            count: clamp(at(3)),
        },
        Algorithm::FromFirstHit => State::FromFirstHit {
            count: clamp(at(3)),
            end: now.saturating_add(p.window_ns()),
        },
        Algorithm::SlidingWindow => State::Sliding {
            window: idx,
            cur: clamp(at(3)),
            prev: clamp(at(4)),
        },
        Algorithm::TokenBucket { .. } => State::Gcra { tat: at(3) * 1000 },
    };
    let done = at(0) == 1;
    let check = matches!(r, CountedHolds::Hold { .. });
    StoreReply {
        before,
        allowed: check.then_some(done),
        holds: HoldReply {
            held: clamp(at(1)),
            expired: clamp(at(2)),
            released: !check && done,
            named: 0,
        },
    }
}

/// The state a decision at `now` (ns) would start from, from the values of the keys
/// `RedisStore::keys_of` names, in its order (`None`: the key is not there): the fixed window's
/// count; the sliding window's current and previous counts; the bucket's TAT in microseconds.
pub(super) fn stored(p: &Params, now: u64, values: &[Option<i64>]) -> State {
    let idx = p.span(now).idx as u32;
    let count = |i: usize| {
        let n = values.get(i).copied().flatten().unwrap_or(0).max(0);
        u32::try_from(n).unwrap_or(u32::MAX)
    };
    match p.algorithm {
        Algorithm::FixedWindow => State::Fixed {
            window: idx,
            count: count(0),
        },
        Algorithm::FromFirstHit => State::FromFirstHit {
            count: count(0),
            end: now.saturating_add(p.window_ns()),
        },
        Algorithm::SlidingWindow => State::Sliding {
            window: idx,
            cur: count(0),
            prev: count(1),
        },
        Algorithm::TokenBucket { .. } => State::Gcra {
            tat: match values.first().copied().flatten() {
                Some(us) if us > 0 => (us as u64).saturating_mul(1000),
                _ => now,
            },
        },
    }
}

/// A reply's integers (`FIRST_HIT` answers four, `HOLD` five), kept inline up to four.
pub(super) type Ints = SmallVec<[i64; 4]>;

/// A reply's integers: a number, or the numbers of an array (nested arrays flattened).
pub(super) fn ints(v: Value) -> Ints {
    let mut out = Ints::new();
    push_ints(v, &mut out);
    out
}

fn push_ints(v: Value, out: &mut Ints) {
    match v {
        Value::Int(i) => out.push(i),
        Value::Array(items) => items.into_iter().for_each(|v| push_ints(v, out)),
        Value::BulkString(b) => {
            out.extend(std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok()))
        }
        Value::SimpleString(s) => out.extend(s.parse().ok()),
        _ => {}
    }
}
