//! Best-fit: the smallest free block that fits, ties broken by the lowest address, O(log n).
//!
//! Free blocks are segregated into the TLSF size classes (32 per power of two, see
//! [`tlsf`](super::tlsf)), and *within* a class ordered exactly by `(size, offset)` as packed 128-bit keys.
//! A class keeps its keys in sorted chunks of at most `CHUNK` (32) keys behind a directory of the chunks'
//! first keys (a `Bin`; no tree nodes): a lookup binary-searches the directory, then the chunk's 512
//! bytes, and an update is a memmove inside one chunk. A full chunk splits in halves; a remove that leaves
//! two neighbouring chunks with at most `CHUNK / 2` keys together merges them. A two-level bitmap finds the
//! next non-empty class in O(1), so the search is one ordered lookup in the request's class (first key at
//! or above `(size, 0)`; when that is the class's first key, as in every class of a single size, no binary
//! search at all) and, if that class has nothing large enough, the first key of the next non-empty class:
//! exact best fit.
//!
//! Blocks live in the shared block list (`block_list.rs`): out-of-band nodes linked to their physical
//! neighbours, so merging with free neighbours on free is O(1) and immediate; a split or merge re-files the
//! changed free block under its new key (remove + insert, possibly in another class).
//!
//! # Invariants
//! - Free block `n` is in `bins[class(n.size)]` under key `(n.size, n.offset, n)`, once; bitmaps mirror bin
//!   emptiness.
//! - In a bin, every chunk holds 1 to `CHUNK` keys in ascending order, every key of a chunk is below every
//!   key of the next chunk, the directory entry of a chunk is its first key, and any two neighbouring
//!   chunks hold more than `CHUNK / 2` keys together (so a bin of k keys has at most `4k / CHUNK + 1`
//!   chunks).
//! - No two physically adjacent blocks are free.
//!
//! # Time complexity
//! - `alloc`: O(log k) compares for a bin of k blocks (directory and chunk binary searches) plus a memmove
//!   of at most `CHUNK` keys, and O(1) to find the next class (k ≤ n). A chunk split or merge moves
//!   O(k / `CHUNK`) directory entries (rare: only a full chunk splits, only two neighbours with at most
//!   `CHUNK / 2` keys together merge). With an alignment above the granule, candidates that do not fit
//!   only because of alignment are skipped one by one.
//! - `free`: O(1) through the handle, plus the same bin updates for the merged neighbours.
//! - `stats`: O(1) (`largest_free` is the last key of the highest non-empty bin).

use super::block_list::{
    block_list_strategy, first_class_at_or_above, size_class, BlockList, FreeIndex, Node, Placement, FL_COUNT, SL_COUNT,
};
use super::fit_front;

/// A free block as one ordered key: `size - 1` (48 bits), offset (48 bits), node index (32 bits), so keys
/// order by `(size, offset)` and a B-tree leaf holds keys only (16 bytes each, one comparison per key).
/// Sizes are at most 2^48 and free offsets below 2^48, so the fields fit.
#[inline]
fn key(size: u64, offset: u64, node: u32) -> u128 {
    debug_assert!((1..=1 << 48).contains(&size) && offset < 1 << 48);
    ((size - 1) as u128) << 80 | (offset as u128) << 32 | node as u128
}

#[inline]
fn key_node(k: u128) -> u32 {
    k as u32
}

#[inline]
fn key_size(k: u128) -> u64 {
    (k >> 80) as u64 + 1
}

/// Most keys in one chunk of a bin: 32 keys of 16 bytes, 8 cache lines.
const CHUNK: usize = 32;

/// A run of a bin's keys: `first == keys[0]`, kept beside the pointer so that the directory search reads
/// no chunk until it has picked one.
#[derive(Debug)]
struct Chunk {
    first: u128,
    keys: Vec<u128>,
}

/// The free blocks of one size class in exact key order, as a directory of sorted chunks of at most
/// [`CHUNK`] keys (no tree nodes): every chunk is non-empty and sorted, and every key of `chunks[i]` is
/// below every key of `chunks[i + 1]`. Any two neighbouring chunks hold more than `CHUNK / 2` keys together
/// (a remove that breaks this merges them), so a bin of k keys has at most `4k / CHUNK + 1` chunks.
#[derive(Debug, Default)]
struct Bin {
    chunks: Vec<Chunk>,
}

impl Bin {
    #[inline]
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The chunk that holds `k` or would hold it: the last whose first key is at most `k` (0 if none).
    #[inline]
    fn chunk_of(&self, k: u128) -> usize {
        if self.chunks.len() <= 1 {
            0
        } else {
            self.chunks.partition_point(|c| c.first <= k).saturating_sub(1)
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

    /// Removes `k` (present); true if the bin is now empty.
    #[inline]
    fn remove(&mut self, k: u128, spare: &mut Vec<Vec<u128>>) -> bool {
        let c = self.chunk_of(k);
        let ch = &mut self.chunks[c];
        let Ok(i) = ch.keys.binary_search(&k) else {
            debug_assert!(false, "key not in its bin");
            return false;
        };
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

    /// The first key at or above `from` whose node passes `fits`.
    #[inline]
    fn first_from(&self, from: u128, mut fits: impl FnMut(u32) -> bool) -> Option<u128> {
        let head = self.chunks.first()?;
        // Most searches start before the first key (every key of a higher class, and an exact class).
        let (c, i) = if from <= head.first {
            (0, 0)
        } else {
            let c = self.chunk_of(from);
            (c, self.chunks[c].keys.partition_point(|&x| x < from))
        };
        if let Some(&k) = self.chunks[c].keys[i..].iter().find(|&&k| fits(key_node(k))) {
            return Some(k);
        }
        self.chunks[c + 1..].iter().flat_map(|ch| &ch.keys).copied().find(|&k| fits(key_node(k)))
    }

    #[inline]
    fn last(&self) -> Option<u128> {
        self.chunks.last().and_then(|ch| ch.keys.last().copied())
    }

    fn clear(&mut self, spare: &mut Vec<Vec<u128>>) {
        for mut ch in self.chunks.drain(..) {
            ch.keys.clear();
            spare.push(ch.keys);
        }
    }
}

/// Size-class bins of exact `(size, offset)`-ordered keys.
#[derive(Debug)]
pub(crate) struct BestFitIndex {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    bins: Vec<Bin>,
    /// Emptied chunks (capacity [`CHUNK`]) for reuse, so splits and new bins do not allocate.
    spare: Vec<Vec<u128>>,
    granule_log2: u32,
}

impl BestFitIndex {
    pub(crate) fn new(granule: u64) -> Self {
        BestFitIndex {
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            bins: (0..FL_COUNT * SL_COUNT).map(|_| Bin::default()).collect(),
            spare: Vec::new(),
            granule_log2: granule.trailing_zeros(),
        }
    }

    #[inline]
    fn bin_of(&self, size: u64) -> (usize, usize) {
        size_class(size >> self.granule_log2)
    }

    /// Removes the entry of node `n` filed as `(size, offset)`.
    #[inline]
    fn remove_key(&mut self, size: u64, offset: u64, n: u32) {
        let (fl, sl) = self.bin_of(size);
        if self.bins[fl * SL_COUNT + sl].remove(key(size, offset, n), &mut self.spare) {
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
        }
    }

    /// Next non-empty bin strictly after `(fl, sl)`.
    fn next_bin(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        first_class_at_or_above(self.fl_bitmap, &self.sl_bitmap, fl, sl + 1)
    }

    /// Panics unless every free node is filed once under its key in its class's bin, every bin keeps the
    /// chunk invariants of [`Bin`], and the bitmaps mirror bin emptiness (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self, nodes: &[Node]) {
        let mut filed = 0;
        for (i, bin) in self.bins.iter().enumerate() {
            for (c, ch) in bin.chunks.iter().enumerate() {
                let len = ch.keys.len();
                assert!(len > 0 && len <= CHUNK, "bin {i}: chunk {c} of {len} keys");
                assert_eq!(ch.first, ch.keys[0], "bin {i}: directory of chunk {c}");
                if c > 0 {
                    assert!(bin.chunks[c - 1].keys.len() + len > CHUNK / 2, "bin {i}: light chunks {c}");
                }
            }
            let keys: Vec<u128> = bin.chunks.iter().flat_map(|ch| &ch.keys).copied().collect();
            assert!(keys.is_sorted_by(|a, b| a < b), "bin {i}: unsorted");
            let (fl, sl) = (i / SL_COUNT, i % SL_COUNT);
            assert_eq!(keys.is_empty(), self.sl_bitmap[fl] & (1 << sl) == 0, "bin {i}: bitmap");
            for k in keys {
                let n = &nodes[key_node(k) as usize];
                assert_eq!(k, key(n.size, n.offset, key_node(k)), "bin {i}: stale key");
                assert_eq!(self.bin_of(n.size), (fl, sl), "bin {i}: wrong class");
                filed += 1;
            }
        }
        for fl in 0..FL_COUNT {
            assert_eq!(self.sl_bitmap[fl] != 0, self.fl_bitmap & (1 << fl) != 0, "fl bitmap {fl}");
        }
        let free = nodes.iter().filter(|n| n.a != super::block_list::LIVE && n.size > 0).count();
        assert_eq!(filed, free, "free nodes filed");
    }
}

impl FreeIndex for BestFitIndex {
    #[inline]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let (fl, sl) = self.bin_of(size);
        self.bins[fl * SL_COUNT + sl].insert(key(size, offset, n), &mut self.spare);
        self.sl_bitmap[fl] |= 1 << sl;
        self.fl_bitmap |= 1 << fl;
    }

    #[inline]
    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        self.remove_key(size, offset, n);
    }

    #[inline]
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64) {
        self.remove_key(old_size, old_offset, n);
        self.insert(nodes, n);
    }

    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        let (mut fl, mut sl) = self.bin_of(size);
        let fits = |n: u32| {
            let node = &nodes[n as usize];
            align <= granule || fit_front(node.offset, node.size, size, align).is_some()
        };
        // The request's own bin: first key >= (size, 0).
        let first = &self.bins[fl * SL_COUNT + sl];
        if !first.is_empty() {
            if let Some(k) = first.first_from(key(size, 0, 0), fits) {
                return Some((key_node(k), Placement::Front));
            }
        }
        // Every block of a later bin is larger than `size`; the first key of each bin is its best fit.
        while let Some((f, s)) = self.next_bin(fl, sl) {
            (fl, sl) = (f, s);
            if let Some(k) = self.bins[fl * SL_COUNT + sl].first_from(0, fits) {
                return Some((key_node(k), Placement::Front));
            }
        }
        None
    }

    fn largest(&self, _nodes: &[Node]) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        self.bins[fl * SL_COUNT + sl].last().map_or(0, key_size)
    }

    fn clear(&mut self) {
        self.fl_bitmap = 0;
        self.sl_bitmap = [0; FL_COUNT];
        for b in &mut self.bins {
            b.clear(&mut self.spare);
        }
    }
}

/// Best-fit sub-allocator over `[0, capacity)`. See the [module docs](self) for invariants and complexity.
#[derive(Debug)]
pub struct BestFit(pub(crate) BlockList<BestFitIndex>);

block_list_strategy!(BestFit, "best-fit", BestFitIndex::new);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::SubAllocator;

    #[test]
    fn picks_the_smallest_fitting_hole_then_lowest_address() {
        let mut h = BestFit::with_granule(100, 1).unwrap();
        // Layout: [a 10][hole 30][b 10][hole 12][c 10][hole 12][d 16]
        let offs: Vec<u64> = [10, 30, 10, 12, 10, 12, 16].iter().map(|&s| h.alloc(s, 1).unwrap().offset).collect();
        for i in [1, 3, 5] {
            h.free_at(offs[i]).unwrap();
        }
        h.0.check_invariants();
        assert_eq!(h.alloc(11, 1).unwrap().offset, offs[3]);
        assert_eq!(h.alloc(12, 1).unwrap().offset, offs[5]);
        assert_eq!(h.alloc(12, 1).unwrap().offset, offs[1]);
        assert_eq!(h.stats().largest_free, 18);
        h.0.check_invariants();
    }

    /// Hundreds of holes in three size classes: the bins split into many chunks and merge back, and every
    /// placement (some with an alignment above the granule) is still the smallest fitting hole at the
    /// lowest address.
    #[test]
    fn crowded_classes_stay_exact_through_chunk_splits_and_merges() {
        let mut h = BestFit::with_granule(1 << 20, 1).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let live: Vec<_> = (0..800).map(|i| h.alloc(1000 + (i * 7) % 40, 1).unwrap()).collect();
        let mut held = Vec::new();
        for (i, a) in live.into_iter().enumerate() {
            if i % 2 == 0 {
                h.free(a).unwrap();
            } else {
                held.push(a);
            }
        }
        h.0.check_invariants();
        h.0.index.check(h.0.nodes());
        let most_chunks = h.0.index.bins.iter().map(|b| b.chunks.len()).max().unwrap();
        assert!(most_chunks >= 4, "the most crowded bin has {most_chunks} chunks");
        let mut mine = Vec::new();
        for step in 0..3000 {
            let r = next();
            if r % 3 != 0 || mine.is_empty() {
                let size = 990 + (r >> 8) % 50;
                let align = if r % 5 == 0 { 1 << ((r >> 40) % 7) } else { 1 };
                let want = h
                    .free_blocks()
                    .filter(|&(o, l)| fit_front(o, l, size, align).is_some())
                    .min_by_key(|&(o, l)| (l, o));
                match h.alloc(size, align) {
                    Ok(a) => {
                        let (o, l) = want.unwrap_or_else(|| panic!("step {step}: allocated although nothing fits"));
                        assert!(a.offset >= o && a.offset < o + l, "step {step}: best fit is ({o}, {l}), got {a:?}");
                        mine.push(a);
                    }
                    Err(_) => assert_eq!(want, None, "step {step}"),
                }
            } else {
                let a = mine.swap_remove((r >> 20) as usize % mine.len());
                h.free(a).unwrap();
            }
            h.0.index.check(h.0.nodes());
        }
        for a in mine.into_iter().chain(held) {
            h.free(a).unwrap();
            h.0.index.check(h.0.nodes());
        }
        assert_eq!(h.0.index.bins.iter().map(|b| b.chunks.len()).sum::<usize>(), 1, "one bin, one chunk left");
        assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
    }
}
