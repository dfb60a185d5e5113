//! docs/settings.md: "`USE_PROMETHEUS=false` turns them off": no series on any port, the HTTP
//! and debug ports' `/metrics` included (envoyproxy/ratelimit serves Prometheus only on its own
//! listener, and only with `USE_PROMETHEUS=true`).

use super::*;
use crate::common::tempdir::TempDir;

fn metrics_status(env: &[(&str, &str)]) -> (u16, u16) {
    let dir = TempDir::new("prom");
    let config = config_dir(dir.path(), SIMPLE);
    let s = Server::start(&["serve", "--config", config.to_str().unwrap()], env);
    let get = |addr| http_get(addr, "/metrics").expect("GET /metrics").0;
    (get(s.http), get(s.debug.expect("a debug port")))
}

#[test]
fn use_prometheus_false_turns_metrics_off_on_every_port() {
    assert_eq!(metrics_status(&[("USE_PROMETHEUS", "false")]), (404, 404));
}

#[test]
fn metrics_are_served_on_the_http_and_debug_ports_by_default() {
    assert_eq!(metrics_status(&[]), (200, 200));
}
