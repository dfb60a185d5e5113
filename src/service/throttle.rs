//! ThrottleCrab's `THROTTLE` decision for applications not behind Envoy, asked over RESP or
//! HTTP (`transport`), decided by the shared shard actors.
//!
//! The caller sends its own GCRA parameters with every call (`max_burst`, `count_per_period`,
//! `period`, `quantity`), so they are capped by [`ThrottleLimits`]. Keys live in a key space of
//! their own ([`PREFIX`]): a `THROTTLE` key never meets an Envoy counter or a `/rate` key.

use std::sync::atomic::Ordering;

use super::RateLimiter;
use crate::config::Algorithm;
use crate::descriptor::key_hash;
use crate::limiter::{EngineError, Op, Params, Role, State};

/// Counter keys of the throttle API start with this. Envoy's keys start with their domain and
/// `/rate` keys with `"\0rate/"`, so none of them can collide with a throttle key.
pub const PREFIX: &str = "\0throttle/";

/// Caps on what a caller may ask for. Every call carries its own limit, so without caps one
/// caller could hold a key for years or make the service track absurd rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleLimits {
    pub max_burst: u32,
    pub max_period_secs: u64,
    pub max_count: u32,
    pub max_key_len: usize,
    /// `TURNSTILE_THROTTLE_ALLOW_REMOTE`: whether `POST /throttle` answers callers that are not
    /// on loopback (the limits come from the caller, so by default only local applications may).
    pub allow_remote: bool,
}

impl Default for ThrottleLimits {
    fn default() -> Self {
        ThrottleLimits {
            max_burst: 1_000_000,
            max_period_secs: 86_400,
            max_count: 1_000_000,
            max_key_len: 1024,
            allow_remote: false,
        }
    }
}

impl ThrottleLimits {
    /// Ten years: keeps every period's nanoseconds far from `u64` overflow.
    pub const PERIOD_CEILING_SECS: u64 = 10 * 365 * 86_400;
}

/// One `THROTTLE` call as the caller sent it. Numbers are signed so that a negative value gets
/// an error naming it rather than a parse failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleRequest {
    pub key: String,
    pub max_burst: i64,
    pub count_per_period: i64,
    /// Seconds.
    pub period: i64,
    /// Tokens to take; 0 asks without taking.
    pub quantity: i64,
}

/// ThrottleCrab's answer. Times are whole seconds, rounded up: a caller that waits
/// `retry_after` seconds and tries again is admitted if nobody else took the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleAnswer {
    pub allowed: bool,
    /// `max_burst`: the most tokens the key can hold.
    pub limit: u32,
    /// Tokens left now (after this call's, when it was allowed).
    pub remaining: u32,
    /// Until this call would be allowed; 0 when it was.
    pub retry_after: u64,
    /// Until the key is full again (all `limit` tokens back).
    pub reset_after: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThrottleError {
    #[error("{0}")]
    Invalid(String),
    #[error("overloaded, retry later")]
    Overloaded,
    #[error("rate limiter unavailable")]
    Unavailable,
}

impl From<EngineError> for ThrottleError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded => ThrottleError::Overloaded,
            EngineError::Stopped | EngineError::Unavailable => ThrottleError::Unavailable,
        }
    }
}

/// Validates `req` against `limits` and turns it into the engine's op.
pub fn op_for(req: &ThrottleRequest, limits: &ThrottleLimits) -> Result<Op, ThrottleError> {
    let invalid = |m: String| Err(ThrottleError::Invalid(m));
    if req.key.is_empty() || req.key.len() > limits.max_key_len {
        return invalid(format!(
            "key must be 1 to {} bytes long, not {}",
            limits.max_key_len,
            req.key.len()
        ));
    }
    let within = |name: &str, v: i64, max: u64| -> Result<u64, ThrottleError> {
        match u64::try_from(v) {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ThrottleError::Invalid(format!(
                "{name} must be from 1 to {max}, not {v}"
            ))),
        }
    };
    let burst = within("max_burst", req.max_burst, limits.max_burst.into())?;
    let count = within(
        "count_per_period",
        req.count_per_period,
        limits.max_count.into(),
    )?;
    let period = within("period", req.period, limits.max_period_secs)?;
    let quantity = match u64::try_from(req.quantity) {
        Ok(q) if q <= burst => q,
        // More than the bucket holds can never be allowed: say so instead of "retry later".
        _ => {
            return invalid(format!(
                "quantity must be from 0 to max_burst ({burst}), not {}",
                req.quantity
            ))
        }
    };
    if period * 1_000_000_000 < count {
        return invalid(format!(
            "count_per_period {count} in {period}s is more than one per nanosecond"
        ));
    }
    let counter = format!("{PREFIX}{}", req.key);
    Ok(Op {
        hash: key_hash(&counter),
        key: counter,
        params: Params {
            requests_per_unit: count as u32,
            window_ms: period * 1000,
            algorithm: Algorithm::TokenBucket {
                burst: burst as u32,
            },
        },
        hits: quantity,
        refund: false,
        role: Role::Binding,
        queue: None,
        grant: None,
        in_full: false,
        local_first: Some(false),
    })
}

/// Decides one `THROTTLE` call on the shared engine (same shards, same key cap, same stats).
pub async fn throttle(
    limiter: &RateLimiter,
    limits: &ThrottleLimits,
    req: &ThrottleRequest,
) -> Result<ThrottleAnswer, ThrottleError> {
    let stats = &limiter.metrics().throttle;
    let op = match op_for(req, limits) {
        Ok(op) => op,
        Err(e) => {
            stats.invalid.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
    };
    let params = op.params;
    let limit = match params.algorithm {
        Algorithm::TokenBucket { burst } => burst,
        _ => unreachable!("op_for makes token buckets"),
    };
    let decided = limiter.engine().decide(vec![op], false).await;
    let out = match decided {
        Ok(d) => d.outcomes[0],
        Err(e) => {
            stats.unavailable.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
    };
    let allowed = !out.over && !out.blocked;
    let remaining = if allowed {
        out.remaining
    } else {
        // The engine reports 0 left for a refusal; ThrottleCrab reports what is there now (not
        // enough for this quantity). A refused call's reset time is when the key is full again,
        // so the tokens there now follow from GCRA's own maths on that state.
        State::Gcra { tat: out.reset_ns }
            .eval(&params, 0, 0)
            .remaining
    };
    let counter = if allowed {
        &stats.allowed
    } else {
        &stats.denied
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(ThrottleAnswer {
        allowed,
        limit,
        remaining,
        retry_after: if allowed {
            0
        } else {
            out.retry_ns.div_ceil(1_000_000_000)
        },
        reset_after: out.reset_ns.div_ceil(1_000_000_000),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(burst: i64, count: i64, period: i64, quantity: i64) -> ThrottleRequest {
        ThrottleRequest {
            key: "k".into(),
            max_burst: burst,
            count_per_period: count,
            period,
            quantity,
        }
    }

    #[test]
    fn caps_and_ranges_are_enforced() {
        let l = ThrottleLimits {
            max_burst: 10,
            max_period_secs: 60,
            max_count: 100,
            max_key_len: 4,
            allow_remote: false,
        };
        assert!(op_for(&req(10, 100, 60, 10), &l).is_ok());
        assert!(op_for(&req(10, 100, 60, 0), &l).is_ok(), "0 only asks");
        for bad in [
            req(11, 1, 1, 1),
            req(0, 1, 1, 1),
            req(-1, 1, 1, 1),
            req(1, 101, 1, 1),
            req(1, 0, 1, 1),
            req(1, 1, 61, 1),
            req(1, 1, 0, 1),
            req(2, 1, 1, 3),
            req(2, 1, 1, -1),
        ] {
            assert!(
                matches!(op_for(&bad, &l), Err(ThrottleError::Invalid(_))),
                "{bad:?}"
            );
        }
        let mut long = req(1, 1, 1, 1);
        long.key = "12345".into();
        assert!(op_for(&long, &l).is_err());
        long.key = String::new();
        assert!(op_for(&long, &l).is_err());
        let fast = ThrottleLimits {
            max_count: u32::MAX,
            ..l
        };
        assert!(op_for(&req(1, 2_000_000_000, 1, 1), &fast).is_err());
    }

    #[test]
    fn keys_have_their_own_space() {
        let op = op_for(&req(1, 1, 1, 1), &ThrottleLimits::default()).unwrap();
        assert_eq!(op.key, "\0throttle/k");
        assert_eq!(op.hash, key_hash("\0throttle/k"));
        assert_eq!(op.params.window_ms, 1000);
    }

    #[test]
    fn refused_remaining_matches_the_engine_maths() {
        // 10 per 60 s (6 s a token), burst 5 (30 s): a key full again in 18 s has 2 tokens now.
        let op = op_for(&req(5, 10, 60, 1), &ThrottleLimits::default()).unwrap();
        let left = State::Gcra {
            tat: 18_000_000_000,
        }
        .eval(&op.params, 0, 0)
        .remaining;
        assert_eq!(left, 2);
    }
}
