//! envoyproxy/ratelimit's per-limit series, read with the live config: hits by limit in
//! Prometheus text and statsd counters, and each limit's parameters as gauges.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{BoundStats, LimitStats, RequestStats};
use crate::config::{Algorithm, Config, Domain, RateLimit};
use crate::telemetry::exposition::{escape, family, single, Pushed};
use crate::telemetry::statsd::sanitize;

/// The per-limit stats of `metrics` as `config`'s limits bind them (`stats`): what the live
/// limits render and push at each scrape and flush.
pub struct LimitSeries<'a> {
    pub metrics: &'a RequestStats,
    pub config: &'a Config,
    pub stats: &'a BoundStats,
}

impl LimitSeries<'_> {
    /// The hit series, the `detailed_metric` gauges, and the limits' parameters.
    pub fn render(&self, out: &mut String) {
        self.render_limits(out);
        render_limit_gauges(out, self.config);
    }

    /// Every per-limit counter the reference would flush, by its name.
    pub fn push(&self, out: &mut Pushed) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut limit = |key: &str, fields: [&AtomicU64; 5]| {
            let key = sanitize(key);
            for (field, c) in LimitStats::FIELD_NAMES.iter().zip(fields) {
                out.add(
                    format!("ratelimit.service.rate_limit.{key}.{field}"),
                    load(c),
                );
            }
        };
        (self.config).for_each_node(&mut |n| limit(&n.stat_key, self.stats.of(n).fields()));
        for (domain, path, s) in self.metrics.detailed.snapshot() {
            limit(&format!("{domain}.{path}"), s.fields());
        }
    }

    /// Per-limit series: the totals, every config node, and the capped `detailed_metric`
    /// series. A detailed node's own series makes way for a per-value series of the same name,
    /// and a name never appears twice.
    fn render_limits(&self, out: &mut String) {
        let (service, config, stats) = (self.metrics, self.config, self.stats);
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
            family(
                out,
                &metric,
                &format!("Hits by limit (envoyproxy/ratelimit's {name})."),
                "counter",
            );
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
