//! Reservations in Redis (`reserve`): each counter with holds has a sorted set beside it, one
//! member per hold (its id), scored by when it expires. One script checks and holds, or counts
//! a report and releases, atomically with reading the counter, so replicas sharing Redis share
//! the holds exactly.
//!
//! The set is named after the counter so that a script touching both stays in one Cluster slot:
//! `{<fixed window's key>}_held` (one set per window: a new window starts with nothing held),
//! `<prefix>{<key>}_held` for sliding windows and token buckets (their counters' hash tag).

use std::sync::LazyLock;

use super::{decimal, evalsha, script, sha1, Cmd, Encoded, Head, Name, Packed, WindowStart};
use crate::config::Algorithm;
use crate::limiter::{CountedHolds, Op, Reservation};
use crate::store::redis::RedisStore;

/// Checks and holds (`ARGV[3]` = 1), or counts a report and releases its key's oldest hold
/// (`ARGV[3]` = 2).
///
/// - `KEYS[1]`: the holds' sorted set; `KEYS[2]`: the counter (fixed: the window's count,
///   sliding: the current window's, token bucket: the TAT in µs); `KEYS[3]`: sliding only, the
///   previous window's count.
/// - `ARGV[1]`: 1 fixed, 2 sliding, 3 token bucket; `ARGV[2]`: now (µs); `ARGV[4]`: the hits a
///   hold holds; `ARGV[5]`: the limit (a token bucket's burst); `ARGV[6]`: the report's hits;
///   `ARGV[7]`: until when a new hold holds (µs); `ARGV[8]`: its id; `ARGV[9]`: the counter's
///   TTL in ms (fixed: a window, sliding: two), a token bucket's interval (µs per token);
///   `ARGV[10]`, `ARGV[11]`: sliding only, ms left in the window and its length.
/// - Returns `{done, holds before, holds expired, a, b}`: done is 1 when the check was admitted
///   and holds, or the report released one; `a`, `b` the counter before the op (fixed: count,
///   0; sliding: current, previous; token bucket: TAT, 0).
///
/// A check is admitted when its own hold fits beside what is used and every hold: the same rule
/// as `limiter::State::eval` with the holds' hits added.
pub(super) const HOLD: &str = r"
local now = tonumber(ARGV[2])
local expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
local algorithm = ARGV[1]
local each = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local a = tonumber(redis.call('GET', KEYS[2]) or '0')
local b = 0
if algorithm == '2' then b = tonumber(redis.call('GET', KEYS[3]) or '0') end
if ARGV[3] == '1' then
  local fits
  if algorithm == '3' then
    local interval = tonumber(ARGV[9])
    fits = interval > 0 and math.max(a, now) + interval * (held * each + each) - now <= interval * limit
  else
    local used = a
    if algorithm == '2' then used = math.ceil(b * tonumber(ARGV[10]) / tonumber(ARGV[11])) + a end
    fits = used + held * each + each <= limit
  end
  if not fits then return {0, held, expired, a, b} end
  local till = tonumber(ARGV[7])
  redis.call('ZADD', KEYS[1], till, ARGV[8])
  redis.call('PEXPIRE', KEYS[1], math.ceil((till - now) / 1000) + 1000)
  return {1, held, expired, a, b}
end
local hits = tonumber(ARGV[6])
if algorithm == '3' then
  local after = math.max(a, now) + tonumber(ARGV[9]) * hits
  redis.call('SET', KEYS[2], string.format('%.0f', after), 'PX', math.ceil((after - now) / 1000) + 1000)
else
  local c = redis.call('INCRBY', KEYS[2], hits)
  if algorithm == '2' or c == hits then redis.call('PEXPIRE', KEYS[2], ARGV[9]) end
end
if held == 0 then return {0, 0, expired, a, b} end
redis.call('ZPOPMIN', KEYS[1])
return {1, held, expired, a, b}
";

pub(super) static HOLD_SHA: LazyLock<String> = LazyLock::new(|| sha1(HOLD));
static HOLD_HEAD: Head = LazyLock::new(|| evalsha(&HOLD_SHA));
static ZREM: Head = LazyLock::new(|| Encoded::new(&[b"ZREM"]));
static ZCOUNT: Head = LazyLock::new(|| Encoded::new(&[b"ZCOUNT"]));

/// `ZCOUNT held (now +inf`: the holds not expired yet (a look-up).
pub(super) fn pack_count(held: &Name<'_>, now_us: u64, p: &mut Packed) {
    let mut d = [0u8; 20];
    p.start(4);
    p.encoded(&ZCOUNT);
    held.pack(p);
    p.parts(&[b"(", decimal(now_us, &mut d)]);
    p.parts(&[b"+inf"]);
}

/// `ZREM held id`: a hold taken back.
pub(super) fn pack_unhold(held: &Name<'_>, id: u64, p: &mut Packed) {
    p.start(3);
    p.encoded(&ZREM);
    held.pack(p);
    p.int(id);
}

/// One call of [`HOLD`]: what it is asked about, its keys and arguments written only when it
/// is packed (a command stays small: a round trip's list of them is copied as it grows).
#[derive(Debug, Clone, Copy)]
pub(in crate::store::redis) struct HoldCmd<'a> {
    prefix: &'a str,
    op: &'a Op,
    /// ns since the epoch.
    now: u64,
    /// 1: a check holds; 2: a report releases.
    mode: u64,
    each: u32,
    id: u64,
    for_ms: u32,
}

impl HoldCmd<'_> {
    pub(super) fn pack(&self, p: &mut Packed) {
        let (op, now) = (self.op, self.now);
        let params = &op.params;
        let span = params.span(now);
        let ms = |ns: u64| ns / 1_000_000;
        let now_us = now / 1000;
        let start = |ns: u64| Some(WindowStart { ms: ms(ns) });
        let w = ms(span.len()).max(1);
        let name = |open, close, start| name(self.prefix, op, open, close, start);
        let (algorithm, limit, counter, prev, ttl) = match params.algorithm {
            Algorithm::FixedWindow => {
                let key = name("", "", start(span.start));
                (1, params.requests_per_unit, key, None, w)
            }
            Algorithm::FromFirstHit => {
                let key = name("", "_first", None);
                (
                    1,
                    params.requests_per_unit,
                    key,
                    None,
                    params.window_ms.max(1),
                )
            }
            Algorithm::SlidingWindow => {
                let cur = name("{", "}_", start(span.start));
                let prev = name("{", "}_", start(params.prev_start(&span)));
                let ttl = ms(params.next_end(&span)) - ms(span.start);
                (2, params.requests_per_unit, cur, Some(prev), ttl)
            }
            Algorithm::TokenBucket { burst } => {
                let key = name("{", "}_tat", None);
                let interval_us = match params.requests_per_unit {
                    0 => 0,
                    n => params.window_ms.max(1) * 1000 / u64::from(n),
                };
                (3, burst, key, None, interval_us)
            }
        };
        let args = [
            algorithm,
            now_us,
            self.mode,
            u64::from(self.each),
            u64::from(limit),
            op.hits,
            now_us + u64::from(self.for_ms) * 1000,
            self.id,
            ttl,
            ms(span.end).saturating_sub(ms(now)),
            w,
        ];
        let held = held_name(self.prefix, op, now);
        match &prev {
            Some(prev) => script(p, &HOLD_HEAD, &[&held, &counter, prev], &args),
            None => script(p, &HOLD_HEAD, &[&held, &counter], &args[..9]),
        }
    }
}

/// `op`'s counter key named as `RedisStore` names its keys.
fn name<'a>(
    prefix: &'a str,
    op: &'a Op,
    open: &'static str,
    close: &'static str,
    start: Option<WindowStart>,
) -> Name<'a> {
    Name {
        held: false,
        prefix,
        open,
        key: op.key.as_str(),
        close,
        start,
    }
}

/// The sorted set of `op`'s holds at `now`.
fn held_name<'a>(prefix: &'a str, op: &'a Op, now: u64) -> Name<'a> {
    let p = &op.params;
    match p.algorithm {
        Algorithm::FixedWindow => Name {
            held: true,
            ..name(
                prefix,
                op,
                "",
                "",
                Some(WindowStart {
                    ms: p.span(now).start / 1_000_000,
                }),
            )
        },
        _ => name(prefix, op, "{", "}_held", None),
    }
}

impl RedisStore {
    /// The command of an op of a limit with `reserve`, at `now` (ns): a check holds, a report
    /// counts and releases, a check refunded (`refund`) takes its hold back. `None` for
    /// anything else (decided as any op is).
    pub(in crate::store::redis) fn hold_cmd<'a>(
        &'a self,
        op: &'a Op,
        now: u64,
        refund: bool,
    ) -> Option<Cmd<'a>> {
        let (mode, each, id, for_ms) = match (op.reserve, refund) {
            (Reservation::Counted(CountedHolds::Hold { id, .. }), true) => {
                let held = self.held_name(op, now);
                return Some(Cmd::Unhold { held, id });
            }
            (Reservation::Counted(CountedHolds::Hold { hits, for_ms, id }), false) => {
                (1, hits, id, for_ms)
            }
            (Reservation::Counted(CountedHolds::Release { hits }), false) => (2, hits, 0, 0),
            _ => return None,
        };
        Some(Cmd::Hold(HoldCmd {
            prefix: &self.prefix,
            op,
            now,
            mode,
            each,
            id,
            for_ms,
        }))
    }

    /// The sorted set of `op`'s holds at `now`.
    pub(in crate::store::redis) fn held_name<'a>(&'a self, op: &'a Op, now: u64) -> Name<'a> {
        held_name(&self.prefix, op, now)
    }
}
