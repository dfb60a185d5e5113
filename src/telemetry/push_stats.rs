//! The statsd push's own counters, rendered on `/metrics` beside everyone else's.

use std::sync::atomic::AtomicU64;

/// Push outcomes, rendered on `/metrics`.
#[derive(Debug, Default)]
pub struct StatsdStats {
    pub packets: AtomicU64,
    pub errors: AtomicU64,
}
