//! `limitador-server LIMITS redis URL` and `redis_cached URL …` on a real redis-server. The real
//! limitador-server (2981b2b) on Redis, for comparison (docs/notes, limitador-observed/redis.txt):
//! two replicas admitted 103, 100 and 111 of a limit of 100 under 400 concurrent calls; its
//! first hit says `X-RateLimit-Reset: 60` and its keys' TTL is the window; a refused call on a
//! fresh counter writes nothing.

use std::time::Duration;

use tonic::transport::Channel;

use super::*;
use crate::common::binary::{wait_for, Starting};
use crate::common::redis::Redis;

/// `toystore-get` (Kuadrant's shape, per user) at 100, and `per-route` at 2.
const LIMITS_100: &str = r#"
- name: toystore-get
  namespace: ns/route
  max_value: 100
  seconds: 60
  conditions: ['descriptors[0]["limit.toystore_get__1a2b3c4d"] == "1"']
  variables: ['descriptors[0]["auth.identity.userid"]']
- name: per-route
  namespace: cel
  max_value: 2
  seconds: 60
  conditions: ['descriptors[0]["method"] == "GET"']
  variables: []
"#;

/// Tests run beside builds on a small machine: a roomy deadline keeps the breaker shut.
const ROOMY: (&str, &str) = ("TURNSTILE_REDIS_DEADLINE_MS", "5000");

fn url(r: &Redis) -> String {
    format!("redis://127.0.0.1:{}", r.port)
}

fn keys(r: &Redis) -> Vec<String> {
    let out = r.cli(&["--scan"]);
    out.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The one key in Redis ending `_first` (turnstile's key of a first-hit window).
fn first_key(r: &Redis) -> String {
    let ks: Vec<String> = keys(r)
        .into_iter()
        .filter(|k| k.ends_with("_first"))
        .collect();
    assert_eq!(ks.len(), 1, "{ks:?}");
    ks[0].clone()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> &'a str {
    (r.response_headers_to_add.iter())
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
        .unwrap_or_else(|| panic!("no {name} in {:?}", r.response_headers_to_add))
}

async fn channel(l: &Limitador) -> Channel {
    tonic::transport::Endpoint::from_shared(l.grpc())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn call(ch: Channel, req: RateLimitRequest) -> RateLimitResponse {
    let mut client = tonic::client::Grpc::new(ch);
    client.ready().await.unwrap();
    let codec: ProstCodec<RateLimitRequest, RateLimitResponse> = ProstCodec::default();
    let path = PathAndQuery::from_static(SHOULD_RATE_LIMIT);
    (client.unary(tonic::Request::new(req), path, codec).await)
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_redis_admit_exactly_the_limit() {
    let r = Redis::start();
    let u = url(&r);
    let storage = ["redis", u.as_str()];
    let a = Limitador::start_on(&[], LIMITS_100, &storage, &[ROOMY]);
    let b = Limitador::start_on(&[], LIMITS_100, &storage, &[ROOMY]);
    let (ca, cb) = (channel(&a).await, channel(&b).await);
    let calls: Vec<_> = (0..400)
        .map(|i| {
            let ch = if i % 2 == 0 { ca.clone() } else { cb.clone() };
            tokio::spawn(call(ch, toystore("alice")))
        })
        .collect();
    let mut admitted = 0;
    for c in calls {
        match code(&c.await.unwrap()) {
            "OK" => admitted += 1,
            "OVER_LIMIT" => {}
            other => panic!("answered {other}"),
        }
    }
    // The real Limitador admitted 103, 100 and 111 here (it reads, then increments).
    assert_eq!(admitted, 100);
    assert_eq!(r.cli(&["GET", &first_key(&r)]), "100");
    // Both replicas go on refusing: the count is Redis's.
    for ch in [ca, cb] {
        assert_eq!(code(&call(ch, toystore("alice")).await), "OVER_LIMIT");
    }
    // And either lists it in `/counters`, read from Redis, not from its own shards.
    for l in [&a, &b] {
        let listed: serde_json::Value = reqwest::get(l.http("/counters/ns%2Froute"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
        assert_eq!(listed[0]["remaining"], 0);
        assert_eq!(listed[0]["limit"]["name"], "toystore-get");
        let user = &listed[0]["set_variables"]["descriptors[0][\"auth.identity.userid\"]"];
        assert_eq!(user, "alice");
        let expires = listed[0]["expires_in_seconds"].as_u64().unwrap();
        assert!((50..60).contains(&expires), "{listed}");
    }
}

#[tokio::test]
async fn the_window_ends_when_its_redis_key_does() {
    let r = Redis::start();
    let u = url(&r);
    // Jitter left at its default (300 s): a first-hit window's TTL is the window alone.
    let l = Limitador::start_on(
        &["--rate-limit-headers", "DRAFT_VERSION_03"],
        LIMITS,
        &["redis", u.as_str()],
        &[ROOMY],
    );
    let first = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
        .await
        .unwrap();
    assert_eq!(code(&first), "OK");
    // Whole seconds left at the answer, rounded down, as on memory: the real server on Redis
    // says 60 here (the TTL as its script read it, before the reply's way back), 59 on memory.
    assert_eq!(header(&first, "X-RateLimit-Reset"), "59");
    let key = first_key(&r);
    let pttl: u64 = r.cli(&["PTTL", &key]).parse().unwrap();
    assert!((55_000..=60_000).contains(&pttl), "PTTL {pttl}");
    // Shorten the window in Redis: the next answers end with it.
    r.cli(&["PEXPIRE", &key, "3000"]);
    let second = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
        .await
        .unwrap();
    let reset: u64 = header(&second, "X-RateLimit-Reset").parse().unwrap();
    assert!(reset <= 3, "X-RateLimit-Reset {reset}");
    let counters: serde_json::Value = reqwest::get(l.http("/counters/ns%2Froute"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expires = counters[0]["expires_in_seconds"].as_u64().unwrap();
    assert!(expires <= 3, "{counters}");
    assert_eq!(counters[0]["remaining"], 1);
    // The third fills the limit of 3; later calls are refused, from the over-limit cache,
    // until Redis's end, not a window after the first hit.
    let third = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
        .await
        .unwrap();
    assert_eq!(code(&third), "OK");
    for _ in 0..3 {
        let r = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
            .await
            .unwrap();
        assert_eq!(code(&r), "OVER_LIMIT");
    }
    // turnstile's own series follow Limitador's on `/metrics`.
    let text = reqwest::get(l.http("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cached: f64 = (text.lines())
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_over_limit_with_local_cache_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        cached >= 1.0,
        "no refusal from the over-limit cache:\n{text}"
    );
    // Once the key is gone, a new window starts at the next hit.
    wait_for("the key to expire", || {
        (r.cli(&["EXISTS", &key]) != "0").then(|| "still there".into())
    });
    let again = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
        .await
        .unwrap();
    assert_eq!(code(&again), "OK");
    assert_eq!(header(&again, "X-RateLimit-Reset"), "59");
}

#[tokio::test]
async fn a_check_or_a_refused_call_leaves_no_key() {
    let r = Redis::start();
    let u = url(&r);
    let l = Limitador::start_on(&[], LIMITS, &["redis", u.as_str()], &[ROOMY]);
    // CheckRateLimit counts nothing and starts no window: Limitador's check creates nothing.
    let checked = unary(&l.grpc(), CHECK, toystore("alice")).await.unwrap();
    assert_eq!(code(&checked), "OK");
    // hits_addend 5 on a limit of 2 is refused; what it counted is refunded, key and all.
    let refused = unary(
        &l.grpc(),
        SHOULD_RATE_LIMIT,
        request("cel", &[&[("method", "GET")]], 5),
    )
    .await
    .unwrap();
    assert_eq!(code(&refused), "OVER_LIMIT");
    wait_for("no key in Redis", || {
        let ks = keys(&r);
        (!ks.is_empty()).then(|| format!("{ks:?}"))
    });
    // A report counts, and makes the key with one window of TTL.
    let reported = unary(&l.grpc(), REPORT, toystore("alice")).await.unwrap();
    assert_eq!(code(&reported), "OK");
    let key = first_key(&r);
    assert_eq!(r.cli(&["GET", &key]), "1");
    let pttl: u64 = r.cli(&["PTTL", &key]).parse().unwrap();
    assert!((55_000..=60_000).contains(&pttl), "PTTL {pttl}");
}

/// The binary under Limitador's name with `args`, expected to stop at start: its stderr.
pub(super) fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = crate::common::tempdir::TempDir::new("limitador-refused");
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, LIMITS).unwrap();
    let exe = limitador_server(dir.path());
    let mut all = vec![
        "--http-port",
        "0",
        "--rls-port",
        "0",
        file.to_str().unwrap(),
    ];
    all.extend(args);
    let mut s = Starting::spawn(&exe, &all, env);
    let (status, stderr) = s
        .exit_within(Duration::from_secs(30))
        .expect("refused at start");
    assert!(!status.success(), "{stderr}");
    stderr
}

/// On a store that runs no scripts (a Valkey with its Lua module unloaded) the start stops,
/// naming the store's answer: every limit of Limitador's counts from its first hit, by a script.
#[test]
fn a_store_without_scripts_stops_the_start() {
    let v = Redis::valkey_without_lua();
    let stderr = refused(&["redis", &url(&v)], &[ROOMY]);
    for want in [
        "limitador-server's limits count from their first hit through a script",
        "REDIS_URL (valkey",
        "Could not find scripting engine 'lua'",
    ] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
}

/// A storage's arguments, the environment beside them, and what the refusal names.
type Refusal = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[test]
fn what_turnstile_cannot_do_as_the_url_or_a_flag_says_is_refused_naming_it() {
    let cases: [Refusal; 5] = [
        (&["redis", "redis://127.0.0.1:1/3"], &[], "database `3`"),
        (
            &["redis", "rediss://127.0.0.1:1/#insecure"],
            &[],
            "#insecure",
        ),
        (&["redis", "redis://bob@127.0.0.1:1"], &[], "user `bob`"),
        (&["redis", "127.0.0.1:6379"], &[], "Redis URL"),
        // The URL's password and REDIS_AUTH disagree: neither wins, and neither shows.
        (
            &["redis", "redis://:hunter2@127.0.0.1:1"],
            &[("REDIS_AUTH", "other")],
            "REDIS_AUTH",
        ),
    ];
    for (args, env, says) in cases {
        let stderr = refused(args, env);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    // Limitador's own `REDIS_URL`, with no storage argument: a URL, read the same way.
    let stderr = refused(&[], &[("REDIS_URL", "redis://127.0.0.1:1/4")]);
    assert!(stderr.contains("database `4`"), "{stderr}");
}

#[tokio::test]
async fn limitadors_environment_and_a_password_in_the_url_reach_redis() {
    let r = Redis::start_with(&["--requirepass", "p@ss/w:rd"]);
    // No storage argument: REDIS_URL gives Redis, exact, as in Limitador.
    let u = format!("redis://default:p%40ss%2Fw%3Ard@127.0.0.1:{}", r.port);
    let l = Limitador::start_on(&[], LIMITS, &[], &[("REDIS_URL", u.as_str()), ROOMY]);
    let ok = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
        .await
        .unwrap();
    assert_eq!(code(&ok), "OK");
    // Decided in Redis: the key is there at once.
    assert_eq!(r.cli(&["GET", &first_key(&r)]), "1");
}

#[tokio::test]
async fn redis_cached_decides_locally_and_flushes_every_period() {
    let r = Redis::start();
    let u = url(&r);
    let l = Limitador::start_on(
        &[],
        LIMITS,
        &["redis_cached", u.as_str(), "--flush-period", "200"],
        &[ROOMY],
    );
    for _ in 0..3 {
        let ok = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
            .await
            .unwrap();
        assert_eq!(code(&ok), "OK");
    }
    // The hits reach Redis with a sync, within a few flush periods.
    wait_for("three hits in Redis", || {
        let ks: Vec<String> = keys(&r)
            .into_iter()
            .filter(|k| k.ends_with("_first"))
            .collect();
        let n = ks.first().map(|k| r.cli(&["GET", k]));
        (n.as_deref() != Some("3")).then(|| format!("{ks:?} {n:?}"))
    });
    let over = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
        .await
        .unwrap();
    assert_eq!(code(&over), "OVER_LIMIT");
    // The same through REDIS_LOCAL_CACHE_ENABLED=1 and no storage argument.
    let r2 = Redis::start();
    let u2 = url(&r2);
    let env = [
        ("REDIS_URL", u2.as_str()),
        ("REDIS_LOCAL_CACHE_ENABLED", "1"),
        ("REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS", "200"),
        ROOMY,
    ];
    let l2 = Limitador::start_on(&[], LIMITS, &[], &env);
    let ok = unary(&l2.grpc(), SHOULD_RATE_LIMIT, toystore("bob"))
        .await
        .unwrap();
    assert_eq!(code(&ok), "OK");
    wait_for("the hit in Redis", || {
        let ks: Vec<String> = keys(&r2)
            .into_iter()
            .filter(|k| k.ends_with("_first"))
            .collect();
        (ks.len() != 1).then(|| format!("{ks:?}"))
    });
}
