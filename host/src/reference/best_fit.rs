//! Best-fit: the smallest free block that fits, ties broken by the lowest address, O(log n).
//!
//! Free blocks are segregated into the TLSF size classes (32 per power of two, see
//! [`tlsf`](super::tlsf)), and *within* a class ordered exactly by `(size, offset)` as packed 128-bit keys
//! `(size, offset, node)`: a `ClassIndex` (`class_index.rs`, shared with the caching model: per class,
//! sorted chunks of at most 32 keys behind a directory of their first keys, and a two-level bitmap over the
//! non-empty classes). The search is one ordered lookup in the request's class (first key at or above
//! `(size, 0)`; when that is the class's first key, as in every class of a single size, no binary search
//! at all) and, if that class has nothing large enough, the first key of the next non-empty class: exact
//! best fit. With an alignment above the granule, the candidates from there on that do not fit only
//! because of alignment are skipped one by one (this module's part of the search).
//!
//! Blocks live in the shared block list (`block_list.rs`): out-of-band nodes linked to their physical
//! neighbours, so merging with free neighbours on free is O(1) and immediate; a split or merge re-files the
//! changed free block under its new key (remove + insert, possibly in another class).
//!
//! # Invariants
//! - Free block `n` is in the index under key `(n.size, n.offset, n)` in the class of `n.size` in
//!   granules, once (the index's own invariants: see `class_index.rs`).
//! - No two physically adjacent blocks are free.
//!
//! # Time complexity
//! - `alloc`: O(log k) compares for a class of k blocks plus a memmove of at most 32 keys, and O(1) to
//!   find the next class (k ≤ n; see `class_index.rs`). With an alignment above the
//!   granule, candidates that do not fit only because of alignment are skipped one by one.
//! - `free`: O(1) through the handle, plus the same class updates for the merged neighbours.
//! - `stats`: O(1) (`largest_free` is the last key of the highest non-empty class).

use super::block_list::{block_list_strategy, size_class, BlockList, FreeIndex, Node, Placement};
use super::class_index::{key, key_record, key_size, ClassIndex};
use super::fit_front;

/// Free blocks by size class in exact `(size, offset)` order: a [`ClassIndex`] of keys
/// `(size, offset, node)`, classes of sizes in granules.
#[derive(Debug)]
pub(crate) struct BestFitIndex {
    index: ClassIndex,
    granule_log2: u32,
}

impl BestFitIndex {
    pub(crate) fn new(granule: u64) -> Self {
        BestFitIndex { index: ClassIndex::default(), granule_log2: granule.trailing_zeros() }
    }

    #[inline]
    fn class_of(&self, size: u64) -> (usize, usize) {
        size_class(size >> self.granule_log2)
    }

    /// Panics unless every free node is filed once under its key in its class, and the index keeps its
    /// invariants (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self, nodes: &[Node]) {
        let filed = self.index.check(|k| {
            let n = &nodes[key_record(k) as usize];
            assert_eq!(k, key(n.size, n.offset, key_record(k)), "stale key");
            self.class_of(n.size)
        });
        let free = nodes.iter().filter(|n| n.a != super::block_list::LIVE && n.size > 0).count();
        assert_eq!(filed, free, "free nodes filed");
    }
}

impl FreeIndex for BestFitIndex {
    #[inline]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        self.index.insert(self.class_of(size), key(size, offset, n));
    }

    #[inline]
    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let found = self.index.remove(self.class_of(size), key(size, offset, n));
        debug_assert!(found, "free node not in its class");
    }

    #[inline]
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64) {
        let found = self.index.remove(self.class_of(old_size), key(old_size, old_offset, n));
        debug_assert!(found, "free node not in its class");
        self.insert(nodes, n);
    }

    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        let class = self.class_of(size);
        if align <= granule {
            // Every block fits at its front: the best fit is the first key at or above `(size, 0)`.
            let (k, _) = self.index.first_at_least(class, key(size, 0, 0))?;
            return Some((key_record(k), Placement::Front));
        }
        // Candidates that do not fit only because of alignment are skipped one by one.
        let fits = |k: u128| {
            let node = &nodes[key_record(k) as usize];
            fit_front(node.offset, node.size, size, align).is_some()
        };
        // The request's class: first key >= (size, 0). Every block of a later class is larger than `size`.
        let mut at = Some(class);
        let mut from = key(size, 0, 0);
        while let Some((fl, sl)) = at {
            if let Some(k) = self.index.class_first_where((fl, sl), from, fits) {
                return Some((key_record(k), Placement::Front));
            }
            from = 0;
            at = self.index.class_at_or_above(fl, sl + 1);
        }
        None
    }

    fn largest(&self, _nodes: &[Node]) -> u64 {
        self.index.last().map_or(0, key_size)
    }

    fn clear(&mut self) {
        self.index.clear();
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
        let most_chunks = h.0.index.index.most_chunks();
        assert!(most_chunks >= 4, "the most crowded class has {most_chunks} chunks");
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
        assert_eq!(h.0.index.index.chunk_count(), 1, "one class, one chunk left");
        assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
    }
}
