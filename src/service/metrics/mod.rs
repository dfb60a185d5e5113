//! The request path's stats, beside the path that counts them: every door's calls, errors and
//! latency (`calls`), envoyproxy/ratelimit's per-limit stats (`requests`) bound by stat key
//! (`limit_stats`) and their series at each scrape (`limit_series`), and the `detailed_metric`
//! series (`detailed`). Each implements `telemetry::Metrics`; `server` registers them.

mod calls;
pub mod detailed;
mod limit_series;
mod limit_stats;
mod requests;

pub use calls::{CallStats, Door, DoorCalls, Failed};
pub use detailed::DetailedSeries;
pub use limit_series::LimitSeries;
pub use limit_stats::{BoundStats, LimitStats, LimitStatsTable, Tally};
pub use requests::{Counted, RequestStats};

/// Series `detailed_metric` may create unless `TURNSTILE_MAX_DETAILED_SERIES` says otherwise.
pub const DEFAULT_MAX_DETAILED_SERIES: usize = 10_000;
