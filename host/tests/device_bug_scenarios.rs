//! The device rows of DESIGN.md §3.9 as tests, on every
//! backend (CPU sequential, CPU lockstep warps, GPU when present).
//!
//! * BL-09 (alpaka-group/mallocMC#256): pages keep their chunk size after
//!   being emptied → later requests of another size starve.
//! * BL-10 (kokkos/kokkos#312, #452): an exhausted pool spins forever; an
//!   allocation completes on a superblock that is being recycled.
//! * BL-11 (HigherOrderCO/Bend#889): failing lanes share one chain, write
//!   outside the heap, and take seconds to report out-of-memory.

mod common;

use gpuheap::backend::Backend;
use gpuheap::device_heap::ops;
use gpuheap::device_heap::ops::Sizes;
use gpuheap::device_heap::DeviceHeap;
use gpuheap_kernels::heap::layout::PAGE;

fn is_lockstep(b: &Backend) -> bool {
    common::has_thread_per_lane(b)
}

/// BL-09: a heap of 2 pages; phase 1 fills both pages with 16-byte chunks
/// and frees them all; phase 2, one thread per block asks for 1 KiB. The
/// empty pages must have gone back to the unformatted pool, so phase 2
/// succeeds; a request that cannot be met returns null (the test ending is
/// the bounded-time check: nothing waits forever).
#[test]
fn bl_09_empty_pages_return_to_the_pool_for_other_sizes() {
    for b in common::backends("bl_09") {
        let what = format!("{b:?}");
        let heap = DeviceHeap::new(&b, 2 * PAGE).unwrap();
        // Phase 1: batches of 16 B until a batch gets nothing.
        let mut batches = Vec::new();
        let mut got = 0;
        loop {
            let batch = ops::malloc_batch(&heap, &Sizes::Uniform(16), 2048, false).unwrap();
            let n = batch.read_ptrs().unwrap().iter().filter(|&&p| p != 0).count();
            got += n;
            batches.push(batch);
            if n == 0 {
                break;
            }
            assert!(batches.len() < 100, "{what}: phase 1 never exhausted");
        }
        assert_eq!(got as u64, 2 * PAGE / 16, "{what}: both pages fully used by 16-byte chunks");
        let s = heap.stats().unwrap();
        assert_eq!((s.classes[0].pages, s.classes[0].slots_in_use), (2, 2 * PAGE / 16), "{what}");
        for batch in batches {
            ops::free_batch(&heap, batch, 5).unwrap();
        }
        // Phase 2: thread 0 of each of 32 blocks asks for 1 KiB (32 KiB in all).
        let blocks = 32u64;
        let threads = blocks * ops::BLOCK as u64;
        let sizes: Vec<u64> = (0..threads).map(|i| if i % ops::BLOCK as u64 == 0 { 1024 } else { 0 }).collect();
        let batch = ops::malloc_batch(&heap, &Sizes::PerThread(sizes), threads, false).unwrap();
        let ptrs = batch.read_ptrs().unwrap();
        assert_eq!(ptrs.iter().filter(|&&p| p != 0).count() as u64, blocks, "{what}: every 1 KiB request succeeds");
        let s = heap.stats().unwrap();
        assert_eq!(s.classes[6].slots_in_use, blocks, "{what}: served from the 1 KiB class");
        assert_eq!(s.classes[0].slots_in_use, 0, "{what}");
        // A request that cannot be met now (a 128 KiB block while 1 KiB slots
        // are live) returns null.
        let big = ops::malloc_batch(&heap, &Sizes::Uniform(2 * PAGE), 1, false).unwrap();
        assert_eq!(big.read_ptrs().unwrap(), [0], "{what}");
        ops::free_batch(&heap, batch, 3).unwrap();
        let s = heap.stats().unwrap();
        assert_eq!((s.bytes_in_use(), s.accounted_bytes()), (0, s.capacity), "{what}: {s:?}");
    }
}

/// BL-10(a): one 1 MiB superblock of 64 KiB blocks (16); 17 threads each
/// allocate one block at the same time: exactly 16 succeed and the 17th gets
/// null after a bounded number of retries (splits in flight are not mistaken
/// for exhaustion, and exhaustion is not waited on).
#[test]
fn bl_10a_seventeen_requests_for_sixteen_blocks() {
    for b in common::backends("bl_10a") {
        let what = format!("{b:?}");
        for round in 0..3 {
            let heap = DeviceHeap::new(&b, 1 << 20).unwrap();
            let batch = ops::malloc_batch(&heap, &Sizes::Uniform(64 << 10), 17, false).unwrap();
            let ptrs = batch.read_ptrs().unwrap();
            let ok: Vec<u64> = ptrs.iter().copied().filter(|&p| p != 0).collect();
            assert_eq!(ok.len(), 16, "{what} round {round}: {ptrs:x?}");
            let mut offs: Vec<u64> = ok.iter().map(|p| p - heap.base()).collect();
            offs.sort_unstable();
            assert_eq!(
                offs,
                (0..16).map(|i| i * (64 << 10)).collect::<Vec<_>>(),
                "{what}: the 16 blocks tile the heap"
            );
            assert_eq!(heap.stats().unwrap().failed_requests, 1, "{what}");
            ops::free_batch(&heap, batch, 1).unwrap();
            let s = heap.stats().unwrap();
            assert_eq!((s.free_bytes, s.large_blocks), (1 << 20, 0), "{what}: all 16 blocks free again");
        }
    }
}

/// BL-10(b): 32 threads loop allocate/free of a 64 KiB block of the same
/// 1 MiB superblock; the outstanding count (incremented after a successful
/// malloc, decremented before the free) never leaves [0, 16], no block is
/// handed to two threads at once (a stamp check), and everything is free at
/// the end. 10^5 iterations per thread in release builds.
#[test]
fn bl_10b_alloc_free_loop_never_exceeds_the_superblock() {
    for b in common::backends("bl_10b") {
        let what = format!("{b:?}");
        let heap = DeviceHeap::new(&b, 1 << 20).unwrap();
        let iters = match (&b, cfg!(debug_assertions)) {
            (Backend::Gpu(_), _) | (_, false) => 100_000,
            _ if is_lockstep(&b) => 2_000,
            _ => 20_000,
        };
        let iters = if is_lockstep(&b) && !cfg!(debug_assertions) { 20_000 } else { iters };
        // Blocks of one thread in sequential mode, so the threads interleave.
        let block = if is_lockstep(&b) { 32 } else { 1 };
        let r = ops::alloc_free_loop(&heap, 32, block, iters, 64 << 10, 16).unwrap();
        assert_eq!(r.violations, 0, "{what}: {r:?}");
        assert!(r.max_outstanding <= 16 && r.max_outstanding >= 1, "{what}: {r:?}");
        assert_eq!(r.outstanding_at_end, 0, "{what}");
        assert_eq!(r.successes + r.failures, 32 * iters, "{what}");
        assert!(r.successes > 0, "{what}");
        let s = heap.stats().unwrap();
        assert_eq!((s.free_bytes, s.large_blocks, s.bytes_in_use()), (1 << 20, 0, 0), "{what}: {s:?}");
        assert_eq!(s.failed_requests, r.failures, "{what}");
    }
}

/// BL-11: a heap of 4 pages; 64 threads each request one page at once:
/// exactly 4 succeed and the other 60 get null at once; the failure path
/// writes nothing into the heap (the data region stays all zero: the allocator
/// never writes the data region at all); after freeing the 4, all 64 ask again
/// with the same outcome, the heap intact. Reporting out-of-memory costs one
/// top-word load per buddy level, like a success (timings are printed, not
/// asserted).
#[test]
fn bl_11_failing_lanes_fail_fast_and_write_nothing() {
    for b in common::backends("bl_11") {
        let what = format!("{b:?}");
        let heap = DeviceHeap::new(&b, 4 * PAGE).unwrap();
        for round in 0..3 {
            let batch = ops::malloc_batch(&heap, &Sizes::Uniform(PAGE), 64, false).unwrap();
            let ptrs = batch.read_ptrs().unwrap();
            let ok = ptrs.iter().filter(|&&p| p != 0).count();
            assert_eq!(ok, 4, "{what} round {round}: {ptrs:x?}");
            let bytes: Vec<u8> = heap.data().read().unwrap();
            assert!(bytes.iter().all(|&x| x == 0), "{what}: something wrote into the data region");
            let s = heap.stats().unwrap();
            assert_eq!(s.failed_requests, 60 * (round + 1), "{what}");
            assert_eq!((s.large_blocks, s.free_bytes), (4, 0), "{what}: {s:?}");
            eprintln!("{what} round {round}: 64 requests, 60 failing, in {:.3} ms", batch.timing().ms());
            ops::free_batch(&heap, batch, 13).unwrap();
            let s = heap.stats().unwrap();
            assert_eq!((s.free_bytes, s.accounted_bytes()), (4 * PAGE, s.capacity), "{what}: {s:?}");
        }
    }
}

/// BL-26 (alpaka-group/mallocMC#69, PR#62): a heap of 2 pages (128 KiB) and
/// one launch whose requests fill it exactly, on a fresh heap: 8,192 threads
/// × 16 B, 4,096 × 32 B, 512 × 256 B, and 4 consecutive launches of 2,048
/// × 16 B. Every request succeeds (a null means the
/// heap is full, never a lost race: the guarantee of
/// `gpuheap_kernels::heap`'s module docs), the blocks are distinct and
/// tile the heap, and one more request gets null. 20 repetitions per
/// backend (2 in the thread-per-lane CPU modes).
#[test]
fn bl_26_a_heap_filled_exactly_by_one_launch_has_no_spurious_null() {
    // (slot size, requests per launch, launches)
    let cases: [(u64, u64, u64); 4] = [(16, 8192, 1), (32, 4096, 1), (256, 512, 1), (16, 2048, 4)];
    for b in common::backends("bl_26") {
        let what = format!("{b:?}");
        // 20 repetitions; 2 where each lane is an OS thread (8,192 threads
        // a launch), with another schedule per launch in independent mode.
        let reps = if is_lockstep(&b) { 2 } else { 20 };
        for rep in 0..reps {
            for &(size, n, launches) in &cases {
                let heap = DeviceHeap::new(&b, 2 * PAGE).unwrap();
                let mut ptrs = Vec::new();
                let mut batches = Vec::new();
                for _ in 0..launches {
                    let batch = ops::malloc_batch(&heap, &Sizes::Uniform(size), n, false).unwrap();
                    ptrs.extend(batch.read_ptrs().unwrap());
                    batches.push(batch);
                }
                let nulls = ptrs.iter().filter(|&&p| p == 0).count();
                let s = heap.stats().unwrap();
                assert_eq!(
                    nulls, 0,
                    "{what} rep {rep}: {launches} x {n} x {size} B into 128 KiB: {nulls} null(s), {} B still free, {s:?}",
                    2 * PAGE - s.bytes_in_use()
                );
                ptrs.sort_unstable();
                ptrs.dedup();
                assert_eq!(ptrs.len() as u64, n * launches, "{what}: a slot handed out twice");
                assert_eq!(s.bytes_in_use(), 2 * PAGE, "{what}: {s:?}");
                assert_eq!(s.failed_requests, 0, "{what}: {s:?}");
                let one_more = ops::malloc_batch(&heap, &Sizes::Uniform(size), 1, false).unwrap();
                assert_eq!(one_more.read_ptrs().unwrap(), [0], "{what}: a full heap returns null");
            }
        }
    }
}
