//! envoyproxy/ratelimit's Prometheus series: its statsd stats (the names the statsd push sends)
//! turned into Prometheus families by statsd_exporter's mapping rules, from
//! `PROMETHEUS_MAPPER_YAML` or the reference's embedded default mapping.
//!
//! The reference feeds each statsd flush into statsd_exporter's exporter in process
//! (`src/stats/prom/prometheus_sink.go`), where counters add up for ever: here the scrape reads
//! the live cumulative counters instead, so it needs no flush. A counter that is still zero has
//! no series (gostats never flushes it, so the exporter never sees it). A timer's observations
//! are whole milliseconds, as the reference records `response_time`, times the mapping's
//! `scale`; each stands at the top of its bucket of the latency histogram (`BUCKETS_US`), and
//! the sum is the exact time.

mod families;
mod file;
mod glob;
mod locate;
mod rules;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::exposition::Timed;
use super::histogram::BUCKETS_US;
use super::Registry;
use families::{Families, Points, Value, DEFAULT_HELP};
pub use rules::{escape_name, Mapper, Mapping, MetricType, Observer};

/// The reference's embedded mapping, `src/stats/prom/default_mapper.yaml` of
/// envoyproxy/ratelimit (Apache-2.0), copied from commit
/// f2fb15770f7fd1c88ca6c3a1b58ee513917ace96 (the file as changed by 6b266b0, #1104).
pub const DEFAULT_MAPPING: &str = include_str!("default_mapper.yaml");

/// The line `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true` takes out of the default mapping,
/// as the reference does (`mapperConfig`).
const SCALE_LINE: &str = "    scale: 0.001\n";

impl Mapper {
    /// The reference's default mapping; with `response_time_ms`, `response_time` left in
    /// milliseconds.
    pub fn default_mapping(response_time_ms: bool) -> Mapper {
        let text = if response_time_ms {
            DEFAULT_MAPPING.replacen(SCALE_LINE, "", 1)
        } else {
            DEFAULT_MAPPING.to_owned()
        };
        Mapper::parse(&text, "the default mapping").expect("the embedded mapping is valid")
    }

    /// `PROMETHEUS_MAPPER_YAML`: the file at `path`; an error names it (and the line).
    pub fn from_file(path: &std::path::Path) -> Result<Mapper, String> {
        let origin = format!("PROMETHEUS_MAPPER_YAML={}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| format!("{origin}: {e}"))?;
        Mapper::parse(&text, &origin)
    }
}

/// The Prometheus port's exposition: every part's statsd stats through the mapper at each
/// scrape. A cheap `Clone` handle.
#[derive(Clone)]
pub struct Exposition {
    mapper: Arc<Mapper>,
    registry: Registry,
    windows: Arc<Mutex<Windows>>,
}

impl std::fmt::Debug for Exposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposition").finish_non_exhaustive()
    }
}

impl Exposition {
    /// The exposition of `registry` through `mapper`, its summaries' windows starting `now`.
    pub fn new(mapper: Mapper, registry: Registry, now: Instant) -> Exposition {
        Exposition {
            mapper: Arc::new(mapper),
            registry,
            windows: Arc::new(Mutex::new(Windows {
                start: now,
                by_stat: HashMap::new(),
            })),
        }
    }

    /// The text exposition at `now`.
    pub fn render(&self, now: Instant) -> String {
        let pushed = self.registry.pushed();
        let mut families = Families::default();
        for (stat, &v) in &pushed.counters {
            if v == 0 {
                continue;
            }
            self.add(&mut families, stat, MetricType::Counter, |scale, _| {
                Value::Counter(v as f64 * scale)
            });
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (stat, timed) in &pushed.timers {
            if timed.buckets.iter().all(|&n| n == 0) {
                continue;
            }
            self.add(&mut families, stat, MetricType::Observer, |scale, o| {
                let window = match o {
                    Some(Observer::Summary {
                        max_age,
                        age_buckets,
                        ..
                    }) => windows.window(stat, now, &timed.buckets, *max_age, *age_buckets),
                    _ => Vec::new(),
                };
                observed(timed, &window, scale)
            });
        }
        families.render()
    }

    /// Maps `stat` and adds what `value` makes of it (given the scale and the observer).
    fn add(
        &self,
        families: &mut Families,
        stat: &str,
        kind: MetricType,
        value: impl FnOnce(f64, Option<&Observer>) -> Value,
    ) {
        let observer = |o| (kind == MetricType::Observer).then_some(o);
        match self.mapper.map(stat, kind) {
            Mapping::Dropped => {}
            Mapping::Unmapped { observer: o } => {
                let o = observer(o);
                families.add(
                    escape_name(stat),
                    Vec::new(),
                    DEFAULT_HELP,
                    o,
                    value(1.0, o),
                );
            }
            Mapping::Mapped {
                name,
                labels,
                observer: o,
                scale,
                help,
            } => {
                if name.is_empty() {
                    return;
                }
                let o = observer(o);
                let v = value(scale.unwrap_or(1.0), o);
                families.add(
                    escape_name(&name),
                    labels,
                    help.unwrap_or(DEFAULT_HELP),
                    o,
                    v,
                );
            }
        }
    }
}

/// A timer's observations at the tops of their buckets, in whole milliseconds, times `scale`:
/// all of them, and those of the summary's window.
fn observed(timed: &Timed, window: &[u64], scale: f64) -> Value {
    let at = |counts: &[u64]| -> Points {
        counts
            .iter()
            .enumerate()
            .map(|(i, &n)| (bucket_ms(i) * scale, n))
            .collect()
    };
    Value::Observed {
        all: at(&timed.buckets),
        window: at(window),
        sum: timed.sum_ns as f64 / 1e6 * scale,
        count: timed.buckets.iter().sum(),
    }
}

/// The top of bucket `i` in whole milliseconds (the reference truncates `response_time` to
/// them); the `+Inf` bucket stands at twice the last bound, as the statsd push sends it.
fn bucket_ms(i: usize) -> f64 {
    let us = BUCKETS_US
        .get(i)
        .copied()
        .unwrap_or(BUCKETS_US[BUCKETS_US.len() - 1] * 2);
    (us / 1000) as f64
}

/// Each timer's bucket counts as they were at past scrapes, so a summary covers about its
/// `max_age` (client_golang turns a summary's window over in `age_buckets` steps).
struct Windows {
    /// When the counts were all zero.
    start: Instant,
    /// At most `age_buckets + 1` snapshots a timer, oldest first.
    by_stat: HashMap<&'static str, VecDeque<Snapshot>>,
}

/// A timer's bucket counts at one scrape.
struct Snapshot {
    at: Instant,
    counts: Vec<u64>,
}

impl Windows {
    /// The observations of `stat` within about `max_age` of `now`.
    fn window(
        &mut self,
        stat: &'static str,
        now: Instant,
        counts: &[u64],
        max_age: Duration,
        age_buckets: u32,
    ) -> Vec<u64> {
        let start = self.start;
        let snaps = self.by_stat.entry(stat).or_insert_with(|| {
            let counts = vec![0; counts.len()];
            VecDeque::from([Snapshot { at: start, counts }])
        });
        let step = max_age / age_buckets.max(1);
        let age = |t: Instant| now.saturating_duration_since(t);
        while snaps.len() > 1 && age(snaps[0].at) > max_age {
            snaps.pop_front();
        }
        let base = snaps.front().map(|s| s.counts.clone()).unwrap_or_default();
        if snaps.back().is_none_or(|s| age(s.at) >= step) {
            let (at, counts) = (now, counts.to_vec());
            snaps.push_back(Snapshot { at, counts });
            if snaps.len() > age_buckets as usize + 1 {
                snaps.pop_front();
            }
        }
        (counts.iter().enumerate())
            .map(|(i, &n)| n.saturating_sub(base.get(i).copied().unwrap_or(0)))
            .collect()
    }
}

#[cfg(test)]
mod tests;
