//! The direct transports: ThrottleCrab's `THROTTLE` over RESP (redis-cli, the `redis` crate, raw
//! sockets) and `POST /throttle`, against the real server with its manual clock.

mod common;

use std::io;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use bytes::BytesMut;
use common::*;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use turnstile::service::ThrottleLimits;
use turnstile::transport::resp::{self, RespSettings};

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
        let task = tokio::spawn(resp::serve(
            listener,
            s.running().limiter.clone(),
            settings,
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

/// ThrottleCrab's GCRA, written out on its own: a token every `period / count`, at most `burst`
/// held; `tat` is when the bucket is full again. Answers `[allowed, limit, remaining,
/// retry_after, reset_after]`, times rounded up to whole seconds.
struct Model {
    tat: u64,
    burst: u64,
    interval: u64,
}

impl Model {
    fn new(burst: u64, count: u64, period_s: u64) -> Model {
        Model {
            tat: 0,
            burst,
            interval: period_s * 1_000_000_000 / count,
        }
    }

    fn call(&mut self, now: u64, quantity: u64) -> Vec<i64> {
        let secs = |ns: u64| ns.div_ceil(1_000_000_000) as i64;
        let full = self.interval * self.burst;
        let from = self.tat.max(now);
        let after = from + self.interval * quantity;
        if after - now <= full {
            self.tat = after;
            let left = (full - (after - now)) / self.interval;
            vec![1, self.burst as i64, left as i64, 0, secs(after - now)]
        } else {
            let left = (full - (from - now)) / self.interval;
            let retry = after - full - now;
            vec![
                0,
                self.burst as i64,
                left as i64,
                secs(retry),
                secs(from - now),
            ]
        }
    }
}

#[tokio::test]
async fn allow_deny_and_refill_follow_gcra() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    // 10 per 60 s is a token every 6 s; the bucket holds 3.
    let mut got = Vec::new();
    for _ in 0..4 {
        let v: Vec<i64> = throttle_cmd("gcra", 3, 10, 60, 1)
            .query_async(&mut con)
            .await
            .unwrap();
        got.push(v);
    }
    assert_eq!(
        got,
        vec![
            vec![1, 3, 2, 0, 6],
            vec![1, 3, 1, 0, 12],
            vec![1, 3, 0, 0, 18],
            vec![0, 3, 0, 6, 18],
        ]
    );
    // Refill without sleeping: 6 s bring one token back, and only one.
    r.s.advance(Duration::from_secs(6));
    let v: Vec<i64> = throttle_cmd("gcra", 3, 10, 60, 1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, vec![1, 3, 0, 0, 18]);
    // A refused quantity reports the tokens there are now; quantity 0 asks without taking.
    r.s.advance(Duration::from_secs(12));
    let v: Vec<i64> = throttle_cmd("gcra", 3, 10, 60, 3)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, vec![0, 3, 2, 6, 6]);
    let v: Vec<i64> = throttle_cmd("gcra", 3, 10, 60, 0)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, vec![1, 3, 2, 0, 6]);
    // Without a quantity, one is taken.
    let v: Vec<i64> = ::redis::cmd("THROTTLE")
        .arg("gcra")
        .arg(3)
        .arg(10)
        .arg(60)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, vec![1, 3, 1, 0, 12]);
}

#[tokio::test]
async fn a_long_sequence_matches_the_reference_model() {
    let r = Resp::start(RespSettings::default()).await;
    let mut con = r.redis().await;
    let mut model = Model::new(5, 7, 20);
    let mut now = T0;
    let mut seed = 0x2545_f491_u64;
    let mut next = |m: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % m
    };
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..300 {
        let advance_ms = if next(3) == 0 { next(6000) } else { 0 };
        let quantity = next(4);
        r.s.advance(Duration::from_millis(advance_ms));
        now += advance_ms * 1_000_000;
        let v: Vec<i64> = throttle_cmd("model", 5, 7, 20, quantity as i64)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(v, model.call(now, quantity), "step {step}");
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
        ]
    })
    .await
    .unwrap();
    assert_eq!(out[0], "1\n3\n2\n0\n6\n");
    assert_eq!(out[1], "1\n3\n0\n0\n18\n");
    assert_eq!(out[2], "0\n3\n0\n6\n18\n");
    assert_eq!(out[3], "PONG\n");
    assert_eq!(out[4], "hello\n");
    assert!(out[5].contains("ERR unknown command 'NOPE'"), "{}", out[5]);
    assert!(
        out[6].contains("ERR count_per_period is not an integer"),
        "{}",
        out[6]
    );
    assert_eq!(out[7], "OK\n");
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
        assert_eq!(ints(&raw.reply().await.unwrap()), vec![1, 1, 0, 0, 60]);
        assert_eq!(ints(&raw.reply().await.unwrap()), vec![0, 1, 0, 60, 60]);
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
        (throttle_cmd("k", 2, 1, 1, 3), "quantity must be from 0 to"),
        (throttle_cmd("k", 2, 1, 1, -1), "quantity must be from 0 to"),
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
    let refused_before =
        r.s.running()
            .limiter
            .metrics()
            .throttle
            .resp_connections_refused
            .load(std::sync::atomic::Ordering::Relaxed);
    let mut c = r.raw().await;
    c.send(b"PING\r\n").await;
    assert_eq!(
        c.reply().await,
        Some(OwnedFrame::Error("ERR too many connections".into()))
    );
    assert_eq!(c.reply().await, None);
    assert!(
        r.s.running()
            .limiter
            .metrics()
            .throttle
            .resp_connections_refused
            .load(std::sync::atomic::Ordering::Relaxed)
            > refused_before
    );
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
            c.send(format!("THROTTLE many{} 1 1 60\r\n", i % 10).as_bytes())
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
    assert_eq!(allowed, 10, "one per key, whichever connection asked first");
    assert!(
        r.s.running()
            .limiter
            .metrics()
            .throttle
            .resp_connections_open
            .load(std::sync::atomic::Ordering::Relaxed)
            >= n as u64
    );
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
    let (code, retry, v) = post_throttle(s, body).await;
    assert_eq!((code, retry), (200, None));
    assert_eq!(
        v,
        serde_json::json!({"allowed": true, "limit": 2, "remaining": 1, "retry_after": 0, "reset_after": 6})
    );
    // RESP and HTTP decide the same key: one bucket, whichever transport asks.
    let mut con = r.redis().await;
    let v: Vec<i64> = throttle_cmd("web", 2, 10, 60, 1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, vec![1, 2, 0, 0, 12]);
    let (code, retry, v) = post_throttle(s, body).await;
    assert_eq!((code, retry.as_deref()), (429, Some("6")));
    assert_eq!(v["allowed"], false);
    assert_eq!(
        (v["retry_after"].as_u64(), v["reset_after"].as_u64()),
        (Some(6), Some(12))
    );
    r.s.advance(Duration::from_secs(6));
    let with_quantity =
        r#"{"key":"web","max_burst":2,"count_per_period":10,"period":60,"quantity":1}"#;
    assert_eq!(post_throttle(s, with_quantity).await.0, 200);

    for (bad, expected) in [
        ("not json", "bad JSON body"),
        (r#"{"key":"web"}"#, "missing field"),
        (
            r#"{"key":"web","max_burst":2,"count_per_period":10,"period":60,"extra":1}"#,
            "unknown field",
        ),
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

#[tokio::test]
async fn grpc_limits_and_throttle_keys_never_meet() {
    let r = Resp::start(RespSettings::default()).await;
    let alice = || one("d", &[("user", "alice")]);
    assert_eq!(codes(&r.s.call(alice()).await), vec![(OK, 1)]);
    assert_eq!(codes(&r.s.call(alice()).await), vec![(OK, 0)]);
    assert_eq!(codes(&r.s.call(alice()).await)[0].0, OVER);
    // The gRPC counter key is "d_user_alice_"; THROTTLE's key of the same name is another bucket.
    let mut con = r.redis().await;
    for expected in [
        vec![1, 2, 1, 0, 30],
        vec![1, 2, 0, 0, 60],
        vec![0, 2, 0, 30, 60],
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
            .limiter
            .engine()
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
    let mut metrics = String::new();
    r.s.running()
        .limiter
        .metrics()
        .throttle
        .render(&mut metrics);
    assert!(
        metrics.contains("turnstile_throttle_calls_total{result=\"allowed\"}"),
        "{metrics}"
    );
    assert!(
        r.s.running()
            .limiter
            .metrics()
            .throttle
            .denied
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
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
    let e = resp::serve(
        listener,
        s.running().limiter.clone(),
        RespSettings::default(),
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
