//! Reservations: a check (a descriptor's own `hits_addend` of 0) of a limit with `reserve` holds
//! that many hits for its request, so concurrent requests cannot all pass a budget that none
//! has reported against yet; the report of the request's usage counts in full and releases one
//! hold; a hold nobody reports releases itself after `reserve_for`. On every storage and every
//! algorithm that counts a budget.

use std::time::Duration;

use crate::common::redis::{self, Redis};
use crate::common::storage::{test_with_every_storage, Storage};
use crate::common::*;
use serde_json::{json, Value};

const RESERVING: &str = r#"
domain: ai
descriptors:
  - key: fixed
    rate_limit: {unit: day, requests_per_unit: 1000, reserve: 300, reserve_for: 10m}
  - key: sliding
    rate_limit:
      {unit: day, requests_per_unit: 1000, algorithm: sliding_window, reserve: 300, reserve_for: 10m}
  - key: bucket
    rate_limit:
      {unit: day, requests_per_unit: 1000, algorithm: token_bucket, reserve: 300, reserve_for: 10m}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 1000}
"#;

const ALGORITHMS: [&str; 3] = ["fixed", "sliding", "bucket"];

/// A check of `user`'s budget under `key`: its code and what it says is left.
async fn check(s: &TestServer, key: &str, user: &str) -> (i32, u32) {
    codes(&s.call(report("ai", &[(key, user)], 0)).await)[0]
}

async fn usage(s: &TestServer, key: &str, user: &str, hits: u64) -> (i32, u32) {
    codes(&s.call(report("ai", &[(key, user)], hits)).await)[0]
}

async fn three_checks_hold_the_budget_and_a_fourth_is_refused(storage: &Storage) {
    let s = storage.start(RESERVING).await;
    for key in ALGORITHMS {
        let answers = [
            check(&s, key, "alice").await,
            check(&s, key, "alice").await,
            check(&s, key, "alice").await,
            check(&s, key, "alice").await,
        ];
        assert_eq!(
            answers,
            [(OK, 700), (OK, 400), (OK, 100), (OVER, 0)],
            "{key}: each check holds 300 of 1000"
        );
    }
    // Without `reserve`, checks hold nothing: today's behaviour.
    for _ in 0..10 {
        assert_eq!(check(&s, "plain", "alice").await, (OK, 1000));
    }
}

async fn a_report_counts_its_usage_and_releases_one_hold(storage: &Storage) {
    let s = storage.start(RESERVING).await;
    for key in ALGORITHMS {
        assert_eq!(check(&s, key, "bob").await, (OK, 700), "{key}");
        // 250 used, the hold of 300 released: 750 left, and the next check holds 300 of it.
        assert_eq!(usage(&s, key, "bob", 250).await, (OK, 750), "{key}");
        assert_eq!(check(&s, key, "bob").await, (OK, 450), "{key}");
        assert_eq!(check(&s, key, "bob").await, (OK, 150), "{key}");
        assert_eq!(check(&s, key, "bob").await.0, OVER, "{key}");
        // Two held: a report of 100 releases one of them and what is left counts the other.
        assert_eq!(usage(&s, key, "bob", 100).await, (OK, 350), "{key}");
        assert_eq!(usage(&s, key, "bob", 300).await, (OK, 350), "{key}");
        // A report with nothing held releases nothing and counts in full.
        assert_eq!(usage(&s, key, "bob", 300).await, (OK, 50), "{key}");
        assert_eq!(usage(&s, key, "bob", 300).await.0, OVER, "{key}");
    }
}

async fn a_hold_nobody_reports_releases_itself_after_reserve_for(storage: &Storage) {
    let s = storage.start(RESERVING).await;
    for key in ALGORITHMS {
        for _ in 0..3 {
            assert_eq!(check(&s, key, "carol").await.0, OK, "{key}");
        }
        assert_eq!(check(&s, key, "carol").await.0, OVER, "{key}");
    }
    s.advance(Duration::from_secs(599));
    for key in ALGORITHMS {
        assert_eq!(
            check(&s, key, "carol").await.0,
            OVER,
            "{key}: held 10 minutes"
        );
    }
    s.advance(Duration::from_secs(2));
    for key in ALGORITHMS {
        assert_eq!(check(&s, key, "carol").await, (OK, 700), "{key}: expired");
    }
}

/// (used, held, remaining) of `user`'s limit under `key`, as the admin listener's look-up
/// reports it.
async fn looked_up(s: &TestServer, key: &str, user: &str) -> (u64, u64, u64) {
    let addr = s.running().admin_addr.expect("the admin listener");
    let body = json!({"domain": "ai", "descriptors": [{"entries": [{"key": key, "value": user}]}]});
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/admin/look-up"))
        .json(&body)
        .send()
        .await
        .expect("look-up");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("JSON");
    let l = &v["limits"][0];
    assert_eq!(l["reserve"], 300, "{l}");
    let n = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("no {k} in {l}"));
    (n("used"), n("held"), n("remaining"))
}

/// The sum over shards of a `ratelimit_service_reservations_<what>_total` family.
async fn reservations(s: &TestServer, what: &str) -> u64 {
    let family = format!("ratelimit_service_reservations_{what}_total");
    family_sum(s.http.trim_start_matches("http://"), &family).await
}

async fn the_operator_sees_what_is_held_and_how_holds_end(storage: &Storage) {
    let s = storage
        .start_with(
            RESERVING,
            &[("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0"), ("DEBUG_PORT", "0")],
        )
        .await;
    for key in ALGORITHMS {
        check(&s, key, "erin").await;
        check(&s, key, "erin").await;
        assert_eq!(looked_up(&s, key, "erin").await, (0, 600, 400), "{key}");
        usage(&s, key, "erin", 250).await;
        assert_eq!(looked_up(&s, key, "erin").await, (250, 300, 450), "{key}");
    }
    assert_eq!(reservations(&s, "made").await, 6);
    assert_eq!(reservations(&s, "reported").await, 3);
    assert_eq!(reservations(&s, "expired").await, 0);
    assert_eq!(status_page_holds(&s).await, (3, 0));
    // Nobody reports the second holds: they expire, and say so.
    s.advance(Duration::from_secs(601));
    for key in ALGORITHMS {
        assert_eq!(check(&s, key, "erin").await.0, OK, "{key}");
        assert_eq!(looked_up(&s, key, "erin").await.1, 300, "{key}");
    }
    assert_eq!(reservations(&s, "expired").await, 3);
    assert_eq!(reservations(&s, "made").await, 9);
    assert_eq!(status_page_holds(&s).await, (3, 3));
}

/// (holds now, holds expired) summed over the shards of the status page's `/debug/status`.
async fn status_page_holds(s: &TestServer) -> (u64, u64) {
    let addr = s.running().debug_addr.expect("the debug port");
    let v: Value = reqwest::get(format!("http://{addr}/debug/status"))
        .await
        .expect("/debug/status")
        .json()
        .await
        .expect("JSON");
    let shards = v["shards"].as_array().expect("shards");
    let sum = |k: &str| shards.iter().map(|s| s[k].as_u64().unwrap_or(0)).sum();
    (sum("holds"), sum("holds_expired"))
}

test_with_every_storage!(
    three_checks_hold_the_budget_and_a_fourth_is_refused,
    a_report_counts_its_usage_and_releases_one_hold,
    a_hold_nobody_reports_releases_itself_after_reserve_for,
    the_operator_sees_what_is_held_and_how_holds_end,
);

/// Two replicas sharing one Redis share the holds: checks alternate between them, and the
/// fourth is refused on either; a report on one releases a hold the other made.
#[tokio::test]
async fn two_replicas_on_one_redis_share_the_holds() {
    let redis = Redis::start();
    let a = TestServer::start_env(RESERVING, redis::env(&redis, "shared_")).await;
    let b = TestServer::start_env(RESERVING, redis::env(&redis, "shared_")).await;
    for key in ALGORITHMS {
        assert_eq!(check(&a, key, "dave").await, (OK, 700), "{key}");
        assert_eq!(check(&b, key, "dave").await, (OK, 400), "{key}");
        assert_eq!(check(&a, key, "dave").await, (OK, 100), "{key}");
        assert_eq!(check(&b, key, "dave").await.0, OVER, "{key}");
        assert_eq!(check(&a, key, "dave").await.0, OVER, "{key}");
        // b reports what a's first check held: 200 used, two holds left, no room for a third.
        assert_eq!(usage(&b, key, "dave", 200).await, (OK, 200), "{key}");
        assert_eq!(check(&a, key, "dave").await.0, OVER, "{key}");
        // a reports another: 300 used, one hold left, room for one more on either replica.
        assert_eq!(usage(&a, key, "dave", 100).await, (OK, 400), "{key}");
        assert_eq!(check(&b, key, "dave").await, (OK, 100), "{key}");
        assert_eq!(check(&a, key, "dave").await.0, OVER, "{key}");
    }
}
