//! The compaction plan: the new offset of every block by a single-pass
//! segmented exclusive prefix sum with decoupled look-back (Merrill & Garland,
//! NVIDIA technical report NVR-2016-002; the pattern of CUB's `DeviceScan`).
//!
//! # Scan elements
//!
//! An element is a `u64`: bit [`RESET`] and a 61-bit value. The operator
//! `a ⊕ b = b` if `b` has `RESET`, else `(a.reset, a.value + b.value)` is
//! associative with identity 0, so a pinned block (element `RESET | end`)
//! restarts the sums at its end: a *segmented* scan. The element of an
//! unpinned block is its size, of a pinned block `RESET | (offset + size)`;
//! the exclusive prefix of an unpinned block is its new offset, and a pinned
//! block keeps its offset. The plan writes `new_offset[i]` and the handle
//! table's offset of each block with a handle. (Which blocks move and where
//! their bytes go follows from the new offsets alone: the mover derives it.)
//!
//! # Tiles and look-back
//!
//! Warps take scan tiles (`lanes × items_per_lane` consecutive blocks) from an
//! atomic counter. A tile reduces its items (each lane a run of
//! `items_per_lane`, then a warp scan by shuffles), publishes its aggregate
//! (status `A`) with a release store, looks back with acquire loads over
//! tiles `t−1, t−2, …` adding their aggregates until it meets an inclusive
//! prefix (status `P`) or an aggregate with `RESET` (a pinned block: nothing
//! before it matters), publishes its own inclusive prefix, and writes its
//! outputs. The look-back only waits for tiles with smaller ids, which have
//! started and publish their aggregate without waiting: see the forward
//! progress argument in [`super`].

use super::handle::HandleEntry;
use super::{LiveBlock, Warp, NO_HANDLE};
use crate::arch::atomic::{AtomicU64, Ordering};
use crate::arch::time::backoff;
use crate::arch::warp::shfl_u64;

/// Scan-element flag: restart the running sum (a pinned block).
pub const RESET: u64 = 1 << 61;
/// Scan-element value bits.
pub const VALUE: u64 = RESET - 1;
/// Tile status: aggregate available.
const STATUS_A: u64 = 1 << 62;
/// Tile status: inclusive prefix available.
const STATUS_P: u64 = 2 << 62;
const ELEMENT: u64 = RESET | VALUE;

/// The scan operator (see the module docs).
#[inline(always)]
pub fn combine(a: u64, b: u64) -> u64 {
    if b & RESET != 0 {
        b
    } else {
        (a & RESET) | ((a & VALUE) + (b & VALUE))
    }
}

/// Parameters of [`PLAN`]. Device addresses as `u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PlanParams {
    /// `count` [`LiveBlock`]s sorted by offset.
    pub blocks: u64,
    /// Number of blocks.
    pub count: u64,
    /// `count` `u64`: the new offsets, written.
    pub new_offset: u64,
    /// One `u64` status word per scan tile (at least `ceil(count /
    /// items_per_lane)`), zeroed before the launch.
    pub tile_status: u64,
    /// A `u64` tile counter, zeroed before the launch.
    pub tile_counter: u64,
    /// [`HandleEntry`] array updated with the new offsets (0: none).
    pub table: u64,
    /// Entries in `table`.
    pub table_len: u64,
    /// Consecutive blocks per lane in a tile (≥ 1).
    pub items_per_lane: u32,
    /// Zero.
    pub reserved: u32,
}

/// Block `i` and its scan element (its size, or a reset for a pinned block).
///
/// # Safety
/// `p` satisfies [`plan`]'s contract and `i < p.count`.
#[inline(always)]
unsafe fn element(p: &PlanParams, i: u64) -> (LiveBlock, u64) {
    // SAFETY: `i < count` (caller).
    let b = unsafe { (p.blocks as *const LiveBlock).add(i as usize).read() };
    let e = if b.pinned() { RESET | (b.offset + b.size) } else { b.size };
    (b, e)
}

/// Writes the new offset of block `b` (index `i`) whose exclusive prefix is
/// `excl`.
///
/// # Safety
/// `p` satisfies [`plan`]'s contract and `i < p.count`; block `i`'s outputs
/// are written by this thread alone.
#[inline(always)]
unsafe fn output(p: &PlanParams, i: u64, b: &LiveBlock, excl: u64) {
    let dst = if b.pinned() { b.offset } else { excl & VALUE };
    // SAFETY: `i < count`; each block's slot is written by one lane.
    unsafe { (p.new_offset as *mut u64).add(i as usize).write(dst) };
    // SAFETY: the caller's contract.
    unsafe { set_table(p, b, dst) };
}

/// Writes `dst` into the handle-table entry of block `b`, if it has one.
///
/// # Safety
/// `p` satisfies [`plan`]'s contract; `b` is one of its blocks, whose outputs
/// are written by this thread alone.
#[inline(always)]
unsafe fn set_table(p: &PlanParams, b: &LiveBlock, dst: u64) {
    if p.table != 0 && b.handle != NO_HANDLE && (b.handle as u64) < p.table_len {
        // SAFETY: in range; handles of distinct blocks are distinct.
        unsafe { (*(p.table as *mut HandleEntry).add(b.handle as usize)).offset = dst };
    }
}

/// Scan tile `t` (blocks `first..end`) of a one-lane warp of the CPU
/// emulator, reading each block once (the warp path reads each twice: its
/// aggregate, then its outputs).
///
/// One branch-free pass: the new offset of a block is its offset when it is
/// pinned, else the running value `v`, and `v` becomes that new offset plus
/// the block's size in both cases (the value of `combine(run, element)`),
/// so the pass needs no scan element at all. When tile `t − 1` has already
/// published its inclusive prefix (or `t` is 0), `v` starts at that
/// prefix's value and the pass writes the final offsets. Otherwise it starts
/// at 0 (offsets relative to the tile's prefix, absolute from the tile's
/// first pinned block on, whose reset makes the prefix irrelevant); the tile
/// publishes its aggregate, looks back exactly as the warp path does, and
/// adds the prefix's value to the offsets before its first pinned block (a
/// tight loop over the tile's `new_offset` slice, still in cache). Handle
/// entries are written last, from the final offsets. Same outputs and
/// statuses as the warp path; the forward-progress argument is unchanged
/// (the look-back waits only for smaller ids, after this tile has published
/// its aggregate).
///
/// # Safety
/// `p` satisfies [`plan`]'s contract, `t` was taken from its counter by this
/// one-lane warp, `first..end` are the tile's blocks (`end ≤ p.count`).
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn plan_tile_alone(p: &PlanParams, t: u64, first: u64, end: u64) {
    // SAFETY: `u ≤ t <` the status words the caller provides.
    let status = |u: u64| unsafe { AtomicU64::from_ptr((p.tile_status as *mut u64).add(u as usize)) };
    let known = if t == 0 {
        Some(0)
    } else {
        let s = status(t - 1).load(Ordering::Acquire);
        (s & STATUS_P != 0).then_some(s & ELEMENT)
    };
    let blocks = p.blocks as *const LiveBlock;
    let offsets = p.new_offset as *mut u64;
    let mut v = known.unwrap_or(0) & VALUE;
    // The first pinned block of the tile (`end`: none).
    let mut split = end;
    let mut i = first;
    while i < end {
        // SAFETY: `i < count`; block `i`'s output slot is this warp's.
        unsafe {
            let b = blocks.add(i as usize).read();
            let dst = if b.pinned() { b.offset } else { v };
            split = if b.pinned() && split == end { i } else { split };
            offsets.add(i as usize).write(dst);
            v = dst + b.size;
        }
        i += 1;
    }
    let reset = if split < end { RESET } else { 0 };
    match known {
        Some(prefix) => status(t).store(STATUS_P | (prefix & RESET) | reset | v, Ordering::Release),
        None => {
            let agg = reset | v;
            // SAFETY: the caller's contract; `t > 0` (tile 0's prefix is known).
            let prefix = unsafe { look_back(p, t, agg) };
            status(t).store(STATUS_P | combine(prefix, agg), Ordering::Release);
            let add = prefix & VALUE;
            let mut i = first;
            while i < split {
                // SAFETY: `i < end ≤ count`, this tile's slot.
                unsafe { *offsets.add(i as usize) += add };
                i += 1;
            }
        }
    }
    if p.table != 0 {
        let mut i = first;
        while i < end {
            // SAFETY: `i < count`; this tile's blocks.
            unsafe { set_table(p, &blocks.add(i as usize).read(), offsets.add(i as usize).read()) };
            i += 1;
        }
    }
}

/// The decoupled look-back of tile `t > 0` with aggregate `tile_agg`:
/// publishes the aggregate (status `A`), then combines the statuses of tiles
/// `t−1, t−2, …` (waiting for each to publish) until an inclusive prefix or
/// a reset, and returns the exclusive prefix of tile `t`. The caller then
/// publishes `P`.
///
/// # Safety
/// `p` satisfies [`plan`]'s contract and `0 < t <` its tiles.
#[inline(always)]
unsafe fn look_back(p: &PlanParams, t: u64, tile_agg: u64) -> u64 {
    // SAFETY: `u ≤ t <` the status words the caller provides.
    let status = |u: u64| unsafe { AtomicU64::from_ptr((p.tile_status as *mut u64).add(u as usize)) };
    status(t).store(STATUS_A | tile_agg, Ordering::Release);
    let mut acc = 0u64;
    let mut u = t - 1;
    loop {
        let mut s = status(u).load(Ordering::Acquire);
        let mut attempt = 0;
        while s == 0 {
            backoff(attempt);
            attempt += 1;
            s = status(u).load(Ordering::Acquire);
        }
        acc = combine(s & ELEMENT, acc);
        // Tile 0 always publishes P, so `u` never goes below 0.
        if s & STATUS_P != 0 || acc & RESET != 0 || u == 0 {
            break;
        }
        u -= 1;
    }
    acc
}

/// The plan scan (see the module docs).
///
/// # Safety
/// The addresses in `p` are valid as documented on [`PlanParams`] and not
/// accessed by anyone else during the launch; blocks are launched with whole
/// warps (or one-lane warps on the CPU).
pub unsafe fn plan(p: &PlanParams) {
    let w = Warp::launched();
    let ipl = p.items_per_lane.max(1) as u64;
    let per_tile = ipl * w.lanes as u64;
    let tiles = p.count.div_ceil(per_tile);
    // SAFETY: the caller provides the counter and status words.
    let counter = unsafe { AtomicU64::from_ptr(p.tile_counter as *mut u64) };
    let status = |t: u64| {
        // SAFETY: `t < tiles ≤` the status words the caller provides.
        unsafe { AtomicU64::from_ptr((p.tile_status as *mut u64).add(t as usize)) }
    };
    loop {
        let mut t = 0;
        if w.is_leader() {
            t = counter.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: (every collective of this loop) `w` is the launched warp
        // and the loop is warp-uniform: it runs until the broadcast tile id
        // is past the end, and each branch around a collective depends only
        // on `p`, `w.lanes` or broadcast values, so every lane of `w.mask`
        // reaches each call; no lane returns inside the loop.
        let t = unsafe { w.broadcast(t) };
        if t >= tiles {
            break;
        }
        let first = t * per_tile + w.rank as u64 * ipl;
        let end = (first + ipl).min(p.count);
        #[cfg(not(target_arch = "nvptx64"))]
        if w.lanes == 1 {
            // SAFETY: `t < tiles` is this warp's; its blocks are `first..end`.
            unsafe { plan_tile_alone(p, t, first, end) };
            continue;
        }
        // Lane aggregate.
        let mut agg = 0u64;
        let mut i = first;
        while i < end {
            // SAFETY: `i < count`.
            agg = combine(agg, unsafe { element(p, i) }.1);
            i += 1;
        }
        // Inclusive warp scan of the lane aggregates (Hillis–Steele).
        let mut incl = agg;
        let mut d = 1;
        while d < w.lanes {
            let src = if w.rank >= d { w.lane_of(w.rank - d) } else { w.lane_of(w.rank) };
            // SAFETY: warp-uniform (`d` and `w.lanes` are the same on every
            // lane); see the loop head.
            let y = unsafe { shfl_u64(w.mask, incl, src) };
            if w.rank >= d {
                incl = combine(y, incl);
            }
            d *= 2;
        }
        // SAFETY: unconditional in the warp-uniform loop (see its head).
        let below = unsafe { shfl_u64(w.mask, incl, w.lane_of(w.rank.saturating_sub(1))) };
        let lane_excl = if w.rank == 0 { 0 } else { below };
        // SAFETY: as above.
        let tile_agg = unsafe { shfl_u64(w.mask, incl, w.lane_of(w.lanes - 1)) };
        // Decoupled look-back by the leader.
        let mut prefix = 0u64;
        if w.is_leader() {
            if t == 0 {
                status(0).store(STATUS_P | tile_agg, Ordering::Release);
            } else {
                // SAFETY: `0 < t < tiles`.
                prefix = unsafe { look_back(p, t, tile_agg) };
                status(t).store(STATUS_P | combine(prefix, tile_agg), Ordering::Release);
            }
        }
        // SAFETY: after the leader-only look-back, every lane is back on the
        // warp-uniform path (see the loop head).
        let prefix = unsafe { w.broadcast(prefix) };
        // Outputs.
        let mut run = combine(prefix, lane_excl);
        let mut i = first;
        while i < end {
            // SAFETY: `i < count`.
            unsafe {
                let (b, e) = element(p, i);
                output(p, i, &b, run);
                run = combine(run, e);
            }
            i += 1;
        }
    }
}

crate::kernel_entry! {
    /// [`plan`] as a kernel.
    pub static PLAN: PlanParams = gpuheap_compact_plan => plan;
}
