//! One scenario suite, every storage: the same behaviour in memory and through Redis, each
//! scenario a test of its own on each storage (`negative_hits_refund::memory`,
//! `negative_hits_refund::redis`, ...).

use std::time::Duration;

use crate::common::storage::{test_with_every_storage, Storage};
use crate::common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::google::protobuf::UInt64Value;

test_with_every_storage!(
    counts_to_the_limit_then_over_limit_with_full_status,
    window_rolls_over_on_the_aligned_boundary,
    hits_addend_request_level_and_descriptor_level,
    negative_hits_refund,
    a_refused_request_consumes_nothing_across_shards,
    concurrent_callers_never_get_more_than_the_limit,
    algorithms,
    several_limits,
    queued_waiter_is_admitted_at_rollover,
    a_raised_override_admits_at_once,
    a_raised_queued_limit_admits_its_waiters_at_once,
);

// ------------------------------------------------------------------------------------------
// Counting, on the config of `service::answers` (envoyproxy/ratelimit's answers).

async fn counts_to_the_limit_then_over_limit_with_full_status(storage: &Storage) {
    let s = storage.start(EDGE).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(s.call(one("edge", &[("api_key", "alice")])).await);
    }
    let seen: Vec<_> = got.iter().map(|r| (r.overall_code, codes(r)[0])).collect();
    assert_eq!(
        seen,
        vec![
            (OK, (OK, 2)),
            (OK, (OK, 1)),
            (OK, (OK, 0)),
            (OVER, (OVER, 0))
        ]
    );
    let st = &got[0].statuses[0];
    let limit = st.current_limit.as_ref().expect("current_limit set");
    assert_eq!((limit.requests_per_unit, limit.unit), (3, 2 /* MINUTE */));
    // T0 is 20 s past the minute: the aligned window ends in 40 s.
    assert_eq!(st.duration_until_reset.as_ref().unwrap().seconds, 40);
    // Another value of the key-only descriptor has its own counter.
    assert_eq!(
        codes(&s.call(one("edge", &[("api_key", "bob")])).await),
        vec![(OK, 2)]
    );
}

async fn window_rolls_over_on_the_aligned_boundary(storage: &Storage) {
    let s = storage.start(EDGE).await;
    for _ in 0..3 {
        s.call(one("edge", &[("api_key", "a")])).await;
    }
    assert_eq!(
        s.call(one("edge", &[("api_key", "a")])).await.overall_code,
        OVER
    );
    s.advance(Duration::from_secs(39));
    let r = s.call(one("edge", &[("api_key", "a")])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        r.statuses[0].duration_until_reset.as_ref().unwrap().seconds,
        1
    );
    s.advance(Duration::from_secs(1));
    let r = s.call(one("edge", &[("api_key", "a")])).await;
    assert_eq!(codes(&r), vec![(OK, 2)]);
    assert_eq!(
        r.statuses[0].duration_until_reset.as_ref().unwrap().seconds,
        60
    );
}

async fn hits_addend_request_level_and_descriptor_level(storage: &Storage) {
    let s = storage.start(EDGE).await;
    let mut r = one("edge", &[("api_key", "h")]);
    r.hits_addend = 2;
    assert_eq!(codes(&s.call(r.clone()).await), vec![(OK, 1)]);
    // Request-level 0 means 1.
    r.hits_addend = 0;
    assert_eq!(codes(&s.call(r).await), vec![(OK, 0)]);

    // Descriptor-level hits_addend wins, and 0 there checks without consuming.
    let mut d = desc(&[("api_key", "d")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let mut rq = req("edge", vec![d.clone()]);
    rq.hits_addend = 5;
    assert_eq!(codes(&s.call(rq.clone()).await), vec![(OK, 3)]);
    d.hits_addend = Some(UInt64Value { value: 3 });
    rq.descriptors = vec![d.clone()];
    assert_eq!(codes(&s.call(rq.clone()).await), vec![(OK, 0)]);
    // Over by the addend: refused, and a descriptor's own hits_addend is usage that counts in
    // full (envoyproxy/ratelimit's INCRBY): 6 of 3 used, so a check is refused now.
    assert_eq!(s.call(rq.clone()).await.overall_code, OVER);
    d.hits_addend = Some(UInt64Value { value: 0 });
    rq.descriptors = vec![d];
    assert_eq!(codes(&s.call(rq).await), vec![(OVER, 0)]);

    // A request's own hits_addend is a weighted request: refused, it consumes nothing.
    let mut w = one("edge", &[("api_key", "w")]);
    w.hits_addend = 3;
    assert_eq!(codes(&s.call(w.clone()).await), vec![(OK, 0)]);
    assert_eq!(s.call(w).await.overall_code, OVER);
    let mut check = desc(&[("api_key", "w")]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(
        codes(&s.call(req("edge", vec![check])).await),
        vec![(OK, 0)]
    );
}

async fn negative_hits_refund(storage: &Storage) {
    let s = storage.start(EDGE).await;
    for _ in 0..3 {
        s.call(one("edge", &[("api_key", "r")])).await;
    }
    let mut d = desc(&[("api_key", "r")]);
    d.is_negative_hits = true;
    d.hits_addend = Some(UInt64Value { value: 2 });
    let r = s.call(req("edge", vec![d])).await;
    assert_eq!(codes(&r), vec![(OK, 2)]);
    assert_eq!(
        codes(&s.call(one("edge", &[("api_key", "r")])).await),
        vec![(OK, 1)]
    );
}

async fn a_refused_request_consumes_nothing_across_shards(storage: &Storage) {
    let s = storage.start(EDGE).await;
    // `blocked` always refuses; the api_key counters of the same requests must stay untouched,
    // wherever their shards are.
    for i in 0..20 {
        let k = format!("u{i}");
        let r = s
            .call(req(
                "edge",
                vec![desc(&[("api_key", &k)]), desc(&[("blocked", "b")])],
            ))
            .await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!(
            codes(&s.call(one("edge", &[("api_key", &k)])).await),
            vec![(OK, 2)],
            "{k}"
        );
    }
}

async fn concurrent_callers_never_get_more_than_the_limit(storage: &Storage) {
    let s = storage.start(EDGE).await;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let c = s.client.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = c;
            c.should_rate_limit(one("edge", &[("api_key", "vip")]))
                .await
                .unwrap()
                .into_inner()
        }));
    }
    let mut left = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        if r.overall_code == OK {
            left.push(r.statuses[0].limit_remaining);
        }
    }
    assert_eq!(
        left.len(),
        100,
        "exactly the limit of 100 per hour admitted"
    );
    // Each admitted caller was told its own place in the window, as if they came one by one
    // (through Redis, many calls of a round trip count with one INCRBY).
    left.sort_unstable();
    assert_eq!(left, (0..100).collect::<Vec<u32>>());
}

// ------------------------------------------------------------------------------------------
// Algorithms, several limits on one descriptor, and queues.

const CONFIG: &str = r#"
domain: s
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: token_bucket, burst: 2}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 3}
  - key: queued
    rate_limit:
      unit: second
      requests_per_unit: 1
      queue: {max_waiting: 5, max_wait: 5s}
"#;

async fn algorithms(storage: &Storage) {
    let s = storage.start(CONFIG).await;
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

async fn several_limits(storage: &Storage) {
    let s = storage.start(CONFIG).await;
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

async fn queued_waiter_is_admitted_at_rollover(storage: &Storage) {
    let s = storage.start(CONFIG).await;
    assert_eq!(s.call(one("s", &[("queued", "q")])).await.overall_code, OK);
    let waiter = s.queued(one("s", &[("queued", "q")])).await;
    s.advance(Duration::from_secs(1));
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("admitted")
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(header(&r, WAITED_HEADER).is_some());
}

// ------------------------------------------------------------------------------------------
// A per-request `limit` override (Envoy Gateway sets one per tenant): the limit the request
// carries decides, whatever an earlier request over a lower one left behind.

/// One descriptor of domain `edge` carrying an override of `per_minute` requests a minute.
fn with_override(
    per_minute: u32,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    let mut d = desc(&[("tenant_override", "acme")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: per_minute,
        unit: 2, // MINUTE
    });
    req("edge", vec![d])
}

async fn a_raised_override_admits_at_once(storage: &Storage) {
    // The over-limit cache on, as envoyproxy/ratelimit#1077 reports it.
    let s = (storage.start_with(EDGE, &[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")])).await;
    // Each call a second after the last, all in one minute: local-first views are stale by
    // then, so each call asks the store, and the refusal comes from it as it does on Redis.
    let mut low = Vec::new();
    for _ in 0..4 {
        s.advance(Duration::from_secs(1));
        low.push(codes(&s.call(with_override(2)).await)[0]);
    }
    assert_eq!(low, vec![(OK, 1), (OK, 0), (OVER, 0), (OVER, 0)]);
    // Raised: the two admitted count against the new limit, the refused ones did not count.
    let mut raised = Vec::new();
    for _ in 0..3 {
        s.advance(Duration::from_secs(1));
        raised.push(codes(&s.call(with_override(100)).await)[0]);
    }
    assert_eq!(raised, vec![(OK, 97), (OK, 96), (OK, 95)]);
    // Lowered again, in the same window: over at once.
    s.advance(Duration::from_secs(1));
    assert_eq!(codes(&s.call(with_override(2)).await), vec![(OVER, 0)]);
}

/// A queued limit raised by a reload while someone waits at its key: the waiter and a newcomer
/// are admitted at once, judged by the raised limit (the clock does not move).
async fn a_raised_queued_limit_admits_its_waiters_at_once(storage: &Storage) {
    let limits = |per_minute: u32| {
        format!(
            "domain: q\ndescriptors:\n  - key: queued\n    rate_limit:\n      unit: minute\n      requests_per_unit: {per_minute}\n      queue: {{max_waiting: 5, max_wait: 60s}}\n"
        )
    };
    let dir = crate::common::tempdir::TempDir::new("raised-queue");
    dir.write("ratelimit/config/q.yaml", &limits(1));
    let root = dir.path().to_str().unwrap().to_owned();
    let env = [
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
    ];
    let s = storage.start_from_env(&env).await;
    assert_eq!(s.call(one("q", &[("queued", "a")])).await.overall_code, OK);
    let waiter = s.queued(one("q", &[("queued", "a")])).await;
    dir.write("ratelimit/config/q.yaml", &limits(100));
    s.running().reload_config().expect("the raised limit loads");
    let newcomer =
        tokio::time::timeout(Duration::from_secs(5), s.call(one("q", &[("queued", "a")])))
            .await
            .expect("the newcomer is answered without waiting for the window");
    assert_eq!(newcomer.overall_code, OK);
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is admitted under the raised limit")
        .unwrap();
    assert_eq!(waited.overall_code, OK);
}
