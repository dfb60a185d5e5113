//! The direct API's decisions, for applications not behind Envoy, asked over RESP or HTTP
//! (`transport`) and decided by the shared shard actors. Two peers' commands, each answered as
//! that peer answers it, so their clients work unchanged:
//!
//! - ThrottleCrab's `THROTTLE` ([`ThrottleService::throttle`]): as lazureykis/throttlecrab
//!   0.4.40 (commit 5d4a947) answers it, `[allowed, limit, remaining, reset_after,
//!   retry_after]` with its own values (`throttlecrab/src/core/rate_limiter.rs`, whole
//!   seconds floored by `throttlecrab-server/src/types.rs`).
//! - redis-cell's `CL.THROTTLE` ([`ThrottleService::cl_throttle`]): as brandur/redis-cell
//!   0.5.0 (commit 4d42338) answers it, `[limited, max_burst + 1, remaining, retry_after (-1
//!   when allowed), reset_after]` (`src/cell/mod.rs`, whole seconds rounded up by `src/lib.rs`).
//!
//! The caller sends its own GCRA parameters with every call (`max_burst`, `count_per_period`,
//! `period`, `quantity`), so they are capped by [`ThrottleLimits`]. Keys live in key spaces of
//! their own ([`PREFIX`], [`CELL_PREFIX`]): such a key never meets an Envoy counter, a `/rate`
//! key, or the other command's key of the same name.
//!
//! # One engine, two peers
//!
//! Both peers are GCRA with a theoretical arrival time (TAT) per key. redis-cell's is the
//! textbook one: a bucket of `max_burst + 1` tokens, its TAT the time the bucket is full again,
//! the engine's own ([`Tat::Full`]). ThrottleCrab's bucket holds `max_burst`, its TAT is one
//! token's interval `T` before "full" (a fresh key starts at `now - T`, `rate_limiter.rs:165`),
//! and it keeps a stored TAT as it is, whatever parameters later calls bring, until the key
//! expires at TAT + τ (`:160`, `:179-183`); a call of quantity 0 stores it too. The engine keeps
//! ThrottleCrab's keys by that rule ([`Tat::ThrottleCrab`]) and answers its values, so a key left
//! idle, but not long enough to expire, can take up to `2·max_burst - 3` tokens at once there as
//! in ThrottleCrab, and with `max_burst` 1 a key never refuses a quantity of 1.

mod stats;

use std::sync::Arc;

use crate::config::Algorithm;
use crate::limiter::key::Key;
use crate::limiter::{Engine, EngineError, Op, Outcome, Params, Role, Tat};
pub use stats::ThrottleStats;

/// Counter keys of `THROTTLE` start with this. Envoy's keys start with their domain and `/rate`
/// keys with `"\0rate/"`, so none of them can collide with a throttle key.
pub const PREFIX: &str = "\0throttle/";

/// Counter keys of `CL.THROTTLE` start with this: redis-cell's buckets are one token bigger than
/// ThrottleCrab's for the same `max_burst`, so the two commands never share a key.
pub const CELL_PREFIX: &str = "\0cell/";

const NS: u128 = 1_000_000_000;

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

/// Whose command a call is: it says what `max_burst` means and how the answer is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// ThrottleCrab's `THROTTLE`: a bucket of `max_burst` tokens, `max_burst` at least 1.
    ThrottleCrab,
    /// redis-cell's `CL.THROTTLE`: a bucket of `max_burst + 1` tokens, `max_burst` from 0.
    RedisCell,
}

/// One call as the caller sent it. Numbers are signed so that a negative value gets an error
/// naming it rather than a parse failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleRequest {
    pub key: String,
    pub max_burst: i64,
    pub count_per_period: i64,
    /// Seconds.
    pub period: i64,
    /// Tokens to take; 0 asks without taking. More than the bucket holds is refused.
    pub quantity: i64,
}

/// ThrottleCrab's answer, fields in its reply's order (`throttlecrab-server/src/types.rs`,
/// `ThrottleResponse`). Times are whole seconds, floored (`Duration::as_secs`, `types.rs:93-94`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleAnswer {
    pub allowed: bool,
    /// `max_burst`.
    pub limit: i64,
    /// Tokens left now (after this call's, when it was allowed).
    pub remaining: i64,
    /// Until the bucket is full, counted ThrottleCrab's way: TAT + T·(max_burst-1) - now, when
    /// its key expires and starts afresh.
    pub reset_after: i64,
    /// Until this call would be allowed; 0 when it was.
    pub retry_after: i64,
}

/// The throttle door's second answer, redis-cell's (`CL.THROTTLE`), fields in its reply's order
/// (its README's "Response", `src/lib.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleCellAnswer {
    /// Sent first, as 0 (allowed) or 1 (limited).
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: i64,
    pub remaining: i64,
    /// Seconds until a retry can be allowed, rounded up; -1 when allowed, and when the quantity
    /// is more than the bucket holds.
    pub retry_after: i64,
    /// Seconds until the bucket is full again, rounded up.
    pub reset_after: i64,
}

/// What the engine decided, in the terms both peers' answers are computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    pub allowed: bool,
    /// Until the engine's bucket is full again: after this call's tokens when it was allowed,
    /// as it is when refused.
    pub full_in_ns: u64,
    /// One token's interval, T: period / count_per_period.
    pub interval_ns: u64,
    /// Tokens the engine's bucket holds.
    pub burst: u64,
    /// Tokens asked for.
    pub quantity: u64,
}

impl ThrottleAnswer {
    /// ThrottleCrab's answer from the engine's verdict under [`Tat::ThrottleCrab`], whose
    /// remaining, reset and retry are ThrottleCrab's own (`rate_limiter.rs`); times in whole
    /// seconds, floored (`types.rs:93-94`).
    pub fn from_outcome(out: &Outcome, max_burst: u64) -> ThrottleAnswer {
        let allowed = !out.over && !out.blocked;
        let secs = |ns: u64| (ns / NS as u64) as i64;
        ThrottleAnswer {
            allowed,
            limit: max_burst as i64,
            remaining: out.remaining.into(),
            reset_after: secs(out.reset_ns),
            retry_after: if allowed { 0 } else { secs(out.retry_ns) },
        }
    }
}

impl ThrottleCellAnswer {
    /// redis-cell's answer (`src/cell/mod.rs`, `RateLimiter::rate_limit`): its TAT is the
    /// engine's, and `τ = T·(max_burst+1)` (`:78-80`) is the engine's bucket.
    pub fn from_gcra(g: &Gcra) -> ThrottleCellAnswer {
        let t = i128::from(g.interval_ns.max(1));
        let tau = t * i128::from(g.burst);
        // new_tat - now when allowed, tat - now when limited (`:187`, `:192`).
        let ttl = i128::from(g.full_in_ns);
        // next = τ - ttl in whole microseconds, divided as f64 and truncated, when next > -T
        // (`:227-232`). An interval under a microsecond (only past the default caps) would
        // divide by zero there; it is counted in nanoseconds here.
        let next = tau - ttl;
        let remaining = if next <= -t {
            0
        } else if t / 1000 == 0 {
            (next / t) as i64
        } else {
            ((next / 1000) as f64 / (t / 1000) as f64) as i64
        };
        // -diff = new_tat - τ - now, kept only when the increment fits in τ; else it stays -1 s
        // (`:105`, `:175-184`).
        let increment = t * i128::from(g.quantity);
        let retry = (!g.allowed && increment <= tau).then(|| ttl + increment - tau);
        ThrottleCellAnswer {
            limited: !g.allowed,
            limit: g.burst as i64,
            remaining,
            retry_after: retry.map_or(-1, cell_secs),
            reset_after: cell_secs(ttl),
        }
    }
}

/// redis-cell's whole seconds (`src/lib.rs:66-76`): `as_seconds_f64() as i64`, plus one when
/// the part under a second has a millisecond or more.
fn cell_secs(ns: i128) -> i64 {
    let (whole, sub) = (ns / NS as i128, ns % NS as i128);
    let s = (whole as f64 + sub as f64 / 1e9) as i64;
    if sub / 1_000_000 > 0 {
        s.saturating_add(1)
    } else {
        s
    }
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
            EngineError::Stopped | EngineError::Unavailable | EngineError::Store(_) => {
                ThrottleError::Unavailable
            }
        }
    }
}

/// Validates `req` against `limits` and turns it into the engine's op. A quantity more than the
/// bucket holds can never be allowed, by either peer: its op takes nothing and only looks, so the
/// refusal can tell what is there.
pub fn op_for(
    req: &ThrottleRequest,
    limits: &ThrottleLimits,
    peer: Peer,
) -> Result<Op, ThrottleError> {
    let invalid = |m: String| Err(ThrottleError::Invalid(m));
    if req.key.is_empty() || req.key.len() > limits.max_key_len {
        return invalid(format!(
            "key must be 1 to {} bytes long, not {}",
            limits.max_key_len,
            req.key.len()
        ));
    }
    let within = |name: &str, v: i64, min: u64, max: u64| -> Result<u64, ThrottleError> {
        match u64::try_from(v) {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(ThrottleError::Invalid(format!(
                "{name} must be from {min} to {max}, not {v}"
            ))),
        }
    };
    let (least_burst, extra, prefix) = match peer {
        Peer::ThrottleCrab => (1, 0, PREFIX),
        Peer::RedisCell => (0, 1, CELL_PREFIX),
    };
    let burst = within(
        "max_burst",
        req.max_burst,
        least_burst,
        limits.max_burst.into(),
    )? + extra;
    let burst = u32::try_from(burst)
        .map_err(|_| ThrottleError::Invalid(format!("max_burst {} is too large", req.max_burst)))?;
    let count = within(
        "count_per_period",
        req.count_per_period,
        1,
        limits.max_count.into(),
    )?;
    let period = within("period", req.period, 1, limits.max_period_secs)?;
    let Ok(quantity) = u64::try_from(req.quantity) else {
        return invalid(format!("quantity must be 0 or more, not {}", req.quantity));
    };
    if period * 1_000_000_000 < count {
        return invalid(format!(
            "count_per_period {count} in {period}s is more than one per nanosecond"
        ));
    }
    let counter = format!("{prefix}{}", req.key);
    let tat = match peer {
        Peer::ThrottleCrab => Tat::ThrottleCrab,
        Peer::RedisCell => Tat::Full,
    };
    Ok(Op {
        key: Key::new(counter),
        params: Params {
            requests_per_unit: count as u32,
            window_ms: period * 1000,
            algorithm: Algorithm::TokenBucket { burst },
            calendar: None,
            tat,
        },
        // ThrottleCrab's rule decides any quantity itself (a key it keeps may take more than
        // max_burst); redis-cell's never allows more than its bucket.
        hits: if tat == Tat::ThrottleCrab || quantity <= u64::from(burst) {
            quantity
        } else {
            0
        },
        refund: false,
        role: Role::Binding,
        queue: None,
        grant: None,
        counting: crate::limiter::Counting::IfAdmitted,
        local_first: Some(false),
        reserve: crate::limiter::Reservation::None,
    })
}

/// The direct APIs' decisions on the shared engine (same shards, same key cap), counted in the
/// throttle counters it holds. Cheap to clone; the RESP and HTTP transports each get one.
#[derive(Clone)]
pub struct ThrottleService {
    engine: Engine,
    stats: Arc<ThrottleStats>,
}

impl ThrottleService {
    pub fn new(engine: Engine, stats: Arc<ThrottleStats>) -> ThrottleService {
        ThrottleService { engine, stats }
    }

    /// Counts a call the transport could not read (bad arguments, a bad body) as invalid.
    pub fn count_unread(&self) {
        self.stats.invalid();
    }

    /// ThrottleCrab's `THROTTLE`.
    pub async fn throttle(
        &self,
        limits: &ThrottleLimits,
        req: &ThrottleRequest,
    ) -> Result<ThrottleAnswer, ThrottleError> {
        let (out, g) = self.decide(limits, req, Peer::ThrottleCrab).await?;
        Ok(ThrottleAnswer::from_outcome(&out, g.burst))
    }

    /// redis-cell's `CL.THROTTLE`.
    pub async fn cl_throttle(
        &self,
        limits: &ThrottleLimits,
        req: &ThrottleRequest,
    ) -> Result<ThrottleCellAnswer, ThrottleError> {
        let (_, g) = self.decide(limits, req, Peer::RedisCell).await?;
        Ok(ThrottleCellAnswer::from_gcra(&g))
    }

    async fn decide(
        &self,
        limits: &ThrottleLimits,
        req: &ThrottleRequest,
        peer: Peer,
    ) -> Result<(Outcome, Gcra), ThrottleError> {
        let stats = &self.stats;
        let op = match op_for(req, limits, peer) {
            Ok(op) => op,
            Err(e) => {
                stats.invalid();
                return Err(e);
            }
        };
        let params = op.params;
        let burst = match params.algorithm {
            Algorithm::TokenBucket { burst } => u64::from(burst),
            _ => unreachable!("op_for makes token buckets"),
        };
        // op_for took it as a u64.
        let quantity = req.quantity as u64;
        let decided = self.engine.decide(vec![op], false).await;
        let out = match decided {
            Ok(d) => d.outcomes[0],
            Err(e) => {
                stats.unavailable();
                return Err(e.into());
            }
        };
        let allowed =
            !out.over && !out.blocked && (peer == Peer::ThrottleCrab || quantity <= burst);
        stats.decided(allowed);
        let g = Gcra {
            allowed,
            full_in_ns: out.reset_ns,
            interval_ns: params.interval_ns(),
            burst,
            quantity,
        };
        Ok((out, g))
    }
}

#[cfg(test)]
mod tests;
