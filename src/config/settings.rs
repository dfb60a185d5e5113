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

/// Everything the server needs besides the limits themselves.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config_path: PathBuf,
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
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let workers = num("TURNSTILE_WORKERS", cores as u64)? as usize;
        let shards = num("TURNSTILE_SHARDS", workers.max(1) as u64)? as usize;
        Ok(Settings {
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

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Some(true),
        "0" | "f" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}
