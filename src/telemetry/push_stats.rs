//! The statsd push's own stats, rendered on `/metrics` beside everyone else's.

use std::sync::atomic::{AtomicU64, Ordering};

use super::exposition::{single, Metrics};

/// Push outcomes, rendered on `/metrics`.
#[derive(Debug, Default)]
pub struct StatsdStats {
    packets: AtomicU64,
    errors: AtomicU64,
}

impl StatsdStats {
    /// `n` packets (UDP) or writes (TCP) went out.
    pub fn sent(&self, n: u64) {
        self.packets.fetch_add(n, Ordering::Relaxed);
    }

    /// A flush failed.
    pub fn failed(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}

impl Metrics for StatsdStats {
    fn render(&self, out: &mut String) {
        single(
            out,
            "ratelimit_service_statsd_packets_total",
            "Packets (UDP) or writes (TCP) the statsd push sent.",
            "counter",
            self.packets.load(Ordering::Relaxed),
        );
        single(
            out,
            "ratelimit_service_statsd_errors_total",
            "statsd flushes that failed (their counts go with the next flush).",
            "counter",
            self.errors.load(Ordering::Relaxed),
        );
    }
}
