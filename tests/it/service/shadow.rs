//! A limit in shadow mode (`shadow_mode: true` on its descriptor, or every limit under
//! `SHADOW_MODE=true`) is reported, never refuses: on every path that can answer a request.
//! The engine in memory and across shards, Redis's local over-limit cache, the breaker's three
//! failure modes, queued limits, `/json` and RLQS each have a test here; through a real Envoy in
//! `envoy::e2e`. The direct APIs (`/rate`, `THROTTLE`, `CL.THROTTLE`) have no shadow mode: their
//! limits come from their own config, and `SHADOW_MODE` is the Envoy service's setting.
//!
//! Every call of the harness also holds the answer to `refused_by_a_status`: an OVER_LIMIT
//! overall code with no status over its limit fails any test. That is what let the local
//! cache's refusal through before: the ported reference test compared statuses, which said
//! OK, and never looked at the overall code, which Envoy answers 429 on.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::common::redis::{env, Redis};
use crate::common::*;
use crate::reference::support::{metrics, shard_sum};

const SHADOW: &str = "
domain: d
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: api
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: queued
    rate_limit:
      unit: minute
      requests_per_unit: 1
      queue: {max_waiting: 10, max_wait: 30s}
";

/// With the over-limit cache on (as the issue found it: a cache of a million bytes).
fn redis_with_cache(redis: &Redis, more: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = env(redis, "");
    for (k, v) in [("LOCAL_CACHE_SIZE_IN_BYTES", "1000000")]
        .iter()
        .chain(more)
    {
        e.retain(|(n, _)| n != k);
        e.push((k.to_string(), v.to_string()));
    }
    e
}

fn both(shadow: &str, api: &str) -> RateLimitRequest {
    req(
        "d",
        vec![desc(&[("shadow", shadow)]), desc(&[("api", api)])],
    )
}

/// Calls 1-3 within the limit, 4 on over it: OK overall every time, the status OK too.
async fn never_refused(s: &TestServer, r: impl Fn() -> RateLimitRequest, what: &str) {
    for i in 1..=8 {
        let got = s.call(r()).await;
        assert_eq!(got.overall_code, OK, "{what}: call {i}: {got:?}");
        assert!(
            got.statuses.iter().all(|st| st.code == OK),
            "{what}: call {i}: {got:?}"
        );
    }
}

#[tokio::test]
async fn in_memory_alone_and_beside_a_binding_limit() {
    let s = TestServer::start(SHADOW).await;
    never_refused(&s, || one("d", &[("shadow", "a")]), "alone").await;
    // Two descriptors, most often on two shards: the engine's verdict across the parts.
    never_refused(&s, || both("b", "b"), "beside api").await;
}

#[tokio::test]
async fn redis_local_cache_answers_ok() {
    let redis = Redis::start();
    let s = TestServer::start_env(SHADOW, redis_with_cache(&redis, &[])).await;
    never_refused(&s, || one("d", &[("shadow", "a")]), "alone").await;
    never_refused(&s, || both("b", "b"), "beside api").await;
    let m = metrics(&s).await;
    assert!(
        shard_sum(
            &m,
            "ratelimit_service_rate_limit_over_limit_with_local_cache_total"
        ) > 0,
        "the cache answered some of them: {m}"
    );
}

#[tokio::test]
async fn global_shadow_mode_with_the_local_cache_answers_ok() {
    let redis = Redis::start();
    let s =
        TestServer::start_env(SHADOW, redis_with_cache(&redis, &[("SHADOW_MODE", "true")])).await;
    for i in 1..=150 {
        let r = s.call(one("d", &[("api", "g")])).await;
        assert_eq!(r.overall_code, OK, "call {i}: {r:?}");
        // The statuses keep saying what the limit says (envoyproxy/ratelimit's global shadow).
        assert_eq!(
            r.statuses[0].code,
            if i > 100 { OVER } else { OK },
            "call {i}"
        );
    }
}

/// Redis is gone and the breaker open: whatever the failure mode, a request whose limits are
/// all in shadow mode (or under `SHADOW_MODE`) is answered OK, never failed or refused.
#[tokio::test]
async fn the_breaker_open_in_every_failure_mode() {
    for mode in ["fallback", "fail_open", "fail_closed"] {
        for global in [false, true] {
            let mut redis = Redis::start();
            let mut e = redis_with_cache(
                &redis,
                &[
                    ("TURNSTILE_REDIS_DEADLINE_MS", "100"),
                    ("TURNSTILE_REDIS_BREAKER_FAILURES", "1"),
                    ("TURNSTILE_REDIS_COOLDOWN_MS", "60000"),
                    ("TURNSTILE_REDIS_FAILURE_MODE", mode),
                ],
            );
            if global {
                e.push(("SHADOW_MODE".into(), "true".into()));
            }
            let s = TestServer::start_env(SHADOW, e).await;
            redis.kill();
            let key = if global { "api" } else { "shadow" };
            let what = format!("{mode}, global shadow {global}");
            for i in 1..=6 {
                // `api` under SHADOW_MODE is over after 100, so the shadow key's 3 are what
                // this test counts past: fallback counts in memory and goes over at call 4.
                let r = s.try_call(one("d", &[(key, "x")])).await;
                let r = r.unwrap_or_else(|e| panic!("{what}: call {i} failed: {e:?}"));
                assert_eq!(r.overall_code, OK, "{what}: call {i}: {r:?}");
            }
        }
    }
}

/// A queued limit under `SHADOW_MODE`: over its limit, the call is answered at once, OK,
/// instead of waiting for room (the clock stands still, so a waiter would wait to the test's
/// timeout).
#[tokio::test]
async fn a_queued_limit_under_global_shadow_does_not_wait() {
    let s = TestServer::start_with(SHADOW, &[("SHADOW_MODE", "true")]).await;
    for i in 1..=3 {
        let r = tokio::time::timeout(Duration::from_secs(5), s.call(one("d", &[("queued", "q")])))
            .await
            .unwrap_or_else(|_| panic!("call {i} waited"));
        assert_eq!(r.overall_code, OK, "call {i}: {r:?}");
    }
}

/// `/json` answers 429 on the overall code: a shadow limit answered from the local cache is
/// a 200 there too.
#[tokio::test]
async fn json_over_http_with_the_local_cache() {
    let redis = Redis::start();
    let s = TestServer::start_env(SHADOW, redis_with_cache(&redis, &[])).await;
    let c = reqwest::Client::new();
    for i in 1..=8 {
        let r = c
            .post(format!("{}/json", s.http))
            .body(r#"{"domain":"d","descriptors":[{"entries":[{"key":"shadow","value":"j"}]}]}"#)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(
            (status, &v["overallCode"]),
            (200, &"OK".into()),
            "call {i}: {v}"
        );
    }
}
