//! The decision for one `RateLimitRequest`: validate, match, ask the engine, build the answer.
//! The gRPC adapter (`grpc`) and the HTTP `/json` endpoint both call [`RateLimiter::decide`].

pub mod grpc;
pub mod json;

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{
    value::Kind, Duration as PbDuration, ListValue, Struct, Value,
};
use smallvec::SmallVec;

use crate::config::settings::{HeaderNames, RequestLimits};
use crate::config::{Algorithm, Config, RateLimit, Unit};
use crate::descriptor::{self, Matched};
use crate::limiter::{Engine, EngineError, Op, Outcome, Params, Role};
use crate::telemetry::Metrics;

/// Header telling an admitted waiter how long it waited, in milliseconds.
pub const WAITED_HEADER: &str = "x-ratelimit-waited-ms";

/// Why a request got no decision. Mapped to gRPC codes and HTTP statuses in one place each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("overloaded: too many requests in flight, retry later")]
    Overloaded,
    #[error("rate limiter unavailable")]
    Unavailable,
}

impl From<EngineError> for RlsError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded => RlsError::Overloaded,
            EngineError::Stopped | EngineError::Unavailable => RlsError::Unavailable,
        }
    }
}

/// The settings that shape answers.
#[derive(Debug, Clone)]
pub struct AnswerSettings {
    pub response_headers: Option<HeaderNames>,
    pub global_shadow_mode: bool,
    pub request_limits: RequestLimits,
}

/// A cheap `Clone` handle: the live config, the engine, and how to answer.
#[derive(Clone)]
pub struct RateLimiter {
    config: Arc<ArcSwap<Config>>,
    engine: Engine,
    answer: Arc<AnswerSettings>,
    metrics: Arc<Metrics>,
}

/// One limit that applies to one descriptor of the request.
struct Applied<'c> {
    descriptor: usize,
    limit: LimitRef<'c>,
    role: Role,
}

enum LimitRef<'c> {
    Config(&'c RateLimit),
    /// Envoy's per-descriptor `limit` override.
    Override {
        requests_per_unit: u32,
        unit: Unit,
    },
}

impl LimitRef<'_> {
    fn requests_per_unit(&self) -> u32 {
        match self {
            LimitRef::Config(l) => l.requests_per_unit,
            LimitRef::Override {
                requests_per_unit, ..
            } => *requests_per_unit,
        }
    }
    fn unit(&self) -> Unit {
        match self {
            LimitRef::Config(l) => l.unit,
            LimitRef::Override { unit, .. } => *unit,
        }
    }
    fn name(&self) -> &str {
        match self {
            LimitRef::Config(l) => l.name.as_deref().unwrap_or(""),
            LimitRef::Override { .. } => "",
        }
    }
}

impl RateLimiter {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        engine: Engine,
        answer: AnswerSettings,
        metrics: Arc<Metrics>,
    ) -> RateLimiter {
        RateLimiter {
            config,
            engine,
            answer: Arc::new(answer),
            metrics,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn config(&self) -> &Arc<ArcSwap<Config>> {
        &self.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Decides a request as envoyproxy/ratelimit would, plus turnstile's algorithms and queues.
    pub async fn decide(&self, req: RateLimitRequest) -> Result<RateLimitResponse, RlsError> {
        validate(&req, &self.answer.request_limits)?;
        let config = self.config.load_full();
        let n = req.descriptors.len();
        let mut statuses: Vec<DescriptorStatus> = vec![
            DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
            n
        ];
        let Some(domain) = config.domain(&req.domain) else {
            // An unknown domain limits nothing; it is not an error.
            return Ok(RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses,
                ..Default::default()
            });
        };

        // Match every descriptor first: `replaces` needs all matches before anything is counted.
        let mut matches: SmallVec<[Option<Matched<'_>>; 4]> = SmallVec::with_capacity(n);
        let mut applied: SmallVec<[Applied<'_>; 4]> = SmallVec::new();
        let mut metadata: Option<serde_json::Map<String, serde_json::Value>> = None;
        for (i, d) in req.descriptors.iter().enumerate() {
            let m = descriptor::find(domain, &d.entries);
            if let Some(limit) = &d.limit {
                let unit = Unit::from_envoy_override(limit.unit).ok_or_else(|| {
                    RlsError::InvalidArgument(format!(
                        "descriptors[{i}].limit.unit {} is not a known unit",
                        limit.unit
                    ))
                })?;
                applied.push(Applied {
                    descriptor: i,
                    limit: LimitRef::Override {
                        requests_per_unit: limit.requests_per_unit,
                        unit,
                    },
                    role: Role::Binding,
                });
            } else if let Some(m) = &m {
                let node = m.node();
                let role = if node.shadow_mode {
                    Role::Shadow
                } else if node.quota_mode {
                    Role::Quota
                } else {
                    Role::Binding
                };
                for l in &node.limits {
                    applied.push(Applied {
                        descriptor: i,
                        limit: LimitRef::Config(l),
                        role,
                    });
                }
                if let Some(md) = &node.metadata {
                    metadata
                        .get_or_insert_with(Default::default)
                        .extend(md.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
            matches.push(m);
        }
        let replaced: SmallVec<[&str; 4]> = applied
            .iter()
            .filter_map(|a| match a.limit {
                LimitRef::Config(l) => Some(l.replaces.iter().map(String::as_str)),
                LimitRef::Override { .. } => None,
            })
            .flatten()
            .collect();
        if !replaced.is_empty() {
            applied.retain(|a| match a.limit {
                LimitRef::Config(l) => !l.name.as_deref().is_some_and(|n| replaced.contains(&n)),
                LimitRef::Override { .. } => true,
            });
        }

        // Ops for every counted limit; unlimited ones are answered here.
        let mut ops: Vec<Op> = Vec::with_capacity(applied.len());
        let mut op_of: SmallVec<[usize; 4]> = SmallVec::with_capacity(applied.len());
        for (ai, a) in applied.iter().enumerate() {
            let d = &req.descriptors[a.descriptor];
            if let LimitRef::Config(l) = a.limit {
                if l.unlimited {
                    statuses[a.descriptor].limit_remaining = u32::MAX;
                    continue;
                }
            }
            let (hits, refund) = hits_of(&req, d);
            let index = match a.limit {
                LimitRef::Config(l) => matches[a.descriptor]
                    .as_ref()
                    .and_then(|m| m.node().limits.iter().position(|x| std::ptr::eq(x, l)))
                    .unwrap_or(0),
                LimitRef::Override { .. } => 0,
            };
            let key = descriptor::counter_key(
                &req.domain,
                &d.entries,
                matches[a.descriptor].as_ref(),
                index,
            );
            let (algorithm, queue) = match a.limit {
                LimitRef::Config(l) => (l.algorithm, l.queue),
                LimitRef::Override { .. } => (Algorithm::FixedWindow, None),
            };
            ops.push(Op {
                hash: descriptor::key_hash(&key),
                key,
                params: Params {
                    requests_per_unit: a.limit.requests_per_unit(),
                    window_ms: a.limit.unit().seconds() * 1000,
                    algorithm,
                },
                hits,
                refund,
                role: a.role,
                queue,
                grant: None,
            });
            op_of.push(ai);
        }

        let decision = self
            .engine
            .decide(ops, self.answer.global_shadow_mode)
            .await?;

        // Per descriptor, report the limit closest to exhaustion (an over-limit one first).
        let mut best: SmallVec<[Option<(usize, Outcome)>; 4]> = SmallVec::from_elem(None, n);
        for (k, out) in decision.outcomes.iter().enumerate() {
            let a = &applied[op_of[k]];
            let slot = &mut best[a.descriptor];
            let better = match slot {
                None => true,
                Some((_, cur)) => {
                    (out.over && !cur.over)
                        || (out.over == cur.over && out.remaining < cur.remaining)
                }
            };
            if better {
                *slot = Some((op_of[k], *out));
            }
        }
        for (i, b) in best.iter().enumerate() {
            let Some((ai, out)) = b else { continue };
            let a = &applied[*ai];
            let over = out.over || out.blocked;
            let status = &mut statuses[i];
            status.code = if over && a.role != Role::Shadow {
                Code::OverLimit as i32
            } else {
                Code::Ok as i32
            };
            status.current_limit = Some(PbRateLimit {
                name: a.limit.name().to_owned(),
                requests_per_unit: a.limit.requests_per_unit(),
                unit: a.limit.unit().proto(),
            });
            status.limit_remaining = if over { 0 } else { out.remaining };
            status.duration_until_reset = Some(PbDuration {
                seconds: out.reset_ns.div_ceil(1_000_000_000) as i64,
                nanos: 0,
            });
            let hits = hits_of(&req, &req.descriptors[i]).0;
            let (counted_over, shadow) = (
                over && a.role != Role::Shadow,
                a.role == Role::Shadow && over,
            );
            // detailed_metric names every value in the stat; value_to_metric the values of the
            // levels that ask for it. Those series live in a capped map of their own.
            let values = matches[i].as_ref().map_or(0u64, |m| {
                if m.node().detailed_metric {
                    u64::MAX
                } else {
                    m.path
                        .iter()
                        .enumerate()
                        .filter(|(j, n)| n.value_to_metric && *j < 64)
                        .fold(0, |acc, (j, _)| acc | (1 << j))
                }
            });
            let limit = a.limit.requests_per_unit();
            if values == 0 {
                let node = matches[i].as_ref().map(|m| m.node());
                self.metrics
                    .record(node, hits, counted_over, shadow, out.remaining, limit);
            } else {
                self.metrics
                    .record(None, hits, counted_over, shadow, out.remaining, limit);
                self.metrics.record_detailed(
                    &req.domain,
                    &req.descriptors[i].entries,
                    values,
                    hits,
                    counted_over,
                    shadow,
                    out.remaining,
                    limit,
                );
            }
        }

        let overall = overall_code(&statuses, &applied, self.answer.global_shadow_mode);
        let mut response = RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..Default::default()
        };
        if let Some(names) = &self.answer.response_headers {
            add_limit_headers(&mut response, names);
        }
        if decision.waited_ns > 0 && !decision.timed_out {
            response.response_headers_to_add.push(HeaderValue {
                key: WAITED_HEADER.to_owned(),
                value: (decision.waited_ns / 1_000_000).to_string(),
                ..Default::default()
            });
        }
        if let Some(md) = metadata {
            response.dynamic_metadata = Some(to_struct(md));
        }
        Ok(response)
    }
}

/// Hits for one descriptor: its own `hits_addend` wins when set (0 = check without consuming);
/// otherwise the request's, where 0 means 1.
fn hits_of(req: &RateLimitRequest, d: &RateLimitDescriptor) -> (u64, bool) {
    let hits = match &d.hits_addend {
        Some(h) => h.value,
        None => u64::from(req.hits_addend.max(1)),
    };
    (hits, d.is_negative_hits)
}

fn overall_code(
    statuses: &[DescriptorStatus],
    applied: &[Applied<'_>],
    global_shadow: bool,
) -> Code {
    if global_shadow {
        return Code::Ok;
    }
    let is_quota = |i: usize| {
        applied
            .iter()
            .any(|a| a.descriptor == i && a.role == Role::Quota)
    };
    let over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
    let mut quota_seen = false;
    let mut quota_all_over = true;
    for (i, s) in statuses.iter().enumerate() {
        if is_quota(i) {
            quota_seen = true;
            quota_all_over &= over(s);
        } else if over(s) {
            return Code::OverLimit;
        }
    }
    if quota_seen && quota_all_over {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// RateLimit-Limit / -Remaining / -Reset from the descriptor with the least remaining (an
/// over-limit one always wins), as envoyproxy/ratelimit does.
fn add_limit_headers(resp: &mut RateLimitResponse, names: &HeaderNames) {
    let pick = resp
        .statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| (s.code != Code::OverLimit as i32, s.limit_remaining));
    let Some(s) = pick else { return };
    let limit = s
        .current_limit
        .as_ref()
        .expect("filtered")
        .requests_per_unit;
    let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    let remaining = s.limit_remaining;
    for (key, value) in [
        (&names.limit, limit.to_string()),
        (&names.remaining, remaining.to_string()),
        (&names.reset, reset.to_string()),
    ] {
        resp.response_headers_to_add.push(HeaderValue {
            key: key.clone(),
            value,
            ..Default::default()
        });
    }
}

/// Bad input gets INVALID_ARGUMENT naming what is wrong.
pub fn validate(req: &RateLimitRequest, limits: &RequestLimits) -> Result<(), RlsError> {
    let bad = |m: String| Err(RlsError::InvalidArgument(m));
    if req.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return bad("descriptors must not be empty".into());
    }
    if req.descriptors.len() > limits.max_descriptors {
        return bad(format!(
            "too many descriptors: {} (limit {})",
            req.descriptors.len(),
            limits.max_descriptors
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return bad(format!("descriptors[{i}] has no entries"));
        }
        if d.entries.len() > limits.max_entries {
            return bad(format!(
                "descriptors[{i}] has too many entries: {} (limit {})",
                d.entries.len(),
                limits.max_entries
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
            if e.key.len() > limits.max_key_len {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key is {} bytes (limit {})",
                    e.key.len(),
                    limits.max_key_len
                ));
            }
            if e.value.len() > limits.max_value_len {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].value is {} bytes (limit {})",
                    e.value.len(),
                    limits.max_value_len
                ));
            }
        }
    }
    Ok(())
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
