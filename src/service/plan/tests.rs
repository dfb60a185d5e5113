//! The plan on its own: which limits apply to which descriptor, `replaces`, unlimited
//! descriptors, Envoy's `limit` override, roles, hits, counting and reservations, each read
//! from the ops and the plan a config built from YAML gives.

use std::time::Duration;

use super::*;
use crate::config::{Config, LoadOptions, QueueSpec};
use crate::service::fixtures::{default_settings, desc, request_of};
use crate::service::Override;

const LIMITS: &str = r#"
domain: d
descriptors:
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: fast}
      - {unit: minute, requests_per_unit: 100, unit_multiplier: 5, name: slow}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: general
    rate_limit: {unit: minute, requests_per_unit: 1, name: general}
  - key: special
    rate_limit: {unit: minute, requests_per_unit: 10, name: special, replaces: [{name: general}]}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: joint
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bucket
    rate_limit:
      unit: second
      requests_per_unit: 3
      algorithm: token_bucket
      burst: 9
      queue: {max_waiting: 5, max_wait: 250ms}
  - key: budget
    rate_limit: {unit: day, requests_per_unit: 1000, reserve: 300, reserve_for: 90s}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

fn config() -> Config {
    let files = [("plan.yaml".to_owned(), LIMITS.to_owned())];
    Config::from_sources(&files, LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// The plan of `req` on `c`'s domain `d`, and its ops.
fn try_plan<'c>(
    c: &'c Config,
    req: &Request<'_>,
    s: &AnswerSettings,
) -> Result<(Plan<'c>, Vec<Op>), RlsError> {
    let mut p = Plan::default();
    let ops = plan(&mut p, c.domain("d").expect("domain d"), req, s)?;
    Ok((p, ops))
}

fn planned<'c>(c: &'c Config, req: &Request<'_>) -> (Plan<'c>, Vec<Op>) {
    try_plan(c, req, &default_settings()).expect("planned")
}

fn keys(ops: &[Op]) -> Vec<&str> {
    ops.iter().map(|op| op.key.as_str()).collect()
}

/// The descriptor each op decides for, through `op_of`.
fn descriptors_of(p: &Plan<'_>) -> Vec<usize> {
    p.op_of.iter().map(|&ai| p.applied[ai].descriptor).collect()
}

#[test]
fn every_limit_of_a_matched_node_gets_an_op_of_its_own() {
    let c = config();
    let req = request_of(vec![desc(&[("two", "a")]), desc(&[("one", "b")])]);
    let (p, ops) = planned(&c, &req);
    assert_eq!(keys(&ops), ["d_two_a_", "d_two_a_#1", "d_one_b_"]);
    assert_eq!(descriptors_of(&p), [0, 0, 1]);
    let rates: Vec<(u32, u64)> = (ops.iter())
        .map(|op| (op.params.requests_per_unit, op.params.window_ms))
        .collect();
    assert_eq!(rates, [(10, 1_000), (100, 300_000), (7, 3_600_000)]);
    // Keys hashed side by side are hashed as one alone is.
    for op in &ops {
        assert_eq!(op.key, Key::new(op.key.as_str()), "{}", op.key.as_str());
    }
    let names: Vec<&str> = p
        .op_of
        .iter()
        .map(|&ai| p.applied[ai].limit.name())
        .collect();
    assert_eq!(names, ["fast", "slow", ""]);
}

#[test]
fn a_descriptor_matching_no_node_at_its_depth_gets_no_op() {
    let c = config();
    let req = request_of(vec![
        desc(&[("nowhere", "x")]),
        desc(&[("parent", "p")]),
        desc(&[("one", "b"), ("deeper", "x")]),
        desc(&[("parent", "p"), ("child", "c")]),
    ]);
    let (p, ops) = planned(&c, &req);
    assert_eq!(keys(&ops), ["d_parent_p_child_c_"]);
    assert_eq!(descriptors_of(&p), [3]);
    assert!(p.matches[0].is_none() && p.matches[2].is_none());
    assert!(p.matches[1].is_some(), "matched, but its node has no limit");
    assert_eq!(p.carried.len(), 4, "every descriptor carries its hits");
}

#[test]
fn replaces_leaves_out_the_named_limit_wherever_it_applies() {
    let c = config();
    let req = request_of(vec![desc(&[("general", "g")]), desc(&[("special", "s")])]);
    let (p, ops) = planned(&c, &req);
    assert_eq!(keys(&ops), ["d_special_s_"]);
    assert_eq!(descriptors_of(&p), [1]);
    assert!(
        p.matches[0].is_some(),
        "still matched, only its limit is gone"
    );
    // Alone, the limit that would be replaced applies.
    let (_, ops) = planned(&c, &request_of(vec![desc(&[("general", "g")])]));
    assert_eq!(keys(&ops), ["d_general_g_"]);
}

#[test]
fn an_unlimited_descriptor_is_answered_without_an_op() {
    let c = config();
    let req = request_of(vec![desc(&[("free", "f")]), desc(&[("one", "b")])]);
    let (p, ops) = planned(&c, &req);
    assert_eq!(&p.unlimited[..], [0]);
    assert_eq!(keys(&ops), ["d_one_b_"]);
    assert_eq!(
        descriptors_of(&p),
        [1],
        "op_of still points at the right limit"
    );
}

#[test]
fn envoys_override_replaces_the_nodes_limits_and_is_binding() {
    let c = config();
    let mut shadowed = desc(&[("shadow", "o")]);
    shadowed.limit = Some(Override {
        requests_per_unit: 4,
        unit: 3, // HOUR
    });
    let mut unmatched = desc(&[("nowhere", "x")]);
    unmatched.limit = Some(Override {
        requests_per_unit: 2,
        unit: 1, // SECOND
    });
    let (p, ops) = planned(&c, &request_of(vec![shadowed, unmatched]));
    assert_eq!(ops.len(), 2, "the override alone, matched or not");
    let shape = |op: &Op| (op.params.requests_per_unit, op.params.window_ms, op.role);
    assert_eq!(shape(&ops[0]), (4, 3_600_000, Role::Binding), "not shadow");
    assert_eq!(shape(&ops[1]), (2, 1_000, Role::Binding));
    assert!(ops
        .iter()
        .all(|op| op.params.algorithm == Algorithm::FixedWindow && op.queue.is_none()));
    assert!(matches!(p.applied[0].limit, LimitRef::Override { .. }));
    let paths: Vec<Option<&str>> = p.carried.iter().map(|c| c.stat_path.as_deref()).collect();
    assert_eq!(paths, [Some("shadow_o"), Some("nowhere_x")]);
}

#[test]
fn an_override_of_an_unknown_unit_is_an_invalid_argument() {
    let c = config();
    let mut d = desc(&[("one", "b")]);
    d.limit = Some(Override {
        requests_per_unit: 1,
        unit: 7, // WEEK is not one of Envoy's override units
    });
    let err = try_plan(
        &c,
        &request_of(vec![desc(&[("one", "a")]), d]),
        &default_settings(),
    );
    match err {
        Err(RlsError::InvalidArgument(m)) => {
            assert!(m.contains("descriptors[1].limit.unit"), "{m}")
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("planned"),
    }
}

#[test]
fn roles_follow_shadow_and_quota_mode_per_node_and_globally() {
    let c = config();
    let mut over = desc(&[("nowhere", "x")]);
    over.limit = Some(Override {
        requests_per_unit: 1,
        unit: 1,
    });
    let req = request_of(vec![
        desc(&[("one", "b")]),
        desc(&[("shadow", "s")]),
        desc(&[("joint", "j")]),
        over,
    ]);
    let roles = |s: &AnswerSettings| -> Vec<Role> {
        let (_, ops) = try_plan(&c, &req, s).expect("planned");
        ops.iter().map(|op| op.role).collect()
    };
    assert_eq!(
        roles(&default_settings()),
        [Role::Binding, Role::Shadow, Role::Joint(2), Role::Binding]
    );
    let all_joint = AnswerSettings {
        global_quota_mode: true,
        ..default_settings()
    };
    // Each descriptor is its own group; shadow mode stays shadow.
    assert_eq!(
        roles(&all_joint),
        [Role::Joint(0), Role::Shadow, Role::Joint(2), Role::Joint(3)]
    );
}

#[test]
fn a_descriptors_own_hits_addend_wins_over_the_requests() {
    let c = config();
    let mut own = desc(&[("one", "own")]);
    own.hits_addend = Some(5);
    let mut check = desc(&[("one", "check")]);
    check.hits_addend = Some(0);
    let mut refund = desc(&[("one", "refund")]);
    refund.is_negative_hits = true;
    let mut req = request_of(vec![desc(&[("one", "req")]), own, check, refund]);
    req.hits_addend = 3;
    let hits = |req: &Request<'_>| -> Vec<(u64, bool)> {
        let (_, ops) = planned(&c, req);
        ops.iter().map(|op| (op.hits, op.refund)).collect()
    };
    assert_eq!(hits(&req), [(3, false), (5, false), (0, false), (3, true)]);
    req.hits_addend = 0;
    assert_eq!(
        hits(&req),
        [(1, false), (5, false), (0, false), (1, true)],
        "the request's 0 means 1; a descriptor's 0 is a check"
    );
}

#[test]
fn the_counting_rule_decides_what_each_descriptor_counts_when_refused() {
    let c = config();
    let mut usage = desc(&[("one", "usage")]);
    usage.hits_addend = Some(4);
    let req = request_of(vec![desc(&[("one", "plain")]), usage]);
    let counting = |rule| -> Vec<Counting> {
        let s = AnswerSettings {
            counting_rule: rule,
            ..default_settings()
        };
        let (p, ops) = try_plan(&c, &req, &s).expect("planned");
        let carried: Vec<Counting> = p.carried.iter().map(|c| c.counting).collect();
        let of_ops: Vec<Counting> = ops.iter().map(|op| op.counting).collect();
        assert_eq!(carried, of_ops, "the answer reads what the ops count");
        of_ops
    };
    use Counting::*;
    assert_eq!(counting(CountingRule::UsageInFull), [IfAdmitted, Usage]);
    assert_eq!(counting(CountingRule::Always), [Always, Always]);
    assert_eq!(counting(CountingRule::IfAdmitted), [IfAdmitted, IfAdmitted]);
}

#[test]
fn a_limit_with_reserve_holds_on_a_check_and_releases_on_a_report() {
    let c = config();
    let with = |own: Option<u64>, refund: bool| {
        let mut d = desc(&[("budget", "team")]);
        d.hits_addend = own;
        d.is_negative_hits = refund;
        d
    };
    let req = request_of(vec![
        with(Some(0), false),
        with(Some(120), false),
        with(None, false),
        with(Some(120), true),
    ]);
    let (_, ops) = planned(&c, &req);
    match ops[0].reserve {
        Reservation::Counted(CountedHolds::Hold { hits, for_ms, .. }) => {
            assert_eq!((hits, for_ms), (300, 90_000))
        }
        r => panic!("a check holds: {r:?}"),
    }
    assert_eq!(
        ops[1].reserve,
        Reservation::Counted(CountedHolds::Release { hits: 300 })
    );
    assert_eq!(
        ops[2].reserve,
        Reservation::None,
        "no hits_addend of its own"
    );
    assert_eq!(ops[3].reserve, Reservation::None, "a refund");
    assert!(ops.iter().all(|op| op.local_first == Some(false)), "exact");
    // Reports counted only when admitted release nothing.
    let s = AnswerSettings {
        counting_rule: CountingRule::IfAdmitted,
        ..default_settings()
    };
    let (_, ops) = try_plan(&c, &req, &s).expect("planned");
    assert_eq!(ops[1].reserve, Reservation::None);
    assert!(matches!(
        ops[0].reserve,
        Reservation::Counted(CountedHolds::Hold { .. })
    ));
}

#[test]
fn a_limits_algorithm_and_queue_go_with_its_op() {
    let c = config();
    let (_, ops) = planned(&c, &request_of(vec![desc(&[("bucket", "b")])]));
    assert_eq!(ops[0].params.algorithm, Algorithm::TokenBucket { burst: 9 });
    let queue = QueueSpec {
        max_waiting: 5,
        max_wait: Duration::from_millis(250),
    };
    assert_eq!(ops[0].queue, Some(queue));
    assert_eq!(ops[0].local_first, None, "the store policy's default");
    assert_eq!(ops[0].reserve, Reservation::None);
}

#[test]
fn detailed_metric_carries_the_requests_values_as_its_series() {
    let c = config();
    let req = request_of(vec![desc(&[("detailed", "alice")]), desc(&[("one", "b")])]);
    let (p, _) = planned(&c, &req);
    let paths: Vec<Option<&str>> = p.carried.iter().map(|c| c.stat_path.as_deref()).collect();
    assert_eq!(
        paths,
        [Some("detailed_alice"), None],
        "the node's own: none"
    );
}
