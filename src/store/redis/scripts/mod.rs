//! Redis's side of the counting: key layout, the Lua scripts (each `KEYS[i]`/`ARGV[i]`), and
//! the commands an op becomes.
//!
//! # Keys
//!
//! Every key starts with `CACHE_KEY_PREFIX`. Then:
//!
//! - fixed window: envoyproxy/ratelimit's layout, `domain_key1_value1_key2_value2_<window start>`,
//!   the start in epoch seconds (milliseconds for sub-second windows of the direct API), counted
//!   with `INCRBY`, so both services can share one Redis while a fleet migrates. The key's TTL
//!   is set by whoever creates it: an `INCRBY` answering exactly its own hits made the key, and
//!   gets a `PEXPIRE` right after, in the same round trip's future (envoyproxy/ratelimit sends
//!   `EXPIRE` with every `INCRBY`; once per key and window halves the commands of hot keys);
//! - sliding window: `{domain_key1_value1_}_<window start>`, one key per aligned window; the
//!   braces are a Cluster hash tag, so the current and the previous window (both read by one
//!   script) live in one slot;
//! - token bucket: `{domain_key1_value1_}_tat`, holding GCRA's theoretical arrival time;
//! - window from the first hit (Limitador's limits): `<counter key>_first`, counted by
//!   [`FIRST_HIT`], which gives a key it makes a TTL of one window (no jitter: the TTL is the
//!   window) and answers the count with the key's `PTTL`, so the window's end is Redis's; a call
//!   of no hits (a check) only reads, so it starts no window, as Limitador's check starts none.
//!   A refund that brings the count to zero deletes the key: nothing counted, no window (a
//!   refused call on a fresh counter leaves nothing, as on Limitador's Redis). Limitador's
//!   reservations (`Reserve`) are a hash beside it, `{<counter's key>}_held`, read by every
//!   call of [`FIRST_HIT`] (see `first_hit`);
//! - the holds of a limit with `reserve`: a sorted set beside the counter (see `holds`).
//!
//! The admin listener's look-up `GET`s and its reset `DEL`s exactly these keys (`admin`), named
//! by the same `RedisStore::cmd` (a reset drops a counter's holds with it).
//!
//! # Commands
//!
//! An op becomes a [`Cmd`] (what to ask, with the key's [`Name`] borrowed from the op), packed
//! at once into the round trip's buffer ([`pack`], see `packed`), the key written in place.
//!
//! Times passed to the scripts come from the shard's clock (microseconds since the epoch), so
//! every replica and every test decides with the same notion of "now" it reports.

use std::sync::LazyLock;

use super::packed::{decimal, Encoded, Packed};
use first_hit::FIRST_HIT;
pub(in crate::store::redis) use first_hit::{first_hit_read, held_of, Beside, Named, FIRST_SUFFIX};
pub(in crate::store::redis) use name::Name;
use name::WindowStart;
pub(in crate::store::redis) use then::Then;

use super::RedisStore;
use crate::config::Algorithm;
use crate::limiter::{Op, Params};

/// Sliding window: adds `hits` to the current window if the weighted estimate allows it.
///
/// - `KEYS[1]`: the current window's counter; `KEYS[2]`: the previous window's counter.
/// - `ARGV[1]`: limit; `ARGV[2]`: hits (0 checks only); `ARGV[3]`: milliseconds left in the
///   current window; `ARGV[4]`: window length in milliseconds; `ARGV[5]`: TTL of the current
///   window's key in milliseconds (two windows: it weighs on the next one); `ARGV[6]`: `1` to
///   count the hits whether or not they fit (usage counted in full), else `0`.
/// - Returns `{allowed (0/1), current count after, previous count}`; counted in full, always
///   `{1, ...}` with the hits in the count.
///
/// The estimate is `ceil(previous × left / length) + current`, as in `limiter::State::eval`;
/// exact while `previous × length` stays below 2^53.
const SLIDING: &str = r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local limit = tonumber(ARGV[1])
local hits = tonumber(ARGV[2])
local weighted = math.ceil(prev * tonumber(ARGV[3]) / tonumber(ARGV[4]))
if weighted + cur + hits > limit and ARGV[6] ~= '1' then
  return {0, cur, prev}
end
if hits > 0 then
  cur = redis.call('INCRBY', KEYS[1], hits)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return {1, cur, prev}
";

/// Token bucket (GCRA): moves the theoretical arrival time on if `hits` tokens are there.
///
/// - `KEYS[1]`: the key holding the TAT in microseconds.
/// - `ARGV[1]`: now (µs); `ARGV[2]`: emission interval (µs per token); `ARGV[3]`: burst;
///   `ARGV[4]`: hits (0 checks only).
/// - Returns `{allowed (0/1), TAT after (µs)}`; the key expires when the bucket is full again.
const GCRA: &str = r"
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local hits = tonumber(ARGV[4])
local base = math.max(tat, now)
local after = base + interval * hits
if interval == 0 or after - now > interval * burst then
  return {0, tat}
end
if hits > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', math.ceil((after - now) / 1000) + 1000)
end
return {1, after}
";

/// Token bucket, local-first sync: takes `hits` tokens that replica admitted already, whether
/// or not they are there (the bucket may run into debt, which later requests wait out).
///
/// - `KEYS[1]`: the TAT key; `ARGV[1]`: now (µs); `ARGV[2]`: interval (µs); `ARGV[3]`: hits.
/// - Returns `{1, TAT after (µs)}`, as GCRA does.
const GCRA_ADD: &str = r"
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[1])
local after = math.max(tat, now) + tonumber(ARGV[2]) * tonumber(ARGV[3])
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', math.ceil((after - now) / 1000) + 1000)
return {1, after}
";

/// Gives hits back to a counter (fixed or sliding window, or from the first hit), never below
/// zero, keeping its TTL.
///
/// - `KEYS[1]`: the counter; `ARGV[1]`: hits; `ARGV[2]` (optional): `1` deletes a key the
///   refund brings to zero (a window from the first hit: nothing counted is no window).
/// - Returns the count after (or -1 if the key is gone).
const REFUND_COUNT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
local n = math.max(0, tonumber(v) - tonumber(ARGV[1]))
if n == 0 and ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], n, 'KEEPTTL')
end
return n
";

/// Gives tokens back to a token bucket.
///
/// - `KEYS[1]`: the TAT key; `ARGV[1]`: now (µs); `ARGV[2]`: interval (µs); `ARGV[3]`: hits.
/// - Returns the TAT after (or -1 if the key is gone, i.e. the bucket is full).
const REFUND_GCRA: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
local now = tonumber(ARGV[1])
local tat = math.max(now, tonumber(v) - tonumber(ARGV[2]) * tonumber(ARGV[3]))
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'KEEPTTL')
return tat
";

/// One op as sent to Redis, with what its answer means.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cmd<'a> {
    /// `INCRBY key hits`: answers the count after; a key it created needs a `PEXPIRE` next
    /// ([`Then::follow_up`]).
    Fixed {
        key: Name<'a>,
        hits: u64,
        window_ms: u64,
    },
    /// [`FIRST_HIT`]: answers `{count after, PTTL, held, done}`; beside the counter's named
    /// holds unless `holds` is `None` (a look-up).
    FirstHit {
        key: Name<'a>,
        hits: u64,
        window_ms: u64,
        holds: Option<Beside>,
    },
    Sliding {
        cur: Name<'a>,
        prev: Name<'a>,
        limit: u32,
        hits: u64,
        left_ms: u64,
        window_ms: u64,
        /// The current window's key lives until the next window ends: its count weighs there.
        ttl_ms: u64,
        /// Count the hits whether or not they fit.
        in_full: bool,
    },
    Gcra {
        key: Name<'a>,
        now_us: u64,
        interval_us: u64,
        burst: u32,
        hits: u64,
    },
    GcraAdd {
        key: Name<'a>,
        now_us: u64,
        interval_us: u64,
        hits: u64,
    },
    RefundCount {
        key: Name<'a>,
        hits: u64,
        /// Delete the key when the refund leaves nothing (a window from the first hit).
        drop_empty: bool,
    },
    RefundGcra {
        key: Name<'a>,
        now_us: u64,
        interval_us: u64,
        hits: u64,
    },
    /// `DECRBY key hits`: a fixed window's refund on a store that runs no scripts (`probe`).
    /// Not floored at zero as [`REFUND_COUNT`] is: a key it made (the window's key expired or
    /// was reset meanwhile) answers below zero and is deleted next ([`Then::DeleteIfMade`]).
    Decrement { key: Name<'a>, hits: u64 },
    /// A check of a limit with `reserve`, or a report releasing one of its holds
    /// (`holds::HOLD`).
    Hold(holds::HoldCmd<'a>),
    /// `ZCOUNT held (now +inf`: the holds not expired yet (a look-up).
    CountHeld { held: Name<'a>, now_us: u64 },
    /// `ZREM held id`: a hold taken back (its request was refused elsewhere).
    Unhold { held: Name<'a>, id: u64 },
    /// `HDEL held id`: a named hold taken back (its `Reserve` was refused on another counter).
    Unname { held: Name<'a>, id: u64 },
    /// `GET key`: a look-up reads a counter without creating it (`INCRBY key 0` would).
    Get { key: Name<'a> },
    /// `DEL key`: a reset; answers 1 if the key was there.
    Del { key: Name<'a> },
}

impl Cmd<'_> {
    pub(super) fn then(&self) -> Then {
        match *self {
            Cmd::Fixed {
                hits, window_ms, ..
            } => Then::ExpireIfCreated { hits, window_ms },
            Cmd::Decrement { .. } => Then::DeleteIfMade,
            _ => Then::Nothing,
        }
    }

    pub(super) fn per_second(&self, p: &Params) -> bool {
        let _ = self;
        p.window_ms == 1000
    }
}

impl RedisStore {
    /// `CACHE_KEY_PREFIX` + `open` + the counter key + `close` + the window's start.
    fn key<'a>(
        &'a self,
        op: &'a Op,
        open: &'static str,
        close: &'static str,
        start: Option<WindowStart>,
    ) -> Name<'a> {
        Name {
            held: false,
            prefix: &self.prefix,
            open,
            key: op.key.as_str(),
            close,
            start,
        }
    }

    /// The command adding `op.hits` whatever the limit says (a local-first replica's hits,
    /// admitted at `at`; or usage counted in full, `at` = `now`), at `now` (ns): windows count
    /// into the window of `at` (INCRBY, as an exact decision would), token buckets take the
    /// tokens at `now`.
    pub(super) fn sync_cmd<'a>(&'a self, op: &'a Op, at: u64, now: u64) -> Cmd<'a> {
        match op.params.algorithm {
            Algorithm::TokenBucket { .. } => match self.cmd(op, now, false) {
                Cmd::Gcra {
                    key,
                    now_us,
                    interval_us,
                    hits,
                    ..
                } => Cmd::GcraAdd {
                    key,
                    now_us,
                    interval_us,
                    hits,
                },
                other => other,
            },
            _ => {
                let mut c = self.cmd(op, at, false);
                if let Cmd::Sliding { in_full, .. } = &mut c {
                    *in_full = true;
                }
                c
            }
        }
    }

    /// The command deciding (or, with `refund`, refunding) `op` at `now` (ns).
    pub(super) fn cmd<'a>(&'a self, op: &'a Op, now: u64, refund: bool) -> Cmd<'a> {
        let p = &op.params;
        let span = p.span(now);
        let ms = |ns: u64| ns / 1_000_000;
        let w = ms(span.len()).max(1);
        let now_ms = ms(now);
        let start = |ns: u64| Some(WindowStart { ms: ms(ns) });
        match p.algorithm {
            Algorithm::FixedWindow => {
                let key = self.key(op, "", "", start(span.start));
                if refund && self.no_scripts(p).is_some() {
                    Cmd::Decrement { key, hits: op.hits }
                } else if refund {
                    Cmd::RefundCount {
                        key,
                        hits: op.hits,
                        drop_empty: false,
                    }
                } else {
                    Cmd::Fixed {
                        key,
                        hits: op.hits,
                        window_ms: w,
                    }
                }
            }
            Algorithm::FromFirstHit => self.first_hit_cmd(op, now, refund),
            Algorithm::SlidingWindow => {
                let cur = self.key(op, "{", "}_", start(span.start));
                if refund {
                    Cmd::RefundCount {
                        key: cur,
                        hits: op.hits,
                        drop_empty: false,
                    }
                } else {
                    Cmd::Sliding {
                        prev: self.key(op, "{", "}_", start(p.prev_start(&span))),
                        cur,
                        limit: p.requests_per_unit,
                        hits: op.hits,
                        left_ms: ms(span.end) - now_ms,
                        window_ms: w,
                        ttl_ms: ms(p.next_end(&span)) - ms(span.start),
                        in_full: false,
                    }
                }
            }
            Algorithm::TokenBucket { burst } => {
                let key = self.key(op, "{", "}_tat", None);
                let interval_us = p.window_ms.max(1) * 1000 / u64::from(p.requests_per_unit.max(1));
                let interval_us = if p.requests_per_unit == 0 {
                    0
                } else {
                    interval_us
                };
                if refund {
                    Cmd::RefundGcra {
                        key,
                        now_us: now / 1000,
                        interval_us,
                        hits: op.hits,
                    }
                } else {
                    Cmd::Gcra {
                        key,
                        now_us: now / 1000,
                        interval_us,
                        burst,
                        hits: op.hits,
                    }
                }
            }
        }
    }
}

fn sha1(src: &str) -> String {
    redis::Script::new(src).get_hash().to_owned()
}

/// Every script, for `SCRIPT LOAD` when a connection is checked.
pub(super) const ALL: [&str; 7] = [
    FIRST_HIT,
    SLIDING,
    GCRA,
    GCRA_ADD,
    REFUND_COUNT,
    REFUND_GCRA,
    holds::HOLD,
];

static FIRST_HIT_SHA: LazyLock<String> = LazyLock::new(|| sha1(FIRST_HIT));
static SLIDING_SHA: LazyLock<String> = LazyLock::new(|| sha1(SLIDING));
static GCRA_SHA: LazyLock<String> = LazyLock::new(|| sha1(GCRA));
static GCRA_ADD_SHA: LazyLock<String> = LazyLock::new(|| sha1(GCRA_ADD));
static REFUND_COUNT_SHA: LazyLock<String> = LazyLock::new(|| sha1(REFUND_COUNT));
static REFUND_GCRA_SHA: LazyLock<String> = LazyLock::new(|| sha1(REFUND_GCRA));

/// A command's name, or `EVALSHA` with a script's SHA1, encoded once.
type Head = LazyLock<Encoded>;
static INCRBY: Head = LazyLock::new(|| Encoded::new(&[b"INCRBY"]));
static DECRBY: Head = LazyLock::new(|| Encoded::new(&[b"DECRBY"]));
static GET: Head = LazyLock::new(|| Encoded::new(&[b"GET"]));
static DEL: Head = LazyLock::new(|| Encoded::new(&[b"DEL"]));
static HDEL: Head = LazyLock::new(|| Encoded::new(&[b"HDEL"]));
static PEXPIRE: Head = LazyLock::new(|| Encoded::new(&[b"PEXPIRE"]));
static FIRST_HIT_HEAD: Head = LazyLock::new(|| evalsha(&FIRST_HIT_SHA));
static SLIDING_HEAD: Head = LazyLock::new(|| evalsha(&SLIDING_SHA));
static GCRA_HEAD: Head = LazyLock::new(|| evalsha(&GCRA_SHA));
static GCRA_ADD_HEAD: Head = LazyLock::new(|| evalsha(&GCRA_ADD_SHA));
static REFUND_COUNT_HEAD: Head = LazyLock::new(|| evalsha(&REFUND_COUNT_SHA));
static REFUND_GCRA_HEAD: Head = LazyLock::new(|| evalsha(&REFUND_GCRA_SHA));

fn evalsha(sha: &str) -> Encoded {
    Encoded::new(&[b"EVALSHA", sha.as_bytes()])
}

/// A script call on `keys` with `args`: `EVALSHA` with the script's SHA1 (a few bytes instead
/// of the script's text, and no hashing on Redis's side).
fn script(p: &mut Packed, head: &Head, keys: &[&Name<'_>], args: &[u64]) {
    p.start(3 + keys.len() + args.len());
    p.encoded(head);
    p.int(keys.len() as u64);
    for k in keys {
        k.pack(p);
    }
    for &a in args {
        p.int(a);
    }
}

/// Adds the command of `c` to `p`: one reply each. Scripts go by their SHA1 (see [`by_text`]).
pub(super) fn pack(c: &Cmd<'_>, p: &mut Packed) {
    match c {
        Cmd::Fixed { key, hits, .. } => plain(p, &INCRBY, key, Some(*hits)),
        Cmd::Decrement { key, hits } => plain(p, &DECRBY, key, Some(*hits)),
        Cmd::FirstHit {
            key,
            hits,
            window_ms,
            holds: None,
        } => script(p, &FIRST_HIT_HEAD, &[key], &[*hits, *window_ms]),
        Cmd::FirstHit {
            key,
            hits,
            window_ms,
            holds: Some(b),
        } => first_hit::pack_beside(key, *hits, *window_ms, b, p),
        Cmd::Get { key } => plain(p, &GET, key, None),
        Cmd::Del { key } => plain(p, &DEL, key, None),
        Cmd::RefundCount {
            key,
            hits,
            drop_empty,
        } => {
            let args: &[u64] = if *drop_empty { &[*hits, 1] } else { &[*hits] };
            script(p, &REFUND_COUNT_HEAD, &[key], args)
        }
        Cmd::Hold(h) => h.pack(p),
        Cmd::CountHeld { held, now_us } => holds::pack_count(held, *now_us, p),
        Cmd::Unhold { held, id } => holds::pack_unhold(held, *id, p),
        Cmd::Unname { held, id } => {
            p.start(3);
            p.encoded(&HDEL);
            held.pack(p);
            p.int(*id);
        }
        c @ (Cmd::Sliding { .. }
        | Cmd::Gcra { .. }
        | Cmd::GcraAdd { .. }
        | Cmd::RefundGcra { .. }) => pack_algorithm(c, p),
    }
}

/// A command that is not a script: its name, its key and at most one argument.
fn plain(p: &mut Packed, name: &Head, key: &Name<'_>, arg: Option<u64>) {
    p.start(2 + usize::from(arg.is_some()));
    p.encoded(name);
    key.pack(p);
    if let Some(a) = arg {
        p.int(a);
    }
}

/// The scripts of the sliding window and the token bucket, [`pack`]'s for those commands.
fn pack_algorithm(c: &Cmd<'_>, p: &mut Packed) {
    match c {
        Cmd::Sliding {
            cur,
            prev,
            limit,
            hits,
            left_ms,
            window_ms,
            ttl_ms,
            in_full,
        } => {
            let in_full = u64::from(*in_full);
            let args = [
                u64::from(*limit),
                *hits,
                *left_ms,
                *window_ms,
                *ttl_ms,
                in_full,
            ];
            script(p, &SLIDING_HEAD, &[cur, prev], &args);
        }
        Cmd::Gcra {
            key,
            now_us,
            interval_us,
            burst,
            hits,
        } => {
            let args = [*now_us, *interval_us, u64::from(*burst), *hits];
            script(p, &GCRA_HEAD, &[key], &args)
        }
        Cmd::GcraAdd {
            key,
            now_us,
            interval_us,
            hits,
        } => script(p, &GCRA_ADD_HEAD, &[key], &[*now_us, *interval_us, *hits]),
        Cmd::RefundGcra {
            key,
            now_us,
            interval_us,
            hits,
        } => {
            let args = [*now_us, *interval_us, *hits];
            script(p, &REFUND_GCRA_HEAD, &[key], &args)
        }
        _ => unreachable!("pack sends only the algorithms' commands here"),
    }
}

/// Adds to `out` command `i` of `sent` again: an `EVALSHA` as `EVAL` with the script's text
/// (which loads it, after a Redis restart answered `NOSCRIPT`); any other command as it is.
pub(super) fn by_text(sent: &Packed, i: usize, out: &mut Packed) {
    let mut args = sent.args(i);
    if let [b"EVALSHA", sha, ..] = args.as_slice() {
        let known = [
            (FIRST_HIT, &*FIRST_HIT_SHA),
            (SLIDING, &*SLIDING_SHA),
            (GCRA, &*GCRA_SHA),
            (GCRA_ADD, &*GCRA_ADD_SHA),
            (REFUND_COUNT, &*REFUND_COUNT_SHA),
            (REFUND_GCRA, &*REFUND_GCRA_SHA),
            (holds::HOLD, &*holds::HOLD_SHA),
        ];
        if let Some((src, _)) = known.iter().find(|(_, h)| h.as_bytes() == *sha) {
            args[0] = b"EVAL";
            args[1] = src.as_bytes();
        }
    }
    out.push(&args);
}

mod first_hit;
mod holds;
mod name;
#[cfg(test)]
mod tests;
mod then;
