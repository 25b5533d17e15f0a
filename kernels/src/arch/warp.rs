//! Warp-level intrinsics: active mask, ballot, shuffle, match, warp barrier.
//!
//! On the GPU these are the `*.sync` PTX instructions (sm_70+). On the host
//! they meet the warp's other lanes in lockstep mode, meet exactly the lanes
//! of their mask in independent mode (an error, reported with the caller's
//! location, when a lane of the mask cannot arrive), or act on a one-lane
//! warp in sequential mode (see [`super::emu`]).
//!
//! # The `*.sync` contract
//!
//! Every `*.sync` operation ([`ballot`], [`shfl`], [`shfl_u64`],
//! [`match_any`], [`sync_warp`]; PTX ISA `vote.sync`, `shfl.sync`,
//! `match.sync`, `bar.warp.sync`) requires that the calling lane is in
//! `mask` and that every lane of `mask` executes the same operation with
//! the same mask; a lane of `mask` that has exited or never arrives is
//! undefined behaviour on the GPU (a hang, or garbage). No type can prove
//! that every lane of a mask reaches a given call, so these functions are
//! `unsafe fn`s with that contract under `# Safety`, and every call site
//! says why its mask is right (`SAFETY:`). The two ways the crate meets it:
//!
//! * **aggregation over [`active_mask`]**: the mask is taken by
//!   `active_mask()` in the same function, and every collective over it (or
//!   over a subset computed by a collective over it, like `match_any`'s
//!   peers) is reached by each lane of the mask on warp-uniform control flow
//!   (branch conditions are ballots or shuffled values), with no `return`
//!   in between;
//! * **the launched warp** ([`launch_mask`]): the lanes the launch created,
//!   in kernels whose whole body is warp-uniform.
//!
//! [`active_mask`], [`launch_mask`] and [`lanemask_lt`] have no contract and
//! stay safe. A collective in safe code does not compile:
//!
//! ```compile_fail,E0133
//! use gpuheap_kernels::arch::warp::{active_mask, ballot};
//! // error[E0133]: call to unsafe function `ballot` requires unsafe block
//! let votes = ballot(active_mask(), true);
//! ```

#[cfg(not(target_arch = "nvptx64"))]
use super::emu::{self, Op};
#[cfg(not(target_arch = "nvptx64"))]
use std::panic::Location;

/// Mask of the lanes executing this instruction together (`activemask.b32`).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn active_mask() -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: reads the active mask; no memory is touched.
        unsafe { core::arch::asm!("activemask.b32 {r};", r = out(reg32) r, options(nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    emu::active_mask(Location::caller())
}

/// Mask of the lanes of this thread's warp that the launch created: all 32
/// lanes, or lanes `0..blockDim % 32` in the last warp of a block whose size
/// is not a multiple of 32 (lane 0 alone for the one-lane warps of the CPU
/// sequential mode). Unlike [`active_mask`] it does not depend on which
/// lanes happen to execute together (on Volta and later that can be any
/// subset, and it is in the emulator's independent mode), so a warp that
/// cooperates as a whole names its lanes with it. The lanes it names are
/// alive until they return from the kernel; a collective over it is
/// well-formed when every lane of the warp reaches it (warp-uniform control
/// flow) before any of them returns.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn launch_mask() -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        use super::index::{block_dim_x, thread_idx_x};
        lanes_below(block_dim_x() - (thread_idx_x() & !(super::WARP_SIZE - 1)))
    }
    #[cfg(not(target_arch = "nvptx64"))]
    emu::launch_mask()
}

/// Mask of lanes `0..min(n, 32)`.
#[inline(always)]
pub(crate) fn lanes_below(n: u32) -> u32 {
    if n >= super::WARP_SIZE {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

/// Bit `l` is set iff lane `l` of `mask` has `pred` true (`vote.sync.ballot`).
///
/// # Safety
/// The calling lane is in `mask`, and every lane of `mask` executes this
/// same `ballot` with the same `mask` before any of them exits (see the
/// module's `*.sync` contract); otherwise the GPU's behaviour is undefined.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn ballot(mask: u32, pred: bool) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: a warp vote over `mask` (the caller's contract: every lane
        // of `mask` executes it); the predicate is materialised inside the
        // asm block because nvptx asm has no predicate register class.
        unsafe {
            core::arch::asm!(
                "{{ .reg .pred %p; setp.ne.u32 %p, {pred}, 0; vote.sync.ballot.b32 {r}, %p, {mask}; }}",
                r = out(reg32) r, pred = in(reg32) pred as u32, mask = in(reg32) mask, options(nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    match emu::warp_collective(Op::Ballot, mask, pred as u64, Location::caller()) {
        None => (pred as u32) & mask & 1,
        Some((vals, part)) => {
            (0..32).filter(|&l| part & mask & (1 << l) != 0 && vals[l as usize] != 0).fold(0, |m, l| m | 1 << l)
        }
    }
}

/// Value of `v` held by lane `src` (`shfl.sync.idx.b32`). When `src` is not
/// in `mask` the value is unspecified (PTX: undefined value; the emulator
/// returns the caller's own `v`), not undefined behaviour.
///
/// # Safety
/// As for [`ballot`]: the calling lane is in `mask`, and every lane of
/// `mask` executes this same `shfl` with the same `mask`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn shfl(mask: u32, v: u32, src: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: a warp shuffle between registers over `mask` (the
        // caller's contract); no memory is touched.
        unsafe {
            core::arch::asm!("shfl.sync.idx.b32 {r}, {v}, {src}, 31, {mask};",
                r = out(reg32) r, v = in(reg32) v, src = in(reg32) src, mask = in(reg32) mask, options(nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    match emu::warp_collective(Op::Shfl, mask, v as u64, Location::caller()) {
        None => v,
        Some((vals, part)) => {
            if part & (1 << (src & 31)) != 0 {
                vals[(src & 31) as usize] as u32
            } else {
                v
            }
        }
    }
}

/// 64-bit [`shfl`] (two shuffles).
///
/// # Safety
/// As for [`shfl`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn shfl_u64(mask: u32, v: u64, src: u32) -> u64 {
    // SAFETY: (both) the caller's contract: every lane of `mask` executes
    // this `shfl_u64`, hence both shuffles in the same order.
    let lo = unsafe { shfl(mask, v as u32, src) };
    // SAFETY: as above.
    let hi = unsafe { shfl(mask, (v >> 32) as u32, src) };
    (hi as u64) << 32 | lo as u64
}

/// Mask of the lanes in `mask` whose `v` equals this lane's (`match.any.sync.b32`).
///
/// # Safety
/// As for [`ballot`]: the calling lane is in `mask`, and every lane of
/// `mask` executes this same `match_any` with the same `mask`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn match_any(mask: u32, v: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: a warp match over `mask` (the caller's contract); no
        // memory is touched.
        unsafe {
            core::arch::asm!("match.any.sync.b32 {r}, {v}, {mask};",
                r = out(reg32) r, v = in(reg32) v, mask = in(reg32) mask, options(nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    match emu::warp_collective(Op::MatchAny, mask, v as u64, Location::caller()) {
        None => mask & 1,
        Some((vals, part)) => {
            (0..32).filter(|&l| part & mask & (1 << l) != 0 && vals[l as usize] as u32 == v).fold(0, |m, l| m | 1 << l)
        }
    }
}

/// Waits until every lane in `mask` reaches this point (`bar.warp.sync`);
/// orders the memory accesses of the lanes of `mask` before it with those
/// after it.
///
/// # Safety
/// As for [`ballot`]: the calling lane is in `mask`, and every lane of
/// `mask` executes this same `sync_warp` with the same `mask`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn sync_warp(mask: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a warp barrier; every lane in `mask` executes it (the
    // caller's contract).
    unsafe {
        core::arch::asm!("bar.warp.sync {mask};", mask = in(reg32) mask, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    emu::warp_collective(Op::SyncWarp, mask, 0, Location::caller());
}

/// Lane mask of the lanes below this one (`%lanemask_lt`).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn lanemask_lt() -> u32 {
    (1u32 << super::index::lane_id()) - 1
}
