//! A client sending a new descriptor value on every request cannot grow memory without bound,
//! and cannot make the service forget who is over the limit.

use crate::common::*;

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
    let stats = &s.running().context.engine.stats()[0];
    let keys = stats.read().keys;
    assert!(keys <= 200, "keys held: {keys}");
    assert!(stats.read().evictions >= 1800, "evictions counted");
    // The key that was over its limit is still over: it was never evicted.
    assert_eq!(
        s.call(one("f", &[("user", "victim")])).await.overall_code,
        OVER
    );
}

#[tokio::test]
async fn keys_are_dropped_once_their_window_has_ended() {
    let s = TestServer::start_with(
        "domain: f\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        &[("TURNSTILE_WORKERS", "1"), ("TURNSTILE_SHARDS", "1")],
    )
    .await;
    for i in 0..300 {
        s.call(one("f", &[("user", &format!("u{i}"))])).await;
    }
    let stats = s.running().context.engine.stats()[0].clone();
    assert_eq!(stats.read().keys, 300);
    // Two seconds later every window has ended; the shard's sweep (once per second of its
    // clock) drops them, so memory follows the active keys.
    s.advance(std::time::Duration::from_secs(2));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while stats.read().keys != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "keys left: {}",
            stats.read().keys
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(stats.read().evictions, 0, "expired, not evicted");
}
