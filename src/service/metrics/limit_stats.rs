//! Per-limit stats, bound to the limits of a config by their stat key: a limit that keeps its
//! stat key across a reload keeps its counters, without copying them from tree to tree.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fnv::FnvHashMap;

use crate::config::{Config, Node};

/// envoyproxy/ratelimit's per-limit stats of one limit (one config node, by its stat key).
#[derive(Debug, Default)]
pub struct LimitStats {
    pub total_hits: AtomicU64,
    pub over_limit: AtomicU64,
    pub near_limit: AtomicU64,
    pub within_limit: AtomicU64,
    pub shadow_mode: AtomicU64,
}

/// The stats of one call's limits, summed before they reach shared counters: the totals are
/// counted once per call, not once per descriptor (each atomic add costs a few nanoseconds).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
}

impl Tally {
    /// `over_hits`: the part of `hits` past the limit, counted when `over` or `shadow`.
    pub(crate) fn add(&mut self, hits: u64, over: bool, over_hits: u64, near: u64, shadow: bool) {
        self.total_hits += hits;
        if over {
            self.over_limit += over_hits;
        } else {
            self.within_limit += hits;
        }
        self.near_limit += near;
        if shadow {
            self.shadow_mode += over_hits;
        }
    }
}

impl LimitStats {
    /// Adds a call's tally; counters it leaves at zero are not touched.
    pub fn add_tally(&self, t: &Tally) {
        let fields = [
            (&self.total_hits, t.total_hits),
            (&self.over_limit, t.over_limit),
            (&self.near_limit, t.near_limit),
            (&self.within_limit, t.within_limit),
            (&self.shadow_mode, t.shadow_mode),
        ];
        for (counter, n) in fields {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// As [`Tally::add`].
    pub(crate) fn add(&self, hits: u64, over: bool, over_hits: u64, near: u64, shadow: bool) {
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
        if over {
            self.over_limit.fetch_add(over_hits, Ordering::Relaxed);
        } else {
            self.within_limit.fetch_add(hits, Ordering::Relaxed);
        }
        if near > 0 {
            self.near_limit.fetch_add(near, Ordering::Relaxed);
        }
        if shadow {
            self.shadow_mode.fetch_add(over_hits, Ordering::Relaxed);
        }
    }

    /// envoyproxy/ratelimit's per-limit stat names (`manager_impl.go:33-38`), in
    /// [`LimitStats::fields`] order: the Prometheus series and the statsd push both name them so.
    pub(crate) const FIELD_NAMES: [&'static str; 5] = [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ];

    pub(crate) fn fields(&self) -> [&AtomicU64; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
    }
}

/// The stats of one config's nodes, by [`Node::index`]: what the hot path counts into.
#[derive(Debug, Default)]
pub struct BoundStats {
    by_node: Box<[Arc<LimitStats>]>,
}

impl BoundStats {
    /// The stats of `node` (a node of the config these were bound to).
    pub fn of(&self, node: &Node) -> &LimitStats {
        &self.by_node[node.index]
    }
}

/// Every stat key's counters. Bounded by the configs: binding a new config keeps the counters of
/// the stat keys it still has and drops the others.
#[derive(Debug, Default)]
pub struct LimitStatsTable {
    by_key: Mutex<FnvHashMap<Arc<str>, Arc<LimitStats>>>,
}

impl LimitStatsTable {
    /// The stats of every node of `config`: a stat key seen before keeps its counters.
    pub fn bind(&self, config: &Config) -> BoundStats {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let mut kept: FnvHashMap<Arc<str>, Arc<LimitStats>> = FnvHashMap::default();
        let mut by_node: Vec<Option<Arc<LimitStats>>> = vec![None; config.node_count()];
        config.for_each_node(&mut |n| {
            let stats = kept
                .entry(Arc::clone(&n.stat_key))
                .or_insert_with(|| by_key.remove(&*n.stat_key).unwrap_or_default())
                .clone();
            by_node[n.index] = Some(stats);
        });
        *by_key = kept;
        BoundStats {
            by_node: by_node.into_iter().map(Option::unwrap_or_default).collect(),
        }
    }
}
