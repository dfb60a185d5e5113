//! Stats of the durable counters (`Journal`): saves, failed writes, damaged files, keys read
//! back at start, and the state's size on disk; rendered from here. The families keep the
//! names they were published with, where a save is a "sync" (`turnstile_state_syncs_total`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::telemetry::Metrics;

#[derive(Debug, Default)]
pub struct StateStats {
    /// Whether a state dir is in use: without one nothing is rendered.
    on: std::sync::atomic::AtomicBool,
    saves: AtomicU64,
    snapshots: AtomicU64,
    save_errors: AtomicU64,
    saved_keys: AtomicU64,
    damaged_files: AtomicU64,
    restored_keys: AtomicU64,
    disk_bytes: AtomicU64,
    last_save_ns: AtomicU64,
}

impl StateStats {
    pub fn restored(&self, keys: u64) {
        self.on.store(true, Ordering::Relaxed);
        self.restored_keys.store(keys, Ordering::Relaxed);
    }

    pub fn damaged(&self) {
        self.damaged_files.fetch_add(1, Ordering::Relaxed);
    }

    pub fn failed(&self) {
        self.save_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A save written: `keys` states, the state now `disk_bytes` on disk; `snapshot` when it
    /// was every key.
    pub fn saved(&self, keys: u64, disk_bytes: u64, snapshot: bool, took: Duration) {
        self.saves.fetch_add(1, Ordering::Relaxed);
        if snapshot {
            self.snapshots.fetch_add(1, Ordering::Relaxed);
        }
        self.saved_keys.fetch_add(keys, Ordering::Relaxed);
        self.disk_bytes.store(disk_bytes, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.last_save_ns.store(ns, Ordering::Relaxed);
    }
}

impl Metrics for StateStats {
    /// The families, when a state dir is in use.
    fn render(&self, out: &mut String) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let series: [(&str, &str, &str, String); 8] = [
            (
                "turnstile_state_syncs_total",
                "counter",
                "Syncs of the durable counters written to the state dir (snapshots included).",
                load(&self.saves).to_string(),
            ),
            (
                "turnstile_state_snapshots_total",
                "counter",
                "Syncs that wrote every key as a new snapshot.",
                load(&self.snapshots).to_string(),
            ),
            (
                "turnstile_state_sync_errors_total",
                "counter",
                "Syncs that could not be written (the next one writes every key).",
                load(&self.save_errors).to_string(),
            ),
            (
                "turnstile_state_saved_keys_total",
                "counter",
                "Key states written to the state dir.",
                load(&self.saved_keys).to_string(),
            ),
            (
                "turnstile_state_damaged_files_total",
                "counter",
                "State files found damaged at start, set aside.",
                load(&self.damaged_files).to_string(),
            ),
            (
                "turnstile_state_restored_keys",
                "gauge",
                "Keys read back from the state dir at start.",
                load(&self.restored_keys).to_string(),
            ),
            (
                "turnstile_state_disk_bytes",
                "gauge",
                "Bytes of the current snapshot and its log.",
                load(&self.disk_bytes).to_string(),
            ),
            (
                "turnstile_state_last_sync_seconds",
                "gauge",
                "How long the last sync took to write and sync.",
                format!("{}", load(&self.last_save_ns) as f64 / 1e9),
            ),
        ];
        for (name, kind, help, value) in series {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }
}
