//! The Grafana dashboard and the Prometheus alert rules shipped in `examples/`: the rules pass
//! `promtool check rules` and their own `promtool test rules`, every series either names is
//! one a running server exports, and the dashboard's per-limit and reservations panels, run by
//! promtool over the debug port's series beside the Prometheus port's same-named ones, show
//! one row per limit.

use std::collections::BTreeSet;
use std::process::Command;

use crate::common::tempdir::TempDir;
use crate::common::*;

const CONFIG: &str = r#"
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The series names a scrape shows: every family, and a histogram's `_bucket`, `_sum`, `_count`.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            names.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    names
}

/// The turnstile series a PromQL expression names.
fn series_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("ratelimit_service_") || w.starts_with("turnstile_"))
        .map(str::to_owned)
        .collect()
}

fn dashboard_exprs() -> Vec<String> {
    dashboard_panels()
        .into_iter()
        .flat_map(|(_, exprs)| exprs)
        .collect()
}

/// Each panel's title and its targets' expressions.
fn dashboard_panels() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(format!("{ROOT}/examples/grafana/turnstile.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let expr = |t: &serde_json::Value| {
        let e = t["expr"].as_str().expect("every target has an expr");
        e.to_owned()
    };
    (panels.iter())
        .map(|p| {
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            (title, targets.iter().map(expr).collect())
        })
        .collect()
}

/// The series a Prometheus holds when it scrapes the debug port as the job "turnstile" and the
/// Prometheus port as "turnstile-prometheus", and once more under "turnstile" (a scrape config
/// that names both ports in one job): 60 hits a minute on limit d.k, 30 of them over it, and
/// 3 reservations made, reported a minute.
const BOTH_PORTS: &str = r#"
      - series: 'ratelimit_service_rate_limit_total_hits{domain="d",descriptor="k",instance="a:6070",job="turnstile"}'
        values: '0+60x20'
      - series: 'ratelimit_service_rate_limit_over_limit{domain="d",descriptor="k",instance="a:6070",job="turnstile"}'
        values: '0+30x20'
      - series: 'ratelimit_service_rate_limit_total_hits{domain="",descriptor="all",instance="a:6070",job="turnstile"}'
        values: '0+60x20'
      - series: 'ratelimit_service_rate_limit_over_limit{domain="",descriptor="all",instance="a:6070",job="turnstile"}'
        values: '0+30x20'
      - series: 'ratelimit_service_reservations_made_total{shard="0",instance="a:6070",job="turnstile"}'
        values: '0+3x20'
      - series: 'ratelimit_service_reservations_reported_total{shard="0",instance="a:6070",job="turnstile"}'
        values: '0+3x20'
      - series: 'ratelimit_service_reservations_expired_total{shard="0",instance="a:6070",job="turnstile"}'
        values: '0x20'
      - series: 'ratelimit_service_reservations_withdrawn_total{shard="0",instance="a:6070",job="turnstile"}'
        values: '0x20'
      - series: 'ratelimit_service_rate_limit_total_hits{domain="d",key1="k",instance="a:9090",job="turnstile-prometheus"}'
        values: '0+60x20'
      - series: 'ratelimit_service_rate_limit_over_limit{domain="d",key1="k",instance="a:9090",job="turnstile-prometheus"}'
        values: '0+30x20'
      - series: 'ratelimit_service_rate_limit_total_hits{domain="d",key1="k",instance="a:9090",job="turnstile"}'
        values: '0+60x20'
      - series: 'ratelimit_service_rate_limit_over_limit{domain="d",key1="k",instance="a:9090",job="turnstile"}'
        values: '0+30x20'
"#;

/// The dashboard's per-limit panels and its reservations panel, each expression as Grafana
/// sends it with `$job` = turnstile, run by `promtool test rules` over [`BOTH_PORTS`]: one row
/// for the limit (hits 1/s, over 0.5/s, ratio 0.5), not one more for the Prometheus port's
/// series; reservations made 0.05/s, expired 0.
#[test]
fn the_dashboard_counts_each_limit_once_beside_the_prometheus_ports_series() {
    let limit = r#"'{domain="d",descriptor="k"}'"#;
    let want: [(&str, &[(&str, f64)]); 4] = [
        ("Hits per limit", &[(limit, 1.0)]),
        ("Over limit per limit", &[(limit, 0.5)]),
        ("Over-limit ratio per limit", &[(limit, 0.5)]),
        (
            "Reservations (limits with reserve)",
            &[("'{}'", 0.05), ("'{}'", 0.05), ("'{}'", 0.0), ("'{}'", 0.0)],
        ),
    ];
    let panels = dashboard_panels();
    let mut cases = String::new();
    for (title, samples) in want {
        let (_, exprs) = (panels.iter())
            .find(|(t, _)| t == title)
            .unwrap_or_else(|| panic!("no panel {title:?}"));
        assert_eq!(exprs.len(), samples.len(), "{title}: {exprs:?}");
        for (expr, (labels, value)) in exprs.iter().zip(samples) {
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$job", "turnstile");
            cases.push_str(&format!(
                "      - expr: '{}'\n        eval_time: 10m\n        exp_samples:\n          - labels: {labels}\n            value: {value}\n",
                expr.replace('\'', "''")
            ));
        }
    }
    let t = TempDir::new("dashboard-promtool");
    let file = t.write(
        "dashboard_test.yaml",
        &format!(
            "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:{BOTH_PORTS}    promql_expr_test:\n{cases}"
        ),
    );
    let out = Command::new("promtool")
        .args(["test", "rules", file.to_str().unwrap()])
        .output()
        .expect("promtool is on PATH (scripts/install-test-deps.sh installs Debian's prometheus)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn alert_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(format!("{ROOT}/examples/prometheus/alerts.yaml")).unwrap();
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).expect("the rules are YAML");
    rules["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .map(|r| {
            r["expr"]
                .as_str()
                .expect("every rule has an expr")
                .to_owned()
        })
        .collect()
}

#[test]
fn the_alert_rules_pass_promtool() {
    let out = Command::new("promtool")
        .args([
            "check",
            "rules",
            &format!("{ROOT}/examples/prometheus/alerts.yaml"),
        ])
        .output()
        .expect("promtool is on PATH (scripts/install-test-deps.sh installs Debian's prometheus)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The rules' own unit tests (`examples/prometheus/alerts_test.yaml`): the utilisation alert
/// fires on a limit used over 90 % for 10 minutes and not on one at 50 %.
#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let out = Command::new("promtool")
        .args([
            "test",
            "rules",
            &format!("{ROOT}/examples/prometheus/alerts_test.yaml"),
        ])
        .output()
        .expect("promtool is on PATH (scripts/install-test-deps.sh installs Debian's prometheus)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn every_series_the_dashboard_and_the_rules_name_is_exported() {
    let s =
        TestServer::start_with(CONFIG, &[("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")]).await;
    // Some traffic, so every family has its lines.
    for _ in 0..2 {
        s.call(one("d", &[("k", "v")])).await;
    }
    // The examples scrape the debug port's /metrics (the Prometheus port serves the reference's
    // mapped series).
    let addr = s.running().debug_addr.expect("the debug port");
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let names = exported(&text);
    let mut used = 0;
    for (what, exprs) in [
        ("dashboard", dashboard_exprs()),
        ("alert rules", alert_exprs()),
    ] {
        for expr in exprs {
            let series = series_in(&expr);
            assert!(
                !series.is_empty(),
                "{what}: `{expr}` names no turnstile series"
            );
            for name in series {
                assert!(names.contains(&name), "{what}: `{name}` is not exported");
                used += 1;
            }
        }
    }
    assert!(used >= 20, "{used} series checked");
}
