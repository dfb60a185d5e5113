//! Durable counters (`TURNSTILE_STATE_DIR`) through the binary: counts survive a graceful
//! restart for every algorithm and the direct APIs' keys, in another layout; a crash loses at
//! most the last sync interval and never counts what was not admitted; a damaged state is set
//! aside and the process starts; an unusable or held state dir stops the start, named.

mod faults;
mod restart;

use std::net::SocketAddr;
use std::path::Path;

use serde_json::{json, Value};

use crate::common::binary::{Server, BIN};
use crate::common::envoy::post_json;

/// Starts the binary on `config` with its counters in `state`, and `env` besides.
fn start(config: &Path, state: &Path, env: &[(&str, &str)]) -> Server {
    let mut vars = vec![
        ("TURNSTILE_STATE_DIR", state.to_str().unwrap()),
        ("TURNSTILE_WORKERS", "2"),
        ("TURNSTILE_SHARDS", "4"),
    ];
    vars.extend_from_slice(env);
    Server::start(
        Path::new(BIN),
        &["serve", "--config", config.to_str().unwrap()],
        &vars,
    )
}

/// One `ShouldRateLimit` over `/json`: the overall code and each status's `limitRemaining`.
async fn check(http: SocketAddr, domain: &str, descriptors: Value) -> (String, Vec<u64>) {
    let body = json!({ "domain": domain, "descriptors": descriptors });
    let r = post_json(http, &body).await;
    let remaining = r["statuses"]
        .as_array()
        .expect("statuses")
        .iter()
        .map(|s| s["limitRemaining"].as_u64().unwrap_or(0))
        .collect();
    (r["overallCode"].as_str().unwrap().to_string(), remaining)
}

/// A descriptor of one entry, with `hits` as its own `hits_addend` (usage reported).
fn entry(key: &str, value: &str, hits: u64) -> Value {
    json!({ "entries": [{ "key": key, "value": value }], "hits_addend": hits })
}

/// turnstile's own series, on the debug port.
async fn metrics_text(server: &Server) -> String {
    reqwest::get(format!(
        "http://{}/metrics",
        server.ports.debug.expect("a debug port")
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap()
}

/// The value of an unlabelled series on the debug port.
async fn metric(server: &Server, name: &str) -> f64 {
    let text = metrics_text(server).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}
