//! The direct transports: ThrottleCrab's `THROTTLE` and redis-cell's `CL.THROTTLE` over RESP
//! (redis-cli, the `redis` crate, raw sockets, redis-py, ioredis, node-redis) and `POST /throttle`,
//! against the real server with its manual clock.
//!
//! What ThrottleCrab and redis-cell answer is taken from their own code and tests, cited where it
//! is used: lazureykis/throttlecrab 0.4.40 (commit 5d4a947) and brandur/redis-cell 0.5.0 (commit
//! 4d42338).

use std::io;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use bytes::BytesMut;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use turnstile::service::ThrottleLimits;
use turnstile::transport::throttle::{self, RespSettings};

const GRPC_CONFIG: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket, burst: 2}
"#;

/// The real server, plus the RESP transport on a loopback port of its own, sharing its engine.
struct Resp {
    s: TestServer,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl Resp {
    async fn start(settings: RespSettings) -> Resp {
        Self::start_with(GRPC_CONFIG, settings).await
    }

    async fn start_with(yaml: &str, settings: RespSettings) -> Resp {
        let s = TestServer::start(yaml).await;
        // Bound as the server binds it: `RespSettings::bind`, then onto the serving runtime.
        let settings = RespSettings {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..settings
        };
        let listener = TcpListener::from_std(settings.bind().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(throttle::serve(
            listener,
            turnstile::service::ThrottleService::new(
                s.running().context.engine.clone(),
                s.running().door_stats.throttle.clone(),
            ),
            settings,
            s.running().door_stats.resp.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Resp {
            s,
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn redis(&self) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(format!("redis://{}/", self.addr))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("the redis crate connects")
    }

    async fn raw(&self) -> Raw {
        Raw {
            stream: TcpStream::connect(self.addr).await.unwrap(),
            buf: BytesMut::new(),
        }
    }

    fn port(&self) -> String {
        self.addr.port().to_string()
    }
}

/// A bare socket: to send exact bytes and see exact replies.
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
}

impl Raw {
    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next reply, or `None` when the server closed the connection.
    async fn reply(&mut self) -> Option<OwnedFrame> {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some((frame, n)) = decode(&self.buf).expect("valid RESP from the server") {
                    let _ = self.buf.split_to(n);
                    return Some(frame);
                }
                match self.stream.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("a reply or a close within 5 s")
    }
}

fn ints(f: &OwnedFrame) -> Vec<i64> {
    match f {
        OwnedFrame::Array(items) => items
            .iter()
            .map(|i| match i {
                OwnedFrame::Integer(n) => *n,
                other => panic!("not an integer: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

fn err_text(f: &OwnedFrame) -> &str {
    match f {
        OwnedFrame::Error(e) => e,
        other => panic!("not an error: {other:?}"),
    }
}

fn throttle_cmd(key: &str, burst: i64, count: i64, period: i64, q: i64) -> ::redis::Cmd {
    let mut c = ::redis::cmd("THROTTLE");
    c.arg(key).arg(burst).arg(count).arg(period).arg(q);
    c
}

fn cell_cmd(key: &str, burst: i64, count: i64, period: i64, q: i64) -> ::redis::Cmd {
    let mut c = ::redis::cmd("CL.THROTTLE");
    c.arg(key).arg(burst).arg(count).arg(period).arg(q);
    c
}

type Con = ::redis::aio::MultiplexedConnection;

async fn ask(con: &mut Con, cmd: ::redis::Cmd) -> Vec<i64> {
    cmd.query_async(con).await.unwrap()
}

const NS: i64 = 1_000_000_000;

/// ThrottleCrab's GCRA, transcribed from `throttlecrab/src/core/rate_limiter.rs:150-248` (0.4.40):
/// a stored TAT is kept until the key expires at TAT + τ (`:160`, `:179-183`; its store keeps a
/// key while the expiry is after now), a fresh key starts at `now - T` (`:165`). Replies are ThrottleCrab's
/// `[allowed, limit, remaining, reset_after, retry_after]`, floored to whole seconds
/// (`throttlecrab-server/src/types.rs:93-94`).
struct Model {
    tat: Option<i64>,
    burst: i64,
    interval: i64,
}

impl Model {
    fn new(burst: i64, count: i64, period_s: i64) -> Model {
        Model {
            tat: None,
            burst,
            // Rate::from_count_and_period (rate/mod.rs:172), exact in integers at these sizes.
            interval: period_s * NS / count,
        }
    }

    fn call(&mut self, now: i64, quantity: i64) -> Vec<i64> {
        let t = self.interval;
        let tau = t * (self.burst - 1); // :122
        let tat = match self.tat {
            Some(stored) if stored + tau > now => stored.max(now - tau), // :160
            _ => now - t,                                                // :165
        };
        let new_tat = tat + t * quantity; // :170-171
        let allow_at = new_tat - tau; // :174
        let allowed = now >= allow_at; // :175
        if allowed {
            self.tat = Some(new_tat);
        }
        let current = if allowed { new_tat } else { tat }; // :208
        let remaining = ((now + tau - current) / t).max(0); // :217-225
        let reset = (current - now + tau).max(0); // :227-232
        let retry = if allowed { 0 } else { (allow_at - now).max(0) }; // :234-238
        vec![
            allowed.into(),
            self.burst,
            remaining,
            reset / NS,
            retry / NS,
        ]
    }
}

#[tokio::test]
async fn throttle_answers_in_throttlecrabs_order_with_its_values() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    // README's example, THROTTLE user:123 3 10 60, by rate_limiter.rs: T = 6 s, τ = T·(3-1) =
    // 12 s (:122); a fresh key's TAT is now - 6 s (:165), the call's now (:171): remaining
    // (now + 12 - now) / 6 = 2 (:217-225), reset_after now - now + 12 = 12 s (:227-232).
    let v = ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 1)).await;
    assert_eq!(
        v,
        [1, 3, 2, 12, 0],
        "[allowed, limit, remaining, reset_after, retry_after]"
    );
    // TAT now + 6, then now + 12 (allow_at now ≤ now); the next would be allowed at now + 6.
    assert_eq!(
        ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 1)).await,
        [1, 3, 1, 18, 0]
    );
    assert_eq!(
        ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 1)).await,
        [1, 3, 0, 24, 0]
    );
    assert_eq!(
        ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 1)).await,
        [0, 3, 0, 24, 6]
    );
    // 6 s later one token is back (TAT now + 12 → now + 18).
    r.s.advance(Duration::from_secs(6));
    assert_eq!(
        ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 1)).await,
        [1, 3, 0, 24, 0]
    );
    // 12 s later TAT = now: 3 refused (allow_at = now + 18 - 12), remaining 2, reset 12 s.
    r.s.advance(Duration::from_secs(12));
    assert_eq!(
        ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 3)).await,
        [0, 3, 2, 12, 6]
    );
    // Quantity 0 asks without taking (redis_test.rs test_redis_zero_quantity).
    assert_eq!(
        ask(&mut con, throttle_cmd("user:123", 3, 10, 60, 0)).await,
        [1, 3, 2, 12, 0]
    );
    // Without a quantity, one is taken (redis/mod.rs:254-261).
    let v: Vec<i64> = ::redis::cmd("THROTTLE")
        .arg("user:123")
        .arg(3)
        .arg(10)
        .arg(60)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, [1, 3, 1, 18, 0]);
    // More than max_burst is a refusal, not an error (core/tests.rs
    // test_quantity_edge_cases, redis_test.rs test_redis_large_quantity): a fresh key's
    // allow_at is now - 6 + 6·4 - 12 = now + 6 s.
    assert_eq!(
        ask(&mut con, throttle_cmd("big", 3, 10, 60, 4)).await,
        [0, 3, 3, 6, 6]
    );
    // A key left idle keeps its TAT until it expires (:160, :179-183), so this one, idle 2.5 s
    // since one token was taken, takes 5 of max_burst 4: TAT now - 2.5 s, allow_at = now - 2.5
    // + 5 - 3 ≤ now. ThrottleCrab's server, a real 2.5 s apart:
    //   $ redis-cli -p 16479 THROTTLE idle 4 60 60 1; sleep 2.5
    //   $ redis-cli -p 16479 THROTTLE idle 4 60 60 5; redis-cli -p 16479 THROTTLE idle 4 60 60 4
    //   1 4 3 3 0 / 1 4 0 5 0 / 0 4 0 5 3
    assert_eq!(
        ask(&mut con, throttle_cmd("idle", 4, 60, 60, 1)).await,
        [1, 4, 3, 3, 0]
    );
    r.s.advance(Duration::from_millis(2500));
    assert_eq!(
        ask(&mut con, throttle_cmd("idle", 4, 60, 60, 5)).await,
        [1, 4, 0, 5, 0]
    );
    assert_eq!(
        ask(&mut con, throttle_cmd("idle", 4, 60, 60, 4)).await,
        [0, 4, 0, 5, 3]
    );
}

/// lazureykis/throttlecrab `throttlecrab-server/src/transport/redis_test.rs`, each case's
/// expected values as that test states them, here over the wire.
#[tokio::test]
async fn throttlecrab_server_redis_tests_pass_against_turnstile() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    // test_redis_throttle_allowed, test_redis_throttle_with_quantity: whole replies.
    assert_eq!(
        ask(&mut con, throttle_cmd("test_key", 10, 100, 60, 1)).await,
        [1, 10, 9, 5, 0]
    );
    assert_eq!(
        ask(&mut con, throttle_cmd("test_key2", 10, 100, 60, 5)).await,
        [1, 10, 5, 7, 0]
    );
    // test_redis_throttle_exhaustion.
    for remaining in [2, 1, 0] {
        let v = ask(&mut con, throttle_cmd("exhaustion_test", 3, 100, 60, 1)).await;
        assert_eq!(v[..3], [1, 3, remaining]);
    }
    let v = ask(&mut con, throttle_cmd("exhaustion_test", 3, 100, 60, 1)).await;
    assert_eq!((v[0], v[2]), (0, 0));
    assert!(v[4] >= 0, "retry_after");
    // test_redis_multiple_keys.
    for remaining in [4, 3] {
        for key in ["user:123", "user:456", "api:endpoint"] {
            let v = ask(&mut con, throttle_cmd(key, 5, 100, 60, 1)).await;
            assert_eq!(v[..3], [1, 5, remaining], "{key}");
        }
    }
    // test_redis_different_limits_same_key.
    let v = ask(&mut con, throttle_cmd("dynamic_limit_key", 10, 100, 60, 1)).await;
    assert_eq!(v[..3], [1, 10, 9]);
    let v = ask(&mut con, throttle_cmd("dynamic_limit_key", 5, 100, 60, 1)).await;
    assert_eq!(v[..2], [1, 5]);
    assert!((0..=5).contains(&v[2]), "{v:?}");
    // test_redis_large_quantity, test_redis_zero_quantity.
    let v = ask(
        &mut con,
        throttle_cmd("large_quantity_key", 10, 100, 60, 15),
    )
    .await;
    assert_eq!(v[..3], [0, 10, 10]);
    let v = ask(&mut con, throttle_cmd("zero_quantity_key", 10, 100, 60, 0)).await;
    assert_eq!((v[0], v[2]), (1, 10));
    // test_redis_boundary_values, its small case (its i64::MAX case is over turnstile's caps).
    assert_eq!(
        ask(&mut con, throttle_cmd("tiny_key", 1, 1, 1, 1)).await[..3],
        [1, 1, 0]
    );
}

/// A step of a ported test: advance the clock by this many ms, then THROTTLE key max_burst
/// count_per_period period quantity, and expect allowed and (when given) remaining.
type Step<'a> = (u64, &'a str, i64, i64, i64, i64, bool, Option<i64>);

async fn run_steps(r: &Resp, con: &mut Con, test: &str, steps: &[Step<'_>]) {
    for (i, &(ms, key, burst, count, period, q, allowed, remaining)) in steps.iter().enumerate() {
        r.s.advance(Duration::from_millis(ms));
        let v = ask(con, throttle_cmd(key, burst, count, period, q)).await;
        assert_eq!(v[0] == 1, allowed, "{test} step {i}: {v:?}");
        assert_eq!(v[1], burst, "{test} step {i}: limit");
        if let Some(rem) = remaining {
            assert_eq!(v[2], rem, "{test} step {i}: remaining {v:?}");
        }
        if !allowed {
            assert!(v[4] >= 0, "{test} step {i}: retry_after {v:?}");
        }
    }
}

/// lazureykis/throttlecrab `throttlecrab/src/core/tests.rs`: the library's own rate_limiter
/// tests, each as a sequence of calls against the server. Their times are offsets from one
/// start; the server's clock only moves forward, so a sequence that starts a fresh key "at the
/// start" again starts it now (a fresh key is the same whenever it starts).
#[tokio::test]
async fn throttlecrab_rate_limiter_tests_pass_against_turnstile() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    let c = &mut con;
    run_steps(
        &r,
        c,
        "test_basic_rate_limiting",
        &[(0, "test", 5, 10, 60, 1, true, Some(4))],
    )
    .await;
    let burst: Vec<Step<'_>> = (0..5)
        .map(|i| (0, "burst_test", 5, 10, 60, 1, true, Some(4 - i)))
        .chain([(0, "burst_test", 5, 10, 60, 1, false, Some(0))])
        .collect();
    run_steps(&r, c, "test_burst_capacity", &burst).await;
    // Its retry_after.as_secs() > 0: T = 6 s.
    assert!(ask(c, throttle_cmd("burst_test", 5, 10, 60, 1)).await[4] > 0);
    let k = "replenish_test";
    run_steps(
        &r,
        c,
        "test_rate_replenishment",
        &[
            (0, k, 2, 60, 60, 1, true, None),
            (0, k, 2, 60, 60, 1, true, None),
            (0, k, 2, 60, 60, 1, false, None),
            (1000, k, 2, 60, 60, 1, true, None),
        ],
    )
    .await;
    run_steps(
        &r,
        c,
        "test_different_keys",
        &[
            (0, "key1", 2, 2, 60, 1, true, None),
            (0, "key2", 2, 2, 60, 1, true, None),
            (0, "key1", 2, 2, 60, 1, true, None),
            (0, "key1", 2, 2, 60, 1, false, None),
            (0, "key2", 2, 2, 60, 1, true, None),
            (0, "key2", 2, 2, 60, 1, false, None),
        ],
    )
    .await;
    let k = "quantity_test";
    run_steps(
        &r,
        c,
        "test_quantity_parameter",
        &[
            (0, k, 10, 10, 60, 5, true, Some(5)),
            (0, k, 10, 10, 60, 6, false, Some(5)),
            (0, k, 10, 10, 60, 5, true, Some(0)),
        ],
    )
    .await;
    // test_negative_quantity_error, test_invalid_parameters: errors.
    for cmd in [
        throttle_cmd("negative_test", 10, 10, 60, -1),
        throttle_cmd("test", 0, 10, 60, 1),
        throttle_cmd("test", 10, 0, 60, 1),
        throttle_cmd("test", 10, 10, 0, 1),
    ] {
        assert!(cmd.query_async::<::redis::Value>(c).await.is_err());
    }
    // test_large_quantity_overflow_protection: answered, and refused.
    let v = ask(c, throttle_cmd("overflow_test", 10, 10, 60, i64::MAX / 2)).await;
    assert_eq!(v[0], 0);
    let mut steps: Vec<Step<'_>> = (0..5)
        .map(|i| (0, "remaining_test", 5, 10, 60, 1, true, Some(4 - i)))
        .collect();
    steps.extend([
        (0, "remaining_test", 5, 10, 60, 1, false, Some(0)),
        (6000, "remaining_test", 5, 10, 60, 1, true, Some(0)),
        (0, "remaining_test", 5, 10, 60, 1, false, Some(0)),
        (0, "quantity_remaining", 5, 10, 60, 3, true, Some(2)),
        (0, "quantity_remaining", 5, 10, 60, 3, false, Some(2)),
        (0, "quantity_remaining", 5, 10, 60, 2, true, Some(0)),
        (0, "high_rate", 10, 600, 60, 1, true, Some(9)),
    ]);
    steps.extend((0..9).map(|_| (0, "high_rate", 10, 600, 60, 1, true, None)));
    steps.push((1000, "high_rate", 10, 600, 60, 1, true, None));
    run_steps(&r, c, "test_remaining_count_accuracy", &steps).await;
    let mut steps: Vec<Step<'_>> = (0..3)
        .map(|i| (0, "test_key", 3, 6, 60, 1, true, Some(2 - i)))
        .collect();
    steps.extend([
        (0, "test_key", 3, 6, 60, 1, false, Some(0)),
        (10_000, "test_key", 3, 6, 60, 1, true, Some(0)),
    ]);
    run_steps(&r, c, "test_remaining_count_all_stores", &steps).await;
    // Its "Maximum values" case asks for max_burst i64::MAX / 1000, over turnstile's cap: the cap
    // itself instead, where a fresh key leaves max_burst - 1 (rate_limiter.rs:217-225).
    run_steps(
        &r,
        c,
        "test_edge_cases_zero_remaining",
        &[
            (0, "exact_timing", 2, 120, 60, 1, true, Some(1)),
            (0, "exact_timing", 2, 120, 60, 1, true, Some(0)),
            (0, "fractional", 3, 7, 60, 1, true, Some(2)),
            (0, "fractional", 3, 7, 60, 1, true, None),
            (0, "fractional", 3, 7, 60, 1, true, None),
            (500, "exact_timing", 2, 120, 60, 1, true, Some(0)),
            (7500, "fractional", 3, 7, 60, 1, false, None),
            (1000, "fractional", 3, 7, 60, 1, true, Some(0)),
            (0, "max_burst", 1_000_000, 100, 60, 1, true, Some(999_999)),
        ],
    )
    .await;
    let k = "multi_quantity";
    run_steps(
        &r,
        c,
        "test_quantity_variations_and_replenishment",
        &[
            (0, k, 10, 60, 60, 5, true, Some(5)),
            (0, k, 10, 60, 60, 6, false, Some(5)),
            (0, k, 10, 60, 60, 5, true, Some(0)),
            (3000, k, 10, 60, 60, 2, true, Some(1)),
        ],
    )
    .await;
    // Its tables: a fresh key, its burst used up, then one call `ms` later.
    for (test, burst, count, table) in [
        (
            "test_quantity_variations_and_replenishment gradual_replenish",
            5,
            120,
            [(500, 0), (1000, 1), (1500, 2), (2000, 3), (2500, 4)],
        ),
        (
            "test_complex_replenishment_scenarios fractional_accumulation",
            5,
            100,
            [(600, 0), (1200, 1), (1800, 2), (2400, 3), (3000, 4)],
        ),
    ] {
        for (ms, remaining) in table {
            let key = format!("{test}_{ms}");
            let mut steps: Vec<Step<'_>> = (0..5)
                .map(|_| (0, key.as_str(), burst, count, 60, 1, true, None))
                .collect();
            steps.push((ms, &key, burst, count, 60, 1, true, Some(remaining)));
            run_steps(&r, c, test, &steps).await;
        }
    }
    run_steps(
        &r,
        c,
        "test_complex_replenishment_scenarios",
        &[
            (0, "partial_burst", 8, 240, 60, 6, true, Some(2)),
            (0, "slow_replenish", 3, 6, 60, 1, true, None),
            (0, "slow_replenish", 3, 6, 60, 1, true, None),
            (0, "slow_replenish", 3, 6, 60, 1, true, None),
            (500, "partial_burst", 8, 240, 60, 1, true, Some(3)),
            (1000, "partial_burst", 8, 240, 60, 1, true, Some(6)),
            (3500, "slow_replenish", 3, 6, 60, 1, false, None),
            (5000, "slow_replenish", 3, 6, 60, 1, true, Some(0)),
            (10_000, "slow_replenish", 3, 6, 60, 1, true, Some(0)),
        ],
    )
    .await;
    run_steps(
        &r,
        c,
        "test_quantity_edge_cases",
        &[
            (0, "zero_quantity", 10, 100, 60, 0, true, Some(10)),
            (0, "large_quantity", 5, 100, 60, 10, false, Some(5)),
            (0, "exact_burst", 10, 100, 60, 10, true, Some(0)),
            (
                0,
                "large_quantity_replenish",
                20,
                600,
                60,
                15,
                true,
                Some(5),
            ),
            (
                1000,
                "large_quantity_replenish",
                20,
                600,
                60,
                12,
                true,
                Some(3),
            ),
            (
                0,
                "large_quantity_replenish",
                20,
                600,
                60,
                5,
                false,
                Some(3),
            ),
        ],
    )
    .await;
}

/// ThrottleCrab keeps its own stored TAT, whatever parameters a later call brings, and a call of
/// quantity 0 stores it too (`rate_limiter.rs:150-248`: allowed, so `set_if_not_exists_with_ttl`
/// at now - T). Its server, run as `throttlecrab-server --redis --redis-port 16479`, a
/// millisecond or so between calls (mimicked here by the manual clock):
///
/// ```text
/// $ for a in "3 10 60" "3 10 60" "10 10 60" "3 100 60"; do redis-cli -p 16479 THROTTLE p $a; done
/// 1 3 2 12 0
/// 1 3 1 17 0
/// 1 10 7 65 0
/// 0 3 0 13 11
/// $ redis-cli -p 16479 THROTTLE q 5 10 60 0; redis-cli -p 16479 THROTTLE q 5 10 60 1
/// 1 5 5 18 0
/// 1 5 4 23 0
/// ```
#[tokio::test]
async fn throttle_keeps_throttlecrabs_stored_tat() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    let mut answers = Vec::new();
    for (burst, count) in [(3, 10), (3, 10), (10, 10), (3, 100)] {
        answers.push(ask(&mut con, throttle_cmd("p", burst, count, 60, 1)).await);
        r.s.advance(Duration::from_millis(1));
    }
    assert_eq!(
        answers,
        [
            [1, 3, 2, 12, 0],
            [1, 3, 1, 17, 0],
            [1, 10, 7, 65, 0],
            [0, 3, 0, 13, 11]
        ]
    );
}

/// A call of quantity 0 on a fresh key stores ThrottleCrab's TAT, now - T (`rate_limiter.rs`:
/// allowed, so `set_if_not_exists_with_ttl`), which the next call starts from; its server's
/// answers are in [`throttle_keeps_throttlecrabs_stored_tat`]'s comment.
#[tokio::test]
async fn throttle_of_quantity_0_stores_throttlecrabs_tat() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    assert_eq!(
        ask(&mut con, throttle_cmd("q", 5, 10, 60, 0)).await,
        [1, 5, 5, 18, 0]
    );
    r.s.advance(Duration::from_millis(1));
    assert_eq!(
        ask(&mut con, throttle_cmd("q", 5, 10, 60, 1)).await,
        [1, 5, 4, 23, 0]
    );
}

/// ThrottleCrab's server takes RESP integers for the numbers (`transport/redis/mod.rs`,
/// `parse_integer`: a bulk string or an integer). Its server, over a raw socket:
///
/// ```text
/// > *5\r\n$8\r\nTHROTTLE\r\n$1\r\ni\r\n:3\r\n:10\r\n:60\r\n
/// < *5\r\n:1\r\n:3\r\n:2\r\n:12\r\n:0\r\n
/// > *6\r\n$8\r\nTHROTTLE\r\n$1\r\nj\r\n:3\r\n:10\r\n:60\r\n:2\r\n
/// < *5\r\n:1\r\n:3\r\n:1\r\n:18\r\n:0\r\n
/// ```
#[tokio::test]
async fn throttle_takes_integer_arguments() {
    let r = Resp::start(RespSettings::default()).await;
    let mut raw = r.raw().await;
    raw.send(b"*5\r\n$8\r\nTHROTTLE\r\n$1\r\ni\r\n:3\r\n:10\r\n:60\r\n")
        .await;
    assert_eq!(ints(&raw.reply().await.unwrap()), [1, 3, 2, 12, 0]);
    raw.send(b"*6\r\n$8\r\nTHROTTLE\r\n$1\r\nj\r\n:3\r\n:10\r\n:60\r\n:2\r\n")
        .await;
    assert_eq!(ints(&raw.reply().await.unwrap()), [1, 3, 1, 18, 0]);
}

#[tokio::test]
async fn a_long_sequence_matches_the_reference_model() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    // Several shapes: a bucket of 5 and its idle overfill (a stored TAT kept until it expires,
    // so an idle key takes more than 5 at once, as ThrottleCrab's does), a bucket of one, a fast
    // one.
    let mut keys = [
        ("model", 5, 7, 20, Model::new(5, 7, 20)),
        ("one", 1, 3, 2, Model::new(1, 3, 2)),
        ("fast", 4, 10, 1, Model::new(4, 10, 1)),
    ];
    let mut now = T0 as i64;
    let mut seed = 0x2545_f491_u64;
    let mut next = |m: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % m
    };
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..400 {
        let advance_ms = if next(3) == 0 { next(6000) } else { 0 };
        let (key, burst, count, period, model) = &mut keys[next(3) as usize];
        let quantity = next(5) as i64;
        r.s.advance(Duration::from_millis(advance_ms));
        now += advance_ms as i64 * 1_000_000;
        let v = ask(
            &mut con,
            throttle_cmd(key, *burst, *count, *period, quantity),
        )
        .await;
        assert_eq!(
            v,
            model.call(now, quantity),
            "step {step} ({key}, quantity {quantity})"
        );
        if v[0] == 1 {
            allowed += 1
        } else {
            denied += 1
        }
    }
    assert!(
        allowed > 50 && denied > 50,
        "{allowed} allowed, {denied} denied"
    );
}

/// brandur/redis-cell's own cases, over the wire. `src/cell/mod.rs` `it_rate_limits` (limit 5 =
/// max_burst 4, 1 per second) gives durations; `src/lib.rs:66-76` turns them into the reply's
/// whole seconds, one more when a millisecond or more is left over (3900 ms → 4).
#[tokio::test]
async fn cl_throttle_answers_as_redis_cell() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    // README "Response": [limited, max_burst + 1, remaining, retry_after, reset_after].
    assert_eq!(
        ask(&mut con, cell_cmd("user123", 15, 30, 60, 1)).await,
        [0, 16, 15, -1, 2]
    );
    // it_rate_limits: (ms since start, volume, [limited, limit, remaining, retry, reset]).
    let cases: [(u64, i64, [i64; 5]); 15] = [
        (0, 6, [1, 5, 5, -1, 0]), // case 0: never more than the maximum
        (0, 1, [0, 5, 4, -1, 1]),
        (0, 1, [0, 5, 3, -1, 2]),
        (0, 1, [0, 5, 2, -1, 3]),
        (0, 1, [0, 5, 1, -1, 4]),
        (0, 1, [0, 5, 0, -1, 5]),
        (0, 1, [1, 5, 0, 1, 5]), // case 6
        (3000, 1, [0, 5, 2, -1, 3]),
        (3100, 1, [0, 5, 1, -1, 4]), // case 8: reset_after 3900 ms
        (4000, 1, [0, 5, 1, -1, 4]),
        (8000, 1, [0, 5, 4, -1, 1]),
        (9500, 1, [0, 5, 4, -1, 1]),
        (9500, 0, [0, 5, 4, -1, 1]), // case 12: volume 0 peeks
        (9500, 2, [0, 5, 2, -1, 3]),
        (9500, 5, [1, 5, 2, 3, 3]), // case 14
    ];
    let mut at = 0;
    for (i, (ms, volume, expected)) in cases.into_iter().enumerate() {
        r.s.advance(Duration::from_millis(ms - at));
        at = ms;
        let v = ask(&mut con, cell_cmd("foo", 4, 1, 1, volume)).await;
        assert_eq!(v, expected, "it_rate_limits case {i}");
    }
    // tests/e2e.rs it_works: CL.THROTTLE user123 0 1 2 1, twice, then again after retry_after.
    let e2e = || cell_cmd("e2e", 0, 1, 2, 1);
    assert_eq!(ask(&mut con, e2e()).await, [0, 1, 0, -1, 2]);
    let v = ask(&mut con, e2e()).await;
    assert_eq!(v, [1, 1, 0, 2, 2]);
    r.s.advance(Duration::from_secs(v[3] as u64));
    assert_eq!(ask(&mut con, e2e()).await, [0, 1, 0, -1, 2]);
    // Its arguments, each named when wrong (redis-cell: max_burst from 0, quantity from 0).
    for (cmd, expected) in [
        (cell_cmd("k", -1, 1, 1, 1), "max_burst must be from 0"),
        (cell_cmd("k", 1, 0, 1, 1), "count_per_period must be from 1"),
        (cell_cmd("k", 1, 1, 0, 1), "period must be from 1"),
        (cell_cmd("k", 1, 1, 1, -1), "quantity must be 0 or more"),
        (
            ::redis::cmd("CL.THROTTLE").arg("k").arg(1).clone(),
            "wrong number of arguments for 'cl.throttle' command",
        ),
    ] {
        let e = cmd
            .query_async::<::redis::Value>(&mut con)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(expected), "{e} (wanted {expected})");
    }
    // THROTTLE and CL.THROTTLE keys of one name are separate buckets.
    assert_eq!(ask(&mut con, throttle_cmd("e2e", 1, 1, 2, 1)).await[0], 1);
}

fn redis_cli(port: &str, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", port])
        .args(args)
        .output()
        .expect("redis-cli is on PATH (scripts/install-test-deps.sh installs it)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn redis_cli_is_a_client() {
    let r = Resp::start(RespSettings::default()).await;
    let port = r.port();
    let out = tokio::task::spawn_blocking(move || {
        [
            redis_cli(&port, &["THROTTLE", "cli", "3", "10", "60"]),
            redis_cli(&port, &["throttle", "cli", "3", "10", "60", "2"]),
            redis_cli(&port, &["THROTTLE", "cli", "3", "10", "60"]),
            redis_cli(&port, &["PING"]),
            redis_cli(&port, &["PING", "hello"]),
            redis_cli(&port, &["NOPE", "x"]),
            redis_cli(&port, &["THROTTLE", "cli", "3", "ten", "60"]),
            redis_cli(&port, &["QUIT"]),
            redis_cli(&port, &["CL.THROTTLE", "user123", "15", "30", "60"]),
            redis_cli(&port, &["cl.throttle", "cli", "0", "1", "2"]),
            redis_cli(&port, &["CL.THROTTLE", "cli", "0", "1", "2", "1"]),
        ]
    })
    .await
    .unwrap();
    // ThrottleCrab's [allowed, limit, remaining, reset_after, retry_after], by rate_limiter.rs
    // (T = 6 s, τ = 12 s): TAT now, then now + 12 (allow_at now), then refused until now + 6.
    assert_eq!(out[0], "1\n3\n2\n12\n0\n");
    assert_eq!(out[1], "1\n3\n0\n24\n0\n");
    assert_eq!(out[2], "0\n3\n0\n24\n6\n");
    assert_eq!(out[3], "PONG\n");
    assert_eq!(out[4], "hello\n");
    assert!(out[5].contains("ERR unknown command 'NOPE'"), "{}", out[5]);
    assert!(
        out[6].contains("ERR count_per_period is not an integer"),
        "{}",
        out[6]
    );
    assert_eq!(out[7], "OK\n");
    // redis-cell's README example, and its tests/e2e.rs it_works (limited 2 s, full in 2 s).
    assert_eq!(out[8], "0\n16\n15\n-1\n2\n");
    assert_eq!(out[9], "0\n1\n0\n-1\n2\n");
    assert_eq!(out[10], "1\n1\n0\n2\n2\n");
}

/// `redis-cli --pipe` ends its input with an `ECHO` of a random marker and waits for it: the
/// transport answers `ECHO`, so the mass insert ends with every reply counted.
#[tokio::test]
async fn redis_cli_pipe_mode_finishes() {
    let r = Resp::start(RespSettings::default()).await;
    let port = r.port();
    let out = tokio::task::spawn_blocking(move || {
        let mut input = String::new();
        for i in 0..500 {
            input.push_str(&format!("THROTTLE pipe{} 3 10 60\r\n", i % 7));
        }
        let mut child = Command::new("redis-cli")
            .args(["-p", &port, "--pipe", "--pipe-timeout", "10"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("redis-cli");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("errors: 0, replies: 500"), "{text}");
}

/// The usual client libraries, unmodified: redis-py (opens with `HELLO 3`), ioredis (an `INFO`
/// ready check) and node-redis (`HELLO 3`), each deciding `THROTTLE` calls and a pipeline.
/// `scripts/install-test-deps.sh` installs them (pip `redis`, `npm ci` in tests/clients).
#[tokio::test]
async fn python_and_node_client_libraries_work_unmodified() {
    let r = Resp::start(RespSettings::default()).await;
    let port = r.port();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");
    let runs = tokio::task::spawn_blocking(move || {
        [
            ("python3", format!("{dir}/redis_py.py")),
            ("node", format!("{dir}/node_clients.js")),
        ]
        .map(|(program, script)| {
            let out = Command::new(program)
                .arg(&script)
                .arg(&port)
                .current_dir(dir)
                .output()
                .unwrap_or_else(|e| panic!("{program}: {e} (scripts/install-test-deps.sh)"));
            (script, out)
        })
    })
    .await
    .unwrap();
    for (script, out) in runs {
        assert!(
            out.status.success(),
            "{script}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// What client libraries send when they connect, answered as Redis does.
#[tokio::test]
async fn connection_commands_of_common_clients_are_answered() {
    let r = Resp::start(RespSettings::default()).await;
    let port = r.port();
    let out = tokio::task::spawn_blocking(move || {
        [
            redis_cli(&port, &["ECHO", "marker"]),
            redis_cli(&port, &["HELLO"]),
            redis_cli(&port, &["HELLO", "3"]),
            redis_cli(&port, &["CLIENT", "SETNAME", "app"]),
            redis_cli(&port, &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
            redis_cli(&port, &["SELECT", "0"]),
            redis_cli(&port, &["SELECT", "1"]),
            redis_cli(&port, &["INFO"]),
        ]
    })
    .await
    .unwrap();
    assert_eq!(out[0], "marker\n");
    assert!(
        out[1].contains("turnstile") && out[1].contains("proto"),
        "{}",
        out[1]
    );
    assert!(
        out[2].contains("proto") && out[2].contains('3'),
        "{}",
        out[2]
    );
    assert_eq!(out[3], "OK\n");
    assert_eq!(out[4], "OK\n");
    assert_eq!(out[5], "OK\n");
    assert!(
        out[6].contains("ERR DB index is out of range"),
        "{}",
        out[6]
    );
    assert!(out[7].contains("loading:0"), "{}", out[7]);
}

#[tokio::test]
async fn pipelined_commands_are_answered_in_order() {
    let r = Resp::start(RespSettings::default()).await;
    // Through the redis crate: one pipeline, 3 fit the bucket, the rest are refused.
    let mut con = r.redis().await;
    let mut p = ::redis::pipe();
    for _ in 0..50 {
        p.add_command(throttle_cmd("pipe", 3, 1, 3600, 1));
    }
    let answers: Vec<Vec<i64>> = p.query_async(&mut con).await.unwrap();
    let allowed: Vec<i64> = answers.iter().map(|a| a[0]).collect();
    assert_eq!(&allowed[..4], &[1, 1, 1, 0]);
    assert_eq!(allowed.iter().sum::<i64>(), 3);
    assert_eq!(answers[2][2], 0);

    // Through one raw write: multibulk and inline commands, errors among them.
    let mut raw = r.raw().await;
    let mut batch = Vec::new();
    for i in 0..200 {
        let key = format!("raw{i}");
        let msg = format!("m{i}");
        batch.extend_from_slice(
            format!(
                "*2\r\n$4\r\nPING\r\n${}\r\n{msg}\r\n*6\r\n$8\r\nTHROTTLE\r\n${}\r\n{key}\r\n$1\r\n1\r\n$1\r\n1\r\n$2\r\n60\r\n$1\r\n1\r\n",
                msg.len(),
                key.len()
            )
            .as_bytes(),
        );
        batch.extend_from_slice(format!("THROTTLE {key} 1 1 60\r\nBOGUS {i}\r\n").as_bytes());
    }
    raw.send(&batch).await;
    for i in 0..200 {
        assert_eq!(
            raw.reply().await,
            Some(OwnedFrame::BulkString(format!("m{i}").into_bytes()))
        );
        // max_burst 1: τ = 0, so the key, stored with a TTL of τ, has expired by the next call
        // and both are allowed (rate_limiter.rs:179-183). ThrottleCrab's server:
        //   $ redis-cli -p 16479 THROTTLE one 1 1 60; redis-cli -p 16479 THROTTLE one 1 1 60
        //   1 1 0 0 0 / 1 1 0 0 0
        assert_eq!(ints(&raw.reply().await.unwrap()), vec![1, 1, 0, 0, 0]);
        assert_eq!(ints(&raw.reply().await.unwrap()), vec![1, 1, 0, 0, 0]);
        assert!(err_text(&raw.reply().await.unwrap()).starts_with("ERR unknown command 'BOGUS'"));
    }
    // A command split across writes is answered once it is whole.
    raw.send(b"*1\r\n$4\r\nPI").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    raw.send(b"NG\r\n").await;
    assert_eq!(
        raw.reply().await,
        Some(OwnedFrame::SimpleString(b"PONG".to_vec()))
    );
}

#[tokio::test]
async fn bad_commands_get_errors_and_the_connection_stays() {
    let limits = ThrottleLimits {
        max_burst: 5,
        max_period_secs: 60,
        max_count: 100,
        max_key_len: 8,
        allow_remote: false,
    };
    let r = Resp::start(RespSettings {
        limits,
        ..RespSettings::default()
    })
    .await;
    let mut con = r.redis().await;
    let cases: Vec<(::redis::Cmd, &str)> = vec![
        (::redis::cmd("FLUSHALL"), "unknown command 'FLUSHALL'"),
        (
            {
                let mut c = ::redis::cmd("THROTTLE");
                c.arg("k").arg(1).arg(1);
                c
            },
            "wrong number of arguments for 'throttle' command",
        ),
        (
            throttle_cmd("k", 1, 1, 1, 1).arg(9).clone(),
            "wrong number of arguments",
        ),
        (
            {
                let mut c = ::redis::cmd("THROTTLE");
                c.arg("k").arg("x").arg(1).arg(1);
                c
            },
            "max_burst is not an integer",
        ),
        (
            throttle_cmd("k", 6, 1, 1, 1),
            "max_burst must be from 1 to 5",
        ),
        (
            throttle_cmd("k", 0, 1, 1, 1),
            "max_burst must be from 1 to 5",
        ),
        (
            throttle_cmd("k", -3, 1, 1, 1),
            "max_burst must be from 1 to 5",
        ),
        (
            throttle_cmd("k", 1, 101, 1, 1),
            "count_per_period must be from 1 to 100",
        ),
        (
            throttle_cmd("k", 1, 1, 61, 1),
            "period must be from 1 to 60",
        ),
        (
            throttle_cmd("k", 2, 1, 1, -1),
            "quantity must be 0 or more, not -1",
        ),
        (throttle_cmd("toolongkey", 1, 1, 1, 1), "key must be 1 to 8"),
        (throttle_cmd("", 1, 1, 1, 1), "key must be 1 to 8"),
        (
            ::redis::cmd("PING").arg("a").arg("b").clone(),
            "wrong number of arguments for 'ping'",
        ),
    ];
    for (cmd, expected) in cases {
        let e = cmd
            .query_async::<::redis::Value>(&mut con)
            .await
            .expect_err(expected);
        assert!(e.to_string().contains(expected), "{e} (wanted {expected})");
        // The same connection keeps working.
        let pong: String = ::redis::cmd("PING").query_async(&mut con).await.unwrap();
        assert_eq!(pong, "PONG");
    }
    // Within the caps is fine.
    let v: Vec<i64> = throttle_cmd("k", 5, 100, 60, 5)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v[..3], [1, 5, 0]);

    // A framing error cannot be resynchronised: error, then close (as Redis does).
    let mut raw = r.raw().await;
    raw.send(&b"*1\r\n".repeat(10_000)).await;
    assert!(err_text(&raw.reply().await.unwrap()).contains("Protocol error"));
    assert_eq!(raw.reply().await, None);
    let mut raw = r.raw().await;
    raw.send(b"*1\r\n$999999999\r\n").await;
    assert!(err_text(&raw.reply().await.unwrap()).contains("Protocol error"));
    assert_eq!(raw.reply().await, None);
}

#[tokio::test]
async fn quit_answers_ok_and_closes() {
    let r = Resp::start(RespSettings::default()).await;
    let mut raw = r.raw().await;
    raw.send(b"PING\r\nQUIT\r\nPING\r\n").await;
    assert_eq!(
        raw.reply().await,
        Some(OwnedFrame::SimpleString(b"PONG".to_vec()))
    );
    assert_eq!(
        raw.reply().await,
        Some(OwnedFrame::SimpleString(b"OK".to_vec()))
    );
    assert_eq!(raw.reply().await, None, "nothing after QUIT is answered");
}

async fn ping(raw: &mut Raw) -> Option<OwnedFrame> {
    raw.send(b"PING\r\n").await;
    raw.reply().await
}

#[tokio::test]
async fn connections_over_the_cap_are_told_and_closed() {
    let r = Resp::start(RespSettings {
        max_connections: 2,
        ..RespSettings::default()
    })
    .await;
    let pong = Some(OwnedFrame::SimpleString(b"PONG".to_vec()));
    let mut a = r.raw().await;
    let mut b = r.raw().await;
    assert_eq!(ping(&mut a).await, pong);
    assert_eq!(ping(&mut b).await, pong);
    let refused_before = exposed(r.s.running(), "turnstile_resp_connections_refused_total");
    let mut c = r.raw().await;
    c.send(b"PING\r\n").await;
    assert_eq!(
        c.reply().await,
        Some(OwnedFrame::Error("ERR too many connections".into()))
    );
    assert_eq!(c.reply().await, None);
    assert!(exposed(r.s.running(), "turnstile_resp_connections_refused_total") > refused_before);
    // Once one leaves, a newcomer gets its place.
    drop(a);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut d = r.raw().await;
        if ping(&mut d).await == pong {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no place freed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ping(&mut b).await, pong);
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let r = Resp::start(RespSettings {
        idle_timeout: Duration::from_millis(300),
        ..RespSettings::default()
    })
    .await;
    let mut raw = r.raw().await;
    assert!(ping(&mut raw).await.is_some());
    let started = std::time::Instant::now();
    assert_eq!(raw.reply().await, None);
    assert!(started.elapsed() >= Duration::from_millis(250));
}

/// Open files allowed to this process (the soft limit).
fn fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_connections_are_held_at_once() {
    let r = Resp::start(RespSettings::default()).await;
    // Both ends of every connection are in this process.
    let n = 2000.min(fd_limit().saturating_sub(300) / 2);
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        conns.push(r.raw().await);
        if i % 64 == 0 {
            // Lets the accept loop keep the backlog short.
            tokio::task::yield_now().await;
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut c) in conns.into_iter().enumerate() {
        tasks.spawn(async move {
            c.send(format!("THROTTLE many{} 2 1 60\r\n", i % 10).as_bytes())
                .await;
            let v = ints(&c.reply().await.expect("answered"));
            (c, v[0])
        });
    }
    let mut held = Vec::with_capacity(n);
    let mut allowed = 0;
    while let Some(done) = tasks.join_next().await {
        let (c, a) = done.unwrap();
        allowed += a;
        held.push(c);
    }
    assert_eq!(held.len(), n);
    // max_burst 2 lets two through per key (ThrottleCrab's server: `THROTTLE two 2 1 60` three
    // times answers 1 2 1 60 0 / 1 2 0 119 0 / 0 2 0 119 59).
    assert_eq!(
        allowed, 20,
        "two per key, whichever connections asked first"
    );
    assert!(exposed(r.s.running(), "turnstile_resp_connections") >= n as u64);
}

async fn post_throttle(s: &TestServer, body: &str) -> (u16, Option<String>, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/throttle", s.http))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn http_throttle_end_to_end() {
    let r = Resp::start(RespSettings::default()).await;
    let s = &r.s;
    let body = r#"{"key":"web","max_burst":2,"count_per_period":10,"period":60}"#;
    // ThrottleCrab's ThrottleResponse (throttlecrab-server/src/types.rs), by rate_limiter.rs:
    // T = 6 s, τ = 6 s; a fresh key's TAT becomes now, so reset_after = 6.
    let (code, retry, v) = post_throttle(s, body).await;
    assert_eq!((code, retry), (200, None));
    assert_eq!(
        v,
        serde_json::json!({"allowed": true, "limit": 2, "remaining": 1, "reset_after": 6, "retry_after": 0})
    );
    // RESP and HTTP decide the same key: one bucket, whichever transport asks.
    let mut con = r.redis().await;
    let v: Vec<i64> = throttle_cmd("web", 2, 10, 60, 1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, vec![1, 2, 0, 12, 0]);
    // A refusal is 200 with "allowed": false, as ThrottleCrab answers it (transport/http.rs:
    // 139-146 returns Json(response) for every decision); Retry-After is added.
    let (code, retry, v) = post_throttle(s, body).await;
    assert_eq!((code, retry.as_deref()), (200, Some("6")));
    assert_eq!(
        v,
        serde_json::json!({"allowed": false, "limit": 2, "remaining": 0, "reset_after": 12, "retry_after": 6})
    );
    r.s.advance(Duration::from_secs(6));
    let with_quantity =
        r#"{"key":"web","max_burst":2,"count_per_period":10,"period":60,"quantity":1}"#;
    let (code, retry, v) = post_throttle(s, with_quantity).await;
    assert_eq!(
        (code, retry, &v["allowed"]),
        (200, None, &Value::Bool(true))
    );
    // More than max_burst is a refusal too; a null quantity is 1, as in ThrottleCrab's
    // HttpThrottleRequest (quantity: Option<i64>).
    let (code, _, v) = post_throttle(
        s,
        r#"{"key":"web2","max_burst":2,"count_per_period":10,"period":60,"quantity":3}"#,
    )
    .await;
    assert_eq!(
        (code, &v["allowed"], &v["remaining"]),
        (200, &Value::Bool(false), &2.into())
    );
    let (code, _, v) = post_throttle(
        s,
        r#"{"key":"web3","max_burst":2,"count_per_period":10,"period":60,"quantity":null}"#,
    )
    .await;
    assert_eq!((code, &v["remaining"]), (200, &1.into()));

    for (bad, expected) in [
        ("not json", "bad JSON body"),
        (r#"{"key":"web"}"#, "missing field"),
        (
            r#"{"key":"web","max_burst":1000001,"count_per_period":10,"period":60}"#,
            "max_burst must be from 1 to 1000000",
        ),
        (
            r#"{"key":"web","max_burst":2,"count_per_period":10,"period":86401}"#,
            "period must be from 1 to 86400",
        ),
        (
            r#"{"key":"web","max_burst":2,"count_per_period":-1,"period":60}"#,
            "count_per_period must be from 1",
        ),
        (
            r#"{"key":"","max_burst":2,"count_per_period":1,"period":60}"#,
            "key must be",
        ),
    ] {
        let (code, _, v) = post_throttle(s, bad).await;
        assert_eq!(code, 400, "{bad}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(expected), "{bad}: {msg}");
    }
}

/// A field ThrottleCrab's `HttpThrottleRequest` does not know is ignored there (serde's
/// default, `throttlecrab-server/src/transport/http.rs:61-73`). Its server, run as
/// `throttlecrab-server --http --http-port 18480`:
///
/// ```text
/// $ curl -XPOST 127.0.0.1:18480/throttle -H 'content-type: application/json' \
///     -d '{"key":"x","max_burst":3,"count_per_period":10,"period":60,"extra":1}'
/// HTTP/1.1 200 OK
/// {"allowed":true,"limit":3,"remaining":2,"reset_after":12,"retry_after":0}
/// ```
#[tokio::test]
async fn http_throttle_ignores_fields_throttlecrab_does_not_know() {
    let r = Resp::start(RespSettings::default()).await;
    let (code, _, v) = post_throttle(
        &r.s,
        r#"{"key":"x","max_burst":3,"count_per_period":10,"period":60,"extra":1}"#,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v,
        serde_json::json!({"allowed": true, "limit": 3, "remaining": 2, "reset_after": 12, "retry_after": 0})
    );
}

#[tokio::test]
async fn grpc_limits_and_throttle_keys_never_meet() {
    let r = Resp::start(RespSettings::default()).await;
    let alice = || one("d", &[("user", "alice")]);
    assert_eq!(codes(&r.s.call(alice()).await), vec![(OK, 1)]);
    assert_eq!(codes(&r.s.call(alice()).await), vec![(OK, 0)]);
    assert_eq!(codes(&r.s.call(alice()).await)[0].0, OVER);
    // The gRPC counter key is "d_user_alice_"; THROTTLE's key of the same name is another bucket.
    let mut con = r.redis().await;
    // T = 30 s, τ = 30 s (rate_limiter.rs:122).
    for expected in [
        vec![1, 2, 1, 30, 0],
        vec![1, 2, 0, 60, 0],
        vec![0, 2, 0, 60, 30],
    ] {
        let v: Vec<i64> = throttle_cmd("d_user_alice_", 2, 2, 60, 1)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(v, expected);
    }
    assert_eq!(codes(&r.s.call(alice()).await)[0].0, OVER, "gRPC untouched");
    // Half a minute later each has one token back, independently.
    r.s.advance(Duration::from_secs(30));
    assert_eq!(codes(&r.s.call(alice()).await), vec![(OK, 0)]);
    let v: Vec<i64> = throttle_cmd("d_user_alice_", 2, 2, 60, 1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v[0], 1);
    // Both keys live in the shared shards, side by side.
    let keys: Vec<String> =
        r.s.running()
            .context
            .engine
            .inspect(None)
            .await
            .unwrap()
            .into_iter()
            .map(|k| k.key)
            .collect();
    assert!(keys.contains(&"d_user_alice_".to_string()), "{keys:?}");
    assert!(
        keys.contains(&"\0throttle/d_user_alice_".to_string()),
        "{keys:?}"
    );
    // And the transport's counters saw the calls.
    let metrics =
        r.s.running()
            .context
            .registry
            .render(turnstile::telemetry::Shown::Clear);
    assert!(
        metrics.contains("turnstile_throttle_calls_total{result=\"allowed\"}"),
        "{metrics}"
    );
    assert!(
        exposed(
            r.s.running(),
            "turnstile_throttle_calls_total{result=\"denied\"}"
        ) >= 1
    );
}

#[tokio::test]
async fn shutdown_stops_accepting_and_closes_connections() {
    let mut r = Resp::start(RespSettings::default()).await;
    let mut raw = r.raw().await;
    assert!(ping(&mut raw).await.is_some());
    let _ = r.stop.take().unwrap().send(());
    let result = tokio::time::timeout(Duration::from_secs(5), &mut r.task)
        .await
        .expect("serve returns once its connections are closed")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(raw.reply().await, None);
    assert!(
        TcpStream::connect(r.addr).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test]
async fn a_non_loopback_listener_is_refused_unless_allowed() {
    let s = TestServer::start(GRPC_CONFIG).await;
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = throttle::serve(
        listener,
        turnstile::service::ThrottleService::new(
            s.running().context.engine.clone(),
            s.running().door_stats.throttle.clone(),
        ),
        RespSettings::default(),
        s.running().door_stats.resp.clone(),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("TURNSTILE_RESP_ALLOW_REMOTE"), "{e}");
}

#[tokio::test]
async fn the_server_starts_the_resp_listener_from_its_settings() {
    let s = TestServer::start_with(
        "domain: d\ndescriptors: []\n",
        &[("TURNSTILE_RESP_ADDR", "127.0.0.1:0")],
    )
    .await;
    let addr = s.running().resp_addr.expect("RESP listener started");
    let port = addr.port().to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("redis-cli")
            .args(["-p", &port, "THROTTLE", "wired", "2", "10", "60"])
            .output()
            .expect("redis-cli")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(lines.first().copied(), Some("1"), "allowed: {text}");
    let off = TestServer::start("domain: d\ndescriptors: []\n").await;
    assert!(off.running().resp_addr.is_none(), "off by default");
}

/// The value of `series` (its name and labels, as written) in the running server's exposition.
fn exposed(running: &turnstile::server::Running, series: &str) -> u64 {
    let text = running
        .context
        .registry
        .render(turnstile::telemetry::Shown::Clear);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}
