//! The answer to a decided request: a status per descriptor (the limit closest to exhaustion),
//! the overall code, the stats, RateLimit-* headers, the waited header and dynamic metadata.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
pub(super) use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::{
    value::Kind, Duration as PbDuration, ListValue, Struct, Value,
};
use smallvec::SmallVec;

use super::metrics::{BoundStats, Counted, RequestStats, Tally};
use super::plan::{Applied, LimitRef, Plan};
use super::refusal::{self, RefusalLog, Reported};
use super::request::Request;
use super::settings::{AnswerSettings, HeaderNames};
use crate::hitters::BoundTop;
use crate::limiter::{Counting, Decision, Outcome, Role};

/// Header telling an admitted waiter how long it waited, in milliseconds.
pub const WAITED_HEADER: &str = "x-ratelimit-waited-ms";

/// Where an answer's stats go.
pub(super) struct Recorders<'a> {
    pub(super) metrics: &'a RequestStats,
    pub(super) stats: &'a BoundStats,
    pub(super) top: &'a BoundTop,
    pub(super) refusals: &'a RefusalLog,
}

/// Statuses in descriptor order, every one OK until a limit says otherwise.
pub(super) fn ok_statuses(n: usize) -> Vec<DescriptorStatus> {
    vec![
        DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
        n
    ]
}

/// Builds the response from the engine's `decision` on the ops of `plan`, counting the stats.
pub(super) fn answer(
    req: &Request<'_>,
    plan: &mut Plan<'_>,
    decision: &Decision,
    settings: &AnswerSettings,
    recorders: Recorders<'_>,
) -> RateLimitResponse {
    let n = req.descriptors.len();
    let mut statuses = ok_statuses(n);
    for &i in &plan.unlimited {
        statuses[i].limit_remaining = u32::MAX;
    }
    // Per descriptor, report the limit closest to exhaustion (an over-limit one first).
    let mut best: SmallVec<[Option<(usize, Outcome)>; 4]> = SmallVec::from_elem(None, n);
    for (k, out) in decision.outcomes.iter().enumerate() {
        let ai = plan.op_of[k];
        let slot = &mut best[plan.applied[ai].descriptor];
        let better = match slot {
            None => true,
            Some((_, cur)) => {
                (out.over && !cur.over) || (out.over == cur.over && out.remaining < cur.remaining)
            }
        };
        if better {
            *slot = Some((ai, *out));
        }
    }
    let mut totals = Tally::default();
    for (i, b) in best.iter().enumerate() {
        let Some((ai, out)) = b else { continue };
        let a = &plan.applied[*ai];
        set_status(&mut statuses[i], a, out);
        count(req, plan, i, a, out, &recorders, &mut totals);
    }
    recorders.metrics.record_totals(&totals);
    // The engine's verdict: the one it consumed by.
    let overall = if decision.refused {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let mut response = RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        ..Default::default()
    };
    let refused_by = (decision.refused)
        .then(|| refusal::refusing(plan, &best, &response.statuses))
        .flatten();
    if let Some(named) = &refused_by {
        recorders.refusals.log(req, plan, named);
    }
    if let Some(names) = &settings.response_headers {
        add_limit_headers(
            &mut response,
            names,
            names.ietf.then_some((plan, &best[..])),
        );
    }
    // Only for a waiter admitted: one refused (past `max_wait`, or at shutdown) is told so by
    // its code alone.
    if decision.waited_ns > 0 && !decision.refused {
        response.response_headers_to_add.push(HeaderValue {
            key: WAITED_HEADER.to_owned(),
            value: (decision.waited_ns / 1_000_000).to_string(),
            ..Default::default()
        });
    }
    if settings.response_dynamic_metadata {
        response.dynamic_metadata = Some(dynamic_metadata(req, plan, &best, &response.statuses));
    }
    if let Some(named) = refused_by.filter(|_| settings.refused_by_metadata) {
        let md = response
            .dynamic_metadata
            .get_or_insert_with(Struct::default);
        let by = refusal::metadata(req, plan, &named);
        md.fields.insert("refused_by".to_owned(), to_value(by));
    }
    response
}

/// The answer to a request for a domain with no config: every status OK, nothing counted,
/// and with `RESPONSE_DYNAMIC_METADATA` the request's metadata, as envoyproxy/ratelimit sends it
/// for any domain (`ratelimitToMetadata`: no limit passed, so no `metadata`).
pub(super) fn unknown_domain(req: &Request<'_>, settings: &AnswerSettings) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: ok_statuses(req.descriptors.len()),
        dynamic_metadata: (settings.response_dynamic_metadata)
            .then(|| to_struct(request_metadata(req))),
        ..Default::default()
    }
}

/// The request's part of envoyproxy/ratelimit's dynamic metadata: the domain, each
/// descriptor's entries as `key=value`, its `limit` and `hitsAddend`, the request's
/// `hitsAddend`.
fn request_metadata(req: &Request<'_>) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::{json, Map, Value as J};
    let mut top = Map::new();
    top.insert("domain".into(), J::String(req.domain.to_owned()));
    let descriptors = req.descriptors.iter().map(|d| {
        let mut m = Map::new();
        let entries = d
            .entries
            .iter()
            .map(|e| J::String(format!("{}={}", e.key, e.value)));
        m.insert("entries".into(), J::Array(entries.collect()));
        if let Some(l) = d.limit {
            let unit = crate::config::Unit::from_envoy_override(l.unit)
                .map_or_else(|| l.unit.to_string(), |u| u.name().to_uppercase());
            let text = format!("requests_per_unit:{} unit:{unit}", l.requests_per_unit);
            m.insert("limit".into(), J::String(text));
        }
        if let Some(h) = d.hits_addend {
            m.insert("hitsAddend".into(), json!(h));
        }
        J::Object(m)
    });
    top.insert("descriptors".into(), J::Array(descriptors.collect()));
    if req.hits_addend != 0 {
        top.insert("hitsAddend".into(), json!(req.hits_addend));
    }
    top
}

/// envoyproxy/ratelimit's dynamic metadata (`ratelimitToMetadata`): the request's part, and
/// under `metadata` the `metadata` of the descriptors that passed, merged in descriptor order
/// (the first value of a key wins; maps merge key by key).
fn dynamic_metadata(
    req: &Request<'_>,
    plan: &Plan<'_>,
    best: &[Option<(usize, Outcome)>],
    statuses: &[DescriptorStatus],
) -> Struct {
    use serde_json::{Map, Value as J};
    let mut top = request_metadata(req);
    let mut passed = Map::new();
    for (i, b) in best.iter().enumerate() {
        let Some((ai, _)) = b else { continue };
        let from_config = matches!(plan.applied[*ai].limit, LimitRef::Config(_));
        if !from_config || statuses[i].code != Code::Ok as i32 {
            continue;
        }
        if let Some(md) = plan.matches[i]
            .as_ref()
            .and_then(|m| m.node().metadata.as_deref())
        {
            merge_first_wins(&mut passed, md);
        }
    }
    if !passed.is_empty() {
        top.insert("metadata".into(), J::Object(passed));
    }
    to_struct(top)
}

/// Adds `src`'s keys that `dest` lacks; where both hold a map, merges them the same way.
fn merge_first_wins(
    dest: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    use serde_json::Value as J;
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (Some(J::Object(d)), J::Object(s)) => merge_first_wins(d, s),
            (Some(_), _) => {}
            (None, v) => {
                dest.insert(k.clone(), v.clone());
            }
        }
    }
}

fn set_status(status: &mut DescriptorStatus, a: &Applied<'_>, out: &Outcome) {
    let over = out.over || out.blocked;
    let refused = over && a.role != Role::Shadow;
    status.code = if refused {
        Code::OverLimit as i32
    } else {
        Code::Ok as i32
    };
    // The unit alone: Envoy PR #47307 proposes `unit_multiplier` here; it is sent once Envoy
    // merges it (an N-unit or calendar window's length is in `duration_until_reset`).
    status.current_limit = Some(PbRateLimit {
        name: a.limit.name().to_owned(),
        requests_per_unit: a.limit.requests_per_unit(),
        unit: a.limit.unit().proto(),
    });
    status.limit_remaining = if over { 0 } else { out.remaining };
    status.duration_until_reset = Some(PbDuration {
        seconds: until_ns(out, refused).div_ceil(1_000_000_000) as i64,
        nanos: 0,
    });
}

/// What a status's `duration_until_reset` tells: for a limit over, when the request would be
/// admitted if nothing else arrived (a token bucket's next tokens, the sliding estimate's room,
/// a fixed window's end); otherwise when the window ends or the bucket is full again.
/// Hits that no window could ever admit are told the reset.
fn until_ns(out: &Outcome, refused: bool) -> u64 {
    if refused && out.over && out.retry_ns != u64::MAX {
        out.retry_ns
    } else {
        out.reset_ns
    }
}

/// Counts descriptor `i`'s hits: in its limit's stats, or in per-value series when the
/// node asks for them (`detailed_metric` names every value, `value_to_metric` the values of
/// the levels that ask), which live in a capped map of their own; and in its limit's heavy
/// hitters, by the descriptor's values (Envoy's `limit` overrides have no node: not there).
fn count(
    req: &Request<'_>,
    plan: &Plan<'_>,
    i: usize,
    a: &Applied<'_>,
    out: &Outcome,
    c: &Recorders<'_>,
    totals: &mut Tally,
) {
    let over = out.over || out.blocked;
    let carried = &plan.carried[i];
    let hits = carried.hits;
    // A shadow-mode descriptor over its limit counts in `over_limit` and `shadow_mode` (the
    // reference's cache counts both) but is not refused, nor listed as limited.
    let (counted_over, shadow) = (
        over && a.role != Role::Shadow,
        a.role == Role::Shadow && over,
    );
    let from_config = matches!(a.limit, LimitRef::Config(_));
    let matched = plan.matches[i].as_ref().filter(|_| from_config);
    let counted = Counted {
        hits,
        over,
        shadow,
        remaining: out.remaining,
        limit: a.limit.requests_per_unit(),
        // Refused behind waiters: every hit is over.
        past: if out.over { out.past } else { u64::MAX },
    };
    if let Some(m) = matched {
        let d = &req.descriptors[i];
        // Usage counted in full is ranked exactly: budgets are compared by what was used.
        let exact = counted_over || carried.counting == Counting::Usage;
        c.top
            .record(m.node(), &d.entries, hits, counted_over, exact);
    }
    match &carried.stat_path {
        None => c
            .metrics
            .record(matched.map(|m| c.stats.of(m.node())), counted, totals),
        Some(path) => {
            c.metrics.record(None, counted, totals);
            c.metrics.record_series(req.domain, path, counted);
        }
    }
}

/// The service-made headers (`LIMIT_RESPONSE_HEADERS_ENABLED`) for the status closest to its
/// limit, as envoyproxy/ratelimit picks it; on a refusal, for a limit that refused (of those,
/// the one admitting last), never one that passed: the reference's three, or with `ietf` (the
/// plan and the limits the statuses report) the IETF fields naming that limit.
fn add_limit_headers(
    resp: &mut RateLimitResponse,
    names: &HeaderNames,
    ietf: Option<(&Plan<'_>, &Reported)>,
) {
    let over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
    let reset = |s: &DescriptorStatus| s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    let limited = (resp.statuses.iter().enumerate()).filter(|(_, s)| s.current_limit.is_some());
    let pick = if resp.statuses.iter().any(over) {
        limited
            .filter(|(_, s)| over(s))
            .max_by_key(|(_, s)| reset(s))
    } else {
        limited.min_by_key(|(_, s)| s.limit_remaining)
    };
    let Some((i, s)) = pick else { return };
    let fields = match ietf {
        Some((plan, best)) => match refusal::NamedLimit::of(plan, best, i) {
            Some(named) => refusal::ietf_fields(&named, s).to_vec(),
            None => return,
        },
        None => {
            let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
            let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
            vec![
                (names.limit.clone(), limit.to_string()),
                (names.remaining.clone(), s.limit_remaining.to_string()),
                (names.reset.clone(), reset.to_string()),
            ]
        }
    };
    for (key, value) in fields {
        resp.response_headers_to_add.push(HeaderValue {
            key,
            value,
            ..Default::default()
        });
    }
}

fn to_struct(map: serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_value(v))).collect(),
    }
}

fn to_value(v: serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.into_iter().map(to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(to_struct(o)),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests;
