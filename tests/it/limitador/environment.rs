//! Limitador's environment variables, taking the values Limitador takes and read as it reads
//! them (limitador-server/src/config.rs, its `env` module): a switch is on when it is exactly `1`
//! and off for anything else, never a refused start.

use super::*;
use crate::common::binary::{block_on, http_get, wait_for};

/// `limited_calls` of the `zero` limit (which refuses every call) after one call.
fn limited_zero(l: &Limitador) -> String {
    let zero = request("zero", &[&[("x", "y")]], 0);
    let r = block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, zero)).unwrap();
    assert_eq!(code(&r), "OVER_LIMIT");
    let metrics = http_get(l.server.ports.http, "/metrics");
    (metrics.lines())
        .find(|line| line.starts_with("limited_calls{"))
        .unwrap_or_else(|| panic!("no limited_calls: {metrics}"))
        .to_owned()
}

#[test]
fn limit_name_in_prometheus_labels_is_on_at_1_as_limitador_reads_it() {
    let named = r#"limited_calls{limit_name="zero",limitador_namespace="zero"} 1"#;
    let unnamed = r#"limited_calls{limitador_namespace="zero"} 1"#;
    // Limitador's docs: "set to "1" to enable"; its code: `value == "1"`.
    for (value, want) in [
        ("1", named),
        ("0", unnamed),
        ("true", unnamed),
        ("yes", unnamed),
    ] {
        let env = [("LIMIT_NAME_IN_PROMETHEUS_LABELS", value)];
        let l = Limitador::start_with(&[], LIMITS, &env);
        assert_eq!(
            limited_zero(&l),
            want,
            "LIMIT_NAME_IN_PROMETHEUS_LABELS={value}"
        );
        // A value that reads as off but may have been meant as on is said at start.
        let warned = "LIMIT_NAME_IN_PROMETHEUS_LABELS=true reads as off";
        if value == "true" {
            let stderr = || l.server.stderr();
            wait_for("the warning", || (!stderr().contains(warned)).then(stderr));
        }
    }
}

/// `REDIS_LOCAL_CACHE_ENABLED=true` is off in Limitador (`== "1"`): the same here, said at start.
#[test]
fn redis_local_cache_enabled_true_reads_as_off_and_says_so() {
    let env = [("REDIS_LOCAL_CACHE_ENABLED", "true")];
    let l = Limitador::start_on(&[], LIMITS, &[], &env);
    let warned = "REDIS_LOCAL_CACHE_ENABLED=true reads as off, as Limitador reads it";
    let stderr = || l.server.stderr();
    wait_for("the warning", || (!stderr().contains(warned)).then(stderr));
}

/// `DISK_PATH` and `DISK_OPTIMIZE` stand for `disk`'s PATH and `--optimize`, as in Limitador;
/// `--optimize disk` starts with a word on what it changes (nothing).
#[test]
fn disk_path_and_disk_optimize_are_read() {
    let state = TempDir::new("limitador-disk-env");
    let path = state.path().to_str().unwrap().to_owned();
    let env = [("DISK_PATH", path.as_str()), ("DISK_OPTIMIZE", "disk")];
    let l = Limitador::start_on(&[], LIMITS, &["disk"], &env);
    assert!(
        state.path().join("lock").exists(),
        "the counters' dir is DISK_PATH"
    );
    let warned = "--optimize disk (DISK_OPTIMIZE) changes nothing";
    let stderr = || l.server.stderr();
    wait_for("the warning", || (!stderr().contains(warned)).then(stderr));
    // A value Limitador refuses is refused.
    let bad = [("DISK_PATH", path.as_str()), ("DISK_OPTIMIZE", "space")];
    let stderr = super::redis::refused(&["disk"], &bad);
    assert!(stderr.contains("space"), "{stderr}");
}

/// With the cache on, REDIS_LOCAL_CACHE_BATCH_SIZE and a flush period Limitador takes start here
/// too (they stopped the start): each is said in a warning, the nearest period turnstile syncs
/// at is used.
#[test]
fn limitadors_cache_variables_start_with_a_warning() {
    let r = crate::common::redis::Redis::start();
    let url = format!("redis://127.0.0.1:{}", r.port);
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_LOCAL_CACHE_ENABLED", "1"),
        ("REDIS_LOCAL_CACHE_BATCH_SIZE", "100"),
        ("REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS", "0"),
    ];
    let l = Limitador::start_on(&[], LIMITS, &[], &env);
    let r = block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))).unwrap();
    assert_eq!(code(&r), "OK");
    let stderr = || l.server.stderr();
    for said in [
        "--batch-size 100 (REDIS_LOCAL_CACHE_BATCH_SIZE) changes nothing",
        "--flush-period 0 (REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS) is outside",
    ] {
        wait_for(said, || (!stderr().contains(said)).then(stderr));
    }
}

/// Flags, environment, and whether info lines are logged.
type Verbosity = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    bool,
);

/// Limitador's verbosity: `-v` is warn, `-vv` info (turnstile's own default); without `-v`,
/// `RUST_LOG`'s level, as Limitador reads it.
#[test]
fn verbosity_and_rust_log_set_the_level_as_limitador_sets_them() {
    // The start logs at info (what it serves), never at warn with these settings.
    let info = " INFO ";
    let cases: [Verbosity; 5] = [
        (&[], &[], true),
        (&["-v"], &[], false),
        (&["-vv"], &[], true),
        (&[], &[("RUST_LOG", "warn")], false),
        (&[], &[("RUST_LOG", "nonsense=,limitador=info")], true),
    ];
    for (flags, env, shown) in cases {
        let l = Limitador::start_with(flags, LIMITS, env);
        let stderr = l.server.stop();
        assert_eq!(stderr.contains(info), shown, "{flags:?} {env:?}: {stderr}");
    }
}
