//! What safe host code can do with the device heap's API (issue 40, item 4):
//! a handle of one region is `InvalidHandle` in every other region (host
//! verbs and device kernels alike), a free batch whose stride would not
//! visit each pointer exactly once is refused, and every size the host accepts is checked arithmetic, so any
//! `u64` gives a value or a typed error, never a panic (a proptest run in
//! the overflow-checked `ci` profile).

mod common;

use gpuheap::backend::{Backend, BackendError};
use gpuheap::compaction::{CompactHeap, CompactionError, Handle, HandleRegion};
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

/// Two regions whose first handles have the same table index: before
/// handles carried their region's tag, `a`'s handle named `b`'s live entry
/// (same index, same generation 1) and resolved, pinned and freed `b`'s
/// block. Every verb of the other region, the device's resolve (touch) and
/// the device's free now refuse it, and the owner's block is untouched.
#[test]
fn a_handle_of_another_region_is_invalid_there() {
    for b in common::backends("a_handle_of_another_region_is_invalid_there") {
        let what = format!("{b:?}");
        let mut a = DeviceHeap::with_movable(&b, 1 << 20, 64 << 10, 4).unwrap();
        let mut other = DeviceHeap::with_movable(&b, 1 << 20, 64 << 10, 4).unwrap();
        let h = a.movable().unwrap().alloc(1000).unwrap();
        let mine = other.movable().unwrap().alloc(1000).unwrap();
        assert_eq!(h.index(), mine.index(), "{what}: the same table index in both regions");
        assert_ne!(h, mine, "{what}: but not the same handle");
        let invalid = |r: Result<(), CompactionError>| matches!(r, Err(CompactionError::InvalidHandle(x)) if x == h);
        let mut m = other.movable().unwrap();
        assert!(invalid(m.resolve(h).map(drop)), "{what}: resolve");
        assert!(invalid(m.pin(h)), "{what}: pin");
        assert!(invalid(m.unpin(h)), "{what}: unpin");
        assert!(invalid(m.free(h)), "{what}: free");
        assert_eq!(m.touch_handles(&[h], 0, false).unwrap(), (0, 1), "{what}: the device resolved a foreign handle");
        assert_eq!(m.free_batch(&[h]).unwrap(), vec![false], "{what}: the device freed a foreign handle");
        assert_eq!(m.resolve(mine).unwrap().size, 1000, "{what}: the region's own block is still live");
        assert_eq!(m.stats().unwrap().live_handles, 1, "{what}");
        assert_eq!(a.movable().unwrap().resolve(h).unwrap().size, 1000, "{what}: and valid in its own region");
        // Host-managed regions: against each other and against the device heap's.
        let mut c = CompactHeap::new(&b, 64 << 10, 4).unwrap();
        let mut d = CompactHeap::new(&b, 64 << 10, 4).unwrap();
        let hc: Handle = c.alloc(512).unwrap();
        let hd = d.alloc(512).unwrap();
        assert_eq!(hc.index(), hd.index(), "{what}");
        assert!(matches!(d.resolve(hc), Err(CompactionError::InvalidHandle(_))), "{what}: host region");
        assert!(matches!(d.free(hc), Err(CompactionError::InvalidHandle(_))), "{what}: host region free");
        assert!(matches!(d.fill_on_device(hc, 1), Err(CompactionError::InvalidHandle(_))), "{what}: kernel resolve");
        assert!(matches!(other.movable().unwrap().resolve(hc), Err(CompactionError::InvalidHandle(_))), "{what}");
        assert!(matches!(c.resolve(mine), Err(CompactionError::InvalidHandle(_))), "{what}");
        assert_eq!(d.resolve(hd).unwrap().size, 512, "{what}");
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
