//! Counter keys, owned by the limiter: a [`Key`] is the key's text with its FNV-1a hash, worked
//! out once. The hash picks the shard that owns the key and is reused by every table the shard
//! keeps of its keys ([`KeyMap`]). `descriptor` builds the key's text; the limiter alone decides
//! what a hash means.

use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use fnv::FnvHasher;
use smallvec::SmallVec;

/// A counter key: its text and the text's FNV-1a hash ([`key_hash`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    // The hash first: keys compare it before their texts.
    hash: u64,
    text: String,
}

impl Key {
    /// The key of `text`, hashed.
    pub fn new(text: impl Into<String>) -> Key {
        let text = text.into();
        Key {
            hash: key_hash(&text),
            text,
        }
    }

    /// Keys of `texts` in order, each the same as [`Key::new`] of it, hashed four side by side
    /// at a time ([`key_hashes`]).
    pub fn hash_all(texts: SmallVec<[String; 4]>) -> impl Iterator<Item = Key> {
        let mut hashes: SmallVec<[u64; 4]> = SmallVec::with_capacity(texts.len());
        for q in texts.chunks(4) {
            match q {
                [a, b, c, d] => hashes.extend(key_hashes([a, b, c, d].map(|t| t.as_bytes()))),
                [a, b, c] => hashes.extend(key_hashes([a, b, c].map(|t| t.as_bytes()))),
                [a, b] => hashes.extend(key_hashes([a.as_bytes(), b.as_bytes()])),
                [a] => hashes.push(key_hash(a)),
                _ => {}
            }
        }
        texts
            .into_iter()
            .zip(hashes)
            .map(|(text, hash)| Key { hash, text })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The text's FNV-1a hash.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The key's text and hash, borrowed, to look it up in a [`KeyMap`].
    pub fn borrowed(&self) -> KeyRef<'_> {
        KeyRef {
            text: &self.text,
            hash: self.hash,
        }
    }
}

/// A key's text and hash, borrowed: looks up a [`KeyMap`] without an owned [`Key`].
#[derive(Clone, Copy)]
pub struct KeyRef<'a> {
    pub text: &'a str,
    /// `key_hash(text)`.
    pub hash: u64,
}

impl<'a> KeyRef<'a> {
    /// `text`, hashed.
    pub fn of(text: &'a str) -> KeyRef<'a> {
        KeyRef {
            text,
            hash: key_hash(text),
        }
    }
}

/// A key hashes as its stored hash: a [`KeyMap`] never hashes its text again.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl hashbrown::Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.hash == key.hash && self.text == key.text
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The empty key.
impl Default for Key {
    fn default() -> Key {
        Key::new(String::new())
    }
}

impl From<&Key> for Key {
    fn from(key: &Key) -> Key {
        key.clone()
    }
}

/// Keys order by their text.
impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq<str> for Key {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for Key {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

/// The hasher of a [`KeyMap`]: takes the key's stored hash and spreads its low bits (which the
/// key's FNV-1a mixes well) over the top ones, where the table takes its tags. The high bits
/// of the stored hash chose the shard, so within a shard they are nearly alike.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only keys' stored hashes come here; anything else is hashed as text.
        let mut h = FnvHasher::with_key(self.0);
        h.write(bytes);
        self.0 = h.finish();
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// A table of keys that uses their stored hashes.
pub type KeyMap<V> = hashbrown::HashMap<Key, V, BuildHasherDefault<KeyHasher>>;

/// A set of keys that uses their stored hashes.
pub type KeySet = hashbrown::HashSet<Key, BuildHasherDefault<KeyHasher>>;

/// FNV-1a of the counter key: picks the shard, and is reused as the shard's table hash.
pub fn key_hash(key: &str) -> u64 {
    let mut h = FnvHasher::default();
    h.write(key.as_bytes());
    h.finish()
}

/// FNV-1a of up to four keys, the same as [`key_hash`] of each. Each hash is a chain of
/// dependent multiplies, one per byte; hashed side by side, the chains run at once, so four keys
/// take about as long as the longest alone (a request with four descriptors spent ~100 ns here).
pub fn key_hashes<const N: usize>(keys: [&[u8]; N]) -> [u64; N] {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h = [OFFSET; N];
    let longest = keys.iter().map(|k| k.len()).max().unwrap_or(0);
    for i in 0..longest {
        for (h, k) in h.iter_mut().zip(keys) {
            if let Some(&b) = k.get(i) {
                *h = (*h ^ u64::from(b)).wrapping_mul(PRIME);
            }
        }
    }
    h
}

/// Maps a hash onto `0..n` from its high bits, so the low bits the shard's table uses stay
/// evenly spread within every shard.
pub fn shard_of(hash: u64, n: usize) -> usize {
    (((hash >> 32) * n as u64) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn keys_hashed_side_by_side_hash_as_one_by_one(
            a in ".{0,40}", b in ".{0,40}", c in ".{0,40}", d in ".{0,40}"
        ) {
            let one_by_one = [&a, &b, &c, &d].map(|k| key_hash(k));
            let keys = [a.as_bytes(), b.as_bytes(), c.as_bytes(), d.as_bytes()];
            proptest::prop_assert_eq!(key_hashes(keys), one_by_one);
            proptest::prop_assert_eq!(key_hashes([keys[0], keys[1]]), [one_by_one[0], one_by_one[1]]);
        }
    }

    proptest::proptest! {
        #[test]
        fn keys_hashed_together_are_keys_made_one_by_one(texts in proptest::collection::vec(".{0,20}", 0..11)) {
            let keys: Vec<Key> = Key::hash_all(texts.iter().cloned().collect()).collect();
            let one_by_one: Vec<Key> = texts.into_iter().map(Key::new).collect();
            proptest::prop_assert_eq!(keys, one_by_one);
        }
    }

    #[test]
    fn shard_choice_is_stable_and_in_range() {
        for n in 1..9 {
            for i in 0..1000 {
                let h = key_hash(&format!("k{i}"));
                assert!(shard_of(h, n) < n);
                assert_eq!(shard_of(h, n), shard_of(key_hash(&format!("k{i}")), n));
            }
        }
    }

    #[test]
    fn the_default_key_is_the_empty_key() {
        assert_eq!(Key::default(), Key::new(""));
    }
}
