//! Exact limits while Redis is away (the failure mode `fallback`): usage a replica counts from
//! memory meanwhile reaches Redis once it answers again, for windows still open, refunds netted
//! out. Redis is stalled (SIGSTOP) or killed and restarted with its data, so what Redis holds
//! after is what turnstile sent it. Time is the server's manual clock.

use std::time::{Duration, Instant};

use crate::common::redis::{env, Redis};
use crate::common::*;

const LIMITS: &str = r#"
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tiny
    rate_limit: {unit: day, requests_per_unit: 10}
"#;

/// T0's day and minute, as envoyproxy/ratelimit's keys name them (epoch seconds).
const DAY: u64 = 1_699_920_000;
const MINUTE: u64 = 1_699_999_980;

/// A breaker that opens after two failed round trips of 300 ms and probes 200 ms later.
fn away_env(redis: &Redis) -> Vec<(String, String)> {
    let mut e = env(redis, "away_");
    for (k, v) in [
        ("TURNSTILE_REDIS_DEADLINE_MS", "300"),
        ("TURNSTILE_REDIS_BREAKER_FAILURES", "2"),
        ("TURNSTILE_REDIS_COOLDOWN_MS", "200"),
        ("TURNSTILE_REDIS_FAILURE_MODE", "fallback"),
    ] {
        e.retain(|(n, _)| n != k);
        e.push((k.to_string(), v.to_string()));
    }
    e
}

/// Moves the clock 100 ms at a time until Redis holds `want` at `key` (or 15 s have passed),
/// then a while longer to see it stay there: nothing is sent twice.
async fn holds(s: &TestServer, redis: &Redis, key: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        s.advance(Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let got = redis.cli(&["GET", key]);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Redis holds {got:?} at {key}, not {want}"
        );
    }
    for _ in 0..6 {
        s.advance(Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(redis.cli(&["GET", key]), want, "{key} moved on");
}

async fn metric(s: &TestServer, name: &str) -> u64 {
    let text = (reqwest::get(format!("{}/metrics", s.http)).await.unwrap())
        .text()
        .await
        .unwrap();
    let series = text.lines().filter(|l| l.starts_with(&format!("{name}{{")));
    series
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reported_while_redis_is_stalled_reaches_it_after() {
    let redis = Redis::start();
    let s = TestServer::start_env(LIMITS, away_env(&redis)).await;
    let alice = [("user", "alice")];
    assert_eq!(
        codes(&s.call(report("ai", &alice, 100)).await),
        vec![(OK, 900)]
    );
    let key = format!("away_ai_user_alice_{DAY}");
    assert_eq!(redis.cli(&["GET", &key]), "100");
    // Redis stalls while five reports of 100 arrive: every one is answered.
    redis.pause();
    for _ in 0..5 {
        assert_eq!(s.call(report("ai", &alice, 100)).await.overall_code, OK);
    }
    redis.resume();
    // 600 were used: Redis counts every one of them, none twice.
    holds(&s, &redis, &key, "600").await;
    assert_eq!(
        codes(&s.call(report("ai", &alice, 0)).await),
        vec![(OK, 400)]
    );
    // The reports decided while the breaker was open went to Redis after; those sent before it
    // opened (abandoned at the deadline) Redis read on waking.
    let replayed = metric(&s, "ratelimit_service_redis_replayed_hits_total").await;
    assert!(
        (100..=500).contains(&replayed) && replayed % 100 == 0,
        "replayed {replayed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reported_while_redis_is_down_reaches_it_once_it_is_back_with_its_data() {
    let mut redis = Redis::start();
    let s = TestServer::start_env(LIMITS, away_env(&redis)).await;
    let bob = [("user", "bob")];
    assert_eq!(
        codes(&s.call(report("ai", &bob, 100)).await),
        vec![(OK, 900)]
    );
    let key = format!("away_ai_user_bob_{DAY}");
    assert_eq!(redis.cli(&["SAVE"]), "OK");
    redis.kill();
    for _ in 0..5 {
        assert_eq!(s.call(report("ai", &bob, 100)).await.overall_code, OK);
    }
    // Back with the 100 it held: the 500 reported meanwhile are added to them.
    redis.restart();
    assert_eq!(redis.cli(&["GET", &key]), "100");
    holds(&s, &redis, &key, "600").await;
    assert_eq!(codes(&s.call(report("ai", &bob, 0)).await), vec![(OK, 400)]);
    let replayed = metric(&s, "ratelimit_service_redis_replayed_hits_total").await;
    assert_eq!(replayed, 500);
    assert_eq!(
        metric(&s, "ratelimit_service_redis_replay_dropped_hits_total").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_of_a_window_that_ended_while_redis_was_away_are_not_replayed() {
    let mut redis = Redis::start();
    let s = TestServer::start_env(LIMITS, away_env(&redis)).await;
    let carol = [("minute", "carol")];
    assert_eq!(
        codes(&s.call(report("ai", &carol, 100)).await),
        vec![(OK, 900)]
    );
    let first = format!("away_ai_minute_carol_{MINUTE}");
    let second = format!("away_ai_minute_carol_{}", MINUTE + 60);
    assert_eq!(redis.cli(&["SAVE"]), "OK");
    redis.kill();
    // 300 in the first minute, then 200 in the next, all while Redis is away.
    for _ in 0..3 {
        assert_eq!(s.call(report("ai", &carol, 100)).await.overall_code, OK);
    }
    s.advance(Duration::from_secs(60));
    for _ in 0..2 {
        assert_eq!(s.call(report("ai", &carol, 100)).await.overall_code, OK);
    }
    redis.restart();
    holds(&s, &redis, &second, "200").await;
    // The first minute is over: its 300 no longer matter and are not sent.
    assert_eq!(redis.cli(&["GET", &first]), "100");
    assert_eq!(
        codes(&s.call(report("ai", &carol, 0)).await),
        vec![(OK, 800)]
    );
    assert_eq!(
        metric(&s, "ratelimit_service_redis_replayed_hits_total").await,
        200
    );
    assert_eq!(
        metric(&s, "ratelimit_service_redis_replay_dropped_hits_total").await,
        300
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_given_back_while_redis_is_away_net_out() {
    let mut redis = Redis::start();
    let s = TestServer::start_env(LIMITS, away_env(&redis)).await;
    let dan = desc(&[("user", "dan")]);
    let tiny = desc(&[("tiny", "dan")]);
    assert_eq!(
        s.call(report("ai", &[("user", "dan")], 100))
            .await
            .overall_code,
        OK
    );
    assert_eq!(redis.cli(&["SAVE"]), "OK");
    redis.kill();
    // Requests of 10 hits on both limits: the first fills `tiny`, the next two are refused by
    // it and consume nothing on `user`.
    let both = || with_hits(req("ai", vec![dan.clone(), tiny.clone()]), 10);
    assert_eq!(s.call(both()).await.overall_code, OK);
    for _ in 0..2 {
        assert_eq!(s.call(both()).await.overall_code, OVER);
    }
    // Usage reported in full counts whatever the limits say.
    assert_eq!(
        s.call(report("ai", &[("user", "dan")], 100))
            .await
            .overall_code,
        OK
    );
    redis.restart();
    holds(&s, &redis, &format!("away_ai_user_dan_{DAY}"), "210").await;
    assert_eq!(
        redis.cli(&["GET", &format!("away_ai_tiny_dan_{DAY}")]),
        "10"
    );
    assert_eq!(
        codes(&s.call(report("ai", &[("user", "dan")], 0)).await),
        vec![(OK, 790)]
    );
}

/// Local-first: a sync sent as Redis stalls is abandoned at the deadline, and Redis counts it on
/// waking. It is not sent again, so Redis holds each hit once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_first_sync_abandoned_at_its_deadline_is_not_sent_again() {
    let redis = Redis::start();
    let mut e = away_env(&redis);
    e.push(("TURNSTILE_LOCAL_FIRST".into(), "true".into()));
    e.push(("TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL".into(), "100ms".into()));
    let s = TestServer::start_env(LIMITS, e).await;
    let carol = [("user", "carol")];
    let take = |hits: u64| {
        let mut r = req("ai", vec![desc(&carol)]);
        r.hits_addend = hits as u32;
        r
    };
    let key = format!("away_ai_user_carol_{DAY}");
    // The first call has no view yet: it goes to Redis, and reads the count back.
    assert_eq!(codes(&s.call(take(100)).await), vec![(OK, 900)]);
    assert_eq!(redis.cli(&["GET", &key]), "100");
    // Decided from memory; the sync that carries it finds Redis stalled.
    assert_eq!(codes(&s.call(take(50)).await), vec![(OK, 850)]);
    redis.pause();
    s.advance(Duration::from_millis(150));
    // The sync is abandoned at the 300 ms deadline, then Redis wakes and runs it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    redis.resume();
    holds(&s, &redis, &key, "150").await;
    assert_eq!(codes(&s.call(take(1)).await), vec![(OK, 849)]);
}
