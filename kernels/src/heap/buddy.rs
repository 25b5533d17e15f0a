//! The lock-free buddy allocator: large blocks (> 4 KiB) and slab pages.
//!
//! # Structure
//!
//! Level `k` (order `k`, blocks of `UNIT << k` bytes) is a hierarchical bitmap
//! ([`super::bitmap`]) with one bit per block position: set = the block is
//! free *as a whole at this level*. A free block is set at exactly one level;
//! allocated blocks and the pieces of split blocks are not set anywhere.
//! Levels `0..=max_order`; block `b` of level `k` has buddy `b ^ 1` and parent
//! `b >> 1`. Blocks that stick out of a non-power-of-two data region are never set.
//! This is the state a compaction pass needs to rebuild: free runs are bits,
//! live large blocks are the non-zero [`super::layout::MetaSection32::Tags`].
//!
//! # Allocation (order `k`)
//!
//! Claim a set bit at level `k` (`Hb::claim`: find, then `fetch_and`). If
//! level `k` is empty, claim at the lowest non-empty level `j > k` and split:
//! set the right halves at levels `j-1 .. k` and keep the leftmost order-`k`
//! block. (Gelado & Garland's TBuddy and Gallatin's vEB trees split the same
//! way; ours are bitmaps so that the state is one bit per block.)
//!
//! # Free (order `k`) and merging
//!
//! `Hb::set_or_take_buddy`: one CAS on the word that holds both buddies
//! either takes the free buddy (then continue one level up with the parent)
//! or publishes our bit. Because both decisions are made by CAS on the same
//! word, two buddies freed at the same time cannot both publish: the second
//! CAS sees the first bit and merges. There are no lost merges, so memory freed
//! as 64 B slots is reusable as one 1 GiB block once everything is free.
//!
//! # Bounded failure without spurious out-of-memory
//!
//! A split hides the claimed block until its halves are set, a merge hides
//! the buddy until the parent is set: both are bracketed by the transit
//! counter ([`super::transit`]), whose module docs give the argument. A
//! search (`take`) is one pass over the levels `k..=max_order`; the caller
//! (`slab::acquire`, the allocator's one search loop) trusts a pass that
//! found nothing only if the counter was quiet around it, else searches
//! again (at most `slab::FINAL_SCANS` passes).
//! A claim attempt holds a mark only when a success would hide memory (a
//! split, or a page for a slab class, hidden until formatted) and cancels
//! it when the claim fails, so an exhausted heap, where every top word is
//! zero, answers null after one pass with no mark held: about as fast as a
//! success (BL-11), and it never spins: every loop is bounded.
//!
//! # Memory ordering
//!
//! The block's history travels with its bit: `free`'s `set_or_take_buddy`
//! CAS (`AcqRel`) and the split's `Hb::set` (`Release`) publish it, the
//! claim's `fetch_and` (`Acquire`) takes it. Everything else here is
//! `Relaxed` (the transit counter carries its own edges).

use super::bitmap::Hb;
use super::layout::{level_offset_of, HeapMem, MetaSection32};
use super::transit;
use crate::arch::opaque_u32;

/// The hierarchical bitmap of buddy level `k` (at a closed-form offset:
/// [`level_offset_of`]).
#[inline(always)]
pub(crate) fn level<M: HeapMem>(m: &M, k: u32) -> Hb {
    Hb { section: MetaSection32::Buddy, off: level_offset_of(m.max_order(), k) as u32, n: ((m.units() - 1) >> k) + 1 }
}

/// One pass: claims a block of `UNIT << k` bytes (level `k` first, then the
/// lowest non-empty level above it, split down: one claim site) and returns
/// its first unit, or `None` when no level `k..=max_order` had a block to
/// claim. `hint` spreads concurrent callers over the leaf words.
///
/// Each claim attempt holds a transit mark: from before the claim, which
/// may hide the block (a split: until its halves are set; a page for a
/// slab class: until it is formatted), to the caller's [`transit::end`]
/// once the block is published or handed out. A failed attempt hid nothing
/// and its mark is cancelled here (ended when its summary clean-up hid a
/// bit for a moment). Levels whose top word is zero are skipped without a
/// mark: an exhausted heap makes no claim and holds no mark. The marks are
/// on transit shard `s` (the caller's, which it ends the grant's mark on).
#[inline(always)]
pub(crate) fn take<M: HeapMem>(m: &M, k: u32, hint: u32, s: u32) -> Option<u32> {
    let mut j = k;
    while j <= m.max_order() {
        // Through the barrier, so that what is derived from them is
        // computed where it is used (DESIGN.md §4.1).
        let (k, hint) = (opaque_u32(k), opaque_u32(hint));
        let lv = level(m, j);
        if !lv.is_empty(m) {
            transit::begin(m, s);
            let (got, restored) = lv.claim(m, hint);
            if let Some(b) = got {
                // Split: keep the leftmost order-k piece, free the right halves.
                let mut b = b;
                let mut i = j;
                while i > k {
                    i = opaque_u32(i - 1);
                    b <<= 1;
                    level(m, i).set(m, b | 1);
                }
                return Some(b << k);
            }
            if restored {
                transit::end(m, s);
            } else {
                transit::cancel(m, s);
            }
        }
        j = opaque_u32(j + 1);
    }
    None
}

/// Frees the block of order `k` starting at `unit`, merging with free
/// buddies as far up as they go, inside a transit mark of its own.
///
/// # Contract
/// The block was returned by [`take`] with the same `k` and is
/// not freed twice (the callers check this with the tags or page headers).
#[inline(always)]
pub(crate) fn free<M: HeapMem>(m: &M, unit: u32, k: u32) {
    let s = transit::shard();
    transit::begin(m, s);
    free_marked(m, unit, k);
    transit::end(m, s);
}

/// `free` for a caller that holds a transit mark (ended after this
/// returns): each taken buddy is hidden until the merged block is set.
#[inline(always)]
pub(crate) fn free_marked<M: HeapMem>(m: &M, unit: u32, k: u32) {
    let mut b = unit >> k;
    let mut i = k;
    // At `max_order` no buddy is ever set (the second block of that level
    // sticks out of the data region), so the step there always sets: the
    // loop ends at the top at the latest.
    while level(m, i).set_or_take_buddy(m, b) {
        b >>= 1;
        i += 1;
    }
}

/// The large-block tag of `unit` (`order + 1` while a large block starting
/// there is live, else 0).
#[inline(always)]
pub(crate) fn tag<M: HeapMem>(m: &M, unit: u32) -> &crate::arch::atomic::GlobalU32 {
    m.word32(MetaSection32::Tags, unit as u64)
}

/// Host-side: the free blocks as `(first unit, order)`, in address order
/// (a relaxed snapshot; exact when no kernel runs).
#[cfg(not(target_arch = "nvptx64"))]
#[cfg_attr(not(test), allow(dead_code))] // used by the tests
pub(crate) fn free_blocks<M: HeapMem>(m: &M) -> std::vec::Vec<(u64, u32)> {
    let mut v = std::vec::Vec::new();
    for k in 0..=m.geom().max_order as u32 {
        level(m, k).for_each_set(m, |b| v.push(((b as u64) << k, k)));
    }
    v.sort_unstable();
    v
}
