//! Counter keys' hashing, owned by the limiter: FNV-1a of a key's text picks the shard that owns
//! it and is reused as the shard's table hash. `descriptor` builds the key's text; the limiter
//! alone decides what a hash means.

use std::hash::Hasher;

use fnv::FnvHasher;

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
}
