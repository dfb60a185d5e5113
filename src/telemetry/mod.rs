//! Counters for the stats envoyproxy/ratelimit reports, kept as atomics (no allocation on the
//! hot path), their Prometheus exposition, and logs and traces setup.
//!
//! The counters' types live here, below every subsystem that counts, so the exposition can read
//! them; each subsystem holds and updates its own ([`Counters`] says who), and `server` gathers
//! them for the Prometheus text and the statsd push.

pub mod admin;
pub mod client_values;
mod counters;
pub mod detailed;
pub mod histogram;
mod limit_stats;
mod push_stats;
pub mod quota;
mod reloads;
mod render;
pub mod state;
pub mod statsd;
pub mod throttle;
pub mod tls;
pub mod trace;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use crate::hitters::{BoundTop, TopTable};
pub use client_values::{digest, Shown};
pub use counters::Counters;
pub use detailed::DetailedSeries;
pub use histogram::Histogram;
pub use limit_stats::{BoundStats, LimitStats, LimitStatsTable, Tally};
pub use quota::{QuotaLimit, QuotaStats};
pub use reloads::{ConfigLoad, ReloadLog, ReloadStats};
pub use state::StateStats;
pub use throttle::ThrottleStats;
pub use tls::TlsStats;
pub use trace::{
    init, init_logging, log_filter, LogSettings, OtlpProtocol, Telemetry, TracingSettings,
};

/// Series `detailed_metric` may create unless `TURNSTILE_MAX_DETAILED_SERIES` says otherwise.
pub const DEFAULT_MAX_DETAILED_SERIES: usize = 10_000;

/// `ShouldRateLimit`'s counters (over gRPC and `/json`): calls, errors, latency, and
/// envoyproxy/ratelimit's per-limit stats. The request path holds them.
#[derive(Debug)]
pub struct RequestStats {
    pub near_limit_ratio: f64,
    /// Sums over every limit, including Envoy's `limit` overrides that have no config node.
    pub all: LimitStats,
    pub requests: AtomicU64,
    pub invalid_argument: AtomicU64,
    pub overloaded: AtomicU64,
    pub unavailable: AtomicU64,
    /// Time to answer `ShouldRateLimit`, from the request's arrival to its answer.
    pub latency: Histogram,
    /// `detailed_metric` series, bounded.
    pub detailed: DetailedSeries,
    /// envoyproxy/ratelimit's per-limit stats, by stat key.
    pub limit_stats: LimitStatsTable,
}

impl Default for RequestStats {
    fn default() -> RequestStats {
        RequestStats {
            near_limit_ratio: 0.8,
            all: LimitStats::default(),
            requests: AtomicU64::new(0),
            invalid_argument: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
            latency: Histogram::default(),
            detailed: DetailedSeries::new(DEFAULT_MAX_DETAILED_SERIES),
            limit_stats: LimitStatsTable::default(),
        }
    }
}

impl RequestStats {
    pub fn new(near_limit_ratio: f64) -> RequestStats {
        RequestStats {
            near_limit_ratio,
            ..Default::default()
        }
    }

    /// With room for `cap` `detailed_metric` series.
    pub fn with_max_detailed_series(mut self, cap: usize) -> RequestStats {
        self.detailed = DetailedSeries::new(cap);
        self
    }

    /// One `ShouldRateLimit` answered (or failed) after `d`.
    pub fn observe_latency(&self, d: Duration) {
        self.latency.observe(d);
    }

    /// Hits beyond floor(limit × ratio) but within the limit: of a count over the limit,
    /// those of its hits below the limit, as envoyproxy/ratelimit counts them.
    fn near(&self, v: &Counted) -> u64 {
        let threshold = (f64::from(v.limit) * self.near_limit_ratio).floor() as u64;
        if v.over || v.shadow {
            let Some(before) = (u64::from(v.limit).saturating_add(v.past)).checked_sub(v.hits)
            else {
                return 0;
            };
            return u64::from(v.limit).saturating_sub(threshold.max(before));
        }
        let used = u64::from(v.limit.saturating_sub(v.remaining));
        used.saturating_sub(threshold).min(v.hits)
    }

    /// Counts one descriptor's hits in the series `domain` + `path` (a name the reference gives,
    /// see `descriptor::stat_path`: per-value series of `detailed_metric` and
    /// `value_to_metric`, overrides), in the capped map of per-value series. Call it instead of
    /// passing the node to [`RequestStats::record`] (pass `None` there, so the totals still count
    /// once): the node's own series is then left out of the exposition.
    pub fn record_series(&self, domain: &str, path: &str, v: Counted) {
        let near = self.near(&v);
        self.detailed.with_path(domain, path, |s| {
            s.add(v.hits, v.over, v.over_hits(), near, v.shadow)
        });
    }

    /// Counts one descriptor's hits against its limit's stats, and in `totals`, the call's tally
    /// for [`RequestStats::record_totals`].
    pub fn record(&self, stats: Option<&LimitStats>, v: Counted, totals: &mut Tally) {
        let near = self.near(&v);
        totals.add(v.hits, v.over, v.over_hits(), near, v.shadow);
        if let Some(s) = stats {
            s.add(v.hits, v.over, v.over_hits(), near, v.shadow);
        }
    }

    /// Adds a call's tally to the totals (the `all` series), once per call.
    pub fn record_totals(&self, totals: &Tally) {
        self.all.add_tally(totals);
    }
}

/// What one descriptor's limit counted, as the stats count it (the request's verdict is
/// `limiter::refuses`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub hits: u64,
    /// Over its limit, and not in shadow mode.
    pub over: bool,
    /// Over its limit in shadow mode (counted, not refused).
    pub shadow: bool,
    pub remaining: u32,
    pub limit: u32,
    /// How far past the limit the key is with these hits (`u64::MAX`: all of them are over).
    pub past: u64,
}

impl Counted {
    /// The part of the hits over the limit: all of them when the key was full before.
    fn over_hits(&self) -> u64 {
        self.hits.min(self.past)
    }
}
