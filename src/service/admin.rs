//! Acting on a limit (the admin listener): looking up what a request's descriptors have used of
//! each limit that applies, counting nothing, and resetting their counters. Both are planned as
//! a request is (`plan`), so they act on exactly the counter keys decisions count in.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::plan::{self, Applied, LimitRef, Plan};
use super::{validate, AnswerSettings, EnvoyService, Live, Request};
use crate::config::{Algorithm, Unit};
use crate::limiter::{CountedHolds, EngineError, LookedUp, Op, Reservation, Role};
use crate::telemetry::digest;

/// Why an admin action was not done; the message names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// The request is malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// The domain, a descriptor's limit or the named limit is not in the loaded config (404).
    #[error("{0}")]
    NotFound(String),
    /// The engine or the store could not act (503).
    #[error("{0}")]
    Unavailable(String),
}

/// A limit that applies to one descriptor of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applies {
    /// The descriptor's place in the request.
    pub descriptor: usize,
    /// The limit's `name` ("" when it has none).
    pub name: String,
    /// Its node's stat key, as `/rlconfig` and the metrics name it ("" for Envoy's `limit`
    /// override, which has no node).
    pub stat_key: String,
    /// The counter key it counts in ("" for an unlimited one).
    pub key: String,
    pub unit: Unit,
    /// Windows of this many units.
    pub unit_multiplier: u32,
    /// The time zone whose calendar the windows follow, if they follow one.
    pub calendar: Option<String>,
    pub requests_per_unit: u32,
    pub algorithm: Algorithm,
    pub role: Role,
    pub unlimited: bool,
    /// The hits each check holds (`reserve`), if the limit takes reservations.
    pub reserve: Option<u32>,
    /// The fields an xDS overlay wrote into the pushed limit, and its file.
    pub overlay: Option<String>,
}

/// What a look-up found of one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Hits counted against the limit now (see `limiter::State::used`).
    pub used: u64,
    /// Hits held by checks whose requests have not reported yet (`reserve`).
    pub held: u64,
    /// What a request of one hit would be told is left after a check (0 when over).
    pub remaining: u32,
    /// Until the window ends (fixed, sliding) or the bucket is full again (token bucket).
    pub resets_in_ns: u64,
    /// The engine's time of the look-up (ns since the epoch).
    pub now: u64,
    /// Requests waiting in this replica's queue of the key.
    pub waiting: usize,
}

/// One limit: what applies, and (unless it is unlimited) its usage or its reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acted<T> {
    pub limit: Applies,
    pub done: Option<T>,
}

/// A limit that applies, and its planned op, if it counts.
struct PlannedOp {
    limit: Applies,
    op: Option<Op>,
}

impl EnvoyService {
    /// Every limit that applies to the request's descriptors, with what each has used. Counts
    /// nothing anywhere: a decision after a look-up is the decision without it.
    pub async fn look_up(&self, req: &RateLimitRequest) -> Result<Vec<Acted<Usage>>, AdminError> {
        let req = &Request::of(req);
        let live = self.live();
        let mut out = Vec::new();
        for PlannedOp { limit, op } in targets(&live, req, &self.answer, None)? {
            let done = match op {
                None => None,
                Some(op) => {
                    let found = self.engine.look_up(op.clone()).await;
                    Some(usage(&op, found.map_err(unavailable)?))
                }
            };
            out.push(Acted { limit, done });
        }
        Ok(out)
    }

    /// Counts the request's descriptors from zero on every limit that applies (only the one
    /// named `only`, when given), in this replica and in the store; logs each reset. Answers,
    /// per limit, how many store keys were deleted (`None` in memory).
    pub async fn reset(
        &self,
        req: &RateLimitRequest,
        only: Option<&str>,
    ) -> Result<Vec<Acted<Option<u64>>>, AdminError> {
        let req = &Request::of(req);
        let live = self.live();
        let targets = targets(&live, req, &self.answer, only)?;
        let mut out = Vec::with_capacity(targets.len());
        for PlannedOp { limit, op } in targets {
            let Some(op) = op else {
                out.push(Acted { limit, done: None });
                continue;
            };
            let deleted = self.engine.reset(op).await.map_err(|e| {
                let before = out.iter().filter(|a| a.done.is_some()).count();
                AdminError::Unavailable(format!(
                    "{} (limits reset before it: {before})",
                    unavailable(e)
                ))
            })?;
            // Values as digests at info; in clear at debug only. A limit is named as
            // `refused_by` names it: its `name`, else its stat key.
            let named = [&limit.name, &limit.stat_key]
                .into_iter()
                .find(|n| !n.is_empty());
            let descriptor = entries(req, limit.descriptor, &|v| digest(v));
            let named = named.map_or("override", String::as_str);
            match deleted {
                Some(n) => tracing::info!(
                    domain = %req.domain, %descriptor, limit = %named, store_keys_deleted = n,
                    "limit reset"
                ),
                // No store: nothing was deleted anywhere but here.
                None => tracing::info!(
                    domain = %req.domain, %descriptor, limit = %named, "limit reset"
                ),
            }
            tracing::debug!(
                descriptor = %entries(req, limit.descriptor, &|v| v.to_owned()),
                key = %limit.key,
                "limit reset: in clear"
            );
            out.push(Acted {
                limit,
                done: Some(deleted),
            });
        }
        Ok(out)
    }
}

fn usage(op: &Op, found: LookedUp) -> Usage {
    let (p, now) = (&op.params, found.now);
    let check = found.state.eval(p, now, 0);
    let held = match op.reserve {
        Reservation::Counted(CountedHolds::Hold { hits, .. }) => {
            found.held.saturating_mul(u64::from(hits))
        }
        _ => 0,
    };
    Usage {
        used: found.state.used(p, now),
        held,
        remaining: check
            .remaining
            .saturating_sub(u32::try_from(held).unwrap_or(u32::MAX)),
        resets_in_ns: check.reset_ns,
        now,
        waiting: found.waiting,
    }
}

fn unavailable(e: EngineError) -> AdminError {
    AdminError::Unavailable(match e {
        EngineError::Store(m) => format!("the store could not be reached: {m}"),
        e => e.to_string(),
    })
}

/// A descriptor's entries as `key=value, key=value`, each value through `show`, for messages
/// and logs.
fn entries(req: &Request<'_>, i: usize, show: &dyn Fn(&str) -> String) -> String {
    let parts: Vec<String> = req.descriptors[i]
        .entries
        .iter()
        .map(|e| format!("{}={}", e.key, show(e.value)))
        .collect();
    parts.join(", ")
}

/// What the look-up says of one limit that applies, `a`, and the op it decides with.
fn target(plan: &Plan<'_>, a: &Applied<'_>, mut op: Option<Op>) -> PlannedOp {
    let (algorithm, unlimited, unit_multiplier, reserve) = match a.limit {
        LimitRef::Config(l) => (l.algorithm, l.unlimited, l.unit_multiplier, l.reserve),
        LimitRef::Override { .. } => (Algorithm::FixedWindow, false, 1, None),
    };
    let overlay = match a.limit {
        LimitRef::Config(l) => l.overlay.as_deref().map(str::to_owned),
        LimitRef::Override { .. } => None,
    };
    // A look-up reads the holds of a limit with `reserve` beside its count.
    if let (Some(op), Some(r)) = (op.as_mut(), reserve) {
        op.reserve = Reservation::Counted(CountedHolds::Hold {
            hits: r.hits,
            for_ms: 0,
            id: 0,
        });
    }
    let stat_key = match a.limit {
        LimitRef::Config(_) => (plan.matches[a.descriptor].as_ref())
            .map_or_else(String::new, |m| m.node().stat_key.to_string()),
        LimitRef::Override { .. } => String::new(),
    };
    let applies = Applies {
        descriptor: a.descriptor,
        name: a.limit.name().to_owned(),
        stat_key,
        key: op
            .as_ref()
            .map_or_else(String::new, |o| o.key.as_str().to_owned()),
        unit: a.limit.unit(),
        unit_multiplier,
        calendar: a.limit.calendar().map(|c| c.zone().to_owned()),
        requests_per_unit: a.limit.requests_per_unit(),
        algorithm,
        role: a.role,
        unlimited,
        reserve: reserve.map(|r| r.hits),
        overlay,
    };
    PlannedOp { limit: applies, op }
}

/// The limits that apply, each with its op, as a request with these descriptors plans them;
/// only the one named `only`, when given. Every descriptor must match a limit.
fn targets(
    live: &Live,
    req: &Request<'_>,
    answer: &AnswerSettings,
    only: Option<&str>,
) -> Result<Vec<PlannedOp>, AdminError> {
    validate(req, &answer.request_limits).map_err(|e| AdminError::BadRequest(e.to_string()))?;
    takes_no_hits(req)?;
    let Some(domain) = live.config.domain(req.domain) else {
        let mut known: Vec<&str> = live.config.domains.keys().map(String::as_str).collect();
        known.sort_unstable();
        return Err(AdminError::NotFound(format!(
            "no domain {:?} in the loaded config (domains: {})",
            req.domain,
            known.join(", ")
        )));
    };
    let mut plan = Plan::default();
    let ops = plan::plan(&mut plan, domain, req, answer)
        .map_err(|e| AdminError::BadRequest(e.to_string()))?;
    let mut ops: Vec<Option<Op>> = ops.into_iter().map(Some).collect();
    let mut out: Vec<PlannedOp> = Vec::with_capacity(plan.applied.len());
    for (ai, a) in plan.applied.iter().enumerate() {
        let op = (plan.op_of.iter().position(|&o| o == ai)).and_then(|j| ops[j].take());
        out.push(target(&plan, a, op));
    }
    if let Some(i) =
        (0..req.descriptors.len()).find(|i| out.iter().all(|p| p.limit.descriptor != *i))
    {
        return Err(AdminError::NotFound(format!(
            "descriptors[{i}] ({}) matches no limit in domain {:?} (see /rlconfig)",
            entries(req, i, &|v| v.to_owned()),
            req.domain
        )));
    }
    if let Some(name) = only {
        let names: Vec<String> = (out.iter())
            .filter(|p| !p.limit.name.is_empty())
            .map(|p| format!("{:?}", p.limit.name))
            .collect();
        let unnamed = out.len() - names.len();
        out.retain(|p| !p.limit.name.is_empty() && p.limit.name == name);
        if out.is_empty() {
            return Err(AdminError::NotFound(no_such_limit(name, &names, unnamed)));
        }
    }
    Ok(out)
}

/// Why `?limit=<name>` matched none of the limits that apply: the names they have, and how
/// many have none (a limit without `name:` is acted on with the others, without `?limit=`).
fn no_such_limit(name: &str, names: &[String], unnamed: usize) -> String {
    let why = if names.is_empty() {
        let these = if unnamed == 1 {
            "the limit that applies has".to_owned()
        } else {
            format!("the {unnamed} limits that apply have")
        };
        format!(
            "{these} no name: leave ?limit= out to act on every limit that applies, or give \
             one a name: in the config"
        )
    } else {
        let mut why = format!("the limits that apply: {}", names.join(", "));
        match unnamed {
            0 => {}
            1 => why.push_str(", and 1 without a name"),
            n => why.push_str(&format!(", and {n} without a name")),
        }
        why
    };
    format!("no limit named {name:?} applies to these descriptors ({why})")
}

/// A look-up and a reset count nothing: hits in the request would be ignored, so they are
/// refused rather than silently dropped.
fn takes_no_hits(req: &Request<'_>) -> Result<(), AdminError> {
    let refuse = |what: String| {
        Err(AdminError::BadRequest(format!(
            "{what}: a look-up or a reset takes no hits"
        )))
    };
    if req.hits_addend != 0 {
        return refuse("hits_addend".into());
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.hits_addend.is_some() {
            return refuse(format!("descriptors[{i}].hits_addend"));
        }
        if d.is_negative_hits {
            return refuse(format!("descriptors[{i}].is_negative_hits"));
        }
    }
    Ok(())
}
