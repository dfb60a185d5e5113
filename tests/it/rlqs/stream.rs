//! The RLQS stream (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`) with a real gRPC
//! client against the server on port 0: what each kind of bucket is assigned, pushes to one
//! Envoy when another arrives, abandon on a removed limit, bad reports, and shutdown.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::{load, TestServer};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const LIMITS: &str = "
domain: q
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: slow
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window}
";

/// One Envoy's stream, as the test drives it.
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    actions: Streaming<RateLimitQuotaResponse>,
    /// The buckets reported on this stream: every answer must be about one of them.
    reported: Vec<HashMap<String, String>>,
}

impl Envoy {
    async fn connect(s: &TestServer) -> Envoy {
        let mut client =
            RateLimitQuotaServiceClient::connect(format!("http://{}", s.running().grpc_addr))
                .await
                .unwrap();
        let (reports, rx) = mpsc::channel(4);
        let actions = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("stream opens")
            .into_inner();
        Envoy {
            reports,
            actions,
            reported: Vec::new(),
        }
    }

    async fn report(&mut self, domain: &str, bucket: &[(&str, &str)], secs: i64, asked: u64) {
        let map: HashMap<String, String> = (bucket.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if !self.reported.contains(&map) {
            self.reported.push(map);
        }
        let usage = BucketQuotaUsage {
            bucket_id: Some(id(bucket)),
            time_elapsed: Some(PbDuration {
                seconds: secs,
                nanos: 0,
            }),
            num_requests_allowed: asked,
            num_requests_denied: 0,
        };
        self.reports
            .send(RateLimitQuotaUsageReports {
                domain: domain.into(),
                bucket_quota_usages: vec![usage],
            })
            .await
            .unwrap();
    }

    /// The next response's actions.
    async fn next(&mut self) -> Vec<(HashMap<String, String>, Told)> {
        let r = tokio::time::timeout(Duration::from_secs(10), self.actions.message())
            .await
            .expect("an answer within 10 s")
            .expect("no error")
            .expect("stream open");
        let actions: Vec<_> = (r.bucket_action.into_iter())
            .map(|a| (a.bucket_id.unwrap().bucket, told(a.bucket_action.unwrap())))
            .collect();
        for (bucket, _) in &actions {
            assert!(
                self.reported.contains(bucket),
                "an answer about {bucket:?}, never reported on this stream ({:?})",
                self.reported
            );
        }
        actions
    }
}

#[derive(Debug, PartialEq)]
enum Told {
    /// A token bucket: tokens per fill, max tokens, fill seconds.
    Tokens(u32, u32, i64),
    Allow,
    Deny,
    Abandon,
}

fn told(a: BucketAction) -> Told {
    let q = match a {
        BucketAction::AbandonAction(_) => return Told::Abandon,
        BucketAction::QuotaAssignmentAction(q) => q,
    };
    assert_eq!(q.assignment_time_to_live.unwrap().seconds, 30);
    match q.rate_limit_strategy.unwrap().strategy.unwrap() {
        Strategy::TokenBucket(tb) => Told::Tokens(
            tb.tokens_per_fill.unwrap().value,
            tb.max_tokens,
            tb.fill_interval.unwrap().seconds,
        ),
        Strategy::BlanketRule(r) if r == BlanketRule::AllowAll as i32 => Told::Allow,
        Strategy::BlanketRule(_) => Told::Deny,
        other => panic!("unexpected strategy {other:?}"),
    }
}

fn id(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[tokio::test]
async fn each_kind_of_bucket_gets_its_assignment() {
    let s = TestServer::start(LIMITS).await;
    let mut e = Envoy::connect(&s).await;
    e.report("q", &[("user", "a")], 0, 1).await;
    assert_eq!(
        e.next().await[0].1,
        Told::Tokens(10, 10, 1),
        "the whole limit"
    );
    e.report("q", &[("nope", "x")], 0, 1).await;
    assert_eq!(e.next().await[0].1, Told::Allow, "no limit matches");
    e.report("other", &[("user", "a")], 0, 1).await;
    assert_eq!(e.next().await[0].1, Told::Allow, "unknown domain");
    e.report("q", &[("slow", "x")], 0, 1).await;
    assert_eq!(e.next().await[0].1, Told::Allow, "refused: sliding_window");
}

/// A shadow-mode limit never refuses, and under `SHADOW_MODE` none does: their buckets are
/// allowed everything, so the Envoy enforcing them never denies.
#[tokio::test]
async fn shadow_limits_and_global_shadow_mode_allow_all() {
    let shadow = "domain: q\ndescriptors:\n  - key: user\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 10}\n";
    let s = TestServer::start(shadow).await;
    let mut e = Envoy::connect(&s).await;
    e.report("q", &[("user", "a")], 0, 1).await;
    assert_eq!(e.next().await[0].1, Told::Allow, "shadow_mode");

    let s = TestServer::start_with(LIMITS, &[("SHADOW_MODE", "true")]).await;
    let mut e = Envoy::connect(&s).await;
    e.report("q", &[("user", "a")], 0, 1).await;
    assert_eq!(e.next().await[0].1, Told::Allow, "SHADOW_MODE");
}

#[tokio::test]
async fn a_second_envoy_halves_the_first_ones_share_without_waiting_for_its_report() {
    let s = TestServer::start(LIMITS).await;
    let mut a = Envoy::connect(&s).await;
    a.report("q", &[("user", "shared")], 0, 1).await;
    assert_eq!(a.next().await[0].1, Told::Tokens(10, 10, 1));
    let mut b = Envoy::connect(&s).await;
    b.report("q", &[("user", "shared")], 0, 1).await;
    assert_eq!(b.next().await[0].1, Told::Tokens(5, 5, 1));
    assert_eq!(a.next().await[0].1, Told::Tokens(5, 5, 1), "pushed");
    // b asks for 2/s: a gets the rest.
    b.report("q", &[("user", "shared")], 5, 10).await;
    assert_eq!(b.next().await[0].1, Told::Tokens(2, 2, 1));
    assert_eq!(a.next().await[0].1, Told::Tokens(8, 8, 1));
    drop(b);
    assert_eq!(
        a.next().await[0].1,
        Told::Tokens(10, 10, 1),
        "b's share back"
    );
}

#[tokio::test]
async fn a_removed_limit_is_abandoned_and_a_bad_report_ends_the_stream() {
    let s = TestServer::start(LIMITS).await;
    let mut e = Envoy::connect(&s).await;
    e.report("q", &[("user", "a")], 0, 1).await;
    assert_eq!(e.next().await[0].1, Told::Tokens(10, 10, 1));
    s.running()
        .context
        .live
        .install(load("domain: q\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 1}\n"));
    let got = e.next().await;
    assert_eq!(got[0].0["user"], "a");
    assert_eq!(got[0].1, Told::Abandon);
    // A report without a domain is refused, naming what is wrong.
    e.report("", &[("user", "a")], 0, 1).await;
    let err = tokio::time::timeout(Duration::from_secs(10), e.actions.message())
        .await
        .expect("an answer within 10 s")
        .expect_err("INVALID_ARGUMENT");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("domain"), "{err:?}");
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let mut s = TestServer::start(LIMITS).await;
    let mut e = Envoy::connect(&s).await;
    e.report("q", &[("user", "a")], 0, 1).await;
    let answer = e.next().await;
    let user_a: HashMap<String, String> = [("user".to_owned(), "a".to_owned())].into();
    assert_eq!(
        answer.iter().map(|(id, _)| id).collect::<Vec<_>>(),
        vec![&user_a],
        "the answer is about the bucket reported"
    );
    tokio::time::timeout(Duration::from_secs(10), s.shutdown())
        .await
        .expect("an open RLQS stream does not hold up shutdown");
    let end = tokio::time::timeout(Duration::from_secs(10), e.actions.message())
        .await
        .expect("the stream ends within 10 s of shutdown");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
}

/// Reads responses until the first action for the bucket is `want`, within 10 s.
async fn until(e: &mut Envoy, want: Told) {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while tokio::time::Instant::now() < end {
        let left = end - tokio::time::Instant::now();
        let Ok(r) = tokio::time::timeout(left, e.next()).await else {
            break;
        };
        let told = r.into_iter().next().map(|(_, t)| t);
        if told.as_ref() == Some(&want) {
            return;
        }
        seen.push(told);
    }
    panic!("never told {want:?}; told {seen:?}");
}

#[tokio::test]
async fn two_replicas_split_a_limit_over_both_their_envoys_through_redis() {
    let redis = crate::common::redis::Redis::start();
    let env = crate::common::redis::env(&redis, "rlqs-fleet:");
    let one = TestServer::start_env(LIMITS, env.clone()).await;
    let two = TestServer::start_env(LIMITS, env).await;
    let mut a = Envoy::connect(&one).await;
    a.report("q", &[("user", "shared")], 0, 1).await;
    assert_eq!(
        a.next().await[0].1,
        Told::Tokens(10, 10, 1),
        "alone in the fleet"
    );
    let mut b = Envoy::connect(&two).await;
    b.report("q", &[("user", "shared")], 0, 1).await;
    // Within a second or two each replica reads the other's demand from Redis.
    until(&mut b, Told::Tokens(5, 5, 1)).await;
    until(&mut a, Told::Tokens(5, 5, 1)).await;
    // b's Envoy asks for 2/s: the fleet's split follows on both replicas.
    b.report("q", &[("user", "shared")], 5, 10).await;
    until(&mut b, Told::Tokens(2, 2, 1)).await;
    until(&mut a, Told::Tokens(8, 8, 1)).await;
    let m = crate::common::envoy::client()
        .get(format!("{}/metrics", one.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("ratelimit_service_rlqs_fleet_errors_total 0"),
        "{m}"
    );
}
