//! Stats of the direct APIs' calls: `THROTTLE` (RESP and HTTP) and `CL.THROTTLE`, by result.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::exposition::{family, Metrics};

/// `turnstile_throttle_calls_total{result}`.
#[derive(Debug, Default)]
pub struct ThrottleStats {
    allowed: AtomicU64,
    denied: AtomicU64,
    /// Calls refused for bad arguments or parameters over the caps.
    invalid: AtomicU64,
    /// Calls the engine could not decide (overloaded, stopped, store down).
    unavailable: AtomicU64,
}

impl ThrottleStats {
    pub(super) fn decided(&self, allowed: bool) {
        let c = if allowed { &self.allowed } else { &self.denied };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn invalid(&self) {
        self.invalid.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn unavailable(&self) {
        self.unavailable.fetch_add(1, Ordering::Relaxed);
    }
}

impl Metrics for ThrottleStats {
    fn render(&self, out: &mut String) {
        let name = "turnstile_throttle_calls_total";
        let help = "THROTTLE (RESP and HTTP) and CL.THROTTLE calls by result.";
        family(out, name, help, "counter");
        for (result, c) in [
            ("allowed", &self.allowed),
            ("denied", &self.denied),
            ("invalid", &self.invalid),
            ("unavailable", &self.unavailable),
        ] {
            let v = c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{result=\"{result}\"}} {v}");
        }
    }
}
