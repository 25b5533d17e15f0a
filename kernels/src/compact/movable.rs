//! The movable region of the device heap: blocks named by handles, allocated
//! by kernels (and the host) beside raw `malloc`, and defragmented in place
//! by the compaction kernels.
//!
//! ```ignore
//! use gpuheap_kernels::compact::movable;
//! // in a kernel body, with `p.heap: Heap` (from `DeviceHeap::with_movable`):
//! let h = unsafe { movable::handle_alloc(&p.heap, 48) };       // 0 on failure
//! let ptr = unsafe { movable::resolve(&p.heap, h) };     // null if not live
//! // ... use ptr in this kernel only ...
//! unsafe { movable::handle_free(&p.heap, h) };                  // bytes reclaimed by the next compaction
//! ```
//!
//! # Design: one span, a bump cursor, a handle table
//!
//! The buddy allocator keeps every block at an offset aligned to its
//! power-of-two size, so sliding buddy blocks cannot make free space
//! contiguous (a block moved off its alignment is no longer a buddy block).
//! Movable blocks therefore live in their own span of the heap's data region, taken
//! out of the buddy when the heap is created (`DeviceHeap::with_movable`):
//! its units are never in a buddy level, never tagged and never in a slab
//! page, so raw `malloc` never returns them and raw `free` ignores them.
//! Inside the span:
//!
//! * **Allocation is a bump**: [`handle_alloc`] rounds the size up to 16 bytes and
//!   takes it from a cursor; lanes of a warp asking for the same size share
//!   one `atom.add` (the aggregation of `crate::bump`), and the lanes that got
//!   bytes share one more `atom.add` to take handle-table indices from an
//!   index pool. Bounded time: no loop, no wait; 0 when the span or the pool
//!   is exhausted (a failed request is counted; a request larger than the
//!   rest of the span does not advance the cursor, so smaller ones still
//!   fit; bytes a warp took for a lane that then found no index are
//!   reclaimed by the next compaction).
//! * **A handle is `generation << 32 | index`**. Entry `index` of the handle
//!   table ([`HandleEntry`]) holds the block's offset in the span, its
//!   requested size and a state word (flags in the low 32 bits, generation in
//!   the high 32). Each reuse of an entry increments its generation's reuse
//!   counter (never 0; the bits above it are the region's tag, written by
//!   the host when it creates the table, so a handle of another region does
//!   not resolve here: `super::handle::next_generation`), so the handle 0 is never valid and a stale handle (freed, or freed
//!   and its entry reused) never resolves. [`resolve`] reads the state word
//!   with acquire ordering, so a handle published by the allocating thread
//!   (with release ordering, or across launches) resolves to the whole entry.
//! * **Freeing marks the entry dead** ([`handle_free`], one CAS on the state word:
//!   a double free or a stale handle fails instead of corrupting anything).
//!   Neither the bytes nor the index are reused before the next compaction.
//! * **Compaction** (host: `HandleRegion::compact` of `gpuheap::device_heap::MovableRegion`) lists the live
//!   entries, slides them with the plan and move kernels of [`super`] (which
//!   rewrite the table's offsets in the same pass), then sets the cursor to
//!   the end of the last live block and refills the index pool with every
//!   entry that is not live. Afterwards the free space of the span is one
//!   contiguous range after the last block, plus, in front of each pinned
//!   block, the free tail of the segment it ends (pinned islands). Those
//!   tails are not handed out by the bump cursor; they are merged into the
//!   main range by the first compaction after the pin is released.
//!
//! A free list would reuse bytes without a compaction, but then the free
//! space would only become contiguous by compaction anyway and every
//! allocation would pay for a search; the bump keeps allocation at one or two
//! atomics per warp and makes compaction the single place that reclaims.
//!
//! # What moves, what never moves, what a kernel must not do
//!
//! * **Moves:** live, unpinned handle blocks, during a compaction only,
//!   towards the start of their segment, keeping their order.
//! * **Never moves:** pinned handle blocks (pinning is a host operation; pins
//!   nest), and every raw `malloc` block: raw blocks live outside the span,
//!   so they are pinned by construction.
//! * **A kernel must not** run during a compaction (the host API takes the
//!   heap mutably and launches are synchronous), keep a pointer from
//!   [`resolve`] across one (resolve in the kernel that uses the pointer), or
//!   use a pointer beyond the block's size rounded up to 16 bytes. Work
//!   queued before a compaction that resolves its handle when it runs sees
//!   the block at its new place (BL-16).
//!
//! # PTX budget
//!
//! `host/tests/ptx_check.rs` (ptxas 12.x, sm_80 and sm_90): `gpuheap_heap_handle_alloc`
//! 30 registers, `gpuheap_heap_handle_free` 16, `gpuheap_heap_handle_touch` 32; no
//! spills, no stack frame, no local memory.
//!
//! # Memory of the movable region's state
//!
//! One device buffer at `Heap::movable_ctrl`: [`MOVABLE_CTRL_BYTES`] of control
//! words ([`CTRL_CURSOR`], [`CTRL_POOL_NEXT`], [`CTRL_POOL_LEN`],
//! [`CTRL_FAILED`]), then `max_handles` [`HandleEntry`]s (the table), then
//! `max_handles` `u32` pool indices ([`buffer_bytes`]).

use super::handle::{
    make_handle, next_generation, split_handle, DeviceHandleTable, HandleEntry, ENTRY_LIVE, ENTRY_PINNED,
};
use super::GRANULE;
use crate::arch::atomic::{GlobalU64, Ordering};
use crate::arch::index::{global_thread_id, lane_id};
use crate::arch::warp::{active_mask, ballot, lanemask_lt, match_any, shfl, shfl_u64};
use crate::fill::pattern;
use crate::heap::Heap;

/// Bytes of the control block at the start of the movable region's buffer.
pub const MOVABLE_CTRL_BYTES: u64 = 64;
/// Control word: the bump cursor, bytes from the start of the span (may pass
/// the span's end after failed requests).
pub const CTRL_CURSOR: u64 = 0;
/// Control word: the next index-pool position to hand out.
pub const CTRL_POOL_NEXT: u64 = 1;
/// Control word: indices in the pool (written by the host only).
pub const CTRL_POOL_LEN: u64 = 2;
/// Control word: [`handle_alloc`] calls that returned 0 for a nonzero size.
pub const CTRL_FAILED: u64 = 3;
/// [`HandleEntry::flags`]: the pin count is kept in bits 8..32 (and
/// [`ENTRY_PINNED`] is set while it is nonzero).
pub const PIN_SHIFT: u32 = 8;

/// Bytes of the movable region's buffer for `max_handles` handles: control block, table
/// (24 bytes per entry), pool (4 bytes per entry).
pub const fn buffer_bytes(max_handles: u64) -> u64 {
    MOVABLE_CTRL_BYTES + max_handles * (core::mem::size_of::<HandleEntry>() as u64 + 4)
}

/// Byte offset of the handle table in the movable region's buffer.
pub const TABLE_OFFSET: u64 = MOVABLE_CTRL_BYTES;

/// Byte offset of the index pool in the movable region's buffer.
pub const fn pool_offset(max_handles: u64) -> u64 {
    MOVABLE_CTRL_BYTES + max_handles * core::mem::size_of::<HandleEntry>() as u64
}

/// The handle table of `heap`'s movable region as a [`DeviceHandleTable`]
/// (for [`super::handle::resolve`] and kernels written against it). `len` is
/// 0 when the heap has no movable region.
#[inline(always)]
pub fn table(heap: &Heap) -> DeviceHandleTable {
    DeviceHandleTable {
        entries: heap.movable_ctrl + TABLE_OFFSET,
        region: heap.base + heap.movable_off,
        len: if heap.movable_ctrl == 0 { 0 } else { heap.max_handles as u32 },
        reserved: 0,
    }
}

/// Control word `i` of the movable region.
///
/// # Safety
/// `heap` has a live movable region; `i < MOVABLE_CTRL_BYTES / 8`.
#[inline(always)]
unsafe fn ctrl<'a>(heap: &Heap, i: u64) -> &'a GlobalU64 {
    // SAFETY: the control block is 64 bytes of 8-byte aligned words in a
    // live device buffer (global memory; caller).
    unsafe { GlobalU64::from_ptr((heap.movable_ctrl + 8 * i) as *mut u64) }
}

/// Address of entry `i` of the table.
#[inline(always)]
fn entry_ptr(heap: &Heap, i: u32) -> *mut HandleEntry {
    (heap.movable_ctrl + TABLE_OFFSET + i as u64 * core::mem::size_of::<HandleEntry>() as u64) as *mut HandleEntry
}

/// The state word (flags | generation << 32) of entry `i`.
///
/// # Safety
/// `heap` has a live movable region; `i < max_handles`.
#[inline(always)]
unsafe fn state<'a>(heap: &Heap, i: u32) -> &'a GlobalU64 {
    // SAFETY: entries are 24 bytes at an 8-byte aligned table in the
    // movable region's device buffer (global memory); `flags` and
    // `generation` are the third 8-byte word (offset 16).
    unsafe { GlobalU64::from_ptr((entry_ptr(heap, i) as *mut u64).add(2)) }
}

/// Allocates a movable block of `size` bytes (it occupies `size` rounded up
/// to 16 bytes, 16-byte aligned) and returns its handle, or 0 when `size` is
/// 0, the heap has no movable region, or the span or the handle table is
/// exhausted. Bounded time (no loop); failures are counted in
/// [`CTRL_FAILED`]. Never moves anything.
///
/// Warp-collective over `active_mask()`, like `heap::malloc`: every active
/// lane calls it (lanes that need nothing pass 0).
///
/// # Safety
/// `heap` is the handle of a live heap (from `DeviceHeap::handle`), used
/// while no compaction runs.
#[inline(always)]
pub unsafe fn handle_alloc(heap: &Heap, size: u64) -> u64 {
    let cap = heap.movable_bytes;
    let has_movable = heap.movable_ctrl != 0;
    let need = if size == 0 || size > cap || !has_movable { 0 } else { size.div_ceil(GRANULE) * GRANULE };
    let mask = active_mask();
    let lane = lane_id();
    // Every collective below is over `mask` (the lanes that executed this
    // `active_mask` together, the caller among them) or over `peers`, a
    // subset of it that contains the caller; the code from here to the end
    // has no `return` and each branch around a collective is uniform over
    // its mask (a ballot over `mask`), so each lane of the mask reaches it.
    // 1. Bytes: one `atom.add` per group of lanes asking for the same size.
    // SAFETY: (both) unconditional, over `mask` (see above).
    let peers = unsafe { match_any(mask, need as u32) & match_any(mask, (need >> 32) as u32) };
    let leader = peers.trailing_zeros();
    let rank = (peers & lanemask_lt()).count_ones() as u64;
    let mut base = cap;
    let mut n_fit = 0u64;
    if lane == leader && need != 0 {
        // SAFETY: a live movable region (`need != 0` implies one).
        let cursor = unsafe { ctrl(heap, CTRL_CURSOR) };
        // Take only what fits after the cursor as last seen, so a request
        // that cannot fit does not advance it (the tail stays usable for
        // smaller ones). Racing warps may still push it past the end; each
        // adds at most `cap`, so it never overflows.
        let c = cursor.load(Ordering::Relaxed);
        if c < cap {
            n_fit = ((cap - c) / need).min(peers.count_ones() as u64);
            if n_fit > 0 {
                base = cursor.fetch_add(n_fit * need, Ordering::Relaxed);
            }
        }
    }
    // SAFETY: (both) unconditional; `peers` holds this lane and every lane
    // with the same `need`, all of which execute these shuffles with the
    // same `peers` (`match_any` gives each of them that same mask).
    let base = unsafe { shfl_u64(peers, base, leader) };
    // SAFETY: as above.
    let n_fit = unsafe { shfl(peers, n_fit as u32, leader) } as u64;
    let off = base.saturating_add(rank * need);
    let fits = need != 0 && rank < n_fit && off < cap && need <= cap - off;
    // 2. Indices: one `atom.add` for every lane that got bytes.
    // SAFETY: unconditional, over `mask`.
    let got = unsafe { ballot(mask, fits) };
    let mut handle = 0u64;
    if got != 0 {
        let first = got.trailing_zeros();
        let mut k0 = 0u64;
        if lane == first {
            // SAFETY: a live movable region (some lane has `need != 0`).
            k0 = unsafe { ctrl(heap, CTRL_POOL_NEXT) }.fetch_add(got.count_ones() as u64, Ordering::Relaxed);
        }
        // SAFETY: `got` is the same on every lane of `mask` (a ballot over
        // it), so every lane of `mask` is in this branch.
        let k0 = unsafe { shfl_u64(mask, k0, first) };
        if fits {
            let k = k0 + (got & lanemask_lt()).count_ones() as u64;
            // SAFETY: a live movable region; the pool length is written by the host only.
            let pool_len = unsafe { ctrl(heap, CTRL_POOL_LEN) }.load(Ordering::Relaxed);
            if k < pool_len && k < heap.max_handles {
                let pool = (heap.movable_ctrl + pool_offset(heap.max_handles)) as *const u32;
                // SAFETY: `k < max_handles`, inside the pool.
                let i = unsafe { pool.add(k as usize).read() };
                if (i as u64) < heap.max_handles {
                    // SAFETY: `i < max_handles`; the pool hands each index to
                    // one lane between two compactions, so this lane owns the
                    // entry until it publishes the state word.
                    unsafe {
                        let st = state(heap, i);
                        let gen = next_generation((st.load(Ordering::Relaxed) >> 32) as u32);
                        let e = entry_ptr(heap, i);
                        (*e).offset = off;
                        (*e).size = size;
                        st.store((gen as u64) << 32 | ENTRY_LIVE as u64, Ordering::Release);
                        handle = make_handle(i, gen);
                    }
                }
            }
        }
    }
    // SAFETY: unconditional, over `mask`.
    let failed = unsafe { ballot(mask, size != 0 && handle == 0) };
    if failed != 0 && lane == failed.trailing_zeros() && has_movable {
        // SAFETY: a live movable region.
        unsafe { ctrl(heap, CTRL_FAILED) }.fetch_add(failed.count_ones() as u64, Ordering::Relaxed);
    }
    handle
}

/// The entry of a live `handle`, or `None` for 0, an index out of range, a
/// dead entry or a stale generation. The state word is read with acquire
/// ordering. Not collective.
///
/// # Safety
/// As for [`handle_alloc`].
#[inline(always)]
pub unsafe fn entry(heap: &Heap, handle: u64) -> Option<HandleEntry> {
    let (i, gen) = split_handle(handle);
    if heap.movable_ctrl == 0 || i as u64 >= heap.max_handles {
        return None;
    }
    // SAFETY: `i < max_handles` of a live movable region.
    let s = unsafe { state(heap, i) }.load(Ordering::Acquire);
    let (flags, g) = (s as u32, (s >> 32) as u32);
    if flags & ENTRY_LIVE == 0 || g != gen {
        return None;
    }
    // SAFETY: as above; the acquire load orders these reads after the
    // allocating thread's writes. Only `offset` and `size` are read plainly
    // (the state word may be changed concurrently by `handle_free`, atomically).
    let (offset, size) = unsafe {
        let e = entry_ptr(heap, i);
        (core::ptr::addr_of!((*e).offset).read(), core::ptr::addr_of!((*e).size).read())
    };
    Some(HandleEntry { offset, size, flags, generation: g })
}

/// The current address of the block named by `handle`, or null when the
/// handle is not live. Valid for the block's size rounded up to 16 bytes,
/// until the kernel ends (see the module docs). Not collective.
///
/// # Safety
/// As for [`handle_alloc`].
#[inline(always)]
pub unsafe fn resolve(heap: &Heap, handle: u64) -> *mut u8 {
    // SAFETY: forwarded contract.
    match unsafe { entry(heap, handle) } {
        Some(e) => (heap.base + heap.movable_off + e.offset) as *mut u8,
        None => core::ptr::null_mut(),
    }
}

/// Frees the block of `handle`: its entry becomes dead (the handle stops
/// resolving at once); its bytes and its entry are reclaimed by the next
/// compaction. Returns `false`, changing nothing, for a handle that is not
/// live (stale, double free, 0) or pinned. Any thread, any later kernel; not
/// collective.
///
/// # Safety
/// As for [`handle_alloc`]; nobody uses the block after this call.
#[inline(always)]
pub unsafe fn handle_free(heap: &Heap, handle: u64) -> bool {
    let (i, gen) = split_handle(handle);
    if heap.movable_ctrl == 0 || i as u64 >= heap.max_handles {
        return false;
    }
    // SAFETY: `i < max_handles` of a live movable region.
    let st = unsafe { state(heap, i) };
    let s = st.load(Ordering::Acquire);
    if (s >> 32) as u32 != gen || (s as u32) & ENTRY_LIVE == 0 || (s as u32) & ENTRY_PINNED != 0 {
        return false;
    }
    st.compare_exchange(s, (gen as u64) << 32, Ordering::AcqRel).is_ok()
}

/// Parameters of [`HEAP_HANDLE_ALLOC`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HandleAllocParams {
    /// The heap.
    pub heap: Heap,
    /// Device address of `threads` `u64` sizes, or 0 to use `size` for all.
    pub sizes: u64,
    /// Bytes per allocation when `sizes` is 0.
    pub size: u64,
    /// Threads that take part.
    pub threads: u64,
    /// Device address of `threads` `u64` results (handle, or 0).
    pub out: u64,
}

/// Thread `i < threads` stores `handle_alloc(size_i)` in `out[i]`.
///
/// # Safety
/// `heap` is live; `sizes` (if non-zero) and `out` address `threads` `u64`s.
pub unsafe fn handle_alloc_kernel(p: &HandleAllocParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let size = if p.sizes != 0 {
        // SAFETY: `i < threads`, inside `sizes`.
        unsafe { (p.sizes as *const u64).add(i as usize).read() }
    } else {
        p.size
    };
    // SAFETY: the caller guarantees a live heap.
    let h = unsafe { handle_alloc(&p.heap, size) };
    // SAFETY: `i < threads`, inside `out`.
    unsafe { (p.out as *mut u64).add(i as usize).write(h) };
}

/// Parameters of [`HEAP_HANDLE_FREE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HandleFreeParams {
    /// The heap.
    pub heap: Heap,
    /// Device address of `threads` `u64` handles.
    pub handles: u64,
    /// Threads that take part.
    pub threads: u64,
    /// Device address of `threads` `u64` results (1 freed, 0 rejected), or 0.
    pub out: u64,
}

/// Thread `i < threads` calls `handle_free(handles[i])` (and stores the result).
///
/// # Safety
/// `heap` is live; `handles` (and `out`, if non-zero) address `threads`
/// `u64`s; no one uses the freed blocks afterwards.
pub unsafe fn handle_free_kernel(p: &HandleFreeParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    // SAFETY: `i < threads`, inside `handles`.
    let h = unsafe { (p.handles as *const u64).add(i as usize).read() };
    // SAFETY: the caller guarantees a live heap.
    let ok = unsafe { handle_free(&p.heap, h) };
    if p.out != 0 {
        // SAFETY: `i < threads`, inside `out`.
        unsafe { (p.out as *mut u64).add(i as usize).write(ok as u64) };
    }
}

/// Parameters of [`HEAP_HANDLE_TOUCH`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HandleTouchParams {
    /// The heap.
    pub heap: Heap,
    /// Device address of `threads` `u64` handles (0 entries are skipped).
    pub handles: u64,
    /// Threads that take part.
    pub threads: u64,
    /// Pattern seed: thread `i` uses `pattern(handles[i] ^ seed, word)`.
    pub seed: u64,
    /// 0: write the pattern over the block (its size rounded up to 16
    /// bytes); 1: count the words that differ from it.
    pub verify: u64,
    /// Device address of `[u64; 2]`: mismatching words, and nonzero handles
    /// that did not resolve.
    pub counters: u64,
}

/// Thread `i < threads` resolves `handles[i]` *when it runs* and writes or
/// verifies the handle's pattern over the whole block (an example user
/// kernel of the handle API; the tests' pending operations).
///
/// # Safety
/// `heap` is live; `handles` addresses `threads` `u64`s, distinct live
/// handles owned by their threads for this launch; `counters` two `u64`s of
/// device (global) memory.
pub unsafe fn handle_touch_kernel(p: &HandleTouchParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    // SAFETY: `i < threads`, inside `handles`.
    let h = unsafe { (p.handles as *const u64).add(i as usize).read() };
    if h == 0 {
        return;
    }
    // SAFETY: the caller guarantees a live heap.
    let Some(e) = (unsafe { entry(&p.heap, h) }) else {
        // SAFETY: the caller provides two counters in a device buffer.
        unsafe { GlobalU64::from_ptr((p.counters as *mut u64).add(1)) }.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let base = (p.heap.base + p.heap.movable_off + e.offset) as *mut u32;
    let words = e.size.div_ceil(GRANULE) * GRANULE / 4;
    let seed = h ^ p.seed;
    let mut bad = 0u64;
    let mut w = 0u64;
    while w < words {
        let v = pattern(seed, w);
        // SAFETY: `w` is inside the block's rounded size, owned by this
        // thread for the launch.
        unsafe {
            let q = base.add(w as usize);
            if p.verify != 0 {
                if q.read_volatile() != v {
                    bad += 1;
                }
            } else {
                q.write_volatile(v);
            }
        }
        w += 1;
    }
    if bad != 0 {
        // SAFETY: the caller provides two counters in a device buffer.
        unsafe { GlobalU64::from_ptr(p.counters as *mut u64) }.fetch_add(bad, Ordering::Relaxed);
    }
}

crate::kernel_entry! {
    /// [`handle_alloc_kernel`] as a kernel.
    pub static HEAP_HANDLE_ALLOC: HandleAllocParams = gpuheap_heap_handle_alloc => handle_alloc_kernel;
}
crate::kernel_entry! {
    /// [`handle_free_kernel`] as a kernel.
    pub static HEAP_HANDLE_FREE: HandleFreeParams = gpuheap_heap_handle_free => handle_free_kernel;
}
crate::kernel_entry! {
    /// [`handle_touch_kernel`] as a kernel.
    pub static HEAP_HANDLE_TOUCH: HandleTouchParams = gpuheap_heap_handle_touch => handle_touch_kernel;
}
