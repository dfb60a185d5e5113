//! A request's way through: validate → plan (descriptors → ops) → engine → answer. The gRPC
//! adapter and the HTTP `/json` endpoint both call [`EnvoyService::decide`], which counts the
//! call and its latency; the direct APIs' decisions (`throttle`) use the same engine, and so do
//! the admin listener's look-ups and resets (`admin`), planned as a request is. The live limits
//! (`live`) and the counters of the config loads that replace them (`reloads`) are here too.

mod admin;
mod answer;
mod envoy;
mod error;
#[cfg(test)]
mod fixtures;
pub mod gocc;
pub mod limitador;
mod live;
pub mod metrics;
mod plan;
mod refusal;
mod reloads;
mod request;
pub mod rlqs;
mod settings;
pub mod throttle;

pub use admin::{Acted, AdminError, Applies, Usage};
pub use answer::WAITED_HEADER;
pub use envoy::{EnvoyAnswer, EnvoyService};
pub use error::RlsError;
pub use live::{ConfigCheck, Live, LiveLimits};
pub use reloads::{ConfigLoad, ReloadLog, ReloadStats};
pub use request::{validate, within_bounds, Descriptor, Override, Request, RequestLimits};
pub use settings::{AnswerSettings, CountingRule, HeaderNames};
pub use throttle::{ThrottleLimits, ThrottleService, ThrottleStats};
