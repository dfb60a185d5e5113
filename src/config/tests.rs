//! Config layer: YAML → validated `Config` (errors name file + path), directory loading, and
//! `Settings::from_env`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use super::*;
use crate::service::HeaderNames;
use crate::settings::Settings;

// ------------------------------------------------------------------------------------------
// Helpers.

fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

fn load_with(files: &[(&str, &str)], opts: LoadOptions) -> Result<Config, ConfigError> {
    Config::from_sources(&sources(files), opts)
}

fn load(yaml: &str) -> Config {
    match load_with(&[("conf/a.yaml", yaml)], LoadOptions::default()) {
        Ok(c) => c,
        Err(e) => panic!("expected the config to load, got: {e}\n--- yaml:\n{yaml}"),
    }
}

fn load_err(yaml: &str) -> ConfigError {
    match load_with(&[("conf/a.yaml", yaml)], LoadOptions::default()) {
        Ok(c) => panic!(
            "expected an error, config loaded: {:?}\n--- yaml:\n{yaml}",
            c.describe()
        ),
        Err(e) => e,
    }
}

/// The error names the file and the path inside it, and says what is wrong.
fn assert_err(e: &ConfigError, file: &str, path: &str, needle: &str) {
    let shown = e.to_string();
    assert_eq!(e.file, file, "file of error: {shown}");
    assert_eq!(e.path, path, "path of error: {shown}");
    assert!(
        e.message.contains(needle),
        "message should contain {needle:?}: {shown}"
    );
    assert!(
        shown.starts_with(&format!("{file}: {path}: ")),
        "Display should start with file and path: {shown}"
    );
    assert!(
        shown.contains(needle),
        "Display should contain {needle:?}: {shown}"
    );
}

/// Errors raised while parsing (serde): whole-file errors whose message carries the path.
fn assert_parse_err(e: &ConfigError, file: &str, needles: &[&str]) {
    let shown = e.to_string();
    assert_eq!(e.file, file, "file of error: {shown}");
    assert!(
        shown.starts_with(&format!("{file}: ")),
        "Display should start with the file: {shown}"
    );
    for n in needles {
        assert!(shown.contains(n), "error should contain {n:?}: {shown}");
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(k, v)| Entry {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect()
}

/// The limits of the node a request descriptor matches; panics if nothing matches.
fn limits_for<'c>(c: &'c Config, domain: &str, pairs: &[(&str, &str)]) -> &'c [RateLimit] {
    let d = c
        .domain(domain)
        .unwrap_or_else(|| panic!("domain {domain} not loaded"));
    let m = crate::descriptor::find(d, &entries(pairs))
        .unwrap_or_else(|| panic!("no node matches {pairs:?} in {domain}"));
    &m.node().limits
}

fn only_limit<'c>(c: &'c Config, domain: &str, pairs: &[(&str, &str)]) -> &'c RateLimit {
    let l = limits_for(c, domain, pairs);
    assert_eq!(l.len(), 1, "expected one limit for {pairs:?}: {l:?}");
    &l[0]
}

fn matches(c: &Config, domain: &str, pairs: &[(&str, &str)]) -> bool {
    c.domain(domain)
        .and_then(|d| crate::descriptor::find(d, &entries(pairs)))
        .is_some()
}

/// A config with one descriptor `k: v` carrying `rate_limit` with the given body lines.
fn one_limit(body: &str) -> String {
    let mut y =
        String::from("domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n");
    for line in body.lines() {
        y.push_str("      ");
        y.push_str(line);
        y.push('\n');
    }
    y
}

const RL: &str = "descriptors[0].rate_limit";

// ------------------------------------------------------------------------------------------
// Validation errors of the reference.

#[test]
fn empty_domain_is_an_error() {
    let e = load_err("domain: \"\"\ndescriptors:\n  - key: k\n");
    assert_err(&e, "conf/a.yaml", "domain", "domain must not be empty");
}

#[test]
fn missing_domain_is_an_error() {
    let e = load_err(
        "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_err(&e, "conf/a.yaml", "domain", "domain must not be empty");
}

#[test]
fn duplicate_domain_across_files_is_an_error() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let e = load_with(
        &[("conf/a.yaml", a), ("conf/b.yaml", b)],
        LoadOptions::default(),
    )
    .expect_err("duplicate domain must be refused");
    assert_err(&e, "conf/b.yaml", "domain", "duplicate domain \"d\"");
    assert!(
        e.message.contains("conf/a.yaml"),
        "should name the first file: {e}"
    );
}

#[test]
fn duplicate_domain_is_merged_with_merge_domains() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let opts = LoadOptions {
        merge_domains: true,
        ..Default::default()
    };
    let c = load_with(&[("conf/a.yaml", a), ("conf/b.yaml", b)], opts).expect("merged");
    assert_eq!(c.domains.len(), 1);
    let la = only_limit(&c, "d", &[("a", "x")]);
    assert_eq!((la.unit, la.requests_per_unit), (Unit::Second, 1));
    let lb = only_limit(&c, "d", &[("b", "x")]);
    assert_eq!((lb.unit, lb.requests_per_unit), (Unit::Minute, 2));
    assert_eq!(c.describe().len(), 2, "{:?}", c.describe());
}

#[test]
fn different_domains_in_two_files_both_load() {
    let a = "domain: one\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: two\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let c = load_with(&[("a.yaml", a), ("b.yaml", b)], LoadOptions::default()).expect("load");
    assert_eq!(only_limit(&c, "one", &[("a", "")]).requests_per_unit, 1);
    assert_eq!(only_limit(&c, "two", &[("a", "")]).requests_per_unit, 2);
}

#[test]
fn empty_descriptor_key_is_an_error() {
    let e = load_err("domain: d\ndescriptors:\n  - key: \"\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].key",
        "descriptor key must not be empty",
    );
}

#[test]
fn missing_descriptor_key_is_an_error_with_nested_path() {
    let y = "domain: d
descriptors:
  - key: a
  - key: b
    descriptors:
      - key: c
      - value: orphan
        rate_limit: {unit: second, requests_per_unit: 1}
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[1].descriptors[1].key",
        "descriptor key must not be empty",
    );
}

#[test]
fn duplicate_key_value_at_one_level_is_an_error() {
    let y = "domain: d
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 2}
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[1]",
        "duplicate composite key \"d.k_v\"",
    );
}

#[test]
fn duplicate_key_only_at_one_level_is_an_error() {
    let y = "domain: d
descriptors:
  - key: a
    descriptors:
      - key: k
      - key: k
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].descriptors[1]",
        "duplicate composite key",
    );
}

#[test]
fn composite_key_collision_across_underscores_is_an_error() {
    let y = "domain: d
descriptors:
  - key: a_b
    value: c
  - key: a
    value: b_c
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[1]",
        "duplicate composite key \"d.a_b_c\"",
    );
}

#[test]
fn same_key_value_at_other_levels_or_parents_is_fine() {
    let y = "domain: d
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: k
        value: v
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: w
    descriptors:
      - key: k
        value: v
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4}
";
    let c = load(y);
    assert_eq!(only_limit(&c, "d", &[("k", "v")]).requests_per_unit, 1);
    assert_eq!(
        only_limit(&c, "d", &[("k", "v"), ("k", "v")]).requests_per_unit,
        2
    );
    assert_eq!(
        only_limit(&c, "d", &[("k", "w"), ("k", "v")]).requests_per_unit,
        3
    );
    assert_eq!(only_limit(&c, "d", &[("k", "other")]).requests_per_unit, 4);
}

#[test]
fn invalid_unit_is_an_error() {
    let e = load_err(&one_limit("unit: fortnite\nrequests_per_unit: 1"));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.unit"),
        "invalid unit \"fortnite\"",
    );
}

#[test]
fn missing_unit_without_unlimited_is_an_error() {
    let e = load_err(&one_limit("requests_per_unit: 1"));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.unit"), "invalid unit");
}

#[test]
fn unit_with_unlimited_is_an_error() {
    let e = load_err(&one_limit("unit: second\nunlimited: true"));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.unit"), "unlimited");
}

#[test]
fn unlimited_without_unit_loads() {
    let c = load(&one_limit("unlimited: true"));
    let l = only_limit(&c, "d", &[("k", "v")]);
    assert!(l.unlimited);
}

#[test]
fn empty_replaces_entry_is_an_error() {
    for rep in ["[{}]", "[{name: \"\"}]", "[{name: ok}, {name: \"\"}]"] {
        let e = load_err(&one_limit(&format!(
            "unit: second\nrequests_per_unit: 1\nname: mine\nreplaces: {rep}"
        )));
        let idx = if rep.contains("ok") { 1 } else { 0 };
        assert_err(
            &e,
            "conf/a.yaml",
            &format!("{RL}.replaces[{idx}].name"),
            "replaces entry must name a limit",
        );
    }
}

#[test]
fn limit_replacing_itself_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 1\nname: mine\nreplaces: [{name: other}, {name: mine}]",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.replaces[1]"),
        "limit \"mine\" replaces itself",
    );
}

#[test]
fn name_and_replaces_load() {
    let c = load(&one_limit(
        "unit: second\nrequests_per_unit: 1\nname: mine\nreplaces: [{name: a}, {name: b}]",
    ));
    let l = only_limit(&c, "d", &[("k", "v")]);
    assert_eq!(l.name.as_deref(), Some("mine"));
    assert_eq!(l.replaces, vec!["a".to_string(), "b".to_string()]);
}

#[test]
fn share_threshold_without_wildcard_is_an_error() {
    let y = "domain: d
descriptors:
  - key: path
    value: /foo
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].share_threshold",
        "share_threshold needs a value with a '*' wildcard",
    );
    // Key-only descriptors have no value at all, so no wildcard either.
    let e = load_err("domain: d\ndescriptors:\n  - key: path\n    share_threshold: true\n");
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].share_threshold",
        "wildcard",
    );
}

#[test]
fn share_threshold_with_wildcard_loads() {
    let y = "domain: d
descriptors:
  - key: path
    value: /foo/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
";
    let c = load(y);
    let d = c.domain("d").unwrap();
    let m = crate::descriptor::find(d, &entries(&[("path", "/foo/bar")])).expect("wildcard match");
    assert!(m.node().share_threshold);
}

#[test]
fn yaml_syntax_error_names_the_file() {
    for y in [
        "domain: \"unterminated\n",
        "domain: d\ndescriptors:\n  - key: a\n   rate_limit: x\n",
        "domain: d\n  descriptors: x\n",
        "domain: d\n\tdescriptors: [\n",
    ] {
        let e = load_err(y);
        assert_eq!(e.file, "conf/a.yaml", "{e}");
        assert!(e.path.is_empty(), "whole-file error: {e}");
        assert!(e.to_string().starts_with("conf/a.yaml: "), "{e}");
        // serde_yaml says where.
        assert!(e.message.contains("line"), "should say where: {e}");
    }
}

#[test]
fn yaml_that_is_not_a_map_is_an_error() {
    let e = load_err("- just\n- a list\n");
    assert_parse_err(&e, "conf/a.yaml", &[]);
}

#[test]
fn unknown_key_at_root_is_an_error() {
    let e = load_err("domain: d\ndescriptorz: []\n");
    assert_parse_err(&e, "conf/a.yaml", &["unknown key", "descriptorz"]);
}

#[test]
fn unknown_key_in_descriptor_is_an_error() {
    let y = "domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        vaule: typo
";
    let e = load_err(y);
    assert_parse_err(
        &e,
        "conf/a.yaml",
        &["unknown key", "vaule", "descriptors[0].descriptors[0]"],
    );
}

#[test]
fn unknown_key_in_rate_limit_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 1\nrequests_per_second: 5",
    ));
    assert_parse_err(
        &e,
        "conf/a.yaml",
        &[
            "unknown key",
            "requests_per_second",
            "descriptors[0].rate_limit",
        ],
    );
}

#[test]
fn unknown_key_in_replaces_and_queue_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 1\nreplaces: [{nam: x}]",
    ));
    assert_parse_err(&e, "conf/a.yaml", &["unknown key", "nam"]);
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 1\nqueue: {max_waiting: 1, max_wait: 1s, timeout: 2s}",
    ));
    assert_parse_err(&e, "conf/a.yaml", &["unknown key", "timeout"]);
}

#[test]
fn float_where_a_scalar_string_belongs_is_an_error() {
    for y in [
        "domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n",
        "domain: d\ndescriptors:\n  - key: 1.5\n",
        "domain: 1.5\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: 1.5, requests_per_unit: 1}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: 2.5}\n",
    ] {
        let e = load_err(y);
        assert_parse_err(&e, "conf/a.yaml", &[]);
        assert!(
            e.message.contains("1.5") || e.message.contains("2.5") || e.message.contains("float"),
            "should say what is wrong: {e}"
        );
    }
}

#[test]
fn float_error_names_the_place() {
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n");
    assert_parse_err(&e, "conf/a.yaml", &["descriptors[0]", "float"]);
}

#[test]
fn integer_and_boolean_values_load_as_strings() {
    let y = "domain: d
descriptors:
  - key: code
    value: 123
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: internal
    value: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: 42
    value: false
    rate_limit: {unit: second, requests_per_unit: 3}
";
    let c = load(y);
    assert_eq!(only_limit(&c, "d", &[("code", "123")]).requests_per_unit, 1);
    assert_eq!(
        only_limit(&c, "d", &[("internal", "true")]).requests_per_unit,
        2
    );
    assert_eq!(only_limit(&c, "d", &[("42", "false")]).requests_per_unit, 3);
    assert!(!matches(&c, "d", &[("code", "124")]));
}

#[test]
fn integer_domain_loads_as_string() {
    let c = load("domain: 7\ndescriptors:\n  - key: k\n");
    assert!(c.domain("7").is_some());
}

#[test]
fn negative_or_huge_requests_per_unit_is_an_error() {
    for n in ["-1", "4294967296", "lots"] {
        let e = load_err(&one_limit(&format!("unit: second\nrequests_per_unit: {n}")));
        assert_parse_err(&e, "conf/a.yaml", &["descriptors[0].rate_limit"]);
    }
}

// ------------------------------------------------------------------------------------------
// What loads.

#[test]
fn units_are_case_insensitive_with_their_seconds() {
    let cases = [
        ("second", Unit::Second, 1),
        ("MINUTE", Unit::Minute, 60),
        ("Hour", Unit::Hour, 3600),
        ("dAy", Unit::Day, 86_400),
        ("WEEK", Unit::Week, 7 * 86_400),
        ("month", Unit::Month, 30 * 86_400),
        ("Year", Unit::Year, 365 * 86_400),
    ];
    for (text, unit, secs) in cases {
        let c = load(&one_limit(&format!("unit: {text}\nrequests_per_unit: 5")));
        let l = only_limit(&c, "d", &[("k", "v")]);
        assert_eq!(l.unit, unit, "{text}");
        assert_eq!(l.unit.seconds(), secs, "{text}");
        assert_eq!(l.requests_per_unit, 5);
        assert!(!l.unlimited);
        assert_eq!(l.algorithm, Algorithm::FixedWindow);
        assert_eq!(l.queue, None);
    }
}

#[test]
fn requests_per_unit_missing_is_zero() {
    let c = load(&one_limit("unit: minute"));
    assert_eq!(only_limit(&c, "d", &[("k", "v")]).requests_per_unit, 0);
    let c = load(&one_limit("unit: minute\nrequests_per_unit: 0"));
    assert_eq!(only_limit(&c, "d", &[("k", "v")]).requests_per_unit, 0);
}

#[test]
fn whitelisting_descriptor_loads_without_limits() {
    let y = "domain: d
descriptors:
  - key: remote_address
    value: 10.0.0.1
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
";
    let c = load(y);
    assert!(limits_for(&c, "d", &[("remote_address", "10.0.0.1")]).is_empty());
    assert_eq!(
        only_limit(&c, "d", &[("remote_address", "10.0.0.2")]).requests_per_unit,
        10
    );
    assert_eq!(c.describe().len(), 1, "{:?}", c.describe());
}

#[test]
fn empty_descriptor_list_and_no_descriptors_load() {
    let c = load("domain: d\n");
    assert!(c.domain("d").is_some());
    assert!(c.describe().is_empty());
    let c = load("domain: e\ndescriptors: []\n");
    assert!(c.domain("e").is_some());
}

#[test]
fn nested_descriptors_load() {
    let y = "domain: envoy
descriptors:
  - key: client
    value: mobile
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 50}
        descriptors:
          - key: user
            rate_limit: {unit: hour, requests_per_unit: 500}
";
    let c = load(y);
    assert!(limits_for(&c, "envoy", &[("client", "mobile")]).is_empty());
    let l = only_limit(&c, "envoy", &[("client", "mobile"), ("path", "/login")]);
    assert_eq!((l.unit, l.requests_per_unit), (Unit::Minute, 5));
    let l = only_limit(&c, "envoy", &[("client", "mobile"), ("path", "/x")]);
    assert_eq!((l.unit, l.requests_per_unit), (Unit::Minute, 50));
    let l = only_limit(
        &c,
        "envoy",
        &[("client", "mobile"), ("path", "/x"), ("user", "u1")],
    );
    assert_eq!((l.unit, l.requests_per_unit), (Unit::Hour, 500));
    assert!(!matches(
        &c,
        "envoy",
        &[("client", "desktop"), ("path", "/login")]
    ));
    let d = c.domain("envoy").unwrap();
    let m =
        crate::descriptor::find(d, &entries(&[("client", "mobile"), ("path", "/login")])).unwrap();
    assert_eq!(m.node().stat_key, "envoy.client_mobile.path_/login");
    assert!(m.node().origin.contains("conf/a.yaml"));
    assert!(m.node().origin.contains("descriptors[0].descriptors[0]"));
}

#[test]
fn descriptor_flags_and_metadata_load() {
    let y = "domain: d
descriptors:
  - key: k
    value: v
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    metadata: {team: payments, tier: 2}
    rate_limit: {unit: second, requests_per_unit: 1}
";
    let c = load(y);
    let d = c.domain("d").unwrap();
    let n = crate::descriptor::find(d, &entries(&[("k", "v")]))
        .unwrap()
        .node();
    assert!(n.shadow_mode && n.quota_mode && n.detailed_metric && n.value_to_metric);
    assert!(!n.share_threshold);
    let md = n.metadata.as_ref().expect("metadata");
    assert_eq!(md["team"], serde_json::json!("payments"));
    assert_eq!(md["tier"], serde_json::json!(2));
}

// ------------------------------------------------------------------------------------------
// turnstile extensions: algorithms.

#[test]
fn algorithms_load() {
    let c = load(&one_limit(
        "unit: second\nrequests_per_unit: 7\nalgorithm: fixed_window",
    ));
    assert_eq!(
        only_limit(&c, "d", &[("k", "v")]).algorithm,
        Algorithm::FixedWindow
    );
    let c = load(&one_limit(
        "unit: second\nrequests_per_unit: 7\nalgorithm: sliding_window",
    ));
    assert_eq!(
        only_limit(&c, "d", &[("k", "v")]).algorithm,
        Algorithm::SlidingWindow
    );
    let c = load(&one_limit(
        "unit: second\nrequests_per_unit: 7\nalgorithm: token_bucket",
    ));
    assert_eq!(
        only_limit(&c, "d", &[("k", "v")]).algorithm,
        Algorithm::TokenBucket { burst: 7 },
        "burst defaults to requests_per_unit"
    );
    let c = load(&one_limit(
        "unit: second\nrequests_per_unit: 7\nalgorithm: token_bucket\nburst: 20",
    ));
    assert_eq!(
        only_limit(&c, "d", &[("k", "v")]).algorithm,
        Algorithm::TokenBucket { burst: 20 }
    );
}

#[test]
fn burst_without_token_bucket_is_an_error() {
    for alg in [
        "",
        "algorithm: fixed_window\n",
        "algorithm: sliding_window\n",
    ] {
        let e = load_err(&one_limit(&format!(
            "unit: second\nrequests_per_unit: 7\n{alg}burst: 3"
        )));
        assert_err(&e, "conf/a.yaml", &format!("{RL}.burst"), "token_bucket");
    }
}

#[test]
fn token_bucket_burst_zero_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 7\nalgorithm: token_bucket\nburst: 0",
    ));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.burst"), "at least 1");
}

#[test]
fn unknown_algorithm_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 7\nalgorithm: leaky_bucket",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.algorithm"),
        "unknown algorithm \"leaky_bucket\"",
    );
}

#[test]
fn algorithm_with_unlimited_is_an_error() {
    let e = load_err(&one_limit("unlimited: true\nalgorithm: token_bucket"));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.algorithm"), "unlimited");
}

// ------------------------------------------------------------------------------------------
// turnstile extensions: several limits on one descriptor.

#[test]
fn rate_limits_list_loads() {
    let y = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
      - {unit: hour, requests_per_unit: 1000}
";
    let c = load(y);
    let l = limits_for(&c, "d", &[("k", "x")]);
    assert_eq!(l.len(), 2);
    assert_eq!((l[0].unit, l[0].requests_per_unit), (Unit::Second, 10));
    assert_eq!(l[0].algorithm, Algorithm::TokenBucket { burst: 20 });
    assert_eq!((l[1].unit, l[1].requests_per_unit), (Unit::Hour, 1000));
    assert_eq!(l[1].algorithm, Algorithm::FixedWindow);
    assert_eq!(c.describe().len(), 2, "{:?}", c.describe());
}

#[test]
fn rate_limit_and_rate_limits_together_is_an_error() {
    let y = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
    rate_limits:
      - {unit: hour, requests_per_unit: 1000}
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0]",
        "either rate_limit or rate_limits",
    );
}

#[test]
fn empty_rate_limits_list_is_an_error() {
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n");
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].rate_limits",
        "at least one",
    );
}

#[test]
fn unlimited_inside_a_multi_limit_list_is_an_error() {
    let y = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unlimited: true}
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].rate_limits[1]",
        "unlimited",
    );
}

#[test]
fn errors_inside_rate_limits_name_the_list_index() {
    let y = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: fortnight, requests_per_unit: 10}
";
    let e = load_err(y);
    assert_err(
        &e,
        "conf/a.yaml",
        "descriptors[0].rate_limits[1].unit",
        "invalid unit",
    );
}

// ------------------------------------------------------------------------------------------
// turnstile extensions: queued waiting.

fn queue_limit(max_wait: &str) -> Result<Option<QueueSpec>, ConfigError> {
    let y = one_limit(&format!(
        "unit: second\nrequests_per_unit: 5\nqueue: {{max_waiting: 3, max_wait: {max_wait}}}"
    ));
    load_with(&[("conf/a.yaml", &y)], LoadOptions::default())
        .map(|c| only_limit(&c, "d", &[("k", "v")]).queue)
}

#[test]
fn queue_durations_parse() {
    for (text, d) in [
        ("800ms", Duration::from_millis(800)),
        ("2s", Duration::from_secs(2)),
        ("1.5s", Duration::from_millis(1500)),
        ("1m", Duration::from_secs(60)),
        ("1h", Duration::from_secs(3600)),
    ] {
        let q = queue_limit(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .expect("queue set");
        assert_eq!(
            q,
            QueueSpec {
                max_waiting: 3,
                max_wait: d
            },
            "{text}"
        );
    }
}

#[test]
fn queue_bad_durations_are_errors() {
    for (text, needle) in [
        ("0ms", "more than 0"),
        ("0s", "more than 0"),
        ("soon", "invalid duration"),
        ("5x", "unit must be"),
        ("5", "unit must be"),
        ("\"\"", "invalid duration"),
        ("-1s", "invalid duration"),
        ("25h", "out of range"),
    ] {
        let e = queue_limit(text).expect_err(text);
        assert_err(&e, "conf/a.yaml", &format!("{RL}.queue.max_wait"), needle);
    }
}

#[test]
fn queue_max_wait_garbage_says_invalid_duration() {
    let e = queue_limit("soon").unwrap_err();
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_wait"),
        "invalid duration",
    );
}

#[test]
fn queue_missing_or_zero_fields_are_errors() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nqueue: {max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_waiting"),
        "required",
    );
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nqueue: {max_waiting: 0, max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_waiting"),
        "at least 1",
    );
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nqueue: {max_waiting: 2}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_wait"),
        "required",
    );
}

#[test]
fn queue_on_zero_requests_per_unit_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 0\nqueue: {max_waiting: 2, max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue"),
        "requests_per_unit: 0",
    );
    let e = load_err(&one_limit(
        "unit: second\nqueue: {max_waiting: 2, max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue"),
        "requests_per_unit: 0",
    );
}

#[test]
fn queue_with_unlimited_is_an_error() {
    let e = load_err(&one_limit(
        "unlimited: true\nqueue: {max_waiting: 2, max_wait: 1s}",
    ));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.queue"), "unlimited");
}

// ------------------------------------------------------------------------------------------
// describe()

#[test]
fn describe_lists_every_limit_one_per_line() {
    let a = "domain: b_domain
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: inner
        rate_limit: {unit: hour, requests_per_unit: 2, name: inner_limit}
  - key: free
    rate_limit: {unlimited: true}
  - key: white
    value: listed
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 9}
      - {unit: day, requests_per_unit: 4, queue: {max_waiting: 5, max_wait: 250ms}}
";
    let b = "domain: a_domain
descriptors:
  - key: x
    rate_limit: {unit: Minute, requests_per_unit: 5}
";
    let c = load_with(&[("a.yaml", a), ("b.yaml", b)], LoadOptions::default()).expect("load");
    let lines = c.describe();
    assert_eq!(lines.len(), 6, "one line per limit: {lines:#?}");
    assert!(lines.iter().all(|l| !l.contains('\n')));
    let expect: [(&str, &[&str]); 6] = [
        ("a_domain.x: ", &["MINUTE", "requests_per_unit=5"]),
        ("b_domain.k_v: ", &["SECOND", "requests_per_unit=1"]),
        (
            "b_domain.k_v.inner: ",
            &["HOUR", "requests_per_unit=2", "inner_limit"],
        ),
        ("b_domain.free: ", &["unlimited"]),
        (
            "b_domain.multi: ",
            &["SECOND", "requests_per_unit=3", "token_bucket", "burst=9"],
        ),
        (
            "b_domain.multi: ",
            &["DAY", "requests_per_unit=4", "max_waiting=5", "250ms"],
        ),
    ];
    for (prefix, parts) in expect {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(prefix) && parts.iter().all(|p| l.contains(p))),
            "no line {prefix}{parts:?} in {lines:#?}"
        );
    }
    // Sorted by domain: a_domain first.
    assert!(lines[0].starts_with("a_domain."), "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l.contains("white")),
        "whitelist has no limit: {lines:#?}"
    );
}

// ------------------------------------------------------------------------------------------
// Config::load from disk.

static DIR_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "turnstile-config-test-{}-{tag}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("create parent");
        }
        std::fs::write(&p, text).expect("write file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn domain_yaml(domain: &str) -> String {
    format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n")
}

fn domain_names(c: &Config) -> Vec<String> {
    let mut v: Vec<String> = c.domains.keys().cloned().collect();
    v.sort();
    v
}

#[test]
fn load_directory_reads_yaml_and_yml_only() {
    let t = TempDir::new("dir");
    t.write("a.yaml", &domain_yaml("a"));
    t.write("b.yml", &domain_yaml("b"));
    t.write(".hidden.yaml", &domain_yaml("hidden"));
    t.write("c.txt", &domain_yaml("txt"));
    t.write("c.yaml.bak", &domain_yaml("bak"));
    t.write("README", "not yaml: [");
    t.write("sub/d.yaml", &domain_yaml("sub"));
    // A directory whose name looks like a YAML file is not a file.
    t.write("e.yaml/f.yaml", &domain_yaml("nested"));
    let c = Config::load(t.path(), LoadOptions::default()).expect("load dir");
    assert_eq!(domain_names(&c), ["a", "b"]);
}

#[test]
fn load_directory_with_dotfiles_included() {
    let t = TempDir::new("dot");
    t.write("a.yaml", &domain_yaml("a"));
    t.write(".hidden.yaml", &domain_yaml("hidden"));
    t.write(".other.yml", &domain_yaml("other"));
    let opts = LoadOptions {
        include_dotfiles: true,
        ..Default::default()
    };
    let c = Config::load(t.path(), opts).expect("load dir");
    assert_eq!(domain_names(&c), ["a", "hidden", "other"]);
}

#[test]
fn load_single_file() {
    let t = TempDir::new("file");
    let f = t.write("only.yaml", &domain_yaml("only"));
    t.write("other.yaml", &domain_yaml("other"));
    let c = Config::load(&f, LoadOptions::default()).expect("load file");
    assert_eq!(domain_names(&c), ["only"]);
}

#[test]
fn load_follows_configmap_symlinks() {
    use std::os::unix::fs::symlink;
    let t = TempDir::new("configmap");
    t.write("..2024_01_01_00_00_00.123/a.yaml", &domain_yaml("a"));
    t.write("..2024_01_01_00_00_00.123/b.yml", &domain_yaml("b"));
    symlink("..2024_01_01_00_00_00.123", t.path().join("..data")).expect("symlink ..data");
    symlink("..data/a.yaml", t.path().join("a.yaml")).expect("symlink a.yaml");
    symlink("..data/b.yml", t.path().join("b.yml")).expect("symlink b.yml");
    let c = Config::load(t.path(), LoadOptions::default()).expect("load configmap dir");
    assert_eq!(domain_names(&c), ["a", "b"]);
    // `..data` and the timestamped dir are directories: never loaded twice, even with dotfiles on.
    let opts = LoadOptions {
        include_dotfiles: true,
        ..Default::default()
    };
    let c = Config::load(t.path(), opts).expect("load configmap dir with dotfiles");
    assert_eq!(domain_names(&c), ["a", "b"]);
}

#[test]
fn load_directory_error_names_the_file_on_disk() {
    let t = TempDir::new("bad");
    t.write("a.yaml", &domain_yaml("a"));
    let bad = t.write(
        "b.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnite}\n",
    );
    let e = Config::load(t.path(), LoadOptions::default()).expect_err("invalid file");
    assert_eq!(e.file, bad.display().to_string(), "{e}");
    assert_eq!(e.path, "descriptors[0].rate_limit.unit", "{e}");
    assert!(e.to_string().contains(&bad.display().to_string()));
}

#[test]
fn load_duplicate_domain_in_directory_and_merge() {
    let t = TempDir::new("dup");
    t.write("a.yaml", &domain_yaml("same"));
    t.write("b.yaml", "domain: same\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 9}\n");
    let e = Config::load(t.path(), LoadOptions::default()).expect_err("duplicate");
    assert!(e.file.ends_with("b.yaml"), "{e}");
    assert!(e.message.contains("duplicate domain"), "{e}");
    let opts = LoadOptions {
        merge_domains: true,
        ..Default::default()
    };
    let c = Config::load(t.path(), opts).expect("merged");
    assert_eq!(only_limit(&c, "same", &[("k", "1")]).requests_per_unit, 1);
    assert_eq!(
        only_limit(&c, "same", &[("other", "1")]).requests_per_unit,
        9
    );
}

#[test]
fn load_missing_path_is_an_error() {
    let t = TempDir::new("missing");
    let p = t.path().join("nope");
    let e = Config::load(&p, LoadOptions::default()).expect_err("missing path");
    assert_eq!(e.file, p.display().to_string());
    assert!(e.message.contains("cannot read"), "{e}");
}

#[test]
fn load_empty_directory_gives_no_domains() {
    let t = TempDir::new("empty");
    let c = Config::load(t.path(), LoadOptions::default()).expect("empty dir loads");
    assert!(c.domains.is_empty());
}

// ------------------------------------------------------------------------------------------
// Settings::from_env

fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_env(|k| map.get(k).cloned())
}

fn ok_settings(vars: &[(&str, &str)]) -> Settings {
    settings(vars).unwrap_or_else(|e| panic!("{vars:?}: {e}"))
}

#[test]
fn settings_defaults() {
    let s = ok_settings(&[]);
    assert_eq!(
        s.config_path,
        PathBuf::from("/srv/runtime_data/current/config")
    );
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(s.response_headers, None);
    assert!(!s.global_shadow_mode);
    assert!(!s.load.merge_domains);
    assert!((s.near_limit_ratio - 0.8).abs() < 1e-9);
    assert!(s.workers >= 1 && s.shards >= 1);
    // Empty variables count as unset.
    let s = ok_settings(&[("PORT", ""), ("RUNTIME_ROOT", ""), ("SHADOW_MODE", "")]);
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(
        s.config_path,
        PathBuf::from("/srv/runtime_data/current/config")
    );
}

#[test]
fn settings_runtime_path_composition() {
    let s = ok_settings(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "limits"),
    ]);
    assert_eq!(s.config_path, PathBuf::from("/data/ratelimit/limits"));
    let s = ok_settings(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ]);
    assert_eq!(s.config_path, PathBuf::from("/data/ratelimit/config"));
    let s = ok_settings(&[("RUNTIME_ROOT", "/data")]);
    assert_eq!(s.config_path, PathBuf::from("/data/config"));
    let s = ok_settings(&[("RUNTIME_SUBDIRECTORY", "rl")]);
    assert_eq!(
        s.config_path,
        PathBuf::from("/srv/runtime_data/current/rl/config")
    );
}

#[test]
fn settings_hosts_and_ports() {
    let s = ok_settings(&[
        ("HOST", "127.0.0.1"),
        ("PORT", "9000"),
        ("GRPC_HOST", "::"),
        ("GRPC_PORT", "9001"),
    ]);
    assert_eq!(s.http_addr, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(s.grpc_addr, "[::]:9001".parse().unwrap());
    let s = ok_settings(&[
        ("HOST", "::"),
        ("PORT", "0"),
        ("GRPC_HOST", "[::1]"),
        ("GRPC_PORT", "0"),
    ]);
    assert_eq!(s.http_addr, "[::]:0".parse().unwrap());
    assert_eq!(s.grpc_addr, "[::1]:0".parse().unwrap());
    // Only the port given: host keeps its default.
    let s = ok_settings(&[("GRPC_PORT", "5000")]);
    assert_eq!(s.grpc_addr, "0.0.0.0:5000".parse().unwrap());
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
}

#[test]
fn settings_response_headers() {
    let s = ok_settings(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]);
    assert_eq!(
        s.response_headers,
        Some(HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        })
    );
    let s = ok_settings(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "X-RL-Limit"),
        ("LIMIT_REMAINING_HEADER", "X-RL-Remaining"),
        ("LIMIT_RESET_HEADER", "X-RL-Reset"),
    ]);
    assert_eq!(
        s.response_headers,
        Some(HeaderNames {
            limit: "X-RL-Limit".into(),
            remaining: "X-RL-Remaining".into(),
            reset: "X-RL-Reset".into(),
        })
    );
    // Names alone do not switch the headers on.
    let s = ok_settings(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "false"),
        ("LIMIT_LIMIT_HEADER", "X-RL-Limit"),
    ]);
    assert_eq!(s.response_headers, None);
}

#[test]
fn settings_boolean_flags() {
    let s = ok_settings(&[
        ("SHADOW_MODE", "true"),
        ("MERGE_DOMAIN_CONFIG", "true"),
        ("RUNTIME_IGNOREDOTFILES", "false"),
    ]);
    assert!(s.global_shadow_mode);
    assert!(s.load.merge_domains);
    assert!(s.load.include_dotfiles);
    let s = ok_settings(&[
        ("SHADOW_MODE", "false"),
        ("MERGE_DOMAIN_CONFIG", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
    ]);
    assert!(!s.global_shadow_mode);
    assert!(!s.load.merge_domains);
    assert!(!s.load.include_dotfiles);
    // Go's strconv.ParseBool spellings.
    for t in ["1", "t", "T", "TRUE", "True"] {
        assert!(ok_settings(&[("SHADOW_MODE", t)]).global_shadow_mode, "{t}");
    }
    for f in ["0", "f", "F", "FALSE", "False"] {
        assert!(
            !ok_settings(&[("SHADOW_MODE", f)]).global_shadow_mode,
            "{f}"
        );
    }
}

#[test]
fn settings_near_limit_ratio() {
    let s = ok_settings(&[("NEAR_LIMIT_RATIO", "0.5")]);
    assert!((s.near_limit_ratio - 0.5).abs() < 1e-9);
}

fn settings_err(vars: &[(&str, &str)]) -> String {
    match settings(vars) {
        Ok(s) => panic!("{vars:?} should be refused, got {s:?}"),
        Err(e) => e,
    }
}

#[test]
fn settings_bad_values_name_the_variable() {
    let e = settings_err(&[("PORT", "abc")]);
    assert!(e.contains("PORT=abc"), "{e}");
    let e = settings_err(&[("GRPC_PORT", "x1")]);
    assert!(e.contains("GRPC_PORT=x1"), "{e}");
    let e = settings_err(&[("PORT", "70000")]);
    assert!(e.contains("PORT") && e.contains("70000"), "{e}");
    let e = settings_err(&[("NEAR_LIMIT_RATIO", "2")]);
    assert!(e.contains("NEAR_LIMIT_RATIO"), "{e}");
    let e = settings_err(&[("NEAR_LIMIT_RATIO", "much")]);
    assert!(e.contains("NEAR_LIMIT_RATIO"), "{e}");
    let e = settings_err(&[("SHADOW_MODE", "maybe")]);
    assert!(e.contains("SHADOW_MODE"), "{e}");
    let e = settings_err(&[("MERGE_DOMAIN_CONFIG", "sometimes")]);
    assert!(e.contains("MERGE_DOMAIN_CONFIG"), "{e}");
    let e = settings_err(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "yep")]);
    assert!(e.contains("LIMIT_RESPONSE_HEADERS_ENABLED"), "{e}");
    let e = settings_err(&[("RUNTIME_IGNOREDOTFILES", "nah")]);
    assert!(e.contains("RUNTIME_IGNOREDOTFILES"), "{e}");
}
