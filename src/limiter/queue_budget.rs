//! The process-wide cap on queued requests (`TURNSTILE_MAX_WAITERS`), one count shared by every
//! shard: waiters gather on hot keys, so a per-shard share of the cap would turn them away while
//! the process holds few.

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub(crate) struct QueueBudget {
    cap: usize,
    taken: AtomicUsize,
}

impl QueueBudget {
    pub(crate) fn new(cap: usize) -> QueueBudget {
        QueueBudget {
            cap,
            taken: AtomicUsize::new(0),
        }
    }

    /// Takes a place for one more waiter, if there is one: exact under concurrency (a
    /// compare-and-swap), so the process never holds more than `cap`.
    pub(crate) fn try_take(&self) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }

    /// A waiter left its queue (answered, timed out, cancelled or drained).
    pub(crate) fn free(&self) {
        let _ = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_holds_across_threads() {
        let b = std::sync::Arc::new(QueueBudget::new(1000));
        let taken: usize = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..500).filter(|_| b.try_take()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(taken, 1000);
        b.free();
        assert!(b.try_take());
        assert!(!b.try_take());
    }
}
