//! The answer on its own: a request planned on a config built from YAML, the engine's verdicts
//! written as plain values, and what Envoy and an operator see of them: each status, the
//! overall code, the stats, the headers and the dynamic metadata.

use std::sync::atomic::Ordering::Relaxed;

use super::*;
use crate::config::{Config, LoadOptions};
use crate::descriptor;
use crate::hitters::TopTable;
use crate::service::fixtures::{default_settings, desc, request_of};
use crate::service::metrics::LimitStats;
use crate::service::plan;
use crate::service::Override;

const SEC: u64 = 1_000_000_000;
const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const LIMITS: &str = r#"
domain: d
descriptors:
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: fast}
      - {unit: minute, requests_per_unit: 100, name: slow}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: free
    rate_limit: {unlimited: true}
  - key: general
    rate_limit: {unit: minute, requests_per_unit: 1, name: general}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: joint
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: meta
    metadata: {team: payments}
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

/// A config and what an answer on it records into.
struct World {
    config: Config,
    metrics: RequestStats,
    stats: BoundStats,
    top: BoundTop,
    refusals: RefusalLog,
}

impl World {
    fn new() -> World {
        let files = [("answer.yaml".to_owned(), LIMITS.to_owned())];
        let config =
            Config::from_sources(&files, LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let metrics = RequestStats::default();
        World {
            stats: metrics.limit_stats.bind(&config),
            top: TopTable::default().bind(&config),
            metrics,
            refusals: RefusalLog::default(),
            config,
        }
    }

    /// The answer to `req` planned on the config, given the engine's `decision` on its ops.
    fn answer(
        &self,
        req: &Request<'_>,
        s: &AnswerSettings,
        decision: &Decision,
    ) -> RateLimitResponse {
        let mut p = Plan::default();
        let domain = self.config.domain(req.domain).expect("domain d");
        let ops = plan::plan(&mut p, domain, req, s).expect("planned");
        assert_eq!(ops.len(), decision.outcomes.len(), "a verdict per op");
        let recorders = Recorders {
            metrics: &self.metrics,
            stats: &self.stats,
            top: &self.top,
            refusals: &self.refusals,
        };
        answer(req, &mut p, decision, s, recorders)
    }

    /// The per-limit stats of the node `pairs` match.
    fn stats_of(&self, pairs: &[(&'static str, &'static str)]) -> &LimitStats {
        let d = desc(pairs);
        let m = descriptor::find(self.config.domain("d").unwrap(), &d.entries).expect("matched");
        self.stats.of(m.node())
    }
}

/// Within the limit: `remaining` left, the window ends in `reset_ns`.
fn within(remaining: u32, reset_ns: u64) -> Outcome {
    Outcome {
        over: false,
        remaining,
        past: 0,
        reset_ns,
        retry_ns: 0,
        blocked: false,
        released: false,
    }
}

/// Over the limit by all its hits: admitted again in `retry_ns`, the window ends in `reset_ns`.
fn over(reset_ns: u64, retry_ns: u64) -> Outcome {
    Outcome {
        over: true,
        remaining: 0,
        past: u64::MAX,
        reset_ns,
        retry_ns,
        blocked: false,
        released: false,
    }
}

fn decision(outcomes: &[Outcome], refused: bool) -> Decision {
    Decision {
        outcomes: outcomes.iter().copied().collect(),
        refused,
        ..Default::default()
    }
}

/// (code, remaining) of every status.
fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    (r.statuses.iter())
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

fn resets(r: &RateLimitResponse) -> Vec<i64> {
    let secs = |s: &DescriptorStatus| s.duration_until_reset.as_ref().map(|d| d.seconds);
    r.statuses.iter().map(|s| secs(s).unwrap_or(-1)).collect()
}

fn limit_of(s: &DescriptorStatus) -> (&str, u32, i32) {
    let l = s.current_limit.as_ref().expect("a current limit");
    (&l.name, l.requests_per_unit, l.unit)
}

fn header<'r>(r: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    let mut found = r.response_headers_to_add.iter().filter(|h| h.key == name);
    found.next().map(|h| h.value.as_str())
}

/// A protobuf value as JSON, to compare metadata with `json!`.
fn json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v.kind.as_ref() {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

fn struct_json(s: &Struct) -> serde_json::Value {
    let fields = s.fields.iter().map(|(k, v)| (k.clone(), json(v)));
    serde_json::Value::Object(fields.collect())
}

fn load(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Relaxed)
}

#[test]
fn each_status_reports_its_limit_closest_to_exhaustion_an_over_one_first() {
    let w = World::new();
    let req = request_of(vec![desc(&[("two", "a")])]);
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[within(6, SEC), within(2, SEC)], false),
    );
    assert_eq!(codes(&r), [(OK, 2)]);
    assert_eq!(limit_of(&r.statuses[0]), ("slow", 100, 2));
    // Over beats fewer left: its status tells 0, whatever the verdict's `remaining` said.
    let mut fast = over(SEC, SEC);
    fast.remaining = 5;
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[fast, within(1, SEC)], true),
    );
    assert_eq!(codes(&r), [(OVER, 0)]);
    assert_eq!(limit_of(&r.statuses[0]), ("fast", 10, 1));
}

#[test]
fn the_overall_code_is_the_engines_verdict_over_when_any_descriptor_refuses() {
    let w = World::new();
    let req = request_of(vec![desc(&[("one", "a")]), desc(&[("one", "b")])]);
    let refused = decision(&[within(3, SEC), over(SEC, SEC)], true);
    let r = w.answer(&req, &default_settings(), &refused);
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), [(OK, 3), (OVER, 0)]);
    // The engine did not refuse (SHADOW_MODE): the statuses still say who is over.
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[within(3, SEC), over(SEC, SEC)], false),
    );
    assert_eq!(r.overall_code, OK);
    assert_eq!(codes(&r), [(OK, 3), (OVER, 0)]);
}

#[test]
fn a_joint_descriptor_over_is_told_so_while_the_request_passes() {
    let w = World::new();
    let req = request_of(vec![desc(&[("joint", "a")]), desc(&[("joint", "b")])]);
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[over(SEC, SEC), within(0, SEC)], false),
    );
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OVER, 0), (OK, 0)]));
    let both = decision(&[over(SEC, SEC), over(SEC, SEC)], true);
    let r = w.answer(&req, &default_settings(), &both);
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OVER, vec![(OVER, 0), (OVER, 0)])
    );
}

#[test]
fn a_shadow_descriptor_over_answers_ok_and_counts_as_over_and_shadow() {
    let w = World::new();
    let req = request_of(vec![desc(&[("shadow", "s")])]);
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[over(30 * SEC, 5 * SEC)], false),
    );
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
    assert_eq!(limit_of(&r.statuses[0]).1, 1, "its limit is still reported");
    assert_eq!(
        resets(&r),
        [30],
        "not refused: the window's end, not a retry"
    );
    let s = w.stats_of(&[("shadow", "s")]);
    let counted = [
        &s.total_hits,
        &s.over_limit,
        &s.shadow_mode,
        &s.within_limit,
    ]
    .map(load);
    assert_eq!(counted, [1, 1, 1, 0]);
    assert!(r.dynamic_metadata.is_none());
}

#[test]
fn unlimited_and_unmatched_descriptors_answer_ok_without_a_limit() {
    let w = World::new();
    let req = request_of(vec![
        desc(&[("free", "f")]),
        desc(&[("nowhere", "x")]),
        desc(&[("one", "a")]),
    ]);
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[within(6, SEC)], false),
    );
    assert_eq!(codes(&r), [(OK, u32::MAX), (OK, 0), (OK, 6)]);
    let limited: Vec<bool> = r
        .statuses
        .iter()
        .map(|s| s.current_limit.is_some())
        .collect();
    assert_eq!(limited, [false, false, true]);
    assert_eq!(
        load(&w.metrics.all.total_hits),
        1,
        "only the limited one counts"
    );
}

#[test]
fn duration_until_reset_rounds_up_and_tells_a_refusal_when_to_retry() {
    let w = World::new();
    let req = request_of(["a", "b", "c", "d"].map(|v| desc(&[("one", v)])).to_vec());
    let outcomes = [
        within(3, 1_200_000_000),
        within(3, 3 * SEC),
        over(40 * SEC, 5 * SEC),
        // Hits no wait can admit: told the reset, never 0.
        over(40 * SEC, u64::MAX),
    ];
    let r = w.answer(&req, &default_settings(), &decision(&outcomes, true));
    assert_eq!(resets(&r), [2, 3, 5, 40]);
}

#[test]
fn a_descriptor_blocked_behind_waiters_is_over_until_the_window_ends() {
    let w = World::new();
    let req = request_of(vec![desc(&[("one", "a")])]);
    let mut blocked = within(4, 40 * SEC);
    blocked.blocked = true;
    blocked.retry_ns = 5 * SEC;
    let r = w.answer(&req, &default_settings(), &decision(&[blocked], true));
    assert_eq!((r.overall_code, codes(&r)), (OVER, vec![(OVER, 0)]));
    assert_eq!(resets(&r), [40]);
}

#[test]
fn hits_count_per_descriptor_in_its_limits_stats_and_the_totals() {
    let w = World::new();
    let mut own = desc(&[("one", "b")]);
    own.hits_addend = Some(5);
    let mut req = request_of(vec![desc(&[("one", "a")]), own]);
    req.hits_addend = 2;
    w.answer(
        &req,
        &default_settings(),
        &decision(&[within(5, SEC), within(0, SEC)], false),
    );
    let s = w.stats_of(&[("one", "a")]);
    assert_eq!(
        [&s.total_hits, &s.within_limit, &s.over_limit].map(load),
        [7, 7, 0]
    );
    assert_eq!(load(&w.metrics.all.total_hits), 7);
    // Refused on the second: its 5 are over, the first's 2 within.
    w.answer(
        &req,
        &default_settings(),
        &decision(&[within(3, SEC), over(SEC, SEC)], true),
    );
    assert_eq!(
        [&s.total_hits, &s.within_limit, &s.over_limit].map(load),
        [14, 9, 5]
    );
    assert_eq!(load(&w.metrics.all.over_limit), 5);
}

#[test]
fn an_override_and_detailed_metric_count_in_series_of_their_own() {
    let w = World::new();
    let mut o = desc(&[("one", "o")]);
    o.limit = Some(Override {
        requests_per_unit: 4,
        unit: 3, // HOUR
    });
    let req = request_of(vec![o, desc(&[("detailed", "alice")])]);
    let r = w.answer(
        &req,
        &default_settings(),
        &decision(&[within(3, SEC), within(4, SEC)], false),
    );
    assert_eq!(limit_of(&r.statuses[0]), ("", 4, 3));
    let series: Vec<(String, u64)> = (w.metrics.detailed.snapshot().into_iter())
        .map(|(_, path, s)| (path, load(&s.total_hits)))
        .collect();
    assert_eq!(series, [("detailed_alice".into(), 1), ("one_o".into(), 1)]);
    assert_eq!(
        load(&w.stats_of(&[("one", "o")]).total_hits),
        0,
        "not the node's"
    );
    assert_eq!(load(&w.stats_of(&[("detailed", "x")]).total_hits), 0);
    assert_eq!(load(&w.metrics.all.total_hits), 2, "the totals count them");
}

/// The limit, remaining and reset headers `with_headers` names.
fn three(r: &RateLimitResponse) -> [Option<&str>; 3] {
    ["X-Limit", "X-Left", "X-Reset"].map(|h| header(r, h))
}

fn with_headers() -> AnswerSettings {
    AnswerSettings {
        response_headers: Some(HeaderNames {
            ietf: false,
            limit: "X-Limit".into(),
            remaining: "X-Left".into(),
            reset: "X-Reset".into(),
        }),
        ..default_settings()
    }
}

#[test]
fn limit_headers_tell_the_least_remaining_or_the_refusal_admitting_last() {
    let w = World::new();
    let req = request_of(vec![desc(&[("one", "a")]), desc(&[("two", "b")])]);
    let admitted = decision(
        &[within(2, 9 * SEC), within(9, SEC), within(3, 50 * SEC)],
        false,
    );
    let r = w.answer(&req, &with_headers(), &admitted);
    assert_eq!(three(&r), [Some("7"), Some("2"), Some("9")]);
    let refused = [
        over(50 * SEC, 10 * SEC),
        over(SEC, 20 * SEC),
        within(0, SEC),
    ];
    let r = w.answer(&req, &with_headers(), &decision(&refused, true));
    assert_eq!(three(&r), [Some("10"), Some("0"), Some("20")]);
    let r = w.answer(&req, &default_settings(), &decision(&refused, true));
    assert!(r.response_headers_to_add.is_empty(), "off unless asked");
}

#[test]
fn the_waited_header_tells_only_an_admitted_waiter_how_long_it_waited() {
    let w = World::new();
    let req = request_of(vec![desc(&[("one", "a")])]);
    let mut d = decision(&[within(1, SEC)], false);
    d.waited_ns = 1_500_000_000;
    let r = w.answer(&req, &default_settings(), &d);
    assert_eq!(header(&r, WAITED_HEADER), Some("1500"));
    let mut d = decision(&[over(SEC, SEC)], true);
    d.waited_ns = 1_500_000_000;
    let r = w.answer(&req, &default_settings(), &d);
    assert_eq!(header(&r, WAITED_HEADER), None, "its code says it");
}

#[test]
fn dynamic_metadata_is_the_request_and_the_metadata_of_descriptors_that_passed() {
    let w = World::new();
    let s = AnswerSettings {
        response_dynamic_metadata: true,
        ..default_settings()
    };
    let mut req = request_of(vec![desc(&[("meta", "m")]), desc(&[("one", "a")])]);
    req.hits_addend = 2;
    let r = w.answer(
        &req,
        &s,
        &decision(&[within(3, SEC), within(5, SEC)], false),
    );
    let want = serde_json::json!({
        "domain": "d",
        "descriptors": [{"entries": ["meta=m"]}, {"entries": ["one=a"]}],
        "hitsAddend": 2.0,
        "metadata": {"team": "payments"},
    });
    assert_eq!(struct_json(r.dynamic_metadata.as_ref().unwrap()), want);
    // Over, `meta` passed nothing on.
    let r = w.answer(&req, &s, &decision(&[over(SEC, SEC), within(5, SEC)], true));
    let md = struct_json(r.dynamic_metadata.as_ref().unwrap());
    assert_eq!(md.get("metadata"), None, "{md}");
    assert_eq!(md["domain"], "d");
}

#[test]
fn a_refusal_names_its_limit_in_refused_by_when_asked() {
    let w = World::new();
    let s = AnswerSettings {
        refused_by_metadata: true,
        ..default_settings()
    };
    let req = request_of(vec![desc(&[("one", "a")]), desc(&[("general", "g")])]);
    let refused = decision(&[within(3, SEC), over(SEC, SEC)], true);
    let r = w.answer(&req, &default_settings(), &refused);
    assert!(r.dynamic_metadata.is_none(), "not unless asked");
    let r = w.answer(&req, &s, &refused);
    let md = struct_json(r.dynamic_metadata.as_ref().expect("refused_by"));
    let by = &md["refused_by"];
    assert_eq!(by["limit"], "general");
    assert_eq!(by["descriptor"], 1.0);
    assert_eq!(by["key"], "d_general_g_");
    assert_eq!(
        md.as_object().map(|o| o.len()),
        Some(1),
        "nothing else asked"
    );
    let r = w.answer(
        &req,
        &s,
        &decision(&[within(3, SEC), within(0, SEC)], false),
    );
    assert!(r.dynamic_metadata.is_none(), "admitted: no one refused");
}

#[test]
fn an_unknown_domain_answers_ok_for_every_descriptor() {
    let mut req = request_of(vec![desc(&[("one", "a")]), desc(&[("two", "b")])]);
    req.domain = "nowhere";
    let r = unknown_domain(&req, &default_settings());
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0), (OK, 0)]));
    assert!(r.dynamic_metadata.is_none());
    let s = AnswerSettings {
        response_dynamic_metadata: true,
        ..default_settings()
    };
    let md = struct_json(unknown_domain(&req, &s).dynamic_metadata.as_ref().unwrap());
    assert_eq!(md["domain"], "nowhere");
    assert_eq!(md.get("metadata"), None);
}
