//! The exposition and the push: every part that counts implements [`Metrics`] in its own room
//! (the shards in `limiter`, the RESP connections in `transport::resp`, the throttle calls in
//! `service::throttle`, ...), `server` registers them in [`Counters`] at start, and the
//! Prometheus text and the statsd push loop over them without naming one. Also here:
//! `ShouldRateLimit`'s counters and envoyproxy/ratelimit's per-limit stats (`requests`,
//! `limit_stats`, `detailed`, `limit_series`), the config loads' counters, logs and traces; the
//! Prometheus port's exposition of the statsd stats through statsd_exporter's mapping (`mapped`).

pub mod client_values;
mod counters;
pub mod detailed;
pub mod exposition;
pub mod histogram;
mod limit_series;
mod limit_stats;
pub mod mapped;
mod push_stats;
mod reloads;
mod requests;
pub mod statsd;
pub mod trace;
mod trace_export;

pub use crate::hitters::{BoundTop, TopTable};
pub use client_values::{digest, Shown};
pub use counters::Counters;
pub use detailed::DetailedSeries;
pub use exposition::{Metrics, Pushed};
pub use histogram::Histogram;
pub use limit_series::LimitSeries;
pub use limit_stats::{BoundStats, LimitStats, LimitStatsTable, Tally};
pub use push_stats::StatsdStats;
pub use reloads::{ConfigLoad, ReloadLog, ReloadStats};
pub use requests::{Counted, RequestStats};
pub use trace::{
    init, init_logging, log_filter, LogSettings, OtlpProtocol, Telemetry, TracingSettings,
};

/// Series `detailed_metric` may create unless `TURNSTILE_MAX_DETAILED_SERIES` says otherwise.
pub const DEFAULT_MAX_DETAILED_SERIES: usize = 10_000;
