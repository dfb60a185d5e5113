//! Process settings: envoyproxy/ratelimit's environment variables, overridden by CLI flags,
//! for the Envoy and RLQS doors and the whole process; the other doors' in files of their names
//! (`gocc`, `throttle` with the RESP port, `xds`); Limitador's command line and environment, as
//! `limitador-server` reads them, mapped onto the same structs (`limitador`).
//!
//! The only module that reads the environment. Every value goes through one grammar (`env`):
//! Go's booleans and durations, whole numbers, `HOST:PORT` addresses; an error names the
//! variable and its value and stops the start. Each subsystem receives a plain typed struct
//! (`sections` fills the storage, Redis, admin, log and tracing ones).

mod env;
mod gocc;
pub mod limitador;
mod sections;
mod statsd;
mod throttle;
mod xds;

use crate::durable::StateSettings;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use env::{host_port, resolve, Env};

use crate::config::{LoadOptions, Sources};
use crate::hitters::{DEFAULT_SAMPLE, DEFAULT_TOP_N};
use crate::service::gocc::GoccDefaults;
use crate::service::{CountingRule, HeaderNames, RequestLimits, ThrottleLimits};
use crate::source::xds::XdsSettings;
use crate::store::redis::RedisSettings;
use crate::telemetry::client_values::DigestKey;
use crate::telemetry::mapped::Mapper;
use crate::telemetry::statsd::StatsdSettings;
use crate::telemetry::{LogSettings, TracingSettings};
use crate::transport::http::{AdminSettings, HttpBounds};
use crate::transport::throttle::RespSettings;

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

/// `USE_PROMETHEUS`: a listener of its own serving envoyproxy/ratelimit's series at one path.
#[derive(Debug, Clone)]
pub struct PrometheusSettings {
    pub addr: SocketAddr,
    pub path: String,
    /// `PROMETHEUS_MAPPER_YAML`, read at start; the reference's default mapping when unset.
    pub mapper: Mapper,
}

/// The gRPC and HTTP ports, as errors name them: with the settings that give them, those the
/// user wrote (`GRPC_HOST`, `GRPC_PORT` under `serve`; `--rls-port` as `limitador-server`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortNames {
    pub grpc: &'static str,
    pub http: &'static str,
}

impl Default for PortNames {
    fn default() -> PortNames {
        PortNames {
            grpc: "the gRPC port (GRPC_HOST, GRPC_PORT)",
            http: "the HTTP port (HOST, PORT)",
        }
    }
}

/// The variables that name the config location (`Settings::config_optional`).
const LOCATION_VARS: [&str; 3] = [
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
];

/// Everything the server needs besides the limits themselves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Invoked as `limitador-server`: Limitador's limits file and APIs (`limitador`).
    pub limitador: Option<limitador::LimitadorSettings>,
    pub config_path: PathBuf,
    /// No `RUNTIME_*` setting or `--config` named the location: a missing one is no YAML at
    /// all (a GoCC deployment has none), not an error.
    pub config_optional: bool,
    /// GoCC's `CONFIG_FILE`: its JSON key file, read and watched with the YAML.
    pub gocc_file: Option<PathBuf>,
    /// GoCC's `MAX_REQUESTS`, `MAX_REQUESTS_IN_QUEUE`, `WINDOW_MILLIS`,
    /// `REQUESTS_CAN_SET_RATE`, `REQUESTS_CAN_MOD_QUEUE`: the `/rate` API's defaults.
    pub gocc: GoccDefaults,
    /// Keys held in memory in all (`TURNSTILE_MAX_KEYS`); a key flood evicts past it.
    pub max_keys: usize,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: limits come over ADS, not from files.
    pub xds: Option<XdsSettings>,
    /// `TURNSTILE_RESP_ADDR`: the Redis-protocol THROTTLE transport (off when unset).
    pub resp: Option<RespSettings>,
    /// `TURNSTILE_ADMIN_ADDR`, `TURNSTILE_ADMIN_TOKEN_FILE`: the admin listener, looking limits
    /// up and resetting them (off when unset).
    pub admin: Option<AdminSettings>,
    /// `TURNSTILE_THROTTLE_*`: caps on what a `THROTTLE` caller may ask (HTTP and RESP).
    pub throttle: ThrottleLimits,
    /// `BACKEND_TYPE`: where the counters live.
    pub storage: Storage,
    pub load: LoadOptions,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The settings that give `grpc_addr` and `http_addr`, as a bind error names them.
    pub port_names: PortNames,
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
    /// What every HTTP port keeps: `TURNSTILE_HTTP_HEADER_TIMEOUT` (60s),
    /// `TURNSTILE_HTTP_BODY_TIMEOUT` (60s), `TURNSTILE_HTTP_IDLE_TIMEOUT` (120s), and a body of
    /// at most the request bound (`request_limits.max_message_bytes`).
    pub http_bounds: HttpBounds,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: which hits of a refused request are kept.
    pub counting_rule: CountingRule,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: health is SERVING only while a config with at
    /// least one domain is live (files; xDS reads it in its own settings too).
    pub healthy_only_with_config: bool,
    /// `QUOTA_MODE`: every limit is joint (`limiter::Role::Joint`).
    pub global_quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA`: answers carry envoyproxy/ratelimit's dynamic metadata.
    pub response_dynamic_metadata: bool,
    /// `TURNSTILE_REFUSED_BY_METADATA` (default false, so answers are the reference's): a
    /// refusal's dynamic metadata names the limit that refused.
    pub refused_by_metadata: bool,
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
    /// `USE_PROMETHEUS` (default true), `PROMETHEUS_ADDR` (:9090), `PROMETHEUS_PATH` (/metrics),
    /// `PROMETHEUS_MAPPER_YAML`: the listener of its own, serving the reference's series only.
    pub prometheus: Option<PrometheusSettings>,
    /// `USE_PROMETHEUS` (default true): the series at all; false takes `/metrics` off the HTTP
    /// and debug ports too.
    pub metrics: bool,
    /// `USE_STATSD` or `USE_DOG_STATSD`: the reference's stats pushed to statsd every
    /// `STATS_FLUSH_INTERVAL`, beside Prometheus.
    pub statsd: Option<StatsdSettings>,
    /// `GRPC_UDS`: serve gRPC on this unix socket instead of `grpc_addr`.
    pub grpc_uds: Option<PathBuf>,
    pub tls: Option<TlsSettings>,
    pub log: LogSettings,
    /// `TRACING_ENABLED=true`.
    pub tracing: Option<TracingSettings>,
    /// `TURNSTILE_MAX_DETAILED_SERIES` (default 10000): per-value series that `detailed_metric`
    /// may create; values beyond it are counted together, so memory stays bounded.
    pub max_detailed_series: usize,
    /// `TURNSTILE_TOP_N` (default 20, at most 1000, 0 turns it off): heavy hitters listed per
    /// limit by `/debug/top` and the status page; memory per limit grows with it.
    pub top_n: usize,
    /// `TURNSTILE_CLIENT_DIGEST_KEY`, `TURNSTILE_SHOW_CLIENT_VALUES`: how client values are
    /// shown on listeners without authentication.
    pub client_values: ClientValues,
    /// `TURNSTILE_TOP_SAMPLE` (default 8, 1 to 1024): admitted hits are counted into the
    /// heavy hitters one call in this many, at random, weighing as many; refusals all count.
    pub top_sample: u64,
    /// `GRPC_MAX_CONNECTION_AGE` (24h): a gRPC connection older than this is sent a GOAWAY, so
    /// Envoy reconnects and load spreads over new replicas.
    pub grpc_max_connection_age: Duration,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE` (1h): then it is closed, calls in flight or not.
    pub grpc_max_connection_age_grace: Duration,
    /// envoyproxy/ratelimit settings that are set but have no effect here, with why; logged as
    /// warnings at start so a manifest's intent is never dropped silently.
    pub ignored: Vec<String>,
}

/// The process's storage, where the counters live (`BACKEND_TYPE`, or Limitador's storage
/// subcommand): each its own variant and settings. A shard's side of it is `limiter`'s `Backing`.
#[derive(Debug, Clone)]
pub enum Storage {
    /// In this process's shards (the default).
    Memory,
    /// In this process's shards, written behind to a state dir and read back at the next start
    /// (`TURNSTILE_STATE_DIR`).
    Durable(StateSettings),
    /// Shared by replicas in Redis (`BACKEND_TYPE=redis`, or `REDIS_URL` alone).
    Redis(Box<RedisSettings>),
}

impl Storage {
    /// The Redis settings, when the counters live there.
    pub fn redis(&self) -> Option<&RedisSettings> {
        match self {
            Storage::Redis(r) => Some(r),
            Storage::Memory | Storage::Durable(_) => None,
        }
    }

    /// The storage's name, as the status page shows it.
    pub fn name(&self) -> &'static str {
        match self {
            Storage::Memory => "memory",
            Storage::Durable(_) => "memory, durable",
            Storage::Redis(_) => "redis",
        }
    }
}

/// CLI flags of `turnstile serve`; each replaces what the environment says.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub grpc_addr: Option<String>,
    pub http_addr: Option<String>,
    pub workers: Option<usize>,
    pub shards: Option<usize>,
    /// `--state-dir`, over `TURNSTILE_STATE_DIR`.
    pub state_dir: Option<PathBuf>,
    /// `turnstile check`: `config` is only read and listed, whatever `CONFIG_TYPE` says.
    pub checking: bool,
}

impl Overrides {
    /// `turnstile check`, with `--config` when given.
    pub fn check(config: Option<PathBuf>) -> Overrides {
        config.map(Overrides::config).unwrap_or_default()
    }

    /// Only the config location (`turnstile check --config`).
    pub fn config(path: PathBuf) -> Overrides {
        Overrides {
            config: Some(path),
            checking: true,
            ..Overrides::default()
        }
    }
}

impl Settings {
    /// Reads envoyproxy/ratelimit's environment variables through `lookup` (a parameter so
    /// tests need not touch the process environment). Unset variables take the reference's
    /// defaults.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let env = Env::new(&lookup);
        let root = env.string("RUNTIME_ROOT", "/srv/runtime_data/current");
        let mut config_path = PathBuf::from(&root);
        if let Some(sub) = env.get("RUNTIME_SUBDIRECTORY") {
            config_path.push(sub);
        }
        config_path.push(env.string("RUNTIME_APPDIRECTORY", "config"));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // One worker per core, less one left to the rest of the pod (Envoy, the kernel's network
        // stack, a load generator): a call whose key lives on another worker's shard pays two
        // cross-thread wake-ups. Measured on 2 cores (BENCHMARKS.md): one worker serves 104k
        // calls/s at 9.2 µs CPU each, two serve 63k at 17.7 µs.
        let workers = env.number("TURNSTILE_WORKERS", cores.saturating_sub(1).max(1))?;
        let shards = env.number("TURNSTILE_SHARDS", workers.max(1))?;
        let xds = xds::xds(&env)?;
        let (gocc, gocc_file) = gocc::gocc(&env, xds.is_some())?;
        let grace_secs = env.number("TURNSTILE_SHUTDOWN_GRACE_SECONDS", 10)?;
        Ok(Settings {
            limitador: None,
            config_optional: LOCATION_VARS.iter().all(|k| env.get(k).is_none()),
            gocc_file,
            gocc,
            xds,
            resp: throttle::resp(&env)?,
            admin: sections::admin(&env)?,
            throttle: throttle::throttle(&env)?,
            storage: sections::storage(&env)?,
            max_keys: env.number("TURNSTILE_MAX_KEYS", 4_000_000usize)?.max(1),
            config_path,
            load: LoadOptions {
                merge_domains: env.flag("MERGE_DOMAIN_CONFIG", false)?,
                include_dotfiles: !env.flag("RUNTIME_IGNOREDOTFILES", true)?,
            },
            grpc_addr: env.host_and_port("GRPC_HOST", "GRPC_PORT", 8081)?,
            http_addr: env.host_and_port("HOST", "PORT", 8080)?,
            port_names: PortNames::default(),
            workers: workers.max(1),
            shards: shards.max(1),
            shard_queue_capacity: env.number("TURNSTILE_SHARD_QUEUE", 4096usize)?.max(1),
            response_headers: response_headers(&env)?,
            global_shadow_mode: env.flag("SHADOW_MODE", false)?,
            near_limit_ratio: env.fraction("NEAR_LIMIT_RATIO", 0.8)?,
            request_limits: RequestLimits::default(),
            http_bounds: http_bounds(&env, RequestLimits::default().max_message_bytes)?,
            global_quota_mode: env.flag("QUOTA_MODE", false)?,
            healthy_only_with_config: env.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
            response_dynamic_metadata: env.flag("RESPONSE_DYNAMIC_METADATA", false)?,
            refused_by_metadata: env.flag("TURNSTILE_REFUSED_BY_METADATA", false)?,
            counting_rule: counting_rule(&env)?,
            shutdown_grace: Duration::from_secs(grace_secs),
            max_waiters: env.number("TURNSTILE_MAX_WAITERS", 10_000usize)?,
            admit_waiters_on_shutdown: env.choice(
                "TURNSTILE_SHUTDOWN_WAITERS",
                false,
                &[("reject", false), ("admit", true)],
            )?,
            runtime_root: PathBuf::from(root),
            watch_root: env.flag("RUNTIME_WATCH_ROOT", true)?,
            reload_interval: env.millis("TURNSTILE_RELOAD_INTERVAL_MS", 1000)?,
            debug_addr: Some(env.host_and_port("DEBUG_HOST", "DEBUG_PORT", 6070)?),
            prometheus: prometheus(&env)?,
            metrics: env.flag("USE_PROMETHEUS", true)?,
            statsd: statsd::statsd(&env)?,
            grpc_uds: env.get("GRPC_UDS").map(PathBuf::from),
            tls: tls(&env)?,
            log: sections::log(&env)?,
            tracing: sections::tracing(&env)?,
            max_detailed_series: env.number("TURNSTILE_MAX_DETAILED_SERIES", 10_000usize)?,
            top_n: env.number_in("TURNSTILE_TOP_N", DEFAULT_TOP_N as u64, 0, 1000)? as usize,
            top_sample: env.number_in("TURNSTILE_TOP_SAMPLE", DEFAULT_SAMPLE, 1, 1024)?,
            client_values: client_values(&env)?,
            grpc_max_connection_age: env
                .duration("GRPC_MAX_CONNECTION_AGE", Duration::from_secs(24 * 3600))?,
            grpc_max_connection_age_grace: env
                .duration("GRPC_MAX_CONNECTION_AGE_GRACE", Duration::from_secs(3600))?,
            ignored: sections::ignored(&env),
        })
    }

    /// Defaults with no environment at all: what tests and embedders start from.
    pub fn defaults() -> Settings {
        Settings::from_env(|_| None).expect("defaults are valid")
    }

    /// The process environment, then the CLI flags over it.
    pub fn from_process(flags: Overrides) -> Result<Settings, String> {
        Settings::from_process_over(flags, &BTreeMap::new())
    }

    /// The process environment with `over` standing for some variables (`None`: unset), then
    /// the CLI flags over it: how another command line (`limitador-server`) says what a
    /// variable would.
    fn from_process_over(
        flags: Overrides,
        over: &BTreeMap<&str, Option<String>>,
    ) -> Result<Settings, String> {
        // `--state-dir` stands for the variable, so both are checked alike.
        let state_dir = flags.state_dir.clone();
        let mut s = Settings::from_env(|k| match (k, &state_dir) {
            ("TURNSTILE_STATE_DIR", Some(d)) => Some(d.display().to_string()),
            _ => match over.get(k) {
                Some(v) => v.clone(),
                None => std::env::var(k).ok(),
            },
        })?;
        s.apply(flags)?;
        Ok(s)
    }

    /// Where the limits are read from when they come from files.
    pub fn sources(&self) -> Sources {
        Sources {
            path: self.config_path.clone(),
            optional: self.config_optional,
            gocc_file: self.gocc_file.clone(),
            opts: self.load,
            live: Default::default(),
        }
    }

    /// `LOG_LEVEL` and `LOG_FORMAT` alone, for reporting when the rest cannot be read: a bad
    /// `LOG_LEVEL` (perhaps what is being reported) counts as `info`.
    pub fn log_from_process() -> LogSettings {
        let lookup = |k: &str| std::env::var(k).ok();
        let env = Env::new(&lookup);
        sections::log(&env).unwrap_or(LogSettings {
            level: "info".into(),
            json: sections::log_json(&env),
        })
    }

    /// Applies CLI flags over what the environment said.
    pub fn apply(&mut self, flags: Overrides) -> Result<(), String> {
        if let Some(c) = flags.config {
            // Two sources named for one set of limits: neither silently wins.
            if self.xds.is_some() && !flags.checking {
                return Err(format!(
                    "--config {} and CONFIG_TYPE=GRPC_XDS_SOTW both say where the limits come \
                     from (a file, xDS): drop --config, or set CONFIG_TYPE=FILE",
                    c.display()
                ));
            }
            self.config_path = c;
            self.config_optional = false;
        }
        if let Some(g) = flags.grpc_addr {
            self.grpc_addr = host_port(&g).map_err(|e| format!("--grpc-addr {g}: {e}"))?;
        }
        if let Some(h) = flags.http_addr {
            self.http_addr = host_port(&h).map_err(|e| format!("--http-addr {h}: {e}"))?;
        }
        if let Some(w) = flags.workers {
            self.workers = w.max(1);
            if flags.shards.is_none() {
                self.shards = self.workers;
            }
        }
        if let Some(n) = flags.shards {
            self.shards = n.max(1);
        }
        Ok(())
    }
}

/// How client values leave the process (`telemetry::client_values` states the rule).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientValues {
    /// `TURNSTILE_CLIENT_DIGEST_KEY`: digests' key; random for the process when unset.
    pub digest_key: Option<DigestKey>,
    /// `TURNSTILE_SHOW_CLIENT_VALUES` (default false): clear values on every listener, where
    /// the operator holds the ports private.
    pub show_clear: bool,
}

fn client_values(env: &Env<'_>) -> Result<ClientValues, String> {
    const KEY: &str = "TURNSTILE_CLIENT_DIGEST_KEY";
    let digest_key = match env.get(KEY) {
        None => None,
        Some(k) => Some(DigestKey::new(&k).map_err(|e| format!("{KEY}: {e}"))?),
    };
    Ok(ClientValues {
        digest_key,
        show_clear: env.flag("TURNSTILE_SHOW_CLIENT_VALUES", false)?,
    })
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: unset, true or false are three behaviours.
fn counting_rule(env: &Env<'_>) -> Result<CountingRule, String> {
    const K: &str = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT";
    Ok(match env.get(K) {
        None => CountingRule::UsageInFull,
        Some(_) if env.flag(K, true)? => CountingRule::IfAdmitted,
        Some(_) => CountingRule::Always,
    })
}

fn response_headers(env: &Env<'_>) -> Result<Option<HeaderNames>, String> {
    let ietf = env.choice(
        "TURNSTILE_RESPONSE_HEADERS",
        false,
        &[("reference", false), ("ietf", true)],
    )?;
    if !env.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
        return Ok(None);
    }
    Ok(Some(HeaderNames {
        ietf,
        limit: env.string("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
        remaining: env.string("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
        reset: env.string("LIMIT_RESET_HEADER", "RateLimit-Reset"),
    }))
}

/// Every value set is checked, on or off: a mapping file that would stop the start once the
/// exposition is on stops it now.
fn prometheus(env: &Env<'_>) -> Result<Option<PrometheusSettings>, String> {
    let on = env.flag("USE_PROMETHEUS", true)?;
    let path = env.string("PROMETHEUS_PATH", "/metrics");
    if !path.starts_with('/') {
        return Err(format!("PROMETHEUS_PATH={path} must start with /"));
    }
    let addr = env.address("PROMETHEUS_ADDR", ":9090")?;
    // As the reference: the default mapping's response_time in milliseconds; a file of one's
    // own says its own units (`sections::ignored` says so when both are set).
    let millis = env.flag("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false)?;
    let mapper = match env.get("PROMETHEUS_MAPPER_YAML").filter(|p| !p.is_empty()) {
        Some(p) => Mapper::from_file(std::path::Path::new(&p))?,
        None => Mapper::default_mapping(millis),
    };
    Ok(on.then_some(PrometheusSettings { addr, path, mapper }))
}

fn tls(env: &Env<'_>) -> Result<Option<TlsSettings>, String> {
    if !env.flag("GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let file = |k: &str| {
        env.get(k)
            .map(PathBuf::from)
            .ok_or_else(|| format!("GRPC_SERVER_USE_TLS=true needs {k}"))
    };
    Ok(Some(TlsSettings {
        cert: file("GRPC_SERVER_TLS_CERT")?,
        key: file("GRPC_SERVER_TLS_KEY")?,
        client_ca: env
            .get("GRPC_CLIENT_TLS_CACERT")
            .or_else(|| env.get("GRPC_SERVER_TLS_CA_CERT"))
            .map(PathBuf::from),
        client_san: env.get("GRPC_CLIENT_TLS_SAN"),
    }))
}

#[cfg(test)]
mod tests;

/// The HTTP ports' read timeouts, each a Go duration above zero (a port without one can be
/// held by a client that never finishes its headers), and the body's bound.
fn http_bounds(env: &Env<'_>, max_body_bytes: usize) -> Result<HttpBounds, String> {
    let d = HttpBounds::default();
    let timeout = |k: &str, default: Duration| match env.duration(k, default)? {
        t if t.is_zero() => Err(format!(
            "{k}={}: must be more than 0 (a port must close a slow client)",
            env.get(k).unwrap_or_default()
        )),
        t => Ok(t),
    };
    Ok(HttpBounds {
        headers: timeout("TURNSTILE_HTTP_HEADER_TIMEOUT", d.headers)?,
        body: timeout("TURNSTILE_HTTP_BODY_TIMEOUT", d.body)?,
        idle: timeout("TURNSTILE_HTTP_IDLE_TIMEOUT", d.idle)?,
        max_body_bytes,
    })
}
