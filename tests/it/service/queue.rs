//! Queued waiting over gRPC: FIFO per key, bounded, cancellable, answered at shutdown.
//! Time is the server's manual clock: windows roll over when a test moves it, never by sleeping.

use std::time::Duration;

use crate::common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use tokio::task::JoinHandle;

const CONFIG: &str = r#"
domain: q
descriptors:
  - key: job
    rate_limit:
      unit: second
      requests_per_unit: 2
      queue: {max_waiting: 10, max_wait: 10s}
  - key: small
    rate_limit:
      unit: second
      requests_per_unit: 1
      queue: {max_waiting: 1, max_wait: 1500ms}
  - key: slow
    rate_limit:
      unit: second
      requests_per_unit: 1
      queue: {max_waiting: 10, max_wait: 1500ms}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

fn waiting(s: &TestServer) -> u64 {
    s.running()
        .context
        .engine
        .stats()
        .iter()
        .map(|st| st.read().waiting)
        .sum()
}

/// Polls (briefly, in real time) until the shards report `n` waiters: a readiness check, not a
/// sleep through a window.
async fn until_waiting(s: &TestServer, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while waiting(s) != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {n} waiters, have {}",
            waiting(s)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn spawn_call(
    s: &TestServer,
    r: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
) -> JoinHandle<RateLimitResponse> {
    let mut c = s.client.clone();
    tokio::spawn(async move { c.should_rate_limit(r).await.expect("call").into_inner() })
}

/// Starts `n` waiters on `pairs` one after another (each queued before the next is sent).
async fn queue_up(
    s: &TestServer,
    pairs: &[(&str, &str)],
    n: usize,
) -> Vec<JoinHandle<RateLimitResponse>> {
    let base = waiting(s);
    let mut out = Vec::new();
    for i in 0..n {
        out.push(spawn_call(s, one("q", pairs)));
        until_waiting(s, base + i as u64 + 1).await;
    }
    out
}

#[tokio::test]
async fn waiters_are_admitted_in_arrival_order_at_the_limit_per_window() {
    let s = TestServer::start(CONFIG).await;
    // T0 is on a whole second: fill this window.
    for _ in 0..2 {
        assert_eq!(s.call(one("q", &[("job", "a")])).await.overall_code, OK);
    }
    let mut waiters = queue_up(&s, &[("job", "a")], 6).await;
    let mut order = Vec::new();
    for window in 1..=3u64 {
        s.advance(Duration::from_secs(1));
        // Exactly the two that came first are admitted (awaiting a later one would hang).
        for _ in 0..2 {
            let w = waiters.remove(0);
            let r = tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("the earliest waiters are admitted")
                .unwrap();
            assert_eq!(r.overall_code, OK);
            assert!(
                header(&r, WAITED_HEADER).is_some(),
                "waited header on an admitted waiter"
            );
            order.push(r);
        }
        until_waiting(&s, 6 - 2 * window).await;
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "window {window}: no more than the limit"
        );
        // Other keys are not affected by the queue.
        assert_eq!(s.call(one("q", &[("job", "b")])).await.overall_code, OK);
    }
    let waited: Vec<u64> = order
        .iter()
        .map(|r| header(r, WAITED_HEADER).unwrap().parse().unwrap())
        .collect();
    assert_eq!(waited, vec![1000, 1000, 2000, 2000, 3000, 3000]);
}

#[tokio::test]
async fn a_newcomer_never_passes_a_waiter() {
    let s = TestServer::start(CONFIG).await;
    for _ in 0..2 {
        s.call(one("q", &[("job", "n")])).await;
    }
    let mut w = queue_up(&s, &[("job", "n")], 2).await;
    // A refund of one hit goes to the head of the queue.
    let mut d = desc(&[("job", "n")]);
    d.is_negative_hits = true;
    d.hits_addend = Some(UInt64Value { value: 1 });
    s.call(req("q", vec![d])).await;
    until_waiting(&s, 1).await;
    let first = w.remove(0).await.unwrap();
    assert_eq!(first.overall_code, OK);
    // Window full again; the newcomer queues behind the remaining waiter.
    let newcomer = spawn_call(&s, one("q", &[("job", "n")]));
    until_waiting(&s, 2).await;
    s.advance(Duration::from_secs(1));
    let second = w.remove(0).await.unwrap();
    let third = newcomer.await.unwrap();
    assert_eq!((second.overall_code, third.overall_code), (OK, OK));
}

/// Room in the window is not enough to pass a waiter: one asking 2 hits with 1 free waits, and
/// a newcomer asking 1 (which would fit) queues behind it; each is admitted in order.
#[tokio::test]
async fn a_newcomer_waits_behind_a_waiter_even_with_room_for_itself() {
    let s = TestServer::start(CONFIG).await;
    assert_eq!(
        codes(&s.call(one("q", &[("job", "r")])).await),
        vec![(OK, 1)]
    );
    // A weighted request (the request's own hits_addend) of 2, with 1 left: it waits.
    let mut two = one("q", &[("job", "r")]);
    two.hits_addend = 2;
    let big = spawn_call(&s, two);
    until_waiting(&s, 1).await;
    let newcomer = spawn_call(&s, one("q", &[("job", "r")]));
    until_waiting(&s, 2).await;
    assert!(!big.is_finished() && !newcomer.is_finished());
    // The next window admits the 2-hit waiter and is full again: the newcomer still waits.
    s.advance(Duration::from_secs(1));
    let r = tokio::time::timeout(Duration::from_secs(5), big)
        .await
        .expect("the head is admitted")
        .unwrap();
    assert_eq!(codes(&r), vec![(OK, 0)]);
    until_waiting(&s, 1).await;
    assert!(
        !newcomer.is_finished(),
        "the newcomer did not pass the head"
    );
    s.advance(Duration::from_secs(1));
    let r = tokio::time::timeout(Duration::from_secs(5), newcomer)
        .await
        .expect("then the newcomer")
        .unwrap();
    assert_eq!(codes(&r), vec![(OK, 1)]);
}

/// A wait that could only end after `max_wait` is refused at once, with nothing queued: 0.7 s
/// into a full window of 1 a second, the first waiter is admitted in 0.3 s, the second in 1.3 s
/// (within 1.5 s), the third not before 2.3 s.
#[tokio::test]
async fn a_wait_longer_than_max_wait_is_refused_at_once() {
    let s = TestServer::start(CONFIG).await;
    s.advance(Duration::from_millis(700));
    assert_eq!(s.call(one("q", &[("slow", "x")])).await.overall_code, OK);
    let mut w = queue_up(&s, &[("slow", "x")], 2).await;
    let r = tokio::time::timeout(Duration::from_secs(5), s.call(one("q", &[("slow", "x")])))
        .await
        .expect("answered at once, not queued");
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    assert_eq!(waiting(&s), 2, "the hopeless one never queued");
    s.advance(Duration::from_millis(300));
    assert_eq!(w.remove(0).await.unwrap().overall_code, OK);
    s.advance(Duration::from_secs(1));
    assert_eq!(w.remove(0).await.unwrap().overall_code, OK);
}

#[tokio::test]
async fn a_full_queue_or_a_hopeless_wait_is_refused_at_once() {
    let s = TestServer::start(CONFIG).await;
    s.call(one("q", &[("small", "x")])).await;
    let mut w = queue_up(&s, &[("small", "x")], 1).await;
    // max_waiting 1: the next one is refused at once.
    let r = s.call(one("q", &[("small", "x")])).await;
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    let stats = s.running().context.engine.stats();
    assert!(stats.iter().map(|x| x.read().queue_full).sum::<u64>() >= 1);
    s.advance(Duration::from_secs(1));
    assert_eq!(w.remove(0).await.unwrap().overall_code, OK);

    // Two hits on a limit of one per second never fit one window.
    let t = TestServer::start(CONFIG).await;
    t.advance(Duration::from_millis(700));
    t.call(one("q", &[("small", "y")])).await;
    let mut hits = desc(&[("small", "y")]);
    hits.hits_addend = Some(UInt64Value { value: 2 });
    // Two hits on a limit of one per second never fit one window: refused, no waiting.
    let r = t.call(req("q", vec![hits])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(waiting(&t), 0);
}

#[tokio::test]
async fn a_waiter_past_max_wait_gets_over_limit_and_consumes_nothing() {
    let s = TestServer::start(CONFIG).await;
    s.call(one("q", &[("small", "t")])).await;
    let mut w = queue_up(&s, &[("small", "t")], 1).await;
    // The clock jumps past the 1.5 s deadline in one step (a stalled shard would see the same).
    s.advance(Duration::from_secs(2));
    let r = w.remove(0).await.unwrap();
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    assert!(header(&r, WAITED_HEADER).is_none());
    let stats = s.running().context.engine.stats();
    assert_eq!(stats.iter().map(|x| x.read().timed_out).sum::<u64>(), 1);
    // Nothing was consumed: the whole window is free.
    assert_eq!(
        codes(&s.call(one("q", &[("small", "t")])).await),
        vec![(OK, 0)]
    );
}

#[tokio::test]
async fn a_caller_that_goes_away_leaves_the_queue_and_consumes_nothing() {
    let s = TestServer::start(CONFIG).await;
    s.call(one("q", &[("small", "c")])).await;
    // A gRPC deadline, as Envoy's filter timeout would give.
    let mut c = s.client.clone();
    let mut r = tonic::Request::new(one("q", &[("small", "c")]));
    r.set_timeout(Duration::from_millis(100));
    let gone = c
        .should_rate_limit(r)
        .await
        .expect_err("deadline passes while queued");
    assert!(
        matches!(
            gone.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        ),
        "{gone:?}"
    );
    // It leaves the queue at once...
    until_waiting(&s, 0).await;
    // ...so its place is free: with max_waiting 1, another caller can queue.
    let mut w = queue_up(&s, &[("small", "c")], 1).await;
    s.advance(Duration::from_secs(1));
    let r = w.remove(0).await.unwrap();
    // Admitted with the whole window: the cancelled waiter took nothing.
    assert_eq!(codes(&r), vec![(OK, 0)]);
    let stats = s.running().context.engine.stats();
    assert_eq!(stats.iter().map(|x| x.read().cancelled).sum::<u64>(), 1);
}

#[tokio::test]
async fn several_descriptors_wait_together_and_refuse_together() {
    let s = TestServer::start(CONFIG).await;
    // A descriptor that cannot wait and is over refuses the request at once.
    s.call(one("q", &[("plain", "p")])).await;
    for _ in 0..2 {
        s.call(one("q", &[("job", "m")])).await;
    }
    let r = s
        .call(req(
            "q",
            vec![desc(&[("job", "m")]), desc(&[("plain", "p")])],
        ))
        .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(waiting(&s), 0, "did not wait");

    // A queued descriptor over its limit makes the whole request wait; the other descriptor's
    // hit is taken only when the request is admitted.
    let pending = spawn_call(
        &s,
        req("q", vec![desc(&[("free", "f")]), desc(&[("job", "m")])]),
    );
    until_waiting(&s, 1).await;
    let before = s.call(one("q", &[("free", "f")])).await;
    assert_eq!(
        codes(&before),
        vec![(OK, 99)],
        "nothing consumed while waiting"
    );
    s.advance(Duration::from_secs(1));
    let r = pending.await.unwrap();
    assert_eq!(r.overall_code, OK);
    let after = s.call(one("q", &[("free", "f")])).await;
    assert_eq!(codes(&after), vec![(OK, 97)]);
}

#[tokio::test]
async fn every_waiter_is_answered_at_shutdown() {
    for (mode, expect) in [("reject", OVER), ("admit", OK)] {
        let mut s = TestServer::start_with(CONFIG, &[("TURNSTILE_SHUTDOWN_WAITERS", mode)]).await;
        for _ in 0..2 {
            s.call(one("q", &[("job", "s")])).await;
        }
        let waiters = queue_up(&s, &[("job", "s")], 5).await;
        // They have waited (within the second): an admitted waiter says how long, a refused
        // one is told by its code alone.
        s.advance(Duration::from_millis(300));
        s.shutdown().await;
        for w in waiters {
            let r = tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("answered before exit")
                .unwrap();
            assert_eq!(r.overall_code, expect, "{mode}");
            let waited = header(&r, WAITED_HEADER);
            assert_eq!(waited.is_some(), expect == OK, "{mode}: {waited:?}");
        }
    }
}

/// `TURNSTILE_MAX_WAITERS` holds for the whole process: waiters gather on a hot key, so the cap
/// is one count shared by every shard, not a share of it per shard.
#[tokio::test]
async fn the_waiter_cap_is_process_wide_whatever_the_shard_count() {
    let s = TestServer::start_with(
        CONFIG,
        &[
            ("TURNSTILE_WORKERS", "2"),
            ("TURNSTILE_SHARDS", "8"),
            ("TURNSTILE_MAX_WAITERS", "4"),
        ],
    )
    .await;
    for key in ["a", "b"] {
        for _ in 0..2 {
            assert_eq!(s.call(one("q", &[("job", key)])).await.overall_code, OK);
        }
    }
    // All four places go to one hot key (a per-shard share would have been 1).
    let waiters = queue_up(&s, &[("job", "a")], 4).await;
    // The cap is reached: a waiter on any other key is refused at once.
    let r = s.call(one("q", &[("job", "b")])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(waiting(&s), 4);
    // A place freed is a place for anyone: two are admitted in the next window, and a waiter
    // on another key takes one of their places.
    s.advance(Duration::from_secs(1));
    until_waiting(&s, 2).await;
    for _ in 0..2 {
        assert_eq!(s.call(one("q", &[("job", "c")])).await.overall_code, OK);
    }
    let again = spawn_call(&s, one("q", &[("job", "c")]));
    until_waiting(&s, 3).await;
    drop(waiters);
    drop(again);
}
