//! Direct transports for applications not behind Envoy: ThrottleCrab's `THROTTLE` decision, asked
//! over the Redis protocol (`resp`) or HTTP (`admin`'s `POST /throttle`), decided by the shared
//! shard actors.
//!
//! The caller sends its own GCRA parameters with every call (`max_burst`, `count_per_period`,
//! `period`, `quantity`), so they are capped by [`ThrottleLimits`]. Keys live in a key space of
//! their own ([`PREFIX`]): a `THROTTLE` key never meets an Envoy counter or a `/rate` key.

pub mod resp;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::config::Algorithm;
use crate::descriptor::key_hash;
use crate::limiter::{EngineError, Op, Params, Role, State};
use crate::service::RateLimiter;

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

/// Ten years: keeps every period's nanoseconds far from `u64` overflow.
const PERIOD_CEILING_SECS: u64 = 10 * 365 * 86_400;

impl ThrottleLimits {
    /// `TURNSTILE_THROTTLE_MAX_BURST`, `_MAX_PERIOD_SECS`, `_MAX_COUNT`, `_MAX_KEY_LEN`, read
    /// through `env` (a parameter so tests need not touch the process environment).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<ThrottleLimits, String> {
        let d = ThrottleLimits::default();
        let num = |k: &str, default: u64, max: u64| -> Result<u64, String> {
            match env(k).filter(|v| !v.is_empty()) {
                None => Ok(default),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| format!("{k}={v} is not a whole number from 1 to {max}")),
            }
        };
        let u32max = u64::from(u32::MAX);
        let allow_remote = match env("TURNSTILE_THROTTLE_ALLOW_REMOTE")
            .filter(|v| !v.is_empty())
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(v) => {
                return Err(format!(
                    "TURNSTILE_THROTTLE_ALLOW_REMOTE={v} is not a boolean"
                ))
            }
        };
        Ok(ThrottleLimits {
            allow_remote,
            max_burst: num("TURNSTILE_THROTTLE_MAX_BURST", d.max_burst.into(), u32max)? as u32,
            max_period_secs: num(
                "TURNSTILE_THROTTLE_MAX_PERIOD_SECS",
                d.max_period_secs,
                PERIOD_CEILING_SECS,
            )?,
            max_count: num("TURNSTILE_THROTTLE_MAX_COUNT", d.max_count.into(), u32max)? as u32,
            max_key_len: num(
                "TURNSTILE_THROTTLE_MAX_KEY_LEN",
                d.max_key_len as u64,
                65_536,
            )? as usize,
        })
    }
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
    })
}

/// Decides one `THROTTLE` call on the shared engine (same shards, same key cap, same stats).
pub async fn throttle(
    limiter: &RateLimiter,
    limits: &ThrottleLimits,
    req: &ThrottleRequest,
) -> Result<ThrottleAnswer, ThrottleError> {
    let op = match op_for(req, limits) {
        Ok(op) => op,
        Err(e) => {
            STATS.invalid.fetch_add(1, Ordering::Relaxed);
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
            STATS.unavailable.fetch_add(1, Ordering::Relaxed);
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
        &STATS.allowed
    } else {
        &STATS.denied
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

/// The caps for the HTTP endpoint, read once from the process environment. The RESP server gets
/// its caps in [`resp::RespSettings`]; both read the same variables.
pub fn http_limits() -> Result<&'static ThrottleLimits, &'static str> {
    static LIMITS: OnceLock<Result<ThrottleLimits, String>> = OnceLock::new();
    LIMITS
        .get_or_init(|| ThrottleLimits::from_env(|k| std::env::var(k).ok()))
        .as_ref()
        .map_err(String::as_str)
}

/// Process-wide counters of the direct transports. Atomics in a static: the HTTP handler has no
/// other place to reach them, and counting costs no allocation.
#[derive(Debug)]
pub struct TransportStats {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    /// Calls refused for bad arguments or parameters over the caps.
    pub invalid: AtomicU64,
    /// Calls the engine could not decide (overloaded, stopped, backend down).
    pub unavailable: AtomicU64,
    pub resp_connections_open: AtomicU64,
    /// Connections turned away at the cap.
    pub resp_connections_refused: AtomicU64,
}

static STATS: TransportStats = TransportStats {
    allowed: AtomicU64::new(0),
    denied: AtomicU64::new(0),
    invalid: AtomicU64::new(0),
    unavailable: AtomicU64::new(0),
    resp_connections_open: AtomicU64::new(0),
    resp_connections_refused: AtomicU64::new(0),
};

pub fn stats() -> &'static TransportStats {
    &STATS
}

/// Appends the counters in Prometheus text format (for the `/metrics` handler).
pub fn render_metrics(out: &mut String) {
    let s = stats();
    let _ = writeln!(
        out,
        "# HELP turnstile_throttle_calls_total THROTTLE calls (RESP and HTTP) by result.\n# TYPE turnstile_throttle_calls_total counter"
    );
    for (result, c) in [
        ("allowed", &s.allowed),
        ("denied", &s.denied),
        ("invalid", &s.invalid),
        ("unavailable", &s.unavailable),
    ] {
        let _ = writeln!(
            out,
            "turnstile_throttle_calls_total{{result=\"{result}\"}} {}",
            c.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP turnstile_resp_connections Open RESP connections.\n# TYPE turnstile_resp_connections gauge\nturnstile_resp_connections {}",
        s.resp_connections_open.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP turnstile_resp_connections_refused_total RESP connections refused at the cap.\n# TYPE turnstile_resp_connections_refused_total counter\nturnstile_resp_connections_refused_total {}",
        s.resp_connections_refused.load(Ordering::Relaxed)
    );
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
    fn limits_from_env() {
        let l = ThrottleLimits::from_env(|k| match k {
            "TURNSTILE_THROTTLE_MAX_BURST" => Some("5".into()),
            "TURNSTILE_THROTTLE_MAX_PERIOD_SECS" => Some("".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(l.max_burst, 5);
        assert_eq!(l.max_period_secs, 86_400);
        for bad in ["0", "-1", "x", "4294967296"] {
            let e = ThrottleLimits::from_env(|k| {
                (k == "TURNSTILE_THROTTLE_MAX_COUNT").then(|| bad.to_string())
            })
            .unwrap_err();
            assert!(e.contains("TURNSTILE_THROTTLE_MAX_COUNT"), "{e}");
        }
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
