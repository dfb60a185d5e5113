//! docs/settings.md: "anything else stops the start with an error naming the variable and its
//! value". Every setting its table names, given a bad value, is refused by the binary (exit 1,
//! the name on stderr), whatever the storage and whether its feature is on: a typo must not
//! wait for the day the storage changes. A setting the table gains must be added here.

use crate::common::run::*;
use crate::common::tempdir::TempDir;

/// A bad value for each setting that has one (families given by a `*` in the table are
/// covered by their members here).
const BAD: &[(&str, &str)] = &[
    ("RUNTIME_IGNOREDOTFILES", "maybe"),
    ("RUNTIME_WATCH_ROOT", "maybe"),
    ("PORT", "http"),
    ("GRPC_PORT", "grpc"),
    ("DEBUG_PORT", "65536"),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", "maybe"),
    ("SHADOW_MODE", "yes"),
    ("NEAR_LIMIT_RATIO", "1.5"),
    ("MERGE_DOMAIN_CONFIG", "maybe"),
    ("LOG_LEVEL", "bogus"),
    ("USE_PROMETHEUS", "maybe"),
    ("PROMETHEUS_ADDR", "9090"),
    ("PROMETHEUS_PATH", "metrics"),
    (
        "PROMETHEUS_MAPPER_YAML",
        "/nonexistent/statsd-exporter.yaml",
    ),
    ("USE_STATSD", "maybe"),
    ("STATSD_PORT", "abc"),
    ("STATSD_PROTOCOL", "sctp"),
    ("USE_DOG_STATSD", "maybe"),
    ("USE_DOG_STATSD_MOGRIFIERS", "A"),
    ("EXTRA_TAGS", "novalue"),
    ("STATS_FLUSH_INTERVAL", "10"),
    ("DISABLE_STATS", "maybe"),
    ("GRPC_MAX_CONNECTION_AGE", "1d"),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", "abc"),
    ("GRPC_SERVER_USE_TLS", "maybe"),
    ("TRACING_ENABLED", "maybe"),
    ("TRACING_SAMPLING_RATE", "2"),
    ("TRACING_EXPORTER_PROTOCOL", "pigeon"),
    ("TURNSTILE_RELOAD_INTERVAL_MS", "1s"),
    ("TURNSTILE_HTTP_HEADER_TIMEOUT", "0s"),
    ("TURNSTILE_HTTP_BODY_TIMEOUT", "ten"),
    ("TURNSTILE_HTTP_IDLE_TIMEOUT", "-1s"),
    ("TURNSTILE_MAX_DETAILED_SERIES", "many"),
    ("TURNSTILE_TOP_N", "1001"),
    ("TURNSTILE_TOP_SAMPLE", "0"),
    ("BACKEND_TYPE", "postgres"),
    ("REDIS_SOCKET_TYPE", "udp"),
    ("REDIS_TYPE", "bogus"),
    ("REDIS_TLS", "maybe"),
    ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
    ("REDIS_TLS_CLIENT_KEY", "/k.pem"),
    ("REDIS_POOL_SIZE", "abc"),
    ("REDIS_PERSECOND", "maybe"),
    ("REDIS_PERSECOND_POOL_SIZE", "abc"),
    ("REDIS_PERSECOND_TYPE", "bogus"),
    ("REDIS_PERSECOND_SOCKET_TYPE", "udp"),
    ("REDIS_PERSECOND_TLS", "maybe"),
    ("REDIS_STARTUP_INITIAL_INTERVAL", "0"),
    ("REDIS_STARTUP_MAX_INTERVAL", "abc"),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", "forever"),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", "abc"),
    ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "-1"),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "maybe"),
    ("EXPIRATION_JITTER_MAX_SECONDS", "abc"),
    ("LOCAL_CACHE_SIZE_IN_BYTES", "1MiB"),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "maybe"),
    ("TURNSTILE_REDIS_DEADLINE_MS", "abc"),
    ("TURNSTILE_REDIS_BREAKER_FAILURES", "abc"),
    ("TURNSTILE_REDIS_SLOW_MS", "abc"),
    ("TURNSTILE_REDIS_COOLDOWN_MS", "abc"),
    ("TURNSTILE_REDIS_FAILURE_MODE", "bogus"),
    ("TURNSTILE_LOCAL_FIRST", "maybe"),
    ("TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL", "2m"),
    ("TURNSTILE_WORKERS", "abc"),
    ("TURNSTILE_SHARDS", "abc"),
    ("TURNSTILE_SHARD_QUEUE", "abc"),
    ("TURNSTILE_MAX_WAITERS", "abc"),
    ("TURNSTILE_SHUTDOWN_WAITERS", "bogus"),
    ("TURNSTILE_SHUTDOWN_GRACE_SECONDS", "10s"),
    ("TURNSTILE_MAX_KEYS", "abc"),
    ("TURNSTILE_STATE_SYNC_INTERVAL", "0"),
    ("CONFIG_TYPE", "bogus"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "maybe"),
    ("CONFIG_GRPC_XDS_NODE_METADATA", "novalue"),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "maybe"),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "0"),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "abc"),
    ("XDS_CLIENT_BACKOFF_JITTER", "maybe"),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "abc"),
    // Without CONFIG_TYPE=GRPC_XDS_SOTW: nothing is pushed for it to apply to.
    ("TURNSTILE_XDS_OVERLAY", "/etc/turnstile/overlay"),
    ("TURNSTILE_RESP_ADDR", "nowhere"),
    ("TURNSTILE_RESP_ALLOW_REMOTE", "maybe"),
    ("TURNSTILE_RESP_MAX_CONNECTIONS", "0"),
    ("TURNSTILE_RESP_IDLE_TIMEOUT_SECS", "0"),
    ("TURNSTILE_THROTTLE_ALLOW_REMOTE", "maybe"),
    ("TURNSTILE_THROTTLE_MAX_BURST", "0"),
    ("TURNSTILE_THROTTLE_MAX_PERIOD_SECS", "0"),
    ("TURNSTILE_THROTTLE_MAX_COUNT", "0"),
    ("TURNSTILE_THROTTLE_MAX_KEY_LEN", "0"),
    ("TURNSTILE_ADMIN_ADDR", "nowhere"),
    ("TURNSTILE_ADMIN_TOKEN_FILE", "/nonexistent/token"),
    ("RESPONSE_DYNAMIC_METADATA", "maybe"),
    ("QUOTA_MODE", "maybe"),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "maybe"),
    ("MAX_REQUESTS", "0"),
    ("MAX_REQUESTS_IN_QUEUE", "abc"),
    ("WINDOW_MILLIS", "5"),
    ("REQUESTS_CAN_SET_RATE", "maybe"),
    ("REQUESTS_CAN_MOD_QUEUE", "maybe"),
    ("TURNSTILE_CLIENT_DIGEST_KEY", "short"),
    ("TURNSTILE_REFUSED_BY_METADATA", "maybe"),
    ("TURNSTILE_RESPONSE_HEADERS", "draft"),
    ("TURNSTILE_SHOW_CLIENT_VALUES", "maybe"),
];

/// Settings whose every value is one the table allows, with why.
const ANY_VALUE: &[(&str, &str)] = &[
    (
        "TURNSTILE_STATE_DIR",
        "a path; one that cannot be used stops `serve` (durable::faults)",
    ),
    ("serve --state-dir", "the flag for TURNSTILE_STATE_DIR"),
    ("RUNTIME_ROOT", "a path"),
    ("RUNTIME_SUBDIRECTORY", "a path"),
    ("RUNTIME_APPDIRECTORY", "a path"),
    (
        "HOST",
        "a host name, resolved (a bad one needs DNS to be refused)",
    ),
    (
        "GRPC_HOST",
        "a host name, resolved (a bad one needs DNS to be refused)",
    ),
    (
        "DEBUG_HOST",
        "a host name, resolved (a bad one needs DNS to be refused)",
    ),
    ("LIMIT_LIMIT_HEADER", "a header name"),
    ("LIMIT_REMAINING_HEADER", "a header name"),
    ("LIMIT_RESET_HEADER", "a header name"),
    ("LOG_FORMAT", "json, anything else is text"),
    ("STATSD_HOST", "resolved at each connection"),
    ("GRPC_UDS", "a path"),
    (
        "GRPC_SERVER_TLS_CERT",
        "a path, read with GRPC_SERVER_USE_TLS",
    ),
    (
        "GRPC_SERVER_TLS_KEY",
        "a path, read with GRPC_SERVER_USE_TLS",
    ),
    (
        "GRPC_CLIENT_TLS_CACERT",
        "a path, read with GRPC_SERVER_USE_TLS",
    ),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "a path, read with GRPC_SERVER_USE_TLS",
    ),
    ("GRPC_CLIENT_TLS_SAN", "a name"),
    ("TRACING_SERVICE_NAME", "a name"),
    ("TRACING_SERVICE_NAMESPACE", "a name"),
    ("TRACING_SERVICE_INSTANCE_ID", "a name"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "read by the exporter"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "read by the exporter"),
    ("REDIS_URL", "an address, dialled at start"),
    ("REDIS_AUTH", "a password"),
    ("REDIS_TLS_CACERT", "a path"),
    ("CACHE_KEY_PREFIX", "a prefix"),
    ("REDIS_PIPELINE_WINDOW", "not needed"),
    ("REDIS_PIPELINE_LIMIT", "not needed"),
    ("REDIS_TIMEOUT", "replaced"),
    ("REDIS_PERSECOND_TIMEOUT", "replaced"),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "not honoured"),
    ("REDIS_SENTINEL_AUTH", "a password"),
    ("REDIS_PERSECOND_SENTINEL_AUTH", "a password"),
    ("REDIS_PERSECOND_URL", "an address, dialled at start"),
    ("REDIS_PERSECOND_AUTH", "a password"),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", "not needed"),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", "not needed"),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "not honoured"),
    (
        "CONFIG_GRPC_XDS_SERVER_URL",
        "an address, dialled with CONFIG_TYPE",
    ),
    ("CONFIG_GRPC_XDS_NODE_ID", "a name"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "a path, read with TLS"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "a name"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "a path, read with TLS"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "a path, read with TLS"),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "not honoured",
    ),
    ("MEMCACHE_HOST_PORT", "not offered"),
    ("MEMCACHE_MAX_IDLE_CONNS", "not offered"),
    ("MEMCACHE_SRV", "not offered"),
    ("MEMCACHE_SRV_REFRESH", "not offered"),
    ("MEMCACHE_TLS", "not offered"),
    ("MEMCACHE_TLS_CACERT", "not offered"),
    ("MEMCACHE_TLS_CLIENT_CERT", "not offered"),
    ("MEMCACHE_TLS_CLIENT_KEY", "not offered"),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "not offered"),
    ("REDIS_USE_EXPLICIT_PIPELINE", "not honoured"),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "not honoured"),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "not honoured"),
    (
        "CONFIG_FILE",
        "a path, read as config (a bad file stops the start with exit 2)",
    ),
];

/// The settings docs/settings.md's table names: the backquoted names of each row's first
/// cell. Families (`*`, `<NAME>`) and suffixes (`_SLOW_MS` after `TURNSTILE_REDIS_DEADLINE_MS`)
/// are left out: their members are listed in `BAD`.
fn documented() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs/settings.md")).unwrap();
    let mut out = Vec::new();
    for row in text.lines().filter(|l| l.starts_with("| `")) {
        let first = row[1..].split(" | ").next().unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            if !name.contains(['*', '<']) && !name.starts_with('_') {
                out.push(name.to_owned());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn every_documented_setting_is_covered_here() {
    let names = documented();
    assert!(names.len() > 80, "read too few settings: {names:?}");
    let missing: Vec<&String> = (names.iter())
        .filter(|n| !BAD.iter().chain(ANY_VALUE).any(|(k, _)| k == n))
        .collect();
    assert!(
        missing.is_empty(),
        "documented, not in BAD or ANY_VALUE: {missing:?}"
    );
}

/// Each bad value alone, memory storage, config from files: `turnstile check` reads the
/// settings as `serve` does and exits 1 on a bad one, naming it and echoing the value as it was
/// written (`TURNSTILE_STATE_SYNC_INTERVAL=0`, not the `0ns` it parsed to).
#[test]
fn every_bad_value_stops_the_start_naming_the_setting() {
    let dir = TempDir::new("settings");
    let config = config_dir(dir.path(), SIMPLE);
    let config = config.to_str().unwrap();
    let mut accepted = Vec::new();
    for (k, v) in BAD {
        let out = run(&["check", "--config", config], &[(k, v)]);
        // A secret is named, never echoed.
        let echoed = *k == "TURNSTILE_CLIENT_DIGEST_KEY" || echoes(&out.stderr, k, v);
        if out.code != Some(1) || !echoed {
            accepted.push(format!(
                "{k}={v}: exit {:?}: {}",
                out.code,
                out.stderr.trim()
            ));
        }
    }
    assert!(
        accepted.is_empty(),
        "not refused with the name on stderr:\n{}",
        accepted.join("\n")
    );
}

/// Whether `text` names `k` with `v` as written: `k=v` or `k (v)`, the value whole (`=0` is
/// not `=0ns`).
fn echoes(text: &str, k: &str, v: &str) -> bool {
    [format!("{k}={v}"), format!("{k} ({v})")]
        .iter()
        .any(|named| {
            text.match_indices(named.as_str()).any(|(at, _)| {
                let next = text[at + named.len()..].chars().next();
                next.is_none_or(|c| !c.is_alphanumeric() && c != '.' && c != '_')
            })
        })
}
