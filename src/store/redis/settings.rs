//! Where Redis is and how the shards use it (`settings` fills these from envoyproxy/ratelimit's
//! variables).

use std::time::Duration;

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
    /// The setting errors name for the main deployment's `auth` (`REDIS_AUTH`, or what stands
    /// for it on another command line: limitador-server's Redis URL); `REDIS_PERSECOND_AUTH`'s
    /// is always its own.
    pub auth_named: &'static str,
    /// `REDIS_SENTINEL_AUTH`: the Sentinels' own password (`user:password` for an ACL user);
    /// `auth` is the master's.
    pub sentinel_auth: Option<String>,
    pub tls: bool,
    /// `REDIS_TLS_CACERT`: PEM file of the CA to trust instead of the built-in web roots.
    pub tls_ca: Option<String>,
    /// `REDIS_TLS_CLIENT_CERT` / `REDIS_TLS_CLIENT_KEY`: a client certificate for mutual TLS.
    pub tls_client: Option<TlsClient>,
    pub pool_size: usize,
}

/// A client certificate for mutual TLS: its PEM file, and its key's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsClient {
    pub cert: String,
    pub key: String,
}

/// envoyproxy/ratelimit's Redis settings plus turnstile's breaker.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub main: RedisTarget,
    /// `REDIS_PERSECOND*`: a second Redis for per-second limits.
    pub per_second: Option<RedisTarget>,
    pub prefix: String,
    pub jitter_max_secs: u64,
    /// How the first connection is retried (`REDIS_STARTUP_*`).
    pub startup: StartupRetry,
    /// How the shards use Redis: `TURNSTILE_REDIS_DEADLINE_MS`, `_SLOW_MS`, `_BREAKER_FAILURES`,
    /// `_COOLDOWN_MS`, `_FAILURE_MODE`, and `LOCAL_CACHE_SIZE_IN_BYTES`.
    pub policy: StorePolicy,
}

/// How the first connection is retried at start (`REDIS_STARTUP_INITIAL_INTERVAL`,
/// `_MAX_INTERVAL`, `_MAX_ELAPSED_TIME`), as envoyproxy/ratelimit retries it: a wait of
/// `initial`, doubling up to `max`, each drawn at random between `initial` and its ceiling;
/// `max_elapsed` gives up (none: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupRetry {
    pub initial: Duration,
    pub max: Duration,
    pub max_elapsed: Option<Duration>,
}

impl Default for StartupRetry {
    /// The reference's defaults: 1 s, 30 s, for ever.
    fn default() -> StartupRetry {
        StartupRetry {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            max_elapsed: None,
        }
    }
}
