//! Address-ordered first-fit: the lowest-address free block that fits.
//!
//! # First-fit's index (`FirstFitIndex`)
//! The range is cut into `2^region_log2`-byte *regions* (256 granules, or more so that there are at most
//! `2^20` of them), and every free block is filed in the region its last byte lies in, in that region's
//! address-ordered list (doubly linked through the nodes' `a`/`b`, O(1) unlink). Each region has a *key*:
//! the largest [`size_key`] of its blocks (0 when it has none), and a max tree (`MaxTree`, 32 keys per
//! group, one 64-byte cache line) keeps the largest key of every group of regions, of every group of
//! groups, and so on up to one group. The lowest block of at least `n` granules is then in the lowest
//! region whose key is at least `size_key(n)`: one descent of the tree, a compare of one cache line of
//! keys per level, and a walk of that region's list. Filing by the last byte keeps a block in its region
//! when an allocation carves its front (the usual first-fit split), and for disjoint blocks the order of
//! last bytes is the order of offsets, so the lowest region with a fit holds the lowest fit.
//!
//! A key is a block's size in granules below `2^14` granules (4 MiB at 256 B), and above that a
//! floating-point code (exponent and 8 mantissa bits), so that it fits in 15 bits and a cache line holds
//! 32 of them. The code is monotone: a key above `size_key(n)` always holds `n` granules, an equal one
//! (only from `2^14` granules on) may not, and then the walk finds no fit in that region and the search
//! goes on after it. With an alignment above the granule the search goes on the same way past blocks that
//! fit the size but not the alignment, up to the first that fits both.
//!
//! ## Invariants
//! - A free block is in the list of region `(offset + size - 1) >> region_log2`, once; the lists are in
//!   ascending offset order, `heads[r]` is one more than the node id of region `r`'s first block (0: empty).
//! - A region's key (leaf `r` of the tree) is the largest `size_key` of its blocks, 0 for an empty region;
//!   every inner entry is the largest key of its group of `FAN` entries on the level below, exactly.
//! - No two physically adjacent blocks are free.
//!
//! ## Time complexity
//! `alloc` reads one cache line of keys on each of the tree's four levels (`2^20` regions) and walks one
//! region's list; a block whose key changes rewrites its leaf and the levels above while their maximum
//! changes (a group maximum each, one cache line). `free` is O(1) through the handle
//! plus those updates for the merged block. A region holds at most `2^(region_log2 - granule_log2 - 1)`
//! free blocks (free blocks are never adjacent): 128 at the default region size, whatever the workload;
//! only for ranges above `2^28` granules (64 GiB at 256 B) does the region grow with the range.
//!
//! ## Measurement behind the design
//! Per alloc+free pair of the strategies benchmark (callgrind, `host/benches/strategies_icount.rs`, 100k
//! live blocks, 36k free blocks): exact-size buckets with a min tree of their lowest addresses took
//! 958.5 instructions (best-fit: 514.6), most of it in the buckets' tries and in the min tree's updates
//! (about four a pair, since every allocation takes a bucket's lowest block); the chunked address index
//! ([`AddressIndex`](super::address_index::AddressIndex), the tiered strategy's) alone took 1949.4. This
//! index takes 736.6 (1.43 × best-fit), 12.49 D1 and 5.06 LL misses per pair against 23.12 and 5.40; a
//! variable-depth tree with scalar group scans took 1786.9, with SSE2 scans 930.9; at most `2^18` or
//! `2^16` regions (longer lists), 920.9 and 1604.8 (DESIGN.md §4.4).
//!
//! Blocks live in the shared block list ([`BlockList`]): out-of-band 32-byte nodes in an address-ordered
//! doubly linked list, so merging with free neighbours on free is O(1) and immediate.

use super::block_list::{block_list_strategy, BlockList, FreeIndex, Node, Placement, NIL};
use super::fit_front;

/// Sizes below `2^EXACT_LOG2` granules have keys equal to their size in granules.
const EXACT_LOG2: u32 = 14;

/// Mantissa bits of a key from `2^EXACT_LOG2` granules on.
const MANTISSA: u32 = 8;

/// The key of a free block of `g ≥ 1` granules: `g` below `2^14`, else `2^14 + (e - 14) · 2^8 + m`, where
/// `e` is `g`'s highest bit and `m` the 8 bits below it. Monotone (`a ≤ b` ⇒ `key(a) ≤ key(b)`), exact
/// below `2^14`, at most `2^14 + 50 · 2^8 < 2^15` for `g < 2^64`, so it is a positive `i16`.
#[inline(always)]
fn size_key(g: u64) -> i16 {
    if g < 1 << EXACT_LOG2 {
        return g as i16;
    }
    let e = 63 - g.leading_zeros();
    ((1 << EXACT_LOG2) + ((e - EXACT_LOG2) << MANTISSA) + ((g >> (e - MANTISSA)) as u32 & 0xFF)) as i16
}

/// Keys per group of the max tree: one 64-byte cache line.
const FAN: usize = 32;

/// Granules per region, at least (`2^8`).
const REGION_GRANULES_LOG2: u32 = 8;

/// One group of keys, aligned to a cache line.
#[derive(Clone, Copy, Debug, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Group([i16; FAN]);

impl Group {
    const EMPTY: Group = Group([0; FAN]);

    /// Bit `k` is set iff key `k` is at least `need` (`need ≥ 1`): four SSE2 compares, two packs and two
    /// byte masks on x86-64 (what LLVM makes of the scalar loop below is about 65 instructions).
    #[inline(always)]
    fn at_least(&self, need: i16) -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            // SAFETY: SSE2 is part of the x86-64 baseline, so the intrinsics are available on every
            // x86-64 target; `[i16; 32]` and `[__m128i; 4]` have the same size and every bit pattern is
            // valid for both.
            unsafe {
                let v: [__m128i; 4] = std::mem::transmute(self.0);
                let n = _mm_set1_epi16(need - 1);
                let lo = _mm_packs_epi16(_mm_cmpgt_epi16(v[0], n), _mm_cmpgt_epi16(v[1], n));
                let hi = _mm_packs_epi16(_mm_cmpgt_epi16(v[2], n), _mm_cmpgt_epi16(v[3], n));
                (_mm_movemask_epi8(lo) as u32 & 0xFFFF) | (_mm_movemask_epi8(hi) as u32) << 16
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut m = 0u32;
            for (k, &v) in self.0.iter().enumerate() {
                m |= u32::from(v >= need) << k;
            }
            m
        }
    }

    /// The largest key (keys are never negative).
    #[inline(always)]
    fn max(&self) -> i16 {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            // SAFETY: as in `at_least`.
            unsafe {
                let v: [__m128i; 4] = std::mem::transmute(self.0);
                let m = _mm_max_epi16(_mm_max_epi16(v[0], v[1]), _mm_max_epi16(v[2], v[3]));
                let m = _mm_max_epi16(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
                let m = _mm_max_epi16(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
                let m = _mm_max_epi16(m, _mm_srli_epi32::<16>(m));
                _mm_cvtsi128_si32(m) as i16
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self.0.iter().copied().fold(0, i16::max)
        }
    }
}

/// Regions of a range: `FAN^4`, the leaves of a [`MaxTree`] (the region grows with the range above
/// `2^20` of its minimum size).
const REGIONS: usize = 1 << 20;

/// Groups of leaves, of leaf-group maxima, and of those (`REGIONS / FAN`, `/ FAN^2`, `/ FAN^3`).
const LEAF_GROUPS: usize = REGIONS / FAN;
const MID_GROUPS: usize = LEAF_GROUPS / FAN;
const HIGH_GROUPS: usize = MID_GROUPS / FAN;

// The fourth level is one group.
const _: () = assert!(HIGH_GROUPS == FAN);

/// Largest keys over groups of `FAN`, four levels over [`REGIONS`] leaves: `leaf` holds the leaves (leaf
/// `i` in group `i / FAN`, slot `i % FAN`), entry `g` of `mid` is the maximum of leaf group `g`, entry `h`
/// of `high` the maximum of mid group `h`, entry `t` of `top` the maximum of high group `t`. Every index
/// into a level is reduced modulo its length (a no-op for an index below [`REGIONS`]) so that the
/// compiler drops the bounds checks. The big levels are allocated zeroed: pages never written cost
/// nothing.
#[derive(Debug)]
struct MaxTree {
    leaf: Box<[Group; LEAF_GROUPS]>,
    mid: Box<[Group; MID_GROUPS]>,
    high: [Group; HIGH_GROUPS],
    top: Group,
}

/// Sets `*entry` to `group`'s maximum; returns whether it changed.
#[inline(always)]
fn refresh(group: &Group, entry: &mut i16) -> bool {
    let m = group.max();
    let changed = *entry != m;
    *entry = m;
    changed
}

impl MaxTree {
    fn new() -> Self {
        MaxTree {
            leaf: bytemuck::zeroed_box(),
            mid: bytemuck::zeroed_box(),
            high: [Group::EMPTY; HIGH_GROUPS],
            top: Group::EMPTY,
        }
    }

    #[inline(always)]
    fn leaf(&self, i: usize) -> i16 {
        self.leaf[i / FAN % LEAF_GROUPS].0[i % FAN]
    }

    /// The largest key.
    #[inline(always)]
    fn max(&self) -> i16 {
        self.top.max()
    }

    /// Sets leaf `i` to `key` and the entries above it to their groups' new maxima (up to the first that
    /// does not change).
    #[inline(always)]
    fn set(&mut self, i: usize, key: i16) {
        let (g, h, t) = (i / FAN % LEAF_GROUPS, i / FAN / FAN % MID_GROUPS, i / FAN / FAN / FAN % HIGH_GROUPS);
        self.leaf[g].0[i % FAN] = key;
        if refresh(&self.leaf[g], &mut self.mid[h].0[g % FAN]) && refresh(&self.mid[h], &mut self.high[t].0[h % FAN]) {
            refresh(&self.high[t], &mut self.top.0[t % FAN]);
        }
    }

    /// The lowest slot of `group` with a key of at least `need`, which has one.
    #[inline(always)]
    fn slot(group: &Group, need: i16) -> usize {
        let m = group.at_least(need);
        debug_assert!(m != 0, "max tree entry above its group's maximum");
        m.trailing_zeros() as usize % FAN
    }

    /// The lowest leaf under entry `t` of `top`, `h` of `high` or `g` of `mid` (`level` 3, 2 or 1, the
    /// entry holding a key of at least `need`) with a key of at least `need`.
    #[inline(always)]
    fn descend(&self, level: u32, mut i: usize, need: i16) -> usize {
        if level >= 3 {
            i = i * FAN + Self::slot(&self.high[i % HIGH_GROUPS], need);
        }
        if level >= 2 {
            i = i * FAN + Self::slot(&self.mid[i % MID_GROUPS], need);
        }
        if level >= 1 {
            i = i * FAN + Self::slot(&self.leaf[i % LEAF_GROUPS], need);
        }
        i
    }

    /// The lowest leaf with a key of at least `need`.
    #[inline(always)]
    fn first(&self, need: i16) -> Option<usize> {
        let m = self.top.at_least(need);
        (m != 0).then(|| self.descend(3, m.trailing_zeros() as usize, need))
    }

    /// The lowest leaf from `i` on with a key of at least `need`: up from `i`'s leaf group to the first
    /// level where a later entry has one, then down.
    fn next(&self, i: usize, need: i16) -> Option<usize> {
        if i >= REGIONS {
            return None;
        }
        let after = |group: &Group, slot: usize| group.at_least(need) & (u32::MAX << slot);
        let mut e = i;
        for level in 0..4 {
            let group = match level {
                0 => &self.leaf[e / FAN % LEAF_GROUPS],
                1 => &self.mid[e / FAN % MID_GROUPS],
                2 => &self.high[e / FAN % HIGH_GROUPS],
                _ => &self.top,
            };
            let m = after(group, e % FAN);
            if m != 0 {
                return Some(self.descend(level, e / FAN * FAN + m.trailing_zeros() as usize, need));
            }
            // Nothing after `e` in its group: on the level above, the entries after the group's own.
            e = e / FAN + 1;
            if e >= REGIONS >> (5 * (level + 1)) {
                return None;
            }
        }
        None
    }

    /// Zeroes every key; calls `leaf` on each leaf that was not zero. Visits only the non-zero groups.
    fn clear(&mut self, leaf: &mut impl FnMut(usize)) {
        let nonzero = |g: &Group| g.0.iter().enumerate().filter(|(_, &v)| v != 0).map(|(k, _)| k).collect::<Vec<_>>();
        for t in nonzero(&self.top) {
            for h in nonzero(&self.high[t]).into_iter().map(|k| t * FAN + k) {
                for g in nonzero(&self.mid[h]).into_iter().map(|k| h * FAN + k) {
                    for k in nonzero(&self.leaf[g]) {
                        leaf(g * FAN + k);
                    }
                    self.leaf[g] = Group::EMPTY;
                }
                self.mid[h] = Group::EMPTY;
            }
            self.high[t] = Group::EMPTY;
        }
        self.top = Group::EMPTY;
    }
}

/// First-fit's index: free blocks filed by address region, with a max tree over the regions' largest
/// keys. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct FirstFitIndex {
    granule_log2: u32,
    region_log2: u32,
    /// One more than the node id of each region's lowest free block; 0 for an empty region.
    heads: Box<[u32; REGIONS]>,
    tree: MaxTree,
}

impl FirstFitIndex {
    /// The index of a range of `capacity` bytes (at most `2^48`) with offsets and sizes in multiples of
    /// `granule`.
    pub(crate) fn new(capacity: u64, granule: u64) -> Self {
        let granule_log2 = granule.trailing_zeros();
        let bits = u64::BITS - capacity.saturating_sub(1).leading_zeros();
        let region_log2 = (granule_log2 + REGION_GRANULES_LOG2).max(bits.saturating_sub(REGIONS.ilog2()));
        FirstFitIndex { granule_log2, region_log2, heads: bytemuck::zeroed_box(), tree: MaxTree::new() }
    }

    /// The region of a block of `size ≥ 1` bytes at `offset`: the one its last byte lies in.
    #[inline(always)]
    fn region(&self, offset: u64, size: u64) -> usize {
        ((offset + size - 1) >> self.region_log2) as usize % REGIONS
    }

    #[inline(always)]
    fn key(&self, size: u64) -> i16 {
        size_key(size >> self.granule_log2)
    }

    /// The first block of region `r`'s list, `NIL` if it is empty.
    #[inline(always)]
    fn head(&self, r: usize) -> u32 {
        self.heads[r % REGIONS].wrapping_sub(1)
    }

    /// The largest size of region `r`'s blocks, bytes (0 if none).
    #[inline]
    fn region_largest(&self, nodes: &[Node], r: usize) -> u64 {
        let (mut n, mut largest) = (self.head(r), 0);
        while n != NIL {
            let node = &nodes[n as usize];
            largest = largest.max(node.size);
            n = node.a;
        }
        largest
    }

    /// Sets region `r`'s key to the largest key of its blocks (after its largest may have left or shrunk).
    /// The largest of the blocks' keys, not the key of [`Self::region_largest`]: 15 fewer instructions per
    /// pair of the strategies benchmark (callgrind).
    #[inline]
    fn rekey(&mut self, nodes: &[Node], r: usize) {
        let (mut n, mut k) = (self.head(r), 0);
        while n != NIL {
            let node = &nodes[n as usize];
            k = k.max(self.key(node.size));
            n = node.a;
        }
        self.tree.set(r, k);
    }

    /// Links free node `n` into region `r`'s list, in address order.
    #[inline(always)]
    fn link(&mut self, nodes: &mut [Node], n: u32, r: usize) {
        let offset = nodes[n as usize].offset;
        let h = self.head(r);
        if h == NIL || nodes[h as usize].offset > offset {
            (nodes[n as usize].a, nodes[n as usize].b) = (h, NIL);
            if h != NIL {
                nodes[h as usize].b = n;
            }
            self.heads[r % REGIONS] = n + 1;
            return;
        }
        let mut p = h;
        loop {
            let next = nodes[p as usize].a;
            if next == NIL || nodes[next as usize].offset > offset {
                (nodes[n as usize].a, nodes[n as usize].b) = (next, p);
                nodes[p as usize].a = n;
                if next != NIL {
                    nodes[next as usize].b = n;
                }
                return;
            }
            p = next;
        }
    }

    /// Unlinks free node `n` from region `r`'s list.
    #[inline(always)]
    fn unlink(&mut self, nodes: &mut [Node], n: u32, r: usize) {
        let Node { a: next, b: prev, .. } = nodes[n as usize];
        if prev == NIL {
            self.heads[r % REGIONS] = next.wrapping_add(1);
        } else {
            nodes[prev as usize].a = next;
        }
        if next != NIL {
            nodes[next as usize].b = prev;
        }
    }

    /// Removes free node `n`, filed at `offset` with `size` bytes (its node may hold new values).
    #[inline(always)]
    fn unfile(&mut self, nodes: &mut [Node], n: u32, offset: u64, size: u64) {
        let r = self.region(offset, size);
        self.unlink(nodes, n, r);
        if self.key(size) == self.tree.leaf(r) {
            self.rekey(nodes, r);
        }
    }

    /// The lowest block holding at least `size` bytes (key `need`) and accepted by `fits`, from the first
    /// region with a key of at least `need` on.
    #[inline(always)]
    fn lowest_fit(&self, nodes: &[Node], size: u64, fits: impl Fn(&Node) -> bool) -> Option<u32> {
        let need = self.key(size);
        let mut r = self.tree.first(need)?;
        loop {
            let mut n = self.head(r);
            while n != NIL {
                let node = &nodes[n as usize];
                if node.size >= size && fits(node) {
                    return Some(n);
                }
                n = node.a;
            }
            // No fit in region `r` (its key can be `need` with every block shorter, or a fit misaligned).
            r = self.tree.next(r + 1, need)?;
        }
    }

    /// Panics unless every free node is filed once as the invariants of the [module docs](self) say;
    /// returns (free blocks filed, largest size). Tests only.
    #[cfg(test)]
    pub(crate) fn check(&self, nodes: &[Node]) -> (usize, u64) {
        let (mut count, mut largest) = (0, 0);
        // The non-empty regions; a free node filed nowhere else makes the count below differ.
        let mut next = self.tree.next(0, 1);
        while let Some(r) = next {
            next = self.tree.next(r + 1, 1);
            let (mut n, mut prev, mut key) = (self.head(r), NIL, 0);
            while n != NIL {
                let node = &nodes[n as usize];
                assert!(node.is_free(), "region {r} lists node {n}, not free");
                assert_eq!(self.region(node.offset, node.size), r, "node {n} in the wrong region");
                assert_eq!(node.b, prev, "back link of node {n}");
                if prev != NIL {
                    assert!(nodes[prev as usize].offset < node.offset, "address order in region {r}");
                }
                key = key.max(self.key(node.size));
                largest = largest.max(node.size);
                count += 1;
                (prev, n) = (n, node.a);
            }
            assert_eq!(self.tree.leaf(r), key, "key of region {r}");
        }
        // Leaf groups under a zero entry hold no key: else their blocks were not counted above.
        let t = &self.tree;
        for (g, group) in t.leaf.iter().enumerate().filter(|&(g, _)| t.mid[g / FAN].0[g % FAN] != 0) {
            assert_eq!(t.mid[g / FAN].0[g % FAN], group.max(), "maximum of leaf group {g}");
        }
        for (h, group) in t.mid.iter().enumerate() {
            assert_eq!(t.high[h / FAN].0[h % FAN], group.max(), "maximum of mid group {h}");
        }
        for (i, group) in t.high.iter().enumerate() {
            assert_eq!(t.top.0[i], group.max(), "maximum of high group {i}");
        }
        let free = nodes.iter().filter(|n| n.is_free()).count();
        assert_eq!(count, free, "free nodes filed");
        assert_eq!(self.largest(nodes), largest);
        (free, largest)
    }
}

impl FreeIndex for FirstFitIndex {
    #[inline(always)]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let r = self.region(offset, size);
        self.link(nodes, n, r);
        let k = self.key(size);
        if k > self.tree.leaf(r) {
            self.tree.set(r, k);
        }
    }

    #[inline(always)]
    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        self.unfile(nodes, n, offset, size);
    }

    #[inline(always)]
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64) {
        let Node { size, offset, .. } = nodes[n as usize];
        let r = self.region(old_offset, old_size);
        if self.region(offset, size) != r {
            self.unfile(nodes, n, old_offset, old_size);
            self.insert(nodes, n);
            return;
        }
        // Same region and the same address order: the list stays; only the key may change.
        let (old, new, leaf) = (self.key(old_size), self.key(size), self.tree.leaf(r));
        if new > leaf {
            self.tree.set(r, new);
        } else if old == leaf && new < old {
            self.rekey(nodes, r);
        }
    }

    #[inline(always)]
    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        let n = if align <= granule {
            self.lowest_fit(nodes, size, |_| true)
        } else {
            self.lowest_fit(nodes, size, |node| fit_front(node.offset, node.size, size, align).is_some())
        };
        n.map(|n| (n, Placement::Front))
    }

    /// Exact below `2^14` granules (the top key is the size); above, the largest size among the blocks
    /// of the regions with the top key (blocks within 1/256 of each other in size, usually few).
    fn largest(&self, nodes: &[Node]) -> u64 {
        let top = self.tree.max();
        if top < 1 << EXACT_LOG2 {
            return (top as u64) << self.granule_log2;
        }
        let mut best = 0;
        let mut r = self.tree.first(top);
        while let Some(i) = r {
            best = best.max(self.region_largest(nodes, i));
            r = self.tree.next(i + 1, top);
        }
        best
    }

    fn clear(&mut self) {
        let heads = &mut self.heads;
        self.tree.clear(&mut |r| heads[r] = 0);
    }
}

/// Address-ordered first-fit sub-allocator over `[0, capacity)`. See the module docs.
#[derive(Debug)]
pub struct FirstFit(pub(crate) BlockList<FirstFitIndex>);

block_list_strategy!(FirstFit, "first-fit", FirstFitIndex::new);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::SubAllocator;

    #[test]
    fn picks_the_lowest_fitting_hole() {
        let mut h = FirstFit::with_granule(100, 1).unwrap();
        let offs: Vec<u64> = [10, 12, 10, 30, 10, 12, 16].iter().map(|&s| h.alloc(s, 1).unwrap().offset).collect();
        for i in [1, 3, 5] {
            h.free_at(offs[i]).unwrap();
        }
        assert_eq!(h.alloc(13, 1).unwrap().offset, offs[3]);
        assert_eq!(h.alloc(5, 1).unwrap().offset, offs[1]);
        assert_eq!(h.alloc(8, 1).unwrap().offset, offs[3] + 13, "7 bytes left in the first hole");
        assert_eq!(h.alloc(7, 1).unwrap().offset, offs[1] + 5);
        h.0.check_invariants();
    }

    #[test]
    fn alignment_skips_misaligned_candidates() {
        let mut h = FirstFit::with_granule(1 << 16, 16).unwrap();
        let a = h.alloc(16, 1).unwrap(); // [0,16)
        let b = h.alloc(64, 1).unwrap(); // [16,80)
        let _c = h.alloc(16, 1).unwrap(); // [80,96)
        h.free(b).unwrap(); // hole [16,80): 64 long but no 64-aligned 64-byte start
        let d = h.alloc(64, 64).unwrap();
        assert_eq!(d.offset, 128);
        let e = h.alloc(32, 32).unwrap();
        assert_eq!(e.offset, 32);
        assert_eq!(a.offset, 0);
        h.0.check_invariants();
    }

    /// The shadow model of first-fit: random allocations (half with an alignment above the granule) and
    /// frees of sizes on both sides of `2^EXACT_LOG2` granules (where keys turn from exact to floating),
    /// every placement compared with a brute-force scan of the free blocks (the lowest that fits at the
    /// alignment) and every invariant of the index checked after every step; then everything is freed.
    /// Over 64 MiB at 64 B granules, and over 2^48 bytes at 1 B granules (regions of 2^28 bytes).
    #[test]
    fn first_fit_index_matches_a_scan_under_churn() {
        type Config = (u64, u64, u64, fn(u64) -> u64);
        let configs: [Config; 2] = [
            (1 << 26, 64, 5000, |r| match r % 20 {
                0..14 => 1 + (r >> 8) % 2560,
                14..19 => 64 * ((1 << EXACT_LOG2) - 200 + (r >> 8) % 400),
                _ => 64 * ((1 << EXACT_LOG2) + (r >> 8) % 20_000),
            }),
            (1 << 48, 1, 2000, |r| match r % 10 {
                0..6 => 1 + (r >> 8) % 5000,
                _ => 1 << (12 + (r >> 8) % 30),
            }),
        ];
        for (capacity, granule, steps, size_of) in configs {
            let mut h = BlockList::new(capacity, granule, FirstFitIndex::new(capacity, granule)).unwrap();
            let mut rng = crate::testing::SplitMix64::new(capacity ^ granule);
            let mut live = Vec::new();
            let mut floating = false;
            for step in 0..steps {
                let r = rng.next_u64();
                if !r.is_multiple_of(3) || live.is_empty() {
                    let size = size_of(r >> 4);
                    let align = if r.is_multiple_of(2) { 1 } else { granule << ((r >> 40) % 9) };
                    let rounded = size.div_ceil(granule) * granule;
                    let want = h.free_blocks().find(|&(o, l)| fit_front(o, l, rounded, align.max(granule)).is_some());
                    match h.alloc(size, align) {
                        Ok(b) => {
                            let (o, l) = want.unwrap_or_else(|| panic!("step {step}: allocated although nothing fits"));
                            assert!(b.offset >= o && b.offset < o + l, "step {step}: want ({o}, {l}), got {b:?}");
                            live.push(b);
                        }
                        Err(_) => assert_eq!(want, None, "step {step}: nothing allocated although a block fits"),
                    }
                } else {
                    h.free(live.swap_remove((r >> 20) as usize % live.len())).unwrap();
                }
                h.check_invariants();
                let (count, max) = h.index.check(h.nodes());
                assert_eq!((count, max), (h.stats().free_blocks, h.stats().largest_free), "step {step}");
                floating |= h.free_blocks().filter(|&(_, l)| l / granule >= 1 << EXACT_LOG2).count() >= 2;
            }
            assert!(floating, "never two free blocks with floating keys at once");
            for b in live {
                h.free(b).unwrap();
            }
            h.index.check(h.nodes());
            assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, h.capacity())]);
        }
    }

    /// Keys are monotone, exact below `2^EXACT_LOG2` granules, positive and below `2^15` up to `2^64`.
    #[test]
    fn size_keys_are_monotone() {
        let mut sizes: Vec<u64> = (1..40_000).collect();
        sizes.extend(
            (14..64).flat_map(|e| [-2i64, -1, 0, 1, 2, 255, 256].map(move |d| (1u64 << e).wrapping_add(d as u64))),
        );
        sizes.push(u64::MAX);
        sizes.sort_unstable();
        for w in sizes.windows(2) {
            assert!(size_key(w[0]) <= size_key(w[1]), "key({}) > key({})", w[0], w[1]);
        }
        assert!((1..1 << EXACT_LOG2).all(|g| size_key(g) as u64 == g));
        assert!(size_key(u64::MAX) > 0 && size_key(1 << 20) > size_key((1 << 20) - 4096));
    }

    /// `MaxTree::first`, `next` and the inner maxima against a brute-force scan of the leaves, with keys
    /// set and cleared across group boundaries on every level.
    #[test]
    fn max_tree_answers_like_a_scan() {
        let mut t = MaxTree::new();
        let mut keys = std::collections::BTreeMap::new();
        let mut rng = crate::testing::SplitMix64::new(7);
        let spots = [0, 31, 32, 1023, 1024, 32_767, 32_768, REGIONS / 2, REGIONS - 33, REGIONS - 1];
        for step in 0..4000 {
            let r = rng.next_u64();
            let i = if r % 3 == 0 { spots[(r >> 8) as usize % spots.len()] } else { (r >> 12) as usize % REGIONS };
            let k = if r % 5 == 0 { 0 } else { 1 + ((r >> 40) % 30_000) as i16 };
            t.set(i, k);
            if k == 0 {
                keys.remove(&i);
            } else {
                keys.insert(i, k);
            }
            let need = 1 + (rng.next_u64() % 30_000) as i16;
            let from = spots[step % spots.len()];
            let want = keys.range(from..).find(|&(_, &v)| v >= need).map(|(&i, _)| i);
            assert_eq!(t.next(from, need), want, "step {step}: next({from}, {need})");
            let first = keys.iter().find(|&(_, &v)| v >= need).map(|(&i, _)| i);
            assert_eq!(t.first(need), first, "step {step}: first({need})");
            assert_eq!(t.max(), keys.values().copied().max().unwrap_or(0));
        }
        let mut seen = Vec::new();
        t.clear(&mut |i| seen.push(i));
        assert_eq!(seen, keys.keys().copied().collect::<Vec<_>>());
        assert_eq!((t.max(), t.first(1), t.next(0, 1)), (0, None, None));
    }
}
