//! The device heap: `malloc` and `free` callable from any kernel.
//!
//! ```ignore
//! use gpuheap_kernels::heap::{self, Heap};
//! // in a kernel body, with `p.heap: Heap` in the parameter struct:
//! let ptr = unsafe { heap::malloc(&p.heap, 48) };   // 16-byte aligned or null
//! if !ptr.is_null() { /* use it */ unsafe { heap::free(&p.heap, ptr) } }
//! ```
//!
//! # Layers (one file each, lower layers never use higher ones)
//!
//! | file | what | why this way |
//! |---|---|---|
//! | [`layout`] | units (4 KiB), pages (64 KiB), classes (16 B..4 KiB), the [`Heap`] handle, the metadata map, the crate-private `HeapMem` trait over which the protocols are written | one handle of plain data; metadata outside the data region |
//! | [`bitmap`] | hierarchical bitmaps with a summary-bit protocol | "find a set bit" in `depth` loads, exact at quiescence |
//! | [`buddy`] | lock-free buddy levels, split/merge, the transit counter | large blocks and pages from one pool; no lost merges; no spurious null from splits in flight |
//! | [`slab`] | page headers, slot bitmaps, reserve/claim/free, retire, current pages | one `fetch_add` per warp group, pages back to the buddy when empty |
//! | this file | [`malloc`], [`free`]: size dispatch, warp aggregation | the warp is the unit of work on a GPU |
//! | [`init`] | the initial state | host-built image, same code in the model tests |
//! | [`kernels`] | thin kernels used by tests, benchmarks and the PTX budget check | |
//!
//! # Semantics
//!
//! * `malloc(0)` returns null. Sizes 1..=4096 are served by slabs (slot =
//!   next power of two ≥ 16 B), larger sizes by the buddy allocator (next
//!   power of two of 4 KiB units). Every pointer is 16-byte aligned; large
//!   blocks are 4 KiB aligned. Sizes the heap can never hold return null at
//!   once, without overflow, whatever the value (up to `u64::MAX`).
//! * `malloc` returns null when the request cannot be met, after a bounded
//!   amount of work: every loop in the allocator has a fixed bound, nothing
//!   waits for another thread, and nothing is written into the data region.
//! * **What a null means (the exact guarantee).** A slab request (1..=4096
//!   bytes) returns null only after a *final scan* of its class (the
//!   available-page bitmap, then a fresh page from the buddy, which first
//!   retires empty current pages) during which the transit counter of
//!   [`buddy`] showed no operation in flight at its end and none completed
//!   since its start. Every operation that can hide free memory from that
//!   scan is bracketed by the counter: buddy splits and merges, a page
//!   between its buddy claim and its format, a page between its retirement
//!   and its buddy free, a scavenge, and an available bit cleared and
//!   re-checked. So at the final scan no page of the class had an unreserved
//!   slot findable through the bitmap and the buddy had no free page. Large
//!   requests have the same guarantee for their buddy order. Two bounded
//!   exceptions: memory freed concurrently with the call (a free that ends
//!   after the scan looked at its page), and a scan repeated
//!   [`slab::FINAL_SCANS`] / [`buddy::ALLOC_ATTEMPTS`] times because
//!   transits kept completing (heavy churn; as in Gallatin, whose retry
//!   bounds have the same consequence). A fresh heap filled exactly by one
//!   launch never sees a null (BL-26).
//! * `free(null)` does nothing. Any thread of any block or later kernel may
//!   free any pointer from `malloc` on the same heap. `free` uses no warp
//!   collective, so it may be called divergently.
//! * Double and invalid frees are undefined behaviour in release builds, but
//!   every one that the free path can see for free (a slot bit already clear,
//!   a tag already zero, a pointer outside the data region or off a slot boundary)
//!   is ignored rather than corrupting the heap. With the cargo feature
//!   `debug-free` they are also counted in control words that
//!   `DeviceHeap::stats` reports. A double free is only detectable until the
//!   address is handed out again.
//! * `malloc` is warp-collective: the lanes of `active_mask()` call it
//!   together (the usual case: every lane of a converged warp). On a GPU the
//!   lanes may diverge before the call; in the CPU lockstep emulator they must
//!   reach it at a warp-uniform point (see `arch::emu`).
//!
//! # Warp aggregation (the fast path)
//!
//! Lanes asking for the same class find each other with `match.any`; the
//! lowest is the leader, reserves slots for the whole group with one header
//! `fetch_add` and claims bitmap words with `fetch_or` (up to 64 slots per
//! RMW), and hands each lane its slot with two 64-bit shuffles. The loop that
//! distributes chunks is warp-uniform (its condition is a ballot), so groups
//! of different classes in one warp proceed together. Large requests are
//! served per lane (each is a separate buddy block anyway).
//!
//! # Compaction and the live-block list
//!
//! Large blocks are exactly the units `u` with `tags[u] = order + 1 != 0`
//! (offset `u * 4096`, size `4096 << order`); slab pages are the pages whose
//! header has a class; everything else is a set bit in some buddy level.
//! That is the whole state: a relocation can rebuild it by zeroing the
//! metadata, running [`init`]-like decomposition over the free gaps, and
//! writing tags for the moved blocks. The host lists live blocks with
//! `DeviceHeap::live_blocks` (reads the tags back).
//!
//! Buddy blocks stay at offsets aligned to their size, so sliding them cannot
//! make the free space contiguous. Blocks meant to be compacted are therefore
//! allocated by handle in the heap's *movable region*
//! ([`crate::compact::movable`]): a span taken out of the buddy when the heap
//! is created with one (`Heap::movable_bytes`), never in a buddy level,
//! never tagged and never a slab page. Raw `malloc` blocks lie outside it and
//! never move.

//! # Data races: the checker (decision)
//!
//! A plain access racing an atomic one in heap state is a bug on the GPU
//! too. The heap's shared state is only ever accessed through
//! [`crate::arch::atomic`] (there are no plain accesses to metadata), so the
//! races that matter are protocol races between atomics, which a
//! ThreadSanitizer build would not report (TSan sees atomics as
//! synchronised) and which needs a nightly toolchain and `-Zbuild-std`.
//! We use **loom** instead (`scripts/test`, `--cfg loom`): it explores the
//! interleavings and weak-memory outcomes of the protocol cores on
//! [`layout::VecHeap`] and reports a plain/atomic race as well as a broken
//! invariant. Covered: bitmap summary bits, buddy split/merge and the
//! transit check, slab reserve/claim/free/retire, and the slab's transit
//! brackets around a page's format (`slab::fresh_page`) and its retirement
//! (`slab::retire`): a searcher racing either must not return null (each
//! model fails when its bracket is removed). The brackets of the
//! available-bit re-check and of the scavenge are exercised by the
//! independent mode only. The independent-thread
//! scheduling mode of the CPU backend ([`crate::arch::emu::its`]) covers
//! the warp-level paths loom cannot (whole kernels under seeded schedules).

pub mod bitmap;
pub mod buddy;
pub mod init;
#[cfg(not(any(loom, shuttle)))]
pub mod kernels;
pub mod layout;
pub mod slab;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom), not(shuttle)))]
mod tests;

pub use layout::Heap;
use layout::*;
use slab::SlotFree;

use crate::arch::atomic::Ordering;
use crate::arch::index::{global_warp_id, lane_id, sm_id};
use crate::arch::opaque_u32;
use crate::arch::warp::{active_mask, ballot, lanemask_lt, match_any, shfl_u64};

#[inline(always)]
fn hash(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline(always)]
fn count_failed<M: HeapMem>(m: &M, n: u32) {
    if n > 0 {
        m.word(MetaSection::Ctrl, CTRL_FAILED as u64).fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[inline(always)]
fn count_bad_free<M: HeapMem>(m: &M, word: usize) {
    #[cfg(feature = "debug-free")]
    m.word(MetaSection::Ctrl, word as u64).fetch_add(1, Ordering::Relaxed);
    #[cfg(not(feature = "debug-free"))]
    let _ = (m, word);
}

/// Allocates a large block (> 4 KiB) of order `k` for this lane alone.
#[inline(never)]
fn alloc_large<M: HeapMem>(m: &M, k: u32, hint: u64) -> u64 {
    let g = m.geom();
    let unit = match buddy::alloc(m, k, hint) {
        Some(u) => Some(u),
        None if slab::scavenge(m) => buddy::alloc(m, k, hint),
        None => None,
    };
    match unit {
        Some(u) => {
            buddy::tag(m, u).store(k + 1, Ordering::Release);
            g.base + (u << UNIT_SHIFT)
        }
        None => {
            count_failed(m, 1);
            0
        }
    }
}

/// One step of a slab group's leader: reserve slots if it holds none
/// (`slab::acquire`), then claim up to `need` of them in one bitmap word.
/// `st` is the leader's state between steps, one `u64` so that little is
/// live in the warp loop: `page << 32 | cursor << 16 | left` (`cursor`: the
/// page's bitmap word to scan first, after a claim the word claimed;
/// `left`: slots reserved and not yet claimed). Returns the new state and
/// the claimed bits (0: the group gets no more slots, counted as failed).
/// Out of line: the warp loop keeps only its own few values across it.
#[inline(never)]
fn leader_step<M: HeapMem>(m: &M, c: u32, need: u32, mut st: u64) -> (u64, u64) {
    if st & 0xFFFF == 0 {
        match slab::acquire(m, c, sm_id() % CURRENT_SLOTS, need).get() {
            Some((page, got)) => st = page << 32 | ((slab::warp_hint() >> 32) & 63) << 16 | got as u64,
            None => {
                count_failed(m, need);
                return (0, 0);
            }
        }
    }
    let page = st >> 32;
    let left = (st & 0xFFFF) as u32;
    let mut cursor = ((st >> 16) & 0xFF) as u32;
    let (w, bits) = slab::claim_bits(m, page, c, &mut cursor, left.min(need));
    if bits == 0 {
        slab::unreserve(m, page, left);
        count_failed(m, need);
        return (0, 0);
    }
    (page << 32 | (w as u64) << 16 | (left - bits.count_ones()) as u64, bits)
}

/// `malloc` over any [`HeapMem`] (the device handle, or the model checkers'
/// `VecHeap`). See [`malloc`].
#[inline(always)]
pub(crate) fn malloc_in<M: HeapMem>(m: &M, size: u64) -> u64 {
    let g = m.geom();
    let mask = active_mask();
    let lane = lane_id();
    let class = class_of(size);
    let order = order_of(size);
    let large = class.is_none() && size != 0;
    // Group key: the class for slab requests; unique per lane otherwise.
    let key = match class {
        Some(c) => c,
        None => 0x100 | lane,
    };
    // SAFETY: `mask` holds the lanes that executed the `active_mask` above
    // together, this one among them; nothing between branches or returns.
    let peers = unsafe { match_any(mask, key) };
    let leader = peers.trailing_zeros();
    let n = peers.count_ones();

    let mut result = 0u64;
    if large {
        if order as u64 > g.max_order {
            count_failed(m, 1);
        } else {
            result = alloc_large(m, order, hash(global_warp_id()).wrapping_add(lane as u64));
        }
    }

    // `CLASSES` for lanes without a slab request. The slot size is derived
    // from it where used, after an optimisation barrier: LLVM would compute
    // it once before the loop and keep it live across the leader's step.
    let c = class.unwrap_or(CLASSES);
    let mut pending = class.is_some();
    let mut assigned = 0u32;
    // The group leader's state (see `leader_step`), the same on every lane of
    // the group after each step's shuffle.
    let mut st = 0u64;
    // SAFETY: the loop condition is a ballot over `mask`, the same on every
    // lane of it, so every lane of `mask` evaluates it on each iteration
    // (the code before it does not return; `alloc_large` has no collective).
    while unsafe { ballot(mask, pending) } != 0 {
        let mut cbits = 0u64;
        if pending && lane == leader {
            (st, cbits) = leader_step(m, c, n - assigned, st);
        }
        // SAFETY: (both) unconditional inside the warp-uniform loop (see its
        // condition); the leader-only block above has no collective.
        st = unsafe { shfl_u64(mask, st, leader) };
        // SAFETY: as above.
        let cbits = unsafe { shfl_u64(mask, cbits, leader) };
        if pending {
            if cbits == 0 {
                pending = false;
            } else {
                let k = cbits.count_ones();
                let rank = (peers & lanemask_lt()).count_ones();
                if rank >= assigned && rank < assigned + k {
                    let mut b = cbits;
                    let mut j = rank - assigned;
                    while j > 0 {
                        b &= b - 1;
                        j -= 1;
                    }
                    // The claimed word is the state's cursor.
                    let word = (st >> 16) & 0xFF;
                    let size_shift = MIN_CLASS_SHIFT + opaque_u32(c);
                    result =
                        g.base + ((st >> 32) << PAGE_SHIFT) + ((word * 64 + b.trailing_zeros() as u64) << size_shift);
                }
                assigned += k;
                if assigned >= n {
                    pending = false;
                }
            }
        }
    }
    let c = opaque_u32(c);
    let size_shift = MIN_CLASS_SHIFT + c;
    if c < CLASSES && result != 0 {
        // Acquire the slot's history ourselves (see slab: memory ordering of
        // the payload): the leader's claim RMW is in the release sequence of
        // the previous owner's free.
        let off = result - g.base;
        let slot_idx = (off & (PAGE - 1)) >> size_shift;
        m.word(MetaSection::Bits, (off >> PAGE_SHIFT) * WORDS_PER_PAGE + slot_idx / 64).load(Ordering::Acquire);
    }
    // A leftover reservation (cannot happen: a group takes what it reserves)
    // is returned so the page can still empty.
    if lane == leader && st & 0xFFFF != 0 {
        slab::unreserve(m, st >> 32, (st & 0xFFFF) as u32);
    }
    result
}

/// `free` over any [`HeapMem`]. See [`free`].
#[inline(always)]
pub(crate) fn free_in<M: HeapMem>(m: &M, ptr: u64) {
    if ptr == 0 {
        return;
    }
    let g = m.geom();
    let off = ptr.wrapping_sub(g.base);
    if ptr < g.base || off >= g.capacity {
        count_bad_free(m, CTRL_INVALID_FREES);
        return;
    }
    let page = off >> PAGE_SHIFT;
    let h = m.word(MetaSection::Hdr, page).load(Ordering::Acquire);
    if slab::hdr_class(h).is_some() {
        match slab::free_slot(m, page, h, off & (PAGE - 1)) {
            SlotFree::Freed => {}
            SlotFree::Double => count_bad_free(m, CTRL_DOUBLE_FREES),
            SlotFree::Invalid => count_bad_free(m, CTRL_INVALID_FREES),
        }
        return;
    }
    if off & (UNIT - 1) != 0 {
        count_bad_free(m, CTRL_INVALID_FREES);
        return;
    }
    let unit = off >> UNIT_SHIFT;
    let t = buddy::tag(m, unit).swap(0, Ordering::AcqRel);
    if t == 0 || t as u64 > g.max_order + 1 {
        // Never allocated here, or freed already (we cannot tell which once
        // the tag is gone; a tag of 0 on a unit that starts a free buddy
        // block is the common double-free case).
        count_bad_free(m, if t == 0 { CTRL_DOUBLE_FREES } else { CTRL_INVALID_FREES });
        return;
    }
    buddy::free(m, unit, t - 1);
}

/// Allocates `size` bytes from `heap`; returns a 16-byte aligned pointer, or
/// null when `size` is 0 or the heap cannot provide it (see the module docs).
///
/// Warp-collective over `active_mask()`: call it from every lane that is
/// active at this point (lanes that need nothing pass 0).
///
/// # Safety
/// `heap` is the handle of a live, initialised heap on this device (from
/// `DeviceHeap::handle`, used while the `DeviceHeap` lives).
///
/// Any `Heap` value can be built in safe code, so no safe path leads from a
/// `Heap` to the allocator: `malloc` needs `unsafe`, and the protocol layer
/// under it (`malloc_in`, `free_in`, the slab, buddy and bitmap operations,
/// which do no bounds checks on the device) is private to this crate.
///
/// ```compile_fail,E0133
/// use gpuheap_kernels::heap::{malloc, Heap};
/// // error[E0133]: call to unsafe function `malloc` requires unsafe block
/// let p = malloc(&Heap::default(), 16);
/// ```
///
/// ```compile_fail,E0603
/// use gpuheap_kernels::heap::{malloc_in, Heap};
/// // error[E0603]: function `malloc_in` is private
/// let p = malloc_in(&Heap::default(), 16);
/// ```
#[inline(always)]
pub unsafe fn malloc(heap: &Heap, size: u64) -> *mut u8 {
    // SAFETY: forwarded contract (a live, initialised heap).
    let m = unsafe { DevHeap::new(heap) };
    malloc_in(&m, size) as *mut u8
}

/// Frees `ptr` (from [`malloc`] on the same heap, by any thread); null is
/// ignored. Not collective.
///
/// # Safety
/// As for [`malloc`]; `ptr` is null or a live allocation of this heap that
/// nobody uses after this call (double and foreign frees are detected on a
/// best-effort basis only, see the module docs).
#[inline(always)]
pub unsafe fn free(heap: &Heap, ptr: *mut u8) {
    // SAFETY: forwarded contract (a live, initialised heap).
    let m = unsafe { DevHeap::new(heap) };
    free_in(&m, ptr as u64)
}
