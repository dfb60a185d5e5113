//! Counters of the direct transports: `THROTTLE` (RESP and HTTP) and `CL.THROTTLE` calls, and RESP
//! connections.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the direct transports (`THROTTLE` over RESP and HTTP).
#[derive(Debug, Default)]
pub struct ThrottleStats {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    /// Calls refused for bad arguments or parameters over the caps.
    pub invalid: AtomicU64,
    /// Calls the engine could not decide (overloaded, stopped, backend down).
    pub unavailable: AtomicU64,
    pub resp_connections_open: AtomicU64,
    /// Connections turned away at the cap.
    pub resp_connections_refused: AtomicU64,
}

impl ThrottleStats {
    /// Appends the counters in Prometheus text format (for the `/metrics` handler).
    pub fn render(&self, out: &mut String) {
        let s = self;
        let _ = writeln!(
        out,
        "# HELP turnstile_throttle_calls_total THROTTLE (RESP and HTTP) and CL.THROTTLE calls by result.\n# TYPE turnstile_throttle_calls_total counter"
    );
        for (result, c) in [
            ("allowed", &s.allowed),
            ("denied", &s.denied),
            ("invalid", &s.invalid),
            ("unavailable", &s.unavailable),
        ] {
            let _ = writeln!(
                out,
                "turnstile_throttle_calls_total{{result=\"{result}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
        out,
        "# HELP turnstile_resp_connections Open RESP connections.\n# TYPE turnstile_resp_connections gauge\nturnstile_resp_connections {}",
        s.resp_connections_open.load(Ordering::Relaxed)
    );
        let _ = writeln!(
        out,
        "# HELP turnstile_resp_connections_refused_total RESP connections refused at the cap.\n# TYPE turnstile_resp_connections_refused_total counter\nturnstile_resp_connections_refused_total {}",
        s.resp_connections_refused.load(Ordering::Relaxed)
    );
    }
}
