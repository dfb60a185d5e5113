//! Per-limit stats, bound to the limits of a config by their stat key: a limit that keeps its
//! stat key across a reload keeps its stats, without copying them from tree to tree.

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

/// The stats of one call's limits, summed before they reach the shared stats: the totals are
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
    /// Adds a call's tally; stats it leaves at zero are not touched.
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

/// Every stat key's stats. Bounded by the configs: binding a new config keeps the stats of
/// the stat keys it still has, and once the config it replaced is freed the others are dropped
/// ([`LimitStatsTable::drop_unbound`]).
#[derive(Debug, Default)]
pub struct LimitStatsTable {
    by_key: Mutex<FnvHashMap<Arc<str>, Arc<LimitStats>>>,
}

impl LimitStatsTable {
    /// The stats of every node of `config`: a stat key seen before keeps its stats. The
    /// table grows by the stat keys new to it, in place: a reload does not hold a second one.
    pub fn bind(&self, config: &Config) -> BoundStats {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_node: Vec<Option<Arc<LimitStats>>> = vec![None; config.node_count()];
        config.for_each_node(&mut |n| {
            let stats = by_key.entry(Arc::clone(&n.stat_key)).or_default();
            by_node[n.index] = Some(Arc::clone(stats));
        });
        BoundStats {
            by_node: by_node.into_iter().map(Option::unwrap_or_default).collect(),
        }
    }

    /// Drops the stats of the stat keys no bound config has any more: once a reload has
    /// freed the config it replaced, those of the limits it removed.
    pub fn drop_unbound(&self) {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        by_key.retain(|_, stats| Arc::strong_count(stats) > 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadOptions;

    fn config(keys: &[&str]) -> Config {
        let mut yaml = String::from("domain: d\ndescriptors:\n");
        for k in keys {
            yaml.push_str(&format!(
                "  - key: {k}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        }
        Config::from_sources(&[("a.yaml".into(), yaml)], LoadOptions::default()).unwrap()
    }

    fn hits(c: &Config, bound: &BoundStats, key: &str) -> u64 {
        let mut found = None;
        c.for_each_node(&mut |n| {
            if &*n.stat_key == key {
                found = Some(bound.of(n).total_hits.load(Ordering::Relaxed));
            }
        });
        found.unwrap()
    }

    fn count(c: &Config, bound: &BoundStats, key: &str, n: u64) {
        c.for_each_node(&mut |node| {
            if &*node.stat_key == key {
                bound.of(node).add(n, false, 0, 0, false);
            }
        });
    }

    #[test]
    fn a_reload_keeps_the_counters_of_kept_limits_and_drops_the_rest_once_freed() {
        let table = LimitStatsTable::default();
        let c1 = config(&["a", "b"]);
        let b1 = table.bind(&c1);
        count(&c1, &b1, "d.a", 3);
        count(&c1, &b1, "d.b", 5);
        let c2 = config(&["a", "c"]);
        let b2 = table.bind(&c2);
        assert_eq!(hits(&c2, &b2, "d.a"), 3, "a kept limit keeps its counters");
        assert_eq!(hits(&c2, &b2, "d.c"), 0);
        table.drop_unbound();
        assert_eq!(
            table.by_key.lock().unwrap().len(),
            3,
            "the replaced config is still held"
        );
        drop(b1);
        table.drop_unbound();
        assert_eq!(
            table.by_key.lock().unwrap().len(),
            2,
            "d.b's counters are dropped"
        );
        let b3 = table.bind(&c1);
        assert_eq!(
            hits(&c1, &b3, "d.b"),
            0,
            "a limit added back starts from zero"
        );
        assert_eq!(hits(&c1, &b3, "d.a"), 3);
    }
}
