//! RLQS demand shared by replicas: each replica publishes, per limit its Envoys share, the
//! demands of its own buckets, and reads every other replica's, so all of them split the limit
//! over the whole fleet.
//!
//! # Keys
//!
//! One hash per limit, `CACHE_KEY_PREFIX` + `rlqs_{<counter key>}` (the braces are a Cluster hash
//! tag, so a limit's hash lives in one slot). Field: a replica's id (decimal); value:
//! `<expires at, ms since the epoch>|<demands>`, the demands comma-separated requests per unit,
//! `u` for a bucket whose demand is not known yet. A replica's field expires on its own (the
//! script drops stale fields), and the hash when no replica refreshes it.

use std::time::Duration;

use redis::Value;

use super::connect::query;
use super::RedisStore;
use crate::service::rlqs::exchange::{DemandExchange, ExchangeFuture, ReplicaDemands};

/// Publishes this replica's demands of one limit and reads the others'.
///
/// - `KEYS[1]`: the limit's hash.
/// - `ARGV[1]`: this replica's id; `ARGV[2]`: now (ms since the epoch); `ARGV[3]`: how long the
///   field holds (ms); `ARGV[4]`: the demands, empty to withdraw (no bucket of it left here).
/// - Returns `{id, demands, id, demands, ...}` of the other replicas whose fields hold.
const EXCHANGE: &str = r"
local now = tonumber(ARGV[2])
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[3])) .. '|' .. ARGV[4])
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local sep = string.find(all[i + 1], '|', 1, true)
  local expires = tonumber(string.sub(all[i + 1], 1, (sep or 1) - 1)) or 0
  if expires < now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    out[#out + 1] = all[i]
    out[#out + 1] = string.sub(all[i + 1], sep + 1)
  end
end
if #all > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return out
";

/// The demands as stored in a field.
fn encode(demands: &[Option<f64>]) -> String {
    let parts: Vec<String> = demands
        .iter()
        .map(|d| d.map_or_else(|| "u".to_string(), |d| format!("{d:.3}")))
        .collect();
    parts.join(",")
}

fn decode(text: &str) -> Option<Vec<Option<f64>>> {
    text.split(',')
        .map(|p| match p {
            "u" => Some(None),
            n => n.parse::<f64>().ok().filter(|d| d.is_finite()).map(Some),
        })
        .collect()
}

impl DemandExchange for RedisStore {
    fn exchange<'a>(
        &'a self,
        key: &'a str,
        replica: u64,
        demands: &'a [Option<f64>],
        now_ms: u64,
        hold: Duration,
    ) -> ExchangeFuture<'a> {
        Box::pin(self.exchange_demand(key, replica, encode(demands), now_ms, hold))
    }
}

impl RedisStore {
    async fn exchange_demand(
        &self,
        key: &str,
        replica: u64,
        demands: String,
        now_ms: u64,
        hold: Duration,
    ) -> Result<Vec<ReplicaDemands>, String> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(EXCHANGE)
            .arg(1)
            .arg(format!("{}rlqs_{{{key}}}", self.prefix))
            .arg(replica)
            .arg(now_ms)
            .arg(hold.as_millis() as u64)
            .arg(demands);
        let conn = self.main.conns[0].clone();
        let reply = tokio::time::timeout(self.fleet_deadline, query(conn, pipe))
            .await
            .map_err(|_| format!("Redis did not answer within {:?}", self.fleet_deadline))??;
        let Some(Value::Array(items)) = reply.into_iter().next() else {
            return Err("Redis answered the RLQS exchange with no list".into());
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let mut out = Vec::with_capacity(items.len() / 2);
        for pair in items.chunks(2) {
            let [id, demands] = pair else { continue };
            let id = text(id).and_then(|t| t.parse::<u64>().ok());
            let demands = text(demands).and_then(|t| decode(&t));
            if let (Some(replica), Some(demands)) = (id, demands) {
                out.push(ReplicaDemands { replica, demands });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demands_round_trip() {
        let d = vec![Some(12.5), None, Some(0.0)];
        assert_eq!(encode(&d), "12.500,u,0.000");
        assert_eq!(decode(&encode(&d)), Some(d));
        assert_eq!(decode("1,x"), None, "garbage is dropped, not guessed");
    }

    /// The exchange touches only the key it declares, as every script does (`scripts`).
    #[test]
    fn the_exchange_touches_only_its_declared_key() {
        for call in EXCHANGE.split("redis.call(").skip(1) {
            let key = call.split([',', ')']).nth(1).unwrap_or("").trim();
            assert_eq!(key, "KEYS[1]", "{call}");
        }
    }
}
