//! Space-saving (Metwally, Agrawal and El Abbadi, 2005): the heaviest values of a stream in a
//! fixed number of slots. A value not yet tracked, arriving at a full table, takes the slot of
//! the lightest one and inherits its count as an overestimate (`error`), so any value whose
//! true weight exceeds total / capacity is always tracked, whatever the number of distinct
//! values.
//!
//! Values are byte strings the caller hands over in pieces ([`Pieces`]), hashed and compared
//! piece by piece: a value already tracked is counted without being joined or allocated. A
//! new value reuses the buffer of the slot it takes. Values longer than [`MAX_VALUE_BYTES`] are
//! cut there, and values that share those bytes are counted together.

use std::hash::Hasher;

use hashbrown::HashTable;

/// Bytes of a value kept and compared: bounds the memory a slot holds.
pub const MAX_VALUE_BYTES: usize = 256;

/// A value given as pieces: `pieces` calls `f` with each piece in order until `f` says stop.
pub(crate) trait Pieces {
    fn pieces(&self, f: &mut dyn FnMut(&[u8]) -> bool);
}

impl Pieces for str {
    fn pieces(&self, f: &mut dyn FnMut(&[u8]) -> bool) {
        f(self.as_bytes());
    }
}

/// The pieces of `key`, cut at [`MAX_VALUE_BYTES`] in all.
fn cut_pieces(key: &(impl Pieces + ?Sized), f: &mut dyn FnMut(&[u8]) -> bool) {
    let mut left = MAX_VALUE_BYTES;
    key.pieces(&mut |p| {
        let p = &p[..p.len().min(left)];
        left -= p.len();
        f(p) && left > 0
    });
}

/// foldhash over the (cut) pieces of `key` (fixed seed: a value always picks the same stripe).
/// The hash depends on where the pieces break, not only on their bytes: a key type always
/// breaks a value the same way, and two that render the same bytes differently only end up in
/// two slots, which a reader merges by value.
pub(crate) fn hash(key: &(impl Pieces + ?Sized)) -> u64 {
    use std::hash::BuildHasher;
    let mut h = foldhash::fast::FixedState::with_seed(0x7475_726e_7374_696c).build_hasher();
    cut_pieces(key, &mut |p| {
        h.write(p);
        true
    });
    h.finish()
}

/// Whether the (cut) bytes of `key` are `stored`.
fn same(key: &(impl Pieces + ?Sized), stored: &[u8]) -> bool {
    let mut at = 0;
    let mut equal = true;
    cut_pieces(key, &mut |p| {
        equal = stored.get(at..at + p.len()) == Some(p);
        at += p.len();
        equal
    });
    equal && at == stored.len()
}

/// One tracked value and its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) value: Vec<u8>,
    hash: u64,
    /// The ranked count; above the true count by at most `error`.
    pub(crate) weight: u64,
    /// The count of the value this one replaced when it took the slot (0: exact).
    pub(crate) error: u64,
    /// The other count kept alongside (hits in the over-limit table, over-limit in the hits
    /// table), since the value took the slot.
    pub(crate) other: u64,
    /// Coarse seconds of the first and last update since the value took the slot.
    pub(crate) first_s: u64,
    pub(crate) last_s: u64,
}

/// The table: at most `cap` slots, found by hash.
#[derive(Debug)]
pub(crate) struct SpaceSaving {
    cap: usize,
    slots: Vec<Slot>,
    /// Index into `slots`, by the slot's hash.
    index: HashTable<u32>,
}

impl SpaceSaving {
    /// An empty table; it allocates on its first value.
    pub(crate) fn new(cap: usize) -> SpaceSaving {
        SpaceSaving {
            cap: cap.max(1),
            slots: Vec::new(),
            index: HashTable::new(),
        }
    }

    pub(crate) fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Bytes the table holds: its slots, their values and their hash index. Slots and index
    /// are sized on the first value and never grow (the index has room for twice the slots,
    /// so the tombstones evictions leave are cleaned by rehashing in place, not by growing);
    /// a value holds at most twice [`MAX_VALUE_BYTES`].
    pub(crate) fn allocated_bytes(&self) -> usize {
        let values: usize = self.slots.iter().map(|s| s.value.capacity()).sum();
        self.slots.capacity() * std::mem::size_of::<Slot>() + values + self.index.allocation_size()
    }

    /// The most [`SpaceSaving::allocated_bytes`] can be for a table of `cap` slots.
    #[cfg(test)]
    pub(crate) fn max_bytes(cap: usize) -> usize {
        let buckets = (2 * cap * 8 / 7 + 1).next_power_of_two();
        let index = buckets * (std::mem::size_of::<u32>() + 1) + 16;
        cap * (std::mem::size_of::<Slot>() + 2 * MAX_VALUE_BYTES) + index
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.index.clear();
    }

    fn find(&self, h: u64, key: &(impl Pieces + ?Sized)) -> Option<usize> {
        let slots = &self.slots;
        (self.index)
            .find(h, |&i| {
                let s = &slots[i as usize];
                s.hash == h && same(key, &s.value)
            })
            .map(|&i| i as usize)
    }

    /// Counts `weight` and `other` for a value already tracked; false when it is not.
    pub(crate) fn bump(
        &mut self,
        h: u64,
        key: &(impl Pieces + ?Sized),
        weight: u64,
        other: u64,
        now_s: u64,
    ) -> bool {
        let Some(i) = self.find(h, key) else {
            return false;
        };
        let s = &mut self.slots[i];
        s.weight += weight;
        s.other += other;
        s.last_s = now_s;
        true
    }

    /// Counts `weight` and `other` for the value, taking a slot for it if it has none.
    pub(crate) fn offer(
        &mut self,
        h: u64,
        key: &(impl Pieces + ?Sized),
        weight: u64,
        other: u64,
        now_s: u64,
    ) {
        if self.bump(h, key, weight, other, now_s) {
            return;
        }
        let (i, error) = if self.slots.len() < self.cap {
            if self.slots.is_empty() {
                self.slots.reserve_exact(self.cap);
                self.index.reserve(2 * self.cap, |_| 0);
            }
            self.slots.push(Slot {
                value: Vec::new(),
                hash: 0,
                weight: 0,
                error: 0,
                other: 0,
                first_s: 0,
                last_s: 0,
            });
            (self.slots.len() - 1, 0)
        } else {
            let (i, min) = self.lightest();
            let old = self.slots[i].hash;
            if let Ok(e) = self.index.find_entry(old, |&j| j as usize == i) {
                e.remove();
            }
            (i, min)
        };
        let s = &mut self.slots[i];
        s.value.clear();
        cut_pieces(key, &mut |p| {
            s.value.extend_from_slice(p);
            true
        });
        s.hash = h;
        s.weight = error + weight;
        s.error = error;
        s.other = other;
        s.first_s = now_s;
        s.last_s = now_s;
        let hashes = &self.slots;
        self.index
            .insert_unique(h, i as u32, |&j| hashes[j as usize].hash);
    }

    /// The slot with the smallest weight (a scan: the table is small, and only a value not
    /// yet tracked arriving at a full table pays it).
    fn lightest(&self) -> (usize, u64) {
        let mut best = (0, u64::MAX);
        for (i, s) in self.slots.iter().enumerate() {
            if s.weight < best.1 {
                best = (i, s.weight);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(t: &mut SpaceSaving, v: &str, w: u64) {
        t.offer(hash(v), v, w, 0, 1);
    }

    fn weight(t: &SpaceSaving, v: &str) -> Option<u64> {
        t.find(hash(v), v).map(|i| t.slots[i].weight)
    }

    #[test]
    fn counts_exactly_below_capacity() {
        let mut t = SpaceSaving::new(4);
        for (v, w) in [("a", 3), ("b", 1), ("a", 2), ("c", 5)] {
            offer(&mut t, v, w);
        }
        assert_eq!(weight(&t, "a"), Some(5));
        assert_eq!(weight(&t, "b"), Some(1));
        assert_eq!(weight(&t, "c"), Some(5));
        assert!(t.slots.iter().all(|s| s.error == 0));
        assert!(
            !t.bump(hash("d"), "d", 1, 0, 1),
            "an untracked value is not counted"
        );
    }

    #[test]
    fn a_new_value_takes_the_lightest_slot_and_inherits_its_count() {
        let mut t = SpaceSaving::new(2);
        offer(&mut t, "a", 10);
        offer(&mut t, "b", 3);
        offer(&mut t, "c", 1);
        assert_eq!(weight(&t, "b"), None);
        assert_eq!(weight(&t, "c"), Some(4));
        let c = &t.slots[t.find(hash("c"), "c").unwrap()];
        assert_eq!((c.error, c.value.as_slice()), (3, &b"c"[..]));
        assert_eq!(weight(&t, "a"), Some(10));
    }

    #[test]
    fn long_values_are_cut_and_pieces_compare_as_their_join() {
        struct Two<'a>(&'a str, &'a str);
        impl Pieces for Two<'_> {
            fn pieces(&self, f: &mut dyn FnMut(&[u8]) -> bool) {
                let _ = f(self.0.as_bytes()) && f(self.1.as_bytes());
            }
        }
        assert!(same(&Two("ab", "c"), b"abc"));
        assert!(!same(&Two("ab", "cd"), b"abc"));
        assert!(!same(&Two("ab", ""), b"abc"));
        let long = "x".repeat(MAX_VALUE_BYTES + 10);
        let mut t = SpaceSaving::new(2);
        offer(&mut t, &long, 1);
        offer(&mut t, &long[..MAX_VALUE_BYTES + 1], 1);
        assert_eq!(t.slots.len(), 1);
        assert_eq!(t.slots[0].value.len(), MAX_VALUE_BYTES);
        assert_eq!(t.slots[0].weight, 2);
    }

    /// A million distinct values, one heavy value among them: the table never holds more than
    /// its capacity, and the heavy value is on top with its weight within the error bound.
    #[test]
    fn a_flood_of_distinct_values_stays_bounded_and_the_heavy_hitter_stays_on_top() {
        let cap = 40;
        let mut t = SpaceSaving::new(cap);
        let mut name = String::new();
        let mut heavy = 0;
        let mut first = 0;
        for i in 0..1_000_000u32 {
            name.clear();
            use std::fmt::Write as _;
            let _ = write!(name, "10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
            offer(&mut t, &name, 1);
            if i % 10 == 0 {
                offer(&mut t, "203.0.113.7", 1);
                heavy += 1;
            }
            assert!(t.slots.len() <= cap);
            if i == 0 {
                first = t.index.allocation_size();
            }
            assert_eq!(
                t.index.allocation_size(),
                first,
                "the index grew at value {i}"
            );
            assert!(t.allocated_bytes() <= SpaceSaving::max_bytes(cap));
        }
        assert_eq!(t.slots.capacity(), cap);
        let top = t.slots.iter().max_by_key(|s| s.weight).unwrap();
        assert_eq!(top.value, b"203.0.113.7");
        assert!(top.weight >= heavy && top.weight - top.error <= heavy);
    }
}
