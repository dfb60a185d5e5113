//! Sliding window, token bucket and several limits per descriptor, over gRPC.

use std::time::Duration;

use crate::common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;

fn reset(r: &RateLimitResponse) -> i64 {
    r.statuses[0].duration_until_reset.as_ref().unwrap().seconds
}

fn limit(r: &RateLimitResponse) -> (u32, i32) {
    let l = r.statuses[0].current_limit.as_ref().unwrap();
    (l.requests_per_unit, l.unit)
}

/// 10 a minute each: a bucket of 3 (`upload`), a fixed and a sliding window.
const TEN_A_MINUTE: &str = r#"
domain: a
descriptors:
  - key: upload
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 3}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
"#;

#[tokio::test]
async fn token_bucket_reports_tokens_left_and_time_to_full() {
    let s = TestServer::start(TEN_A_MINUTE).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(s.call(one("a", &[("upload", "u")])).await);
    }
    assert_eq!(
        got.iter().map(|r| codes(r)[0]).collect::<Vec<_>>(),
        vec![(OK, 2), (OK, 1), (OK, 0), (OVER, 0)]
    );
    // One token every 6 s: the bucket is full again 18 s after three were taken; the refused
    // call is told when its token comes, 6 s.
    assert_eq!(reset(&got[2]), 18);
    assert_eq!(reset(&got[3]), 6);
    assert_eq!(limit(&got[0]), (10, 2));
    s.advance(Duration::from_secs(6));
    assert_eq!(
        codes(&s.call(one("a", &[("upload", "u")])).await),
        vec![(OK, 0)]
    );
    s.advance(Duration::from_secs(18));
    assert_eq!(
        codes(&s.call(one("a", &[("upload", "u")])).await),
        vec![(OK, 2)]
    );
}

/// Hits more than a bucket or a window can ever hold are refused with a wait that is never 0
/// (Envoy would make it `Retry-After: 0`, a tight retry loop for a request that cannot pass):
/// a token bucket tells how long an emptied bucket takes to fill, a window its end.
#[tokio::test]
async fn hits_no_wait_can_admit_are_never_told_zero() {
    let s = TestServer::start(TEN_A_MINUTE).await;
    let big = |key: &str, hits: u32| {
        let mut r = one("a", &[(key, "u")]);
        r.hits_addend = hits;
        r
    };
    // A full bucket of 3, one token every 6 s: 5 hits never fit; 18 s fills an empty one.
    let r = s.call(big("upload", 5)).await;
    assert_eq!((codes(&r)[0], reset(&r)), ((OVER, 0), 18));
    s.call(one("a", &[("upload", "u")])).await;
    let r = s.call(big("upload", 4)).await;
    assert_eq!((codes(&r)[0], reset(&r)), ((OVER, 0), 18));
    // T0 is 20 s into its minute: 11 hits of 10 a minute are told the window's end.
    for key in ["fixed", "sliding"] {
        let r = s.call(big(key, 11)).await;
        assert_eq!((codes(&r)[0], reset(&r)), ((OVER, 0), 40), "{key}");
    }
}

#[tokio::test]
async fn sliding_window_has_no_burst_at_the_window_edge() {
    let s = TestServer::start(
        r#"
domain: a
descriptors:
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 10}
"#,
    )
    .await;
    // 39 s into the window (59 s past the minute), ten requests each.
    s.advance(Duration::from_secs(39));
    for key in ["login", "fixed"] {
        let mut r = one("a", &[(key, "x")]);
        r.hits_addend = 10;
        assert_eq!(s.call(r).await.overall_code, OK);
    }
    // Two seconds later a new aligned window has begun: the fixed window admits ten more at
    // once, the sliding window still weighs the previous minute (59/60 of ten, rounded up).
    s.advance(Duration::from_secs(2));
    let mut r = one("a", &[("fixed", "x")]);
    r.hits_addend = 10;
    assert_eq!(s.call(r).await.overall_code, OK);
    assert_eq!(s.call(one("a", &[("login", "x")])).await.overall_code, OVER);
    // Half-way through the new window, half of the previous ten still count.
    s.advance(Duration::from_secs(29));
    let r = s.call(one("a", &[("login", "x")])).await;
    assert_eq!(codes(&r), vec![(OK, 4)]);
    assert_eq!(limit(&r), (10, 2));
}

const MULTI: &str = r#"
domain: a
descriptors:
  - key: search
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, name: per_minute}
"#;

#[tokio::test]
async fn several_limits_report_the_one_closest_to_exhaustion() {
    let s = TestServer::start(MULTI).await;
    let r = s.call(one("a", &[("search", "q")])).await;
    assert_eq!(
        (codes(&r), limit(&r)),
        (vec![(OK, 1)], (2, 1)),
        "per second is closest"
    );
    s.call(one("a", &[("search", "q")])).await;
    let r = s.call(one("a", &[("search", "q")])).await;
    assert_eq!(
        (codes(&r), limit(&r), reset(&r)),
        (vec![(OVER, 0)], (2, 1), 1)
    );
    s.advance(Duration::from_secs(1));
    s.call(one("a", &[("search", "q")])).await;
    let r = s.call(one("a", &[("search", "q")])).await;
    // Four taken: the refused third one counted on neither limit. Now per minute has 1 left.
    assert_eq!(codes(&r), vec![(OK, 0)]);
    s.advance(Duration::from_secs(1));
    let r = s.call(one("a", &[("search", "q")])).await;
    assert_eq!((codes(&r), limit(&r)), (vec![(OK, 0)], (5, 2)));
    s.advance(Duration::from_secs(1));
    let r = s.call(one("a", &[("search", "q")])).await;
    let l = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (r.overall_code, l.requests_per_unit, l.name.as_str()),
        (OVER, 5, "per_minute")
    );
    // The minute window ends at T0 + 40 s; 3 s have passed.
    assert_eq!(reset(&r), 37);
}

#[tokio::test]
async fn every_algorithm_honours_hits_refunds_shadow_replaces_and_quota() {
    for alg in ["fixed_window", "sliding_window", "token_bucket"] {
        let yaml = format!(
            r#"
domain: a
descriptors:
  - key: k
    rate_limit: {{unit: minute, requests_per_unit: 4, algorithm: {alg}, name: base}}
  - key: shadow
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 1, algorithm: {alg}}}
  - key: better
    rate_limit: {{unit: minute, requests_per_unit: 100, algorithm: {alg}, replaces: [{{name: base}}]}}
  - key: qa
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 1, algorithm: {alg}}}
  - key: qb
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 1, algorithm: {alg}}}
"#
        );
        let s = TestServer::start(&yaml).await;
        let with_hits = |n: u64, negative: bool| {
            let mut d = desc(&[("k", "x")]);
            d.hits_addend = Some(UInt64Value { value: n });
            d.is_negative_hits = negative;
            req("a", vec![d])
        };
        assert_eq!(
            codes(&s.call(with_hits(3, false)).await),
            vec![(OK, 1)],
            "{alg}"
        );
        // A weighted request (the request's own `hits_addend`) that does not fit is refused and
        // consumes nothing; a descriptor's own `hits_addend` would be usage counted in full.
        let mut weighted = req("a", vec![desc(&[("k", "x")])]);
        weighted.hits_addend = 2;
        assert_eq!(s.call(weighted).await.overall_code, OVER, "{alg}");
        assert_eq!(
            codes(&s.call(with_hits(0, false)).await),
            vec![(OK, 1)],
            "{alg}: check only"
        );
        assert_eq!(
            codes(&s.call(with_hits(2, true)).await),
            vec![(OK, 3)],
            "{alg}: refund"
        );

        s.call(one("a", &[("shadow", "x")])).await;
        let r = s.call(one("a", &[("shadow", "x")])).await;
        assert_eq!(
            (r.overall_code, codes(&r)),
            (OK, vec![(OK, 0)]),
            "{alg}: shadow"
        );

        let r = s
            .call(req(
                "a",
                vec![desc(&[("k", "x")]), desc(&[("better", "x")])],
            ))
            .await;
        assert!(r.statuses[0].current_limit.is_none(), "{alg}: replaced");
        assert_eq!(
            codes(&s.call(with_hits(0, false)).await),
            vec![(OK, 3)],
            "{alg}: untouched"
        );

        let both = || req("a", vec![desc(&[("qa", "x")]), desc(&[("qb", "x")])]);
        assert_eq!(s.call(both()).await.overall_code, OK, "{alg}");
        assert_eq!(
            s.call(both()).await.overall_code,
            OVER,
            "{alg}: all quota over"
        );
    }
}

#[tokio::test]
async fn a_queued_token_bucket_waiter_waits_for_its_token() {
    let s = TestServer::start(
        r#"
domain: a
descriptors:
  - key: tb
    rate_limit:
      unit: second
      requests_per_unit: 2
      algorithm: token_bucket
      burst: 1
      queue: {max_waiting: 5, max_wait: 2s}
"#,
    )
    .await;
    assert_eq!(s.call(one("a", &[("tb", "x")])).await.overall_code, OK);
    let mut c = s.client.clone();
    let waiter = tokio::spawn(async move {
        c.should_rate_limit(one("a", &[("tb", "x")]))
            .await
            .unwrap()
            .into_inner()
    });
    let stats = s.running().context.engine.stats().to_vec();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stats.iter().map(|x| x.read().waiting).sum::<u64>() != 1 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // One token every 500 ms.
    s.advance(Duration::from_millis(499));
    s.advance(Duration::from_millis(1));
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(header(&r, WAITED_HEADER), Some("500"));
}
