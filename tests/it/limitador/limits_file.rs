//! The limits file and the `-L` file where they could differ from Limitador's reading: what
//! Limitador takes is taken (a limit without `max_value` is 0, a label whose CEL does not parse
//! is dropped with an error logged), and what turnstile cannot keep shows as what it keeps (a
//! `max_value` past u32 is that cap wherever the limit shows).

use super::*;
use crate::common::binary::{block_on, command, http_get, wait_for};

fn one_limit(namespace: &str, max_value: &str) -> String {
    format!(
        "- name: {namespace}\n  namespace: {namespace}\n{max_value}  seconds: 60\n  \
         conditions: []\n  variables: []\n"
    )
}

#[test]
fn a_max_value_past_u32_shows_as_the_cap_it_counts_to() {
    let limits = one_limit("big", "  max_value: 99999999999\n");
    let l = Limitador::start(&["-H", "DRAFT_VERSION_03"], &limits);
    let call = request("big", &[&[("x", "y")]], 0);
    let r = block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, call)).unwrap();
    assert_eq!(code(&r), "OK");
    let limit = (r.response_headers_to_add.iter())
        .find(|h| h.key == "X-RateLimit-Limit")
        .map(|h| h.value.clone())
        .unwrap_or_default();
    assert!(limit.starts_with("4294967295, 4294967295;w=60"), "{limit}");
    let counters = http_get(l.server.ports.http, "/counters/big");
    assert!(counters.contains(r#""remaining":4294967294"#), "{counters}");
    let shown = http_get(l.server.ports.http, "/limits/big");
    assert!(shown.contains(r#""max_value":4294967295"#), "{shown}");
}

#[test]
fn a_limit_without_max_value_refuses_every_call_as_limitador_reads_it() {
    let l = Limitador::start(&[], &one_limit("unset", ""));
    let call = request("unset", &[&[("x", "y")]], 0);
    let r = block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, call)).unwrap();
    assert_eq!(code(&r), "OVER_LIMIT");
}

#[test]
fn a_label_whose_cel_does_not_parse_is_dropped_and_logged() {
    let dir = TempDir::new("limitador-bad-label");
    let labels = dir.path().join("labels.yaml");
    let text = "user_id: descriptors[0][\"auth.identity.userid\"]\nbroken: descriptors[0][\n";
    std::fs::write(&labels, text).unwrap();
    let l = Limitador::start(&["-L", labels.to_str().unwrap()], LIMITS);
    block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))).unwrap();
    let metrics = http_get(l.server.ports.http, "/metrics");
    let want = r#"authorized_calls{limitador_namespace="ns/route",user_id="alice"} 1"#;
    assert!(metrics.contains(want), "{metrics}");
    let stderr = || l.server.stderr();
    let said = |s: &str| s.contains("custom metric label dropped") && s.contains("broken");
    wait_for("the error", || (!said(&stderr())).then(stderr));
}

#[test]
fn a_type_error_names_the_limit() {
    let dir = TempDir::new("limitador-type-error");
    let exe = limitador_server(dir.path());
    let file = dir.path().join("neg.yaml");
    let text = one_limit("a", "  max_value: 1\n") + &one_limit("b", "  max_value: -3\n");
    std::fs::write(&file, text).unwrap();
    let out = (command(&exe, &["--validate", file.to_str().unwrap()], &[]).output()).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("neg.yaml: line 7: limits[1]"), "{err}");
}
