//! What safe host code can do with the device heap's API (issue 40, item 4):
//! a free batch whose stride would not visit each pointer exactly once is
//! refused, and every size the host accepts is checked arithmetic, so any
//! `u64` gives a value or a typed error, never a panic (a proptest run in
//! the overflow-checked `ci` profile).

mod common;

use gpuheap::backend::{Backend, BackendError};
use gpuheap::device_heap::ops::{self, Sizes};
use gpuheap::device_heap::DeviceHeap;
use gpuheap_kernels::heap::layout::{Heap, PAGE, UNIT};
use proptest::prelude::*;

/// 480 pointers freed with stride 3 would free 160 blocks three times each
/// and leave 320 allocated and unreachable: refused, nothing freed; a
/// coprime stride then frees them all.
#[test]
fn free_batch_refuses_a_stride_that_is_not_coprime_with_the_pointer_count() {
    for b in common::backends("free_batch_refuses_a_stride_that_is_not_coprime_with_the_pointer_count") {
        let what = format!("{b:?}");
        let heap = DeviceHeap::new(&b, 1 << 20).unwrap();
        for (stride, threads) in [(3u64, 480u64), (6, 480), (480, 480), (0, 1), (5, 480), (7, 480)] {
            let expect = matches!((stride, threads), (0, 1) | (7, 480));
            assert_eq!(ops::stride_visits_each_once(stride, threads), expect, "stride {stride}, {threads} pointers");
        }
        let batch = ops::malloc_batch(&heap, &Sizes::Uniform(64), 480, false).unwrap();
        let before = heap.stats().unwrap();
        assert_eq!(before.classes[2].slots_in_use, 480, "{what}");
        match ops::free_batch(&heap, batch, 3) {
            Err(BackendError::BadStride { entry, stride: 3, threads: 480 }) => assert_eq!(entry, "ops::free_batch"),
            other => panic!("{what}: stride 3 over 480 pointers: {other:?}"),
        }
        assert_eq!(heap.stats().unwrap(), before, "{what}: nothing was freed");
        let batch = ops::malloc_batch(&heap, &Sizes::Uniform(64), 480, false).unwrap();
        ops::free_batch(&heap, batch, 7).unwrap();
        assert_eq!(heap.stats().unwrap().classes[2].slots_in_use, 480, "{what}: the refused batch's blocks stay");
    }
}

/// The largest data region `DeviceHeap::new` accepts is far beyond what a
/// test may allocate, so sizes are either small or past the limit.
fn heap_bytes() -> impl Strategy<Value = u64> {
    prop_oneof![0..=(4u64 << 20), any::<u64>().prop_filter("past the largest region", |&b| Heap::layout(b).is_none())]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `DeviceHeap::with_movable(&backend, 1 MiB, u64::MAX, 1)` panicked on
    /// overflow: every movable size is accepted or refused with
    /// `InvalidArgument`, by the rule the docs state.
    #[test]
    fn with_movable_checks_every_size(movable in prop_oneof![any::<u64>(), 0..=(2u64 << 20), Just(u64::MAX)], handles in 0u32..64) {
        let b = Backend::cpu();
        match DeviceHeap::with_movable(&b, 1 << 20, movable, handles) {
            Ok(h) => {
                prop_assert!(movable > 0 && movable <= h.capacity() && handles > 0);
                prop_assert_eq!(h.stats().unwrap().movable_bytes, movable.div_ceil(UNIT) * UNIT);
            }
            Err(BackendError::InvalidArgument(_)) => prop_assert!(movable == 0 || movable > 1 << 20 || handles == 0),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }

    /// Any heap size: a heap (of at least 64 KiB, capacity rounded down to
    /// 4 KiB) or `InvalidArgument`.
    #[test]
    fn new_checks_every_size(bytes in heap_bytes()) {
        match DeviceHeap::new(&Backend::cpu(), bytes) {
            Ok(h) => prop_assert!(bytes >= PAGE && h.capacity() <= bytes && h.capacity() % UNIT == 0),
            Err(BackendError::InvalidArgument(_)) => prop_assert!(bytes < PAGE || Heap::layout(bytes).is_none()),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }

    /// Any request size and churn size range on the device: a block or
    /// null, no overflow in the kernels (which run with overflow checks here).
    #[test]
    fn device_sizes_never_overflow(size in any::<u64>(), lo in any::<u64>(), hi in any::<u64>(), handle_size in any::<u64>()) {
        let b = Backend::cpu();
        let mut heap = DeviceHeap::new(&b, 1 << 20).unwrap();
        let batch = ops::malloc_batch(&heap, &Sizes::Uniform(size), 1, false).unwrap();
        let p = batch.read_ptrs().unwrap()[0];
        prop_assert_eq!(p != 0, size > 0 && size <= heap.capacity());
        ops::free_batch(&heap, batch, 1).unwrap();
        let r = ops::churn(&mut heap, 4, 2, (lo, hi), 1, true).unwrap();
        prop_assert_eq!(r.corrupted_words, 0);
        let mut mh = DeviceHeap::with_movable(&b, 1 << 20, 1 << 19, 4).unwrap();
        let got = mh.movable().unwrap().alloc_batch(&[handle_size]).unwrap();
        prop_assert_eq!(got[0].is_some(), handle_size > 0 && handle_size <= 1 << 19);
    }
}
