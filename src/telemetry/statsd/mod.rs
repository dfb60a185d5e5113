//! envoyproxy/ratelimit's statsd and DogStatsD stats, pushed beside the Prometheus exposition.
//!
//! The reference counts with lyft/gostats and flushes every `STATS_FLUSH_INTERVAL`: each counter
//! as the change since its last flush, skipped when zero (`stats.go`, `statStore.Flush`). Here the
//! counters are the same atomics Prometheus reads, each part naming its own
//! (`telemetry::Metrics::push`); [`Exporter`] remembers what it last sent and writes the
//! differences, under the reference's names (`stats/manager_impl.go`, `metrics/metrics.go`). The push runs on the admin runtime: the request path never waits on it.

mod send;
mod wire;

use std::collections::BTreeMap;
use std::time::Duration;

use regex::Regex;

use super::exposition::Pushed;
use super::histogram::BUCKETS_US;
use super::Registry;

pub use super::push_stats::StatsdStats;
pub use send::{run, Sink};
pub use wire::{sanitize, tag_value, Format, Kind, UDP_PACKET};

/// How statsd is reached (gostats' `STATSD_PROTOCOL`, default `tcp`; DogStatsD is UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Udp,
    Tcp,
}

/// `USE_STATSD` or `USE_DOG_STATSD` and their settings.
#[derive(Debug, Clone)]
pub struct StatsdSettings {
    /// `STATSD_HOST` (localhost), resolved at every flush that needs a connection.
    pub host: String,
    /// `STATSD_PORT` (8125).
    pub port: u16,
    pub protocol: Protocol,
    /// `USE_DOG_STATSD`: DogStatsD tags, and the mogrifiers named by `USE_DOG_STATSD_MOGRIFIERS`.
    pub dog: Option<Vec<Mogrifier>>,
    /// `EXTRA_TAGS`, sorted by key, values cleaned as gostats cleans them.
    pub extra_tags: Vec<(String, String)>,
    /// `STATS_FLUSH_INTERVAL` (10s).
    pub flush_interval: Duration,
}

impl StatsdSettings {
    /// How lines are written: DogStatsD's tags, or gostats' names with tags folded in.
    pub fn format(&self) -> Format<'_> {
        match &self.dog {
            Some(mogrifiers) => Format::Dog {
                tags: &self.extra_tags,
                mogrifiers,
            },
            None => Format::Statsd {
                tags: &self.extra_tags,
            },
        }
    }
}

/// One of `USE_DOG_STATSD_MOGRIFIERS` (`godogstats/mogrifier_map.go`): names matching `pattern`
/// are renamed to `name` and tagged with `tags`, `$N` standing for the N-th submatch.
#[derive(Debug, Clone)]
pub struct Mogrifier {
    pub pattern: Regex,
    pub name: String,
    /// Sorted by key (the reference's order is Go's random map order).
    pub tags: Vec<(String, String)>,
}

/// The first mogrifier matching `name` rewrites it (`mogrifierMap.mogrify`); otherwise it is
/// left alone with no tags.
pub(crate) fn mogrify(mogrifiers: &[Mogrifier], name: &str) -> (String, Vec<(String, String)>) {
    for m in mogrifiers {
        let Some(caps) = m.pattern.captures(name) else {
            continue;
        };
        let groups: Vec<&str> = caps.iter().map(|g| g.map_or("", |g| g.as_str())).collect();
        let tags = m
            .tags
            .iter()
            .map(|(k, v)| (k.clone(), substitute(v, &groups)))
            .collect();
        return (substitute(&m.name, &groups), tags);
    }
    (name.to_owned(), Vec::new())
}

/// `makePatternHandler`: each `$N` becomes submatch N; a `$N` past the last stays as it is.
fn substitute(pattern: &str, groups: &[&str]) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut rest = pattern;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let group = after[..digits].parse::<usize>().ok();
        match group.and_then(|i| groups.get(i)) {
            Some(g) => out.push_str(g),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// What the push has sent, so each flush sends changes; and what it has failed to send.
#[derive(Debug, Default)]
pub struct Exporter {
    /// Counter values at the last flush, by name; only names the live config still has.
    sent: BTreeMap<String, u64>,
    /// Each timer's bucket counts at the last flush.
    sent_buckets: BTreeMap<&'static str, Vec<u64>>,
}

/// Packets and what sending them would commit.
#[derive(Debug)]
pub struct Flush {
    pub lines: Vec<String>,
    counters: BTreeMap<String, u64>,
    buckets: BTreeMap<&'static str, Vec<u64>>,
}

impl Exporter {
    /// Every counter's change since the last committed flush, and the timers'.
    pub fn collect(&self, format: Format<'_>, all: &Registry) -> Flush {
        let Pushed { counters, timers } = all.pushed();
        let mut lines = Vec::new();
        for (name, &v) in &counters {
            let before = self.sent.get(name).copied().unwrap_or(0);
            // A counter below what was sent is a new one under an old name: send it whole.
            let delta = if v >= before { v - before } else { v };
            if delta > 0 {
                let mut line = String::new();
                format.line(&mut line, name, Kind::Counter, delta as f64);
                lines.push(line);
            }
        }
        for (name, timed) in &timers {
            let sent = self.sent_buckets.get(name).map_or(&[][..], Vec::as_slice);
            timer_lines(&mut lines, format, name, &timed.buckets, sent);
        }
        Flush {
            lines,
            counters,
            buckets: timers.into_iter().map(|(n, t)| (n, t.buckets)).collect(),
        }
    }

    /// The flush was sent: the next one sends changes from here.
    pub fn commit(&mut self, flush: Flush) {
        self.sent = flush.counters;
        self.sent_buckets = flush.buckets;
    }
}

/// A timer's observations since `sent`, one line per bucket that saw any, standing for them at
/// the bucket's upper bound.
fn timer_lines(
    lines: &mut Vec<String>,
    format: Format<'_>,
    name: &str,
    buckets: &[u64],
    sent: &[u64],
) {
    for (i, &n) in buckets.iter().enumerate() {
        let before = sent.get(i).copied().unwrap_or(0);
        let seen = n.saturating_sub(before);
        if seen > 0 {
            let ms = *BUCKETS_US
                .get(i)
                .unwrap_or(&(BUCKETS_US[BUCKETS_US.len() - 1] * 2)) as f64
                / 1000.0;
            let kind = Kind::Timer {
                rate: 1.0 / seen as f64,
            };
            let mut line = String::new();
            format.line(&mut line, name, kind, ms);
            lines.push(line);
        }
    }
}

#[cfg(test)]
mod tests;
