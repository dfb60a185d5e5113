//! Usage budgets: usage Envoy reports after the response (a descriptor's own `hits_addend`,
//! e.g. LLM tokens from `apply_on_stream_done`) counts in full, so a budget closes once usage
//! passes it, on every algorithm and storage; plain requests keep "a refused request consumes
//! nothing". The expected counts follow envoyproxy/ratelimit's rule (`INCRBY`, never undone;
//! over when count > limit: `src/limiter/base_limiter.go`, `GetResponseDescriptorStatus`).

use std::time::Duration;

use crate::common::storage::{test_with_every_storage, Storage};
use crate::common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const BUDGETS: &str = r#"
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: member
    descriptors:
      - key: tokens
        value: input
        rate_limit: {unit: day, requests_per_unit: 1000}
      - key: tokens
        value: output
        rate_limit: {unit: day, requests_per_unit: 2000}
  - key: team
    rate_limit: {unit: month, requests_per_unit: 5000}
  - key: both
    rate_limits:
      - {name: hourly, unit: hour, requests_per_unit: 1000}
      - {name: daily, unit: day, requests_per_unit: 3000}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window}
  - key: queued
    rate_limit:
      unit: second
      requests_per_unit: 10
      queue: {max_waiting: 4, max_wait: 2s}
  - key: queued_bucket
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      queue: {max_waiting: 4, max_wait: 2s}
"#;

/// The Redis key's value (fixed windows: envoyproxy/ratelimit's key) once it reads `want`, or
/// after a few seconds. Local-first replicas sync every 100 ms of their clock: it is moved on a
/// sync interval at a time meanwhile.
async fn stored(s: &TestServer, storage: &Storage, pattern: &str, want: &str) -> Option<String> {
    let (Storage::Redis(r) | Storage::LocalFirst(r)) = storage else {
        return None;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Storage::LocalFirst(_) = storage {
            s.advance(Duration::from_millis(100));
        }
        let keys = r.cli(&["KEYS", pattern]);
        let key = keys.lines().next().unwrap_or_default().to_owned();
        let value = if key.is_empty() {
            String::new()
        } else {
            r.cli(&["GET", &key])
        };
        if value == want || std::time::Instant::now() > deadline {
            return Some(value);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn reports_that_cross_the_budget_close_it(storage: &Storage) {
    let s = storage.start(BUDGETS).await;
    let alice = [("user", "alice")];
    assert_eq!(
        codes(&s.call(report("ai", &alice, 0)).await),
        vec![(OK, 1000)]
    );
    assert_eq!(
        codes(&s.call(report("ai", &alice, 900)).await),
        vec![(OK, 100)]
    );
    assert_eq!(
        codes(&s.call(report("ai", &alice, 0)).await),
        vec![(OK, 100)]
    );
    // 500 more than the 100 left: counted in full (Envoy ignores this answer: the tokens were
    // spent), so the budget is closed: 1400 of 1000.
    assert_eq!(
        codes(&s.call(report("ai", &alice, 500)).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&s.call(report("ai", &alice, 0)).await),
        vec![(OVER, 0)]
    );
    // Many reports after it: all counted, still closed.
    for _ in 0..10 {
        assert_eq!(s.call(report("ai", &alice, 500)).await.overall_code, OVER);
    }
    assert_eq!(
        codes(&s.call(report("ai", &alice, 0)).await),
        vec![(OVER, 0)]
    );
    // A plain request (no hits_addend) on a closed budget is refused too.
    assert_eq!(s.call(one("ai", &alice)).await.overall_code, OVER);
    assert_eq!(
        stored(&s, storage, "*ai_user_alice_*", "6400").await,
        storage_has_store(storage).then(|| "6400".to_owned()),
        "the Redis key holds every report: 900 + 500 + 10 x 500"
    );

    // Another user is unaffected.
    assert_eq!(
        codes(&s.call(report("ai", &[("user", "bob")], 0)).await),
        vec![(OK, 1000)]
    );

    // Exactly at the budget is still within it (count > limit refuses, as the reference does);
    // one more token closes it.
    let carol = [("user", "carol")];
    assert_eq!(
        codes(&s.call(report("ai", &carol, 1000)).await),
        vec![(OK, 0)]
    );
    assert_eq!(codes(&s.call(report("ai", &carol, 0)).await), vec![(OK, 0)]);
    assert_eq!(s.call(one("ai", &carol)).await.overall_code, OVER);
    assert_eq!(
        codes(&s.call(report("ai", &carol, 1)).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&s.call(report("ai", &carol, 0)).await),
        vec![(OVER, 0)]
    );

    // The hour's window ends 2800 s after T0 (800 s into its hour): the budget opens again.
    s.advance(Duration::from_secs(2800));
    assert_eq!(
        codes(&s.call(report("ai", &alice, 0)).await),
        vec![(OK, 1000)]
    );
}

fn storage_has_store(storage: &Storage) -> bool {
    !matches!(storage, Storage::Memory | Storage::Durable(_))
}

async fn a_token_bucket_goes_into_debt(storage: &Storage) {
    let s = storage.start(BUDGETS).await;
    let b = [("bucket", "b")];
    // 60 tokens a minute (one a second), a full bucket of 60. 90 used: 30 tokens of debt.
    assert_eq!(codes(&s.call(report("ai", &b, 90)).await), vec![(OVER, 0)]);
    assert_eq!(codes(&s.call(report("ai", &b, 0)).await), vec![(OVER, 0)]);
    // Refused until refilled past the debt: the bucket holds 0 tokens 30 s on, 1 at 31 s.
    s.advance(Duration::from_secs(29));
    assert_eq!(codes(&s.call(report("ai", &b, 0)).await), vec![(OVER, 0)]);
    s.advance(Duration::from_secs(1));
    assert_eq!(codes(&s.call(report("ai", &b, 0)).await), vec![(OK, 0)]);
    assert_eq!(s.call(one("ai", &b)).await.overall_code, OVER);
    s.advance(Duration::from_secs(1));
    assert_eq!(codes(&s.call(report("ai", &b, 0)).await), vec![(OK, 1)]);
    assert_eq!(codes(&s.call(one("ai", &b)).await), vec![(OK, 0)]);
}

async fn a_sliding_window_passes_its_limit(storage: &Storage) {
    let s = storage.start(BUDGETS).await;
    let w = [("sliding", "w")];
    assert_eq!(codes(&s.call(report("ai", &w, 150)).await), vec![(OVER, 0)]);
    assert_eq!(codes(&s.call(report("ai", &w, 0)).await), vec![(OVER, 0)]);
    // The next minute starts 40 s after T0: the previous window's 150 still weighs in full.
    s.advance(Duration::from_secs(40));
    assert_eq!(codes(&s.call(report("ai", &w, 0)).await), vec![(OVER, 0)]);
    // Halfway through it, 150 x 30/60 = 75 of 100: 25 left.
    s.advance(Duration::from_secs(30));
    assert_eq!(codes(&s.call(report("ai", &w, 0)).await), vec![(OK, 25)]);
}

async fn input_and_output_budgets_per_member_and_per_team(storage: &Storage) {
    let s = storage.start(BUDGETS).await;
    let call = |member: &str, input: u64, output: u64, team: u64| {
        req(
            "ai",
            vec![
                usage(&[("member", member), ("tokens", "input")], input),
                usage(&[("member", member), ("tokens", "output")], output),
                usage(&[("team", "t1")], team),
            ],
        )
    };
    // The check before the request, then what the response used.
    assert_eq!(
        codes(&s.call(call("ann", 0, 0, 0)).await),
        vec![(OK, 1000), (OK, 2000), (OK, 5000)]
    );
    assert_eq!(
        codes(&s.call(call("ann", 600, 1500, 2100)).await),
        vec![(OK, 400), (OK, 500), (OK, 2900)]
    );
    // The input budget is passed; output and team still fit: all three count.
    let r = s.call(call("ann", 600, 400, 1000)).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), vec![(OVER, 0), (OK, 100), (OK, 1900)]);
    let r = s.call(call("ann", 0, 0, 0)).await;
    assert_eq!(codes(&r), vec![(OVER, 0), (OK, 100), (OK, 1900)]);
    assert_eq!(r.overall_code, OVER);

    // Another member of the team has budgets of its own, and the team's in common.
    assert_eq!(
        codes(&s.call(call("ben", 0, 0, 0)).await),
        vec![(OK, 1000), (OK, 2000), (OK, 1900)]
    );
    assert_eq!(s.call(call("ben", 100, 100, 2000)).await.overall_code, OVER);
    let r = s.call(call("ben", 0, 0, 0)).await;
    assert_eq!(codes(&r), vec![(OK, 900), (OK, 1900), (OVER, 0)]);

    // The day ends 6400 s after T0: the members' budgets open, the team's month goes on.
    s.advance(Duration::from_secs(6400));
    let r = s.call(call("ann", 0, 0, 0)).await;
    assert_eq!(codes(&r), vec![(OK, 1000), (OK, 2000), (OVER, 0)]);
    // The month (30 days, from the epoch) ends 352 000 s after T0.
    s.advance(Duration::from_secs(352_000 - 6400));
    let r = s.call(call("ann", 0, 0, 0)).await;
    assert_eq!(codes(&r), vec![(OK, 1000), (OK, 2000), (OK, 5000)]);
    assert_eq!(r.overall_code, OK);
}

async fn queued_requests_behind_a_passed_budget_wait_for_the_window(storage: &Storage) {
    let s = storage.start(BUDGETS).await;
    let q = [("queued", "q")];
    assert_eq!(s.call(report("ai", &q, 25)).await.overall_code, OVER);
    // A request on the closed key waits for the next second's window, and is admitted there.
    let mut c = s.client.clone();
    let waiter = tokio::spawn(async move {
        c.should_rate_limit(one("ai", &[("queued", "q")]))
            .await
            .unwrap()
            .into_inner()
    });
    wait_for_waiters(&s, 1).await;
    s.advance(Duration::from_secs(1));
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("admitted at the next window")
        .unwrap();
    assert_eq!(codes(&r), vec![(OK, 9)]);

    // A token bucket 50 tokens in debt refills in 5 s, past the 2 s a waiter may wait: refused
    // at once, nothing queued.
    let tb = [("queued_bucket", "b")];
    assert_eq!(s.call(report("ai", &tb, 60)).await.overall_code, OVER);
    let r = s.call(one("ai", &tb)).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(waiting(&s), 0);
}

fn waiting(s: &TestServer) -> u64 {
    let stats = s.running().context.engine.stats().to_vec();
    stats.iter().map(|x| x.read().waiting).sum()
}

async fn wait_for_waiters(s: &TestServer, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while waiting(s) != n {
        assert!(tokio::time::Instant::now() < deadline, "{n} queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn plain_requests_refused_consume_nothing(storage: &Storage) {
    let s = storage
        .start("domain: ai\ndescriptors:\n  - key: api\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: blocked\n    rate_limit: {unit: minute, requests_per_unit: 0}\n")
        .await;
    let both = || req("ai", vec![desc(&[("api", "k")]), desc(&[("blocked", "x")])]);
    // Refused on `blocked`: `api` is not counted, and its status says so (10 left, not 9).
    for _ in 0..3 {
        let r = s.call(both()).await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!(codes(&r), vec![(OK, 10), (OVER, 0)]);
    }
    assert_eq!(
        codes(&s.call(one("ai", &[("api", "k")])).await),
        vec![(OK, 9)]
    );
}

/// Several limits on one descriptor: a report counts on every one of them.
async fn every_limit_of_a_descriptor_counts_the_usage(storage: &Storage) {
    let s = storage.start(BUDGETS).await;
    let b = [("both", "b")];
    let limit_name = |r: &RateLimitResponse| {
        let l = r.statuses[0].current_limit.as_ref().expect("a limit");
        l.name.clone()
    };
    // 800 of 1000 an hour, of 3000 a day: the hour is the closer one.
    let r = s.call(report("ai", &b, 800)).await;
    assert_eq!(
        (codes(&r), limit_name(&r)),
        (vec![(OK, 200)], "hourly".into())
    );
    // 2500 more: both passed (3300 of 1000, 3300 of 3000).
    assert_eq!(s.call(report("ai", &b, 2500)).await.overall_code, OVER);
    // The next hour (2800 s after T0) opens the hourly limit; the day is still over.
    s.advance(Duration::from_secs(2800));
    let r = s.call(report("ai", &b, 0)).await;
    assert_eq!(
        (codes(&r), limit_name(&r)),
        (vec![(OVER, 0)], "daily".into())
    );
}

test_with_every_storage!(
    every_limit_of_a_descriptor_counts_the_usage,
    reports_that_cross_the_budget_close_it,
    a_token_bucket_goes_into_debt,
    a_sliding_window_passes_its_limit,
    input_and_output_budgets_per_member_and_per_team,
    queued_requests_behind_a_passed_budget_wait_for_the_window,
    plain_requests_refused_consume_nothing,
);

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: unset keeps reports and drops refused requests;
/// `false` keeps every refused hit (the reference's default); `true` keeps none.
#[tokio::test]
async fn stop_cache_key_increment_when_overlimit_decides_what_a_refusal_keeps() {
    let yaml = "domain: ai\ndescriptors:\n  - key: api\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: blocked\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";
    let both = || req("ai", vec![desc(&[("api", "k")]), desc(&[("blocked", "x")])]);
    for (setting, request_kept, report_kept) in [
        (None, false, true),
        (Some("false"), true, true),
        (Some("true"), false, false),
    ] {
        let env: Vec<(&str, &str)> = setting
            .map(|v| vec![("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", v)])
            .unwrap_or_default();
        let s = TestServer::start_with(yaml, &env).await;
        let r = s.call(both()).await;
        assert_eq!(r.overall_code, OVER, "{setting:?}");
        let left = codes(&s.call(check_api(0)).await)[0].1;
        assert_eq!(left, if request_kept { 9 } else { 10 }, "{setting:?}");
        // A report of 15 on a limit of 10, then a check.
        s.call(check_api(15)).await;
        let r = s.call(check_api(0)).await;
        let closed = if report_kept { (OVER, 0) } else { (OK, left) };
        assert_eq!(codes(&r), vec![closed], "{setting:?}");
    }
}

fn check_api(hits: u64) -> RateLimitRequest {
    req("ai", vec![usage(&[("api", "k")], hits)])
}

/// What the operator sees of a budget: the limit's series count the usage reported and the
/// part of it over the budget (envoyproxy/ratelimit's `checkOverLimitThreshold`: only the hits
/// past the limit are over, the rest below it near); `/debug/top` ranks who used most by hits,
/// every report counted (not one call in the sample); the check's status says what is left.
#[tokio::test]
async fn usage_shows_in_the_series_and_in_the_heavy_hitters() {
    let env = [("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")];
    let s = TestServer::start_with(BUDGETS, &env).await;
    // Alice uses 1400 of 1000 (400 over), in 2 reports; Bob 300, in 30 reports of 10; Carol
    // makes 40 plain requests.
    s.call(report("ai", &[("user", "alice")], 900)).await;
    s.call(report("ai", &[("user", "alice")], 500)).await;
    for _ in 0..30 {
        s.call(report("ai", &[("user", "bob")], 10)).await;
    }
    for _ in 0..40 {
        s.call(one("ai", &[("user", "carol")])).await;
    }
    let debug = s.running().debug_addr.unwrap();
    let text = reqwest::get(format!("http://{debug}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = |name: &str| -> u64 {
        let prefix =
            format!("ratelimit_service_rate_limit_{name}{{domain=\"ai\",descriptor=\"user\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(series("total_hits"), 1400 + 300 + 40);
    assert_eq!(series("over_limit"), 400);
    // Near (80 % of 1000 = 800): alice's 900 report has 100 hits past 800, her 500 report the
    // 100 up to the limit.
    assert_eq!(series("near_limit"), 200);
    assert_eq!(series("within_limit"), 900 + 300 + 40);

    let top: serde_json::Value = reqwest::get(format!("http://{debug}/debug/top?domain=ai"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let user = top["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == "ai.user")
        .unwrap_or_else(|| panic!("{top}"));
    let by_hits = user["by_hits"].as_array().unwrap();
    let ranked: Vec<(&str, u64)> = by_hits
        .iter()
        .take(2)
        .map(|v| (v["value"].as_str().unwrap(), v["hits"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        ranked,
        vec![("user=alice", 1400), ("user=bob", 300)],
        "{user}"
    );

    // The check before the next request says what is left, for Envoy's X-RateLimit-Remaining.
    let r = s.call(report("ai", &[("user", "bob")], 0)).await;
    assert_eq!(codes(&r), vec![(OK, 700)]);
}

// ------------------------------------------------------------------------------------------
// Through a real Envoy: examples/envoy/envoy-budgets.yaml and turnstile-budgets.yaml as shipped.

mod through_envoy {
    use crate::common::ads::Ads;
    use crate::common::envoy::{assert_status, clear_of_window_edge, client, get, Stack};
    use crate::common::redis::Redis;
    use crate::common::tempdir::TempDir;
    use crate::common::{family_sum, settles};
    use serde_json::{json, Value};
    use turnstile::config::xds::pb;

    const DAY: u64 = 86_400;

    /// The test's upstream echoes each request header `h` back as `x-upstream-saw-h`: the
    /// client says what "the model" used, and the reports read it from the response.
    const EDITS: [(&str, &str); 3] = [
        (
            "%RESP(x-input-tokens)%",
            "%RESP(x-upstream-saw-x-input-tokens)%",
        ),
        (
            "%RESP(x-output-tokens)%",
            "%RESP(x-upstream-saw-x-output-tokens)%",
        ),
        (
            "%RESP(x-total-tokens)%",
            "%RESP(x-upstream-saw-x-total-tokens)%",
        ),
    ];

    /// Left of `user`'s input budget, asked of turnstile directly (a check: hits_addend 0).
    async fn input_left(stack: &Stack, user: &str) -> u64 {
        let body = json!({"domain": "ai", "descriptors": [{
            "entries": [{"key": "user", "value": user}, {"key": "tokens", "value": "input"}],
            "hits_addend": 0
        }]});
        let r: Value = stack.json(body).await;
        r["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
    }

    /// Envoy reports after the response is sent: wait (on turnstile's count, not a clock)
    /// until the report of the call just made is in.
    async fn report_counted(stack: &Stack, user: &str, left: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while input_left(stack, user).await != left {
            assert!(
                std::time::Instant::now() < deadline,
                "{user}'s report never counted: {} left, not {left}",
                input_left(stack, user).await
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn budget_closes_after_usage_passes_it(name: &str, env: &[(&str, &str)]) -> Stack {
        let stack = Stack::shipped_pair(
            name,
            "envoy-budgets.yaml",
            "turnstile-budgets.yaml",
            &EDITS,
            env,
        )
        .await;
        let c = client();
        clear_of_window_edge(DAY, 120).await;
        // Each call uses 400 input tokens of alice's 1000 a day (and 100 output, 500 of the
        // team's). envoyproxy/ratelimit answers 200, 200, 200, 429, 429, 429.
        let tokens = [
            ("x-user", "alice"),
            ("x-team", "t1"),
            ("x-input-tokens", "400"),
            ("x-output-tokens", "100"),
            ("x-total-tokens", "500"),
        ];
        let mut statuses = Vec::new();
        for (i, left) in [600u64, 200, 0, 0, 0, 0].into_iter().enumerate() {
            let r = get(&c, &stack.url(), &tokens).await;
            statuses.push(r.status);
            if r.status == 200 {
                report_counted(&stack, "alice", left).await;
            }
            if i == 1 {
                // The check before the second call saw 600 of 1000 input tokens left.
                assert_eq!(r.num("x-ratelimit-remaining"), 600, "{r:#?}");
            }
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
        assert_eq!(
            stack.upstream.hits(),
            3,
            "refused calls never reach the model"
        );
        // Another user of the same team is unaffected (the team has 1 500 of 1 000 000 used).
        let bob = get(&c, &stack.url(), &[("x-user", "bob"), ("x-team", "t1")]).await;
        assert_status(&bob, 200, "another user");
        stack
    }

    /// Ten concurrent calls of one user to a model that takes 1.5 s and uses 300 input tokens
    /// each, on a budget of 1000 a day: the statuses Envoy answered, the calls that reached the
    /// model, and (once every report is in) the holds their reports released.
    async fn ten_concurrent_calls(stack: &Stack) -> (Vec<u16>, usize) {
        let c = client();
        let headers = [
            ("x-user", "zoe"),
            ("x-input-tokens", "300"),
            ("x-output-tokens", "10"),
            ("x-total-tokens", "310"),
            ("x-delay-ms", "1500"),
        ];
        let url = stack.url();
        let calls = (0..10).map(|_| get(&c, &url, &headers));
        let mut statuses: Vec<u16> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.status)
            .collect();
        statuses.sort_unstable();
        (statuses, stack.upstream.hits())
    }

    /// The holds reports released, once they number `want` (the reports come after the
    /// responses), or after ten seconds.
    async fn reported(stack: &Stack, want: u64) -> u64 {
        let family = "ratelimit_service_reservations_reported_total";
        let read = || family_sum(stack.turnstile.http, family);
        settles(read, want, std::time::Duration::from_secs(10)).await
    }

    /// turnstile on Redis at `url`.
    fn on_redis(url: &str) -> [(&str, &str); 3] {
        [
            ("BACKEND_TYPE", "redis"),
            ("REDIS_URL", url),
            ("TURNSTILE_REDIS_DEADLINE_MS", "2000"),
        ]
    }

    #[tokio::test]
    async fn concurrent_calls_spend_the_budget_three_times_over_without_reserve() {
        let stack = Stack::shipped_pair(
            "budget-concurrent",
            "envoy-budgets.yaml",
            "turnstile-budgets.yaml",
            &EDITS,
            &[],
        )
        .await;
        clear_of_window_edge(DAY, 120).await;
        let (statuses, reached) = ten_concurrent_calls(&stack).await;
        // Every check sees nothing reported yet: all pass, 3000 tokens of 1000 spent.
        assert_eq!(statuses, [200; 10]);
        assert_eq!(reached, 10);
    }

    async fn concurrent_calls_hold_the_budget(name: &str, env: &[(&str, &str)]) {
        let stack = Stack::shipped_pair(
            name,
            "envoy-budgets.yaml",
            "turnstile-budgets-reserve.yaml",
            &EDITS,
            env,
        )
        .await;
        held_by_ten_concurrent_calls(&stack).await;
    }

    /// The ten concurrent calls on `stack`: at most the budget plus one call's overshoot spent,
    /// every report in.
    async fn held_by_ten_concurrent_calls(stack: &Stack) {
        clear_of_window_edge(DAY, 120).await;
        let (statuses, reached) = ten_concurrent_calls(stack).await;
        let passed = statuses.iter().filter(|&&s| s == 200).count();
        assert!(passed <= 4, "{statuses:?}");
        assert!(passed >= 1, "{statuses:?}");
        assert_eq!(passed + statuses.iter().filter(|&&s| s == 429).count(), 10);
        assert_eq!(reached, passed, "refused calls never reach the model");
        assert!(300 * reached <= 1300, "{} tokens spent", 300 * reached);
        // Each call that passed reported its input and its output usage, which released its
        // two holds.
        let want = 2 * passed as u64;
        assert_eq!(reported(stack, want).await, want);
    }

    /// turnstile-budgets.yaml's limits as a management server pushes them: a RateLimitConfig
    /// has no field for `reserve`.
    fn budgets_pushed() -> pb::RateLimitConfig {
        let limit = |unit: pb::RateLimitUnit, rpu: u32| {
            Some(pb::RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: rpu,
                ..Default::default()
            })
        };
        let tokens = |value: &str, rpu: u32| pb::RateLimitDescriptor {
            key: "tokens".into(),
            value: value.into(),
            rate_limit: limit(pb::RateLimitUnit::Day, rpu),
            ..Default::default()
        };
        pb::RateLimitConfig {
            name: "ai".into(),
            domain: "ai".into(),
            descriptors: vec![
                pb::RateLimitDescriptor {
                    key: "user".into(),
                    descriptors: vec![tokens("input", 1000), tokens("output", 4000)],
                    ..Default::default()
                },
                pb::RateLimitDescriptor {
                    key: "team".into(),
                    rate_limit: limit(pb::RateLimitUnit::Month, 1_000_000),
                    ..Default::default()
                },
            ],
        }
    }

    /// turnstile-budgets-reserve.yaml's holds, as an overlay of the pushed limits.
    const RESERVE_OVERLAY: &str = "domain: ai
descriptors:
  - key: user
    descriptors:
      - key: tokens
        value: input
        rate_limit: {reserve: 300, reserve_for: 10m}
      - key: tokens
        value: output
        rate_limit: {reserve: 500, reserve_for: 10m}
";

    /// The same budgets pushed over xDS, `reserve` from `TURNSTILE_XDS_OVERLAY`: held as the
    /// file holds them.
    #[tokio::test]
    async fn concurrent_calls_hold_a_pushed_budget_with_the_overlays_reserve() {
        let mut ads = Ads::start().await;
        ads.push("v1", vec![budgets_pushed()]);
        let dir = TempDir::new("budget-overlay");
        let overlay = dir.write("overlay.yaml", RESERVE_OVERLAY);
        let (url, overlay) = (ads.addr.to_string(), overlay.display().to_string());
        let env = [
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
            ("TURNSTILE_XDS_OVERLAY", overlay.as_str()),
        ];
        let stack =
            Stack::shipped_envoy_over_xds("budget-reserve-xds", "envoy-budgets.yaml", &EDITS, &env)
                .await;
        ads.wait_ack(1, "v1").await;
        held_by_ten_concurrent_calls(&stack).await;
    }

    #[tokio::test]
    async fn concurrent_calls_hold_the_budget_with_reserve_in_memory() {
        concurrent_calls_hold_the_budget("budget-reserve-memory", &[]).await;
    }

    #[tokio::test]
    async fn concurrent_calls_hold_the_budget_with_reserve_on_redis() {
        let redis = Redis::start();
        let url = redis.url();
        let env = on_redis(&url);
        concurrent_calls_hold_the_budget("budget-reserve-redis", &env).await;
        // Every hold was released: the sets hold nothing (or are gone).
        let sets = redis.cli(&["KEYS", "*_held"]);
        for set in sets.lines().filter(|l| !l.is_empty()) {
            assert_eq!(redis.cli(&["ZCARD", set]), "0", "{set}");
        }
    }

    /// examples/envoy/budgets-upstream.py, as shipped, on a port of its own: the model the
    /// walk-through's curl calls reach.
    struct Model(std::process::Child, std::net::SocketAddr);

    impl Model {
        fn start() -> Model {
            use std::io::BufRead;
            let script = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/envoy/budgets-upstream.py"
            );
            let mut child = std::process::Command::new("python3")
                .args([script, "--port", "0"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("python3 runs the shipped upstream");
            let out = child.stdout.take().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(out).read_line(&mut line).unwrap();
            let addr = (line.trim().rsplit(' ').next())
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no address in {line:?}"));
            Model(child, addr)
        }
    }

    impl Drop for Model {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// docs/algorithms-and-queues.md's end-to-end walk-through as written: the shipped Envoy
    /// and reserve configs, the shipped upstream (x-input-tokens 300, and the output and total
    /// headers the other reports read), ten concurrent curl-like calls of alice. Each call that
    /// passed reports its input and output usage, releasing both its holds: nothing is left to
    /// expire (made = reported + withdrawn, expired 0), so the alarm the page describes stays
    /// silent.
    #[tokio::test]
    async fn the_walk_through_with_the_shipped_upstream_leaves_nothing_to_expire() {
        let model = Model::start();
        let stack = Stack::shipped_pair_to(
            "budget-walk-through",
            ("envoy-budgets.yaml", "turnstile-budgets-reserve.yaml"),
            &[],
            &[],
            Some(model.1),
        )
        .await;
        clear_of_window_edge(DAY, 120).await;
        let c = client();
        let url = stack.url();
        let calls = (0..10).map(|_| get(&c, &url, &[("x-user", "alice")]));
        let mut statuses: Vec<u16> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.status)
            .collect();
        statuses.sort_unstable();
        let passed = statuses.iter().filter(|&&s| s == 200).count();
        // The page's figures: 900 of 1000 held by three checks, a fourth's 300 does not fit.
        assert_eq!(passed, 3, "{statuses:?}");
        assert_eq!(statuses.len() - passed, 7, "{statuses:?}");
        let want = 2 * passed as u64;
        assert_eq!(
            reported(&stack, want).await,
            want,
            "input and output reports"
        );
        let count = |name: &'static str| family_sum(stack.turnstile.http, name);
        let made = count("ratelimit_service_reservations_made_total").await;
        let withdrawn = count("ratelimit_service_reservations_withdrawn_total").await;
        let expired = count("ratelimit_service_reservations_expired_total").await;
        assert_eq!(made, want + withdrawn, "every hold made was released");
        assert_eq!(expired, 0);
    }

    #[tokio::test]
    async fn a_token_budget_closes_in_memory() {
        budget_closes_after_usage_passes_it("budget-memory", &[]).await;
    }

    #[tokio::test]
    async fn a_token_budget_closes_on_redis_under_envoyproxy_ratelimits_key() {
        let redis = Redis::start();
        let url = redis.url();
        let env = on_redis(&url);
        let _stack = budget_closes_after_usage_passes_it("budget-redis", &env).await;
        // The whole usage under envoyproxy/ratelimit's key: domain_key_value..._windowstart.
        let day = crate::common::envoy::unix_now() / DAY * DAY;
        let key = format!("ai_user_alice_tokens_input_{day}");
        assert_eq!(
            redis.cli(&["GET", &key]),
            "1200",
            "{}",
            redis.cli(&["KEYS", "*"])
        );
    }
}
