//! The Prometheus text exposition of [`Counters`]: service counters, the latency histogram,
//! per-shard gauges, the direct transports, and envoyproxy/ratelimit's per-limit series.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{BoundStats, Counters, LimitStats};
use crate::config::{Algorithm, Config, Domain, RateLimit};
use crate::limiter::ShardStats;

/// One unlabelled series with its HELP and TYPE lines.
fn single(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
    );
}

type ShardField = fn(&ShardStats) -> &AtomicU64;

/// The per-shard families: name, type, help, and the counter each reads.
const SHARD_FAMILIES: [(&str, &str, &str, ShardField); 16] = [
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
        "Hits refused from the local over-limit cache without a Redis round trip (envoyproxy/ratelimit's over_limit_with_local_cache, summed over limits).",
        |s| &s.local_cache_hits,
    ),
    (
        "ratelimit_service_local_first_decisions_total",
        "counter",
        "Local-first: requests decided from memory, without a Redis round trip.",
        |s| &s.local_decisions,
    ),
    (
        "ratelimit_service_local_first_syncs_total",
        "counter",
        "Local-first: background round trips adding local hits to Redis and reading totals back.",
        |s| &s.syncs,
    ),
    (
        "ratelimit_service_redis_replayed_hits_total",
        "counter",
        "Hits decided from memory on exact limits while Redis was away, sent to Redis once it answered again.",
        |s| &s.replayed_hits,
    ),
    (
        "ratelimit_service_redis_replay_dropped_hits_total",
        "counter",
        "Hits decided from memory on exact limits while Redis was away and never sent: their window ended first, or the shard held its key cap.",
        |s| &s.replay_dropped_hits,
    ),
];

impl Counters {
    /// Prometheus text exposition, with the per-limit series of `config`'s limits.
    pub fn render(&self, config: &Config, stats: &BoundStats) -> String {
        let mut out = String::with_capacity(8192);
        self.render_service(&mut out);
        self.render_shards(&mut out);
        self.throttle.render(&mut out);
        self.admin.render(&mut out);
        self.state.render(&mut out);
        self.quota.render(&mut out);
        self.render_limits(&mut out, config, stats);
        render_limit_gauges(&mut out, config);
        out
    }

    fn render_service(&self, out: &mut String) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        single(
            out,
            "ratelimit_service_requests_total",
            "ShouldRateLimit calls answered or failed.",
            "counter",
            load(&self.service.requests),
        );
        let _ = writeln!(out, "# HELP ratelimit_service_errors_total Calls that got no decision, by kind.\n# TYPE ratelimit_service_errors_total counter");
        for (kind, c) in [
            ("invalid_argument", &self.service.invalid_argument),
            ("overloaded", &self.service.overloaded),
            ("unavailable", &self.service.unavailable),
        ] {
            let _ = writeln!(
                out,
                "ratelimit_service_errors_total{{kind=\"{kind}\"}} {}",
                load(c)
            );
        }
        self.service.latency.render(
            out,
            "ratelimit_service_request_duration_seconds",
            "Time from a ShouldRateLimit call's arrival to its answer, queued waits included.",
        );
        let plain: [(&str, &str, &str, &AtomicU64); 9] = [
            (
                "ratelimit_service_statsd_packets_total",
                "Packets (UDP) or writes (TCP) the statsd push sent.",
                "counter",
                &self.statsd.packets,
            ),
            (
                "ratelimit_service_statsd_errors_total",
                "statsd flushes that failed (their counts go with the next flush).",
                "counter",
                &self.statsd.errors,
            ),
            (
                "ratelimit_service_config_load_success_total",
                "Config loads that succeeded.",
                "counter",
                &self.reloads.success,
            ),
            (
                "ratelimit_service_config_load_error_total",
                "Config loads that failed (the old config stayed live).",
                "counter",
                &self.reloads.error,
            ),
            (
                "ratelimit_service_config_last_load_success_timestamp_seconds",
                "When the live config was loaded.",
                "gauge",
                &self.reloads.loaded_at,
            ),
            (
                "ratelimit_service_redis_startup_retries_total",
                "Tries of the first Redis connection at start that failed and were retried.",
                "counter",
                &self.redis_startup_retries,
            ),
            (
                "ratelimit_service_tls_handshake_errors_total",
                "gRPC connections dropped because their TLS handshake failed.",
                "counter",
                &self.tls.handshake_errors,
            ),
            (
                "ratelimit_service_tls_reload_success_total",
                "Certificate reloads that succeeded.",
                "counter",
                &self.tls.reload_success,
            ),
            (
                "ratelimit_service_tls_reload_error_total",
                "Certificate reloads that failed (the old certificate stayed live).",
                "counter",
                &self.tls.reload_error,
            ),
        ];
        for (name, help, kind, c) in plain {
            single(out, name, help, kind, load(c));
        }
    }

    fn render_shards(&self, out: &mut String) {
        // An engine has a shard at least: none means no engine to show.
        let shards = &self.shards;
        if shards.is_empty() {
            return;
        }
        for (name, kind, help, field) in SHARD_FAMILIES {
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

    /// Per-limit series: the totals, every config node, and the capped `detailed_metric`
    /// series. A detailed node's own series makes way for a per-value series of the same name,
    /// and a name never appears twice.
    fn render_limits(&self, out: &mut String, config: &Config, stats: &BoundStats) {
        let service = &*self.service;
        let detailed = service.detailed.snapshot();
        let is_detailed = |domain: &str, path: &str| {
            detailed
                .binary_search_by(|(d, p, _)| (d.as_str(), p.as_str()).cmp(&(domain, path)))
                .is_ok()
        };
        let mut domains: Vec<&Domain> = config.domains.values().collect();
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        // Names of the node series, sorted, when a detailed series might repeat one.
        let mut plain: Vec<(&str, &str)> = Vec::new();
        if !detailed.is_empty() {
            for d in &domains {
                d.root.walk(&mut |n| {
                    if !n.detailed_metric {
                        plain.push((d.name.as_str(), descriptor_path(&n.stat_key)));
                    }
                });
            }
            plain.sort_unstable();
        }
        for (i, name) in LimitStats::FIELD_NAMES.iter().enumerate() {
            let metric = format!("ratelimit_service_rate_limit_{name}");
            let _ = writeln!(out, "# HELP {metric} Hits by limit (envoyproxy/ratelimit's {name}).\n# TYPE {metric} counter");
            let mut series = |domain: &str, path: &str, c: &AtomicU64| {
                let v = c.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{metric}{{domain=\"{}\",descriptor=\"{}\"}} {v}",
                    escape(domain),
                    escape(path)
                );
            };
            series("", "all", service.all.fields()[i]);
            for d in &domains {
                d.root.walk(&mut |n| {
                    let path = descriptor_path(&n.stat_key);
                    if !(n.detailed_metric && is_detailed(&d.name, path)) {
                        series(&d.name, path, stats.of(n).fields()[i]);
                    }
                });
            }
            for (domain, path, s) in &detailed {
                if plain
                    .binary_search(&(domain.as_str(), path.as_str()))
                    .is_err()
                {
                    series(domain, path, s.fields()[i]);
                }
            }
        }
        single(out, "ratelimit_service_detailed_metric_overflow_total", "detailed_metric observations counted in their domain's _other series because the series cap was reached.", "counter", service.detailed.overflow.load(Ordering::Relaxed));
        single(
            out,
            "ratelimit_service_detailed_metric_series",
            "detailed_metric series in memory.",
            "gauge",
            detailed.len() as u64,
        );
    }
}

type GaugeField = fn(&RateLimit) -> Option<f64>;

/// The limits' own parameters, one family each, labelled as their hit series plus `limit`.
const LIMIT_GAUGES: [(&str, &str, GaugeField); 5] = [
    (
        "ratelimit_service_rate_limit_requests_per_unit",
        "Requests a limit allows per unit (unlimited limits are left out).",
        |l| (!l.unlimited).then_some(f64::from(l.requests_per_unit)),
    ),
    (
        "ratelimit_service_rate_limit_unit_seconds",
        "A limit's window in seconds: its unit (week, month, year: 7, 30, 365 days) times \
         its unit_multiplier; a calendar window's nominal length.",
        |l| (!l.unlimited).then_some(l.window_secs() as f64),
    ),
    (
        "ratelimit_service_rate_limit_burst",
        "A token-bucket limit's burst.",
        |l| match l.algorithm {
            Algorithm::TokenBucket { burst } if !l.unlimited => Some(f64::from(burst)),
            _ => None,
        },
    ),
    (
        "ratelimit_service_rate_limit_queue_max_waiting",
        "Requests a queued limit lets wait at once.",
        |l| l.queue.map(|q| f64::from(q.max_waiting)),
    ),
    (
        "ratelimit_service_rate_limit_queue_max_wait_seconds",
        "How long a queued limit lets a request wait.",
        |l| l.queue.map(|q| q.max_wait.as_secs_f64()),
    ),
];

/// Every limit of the live config as gauges: `{domain, descriptor}` as its hit series (the
/// node's path), and `limit`, its `name` or its place among the node's limits (`0`, `1`...),
/// so a node with two limits has two series. Read from the live config at each scrape, so a
/// reload changes them and a removed limit's series goes.
fn render_limit_gauges(out: &mut String, config: &Config) {
    let mut domains: Vec<&Domain> = config.domains.values().collect();
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    for (name, help, field) in LIMIT_GAUGES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for d in &domains {
            d.root.walk(&mut |n| {
                for (i, l) in n.limits.iter().enumerate() {
                    let Some(v) = field(l) else { continue };
                    let limit = l
                        .name
                        .as_deref()
                        .map_or_else(|| i.to_string(), str::to_owned);
                    let _ = writeln!(
                        out,
                        "{name}{{domain=\"{}\",descriptor=\"{}\",limit=\"{}\"}} {v}",
                        escape(&d.name),
                        escape(descriptor_path(&n.stat_key)),
                        escape(&limit)
                    );
                }
            });
        }
    }
}

/// A stat key without its domain: `domain.key_value.key2` → `key_value.key2`.
fn descriptor_path(stat_key: &str) -> &str {
    stat_key.split_once('.').map_or("", |(_, p)| p)
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
