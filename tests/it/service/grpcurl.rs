//! grpcurl against the real server through reflection only (no .proto files): the README's
//! walkthrough, run as written against the bundled config/example.yaml.

use std::process::Command;

use crate::common::*;

fn grpcurl(args: &[String]) -> String {
    let out = Command::new("grpcurl")
        .args(args)
        .output()
        .expect("grpcurl is on PATH (scripts/install-test-deps.sh installs it)");
    assert!(
        out.status.success(),
        "grpcurl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Splits a shell command line with single quotes (all the README uses).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// The grpcurl commands of the README's "Try it with grpcurl" section, continuation lines joined.
fn readme_commands() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## Try it with grpcurl")
        .nth(1)
        .expect("README has the grpcurl section");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block");
    block
        .replace("\\\n", " ")
        .lines()
        .filter(|l| l.trim_start().starts_with("grpcurl "))
        .map(|l| words(l.trim())[1..].to_vec())
        .collect()
}

#[tokio::test]
async fn the_readme_walkthrough_works_as_written() {
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.yaml"))
        .unwrap();
    let s = TestServer::start(&yaml).await;
    let addr = s.running().grpc_addr.to_string();
    let cmds: Vec<Vec<String>> = readme_commands()
        .into_iter()
        .map(|c| {
            c.into_iter()
                .map(|w| w.replace("127.0.0.1:8081", &addr))
                .collect()
        })
        .collect();
    assert_eq!(cmds.len(), 3, "list, describe, call: {cmds:?}");
    let outs =
        tokio::task::spawn_blocking(move || cmds.iter().map(|c| grpcurl(c)).collect::<Vec<_>>())
            .await
            .unwrap();
    assert!(
        outs[0].contains("envoy.service.ratelimit.v3.RateLimitService"),
        "{}",
        outs[0]
    );
    assert!(outs[0].contains("grpc.health.v1.Health"), "{}", outs[0]);
    assert!(
        outs[0].contains("envoy.service.rate_limit_quota.v3.RateLimitQuotaService"),
        "RLQS is listed too: {}",
        outs[0]
    );
    assert!(outs[1].contains("rpc ShouldRateLimit"), "{}", outs[1]);
    let answer: serde_json::Value = serde_json::from_str(&outs[2]).unwrap();
    // As the README shows (its durationUntilReset depends on the time of day).
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(answer["statuses"][0]["code"], "OK");
    assert_eq!(
        answer["statuses"][0]["currentLimit"]["requestsPerUnit"],
        100
    );
    assert_eq!(answer["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 99);
    assert!(answer["statuses"][0]["durationUntilReset"]
        .as_str()
        .is_some_and(|d| d.ends_with('s')));
}

#[tokio::test]
async fn health_through_reflection_and_over_limit() {
    let s = TestServer::start("domain: smoke\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 1}\n").await;
    let addr = s.running().grpc_addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        let body =
            r#"{"domain":"smoke","descriptors":[{"entries":[{"key":"api_key","value":"a"}]}]}"#;
        let call = |a: &str| {
            grpcurl(
                &[
                    "-plaintext",
                    "-d",
                    body,
                    a,
                    "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                ]
                .map(String::from),
            )
        };
        let health = grpcurl(
            &[
                "-plaintext",
                "-d",
                r#"{"service":"ratelimit"}"#,
                &addr,
                "grpc.health.v1.Health/Check",
            ]
            .map(String::from),
        );
        (call(&addr), call(&addr), health)
    })
    .await
    .unwrap();
    let second: serde_json::Value = serde_json::from_str(&out.1).unwrap();
    assert_eq!(second["overallCode"], "OVER_LIMIT", "{}", out.0);
    // Exactly SERVING: NOT_SERVING contains the word too.
    let health: serde_json::Value = serde_json::from_str(&out.2).unwrap();
    assert_eq!(health["status"], "SERVING", "{}", out.2);
}
