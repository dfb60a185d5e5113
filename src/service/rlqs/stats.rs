//! The RLQS metrics, which the quota hub keeps: streams, buckets, bucket actions sent, and each shared limit's demand and
//! split, as the quota hub last saw them. A limit's `key` label is its counter key, which holds
//! the values of the bucket id Envoy sent: it leaves as a port shows client values (a digest of
//! the whole key on a port bound beyond loopback, `telemetry::client_values`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::telemetry::exposition::{escape, Metrics};
use crate::telemetry::Shown;

/// Share series rendered at most, so a flood of buckets cannot flood `/metrics`.
pub const MAX_SHARE_SERIES: usize = 10_000;

/// One shared limit, as the quota hub last saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaLimit {
    pub domain: String,
    /// The counter key the buckets share.
    pub key: String,
    pub requests_per_unit: u32,
    /// Requests per unit the Envoys asked for in their last reports.
    pub demand: f64,
    /// Tokens per unit in force, per stream (one entry per bucket).
    pub shares: Vec<BucketShare>,
}

/// One bucket's share of a limit: its stream, and the tokens per unit in force.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketShare {
    pub stream: u64,
    pub share: u32,
}

#[derive(Debug, Default)]
pub struct RlqsStats {
    pub streams: AtomicU64,
    pub buckets: AtomicU64,
    /// Bucket actions sent: assignments, their refreshes, and abandons.
    pub actions_sent: AtomicU64,
    /// Bucket actions a stream could not take (sent again later).
    pub actions_undelivered: AtomicU64,
    /// New buckets not taken because the book was full.
    pub buckets_refused: AtomicU64,
    /// Demand exchanges with Redis that failed (fleet mode).
    pub fleet_errors: AtomicU64,
    limits: Mutex<Vec<QuotaLimit>>,
}

impl Metrics for RlqsStats {
    fn render(&self, out: &mut String) {
        self.render_for(out, Shown::Digest);
    }

    fn render_for(&self, out: &mut String, shown: Shown) {
        self.render_counters(out);
        self.render_limits(out, shown);
    }
}

impl RlqsStats {
    /// Replaces the per-limit view.
    pub fn set_limits(&self, limits: Vec<QuotaLimit>) {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    fn render_counters(&self, out: &mut String) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, kind, help, c) in [
            (
                "ratelimit_service_rlqs_streams",
                "gauge",
                "Open RLQS streams (one per Envoy).",
                &self.streams,
            ),
            (
                "ratelimit_service_rlqs_buckets",
                "gauge",
                "Buckets the RLQS streams report.",
                &self.buckets,
            ),
            (
                "ratelimit_service_rlqs_actions_sent_total",
                "counter",
                "RLQS bucket actions sent: assignments, refreshes and abandons.",
                &self.actions_sent,
            ),
            (
                "ratelimit_service_rlqs_actions_undelivered_total",
                "counter",
                "RLQS bucket actions a stream could not take (sent again later).",
                &self.actions_undelivered,
            ),
            (
                "ratelimit_service_rlqs_buckets_refused_total",
                "counter",
                "New RLQS buckets not taken because the quota book was full.",
                &self.buckets_refused,
            ),
            (
                "ratelimit_service_rlqs_fleet_errors_total",
                "counter",
                "RLQS demand exchanges with Redis that failed (the other replicas' demands last read hold for 15 s).",
                &self.fleet_errors,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                load(c)
            );
        }
    }

    fn render_limits(&self, out: &mut String, shown: Shown) {
        let limits = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        // Each limit's labels once: a digest is an HMAC, and a limit has a series per share.
        let labels: Vec<String> = (limits.iter())
            .map(|l| {
                let key = shown.value(&l.key);
                format!("domain=\"{}\",key=\"{}\"", escape(&l.domain), escape(&key))
            })
            .collect();
        let families = [
            (
                "ratelimit_service_rlqs_limit_capacity",
                "Requests per unit of a limit the RLQS streams share.",
            ),
            (
                "ratelimit_service_rlqs_limit_demand",
                "Requests per unit the Envoys sharing a limit asked for in their last reports.",
            ),
        ];
        for (i, (name, help)) in families.into_iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (l, labels) in limits.iter().zip(&labels) {
                let v = if i == 0 {
                    f64::from(l.requests_per_unit)
                } else {
                    l.demand
                };
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
        let name = "ratelimit_service_rlqs_limit_share";
        let _ = writeln!(out, "# HELP {name} Requests per unit of a limit assigned to one Envoy's bucket.\n# TYPE {name} gauge");
        let series = (limits.iter().zip(&labels))
            .flat_map(|(l, labels)| l.shares.iter().map(move |s| (labels, s)));
        for (labels, BucketShare { stream, share }) in series.take(MAX_SHARE_SERIES) {
            let _ = writeln!(out, "{name}{{{labels},stream=\"{stream}\"}} {share}");
        }
    }
}
