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
//! | [`layout`] | units (4 KiB), pages (64 KiB), classes (16 B..4 KiB), the [`Heap`] handle, the metadata map, the crate-private `HeapMem` trait over which the protocols are written | one handle of plain data read from the kernel parameter; metadata outside the data region |
//! | [`transit`] | the sharded transit counter: operations that hide free memory, and the quiet check | a null means the heap was full, not that a search raced a split |
//! | [`bitmap`] | hierarchical bitmaps of `u32` words with a summary-bit protocol | "find a set bit" in `depth` loads, exact at quiescence |
//! | [`buddy`] | lock-free buddy levels, split/merge | large blocks and pages from one pool; no lost merges |
//! | [`slab`] | page headers, slot bitmaps, reserve/claim/free, retire, current pages, and the allocator's one search loop (`acquire`) | one `fetch_add` per warp group, pages back to the buddy when empty |
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
//!   number of searches ([`slab::FINAL_SCANS`]); nothing waits for another
//!   thread, and nothing is written into the data region. Every loop is
//!   bounded except two lock-free retry loops, where a failed attempt means
//!   another thread's attempt succeeded: the buddy merge's CAS
//!   (`Hb::set_or_take_buddy`) and the claim of reserved slots
//!   (`slab::claim_bits`).
//! * **What a null means (the exact guarantee).** A slab request (1..=4096
//!   bytes) returns null only after a *final scan* of its class (the
//!   available-page bitmap, then a fresh page from the buddy, which first
//!   retires empty current pages) around which the transit counter
//!   ([`transit`]) showed no operation in flight at its end and none
//!   completed since its start. Every operation that can hide free memory
//!   from that scan is bracketed by the counter: buddy splits and merges, a
//!   page between its buddy claim and its format, a page between its
//!   retirement and its buddy free, a scavenge, an available bit cleared and
//!   re-checked, and a summary bit cleared and re-checked. So at the final
//!   scan no page of the class had an unreserved slot findable through the
//!   bitmap and the buddy had no free page. Large requests have the same
//!   guarantee for their buddy order. Two bounded exceptions: memory freed
//!   concurrently with the call (a free that ends after the scan looked at
//!   its page), and a scan repeated [`slab::FINAL_SCANS`] times because
//!   transits kept completing (heavy churn; as in Gallatin, whose retry
//!   bounds have the same consequence). A fresh heap filled exactly by one
//!   launch never sees a null (BL-26).
//! * **A null is as cheap as a success.** A transit mark is held only around
//!   an operation that hides memory (a claim attempt, a format, a
//!   retirement, a re-check), and a failed claim withdraws its mark before
//!   any check. A request that fails in an exhausted heap reads only zero
//!   top words, makes no claim and holds no mark, so concurrent failing
//!   requests do not make each other search again: each null costs one
//!   search. `DeviceHeap::stats` reports the searches per null.
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
//! # Registers: the largest block of a kernel that calls `malloc`
//!
//! `malloc` and `free` are inlined into the calling kernel, with everything
//! under them: the allocator is one frame, no call. It reads its geometry
//! from the `Heap` the caller passes (a kernel parameter: constant-bank
//! operands, no register), keeps a few 32-bit counters live across its one
//! search loop, and each step has one site. The PTX check
//! (`host/tests/ptx_check.rs`) holds `gpuheap_heap_malloc`, `free` and the
//! kernels that inline them to at most 64 registers on sm_80 and sm_90. A
//! kernel that calls `malloc` uses `malloc`'s registers plus what it keeps
//! live across the call. The largest block that launches follows CUDA's
//! occupancy arithmetic (a warp's registers allocated in units of 256, a
//! block's warps rounded up to the SM's 4 register sub-partitions, 65,536
//! registers per block on sm_80 and sm_90; `gpuheap::backend::Arch`):
//! 1,024 threads up to 64 registers, 896 at 65–72, 768 at 73–80, 640 at
//! 81–96 (computed, not measured; the README's table lists each kernel, and
//! the GPU backend refuses a launch over a kernel's limit, naming it).
//! Keep values that are cheap to recompute (indices, addresses) out of the
//! live set across the call, as `kernels::churn_kernel` does, and let the
//! kernel body inline into its entry (a body that is not inlined receives
//! the parameters through local memory). Each call site is a copy of the
//! allocator (about 2,450 SASS instructions for `malloc` on sm_90): a
//! kernel that allocates in several places does better with one call in a
//! warp-uniform loop.
//!
//! # Warp aggregation (the fast path)
//!
//! Lanes asking for the same class find each other with `match.any`; the
//! lowest is the leader, reserves slots for the whole group with one header
//! `fetch_add` and claims bitmap words with `fetch_or` (up to 32 slots per
//! RMW, a warp's worth), and hands the lanes their slots with shuffles. The
//! loop that distributes chunks is warp-uniform (its condition is a
//! ballot), so groups of different classes in one warp proceed together.
//! Large requests are groups of one (each is a separate buddy block). After
//! the loop, `bar.warp.sync` hands each slot's history from the leader's
//! claim (an `Acquire` RMW) to the lane that uses it.
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
//!
//! # Memory ordering (fences are a budget)
//!
//! Every acquire costs an L1 invalidation (`CCTL.IVALL`) and every release a
//! memory barrier (`MEMBAR.ALL.GPU`) in SASS, so each protocol names the one
//! operation that carries each edge and leaves the others `Relaxed`: the
//! slot and page edges in [`slab`], the block edges in [`buddy`], the
//! summary bits in [`bitmap`], the searches in [`transit`]. The loom models
//! run the protocols with exactly those orderings.

//! # Data races: the checker (decision)
//!
//! A plain access racing an atomic one in heap state is a bug on the GPU
//! too. The heap's shared state is only ever accessed through
//! [`crate::arch::atomic`] (there are no plain accesses to metadata; the
//! PTX check asserts it), so the races that matter are protocol races
//! between atomics, which a ThreadSanitizer build would not report (TSan
//! sees atomics as synchronised) and which needs a nightly toolchain and
//! `-Zbuild-std`. We use **loom** instead (`scripts/test`, `--cfg loom`): it
//! explores the interleavings and weak-memory outcomes of the protocol
//! cores on [`init::VecHeap`] and reports a plain/atomic race as well as
//! a broken invariant. Covered: bitmap summary bits, buddy split/merge and
//! the transit check, slab reserve/claim/free/retire with the payload's
//! hand-off, the out-of-memory path (concurrent nulls, one search each),
//! the transit brackets around a page's format and its retirement (a
//! searcher racing either must not return null), the available bit against
//! a free, the replacement of a current page against its last free, and a
//! refill whose scavenge retires nothing (the slot's refill still ends).
//! The independent-thread scheduling mode of the CPU backend
//! ([`crate::arch::emu::its`]) covers the warp-level paths loom cannot
//! (whole kernels under seeded schedules), including the scavenge.

pub mod bitmap;
pub mod buddy;
pub mod init;
#[cfg(not(any(loom, shuttle)))]
pub mod kernels;
pub mod layout;
pub mod slab;
pub mod transit;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom), not(shuttle)))]
mod tests;

pub use layout::Heap;
use layout::*;
use slab::SlotFree;

use crate::arch::atomic::Ordering;
use crate::arch::index::{lane_id, sm_id};
use crate::arch::opaque_u32;
use crate::arch::warp::{active_mask, ballot, lanemask_lt, match_any, shfl, shfl_u64, sync_warp};

/// A 32-bit mix (`lowbias32`, Chris Wellons' hash-prospector): the search
/// hints are only a spread, and 32-bit multiplies take a register each.
#[inline(always)]
#[cfg_attr(any(loom, shuttle), allow(dead_code))] // hints are 0 in the model checks
fn hash32(x: u32) -> u32 {
    let mut x = x ^ (x >> 16);
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^ (x >> 16)
}

#[inline(always)]
#[cfg_attr(any(loom, shuttle), allow(dead_code))] // used by the test kernels
fn hash(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Counts `n` null results of one failed `slab::acquire` whose error was
/// `err` (its searches and waits for a refiller, each counted `n` times):
/// `CTRL_FAILED`, `CTRL_FAILED_SEARCHES`, `CTRL_FAILED_WAITS`.
#[inline(always)]
fn count_failed<M: HeapMem>(m: &M, n: u32, err: u32) {
    m.word(MetaSection::Ctrl, CTRL_FAILED as u64).fetch_add(n as u64, Ordering::Relaxed);
    let searches = slab::failure_searches(err);
    if searches > 0 {
        m.word(MetaSection::Ctrl, CTRL_FAILED_SEARCHES as u64).fetch_add((n * searches) as u64, Ordering::Relaxed);
    }
    let waits = slab::failure_waits(err);
    if waits > 0 {
        m.word(MetaSection::Ctrl, CTRL_FAILED_WAITS as u64).fetch_add((n * waits) as u64, Ordering::Relaxed);
    }
}

#[inline(always)]
fn count_bad_free<M: HeapMem>(m: &M, word: usize) {
    #[cfg(feature = "debug-free")]
    m.word(MetaSection::Ctrl, word as u64).fetch_add(1, Ordering::Relaxed);
    #[cfg(not(feature = "debug-free"))]
    let _ = (m, word);
}

/// One step of a group's leader. For a slab class `req`: reserve slots if
/// it holds none (`slab::acquire`), then claim up to `need` of them in one
/// bitmap word. `st` is the leader's state between steps, one `u64`
/// shuffled to the group: `page << 32 | cursor << 8 | left` (`cursor`: the
/// page's bitmap word to scan first, after a claim the word claimed;
/// `left`: slots reserved and not yet claimed). Returns the new state and
/// the claimed bits (0: the heap had no slot for the group, counted as
/// failed).
/// For a large request (`req >= slab::LARGE`, a group of one): returns the
/// block's address (0 when it failed) as the state, and no bits.
#[inline(always)]
fn leader_step<M: HeapMem>(m: &M, req: u32, need: u32, mut st: u64) -> (u64, u32) {
    // Through the barrier: what the claim derives from the class is
    // computed here, not hoisted out of the warp loop (DESIGN.md §4.1).
    let req = opaque_u32(req);
    if st & 0xFF == 0 {
        match slab::acquire(m, req, sm_id() % CURRENT_SLOTS, need) {
            Ok(g) if req >= slab::LARGE => {
                // The tag only names the block for `free` and the host's
                // live-block list; its history travels with its buddy bit.
                buddy::tag(m, g.page()).store(req - slab::LARGE + 1, Ordering::Relaxed);
                return (m.base() + ((g.page() as u64) << UNIT_SHIFT), 0);
            }
            Ok(g) => st = (g.page() as u64) << 32 | (((slab::warp_hint() >> 8) & 0x7F) as u64) << 8 | g.count() as u64,
            Err(err) => {
                count_failed(m, need, err);
                return (0, 0);
            }
        }
    }
    let page = (st >> 32) as u32;
    let left = (st & 0xFF) as u32;
    let mut cursor = ((st >> 8) & 0x7F) as u32;
    let (w, bits) = slab::claim_bits(m, page, req, &mut cursor, left.min(need));
    ((page as u64) << 32 | (w as u64) << 8 | (left - bits.count_ones()) as u64, bits)
}

/// `malloc` over any [`HeapMem`] (the device handle, or the model checkers'
/// `VecHeap`). See [`malloc`].
///
/// One warp loop over groups: lanes of one class are a group (its leader
/// reserves and claims for all of them), each large request a group of one
/// (its lane is the leader and takes its block). Everything it calls is
/// inlined and has one call site (DESIGN.md §4.1), so the whole allocator
/// is one frame whose geometry operands come from the handle.
#[inline(always)]
pub(crate) fn malloc_in<M: HeapMem>(m: &M, size: u64) -> u64 {
    let mask = active_mask();
    let lane = lane_id();
    // The request: a class (0..CLASSES), `LARGE + order`, or `NONE` for 0.
    const NONE: u32 = u32::MAX;
    let req = match class_of(size) {
        Some(c) => c,
        None if size == 0 => NONE,
        None => slab::LARGE + order_of(size),
    };
    // Group key: the class for slab requests; unique per lane otherwise.
    let key = if req < CLASSES { req } else { 0x100 | lane };
    // SAFETY: `mask` holds the lanes that executed the `active_mask` above
    // together, this one among them; nothing between branches or returns.
    let peers = unsafe { match_any(mask, key) };
    let leader = peers.trailing_zeros();
    let n = peers.count_ones();

    let mut result = 0u64;
    let mut pending = req != NONE;
    let mut assigned = 0u32;
    // The group leader's state (see `leader_step`), the same on every lane of
    // the group after each step's shuffle.
    let mut st = 0u64;
    // SAFETY: the loop condition is a ballot over `mask`, the same on every
    // lane of it, so every lane of `mask` evaluates it on each iteration
    // (the code before it does not return; the leader's work has no
    // collective).
    while unsafe { ballot(mask, pending) } != 0 {
        let mut cbits = 0u32;
        if pending && lane == leader {
            (st, cbits) = leader_step(m, req, n - assigned, st);
        }
        // SAFETY: (both) unconditional inside the warp-uniform loop (see its
        // condition); the leader-only block above has no collective.
        st = unsafe { shfl_u64(mask, st, leader) };
        // SAFETY: as above.
        let cbits = unsafe { shfl(mask, cbits, leader) };
        if pending {
            if req >= slab::LARGE {
                // A group of one: the state is the block's address.
                result = st;
                pending = false;
            } else if cbits == 0 {
                pending = false;
            } else {
                let k = cbits.count_ones();
                let rank = (peers & lanemask_lt()).count_ones();
                if rank >= assigned && rank < assigned + k {
                    // This lane's slot: the `rank - assigned`-th set bit.
                    let mut b = cbits;
                    let mut j = rank - assigned;
                    while j > 0 {
                        b &= b - 1;
                        // Through the barrier: not unrolled (DESIGN.md §4.1).
                        j = opaque_u32(j - 1);
                    }
                    // The claimed word is the state's cursor. The slot size
                    // is derived from the class after an optimisation
                    // barrier, where it is used.
                    let slot = ((st >> 8) & 0x7F) * WORD_BITS as u64 + b.trailing_zeros() as u64;
                    let size_shift = MIN_CLASS_SHIFT + opaque_u32(req);
                    result = m.base() + ((st >> 32) << PAGE_SHIFT) + (slot << size_shift);
                }
                assigned += k;
                if assigned >= n {
                    pending = false;
                }
            }
        }
    }
    // The hand-off: the leader's claim acquired each slot's history (its
    // bitmap `fetch_or` reads from the release sequence of the previous
    // owner's free); the warp barrier orders it before every lane's use of
    // its slot (PTX: `bar.warp.sync` orders the memory accesses of the
    // lanes it joins). Every lane of `mask` leaves the loop together.
    // SAFETY: reached by every lane of `mask` on warp-uniform control flow
    // (after the ballot loop), with no return in between.
    unsafe { sync_warp(mask) };
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
    let page = (off >> PAGE_SHIFT) as u32;
    // `Relaxed`: the pointer's `malloc` happened before this free (the
    // caller's contract), and with it the page's format.
    let h = m.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
    if slab::hdr_class(h).is_some() {
        match slab::free_slot(m, page, h, (off & (PAGE - 1)) as u32) {
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
    let unit = (off >> UNIT_SHIFT) as u32;
    // `Relaxed`: the swap decides who frees (once); the block's history is
    // released by the buddy free's own RMW.
    let t = buddy::tag(m, unit).swap(0, Ordering::Relaxed);
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
