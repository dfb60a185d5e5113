//! The first connection at start, retried while Redis is not there yet (`REDIS_STARTUP_*`), as
//! envoyproxy/ratelimit retries it: the process serves nothing until Redis answers (its ports
//! say so at once meanwhile, and a stop ends the wait: `server`), and gives up when
//! `REDIS_STARTUP_MAX_ELAPSED_TIME` has passed. A refused or missing password or a bad setting
//! is not retried: no wait mends it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connect_error::ConnectError;
use super::{RedisErrors, RedisSettings, RedisStore, StartupRetry};
use crate::telemetry::exposition::{single, Metrics};

/// Tries of the first connection that failed and were retried.
#[derive(Debug, Default)]
pub struct StartupRetries(AtomicU64);

impl Metrics for StartupRetries {
    fn render(&self, out: &mut String) {
        single(
            out,
            "ratelimit_service_redis_startup_retries_total",
            "Tries of the first Redis connection at start that failed and were retried.",
            "counter",
            self.0.load(Ordering::Relaxed),
        );
    }
}

impl RedisStore {
    /// Connects as `connect_once` does, retrying while Redis cannot be reached,
    /// each retry logged and counted in `retries`; the store counts its round trips' errors in
    /// `errors`. Connected, each deployment's store is asked what it is and whether it runs
    /// scripts (`probe`).
    pub async fn connect(
        s: &RedisSettings,
        retries: &StartupRetries,
        errors: &Arc<RedisErrors>,
    ) -> Result<RedisStore, String> {
        let started = Instant::now();
        let mut wait = Waits::new(s.startup);
        // What is retried, on every warning: the operator's first question about a wait.
        let address = match &s.per_second {
            None => s.main.url.clone(),
            Some(p) => format!(
                "{} (REDIS_URL), {} (REDIS_PERSECOND_URL)",
                s.main.url, p.url
            ),
        };
        loop {
            let e = match RedisStore::connect_once(s, errors).await {
                Ok(mut store) => {
                    store
                        .probe(Duration::from_secs(5).max(s.policy.deadline))
                        .await;
                    return Ok(store);
                }
                Err(ConnectError::Setting(e)) => return Err(e),
                Err(e @ ConnectError::Unreachable(_)) => e,
            };
            let elapsed = started.elapsed();
            if s.startup.max_elapsed.is_some_and(|max| elapsed >= max) {
                return Err(format!(
                    "{} (gave up after {elapsed:.1?}: REDIS_STARTUP_MAX_ELAPSED_TIME)",
                    e.message()
                ));
            }
            let next = wait.next();
            tracing::warn!(
                address = %address,
                error = e.message(),
                retry_in = ?next,
                elapsed = ?elapsed,
                "Redis not reachable at start; retrying"
            );
            retries.0.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(next).await;
        }
    }
}

/// The waits between tries: from `initial`, doubling up to `max`, each drawn at random between
/// `initial` and that ceiling (jpillora/backoff's jitter, which the reference uses).
struct Waits {
    retry: StartupRetry,
    ceiling: Duration,
}

impl Waits {
    fn new(retry: StartupRetry) -> Waits {
        Waits {
            retry,
            ceiling: retry.initial,
        }
    }

    fn next(&mut self) -> Duration {
        let (lo, hi) = (self.retry.initial, self.ceiling.max(self.retry.initial));
        self.ceiling = (self.ceiling * 2).min(self.retry.max.max(self.retry.initial));
        if hi <= lo {
            return lo;
        }
        lo + (hi - lo).mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_max_and_stay_within_their_bounds() {
        let retry = StartupRetry {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(700),
            max_elapsed: None,
        };
        let mut w = Waits::new(retry);
        let ceilings = [100, 200, 400, 700, 700, 700];
        for (i, c) in ceilings.into_iter().enumerate() {
            let d = w.next();
            assert!(
                d >= retry.initial && d <= Duration::from_millis(c),
                "wait {i}: {d:?} not within 100ms..={c}ms"
            );
        }
    }
}
