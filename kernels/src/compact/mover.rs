//! The in-place tile mover ([`MOVE`]) and the plain-copy baseline
//! ([`COPY`]).
//!
//! See [`super`] for the algorithm, the correctness and the forward-progress
//! arguments. Both kernels are *persistent*: each warp loops taking the next
//! tile (or chunk) id from an atomic counter until none is left, so any grid
//! size works and the tile order is the order in which warps start.

use super::{blocks_below, upper_bound, warp_copy, LiveBlock, Warp, Word16, GRANULE};
use crate::arch::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::arch::block::dyn_shared;
use crate::arch::index::thread_idx_x;
use crate::arch::time::backoff;
use crate::arch::warp::sync_warp;
use crate::arch::WARP_SIZE;

/// Parameters of [`MOVE`]. Device addresses as `u64`; offsets are relative
/// to `region`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MoveParams {
    /// Device address of the region (16-byte aligned).
    pub region: u64,
    /// `count` [`LiveBlock`]s sorted by offset.
    pub blocks: u64,
    /// `count` new offsets (from the plan, [`super::plan::MODE_DST`]).
    pub new_offset: u64,
    /// `count` stream positions (from the plan, [`super::plan::MODE_STREAM`]).
    pub stream_pos: u64,
    /// Number of blocks.
    pub count: u64,
    /// A `u64` holding the total moving bytes `M` (written by the plan).
    pub total: u64,
    /// Tile size in bytes (a multiple of 16). Dynamic shared memory must hold
    /// `tile_bytes` per warp of the block.
    pub tile_bytes: u64,
    /// One `u32` flag per tile (at least `ceil(M / tile_bytes)`): a tile is
    /// loaded when its flag equals `epoch`. Values other than `epoch` are
    /// "not loaded", so the buffer is reused without clearing.
    pub flags: u64,
    /// A `u64` tile counter, zeroed before the launch.
    pub tile_counter: u64,
    /// This compaction's epoch (nonzero, differs from every value in
    /// `flags`).
    pub epoch: u32,
    /// Zero.
    pub reserved: u32,
}

/// Bytes of the moving block `i` (0 if it does not move).
///
/// # Safety
/// `p` satisfies [`move_tiles`]' contract and `i < p.count`.
#[inline(always)]
unsafe fn moving(p: &MoveParams, i: u64) -> (LiveBlock, u64, u64, u64) {
    // SAFETY: `i < count` (caller).
    let (b, dst, pos) = unsafe {
        (
            (p.blocks as *const LiveBlock).add(i as usize).read(),
            (p.new_offset as *const u64).add(i as usize).read(),
            (p.stream_pos as *const u64).add(i as usize).read(),
        )
    };
    let len = if dst != b.offset { b.size } else { 0 };
    (b, dst, pos, len)
}

/// Stream bytes whose source lies below region offset `a`.
///
/// # Safety
/// `p` satisfies [`move_tiles`]' contract.
#[inline(always)]
unsafe fn stream_below(p: &MoveParams, a: u64) -> u64 {
    // SAFETY: the caller's contract on `p`.
    let j = unsafe { blocks_below(p.blocks as *const LiveBlock, p.count, a) };
    if j == 0 {
        return 0;
    }
    // SAFETY: `j - 1 < count`.
    let (b, _, pos, len) = unsafe { moving(p, j - 1) };
    pos + (a - b.offset).min(len)
}

/// Calls `f(src_offset, dst_offset, tile_offset, bytes)` for the runs of the
/// tile `[pos0, pos1)` of the stream, starting at block `i0`; consecutive
/// pieces are merged while their sources (`by_src`) or their destinations
/// (`!by_src`) are contiguous (contiguous sources imply contiguous
/// destinations).
///
/// # Safety
/// `p` satisfies [`move_tiles`]' contract.
#[inline(always)]
unsafe fn for_each_run(
    p: &MoveParams,
    i0: u64,
    pos0: u64,
    pos1: u64,
    by_src: bool,
    mut f: impl FnMut(u64, u64, u64, u64),
) {
    let mut i = i0;
    let mut pos = pos0;
    let (mut rs, mut rd, mut rt, mut rn) = (0u64, 0u64, 0u64, 0u64);
    while pos < pos1 && i < p.count {
        // SAFETY: `i < count`.
        let (b, dst, bpos, len) = unsafe { moving(p, i) };
        i += 1;
        if len == 0 || bpos + len <= pos {
            continue;
        }
        let a = pos - bpos;
        let n = (len - a).min(pos1 - pos);
        let (s, d, t) = (b.offset + a, dst + a, pos - pos0);
        let contiguous = if by_src { rs + rn == s } else { rd + rn == d };
        if rn != 0 && contiguous {
            rn += n;
        } else {
            if rn != 0 {
                f(rs, rd, rt, rn);
            }
            (rs, rd, rt, rn) = (s, d, t, n);
        }
        pos += n;
    }
    if rn != 0 {
        f(rs, rd, rt, rn);
    }
}

/// The tiles `[lo, hi)` that tile `t` of a stream of `m` bytes must see
/// loaded before it stores (itself excepted): every tile whose sources lie
/// in the address range `[dst_lo, dst_hi)` that tile `t` writes. `hi ≤ t + 1`
/// (hazard F2: a tile never waits for a later one).
///
/// # Safety
/// The addresses in `p` are valid and hold a plan of `m` moving bytes;
/// `t < ceil(m / p.tile_bytes)`.
#[inline(always)]
pub unsafe fn wait_range(p: &MoveParams, m: u64, t: u64) -> (u64, u64) {
    let tb = p.tile_bytes;
    let pos0 = t * tb;
    let pos1 = (pos0 + tb).min(m);
    let sp = p.stream_pos as *const u64;
    // SAFETY: `pos0 < pos1 ≤ m`, so both positions lie in moving blocks: the
    // last block whose stream position is ≤ them.
    let (lo, hi) = unsafe {
        let (_, d0, b0, _) = moving(p, upper_bound(sp, p.count, pos0) - 1);
        let (_, d1, b1, _) = moving(p, upper_bound(sp, p.count, pos1 - 1) - 1);
        let dst_lo = d0 + (pos0 - b0);
        let dst_hi = d1 + (pos1 - b1);
        (stream_below(p, dst_lo), stream_below(p, dst_hi))
    };
    if hi <= lo {
        return (0, 0);
    }
    (lo / tb, ((hi - 1) / tb).min(t) + 1)
}

/// The tile mover (see [`super`]).
///
/// # Safety
/// The addresses in `p` are valid as documented on [`MoveParams`]; the layout
/// and plan satisfy [`super`]'s layout rules; dynamic shared memory holds
/// `tile_bytes` for each warp of the block; the block has whole warps (or
/// one-lane warps on the CPU); nothing else accesses the region meanwhile.
pub unsafe fn move_tiles(p: &MoveParams) {
    let w = Warp::launched();
    let tb = p.tile_bytes;
    let (smem, smem_len) = dyn_shared();
    let slot = (thread_idx_x() / WARP_SIZE) as u64;
    if tb == 0 || !tb.is_multiple_of(GRANULE) || (slot + 1) * tb > smem_len as u64 {
        return; // misconfigured launch: take no tile (the host validates).
    }
    // SAFETY: `slot * tb + tb ≤ smem_len`.
    let stage = unsafe { smem.add((slot * tb) as usize) } as *mut Word16;
    // SAFETY: written by the plan launch before this one.
    let m = unsafe { (p.total as *const u64).read() };
    let tiles = m.div_ceil(tb);
    // SAFETY: the caller provides the counter and the flags.
    let counter = unsafe { AtomicU64::from_ptr(p.tile_counter as *mut u64) };
    let flag = |t: u64| {
        // SAFETY: `t < tiles ≤` the flags the caller provides.
        unsafe { AtomicU32::from_ptr((p.flags as *mut u32).add(t as usize)) }
    };
    let region = p.region as *mut u8;
    loop {
        let mut t = 0;
        if w.is_leader() {
            t = counter.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: (every collective of this loop) `w` is the launched warp
        // and the loop is warp-uniform: it runs until the broadcast tile id
        // is past the end, every branch around a collective depends only on
        // `p`, `w.lanes` or broadcast values (the leader-only steps contain
        // no collective), so every lane of `w.mask` reaches each call; no
        // lane returns inside the loop (the misconfiguration `return` above
        // is taken by the whole warp: it depends on `p` and the warp's slot).
        let t = unsafe { w.broadcast(t) };
        if t >= tiles {
            break;
        }
        let pos0 = t * tb;
        let pos1 = (pos0 + tb).min(m);
        // The block holding stream position `pos0`: the last with pos ≤ pos0.
        // SAFETY: `stream_pos` has `count` ascending entries; `pos0 < M`
        // implies at least the first moving block has pos ≤ pos0.
        let i0 = unsafe { upper_bound(p.stream_pos as *const u64, p.count, pos0) } - 1;
        // CPU emulator, one-lane warp: when every tile this one must wait for
        // has already loaded, copy straight from the sources to the
        // destinations (no staging) and publish "loaded" afterwards. This is
        // correct because (F1) no earlier tile writes this tile's sources,
        // the tiles whose sources this tile overwrites have read them, and
        // within the tile each run's destination ends at or below the next
        // run's source, so an ascending memmove per run reads every byte
        // before it is overwritten. Publishing later only delays waiters.
        // (On a GPU the lanes of a warp copy in parallel, so a run that
        // overlaps itself needs the stage.)
        #[cfg(not(target_arch = "nvptx64"))]
        if w.lanes == 1 {
            // SAFETY: the plan is valid and `t < tiles`.
            let (lo, hi) = unsafe { wait_range(p, m, t) };
            if (lo..hi).all(|u| u == t || flag(u).load(Ordering::Acquire) == p.epoch) {
                // SAFETY: runs lie inside moving blocks (sources) and their
                // destinations, both inside the region; `copy` is a memmove.
                unsafe {
                    for_each_run(p, i0, pos0, pos1, true, |s, d, _, n| {
                        core::ptr::copy(region.add(s as usize), region.add(d as usize), n as usize)
                    })
                };
                flag(t).store(p.epoch, Ordering::Release);
                continue;
            }
        }
        // 1. Load the tile's sources into this warp's stage.
        // SAFETY: runs lie inside moving blocks (sources) and the tile (stage).
        unsafe {
            for_each_run(p, i0, pos0, pos1, true, |s, _, t_off, n| {
                warp_copy(
                    &w,
                    stage.add((t_off / GRANULE) as usize),
                    region.add(s as usize) as *const Word16,
                    (n / GRANULE) as usize,
                )
            })
        };
        // SAFETY: warp-uniform (see the loop head).
        unsafe { sync_warp(w.mask) };
        // 2. Publish "loaded".
        if w.is_leader() {
            flag(t).store(p.epoch, Ordering::Release);
        }
        // 3. Wait for the earlier tiles whose sources this tile overwrites.
        if w.is_leader() {
            // SAFETY: the plan is valid and `t < tiles`.
            let (lo, hi) = unsafe { wait_range(p, m, t) };
            let mut u = lo;
            while u < hi {
                if u != t {
                    let mut attempt = 0;
                    while flag(u).load(Ordering::Acquire) != p.epoch {
                        backoff(attempt);
                        attempt += 1;
                    }
                }
                u += 1;
            }
        }
        // SAFETY: warp-uniform (see the loop head).
        unsafe { sync_warp(w.mask) };
        // 4. Store the tile to its destination.
        // SAFETY: runs lie inside the tile (stage) and the destinations.
        unsafe {
            for_each_run(p, i0, pos0, pos1, false, |_, d, t_off, n| {
                warp_copy(
                    &w,
                    region.add(d as usize) as *mut Word16,
                    stage.add((t_off / GRANULE) as usize),
                    (n / GRANULE) as usize,
                )
            })
        };
        // SAFETY: warp-uniform (see the loop head).
        unsafe { sync_warp(w.mask) };
    }
}

crate::kernel_entry! {
    /// [`move_tiles`] as a kernel.
    pub static MOVE: MoveParams = gpuheap_compact_move => move_tiles;
}

/// Parameters of [`COPY`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    /// Destination device address (16-byte aligned).
    pub dst: u64,
    /// Source device address (16-byte aligned, not overlapping `dst`).
    pub src: u64,
    /// Bytes to copy (a multiple of 16).
    pub bytes: u64,
    /// Bytes per chunk (a multiple of 16).
    pub chunk_bytes: u64,
    /// A `u64` chunk counter, zeroed before the launch.
    pub chunk_counter: u64,
}

/// The plain-copy baseline of the compaction benchmark: the same persistent
/// warps, chunk ids and 16-byte copy loop as [`MOVE`], copying `bytes` directly
/// from `src` to `dst` (no staging, no flags, no layout).
///
/// # Safety
/// `src` is readable and `dst` writable for `bytes`, not overlapping, both
/// 16-byte aligned; `chunk_counter` addresses a zeroed `u64`.
pub unsafe fn copy(p: &CopyParams) {
    let w = Warp::launched();
    let cb = p.chunk_bytes;
    if cb == 0 || !cb.is_multiple_of(GRANULE) {
        return;
    }
    let chunks = p.bytes.div_ceil(cb);
    // SAFETY: the caller provides the counter.
    let counter = unsafe { AtomicU64::from_ptr(p.chunk_counter as *mut u64) };
    loop {
        let mut c = 0;
        if w.is_leader() {
            c = counter.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: `w` is the launched warp and this loop is warp-uniform (it
        // runs until the broadcast chunk id is past the end; the early
        // `return` depends on `p` only), so every lane of `w.mask` makes
        // this call.
        let c = unsafe { w.broadcast(c) };
        if c >= chunks {
            break;
        }
        let off = c * cb;
        let n = cb.min(p.bytes - off);
        // SAFETY: `[off, off + n)` is inside both buffers.
        unsafe { warp_copy(&w, (p.dst + off) as *mut Word16, (p.src + off) as *const Word16, (n / GRANULE) as usize) };
    }
}

crate::kernel_entry! {
    /// [`copy`] as a kernel.
    pub static COPY: CopyParams = gpuheap_copy => copy;
}
