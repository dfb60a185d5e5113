//! The breaker between a shard and its store: it opens after consecutive failed or slow round
//! trips, lets one batch through as a probe after a cooldown, and closes when that succeeds.

use std::time::{Duration, Instant};

/// Where a shard's breaker to the store stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Decisions go to the store.
    Closed,
    /// The store failed: decisions follow the failure mode until the cooldown ends.
    Open,
    /// One batch has gone to the store as a probe; its answer closes or reopens the breaker.
    HalfOpen,
}

impl BreakerState {
    /// The value of the `ratelimit_service_redis_breaker_state` gauge.
    pub const fn gauge(self) -> u64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }

    /// The state a gauge value stands for.
    pub fn from_gauge(value: u64) -> Option<BreakerState> {
        [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ]
        .into_iter()
        .find(|s| s.gauge() == value)
    }

    /// The state as the status page names it.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

/// Opens after consecutive failures (errors, deadlines, or slow round trips); after a cooldown
/// one batch goes to Redis as a probe, and its success closes it again.
#[derive(Debug, Default)]
pub(super) struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

impl Breaker {
    pub(super) fn is_closed(&self) -> bool {
        self.open_until.is_none()
    }

    /// The next batch goes as the probe of a breaker that is not closed.
    pub(super) fn probe(&mut self) {
        if !self.is_closed() {
            self.probing = true;
        }
    }

    /// A round trip came back in time: the breaker closes.
    pub(super) fn succeeded(&mut self) {
        *self = Breaker::default();
    }

    /// A round trip failed or was slow: after `threshold` in a row, or a failed probe, the
    /// breaker opens for `cooldown`.
    pub(super) fn failed(&mut self, threshold: u32, cooldown: Duration) {
        self.probing = false;
        self.failures += 1;
        if self.failures >= threshold || self.open_until.is_some() {
            self.open_until = Some(Instant::now() + cooldown);
        }
    }

    /// Whether decisions may go to Redis; reads the clock only while the breaker is open.
    pub(super) fn ready(&self) -> bool {
        match self.open_until {
            None => true,
            Some(t) => !self.probing && Instant::now() >= t,
        }
    }

    pub(super) fn state(&self) -> BreakerState {
        match (self.open_until, self.probing) {
            (None, _) => BreakerState::Closed,
            (Some(_), true) => BreakerState::HalfOpen,
            (Some(_), false) => BreakerState::Open,
        }
    }
}
