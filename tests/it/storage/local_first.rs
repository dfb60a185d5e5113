//! Local-first: replicas decide from memory and sync with Redis in the background. Three
//! replicas on one Redis under concurrent load admit at most the limit plus the bound docs/redis-and-fleets.md
//! states, in every window; a replica keeps deciding while Redis is away and hands its hits over
//! when Redis is back. Time is each server's manual clock, moved in 10 ms steps by the test.

use std::time::{Duration, Instant};

use crate::common::redis::{env, Redis};
use crate::common::*;
use futures_util::future::join_all;

/// The sync interval the replicas run with, and docs/redis-and-fleets.md's bound for it: a replica decides
/// locally only on a count read at most 1.5 T ago, so what it cannot see is what the others
/// admitted in the last 2.5 T, plus the Redis deadline (a round trip can land that late).
const SYNC_MS: u64 = 50;
const DEADLINE_MS: u64 = 50;
const UNSEEN_MS: u64 = SYNC_MS * 5 / 2 + DEADLINE_MS;
const STEP_MS: u64 = 10;

const LIMITS: &str = r#"
domain: fleet
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 300}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 300, algorithm: token_bucket}
  - key: exact
    rate_limit: {unit: minute, requests_per_unit: 5, local_first: false}
"#;

fn lf_env(redis: &Redis, prefix: &str, more: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = env(redis, prefix);
    for (k, v) in [
        ("TURNSTILE_LOCAL_FIRST", "true"),
        ("TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL", "50ms"),
        ("TURNSTILE_REDIS_DEADLINE_MS", "50"),
    ]
    .iter()
    .chain(more)
    {
        e.retain(|(n, _)| n != k);
        e.push((k.to_string(), v.to_string()));
    }
    e
}

/// Admissions as (ms since T0, replica).
type Admitted = Vec<(u64, usize)>;

/// Holds fixed-window keys in Redis for as long as their window lasts on the servers' clocks.
/// A key's TTL (the window's length, set when it is made) runs on Redis's wall clock, while the
/// servers' windows run on the manual clock: on a busy machine a manual second takes longer
/// than a real one, the key would expire mid-window, and the replicas would count the window
/// again from 0. Each step takes the TTL off the keys under `pattern` (at most 4 windows).
struct HoldKeys {
    conn: ::redis::aio::MultiplexedConnection,
    pattern: String,
}

impl HoldKeys {
    async fn new(redis: &Redis, pattern: String) -> HoldKeys {
        let client = ::redis::Client::open(format!("redis://{}", redis.url())).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        HoldKeys { conn, pattern }
    }

    async fn hold(&mut self) {
        let script =
            "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('PERSIST', k) end";
        let _: () = ::redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(&self.pattern)
            .query_async(&mut self.conn)
            .await
            .unwrap();
    }
}

/// Runs `steps` steps of 10 ms on every replica's clock; in each, `per_step` concurrent calls
/// for `key=value` on every replica. Answers the admissions.
async fn load(
    replicas: &[TestServer],
    key: &str,
    steps: u64,
    per_step: usize,
    mut hold: Option<&mut HoldKeys>,
) -> Admitted {
    let mut admitted = Vec::new();
    for step in 1..=steps {
        if let Some(h) = hold.as_deref_mut() {
            h.hold().await;
        }
        for r in replicas {
            r.advance(Duration::from_millis(STEP_MS));
        }
        let calls = replicas.iter().enumerate().flat_map(|(i, r)| {
            (0..per_step)
                .map(move |_| async move { (i, r.call(one("fleet", &[(key, "u1")])).await) })
        });
        for (i, resp) in join_all(calls).await {
            if resp.overall_code == OK {
                admitted.push((step * STEP_MS, i));
            }
        }
    }
    admitted
}

/// The most the others could have admitted unseen by the replica whose admission came last
/// before `t` (ms): what every other replica admitted in the `UNSEEN_MS` before it.
fn unseen_before(admitted: &Admitted, from: u64, t: u64) -> usize {
    let in_range: Vec<&(u64, usize)> = admitted
        .iter()
        .filter(|(at, _)| *at >= from && *at < t)
        .collect();
    let Some(&&(last, who)) = in_range.iter().max_by_key(|(at, _)| *at) else {
        return 0;
    };
    let lo = last.saturating_sub(UNSEEN_MS);
    // Several replicas may admit in the last step: take the worst choice of "last".
    (0..3)
        .filter(|i| in_range.iter().any(|(at, r)| *at == last && r == i))
        .map(|i| {
            in_range
                .iter()
                .filter(|(at, r)| *r != i && *at >= lo && *at <= last)
                .count()
        })
        .max()
        .unwrap_or_else(|| {
            in_range
                .iter()
                .filter(|(at, r)| *r != who && *at >= lo)
                .count()
        })
}

/// Round trips the replicas counted as failed (errors, or slower than the 50 ms deadline).
async fn redis_failures(replicas: &[TestServer]) -> f64 {
    let mut sum = 0.0;
    for r in replicas {
        let url = format!("{}/metrics", r.http);
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        sum += metric_sum(&text, "ratelimit_service_redis_errors_total");
    }
    sum
}

/// Runs a fleet scenario up to three times. docs/redis-and-fleets.md's bound holds while Redis answers within the
/// deadline (50 ms here); on a machine too busy for that, a round trip fails, the replicas
/// decide on their own for a while, and the attempt shows nothing about the bound: it is made
/// again on fresh keys. A scenario that fails with every round trip in time fails the test.
async fn fleet_attempts<F, Fut>(mut scenario: F)
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = (Result<(), String>, f64)>,
{
    let mut why = Vec::new();
    for attempt in 1..=3 {
        let (result, failed_round_trips) = scenario(format!("a{attempt}_")).await;
        match result {
            Ok(()) => return,
            Err(e) if failed_round_trips > 0.0 => {
                eprintln!("attempt {attempt} inconclusive ({failed_round_trips} slow or failed round trips): {e}");
                why.push(e);
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("Redis was too slow for the deadline in all 3 attempts: {why:?}");
}

async fn replicas(redis: &Redis, prefix: &str) -> Vec<TestServer> {
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(TestServer::start_env(LIMITS, lf_env(redis, prefix, &[])).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_admit_at_most_the_limit_plus_the_bound_in_every_window() {
    let redis = Redis::start();
    let redis = &redis;
    fleet_attempts(|prefix| async move {
        let replicas = replicas(redis, &format!("lf3_{prefix}")).await;
        let mut hold = HoldKeys::new(redis, format!("lf3_{prefix}*")).await;
        let result = fixed_window_bound(&replicas, &mut hold).await;
        (result, redis_failures(&replicas).await)
    })
    .await;
}

/// 3 windows of 1 s; each replica gets 4 calls per 10 ms step (400/s, 1200/s in all): every
/// window admits at most the limit plus the bound, and at least the limit.
async fn fixed_window_bound(replicas: &[TestServer], hold: &mut HoldKeys) -> Result<(), String> {
    let admitted = load(replicas, "user", 300, 4, Some(hold)).await;
    let start = T0 / 1_000_000;
    let mut windows = 0;
    for w in 0..4u64 {
        // Window w holds the steps whose time (T0 + at) falls in it.
        let lo = (start / 1000 + w) * 1000 - start;
        let hi = lo + 1000;
        let total = admitted
            .iter()
            .filter(|(at, _)| *at >= lo && *at < hi)
            .count();
        if total == 0 {
            continue;
        }
        let bound = unseen_before(&admitted, lo, hi);
        if total > 300 + bound {
            return Err(format!(
                "window {w}: {total} admitted by three replicas, limit 300 + bound {bound}"
            ));
        }
        // Without syncing, three replicas would admit up to 900.
        if total >= 600 {
            return Err(format!(
                "window {w}: {total} admitted, the sync is not working"
            ));
        }
        // A full window under load fills: the limit is not lost either.
        if lo >= STEP_MS && hi <= 300 * STEP_MS {
            assert!(total >= 300, "window {w}: only {total} admitted under load");
            windows += 1;
        }
    }
    assert!(windows >= 2, "the test covered {windows} full windows");
    // Every replica decided locally (no round trip) for most of its calls.
    for r in replicas {
        let metrics = reqwest::get(format!("{}/metrics", r.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let local = metric_sum(&metrics, "ratelimit_service_local_first_decisions_total");
        if local <= 600.0 {
            return Err(format!("only {local} local decisions of 1200"));
        }
        assert!(metric_sum(&metrics, "ratelimit_service_local_first_syncs_total") > 0.0);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_a_token_bucket_within_the_bound() {
    let redis = Redis::start();
    let redis = &redis;
    fleet_attempts(|prefix| async move {
        let replicas = replicas(redis, &format!("lfb_{prefix}")).await;
        let result = token_bucket_bound(&replicas).await;
        (result, redis_failures(&replicas).await)
    })
    .await;
}

/// 2 s at 1200/s offered against 300/s with a burst of 300: within burst + rate x time plus
/// the bound, and at least 90 % of it.
async fn token_bucket_bound(replicas: &[TestServer]) -> Result<(), String> {
    let steps = 200;
    let admitted = load(replicas, "bucket", steps, 4, None).await;
    let bound = unseen_before(&admitted, 0, u64::MAX);
    let allowed = 300 + 300 * steps * STEP_MS / 1000;
    let total = admitted.len() as u64;
    if total > allowed + bound as u64 {
        return Err(format!(
            "{total} admitted, burst + rate x time = {allowed}, bound {bound}"
        ));
    }
    assert!(
        total >= allowed * 9 / 10,
        "only {total} of {allowed} admitted"
    );
    if total >= allowed + 600 {
        return Err(format!("{total} admitted: the sync is not working"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_keeps_deciding_while_redis_is_away_and_hands_its_hits_over_after() {
    let mut redis = Redis::start();
    let e = lf_env(
        &redis,
        "lfdown_",
        &[("TURNSTILE_REDIS_FAILURE_MODE", "fail_closed")],
    );
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: e\n    rate_limit: {unit: hour, requests_per_unit: 10, local_first: false}\n";
    let s = TestServer::start_env(yaml, e).await;
    let call = |k: &'static str| s.try_call(one("d", &[(k, "v")]));
    // The first call has no view: it goes through Redis, which counts it.
    assert_eq!(call("k").await.unwrap().overall_code, OK);
    let key = redis_key(&redis, "lfdown_d_k_v_");
    assert_eq!(redis.cli(&["GET", &key]), "1");
    // Decided locally from now on.
    for _ in 0..2 {
        assert_eq!(call("k").await.unwrap().overall_code, OK);
    }
    // A tick later the sync hands them over.
    wait_for(&s, &redis, &key, "3").await;
    redis.kill();
    // Redis is away: local-first keeps answering (fail_closed refuses the exact limit).
    for _ in 0..4 {
        assert_eq!(call("k").await.unwrap().overall_code, OK);
    }
    let exact = call("e").await;
    assert_eq!(
        exact.as_ref().map_err(|e| e.code()).err(),
        Some(tonic::Code::Unavailable),
        "the exact limit fails closed: {exact:?}"
    );
    // Past the view's freshness, still local: Redis cannot be asked.
    s.advance(Duration::from_millis(500));
    for _ in 0..3 {
        assert_eq!(call("k").await.unwrap().overall_code, OK);
    }
    // The replica holds the limit alone meanwhile: 10 in all.
    assert_eq!(call("k").await.unwrap().overall_code, OVER);
    // Redis comes back empty: the next syncs hand over the 7 hits made while it was away.
    redis.restart();
    wait_for(&s, &redis, &key, "7").await;
}

/// Moves the clock on a sync interval at a time until Redis holds `want` at `key`.
async fn wait_for(s: &TestServer, redis: &Redis, key: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        s.advance(Duration::from_millis(SYNC_MS));
        let got = redis.cli(&["GET", key]);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Redis holds {got:?} at {key}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one key starting with `prefix` (the window start follows it).
fn redis_key(redis: &Redis, prefix: &str) -> String {
    let keys = redis.cli(&["KEYS", &format!("{prefix}*")]);
    assert_eq!(keys.lines().count(), 1, "keys: {keys}");
    keys.lines().next().unwrap().to_owned()
}

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
