//! A mapping file, validated: which rule a statsd stat falls under, and the name and labels it
//! gets there, as statsd_exporter's `MetricMapper.GetMapping` decides (`pkg/mapper/mapper.go`).

use std::time::Duration;

use regex::Regex;

use super::glob::{Glob, Template};

/// What a stat is, for `match_metric_type` (statsd_exporter's `timer` is an `observer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Observer,
}

/// How a timer is exposed.
#[derive(Debug, Clone, PartialEq)]
pub enum Observer {
    /// Cumulative buckets with these upper bounds, ascending.
    Histogram { buckets: Vec<f64> },
    /// Quantiles over the observations of the last `max_age`, turned over in `age_buckets` steps.
    Summary {
        quantiles: Vec<f64>,
        max_age: Duration,
        age_buckets: u32,
    },
}

/// prometheus/client_golang's `DefBuckets`, statsd_exporter's default buckets.
pub(super) const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// statsd_exporter's default quantiles (`defaultQuantiles`).
pub(super) const DEFAULT_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];
/// client_golang's `DefMaxAge` and `DefAgeBuckets`, used when a summary sets none.
pub(super) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(600);
pub(super) const DEFAULT_AGE_BUCKETS: u32 = 5;

#[derive(Debug, Clone)]
pub(super) enum Matcher {
    Glob(Glob),
    Regex(Regex),
}

/// How a rule names what it matched.
#[derive(Debug, Clone)]
pub(super) enum Naming {
    /// `action: drop`: the stat is not exposed.
    Drop,
    /// A glob's templates.
    Glob {
        name: Template,
        labels: Vec<(String, Template)>,
    },
    /// A regex's expansions (`$1`, `${1}`, `$name`, as Go's `Regexp.Expand`).
    Regex {
        name: String,
        labels: Vec<(String, String)>,
    },
}

/// One validated mapping.
#[derive(Debug, Clone)]
pub(super) struct Rule {
    pub(super) matcher: Matcher,
    pub(super) metric_type: Option<MetricType>,
    pub(super) naming: Naming,
    pub(super) observer: Observer,
    pub(super) scale: Option<f64>,
    pub(super) help: Option<String>,
}

/// A mapping file's rules, in file order, and what unmapped timers become. Split on purpose:
/// matching a stat here, reading the file in `file.rs`, the reference's default in `mod.rs`.
#[derive(Debug, Clone)]
pub struct Mapper {
    pub(super) rules: Vec<Rule>,
    /// Not `glob_disable_ordering`: of the globs that match, the first in the file wins;
    /// otherwise the one with literals furthest left (statsd_exporter's FSM tries a literal
    /// component before `*`).
    pub(super) glob_ordering: bool,
    /// `defaults`: the observer of a timer no rule maps.
    pub(super) unmapped_observer: Observer,
}

/// Where a stat goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapping<'a> {
    /// A rule drops it.
    Dropped,
    /// No rule matches: statsd_exporter exposes it under its own name, escaped, with no labels.
    Unmapped { observer: &'a Observer },
    /// A rule maps it.
    Mapped {
        name: String,
        /// Sorted by name.
        labels: Vec<(String, String)>,
        observer: &'a Observer,
        scale: Option<f64>,
        help: Option<&'a str>,
    },
}

impl Mapper {
    /// The rule `stat` falls under. Globs come first, whatever their place among the regexes
    /// (statsd_exporter's FSM is searched before the regexes), chosen as `glob_ordering` says;
    /// then the first regex, unanchored, that matches with a `match_metric_type` that fits.
    pub fn map(&self, stat: &str, kind: MetricType) -> Mapping<'_> {
        let fits = |r: &Rule| r.metric_type.is_none_or(|t| t == kind);
        let mut globs = self
            .rules
            .iter()
            .filter(|r| fits(r))
            .filter_map(|r| match &r.matcher {
                Matcher::Glob(g) => g.matches(stat).map(|c| (r, g, c)),
                Matcher::Regex(_) => None,
            });
        let glob = if self.glob_ordering {
            globs.next()
        } else {
            // `max_by_key` keeps the last of equals: reversed, the first in the file.
            let all: Vec<_> = globs.collect();
            all.into_iter().rev().max_by_key(|(_, g, _)| g.literals())
        };
        let glob = glob.map(|(r, _, c)| (r, c));
        if let Some((rule, captures)) = glob {
            return rule.mapping(|naming| match naming {
                Naming::Glob { name, labels } => (
                    name.format(&captures),
                    labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.format(&captures)))
                        .collect(),
                ),
                _ => unreachable!("a glob rule names by templates"),
            });
        }
        for rule in self.rules.iter().filter(|r| fits(r)) {
            let Matcher::Regex(re) = &rule.matcher else {
                continue;
            };
            let Some(caps) = re.captures(stat) else {
                continue;
            };
            return rule.mapping(|naming| match naming {
                Naming::Regex { name, labels } => {
                    let expand = |t: &str| {
                        let mut out = String::new();
                        caps.expand(t, &mut out);
                        out
                    };
                    (
                        expand(name),
                        labels.iter().map(|(k, v)| (k.clone(), expand(v))).collect(),
                    )
                }
                _ => unreachable!("a regex rule names by expansions"),
            });
        }
        Mapping::Unmapped {
            observer: &self.unmapped_observer,
        }
    }
}

impl Rule {
    fn mapping(
        &self,
        names: impl FnOnce(&Naming) -> (String, Vec<(String, String)>),
    ) -> Mapping<'_> {
        if matches!(self.naming, Naming::Drop) {
            return Mapping::Dropped;
        }
        let (name, mut labels) = names(&self.naming);
        labels.sort();
        Mapping::Mapped {
            name,
            labels,
            observer: &self.observer,
            scale: self.scale,
            help: self.help.as_deref(),
        }
    }
}

/// statsd_exporter's `EscapeMetricName`: every character but `[a-zA-Z0-9_]` becomes `_` (a
/// second `-` in a row is dropped), and a leading digit gets a `_` before it.
pub fn escape_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut prev = '\0';
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && prev == '-') {
            out.push('_');
        }
        prev = c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_statsd_exporter() {
        // statsd_exporter's escape_test.go.
        for (from, to) in [
            ("clean", "clean"),
            ("0starts_with_digit", "_0starts_with_digit"),
            ("with_underscore", "with_underscore"),
            ("with--doubledash", "with_doubledash"),
            ("with---multiple-dashes", "with_multiple_dashes"),
            ("with.dot", "with_dot"),
            ("with😱emoji", "with_emoji"),
            ("with.*.multiple", "with___multiple"),
            ("test.web-server.foo.bar", "test_web_server_foo_bar"),
        ] {
            assert_eq!(escape_name(from), to, "{from}");
        }
        assert_eq!(escape_name(""), "");
    }
}
