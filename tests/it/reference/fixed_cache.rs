//! envoyproxy/ratelimit's test/redis/fixed_cache_impl_test.go (commit f2fb157), against
//! turnstile on a real Redis. The Go tests mock the Redis client: a pipeline's `INCRBY`
//! answers the count the test chose. Here the real Redis is seeded first with that count minus
//! the hits (`SET`, under the reference's key layout `domain_key_value_<window start>`), then
//! the same request is made; the statuses, the per-limit stats and the counts left in Redis
//! (the mock's `INCRBY` amounts) are the Go test's.
//!
//! Settings: the Go cache is built with `stopCacheKeyIncrementWhenOverlimit` false (every
//! refused hit kept) and no local cache unless the test makes one, so the servers run with
//! STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false and LOCAL_CACHE_SIZE_IN_BYTES=0 (turnstile's
//! defaults differ: docs/configuration.md, "Where turnstile differs, on purpose"); near-limit ratio 0.8 and
//! no key prefix, as the Go constructor's arguments.
//!
//! TTLs: the Go tests expect an `EXPIRE <unit seconds>` after every `INCRBY`. turnstile sets
//! the TTL once, when its `INCRBY` creates the key (docs/redis-and-fleets.md, "Keys": one command per
//! decision). A seeded key is one earlier calls made, so it is seeded with the TTL their
//! `EXPIRE` left (the unit), and the TTL is asserted to be the unit's after the call; keys of
//! one-second windows are seeded without a TTL (a real 1 s TTL would run out on the wall clock
//! while the server's clock stands still), and the TTL a call gives a key it creates is
//! asserted on fresh keys (`redis_with_jitter`, base_limiter.rs's `generate_cache_keys`).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, DescriptorStatus,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::support::*;
use crate::common::redis::{self, Redis};
use crate::common::{TestServer, OK, OVER};

/// The environment of a cache built as the Go test builds it: the reference's defaults where
/// turnstile's differ, then `extra` (which wins).
pub fn ref_env(redis: &Redis, prefix: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = redis::env(redis, prefix);
    let defaults = [
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ];
    for (k, v) in defaults.iter().chain(extra) {
        env.retain(|(n, _)| n != k);
        env.push((k.to_string(), v.to_string()));
    }
    env
}

pub fn unit_secs(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        other => panic!("unit {other:?} not used by the ported tests"),
    }
}

/// Puts `count` under `key`, as the earlier calls the mock stands for would have left it: with
/// the unit's TTL (their `EXPIRE`), except one-second keys (see the module doc).
pub fn seed(redis: &Redis, key: &str, count: u64, unit: Unit) {
    let n = count.to_string();
    let ttl = unit_secs(unit).to_string();
    let out = if unit == Unit::Second {
        redis.cli(&["SET", key, &n])
    } else {
        redis.cli(&["SET", key, &n, "EX", &ttl])
    };
    assert_eq!(out, "OK", "SET {key}");
}

/// The count under `key`, `None` if there is no such key.
pub fn count(redis: &Redis, key: &str) -> Option<u64> {
    let v = redis.cli(&["GET", key]);
    (!v.is_empty()).then(|| v.parse().unwrap_or_else(|_| panic!("GET {key}: {v}")))
}

/// The key's TTL is the unit's (the Go test's `EXPIRE key <unit>`), give or take the seconds
/// the test itself took on the wall clock.
pub fn assert_unit_ttl(redis: &Redis, key: &str, unit: Unit) {
    let ttl: i64 = redis.cli(&["TTL", key]).parse().unwrap();
    let u = unit_secs(unit) as i64;
    assert!(
        (u - 10..=u).contains(&ttl),
        "TTL {key} = {ttl}, expected {u}"
    );
}

/// A per-limit counter; a counter never incremented may be unexposed, which Prometheus reads
/// as 0 (the Go tests assert 0 on counters that were never added to).
pub fn n(text: &str, stat_key: &str, name: &str) -> u64 {
    stat(text, stat_key, name).unwrap_or(0)
}

/// (total_hits, over_limit, near_limit, within_limit) of a limit.
pub fn hits4(text: &str, stat_key: &str) -> (u64, u64, u64, u64) {
    (
        n(text, stat_key, "total_hits"),
        n(text, stat_key, "over_limit"),
        n(text, stat_key, "near_limit"),
        n(text, stat_key, "within_limit"),
    )
}

/// `over_limit_with_local_cache`: one total in turnstile (docs/configuration.md, "Where turnstile differs").
pub fn local_cache_total(text: &str) -> u64 {
    shard_sum(
        text,
        "ratelimit_service_rate_limit_over_limit_with_local_cache_total",
    )
}

pub async fn statuses(s: &TestServer, r: RateLimitRequest) -> Vec<DescriptorStatus> {
    let RateLimitResponse { statuses, .. } = s.call(r).await;
    statuses
}

const REDIS_YAML: &str = "domain: domain
descriptors:
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        value: subvalue2
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        value: subvalue3
        rate_limit: {unit: day, requests_per_unit: 10}
";

/// `testRedis` (fixed_cache_impl_test.go:44), run by `TestRedis` (:32) without and with a
/// per-second Redis.
async fn test_redis(per_second_redis: bool) {
    let main = Redis::start();
    let second = Redis::start();
    let mut env = ref_env(&main, "", &[]);
    if per_second_redis {
        env.push(("REDIS_PERSECOND".into(), "true".into()));
        env.push(("REDIS_PERSECOND_URL".into(), second.url()));
    }
    let s = start_at_env(1234, REDIS_YAML, env).await;
    // The client the per-second limit's pipeline goes to (:63-68).
    let used = if per_second_redis { &second } else { &main };

    // :70: INCRBY domain_key_value_1234 1 answers 5.
    seed(used, "domain_key_value_1234", 4, SECOND);
    let r = statuses(&s, request("domain", &[&[("key", "value")]], 1)).await;
    assert_eq!(r, vec![limited(OK, 10, SECOND, 5, reset(SECOND, 1234))]);
    assert_eq!(count(used, "domain_key_value_1234"), Some(5));
    if per_second_redis {
        assert_eq!(count(&main, "domain_key_value_1234"), None);
    }
    let m = metrics(&s).await;
    // :79-82
    assert_eq!(hits4(&m, "domain.key_value"), (1, 0, 0, 1));

    // :87: the minute limit goes to the main client; INCRBY 1 answers 11. The first
    // descriptor has no limit (and its own hits_addend 0).
    let k2 = "domain_key2_value2_subkey2_subvalue2_1200";
    seed(&main, k2, 10, MINUTE);
    let r = statuses(
        &s,
        request_per_descriptor(
            "domain",
            &[
                &[("key2", "value2")],
                &[("key2", "value2"), ("subkey2", "subvalue2")],
            ],
            &[0, 1],
        ),
    )
    .await;
    assert_eq!(
        r,
        vec![
            no_limit(),
            limited(OVER, 10, MINUTE, 0, reset(MINUTE, 1234))
        ]
    );
    assert_eq!(count(&main, k2), Some(11));
    assert_unit_ttl(&main, k2, MINUTE);
    if per_second_redis {
        assert_eq!(count(&second, k2), None);
    }
    let m = metrics(&s).await;
    // :106-109
    assert_eq!(
        hits4(&m, "domain.key2_value2.subkey2_subvalue2"),
        (1, 1, 0, 0)
    );

    // :114: the clock at 1 000 000 s; INCRBY key3 0 answers 11, INCRBY subkey3 1 answers 13.
    s.advance(std::time::Duration::from_secs(1_000_000 - 1234));
    let (k3, k3s) = (
        "domain_key3_value3_997200",
        "domain_key3_value3_subkey3_subvalue3_950400",
    );
    seed(&main, k3, 11, HOUR);
    seed(&main, k3s, 12, DAY);
    let r = statuses(
        &s,
        request_per_descriptor(
            "domain",
            &[
                &[("key3", "value3")],
                &[("key3", "value3"), ("subkey3", "subvalue3")],
            ],
            &[0, 1],
        ),
    )
    .await;
    assert_eq!(
        r,
        vec![
            limited(OVER, 10, HOUR, 0, reset(HOUR, 1_000_000)),
            limited(OVER, 10, DAY, 0, reset(DAY, 1_000_000)),
        ]
    );
    assert_eq!(count(&main, k3), Some(11));
    assert_eq!(count(&main, k3s), Some(13));
    assert_unit_ttl(&main, k3, HOUR);
    assert_unit_ttl(&main, k3s, DAY);
    let m = metrics(&s).await;
    // :138-145
    assert_eq!(hits4(&m, "domain.key3_value3"), (0, 0, 0, 0));
    assert_eq!(
        hits4(&m, "domain.key3_value3.subkey3_subvalue3"),
        (1, 1, 0, 0)
    );
}

/// `TestRedis/WithoutPerSecondRedis` (fixed_cache_impl_test.go:33).
#[tokio::test]
async fn redis_without_per_second_redis() {
    test_redis(false).await;
}

/// `TestRedis/WithPerSecondRedis` (fixed_cache_impl_test.go:34).
#[tokio::test]
async fn redis_with_per_second_redis() {
    test_redis(true).await;
}

const KEY4: &str = "domain: domain
descriptors:
  - key: key4
    value: value4
    SHADOWrate_limit: {unit: hour, requests_per_unit: 15}
";

fn key4_yaml(shadow: bool) -> String {
    KEY4.replace(
        "SHADOW",
        if shadow {
            "shadow_mode: true\n    "
        } else {
            ""
        },
    )
}

/// `TestOverLimitWithLocalCache` (fixed_cache_impl_test.go:188) and
/// `TestOverLimitWithLocalCacheShadowRule` (:496): the same calls, the rule in shadow mode in
/// the second. The Go test's freecache gauges (`localcache.*`, `testLocalCacheStats`) are the
/// cache library's internals, not ported; what the local cache does is: the fourth call is
/// answered without Redis (no INCRBY) and counted in `over_limit_with_local_cache`.
async fn local_cache_case(shadow: bool) {
    let redis = Redis::start();
    // freecache.NewCache(100): a local cache (freecache's smallest is 512 KiB); turnstile's
    // default size, 1 MiB, is on.
    let env = ref_env(&redis, "", &[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]);
    let s = start_at_env(1_000_000, &key4_yaml(shadow), env).await;
    let key = "domain_key4_value4_997200";
    let sk = "domain.key4_value4";
    let req = request("domain", &[&[("key4", "value4")]], 1);
    let status = |code, remaining| vec![limited(code, 15, HOUR, remaining, reset(HOUR, 1_000_000))];

    // :206 (:514): INCRBY 1 answers 11, under the near-limit ratio.
    seed(&redis, key, 10, HOUR);
    assert_eq!(statuses(&s, req.clone()).await, status(OK, 4));
    assert_eq!(count(&redis, key), Some(11));
    assert_unit_ttl(&redis, key, HOUR);
    let m = metrics(&s).await;
    assert_eq!(hits4(&m, sk), (1, 0, 0, 1));
    assert_eq!(local_cache_total(&m), 0);

    // :233 (:541): INCRBY 1 answers 13, at the near-limit ratio, still OK.
    seed(&redis, key, 12, HOUR);
    assert_eq!(statuses(&s, req.clone()).await, status(OK, 2));
    assert_eq!(count(&redis, key), Some(13));
    let m = metrics(&s).await;
    assert_eq!(hits4(&m, sk), (2, 0, 1, 2));
    assert_eq!(local_cache_total(&m), 0);

    // :254 (:562): INCRBY 1 answers 16, over the limit (OK in shadow mode); the key goes into
    // the local cache.
    seed(&redis, key, 15, HOUR);
    let code = if shadow { OK } else { OVER };
    assert_eq!(statuses(&s, req.clone()).await, status(code, 0));
    assert_eq!(count(&redis, key), Some(16));
    let m = metrics(&s).await;
    assert_eq!(hits4(&m, sk), (3, 1, 1, 2));
    assert_eq!(local_cache_total(&m), 0);
    if shadow {
        assert_eq!(n(&m, sk, "shadow_mode"), 1); // :577
    }

    // :276 (:585): answered from the local cache, no INCRBY (`.Times(0)`): Redis keeps 16.
    assert_eq!(statuses(&s, req.clone()).await, status(code, 0));
    let m = metrics(&s).await;
    // :283-287 (:598-603), in one assertion so that a difference shows all of itself:
    // (count in Redis, (total, over, near, within), over_limit_with_local_cache, shadow_mode).
    assert_eq!(
        (
            count(&redis, key),
            hits4(&m, sk),
            local_cache_total(&m),
            n(&m, sk, "shadow_mode")
        ),
        (Some(16), (4, 2, 1, 2), 1, if shadow { 2 } else { 0 }),
        "the local cache answers, not Redis"
    );
}

/// `TestOverLimitWithLocalCache` (fixed_cache_impl_test.go:188).
#[tokio::test]
async fn over_limit_with_local_cache() {
    local_cache_case(false).await;
}

/// `TestOverLimitWithLocalCacheShadowRule` (fixed_cache_impl_test.go:496).
#[tokio::test]
async fn over_limit_with_local_cache_shadow_rule() {
    local_cache_case(true).await;
}

/// (key number, limit, hits, INCRBY's answer, code, remaining, (total, over, near, within),
/// where in the Go test).
type HitsCase = (
    &'static str,
    u32,
    u32,
    u64,
    i32,
    u32,
    (u64, u64, u64, u64),
    &'static str,
);

const NEAR_YAML: &str = "domain: domain
descriptors:
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    value: value5
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key6
    value: value6
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: key7
    value: value7
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key8
    value: value8
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key9
    value: value9
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key10
    value: value10
    rate_limit: {unit: second, requests_per_unit: 10}
";

/// `TestNearLimit` (fixed_cache_impl_test.go:293). Its clock goes back from 1 000 000 s to
/// 1234 s at :364; the manual clock only moves forward, so the second half runs on a second
/// server (same config, same Redis) started at 1234 s.
#[tokio::test]
async fn near_limit() {
    let redis = Redis::start();
    let s = start_at_env(1_000_000, NEAR_YAML, ref_env(&redis, "", &[])).await;
    let key = "domain_key4_value4_997200";
    let sk = "domain.key4_value4";
    let req = request("domain", &[&[("key4", "value4")]], 1);
    let status = |code, remaining| vec![limited(code, 15, HOUR, remaining, reset(HOUR, 1_000_000))];

    // :306: INCRBY 1 answers 11, under the near-limit ratio.
    seed(&redis, key, 10, HOUR);
    assert_eq!(statuses(&s, req.clone()).await, status(OK, 4));
    assert_eq!(count(&redis, key), Some(11));
    assert_eq!(hits4(&metrics(&s).await, sk), (1, 0, 0, 1));
    // :329: 13, at the near-limit ratio, still OK.
    seed(&redis, key, 12, HOUR);
    assert_eq!(statuses(&s, req.clone()).await, status(OK, 2));
    assert_eq!(count(&redis, key), Some(13));
    assert_eq!(hits4(&metrics(&s).await, sk), (2, 0, 1, 2));
    // :347: 16, over the limit: near_limit only counts hits near the limit, not past it.
    seed(&redis, key, 15, HOUR);
    assert_eq!(statuses(&s, req).await, status(OVER, 0));
    assert_eq!(count(&redis, key), Some(16));
    assert_unit_ttl(&redis, key, HOUR);
    assert_eq!(hits4(&metrics(&s).await, sk), (3, 1, 1, 2));

    // :362-463: hitsAddend greater than 1, at 1234 s: (key, limit, hits, INCRBY's answer,
    // code, remaining, (total, over, near, within)).
    let s = start_at_env(1234, NEAR_YAML, ref_env(&redis, "", &[])).await;
    let cases: [HitsCase; 6] = [
        (
            "5",
            20,
            3,
            5,
            OK,
            15,
            (3, 0, 0, 3),
            ":365 under limit, under near limit",
        ),
        (
            "6",
            8,
            2,
            7,
            OK,
            1,
            (2, 0, 1, 2),
            ":382 under limit, some over near limit",
        ),
        (
            "7",
            20,
            3,
            19,
            OK,
            1,
            (3, 0, 3, 3),
            ":399 under limit, all over near limit",
        ),
        (
            "8",
            20,
            3,
            22,
            OVER,
            0,
            (3, 2, 1, 0),
            ":416 some over limit, all over near",
        ),
        (
            "9",
            20,
            7,
            22,
            OVER,
            0,
            (7, 2, 4, 0),
            ":433 some of it in all three places",
        ),
        (
            "10",
            10,
            3,
            30,
            OVER,
            0,
            (3, 3, 0, 0),
            ":450 all of it over limit",
        ),
    ];
    for (i, rpu, hits, after, code, remaining, stats, why) in cases {
        let (k, v) = (format!("key{i}"), format!("value{i}"));
        let key = format!("domain_{k}_{v}_1234");
        seed(&redis, &key, after - u64::from(hits), SECOND);
        let r = statuses(&s, request("domain", &[&[(&k, &v)]], hits)).await;
        assert_eq!(
            r,
            vec![limited(code, rpu, SECOND, remaining, reset(SECOND, 1234))],
            "{why}"
        );
        assert_eq!(count(&redis, &key), Some(after), "{why}");
        let m = metrics(&s).await;
        assert_eq!(hits4(&m, &format!("domain.{k}_{v}")), stats, "{why}");
    }
}

/// `TestRedisWithJitter` (fixed_cache_impl_test.go:466): EXPIRATION_JITTER_MAX_SECONDS 3600.
/// The Go test's jitter source answers 100, so `EXPIRE domain_key_value_1234 101` (:481);
/// turnstile's random jitter is not settable, so the TTL is asserted in the range the
/// reference's `1 + Int63n(3600)` can give, on a key the call creates (see the module doc).
#[tokio::test]
async fn redis_with_jitter() {
    let redis = Redis::start();
    let env = ref_env(&redis, "", &[("EXPIRATION_JITTER_MAX_SECONDS", "3600")]);
    let s = start_at_env(1234, REDIS_YAML, env).await;
    // :480: INCRBY 1 answers 5.
    seed(&redis, "domain_key_value_1234", 4, SECOND);
    let r = statuses(&s, request("domain", &[&[("key", "value")]], 1)).await;
    assert_eq!(r, vec![limited(OK, 10, SECOND, 5, reset(SECOND, 1234))]);
    assert_eq!(count(&redis, "domain_key_value_1234"), Some(5));
    // :490-493
    assert_eq!(hits4(&metrics(&s).await, "domain.key_value"), (1, 0, 0, 1));

    // The next second's key, created by this call: its TTL is 1 s plus the jitter.
    s.advance(std::time::Duration::from_secs(1));
    s.call(request("domain", &[&[("key", "value")]], 1)).await;
    assert_eq!(count(&redis, "domain_key_value_1235"), Some(1));
    let pttl: i64 = redis
        .cli(&["PTTL", "domain_key_value_1235"])
        .parse()
        .unwrap();
    assert!(
        (1..=3600 * 1000).contains(&pttl),
        "PTTL {pttl} ms, expected 1 s + [0, 3600) s"
    );
}

/// `TestRedisWithJitter` (fixed_cache_impl_test.go:466) at its bound: the jitter is
/// `JitterRand.Int63n(EXPIRATION_JITTER_MAX_SECONDS)` (src/redis/fixed_cache_impl.go:170), in
/// [0, max). With a maximum of 1 the reference's jitter is always 0, so a one-second key
/// always gets `EXPIRE key 1`. Ten keys, each created by its call.
#[tokio::test]
async fn redis_with_jitter_below_max() {
    let redis = Redis::start();
    let env = ref_env(&redis, "", &[("EXPIRATION_JITTER_MAX_SECONDS", "1")]);
    let s = start_at_env(1234, REDIS_YAML, env).await;
    let mut pttls = Vec::new();
    for i in 0..10 {
        s.call(request("domain", &[&[("key", "value")]], 1)).await;
        let key = format!("domain_key_value_{}", 1234 + i);
        assert_eq!(count(&redis, &key), Some(1));
        pttls.push(redis.cli(&["PTTL", &key]).parse::<i64>().unwrap());
        s.advance(std::time::Duration::from_secs(1));
    }
    assert!(
        pttls.iter().all(|t| (1..=1000).contains(t)),
        "PTTLs {pttls:?} ms, expected 1 s each (1 + Int63n(1))"
    );
}

const STOP_YAML: &str = "domain: domain
descriptors:
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    value: value5
    rate_limit: {unit: hour, requests_per_unit: 14}
";

/// `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig` (fixed_cache_impl_test.go:639):
/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, a local cache, two descriptors with their own
/// hits_addend. The reference GETs both counts first (:657) and, when one would pass its
/// limit, increments only the keys that would (:734-737).
#[tokio::test]
async fn over_limit_with_stop_cache_key_increment_when_overlimit() {
    let redis = Redis::start();
    let env = ref_env(
        &redis,
        "",
        &[
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ],
    );
    let s = start_at_env(1_000_000, STOP_YAML, env).await;
    let (k4, k5) = ("domain_key4_value4_997200", "domain_key5_value5_997200");
    let (s4, s5) = ("domain.key4_value4", "domain.key5_value5");
    let both = |h: u64| {
        request_per_descriptor(
            "domain",
            &[&[("key4", "value4")], &[("key5", "value5")]],
            &[h, h],
        )
    };
    let st = |rpu, code, remaining| limited(code, rpu, HOUR, remaining, reset(HOUR, 1_000_000));

    // :657-664: GET answers 10 and 10, INCRBY 1 answers 11 and 11.
    seed(&redis, k4, 10, HOUR);
    seed(&redis, k5, 10, HOUR);
    let r = statuses(&s, both(1)).await;
    assert_eq!(r, vec![st(15, OK, 4), st(14, OK, 3)]);
    assert_eq!((count(&redis, k4), count(&redis, k5)), (Some(11), Some(11)));
    assert_unit_ttl(&redis, k4, HOUR);
    assert_unit_ttl(&redis, k5, HOUR);
    let m = metrics(&s).await;
    // :683-692
    assert_eq!(hits4(&m, s4), (1, 0, 0, 1));
    assert_eq!(hits4(&m, s5), (1, 0, 0, 1));
    assert_eq!(local_cache_total(&m), 0);

    // :698-703: GET answers 11 and 11 (what the first call left), INCRBY 2 answers 13 and 13.
    let r = statuses(&s, both(2)).await;
    assert_eq!(r, vec![st(15, OK, 2), st(14, OK, 1)]);
    assert_eq!((count(&redis, k4), count(&redis, k5)), (Some(13), Some(13)));
    let m = metrics(&s).await;
    // :717-726
    assert_eq!(hits4(&m, s4), (3, 0, 1, 3));
    assert_eq!(hits4(&m, s5), (3, 0, 2, 3));

    // :732-737: GET answers 13 and 13; key5 would pass its limit (15 > 14), so key4 is not
    // incremented (INCRBY 0, stays 13) and key5 is (INCRBY 2, 15).
    let r = statuses(&s, both(2)).await;
    assert_eq!(r, vec![st(15, OK, 2), st(14, OVER, 0)]);
    let m = metrics(&s).await;
    // :734 INCRBY key4 0, :737 INCRBY key5 2; stats :750-759; in one assertion so that a
    // difference shows all of itself: (counts in Redis, stats of key4, stats of key5).
    // Documented difference (docs/configuration.md, "Where turnstile differs, on purpose"): with `true` the
    // reference still adds the refused hits to the key that goes over (key5: 15); turnstile
    // keeps nothing of a refused request (key5 stays 13). Answers and stats are the same.
    assert_eq!(
        (
            (count(&redis, k4), count(&redis, k5)),
            hits4(&m, s4),
            hits4(&m, s5),
            local_cache_total(&m)
        ),
        ((Some(13), Some(13)), (5, 0, 2, 5), (5, 1, 3, 3), 0)
    );
}
