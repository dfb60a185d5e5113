//! Through a real Envoy 1.40 with `enable_retry_after_header: true`: a 429's `Retry-After` is
//! when the refused request would be admitted (the refused status's `duration_until_reset`):
//! a token bucket's next token, a window's end, for N-unit and calendar windows too.

use crate::common::envoy::*;
use serde_json::json;

fn opts() -> EnvoyOpts {
    let mut o = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    o.retry_after_header = true;
    o
}

#[tokio::test]
async fn a_refused_token_bucket_is_sent_back_for_its_next_token() {
    // 1000 an hour, bursts of 5: a token every 3.6 s; the bucket is full again 18 s after
    // it was emptied.
    let stack = Stack::start(
        "retry_after_bucket",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: token_bucket, burst: 5}\n",
        )],
        &[],
        &opts(),
    )
    .await;
    let c = client();
    let url = format!("{}/", stack.envoy.base);
    for i in 0..5 {
        let r = get(&c, &url, &[("x-api-key", "k")]).await;
        assert_status(&r, 200, &format!("request {i} within the burst"));
    }
    let r = get(&c, &url, &[("x-api-key", "k")]).await;
    assert_status(&r, 429, "request 6 past the burst of 5");
    let retry = r.num("retry-after");
    assert!(
        (1..=4).contains(&retry),
        "Retry-After {retry}: the next token is at most 3.6 s away"
    );
    assert!(r.num("x-ratelimit-reset") <= 4, "{r:#?}");
}

#[tokio::test]
async fn a_refused_window_is_sent_back_at_its_end() {
    let stack = Stack::start(
        "retry_after_windows",
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:
  - key: api_key
    value: hourly
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: api_key
    value: five
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1}
  - key: api_key
    value: kolkata_day
    rate_limit: {unit: day, calendar: Asia/Kolkata, requests_per_unit: 1}
",
        )],
        &[],
        &opts(),
    )
    .await;
    let c = client();
    let url = format!("{}/", stack.envoy.base);
    clear_of_window_edge(300, 10).await;
    // India is 5:30 ahead of UTC all year: its day ends 19_800 s before a UTC one.
    let kolkata_day_end = || 86_400 - (unix_now() + 19_800) % 86_400;
    let cases: [(&str, &dyn Fn() -> u64); 3] = [
        ("hourly", &|| secs_to_window_end(3600)),
        ("five", &|| secs_to_window_end(300)),
        ("kolkata_day", &kolkata_day_end),
    ];
    for (key, end) in cases {
        assert_status(&get(&c, &url, &[("x-api-key", key)]).await, 200, key);
        let r = get(&c, &url, &[("x-api-key", key)]).await;
        assert_status(&r, 429, &format!("{key}: the second request"));
        let (retry, want) = (r.num("retry-after"), end());
        assert!(
            retry.abs_diff(want) <= 2,
            "{key}: Retry-After {retry}, the window ends in {want}"
        );
    }
    // Envoy's X-RateLimit-Limit names the window from the unit alone: w=60 for 5 minutes.
    let r = get(&c, &url, &[("x-api-key", "five")]).await;
    let limit = r.header("x-ratelimit-limit").unwrap_or_default();
    assert!(limit.contains("1;w=60"), "X-RateLimit-Limit {limit:?}");
}
