//! The chunked address index (`AddressIndex`): free blocks in address order, the lowest or highest fit
//! of a size. It keeps the [tiered](super::tiered) strategy's shared range.
//!
//! # Structure
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
//! ## Invariants
//! - Concatenating the chunks in directory order lists the free blocks by ascending offset; no chunk is
//!   empty; a free node's `a` is its chunk's id and `pos[chunk]` its directory position.
//! - `first[p]` and `max[p]` are the first offset and the largest size of the chunk at position `p`;
//!   `group_max[g]` is at least the largest of `max` over group `g` (an upper bound: it grows with its
//!   chunks, and a shrink is left stale until a search finds nothing in the group or `largest` measures it).
//! - No two physically adjacent blocks are free.
//!
//! ## Time complexity
//! With n free blocks: `alloc` reads O(n / (CHUNK · GROUP) + GROUP + CHUNK) consecutive words (about
//! fifteen cache lines at n = 36k), `free` O(log n) plus O(CHUNK) moves; a chunk split or merge costs
//! O(n / CHUNK). `largest_free` is O(n / (CHUNK · GROUP) + GROUP) when the bounds are fresh. With an
//! alignment above the granule a candidate may not fit; the search then resumes after it, and stops at
//! the first block of length `size + align - granule` (which always fits).

use super::block_list::{FreeIndex, Node, Placement, NIL};
use super::{fit_back, fit_front};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::block_list::BlockList;

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

    #[test]
    fn high_threshold_places_at_the_top() {
        let mut h = BlockList::new(1024, 16, AddressIndex::new(256)).unwrap();
        assert_eq!(h.alloc(16, 1).unwrap().offset, 0);
        assert_eq!(h.alloc(256, 1).unwrap().offset, 768);
        assert_eq!(h.alloc(300, 128).unwrap().offset, 384);
        h.check_invariants();
    }
}
