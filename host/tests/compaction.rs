//! Validation of the in-place compaction (issue 5) on every backend.
//!
//! Every case fills each live block with a pattern derived from its handle,
//! poisons the free ranges, compacts, and checks: every byte of every block,
//! every handle (host mirror and device table), that no two blocks overlap,
//! that the layout equals the reference sliding compaction of the
//! reference-allocator issue (`reference::plan_slide`, the one
//! oracle), and that the whole region equals the reference sequential
//! `memmove` of the image taken before (`compaction::oracle::apply`).

mod common;

use gpuheap::backend::Backend;
use gpuheap::compaction::{oracle, CompactHeap, CompactionError, Compactor, Handle, HandleRegion, LiveBlock, GRANULE};
use gpuheap::testing::SplitMix64;
use gpuheap_kernels::compact::handle::{ENTRY_LIVE, ENTRY_PINNED};
use gpuheap_kernels::fill::pattern;

const POISON: u32 = 0xDEAD_BEEF;

use common::slide;

fn is_lockstep(b: &Backend) -> bool {
    common::has_thread_per_lane(b)
}

fn with_tile(heap: &mut CompactHeap, tile_bytes: u32) {
    let t = {
        let mut o = heap.tuning();
        o.tile_bytes = tile_bytes;
        o
    };
    heap.set_tuning(t);
}

/// Writes the pattern of each block's handle into every word of the block
/// and the poison word into every free range.
fn fill(heap: &mut CompactHeap) {
    let mut img = vec![0u8; heap.capacity() as usize];
    heap.region().read_into(0, &mut img).unwrap();
    for b in heap.layout().unwrap() {
        let h = heap.handle_of(b.handle).unwrap().unwrap();
        let words: &mut [u32] = bytemuck::cast_slice_mut(&mut img[b.offset as usize..(b.offset + b.size) as usize]);
        for (i, w) in words.iter_mut().enumerate() {
            *w = pattern(h.0, i as u64);
        }
    }
    for (o, l) in heap.free_ranges().unwrap() {
        let words: &mut [u32] = bytemuck::cast_slice_mut(&mut img[o as usize..(o + l) as usize]);
        words.fill(POISON);
    }
    heap.write_region(0, &img).unwrap();
}

fn image(heap: &CompactHeap) -> Vec<u8> {
    let mut img = vec![0u8; heap.capacity() as usize];
    heap.region().read_into(0, &mut img).unwrap();
    img
}

/// Checks every block's bytes against its handle's pattern.
fn check_patterns(heap: &CompactHeap, img: &[u8], what: &str) {
    for b in heap.layout().unwrap() {
        let h = heap.handle_of(b.handle).unwrap().unwrap();
        let words: &[u32] = bytemuck::cast_slice(&img[b.offset as usize..(b.offset + b.size) as usize]);
        for (i, &w) in words.iter().enumerate() {
            assert_ne!(w, POISON, "{what}: poison read back into handle {h:?} word {i}");
            assert_eq!(w, pattern(h.0, i as u64), "{what}: handle {h:?} (offset {}) word {i}", b.offset);
        }
    }
}

/// Fills, compacts and checks everything; returns the report.
fn compact_and_check(heap: &mut CompactHeap, what: &str) -> gpuheap::compaction::CompactionReport {
    fill(heap);
    let before_layout = heap.layout().unwrap();
    let before = image(heap);
    let handles: Vec<Handle> = before_layout.iter().map(|b| heap.handle_of(b.handle).unwrap().unwrap()).collect();
    let report = heap.compact().unwrap_or_else(|e| panic!("{what}: compaction failed: {e}"));
    let after_layout = heap.layout().unwrap();
    let (expected, plan) = slide(&before_layout, heap.capacity());

    // Layout: same blocks, in the same order, at the reference offsets.
    assert_eq!(after_layout.len(), before_layout.len(), "{what}: live block count");
    for ((b, a), &d) in before_layout.iter().zip(&after_layout).zip(&expected) {
        assert_eq!((a.handle, a.size, a.flags), (b.handle, b.size, b.flags), "{what}: block order/identity");
        assert_eq!(a.offset, d, "{what}: block of handle index {} at {} instead of {d}", b.handle, a.offset);
    }
    oracle::validate(&after_layout, heap.capacity()).unwrap_or_else(|e| panic!("{what}: overlap: {e}"));
    // Handles: host mirror and device table.
    let table = heap.read_table().unwrap();
    for (h, &d) in handles.iter().zip(&expected) {
        let info = heap.resolve(*h).unwrap();
        assert_eq!(info.offset, d, "{what}: host resolve of {h:?}");
        let e = table[h.index() as usize];
        assert_eq!((e.offset, e.generation), (d, h.generation()), "{what}: device entry of {h:?}");
        assert!(e.flags & ENTRY_LIVE != 0);
        assert_eq!(e.flags & ENTRY_PINNED != 0, info.pinned, "{what}: pinned flag of {h:?}");
    }
    // Bytes: every block, and the whole region against the reference memmove.
    let after = image(heap);
    check_patterns(heap, &after, what);
    let mut want = before.clone();
    oracle::apply(&mut want, &before_layout, &expected);
    if let Some(i) = want.iter().zip(&after).position(|(a, b)| a != b) {
        panic!("{what}: region differs from the reference memmove at byte {i}");
    }
    // Report and free space.
    assert_eq!(
        (report.bytes_moved, report.blocks_moved),
        (plan.bytes_moved, plan.blocks_moved as u64),
        "{what}: report"
    );
    assert_eq!(report.blocks, before_layout.len() as u64);
    let segments = 1 + before_layout.iter().filter(|b| b.pinned()).count() as u64;
    assert!(report.after.free_blocks <= segments, "{what}: {} free ranges after", report.after.free_blocks);
    if segments == 1 {
        assert_eq!(report.after.external, 0.0, "{what}: fragmentation after");
    }
    assert_eq!(report.after.free, report.before.free);
    report
}

/// Runs `case` on every backend.
fn on_backends(test: &str, case: impl Fn(&Backend, &str)) {
    for b in common::backends(test) {
        let what = format!("{test} on {}", b.describe());
        case(&b, &what);
    }
}

#[test]
fn no_holes_ends_at_once_and_moves_nothing() {
    on_backends("no_holes", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 20, 1024).unwrap();
        for i in 0..100 {
            heap.alloc(16 + (i % 7) * 48).unwrap();
        }
        let before = {
            fill(&mut heap);
            image(&heap)
        };
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks_moved, r.bytes_moved, r.launches), (0, 0, 0), "{what}");
        assert_eq!(image(&heap), before, "{what}");
        // The kernels themselves on a packed layout: they run and move nothing.
        let layout = heap.layout().unwrap();
        let mut c = Compactor::new(heap.tuning());
        let mut region = b.upload(&before).unwrap();
        let run = c.compact(b, &mut region, &layout, None).unwrap();
        assert_eq!(run.new_offsets, layout.iter().map(|l| l.offset).collect::<Vec<_>>(), "{what}");
        assert_eq!(region.read::<u8>().unwrap(), before, "{what}: kernels changed a packed region");
    });
}

#[test]
fn one_hole_at_the_start() {
    on_backends("one_hole_at_start", |b, what| {
        let mut heap = CompactHeap::new(b, 4 << 20, 1024).unwrap();
        with_tile(&mut heap, 1024);
        let first = heap.alloc(512).unwrap();
        for i in 0..200 {
            heap.alloc(4096 + i * 16).unwrap();
        }
        heap.free(first).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!(r.blocks_moved, 200);
        assert!(r.before.external > 0.0);
    });
}

#[test]
fn holes_everywhere() {
    on_backends("holes_everywhere", |b, what| {
        let mut heap = CompactHeap::new(b, 8 << 20, 8192).unwrap();
        with_tile(&mut heap, 2048);
        let mut rng = SplitMix64::new(7);
        let hs: Vec<Handle> = (0..3000).map(|_| heap.alloc(1 + rng.below(2048)).unwrap()).collect();
        for (i, h) in hs.iter().enumerate() {
            if i % 2 == 0 || rng.below(4) == 0 {
                heap.free(*h).unwrap();
            }
        }
        compact_and_check(&mut heap, what);
    });
}

/// 1M tiny blocks. `GPUHEAP_COMPACT_TINY_BLOCKS` overrides the count (the
/// default is 2^20 in release builds and 2^17 in debug builds; set it to
/// 1048576 to run the full case in a debug build).
#[test]
fn million_tiny_blocks() {
    let default = if cfg!(debug_assertions) { 1 << 17 } else { 1 << 20 };
    let n: u64 = std::env::var("GPUHEAP_COMPACT_TINY_BLOCKS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    on_backends("million_tiny_blocks", |b, what| {
        let mut heap = CompactHeap::new(b, n * 48, n as u32).unwrap();
        let mut rng = SplitMix64::new(11);
        let hs: Vec<Handle> = (0..n).map(|_| heap.alloc(1 + rng.below(47)).unwrap()).collect();
        for h in &hs {
            if rng.below(3) == 0 {
                heap.free(*h).unwrap();
            }
        }
        let r = compact_and_check(&mut heap, &format!("{what} ({n} blocks)"));
        assert!(r.blocks_moved > n / 2);
    });
}

#[test]
fn a_few_huge_blocks() {
    on_backends("few_huge_blocks", |b, what| {
        let mib = if is_lockstep(b) { 256 << 10 } else { 4 << 20 };
        let mut heap = CompactHeap::new(b, 30 * mib, 64).unwrap();
        let mut hs = Vec::new();
        for i in 0..5 {
            hs.push(heap.alloc(mib + i * 4096).unwrap());
            hs.push(heap.alloc(mib / 2 + 16).unwrap());
        }
        for h in hs.iter().step_by(2).take(3) {
            heap.free(*h).unwrap();
        }
        let r = compact_and_check(&mut heap, what);
        assert!(r.bytes_moved > 3 * mib);
    });
}

#[test]
fn blocks_overlapping_their_own_old_range() {
    on_backends("self_overlap", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 20, 64).unwrap();
        with_tile(&mut heap, 512);
        // shift < len: a 64 B hole before a 100 KiB block; then shift ≥ len.
        let h0 = heap.alloc(64).unwrap();
        let big = heap.alloc(100 << 10).unwrap();
        let h2 = heap.alloc(200 << 10).unwrap();
        let small = heap.alloc(48).unwrap();
        heap.alloc(32 << 10).unwrap();
        heap.free(h0).unwrap();
        heap.free(h2).unwrap();
        let old_big = heap.resolve(big).unwrap().offset;
        let old_small = heap.resolve(small).unwrap().offset;
        compact_and_check(&mut heap, what);
        let new_big = heap.resolve(big).unwrap().offset;
        assert!(old_big - new_big < 100 << 10, "{what}: big block overlaps itself");
        assert!(old_small - heap.resolve(small).unwrap().offset >= 48);
    });
}

#[test]
fn pinned_block_in_the_middle_with_holes_on_both_sides() {
    on_backends("pinned_middle", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 20, 256).unwrap();
        with_tile(&mut heap, 1024);
        let hs: Vec<Handle> = (0..60).map(|i| heap.alloc(256 + i * 32).unwrap()).collect();
        let pinned = hs[30];
        heap.pin(pinned).unwrap();
        for i in [0, 5, 28, 29, 31, 32, 40, 59] {
            heap.free(hs[i]).unwrap();
        }
        let at = heap.resolve(pinned).unwrap().offset;
        let r = compact_and_check(&mut heap, what);
        assert_eq!(heap.resolve(pinned).unwrap().offset, at, "{what}: pinned block moved");
        assert_eq!(r.after.free_blocks, 2, "{what}: one free range per segment");
        // Unpinned, the next compaction merges the segments.
        heap.unpin(pinned).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.after.free_blocks, r.after.external), (1, 0.0));
    });
}

#[test]
fn single_block() {
    on_backends("single_block", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 16, 16).unwrap();
        let h0 = heap.alloc(4000).unwrap();
        let h = heap.alloc(1000).unwrap();
        heap.free(h0).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks_moved, heap.resolve(h).unwrap().offset), (1, 0));
    });
}

#[test]
fn empty_heap() {
    on_backends("empty_heap", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 16, 16).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks, r.launches), (0, 0));
        let h = heap.alloc(100).unwrap();
        heap.free(h).unwrap();
        let r = compact_and_check(&mut heap, what);
        assert_eq!((r.blocks, r.after.free_blocks), (0, 1));
        // The core on an empty layout.
        let mut region = b.alloc_zeroed(64).unwrap();
        let run = Compactor::new(heap.tuning()).compact(b, &mut region, &[], None).unwrap();
        assert!(run.new_offsets.is_empty());
    });
}

#[test]
fn block_larger_than_a_tile() {
    on_backends("block_larger_than_tile", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 20, 64).unwrap();
        with_tile(&mut heap, 256);
        let a = heap.alloc(3000).unwrap();
        heap.alloc(40_000).unwrap();
        let c = heap.alloc(100).unwrap();
        heap.alloc(70_000).unwrap();
        heap.free(a).unwrap();
        heap.free(c).unwrap();
        compact_and_check(&mut heap, what);
    });
}

#[test]
fn tile_boundaries_inside_blocks() {
    on_backends("tile_boundaries", |b, what| {
        for tile in [16u32, 48, 272, 1008] {
            let mut heap = CompactHeap::new(b, 1 << 20, 1024).unwrap();
            with_tile(&mut heap, tile);
            let mut rng = SplitMix64::new(tile as u64);
            let hs: Vec<Handle> = (0..300).map(|_| heap.alloc(16 * (1 + rng.below(40))).unwrap()).collect();
            for h in hs.iter().filter(|_| rng.below(3) == 0) {
                heap.free(*h).unwrap();
            }
            compact_and_check(&mut heap, &format!("{what}, tile {tile}"));
        }
    });
}

#[test]
fn poisoned_holes_are_never_read_back() {
    on_backends("poisoned_holes", |b, what| {
        let mut heap = CompactHeap::new(b, 1 << 20, 1024).unwrap();
        with_tile(&mut heap, 512);
        let hs: Vec<Handle> = (0..400).map(|i| heap.alloc(64 + (i % 13) * 16).unwrap()).collect();
        for h in hs.iter().skip(1).step_by(3) {
            heap.free(*h).unwrap();
        }
        // `compact_and_check` poisons every free range (including the tail
        // past the end of the destination stream) and asserts that no live
        // word holds the poison afterwards.
        compact_and_check(&mut heap, what);
        let img = image(&heap);
        let live: u64 = heap.layout().unwrap().iter().map(|b| b.size).sum();
        let poison_words = bytemuck::cast_slice::<u8, u32>(&img[..live as usize]).iter().filter(|&&w| w == POISON);
        assert_eq!(poison_words.count(), 0, "{what}");
    });
}

/// BL-16 (libsdl-org/SDL#15123): an operation recorded before a compaction
/// resolves its handle when it executes, so it sees (and writes) the block at
/// its new place, and the block's old range is not written.
#[test]
fn bl_16_pending_op_sees_data_after_compaction() {
    on_backends("bl_16", |b, what| {
        const MIB: u64 = 1 << 20;
        let mut heap = CompactHeap::new(b, 4 * MIB, 64).unwrap();
        let before = heap.alloc(MIB / 2).unwrap();
        let h = heap.alloc(MIB).unwrap();
        // A pending operation P = "write 0xAB into H", recorded, not executed.
        struct Pending {
            handle: Handle,
            value: u8,
        }
        let p = Pending { handle: h, value: 0xAB };
        // Make H a compaction candidate, compact: H moves from X to Y.
        heap.free(before).unwrap();
        let x = heap.resolve(h).unwrap().offset;
        compact_and_check(&mut heap, what);
        let y = heap.resolve(h).unwrap().offset;
        assert!(y < x, "{what}: H did not move");
        // A new block lands in H's old range; its data must survive P.
        let other = heap.alloc(MIB).unwrap();
        let o = heap.resolve(other).unwrap().offset;
        assert!(o < x + MIB && o + MIB > x, "{what}: the new block does not reuse H's old range");
        fill(&mut heap);
        // Execute P: it resolves H on the device now.
        heap.fill_on_device(p.handle, p.value).unwrap();
        assert!(heap.read(h).unwrap().iter().all(|&v| v == 0xAB), "{what}: P's write is not in H");
        let img = image(&heap);
        let words: &[u32] = bytemuck::cast_slice(&img[o as usize..(o + MIB) as usize]);
        assert!(
            words.iter().enumerate().all(|(i, &w)| w == pattern(other.0, i as u64)),
            "{what}: P wrote H's old range"
        );
        // A freed handle no longer resolves on the device.
        heap.free(other).unwrap();
        assert!(matches!(heap.fill_on_device(other, 1), Err(CompactionError::InvalidHandle(_))));
    });
}

#[test]
fn random_layouts_match_the_reference() {
    on_backends("random_layouts", |b, what| {
        let rounds = if is_lockstep(b) { 4 } else { 12 };
        for seed in 0..rounds {
            let mut rng = SplitMix64::new(1000 + seed);
            let mut heap = CompactHeap::new(b, 2 << 20, 4096).unwrap();
            with_tile(&mut heap, 16 * (1 + rng.below(256)) as u32);
            let n = 50 + rng.below(1500);
            let max = [64, 1024, 16 << 10][rng.below(3) as usize];
            let hs: Vec<Handle> = (0..n).filter_map(|_| heap.alloc(1 + rng.below(max)).ok()).collect();
            for h in &hs {
                match rng.below(8) {
                    0..=2 => heap.free(*h).unwrap(),
                    3 => heap.pin(*h).unwrap(),
                    _ => {}
                }
            }
            compact_and_check(&mut heap, &format!("{what}, seed {seed}"));
            // A second compaction finds nothing to do.
            let r = compact_and_check(&mut heap, &format!("{what}, seed {seed}, again"));
            assert_eq!(r.launches, 0);
        }
    });
}

#[test]
fn handle_api_rejects_misuse() {
    let b = Backend::cpu();
    let mut heap = CompactHeap::new(&b, 1024, 4).unwrap();
    assert!(matches!(heap.alloc(0), Err(CompactionError::ZeroSize)));
    let h = heap.alloc(100).unwrap();
    assert_eq!(heap.resolve(h).unwrap().size, 100);
    heap.pin(h).unwrap();
    heap.pin(h).unwrap();
    assert!(matches!(heap.free(h), Err(CompactionError::Pinned(_))));
    heap.unpin(h).unwrap();
    assert!(heap.resolve(h).unwrap().pinned, "pins nest");
    heap.unpin(h).unwrap();
    assert!(matches!(heap.unpin(h), Err(CompactionError::NotPinned(_))));
    heap.free(h).unwrap();
    assert!(matches!(heap.resolve(h), Err(CompactionError::InvalidHandle(_))));
    let h2 = heap.alloc(16).unwrap();
    assert_eq!(h2.index(), h.index());
    assert_ne!(h2, h, "a reused entry gets a new generation");
    assert!(matches!(heap.alloc(2000), Err(CompactionError::OutOfMemory { requested: 2000, .. })));
    for _ in 0..3 {
        heap.alloc(16).unwrap();
    }
    assert!(matches!(heap.alloc(16), Err(CompactionError::TooManyHandles(4))));
    // The core rejects invalid layouts before running anything.
    let mut region = b.alloc_zeroed(256).unwrap();
    let bad = [LiveBlock { offset: 8, size: GRANULE, handle: 0, flags: 0 }];
    let mut c = Compactor::new(heap.tuning());
    assert!(matches!(c.compact(&b, &mut region, &bad, None), Err(CompactionError::InvalidLayout(_))));
}

#[test]
fn compaction_lets_a_fragmented_request_succeed() {
    // BL-01 (c) in small: 8 of 16 units free in two 4-unit holes; 8 units fit only after compaction.
    let b = Backend::cpu();
    let unit = 1024;
    let mut heap = CompactHeap::new(&b, 16 * unit, 16).unwrap();
    let hs: Vec<Handle> = (0..4).map(|_| heap.alloc(4 * unit).unwrap()).collect();
    heap.free(hs[1]).unwrap();
    heap.free(hs[3]).unwrap();
    assert!(matches!(heap.alloc(8 * unit), Err(CompactionError::OutOfMemory { .. })));
    let r = heap.compact().unwrap();
    assert_eq!((r.before.external, r.after.external), (0.5, 0.0));
    heap.alloc(8 * unit).unwrap();
}

/// The wait set of every tile, checked by brute force on random layouts:
/// each tile waits (at least) for every other tile whose source bytes
/// intersect its destination bytes, and never for a later tile.
#[test]
fn tile_wait_ranges_cover_every_overwritten_source() {
    use gpuheap_kernels::compact::mover::{wait_range, MoveParams};
    use gpuheap_kernels::compact::BLOCK_PINNED;
    for seed in 0..200u64 {
        let mut rng = SplitMix64::new(seed);
        let mut layout = Vec::new();
        let mut off = 0;
        for _ in 0..1 + rng.below(40) {
            let gap = if rng.below(2) == 0 { 4 } else { 200 };
            off += 16 * rng.below(gap);
            let max = if rng.below(3) == 0 { 300 } else { 8 };
            let size = 16 * (1 + rng.below(max));
            let flags = if rng.below(6) == 0 { BLOCK_PINNED } else { 0 };
            layout.push(LiveBlock { offset: off, size, handle: 0, flags });
            off += size;
        }
        let (new_offset, _) = slide(&layout, off);
        // The tiles cover the destinations from the first hole to the last block's end.
        let mut start = 0;
        for b in &layout {
            if b.offset != start {
                break;
            }
            start = b.offset + b.size;
        }
        let end = off.max(start);
        let tile = 16 * (1 + rng.below(64));
        let p = MoveParams {
            region: 0,
            blocks: layout.as_ptr() as u64,
            new_offset: new_offset.as_ptr() as u64,
            count: layout.len() as u64,
            start,
            end,
            tile_bytes: tile,
            flags: 0,
            tile_counter: 0,
            epoch: 1,
            reserved: 0,
        };
        // Per moving 16-byte granule: source and destination.
        let mut src = Vec::new();
        let mut dst = Vec::new();
        for (b, &d) in layout.iter().zip(&new_offset) {
            if d != b.offset {
                for g in (0..b.size).step_by(16) {
                    src.push(b.offset + g);
                    dst.push(d + g);
                }
            }
        }
        assert!(dst.iter().all(|&d| (start..end).contains(&d)), "seed {seed}: a destination outside the tiles");
        let tiles = (end - start).div_ceil(tile);
        let tile_of = |d: u64| (d - start) / tile;
        for t in 0..tiles {
            // SAFETY: `p` points at live host vectors holding a valid plan.
            let (lo, hi) = unsafe { wait_range(&p, t) };
            assert!(hi <= t + 1, "seed {seed}: tile {t} waits for a later tile ({lo}..{hi})");
            let writes: std::collections::HashSet<u64> = dst.iter().copied().filter(|&d| tile_of(d) == t).collect();
            for (i, s) in src.iter().enumerate() {
                let u = tile_of(dst[i]);
                if u != t && writes.contains(s) {
                    assert!(
                        (lo..hi).contains(&u),
                        "seed {seed}: tile {t} overwrites a source of tile {u}, waits for {lo}..{hi}"
                    );
                }
            }
        }
    }
}
