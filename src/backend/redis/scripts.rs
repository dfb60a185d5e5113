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
//! - token bucket: `{domain_key1_value1_}_tat`, holding GCRA's theoretical arrival time.
//!
//! The admin listener's look-up `GET`s and its reset `DEL`s exactly these keys (`admin`), named
//! by the same `RedisStore::cmd`.
//!
//! Times passed to the scripts come from the shard's clock (microseconds since the epoch), so
//! every replica and every test decides with the same notion of "now" it reports.

use std::sync::LazyLock;

use redis::Pipeline;

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

/// Gives hits back to a counter (fixed or sliding window), never below zero, keeping its TTL.
///
/// - `KEYS[1]`: the counter; `ARGV[1]`: hits. Returns the count after (or -1 if the key is gone).
const REFUND_COUNT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
local n = math.max(0, tonumber(v) - tonumber(ARGV[1]))
redis.call('SET', KEYS[1], n, 'KEEPTTL')
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
#[derive(Debug, Clone)]
pub(super) enum Cmd {
    /// `INCRBY key hits`: answers the count after; a key it created needs `Expire` next.
    Fixed {
        key: String,
        hits: u64,
        ttl_ms: u64,
    },
    /// `PEXPIRE key ttl`, for a fixed-window key its `INCRBY` created.
    Expire {
        key: String,
        ttl_ms: u64,
    },
    Sliding {
        cur: String,
        prev: String,
        limit: u32,
        hits: u64,
        left_ms: u64,
        window_ms: u64,
        /// Count the hits whether or not they fit.
        in_full: bool,
    },
    Gcra {
        key: String,
        now_us: u64,
        interval_us: u64,
        burst: u32,
        hits: u64,
    },
    GcraAdd {
        key: String,
        now_us: u64,
        interval_us: u64,
        hits: u64,
    },
    RefundCount {
        key: String,
        hits: u64,
    },
    RefundGcra {
        key: String,
        now_us: u64,
        interval_us: u64,
        hits: u64,
    },
    /// `GET key`: a look-up reads a counter without creating it (`INCRBY key 0` would).
    Get {
        key: String,
    },
    /// `DEL key`: a reset; answers 1 if the key was there.
    Del {
        key: String,
    },
}

impl Cmd {
    /// The `PEXPIRE` a fixed window's `INCRBY` needs when its answer shows it made the key
    /// (the count after is its own hits).
    pub(super) fn expire_if_created(&self, reply: &[i64]) -> Option<Cmd> {
        match self {
            Cmd::Fixed { key, hits, ttl_ms } if reply.first() == Some(&(*hits as i64)) => {
                Some(Cmd::Expire {
                    key: key.clone(),
                    ttl_ms: *ttl_ms,
                })
            }
            _ => None,
        }
    }

    pub(super) fn per_second(&self, p: &Params) -> bool {
        let _ = self;
        p.window_ms == 1000
    }
}

/// A window's start as keys name it: epoch seconds, or milliseconds with `ms` for sub-second
/// windows of the direct API.
struct WindowStart {
    ms: u64,
}

impl std::fmt::Display for WindowStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ms.is_multiple_of(1000) {
            write!(f, "{}", self.ms / 1000)
        } else {
            write!(f, "{}ms", self.ms)
        }
    }
}

impl RedisStore {
    /// `CACHE_KEY_PREFIX` + `open` + the counter key + `close` + `suffix`, in one allocation.
    fn key(&self, op: &Op, open: &str, close: &str, suffix: impl std::fmt::Display) -> String {
        use std::fmt::Write;
        let mut k = String::with_capacity(self.prefix.len() + op.key.as_str().len() + 24);
        k.push_str(&self.prefix);
        k.push_str(open);
        k.push_str(op.key.as_str());
        k.push_str(close);
        let _ = write!(k, "{suffix}");
        k
    }

    /// The command adding `op.hits` whatever the limit says (a local-first replica's hits,
    /// admitted at `at`; or usage counted in full, `at` = `now`), at `now` (ns): windows count
    /// into the window of `at` (INCRBY, as an exact decision would), token buckets take the
    /// tokens at `now`.
    pub(super) fn sync_cmd(&self, op: &Op, at: u64, now: u64) -> Cmd {
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

    /// The command deciding (or, with `refund`, giving back) `op` at `now` (ns).
    pub(super) fn cmd(&self, op: &Op, now: u64, refund: bool) -> Cmd {
        let p = &op.params;
        let w = p.window_ms.max(1);
        let now_ms = now / 1_000_000;
        let idx = now_ms / w;
        let start = |i: u64| WindowStart { ms: i * w };
        match p.algorithm {
            Algorithm::FixedWindow => {
                let key = self.key(op, "", "", start(idx));
                if refund {
                    Cmd::RefundCount { key, hits: op.hits }
                } else {
                    let jitter = if self.jitter_max_secs > 0 {
                        rand::random_range(0..self.jitter_max_secs) * 1000
                    } else {
                        0
                    };
                    Cmd::Fixed {
                        key,
                        hits: op.hits,
                        ttl_ms: w + jitter,
                    }
                }
            }
            Algorithm::SlidingWindow => {
                let cur = self.key(op, "{", "}_", start(idx));
                if refund {
                    Cmd::RefundCount {
                        key: cur,
                        hits: op.hits,
                    }
                } else {
                    Cmd::Sliding {
                        prev: self.key(op, "{", "}_", start(idx.saturating_sub(1))),
                        cur,
                        limit: p.requests_per_unit,
                        hits: op.hits,
                        left_ms: (idx + 1) * w - now_ms,
                        window_ms: w,
                        in_full: false,
                    }
                }
            }
            Algorithm::TokenBucket { burst } => {
                let key = self.key(op, "{", "}_tat", "");
                let interval_us = w * 1000 / u64::from(p.requests_per_unit.max(1));
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

/// Starts a script call: `EVALSHA` with the script's SHA1 (a few bytes instead of the script's
/// text, and no hashing on Redis's side), or `EVAL` with its text (which loads it, after a
/// Redis restart answered `NOSCRIPT`).
fn script<'p>(
    pipe: &'p mut Pipeline,
    src: &'static str,
    sha: &LazyLock<String>,
    by_sha: bool,
) -> &'p mut Pipeline {
    if by_sha {
        pipe.cmd("EVALSHA").arg(sha.as_str())
    } else {
        pipe.cmd("EVAL").arg(src)
    }
}

fn sha1(src: &str) -> String {
    redis::Script::new(src).get_hash().to_owned()
}

/// Every script, for `SCRIPT LOAD` when a connection is checked.
pub(super) const ALL: [&str; 5] = [SLIDING, GCRA, GCRA_ADD, REFUND_COUNT, REFUND_GCRA];

static SLIDING_SHA: LazyLock<String> = LazyLock::new(|| sha1(SLIDING));
static GCRA_SHA: LazyLock<String> = LazyLock::new(|| sha1(GCRA));
static GCRA_ADD_SHA: LazyLock<String> = LazyLock::new(|| sha1(GCRA_ADD));
static REFUND_COUNT_SHA: LazyLock<String> = LazyLock::new(|| sha1(REFUND_COUNT));
static REFUND_GCRA_SHA: LazyLock<String> = LazyLock::new(|| sha1(REFUND_GCRA));

/// Adds the command of `c` to `pipe`: one reply each. Scripts go by their SHA1 when `by_sha`.
pub(super) fn add(pipe: &mut Pipeline, c: &Cmd, by_sha: bool) {
    match c {
        Cmd::Fixed { key, hits, .. } => {
            pipe.cmd("INCRBY").arg(key).arg(*hits);
        }
        Cmd::Expire { key, ttl_ms } => {
            pipe.cmd("PEXPIRE").arg(key).arg(*ttl_ms);
        }
        Cmd::Get { key } => {
            pipe.cmd("GET").arg(key);
        }
        Cmd::Del { key } => {
            pipe.cmd("DEL").arg(key);
        }
        _ => add_script(pipe, c, by_sha),
    }
}

/// Adds a script call (`c` runs one of the scripts above).
fn add_script(pipe: &mut Pipeline, c: &Cmd, by_sha: bool) {
    match c {
        Cmd::Fixed { .. } | Cmd::Expire { .. } | Cmd::Get { .. } | Cmd::Del { .. } => {
            unreachable!("a plain command is added by `add`")
        }
        Cmd::Sliding {
            cur,
            prev,
            limit,
            hits,
            left_ms,
            window_ms,
            in_full,
        } => {
            script(pipe, SLIDING, &SLIDING_SHA, by_sha)
                .arg(2)
                .arg(cur)
                .arg(prev)
                .arg(*limit)
                .arg(*hits)
                .arg(*left_ms)
                .arg(*window_ms)
                .arg(2 * *window_ms)
                .arg(u8::from(*in_full));
        }
        Cmd::Gcra {
            key,
            now_us,
            interval_us,
            burst,
            hits,
        } => {
            script(pipe, GCRA, &GCRA_SHA, by_sha)
                .arg(1)
                .arg(key)
                .arg(*now_us)
                .arg(*interval_us)
                .arg(*burst)
                .arg(*hits);
        }
        Cmd::GcraAdd {
            key,
            now_us,
            interval_us,
            hits,
        } => {
            script(pipe, GCRA_ADD, &GCRA_ADD_SHA, by_sha)
                .arg(1)
                .arg(key)
                .arg(*now_us)
                .arg(*interval_us)
                .arg(*hits);
        }
        Cmd::RefundCount { key, hits } => {
            script(pipe, REFUND_COUNT, &REFUND_COUNT_SHA, by_sha)
                .arg(1)
                .arg(key)
                .arg(*hits);
        }
        Cmd::RefundGcra {
            key,
            now_us,
            interval_us,
            hits,
        } => {
            script(pipe, REFUND_GCRA, &REFUND_GCRA_SHA, by_sha)
                .arg(1)
                .arg(key)
                .arg(*now_us)
                .arg(*interval_us)
                .arg(*hits);
        }
    }
}
