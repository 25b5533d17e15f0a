//! Two-level segregated fit (TLSF), O(1) allocation and free.
//!
//! ```text
//!  fl_bitmap: bit fl set  <=>  sl_bitmap[fl] != 0
//!  sl_bitmap[fl]: bit sl set  <=>  heads[fl][sl] != NIL
//!
//!  fl 0 : [g=0][g=1] ... [g=31]            (exact sizes below 32 granules)
//!  fl k : [2^(k+4) .. +2^(k-1)) ... 32 sub-classes per power of two
//!            |
//!            v  doubly linked free list through the block-list nodes (a = prev, b = next)
//! ```
//!
//! Blocks live in the shared block list (`block_list.rs`): every block is an out-of-band node linked to its
//! physical neighbours, and an allocation's handle names its node, so `free` merges with free neighbours in
//! O(1) through those links, and a split or merge that keeps a free block's class leaves its list untouched.
//! Sizes are counted in granules (default 256 B) and classed with 5 second-level bits, so a class spans at
//! most 1/32 of its size.
//!
//! # Invariants
//! - A free block of `g` granules is in the list `heads[size_class(g)]`; the bitmaps mirror list emptiness.
//! - No two physically adjacent blocks are free.
//!
//! # Time complexity
//! - `alloc`: O(1). First the head blocks of the request's *own* class are tried (at most
//!   `OWN_CLASS_PROBES`): a freed hole of exactly the request's size is there, and plain TLSF, which rounds
//!   the request up to the next class boundary before searching, would never look at it (tlsf-bsd#4; BL-25:
//!   a 255,983 B request freed and asked for again went to the top of the heap each time, and three live
//!   blocks spanned four). Then the request is rounded up to a class boundary (good fit), and two
//!   `trailing_zeros` find the first non-empty class that is guaranteed to fit. Only if that fails is the
//!   rest of the own class list scanned for an exact fit, O(k) in that list's length (this keeps "the whole
//!   free block is allocatable").
//! - `free`: O(1) (the handle's node, neighbour merge through the physical links, list insert); `free_at`
//!   adds one lookup in the block list's offset index.
//! - `stats`: O(k) for `largest_free` (scan of the highest non-empty class).
//!
//! Alignment above the granule is served by searching for `size + align - granule` and leaving the front
//! padding as a free block.

use super::block_list::{
    block_list_strategy, first_class_at_or_above, is_class_lower_bound, round_to_class, size_class, BlockList,
    FreeIndex, Node, Placement, FL_COUNT, NIL, SL_COUNT,
};
use super::fit_front;

/// Blocks of the request's own class looked at before the good-fit search (step 1 of `find`).
const OWN_CLASS_PROBES: usize = 2;

/// The first of at most `limit` list nodes from `n` that holds `size` bytes at an `align`-aligned start, and
/// the node where the walk stopped (`NIL` at the end of the list).
#[inline]
fn scan_fit(nodes: &[Node], mut n: u32, size: u64, align: u64, limit: usize) -> (Option<u32>, u32) {
    let mut left = limit;
    while n != NIL && left > 0 {
        let node = &nodes[n as usize];
        if fit_front(node.offset, node.size, size, align).is_some() {
            return (Some(n), n);
        }
        n = node.b;
        left -= 1;
    }
    (None, n)
}

/// The TLSF free index: bitmaps and segregated free lists.
#[derive(Debug)]
pub(crate) struct TlsfIndex {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: Vec<[u32; SL_COUNT]>,
    granule_log2: u32,
}

impl TlsfIndex {
    pub(crate) fn new(granule: u64) -> Self {
        TlsfIndex {
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: vec![[NIL; SL_COUNT]; FL_COUNT],
            granule_log2: granule.trailing_zeros(),
        }
    }

    /// Unlinks `n`, which is filed under the class of `size` bytes.
    #[inline(always)]
    fn unlink(&mut self, nodes: &mut [Node], n: u32, size: u64) {
        let Node { a: prev, b: next, .. } = nodes[n as usize];
        if prev != NIL {
            nodes[prev as usize].b = next;
        } else {
            let (fl, sl) = size_class(size >> self.granule_log2);
            self.heads[fl][sl] = next;
            if next == NIL {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if next != NIL {
            nodes[next as usize].a = prev;
        }
    }

    /// First non-empty class at or above `(fl, sl)`.
    #[inline]
    fn first_at_or_above(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        first_class_at_or_above(self.fl_bitmap, &self.sl_bitmap, fl, sl)
    }
}

impl FreeIndex for TlsfIndex {
    #[inline(always)]
    fn insert(&mut self, nodes: &mut [Node], n: u32) {
        let (fl, sl) = size_class(nodes[n as usize].size >> self.granule_log2);
        let head = self.heads[fl][sl];
        nodes[n as usize].a = NIL;
        nodes[n as usize].b = head;
        if head != NIL {
            nodes[head as usize].a = n;
        }
        self.heads[fl][sl] = n;
        self.sl_bitmap[fl] |= 1 << sl;
        self.fl_bitmap |= 1 << fl;
    }

    #[inline]
    fn remove(&mut self, nodes: &mut [Node], n: u32) {
        let size = nodes[n as usize].size;
        self.unlink(nodes, n, size);
    }

    #[inline(always)]
    fn update(&mut self, nodes: &mut [Node], n: u32, _old_offset: u64, old_size: u64) {
        let new_size = nodes[n as usize].size;
        // Lists are unordered: only a change of class moves the node.
        if size_class(old_size >> self.granule_log2) != size_class(new_size >> self.granule_log2) {
            self.unlink(nodes, n, old_size);
            self.insert(nodes, n);
        }
    }

    #[inline]
    fn find(&mut self, nodes: &[Node], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        // 1. The request's own class first (tlsf-bsd#4, BL-25): a hole of exactly the request's size sits
        //    there, below the rounded-up class, and is the best fit the lists can offer. Only the first
        //    `OWN_CLASS_PROBES` blocks are looked at (a freed hole goes to the head of its list), so this
        //    stays O(1).
        let g = (size >> self.granule_log2).max(1);
        let own = size_class(g);
        let start = if self.sl_bitmap[own.0] & (1 << own.1) != 0 { self.heads[own.0][own.1] } else { NIL };
        let (hit, rest) = scan_fit(nodes, start, size, align, OWN_CLASS_PROBES);
        if hit.is_some() {
            return hit.map(|n| (n, Placement::Front));
        }
        // 2. Good fit: the first non-empty class at or above the request rounded up to a class boundary;
        //    any of its blocks fits. Without alignment padding that class follows from the own class: the
        //    same class when `g` is its lower bound, else the next one (`sl == SL_COUNT` carries into the
        //    next first level in `first_class_at_or_above`).
        let good = if align <= granule {
            Some(if is_class_lower_bound(g) { own } else { (own.0, own.1 + 1) })
        } else {
            let need = size.checked_add(align - granule)?;
            round_to_class(need >> self.granule_log2).map(size_class)
        };
        if let Some((fl, sl)) = good.and_then(|(fl, sl)| self.first_at_or_above(fl, sl)) {
            return Some((self.heads[fl][sl], Placement::Front));
        }
        // 3. Slow path: the rest of the request's own class list, for an exact fit ("the whole free block is
        //    allocatable").
        scan_fit(nodes, rest, size, align, usize::MAX).0.map(|n| (n, Placement::Front))
    }

    fn largest(&self, nodes: &[Node]) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut n = self.heads[fl][sl];
        let mut best = 0;
        while n != NIL {
            best = best.max(nodes[n as usize].size);
            n = nodes[n as usize].b;
        }
        best
    }

    fn clear(&mut self) {
        self.fl_bitmap = 0;
        self.sl_bitmap = [0; FL_COUNT];
        for h in &mut self.heads {
            *h = [NIL; SL_COUNT];
        }
    }
}

/// TLSF sub-allocator over `[0, capacity)`. See the module docs for invariants and complexity.
#[derive(Debug)]
pub struct Tlsf(pub(crate) BlockList<TlsfIndex>);

block_list_strategy!(Tlsf, "tlsf", |_, granule| TlsfIndex::new(granule));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{AllocError, SubAllocator};

    #[test]
    fn whole_capacity_is_allocatable_even_off_class_boundary() {
        // 1000 granules is not a class boundary: the good-fit search fails, the exact-class scan succeeds.
        let mut t = Tlsf::with_granule(1000 * 256, 256).unwrap();
        let a = t.alloc(1000 * 256, 1).unwrap();
        assert_eq!((a.offset, a.size), (0, 256_000));
        t.0.check_invariants();
        t.free(a).unwrap();
        t.0.check_invariants();
    }

    #[test]
    fn aligned_requests_leave_front_padding_free() {
        let mut t = Tlsf::with_granule(1 << 20, 256).unwrap();
        let a = t.alloc(256, 1).unwrap();
        let b = t.alloc(1000, 4096).unwrap();
        assert_eq!((a.offset, b.offset % 4096), (0, 0));
        t.0.check_invariants();
        assert_eq!(t.free_at(a.offset + 256), Err(AllocError::DoubleFree { offset: 256 }));
        assert_eq!(t.free_at(b.offset + 256), Err(AllocError::InvalidFree { offset: b.offset + 256 }));
        t.free(b).unwrap();
        t.free(a).unwrap();
        assert_eq!(t.free(a), Err(AllocError::DoubleFree { offset: 0 }));
        assert_eq!(t.free_at(0), Err(AllocError::DoubleFree { offset: 0 }));
        assert_eq!(t.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
    }

    #[test]
    fn sizes_up_to_2_pow_48() {
        let mut t = Tlsf::new(1 << 48).unwrap();
        let a = t.alloc((1 << 47) + 1, 1 << 40).unwrap();
        assert_eq!(a.offset % (1 << 40), 0);
        assert!(matches!(t.alloc(1 << 47, 1), Err(AllocError::OutOfMemory { .. })));
        t.0.check_invariants();
    }
}
