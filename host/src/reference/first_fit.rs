//! Address-ordered first-fit: the lowest-address free block that fits.
//!
//! # First-fit's index (`FirstFitIndex`)
//! A free block of `s < EXACT` granules (4096: 1 MiB at the default 256 B granule) is in the exact-size
//! *bucket* `s` of a [`SizeBuckets`] (`buckets.rs`, shared with best-fit: a bitmap over the sizes, each
//! bucket an address-ordered trie of lists linked through the nodes' `a`/`b`, O(1) unlink). Every block of
//! a bucket fits a request of at most `s` granules, so the lowest block of at least `n` granules is the
//! lowest *head* (lowest address) among the buckets `s ≥ n`, or the lowest large block. The heads sit in a
//! small min tree (`Heads`): bucket heads packed as `offset_g << 12 | s` (distinct, and the minimum names
//! its bucket) in groups of 16, groups of 16 groups, and the 16 of those, each level keeping the minimum
//! from each entry to the end of its group: the query reads one entry on each of the three levels. Blocks
//! of `EXACT` granules or more are in an `AddressIndex` (below) of their own, which answers requests of
//! that size exactly (alignment included) and gives the lowest large block for smaller ones.
//!
//! With an alignment above the granule the answer is the lowest of: the large index's lowest aligned fit,
//! the lowest head of the buckets of at least `size + align - granule` bytes (all of whose blocks fit), and
//! for each smaller non-empty bucket of at least `size`, its first block in address order that fits, looked
//! for only below the best so far.
//!
//! ## Invariants
//! - A free block of `s < EXACT` granules is in bucket `s` of `small` (as `buckets.rs` says), a larger one
//!   in `large`, each once.
//! - In flat indices (the levels are stored in groups of 16): `leaf[s]` is the packed head of bucket `s`
//!   (`EMPTY` when empty) and `node[s]` its node; `leaf_min[s]` is the minimum of `leaf[s..=s | 15]`,
//!   `mid_min[g]` of `leaf[16g..16 (g | 15) + 16]`, `top_min[t]` of `leaf[256t..EXACT]`, exactly.
//!
//! ## Time complexity
//! `alloc` below `EXACT` granules: three head entries read, one descent of the chosen bucket's trie and
//! an update of the carved block (unlink, insert into its new bucket); a head that changes rewrites at most
//! 16 entries on each level (the ones it undercuts, or the ones that were it), about log2(16) for random
//! heads. `free`: O(1) through the handle, plus the index updates of the merged
//! neighbours. Requests and blocks of `EXACT` granules or more: as the address index below over the large
//! blocks only. Aligned requests: in addition, the blocks of the buckets of `size` to
//! `size + align - granule` bytes below the best candidate, one by one.
//!
//! ## Measurement behind the design
//! Per alloc+free pair of the strategies benchmark (callgrind, `host/benches/strategies_icount.rs`, 100k
//! live blocks, 35,976 free blocks), first-fit went from 1930.6 instructions (the address index alone) to
//! 1076.5 (best-fit: 496.4), with the same placements and end state. Head trees of 3 levels of 16
//! (1076.5), 4 levels of 8 (1104.6) and a binary tournament (1132.2) were measured; see
//! `bench/results/2026-12-02-aa4ddae-first-fit-classes.md`. Keeping suffix minima instead of group minima
//! took the head query from about 200 instructions to 12, and the pair to 960.1 (best-fit: 497.1, the
//! target 1.5 × that = 745.7: missed; `bench/results/2026-12-02-495c42d-first-fit-suffix-minima.md`). What
//! is left is mostly the buckets' insertions and removals (about 195 instructions per pair) over 36k free
//! blocks, almost three times best-fit's 12.8k.
//!
//! # The address index (`AddressIndex`): large blocks of first-fit, and the tiered strategy's shared range
//! Free blocks are kept in address order in *chunks*: sorted arrays of up to `CHUNK` (32) entries (offset,
//! size and node, each in its own array, so a scan reads consecutive cache lines). The chunks are listed
//! in address order in a directory that keeps, per chunk, its first offset and its largest size, and per
//! group of `GROUP` (64) chunks a bound on the largest size of the group. The lowest fit is a scan of the
//! group bounds (a few cache lines), of one group's chunk maxima and of one chunk's sizes: at most about
//! fifteen consecutive cache lines at 36k free blocks, where the treap this replaces followed ~30 nodes,
//! one cache miss each (issue 11; the measurement is in DESIGN.md §4.4). The same structure answers
//! "highest-address fit" for the [tiered](super::tiered) strategy's large tier by scanning backwards.
//!
//! A free node's `a` holds the id of its chunk, so `remove` and `update` go to the chunk directly and
//! binary-search its offsets; `insert` binary-searches the directory's first offsets. A full chunk splits in
//! two; a chunk that falls to a quarter merges with a neighbour when the two fit in three quarters; both
//! rewrite the directory's tail (O(n / CHUNK), amortised over at least `CHUNK / 4` operations).
//!
//! Blocks live in the shared block list: out-of-band 32-byte nodes in an address-ordered doubly linked
//! list (offset-allocator style), so merging with free neighbours on free is O(1) and immediate, and a split
//! or merge that keeps a free block's address order updates the index in place.
//!
//! ## Invariants of the address index
//! - Concatenating the chunks in directory order lists the free blocks by ascending offset; no chunk is
//!   empty; a free node's `a` is its chunk's id and `pos[chunk]` its directory position.
//! - `first[p]` and `max[p]` are the first offset and the largest size of the chunk at position `p`;
//!   `group_max[g]` is at least the largest of `max` over group `g` (an upper bound: it grows with its
//!   chunks, and a shrink is left stale until a search finds nothing in the group or `largest` measures it).
//! - No two physically adjacent blocks are free.
//!
//! ## Time complexity of the address index
//! With n free blocks: `alloc` reads O(n / (CHUNK · GROUP) + GROUP + CHUNK) consecutive words (about
//! fifteen cache lines at n = 36k), `free` O(log n) plus O(CHUNK) moves; a chunk split or merge costs
//! O(n / CHUNK). `largest_free` is O(n / (CHUNK · GROUP) + GROUP) when the bounds are fresh. With an
//! alignment above the granule a candidate may not fit; the search then resumes after it, and stops at
//! the first block of length `size + align - granule` (which always fits).

use super::block_list::{block_list_strategy, BlockList, FreeIndex, Node, Placement, NIL};
use super::buckets::{SizeBuckets, EXACT};
use super::{fit_back, fit_front};

/// No block: the value of an empty bucket's head.
const EMPTY: u64 = u64::MAX;

/// Buckets per group of the head tree (each level keeps the minimum of `FAN` entries of the one below).
const FAN: usize = 16;

/// Entries of the top level of the head tree (each the minimum of `FAN * FAN` buckets).
const TOP: usize = EXACT / FAN / FAN;

// The top level is one group of `FAN`.
const _: () = assert!(TOP == FAN);

/// The lowest address of every bucket of `small` and suffix minima over groups of them: "the lowest head
/// among the buckets of at least `n` granules" is the minimum of three entries, one per level. A head is
/// packed as `offset_g << 12 | s` (offset in granules, `< 2^48`, and bucket `s < EXACT = 2^12`), so that
/// the minimum names its bucket and no two heads are equal (free blocks have distinct offsets).
///
/// Each level keeps, for every entry, the minimum from it to the end of its group of `FAN` (a *suffix
/// minimum*): `leaf_min` over the buckets' heads, `mid_min` over the groups' minima (group `g`'s is
/// `leaf_min[g][0]`), `top_min` over the 16 top entries (entry `t`'s is `mid_min[t][0]`), the whole top
/// level being one group. A head that goes down lowers the entries before it that it undercuts; one
/// that goes up recomputes the entries that were it, from it down to the first that was not: about
/// log(FAN) entries for random heads, and a level only when the group's minimum changed.
///
/// Each level is kept in groups of `FAN` (`[u64; FAN]`), and every index into them is reduced modulo the
/// array's length (a no-op for a bucket below `EXACT`) so that the compiler drops the bounds checks:
/// 954.7 → 935.6 instructions per first-fit pair of the strategies benchmark (callgrind), against slices
/// cut out of flat vectors.
#[derive(Debug)]
struct Heads {
    /// The packed head of each bucket (`leaf[s / FAN][s % FAN]`), `EMPTY` for an empty one.
    leaf: Box<[[u64; FAN]; EXACT / FAN]>,
    /// `leaf_min[s / FAN][s % FAN]`: the minimum of the heads of buckets `s..=s | (FAN - 1)`.
    leaf_min: Box<[[u64; FAN]; EXACT / FAN]>,
    /// `mid_min[g / FAN][g % FAN]`: the minimum of groups `g..=g | (FAN - 1)`' minima.
    mid_min: [[u64; FAN]; TOP],
    /// `top_min[t]`: the minimum of top entries `t..TOP`.
    top_min: [u64; TOP],
    /// The node of each bucket's head (meaningful while the bucket is non-empty).
    node: Vec<u32>,
}

/// `suf` holds the suffix minima of one group (`suf[j]` is the minimum of the group's values from `j` on);
/// value `i` went down to `v`. Lowers the entries it undercuts; returns whether the group's minimum
/// (`suf[0]`) changed.
#[inline(always)]
fn suffix_lower(suf: &mut [u64; FAN], i: usize, v: u64) -> bool {
    let i = i % FAN;
    for j in (0..=i).rev() {
        if suf[j] <= v {
            return false;
        }
        suf[j] = v;
    }
    true
}

/// `suf` as for [`suffix_lower`]; value `i` went up from `old` (`value(j)` is value `j` now). Recomputes the
/// entries that were `old`; returns whether the group's minimum was `old` (and so changed).
#[inline(always)]
fn suffix_raise(suf: &mut [u64; FAN], i: usize, old: u64, value: impl Fn(usize) -> u64) -> bool {
    let i = i % FAN;
    let mut above = suf.get(i + 1).copied().unwrap_or(EMPTY);
    for j in (0..=i).rev() {
        if suf[j] != old {
            return false;
        }
        above = value(j).min(above);
        suf[j] = above;
    }
    true
}

/// Bucket `s`'s group of `FAN` buckets and its group of `FAN * FAN` (its top entry), reduced modulo the
/// lengths of `leaf` and `top_min` (see [`Heads`]).
#[inline(always)]
fn groups(s: usize) -> (usize, usize) {
    (s / FAN % (EXACT / FAN), s / FAN / FAN % TOP)
}

impl Heads {
    fn new() -> Self {
        Heads {
            leaf: Box::new([[EMPTY; FAN]; EXACT / FAN]),
            leaf_min: Box::new([[EMPTY; FAN]; EXACT / FAN]),
            mid_min: [[EMPTY; FAN]; TOP],
            top_min: [EMPTY; TOP],
            node: vec![NIL; EXACT],
        }
    }

    fn clear(&mut self) {
        self.leaf.fill([EMPTY; FAN]);
        self.leaf_min.fill([EMPTY; FAN]);
        self.mid_min = [[EMPTY; FAN]; TOP];
        self.top_min = [EMPTY; TOP];
    }

    /// The packed head of bucket `s`.
    #[inline(always)]
    fn head(&self, s: usize) -> u64 {
        self.leaf[groups(s).0][s % FAN]
    }

    /// The smallest packed head among buckets `s ≥ n` (`n < EXACT`), `EMPTY` if they are all empty.
    #[inline(always)]
    fn at_least(&self, n: usize) -> u64 {
        let (g, t) = groups(n);
        let mut m = self.leaf_min[g][n % FAN];
        if (g + 1) % FAN != 0 {
            m = m.min(self.mid_min[t][(g + 1) % FAN]);
        }
        if t + 1 < TOP {
            m = m.min(self.top_min[t + 1]);
        }
        m
    }

    /// Bucket `s`'s head becomes `head` (packed), lower than before: the minima only go down.
    #[inline(always)]
    fn lower(&mut self, s: usize, head: u64, node: u32) {
        let (g, t) = groups(s);
        self.leaf[g][s % FAN] = head;
        self.node[s] = node;
        if suffix_lower(&mut self.leaf_min[g], s % FAN, head) && suffix_lower(&mut self.mid_min[t], g % FAN, head) {
            suffix_lower(&mut self.top_min, t, head);
        }
    }

    /// Bucket `s`'s head `old` (packed) left; the new head is `head` (`EMPTY` if none), higher. The entries
    /// that were `old` are computed again.
    #[inline(always)]
    fn raise(&mut self, s: usize, old: u64, head: u64, node: u32) {
        let (g, t) = groups(s);
        self.leaf[g][s % FAN] = head;
        self.node[s] = node;
        let leaf = &self.leaf[g];
        if !suffix_raise(&mut self.leaf_min[g], s % FAN, old, |j| leaf[j % FAN]) {
            return;
        }
        let leaf_min = &self.leaf_min;
        if !suffix_raise(&mut self.mid_min[t], g % FAN, old, |j| leaf_min[(t * FAN + j) % (EXACT / FAN)][0]) {
            return;
        }
        let mid_min = &self.mid_min;
        suffix_raise(&mut self.top_min, t, old, |j| mid_min[j % TOP][0]);
    }
}

/// First-fit's index: exact-size buckets below `EXACT` granules with their heads in a min tree, the larger
/// blocks in an [`AddressIndex`]. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct FirstFitIndex {
    granule_log2: u32,
    small: SizeBuckets,
    heads: Heads,
    large: AddressIndex,
}

impl FirstFitIndex {
    /// The index of a range of `capacity` bytes with offsets and sizes in multiples of `granule`.
    pub(crate) fn new(capacity: u64, granule: u64) -> Self {
        FirstFitIndex {
            granule_log2: granule.trailing_zeros(),
            small: SizeBuckets::new(capacity, granule),
            heads: Heads::new(),
            large: AddressIndex::new(u64::MAX),
        }
    }

    /// The packed head of a block at `offset` in bucket `s`.
    #[inline(always)]
    fn pack(&self, offset: u64, s: usize) -> u64 {
        (offset >> self.granule_log2) << 12 | s as u64
    }

    /// Removes free node `n`, filed as a block of `size` bytes at `offset` (its node may hold new values).
    #[inline(always)]
    fn unfile(&mut self, nodes: &mut [Node], n: u32, offset: u64, size: u64) {
        let g = size >> self.granule_log2;
        if g >= EXACT as u64 {
            self.large.remove_filed(nodes, n, offset, size);
            return;
        }
        let s = g as usize;
        let next = self.small.next_in_list(nodes, n);
        self.small.remove(nodes, n);
        if self.heads.node[s] == n {
            let old = self.heads.head(s);
            if self.small.is_filled(s) {
                // A head is its bucket's lowest block: the next of its list, if any, is the next head.
                let h = if next != NIL { next } else { self.small.bucket_min(s) };
                let head = self.pack(nodes[h as usize].offset, s);
                self.heads.raise(s, old, head, h);
            } else {
                self.heads.raise(s, old, EMPTY, NIL);
            }
        }
    }

    /// The lowest block of `small` of at least `g` granules (`g < EXACT`) and its offset.
    #[inline(always)]
    fn small_at_least(&self, g: usize) -> Option<(u64, u32)> {
        let head = self.heads.at_least(g);
        (head != EMPTY)
            .then(|| ((head >> 12) << self.granule_log2, self.heads.node[(head & (EXACT as u64 - 1)) as usize]))
    }

    /// [`FreeIndex::find`] for `size` below `EXACT` granules at an alignment above the granule: the lowest
    /// of the lowest fitting large block, the lowest head of the buckets whose blocks all fit (those of at
    /// least `size + align - granule` bytes), and in each smaller bucket the first fitting block below the
    /// best so far.
    #[inline(never)]
    fn find_aligned(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<u32> {
        let fits = |n: u32| {
            let node = &nodes[n as usize];
            fit_front(node.offset, node.size, size, align).is_some()
        };
        let mut best = self.large.find(nodes, size, align, granule).map(|(n, _)| (nodes[n as usize].offset, n));
        // Buckets from `sure` granules on hold only blocks that fit.
        let sure = size.checked_add(align - granule).map_or(EXACT, |s| ((s >> self.granule_log2) as usize).min(EXACT));
        if sure < EXACT {
            if let Some((o, n)) = self.small_at_least(sure) {
                if best.is_none_or(|(b, _)| o < b) {
                    best = Some((o, n));
                }
            }
        }
        let mut g = (size >> self.granule_log2) as usize;
        while g < sure {
            let Some(s) = self.small.bucket_at_least(g).filter(|&s| s < sure) else { break };
            let bound = best.map_or(u64::MAX, |(b, _)| b);
            if (self.heads.head(s) >> 12) << self.granule_log2 < bound {
                let first = self.small.first_where(nodes, s, &mut |n| nodes[n as usize].offset >= bound || fits(n));
                if let Some(n) = first.filter(|&n| nodes[n as usize].offset < bound) {
                    best = Some((nodes[n as usize].offset, n));
                }
            }
            g = s + 1;
        }
        best.map(|(_, n)| n)
    }

    /// Panics unless every free node is filed once as the invariants of the [module docs](self) say;
    /// returns (free blocks filed, largest size). Tests only.
    #[cfg(test)]
    pub(crate) fn check(&self, nodes: &[Node]) -> (usize, u64) {
        let g = self.granule_log2;
        let (large, largest) = self.large.check(nodes);
        for ch in self.large.dir.iter().map(|&c| &self.large.chunks[c as usize]) {
            assert!(ch.sizes[..ch.len].iter().all(|&s| s >> g >= EXACT as u64), "small block in large");
        }
        let small = self.small.check(nodes);
        for s in 0..EXACT {
            if s > 0 && self.small.is_filled(s) {
                let h = self.small.bucket_min(s);
                assert_eq!(self.heads.head(s), self.pack(nodes[h as usize].offset, s), "head of bucket {s}");
                assert_eq!(self.heads.node[s], h, "head node of bucket {s}");
            } else {
                assert_eq!(self.heads.head(s), EMPTY, "head of empty bucket {s}");
            }
        }
        let leaf = self.heads.leaf.as_flattened();
        let min_of = |from: usize, to: usize| leaf[from..to].iter().copied().min().unwrap_or(EMPTY);
        for (s, &m) in self.heads.leaf_min.as_flattened().iter().enumerate() {
            assert_eq!(m, min_of(s, (s | (FAN - 1)) + 1), "leaf suffix minimum {s}");
        }
        for (g, &m) in self.heads.mid_min.as_flattened().iter().enumerate() {
            assert_eq!(m, min_of(g * FAN, ((g | (FAN - 1)) + 1) * FAN), "mid suffix minimum {g}");
        }
        for t in 0..TOP {
            assert_eq!(self.heads.top_min[t], min_of(t * FAN * FAN, EXACT), "top suffix minimum {t}");
        }
        let free = nodes.iter().filter(|n| n.is_free()).count();
        assert_eq!(small + large, free, "free nodes filed");
        let largest = largest.max(self.small.highest().map_or(0, |s| (s as u64) << g));
        assert_eq!(self.largest(nodes), largest);
        (free, largest)
    }
}

impl FreeIndex for FirstFitIndex {
    #[inline(always)]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        let g = size >> self.granule_log2;
        if g >= EXACT as u64 {
            self.large.insert(nodes, n);
            return;
        }
        let s = g as usize;
        self.small.insert(nodes, n, s, offset >> self.granule_log2);
        let head = self.pack(offset, s);
        if head < self.heads.head(s) {
            self.heads.lower(s, head, n);
        }
    }

    #[inline(always)]
    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let Node { size, offset, .. } = nodes[n as usize];
        self.unfile(nodes, n, offset, size);
    }

    #[inline(always)]
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64) {
        let big = (EXACT as u64) << self.granule_log2;
        if old_size >= big && nodes[n as usize].size >= big {
            self.large.update(nodes, n, old_offset, old_size);
        } else {
            self.unfile(nodes, n, old_offset, old_size);
            self.insert(nodes, n);
        }
    }

    #[inline(always)]
    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        let g = size >> self.granule_log2;
        if g >= EXACT as u64 {
            return self.large.find(nodes, size, align, granule);
        }
        if align > granule {
            return self.find_aligned(nodes, size, align, granule).map(|n| (n, Placement::Front));
        }
        // Every block of at least `size` bytes fits: the lower of the lowest such bucket head and the
        // lowest large block.
        let small = self.small_at_least(g as usize);
        let n = match (small, self.large.lowest()) {
            (Some((o, n)), Some((lo, ln))) => {
                if o < lo {
                    n
                } else {
                    ln
                }
            }
            (Some((_, n)), None) | (None, Some((_, n))) => n,
            (None, None) => return None,
        };
        Some((n, Placement::Front))
    }

    fn largest(&self, nodes: &[Node]) -> u64 {
        let small = self.small.highest().map_or(0, |s| (s as u64) << self.granule_log2);
        small.max(self.large.largest(nodes))
    }

    fn clear(&mut self) {
        self.small.clear();
        self.heads.clear();
        self.large.clear();
    }
}

/// Most entries of a chunk.
const CHUNK: usize = 32;
/// Chunks per summary group.
const GROUP: usize = 64;

/// Free blocks of one address range, sorted by offset (entries `..len` are used).
#[derive(Clone, Debug)]
struct Chunk {
    len: usize,
    offsets: [u64; CHUNK],
    sizes: [u64; CHUNK],
    nodes: [u32; CHUNK],
}

impl Chunk {
    fn empty() -> Self {
        Chunk { len: 0, offsets: [0; CHUNK], sizes: [0; CHUNK], nodes: [NIL; CHUNK] }
    }

    /// Index of the entry whose offset is `offset` (present).
    #[inline]
    fn find(&self, offset: u64) -> usize {
        let i = self.offsets[..self.len].partition_point(|&o| o < offset);
        debug_assert!(i < self.len && self.offsets[i] == offset, "address index entry not found");
        i.min(self.len - 1)
    }

    #[inline]
    fn max(&self) -> u64 {
        self.sizes[..self.len].iter().copied().max().unwrap_or(0)
    }

    #[inline]
    fn insert_at(&mut self, i: usize, offset: u64, size: u64, node: u32) {
        let len = self.len;
        self.offsets.copy_within(i..len, i + 1);
        self.sizes.copy_within(i..len, i + 1);
        self.nodes.copy_within(i..len, i + 1);
        (self.offsets[i], self.sizes[i], self.nodes[i]) = (offset, size, node);
        self.len += 1;
    }

    #[inline]
    fn remove_at(&mut self, i: usize) {
        let len = self.len;
        self.offsets.copy_within(i + 1..len, i);
        self.sizes.copy_within(i + 1..len, i);
        self.nodes.copy_within(i + 1..len, i);
        self.len -= 1;
    }
}

/// Chunked address-ordered index over free block-list nodes, augmented with the largest size per chunk and per
/// group of chunks. Requests of at least `high_threshold` bytes are placed at the highest fitting address
/// (carved from the back of the block); others at the lowest.
#[derive(Debug)]
pub(crate) struct AddressIndex {
    /// Chunks by id; ids of unused chunks are in `spare`.
    chunks: Vec<Chunk>,
    spare: Vec<u32>,
    /// Chunk ids in address order (directory positions).
    dir: Vec<u32>,
    /// First offset of the chunk at each position.
    first: Vec<u64>,
    /// Largest size of the chunk at each position.
    max: Vec<u64>,
    /// Largest size of each group of `GROUP` positions.
    group_max: Vec<u64>,
    /// Position of each chunk id.
    pos: Vec<u32>,
    high_threshold: u64,
}

impl AddressIndex {
    pub(crate) fn new(high_threshold: u64) -> Self {
        AddressIndex {
            chunks: Vec::new(),
            spare: Vec::new(),
            dir: Vec::new(),
            first: Vec::new(),
            max: Vec::new(),
            group_max: Vec::new(),
            pos: Vec::new(),
            high_threshold,
        }
    }

    /// An empty chunk's id (recycled or new).
    fn new_chunk(&mut self) -> u32 {
        if let Some(c) = self.spare.pop() {
            self.chunks[c as usize].len = 0;
            c
        } else {
            self.chunks.push(Chunk::empty());
            self.pos.push(0);
            (self.chunks.len() - 1) as u32
        }
    }

    /// The directory changed from position `p` on (a chunk was inserted or removed there): refreshes the
    /// positions and the group maxima from there. O(n / CHUNK).
    fn reindex_from(&mut self, p: usize) {
        let len = self.dir.len();
        for q in p..len {
            self.pos[self.dir[q] as usize] = q as u32;
        }
        let groups = len.div_ceil(GROUP);
        self.group_max.resize(groups, 0);
        for g in p / GROUP..groups {
            self.group_max[g] = self.max[g * GROUP..((g + 1) * GROUP).min(len)].iter().copied().max().unwrap_or(0);
        }
    }

    /// Sets the largest size of position `p` to `m`; a group's maximum only grows here (it is an upper
    /// bound, tightened by the searches that find nothing in the group and by `largest`).
    #[inline]
    fn set_max(&mut self, p: usize, m: u64) {
        self.max[p] = m;
        let g = p / GROUP;
        if m > self.group_max[g] {
            self.group_max[g] = m;
        }
    }

    /// The exact largest size of group `g` (the maximum of its chunks' maxima).
    #[inline]
    fn group_exact(&self, g: usize) -> u64 {
        let end = ((g + 1) * GROUP).min(self.max.len());
        self.max[g * GROUP..end].iter().copied().max().unwrap_or(0)
    }

    /// Splits the full chunk at position `p` into two halves (the upper one a new chunk at `p + 1`).
    fn split(&mut self, nodes: &mut [Node], p: usize) {
        const HALF: usize = CHUNK / 2;
        let c = self.dir[p];
        let c2 = self.new_chunk();
        let mut upper = Chunk::empty();
        let lower = &mut self.chunks[c as usize];
        upper.offsets[..HALF].copy_from_slice(&lower.offsets[HALF..]);
        upper.sizes[..HALF].copy_from_slice(&lower.sizes[HALF..]);
        upper.nodes[..HALF].copy_from_slice(&lower.nodes[HALF..]);
        upper.len = HALF;
        lower.len = HALF;
        let lower_max = lower.max();
        for &n in &upper.nodes[..HALF] {
            nodes[n as usize].a = c2;
        }
        let (upper_first, upper_max) = (upper.offsets[0], upper.max());
        self.chunks[c2 as usize] = upper;
        self.dir.insert(p + 1, c2);
        self.first.insert(p + 1, upper_first);
        self.max.insert(p + 1, upper_max);
        self.max[p] = lower_max;
        self.reindex_from(p);
    }

    /// Appends the chunk at position `p + 1` to the one at `p` (their entries fit) and drops it.
    fn merge(&mut self, nodes: &mut [Node], p: usize) {
        let (c, c2) = (self.dir[p], self.dir[p + 1]);
        let upper = self.chunks[c2 as usize].clone();
        let lower = &mut self.chunks[c as usize];
        let (at, k) = (lower.len, upper.len);
        debug_assert!(at + k <= CHUNK);
        lower.offsets[at..at + k].copy_from_slice(&upper.offsets[..k]);
        lower.sizes[at..at + k].copy_from_slice(&upper.sizes[..k]);
        lower.nodes[at..at + k].copy_from_slice(&upper.nodes[..k]);
        lower.len += k;
        for &n in &upper.nodes[..k] {
            nodes[n as usize].a = c;
        }
        self.max[p] = self.max[p].max(self.max[p + 1]);
        self.drop_position(p + 1);
        self.reindex_from(p);
    }

    /// Removes position `p` from the directory and recycles its chunk (the caller reindexes).
    fn drop_position(&mut self, p: usize) {
        self.spare.push(self.dir[p]);
        self.dir.remove(p);
        self.first.remove(p);
        self.max.remove(p);
    }

    /// The chunk at position `p`.
    #[inline]
    fn chunk(&self, p: usize) -> &Chunk {
        &self.chunks[self.dir[p] as usize]
    }

    /// First entry with `size >= need` at or after entry `i` of position `p`, in address order.
    fn next_fit(&mut self, need: u64, p: usize, i: usize) -> Option<(usize, usize)> {
        let len = self.dir.len();
        if p >= len {
            return None;
        }
        if self.max[p] >= need {
            let ch = self.chunk(p);
            if let Some(j) = ch.sizes[i.min(ch.len)..ch.len].iter().position(|&s| s >= need) {
                return Some((p, i + j));
            }
        }
        let mut q = p + 1;
        while q < len {
            let end = ((q / GROUP + 1) * GROUP).min(len);
            if let Some(k) = self.max[q..end].iter().position(|&m| m >= need) {
                let ch = self.chunk(q + k);
                let j = ch.sizes[..ch.len].iter().position(|&s| s >= need);
                debug_assert!(j.is_some(), "chunk maximum out of date");
                return j.map(|j| (q + k, j));
            }
            if q.is_multiple_of(GROUP) {
                // A whole group without a fit: its bound was stale.
                self.group_max[q / GROUP] = self.group_exact(q / GROUP);
            }
            if end == len {
                return None;
            }
            let g = end / GROUP;
            q = (g + self.group_max[g..].iter().position(|&m| m >= need)?) * GROUP;
        }
        None
    }

    /// Last entry with `size >= need` before entry `i` of position `p`, in address order.
    fn prev_fit(&mut self, need: u64, p: usize, i: usize) -> Option<(usize, usize)> {
        if p >= self.dir.len() {
            return None;
        }
        if self.max[p] >= need {
            let ch = self.chunk(p);
            if let Some(j) = ch.sizes[..i.min(ch.len)].iter().rposition(|&s| s >= need) {
                return Some((p, j));
            }
        }
        let mut q = p; // positions below `q` remain
        while q > 0 {
            let start = (q - 1) / GROUP * GROUP;
            if let Some(k) = self.max[start..q].iter().rposition(|&m| m >= need) {
                let ch = self.chunk(start + k);
                let j = ch.sizes[..ch.len].iter().rposition(|&s| s >= need);
                debug_assert!(j.is_some(), "chunk maximum out of date");
                return j.map(|j| (start + k, j));
            }
            if q == self.dir.len().min(start + GROUP) {
                // A whole group without a fit: its bound was stale.
                self.group_max[start / GROUP] = self.group_exact(start / GROUP);
            }
            q = (self.group_max[..start / GROUP].iter().rposition(|&m| m >= need)? + 1) * GROUP;
        }
        None
    }

    /// Lowest-offset entry with `size >= need`.
    #[inline]
    fn lowest_fit(&mut self, need: u64) -> Option<(usize, usize)> {
        self.next_fit(need, 0, 0)
    }

    /// Highest-offset entry with `size >= need`.
    #[inline]
    fn highest_fit(&mut self, need: u64) -> Option<(usize, usize)> {
        let last = self.dir.len().checked_sub(1)?;
        self.prev_fit(need, last, CHUNK)
    }

    /// Offset, size and node of entry `i` of position `p`.
    #[inline]
    fn entry(&self, (p, i): (usize, usize)) -> (u64, u64, u32) {
        let ch = self.chunk(p);
        (ch.offsets[i], ch.sizes[i], ch.nodes[i])
    }

    /// Removes free node `n`, filed at `offset` with `size` bytes (its node may hold new values already).
    #[inline]
    pub(crate) fn remove_filed(&mut self, nodes: &mut [Node], n: u32, offset: u64, size: u64) {
        let c = nodes[n as usize].a;
        let p = self.pos[c as usize] as usize;
        let ch = &mut self.chunks[c as usize];
        let i = ch.find(offset);
        debug_assert_eq!(ch.nodes[i], n);
        ch.remove_at(i);
        let (left, first) = (ch.len, ch.offsets[0]);
        if left == 0 {
            self.drop_position(p);
            self.reindex_from(p);
            return;
        }
        if i == 0 {
            self.first[p] = first;
        }
        if size == self.max[p] {
            let m = self.chunks[c as usize].max();
            self.set_max(p, m);
        }
        if left <= CHUNK / 4 {
            let fits = |q: usize| self.chunk(q).len + left <= CHUNK * 3 / 4;
            if p + 1 < self.dir.len() && fits(p + 1) {
                self.merge(nodes, p);
            } else if p > 0 && fits(p - 1) {
                self.merge(nodes, p - 1);
            }
        }
    }

    /// Offset and node of the lowest free block.
    #[inline]
    pub(crate) fn lowest(&self) -> Option<(u64, u32)> {
        let ch = &self.chunks[*self.dir.first()? as usize];
        Some((ch.offsets[0], ch.nodes[0]))
    }

    /// Checks every invariant of the module doc; returns (entries, largest size). Tests only.
    #[cfg(test)]
    fn check(&self, nodes: &[Node]) -> (usize, u64) {
        let len = self.dir.len();
        assert_eq!((self.first.len(), self.max.len(), self.group_max.len()), (len, len, len.div_ceil(GROUP)));
        let (mut count, mut prev_end) = (0usize, None::<u64>);
        for (p, &c) in self.dir.iter().enumerate() {
            assert!(!self.spare.contains(&c), "chunk {c} both used and spare");
            assert_eq!(self.pos[c as usize] as usize, p, "position of chunk {c}");
            let ch = &self.chunks[c as usize];
            assert!(ch.len > 0 && ch.len <= CHUNK, "chunk {c} length {}", ch.len);
            assert_eq!(self.first[p], ch.offsets[0], "first offset at position {p}");
            assert_eq!(self.max[p], ch.max(), "maximum at position {p}");
            for i in 0..ch.len {
                let node = &nodes[ch.nodes[i] as usize];
                assert_eq!((node.offset, node.size, node.a), (ch.offsets[i], ch.sizes[i], c));
                assert!(prev_end.is_none_or(|e| e <= node.offset), "address order at {}", node.offset);
                prev_end = Some(node.offset + node.size);
            }
            count += ch.len;
        }
        for (g, &m) in self.group_max.iter().enumerate() {
            assert!(m >= self.group_exact(g), "group {g} bound below its maximum");
        }
        let largest = self.max.iter().copied().max().unwrap_or(0);
        assert_eq!(self.largest(nodes), largest);
        (count, largest)
    }
}

impl FreeIndex for AddressIndex {
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let Node { offset, size, .. } = nodes[n as usize];
        if self.dir.is_empty() {
            let c = self.new_chunk();
            self.dir.push(c);
            self.first.push(offset);
            self.max.push(0);
            self.reindex_from(0);
        }
        let mut p = self.first.partition_point(|&f| f <= offset).saturating_sub(1);
        let ch = self.chunk(p);
        let mut i = ch.offsets[..ch.len].partition_point(|&o| o < offset);
        if ch.len == CHUNK {
            self.split(nodes, p);
            if i > CHUNK / 2 {
                p += 1;
                i -= CHUNK / 2;
            }
        }
        let c = self.dir[p];
        self.chunks[c as usize].insert_at(i, offset, size, n);
        let node = &mut nodes[n as usize];
        (node.a, node.b) = (c, NIL);
        if i == 0 {
            self.first[p] = offset;
        }
        if size > self.max[p] {
            self.set_max(p, size);
        }
    }

    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let Node { offset, size, .. } = nodes[n as usize];
        self.remove_filed(nodes, n, offset, size);
    }

    /// The key changed without changing the order: the entry is rewritten in place, O(log CHUNK).
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64) {
        let Node { offset, size, a: c, .. } = nodes[n as usize];
        let p = self.pos[c as usize] as usize;
        let ch = &mut self.chunks[c as usize];
        let i = ch.find(old_offset);
        debug_assert_eq!(ch.nodes[i], n);
        (ch.offsets[i], ch.sizes[i]) = (offset, size);
        if i == 0 {
            self.first[p] = offset;
        }
        if size >= self.max[p] {
            self.set_max(p, size);
        } else if old_size == self.max[p] {
            let m = self.chunks[c as usize].max();
            self.set_max(p, m);
        }
    }

    fn find(&mut self, _nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        let slack = align - granule.min(align);
        // The first block of this length always fits; no later candidate needs checking.
        let sure = size.checked_add(slack);
        if size >= self.high_threshold {
            let mut candidate = self.highest_fit(size);
            if slack == 0 {
                return candidate.map(|e| (self.entry(e).2, Placement::Back));
            }
            let stop = sure.and_then(|s| self.highest_fit(s)).map(|e| self.entry(e).0);
            while let Some((p, i)) = candidate {
                let (offset, len, n) = self.entry((p, i));
                if fit_back(offset, len, size, align).is_some() {
                    return Some((n, Placement::Back));
                }
                if stop.is_some_and(|s| offset <= s) {
                    break;
                }
                candidate = self.prev_fit(size, p, i);
            }
            return None;
        }
        let mut candidate = self.lowest_fit(size);
        if slack == 0 {
            // Every block of `size` bytes fits: the first one is the answer.
            return candidate.map(|e| (self.entry(e).2, Placement::Front));
        }
        // Where to stop, computed only once the first candidate turned out misaligned.
        let mut stop: Option<Option<u64>> = None;
        while let Some((p, i)) = candidate {
            let (offset, len, n) = self.entry((p, i));
            if fit_front(offset, len, size, align).is_some() {
                return Some((n, Placement::Front));
            }
            let stop = *stop.get_or_insert_with(|| sure.and_then(|s| self.lowest_fit(s)).map(|e| self.entry(e).0));
            if stop.is_some_and(|s| offset >= s) {
                break;
            }
            candidate = self.next_fit(size, p, i + 1);
        }
        None
    }

    /// The group of the highest bound is measured exactly; then only groups whose bound exceeds the best
    /// so far (stale bounds, usually none) are.
    fn largest(&self, _nodes: &[Node]) -> u64 {
        let Some((top, _)) = self.group_max.iter().enumerate().max_by_key(|&(_, &m)| m) else { return 0 };
        let mut best = self.group_exact(top);
        for (g, &bound) in self.group_max.iter().enumerate() {
            if bound > best {
                best = best.max(self.group_exact(g));
            }
        }
        best
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.spare.clear();
        self.dir.clear();
        self.first.clear();
        self.max.clear();
        self.group_max.clear();
        self.pos.clear();
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

    #[test]
    fn index_invariants_hold_under_churn() {
        for threshold in [u64::MAX, 4096] {
            let mut h = BlockList::new(1 << 22, 64, AddressIndex::new(threshold)).unwrap();
            let mut live = Vec::new();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if !x.is_multiple_of(3) || live.is_empty() {
                    if let Ok(a) = h.alloc(1 + (x >> 8) % 20_000, 1 << ((x >> 40) % 9)) {
                        live.push(a);
                    }
                } else {
                    h.free(live.swap_remove((x >> 20) as usize % live.len())).unwrap();
                }
                let (count, max) = h.index.check(h.nodes());
                assert_eq!((count, max), (h.stats().free_blocks, h.stats().largest_free));
            }
        }
    }

    /// Enough free blocks for many chunks and several groups: splits, merges and group maxima are
    /// exercised, and every choice is compared with a brute-force scan of the free blocks.
    #[test]
    fn many_chunks_choose_like_a_scan() {
        for threshold in [u64::MAX, 64 * 40] {
            let mut h = BlockList::new(1 << 24, 64, AddressIndex::new(threshold)).unwrap();
            let mut live: Vec<_> = (0..12_000).map(|i| h.alloc(64 * (1 + i % 7), 1).unwrap()).collect();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut step = 0;
            while step < 8_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(2) && !live.is_empty() {
                    h.free(live.swap_remove((x >> 20) as usize % live.len())).unwrap();
                } else {
                    let size = 64 * (1 + (x >> 8) % 60);
                    let align = 1u64 << (6 + (x >> 40) % 3);
                    let fits: Vec<(u64, u64)> =
                        h.free_blocks().filter(|&(o, l)| fit_front(o, l, size, align).is_some()).collect();
                    let want = if size >= threshold { fits.last() } else { fits.first() };
                    match h.alloc(size, align) {
                        Ok(b) => {
                            let &(o, l) = want.expect("allocated although nothing fits");
                            assert!(b.offset >= o && b.offset < o + l, "step {step}: want ({o}, {l}), got {b:?}");
                            live.push(b);
                        }
                        Err(_) => assert!(want.is_none()),
                    }
                }
                if step % 997 == 0 {
                    h.check_invariants();
                    let (count, max) = h.index.check(h.nodes());
                    assert_eq!((count, max), (h.stats().free_blocks, h.stats().largest_free));
                }
                step += 1;
            }
            assert!(h.index.dir.len() > 2 * GROUP, "only {} chunks", h.index.dir.len());
            for b in live {
                h.free(b).unwrap();
            }
            h.index.check(h.nodes());
            assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, h.capacity())]);
        }
    }

    /// The shadow model of first-fit: random allocations (half with an alignment above the granule) and
    /// frees of sizes on both sides of `EXACT` granules, every placement compared with a brute-force scan of
    /// the free blocks (the lowest that fits at the alignment) and every invariant of the index checked
    /// after every step; then everything is freed. Over 64 MiB at 64 B granules, and over 2^48 bytes at 1 B
    /// granules (heads packed from offsets up to 2^48).
    #[test]
    fn first_fit_index_matches_a_scan_under_churn() {
        type Config = (u64, u64, u64, fn(u64) -> u64);
        let configs: [Config; 2] = [
            (1 << 26, 64, 5000, |r| match r % 20 {
                0..14 => 1 + (r >> 8) % 2560,
                14..19 => 64 * (EXACT as u64 - 200 + (r >> 8) % 400),
                _ => 64 * (EXACT as u64 + (r >> 8) % 20_000),
            }),
            (1 << 48, 1, 2000, |r| match r % 10 {
                0..6 => 1 + (r >> 8) % 5000,
                _ => 1 << (12 + (r >> 8) % 30),
            }),
        ];
        for (capacity, granule, steps, size_of) in configs {
            let mut h = BlockList::new(capacity, granule, FirstFitIndex::new(capacity, granule)).unwrap();
            let mut rng = crate::bench::SplitMix64::new(capacity ^ granule);
            let mut live = Vec::new();
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
            }
            assert!(!h.index.large.dir.is_empty() || granule == 1, "no large free block at the end");
            for b in live {
                h.free(b).unwrap();
            }
            h.index.check(h.nodes());
            assert_eq!(h.free_blocks().collect::<Vec<_>>(), vec![(0, h.capacity())]);
        }
    }

    #[test]
    fn high_threshold_places_at_the_top() {
        let mut h = BlockList::new(1024, 16, AddressIndex::new(256)).unwrap();
        assert_eq!(h.alloc(16, 1).unwrap().offset, 0);
        assert_eq!(h.alloc(256, 1).unwrap().offset, 768);
        assert_eq!(h.alloc(300, 128).unwrap().offset, 384);
        h.check_invariants();
    }
}
