//! Reaching Redis at start: Sentinels (with their own password, `REDIS_SENTINEL_AUTH`), and a
//! Redis that is not up yet, retried as envoyproxy/ratelimit retries it (`REDIS_STARTUP_*`)
//! until it answers or the elapsed limit ends the start; meanwhile the probes answer at once
//! and a stop ends the wait; a missing password stops the start at once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::common::redis::{cli_auth, free_port, server_program, Redis};
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
    let child = Command::new(server_program())
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

/// The binary started before its Redis: it logs each retry; once Redis is up it starts,
/// answers from Redis, and counts the retries.
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

/// A Redis that requires a password while `REDIS_AUTH` is not set answers NOAUTH: no wait
/// mends that, so the start stops at once (no retry) with an error naming `REDIS_AUTH`, for a
/// single Redis and for a Sentinel's data node alike. The elapsed limit only bounds the test
/// should the start retry.
#[test]
fn a_redis_requiring_a_password_without_redis_auth_stops_the_start_naming_it() {
    use crate::common::binary::start_fails;
    let master = Redis::start_with(&["--requirepass", "master-pw"]);
    let config = master.dir.write("limits.yaml", CONFIG);
    let args = ["serve", "--config", config.to_str().unwrap()];
    let single = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", &master.url()),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "3s"),
    ];
    let err = start_fails(&args, &single);
    assert!(err.contains("REDIS_AUTH"), "{err}");
    assert!(!err.contains("retrying"), "retried: {err}");

    let s = sentinel(&master, None);
    let url = format!("mymaster,127.0.0.1:{}", s.port);
    let via_sentinel = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", &url),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "3s"),
    ];
    let err = start_fails(&args, &via_sentinel);
    assert!(err.contains("REDIS_AUTH"), "{err}");
    assert!(!err.contains("retrying"), "retried: {err}");
}

/// A wrong `REDIS_AUTH` is refused by Redis (`WRONGPASS`): the start stops at once, naming
/// the setting to check, never the password.
#[test]
fn a_refused_redis_auth_stops_the_start_naming_the_setting() {
    use crate::common::binary::start_fails;
    let redis = Redis::start_with(&["--requirepass", "right-pw"]);
    let config = redis.dir.write("limits.yaml", CONFIG);
    let args = ["serve", "--config", config.to_str().unwrap()];
    let env = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", &redis.url()),
        ("REDIS_AUTH", "wrong-pw"),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "3s"),
    ];
    let err = start_fails(&args, &env);
    assert!(err.contains("the password was refused"), "{err}");
    assert!(err.contains("check REDIS_AUTH"), "{err}");
    assert!(
        !err.contains("wrong-pw") && !err.contains("retrying"),
        "{err}"
    );
}

/// `REDIS_URL` takes `host:port`, as the reference's does: a URL is refused at once saying
/// so (not redis-rs's "Invalid database number"), its password never printed.
#[test]
fn a_redis_url_with_a_scheme_is_refused_saying_a_host_port_is_expected() {
    use crate::common::binary::start_fails;
    let t = crate::common::tempdir::TempDir::new("redis-url-scheme");
    let config = t.write("limits.yaml", CONFIG);
    let args = ["serve", "--config", config.to_str().unwrap()];
    let env = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", "redis://:hunter2@127.0.0.1:6379"),
    ];
    let err = start_fails(&args, &env);
    assert!(
        err.contains("REDIS_URL=redis://…: a host:port is expected"),
        "{err}"
    );
    assert!(
        !err.contains("hunter2") && !err.contains("database"),
        "{err}"
    );
}

/// A Redis nobody answers at (a wrong address) is retried for ever by default, as
/// envoyproxy/ratelimit does: each periodic warning names the address being retried.
#[test]
fn the_retry_warning_names_the_address_being_retried() {
    use crate::common::binary::{Starting, BIN};
    let t = crate::common::tempdir::TempDir::new("redis-wrong-address");
    let config = t.write("limits.yaml", CONFIG);
    let addr = format!("127.0.0.1:{}", free_port());
    let env = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", addr.as_str()),
        ("REDIS_STARTUP_INITIAL_INTERVAL", "50ms"),
        ("REDIS_STARTUP_MAX_INTERVAL", "100ms"),
    ];
    let args = ["serve", "--config", config.to_str().unwrap()];
    let mut start = Starting::spawn(BIN.as_ref(), &args, &env);
    start.logged("Redis not reachable at start; retrying");
    start.signal("TERM");
    let (_, stderr) = start
        .exit_within(Duration::from_secs(30))
        .expect("a stop ends the wait");
    let warning = (stderr.lines())
        .find(|l| l.contains("Redis not reachable at start; retrying"))
        .unwrap();
    assert!(warning.contains(&format!("address={addr}")), "{warning}");
}

/// The binary started while its Redis is down (the default: retry without end), every port on
/// a port of its own, and the Redis it waits for; `Redis::restart` brings that one up.
fn waiting_for_redis(env: &[(&str, &str)]) -> (crate::common::binary::Starting, Redis, [u16; 4]) {
    use crate::common::binary::{Starting, BIN};
    let mut redis = Redis::start();
    redis.kill();
    let config = redis.dir.write("limits.yaml", CONFIG);
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let [http, grpc, debug, metrics] = ports.map(|p| p.to_string());
    let metrics = format!("127.0.0.1:{metrics}");
    let url = redis.url();
    let mut vars = vec![
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_STARTUP_INITIAL_INTERVAL", "50ms"),
        ("REDIS_STARTUP_MAX_INTERVAL", "100ms"),
        ("PORT", http.as_str()),
        ("GRPC_PORT", grpc.as_str()),
        ("DEBUG_PORT", debug.as_str()),
        ("PROMETHEUS_ADDR", metrics.as_str()),
    ];
    vars.extend_from_slice(env);
    let args = ["serve", "--config", config.to_str().unwrap()];
    let s = Starting::spawn(std::path::Path::new(BIN), &args, &vars);
    s.logged("Redis not reachable at start; retrying");
    (s, redis, ports)
}

/// The README's grpcurl health command, run as written (its port swapped) while the start
/// waits for Redis: reflection is served then too, so it answers NOT_SERVING, and SERVING once
/// Redis is up.
#[test]
fn the_readmes_grpcurl_health_check_answers_during_the_wait() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"));
    let readme = readme.unwrap();
    let line = (readme.lines())
        .find(|l| l.starts_with("Health: `grpcurl "))
        .expect("the README's health command");
    let cmd = line.split('`').nth(1).unwrap();
    let (mut s, mut redis, [_, grpc, _, _]) = waiting_for_redis(&[]);
    let cmd = cmd.replace("127.0.0.1:8081", &format!("127.0.0.1:{grpc}"));
    let health = || {
        let out = Command::new("bash").args(["-c", &cmd]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{cmd}: {err}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["status"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(health(), "NOT_SERVING");
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while health() != "SERVING" {
        assert!(Instant::now() < deadline, "not SERVING once Redis is up");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.signal("TERM");
    s.exit_within(Duration::from_secs(30)).expect("stops");
}

/// SIGTERM and SIGINT each end a start that waits for Redis: the process exits 0 (a bound of
/// seconds only, not a speed), saying what it was waiting for.
#[test]
fn a_start_waiting_for_redis_stops_on_sigterm_and_on_sigint() {
    for sig in ["TERM", "INT"] {
        let (mut s, _redis, _) = waiting_for_redis(&[]);
        s.signal(sig);
        let (status, stderr) = s
            .exit_within(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("still running 5 s after SIG{sig}"));
        assert!(
            status.success(),
            "SIG{sig}: exit {status}; stderr:\n{stderr}"
        );
        assert!(
            stderr.contains("stopped while waiting for Redis"),
            "SIG{sig}: {stderr}"
        );
    }
}

/// While the start waits for Redis every port answers at once: `/healthcheck` 503 naming the
/// wait, gRPC health NOT_SERVING and `ShouldRateLimit` UNAVAILABLE, `/metrics` the retries (the
/// Prometheus port 200). Once Redis is up the same ports serve: health 200, calls counted.
#[tokio::test]
async fn probes_answer_at_once_while_the_start_waits_for_redis() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let (s, mut redis, [http, grpc, debug, metrics]) = waiting_for_redis(&[]);
    // A generous bound: a connection that hangs fails here, not a slow answer.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let get = |port: u16, path: &str| {
        let (client, url) = (client.clone(), format!("http://127.0.0.1:{port}{path}"));
        async move {
            let r = client.get(url).send().await.expect("answered");
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(
        get(http, "/healthcheck").await,
        (503, "waiting for Redis\n".to_owned())
    );
    for port in [http, debug] {
        let (code, body) = get(port, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains("ratelimit_service_redis_startup_retries_total "),
            "{body}"
        );
    }
    assert_eq!(get(metrics, "/metrics").await.0, 200, "the Prometheus port");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("gRPC connects");
    for service in ["", "ratelimit"] {
        let req = HealthCheckRequest {
            service: service.into(),
        };
        let status = HealthClient::new(channel.clone()).check(req).await.unwrap();
        assert_eq!(
            status.into_inner().status,
            ServingStatus::NotServing as i32,
            "health of {service:?}"
        );
    }
    let rls = RateLimitServiceClient::new(channel);
    let e = (rls.clone())
        .should_rate_limit(one("edge", &[("api_key", "w")]))
        .await
        .expect_err("not served yet");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("waiting for Redis"), "{e:?}");

    redis.restart();
    let _server = s.ready();
    let served = settles(
        || async { get(http, "/healthcheck").await.0 },
        200,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(served, 200);
    // The connection made during the wait is let go (GOAWAY): the same client, reconnecting,
    // reaches the server proper and is counted.
    let call = || {
        let mut rls = rls.clone();
        async move {
            let r = rls
                .should_rate_limit(one("edge", &[("api_key", "w")]))
                .await;
            r.map(|r| codes(&r.into_inner())).map_err(|e| e.code())
        }
    };
    let counted = settles(call, Ok(vec![(OK, 2)]), Duration::from_secs(10)).await;
    assert_eq!(counted, Ok(vec![(OK, 2)]));
}

/// examples/kubernetes/rate-limit-service.yaml promises that a Redis outage does not restart
/// pods: while the start waits for Redis its liveness probe passes and its readiness probe
/// fails, each asked of the port it names.
#[tokio::test]
async fn the_kubernetes_example_probes_keep_a_waiting_pod_alive_and_unready() {
    use serde::Deserialize;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/kubernetes/rate-limit-service.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let container = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|d| d["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        })
        .find(|c| c["name"] == "ratelimit")
        .expect("the ratelimit container");
    let (s, _redis, [http, _, debug, metrics]) = waiting_for_redis(&[]);
    // The container's ports, by name, as the test's own.
    let port_of = |name: &serde_yaml::Value| -> u16 {
        let declared = (container["ports"].as_sequence().unwrap().iter())
            .find(|p| &p["name"] == name)
            .unwrap_or_else(|| panic!("port {name:?} declared"))["containerPort"]
            .as_u64()
            .unwrap();
        match declared {
            8080 => http,
            6070 => debug,
            9090 => metrics,
            other => panic!("port {other} is not an HTTP port of turnstile's"),
        }
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for probe in ["livenessProbe", "readinessProbe"] {
        let get = &container[probe]["httpGet"];
        let url = format!(
            "http://127.0.0.1:{}{}",
            port_of(&get["port"]),
            get["path"].as_str().unwrap()
        );
        let r = client.get(&url).send().await.expect("answered");
        seen.push((probe, r.status().is_success()));
    }
    assert_eq!(
        seen,
        vec![("livenessProbe", true), ("readinessProbe", false)]
    );
    drop(s);
}
