//! `GRPC_UDS` (docs/settings.md: "gRPC on that unix socket instead of TCP") served to the
//! clients people point at a socket: grpcurl `-unix` sends the socket's path as `:authority`,
//! Python's grpc its %-encoding, Envoy its cluster's name; each call is answered as over TCP.

use std::process::Command;

use crate::common::run::*;
use crate::common::tempdir::TempDir;

const CALL: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;

#[test]
fn grpcurl_over_the_unix_socket_as_it_sends() {
    let dir = TempDir::new("uds");
    let config = config_dir(dir.path(), SIMPLE);
    let socket = dir.path().join("rls.sock");
    let s = serve(
        &["serve", "--config", config.to_str().unwrap()],
        &[("GRPC_UDS", socket.to_str().unwrap())],
    );
    assert_eq!(s.ports.grpc, format!("unix:{}", socket.display()));
    let grpcurl = tool("grpcurl");
    let socket = socket.to_str().unwrap();
    let out = Command::new(&grpcurl)
        .args(["-plaintext", "-unix", "-d", CALL, socket])
        .arg("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "grpcurl -unix: {stderr}");
    assert!(stdout.contains("\"overallCode\": \"OK\""), "{stdout}");
    // The health service too, as a probe over the socket would ask.
    let out = Command::new(&grpcurl)
        .args(["-plaintext", "-unix", socket, "grpc.health.v1.Health/Check"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("SERVING"),
        "health over the socket: {stdout}"
    );
}

/// Python's grpc (grpc-core) on a `unix:` target sends the socket path's %-encoding as
/// `:authority`. The call is raw bytes, so no generated code is needed: an empty
/// HealthCheckRequest, and SERVING (field 1 = 1) back.
const PYTHON_HEALTH: &str = r#"
import sys, grpc
check = grpc.insecure_channel("unix:" + sys.argv[1]).unary_unary("/grpc.health.v1.Health/Check")
try:
    print(check(b"", timeout=10).hex())
except grpc.RpcError as e:
    print("error:", e.code(), e.details())
    sys.exit(1)
"#;

#[test]
fn python_grpc_over_the_unix_socket() {
    let python = tool("python3");
    let has_grpc = || {
        Command::new(&python)
            .args(["-c", "import grpc"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_grpc() {
        let st = Command::new("bash")
            .arg(repo().join("scripts/install-test-deps.sh"))
            .status()
            .expect("run scripts/install-test-deps.sh");
        assert!(
            st.success() && has_grpc(),
            "grpcio is missing after install-test-deps.sh"
        );
    }
    let dir = TempDir::new("udspy");
    let config = config_dir(dir.path(), SIMPLE);
    let socket = dir.path().join("rls.sock");
    let _s = serve(
        &["serve", "--config", config.to_str().unwrap()],
        &[("GRPC_UDS", socket.to_str().unwrap())],
    );
    let out = Command::new(&python)
        .args(["-c", PYTHON_HEALTH])
        .arg(&socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        "0801",
        "Python's grpc over the socket: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Envoy reaching turnstile over the socket (a `pipe` address in its cluster), as a sidecar
/// deployment would: the limit is applied through it, and refusing to pass on an error
/// (`failure_mode_deny`) shows the calls really are answered.
#[tokio::test]
async fn envoy_over_a_pipe_address() {
    use crate::common::envoy::{client, envoy_config, header_action, Envoy, EnvoyOpts, Upstream};
    use serde_json::json;

    let dir = TempDir::new("udsenvoy");
    let yaml = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: 2\n";
    let config = config_dir(dir.path(), yaml);
    let socket = dir.path().join("rls.sock");
    let _turnstile = serve(
        &["serve", "--config", config.to_str().unwrap()],
        &[("GRPC_UDS", socket.to_str().unwrap())],
    );
    let upstream = Upstream::start();
    let mut opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-user", "user")]}]),
    );
    opts.failure_mode_deny = true;
    let unused = "127.0.0.1:9".parse().unwrap();
    let mut config = envoy_config(upstream.addr, unused, &opts);
    let turnstile_cluster = (config["static_resources"]["clusters"].as_array_mut())
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == "turnstile"))
        .expect("the turnstile cluster");
    turnstile_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"] = json!({"pipe": {"path": socket.to_str().unwrap()}});
    let envoy = Envoy::start(dir.path(), "envoy", &config).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = client()
            .get(format!("{}/", envoy.base))
            .header("x-user", "alice")
            .send()
            .await
            .expect("a reply from Envoy");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, vec![200, 200, 429]);
}
