//! Redis specifics: envoyproxy/ratelimit's key layout, replicas sharing limits, Cluster,
//! Sentinel, unix sockets and AUTH, and what happens when Redis goes away.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::redis::{env, free_port, Redis};
use crate::common::tempdir::TempDir;
use crate::common::*;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
"#;

fn with(mut e: Vec<(String, String)>, more: &[(&str, &str)]) -> Vec<(String, String)> {
    for (k, v) in more {
        e.retain(|(n, _)| n != k);
        e.push((k.to_string(), v.to_string()));
    }
    e
}

#[tokio::test]
async fn fixed_window_keys_and_ttls_match_envoyproxy_ratelimit() {
    let redis = Redis::start();
    let s = TestServer::start_env(CONFIG, env(&redis, "pfx_")).await;
    s.call(one("edge", &[("api_key", "alice")])).await;
    // T0 = 1_700_000_000 s, 20 s into its minute: the window started at 1_699_999_980.
    let key = "pfx_edge_api_key_alice_1699999980";
    assert_eq!(
        redis.cli(&["GET", key]),
        "1",
        "keys: {}",
        redis.cli(&["KEYS", "*"])
    );
    let ttl: i64 = redis.cli(&["TTL", key]).parse().unwrap();
    assert!((1..=60).contains(&ttl), "TTL {ttl}");
    // envoyproxy/ratelimit sharing this Redis counts on the same key: turnstile sees its hits.
    redis.cli(&["INCRBY", key, "1"]);
    let r = s.call(one("edge", &[("api_key", "alice")])).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    assert_eq!(
        s.call(one("edge", &[("api_key", "alice")]))
            .await
            .overall_code,
        OVER
    );
    // The refused call's hit is refunded in the shard's next pipeline: wait for that round
    // trip (a readiness wait on Redis, not a sleep through a window).
    let refunded = || redis.cli(&["GET", key]) == "3";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !refunded() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(redis.cli(&["GET", key]), "3", "refused hits are refunded");
    // Sliding window and token bucket keys carry a Cluster hash tag.
    s.call(one("edge", &[("sliding", "s")])).await;
    s.call(one("edge", &[("bucket", "b")])).await;
    let keys = redis.cli(&["KEYS", "pfx_{*"]);
    assert!(keys.contains("pfx_{edge_sliding_s_}_1699999980"), "{keys}");
    assert!(keys.contains("pfx_{edge_bucket_b_}_tat"), "{keys}");

    let jittered = Redis::start();
    let j = TestServer::start_env(
        CONFIG,
        with(
            env(&jittered, ""),
            &[("EXPIRATION_JITTER_MAX_SECONDS", "30")],
        ),
    )
    .await;
    j.call(one("edge", &[("api_key", "bob")])).await;
    let ttl: i64 = jittered
        .cli(&["TTL", "edge_api_key_bob_1699999980"])
        .parse()
        .unwrap();
    assert!((1..=90).contains(&ttl), "TTL with jitter {ttl}");
}

#[tokio::test]
async fn scripts_go_by_sha_and_survive_a_script_flush() {
    let redis = Redis::start();
    let s = TestServer::start_env(CONFIG, env(&redis, "sha_")).await;
    let bucket = || s.call(one("edge", &[("bucket", "b")]));
    assert_eq!(codes(&bucket().await), vec![(OK, 2)]);
    // Redis forgets its scripts (as after a restart): the next calls load them again and
    // count once each.
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(codes(&bucket().await), vec![(OK, 1)]);
    assert_eq!(codes(&bucket().await), vec![(OK, 0)]);
    assert_eq!(bucket().await.overall_code, OVER);
    // After the first load, calls send the SHA1 and not the script's text.
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls = |name: &str| -> u64 {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .map_or(0, |v| v.parse().unwrap())
    };
    assert!(calls("evalsha") >= 4, "{stats}");
    assert!(calls("eval") <= 2, "{stats}");
}

#[tokio::test]
async fn two_replicas_sharing_redis_admit_exactly_the_limit() {
    let redis = Redis::start();
    let a = TestServer::start_env(CONFIG, env(&redis, "shared_")).await;
    let b = TestServer::start_env(CONFIG, env(&redis, "shared_")).await;
    let mut tasks = Vec::new();
    for i in 0..160 {
        let mut c = if i % 2 == 0 {
            a.client.clone()
        } else {
            b.client.clone()
        };
        tasks.push(tokio::spawn(async move {
            c.should_rate_limit(one("edge", &[("hot", "h")]))
                .await
                .unwrap()
                .into_inner()
                .overall_code
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap() == OK);
    }
    assert_eq!(ok, 50);
}

#[tokio::test]
async fn unix_socket_and_auth() {
    let dir = TempDir::new("redis-unix-socket");
    let sock = dir.path().join("redis.sock");
    let sock_s = sock.to_string_lossy().to_string();
    let redis = Redis::start_with(&[
        "--unixsocket",
        &sock_s,
        "--unixsocketperm",
        "700",
        "--requirepass",
        "s3cret",
    ]);
    let e = vec![
        ("BACKEND_TYPE".to_string(), "redis".to_string()),
        ("REDIS_SOCKET_TYPE".into(), "unix".into()),
        ("REDIS_URL".into(), sock_s.clone()),
        ("REDIS_AUTH".into(), "s3cret".into()),
        ("EXPIRATION_JITTER_MAX_SECONDS".into(), "0".into()),
        ("TURNSTILE_REDIS_DEADLINE_MS".into(), "2000".into()),
    ];
    let s = TestServer::start_env(CONFIG, e).await;
    assert_eq!(
        codes(&s.call(one("edge", &[("api_key", "u")])).await),
        vec![(OK, 2)]
    );
    assert_eq!(redis.cli(&["GET", "edge_api_key_u_1699999980"]), "1");
}

struct Cluster {
    nodes: Vec<Redis>,
}

/// Three masters; with `password`, each requires it (of clients and of each other).
fn cluster(password: Option<&str>) -> Cluster {
    let mut args = vec!["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
    let mut cli = Command::new("redis-cli");
    if let Some(pw) = password {
        args.extend(["--requirepass", pw, "--masterauth", pw]);
        cli.args(["-a", pw, "--no-auth-warning"]);
    }
    let nodes: Vec<Redis> = (0..3).map(|_| Redis::start_with(&args)).collect();
    let addrs: Vec<String> = nodes.iter().map(|n| n.url()).collect();
    let out = cli
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in &nodes {
        while !n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Cluster { nodes }
}

#[tokio::test]
async fn redis_cluster_with_three_masters() {
    let c = cluster(None);
    let urls: Vec<String> = c.nodes.iter().map(|n| n.url()).collect();
    let e = vec![
        ("BACKEND_TYPE".to_string(), "redis".to_string()),
        ("REDIS_TYPE".into(), "cluster".into()),
        ("REDIS_URL".into(), urls.join(",")),
        ("EXPIRATION_JITTER_MAX_SECONDS".into(), "0".into()),
        ("TURNSTILE_REDIS_DEADLINE_MS".into(), "2000".into()),
    ];
    let s = TestServer::start_env(CONFIG, e).await;
    // Many keys, so every master holds some; each keeps its own exact count.
    for i in 0..12 {
        let k = format!("user{i}");
        for expect in [(OK, 2), (OK, 1), (OK, 0), (OVER, 0)] {
            assert_eq!(
                codes(&s.call(one("edge", &[("api_key", &k)])).await),
                vec![expect],
                "{k}"
            );
        }
    }
    for alg in ["sliding", "bucket"] {
        let got: Vec<i32> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(s.call(one("edge", &[(alg, "x")])).await.overall_code);
            }
            v
        };
        assert_eq!(got, vec![OK, OK, OK, OVER], "{alg}");
    }
    let held: usize = c
        .nodes
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).parse::<usize>().unwrap())
        .sum();
    assert!(held >= 14, "keys spread over the cluster: {held}");
    assert!(c.nodes.iter().filter(|n| n.cli(&["DBSIZE"]) != "0").count() >= 2);
}

fn breaker(s: &TestServer) -> Vec<u64> {
    s.running()
        .context
        .engine
        .link_stats()
        .iter()
        .map(|x| x.read().breaker)
        .collect()
}

fn fast_breaker(redis: &Redis, mode: &str) -> Vec<(String, String)> {
    with(
        env(redis, "kill_"),
        &[
            ("TURNSTILE_REDIS_DEADLINE_MS", "100"),
            ("TURNSTILE_REDIS_BREAKER_FAILURES", "2"),
            ("TURNSTILE_REDIS_COOLDOWN_MS", "200"),
            ("TURNSTILE_REDIS_FAILURE_MODE", mode),
            ("TURNSTILE_WORKERS", "1"),
            ("TURNSTILE_SHARDS", "2"),
        ],
    )
}

#[tokio::test]
async fn redis_killed_under_load_falls_back_without_errors_and_comes_back() {
    let mut redis = Redis::start();
    let debug_port = [("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")];
    let s =
        TestServer::start_env(CONFIG, with(fast_breaker(&redis, "fallback"), &debug_port)).await;
    let run = |n: usize| {
        let client = s.client.clone();
        async move {
            let mut tasks = Vec::new();
            for t in 0..8 {
                let mut c = client.clone();
                tasks.push(tokio::spawn(async move {
                    let mut slowest = Duration::ZERO;
                    let mut errors = 0;
                    for i in 0..n {
                        let k = format!("k{t}-{i}");
                        let start = Instant::now();
                        if c.should_rate_limit(one("edge", &[("api_key", &k)]))
                            .await
                            .is_err()
                        {
                            errors += 1;
                        }
                        slowest = slowest.max(start.elapsed());
                    }
                    (errors, slowest)
                }));
            }
            let mut errors = 0;
            let mut slowest = Duration::ZERO;
            for t in tasks {
                let (e, s) = t.await.unwrap();
                errors += e;
                slowest = slowest.max(s);
            }
            (errors, slowest)
        }
    };
    assert_eq!(run(20).await.0, 0);
    redis.kill();
    let (errors, slowest) = run(50).await;
    assert_eq!(errors, 0, "fallback answers every call");
    // Bounded by the 100 ms deadline, never Redis's usual multi-second hang (a liveness
    // bound with room for a loaded machine, not a benchmark).
    assert!(slowest < Duration::from_secs(2), "slowest call {slowest:?}");
    assert!(
        breaker(&s).contains(&BreakerState::Open.gauge()),
        "{:?}",
        breaker(&s)
    );
    let health = reqwest::get(format!("{}/healthcheck", s.http))
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "still answering, so still healthy");
    assert!(health.text().await.unwrap().contains("breaker open"));
    // The status page's source shows it per shard.
    let status: serde_json::Value = reqwest::get(format!(
        "http://{}/debug/status",
        s.running().debug_addr.unwrap()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(status["backend"], "redis");
    let shards = status["shards"].as_array().unwrap();
    assert!(shards.iter().any(|x| x["breaker"] == "open"), "{shards:?}");
    assert!(
        s.running()
            .context
            .engine
            .link_stats()
            .iter()
            .map(|x| x.read().fallback_decisions)
            .sum::<u64>()
            > 0
    );

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        run(2).await;
        if breaker(&s)
            .iter()
            .all(|b| *b == BreakerState::Closed.gauge())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "breaker did not close: {:?}",
            breaker(&s)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.call(one("edge", &[("api_key", "back")])).await;
    assert_eq!(
        redis.cli(&["GET", "kill_edge_api_key_back_1699999980"]),
        "1",
        "back on Redis"
    );
}

#[tokio::test]
async fn failure_modes_fail_open_and_fail_closed() {
    for (mode, expect_ok) in [("fail_open", true), ("fail_closed", false)] {
        let mut redis = Redis::start();
        let s = TestServer::start_env(CONFIG, fast_breaker(&redis, mode)).await;
        redis.kill();
        for i in 0..10 {
            let r = s
                .try_call(one("edge", &[("api_key", &format!("m{i}"))]))
                .await;
            if expect_ok {
                assert_eq!(r.expect("fail_open answers").overall_code, OK, "{mode}");
            } else {
                assert_eq!(
                    r.expect_err("fail_closed fails").code(),
                    tonic::Code::Unavailable,
                    "{mode}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_wrong_password_stops_the_start() {
    let redis = Redis::start_with(&["--requirepass", "right"]);
    let r = TestServer::try_start_env(
        "domain: d\ndescriptors: []\n",
        with(env(&redis, ""), &[("REDIS_AUTH", "wrong")]),
    )
    .await;
    let e = r.err().expect("refused to start").to_string();
    assert!(
        e.contains("PING") || e.contains("auth") || e.contains("AUTH"),
        "{e}"
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
fn certs(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1").unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    ]);
    for name in ["server", "client"] {
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "1",
            "-extfile",
            "ext",
        ]);
    }
}

#[tokio::test]
async fn redis_over_mutual_tls() {
    let dir = TempDir::new("redis-tls");
    certs(dir.path());
    let p = |f: &str| dir.path().join(f).to_string_lossy().to_string();
    let tls_port = free_port();
    let redis = Redis::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &p("server.crt"),
        "--tls-key-file",
        &p("server.key"),
        "--tls-ca-cert-file",
        &p("ca.crt"),
        "--tls-auth-clients",
        "yes",
    ]);
    let base = vec![
        ("BACKEND_TYPE".to_string(), "redis".to_string()),
        ("REDIS_URL".into(), format!("127.0.0.1:{tls_port}")),
        ("REDIS_TLS".into(), "true".into()),
        ("REDIS_TLS_CACERT".into(), p("ca.crt")),
        ("EXPIRATION_JITTER_MAX_SECONDS".into(), "0".into()),
        ("TURNSTILE_REDIS_DEADLINE_MS".into(), "2000".into()),
    ];
    let s = TestServer::start_env(
        CONFIG,
        with(
            base.clone(),
            &[
                ("REDIS_TLS_CLIENT_CERT", &p("client.crt")),
                ("REDIS_TLS_CLIENT_KEY", &p("client.key")),
            ],
        ),
    )
    .await;
    assert_eq!(
        codes(&s.call(one("edge", &[("api_key", "tls")])).await),
        vec![(OK, 2)]
    );
    assert_eq!(
        redis.cli(&["GET", "edge_api_key_tls_1699999980"]),
        "1",
        "counted over TLS"
    );
    // Without the client certificate the server refuses the handshake: the start is retried
    // (as the reference retries it: a refused handshake may be a Redis still starting) and
    // fails at the elapsed limit.
    let base = with(base, &[("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s")]);
    let r = TestServer::try_start_env("domain: d\ndescriptors: []\n", base).await;
    assert!(
        r.is_err(),
        "mutual TLS without a client certificate must not connect"
    );
}

#[tokio::test]
async fn per_second_limits_go_to_their_own_redis() {
    let main = Redis::start();
    let per_second = Redis::start();
    let e = with(
        env(&main, ""),
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &per_second.url()),
        ],
    );
    let yaml = "domain: ps\ndescriptors:\n  - key: fast\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: slow\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let s = TestServer::start_env(yaml, e).await;
    for (key, expect) in [("fast", (OK, 1)), ("slow", (OK, 1))] {
        assert_eq!(
            codes(&s.call(one("ps", &[(key, "x")])).await),
            vec![expect],
            "{key}"
        );
    }
    // T0 is on a whole second (1_700_000_000) and 20 s into its minute.
    assert_eq!(
        per_second.cli(&["GET", "ps_fast_x_1700000000"]),
        "1",
        "per-second Redis"
    );
    assert_eq!(
        main.cli(&["GET", "ps_fast_x_1700000000"]),
        "",
        "not in the main Redis"
    );
    assert_eq!(
        main.cli(&["GET", "ps_slow_x_1699999980"]),
        "1",
        "main Redis"
    );
    assert_eq!(per_second.cli(&["DBSIZE"]), "1");
}

/// A Cluster whose nodes require a password, and no `REDIS_AUTH`: the start stops at once
/// (no retry), naming `REDIS_AUTH`. The elapsed limit only bounds the test should it retry.
#[test]
fn a_cluster_requiring_a_password_without_redis_auth_stops_the_start_naming_it() {
    let c = cluster(Some("cluster-pw"));
    let urls: Vec<String> = c.nodes.iter().map(|n| n.url()).collect();
    let config = c.nodes[0].dir.write("limits.yaml", CONFIG);
    let err = crate::common::binary::start_fails(
        &["serve", "--config", config.to_str().unwrap()],
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", &urls.join(",")),
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "3s"),
        ],
    );
    assert!(err.contains("REDIS_AUTH"), "{err}");
    assert!(!err.contains("retrying"), "retried: {err}");
}
