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

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::layout;
use crate::common::tempdir::TempDir;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
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
  - key: slow
    rate_limit:
      unit: day
      requests_per_unit: 1000
      queue: {max_waiting: 1000, max_wait: 24h}
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
    crate::common::one("stop", &[(key, value)])
}

struct Server {
    child: Child,
    grpc: String,
    /// turnstile's own series on the debug port (on an OS-chosen port unless a test says).
    metrics: Option<String>,
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
    start_with(&[])
}

fn start_with(env: &[(&str, &str)]) -> Server {
    let dir = TempDir::new("hostile-shutdown");
    let config = dir.write("config.yaml", CONFIG);
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env_clear()
        .env("TURNSTILE_WORKERS", layout().0.to_string())
        .env("TURNSTILE_SHARDS", layout().1.to_string())
        .env("LOG_LEVEL", "warn")
        // Off the fixed debug and Prometheus ports (6070, 9090), which parallel tests share.
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .env("PROMETHEUS_ADDR", "127.0.0.1:0")
        .envs(env.iter().copied())
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
    let metrics = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("debug="))
        .filter(|m| *m != "off")
        .map(|m| format!("http://{m}/metrics"));
    Server {
        child,
        grpc: format!("http://{grpc}"),
        metrics,
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

/// A connection that reads slowly: at most 4 KiB every 5 ms, through a 16 KiB receive buffer
/// (SO_RCVBUF), as a loaded Envoy might.
struct SlowReader {
    io: tokio::net::TcpStream,
    next: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl tokio::io::AsyncRead for SlowReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        if let Some(sleep) = self.next.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        let mut small = [0u8; 4096];
        let want = buf.remaining().min(small.len());
        let mut limited = tokio::io::ReadBuf::new(&mut small[..want]);
        match std::pin::Pin::new(&mut self.io).poll_read(cx, &mut limited) {
            Poll::Ready(Ok(())) => {
                buf.put_slice(limited.filled());
                self.next = Some(Box::pin(tokio::time::sleep(Duration::from_millis(5))));
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl tokio::io::AsyncWrite for SlowReader {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A gRPC frame (no compression) of `r`, as the body of one call.
fn grpc_body(r: &RateLimitRequest) -> bytes::Bytes {
    use prost::Message as _;
    let msg = r.encode_to_vec();
    let mut b = Vec::with_capacity(5 + msg.len());
    b.push(0);
    b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(&msg);
    b.into()
}

/// One call on the raw connection: Ok((grpc-status, the decoded answer if one came)) once its
/// trailers arrive.
async fn raw_call(
    mut send: h2::client::SendRequest<bytes::Bytes>,
    addr: &str,
    body: bytes::Bytes,
) -> Result<(String, Option<RateLimitResponse>), String> {
    let req = http::Request::post(format!(
        "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    send = send.ready().await.map_err(|e| format!("ready: {e}"))?;
    let (response, mut stream) = send
        .send_request(req, false)
        .map_err(|e| format!("send: {e}"))?;
    stream
        .send_data(body, true)
        .map_err(|e| format!("data: {e}"))?;
    let response = response.await.map_err(|e| format!("response: {e}"))?;
    let (head, mut body) = response.into_parts();
    if let Some(status) = head.headers.get("grpc-status") {
        return Ok((status.to_str().unwrap_or("?").to_owned(), None));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("body: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    // One gRPC frame: flag, length, the message.
    let answer = if bytes.len() >= 5 {
        use prost::Message as _;
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        let msg = bytes.get(5..5 + len).ok_or("a short frame")?;
        Some(RateLimitResponse::decode(msg).map_err(|e| format!("decode: {e}"))?)
    } else {
        None
    };
    let trailers = body
        .trailers()
        .await
        .map_err(|e| format!("trailers: {e}"))?;
    let status = trailers
        .and_then(|t| {
            t.get("grpc-status")
                .map(|v| v.to_str().unwrap_or("?").to_owned())
        })
        .ok_or_else(|| "no grpc-status".to_owned())?;
    Ok((status, answer))
}

/// SIGTERM while a client that reads slowly holds 1000 queued waiters on one connection: the
/// server answers them all, keeps the connection open (reading and discarding) until the
/// client has read every answer and closed, and exits 0 within the grace period.
#[tokio::test]
async fn a_slow_reader_gets_every_answer_at_sigterm() {
    const CALLS: usize = 1000;
    let mut server = start_with(&[
        ("TURNSTILE_SHUTDOWN_GRACE_SECONDS", "5"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ]);
    let addr = server.grpc.trim_start_matches("http://").to_owned();
    // Fill the day: every later call on `slow` queues for the next one.
    let mut fill = request("slow", "s");
    fill.hits_addend = 1000;
    let client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    assert_eq!(call(client.clone(), fill).await.unwrap(), OK);

    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(16 << 10).unwrap();
    socket
        .connect(&addr.parse::<std::net::SocketAddr>().unwrap().into())
        .unwrap();
    socket.set_nonblocking(true).unwrap();
    let tcp = tokio::net::TcpStream::from_std(socket.into()).unwrap();
    // HTTP/2's default windows (64 KiB): the client acknowledges what it reads with
    // WINDOW_UPDATEs all along, and the answers the window lets through pile up in the kernel.
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(64 << 10)
        .initial_connection_window_size(64 << 10)
        // A thousand answers at once is not a flood here: h2's guard against many small DATA
        // frames would otherwise close the connection on its own side.
        .data_frame_budget(1 << 30)
        .handshake::<_, bytes::Bytes>(SlowReader {
            io: tcp,
            next: None,
        })
        .await
        .unwrap();
    let conn = tokio::spawn(connection);
    // Answers of about a kilobyte (a status per descriptor), so the last of them are still in
    // flight, and the client still acknowledging them, when the server is done.
    let mut big = request("slow", "s");
    for i in 0..40 {
        big.descriptors
            .push(request("plain", &format!("p{i}")).descriptors.remove(0));
    }
    let body = grpc_body(&big);
    let mut calls = JoinSet::new();
    for _ in 0..CALLS {
        let addr = addr.clone();
        let (send, body) = (send.clone(), body.clone());
        calls.spawn(async move { raw_call(send, &addr, body).await });
    }
    // Wait until every call is queued (the waiting gauge of the debug port).
    let deadline = Instant::now() + STUCK;
    let metrics = server.metrics.clone().expect("metrics port");
    loop {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        let waiting: u64 = text
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_queue_waiting{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if waiting >= CALLS as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "only {waiting} waiters queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    let killed = Instant::now();
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // Every waiter is answered, and refused (TURNSTILE_SHUTDOWN_WAITERS defaults to reject):
    // OVER_LIMIT on `slow`, its 40 other descriptors within their limits.
    let mut answered = 0;
    let mut lost = Vec::new();
    while let Some(r) = calls.join_next().await {
        match r.unwrap() {
            Ok((status, Some(a))) if status == "0" => {
                let slow = a.statuses.first().map(|s| s.code);
                if a.overall_code == OVER && slow == Some(OVER) && a.statuses.len() == 41 {
                    answered += 1;
                } else {
                    let n = a.statuses.len();
                    let overall = a.overall_code;
                    lost.push(format!("overall {overall}, slow {slow:?}, {n} statuses"));
                }
            }
            Ok((status, _)) => lost.push(format!("grpc-status {status}")),
            Err(e) => lost.push(e),
        }
    }
    drop(send);
    let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
    let status = server.child.wait().unwrap();
    assert!(
        lost.is_empty(),
        "{} of {CALLS} lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
    assert_eq!(answered, CALLS);
    assert!(status.success(), "exit: {status:?}");
    // The grace (5 s) ends the process whatever is left; twice the grace only catches a
    // process that hangs, not a busy machine.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "exited once the grace period was over"
    );
}
