//! Limitador's command line, as limitador-operator starts `limitador-server`:
//! `limitador-server [OPTIONS] <LIMITS_FILE> [STORAGE]`, each flag with the environment
//! variable Limitador reads for it (a flag beats its variable). What it says is mapped onto
//! turnstile's settings, which still apply beside it; a flag or storage turnstile cannot honour
//! is refused at start, naming it, and one whose purpose it serves its own way (`--batch-size`,
//! `--optimize disk`, a flush period past its range) is taken with a warning: none is dropped
//! without a word.

mod redis;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use super::{Env, Overrides, PortNames, Settings, Storage};
use crate::config::grammar::parse_duration;
use crate::config::limitador::LabelsExpr;
use crate::service::limitador::ReservationSettings;
use crate::telemetry::{OtlpProtocol, TracingSettings};

/// What serving as Limitador needs beyond turnstile's settings.
#[derive(Debug, Clone)]
pub struct LimitadorSettings {
    /// `LIMITS_FILE`.
    pub limits_file: PathBuf,
    /// `--rate-limit-headers DRAFT_VERSION_03`.
    pub draft_03_headers: bool,
    /// `--limit-name-in-labels`.
    pub limit_name_in_labels: bool,
    /// `--metric-labels-default`, as written (checked to compile at start).
    pub metric_labels_default: Option<String>,
    /// `-L/--custom-metric-labels`: the file, read at start and when it changes.
    pub custom_metric_labels: Option<PathBuf>,
    /// `--validate`: read the limits file, say whether it is valid, and exit.
    pub validate: bool,
    /// `--disable-reservations`, `--max-reservation-fraction`, `--max-reservation-ttl`.
    pub reservations: ReservationSettings,
}

#[derive(Parser, Debug)]
#[command(
    name = "limitador-server",
    version,
    about = "turnstile, invoked as Limitador's limitador-server: serves Limitador's limits file and APIs"
)]
pub struct LimitadorArgs {
    /// The limits file (a YAML list of limits)
    #[arg(value_name = "LIMITS_FILE", env = "LIMITS_FILE")]
    limits_file: PathBuf,
    /// Host to bind the RLS (gRPC) port to
    #[arg(
        short = 'b',
        long = "rls-ip",
        env = "ENVOY_RLS_HOST",
        default_value = "0.0.0.0"
    )]
    rls_ip: String,
    /// Port of the RLS (gRPC) server
    #[arg(
        short = 'p',
        long = "rls-port",
        env = "ENVOY_RLS_PORT",
        default_value_t = 8081
    )]
    rls_port: u16,
    /// Host to bind the HTTP port to
    #[arg(
        short = 'B',
        long = "http-ip",
        env = "HTTP_API_HOST",
        default_value = "0.0.0.0"
    )]
    http_ip: String,
    /// Port of the HTTP server
    #[arg(
        short = 'P',
        long = "http-port",
        env = "HTTP_API_PORT",
        default_value_t = 8080
    )]
    http_port: u16,
    /// Include the limit's name as a `limit_name` label of `limited_calls` (or
    /// LIMIT_NAME_IN_PROMETHEUS_LABELS=1)
    #[arg(short = 'l', long = "limit-name-in-labels")]
    limit_name_in_labels: bool,
    /// A YAML file of metric labels (label: CEL expression)
    #[arg(short = 'L', long = "custom-metric-labels", value_name = "FILE")]
    custom_metric_labels: Option<PathBuf>,
    /// A CEL expression giving a map of labels for every call's metrics
    #[arg(long = "metric-labels-default", value_name = "CEL")]
    metric_labels_default: Option<String>,
    /// OpenTelemetry tracing endpoint
    #[arg(
        long = "tracing-endpoint",
        env = "TRACING_ENDPOINT",
        value_name = "URL"
    )]
    tracing_endpoint: Option<String>,
    /// More logs: -v info, -vv debug, -vvv and -vvvv trace
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// Logs as JSON, one object a line
    #[arg(long = "structured-logs")]
    structured_logs: bool,
    /// Read the limits file, say whether it is valid, and exit
    #[arg(long)]
    validate: bool,
    /// Rate-limit headers in answers
    #[arg(
        short = 'H',
        long = "rate-limit-headers",
        env = "RATE_LIMIT_HEADERS",
        default_value = "NONE",
        value_parser = ["NONE", "DRAFT_VERSION_03"]
    )]
    rate_limit_headers: String,
    /// Serve gRPC reflection (turnstile always does)
    #[arg(long = "grpc-reflection-service")]
    grpc_reflection_service: bool,
    /// Answer Reserve UNIMPLEMENTED (Commit stays a plain report)
    #[arg(long = "disable-reservations")]
    disable_reservations: bool,
    /// The most one reservation may hold of a counter's max_value, from 0 to 1
    #[arg(long = "max-reservation-fraction", value_name = "FRACTION", default_value = "0.5", value_parser = parse_fraction)]
    max_reservation_fraction: f64,
    /// The longest a reservation holds: seconds, or a duration such as 90s or 2m
    #[arg(long = "max-reservation-ttl", value_name = "SECONDS", default_value = "60", value_parser = parse_ttl)]
    max_reservation_ttl: Duration,
    #[command(subcommand)]
    storage: Option<StorageCommand>,
}

#[derive(Subcommand, Debug)]
enum StorageCommand {
    /// Counters in memory (the default)
    Memory {
        /// Qualified counters kept (turnstile: TURNSTILE_MAX_KEYS)
        #[arg(short = 'c', long = "cache", value_name = "CACHE_SIZE")]
        cache: Option<u64>,
    },
    /// Counters kept on disk in PATH (turnstile's durable counters)
    Disk {
        /// Limitador's RocksDB tuning: `disk` changes nothing here (one layout), said at start
        #[arg(
            long = "optimize",
            env = "DISK_OPTIMIZE",
            default_value = "throughput",
            value_parser = ["throughput", "disk"]
        )]
        optimize: String,
        /// Path to the counters' directory
        #[arg(value_name = "PATH", env = "DISK_PATH")]
        path: PathBuf,
    },
    /// Counters in Redis, exact
    Redis {
        /// Redis URL to use
        #[arg(value_name = "URL", env = "REDIS_URL")]
        url: String,
    },
    /// Counters in Redis, decided locally first
    #[command(name = "redis_cached")]
    RedisCached {
        /// Redis URL to use
        #[arg(value_name = "URL", env = "REDIS_URL")]
        url: String,
        /// Flushing period for counters in milliseconds (turnstile's sync interval)
        #[arg(long = "flush-period", env = "REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS")]
        flush_period: Option<i64>,
        /// Maximum amount of counters cached (turnstile: TURNSTILE_MAX_KEYS)
        #[arg(long = "max-cached")]
        max_cached: Option<u64>,
        /// Timeout for Redis commands in milliseconds (turnstile: TURNSTILE_REDIS_DEADLINE_MS)
        #[arg(long = "response-timeout")]
        response_timeout: Option<u64>,
        /// Size of entries to flush in as single flush (changes nothing: turnstile flushes them all)
        #[arg(long = "batch-size", env = "REDIS_LOCAL_CACHE_BATCH_SIZE")]
        batch_size: Option<u64>,
    },
    /// Limitador's CRDT replication between replicas
    Distributed {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `--tracing-endpoint URL`: spans over OTLP/gRPC to `URL` (`scheme://host:port`; Limitador's
/// `rpc://` is plain `http://`). With `TRACING_ENABLED` set too, its other settings apply; else
/// the spans are service `limitador`'s, every trace sampled, as Limitador sends them.
fn tracing_to(endpoint: &str, set: Option<TracingSettings>) -> Result<TracingSettings, String> {
    let (scheme, rest) = endpoint
        .split_once("://")
        .ok_or_else(|| format!("--tracing-endpoint {endpoint:?}: expected scheme://host:port"))?;
    if !matches!(scheme, "rpc" | "http" | "grpc") {
        return Err(format!(
            "--tracing-endpoint {endpoint:?}: the exporter has no TLS; use rpc:// or http://"
        ));
    }
    let mut t = set.unwrap_or(TracingSettings {
        service_name: "limitador".into(),
        service_namespace: None,
        service_instance_id: None,
        sampling_rate: 1.0,
        protocol: OtlpProtocol::Grpc,
        endpoint: None,
    });
    t.protocol = OtlpProtocol::Grpc;
    t.endpoint = Some(format!("http://{rest}"));
    Ok(t)
}

impl LimitadorArgs {
    /// The variables the storage stands for (`redis`), checked against the environment. Without
    /// a storage, Limitador's `REDIS_URL` gives Redis (`REDIS_LOCAL_CACHE_ENABLED=1`: cached);
    /// `REDIS_URL` is always Limitador's here (a URL), never turnstile's `host:port`.
    fn storage_vars(&self, warnings: &mut Vec<String>) -> Result<redis::Vars, String> {
        let lookup = |k: &str| std::env::var(k).ok();
        let env = Env::new(&lookup);
        let (what, vars) = match &self.storage {
            Some(StorageCommand::Redis { url }) => ("redis", redis::exact(url, &env)?),
            Some(StorageCommand::RedisCached {
                url,
                flush_period,
                max_cached,
                response_timeout,
                batch_size,
            }) => {
                let flags = redis::Cached {
                    flush_period: *flush_period,
                    max_cached: *max_cached,
                    response_timeout: *response_timeout,
                    batch_size: *batch_size,
                };
                ("redis_cached", redis::cached(url, &flags, &env, warnings)?)
            }
            None => match env.get("REDIS_URL") {
                Some(url) if switch(&env, CACHE_ENABLED) => {
                    let number = |k: &str| {
                        (env.get(k).map(|v| v.parse()))
                            .transpose()
                            .map_err(|e| format!("limitador-server: {k}: {e}"))
                    };
                    let flags = redis::Cached {
                        flush_period: number("REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS")?,
                        batch_size: number("REDIS_LOCAL_CACHE_BATCH_SIZE")?.map(|n: i64| n as u64),
                        ..redis::Cached::default()
                    };
                    ("redis_cached", redis::cached(&url, &flags, &env, warnings)?)
                }
                Some(url) => ("redis", redis::exact(&url, &env)?),
                None => ("memory", memory_vars()),
            },
            Some(StorageCommand::Memory { .. }) => ("memory", memory_vars()),
            Some(StorageCommand::Disk { .. }) | Some(StorageCommand::Distributed { .. }) => {
                ("disk", memory_vars())
            }
        };
        redis::agree(&vars, &env, what)?;
        Ok(vars)
    }

    /// This process's arguments, as Limitador reads them.
    pub fn from_process() -> LimitadorArgs {
        LimitadorArgs::parse()
    }

    /// Turnstile's settings from the environment, with what this command line says over them.
    pub fn settings(self) -> Result<Settings, String> {
        let refused = |what: &str| {
            Err(format!(
                "limitador-server: {what} is not supported by turnstile"
            ))
        };
        let mut state_dir = None;
        if let Some(StorageCommand::Disk { path, .. }) = &self.storage {
            state_dir = Some(path.clone());
        }
        let disk = state_dir.is_some();
        let optimize_disk = matches!(
            &self.storage,
            Some(StorageCommand::Disk { optimize, .. }) if optimize == "disk"
        );
        if let Some(StorageCommand::Distributed { .. }) = &self.storage {
            return refused("the storage `distributed` (Limitador's CRDT replication)");
        }
        // `--validate` reads the limits file alone, as Limitador's does before its storage.
        let mut warnings = Vec::new();
        let vars = match self.validate {
            true => memory_vars(),
            false => self.storage_vars(&mut warnings)?,
        };
        if let Some(text) = &self.metric_labels_default {
            LabelsExpr::parse(text).map_err(|e| format!("--metric-labels-default: {e}"))?;
        }
        let flags = Overrides {
            grpc_addr: Some(format!("{}:{}", self.rls_ip, self.rls_port)),
            http_addr: Some(format!("{}:{}", self.http_ip, self.http_port)),
            state_dir,
            ..Overrides::default()
        };
        let mut s = Settings::from_process_over(flags, &vars)?;
        refuse_other_sources(&self.limits_file, |k| std::env::var(k).ok())?;
        let lookup = |k: &str| std::env::var(k).ok();
        let env = Env::new(&lookup);
        s.ignored.extend(warnings);
        s.ignored.extend(misread_switches(&env));
        if optimize_disk {
            s.ignored.push(OPTIMIZE_DISK.into());
        }
        name_what_the_user_wrote(&mut s, disk, &vars, &env);
        if let Some(level) = log_level(self.verbose, &env) {
            s.log.level = level.into();
        }
        s.log.json |= self.structured_logs;
        if let Some(endpoint) = self.tracing_endpoint.as_deref().filter(|e| !e.is_empty()) {
            s.tracing = Some(tracing_to(endpoint, s.tracing.take())?);
        }
        if let Some(StorageCommand::Memory { cache: Some(n) }) = self.storage {
            s.max_keys = usize::try_from(n).unwrap_or(usize::MAX).max(1);
        }
        s.limitador = Some(LimitadorSettings {
            limits_file: self.limits_file,
            draft_03_headers: self.rate_limit_headers == "DRAFT_VERSION_03",
            limit_name_in_labels: self.limit_name_in_labels || switch(&env, NAME_IN_LABELS),
            metric_labels_default: self.metric_labels_default,
            custom_metric_labels: self.custom_metric_labels,
            validate: self.validate,
            reservations: ReservationSettings {
                enabled: !self.disable_reservations,
                max_fraction: self.max_reservation_fraction,
                max_ttl: self.max_reservation_ttl,
            },
        });
        Ok(s)
    }
}

/// The settings that say where Envoy's door reads its limits from: none applies to
/// `limitador-server`, which serves its limits file, so one set stops the start naming it (it
/// would otherwise be half applied: xDS subscribed to, its limits shown, none enforced).
const OTHER_SOURCES: [&str; 6] = [
    "CONFIG_TYPE",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "CONFIG_FILE",
    "TURNSTILE_XDS_OVERLAY",
];

/// Refuses a setting of [`OTHER_SOURCES`] (`CONFIG_TYPE=FILE`, the default, aside).
fn refuse_other_sources(
    limits_file: &std::path::Path,
    var: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    for k in OTHER_SOURCES {
        let Some(v) = var(k).filter(|v| !v.is_empty()) else {
            continue;
        };
        if k == "CONFIG_TYPE" && v.eq_ignore_ascii_case("FILE") {
            continue;
        }
        return Err(format!(
            "limitador-server: {k}={v} does not apply: limitador-server serves the limits of \
             {} alone; unset {k}",
            limits_file.display()
        ));
    }
    Ok(())
}

/// Errors name the settings a `limitador-server` user writes, not those they stand for: the
/// ports' flags and variables, `disk PATH`, the Redis URL's password.
fn name_what_the_user_wrote(s: &mut Settings, disk: bool, vars: &redis::Vars, env: &Env<'_>) {
    s.port_names = PortNames {
        grpc: "the RLS port (-b/--rls-ip, -p/--rls-port; ENVOY_RLS_HOST, ENVOY_RLS_PORT)",
        http: "the HTTP port (-B/--http-ip, -P/--http-port; HTTP_API_HOST, HTTP_API_PORT)",
    };
    match &mut s.storage {
        Storage::Durable(state) if disk => {
            state.named = "the storage `disk PATH`";
        }
        // A password beside a URL without one is the environment's REDIS_AUTH.
        Storage::Redis(r) if vars.contains_key("REDIS_AUTH") || env.get("REDIS_AUTH").is_none() => {
            r.main.auth_named = "the password in the Redis URL";
        }
        _ => {}
    }
}

/// `disk --optimize disk` (`DISK_OPTIMIZE=disk`) tunes Limitador's RocksDB for space.
const OPTIMIZE_DISK: &str = "--optimize disk (DISK_OPTIMIZE) changes nothing in turnstile: its \
     state dir has one layout, a snapshot of the counters and a log of what changed since, \
     written anew as a snapshot whenever the log outgrows it, so the disk used stays about \
     twice the counters' size";

/// The log level as Limitador sets it (`configure_tracing_subscriber`): `-v` warn, `-vv` info,
/// `-vvv` debug, `-vvvv` trace; without `-v`, the most verbose level `RUST_LOG` enables (its
/// invalid directives dropped, as `EnvFilter::from_default_env` drops them), unless turnstile's
/// own `LOG_LEVEL` is set. `None`: turnstile's `LOG_LEVEL` (info). Limitador's "off" is
/// turnstile's error, which still explains a refused start.
fn log_level(verbose: u8, env: &Env<'_>) -> Option<&'static str> {
    use tracing_subscriber::filter::LevelFilter;
    match verbose {
        0 => {}
        1 => return Some("warn"),
        2 => return Some("info"),
        3 => return Some("debug"),
        _ => return Some("trace"),
    }
    if env.get("LOG_LEVEL").is_some() {
        return None;
    }
    let rust_log = env.get("RUST_LOG")?;
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(rust_log);
    Some(match filter.max_level_hint() {
        Some(LevelFilter::TRACE) => "trace",
        Some(LevelFilter::DEBUG) => "debug",
        Some(LevelFilter::INFO) => "info",
        Some(LevelFilter::WARN) => "warn",
        _ => "error",
    })
}

/// Limitador's switches in its environment (limitador-server/src/config.rs).
const NAME_IN_LABELS: &str = "LIMIT_NAME_IN_PROMETHEUS_LABELS";
const CACHE_ENABLED: &str = "REDIS_LOCAL_CACHE_ENABLED";

/// A switch of Limitador's environment, read as Limitador reads it (`env_option_is_enabled`):
/// on when it is exactly `1`, off whatever else it says (`true`, `yes`, `on` included). Never
/// refused: a value Limitador starts with, turnstile starts with.
fn switch(env: &Env<'_>, k: &str) -> bool {
    env.get(k).as_deref() == Some("1")
}

/// A warning for each switch set to what reads as off but may have been meant as on (anything
/// but `1` and `0`), logged at start: Limitador reads `true` as off without a word.
fn misread_switches(env: &Env<'_>) -> Vec<String> {
    [NAME_IN_LABELS, CACHE_ENABLED]
        .into_iter()
        .filter_map(|k| {
            let v = env.get(k).filter(|v| !matches!(v.as_str(), "1" | "0"))?;
            Some(format!(
                "{k}={v} reads as off, as Limitador reads it: only 1 turns it on"
            ))
        })
        .collect()
}

/// `--max-reservation-fraction`: a number above 0, at most 1. Limitador takes 0 too, which
/// caps every hold at nothing: each `Reserve` would answer OK and hold nothing.
fn parse_fraction(text: &str) -> Result<f64, String> {
    let f = (text.trim().parse::<f64>().ok())
        .filter(|f| (0.0..=1.0).contains(f))
        .ok_or_else(|| "is not a number from 0 to 1".to_owned())?;
    match f > 0.0 {
        true => Ok(f),
        false => Err(NOTHING_HELD.into()),
    }
}

/// `--max-reservation-ttl`: whole seconds (Limitador's unit), or a duration with its unit; at
/// least a millisecond, as a hold of no time would answer OK and hold nothing.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = match text.trim().parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => parse_duration(text)?,
    };
    match ttl >= Duration::from_millis(1) {
        true => Ok(ttl),
        false => Err(NOTHING_HELD.into()),
    }
}

const NOTHING_HELD: &str = "would make every Reserve answer OK holding nothing (to turn \
                            reservations off, give --disable-reservations)";

/// Counters in this process (memory, or made durable on disk): `REDIS_URL` is Limitador's, not
/// turnstile's.
fn memory_vars() -> redis::Vars {
    let mut vars = redis::Vars::new();
    vars.insert("REDIS_URL", None);
    vars.insert("BACKEND_TYPE", Some("memory".into()));
    vars
}
