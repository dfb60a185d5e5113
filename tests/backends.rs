//! One scenario suite, every backend: the same behaviour in memory and through Redis.

mod common;

use std::time::Duration;

use common::redis::{env, Redis};
use common::*;
use envoy_types::pb::google::protobuf::UInt64Value;
use turnstile::service::WAITED_HEADER;

const CONFIG: &str = r#"
domain: s
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: second
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: token_bucket, burst: 2}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 3}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: queued
    rate_limit:
      unit: second
      requests_per_unit: 1
      queue: {max_waiting: 5, max_wait: 5s}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 50}
"#;

/// Every scenario, against one server.
async fn suite(s: &TestServer) {
    counts_and_resets(s).await;
    hits_and_refunds(s).await;
    refused_requests_consume_nothing(s).await;
    algorithms(s).await;
    several_limits(s).await;
    queued_waiter_is_admitted_at_rollover(s).await;
    exact_under_concurrency(s).await;
}

async fn counts_and_resets(s: &TestServer) {
    let got: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(codes(&s.call(one("s", &[("fixed", "a")])).await)[0]);
        }
        v
    };
    assert_eq!(got, vec![(OK, 2), (OK, 1), (OK, 0), (OVER, 0)]);
    let r = s.call(one("s", &[("fixed", "a")])).await;
    assert_eq!(
        r.statuses[0].duration_until_reset.as_ref().unwrap().seconds,
        40
    );
    s.advance(Duration::from_secs(40));
    assert_eq!(
        codes(&s.call(one("s", &[("fixed", "a")])).await),
        vec![(OK, 2)]
    );
}

async fn hits_and_refunds(s: &TestServer) {
    let mut d = desc(&[("fixed", "h")]);
    d.hits_addend = Some(UInt64Value { value: 2 });
    assert_eq!(
        codes(&s.call(req("s", vec![d.clone()])).await),
        vec![(OK, 1)]
    );
    d.hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(
        codes(&s.call(req("s", vec![d.clone()])).await),
        vec![(OK, 1)],
        "check only"
    );
    d.hits_addend = Some(UInt64Value { value: 2 });
    d.is_negative_hits = true;
    assert_eq!(
        codes(&s.call(req("s", vec![d])).await),
        vec![(OK, 3)],
        "refund"
    );
}

async fn refused_requests_consume_nothing(s: &TestServer) {
    for i in 0..10 {
        let k = format!("r{i}");
        let r = s
            .call(req(
                "s",
                vec![desc(&[("fixed", &k)]), desc(&[("blocked", "x")])],
            ))
            .await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!(
            codes(&s.call(one("s", &[("fixed", &k)])).await),
            vec![(OK, 2)],
            "{k}"
        );
    }
    // Over by its own limit: the refused hits are not counted either.
    let mut d = desc(&[("fixed", "big")]);
    d.hits_addend = Some(UInt64Value { value: 5 });
    assert_eq!(s.call(req("s", vec![d])).await.overall_code, OVER);
    assert_eq!(
        codes(&s.call(one("s", &[("fixed", "big")])).await),
        vec![(OK, 2)]
    );
}

async fn algorithms(s: &TestServer) {
    let sl: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(codes(&s.call(one("s", &[("sliding", "a")])).await)[0]);
        }
        v
    };
    assert_eq!(sl, vec![(OK, 3), (OK, 2), (OK, 1), (OK, 0), (OVER, 0)]);
    let tb: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(codes(&s.call(one("s", &[("bucket", "a")])).await)[0]);
        }
        v
    };
    assert_eq!(tb, vec![(OK, 1), (OK, 0), (OVER, 0)]);
    // One token every 10 s.
    s.advance(Duration::from_secs(10));
    assert_eq!(
        codes(&s.call(one("s", &[("bucket", "a")])).await),
        vec![(OK, 0)]
    );
}

async fn several_limits(s: &TestServer) {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.push(s.call(one("s", &[("multi", "m")])).await.overall_code);
    }
    assert_eq!(v, vec![OK, OK, OVER]);
    s.advance(Duration::from_secs(1));
    let r = s.call(one("s", &[("multi", "m")])).await;
    assert_eq!(codes(&r), vec![(OK, 0)], "third of the minute's three");
    s.advance(Duration::from_secs(1));
    let r = s.call(one("s", &[("multi", "m")])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        2,
        "the minute limit"
    );
}

async fn queued_waiter_is_admitted_at_rollover(s: &TestServer) {
    assert_eq!(s.call(one("s", &[("queued", "q")])).await.overall_code, OK);
    let mut c = s.client.clone();
    let waiter = tokio::spawn(async move {
        c.should_rate_limit(one("s", &[("queued", "q")]))
            .await
            .unwrap()
            .into_inner()
    });
    let stats = s.running().limiter.engine().stats().to_vec();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stats
        .iter()
        .map(|x| x.waiting.load(std::sync::atomic::Ordering::Relaxed))
        .sum::<u64>()
        != 1
    {
        assert!(tokio::time::Instant::now() < deadline, "queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    s.advance(Duration::from_secs(1));
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("admitted")
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(header(&r, WAITED_HEADER).is_some());
}

async fn exact_under_concurrency(s: &TestServer) {
    let mut tasks = Vec::new();
    for _ in 0..120 {
        let mut c = s.client.clone();
        tasks.push(tokio::spawn(async move {
            c.should_rate_limit(one("s", &[("hot", "h")]))
                .await
                .unwrap()
                .into_inner()
                .overall_code
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap() == OK);
    }
    assert_eq!(ok, 50);
}

#[tokio::test]
async fn memory() {
    let s = TestServer::start(CONFIG).await;
    suite(&s).await;
}

#[tokio::test]
async fn redis_single() {
    let redis = Redis::start();
    let s = TestServer::start_env(CONFIG, env(&redis, "suite_")).await;
    suite(&s).await;
}
