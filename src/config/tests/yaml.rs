//! YAML the parser refuses or reads in a particular way, with the file and place named.

use super::*;

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
        // The parser says where.
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

/// envoyproxy/ratelimit's YAML library resolves aliases and merge keys (`<<`), so configs
/// written for it use them to share a limit.
#[test]
fn anchors_aliases_and_merge_keys_load() {
    let y = "domain: d
descriptors:
  - key: a
    rate_limit: &per_minute {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: *per_minute
  - &base
    key: c
    rate_limit: {unit: second, requests_per_unit: 1}
  - <<: *base
    value: v
    rate_limit: {unit: hour, requests_per_unit: 7}
";
    let c = load(y);
    for k in ["a", "b"] {
        let l = only_limit(&c, "d", &[(k, "x")]);
        assert_eq!((l.unit, l.requests_per_unit), (Unit::Minute, 5), "{k}");
    }
    let l = only_limit(&c, "d", &[("c", "v")]);
    assert_eq!((l.unit, l.requests_per_unit), (Unit::Hour, 7));
    let l = only_limit(&c, "d", &[("c", "w")]);
    assert_eq!((l.unit, l.requests_per_unit), (Unit::Second, 1));
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
