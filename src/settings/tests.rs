//! The environment's grammar and each subsystem's variables, read as the binary reads them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::limiter::FailureMode;
use crate::store::redis::RedisType;

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
    .map(|s| s.storage.redis().cloned())
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
    // A URL where a host:port goes: said so, its password never printed.
    for url in ["redis://:s3cret@redis:6379/0", "r:1,rediss://r2:6379"] {
        let e = from(&[("REDIS_URL", url)]).unwrap_err();
        assert!(e.contains("a host:port is expected"), "{e}");
        assert!(e.contains("REDIS_AUTH") && !e.contains("s3cret"), "{e}");
    }
    let e = from(&[
        ("REDIS_URL", "a:1"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", "redis://b:2"),
    ])
    .unwrap_err();
    assert!(e.starts_with("REDIS_PERSECOND_URL=redis://…"), "{e}");
    assert!(e.contains("REDIS_PERSECOND_AUTH"), "{e}");
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

fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_env(|k| map.get(k).cloned())
}

fn ok_settings(vars: &[(&str, &str)]) -> Settings {
    settings(vars).unwrap_or_else(|e| panic!("{vars:?}: {e}"))
}

#[test]
fn settings_defaults() {
    let s = ok_settings(&[]);
    assert_eq!(
        s.config_path,
        PathBuf::from("/srv/runtime_data/current/config")
    );
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(s.response_headers, None);
    assert!(!s.global_shadow_mode);
    assert!(!s.load.merge_domains);
    assert!((s.near_limit_ratio - 0.8).abs() < 1e-9);
    assert!(s.workers >= 1 && s.shards >= 1);
    // Empty variables count as unset.
    let s = ok_settings(&[("PORT", ""), ("RUNTIME_ROOT", ""), ("SHADOW_MODE", "")]);
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(
        s.config_path,
        PathBuf::from("/srv/runtime_data/current/config")
    );
}

#[test]
fn settings_runtime_path_composition() {
    let s = ok_settings(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "limits"),
    ]);
    assert_eq!(s.config_path, PathBuf::from("/data/ratelimit/limits"));
    let s = ok_settings(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ]);
    assert_eq!(s.config_path, PathBuf::from("/data/ratelimit/config"));
    let s = ok_settings(&[("RUNTIME_ROOT", "/data")]);
    assert_eq!(s.config_path, PathBuf::from("/data/config"));
    let s = ok_settings(&[("RUNTIME_SUBDIRECTORY", "rl")]);
    assert_eq!(
        s.config_path,
        PathBuf::from("/srv/runtime_data/current/rl/config")
    );
}

#[test]
fn settings_hosts_and_ports() {
    let s = ok_settings(&[
        ("HOST", "127.0.0.1"),
        ("PORT", "9000"),
        ("GRPC_HOST", "::"),
        ("GRPC_PORT", "9001"),
    ]);
    assert_eq!(s.http_addr, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(s.grpc_addr, "[::]:9001".parse().unwrap());
    let s = ok_settings(&[
        ("HOST", "::"),
        ("PORT", "0"),
        ("GRPC_HOST", "[::1]"),
        ("GRPC_PORT", "0"),
    ]);
    assert_eq!(s.http_addr, "[::]:0".parse().unwrap());
    assert_eq!(s.grpc_addr, "[::1]:0".parse().unwrap());
    // Only the port given: host keeps its default.
    let s = ok_settings(&[("GRPC_PORT", "5000")]);
    assert_eq!(s.grpc_addr, "0.0.0.0:5000".parse().unwrap());
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
}

#[test]
fn settings_response_headers() {
    let s = ok_settings(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]);
    assert_eq!(
        s.response_headers,
        Some(HeaderNames {
            ietf: false,
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        })
    );
    let s = ok_settings(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "X-RL-Limit"),
        ("LIMIT_REMAINING_HEADER", "X-RL-Remaining"),
        ("LIMIT_RESET_HEADER", "X-RL-Reset"),
    ]);
    assert_eq!(
        s.response_headers,
        Some(HeaderNames {
            ietf: false,
            limit: "X-RL-Limit".into(),
            remaining: "X-RL-Remaining".into(),
            reset: "X-RL-Reset".into(),
        })
    );
    // Names alone do not switch the headers on.
    let s = ok_settings(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "false"),
        ("LIMIT_LIMIT_HEADER", "X-RL-Limit"),
    ]);
    assert_eq!(s.response_headers, None);
}

#[test]
fn settings_boolean_flags() {
    let s = ok_settings(&[
        ("SHADOW_MODE", "true"),
        ("MERGE_DOMAIN_CONFIG", "true"),
        ("RUNTIME_IGNOREDOTFILES", "false"),
    ]);
    assert!(s.global_shadow_mode);
    assert!(s.load.merge_domains);
    assert!(s.load.include_dotfiles);
    let s = ok_settings(&[
        ("SHADOW_MODE", "false"),
        ("MERGE_DOMAIN_CONFIG", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
    ]);
    assert!(!s.global_shadow_mode);
    assert!(!s.load.merge_domains);
    assert!(!s.load.include_dotfiles);
    // Go's strconv.ParseBool spellings.
    for t in ["1", "t", "T", "TRUE", "True"] {
        assert!(ok_settings(&[("SHADOW_MODE", t)]).global_shadow_mode, "{t}");
    }
    for f in ["0", "f", "F", "FALSE", "False"] {
        assert!(
            !ok_settings(&[("SHADOW_MODE", f)]).global_shadow_mode,
            "{f}"
        );
    }
}

#[test]
fn settings_near_limit_ratio() {
    let s = ok_settings(&[("NEAR_LIMIT_RATIO", "0.5")]);
    assert!((s.near_limit_ratio - 0.5).abs() < 1e-9);
}

fn settings_err(vars: &[(&str, &str)]) -> String {
    match settings(vars) {
        Ok(s) => panic!("{vars:?} should be refused, got {s:?}"),
        Err(e) => e,
    }
}

#[test]
fn settings_bad_values_name_the_variable() {
    let e = settings_err(&[("PORT", "abc")]);
    assert!(e.contains("PORT=abc"), "{e}");
    let e = settings_err(&[("GRPC_PORT", "x1")]);
    assert!(e.contains("GRPC_PORT=x1"), "{e}");
    let e = settings_err(&[("PORT", "70000")]);
    assert!(e.contains("PORT") && e.contains("70000"), "{e}");
    let e = settings_err(&[("NEAR_LIMIT_RATIO", "2")]);
    assert!(e.contains("NEAR_LIMIT_RATIO"), "{e}");
    let e = settings_err(&[("NEAR_LIMIT_RATIO", "much")]);
    assert!(e.contains("NEAR_LIMIT_RATIO"), "{e}");
    let e = settings_err(&[("SHADOW_MODE", "maybe")]);
    assert!(e.contains("SHADOW_MODE"), "{e}");
    let e = settings_err(&[("MERGE_DOMAIN_CONFIG", "sometimes")]);
    assert!(e.contains("MERGE_DOMAIN_CONFIG"), "{e}");
    let e = settings_err(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "yep")]);
    assert!(e.contains("LIMIT_RESPONSE_HEADERS_ENABLED"), "{e}");
    let e = settings_err(&[("RUNTIME_IGNOREDOTFILES", "nah")]);
    assert!(e.contains("RUNTIME_IGNOREDOTFILES"), "{e}");
}

#[test]
fn goccs_settings_fill_the_rate_defaults() {
    // kivra/GoCC pkg/config/config.go:26-31: names and defaults.
    let d = ok_settings(&[]);
    assert_eq!(d.gocc, crate::service::gocc::GoccDefaults::default());
    assert!(d.config_optional && d.gocc_file.is_none());
    let s = ok_settings(&[
        ("MAX_REQUESTS", "7"),
        ("MAX_REQUESTS_IN_QUEUE", "0"),
        ("WINDOW_MILLIS", "250"),
        ("REQUESTS_CAN_SET_RATE", "f"),
        ("REQUESTS_CAN_MOD_QUEUE", "0"),
        ("CONFIG_FILE", "/etc/gocc/keys.json"),
        ("RUNTIME_ROOT", "/srv"),
    ]);
    assert_eq!(
        (s.gocc.limits.max_requests, s.gocc.limits.max_in_queue),
        (7, 0)
    );
    assert_eq!(s.gocc.limits.window, Duration::from_millis(250));
    assert!(!s.gocc.can_set_rate && !s.gocc.can_mod_queue);
    assert_eq!(
        s.gocc_file.as_deref(),
        Some(Path::new("/etc/gocc/keys.json"))
    );
    assert!(!s.config_optional, "RUNTIME_ROOT names the location");
    let e = settings_err(&[("CONFIG_FILE", "k.json"), ("CONFIG_TYPE", "GRPC_XDS_SOTW")]);
    assert!(e.contains("CONFIG_FILE"), "{e}");
}

#[test]
fn goccs_settings_without_effect_are_named() {
    let s = ok_settings(&[("INSTANCE_URLS", "http://a,http://b"), ("LOG_2XX", "true")]);
    assert!(
        s.ignored
            .iter()
            .any(|w| w.starts_with("INSTANCE_URLS is ignored") && w.contains("Redis")),
        "{:?}",
        s.ignored
    );
    assert!(s.ignored.iter().any(|w| w.starts_with("LOG_2XX")));
}

/// A token file in the temp dir, named after the test so parallel tests do not share it.
fn token_file(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "turnstile-settings-{}-{name}.token",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn the_admin_listener_is_off_loopback_only_or_needs_a_token() {
    assert_eq!(ok_settings(&[]).admin, None);
    let on = ok_settings(&[("TURNSTILE_ADMIN_ADDR", "true")])
        .admin
        .unwrap();
    assert_eq!(on.addr.to_string(), "127.0.0.1:6071");
    assert_eq!(on.token, None);
    let e = settings_err(&[("TURNSTILE_ADMIN_ADDR", "0.0.0.0:6071")]);
    assert!(
        e.contains("TURNSTILE_ADMIN_ADDR=0.0.0.0:6071 is not a loopback address")
            && e.contains("TURNSTILE_ADMIN_TOKEN_FILE"),
        "{e}"
    );
    let secret = "s3cret-token-0123456789";
    let file = token_file("good", &format!("{secret}\n"));
    let s = ok_settings(&[
        ("TURNSTILE_ADMIN_ADDR", "0.0.0.0:6071"),
        ("TURNSTILE_ADMIN_TOKEN_FILE", &file),
    ]);
    assert!(s.admin.as_ref().unwrap().token.is_some());
    // The token never shows in the settings' debug form (logged at start on errors).
    assert!(!format!("{s:?}").contains(secret));
    let e = settings_err(&[("TURNSTILE_ADMIN_TOKEN_FILE", &file)]);
    assert!(e.contains("TURNSTILE_ADMIN_ADDR is not"), "{e}");
    let short = token_file("short", "abc");
    let e = settings_err(&[
        ("TURNSTILE_ADMIN_ADDR", "true"),
        ("TURNSTILE_ADMIN_TOKEN_FILE", &short),
    ]);
    assert!(
        e.contains(&format!("TURNSTILE_ADMIN_TOKEN_FILE={short}")) && e.contains("16"),
        "{e}"
    );
    let e = settings_err(&[
        ("TURNSTILE_ADMIN_ADDR", "true"),
        ("TURNSTILE_ADMIN_TOKEN_FILE", "/nonexistent/admin.token"),
    ]);
    assert!(
        e.contains("TURNSTILE_ADMIN_TOKEN_FILE=/nonexistent/admin.token"),
        "{e}"
    );
}
