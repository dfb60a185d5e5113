//! envoyproxy/ratelimit's test/integration/integration_test.go (commit f2fb157), against
//! turnstile on a real Redis: the same runtime directory (tests/it/reference/data/integration, its
//! `runtime/current/ratelimit/config` files), the same requests, the same answers and stats.
//! The reference sleeps and waits for its watcher; here time is the manual clock and reloads
//! are polled with a deadline.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

use super::support::*;
use crate::common::redis::{self, Redis};
use crate::common::tempdir::TempDir;
use crate::common::{OK, OVER, T0};

const BASIC: &str = include_str!("data/integration/basic.yaml");
const ANOTHER: &str = include_str!("data/integration/another.yaml");
const SHARE: &str = include_str!("data/integration/share_threshold.yaml");
const RELOAD: &str = include_str!("data/integration/reload.yaml");

const NOW: u64 = T0 / 1_000_000_000;

/// The runtime directory of the integration tests: `config/{basic,another,share_threshold}.yaml`.
fn runtime_dir() -> TempDir {
    let t = TempDir::new("reference-runtime");
    t.write("config/basic.yaml", BASIC);
    t.write("config/another.yaml", ANOTHER);
    t.write("config/share_threshold.yaml", SHARE);
    t
}

/// One of `TestBasicConfig`'s settings (integration_test.go:92-108): `makeSimpleRedisSettings`
/// and its variants.
#[derive(Clone, Copy)]
struct Variant {
    per_second: bool,
    local_cache: bool,
    prefix: &'static str,
    /// `Some(b)`: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=b; `None`: unset (turnstile's default).
    stop: Option<bool>,
    auth: bool,
    watch_root: bool,
}

/// The reference's default settings: every refused hit kept (STOP_..=false, the drop-in value).
const DEFAULT: Variant = Variant {
    per_second: false,
    local_cache: false,
    prefix: "",
    stop: Some(false),
    auth: false,
    watch_root: true,
};

/// `getCacheKey` (integration_test.go:541).
fn key(k: &str, local: bool) -> String {
    if local {
        format!("{k}_local")
    } else {
        k.to_owned()
    }
}

fn start_redis(v: Variant) -> Redis {
    if v.auth {
        Redis::start_with(&["--requirepass", "password123"])
    } else {
        Redis::start()
    }
}

/// `testBasicBaseConfig` (integration_test.go:549).
async fn basic_base_config(v: Variant) {
    let main = start_redis(v);
    let per_second = start_redis(v);
    let runtime = runtime_dir();
    let mut env: Vec<(String, String)> = redis::env(&main, v.prefix);
    env.retain(|(k, _)| k != "EXPIRATION_JITTER_MAX_SECONDS");
    let mut add = |k: &str, val: &str| env.push((k.into(), val.into()));
    add(
        "REDIS_PERSECOND",
        if v.per_second { "true" } else { "false" },
    );
    add("REDIS_PERSECOND_URL", &per_second.url());
    // LocalCacheSizeInBytes: 0 is the reference's "off"; turnstile's default is 1 MiB.
    add(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        if v.local_cache { "1000" } else { "0" },
    );
    if let Some(stop) = v.stop {
        add(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
            if stop { "true" } else { "false" },
        );
    }
    if v.auth {
        add("REDIS_AUTH", "password123");
        add("REDIS_PERSECOND_AUTH", "password123");
    }
    if !v.watch_root {
        add("RUNTIME_WATCH_ROOT", "false");
    }
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = start_dir(NOW, &runtime.path().join("config"), &env_ref).await;
    let local = v.local_cache;
    let local_over = |m: &str| {
        shard_sum(
            m,
            "ratelimit_service_rate_limit_over_limit_with_local_cache_total",
        )
    };

    // integration_test.go:561: a domain without config answers OK without a limit.
    let r = s
        .call(request("foo", &[&[(&key("hello", local), "world")]], 1))
        .await;
    assert_eq!(
        r,
        RateLimitResponse {
            overall_code: OK,
            statuses: vec![no_limit()],
            ..Default::default()
        }
    );

    // integration_test.go:581
    let r = s
        .call(request("basic", &[&[(&key("key1", local), "foo")]], 1))
        .await;
    assert_eq!(
        r,
        RateLimitResponse {
            overall_code: OK,
            statuses: vec![limited(OK, 50, SECOND, 49, reset(SECOND, NOW))],
            ..Default::default()
        }
    );
    let m = metrics(&s).await;
    // integration_test.go:598
    assert_eq!(
        must(&m, &format!("basic.{}", key("key1", local)), "total_hits"),
        1
    );

    // integration_test.go:613: over a minute limit with a fresh value.
    let key2 = key("key2", local);
    let key3 = key("key3", local);
    for i in 0..25u32 {
        let r = s
            .call(request("another", &[&[(&key2, "6121297811")]], 1))
            .await;
        let (code, remaining) = if i >= 20 {
            (OVER, 0)
        } else {
            (OK, 20 - (i + 1))
        };
        assert_eq!(
            r,
            RateLimitResponse {
                overall_code: code,
                statuses: vec![limited(code, 20, MINUTE, remaining, reset(MINUTE, NOW))],
                ..Default::default()
            },
            "request {i}"
        );
        let m = metrics(&s).await;
        let sk = format!("another.{key2}");
        // integration_test.go:640-653
        assert_eq!(must(&m, &sk, "total_hits"), u64::from(i + 1), "request {i}");
        let over = if i >= 20 { i - 19 } else { 0 };
        assert_eq!(must(&m, &sk, "over_limit"), u64::from(over), "request {i}");
        // over_limit_with_local_cache: the reference has it per limit
        // (`another.key2_local.over_limit_with_local_cache`); turnstile counts it per shard
        // only (docs/settings.md: native Prometheus series, not statsd names). One limit is
        // over here, so the sum is that limit's count. The freecache gauges
        // (`localcache.hitCount`, `missCount`) are the Go cache's internals: not ported.
        let with_cache = if local && i >= 20 { i - 20 } else { 0 };
        assert_eq!(local_over(&m), u64::from(with_cache), "request {i}");
    }

    // integration_test.go:676: two keys in one domain.
    for i in 0..15u32 {
        let r = s
            .call(request(
                "another",
                &[&[(&key2, "2875904317")], &[(&key3, "2875904317")]],
                1,
            ))
            .await;
        let mut code = OK;
        let mut remaining1 = 20 - (i + 1);
        let mut remaining2 = 10u32.saturating_sub(i + 1);
        if i >= 10 {
            code = OVER;
            remaining2 = 0;
            // integration_test.go:694: with STOP_..=true the refused request incremented
            // nothing. Unset, turnstile keeps nothing of a refused request either (docs/configuration.md,
            // "Where turnstile differs, on purpose": a refused request consumes nothing).
            if v.stop != Some(false) {
                remaining1 = 10;
            }
        }
        assert_eq!(
            r,
            RateLimitResponse {
                overall_code: code,
                statuses: vec![
                    limited(OK, 20, MINUTE, remaining1, reset(MINUTE, NOW)),
                    limited(code, 10, HOUR, remaining2, reset(HOUR, NOW)),
                ],
                ..Default::default()
            },
            "request {i}"
        );
        let m = metrics(&s).await;
        // integration_test.go:714-738
        let sk2 = format!("another.{key2}");
        let sk3 = format!("another.{key3}");
        assert_eq!(
            must(&m, &sk2, "total_hits"),
            u64::from(i + 26),
            "request {i}"
        );
        assert_eq!(must(&m, &sk2, "over_limit"), 5, "request {i}");
        assert_eq!(
            must(&m, &sk3, "total_hits"),
            u64::from(i + 1),
            "request {i}"
        );
        let over3 = if i >= 10 { i - 9 } else { 0 };
        assert_eq!(
            must(&m, &sk3, "over_limit"),
            u64::from(over3),
            "request {i}"
        );
        // key2's 4 from the first loop plus key3's (see above).
        let with_cache = if local { 4 + i.saturating_sub(10) } else { 0 };
        assert_eq!(local_over(&m), u64::from(with_cache), "request {i}");
    }

    // integration_test.go:768: DurationUntilReset ticks down (the reference sleeps 2 s).
    let key4 = key("key4", local);
    let r1 = s
        .call(request("another", &[&[(&key4, "durTest")]], 1))
        .await;
    s.advance(std::time::Duration::from_secs(2));
    let r2 = s
        .call(request("another", &[&[(&key4, "durTest")]], 1))
        .await;
    let d = |r: &RateLimitResponse| r.statuses[0].duration_until_reset.as_ref().unwrap().seconds;
    assert!(d(&r2) < d(&r1));
    assert_eq!((d(&r1), d(&r2)), (reset(DAY, NOW), reset(DAY, NOW + 2)));

    // CacheKeyPrefix (integration_test.go:101): the reference's key layout under the prefix,
    // prefix + domain_key_value_windowstart (limiter/base_limiter.go).
    if !v.prefix.is_empty() {
        let window = NOW - NOW % 86_400;
        let k = format!("{}another_{key4}_durTest_{window}", v.prefix);
        assert_eq!(main.cli(&["GET", &k]), "2", "{k}");
    }
}

macro_rules! variants {
    ($($name:ident => $v:expr, $line:literal;)+) => {$(
        #[doc = concat!("integration_test.go:", $line)]
        #[tokio::test]
        async fn $name() {
            basic_base_config($v).await;
        }
    )+};
}

variants! {
    basic_without_per_second_redis => DEFAULT, "97";
    basic_with_per_second_redis => Variant { per_second: true, ..DEFAULT }, "98";
    basic_without_per_second_redis_with_local_cache => Variant { local_cache: true, ..DEFAULT }, "99";
    basic_with_per_second_redis_with_local_cache =>
        Variant { per_second: true, local_cache: true, ..DEFAULT }, "100";
    basic_with_cache_prefix => Variant { prefix: "prefix:", ..DEFAULT }, "103";
    basic_stop_increment => Variant { stop: Some(true), ..DEFAULT }, "104";
    basic_per_second_stop_increment =>
        Variant { per_second: true, stop: Some(true), ..DEFAULT }, "105";
    basic_local_cache_stop_increment =>
        Variant { local_cache: true, stop: Some(true), ..DEFAULT }, "106";
    basic_per_second_local_cache_stop_increment =>
        Variant { per_second: true, local_cache: true, stop: Some(true), ..DEFAULT }, "107";
    basic_auth_without_per_second => Variant { auth: true, ..DEFAULT }, "181";
    basic_auth_with_per_second => Variant { auth: true, per_second: true, ..DEFAULT }, "182";
    basic_auth_with_local_cache => Variant { auth: true, local_cache: true, ..DEFAULT }, "183";
    basic_auth_with_per_second_and_local_cache =>
        Variant { auth: true, per_second: true, local_cache: true, ..DEFAULT }, "184";
    basic_without_watch_root => Variant { watch_root: false, ..DEFAULT }, "206";
    // Not in the reference: the same run with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset,
    // turnstile's documented answer (docs/configuration.md, "Where turnstile differs, on purpose").
    basic_turnstile_default_counting => Variant { stop: None, ..DEFAULT }, "694";
}

/// `TestBasicConfig_ExtraTags` (integration_test.go:125). EXTRA_TAGS tags statsd series (the
/// statsd push, off here, is tested in tests/it/telemetry/statsd.rs); the Prometheus series carry no
/// tags, and the counters the test reads are there.
#[tokio::test]
async fn basic_config_extra_tags() {
    let main = Redis::start();
    let runtime = runtime_dir();
    let mut env = redis::env(&main, "");
    env.push(("EXTRA_TAGS".into(), "foo:bar,a:b".into()));
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = start_dir(NOW, &runtime.path().join("config"), &env_ref).await;
    s.call(request("basic", &[&[("key1", "foo")]], 1)).await;
    let m = metrics(&s).await;
    assert_eq!(must(&m, "basic.key1", "total_hits"), 1);
    assert_eq!(
        series(&m, "ratelimit_service_config_load_success_total"),
        Some(1.0)
    );
}

/// `testConfigReload` (integration_test.go:806) as `TestBasicReloadConfig/ReloadWithoutWatchRoot`
/// (integration_test.go:207) runs it: a file added to the watched directory goes live, its
/// removal is a reload too.
#[tokio::test]
async fn reload_without_watch_root() {
    let main = Redis::start();
    let runtime = runtime_dir();
    let mut env = redis::env(&main, "");
    env.push(("RUNTIME_WATCH_ROOT".into(), "false".into()));
    env.push(("TURNSTILE_RELOAD_INTERVAL_MS".into(), "50".into()));
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = start_dir(NOW, &runtime.path().join("config"), &env_ref).await;
    const LOADS: &str = "ratelimit_service_config_load_success_total";

    // integration_test.go:818: domain "reload" is not loaded yet.
    let r = s.call(request("reload", &[&[("block", "foo")]], 1)).await;
    assert_eq!(
        r,
        RateLimitResponse {
            overall_code: OK,
            statuses: vec![no_limit()],
            ..Default::default()
        }
    );
    let before = series(&metrics(&s).await, LOADS).expect("load counter");

    // integration_test.go:833: reloadNewConfigFile.
    runtime.write("config/reload.yaml", RELOAD);
    let after = series(&wait_series(&s, LOADS, before + 1.0).await, LOADS).unwrap();
    assert!(after > before);

    // integration_test.go:839
    let r = s.call(request("reload", &[&[("key1", "foo")]], 1)).await;
    assert_eq!(
        r,
        RateLimitResponse {
            overall_code: OK,
            statuses: vec![limited(OK, 50, SECOND, 49, reset(SECOND, NOW))],
            ..Default::default()
        }
    );

    // integration_test.go:855: removing the file must trigger a reload.
    std::fs::remove_file(runtime.path().join("config/reload.yaml")).unwrap();
    let again = series(&wait_series(&s, LOADS, after + 1.0).await, LOADS).unwrap();
    assert!(again > after);
}

/// `testShareThreshold` (integration_test.go:923), `TestShareThreshold/WithoutPerSecondRedis`.
#[tokio::test]
async fn share_threshold() {
    let main = Redis::start();
    let runtime = runtime_dir();
    let mut env = redis::env(&main, "");
    // The reference's default counting: every hit incremented.
    env.push((
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT".into(),
        "false".into(),
    ));
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = start_dir(NOW, &runtime.path().join("config"), &env_ref).await;
    let domain = "share-threshold-test";

    // integration_test.go:939: files/a.pdf ten times, OK or OVER_LIMIT.
    for i in 0..10 {
        let r = s
            .call(request(domain, &[&[("files", "files/a.pdf")]], 1))
            .await;
        assert!(
            r.overall_code == OK || r.overall_code == OVER,
            "request {i}"
        );
    }
    // integration_test.go:950: files/b.csv shares the threshold: over.
    let r = s
        .call(request(domain, &[&[("files", "files/b.csv")]], 1))
        .await;
    assert_eq!(
        r,
        RateLimitResponse {
            overall_code: OVER,
            statuses: vec![limited(OVER, 10, HOUR, 0, reset(HOUR, NOW))],
            ..Default::default()
        }
    );
    // One counter for every value: the pattern in the key (base_limiter_test.go:59 names it).
    let window = NOW - NOW % 3600;
    assert_eq!(
        main.cli(&["GET", &format!("{domain}_files_files/*_{window}")]),
        "11"
    );

    // integration_test.go:970: without share_threshold each value counts alone.
    for i in 0..10 {
        let value = format!("files_no_share/1700000000-{i}");
        let r = s
            .call(request(domain, &[&[("files_no_share", &value)]], 1))
            .await;
        assert_eq!(
            r,
            RateLimitResponse {
                overall_code: OK,
                statuses: vec![limited(OK, 10, HOUR, 9, reset(HOUR, NOW))],
                ..Default::default()
            },
            "value {value}"
        );
    }
}
