//! Kuadrant's `Reserve` and `Commit` (limitador #515) through the binary. The real server built
//! here (2981b2b) predates them and answers UNIMPLEMENTED, so the expected values follow the
//! wire contract and rules in `shared/reference/limitador.md`; that every other call sees the
//! holds is turnstile's own (Limitador's `ShouldRateLimit` and `Report` do not).

use std::time::Duration;

use turnstile::transport::limitador::pb::{
    CommitRequest, CommitResponse, ReserveRequest, ReserveResponse,
};

use super::*;
use crate::common::binary::command;

/// A token budget: 1 000 a minute per user.
pub(super) const TOKENS: &str = r#"
- name: tokens
  namespace: ns/llm
  max_value: 1000
  seconds: 60
  conditions: ['descriptors[0]["tokenlimit.tokens__0a1b2c3d"] == "1"']
  variables: ['descriptors[0]["auth.identity.userid"]']
"#;

pub(super) const RESERVE: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Reserve";
pub(super) const COMMIT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Commit";

pub(super) fn descriptors(user: &str) -> Vec<RateLimitDescriptor> {
    request(
        "ns/llm",
        &[&[
            ("tokenlimit.tokens__0a1b2c3d", "1"),
            ("auth.identity.userid", user),
        ]],
        0,
    )
    .descriptors
}

pub(super) fn reserve_req(user: &str, amount: u64, ttl_s: Option<i64>) -> ReserveRequest {
    ReserveRequest {
        domain: "ns/llm".into(),
        descriptors: descriptors(user),
        amount,
        ttl: ttl_s.map(|seconds| prost_types::Duration { seconds, nanos: 0 }),
    }
}

pub(super) fn commit_req(user: &str, id: &str, actual_amount: u64) -> CommitRequest {
    CommitRequest {
        domain: "ns/llm".into(),
        descriptors: descriptors(user),
        reservation_id: id.into(),
        actual_amount,
    }
}

pub(super) async fn reserve(
    l: &Limitador,
    user: &str,
    amount: u64,
    ttl: Option<i64>,
) -> ReserveResponse {
    call(&l.grpc(), RESERVE, reserve_req(user, amount, ttl))
        .await
        .unwrap()
}

pub(super) async fn commit(l: &Limitador, user: &str, id: &str, actual: u64) -> bool {
    let r: CommitResponse = call(&l.grpc(), COMMIT, commit_req(user, id, actual))
        .await
        .unwrap();
    r.reservation_released
}

/// `ShouldRateLimit` of `hits` for `user` on the budget.
pub(super) async fn should(l: &Limitador, user: &str, hits: u32) -> &'static str {
    let req = RateLimitRequest {
        hits_addend: hits,
        ..request(
            "ns/llm",
            &[&[
                ("tokenlimit.tokens__0a1b2c3d", "1"),
                ("auth.identity.userid", user),
            ]],
            0,
        )
    };
    code(&unary(&l.grpc(), SHOULD_RATE_LIMIT, req).await.unwrap())
}

pub(super) fn code_of(r: &ReserveResponse) -> &'static str {
    code(&RateLimitResponse {
        overall_code: r.code,
        ..RateLimitResponse::default()
    })
}

#[tokio::test]
async fn ten_concurrent_reserves_of_300_on_1000_admit_three_and_commits_release_them() {
    let l = Limitador::start(&[], TOKENS);
    let calls = (0..10).map(|_| reserve(&l, "alice", 300, Some(30)));
    let answers = futures_util::future::join_all(calls).await;
    let admitted: Vec<&ReserveResponse> = answers.iter().filter(|r| r.code == 1).collect();
    assert_eq!(admitted.len(), 3, "{answers:?}");
    for r in answers.iter().filter(|r| r.code != 1) {
        assert_eq!(code_of(r), "OVER_LIMIT");
        assert!(r.reservation_id.is_empty(), "a refusal holds nothing");
    }
    let mut ids: Vec<&str> = admitted.iter().map(|r| r.reservation_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each hold its own id: {ids:?}");
    // 900 held: ordinary traffic cannot spend it.
    assert_eq!(should(&l, "alice", 200).await, "OVER_LIMIT");
    assert_eq!(should(&l, "alice", 100).await, "OK");
    assert_eq!(
        should(&l, "bob", 1000).await,
        "OK",
        "another user's counter"
    );
    // The first commits 250 of its 300: 100 + 250 used, 600 held, 50 left.
    assert!(commit(&l, "alice", ids[0], 250).await);
    assert!(!commit(&l, "alice", ids[0], 0).await, "ended once");
    assert_eq!(should(&l, "alice", 51).await, "OVER_LIMIT");
    assert_eq!(should(&l, "alice", 50).await, "OK");
    // The other two end with nothing used: 400 used, 600 left.
    assert!(commit(&l, "alice", ids[1], 0).await);
    assert!(commit(&l, "alice", ids[2], 0).await);
    assert_eq!(should(&l, "alice", 601).await, "OVER_LIMIT");
    assert_eq!(should(&l, "alice", 600).await, "OK");
}

#[tokio::test]
async fn an_empty_or_unknown_id_is_a_plain_report() {
    let l = Limitador::start(&[], TOKENS);
    assert!(!commit(&l, "alice", "", 400).await);
    assert!(!commit(&l, "alice", "18446744073709551615", 300).await);
    assert!(!commit(&l, "alice", "not-a-turnstile-id", 300).await);
    // 1 000 counted, unchecked: nothing left, not even a check of 1.
    let d: &[(&str, &str)] = &[
        ("tokenlimit.tokens__0a1b2c3d", "1"),
        ("auth.identity.userid", "alice"),
    ];
    let check = unary(&l.grpc(), CHECK, request("ns/llm", &[d], 0)).await;
    assert_eq!(code(&check.unwrap()), "OVER_LIMIT");
    // A reserve of 1 has no room either; an empty domain is UNKNOWN.
    assert_eq!(code_of(&reserve(&l, "alice", 1, None).await), "OVER_LIMIT");
    let empty = ReserveRequest {
        domain: String::new(),
        ..reserve_req("alice", 1, None)
    };
    let r: ReserveResponse = call(&l.grpc(), RESERVE, empty).await.unwrap();
    assert_eq!((code_of(&r), r.reservation_id.as_str()), ("UNKNOWN", ""));
}

#[tokio::test]
async fn the_fraction_caps_each_hold_and_the_max_ttl_ends_it() {
    let l = Limitador::start(
        &[
            "--max-reservation-fraction",
            "0.25",
            "--max-reservation-ttl",
            "1",
        ],
        TOKENS,
    );
    // 900 asked, 250 held (a quarter of 1 000), for 1 s whatever the call's hour.
    let r = reserve(&l, "alice", 900, Some(3600)).await;
    assert_eq!(code_of(&r), "OK");
    assert_eq!(should(&l, "alice", 751).await, "OVER_LIMIT");
    assert_eq!(should(&l, "alice", 700).await, "OK");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        should(&l, "alice", 300).await,
        "OK",
        "the hold ended at 1 s"
    );
    assert!(
        !commit(&l, "alice", &r.reservation_id, 0).await,
        "ended already"
    );
}

#[tokio::test]
async fn disabled_reservations_answer_unimplemented_naming_the_flag() {
    let l = Limitador::start(&["--disable-reservations"], TOKENS);
    let err = call::<_, ReserveResponse>(&l.grpc(), RESERVE, reserve_req("alice", 1, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(err.message().contains("--disable-reservations"), "{err:?}");
    // A commit is the plain report it would be without a hold.
    assert!(!commit(&l, "alice", "", 1000).await);
    assert_eq!(should(&l, "alice", 1).await, "OVER_LIMIT");
}

#[test]
fn bad_reservation_flags_are_refused_naming_the_flag() {
    let dir = TempDir::new("limitador-reserve-flags");
    let exe = limitador_server(dir.path());
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, TOKENS).unwrap();
    let f = file.to_str().unwrap();
    for (flag, value) in [
        ("--max-reservation-fraction", "1.5"),
        ("--max-reservation-fraction", "-0.1"),
        ("--max-reservation-fraction", "half"),
        ("--max-reservation-ttl", "soon"),
    ] {
        let arg = format!("{flag}={value}");
        let out = command(&exe, &[&arg, f, "memory"], &[]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag} {value}: {err}"
        );
    }
}

#[tokio::test]
async fn every_call_on_the_counter_sees_the_holds() {
    let l = Limitador::start(&["--max-reservation-fraction", "1"], TOKENS);
    let id = reserve(&l, "alice", 999, None).await.reservation_id;
    let d: &[(&str, &str)] = &[
        ("tokenlimit.tokens__0a1b2c3d", "1"),
        ("auth.identity.userid", "alice"),
    ];
    // CheckRateLimit checks 1: the one left is there.
    let grpc = l.grpc();
    let check = || unary(&grpc, CHECK, request("ns/llm", &[d], 0));
    assert_eq!(code(&check().await.unwrap()), "OK");
    // HTTP: /check of 2 is refused, /check_and_report of 1 takes the last.
    let body = |delta: u64| {
        format!(
            r#"{{"namespace":"ns/llm","values":{{"tokenlimit.tokens__0a1b2c3d":"1","auth.identity.userid":"alice"}},"delta":{delta}}}"#
        )
    };
    let http = reqwest::Client::new();
    let post = |path: &'static str, body: String| {
        http.post(l.http(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(post("/check", body(2)).await.unwrap().status(), 429);
    assert_eq!(
        post("/check_and_report", body(1)).await.unwrap().status(),
        200
    );
    assert_eq!(
        post("/check_and_report", body(1)).await.unwrap().status(),
        429
    );
    assert_eq!(code(&check().await.unwrap()), "OVER_LIMIT");
    // Report counts unchecked beside the hold; the commit ends it.
    let report = unary(&l.grpc(), REPORT, request("ns/llm", &[d], 5)).await;
    assert_eq!(code(&report.unwrap()), "OK");
    assert!(commit(&l, "alice", &id, 0).await);
    // 1 + 5 used: 994 left.
    assert_eq!(post("/check", body(994)).await.unwrap().status(), 200);
    assert_eq!(post("/check", body(995)).await.unwrap().status(), 429);
}

/// Two replicas sharing one real redis-server, as `limitador-server … redis URL`.
mod on_redis {
    use super::*;
    use crate::common::redis::Redis;

    /// Tests run beside builds on a small machine: a roomy deadline keeps the breaker shut.
    const ROOMY: (&str, &str) = ("TURNSTILE_REDIS_DEADLINE_MS", "5000");

    fn replicas(r: &Redis, flags: &[&str], limits: &str) -> [Limitador; 2] {
        let url = format!("redis://127.0.0.1:{}", r.port);
        let storage = ["redis", url.as_str()];
        [
            Limitador::start_on(flags, limits, &storage, &[ROOMY]),
            Limitador::start_on(flags, limits, &storage, &[ROOMY]),
        ]
    }

    /// Redis's keys ending with `suffix`.
    fn keys_ending(r: &Redis, suffix: &str) -> Vec<String> {
        let out = r.cli(&["--scan"]);
        (out.lines())
            .filter(|k| k.ends_with(suffix))
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_replicas_hold_one_budget_and_either_commits_a_hold() {
        let r = Redis::start();
        let [a, b] = replicas(&r, &[], TOKENS);
        let ls = [&a, &b];
        // Ten concurrent reserves of 300 on 1 000, five to each replica: exactly three hold.
        let calls = (0..10)
            .map(|i| async move { (i % 2, reserve(ls[i % 2], "alice", 300, Some(30)).await) });
        let answers = futures_util::future::join_all(calls).await;
        let admitted: Vec<(usize, &str)> = (answers.iter())
            .filter(|(_, r)| r.code == 1)
            .map(|(at, r)| (*at, r.reservation_id.as_str()))
            .collect();
        assert_eq!(admitted.len(), 3, "{answers:?}");
        for (_, r) in answers.iter().filter(|(_, r)| r.code != 1) {
            assert_eq!(code_of(r), "OVER_LIMIT");
            assert!(r.reservation_id.is_empty(), "a refusal holds nothing");
        }
        // The holds are Redis's: one hash beside the counter, a field a hold, dying with the
        // window at the latest; the counter itself has no hit yet.
        let held = keys_ending(&r, "_first}_held");
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(r.cli(&["HLEN", &held[0]]), "3");
        let pttl: i64 = r.cli(&["PTTL", &held[0]]).parse().unwrap();
        assert!((25_000..=30_000).contains(&pttl), "PTTL {pttl}");
        assert!(keys_ending(&r, "_first").is_empty());
        // 900 held: neither replica's ordinary traffic can spend it.
        for l in ls {
            assert_eq!(should(l, "alice", 200).await, "OVER_LIMIT");
        }
        assert_eq!(should(&b, "alice", 100).await, "OK");
        assert_eq!(should(&a, "alice", 1).await, "OVER_LIMIT");
        // A hold ends on the other replica than the one that made it: once.
        let (made_on, id) = admitted[0];
        let other = ls[1 - made_on];
        assert!(commit(other, "alice", id, 250).await);
        assert!(!commit(other, "alice", id, 0).await, "ended once");
        assert!(
            !commit(ls[made_on], "alice", id, 0).await,
            "ended everywhere"
        );
        assert_eq!(r.cli(&["HLEN", &held[0]]), "2");
        // 100 + 250 used, 600 held: 50 left, on either replica.
        assert_eq!(should(&a, "alice", 51).await, "OVER_LIMIT");
        assert_eq!(should(&b, "alice", 50).await, "OK");
        // The last two end with nothing used, one on each: 400 used, 600 left.
        assert!(commit(&a, "alice", admitted[1].1, 0).await);
        assert!(commit(&b, "alice", admitted[2].1, 0).await);
        assert!(
            keys_ending(&r, "_first}_held").is_empty(),
            "no hold, no hash"
        );
        assert_eq!(should(&a, "alice", 601).await, "OVER_LIMIT");
        assert_eq!(should(&b, "alice", 600).await, "OK");
        assert_eq!(r.cli(&["GET", &keys_ending(&r, "_first")[0]]), "1000");
    }

    #[tokio::test]
    async fn a_hold_in_redis_ends_at_its_ttl() {
        let r = Redis::start();
        let [a, b] = replicas(&r, &["--max-reservation-fraction", "1"], TOKENS);
        let short = ReserveRequest {
            ttl: Some(prost_types::Duration {
                seconds: 0,
                nanos: 600_000_000,
            }),
            ..reserve_req("alice", 900, None)
        };
        let made: ReserveResponse = call(&a.grpc(), RESERVE, short).await.unwrap();
        assert_eq!(code_of(&made), "OK");
        let held = keys_ending(&r, "_first}_held");
        let pttl: i64 = r.cli(&["PTTL", &held[0]]).parse().unwrap();
        assert!((1..=600).contains(&pttl), "PTTL {pttl}");
        // Every call on the other replica sees it: ShouldRateLimit, CheckRateLimit, HTTP.
        assert_eq!(should(&b, "alice", 200).await, "OVER_LIMIT");
        let d: &[(&str, &str)] = &[
            ("tokenlimit.tokens__0a1b2c3d", "1"),
            ("auth.identity.userid", "alice"),
        ];
        let check = unary(&b.grpc(), CHECK, request("ns/llm", &[d], 0)).await;
        assert_eq!(code(&check.unwrap()), "OK");
        let http = reqwest::Client::new();
        let check = |delta: u64| {
            http.post(b.http("/check"))
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"namespace":"ns/llm","values":{{"tokenlimit.tokens__0a1b2c3d":"1","auth.identity.userid":"alice"}},"delta":{delta}}}"#
                ))
                .send()
        };
        assert_eq!(check(101).await.unwrap().status(), 429);
        assert_eq!(check(100).await.unwrap().status(), 200);
        // A report counts unchecked beside the hold: 50 used.
        let report = unary(&b.grpc(), REPORT, request("ns/llm", &[d], 50)).await;
        assert_eq!(code(&report.unwrap()), "OK");
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(should(&b, "alice", 951).await, "OVER_LIMIT");
        assert_eq!(should(&b, "alice", 950).await, "OK", "the hold ended");
        assert!(!commit(&a, "alice", &made.reservation_id, 0).await);
        assert!(keys_ending(&r, "_first}_held").is_empty());
    }

    #[tokio::test]
    async fn with_redis_cached_reserve_and_commit_are_decided_in_redis() {
        let r = Redis::start();
        let url = format!("redis://127.0.0.1:{}", r.port);
        let storage = ["redis_cached", url.as_str(), "--flush-period", "200"];
        let flags = ["--max-reservation-fraction", "1"];
        let a = Limitador::start_on(&flags, TOKENS, &storage, &[ROOMY]);
        let b = Limitador::start_on(&flags, TOKENS, &storage, &[ROOMY]);
        let made = reserve(&a, "alice", 900, None).await;
        assert_eq!(code_of(&made), "OK");
        // Not in one replica's cache: the other sees the hold, and ends it.
        assert_eq!(
            code_of(&reserve(&b, "alice", 200, None).await),
            "OVER_LIMIT"
        );
        assert!(commit(&b, "alice", &made.reservation_id, 0).await);
        assert_eq!(code_of(&reserve(&a, "alice", 1000, None).await), "OK");
    }

    /// The user's budget, and a route's of 500 for every user.
    const TWO: &str = r#"
- name: tokens
  namespace: ns/llm
  max_value: 1000
  seconds: 60
  conditions: ['descriptors[0]["tokenlimit.tokens__0a1b2c3d"] == "1"']
  variables: ['descriptors[0]["auth.identity.userid"]']
- name: route
  namespace: ns/llm
  max_value: 500
  seconds: 60
  conditions: ['descriptors[0]["tokenlimit.tokens__0a1b2c3d"] == "1"']
  variables: []
"#;

    #[tokio::test]
    async fn a_reserve_refused_on_one_counter_holds_nothing_on_the_others() {
        let r = Redis::start();
        let [a, b] = replicas(&r, &["--max-reservation-fraction", "1"], TWO);
        let alice = reserve(&a, "alice", 400, None).await;
        assert_eq!(code_of(&alice), "OK");
        assert_eq!(
            keys_ending(&r, "_first}_held").len(),
            2,
            "the user's and the route's"
        );
        // Bob's budget has room, the route's has not: nothing held on bob's either.
        assert_eq!(code_of(&reserve(&b, "bob", 400, None).await), "OVER_LIMIT");
        wait_for_keys(&r, 2).await;
        assert_eq!(should(&a, "bob", 100).await, "OK");
        assert_eq!(
            should(&b, "bob", 1).await,
            "OVER_LIMIT",
            "400 held + 100 on the route"
        );
        assert!(commit(&b, "alice", &alice.reservation_id, 0).await);
        assert_eq!(should(&a, "bob", 400).await, "OK");
    }

    /// A refused request's holds are taken back after its answer: waits until Redis holds
    /// `n` hashes of holds.
    async fn wait_for_keys(r: &Redis, n: usize) {
        for _ in 0..50 {
            if keys_ending(r, "_first}_held").len() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{:?}", keys_ending(r, "_first}_held"));
    }
}
