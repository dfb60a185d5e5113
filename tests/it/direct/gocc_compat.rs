//! A GoCC deployment moved over unchanged: GoCC's variables and its JSON key file, no YAML, no
//! turnstile setting, driven as kivra/GoCC's README shows (`curl /rate/x`, the `canWait` /
//! `maxRequests` / `maxRequestsInQueue` example, `DELETE /rate/:key/:requestId`, `/debug`).
//! References are to kivra/GoCC at 0dbe72a.

use std::time::{Duration, Instant};

use crate::common::tempdir::TempDir;
use crate::common::*;
use serde_json::Value;

/// GoCC README's "Configuration file" example, less the admin entry, plus one for the reload.
const KEYS: &str = r#"{
  "keys": [
    {"key_pattern": "^user-.*", "key_pattern_is_regex": true,
     "max_requests_per_window": 100, "max_requests_in_queue": 50, "window_millis": 60000},
    {"key_pattern": "guest", "key_pattern_is_regex": false,
     "max_requests_per_window": 10, "max_requests_in_queue": 5, "window_millis": 120000},
    {"key_pattern": "user-cjk", "key_pattern_is_regex": false, "max_requests_per_window": 1},
    {"key_pattern": "later", "key_pattern_is_regex": true, "max_requests_per_window": 5}
  ]
}"#;

async fn call(s: &TestServer, method: reqwest::Method, path: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .request(method, format!("{}{path}", s.http))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post(s: &TestServer, path: &str) -> (u16, String) {
    call(s, reqwest::Method::POST, path).await
}

async fn debug(s: &TestServer, key: &str) -> Value {
    let (_, body) = call(s, reqwest::Method::GET, &format!("/debug/{key}")).await;
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

/// The server as a GoCC deployment starts it: GoCC's variables only, and its key file.
async fn gocc_server(tag: &str) -> (TestServer, TempDir, std::path::PathBuf) {
    let dir = TempDir::new(tag);
    let file = dir.write("gocc.json", KEYS);
    let s = TestServer::start_from_env(&[
        ("MAX_REQUESTS", "3"),
        ("MAX_REQUESTS_IN_QUEUE", "2"),
        ("WINDOW_MILLIS", "1000"),
        ("REQUESTS_CAN_SET_RATE", "true"),
        ("REQUESTS_CAN_MOD_QUEUE", "true"),
        ("CONFIG_FILE", file.to_str().unwrap()),
        ("LOG_FORMAT", "json"),
        ("LOG_LEVEL", "INFO"),
    ])
    .await;
    (s, dir, file)
}

#[tokio::test]
async fn a_gocc_deployment_runs_unchanged() {
    let (s, _dir, _) = gocc_server("gocc-deploy").await;

    // `curl http://localhost:8080/rate/x`: the global defaults (MAX_REQUESTS=3).
    for want in [200, 200, 200, 429] {
        assert_eq!(post(&s, "/rate/x").await.0, want);
    }
    let x = debug(&s, "x").await;
    assert_eq!(x["Config"]["MaxRequestsPerWindow"], 3);
    assert_eq!(x["Config"]["MaxRequestsInQueue"], 2);

    // The file: user-cjk matches `^user-.*` then itself; both apply in order
    // (limiter_manager.go:238-252), and 0s leave values alone (README "Values set to 0").
    // A 200's body is the request id (endpoint_rate.go:135), kept for the release.
    let (code, cjk_id) = post(&s, "/rate/user-cjk").await;
    assert_eq!(code, 200);
    assert_eq!(
        post(&s, "/rate/user-cjk").await.0,
        429,
        "user-cjk: 1 a window"
    );
    let cjk = debug(&s, "user-cjk").await;
    assert_eq!(cjk["Config"]["MaxRequestsPerWindow"], 1);
    assert_eq!(cjk["Config"]["MaxRequestsInQueue"], 50);
    assert_eq!(cjk["Config"]["WindowMillis"], 60000);
    // `DELETE /rate/:key/:requestId` frees the slot.
    let release = format!("/rate/user-cjk/{cjk_id}");
    assert_eq!(call(&s, reqwest::Method::DELETE, &release).await.0, 200);
    assert_eq!(post(&s, "/rate/user-cjk").await.0, 200, "released");
    let guest = debug_after_one(&s, "guest").await;
    assert_eq!(guest["Config"]["MaxRequestsPerWindow"], 10);
    // A regex matches anywhere in the key (config.go:168 `MatchString`).
    let late = debug_after_one(&s, "much-later").await;
    assert_eq!(late["Config"]["MaxRequestsPerWindow"], 5);
}

#[tokio::test]
async fn readme_overrides_are_sticky_until_the_key_file_reloads() {
    let (s, _dir, file) = gocc_server("gocc-reload").await;
    // README's example request: reconfigures `my-api-key` to 200 a window and 400 queued.
    let (code, _) = post(
        &s,
        "/rate/my-api-key?canWait=true&maxRequests=200&maxRequestsInQueue=400",
    )
    .await;
    assert_eq!(code, 200);
    let mine = debug(&s, "my-api-key").await;
    assert_eq!(
        mine["Config"]["MaxRequestsPerWindow"], 200,
        "sticky: {mine}"
    );
    assert_eq!(mine["Config"]["MaxRequestsInQueue"], 400);
    for _ in 0..5 {
        assert_eq!(
            post(&s, "/rate/my-api-key").await.0,
            200,
            "later callers get 200 a window"
        );
    }

    // The file is reloaded on change, and a reload puts every key back on its configured
    // limits (limiter_manager.go:266-272): the sticky override is gone.
    std::fs::write(
        &file,
        KEYS.replace(
            "\"max_requests_per_window\": 5",
            "\"max_requests_per_window\": 1",
        ),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probe = 0;
    loop {
        probe += 1;
        let key = format!("/rate/later-{probe}");
        post(&s, &key).await;
        if post(&s, &key).await.0 == 429 {
            break;
        }
        assert!(Instant::now() < deadline, "the key file was not reloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        debug(&s, "my-api-key").await["Config"]["MaxRequestsPerWindow"],
        3
    );
}

/// One call on `key` (so it has a window), then its `/debug` entry.
async fn debug_after_one(s: &TestServer, key: &str) -> Value {
    post(s, &format!("/rate/{key}")).await;
    debug(s, key).await
}

#[tokio::test]
async fn goccs_settings_are_checked_as_goccs_bounds() {
    // config.go:98-100: MAX_REQUESTS 1..10^9, MAX_REQUESTS_IN_QUEUE 0..10^9, WINDOW_MILLIS
    // 10..3600000.
    for (k, v) in [
        ("MAX_REQUESTS", "0"),
        ("MAX_REQUESTS_IN_QUEUE", "1000000001"),
        ("WINDOW_MILLIS", "9"),
        ("WINDOW_MILLIS", "3600001"),
        ("REQUESTS_CAN_SET_RATE", "yes"),
    ] {
        let e = turnstile::settings::Settings::from_env(|n| (n == k).then(|| v.to_owned()))
            .expect_err(k);
        assert!(e.starts_with(&format!("{k}={v}")), "{e}");
    }
}

/// `turnstile check`, on GoCC's key file named by `--config` or by `CONFIG_FILE`.
fn check(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .arg("check")
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("run turnstile check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn check_reads_goccs_key_file() {
    let dir = TempDir::new("gocc-check");
    let good = dir.write(
        "gocc.json",
        &KEYS.replace("\"guest\",", "\"guest\", \"note\": 1,"),
    );
    let (code, err) = check(&["--config", good.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("GoCC key file OK") && err.contains("(4 key(s))"),
        "{err}"
    );
    assert!(
        err.contains("keys[1]: unknown field \"note\" ignored"),
        "{err}"
    );
    let (code, err) = check(&[], &[("CONFIG_FILE", good.to_str().unwrap())]);
    assert_eq!(code, Some(0), "no YAML location is needed: {err}");

    let bad = dir.write(
        "bad.json",
        r#"{"keys": [{"key_pattern": "user-(", "key_pattern_is_regex": true}]}"#,
    );
    let (code, err) = check(&[], &[("CONFIG_FILE", bad.to_str().unwrap())]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}: keys[0].key_pattern: \"user-(\"",
            bad.display()
        )),
        "{err}"
    );
}
