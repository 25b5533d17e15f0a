//! Host wrappers of the basic kernels: fill/verify and the bump allocator.
//!
//! Each wrapper owns the launch geometry and the device addresses it passes,
//! so callers get a safe function that runs on either backend. A buffer
//! handed in is checked against the backend first (the owner rule of
//! [`crate::backend`]): one of another backend is a
//! [`BackendError::WrongBackend`], and nothing runs.

use gpuheap_kernels::bump::{BumpParams, BUMP_ALLOC};
use gpuheap_kernels::fill::{FillParams, VerifyParams, FILL, VERIFY};

use crate::backend::{Backend, BackendError, DeviceBuffer, LaunchConfig, LaunchTiming, Result};

/// Threads per block of the basic kernels.
pub const BLOCK: u32 = 256;

fn grid_stride_config(words: u64) -> Result<LaunchConfig> {
    // A grid-stride loop: cap the grid, each thread takes several words.
    LaunchConfig::for_threads(words.clamp(1, 1 << 22), BLOCK)
}

/// Writes `pattern(seed, i)` into every 4-byte word `i` of `buf`. Takes the
/// buffer mutably, so no other thread reads or writes it during the launch:
///
/// ```compile_fail,E0502
/// use gpuheap::backend::Backend;
/// let b = Backend::cpu();
/// let mut buf = b.alloc_zeroed(4096).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| gpuheap::ops::fill(&b, &mut buf, 1));
///     s.spawn(|| buf.read::<u32>()); // error[E0502]: read while filled
/// });
/// ```
///
/// # Errors
/// [`BackendError::WrongBackend`] when `buf` is not memory of `backend`; backend errors.
pub fn fill(backend: &Backend, buf: &mut DeviceBuffer, seed: u64) -> Result<LaunchTiming> {
    backend.check_owner("ops::fill", buf)?;
    let words = (buf.len() / 4) as u64;
    let p = FillParams { data: buf.device_ptr(), words, seed };
    // SAFETY: `data` addresses `words` u32 words of `buf`, a buffer of `backend` (checked), alive
    // for the launch and borrowed mutably: nobody else reads or writes it meanwhile.
    unsafe { backend.launch(&FILL, grid_stride_config(words)?, &p) }
}

/// Outcome of [`verify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Words that differ from the pattern.
    pub mismatches: u64,
    /// Lowest differing word index, if any.
    pub first_bad: Option<u64>,
}

/// Checks every word of `buf` against `pattern(seed, i)`.
///
/// # Errors
/// [`BackendError::WrongBackend`] when `buf` is not memory of `backend`; backend errors.
pub fn verify(backend: &Backend, buf: &DeviceBuffer, seed: u64) -> Result<(VerifyReport, LaunchTiming)> {
    backend.check_owner("ops::verify", buf)?;
    let words = (buf.len() / 4) as u64;
    let result = backend.upload(&[0u64, u64::MAX])?;
    let p = VerifyParams { data: buf.device_ptr(), words, seed, result: result.device_ptr() };
    // SAFETY: `data` addresses `words` words of `buf`, a buffer of `backend` (checked); `result` is
    // a [u64; 2] of `backend`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendError, BackendId, CpuBackend, CpuMode};

    /// A CPU backend (`Backend::cpu()`, [`BackendId::HOST`]) and a buffer of another owner: a CPU
    /// backend that claims the identity [`BackendId::test`]`(1)`.
    fn mismatch() -> (Backend, DeviceBuffer) {
        let other = Backend::Cpu(CpuBackend::with_test_id(CpuMode::Sequential, 1));
        let buf = other.alloc_zeroed(1024).unwrap();
        (Backend::cpu(), buf)
    }

    fn assert_wrong_backend<T: std::fmt::Debug>(r: Result<T>, name: &str) {
        match r {
            Err(e @ BackendError::WrongBackend { entry, buffer, backend }) => {
                assert_eq!((entry, buffer, backend), (name, BackendId::test(1), BackendId::HOST));
                assert!(e.to_string().starts_with(&format!("{name}: the buffer is memory of test owner 1")), "{e}");
            }
            other => panic!("{name}: expected WrongBackend, got {other:?}"),
        }
    }

    #[test]
    fn fill_refuses_a_buffer_of_another_backend() {
        let (backend, mut buf) = mismatch();
        assert_wrong_backend(fill(&backend, &mut buf, 7), "ops::fill");
        // Nothing ran: the buffer is still zero.
        assert!(buf.read::<u32>().unwrap().iter().all(|&w| w == 0));
        // The same buffer on its own backend is filled, and on a second CPU backend of the host
        // identity a host buffer is valid (every CPU backend is host memory).
        let own = Backend::cpu_lockstep();
        let mut host_buf = Backend::cpu().alloc_zeroed(1024).unwrap();
        fill(&own, &mut host_buf, 7).unwrap();
        assert_eq!(verify(&Backend::cpu(), &host_buf, 7).unwrap().0, VerifyReport { mismatches: 0, first_bad: None });
    }

    #[test]
    fn verify_refuses_a_buffer_of_another_backend() {
        let (backend, buf) = mismatch();
        assert_wrong_backend(verify(&backend, &buf, 7), "ops::verify");
    }
}
