//! What stops a start: a port another process holds, whichever port it is. The debug and
//! Prometheus ports count as the gRPC and HTTP ports do: a liveness probe may be on either
//! (Envoy Gateway's is on the Prometheus port), and a port missing from the ready line would
//! read as switched off on purpose.

use std::net::TcpListener;
use std::time::Duration;

use crate::common::binary::{Starting, BIN};
use crate::common::tempdir::TempDir;

const CONFIG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

#[test]
fn a_taken_debug_or_prometheus_port_stops_the_start_naming_it() {
    let t = TempDir::new("taken-port");
    let config = t.write("limits.yaml", CONFIG);
    let config = config.to_str().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let (port, addr_text) = (addr.port().to_string(), addr.to_string());
    let cases: [(&[(&str, &str)], &str); 2] = [
        (
            &[("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", &port)],
            "the debug port (DEBUG_HOST, DEBUG_PORT)",
        ),
        (
            &[("PROMETHEUS_ADDR", &addr_text)],
            "the Prometheus port (PROMETHEUS_ADDR)",
        ),
    ];
    for (env, names) in cases {
        let mut start = Starting::spawn(BIN.as_ref(), &["serve", "--config", config], env);
        let (status, stderr) = start
            .exit_within(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{names} taken: the start went on"));
        assert_eq!(status.code(), Some(1), "{names}: {stderr}");
        let want = format!("cannot listen on {addr}, {names}");
        assert!(stderr.contains(&want), "{want:?} not in:\n{stderr}");
        assert!(stderr.contains("cannot start"), "{stderr}");
    }
    drop(taken);
}
