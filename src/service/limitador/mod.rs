//! Limitador's API on turnstile's engine: a call names a namespace, sends descriptors and a
//! delta; the limits of the namespace that apply (`descriptor::limitador`) become one op each,
//! on a window from the counter's first hit, decided together by the engine, so a call is
//! admitted by every applicable limit or counts nothing. The gRPC (`ShouldRateLimit`, Kuadrant's
//! `CheckRateLimit`, `Report`, `Reserve` and `Commit`) and HTTP (`/check`, `/report`,
//! `/check_and_report`) adapters all come here.

mod headers;
mod metrics;
mod reserve;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

pub use headers::draft_03;
pub use metrics::LimitadorMetrics;
pub use reserve::{ReservationSettings, Reserved};

use crate::config::limitador::{EvalError, Limit, Limits};
use crate::config::Algorithm;
use crate::config::ConfigError;
use crate::descriptor::limitador::{applicable, counter_key, Applicable, Sent};
use crate::descriptor::Entry;
use crate::limiter::key::Key;
use crate::limiter::{
    Counting, Engine, EngineError, NamedHolds, Op, Params, Reservation, Role, Tat,
};

/// What a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitadorCall {
    /// Admit `delta` if every applicable limit has room for it, and count it (`ShouldRateLimit`,
    /// `/check_and_report`).
    CheckAndReport,
    /// Whether `delta` would be admitted, counting nothing (`CheckRateLimit` with 1, `/check`).
    Check,
    /// Count `delta` whatever the limits say (`Report`, `/report`).
    Report,
}

/// One applicable limit's counter after the call.
#[derive(Debug, Clone)]
pub struct LimitCounter {
    pub max_value: u64,
    pub seconds: u64,
    pub name: Option<String>,
    /// Room left after the call (0 when it refused).
    pub remaining: u64,
    /// Until the counter's window ends, in ns.
    pub reset_ns: u64,
}

/// Limitador's door's answer to a call (`LimitadorService::call`'s).
#[derive(Debug, Clone, Default)]
pub struct LimitadorAnswer {
    pub limited: bool,
    /// The name of the first limit that refused, when it has one.
    pub limited_by: Option<String>,
    /// Every applicable limit's counter, in the limits' order.
    pub counters: Vec<LimitCounter>,
}

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitadorError {
    /// A condition or variable failed as Limitador fails it (an index past the descriptors).
    #[error("{0}")]
    Eval(#[from] EvalError),
    #[error("{0}")]
    Engine(#[from] EngineError),
}

/// The limits file being served, and when it went live.
#[derive(Debug)]
pub struct LoadedLimits {
    pub limits: Limits,
    pub applied_at: SystemTime,
}

/// The limits file's loads, as Limitador's `/status` counts them.
#[derive(Debug, Default)]
pub struct Loads {
    /// Reloads that went live (the load at start is version 0).
    pub version: AtomicU64,
    /// Reloads refused since the last that went live.
    pub err_since: AtomicU64,
}

/// A cheap `Clone` handle: the limits being served, the engine, the call counters. `Reserve`
/// and `Commit` are in `reserve.rs`, apart on purpose: the reservations' path (named holds,
/// by id) is one of its own.
#[derive(Clone)]
pub struct LimitadorService {
    live: Arc<ArcSwap<LoadedLimits>>,
    loads: Arc<Loads>,
    engine: Engine,
    metrics: Arc<LimitadorMetrics>,
    reservations: ReservationSettings,
}

impl LimitadorService {
    pub fn new(limits: Limits, engine: Engine, metrics: Arc<LimitadorMetrics>) -> LimitadorService {
        metrics.watch_store(engine.metrics());
        let loaded = LoadedLimits {
            limits,
            applied_at: SystemTime::now(),
        };
        LimitadorService {
            live: Arc::new(ArcSwap::from_pointee(loaded)),
            loads: Arc::default(),
            engine,
            metrics,
            reservations: ReservationSettings::default(),
        }
    }

    /// The same, holding reservations as `reservations` say.
    pub fn with_reservations(self, reservations: ReservationSettings) -> LimitadorService {
        LimitadorService {
            reservations,
            ..self
        }
    }

    pub fn reservations(&self) -> &ReservationSettings {
        &self.reservations
    }

    /// The limits being served now.
    pub fn loaded(&self) -> Arc<LoadedLimits> {
        self.live.load_full()
    }

    /// A reload of the limits file: valid, it goes live, and counters are kept (a counter is
    /// its limit's identity and values, which a new `max_value` does not change); invalid, the
    /// limits served stay, and the failure is counted.
    pub fn reload(&self, read: Result<Limits, ConfigError>) {
        match read {
            Ok(limits) => {
                tracing::info!(limits = limits.count, "limits file reloaded");
                self.live.store(Arc::new(LoadedLimits {
                    limits,
                    applied_at: SystemTime::now(),
                }));
                self.loads.version.fetch_add(1, Relaxed);
                self.loads.err_since.store(0, Relaxed);
            }
            Err(e) => {
                tracing::error!(error = %e, "limits file not reloaded: the limits served stay");
                self.loads.err_since.fetch_add(1, Relaxed);
            }
        }
    }

    pub fn loads(&self) -> &Loads {
        &self.loads
    }

    pub fn metrics(&self) -> &Arc<LimitadorMetrics> {
        &self.metrics
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Decides `ask` for `delta` hits of a call to `namespace` sending `descriptors`; with
    /// `metered`, counts it in the metrics as Limitador's gRPC calls and `/check_and_report`
    /// count (its HTTP `/check` and `/report` count nothing).
    pub async fn call(
        &self,
        namespace: &str,
        descriptors: &[&[Entry<'_>]],
        delta: u64,
        ask: LimitadorCall,
        metered: bool,
    ) -> Result<LimitadorAnswer, LimitadorError> {
        let loaded = self.loaded();
        let answer = match loaded.limits.namespace(namespace) {
            None => LimitadorAnswer::default(),
            Some(ns) => {
                let found = applicable(ns, &Sent(descriptors))?;
                self.decide(&found, delta, ask).await?
            }
        };
        if metered {
            (self.metrics).counted(namespace, descriptors, ask, delta, &answer);
        }
        Ok(answer)
    }

    async fn decide(
        &self,
        found: &[Applicable<'_>],
        delta: u64,
        ask: LimitadorCall,
    ) -> Result<LimitadorAnswer, LimitadorError> {
        if found.is_empty() {
            return Ok(LimitadorAnswer::default());
        }
        // A check of more than a limit's maximum never passes, whatever its counter holds.
        if ask == LimitadorCall::Check {
            if let Some(a) = found.iter().find(|a| a.limit.max_value < delta) {
                return Ok(limited_by(a.limit));
            }
        }
        let ops: Vec<Op> = found.iter().map(|a| op(a, delta, ask)).collect();
        let decision = self.engine.decide(ops, false).await?;
        let refused = decision.refused && ask != LimitadorCall::Report;
        let mut answer = LimitadorAnswer {
            limited: refused,
            ..LimitadorAnswer::default()
        };
        for (a, o) in found.iter().zip(&decision.outcomes) {
            if refused && o.over && answer.limited_by.is_none() {
                answer.limited_by = a.limit.name.clone();
            }
            answer.counters.push(LimitCounter {
                max_value: a.limit.max_value,
                seconds: a.limit.seconds,
                name: a.limit.name.clone(),
                remaining: if o.over { 0 } else { u64::from(o.remaining) },
                reset_ns: o.reset_ns,
            });
        }
        Ok(answer)
    }
}

/// An answer refusing by `limit`, decided without the engine.
fn limited_by(limit: &Limit) -> LimitadorAnswer {
    LimitadorAnswer {
        limited: true,
        limited_by: limit.name.clone(),
        counters: Vec::new(),
    }
}

/// The op of one applicable limit. A check looks for room for `delta` without taking it: an op
/// of no hits passes while the count is at most its limit, so its limit is `max_value - delta`.
/// Every op is judged beside the counter's reservations (`Reserve`), so no call spends room a
/// reservation holds: beyond Limitador, whose other calls do not see them.
fn op(a: &Applicable<'_>, delta: u64, ask: LimitadorCall) -> Op {
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let (limit, hits, counting) = match ask {
        LimitadorCall::CheckAndReport => (a.limit.max_value, delta, Counting::IfAdmitted),
        LimitadorCall::Check => (
            a.limit.max_value.saturating_sub(delta),
            0,
            Counting::IfAdmitted,
        ),
        LimitadorCall::Report => (a.limit.max_value, delta, Counting::Usage),
    };
    Op {
        key: Key::new(counter_key(a.limit, &a.values)),
        params: Params {
            requests_per_unit: clamp(limit),
            window_ms: a.limit.seconds.saturating_mul(1000),
            algorithm: Algorithm::FromFirstHit,
            calendar: None,
            tat: Tat::Full,
        },
        hits,
        refund: false,
        counting,
        role: Role::Binding,
        queue: None,
        grant: None,
        local_first: None,
        reserve: Reservation::Named(NamedHolds::Beside),
    }
}

/// The values of a call's applicable limits, for `/counters`: each limit's variables by text.
pub fn set_variables(limit: &Limit, values: &[&str]) -> SmallVec<[(String, String); 2]> {
    (limit.variables.iter().zip(values))
        .map(|(v, value)| (v.text().to_owned(), (*value).to_owned()))
        .collect()
}
