//! Windows of N units (`unit_multiplier`), calendar windows (`calendar: <zone>`) and what a
//! refused call is told about when to retry, on every storage; Redis's key names and TTLs for
//! them.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::redis::{env, Redis};
use crate::common::storage::{test_with_every_storage, Storage};
use crate::common::*;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: five
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: month
    rate_limit: {unit: month, calendar: Europe/Berlin, requests_per_unit: 2}
  - key: utc_month
    rate_limit: {unit: month, calendar: UTC, requests_per_unit: 2}
  - key: quarter
    rate_limit: {unit: month, unit_multiplier: 3, calendar: UTC, requests_per_unit: 2}
  - key: sliding_day
    rate_limit: {unit: day, calendar: America/New_York, requests_per_unit: 2, algorithm: sliding_window}
  - key: slow_bucket
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5, algorithm: token_bucket, burst: 1}
"#;

/// Limits any build reads: what a refusal says of them is new, not how they are written.
const RETRY: &str = r#"
domain: edge
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: token_bucket, burst: 10}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
"#;

const ADMIN: [(&str, &str); 1] = [("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0")];

/// T0 (1_700_000_000 s, 2023-11-14T22:13:20Z) is 200 s into its 5-minute window.
const FIVE_MINUTES_LEFT: i64 = 100;
/// The calendar month holding T0 in Berlin ends 2023-11-30T23:00:00Z (1_701_385_200 s).
const BERLIN_MONTH_LEFT: i64 = 1_385_200;

/// (code, remaining, seconds until reset) of a one-descriptor call.
async fn hit(s: &TestServer, key: &str, value: &str) -> (i32, u32, i64) {
    let r = s.call(one("edge", &[(key, value)])).await;
    let st = &r.statuses[0];
    let reset = st.duration_until_reset.as_ref().map_or(-1, |d| d.seconds);
    (st.code, st.limit_remaining, reset)
}

async fn admin(s: &TestServer, path: &str, pairs: &[(&str, &str)]) -> Vec<Value> {
    let addr = s.running().admin_addr.expect("the admin listener");
    let entries: Vec<Value> = (pairs.iter())
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    let body = json!({"domain": "edge", "descriptors": [{"entries": entries}]});
    let r = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .json(&body)
        .send()
        .await
        .expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.expect("JSON");
    v["limits"].as_array().expect("limits").clone()
}

test_with_every_storage!(
    five_minute_windows_count_reset_and_roll_over,
    calendar_months_follow_the_zone,
    quarters_and_calendar_sliding_days,
    a_refused_token_bucket_is_told_its_next_token,
    a_five_minute_token_bucket_refills_over_five_minutes,
    a_refused_sliding_window_is_told_when_the_estimate_admits,
    headers_describe_the_limit_that_refused,
);

async fn five_minute_windows_count_reset_and_roll_over(storage: &Storage) {
    let s = storage.start_with(CONFIG, &ADMIN).await;
    for left in [2, 1, 0] {
        assert_eq!(hit(&s, "five", "a").await, (OK, left, FIVE_MINUTES_LEFT));
    }
    assert_eq!(hit(&s, "five", "a").await, (OVER, 0, FIVE_MINUTES_LEFT));
    // A one-minute limit beside it keeps its one-minute window.
    assert_eq!(hit(&s, "minute", "a").await, (OK, 2, 40));
    let l = &admin(&s, "/admin/look-up", &[("five", "a")]).await[0];
    assert_eq!(l["unit"], "minute");
    assert_eq!(l["unit_multiplier"], 5);
    assert_eq!(l["used"], 3, "{l}");
    assert_eq!(l["resets_in_seconds"], FIVE_MINUTES_LEFT, "{l}");
    admin(&s, "/admin/reset", &[("five", "a")]).await;
    assert_eq!(hit(&s, "five", "a").await, (OK, 2, FIVE_MINUTES_LEFT));
    hit(&s, "five", "a").await;
    hit(&s, "five", "a").await;
    s.advance(Duration::from_secs(99));
    assert_eq!(hit(&s, "five", "a").await, (OVER, 0, 1));
    s.advance(Duration::from_secs(1));
    assert_eq!(hit(&s, "five", "a").await, (OK, 2, 300));
}

async fn calendar_months_follow_the_zone(storage: &Storage) {
    let s = storage.start_with(CONFIG, &ADMIN).await;
    assert_eq!(hit(&s, "month", "m").await, (OK, 1, BERLIN_MONTH_LEFT));
    assert_eq!(hit(&s, "month", "m").await, (OK, 0, BERLIN_MONTH_LEFT));
    assert_eq!(hit(&s, "month", "m").await, (OVER, 0, BERLIN_MONTH_LEFT));
    // UTC's November ends an hour later than Berlin's.
    assert_eq!(
        hit(&s, "utc_month", "m").await,
        (OK, 1, BERLIN_MONTH_LEFT + 3600)
    );
    let l = &admin(&s, "/admin/look-up", &[("month", "m")]).await[0];
    assert_eq!(l["calendar"], "Europe/Berlin", "{l}");
    assert_eq!(l["used"], 2, "{l}");
    // The last second of November in Berlin, then December: 31 days, to 2023-12-31T23:00Z.
    s.advance(Duration::from_secs(BERLIN_MONTH_LEFT as u64 - 1));
    assert_eq!(hit(&s, "month", "m").await, (OVER, 0, 1));
    s.advance(Duration::from_secs(1));
    assert_eq!(hit(&s, "month", "m").await, (OK, 1, 31 * 86_400));
}

async fn quarters_and_calendar_sliding_days(storage: &Storage) {
    let s = storage.start(CONFIG).await;
    // The quarter of T0 (2023-10-01 .. 2024-01-01 UTC) ends 4_067_200 s later.
    assert_eq!(hit(&s, "quarter", "q").await, (OK, 1, 4_067_200));
    // New York's 2023-11-14 ends at 05:00Z on the 15th: 24_400 s after T0.
    assert_eq!(hit(&s, "sliding_day", "d").await, (OK, 1, 24_400));
    assert_eq!(hit(&s, "sliding_day", "d").await, (OK, 0, 24_400));
    let (code, _, _) = hit(&s, "sliding_day", "d").await;
    assert_eq!(code, OVER);
    // The next day the estimate still weighs yesterday's two hits: full at its start.
    s.advance(Duration::from_secs(24_400));
    assert_eq!(hit(&s, "sliding_day", "d").await.0, OVER);
    // Halfway through the day one of them has decayed.
    s.advance(Duration::from_secs(43_200));
    assert_eq!(hit(&s, "sliding_day", "d").await.0, OK);
}

async fn a_refused_token_bucket_is_told_its_next_token(storage: &Storage) {
    let s = storage.start(RETRY).await;
    // 1000 an hour, bursts of 10: a token every 3.6 s.
    for _ in 0..10 {
        assert_eq!(hit(&s, "bucket", "b").await.0, OK);
    }
    assert_eq!(hit(&s, "bucket", "b").await, (OVER, 0, 4));
    s.advance(Duration::from_millis(3_600));
    assert_eq!(hit(&s, "bucket", "b").await.0, OK);
}

async fn a_five_minute_token_bucket_refills_over_five_minutes(storage: &Storage) {
    let s = storage.start(CONFIG).await;
    // 5 per 5 minutes, burst 1: a token a minute.
    assert_eq!(hit(&s, "slow_bucket", "b").await, (OK, 0, 60));
    assert_eq!(hit(&s, "slow_bucket", "b").await, (OVER, 0, 60));
    s.advance(Duration::from_secs(59));
    assert_eq!(hit(&s, "slow_bucket", "b").await, (OVER, 0, 1));
    s.advance(Duration::from_secs(1));
    assert_eq!(hit(&s, "slow_bucket", "b").await.0, OK);
}

async fn a_refused_sliding_window_is_told_when_the_estimate_admits(storage: &Storage) {
    let s = storage.start(RETRY).await;
    for _ in 0..10 {
        assert_eq!(hit(&s, "sliding", "s").await.0, OK);
    }
    // T0 is 20 s into its minute: the window ends in 40 s, where the ten hits weigh in full
    // and decay; one more fits once they weigh 9, 6 s later.
    assert_eq!(hit(&s, "sliding", "s").await, (OVER, 0, 46));
    s.advance(Duration::from_secs(45));
    assert_eq!(hit(&s, "sliding", "s").await.0, OVER);
    s.advance(Duration::from_secs(1));
    assert_eq!(hit(&s, "sliding", "s").await.0, OK);
}

async fn headers_describe_the_limit_that_refused(storage: &Storage) {
    let s = storage
        .start_with(RETRY, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")])
        .await;
    for _ in 0..10 {
        hit(&s, "bucket", "h").await;
    }
    for _ in 0..3 {
        hit(&s, "minute", "h").await;
    }
    // Both refuse: the bucket admits in 4 s, the minute in 40 s; the client must wait for both.
    let both = vec![desc(&[("bucket", "h")]), desc(&[("minute", "h")])];
    let r = s.call(req("edge", both)).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(header(&r, "RateLimit-Limit"), Some("3"));
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "RateLimit-Reset"), Some("40"));
    // Only the bucket refuses; an hourly limit with plenty left passes beside it.
    let r = s
        .call(req(
            "edge",
            vec![desc(&[("hour", "h")]), desc(&[("bucket", "h")])],
        ))
        .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(header(&r, "RateLimit-Limit"), Some("1000"));
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "RateLimit-Reset"), Some("4"));
}

/// envoyproxy/ratelimit's layout with the window's start: a 5-minute window's key ends in a
/// multiple of 300 s and lives 300 s; a calendar month's ends in the month's start in its zone
/// and lives the month; a one-unit key is as it always was.
#[tokio::test]
async fn redis_keys_name_the_windows_start_and_live_one_window() {
    let redis = Redis::start();
    let s = TestServer::start_env(CONFIG, env(&redis, "pfx_")).await;
    for (key, value) in [
        ("five", "k"),
        ("minute", "k"),
        ("month", "k"),
        ("quarter", "k"),
        ("sliding_day", "k"),
    ] {
        s.call(one("edge", &[(key, value)])).await;
    }
    let ttl = |key: &str| -> i64 {
        let t = redis.cli(&["TTL", key]);
        t.parse()
            .unwrap_or_else(|_| panic!("TTL {key}: {t}; keys: {}", redis.cli(&["KEYS", "*"])))
    };
    let keys = redis.cli(&["KEYS", "*"]);
    // 1_700_000_000 - 200.
    assert_eq!(
        redis.cli(&["GET", "pfx_edge_five_k_1699999800"]),
        "1",
        "{keys}"
    );
    assert!((290..=300).contains(&ttl("pfx_edge_five_k_1699999800")));
    // The reference's key for one unit, unchanged.
    assert_eq!(
        redis.cli(&["GET", "pfx_edge_minute_k_1699999980"]),
        "1",
        "{keys}"
    );
    assert!((50..=60).contains(&ttl("pfx_edge_minute_k_1699999980")));
    // November in Berlin starts 2023-10-31T23:00:00Z; it is 30 days long.
    assert_eq!(
        redis.cli(&["GET", "pfx_edge_month_k_1698793200"]),
        "1",
        "{keys}"
    );
    let month = ttl("pfx_edge_month_k_1698793200");
    assert!((30 * 86_400 - 10..=30 * 86_400).contains(&month), "{month}");
    // The fourth quarter of 2023 in UTC: 92 days from 2023-10-01.
    assert_eq!(
        redis.cli(&["GET", "pfx_edge_quarter_k_1696118400"]),
        "1",
        "{keys}"
    );
    let quarter = ttl("pfx_edge_quarter_k_1696118400");
    assert!(
        (92 * 86_400 - 10..=92 * 86_400).contains(&quarter),
        "{quarter}"
    );
    // A calendar sliding window: New York's 2023-11-14 starts at 05:00Z; its count lives
    // through the next day.
    let day = "pfx_{edge_sliding_day_k_}_1699938000";
    assert_eq!(redis.cli(&["GET", day]), "1", "{keys}");
    assert!((2 * 86_400 - 10..=2 * 86_400).contains(&ttl(day)));
}

/// `/debug/top` names each limit's window, and `/rlconfig` (as `turnstile check`) prints the
/// fields on the limit's line.
#[tokio::test]
async fn debug_top_and_rlconfig_name_the_windows() {
    let env = [("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")];
    let s = TestServer::start_with(CONFIG, &env).await;
    s.call(one("edge", &[("five", "t")])).await;
    s.call(one("edge", &[("month", "t")])).await;
    let debug = s.running().debug_addr.expect("the debug port");
    let top: Value = reqwest::get(format!("http://{debug}/debug/top"))
        .await
        .expect("debug answers")
        .json()
        .await
        .expect("JSON");
    let windows = |stat_key: &str| {
        let l = (top["limits"].as_array().expect("limits").iter())
            .find(|l| l["limit"] == stat_key)
            .unwrap_or_else(|| panic!("no {stat_key} in {top}"));
        l["windows"].clone()
    };
    assert_eq!(windows("edge.five"), json!(["5 minute"]));
    assert_eq!(windows("edge.month"), json!(["1 month in Europe/Berlin"]));
    let rlconfig = reqwest::get(format!("{}/rlconfig", s.http))
        .await
        .expect("rlconfig answers")
        .text()
        .await
        .unwrap();
    assert!(
        rlconfig.contains(
            "edge.five: unit=MINUTE requests_per_unit=3 algorithm=fixed_window unit_multiplier=5"
        ),
        "{rlconfig}"
    );
    assert!(rlconfig.contains("calendar=Europe/Berlin"), "{rlconfig}");
}

/// The IETF fields name a window of N units by its length.
#[tokio::test]
async fn ietf_policy_gives_the_windows_length() {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("TURNSTILE_RESPONSE_HEADERS", "ietf"),
    ];
    let s = TestServer::start_with(CONFIG, &env).await;
    let r = s.call(one("edge", &[("five", "i")])).await;
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some("\"edge.five\";q=3;w=300")
    );
    assert_eq!(header(&r, "RateLimit"), Some("\"edge.five\";r=2;t=100"));
}
