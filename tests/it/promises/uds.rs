//! `GRPC_UDS` (docs/settings.md: "gRPC on that unix socket instead of TCP") served to the
//! clients people point at a socket: grpcurl `-unix` sends the socket's path as `:authority`,
//! and the call is answered as over TCP.

use std::process::Command;

use super::*;
use crate::common::tempdir::TempDir;

const CALL: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;

#[test]
fn grpcurl_over_the_unix_socket_as_it_sends() {
    let dir = TempDir::new("uds");
    let config = config_dir(dir.path(), SIMPLE);
    let socket = dir.path().join("rls.sock");
    let s = Server::start(
        &["serve", "--config", config.to_str().unwrap()],
        &[("GRPC_UDS", socket.to_str().unwrap())],
    );
    assert_eq!(s.grpc, format!("unix:{}", socket.display()));
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
