//! GoCC's sticky overrides: `maxRequests` / `maxRequestsInQueue` reconfigure the key for every
//! later caller (kivra/GoCC `pkg/limiter/limiter_instance/limiter_instance.go:153-159` writes
//! them into the key's config), until the key expires, idle for more than three windows
//! (`limiter_instance.go:85-89`), or the config file is reloaded (`limiter_manager.go:266-272`
//! sends every key its merged config again).
//!
//! Here: one bounded table per process; a new live config (any reload) clears it; an entry idle
//! for more than three of its key's windows is gone. When full, expired entries are swept and
//! then the least recently used gives way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::service::Live;

/// Keys with overrides held at once (each a few dozen bytes plus its key).
pub const MAX_STICKY_KEYS: usize = 100_000;

/// A key's overrides; `None` where none was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GoccOverrides {
    pub max_requests: Option<u32>,
    pub max_in_queue: Option<u32>,
}

#[derive(Debug)]
struct StickyKey {
    set: GoccOverrides,
    last_used_ns: u64,
    window_ns: u64,
}

impl StickyKey {
    fn expired(&self, now: u64) -> bool {
        now.saturating_sub(self.last_used_ns) > self.window_ns.saturating_mul(3)
    }
}

#[derive(Debug, Default)]
struct StickyTable {
    /// The config the entries were set under; another one live means a reload happened. Held,
    /// so its address cannot be reused by a later config.
    live: Option<Arc<Live>>,
    keys: HashMap<String, StickyKey>,
}

/// The process's sticky overrides.
#[derive(Debug)]
pub struct Sticky {
    table: Mutex<StickyTable>,
    cap: usize,
}

impl Default for Sticky {
    fn default() -> Sticky {
        Sticky::with_capacity(MAX_STICKY_KEYS)
    }
}

impl Sticky {
    pub fn with_capacity(cap: usize) -> Sticky {
        Sticky {
            table: Mutex::new(StickyTable::default()),
            cap: cap.max(1),
        }
    }

    /// A use of `key` at `now` under `live`: records what `set` gives (over what was set
    /// before), refreshes the key's last use, and returns its overrides now.
    pub fn touch(
        &self,
        live: &Arc<Live>,
        key: &str,
        now: u64,
        window_ns: u64,
        set: GoccOverrides,
    ) -> GoccOverrides {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if !t.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
            t.keys.clear();
            t.live = Some(live.clone());
        }
        if t.keys.get(key).is_some_and(|e| e.expired(now)) {
            t.keys.remove(key);
        }
        let given = set.max_requests.is_some() || set.max_in_queue.is_some();
        if given && !t.keys.contains_key(key) {
            make_room(&mut t.keys, self.cap, now);
            let fresh = StickyKey {
                set: GoccOverrides::default(),
                last_used_ns: now,
                window_ns,
            };
            t.keys.insert(key.to_owned(), fresh);
        }
        let Some(e) = t.keys.get_mut(key) else {
            return GoccOverrides::default();
        };
        e.set.max_requests = set.max_requests.or(e.set.max_requests);
        e.set.max_in_queue = set.max_in_queue.or(e.set.max_in_queue);
        e.last_used_ns = now;
        e.window_ns = window_ns;
        e.set
    }

    /// `key`'s overrides under `live` at `now`, without counting it as a use (`/debug`).
    pub fn peek(&self, live: &Arc<Live>, key: &str, now: u64) -> GoccOverrides {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if !t.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
            return GoccOverrides::default();
        }
        (t.keys.get(key))
            .filter(|e| !e.expired(now))
            .map_or_else(GoccOverrides::default, |e| e.set)
    }
}

/// Below `cap` entries: the expired ones go, then the least recently used.
fn make_room(keys: &mut HashMap<String, StickyKey>, cap: usize, now: u64) {
    if keys.len() < cap {
        return;
    }
    keys.retain(|_, e| !e.expired(now));
    while keys.len() >= cap {
        let oldest = (keys.iter())
            .min_by_key(|(_, e)| e.last_used_ns)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => keys.remove(&k),
            None => return,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000_000_000;

    fn set(r: Option<u32>, q: Option<u32>) -> GoccOverrides {
        GoccOverrides {
            max_requests: r,
            max_in_queue: q,
        }
    }

    #[test]
    fn sticky_until_idle_three_windows_or_a_reload() {
        let s = Sticky::default();
        let live = Arc::new(Live::default());
        assert_eq!(
            s.touch(&live, "k", 0, W, set(Some(5), None)),
            set(Some(5), None)
        );
        assert_eq!(
            s.touch(&live, "k", W, W, set(None, Some(0))),
            set(Some(5), Some(0))
        );
        // Used at 3 windows: still there; then idle past 3 windows: gone.
        assert_eq!(
            s.touch(&live, "k", 4 * W, W, GoccOverrides::default())
                .max_requests,
            Some(5)
        );
        assert_eq!(s.peek(&live, "k", 7 * W).max_requests, Some(5));
        assert_eq!(
            s.touch(&live, "k", 7 * W + 1, W, GoccOverrides::default()),
            GoccOverrides::default()
        );
        s.touch(&live, "k", 8 * W, W, set(Some(9), None));
        let reloaded = Arc::new(Live::default());
        assert_eq!(
            s.touch(&reloaded, "k", 8 * W, W, GoccOverrides::default()),
            GoccOverrides::default()
        );
    }

    #[test]
    fn bounded_evicting_the_least_recently_used() {
        let s = Sticky::with_capacity(2);
        let live = Arc::new(Live::default());
        s.touch(&live, "a", 0, W, set(Some(1), None));
        s.touch(&live, "b", 1, W, set(Some(2), None));
        s.touch(&live, "a", 2, W, GoccOverrides::default());
        s.touch(&live, "c", 3, W, set(Some(3), None));
        assert_eq!(
            s.peek(&live, "b", 3),
            GoccOverrides::default(),
            "b was used least recently"
        );
        assert_eq!(s.peek(&live, "a", 3).max_requests, Some(1));
        assert_eq!(s.peek(&live, "c", 3).max_requests, Some(3));
    }
}
