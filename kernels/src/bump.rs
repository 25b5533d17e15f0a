//! A device-side bump allocator with one atomic per warp.
//!
//! Offsets grow monotonically from a shared cursor and are never reused: this
//! is the "speed of light" baseline of the allocation benchmarks (one
//! `atom.add` per group of lanes asking for the same size, nothing else).

use crate::arch::atomic::{AtomicU64, Ordering};
use crate::arch::index::{global_thread_id, lane_id};
use crate::arch::warp::{active_mask, lanemask_lt, match_any, shfl_u64};

/// Alignment of every bump allocation, bytes.
pub const BUMP_ALIGN: u64 = 16;

/// Takes `size` bytes (rounded up to [`BUMP_ALIGN`]) from `cursor`, a byte
/// offset into a buffer of `capacity` bytes. Lanes of the warp asking for the
/// same size share one atomic: the lowest such lane adds the group's total
/// and shuffles the base to the others.
///
/// Returns the offset, or `None` when the buffer is exhausted (the cursor
/// still advances, so later calls fail too) or `size` is 0.
#[inline(always)]
pub fn bump_alloc(cursor: &AtomicU64, capacity: u64, size: u64) -> Option<u64> {
    // Saturating, not `?`: every lane must reach the warp collectives below.
    let size = size.saturating_add(BUMP_ALIGN - 1) & !(BUMP_ALIGN - 1);
    let mask = active_mask();
    // Lanes asking for the same 64-bit size form one group.
    // SAFETY: (both) `mask` holds the lanes that executed the `active_mask`
    // above together, this one among them; nothing between it and here
    // branches or returns, so each of them executes these matches.
    let peers = unsafe { match_any(mask, size as u32) & match_any(mask, (size >> 32) as u32) };
    let leader = peers.trailing_zeros();
    let rank = (peers & lanemask_lt()).count_ones() as u64;
    let mut base = 0;
    if lane_id() == leader {
        base = cursor.fetch_add(size.saturating_mul(peers.count_ones() as u64), Ordering::Relaxed);
    }
    // SAFETY: unconditional; `peers` holds this lane and every lane of
    // `mask` with the same `size`, each of which got this same `peers` from
    // `match_any` and executes this shuffle.
    let base = unsafe { shfl_u64(peers, base, leader) };
    let off = base + rank * size;
    match off.checked_add(size) {
        Some(end) if size != 0 && end <= capacity => Some(off),
        _ => None,
    }
}

/// Parameters of [`BUMP_ALLOC`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BumpParams {
    /// Device address of the `u64` cursor (bytes handed out so far).
    pub cursor: u64,
    /// Buffer size in bytes.
    pub capacity: u64,
    /// Bytes per allocation.
    pub size: u64,
    /// Number of threads that allocate (thread `i < threads`).
    pub threads: u64,
    /// Device address of `threads` `u64` results: the offset, or `u64::MAX`
    /// when the buffer was exhausted.
    pub out: u64,
}

/// Each thread `i < threads` allocates `size` bytes and stores the offset.
///
/// # Safety
/// `cursor` addresses an 8-byte aligned `u64` used only atomically; `out`
/// addresses `threads` writable `u64`s.
pub unsafe fn bump_kernel(p: &BumpParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    // SAFETY: the caller provides an aligned cursor used only atomically.
    let cursor = unsafe { AtomicU64::from_ptr(p.cursor as *mut u64) };
    let r = bump_alloc(cursor, p.capacity, p.size).unwrap_or(u64::MAX);
    // SAFETY: `i < threads`, within `out`.
    unsafe { (p.out as *mut u64).add(i as usize).write(r) };
}

crate::kernel_entry! {
    /// [`bump_kernel`] as a kernel.
    pub static BUMP_ALLOC: BumpParams = gpuheap_bump_alloc => bump_kernel;
}
