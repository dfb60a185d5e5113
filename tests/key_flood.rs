//! A client sending a new descriptor value on every request cannot grow memory without bound,
//! and cannot make the service forget who is over the limit.

mod common;

use std::sync::atomic::Ordering;

use common::*;

const CONFIG: &str = r#"
domain: f
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

#[tokio::test]
async fn a_key_flood_is_capped_and_over_limit_keys_are_kept() {
    let s = TestServer::start_with(
        CONFIG,
        &[
            ("TURNSTILE_MAX_KEYS", "200"),
            ("TURNSTILE_WORKERS", "1"),
            ("TURNSTILE_SHARDS", "1"),
        ],
    )
    .await;
    assert_eq!(
        s.call(one("f", &[("user", "victim")])).await.overall_code,
        OK
    );
    assert_eq!(
        s.call(one("f", &[("user", "victim")])).await.overall_code,
        OVER
    );
    // Two thousand new keys in the same window: ten times the cap.
    for i in 0..2000 {
        let r = s.call(one("f", &[("user", &format!("flood{i}"))])).await;
        assert_eq!(r.overall_code, OK);
    }
    let stats = &s.running().limiter.engine().stats()[0];
    let keys = stats.keys.load(Ordering::Relaxed);
    assert!(keys <= 200, "keys held: {keys}");
    assert!(
        stats.evictions.load(Ordering::Relaxed) >= 1800,
        "evictions counted"
    );
    // The key that was over its limit is still over: it was never evicted.
    assert_eq!(
        s.call(one("f", &[("user", "victim")])).await.overall_code,
        OVER
    );
}
