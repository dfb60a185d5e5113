//! Where Redis is and how the shards use it (`settings` fills these from envoyproxy/ratelimit's
//! variables).

use crate::limiter::StorePolicy;

/// How one deployment is laid out (`REDIS_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
