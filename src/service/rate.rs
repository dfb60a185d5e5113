//! GoCC's direct API, decided: `take` one hit of a `rate_api` key (waiting when asked and
//! allowed), `release` it again, and the keys' windows for `/debug`.
//!
//! Keys and limits come from the config's `rate_api` section; decisions go through the same
//! shard actors as Envoy's, in a key space of their own ([`PREFIX`]). Per-request overrides
//! apply to that request only (never sticky) and only where the config allows them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RateLimiter;
use crate::config::{Algorithm, QueueSpec, RateApi, RateApiKey};
use crate::descriptor::key_hash;
use crate::limiter::{EngineError, KeyInfo, Op, Params, Role};

/// Counter keys of the direct API start with this, so they never meet an Envoy domain's keys
/// (those start with the domain name, which cannot hold a NUL in practice).
pub const PREFIX: &str = "\0rate/";

/// One `/rate/{key}` call as asked.
#[derive(Debug, Clone, Default)]
pub struct RateAsk {
    pub key: String,
    pub can_wait: bool,
    pub max_requests: Option<u32>,
    pub max_in_queue: Option<u32>,
}

/// Why a call got no hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateError {
    /// No `rate_api` section, or no key pattern matches.
    NotFound(String),
    /// The ask breaks the config's rules (overrides off, over a cap, a queue of 0).
    Invalid(String),
    Unavailable(EngineError),
}

/// The verdict on a `take`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateAnswer {
    Admitted {
        /// Releases the hit (`DELETE /rate/{key}/{id:x}`).
        id: u64,
        remaining: u32,
        reset: Duration,
        waited: Duration,
    },
    Refused {
        /// The wait ran out (`max_wait`) rather than the window being full.
        timed_out: bool,
        /// When a retry can succeed; none when it never can.
        retry_after: Option<Duration>,
    },
}

/// The limit per window and the queue, if the call may wait.
type Granted = (u32, Option<QueueSpec>);

/// The limit and queue an ask gets, with the config's caps and rules applied.
fn resolve(api: &RateApi, k: &RateApiKey, ask: &RateAsk) -> Result<Granted, RateError> {
    let invalid = |m: String| Err(RateError::Invalid(m));
    if (ask.max_requests.is_some() || ask.max_in_queue.is_some()) && !api.allow_overrides {
        return invalid(
            "per-request overrides are disabled (rate_api.allow_overrides: false)".into(),
        );
    }
    let max_requests = ask.max_requests.unwrap_or(k.max_requests);
    if max_requests > api.max_requests_cap {
        return invalid(format!(
            "maxRequests {max_requests} is over the cap of {}",
            api.max_requests_cap
        ));
    }
    // A queue over its cap is refused whatever the other parameters say (an override always;
    // the key's own size when the call would wait).
    let max_waiting = ask.max_in_queue.unwrap_or(k.max_in_queue);
    if max_waiting > api.max_in_queue_cap && (ask.can_wait || ask.max_in_queue.is_some()) {
        return invalid(format!(
            "maxRequestsInQueue {max_waiting} is over the cap of {}",
            api.max_in_queue_cap
        ));
    }
    if !ask.can_wait {
        return Ok((max_requests, None));
    }
    if max_waiting == 0 || max_requests == 0 {
        return invalid(format!(
            "key \"{}\" cannot wait: its queue holds 0 (max_in_queue)",
            ask.key
        ));
    }
    let queue = QueueSpec {
        max_waiting,
        max_wait: k.max_wait,
    };
    Ok((max_requests, Some(queue)))
}

/// Takes one hit of `ask.key`, waiting in its queue when asked and allowed.
pub async fn take(limiter: &RateLimiter, ask: &RateAsk) -> Result<RateAnswer, RateError> {
    let live = limiter.live();
    let api = (live.config.rate_api.as_ref())
        .ok_or_else(|| RateError::NotFound("the config has no rate_api section".into()))?;
    let k = api
        .find(&ask.key)
        .ok_or_else(|| RateError::NotFound(format!("no rate_api key matches \"{}\"", ask.key)))?;
    let (max_requests, queue) = resolve(api, k, ask)?;
    let id = next_request_id();
    let counter = format!("{PREFIX}{}", ask.key);
    let op = Op {
        hash: key_hash(&counter),
        key: counter,
        params: Params {
            requests_per_unit: max_requests,
            window_ms: k.window.as_millis() as u64,
            algorithm: Algorithm::FixedWindow,
        },
        hits: 1,
        refund: false,
        role: Role::Binding,
        queue,
        grant: Some(id),
        counting: crate::limiter::Counting::IfAdmitted,
        local_first: Some(false),
    };
    let mut gave_up = GaveUp {
        key: &ask.key,
        armed: queue.is_some(),
    };
    let decided = limiter.engine().decide(vec![op], false).await;
    gave_up.armed = false;
    let d = decided.map_err(RateError::Unavailable)?;
    let out = d.outcomes[0];
    if out.over || out.blocked || d.timed_out {
        return Ok(RateAnswer::Refused {
            timed_out: d.timed_out,
            retry_after: (out.retry_ns != u64::MAX).then(|| Duration::from_nanos(out.retry_ns)),
        });
    }
    Ok(RateAnswer::Admitted {
        id,
        remaining: out.remaining,
        reset: Duration::from_nanos(out.reset_ns),
        waited: Duration::from_nanos(d.waited_ns),
    })
}

/// Gives back the hit admitted as `id` on `key`; false when unknown or its window has ended.
pub async fn release(limiter: &RateLimiter, key: &str, id: u64) -> Result<bool, EngineError> {
    let counter = format!("{PREFIX}{key}");
    let hash = key_hash(&counter);
    limiter.engine().release(counter, hash, id).await
}

/// One direct API key's window, as `/debug` shows it.
#[derive(Debug, Clone)]
pub struct RateWindow {
    pub key: String,
    pub window_ms: u64,
    pub max_requests: u32,
    pub max_in_queue: u32,
    pub max_wait_ms: u64,
    pub approved: u64,
    pub denied: u64,
    pub waiting: usize,
}

/// The windows of the direct API's keys: all, or only `key`.
pub async fn windows(
    limiter: &RateLimiter,
    key: Option<&str>,
) -> Result<Vec<RateWindow>, EngineError> {
    let live = limiter.live();
    let Some(api) = live.config.rate_api.as_ref() else {
        return Ok(Vec::new());
    };
    let prefix = format!("{PREFIX}{}", key.unwrap_or(""));
    let infos = limiter.engine().inspect(Some(prefix.clone())).await?;
    Ok(infos
        .iter()
        .filter(|i| key.is_none() || i.key == prefix)
        .filter_map(|i| window(api, i))
        .collect())
}

fn window(api: &RateApi, info: &KeyInfo) -> Option<RateWindow> {
    let key = info.key.strip_prefix(PREFIX)?.to_owned();
    let k = api.find(&key)?;
    let params = Params {
        requests_per_unit: k.max_requests,
        window_ms: k.window.as_millis() as u64,
        algorithm: Algorithm::FixedWindow,
    };
    let current = info.now / (params.window_ms * 1_000_000);
    Some(RateWindow {
        window_ms: params.window_ms,
        max_requests: k.max_requests,
        max_in_queue: k.max_in_queue,
        max_wait_ms: k.max_wait.as_millis() as u64,
        approved: info.state.count_in_window(&params, info.now),
        denied: if info.denied.0 == current {
            info.denied.1
        } else {
            0
        },
        waiting: info.waiting,
        key,
    })
}

fn next_request_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Seeded from the clock once, so ids of a restarted process do not repeat old ones.
    if NEXT.load(Ordering::Relaxed) == 0 {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        let _ = NEXT.compare_exchange(0, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Logs a caller that gave up while waiting (GoCC's 499).
struct GaveUp<'a> {
    key: &'a str,
    armed: bool,
}

impl Drop for GaveUp<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(status = 499, key = self.key, "caller gave up while waiting");
        }
    }
}
