//! Compaction of the device heap's movable region (issue 5, integrated with
//! the device heap of issue 4) on every backend.
//!
//! Handles are allocated by kernels (`movable::handle_alloc`) and by the host, each
//! block is filled by a kernel that resolves its handle with a pattern
//! derived from the handle, raw `malloc` blocks of the same heap are filled
//! with their own patterns, frees make holes, and after a compaction every
//! test checks: every byte of every handle block (host read-back and a kernel
//! that resolves the handle on the device), every handle (host resolve and
//! the device table), that no two blocks overlap, that the layout equals the
//! one oracle `reference::plan_slide`, that the whole movable region equals
//! the reference sequential `memmove`, that raw `malloc` blocks and pinned
//! handles are unchanged in place, that the free space outside pinned
//! islands is one range at the end, that the bump cursor is there, and that
//! a second compaction moves nothing.

mod common;

use gpuheap::backend::Backend;
use gpuheap::compaction::{oracle, CompactionError, CompactionReport, Handle, HandleRegion};
use gpuheap::device_heap::ops::Sizes;
use gpuheap::device_heap::ops::{self, Batch};
use gpuheap::device_heap::DeviceHeap;
use gpuheap::testing::SplitMix64;
use gpuheap_kernels::compact::handle::{ENTRY_LIVE, ENTRY_PINNED};
use gpuheap_kernels::fill::pattern;

/// Runs `case` on every backend.
fn on_backends(test: &str, case: impl Fn(&Backend, &str)) {
    for b in common::backends(test) {
        let what = format!("{test} on {}", b.describe());
        case(&b, &what);
    }
}

/// Regression case found by the independent-thread-scheduling mode (seed 0):
/// after a heap compaction, the handle patterns check reported 4096 wrong
/// words (one 16 KiB move tile). The compaction kernels formed their warp
/// from `active_mask()`, so lanes of one warp that the scheduler split into
/// groups worked as separate "warps" staging different tiles in the same
/// shared-memory slot; they now use the launch's whole warp
/// (`arch::warp::launch_mask`). Run for seeds 0..8.
#[test]
fn its_seed_0_heap_compaction_keeps_handle_patterns() {
    for seed in 0..8 {
        its_seed_case(seed);
    }
}

fn its_seed_case(seed: u64) {
    let b = Backend::cpu_independent(seed);
    const KIB: u64 = 1024;
    let mut heap = DeviceHeap::with_movable(&b, 4 << 20, 1 << 20, 64).unwrap();
    let hs = [heap.movable().unwrap().alloc(128 * KIB).unwrap(), heap.movable().unwrap().alloc(256 * KIB).unwrap()];
    fill_handles(&mut heap, &hs);
    heap.movable().unwrap().free(hs[0]).unwrap();
    compact_and_check(&mut heap, &format!("ITS seed {seed}"));
}

use common::slide;

/// The bytes of the movable region.
fn movable_image(heap: &mut DeviceHeap) -> Vec<u8> {
    let mut img = vec![0u8; heap.movable().unwrap().capacity() as usize];
    let at = heap.data_offset() + (heap.movable().unwrap().base() - heap.base()) as usize;
    heap.data().read_into(at, &mut img).unwrap();
    img
}

/// Every live handle, in address order.
fn live_handles(heap: &mut DeviceHeap) -> Vec<Handle> {
    let m = heap.movable().unwrap();
    m.layout().unwrap().iter().map(|b| m.handle_of(b.handle).unwrap().unwrap()).collect()
}

/// Writes each handle's pattern over its block with the device kernel (which
/// resolves the handle when it runs).
fn fill_handles(heap: &mut DeviceHeap, hs: &[Handle]) {
    assert_eq!(
        heap.movable().unwrap().touch_handles(hs, 0, false).unwrap(),
        (0, 0),
        "fill: a live handle did not resolve"
    );
}

/// Checks every word of every live handle block, on the device (resolving
/// each handle) and on the host (read back through the host resolve).
fn check_handles(heap: &mut DeviceHeap, what: &str) {
    let hs = live_handles(heap);
    assert_eq!(
        heap.movable().unwrap().touch_handles(&hs, 0, true).unwrap(),
        (0, 0),
        "{what}: device check of the handle patterns"
    );
    for h in &hs {
        let bytes = heap.movable().unwrap().read(*h).unwrap();
        let words: &[u32] = bytemuck::cast_slice(&bytes);
        for (i, &w) in words.iter().enumerate() {
            assert_eq!(w, pattern(h.0, i as u64), "{what}: handle {h:?} word {i}");
        }
    }
}

/// Raw `malloc` blocks of the heap, filled with a per-thread pattern.
fn raw_blocks(heap: &DeviceHeap, sizes: Vec<u64>, seed: u64) -> Batch {
    let n = sizes.len() as u64;
    let batch = ops::malloc_batch(heap, &Sizes::PerThread(sizes), n, false).unwrap();
    assert!(batch.read_ptrs().unwrap().iter().all(|&p| p != 0), "raw malloc failed");
    assert_eq!(ops::touch_batch(heap, &batch, seed, false).unwrap(), 0);
    batch
}

/// Raw blocks never lie in the movable region.
fn assert_outside_movable(heap: &mut DeviceHeap, batch: &Batch, what: &str) {
    let (lo, hi) =
        (heap.movable().unwrap().base(), heap.movable().unwrap().base() + heap.movable().unwrap().capacity());
    for (p, s) in batch.read_ptrs().unwrap().into_iter().zip(batch.read_sizes().unwrap()) {
        assert!(p == 0 || p + s <= lo || p >= hi, "{what}: raw block {p:#x}+{s} inside the movable region");
    }
}

/// Compacts and checks everything (see the file docs); returns the report.
fn compact_and_check(heap: &mut DeviceHeap, what: &str) -> CompactionReport {
    let cap = heap.movable().unwrap().capacity();
    let before_layout = heap.movable().unwrap().layout().unwrap();
    let before = movable_image(heap);
    let handles = live_handles(heap);
    let report = heap.movable().unwrap().compact().unwrap_or_else(|e| panic!("{what}: compaction failed: {e}"));
    let after_layout = heap.movable().unwrap().layout().unwrap();
    let (expected, plan) = slide(&before_layout, cap);

    // Layout: the same blocks in the same order at plan_slide's offsets.
    assert_eq!(after_layout.len(), before_layout.len(), "{what}: live block count");
    for ((bl, a), &d) in before_layout.iter().zip(&after_layout).zip(&expected) {
        assert_eq!((a.handle, a.size, a.flags), (bl.handle, bl.size, bl.flags), "{what}: block order/identity");
        assert_eq!(a.offset, d, "{what}: block of handle index {} at {} instead of {d}", bl.handle, a.offset);
        if bl.pinned() {
            assert_eq!(a.offset, bl.offset, "{what}: a pinned handle moved");
        }
    }
    oracle::validate(&after_layout, cap).unwrap_or_else(|e| panic!("{what}: overlap: {e}"));
    // Handles: host resolve and the device table.
    let table = heap.movable().unwrap().read_table().unwrap();
    for (h, &d) in handles.iter().zip(&expected) {
        let info = heap.movable().unwrap().resolve(*h).unwrap();
        assert_eq!(info.offset, d, "{what}: host resolve of {h:?}");
        assert_eq!(heap.movable().unwrap().device_ptr(*h).unwrap(), heap.movable().unwrap().base() + d);
        let e = table[h.index() as usize];
        assert_eq!((e.offset, e.generation), (d, h.generation()), "{what}: device entry of {h:?}");
        assert!(e.flags & ENTRY_LIVE != 0);
        assert_eq!(e.flags & ENTRY_PINNED != 0, info.pinned, "{what}: pinned flag of {h:?}");
    }
    // Bytes: every handle block, and the whole movable region against the reference memmove.
    check_handles(heap, what);
    let after = movable_image(heap);
    let mut want = before.clone();
    oracle::apply(&mut want, &before_layout, &expected);
    if let Some(i) = want.iter().zip(&after).position(|(a, b)| a != b) {
        panic!("{what}: movable region differs from the reference memmove at byte {i}");
    }
    // Report.
    assert_eq!((report.bytes_moved, report.blocks_moved), (plan.bytes_moved, plan.blocks_moved as u64), "{what}");
    assert_eq!(report.blocks, before_layout.len() as u64);
    assert_eq!(report.after.free, report.before.free, "{what}: free bytes changed");
    assert_eq!(report.launches == 0, plan.bytes_moved == 0, "{what}: launches");
    // Free space: outside pinned islands, one range at the end; each other
    // range ends where a pinned block starts.
    let free = heap.movable().unwrap().free_ranges().unwrap();
    let pinned_starts: Vec<u64> = after_layout.iter().filter(|l| l.pinned()).map(|l| l.offset).collect();
    let end = after_layout.iter().map(|l| l.offset + l.size).max().unwrap_or(0);
    for &(o, l) in &free {
        assert!(o + l == cap || pinned_starts.contains(&(o + l)), "{what}: free range {o}+{l} is not a segment tail");
    }
    assert_eq!(free.iter().filter(|&&(o, l)| o + l == cap).count(), (end < cap) as usize, "{what}: tail range");
    if pinned_starts.is_empty() {
        assert!(free.len() <= 1 && report.after.external == 0.0, "{what}: free space not contiguous: {free:?}");
    }
    // The bump cursor is at the end of the last block.
    assert_eq!(heap.movable().unwrap().stats().unwrap().cursor, end, "{what}: bump cursor");
    report
}

/// Handle sizes from 1 byte to `max`, some of them large.
fn sizes(rng: &mut SplitMix64, n: usize, max: u64) -> Vec<u64> {
    (0..n).map(|_| if rng.below(10) == 0 { 1 + rng.below(8 * max) } else { 1 + rng.below(max) }).collect()
}

#[test]
fn kernel_and_host_handles_compact_to_plan_slide() {
    on_backends("kernel_and_host_handles", |b, what| {
        let mut rng = SplitMix64::new(5);
        let mut heap = DeviceHeap::with_movable(b, 16 << 20, 4 << 20, 8192).unwrap();
        // Raw blocks before and after the handle allocations, every size class and large.
        let raw1 = raw_blocks(&heap, (0..300).map(|i| 16 << (i % 10)).collect(), 77);
        let from_kernel: Vec<Handle> = heap
            .movable()
            .unwrap()
            .alloc_batch(&sizes(&mut rng, 3000, 1024))
            .unwrap()
            .into_iter()
            .map(|h| h.expect("handle_alloc"))
            .collect();
        let from_host: Vec<Handle> = (0..24).map(|i| heap.movable().unwrap().alloc(100 + i * 333).unwrap()).collect();
        let raw2 = raw_blocks(&heap, (0..200).map(|i| 48 + (i % 7) * 1000).collect(), 78);
        let all: Vec<Handle> = from_kernel.iter().chain(&from_host).copied().collect();
        fill_handles(&mut heap, &all);
        check_handles(&mut heap, what);
        // Holes: frees by a kernel and by the host; pins.
        let (mut kfree, mut pins) = (Vec::new(), Vec::new());
        for (i, h) in all.iter().enumerate() {
            match rng.below(10) {
                0..=3 => kfree.push(*h),
                4 if i % 3 == 0 => heap.movable().unwrap().free(*h).unwrap(),
                5 if pins.len() < 4 => pins.push(*h),
                _ => {}
            }
        }
        assert!(heap.movable().unwrap().free_batch(&kfree).unwrap().iter().all(|&ok| ok), "{what}: kernel frees");
        for h in &pins {
            heap.movable().unwrap().pin(*h).unwrap();
        }
        let pinned_at: Vec<u64> = pins.iter().map(|h| heap.movable().unwrap().resolve(*h).unwrap().offset).collect();
        let r = compact_and_check(&mut heap, what);
        assert!(r.blocks_moved > 0 && r.before.external > 0.0, "{what}: nothing to compact?");
        for (h, &at) in pins.iter().zip(&pinned_at) {
            assert_eq!(heap.movable().unwrap().resolve(*h).unwrap().offset, at, "{what}: pinned handle moved");
        }
        // Raw malloc blocks: unchanged in place, never inside the movable region.
        for (batch, seed) in [(&raw1, 77), (&raw2, 78)] {
            assert_eq!(ops::touch_batch(&heap, batch, seed, true).unwrap(), 0, "{what}: a raw block changed");
            assert_outside_movable(&mut heap, batch, what);
        }
        // A second compaction moves nothing.
        let r2 = compact_and_check(&mut heap, &format!("{what}, again"));
        assert_eq!((r2.blocks_moved, r2.bytes_moved, r2.launches), (0, 0, 0), "{what}");
        // After unpinning, new allocations land after the last block and a
        // compaction merges the islands.
        for h in &pins {
            heap.movable().unwrap().unpin(*h).unwrap();
        }
        let end = heap.movable().unwrap().stats().unwrap().cursor;
        let more: Vec<Handle> =
            heap.movable().unwrap().alloc_batch(&[64; 100]).unwrap().into_iter().map(|h| h.unwrap()).collect();
        assert!(
            more.iter().all(|h| heap.movable().unwrap().resolve(*h).unwrap().offset >= end),
            "{what}: allocation below the cursor"
        );
        fill_handles(&mut heap, &more);
        let r3 = compact_and_check(&mut heap, &format!("{what}, unpinned"));
        assert_eq!(r3.after.free_blocks, 1, "{what}");
        assert_eq!(ops::touch_batch(&heap, &raw1, 77, true).unwrap(), 0, "{what}");
    });
}

#[test]
fn pinned_handle_in_the_middle_with_holes_on_both_sides() {
    on_backends("pinned_middle", |b, what| {
        let mut heap = DeviceHeap::with_movable(b, 4 << 20, 1 << 20, 256).unwrap();
        let hs: Vec<Handle> = (0..60).map(|i| heap.movable().unwrap().alloc(256 + i * 32).unwrap()).collect();
        fill_handles(&mut heap, &hs);
        let pinned = hs[30];
        heap.movable().unwrap().pin(pinned).unwrap();
        heap.movable().unwrap().pin(pinned).unwrap();
        assert!(matches!(heap.movable().unwrap().free(pinned), Err(CompactionError::Pinned(_))));
        assert_eq!(
            heap.movable().unwrap().free_batch(&[pinned]).unwrap(),
            vec![false],
            "{what}: the device freed a pinned handle"
        );
        let frees: Vec<Handle> = [0, 5, 28, 29, 31, 32, 40, 59].iter().map(|&i| hs[i]).collect();
        assert!(heap.movable().unwrap().free_batch(&frees).unwrap().iter().all(|&ok| ok));
        let at = heap.movable().unwrap().resolve(pinned).unwrap().offset;
        let r = compact_and_check(&mut heap, what);
        assert_eq!(heap.movable().unwrap().resolve(pinned).unwrap().offset, at, "{what}: pinned handle moved");
        assert_eq!(r.after.free_blocks, 2, "{what}: one free range per segment");
        heap.movable().unwrap().unpin(pinned).unwrap();
        assert!(heap.movable().unwrap().resolve(pinned).unwrap().pinned, "{what}: pins nest");
        heap.movable().unwrap().unpin(pinned).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.after.free_blocks, r.after.external), (1, 0.0), "{what}");
    });
}

#[test]
fn stale_handles_are_detected() {
    on_backends("stale_handles", |b, what| {
        let mut heap = DeviceHeap::with_movable(b, 1 << 20, 64 << 10, 4).unwrap();
        let hs: Vec<Handle> = (0..4).map(|_| heap.movable().unwrap().alloc(1000).unwrap()).collect();
        fill_handles(&mut heap, &hs);
        let old = hs[1];
        heap.movable().unwrap().free(old).unwrap();
        // Freed: rejected by the host, by the device free and by the device resolve.
        assert!(matches!(heap.movable().unwrap().resolve(old), Err(CompactionError::InvalidHandle(_))));
        assert!(
            matches!(heap.movable().unwrap().free(old), Err(CompactionError::InvalidHandle(_))),
            "{what}: double free"
        );
        assert_eq!(heap.movable().unwrap().free_batch(&[old]).unwrap(), vec![false], "{what}: device double free");
        assert_eq!(
            heap.movable().unwrap().touch_handles(&[old], 0, true).unwrap(),
            (0, 1),
            "{what}: device resolved a freed handle"
        );
        // Handle 0 (skipped by the touch kernel, rejected by free), an index
        // out of range, a wrong generation.
        let forged = [Handle(0), Handle(99), Handle(hs[2].0 + (7 << 32))];
        assert_eq!(heap.movable().unwrap().touch_handles(&forged, 0, true).unwrap(), (0, 2), "{what}");
        assert_eq!(heap.movable().unwrap().free_batch(&forged).unwrap(), vec![false; 3], "{what}");
        // The table is full until a compaction reclaims the entry.
        assert!(matches!(heap.movable().unwrap().alloc(16), Err(CompactionError::TooManyHandles(4))), "{what}");
        assert_eq!(heap.movable().unwrap().alloc_batch(&[16]).unwrap(), vec![None], "{what}");
        compact_and_check(&mut heap, what);
        let new = heap.movable().unwrap().alloc(16).unwrap();
        assert_eq!(new.index(), old.index(), "{what}: the freed entry is reused");
        assert_ne!(new.generation(), old.generation(), "{what}: with a new generation");
        assert!(
            matches!(heap.movable().unwrap().resolve(old), Err(CompactionError::InvalidHandle(_))),
            "{what}: stale handle resolved"
        );
        assert_eq!(
            heap.movable().unwrap().touch_handles(&[old], 0, true).unwrap(),
            (0, 1),
            "{what}: stale handle on the device"
        );
        assert!(heap.movable().unwrap().resolve(new).is_ok());
        assert_eq!(
            heap.movable().unwrap().stats().unwrap().failed_requests,
            1,
            "{what}: the device failure is counted"
        );
    });
}

/// BL-01 in the device heap: the movable region is full, half of it is free in holes
/// smaller than the request; the request fails, and succeeds after a
/// compaction (raw `malloc` blocks are untouched).
#[test]
fn full_movable_region_accepts_a_large_handle_only_after_compaction() {
    on_backends("bl_01_heap", |b, what| {
        const KIB: u64 = 1024;
        let mut heap = DeviceHeap::with_movable(b, 1 << 20, 64 * KIB, 64).unwrap();
        let raw = raw_blocks(&heap, vec![4 * KIB; 16], 9);
        let mut hs: Vec<Handle> =
            heap.movable().unwrap().alloc_batch(&[4 * KIB; 16]).unwrap().into_iter().map(|h| h.unwrap()).collect();
        hs.sort_by_key(|h| heap.movable().unwrap().resolve(*h).unwrap().offset);
        fill_handles(&mut heap, &hs);
        assert!(
            heap.movable().unwrap().alloc_batch(&[16]).unwrap()[0].is_none(),
            "{what}: the movable region is not full"
        );
        let odd: Vec<Handle> = hs.iter().skip(1).step_by(2).copied().collect();
        assert!(heap.movable().unwrap().free_batch(&odd).unwrap().iter().all(|&ok| ok));
        match heap.movable().unwrap().alloc(32 * KIB) {
            Err(CompactionError::OutOfMemory { requested, total_free, largest_free }) => {
                assert_eq!((requested, total_free, largest_free), (32 * KIB, 32 * KIB, 4 * KIB), "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(
            heap.movable().unwrap().alloc_batch(&[32 * KIB]).unwrap()[0].is_none(),
            "{what}: the device request succeeded"
        );
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.before.external, r.after.external), (0.875, 0.0), "{what}");
        let big =
            heap.movable().unwrap().alloc_batch(&[32 * KIB]).unwrap()[0].expect("the request fails after compaction");
        assert_eq!(heap.movable().unwrap().resolve(big).unwrap().offset, 32 * KIB, "{what}");
        fill_handles(&mut heap, &[big]);
        check_handles(&mut heap, what);
        assert_eq!(ops::touch_batch(&heap, &raw, 9, true).unwrap(), 0, "{what}: a raw block changed");
    });
}

/// BL-16 (libsdl-org/SDL#15123) through the heap: an operation recorded
/// before a compaction resolves its handle when it executes, so it writes the
/// block at its new place, and the block that now occupies the old range is
/// not written.
#[test]
fn bl_16_pending_op_sees_its_block_after_heap_compaction() {
    on_backends("bl_16_heap", |b, what| {
        const KIB: u64 = 1024;
        let mut heap = DeviceHeap::with_movable(b, 4 << 20, 1 << 20, 64).unwrap();
        let hs = [heap.movable().unwrap().alloc(128 * KIB).unwrap(), heap.movable().unwrap().alloc(256 * KIB).unwrap()];
        let (before, h) = (hs[0], hs[1]);
        fill_handles(&mut heap, &hs);
        // The pending operation P = "write pattern seed S into H", recorded, not run.
        let pending = (h, 0xABCD_u64);
        heap.movable().unwrap().free(before).unwrap();
        let x = heap.movable().unwrap().resolve(h).unwrap().offset;
        compact_and_check(&mut heap, what);
        let y = heap.movable().unwrap().resolve(h).unwrap().offset;
        assert!(y < x, "{what}: H did not move");
        // A new block lands on H's old range.
        let other = heap.movable().unwrap().alloc(256 * KIB).unwrap();
        let o = heap.movable().unwrap().resolve(other).unwrap().offset;
        assert!(o < x + 256 * KIB && o + 256 * KIB > x, "{what}: the new block does not reuse H's old range");
        fill_handles(&mut heap, &[other]);
        // Run P now: it resolves H on the device.
        assert_eq!(heap.movable().unwrap().touch_handles(&[pending.0], pending.1, false).unwrap(), (0, 0));
        assert_eq!(
            heap.movable().unwrap().touch_handles(&[pending.0], pending.1, true).unwrap(),
            (0, 0),
            "{what}: P's write is not in H"
        );
        let bytes = heap.movable().unwrap().read(h).unwrap();
        let words: &[u32] = bytemuck::cast_slice(&bytes);
        assert!(words.iter().enumerate().all(|(i, &w)| w == pattern(h.0 ^ pending.1, i as u64)), "{what}");
        assert_eq!(
            heap.movable().unwrap().touch_handles(&[other], 0, true).unwrap(),
            (0, 0),
            "{what}: P wrote H's old range"
        );
    });
}

#[test]
fn empty_movable_region_and_no_holes() {
    on_backends("empty_and_packed", |b, what| {
        let mut heap = DeviceHeap::with_movable(b, 1 << 20, 256 << 10, 1024).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks, r.launches, r.after.free_blocks), (0, 0, 1), "{what}");
        let mut hs: Vec<Handle> = heap
            .movable()
            .unwrap()
            .alloc_batch(&(1..200).collect::<Vec<u64>>())
            .unwrap()
            .into_iter()
            .map(|h| h.unwrap())
            .collect();
        hs.sort_by_key(|h| heap.movable().unwrap().resolve(*h).unwrap().offset);
        fill_handles(&mut heap, &hs);
        let img = movable_image(&mut heap);
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks_moved, r.bytes_moved, r.launches), (0, 0, 0), "{what}");
        assert_eq!(movable_image(&mut heap), img, "{what}: a packed movable region changed");
        // Freeing the last blocks only moves the cursor back.
        let tail: Vec<Handle> = hs[150..].to_vec();
        heap.movable().unwrap().free_batch(&tail).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks_moved, r.launches), (0, 0), "{what}");
        // Everything freed: the movable region is empty again.
        heap.movable().unwrap().free_batch(&hs[..150]).unwrap();
        compact_and_check(&mut heap, what);
        assert_eq!(heap.movable().unwrap().stats().unwrap().cursor, 0, "{what}");
    });
}

/// Many warps allocate concurrently until the movable region runs out: the handles
/// that succeed are disjoint and complete, the others are counted, and
/// compaction after random frees matches the oracle.
#[test]
fn concurrent_handle_alloc_until_exhaustion() {
    on_backends("concurrent_handle_alloc", |b, what| {
        let mut rng = SplitMix64::new(31);
        let cap = 1 << 20;
        let mut heap = DeviceHeap::with_movable(b, 4 << 20, cap, 16384).unwrap();
        let req = sizes(&mut rng, 8000, 256);
        let got = heap.movable().unwrap().alloc_batch(&req).unwrap();
        let ok: Vec<Handle> = got.iter().flatten().copied().collect();
        let failed = got.iter().filter(|h| h.is_none()).count() as u64;
        let asked: u64 = req.iter().map(|s| s.div_ceil(16) * 16).sum();
        assert!(asked > cap && failed > 0, "{what}: the movable region did not run out");
        let st = heap.movable().unwrap().stats().unwrap();
        assert_eq!((st.live_handles, st.failed_requests), (ok.len() as u64, failed), "{what}");
        assert!(st.live_bytes > cap * 3 / 4, "{what}: only {} of {cap} bytes handed out", st.live_bytes);
        for (h, s) in got.iter().zip(&req) {
            if let Some(h) = h {
                assert_eq!(heap.movable().unwrap().resolve(*h).unwrap().size, *s, "{what}");
            }
        }
        oracle::validate(&heap.movable().unwrap().layout().unwrap(), cap).unwrap_or_else(|e| panic!("{what}: {e}"));
        fill_handles(&mut heap, &ok);
        check_handles(&mut heap, what);
        let frees: Vec<Handle> = ok.iter().filter(|_| rng.below(2) == 0).copied().collect();
        heap.movable().unwrap().free_batch(&frees).unwrap();
        compact_and_check(&mut heap, what);
        let again = heap.movable().unwrap().alloc_batch(&req[..500]).unwrap();
        assert!(again.iter().all(|h| h.is_some()), "{what}: room after compaction");
    });
}

#[test]
fn movable_arena_is_outside_the_buddy() {
    let b = Backend::cpu();
    let mut heap = DeviceHeap::with_movable(&b, 1 << 20, 100_000, 16).unwrap();
    assert_eq!(heap.movable().unwrap().capacity(), 25 * 4096, "rounded up to 4 KiB");
    let s = heap.stats().unwrap();
    assert_eq!((s.movable_bytes, s.free_bytes, s.accounted_bytes()), (25 * 4096, (1 << 20) - 25 * 4096, 1 << 20));
    assert!(heap.live_blocks().unwrap().is_empty(), "the movable region is not a large block");
    // Raw malloc never returns movable-region memory, even when the rest is exhausted.
    let raw = ops::malloc_batch(&heap, &Sizes::Uniform(4096), 300, false).unwrap();
    assert_outside_movable(&mut heap, &raw, "exhaustion");
    let got = raw.read_ptrs().unwrap().iter().filter(|&&p| p != 0).count() as u64;
    assert!(got > 0 && got * 4096 <= (1 << 20) - 25 * 4096, "{got} raw blocks");
    assert_eq!(heap.stats().unwrap().accounted_bytes(), 1 << 20);
    // Raw free of a movable-region address is ignored.
    let h = heap.movable().unwrap().alloc(64).unwrap();
    // SAFETY: the pointer is not from malloc; the heap ignores it (tested here).
    let at = heap.movable().unwrap().device_ptr(h).unwrap();
    // SAFETY: (as above) a movable-region address, which the heap ignores.
    unsafe { ops::free_ptrs(&heap, &[at]).unwrap() };
    assert!(heap.movable().unwrap().resolve(h).is_ok());
    // Rebuild and reset keep the movable region out of the buddy.
    heap.rebuild(&[]).unwrap();
    assert_eq!(heap.stats().unwrap().accounted_bytes(), 1 << 20);
    heap.reset().unwrap();
    let s = heap.stats().unwrap();
    assert_eq!((s.free_bytes, s.movable_bytes), ((1 << 20) - 25 * 4096, 25 * 4096));
    assert!(
        matches!(heap.movable().unwrap().resolve(h), Err(CompactionError::InvalidHandle(_))),
        "reset frees handles"
    );
    let h2 = heap.movable().unwrap().alloc(64).unwrap();
    assert_eq!(h2.index(), h.index());
    assert_ne!(h2, h, "generations survive a reset");
    assert_eq!(heap.movable().unwrap().resolve(h2).unwrap().offset, 0);
}

#[test]
fn handle_api_rejects_misuse() {
    let b = Backend::cpu();
    // A heap without a movable region.
    let mut plain = DeviceHeap::new(&b, 1 << 20).unwrap();
    assert!(!plain.has_movable());
    assert!(plain.movable().is_err(), "no movable region: no handle verbs (alloc, compact, ...)");
    assert!(DeviceHeap::with_movable(&b, 1 << 20, 0, 16).is_err());
    assert!(DeviceHeap::with_movable(&b, 1 << 20, 2 << 20, 16).is_err());
    assert!(DeviceHeap::with_movable(&b, 1 << 20, 4096, 0).is_err());
    // Handle misuse.
    let mut heap = DeviceHeap::with_movable(&b, 1 << 20, 8192, 4).unwrap();
    assert!(matches!(heap.movable().unwrap().alloc(0), Err(CompactionError::ZeroSize)));
    assert_eq!(heap.movable().unwrap().alloc_batch(&[0]).unwrap(), vec![None]);
    assert!(matches!(heap.movable().unwrap().alloc(8193), Err(CompactionError::OutOfMemory { .. })));
    let h = heap.movable().unwrap().alloc(100).unwrap();
    assert_eq!(heap.movable().unwrap().resolve(h).unwrap().size, 100);
    assert!(matches!(heap.movable().unwrap().unpin(h), Err(CompactionError::NotPinned(_))));
    heap.movable().unwrap().pin(h).unwrap();
    assert!(matches!(heap.movable().unwrap().free(h), Err(CompactionError::Pinned(_))));
    heap.movable().unwrap().unpin(h).unwrap();
    assert!(
        matches!(heap.movable().unwrap().write(h, 100, &[0; 16]), Err(CompactionError::Backend(_))),
        "write past the block"
    );
    heap.movable().unwrap().write(h, 96, &[7; 16]).unwrap();
    assert_eq!(&heap.movable().unwrap().read(h).unwrap()[96..], &[7; 16]);
    assert!(
        matches!(heap.movable().unwrap().touch_handles(&[h, h], 0, false), Err(CompactionError::Backend(_))),
        "two writers"
    );
    heap.movable().unwrap().free(h).unwrap();
    assert!(matches!(heap.movable().unwrap().pin(h), Err(CompactionError::InvalidHandle(_))));
}
