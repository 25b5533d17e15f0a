//! The block list shared by first-fit, best-fit, TLSF and the tiered backing.
//!
//! The range `[0, capacity)` is tiled by *blocks* kept out of band (offset-allocator style: the managed
//! memory is never touched). Every block, live or free, is a [`Node`] of `nodes`, linked to its physical
//! neighbours (`prev`/`next`, by address). A live block's [`Handle`] is its node index and its *stamp*,
//! so `free(allocation)` reads the node, checks it, and merges with its neighbours through the links:
//! O(1), with no hashing and no table keyed by offset. Free nodes are also in the free index, a
//! [`FreeIndex`] (what differs between strategies), through the links `a`/`b`; a live node keeps its
//! stamp in `a` and its alignment and rounding slack in `b`.
//!
//! A stamp is the value of a counter that every allocation advances, over `LIVE_MIN..NIL` (about 2^29.6
//! values, above every node index and every link value a free index keeps in `a`), so `a` alone tells a
//! live node from a free one, and a handle whose stamp differs from its node's names an earlier block of
//! that node: stale. Keeping it in the node costs no load (the node is read anyway) and no memory, and
//! lets a caller keep only the 8-byte handle ([`BlockList::free_handle`]): in the strategies benchmark,
//! keeping 8 bytes per live block instead of the 24-byte `Option<Allocation>` made best-fit's alloc+free
//! pair 1.3 to 1.8 times faster (`bench/results/2026-12-02-467cbcf-best-fit-handle.md`).
//!
//! A pair of alloc and free touches two or three nodes: the freed node, the free node the request is
//! carved from (the live block takes the node the free just recycled, which is still in cache), and only
//! those physical neighbours of the freed block that are free. Whether a neighbour is live is asked of the
//! `live` bitmap (one bit per node: 14 KiB at 113k nodes), not of its 32-byte node, so the usual free,
//! between two live blocks, reads no neighbour; and a node is 32-byte aligned, so it never straddles two
//! cache lines. offset-allocator reads both neighbours' nodes on every free. Per pair of the strategies
//! benchmark (callgrind, `host/benches/strategies_icount.rs`, 1 MiB LL), the two took TLSF's LL misses from
//! 4.29 to 2.88 and best-fit's from 4.33 to 2.75 (offset-allocator: 4.79), for 23 to 25 more instructions,
//! with the same placements; see `bench/results/2026-12-03-6d18e90-live-bitmap.md`. The design before
//! this one (free by offset through a 4 MiB table of live and free boundaries) paid two more cache misses
//! per pair for the table (TLSF 1075 instructions, 12.2 D1 and 6.6 LL misses per pair).
//!
//! `free_at(offset)` (callers that only have an address) uses an [`OffsetIndex`] built on its first call
//! and kept up to date from then on.
//!
//! Invariants (checked by `check_invariants` in tests):
//! - Live and free nodes (size > 0) tile `[0, capacity)` in `prev`/`next` order without gaps or overlaps;
//!   no two free blocks are adjacent (immediate coalescing). Spare nodes have size 0 and `a != LIVE`.
//! - Every offset and size is a multiple of `granule`. A node is in the free index iff it is free.
//! - Bit `n % 64` of `live[n / 64]` is set iff node `n` is live; `live` has `ceil(nodes / 64)` words.
//! - A live node's slack is `reserved - requested` when below [`BIG_SLACK`], else the requested size is in
//!   `big_slack` under the node index.
//! - Counters (`free_bytes`, `free_count`, `allocated`, `live_count`) match the blocks; the reserved bytes in
//!   use are `capacity - free_bytes` (live and free blocks tile the range).
//!
//! Complexity: alloc is the index's search plus O(1); free by handle is O(1) plus the index's updates.
//! `free_blocks`, `live_blocks` and the compaction layout sort, O(n log n); the error path of `free`
//! (double, stale or invalid free) scans the nodes, O(n).

use super::compact::{relocate_live, CompactBlock, CompactionLayout, CompactionPlan, Region};
use super::live_slots::OffsetIndex;
use super::{
    check_layout, check_request, fit_back, fit_front, offset_map, oom, AllocError, AllocatedBlock, Allocation, Handle,
    OffsetMap, Stats, MAX_BYTES,
};

/// No node.
pub(crate) const NIL: u32 = u32::MAX;

/// The lowest stamp of a live node. Values of `a` below it are node indices (fewer than 2^31) or the free
/// indices' links (best-fit's slot refs stay below `0xC000_1000`); `NIL` is not a stamp either.
pub(crate) const LIVE_MIN: u32 = 0xD000_0000;

/// A block: 32 bytes, 32-byte aligned (one cache line holds two whole nodes). While free, `a` and `b`
/// belong to the free index (free-list links for TLSF and first-fit, the chunk id for the address index); while
/// live, `a` is the block's stamp (`LIVE_MIN..NIL`, see the [module docs](self)) and `b` packs log2 of the
/// requested alignment (bits 0–5) and the slack (from bit 6).
#[derive(Clone, Copy, Debug)]
#[repr(align(32))]
pub(crate) struct Node {
    pub offset: u64,
    pub size: u64,
    pub a: u32,
    pub b: u32,
    /// Physical neighbour below (`NIL` at offset 0).
    pub prev: u32,
    /// Physical neighbour above (`NIL` at the end of the range).
    pub next: u32,
}

impl Node {
    /// Is the node a live block (its `a` a stamp)?
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.a >= LIVE_MIN && self.a != NIL
    }
    /// Is the node a free block (not live, not spare)?
    #[inline]
    pub(crate) fn is_free(&self) -> bool {
        !self.is_live() && self.size > 0
    }
    #[inline]
    fn align_log2(&self) -> u8 {
        (self.b & 63) as u8
    }
    #[inline]
    fn slack(&self) -> u64 {
        (self.b >> 6) as u64
    }
}

/// Slack value meaning "the requested size is in `big_slack`".
const BIG_SLACK: u64 = (1 << 26) - 1;

/// Where to carve the request from the chosen free block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Lowest aligned start.
    Front,
    /// Highest aligned start.
    Back,
}

/// The search structure over free blocks.
pub(crate) trait FreeIndex: Send {
    /// Adds free node `n` (its offset and size are final while it stays in the index).
    fn insert(&mut self, nodes: &mut [Node], n: u32);
    /// Removes free node `n`.
    fn remove(&mut self, nodes: &mut [Node], n: u32);
    /// Free node `n`, in the index, changed from `(old_offset, old_size)` to its current offset and size
    /// without changing its address order among the free blocks (a split or merge in place).
    fn update(&mut self, nodes: &mut [Node], n: u32, old_offset: u64, old_size: u64);
    /// A free node that holds `size` bytes (a granule multiple) at an `align`-aligned start, and where.
    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)>;
    /// Size of the largest free block in bytes.
    fn largest(&self, nodes: &[Node]) -> u64;
    /// Forgets every block.
    fn clear(&mut self);
}

/// Generic block-list allocator over a [`FreeIndex`].
#[derive(Debug)]
pub(crate) struct BlockList<I: FreeIndex> {
    capacity: u64,
    granule: u64,
    /// Live blocks, free blocks (size > 0) and spare slots (size 0).
    nodes: Vec<Node>,
    /// Bit `i % 64` of word `i / 64` is set iff node `i` is live: what `free` asks of the freed block's
    /// physical neighbours, answered from 1 bit per node instead of two cold 32-byte nodes; see the
    /// [module docs](self).
    live: Vec<u64>,
    spare: Vec<u32>,
    /// The stamp of the next allocation (`LIVE_MIN..NIL`; not reset by `reset`, so that no handle from
    /// before a reset names a block after it until the counter wraps).
    stamp: u32,
    /// Offset → node of the live blocks, for `free_at`; built on its first call.
    by_offset: OffsetIndex,
    live_count: usize,
    /// Requested bytes of the live nodes (by index) whose slack is [`BIG_SLACK`] or more.
    big_slack: OffsetMap<u64>,
    pub(crate) index: I,
    allocated: u64,
    free_bytes: u64,
    free_count: usize,
}

impl<I: FreeIndex> BlockList<I> {
    /// `capacity` is rounded down to `granule` (a power of two).
    pub(crate) fn new(capacity: u64, granule: u64, index: I) -> Result<Self, AllocError> {
        if granule == 0 || !granule.is_power_of_two() || granule > MAX_BYTES {
            return Err(AllocError::InvalidConfig("granule must be a power of two in [1, 2^48]"));
        }
        if capacity > MAX_BYTES {
            return Err(AllocError::InvalidConfig("capacity above 2^48 bytes"));
        }
        let capacity = capacity & !(granule - 1);
        if capacity == 0 {
            return Err(AllocError::InvalidConfig("capacity below one granule"));
        }
        let mut a = BlockList {
            capacity,
            granule,
            nodes: Vec::new(),
            live: Vec::new(),
            spare: Vec::new(),
            stamp: LIVE_MIN,
            by_offset: OffsetIndex::default(),
            live_count: 0,
            big_slack: offset_map(),
            index,
            allocated: 0,
            free_bytes: 0,
            free_count: 0,
        };
        a.reset();
        Ok(a)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn granule(&self) -> u64 {
        self.granule
    }

    pub(crate) fn reset(&mut self) {
        self.nodes.clear();
        self.live.clear();
        self.spare.clear();
        self.by_offset.clear();
        self.live_count = 0;
        self.big_slack.clear();
        self.index.clear();
        self.allocated = 0;
        self.free_bytes = self.capacity;
        self.free_count = 1;
        let n = self.new_node(0, self.capacity, NIL, NIL);
        self.index.insert(&mut self.nodes, n);
    }

    /// A node `[offset, offset + size)` between `prev` and `next` (the caller links them to it), from the
    /// spare list (most recently recycled first) or new.
    #[inline]
    fn new_node(&mut self, offset: u64, size: u64, prev: u32, next: u32) -> u32 {
        let node = Node { offset, size, a: NIL, b: NIL, prev, next };
        if let Some(i) = self.spare.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            debug_assert!(self.nodes.len() < 1 << 31);
            if self.nodes.len().is_multiple_of(64) {
                self.live.push(0);
            }
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// Is node `n` live? Reads the `live` bitmap, not the node.
    #[inline(always)]
    fn is_live_node(&self, n: u32) -> bool {
        self.live[(n >> 6) as usize] & (1 << (n & 63)) != 0
    }

    /// Records in the `live` bitmap that node `n` is live (`true`) or not.
    #[inline(always)]
    fn set_live(&mut self, n: u32, live: bool) {
        let (w, bit) = ((n >> 6) as usize, 1u64 << (n & 63));
        if live {
            self.live[w] |= bit;
        } else {
            self.live[w] &= !bit;
        }
    }

    /// Returns node `n` (out of the index and the physical list) to the spare list.
    #[inline]
    fn recycle(&mut self, n: u32) {
        let node = &mut self.nodes[n as usize];
        node.size = 0;
        node.a = NIL;
        self.spare.push(n);
    }

    /// Carves the live block `[start, start + size)` out of free node `n` and returns the live node. Node
    /// `n` keeps a free remainder when there is one (updated in place: its address order does not change),
    /// so most carves cost one index update.
    #[inline]
    fn carve(&mut self, n: u32, start: u64, size: u64, requested: u64, align_log2: u8) -> u32 {
        let Node { offset, size: len, prev, next, .. } = self.nodes[n as usize];
        let end = offset + len;
        let (front, back) = (start - offset, end - start - size);
        let live = if front > 0 {
            self.nodes[n as usize].size = front;
            let live = self.new_node(start, size, n, next);
            self.nodes[n as usize].next = live;
            let after = if back > 0 {
                let t = self.new_node(start + size, back, live, next);
                self.nodes[live as usize].next = t;
                self.index.insert(&mut self.nodes, t);
                self.free_count += 1;
                t
            } else {
                live
            };
            if next != NIL {
                self.nodes[next as usize].prev = after;
            }
            self.index.update(&mut self.nodes, n, offset, len);
            live
        } else if back > 0 {
            self.nodes[n as usize].offset = start + size;
            self.nodes[n as usize].size = back;
            let live = self.new_node(start, size, prev, n);
            self.nodes[n as usize].prev = live;
            if prev != NIL {
                self.nodes[prev as usize].next = live;
            }
            self.index.update(&mut self.nodes, n, offset, len);
            live
        } else {
            self.index.remove(&mut self.nodes, n);
            self.free_count -= 1;
            n
        };
        let stamp = self.next_stamp();
        self.make_live(live, size, requested, align_log2, stamp);
        self.free_bytes -= size;
        live
    }

    /// A new stamp: the counter's value, which advances (wrapping to `LIVE_MIN` before `NIL`).
    #[inline(always)]
    fn next_stamp(&mut self) -> u32 {
        let stamp = self.stamp;
        self.stamp = if stamp == NIL - 1 { LIVE_MIN } else { stamp + 1 };
        stamp
    }

    /// Marks node `n` (offset and size set, linked) live with the given request under `stamp`.
    #[inline(always)]
    fn make_live(&mut self, n: u32, size: u64, requested: u64, align_log2: u8, stamp: u32) {
        let slack = size - requested;
        if slack >= BIG_SLACK {
            self.big_slack.insert(n as u64, requested);
        }
        let node = &mut self.nodes[n as usize];
        node.a = stamp;
        node.b = (align_log2 as u32 & 63) | (slack.min(BIG_SLACK) as u32) << 6;
        self.by_offset.insert(node.offset, n);
        self.set_live(n, true);
        self.live_count += 1;
        self.allocated += requested;
    }

    #[inline]
    pub(crate) fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        let rounded = check_request(size, align, self.granule)?;
        let eff_align = align.max(self.granule);
        let found = if rounded <= self.free_bytes {
            self.index.find(&self.nodes, rounded, eff_align, self.granule)
        } else {
            None
        };
        let Some((n, placement)) = found else {
            return Err(oom(size, self.free_bytes, self.index.largest(&self.nodes)));
        };
        let Node { offset, size: len, .. } = self.nodes[n as usize];
        let start = match placement {
            Placement::Front => fit_front(offset, len, rounded, eff_align),
            Placement::Back => fit_back(offset, len, rounded, eff_align),
        };
        let Some(start) = start else {
            debug_assert!(false, "free index returned a block that does not fit");
            return Err(oom(size, self.free_bytes, self.index.largest(&self.nodes)));
        };
        let live = self.carve(n, start, rounded, size, align.trailing_zeros() as u8);
        Ok(Allocation { offset: start, size: rounded, handle: Handle::new(live, self.nodes[live as usize].a) })
    }

    /// Frees the block named by `a.handle` (its node, at its stamp, starting at `a.offset`). O(1) plus the
    /// index's updates.
    #[inline]
    pub(crate) fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        let n = a.handle.index();
        match self.nodes.get(n) {
            Some(node) if node.is_live() && node.a == a.handle.generation() && node.offset == a.offset => {
                self.free_node(n as u32);
                Ok(())
            }
            _ => Err(self.classify_bad_free(a.offset, true)),
        }
    }

    /// Frees the block named by `h` alone: its node, if live at the handle's stamp. O(1) plus the index's
    /// updates; the error path is O(1) too.
    #[inline]
    pub(crate) fn free_handle(&mut self, h: Handle) -> Result<(), AllocError> {
        match self.nodes.get(h.index()) {
            Some(node) if node.is_live() && node.a == h.generation() => {
                self.free_node(h.index() as u32);
                Ok(())
            }
            _ => Err(AllocError::UnknownHandle),
        }
    }

    /// Frees the block that starts at `offset`, through the offset index (built on the first call).
    pub(crate) fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        if !self.by_offset.is_built() {
            let live = self.nodes.iter().enumerate().filter(|(_, n)| n.is_live()).map(|(i, n)| (n.offset, i as u32));
            self.by_offset.build(live);
        }
        match self.by_offset.get(offset) {
            Some(n) => {
                self.free_node(n);
                Ok(())
            }
            None => Err(self.classify_bad_free(offset, false)),
        }
    }

    /// Frees live node `l` and merges it with its free neighbours.
    #[inline]
    fn free_node(&mut self, l: u32) {
        let node = self.nodes[l as usize];
        let (offset, size, p, q) = (node.offset, node.size, node.prev, node.next);
        let requested = if node.slack() == BIG_SLACK {
            self.big_slack.remove(&(l as u64)).expect("big slack recorded")
        } else {
            size - node.slack()
        };
        self.by_offset.remove(offset);
        self.live_count -= 1;
        self.allocated -= requested;
        self.free_bytes += size;
        self.set_live(l, false);
        let p_free = p != NIL && !self.is_live_node(p);
        let q_free = q != NIL && !self.is_live_node(q);
        match (p_free, q_free) {
            (false, false) => {
                let node = &mut self.nodes[l as usize];
                (node.a, node.b) = (NIL, NIL);
                self.index.insert(&mut self.nodes, l);
                self.free_count += 1;
            }
            (true, false) => {
                let Node { offset: po, size: ps, .. } = self.nodes[p as usize];
                self.nodes[p as usize].size = ps + size;
                self.nodes[p as usize].next = q;
                if q != NIL {
                    self.nodes[q as usize].prev = p;
                }
                self.recycle(l);
                self.index.update(&mut self.nodes, p, po, ps);
            }
            (false, true) => {
                // `q` absorbs the block and keeps its place in the index.
                let Node { offset: qo, size: qs, .. } = self.nodes[q as usize];
                let qn = &mut self.nodes[q as usize];
                (qn.offset, qn.size, qn.prev) = (offset, qs + size, p);
                if p != NIL {
                    self.nodes[p as usize].next = q;
                }
                self.recycle(l);
                self.index.update(&mut self.nodes, q, qo, qs);
            }
            (true, true) => {
                let Node { offset: po, size: ps, .. } = self.nodes[p as usize];
                let Node { size: qs, next: qn, .. } = self.nodes[q as usize];
                self.index.remove(&mut self.nodes, q);
                self.free_count -= 1;
                self.nodes[p as usize].size = ps + size + qs;
                self.nodes[p as usize].next = qn;
                if qn != NIL {
                    self.nodes[qn as usize].prev = p;
                }
                self.recycle(q);
                self.recycle(l);
                self.index.update(&mut self.nodes, p, po, ps);
            }
        }
    }

    /// Error path only, O(n): double free if `offset` lies in a free block, a stale handle if (for a free by
    /// handle) a live block starts there, else an invalid free.
    fn classify_bad_free(&self, offset: u64, by_handle: bool) -> AllocError {
        if self.free_nodes().any(|n| n.offset <= offset && offset - n.offset < n.size) {
            AllocError::DoubleFree { offset }
        } else if by_handle && self.nodes.iter().any(|n| n.is_live() && n.offset == offset) {
            AllocError::StaleHandle { offset }
        } else {
            AllocError::InvalidFree { offset }
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            capacity: self.capacity,
            allocated: self.allocated,
            reserved_in_use: self.capacity - self.free_bytes,
            reserved: self.capacity - self.free_bytes,
            free: self.free_bytes,
            largest_free: self.index.largest(&self.nodes),
            stranded: 0,
            free_blocks: self.free_count,
            live_blocks: self.live_count,
        }
    }

    /// The free nodes, in no particular order.
    fn free_nodes(&self) -> impl Iterator<Item = &Node> + '_ {
        self.nodes.iter().filter(|n| n.is_free())
    }

    /// Live nodes by index, ascending by offset.
    fn live_sorted(&self) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.nodes.len() as u32).filter(|&i| self.nodes[i as usize].is_live()).collect();
        v.sort_unstable_by_key(|&i| self.nodes[i as usize].offset);
        v
    }

    fn requested_of(&self, n: u32) -> u64 {
        let node = &self.nodes[n as usize];
        if node.slack() == BIG_SLACK {
            self.big_slack.get(&(n as u64)).copied().unwrap_or(0)
        } else {
            node.size - node.slack()
        }
    }

    fn live_block(&self, n: u32) -> AllocatedBlock {
        let node = &self.nodes[n as usize];
        AllocatedBlock { offset: node.offset, size: node.size, requested: self.requested_of(n) }
    }

    /// O(f log f) for f free blocks.
    pub(crate) fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        let mut v: Vec<(u64, u64)> = self.free_nodes().map(|n| (n.offset, n.size)).collect();
        v.sort_unstable();
        Box::new(v.into_iter())
    }

    /// O(n log n) for n live blocks.
    pub(crate) fn live_blocks(&self) -> Vec<AllocatedBlock> {
        self.live_sorted().into_iter().map(|n| self.live_block(n)).collect()
    }

    pub(crate) fn compaction_layout(&self) -> CompactionLayout {
        let blocks = self
            .live_sorted()
            .into_iter()
            .map(|n| {
                let node = &self.nodes[n as usize];
                CompactBlock {
                    id: node.offset,
                    offset: node.offset,
                    len: node.size,
                    align: (1u64 << node.align_log2()).max(self.granule),
                    pinned: false,
                }
            })
            .collect();
        CompactionLayout { blocks, regions: vec![Region::new(0, self.capacity)] }
    }

    /// Moves the live blocks as `plan` says; every live block keeps its node, so handles stay valid.
    pub(crate) fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        let layout = self.compaction_layout();
        let sorted = self.live_sorted();
        let moved = relocate_live(&self.live_blocks(), &layout, plan)?;
        let keep: Vec<(AllocatedBlock, u8, Option<u32>)> = moved
            .into_iter()
            .map(|(old, new)| {
                let i = sorted.partition_point(|&n| self.nodes[n as usize].offset < old);
                let n = sorted[i];
                (new, self.nodes[n as usize].align_log2(), Some(n))
            })
            .collect();
        self.rebuild_keeping(&keep)
    }

    /// Re-creates exactly the live blocks given (ascending, disjoint); a block with `Some(node)` stays in that
    /// live node (its handle stays valid), the others get new nodes. O(n).
    fn rebuild_keeping(&mut self, live: &[(AllocatedBlock, u8, Option<u32>)]) -> Result<(), AllocError> {
        let blocks: Vec<AllocatedBlock> = live.iter().map(|x| x.0).collect();
        check_layout(&blocks, self.capacity, self.granule)?;
        let mut kept = vec![false; self.nodes.len()];
        for &(_, _, n) in live {
            match n {
                Some(n) if self.nodes.get(n as usize).is_some_and(|x| x.is_live()) && !kept[n as usize] => {
                    kept[n as usize] = true
                }
                Some(_) => return Err(AllocError::InvalidRelocation("kept node is not a distinct live node")),
                None => {}
            }
        }
        self.spare.clear();
        for i in (0..self.nodes.len()).rev() {
            if !kept[i] {
                let node = &mut self.nodes[i];
                (node.size, node.a) = (0, NIL);
                self.set_live(i as u32, false);
                self.spare.push(i as u32);
            }
        }
        self.by_offset.clear();
        self.big_slack.clear();
        self.index.clear();
        (self.live_count, self.allocated, self.free_bytes, self.free_count) = (0, 0, 0, 0);
        let (mut cursor, mut prev) = (0u64, NIL);
        for &(b, align_log2, keep) in live {
            if b.offset > cursor {
                prev = self.link_free(cursor, b.offset - cursor, prev);
            }
            // A kept block keeps its stamp, so its handle stays valid.
            let (n, stamp) = match keep {
                Some(n) => {
                    let node = &mut self.nodes[n as usize];
                    (node.offset, node.size, node.prev, node.next) = (b.offset, b.size, prev, NIL);
                    (n, node.a)
                }
                None => (self.new_node(b.offset, b.size, prev, NIL), self.next_stamp()),
            };
            if prev != NIL {
                self.nodes[prev as usize].next = n;
            }
            self.make_live(n, b.size, b.requested, align_log2, stamp);
            (cursor, prev) = (b.offset + b.size, n);
        }
        if cursor < self.capacity {
            self.link_free(cursor, self.capacity - cursor, prev);
        }
        Ok(())
    }

    /// Appends the free block `[offset, offset + size)` after `prev` during a rebuild; returns its node.
    fn link_free(&mut self, offset: u64, size: u64, prev: u32) -> u32 {
        let f = self.new_node(offset, size, prev, NIL);
        if prev != NIL {
            self.nodes[prev as usize].next = f;
        }
        self.index.insert(&mut self.nodes, f);
        self.free_count += 1;
        self.free_bytes += size;
        f
    }

    /// The nodes (tests of the free indices).
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Panics if an invariant of the module doc does not hold (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let (mut free, mut count, mut reserved, mut allocated, mut live) = (0u64, 0usize, 0u64, 0u64, 0usize);
        let mut n = self.nodes.iter().position(|x| x.size > 0 && x.offset == 0).expect("a block at 0") as u32;
        assert_eq!(self.nodes[n as usize].prev, NIL);
        let (mut expect, mut prev, mut prev_free, mut seen) = (0u64, NIL, false, 0usize);
        while n != NIL {
            let node = &self.nodes[n as usize];
            assert_eq!(node.prev, prev, "prev link of node {n}");
            assert_eq!(node.offset, expect, "gap or overlap at {expect}");
            assert!(node.size > 0 && node.size.is_multiple_of(self.granule));
            assert!(node.offset.is_multiple_of(self.granule));
            if node.is_live() {
                let requested = self.requested_of(n);
                assert!(requested > 0 && requested <= node.size);
                assert_eq!(self.big_slack.contains_key(&(n as u64)), node.slack() == BIG_SLACK);
                (reserved, allocated, live) = (reserved + node.size, allocated + requested, live + 1);
                prev_free = false;
            } else {
                assert!(!prev_free, "adjacent free blocks at {expect}");
                (free, count, prev_free) = (free + node.size, count + 1, true);
            }
            expect += node.size;
            (prev, n, seen) = (n, node.next, seen + 1);
        }
        assert_eq!(expect, self.capacity);
        for (i, x) in self.nodes.iter().enumerate() {
            assert_eq!(x.size == 0, self.spare.contains(&(i as u32)), "node {i}: spare iff size 0");
            assert_eq!(self.is_live_node(i as u32), x.is_live(), "live bit of node {i}");
        }
        assert_eq!(self.live.len(), self.nodes.len().div_ceil(64), "live bitmap length");
        assert_eq!(seen + self.spare.len(), self.nodes.len(), "a node is neither in the list nor spare");
        assert_eq!((free, count), (self.free_bytes, self.free_count));
        assert_eq!((reserved, allocated, live), (self.capacity - self.free_bytes, self.allocated, self.live_count));
        if self.by_offset.is_built() {
            for (i, x) in self.nodes.iter().enumerate().filter(|x| x.1.is_live()) {
                assert_eq!(self.by_offset.get(x.offset), Some(i as u32));
            }
        }
    }
}

/// Generates a public newtype over `BlockList<$index>` implementing [`super::SubAllocator`]; with an index
/// constructor (`(capacity, granule) -> index`) also its `new`, `with_granule` and `granule`.
macro_rules! block_list_strategy {
    ($ty:ident, $name:literal, $index:expr) => {
        impl $ty {
            #[doc = concat!($name, " over `capacity` bytes with the [default granule](crate::reference::DEFAULT_GRANULE).")]
            ///
            /// # Errors
            /// [`AllocError::InvalidConfig`](crate::reference::AllocError::InvalidConfig) if `capacity` is
            /// below one granule or above 2^48.
            pub fn new(capacity: u64) -> Result<Self, $crate::reference::AllocError> {
                Self::with_granule(capacity, $crate::reference::DEFAULT_GRANULE)
            }

            #[doc = concat!($name, " whose offsets and sizes are multiples of `granule` bytes (a power of two);")]
            /// `capacity` is rounded down to it.
            ///
            /// # Errors
            /// [`AllocError::InvalidConfig`](crate::reference::AllocError::InvalidConfig) for a bad granule or
            /// capacity.
            #[doc(hidden)]
            pub fn with_granule(capacity: u64, granule: u64) -> Result<Self, $crate::reference::AllocError> {
                let index: fn(u64, u64) -> _ = $index;
                Ok($ty($crate::reference::block_list::BlockList::new(capacity, granule, index(capacity, granule))?))
            }

            /// Granule in bytes.
            #[doc(hidden)]
            pub fn granule(&self) -> u64 {
                self.0.granule()
            }

            /// Frees the block named by `handle` alone (the [`Handle`](crate::reference::Handle) of its
            /// [`Allocation`](crate::reference::Allocation)), for callers that keep 8 bytes per live block
            /// instead of the whole allocation: O(1), plus the coalescing. The handle's stamp is checked in
            /// every build, so a handle freed before is rejected even after its record was reused.
            ///
            /// # Errors
            /// [`AllocError::UnknownHandle`](crate::reference::AllocError::UnknownHandle) if the handle names
            /// no live block of this allocator; the allocator is then unchanged.
            #[inline]
            #[doc(hidden)]
            pub fn free_handle(&mut self, handle: $crate::reference::Handle) -> Result<(), $crate::reference::AllocError> {
                self.0.free_handle(handle)
            }
        }
        $crate::reference::block_list::block_list_strategy!($ty, $name);
    };
    ($ty:ident, $name:literal) => {
        impl $crate::reference::SubAllocator for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn capacity(&self) -> u64 {
                self.0.capacity()
            }
            fn alloc(
                &mut self,
                size: u64,
                align: u64,
            ) -> Result<$crate::reference::Allocation, $crate::reference::AllocError> {
                self.0.alloc(size, align)
            }
            fn free(&mut self, a: $crate::reference::Allocation) -> Result<(), $crate::reference::AllocError> {
                self.0.free(a)
            }
            fn free_at(&mut self, offset: u64) -> Result<(), $crate::reference::AllocError> {
                self.0.free_at(offset)
            }
            fn stats(&self) -> $crate::reference::Stats {
                self.0.stats()
            }
            fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
                self.0.free_blocks()
            }
            fn live_blocks(&self) -> Vec<$crate::reference::AllocatedBlock> {
                self.0.live_blocks()
            }
            fn reset(&mut self) {
                self.0.reset()
            }
            fn compaction_layout(&self) -> $crate::reference::CompactionLayout {
                self.0.compaction_layout()
            }
            fn apply_relocation(
                &mut self,
                plan: &$crate::reference::CompactionPlan,
            ) -> Result<(), $crate::reference::AllocError> {
                self.0.apply_relocation(plan)
            }
        }
    };
}
pub(crate) use block_list_strategy;

/// The first non-empty class at or above `(fl, sl)` of a two-level bitmap (TLSF's search, Masmano et
/// al. 2004): bit `fl` of `fl_bitmap` is set iff `sl_bitmap[fl] != 0`. O(1): two `trailing_zeros`.
#[inline]
pub(crate) fn first_class_at_or_above(
    fl_bitmap: u64,
    sl_bitmap: &[u32; FL_COUNT],
    fl: usize,
    sl: usize,
) -> Option<(usize, usize)> {
    let sl_map = if sl >= SL_COUNT { 0 } else { sl_bitmap[fl] & (u32::MAX << sl) };
    if sl_map != 0 {
        return Some((fl, sl_map.trailing_zeros() as usize));
    }
    let fl_map = if fl + 1 >= 64 { 0 } else { fl_bitmap & (u64::MAX << (fl + 1)) };
    if fl_map == 0 {
        return None;
    }
    let fl = fl_map.trailing_zeros() as usize;
    Some((fl, sl_bitmap[fl].trailing_zeros() as usize))
}

/// TLSF-style size class of `g` granules: `SL_COUNT` linear classes below `SL_COUNT`, then `SL_COUNT`
/// sub-classes per power of two. Returns `(fl, sl)`.
pub(crate) const SL_LOG2: u32 = 5;
pub(crate) const SL_COUNT: usize = 1 << SL_LOG2;
pub(crate) const FL_COUNT: usize = 65 - SL_LOG2 as usize;

#[inline]
pub(crate) fn size_class(g: u64) -> (usize, usize) {
    debug_assert!(g > 0);
    if g < SL_COUNT as u64 {
        (0, g as usize)
    } else {
        let m = 63 - g.leading_zeros();
        ((m - SL_LOG2 + 1) as usize, ((g >> (m - SL_LOG2)) as usize) - SL_COUNT)
    }
}

/// Is `g` granules the lower bound of its size class (so that `round_to_class(g) == Some(g)`)?
#[inline]
pub(crate) fn is_class_lower_bound(g: u64) -> bool {
    g < SL_COUNT as u64 || g & ((1u64 << (63 - g.leading_zeros() - SL_LOG2)) - 1) == 0
}

/// Smallest `g' >= g` that is the lower bound of a size class, or `None` on overflow.
#[inline]
pub(crate) fn round_to_class(g: u64) -> Option<u64> {
    if g < SL_COUNT as u64 {
        Some(g)
    } else {
        let m = 63 - g.leading_zeros();
        let step = 1u64 << (m - SL_LOG2);
        g.checked_add(step - 1).map(|v| v & !(step - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_monotone_and_contiguous() {
        let mut last = (0, 0);
        for g in 1..5000u64 {
            let c = size_class(g);
            assert!(c >= last, "class of {g} went down");
            assert!(c.1 < SL_COUNT && c.0 < FL_COUNT);
            last = c;
            let r = round_to_class(g).unwrap();
            assert_eq!(is_class_lower_bound(g), r == g, "lower bound test of {g}");
            assert!(r >= g && size_class(r) >= size_class(g));
            // every size in class(r) is >= r
            assert!(r == g || size_class(r - 1) < size_class(r));
        }
        assert!(size_class(u64::MAX).0 < FL_COUNT);
    }

    #[test]
    fn good_fit_class_from_own_class() {
        // TLSF's search derives the class of `round_to_class(g)` from `size_class(g)`: the same class for a
        // lower bound, else the next one (sl == SL_COUNT meaning the first class of the next level).
        let mut gs: Vec<u64> = (1..5000).collect();
        for m in 5..62 {
            for d in [0u64, 1, 2, 31, 32, 33] {
                gs.extend([(1u64 << m).saturating_sub(d).max(1), (1u64 << m) + d, (3u64 << (m - 1)) + d]);
            }
        }
        for g in gs {
            let (fl, sl) = size_class(g);
            let fast = if is_class_lower_bound(g) { (fl, sl) } else { (fl, sl + 1) };
            let fast = if fast.1 == SL_COUNT { (fast.0 + 1, 0) } else { fast };
            assert_eq!(Some(fast), round_to_class(g).map(size_class), "g = {g}");
        }
    }
}

#[cfg(test)]
mod churn_tests {
    use super::super::address_index::AddressIndex;
    use super::super::best_fit::BestFitIndex;
    use super::super::first_fit::FirstFitIndex;
    use super::super::tlsf::TlsfIndex;
    use super::*;

    /// Random alloc/free churn with every invariant checked after each step, for each index; best-fit's
    /// choice is compared with a brute-force scan of the free blocks. Frees go by offset, by handle alone and
    /// by allocation in turn.
    fn churn<I: FreeIndex>(mut a: BlockList<I>, best_fit: bool) {
        let mut live: Vec<Allocation> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || live.is_empty() {
                let size = 1 + (x >> 8) % (a.granule() * 40);
                let align = 1u64 << ((x >> 40) % 12);
                let want = best_fit.then(|| {
                    let g = a.granule();
                    let rounded = size.div_ceil(g) * g;
                    a.free_blocks()
                        .filter(|&(o, l)| fit_front(o, l, rounded, align.max(g)).is_some())
                        .min_by_key(|&(o, l)| (l, o))
                });
                match a.alloc(size, align) {
                    Ok(b) => {
                        if let Some(w) = want {
                            let (o, l) = w.expect("allocated although nothing fits");
                            assert!(b.offset >= o && b.offset < o + l, "best fit is ({o}, {l}), got {b:?}");
                        }
                        live.push(b);
                    }
                    Err(AllocError::OutOfMemory { .. }) => assert!(want.is_none_or(|w| w.is_none())),
                    Err(e) => panic!("{e}"),
                }
            } else {
                let b = live.swap_remove((x >> 20) as usize % live.len());
                match step % 3 {
                    0 => a.free_at(b.offset).unwrap(),
                    1 => a.free_handle(b.handle).unwrap(),
                    _ => a.free(b).unwrap(),
                }
                assert_eq!(a.free(b), Err(AllocError::DoubleFree { offset: b.offset }));
                assert_eq!(a.free_handle(b.handle), Err(AllocError::UnknownHandle));
            }
            a.check_invariants();
        }
        for b in live {
            a.free(b).unwrap();
        }
        a.check_invariants();
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, a.capacity())]);
    }

    #[test]
    fn tlsf_churn_keeps_invariants() {
        churn(BlockList::new(1 << 22, 64, TlsfIndex::new(64)).unwrap(), false);
    }

    #[test]
    fn best_fit_churn_is_exact() {
        churn(BlockList::new(1 << 22, 64, BestFitIndex::new(1 << 22, 64)).unwrap(), true);
    }

    #[test]
    fn first_fit_churn_keeps_invariants() {
        churn(BlockList::new(1 << 22, 64, FirstFitIndex::new(1 << 22, 64)).unwrap(), false);
        churn(BlockList::new(1 << 22, 64, AddressIndex::new(u64::MAX)).unwrap(), false);
    }

    #[test]
    fn stale_and_foreign_handles_are_errors() {
        let mut a = BlockList::new(1 << 20, 64, TlsfIndex::new(64)).unwrap();
        let b = a.alloc(100, 1).unwrap();
        a.free(b).unwrap();
        // The node is reused for a new block at the same offset: the old handle is stale.
        let c = a.alloc(100, 1).unwrap();
        assert_eq!((c.offset, c.handle.index()), (b.offset, b.handle.index()));
        assert_eq!(a.free(b), Err(AllocError::StaleHandle { offset: b.offset }));
        assert_eq!(a.free_handle(b.handle), Err(AllocError::UnknownHandle));
        for h in [Handle::NONE, Handle::new(1000, c.handle.generation()), Handle::new(c.handle.index() as u32, 0)] {
            assert_eq!(a.free_handle(h), Err(AllocError::UnknownHandle), "{h:?}");
        }
        let inside = Allocation { offset: c.offset + 64, ..c };
        assert_eq!(a.free(inside), Err(AllocError::InvalidFree { offset: c.offset + 64 }));
        let in_free = Allocation { offset: c.offset + c.size, ..c };
        assert_eq!(a.free(in_free), Err(AllocError::DoubleFree { offset: c.offset + c.size }));
        let out_of_range = Allocation { handle: Handle::new(1000, 0), ..c };
        assert_eq!(a.free(out_of_range), Err(AllocError::StaleHandle { offset: c.offset }));
        assert_eq!(a.free(Allocation { handle: Handle::NONE, ..c }), Err(AllocError::StaleHandle { offset: c.offset }));
        for o in [c.offset + 1, 1 << 62, u64::MAX] {
            assert_eq!(a.free_at(o), Err(AllocError::InvalidFree { offset: o }), "{o}");
        }
        a.check_invariants();
        a.free(c).unwrap();
        a.check_invariants();
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
    }

    #[test]
    fn free_by_handle_alone() {
        assert_eq!(std::mem::size_of::<Option<Handle>>(), 8);
        assert_eq!(std::mem::size_of::<Option<Allocation>>(), 24);
        let mut a = BlockList::new(1 << 20, 64, BestFitIndex::new(1 << 20, 64)).unwrap();
        let v: Vec<Allocation> = (0..4).map(|i| a.alloc(100 * (i + 1), 1).unwrap()).collect();
        // A free node's links are never taken for a stamp: a handle carrying one is unknown.
        a.free_handle(v[1].handle).unwrap();
        let link = a.nodes()[v[1].handle.index()].a;
        assert_eq!(a.free_handle(Handle::new(v[1].handle.index() as u32, link)), Err(AllocError::UnknownHandle));
        assert_eq!(a.free_handle(v[1].handle), Err(AllocError::UnknownHandle));
        a.check_invariants();
        for b in [v[0], v[2], v[3]] {
            a.free_handle(b.handle).unwrap();
            a.check_invariants();
        }
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
        // The stamp survives a reset's reuse of node 0: the old handle stays unknown.
        a.reset();
        let c = a.alloc(100, 1).unwrap();
        assert_eq!((c.offset, c.handle.index()), (v[0].offset, v[0].handle.index()));
        assert_eq!(a.free_handle(v[0].handle), Err(AllocError::UnknownHandle));
        a.free_handle(c.handle).unwrap();
    }

    #[test]
    fn stamps_wrap_below_nil() {
        let mut a = BlockList::new(1 << 20, 64, TlsfIndex::new(64)).unwrap();
        a.stamp = NIL - 1;
        let b = a.alloc(64, 1).unwrap();
        let c = a.alloc(64, 1).unwrap();
        assert_eq!((b.handle.generation(), c.handle.generation()), (NIL - 1, LIVE_MIN));
        a.check_invariants();
        a.free_handle(b.handle).unwrap();
        a.free(c).unwrap();
        a.check_invariants();
    }

    #[test]
    fn handles_survive_relocation() {
        let mut a = BlockList::new(1 << 20, 64, BestFitIndex::new(1 << 20, 64)).unwrap();
        let v: Vec<Allocation> = (0..6).map(|i| a.alloc(100 * (i + 1), 1).unwrap()).collect();
        a.free(v[1]).unwrap();
        a.free(v[3]).unwrap();
        let plan = crate::reference::compact::plan_slide(&a.compaction_layout()).unwrap();
        a.apply_relocation(&plan).unwrap();
        a.check_invariants();
        for b in [v[0], v[2], v[4]] {
            let moved = Allocation { offset: plan.translate(b.offset).unwrap(), ..b };
            a.free(moved).unwrap();
            a.check_invariants();
        }
        a.free_handle(v[5].handle).unwrap();
        a.check_invariants();
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
    }

    #[test]
    fn huge_granule_slack_goes_to_the_side_map() {
        // Slack of 2^40 - 1 bytes does not fit the packed entry.
        let mut a = BlockList::new(1 << 44, 1 << 40, TlsfIndex::new(1 << 40)).unwrap();
        let b = a.alloc(1, 1).unwrap();
        assert_eq!(b.size, 1 << 40);
        assert_eq!(a.live_blocks()[0].requested, 1);
        assert_eq!(a.stats().allocated, 1);
        a.check_invariants();
        a.free(b).unwrap();
        a.check_invariants();
        assert_eq!(a.stats().allocated, 0);
    }
}
