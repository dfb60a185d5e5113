//! The direct HTTP API (GoCC's): `/rate/{key}`, release, `/debug`, `/healthz`, answered as
//! kivra/GoCC's server answers them. File and line references are to kivra/GoCC at 0dbe72a
//! (`endpoint_rate.go` is `pkg/server/endpoints/endpoint_rate.go`, `limiter_instance.go` is
//! `pkg/limiter/limiter_instance/limiter_instance.go`).

use std::time::Duration;

use crate::common::*;
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

/// echo's `c.String` content type (labstack/echo `echo.go`, `MIMETextPlainCharsetUTF8`).
const TEXT: &str = "text/plain; charset=UTF-8";

/// An answer: status, content type (empty when none), body.
struct Answer {
    code: u16,
    content_type: String,
    body: String,
}

async fn send(s: &TestServer, method: reqwest::Method, path: &str) -> Answer {
    let r = reqwest::Client::new()
        .request(method, format!("{}{path}", s.http))
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let content_type = (r.headers().get("content-type"))
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    Answer {
        code,
        content_type,
        body: r.text().await.unwrap(),
    }
}

async fn post(s: &TestServer, path: &str) -> Answer {
    send(s, reqwest::Method::POST, path).await
}

async fn delete(s: &TestServer, path: &str) -> Answer {
    send(s, reqwest::Method::DELETE, path).await
}

async fn debug(s: &TestServer, key: &str) -> Value {
    let a = send(s, reqwest::Method::GET, &format!("/debug/{key}")).await;
    serde_json::from_str(&a.body).unwrap_or(Value::Null)
}

async fn until_waiting(s: &TestServer, key: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let v = debug(s, key).await;
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

fn waiter(s: &TestServer, path: &str) -> tokio::task::JoinHandle<u16> {
    let url = format!("{}{path}", s.http);
    tokio::spawn(async move {
        let r = reqwest::Client::new().post(url).send().await.unwrap();
        r.status().as_u16()
    })
}

async fn joined(w: tokio::task::JoinHandle<u16>) -> u16 {
    tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("the waiter is answered")
        .unwrap()
}

#[tokio::test]
async fn answers_are_goccs_id_as_text_then_429_with_no_body() {
    let s = TestServer::start(CONFIG).await;
    let a = post(&s, "/rate/job-a").await;
    // endpoint_rate.go:135: `c.String(http.StatusOK, requestID)`, a decimal counter
    // (limiter_manager.go:162).
    assert_eq!((a.code, a.content_type.as_str()), (200, TEXT));
    assert!(a.body.parse::<u64>().is_ok(), "{}", a.body);
    let b = send(&s, reqwest::Method::GET, "/rate/job-a").await;
    assert_eq!(b.code, 200, "GET works like POST (main.go:113-114)");
    assert_ne!(a.body, b.body, "each request gets its own id");
    // endpoint_rate.go:137: `c.NoContent(http.StatusTooManyRequests)`.
    let c = post(&s, "/rate/job-a").await;
    assert_eq!(
        (c.code, c.content_type.as_str(), c.body.as_str()),
        (429, "", "")
    );
    s.advance(Duration::from_secs(1));
    assert_eq!(post(&s, "/rate/job-a").await.code, 200);
    // Windows in milliseconds: 1 per 250 ms for other keys.
    assert_eq!(post(&s, "/rate/other").await.code, 200);
    assert_eq!(post(&s, "/rate/other").await.code, 429);
    s.advance(Duration::from_millis(250));
    assert_eq!(post(&s, "/rate/other").await.code, 200);
}

#[tokio::test]
async fn keys_are_trimmed_and_an_empty_key_or_id_is_400() {
    let s = TestServer::start(CONFIG).await;
    // endpoint_rate.go:70: `strings.TrimSpace(c.Param("key"))`.
    assert_eq!(post(&s, "/rate/%20job-t%09").await.code, 200);
    assert_eq!(post(&s, "/rate/job-t").await.code, 200);
    assert_eq!(post(&s, "/rate/job-t").await.code, 429, "the same key");
    // endpoint_rate.go:77-80 and 163-171.
    for (path, want) in [
        ("/rate/%20", "empty key provided"),
        ("/rate/", "empty key provided"),
    ] {
        let a = post(&s, path).await;
        assert_eq!((a.code, a.content_type.as_str()), (400, TEXT), "{path}");
        assert_eq!(a.body, want);
    }
    for (path, want) in [
        ("/rate/%20/1", "empty key provided"),
        ("/rate/job-t/%20", "empty id provided"),
        ("/rate/job-t/", "empty id provided"),
    ] {
        let a = delete(&s, path).await;
        assert_eq!((a.code, a.body.as_str()), (400, want), "{path}");
    }
}

#[tokio::test]
async fn release_is_200_always_and_the_waiter_gets_the_slot_before_any_newcomer() {
    let s = TestServer::start(CONFIG).await;
    let first = post(&s, "/rate/job-r").await.body;
    post(&s, "/rate/job-r").await;
    let w = waiter(&s, "/rate/job-r?canWait=true");
    until_waiting(&s, "job-r", 1).await;
    // Kept from turnstile: a newcomer does not take a slot while someone waits.
    assert_eq!(post(&s, "/rate/job-r").await.code, 429);
    let r = delete(&s, &format!("/rate/job-r/{first}")).await;
    // endpoint_rate.go:182: `c.NoContent(http.StatusOK)`.
    assert_eq!(
        (r.code, r.content_type.as_str(), r.body.as_str()),
        (200, "", "")
    );
    assert_eq!(joined(w).await, 200, "release admits the head of the queue");
    // GoCC answers 200 whatever the id or key (endpoint_rate.go:180-182,
    // limiter_manager.go:297-302); here a repeat frees nothing more.
    for path in [
        format!("/rate/job-r/{first}"),
        "/rate/job-r/12345".into(),
        "/rate/job-r/not-a-number".into(),
        "/rate/never-seen/1".into(),
    ] {
        assert_eq!(delete(&s, &path).await.code, 200, "{path}");
    }
    assert_eq!(post(&s, "/rate/job-r").await.code, 429, "still full");
    // A release after its window has ended changes nothing in the next one either.
    let old = post(&s, "/rate/job-w").await.body;
    s.advance(Duration::from_secs(1));
    assert_eq!(delete(&s, &format!("/rate/job-w/{old}")).await.code, 200);
    for want in [200, 200, 429] {
        assert_eq!(post(&s, "/rate/job-w").await.code, want);
    }
}

#[tokio::test]
async fn overrides_are_sticky_until_the_key_idles_three_windows() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-o").await;
    post(&s, "/rate/job-o").await;
    // limiter_instance.go:153-159: the override is written into the key's config before the
    // decision, and stays for every later caller.
    assert_eq!(post(&s, "/rate/job-o?maxRequests=4").await.code, 200);
    assert_eq!(post(&s, "/rate/job-o").await.code, 200, "sticky");
    assert_eq!(post(&s, "/rate/job-o").await.code, 429);
    assert_eq!(
        debug(&s, "job-o").await["Config"]["MaxRequestsPerWindow"],
        4
    );
    s.advance(Duration::from_secs(3));
    for _ in 0..4 {
        assert_eq!(
            post(&s, "/rate/job-o").await.code,
            200,
            "still 4 after 3 windows"
        );
    }
    // limiter_instance.go:85-89: idle for more than 3 windows, the key expires and its next
    // caller starts from the configured limit again.
    s.advance(Duration::from_millis(3_001));
    for want in [200, 200, 429] {
        assert_eq!(post(&s, "/rate/job-o").await.code, want);
    }
    // A sticky queue of 0 (allowed: config.go:99) turns waiting callers away once full.
    s.advance(Duration::from_secs(1));
    assert_eq!(post(&s, "/rate/job-o?maxRequestsInQueue=0").await.code, 200);
    post(&s, "/rate/job-o").await;
    assert_eq!(post(&s, "/rate/job-o?canWait=true").await.code, 429);
}

#[tokio::test]
async fn parameters_are_read_with_gos_rules() {
    let s = TestServer::start(CONFIG).await;
    // strconv.ParseBool after TrimSpace (endpoint_rate.go:234-240); empty is false.
    for v in [
        "1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False",
    ] {
        s.advance(Duration::from_secs(1));
        let a = post(&s, &format!("/rate/job-p?canWait=%20{v}%20")).await;
        assert_eq!(a.code, 200, "canWait={v}: {}", a.body);
    }
    assert_eq!(post(&s, "/rate/job-p?canWait=").await.code, 200);
    // strconv.ParseInt(t, 10, 32) after TrimSpace (endpoint_rate.go:242-252); GoCC's NoChange
    // (limiter_api.go:55) is no override; maxRequests is 1 to the cap (config.go:98, here
    // rate_api.max_requests_cap), maxRequestsInQueue 0 to it (config.go:99).
    for (query, code, why) in [
        (
            "canWait=yes",
            400,
            "failed to parse canWait query parameter",
        ),
        (
            "maxRequests=5x",
            400,
            "failed to parse maxRequests query parameter",
        ),
        ("maxRequests=1_0", 400, "failed to parse maxRequests"),
        ("maxRequests=2147483648", 400, "failed to parse maxRequests"),
        ("maxRequests=0", 400, "maxRequests out of bounds"),
        ("maxRequests=1001", 400, "maxRequests out of bounds"),
        (
            "maxRequestsInQueue=-1",
            400,
            "maxRequestsInQueue out of bounds",
        ),
        (
            "maxRequestsInQueue=x",
            400,
            "failed to parse maxRequestsInQueue",
        ),
        // Checked in GoCC's order (endpoint_rate.go:82-122): the first fault answers.
        ("canWait=x&maxRequests=0", 400, "canWait"),
        (
            "maxRequests=0&maxRequestsInQueue=x",
            400,
            "parse maxRequestsInQueue",
        ),
    ] {
        let a = post(&s, &format!("/rate/job-q?{query}")).await;
        assert_eq!((a.code, a.content_type.as_str()), (code, TEXT), "{query}");
        assert!(a.body.contains(why), "{query}: {}", a.body);
    }
    for query in [
        "maxRequests=%20%2B5%20",
        "maxRequests=-1000000000",
        "maxRequests=",
    ] {
        s.advance(Duration::from_secs(1));
        assert_eq!(
            post(&s, &format!("/rate/job-v?{query}")).await.code,
            200,
            "{query}"
        );
    }
    // The first of repeated parameters counts (url.Values.Get).
    s.advance(Duration::from_secs(1));
    assert_eq!(post(&s, "/rate/job-z?canWait=1&canWait=x").await.code, 200);
}

#[tokio::test]
async fn overrides_switched_off_are_403() {
    let strict =
        TestServer::start(&CONFIG.replace("allow_overrides: true", "allow_overrides: false")).await;
    // endpoint_rate.go:94-97 and 105-108.
    for (query, name) in [
        ("maxRequests=5", "maxRequests query parameter is disabled"),
        (
            "maxRequestsInQueue=5",
            "maxRequestsInQueue query parameter is disabled",
        ),
    ] {
        let a = post(&strict, &format!("/rate/job-s?{query}")).await;
        assert_eq!((a.code, a.content_type.as_str()), (403, TEXT), "{query}");
        assert!(a.body.contains(name), "{query}: {}", a.body);
    }
    assert_eq!(
        post(&strict, "/rate/job-s").await.code,
        200,
        "nothing was counted"
    );
    // GoCC's own switches, for keys no rate_api key matches.
    let gocc = TestServer::start_with(
        "domain: d\ndescriptors: []\n",
        &[
            ("REQUESTS_CAN_SET_RATE", "false"),
            ("REQUESTS_CAN_MOD_QUEUE", "F"),
        ],
    )
    .await;
    let a = post(&gocc, "/rate/k?maxRequests=5").await;
    assert_eq!(a.code, 403);
    assert!(a.body.contains("REQUESTS_CAN_SET_RATE=false"), "{}", a.body);
    let a = post(&gocc, "/rate/k?maxRequestsInQueue=5").await;
    assert_eq!(a.code, 403);
    assert!(
        a.body.contains("REQUESTS_CAN_MOD_QUEUE=false"),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn waiting_on_a_queue_of_0_is_200_with_room_and_429_without() {
    let s = TestServer::start(CONFIG).await;
    // limiter_instance.go:162-176: a caller that may wait is queued only while the queue has
    // room; `other` (the "*" key) has max_in_queue 0.
    assert_eq!(post(&s, "/rate/other?canWait=true").await.code, 200);
    assert_eq!(post(&s, "/rate/other?canWait=true").await.code, 429);
}

#[tokio::test]
async fn queue_full_is_429_and_waiters_are_admitted_window_by_window() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-f").await;
    post(&s, "/rate/job-f").await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        waiters.push(waiter(&s, "/rate/job-f?canWait=true"));
        until_waiting(&s, "job-f", i + 1).await;
    }
    let a = post(&s, "/rate/job-f?canWait=true").await;
    assert_eq!((a.code, a.body.as_str()), (429, ""), "max_in_queue 3");
    // One window at a time: a clock that jumps two windows at once skips one window's room.
    s.advance(Duration::from_secs(1));
    until_waiting(&s, "job-f", 1).await;
    s.advance(Duration::from_secs(1));
    for w in waiters {
        assert_eq!(joined(w).await, 200);
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
    assert_eq!(post(&s, "/rate/job-g").await.code, 200);
    assert_eq!(post(&s, "/rate/job-g").await.code, 200);
}

#[tokio::test]
async fn debug_shows_each_keys_window_and_healthz_answers() {
    let s = TestServer::start(CONFIG).await;
    post(&s, "/rate/job-d").await;
    post(&s, "/rate/job-d").await;
    post(&s, "/rate/job-d").await;
    let one = debug(&s, "job-d").await;
    assert_eq!(one["Config"]["WindowMillis"], 1000);
    assert_eq!(one["Config"]["MaxRequestsPerWindow"], 2);
    assert_eq!(one["Config"]["MaxRequestsInQueue"], 3);
    assert_eq!(one["NumApprovedThisWindow"], 2);
    assert_eq!(one["NumDeniedThisWindow"], 1);
    assert_eq!(one["NumWaiting"], 0);
    let all = send(&s, reqwest::Method::GET, "/debug").await;
    let all: Value = serde_json::from_str(&all.body).unwrap();
    assert_eq!(all["Instances"]["job-d"]["NumApprovedThisWindow"], 2);
    // endpoint_debug.go:22: `c.String(http.StatusNotFound, "Key not found")`.
    let none = send(&s, reqwest::Method::GET, "/debug/never-seen").await;
    assert_eq!((none.code, none.body.as_str()), (404, "Key not found"));
    assert_eq!(send(&s, reqwest::Method::GET, "/healthz").await.code, 200);
}

#[tokio::test]
async fn every_key_is_served_with_goccs_defaults_when_no_rate_api_key_matches() {
    // No rate_api section: GoCC's defaults (config.go:26-28), here from its variables.
    let s = TestServer::start_with(
        "domain: d\ndescriptors: []\n",
        &[("MAX_REQUESTS", "2"), ("WINDOW_MILLIS", "500")],
    )
    .await;
    for want in [200, 200, 429] {
        assert_eq!(post(&s, "/rate/anything").await.code, want);
    }
    s.advance(Duration::from_millis(500));
    assert_eq!(post(&s, "/rate/anything").await.code, 200);
    let d = debug(&s, "anything").await;
    assert_eq!(d["Config"]["WindowMillis"], 500);
    assert_eq!(
        d["Config"]["MaxRequestsInQueue"], 400,
        "GoCC's default queue"
    );
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
        let a = post(&s, path).await;
        assert_eq!(a.code, 400, "{path}: {}", a.body);
        assert!(
            a.body
                .contains("maxRequestsInQueue out of bounds: 11 is not from 0 to 10"),
            "{path}: {}",
            a.body
        );
    }
    // At the cap it is fine, and nothing above was counted.
    assert_eq!(
        post(&s, "/rate/job-a?maxRequestsInQueue=10").await.code,
        200
    );
    assert_eq!(post(&s, "/rate/job-a").await.code, 200);
}
