//! docs/settings.md: "`USE_PROMETHEUS=false` turns them off": no series on any port, the HTTP
//! and debug ports' `/metrics` included (envoyproxy/ratelimit serves Prometheus only on its own
//! listener, and only with `USE_PROMETHEUS=true`).

use crate::common::run::*;
use crate::common::tempdir::TempDir;

fn metrics_status(env: &[(&str, &str)]) -> (u16, u16) {
    let dir = TempDir::new("prom");
    let config = config_dir(dir.path(), SIMPLE);
    let s = serve(&["serve", "--config", config.to_str().unwrap()], env);
    let get = |addr| http_get(addr, "/metrics").expect("GET /metrics").0;
    (get(s.ports.http), get(s.ports.debug.expect("a debug port")))
}

#[test]
fn use_prometheus_false_turns_metrics_off_on_every_port() {
    assert_eq!(metrics_status(&[("USE_PROMETHEUS", "false")]), (404, 404));
}

#[test]
fn metrics_are_served_on_the_http_and_debug_ports_by_default() {
    assert_eq!(metrics_status(&[]), (200, 200));
}

/// One word, one number: the budgets example's alice reports 600 and 600 against 1000. The
/// Prometheus `over_limit` series counts the 200 hits past the limit (as envoyproxy/ratelimit
/// does); `/debug/top` counts the 600 hits of the refused report under another name.
#[test]
fn over_limit_means_one_number_everywhere() {
    let dir = TempDir::new("overlimit");
    let yaml = "domain: ai\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: 1000\n";
    let config = config_dir(dir.path(), yaml);
    let every_call = [("TURNSTILE_TOP_SAMPLE", "1")];
    let s = serve(
        &["serve", "--config", config.to_str().unwrap()],
        &every_call,
    );
    let report = r#"{"domain":"ai","hits_addend":600,"descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;
    assert_eq!(http(s.ports.http, "POST", "/json", report).unwrap().0, 200);
    assert_eq!(http(s.ports.http, "POST", "/json", report).unwrap().0, 429);
    let debug = s.ports.debug.expect("a debug port");
    let (_, metrics) = http_get(debug, "/metrics").unwrap();
    let series = "ratelimit_service_rate_limit_over_limit{domain=\"ai\",descriptor=\"user\"} ";
    let over: u64 = (metrics.lines())
        .find_map(|l| l.strip_prefix(series))
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(over, 200);
    let (_, top) = http_get(debug, "/debug/top?domain=ai").unwrap();
    let top: serde_json::Value = serde_json::from_str(&top).unwrap();
    let alice = &top["limits"][0]["by_hits"][0];
    assert_eq!(alice["value"], "user=alice", "{top}");
    assert_eq!(alice["hits"], 1200, "{top}");
    assert_eq!(
        alice.get("over_limit"),
        None,
        "/debug/top says over_limit {} where the series says {over}",
        alice["over_limit"]
    );
    assert_eq!(alice["refused"], 600, "{top}");
}
