//! The Prometheus port serves envoyproxy/ratelimit's series: its statsd stats through
//! statsd_exporter's mapping, Envoy Gateway's file, a user's file or the reference's default;
//! a bad mapping file stops the start naming it; turnstile's own series stay on the HTTP and
//! debug ports. Scraped over HTTP from the binary and checked by `promtool check metrics`.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::common::binary::{block_on, call, http_get};
use crate::common::binary::{start_fails, Server, BIN};
use crate::common::tempdir::TempDir;
use crate::common::{desc, req, OK, OVER};

const EG_FILE: &str = include_str!("data/eg-statsd-conf.yaml");
const EG_V12_FILE: &str = include_str!("data/eg-statsd-conf-v1.2.yaml");

/// A limit shaped as Envoy Gateway generates one for a CIDR rule: the route rule's descriptor,
/// then the masked remote address, 2 a minute.
const EG_CONFIG: &str = "domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0
    value: httproute/default/backend/rule/0/match/0
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit: {unit: minute, requests_per_unit: 2}
";

const KEY1: &str = "httproute/default/backend/rule/0/match/0";

/// The binary with `config` as its limits and `env`; the temp dir holds both.
fn start(t: &TempDir, config: &str, env: &[(&str, &str)]) -> Server {
    t.write("data/ratelimit/config/limits.yaml", config);
    let root = t.path().join("data").display().to_string();
    let mut all = vec![
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("USE_PROMETHEUS", "true"),
    ];
    all.extend_from_slice(env);
    Server::start(std::path::Path::new(BIN), &["serve"], &all)
}

/// Five calls of Envoy Gateway's descriptor: OK, OK, then three over the limit.
fn five_calls(s: &Server) {
    let grpc = s.ports.grpc_addr();
    let request = req(
        "default/eg/http",
        vec![desc(&[
            (KEY1, KEY1),
            ("masked_remote_address", "0.0.0.0/0"),
        ])],
    );
    let codes: Vec<i32> = (0..5)
        .map(|_| block_on(call(grpc, request.clone(), &[])).overall_code)
        .collect();
    assert_eq!(codes, [OK, OK, OVER, OVER, OVER]);
}

fn scrape(s: &Server) -> String {
    let text = http_get(s.ports.metrics.expect("the Prometheus port"), "/metrics");
    promtool_accepts(&text);
    text
}

/// `promtool check metrics` finds nothing wrong but lints of the names a mapping gives (counters
/// without `_total`, which statsd_exporter never appends; a stat's camelCase left unmapped).
fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is on PATH (scripts/install-test-deps.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<&str> = said
        .lines()
        .filter(|l| !l.ends_with("counter metrics should have \"_total\" suffix"))
        .filter(|l| !l.ends_with("should be written in 'snake_case' not 'camelCase'"))
        .collect();
    assert!(
        problems.is_empty() && matches!(out.status.code(), Some(0 | 3)),
        "promtool: {said}\n{text}"
    );
}

/// The value of the series written exactly as `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The family names the exposition declares.
fn families(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect()
}

/// What the reference reports after [`five_calls`] under Envoy Gateway's mapping (its
/// `base_limiter.go` counts each hit in total_hits, the first two within the limit, the other
/// three over it, and the second near it, past floor(2 × 0.8); the gRPC interceptor counts
/// five calls and times each one), and nothing any rule leaves unmapped.
fn envoy_gateways_series(text: &str) {
    let labels = format!(
        "{{domain=\"default/eg/http\",key1=\"{KEY1}_{KEY1}\",key2=\"masked_remote_address_0_0_0_0/0\"}}"
    );
    let stat = |s: &str| value(text, &format!("ratelimit_service_rate_limit_{s}{labels}"));
    assert_eq!(stat("over_limit"), Some(3.0), "{text}");
    assert_eq!(stat("within_limit"), Some(2.0), "{text}");
    assert_eq!(stat("total_hits"), Some(5.0), "{text}");
    assert_eq!(stat("near_limit"), Some(1.0), "{text}");
    assert_eq!(
        stat("shadow_mode"),
        None,
        "never counted, never flushed: {text}"
    );
    let method = "{grpc_method=\"ShouldRateLimit\"}";
    assert_eq!(
        value(text, &format!("ratelimit_service_total_requests{method}")),
        Some(5.0),
        "{text}"
    );
    assert!(text.contains("# TYPE ratelimit_service_response_time_seconds histogram\n"));
    assert_eq!(
        value(
            text,
            &format!("ratelimit_service_response_time_seconds_count{method}")
        ),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        value(text, "ratelimit_service_config_load_success"),
        Some(1.0),
        "{text}"
    );
    for f in families(text) {
        assert!(
            [
                "ratelimit_service_rate_limit_over_limit",
                "ratelimit_service_rate_limit_within_limit",
                "ratelimit_service_rate_limit_total_hits",
                "ratelimit_service_rate_limit_near_limit",
                "ratelimit_service_total_requests",
                "ratelimit_service_response_time_seconds",
                "ratelimit_service_config_load_success",
            ]
            .contains(&f),
            "a family no rule of Envoy Gateway's maps: {f}\n{text}"
        );
    }
}

#[test]
fn envoy_gateways_mapping_gives_the_series_its_e2e_test_queries() {
    for (tag, file) in [("eg", EG_FILE), ("eg-v1.2", EG_V12_FILE)] {
        let t = TempDir::new(tag);
        let mapper = t.write("statsd-exporter/conf.yaml", file);
        let mapper = mapper.display().to_string();
        let s = start(
            &t,
            EG_CONFIG,
            &[
                ("PROMETHEUS_MAPPER_YAML", mapper.as_str()),
                ("USE_STATSD", "false"),
            ],
        );
        five_calls(&s);
        envoy_gateways_series(&scrape(&s));
        let stderr = s.stop();
        assert!(
            !stderr.contains("PROMETHEUS_MAPPER_YAML is ignored"),
            "{stderr}"
        );
    }
}

const CUSTOM: &str = r#"mappings:
  - match: "ratelimit.service.rate_limit.*.*.*.over_limit"
    name: "refused_hits"
    labels:
      tenant: "$1"
      route: "${2}"
      team: "edge"
  - match: 'ratelimit_server\.([^.]*)\.total_requests'
    match_type: regex
    name: "calls_$1"
    labels:
      source: "regex"
  - match: "ratelimit.service.config_load_success"
    match_metric_type: gauge
    name: "never_a_gauge"
  - match: "ratelimit.service.rate_limit.*.*.*.*"
    action: drop
    name: "dropped"
"#;

#[test]
fn a_custom_mapping_renames_and_labels() {
    let t = TempDir::new("custom-mapping");
    let mapper = t.write("mapping.yaml", CUSTOM).display().to_string();
    let s = start(
        &t,
        EG_CONFIG,
        &[("PROMETHEUS_MAPPER_YAML", mapper.as_str())],
    );
    five_calls(&s);
    let text = scrape(&s);
    let labels = format!("{{route=\"{KEY1}_{KEY1}\",team=\"edge\",tenant=\"default/eg/http\"}}");
    assert_eq!(
        value(&text, &format!("refused_hits{labels}")),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "calls_ShouldRateLimit{source=\"regex\"}"),
        Some(5.0),
        "{text}"
    );
    // A counter does not match a gauge rule: unmapped, so named as statsd_exporter names it.
    assert_eq!(
        value(&text, "ratelimit_service_config_load_success"),
        Some(1.0),
        "{text}"
    );
    // The drop rule takes the other per-limit stats; the unmapped timer is a summary.
    assert!(!text.contains("within_limit"), "{text}");
    assert!(
        text.contains("# TYPE ratelimit_server_ShouldRateLimit_response_time summary\n"),
        "{text}"
    );
    s.stop();
}

#[test]
fn without_a_mapping_file_the_references_default_applies() {
    let t = TempDir::new("default-mapping");
    // One key deep: the default mapping's globs.
    let config = "domain: d\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let s = start(&t, config, &[]);
    let request = req("d", vec![desc(&[("tenant", "acme")])]);
    for _ in 0..3 {
        block_on(call(s.ports.grpc_addr(), request.clone(), &[]));
    }
    let text = scrape(&s);
    let labels = "{domain=\"d\",key1=\"tenant_acme\"}";
    let stat = |name: &str| {
        value(
            &text,
            &format!("ratelimit_service_rate_limit_{name}{labels}"),
        )
    };
    assert_eq!(stat("over_limit"), Some(1.0), "{text}");
    assert_eq!(stat("total_hits"), Some(3.0), "{text}");
    assert_eq!(
        value(
            &text,
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"
        ),
        Some(3.0),
        "{text}"
    );
    assert!(text.contains("# TYPE ratelimit_service_response_time_seconds histogram\n"));
    // turnstile's own series are not here.
    assert!(!text.contains("ratelimit_service_requests_total"), "{text}");
    s.stop();
}

#[test]
fn a_bad_mapping_file_stops_the_start_naming_the_file_and_line() {
    let t = TempDir::new("bad-mapping");
    let cases = [
        ("unknown.yaml", "mappings:\n  - match: a.*\n    name: a\n    colour: red\n", "line 4"),
        ("ttl.yaml", "mappings:\n  - match: a.*\n    name: a\n    ttl: 1m\n", "line 4"),
        ("regex.yaml", "mappings:\n  - match: a.*\n    name: a\n  - match: '(a'\n    match_type: regex\n    name: b\n", "line 4"),
    ];
    for (file, text, line) in cases {
        let path = t.write(file, text).display().to_string();
        let err = start_fails(&["serve"], &[("PROMETHEUS_MAPPER_YAML", path.as_str())]);
        assert!(err.contains(&path) && err.contains(line), "{file}: {err}");
    }
    let missing = t.path().join("missing.yaml").display().to_string();
    let err = start_fails(&["serve"], &[("PROMETHEUS_MAPPER_YAML", missing.as_str())]);
    assert!(
        err.contains(&missing) && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn turnstiles_own_series_stay_on_the_http_and_debug_ports() {
    let t = TempDir::new("native-series");
    let s = start(&t, EG_CONFIG, &[]);
    five_calls(&s);
    for port in [s.ports.http, s.ports.debug.expect("the debug port")] {
        let text = http_get(port, "/metrics");
        assert_eq!(
            value(&text, "ratelimit_service_requests_total{door=\"envoy\"}"),
            Some(5.0),
            "{text}"
        );
        assert!(text.contains("ratelimit_service_request_duration_seconds_bucket"));
    }
    let mapped = scrape(&s);
    assert!(
        !mapped.contains("ratelimit_service_requests_total"),
        "{mapped}"
    );
    s.stop();
}
