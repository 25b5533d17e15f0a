//! Best-fit: the smallest free block that fits, ties broken by the lowest address.
//!
//! Free blocks live in the shared block list (`block_list.rs`): out-of-band nodes linked to their physical
//! neighbours, so merging with free neighbours on free is O(1) and immediate; a split or merge re-files the
//! changed free block (remove + insert, usually in another bucket).
//!
//! # The index
//! A free block of `s` granules with `s < EXACT` (4096: 1 MiB at the default 256 B granule) is in the
//! *bucket* of size `s` ([`SizeBuckets`], `buckets.rs`: a two-level bitmap over the sizes, each bucket an
//! address-ordered trie of lists linked through the nodes' `a`/`b`, O(1) unlink); larger blocks are in
//! `large`, a `ClassIndex` (TLSF size classes, each in exact `(size, offset)` order; see `class_index.rs`).
//!
//! The search for `n` granules: the smallest non-empty bucket `s ≥ n` below `EXACT` and its lowest
//! address, else the best fit of `large`: exact best fit. With an alignment above the granule, the
//! candidates from there on that do not fit only because of alignment are skipped one by one.
//!
//! # Invariants
//! - A free block of `s < EXACT` granules is in bucket `s` of `small`, once, as the invariants of
//!   `buckets.rs` say; every larger free block is in `large` under key `(size, offset, node)`, once (and
//!   its `a`, `b` are unused).
//! - No two physically adjacent blocks are free.
//!
//! # Time complexity (n free blocks)
//! - `alloc`: O(1) for the size search; the lowest address of a bucket and an insertion descend the
//!   bucket's trie, at most `ceil(log64(capacity / granule))` nodes (5 at 128 GiB), plus a walk of at most
//!   `LIST_MAX` list nodes. Requests and blocks of `EXACT` granules or more use `large` (O(log k) in a
//!   class of k blocks, see `class_index.rs`). With an alignment above the granule, candidates that do not
//!   fit only because of alignment are skipped one by one.
//! - `free`: O(1) through the handle; each merged neighbour is unlinked in O(1) and the merged block
//!   inserted as above.
//! - `stats`: O(1) (`largest_free` is the last key of `large` or the highest non-empty bucket).
//!
//! # Why this structure
//! It replaced per-class sorted chunks of 128-bit keys for all sizes (`class_index.rs`, still used for
//! `large` and by the caching model), where every insertion and most removals binary-searched a class
//! directory and a chunk and moved up to 31 keys. Per alloc+free pair of the strategies benchmark (100k
//! live blocks, `host/benches/strategies_icount.rs` under callgrind), best-fit went from 993.8 to 496.4
//! instructions (offset-allocator: 438.0), 17.39 to 10.49 D1 misses and 13.61 to 4.61 branch
//! mispredictions, with the same placements; lists of at most 4, 6, 8, 12 and 16 blocks measured within
//! 2 % of each other. See `bench/results/2026-12-01-9073b34-best-fit-index.md`.

use super::block_list::{block_list_strategy, size_class, BlockList, FreeIndex, Node, Placement};
use super::buckets::{SizeBuckets, EXACT};
use super::class_index::{key, key_record, key_size, ClassIndex};
use super::fit_front;

/// Free blocks in exact `(size, offset)` order: exact-size buckets below `EXACT` granules (each a trie of
/// address-sorted lists), `large` above. See the [module docs](self) for the invariants.
#[derive(Debug)]
pub(crate) struct BestFitIndex {
    granule_log2: u32,
    small: SizeBuckets,
    large: ClassIndex,
}

impl BestFitIndex {
    /// The index of a range of `capacity` bytes with offsets and sizes in multiples of `granule`.
    pub(crate) fn new(capacity: u64, granule: u64) -> Self {
        BestFitIndex {
            granule_log2: granule.trailing_zeros(),
            small: SizeBuckets::new(capacity, granule),
            large: ClassIndex::default(),
        }
    }

    /// Removes free node `n`, filed as a block of `size` bytes at `offset`: unlinked from its bucket, or
    /// removed from `large` by its key.
    #[inline(always)]
    fn unfile(&mut self, nodes: &mut [Node], n: u32, offset: u64, size: u64) {
        if size >> self.granule_log2 < EXACT as u64 {
            self.small.remove(nodes, n);
        } else {
            let found = self.large.remove(self.large_class(size), key(size, offset, n));
            debug_assert!(found, "free node not in its class");
        }
    }

    #[inline(always)]
    fn large_class(&self, size: u64) -> (usize, usize) {
        size_class(size >> self.granule_log2)
    }

    /// [`FreeIndex::find`] for an alignment above the granule: candidates in best-fit order, skipping those
    /// that do not fit only because of alignment. The first candidate of each bucket and of `large` is
    /// tried before any walk (it fits unless its start is off the alignment and it has no room to spare).
    #[inline(never)]
    fn find_aligned(&self, nodes: &[Node], size: u64, align: u64) -> Option<(u32, Placement)> {
        let mut fits = |n: u32| {
            let node = &nodes[n as usize];
            fit_front(node.offset, node.size, size, align).is_some()
        };
        let mut g = (size >> self.granule_log2) as usize;
        while g < EXACT {
            let Some(s) = self.small.bucket_at_least(g) else { break };
            let first = self.small.bucket_min(s);
            if fits(first) {
                return Some((first, Placement::Front));
            }
            if let Some(n) = self.small.first_where(nodes, s, &mut fits) {
                return Some((n, Placement::Front));
            }
            g = s + 1;
        }
        let from = size.max((EXACT as u64) << self.granule_log2);
        let (k, _) = self.large.first_at_least(self.large_class(from), key(from, 0, 0))?;
        if fits(key_record(k)) {
            return Some((key_record(k), Placement::Front));
        }
        let mut at = Some(self.large_class(from));
        let mut from = key(from, 0, 0);
        while let Some((fl, sl)) = at {
            if let Some(k) = self.large.class_first_where((fl, sl), from, |k| fits(key_record(k))) {
                return Some((key_record(k), Placement::Front));
            }
            from = 0;
            at = self.large.class_at_or_above(fl, sl + 1);
        }
        None
    }

    /// Panics unless every free node is filed once as the invariants of the [module docs](self) say
    /// (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self, nodes: &[Node]) {
        let g = self.granule_log2;
        let filed = self.large.check(|k| {
            let n = &nodes[key_record(k) as usize];
            assert_eq!(k, key(n.size, n.offset, key_record(k)), "stale key");
            assert!(n.size >> g >= EXACT as u64, "small block in large");
            size_class(n.size >> g)
        });
        let count = filed + self.small.check(nodes);
        let free = nodes.iter().filter(|n| n.is_free()).count();
        assert_eq!(count, free, "free nodes filed");
    }
}

impl FreeIndex for BestFitIndex {
    #[inline(always)]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let g = size >> self.granule_log2;
        if g < EXACT as u64 {
            self.small.insert(nodes, n, g as usize, offset >> self.granule_log2);
        } else {
            self.large.insert(size_class(g), key(size, offset, n));
        }
    }

    #[inline(always)]
    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        self.unfile(nodes, n, offset, size);
    }

    #[inline(always)]
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64) {
        self.unfile(nodes, n, old_offset, old_size);
        self.insert(nodes, n);
    }

    #[inline(always)]
    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        if align > granule {
            return self.find_aligned(nodes, size, align);
        }
        // Every block fits at its front: the lowest block of the smallest non-empty bucket, else the best
        // fit of `large`.
        let g = size >> self.granule_log2;
        if g < EXACT as u64 {
            if let Some(s) = self.small.bucket_at_least(g as usize) {
                return Some((self.small.bucket_min(s), Placement::Front));
            }
        }
        let from = size.max((EXACT as u64) << self.granule_log2);
        let (k, _) = self.large.first_at_least(self.large_class(from), key(from, 0, 0))?;
        Some((key_record(k), Placement::Front))
    }

    fn largest(&self, _nodes: &[Node]) -> u64 {
        if let Some(k) = self.large.last() {
            return key_size(k);
        }
        self.small.highest().map_or(0, |s| (s as u64) << self.granule_log2)
    }

    fn clear(&mut self) {
        self.small.clear();
        self.large.clear();
    }
}

/// Best-fit sub-allocator over `[0, capacity)`. See the module docs for invariants and complexity.
#[derive(Debug)]
pub struct BestFit(pub(crate) BlockList<BestFitIndex>);

block_list_strategy!(BestFit, "best-fit", BestFitIndex::new);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{Allocation, SubAllocator};

    impl BestFitIndex {
        /// Trie nodes in use (tests only).
        fn trie_nodes(&self) -> usize {
            self.small.trie_nodes()
        }

        /// The most trie nodes on a path from a bucket to a list (tests only).
        fn trie_depth(&self) -> usize {
            self.small.trie_depth()
        }
    }

    /// Random allocations (one in four with an alignment above the granule) and frees of sizes from
    /// `size`; every placement is checked against a scan of the free blocks (the smallest that fits, then
    /// the lowest address) and the index against its invariants. Returns the most trie nodes in use.
    fn churn_against_a_scan(h: &mut BestFit, steps: usize, seed: u64, size: impl Fn(u64) -> u64) -> usize {
        let mut rng = crate::testing::SplitMix64::new(seed);
        let (mut mine, mut most) = (Vec::<Allocation>::new(), 0);
        for step in 0..steps {
            let r = rng.next_u64();
            if !r.is_multiple_of(3) || mine.is_empty() {
                let size = size(r >> 8);
                let align = if r.is_multiple_of(4) { h.granule() << ((r >> 40) % 5) } else { 1 };
                let rounded = size.div_ceil(h.granule()) * h.granule();
                let want = h
                    .free_blocks()
                    .filter(|&(o, l)| fit_front(o, l, rounded, align.max(h.granule())).is_some())
                    .min_by_key(|&(o, l)| (l, o));
                match h.alloc(size, align) {
                    Ok(a) => {
                        let (o, l) = want.unwrap_or_else(|| panic!("step {step}: allocated although nothing fits"));
                        assert!(a.offset >= o && a.offset < o + l, "step {step}: best fit is ({o}, {l}), got {a:?}");
                        mine.push(a);
                    }
                    Err(_) => assert_eq!(want, None, "step {step}: nothing allocated although a block fits"),
                }
            } else {
                let a = mine.swap_remove((r >> 20) as usize % mine.len());
                h.free(a).unwrap();
            }
            h.0.index.check(h.0.nodes());
            most = most.max(h.0.index.trie_nodes());
        }
        for a in mine {
            h.free(a).unwrap();
        }
        most
    }

    /// Leaves every other block of `sizes` (allocated in order) free.
    fn holes(h: &mut BestFit, sizes: impl Iterator<Item = u64>) -> Vec<Allocation> {
        let live: Vec<_> = sizes.map(|s| h.alloc(s, 1).unwrap()).collect();
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
        held
    }

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
        h.0.index.check(h.0.nodes());
    }

    /// Thousands of holes of three sizes: their buckets burst into tries two and three levels deep and
    /// empty again, and every placement is still the smallest fitting hole at the lowest address.
    #[test]
    fn crowded_buckets_stay_exact_through_bursts() {
        let mut h = BestFit::with_granule(1 << 14, 1).unwrap();
        let held = holes(&mut h, (0..6000).map(|i| 1 + (i * 7) % 3));
        let tries = h.0.index.trie_nodes();
        assert!(tries >= 8 && h.0.index.trie_depth() >= 3, "{tries} trie nodes, {} deep", h.0.index.trie_depth());
        let most = churn_against_a_scan(&mut h, 2000, 5, |r| 1 + r % 4);
        assert!(most >= tries, "{most} trie nodes at most");
        for a in held {
            h.free(a).unwrap();
            h.0.index.check(h.0.nodes());
        }
        assert_eq!(h.0.index.trie_nodes(), 0, "every trie node freed");
        assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 14)]);
    }

    /// Holes filed in decreasing address order each land at the front of their bucket's list, which grows
    /// past `LIST_MAX` without a burst; the first that lands past the list's eighth block bursts it, and
    /// the lowest hole is taken first throughout.
    #[test]
    fn a_list_grows_at_its_front_and_bursts_behind() {
        let mut h = BestFit::with_granule(1 << 12, 1).unwrap();
        let live: Vec<_> = (0..64).map(|_| h.alloc(1, 1).unwrap()).collect();
        // Every other block, from the 46th down: holes of one granule, none adjacent to another.
        for i in (1..=23).rev().map(|k| 2 * k) {
            h.free(live[i]).unwrap();
            h.0.index.check(h.0.nodes());
        }
        assert_eq!(h.0.index.trie_nodes(), 0, "front insertions burst a list");
        h.free(live[60]).unwrap();
        h.0.index.check(h.0.nodes());
        assert!(h.0.index.trie_nodes() > 0, "an insertion past the eighth block did not burst the list");
        for i in (1..=23).map(|k| 2 * k).chain([60]) {
            assert_eq!(h.alloc(1, 1).unwrap().offset, live[i].offset);
            h.0.index.check(h.0.nodes());
        }
        assert_eq!(h.0.index.trie_nodes(), 0, "trie nodes left");
    }

    /// Sizes on both sides of `EXACT` granules: requests move between the buckets and `large`, aligned
    /// requests skip candidates of both.
    #[test]
    fn buckets_and_large_blocks_order_as_one() {
        let g = 16;
        let mut h = BestFit::with_granule(1 << 26, g).unwrap();
        let near = |r: u64| (EXACT as u64 - 40 + r % 80) * g;
        let held = holes(&mut h, (0..400).map(near));
        churn_against_a_scan(&mut h, 1500, 9, near);
        for a in held {
            h.free(a).unwrap();
        }
        h.0.index.check(h.0.nodes());
        assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 26)]);
    }

    /// A range of 2^48 bytes at a granule of 1 byte: digit keys of 48 bits, tries eight levels tall.
    #[test]
    fn holes_spread_over_2_pow_48_bytes() {
        let mut h = BestFit::with_granule(1 << 48, 1).unwrap();
        let mut rng = crate::testing::SplitMix64::new(3);
        let sizes: Vec<u64> =
            (0..1200).map(|i| if i % 2 == 0 { 1 + i % 3 } else { 1 << (20 + rng.next_u64() % 16) }).collect();
        let held = holes(&mut h, sizes.into_iter());
        assert!(h.0.index.trie_depth() >= 2, "tries {} deep", h.0.index.trie_depth());
        churn_against_a_scan(&mut h, 600, 4, |r| 1 + r % 3);
        for a in held {
            h.free(a).unwrap();
        }
        h.0.index.check(h.0.nodes());
        assert_eq!(h.0.index.trie_nodes(), 0);
    }
}
