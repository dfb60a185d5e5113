//! End to end through a real Envoy: client --HTTP/1.1--> Envoy (envoy.filters.http.ratelimit)
//! --gRPC--> turnstile, and Envoy --> a tiny upstream written here.
//!
//! Every test starts its own turnstile (the binary built by cargo, on port 0, with a config
//! written for that test), its own upstream and its own Envoy (listener and admin on port 0,
//! found again through `--admin-address-path` and the admin `/listeners` endpoint), so tests
//! share no counters and can run in parallel.
//!
//! Needs `envoy` on PATH (or ENVOY_BIN=/path/to/envoy): run scripts/install-test-deps.sh.
//! Without it the tests fail; they do not skip.
//!
//! Limits use hour windows so a window boundary does not fall inside a test; before counting,
//! a test also waits out the last seconds of a window if it happens to start there.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::common::envoy::*;
use serde_json::json;

// ------------------------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn limits_each_api_key_value_separately() {
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let stack = Stack::start(
        "api_key",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let (envoy, upstream) = (&stack.envoy, &stack.upstream);
    let c = client();
    let url = format!("{}/anything", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for i in 1..=3 {
        let r = get(&c, &url, &[("x-api-key", "alice")]).await;
        assert_status(&r, 200, &format!("alice request {i} of 3 allowed"));
        assert_eq!(r.header("x-upstream-saw-x-api-key"), Some("alice"));
    }
    let r = get(&c, &url, &[("x-api-key", "alice")]).await;
    assert_status(&r, 429, "alice request 4 over the limit of 3");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:#?}");
    assert_eq!(upstream.hits(), 3, "the 429 must not reach the upstream");

    // Another value of the same key has its own counter.
    for i in 1..=3 {
        let r = get(&c, &url, &[("x-api-key", "bob")]).await;
        assert_status(&r, 200, &format!("bob request {i} of 3 allowed"));
    }
    assert_status(
        &get(&c, &url, &[("x-api-key", "bob")]).await,
        429,
        "bob request 4",
    );
    // alice is still limited.
    assert_status(
        &get(&c, &url, &[("x-api-key", "alice")]).await,
        429,
        "alice request 5",
    );
    // No header: Envoy builds no descriptor and does not limit.
    for _ in 0..5 {
        assert_status(&get(&c, &url, &[]).await, 200, "request without x-api-key");
    }
}

#[tokio::test]
async fn limits_each_client_address_separately() {
    let opts = EnvoyOpts::new("edge", json!([{"actions": [{"remote_address": {}}]}]));
    let stack = Stack::start(
        "remote_address",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let (envoy, upstream) = (&stack.envoy, &stack.upstream);
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for ip in [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)] {
        let c = client_from(ip);
        for i in 1..=2 {
            let r = get(&c, &url, &[]).await;
            assert_status(&r, 200, &format!("client {ip} request {i} of 2"));
            assert_eq!(r.num("x-ratelimit-remaining"), 2 - i, "{r:#?}");
        }
        let r = get(&c, &url, &[]).await;
        assert_status(
            &r,
            429,
            &format!("client {ip} request 3 over the limit of 2"),
        );
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test]
async fn x_ratelimit_headers_carry_limit_remaining_and_reset() {
    // Two descriptors per request: Envoy reports the one closest to its limit (api_key).
    let opts = EnvoyOpts::new(
        "edge",
        json!([
            {"actions": [header_action("x-api-key", "api_key")]},
            {"actions": [{"remote_address": {}}]}
        ]),
    );
    let stack = Stack::start(
        "x_headers",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 4}\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let envoy = &stack.envoy;
    let c = client();
    let url = format!("{}/", envoy.base);
    // The minute limit is only there to be reported alongside; keep both windows whole.
    clear_of_window_edge(MINUTE, 20).await;

    for remaining in [3u64, 2, 1, 0] {
        let r = get(&c, &url, &[("x-api-key", "k1")]).await;
        assert_status(&r, 200, &format!("request with {remaining} remaining"));
        let limit = r
            .header("x-ratelimit-limit")
            .unwrap_or_default()
            .to_string();
        // Draft 03: "<limit of the closest policy>, <limit>;w=<window secs>, ..."
        assert!(
            limit.starts_with("4, "),
            "X-RateLimit-Limit {limit:?} should start with the api_key limit 4"
        );
        assert!(limit.contains("4;w=3600"), "X-RateLimit-Limit {limit:?}");
        assert!(limit.contains("100;w=60"), "X-RateLimit-Limit {limit:?}");
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
        assert_reset_near(&r, "x-ratelimit-reset", HOUR);
    }
    let r = get(&c, &url, &[("x-api-key", "k1")]).await;
    assert_status(&r, 429, "request 5 over the limit of 4");
    assert!(
        r.header("x-ratelimit-limit")
            .unwrap_or_default()
            .starts_with("4, "),
        "{r:#?}"
    );
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    assert_reset_near(&r, "x-ratelimit-reset", HOUR);

    // Without the api key only the per-address minute limit applies. From a fresh address:
    // how much of 127.0.0.1's allowance is used depends on whether refused requests count.
    let r = get(&client_from(Ipv4Addr::new(127, 0, 0, 3)), &url, &[]).await;
    assert_status(&r, 200, "request without api key");
    assert!(
        r.header("x-ratelimit-limit")
            .unwrap_or_default()
            .starts_with("100, 100;w=60"),
        "{r:#?}"
    );
    assert_eq!(r.num("x-ratelimit-remaining"), 99, "{r:#?}");
    assert_reset_near(&r, "x-ratelimit-reset", MINUTE);
}

#[tokio::test]
async fn ratelimit_headers_from_turnstile_reach_the_client() {
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let stack = Stack::start(
        "ratelimit_headers",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
        &opts,
    )
    .await;
    let envoy = &stack.envoy;
    let c = client();
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for remaining in [2u64, 1, 0] {
        let r = get(&c, &url, &[("x-api-key", "k")]).await;
        assert_status(&r, 200, &format!("request with {remaining} remaining"));
        assert_eq!(r.num("ratelimit-limit"), 3, "{r:#?}");
        assert_eq!(r.num("ratelimit-remaining"), remaining, "{r:#?}");
        assert_reset_near(&r, "ratelimit-reset", HOUR);
    }
    let r = get(&c, &url, &[("x-api-key", "k")]).await;
    assert_status(&r, 429, "request 4 over the limit of 3");
    assert_eq!(r.num("ratelimit-limit"), 3, "{r:#?}");
    assert_eq!(r.num("ratelimit-remaining"), 0, "{r:#?}");
    assert_reset_near(&r, "ratelimit-reset", HOUR);
}

#[tokio::test]
async fn ratelimit_headers_are_off_by_default() {
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let stack = Stack::start(
        "ratelimit_headers_off",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let envoy = &stack.envoy;
    let r = get(
        &client(),
        &format!("{}/", envoy.base),
        &[("x-api-key", "k")],
    )
    .await;
    assert_status(&r, 200, "first request");
    assert_eq!(r.header("ratelimit-limit"), None, "{r:#?}");
    assert_eq!(r.header("ratelimit-remaining"), None, "{r:#?}");
    assert!(r.header("x-ratelimit-remaining").is_some(), "{r:#?}");
}

#[tokio::test]
async fn route_hits_addend_is_counted_per_descriptor() {
    // /heavy costs 3 hits (RateLimitPerRoute is where Envoy honours hits_addend); every other
    // path costs 1 through the virtual host's rate_limits. Same descriptor, same counter.
    let mut opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    opts.routes = Some(json!([
        route_with_own_limits(
            "/heavy",
            None,
            json!([{
                "actions": [header_action("x-api-key", "api_key")],
                "hits_addend": {"number": 3}
            }])
        ),
        route_to_upstream("/")
    ]));
    let stack = Stack::start(
        "hits_addend",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let envoy = &stack.envoy;
    let c = client();
    let heavy = format!("{}/heavy", envoy.base);
    let light = format!("{}/light", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    // (url, status, remaining after it) for a limit of 10.
    let steps = [
        (&heavy, 200, 7u64),
        (&light, 200, 6),
        (&heavy, 200, 3),
        (&heavy, 200, 0), // exactly at the limit is still allowed
        (&light, 429, 0),
    ];
    for (i, (url, status, remaining)) in steps.into_iter().enumerate() {
        let r = get(&c, url, &[("x-api-key", "k1")]).await;
        assert_status(&r, status, &format!("k1 step {} ({url})", i + 1));
        assert_eq!(
            r.num("x-ratelimit-remaining"),
            remaining,
            "k1 step {} ({url}): {r:#?}",
            i + 1
        );
    }

    // A heavy request that would pass the limit is refused even with 1 left.
    for (i, (status, remaining)) in [(200, 7u64), (200, 4), (200, 1), (429, 0)]
        .into_iter()
        .enumerate()
    {
        let r = get(&c, &heavy, &[("x-api-key", "k2")]).await;
        assert_status(&r, status, &format!("k2 heavy request {}", i + 1));
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
    }
}

#[tokio::test]
async fn turnstile_down_with_failure_mode_allow_lets_traffic_through() {
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let mut stack = Stack::start(
        "fail_open",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let (envoy, upstream) = (&stack.envoy, &stack.upstream);
    let c = client();
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    let r = get(&c, &url, &[("x-api-key", "k")]).await;
    assert_status(&r, 200, "first request while turnstile is up");
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    assert_status(
        &get(&c, &url, &[("x-api-key", "k")]).await,
        429,
        "second request while turnstile is up",
    );

    stack.turnstile.kill();
    for i in 1..=3 {
        let r = get(&c, &url, &[("x-api-key", "k")]).await;
        assert_status(
            &r,
            200,
            &format!("request {i} with turnstile down and failure_mode_deny: false"),
        );
        assert_eq!(r.header("x-ratelimit-remaining"), None, "{r:#?}");
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test]
async fn turnstile_down_with_failure_mode_deny_returns_error_status() {
    let rate_limits = json!([{"actions": [header_action("x-api-key", "api_key")]}]);
    // One Envoy with the default status_on_error (500), one with 503.
    let mut deny_default = EnvoyOpts::new("edge", rate_limits.clone());
    deny_default.failure_mode_deny = true;
    let mut deny_503 = EnvoyOpts::new("edge", rate_limits);
    deny_503.failure_mode_deny = true;
    deny_503.status_on_error = Some(503);
    let mut stack = Stack::start(
        "fail_closed",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
        )],
        &[],
        &deny_default,
    )
    .await;
    let (envoy_500, upstream) = (&stack.envoy, &stack.upstream);
    let envoy_503 = &stack.another_envoy("envoy-503", &deny_503).await;
    let c = client();

    for envoy in [&envoy_500, &envoy_503] {
        let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "k")]).await;
        assert_status(&r, 200, "request while turnstile is up");
    }
    stack.turnstile.kill();
    for (envoy, expected) in [(&envoy_500, 500), (&envoy_503, 503)] {
        for i in 1..=3 {
            let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "k")]).await;
            assert_status(
                &r,
                expected,
                &format!("request {i} with turnstile down and failure_mode_deny: true"),
            );
        }
        // Requests that build no descriptor never ask turnstile, so they pass.
        let r = get(&c, &format!("{}/", envoy.base), &[]).await;
        assert_status(&r, 200, "request without descriptors");
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test]
async fn two_domains_on_two_routes() {
    // The filter's domain is alpha; route /b overrides it with beta (RateLimitPerRoute.domain).
    let rate_limits = json!([{"actions": [header_action("x-api-key", "api_key")]}]);
    let mut opts = EnvoyOpts::new("alpha", rate_limits.clone());
    opts.routes = Some(json!([
        route_with_own_limits("/b", Some("beta"), rate_limits),
        route_to_upstream("/a"),
    ]));
    // A directory of two files, one domain each, with the same descriptor key.
    let stack = Stack::start(
        "two_domains",
        &[
            (
                "alpha.yaml",
                "domain: alpha\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
            ),
            (
                "beta.yaml",
                "domain: beta\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
            ),
        ],
        &[],
        &opts,
    )
    .await;
    let envoy = &stack.envoy;
    let c = client();
    let a = format!("{}/a", envoy.base);
    let b = format!("{}/b", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for (url, limit) in [(&a, 2u64), (&b, 3)] {
        for i in 1..=limit {
            let r = get(&c, url, &[("x-api-key", "same")]).await;
            assert_status(&r, 200, &format!("{url} request {i} of {limit}"));
            assert_eq!(r.num("x-ratelimit-remaining"), limit - i, "{r:#?}");
            assert!(
                r.header("x-ratelimit-limit")
                    .unwrap_or_default()
                    .starts_with(&format!("{limit}, ")),
                "{r:#?}"
            );
        }
        let r = get(&c, url, &[("x-api-key", "same")]).await;
        assert_status(
            &r,
            429,
            &format!("{url} request {} over the limit", limit + 1),
        );
    }
}

#[tokio::test]
async fn shipped_example_behaves_as_its_readme_says() {
    let stack = Stack::shipped_example("example").await;
    let envoy = &stack.envoy;
    let c = client();
    // The limits counted here are per minute.
    clear_of_window_edge(MINUTE, 20).await;

    // README: 5 requests per minute per API key, then 429.
    for remaining in [4u64, 3, 2, 1, 0] {
        let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "demo")]).await;
        assert_status(&r, 200, "x-api-key: demo within 5/minute");
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
        assert!(
            r.header("x-ratelimit-limit")
                .unwrap_or_default()
                .starts_with("5, 5;w=60"),
            "{r:#?}"
        );
    }
    let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "demo")]).await;
    assert_status(&r, 429, "x-api-key: demo, request 6");
    // The gold key has its own, larger allowance.
    let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "gold")]).await;
    assert_status(&r, 200, "x-api-key: gold");
    // /expensive: 2 per minute in total.
    for _ in 0..2 {
        assert_status(
            &get(&c, &format!("{}/expensive/", envoy.base), &[]).await,
            200,
            "/expensive within 2/minute",
        );
    }
    assert_status(
        &get(&c, &format!("{}/expensive/", envoy.base), &[]).await,
        429,
        "/expensive request 3",
    );
    // remote_address: 20 per minute per client, from a fresh client address (the README does
    // the same with curl --interface).
    let fresh = client_from(Ipv4Addr::new(127, 0, 0, 7));
    let mut statuses = Vec::new();
    for _ in 0..21 {
        statuses.push(get(&fresh, &format!("{}/", envoy.base), &[]).await.status);
    }
    assert_eq!(statuses[..20], [200; 20], "{statuses:?}");
    assert_eq!(
        statuses[20], 429,
        "request 21 from one address: {statuses:?}"
    );
}

#[tokio::test]
async fn turnstile_exits_zero_on_sigterm_while_envoy_is_connected() {
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let mut stack = Stack::start(
        "sigterm",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
        )],
        &[],
        &opts,
    )
    .await;
    let envoy = &stack.envoy;
    let r = get(
        &client(),
        &format!("{}/", envoy.base),
        &[("x-api-key", "k")],
    )
    .await;
    assert_status(
        &r,
        200,
        "request through Envoy (opens Envoy's HTTP/2 connection)",
    );

    send_signal(stack.turnstile.child.id(), "TERM");
    let status = wait_with_deadline(&mut stack.turnstile.child, Duration::from_secs(15));
    let status = status.unwrap_or_else(|| {
        panic!(
            "turnstile still running 15s after SIGTERM, with Envoy's idle HTTP/2 connection open"
        )
    });
    assert!(
        status.success(),
        "turnstile exited with {status} after SIGTERM"
    );
}

/// A rule an operator put in shadow mode never produces a 429, also once Redis's over-limit
/// cache holds its key (the fifth call on, with 3 an hour), and under `SHADOW_MODE` no rule
/// does.
#[tokio::test]
async fn a_shadow_rule_never_gets_a_429_with_the_local_cache() {
    let redis = crate::common::redis::Redis::start();
    let url_env = redis.url();
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let yaml = "domain: edge\ndescriptors:\n  - key: api_key\n    value: trial\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    for global in ["false", "true"] {
        let prefix = format!("g{global}_");
        let env = [
            ("BACKEND_TYPE", "redis"),
            ("REDIS_URL", url_env.as_str()),
            ("CACHE_KEY_PREFIX", prefix.as_str()),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000000"),
            ("SHADOW_MODE", global),
        ];
        let stack = Stack::start("shadow", &[("edge.yaml", yaml)], &env, &opts).await;
        let c = client();
        let url = format!("{}/", stack.envoy.base);
        clear_of_window_edge(HOUR, 60).await;
        for i in 1..=8 {
            let r = get(&c, &url, &[("x-api-key", "trial")]).await;
            assert_status(
                &r,
                200,
                &format!("shadow rule, SHADOW_MODE={global}: call {i}"),
            );
        }
        for i in 1..=8 {
            let r = get(&c, &url, &[("x-api-key", "paid")]).await;
            let want = if global == "true" || i <= 3 { 200 } else { 429 };
            assert_status(
                &r,
                want,
                &format!("binding rule, SHADOW_MODE={global}: call {i}"),
            );
        }
    }
}
