//! Time as a parameter: the system clock in production, a clock tests move by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Nanoseconds since the Unix epoch, from the system or from a test.
#[derive(Debug, Clone)]
pub enum Clock {
    System,
    Manual(Arc<ManualClock>),
}

impl Clock {
    pub fn now(&self) -> u64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            Clock::Manual(m) => m.now.load(Ordering::Acquire),
        }
    }

    /// A receiver that sees every move of a manual clock (never fires for the system clock), so
    /// shard actors re-check their timers when a test moves time.
    pub(crate) fn changes(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Clock::System => None,
            Clock::Manual(m) => Some(m.tx.subscribe()),
        }
    }

    /// A manual clock set to `start_ns`.
    pub fn manual(start_ns: u64) -> (Clock, Arc<ManualClock>) {
        let (tx, _) = watch::channel(start_ns);
        let m = Arc::new(ManualClock {
            now: AtomicU64::new(start_ns),
            tx,
        });
        (Clock::Manual(m.clone()), m)
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
    tx: watch::Sender<u64>,
}

impl ManualClock {
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    pub fn set(&self, ns: u64) {
        self.now.store(ns, Ordering::Release);
        self.tx.send_replace(ns);
    }

    pub fn advance(&self, by: Duration) {
        self.set(self.now() + by.as_nanos() as u64);
    }
}
