use std::sync::Arc;

use super::*;
use crate::config::{Config, LoadOptions};
use crate::service::metrics::{Door, DoorCalls, LimitSeries, RequestStats};
use crate::telemetry::Metrics;

/// The per-limit series of `config`, as the live limits push them.
struct Limits(Arc<RequestStats>, Arc<Config>);

impl Metrics for Limits {
    fn render(&self, _: &mut String) {}

    fn push(&self, out: &mut Pushed) {
        let stats = self.0.limit_stats.bind(&self.1);
        let (metrics, config) = (&self.0, &self.1);
        LimitSeries {
            metrics,
            config,
            stats: &stats,
        }
        .push(out);
    }
}

/// Every door's calls and the per-limit series of `config`, registered as the server registers
/// them.
fn registered(
    calls: &Arc<DoorCalls>,
    metrics: &Arc<RequestStats>,
    config: &Arc<Config>,
) -> Registry {
    let limits = Limits(metrics.clone(), config.clone());
    Registry::new(vec![calls.clone(), Arc::new(limits)])
}

fn mogrifier(pattern: &str, name: &str, tags: &[(&str, &str)]) -> Mogrifier {
    Mogrifier {
        pattern: Regex::new(pattern).unwrap(),
        name: name.into(),
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn the_first_matching_mogrifier_renames_and_tags() {
    // The reference README's HITS example.
    let hits = mogrifier(
        r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
        "ratelimit.service.rate_limit.$3",
        &[("descriptor", "$2"), ("domain", "$1")],
    );
    let never = mogrifier("^nothing$", "x", &[]);
    let (name, tags) = mogrify(
        &[never, hits],
        "ratelimit.service.rate_limit.mongo_cps.database_users.total_hits",
    );
    assert_eq!(name, "ratelimit.service.rate_limit.total_hits");
    assert_eq!(
        tags,
        vec![
            ("descriptor".to_string(), "database_users".to_string()),
            ("domain".to_string(), "mongo_cps".to_string())
        ]
    );
    assert_eq!(mogrify(&[], "a.b"), ("a.b".to_string(), vec![]));
}

#[test]
fn placeholders_past_the_last_group_stay() {
    assert_eq!(
        substitute("x.$1.$2.$9.$", &["all", "one", "two"]),
        "x.one.two.$9.$"
    );
    assert_eq!(substitute("$0", &["whole"]), "whole");
}

const YAML: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
";

#[test]
fn a_flush_sends_changes_and_nothing_when_nothing_changed() {
    let config =
        Config::from_sources(&[("d.yaml".into(), YAML.into())], LoadOptions::default()).unwrap();
    let config = Arc::new(config);
    let metrics = Arc::new(RequestStats::default());
    let all = registered(&Arc::default(), &metrics, &config);
    let stats = metrics.limit_stats.bind(&config);
    let mut node = None;
    config.for_each_node(&mut |n| node = Some(n));
    let s = stats.of(node.unwrap());
    s.add(3, false, 0, 0, false);
    let format = Format::Statsd { tags: &[] };
    let mut e = Exporter::default();
    let f = e.collect(format, &all);
    assert!(f
        .lines
        .contains(&"ratelimit.service.rate_limit.d.k.total_hits:3|c\n".to_string()));
    assert!(f
        .lines
        .contains(&"ratelimit.service.rate_limit.d.k.within_limit:3|c\n".to_string()));
    assert!(
        !f.lines.iter().any(|l| l.contains("over_limit")),
        "{:?}",
        f.lines
    );
    e.commit(f);
    assert!(e.collect(format, &all).lines.is_empty());
    s.add(2, true, 2, 0, false);
    let f = e.collect(format, &all);
    assert!(f
        .lines
        .contains(&"ratelimit.service.rate_limit.d.k.total_hits:2|c\n".to_string()));
    assert!(f
        .lines
        .contains(&"ratelimit.service.rate_limit.d.k.over_limit:2|c\n".to_string()));
    // Not committed (the send failed): the next flush sends the same changes again.
    let again = e.collect(format, &all);
    assert_eq!(f.lines, again.lines);
}

#[test]
fn response_times_go_as_one_sampled_line_per_bucket() {
    let config = Arc::new(Config::default());
    let metrics = Arc::new(RequestStats::default());
    let calls = Arc::new(DoorCalls::default());
    let all = registered(&calls, &metrics, &config);
    for _ in 0..4 {
        let envoy = calls.door(Door::Envoy);
        envoy.count(None, Duration::from_micros(30));
    }
    let f = Exporter::default().collect(Format::Statsd { tags: &[] }, &all);
    assert!(
        f.lines
            .contains(&"ratelimit_server.ShouldRateLimit.response_time:0.05|ms|@0.25\n".into()),
        "{:?}",
        f.lines
    );
}
