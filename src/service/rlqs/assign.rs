//! A share as Envoy 1.40's `rate_limit_quota` filter enforces it: the `BucketAction` protos.
//!
//! What the filter really does (checked by running it) shapes every field: only `token_bucket`
//! and blanket rules are enforced (`requests_per_time_unit` is not); the fill interval must be
//! whole seconds (below 1 s it admits everything) and stays the same for a limit, since a change
//! of the interval alone is ignored, so a rate is told by `tokens_per_fill` and `max_tokens`;
//! `tokens_per_fill` is always set (unset, it never refills); the time to live is whole seconds
//! (fractions are dropped, unset expires at once) and several report intervals long.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use super::bucket::{BucketKey, LimitSpec};

/// How long an assignment holds in Envoy: six of its 5 s report intervals.
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(30);

/// An assignment is sent again this long after it was last sent, well before it expires.
pub const REFRESH_AFTER: Duration = Duration::from_secs(15);

/// What one bucket of one Envoy may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// `per_fill` tokens every `fill_secs`, at most `max` held.
    Tokens {
        max: u32,
        per_fill: u32,
        fill_secs: u64,
    },
    AllowAll,
    DenyAll,
}

impl Assignment {
    /// A share of `spec`, in tokens per unit: refilled once a unit, holding one fill (fixed
    /// windows) or the share's part of the burst, never less than one fill (token buckets).
    /// A share of nothing denies everything: a token bucket must hold at least one token.
    pub fn of_share(spec: &LimitSpec, share: u32) -> Assignment {
        if share == 0 {
            return Assignment::DenyAll;
        }
        let max = match spec.burst {
            None => share,
            Some(burst) => {
                let part = u64::from(share) * u64::from(burst);
                let part = part.div_ceil(u64::from(spec.requests_per_unit.max(1)));
                share.max(u32::try_from(part).unwrap_or(u32::MAX))
            }
        };
        Assignment::Tokens {
            max,
            per_fill: share,
            fill_secs: spec.unit_secs.max(1),
        }
    }

    /// The tokens this assignment adds per fill (0 for blanket rules), for metrics.
    pub fn per_fill(&self) -> u32 {
        match self {
            Assignment::Tokens { per_fill, .. } => *per_fill,
            _ => 0,
        }
    }
}

fn bucket_id(key: &BucketKey) -> BucketId {
    BucketId {
        bucket: key.iter().cloned().collect::<HashMap<_, _>>(),
    }
}

fn seconds(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// The quota assignment action for `key`.
pub fn action(key: &BucketKey, a: Assignment) -> BucketAction {
    let strategy = match a {
        Assignment::Tokens {
            max,
            per_fill,
            fill_secs,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens: max,
            tokens_per_fill: Some(UInt32Value { value: per_fill }),
            fill_interval: Some(seconds(Duration::from_secs(fill_secs))),
        }),
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
    };
    BucketAction {
        bucket_id: Some(bucket_id(key)),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: Some(seconds(ASSIGNMENT_TTL)),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    }
}

/// Tells Envoy to forget `key` (its limit is gone); it subscribes again on its next request.
pub fn abandon(key: &BucketKey) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(key)),
        bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rpu: u32, unit_secs: u64, burst: Option<u32>) -> LimitSpec {
        LimitSpec {
            requests_per_unit: rpu,
            unit_secs,
            burst,
        }
    }

    #[test]
    fn a_share_is_tokens_per_unit_with_whole_second_fills() {
        assert_eq!(
            Assignment::of_share(&spec(20, 1, None), 15),
            Assignment::Tokens {
                max: 15,
                per_fill: 15,
                fill_secs: 1
            }
        );
        assert_eq!(
            Assignment::of_share(&spec(10, 60, Some(40)), 5),
            Assignment::Tokens {
                max: 20,
                per_fill: 5,
                fill_secs: 60
            },
            "the share's part of the burst"
        );
        assert_eq!(
            Assignment::of_share(&spec(10, 1, Some(2)), 5),
            Assignment::Tokens {
                max: 5,
                per_fill: 5,
                fill_secs: 1
            },
            "never less than one fill, or the rate would be lost"
        );
        assert_eq!(
            Assignment::of_share(&spec(10, 1, None), 0),
            Assignment::DenyAll
        );
    }

    #[test]
    fn every_field_envoy_140_needs_is_set() {
        let key = vec![("user".to_string(), "a".to_string())];
        let a = action(&key, Assignment::of_share(&spec(7, 1, None), 7));
        let Some(bucket_action::BucketAction::QuotaAssignmentAction(q)) = a.bucket_action else {
            panic!("an assignment");
        };
        assert_eq!(q.assignment_time_to_live.unwrap().seconds, 30);
        let Some(Strategy::TokenBucket(tb)) = q.rate_limit_strategy.unwrap().strategy else {
            panic!("a token bucket");
        };
        assert_eq!(tb.tokens_per_fill.unwrap().value, 7);
        assert_eq!(tb.fill_interval.unwrap().seconds, 1);
        assert_eq!(a.bucket_id.unwrap().bucket["user"], "a");
    }
}
