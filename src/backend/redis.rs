//! Redis as the shared store of many replicas: settings, connections, key layout and scripts.
//!
//! # Keys
//!
//! Every key starts with `CACHE_KEY_PREFIX`. Then:
//!
//! - fixed window: envoyproxy/ratelimit's layout, `domain_key1_value1_key2_value2_<window start>`,
//!   the start in epoch seconds (milliseconds for sub-second windows of the direct API), counted
//!   with `INCRBY` + `EXPIRE` in one pipeline, so both services can share one Redis while a fleet
//!   migrates;
//! - sliding window: `{domain_key1_value1_}_<window start>`, one key per aligned window; the
//!   braces are a Cluster hash tag, so the current and the previous window (both read by one
//!   script) live in one slot;
//! - token bucket: `{domain_key1_value1_}_tat`, holding GCRA's theoretical arrival time.
//!
//! Times passed to the scripts come from the shard's clock (microseconds since the epoch), so
//! every replica and every test decides with the same notion of "now" it reports.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Pipeline, Value};
use tokio::sync::Mutex;

use crate::config::Algorithm;
use crate::limiter::{
    FailureMode, Op, Params, State, Store, StoreError, StoreFuture, StoreOp, StorePolicy,
    StoreReply,
};

/// Sliding window: adds `hits` to the current window if the weighted estimate allows it.
///
/// - `KEYS[1]`: the current window's counter; `KEYS[2]`: the previous window's counter.
/// - `ARGV[1]`: limit; `ARGV[2]`: hits (0 checks only); `ARGV[3]`: milliseconds left in the
///   current window; `ARGV[4]`: window length in milliseconds; `ARGV[5]`: TTL of the current
///   window's key in milliseconds (two windows: it weighs on the next one).
/// - Returns `{allowed (0/1), current count after, previous count}`.
///
/// The estimate is `ceil(previous × left / length) + current`, as in `limiter::State::eval`;
/// exact while `previous × length` stays below 2^53.
const SLIDING: &str = r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local limit = tonumber(ARGV[1])
local hits = tonumber(ARGV[2])
local weighted = math.ceil(prev * tonumber(ARGV[3]) / tonumber(ARGV[4]))
if weighted + cur + hits > limit then
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisType {
    Single,
    Sentinel,
    Cluster,
}

/// One Redis deployment's connection settings.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    pub url: String,
    pub socket_unix: bool,
    pub kind: RedisType,
    pub auth: Option<String>,
    pub tls: bool,
    /// `REDIS_TLS_CACERT`: PEM file of the CA to trust instead of the built-in web roots.
    pub tls_ca: Option<String>,
    /// `REDIS_TLS_CLIENT_CERT` / `REDIS_TLS_CLIENT_KEY`: a client certificate for mutual TLS.
    pub tls_client: Option<(String, String)>,
    pub pool_size: usize,
}

/// envoyproxy/ratelimit's Redis settings plus turnstile's breaker.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub main: RedisTarget,
    /// `REDIS_PERSECOND*`: a second Redis for per-second limits.
    pub per_second: Option<RedisTarget>,
    pub prefix: String,
    pub jitter_max_secs: u64,
    /// How the shards use Redis: `TURNSTILE_REDIS_DEADLINE_MS`, `_SLOW_MS`, `_BREAKER_FAILURES`,
    /// `_COOLDOWN_MS`, `_FAILURE_MODE`, and `LOCAL_CACHE_SIZE_IN_BYTES`.
    pub policy: StorePolicy,
}

impl RedisSettings {
    /// `BACKEND_TYPE=redis` (or unset with `REDIS_URL` set) and the `REDIS_*` variables; `None`
    /// when the backend is memory.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<RedisSettings>, String> {
        let get = |k: &str| env(k).filter(|v| !v.is_empty());
        match get("BACKEND_TYPE")
            .map(|b| b.to_ascii_lowercase())
            .as_deref()
        {
            // envoyproxy/ratelimit defaults to Redis, and manifests written for it (Istio's sample)
            // set only REDIS_URL: honour them; with no Redis configured, stay in memory.
            None if get("REDIS_URL").is_some() => {}
            None | Some("memory") => return Ok(None),
            Some("redis") => {}
            Some(other) => {
                return Err(format!(
                "BACKEND_TYPE={other} is not supported (memory or redis; memcache is not offered)"
            ))
            }
        }
        let flag = |k: &str| -> Result<bool, String> {
            match get(k).map(|v| v.to_ascii_lowercase()).as_deref() {
                None | Some("false") | Some("0") | Some("f") => Ok(false),
                Some("true") | Some("1") | Some("t") => Ok(true),
                Some(v) => Err(format!("{k}={v} is not a boolean")),
            }
        };
        let num = |k: &str, default: u64| -> Result<u64, String> {
            get(k).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|_| format!("{k}={v} is not a whole number"))
            })
        };
        let target = |p: &str| -> Result<RedisTarget, String> {
            let url = get(&format!("{p}_URL"))
                .ok_or_else(|| format!("{p}_URL is required with BACKEND_TYPE=redis"))?;
            let socket_unix = match get(&format!("{p}_SOCKET_TYPE")).as_deref() {
                None | Some("tcp") => false,
                Some("unix") => true,
                Some(o) => return Err(format!("{p}_SOCKET_TYPE={o} must be tcp or unix")),
            };
            let kind = match get(&format!("{p}_TYPE"))
                .map(|t| t.to_ascii_lowercase())
                .as_deref()
            {
                None | Some("single") => RedisType::Single,
                Some("sentinel") => RedisType::Sentinel,
                Some("cluster") => RedisType::Cluster,
                Some(o) => return Err(format!("{p}_TYPE={o} must be single, sentinel or cluster")),
            };
            Ok(RedisTarget {
                url,
                socket_unix,
                kind,
                auth: get(&format!("{p}_AUTH")),
                tls: flag(&format!("{p}_TLS"))?,
                tls_ca: get(&format!("{p}_TLS_CACERT")),
                tls_client: match (
                    get(&format!("{p}_TLS_CLIENT_CERT")),
                    get(&format!("{p}_TLS_CLIENT_KEY")),
                ) {
                    (Some(c), Some(k)) => Some((c, k)),
                    (None, None) => None,
                    _ => {
                        return Err(format!(
                            "{p}_TLS_CLIENT_CERT and {p}_TLS_CLIENT_KEY go together"
                        ))
                    }
                },
                pool_size: num(&format!("{p}_POOL_SIZE"), 10)?.max(1) as usize,
            })
        };
        let failure_mode = match get("TURNSTILE_REDIS_FAILURE_MODE").as_deref() {
            None | Some("fallback") => FailureMode::Fallback,
            Some("fail_open") => FailureMode::FailOpen,
            Some("fail_closed") => FailureMode::FailClosed,
            Some(o) => {
                return Err(format!(
                    "TURNSTILE_REDIS_FAILURE_MODE={o} must be fallback, fail_open or fail_closed"
                ))
            }
        };
        let deadline = Duration::from_millis(num("TURNSTILE_REDIS_DEADLINE_MS", 50)?.max(1));
        Ok(Some(RedisSettings {
            main: target("REDIS")?,
            per_second: if flag("REDIS_PERSECOND")? {
                Some(target("REDIS_PERSECOND")?)
            } else {
                None
            },
            prefix: get("CACHE_KEY_PREFIX").unwrap_or_default(),
            jitter_max_secs: num("EXPIRATION_JITTER_MAX_SECONDS", 300)?,
            policy: StorePolicy {
                local_cache_bytes: num("LOCAL_CACHE_SIZE_IN_BYTES", 1 << 20)? as usize,
                deadline,
                failure_mode,
                breaker_failures: num("TURNSTILE_REDIS_BREAKER_FAILURES", 3)?.max(1) as u32,
                slow: Duration::from_millis(num(
                    "TURNSTILE_REDIS_SLOW_MS",
                    deadline.as_millis() as u64,
                )?),
                cooldown: Duration::from_millis(num("TURNSTILE_REDIS_COOLDOWN_MS", 1000)?),
            },
        }))
    }
}

/// A connection to one deployment, reconnecting by itself.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// Sentinel: asks the sentinels for the master again after a failure.
    Sentinel(Arc<Mutex<(SentinelClient, Option<MultiplexedConnection>)>>),
}

/// The connections of one deployment.
struct Deployment {
    conns: Vec<Conn>,
}

/// Shared by the shards: connections and key layout.
pub struct RedisStore {
    main: Deployment,
    per_second: Option<Deployment>,
    prefix: String,
    jitter_max_secs: u64,
}

/// Commands with their place in the batch.
type Numbered = Vec<(usize, Cmd)>;

/// One op as sent to Redis, with what its answer means.
#[derive(Debug, Clone)]
enum Cmd {
    /// `INCRBY key hits` + `PEXPIRE key ttl`: answers the count after.
    Fixed {
        key: String,
        hits: u64,
        ttl_ms: u64,
    },
    Sliding {
        cur: String,
        prev: String,
        limit: u32,
        hits: u64,
        left_ms: u64,
        window_ms: u64,
    },
    Gcra {
        key: String,
        now_us: u64,
        interval_us: u64,
        burst: u32,
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
}

impl Cmd {
    fn per_second(&self, p: &Params) -> bool {
        let _ = self;
        p.window_ms == 1000
    }
}

fn url_of(t: &RedisTarget, host: &str) -> String {
    if t.socket_unix {
        // Unix socket URLs carry credentials as query parameters.
        let auth = match &t.auth {
            None => String::new(),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => format!("?user={u}&pass={p}"),
                None => format!("?pass={a}"),
            },
        };
        return format!("unix://{host}{auth}");
    }
    let scheme = if t.tls { "rediss" } else { "redis" };
    let auth = match &t.auth {
        None => String::new(),
        // `user:password` for ACL users, a bare password otherwise.
        Some(a) if a.contains(':') => format!("{a}@"),
        Some(a) => format!(":{a}@"),
    };
    format!("{scheme}://{auth}{host}")
}

/// The CA and client certificate files, read now so a wrong path stops the start.
fn certificates(t: &RedisTarget) -> Result<Option<redis::TlsCertificates>, String> {
    if !t.tls || (t.tls_ca.is_none() && t.tls_client.is_none()) {
        return Ok(None);
    }
    let read = |p: &str| std::fs::read(p).map_err(|e| format!("cannot read {p}: {e}"));
    Ok(Some(redis::TlsCertificates {
        client_tls: match &t.tls_client {
            Some((c, k)) => Some(redis::ClientTlsConfig {
                client_cert: read(c)?,
                client_key: read(k)?,
            }),
            None => None,
        },
        root_cert: t.tls_ca.as_deref().map(read).transpose()?,
    }))
}

async fn connect(t: &RedisTarget, deadline: Duration) -> Result<Deployment, String> {
    let mut conns = Vec::with_capacity(t.pool_size);
    let certs = certificates(t)?;
    match t.kind {
        RedisType::Single => {
            let url = url_of(t, &t.url);
            let client = match certs {
                Some(c) => redis::Client::build_with_tls(url, c),
                None => redis::Client::open(url),
            }
            .map_err(|e| format!("REDIS_URL: {e}"))?;
            for _ in 0..t.pool_size {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(deadline.max(Duration::from_millis(500))))
                    .set_response_timeout(Some(deadline))
                    .set_number_of_retries(1);
                let m = ConnectionManager::new_with_config(client.clone(), cfg)
                    .await
                    .map_err(|e| format!("cannot connect to Redis at {}: {e}", t.url))?;
                conns.push(Conn::Single(m));
            }
        }
        RedisType::Cluster => {
            let nodes: Vec<String> = t.url.split(',').map(|h| url_of(t, h.trim())).collect();
            let mut builder = redis::cluster::ClusterClient::builder(nodes)
                .connection_timeout(deadline.max(Duration::from_millis(500)))
                .response_timeout(deadline);
            if let Some(c) = certs {
                builder = builder.certs(c);
            }
            let client = builder
                .build()
                .map_err(|e| format!("REDIS_URL (cluster): {e}"))?;
            let c = client
                .get_async_connection()
                .await
                .map_err(|e| format!("cannot connect to the Redis Cluster at {}: {e}", t.url))?;
            // One cluster connection multiplexes over a connection per node.
            conns.push(Conn::Cluster(c));
        }
        RedisType::Sentinel => {
            // envoyproxy/ratelimit's form: `master-name,sentinel1:26379,sentinel2:26379`.
            let mut parts = t.url.split(',').map(str::trim);
            let master = parts.next().unwrap_or_default().to_owned();
            let sentinels: Vec<String> = parts.map(|h| format!("redis://{h}")).collect();
            if master.is_empty() || sentinels.is_empty() {
                return Err(
                    "REDIS_URL for sentinel must be master-name,host:port[,host:port...]".into(),
                );
            }
            let mut node = redis::sentinel::SentinelNodeConnectionInfo::default();
            if let Some(a) = &t.auth {
                let (user, pass) = match a.split_once(':') {
                    Some((u, p)) => (Some(u.to_owned()), p.to_owned()),
                    None => (None, a.clone()),
                };
                let mut info = redis::RedisConnectionInfo::default().set_password(pass);
                if let Some(u) = user {
                    info = info.set_username(u);
                }
                node = node.set_redis_connection_info(info);
            }
            for _ in 0..t.pool_size {
                let client = SentinelClient::build(
                    sentinels.clone(),
                    master.clone(),
                    Some(node.clone()),
                    SentinelServerType::Master,
                )
                .map_err(|e| format!("REDIS_URL (sentinel): {e}"))?;
                conns.push(Conn::Sentinel(Arc::new(Mutex::new((client, None)))));
            }
        }
    }
    Ok(Deployment { conns })
}

impl RedisStore {
    /// Connects and checks every deployment with a PING, so a wrong address or password stops
    /// the start instead of sending every decision to the fallback.
    pub async fn connect(s: &RedisSettings) -> Result<RedisStore, String> {
        let deadline = s.policy.deadline;
        let main = connect(&s.main, deadline).await?;
        let per_second = match &s.per_second {
            Some(t) => Some(connect(t, deadline).await?),
            None => None,
        };
        let check = Duration::from_secs(5).max(deadline);
        for (name, dep) in [
            ("REDIS_URL", Some(&main)),
            ("REDIS_PERSECOND_URL", per_second.as_ref()),
        ] {
            let Some(dep) = dep else { continue };
            for c in &dep.conns {
                let mut pipe = redis::pipe();
                pipe.cmd("PING");
                let ping = ping(c.clone(), pipe);
                match tokio::time::timeout(check, ping).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(format!("Redis at {name} does not answer PING: {e}")),
                    Err(_) => {
                        return Err(format!(
                            "Redis at {name} does not answer PING within {check:?}"
                        ))
                    }
                }
            }
        }
        Ok(RedisStore {
            main,
            per_second,
            prefix: s.prefix.clone(),
            jitter_max_secs: s.jitter_max_secs,
        })
    }

    /// The command deciding (or, with `refund`, giving back) `op` at `now` (ns).
    fn cmd(&self, op: &Op, now: u64, refund: bool) -> Cmd {
        let p = &op.params;
        let w = p.window_ms.max(1);
        let now_ms = now / 1_000_000;
        let idx = now_ms / w;
        let start = |i: u64| {
            if w.is_multiple_of(1000) {
                (i * w / 1000).to_string()
            } else {
                format!("{}ms", i * w)
            }
        };
        match p.algorithm {
            Algorithm::FixedWindow => {
                let key = format!("{}{}{}", self.prefix, op.key, start(idx));
                if refund {
                    Cmd::RefundCount { key, hits: op.hits }
                } else {
                    let jitter = if self.jitter_max_secs > 0 {
                        rand::random_range(0..=self.jitter_max_secs) * 1000
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
                let cur = format!("{}{{{}}}_{}", self.prefix, op.key, start(idx));
                if refund {
                    Cmd::RefundCount {
                        key: cur,
                        hits: op.hits,
                    }
                } else {
                    Cmd::Sliding {
                        prev: format!(
                            "{}{{{}}}_{}",
                            self.prefix,
                            op.key,
                            start(idx.saturating_sub(1))
                        ),
                        cur,
                        limit: p.requests_per_unit,
                        hits: op.hits,
                        left_ms: (idx + 1) * w - now_ms,
                        window_ms: w,
                    }
                }
            }
            Algorithm::TokenBucket { burst } => {
                let key = format!("{}{{{}}}_tat", self.prefix, op.key);
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

impl Store for RedisStore {
    /// One pipeline per deployment (per-second limits go to their own Redis when one is set).
    fn run(&self, lane: usize, batch: &[StoreOp<'_>], now: u64, deadline: Duration) -> StoreFuture {
        let (mut main, mut second): (Numbered, Numbered) = (Vec::new(), Vec::new());
        let mut asked = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            let c = self.cmd(b.op, now, b.give_back);
            if self.per_second.is_some() && c.per_second(&b.op.params) {
                second.push((i, c));
            } else {
                main.push((i, c));
            }
            asked.push(Asked {
                params: b.op.params,
                hits: b.op.hits,
                give_back: b.give_back,
            });
        }
        let pick = |dep: Option<&Deployment>, list: Numbered| {
            let dep = dep.filter(|_| !list.is_empty())?;
            Some((dep.conns[lane % dep.conns.len()].clone(), list))
        };
        let lists = [
            pick(Some(&self.main), main),
            pick(self.per_second.as_ref(), second),
        ];
        Box::pin(async move {
            let fut = async {
                let mut out = vec![Vec::new(); asked.len()];
                for (conn, list) in lists.into_iter().flatten() {
                    let (at, cmds): (Vec<usize>, Vec<Cmd>) = list.into_iter().unzip();
                    let replies = exec(conn, &cmds).await?;
                    for (i, r) in at.into_iter().zip(replies) {
                        out[i] = r;
                    }
                }
                Ok(out)
            };
            let raw = match tokio::time::timeout(deadline, fut).await {
                Ok(r) => r.map_err(StoreError)?,
                Err(_) => {
                    return Err(StoreError(format!(
                        "Redis did not answer within {deadline:?}"
                    )))
                }
            };
            Ok(asked
                .iter()
                .zip(&raw)
                .map(|(a, r)| a.decode(r, now))
                .collect())
        })
    }
}

fn add(pipe: &mut Pipeline, c: &Cmd) {
    match c {
        Cmd::Fixed { key, hits, ttl_ms } => {
            pipe.cmd("INCRBY").arg(key).arg(*hits);
            pipe.cmd("PEXPIRE").arg(key).arg(*ttl_ms).ignore();
        }
        // EVAL with the script text: Redis caches scripts by their hash, and a restarted
        // Redis needs no reload (EVALSHA would answer NOSCRIPT there).
        Cmd::Sliding {
            cur,
            prev,
            limit,
            hits,
            left_ms,
            window_ms,
        } => {
            pipe.cmd("EVAL")
                .arg(SLIDING)
                .arg(2)
                .arg(cur)
                .arg(prev)
                .arg(*limit)
                .arg(*hits)
                .arg(*left_ms)
                .arg(*window_ms)
                .arg(2 * *window_ms);
        }
        Cmd::Gcra {
            key,
            now_us,
            interval_us,
            burst,
            hits,
        } => {
            pipe.cmd("EVAL")
                .arg(GCRA)
                .arg(1)
                .arg(key)
                .arg(*now_us)
                .arg(*interval_us)
                .arg(*burst)
                .arg(*hits);
        }
        Cmd::RefundCount { key, hits } => {
            pipe.cmd("EVAL")
                .arg(REFUND_COUNT)
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
            pipe.cmd("EVAL")
                .arg(REFUND_GCRA)
                .arg(1)
                .arg(key)
                .arg(*now_us)
                .arg(*interval_us)
                .arg(*hits);
        }
    }
}

/// Sends `cmds` over `conn`; answers each command's reply as integers, in order.
async fn exec(conn: Conn, cmds: &[Cmd]) -> Result<Vec<Vec<i64>>, String> {
    let values: Vec<Value> = match conn {
        Conn::Single(mut m) => {
            let mut pipe = redis::pipe();
            for c in cmds {
                add(&mut pipe, c);
            }
            pipe.query_async(&mut m).await.map_err(|e| e.to_string())?
        }
        Conn::Sentinel(s) => {
            let mut guard = s.lock().await;
            if guard.1.is_none() {
                let c = guard
                    .0
                    .get_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                guard.1 = Some(c);
            }
            let mut c = guard.1.clone().expect("connected");
            drop(guard);
            let mut pipe = redis::pipe();
            for cmd in cmds {
                add(&mut pipe, cmd);
            }
            match pipe.query_async(&mut c).await {
                Ok(v) => v,
                Err(e) => {
                    // The master may have moved: ask the sentinels again next time.
                    s.lock().await.1 = None;
                    return Err(e.to_string());
                }
            }
        }
        Conn::Cluster(c) => {
            // A pipeline must stay within one slot: each command (its keys share a hash tag
            // or are one key) goes on its own, all at once.
            let futs = cmds.iter().map(|cmd| {
                let mut c = c.clone();
                let mut pipe = redis::pipe();
                add(&mut pipe, cmd);
                async move { pipe.query_async::<Vec<Value>>(&mut c).await }
            });
            let mut out = Vec::with_capacity(cmds.len());
            for r in futures_util::future::join_all(futs).await {
                let mut v = r.map_err(|e| e.to_string())?;
                out.push(v.pop().unwrap_or(Value::Nil));
            }
            out
        }
    };
    if values.len() != cmds.len() {
        return Err(format!(
            "Redis answered {} replies to {} commands",
            values.len(),
            cmds.len()
        ));
    }
    Ok(values.into_iter().map(ints).collect())
}

/// What an op asked of Redis, kept to read its reply.
struct Asked {
    params: Params,
    hits: u64,
    give_back: bool,
}

impl Asked {
    /// Turns the reply to this op (the integers of a script's array, or INCRBY's count) into
    /// the key's state before the op's hits and the script's verdict.
    fn decode(&self, reply: &[i64], now: u64) -> StoreReply {
        let p = &self.params;
        let w = p.window_ms.max(1) * 1_000_000;
        // States keep the window index modulo 2^32 (see `State`).
        let idx = (now / w) as u32;
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let first = reply.first().copied().unwrap_or(0);
        if self.give_back {
            // REFUND_COUNT and REFUND_GCRA answer the state after (-1: the key is gone).
            let before = match p.algorithm {
                Algorithm::FixedWindow => State::Fixed {
                    window: idx,
                    count: clamp(first.max(0) as u64),
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
            return StoreReply {
                before,
                allowed: None,
            };
        }
        let hits = self.hits;
        match p.algorithm {
            // INCRBY answers the count after the hits.
            Algorithm::FixedWindow => StoreReply {
                before: State::Fixed {
                    window: idx,
                    count: clamp((first.max(0) as u64).saturating_sub(hits)),
                },
                allowed: None,
            },
            // SLIDING answers {allowed, current count after, previous count}.
            Algorithm::SlidingWindow => {
                let allowed = first == 1;
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
                    allowed: Some(allowed),
                }
            }
            // GCRA answers {allowed, TAT after (µs)}.
            Algorithm::TokenBucket { .. } => {
                let allowed = first == 1;
                let tat = reply.get(1).copied().unwrap_or(0).max(0) as u64 * 1000;
                let interval = w / u64::from(p.requests_per_unit.max(1));
                let tat = if allowed {
                    tat.saturating_sub(interval.saturating_mul(hits))
                } else {
                    tat
                };
                StoreReply {
                    before: State::Gcra { tat },
                    allowed: Some(allowed),
                }
            }
        }
    }
}

async fn ping(conn: Conn, pipe: Pipeline) -> Result<(), String> {
    let r: Result<Vec<Value>, redis::RedisError> = match conn {
        Conn::Single(mut m) => pipe.query_async(&mut m).await,
        Conn::Cluster(mut c) => pipe.query_async(&mut c).await,
        Conn::Sentinel(s) => {
            let mut g = s.lock().await;
            let mut c =
                g.0.get_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
            let r = pipe.query_async(&mut c).await;
            g.1 = Some(c);
            r
        }
    };
    r.map(|_| ()).map_err(|e| e.to_string())
}

fn ints(v: Value) -> Vec<i64> {
    match v {
        Value::Int(i) => vec![i],
        Value::Array(items) => items.into_iter().flat_map(ints).collect(),
        Value::BulkString(b) => std::str::from_utf8(&b)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or_else(Vec::new, |i| vec![i]),
        Value::SimpleString(s) => s.parse().map_or_else(|_| Vec::new(), |i| vec![i]),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Option<RedisSettings>, String> {
        RedisSettings::from_env(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn backend_choice_follows_envoyproxy_ratelimit_manifests() {
        assert!(from(&[]).unwrap().is_none(), "memory by default");
        assert!(from(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "r:6379")])
            .unwrap()
            .is_none());
        let istio = from(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (istio.main.url.as_str(), &istio.main.kind),
            ("redis:6379", &RedisType::Single)
        );
        assert!(from(&[("BACKEND_TYPE", "redis")])
            .unwrap_err()
            .contains("REDIS_URL"));
        assert!(from(&[("BACKEND_TYPE", "memcache")])
            .unwrap_err()
            .contains("memcache"));
        assert!(from(&[("REDIS_URL", "x"), ("REDIS_TYPE", "ring")])
            .unwrap_err()
            .contains("REDIS_TYPE"));
        let s = from(&[
            ("REDIS_URL", "a:1"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "b:2"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("CACHE_KEY_PREFIX", "p_"),
            ("TURNSTILE_REDIS_FAILURE_MODE", "fail_closed"),
        ])
        .unwrap()
        .unwrap();
        let ps = s.per_second.unwrap();
        assert_eq!((ps.url.as_str(), ps.kind), ("b:2", RedisType::Cluster));
        assert_eq!(
            (s.prefix.as_str(), s.policy.failure_mode),
            ("p_", FailureMode::FailClosed)
        );
    }

    #[test]
    fn unix_and_auth_urls() {
        let t = RedisTarget {
            url: "/run/redis.sock".into(),
            socket_unix: true,
            kind: RedisType::Single,
            auth: Some("pw".into()),
            tls: false,
            tls_ca: None,
            tls_client: None,
            pool_size: 1,
        };
        assert_eq!(url_of(&t, &t.url), "unix:///run/redis.sock?pass=pw");
        let tcp = RedisTarget {
            socket_unix: false,
            tls: true,
            auth: Some("u:pw".into()),
            ..t
        };
        assert_eq!(url_of(&tcp, "h:6379"), "rediss://u:pw@h:6379");
    }
}
