//! The block arena shared by first-fit, best-fit, TLSF and the tiered backing.
//!
//! The range `[0, capacity)` is tiled by *blocks* kept out of band in a `Vec<Node>` (offset-allocator style:
//! the managed memory is never touched). Blocks form a doubly linked list in address order (`prev`/`next`),
//! so coalescing on free is O(1); what differs between strategies is only the [`FreeIndex`] that finds a
//! free block for a request.
//!
//! Invariants (checked by `check_invariants` in debug tests):
//! - The physical list starts at node 0 (offset 0), tiles `[0, capacity)` without gaps, ascending.
//! - No two physically adjacent blocks are both free (immediate coalescing).
//! - Every offset and size is a multiple of `granule`; sizes are non-zero.
//! - A block is in the free index iff it is free; it is in `used` (keyed by offset) iff it is live.
//! - Counters (`free_bytes`, `free_count`, `reserved_in_use`, `allocated`) match the list.

use super::compact::{relocate_live, CompactBlock, CompactionLayout, CompactionPlan, Region};
use super::{
    check_layout, check_request, fit_back, fit_front, offset_map, oom, AllocError, Allocation, LiveBlock, OffsetMap,
    Stats, MAX_BYTES,
};

/// No node.
pub(crate) const NIL: u32 = u32::MAX;

/// Marks a live node in `b` (a free node uses `a`/`b` for its index's links).
pub(crate) const USED: u32 = u32::MAX - 1;

/// One block of the arena: 32 bytes plus the index's extra data `X`, so the node array stays cache-friendly.
/// For a free block `a`, `b` and `x` belong to the free index (free-list links for TLSF, children and
/// subtree maximum for the treap). A live block has `b == USED` and keeps log2 of its requested alignment
/// in `a` (preserved across compaction); its requested size lives in the `used` map.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<X> {
    pub offset: u64,
    pub size: u64,
    pub prev: u32,
    pub next: u32,
    pub a: u32,
    pub b: u32,
    pub x: X,
}

impl<X: Default> Node<X> {
    fn new(offset: u64, size: u64) -> Self {
        Node { offset, size, prev: NIL, next: NIL, a: NIL, b: NIL, x: X::default() }
    }
}

impl<X> Node<X> {
    #[inline]
    pub(crate) fn is_free(&self) -> bool {
        self.b != USED
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
    nodes: Vec<Node<I::Extra>>,
    spare: Vec<u32>,
    /// Live blocks: offset -> (node, requested bytes).
    used: OffsetMap<(u32, u64)>,
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
            used: offset_map(),
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
        self.used.clear();
        self.index.clear();
        self.nodes.push(Node::new(0, self.capacity));
        self.index.insert(&mut self.nodes, 0);
        self.allocated = 0;
        self.reserved_in_use = 0;
        self.free_bytes = self.capacity;
        self.free_count = 1;
    }

    fn new_node(&mut self, offset: u64, size: u64) -> u32 {
        let node = Node::new(offset, size);
        if let Some(i) = self.spare.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// Links `m` physically right after `n`.
    fn link_after(&mut self, n: u32, m: u32) {
        let next = self.nodes[n as usize].next;
        self.nodes[m as usize].prev = n;
        self.nodes[m as usize].next = next;
        self.nodes[n as usize].next = m;
        if next != NIL {
            self.nodes[next as usize].prev = m;
        }
    }

    /// Unlinks `m` and recycles it.
    fn unlink(&mut self, m: u32) {
        let Node { prev, next, .. } = self.nodes[m as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        self.spare.push(m);
    }

    /// Carves the live block `[start, start + size)` out of free node `n` (already removed from the index).
    /// Remainders become free nodes in the index. Returns the live node.
    fn carve(&mut self, n: u32, start: u64, size: u64, requested: u64, align_log2: u8) -> u32 {
        let Node { offset, size: len, .. } = self.nodes[n as usize];
        let end = offset + len;
        let live = if start > offset {
            // The front remainder keeps node `n` (so node 0 always starts at offset 0).
            self.nodes[n as usize].size = start - offset;
            self.index.insert(&mut self.nodes, n);
            let u = self.new_node(start, size);
            self.link_after(n, u);
            u
        } else {
            self.free_count -= 1;
            self.nodes[n as usize].size = size;
            n
        };
        if start + size < end {
            let t = self.new_node(start + size, end - start - size);
            self.link_after(live, t);
            self.index.insert(&mut self.nodes, t);
            self.free_count += 1;
        }
        let node = &mut self.nodes[live as usize];
        node.b = USED;
        node.a = align_log2 as u32;
        self.used.insert(start, (live, requested));
        self.free_bytes -= size;
        self.reserved_in_use += size;
        self.allocated += requested;
        live
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
        self.index.remove(&mut self.nodes, n);
        self.carve(n, start, rounded, size, align.trailing_zeros() as u8);
        Ok(Allocation { offset: start, size: rounded })
    }

    pub(crate) fn free(&mut self, offset: u64) -> Result<(), AllocError> {
        let Some((mut n, requested)) = self.used.remove(&offset) else {
            return Err(self.classify_bad_free(offset));
        };
        let node = &mut self.nodes[n as usize];
        node.a = NIL;
        node.b = NIL;
        self.allocated -= requested;
        let size = node.size;
        self.reserved_in_use -= size;
        self.free_bytes += size;
        self.free_count += 1;
        let next = self.nodes[n as usize].next;
        if next != NIL && self.nodes[next as usize].is_free() {
            self.index.remove(&mut self.nodes, next);
            self.nodes[n as usize].size += self.nodes[next as usize].size;
            self.unlink(next);
            self.free_count -= 1;
        }
        let prev = self.nodes[n as usize].prev;
        if prev != NIL && self.nodes[prev as usize].is_free() {
            self.index.remove(&mut self.nodes, prev);
            self.nodes[prev as usize].size += self.nodes[n as usize].size;
            self.unlink(n);
            self.free_count -= 1;
            n = prev;
        }
        self.index.insert(&mut self.nodes, n);
        Ok(())
    }

    /// Error path only, O(n): double free if `offset` lies in a free block.
    fn classify_bad_free(&self, offset: u64) -> AllocError {
        let mut n = 0u32;
        while n != NIL {
            let node = &self.nodes[n as usize];
            if offset < node.offset + node.size {
                return if node.is_free() && offset >= node.offset {
                    AllocError::DoubleFree { offset }
                } else {
                    AllocError::InvalidFree { offset }
                };
            }
            n = node.next;
        }
        AllocError::InvalidFree { offset }
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
            live_blocks: self.used.len(),
        }
    }

    fn physical(&self) -> impl Iterator<Item = &Node<I::Extra>> + '_ {
        let mut n = 0u32;
        std::iter::from_fn(move || {
            if n == NIL {
                return None;
            }
            let node = &self.nodes[n as usize];
            n = node.next;
            Some(node)
        })
    }

    pub(crate) fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        Box::new(self.physical().filter(|n| n.is_free()).map(|n| (n.offset, n.size)))
    }

    pub(crate) fn live_blocks(&self) -> Vec<LiveBlock> {
        self.physical()
            .filter(|n| !n.is_free())
            .map(|n| LiveBlock {
                offset: n.offset,
                size: n.size,
                requested: self.used.get(&n.offset).map_or(0, |u| u.1),
            })
            .collect()
    }

    pub(crate) fn compaction_layout(&self) -> CompactionLayout {
        let blocks = self
            .physical()
            .filter(|n| !n.is_free())
            .map(|n| CompactBlock {
                id: n.offset,
                offset: n.offset,
                len: n.size,
                align: (1u64 << n.a.min(63)).max(self.granule),
                pinned: false,
            })
            .collect();
        CompactionLayout { blocks, regions: vec![Region::new(0, self.capacity)] }
    }

    pub(crate) fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        let layout = self.compaction_layout();
        let aligns: OffsetMap<u8> = self.physical().filter(|n| !n.is_free()).map(|n| (n.offset, n.a as u8)).collect();
        let moved = relocate_live(&self.live_blocks(), &layout, plan)?;
        let with_align: Vec<(LiveBlock, u8)> =
            moved.into_iter().map(|(old, new)| (new, aligns.get(&old).copied().unwrap_or(0))).collect();
        self.rebuild(&with_align)
    }

    /// Resets and re-creates exactly the live blocks given (ascending, disjoint); O(n log n).
    pub(crate) fn rebuild(&mut self, live: &[(LiveBlock, u8)]) -> Result<(), AllocError> {
        let blocks: Vec<LiveBlock> = live.iter().map(|x| x.0).collect();
        check_layout(&blocks, self.capacity, self.granule)?;
        self.reset();
        // Node 0 holds the whole range; every carve leaves the remaining tail as the last node.
        let mut tail = 0u32;
        for &(b, align_log2) in live {
            self.index.remove(&mut self.nodes, tail);
            let live = self.carve(tail, b.offset, b.size, b.requested, align_log2);
            let next = self.nodes[live as usize].next;
            if next == NIL {
                break; // the range is full; the layout check guarantees nothing follows
            }
            tail = next;
        }
        Ok(())
    }

    /// Panics if an invariant of the module doc does not hold (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut expect = 0u64;
        let (mut free, mut count, mut used) = (0u64, 0usize, 0usize);
        let mut prev_free = false;
        let mut prev = NIL;
        let mut n = 0u32;
        while n != NIL {
            let node = &self.nodes[n as usize];
            assert_eq!(node.offset, expect, "gap or overlap at node {n}");
            assert_eq!(node.prev, prev);
            assert!(node.size > 0 && node.size.is_multiple_of(self.granule));
            assert!(!(prev_free && node.is_free()), "adjacent free blocks at {}", node.offset);
            if node.is_free() {
                free += node.size;
                count += 1;
            } else {
                used += 1;
                assert_eq!(self.used.get(&node.offset).map(|u| u.0), Some(n));
            }
            prev_free = node.is_free();
            expect += node.size;
            prev = n;
            n = node.next;
        }
        assert_eq!(expect, self.capacity);
        assert_eq!((free, count, used), (self.free_bytes, self.free_count, self.used.len()));
    }
}

/// Generates a public newtype over `Arena<$index>` implementing [`super::SubAllocator`].
macro_rules! arena_strategy {
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
