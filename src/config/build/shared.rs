//! What a config holds once however many nodes name it, and what a reload's new config takes
//! from the config being served: keys, stat keys and lists of limits equal in both are held
//! once, and a level is sized as its counterpart is, so while a reload builds a config beside
//! the live one the process holds less than two whole configs.

use std::fmt;
use std::sync::Arc;

use fnv::FnvHashSet;

use crate::config::{Config, Level, Node, RateLimit};

/// The config being served, as the build of its replacement sees it. The server hands it to
/// every source that builds configs; a build without it (the first load, `check`) shares
/// nothing.
#[derive(Clone, Default)]
pub struct LiveConfig(Option<Arc<LiveConfigFn>>);

type LiveConfigFn = dyn Fn() -> Arc<dyn AsRef<Config> + Send + Sync> + Send + Sync;

impl LiveConfig {
    /// A handle that reads the config being served from `now` at each build.
    pub fn new(
        now: impl Fn() -> Arc<dyn AsRef<Config> + Send + Sync> + Send + Sync + 'static,
    ) -> Self {
        LiveConfig(Some(Arc::new(now)))
    }

    /// The config served now, held for one build.
    pub(in crate::config) fn now(&self) -> Option<Arc<dyn AsRef<Config> + Send + Sync>> {
        self.0.as_ref().map(|now| now())
    }
}

impl fmt::Debug for LiveConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "LiveConfig(live)"
        } else {
            "LiveConfig(none)"
        })
    }
}

/// How many distinct keys, and distinct lists of limits, one build interns: a config names a
/// few of each (a key per descriptor level, a list per plan or tier); past these, new ones are
/// held by their nodes alone, so the build's tables stay small whatever the config.
const MAX_INTERNED: usize = 4096;

/// One build's interned keys and lists of limits.
#[derive(Default)]
pub(in crate::config) struct Interned {
    keys: FnvHashSet<Arc<str>>,
    limits: FnvHashSet<Arc<[RateLimit]>>,
}

impl Interned {
    /// The build's one copy of `key`.
    pub(in crate::config) fn key(&mut self, key: &str) -> Arc<str> {
        if let Some(k) = self.keys.get(key) {
            return Arc::clone(k);
        }
        let k: Arc<str> = key.into();
        if self.keys.len() < MAX_INTERNED {
            self.keys.insert(Arc::clone(&k));
        }
        k
    }

    /// The build's one copy of `list`, the served node's if it has the same.
    pub(in crate::config) fn limits(
        &mut self,
        list: Vec<RateLimit>,
        served: Option<&Node>,
    ) -> Arc<[RateLimit]> {
        if let Some(l) = self.limits.get(list.as_slice()) {
            return Arc::clone(l);
        }
        let l = match served {
            Some(n) if *n.limits == *list => Arc::clone(&n.limits),
            _ => Arc::from(list),
        };
        if self.limits.len() < MAX_INTERNED {
            self.limits.insert(Arc::clone(&l));
        }
        l
    }
}

/// `stat_key`, the served node's copy if it has the same.
pub(in crate::config) fn stat_key(stat_key: String, served: Option<&Node>) -> Arc<str> {
    match served {
        Some(n) if *n.stat_key == *stat_key => Arc::clone(&n.stat_key),
        _ => stat_key.into(),
    }
}

/// The node of the served level `level` that a new node of `key` and `value` replaces: the same
/// key and value, or the key-only node; a pattern, the one at the same place in its key's list
/// (`pattern_at`) if it is the same text.
pub(in crate::config) fn counterpart<'s>(
    level: Option<&'s Level>,
    key: &str,
    value: Option<&str>,
    pattern_at: usize,
) -> Option<&'s Node> {
    let group = level?.group(key)?;
    match value {
        None => group.default.as_deref(),
        Some(v) if v.contains('*') => (group.wildcards.iter().as_slice().get(pattern_at))
            .filter(|n| n.value.as_deref() == Some(v)),
        Some(v) => group.exact.get(v),
    }
}
