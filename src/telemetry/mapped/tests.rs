//! The grammar, with cases from statsd_exporter's `mapper_test.go`, and the exposition of live
//! counters through it.

use super::*;
use crate::telemetry::{Metrics, Pushed};

fn mapper(yaml: &str) -> Mapper {
    Mapper::parse(yaml, "test.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// (name, labels) `stat` maps to as a counter; `None` when dropped, the stat when unmapped.
fn counter(m: &Mapper, stat: &str) -> Option<(String, Vec<(String, String)>)> {
    match m.map(stat, MetricType::Counter) {
        Mapping::Dropped => None,
        Mapping::Unmapped { .. } => Some((stat.to_owned(), vec![])),
        Mapping::Mapped { name, labels, .. } => Some((name, labels)),
    }
}

fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn globs_keep_file_order_and_regexes_come_after_them() {
    // "Config with super sets, keeps ordering".
    let m = mapper("mappings:\n- match: order.*.*\n  name: testa\n  labels:\n    label: \"${1}_foo\"\n- match: order.*.bbb\n  name: testb\n");
    assert_eq!(
        counter(&m, "order.good.bbb"),
        Some(("testa".into(), l(&[("label", "good_foo")])))
    );
    // A regex first in the file still loses to a glob that matches.
    let m = mapper("mappings:\n- match: '.'\n  match_type: regex\n  action: drop\n  name: dropped\n- match: web.*\n  name: web\n  labels:\n    site: $1\n");
    assert_eq!(
        counter(&m, "web.localhost"),
        Some(("web".into(), l(&[("site", "localhost")])))
    );
    assert_eq!(counter(&m, "test.a"), None);
}

#[test]
fn without_ordering_literals_win() {
    // "Config with super sets, disables ordering" and "Config with backtracking".
    let m = mapper("defaults:\n  glob_disable_ordering: true\nmappings:\n- match: noorder.*.*\n  name: testa\n- match: noorder.*.bbb\n  name: testb\n  labels:\n    label: \"${1}_foo\"\n- match: noorder.ccc.bbb\n  name: testc\n- match: backtrack.*.bbb\n  name: backb\n- match: backtrack.justatest.aaa\n  name: backa\n  labels:\n    label: \"${1}_foo\"\n");
    let name = |s| counter(&m, s).unwrap();
    assert_eq!(
        name("noorder.good.bbb"),
        ("testb".into(), l(&[("label", "good_foo")]))
    );
    assert_eq!(name("noorder.ccc.bbb").0, "testc");
    assert_eq!(name("backtrack.justatest.bbb").0, "backb");
    assert_eq!(
        name("backtrack.justatest.aaa"),
        ("backa".into(), l(&[("label", "_foo")]))
    );
}

#[test]
fn captures_of_a_later_rule_do_not_leak() {
    // "Config with backtracking, the non-matched rule has star(s)".
    let m = mapper("mappings:\n- match: '*.dummy.*'\n  name: metric_one\n  labels:\n    system: $1\n    attribute: $2\n- match: 'full.name.*'\n  name: metric_two\n  labels:\n    system: static\n    attribute: $1\n");
    assert_eq!(
        counter(&m, "full.name.anothertest"),
        Some((
            "metric_two".into(),
            l(&[("attribute", "anothertest"), ("system", "static")])
        ))
    );
    // TestMultipleMatches: names built from captures.
    let m = mapper(
        "mappings:\n- match: aa.bb.*.*\n  name: \"aa_bb_${1}_total\"\n  labels:\n    app: \"$2\"\n",
    );
    assert_eq!(
        counter(&m, "aa.bb.cc.myapp"),
        Some(("aa_bb_cc_total".into(), l(&[("app", "myapp")])))
    );
}

#[test]
fn regexes_expand_captures_and_metric_types_filter() {
    let m = mapper("mappings:\n- match: 'ratelimit\\.service\\.rate_limit\\.([^.]*)\\.(.*)\\.over_limit'\n  match_type: regex\n  name: over_$1\n  labels:\n    key: \"${2}\"\n    team: core\n- match: x.*\n  match_metric_type: gauge\n  name: gauge_only\n");
    assert_eq!(
        counter(&m, "ratelimit.service.rate_limit.d.k_v.k2.over_limit"),
        Some(("over_d".into(), l(&[("key", "k_v.k2"), ("team", "core")])))
    );
    // Not a gauge: unmapped.
    assert_eq!(counter(&m, "x.y"), Some(("x.y".into(), vec![])));
}

#[test]
fn observers_default_to_summaries_and_take_their_options() {
    let m = mapper("defaults:\n  buckets: [1, 2]\nmappings:\n- match: a.*\n  timer_type: histogram\n  name: a\n- match: b.*\n  name: b\n  summary_options:\n    quantiles:\n      - quantile: 0.75\n        error: 0.01\n    max_age: 30s\n");
    let observer = |s| match m.map(s, MetricType::Observer) {
        Mapping::Mapped { observer, .. } | Mapping::Unmapped { observer } => observer.clone(),
        Mapping::Dropped => panic!("dropped"),
    };
    assert_eq!(
        observer("a.x"),
        Observer::Histogram {
            buckets: vec![1.0, 2.0]
        }
    );
    assert_eq!(
        observer("b.x"),
        Observer::Summary {
            quantiles: vec![0.75],
            max_age: Duration::from_secs(30),
            age_buckets: 5
        }
    );
    assert!(matches!(observer("c.x"), Observer::Summary { .. }));
}

#[test]
fn bad_files_name_the_line() {
    let err = |yaml: &str| Mapper::parse(yaml, "m.yaml").unwrap_err();
    let e = err("mappings:\n- match: a.*\n  name: a\n  ttl: 1m\n");
    assert!(
        e.starts_with("m.yaml: line 4: mappings[0]: ttl is not supported"),
        "{e}"
    );
    let e =
        err("mappings:\n- match: a.*\n  name: a\n- match: '(a'\n  match_type: regex\n  name: b\n");
    assert!(
        e.starts_with("m.yaml: line 4: mappings[1]: invalid regex"),
        "{e}"
    );
    let e = err("mappings:\n- match: a.*\n  name: a\n  colour: red\n");
    assert!(
        e.contains("m.yaml: ") && e.contains("unknown field `colour`") && e.contains("line 4"),
        "{e}"
    );
    let e = err("mappings:\n- match: 1a.*\n  name: a\n");
    assert!(
        e.starts_with("m.yaml: line 2: mappings[0]: invalid glob"),
        "{e}"
    );
    let e = err("mappings:\n- match: a.*\n");
    assert!(e.contains("sets no metric name"), "{e}");
    let e = err("mappings:\n- match: a.*\n  name: a\n  timer_type: gauge\n");
    assert!(e.contains("invalid observer type"), "{e}");
    // "Duplicate quantiles are bad".
    let e = err("mappings:\n- match: test.*.*\n  observer_type: summary\n  name: foo\n  quantiles:\n    - quantile: 0.42\n      error: 0.04\n  summary_options:\n    quantiles:\n      - quantile: 0.42\n        error: 0.04\n");
    assert!(e.contains("both at the top"), "{e}");
    let e = err("mappings:\n- match: a.*\n  name: a\n  labels:\n    a: x\n");
    assert!(e.contains("invalid label name"), "{e}");
}

#[test]
fn the_default_mapping_parses_and_scales_response_time() {
    let scale = |m: &Mapper| match m.map(
        "ratelimit_server.ShouldRateLimit.response_time",
        MetricType::Observer,
    ) {
        Mapping::Mapped { scale, .. } => scale,
        other => panic!("{other:?}"),
    };
    assert_eq!(scale(&Mapper::default_mapping(false)), Some(0.001));
    assert_eq!(scale(&Mapper::default_mapping(true)), None);
}

struct Fake;

impl Metrics for Fake {
    fn render(&self, _: &mut String) {}

    fn push(&self, out: &mut Pushed) {
        out.add("ratelimit.service.rate_limit.d.k_v.over_limit".into(), 3);
        out.add("ratelimit.service.rate_limit.d.k_v.near_limit".into(), 0);
        out.add("ratelimit.service.config_load_success".into(), 1);
        out.add("ratelimit.other.thing".into(), 2);
        let h = crate::telemetry::Histogram::default();
        h.observe(Duration::from_micros(20));
        h.observe(Duration::from_millis(3));
        out.timer("ratelimit_server.ShouldRateLimit.response_time", &h);
    }
}

#[test]
fn renders_live_counters_through_the_mapping() {
    let registry = Registry::new(vec![Arc::new(Fake)]);
    let now = Instant::now();
    let x = Exposition::new(Mapper::default_mapping(false), registry, now);
    let text = x.render(now);
    assert!(text.contains("# TYPE ratelimit_service_rate_limit_over_limit counter\nratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"k_v\"} 3\n"), "{text}");
    // Zero: never flushed by the reference, so no series.
    assert!(!text.contains("near_limit"), "{text}");
    assert!(
        text.contains("ratelimit_service_config_load_success 1\n"),
        "{text}"
    );
    // Unmapped: escaped, no labels, no _total.
    assert!(
        text.contains("# TYPE ratelimit_other_thing counter\nratelimit_other_thing 2\n"),
        "{text}"
    );
    // 20 µs is 0 ms, 3 ms stands at its bucket's top (5 ms), in seconds by the default scale.
    assert!(text.contains("ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.005\"} 2\n"), "{text}");
    assert!(
        text.contains(
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 2\n"
        ),
        "{text}"
    );
}

#[test]
fn a_summary_covers_its_window() {
    let registry = Registry::new(vec![Arc::new(Fake)]);
    let m = mapper("mappings:\n- match: ratelimit_server.*.response_time\n  name: rt\n  summary_options:\n    max_age: 10s\n    age_buckets: 2\n");
    let t0 = Instant::now();
    let x = Exposition::new(m, registry, t0);
    let text = x.render(t0 + Duration::from_secs(1));
    assert!(
        text.contains("# TYPE rt summary\nrt{quantile=\"0.5\"} 0\n"),
        "{text}"
    );
    assert!(text.contains("rt{quantile=\"0.99\"} 5\n"), "{text}");
    // Nothing new for longer than max_age: the window is empty.
    x.render(t0 + Duration::from_secs(12));
    let text = x.render(t0 + Duration::from_secs(30));
    assert!(text.contains("rt{quantile=\"0.5\"} NaN\n"), "{text}");
    assert!(text.contains("rt_count 2\n"), "{text}");
}
