//! A statsd_exporter mapping file read into [`Mapper`]: the keys and values statsd_exporter
//! v0.26 (the version envoyproxy/ratelimit embeds) accepts, checked as its `InitFromYAMLString`
//! checks them, and every key turnstile does not support refused with its line.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::glob::{Glob, Template};
use super::locate::line_of;
use super::rules::{
    Mapper, Matcher, MetricType, Naming, Observer, Rule, DEFAULT_AGE_BUCKETS, DEFAULT_BUCKETS,
    DEFAULT_MAX_AGE, DEFAULT_QUANTILES,
};
use crate::config::grammar::parse_duration;
use crate::config::{go_regex, yaml_options};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    #[serde(default)]
    defaults: DefaultsYaml,
    #[serde(default)]
    mappings: Vec<MappingYaml>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DefaultsYaml {
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    quantiles: Option<Vec<ObjectiveYaml>>,
    match_type: Option<String>,
    glob_disable_ordering: Option<bool>,
    ttl: Option<String>,
    #[serde(default)]
    summary_options: SummaryYaml,
    #[serde(default)]
    histogram_options: HistogramYaml,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MappingYaml {
    #[serde(rename = "match", default)]
    pattern: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// No effect: turnstile's stats carry no labels of their own to honour.
    #[allow(dead_code)]
    honor_labels: Option<bool>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    quantiles: Option<Vec<ObjectiveYaml>>,
    match_type: Option<String>,
    help: Option<String>,
    action: Option<String>,
    match_metric_type: Option<String>,
    ttl: Option<String>,
    summary_options: Option<SummaryYaml>,
    histogram_options: Option<HistogramYaml>,
    scale: Option<f64>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct SummaryYaml {
    quantiles: Option<Vec<ObjectiveYaml>>,
    max_age: Option<String>,
    age_buckets: Option<u32>,
    /// client_golang's stream buffer; quantiles here are computed exactly, without one.
    #[allow(dead_code)]
    buf_cap: Option<u32>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct HistogramYaml {
    buckets: Option<Vec<f64>>,
    native_histogram_bucket_factor: Option<f64>,
    native_histogram_max_buckets: Option<u32>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct ObjectiveYaml {
    quantile: f64,
    /// The error client_golang's estimate may make; quantiles here are computed exactly.
    #[allow(dead_code)]
    error: f64,
}

/// Where an error is, for [`line_of`]: a key of `defaults`, or of the N-th mapping.
enum At {
    Defaults(&'static str),
    Mapping(usize, &'static str),
}

impl Mapper {
    /// Reads a mapping file's text; an error names `origin` and the line.
    pub fn parse(text: &str, origin: &str) -> Result<Mapper, String> {
        let file: FileYaml = serde_saphyr::from_str_with_options(text, yaml_options())
            .map_err(|e| format!("{origin}: {e}"))?;
        file.validate().map_err(|(at, msg)| {
            let line = match at {
                At::Defaults(key) => line_of(text, None, key),
                At::Mapping(i, key) => line_of(text, Some(i), key),
            };
            match (line, at) {
                (Some(l), At::Mapping(i, _)) => format!("{origin}: line {l}: mappings[{i}]: {msg}"),
                (Some(l), At::Defaults(_)) => format!("{origin}: line {l}: defaults: {msg}"),
                (None, At::Mapping(i, _)) => format!("{origin}: mappings[{i}]: {msg}"),
                (None, At::Defaults(_)) => format!("{origin}: defaults: {msg}"),
            }
        })
    }
}

type Located<T> = Result<T, (At, String)>;

/// The defaults a mapping falls back on.
struct Defaults {
    glob_ordering: bool,
    observer: Option<String>,
    regex: bool,
    buckets: Vec<f64>,
    quantiles: Vec<f64>,
    max_age: Duration,
    age_buckets: u32,
}

impl FileYaml {
    fn validate(self) -> Located<Mapper> {
        let d = self.defaults.validate()?;
        let rules = (self.mappings.into_iter().enumerate())
            .map(|(i, m)| {
                m.validate(&d)
                    .map_err(|(key, msg)| (At::Mapping(i, key), msg))
            })
            .collect::<Located<Vec<Rule>>>()?;
        let unmapped_observer = observer(d.observer.as_deref(), &d, None, None)
            .map_err(|msg| (At::Defaults("observer_type"), msg))?;
        Ok(Mapper {
            rules,
            glob_ordering: d.glob_ordering,
            unmapped_observer,
        })
    }
}

impl DefaultsYaml {
    fn validate(self) -> Located<Defaults> {
        let at = |key| move |msg| (At::Defaults(key), msg);
        if self.ttl.as_deref().is_some_and(|t| t != "0" && t != "0s") {
            return Err(at("ttl")(TTL.into()));
        }
        native(&self.histogram_options).map_err(at("histogram_options"))?;
        let observer = self.observer_type.or(self.timer_type);
        if let Some(o) = &observer {
            observer_kind(o).map_err(at("observer_type"))?;
        }
        let regex = match self.match_type.as_deref() {
            None => false,
            Some(m) => match_kind(m).map_err(at("match_type"))?,
        };
        let buckets = (self.histogram_options.buckets)
            .filter(|b| !b.is_empty())
            .or(self.buckets.filter(|b| !b.is_empty()))
            .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec());
        check_buckets(&buckets).map_err(at("buckets"))?;
        let summary = self.summary_options;
        let quantiles = (summary.quantiles.filter(|q| !q.is_empty()))
            .or(self.quantiles.filter(|q| !q.is_empty()))
            .map(|q| q.iter().map(|o| o.quantile).collect::<Vec<_>>())
            .unwrap_or_else(|| DEFAULT_QUANTILES.to_vec());
        check_quantiles(&quantiles).map_err(at("quantiles"))?;
        let max_age = match summary.max_age.as_deref() {
            None => DEFAULT_MAX_AGE,
            Some(t) => parse_duration(t).map_err(at("summary_options"))?,
        };
        Ok(Defaults {
            glob_ordering: !self.glob_disable_ordering.unwrap_or(false),
            observer,
            regex,
            buckets,
            quantiles,
            max_age: nonzero(max_age, DEFAULT_MAX_AGE),
            age_buckets: summary
                .age_buckets
                .filter(|&n| n > 0)
                .unwrap_or(DEFAULT_AGE_BUCKETS),
        })
    }
}

const TTL: &str = "ttl is not supported: turnstile's series are its live counters, which do not \
                   expire";

impl MappingYaml {
    fn validate(self, d: &Defaults) -> Result<Rule, (&'static str, String)> {
        if self.ttl.as_deref().is_some_and(|t| t != "0" && t != "0s") {
            return Err(("ttl", TTL.into()));
        }
        if let Some(h) = &self.histogram_options {
            native(h).map_err(|m| ("histogram_options", m))?;
        }
        for k in self.labels.keys() {
            let ok = k.len() >= 2
                && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(("labels", format!("invalid label name \"{k}\"")));
            }
        }
        if self.name.is_empty() {
            return Err(("match", "the mapping sets no metric name (name:)".into()));
        }
        check_name(&self.name).map_err(|m| ("name", m))?;
        let regex = match self.match_type.as_deref() {
            None => d.regex,
            Some(m) => match_kind(m).map_err(|e| ("match_type", e))?,
        };
        let metric_type = (self.match_metric_type.as_deref())
            .map(metric_kind)
            .transpose()
            .map_err(|e| ("match_metric_type", e))?;
        let drop = match self.action.as_deref() {
            None | Some("") | Some("map") => false,
            Some("drop") => true,
            Some(a) => return Err(("action", format!("invalid action \"{a}\" (map or drop)"))),
        };
        let labels = self.labels.into_iter();
        let (matcher, naming) = if regex {
            let re = go_regex::compile(&self.pattern)
                .map_err(|e| ("match", format!("invalid regex \"{}\": {e}", self.pattern)))?;
            let naming = Naming::Regex {
                name: self.name,
                labels: labels.collect(),
            };
            (Matcher::Regex(re), naming)
        } else {
            let glob = Glob::parse(&self.pattern).map_err(|e| ("match", e))?;
            let n = glob.captures();
            let naming = Naming::Glob {
                name: Template::new(&self.name, n),
                labels: labels.map(|(k, v)| (k, Template::new(&v, n))).collect(),
            };
            (Matcher::Glob(glob), naming)
        };
        let kind = self
            .observer_type
            .or(self.timer_type)
            .or(d.observer.clone());
        let observer = observer(
            kind.as_deref(),
            d,
            self.histogram_options.map(|h| (h, self.buckets)),
            self.summary_options.map(|s| (s, self.quantiles)),
        )
        .map_err(|m| ("observer_type", m))?;
        Ok(Rule {
            matcher,
            metric_type,
            naming: if drop { Naming::Drop } else { naming },
            observer,
            scale: self.scale,
            help: self.help,
        })
    }
}

/// A timer's observer: the kind named (a summary when none is), its options over the defaults.
fn observer(
    kind: Option<&str>,
    d: &Defaults,
    histogram: Option<(HistogramYaml, Option<Vec<f64>>)>,
    summary: Option<(SummaryYaml, Option<Vec<ObjectiveYaml>>)>,
) -> Result<Observer, String> {
    if histogram
        .as_ref()
        .is_some_and(|(h, l)| h.buckets.is_some() && l.is_some())
    {
        return Err("buckets are set both at the top and in histogram_options".into());
    }
    if summary
        .as_ref()
        .is_some_and(|(s, l)| s.quantiles.is_some() && l.is_some())
    {
        return Err("quantiles are set both at the top and in summary_options".into());
    }
    let is_histogram = match kind {
        None => false,
        Some(k) => observer_kind(k)?,
    };
    if is_histogram {
        if summary
            .as_ref()
            .is_some_and(|(s, _)| s.quantiles.is_some() || s.max_age.is_some())
        {
            return Err("a histogram cannot take summary_options".into());
        }
        let buckets = histogram
            .and_then(|(h, legacy)| h.buckets.filter(|b| !b.is_empty()).or(legacy))
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| d.buckets.clone());
        check_buckets(&buckets)?;
        return Ok(Observer::Histogram { buckets });
    }
    if histogram.as_ref().is_some_and(|(h, _)| h.buckets.is_some()) {
        return Err("a summary cannot take histogram_options".into());
    }
    let (opts, legacy) = summary.unwrap_or_default();
    let quantiles = (opts.quantiles.filter(|q| !q.is_empty()))
        .or(legacy.filter(|q| !q.is_empty()))
        .map(|q| q.iter().map(|o| o.quantile).collect())
        .unwrap_or_else(|| d.quantiles.clone());
    check_quantiles(&quantiles)?;
    let max_age = match opts.max_age.as_deref() {
        None => d.max_age,
        Some(t) => nonzero(parse_duration(t)?, d.max_age),
    };
    Ok(Observer::Summary {
        quantiles,
        max_age,
        age_buckets: opts.age_buckets.filter(|&n| n > 0).unwrap_or(d.age_buckets),
    })
}

fn nonzero(d: Duration, or: Duration) -> Duration {
    if d.is_zero() {
        or
    } else {
        d
    }
}

/// Native histograms need the protobuf exposition; the port serves the text format.
fn native(h: &HistogramYaml) -> Result<(), String> {
    if h.native_histogram_bucket_factor.is_some() || h.native_histogram_max_buckets.is_some() {
        return Err("native histograms are not supported (the port serves the text format)".into());
    }
    Ok(())
}

/// `observer_type` / `timer_type`: true for a histogram; empty is a summary, as in v0.26.
fn observer_kind(k: &str) -> Result<bool, String> {
    match k {
        "histogram" => Ok(true),
        "summary" | "" => Ok(false),
        k => Err(format!(
            "invalid observer type \"{k}\" (histogram or summary)"
        )),
    }
}

/// `match_type`: true for a regex.
fn match_kind(m: &str) -> Result<bool, String> {
    match m {
        "regex" => Ok(true),
        "glob" | "" => Ok(false),
        m => Err(format!("invalid match type \"{m}\" (glob or regex)")),
    }
}

fn metric_kind(t: &str) -> Result<MetricType, String> {
    match t {
        "counter" => Ok(MetricType::Counter),
        "gauge" => Ok(MetricType::Gauge),
        "observer" | "timer" => Ok(MetricType::Observer),
        t => Err(format!(
            "invalid metric type \"{t}\" (counter, gauge, observer or timer)"
        )),
    }
}

/// statsd_exporter's `metricNameRE`: `[a-zA-Z_0-9]` and `$N` / `${N}` references, not
/// starting with a digit.
fn check_name(name: &str) -> Result<(), String> {
    let bare: String = {
        let re = regex::Regex::new(r"\$\{?\d+\}?").expect("valid pattern");
        re.replace_all(name, "x").into_owned()
    };
    let ok = !bare.starts_with(|c: char| c.is_ascii_digit())
        && bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid metric name \"{name}\": letters, digits, _ and $N captures, not starting \
             with a digit"
        ))
    }
}

fn check_buckets(b: &[f64]) -> Result<(), String> {
    if b.windows(2).any(|w| w[0] >= w[1]) || b.iter().any(|v| v.is_nan()) {
        return Err(format!(
            "histogram buckets must be in increasing order: {b:?}"
        ));
    }
    Ok(())
}

fn check_quantiles(q: &[f64]) -> Result<(), String> {
    if q.iter().any(|v| !(0.0..=1.0).contains(v)) {
        return Err(format!("quantiles must lie between 0 and 1: {q:?}"));
    }
    Ok(())
}
