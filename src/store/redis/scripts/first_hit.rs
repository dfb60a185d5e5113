//! A window from the key's first hit (Limitador's limits) in Redis: its script, its keys'
//! names (see the layout in `scripts`), and Limitador's reservations beside it.
//!
//! # Named holds
//!
//! A `Reserve` holds hits on the counter under its id until a `Commit` of that id, or its
//! time, ends it. The holds of a counter live in a hash beside it, `{<counter's key>}_held`
//! (braced whole, so it shares the counter's Cluster slot while the counter's key holds no
//! braces of its own), one field a hold: its id (decimal) → `<hits>:<until, µs since the
//! epoch>`. Every call on the counter goes by [`FIRST_HIT`], which reads the hash with the
//! counter, so every replica's calls see every replica's holds; expired holds are dropped by
//! whichever call finds them. A counter has few holds at a time (one per request in flight),
//! so the script reads them all, as the shards' memory keeps them in a list. A hold never
//! outlives its counter's window, and the hash's TTL is its latest hold's: the hash dies with
//! the window at the latest.

use super::{script, Cmd, Name, Packed, FIRST_HIT_HEAD};
use crate::limiter::{NamedHolds, Op, Reservation};
use crate::store::redis::RedisStore;

/// A window from the key's first hit: adds `hits` and answers the count with the key's TTL,
/// beside the counter's named holds; reserves or commits one of them.
///
/// - `KEYS[1]`: the counter; `KEYS[2]` (absent for a look-up, which leaves the holds alone):
///   its named holds (the hash above).
/// - `ARGV[1]`: hits (0 reads only: a key that is not there stays away); `ARGV[2]`: the window
///   in ms, the TTL of a key without one (one this call made); with `KEYS[2]`: `ARGV[3]`: now
///   (µs since the epoch; holds until then are dropped); `ARGV[4]`: `0` counts `hits` (the
///   shard judges them beside the holds, as it judges a count alone), `1` reserves (`hits` is
///   0), `2` commits (`hits` counted unchecked); `ARGV[5]`: reserve and commit: the hold's id;
///   reserve only: `ARGV[6]`: the limit; `ARGV[7]`: the hits to hold; `ARGV[8]`: the longest
///   the hold holds, in ms (it ends with the window if that is sooner: the key's TTL, or a
///   window from now for a counter with no hit yet).
/// - Returns `{count after, PTTL in ms, held, done}`: `{0, -2, ...}` when a read finds no key;
///   held: the hits the live holds hold beside this op (a commit: without the hold it ended);
///   done: 1 when a reserve was admitted (`count + held + hits <= limit`) and holds, or a
///   commit found its hold and ended it, else 0.
///
/// Redis freezes the clock while a script runs, so a key made here answers exactly one window.
pub(super) const FIRST_HIT: &str = r"
local hits = tonumber(ARGV[1])
local held, latest, own, found = 0, 0, 0, false
if #KEYS == 2 then
  local now = tonumber(ARGV[3])
  local all = redis.call('HGETALL', KEYS[2])
  local gone = {}
  for i = 1, #all, 2 do
    local n, till = string.match(all[i + 1], '^(%d+):(%d+)$')
    n, till = tonumber(n), tonumber(till)
    if not till or till <= now then
      gone[#gone + 1] = all[i]
    else
      held = held + n
      if till > latest then latest = till end
      if all[i] == ARGV[5] then own, found = n, true end
    end
  end
  if #gone > 0 then redis.call('HDEL', KEYS[2], unpack(gone)) end
end
local c, ttl
if hits == 0 then
  local v = redis.call('GET', KEYS[1])
  if v then
    c, ttl = tonumber(v), redis.call('PTTL', KEYS[1])
  else
    c, ttl = 0, -2
  end
else
  c = redis.call('INCRBY', KEYS[1], hits)
  ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    ttl = tonumber(ARGV[2])
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
if ARGV[4] == '1' then
  if c + held + tonumber(ARGV[7]) > tonumber(ARGV[6]) then return {c, ttl, held, 0} end
  local now = tonumber(ARGV[3])
  local left = tonumber(ARGV[2])
  if ttl >= 0 then left = ttl end
  local till = now + math.min(tonumber(ARGV[8]), left) * 1000
  redis.call('HSET', KEYS[2], ARGV[5], ARGV[7] .. ':' .. string.format('%.0f', till))
  if till > latest then latest = till end
  redis.call('PEXPIRE', KEYS[2], math.ceil((latest - now) / 1000))
  return {c, ttl, held, 1}
end
if ARGV[4] == '2' and found then
  redis.call('HDEL', KEYS[2], ARGV[5])
  return {c, ttl, held - own, 1}
end
return {c, ttl, held, 0}
";

/// What a window from the first hit's key ends with, after its counter key.
pub(in crate::store::redis) const FIRST_SUFFIX: &str = "_first";

/// What a call of [`FIRST_HIT`] does with the counter's named holds, beside counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::redis) struct Beside {
    /// µs since the epoch: holds until then are over.
    pub(in crate::store::redis) now_us: u64,
    pub(in crate::store::redis) named: Named,
}

/// A call's part in the named holds (`ARGV[4]` of [`FIRST_HIT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::redis) enum Named {
    /// Counts (or checks) beside them.
    Count,
    /// Holds `hits` under `id` for at most `for_ms`, if they fit under `limit` beside the count
    /// and the holds.
    Reserve {
        id: u64,
        limit: u32,
        hits: u32,
        for_ms: u32,
    },
    /// Counts unchecked and ends the hold `id`.
    Commit { id: u64 },
}

impl Beside {
    /// `FIRST_HIT`'s arguments after the window: `ARGV[3]` on.
    pub(super) fn args(&self, out: &mut [u64; 6]) -> usize {
        out[0] = self.now_us;
        match self.named {
            Named::Count => {
                out[1] = 0;
                2
            }
            Named::Reserve {
                id,
                limit,
                hits,
                for_ms,
            } => {
                out[1..6].copy_from_slice(&[
                    1,
                    id,
                    u64::from(limit),
                    u64::from(hits),
                    u64::from(for_ms),
                ]);
                6
            }
            Named::Commit { id } => {
                out[1] = 2;
                out[2] = id;
                3
            }
        }
    }
}

/// The hash of the named holds of the counter named `counter`: `{<counter>}_held`.
pub(in crate::store::redis) fn held_of<'a>(counter: &Name<'a>) -> Name<'a> {
    Name {
        held: true,
        ..*counter
    }
}

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
        holds: None,
    }
}

/// `FIRST_HIT` beside the named holds of `key`: `hits`, `window_ms`, then `b`'s arguments.
pub(super) fn pack_beside(key: &Name<'_>, hits: u64, window_ms: u64, b: &Beside, p: &mut Packed) {
    let mut args = [hits, window_ms, 0, 0, 0, 0, 0, 0];
    let mut rest = [0; 6];
    let n = b.args(&mut rest);
    args[2..2 + n].copy_from_slice(&rest[..n]);
    script(p, &FIRST_HIT_HEAD, &[key, &held_of(key)], &args[..2 + n]);
}

impl RedisStore {
    /// The command deciding (or, with `refund`, refunding) `op`, a window from the first hit,
    /// at `now` (ns): `FIRST_HIT` beside its counter's named holds, reserving or committing one
    /// as `op` says; a refund gives hits back, or takes a `Reserve`'s hold back by its id.
    pub(super) fn first_hit_cmd<'a>(&'a self, op: &'a Op, now: u64, refund: bool) -> Cmd<'a> {
        let p = &op.params;
        let key = self.key(op, "", FIRST_SUFFIX, None);
        let window_ms = p.window_ms.max(1);
        let named = match op.reserve {
            Reservation::Named(NamedHolds::Reserve { id, .. }) if refund => {
                return Cmd::Unname {
                    held: held_of(&key),
                    id,
                }
            }
            Reservation::Named(NamedHolds::Reserve { hits, for_ms, id }) => Named::Reserve {
                id,
                limit: p.requests_per_unit,
                hits,
                for_ms,
            },
            Reservation::Named(NamedHolds::Commit { id }) => Named::Commit { id },
            _ => Named::Count,
        };
        if refund {
            return Cmd::RefundCount {
                key,
                hits: op.hits,
                drop_empty: true,
            };
        }
        let now_us = now / 1000;
        Cmd::FirstHit {
            key,
            hits: op.hits,
            window_ms,
            holds: Some(Beside { now_us, named }),
        }
    }

    /// [`RedisStore::sync_cmd`] of a local-first replica's hits: counted beside the named
    /// holds, never reserving or ending one (the ledger's op is the first of its key's).
    pub(in crate::store::redis) fn sync_only_cmd<'a>(
        &'a self,
        op: &'a Op,
        at: u64,
        now: u64,
    ) -> Cmd<'a> {
        let mut c = self.sync_cmd(op, at, now);
        if let Cmd::FirstHit { holds: Some(b), .. } = &mut c {
            b.named = Named::Count;
        }
        c
    }
}
