//! Property tests of every reference strategy against a shadow model (rlsf style).
//!
//! A random sequence of operations (allocate, free a live block, free a bogus offset, compact) runs
//! against a strategy and a `BTreeMap` of the live blocks. After every step:
//! - live blocks lie in range, are aligned, reserve at least the request, and never overlap;
//! - the strategy's `live_blocks()`/`stats()` agree with the model, and `free_blocks()` is address-ordered,
//!   in range, disjoint from live blocks, and sums to `stats().free`;
//! - a failed allocation is honest where the strategy promises exactness (no free block could hold it);
//! - a bad free is rejected and changes nothing.
//!
//! At the end everything is freed: the allocator returns to its fresh free layout (one block of the whole
//! capacity where the strategy allows it), and the largest block of that layout is allocatable in one piece.

use std::collections::BTreeMap;

use gpuheap::reference::caching::{CachingAllocator, CachingConfig};
use gpuheap::reference::compact;
use gpuheap::reference::Buddy;
use gpuheap::reference::{AllocError, Allocation, BestFit, FirstFit, SubAllocator, Tlsf};
use gpuheap::reference::{Slab, SlabConfig};
use gpuheap::reference::{Tiered, TieredConfig};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Allocate `size` bytes with alignment `2^align_log2`.
    Alloc { size: u64, align_log2: u32 },
    /// Free the live block chosen by this index (modulo the number of live blocks): by its allocation's
    /// handle when the index is even, by offset when it is odd.
    Free(usize),
    /// Free an offset that is not live (if it happens to be live, it is skipped).
    BadFree(u64),
    /// Compact, pinning live blocks whose index is a multiple of `pin_every` (0: none).
    Compact { pin_every: usize },
}

/// Log-uniform-ish sizes from 1 to `2^max_log` bytes.
fn size_strategy(max_log: u32) -> impl Strategy<Value = u64> {
    (0..=max_log).prop_flat_map(move |k| (1u64 << k)..=(1u64 << k).saturating_mul(2).min(1 << max_log))
}

fn ops(max_log: u32, max_align_log2: u32, len: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (size_strategy(max_log), 0..=max_align_log2).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
        4 => any::<usize>().prop_map(Op::Free),
        1 => any::<u64>().prop_map(Op::BadFree),
        1 => (0usize..4).prop_map(|pin_every| Op::Compact { pin_every }),
    ];
    prop::collection::vec(op, 1..len)
}

/// What a strategy promises beyond the common properties.
struct Spec {
    make: fn() -> Box<dyn SubAllocator + Send>,
    /// `Some(need)`: an OOM for (size, align) implies `largest_free < need(size, align)`.
    exact_oom: Option<fn(u64, u64) -> u64>,
    /// Largest alignment the strategy accepts (larger gives `BadAlignment`).
    max_align: u64,
    /// Free layout of the fresh allocator: `None` means one block of the whole capacity.
    fresh_layout: Option<Vec<(u64, u64)>>,
    /// After everything is freed and the cache released, the free bytes are the fresh layout's sizes but
    /// may lie at other offsets: the caching model with expandable segments keeps a reservation whose first
    /// mapping failed (PyTorch's `release_blocks` releases only expandable segments that hold a cached
    /// block, c10/cuda/CUDACachingAllocator.cpp), and lists the device's free bytes after it.
    layout_may_move: bool,
}

#[derive(Clone, Copy, Debug)]
struct Shadow {
    size: u64,
    requested: u64,
    align: u64,
    /// What `alloc` returned, its offset updated by compaction (handles survive it).
    alloc: Allocation,
}

fn check_state(a: &dyn SubAllocator, model: &BTreeMap<u64, Shadow>) -> Result<(), TestCaseError> {
    let cap = a.capacity();
    let mut end = 0u64;
    for (&o, s) in model {
        prop_assert!(o >= end, "live blocks overlap at {o}");
        prop_assert_eq!(o % s.align, 0, "misaligned block at {}", o);
        prop_assert!(s.size >= s.requested);
        end = o + s.size;
        prop_assert!(end <= cap, "block [{o}, {end}) leaves [0, {cap})");
    }
    let live = a.live_blocks();
    let expect: Vec<(u64, u64, u64)> = model.iter().map(|(&o, s)| (o, s.size, s.requested)).collect();
    let got: Vec<(u64, u64, u64)> = live.iter().map(|b| (b.offset, b.size, b.requested)).collect();
    prop_assert_eq!(got, expect);
    let free: Vec<(u64, u64)> = a.free_blocks().collect();
    let mut last_end = 0u64;
    for &(o, l) in &free {
        prop_assert!(l > 0 && o >= last_end && o + l <= cap, "bad free block ({o}, {l})");
        last_end = o + l;
        // Disjoint from live blocks: the live block starting before `o + l` must end by `o`.
        if let Some((&lo, s)) = model.range(..o + l).next_back() {
            prop_assert!(lo + s.size <= o, "free block ({o}, {l}) overlaps live block at {lo}");
        }
    }
    let s = a.stats();
    prop_assert_eq!(s.live_blocks, model.len());
    prop_assert_eq!(s.allocated, model.values().map(|s| s.requested).sum::<u64>());
    prop_assert_eq!(s.reserved_in_use, model.values().map(|s| s.size).sum::<u64>());
    prop_assert_eq!(s.free, free.iter().map(|b| b.1).sum::<u64>());
    prop_assert_eq!(s.free_blocks, free.len());
    prop_assert_eq!(s.largest_free, free.iter().map(|b| b.1).max().unwrap_or(0));
    prop_assert_eq!(s.capacity, s.reserved_in_use + s.free + s.stranded);
    Ok(())
}

fn is_bad_free(r: &Result<(), AllocError>) -> bool {
    matches!(r, Err(AllocError::DoubleFree { .. } | AllocError::InvalidFree { .. }))
}

fn run(spec: &Spec, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut a = (spec.make)();
    let fresh: Vec<(u64, u64)> = spec.fresh_layout.clone().unwrap_or_else(|| vec![(0, a.capacity())]);
    prop_assert_eq!(a.free_blocks().collect::<Vec<_>>(), fresh.clone());
    let mut model: BTreeMap<u64, Shadow> = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Alloc { size, align_log2 } => {
                let align = 1u64 << align_log2;
                match a.alloc(size, align) {
                    Ok(x) => {
                        prop_assert!(!model.contains_key(&x.offset));
                        model.insert(x.offset, Shadow { size: x.size, requested: size, align, alloc: x });
                    }
                    Err(AllocError::BadAlignment { .. }) if align > spec.max_align => {}
                    Err(AllocError::OutOfMemory { requested, largest_free, free }) => {
                        prop_assert_eq!(requested, size);
                        prop_assert_eq!(free, a.stats().free);
                        if let Some(need) = spec.exact_oom {
                            prop_assert!(largest_free < need(size, align), "dishonest OOM for {size} @ {align}");
                        }
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e:?}"))),
                }
            }
            Op::Free(i) if !model.is_empty() => {
                let (&o, s) = model.iter().nth(i % model.len()).unwrap();
                let x = s.alloc;
                let r = if i % 2 == 0 { a.free(x) } else { a.free_at(o) };
                r.map_err(|e| TestCaseError::fail(format!("free({o}): {e}")))?;
                model.remove(&o);
                let again = a.free_at(o);
                prop_assert!(is_bad_free(&again), "second free of {} gave {:?}", o, again);
                let again = a.free(x);
                prop_assert!(is_bad_free(&again), "second free of {:?} gave {:?}", x, again);
            }
            Op::Free(_) => {}
            Op::BadFree(o) => {
                let o = o % (a.capacity() + 64);
                if !model.contains_key(&o) {
                    let before = (a.stats(), a.free_blocks().collect::<Vec<_>>());
                    let r = a.free_at(o);
                    prop_assert!(is_bad_free(&r), "bogus free of {} gave {:?}", o, r);
                    prop_assert_eq!(before, (a.stats(), a.free_blocks().collect::<Vec<_>>()));
                }
            }
            Op::Compact { pin_every } => {
                let pinned_offsets: Vec<u64> = model
                    .keys()
                    .enumerate()
                    .filter(|(i, _)| pin_every > 0 && i % pin_every == 0)
                    .map(|x| *x.1)
                    .collect();
                let free_before = a.stats().free + a.stats().stranded;
                let pin = |o: u64, l: u64| pinned_offsets.iter().any(|&p| p >= o && p < o + l);
                let plan = compact(&mut *a, &pin).map_err(|e| TestCaseError::fail(format!("compact: {e}")))?;
                let mut moved = BTreeMap::new();
                let mut last_dst = None;
                for (&o, &s) in &model {
                    let d = plan.translate(o).ok_or_else(|| TestCaseError::fail("live block not in plan"))?;
                    prop_assert!(last_dst.is_none_or(|l| d > l), "compaction reordered blocks");
                    prop_assert_eq!(d % s.align, 0, "compaction broke alignment");
                    if pinned_offsets.contains(&o) {
                        prop_assert_eq!(d, o, "pinned block moved");
                    }
                    last_dst = Some(d);
                    moved.insert(d, Shadow { alloc: Allocation { offset: d, ..s.alloc }, ..s });
                }
                model = moved;
                prop_assert_eq!(free_before, a.stats().free + a.stats().stranded);
            }
        }
        check_state(&*a, &model)?;
    }
    // Free everything in an order unlike the allocation order, then drop caches.
    let allocs: Vec<Allocation> = model.values().map(|s| s.alloc).collect();
    let (evens, odds): (Vec<_>, Vec<_>) = allocs.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for (_, &x) in odds.into_iter().rev().chain(evens) {
        a.free(x).map_err(|e| TestCaseError::fail(format!("final free({}): {e}", x.offset)))?;
    }
    model.clear();
    a.release_cached();
    check_state(&*a, &model)?;
    let largest = fresh.iter().max_by_key(|b| b.1).copied().unwrap();
    if spec.layout_may_move {
        let sizes = |v: &[(u64, u64)]| v.iter().map(|b| b.1).collect::<Vec<_>>();
        prop_assert_eq!(sizes(&a.free_blocks().collect::<Vec<_>>()), sizes(&fresh));
        let x = a.alloc(largest.1, 1).map_err(|e| TestCaseError::fail(format!("whole block: {e}")))?;
        prop_assert_eq!(x.size, largest.1);
    } else {
        prop_assert_eq!(a.free_blocks().collect::<Vec<_>>(), fresh.clone());
        let x = a.alloc(largest.1, 1).map_err(|e| TestCaseError::fail(format!("whole block: {e}")))?;
        prop_assert_eq!((x.offset, x.size), largest);
    }
    Ok(())
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Not a size-class boundary (2035 granules of 16 B), so "the whole capacity in one piece" exercises exact fits.
const BLOCK_LIST_CAP: u64 = 127 * KIB + 48;

fn block_list_need(granule: u64) -> fn(u64, u64) -> u64 {
    // For alignments up to the granule, a block-list OOM means no free block holds the rounded size.
    match granule {
        16 => |size, align| if align <= 16 { size.div_ceil(16) * 16 } else { u64::MAX },
        _ => unreachable!(),
    }
}

fn buddy_need(size: u64, align: u64) -> u64 {
    size.max(align).max(16).next_power_of_two()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn first_fit_matches_model(ops in ops(14, 8, 160)) {
        run(&Spec { make: || Box::new(FirstFit::with_granule(BLOCK_LIST_CAP, 16).unwrap()), exact_oom: Some(block_list_need(16)),
                    max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }

    #[test]
    fn best_fit_matches_model(ops in ops(14, 8, 160)) {
        run(&Spec { make: || Box::new(BestFit::with_granule(BLOCK_LIST_CAP, 16).unwrap()), exact_oom: Some(block_list_need(16)),
                    max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }

    #[test]
    fn tlsf_matches_model(ops in ops(14, 8, 160)) {
        run(&Spec { make: || Box::new(Tlsf::with_granule(BLOCK_LIST_CAP, 16).unwrap()), exact_oom: Some(block_list_need(16)),
                    max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }

    #[test]
    fn buddy_matches_model(ops in ops(14, 8, 160)) {
        run(&Spec { make: || Box::new(Buddy::with_min_block(128 * KIB, 16).unwrap()), exact_oom: Some(buddy_need),
                    max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }

    #[test]
    fn buddy_non_power_of_two_capacity_matches_model(ops in ops(14, 6, 160)) {
        // 1 MiB + 256 KiB + 48 B: top blocks of 1 MiB and 256 KiB, a 48-byte stranded tail (below 64 B).
        run(&Spec { make: || Box::new(Buddy::with_min_block(MIB + 256 * KIB + 48, 64).unwrap()),
                    exact_oom: Some(|s, a| s.max(a).max(64).next_power_of_two()), max_align: u64::MAX,
                    fresh_layout: Some(vec![(0, MIB), (MIB, 256 * KIB)]), layout_may_move: false }, &ops)?;
    }

    #[test]
    fn slab_matches_model(ops in ops(14, 8, 160)) {
        let make = || -> Box<dyn SubAllocator + Send> {
            let cfg = SlabConfig { page_size: 4 * KIB, min_class: 16, max_class: KIB };
            Box::new(Slab::new(Box::new(BestFit::with_granule(BLOCK_LIST_CAP, 16).unwrap()), cfg).unwrap())
        };
        run(&Spec { make, exact_oom: None, max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }

    #[test]
    fn tiered_matches_model(ops in ops(15, 8, 160)) {
        let make = || -> Box<dyn SubAllocator + Send> {
            let cfg = TieredConfig { small_max: KIB, large_min: 8 * KIB, page_size: 4 * KIB, granule: 16 };
            Box::new(Tiered::with_config(MIB, cfg).unwrap())
        };
        run(&Spec { make, exact_oom: None, max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }

    #[test]
    fn caching_matches_model(ops in ops(24, 10, 120)) {
        run(&Spec { make: || Box::new(CachingAllocator::new(CachingConfig::new(64 * MIB)).unwrap()),
                    exact_oom: None, max_align: 512, fresh_layout: Some(vec![(0, 64 * MIB)]), layout_may_move: false }, &ops)?;
    }

    #[test]
    fn caching_max_split_matches_model(ops in ops(24, 9, 120)) {
        run(&Spec { make: || Box::new(CachingAllocator::new(CachingConfig::new(64 * MIB).max_split(4 * MIB)).unwrap()),
                    exact_oom: None, max_align: 512, fresh_layout: Some(vec![(0, 64 * MIB)]), layout_may_move: false }, &ops)?;
    }

    #[test]
    fn caching_expandable_matches_model(ops in ops(24, 9, 120)) {
        run(&Spec { make: || Box::new(CachingAllocator::new(CachingConfig::new(60 * MIB).expandable(true)).unwrap()),
                    exact_oom: None, max_align: 512, fresh_layout: Some(vec![(0, 60 * MIB)]), layout_may_move: true }, &ops)?;
    }

    /// Sizes up to 2^46 on a 2^48-byte range: no overflow, no panic.
    #[test]
    fn huge_ranges_work(ops in ops(46, 40, 60), which in 0usize..4) {
        let make: fn() -> Box<dyn SubAllocator + Send> = match which {
            0 => || Box::new(FirstFit::new(1 << 48).unwrap()),
            1 => || Box::new(BestFit::new(1 << 48).unwrap()),
            2 => || Box::new(Tlsf::new(1 << 48).unwrap()),
            _ => || Box::new(Buddy::new(1 << 48).unwrap()),
        };
        run(&Spec { make, exact_oom: None, max_align: u64::MAX, fresh_layout: None, layout_may_move: false }, &ops)?;
    }
}

/// Allocates `sizes` with `align`, frees the blocks chosen by `frees`, and returns the allocator.
fn random_layout(
    mut a: Box<dyn SubAllocator + Send>,
    sizes: &[(u64, u32)],
    frees: &[usize],
) -> Box<dyn SubAllocator + Send> {
    let mut live: Vec<Allocation> = sizes.iter().filter_map(|&(s, al)| a.alloc(s, 1 << al).ok()).collect();
    for &i in frees {
        if !live.is_empty() {
            let x = live.swap_remove(i % live.len());
            a.free(x).unwrap();
        }
    }
    a
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// BL-25's kind (tlsf-bsd#4): after free(H), alloc(size(H)) lands at H's offset when H is the only free
    /// block of that size (its neighbours are live, so it does not merge), for the size-class strategies.
    #[test]
    fn an_exact_size_request_reuses_the_only_hole_of_that_size(
        sizes in prop::collection::vec((size_strategy(14), 0u32..6), 2..80),
        frees in prop::collection::vec(any::<usize>(), 0..40),
        pick in any::<usize>(),
        which in 0usize..2,
    ) {
        let make = || -> Box<dyn SubAllocator + Send> {
            match which {
                0 => Box::new(Tlsf::with_granule(4 * MIB, 16).unwrap()),
                _ => Box::new(BestFit::with_granule(4 * MIB, 16).unwrap()),
            }
        };
        let mut a = random_layout(make(), &sizes, &frees);
        let free: Vec<(u64, u64)> = a.free_blocks().collect();
        let is_free_at = |o: u64| free.iter().any(|&(fo, fl)| o >= fo && o < fo + fl);
        // Live blocks whose neighbours (or the range's ends) are live.
        let candidates: Vec<(u64, u64)> = a
            .live_blocks()
            .iter()
            .filter(|b| (b.offset == 0 || !is_free_at(b.offset - 1)) && !is_free_at(b.offset + b.size))
            .filter(|b| free.iter().all(|f| f.1 != b.size))
            .map(|b| (b.offset, b.size))
            .collect();
        prop_assume!(!candidates.is_empty());
        let (h, size) = candidates[pick % candidates.len()];
        a.free_at(h).unwrap();
        let again = a.alloc(size, 1).unwrap();
        prop_assert_eq!((again.offset, again.size), (h, size), "{} did not reuse the hole", a.name());
    }
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let all: Vec<Box<dyn SubAllocator + Send>> =
        gpuheap::reference::StrategyKind::ALL.into_iter().map(|k| gpuheap::reference::build(k, 64 * MIB)).collect();
    for mut a in all {
        let name = a.name();
        assert_eq!(a.alloc(0, 1), Err(AllocError::ZeroSize), "{name}");
        assert_eq!(a.alloc(1, 0), Err(AllocError::BadAlignment { align: 0 }), "{name}");
        assert_eq!(a.alloc(1, 3), Err(AllocError::BadAlignment { align: 3 }), "{name}");
        assert!(matches!(a.alloc(u64::MAX, 1), Err(AllocError::SizeOverflow { .. })), "{name}");
        assert!(matches!(a.alloc((1 << 48) + 1, 1), Err(AllocError::SizeOverflow { .. })), "{name}");
        assert!(matches!(a.alloc(1 << 40, 1), Err(AllocError::OutOfMemory { .. })), "{name}");
        assert!(
            matches!(a.free_at(u64::MAX), Err(AllocError::InvalidFree { .. } | AllocError::DoubleFree { .. })),
            "{name}"
        );
    }
}
