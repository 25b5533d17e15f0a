//! Host wrappers of the basic kernels: fill/verify and the bump allocator.
//!
//! Each wrapper owns the launch geometry and the device addresses it passes,
//! so callers get a safe function that runs on either backend.

use gpuheap_kernels::bump::{BumpParams, BUMP_ALLOC};
use gpuheap_kernels::fill::{FillParams, VerifyParams, FILL, VERIFY};

use crate::backend::{Backend, BackendError, DeviceBuffer, LaunchConfig, LaunchTiming, Result};

/// Threads per block of the basic kernels.
pub const BLOCK: u32 = 256;

fn grid_stride_config(words: u64) -> Result<LaunchConfig> {
    // A grid-stride loop: cap the grid, each thread takes several words.
    LaunchConfig::for_threads(words.clamp(1, 1 << 22), BLOCK)
}

/// Writes `pattern(seed, i)` into every 4-byte word `i` of `buf`.
///
/// # Errors
/// Backend errors; `InvalidArgument` when `buf` belongs to another backend is
/// not detectable, so pass buffers of `backend` only.
pub fn fill(backend: &Backend, buf: &DeviceBuffer, seed: u64) -> Result<LaunchTiming> {
    let words = (buf.len() / 4) as u64;
    let p = FillParams { data: buf.device_ptr(), words, seed };
    // SAFETY: `data` addresses `words` u32 words of `buf`, alive for the launch.
    unsafe { backend.launch(&FILL, grid_stride_config(words)?, &p) }
}

/// Outcome of [`verify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    /// Words that differ from the pattern.
    pub mismatches: u64,
    /// Lowest differing word index, if any.
    pub first_bad: Option<u64>,
}

/// Checks every word of `buf` against `pattern(seed, i)`.
pub fn verify(backend: &Backend, buf: &DeviceBuffer, seed: u64) -> Result<(VerifyReport, LaunchTiming)> {
    let words = (buf.len() / 4) as u64;
    let result = backend.upload(&[0u64, u64::MAX])?;
    let p = VerifyParams { data: buf.device_ptr(), words, seed, result: result.device_ptr() };
    // SAFETY: `data` addresses `words` words of `buf`; `result` is a [u64; 2].
    let t = unsafe { backend.launch(&VERIFY, grid_stride_config(words)?, &p)? };
    let r: Vec<u64> = result.read()?;
    Ok((VerifyReport { mismatches: r[0], first_bad: (r[1] != u64::MAX).then_some(r[1]) }, t))
}

/// Result of [`bump_alloc`].
#[derive(Clone, Debug)]
pub struct BumpRun {
    /// Offset of each thread's allocation in the buffer, `None` if it failed.
    pub offsets: Vec<Option<u64>>,
    /// Bytes the cursor advanced (including failed requests).
    pub cursor: u64,
    /// Kernel time.
    pub timing: LaunchTiming,
}

/// `threads` threads each take `size` bytes from a bump-allocated buffer of `capacity`
/// bytes (one atomic per warp; see `gpuheap_kernels::bump`).
pub fn bump_alloc(backend: &Backend, threads: u64, size: u64, capacity: u64) -> Result<BumpRun> {
    let n = usize::try_from(threads)
        .ok()
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(|| BackendError::InvalidArgument(format!("{threads} threads")))?;
    let cursor = backend.alloc_zeroed(8)?;
    let out = backend.alloc_zeroed(n)?;
    let p = BumpParams { cursor: cursor.device_ptr(), capacity, size, threads, out: out.device_ptr() };
    // SAFETY: `cursor` is one aligned u64, `out` holds `threads` u64s; both live.
    let timing = unsafe { backend.launch(&BUMP_ALLOC, LaunchConfig::for_threads(threads, BLOCK)?, &p)? };
    let offsets = out.read::<u64>()?.into_iter().map(|o| (o != u64::MAX).then_some(o)).collect();
    Ok(BumpRun { offsets, cursor: cursor.read::<u64>()?[0], timing })
}
