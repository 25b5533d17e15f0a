//! Fill and verify: a per-word pattern written and checked by every thread.
//!
//! The first end-to-end kernels: they prove that launch geometry, device
//! addresses and atomics agree between the GPU and the CPU backend, and the
//! allocator and compaction tests reuse [`pattern`] to detect overwrites.

use crate::arch::atomic::{AtomicU64, Ordering};
use crate::arch::index::{global_thread_id, grid_threads};

/// The 32-bit pattern word at index `i` for `seed` (a SplitMix64 finaliser,
/// so neighbouring words and seeds differ in about half their bits).
#[inline(always)]
pub fn pattern(seed: u64, i: u64) -> u32 {
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// Parameters of [`FILL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FillParams {
    /// Device address of `words` `u32` words (4-byte aligned).
    pub data: u64,
    /// Number of words.
    pub words: u64,
    /// Pattern seed.
    pub seed: u64,
}

/// Writes `pattern(seed, i)` to word `i` (grid-stride loop, any geometry).
///
/// # Safety
/// `p.data` addresses `p.words` writable `u32` words that no one else
/// accesses during the launch.
pub unsafe fn fill(p: &FillParams) {
    let data = p.data as *mut u32;
    let mut i = global_thread_id();
    let stride = grid_threads();
    while i < p.words {
        // SAFETY: `i < words`, within the caller's buffer.
        unsafe { data.add(i as usize).write(pattern(p.seed, i)) };
        i += stride;
    }
}

/// Parameters of [`VERIFY`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct VerifyParams {
    /// Device address of the words to check.
    pub data: u64,
    /// Number of words.
    pub words: u64,
    /// Pattern seed.
    pub seed: u64,
    /// Device address of a `[u64; 2]`: `[mismatch count, lowest bad index]`;
    /// initialise to `[0, u64::MAX]`.
    pub result: u64,
}

/// Counts the words that differ from `pattern(seed, i)` and records the lowest
/// such index.
///
/// # Safety
/// `p.data` addresses `p.words` readable words; `p.result` addresses a
/// writable, 8-byte aligned `[u64; 2]`.
pub unsafe fn verify(p: &VerifyParams) {
    let data = p.data as *const u32;
    let mut bad = 0u64;
    let mut first = u64::MAX;
    let mut i = global_thread_id();
    let stride = grid_threads();
    while i < p.words {
        // SAFETY: `i < words`, within the caller's buffer.
        if unsafe { data.add(i as usize).read() } != pattern(p.seed, i) {
            bad += 1;
            first = first.min(i);
        }
        i += stride;
    }
    if bad != 0 {
        let r = p.result as *mut u64;
        // SAFETY: the caller provides an aligned `[u64; 2]` used atomically.
        unsafe {
            AtomicU64::from_ptr(r).fetch_add(bad, Ordering::Relaxed);
            AtomicU64::from_ptr(r.add(1)).fetch_min(first, Ordering::Relaxed);
        }
    }
}

crate::kernel_entry! {
    /// [`fill`] as a kernel.
    pub static FILL: FillParams = gpuheap_fill => fill;
}
crate::kernel_entry! {
    /// [`verify`] as a kernel.
    pub static VERIFY: VerifyParams = gpuheap_verify => verify;
}
