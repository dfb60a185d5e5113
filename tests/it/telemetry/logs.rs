//! `LOG_LEVEL` as docs/settings.md says: every spelling envoyproxy/ratelimit's logrus accepts
//! (`logrus.ParseLevel`: panic, fatal, error, warn, warning, info, debug, trace, any case), any
//! other value refused with an error on stderr, and errors shown at every level.

use crate::common::run::*;
use crate::common::tempdir::TempDir;

const BAD_UNIT: &str = "domain: d
descriptors:
  - key: k
    rate_limit:
      unit: fortnight
      requests_per_unit: 1
";

#[test]
fn every_logrus_spelling_is_a_level() {
    let dir = TempDir::new("loglevels");
    let config = config_dir(dir.path(), SIMPLE);
    let config = config.to_str().unwrap();
    for level in [
        "panic", "fatal", "error", "warn", "warning", "info", "debug", "trace", "WARNING", "Warn",
        "INFO", "Fatal",
    ] {
        let out = run(&["check", "--config", config], &[("LOG_LEVEL", level)]);
        assert_eq!(out.code, Some(0), "LOG_LEVEL={level}: {}", out.stderr);
    }
}

#[test]
fn an_unknown_level_is_refused_on_stderr() {
    for level in ["bogus", "warnings", "info,bogus"] {
        let out = run(&["serve"], &[("LOG_LEVEL", level)]);
        assert_eq!(
            out.code,
            Some(1),
            "LOG_LEVEL={level} started: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(&format!("LOG_LEVEL={level}")),
            "LOG_LEVEL={level}: the error does not name it: {:?}",
            out.stderr
        );
    }
}

/// A bad config stops the start with exit 2 and its error on stderr, whatever the level: the
/// most quiet level there is still shows errors.
#[test]
fn a_bad_config_is_reported_at_every_level() {
    let dir = TempDir::new("logbadconfig");
    let config = config_dir(dir.path(), BAD_UNIT);
    let config = config.to_str().unwrap();
    for level in ["warning", "WARNING", "fatal", "panic", "error"] {
        let out = run(&["serve", "--config", config], &[("LOG_LEVEL", level)]);
        assert_eq!(out.code, Some(2), "LOG_LEVEL={level}: {}", out.stderr);
        assert!(
            out.stderr.contains("fortnight"),
            "LOG_LEVEL={level}: nothing on stderr names the bad unit: {:?}",
            out.stderr
        );
    }
}

/// A reload that fails keeps the old config and says why, at `LOG_LEVEL=warning` too.
#[test]
fn a_failed_reload_is_logged_at_warning() {
    let dir = TempDir::new("logreload");
    let config = config_dir(dir.path(), SIMPLE);
    let s = serve(
        &["serve", "--config", config.to_str().unwrap()],
        &[("LOG_LEVEL", "warning")],
    );
    std::fs::write(config.join("config.yaml"), BAD_UNIT).unwrap();
    wait_for("the failed reload logged", || {
        let e = s.stderr();
        (!e.contains("fortnight")).then_some(e)
    });
}

/// Redis down at the start: each retry is a warning, and at the elapsed limit the process exits
/// 1 saying why, at `LOG_LEVEL=warning` too.
#[test]
fn redis_down_at_the_start_is_reported_at_warning() {
    let dir = TempDir::new("logredis");
    let config = config_dir(dir.path(), SIMPLE);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("127.0.0.1:{port}");
    let out = run(
        &["serve", "--config", config.to_str().unwrap()],
        &[
            ("LOG_LEVEL", "warning"),
            ("REDIS_URL", &url),
            ("REDIS_STARTUP_INITIAL_INTERVAL", "50ms"),
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "300ms"),
        ],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("Redis not reachable at start; retrying"),
        "the retries are not logged: {:?}",
        out.stderr
    );
    assert!(
        out.stderr.contains("cannot start"),
        "nothing on stderr says why: {:?}",
        out.stderr
    );
}
