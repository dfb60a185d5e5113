//! Process settings: envoyproxy/ratelimit's environment variables, overridden by CLI flags.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use super::LoadOptions;

/// Header names for the RateLimit-* response headers (`LIMIT_RESPONSE_HEADERS_ENABLED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

/// Bounds on one request, so a hostile or broken client cannot make the service do unbounded work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_len: usize,
    pub max_value_len: usize,
    pub max_message_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 32,
            max_key_len: 256,
            max_value_len: 4096,
            max_message_bytes: 1 << 20,
        }
    }
}

/// `GRPC_SERVER_USE_TLS` and its files: TLS, and mTLS when a client CA is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `GRPC_SERVER_TLS_CERT`: PEM certificate chain.
    pub cert: PathBuf,
    /// `GRPC_SERVER_TLS_KEY`: PEM private key.
    pub key: PathBuf,
    /// `GRPC_CLIENT_TLS_CACERT`, or `GRPC_SERVER_TLS_CA_CERT` (the name Envoy Gateway sets):
    /// when present, clients must present a certificate signed by one of these CAs.
    pub client_ca: Option<PathBuf>,
    /// `GRPC_CLIENT_TLS_SAN`: a client certificate must also name this DNS name or IP.
    pub client_san: Option<String>,
}

/// `USE_PROMETHEUS`: a listener of its own serving the exposition at one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSettings {
    pub addr: SocketAddr,
    pub path: String,
}

/// `LOG_LEVEL` and `LOG_FORMAT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing` filter: a level (`debug`) or directives (`info,turnstile=debug`).
    pub level: String,
    pub json: bool,
}

/// `TRACING_*` and `OTEL_EXPORTER_OTLP_ENDPOINT`: OpenTelemetry spans over OTLP/gRPC.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    pub service_name: String,
    pub service_namespace: Option<String>,
    pub service_instance_id: Option<String>,
    /// Fraction of new traces sampled; a trace Envoy started keeps Envoy's decision.
    pub sampling_rate: f64,
    /// `TRACING_EXPORTER_PROTOCOL`: http (the default, as in envoyproxy/ratelimit) or grpc.
    pub protocol: OtlpProtocol,
    /// Where spans go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as given, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/traces` over HTTP, as the OTLP spec says).
    /// None: the exporter's default, localhost:4318 (HTTP) or localhost:4317 (gRPC).
    pub endpoint: Option<String>,
}

/// How OTLP spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies.
    Http,
    Grpc,
}

/// Everything the server needs besides the limits themselves.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config_path: PathBuf,
    /// Keys held in memory in all (`TURNSTILE_MAX_KEYS`); a key flood evicts past it.
    pub max_keys: usize,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: limits come over ADS, not from files.
    pub xds: Option<crate::config::xds::XdsSettings>,
    /// `TURNSTILE_RESP_ADDR`: the Redis-protocol THROTTLE transport (off when unset).
    pub resp: Option<crate::transport::resp::RespSettings>,
    /// `BACKEND_TYPE=redis`: counters shared by replicas in Redis; `None` keeps them in memory.
    pub redis: Option<crate::backend::redis::RedisSettings>,
    pub load: LoadOptions,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// Threads serving gRPC, each a current-thread runtime that also hosts shard actors.
    pub workers: usize,
    /// Shard actors; keys are spread over them by FNV-1a.
    pub shards: usize,
    /// Messages a shard may have waiting before callers are shed with RESOURCE_EXHAUSTED.
    pub shard_queue_capacity: usize,
    pub response_headers: Option<HeaderNames>,
    /// `SHADOW_MODE`: statuses are reported as they are, but the overall code is always OK.
    pub global_shadow_mode: bool,
    pub near_limit_ratio: f64,
    pub request_limits: RequestLimits,
    /// How long in-flight calls get to finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// Queued requests in the whole process, across all keys; more are refused at once.
    pub max_waiters: usize,
    /// At shutdown, queued requests are admitted (true) or refused (false, the default).
    pub admit_waiters_on_shutdown: bool,
    /// `RUNTIME_ROOT`, watched for a swapped symlink when `watch_root` is set.
    pub runtime_root: PathBuf,
    /// `RUNTIME_WATCH_ROOT` (default true): also reload when the root symlink points elsewhere.
    pub watch_root: bool,
    /// `TURNSTILE_RELOAD_INTERVAL_MS` (default 1000): how often the config location and the TLS
    /// files are compared with what was loaded. Zero turns polling off; SIGHUP still reloads.
    pub reload_interval: Duration,
    /// `DEBUG_HOST:DEBUG_PORT` (0.0.0.0:6070): `/rlconfig` and `/metrics`.
    pub debug_addr: Option<SocketAddr>,
    /// `USE_PROMETHEUS` (default true), `PROMETHEUS_ADDR` (:9090), `PROMETHEUS_PATH` (/metrics).
    pub prometheus: Option<PrometheusSettings>,
    /// `GRPC_UDS`: serve gRPC on this unix socket instead of `grpc_addr`.
    pub grpc_uds: Option<PathBuf>,
    pub tls: Option<TlsSettings>,
    pub log: LogSettings,
    /// `TRACING_ENABLED=true`.
    pub tracing: Option<TracingSettings>,
    /// `TURNSTILE_MAX_DETAILED_SERIES` (default 10000): per-value series that `detailed_metric`
    /// may create; values beyond it are counted together, so memory stays bounded.
    pub max_detailed_series: usize,
    /// `GRPC_MAX_CONNECTION_AGE` (24h): a gRPC connection older than this is sent a GOAWAY, so
    /// Envoy reconnects and load spreads over new replicas.
    pub grpc_max_connection_age: Duration,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE` (1h): then it is closed, calls in flight or not.
    pub grpc_max_connection_age_grace: Duration,
    /// envoyproxy/ratelimit settings that are set but have no effect here, with why; logged as
    /// warnings at start so a manifest's intent is never dropped silently.
    pub ignored: Vec<String>,
}

impl Settings {
    /// Reads envoyproxy/ratelimit's environment variables through `env` (a parameter so tests
    /// need not touch the process environment). Unset variables take the reference's defaults.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let get = |k: &str| env(k).filter(|v| !v.is_empty());
        let flag = |k: &str, default: bool| -> Result<bool, String> {
            match get(k) {
                None => Ok(default),
                Some(v) => parse_bool(&v).ok_or_else(|| format!("{k}={v} is not a boolean")),
            }
        };
        let num = |k: &str, default: u64| -> Result<u64, String> {
            match get(k) {
                None => Ok(default),
                Some(v) => v
                    .parse()
                    .map_err(|_| format!("{k}={v} is not a whole number")),
            }
        };
        let root = get("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into());
        let sub = get("RUNTIME_SUBDIRECTORY").unwrap_or_default();
        let app = get("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into());
        let runtime_root = PathBuf::from(&root);
        let mut config_path = PathBuf::from(root);
        if !sub.is_empty() {
            config_path.push(sub);
        }
        config_path.push(app);

        let port = |k: &str, default: u16| -> Result<u16, String> {
            let n = num(k, default.into())?;
            u16::try_from(n).map_err(|_| format!("{k}={n} is not a port"))
        };
        let http_addr = resolve(
            &get("HOST").unwrap_or_else(|| "0.0.0.0".into()),
            port("PORT", 8080)?,
        )?;
        let grpc_addr = resolve(
            &get("GRPC_HOST").unwrap_or_else(|| "0.0.0.0".into()),
            port("GRPC_PORT", 8081)?,
        )?;

        let response_headers = if flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            Some(HeaderNames {
                limit: get("LIMIT_LIMIT_HEADER").unwrap_or_else(|| "RateLimit-Limit".into()),
                remaining: get("LIMIT_REMAINING_HEADER")
                    .unwrap_or_else(|| "RateLimit-Remaining".into()),
                reset: get("LIMIT_RESET_HEADER").unwrap_or_else(|| "RateLimit-Reset".into()),
            })
        } else {
            None
        };
        let near_limit_ratio = match get("NEAR_LIMIT_RATIO") {
            None => 0.8,
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("NEAR_LIMIT_RATIO={v} is not a number from 0 to 1"))?,
        };
        let debug_addr = Some(resolve(
            &get("DEBUG_HOST").unwrap_or_else(|| "0.0.0.0".into()),
            port("DEBUG_PORT", 6070)?,
        )?);
        let prometheus = if flag("USE_PROMETHEUS", true)? {
            let addr = get("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
            let path = get("PROMETHEUS_PATH").unwrap_or_else(|| "/metrics".into());
            if !path.starts_with('/') {
                return Err(format!("PROMETHEUS_PATH={path} must start with /"));
            }
            Some(PrometheusSettings {
                addr: host_port(&addr).map_err(|e| format!("PROMETHEUS_ADDR={addr}: {e}"))?,
                path,
            })
        } else {
            None
        };
        let tls = if flag("GRPC_SERVER_USE_TLS", false)? {
            let file = |k: &str| {
                get(k)
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("GRPC_SERVER_USE_TLS=true needs {k}"))
            };
            Some(TlsSettings {
                cert: file("GRPC_SERVER_TLS_CERT")?,
                key: file("GRPC_SERVER_TLS_KEY")?,
                client_ca: get("GRPC_CLIENT_TLS_CACERT")
                    .or_else(|| get("GRPC_SERVER_TLS_CA_CERT"))
                    .map(PathBuf::from),
                client_san: get("GRPC_CLIENT_TLS_SAN"),
            })
        } else {
            None
        };
        let log = LogSettings {
            level: get("LOG_LEVEL").unwrap_or_else(|| "info".into()),
            // As in envoyproxy/ratelimit: json, or else text.
            json: get("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json")),
        };
        let tracing = if flag("TRACING_ENABLED", false)? {
            let rate = match get("TRACING_SAMPLING_RATE") {
                None => 1.0,
                Some(v) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("TRACING_SAMPLING_RATE={v} is not a number from 0 to 1")
                    })?,
            };
            let protocol = match get("TRACING_EXPORTER_PROTOCOL")
                .map(|p| p.to_ascii_lowercase())
                .as_deref()
            {
                None | Some("http") | Some("http/protobuf") => OtlpProtocol::Http,
                Some("grpc") => OtlpProtocol::Grpc,
                Some(p) => {
                    return Err(format!(
                        "TRACING_EXPORTER_PROTOCOL={p} must be http or grpc"
                    ))
                }
            };
            let endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
                get("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| match protocol {
                    OtlpProtocol::Http => format!("{}/v1/traces", e.trim_end_matches('/')),
                    OtlpProtocol::Grpc => e,
                })
            });
            Some(TracingSettings {
                service_name: get("TRACING_SERVICE_NAME").unwrap_or_else(|| "RateLimit".into()),
                service_namespace: get("TRACING_SERVICE_NAMESPACE"),
                service_instance_id: get("TRACING_SERVICE_INSTANCE_ID"),
                sampling_rate: rate,
                protocol,
                endpoint,
            })
        } else {
            None
        };
        let duration = |k: &str, default_secs: u64| -> Result<Duration, String> {
            match get(k) {
                None => Ok(Duration::from_secs(default_secs)),
                Some(v) => parse_go_duration(&v).map_err(|e| format!("{k}={v}: {e}")),
            }
        };
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        // One worker per core, less one left to the rest of the pod (Envoy, the kernel's network
        // stack, a load generator): a call whose key lives on another worker's shard pays two
        // cross-thread wake-ups. Measured on 2 cores (BENCHMARKS.md): one worker serves 104k
        // calls/s at 9.2 µs CPU each, two serve 63k at 17.7 µs.
        let workers = num("TURNSTILE_WORKERS", cores.saturating_sub(1).max(1) as u64)? as usize;
        let shards = num("TURNSTILE_SHARDS", workers.max(1) as u64)? as usize;
        let redis = crate::backend::redis::RedisSettings::from_env(&env)?;
        let xds = crate::config::xds::XdsSettings::from_env(&env)?;
        let resp = crate::transport::resp::RespSettings::from_env(&env)?;
        Ok(Settings {
            xds,
            resp,
            max_keys: num("TURNSTILE_MAX_KEYS", 4_000_000)?.max(1) as usize,
            redis,
            config_path,
            load: LoadOptions {
                merge_domains: flag("MERGE_DOMAIN_CONFIG", false)?,
                include_dotfiles: !flag("RUNTIME_IGNOREDOTFILES", true)?,
            },
            grpc_addr,
            http_addr,
            workers: workers.max(1),
            shards: shards.max(1),
            shard_queue_capacity: num("TURNSTILE_SHARD_QUEUE", 4096)?.max(1) as usize,
            response_headers,
            global_shadow_mode: flag("SHADOW_MODE", false)?,
            near_limit_ratio,
            request_limits: RequestLimits::default(),
            shutdown_grace: Duration::from_secs(num("TURNSTILE_SHUTDOWN_GRACE_SECONDS", 10)?),
            max_waiters: num("TURNSTILE_MAX_WAITERS", 10_000)? as usize,
            admit_waiters_on_shutdown: match get("TURNSTILE_SHUTDOWN_WAITERS").as_deref() {
                None | Some("reject") => false,
                Some("admit") => true,
                Some(v) => {
                    return Err(format!(
                        "TURNSTILE_SHUTDOWN_WAITERS={v} must be admit or reject"
                    ))
                }
            },
            runtime_root,
            watch_root: flag("RUNTIME_WATCH_ROOT", true)?,
            reload_interval: Duration::from_millis(num("TURNSTILE_RELOAD_INTERVAL_MS", 1000)?),
            debug_addr,
            prometheus,
            grpc_uds: get("GRPC_UDS").map(PathBuf::from),
            tls,
            log,
            tracing,
            max_detailed_series: num("TURNSTILE_MAX_DETAILED_SERIES", 10_000)? as usize,
            grpc_max_connection_age: duration("GRPC_MAX_CONNECTION_AGE", 24 * 3600)?,
            grpc_max_connection_age_grace: duration("GRPC_MAX_CONNECTION_AGE_GRACE", 3600)?,
            ignored: ignored(&get),
        })
    }

    /// Defaults with no environment at all: what tests and embedders start from.
    pub fn defaults() -> Settings {
        Settings::from_env(|_| None).expect("defaults are valid")
    }
}

/// `HOST`/`PORT` style pairs; accepts IPv4, IPv6 (`::`) and host names.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = h.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (h, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("host {host} has no address"))
}

/// Settings of envoyproxy/ratelimit that are set in `get` but change nothing here, each with
/// the reason.
fn ignored(get: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let truthy = |k: &str| get(k).and_then(|v| parse_bool(&v)).unwrap_or(false);
    let mut out = Vec::new();
    for k in ["USE_STATSD", "USE_DOG_STATSD"] {
        if truthy(k) {
            out.push(format!(
                "{k}=true: statsd is not offered; metrics are Prometheus (USE_PROMETHEUS)"
            ));
        }
    }
    let unused: [(&str, &str); 7] = [
        ("STATSD_HOST", "statsd is not offered"),
        ("STATSD_PORT", "statsd is not offered"),
        ("USE_DOG_STATSD_MOGRIFIERS", "statsd is not offered"),
        ("EXTRA_TAGS", "statsd is not offered"),
        (
            "STATS_FLUSH_INTERVAL",
            "Prometheus is scraped, nothing is flushed",
        ),
        (
            "PROMETHEUS_MAPPER_YAML",
            "metrics are native Prometheus series, no statsd mapping is applied",
        ),
        (
            "DISABLE_STATS",
            "stats are atomics that cost nothing to keep",
        ),
    ];
    for (k, why) in unused {
        if get(k).is_some() {
            out.push(format!("{k} is ignored: {why}"));
        }
    }
    out
}

/// Go's `time.ParseDuration` (`10s`, `1m30s`, `250ms`, `1.5h`), as envoyproxy/ratelimit's
/// settings (envconfig) read durations; used by every duration setting, xDS's included.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration \"{text}\" (expected e.g. 500ms, 10s, 1m30s)");
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Go-style `HOST:PORT` where the host may be empty (`:9090` listens on every interface).
pub fn host_port(text: &str) -> Result<SocketAddr, String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("address {text} needs a port (HOST:PORT)"))?;
    let port = port
        .parse()
        .map_err(|_| format!("address {text}: bad port"))?;
    resolve(if host.is_empty() { "0.0.0.0" } else { host }, port)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Some(true),
        "0" | "f" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}
