//! The counting rules, as pure functions of (state, limit, now, hits): no clocks, no I/O.
//!
//! Times are nanoseconds since the Unix epoch. Windows are aligned to the epoch, or follow a
//! time zone's calendar, so every replica agrees on where a window starts.

use crate::config::{Algorithm, Calendar, Span};

/// What a shard needs to know about a limit to decide: small and `Copy`, sent with each op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub requests_per_unit: u32,
    /// Window length (fixed, sliding) or period (token bucket); whole seconds for Envoy's
    /// units, any number of milliseconds for the direct HTTP API.
    pub window_ms: u64,
    pub algorithm: Algorithm,
    /// Windows following a zone's calendar; `None` (the rule) for epoch-aligned ones.
    pub calendar: Option<Calendar>,
    /// How a token bucket's stored time is read (other algorithms ignore it).
    pub tat: Tat,
}

/// What a token bucket's stored time means, and so how it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tat {
    /// The time the bucket is full again, brought up to now when it fell behind: the engine's
    /// own, redis-cell's TAT.
    #[default]
    Full,
    /// ThrottleCrab's TAT (`throttlecrab/src/core/rate_limiter.rs` 0.4.40), one interval `T`
    /// before "full" for the parameters that stored it: kept as stored, whatever parameters a
    /// later call brings, until the key expires at TAT + τ (τ = T·(burst-1)); an expired key
    /// starts at now - T. A call taking nothing stores it too.
    ThrottleCrab,
}

impl Params {
    pub(crate) fn window_ns(&self) -> u64 {
        self.window_ms.max(1) * 1_000_000
    }

    /// The window holding `now`.
    #[inline]
    pub fn span(&self, now: u64) -> Span {
        match self.calendar {
            None => Span::aligned(now, self.window_ns()),
            Some(c) => c.span(now),
        }
    }

    /// The start of the window before `s`.
    pub fn prev_start(&self, s: &Span) -> u64 {
        match self.calendar {
            None => s.start.saturating_sub(self.window_ns()),
            Some(c) => c.span(s.start.saturating_sub(1)).start,
        }
    }

    /// The end of the window after `s`.
    pub fn next_end(&self, s: &Span) -> u64 {
        match self.calendar {
            None => s.end.saturating_add(self.window_ns()),
            Some(c) => c.span(s.end).end,
        }
    }

    /// Whether a key full under `full` is full under `self` too: the same way of counting, over
    /// the same window, with no more room (a limit raised since, a per-request override
    /// above it, or a bigger burst is not full yet).
    pub(crate) fn no_roomier_than(&self, full: &Params) -> bool {
        let kind = |p: &Params| match p.algorithm {
            Algorithm::TokenBucket { .. } => Algorithm::TokenBucket { burst: 0 },
            a => a,
        };
        kind(self) == kind(full)
            && (self.window_ms, self.calendar, self.tat)
                == (full.window_ms, full.calendar, full.tat)
            && self.requests_per_unit <= full.requests_per_unit
            && self.burst() <= full.burst()
    }

    /// GCRA's emission interval: the time one token takes to come back.
    pub(crate) fn interval_ns(&self) -> u64 {
        self.window_ns() / u64::from(self.requests_per_unit.max(1))
    }

    fn burst(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket { burst } => u64::from(burst),
            _ => u64::from(self.requests_per_unit),
        }
    }
}

/// Per-key state. Kept to 16 bytes: the shard table holds millions of these.
///
/// `window` is the aligned window's index (start / window length) modulo 2^32: compared with the
/// current index by wrapping difference (0: this window, 1: the one before, else stale). A state
/// would have to sit untouched for 2^32 windows to be misread (136 years of 1 s windows, 49 days
/// of 1 ms ones), and shards drop states within seconds of their expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Count of the aligned window `window`. Above the limit only when usage reported in full
    /// passed it (saturating at `u32::MAX`, past any limit).
    Fixed { window: u32, count: u32 },
    /// Counts of the aligned window `window` and of the one before it.
    Sliding { window: u32, prev: u32, cur: u32 },
    /// GCRA's theoretical arrival time: the bucket is full again at `tat`.
    Gcra { tat: u64 },
    /// Count of a window that started at the key's first hit and ends at `end` (ns); a state
    /// whose `end` has passed counts nothing, and the next hit starts a window.
    FromFirstHit { count: u32, end: u64 },
}

const _: () = assert!(std::mem::size_of::<State>() == 16);

/// The index of the window holding `now`, as stored in a state.
fn index32(idx: u64) -> u32 {
    idx as u32
}

/// How many windows before `idx` the stored `window` is (0: the same one).
fn age(window: u32, idx: u64) -> u32 {
    index32(idx).wrapping_sub(window)
}

/// The result of evaluating one op, before anything is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eval {
    pub over: bool,
    /// What Envoy is told: what is left after this request (0 when over).
    pub remaining: u32,
    /// Until the window ends (fixed, sliding) or the bucket is full again (token bucket).
    pub reset_ns: u64,
    /// The state to store if the op is committed.
    pub next: State,
    /// For a refused op: how long until it would be admitted, if nothing else arrived.
    pub retry_ns: u64,
    /// How far past the limit the key would be with these hits, in hits (0 when within it).
    pub past: u64,
}

impl State {
    /// A fresh state for `p` at `now`, as if the key had never been seen.
    pub fn fresh(p: &Params, now: u64) -> State {
        match p.algorithm {
            Algorithm::FixedWindow => State::Fixed {
                window: index32(p.span(now).idx),
                count: 0,
            },
            Algorithm::SlidingWindow => State::Sliding {
                window: index32(p.span(now).idx),
                prev: 0,
                cur: 0,
            },
            Algorithm::TokenBucket { .. } => match p.tat {
                Tat::Full => State::Gcra { tat: now },
                Tat::ThrottleCrab => State::Gcra {
                    tat: now.saturating_sub(p.interval_ns()),
                },
            },
            Algorithm::FromFirstHit => State::FromFirstHit { count: 0, end: 0 },
        }
    }

    /// Whether this state was made for `p`'s algorithm (a reload may change it).
    pub fn fits(&self, p: &Params) -> bool {
        matches!(
            (self, p.algorithm),
            (State::Fixed { .. }, Algorithm::FixedWindow)
                | (State::Sliding { .. }, Algorithm::SlidingWindow)
                | (State::Gcra { .. }, Algorithm::TokenBucket { .. })
                | (State::FromFirstHit { .. }, Algorithm::FromFirstHit)
        )
    }

    /// Hits counted in the current aligned window (fixed and sliding windows), for `/debug`.
    pub fn count_in_window(&self, p: &Params, now: u64) -> u64 {
        let idx = p.span(now).idx;
        match *self {
            State::Fixed { window, count } if age(window, idx) == 0 => u64::from(count),
            State::Sliding { window, cur, .. } if age(window, idx) == 0 => u64::from(cur),
            State::FromFirstHit { count, end } if end > now => u64::from(count),
            _ => 0,
        }
    }

    /// What the state holds against the limit at `now`, in hits: the current window's count
    /// (fixed), the weighted estimate a decision compares with the limit (sliding), the tokens
    /// taken and not yet back (token bucket, rounded up). May pass the limit when usage
    /// reported in full did.
    pub fn used(&self, p: &Params, now: u64) -> u64 {
        match *self {
            State::Fixed { .. } | State::FromFirstHit { .. } => self.count_in_window(p, now),
            State::Sliding { window, prev, cur } => {
                let s = p.span(now);
                let w = s.len();
                let (prev, cur) = match age(window, s.idx) {
                    0 => (u64::from(prev), u64::from(cur)),
                    1 => (u64::from(cur), 0),
                    _ => (0, 0),
                };
                let left = s.end - now;
                let weighted = (u128::from(prev) * u128::from(left)).div_ceil(u128::from(w));
                weighted as u64 + cur
            }
            State::Gcra { tat } => {
                let full = match p.tat {
                    Tat::Full => tat,
                    Tat::ThrottleCrab => tat.saturating_add(p.interval_ns()),
                };
                full.saturating_sub(now).div_ceil(p.interval_ns().max(1))
            }
        }
    }

    /// When the state, evaluated or stored at `now`, carries no information any more and may be
    /// dropped.
    pub fn expires_at(&self, p: &Params, now: u64) -> u64 {
        let s = p.span(now);
        // The end of the stored window: this one's, or (for older ones) at most this one's start.
        let end = |window: u32| {
            if age(window, s.idx) == 0 {
                s.end
            } else {
                s.start
            }
        };
        match *self {
            State::Fixed { window, .. } => end(window),
            // The previous window's count still weighs until the end of the next window.
            State::Sliding { window, .. } => match age(window, s.idx) {
                0 => p.next_end(&s),
                1 => s.end,
                _ => s.start,
            },
            State::Gcra { tat } => match p.tat {
                Tat::Full => tat,
                Tat::ThrottleCrab => tat.saturating_add(crab_tolerance(p)),
            },
            State::FromFirstHit { end, .. } => end.max(now),
        }
    }

    /// Evaluates `hits` at `now`. `hits == 0` checks without consuming.
    pub fn eval(&self, p: &Params, now: u64, hits: u64) -> Eval {
        match *self {
            State::Fixed { window, count } => eval_fixed(window, count, p, now, hits),
            State::Sliding { window, prev, cur } => eval_sliding(window, prev, cur, p, now, hits),
            State::Gcra { tat } if p.tat == Tat::ThrottleCrab => eval_crab(tat, p, now, hits),
            State::Gcra { tat } => eval_gcra(tat, p, now, hits),
            State::FromFirstHit { count, end } => eval_from_first_hit(count, end, p, now, hits),
        }
    }

    /// The least time after `now` before `hits` (the newcomer's plus those waiting ahead of it)
    /// can have been admitted, if nothing else arrives: a lower bound used to refuse at once a
    /// wait that would certainly outlast its `max_wait`. `None` when it can never fit.
    pub fn min_wait(&self, p: &Params, now: u64, hits: u64) -> Option<u64> {
        let limit = u64::from(p.requests_per_unit);
        if limit == 0 {
            return None;
        }
        match *self {
            State::Fixed { .. } | State::Sliding { .. } => {
                let s = p.span(now);
                let (idx, w) = (s.idx, s.len());
                let used = match *self {
                    State::Fixed { window, count } if age(window, idx) == 0 => u64::from(count),
                    State::Sliding { window, cur, .. } if age(window, idx) == 0 => u64::from(cur),
                    _ => 0,
                };
                // Each aligned window admits at most `limit`, this one at most what is left of it.
                let free = limit.saturating_sub(used);
                let by_windows = if hits <= free {
                    0
                } else {
                    let windows = (hits - free).div_ceil(limit);
                    s.end - now + (windows - 1) * w
                };
                // The sliding estimate also weighs the previous window; its retry time is exact.
                let sliding = match *self {
                    State::Sliding { .. } if hits <= limit => {
                        let e = self.eval(p, now, hits);
                        if e.over {
                            e.retry_ns
                        } else {
                            0
                        }
                    }
                    _ => 0,
                };
                Some(by_windows.max(sliding))
            }
            State::Gcra { tat } => {
                let t = p.interval_ns();
                let capacity = t.saturating_mul(p.burst());
                let next = tat.max(now).saturating_add(t.saturating_mul(hits));
                Some(next.saturating_sub(capacity).saturating_sub(now))
            }
            State::FromFirstHit { count, end } => {
                let (used, left) = if end > now {
                    (u64::from(count), end - now)
                } else {
                    (0, p.window_ns())
                };
                let free = limit.saturating_sub(used);
                if hits <= free {
                    return Some(0);
                }
                let windows = (hits - free).div_ceil(limit);
                Some(left + (windows - 1) * p.window_ns())
            }
        }
    }

    /// Adds `hits` whatever the limit says: hits admitted elsewhere already (a local-first
    /// view: the store's total plus this replica's own hits since).
    pub fn add(&self, p: &Params, now: u64, hits: u64) -> State {
        match *self {
            State::Gcra { tat } => State::Gcra {
                tat: tat
                    .max(now)
                    .saturating_add(p.interval_ns().saturating_mul(hits)),
            },
            _ => self.eval(p, now, hits).next,
        }
    }

    /// Gives `hits` back (a negative hit, or the refund of a request refused elsewhere).
    pub fn refund(&mut self, p: &Params, now: u64, hits: u64) {
        match self {
            State::Fixed { window, count } => {
                if age(*window, p.span(now).idx) == 0 {
                    *count = count.saturating_sub(clamp32(hits));
                }
            }
            State::Sliding { window, cur, .. } => {
                if age(*window, p.span(now).idx) == 0 {
                    *cur = cur.saturating_sub(clamp32(hits));
                }
            }
            State::FromFirstHit { count, end } => {
                if *end > now {
                    *count = count.saturating_sub(clamp32(hits));
                }
            }
            State::Gcra { tat } => {
                if *tat > now {
                    *tat = tat
                        .saturating_sub(p.interval_ns().saturating_mul(hits))
                        .max(now);
                }
            }
        }
    }
}

/// The earliest time after `now` at which `hits` more fit under the sliding estimate, assuming no
/// other arrivals: the previous window's weight decays linearly, and the next window starts with
/// the current count as its previous one.
fn sliding_retry(prev: u64, cur: u64, hits: u64, limit: u64, w: u64, elapsed: u64) -> u64 {
    if cur + hits <= limit {
        // Fits once prev × (w - e) / w ≤ limit - cur - hits.
        let room = limit - cur - hits;
        if prev == 0 || prev <= room {
            return 0;
        }
        let e = w - ((u128::from(room) * u128::from(w)) / u128::from(prev)) as u64;
        return e.saturating_sub(elapsed);
    }
    // Not before the next window, where `cur` becomes the previous count.
    let to_next = w - elapsed;
    let room = limit - hits;
    if cur <= room {
        return to_next;
    }
    let e = w - ((u128::from(room) * u128::from(w)) / u128::from(cur)) as u64;
    to_next + e
}

fn clamp32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn eval_fixed(window: u32, count: u32, p: &Params, now: u64, hits: u64) -> Eval {
    let s = p.span(now);
    let limit = u64::from(p.requests_per_unit);
    let idx = s.idx;
    let count = if age(window, idx) == 0 {
        u64::from(count)
    } else {
        0
    };
    let after = count.saturating_add(hits);
    let next = State::Fixed {
        window: index32(idx),
        count: clamp32(after),
    };
    // The next window admits up to `limit`; more than that never fits.
    let retry_ns = if hits > limit { u64::MAX } else { s.end - now };
    counted(limit, after, s.end - now, next, retry_ns)
}

/// A window from the key's first hit: one that ended starts again at `now` with these hits;
/// a check (no hits) of a key with no window open starts none.
fn eval_from_first_hit(count: u32, end: u64, p: &Params, now: u64, hits: u64) -> Eval {
    let limit = u64::from(p.requests_per_unit);
    let (count, end) = if end > now {
        (u64::from(count), end)
    } else {
        (0, now.saturating_add(p.window_ns()))
    };
    let after = count.saturating_add(hits);
    let next = if after == 0 {
        State::FromFirstHit { count: 0, end: 0 }
    } else {
        State::FromFirstHit {
            count: clamp32(after),
            end,
        }
    };
    let retry_ns = if hits > limit { u64::MAX } else { end - now };
    counted(limit, after, end - now, next, retry_ns)
}

fn eval_sliding(window: u32, prev: u32, cur: u32, p: &Params, now: u64, hits: u64) -> Eval {
    let s = p.span(now);
    let (w, idx) = (s.len(), s.idx);
    let limit = u64::from(p.requests_per_unit);
    let (prev, cur) = match age(window, idx) {
        0 => (u64::from(prev), u64::from(cur)),
        1 => (u64::from(cur), 0),
        _ => (0, 0),
    };
    let elapsed = now - s.start;
    // prev × (share of the sliding window still overlapping the previous window),
    // rounded up so the estimate never undercounts.
    let weighted = ((u128::from(prev) * u128::from(w - elapsed)).div_ceil(u128::from(w))) as u64;
    let estimate = weighted + cur;
    let after = estimate.saturating_add(hits);
    let retry_ns = if hits > limit {
        u64::MAX
    } else {
        sliding_retry(prev, cur, hits, limit, w, elapsed)
    };
    let next = State::Sliding {
        window: index32(idx),
        prev: clamp32(prev),
        cur: clamp32(cur.saturating_add(hits)),
    };
    counted(limit, after, s.end - now, next, retry_ns)
}

/// The verdict of a counting window: over when `after` (the count with this call's hits)
/// passes `limit`.
fn counted(limit: u64, after: u64, reset_ns: u64, next: State, retry_ns: u64) -> Eval {
    let over = after > limit;
    Eval {
        over,
        remaining: if over { 0 } else { clamp32(limit - after) },
        reset_ns,
        next,
        retry_ns,
        past: after.saturating_sub(limit),
    }
}

fn eval_gcra(tat: u64, p: &Params, now: u64, hits: u64) -> Eval {
    let limit = u64::from(p.requests_per_unit);
    let t = p.interval_ns();
    let burst = p.burst();
    let capacity = t.saturating_mul(burst);
    let base = tat.max(now);
    let next_tat = base.saturating_add(t.saturating_mul(hits));
    let over = limit == 0 || next_tat - now > capacity;
    // Hits no wait can admit are told how long an emptied bucket takes to fill (at least one
    // interval), never 0: a full bucket's "until full" would send the client straight back.
    let never = limit == 0 || hits > burst;
    let (remaining, reset, next) = if over && never {
        (0, capacity.max(t), tat)
    } else if over {
        (0, base - now, tat)
    } else {
        let left = (capacity - (next_tat - now)) / t.max(1);
        (clamp32(left), next_tat - now, next_tat)
    };
    let retry_ns = if never {
        u64::MAX
    } else {
        next_tat.saturating_sub(capacity).saturating_sub(now)
    };
    // Tokens short: the debt past a full bucket's worth, in whole tokens.
    let past = if limit == 0 {
        hits
    } else if over {
        (next_tat - now - capacity).div_ceil(t.max(1))
    } else {
        0
    };
    Eval {
        over,
        remaining,
        reset_ns: reset,
        next: State::Gcra { tat: next },
        retry_ns,
        past,
    }
}

/// ThrottleCrab's delay variation tolerance τ = T·(burst-1) (`rate_limiter.rs`).
fn crab_tolerance(p: &Params) -> u64 {
    p.interval_ns().saturating_mul(p.burst().saturating_sub(1))
}

/// ThrottleCrab's GCRA over its own stored TAT (`throttlecrab/src/core/rate_limiter.rs` 0.4.40,
/// `rate_limit`): a key still stored (its store keeps it while TAT + τ > now) is read as stored,
/// at least now - τ; else it starts at now - T. Allowed when TAT + T·hits - τ ≤ now, and then
/// stored, hits 0 included. `remaining`, `reset_ns` and `retry_ns` are its values:
/// (now + τ - TAT) / T, TAT - now + τ and allow_at - now, TAT after the call when allowed.
fn eval_crab(stored: u64, p: &Params, now: u64, hits: u64) -> Eval {
    let t = i128::from(p.interval_ns().max(1));
    let tau = i128::from(crab_tolerance(p));
    let now_i = i128::from(now);
    let stored = i128::from(stored);
    let tat = if stored + tau > now_i {
        stored.max(now_i - tau)
    } else {
        now_i - t
    };
    // ThrottleCrab's i64 sums saturate.
    let new_tat = (tat + t * i128::from(hits)).min(i128::from(i64::MAX));
    let allow_at = new_tat - tau;
    let allowed = now_i >= allow_at;
    let current = if allowed { new_tat } else { tat };
    let remaining = ((now_i + tau - current) / t).max(0);
    let ns = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
    Eval {
        over: !allowed,
        remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        reset_ns: ns(current - now_i + tau),
        next: State::Gcra { tat: ns(current) },
        retry_ns: if allowed { 0 } else { ns(allow_at - now_i) },
        past: if allowed {
            0
        } else {
            ns((allow_at - now_i + t - 1) / t)
        },
    }
}

#[cfg(test)]
mod tests;
