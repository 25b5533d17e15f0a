//! Memory pools, recorded releases and partial histories (issue 20, items 1–3), on hand-made snapshots
//! and on the eight snapshots added to the shared traces in 2026-11 (`SOURCES.md`).
//!
//! Expected figures of real snapshots come from `scripts/snapshot-facts.py`, which reads the pickle with a
//! plain `pickle.Unpickler` (every global refused) and no gpuheap code: per device the history's length,
//! the peak of live requested bytes and its event, PyTorch's reserved bytes (initial, peak and its event,
//! final), per memory pool (`segment_pool_id`) of the final state the segments, reserved, allocated (blocks
//! not `inactive`) and hole bytes (`inactive` blocks) with the largest hole, and every run of
//! `segment_free` / `segment_unmap` with its bytes, the reserved bytes before it, the event after it and
//! what its frames name. The request bounds are then derived by hand from those figures: `device_free =
//! capacity − reserved`, `fits_up_to = max(device_free, the default pool's largest hole)`,
//! `fragmentation_up_to = device_free + the default pool's hole bytes`.

#[path = "../../host/tests/common/mod.rs"]
mod common;

use std::path::Path;

use common::pickle::{block, pickle, V};
use gpuheap::explain::explain;
use gpuheap::facts::CapacitySource;
use gpuheap::facts::{
    self, final_state, history_completeness, peaks, pytorch_ratios, request_bounds, History, HistoryCost,
};
use gpuheap::reference::caching::{
    self, config_for_trace, fidelity, recorded_releases, CachingConfig, ReleaseCause, ReleaseEvidence,
};
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{replay, ReplayOptions, ReplayReport};
use gpuheap::trace::{parse_trace, read_trace, DeviceTrace, MempoolId, Trace};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn parse(top: Vec<(&str, V)>) -> Trace {
    parse_trace(Path::new("synthetic.pickle"), &pickle(&V::Dict(top))).unwrap_or_else(|e| panic!("{e}"))
}

/// `explain` of a hand-made snapshot (its frames read from the pickle's bytes, not from a file).
fn explain_of(top: Vec<(&str, V)>, capacity: Option<u64>) -> gpuheap::explain::Explanation {
    let bytes = pickle(&V::Dict(top));
    let t = parse_trace(Path::new("synthetic.pickle"), &bytes).unwrap();
    gpuheap::explain::explain_with_bytes(&t, Some(&bytes), None, capacity).unwrap()
}

fn replay_at(t: &Trace, dev: &DeviceTrace, capacity: Option<u64>) -> ReplayReport {
    let mut opts = ReplayOptions::new(StrategyKind::Caching);
    opts.capacity = capacity;
    replay(t, dev, &opts, None, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn segment<'a>(addr: u64, size: u64, pool: (i128, i128), blocks: Vec<V<'a>>) -> V<'a> {
    V::Dict(vec![
        ("device", V::Int(0)),
        ("address", V::Int(addr as i128)),
        ("total_size", V::Int(size as i128)),
        ("stream", V::Int(0)),
        ("segment_type", V::Str("large")),
        ("segment_pool_id", V::Tuple(vec![V::Int(pool.0), V::Int(pool.1)])),
        ("is_expandable", V::Bool(false)),
        ("blocks", V::List(blocks)),
    ])
}

fn event<'a>(action: &'a str, addr: u64, size: u64, extra: Vec<(&'a str, V<'a>)>) -> V<'a> {
    let mut d = vec![
        ("action", V::Str(action)),
        ("addr", V::Int(addr as i128)),
        ("size", V::Int(size as i128)),
        ("stream", V::Int(0)),
    ];
    d.extend(extra);
    V::Dict(d)
}

/// A CUDA-graph pool `(1, 0)` beside the default pool. Segment P (20 MiB, private) holds a 4 MiB block from
/// before the history and two 2 MiB blocks the history allocates in it (one entry records its `pool_id`, as
/// PyTorch ≥ PR#177717 does, one does not); segment D (20 MiB, default) is allocated by the history for a
/// 6 MiB tensor. Holes: 12 MiB in P, 14 MiB in D. `pool`: the private pool's id (`(0, 0)` gives the
/// snapshot as a reader that ignores pools sees it). `history`: with the events, else the state alone.
const P: u64 = 0x7f00_0000_0000;
const D: u64 = 0x7f00_1000_0000;
fn graph_pool_snapshot(pool: (i128, i128), history: bool, oom: bool) -> Trace {
    parse(graph_pool_pickle(pool, history, oom))
}

fn graph_pool_pickle(pool: (i128, i128), history: bool, oom: bool) -> Vec<(&'static str, V<'static>)> {
    let segs = vec![
        segment(
            P,
            20 * MIB,
            pool,
            vec![
                block(P, 4 * MIB, 4 * MIB, "active_allocated"),
                block(P + 4 * MIB, 2 * MIB, 2 * MIB, "active_allocated"),
                block(P + 6 * MIB, 2 * MIB, 2 * MIB, "active_allocated"),
                block(P + 8 * MIB, 12 * MIB, 0, "inactive"),
            ],
        ),
        segment(
            D,
            20 * MIB,
            (0, 0),
            vec![block(D, 6 * MIB, 6 * MIB, "active_allocated"), block(D + 6 * MIB, 14 * MIB, 0, "inactive")],
        ),
    ];
    let mut events = vec![
        event("segment_alloc", D, 20 * MIB, vec![]),
        event("alloc", D, 6 * MIB, vec![]),
        event("alloc", P + 4 * MIB, 2 * MIB, vec![("pool_id", V::Tuple(vec![V::Int(pool.0), V::Int(pool.1)]))]),
        event("alloc", P + 6 * MIB, 2 * MIB, vec![]),
    ];
    if oom {
        events.push(V::Dict(vec![
            ("action", V::Str("oom")),
            ("device_free", V::Int(0)),
            ("size", V::Int(16 * MIB as i128)),
            ("stream", V::Int(0)),
        ]));
    }
    let mut top = vec![("segments", V::List(segs))];
    if history {
        top.push(("device_traces", V::List(vec![V::List(events)])));
    }
    top
}

#[test]
fn a_cuda_graph_pool_keeps_its_segments_and_allocations() {
    let t = graph_pool_snapshot((1, 0), true, false);
    let dev = &t.devices[0];
    assert_eq!(dev.mempools, vec![MempoolId::DEFAULT, MempoolId(1, 0)]);
    let pools: Vec<u16> = dev.events.iter().map(|e| e.mempool).collect();
    assert_eq!(pools, vec![0, 0, 1, 1], "D's segment and alloc default; both P allocs private (recorded, inferred)");
    let seeded_p = dev.initial_segments.iter().find(|s| s.addr == P).expect("P predates the history");
    assert_eq!(dev.mempool(seeded_p.mempool), MempoolId(1, 0));

    // The model serves the default-pool tensor from a new segment (not P's hole) and the private ones in P.
    let f = fidelity(dev, CachingConfig::new(GIB)).unwrap();
    assert_eq!((f.max_deviation, f.placement_mismatches, f.model_end, f.pytorch_end), (0, 0, 40 * MIB, 40 * MIB));
    let r = replay_at(&t, dev, Some(GIB));
    assert_eq!((r.peak_reserved, r.caching_end.as_ref().unwrap().segments), (40 * MIB, 2));
    assert_eq!(r.end_fidelity().unwrap().reserved, Some(0.0));

    // Read without pools (every id (0, 0), as before), the 6 MiB tensor fills P's hole: -50 % reserved.
    let t0 = graph_pool_snapshot((0, 0), true, false);
    let r0 = replay_at(&t0, &t0.devices[0], Some(GIB));
    assert_eq!(r0.caching_end.as_ref().unwrap().reserved, 20 * MIB);
    assert_eq!(r0.end_fidelity().unwrap().reserved, Some(-0.5));
}

#[test]
fn per_pool_state_and_bounds_count_only_the_requests_pool() {
    let t = graph_pool_snapshot((1, 0), false, false);
    let dev = &t.devices[0];
    let st = final_state(dev.final_state.as_ref().unwrap(), None).unwrap();
    let p = |m| st.pool(m);
    let dflt = p(MempoolId::DEFAULT);
    let graph = p(MempoolId(1, 0));
    assert_eq!(
        (dflt.segments, dflt.reserved, dflt.allocated, dflt.hole_bytes, dflt.largest_hole),
        (1, 20 * MIB, 6 * MIB, 14 * MIB, 14 * MIB)
    );
    assert_eq!(
        (graph.segments, graph.reserved, graph.allocated, graph.hole_bytes, graph.largest_hole),
        (1, 20 * MIB, 8 * MIB, 12 * MIB, 12 * MIB)
    );
    assert_eq!(st.private_hole_bytes(), 12 * MIB);
    // 64 MiB GPU, 40 MiB reserved: 24 MiB free on the device; ordinary requests see D's 14 MiB hole only.
    let b = request_bounds(&st, &CachingConfig::new(64 * MIB), MempoolId::DEFAULT);
    assert_eq!((b.device_free, b.fits_up_to, b.fragmentation_up_to), (24 * MIB, 24 * MIB, 38 * MIB));
    assert_eq!(b.other_pools_hole_bytes, 12 * MIB);
    let e = explain_of(graph_pool_pickle((1, 0), false, false), Some(64 * MIB));
    assert_eq!(e.request_bounds, Some(b), "explain's bounds are the default pool's");
    // A request made in the graph's pool sees P's 12 MiB hole.
    let g = request_bounds(&st, &CachingConfig::new(64 * MIB), MempoolId(1, 0));
    assert_eq!((g.fits_up_to, g.fragmentation_up_to, g.other_pools_hole_bytes), (24 * MIB, 36 * MIB, 14 * MIB));
}

#[test]
fn an_oom_is_judged_by_the_holes_of_its_own_pool() {
    // 16 MiB failed with 0 B free on the device: D's 14 MiB hole cannot hold it, and P's 12 MiB are not the
    // default pool's, so the GPU was full for it (counting P's hole would call it fragmentation: 26 >= 16).
    let t = graph_pool_snapshot((1, 0), true, true);
    let x =
        gpuheap::explain::explain_oom(&t.devices[0], 4, Some(0), &config_for_trace(&t.devices[0], 1 << 40).0).unwrap();
    assert_eq!(x.verdict, gpuheap::explain::Verdict::Capacity);
}

#[test]
fn verl_private_pools_are_reported_per_pool() {
    let Some(p) = common::shared("traces/verl_mem_private_pools.pickle") else { return };
    let t = read_trace(&p).unwrap();
    let dev = &t.devices[0];
    let st = final_state(dev.final_state.as_ref().unwrap(), None).unwrap();
    // scripts/snapshot-facts.py: per segment_pool_id (segments, reserved, allocated, holes, largest hole).
    let want = [
        (MempoolId(0, 0), 59, 3_810_525_184, 3_221_261_312, 589_263_872, 272_629_760),
        (MempoolId(0, 1), 44, 585_105_408, 498_546_688, 86_558_720, 16_613_376),
        (MempoolId(0, 2), 24, 21_793_603_584, 21_793_603_584, 0, 0),
    ];
    let got: Vec<_> = st
        .pools
        .iter()
        .map(|p| (p.mempool, p.segments, p.reserved, p.allocated, p.hole_bytes, p.largest_hole))
        .collect();
    assert_eq!(got, want);
    // No history: explain gives the bounds at PyTorch's reserved 26,189,234,176 B (0 B free), default pool only:
    // fits up to the 287,309,824 B of its 8 entirely free segments (a plain unpickler), which PyTorch releases
    // before failing (more than its largest hole, 272,629,760 B), may fail up to its 589,263,872 B of holes
    // (not 675,822,592 B with the vLLM weights pool's 86,558,720 B).
    let e = explain(&t, None, None).unwrap();
    let b = e.request_bounds.expect("a dumped state has bounds");
    assert_eq!((b.capacity, b.device_free), (26_189_234_176, 0));
    assert_eq!((b.fits_up_to, b.fragmentation_up_to, b.other_pools_hole_bytes), (287_309_824, 589_263_872, 86_558_720));
    assert_eq!(e.history.history, History::None);
    // Seeded in their pools, the model reproduces the state.
    let r = replay_at(&t, dev, None);
    assert_eq!(r.end_fidelity().unwrap().reserved, Some(0.0));
    assert_eq!(r.caching_end.as_ref().unwrap().segments, 127);
}

/// Initial segments A (20 MiB, free) and B (20 MiB, a 10 MiB tensor); the history releases A, then a new
/// segment C of 40 MiB is allocated for a 40 MiB tensor. Reserved: 40 MiB before the release, 60 MiB at the
/// end (its peak); 40 + 40 = 80 MiB > 60 MiB, so without frames the order shows a failed `cudaMalloc`.
/// `frames`: what the release entry's frames name.
const A: u64 = 0x7f00_0000_0000;
const B: u64 = 0x7f00_0200_0000;
const C: u64 = 0x7f00_0800_0000;
fn release_snapshot(frames: Option<&'static str>) -> Trace {
    let segs = vec![
        segment(
            B,
            20 * MIB,
            (0, 0),
            vec![block(B, 10 * MIB, 10 * MIB, "active_allocated"), block(B + 10 * MIB, 10 * MIB, 0, "inactive")],
        ),
        segment(C, 40 * MIB, (0, 0), vec![block(C, 40 * MIB, 40 * MIB, "active_allocated")]),
    ];
    let fr = |name: &'static str| {
        vec![(
            "frames",
            V::List(vec![V::Dict(vec![("name", V::Str(name)), ("filename", V::Str("x")), ("line", V::Int(0))])]),
        )]
    };
    let extra = frames.map_or_else(Vec::new, fr);
    let events = vec![
        event("segment_free", A, 20 * MIB, extra),
        event("segment_alloc", C, 40 * MIB, vec![]),
        event("alloc", C, 40 * MIB, vec![]),
    ];
    parse(vec![("segments", V::List(segs)), ("device_traces", V::List(vec![V::List(events)]))])
}

#[test]
fn a_release_after_a_failed_cuda_malloc_is_left_to_the_model() {
    for (frames, evidence) in [
        (None, ReleaseEvidence::FollowedByNewSegment),
        (Some("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"), ReleaseEvidence::MallocFrames),
    ] {
        let t = release_snapshot(frames);
        let dev = &t.devices[0];
        let rel = recorded_releases(dev);
        assert_eq!(rel.len(), 1);
        assert_eq!((rel[0].cause, rel[0].evidence, rel[0].bytes), (ReleaseCause::Allocator, evidence, 20 * MIB));
        assert_eq!((rel[0].reserved_before, rel[0].next_segment, rel[0].failed_request_bound()), (40 * MIB, Some((1, 40 * MIB)), Some(80 * MIB)));
        // At 64 MiB the model's own cudaMalloc fails, it releases A and retries, as PyTorch did.
        let r = replay_at(&t, dev, Some(64 * MIB));
        let end = r.caching_end.as_ref().unwrap();
        assert_eq!((r.peak_reserved, end.reserved, end.alloc_retries), (60 * MIB, 60 * MIB, 1));
        assert_eq!(r.recorded_releases, rel);
        // At 128 MiB nothing fails: A stays cached (80 MiB), where replaying the release would give 60 MiB.
        let r = replay_at(&t, dev, Some(128 * MIB));
        assert_eq!((r.peak_reserved, r.caching_end.as_ref().unwrap().alloc_retries), (80 * MIB, 0));
        // The default capacity is the recorded peak (every command's rule), below the failed request's
        // bound: the model's own cudaMalloc fails there too.
        let r = replay_at(&t, dev, None);
        assert_eq!(r.capacity.bytes, 60 * MIB);
        assert_eq!(r.capacity.source, CapacitySource::PeakReserved);
        assert_eq!((r.peak_reserved, r.caching_end.as_ref().unwrap().reserved), (60 * MIB, 60 * MIB));
    }
}

#[test]
fn an_empty_cache_release_stays_a_recorded_event() {
    let t = release_snapshot(Some("empty_cache"));
    let dev = &t.devices[0];
    let rel = recorded_releases(dev);
    assert_eq!((rel[0].cause, rel[0].evidence), (ReleaseCause::Program, ReleaseEvidence::EmptyCacheFrames));
    let r = replay_at(&t, dev, Some(128 * MIB));
    assert_eq!((r.peak_reserved, r.caching_end.as_ref().unwrap().reserved), (60 * MIB, 60 * MIB));
    assert_eq!(r.capacity.bytes, 128 * MIB);
}

#[test]
fn octree_release_after_the_failed_cuda_malloc_is_the_models_to_decide() {
    let Some(p) = common::shared("traces/octree_nca_peso_slide_inference.pickle") else { return };
    let t = read_trace(&p).unwrap();
    let dev = &t.devices[0];
    // scripts/snapshot-facts.py: one run, events 2045-2061, 9,982,443,520 B, frames through malloc, reserved
    // 19,639,828,480 B before it, then the segment_alloc of 7,354,712,064 B at event 2062.
    let rel = recorded_releases(dev);
    assert_eq!(rel.len(), 1);
    let r0 = &rel[0];
    assert_eq!((r0.first_event, r0.last_event, r0.segments, r0.bytes), (2045, 2061, 17, 9_982_443_520));
    assert_eq!((r0.cause, r0.evidence), (ReleaseCause::Allocator, ReleaseEvidence::MallocFrames));
    assert_eq!((r0.reserved_before, r0.next_segment), (19_639_828_480, Some((2062, 7_354_712_064))));
    // Default capacity: the recorded peak reserved, 24,366,809,088 B (22.69 GiB), below 19,639,828,480 +
    // 7,354,712,064 B: the model's cudaMalloc fails where PyTorch's did and it ends at the snapshot's
    // reserved bytes.
    let r = replay_at(&t, dev, None);
    assert_eq!(r.capacity.bytes, 24_366_809_088);
    let end = r.caching_end.as_ref().unwrap();
    assert_eq!((r.peak_reserved, end.reserved, end.alloc_retries), (24_366_809_088, 24_366_809_088, 1));
    let (cfg, _) = config_for_trace(dev, r.capacity.bytes);
    let f = fidelity(dev, cfg).unwrap();
    assert_eq!((f.max_deviation, f.placement_mismatches), (0, 0));
    // On an 80 GiB GPU nothing fails: the 9.98 GB stay cached, and the peak is the reserved bytes before the
    // release plus the new segment, 26,994,540,544 B (25.14 GiB), by the model's own rules.
    let r = replay_at(&t, dev, Some(80 * GIB));
    assert_eq!(r.peak_reserved, 19_639_828_480 + 7_354_712_064);
    assert_eq!(r.caching_end.as_ref().unwrap().alloc_retries, 0);
    assert!(r.failed.is_empty());
}

#[test]
fn one_entry_histories_keep_the_bounds_of_a_dumped_state() {
    // layoutediting (legacy _record_memory_history(enabled=True, device=...)): device 1 holds one
    // free_completed; scripts/snapshot-facts.py: reserved 11,274,289,152 B, holes 558,507,008 B, largest
    // 134,217,728 B. The capacity is the reserved peak, so 0 B are free on the device; 8 segments of
    // 228,589,568 B are entirely free (a plain unpickler), which PyTorch releases before failing, so a new
    // segment of up to that serves.
    if let Some(p) = common::shared("traces/layoutediting_sd_guided_diffusion.pickle") {
        let t = read_trace(&p).unwrap();
        let e = explain(&t, Some(1), None).unwrap();
        assert_eq!(e.history.history, History::OneEntry);
        assert_eq!(e.history.costs, vec![HistoryCost::OnlyFinalState]);
        assert_eq!(e.moment, gpuheap::explain::Moment::DumpedState);
        assert_eq!((e.reserved, e.segments), (11_274_289_152, 673));
        let b = e.request_bounds.expect("bounds");
        assert_eq!((b.device_free, b.fits_up_to, b.fragmentation_up_to), (0, 228_589_568, 558_507_008));
        assert_eq!((b.released_segments, b.released_before_failure), (8, 228_589_568));
        let dev = t.devices.iter().find(|d| d.device == 1).unwrap();
        let (p, pr) = (peaks(dev), facts::pytorch_series(dev));
        assert_eq!((p.allocated, pr.peak), (10_634_324_546, 11_274_289_152));
        assert_eq!(replay_at(&t, dev, None).end_fidelity().unwrap().reserved, Some(0.0));
    }
    // blockzero: one segment_free of 2 MiB (empty_cache, no frames). Before it PyTorch reserved
    // 31,845,253,120 B (the capacity), at the dump 31,843,155,968 B: 2,097,152 B free on the device; holes
    // 8,473,088 B, largest 4,063,232 B.
    if let Some(p) = common::shared("traces/blockzero_moe_validator_after_eval.pickle") {
        let t = read_trace(&p).unwrap();
        let e = explain(&t, None, None).unwrap();
        assert_eq!((e.history.history.clone(), e.moment), (History::OneEntry, gpuheap::explain::Moment::DumpedState));
        assert_eq!((e.capacity.bytes, e.reserved, e.segments), (31_845_253_120, 31_843_155_968, 926));
        let b = e.request_bounds.expect("bounds");
        assert_eq!((b.device_free, b.fits_up_to, b.fragmentation_up_to), (2_097_152, 4_063_232, 2_097_152 + 8_473_088));
        let rel = recorded_releases(&t.devices[0]);
        assert_eq!((rel.len(), rel[0].cause, rel[0].evidence), (1, ReleaseCause::Program, ReleaseEvidence::NoEvidence));
    }
}

#[test]
fn histories_without_entries_are_dumped_states() {
    // The bare-list format (torch.cuda.memory_snapshot()): reserved 3,649,044,480 B, allocated
    // 3,353,639,424 B, holes 295,405,056 B, largest 31,457,280 B (scripts/snapshot-facts.py).
    let Some(p) = common::shared("traces/layoutediting_memory_snapshot_list.pkl") else { return };
    let t = read_trace(&p).unwrap();
    let e = explain(&t, None, None).unwrap();
    assert_eq!((e.device.device, e.history.history.clone()), (1, History::None));
    assert_eq!(
        (e.reserved, e.allocated, e.reserved_unallocated, e.largest_hole),
        (3_649_044_480, 3_353_639_424, 295_405_056, 31_457_280)
    );
    let b = e.request_bounds.expect("bounds");
    assert_eq!((b.fits_up_to, b.fragmentation_up_to), (31_457_280, 295_405_056));
}

#[test]
#[allow(clippy::type_complexity)] // one row of figures per file, named in the comment below
fn complete_histories_of_the_new_snapshots_match_their_files() {
    // (file, entries, peak live, its event, peak reserved, its event, final reserved), scripts/snapshot-facts.py.
    let cases: [(&str, usize, u128, Option<usize>, u128, Option<usize>, u64); 4] = [
        (
            "ftcourse_tinyllama_qlora_fwd_bwd.pickle",
            10_307,
            5_876_132_840,
            Some(3697),
            6_471_811_072,
            Some(3705),
            6_471_811_072,
        ),
        ("eor_nn_vae_latent_counterfactual.pickle", 5_803, 108_258_676, Some(759), 134_217_728, Some(757), 134_217_728),
        (
            "octree_nca_peso_slide_inference.pickle",
            2_375,
            18_497_927_040,
            Some(2093),
            24_366_809_088,
            Some(2089),
            24_366_809_088,
        ),
        ("cs336_bcrafton_memory_snapshot.pickle", 6_486, 3_849_232_640, Some(1843), 4_238_344_192, None, 4_238_344_192),
    ];
    for (name, entries, live, live_at, reserved, reserved_at, fin) in cases {
        let Some(p) = common::shared(&format!("traces/{name}")) else { continue };
        let t = read_trace(&p).unwrap();
        let dev = &t.devices[0];
        let h = history_completeness(dev);
        assert!(h.is_complete(), "{name}: {h:?}");
        assert_eq!(h.entries, entries, "{name}");
        let pk = peaks(dev);
        assert_eq!((pk.allocated, pk.allocated_event), (live, live_at), "{name}");
        assert_eq!(pk.reserved, reserved, "{name}");
        if reserved_at.is_some() {
            assert_eq!(facts::pytorch_series(dev).peak_event, reserved_at, "{name}");
        }
        let r = replay_at(&t, dev, None);
        let f = r.end_fidelity().unwrap();
        assert_eq!((f.snapshot_reserved, f.reserved), (fin, Some(0.0)), "{name}");
        assert!(r.failed.is_empty(), "{name}");
        let (util, jw) = pytorch_ratios(live as u64, reserved as u64, &h);
        assert!(util.is_some_and(|u| u <= 1.0) && jw.is_some_and(|j| j >= 0.0), "{name}");
    }
}

fn with_settings(settings: Vec<(&str, V)>, events: usize) -> DeviceTrace {
    let segs = vec![segment(A, 20 * MIB, (0, 0), vec![block(A, 20 * MIB, 0, "inactive")])];
    let ev: Vec<V> = (0..events).map(|_| event("snapshot", 0, 0, vec![])).collect();
    let t = parse(vec![
        ("segments", V::List(segs)),
        ("device_traces", V::List(vec![V::List(ev)])),
        ("allocator_settings", V::Dict(settings)),
    ]);
    t.devices.into_iter().next().unwrap()
}

#[test]
fn overflowed_and_skipped_histories_are_recognised_with_their_cost() {
    // PR#179276: the snapshot says the ring buffer overflowed.
    let d = with_settings(vec![("trace_alloc_max_entries", V::Int(3)), ("trace_alloc_overflowed", V::Bool(true))], 3);
    let h = history_completeness(&d);
    assert_eq!(h.history, History::Overflowed { max_entries: Some(3), recorded: true });
    assert_eq!(h.costs, vec![HistoryCost::RecordedWindowOnly]);
    // Without the flag, a history exactly as long as the buffer has wrapped (or is about to: no proof it did not).
    let d = with_settings(vec![("trace_alloc_max_entries", V::Int(3))], 3);
    assert_eq!(history_completeness(&d).history, History::Overflowed { max_entries: Some(3), recorded: false });
    let d = with_settings(vec![("trace_alloc_max_entries", V::Int(3)), ("trace_alloc_overflowed", V::Bool(false))], 3);
    assert!(history_completeness(&d).is_complete());
    // PR#168183: skipped allocs leave live bytes unknown, and no ratio is computed from them.
    let d = with_settings(vec![("skip_actions", V::List(vec![V::Str("alloc"), V::Str("segment_free")]))], 2);
    let h = history_completeness(&d);
    assert_eq!(h.skipped_actions, vec!["alloc", "segment_free"]);
    assert_eq!(h.costs, vec![HistoryCost::LiveBytesUnknown, HistoryCost::ReservedBytesUnknown]);
    assert_eq!(pytorch_ratios(10, 20, &h), (None, None));
    // Only free_requested skipped: nothing is lost for the byte counts.
    let d = with_settings(vec![("skip_actions", V::List(vec![V::Str("free_requested")]))], 2);
    assert_eq!(history_completeness(&d).costs, vec![]);
}

#[test]
fn a_live_block_outside_every_segment_is_named_and_the_fidelity_line_divides_by_nothing() {
    // 64 MiB allocated by the history, and a final state with no segment at all.
    let t = parse(vec![
        ("segments", V::List(vec![])),
        ("device_traces", V::List(vec![V::List(vec![event("alloc", 0x7f00_0000_0000, 64 * MIB, vec![])])])),
    ]);
    let dev = &t.devices[0];
    let h = history_completeness(dev);
    assert_eq!(h.blocks_outside_segments.len(), 1);
    let b = h.blocks_outside_segments[0];
    assert_eq!((b.addr, b.size, b.alloc_event), (0x7f00_0000_0000, 64 * MIB, Some(0)));
    assert!(b.to_string().starts_with("block at 0x7f0000000000 (64.00 MiB, allocated at event 0)"), "{b}");
    let r = replay_at(&t, dev, None);
    let f = r.end_fidelity().unwrap();
    assert_eq!((f.model_reserved, f.snapshot_reserved, f.reserved, f.segments), (64 * MIB, 0, None, None));
    // Live bytes above PyTorch's reserved bytes: a ratio from missing entries, not computed.
    assert_eq!(pytorch_ratios(64 * MIB, 0, &h), (None, None));
    let path = std::env::temp_dir().join(format!("gpuheap-outside-{}.pickle", std::process::id()));
    std::fs::write(
        &path,
        pickle(&V::Dict(vec![
            ("segments", V::List(vec![])),
            ("device_traces", V::List(vec![V::List(vec![event("alloc", 0x7f00_0000_0000, 64 * MIB, vec![])])])),
        ])),
    )
    .unwrap();
    let out = common::gpuheap(&["replay", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("n/a (the snapshot has 0 B) reserved"), "{stdout}");
    assert!(!stdout.contains("+0.00 %"), "{stdout}");
    assert!(stderr.contains("warning: block at 0x7f0000000000 (64.00 MiB, allocated at event 0)"), "{stderr}");
}

#[test]
fn the_caching_model_serves_a_private_pool_only_from_its_own_segments() {
    // PyTorch's get_pool: a request in pool 1 does not take the default pool's cached block, and frees go
    // back to the block's own pool.
    let mut c = caching::CachingAllocator::new(CachingConfig::new(GIB)).unwrap();
    let a = c.alloc_in(4 * MIB, 0, 0).unwrap();
    gpuheap::reference::SubAllocator::free(&mut c, a).unwrap();
    let b = c.alloc_in(4 * MIB, 0, 1).unwrap();
    assert_ne!(b.offset, a.offset);
    assert_eq!(c.reserved_bytes(), 40 * MIB, "pool 1 gets its own 20 MiB segment");
    gpuheap::reference::SubAllocator::free(&mut c, b).unwrap();
    let a2 = c.alloc_in(4 * MIB, 0, 0).unwrap();
    assert_eq!(a2.offset, a.offset, "the default pool reuses its own block");
    let segs = c.segments();
    assert_eq!(segs.iter().map(|s| s.mempool).collect::<Vec<_>>(), vec![0, 1]);
    // empty_cache releases the default pool's free segments only (a private pool is released once freeable,
    // which a trace records as its own segment_free).
    gpuheap::reference::SubAllocator::free(&mut c, a2).unwrap();
    assert_eq!(c.empty_cache(), 20 * MIB);
    assert_eq!(c.reserved_bytes(), 20 * MIB);
}

#[test]
fn dumped_state_bounds_follow_the_recorded_settings() {
    // A history-less dump, all reserved (capacity = peak reserved, 0 B free on the device): a 2 MiB
    // small-pool segment with a 1 MiB hole and a 600 MiB large-pool segment with a 500 MiB hole.
    const S: u64 = A + 1024 * MIB;
    let small = || {
        V::Dict(vec![
            ("device", V::Int(0)),
            ("address", V::Int(S as i128)),
            ("total_size", V::Int((2 * MIB) as i128)),
            ("stream", V::Int(0)),
            ("segment_type", V::Str("small")),
            ("segment_pool_id", V::Tuple(vec![V::Int(0), V::Int(0)])),
            ("is_expandable", V::Bool(false)),
            ("blocks", V::List(vec![block(S, MIB, MIB, "active_allocated"), block(S + MIB, MIB, 0, "inactive")])),
        ])
    };
    let large = || {
        segment(
            A,
            600 * MIB,
            (0, 0),
            vec![block(A, 100 * MIB, 100 * MIB, "active_allocated"), block(A + 100 * MIB, 500 * MIB, 0, "inactive")],
        )
    };
    let bounds = |settings: Vec<(&str, V)>| {
        let top = vec![
            ("segments", V::List(vec![small(), large()])),
            ("device_traces", V::List(vec![V::List(vec![])])),
            ("allocator_settings", V::Dict(settings)),
        ];
        explain_of(top, None).request_bounds.expect("a dumped state has bounds")
    };
    let d = bounds(vec![]);
    assert_eq!((d.device_free, d.fits_up_to, d.fragmentation_up_to), (0, 500 * MIB, 501 * MIB));
    // max_split_size 100 MiB (`get_free_block`): the 500 MiB hole serves no request below 100 MiB, and
    // above it only those within max_non_split_rounding (20 MiB) of 500 MiB: beyond 1 MiB, nothing is sure.
    let m = bounds(vec![("max_split_size", V::Int((100 * MIB) as i128))]);
    assert_eq!((m.device_free, m.fits_up_to, m.fragmentation_up_to), (0, MIB, 501 * MIB));
}

/// The bounds of a dumped state follow `DeviceCachingAllocator::malloc`'s path to OOM
/// (c10/cuda/CUDACachingAllocator.cpp): a cached block (`get_free_block`), a new segment (`alloc_block`),
/// and after `release_available_cached_blocks` / `release_cached_blocks` (the default pool's entirely
/// free segments) a new segment again; per pool (small: up to 1 MiB; large). The entirely free segments
/// (one `inactive` block, not expandable, pool (0, 0)) and the largest holes per pool come from a plain
/// unpickler (every global refused): attention_sd: 53 segments, 6,308,233,216 B; sketchkv2: 2 segments,
/// 486,539,264 B; docubox: none, largest small-pool hole 917,504 B, largest large-pool hole 11,534,336 B.
/// Each bound is then asked of the caching model seeded with the state: a request at the bound is
/// served, one a byte above it is not (unless the pool ends there).
#[test]
fn dumped_bounds_follow_pytorchs_release_and_retry_per_pool() {
    for (file, segments, released, largest_hole) in [
        ("traces/attention_sd_img2img_vit_guidance_fragmented.pickle", 53, 6_308_233_216u64, 541_065_216),
        ("traces/sketchkv2_llama2_7b_sketch_kv_cache_prefill.pickle", 2, 486_539_264, 452_984_832),
        ("traces/docubox_minilm_embeddings_after_empty_cache.pickle", 0, 0, 11_534_336),
    ] {
        let Some(p) = common::shared(file) else { continue };
        let t = read_trace(&p).unwrap_or_else(|e| panic!("{file}: {e}"));
        let e = explain(&t, None, None).unwrap_or_else(|e| panic!("{file}: {e}"));
        let b = e.request_bounds.unwrap_or_else(|| panic!("{file}: a dumped state has bounds"));
        assert_eq!((b.released_segments, b.released_before_failure), (segments, released), "{file}");
        let dev = t.devices.iter().find(|d| !d.initial_blocks.is_empty() || !d.events.is_empty()).unwrap();
        let (cfg, _) = config_for_trace(dev, b.capacity);
        let served = |size: u64| {
            let mut s = caching::seed_from_trace(dev, cfg).unwrap();
            s.model.alloc_on(size, 0).is_ok()
        };
        assert!(b.small_pool_up_to > 0 && served(b.small_pool_up_to), "{file}: {b:?}");
        if b.small_pool_up_to < MIB {
            assert!(!served(b.small_pool_up_to + 1), "{file}: {b:?}");
        }
        assert!(served(b.large_pool_up_to) && !served(b.large_pool_up_to + 1), "{file}: {b:?}");
        assert!(b.large_pool_up_to >= b.fits_up_to && b.fits_up_to >= b.small_pool_up_to.min(MIB), "{file}: {b:?}");
        if segments > 0 {
            // The release serves a request larger than any hole.
            assert!(b.large_pool_up_to > largest_hole, "{file}: {b:?}");
        }
    }
    // docubox: the small pool's 896 KiB hole bounds small requests; the 11 MiB large-pool hole serves 11 MiB.
    if let Some(p) = common::shared("traces/docubox_minilm_embeddings_after_empty_cache.pickle") {
        let b = explain(&read_trace(&p).unwrap(), None, None).unwrap().request_bounds.unwrap();
        assert_eq!(b.small_pool_up_to, 917_504, "{b:?}");
        assert!(b.large_pool_up_to >= 11_534_336, "{b:?}");
        let text = explain(&read_trace(&p).unwrap(), None, None).unwrap().render_text();
        assert!(text.contains("in the small pool (requests up to 1 MiB) a request up to 896.00 KiB fits"), "{text}");
    }
}
