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
    /// `count` new offsets (from the plan, [`super::plan::PLAN`]).
    pub new_offset: u64,
    /// Number of blocks.
    pub count: u64,
    /// Start of the destination range the tiles cover: at or below the first
    /// moving block's new offset (the host passes the first hole's offset), a
    /// multiple of 16.
    pub start: u64,
    /// End of that range: at or above the end of the last moving block (the
    /// host passes the end of the last block).
    pub end: u64,
    /// Tile size in bytes (a multiple of 16). Dynamic shared memory must hold
    /// `tile_bytes` per warp of the block.
    pub tile_bytes: u64,
    /// One `u32` flag per tile (at least `ceil((end - start) / tile_bytes)`): a
    /// tile is loaded when its flag equals `epoch`. Values other than `epoch`
    /// are "not loaded", so the buffer is reused without clearing.
    pub flags: u64,
    /// A `u64` tile counter, zeroed before the launch.
    pub tile_counter: u64,
    /// This compaction's epoch (nonzero, differs from every value in
    /// `flags`).
    pub epoch: u32,
    /// Zero.
    pub reserved: u32,
}

/// The destination range `[d0, d1)` of tile `t`.
#[inline(always)]
fn tile_range(p: &MoveParams, t: u64) -> (u64, u64) {
    let d0 = p.start + t * p.tile_bytes;
    (d0, (d0 + p.tile_bytes).min(p.end))
}

/// The new offset of the byte at source offset `a`, or of the first block
/// byte after `a` when `a` lies in a hole (`u64::MAX` when no block lies at or
/// after `a`). Monotone in `a`: every moving byte whose source is at or after
/// `a` goes at or after it.
///
/// # Safety
/// `p` satisfies [`move_tiles`]' contract.
#[inline(always)]
unsafe fn dst_of_source(p: &MoveParams, a: u64) -> u64 {
    let blocks = p.blocks as *const LiveBlock;
    // Blocks starting at or before `a`.
    // SAFETY: the caller's contract on `p`.
    let j = unsafe { blocks_below(blocks, p.count, a + 1) };
    // SAFETY: `j - 1 < count` and `j < count` where read.
    unsafe {
        if j > 0 {
            let b = blocks.add(j as usize - 1).read();
            if a < b.offset + b.size {
                return (p.new_offset as *const u64).add(j as usize - 1).read() + (a - b.offset);
            }
        }
        if j < p.count {
            (p.new_offset as *const u64).add(j as usize).read()
        } else {
            u64::MAX
        }
    }
}

/// Calls `f(src_offset, dst_offset, tile_offset, bytes)` for the runs of
/// moving bytes whose destinations lie in tile `t`'s range `[d0, d1)`, in
/// address order (`tile_offset = dst_offset - d0`); consecutive pieces are
/// merged while their sources (`by_src`) or their destinations (`!by_src`) are
/// contiguous (contiguous sources imply contiguous destinations).
///
/// Only the first block's new offset is read from the plan's array; the
/// following blocks' are derived from the layout alone, by the recurrence the
/// plan's scan computes (so each block costs one 24-byte read): the block
/// after an unpinned block `i` goes to `new_offset[i] + size[i]`, the block
/// after a pinned one to the pinned block's end; a pinned block stays at its
/// offset; a block moves iff its new offset differs from its offset.
///
/// # Safety
/// `p` satisfies [`move_tiles`]' contract and `t` is one of its tiles.
#[inline(always)]
unsafe fn for_each_run(p: &MoveParams, t: u64, by_src: bool, mut f: impl FnMut(u64, u64, u64, u64)) {
    if p.count == 0 {
        return;
    }
    let (d0, d1) = tile_range(p, t);
    let blocks = p.blocks as *const LiveBlock;
    let offsets = p.new_offset as *const u64;
    // The last block whose new offset is at or below `d0` (the first block
    // when none is): new offsets ascend with the blocks.
    // SAFETY: `new_offset` holds `count` ascending entries.
    let mut i = unsafe { upper_bound(offsets, p.count, d0) }.max(1) - 1;
    // SAFETY: `i < count`.
    let mut next_dst = unsafe { offsets.add(i as usize).read() };
    let (mut rs, mut rd, mut rn) = (0u64, 0u64, 0u64);
    while i < p.count {
        // SAFETY: `i < count`.
        let b = unsafe { blocks.add(i as usize).read() };
        let dst = if b.pinned() { b.offset } else { next_dst };
        if dst >= d1 {
            break;
        }
        next_dst = if b.pinned() { b.offset + b.size } else { dst + b.size };
        i += 1;
        if dst == b.offset {
            continue; // not moving
        }
        let lo = dst.max(d0);
        let hi = (dst + b.size).min(d1);
        if lo >= hi {
            continue;
        }
        let (s, d, n) = (b.offset + (lo - dst), lo, hi - lo);
        let contiguous = if by_src { rs + rn == s } else { rd + rn == d };
        if rn != 0 && contiguous {
            rn += n;
        } else {
            if rn != 0 {
                f(rs, rd, rd - d0, rn);
            }
            (rs, rd, rn) = (s, d, n);
        }
    }
    if rn != 0 {
        f(rs, rd, rd - d0, rn);
    }
}

/// CPU emulator, one-lane warp: copies tile `t`'s moving bytes straight from
/// their sources to their destinations, in address order ([`move_tiles`] says
/// when that is allowed).
///
/// The walk of [`for_each_run`] with less work per block, for layouts of
/// many tiny blocks, copying in ascending address order:
/// - a moving block of at most [`SHORT_BYTES`] whose destination lies inside
///   the tile's range `[d0, d1)` is copied at once by [`move_short`], without
///   a branch on its size (a run of contiguous tiny blocks copied as one has a
///   random length, whose loop exit the branch predictor misses);
/// - other moving blocks form runs: a run with contiguous sources (hence
///   contiguous destinations: see [`for_each_run`]) grows by one addition per
///   block and is clipped to `[d0, d1)` only when it is copied by
///   [`move_down`] (only a tile's first and last blocks can cross its
///   bounds);
/// - blocks that do not move (pinned, or before their segment's first hole)
///   end a run and are not touched.
///
/// # Safety
/// `p` satisfies [`move_tiles`]' contract, `t` is one of its tiles, no other
/// tile writes this tile's sources any more and every byte this tile
/// overwrites has been read by its owner.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn move_tile_direct(p: &MoveParams, t: u64, region: *mut u8) {
    if p.count == 0 {
        return;
    }
    let (d0, d1) = tile_range(p, t);
    let blocks = p.blocks as *const LiveBlock;
    let offsets = p.new_offset as *const u64;
    // As in `for_each_run`.
    // SAFETY: `new_offset` holds `count` ascending entries.
    let mut i = unsafe { upper_bound(offsets, p.count, d0) }.max(1) - 1;
    // SAFETY: `i < count`.
    let mut next_dst = unsafe { offsets.add(i as usize).read() };
    let copy = |s: u64, d: u64, n: u64| {
        let (lo, hi) = (d.max(d0), (d + n).min(d1));
        if lo < hi {
            // SAFETY: `[lo, hi)` is inside the tile and the run's destination,
            // `lo - d` bytes into the run: source and destination lie inside
            // the region, 16-byte aligned, destination below source.
            unsafe { move_down(region, s + (lo - d), lo, hi - lo) };
        }
    };
    let (mut rs, mut rd, mut rn) = (0u64, 0u64, 0u64);
    while i < p.count {
        // SAFETY: `i < count`.
        let b = unsafe { blocks.add(i as usize).read() };
        let dst = if b.pinned() { b.offset } else { next_dst };
        if dst >= d1 {
            break;
        }
        next_dst = dst + b.size;
        i += 1;
        if dst == b.offset {
            continue; // not moving
        }
        if b.size <= SHORT_BYTES && dst >= d0 && next_dst <= d1 {
            if rn != 0 {
                copy(rs, rd, rn);
                rn = 0;
            }
            // SAFETY: the block's source and destination lie inside the
            // region (its destination inside this tile), 16-byte aligned,
            // destination below source; its size is 16..=SHORT_BYTES.
            unsafe { move_short(region, b.offset, dst, b.size) };
            continue;
        }
        if rn != 0 && rs + rn == b.offset {
            rn += b.size;
        } else {
            if rn != 0 {
                copy(rs, rd, rn);
            }
            (rs, rd, rn) = (b.offset, dst, b.size);
        }
    }
    if rn != 0 {
        copy(rs, rd, rn);
    }
}

/// Blocks of at most this many bytes (4 words) are copied one by one by
/// [`move_short`].
#[cfg(not(target_arch = "nvptx64"))]
const SHORT_BYTES: u64 = 4 * GRANULE;

/// Copies `n` bytes (16, 32, 48 or 64) from `region + s` down to `region + d`
/// (`d < s`, both 16-byte aligned; the ranges may overlap) without a branch,
/// as `memmove` copies short sizes: the first two and the last two words,
/// overlapping in the middle, all loaded before any is stored (so any overlap
/// of source and destination is fine), and stored by [`store_word`].
///
/// # Safety
/// Both ranges lie inside the allocation at `region`, and no one else
/// accesses them during the call.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn move_short(region: *mut u8, s: u64, d: u64, n: u64) {
    let last = (n / GRANULE) as usize - 1;
    let j = (last != 0) as usize;
    // SAFETY: the caller's contract; `Word16` is 16-byte aligned like both
    // addresses, and `j ≤ last < n / 16`.
    unsafe {
        let (src, dst) = (region.add(s as usize) as *const Word16, region.add(d as usize) as *mut Word16);
        let w = [src.read(), src.add(j).read(), src.add(last - j).read(), src.add(last).read()];
        store_word(dst, w[0]);
        store_word(dst.add(j), w[1]);
        store_word(dst.add(last - j), w[2]);
        store_word(dst.add(last), w[3]);
    }
}

/// Stores one word of a moved block: on x86-64 a non-temporal store
/// (`movntdq`, see [`move_down`]), elsewhere a plain one.
///
/// # Safety
/// `dst` is valid for a 16-byte write and 16-byte aligned.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn store_word(dst: *mut Word16, w: Word16) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; `Word16` and `__m128i` are both 16
    // bytes, and `movntdq` needs 16-byte alignment.
    unsafe {
        use core::arch::x86_64::{__m128i, _mm_stream_si128};
        _mm_stream_si128(dst as *mut __m128i, core::mem::transmute::<Word16, __m128i>(w))
    };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        dst.write(w)
    };
}

/// Runs of at most this many 16-byte words (4 KiB) are copied by
/// [`move_down`]'s own loop; longer ones by `memmove`.
#[cfg(not(target_arch = "nvptx64"))]
const STREAM_MAX_WORDS: usize = 256;

/// Copies `n` bytes from `region + s` down to `region + d` (`d < s`, both
/// 16-byte aligned, `n` a nonzero multiple of 16; the ranges may overlap).
///
/// Runs longer than [`STREAM_MAX_WORDS`] words go to `memmove`. Shorter ones
/// are copied word by word in ascending order, each word loaded before it is
/// stored (so a run that overlaps itself is copied right: the destination is
/// below the source), with [`store_word`]: on x86-64 a non-temporal store
/// (`movntdq`). A short store to a cached line first reads the line from
/// memory (a read for ownership); the destinations of a tile are one
/// ascending stretch, so streaming stores fill whole lines in the
/// write-combining buffers and that read is saved. Measured on the
/// 720,088-block `tiny` layout (2-core AMD EPYC VM, `gpuheap bench compact
/// --backend cpu --layout tiny --reps 31`), with [`move_short`]: move 2.8–3.2
/// ms against 4.0–5.5 ms before, compact/copy median 2.23 → 1.81 on a quiet
/// machine and 2.15 → 1.53 at load 7
/// (`bench/results/2026-12-02-7f46ca1-compaction-streaming-stores.md`). Long
/// runs streamed as well made `hole-at-start` slower in a trial (0.82–1.04 →
/// 1.04–1.16 × the copy), hence the limit. The stores are weakly ordered:
/// [`store_fence`] must run before another thread may read the destination.
///
/// # Safety
/// Both ranges lie inside the allocation at `region`, and no one else
/// accesses them during the call.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn move_down(region: *mut u8, s: u64, d: u64, n: u64) {
    let words = (n / GRANULE) as usize;
    // SAFETY: the caller's contract; `Word16` is 16-byte aligned like both
    // addresses, and every index is below `words`.
    unsafe {
        let (src, dst) = (region.add(s as usize) as *const Word16, region.add(d as usize) as *mut Word16);
        if words > STREAM_MAX_WORDS {
            core::ptr::copy(src, dst, words);
        } else {
            for i in 0..words {
                store_word(dst.add(i), src.add(i).read());
            }
        }
    }
}

/// Orders the streaming stores of [`store_word`] before the stores that
/// follow (on x86-64 an `sfence`; nothing elsewhere, where nothing streams):
/// a release store after it publishes them.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions (SSE, part of every x86-64).
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

/// The tiles `[lo, hi)` that tile `t` must see loaded before it stores
/// (itself excepted): every tile holding a moving byte whose source lies in
/// the range `[d0, d1)` that tile `t` writes. `dst` ascends with the source,
/// so such a byte goes at or after `dst_of_source(d0)` (the destination of the
/// first block byte at or after `d0`) and at or before
/// `dst_of_source(d1 - 1)`, and below `d1` (it moves down): `hi ≤ t + 1`
/// (hazard F2: a tile never waits for a later one). `(0, 0)` when no source
/// lies in the range. When the bytes move further than a tile, the range
/// ends well before `t`: those tiles loaded long ago.
///
/// # Safety
/// The addresses in `p` are valid and hold a plan; `t < ceil((p.end -
/// p.start) / p.tile_bytes)`.
#[inline(always)]
pub unsafe fn wait_range(p: &MoveParams, t: u64) -> (u64, u64) {
    let (d0, d1) = tile_range(p, t);
    // SAFETY: the caller's contract.
    let (first, last) = unsafe { (dst_of_source(p, d0), dst_of_source(p, d1 - 1)) };
    if first >= d1 {
        return (0, 0);
    }
    let tile = |d: u64| d.saturating_sub(p.start) / p.tile_bytes;
    (tile(first), tile(last).min(t) + 1)
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
    let tiles = p.end.saturating_sub(p.start).div_ceil(tb);
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
        // CPU emulator, one-lane warp: when every tile this one must wait for
        // has already loaded, copy straight from the sources to the
        // destinations (no staging) and publish "loaded" afterwards (it then
        // means "read and stored", all a waiter needs). This is correct
        // because (F1) no earlier tile writes this tile's sources, the tiles
        // whose sources this tile overwrites have read them, a later tile that
        // overwrites this tile's sources waits for this tile, and within the
        // tile each run's destination ends at or below the next run's source,
        // so an ascending memmove per run reads every byte before it is
        // overwritten. Otherwise the tile is staged as on a GPU, so that it
        // publishes "loaded" before it waits and a chain of dependent tiles
        // (one small hole before many blocks) still runs on every worker. (On
        // a GPU the lanes of a warp copy in parallel, so a run that overlaps
        // itself always needs the stage.)
        #[cfg(not(target_arch = "nvptx64"))]
        if w.lanes == 1 {
            // SAFETY: the plan is valid and `t < tiles`.
            let (lo, hi) = unsafe { wait_range(p, t) };
            if (lo..hi).all(|u| u == t || flag(u).load(Ordering::Acquire) == p.epoch) {
                // SAFETY: the plan is valid, `t` is this warp's tile, and its
                // sources may be overwritten now (above).
                unsafe { move_tile_direct(p, t, region) };
                // The tile's streaming stores before "loaded".
                store_fence();
                flag(t).store(p.epoch, Ordering::Release);
                continue;
            }
        }
        // 1. Load the tile's sources into this warp's stage.
        // SAFETY: runs lie inside moving blocks (sources) and the tile (stage).
        unsafe {
            for_each_run(p, t, true, |s, _, t_off, n| {
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
            let (lo, hi) = unsafe { wait_range(p, t) };
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
            for_each_run(p, t, false, |_, d, t_off, n| {
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
