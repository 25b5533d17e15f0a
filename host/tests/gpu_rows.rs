//! The GPU suite's rows for kernel authors' first questions (issue 40, item 6), each a test that
//! `scripts/gpu-suite run` starts on its own (one step, one progress line, its own time limit):
//! every size from 16 B to 1 MiB, an out-of-memory on a 1 GiB heap, an out-of-memory under churn,
//! and the throughput before and after an out-of-memory (the fast path comes back).
//!
//! GPU only: without a usable GPU each test prints why and passes with nothing launched, unless
//! `GPUHEAP_REQUIRE_GPU=1` (the suite sets it), when that is a failure. Each prints one `row` line
//! with what it measured.

mod common;

use std::collections::BTreeMap;

use gpuheap::backend::Backend;
use gpuheap::device_heap::ops::{self, Batch, Sizes};
use gpuheap::device_heap::DeviceHeap;
use gpuheap_kernels::heap::layout::{class_of, class_size, order_of, UNIT};

/// The block size a request really takes.
fn rounded(size: u64) -> u64 {
    class_of(size).map(class_size).unwrap_or(UNIT << order_of(size))
}

/// The non-null pointers of `batches` are 16-byte aligned, inside the data region and pairwise
/// disjoint with their rounded size; returns how many there are.
fn check_disjoint(heap: &DeviceHeap, batches: &[Batch], size: u64, what: &str) -> u64 {
    let r = rounded(size);
    let mut blocks = BTreeMap::new();
    for b in batches {
        for p in b.read_ptrs().unwrap().into_iter().filter(|&p| p != 0) {
            assert_eq!(p % 16, 0, "{what}: {p:#x} not 16-byte aligned");
            assert!(p >= heap.base() && p + r <= heap.base() + heap.capacity(), "{what}: {p:#x}+{r} outside the heap");
            assert!(blocks.insert(p, r).is_none(), "{what}: {p:#x} handed out twice");
        }
    }
    let mut end = 0;
    for (&p, &r) in &blocks {
        assert!(p >= end, "{what}: {p:#x} overlaps the previous block (ends {end:#x})");
        end = p + r;
    }
    blocks.len() as u64
}

fn check_fully_free(heap: &DeviceHeap, what: &str) {
    let s = heap.stats().unwrap();
    assert_eq!(s.bytes_in_use(), 0, "{what}: {s:?}");
    assert_eq!(s.accounted_bytes(), s.capacity, "{what}: {s:?}");
}

/// Allocations per second of a batch.
fn rate(b: &Batch) -> f64 {
    b.threads() as f64 / b.timing().elapsed.as_secs_f64().max(1e-9)
}

/// Allocates `size` in batches of `threads` without freeing until a batch comes back all null;
/// returns the batches and the last (all-null) batch's kernel time in ms.
fn fill_until_null(heap: &DeviceHeap, size: u64, threads: u64) -> (Vec<Batch>, f64) {
    let mut batches = Vec::new();
    for _ in 0..100_000 {
        let batch = ops::malloc_batch(heap, &Sizes::Uniform(size), threads, false).unwrap();
        let got = batch.read_ptrs().unwrap().iter().filter(|&&p| p != 0).count();
        let ms = batch.timing().ms();
        batches.push(batch);
        if got == 0 {
            return (batches, ms);
        }
    }
    panic!("{size} B never exhausted the heap");
}

fn gpu(test: &str) -> Option<Backend> {
    common::gpu_or_skip(test)
}

/// Every power of two from 16 B to 1 MiB on a 1 GiB heap: as many threads as fill a quarter of it
/// (at most 2^16), every pointer aligned and disjoint, every block written and read back, all
/// freed.
#[test]
fn row_sizes_16_b_to_1_mib() {
    let Some(b) = gpu("row_sizes_16_b_to_1_mib") else { return };
    let mut heap = DeviceHeap::new(&b, 1 << 30).unwrap();
    for shift in 4..=20 {
        let size = 1u64 << shift;
        let what = format!("{size} B");
        let threads = (heap.capacity() / 4 / rounded(size)).clamp(32, 1 << 16);
        let batch = ops::malloc_batch(&heap, &Sizes::Uniform(size), threads, false).unwrap();
        let per_s = rate(&batch);
        let ms = batch.timing().ms();
        let batches = [batch];
        assert_eq!(check_disjoint(&heap, &batches, size, &what), threads, "{what}: a quarter of the heap fits");
        let [batch] = batches;
        assert_eq!(ops::touch_batch(&mut heap, &batch, shift, false).unwrap(), 0);
        assert_eq!(ops::touch_batch(&mut heap, &batch, shift, true).unwrap(), 0, "{what}: blocks overlap");
        let free_ms = ops::free_batch(&heap, batch, 1).unwrap().ms();
        eprintln!(
            "row sizes: {size:>8} B x {threads:>6} threads: malloc {ms:.3} ms ({per_s:.3e}/s), free {free_ms:.3} ms"
        );
    }
    check_fully_free(&heap, "sizes");
}

/// A 1 GiB heap run dry by 4 KiB slots and by 64 KiB blocks (2^16 threads a batch): nulls come
/// back, the statistics count them with few searches and waits each, and everything is free
/// again after the frees.
#[test]
fn row_oom_on_a_1_gib_heap() {
    let Some(b) = gpu("row_oom_on_a_1_gib_heap") else { return };
    let heap = DeviceHeap::new(&b, 1 << 30).unwrap();
    for size in [4096u64, 64 << 10] {
        let what = format!("1 GiB heap, {size} B");
        let before = heap.stats().unwrap();
        let (batches, null_ms) = fill_until_null(&heap, size, 1 << 16);
        let ok = check_disjoint(&heap, &batches, size, &what);
        let s = heap.stats().unwrap();
        let failed = s.failed_requests - before.failed_requests;
        assert!(failed >= 1 << 16, "{what}: the last batch failed whole: {s:?}");
        assert!(ok * rounded(size) * 100 >= heap.capacity() * 95, "{what}: only {ok} blocks");
        let first_ms = batches[0].timing().ms();
        eprintln!(
            "row oom 1 GiB: {size} B: {ok} served, {failed} nulls; first batch {first_ms:.3} ms, all-null batch \
             {null_ms:.3} ms; searches/null {:.3}, waits/null {:.3}",
            s.searches_per_failure(),
            s.waits_per_failure()
        );
        for bt in batches {
            ops::free_batch(&heap, bt, 1).unwrap();
        }
        check_fully_free(&heap, &what);
    }
}

/// 2^16 threads churning 16 B to 64 KiB blocks (4 live each) on a 64 MiB heap: many requests
/// fail, none corrupts a block, every failure is counted, and all is free at the end.
#[test]
fn row_oom_under_churn() {
    let Some(b) = gpu("row_oom_under_churn") else { return };
    let mut heap = DeviceHeap::new(&b, 64 << 20).unwrap();
    let (threads, rounds) = (1 << 16, 20);
    let r = ops::churn(&mut heap, threads, rounds, (16, 64 << 10), 5, true).unwrap();
    assert_eq!(r.corrupted_words, 0, "{r:?}");
    assert_eq!(r.allocations + r.failures, threads * rounds, "{r:?}");
    assert!(r.failures > 0, "64 MiB cannot hold 2^16 x 4 blocks of up to 64 KiB: {r:?}");
    let s = heap.stats().unwrap();
    assert_eq!(s.failed_requests, r.failures, "{s:?}");
    eprintln!(
        "row oom under churn: {} served, {} nulls in {:.3} ms; searches/null {:.3}, waits/null {:.3}",
        r.allocations,
        r.failures,
        r.timing.ms(),
        s.searches_per_failure(),
        s.waits_per_failure()
    );
    check_fully_free(&heap, "churn");
}

/// 64 B allocations of 2^16 threads on a 256 MiB heap, timed (the best of 3 rounds of malloc and
/// free) before and after the heap is run dry by 64 B slots and everything is freed: the fast
/// path comes back (after an out-of-memory a class kept its `REFILLING` slot for good before
/// issue 40), so the rate after is at least a quarter of the rate before.
#[test]
fn row_recovery_after_oom() {
    let Some(b) = gpu("row_recovery_after_oom") else { return };
    let heap = DeviceHeap::new(&b, 256 << 20).unwrap();
    let (size, threads) = (64u64, 1u64 << 16);
    let best_rate = |heap: &DeviceHeap| {
        let mut best = 0f64;
        for _ in 0..3 {
            let batch = ops::malloc_batch(heap, &Sizes::Uniform(size), threads, false).unwrap();
            assert!(batch.read_ptrs().unwrap().iter().all(|&p| p != 0), "the heap holds 2^16 x 64 B");
            best = best.max(rate(&batch));
            ops::free_batch(heap, batch, 1).unwrap();
        }
        best
    };
    let before = best_rate(&heap);
    let (batches, _) = fill_until_null(&heap, size, threads);
    for bt in batches {
        ops::free_batch(&heap, bt, 1).unwrap();
    }
    check_fully_free(&heap, "after the out-of-memory");
    let after = best_rate(&heap);
    eprintln!("row recovery after oom: 64 B x 2^16 threads: {before:.3e}/s before, {after:.3e}/s after");
    assert!(after * 4.0 >= before, "the fast path did not come back: {before:.3e}/s before, {after:.3e}/s after");
}
