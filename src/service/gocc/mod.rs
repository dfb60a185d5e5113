//! GoCC's direct API, decided: `take` one hit of a key (waiting when asked and allowed),
//! `release` it again, and the keys' windows for `/debug`.
//!
//! A key's limits: the first `rate_api` key of the YAML whose pattern matches; otherwise GoCC's
//! defaults ([`GoccDefaults`], from `MAX_REQUESTS`, `MAX_REQUESTS_IN_QUEUE`, `WINDOW_MILLIS`)
//! with every matching entry of GoCC's key file applied over them (`Config::gocc`). Every key is
//! served, as GoCC serves every key. Overrides a caller passes are sticky, as in GoCC
//! (`sticky`). Decisions go through the same shard actors as Envoy's, in a key space of their
//! own ([`PREFIX`]).

mod ask;
mod sticky;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use ask::{GoccAsk, RawAsk, Rules};
pub use sticky::{GoccOverrides, Sticky, MAX_STICKY_KEYS};

use super::{Live, LiveLimits};
use crate::config::gocc::MAX_COUNT;
use crate::config::{default_max_wait, Algorithm, KeyLimits, QueueSpec};
use crate::limiter::key::Key;
use crate::limiter::{Engine, EngineError, KeyInfo, Op, Params, Role};

/// Counter keys of the direct API start with this, so they never meet an Envoy domain's keys
/// (those start with the domain name, which cannot hold a NUL in practice).
pub const PREFIX: &str = "\0rate/";

/// GoCC's global settings (kivra/GoCC `pkg/config/config.go:26-30`): the limits of a key no
/// `rate_api` key matches (before GoCC's key file), and whether callers may override them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoccDefaults {
    pub limits: KeyLimits,
    /// `REQUESTS_CAN_SET_RATE`: `maxRequests` is honoured (else 403).
    pub can_set_rate: bool,
    /// `REQUESTS_CAN_MOD_QUEUE`: `maxRequestsInQueue` is honoured (else 403).
    pub can_mod_queue: bool,
}

impl Default for GoccDefaults {
    /// GoCC's defaults: 100 a window, 400 in the queue, 1000 ms windows, overrides on.
    fn default() -> GoccDefaults {
        GoccDefaults {
            limits: KeyLimits {
                max_requests: 100,
                max_in_queue: 400,
                window: Duration::from_millis(1000),
            },
            can_set_rate: true,
            can_mod_queue: true,
        }
    }
}

/// The direct API: the limiter, GoCC's defaults and the sticky overrides. Cheap to clone.
#[derive(Clone)]
pub struct GoccService {
    live: LiveLimits,
    engine: Engine,
    defaults: GoccDefaults,
    sticky: Arc<Sticky>,
}

/// Why a call got no hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoccError {
    /// A bad key or parameter (GoCC's 400).
    BadRequest(String),
    /// An override the settings switch off (GoCC's 403).
    Forbidden(String),
    Unavailable(EngineError),
}

/// The verdict on a `take`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoccAnswer {
    Admitted {
        /// Releases the hit (`DELETE /rate/{key}/{id}`).
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

/// A key's limits as configured (before sticky overrides) and its rules.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    limits: KeyLimits,
    /// The `rate_api` key's `max_wait`; none for GoCC keys (drain time of a full queue).
    max_wait: Option<Duration>,
    rules: Rules,
}

impl GoccService {
    /// Decides on `live`'s `rate_api` keys (GoCC's defaults else) with `engine`.
    pub fn new(live: LiveLimits, engine: Engine, defaults: GoccDefaults) -> GoccService {
        GoccService {
            live,
            engine,
            defaults,
            sticky: Arc::new(Sticky::default()),
        }
    }

    /// A key's configured limits: the first matching `rate_api` key, else GoCC's defaults with
    /// the key file's matching entries over them.
    fn resolve(&self, live: &Live, key: &str) -> Resolved {
        let api = live.config.rate_api.as_ref();
        if let Some((api, k)) = api.and_then(|a| a.find(key).map(|k| (a, k))) {
            return Resolved {
                limits: KeyLimits {
                    max_requests: k.max_requests,
                    max_in_queue: k.max_in_queue,
                    window: k.window,
                },
                max_wait: Some(k.max_wait),
                rules: Rules {
                    can_set_rate: api.allow_overrides,
                    can_mod_queue: api.allow_overrides,
                    max_requests_cap: api.max_requests_cap,
                    max_in_queue_cap: api.max_in_queue_cap,
                    switched_by: ["rate_api.allow_overrides: false"; 2],
                },
            };
        }
        let base = self.defaults.limits;
        Resolved {
            limits: (live.config.gocc.as_ref()).map_or(base, |g| g.apply(key, base)),
            max_wait: None,
            rules: Rules {
                can_set_rate: self.defaults.can_set_rate,
                can_mod_queue: self.defaults.can_mod_queue,
                max_requests_cap: MAX_COUNT as u32,
                max_in_queue_cap: MAX_COUNT as u32,
                switched_by: [
                    "REQUESTS_CAN_SET_RATE=false",
                    "REQUESTS_CAN_MOD_QUEUE=false",
                ],
            },
        }
    }

    /// A key's limits now: as `r` configures them, with its sticky overrides (after `set`)
    /// over them.
    fn limits(&self, live: &Arc<Live>, key: &str, r: &Resolved, set: GoccOverrides) -> KeyLimits {
        let now = self.engine.clock().now();
        let window_ns = r.limits.window.as_nanos() as u64;
        let o = self.sticky.touch(live, key, now, window_ns, set);
        let mut l = r.limits;
        l.max_requests = o.max_requests.unwrap_or(l.max_requests);
        l.max_in_queue = o.max_in_queue.unwrap_or(l.max_in_queue);
        l
    }

    /// Takes one hit of the key, waiting in its queue when asked and allowed.
    pub async fn take(&self, raw: &RawAsk) -> Result<GoccAnswer, GoccError> {
        let live = self.live.load_full();
        let key = ask::key(&raw.key)?;
        let resolved = self.resolve(&live, key);
        let ask = ask::check(raw, &resolved.rules)?;
        let set = GoccOverrides {
            max_requests: ask.max_requests,
            max_in_queue: ask.max_in_queue,
        };
        let l = self.limits(&live, &ask.key, &resolved, set);
        // GoCC queues only when the queue has room (`limiter_instance.go:162-176`): a queue of
        // 0 refuses a waiting caller as a full one, 429.
        let queue = (ask.can_wait && l.max_in_queue > 0 && l.max_requests > 0).then(|| QueueSpec {
            max_waiting: l.max_in_queue,
            max_wait: (resolved.max_wait)
                .unwrap_or_else(|| default_max_wait(l.window, l.max_requests, l.max_in_queue)),
        });
        let id = next_request_id();
        let counter = format!("{PREFIX}{}", ask.key);
        let op = Op {
            key: Key::new(counter),
            params: params(&l),
            hits: 1,
            refund: false,
            role: Role::Binding,
            queue,
            grant: Some(id),
            counting: crate::limiter::Counting::IfAdmitted,
            local_first: Some(false),
            reserve: crate::limiter::Reservation::None,
        };
        let mut gave_up = GaveUp {
            key: &ask.key,
            armed: queue.is_some(),
        };
        let decided = self.engine.decide(vec![op], false).await;
        gave_up.armed = false;
        let d = decided.map_err(GoccError::Unavailable)?;
        let out = d.outcomes[0];
        if out.over || out.blocked || d.timed_out {
            return Ok(GoccAnswer::Refused {
                timed_out: d.timed_out,
                retry_after: (out.retry_ns != u64::MAX).then(|| Duration::from_nanos(out.retry_ns)),
            });
        }
        Ok(GoccAnswer::Admitted {
            id,
            remaining: out.remaining,
            reset: Duration::from_nanos(out.reset_ns),
            waited: Duration::from_nanos(d.waited_ns),
        })
    }

    /// Refunds the hit admitted as `id` on `key`, as GoCC's `DELETE` (always 200 there,
    /// `endpoint_rate.go:148-183`): an id that is unknown, released already or of an ended
    /// window changes nothing. Only an empty key or id is an error.
    pub async fn release(&self, raw_key: &str, raw_id: &str) -> Result<(), GoccError> {
        let key = ask::key(raw_key)?;
        let id = raw_id.trim();
        if id.is_empty() {
            return Err(GoccError::BadRequest("empty id provided".into()));
        }
        // A release is a use of the key (`limiter_instance.go:192`).
        let live = self.live.load_full();
        self.limits(
            &live,
            key,
            &self.resolve(&live, key),
            GoccOverrides::default(),
        );
        let Ok(id) = id.parse::<u64>() else {
            return Ok(());
        };
        let counter = Key::new(format!("{PREFIX}{key}"));
        (self.engine.release(counter, id).await)
            .map(drop)
            .map_err(GoccError::Unavailable)
    }

    /// The windows of the direct API's keys: all, or only `key`.
    pub async fn windows(&self, key: Option<&str>) -> Result<Vec<GoccWindow>, EngineError> {
        let live = self.live.load_full();
        let prefix = format!("{PREFIX}{}", key.unwrap_or(""));
        let infos = self.engine.inspect(Some(prefix.clone())).await?;
        Ok(infos
            .iter()
            .filter(|i| key.is_none() || i.key == prefix)
            .filter_map(|i| self.window(&live, i))
            .collect())
    }

    fn window(&self, live: &Arc<Live>, info: &KeyInfo) -> Option<GoccWindow> {
        let key = info.key.strip_prefix(PREFIX)?.to_owned();
        let r = self.resolve(live, &key);
        let o = self.sticky.peek(live, &key, info.now);
        let mut l = r.limits;
        l.max_requests = o.max_requests.unwrap_or(l.max_requests);
        l.max_in_queue = o.max_in_queue.unwrap_or(l.max_in_queue);
        let p = params(&l);
        let current = info.now / (p.window_ms * 1_000_000);
        Some(GoccWindow {
            window_ms: p.window_ms,
            max_requests: l.max_requests,
            max_in_queue: l.max_in_queue,
            approved: info.state.count_in_window(&p, info.now),
            denied: if info.denied.window == current {
                info.denied.count
            } else {
                0
            },
            waiting: info.waiting,
            key,
        })
    }
}

fn params(l: &KeyLimits) -> Params {
    Params {
        requests_per_unit: l.max_requests,
        window_ms: (l.window.as_millis() as u64).max(1),
        algorithm: Algorithm::FixedWindow,
        calendar: None,
        tat: crate::limiter::Tat::Full,
    }
}

/// One direct API key's window, as `/debug` shows it.
#[derive(Debug, Clone)]
pub struct GoccWindow {
    pub key: String,
    pub window_ms: u64,
    pub max_requests: u32,
    pub max_in_queue: u32,
    pub approved: u64,
    pub denied: u64,
    pub waiting: usize,
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
            let key = crate::telemetry::digest(self.key);
            tracing::info!(status = 499, key, "caller gave up while waiting");
            tracing::debug!(
                status = 499,
                key = self.key,
                "caller gave up while waiting: in clear"
            );
        }
    }
}
