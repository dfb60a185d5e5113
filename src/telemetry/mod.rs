//! The exposition and the push: every part that counts implements [`Metrics`] in its own module (the
//! shards in `limiter`, the RESP connections in `transport::throttle`, the throttle calls in
//! `service::throttle`, ...), `server` registers them in [`Registry`] at start, and the Prometheus
//! text and the statsd push loop over them without naming one. Also here: logs and traces, the
//! latency histogram the parts use, how client values leave the process (`client_values`), and the
//! Prometheus port's exposition of the statsd stats through statsd_exporter's mapping (`mapped`).

pub mod client_values;
pub mod exposition;
pub mod histogram;
pub mod mapped;
mod push_stats;
mod registry;
pub mod statsd;
pub mod trace;
mod trace_export;

pub use client_values::{digest, Shown};
pub use exposition::{Metrics, Pushed};
pub use histogram::Histogram;
pub use push_stats::StatsdStats;
pub use registry::Registry;
pub use trace::{
    init, init_logging, log_filter, LogSettings, OtlpProtocol, Telemetry, TracingSettings,
};
