//! The Grafana dashboard and the Prometheus alert rules shipped in `examples/`: the rules pass
//! `promtool check rules` and their own `promtool test rules`, and every series either names is
//! one a running server exports.

use std::collections::BTreeSet;
use std::process::Command;

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
    let text = std::fs::read_to_string(format!("{ROOT}/examples/grafana/turnstile.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_owned()
        })
        .collect()
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
