//! The trace exporter as turnstile runs it: every failed export (a collector down, refused or
//! unreachable) is logged, at most one line per [`EVERY`] with the count of failures since the
//! last, so an outage of the collector neither goes unseen nor floods the log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

/// At most one line about failed exports this often.
const EVERY: Duration = Duration::from_secs(10);

/// An exporter whose failures are logged.
#[derive(Debug)]
pub(super) struct Logged<E> {
    inner: E,
    failures: Failures,
}

impl<E> Logged<E> {
    pub(super) fn new(inner: E) -> Logged<E> {
        Logged {
            inner,
            failures: Failures::default(),
        }
    }
}

impl<E: SpanExporter> SpanExporter for Logged<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let r = self.inner.export(batch).await;
        if let Err(e) = &r {
            if let Some(failures) = self.failures.failed(Instant::now()) {
                tracing::warn!(
                    error = %e,
                    spans,
                    failures,
                    "trace export failed; the batch's spans are lost (failures: since the last such line)"
                );
            }
        }
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Failed exports, and when one was last logged.
#[derive(Debug, Default)]
struct Failures(Mutex<Unlogged>);

/// The failures not logged yet, and when the last line was.
#[derive(Debug, Default)]
struct Unlogged {
    last: Option<Instant>,
    count: u64,
}

impl Failures {
    /// Counts a failure at `now`; the failures to log (this one included) when a line is due.
    fn failed(&self, now: Instant) -> Option<u64> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Unlogged { last, count } = &mut *g;
        *count += 1;
        if last.is_some_and(|at| now.duration_since(at) < EVERY) {
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_failures_since() {
        let f = Failures::default();
        let t0 = Instant::now();
        assert_eq!(f.failed(t0), Some(1));
        assert_eq!(f.failed(t0 + Duration::from_secs(1)), None);
        assert_eq!(f.failed(t0 + Duration::from_secs(9)), None);
        assert_eq!(f.failed(t0 + EVERY), Some(3));
        assert_eq!(f.failed(t0 + EVERY + Duration::from_secs(1)), None);
    }
}
