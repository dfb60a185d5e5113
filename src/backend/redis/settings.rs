//! Where Redis is and how the shards use it, read from envoyproxy/ratelimit's variables.

use std::time::Duration;

use crate::limiter::{FailureMode, StorePolicy};

/// How one deployment is laid out (`REDIS_TYPE`).
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

/// The environment, read with one grammar for booleans and numbers; empty counts as unset.
struct Vars<F>(F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    fn get(&self, k: &str) -> Option<String> {
        (self.0)(k).filter(|v| !v.is_empty())
    }

    fn flag(&self, k: &str) -> Result<bool, String> {
        match self.get(k).map(|v| v.to_ascii_lowercase()).as_deref() {
            None | Some("false") | Some("0") | Some("f") => Ok(false),
            Some("true") | Some("1") | Some("t") => Ok(true),
            Some(v) => Err(format!("{k}={v} is not a boolean")),
        }
    }

    fn num(&self, k: &str, default: u64) -> Result<u64, String> {
        self.get(k).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("{k}={v} is not a whole number"))
        })
    }
}

impl RedisSettings {
    /// `BACKEND_TYPE=redis` (or unset with `REDIS_URL` set) and the `REDIS_*` variables; `None`
    /// when the backend is memory.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<RedisSettings>, String> {
        let vars = Vars(env);
        match vars
            .get("BACKEND_TYPE")
            .map(|b| b.to_ascii_lowercase())
            .as_deref()
        {
            // envoyproxy/ratelimit defaults to Redis, and manifests written for it (Istio's sample)
            // set only REDIS_URL: honour them; with no Redis configured, stay in memory.
            None if vars.get("REDIS_URL").is_some() => {}
            None | Some("memory") => return Ok(None),
            Some("redis") => {}
            Some(other) => {
                return Err(format!(
                "BACKEND_TYPE={other} is not supported (memory or redis; memcache is not offered)"
            ))
            }
        }
        let failure_mode = failure_mode(&vars)?;
        let deadline = Duration::from_millis(vars.num("TURNSTILE_REDIS_DEADLINE_MS", 50)?.max(1));
        Ok(Some(RedisSettings {
            main: target(&vars, "REDIS")?,
            per_second: if vars.flag("REDIS_PERSECOND")? {
                Some(target(&vars, "REDIS_PERSECOND")?)
            } else {
                None
            },
            prefix: vars.get("CACHE_KEY_PREFIX").unwrap_or_default(),
            jitter_max_secs: vars.num("EXPIRATION_JITTER_MAX_SECONDS", 300)?,
            policy: StorePolicy {
                local_cache_bytes: vars.num("LOCAL_CACHE_SIZE_IN_BYTES", 1 << 20)? as usize,
                deadline,
                failure_mode,
                breaker_failures: vars.num("TURNSTILE_REDIS_BREAKER_FAILURES", 3)?.max(1) as u32,
                slow: Duration::from_millis(
                    vars.num("TURNSTILE_REDIS_SLOW_MS", deadline.as_millis() as u64)?,
                ),
                cooldown: Duration::from_millis(vars.num("TURNSTILE_REDIS_COOLDOWN_MS", 1000)?),
            },
        }))
    }
}

fn failure_mode<F: Fn(&str) -> Option<String>>(vars: &Vars<F>) -> Result<FailureMode, String> {
    match vars.get("TURNSTILE_REDIS_FAILURE_MODE").as_deref() {
        None | Some("fallback") => Ok(FailureMode::Fallback),
        Some("fail_open") => Ok(FailureMode::FailOpen),
        Some("fail_closed") => Ok(FailureMode::FailClosed),
        Some(o) => Err(format!(
            "TURNSTILE_REDIS_FAILURE_MODE={o} must be fallback, fail_open or fail_closed"
        )),
    }
}

/// The deployment described by the variables starting with `p` (`REDIS` or `REDIS_PERSECOND`).
fn target<F: Fn(&str) -> Option<String>>(vars: &Vars<F>, p: &str) -> Result<RedisTarget, String> {
    let get = |k: &str| vars.get(&format!("{p}_{k}"));
    let url = get("URL").ok_or_else(|| format!("{p}_URL is required with BACKEND_TYPE=redis"))?;
    let socket_unix = match get("SOCKET_TYPE").as_deref() {
        None | Some("tcp") => false,
        Some("unix") => true,
        Some(o) => return Err(format!("{p}_SOCKET_TYPE={o} must be tcp or unix")),
    };
    let kind = match get("TYPE").map(|t| t.to_ascii_lowercase()).as_deref() {
        None | Some("single") => RedisType::Single,
        Some("sentinel") => RedisType::Sentinel,
        Some("cluster") => RedisType::Cluster,
        Some(o) => return Err(format!("{p}_TYPE={o} must be single, sentinel or cluster")),
    };
    Ok(RedisTarget {
        url,
        socket_unix,
        kind,
        auth: get("AUTH"),
        tls: vars.flag(&format!("{p}_TLS"))?,
        tls_ca: get("TLS_CACERT"),
        tls_client: match (get("TLS_CLIENT_CERT"), get("TLS_CLIENT_KEY")) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(format!(
                    "{p}_TLS_CLIENT_CERT and {p}_TLS_CLIENT_KEY go together"
                ))
            }
        },
        pool_size: vars.num(&format!("{p}_POOL_SIZE"), 10)?.max(1) as usize,
    })
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
}
