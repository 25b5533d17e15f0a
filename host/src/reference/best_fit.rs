//! Best-fit: the smallest free block that fits, ties broken by the lowest address, O(log n).
//!
//! Free blocks are segregated into the TLSF size classes (32 per power of two, see
//! [`tlsf`](super::tlsf)), and *within* a class ordered exactly by `(size, offset)` in a `BTreeSet` of
//! packed 128-bit keys. A two-level bitmap finds the next non-empty class in O(1), so the search is one
//! ordered-set lookup in the request's class (first key at or above `(size, 0)`) and, if that class has
//! nothing large enough, the minimum of the next non-empty class: exact best fit, with sets that stay small
//! because each class holds only the blocks of one narrow size band.
//!
//! Blocks live in the shared block list (`block_list.rs`): free blocks are out-of-band nodes found by their
//! start and end offsets in one tagged hash table, so merging with free neighbours on free is O(1) expected
//! and immediate, and a split or merge that keeps a free block's address order updates the index in place.
//!
//! # Invariants
//! - Free block `n` is in `bins[class(n.size)]` under key `(n.size, n.offset)`; bitmaps mirror bin emptiness.
//! - No two physically adjacent blocks are free.
//!
//! # Time complexity
//! - `alloc`: O(log k) for a bin of k blocks, plus O(1) to find the next class (k ≤ n). With an alignment
//!   above the granule, candidates that do not fit only because of alignment are skipped one by one.
//! - `free`: O(1) expected hash lookup + O(log k) map updates for the merged neighbours.
//! - `stats`: O(log k) (`largest_free` is the last key of the highest non-empty bin).

use std::collections::BTreeSet;

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

/// Size-class bins of exact `(size, offset)`-ordered sets.
#[derive(Debug)]
pub(crate) struct BestFitIndex {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    bins: Vec<BTreeSet<u128>>,
    granule_log2: u32,
}

impl BestFitIndex {
    pub(crate) fn new(granule: u64) -> Self {
        BestFitIndex {
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            bins: (0..FL_COUNT * SL_COUNT).map(|_| BTreeSet::new()).collect(),
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
        let bin = &mut self.bins[fl * SL_COUNT + sl];
        bin.remove(&key(size, offset, n));
        if bin.is_empty() {
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
}

impl FreeIndex for BestFitIndex {
    #[inline]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let (fl, sl) = self.bin_of(size);
        self.bins[fl * SL_COUNT + sl].insert(key(size, offset, n));
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
            if let Some(&k) = first.range(key(size, 0, 0)..).find(|&&k| fits(key_node(k))) {
                return Some((key_node(k), Placement::Front));
            }
        }
        // Every block of a later bin is larger than `size`; the first key of each bin is its best fit.
        while let Some((f, s)) = self.next_bin(fl, sl) {
            (fl, sl) = (f, s);
            if let Some(&k) = self.bins[fl * SL_COUNT + sl].iter().find(|&&k| fits(key_node(k))) {
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
        self.bins[fl * SL_COUNT + sl].last().map_or(0, |&k| key_size(k))
    }

    fn clear(&mut self) {
        self.fl_bitmap = 0;
        self.sl_bitmap = [0; FL_COUNT];
        for b in &mut self.bins {
            b.clear();
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
}
