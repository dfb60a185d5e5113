//! Each door's service, in a module of the door's name, and what they share. Envoy's
//! (`envoy`, [`EnvoyService::decide`]) takes a request its way through: validate (`request`,
//! the bounds every door keeps) → plan (descriptors → ops) → engine → answer. Limitador's
//! (`limitador`), GoCC's (`gocc`) and ThrottleCrab's (`throttle`) decide on the same engine,
//! and RLQS's hub (`rlqs`) splits the same limits among Envoys. Also here: the admin listener's
//! look-ups and resets (`admin`), planned as a request is; the live limits (`live`) and the
//! stats of the config loads that replace them (`reloads`); the request series (`metrics`).

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
pub use reloads::{ConfigLoad, LastLoads, ReloadLog, ReloadStats};
pub use request::{validate, within_bounds, Descriptor, Override, Request, RequestLimits};
pub use settings::{AnswerSettings, CountingRule, HeaderNames};
pub use throttle::{ThrottleLimits, ThrottleService, ThrottleStats};
