//! Trace replay: the fidelity check of the caching model against PyTorch's own snapshot, replays of
//! every strategy on every trace file, compaction measured with the real kernel, option parsing.
//!
//! Fidelity tolerance: replaying a PyTorch snapshot through the caching model must end with the
//! reserved bytes within 1 % and the segment count within 2 % of the snapshot's final state. (On
//! `memory_ctx512_fullstep_.pickle` the model is exact: 62,830,673,920 B in 820 segments.)

use std::path::{Path, PathBuf};

use gpuheap::backend::Backend;
use gpuheap::facts::{demand_peak, pytorch_series};
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{self, default_capacity, CompactPolicy, MeasureOutcome, ReplayOptions, ReplayReport};
use gpuheap::trace::{read_trace, Trace};
use gpuheap::units::parse_bytes;

mod common;
use common::workspace;

/// A trace of the shared folder's `traces/` (`None`, or a failure under `GPUHEAP_REQUIRE_SHARED=1`,
/// when it is absent).
fn shared(file: &str) -> Option<PathBuf> {
    common::shared(&format!("traces/{file}"))
}

fn run(trace: &Trace, opts: &ReplayOptions, backend: Option<&Backend>) -> ReplayReport {
    replay::replay(trace, &trace.devices[0], opts, backend, &mut |_| {}).expect("replays")
}

fn all_trace_files() -> Vec<PathBuf> {
    let mut v = vec![workspace().join("data/1.3b_snapshot.pickle"), workspace().join("data/K.1048576.csv")];
    for f in ["memory_ctx512_fullstep_.pickle", "1.3b_snapshot.pickle", "K.1048576.csv"] {
        v.extend(shared(f));
    }
    v
}

#[test]
fn fidelity_caching_model_reproduces_the_ctx512_snapshot() {
    let Some(p) = shared("memory_ctx512_fullstep_.pickle") else { return };
    let t = read_trace(&p).unwrap();
    let r = run(&t, &ReplayOptions::new(StrategyKind::Caching), None);
    let pt = r.pytorch.as_ref().unwrap();
    let (want_res, want_segs) = (pt.snapshot_reserved.unwrap(), pt.snapshot_segments.unwrap());
    assert_eq!((want_res, want_segs), (62_830_673_920, 820), "the snapshot's final state (SOURCES.md: 58.52 GiB, 820)");
    let c = r.caching_end.as_ref().unwrap();
    let res_err = (c.reserved as f64 - want_res as f64).abs() / want_res as f64;
    let seg_err = (c.segments as f64 - want_segs as f64).abs() / want_segs as f64;
    println!(
        "caching model: {} B in {} segments; snapshot {want_res} B in {want_segs}; errors {:.4} % / {:.4} %",
        c.reserved,
        c.segments,
        res_err * 100.0,
        seg_err * 100.0
    );
    assert!(res_err <= 0.01, "reserved bytes within 1 %");
    assert!(seg_err <= 0.02, "segment count within 2 %");
    assert!(r.failed.is_empty(), "PyTorch served every request; so does its model: {:?}", &r.failed[..1]);
    // The model's peak equals PyTorch's peak from its segment events.
    assert_eq!(r.peak_reserved, pt.peak);
    assert_eq!(r.peak_allocated, demand_peak(&t.devices[0]).1);
}

#[test]
fn pytorch_series_agrees_with_the_final_state() {
    for p in all_trace_files() {
        let t = read_trace(&p).unwrap();
        let d = &t.devices[0];
        let s = pytorch_series(d);
        if let (Some(res), Some(n)) = (s.snapshot_reserved, s.snapshot_segments) {
            assert_eq!((s.end, s.end_segments), (res, n), "{}", p.display());
            assert!(s.peak >= s.end && s.peak >= s.initial);
        }
    }
}

#[test]
fn shipped_inference_snapshot_caching_model_matches() {
    let t = read_trace(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    let r = run(&t, &ReplayOptions::new(StrategyKind::Caching), None);
    let c = r.caching_end.unwrap();
    let pt = r.pytorch.unwrap();
    assert_eq!(c.reserved, pt.snapshot_reserved.unwrap());
    assert_eq!(c.segments, pt.snapshot_segments.unwrap());
    assert_eq!(c.seeded_segments, 257);
    // Reserved-but-unallocated at the end = PyTorch's reserved minus the requested bytes live.
    assert_eq!(r.at_end.footprint, pt.snapshot_reserved.unwrap());
    assert_eq!(r.at_end.reserved_unallocated, r.at_end.footprint - r.at_end.allocated);
    assert_eq!(r.at_end.rounding_waste + r.at_end.holes, r.at_end.reserved_unallocated);
    // Every command's capacity rule: PyTorch's recorded peak reserved bytes (7.09 GiB), never rounded up.
    assert_eq!(default_capacity(&t, &t.devices[0]).unwrap().bytes, 7_608_467_456);
    assert_eq!(r.peak_reserved, 7_608_467_456, "the model reaches the recorded peak exactly");
}

#[test]
fn every_strategy_replays_every_trace_consistently() {
    for p in all_trace_files() {
        let t = read_trace(&p).unwrap();
        let d = &t.devices[0];
        let (_, demand) = demand_peak(d);
        for k in StrategyKind::ALL {
            let opts = {
                let mut o = ReplayOptions::new(k);
                o.timeline_points = 500;
                o
            };
            let r = match replay::replay(&t, d, &opts, None, &mut |_| {}) {
                Ok(r) => r,
                Err(e) => {
                    // Only the caching model refuses a capacity (the 1 MiB minimalloc instance).
                    assert!(k == StrategyKind::Caching && e.is_input(), "{k} on {}: {e}", p.display());
                    continue;
                }
            };
            let what = format!("{k} on {}", p.display());
            assert_eq!(r.events, d.events.len(), "{what}");
            assert!(r.peak_allocated <= demand, "{what}");
            if r.failed.is_empty() {
                assert_eq!(r.peak_allocated, demand, "{what}: no failure, the whole demand was served");
            }
            assert!(r.peak_reserved <= r.capacity.bytes, "{what}: footprint within capacity");
            assert!(r.peak_reserved >= r.peak_allocated || r.peak_allocated == 0, "{what}");
            assert!(r.timeline.len() <= 501 && !r.timeline.is_empty() || d.events.is_empty(), "{what}");
            for f in &r.failed {
                assert!(["capacity", "fragmentation", "rounding", "rejected"].contains(&f.class.as_str()), "{what}");
                if f.class == "capacity" {
                    assert!(f.free < f.size, "{what}: capacity failures cannot fit even compacted");
                }
            }
            for s in [&r.at_peak, &r.at_end] {
                assert_eq!(s.reserved_unallocated, s.footprint.saturating_sub(s.allocated), "{what}");
                assert!((0.0..=1.0).contains(&s.external), "{what}");
            }
            assert!(r.johnstone_wilson >= 0.0 && r.utilisation <= 1.0 + 1e-12, "{what}");
        }
    }
}

#[test]
fn minimalloc_capacity_from_the_file_name_and_failures_classified() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    assert_eq!(default_capacity(&t, &t.devices[0]).unwrap().bytes, 1_048_576);
    let r = run(&t, &ReplayOptions::new(StrategyKind::FirstFit), None);
    // The peak of live bytes is exactly the capacity: only a perfect packing would succeed.
    assert_eq!(demand_peak(&t.devices[0]).1, 1_048_576);
    assert!(!r.failed.is_empty());
    assert!(r.failed.iter().any(|f| f.class == "fragmentation"), "some requests would fit after compaction");
}

#[test]
fn on_oom_compaction_is_measured_checked_and_saves_requests() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let backend = Backend::cpu();
    let never = run(&t, &ReplayOptions::new(StrategyKind::FirstFit), None);
    let opts = {
        let mut o = ReplayOptions::new(StrategyKind::FirstFit);
        o.policy = CompactPolicy::OnOom;
        o
    };
    let r = run(&t, &opts, Some(&backend));
    assert!(!r.compactions.is_empty());
    assert!(r.failed.len() < never.failed.len(), "{} < {}", r.failed.len(), never.failed.len());
    for c in &r.compactions {
        assert_eq!(c.trigger, "on-oom");
        assert!(c.planned_bytes_moved > 0);
        assert_eq!(c.external_after, 0.0, "first-fit's free space is one extent after a slide");
        let MeasureOutcome::Measured(m) = &c.measurement else { panic!("not measured: {:?}", c.measurement) };
        assert_eq!(m.scaled_by, 1);
        assert_eq!(m.bytes_moved, c.planned_bytes_moved, "the kernel moved what the reference plan moves");
        assert_eq!(m.blocks_moved as usize, c.planned_units_moved);
        assert!(m.layout_checked && m.bytes_checked);
        assert!(m.gbps > 0.0 && m.kernel_ns > 0);
    }
    assert!(r.compactions.iter().any(|c| c.retry_succeeded == Some(true)));
}

#[test]
fn a_small_materialisation_limit_compacts_a_scaled_image() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let backend = Backend::cpu();
    let opts = {
        let mut o = ReplayOptions::new(StrategyKind::BestFit);
        o.policy = CompactPolicy::OnOom;
        o.materialize_limit = Some(64 << 10);
        o
    };
    let r = run(&t, &opts, Some(&backend));
    let scaled: Vec<_> =
        r.compactions.iter().filter_map(|c| c.measurement.measured()).filter(|m| m.scaled_by > 1).collect();
    assert!(!scaled.is_empty(), "some image exceeded 64 KiB and was scaled");
    for m in scaled {
        assert!(m.image_bytes <= 64 << 10);
        assert!(m.layout_checked && m.bytes_checked);
    }
}

#[test]
fn caching_segments_compact_per_segment_with_the_kernel() {
    let Some(p) = shared("memory_ctx512_fullstep_.pickle") else { return };
    let t = read_trace(&p).unwrap();
    let backend = Backend::cpu();
    let opts = {
        let mut o = ReplayOptions::new(StrategyKind::Caching);
        o.policy = CompactPolicy::Threshold(0.9);
        o.materialize_limit = Some(32 << 20);
        o
    };
    let r = run(&t, &opts, Some(&backend));
    assert!(!r.compactions.is_empty());
    for c in &r.compactions {
        let m = c.measurement.measured().expect("caching segments slide toward their starts: measurable");
        assert!(m.layout_checked && m.bytes_checked);
        assert!(c.footprint_after <= c.footprint_before, "segments are trimmed, never grown");
    }
}

#[test]
fn buddy_plans_with_alignment_gaps_are_not_measured() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let backend = Backend::cpu();
    let opts = {
        let mut o = ReplayOptions::new(StrategyKind::Buddy);
        o.policy = CompactPolicy::Threshold(0.0);
        o
    };
    let r = run(&t, &opts, Some(&backend));
    for c in &r.compactions {
        if let MeasureOutcome::NotMeasured { reason } = &c.measurement {
            assert!(reason.contains("alignment"), "{reason}");
        }
    }
}

#[test]
fn options_parse() {
    assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
    assert_eq!(parse_bytes("1.5e9"), Ok(1_500_000_000));
    assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
    assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
    assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
    // Whole numbers are exact up to 2^64 - 1 (a float would round them).
    assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
    assert_eq!(parse_bytes("9007199254740993"), Ok(9_007_199_254_740_993));
    assert_eq!(parse_bytes("3KiB"), Ok(3072));
    for bad in ["", "-1", "lots", "1e30", "5 parsecs", "nan", "16777216TiB", "18446744073709551616"] {
        assert!(parse_bytes(bad).is_err(), "{bad}");
    }
    assert_eq!("never".parse::<CompactPolicy>(), Ok(CompactPolicy::Never));
    assert_eq!("on-oom".parse::<CompactPolicy>(), Ok(CompactPolicy::OnOom));
    assert_eq!("threshold=0.25".parse::<CompactPolicy>(), Ok(CompactPolicy::Threshold(0.25)));
    assert!("threshold=2".parse::<CompactPolicy>().is_err());
    assert!("sometimes".parse::<CompactPolicy>().is_err());
}

#[test]
fn each_format_has_its_default_strategy_and_alignment() {
    let csv = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let snap = read_trace(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    assert_eq!(replay::default_strategy(&csv), StrategyKind::BestFit);
    assert_eq!(replay::default_strategy(&snap), StrategyKind::Caching);
    assert_eq!(replay::alignment_for(&csv), 1, "minimalloc instances are byte-granular");
    assert_eq!(replay::alignment_for(&snap), 512, "PyTorch's kMinBlockSize");
    // The shipped CSV runs with its default strategy (the caching model would need 2 MiB).
    let r = run(&csv, &ReplayOptions::new(replay::default_strategy(&csv)), None);
    assert_eq!((r.strategy.as_str(), r.align), ("best-fit", 1));
    assert!(r.align_source.contains("minimalloc"), "{}", r.align_source);
    // A given alignment is used and said to be given; a bad one is bad input.
    let r = run(
        &csv,
        &{
            let mut o = ReplayOptions::new(StrategyKind::BestFit);
            o.align = Some(256);
            o
        },
        None,
    );
    assert_eq!((r.align, r.align_source.as_str()), (256, "given"));
    let bad = {
        let mut o = ReplayOptions::new(StrategyKind::BestFit);
        o.align = Some(3);
        o
    };
    assert!(replay::replay(&csv, &csv.devices[0], &bad, None, &mut |_| {}).unwrap_err().is_input());
}

#[test]
fn tiered_per_tier_statistics_add_up_to_the_trace() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let d = &t.devices[0];
    let (small_max, large_min) = (1024u64, 64 << 10);
    let opts = {
        let mut o = ReplayOptions::new(StrategyKind::Tiered);
        o.tiers = Some((small_max, large_min));
        o
    };
    let r = run(&t, &opts, None);
    let tiers = r.tiers.as_ref().expect("the tiered strategy reports its tiers");
    assert_eq!(tiers.iter().map(|x| x.tier.as_str()).collect::<Vec<_>>(), ["small", "medium", "large"]);
    // Independently of the replay: each alloc event's tier from its size (1 B alignment), and which failed.
    let failed: Vec<Option<usize>> = r.failed.iter().map(|f| f.event).collect();
    let mut want = [(0u64, 0u64, 0u64); 3]; // (requests, failed, requested bytes served)
    for (i, e) in d.events.iter().enumerate().filter(|(_, e)| e.kind == gpuheap::trace::EventKind::Alloc) {
        let size = e.size.max(1);
        let k = if size <= small_max {
            0
        } else if size >= large_min {
            2
        } else {
            1
        };
        want[k].0 += 1;
        if failed.contains(&Some(i)) {
            want[k].1 += 1;
        } else {
            want[k].2 += e.size;
        }
    }
    for (k, x) in tiers.iter().enumerate() {
        assert_eq!((x.requests, x.failed, x.requested_bytes), want[k], "tier {}", x.tier);
        assert!(x.block_bytes >= x.requested_bytes && (0.0..1.0).contains(&x.internal_fragmentation));
        assert!(x.peak_live <= r.peak_allocated);
    }
    // Other strategies have no tiers, and tiers are refused for them.
    assert!(run(&t, &ReplayOptions::new(StrategyKind::BestFit), None).tiers.is_none());
    let bad = {
        let mut o = ReplayOptions::new(StrategyKind::BestFit);
        o.tiers = Some((small_max, large_min));
        o
    };
    assert!(replay::replay(&t, d, &bad, None, &mut |_| {}).unwrap_err().is_input());
    // A large tier above the capacity (1 MiB here) is refused, not reported as a tier at 8 EiB.
    let beyond = {
        let mut o = ReplayOptions::new(StrategyKind::Tiered);
        o.tiers = Some((small_max, 1 << 63));
        o
    };
    let e = replay::replay(&t, d, &beyond, None, &mut |_| {}).unwrap_err();
    assert!(e.is_input() && e.to_string().contains("above the capacity"), "{e}");
}

/// A trace that makes a new stream for every request (an RMM log of 3,000 streams, 512 B each) at a
/// capacity that holds 1,024 of the caching model's 2 MiB small segments: every later request fails, and
/// each failure releases cached blocks by walking the free blocks of every stream. That walk visited
/// every size class of every stream (2,048 per stream and pool): 11 s for this replay, minutes for
/// `tune`, which replays it dozens of times. It now visits the non-empty classes only. This test checks
/// the replay's result; its time is measured by the `many_streams` group of `benches/long_traces.rs`
/// (a speed goal belongs in a benchmark, not in a test that fails on a loaded machine).
#[test]
fn caching_replay_with_thousands_of_streams_is_not_quadratic_in_classes() {
    const N: u64 = 3000;
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 0..N {
        log +=
            &format!("1,{}.{:06},allocate,{:#x},512,{}\n", i / 1_000_000, i % 1_000_000, 0x1000_0000 + i * 512, i + 1);
    }
    let t = gpuheap::trace::parse_trace(Path::new("streams.rmm.csv"), log.as_bytes()).expect("parses");
    let opts = {
        let mut o = ReplayOptions::new(StrategyKind::Caching);
        o.capacity = Some(2 << 30);
        o
    };
    let r = run(&t, &opts, None);
    assert_eq!(r.failed.len() as u64, N - 1024, "1,024 small segments of 2 MiB fit in 2 GiB");
}
