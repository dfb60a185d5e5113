//! Overlays read, refused, and applied to pushed resources.
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::*;
use crate::config::xds::{config_from_resources, pb, TYPE_URL};
use crate::config::{Config, LiveConfig};

fn overlay(yaml: &str) -> Result<Overlay, ConfigError> {
    Overlay::from_sources(&[("overlay/ai.yaml".to_owned(), yaml.to_owned())])
}

/// Envoy Gateway's shape: domain `default/eg/http`, the route's descriptor, and below it
/// `rule-0-match-0` (a distinct header: one counter per user), 1000 an hour.
fn pushed(rpu: u32) -> Vec<Any> {
    pushed_in(pb::RateLimitUnit::Hour, rpu)
}

fn pushed_in(unit: pb::RateLimitUnit, rpu: u32) -> Vec<Any> {
    let route = "httproute/default/llm/rule/0/match/0/*";
    let config = pb::RateLimitConfig {
        name: "default/eg/http".into(),
        domain: "default/eg/http".into(),
        descriptors: vec![pb::RateLimitDescriptor {
            key: route.into(),
            value: route.into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: "rule-0-match-0".into(),
                rate_limit: Some(pb::RateLimitPolicy {
                    unit: unit as i32,
                    requests_per_unit: rpu,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    vec![Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }]
}

fn build(o: &Overlay, rpu: u32) -> Result<Config, ConfigError> {
    config_from_resources(
        pushed(rpu),
        LoadOptions::default(),
        &LiveConfig::default(),
        Some(o),
    )
}

const RESERVE: &str = r#"
domain: default/eg/http
descriptors:
  - key: httproute/default/llm/rule/0/match/0/*
    value: httproute/default/llm/rule/0/match/0/*
    descriptors:
      - key: rule-0-match-0
        rate_limit: {reserve: 300, reserve_for: 2m}
"#;

fn the_limit(c: &Config) -> &crate::config::RateLimit {
    let d = c.domain("default/eg/http").unwrap();
    let route = d.root.nodes().next().unwrap();
    let user = route.children.nodes().next().unwrap();
    &user.limits[0]
}

#[test]
fn the_fields_apply_to_the_limit_pushed_at_the_same_path() {
    let o = overlay(RESERVE).unwrap();
    let c = build(&o, 1000).unwrap();
    let l = the_limit(&c);
    assert_eq!(l.requests_per_unit, 1000, "the push's own");
    let r = l.reserve.unwrap();
    assert_eq!((r.hits, r.hold.as_secs()), (300, 120));
    assert_eq!(
        l.overlay.as_deref(),
        Some("reserve,reserve_for from overlay/ai.yaml")
    );
    assert!(c.overlay_unmatched.is_empty(), "{:?}", c.overlay_unmatched);
    let line = &c.describe()[0];
    assert!(
        line.contains(
            " reserve=300 reserve_for=120000ms overlay=reserve,reserve_for from overlay/ai.yaml"
        ),
        "{line}"
    );
    // A second push keeps the overlay; the build refuses what a file would refuse.
    assert_eq!(the_limit(&build(&o, 2000).unwrap()).reserve, Some(r));
    let e = build(&o, 200).unwrap_err();
    assert_eq!(
        e.to_string(),
        "RateLimitConfig \"default/eg/http\": descriptors[0].descriptors[0].rate_limit.reserve: \
         reserve 300 is more than the limit's 200: no check could ever be admitted (the xDS \
         overlay wrote reserve,reserve_for from overlay/ai.yaml)"
    );
}

#[test]
fn wildcards_and_windows_apply_as_in_a_file() {
    let o = overlay(
        r#"
domain: default/eg/http
descriptors:
  - key: httproute/default/llm/rule/0/match/0/*
    value: httproute/default/*
    descriptors:
      - key: rule-0-match-0
        rate_limit: {algorithm: sliding_window, unit_multiplier: 2, calendar: Europe/Berlin}
"#,
    )
    .unwrap();
    let day = pushed_in(pb::RateLimitUnit::Day, 1000);
    let c = config_from_resources(
        day,
        LoadOptions::default(),
        &LiveConfig::default(),
        Some(&o),
    );
    let c = c.unwrap();
    let l = the_limit(&c);
    assert_eq!(l.algorithm, crate::config::Algorithm::SlidingWindow);
    assert_eq!(l.window_text(), "2 day in Europe/Berlin");
    // On an hourly limit, the calendar is refused as a file's would be.
    let e = build(&o, 1000).unwrap_err();
    assert!(
        e.to_string().ends_with(
            "rate_limit.calendar: calendar applies to day, week, month and year limits, not \
             hour (the xDS overlay wrote algorithm,unit_multiplier,calendar from overlay/ai.yaml)"
        ),
        "{e}"
    );
}

#[test]
fn a_path_the_push_lacks_is_listed_not_refused() {
    let o = overlay(
        r#"
domain: default/eg/http
descriptors:
  - key: httproute/default/other/rule/0/match/0/*
    value: httproute/default/other/rule/0/match/0/*
    descriptors:
      - key: rule-0-match-0
        rate_limit: {reserve: 10}
"#,
    )
    .unwrap();
    let c = build(&o, 1000).unwrap();
    assert!(the_limit(&c).reserve.is_none());
    assert_eq!(
        c.overlay_unmatched,
        vec![
            "overlay overlay/ai.yaml: descriptors[0].descriptors[0]: \"default/eg/http\" > key \
             \"httproute/default/other/rule/0/match/0/*\" value \
             \"httproute/default/other/rule/0/match/0/*\" > key \"rule-0-match-0\": matches no \
             limit in the current push"
        ]
    );
    assert_eq!(c.describe().last(), c.overlay_unmatched.last());
}

#[test]
fn fields_the_push_owns_and_unknown_ones_are_refused_with_the_line() {
    let yaml = |field: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      reserve: 1\n      {field}: 5\n"
        )
    };
    let e = overlay(&yaml("requests_per_unit")).unwrap_err();
    assert_eq!(e.file, "overlay/ai.yaml");
    let m = e.to_string();
    assert!(
        m.contains("descriptors[0].rate_limit.requests_per_unit"),
        "{m}"
    );
    assert!(m.contains("is the pushed config's"), "{m}");
    assert!(m.contains("line 6"), "{m}");
    let m = overlay(&yaml("reserv")).unwrap_err().to_string();
    assert!(m.contains("unknown field `reserv`"), "{m}");
    assert!(m.contains("line 6"), "{m}");
    let m = overlay("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n")
        .unwrap_err()
        .to_string();
    assert!(m.contains("descriptors[0].shadow_mode"), "{m}");
    assert!(m.contains("is the pushed config's"), "{m}");
    assert!(m.contains("line 4"), "{m}");
    let m = overlay("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n")
        .unwrap_err()
        .to_string();
    assert!(m.contains("rate_limit sets nothing"), "{m}");
    let twice = "domain: d\ndescriptors:\n  - {key: k, rate_limit: {reserve: 1}}\n  - {key: k, rate_limit: {reserve: 2}}\n";
    let m = overlay(twice).unwrap_err().to_string();
    assert!(m.contains("descriptors[1]: this descriptor's rate_limit is in the overlay already, at overlay/ai.yaml: descriptors[0]"), "{m}");
}

#[test]
fn the_path_to_write_pastes_as_an_overlay() {
    let text = path_to_write(
        "default/eg/http",
        &[("route", Some("r")), ("rule-0-match-0", None)],
    );
    assert_eq!(
        text,
        r#"{domain: "default/eg/http", descriptors: [{key: "route", value: "r", descriptors: [{key: "rule-0-match-0", rate_limit: {}}]}]}"#
    );
    let filled = text.replace("rate_limit: {}", "rate_limit: {reserve: 5}");
    let o = overlay(&filled).unwrap();
    assert_eq!(
        o.describe(),
        vec![
            "overlay overlay/ai.yaml: descriptors[0].descriptors[0]: \"default/eg/http\" > key \
             \"route\" value \"r\" > key \"rule-0-match-0\": reserve=5"
        ]
    );
}
