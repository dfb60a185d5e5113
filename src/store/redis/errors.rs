//! Redis's own error counter: round trips that failed or were too slow, per connection lane
//! (a lane is a shard's index, so the family is labelled by shard as it always was).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::exposition::{family, Metrics};

/// Failed or slow round trips to Redis, one counter per shard.
#[derive(Debug)]
pub struct RedisErrors {
    lanes: Box<[AtomicU64]>,
}

impl RedisErrors {
    /// A counter for each of `shards` lanes, all at zero.
    pub fn new(shards: usize) -> RedisErrors {
        RedisErrors {
            lanes: (0..shards.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A round trip over `lane` failed or was too slow. A lane past the counters (a shard
    /// count larger than the one given at start) counts in the last.
    pub(super) fn count(&self, lane: usize) {
        let i = lane.min(self.lanes.len() - 1);
        self.lanes[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The errors counted over `lane`.
    pub fn of(&self, lane: usize) -> u64 {
        self.lanes
            .get(lane)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// Rendered in every mode, zeros without Redis: the dashboard's and the alerts' Redis panels
/// read the family whether or not this replica uses Redis.
impl Metrics for RedisErrors {
    fn render(&self, out: &mut String) {
        let name = "ratelimit_service_redis_errors_total";
        family(
            out,
            name,
            "Redis round trips that failed or were too slow.",
            "counter",
        );
        for (i, c) in self.lanes.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {n}");
        }
    }
}
