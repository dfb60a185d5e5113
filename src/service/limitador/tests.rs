//! Reservations on the engine's own clock: what `Reserve` holds, for how long, what `Commit`
//! ends, and that every other call sees the holds.

use std::time::Duration;

use tokio::task::LocalSet;

use super::*;
use crate::limiter::{Clock, ManualClock};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// `tokens`: a budget of 1 000 per user for 60 s, and one of 1 500 for the route for 10 s, both
/// applying to every call of kind `tok`.
const LIMITS: &str = r#"
- namespace: tokens
  name: per-user
  max_value: 1000
  seconds: 60
  conditions: ['descriptors[0]["kind"] == "tok"']
  variables: ['descriptors[0]["user"]']
- namespace: tokens
  name: per-route
  max_value: 1500
  seconds: 10
  conditions: ['descriptors[0]["kind"] == "tok"']
  variables: []
"#;

/// A Limitador on `LIMITS` over an engine of 16 shards on a manual clock, given to `body`.
fn with_limitador<F, Fut>(reservations: ReservationSettings, body: F)
where
    F: FnOnce(LimitadorService, std::sync::Arc<ManualClock>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = LocalSet::new();
    let (clock, manual) = Clock::manual(T0);
    let (engine, tasks) = Engine::new(16, 64, 100, clock);
    for t in tasks {
        local.spawn_local(t.run());
    }
    let limits = Limits::parse("limits.yaml", LIMITS).unwrap();
    let metrics = Arc::new(LimitadorMetrics::new(false, None, Default::default()));
    let l = LimitadorService::new(limits, engine, metrics).with_reservations(reservations);
    local.block_on(&rt, body(l, manual));
}

fn all_of_it() -> ReservationSettings {
    ReservationSettings {
        max_fraction: 1.0,
        ..ReservationSettings::default()
    }
}

async fn reserve(
    l: &LimitadorService,
    user: &str,
    amount: u64,
    ttl: Option<u64>,
) -> Option<String> {
    let d = [
        Entry {
            key: "kind",
            value: "tok",
        },
        Entry {
            key: "user",
            value: user,
        },
    ];
    let ttl = ttl.map(Duration::from_secs);
    match l.reserve("tokens", &[&d], amount, ttl).await.unwrap() {
        Reserved::Admitted { id } => Some(id),
        Reserved::Refused => None,
    }
}

async fn commit(l: &LimitadorService, user: &str, id: &str, actual: u64) -> bool {
    let d = [
        Entry {
            key: "kind",
            value: "tok",
        },
        Entry {
            key: "user",
            value: user,
        },
    ];
    l.commit("tokens", &[&d], id, actual).await.unwrap()
}

async fn call(l: &LimitadorService, user: &str, delta: u64, ask: LimitadorCall) -> LimitadorAnswer {
    let d = [
        Entry {
            key: "kind",
            value: "tok",
        },
        Entry {
            key: "user",
            value: user,
        },
    ];
    l.call("tokens", &[&d], delta, ask, false).await.unwrap()
}

#[test]
fn a_reserve_is_admitted_while_value_held_and_amount_fit_every_counter() {
    with_limitador(all_of_it(), |l, _| async move {
        let a = reserve(&l, "alice", 600, None).await.expect("600 of 1000");
        assert!(reserve(&l, "alice", 401, None).await.is_none(), "600 + 401");
        let b = reserve(&l, "alice", 400, None).await.expect("600 + 400");
        assert_ne!(a, b, "each hold has its own id");
        // Bob's own counter is free, but the route's holds 1 000 of 1 500: all or nothing.
        assert!(reserve(&l, "bob", 501, None).await.is_none());
        assert!(reserve(&l, "bob", 500, None).await.is_some());
        // Nothing was held by the refused ones: alice's commits end both holds.
        assert!(commit(&l, "alice", &a, 0).await);
        assert!(commit(&l, "alice", &b, 0).await);
        assert!(reserve(&l, "alice", 1000, None).await.is_some());
    });
}

/// Holds made and not ended, over every shard.
fn live_holds(l: &LimitadorService) -> (u64, u64) {
    let (mut live, mut withdrawn) = (0, 0);
    for s in l.engine().stats() {
        let c = s.read();
        live += c.holds_made - c.holds_reported - c.holds_expired - c.holds_withdrawn;
        withdrawn += c.holds_withdrawn;
    }
    (live, withdrawn)
}

#[test]
fn a_reserve_refused_on_another_shard_holds_nothing_on_this_one() {
    with_limitador(all_of_it(), |l, _| async move {
        reserve(&l, "alice", 1000, None).await.unwrap();
        assert_eq!(live_holds(&l), (2, 0), "on alice's counter and the route's");
        // The route has 500 left: each user's own counter has room, the route has not. Users'
        // counters on other shards than the route's held, then took it back.
        for i in 0..20 {
            let user = format!("u{i}");
            assert!(reserve(&l, &user, 501, None).await.is_none());
        }
        // Refunds go to their shards as messages: let them be read.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let (live, withdrawn) = live_holds(&l);
        assert_eq!(live, 2, "the refused hold nothing");
        assert!(withdrawn > 0, "some users' counters are on other shards");
        assert!(reserve(&l, "u0", 500, None).await.is_some());
    });
}

#[test]
fn the_amount_is_capped_per_counter_at_the_fraction_of_its_max() {
    with_limitador(ReservationSettings::default(), |l, _| async move {
        // 900 asked: 500 held on the user's 1 000 (0.5), 750 on the route's 1 500.
        let id = reserve(&l, "alice", 900, None)
            .await
            .expect("capped, it fits");
        assert!(
            call(&l, "alice", 501, LimitadorCall::CheckAndReport)
                .await
                .limited
        );
        assert!(
            !call(&l, "alice", 250, LimitadorCall::CheckAndReport)
                .await
                .limited
        );
        // The route holds 750 and counts 250: 500 left for anyone.
        assert!(call(&l, "bob", 501, LimitadorCall::Check).await.limited);
        assert!(!call(&l, "bob", 500, LimitadorCall::Check).await.limited);
        assert!(commit(&l, "alice", &id, 0).await);
        assert!(!call(&l, "alice", 750, LimitadorCall::Check).await.limited);
    });
}

#[test]
fn a_commit_counts_its_usage_and_ends_its_own_hold_on_every_counter() {
    with_limitador(all_of_it(), |l, _| async move {
        let first = reserve(&l, "alice", 300, None).await.unwrap();
        let second = reserve(&l, "alice", 300, None).await.unwrap();
        // The second ends, not the oldest: 300 held, 250 used, 450 left.
        assert!(commit(&l, "alice", &second, 250).await);
        assert!(call(&l, "alice", 451, LimitadorCall::Check).await.limited);
        assert!(!call(&l, "alice", 450, LimitadorCall::Check).await.limited);
        // Ended once: again, it is a plain report.
        assert!(!commit(&l, "alice", &second, 0).await);
        // Unknown, empty and foreign ids are plain reports, counted unchecked.
        assert!(!commit(&l, "alice", "12345", 100).await);
        assert!(!commit(&l, "alice", "", 100).await);
        assert!(!commit(&l, "alice", "not-an-id", 0).await);
        // 300 held, 450 used: 250 left. The route saw the same: 1 500 − 300 − 450.
        assert!(call(&l, "alice", 251, LimitadorCall::Check).await.limited);
        assert!(!call(&l, "alice", 250, LimitadorCall::Check).await.limited);
        assert!(commit(&l, "alice", &first, 300).await);
        assert!(call(&l, "alice", 251, LimitadorCall::Check).await.limited);
        assert!(!call(&l, "bob", 750, LimitadorCall::Check).await.limited);
        assert!(call(&l, "bob", 751, LimitadorCall::Check).await.limited);
    });
}

#[test]
fn every_call_sees_the_holds() {
    with_limitador(all_of_it(), |l, _| async move {
        for _ in 0..3 {
            reserve(&l, "alice", 300, None).await.unwrap();
        }
        // 900 held of 1 000.
        let refused = call(&l, "alice", 200, LimitadorCall::CheckAndReport).await;
        assert!(refused.limited);
        assert_eq!(refused.limited_by.as_deref(), Some("per-user"));
        assert!(call(&l, "alice", 101, LimitadorCall::Check).await.limited);
        let ok = call(&l, "alice", 100, LimitadorCall::CheckAndReport).await;
        assert!(!ok.limited);
        assert_eq!(ok.counters[0].remaining, 0, "held room is not left");
        // A report counts whatever is held, and says so.
        let r = call(&l, "alice", 50, LimitadorCall::Report).await;
        assert!(!r.limited);
        assert!(
            call(&l, "alice", 0, LimitadorCall::Check).await.limited,
            "1 050 of 1 000"
        );
    });
}

#[test]
fn a_hold_ends_at_its_ttl_the_max_ttl_or_the_window_whichever_is_first() {
    let settings = ReservationSettings {
        max_ttl: Duration::from_secs(20),
        ..all_of_it()
    };
    with_limitador(settings, |l, clock| async move {
        // ttl 5 s: held at 4.9 s, gone at 5 s.
        reserve(&l, "a", 1000, Some(5)).await.unwrap();
        clock.set(T0 + 4 * SEC + 900_000_000);
        assert!(reserve(&l, "a", 1, None).await.is_none());
        clock.set(T0 + 5 * SEC);
        let id = reserve(&l, "a", 1000, Some(3600)).await.unwrap();
        // ttl 1 h, but at most 20 s: held at 24.9 s, gone at 25 s.
        clock.set(T0 + 24 * SEC + 900_000_000);
        assert!(reserve(&l, "a", 1, None).await.is_none());
        clock.set(T0 + 25 * SEC);
        assert!(!commit(&l, "a", &id, 0).await, "expired: nothing to end");
        // No ttl: the max, but not past the window. The route's window (10 s) starts at its
        // first hit, at 25 s: a hold of 1 000 of its 1 500 made 4 s in ends with it, at 35 s.
        call(&l, "b", 1, LimitadorCall::CheckAndReport).await;
        clock.set(T0 + 29 * SEC);
        reserve(&l, "c", 1000, None).await.unwrap();
        assert!(
            reserve(&l, "d", 500, None).await.is_none(),
            "1 + 1 000 + 500"
        );
        clock.set(T0 + 34 * SEC + 900_000_000);
        assert!(reserve(&l, "d", 500, None).await.is_none());
        clock.set(T0 + 35 * SEC);
        assert!(reserve(&l, "d", 1000, None).await.is_some(), "a new window");
        // c's hold on its own counter (no hit, no window yet) runs to the max ttl, 49 s.
        assert!(reserve(&l, "c", 1, None).await.is_none());
        clock.set(T0 + 49 * SEC);
        assert!(reserve(&l, "c", 1, None).await.is_some());
    });
}
