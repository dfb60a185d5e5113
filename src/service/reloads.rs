//! Stats of config loads, and the last loads, from files or xDS, as the status page shows
//! them: which source, when, and the error when one was refused. A load that goes live replaces
//! the live limits (`live`); `server::reload` records each, the status page reads them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::telemetry::exposition::{single, Metrics, Pushed};

/// One config load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigLoad {
    /// A path, or "xDS".
    pub source: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// Why the config was refused (the previous one stayed live); none when it went live.
    pub error: Option<String>,
}

/// Config loads: how many went live or were refused, when the live one was loaded, and the
/// last ones.
#[derive(Debug, Default)]
pub struct ReloadStats {
    success: AtomicU64,
    error: AtomicU64,
    /// Seconds since the Unix epoch of the last config load that succeeded.
    loaded_at: AtomicU64,
    /// What the last config loads did, for the status page.
    pub log: ReloadLog,
}

impl ReloadStats {
    /// Counts a successful config load now.
    pub fn loaded(&self) {
        self.success.fetch_add(1, Ordering::Relaxed);
        self.loaded_at.store(unix_now(), Ordering::Relaxed);
    }

    /// Counts a refused config load.
    pub fn refused(&self) {
        self.error.fetch_add(1, Ordering::Relaxed);
    }

    /// Config loads that went live and that were refused, so far.
    pub fn counts(&self) -> (u64, u64) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (load(&self.success), load(&self.error))
    }
}

impl Metrics for ReloadStats {
    fn render(&self, out: &mut String) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, help, kind, c) in [
            (
                "ratelimit_service_config_load_success_total",
                "Config loads that succeeded.",
                "counter",
                &self.success,
            ),
            (
                "ratelimit_service_config_load_error_total",
                "Config loads that failed (the old config stayed live).",
                "counter",
                &self.error,
            ),
            (
                "ratelimit_service_config_last_load_success_timestamp_seconds",
                "When the live config was loaded.",
                "gauge",
                &self.loaded_at,
            ),
        ] {
            single(out, name, help, kind, load(c));
        }
    }

    fn push(&self, out: &mut Pushed) {
        let (success, error) = self.counts();
        out.add("ratelimit.service.config_load_success".into(), success);
        out.add("ratelimit.service.config_load_error".into(), error);
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The last load that went live and the last attempt, whatever its result.
#[derive(Debug, Default)]
pub struct ReloadLog {
    last: Mutex<LastLoads>,
}

/// What [`ReloadLog`] keeps.
#[derive(Debug, Default, Clone)]
pub struct LastLoads {
    /// The last load that went live.
    pub live: Option<ConfigLoad>,
    /// The last attempt, whatever its result.
    pub attempt: Option<ConfigLoad>,
}

impl ReloadLog {
    /// Records a load from `source` at `at` (Unix seconds): live, or refused with `error`.
    pub fn record(&self, source: &str, at: u64, error: Option<String>) {
        let load = ConfigLoad {
            source: source.to_owned(),
            at,
            error,
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if load.error.is_none() {
            last.live = Some(load.clone());
        }
        last.attempt = Some(load);
    }

    /// Records a load from `source` now.
    pub fn record_now(&self, source: &str, error: Option<String>) {
        self.record(source, unix_now(), error);
    }

    /// The last load that went live, and the last attempt.
    pub fn last(&self) -> LastLoads {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_load_is_the_last_attempt_and_the_live_one_stays() {
        let log = ReloadLog::default();
        log.record("a.yaml", 1, None);
        log.record("a.yaml", 2, Some("bad unit".into()));
        let LastLoads { live, attempt } = log.last();
        assert_eq!(live.map(|l| l.at), Some(1));
        assert_eq!(attempt.and_then(|l| l.error), Some("bad unit".into()));
    }
}
