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
//! # Bounded failure without spurious out-of-memory: the transit counter
//!
//! Splits and merges *hide* free memory for a moment (a block claimed at
//! level `j` is free again only once its halves are set). A search that runs
//! during such a window could see every level empty and return null while
//! memory is free (BL-10(a): 17 threads, 16 blocks, one top block being
//! split). So every hiding operation is bracketed by the control word
//! `CTRL_TRANSIT`: `+1` before hiding (low half: in flight), `+2^32 - 1`
//! after republishing (high half: completions). A search that found nothing
//! is trusted only if the counter showed nothing in flight at its end and no
//! completion since its start; otherwise it backs off and searches again, at
//! most [`ALLOC_ATTEMPTS`] times.
//!
//! Ordering argument: the hiding claim is an `AcqRel` RMW after the `+1` in
//! program order, so a searcher whose `Acquire` load saw the claimed word
//! (or a later RMW of it) also sees the `+1` or a later value in its final
//! `Acquire` load of the counter. A completion's `AcqRel` `+2^32-1` comes after
//! the halves are published, so a searcher that starts after it (reads the
//! incremented high half) sees the halves.
//!
//! A genuine failure costs one descent per level (a top-word load each:
//! `max_order + 1` loads), so an exhausted heap answers null about as fast
//! as it answers a success (BL-11), and never spins: every loop is bounded.

use super::bitmap::Hb;
use super::layout::{level_bits, HeapMem, MetaSection, MetaSection32, CTRL_LEVELS, CTRL_TRANSIT, MAX_ORDER_LIMIT};
use crate::arch::atomic::Ordering;
use crate::arch::time::backoff;

/// Searches of an allocation that keep finding nothing while other threads
/// split or merge (each one follows a completed or in-flight transit).
pub const ALLOC_ATTEMPTS: u32 = 256;

const TRANSIT_BEGIN: u64 = 1;
const TRANSIT_END: u64 = (1 << 32) - 1;

/// The hierarchical bitmap of buddy level `k`.
#[inline(always)]
pub(crate) fn level<M: HeapMem>(m: &M, k: u32) -> Hb {
    let g = m.geom();
    let off = m.word(MetaSection::Ctrl, (CTRL_LEVELS as u32 + k) as u64).load(Ordering::Relaxed);
    Hb { section: MetaSection::Buddy, off, n: level_bits(g.units, k) }
}

/// Marks the start of an operation that hides free memory from searchers
/// (see the module docs); its program-order-next RMW does the hiding.
#[inline(always)]
pub(crate) fn transit_begin<M: HeapMem>(m: &M) {
    m.word(MetaSection::Ctrl, CTRL_TRANSIT as u64).fetch_add(TRANSIT_BEGIN, Ordering::Relaxed);
}

/// Marks the end of a hiding operation whose memory is published again.
#[inline(always)]
pub(crate) fn transit_end<M: HeapMem>(m: &M) {
    m.word(MetaSection::Ctrl, CTRL_TRANSIT as u64).fetch_add(TRANSIT_END, Ordering::AcqRel);
}

/// Withdraws a [`transit_begin`] whose operation hid nothing.
#[inline(always)]
pub(crate) fn transit_cancel<M: HeapMem>(m: &M) {
    m.word(MetaSection::Ctrl, CTRL_TRANSIT as u64).fetch_sub(TRANSIT_BEGIN, Ordering::Relaxed);
}

/// The transit counter's value (`Acquire`): a search that found nothing is
/// trusted only if [`transit_quiet`] holds between the value read before it
/// and the value read after it.
#[inline(always)]
pub(crate) fn transit_now<M: HeapMem>(m: &M) -> u64 {
    m.word(MetaSection::Ctrl, CTRL_TRANSIT as u64).load(Ordering::Acquire)
}

/// `true` when, between counter values `t0` (read before a search) and `t1`
/// (read after it), no hiding operation completed and none other than the
/// caller's own `own` ones was in flight at the end.
#[inline(always)]
pub(crate) fn transit_quiet(t0: u64, t1: u64, own: u32) -> bool {
    t1 as u32 == own && t1 >> 32 == t0 >> 32
}

/// Allocates a block of `UNIT << k` bytes; returns its first unit, or `None`
/// when no block of that order can be made (after the transit check).
/// `hint` spreads concurrent callers over the leaf words.
pub(crate) fn alloc<M: HeapMem>(m: &M, k: u32, hint: u64) -> Option<u64> {
    alloc_in_transit(m, k, hint, 0)
}

/// [`alloc`] for a caller that holds `own` transit marks of its own (a slab
/// page taken for formatting is hidden until its class publishes it), which
/// the final check must not wait for.
pub(crate) fn alloc_in_transit<M: HeapMem>(m: &M, k: u32, hint: u64, own: u32) -> Option<u64> {
    let max = m.geom().max_order as u32;
    if k > max || k > MAX_ORDER_LIMIT {
        return None;
    }
    let mut t0 = transit_now(m);
    let hint = hint & 63;
    let mut attempt = 0;
    while attempt < ALLOC_ATTEMPTS {
        // Level `k` first (no bracket: a claim there hides nothing), then
        // the lowest non-empty level above it, split down: one claim site.
        // `max_order`, the transit counter's address and each level's
        // geometry are re-read where used, not kept live across the loops
        // (fewer registers, DESIGN.md §4.1).
        let mut j = k;
        while j <= m.geom().max_order as u32 {
            let lv = level(m, j);
            if j == k || !lv.is_empty(m) {
                if j > k {
                    transit_begin(m);
                }
                if let Some(b) = lv.claim(m, hint) {
                    // Split: keep the leftmost order-k piece, free the right halves.
                    let mut b = b;
                    let mut i = j;
                    while i > k {
                        i -= 1;
                        b <<= 1;
                        level(m, i).set(m, b | 1);
                    }
                    if j > k {
                        transit_end(m);
                    }
                    return Some(b << k);
                }
                if j > k {
                    // Nothing hidden: undo the in-flight mark only.
                    transit_cancel(m);
                }
            }
            j += 1;
        }
        let t1 = transit_now(m);
        if transit_quiet(t0, t1, own) {
            return None;
        }
        t0 = t1;
        backoff(attempt.min(6));
        attempt += 1;
    }
    None
}

/// Frees the block of order `k` starting at `unit`, merging with free
/// buddies as far up as they go.
///
/// # Contract
/// The block was returned by [`alloc`] with the same `k` and is not freed
/// twice (the callers check this with the tags or page headers).
pub(crate) fn free<M: HeapMem>(m: &M, unit: u64, k: u32) {
    let max = m.geom().max_order as u32;
    let transit = m.word(MetaSection::Ctrl, CTRL_TRANSIT as u64);
    transit.fetch_add(TRANSIT_BEGIN, Ordering::Relaxed);
    let mut b = unit >> k;
    let mut i = k;
    loop {
        let lv = level(m, i);
        if i == max {
            lv.set(m, b);
            break;
        }
        if lv.set_or_take_buddy(m, b) {
            b >>= 1;
            i += 1;
        } else {
            break;
        }
    }
    transit.fetch_add(TRANSIT_END, Ordering::AcqRel);
}

/// The large-block tag of `unit` (`order + 1` while a large block starting
/// there is live, else 0).
#[inline(always)]
pub(crate) fn tag<M: HeapMem>(m: &M, unit: u64) -> &crate::arch::atomic::AtomicU32 {
    m.word32(MetaSection32::Tags, unit)
}

/// Host-side: the free blocks as `(first unit, order)`, in address order
/// (a relaxed snapshot; exact when no kernel runs).
#[cfg(not(target_arch = "nvptx64"))]
#[cfg_attr(not(test), allow(dead_code))] // used by the tests
pub(crate) fn free_blocks<M: HeapMem>(m: &M) -> std::vec::Vec<(u64, u32)> {
    let mut v = std::vec::Vec::new();
    for k in 0..=m.geom().max_order as u32 {
        level(m, k).for_each_set(m, |b| v.push((b << k, k)));
    }
    v.sort_unstable();
    v
}
