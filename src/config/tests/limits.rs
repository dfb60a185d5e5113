//! Limits: units, unlimited, replaces, algorithms and lists of limits.

use super::*;

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

#[test]
fn local_first_loads_on_fixed_windows_and_token_buckets() {
    for (algo, want) in [("fixed_window", true), ("token_bucket", false)] {
        let c = load(&one_limit(&format!(
            "unit: second\nrequests_per_unit: 5\nalgorithm: {algo}\nlocal_first: {want}"
        )));
        assert_eq!(only_limit(&c, "d", &[("k", "v")]).local_first, Some(want));
    }
    let c = load(&one_limit("unit: second\nrequests_per_unit: 5"));
    assert_eq!(only_limit(&c, "d", &[("k", "v")]).local_first, None);
}

#[test]
fn local_first_on_a_sliding_window_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nalgorithm: sliding_window\nlocal_first: true",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.local_first"),
        "local_first supports fixed_window and token_bucket, not sliding_window",
    );
    // Saying no is fine.
    load(&one_limit(
        "unit: second\nrequests_per_unit: 5\nalgorithm: sliding_window\nlocal_first: false",
    ));
}

#[test]
fn local_first_with_unlimited_is_an_error() {
    let e = load_err(&one_limit("unlimited: true\nlocal_first: true"));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.local_first"), "unlimited");
}
