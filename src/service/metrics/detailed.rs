//! `detailed_metric`: one stats series per request value, in a map with a cap on its size.
//!
//! A lookup of an existing series takes a read lock and builds its name in a reused
//! thread-local buffer, so a steady stream of known values allocates nothing; only a new
//! series allocates. Once `cap` series exist, further values of a domain share one `_other`
//! series and are counted in `overflow`, so a client sending random values cannot grow memory.

use std::cell::RefCell;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hashbrown::HashTable;

use super::LimitStats;

/// Separates the domain from the descriptor path inside a series key; cannot occur in YAML keys.
const SEP: char = '\u{1}';
/// The descriptor label of the series that values beyond the cap share.
pub const OTHER: &str = "_other";

struct Series {
    key: Box<str>,
    hash: u64,
    stats: Arc<LimitStats>,
}

impl Series {
    fn split(&self) -> (&str, &str) {
        self.key.split_once(SEP).unwrap_or((&self.key, ""))
    }
}

/// The per-value series of `detailed_metric` descriptors.
pub struct DetailedSeries {
    cap: usize,
    table: RwLock<HashTable<Series>>,
    /// Observations that found the map full and went to their domain's `_other` series.
    pub overflow: AtomicU64,
}

impl std::fmt::Debug for DetailedSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetailedSeries")
            .field("cap", &self.cap)
            .field("len", &self.len())
            .finish()
    }
}

thread_local! {
    static KEY: RefCell<String> = RefCell::new(String::with_capacity(256));
}

fn hash(key: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(key.as_bytes());
    h.finish()
}

impl DetailedSeries {
    pub fn new(cap: usize) -> DetailedSeries {
        DetailedSeries {
            cap,
            table: RwLock::new(HashTable::new()),
            overflow: AtomicU64::new(0),
        }
    }

    pub fn len(&self) -> usize {
        self.table.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the stats of the series `domain` + `path` (its name after the domain).
    pub fn with_path(&self, domain: &str, path: &str, f: impl Fn(&LimitStats)) {
        KEY.with(|buf| {
            let mut key = buf.borrow_mut();
            key.clear();
            key.push_str(domain);
            key.push(SEP);
            key.push_str(path);
            self.with_key(&key, domain, f);
        });
    }

    fn with_key(&self, key: &str, domain: &str, f: impl Fn(&LimitStats)) {
        let h = hash(key);
        {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = table.find(h, |s| &*s.key == key) {
                f(&s.stats);
                return;
            }
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = table.find(h, |s| &*s.key == key) {
            f(&s.stats);
            return;
        }
        let (key, h) = if table.len() < self.cap {
            (key.to_owned(), h)
        } else {
            self.overflow.fetch_add(1, Ordering::Relaxed);
            let other = format!("{domain}{SEP}{OTHER}");
            let oh = hash(&other);
            if let Some(s) = table.find(oh, |s| *s.key == *other) {
                f(&s.stats);
                return;
            }
            (other, oh)
        };
        let stats = Arc::new(LimitStats::default());
        f(&stats);
        table.insert_unique(
            h,
            Series {
                key: key.into_boxed_str(),
                hash: h,
                stats,
            },
            |s| s.hash,
        );
    }

    /// (domain, descriptor path, stats) of every series, sorted.
    pub fn snapshot(&self) -> Vec<(String, String, Arc<LimitStats>)> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = table
            .iter()
            .map(|s| {
                let (d, p) = s.split();
                (d.to_owned(), p.to_owned(), s.stats.clone())
            })
            .collect();
        drop(table);
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_named_by_their_path_and_the_cap_holds() {
        let d = DetailedSeries::new(2);
        let add = |s: &LimitStats| {
            s.total_hits.fetch_add(1, Ordering::Relaxed);
        };
        d.with_path("dom", "k_a.sub_x", add);
        d.with_path("dom", "k_a.sub_x", add);
        d.with_path("dom", "k_b.sub", add);
        // Full: a third value goes to `_other`, twice.
        d.with_path("dom", "k_c", add);
        d.with_path("dom", "k_d", add);
        let snap: Vec<_> = d
            .snapshot()
            .into_iter()
            .map(|(d, p, s)| (d, p, s.total_hits.load(Ordering::Relaxed)))
            .collect();
        assert_eq!(
            snap,
            vec![
                ("dom".into(), "_other".into(), 2),
                ("dom".into(), "k_a.sub_x".into(), 2),
                ("dom".into(), "k_b.sub".into(), 1),
            ]
        );
        assert_eq!(d.overflow.load(Ordering::Relaxed), 2);
    }
}
