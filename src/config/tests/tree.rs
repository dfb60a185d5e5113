//! The limit tree: domains, descriptor keys and values, composite keys, nesting, flags.

use super::*;

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
    assert_eq!(&*m.node().stat_key, "envoy.client_mobile.path_/login");
    let origin = c.origin(m.node());
    assert!(origin.contains("conf/a.yaml"), "{origin}");
    assert!(origin.contains("descriptors[0].descriptors[0]"), "{origin}");
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
