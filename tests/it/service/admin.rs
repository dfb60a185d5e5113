//! Acting on a limit through the admin listener, against the real server with a real HTTP
//! client: a look-up shows what each limit has used and counts nothing; a reset counts a
//! descriptor from zero in memory, in Redis and across replicas sharing it; the listener is
//! loopback-only or guarded by a token; bad input is a 4xx naming the problem; every call is
//! counted.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::redis::{env as redis_env, Redis};
use crate::common::storage::{test_with_every_storage, Storage};
use crate::common::tempdir::TempDir;
use crate::common::*;
use serde_json::{json, Value};

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
  - key: plan
    rate_limits:
      - {unit: minute, requests_per_unit: 2, name: burst}
      - {unit: hour, requests_per_unit: 5, name: hourly}
  - key: free
    rate_limit: {unlimited: true}
  - key: job
    rate_limit:
      unit: minute
      requests_per_unit: 1
      queue: {max_waiting: 5, max_wait: 50s}
"#;

const ADMIN: [(&str, &str); 1] = [("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0")];

/// T0 is 20 s into its minute: a minute window resets 40 s later.
const WINDOW_END: u64 = 1_700_000_040;

fn admin_url(s: &TestServer, path: &str) -> String {
    let addr = s.running().admin_addr.expect("the admin listener");
    format!("http://{addr}{path}")
}

/// `/json`'s body: one descriptor with these entries.
fn body(domain: &str, pairs: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = pairs
        .iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    json!({"domain": domain, "descriptors": [{"entries": entries}]})
}

async fn post(url: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
    let mut r = reqwest::Client::new().post(url).json(body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = r.status().as_u16();
    (status, r.json().await.expect("a JSON body"))
}

/// The limits a look-up of one descriptor reports (asserting it answers 200).
async fn look_up(s: &TestServer, pairs: &[(&str, &str)]) -> Vec<Value> {
    let (status, v) = post(&admin_url(s, "/admin/look-up"), &body("edge", pairs), None).await;
    assert_eq!(status, 200, "{v}");
    v["limits"].as_array().expect("limits").clone()
}

/// The limits a reset of one descriptor reports (asserting it answers 200).
async fn reset(s: &TestServer, pairs: &[(&str, &str)], query: &str) -> Vec<Value> {
    let url = admin_url(s, &format!("/admin/reset{query}"));
    let (status, v) = post(&url, &body("edge", pairs), None).await;
    assert_eq!(status, 200, "{v}");
    v["limits"].as_array().expect("limits").clone()
}

/// (code, remaining) of a one-descriptor call.
async fn hit(s: &TestServer, pairs: &[(&str, &str)]) -> (i32, u32) {
    codes(&s.call(one("edge", pairs)).await)[0]
}

/// (used, remaining, resets_in_seconds) of a looked-up limit.
fn usage(l: &Value) -> (u64, u64, u64) {
    let n = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("no {k} in {l}"));
    (n("used"), n("remaining"), n("resets_in_seconds"))
}

/// A look-up reports each algorithm's use after known traffic, and counts nothing: the calls
/// after it are answered exactly as a twin descriptor's calls without look-ups are.
async fn a_look_up_shows_use_and_counts_nothing(storage: &Storage) {
    let s = storage.start_with(CONFIG, &ADMIN).await;
    for key in ["api_key", "sliding", "bucket"] {
        for who in ["alice", "bob"] {
            for _ in 0..2 {
                assert_eq!(hit(&s, &[(key, who)]).await.0, OK);
            }
        }
    }
    let l = &look_up(&s, &[("api_key", "alice")]).await[0];
    assert_eq!(usage(l), (2, 1, 40), "{l}");
    assert_eq!(l["resets_at"], WINDOW_END);
    assert_eq!(l["name"], "per_key");
    assert_eq!(l["key"], "edge_api_key_alice_");
    assert_eq!(l["algorithm"], "fixed_window");
    assert_eq!(
        (&l["unit"], &l["requests_per_unit"]),
        (&json!("minute"), &json!(3))
    );
    assert_eq!(l["waiting"], 0);
    let l = &look_up(&s, &[("sliding", "alice")]).await[0];
    assert_eq!(
        (usage(l), &l["algorithm"]),
        ((2, 1, 40), &json!("sliding_window"))
    );
    // Two tokens of 20 s each are out: the bucket is full again in 40 s.
    let l = &look_up(&s, &[("bucket", "alice")]).await[0];
    assert_eq!(
        (usage(l), &l["algorithm"]),
        ((2, 1, 40), &json!("token_bucket"))
    );
    for key in ["api_key", "sliding", "bucket"] {
        for _ in 0..3 {
            look_up(&s, &[(key, "alice")]).await;
        }
        let alice = [
            hit(&s, &[(key, "alice")]).await,
            hit(&s, &[(key, "alice")]).await,
        ];
        let bob = [
            hit(&s, &[(key, "bob")]).await,
            hit(&s, &[(key, "bob")]).await,
        ];
        assert_eq!(alice, bob, "{key}");
        assert_eq!(alice, [(OK, 0), (OVER, 0)], "{key}");
    }
    // A descriptor never seen reads empty, and the look-up leaves nothing behind in Redis.
    let l = &look_up(&s, &[("api_key", "carol")]).await[0];
    assert_eq!(usage(l), (0, 3, 40));
    if let Storage::Redis(r) | Storage::LocalFirst(r) = storage {
        assert_eq!(r.cli(&["KEYS", "*carol*"]), "");
    }
    // An unlimited limit is listed as such, with nothing to count.
    let l = &look_up(&s, &[("free", "x")]).await[0];
    assert_eq!((&l["unlimited"], l.get("used")), (&json!(true), None));
}

/// A reset counts a descriptor from zero on every limit that applies, or on the one named; in
/// Redis it deletes the keys decisions count in.
async fn a_reset_counts_the_descriptor_from_zero(storage: &Storage) {
    let s = storage.start_with(CONFIG, &ADMIN).await;
    let redis = match storage {
        Storage::Redis(r) | Storage::LocalFirst(r) => Some(r),
        Storage::Memory | Storage::Durable(_) => None,
    };
    for key in ["api_key", "sliding", "bucket"] {
        for _ in 0..3 {
            assert_eq!(hit(&s, &[(key, "alice")]).await.0, OK);
        }
        assert_eq!(hit(&s, &[(key, "alice")]).await.0, OVER, "{key}");
        let done = reset(&s, &[(key, "alice")], "").await;
        assert_eq!(done[0]["reset"], true);
        if redis.is_some() {
            // The fixed window's key, the sliding window's current one, the bucket's TAT.
            assert_eq!(done[0]["store_keys_deleted"], 1, "{key}: {done:?}");
        } else {
            assert_eq!(done[0].get("store_keys_deleted"), None);
        }
        assert_eq!(hit(&s, &[(key, "alice")]).await, (OK, 2), "{key}");
        assert_eq!(
            usage(&look_up(&s, &[(key, "alice")]).await[0]).0,
            1,
            "{key}"
        );
    }
    if let Some(r) = redis {
        let key = r.cli(&["KEYS", "*edge_api_key_alice_1699999980"]);
        assert_eq!(r.cli(&["GET", &key]), "1", "{key}");
    }
    // Two limits on one descriptor: `?limit=` resets the one named only.
    for _ in 0..2 {
        assert_eq!(hit(&s, &[("plan", "pro")]).await.0, OK);
    }
    assert_eq!(hit(&s, &[("plan", "pro")]).await.0, OVER);
    let done = reset(&s, &[("plan", "pro")], "?limit=burst").await;
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["name"], "burst");
    let used: Vec<(Value, u64)> = (look_up(&s, &[("plan", "pro")]).await.iter())
        .map(|l| (l["name"].clone(), usage(l).0))
        .collect();
    assert_eq!(used, vec![(json!("burst"), 0), (json!("hourly"), 2)]);
    assert_eq!(hit(&s, &[("plan", "pro")]).await.0, OK);
    let done = reset(&s, &[("plan", "pro")], "").await;
    assert_eq!(done.len(), 2);
}

test_with_every_storage!(
    a_look_up_shows_use_and_counts_nothing,
    a_reset_counts_the_descriptor_from_zero
);

/// Two replicas sharing one Redis: replica A's traffic uses the limit up, B refuses too, a reset
/// through B's admin listener frees it for both, and both see the same count after.
#[tokio::test]
async fn a_reset_through_one_replica_frees_the_limit_for_every_replica() {
    let redis = Redis::start();
    let mut env = redis_env(&redis, "fleet_");
    env.push(("TURNSTILE_ADMIN_ADDR".into(), "127.0.0.1:0".into()));
    let a = TestServer::start_env(CONFIG, env.clone()).await;
    let b = TestServer::start_env(CONFIG, env).await;
    let alice = [("api_key", "alice")];
    for _ in 0..3 {
        assert_eq!(hit(&a, &alice).await.0, OK);
    }
    assert_eq!(hit(&b, &alice).await, (OVER, 0));
    assert_eq!(usage(&look_up(&a, &alice).await[0]).0, 3);
    let done = reset(&b, &alice, "").await;
    assert_eq!(done[0]["store_keys_deleted"], 1);
    assert_eq!(redis.cli(&["KEYS", "fleet_*"]), "");
    assert_eq!(hit(&b, &alice).await, (OK, 2));
    assert_eq!(hit(&a, &alice).await, (OK, 1));
    for s in [&a, &b] {
        assert_eq!(usage(&look_up(s, &alice).await[0]), (2, 1, 40));
    }
}

/// The bound SECURITY.md and docs/operations.md state: a replica that refused a key holds it in its
/// over-limit cache until the window ends, reset or not (as envoyproxy/ratelimit's local cache
/// does); one without the cache admits at once.
#[tokio::test]
async fn another_replicas_over_limit_cache_refuses_until_the_window_ends() {
    let redis = Redis::start();
    let env = |cache: &str| {
        let mut env = redis_env(&redis, "cache_");
        env.push(("TURNSTILE_ADMIN_ADDR".into(), "127.0.0.1:0".into()));
        env.push(("LOCAL_CACHE_SIZE_IN_BYTES".into(), cache.into()));
        env
    };
    let cached = TestServer::start_env(CONFIG, env("1048576")).await;
    let uncached = TestServer::start_env(CONFIG, env("0")).await;
    let serving = TestServer::start_env(CONFIG, env("1048576")).await;
    let alice = [("api_key", "alice")];
    for _ in 0..3 {
        assert_eq!(hit(&cached, &alice).await.0, OK);
    }
    for s in [&cached, &uncached, &serving] {
        assert_eq!(hit(s, &alice).await.0, OVER);
    }
    reset(&serving, &alice, "").await;
    assert_eq!(hit(&serving, &alice).await, (OK, 2));
    assert_eq!(hit(&uncached, &alice).await, (OK, 1));
    assert_eq!(hit(&cached, &alice).await, (OVER, 0));
    for s in [&cached, &uncached, &serving] {
        s.advance(Duration::from_secs(40));
    }
    assert_eq!(hit(&cached, &alice).await, (OK, 2));
}

/// A reset gives the room to the key's waiters first: the queued call is admitted at once.
#[tokio::test]
async fn a_reset_admits_the_keys_waiters() {
    let s = Storage::memory().start_with(CONFIG, &ADMIN).await;
    let job = [("job", "nightly")];
    assert_eq!(hit(&s, &job).await.0, OK);
    let mut client = s.client.clone();
    let waiter =
        tokio::spawn(async move { client.should_rate_limit(one("edge", &job)).await.unwrap() });
    let deadline = Instant::now() + Duration::from_secs(10);
    while look_up(&s, &job).await[0]["waiting"] != 1 {
        assert!(Instant::now() < deadline, "the call never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reset(&s, &job, "").await;
    let answer = waiter.await.unwrap().into_inner();
    assert_eq!(codes(&answer), vec![(OK, 0)]);
    let l = &look_up(&s, &job).await[0];
    assert_eq!((usage(l).0, &l["waiting"]), (1, &json!(0)));
}

/// `turnstile_admin_actions_total{action, outcome}` on the metrics port.
async fn admin_actions(s: &TestServer, action: &str, outcome: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", s.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series =
        format!("turnstile_admin_actions_total{{action=\"{action}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in the exposition"))
        .parse()
        .unwrap()
}

/// With a token file, calls without the token or with another are 401; with it, 200.
#[tokio::test]
async fn the_token_guards_the_listener_and_every_call_is_counted() {
    let dir = TempDir::new("admin-token");
    let token = "a-long-admin-token-0123456789";
    let file = dir.write("admin.token", &format!("{token}\n"));
    let env = [
        ("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0"),
        ("TURNSTILE_ADMIN_TOKEN_FILE", file.to_str().unwrap()),
    ];
    let s = Storage::memory().start_with(CONFIG, &env).await;
    let alice = body("edge", &[("api_key", "alice")]);
    let url = admin_url(&s, "/admin/look-up");
    let r = reqwest::Client::new()
        .post(&url)
        .json(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"),
        "{v}"
    );
    let (status, v) = post(&url, &alice, Some("a-long-admin-token-012345678X")).await;
    assert_eq!((status, &v["error"]), (401, &json!("wrong admin token")));
    let (status, _) = post(&admin_url(&s, "/admin/reset"), &alice, None).await;
    assert_eq!(status, 401);
    let (status, v) = post(&url, &alice, Some(token)).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(&admin_url(&s, "/admin/reset"), &alice, Some(token)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(admin_actions(&s, "look_up", "unauthorized").await, 2);
    assert_eq!(admin_actions(&s, "reset", "unauthorized").await, 1);
    assert_eq!(admin_actions(&s, "look_up", "done").await, 1);
    assert_eq!(admin_actions(&s, "reset", "done").await, 1);
}

/// The binary refuses to start an admin listener off loopback without a token, naming why.
#[test]
fn an_admin_listener_off_loopback_without_a_token_stops_the_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .arg("serve")
        .env_clear()
        .env("TURNSTILE_ADMIN_ADDR", "0.0.0.0:0")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("TURNSTILE_ADMIN_ADDR=0.0.0.0:0 is not a loopback address")
            && stderr.contains("TURNSTILE_ADMIN_TOKEN_FILE"),
        "{stderr}"
    );
}

/// Bad input is a 4xx whose message names the problem, and is counted as such.
#[tokio::test]
async fn bad_input_gets_a_4xx_naming_what_is_wrong() {
    let s = Storage::memory().start_with(CONFIG, &ADMIN).await;
    let look = admin_url(&s, "/admin/look-up");
    let cases: [(&str, Value, u16, &str); 8] = [
        (
            "/admin/look-up",
            body("nope", &[("api_key", "a")]),
            404,
            "no domain \"nope\" in the loaded config (domains: edge)",
        ),
        (
            "/admin/look-up",
            body("edge", &[("", "a")]),
            400,
            "descriptors[0].entries[0].key must not be empty",
        ),
        (
            "/admin/look-up",
            json!({"domain": "edge", "descriptors": [{"entries": [{"key": "k", "value": 5}]}]}),
            400,
            "bad JSON body",
        ),
        (
            "/admin/look-up",
            body("edge", &[("nothing", "x")]),
            404,
            "descriptors[0] (nothing=x) matches no limit in domain \"edge\"",
        ),
        (
            "/admin/reset?limit=daily",
            body("edge", &[("plan", "pro")]),
            404,
            "no limit named \"daily\" applies to these descriptors (the limits that apply: \"burst\", \"hourly\")",
        ),
        // A limit without a name is not "": `?limit=` cannot pick it, and says why.
        (
            "/admin/reset?limit=sliding",
            body("edge", &[("sliding", "x")]),
            404,
            "no limit named \"sliding\" applies to these descriptors (the limit that applies \
             has no name: leave ?limit= out to act on every limit that applies, or give one a \
             name: in the config)",
        ),
        (
            "/admin/reset?limit=",
            body("edge", &[("sliding", "x")]),
            400,
            "limit= is empty: name the limit",
        ),
        (
            "/admin/reset?limits=burst",
            body("edge", &[("plan", "pro")]),
            400,
            "unknown query parameter \"limits\"",
        ),
    ];
    for (path, b, want_status, want) in cases {
        let (status, v) = post(&admin_url(&s, path), &b, None).await;
        let message = v["error"].as_str().unwrap_or_default();
        assert_eq!(status, want_status, "{path} {b}: {v}");
        assert!(message.contains(want), "{path} {b}: {message}");
    }
    let hits = json!({"domain": "edge", "hitsAddend": 2,
        "descriptors": [{"entries": [{"key": "api_key", "value": "a"}]}]});
    let (status, v) = post(&look, &hits, None).await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("hits_addend"), "{v}");
    let r = reqwest::get(&look).await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(admin_actions(&s, "look_up", "not_found").await, 2);
    assert_eq!(admin_actions(&s, "look_up", "bad_request").await, 3);
    assert_eq!(admin_actions(&s, "reset", "not_found").await, 2);
    assert_eq!(admin_actions(&s, "reset", "bad_request").await, 2);
    // None of it counted anything.
    assert_eq!(usage(&look_up(&s, &[("api_key", "a")]).await[0]).0, 0);
}

/// A reset's log line names the limit as `refused_by` does, by its stat key when it has no
/// `name`, and says nothing of store keys where there is no store.
#[tokio::test]
async fn a_reset_of_an_unnamed_limit_is_logged_by_its_stat_key() {
    use crate::common::binary::{Server, BIN};
    let t = TempDir::new("reset-log");
    let config = t.write(
        "limits.yaml",
        "domain: web\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    );
    let server = Server::start(
        std::path::Path::new(BIN),
        &["serve", "--config", config.to_str().unwrap()],
        &ADMIN,
    );
    let admin = server.ports.admin.expect("the admin listener's address");
    let url = format!("http://{admin}/admin/reset");
    let (status, v) = post(&url, &body("web", &[("remote_address", "10.0.0.1")]), None).await;
    assert_eq!(status, 200, "{v}");
    let log = server.stop();
    let line = (log.lines())
        .find(|l| l.contains("limit reset"))
        .unwrap_or_else(|| panic!("no reset logged:\n{log}"));
    assert!(line.contains("limit=web.remote_address"), "{line}");
    assert!(!line.contains("store_keys_deleted"), "{line}");
}
