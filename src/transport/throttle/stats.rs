//! Stats of the RESP transport's connections: open now, and refused at the cap.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::exposition::{single, Metrics};

#[derive(Debug, Default)]
pub struct RespStats {
    open: AtomicU64,
    /// Connections turned away at the cap.
    refused: AtomicU64,
}

impl RespStats {
    pub(super) fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }
}

impl Metrics for RespStats {
    fn render(&self, out: &mut String) {
        single(
            out,
            "turnstile_resp_connections",
            "Open RESP connections.",
            "gauge",
            self.open.load(Ordering::Relaxed),
        );
        single(
            out,
            "turnstile_resp_connections_refused_total",
            "RESP connections refused at the cap.",
            "counter",
            self.refused.load(Ordering::Relaxed),
        );
    }
}
