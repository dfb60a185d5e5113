//! A shard's keys and their states, laid out for memory: the entries sit densely in one `Vec`
//! (40 bytes each), and a hash index maps a key to its position with 4 bytes per bucket.
//!
//! A `HashTable<Entry>` would hold the entries in its buckets, which it keeps 44-88 % full, so a
//! key would cost its entry twice over just after the table doubles. Here only the 5-byte index
//! buckets have that slack, and the `Vec`'s spare capacity is never written, so it costs no
//! resident memory.

use hashbrown::HashTable;

use crate::limiter::State;

/// One key's state.
pub(super) struct Entry {
    pub(super) key: Box<str>,
    pub(super) state: State,
    /// Whole seconds since the Unix epoch at or after which `state` stops mattering; the sweep
    /// drops the entry then (unless the key has waiters).
    pub(super) expires_s: u32,
    /// The low half of the key's FNV-1a hash, so the index can rehash and remove without
    /// hashing the key again.
    hash32: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 40);

/// The index's hash for a key: its 32 stored bits, spread over 64 (hashbrown takes the bucket
/// from the low bits and a tag from the top 7).
fn spread(hash32: u32) -> u64 {
    u64::from(hash32).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Nanoseconds to the whole second at or after them, as stored in `expires_s`.
pub(super) fn to_secs_ceil(ns: u64) -> u32 {
    u32::try_from(ns.div_ceil(1_000_000_000)).unwrap_or(u32::MAX)
}

#[derive(Default)]
pub(super) struct Table {
    index: HashTable<u32>,
    entries: Vec<Entry>,
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    /// The position of `key` (whose FNV-1a hash is `hash`).
    pub(super) fn find(&self, key: &str, hash: u64) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(spread(hash as u32), |&i| {
                let e = &entries[i as usize];
                e.hash32 == hash as u32 && e.key.as_ref() == key
            })
            .map(|&i| i as usize)
    }

    pub(super) fn get(&self, at: usize) -> &Entry {
        &self.entries[at]
    }

    pub(super) fn get_mut(&mut self, at: usize) -> &mut Entry {
        &mut self.entries[at]
    }

    /// Adds a key that is not in the table; returns its position.
    pub(super) fn insert(&mut self, key: &str, hash: u64, state: State, expires_s: u32) -> usize {
        let at = self.entries.len();
        let pos = u32::try_from(at).expect("a shard holds fewer than 2^32 keys");
        self.entries.push(Entry {
            key: key.into(),
            state,
            expires_s,
            hash32: hash as u32,
        });
        let entries = &self.entries;
        self.index.insert_unique(spread(hash as u32), pos, |&i| {
            spread(entries[i as usize].hash32)
        });
        at
    }

    /// Keeps the entries for which `keep` says so; positions of kept entries may change.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) -> usize {
        let gone: Vec<usize> = (0..self.entries.len())
            .filter(|&i| !keep(&self.entries[i]))
            .collect();
        if gone.is_empty() {
            return 0;
        }
        if gone.len() * 8 > self.entries.len() {
            // Many at once: compact, then index afresh (cheaper than fixing each move).
            let mut i = 0;
            let mut g = gone.iter().peekable();
            self.entries.retain(|_| {
                let drop = g.next_if_eq(&&i).is_some();
                i += 1;
                !drop
            });
            self.reindex();
        } else {
            // From the back, so each entry moved into a hole is one already kept.
            for &at in gone.iter().rev() {
                self.remove(at);
            }
        }
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
            let entries = &self.entries;
            self.index
                .shrink_to(entries.len() * 2, |&i| spread(entries[i as usize].hash32));
        }
        gone.len()
    }

    fn remove(&mut self, at: usize) {
        let pos = at as u32;
        let h = spread(self.entries[at].hash32);
        if let Ok(slot) = self.index.find_entry(h, |&i| i == pos) {
            slot.remove();
        }
        self.entries.swap_remove(at);
        if at < self.entries.len() {
            // The last entry moved into `at`: point its index slot there.
            let last = self.entries.len() as u32;
            let h = spread(self.entries[at].hash32);
            if let Some(slot) = self.index.find_mut(h, |&i| i == last) {
                *slot = pos;
            }
        }
    }

    fn reindex(&mut self) {
        self.index.clear();
        let entries = &self.entries;
        for (i, e) in entries.iter().enumerate() {
            self.index.insert_unique(spread(e.hash32), i as u32, |&j| {
                spread(entries[j as usize].hash32)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::descriptor::key_hash;

    fn state(n: u32) -> State {
        State::Gcra { tat: u64::from(n) }
    }

    fn check(t: &Table, model: &HashMap<String, u32>) {
        assert_eq!(t.len(), model.len());
        for (k, v) in model {
            let at = t.find(k, key_hash(k)).unwrap_or_else(|| panic!("{k} lost"));
            assert_eq!(t.get(at).key.as_ref(), k);
            assert_eq!(t.get(at).state, state(*v));
        }
    }

    proptest! {
        /// Inserts, updates and removals (one at a time and in bulk) agree with a `HashMap`.
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((0u8..4, 0u16..300), 1..600)) {
            let mut t = Table::default();
            let mut model: HashMap<String, u32> = HashMap::new();
            for (n, (kind, k)) in ops.into_iter().enumerate() {
                let key = format!("d_k_{k}_");
                let h = key_hash(&key);
                match kind {
                    0 | 1 => match t.find(&key, h) {
                        Some(at) => t.get_mut(at).state = state(n as u32),
                        None => {
                            t.insert(&key, h, state(n as u32), 0);
                        }
                    },
                    // Drops keys ending like this one: a few, or many at once.
                    2 => {
                        let m = k % 7;
                        t.retain(|e| !e.key.ends_with(&format!("{m}_")));
                        model.retain(|key, _| !key.ends_with(&format!("{m}_")));
                        continue;
                    }
                    _ => {
                        t.retain(|e| e.key.as_ref() != key);
                        model.remove(&key);
                        continue;
                    }
                }
                model.insert(key, n as u32);
            }
            check(&t, &model);
        }
    }

    #[test]
    fn expiry_seconds_round_up_and_saturate() {
        assert_eq!(to_secs_ceil(0), 0);
        assert_eq!(to_secs_ceil(1), 1);
        assert_eq!(to_secs_ceil(1_000_000_000), 1);
        assert_eq!(to_secs_ceil(1_000_000_001), 2);
        assert_eq!(to_secs_ceil(u64::MAX), u32::MAX);
    }
}
