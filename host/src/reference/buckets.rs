//! Exact-size buckets of address tries: the free blocks below `EXACT` granules by size, each size in address
//! order: [best-fit](super::best_fit)'s index (the smallest non-empty bucket, its lowest address).
//!
//! - **Sizes**: a two-level bitmap over the buckets answers "the smallest non-empty bucket of at least `n`
//!   granules" with two `trailing_zeros`, without a tree walk.
//! - **Addresses**: a bucket is a *slot*. A slot holds either a list of blocks sorted by address, linked
//!   through the nodes' `a` (previous) and `b` (next) fields, or a 64-ary trie node that splits its blocks by
//!   six bits of their *digit key* `(offset / granule) >> log2(s)` (distinct within a bucket, since blocks
//!   of `s ≥ 2^log2(s)` granules do not overlap, and ordered like the offsets). A node has a bitmap of its
//!   non-empty slots; an insertion that would land past the `LIST_MAX`-th block of a list first splits the
//!   list into a node one level down (a *burst*), so an insertion walks at most `LIST_MAX` list nodes and
//!   never the list's tail (a list grows past `LIST_MAX` blocks only at its front). A bucket's smallest
//!   address is the head of the list reached by following the lowest set bit of each node from the
//!   bucket's slot.
//! - A list head's `a` names the slot that holds it (a *slot ref*) and a node names its parent slot, so a
//!   removal unlinks the block in O(1) without a search: only a head's removal writes its slot, and only a
//!   slot that empties clears its bit (and frees a node that empties, up the tree).
//!
//! # Invariants
//! - A block filed in bucket `s` is a free block of `s` granules, filed once.
//! - Bit `s & 63` of `sizes[s >> 6]` is set iff bucket `s` is non-empty; bit `w` of `size_summary` is set
//!   iff `sizes[w] != 0`. The slot `buckets[s]` is meaningful only while bucket `s` is non-empty.
//! - Bit `i` of a trie node's `bitmap` is set iff its slot `i` is non-empty; no node is empty (a node whose
//!   last block leaves is freed and its parent slot cleared).
//! - The slots on the path from a bucket to a block spell the block's digit key from the top: under slot
//!   `i` of a node with shift `h`, `(digit key >> h) & 63 == i`. The node in a bucket's slot has shift
//!   `root_shift[log2(s)]` (the highest digit-key bits the range can have), each child node six less.
//! - A list is sorted by ascending offset; `b` links to the next block (`NIL` at the end), `a` to the
//!   previous block, or for the head to its slot (a slot ref). A list in a slot of a node with shift 0
//!   holds one block (one digit key), as does the slot of a bucket that cannot burst.
//!
//! # Time complexity
//! The smallest non-empty bucket of at least `n` granules: O(1). A bucket's lowest address and an insertion
//! descend the bucket's trie, at most `ceil(log64(capacity / granule))` nodes (5 at 128 GiB), plus a walk of
//! at most `LIST_MAX` list nodes (and a burst, O(list length), when it would walk further). A removal: O(1)
//! (plus the nodes that empty with it).
//!
//! # Measurement behind the design
//! Walking only to the insertion point (before, an insertion also counted the list's tail to keep every
//! list at most `LIST_MAX` long) took best-fit from 496.0 to 491.4 instructions, 9.92 to 9.70 D1 misses
//! and 5.25 to 4.32 mispredicted branches per pair of the strategies benchmark (callgrind; first-fit 963.9
//! to 960.2), with the same placements; see `bench/results/2026-12-02-79e840c-bucket-walks.md`.

use super::block_list::{Node, NIL};

/// Blocks of fewer granules than this have exact-size buckets.
pub(crate) const EXACT: usize = 4096;

/// Most list nodes an insertion walks past: one that would land further bursts the list first.
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

/// Free blocks of fewer than `EXACT` granules in exact-size buckets, each a trie of address-sorted lists.
/// See the [module docs](self) for the invariants.
#[derive(Debug)]
pub(crate) struct SizeBuckets {
    granule_log2: u32,
    sizes: [u64; EXACT / 64],
    size_summary: u64,
    buckets: Vec<u32>,
    /// The shift of a node that replaces the slot of a bucket of `2^j ≤ s < 2^(j+1)` granules, by `j`;
    /// `u32::MAX` where every block of such a bucket has digit key 0 (the slot never bursts).
    root_shift: [u32; 12],
    tries: Vec<TrieNode>,
    spare_tries: Vec<u32>,
}

impl SizeBuckets {
    /// The buckets of a range of `capacity` bytes with offsets and sizes in multiples of `granule`.
    pub(crate) fn new(capacity: u64, granule: u64) -> Self {
        let granule_log2 = granule.trailing_zeros();
        let top = capacity.saturating_sub(1) >> granule_log2;
        let root_shift = std::array::from_fn(|j| match 64 - (top >> j).leading_zeros() {
            0 => u32::MAX,
            bits => 6 * ((bits - 1) / 6),
        });
        SizeBuckets {
            granule_log2,
            sizes: [0; EXACT / 64],
            size_summary: 0,
            buckets: vec![0; EXACT],
            root_shift,
            tries: Vec::new(),
            spare_tries: Vec::new(),
        }
    }

    /// Forgets every block.
    pub(crate) fn clear(&mut self) {
        self.sizes = [0; EXACT / 64];
        self.size_summary = 0;
        self.tries.clear();
        self.spare_tries.clear();
    }

    /// Is bucket `s` non-empty? Tests only.
    #[cfg(test)]
    fn is_filled(&self, s: usize) -> bool {
        self.sizes[s >> 6] & (1 << (s & 63)) != 0
    }

    /// The largest non-empty bucket.
    #[inline]
    pub(crate) fn highest(&self) -> Option<usize> {
        if self.size_summary == 0 {
            return None;
        }
        let w = 63 - self.size_summary.leading_zeros() as usize;
        Some(w << 6 | (63 - self.sizes[w].leading_zeros() as usize))
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
    pub(crate) fn bucket_at_least(&self, g: usize) -> Option<usize> {
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
    pub(crate) fn bucket_min(&self, s: usize) -> u32 {
        let mut v = self.buckets[s];
        while v & CHILD != 0 {
            let t = &self.tries[(v & !CHILD) as usize];
            v = t.slots[t.bitmap.trailing_zeros() as usize];
        }
        v
    }

    /// Files free node `n` of `s` granules (`s < EXACT`) at offset `off_g` granules in bucket `s`.
    #[inline(always)]
    pub(crate) fn insert(&mut self, nodes: &mut [Node], n: u32, s: usize, off_g: u64) {
        assert!(n < CHILD, "node index above 2^31");
        let j = 63 - (s as u64).leading_zeros();
        let digits = off_g >> j;
        let (w, bit) = (s >> 6, 1u64 << (s & 63));
        if self.sizes[w] & bit == 0 {
            self.sizes[w] |= bit;
            self.size_summary |= 1 << w;
            self.buckets[s] = n;
            (nodes[n as usize].a, nodes[n as usize].b) = (BUCKET_REF | s as u32, NIL);
            return;
        }
        let offset = nodes[n as usize].offset;
        loop {
            let (mut v, mut r) = (self.buckets[s], BUCKET_REF | s as u32);
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
            // `v` heads the list of slot `r`: insert by address, among its first `LIST_MAX` blocks.
            let (mut prev, mut cur, mut len) = (NIL, v, 0);
            while len < LIST_MAX && cur != NIL && nodes[cur as usize].offset < offset {
                (prev, cur, len) = (cur, nodes[cur as usize].b, len + 1);
            }
            if len == LIST_MAX {
                // The block would land past the list's `LIST_MAX`-th: split the list, and descend again.
                debug_assert!(burst_shift < 64, "a list of {LIST_MAX} blocks in a slot that cannot burst");
                self.burst(nodes, r, burst_shift, j);
                continue;
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
            return;
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
    pub(crate) fn remove(&mut self, nodes: &mut [Node], n: u32) {
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

    /// The blocks of bucket `s` by ascending address until `f` returns true; that block.
    #[inline]
    pub(crate) fn first_where(&self, nodes: &[Node], s: usize, f: &mut impl FnMut(u32) -> bool) -> Option<u32> {
        self.first_in(nodes, self.buckets[s], f)
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

    /// Panics unless every block filed is where the invariants of the [module docs](self) say; returns the
    /// number of blocks filed (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self, nodes: &[Node]) -> usize {
        let g = self.granule_log2;
        let mut count = 0;
        let mut live_tries = vec![false; self.tries.len()];
        for s in 1..EXACT {
            if !self.is_filled(s) {
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
                    assert!(n.is_free(), "live or spare node {cur} filed");
                    assert_eq!(n.size >> g, s as u64, "node {cur} in the wrong bucket");
                    assert_eq!(n.a, prev, "back link of node {cur}");
                    let digits = (n.offset >> g) >> j;
                    if let Some(h) = shift {
                        assert_eq!(digits >> h, prefix, "node {cur} in the wrong slot");
                    }
                    assert!(last.is_none_or(|o| o < n.offset), "list unsorted at node {cur}");
                    (last, prev, cur, len) = (Some(n.offset), cur, n.b, len + 1);
                }
                assert!(len > 0, "empty list");
                assert!(shift != Some(0) || len == 1, "several blocks with one digit key");
                assert!(
                    shift.is_some() || self.root_shift[j as usize] != u32::MAX || len == 1,
                    "several blocks in bucket {s}, which cannot burst"
                );
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
        count
    }

    /// Trie nodes in use (tests only).
    #[cfg(test)]
    pub(crate) fn trie_nodes(&self) -> usize {
        self.tries.len() - self.spare_tries.len()
    }

    /// The most trie nodes on a path from a bucket to a list (tests only).
    #[cfg(test)]
    pub(crate) fn trie_depth(&self) -> usize {
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
