//! Counters for the stats envoyproxy/ratelimit reports, kept as atomics (no allocation on the
//! hot path), and logging setup.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

use crate::config::{Config, Node};
use crate::service::RlsError;

/// envoyproxy/ratelimit's per-limit stats. One set lives in every config node; a reload carries
/// the values over to the node with the same stat key.
#[derive(Debug, Default)]
pub struct LimitStats {
    pub total_hits: AtomicU64,
    pub over_limit: AtomicU64,
    pub near_limit: AtomicU64,
    pub within_limit: AtomicU64,
    pub shadow_mode: AtomicU64,
}

impl LimitStats {
    pub fn copy_from(&self, other: &LimitStats) {
        for (a, b) in self.fields().into_iter().zip(other.fields()) {
            a.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    fn fields(&self) -> [&AtomicU64; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
    }
}

/// Process-wide counters.
#[derive(Debug, Default)]
pub struct Metrics {
    pub near_limit_ratio: f64,
    /// Sums over every limit, including Envoy's `limit` overrides that have no config node.
    pub all: LimitStats,
    pub requests: AtomicU64,
    pub invalid_argument: AtomicU64,
    pub overloaded: AtomicU64,
    pub unavailable: AtomicU64,
    pub config_load_success: AtomicU64,
    pub config_load_error: AtomicU64,
}

impl Metrics {
    pub fn new(near_limit_ratio: f64) -> Metrics {
        Metrics {
            near_limit_ratio,
            ..Default::default()
        }
    }

    /// Counts one descriptor's verdict against its node's stats and the totals.
    pub fn record(
        &self,
        node: Option<&Node>,
        hits: u64,
        over: bool,
        shadow: bool,
        remaining: u32,
        limit: u32,
    ) {
        let near = if over {
            0
        } else {
            // Hits that landed above floor(limit × ratio) but within the limit.
            let threshold = (f64::from(limit) * self.near_limit_ratio).floor() as u64;
            let used = u64::from(limit.saturating_sub(remaining));
            used.saturating_sub(threshold).min(hits)
        };
        for s in [Some(&self.all), node.map(|n| &n.stats)]
            .into_iter()
            .flatten()
        {
            s.total_hits.fetch_add(hits, Ordering::Relaxed);
            if over {
                s.over_limit.fetch_add(hits, Ordering::Relaxed);
            } else {
                s.within_limit.fetch_add(hits, Ordering::Relaxed);
            }
            if near > 0 {
                s.near_limit.fetch_add(near, Ordering::Relaxed);
            }
            if shadow {
                s.shadow_mode.fetch_add(hits, Ordering::Relaxed);
            }
        }
    }

    pub fn count_result(&self, r: &Result<RateLimitResponse, RlsError>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let c = match r {
            Ok(_) => return,
            Err(RlsError::InvalidArgument(_)) => &self.invalid_argument,
            Err(RlsError::Overloaded) => &self.overloaded,
            Err(RlsError::Unavailable) => &self.unavailable,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self, config: &Config) -> String {
        let mut out = String::with_capacity(4096);
        let g = |o: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        g(
            &mut out,
            "ratelimit_service_requests_total",
            "ShouldRateLimit calls answered or failed.",
            "counter",
            self.requests.load(Ordering::Relaxed),
        );
        let _ = writeln!(out, "# HELP ratelimit_service_errors_total Calls that got no decision, by kind.\n# TYPE ratelimit_service_errors_total counter");
        for (kind, c) in [
            ("invalid_argument", &self.invalid_argument),
            ("overloaded", &self.overloaded),
            ("unavailable", &self.unavailable),
        ] {
            let _ = writeln!(
                out,
                "ratelimit_service_errors_total{{kind=\"{kind}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        g(
            &mut out,
            "ratelimit_service_config_load_success_total",
            "Config loads that succeeded.",
            "counter",
            self.config_load_success.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "ratelimit_service_config_load_error_total",
            "Config loads that failed (the old config stayed live).",
            "counter",
            self.config_load_error.load(Ordering::Relaxed),
        );
        let names = [
            "total_hits",
            "over_limit",
            "near_limit",
            "within_limit",
            "shadow_mode",
        ];
        for (i, name) in names.iter().enumerate() {
            let metric = format!("ratelimit_service_rate_limit_{name}");
            let _ = writeln!(out, "# HELP {metric} Hits by limit (envoyproxy/ratelimit's {name}).\n# TYPE {metric} counter");
            let _ = writeln!(
                out,
                "{metric}{{domain=\"\",descriptor=\"all\"}} {}",
                self.all.fields()[i].load(Ordering::Relaxed)
            );
            let mut domains: Vec<_> = config.domains.values().collect();
            domains.sort_by(|a, b| a.name.cmp(&b.name));
            for d in domains {
                for_each_node(&d.root, &mut |n| {
                    let path = n.stat_key.split_once('.').map_or("", |(_, p)| p);
                    let _ = writeln!(
                        out,
                        "{metric}{{domain=\"{}\",descriptor=\"{}\"}} {}",
                        escape(&d.name),
                        escape(path),
                        n.stats.fields()[i].load(Ordering::Relaxed)
                    );
                });
            }
        }
        out
    }
}

fn for_each_node(level: &crate::config::Level, f: &mut dyn FnMut(&Node)) {
    for n in level.nodes() {
        if !n.limits.is_empty() {
            f(n);
        }
        for_each_node(&n.children, f);
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Logs to stderr: `LOG_LEVEL` (default info) and `LOG_FORMAT` text|json.
pub fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_new(level.to_ascii_lowercase())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
