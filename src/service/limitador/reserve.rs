//! Limitador's reservations (limitador #515): `Reserve` holds an estimate of a call's hits on
//! every applicable counter, all or nothing, and `Commit` counts what it really used, as a
//! `Report` does, and ends that hold. A hold is a named hold of the counter's key in the engine
//! (`limiter::NamedHolds::Reserve`), so turnstile's other calls on the counter see it too: in
//! the shards' memory, or with Redis in Redis, beside the counter, shared by every replica
//! (`store::redis::scripts::first_hit`).

use std::time::Duration;

use super::{op, LimitadorCall, LimitadorError, LimitadorService};
use crate::descriptor::limitador::{applicable, Applicable, Sent};
use crate::descriptor::Entry;
use crate::limiter::{NamedHolds, Op, Reservation};

/// `--disable-reservations`, `--max-reservation-fraction`, `--max-reservation-ttl`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReservationSettings {
    pub enabled: bool,
    /// The most one hold may take of a counter's `max_value`, in [0, 1].
    pub max_fraction: f64,
    /// The longest a hold holds, whatever the call's `ttl`.
    pub max_ttl: Duration,
}

impl Default for ReservationSettings {
    fn default() -> ReservationSettings {
        ReservationSettings {
            enabled: true,
            max_fraction: 0.5,
            max_ttl: Duration::from_secs(60),
        }
    }
}

/// A `Reserve`'s answer: admitted with the id its hold goes by, or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    Admitted { id: String },
    Refused,
}

impl LimitadorService {
    /// `Reserve`: holds `amount` hits (capped on each counter at its `max_value` times the
    /// maximum fraction) on every limit of `namespace` that applies to `descriptors`, when each
    /// has room for them beside what it counts and holds already; for `ttl`, at most the
    /// maximum and never past the counter's window. Nothing is held unless all are.
    pub async fn reserve(
        &self,
        namespace: &str,
        descriptors: &[&[Entry<'_>]],
        amount: u64,
        ttl: Option<Duration>,
    ) -> Result<Reserved, LimitadorError> {
        // Drawn at random (a CSPRNG), never the next of a sequence: a caller holding one id
        // cannot guess another's.
        let id: u64 = rand::random();
        let loaded = self.loaded();
        let Some(ns) = loaded.limits.namespace(namespace) else {
            return Ok(Reserved::Admitted { id: id.to_string() });
        };
        let found = applicable(ns, &Sent(descriptors))?;
        let for_ms = hold_ms(ttl, self.reservations.max_ttl);
        let fraction = self.reservations.max_fraction;
        let ops: Vec<Op> = (found.iter())
            .map(|a| {
                let hits =
                    u32::try_from(amount.min(cap(a.limit.max_value, fraction))).unwrap_or(u32::MAX);
                Op {
                    hits: 0,
                    reserve: Reservation::Named(NamedHolds::Reserve { hits, for_ms, id }),
                    local_first: EXACT,
                    ..op(a, 0, LimitadorCall::CheckAndReport)
                }
            })
            .collect();
        if ops.is_empty() {
            return Ok(Reserved::Admitted { id: id.to_string() });
        }
        let decision = self.engine.decide(ops, false).await?;
        Ok(match decision.refused {
            true => Reserved::Refused,
            false => Reserved::Admitted { id: id.to_string() },
        })
    }

    /// `Commit`: counts `actual` hits on every applicable limit of `namespace`, unchecked, as
    /// `Report` does (0 counts nothing: the wasm-shim commits 0 to end a hold whose usage it
    /// could not read), and ends the hold `reservation_id` on every counter holding it. Whether
    /// any did; an empty or unknown id is a plain report.
    pub async fn commit(
        &self,
        namespace: &str,
        descriptors: &[&[Entry<'_>]],
        reservation_id: &str,
        actual: u64,
    ) -> Result<bool, LimitadorError> {
        let loaded = self.loaded();
        let Some(ns) = loaded.limits.namespace(namespace) else {
            return Ok(false);
        };
        let found = applicable(ns, &Sent(descriptors))?;
        let id = reservation_id.parse::<u64>().ok();
        let ops: Vec<Op> = found.iter().map(|a| commit_op(a, actual, id)).collect();
        if ops.is_empty() {
            return Ok(false);
        }
        let decision = self.engine.decide(ops, false).await?;
        Ok(decision.outcomes.iter().any(|o| o.released))
    }
}

/// The most one hold takes of a counter of `max_value`: the maximum fraction of it, rounded
/// down, but never none, or a `Reserve` would answer OK holding nothing (`max_value` 1 at 0.5)
/// and one on a `max_value` of 0 would pass (such a counter refuses a hold of 1, as every call).
fn cap(max_value: u64, fraction: f64) -> u64 {
    ((max_value as f64 * fraction).floor() as u64).max(1)
}

/// How long a hold holds, in whole milliseconds (rounded up): the call's `ttl`, at most
/// `max_ttl`. A `ttl` that could hold for no time (zero, negative, which the transport reads as
/// zero, or under a millisecond) holds as an unset one does, for `max_ttl`, as Limitador holds
/// a negative one (its `Duration::try_from` fails, and it passes none): a client answered OK
/// holds what it asked for, never nothing.
fn hold_ms(ttl: Option<Duration>, max_ttl: Duration) -> u32 {
    let ttl = match ttl {
        Some(t) if t >= Duration::from_millis(1) => t.min(max_ttl),
        _ => max_ttl,
    };
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    u32::try_from(ms).unwrap_or(u32::MAX).max(1)
}

/// Holds are made and ended in the store, with Redis (`redis_cached` too: a hold kept in one
/// replica's memory would not hold on the others), and in memory otherwise.
const EXACT: Option<bool> = Some(false);

/// The op of one applicable limit of a `Commit`: `actual` counted in full, ending hold `id`.
fn commit_op(a: &Applicable<'_>, actual: u64, id: Option<u64>) -> Op {
    let report = op(a, actual, LimitadorCall::Report);
    match id {
        Some(id) => Op {
            reserve: Reservation::Named(NamedHolds::Commit { id }),
            local_first: EXACT,
            ..report
        },
        None => report,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_that_could_hold_nothing_holds_for_the_maximum() {
        let max = Duration::from_secs(60);
        for none in [
            None,
            Some(Duration::ZERO),
            Some(Duration::from_nanos(999_999)),
        ] {
            assert_eq!(hold_ms(none, max), 60_000, "{none:?}");
        }
        assert_eq!(hold_ms(Some(Duration::from_micros(1_500)), max), 2);
        assert_eq!(hold_ms(Some(Duration::from_secs(30)), max), 30_000);
        assert_eq!(hold_ms(Some(Duration::from_secs(90)), max), 60_000);
    }

    #[test]
    fn a_hold_is_capped_at_the_fraction_but_never_at_nothing() {
        assert_eq!(cap(1000, 0.5), 500);
        assert_eq!(cap(1001, 0.5), 500);
        assert_eq!(cap(1, 0.5), 1);
        assert_eq!(cap(0, 0.5), 1);
    }
}
