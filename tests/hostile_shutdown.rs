//! SIGTERM under load, on the real binary: hundreds of queued waiters and thousands of calls in
//! flight. Every call gets an answer and the process exits 0 long before the waiters' max_wait.
//!
//! What counts as answered:
//! - a `RateLimitResponse` (OK or OVER_LIMIT): the call was decided. Every queued waiter must end
//!   this way: at shutdown the shards answer their waiters (refused, as
//!   `TURNSTILE_SHUTDOWN_WAITERS` defaults to `reject`), so none of them may see an error;
//! - the gRPC status UNAVAILABLE: the call was not taken in, because the listener had closed
//!   (connection refused), the server's HTTP/2 GOAWAY refused the stream, or the engine had
//!   stopped. The call was not counted, it is safe to retry, and Envoy applies
//!   `failure_mode_deny` to it, which is the contract of a stopping rate limiter;
//! - CANCELLED from the client's own transport for a call it never wrote to the wire, because
//!   the connection closed first (see `never_sent`): the same as a refused connection;
//! - INTERNAL carrying the server's graceful GOAWAY (NO_ERROR) for a stream above the last one
//!   the server took in, or opened after it (see `refused_by_goaway`): HTTP/2 says it was not
//!   processed; only tonic's mapping makes it INTERNAL rather than UNAVAILABLE.
//!
//! Anything else (UNKNOWN, INTERNAL, CANCELLED, a reset stream, or no answer within the liveness
//! bound) is a call lost by the shutdown, and fails the test.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tempdir::TempDir;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// `waiter` admits 400 a day; the next 400 callers queue for the next day (max_wait 24h covers
/// it, and the next day has room for exactly 400, so they are queued rather than refused). Only
/// shutdown can answer them during the test.
const CONFIG: &str = r#"
domain: stop
descriptors:
  - key: waiter
    rate_limit:
      unit: day
      requests_per_unit: 400
      queue: {max_waiting: 400, max_wait: 24h}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 50}
"#;

const ADMITTED: usize = 400;
const WAITERS: usize = 400;
/// Concurrent callers, each sending calls back to back until the server is gone.
const LANES: usize = 2000;
const CONNECTIONS: usize = 16;
/// Liveness bound for one call: a call this old is stuck.
const STUCK: Duration = Duration::from_secs(30);
/// The process must be gone this soon after SIGTERM (max_wait is 24h; the grace period 10 s).
const EXIT_WITHIN: Duration = Duration::from_secs(15);

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "stop".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

struct Server {
    child: Child,
    grpc: String,
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only if the test failed before the process exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    let dir = TempDir::new("hostile-shutdown");
    let config = dir.write("config.yaml", CONFIG);
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env_clear()
        .env("TURNSTILE_WORKERS", "2")
        .env("TURNSTILE_SHARDS", "4")
        .env("LOG_LEVEL", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("reads the ready line");
    let grpc = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .unwrap_or_else(|| panic!("no grpc= in {line:?}"))
        .to_owned();
    Server {
        child,
        grpc: format!("http://{grpc}"),
        _dir: dir,
    }
}

/// One call with the liveness bound; `Err` carries the status of an unanswered-by-decision call.
async fn call(
    mut client: RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> Result<i32, tonic::Status> {
    match tokio::time::timeout(STUCK, client.should_rate_limit(r)).await {
        Ok(r) => r.map(|r| r.into_inner().overall_code),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "no answer within the liveness bound",
        )),
    }
}

const OK: i32 = 1;
const OVER: i32 = 2;

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    over: AtomicU64,
    /// UNAVAILABLE sent by the server itself (the engine had stopped).
    unavailable_server: AtomicU64,
    /// UNAVAILABLE from the transport: refused connection or GOAWAY-refused stream.
    unavailable_transport: AtomicU64,
    /// CANCELLED by the client's own HTTP/2 connection before the call was written (see
    /// [`never_sent`]).
    never_sent: AtomicU64,
    /// Refused by the server's GOAWAY (see [`refused_by_goaway`]).
    goaway: AtomicU64,
}

fn source_of(s: &tonic::Status) -> String {
    use std::error::Error as _;
    s.source().map(|e| format!("{e:?}")).unwrap_or_default()
}

/// hyper's client hands a call it had not yet written to the wire back as `Canceled`
/// ("connection closed") when the connection ends under it (here: after the server's GOAWAY and
/// close); tonic reports that as CANCELLED. The server never saw the call, so it is the same
/// answer as a refused connection. A call that was sent and then lost fails differently (a reset
/// stream or a broken connection: UNKNOWN or INTERNAL), and fails the test.
/// hyper says "connection was not ready" when the call is dispatched onto a connection that is
/// already closing: it is not written either.
fn never_sent(s: &tonic::Status) -> bool {
    let source = source_of(s);
    s.code() == Code::Cancelled
        && source.contains("Canceled")
        && (source.contains("connection closed") || source.contains("connection was not ready"))
}

/// A graceful stop sends GOAWAY (NO_ERROR) naming the last stream the server took in. h2 fails
/// the client's streams above it, and any stream opened after it, with that GOAWAY as the error
/// (`GoAway(.., NO_ERROR, Remote)`); RFC 9113 §6.8 says such streams were not processed and are
/// safe to retry. tonic reports that as INTERNAL ("h2 protocol error"), where the gRPC HTTP/2
/// mapping says UNAVAILABLE; either way the server never saw the call. A stream the server did
/// take in and then lost would end as a broken pipe or a reset instead, and fail the test.
fn refused_by_goaway(s: &tonic::Status) -> bool {
    let source = source_of(s);
    s.code() == Code::Internal && source.contains("GoAway(") && source.contains("NO_ERROR, Remote")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_answers_every_call_and_exits_zero() {
    let mut server = start();
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(
            RateLimitServiceClient::connect(server.grpc.clone())
                .await
                .expect("connects"),
        );
    }
    let client = |i: usize| clients[i % CONNECTIONS].clone();

    // The day's 400 admissions, then 400 waiters.
    let mut admitted = JoinSet::new();
    for i in 0..ADMITTED {
        admitted.spawn(call(client(i), request("waiter", "w")));
    }
    while let Some(r) = admitted.join_next().await {
        assert_eq!(r.expect("task").expect("answered"), OK);
    }
    let mut waiters = JoinSet::new();
    for i in 0..WAITERS {
        waiters.spawn(call(client(i), request("waiter", "w")));
    }
    // Once 400 wait (the queue is full, and the next day is taken), a newcomer is refused at
    // once. Probes tell when: a probe answered within a moment found the queue full; one that is
    // not answered has queued, and stays as one more waiter. A waiter that found the queue full
    // because probes came first was refused at once: a decision, which the tally allows for.
    let deadline = Instant::now() + STUCK;
    let mut sent = WAITERS;
    loop {
        assert!(Instant::now() < deadline, "the queue never filled");
        let mut probe = tokio::spawn(call(client(sent), request("waiter", "w")));
        sent += 1;
        match tokio::time::timeout(Duration::from_millis(100), &mut probe).await {
            Ok(r) => {
                assert_eq!(r.expect("probe task").expect("answered"), OVER);
                break;
            }
            Err(_) => {
                waiters.spawn(async move { probe.await.expect("probe task") });
            }
        }
    }
    let mut refused_early = 0;
    while let Some(r) = waiters.try_join_next() {
        assert_eq!(r.expect("waiter task").expect("answered"), OVER);
        refused_early += 1;
    }
    let queued = waiters.len();
    assert!(queued >= WAITERS, "only {queued} waiters queued");

    // Thousands of lanes, each calling back to back until the server stops answering.
    let tally = Arc::new(Tally::default());
    let mut lanes = JoinSet::new();
    for i in 0..LANES {
        let c = client(i);
        let tally = tally.clone();
        lanes.spawn(async move {
            for n in 0u64.. {
                let r = if i % 4 == 0 {
                    request("tight", &format!("t{}", i % 8))
                } else {
                    request("plain", &format!("p{}", (i as u64 + n) % 64))
                };
                match call(c.clone(), r).await {
                    Ok(OK) => tally.ok.fetch_add(1, Ordering::Relaxed),
                    Ok(OVER) => tally.over.fetch_add(1, Ordering::Relaxed),
                    Ok(other) => panic!("lane {i}: unexpected overall code {other}"),
                    Err(s) if s.code() == Code::Unavailable => {
                        if s.message() == "rate limiter unavailable" {
                            tally.unavailable_server.fetch_add(1, Ordering::Relaxed);
                        } else {
                            tally.unavailable_transport.fetch_add(1, Ordering::Relaxed);
                        }
                        return;
                    }
                    Err(s) if never_sent(&s) => {
                        tally.never_sent.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Err(s) if refused_by_goaway(&s) => {
                        tally.goaway.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Err(s) => panic!("lane {i}: call {n} was not answered: {s:?}"),
                };
            }
        });
    }
    // Let the load build up, then stop the server under it.
    let decided = || tally.ok.load(Ordering::Relaxed) + tally.over.load(Ordering::Relaxed);
    let deadline = Instant::now() + STUCK;
    while decided() < 5 * LANES as u64 {
        assert!(Instant::now() < deadline, "load never built up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = decided();
    let pid = server.child.id().to_string();
    let killed = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(status.success());

    // Every waiter is answered, by a decision.
    let mut refused_waiters = 0;
    while let Some(r) = waiters.join_next().await {
        match r.expect("waiter task") {
            Ok(OVER) => refused_waiters += 1,
            other => panic!("a waiter must be refused at shutdown, got {other:?}"),
        }
    }
    assert_eq!(refused_waiters, queued);
    assert_eq!(
        queued + refused_early + 1,
        sent,
        "every waiter and probe answered"
    );
    // Every lane ends with an answer (a panic in a lane is a lost call).
    while let Some(r) = lanes.join_next().await {
        r.expect("every call of the lane was answered");
    }
    // The process is gone, with 0, well before any waiter's max_wait.
    let exit = loop {
        if let Some(s) = server.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            killed.elapsed() < EXIT_WITHIN,
            "still running after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = killed.elapsed();
    assert!(exit.success(), "exit status {exit:?}");
    assert!(took < EXIT_WITHIN);
    let t = &tally;
    eprintln!(
        "shutdown: waiters queued at SIGTERM={queued} (all refused at drain); lanes={LANES}; \
         decided={} (ok={} over={}) of which {} after SIGTERM; unavailable server={} \
         transport={}; never sent={}; refused by GOAWAY={}; exited 0 after {took:?}",
        decided(),
        t.ok.load(Ordering::Relaxed),
        t.over.load(Ordering::Relaxed),
        decided() - before,
        t.unavailable_server.load(Ordering::Relaxed),
        t.unavailable_transport.load(Ordering::Relaxed),
        t.never_sent.load(Ordering::Relaxed),
        t.goaway.load(Ordering::Relaxed),
    );
    assert_eq!(
        t.unavailable_server.load(Ordering::Relaxed)
            + t.unavailable_transport.load(Ordering::Relaxed)
            + t.never_sent.load(Ordering::Relaxed)
            + t.goaway.load(Ordering::Relaxed),
        LANES as u64,
        "each lane ends on exactly one call the server did not take in"
    );
}
