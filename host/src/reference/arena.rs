//! The block arena shared by first-fit, best-fit, TLSF and the tiered backing.
//!
//! The range `[0, capacity)` is tiled by *blocks* kept out of band (offset-allocator style: the managed
//! memory is never touched). Live and free blocks are stored differently, because the hot paths touch them
//! differently:
//!
//! - A **live** block exists only as one 16-byte entry of an open-addressing [`OffsetTable`], `bounds`,
//!   keyed by its offset: size, log2 of the requested alignment and the rounding slack packed in one `u64`.
//!   `free(offset)` must map an offset to its block anyway, so that lookup *is* the block read.
//! - A **free** block is a [`Node`] in `nodes` (stable index while free, recycled through `spare`), found by
//!   its start and by its end through two more entries of the *same* table, keyed `start | START` and
//!   `end | END`. The table's hash ignores the tag bits, so the entries of one offset (the live block that
//!   starts there, the free block that starts there, the free block that ends there) share a probe run,
//!   usually one cache line. The free-block search structure, a [`FreeIndex`], links nodes by index; this
//!   is what differs between strategies.
//!
//! Freeing `[o, o + size)` reads the line of `o` (the live entry and `END` of a free predecessor) and the
//! line of `o + size` (`START` of a free successor, where the merged block's `END` also goes), and merges at
//! once (immediate coalescing), so no physical list of blocks is kept. A pair of alloc and free touches the
//! large table at about four places: the carved block's start, the remainder's new start, and the two lines
//! of the freed block.
//!
//! Measured on the `strategies` workload (`strategies_icount` under callgrind, 200k pairs, 1 MiB LL):
//! the previous layout (live table plus two 512 KiB–1 MiB start/end tables of the free blocks) cost TLSF
//! 796 instructions, 13.8 D1 and 8.2 LL misses per pair; one tagged table costs 1075 instructions (longer
//! probe runs: the table holds about 140k entries instead of 100k) but 12.2 D1 and 6.6 LL misses, and runs
//! faster (criterion thread CPU time, same run as offset-allocator: 326 -> 261–293 ns per pair). The table
//! grows past a load of 5/8 rather than 1/2 so that it stays at 2^18 slots (4 MiB); at 1/2 it doubles to
//! 8 MiB, which cuts the simulated misses further (9.8 D1, 5.7 LL) but measured 348–494 ns per pair.
//!
//! Invariants (checked by `check_invariants` in tests):
//! - Live blocks (the untagged keys of `bounds`) and free blocks (the nodes of non-zero size) tile `[0, capacity)`
//!   without gaps or overlaps; no two free blocks are adjacent (immediate coalescing).
//! - Every offset and size is a multiple of `granule`; sizes are non-zero. Spare nodes have size 0.
//! - `bounds[n.offset | START] == n` and `bounds[(n.offset + n.size) | END] == n` for every free node `n`,
//!   untagged keys are exactly the live blocks, and the table holds nothing else; a node is in the free index iff it is free.
//! - A live entry's slack is `reserved - requested` when below [`BIG_SLACK`], else the requested size is in
//!   `big_slack` (only for granules above 512 B or rebuilt layouts with large slack).
//! - Counters (`free_bytes`, `free_count`, `reserved_in_use`, `allocated`) match the blocks.
//!
//! Complexity: alloc and free are the index's cost plus O(1) expected table operations. `free_blocks`,
//! `live_blocks` and the compaction layout sort, O(n log n); the error path of `free` (double or invalid
//! free) scans the free blocks, O(free blocks).

use super::compact::{relocate_live, CompactBlock, CompactionLayout, CompactionPlan, Region};
use super::offset_table::OffsetTable;
use super::{
    check_layout, check_request, fit_back, fit_front, offset_map, oom, AllocError, Allocation, LiveBlock, OffsetMap,
    Stats, MAX_BYTES,
};

/// No node.
pub(crate) const NIL: u32 = u32::MAX;

/// Tag of a `bounds` key holding the free node that starts at the untagged offset.
const START: u64 = 1 << 62;
/// Tag of a `bounds` key holding the free node that ends at the untagged offset.
const END: u64 = 1 << 63;
/// Both tags; offsets are at most 2^48, so an untagged key is a live block.
const TAGS: u64 = START | END;

/// A free block: 24 bytes plus the index's extra data `X`. `a`, `b` and `x` belong to the free index
/// (free-list links for TLSF, children and subtree maximum for the treap).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<X> {
    pub offset: u64,
    pub size: u64,
    pub a: u32,
    pub b: u32,
    pub x: X,
}

impl<X: Default> Node<X> {
    fn new(offset: u64, size: u64) -> Self {
        Node { offset, size, a: NIL, b: NIL, x: X::default() }
    }
}

/// A live block packed into the value of its `live` entry: reserved size (49 bits, up to 2^48 inclusive),
/// log2 of the requested alignment (6 bits) and slack `reserved - requested` (9 bits, [`BIG_SLACK`] when it
/// does not fit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Live(u64);

const SIZE_BITS: u32 = 49;
const ALIGN_SHIFT: u32 = SIZE_BITS;
const SLACK_SHIFT: u32 = SIZE_BITS + 6;
/// Slack value meaning "the requested size is in `big_slack`".
const BIG_SLACK: u64 = (1 << (64 - SLACK_SHIFT)) - 1;

impl Live {
    #[inline]
    fn new(size: u64, align_log2: u8, slack: u64) -> Self {
        debug_assert!(size <= MAX_BYTES && align_log2 < 64);
        Live(size | (align_log2 as u64) << ALIGN_SHIFT | slack.min(BIG_SLACK) << SLACK_SHIFT)
    }
    #[inline]
    fn size(self) -> u64 {
        self.0 & ((1 << SIZE_BITS) - 1)
    }
    #[inline]
    fn align_log2(self) -> u8 {
        ((self.0 >> ALIGN_SHIFT) & 63) as u8
    }
    #[inline]
    fn slack(self) -> u64 {
        self.0 >> SLACK_SHIFT
    }
}

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
    /// Per-node data of the index (`()` when the links `a`/`b` suffice).
    type Extra: Copy + Default + Send + std::fmt::Debug;
    /// Adds free node `n` (its offset and size are final while it stays in the index).
    fn insert(&mut self, nodes: &mut [Node<Self::Extra>], n: u32);
    /// Removes free node `n`.
    fn remove(&mut self, nodes: &mut [Node<Self::Extra>], n: u32);
    /// Free node `n`, in the index, changed from `(old_offset, old_size)` to its current offset and size
    /// without changing its address order among the free blocks (a split or merge in place).
    fn update(&mut self, nodes: &mut [Node<Self::Extra>], n: u32, old_offset: u64, old_size: u64);
    /// A free node that holds `size` bytes (a granule multiple) at an `align`-aligned start, and where.
    fn find(&mut self, nodes: &[Node<Self::Extra>], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)>;
    /// Size of the largest free block in bytes.
    fn largest(&self, nodes: &[Node<Self::Extra>]) -> u64;
    /// Forgets every block.
    fn clear(&mut self);
}

/// Generic arena allocator over a [`FreeIndex`].
#[derive(Debug)]
pub(crate) struct Arena<I: FreeIndex> {
    capacity: u64,
    granule: u64,
    /// Free blocks (size > 0) and spare slots (size 0).
    nodes: Vec<Node<I::Extra>>,
    spare: Vec<u32>,
    /// One table for every boundary: live blocks by offset (untagged key, a [`Live`]), free nodes by start
    /// (`offset | START`) and by end (`offset | END`). The hash ignores the tags, so all entries of one
    /// offset share a probe run, usually one cache line.
    bounds: OffsetTable<u64>,
    live_count: usize,
    /// Requested bytes of the live blocks whose slack is [`BIG_SLACK`] or more.
    big_slack: OffsetMap<u64>,
    pub(crate) index: I,
    allocated: u64,
    reserved_in_use: u64,
    free_bytes: u64,
    free_count: usize,
}

impl<I: FreeIndex> Arena<I> {
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
        let mut a = Arena {
            capacity,
            granule,
            nodes: Vec::new(),
            spare: Vec::new(),
            bounds: OffsetTable::with_max_load_8ths(0, 5),
            live_count: 0,
            big_slack: offset_map(),
            index,
            allocated: 0,
            reserved_in_use: 0,
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
        self.spare.clear();
        self.bounds.clear();
        self.live_count = 0;
        self.big_slack.clear();
        self.index.clear();
        self.allocated = 0;
        self.reserved_in_use = 0;
        self.free_bytes = self.capacity;
        self.free_count = 0;
        self.add_free(0, self.capacity);
    }

    /// Creates, registers and indexes the free block `[offset, offset + size)`.
    #[inline]
    fn add_free(&mut self, offset: u64, size: u64) -> u32 {
        let node = Node::new(offset, size);
        let n = if let Some(i) = self.spare.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.bounds.insert(offset | START, n as u64);
        self.bounds.insert((offset + size) | END, n as u64);
        self.index.insert(&mut self.nodes, n);
        self.free_count += 1;
        n
    }

    /// Recycles free node `n`, already out of the index and the tables.
    #[inline]
    fn recycle(&mut self, n: u32) {
        self.nodes[n as usize].size = 0;
        self.spare.push(n);
        self.free_count -= 1;
    }

    /// Carves the live block `[start, start + size)` out of free node `n`. Node `n` keeps a free remainder
    /// when there is one (updated in place: its address order does not change), so most carves cost one
    /// index update.
    #[inline]
    fn carve(&mut self, n: u32, start: u64, size: u64, requested: u64, align_log2: u8) {
        let Node { offset, size: len, .. } = self.nodes[n as usize];
        let end = offset + len;
        let (front, back) = (start - offset, end - start - size);
        if front > 0 {
            self.nodes[n as usize].size = front;
            self.bounds.insert(start | END, n as u64);
            if back > 0 {
                // The back remainder takes over `end | END`.
                self.index.update(&mut self.nodes, n, offset, len);
                let t = self.add_free_unindexed(start + size, back);
                self.bounds.insert(end | END, t as u64);
                self.index.insert(&mut self.nodes, t);
            } else {
                self.bounds.remove(end | END);
                self.index.update(&mut self.nodes, n, offset, len);
            }
        } else if back > 0 {
            self.nodes[n as usize].offset = start + size;
            self.nodes[n as usize].size = back;
            self.bounds.remove(offset | START);
            self.bounds.insert((start + size) | START, n as u64);
            self.index.update(&mut self.nodes, n, offset, len);
        } else {
            self.index.remove(&mut self.nodes, n);
            self.bounds.remove(offset | START);
            self.bounds.remove(end | END);
            self.recycle(n);
        }
        let slack = size - requested;
        if slack >= BIG_SLACK {
            self.big_slack.insert(start, requested);
        }
        self.bounds.insert(start, Live::new(size, align_log2, slack).0);
        self.live_count += 1;
        self.free_bytes -= size;
        self.reserved_in_use += size;
        self.allocated += requested;
    }

    /// A new free node registered by its start only (the caller sets its `END` entry and indexes it).
    #[inline]
    fn add_free_unindexed(&mut self, offset: u64, size: u64) -> u32 {
        let node = Node::new(offset, size);
        let n = if let Some(i) = self.spare.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.bounds.insert(offset | START, n as u64);
        self.free_count += 1;
        n
    }

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
        self.carve(n, start, rounded, size, align.trailing_zeros() as u8);
        Ok(Allocation { offset: start, size: rounded })
    }

    pub(crate) fn free(&mut self, offset: u64) -> Result<(), AllocError> {
        if offset & TAGS != 0 {
            return Err(self.classify_bad_free(offset));
        }
        let Some(live) = self.bounds.remove(offset).map(Live) else {
            return Err(self.classify_bad_free(offset));
        };
        self.live_count -= 1;
        let size = live.size();
        let requested = if live.slack() == BIG_SLACK {
            self.big_slack.remove(&offset).expect("big slack recorded")
        } else {
            size - live.slack()
        };
        self.allocated -= requested;
        self.reserved_in_use -= size;
        self.free_bytes += size;
        let end = offset + size;
        let prev = self.bounds.get(offset | END).map(|v| v as u32);
        let next = self.bounds.get(end | START).map(|v| v as u32);
        match (prev, next) {
            (None, None) => {
                self.add_free(offset, size);
            }
            (Some(p), None) => {
                let Node { offset: po, size: ps, .. } = self.nodes[p as usize];
                self.nodes[p as usize].size = ps + size;
                self.bounds.remove(offset | END);
                self.bounds.insert(end | END, p as u64);
                self.index.update(&mut self.nodes, p, po, ps);
            }
            (None, Some(q)) => {
                // `q` absorbs the block and keeps its place in the index.
                let qs = self.nodes[q as usize].size;
                self.nodes[q as usize].offset = offset;
                self.nodes[q as usize].size = qs + size;
                self.bounds.remove(end | START);
                self.bounds.insert(offset | START, q as u64);
                self.index.update(&mut self.nodes, q, end, qs);
            }
            (Some(p), Some(q)) => {
                let Node { offset: po, size: ps, .. } = self.nodes[p as usize];
                let qs = self.nodes[q as usize].size;
                self.index.remove(&mut self.nodes, q);
                self.bounds.remove(end | START);
                self.bounds.remove(offset | END);
                self.bounds.insert((end + qs) | END, p as u64);
                self.recycle(q);
                self.nodes[p as usize].size = ps + size + qs;
                self.index.update(&mut self.nodes, p, po, ps);
            }
        }
        Ok(())
    }

    /// Error path only, O(free blocks): double free if `offset` lies in a free block.
    fn classify_bad_free(&self, offset: u64) -> AllocError {
        let in_free = self.free_nodes().any(|n| n.offset <= offset && offset - n.offset < n.size);
        if in_free {
            AllocError::DoubleFree { offset }
        } else {
            AllocError::InvalidFree { offset }
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            capacity: self.capacity,
            allocated: self.allocated,
            reserved_in_use: self.reserved_in_use,
            reserved: self.reserved_in_use,
            free: self.free_bytes,
            largest_free: self.index.largest(&self.nodes),
            stranded: 0,
            free_blocks: self.free_count,
            live_blocks: self.live_count,
        }
    }

    /// The free nodes, in no particular order.
    fn free_nodes(&self) -> impl Iterator<Item = &Node<I::Extra>> + '_ {
        self.nodes.iter().filter(|n| n.size > 0)
    }

    /// Live blocks as `(offset, entry)`, ascending.
    fn live_sorted(&self) -> Vec<(u64, Live)> {
        let mut v: Vec<(u64, Live)> =
            self.bounds.iter().filter(|e| e.0 & TAGS == 0).map(|(k, v)| (k, Live(v))).collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }

    fn requested_of(&self, offset: u64, live: Live) -> u64 {
        if live.slack() == BIG_SLACK {
            self.big_slack.get(&offset).copied().unwrap_or(0)
        } else {
            live.size() - live.slack()
        }
    }

    /// O(f log f) for f free blocks.
    pub(crate) fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        let mut v: Vec<(u64, u64)> = self.free_nodes().map(|n| (n.offset, n.size)).collect();
        v.sort_unstable();
        Box::new(v.into_iter())
    }

    /// O(n log n) for n live blocks.
    pub(crate) fn live_blocks(&self) -> Vec<LiveBlock> {
        self.live_sorted()
            .into_iter()
            .map(|(offset, l)| LiveBlock { offset, size: l.size(), requested: self.requested_of(offset, l) })
            .collect()
    }

    pub(crate) fn compaction_layout(&self) -> CompactionLayout {
        let blocks = self
            .live_sorted()
            .into_iter()
            .map(|(offset, l)| CompactBlock {
                id: offset,
                offset,
                len: l.size(),
                align: (1u64 << l.align_log2()).max(self.granule),
                pinned: false,
            })
            .collect();
        CompactionLayout { blocks, regions: vec![Region::new(0, self.capacity)] }
    }

    pub(crate) fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        let layout = self.compaction_layout();
        let moved = relocate_live(&self.live_blocks(), &layout, plan)?;
        let with_align: Vec<(LiveBlock, u8)> = moved
            .into_iter()
            .map(|(old, new)| (new, self.bounds.get(old).map_or(0, |v| Live(v).align_log2())))
            .collect();
        self.rebuild(&with_align)
    }

    /// Resets and re-creates exactly the live blocks given (ascending, disjoint); O(n) expected.
    pub(crate) fn rebuild(&mut self, live: &[(LiveBlock, u8)]) -> Result<(), AllocError> {
        let blocks: Vec<LiveBlock> = live.iter().map(|x| x.0).collect();
        check_layout(&blocks, self.capacity, self.granule)?;
        self.reset();
        // One node holds the whole range; every carve leaves the remaining tail as the free block that
        // starts right after the carved one.
        let mut tail = 0;
        for &(b, align_log2) in live {
            self.carve(tail, b.offset, b.size, b.requested, align_log2);
            match self.bounds.get((b.offset + b.size) | START).map(|v| v as u32) {
                Some(t) => tail = t,
                None => break, // the range is full; the layout check guarantees nothing follows
            }
        }
        Ok(())
    }

    /// Panics if an invariant of the module doc does not hold (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut blocks: Vec<(u64, u64, bool)> = Vec::new();
        let (mut free, mut count) = (0u64, 0usize);
        for (i, n) in self.nodes.iter().enumerate() {
            if n.size == 0 {
                assert!(self.spare.contains(&(i as u32)), "node {i} of size 0 is not spare");
                continue;
            }
            assert_eq!(self.bounds.get(n.offset | START).map(|v| v as u32), Some(i as u32), "by_start of node {i}");
            assert_eq!(
                self.bounds.get((n.offset + n.size) | END).map(|v| v as u32),
                Some(i as u32),
                "by_end of node {i}"
            );
            free += n.size;
            count += 1;
            blocks.push((n.offset, n.size, true));
        }
        let tagged = |t: u64| self.bounds.iter().filter(|e| e.0 & TAGS == t).count();
        assert_eq!((tagged(START), tagged(END)), (count, count));
        let mut reserved = 0;
        let mut allocated = 0;
        for (offset, l) in self.live_sorted() {
            reserved += l.size();
            let requested = self.requested_of(offset, l);
            assert!(requested > 0 && requested <= l.size());
            assert_eq!(self.big_slack.contains_key(&offset), l.slack() == BIG_SLACK);
            allocated += requested;
            blocks.push((offset, l.size(), false));
        }
        blocks.sort_unstable();
        let mut expect = 0u64;
        let mut prev_free = false;
        for &(offset, size, is_free) in &blocks {
            assert_eq!(offset, expect, "gap or overlap at {offset}");
            assert!(size > 0 && size.is_multiple_of(self.granule));
            assert!(!(prev_free && is_free), "adjacent free blocks at {offset}");
            prev_free = is_free;
            expect += size;
        }
        assert_eq!(expect, self.capacity);
        assert_eq!((free, count), (self.free_bytes, self.free_count));
        assert_eq!((reserved, allocated), (self.reserved_in_use, self.allocated));
        assert_eq!(self.live_count, tagged(0));
        assert_eq!(self.bounds.len(), self.live_count + 2 * count);
    }
}

/// Generates a public newtype over `Arena<$index>` implementing [`super::SubAllocator`]; with an index
/// constructor (`granule -> index`) also its `new`, `with_granule` and `granule`.
macro_rules! arena_strategy {
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
            pub fn with_granule(capacity: u64, granule: u64) -> Result<Self, $crate::reference::AllocError> {
                let index: fn(u64) -> _ = $index;
                Ok($ty($crate::reference::arena::Arena::new(capacity, granule, index(granule))?))
            }

            /// Granule in bytes.
            pub fn granule(&self) -> u64 {
                self.0.granule()
            }
        }
        $crate::reference::arena::arena_strategy!($ty, $name);
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
            fn free(&mut self, offset: u64) -> Result<(), $crate::reference::AllocError> {
                self.0.free(offset)
            }
            fn stats(&self) -> $crate::reference::Stats {
                self.0.stats()
            }
            fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
                self.0.free_blocks()
            }
            fn live_blocks(&self) -> Vec<$crate::reference::LiveBlock> {
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
pub(crate) use arena_strategy;

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
            assert!(r >= g && size_class(r) >= size_class(g));
            // every size in class(r) is >= r
            assert!(r == g || size_class(r - 1) < size_class(r));
        }
        assert!(size_class(u64::MAX).0 < FL_COUNT);
    }
}

#[cfg(test)]
mod churn_tests {
    use super::super::best_fit::BestFitIndex;
    use super::super::first_fit::AddressIndex;
    use super::super::tlsf::TlsfIndex;
    use super::*;

    /// Random alloc/free churn with every invariant checked after each step, for each index; best-fit's
    /// choice is compared with a brute-force scan of the free blocks.
    fn churn<I: FreeIndex>(mut a: Arena<I>, best_fit: bool) {
        let mut live: Vec<u64> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
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
                        live.push(b.offset);
                    }
                    Err(AllocError::OutOfMemory { .. }) => assert!(want.is_none_or(|w| w.is_none())),
                    Err(e) => panic!("{e}"),
                }
            } else {
                let o = live.swap_remove((x >> 20) as usize % live.len());
                a.free(o).unwrap();
                assert_eq!(a.free(o), Err(AllocError::DoubleFree { offset: o }));
            }
            a.check_invariants();
        }
        for o in live {
            a.free(o).unwrap();
        }
        a.check_invariants();
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, a.capacity())]);
    }

    #[test]
    fn tlsf_churn_keeps_invariants() {
        churn(Arena::new(1 << 22, 64, TlsfIndex::new(64)).unwrap(), false);
    }

    #[test]
    fn best_fit_churn_is_exact() {
        churn(Arena::new(1 << 22, 64, BestFitIndex::new(64)).unwrap(), true);
    }

    #[test]
    fn first_fit_churn_keeps_invariants() {
        churn(Arena::new(1 << 22, 64, AddressIndex::new(u64::MAX)).unwrap(), false);
    }

    #[test]
    fn tagged_offsets_are_invalid_frees() {
        // The keys of free blocks carry tag bits; a caller's offset with those bits must not reach them.
        let mut a = Arena::new(1 << 20, 64, TlsfIndex::new(64)).unwrap();
        let b = a.alloc(100, 1).unwrap();
        let tail = b.offset + b.size; // a free block starts here and the live one ends here
        for o in [tail | START, tail | END, b.offset | START, u64::MAX] {
            assert_eq!(a.free(o), Err(AllocError::InvalidFree { offset: o }));
            a.check_invariants();
        }
        a.free(b.offset).unwrap();
        a.check_invariants();
    }

    #[test]
    fn huge_granule_slack_goes_to_the_side_map() {
        // Slack of 2^40 - 1 bytes does not fit the packed entry.
        let mut a = Arena::new(1 << 44, 1 << 40, TlsfIndex::new(1 << 40)).unwrap();
        let b = a.alloc(1, 1).unwrap();
        assert_eq!(b.size, 1 << 40);
        assert_eq!(a.live_blocks()[0].requested, 1);
        assert_eq!(a.stats().allocated, 1);
        a.check_invariants();
        a.free(b.offset).unwrap();
        a.check_invariants();
        assert_eq!(a.stats().allocated, 0);
    }
}
