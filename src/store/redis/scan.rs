//! Windows from the first hit listed from Redis (Limitador's `/counters/{ns}`): the counts live
//! there, shared by every replica, not in any replica's shards.
//!
//! Bounded: `SCAN` with `MATCH <prefix><counter key prefix>*_first`, `COUNT` [`PER_CALL`], at
//! most [`MAX_CALLS`] calls (so at most about 100 000 keys of the whole database are looked
//! at, each call a short step Redis interleaves with other clients' commands), stopping once
//! `cap` keys are found; then one pipeline reads each key's count and TTL (`FIRST_HIT` of no
//! hits, which creates nothing). A database with more keys than that may leave some counters
//! out of a listing.

use std::time::Duration;

use redis::Value;

use super::connect::{exec, query};
use super::packed::Packed;
use super::scripts::{first_hit_read, pack, FIRST_SUFFIX as SUFFIX};
use super::{within, RedisStore};
use crate::limiter::{Denied, KeyInfo, ScanFuture, State};

/// Keys Redis looks at per `SCAN` call.
const PER_CALL: u64 = 1000;
/// `SCAN` calls per listing.
const MAX_CALLS: usize = 100;

/// `text` with the glob characters `MATCH` reads escaped.
fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl RedisStore {
    /// See the module's docs. Over the main deployment's first connection (a single Redis or
    /// a Sentinel's master; on a Cluster, `SCAN` sees one node).
    pub(super) fn scan_keys(
        &self,
        prefix: &str,
        now: u64,
        cap: usize,
        deadline: Duration,
    ) -> ScanFuture {
        let Some(conn) = self.main.conns.first().cloned() else {
            return Box::pin(async { Ok(Vec::new()) });
        };
        let pattern = format!(
            "{}*{SUFFIX}",
            glob_escaped(&format!("{}{prefix}", self.prefix))
        );
        let store_prefix = self.prefix.clone();
        let reader = self.main.conn(0);
        Box::pin(async move {
            let found = async {
                let mut keys: Vec<String> = Vec::new();
                let mut cursor = 0u64;
                for _ in 0..MAX_CALLS {
                    let mut pipe = redis::pipe();
                    (pipe.cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern))
                        .arg("COUNT")
                        .arg(PER_CALL);
                    let reply = query(conn.clone(), pipe).await?;
                    let (next, batch) = scan_reply(reply.into_iter().next())?;
                    // Counter keys, as the shards name them.
                    keys.extend(batch.iter().filter_map(|k| {
                        let k = k
                            .strip_prefix(store_prefix.as_str())?
                            .strip_suffix(SUFFIX)?;
                        Some(k.to_owned())
                    }));
                    cursor = next;
                    if cursor == 0 || keys.len() >= cap {
                        break;
                    }
                }
                keys.sort();
                keys.dedup();
                keys.truncate(cap);
                let mut cmds = Packed::with_capacity(keys.len());
                for k in &keys {
                    pack(&first_hit_read(&store_prefix, k), &mut cmds);
                }
                let replies = match keys.is_empty() {
                    true => Vec::new(),
                    false => exec(&reader, &cmds).await?,
                };
                Ok::<_, String>((keys, replies))
            };
            let (keys, replies) = within(deadline, found).await?;
            let mut out = Vec::with_capacity(keys.len());
            for (key, r) in keys.into_iter().zip(&replies) {
                let (Some(&count), Some(&pttl)) = (r.first(), r.get(1)) else {
                    continue;
                };
                // Gone since the scan (-2), or with no TTL (-1: not one of ours).
                if pttl <= 0 {
                    continue;
                }
                out.push(KeyInfo {
                    key,
                    state: State::FromFirstHit {
                        count: u32::try_from(count.max(0)).unwrap_or(u32::MAX),
                        end: now.saturating_add(pttl as u64 * 1_000_000),
                    },
                    denied: Denied::default(),
                    waiting: 0,
                    now,
                });
            }
            Ok(out)
        })
    }
}

/// `SCAN`'s `[cursor, [key, …]]`.
fn scan_reply(v: Option<Value>) -> Result<(u64, Vec<String>), String> {
    let bad = || "Redis answered SCAN with something else".to_owned();
    let Some(Value::Array(parts)) = v else {
        return Err(bad());
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let [cursor, Value::Array(keys)] = parts.as_slice() else {
        return Err(bad());
    };
    let cursor = text(cursor).and_then(|c| c.parse().ok()).ok_or_else(bad)?;
    Ok((cursor, keys.iter().filter_map(text).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_patterns_escape_globs() {
        assert_eq!(glob_escaped("ns/a*b?[c]\\"), "ns/a\\*b\\?\\[c\\]\\\\");
    }
}
