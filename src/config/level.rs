//! One depth of the limit tree: its nodes grouped by descriptor key, each group holding the
//! exact values, the wildcard patterns in file order and the key-only default.

use std::sync::Arc;

use fnv::FnvHashMap;

use super::{Exact, Node, Wildcards};

/// A level with more keys than this gets a map from key to group while it is built.
const SCAN_KEYS: usize = 16;

/// The nodes of one depth, grouped by key. A built level keeps its groups in a slice sorted by
/// key, searched in halves: most levels have one or two keys, and a map's spare buckets would
/// cost more than the nodes. While a level is built its groups come in file order, found by a
/// scan, or through a map once there are many, so a level of any width builds in linear time.
#[derive(Debug, Default)]
pub struct Level {
    groups: Vec<KeyGroup>,
    /// While building a level of many keys: each key's place in `groups`.
    building: Option<Box<FnvHashMap<Arc<str>, usize>>>,
}

/// The nodes of one key at one level.
#[derive(Debug)]
pub(crate) struct KeyGroup {
    pub(crate) key: Arc<str>,
    pub(crate) exact: Exact,
    /// In file order: the first matching pattern wins.
    pub(crate) wildcards: Wildcards,
    pub(crate) default: Option<Box<Node>>,
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The group of `key` in a built level.
    pub(crate) fn group(&self, key: &str) -> Option<&KeyGroup> {
        let at = (self.groups).binary_search_by(|g| (*g.key).cmp(key)).ok()?;
        Some(&self.groups[at])
    }

    /// The group of `key` while the level is built, made if it is new.
    pub(crate) fn group_to_fill(&mut self, key: &Arc<str>) -> &mut KeyGroup {
        let found = match &self.building {
            Some(map) => map.get(&**key).copied(),
            None => self.groups.iter().position(|g| g.key == *key),
        };
        let at = match found {
            Some(at) => at,
            None => {
                // Most levels have one key: growing by doubling would hold room for four in
                // each while the whole config is built, more than the nodes themselves.
                if self.groups.len() < SCAN_KEYS {
                    self.groups.reserve_exact(1);
                }
                self.groups.push(KeyGroup {
                    key: Arc::clone(key),
                    exact: Exact::default(),
                    wildcards: Wildcards::default(),
                    default: None,
                });
                let at = self.groups.len() - 1;
                if let Some(map) = &mut self.building {
                    map.insert(Arc::clone(key), at);
                } else if self.groups.len() > SCAN_KEYS {
                    let map = (self.groups.iter().enumerate())
                        .map(|(i, g)| (Arc::clone(&g.key), i))
                        .collect();
                    self.building = Some(Box::new(map));
                }
                at
            }
        };
        &mut self.groups[at]
    }

    /// Ends the build of this level and those below: groups sorted by key, the build's map
    /// dropped, every table in the least memory.
    pub(crate) fn finish(&mut self) {
        self.building = None;
        self.groups.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        self.groups.shrink_to_fit();
        for g in &mut self.groups {
            g.exact.shrink_to_fit();
            g.wildcards.shrink_to_fit();
            let nodes = (g.exact.values_mut())
                .chain(g.wildcards.iter_mut())
                .chain(g.default.as_deref_mut());
            for n in nodes {
                n.children.finish();
            }
        }
    }

    /// Every group, mutably, in the level's order.
    pub(crate) fn groups_mut(&mut self) -> impl Iterator<Item = &mut KeyGroup> {
        self.groups.iter_mut()
    }

    /// Every node of this level and below, parents before children, in listing order.
    pub fn walk<'c>(&'c self, f: &mut dyn FnMut(&'c Node)) {
        for n in self.nodes() {
            f(n);
            n.children.walk(f);
        }
    }

    /// Every node of this level, by key, exact before wildcard before key-only, for listings.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.groups.iter().flat_map(|g| {
            let mut exact: Vec<&Node> = g.exact.values().collect();
            exact.sort_by(|a, b| a.value.cmp(&b.value));
            exact
                .into_iter()
                .chain(g.wildcards.iter())
                .chain(g.default.as_deref())
        })
    }
}
