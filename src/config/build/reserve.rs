//! `reserve` and `reserve_for` on a limit: validated into [`Reserve`].

use super::Ctx;
use crate::config::grammar::parse_bounded_duration;
use crate::config::raw::RawRateLimit;
use crate::config::{Algorithm, ConfigError, QueueSpec, Reserve};

/// The limit's reservations, if it takes them. Every algorithm does (a check is judged against
/// the usage plus what is held, whatever counts the usage); a queue does not go with them (a
/// check consumes nothing, so it never waits), nor an empty limit, nor one larger than the most
/// the algorithm ever admits at once: a window's `requests_per_unit`, a token bucket's `burst`.
pub(super) fn build_reserve(
    ctx: &Ctx<'_>,
    r: &RawRateLimit,
    requests_per_unit: u32,
    algorithm: Algorithm,
    queue: Option<QueueSpec>,
    path: &str,
) -> Result<Option<Reserve>, ConfigError> {
    let at = |field: &str| format!("{path}.{field}");
    let Some(hits) = r.reserve else {
        if r.reserve_for.is_some() {
            return Err(ctx.err(
                &at("reserve_for"),
                "reserve_for needs reserve (the hits each check holds)",
            ));
        }
        return Ok(None);
    };
    if hits == 0 {
        return Err(ctx.err(
            &at("reserve"),
            "reserve must be at least 1 (leave it out to hold nothing)",
        ));
    }
    if hits > requests_per_unit {
        return Err(ctx.err(
            &at("reserve"),
            format!(
                "reserve {hits} is more than the limit's {requests_per_unit}: no check could \
                 ever be admitted"
            ),
        ));
    }
    if let Algorithm::TokenBucket { burst } = algorithm {
        if hits > burst {
            return Err(ctx.err(
                &at("reserve"),
                format!(
                    "reserve {hits} is more than the token bucket's burst {burst}: no check \
                     could ever be admitted (a bucket never holds more than its burst)"
                ),
            ));
        }
    }
    if r.local_first == Some(true) {
        return Err(ctx.err(
            &at("reserve"),
            "reserve and local_first do not go together: a hold is worth what every replica \
             sees, so a limit with reserve is decided exactly in the store",
        ));
    }
    if queue.is_some() {
        return Err(ctx.err(
            &at("reserve"),
            "reserve and queue do not go together: a check holds hits and never waits",
        ));
    }
    let hold = match &r.reserve_for {
        None => Reserve::DEFAULT_HOLD,
        Some(text) => {
            let d = parse_bounded_duration(text).map_err(|m| ctx.err(&at("reserve_for"), m))?;
            if d.as_millis() == 0 {
                return Err(ctx.err(&at("reserve_for"), "reserve_for must be at least 1ms"));
            }
            d
        }
    };
    Ok(Some(Reserve { hits, hold }))
}
