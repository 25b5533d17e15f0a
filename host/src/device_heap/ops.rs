//! Host wrappers of the heap's kernels (`gpuheap_kernels::heap::kernels`):
//! one launch each, safe to call, same code on both backends. The tests and
//! the benchmarks are written against these.

use gpuheap_kernels::heap::kernels::{
    ChurnParams, FreeParams, LoopParams, MallocParams, TouchParams, CHURN_LIVE, CUDA_FREE, CUDA_MALLOC, HEAP_CHURN,
    HEAP_FREE, HEAP_LOOP, HEAP_MALLOC, HEAP_TOUCH, NOOP,
};

use super::DeviceHeap;
use crate::backend::{Backend, BackendError, DeviceBuffer, LaunchConfig, LaunchTiming, Result};

/// Threads per block of the heap kernels (the survey's harness uses 256).
pub const BLOCK: u32 = 256;

/// Request sizes of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// Every thread asks for this many bytes.
    Uniform(u64),
    /// Thread `i` asks for `v[i]` bytes (`v.len()` = threads).
    PerThread(Vec<u64>),
}

/// One allocation per thread, kept on the device.
pub struct Batch {
    /// `threads` `u64` pointers (0 = null).
    pub ptrs: DeviceBuffer,
    /// Per-thread sizes, if not uniform.
    pub sizes: Option<DeviceBuffer>,
    /// The uniform size (when `sizes` is `None`).
    pub size: u64,
    /// Threads launched.
    pub threads: u64,
    /// Time of the allocation kernel.
    pub timing: LaunchTiming,
}

impl Batch {
    /// The pointers, copied to the host.
    pub fn read_ptrs(&self) -> Result<Vec<u64>> {
        self.ptrs.read()
    }

    /// The size of each thread's request.
    pub fn read_sizes(&self) -> Result<Vec<u64>> {
        match &self.sizes {
            Some(s) => s.read(),
            None => Ok(vec![self.size; self.threads as usize]),
        }
    }
}

fn u64s(threads: u64) -> Result<usize> {
    usize::try_from(threads)
        .ok()
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(|| BackendError::InvalidArgument(format!("{threads} threads")))
}

/// Which allocator a batch runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// gpuheap's device heap.
    Heap,
    /// CUDA's built-in device `malloc` (GPU only; raise its heap limit first).
    CudaMalloc,
}

/// Thread `i < threads` calls `malloc(size_i)` (warp-based: only threads
/// `i % 32 == 0`).
pub fn malloc_batch(
    backend: &Backend,
    heap: &DeviceHeap,
    sizes: &Sizes,
    threads: u64,
    warp_based: bool,
) -> Result<Batch> {
    malloc_batch_with(backend, heap, sizes, threads, warp_based, Allocator::Heap)
}

/// [`malloc_batch`] on a chosen allocator.
pub fn malloc_batch_with(
    backend: &Backend,
    heap: &DeviceHeap,
    sizes: &Sizes,
    threads: u64,
    warp_based: bool,
    alloc: Allocator,
) -> Result<Batch> {
    let ptrs = backend.alloc_zeroed(u64s(threads)?.max(8))?;
    let (sizes_buf, size) = match sizes {
        Sizes::Uniform(s) => (None, *s),
        Sizes::PerThread(v) => {
            if v.len() as u64 != threads {
                return Err(BackendError::InvalidArgument(format!("{} sizes for {threads} threads", v.len())));
            }
            (Some(backend.upload(v)?), 0)
        }
    };
    let p = MallocParams {
        heap: heap.handle(),
        sizes: sizes_buf.as_ref().map_or(0, |b| b.device_ptr()),
        size,
        threads,
        out: ptrs.device_ptr(),
        warp_mode: warp_based as u64,
    };
    let k = match alloc {
        Allocator::Heap => &HEAP_MALLOC,
        Allocator::CudaMalloc => &CUDA_MALLOC,
    };
    // SAFETY: the heap is alive (borrowed); `sizes` and `out` hold `threads` u64s.
    let timing = unsafe { backend.launch(k, LaunchConfig::for_threads(threads.max(1), BLOCK)?, &p)? };
    Ok(Batch { ptrs, sizes: sizes_buf, size, threads, timing })
}

/// Frees every pointer of `batch`: thread `i` frees `ptrs[(i * stride) % threads]`
/// (`stride` coprime with the thread count: other threads and blocks than
/// the allocating ones). Pointers are zeroed afterwards only in the sense
/// that the batch must not be freed again.
pub fn free_batch(backend: &Backend, heap: &DeviceHeap, batch: Batch, stride: u64) -> Result<LaunchTiming> {
    free_batch_with(backend, heap, batch, stride, Allocator::Heap)
}

/// [`free_batch`] on a chosen allocator.
pub fn free_batch_with(
    backend: &Backend,
    heap: &DeviceHeap,
    batch: Batch,
    stride: u64,
    alloc: Allocator,
) -> Result<LaunchTiming> {
    let p = FreeParams { heap: heap.handle(), ptrs: batch.ptrs.device_ptr(), threads: batch.threads, stride };
    let k = match alloc {
        Allocator::Heap => &HEAP_FREE,
        Allocator::CudaMalloc => &CUDA_FREE,
    };
    // SAFETY: the batch's pointers are live allocations of this heap (the
    // batch is consumed, so they are freed once).
    unsafe { backend.launch(k, LaunchConfig::for_threads(batch.threads.max(1), BLOCK)?, &p) }
}

/// Frees arbitrary pointers (tests of foreign, double and null frees).
///
/// # Safety
/// Each pointer is null or was returned by `malloc` on `heap`; double and
/// invalid frees are detected best-effort only (see
/// `gpuheap_kernels::heap`), so pass such pointers only to test that.
pub unsafe fn free_ptrs(backend: &Backend, heap: &DeviceHeap, ptrs: &[u64]) -> Result<LaunchTiming> {
    let buf = backend.upload(ptrs)?;
    let n = ptrs.len() as u64;
    let p = FreeParams { heap: heap.handle(), ptrs: buf.device_ptr(), threads: n, stride: 1 };
    // SAFETY: forwarded contract.
    unsafe { backend.launch(&HEAP_FREE, LaunchConfig::for_threads(n.max(1), BLOCK)?, &p) }
}

/// Writes (`verify = false`) the per-thread pattern over every byte-word of
/// every block of `batch`, or counts the words that differ from it.
pub fn touch_batch(backend: &Backend, batch: &Batch, seed: u64, verify: bool) -> Result<u64> {
    let errors = backend.alloc_zeroed(8)?;
    let p = TouchParams {
        ptrs: batch.ptrs.device_ptr(),
        sizes: batch.sizes.as_ref().map_or(0, |b| b.device_ptr()),
        size: batch.size,
        threads: batch.threads,
        seed,
        verify: verify as u64,
        errors: errors.device_ptr(),
    };
    // SAFETY: each non-null pointer is a live block of at least its size,
    // owned by its thread for this launch.
    unsafe { backend.launch(&HEAP_TOUCH, LaunchConfig::for_threads(batch.threads.max(1), BLOCK)?, &p)? };
    Ok(errors.read::<u64>()?[0])
}

/// Result of [`churn`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnReport {
    /// Successful allocations.
    pub allocations: u64,
    /// Null results.
    pub failures: u64,
    /// Pattern words found overwritten (must be 0).
    pub corrupted_words: u64,
    /// Kernel time.
    pub timing: LaunchTiming,
}

/// `threads` threads each run `rounds` rounds of verify-free-allocate-write
/// with sizes in `[min_size, max_size]` (see
/// `gpuheap_kernels::heap::kernels::churn_kernel`); with `free_at_end` every
/// block is verified and freed before the kernel ends.
pub fn churn(
    backend: &Backend,
    heap: &DeviceHeap,
    threads: u64,
    rounds: u64,
    (min_size, max_size): (u64, u64),
    seed: u64,
    free_at_end: bool,
) -> Result<ChurnReport> {
    let ring = u64s(threads * CHURN_LIVE)?;
    let live = backend.alloc_zeroed(ring)?;
    let live_sizes = backend.alloc_zeroed(ring)?;
    let counters = backend.alloc_zeroed(24)?;
    let p = ChurnParams {
        heap: heap.handle(),
        threads,
        rounds,
        min_size: min_size.max(4),
        max_size: max_size.max(min_size.max(4)),
        seed,
        live: live.device_ptr(),
        live_sizes: live_sizes.device_ptr(),
        counters: counters.device_ptr(),
        free_at_end: free_at_end as u64,
    };
    // SAFETY: the heap is alive; `live`/`live_sizes` hold `threads * CHURN_LIVE`
    // zeroed u64s and `counters` three.
    let timing = unsafe { backend.launch(&HEAP_CHURN, LaunchConfig::for_threads(threads.max(1), BLOCK)?, &p)? };
    let c: Vec<u64> = counters.read()?;
    Ok(ChurnReport { allocations: c[0], failures: c[1], corrupted_words: c[2], timing })
}

/// An empty kernel over `threads` threads: the launch floor.
pub fn noop(backend: &Backend, heap: &DeviceHeap, threads: u64) -> Result<LaunchTiming> {
    let p = MallocParams { heap: heap.handle(), sizes: 0, size: 0, threads, out: 0, warp_mode: 0 };
    // SAFETY: the kernel touches nothing.
    unsafe { backend.launch(&NOOP, LaunchConfig::for_threads(threads.max(1), BLOCK)?, &p) }
}

/// Result of [`alloc_free_loop`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopReport {
    /// Highest number of blocks outstanding at once.
    pub max_outstanding: u64,
    /// Outstanding counts above the limit or below zero, and overwritten stamps.
    pub violations: u64,
    /// Successful allocations.
    pub successes: u64,
    /// Null results.
    pub failures: u64,
    /// Outstanding blocks at the end (must be 0).
    pub outstanding_at_end: u64,
    /// Kernel time.
    pub timing: LaunchTiming,
}

/// BL-10(b): `threads` threads (in blocks of `block`) each allocate and free
/// a `size`-byte block `iters` times, counting outstanding blocks against
/// `limit` (see `gpuheap_kernels::heap::kernels::loop_kernel`).
pub fn alloc_free_loop(
    backend: &Backend,
    heap: &DeviceHeap,
    threads: u64,
    block: u32,
    iters: u64,
    size: u64,
    limit: u64,
) -> Result<LoopReport> {
    let counters = backend.upload(&[0u64, 0, 0, 0, 0, limit])?;
    let p = LoopParams { heap: heap.handle(), threads, iters, size, counters: counters.device_ptr() };
    // SAFETY: the heap is alive; `counters` holds six u64s.
    let timing = unsafe { backend.launch(&HEAP_LOOP, LaunchConfig::for_threads(threads.max(1), block)?, &p)? };
    let c: Vec<u64> = counters.read()?;
    Ok(LoopReport {
        max_outstanding: c[1],
        violations: c[2],
        successes: c[3],
        failures: c[4],
        outstanding_at_end: c[0],
        timing,
    })
}
