//! A request's plan: every descriptor matched against the limit tree, `replaces` applied, and
//! an op for every limit that counts (unlimited ones are answered without one).

use smallvec::SmallVec;

use super::error::RlsError;
use super::request::{Descriptor, Request};
use super::settings::{AnswerSettings, CountingRule};
use crate::config::{Algorithm, Calendar, Domain, RateLimit, Reserve, Unit};
use crate::descriptor::{self, Matched};
use crate::limiter::key::Key;
use crate::limiter::{CountedHolds, Counting, JointGroup, Op, Params, Reservation, Role};

/// One limit that applies to one descriptor of the request.
pub(super) struct Applied<'c> {
    pub(super) descriptor: usize,
    pub(super) limit: LimitRef<'c>,
    pub(super) role: Role,
}

pub(super) enum LimitRef<'c> {
    Config(&'c RateLimit),
    /// Envoy's per-descriptor `limit` override.
    Override {
        requests_per_unit: u32,
        unit: Unit,
    },
}

impl LimitRef<'_> {
    pub(super) fn requests_per_unit(&self) -> u32 {
        match self {
            LimitRef::Config(l) => l.requests_per_unit,
            LimitRef::Override {
                requests_per_unit, ..
            } => *requests_per_unit,
        }
    }

    pub(super) fn unit(&self) -> Unit {
        match self {
            LimitRef::Config(l) => l.unit,
            LimitRef::Override { unit, .. } => *unit,
        }
    }

    /// The window's length (a token bucket's period) in ms: an override's is its unit's.
    pub(super) fn window_ms(&self) -> u64 {
        match self {
            LimitRef::Config(l) => l.window_secs() * 1000,
            LimitRef::Override { unit, .. } => unit.seconds() * 1000,
        }
    }

    pub(super) fn calendar(&self) -> Option<Calendar> {
        match self {
            LimitRef::Config(l) => l.calendar,
            LimitRef::Override { .. } => None,
        }
    }

    pub(super) fn name(&self) -> &str {
        match self {
            LimitRef::Config(l) => l.name.as_deref().unwrap_or(""),
            LimitRef::Override { .. } => "",
        }
    }
}

/// What the request asks of the engine, and how to read its answer. Filled in place and read by
/// reference: it is a few hundred bytes, held across the engine's await, and copies of it showed
/// up in profiles of `service_decide`.
#[derive(Default)]
pub(super) struct Plan<'c> {
    /// Per descriptor: the node it matched, if any.
    pub(super) matches: SmallVec<[Option<Matched<'c>>; 4]>,
    pub(super) applied: SmallVec<[Applied<'c>; 4]>,
    /// Per op: the applied limit it decides.
    pub(super) op_of: SmallVec<[usize; 4]>,
    /// Descriptors answered with unlimited.
    pub(super) unlimited: SmallVec<[usize; 2]>,
    /// Per descriptor: what its ops count and the answer reports, worked out once.
    pub(super) carried: SmallVec<[Carried; 4]>,
}

/// What one descriptor counts, as the ops and the answer both read it.
pub(super) struct Carried {
    pub(super) hits: u64,
    /// `is_negative_hits`: the hits are refunded.
    pub(super) refund: bool,
    pub(super) counting: Counting,
    /// The reference's series name when it is not the node's own: per-value series
    /// (`detailed_metric`, `value_to_metric`), or the request's entries for an override.
    pub(super) stat_path: Option<String>,
}

/// Matches every descriptor first (`replaces` needs all matches before anything is counted),
/// then builds the ops; `plan` is filled in place.
pub(super) fn plan<'c>(
    plan: &mut Plan<'c>,
    domain: &'c Domain,
    req: &Request<'_>,
    settings: &AnswerSettings,
) -> Result<Vec<Op>, RlsError> {
    plan.matches.reserve(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        let m = descriptor::find(domain, &d.entries);
        plan.apply(i, d, m.as_ref(), settings.global_quota_mode)?;
        let (hits, refund) = hits_of(req, d);
        let stat_path = match (&d.limit, &m) {
            (Some(_), _) => Some(descriptor::override_stat_path(&d.entries)),
            (None, Some(m)) => descriptor::stat_path(&d.entries, m),
            (None, None) => None,
        };
        plan.carried.push(Carried {
            hits,
            refund,
            counting: counting_of(settings.counting_rule, d),
            stat_path,
        });
        plan.matches.push(m);
    }
    plan.drop_replaced();
    Ok(plan.ops(req))
}

impl<'c> Plan<'c> {
    /// The limits that apply to descriptor `i`: Envoy's override, or its node's limits. Under
    /// `QUOTA_MODE` every limit is joint, overrides included (as in the reference).
    fn apply(
        &mut self,
        i: usize,
        d: &Descriptor<'_>,
        m: Option<&Matched<'c>>,
        all_joint: bool,
    ) -> Result<(), RlsError> {
        // A descriptor's limits are one joint group: it is over when one of them is.
        let group = i as JointGroup;
        let joint_or = |role| {
            if all_joint {
                Role::Joint(group)
            } else {
                role
            }
        };
        if let Some(limit) = d.limit {
            let unit = Unit::from_envoy_override(limit.unit).ok_or_else(|| {
                RlsError::InvalidArgument(format!(
                    "descriptors[{i}].limit.unit {} is not a known unit",
                    limit.unit
                ))
            })?;
            self.applied.push(Applied {
                descriptor: i,
                limit: LimitRef::Override {
                    requests_per_unit: limit.requests_per_unit,
                    unit,
                },
                role: joint_or(Role::Binding),
            });
            return Ok(());
        }
        let Some(m) = m else { return Ok(()) };
        let node = m.node();
        let role = if node.shadow_mode {
            Role::Shadow
        } else if node.quota_mode {
            Role::Joint(group)
        } else {
            joint_or(Role::Binding)
        };
        for l in node.limits.iter() {
            self.applied.push(Applied {
                descriptor: i,
                limit: LimitRef::Config(l),
                role,
            });
        }
        Ok(())
    }

    /// Leaves out the limits that another applied limit `replaces`.
    fn drop_replaced(&mut self) {
        let replaced: SmallVec<[&str; 4]> = self
            .applied
            .iter()
            .filter_map(|a| match a.limit {
                LimitRef::Config(l) => Some(l.replaces.iter().map(String::as_str)),
                LimitRef::Override { .. } => None,
            })
            .flatten()
            .collect();
        if !replaced.is_empty() {
            self.applied.retain(|a| match a.limit {
                LimitRef::Config(l) => !l.name.as_deref().is_some_and(|n| replaced.contains(&n)),
                LimitRef::Override { .. } => true,
            });
        }
    }

    /// The place of `a`'s limit among its node's limits, which names its counter key.
    pub(super) fn limit_index(&self, a: &Applied<'_>) -> usize {
        match a.limit {
            LimitRef::Config(l) => self.matches[a.descriptor]
                .as_ref()
                .and_then(|m| m.node().limits.iter().position(|x| std::ptr::eq(x, l)))
                .unwrap_or(0),
            LimitRef::Override { .. } => 0,
        }
    }

    /// An op for every counted limit.
    fn ops(&mut self, req: &Request<'_>) -> Vec<Op> {
        let mut ops: Vec<Op> = Vec::with_capacity(self.applied.len());
        // One key (most requests) is hashed as it is made; several, side by side at the end.
        let one = self.applied.len() == 1;
        let mut keys: SmallVec<[String; 4]> = SmallVec::new();
        for (ai, a) in self.applied.iter().enumerate() {
            let d = &req.descriptors[a.descriptor];
            if let LimitRef::Config(l) = a.limit {
                if l.unlimited {
                    self.unlimited.push(a.descriptor);
                    continue;
                }
            }
            let Carried {
                hits,
                refund,
                counting,
                ..
            } = self.carried[a.descriptor];
            let matched = self.matches[a.descriptor].as_ref();
            let index = self.limit_index(a);
            let text = descriptor::counter_key(req.domain, &d.entries, matched, index);
            let key = if one {
                Key::new(text)
            } else {
                keys.push(text);
                Key::default()
            };
            let (algorithm, queue, local_first, reserve) = match a.limit {
                // Holds are worth what every replica sees: a limit with them is decided exactly.
                LimitRef::Config(l) if l.reserve.is_some() => {
                    (l.algorithm, l.queue, Some(false), l.reserve)
                }
                LimitRef::Config(l) => (l.algorithm, l.queue, l.local_first, l.reserve),
                LimitRef::Override { .. } => (Algorithm::FixedWindow, None, None, None),
            };
            ops.push(Op {
                key,
                params: Params {
                    requests_per_unit: a.limit.requests_per_unit(),
                    window_ms: a.limit.window_ms(),
                    algorithm,
                    calendar: a.limit.calendar(),
                    tat: crate::limiter::Tat::Full,
                },
                hits,
                refund,
                counting,
                role: a.role,
                queue,
                grant: None,
                local_first,
                reserve: reservation(reserve, d.hits_addend, refund, counting),
            });
            self.op_of.push(ai);
        }
        if !one {
            for (op, key) in ops.iter_mut().zip(Key::hash_all(keys)) {
                op.key = key;
            }
        }
        ops
    }
}

/// Which of descriptor `d`'s hits count when its request is refused: usage reported after the
/// fact (its own `hits_addend`, which Envoy sets for a rate limit with `hits_addend`, its
/// `apply_on_stream_done` reports included) counts in full, other hits only when admitted,
/// unless `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` says otherwise.
fn counting_of(rule: CountingRule, d: &Descriptor<'_>) -> Counting {
    match rule {
        CountingRule::UsageInFull if d.hits_addend.is_some() => Counting::Usage,
        CountingRule::UsageInFull | CountingRule::IfAdmitted => Counting::IfAdmitted,
        CountingRule::Always => Counting::Always,
    }
}

/// What an op of a limit with `reserve` does: a check (the descriptor's own `hits_addend` is
/// 0) holds, a report (above 0, counted whatever the verdict) releases; a call without a
/// `hits_addend` of its own, or giving hits back, does neither.
fn reservation(
    reserve: Option<Reserve>,
    own: Option<u64>,
    refund: bool,
    counting: Counting,
) -> Reservation {
    match (reserve, own) {
        (Some(r), Some(0)) if !refund => Reservation::Counted(CountedHolds::Hold {
            hits: r.hits,
            for_ms: u32::try_from(r.hold.as_millis()).unwrap_or(u32::MAX),
            id: crate::limiter::hold_id(),
        }),
        (Some(r), Some(_)) if !refund && counting != Counting::IfAdmitted => {
            Reservation::Counted(CountedHolds::Release { hits: r.hits })
        }
        _ => Reservation::None,
    }
}

/// Hits for one descriptor: its own `hits_addend` wins when set (0 = check without consuming);
/// otherwise the request's, where 0 means 1.
fn hits_of(req: &Request<'_>, d: &Descriptor<'_>) -> (u64, bool) {
    let hits = match d.hits_addend {
        Some(h) => h,
        None => u64::from(req.hits_addend.max(1)),
    };
    (hits, d.is_negative_hits)
}

#[cfg(test)]
mod tests;
