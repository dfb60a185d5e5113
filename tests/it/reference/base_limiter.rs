//! envoyproxy/ratelimit's test/limiter/base_limiter_test.go (commit f2fb157), against turnstile
//! on a real Redis. The Go tests call the base limiter's parts one by one: the cache keys it
//! generates, its local-cache lookup, the status it builds from a count before and after the
//! increment. Here each is what a call makes observable: the keys and counts in Redis, the
//! statuses, the stats, and a key in the local cache answering without Redis (the key is
//! deleted from Redis after it went over, and the next call is still refused and leaves it
//! absent). A `LimitInfo` the Go test builds by hand becomes a seeded count and a hits_addend
//! giving the same before/after counts (or, where the hand-built numbers are not a count and an
//! addition, the same thresholds crossed: said at the case).
//!
//! Settings as fixed_cache.rs's [`ref_env`]: the reference's counting and no local cache unless
//! the Go test makes one (`freecache.NewCache(100)`: then turnstile's default 1 MiB).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::fixed_cache::{count, hits4, local_cache_total, n, ref_env, seed, statuses};
use super::support::*;
use crate::common::redis::Redis;
use crate::common::{TestServer, OK, OVER};

const NOW: u64 = 1234;
const KEY: &str = "domain_key_value_1234";
const SK: &str = "domain.key_value";
const LOCAL_CACHE: (&str, &str) = ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576");

fn yaml(rpu: u32, shadow: bool) -> String {
    format!(
        "domain: domain\ndescriptors:\n  - key: key\n    value: value\n{}    rate_limit: {{unit: second, requests_per_unit: {rpu}}}\n",
        if shadow { "    shadow_mode: true\n" } else { "" }
    )
}

fn key_value(hits: u32) -> RateLimitRequest {
    request("domain", &[&[("key", "value")]], hits)
}

fn st(code: i32, rpu: u32, remaining: u32) -> Vec<DescriptorStatus> {
    vec![limited(code, rpu, SECOND, remaining, reset(SECOND, NOW))]
}

fn keys(redis: &Redis) -> Vec<String> {
    let mut k: Vec<String> = redis
        .cli(&["KEYS", "*"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    k.sort();
    k
}

async fn server(redis: &Redis, prefix: &str, yaml: &str, extra: &[(&str, &str)]) -> TestServer {
    start_at_env(NOW, yaml, ref_env(redis, prefix, extra)).await
}

/// `TestGenerateCacheKeys` (base_limiter_test.go:21) and `TestGenerateCacheKeysPrefix` (:40):
/// the key is `<prefix>domain_key_value_1234`, and total_hits counts the request's hits.
async fn generate_cache_keys(prefix: &str) {
    let redis = Redis::start();
    let s = server(&redis, prefix, &yaml(10, false), &[]).await;
    // :33 (:52)
    assert_eq!(n(&metrics(&s).await, SK, "total_hits"), 0);
    s.call(key_value(1)).await;
    let key = format!("{prefix}{KEY}");
    // :36 (:55)
    assert_eq!(keys(&redis), vec![key.clone()]);
    assert_eq!(count(&redis, &key), Some(1));
    // The key this call created expires after the unit (fixed_cache_impl.go's
    // `EXPIRE key 1`, EXPIRATION_JITTER_MAX_SECONDS 0).
    let pttl: i64 = redis.cli(&["PTTL", &key]).parse().unwrap();
    assert!((1..=1000).contains(&pttl), "PTTL {pttl} ms, expected 1 s");
    // :37 (:56)
    assert_eq!(n(&metrics(&s).await, SK, "total_hits"), 1);
}

/// `TestGenerateCacheKeys` (base_limiter_test.go:21).
#[tokio::test]
async fn generate_cache_keys_no_prefix() {
    generate_cache_keys("").await;
}

/// `TestGenerateCacheKeysPrefix` (base_limiter_test.go:40).
#[tokio::test]
async fn generate_cache_keys_prefix() {
    generate_cache_keys("prefix:").await;
}

const SHARE: &str = "domain: domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: parent
    value: value1
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 10}
";

/// `TestGenerateCacheKeysWithShareThreshold` (base_limiter_test.go:59): values matching a
/// `share_threshold` wildcard count under one key, the pattern in place of the value. The Go
/// test sets `ShareThresholdKeyPattern` by hand; here the config says `share_threshold: true`
/// on the same entries.
#[tokio::test]
async fn generate_cache_keys_with_share_threshold() {
    let redis = Redis::start();
    let s = server(&redis, "", SHARE, &[]).await;
    // Tests 1 and 2 (:70-95): six values under files/*.
    let values = [
        "files/a.pdf",
        "files/b.csv",
        "files/c.txt",
        "files/d.json",
        "files/e.xml",
        "files/subdir/f.txt",
    ];
    for v in values {
        s.call(request("domain", &[&[("files", v)]], 1)).await;
        assert_eq!(
            keys(&redis),
            vec!["domain_files_files/*_1234".to_string()],
            "{v}"
        );
    }
    assert_eq!(count(&redis, "domain_files_files/*_1234"), Some(6));
    // Test 3 (:97-116): the second level shares, the first keeps its value.
    for f in ["nested/file1.txt", "nested/file2.csv"] {
        s.call(request(
            "domain",
            &[&[("parent", "value1"), ("files", f)]],
            1,
        ))
        .await;
    }
    assert_eq!(
        count(&redis, "domain_parent_value1_files_nested/*_1234"),
        Some(2)
    );
    // Test 4 (:118-137): both levels share.
    for (a, b) in [
        ("top/file1.txt", "nested/sub1.txt"),
        ("top/file2.pdf", "nested/sub2.csv"),
    ] {
        s.call(request("domain", &[&[("files", a), ("files", b)]], 1))
            .await;
    }
    assert_eq!(
        count(&redis, "domain_files_top/*_files_nested/*_1234"),
        Some(2)
    );
    assert_eq!(
        keys(&redis),
        vec![
            "domain_files_files/*_1234",
            "domain_files_top/*_files_nested/*_1234",
            "domain_parent_value1_files_nested/*_1234",
        ]
    );
}

/// Makes `KEY` (limit 5) go over: seeded 5, a call adds 1 and is refused; with a local cache,
/// the key is in it from then on.
async fn over_once(s: &TestServer, redis: &Redis, code: i32) {
    seed(redis, KEY, 5, SECOND);
    assert_eq!(statuses(s, key_value(1)).await, st(code, 5, 0));
    assert_eq!(count(redis, KEY), Some(6));
}

/// `TestOverLimitWithLocalCache` (base_limiter_test.go:140): a key in the local cache is over
/// the limit. The Go test puts it there by hand; here a refusal does, and the next call is
/// answered without Redis.
#[tokio::test]
async fn over_limit_with_local_cache() {
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(5, false), &[LOCAL_CACHE]).await;
    over_once(&s, &redis, OVER).await;
    redis.cli(&["DEL", KEY]);
    // :149
    assert_eq!(statuses(&s, key_value(1)).await, st(OVER, 5, 0));
    assert_eq!(count(&redis, KEY), None, "answered without Redis");
    assert_eq!(local_cache_total(&metrics(&s).await), 1);
}

/// `TestNoOverLimitWithLocalCache` (base_limiter_test.go:152): without a local cache (:157), or
/// with one that does not hold the key (:161), the call goes to Redis.
#[tokio::test]
async fn no_over_limit_with_local_cache() {
    // :157-159: no local cache; the key went over, but the next call asks Redis (which, the
    // key deleted, counts it afresh).
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(5, false), &[]).await;
    over_once(&s, &redis, OVER).await;
    redis.cli(&["DEL", KEY]);
    assert_eq!(statuses(&s, key_value(1)).await, st(OK, 5, 4));
    assert_eq!(count(&redis, KEY), Some(1));
    assert_eq!(local_cache_total(&metrics(&s).await), 0);

    // :160-163: a local cache without the key.
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(5, false), &[LOCAL_CACHE]).await;
    assert_eq!(statuses(&s, key_value(1)).await, st(OK, 5, 4));
    assert_eq!(count(&redis, KEY), Some(1));
    assert_eq!(local_cache_total(&metrics(&s).await), 0);
}

/// `TestGetResponseStatusEmptyKey` (base_limiter_test.go:166): a descriptor without a limit
/// (no cache key) is OK with nothing remaining, and nothing is counted.
#[tokio::test]
async fn get_response_status_empty_key() {
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(5, false), &[]).await;
    let r = statuses(&s, request("domain", &[&[("other", "value")]], 1)).await;
    // :173-174
    assert_eq!(r, vec![no_limit()]);
    assert_eq!(keys(&redis), Vec::<String>::new());
}

/// `TestGetResponseStatusOverLimitWithLocalCache` (base_limiter_test.go:177) and its shadow-mode
/// twin (:199): a key in the local cache, a request of 2 hits: OVER_LIMIT (OK in shadow mode)
/// with nothing remaining; over_limit and over_limit_with_local_cache add the 2 hits, and
/// shadow_mode too in shadow mode.
async fn over_limit_with_local_cache_status(shadow: bool) {
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(5, shadow), &[LOCAL_CACHE]).await;
    let code = if shadow { OK } else { OVER };
    over_once(&s, &redis, code).await;
    let m = metrics(&s).await;
    let before = (
        n(&m, SK, "over_limit"),
        local_cache_total(&m),
        n(&m, SK, "shadow_mode"),
    );
    // :189 (:212)
    assert_eq!(statuses(&s, key_value(2)).await, st(code, 5, 0));
    let m = metrics(&s).await;
    let after = (
        n(&m, SK, "over_limit"),
        local_cache_total(&m),
        n(&m, SK, "shadow_mode"),
    );
    // :190-196 (:214-220), with the count in Redis: the local cache answers, no INCRBY.
    assert_eq!(
        (
            count(&redis, KEY),
            after.0 - before.0,
            after.1 - before.1,
            after.2 - before.2
        ),
        (Some(6), 2, 2, if shadow { 2 } else { 0 })
    );
}

/// `TestGetResponseStatusOverLimitWithLocalCache` (base_limiter_test.go:177).
#[tokio::test]
async fn get_response_status_over_limit_with_local_cache() {
    over_limit_with_local_cache_status(false).await;
}

/// `TestGetResponseStatusOverLimitWithLocalCacheShadowMode` (base_limiter_test.go:199).
#[tokio::test]
async fn get_response_status_over_limit_with_local_cache_shadow_mode() {
    over_limit_with_local_cache_status(true).await;
}

/// `TestGetResponseStatusOverLimit` (base_limiter_test.go:223) and its shadow-mode twin (:248):
/// limit 5, the count from 2 to 7 (`NewRateLimitInfo(limit, 2, 7, ..)`; the Go test passes
/// hitsAddend 1 with it, which the over/near split does not read when the count was under the
/// limit before: here 5 hits make it 7). OVER_LIMIT (OK in shadow mode), nothing remaining,
/// over_limit 7 - 5 = 2, near_limit 5 - max(4, 2) = 1, and the key goes into the local cache
/// (:239-241, :265-267): the next call is answered without Redis.
async fn over_limit_status(shadow: bool) {
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(5, shadow), &[LOCAL_CACHE]).await;
    let code = if shadow { OK } else { OVER };
    seed(&redis, KEY, 2, SECOND);
    // :236-238 (:262-264)
    assert_eq!(statuses(&s, key_value(5)).await, st(code, 5, 0));
    assert_eq!(count(&redis, KEY), Some(7));
    let m = metrics(&s).await;
    // :242-245 (:268-269)
    assert_eq!(n(&m, SK, "over_limit"), 2);
    assert_eq!(n(&m, SK, "near_limit"), 1);
    // :245: no shadow_mode; shadow_mode counts the hits over the limit in the twin.
    assert_eq!(n(&m, SK, "shadow_mode"), if shadow { 2 } else { 0 });
    assert_eq!(local_cache_total(&m), 0);

    // :239-241 (:265-267): the key is in the local cache: the next call is answered from it,
    // without an INCRBY (Redis keeps 7).
    let r = statuses(&s, key_value(1)).await;
    let m = metrics(&s).await;
    assert_eq!(
        (r, count(&redis, KEY), local_cache_total(&m)),
        (st(code, 5, 0), Some(7), 1),
        "answered from the local cache, without Redis"
    );
}

/// `TestGetResponseStatusOverLimit` (base_limiter_test.go:223).
#[tokio::test]
async fn get_response_status_over_limit() {
    over_limit_status(false).await;
}

/// `TestGetResponseStatusOverLimitShadowMode` (base_limiter_test.go:248).
#[tokio::test]
async fn get_response_status_over_limit_shadow_mode() {
    over_limit_status(true).await;
}

/// `TestGetResponseStatusBelowLimit` (base_limiter_test.go:272) and its shadow-mode twin (:293):
/// limit 10, the count after 6 (`NewRateLimitInfo(limit, 2, 6, ..)`, hitsAddend 1: here seeded
/// 5, 1 hit; the before count does not matter under the near-limit threshold 8): OK, 4
/// remaining, near_limit 0, within_limit 1, shadow_mode 0.
async fn below_limit_status(shadow: bool) {
    let redis = Redis::start();
    let s = server(&redis, "", &yaml(10, shadow), &[]).await;
    seed(&redis, KEY, 5, SECOND);
    // :284-285 (:305-306)
    assert_eq!(statuses(&s, key_value(1)).await, st(OK, 10, 4));
    assert_eq!(count(&redis, KEY), Some(6));
    let m = metrics(&s).await;
    // :286-290 (:307-311)
    assert_eq!(hits4(&m, SK), (1, 0, 0, 1));
    assert_eq!(n(&m, SK, "shadow_mode"), 0);
}

/// `TestGetResponseStatusBelowLimit` (base_limiter_test.go:272).
#[tokio::test]
async fn get_response_status_below_limit() {
    below_limit_status(false).await;
}

/// `TestGetResponseStatusBelowLimitShadowMode` (base_limiter_test.go:293).
#[tokio::test]
async fn get_response_status_below_limit_shadow_mode() {
    below_limit_status(true).await;
}
