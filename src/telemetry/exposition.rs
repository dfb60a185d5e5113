//! What a part that counts gives the exporters: its families in Prometheus text, and its
//! stats under statsd names. Each part implements [`Metrics`] in its own module and is
//! registered once at start ([`super::Registry`]); the Prometheus text and the statsd push loop
//! over the parts and name none of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Histogram, Shown};

/// A part's stats as the exporters read them. Reading is a relaxed load per stat: the
/// parts count with atomics of their own, so nothing here is on the request path.
pub trait Metrics: Send + Sync {
    /// Appends the part's families (HELP, TYPE, series) in Prometheus text.
    fn render(&self, out: &mut String);

    /// As [`Metrics::render`], for a port that shows client values as `shown`. A part whose
    /// series carry a value a client sent (RLQS's bucket values) renders them through `shown`
    /// here, and as digests in `render`; the others render the same on every port.
    fn render_for(&self, out: &mut String, _shown: Shown) {
        self.render(out);
    }

    /// Adds the part's counters and timers as envoyproxy/ratelimit pushes them to statsd; most
    /// parts push nothing.
    fn push(&self, _out: &mut Pushed) {}
}

/// What one statsd flush reads: counter totals by name (summed when names meet, as gostats
/// keeps one counter per name) and timers as histogram bucket counts.
#[derive(Debug, Default)]
pub struct Pushed {
    pub(super) counters: BTreeMap<String, u64>,
    pub(super) timers: BTreeMap<&'static str, Timed>,
}

/// A timer's observations so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Timed {
    /// In each of [`super::histogram::BUCKETS_US`], `+Inf` last (not cumulative).
    pub(super) buckets: Vec<u64>,
    /// The time they took in all.
    pub(super) sum_ns: u64,
}

impl Pushed {
    /// Adds `v` to the counter `name`.
    pub fn add(&mut self, name: String, v: u64) {
        *self.counters.entry(name).or_insert(0) += v;
    }

    /// The timer `name`, as `h`'s buckets hold it now.
    pub fn timer(&mut self, name: &'static str, h: &Histogram) {
        let timed = Timed {
            buckets: h.bucket_counts(),
            sum_ns: h.sum_ns(),
        };
        self.timers.insert(name, timed);
    }
}

/// A family's HELP and TYPE lines.
pub fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One unlabelled series with its HELP and TYPE lines.
pub fn single(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    family(out, name, help, kind);
    let _ = writeln!(out, "{name} {v}");
}

/// A label value escaped as the text format wants it.
pub fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
