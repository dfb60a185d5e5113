//! The environment's grammar and each subsystem's variables, read as the binary reads them.

use std::time::Duration;

use super::*;
use crate::backend::redis::RedisType;
use crate::limiter::FailureMode;

fn resp_env(f: impl Fn(&str) -> Option<String>) -> Result<Option<RespSettings>, String> {
    Settings::from_env(f).map(|s| s.resp)
}

fn throttle_env(f: impl Fn(&str) -> Option<String>) -> Result<ThrottleLimits, String> {
    Settings::from_env(f).map(|s| s.throttle)
}

fn from(pairs: &[(&str, &str)]) -> Result<Option<RedisSettings>, String> {
    Settings::from_env(|k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .map(|s| s.redis)
}

#[test]
fn backend_choice_follows_envoyproxy_ratelimit_manifests() {
    assert!(from(&[]).unwrap().is_none(), "memory by default");
    assert!(from(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "r:6379")])
        .unwrap()
        .is_none());
    let istio = from(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")])
        .unwrap()
        .unwrap();
    assert_eq!(
        (istio.main.url.as_str(), &istio.main.kind),
        ("redis:6379", &RedisType::Single)
    );
    assert!(from(&[("BACKEND_TYPE", "redis")])
        .unwrap_err()
        .contains("REDIS_URL"));
    assert!(from(&[("BACKEND_TYPE", "memcache")])
        .unwrap_err()
        .contains("memcache"));
    assert!(from(&[("REDIS_URL", "x"), ("REDIS_TYPE", "ring")])
        .unwrap_err()
        .contains("REDIS_TYPE"));
    let s = from(&[
        ("REDIS_URL", "a:1"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", "b:2"),
        ("REDIS_PERSECOND_TYPE", "cluster"),
        ("CACHE_KEY_PREFIX", "p_"),
        ("TURNSTILE_REDIS_FAILURE_MODE", "fail_closed"),
    ])
    .unwrap()
    .unwrap();
    let ps = s.per_second.unwrap();
    assert_eq!((ps.url.as_str(), ps.kind), ("b:2", RedisType::Cluster));
    assert_eq!(
        (s.prefix.as_str(), s.policy.failure_mode),
        ("p_", FailureMode::FailClosed)
    );
}

#[test]
fn settings_from_env() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(resp_env(env(&[])), Ok(None));
    let on = resp_env(env(&[("TURNSTILE_RESP_ADDR", "true")]))
        .unwrap()
        .unwrap();
    assert_eq!(on, RespSettings::default());
    let s = resp_env(env(&[
        ("TURNSTILE_RESP_ADDR", "7000"),
        ("TURNSTILE_RESP_MAX_CONNECTIONS", "5"),
        ("TURNSTILE_RESP_IDLE_TIMEOUT_SECS", "9"),
        ("TURNSTILE_THROTTLE_MAX_BURST", "7"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(s.addr, "127.0.0.1:7000".parse().unwrap());
    assert_eq!(
        (s.max_connections, s.idle_timeout, s.limits.max_burst),
        (5, Duration::from_secs(9), 7)
    );
    let remote = resp_env(env(&[("TURNSTILE_RESP_ADDR", "0.0.0.0:6380")]));
    assert!(remote.unwrap_err().contains("TURNSTILE_RESP_ALLOW_REMOTE"));
    let allowed = resp_env(env(&[
        ("TURNSTILE_RESP_ADDR", "0.0.0.0:6380"),
        ("TURNSTILE_RESP_ALLOW_REMOTE", "true"),
    ]));
    assert!(allowed.unwrap().unwrap().allow_remote);
    assert!(resp_env(env(&[("TURNSTILE_RESP_ADDR", "[::1]:6380")])).is_ok());
    for bad in [
        &[("TURNSTILE_RESP_ADDR", "nonsense")][..],
        &[
            ("TURNSTILE_RESP_ADDR", "6380"),
            ("TURNSTILE_RESP_MAX_CONNECTIONS", "0"),
        ],
        &[
            ("TURNSTILE_RESP_ADDR", "6380"),
            ("TURNSTILE_THROTTLE_MAX_PERIOD_SECS", "x"),
        ],
    ] {
        assert!(resp_env(env(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn limits_from_env() {
    let l = throttle_env(|k| match k {
        "TURNSTILE_THROTTLE_MAX_BURST" => Some("5".into()),
        "TURNSTILE_THROTTLE_MAX_PERIOD_SECS" => Some("".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(l.max_burst, 5);
    assert_eq!(l.max_period_secs, 86_400);
    for bad in ["0", "-1", "x", "4294967296"] {
        let e = throttle_env(|k| (k == "TURNSTILE_THROTTLE_MAX_COUNT").then(|| bad.to_string()))
            .unwrap_err();
        assert!(e.contains("TURNSTILE_THROTTLE_MAX_COUNT"), "{e}");
    }
}
