//! Counts that survive a graceful stop (SIGTERM) and a start on the same state dir.

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::{check, entry, metric, metrics_text, start};
use crate::common::tempdir::TempDir;

const BUDGETS: &str = "domain: budgets
descriptors:
  - key: fixed
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: sliding
    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: token_bucket}
  - key: two
    rate_limits:
      - {name: per_hour, unit: hour, requests_per_unit: 500}
      - {name: per_day, unit: day, requests_per_unit: 1000}
";

/// The scenario for every algorithm: a budget of 1000 a day, 900 reported, SIGTERM,
/// a start on another layout: 100 are left, not 1000. The sync interval is a minute, so what
/// is read back is what the stop wrote after the last answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_keeps_its_count_across_a_graceful_restart() {
    let t = TempDir::new("durable-algorithms");
    let config = t.write("config.yaml", BUDGETS);
    let state = t.path().join("state");
    let s = start(&config, &state, &[("TURNSTILE_STATE_SYNC_INTERVAL", "1m")]);
    for key in ["fixed", "sliding", "bucket"] {
        let (code, left) = check(s.ports.http, "budgets", json!([entry(key, "a", 900)])).await;
        assert_eq!((code.as_str(), left), ("OK", vec![100]), "{key}");
    }
    // One status per descriptor: its limit with the least left (the hour's, 100; the day's
    // has 600).
    let (_, left) = check(s.ports.http, "budgets", json!([entry("two", "a", 400)])).await;
    assert_eq!(left, vec![100]);
    s.stop();

    // One worker and one shard now: every key finds its new shard.
    let s = start(
        &config,
        &state,
        &[("TURNSTILE_WORKERS", "1"), ("TURNSTILE_SHARDS", "1")],
    );
    for key in ["fixed", "sliding", "bucket"] {
        let (code, left) = check(s.ports.http, "budgets", json!([entry(key, "a", 1)])).await;
        assert_eq!(
            (code.as_str(), left),
            ("OK", vec![99]),
            "{key} after the restart"
        );
        let (code, _) = check(s.ports.http, "budgets", json!([entry(key, "a", 100)])).await;
        assert_eq!(code, "OVER_LIMIT", "{key}: 1000 a day, 901 used, 100 more");
    }
    let (code, left) = check(s.ports.http, "budgets", json!([entry("two", "a", 100)])).await;
    assert_eq!(
        (code.as_str(), left),
        ("OK", vec![0]),
        "the hour's 500 used up"
    );
    let (code, _) = check(s.ports.http, "budgets", json!([entry("two", "a", 1)])).await;
    assert_eq!(code, "OVER_LIMIT");
    assert_eq!(metric(&s, "turnstile_state_restored_keys").await, 5.0);
    s.stop();
}

fn resp(port: u16, args: &[&str]) -> Vec<i64> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    let text = String::from_utf8_lossy(&out.stdout);
    (text
        .lines()
        .map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{text}"))))
    .collect()
}

/// `THROTTLE` and `CL.THROTTLE` keys live in the same counters: five taken of ten, a restart,
/// and the sixth leaves four, as ThrottleCrab's and redis-cell's buckets would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_keys_survive_a_graceful_restart() {
    let t = TempDir::new("durable-throttle");
    let config = t.write("config.yaml", BUDGETS);
    let state = t.path().join("state");
    let env = [("TURNSTILE_RESP_ADDR", "127.0.0.1:0")];
    let resp_port = |s: &crate::common::binary::Server| -> u16 {
        let addr = (s.ready.split_whitespace())
            .find_map(|p| p.strip_prefix("resp="))
            .expect("resp address on the ready line");
        addr.rsplit(':').next().unwrap().parse().unwrap()
    };
    let s = start(&config, &state, &env);
    let port = resp_port(&s);
    for _ in 0..5 {
        resp(port, &["THROTTLE", "crab", "10", "10", "3600"]);
        resp(port, &["CL.THROTTLE", "cell", "9", "10", "3600"]);
    }
    // [allowed, limit, remaining, ..] and [limited, limit, remaining, ..].
    assert_eq!(
        resp(port, &["THROTTLE", "crab", "10", "10", "3600"])[..3],
        [1, 10, 4]
    );
    assert_eq!(
        resp(port, &["CL.THROTTLE", "cell", "9", "10", "3600"])[..3],
        [0, 10, 4]
    );
    s.stop();

    let s = start(&config, &state, &env);
    let port = resp_port(&s);
    assert_eq!(
        resp(port, &["THROTTLE", "crab", "10", "10", "3600"])[..3],
        [1, 10, 3]
    );
    assert_eq!(
        resp(port, &["CL.THROTTLE", "cell", "9", "10", "3600"])[..3],
        [0, 10, 3]
    );
    s.stop();
}

/// 40 000 keys, each with its own usage, in one shard: the stop's save (the only one: the sync
/// interval is a minute) and the next start's first snapshot each read the shard's table in
/// two pages (the snapshot then a last pass of what changed meanwhile); all of them read back,
/// in another layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_thousand_keys_in_one_shard_are_read_back() {
    let t = TempDir::new("durable-many");
    let config = t.write("config.yaml", BUDGETS);
    let state = t.path().join("state");
    let used = |i: u64| 1 + i % 50;
    let one_shard = [("TURNSTILE_SHARDS", "1")];
    let stop_saves = [
        ("TURNSTILE_SHARDS", "1"),
        ("TURNSTILE_STATE_SYNC_INTERVAL", "1m"),
    ];
    let s = start(&config, &state, &stop_saves);
    for batch in 0..4000u64 {
        let descriptors: Vec<_> = (batch * 10..batch * 10 + 10)
            .map(|i| entry("fixed", &format!("user-{i}"), used(i)))
            .collect();
        let (code, _) = check(s.ports.http, "budgets", json!(descriptors)).await;
        assert_eq!(code, "OK");
    }
    s.stop();

    // The first sync after a start writes every key as a new snapshot.
    let s = start(&config, &state, &one_shard);
    assert_eq!(metric(&s, "turnstile_state_restored_keys").await, 40_000.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&s, "turnstile_state_snapshots_total").await < 1.0 {
        assert!(Instant::now() < deadline, "no snapshot written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop();

    let s = start(&config, &state, &[("TURNSTILE_SHARDS", "7")]);
    assert_eq!(metric(&s, "turnstile_state_restored_keys").await, 40_000.0);
    for i in (0..40_000u64).step_by(37) {
        let (_, left) = check(
            s.ports.http,
            "budgets",
            json!([entry("fixed", &format!("user-{i}"), 1)]),
        )
        .await;
        assert_eq!(left, vec![1000 - used(i) - 1], "user-{i}");
    }
    s.stop();
}

/// A window that ended while the process was down starts empty; the day's window on the same
/// descriptor keeps its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_ended_while_down_stays_ended() {
    let t = TempDir::new("durable-ended");
    let config = t.write(
        "config.yaml",
        "domain: w
descriptors:
  - key: k
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 5}
      - {name: per_day, unit: day, requests_per_unit: 8}
",
    );
    let state = t.path().join("state");
    let s = start(&config, &state, &[]);
    // Start early in a second, so the five calls share it.
    wait_until_past_second_start(Duration::from_millis(50));
    let (code, left) = check(s.ports.http, "w", json!([entry("k", "a", 5)])).await;
    // One status per descriptor, the limit with the least left: the second's 0 (the day's 3).
    assert_eq!((code.as_str(), left), ("OK", vec![0]));
    s.stop();
    let s = start(&config, &state, &[]);
    wait_until_past_second_start(Duration::from_millis(50));
    let (code, left) = check(s.ports.http, "w", json!([entry("k", "a", 1)])).await;
    // The second is new (4 left), the day's count is kept (2 left).
    assert_eq!((code.as_str(), left), ("OK", vec![2]));
    s.stop();
}

/// Waits for the next whole second, plus `past`.
fn wait_until_past_second_start(past: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
    std::thread::sleep(Duration::from_secs(1) - into + past);
}

/// A limit raised across the restart keeps the key's usage (keys are named as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_limit_keeps_the_usage() {
    let t = TempDir::new("durable-raised");
    let config = t.write("config.yaml", BUDGETS);
    let state = t.path().join("state");
    let s = start(&config, &state, &[]);
    check(s.ports.http, "budgets", json!([entry("fixed", "a", 900)])).await;
    s.stop();
    t.write("config.yaml", &BUDGETS.replacen("1000}", "2000}", 1));
    let s = start(&config, &state, &[]);
    let (_, left) = check(s.ports.http, "budgets", json!([entry("fixed", "a", 1)])).await;
    assert_eq!(left, vec![2000 - 900 - 1]);
    s.stop();
}

/// A key flood past `TURNSTILE_MAX_KEYS`: the keys it evicted are written as dropped, so the
/// start reads back exactly the keys memory held at the stop (no more than it may hold), and
/// the key refused in its window (never evicted) is among them with its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_leaves_no_more_keys_on_disk_than_memory_holds() {
    let t = TempDir::new("durable-flood");
    let config = t.write("config.yaml", BUDGETS);
    let state = t.path().join("state");
    let env = [
        ("TURNSTILE_MAX_KEYS", "400"),
        ("TURNSTILE_SHARDS", "4"),
        ("TURNSTILE_STATE_SYNC_INTERVAL", "100ms"),
    ];
    let s = start(&config, &state, &env);
    let (code, _) = check(
        s.ports.http,
        "budgets",
        json!([entry("fixed", "over", 1000)]),
    )
    .await;
    assert_eq!(code, "OK");
    let (code, _) = check(s.ports.http, "budgets", json!([entry("fixed", "over", 1)])).await;
    assert_eq!(code, "OVER_LIMIT");
    for batch in 0..500u64 {
        let descriptors: Vec<_> = (batch * 10..batch * 10 + 10)
            .map(|i| entry("fixed", &format!("flood-{i}"), 1))
            .collect();
        check(s.ports.http, "budgets", json!(descriptors)).await;
        if batch % 50 == 0 {
            // Evictions spread over several syncs, as a flood arrives.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    // The shards' key gauges are exact after their once-a-second sweep.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let held = shard_keys(&s).await;
    s.stop();
    let s = start(&config, &state, &env);
    let restored = metric(&s, "turnstile_state_restored_keys").await;
    assert!(held <= 400.0, "memory held {held}");
    assert_eq!(restored, held, "read back what memory held at the stop");
    let (code, _) = check(s.ports.http, "budgets", json!([entry("fixed", "over", 1)])).await;
    assert_eq!(code, "OVER_LIMIT", "the refused key is kept");
    s.stop();
}

/// Keys the shards hold, from their gauges.
async fn shard_keys(s: &crate::common::binary::Server) -> f64 {
    (metrics_text(s).await.lines())
        .filter(|l| l.starts_with("ratelimit_service_shard_keys{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Reservations (`reserve`) live in memory only: the usage reported survives a graceful restart,
/// the holds of checks not yet reported do not (their requests' reports, if they come, count
/// in full and release nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_usage_survives_a_restart_and_holds_do_not() {
    let t = TempDir::new("durable-holds");
    let config = t.write(
        "config.yaml",
        "domain: budgets
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000, reserve: 300}
",
    );
    let state = t.path().join("state");
    let s = start(&config, &state, &[("TURNSTILE_STATE_SYNC_INTERVAL", "1m")]);
    let one = |hits| json!([entry("user", "a", hits)]);
    assert_eq!(check(s.ports.http, "budgets", one(0)).await.1, vec![700]);
    let (_, left) = check(s.ports.http, "budgets", one(250)).await;
    assert_eq!(left, vec![750], "250 used, the hold released");
    // Two more checks hold 600: a third is refused.
    check(s.ports.http, "budgets", one(0)).await;
    check(s.ports.http, "budgets", one(0)).await;
    let (code, _) = check(s.ports.http, "budgets", one(0)).await;
    assert_eq!(code, "OVER_LIMIT");
    s.stop();

    let s = start(&config, &state, &[]);
    let (code, left) = check(s.ports.http, "budgets", one(0)).await;
    assert_eq!(
        (code.as_str(), left),
        ("OK", vec![450]),
        "250 used survives; the 600 held did not"
    );
}
