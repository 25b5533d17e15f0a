//! Host wrappers of the heap's kernels (`gpuheap_kernels::heap::kernels`):
//! one launch each, safe to call, same code on both backends. The tests and
//! the benchmarks are written against these.
//!
//! Each runs on the heap's own backend ([`DeviceHeap::backend`]), so none
//! takes a `&Backend` (the owner rule of [`crate::backend`]). A [`Batch`] is
//! made by [`malloc_batch`] only and remembers the heap, the heap's
//! generation and its allocator: [`free_batch`] and [`touch_batch`] refuse a
//! batch of another heap, or of before the heap's last
//! [`reset`](DeviceHeap::reset) or [`rebuild`](DeviceHeap::rebuild), and
//! [`free_batch_with`] one of another allocator, whose pointers are no live
//! blocks there (freeing them would be a double or invalid free, touching
//! them a write into other blocks): a [`BackendError::ForeignBatch`] naming
//! the entry point.

use gpuheap_kernels::heap::kernels::{
    ChurnParams, FreeParams, LoopParams, MallocParams, TouchParams, CHURN_LIVE, CUDA_FREE, CUDA_MALLOC, HEAP_CHURN,
    HEAP_FREE, HEAP_LOOP, HEAP_MALLOC, HEAP_TOUCH, NOOP,
};

use super::DeviceHeap;
use crate::backend::{BackendError, DeviceBuffer, LaunchConfig, LaunchTiming, Result};

/// Threads per block of the heap kernels (the survey's harness uses 256).
#[doc(hidden)]
pub const BLOCK: u32 = 256;

/// Request sizes of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// Every thread asks for this many bytes.
    Uniform(u64),
    /// Thread `i` asks for `v[i]` bytes (`v.len()` = threads).
    PerThread(Vec<u64>),
}

/// One allocation per thread, kept on the device: what [`malloc_batch`] returned on one heap. Its
/// fields are private, so its pointers are always those the heap returned; it can be freed and
/// touched on that heap only, until the heap's next reset or rebuild (see the [module docs](self)).
pub struct Batch {
    /// `threads` `u64` pointers (0 = null).
    ptrs: DeviceBuffer,
    /// Per-thread sizes, if not uniform.
    sizes: Option<DeviceBuffer>,
    /// The uniform size (when `sizes` is `None`).
    size: u64,
    threads: u64,
    timing: LaunchTiming,
    /// [`DeviceHeap::generation`] of the heap that made it, then.
    generation: u64,
    /// The allocator that made it (its pointers are freed by the same one only).
    alloc: Allocator,
}

impl Batch {
    /// Threads launched (one pointer each).
    #[doc(hidden)]
    pub fn threads(&self) -> u64 {
        self.threads
    }

    /// Time of the allocation kernel.
    #[doc(hidden)]
    pub fn timing(&self) -> LaunchTiming {
        self.timing
    }

    /// The pointers, copied to the host (0 = null).
    pub fn read_ptrs(&self) -> Result<Vec<u64>> {
        self.ptrs.read()
    }

    /// The size of each thread's request.
    #[doc(hidden)]
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

/// Refuses a batch that `heap` did not make, or made before its last reset or rebuild.
fn check_batch(entry: &'static str, heap: &DeviceHeap, batch: &Batch) -> Result<()> {
    if batch.generation == heap.generation() {
        return Ok(());
    }
    Err(BackendError::ForeignBatch { entry, threads: batch.threads })
}

/// Which allocator a batch runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum Allocator {
    /// gpuheap's device heap.
    Heap,
    /// CUDA's built-in device `malloc` (GPU only; raise its heap limit first).
    CudaMalloc,
}

/// Thread `i < threads` calls `malloc(size_i)` (warp-based: only threads
/// `i % 32 == 0`).
///
/// # Errors
/// `InvalidArgument` when `sizes` is per thread and not `threads` long; backend errors.
pub fn malloc_batch(heap: &DeviceHeap, sizes: &Sizes, threads: u64, warp_based: bool) -> Result<Batch> {
    malloc_batch_with(heap, sizes, threads, warp_based, Allocator::Heap)
}

/// [`malloc_batch`] on a chosen allocator.
///
/// # Errors
/// As for [`malloc_batch`].
#[doc(hidden)]
pub fn malloc_batch_with(
    heap: &DeviceHeap,
    sizes: &Sizes,
    threads: u64,
    warp_based: bool,
    alloc: Allocator,
) -> Result<Batch> {
    let backend = heap.backend();
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
    // SAFETY: the heap is alive (borrowed) and of `backend`; `sizes` and `out` hold `threads` u64s
    // of `backend`.
    let timing = unsafe { backend.launch(k, LaunchConfig::for_threads(threads.max(1), BLOCK)?, &p)? };
    Ok(Batch { ptrs, sizes: sizes_buf, size, threads, timing, generation: heap.generation(), alloc })
}

/// Whether thread `i` freeing pointer `(i * stride) % threads` (the free kernels' mapping, a
/// `stride` of 0 read as 1) visits each of `threads` pointers exactly once: `stride` and
/// `threads` coprime.
#[doc(hidden)]
pub fn stride_visits_each_once(stride: u64, threads: u64) -> bool {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    threads <= 1 || gcd(stride.max(1) % threads, threads) == 1
}

/// Frees every pointer of `batch`: thread `i` frees `ptrs[(i * stride) % threads]`
/// (`stride` coprime with the thread count: other threads and blocks than
/// the allocating ones). The batch is consumed, so it is freed once.
///
/// # Errors
/// [`BackendError::ForeignBatch`] for a batch `heap` did not make, or made before its last reset
/// or rebuild; [`BackendError::BadStride`] for a stride that would free some pointers several
/// times and others never ([`stride_visits_each_once`]); backend errors. On either error nothing
/// was freed.
pub fn free_batch(heap: &DeviceHeap, batch: Batch, stride: u64) -> Result<LaunchTiming> {
    free_batch_on("ops::free_batch", heap, batch, stride, Allocator::Heap)
}

/// [`free_batch`] on a chosen allocator (the one that made the batch).
///
/// # Errors
/// As for [`free_batch`]; [`BackendError::ForeignBatch`] also when `alloc` is not the allocator
/// that made the batch.
#[doc(hidden)]
pub fn free_batch_with(heap: &DeviceHeap, batch: Batch, stride: u64, alloc: Allocator) -> Result<LaunchTiming> {
    free_batch_on("ops::free_batch_with", heap, batch, stride, alloc)
}

/// [`free_batch_with`], its batch check naming `entry`.
fn free_batch_on(
    entry: &'static str,
    heap: &DeviceHeap,
    batch: Batch,
    stride: u64,
    alloc: Allocator,
) -> Result<LaunchTiming> {
    check_batch(entry, heap, &batch)?;
    if alloc != batch.alloc {
        return Err(BackendError::ForeignBatch { entry, threads: batch.threads });
    }
    if !stride_visits_each_once(stride, batch.threads) {
        return Err(BackendError::BadStride { entry, stride, threads: batch.threads });
    }
    let backend = heap.backend();
    let p = FreeParams { heap: heap.handle(), ptrs: batch.ptrs.device_ptr(), threads: batch.threads, stride };
    let k = match alloc {
        Allocator::Heap => &HEAP_FREE,
        Allocator::CudaMalloc => &CUDA_FREE,
    };
    // SAFETY: the batch's pointers are live allocations of this heap, made since its last reset or
    // rebuild (checked; the fields are private, so they are what `malloc` returned), on `backend`;
    // the batch is consumed and the stride is a permutation (checked), so each is freed once.
    unsafe { backend.launch(k, LaunchConfig::for_threads(batch.threads.max(1), BLOCK)?, &p) }
}

/// Frees arbitrary pointers (tests of foreign, double and null frees).
///
/// # Safety
/// Each pointer is null or was returned by `malloc` on `heap`; double and
/// invalid frees are detected best-effort only (see
/// `gpuheap_kernels::heap`), so pass such pointers only to test that.
#[doc(hidden)]
pub unsafe fn free_ptrs(heap: &DeviceHeap, ptrs: &[u64]) -> Result<LaunchTiming> {
    let backend = heap.backend();
    let buf = backend.upload(ptrs)?;
    let n = ptrs.len() as u64;
    let p = FreeParams { heap: heap.handle(), ptrs: buf.device_ptr(), threads: n, stride: 1 };
    // SAFETY: forwarded contract.
    unsafe { backend.launch(&HEAP_FREE, LaunchConfig::for_threads(n.max(1), BLOCK)?, &p) }
}

/// Writes (`verify = false`) the per-thread pattern over every byte-word of
/// every block of `batch`, or counts the words that differ from it.
///
/// Takes the heap mutably: the launch writes its data region, so two threads
/// cannot touch the same blocks at once, nor read the data region
/// ([`DeviceHeap::data`]) while it is written. Two threads touching the
/// same batch at once do not compile:
///
/// ```compile_fail,E0499
/// use gpuheap::backend::Backend;
/// use gpuheap::device_heap::{ops, DeviceHeap};
/// let mut heap = DeviceHeap::new(&Backend::cpu(), 1 << 20).unwrap();
/// let batch = ops::malloc_batch(&heap, &ops::Sizes::Uniform(64), 256, false).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| ops::touch_batch(&mut heap, &batch, 1, false));
///     s.spawn(|| ops::touch_batch(&mut heap, &batch, 2, false)); // error[E0499]
/// });
/// ```
///
/// One thread at a time does (the same code, in sequence):
///
/// ```
/// use gpuheap::backend::Backend;
/// use gpuheap::device_heap::{ops, DeviceHeap};
/// let mut heap = DeviceHeap::new(&Backend::cpu(), 1 << 20).unwrap();
/// let batch = ops::malloc_batch(&heap, &ops::Sizes::Uniform(64), 256, false).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| ops::touch_batch(&mut heap, &batch, 1, false).unwrap());
/// });
/// assert_eq!(ops::touch_batch(&mut heap, &batch, 1, true).unwrap(), 0);
/// ```
///
/// # Errors
/// [`BackendError::ForeignBatch`] for a batch `heap` did not make, or made before its last reset
/// or rebuild; backend errors.
pub fn touch_batch(heap: &mut DeviceHeap, batch: &Batch, seed: u64, verify: bool) -> Result<u64> {
    check_batch("ops::touch_batch", heap, batch)?;
    let backend = heap.backend();
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
    // SAFETY: each non-null pointer is a live block of at least its size of this heap (checked: the
    // heap, borrowed, made the batch since its last reset or rebuild, on `backend`), owned by its
    // thread for this launch. The heap is borrowed mutably, so no other launch or host read of its
    // data region runs meanwhile (no two threads write, or read and write, the same block).
    unsafe { backend.launch(&HEAP_TOUCH, LaunchConfig::for_threads(batch.threads.max(1), BLOCK)?, &p)? };
    Ok(errors.read::<u64>()?[0])
}

/// Result of [`churn`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
#[doc(hidden)]
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
/// block is verified and freed before the kernel ends. Takes the heap
/// mutably: the kernel writes the data region (see [`touch_batch`]).
///
/// # Errors
/// `InvalidArgument` when `threads * CHURN_LIVE` pointers overflow the address space; backend
/// errors.
#[doc(hidden)]
pub fn churn(
    heap: &mut DeviceHeap,
    threads: u64,
    rounds: u64,
    (min_size, max_size): (u64, u64),
    seed: u64,
    free_at_end: bool,
) -> Result<ChurnReport> {
    let backend = heap.backend();
    let ring = u64s(threads.checked_mul(CHURN_LIVE).ok_or_else(|| {
        BackendError::InvalidArgument(format!("{threads} threads x {CHURN_LIVE} live blocks overflow"))
    })?)?;
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
    // SAFETY: the heap is alive and of `backend`; `live`/`live_sizes` hold `threads * CHURN_LIVE`
    // zeroed u64s and `counters` three, of `backend`.
    let timing = unsafe { backend.launch(&HEAP_CHURN, LaunchConfig::for_threads(threads.max(1), BLOCK)?, &p)? };
    let c: Vec<u64> = counters.read()?;
    Ok(ChurnReport { allocations: c[0], failures: c[1], corrupted_words: c[2], timing })
}

/// An empty kernel over `threads` threads on the heap's backend: the launch floor.
///
/// # Errors
/// Backend errors.
#[doc(hidden)]
pub fn noop(heap: &DeviceHeap, threads: u64) -> Result<LaunchTiming> {
    let backend = heap.backend();
    let p = MallocParams { heap: heap.handle(), sizes: 0, size: 0, threads, out: 0, warp_mode: 0 };
    // SAFETY: the kernel touches nothing.
    unsafe { backend.launch(&NOOP, LaunchConfig::for_threads(threads.max(1), BLOCK)?, &p) }
}

/// Result of [`alloc_free_loop`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
#[doc(hidden)]
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
///
/// # Errors
/// Backend errors (an invalid `block` included).
#[doc(hidden)]
pub fn alloc_free_loop(
    heap: &DeviceHeap,
    threads: u64,
    block: u32,
    iters: u64,
    size: u64,
    limit: u64,
) -> Result<LoopReport> {
    let backend = heap.backend();
    let counters = backend.upload(&[0u64, 0, 0, 0, 0, limit])?;
    let p = LoopParams { heap: heap.handle(), threads, iters, size, counters: counters.device_ptr() };
    // SAFETY: the heap is alive and of `backend`; `counters` holds six u64s of `backend`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, BackendId, CpuBackend, CpuMode};

    const BYTES: u64 = 4 << 20;

    /// 64 live 48-byte blocks of `heap` (the 64-byte size class, class 2).
    fn batch(heap: &DeviceHeap) -> Batch {
        malloc_batch(heap, &Sizes::Uniform(48), 64, false).unwrap()
    }

    fn in_use(heap: &DeviceHeap) -> u64 {
        heap.stats().unwrap().classes[2].slots_in_use
    }

    fn assert_foreign<T: std::fmt::Debug>(r: Result<T>, name: &str) {
        match r {
            Err(e @ BackendError::ForeignBatch { entry, threads: 64 }) => {
                assert_eq!(entry, name);
                assert!(e.to_string().starts_with(name), "{e}");
            }
            other => panic!("{name}: expected ForeignBatch, got {other:?}"),
        }
    }

    #[test]
    fn free_batch_refuses_a_batch_of_another_heap_or_of_before_a_reset() {
        let backend = Backend::cpu();
        let (mut a, b) = (DeviceHeap::new(&backend, BYTES).unwrap(), DeviceHeap::new(&backend, BYTES).unwrap());
        assert_foreign(free_batch(&b, batch(&a), 1), "ops::free_batch");
        assert_eq!((in_use(&a), in_use(&b)), (64, 0));
        let old = batch(&a);
        a.reset().unwrap();
        let live = batch(&a);
        assert_foreign(free_batch(&a, old, 1), "ops::free_batch");
        assert_eq!(in_use(&a), 64);
        free_batch(&a, live, 1).unwrap();
        assert_eq!(in_use(&a), 0);
    }

    #[test]
    fn free_batch_with_refuses_a_batch_of_another_allocator_or_heap() {
        let backend = Backend::cpu();
        let (a, b) = (DeviceHeap::new(&backend, BYTES).unwrap(), DeviceHeap::new(&backend, BYTES).unwrap());
        assert_foreign(free_batch_with(&a, batch(&a), 1, Allocator::CudaMalloc), "ops::free_batch_with");
        assert_foreign(free_batch_with(&b, batch(&a), 1, Allocator::Heap), "ops::free_batch_with");
        assert_eq!((in_use(&a), in_use(&b)), (128, 0));
    }

    #[test]
    fn touch_batch_refuses_a_batch_of_another_heap() {
        let backend = Backend::cpu();
        let (mut a, mut b) = (DeviceHeap::new(&backend, BYTES).unwrap(), DeviceHeap::new(&backend, BYTES).unwrap());
        let held = batch(&a);
        assert_foreign(touch_batch(&mut b, &held, 1, false), "ops::touch_batch");
        // On its own heap it writes, then verifies with no mismatch.
        assert_eq!(touch_batch(&mut a, &held, 1, false).unwrap(), 0);
        assert_eq!(touch_batch(&mut a, &held, 1, true).unwrap(), 0);
    }

    #[test]
    fn a_heap_and_its_batches_live_on_the_backend_it_was_made_on() {
        // A CPU backend of another identity than the host's: every buffer of the heap and of its
        // batches is its memory, and every wrapper launches there (none takes a `&Backend`).
        let other = Backend::Cpu(CpuBackend::with_test_id(CpuMode::Sequential, 1));
        let mut heap = DeviceHeap::new(&other, BYTES).unwrap();
        assert_eq!(heap.backend().id(), BackendId::test(1));
        assert_eq!(heap.data().owner(), BackendId::test(1));
        let b = batch(&heap);
        assert_eq!(b.ptrs.owner(), BackendId::test(1));
        assert!(b.read_ptrs().unwrap().iter().all(|&p| p != 0));
        assert_eq!(touch_batch(&mut heap, &b, 3, false).unwrap(), 0);
        noop(&heap, 32).unwrap();
        free_batch(&heap, b, 1).unwrap();
        assert_eq!(in_use(&heap), 0);
    }
}
