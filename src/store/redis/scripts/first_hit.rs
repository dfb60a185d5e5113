//! A window from the key's first hit (Limitador's limits) in Redis: its script and its keys'
//! names (see the layout in `scripts`).

use super::{Cmd, Name};

/// A window from the key's first hit: adds `hits` and answers the count with the key's TTL.
///
/// - `KEYS[1]`: the counter; `ARGV[1]`: hits (0 reads only: a key that is not there stays
///   away); `ARGV[2]`: the window in ms, the TTL of a key without one (one this call made).
/// - Returns `{count after, PTTL in ms}`; `{0, -2}` when a read finds no key.
///
/// Redis freezes the clock while a script runs, so a key made here answers exactly one window.
pub(super) const FIRST_HIT: &str = r"
local hits = tonumber(ARGV[1])
if hits == 0 then
  local v = redis.call('GET', KEYS[1])
  if not v then return {0, -2} end
  return {tonumber(v), redis.call('PTTL', KEYS[1])}
end
local c = redis.call('INCRBY', KEYS[1], hits)
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  ttl = tonumber(ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {c, ttl}
";

/// What a window from the first hit's key ends with, after its counter key.
pub(in crate::store::redis) const FIRST_SUFFIX: &str = "_first";

/// `FIRST_HIT` of no hits on the key (under `CACHE_KEY_PREFIX` `prefix`) of counter `key`'s
/// window from the first hit: reads its count and TTL, creating nothing.
pub(in crate::store::redis) fn first_hit_read<'a>(prefix: &'a str, key: &'a str) -> Cmd<'a> {
    Cmd::FirstHit {
        key: Name {
            held: false,
            prefix,
            open: "",
            key,
            close: FIRST_SUFFIX,
            start: None,
        },
        hits: 0,
        window_ms: 1,
    }
}
