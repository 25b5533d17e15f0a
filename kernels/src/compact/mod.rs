//! Relocatable blocks: the device handle table and the in-place, parallel,
//! order-preserving sliding compaction.
//!
//! # Handle model
//!
//! A movable block is named by a *handle* (`u64`: generation in the high 32
//! bits, table index in the low 32), never by its address. The handle table
//! ([`handle`]) maps a handle to the block's current byte offset in its
//! region, its size and a pinned flag. A user kernel turns a handle into a
//! pointer with [`handle::resolve`] when it runs.
//!
//! Guarantees and rules:
//!
//! * **What moves:** the contents of live, unpinned blocks. A compaction
//!   slides them towards the start of their *segment* (see below), keeping
//!   their address order; their handles stay valid and resolve to the new
//!   place afterwards. Sizes, handles and contents never change.
//! * **What never moves:** pinned blocks (and, in the device heap, raw
//!   `malloc` blocks, which count as pinned). Nothing is moved *over* a pinned
//!   block: pinned blocks split the region into independent segments, and each
//!   segment's unpinned blocks slide to the segment's own start (the region
//!   start, or the end of the pinned block before them). Blocks before the
//!   first hole of their segment keep their offset too (they are not copied).
//! * **What a kernel must not do:** hold a pointer obtained from `resolve`
//!   (or from a host `device_ptr`) across a compaction, or run concurrently
//!   with one. Resolve at the start of each kernel, use the pointer inside that
//!   kernel only. Work queued before a compaction stays correct if it resolves
//!   its handle when it executes (bug scenario BL-16). A block whose address
//!   must stay fixed for longer (DMA, a pointer stored inside other data, work
//!   on another stream) must be pinned for that time.
//! * In the device heap, movable blocks live in the heap's *movable region*
//!   ([`movable`]: `handle_alloc`, `handle_free`, `resolve` beside raw `malloc`); raw
//!   `malloc` blocks are outside it and never move.
//! * After a compaction, all free space of each segment is one contiguous
//!   range at the segment's end; with no pinned blocks the region's free space
//!   is one range, so external fragmentation `1 − largest_free / total_free`
//!   is 0.
//!
//! # The layout and its granule
//!
//! A compaction takes a *layout*: the live blocks of a region as
//! [`LiveBlock`]s sorted by offset, disjoint, inside the region, with offsets
//! and sizes multiples of [`GRANULE`] (16 bytes; allocators round sizes up).
//! So every copy moves whole 16-byte words (`ld/st .v4.u32` on the GPU).
//!
//! # Algorithm (two launches, no scratch buffer proportional to the heap)
//!
//! 1. **Plan** ([`plan::PLAN`]): the new offset of every block by a
//!    single-pass parallel *segmented* exclusive prefix sum over the sizes in
//!    address order (decoupled look-back, Merrill & Garland, "Single-pass
//!    Parallel Prefix Scan with Decoupled Look-back", NVIDIA 2016). A pinned
//!    block resets the running sum to its own end, so the sums restart at each
//!    pinned block; a pinned block's new offset is its old offset. The same
//!    pass writes the new offsets into the handle table. A block *moves* iff
//!    its new offset differs from its offset.
//! 2. **Move** ([`mover::MOVE`]): the destination addresses from the first
//!    hole (no block before it moves) to the end of the last block are cut
//!    into tiles of `T` bytes; tile `t` owns the moving bytes whose
//!    destination lies in `[start + t·T, start + (t+1)·T)`. Each warp
//!    repeatedly takes the next tile id from an atomic counter (dynamic tile
//!    ids), finds the tile's first block by a binary search over the new
//!    offsets (which ascend with the blocks) and walks the layout from there
//!    (each later block's new offset follows from the layout by the plan's
//!    own recurrence, so a block costs one 24-byte read), **loads** the
//!    tile's sources (gathered runs of 16-byte words) into its slot of shared
//!    memory at their destination's offset in the tile, **publishes** "tile
//!    loaded" with a release store of the compaction's epoch into the tile's
//!    flag, **waits** with acquire loads until every earlier tile whose
//!    sources lie in this tile's destination range has published, then
//!    **stores** the tile's runs to their destinations (contiguous within a
//!    segment, coalesced). This is the in-place select of CUB
//!    (`agent_select_if.cuh`, `SelectPotentiallyInPlace`: "a store release
//!    when updating a tile state ... a load acquire when reading those tile
//!    states").
//!
//! ## Correctness (hazards F1/F2 of DESIGN.md §3.1)
//!
//! Every moving byte `x` has `dst(x) ≤ src(x)`, and the moving blocks keep
//! their order across the whole region: within a segment by the prefix sum;
//! across segments because a block's destination ends before the pinned
//! block that ends its segment, and every later block starts after it. So
//! `dst` is ascending in `src` over the moving bytes, and tiles, being
//! slices of the destination addresses, take the moving bytes in address
//! order.
//!
//! * **F1 (no read-after-write):** for moving bytes `y` before `x`,
//!   `dst(y) ≤ src(y) < src(x)`: an earlier
//!   byte's write never lands on a source that a later byte still has to
//!   read; so a tile never waits for a *later* tile, and no tile waits for
//!   any store (there is no second flag).
//! * **F2 (write-after-read, backwards only):** tile `t` writes inside
//!   `[d0, d1)`. A moving byte whose source lies in that range goes below
//!   `d1` (it moves down) and at or after the destination of the first block
//!   byte at or after `d0` and at or before that of the last byte below `d1`
//!   (`dst` ascends), two binary searches over the layout: so it belongs to a
//!   tile in `[lo, hi)`, `hi ≤ t + 1` (`mover::wait_range`). Tile `t`
//!   stores only after all those tiles other than itself have published
//!   "loaded", i.e. after every byte it overwrites has been read into some
//!   warp's shared memory. Self-overlap (a block, or a tile, whose new range
//!   overlaps its own old range) needs nothing extra: the whole tile is on
//!   chip before its first store.
//! * Bytes that do not move (pinned blocks, the prefix of each segment before
//!   its first hole) are neither read nor written; holes are never read, so
//!   poisoned holes cannot leak into live data. Only destination ranges are
//!   written, so the result is byte-identical to a sequential ascending
//!   `memmove` per block (the host reference).
//!
//! Memory ordering: the lanes' loads of a tile are ordered before the
//! leader's `st.release.gpu` of the flag by `bar.warp.sync`; a waiting
//! leader's `ld.acquire.gpu` of the flag is ordered before its lanes' stores
//! by the next `bar.warp.sync`. Sources are read with ordinary (coherent)
//! loads, never `ld.global.nc`: the data changes during the kernel.
//!
//! ## Forward progress
//!
//! Loading and publishing never wait; only storing waits, and only for tiles
//! with smaller ids. Tile ids come from an atomic counter, so a warp holding
//! tile `t` proves that every tile `u < t` was taken by a warp that had
//! already started, is resident, and will publish without waiting. By
//! induction on `t` every tile publishes and then stores. No grid barrier,
//! no cooperative launch and no assumption about how many blocks are
//! resident is needed. The plan scan has the same structure (a tile publishes
//! its aggregate before it looks back at smaller ids only).
//!
//! On the CPU backend the argument holds too: in sequential mode the blocks
//! run on the rayon pool and every emulated thread runs to completion on its
//! worker once started, so the owner of a smaller tile id is a running OS
//! thread; in lockstep mode blocks run one after another in the order in
//! which they take tile ids (an earlier block has finished all its tiles) and
//! the warps of the running block are concurrent OS threads; in independent
//! mode blocks also run one after another, and inside a block one emulated
//! thread runs at a time under the seeded scheduler. Spinning threads call
//! [`crate::arch::time::nanosleep`], which yields the OS thread (independent
//! mode: hands the token to another emulated thread) there.
//!
//! ## Warps
//!
//! Every kernel here cooperates per *launched* warp (`Warp::launched`:
//! the lanes the launch created, from the block size), never per
//! `active_mask()` group: a tile is one warp's unit of work, with one
//! shared-memory slot per warp and the tile's words split by lane rank. All
//! branches around the warp collectives are warp-uniform, so each
//! collective meets exactly the lanes of its mask on every GPU (Volta's
//! independent thread scheduling included) and in every CPU mode.
//!
//! ## Cost
//!
//! DRAM traffic is `2·M` bytes (the lower bound for a copying compaction),
//! plus the layout (24 bytes per block read by each of the two passes, the
//! new offsets written once) and one flag per tile. Extra memory: one `u64`
//! per block for the new offsets, one status word per scan tile, one `u32`
//! flag per move tile. Tiles span destination addresses, not moving bytes:
//! a tile over a pinned block, or over a segment's unmoved prefix after one,
//! holds nothing and costs its binary searches only.

pub mod handle;
pub mod movable;
pub mod mover;
pub mod plan;

use crate::arch::mem::{load_v4, store_v4};
#[cfg(doc)]
use crate::arch::warp::active_mask;
use crate::arch::warp::{lanemask_lt, launch_mask, shfl_u64};

/// Alignment and size unit of every block in a compactable layout, bytes.
pub const GRANULE: u64 = 16;

/// [`LiveBlock::flags`] bit: the block is pinned (never moves, splits the
/// region into segments).
pub const BLOCK_PINNED: u32 = 1;

/// One live block of a layout, as the compaction kernels read it.
///
/// A layout is a slice of these sorted by `offset`, disjoint, inside the
/// region, with `offset` and `size` multiples of [`GRANULE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LiveBlock {
    /// Byte offset of the block in the region.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// Index of the block's handle-table entry (the low 32 bits of its
    /// handle), or [`NO_HANDLE`].
    pub handle: u32,
    /// [`BLOCK_PINNED`] or 0.
    pub flags: u32,
}

/// [`LiveBlock::handle`] of a block that has no handle-table entry (its new
/// offset is only reported in the plan output).
pub const NO_HANDLE: u32 = u32::MAX;

impl LiveBlock {
    /// `true` when the block is pinned.
    #[inline(always)]
    pub fn pinned(&self) -> bool {
        self.flags & BLOCK_PINNED != 0
    }
}

/// A 16-byte word, the unit of every copy.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Word16(pub [u32; 4]);

/// The calling warp as the compaction kernels see it: every lane the launch
/// created in this thread's warp ([`launch_mask`]: 32 lanes on the GPU and
/// in the lockstep and independent CPU modes, one-lane warps in the CPU
/// sequential mode), never "whoever is active now".
///
/// The compaction kernels cooperate per warp: one warp takes one tile id,
/// stages it in the warp's slot of shared memory, and its lanes split the
/// tile's words by rank. That needs the same set of lanes, with the same
/// ranks, on every lane and for the whole kernel. [`active_mask`] cannot
/// give it: on Volta and later (and in the independent-thread-scheduling
/// emulation) it returns whichever lanes execute it together, any subset of
/// the warp, and different subsets of one warp would then act as separate
/// "warps" sharing one shared-memory slot and splitting tiles by different
/// lane counts.
#[derive(Clone, Copy)]
pub(crate) struct Warp {
    /// Participating lanes.
    pub mask: u32,
    /// Rank of this lane among them.
    pub rank: u32,
    /// Number of participating lanes.
    pub lanes: u32,
    /// Hardware lane of rank 0 (source of broadcasts).
    pub leader: u32,
}

impl Warp {
    /// The whole warp of the calling lane, as launched. Its lanes are
    /// `0..lanes`, so rank equals lane.
    ///
    /// The kernels using it keep warp-uniform control flow (every branch
    /// that encloses a collective depends only on launch parameters, the
    /// warp's slot, or values broadcast from the leader), so every lane of
    /// the mask reaches every collective and none returns early.
    #[inline(always)]
    pub fn launched() -> Self {
        let mask = launch_mask();
        Warp {
            mask,
            rank: (mask & lanemask_lt()).count_ones(),
            lanes: mask.count_ones(),
            leader: mask.trailing_zeros(),
        }
    }

    /// `true` on rank 0.
    #[inline(always)]
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// Hardware lane of rank `r` (ranks equal lanes in a full warp; the
    /// kernels are launched with whole warps).
    #[inline(always)]
    pub fn lane_of(&self, r: u32) -> u32 {
        self.leader + r
    }

    /// `v` of the leader, on every lane.
    ///
    /// # Safety
    /// Every lane of the warp (`self.mask`) makes this same call (warp-uniform
    /// control flow, see [`Warp::launched`]), as for
    /// [`shfl_u64`](crate::arch::warp::shfl_u64).
    #[inline(always)]
    pub unsafe fn broadcast(&self, v: u64) -> u64 {
        // SAFETY: the caller's contract; the calling lane is in `self.mask`
        // (its own launched warp).
        unsafe { shfl_u64(self.mask, v, self.leader) }
    }
}

/// The warp copies `n` 16-byte words from `src` to `dst` (non-overlapping);
/// each lane copies the words `rank, rank + lanes, …` (coalesced), eight
/// independent loads in flight per lane.
///
/// # Safety
/// `src` is readable and `dst` writable for `n` words, both 16-byte aligned,
/// the ranges do not overlap, and no one else writes them during the call.
#[inline(always)]
pub(crate) unsafe fn warp_copy(w: &Warp, dst: *mut Word16, src: *const Word16, n: usize) {
    #[cfg(not(target_arch = "nvptx64"))]
    if w.lanes == 1 {
        // A one-lane warp of the CPU emulator copies the run contiguously.
        // SAFETY: the caller's contract.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    let step = w.lanes as usize;
    let (s, d) = (src as *const [u32; 4], dst as *mut [u32; 4]);
    let mut i = w.rank as usize;
    // SAFETY: (whole loop) every index read or written is `< n`; `Word16` is
    // a 16-byte aligned `[u32; 4]`.
    unsafe {
        while i + 7 * step < n {
            let a0 = load_v4(s.add(i));
            let a1 = load_v4(s.add(i + step));
            let a2 = load_v4(s.add(i + 2 * step));
            let a3 = load_v4(s.add(i + 3 * step));
            let a4 = load_v4(s.add(i + 4 * step));
            let a5 = load_v4(s.add(i + 5 * step));
            let a6 = load_v4(s.add(i + 6 * step));
            let a7 = load_v4(s.add(i + 7 * step));
            store_v4(d.add(i), a0);
            store_v4(d.add(i + step), a1);
            store_v4(d.add(i + 2 * step), a2);
            store_v4(d.add(i + 3 * step), a3);
            store_v4(d.add(i + 4 * step), a4);
            store_v4(d.add(i + 5 * step), a5);
            store_v4(d.add(i + 6 * step), a6);
            store_v4(d.add(i + 7 * step), a7);
            i += 8 * step;
        }
        while i < n {
            store_v4(d.add(i), load_v4(s.add(i)));
            i += step;
        }
    }
}

/// Number of elements `≤ x` in the ascending array `a[0..n]` (binary search).
///
/// # Safety
/// `a` is readable for `n` elements.
#[inline(always)]
pub(crate) unsafe fn upper_bound(a: *const u64, n: u64, x: u64) -> u64 {
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        // SAFETY: `mid < n`.
        if unsafe { a.add(mid as usize).read() } <= x {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Number of blocks of `b[0..n]` whose offset is `< x` (binary search).
///
/// # Safety
/// `b` is readable for `n` blocks.
#[inline(always)]
pub(crate) unsafe fn blocks_below(b: *const LiveBlock, n: u64, x: u64) -> u64 {
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        // SAFETY: `mid < n`.
        if unsafe { (*b.add(mid as usize)).offset } < x {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}
