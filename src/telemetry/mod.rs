//! Counters for the stats envoyproxy/ratelimit reports, kept as atomics (no allocation on the
//! hot path), their Prometheus exposition, and logs and traces setup.

pub mod detailed;
pub mod histogram;
mod limit_stats;
pub mod throttle;
pub mod trace;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use crate::config::Config;
use crate::limiter::ShardStats;

pub use detailed::DetailedSeries;
pub use histogram::Histogram;
pub use limit_stats::{BoundStats, LimitStats, LimitStatsTable};
pub use throttle::ThrottleStats;
pub use trace::{init, init_logging, LogSettings, OtlpProtocol, Telemetry, TracingSettings};

/// Series `detailed_metric` may create unless `TURNSTILE_MAX_DETAILED_SERIES` says otherwise.
pub const DEFAULT_MAX_DETAILED_SERIES: usize = 10_000;

/// Process-wide counters.
#[derive(Debug)]
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
    /// Seconds since the Unix epoch of the last config load that succeeded.
    pub config_loaded_at: AtomicU64,
    /// Time to answer `ShouldRateLimit`, from the request's arrival to its answer.
    pub latency: Histogram,
    /// `detailed_metric` series, bounded.
    pub detailed: DetailedSeries,
    /// The engine's per-shard counters, set once the engine exists; rendered as gauges.
    pub shards: OnceLock<Vec<Arc<ShardStats>>>,
    pub tls_handshake_errors: AtomicU64,
    pub tls_reload_success: AtomicU64,
    pub tls_reload_error: AtomicU64,
    /// `THROTTLE` calls over RESP and HTTP, and RESP connections.
    pub throttle: ThrottleStats,
    /// envoyproxy/ratelimit's per-limit stats, by stat key.
    pub limit_stats: LimitStatsTable,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            near_limit_ratio: 0.8,
            all: LimitStats::default(),
            requests: AtomicU64::new(0),
            invalid_argument: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
            config_load_success: AtomicU64::new(0),
            config_load_error: AtomicU64::new(0),
            config_loaded_at: AtomicU64::new(0),
            latency: Histogram::default(),
            detailed: DetailedSeries::new(DEFAULT_MAX_DETAILED_SERIES),
            shards: OnceLock::new(),
            tls_handshake_errors: AtomicU64::new(0),
            tls_reload_success: AtomicU64::new(0),
            tls_reload_error: AtomicU64::new(0),
            throttle: ThrottleStats::default(),
            limit_stats: LimitStatsTable::default(),
        }
    }
}

impl Metrics {
    pub fn new(near_limit_ratio: f64) -> Metrics {
        Metrics {
            near_limit_ratio,
            ..Default::default()
        }
    }

    /// With room for `cap` `detailed_metric` series.
    pub fn with_max_detailed_series(mut self, cap: usize) -> Metrics {
        self.detailed = DetailedSeries::new(cap);
        self
    }

    /// One `ShouldRateLimit` answered (or failed) after `d`.
    pub fn observe_latency(&self, d: Duration) {
        self.latency.observe(d);
    }

    /// Counts a successful config load now.
    pub fn config_loaded(&self) {
        self.config_load_success.fetch_add(1, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.config_loaded_at.store(now, Ordering::Relaxed);
    }

    /// Hits beyond floor(limit × ratio) but within the limit.
    fn near(&self, hits: u64, over: bool, remaining: u32, limit: u32) -> u64 {
        if over {
            return 0;
        }
        let threshold = (f64::from(limit) * self.near_limit_ratio).floor() as u64;
        let used = u64::from(limit.saturating_sub(remaining));
        used.saturating_sub(threshold).min(hits)
    }

    /// Counts one descriptor's verdict in the series of a `detailed_metric` descriptor, named by
    /// the request's own entries (`key_value` where bit i of `values` is set, `u64::MAX` for
    /// all). Call it instead of passing the node to [`Metrics::record`] (pass `None` there, so
    /// the totals still count once): the node's own series is then left out of the exposition.
    #[allow(clippy::too_many_arguments)]
    pub fn record_detailed(
        &self,
        domain: &str,
        entries: &[Entry],
        values: u64,
        hits: u64,
        over: bool,
        shadow: bool,
        remaining: u32,
        limit: u32,
    ) {
        let near = self.near(hits, over, remaining, limit);
        self.detailed
            .with_series(domain, entries, values, |s| s.add(hits, over, near, shadow));
    }

    /// Counts one descriptor's verdict against its node's stats and the totals.
    pub fn record(
        &self,
        stats: Option<&LimitStats>,
        hits: u64,
        over: bool,
        shadow: bool,
        remaining: u32,
        limit: u32,
    ) {
        let near = self.near(hits, over, remaining, limit);
        self.all.add(hits, over, near, shadow);
        if let Some(s) = stats {
            s.add(hits, over, near, shadow);
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self, config: &Config, stats: &BoundStats) -> String {
        let mut out = String::with_capacity(8192);
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
        self.latency.render(
            &mut out,
            "ratelimit_service_request_duration_seconds",
            "Time from a ShouldRateLimit call's arrival to its answer, queued waits included.",
        );
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
        g(
            &mut out,
            "ratelimit_service_config_last_load_success_timestamp_seconds",
            "When the live config was loaded.",
            "gauge",
            self.config_loaded_at.load(Ordering::Relaxed),
        );
        self.render_shards(&mut out);
        self.throttle.render(&mut out);
        for (name, help, c) in [
            (
                "ratelimit_service_tls_handshake_errors_total",
                "gRPC connections dropped because their TLS handshake failed.",
                &self.tls_handshake_errors,
            ),
            (
                "ratelimit_service_tls_reload_success_total",
                "Certificate reloads that succeeded.",
                &self.tls_reload_success,
            ),
            (
                "ratelimit_service_tls_reload_error_total",
                "Certificate reloads that failed (the old certificate stayed live).",
                &self.tls_reload_error,
            ),
        ] {
            g(&mut out, name, help, "counter", c.load(Ordering::Relaxed));
        }

        let detailed = self.detailed.snapshot();
        let is_detailed = |domain: &str, path: &str| {
            detailed
                .binary_search_by(|(d, p, _)| (d.as_str(), p.as_str()).cmp(&(domain, path)))
                .is_ok()
        };
        let mut domains: Vec<_> = config.domains.values().collect();
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        // Names of the node series, sorted, when a detailed series might repeat one.
        let mut plain: Vec<(&str, &str)> = Vec::new();
        if !detailed.is_empty() {
            for d in &domains {
                d.root.walk(&mut |n| {
                    if !n.detailed_metric {
                        let path = n.stat_key.split_once('.').map_or("", |(_, p)| p);
                        plain.push((d.name.as_str(), path));
                    }
                });
            }
            plain.sort_unstable();
        }
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
            for d in &domains {
                d.root.walk(&mut |n| {
                    let path = n.stat_key.split_once('.').map_or("", |(_, p)| p);
                    // A detailed node's hits are in its per-value series; one of those may
                    // carry the node's own name, and a name must not appear twice.
                    if n.detailed_metric && is_detailed(&d.name, path) {
                        return;
                    }
                    let _ = writeln!(
                        out,
                        "{metric}{{domain=\"{}\",descriptor=\"{}\"}} {}",
                        escape(&d.name),
                        escape(path),
                        stats.of(n).fields()[i].load(Ordering::Relaxed)
                    );
                });
            }
            for (domain, path, series) in &detailed {
                if plain
                    .binary_search(&(domain.as_str(), path.as_str()))
                    .is_ok()
                {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "{metric}{{domain=\"{}\",descriptor=\"{}\"}} {}",
                    escape(domain),
                    escape(path),
                    series.fields()[i].load(Ordering::Relaxed)
                );
            }
        }
        g(
            &mut out,
            "ratelimit_service_detailed_metric_overflow_total",
            "detailed_metric observations counted in their domain's _other series because the series cap was reached.",
            "counter",
            self.detailed.overflow.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "ratelimit_service_detailed_metric_series",
            "detailed_metric series in memory.",
            "gauge",
            detailed.len() as u64,
        );
        out
    }

    fn render_shards(&self, out: &mut String) {
        let Some(shards) = self.shards.get() else {
            return;
        };
        type Field = fn(&ShardStats) -> &AtomicU64;
        let families: [(&str, &str, &str, Field); 12] = [
            (
                "ratelimit_service_shard_keys",
                "gauge",
                "Counter keys held in memory.",
                |s| &s.keys,
            ),
            (
                "ratelimit_service_queue_waiting",
                "gauge",
                "Requests waiting in a queue now.",
                |s| &s.waiting,
            ),
            (
                "ratelimit_service_queue_queued_total",
                "counter",
                "Requests that went into a queue.",
                |s| &s.queued,
            ),
            (
                "ratelimit_service_queue_admitted_after_wait_total",
                "counter",
                "Queued requests admitted.",
                |s| &s.admitted_after_wait,
            ),
            (
                "ratelimit_service_queue_timed_out_total",
                "counter",
                "Queued requests refused at their max_wait.",
                |s| &s.timed_out,
            ),
            (
                "ratelimit_service_queue_cancelled_total",
                "counter",
                "Queued requests whose caller went away.",
                |s| &s.cancelled,
            ),
            (
                "ratelimit_service_queue_full_total",
                "counter",
                "Requests refused at once because their queue was full.",
                |s| &s.queue_full,
            ),
            (
                "ratelimit_service_shard_evictions_total",
                "counter",
                "Keys evicted before their window ended because the shard held its key cap.",
                |s| &s.evictions,
            ),
            (
                "ratelimit_service_redis_breaker_state",
                "gauge",
                "Redis circuit breaker: 0 closed, 1 open, 2 half-open.",
                |s| &s.breaker,
            ),
            (
                "ratelimit_service_redis_errors_total",
                "counter",
                "Redis round trips that failed or were too slow.",
                |s| &s.redis_errors,
            ),
            (
                "ratelimit_service_redis_fallback_decisions_total",
                "counter",
                "Decisions made without Redis while its breaker was open.",
                |s| &s.fallback_decisions,
            ),
            (
                "ratelimit_service_rate_limit_over_limit_with_local_cache_total",
                "counter",
                "Refusals answered from the local over-limit cache without a Redis round trip.",
                |s| &s.local_cache_hits,
            ),
        ];
        for (name, kind, help, field) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (i, s) in shards.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{name}{{shard=\"{i}\"}} {}",
                    field(s).load(Ordering::Relaxed)
                );
            }
        }
        let name = "ratelimit_service_queue_wait_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Time queued requests spent waiting.\n# TYPE {name} counter"
        );
        for (i, s) in shards.iter().enumerate() {
            let secs = s.wait_ns_total.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {secs}");
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
