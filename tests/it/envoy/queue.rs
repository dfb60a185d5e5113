//! Through a real Envoy: turnstile's queued waiting (held then admitted, queue full, Envoy's
//! own timeout giving up on a waiter, FIFO, the shipped example's /batch), the X-RateLimit-*
//! headers of the sliding window and the token bucket, and Redis.
//!
//! The fixture (turnstile as a binary, an upstream, Envoy with a generated config) is `Stack`
//! in tests/it/common/envoy.rs. Queues only make sense in real time, so these tests use one-second
//! windows and wait for real; each test first moves to the start of a second, so that what it
//! counts happens inside one window. When the machine is so slow that a step meant to happen
//! inside one second did not, the test says why and starts over with a fresh key (at most three
//! times): that is a test that could not be carried out, not turnstile misbehaving.
//!
//! "Pending" is checked from the outside: Envoy's admin reports how many calls to turnstile are
//! in flight (`cluster.turnstile.upstream_rq_active`), and the client's task has not completed.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::envoy::*;
use crate::common::redis::Redis;
use serde_json::json;
use tokio::task::JoinHandle;

const WAITED: &str = "x-ratelimit-waited-ms";
const IN_FLIGHT: &str = "cluster.turnstile.upstream_rq_active";
const ATTEMPTS: usize = 3;
/// Envoy's ratelimit filter stats, under the cluster of the route (`upstream`).
const FAILURE_MODE_ALLOWED: &str = "cluster.upstream.ratelimit.failure_mode_allowed";
const RATELIMIT_ERROR: &str = "cluster.upstream.ratelimit.error";

// ------------------------------------------------------------------------------------------
// Helpers.

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_millis() as u64
}

fn second_now() -> u64 {
    now_ms() / 1000
}

async fn sleep_until_ms(t: u64) {
    let now = now_ms();
    if t > now {
        tokio::time::sleep(Duration::from_millis(t - now)).await;
    }
}

/// Returns at most `max_ms` into a second (waiting for the next one if need be), with that
/// second.
async fn early_in_second(max_ms: u64) -> u64 {
    let now = now_ms();
    if now % 1000 > max_ms {
        sleep_until_ms((now / 1000 + 1) * 1000 + 10).await;
    }
    second_now()
}

/// Envoy asks turnstile about domain `q`, with one descriptor `job` from the `x-job` header;
/// `tweak` changes the rest.
fn by_job(tweak: impl FnOnce(&mut EnvoyOpts)) -> EnvoyOpts {
    let mut o = EnvoyOpts::new("q", json!([{"actions": [header_action("x-job", "job")]}]));
    tweak(&mut o);
    o
}

/// GET through Envoy with `x-job: key` in a task of its own.
fn spawn_get(url: &str, key: &str) -> JoinHandle<Reply> {
    let (url, key) = (url.to_string(), key.to_string());
    tokio::spawn(async move { get(&client(), &url, &[("x-job", &key)]).await })
}

/// Waits until Envoy has `n` calls to turnstile in flight, then watches for `hold` that none of
/// `waiters` completes. A waiter completing while `second` lasts is a failure; once `second`
/// is over the check proves nothing, and Err says so (the caller starts over).
async fn confirm_pending<T>(
    envoy: &Envoy,
    waiters: &[&JoinHandle<T>],
    n: u64,
    second: u64,
    hold: Duration,
) -> Result<(), String> {
    let check = |what: &str| -> Result<(), String> {
        if second_now() != second {
            return Err(format!("second {second} ended before {what} was confirmed"));
        }
        if let Some(i) = waiters.iter().position(|w| w.is_finished()) {
            panic!(
                "waiter {} completed {what}, inside the full window {second}; it should be \
                 held in turnstile's queue",
                i + 1
            );
        }
        Ok(())
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        check("before Envoy had it in flight")?;
        if envoy.stat(IN_FLIGHT).await >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy never had {n} calls to turnstile in flight (has {})",
            envoy.stat(IN_FLIGHT).await
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let end = Instant::now() + hold;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
        check("while it should be held")?;
    }
    Ok(())
}

/// Runs `scenario` with a fresh key until it could be carried out (Ok), at most ATTEMPTS times.
async fn with_retries<F, Fut>(mut scenario: F)
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut why = Vec::new();
    for attempt in 1..=ATTEMPTS {
        match scenario(format!("k{attempt}")).await {
            Ok(()) => return,
            Err(e) => {
                eprintln!("attempt {attempt} inconclusive: {e}");
                why.push(e);
            }
        }
    }
    panic!("could not carry the test out in {ATTEMPTS} attempts: {why:?}");
}

fn waited_ms(r: &Reply) -> u64 {
    r.num(WAITED)
}

/// Fails the attempt (not the test) when `second` is over.
fn still_in(second: u64, what: &str) -> Result<(), String> {
    if second_now() == second {
        Ok(())
    } else {
        Err(format!("second {second} ended before {what}"))
    }
}

// ------------------------------------------------------------------------------------------
// Queued waiting.

const ONE_PER_SECOND_Q5: &str = "domain: q\ndescriptors:\n  - key: job\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      queue: {max_waiting: 5, max_wait: 2s}\n";

#[tokio::test]
async fn an_over_limit_request_is_held_then_admitted_in_the_next_window() {
    let stack = Stack::start(
        "held",
        &[("limits.yaml", ONE_PER_SECOND_Q5)],
        &[],
        &by_job(|o| o.timeout = "3s"),
    )
    .await;
    let url = stack.url();
    with_retries(|key| {
        let (stack, url) = (&stack, &url);
        async move {
            let s = early_in_second(100).await;
            let first = get(&client(), url, &[("x-job", &key)]).await;
            assert_status(&first, 200, "first request of the window");
            assert_eq!(first.num("x-ratelimit-remaining"), 0, "{first:#?}");
            still_in(s, "the first request was answered")?;

            let sent = now_ms();
            let second = spawn_get(url, &key);
            confirm_pending(&stack.envoy, &[&second], 1, s, Duration::from_millis(200)).await?;
            let r = tokio::time::timeout(Duration::from_secs(5), second)
                .await
                .expect("the held request is answered within 5s")
                .unwrap();
            let done = now_ms();
            assert_status(&r, 200, "held request, admitted in the next window");
            assert_eq!(r.header("x-envoy-ratelimited"), None, "{r:#?}");
            assert!(
                done >= (s + 1) * 1000,
                "admitted at {done} ms, before the window {s} ended"
            );
            let waited = waited_ms(&r);
            // It waited from its arrival to the start of the next second.
            let expected = (s + 1) * 1000 - sent;
            assert!(
                waited > 0 && waited <= expected + 50 && waited + 150 >= expected,
                "{WAITED}: {waited}, expected about {expected}: {r:#?}"
            );
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_full_queue_refuses_at_once() {
    let yaml = "domain: q\ndescriptors:\n  - key: job\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      queue: {max_waiting: 1, max_wait: 2s}\n";
    let stack = Stack::start(
        "queue_full",
        &[("limits.yaml", yaml)],
        &[],
        &by_job(|o| o.timeout = "3s"),
    )
    .await;
    let url = stack.url();
    with_retries(|key| {
        let (stack, url) = (&stack, &url);
        async move {
            let s = early_in_second(100).await;
            assert_status(
                &get(&client(), url, &[("x-job", &key)]).await,
                200,
                "first request of the window",
            );
            let waiter = spawn_get(url, &key);
            confirm_pending(&stack.envoy, &[&waiter], 1, s, Duration::from_millis(50)).await?;

            // Two more while the one place in the queue is taken: both refused at once. Sent
            // with 600 ms of the window left, so that the waiter is surely still queued when
            // they arrive (and a 200 for them means they were queued too).
            if (s + 1) * 1000 < now_ms() + 600 {
                return Err(format!("too little of second {s} left to send the two"));
            }
            let started = Instant::now();
            let (cb, cc) = (client(), client());
            let headers = [("x-job", key.as_str())];
            let (b, c) = tokio::join!(get(&cb, url, &headers), get(&cc, url, &headers));
            let took = started.elapsed();
            for (r, name) in [(&b, "second over-limit request"), (&c, "third")] {
                assert_status(r, 429, &format!("{name}, with the queue full"));
                assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:#?}");
                assert_eq!(r.header(WAITED), None, "{r:#?}");
            }
            // A refusal is answered at once; one that took half a second was either held or
            // starved by a busy machine: the attempt, not the test, is inconclusive then.
            if took >= Duration::from_millis(500) {
                return Err(format!(
                    "the refusals took {took:?}: held, or a busy machine"
                ));
            }
            assert!(!waiter.is_finished(), "the waiter is still held");

            let r = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the waiter is answered within 5s")
                .unwrap();
            assert_status(&r, 200, "the waiter, admitted in the next window");
            assert!(waited_ms(&r) > 0, "{r:#?}");
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn envoy_timeout_below_max_wait_abandons_the_waiter_which_consumes_nothing() {
    // max_waiting 1: a waiter Envoy gave up on must free its place, or the next over-limit
    // request would be refused as "queue full" (429) instead of being held.
    let yaml = "domain: q\ndescriptors:\n  - key: job\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      queue: {max_waiting: 1, max_wait: 2s}\n";
    let stack = Stack::start(
        "envoy_timeout",
        &[("limits.yaml", yaml)],
        &[],
        &by_job(|o| o.timeout = "0.1s"),
    )
    .await;
    let deny = stack
        .another_envoy(
            "envoy-deny",
            &by_job(|o| {
                o.timeout = "0.1s";
                o.failure_mode_deny = true;
            }),
        )
        .await;
    let allow_url = stack.url();
    let deny_url = format!("{}/", deny.base);
    let check = |key: &str| json!({"domain": "q", "descriptors": [{"entries": [{"key": "job", "value": key}], "hitsAddend": 0}]});
    let mut attempts = 0;
    with_retries(|key| {
        attempts += 1;
        let (stack, deny, allow_url, deny_url) = (&stack, &deny, &allow_url, &deny_url);
        let check = check(&key);
        async move {
            let s = early_in_second(100).await;
            // Fill the window straight at turnstile: Envoy's 100 ms would be a needless risk.
            let fill = stack
                .json(json!({"domain": "q", "descriptors": [{"entries": [{"key": "job", "value": key}]}]}))
                .await;
            assert_eq!(fill["overallCode"], "OK", "{fill}");

            // failure_mode_deny: false. turnstile holds the request; Envoy gives up after
            // 100 ms and lets it through, unlimited.
            let started = Instant::now();
            let allowed_before = stack.envoy.stat(FAILURE_MODE_ALLOWED).await;
            let r = get(&client(), allow_url, &[("x-job", &key)]).await;
            let took = started.elapsed();
            still_in(s, "the fail-open request came back")?;
            assert_status(&r, 200, "Envoy's timeout with failure_mode_deny: false");
            assert_eq!(r.header("x-ratelimit-remaining"), None, "{r:#?}");
            assert_eq!(r.header(WAITED), None, "{r:#?}");
            // Held rather than answered at once (an answer takes a few ms); Envoy's own 100 ms timer
            // may fire a little early as the client measures it, so no tighter bound.
            assert!(took >= Duration::from_millis(50), "took {took:?}");
            assert_eq!(
                stack.envoy.stat(FAILURE_MODE_ALLOWED).await,
                allowed_before + 1,
                "Envoy counts it as failure_mode_allowed"
            );

            // failure_mode_deny: true: the same, refused with status_on_error (500). Being held
            // (not refused as queue full) shows the first waiter left the queue.
            let started = Instant::now();
            let errors_before = deny.stat(RATELIMIT_ERROR).await;
            let r = get(&client(), deny_url, &[("x-job", &key)]).await;
            let took = started.elapsed();
            still_in(s, "the fail-closed request came back")?;
            assert_status(&r, 500, "Envoy's timeout with failure_mode_deny: true");
            // Held rather than answered at once (an answer takes a few ms); Envoy's own 100 ms timer
            // may fire a little early as the client measures it, so no tighter bound.
            assert!(took >= Duration::from_millis(50), "took {took:?}");
            assert_eq!(
                deny.stat(RATELIMIT_ERROR).await,
                errors_before + 1,
                "Envoy counts it as a ratelimit error"
            );

            // Into the next window, past the moment a waiter left behind would be admitted:
            // nothing was consumed there, so the whole limit is left.
            sleep_until_ms((s + 1) * 1000 + 300).await;
            let seen = stack.json(check).await;
            assert_eq!(seen["overallCode"], "OK", "{seen}");
            assert_eq!(
                seen["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0),
                1,
                "abandoned waiters must consume nothing in window {}: {seen}",
                s + 1
            );
            Ok(())
        }
    })
    .await;
    assert_eq!(stack.upstream.hits(), attempts, "only the fail-open ones");
}

#[tokio::test]
async fn waiters_are_admitted_first_come_first_served_one_per_window() {
    let yaml = "domain: q\ndescriptors:\n  - key: job\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      queue: {max_waiting: 5, max_wait: 5s}\n";
    let stack = Stack::start(
        "fifo",
        &[("limits.yaml", yaml)],
        &[],
        &by_job(|o| o.timeout = "6s"),
    )
    .await;
    let url = stack.url();
    with_retries(|key| {
        let (stack, url) = (&stack, &url);
        async move {
            let s = early_in_second(100).await;
            assert_status(
                &get(&client(), url, &[("x-job", &key)]).await,
                200,
                "first request of the window",
            );
            // Three waiters, each sent once the previous one is held.
            let order = Arc::new(AtomicUsize::new(0));
            let mut waiters: Vec<JoinHandle<(usize, u64, Reply)>> = Vec::new();
            for i in 0..3u64 {
                let (url, key, order) = (url.clone(), key.clone(), order.clone());
                waiters.push(tokio::spawn(async move {
                    let r = get(&client(), &url, &[("x-job", &key)]).await;
                    (order.fetch_add(1, Ordering::SeqCst), now_ms(), r)
                }));
                let all: Vec<_> = waiters.iter().collect();
                confirm_pending(&stack.envoy, &all, i + 1, s, Duration::ZERO).await?;
            }
            let mut done = Vec::new();
            for w in waiters {
                done.push(
                    tokio::time::timeout(Duration::from_secs(8), w)
                        .await
                        .expect("every waiter is answered")
                        .unwrap(),
                );
            }
            let seconds: Vec<u64> = done.iter().map(|(_, at, _)| at / 1000 - s).collect();
            let completion: Vec<usize> = done.iter().map(|(n, _, _)| *n).collect();
            for (i, (_, _, r)) in done.iter().enumerate() {
                assert_status(r, 200, &format!("waiter {}", i + 1));
            }
            assert_eq!(
                completion,
                vec![0, 1, 2],
                "waiters must complete in the order they arrived"
            );
            assert_eq!(
                seconds,
                vec![1, 2, 3],
                "one waiter per window, in the windows after {s}"
            );
            let waited: Vec<u64> = done.iter().map(|(_, _, r)| waited_ms(r)).collect();
            assert!(
                waited[0] < waited[1] && waited[1] < waited[2] && waited[2] > 2000,
                "{WAITED}: {waited:?}"
            );
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn shipped_example_batch_path_queues_instead_of_refusing() {
    let stack = Stack::shipped_example("example_batch").await;
    let (envoy, upstream) = (&stack.envoy, &stack.upstream);
    let url = format!("{}/batch/", envoy.base);
    // examples/envoy/turnstile.yaml: 5 a second, burst 1, queued up to 800 ms. Four at once:
    // the one token lets one through, the other three get the tokens of the next 200, 400 and
    // 600 ms instead of a 429.
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let r = get(&client(), &url, &[]).await;
                (started.elapsed(), r)
            })
        })
        .collect();
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    done.sort_by_key(|(at, _)| *at);
    for (at, r) in &done {
        assert_status(r, 200, &format!("/batch request answered after {at:?}"));
    }
    let waited: Vec<Option<&str>> = done.iter().map(|(_, r)| r.header(WAITED)).collect();
    assert_eq!(waited[0], None, "the first takes the token: {waited:?}");
    assert!(waited[1..].iter().all(Option::is_some), "{waited:?}");
    let at: Vec<u128> = done.iter().map(|(at, _)| at.as_millis()).collect();
    for k in 1..4 {
        assert!(
            at[k] + 60 >= at[0] + 200 * k as u128,
            "one token each 200 ms: answered at {at:?} ms"
        );
    }
    // The last waiter's token comes 600 ms after the first's: measured from the first answer
    // (not from the send, which a busy machine may delay), within its 800 ms max_wait.
    assert!(at[3] - at[0] < 800, "answered at {at:?} ms");
    assert_eq!(upstream.hits(), 4);
}

// ------------------------------------------------------------------------------------------
// X-RateLimit-* for the other algorithms.

#[tokio::test]
async fn sliding_window_headers_and_the_previous_window_weighing_in() {
    let yaml = "domain: q\ndescriptors:\n  - key: job\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window}\n  - key: minute\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}\n";
    let stack = Stack::start(
        "sliding",
        &[("limits.yaml", yaml)],
        &[],
        &by_job(|o| {
            o.vhost_rate_limits = json!([
                {"actions": [header_action("x-job", "job")]},
                {"actions": [header_action("x-minute", "minute")]}
            ]);
        }),
    )
    .await;
    let url = stack.url();
    let c = client();

    // A minute window: Limit "3, 3;w=60", Reset to the end of the aligned minute.
    clear_of_window_edge(MINUTE, 10).await;
    for remaining in [2u64, 1, 0] {
        let r = get(&c, &url, &[("x-minute", "m")]).await;
        assert_status(&r, 200, &format!("minute request, {remaining} left"));
        assert_eq!(r.header("x-ratelimit-limit"), Some("3, 3;w=60"), "{r:#?}");
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
        assert_reset_near(&r, "x-ratelimit-reset", MINUTE);
    }
    let r = get(&c, &url, &[("x-minute", "m")]).await;
    assert_status(&r, 429, "4th minute request");
    assert_eq!(r.num("x-ratelimit-remaining"), 0, "{r:#?}");
    // A refusal is told when the estimate lets it in: the minute's end, plus the 20 s the three
    // hits take to weigh two.
    let (reset, want) = (r.num("x-ratelimit-reset"), secs_to_window_end(MINUTE) + 20);
    assert!(
        reset.abs_diff(want) <= 2,
        "x-ratelimit-reset {reset}, expected about {want}"
    );

    // A second window: fill it, then 300 ms into the next one the previous window's 10 still
    // weigh about 70%: Remaining = 10 - ceil(10 × share left) - 1, not 9.
    with_retries(|key| {
        let (c, url) = (&c, &url);
        async move {
            let s = early_in_second(100).await;
            for remaining in (0..10u64).rev() {
                let r = get(c, url, &[("x-job", &key)]).await;
                assert_status(&r, 200, &format!("request with {remaining} left"));
                assert_eq!(r.header("x-ratelimit-limit"), Some("10, 10;w=1"), "{r:#?}");
                assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
                assert_eq!(r.num("x-ratelimit-reset"), 1, "{r:#?}");
            }
            let r = get(c, url, &[("x-job", &key)]).await;
            still_in(s, "the window was filled")?;
            assert_status(&r, 429, "11th request of the second");
            assert_eq!(r.num("x-ratelimit-remaining"), 0, "{r:#?}");

            sleep_until_ms((s + 1) * 1000 + 300).await;
            let before = now_ms();
            let r = get(c, url, &[("x-job", &key)]).await;
            let after = now_ms();
            still_in(s + 1, "the request in the next window came back")?;
            // Elapsed share of window s+1 is between these two (ms); weighted = ceil(10 × rest).
            let weighted = |at: u64| (1000 - (at - (s + 1) * 1000)).div_ceil(100);
            let (lo, hi) = (10 - weighted(before) - 1, 10 - weighted(after + 1) - 1);
            assert_status(&r, 200, "first request of the next second");
            let remaining = r.num("x-ratelimit-remaining");
            assert!(
                (lo..=hi).contains(&remaining),
                "x-ratelimit-remaining {remaining}, expected {lo}..={hi} (a fixed window says 9)"
            );
            assert_eq!(r.header("x-ratelimit-limit"), Some("10, 10;w=1"), "{r:#?}");
            assert_eq!(r.num("x-ratelimit-reset"), 1, "{r:#?}");
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn token_bucket_headers_count_whole_tokens_and_time_to_full() {
    // One token a second, a bucket of 3.
    let yaml = "domain: q\ndescriptors:\n  - key: job\n    rate_limit: {unit: minute, requests_per_unit: 60, burst: 3, algorithm: token_bucket}\n";
    let stack = Stack::start("bucket", &[("limits.yaml", yaml)], &[], &by_job(|_| {})).await;
    let url = stack.url();
    let url = &url;
    // Calls that reached the upstream, over every attempt.
    let hits = std::cell::Cell::new(0);
    let hits = &hits;
    // The numbers below hold when the burst takes well under a second and the later request
    // comes 1.2 s after it; on a machine too busy for that, the attempt is inconclusive and
    // is made again on a fresh key.
    with_retries(|key| async move {
        {
            let headers = [("x-job", key.as_str())];
            let c = client();
            let first = Instant::now();
            // (remaining, reset): each request takes a token and adds a second until full.
            let mut burst = Vec::new();
            for _ in 0..4 {
                burst.push(get(&c, url, &headers).await);
            }
            hits.set(hits.get() + burst.iter().filter(|r| r.status == 200).count());
            if first.elapsed() >= Duration::from_millis(800) {
                return Err(format!("the burst took {:?}", first.elapsed()));
            }
            for (r, (remaining, reset)) in burst.iter().zip([(2u64, 1u64), (1, 2), (0, 3)]) {
                assert_status(r, 200, &format!("request with {remaining} tokens left"));
                assert_eq!(r.header("x-ratelimit-limit"), Some("60, 60;w=60"), "{r:#?}");
                assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
                assert_eq!(r.num("x-ratelimit-reset"), reset, "{r:#?}");
            }
            let r = &burst[3];
            assert_status(r, 429, "4th request, bucket empty");
            assert_eq!(r.num("x-ratelimit-remaining"), 0, "{r:#?}");
            // A refusal is told when its token comes back: within the second.
            assert_eq!(r.num("x-ratelimit-reset"), 1, "{r:#?}");

            // 1.2 s later the bucket holds 1.2 tokens: one request passes and leaves 0 whole
            // tokens (0.2), 2.8 s from full; the next is refused.
            tokio::time::sleep_until((first + Duration::from_millis(1200)).into()).await;
            let one = get(&c, url, &headers).await;
            let next = get(&c, url, &headers).await;
            hits.set(hits.get() + usize::from(one.status == 200));
            if first.elapsed() >= Duration::from_millis(1900) {
                return Err(format!(
                    "the later requests came {:?} after",
                    first.elapsed()
                ));
            }
            assert_status(&one, 200, "one token back after 1.2 s");
            assert_eq!(one.num("x-ratelimit-remaining"), 0, "{one:#?}");
            assert_eq!(one.num("x-ratelimit-reset"), 3, "{one:#?}");
            assert_status(&next, 429, "0.2 tokens are not a request");
            assert_eq!(next.num("x-ratelimit-remaining"), 0, "{next:#?}");
            Ok(())
        }
    })
    .await;
    assert_eq!(stack.upstream.hits(), hits.get());
}

// ------------------------------------------------------------------------------------------
// Redis.

#[tokio::test]
async fn redis_backend_behind_envoy_counts_in_envoyproxy_ratelimit_keys() {
    let redis = Redis::start();
    let url = redis.url();
    let yaml = "domain: q\ndescriptors:\n  - key: job\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let env = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", url.as_str()),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0"),
        ("TURNSTILE_REDIS_DEADLINE_MS", "2000"),
    ];
    let stack = Stack::start("redis", &[("limits.yaml", yaml)], &env, &by_job(|_| {})).await;
    let c = client();
    clear_of_window_edge(HOUR, 120).await;
    let window_start = unix_now() / HOUR * HOUR;

    for remaining in [1u64, 0] {
        let r = get(&c, &stack.url(), &[("x-job", "alice")]).await;
        assert_status(&r, 200, &format!("request with {remaining} left"));
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
    }
    let r = get(&c, &stack.url(), &[("x-job", "alice")]).await;
    assert_status(&r, 429, "3rd request, over the limit of 2");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:#?}");
    assert_eq!(stack.upstream.hits(), 2);

    // envoyproxy/ratelimit's layout: domain_key_value_<window start in seconds>.
    let key = format!("q_job_alice_{window_start}");
    assert_eq!(
        redis.cli(&["GET", &key]),
        "2",
        "the refused hit is not counted; keys: {}",
        redis.cli(&["KEYS", "*"])
    );
    let ttl: i64 = redis.cli(&["TTL", &key]).parse().unwrap();
    assert!((1..=3600).contains(&ttl), "TTL {ttl}");

    // The count lives in Redis: another turnstile behind another Envoy, same Redis, refuses.
    let other = Stack::start("redis-2", &[("limits.yaml", yaml)], &env, &by_job(|_| {})).await;
    let envoy2 = &other.envoy;
    let r = get(&c, &format!("{}/", envoy2.base), &[("x-job", "alice")]).await;
    assert_status(&r, 429, "the second replica sees the count in Redis");
    let r = get(&c, &format!("{}/", envoy2.base), &[("x-job", "bob")]).await;
    assert_status(&r, 200, "another key");
    assert_eq!(
        redis.cli(&["GET", &format!("q_job_bob_{window_start}")]),
        "1"
    );
}
