use super::*;
use crate::limiter::key::key_hash;
use crate::limiter::State;

fn req(burst: i64, count: i64, period: i64, quantity: i64) -> ThrottleRequest {
    ThrottleRequest {
        key: "k".into(),
        max_burst: burst,
        count_per_period: count,
        period,
        quantity,
    }
}

fn crab(r: &ThrottleRequest, l: &ThrottleLimits) -> Result<Op, ThrottleError> {
    op_for(r, l, Peer::ThrottleCrab)
}

#[test]
fn caps_and_ranges_are_enforced() {
    let l = ThrottleLimits {
        max_burst: 10,
        max_period_secs: 60,
        max_count: 100,
        max_key_len: 4,
        allow_remote: false,
    };
    assert!(crab(&req(10, 100, 60, 10), &l).is_ok());
    assert!(crab(&req(10, 100, 60, 0), &l).is_ok(), "0 only asks");
    for bad in [
        req(11, 1, 1, 1),
        req(0, 1, 1, 1),
        req(-1, 1, 1, 1),
        req(1, 101, 1, 1),
        req(1, 0, 1, 1),
        req(1, 1, 61, 1),
        req(1, 1, 0, 1),
        req(2, 1, 1, -1),
    ] {
        assert!(
            matches!(crab(&bad, &l), Err(ThrottleError::Invalid(_))),
            "{bad:?}"
        );
    }
    let mut long = req(1, 1, 1, 1);
    long.key = "12345".into();
    assert!(crab(&long, &l).is_err());
    long.key = String::new();
    assert!(crab(&long, &l).is_err());
    let fast = ThrottleLimits {
        max_count: u32::MAX,
        ..l
    };
    assert!(crab(&req(1, 2_000_000_000, 1, 1), &fast).is_err());
    // redis-cell's max_burst starts at 0: a bucket of one.
    let cell = op_for(&req(0, 1, 1, 1), &l, Peer::RedisCell).unwrap();
    assert_eq!(cell.params.algorithm, Algorithm::TokenBucket { burst: 1 });
    assert!(op_for(&req(-1, 1, 1, 1), &l, Peer::RedisCell).is_err());
}

#[test]
fn more_than_the_bucket_holds_only_looks() {
    let l = ThrottleLimits::default();
    // ThrottleCrab's rule decides every quantity itself.
    assert_eq!(crab(&req(2, 1, 1, 3), &l).unwrap().hits, 3);
    assert_eq!(
        op_for(&req(2, 1, 1, 3), &l, Peer::RedisCell).unwrap().hits,
        3
    );
    assert_eq!(
        op_for(&req(2, 1, 1, 4), &l, Peer::RedisCell).unwrap().hits,
        0
    );
    assert_eq!(
        op_for(&req(2, 1, 1, i64::MAX), &l, Peer::RedisCell)
            .unwrap()
            .hits,
        0
    );
}

#[test]
fn keys_have_their_own_space() {
    let op = crab(&req(1, 1, 1, 1), &ThrottleLimits::default()).unwrap();
    assert_eq!(op.key, "\0throttle/k");
    assert_eq!(op.key.hash(), key_hash("\0throttle/k"));
    assert_eq!(op.params.window_ms, 1000);
    let cell = op_for(
        &req(1, 1, 1, 1),
        &ThrottleLimits::default(),
        Peer::RedisCell,
    )
    .unwrap();
    assert_eq!(cell.key, "\0cell/k");
}

const S: u64 = 1_000_000_000;

fn g(allowed: bool, full_in_ns: u64, interval_ns: u64, burst: u64, quantity: u64) -> Gcra {
    Gcra {
        allowed,
        full_in_ns,
        interval_ns,
        burst,
        quantity,
    }
}

/// One `THROTTLE` call decided by the counting rule alone, as a shard would: the answer and
/// the state it leaves.
fn crab_call(
    state: Option<State>,
    r: &ThrottleRequest,
    now: u64,
) -> (ThrottleAnswer, Option<State>) {
    let op = crab(r, &ThrottleLimits::default()).unwrap();
    let base = state.unwrap_or_else(|| State::fresh(&op.params, now));
    let e = base.eval(&op.params, now, op.hits);
    let out = Outcome {
        over: e.over,
        remaining: e.remaining,
        past: e.past,
        reset_ns: e.reset_ns,
        retry_ns: e.retry_ns,
        blocked: false,
        released: false,
    };
    let burst = r.max_burst as u64;
    let kept = if e.over { state } else { Some(e.next) };
    (ThrottleAnswer::from_outcome(&out, burst), kept)
}

fn five(a: ThrottleAnswer) -> [i64; 5] {
    [
        a.allowed.into(),
        a.limit,
        a.remaining,
        a.reset_after,
        a.retry_after,
    ]
}

const NOW: u64 = 1_700_000_000 * S;

#[test]
fn throttlecrab_answers_with_its_own_values() {
    // lazureykis/throttlecrab, throttlecrab-server/src/transport/redis_test.rs,
    // test_redis_throttle_allowed: THROTTLE 10 100 60 on a fresh key is [1, 10, 9, 5, 0].
    let (a, _) = crab_call(None, &req(10, 100, 60, 1), NOW);
    assert_eq!(five(a), [1, 10, 9, 5, 0]);
    // test_redis_throttle_with_quantity: quantity 5 leaves 5, reset_after 7.
    let (a, _) = crab_call(None, &req(10, 100, 60, 5), NOW);
    assert_eq!((a.remaining, a.reset_after), (5, 7));
    // test_redis_large_quantity: quantity 15 of 10 is refused, remaining still 10, and
    // rate_limiter.rs: reset_after = TAT - now + τ = -T + 9T = 4.8 s, and
    // allow_at - now = (-T + 15T) - 9T = 5T = 3 s.
    let (a, kept) = crab_call(None, &req(10, 100, 60, 15), NOW);
    assert_eq!(five(a), [0, 10, 10, 4, 3]);
    assert_eq!(kept, None, "a refusal stores nothing");
}

#[test]
fn throttlecrab_keeps_its_own_tat() {
    // rate_limiter.rs 0.4.40 by hand, T = 6 s then 0.6 s: the TAT goes now - 6, now,
    // now + 6 (τ 12), now + 12 (τ 54); then T 0.6, τ 1.2: allow_at = now + 12.6 - 1.2,
    // refused, reset_after = 12 + 1.2, retry_after = 11.4.
    let (_, s) = crab_call(None, &req(3, 10, 60, 1), NOW);
    let (_, s) = crab_call(s, &req(3, 10, 60, 1), NOW);
    let (a, s) = crab_call(s, &req(10, 10, 60, 1), NOW);
    assert_eq!(five(a), [1, 10, 7, 66, 0]);
    let (a, _) = crab_call(s, &req(3, 100, 60, 1), NOW);
    assert_eq!(five(a), [0, 3, 0, 13, 11]);
    // Quantity 0 stores now - T (rate_limiter.rs: allowed, then set_if_not_exists), which
    // the next call starts from: 24 s - 1 ms, floored.
    let (a, s) = crab_call(None, &req(5, 10, 60, 0), NOW);
    assert_eq!(five(a), [1, 5, 5, 18, 0]);
    let (a, _) = crab_call(s, &req(5, 10, 60, 1), NOW + S / 1000);
    assert_eq!(five(a), [1, 5, 4, 23, 0]);
    // Expired (TAT + τ passed): fresh again.
    let (_, s) = crab_call(None, &req(2, 1, 1, 2), NOW);
    let (a, _) = crab_call(s, &req(2, 1, 1, 1), NOW + 2 * S);
    assert_eq!(five(a), [1, 2, 1, 1, 0]);
}

#[test]
fn redis_cell_answers_from_the_engine_state() {
    // brandur/redis-cell README, "Response": CL.THROTTLE user123 15 30 60 on a fresh key
    // is [0, 16, 15, -1, 2] (T = 2 s, a bucket of 16, full again in 2 s).
    let a = ThrottleCellAnswer::from_gcra(&g(true, 2 * S, 2 * S, 16, 1));
    assert_eq!(
        (
            a.limited,
            a.limit,
            a.remaining,
            a.retry_after,
            a.reset_after
        ),
        (false, 16, 15, -1, 2)
    );
    // src/cell/mod.rs it_rate_limits case 8 (limit 5, 1/s): reset_after 3900 ms, which
    // src/lib.rs:73-76 rounds up to 4; case 14: limited, retry_after 3 s.
    let a = ThrottleCellAnswer::from_gcra(&g(true, 3_900_000_000, S, 5, 1));
    assert_eq!((a.remaining, a.reset_after), (1, 4));
    let a = ThrottleCellAnswer::from_gcra(&g(false, 3 * S, S, 5, 5));
    assert_eq!(
        (a.limited, a.remaining, a.retry_after, a.reset_after),
        (true, 2, 3, 3)
    );
    // Case 0: more than the bucket can ever hold: retry_after stays -1.
    let a = ThrottleCellAnswer::from_gcra(&g(false, 0, S, 5, 6));
    assert_eq!((a.remaining, a.retry_after, a.reset_after), (5, -1, 0));
    // lib.rs rounds up only from a whole millisecond.
    assert_eq!(cell_secs(2 * S as i128 + 999_999), 2);
    assert_eq!(cell_secs(2 * S as i128 + 1_000_000), 3);
    assert_eq!(cell_secs(-(S as i128)), -1);
}
