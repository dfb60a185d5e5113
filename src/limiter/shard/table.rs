//! A shard's keys and their states, laid out for memory: the entries sit densely in one `Vec`
//! (32 bytes each), the keys' bytes one after another in one `String`, and a hash index maps a
//! key to its entry with 4 bytes per bucket.
//!
//! A `HashTable<KeyRow>` would hold the entries in its buckets, which it keeps 44-88 % full, so a
//! key would cost its entry twice over just after the table doubles. Here only the 5-byte index
//! buckets have that slack, and the spare capacity of the `Vec` and the `String` is never
//! written, so it costs no resident memory. A key costs its length (no allocation of its own);
//! keys of dropped entries stay in the arena as garbage until it is compacted, which happens
//! once garbage outweighs the live keys.

use hashbrown::HashTable;

use crate::limiter::algorithm::State;

/// One key's state.
pub(super) struct KeyRow {
    /// Where the key's bytes are in the arena.
    key_at: u32,
    /// The key's length, and in the top bit ([`CHANGED`]) whether the entry changed since the
    /// durable counters last saved it.
    key_len: u32,
    pub(super) state: State,
    /// Whole seconds since the Unix epoch at or after which `state` stops mattering; the sweep
    /// drops the entry then (unless the key has waiters).
    pub(super) expires_s: u32,
    /// The low half of the key's FNV-1a hash, so the index can rehash and remove without
    /// hashing the key again.
    hash32: u32,
}

const _: () = assert!(std::mem::size_of::<KeyRow>() == 32);

/// The bit of `KeyRow::key_len` set by every change to an entry (a new key, a new state) and
/// cleared when the entry is saved (`Table::save`), so a save writes only what changed.
const CHANGED: u32 = 1 << 31;

impl KeyRow {
    fn len(&self) -> usize {
        (self.key_len & !CHANGED) as usize
    }
}

/// Garbage below this is never worth a compaction.
const MIN_GARBAGE: usize = 1 << 16;

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
    entries: Vec<KeyRow>,
    /// Every entry's key, back to back (and the keys of dropped entries until compaction).
    keys: String,
    /// Bytes of `keys` that belong to no entry.
    garbage: usize,
    /// A save of every entry, page by page, has reached here: an entry that moves below it
    /// before the save ends is marked changed, so the save's last pass (what changed) finds it.
    saving_from: Option<usize>,
}

/// A key's bytes in the arena (keys are whole `str`s, so their bounds are char boundaries).
fn key_of<'a>(keys: &'a str, e: &KeyRow) -> &'a str {
    &keys[e.key_at as usize..e.key_at as usize + e.len()]
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every key with its entry.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &KeyRow)> {
        self.entries.iter().map(|e| (key_of(&self.keys, e), e))
    }

    /// Bytes the arena holds, live keys and garbage.
    #[cfg(test)]
    fn arena_len(&self) -> usize {
        self.keys.len()
    }

    /// The position of `key` (whose FNV-1a hash is `hash`).
    pub(super) fn find(&self, key: &str, hash: u64) -> Option<usize> {
        let (entries, keys) = (&self.entries, &self.keys);
        self.index
            .find(spread(hash as u32), |&i| {
                let e = &entries[i as usize];
                e.hash32 == hash as u32 && key_of(keys, e) == key
            })
            .map(|&i| i as usize)
    }

    pub(super) fn get(&self, at: usize) -> &KeyRow {
        &self.entries[at]
    }

    /// The entry at `at`, to change: marked changed for the next save.
    pub(super) fn get_mut(&mut self, at: usize) -> &mut KeyRow {
        let e = &mut self.entries[at];
        e.key_len |= CHANGED;
        e
    }

    /// One page of a save, from position `from`: hands `save` each entry changed since it
    /// was last saved (every entry when `all`) until it has handed `max` or looked at `8 × max`
    /// entries (a save of what changed reads the whole table), and marks them saved.
    /// Answers where the next page starts, `None` when the table is done. Between the pages of
    /// a save of every entry, an entry moved from a page to come into one already read is
    /// marked changed, so it is not missed by a save of what changed that follows.
    pub(super) fn save(
        &mut self,
        all: bool,
        from: usize,
        max: usize,
        mut save: impl FnMut(&str, &KeyRow),
    ) -> Option<usize> {
        let keys = &self.keys;
        let mut handed = 0;
        let mut at = from;
        let end = self
            .entries
            .len()
            .min(from.saturating_add(max.saturating_mul(8)));
        while at < end && handed < max {
            let e = &mut self.entries[at];
            if all || e.key_len & CHANGED != 0 {
                e.key_len &= !CHANGED;
                save(key_of(keys, e), e);
                handed += 1;
            }
            at += 1;
        }
        let next = (at < self.entries.len()).then_some(at);
        self.saving_from = next.filter(|_| all);
        next
    }

    /// An entry moved from `from` to `to`: marked changed when a save of every entry has read
    /// `to`'s page but not yet `from`'s.
    fn moved(&mut self, from: usize, to: usize) {
        if self.saving_from.is_some_and(|c| to < c && from >= c) {
            self.entries[to].key_len |= CHANGED;
        }
    }

    /// Adds a key that is not in the table; returns its position. `None` when the arena cannot
    /// take the key even after compaction (4 GiB of keys in one shard): the caller makes room.
    pub(super) fn insert(
        &mut self,
        key: &str,
        hash: u64,
        state: State,
        expires_s: u32,
    ) -> Option<usize> {
        if key.len() >= CHANGED as usize {
            return None;
        }
        let fits = |t: &Table| u32::try_from(t.keys.len() + key.len()).is_ok();
        if !fits(self) {
            self.compact();
            if !fits(self) {
                return None;
            }
        }
        let at = self.entries.len();
        let pos = u32::try_from(at).ok()?;
        let key_at = self.keys.len() as u32;
        self.keys.push_str(key);
        self.entries.push(KeyRow {
            key_at,
            key_len: key.len() as u32 | CHANGED,
            state,
            expires_s,
            hash32: hash as u32,
        });
        let entries = &self.entries;
        self.index.insert_unique(spread(hash as u32), pos, |&i| {
            spread(entries[i as usize].hash32)
        });
        Some(at)
    }

    /// Keeps the entries for which `keep(key, entry)` says so; positions of kept entries may
    /// change.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str, &KeyRow) -> bool) -> usize {
        let gone: Vec<usize> = (0..self.entries.len())
            .filter(|&i| !keep(key_of(&self.keys, &self.entries[i]), &self.entries[i]))
            .collect();
        if gone.is_empty() {
            return 0;
        }
        self.garbage += gone.iter().map(|&i| self.entries[i].len()).sum::<usize>();
        if gone.len() * 8 > self.entries.len() {
            // Many at once: compact, then index afresh (cheaper than fixing each move).
            let mut i = 0;
            let mut kept = 0;
            let mut g = gone.iter().peekable();
            let saving_from = self.saving_from;
            self.entries.retain_mut(|e| {
                let drop = g.next_if_eq(&&i).is_some();
                if !drop {
                    if saving_from.is_some_and(|c| kept < c && i >= c) {
                        e.key_len |= CHANGED;
                    }
                    kept += 1;
                }
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
        if self.garbage > MIN_GARBAGE && self.garbage > self.keys.len() / 2 {
            self.compact();
        }
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
            let entries = &self.entries;
            self.index
                .shrink_to(entries.len() * 2, |&i| spread(entries[i as usize].hash32));
        }
        gone.len()
    }

    /// Drops `key`'s entry; whether it had one.
    pub(super) fn forget(&mut self, key: &str, hash: u64) -> bool {
        let Some(at) = self.find(key, hash) else {
            return false;
        };
        self.garbage += self.entries[at].len();
        self.remove(at);
        true
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
            self.moved(last as usize, at);
        }
    }

    /// Copies the live keys into a fresh arena, leaving the garbage behind.
    fn compact(&mut self) {
        if self.garbage == 0 {
            return;
        }
        let mut keys = String::with_capacity(self.keys.len() - self.garbage);
        for e in self.entries.iter_mut() {
            let at = keys.len() as u32;
            keys.push_str(key_of(&self.keys, e));
            e.key_at = at;
        }
        self.keys = keys;
        self.garbage = 0;
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
    use crate::limiter::key::key_hash;

    fn state(n: u32) -> State {
        State::Gcra { tat: u64::from(n) }
    }

    fn check(t: &Table, model: &HashMap<String, u32>) {
        assert_eq!(t.len(), model.len());
        for (k, v) in model {
            let at = t.find(k, key_hash(k)).unwrap_or_else(|| panic!("{k} lost"));
            assert_eq!(t.get(at).state, state(*v));
        }
        let mut keys: Vec<&str> = t.iter().map(|(k, _)| k).collect();
        keys.sort_unstable();
        let mut want: Vec<&str> = model.keys().map(String::as_str).collect();
        want.sort_unstable();
        assert_eq!(keys, want);
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
                            t.insert(&key, h, state(n as u32), 0).expect("room");
                        }
                    },
                    // Drops keys ending like this one: a few, or many at once.
                    2 => {
                        let m = k % 7;
                        t.retain(|key, _| !key.ends_with(&format!("{m}_")));
                        model.retain(|key, _| !key.ends_with(&format!("{m}_")));
                        continue;
                    }
                    _ => {
                        t.retain(|k, _| k != key);
                        model.remove(&key);
                        continue;
                    }
                }
                model.insert(key, n as u32);
            }
            check(&t, &model);
        }
    }

    proptest! {
        /// A save of every entry in pages, with the table changing between pages (new keys,
        /// new states, removals one at a time and in bulk, which move entries), followed by a
        /// save of what changed, holds every live key at its state: read in order, later
        /// records over earlier ones, as a start reads a snapshot.
        #[test]
        fn a_paged_save_and_its_last_pass_miss_nothing(
            first in 1u16..300,
            between in prop::collection::vec((0u8..4, 0u16..300), 0..300),
            page in 1usize..40,
        ) {
            let mut t = Table::default();
            let mut model: HashMap<String, u32> = HashMap::new();
            for k in 0..first {
                let key = format!("d_k_{k}_");
                t.insert(&key, key_hash(&key), state(u32::from(k)), 0).expect("room");
                model.insert(key, u32::from(k));
            }
            // An earlier save read them all: no entry is marked changed now.
            prop_assert_eq!(t.save(false, 0, usize::MAX, |_, _| {}), None);
            let mut read: HashMap<String, State> = HashMap::new();
            let mut keep = |k: &str, e: &KeyRow| {
                read.insert(k.to_owned(), e.state);
            };
            let mut from = Some(0);
            let mut changes = between.into_iter().enumerate();
            while let Some(at) = from {
                from = t.save(true, at, page, &mut keep);
                // A few changes between two pages.
                for (n, (kind, k)) in changes.by_ref().take(3) {
                    let key = format!("d_k_{k}_");
                    let h = key_hash(&key);
                    let v = 1000 + n as u32;
                    match kind {
                        0 | 1 => {
                            match t.find(&key, h) {
                                Some(at) => t.get_mut(at).state = state(v),
                                None => {
                                    t.insert(&key, h, state(v), 0).expect("room");
                                }
                            }
                            model.insert(key, v);
                        }
                        2 => {
                            let m = k % 3;
                            t.retain(|key, _| !key.ends_with(&format!("{m}_")));
                            model.retain(|key, _| !key.ends_with(&format!("{m}_")));
                        }
                        _ => {
                            t.forget(&key, h);
                            model.remove(&key);
                        }
                    }
                }
            }
            let mut from = Some(0);
            while let Some(at) = from {
                from = t.save(false, at, page, &mut keep);
            }
            for (k, v) in &model {
                prop_assert_eq!(read.get(k), Some(&state(*v)), "{} missed", k);
            }
        }
    }

    /// Keys of dropped entries are reclaimed once they outweigh the live ones.
    #[test]
    fn the_arena_is_compacted_as_keys_go() {
        let mut t = Table::default();
        let key = |i: u32| format!("domain_api_key_user-{i:07}_");
        for i in 0..100_000 {
            let k = key(i);
            t.insert(&k, key_hash(&k), state(i), 0).expect("room");
        }
        let full = t.arena_len();
        assert_eq!(full, 100_000 * key(0).len());
        // Drop three keys in four: the arena shrinks to the live keys.
        t.retain(|_, e| {
            e.state.eq(&state(0)) || matches!(e.state, State::Gcra { tat } if tat % 4 == 0)
        });
        assert_eq!(t.len(), 25_000);
        assert_eq!(t.arena_len(), 25_000 * key(0).len());
        for i in (0..100_000).step_by(4) {
            let k = key(i);
            let at = t.find(&k, key_hash(&k)).expect("kept");
            assert_eq!(t.get(at).state, state(i));
        }
        assert!(t.find(&key(1), key_hash(&key(1))).is_none());
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
