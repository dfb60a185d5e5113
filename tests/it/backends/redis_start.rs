//! Reaching Redis at start: Sentinels (with their own password, `REDIS_SENTINEL_AUTH`), and a
//! Redis that is not up yet, retried as envoyproxy/ratelimit retries it (`REDIS_STARTUP_*`)
//! until it answers or the elapsed limit ends the start.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::redis::{cli_auth, free_port, Redis};
use crate::common::*;

const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";

/// A process killed when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Sentinel {
    _process: Reaped,
    port: u16,
}

/// A Sentinel watching `master`; with `passwords` (the master's, the Sentinel's own) it
/// authenticates to the master and asks its clients for its own.
fn sentinel(master: &Redis, passwords: Option<(&str, &str)>) -> Sentinel {
    let port = free_port();
    let conf = master.dir.path().join("sentinel.conf");
    let mut text = format!(
        "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\nsentinel down-after-milliseconds mymaster 2000\n",
        master.dir.path().display(),
        master.port
    );
    if let Some((m, s)) = passwords {
        text.push_str(&format!(
            "sentinel auth-pass mymaster {m}\nrequirepass {s}\n"
        ));
    }
    std::fs::write(&conf, text).unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let s = Sentinel {
        _process: Reaped(child),
        port,
    };
    let auth = passwords.map(|(_, s)| s);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cli_auth(
        s.port,
        auth,
        &["SENTINEL", "get-master-addr-by-name", "mymaster"],
    )
    .contains(&master.port.to_string())
    {
        assert!(
            Instant::now() < deadline,
            "sentinel does not know the master"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

fn sentinel_env(s: &Sentinel, more: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = vec![
        ("BACKEND_TYPE".to_string(), "redis".to_string()),
        ("REDIS_TYPE".into(), "sentinel".into()),
        ("REDIS_URL".into(), format!("mymaster,127.0.0.1:{}", s.port)),
        ("EXPIRATION_JITTER_MAX_SECONDS".into(), "0".into()),
        ("TURNSTILE_REDIS_DEADLINE_MS".into(), "2000".into()),
    ];
    e.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    e
}

async fn counts_on_the_master(s: &TestServer, master: &Redis) {
    assert_eq!(
        codes(&s.call(one("edge", &[("api_key", "sen")])).await),
        vec![(OK, 2)]
    );
    assert_eq!(
        master.cli(&["GET", "edge_api_key_sen_1699999980"]),
        "1",
        "counted on the master"
    );
}

#[tokio::test]
async fn redis_sentinel() {
    let master = Redis::start();
    let s = sentinel(&master, None);
    let server = TestServer::start_env(CONFIG, sentinel_env(&s, &[])).await;
    counts_on_the_master(&server, &master).await;
}

/// Sentinels with `requirepass` (envoyproxy/ratelimit #1015): `REDIS_SENTINEL_AUTH` is their
/// password, `REDIS_AUTH` the master's. Without it the start is refused, naming Redis.
#[tokio::test]
async fn redis_sentinel_with_its_own_password() {
    let master = Redis::start_with(&["--requirepass", "master-pw"]);
    let s = sentinel(&master, Some(("master-pw", "sentinel-pw")));
    let both = [
        ("REDIS_AUTH", "master-pw"),
        ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
    ];
    let server = TestServer::start_env(CONFIG, sentinel_env(&s, &both)).await;
    counts_on_the_master(&server, &master).await;

    let without = [
        ("REDIS_AUTH", "master-pw"),
        ("REDIS_STARTUP_INITIAL_INTERVAL", "100ms"),
        ("REDIS_STARTUP_MAX_INTERVAL", "100ms"),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s"),
    ];
    let e = TestServer::try_start_env(CONFIG, sentinel_env(&s, &without))
        .await
        .err()
        .expect("refused without the Sentinels' password");
    assert!(e.contains("Redis"), "{e}");
}

/// A refused password says which: the Sentinels' (`REDIS_SENTINEL_AUTH`, wrong or missing)
/// or the master's (`REDIS_AUTH`), though the client meets both in one call.
#[tokio::test]
async fn a_refused_sentinel_deployment_password_names_its_setting() {
    let master = Redis::start_with(&["--requirepass", "master-pw"]);
    let s = sentinel(&master, Some(("master-pw", "sentinel-pw")));
    // Each start is a refusal: tried for a second at most, whether it is retried or not.
    let quick = [
        ("REDIS_STARTUP_INITIAL_INTERVAL", "100ms"),
        ("REDIS_STARTUP_MAX_INTERVAL", "100ms"),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s"),
    ];
    let refused = |pairs: &[(&'static str, &'static str)]| {
        let mut env = quick.to_vec();
        env.extend_from_slice(pairs);
        TestServer::try_start_env(CONFIG, sentinel_env(&s, &env))
    };
    // The settings, what the error names, what it must not.
    type Case = (
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    );
    let cases: [Case; 3] = [
        (
            &[
                ("REDIS_AUTH", "master-pw"),
                ("REDIS_SENTINEL_AUTH", "wrong"),
            ],
            "REDIS_SENTINEL_AUTH refused",
            "REDIS_AUTH",
        ),
        (
            &[("REDIS_AUTH", "master-pw")],
            "REDIS_SENTINEL_AUTH not set",
            "REDIS_AUTH",
        ),
        (
            &[
                ("REDIS_AUTH", "wrong"),
                ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
            ],
            "REDIS_AUTH refused",
            "SENTINEL_AUTH",
        ),
    ];
    for (pairs, names, not) in cases {
        let e = refused(pairs).await.err().expect("refused");
        assert!(e.contains(names), "{pairs:?}: {e}");
        assert!(!e.contains(not), "{pairs:?}: {e}");
    }
}

/// With `REDIS_STARTUP_MAX_ELAPSED_TIME`, a Redis that never comes ends the start with an error
/// naming the setting.
#[tokio::test]
async fn a_redis_that_never_comes_ends_the_start_at_the_elapsed_limit() {
    let port = free_port();
    let env: Vec<(String, String)> = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", &format!("127.0.0.1:{port}")),
        ("REDIS_STARTUP_INITIAL_INTERVAL", "50ms"),
        ("REDIS_STARTUP_MAX_INTERVAL", "100ms"),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "500ms"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let e = TestServer::try_start_env(CONFIG, env)
        .await
        .err()
        .expect("the start ends");
    assert!(e.contains("REDIS_STARTUP_MAX_ELAPSED_TIME"), "{e}");
}

/// The binary started before its Redis: it logs each retry and opens no port; once Redis is
/// up it starts, answers from Redis, and counts the retries.
#[tokio::test]
async fn a_start_before_redis_is_up_waits_for_it_and_then_serves() {
    let mut redis = Redis::start();
    redis.kill();
    let config = redis.dir.path().join("limits.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&config)
        .env_clear()
        .env("BACKEND_TYPE", "redis")
        .env("REDIS_URL", redis.url())
        .env("REDIS_STARTUP_INITIAL_INTERVAL", "50ms")
        .env("REDIS_STARTUP_MAX_INTERVAL", "100ms")
        .env("DEBUG_PORT", "0")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("PROMETHEUS_ADDR", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn turnstile");
    let mut child = Reaped(child);
    let lines = |r: Box<dyn std::io::Read + Send>, tx: mpsc::Sender<String>| {
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        })
    };
    let (tx, rx) = mpsc::channel();
    lines(Box::new(child.0.stdout.take().unwrap()), tx.clone());
    lines(Box::new(child.0.stderr.take().unwrap()), tx);
    let until = |what: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(e) => panic!("no line with {what:?}: {e}"),
            }
        }
    };
    until("Redis not reachable at start; retrying");
    until("Redis not reachable at start; retrying");
    redis.restart();
    let ready = until("turnstile: listening");
    let http = ready
        .split_whitespace()
        .find_map(|t| t.strip_prefix("http="))
        .expect("http= in the ready line")
        .to_owned();
    let body = reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let retries: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("ratelimit_service_redis_startup_retries_total "))
        .expect("the retries are counted")
        .parse()
        .unwrap();
    assert!(retries >= 2.0, "{retries}");
}
