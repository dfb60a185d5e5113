//! grpcurl against the real server, through reflection only (no .proto files), as the README shows.

mod common;

use std::process::Command;

use common::*;

fn grpcurl(args: &[&str]) -> String {
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

#[tokio::test]
async fn list_describe_and_call_through_reflection() {
    let s = TestServer::start("domain: smoke\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 1}\n").await;
    let addr = s.running().grpc_addr.to_string();
    let a = addr.clone();
    let (list, describe, first, second) = tokio::task::spawn_blocking(move || {
        let body =
            r#"{"domain":"smoke","descriptors":[{"entries":[{"key":"api_key","value":"a"}]}]}"#;
        let method = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
        (
            grpcurl(&["-plaintext", &a, "list"]),
            grpcurl(&[
                "-plaintext",
                &a,
                "describe",
                "envoy.service.ratelimit.v3.RateLimitService",
            ]),
            grpcurl(&["-plaintext", "-d", body, &a, method]),
            grpcurl(&["-plaintext", "-d", body, &a, method]),
        )
    })
    .await
    .unwrap();
    assert!(
        list.contains("envoy.service.ratelimit.v3.RateLimitService"),
        "{list}"
    );
    assert!(list.contains("grpc.health.v1.Health"), "{list}");
    assert!(describe.contains("rpc ShouldRateLimit"), "{describe}");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    let second: serde_json::Value = serde_json::from_str(&second).unwrap();
    assert_eq!(first["overallCode"], "OK");
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(second["overallCode"], "OVER_LIMIT");
    let health = tokio::task::spawn_blocking(move || {
        grpcurl(&[
            "-plaintext",
            "-d",
            r#"{"service":"ratelimit"}"#,
            &addr,
            "grpc.health.v1.Health/Check",
        ])
    })
    .await
    .unwrap();
    assert!(health.contains("SERVING"), "{health}");
}
