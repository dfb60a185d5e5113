//! An access log line names the limit that refused a request, read from the dynamic metadata
//! turnstile's answer carries (`refused_by`): what an operator sets up to trace a 429 to its
//! limit. Through a real Envoy, its file access log, and the binary.

use serde_json::json;

use crate::common::envoy::*;
use crate::common::tempdir::TempDir;

#[tokio::test]
async fn an_access_log_prints_the_limit_that_refused() {
    let dir = TempDir::new("envoy-access-log");
    let upstream = Upstream::start();
    let limits = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1, name: per-key-hourly}\n";
    let turnstile = Turnstile::start(
        dir.path(),
        &[("edge.yaml", limits)],
        &[("TURNSTILE_REFUSED_BY_METADATA", "true")],
    );
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let mut config = envoy_config(upstream.addr, turnstile.grpc, &opts);
    let log = dir.path().join("access.log");
    let fmt = "%RESPONSE_CODE% limit=%DYNAMIC_METADATA(envoy.filters.http.ratelimit:refused_by:limit)% key=%DYNAMIC_METADATA(envoy.filters.http.ratelimit:refused_by:key)%\n";
    config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["access_log"] = json!([{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": log.display().to_string(),
            "log_format": {"text_format_source": {"inline_string": fmt}}
        }
    }]);
    let envoy = Envoy::start(dir.path(), "envoy", &config).await;
    let c = client();
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 30).await;
    assert_status(
        &get(&c, &url, &[("x-api-key", "ann")]).await,
        200,
        "first call",
    );
    assert_status(
        &get(&c, &url, &[("x-api-key", "ann")]).await,
        429,
        "second call",
    );
    // Envoy writes its access log on a flush timer: wait for both lines.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 2 || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "200 limit=- key=-",
            "429 limit=per-key-hourly key=edge_api_key_ann_"
        ],
        "{text}"
    );
}
