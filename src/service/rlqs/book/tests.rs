use super::*;
use crate::config::LoadOptions;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action;

const S: u64 = 1_000_000_000;

fn config(rpu: u32) -> Config {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {rpu}}}\n"
    );
    Config::from_sources(&[("t.yaml".into(), yaml)], LoadOptions::default()).unwrap()
}

fn key(user: &str) -> BucketKey {
    vec![("user".to_string(), user.to_string())]
}

fn usage(user: &str, secs: u64, asked: u64) -> BucketUsage {
    BucketUsage {
        bucket: key(user),
        elapsed: Duration::from_secs(secs),
        allowed: asked,
        denied: 0,
    }
}

/// What the outbox tells `stream`: per action, tokens per fill (`Some(0)` for a blanket rule),
/// or `None` for an abandon.
fn told(out: &Outbox, stream: StreamId) -> Vec<Option<u32>> {
    let Some((_, actions)) = out.iter().find(|(s, _)| *s == stream) else {
        return Vec::new();
    };
    actions
        .iter()
        .map(|a| match a.bucket_action.as_ref().unwrap() {
            bucket_action::BucketAction::AbandonAction(_) => None,
            bucket_action::BucketAction::QuotaAssignmentAction(q) => {
                match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                    Strategy::TokenBucket(tb) => Some(tb.tokens_per_fill.unwrap().value),
                    _ => Some(0),
                }
            }
        })
        .collect()
}

#[test]
fn one_envoy_gets_the_whole_limit_on_its_first_report() {
    let c = config(20);
    let mut book = Book::new(100);
    book.open(1);
    let (out, full) = book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    assert_eq!(full, 0);
    assert_eq!(told(&out, 1), vec![Some(20)]);
    // The next report changes nothing: nothing is sent until the refresh is due.
    let (out, _) = book.report(&c, 1, "d", vec![usage("a", 5, 150)], 5 * S);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(told(&book.tick(15 * S), 1), vec![Some(20)], "refreshed");
}

#[test]
fn two_envoys_share_max_min_fairly_and_a_leavers_share_comes_back() {
    let c = config(20);
    let mut book = Book::new(100);
    book.open(1);
    book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    book.report(&c, 1, "d", vec![usage("a", 5, 150)], 5 * S);
    book.open(2);
    // A newcomer's demand is unknown: it claims an equal split, pushed to both at once.
    let (out, _) = book.report(&c, 2, "d", vec![usage("a", 0, 1)], 6 * S);
    assert_eq!(
        (told(&out, 1), told(&out, 2)),
        (vec![Some(10)], vec![Some(10)])
    );
    // It asks for 5/s: it gets 5, the other the rest.
    let (out, _) = book.report(&c, 2, "d", vec![usage("a", 5, 25)], 11 * S);
    assert_eq!(
        (told(&out, 1), told(&out, 2)),
        (vec![Some(15)], vec![Some(5)])
    );
    let view = book.view();
    let share = |stream, share| BucketShare { stream, share };
    assert_eq!(view[0].shares, vec![share(1, 15), share(2, 5)]);
    assert_eq!(view[0].demand, 35.0);
    // Noise within a tenth does not push.
    let (out, _) = book.report(&c, 2, "d", vec![usage("a", 5, 26)], 16 * S);
    assert!(
        told(&out, 1).is_empty() && told(&out, 2).is_empty(),
        "{out:?}"
    );
    let out = book.close(2, 17 * S);
    assert_eq!(told(&out, 1), vec![Some(20)]);
    assert_eq!((book.streams(), book.buckets()), (1, 1));
}

#[test]
fn different_values_of_a_key_only_node_are_different_limits() {
    let c = config(20);
    let mut book = Book::new(100);
    book.open(1);
    book.open(2);
    book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    let (out, _) = book.report(&c, 2, "d", vec![usage("b", 0, 1)], 0);
    assert_eq!(told(&out, 2), vec![Some(20)]);
    assert!(told(&out, 1).is_empty());
}

#[test]
fn a_lower_limit_is_pushed_and_a_removed_one_abandoned() {
    let mut book = Book::new(100);
    book.open(1);
    book.report(&config(20), 1, "d", vec![usage("a", 0, 1)], 0);
    assert_eq!(told(&book.reconfigure(&config(4), S), 1), vec![Some(4)]);
    assert!(book.reconfigure(&config(4), 2 * S).is_empty());
    let none = Config::from_sources(
        &[("t.yaml".into(), "domain: d\ndescriptors: []\n".into())],
        LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(told(&book.reconfigure(&none, 3 * S), 1), vec![None]);
    assert_eq!(book.buckets(), 0);
    assert!(book.view().is_empty());
    // Envoy asks again: nothing limits the bucket now.
    let (out, _) = book.report(&none, 1, "d", vec![usage("a", 0, 1)], 4 * S);
    assert_eq!(told(&out, 1), vec![Some(0)]);
}

#[test]
fn unmatched_buckets_are_allowed_all_and_the_book_is_bounded() {
    let c = config(20);
    let mut book = Book::new(2);
    book.open(1);
    let (out, full) = book.report(
        &c,
        1,
        "d",
        vec![
            BucketUsage {
                bucket: vec![("other".into(), "x".into())],
                ..usage("a", 0, 1)
            },
            usage("a", 0, 1),
            usage("b", 0, 1),
        ],
        0,
    );
    assert_eq!(full, 1, "the third bucket does not fit");
    let mut got = told(&out, 1);
    got.sort();
    assert_eq!(got, vec![Some(0), Some(20)]);
}

#[test]
fn undelivered_actions_are_sent_again_and_idle_buckets_forgotten() {
    let c = config(20);
    let mut book = Book::new(100);
    book.open(1);
    book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    book.undelivered(1);
    assert_eq!(told(&book.tick(S), 1), vec![Some(20)]);
    book.tick(61 * S);
    assert_eq!(book.buckets(), 0);
}

#[test]
fn the_same_bucket_in_another_domain_is_another_bucket() {
    let c = config(20);
    let mut book = Book::new(100);
    book.open(1);
    book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    let (out, _) = book.report(&c, 1, "elsewhere", vec![usage("a", 0, 1)], 0);
    assert_eq!(told(&out, 1), vec![Some(0)], "unknown domain: allowed all");
    assert_eq!(book.buckets(), 2);
}

#[test]
fn replicas_split_a_limit_over_the_whole_fleet() {
    let c = config(20);
    // Replica 1 has a bucket asking 30/s; replica 2 (this book) one asking 6/s.
    let mut book = Book::new(100).replica(2);
    book.open(1);
    book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    let (out, _) = book.report(&c, 1, "d", vec![usage("a", 5, 30)], 5 * S);
    assert!(out.is_empty(), "alone it keeps the whole limit: {out:?}");
    assert_eq!(
        book.local_demands(),
        vec![("d_user_a_".to_string(), vec![Some(6.0)])]
    );
    let (replica, demands) = (1, vec![Some(30.0)]);
    let remote = vec![ReplicaDemands { replica, demands }];
    let out = book.set_remote("d_user_a_", remote, 6 * S);
    assert_eq!(
        told(&out, 1),
        vec![Some(6)],
        "its demand; the other replica takes 14"
    );
    // The other replica's demands stop coming (Redis gone): after a while, alone again.
    assert!(told(&book.tick(10 * S), 1).is_empty());
    assert_eq!(told(&book.tick(21 * S), 1), vec![Some(20)]);
}

#[test]
fn every_replica_rounds_the_fleet_split_alike() {
    let c = config(10);
    // Three replicas, one bucket each, unknown demands: 10 = 4 + 3 + 3 whoever computes it.
    let mut shares = Vec::new();
    for me in [1u64, 2, 3] {
        let mut book = Book::new(100).replica(me);
        book.open(1);
        book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
        let others = [1u64, 2, 3].into_iter().filter(|r| *r != me);
        let remote = (others.map(|replica| ReplicaDemands {
            replica,
            demands: vec![None],
        }))
        .collect();
        let out = book.set_remote("d_user_a_", remote, S);
        shares.push(told(&out, 1)[0].unwrap());
    }
    assert_eq!(shares, vec![4, 3, 3]);
}

mod invariant {
    use super::*;
    use proptest::prelude::{prop, prop_assert_eq, prop_oneof, proptest, Just};
    use proptest::strategy::Strategy as _;

    #[derive(Debug, Clone)]
    enum Op {
        Report {
            stream: u64,
            user: u8,
            secs: u64,
            asked: u64,
        },
        Close {
            stream: u64,
        },
        Tick,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        prop_oneof![
            (1u64..4, 0u8..2, 0u64..6, 0u64..400).prop_map(|(stream, user, secs, asked)| {
                Op::Report {
                    stream,
                    user,
                    secs,
                    asked,
                }
            }),
            (1u64..4).prop_map(|stream| Op::Close { stream }),
            Just(Op::Tick),
        ]
    }

    proptest! {
        /// Whatever Envoys come, go and ask, the shares in force of a limit add up to it.
        #[test]
        fn shares_in_force_always_add_up_to_the_limit(ops in prop::collection::vec(op(), 1..60)) {
            let c = config(17);
            let mut book = Book::new(100);
            let mut now = 0;
            for op in ops {
                now += S;
                match op {
                    Op::Report { stream, user, secs, asked } => {
                        book.open(stream);
                        let name = ["a", "b"][user as usize];
                        book.report(&c, stream, "d", vec![usage(name, secs, asked)], now);
                    }
                    Op::Close { stream } => {
                        book.close(stream, now);
                    }
                    Op::Tick => {
                        book.tick(now);
                    }
                }
                for l in book.view() {
                    let sum: u32 = l.shares.iter().map(|s| s.share).sum();
                    prop_assert_eq!(sum, 17, "{:?}", l);
                }
            }
        }
    }
}

#[test]
fn demand_is_measured_over_the_time_between_reports_not_envoys_cut_down_seconds() {
    let c = config(20);
    let mut book = Book::new(100);
    book.open(1);
    book.report(&c, 1, "d", vec![usage("a", 0, 1)], 0);
    // 30 requests in a 4.998 s interval that Envoy 1.40 reports as "4 s": 6/s, not 7.5/s.
    book.report(&c, 1, "d", vec![usage("a", 4, 30)], 4_998_000_000);
    assert!(
        (book.view()[0].demand - 6.0).abs() < 0.01,
        "{:?}",
        book.view()
    );
}
