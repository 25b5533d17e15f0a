//! An open-addressing hash table keyed by block offset, for the `free(offset)` lookups.
//!
//! Every strategy's `free` starts by mapping an offset to its block. `std`'s `HashMap` (hashbrown) keeps
//! control bytes and buckets in two arrays, so a lookup in a table larger than the cache costs two
//! dependent misses. This table stores `(key, value)` pairs inline in one array with linear probing: a hit
//! at the home slot (the common case at load ≤ 1/2) is one cache line. With a 16-byte entry four share a
//! line, and a probe sequence rarely leaves it.
//!
//! Measured on the `strategies` workload (100k live blocks, `strategies_icount` under callgrind with
//! `--cache-sim=yes --D1=32768,8,64 --LL=1048576,16,64`): swapping hashbrown for this table in the old
//! node-list block list cut TLSF from 641 to 613 instructions and 8.5 to 7.2 D1 misses per pair, but not the
//! 1 MiB-LL misses (4.9 -> 5.3: hashbrown's control bytes fit the L2, and this table at load ≤ 1/2 is larger).
//!
//! # Invariants
//! - The slot count is a power of two; the load is at most `max_load_8ths` / 8 (1/2 by default, 5/8 for
//!   the block list, whose keys come in tagged groups).
//! - `EMPTY` (`u64::MAX`) marks a free slot; keys are offsets ≤ 2^48, so never `EMPTY`.
//! - Linear probing without tombstones: every key lies in the run of occupied slots that starts at or
//!   before its home slot `h(key)` and reaches it (wrapping). `remove` restores this by backward shifting
//!   (Knuth, TAOCP vol. 3, algorithm 6.4R).
//!
//! # Time complexity
//! Expected O(1) `get`, `insert` and `remove` (load ≤ 5/8, multiplicative Fibonacci hashing); `clear` and
//! growth are O(slots). `iter` is O(slots), in no particular order.

/// Marks an empty slot.
const EMPTY: u64 = u64::MAX;

/// Bits of a key that the hash reads: the top two are tags that callers may set (the block list keeps the
/// entries of one offset under `offset`, `offset | 1 << 62` and `offset | 1 << 63`), so keys that differ only
/// in them share a home slot and a probe run.
const HASH_MASK: u64 = (1 << 62) - 1;

/// Smallest slot count.
const MIN_SLOTS: usize = 16;

/// Open-addressing map from offsets (bytes, `< u64::MAX`) to `V`.
#[derive(Clone, Debug)]
pub(crate) struct OffsetTable<V: Copy> {
    slots: Vec<(u64, V)>,
    /// `64 - log2(slots.len())`: the multiplicative hash keeps the product's top bits.
    shift: u32,
    len: usize,
    /// Value written into empty slots (never read as a value).
    filler: V,
    /// Maximum load in eighths (4: at most half the slots are occupied).
    max_load_8ths: usize,
}

impl<V: Copy> OffsetTable<V> {
    /// An empty table; `filler` is any value of `V` (it only pads empty slots).
    pub(crate) fn new(filler: V) -> Self {
        Self::with_max_load_8ths(filler, 4)
    }

    /// An empty table that grows past a load of `max_load_8ths` / 8 (in `1..=6`).
    pub(crate) fn with_max_load_8ths(filler: V, max_load_8ths: usize) -> Self {
        debug_assert!((1..=6).contains(&max_load_8ths));
        OffsetTable {
            slots: vec![(EMPTY, filler); MIN_SLOTS],
            shift: 64 - MIN_SLOTS.trailing_zeros(),
            len: 0,
            filler,
            max_load_8ths,
        }
    }

    /// Number of entries.
    #[cfg_attr(not(test), allow(dead_code))] // invariant checks only
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Home slot of `key`: Fibonacci hashing (the top bits of `key * 2^64/φ`), which spreads offsets that
    /// are all multiples of a large granule as well as dense ones.
    #[inline]
    fn home(&self, key: u64) -> usize {
        ((key & HASH_MASK).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if key == EMPTY {
            return None; // never stored (`free(u64::MAX)` asks for it)
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        self.find(key).map(|i| self.slots[i].1)
    }

    /// A mutable reference to the value of `key`.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        self.find(key).map(|i| &mut self.slots[i].1)
    }

    /// Inserts or replaces `key`'s value.
    #[inline]
    pub(crate) fn insert(&mut self, key: u64, value: V) {
        debug_assert_ne!(key, EMPTY);
        if (self.len + 1) * 8 > self.slots.len() * self.max_load_8ths {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == EMPTY {
                self.slots[i] = (key, value);
                self.len += 1;
                return;
            }
            if k == key {
                self.slots[i].1 = value;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `key` and returns its value.
    #[inline]
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let mut hole = self.find(key)?;
        let value = self.slots[hole].1;
        let mask = self.mask();
        // Backward shift: move later members of the run into the hole when their home slot does not lie
        // cyclically in (hole, j].
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY {
                break;
            }
            let h = self.home(k);
            let stays = if hole <= j { hole < h && h <= j } else { hole < h || h <= j };
            if !stays {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (EMPTY, self.filler);
        self.len -= 1;
        Some(value)
    }

    /// Removes every entry, keeping the slot array.
    pub(crate) fn clear(&mut self) {
        self.slots.fill((EMPTY, self.filler));
        self.len = 0;
    }

    /// Doubles the slot array and reinserts every entry.
    #[cold]
    fn grow(&mut self) {
        let doubled = vec![(EMPTY, self.filler); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        self.shift -= 1;
        let mask = self.mask();
        for (k, v) in old {
            if k != EMPTY {
                let mut i = self.home(k);
                while self.slots[i].0 != EMPTY {
                    i = (i + 1) & mask;
                }
                self.slots[i] = (k, v);
            }
        }
    }

    /// Every `(key, value)`, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.slots.iter().copied().filter(|s| s.0 != EMPTY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hash_map_under_random_churn() {
        let mut t = OffsetTable::new(0u32);
        let mut m = HashMap::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Small key space (many collisions and removals) with granule-like multiples.
            let key = (x % 4096) << (x >> 60);
            match x >> 62 {
                0 | 1 => {
                    t.insert(key, step);
                    m.insert(key, step);
                }
                2 => assert_eq!(t.remove(key), m.remove(&key)),
                _ => assert_eq!(t.get(key), m.get(&key).copied()),
            }
            assert_eq!(t.len(), m.len());
        }
        let mut a: Vec<_> = t.iter().collect();
        let mut b: Vec<_> = m.into_iter().collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        assert_eq!((t.get(EMPTY), t.remove(EMPTY)), (None, None));
        t.clear();
        assert_eq!((t.len(), t.get(a[0].0)), (0, None));
    }

    #[test]
    fn removal_keeps_wrapped_runs_reachable() {
        // Force runs that wrap around the end of a 16-slot table.
        let mut t = OffsetTable::new(0u64);
        let keys: Vec<u64> = (0..1000u64).filter(|&k| t.home(k) >= 14).take(7).collect();
        for &k in &keys {
            t.insert(k, k + 1);
        }
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(t.remove(k), Some(k + 1));
            for &r in &keys[i + 1..] {
                assert_eq!(t.get(r), Some(r + 1), "key {r} lost after removing {k}");
            }
        }
        assert_eq!(t.len(), 0);
    }
}
