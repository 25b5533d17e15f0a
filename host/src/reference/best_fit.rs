//! Best-fit: the smallest free block that fits, ties broken by the lowest address.
//!
//! Free blocks live in the shared block list (`block_list.rs`): out-of-band nodes linked to their physical
//! neighbours, so merging with free neighbours on free is O(1) and immediate; a split or merge re-files the
//! changed free block (remove + insert, usually in another bucket).
//!
//! # The index
//! A free block of `s` granules with `s < EXACT` (4096: 1 MiB at the default 256 B granule) is in the
//! *bucket* of size `s`; larger blocks are in `large`, a `ClassIndex` (TLSF size classes, each in exact
//! `(size, offset)` order; see `class_index.rs`).
//!
//! - **Sizes**: a two-level bitmap over the buckets answers "the smallest non-empty bucket of at least `n`
//!   granules" with two `trailing_zeros`, without a tree walk.
//! - **Addresses**: a bucket is a *slot*. A slot holds either a list of blocks sorted by address, linked
//!   through the nodes' `a` (previous) and `b` (next) fields, or a 64-ary trie node that splits its blocks by
//!   six bits of their *digit key* `(offset / granule) >> log2(s)` (distinct within a bucket, since blocks
//!   of `s ≥ 2^log2(s)` granules do not overlap, and ordered like the offsets). A node has a bitmap of its
//!   non-empty slots; a list that would grow past `LIST_MAX` blocks is split into a node one level down
//!   (a *burst*). A bucket's smallest address is the head of the list reached by following the lowest set
//!   bit of each node from the bucket's slot: at most three nodes in the strategies benchmark, whose fullest
//!   bucket holds about 2,000 blocks.
//! - A list head's `a` names the slot that holds it (a *slot ref*) and a node names its parent slot, so a
//!   removal unlinks the block in O(1) without a search: only a head's removal writes its slot, and only a
//!   slot that empties clears its bit (and frees a node that empties, up the tree).
//!
//! The search for `n` granules: the smallest non-empty bucket `s ≥ n` below `EXACT` and its lowest
//! address, else the best fit of `large`: exact best fit. With an alignment above the granule, the
//! candidates from there on that do not fit only because of alignment are skipped one by one.
//!
//! # Invariants
//! - A free block of `s < EXACT` granules is in the trie of bucket `s`, once; every larger free block is in
//!   `large` under key `(size, offset, node)`, once (and its `a`, `b` are unused).
//! - Bit `s & 63` of `sizes[s >> 6]` is set iff bucket `s` is non-empty; bit `w` of `size_summary` is set
//!   iff `sizes[w] != 0`. The slot `buckets[s]` is meaningful only while bucket `s` is non-empty.
//! - Bit `i` of a trie node's `bitmap` is set iff its slot `i` is non-empty; no node is empty (a node whose
//!   last block leaves is freed and its parent slot cleared).
//! - The slots on the path from a bucket to a block spell the block's digit key from the top: under slot
//!   `i` of a node with shift `h`, `(digit key >> h) & 63 == i`. The node in a bucket's slot has shift
//!   `root_shift[log2(s)]` (the highest digit-key bits the range can have), each child node six less.
//! - A list is sorted by ascending offset; `b` links to the next block (`NIL` at the end), `a` to the
//!   previous block, or for the head to its slot (a slot ref). A list holds at most `LIST_MAX` blocks, and
//!   at most one in a slot of a node with shift 0 (one digit key).
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

use super::block_list::{block_list_strategy, size_class, BlockList, FreeIndex, Node, Placement, NIL};
use super::class_index::{key, key_record, key_size, ClassIndex};
use super::fit_front;

/// Blocks of fewer granules than this have exact-size buckets.
const EXACT: usize = 4096;

/// Most blocks in one list.
const LIST_MAX: usize = 8;

/// A slot value with this bit is a trie node (`CHILD | id`); without it, the node index of a list head.
const CHILD: u32 = 1 << 31;

/// A slot ref naming slot `i` of trie node `t`: `SLOT_REF | t << 6 | i` (`t < 2^24`).
const SLOT_REF: u32 = 1 << 31;

/// A slot ref naming the slot of bucket `s`: `BUCKET_REF | s`.
const BUCKET_REF: u32 = 3 << 30;

/// A 64-ary trie node of a bucket: its non-empty slots (`bitmap`), the slot that holds it, and the digit-key
/// bits it splits on (`shift..shift + 6`).
#[derive(Clone, Debug)]
struct TrieNode {
    bitmap: u64,
    parent: u32,
    shift: u32,
    slots: [u32; 64],
}

/// Free blocks in exact `(size, offset)` order: exact-size buckets below `EXACT` granules (each a trie of
/// address-sorted lists), `large` above. See the [module docs](self) for the invariants.
#[derive(Debug)]
pub(crate) struct BestFitIndex {
    granule_log2: u32,
    sizes: [u64; EXACT / 64],
    size_summary: u64,
    buckets: Vec<u32>,
    /// The shift of a node that replaces the slot of a bucket of `2^j ≤ s < 2^(j+1)` granules, by `j`;
    /// `u32::MAX` where every block of such a bucket has digit key 0 (the slot never bursts).
    root_shift: [u32; 12],
    tries: Vec<TrieNode>,
    spare_tries: Vec<u32>,
    large: ClassIndex,
}

impl BestFitIndex {
    /// The index of a range of `capacity` bytes with offsets and sizes in multiples of `granule`.
    pub(crate) fn new(capacity: u64, granule: u64) -> Self {
        let granule_log2 = granule.trailing_zeros();
        let top = capacity.saturating_sub(1) >> granule_log2;
        let root_shift = std::array::from_fn(|j| match 64 - (top >> j).leading_zeros() {
            0 => u32::MAX,
            bits => 6 * ((bits - 1) / 6),
        });
        BestFitIndex {
            granule_log2,
            sizes: [0; EXACT / 64],
            size_summary: 0,
            buckets: vec![0; EXACT],
            root_shift,
            tries: Vec::new(),
            spare_tries: Vec::new(),
            large: ClassIndex::default(),
        }
    }

    /// The slot a slot ref names.
    #[inline(always)]
    fn slot_mut(&mut self, r: u32) -> &mut u32 {
        if r >= BUCKET_REF {
            &mut self.buckets[(r - BUCKET_REF) as usize]
        } else {
            let x = r - SLOT_REF;
            &mut self.tries[(x >> 6) as usize].slots[(x & 63) as usize]
        }
    }

    /// The smallest non-empty bucket of at least `g` granules (`g < EXACT`).
    #[inline(always)]
    fn bucket_at_least(&self, g: usize) -> Option<usize> {
        let w = g >> 6;
        let bits = self.sizes[w] & (u64::MAX << (g & 63));
        if bits != 0 {
            return Some(w << 6 | bits.trailing_zeros() as usize);
        }
        let above = if w + 1 < 64 { self.size_summary & (u64::MAX << (w + 1)) } else { 0 };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w << 6 | self.sizes[w].trailing_zeros() as usize)
    }

    /// The lowest-address block of the non-empty bucket `s`.
    #[inline(always)]
    fn bucket_min(&self, s: usize) -> u32 {
        let mut v = self.buckets[s];
        while v & CHILD != 0 {
            let t = &self.tries[(v & !CHILD) as usize];
            v = t.slots[t.bitmap.trailing_zeros() as usize];
        }
        v
    }

    /// Files free node `n` of `s` granules (`s < EXACT`) at offset `off_g` granules in bucket `s`.
    #[inline(always)]
    fn insert_exact(&mut self, nodes: &mut [Node], n: u32, s: usize, off_g: u64) {
        assert!(n < CHILD, "node index above 2^31");
        let j = 63 - (s as u64).leading_zeros();
        let digits = off_g >> j;
        let (w, bit) = (s >> 6, 1u64 << (s & 63));
        let mut r = BUCKET_REF | s as u32;
        if self.sizes[w] & bit == 0 {
            self.sizes[w] |= bit;
            self.size_summary |= 1 << w;
            self.buckets[s] = n;
            (nodes[n as usize].a, nodes[n as usize].b) = (r, NIL);
            return;
        }
        let mut v = self.buckets[s];
        // The shift of a node that would replace the list's slot: 64 or more where the slot cannot burst
        // (a never-bursting bucket, or a node of shift 0, whose lists hold one block).
        let mut burst_shift = self.root_shift[j as usize];
        while v & CHILD != 0 {
            let t = v & !CHILD;
            let node = &mut self.tries[t as usize];
            let i = ((digits >> node.shift) & 63) as u32;
            r = SLOT_REF | t << 6 | i;
            if node.bitmap & (1 << i) == 0 {
                node.bitmap |= 1 << i;
                node.slots[i as usize] = n;
                (nodes[n as usize].a, nodes[n as usize].b) = (r, NIL);
                return;
            }
            burst_shift = node.shift.wrapping_sub(6);
            v = node.slots[i as usize];
        }
        // `v` heads the list of slot `r`: insert by address.
        let offset = nodes[n as usize].offset;
        let (mut prev, mut cur, mut len) = (NIL, v, 1);
        while cur != NIL && nodes[cur as usize].offset < offset {
            (prev, cur, len) = (cur, nodes[cur as usize].b, len + 1);
        }
        nodes[n as usize].b = cur;
        if prev == NIL {
            nodes[n as usize].a = r;
            *self.slot_mut(r) = n;
        } else {
            nodes[n as usize].a = prev;
            nodes[prev as usize].b = n;
        }
        if cur != NIL {
            nodes[cur as usize].a = n;
        }
        let mut rest = cur;
        while rest != NIL {
            (rest, len) = (nodes[rest as usize].b, len + 1);
        }
        if len > LIST_MAX && burst_shift < 64 {
            self.burst(nodes, r, burst_shift, j);
        }
    }

    /// Replaces the list of slot `r` by a trie node that splits it on digit-key bits `shift..shift + 6`
    /// (bucket blocks of `2^j` to `2^(j+1) - 1` granules), bursting again if all its blocks share a slot.
    #[cold]
    #[inline(never)]
    fn burst(&mut self, nodes: &mut [Node], r: u32, shift: u32, j: u32) {
        let t = match self.spare_tries.pop() {
            Some(t) => {
                self.tries[t as usize].bitmap = 0;
                t
            }
            None => {
                self.tries.push(TrieNode { bitmap: 0, parent: 0, shift: 0, slots: [0; 64] });
                (self.tries.len() - 1) as u32
            }
        };
        assert!(t < 1 << 24, "best-fit trie above 2^24 nodes");
        self.tries[t as usize].parent = r;
        self.tries[t as usize].shift = shift;
        let mut cur = *self.slot_mut(r);
        let mut tails = [NIL; 64];
        while cur != NIL {
            let next = nodes[cur as usize].b;
            let i = (((nodes[cur as usize].offset >> self.granule_log2) >> j >> shift) & 63) as usize;
            let node = &mut self.tries[t as usize];
            if node.bitmap & (1 << i) == 0 {
                node.bitmap |= 1 << i;
                node.slots[i] = cur;
                nodes[cur as usize].a = SLOT_REF | t << 6 | i as u32;
            } else {
                nodes[tails[i] as usize].b = cur;
                nodes[cur as usize].a = tails[i];
            }
            nodes[cur as usize].b = NIL;
            tails[i] = cur;
            cur = next;
        }
        *self.slot_mut(r) = CHILD | t;
        let bitmap = self.tries[t as usize].bitmap;
        if bitmap.is_power_of_two() && shift > 0 {
            self.burst(nodes, SLOT_REF | t << 6 | bitmap.trailing_zeros(), shift - 6, j);
        }
    }

    /// Unlinks free node `n` from its bucket.
    #[inline(always)]
    fn remove_exact(&mut self, nodes: &mut [Node], n: u32) {
        let Node { a: prev, b: next, .. } = nodes[n as usize];
        if prev < SLOT_REF {
            nodes[prev as usize].b = next;
            if next != NIL {
                nodes[next as usize].a = prev;
            }
            return;
        }
        if next != NIL {
            *self.slot_mut(prev) = next;
            nodes[next as usize].a = prev;
            return;
        }
        self.clear_slot(prev);
    }

    /// Removes free node `n`, filed as a block of `size` bytes at `offset`: unlinked from its bucket, or
    /// removed from `large` by its key.
    #[inline(always)]
    fn unfile(&mut self, nodes: &mut [Node], n: u32, offset: u64, size: u64) {
        if size >> self.granule_log2 < EXACT as u64 {
            self.remove_exact(nodes, n);
        } else {
            let found = self.large.remove(self.large_class(size), key(size, offset, n));
            debug_assert!(found, "free node not in its class");
        }
    }

    /// Marks slot `r` empty, freeing the trie nodes that empty with it.
    #[inline(always)]
    fn clear_slot(&mut self, mut r: u32) {
        loop {
            if r >= BUCKET_REF {
                let s = (r - BUCKET_REF) as usize;
                self.sizes[s >> 6] &= !(1 << (s & 63));
                if self.sizes[s >> 6] == 0 {
                    self.size_summary &= !(1 << (s >> 6));
                }
                return;
            }
            let x = r - SLOT_REF;
            let t = x >> 6;
            let node = &mut self.tries[t as usize];
            node.bitmap &= !(1 << (x & 63));
            if node.bitmap != 0 {
                return;
            }
            r = node.parent;
            self.spare_tries.push(t);
        }
    }

    /// The blocks of the bucket slot value `v`, by ascending address, until `f` returns true; that block.
    fn first_in(&self, nodes: &[Node], v: u32, f: &mut impl FnMut(u32) -> bool) -> Option<u32> {
        if v & CHILD != 0 {
            let t = &self.tries[(v & !CHILD) as usize];
            let mut bits = t.bitmap;
            while bits != 0 {
                if let Some(n) = self.first_in(nodes, t.slots[bits.trailing_zeros() as usize], f) {
                    return Some(n);
                }
                bits &= bits - 1;
            }
            return None;
        }
        let mut cur = v;
        while cur != NIL {
            if f(cur) {
                return Some(cur);
            }
            cur = nodes[cur as usize].b;
        }
        None
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
            let Some(s) = self.bucket_at_least(g) else { break };
            let first = self.bucket_min(s);
            if fits(first) {
                return Some((first, Placement::Front));
            }
            if let Some(n) = self.first_in(nodes, self.buckets[s], &mut fits) {
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
        let mut count = filed;
        let mut live_tries = vec![false; self.tries.len()];
        for s in 1..EXACT {
            let non_empty = self.sizes[s >> 6] & (1 << (s & 63)) != 0;
            if !non_empty {
                continue;
            }
            let j = 63 - (s as u64).leading_zeros();
            // (slot value, slot ref, shift of the slot's node or None for the bucket, digit prefix)
            let mut stack = vec![(self.buckets[s], BUCKET_REF | s as u32, None::<u32>, 0u64)];
            while let Some((v, r, shift, prefix)) = stack.pop() {
                if v & CHILD != 0 {
                    let t = v & !CHILD;
                    assert!(!std::mem::replace(&mut live_tries[t as usize], true), "trie node {t} twice");
                    let node = &self.tries[t as usize];
                    assert_eq!(node.parent, r, "parent of trie node {t}");
                    assert_ne!(node.bitmap, 0, "empty trie node {t}");
                    let want = shift.map_or(self.root_shift[j as usize], |h| h - 6);
                    assert_eq!(node.shift, want, "shift of trie node {t}");
                    let mut bits = node.bitmap;
                    while bits != 0 {
                        let i = bits.trailing_zeros();
                        stack.push((
                            node.slots[i as usize],
                            SLOT_REF | t << 6 | i,
                            Some(node.shift),
                            prefix << 6 | i as u64,
                        ));
                        bits &= bits - 1;
                    }
                    continue;
                }
                let (mut prev, mut cur, mut len, mut last) = (r, v, 0, None);
                while cur != NIL {
                    let n = &nodes[cur as usize];
                    assert!(n.a != super::block_list::LIVE && n.size > 0, "live or spare node {cur} filed");
                    assert_eq!(n.size >> g, s as u64, "node {cur} in the wrong bucket");
                    assert_eq!(n.a, prev, "back link of node {cur}");
                    let digits = (n.offset >> g) >> j;
                    if let Some(h) = shift {
                        assert_eq!(digits >> h, prefix, "node {cur} in the wrong slot");
                    }
                    assert!(last.is_none_or(|o| o < n.offset), "list unsorted at node {cur}");
                    (last, prev, cur, len) = (Some(n.offset), cur, n.b, len + 1);
                }
                assert!(len > 0 && len <= LIST_MAX, "list of {len} blocks");
                assert!(shift != Some(0) || len == 1, "several blocks with one digit key");
                count += len;
            }
        }
        for &t in &self.spare_tries {
            assert!(!std::mem::replace(&mut live_tries[t as usize], true), "spare trie node {t} in use");
        }
        assert!(live_tries.iter().all(|&x| x), "a trie node is neither used nor spare");
        for w in 0..EXACT / 64 {
            assert_eq!(self.sizes[w] != 0, self.size_summary & (1 << w) != 0, "size summary {w}");
        }
        let free = nodes.iter().filter(|n| n.a != super::block_list::LIVE && n.size > 0).count();
        assert_eq!(count, free, "free nodes filed");
    }
}

impl FreeIndex for BestFitIndex {
    #[inline(always)]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let g = size >> self.granule_log2;
        if g < EXACT as u64 {
            self.insert_exact(nodes, n, g as usize, offset >> self.granule_log2);
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
            if let Some(s) = self.bucket_at_least(g as usize) {
                return Some((self.bucket_min(s), Placement::Front));
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
        if self.size_summary == 0 {
            return 0;
        }
        let w = 63 - self.size_summary.leading_zeros() as usize;
        let s = w << 6 | (63 - self.sizes[w].leading_zeros() as usize);
        (s as u64) << self.granule_log2
    }

    fn clear(&mut self) {
        self.sizes = [0; EXACT / 64];
        self.size_summary = 0;
        self.tries.clear();
        self.spare_tries.clear();
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
            self.tries.len() - self.spare_tries.len()
        }

        /// The most trie nodes on a path from a bucket to a list (tests only).
        fn trie_depth(&self) -> usize {
            let depth = |mut t: usize| {
                let mut d = 1;
                while self.tries[t].parent < BUCKET_REF {
                    (t, d) = (((self.tries[t].parent - SLOT_REF) >> 6) as usize, d + 1);
                }
                d
            };
            let spare: std::collections::HashSet<u32> = self.spare_tries.iter().copied().collect();
            (0..self.tries.len()).filter(|t| !spare.contains(&(*t as u32))).map(depth).max().unwrap_or(0)
        }
    }

    /// Random allocations (one in four with an alignment above the granule) and frees of sizes from
    /// `size`; every placement is checked against a scan of the free blocks (the smallest that fits, then
    /// the lowest address) and the index against its invariants. Returns the most trie nodes in use.
    fn churn_against_a_scan(h: &mut BestFit, steps: usize, seed: u64, size: impl Fn(u64) -> u64) -> usize {
        let mut rng = crate::bench::SplitMix64::new(seed);
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
        let mut rng = crate::bench::SplitMix64::new(3);
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
