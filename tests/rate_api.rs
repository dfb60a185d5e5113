//! The direct HTTP API (GoCC's): `/rate/{key}`, release, `/debug`, `/healthz`.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const CONFIG: &str = r#"
rate_api:
  allow_overrides: true
  max_requests_cap: 1000
  keys:
    - key: "job-*"
      window: 1000ms
      max_requests: 2
      max_in_queue: 3
      max_wait: 5s
    - key: "*"
      window: 250ms
      max_requests: 1
"#;

async fn post(s: &TestServer, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.http))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(s: &TestServer, path: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{}{path}", s.http)).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn delete(s: &TestServer, path: &str) -> u16 {
    reqwest::Client::new()
        .delete(format!("{}{path}", s.http))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn until_waiting(s: &TestServer, key: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, v) = get(s, &format!("/debug/{key}")).await;
        if v["NumWaiting"].as_u64().unwrap_or(0) == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key}: expected {n} waiting, got {v}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn admits_to_the_limit_then_429_and_a_new_window_admits_again() {
    let s = TestServer::start(CONFIG).await;
    let (c1, b1) = post(&s, "/rate/job-a").await;
    assert_eq!((c1, b1["remaining"].as_u64()), (200, Some(1)));
    assert!(b1["request_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(get(&s, "/rate/job-a").await.0, 200, "GET works like POST");
    let (c3, b3) = post(&s, "/rate/job-a").await;
    assert_eq!(c3, 429);
    assert_eq!(b3["retry_after_ms"], 1000);
    s.advance(Duration::from_secs(1));
    assert_eq!(post(&s, "/rate/job-a").await.0, 200);
    // Windows in milliseconds: 1 per 250 ms for other keys.
    assert_eq!(post(&s, "/rate/other").await.0, 200);
    assert_eq!(post(&s, "/rate/other").await.0, 429);
    s.advance(Duration::from_millis(250));
    assert_eq!(post(&s, "/rate/other").await.0, 200);
}

#[tokio::test]
async fn a_waiter_gets_the_released_slot_before_any_newcomer() {
    let s = TestServer::start(CONFIG).await;
    let (_, first) = post(&s, "/rate/job-r").await;
    post(&s, "/rate/job-r").await;
    let http = s.http.clone();
    let waiter = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(format!("{http}/rate/job-r?canWait=true"))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    until_waiting(&s, "job-r", 1).await;
    // A newcomer does not take a slot while someone waits.
    assert_eq!(post(&s, "/rate/job-r").await.0, 429);
    let id = first["request_id"].as_str().unwrap();
    assert_eq!(delete(&s, &format!("/rate/job-r/{id}")).await, 200);
    let (code, body) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, 200, "{body}");
    // Released once only; unknown ids are 404.
    assert_eq!(delete(&s, &format!("/rate/job-r/{id}")).await, 404);
    assert_eq!(delete(&s, "/rate/job-r/ffff").await, 404);
    assert_eq!(delete(&s, "/rate/job-r/not-hex").await, 404);
}

#[tokio::test]
async fn a_release_after_the_window_is_404() {
    let s = TestServer::start(CONFIG).await;
    let (_, b) = post(&s, "/rate/job-w").await;
    s.advance(Duration::from_secs(1));
    let id = b["request_id"].as_str().unwrap();
    assert_eq!(delete(&s, &format!("/rate/job-w/{id}")).await, 404);
}

#[tokio::test]
async fn overrides_apply_to_one_request_only() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-o").await;
    post(&s, "/rate/job-o").await;
    assert_eq!(post(&s, "/rate/job-o?maxRequests=5").await.0, 200);
    // Not sticky: the next caller gets the configured limit of 2 again.
    assert_eq!(post(&s, "/rate/job-o").await.0, 429);
    assert_eq!(
        post(&s, "/rate/job-o?maxRequests=5000").await.0,
        400,
        "over the cap"
    );

    let strict =
        TestServer::start(&CONFIG.replace("allow_overrides: true", "allow_overrides: false")).await;
    let (code, body) = post(&strict, "/rate/job-o?maxRequests=5").await;
    assert_eq!(code, 400);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("overrides are disabled"));
}

#[tokio::test]
async fn queue_full_and_no_queue_are_refused() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-f").await;
    post(&s, "/rate/job-f").await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let http = s.http.clone();
        waiters.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{http}/rate/job-f?canWait=true"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
        until_waiting(&s, "job-f", i + 1).await;
    }
    assert_eq!(
        post(&s, "/rate/job-f?canWait=true").await.0,
        429,
        "max_in_queue 3"
    );
    // `other` has no queue configured.
    assert_eq!(post(&s, "/rate/other?canWait=true").await.0, 400);
    // One window at a time: a clock that jumps two windows at once skips one window's room.
    s.advance(Duration::from_secs(1));
    until_waiting(&s, "job-f", 1).await;
    s.advance(Duration::from_secs(1));
    for w in waiters {
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .unwrap()
                .unwrap(),
            200
        );
    }
}

#[tokio::test]
async fn a_caller_that_gives_up_leaves_the_queue() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-g").await;
    post(&s, "/rate/job-g").await;
    let gave_up = reqwest::Client::new()
        .post(format!("{}/rate/job-g?canWait=true", s.http))
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gave_up.is_err());
    until_waiting(&s, "job-g", 0).await;
    s.advance(Duration::from_secs(1));
    // Nothing was consumed by the caller that left: both slots of the new window are free.
    assert_eq!(post(&s, "/rate/job-g").await.0, 200);
    assert_eq!(post(&s, "/rate/job-g").await.0, 200);
}

#[tokio::test]
async fn debug_shows_each_keys_window_and_healthz_answers() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-d").await;
    post(&s, "/rate/job-d").await;
    post(&s, "/rate/job-d").await;
    let (code, one) = get(&s, "/debug/job-d").await;
    assert_eq!(code, 200);
    assert_eq!(one["Config"]["WindowMillis"], 1000);
    assert_eq!(one["Config"]["MaxRequestsPerWindow"], 2);
    assert_eq!(one["NumApprovedThisWindow"], 2);
    assert_eq!(one["NumDeniedThisWindow"], 1);
    assert_eq!(one["NumWaiting"], 0);
    let (_, all) = get(&s, "/debug").await;
    assert_eq!(all["Instances"]["job-d"]["NumApprovedThisWindow"], 2);
    let (code, none) = get(&s, "/debug/never-seen").await;
    assert_eq!((code, none["Found"].as_bool()), (404, Some(false)));
    assert_eq!(get(&s, "/healthz").await.0, 200);
    // No rate_api section: 404 naming the problem.
    let plain = TestServer::start("domain: d\ndescriptors: []\n").await;
    let (code, body) = post(&plain, "/rate/x").await;
    assert_eq!(code, 404);
    assert!(body["error"].as_str().unwrap().contains("rate_api"));
}

#[tokio::test]
async fn a_queue_override_over_its_cap_is_refused_with_or_without_can_wait() {
    let s = TestServer::start(&CONFIG.replace(
        "max_requests_cap: 1000",
        "max_requests_cap: 1000\n  max_in_queue_cap: 10",
    ))
    .await;
    for path in [
        "/rate/job-a?maxRequestsInQueue=11",
        "/rate/job-a?maxRequestsInQueue=11&canWait=true",
        "/rate/job-a?maxRequestsInQueue=11&canWait=false",
    ] {
        let (code, body) = post(&s, path).await;
        assert_eq!(code, 400, "{path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("maxRequestsInQueue 11 is over the cap of 10")),
            "{path}: {body}"
        );
    }
    // At the cap it is fine, and nothing above was counted.
    let (code, body) = post(&s, "/rate/job-a?maxRequestsInQueue=10").await;
    assert_eq!((code, body["remaining"].as_u64()), (200, Some(1)), "{body}");
}
