//! Overload: a server whose one shard accepts one queued message at a time, hit by thousands of
//! concurrent calls. Every call is answered promptly (decided, or shed with RESOURCE_EXHAUSTED /
//! 503), none hangs, shed calls consume nothing, and no more than the limit is ever admitted.
//!
//! Calls handled on the worker that owns the shard decide synchronously and never queue, so a
//! gRPC flood on a one-worker server is never shed; calls from another thread (here `/json` on a
//! two-worker server, where the worker without the shard accepts some of the connections) go
//! through the shard's mailbox, and a full mailbox sheds them.

use std::time::{Duration, Instant};

use crate::common::*;
use tokio::task::JoinSet;
use tonic::Code;

const CONFIG: &str = r#"
domain: load
descriptors:
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

const CALLS: usize = 2000;
const MAX_WAVES: usize = 50;
const CONNECTIONS: usize = 8;
/// A liveness bound, not a latency target: a call that takes this long is stuck.
const STUCK: Duration = Duration::from_secs(5);

#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    OverLimit,
    Shed,
}

/// One worker, one shard, and a shard mailbox of one message.
async fn one_slot_server() -> TestServer {
    one_slot_server_with("1").await
}

/// One shard, with a queue of one, on a server of `workers` workers.
async fn one_slot_server_with(workers: &str) -> TestServer {
    TestServer::start_with(
        CONFIG,
        &[
            ("TURNSTILE_WORKERS", workers),
            ("TURNSTILE_SHARDS", "1"),
            ("TURNSTILE_SHARD_QUEUE", "1"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_flood_on_the_shards_worker_is_decided_exactly_and_never_shed() {
    let s = one_slot_server().await;
    let addr = format!("http://{}", s.running().grpc_addr);
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(
            envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(addr.clone())
                .await
                .expect("connects"),
        );
    }

    // Waves of concurrent calls until the limit is reached under load (the manual clock never
    // moves, so every wave counts in the same window).
    let (mut ok, mut over, mut shed) = (0u32, 0u32, 0u32);
    let mut slowest = Duration::ZERO;
    let mut waves = 0;
    while over == 0 {
        waves += 1;
        assert!(
            waves <= MAX_WAVES,
            "limit never reached: ok={ok} shed={shed}"
        );
        let mut calls = JoinSet::new();
        for i in 0..CALLS {
            let mut client = clients[i % CONNECTIONS].clone();
            calls.spawn(async move {
                let start = Instant::now();
                let r = tokio::time::timeout(
                    STUCK,
                    client.should_rate_limit(one("load", &[("tight", "k")])),
                )
                .await;
                let answer = match r {
                    Err(_) => panic!("call {i} got no answer within {STUCK:?}"),
                    Ok(Ok(resp)) => match resp.into_inner().overall_code {
                        OK => Answer::Ok,
                        OVER => Answer::OverLimit,
                        other => panic!("call {i}: unexpected overall code {other}"),
                    },
                    Ok(Err(status)) => {
                        assert_eq!(
                            status.code(),
                            Code::ResourceExhausted,
                            "call {i}: only shedding may fail a call: {status:?}"
                        );
                        Answer::Shed
                    }
                };
                (answer, start.elapsed())
            });
        }
        while let Some(r) = calls.join_next().await {
            let (answer, took) = r.expect("no call task panicked");
            slowest = slowest.max(took);
            match answer {
                Answer::Ok => ok += 1,
                Answer::OverLimit => over += 1,
                Answer::Shed => shed += 1,
            }
        }
    }
    eprintln!("overload: waves={waves} ok={ok} over_limit={over} shed={shed} slowest={slowest:?}");
    assert_eq!((ok + over + shed) as usize, CALLS * waves);
    assert_eq!(
        ok, 100,
        "exactly the limit is admitted, however many calls race for it"
    );
    // The handlers run on the shard's own worker: each decides synchronously, none queues.
    assert_eq!(shed, 0, "calls on the shard's worker are never shed");

    // Shed and refused calls consumed nothing: the next window starts from zero as usual.
    s.advance(Duration::from_secs(60));
    let r = s.call(one("load", &[("tight", "k")])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 99);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_shard_mailbox_sheds_calls_from_other_threads_fast_and_never_over_admits() {
    // Every worker serves HTTP: the second one, without the shard, sends its calls through the
    // shard's mailbox.
    let s = one_slot_server_with("2").await;
    let url = format!("http://{}/json", s.running().http_addr);
    let http = reqwest::Client::new();
    let body = r#"{"domain":"load","descriptors":[{"entries":[{"key":"tight","value":"k"}]}]}"#;
    // Each call is a connection of its own on both sides: 200 stays far below a 1024 fd limit.
    const JSON_CALLS: usize = 200;
    let (mut ok, mut over, mut shed) = (0u32, 0u32, 0u32);
    let mut waves = 0;
    while over == 0 || shed == 0 {
        waves += 1;
        assert!(
            waves <= MAX_WAVES,
            "never both over the limit and shed: ok={ok} over={over} shed={shed}"
        );
        let mut calls = JoinSet::new();
        for i in 0..JSON_CALLS {
            let (http, url) = (http.clone(), url.clone());
            calls.spawn(async move {
                let r = tokio::time::timeout(STUCK, http.post(url).body(body).send())
                    .await
                    .unwrap_or_else(|_| panic!("call {i} got no answer within {STUCK:?}"))
                    .expect("HTTP answer");
                let status = r.status().as_u16();
                let text = r.text().await.expect("body");
                match status {
                    200 => Answer::Ok,
                    429 => Answer::OverLimit,
                    503 if text.contains("overloaded") => Answer::Shed,
                    other => panic!("call {i}: unexpected {other}: {text}"),
                }
            });
        }
        while let Some(r) = calls.join_next().await {
            match r.expect("no call task panicked") {
                Answer::Ok => ok += 1,
                Answer::OverLimit => over += 1,
                Answer::Shed => shed += 1,
            }
        }
    }
    eprintln!("overload over /json: waves={waves} ok={ok} over_limit={over} shed={shed}");
    assert_eq!((ok + over + shed) as usize, JSON_CALLS * waves);
    assert_eq!(ok, 100, "exactly the limit is admitted");
    s.advance(Duration::from_secs(60));
    let r = s.call(one("load", &[("tight", "k")])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 99,
        "shed calls consumed nothing"
    );
}
