//! An exact-ordered index of free blocks by TLSF size class: per class, the blocks' packed `u128` keys
//! `(size - 1, offset, record)` in sorted chunks of at most [`CHUNK`] keys, and a two-level bitmap over the
//! non-empty classes. Used by best-fit ([`best_fit`](super::best_fit), one index over the range) and by the
//! caching model ([`caching`](super::caching), one index per pool and stream).
//!
//! A block of `size` bytes belongs to one size class `(fl, sl)` (the caller's [`size_class`] of its size,
//! 32 classes per power of two), and within the class the keys order exactly by `(size, offset)`, so the
//! first key at or above `key(size, 0, 0)` in the request's class, else the first key of the next
//! non-empty class, is the best fit (smallest block, then lowest offset) over all classes.
//!
//! A class ([`ClassSet`]) keeps its keys in sorted chunks of at most [`CHUNK`] keys (512 bytes) behind a
//! directory of the chunks' first keys (no tree nodes): a lookup binary-searches the directory, then one
//! chunk, and an update is a memmove inside one chunk. A full chunk splits in halves; a removal that leaves
//! two neighbouring chunks with at most `CHUNK / 2` keys together merges them. Emptied chunk buffers are kept
//! for reuse (`spare`), so splits and new classes do not allocate in steady state. A search whose start is
//! at or below the class's first key (every class above the request's, and every single-size class)
//! reads that first key without any binary search.
//!
//! # Why chunks
//! Both users replaced a `BTreeSet`/`BTreeMap` per class with these chunks in session 5 (callgrind, per
//! alloc+free pair at 100k live blocks, `host/benches/strategies_icount.rs`): best-fit 1300.6 → 1077.9
//! instructions and 20.31 → 17.33 D1 misses (chunks of 16 and 64 measured worse: 1086.6 / 17.82 and
//! 1122.1 / 19.74; a directory of first keys beside each chunk beat a separate first-key array, 1194.6 /
//! 18.30), see `bench/results/2026-12-01-cpu-2core-no-gpu-best-fit-session5.md`; the caching model
//! 1472.3 → 1205.9 instructions with its chunked classes (then 1172.8 without its start-offset hash), see
//! `bench/results/2026-12-01-cpu-2core-no-gpu-caching-session5.md` (there: a slab of fixed chunks with
//! keys and record ids in two arrays, a flat array of chunk maxima, no merging). The two designs were
//! merged here on best-fit's chunks with the caching model's positions ([`Pos`]); against main 2b82db6,
//! same recipe, same day: best-fit 1077.9 → 1023.2 instructions and 17.40 → 17.39 D1 misses per pair,
//! caching 1178.1 → 964.6 and 18.89 → 15.02 (DESIGN.md §4.4, "One size-class index").
//!
//! # Invariants
//! - A key is in the class the caller filed it under, once; `sl_bitmap[fl]` bit `sl` is set iff class
//!   `(fl, sl)` is non-empty, and `fl_bitmap` bit `fl` iff `sl_bitmap[fl] != 0`.
//! - In a class, every chunk holds 1 to [`CHUNK`] keys in ascending order, every key of a chunk is below
//!   every key of the next chunk, the directory entry of a chunk is its first key, and any two neighbouring
//!   chunks hold more than `CHUNK / 2` keys together (so a class of k keys has at most `4k / CHUNK + 1`
//!   chunks).
//! - A [`Pos`] is valid until the next change to the index.
//!
//! # Time complexity (k keys in the class, n in the index)
//! - `insert`, `remove`: O(log k) compares (directory and chunk binary searches) plus a memmove of at most
//!   [`CHUNK`] keys; a chunk split or merge moves O(k / [`CHUNK`]) directory entries (rare: only a full
//!   chunk splits, only two neighbours with at most `CHUNK / 2` keys together merge). `remove_at`: the
//!   same without the searches.
//! - `first_at_least`: one class lookup, O(log k), and O(1) to find the next non-empty class.
//! - `last` (the largest key): O(1). `class_from`, `class_first_where`, `keys`: O(1) per key visited
//!   (plus O(classes) for `keys`).

#[cfg(doc)]
use super::block_list::size_class;
use super::block_list::{first_class_at_or_above, FL_COUNT, SL_COUNT};

/// A free block as one ordered key: `size - 1` (48 bits), offset (48 bits), record (32 bits: the user's
/// node or block index), so keys order by `(size, offset)` with one comparison. Sizes are 1 to 2^48 bytes
/// and offsets below 2^48, so the fields fit.
#[inline]
pub(crate) fn key(size: u64, offset: u64, record: u32) -> u128 {
    debug_assert!((1..=1 << 48).contains(&size) && offset < 1 << 48);
    ((size - 1) as u128) << 80 | (offset as u128) << 32 | record as u128
}

/// The size in bytes of a [`key`].
#[inline]
pub(crate) fn key_size(k: u128) -> u64 {
    (k >> 80) as u64 + 1
}

/// The offset in bytes of a [`key`].
#[inline]
pub(crate) fn key_offset(k: u128) -> u64 {
    (k >> 32) as u64 & ((1 << 48) - 1)
}

/// The record (node or block index) of a [`key`].
#[inline]
pub(crate) fn key_record(k: u128) -> u32 {
    k as u32
}

/// Most keys in one chunk of a class: 32 keys of 16 bytes, 8 cache lines.
pub(crate) const CHUNK: usize = 32;

/// A run of a class's keys: `first == keys[0]`, kept beside the buffer so that the directory search reads
/// no chunk until it has picked one.
#[derive(Debug)]
struct Chunk {
    first: u128,
    keys: Vec<u128>,
}

/// The keys of one size class in exact order, as a directory of sorted chunks (see the
/// [module docs](self) for the invariants).
#[derive(Debug, Default)]
pub(crate) struct ClassSet {
    chunks: Vec<Chunk>,
}

/// Where a key lies in a [`ClassIndex`]: class `class` (`fl * SL_COUNT + sl`), chunk `chunk` of the class,
/// entry `at` of the chunk. Valid until the next change to the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    class: usize,
    chunk: usize,
    at: usize,
}

impl ClassSet {
    /// The chunk that holds `k` or would hold it: the last whose first key is at most `k` (0 if none).
    #[inline]
    fn chunk_of(&self, k: u128) -> usize {
        if self.chunks.len() <= 1 {
            0
        } else {
            self.chunks.partition_point(|c| c.first <= k).saturating_sub(1)
        }
    }

    /// Chunk and entry of the first key at or above `from` (the entry may be one past its chunk's end).
    #[inline]
    fn start(&self, from: u128) -> (usize, usize) {
        match self.chunks.first() {
            // Most searches start before the first key (every key of a higher class, and an exact class).
            Some(head) if from > head.first => {
                let c = self.chunk_of(from);
                (c, self.chunks[c].keys.partition_point(|&x| x < from))
            }
            _ => (0, 0),
        }
    }

    #[inline]
    fn insert(&mut self, k: u128, spare: &mut Vec<Vec<u128>>) {
        if self.chunks.is_empty() {
            let mut keys = spare.pop().unwrap_or_else(|| Vec::with_capacity(CHUNK));
            keys.push(k);
            self.chunks.push(Chunk { first: k, keys });
            return;
        }
        let c = self.chunk_of(k);
        let ch = &mut self.chunks[c];
        let i = ch.keys.partition_point(|&x| x < k);
        if ch.keys.len() < CHUNK {
            ch.keys.insert(i, k);
            if i == 0 {
                ch.first = k;
            }
            return;
        }
        // A full chunk splits in halves; `k` goes into the half that covers it.
        let mut upper = spare.pop().unwrap_or_else(|| Vec::with_capacity(CHUNK));
        upper.extend_from_slice(&ch.keys[CHUNK / 2..]);
        ch.keys.truncate(CHUNK / 2);
        if i <= CHUNK / 2 {
            ch.keys.insert(i, k);
            if i == 0 {
                ch.first = k;
            }
        } else {
            upper.insert(i - CHUNK / 2, k);
        }
        self.chunks.insert(c + 1, Chunk { first: upper[0], keys: upper });
    }

    /// Chunk and entry of `k`, if present.
    #[inline]
    fn find(&self, k: u128) -> Option<(usize, usize)> {
        let c = self.chunk_of(k);
        let i = self.chunks.get(c)?.keys.binary_search(&k).ok()?;
        Some((c, i))
    }

    /// Removes entry `i` of chunk `c`; true if the class is now empty.
    #[inline]
    fn remove_at(&mut self, c: usize, i: usize, spare: &mut Vec<Vec<u128>>) -> bool {
        let ch = &mut self.chunks[c];
        ch.keys.remove(i);
        let len = ch.keys.len();
        if len == 0 {
            spare.push(self.chunks.remove(c).keys);
            return self.chunks.is_empty();
        }
        if i == 0 {
            ch.first = ch.keys[0];
        }
        // Keep any two neighbours above half a chunk together: merge `c` with a light neighbour.
        if c + 1 < self.chunks.len() && len + self.chunks[c + 1].keys.len() <= CHUNK / 2 {
            self.merge_next(c, spare);
        } else if c > 0 && self.chunks[c - 1].keys.len() + len <= CHUNK / 2 {
            self.merge_next(c - 1, spare);
        }
        false
    }

    /// Appends chunk `c + 1` to chunk `c` and drops it.
    fn merge_next(&mut self, c: usize, spare: &mut Vec<Vec<u128>>) {
        let mut next = self.chunks.remove(c + 1).keys;
        self.chunks[c].keys.extend_from_slice(&next);
        next.clear();
        spare.push(next);
    }

    /// The keys at or above `from`, in order.
    #[inline]
    fn from(&self, from: u128) -> impl Iterator<Item = u128> + '_ {
        let (c, i) = self.start(from);
        let head = self.chunks.get(c).map_or(&[][..], |ch| &ch.keys[i..]);
        let rest = self.chunks.get(c + 1..).unwrap_or(&[]);
        head.iter().chain(rest.iter().flat_map(|ch| &ch.keys)).copied()
    }

    /// The first key at or above `from` that passes `pred`.
    #[inline]
    fn first_where(&self, from: u128, mut pred: impl FnMut(u128) -> bool) -> Option<u128> {
        let (c, i) = self.start(from);
        // The first chunk as a plain slice: in most searches its first candidate passes.
        if let Some(&k) = self.chunks.get(c)?.keys[i..].iter().find(|&&k| pred(k)) {
            return Some(k);
        }
        self.chunks[c + 1..].iter().flat_map(|ch| &ch.keys).copied().find(|&k| pred(k))
    }

    fn clear(&mut self, spare: &mut Vec<Vec<u128>>) {
        for mut ch in self.chunks.drain(..) {
            ch.keys.clear();
            spare.push(ch.keys);
        }
    }
}

/// Free-block keys by TLSF size class (`FL_COUNT * SL_COUNT` classes), each class an exact-ordered
/// [`ClassSet`], with a two-level bitmap over the non-empty classes. The caller picks each key's class
/// (`(fl, sl)`, from [`size_class`] of the block's size in its own unit) and must remove a key from the
/// class it filed it under.
#[derive(Debug)]
pub(crate) struct ClassIndex {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    classes: Vec<ClassSet>,
    /// Emptied chunk buffers (capacity [`CHUNK`]) for reuse, so splits and new classes do not allocate.
    spare: Vec<Vec<u128>>,
}

impl Default for ClassIndex {
    fn default() -> Self {
        ClassIndex {
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            classes: (0..FL_COUNT * SL_COUNT).map(|_| ClassSet::default()).collect(),
            spare: Vec::new(),
        }
    }
}

impl ClassIndex {
    /// True if the index holds no key (tests only).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.fl_bitmap == 0
    }

    /// Files `k` (not present) in class `(fl, sl)`.
    #[inline]
    pub(crate) fn insert(&mut self, (fl, sl): (usize, usize), k: u128) {
        self.classes[fl * SL_COUNT + sl].insert(k, &mut self.spare);
        self.sl_bitmap[fl] |= 1 << sl;
        self.fl_bitmap |= 1 << fl;
    }

    /// Removes `k` from class `(fl, sl)`; false (and no change) if it is not there.
    #[inline]
    pub(crate) fn remove(&mut self, (fl, sl): (usize, usize), k: u128) -> bool {
        let class = fl * SL_COUNT + sl;
        let Some((chunk, at)) = self.classes[class].find(k) else {
            return false;
        };
        self.remove_at(Pos { class, chunk, at });
        true
    }

    /// Removes the key at `pos` (from [`ClassIndex::first_at_least`], with no change to the index since).
    #[inline]
    pub(crate) fn remove_at(&mut self, Pos { class, chunk, at }: Pos) {
        if self.classes[class].remove_at(chunk, at, &mut self.spare) {
            let (fl, sl) = (class / SL_COUNT, class % SL_COUNT);
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
        }
    }

    /// The next non-empty class at or above `(fl, sl)` (in `(fl, sl)` order; `sl` may be `SL_COUNT`).
    #[inline]
    pub(crate) fn class_at_or_above(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        first_class_at_or_above(self.fl_bitmap, &self.sl_bitmap, fl, sl)
    }

    /// The best fit for `from` filed in class `(fl, sl)`: the first key at or above `from` in that class,
    /// else the first key of the next non-empty class; with its position.
    #[inline]
    pub(crate) fn first_at_least(&self, (fl, sl): (usize, usize), from: u128) -> Option<(u128, Pos)> {
        if self.sl_bitmap[fl] & (1 << sl) != 0 {
            let class = fl * SL_COUNT + sl;
            let set = &self.classes[class];
            let (chunk, at) = set.start(from);
            if let Some(&k) = set.chunks[chunk].keys.get(at) {
                return Some((k, Pos { class, chunk, at }));
            }
            if let Some(ch) = set.chunks.get(chunk + 1) {
                return Some((ch.first, Pos { class, chunk: chunk + 1, at: 0 }));
            }
        }
        let (nfl, nsl) = self.class_at_or_above(fl, sl + 1)?;
        let class = nfl * SL_COUNT + nsl;
        Some((self.classes[class].chunks[0].first, Pos { class, chunk: 0, at: 0 }))
    }

    /// The keys of class `(fl, sl)` at or above `from`, in order.
    #[inline]
    pub(crate) fn class_from(&self, (fl, sl): (usize, usize), from: u128) -> impl Iterator<Item = u128> + '_ {
        self.classes[fl * SL_COUNT + sl].from(from)
    }

    /// The first key of class `(fl, sl)` at or above `from` that passes `pred` (a search that skips
    /// candidates for a reason the order does not capture, such as alignment).
    #[inline]
    pub(crate) fn class_first_where(
        &self,
        (fl, sl): (usize, usize),
        from: u128,
        pred: impl FnMut(u128) -> bool,
    ) -> Option<u128> {
        self.classes[fl * SL_COUNT + sl].first_where(from, pred)
    }

    /// Every key, class by class in `(fl, sl)` order, each class in key order.
    ///
    /// Only the non-empty classes are visited (found by the bitmaps): the caching model walks one index
    /// per stream at every failed request (`release_blocks`), and visiting all `FL_COUNT * SL_COUNT`
    /// classes of each made a trace with thousands of streams take minutes.
    pub(crate) fn keys(&self) -> impl Iterator<Item = u128> + '_ {
        std::iter::successors(self.class_at_or_above(0, 0), move |&(fl, sl)| self.class_at_or_above(fl, sl + 1))
            .flat_map(move |(fl, sl)| self.classes[fl * SL_COUNT + sl].from(0))
    }

    /// The last key of the highest non-empty class (the largest block), if any.
    #[inline]
    pub(crate) fn last(&self) -> Option<u128> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        self.classes[fl * SL_COUNT + sl].chunks.last().and_then(|ch| ch.keys.last().copied())
    }

    /// Removes every key (chunk buffers are kept for reuse).
    pub(crate) fn clear(&mut self) {
        self.fl_bitmap = 0;
        self.sl_bitmap = [0; FL_COUNT];
        for set in &mut self.classes {
            set.clear(&mut self.spare);
        }
    }

    /// The number of chunks of the most crowded class (tests only).
    #[cfg(test)]
    pub(crate) fn most_chunks(&self) -> usize {
        self.classes.iter().map(|s| s.chunks.len()).max().unwrap_or(0)
    }

    /// The number of chunks in all classes (tests only).
    #[cfg(test)]
    pub(crate) fn chunk_count(&self) -> usize {
        self.classes.iter().map(|s| s.chunks.len()).sum()
    }

    /// Panics unless every class keeps the chunk invariants of the [module docs](self), the bitmaps mirror
    /// class emptiness, and `class_of(k)` is the class of every key `k`; returns the number of keys (tests
    /// only).
    #[cfg(test)]
    pub(crate) fn check(&self, class_of: impl Fn(u128) -> (usize, usize)) -> usize {
        let mut count = 0;
        for (i, set) in self.classes.iter().enumerate() {
            for (c, ch) in set.chunks.iter().enumerate() {
                let len = ch.keys.len();
                assert!(len > 0 && len <= CHUNK, "class {i}: chunk {c} of {len} keys");
                assert_eq!(ch.first, ch.keys[0], "class {i}: directory of chunk {c}");
                if c > 0 {
                    assert!(set.chunks[c - 1].keys.len() + len > CHUNK / 2, "class {i}: light chunks {c}");
                }
            }
            let keys: Vec<u128> = set.from(0).collect();
            assert!(keys.is_sorted_by(|a, b| a < b), "class {i}: unsorted");
            let (fl, sl) = (i / SL_COUNT, i % SL_COUNT);
            assert_eq!(keys.is_empty(), self.sl_bitmap[fl] & (1 << sl) == 0, "class {i}: bitmap");
            for k in keys {
                assert_eq!(class_of(k), (fl, sl), "class {i}: key {k:#x} in the wrong class");
                count += 1;
            }
        }
        for fl in 0..FL_COUNT {
            assert_eq!(self.sl_bitmap[fl] != 0, self.fl_bitmap & (1 << fl) != 0, "fl bitmap {fl}");
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::block_list::size_class;
    use std::collections::BTreeSet;

    fn class(k: u128) -> (usize, usize) {
        size_class(key_size(k))
    }

    /// A shadow model: random insertions and removals (by key and at a found position) in crowded classes,
    /// so chunks split, merge, empty and leave their class; after each step every best-fit answer agrees
    /// with one `BTreeSet` of `(size, offset)`, and at the end the full order and the largest key.
    #[test]
    fn chunks_keep_the_exact_order_of_a_btree_set() {
        let mut rng = crate::bench::SplitMix64::new(11);
        let mut index = ClassIndex::default();
        let mut reference = BTreeSet::new();
        let mut most_chunks = 0;
        for step in 0..20_000u32 {
            // Few sizes in few classes (so classes hold hundreds of keys), some of them exact single-size classes.
            let size =
                if rng.next_u64().is_multiple_of(4) { 1 + rng.next_u64() % 8 } else { 990 + rng.next_u64() % 50 };
            if !rng.next_u64().is_multiple_of(3) || reference.is_empty() {
                let off = rng.next_u64() % 100_000;
                if reference.insert((size, off)) {
                    index.insert(size_class(size), key(size, off, step));
                }
            } else {
                let &(z, o) = reference.range((size, 0)..).next().unwrap_or(reference.first().unwrap());
                reference.remove(&(z, o));
                let (k, at) = index.first_at_least(size_class(z), key(z, 0, 0)).unwrap();
                assert_eq!((key_size(k), key_offset(k)), (z, o), "step {step}");
                if step % 2 == 0 {
                    assert!(index.remove(size_class(z), k));
                    assert!(!index.remove(size_class(z), k), "step {step}: removed twice");
                } else {
                    index.remove_at(at);
                }
            }
            let want = reference.range((size, 0)..).next().copied();
            let got =
                index.first_at_least(size_class(size), key(size, 0, 0)).map(|(k, _)| (key_size(k), key_offset(k)));
            assert_eq!(got, want, "step {step}");
            if step % 97 == 0 {
                assert_eq!(index.check(class), reference.len(), "step {step}");
            }
            most_chunks = most_chunks.max(index.most_chunks());
        }
        assert!(most_chunks >= 4, "the most crowded class had {most_chunks} chunks");
        assert_eq!(index.check(class), reference.len());
        let got: Vec<_> = index.keys().map(|k| (key_size(k), key_offset(k))).collect();
        assert_eq!(got, reference.iter().copied().collect::<Vec<_>>());
        assert_eq!(index.last().map(key_size), reference.last().map(|x| x.0));
        let (z, o) = *reference.iter().nth(reference.len() / 2).unwrap();
        let from: Vec<_> =
            index.class_from(size_class(z), key(z, o, 0)).map(|k| (key_size(k), key_offset(k))).collect();
        let want: Vec<_> =
            reference.range((z, o)..).copied().filter(|&(s, _)| size_class(s) == size_class(z)).collect();
        assert_eq!(from, want);
        let odd = |k: u128| key_offset(k) % 2 == 1;
        let got = index.class_first_where(size_class(z), key(z, o, 0), odd).map(|k| (key_size(k), key_offset(k)));
        assert_eq!(got, want.iter().copied().find(|&(_, o)| o % 2 == 1));
        // Drain: every class empties, and the chunks go back to the spare list.
        for (z, o) in std::mem::take(&mut reference) {
            let (k, at) = index.first_at_least(size_class(z), key(z, o, 0)).unwrap();
            assert_eq!((key_size(k), key_offset(k)), (z, o));
            index.remove_at(at);
        }
        assert!(index.is_empty() && index.last().is_none() && index.chunk_count() == 0);
        assert_eq!(index.check(class), 0);
        index.insert((0, 1), key(1, 0, 0));
        index.clear();
        assert!(index.is_empty() && index.keys().next().is_none());
    }

    #[test]
    fn key_fields_round_trip() {
        for (size, off, rec) in [(1, 0, 0), (1 << 48, (1 << 48) - 1, u32::MAX), (4096, 123_456, 7)] {
            let k = key(size, off, rec);
            assert_eq!((key_size(k), key_offset(k), key_record(k)), (size, off, rec));
        }
        assert!(key(2, 0, 9) > key(1, 5, 0) && key(2, 1, 0) > key(2, 0, 9));
    }
}
