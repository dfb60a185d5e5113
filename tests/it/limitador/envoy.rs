//! Through Envoy 1.40: the descriptor Kuadrant's wasm-shim sends for a RateLimitPolicy limit
//! (domain `<route-ns>/<route-name>`, one descriptor: `limit.<name>__<hash>` = "1" and the
//! variable's entry, keyed by its CEL text) built by Envoy's rate-limit filter from a generic key
//! and a request header, sent to the binary started as `limitador-server`.

use serde_json::json;

use super::*;
use crate::common::envoy::{assert_status, client, envoy_config, get, Envoy, EnvoyOpts, Upstream};

#[tokio::test]
async fn envoy_admits_a_users_limit_then_answers_429_as_limitador_would() {
    let l = Limitador::start(&["--rate-limit-headers", "DRAFT_VERSION_03"], LIMITS);
    let actions = json!([{"actions": [
        {"generic_key": {"descriptor_key": "limit.toystore_get__1a2b3c4d", "descriptor_value": "1"}},
        {"request_headers": {"header_name": "x-user", "descriptor_key": "auth.identity.userid"}},
    ]}]);
    let opts = EnvoyOpts::new("ns/route", actions);
    let upstream = Upstream::start();
    let dir = TempDir::new("limitador-envoy");
    let config = envoy_config(upstream.addr, l.server.ports.grpc_addr(), &opts);
    let envoy = Envoy::start(dir.path(), "envoy", &config).await;
    let c = client();
    let url = format!("{}/toys", envoy.base);
    for remaining in ["2", "1", "0"] {
        let r = get(&c, &url, &[("x-user", "alice")]).await;
        assert_status(&r, 200, "within toystore-get's 3 a minute");
        assert_eq!(
            r.header("x-ratelimit-limit"),
            Some("3, 3;w=60;name=\"toystore-get\""),
            "{r:#?}"
        );
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining), "{r:#?}");
    }
    let r = get(&c, &url, &[("x-user", "alice")]).await;
    assert_status(&r, 429, "alice's fourth call");
    assert_eq!(upstream.hits(), 3, "the 429 never reaches the upstream");
    // Another user has a counter of its own; a call without the header sends no descriptor
    // the limit's variable can read, so the limit does not apply.
    assert_status(
        &get(&c, &url, &[("x-user", "bob")]).await,
        200,
        "bob's first call",
    );
    for _ in 0..4 {
        assert_status(&get(&c, &url, &[]).await, 200, "a call without x-user");
    }
}
