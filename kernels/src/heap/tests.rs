//! Single-threaded unit tests of the protocols over a [`VecHeap`] (the
//! concurrent ones are in `loom_tests` and in the host crate's stress tests).

use std::collections::BTreeMap;
use std::vec::Vec;

use super::init::VecHeap;
use super::layout::*;
use super::*;

const BASE: u64 = 1 << 40;

fn heap(bytes: u64) -> VecHeap {
    VecHeap::new(bytes, BASE).unwrap()
}

/// The buddy state of a fresh heap, for "everything merged back" checks.
fn fresh_free_blocks(bytes: u64) -> Vec<(u64, u32)> {
    buddy::free_blocks(&heap(bytes))
}

/// A buddy block of order `k` through the allocator's search (the large
/// request path of `slab::acquire`): its first unit.
fn alloc_block(h: &VecHeap, k: u32) -> Option<u32> {
    slab::acquire(h, slab::LARGE + k, 0, 1).ok().map(|g| g.page())
}

fn check_summaries(h: &VecHeap) {
    for k in 0..=h.heap.max_order as u32 {
        buddy::level(h, k).check_summary(h).unwrap();
    }
    for c in 0..CLASSES {
        slab::avail(h, c).check_summary(h).unwrap();
    }
}

#[test]
fn init_decomposes_into_maximal_blocks() {
    let h = heap(11 * UNIT + 100);
    assert_eq!(buddy::free_blocks(&h), [(0, 3), (8, 1), (10, 0)]);
    check_summaries(&h);
}

#[test]
fn malloc_zero_is_null_and_free_null_is_noop() {
    let h = heap(1 << 20);
    assert_eq!(malloc_in(&h, 0), 0);
    free_in(&h, 0);
    assert_eq!(buddy::free_blocks(&h), fresh_free_blocks(1 << 20));
}

#[test]
fn small_allocations_are_disjoint_aligned_and_all_return() {
    let bytes = 16 << 20;
    let h = heap(bytes);
    let mut seen = BTreeMap::new();
    let mut ptrs = Vec::new();
    for (i, size) in [1u64, 16, 17, 33, 100, 256, 1000, 2048, 4096, 5000, 70_000].iter().cycle().take(500).enumerate() {
        let p = malloc_in(&h, *size);
        assert_ne!(p, 0, "allocation {i} of {size} B");
        assert_eq!(p % ALIGN, 0);
        assert!(p >= BASE && p + size <= BASE + h.heap.capacity);
        let rounded = class_of(*size).map(class_size).unwrap_or(UNIT << order_of(*size));
        // Overlap check against the neighbours in address order.
        if let Some((&q, &qs)) = seen.range(..=p).next_back() {
            assert!(q + qs <= p, "[{p:#x}+{rounded}) overlaps [{q:#x}+{qs})");
        }
        if let Some((&q, _)) = seen.range(p..).next() {
            assert!(p + rounded <= q, "[{p:#x}+{rounded}) overlaps [{q:#x}..)");
        }
        seen.insert(p, rounded);
        ptrs.push(p);
    }
    for p in ptrs {
        free_in(&h, p);
    }
    // Every page went back and everything merged (no current page kept,
    // because retirement skips only current pages, and scavenge is not
    // needed: check what is left).
    slab::scavenge_all(&h);
    assert_eq!(buddy::free_blocks(&h), fresh_free_blocks(bytes));
    check_summaries(&h);
}

#[test]
fn exhaustion_returns_null_then_memory_is_reusable_at_other_sizes() {
    let bytes = 1 << 20; // 16 pages
    let h = heap(bytes);
    for (first, second) in [(64u64, 4096u64), (4096, 64), (16, 1 << 19), (1 << 16, 48)] {
        let mut a = Vec::new();
        loop {
            let p = malloc_in(&h, first);
            if p == 0 {
                break;
            }
            a.push(p);
        }
        let expect = bytes / class_of(first).map(class_size).unwrap_or(first);
        assert_eq!(a.len() as u64, expect, "{first} B fills the heap exactly");
        for p in a {
            free_in(&h, p);
        }
        let mut b = Vec::new();
        loop {
            let p = malloc_in(&h, second);
            if p == 0 {
                break;
            }
            b.push(p);
        }
        let expect = bytes / class_of(second).map(class_size).unwrap_or(UNIT << order_of(second));
        assert_eq!(b.len() as u64, expect, "after freeing {first} B blocks, {second} B fills the heap");
        for p in b {
            free_in(&h, p);
        }
        slab::scavenge_all(&h);
        assert_eq!(buddy::free_blocks(&h), fresh_free_blocks(bytes));
    }
    check_summaries(&h);
}

#[test]
fn huge_and_boundary_sizes_fail_cleanly() {
    let h = heap(1 << 20);
    for s in [(1u64 << 20) + 1, 1 << 32, (1 << 32) + 16, u64::MAX, u64::MAX - 15] {
        assert_eq!(malloc_in(&h, s), 0, "{s}");
    }
    let p = malloc_in(&h, 1 << 20);
    assert_eq!(p, BASE, "the whole heap as one block");
    assert_eq!(malloc_in(&h, 16), 0);
    free_in(&h, p);
    assert_eq!(h.word(MetaSection::Ctrl, CTRL_FAILED as u64).load(crate::arch::atomic::Ordering::Relaxed), 6);
}

#[test]
fn double_and_invalid_frees_do_not_corrupt() {
    let h = heap(1 << 20);
    let a = malloc_in(&h, 32);
    let b = malloc_in(&h, 32);
    let big = malloc_in(&h, 10_000);
    free_in(&h, a);
    free_in(&h, a); // double (slab)
    free_in(&h, b + 8); // invalid: inside a slot
    free_in(&h, big + UNIT); // invalid: inside a large block
    free_in(&h, big);
    free_in(&h, big); // double (large)
    free_in(&h, BASE - 16); // outside
    free_in(&h, BASE + (1 << 30)); // outside
    free_in(&h, b);
    slab::scavenge_all(&h);
    assert_eq!(buddy::free_blocks(&h), fresh_free_blocks(1 << 20));
    let ctrl = |w: usize| h.word(MetaSection::Ctrl, w as u64).load(crate::arch::atomic::Ordering::Relaxed);
    if cfg!(feature = "debug-free") {
        assert_eq!(ctrl(CTRL_DOUBLE_FREES), 3, "slab double, large double, tag-less unit inside the large block");
        assert_eq!(ctrl(CTRL_INVALID_FREES), 3);
    } else {
        assert_eq!((ctrl(CTRL_DOUBLE_FREES), ctrl(CTRL_INVALID_FREES)), (0, 0));
    }
}

#[test]
fn buddy_split_and_merge_restore_the_initial_state() {
    let bytes = 64 * UNIT;
    let h = heap(bytes);
    let mut got = Vec::new();
    for k in [0u32, 3, 1, 0, 2, 4, 0] {
        let u = alloc_block(&h, k).unwrap() as u64;
        assert_eq!(u % (1 << k), 0, "blocks are aligned to their size");
        got.push((u, k));
    }
    let mut sorted = got.clone();
    sorted.sort();
    for w in sorted.windows(2) {
        assert!(w[0].0 + (1 << w[0].1) <= w[1].0, "{w:?} overlap");
    }
    for (u, k) in got.into_iter().rev() {
        buddy::free(&h, u as u32, k);
    }
    assert_eq!(buddy::free_blocks(&h), [(0, 6)]);
    assert_eq!(transit::in_flight(&h), 0, "nothing in flight");
}

/// The `current` entry of `class`'s slot 0 (the slot of every request here:
/// `sm_id()` is 0 outside a launch).
fn current_entry(h: &VecHeap, class: u32) -> u32 {
    use crate::arch::atomic::Ordering;
    h.word32(MetaSection32::Current, ((class * CURRENT_SLOTS) * CURRENT_STRIDE) as u64).load(Ordering::Relaxed)
}

/// Recovery after an out-of-memory, for every class: a refill whose search
/// ends in a scavenge that retires nothing (the kept current page is full
/// again) must still end the refill, or the slot stays `REFILLING` for the
/// heap's life and the class loses its fast path on it.
#[test]
fn a_null_after_a_scavenge_that_retires_nothing_ends_the_refill() {
    for class in 0..CLASSES {
        let h = heap(1 << 20); // 16 pages
        let size = class_size(class);
        let first = malloc_in(&h, size); // a page becomes the slot's current page
        assert_ne!(first, 0);
        let mut large = Vec::new();
        loop {
            let p = malloc_in(&h, 64 << 10);
            if p == 0 {
                break;
            }
            large.push(p);
        }
        assert_eq!(large.len(), 15, "class {class}: the buddy holds the other pages");
        free_in(&h, first); // the current page empties: kept (CTRL_KEPT = 1)
        let mut small = Vec::new();
        for _ in 0..class_slots(class) {
            let p = malloc_in(&h, size);
            assert_ne!(p, 0, "class {class}: the kept page serves again");
            small.push(p);
        }
        // Refill, the buddy is dry, the scavenge finds nothing, the check
        // is quiet: a null.
        assert_eq!(malloc_in(&h, size), 0, "class {class}");
        assert_ne!(current_entry(&h, class), slab::REFILLING, "class {class}: the null left its slot REFILLING");
        for p in small.into_iter().chain(large) {
            free_in(&h, p);
        }
        assert_eq!(buddy::free_blocks(&h), fresh_free_blocks(1 << 20), "class {class}: all back");
        // The next request refills the slot and installs its page.
        let p = malloc_in(&h, size);
        assert_ne!(p, 0);
        assert_eq!(current_entry(&h, class), ((p - BASE) >> PAGE_SHIFT) as u32 + 1, "class {class}: installed");
        check_summaries(&h);
    }
}
