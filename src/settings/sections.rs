//! The settings of each subsystem, read from their variables: the storage and Redis, the admin
//! listener, logs and traces, and the reference's variables that change nothing here (GoCC's
//! with them). The doors' own are in files of their names (`gocc`, `throttle`, `xds`).

use std::net::SocketAddr;
use std::time::Duration;

use super::env::{resolve, Env, Result};
use super::Storage;
use crate::durable::StateSettings;
use crate::limiter::{FailureMode, StorePolicy};
use crate::store::redis::{RedisSettings, RedisTarget, RedisType, StartupRetry, TlsClient};
use crate::telemetry::{log_filter, LogSettings, OtlpProtocol, TracingSettings};
use crate::transport::http::{AdminSettings, AdminToken, DEFAULT_ADMIN_ADDR};

/// `TURNSTILE_STATE_DIR` and `TURNSTILE_STATE_SYNC_INTERVAL`, the journal's save interval (read
/// whatever the storage).
fn state(env: &Env<'_>) -> Result<Option<StateSettings>> {
    const MAX: Duration = Duration::from_secs(60);
    let k = "TURNSTILE_STATE_SYNC_INTERVAL";
    let save_interval = env.duration(k, StateSettings::DEFAULT_SAVE_INTERVAL)?;
    if save_interval.is_zero() || save_interval > MAX {
        return Err(format!(
            "{k}={}: must be more than 0 and at most {MAX:?} (what a crash may lose)",
            env.written(k, save_interval)
        ));
    }
    let dir = env.get("TURNSTILE_STATE_DIR").filter(|d| !d.is_empty());
    Ok(dir.map(|dir| StateSettings {
        dir: dir.into(),
        named: "TURNSTILE_STATE_DIR",
        save_interval,
    }))
}

/// `BACKEND_TYPE` (unset: Redis when `REDIS_URL` is set, memory otherwise) and the `REDIS_*`
/// variables. Every Redis setting is read whatever the storage, so a bad value
/// stops the start the day it is written, not the day the storage changes.
pub(super) fn storage(env: &Env<'_>) -> Result<Storage> {
    // envoyproxy/ratelimit defaults to Redis, and manifests written for it (Istio's sample) set
    // only REDIS_URL: honour them; with no Redis configured, stay in memory.
    let default = env.get("REDIS_URL").is_some();
    let on = env
        .choice(
            "BACKEND_TYPE",
            Some(default),
            &[
                ("memory", Some(false)),
                ("redis", Some(true)),
                ("memcache", None),
            ],
        )?
        .ok_or(
            "BACKEND_TYPE=memcache is not supported (memory or redis; memcache is not offered)",
        )?;
    let policy = store_policy(env)?;
    let main = redis_target(env, "REDIS")?;
    let per_second_on = env.flag("REDIS_PERSECOND", false)?;
    let per_second = redis_target(env, "REDIS_PERSECOND")?;
    let jitter_max_secs = env.number("EXPIRATION_JITTER_MAX_SECONDS", 300)?;
    let startup = startup_retry(env)?;
    // Checked, then ignored: Cluster pipelines go to every node at once (`ignored`).
    for k in [
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    ] {
        env.number(k, 1u32)?;
    }
    let state = state(env)?;
    match (on, state) {
        (false, None) => return Ok(Storage::Memory),
        (false, Some(state)) => return Ok(Storage::Durable(state)),
        (true, Some(_)) => {
            return Err("TURNSTILE_STATE_DIR keeps the in-memory counters on disk; with BACKEND_TYPE=redis \
                 the counters live in Redis, which keeps them across restarts: unset one of the two"
                .into())
        }
        (true, None) => {}
    }
    let required = |t: Option<RedisTarget>, p: &str| {
        t.ok_or_else(|| format!("{p}_URL is required with BACKEND_TYPE=redis"))
    };
    Ok(Storage::Redis(Box::new(RedisSettings {
        main: required(main, "REDIS")?,
        per_second: match per_second_on {
            true => Some(required(per_second, "REDIS_PERSECOND")?),
            false => None,
        },
        prefix: env.get("CACHE_KEY_PREFIX").unwrap_or_default(),
        startup,
        jitter_max_secs,
        policy,
    })))
}

/// The breaker, the local cache and local-first: `TURNSTILE_REDIS_*`, `TURNSTILE_LOCAL_FIRST*`,
/// `LOCAL_CACHE_SIZE_IN_BYTES`.
fn store_policy(env: &Env<'_>) -> Result<StorePolicy> {
    let failure_mode = env.choice(
        "TURNSTILE_REDIS_FAILURE_MODE",
        FailureMode::Fallback,
        &[
            ("fallback", FailureMode::Fallback),
            ("fail_open", FailureMode::FailOpen),
            ("fail_closed", FailureMode::FailClosed),
        ],
    )?;
    let deadline = env
        .millis("TURNSTILE_REDIS_DEADLINE_MS", 50)?
        .max(Duration::from_millis(1));
    Ok(StorePolicy {
        local_cache_bytes: env.number("LOCAL_CACHE_SIZE_IN_BYTES", 1usize << 20)?,
        deadline,
        failure_mode,
        breaker_failures: env.number("TURNSTILE_REDIS_BREAKER_FAILURES", 3u32)?.max(1),
        slow: env.millis("TURNSTILE_REDIS_SLOW_MS", deadline.as_millis() as u64)?,
        cooldown: env.millis("TURNSTILE_REDIS_COOLDOWN_MS", 1000)?,
        local_first: env.flag("TURNSTILE_LOCAL_FIRST", false)?,
        sync_interval: sync_interval(env)?,
    })
}

/// `REDIS_STARTUP_*`: how the first connection is retried (the reference's defaults: 1s,
/// 30s, 0 for ever).
fn startup_retry(env: &Env<'_>) -> Result<StartupRetry> {
    let d = StartupRetry::default();
    let initial = env.duration("REDIS_STARTUP_INITIAL_INTERVAL", d.initial)?;
    let max = env.duration("REDIS_STARTUP_MAX_INTERVAL", d.max)?;
    if initial.is_zero() || max < initial {
        return Err(format!(
            "REDIS_STARTUP_INITIAL_INTERVAL ({}) must be more than 0 and at most \
             REDIS_STARTUP_MAX_INTERVAL ({})",
            env.written("REDIS_STARTUP_INITIAL_INTERVAL", initial),
            env.written("REDIS_STARTUP_MAX_INTERVAL", max)
        ));
    }
    let elapsed = env.duration("REDIS_STARTUP_MAX_ELAPSED_TIME", Duration::ZERO)?;
    Ok(StartupRetry {
        initial,
        max,
        max_elapsed: (!elapsed.is_zero()).then_some(elapsed),
    })
}

/// `TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL`: how often local-first counters meet Redis.
fn sync_interval(env: &Env<'_>) -> Result<Duration> {
    const K: &str = "TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL";
    let d = env.duration(K, Duration::from_millis(100))?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(60) {
        return Err(format!(
            "{K}={} is out of range (from 1ms to 60s)",
            env.get(K).unwrap_or_default()
        ));
    }
    Ok(d)
}

/// The `{p}_*` settings of one Redis (`REDIS`, `REDIS_PERSECOND`), all checked; `None` when
/// `{p}_URL` is unset.
fn redis_target(env: &Env<'_>, p: &str) -> Result<Option<RedisTarget>> {
    let var = |s: &str| format!("{p}_{s}");
    let tls_client = env.both_or_neither(&var("TLS_CLIENT_CERT"), &var("TLS_CLIENT_KEY"))?;
    let socket_unix = env.choice(
        &var("SOCKET_TYPE"),
        false,
        &[("tcp", false), ("unix", true)],
    )?;
    let kind = env.choice(
        &var("TYPE"),
        RedisType::Single,
        &[
            ("single", RedisType::Single),
            ("sentinel", RedisType::Sentinel),
            ("cluster", RedisType::Cluster),
        ],
    )?;
    let tls = env.flag(&var("TLS"), false)?;
    let pool_size = env.number(&var("POOL_SIZE"), 10usize)?.max(1);
    if let Some(url) = env.get(&var("URL")).filter(|_| !socket_unix) {
        refuse_url_scheme(&var("URL"), &url, p)?;
    }
    Ok(env.get(&var("URL")).map(|url| RedisTarget {
        url,
        socket_unix,
        kind,
        auth: env.get(&var("AUTH")),
        auth_named: "REDIS_AUTH",
        sentinel_auth: env.get(&var("SENTINEL_AUTH")),
        tls,
        tls_ca: env.get(&var("TLS_CACERT")),
        tls_client: tls_client.map(|(cert, key)| TlsClient { cert, key }),
        pool_size,
    }))
}

/// `REDIS_URL` (and `REDIS_PERSECOND_URL`) take `host:port`, as the reference's do, several
/// comma-separated for a Cluster or Sentinels: a URL (`redis://…`) is refused saying so, naming
/// only its scheme (the rest may hold a password), and where its parts go.
fn refuse_url_scheme(var: &str, url: &str, p: &str) -> Result<()> {
    let Some((scheme, _)) = url.split(',').find_map(|a| a.trim().split_once("://")) else {
        return Ok(());
    };
    Err(format!(
        "{var}={scheme}://…: a host:port is expected (e.g. redis:6379, several separated by \
         commas for a Cluster or Sentinels), not a URL: the password goes in {p}_AUTH, TLS is \
         {p}_TLS=true"
    ))
}

/// `TURNSTILE_ADMIN_ADDR` (off when unset) and `TURNSTILE_ADMIN_TOKEN_FILE`, read now so a
/// missing or empty file stops the start. A non-loopback address needs the token.
pub(super) fn admin(env: &Env<'_>) -> Result<Option<AdminSettings>> {
    let token = match env.get("TURNSTILE_ADMIN_TOKEN_FILE") {
        None => None,
        Some(path) => {
            let bad = |why: String| format!("TURNSTILE_ADMIN_TOKEN_FILE={path}: {why}");
            let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("{e}")))?;
            Some(AdminToken::new(&text).map_err(bad)?)
        }
    };
    let Some(text) = env.get("TURNSTILE_ADMIN_ADDR") else {
        if token.is_some() {
            return Err(
                "TURNSTILE_ADMIN_TOKEN_FILE is set but TURNSTILE_ADMIN_ADDR is not: \
                        the admin listener is off"
                    .into(),
            );
        }
        return Ok(None);
    };
    let default: SocketAddr = DEFAULT_ADMIN_ADDR.parse().expect("a valid default");
    let addr =
        listener_addr(&text, default).map_err(|e| format!("TURNSTILE_ADMIN_ADDR={text}: {e}"))?;
    let s = AdminSettings { addr, token };
    s.check()?;
    Ok(Some(s))
}

/// A listener of turnstile's own: `HOST:PORT`, a bare `PORT` on the default host, or `true`
/// for the default address.
pub(super) fn listener_addr(
    text: &str,
    default: SocketAddr,
) -> std::result::Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::new(default.ip(), port));
    }
    if crate::config::grammar::parse_bool(text) == Some(true) {
        return Ok(default);
    }
    let (host, port) = text
        .rsplit_once(':')
        .ok_or("expected HOST:PORT, PORT or true")?;
    let port = port.parse().map_err(|_| format!("bad port {port:?}"))?;
    resolve(host, port)
}

/// `LOG_LEVEL` (a logrus level name, as envoyproxy/ratelimit reads it, or a `tracing` filter)
/// and `LOG_FORMAT` (json, or else text, as in envoyproxy/ratelimit).
pub(super) fn log(env: &Env<'_>) -> Result<LogSettings> {
    Ok(LogSettings {
        level: log_filter(&env.string("LOG_LEVEL", "info"))?,
        json: log_json(env),
    })
}

/// `LOG_FORMAT=json`.
pub(super) fn log_json(env: &Env<'_>) -> bool {
    env.get("LOG_FORMAT")
        .is_some_and(|f| f.trim().eq_ignore_ascii_case("json"))
}

/// `TRACING_ENABLED=true`, the `TRACING_*` variables and the OTLP endpoint variables.
/// Every value set is checked, on or off.
pub(super) fn tracing(env: &Env<'_>) -> Result<Option<TracingSettings>> {
    let on = env.flag("TRACING_ENABLED", false)?;
    let protocol = env.choice(
        "TRACING_EXPORTER_PROTOCOL",
        OtlpProtocol::Http,
        &[
            ("http", OtlpProtocol::Http),
            ("http/protobuf", OtlpProtocol::Http),
            ("grpc", OtlpProtocol::Grpc),
        ],
    )?;
    let endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|e| match protocol {
                OtlpProtocol::Http => format!("{}/v1/traces", e.trim_end_matches('/')),
                OtlpProtocol::Grpc => e,
            })
    });
    let sampling_rate = env.fraction("TRACING_SAMPLING_RATE", 1.0)?;
    if !on {
        return Ok(None);
    }
    // The exporter is built without TLS: an https endpoint would fail every export.
    if let Some(e) = (endpoint.as_deref()).filter(|e| {
        e.get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
    }) {
        let k = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .into_iter()
        .find(|k| env.get(k).is_some())
        .unwrap_or("OTEL_EXPORTER_OTLP_ENDPOINT");
        return Err(format!(
            "{k}={}: https endpoints are not supported (traces are exported without TLS); \
             use http:// to a collector or sidecar on a trusted network",
            env.get(k).unwrap_or_else(|| e.to_owned())
        ));
    }
    Ok(Some(TracingSettings {
        service_name: env.string("TRACING_SERVICE_NAME", "RateLimit"),
        service_namespace: env.get("TRACING_SERVICE_NAMESPACE"),
        service_instance_id: env.get("TRACING_SERVICE_INSTANCE_ID"),
        sampling_rate,
        protocol,
        endpoint,
    }))
}

/// Settings of envoyproxy/ratelimit and GoCC that are set but change nothing here, each with
/// the reason.
pub(super) fn ignored(env: &Env<'_>) -> Vec<String> {
    let mut out = Vec::new();
    // The form of headers that are not sent: the partner setting is what turns them on.
    if env.get("TURNSTILE_RESPONSE_HEADERS").is_some()
        && !env
            .flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)
            .unwrap_or(false)
    {
        out.push(
            "TURNSTILE_RESPONSE_HEADERS does nothing without LIMIT_RESPONSE_HEADERS_ENABLED=true, \
             which turns the service-made headers on"
                .into(),
        );
    }
    if env.flag("DISABLE_STATS", false).unwrap_or(false) {
        out.push(
            "DISABLE_STATS=true turns the statsd push off; Prometheus series stay \
             (USE_PROMETHEUS=false turns them off)"
                .into(),
        );
    }
    if env
        .get("PROMETHEUS_MAPPER_YAML")
        .is_some_and(|p| !p.is_empty())
        && env
            .get("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")
            .is_some()
    {
        out.push(
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS is ignored: it changes the default \
             mapping only, and PROMETHEUS_MAPPER_YAML names a file of its own"
                .into(),
        );
    }
    let unused: [(&str, &str); 2] = [
        (
            "REDIS_CLUSTER_PIPELINE_PARALLELISM",
            "with Redis Cluster every command of a pipeline goes to its node at once",
        ),
        (
            "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
            "with Redis Cluster every command of a pipeline goes to its node at once",
        ),
    ];
    for (k, why) in unused.iter().chain(&super::gocc::GOCC_UNUSED) {
        if env.get(k).is_some() {
            out.push(format!("{k} is ignored: {why}"));
        }
    }
    out
}
