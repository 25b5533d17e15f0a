//! Every sentence agrees with the numbers beside it (issue 20, item 5): over every shipped (`data/`) and
//! shared (`traces/`, `cases/inputs/`) trace and over generated snapshots, each verdict and each bound that
//! `explain` and `replay` print is recomputed here from the numbers of the same report, and the request
//! bounds of a dumped state are checked against the caching model itself: a request the page says "fits"
//! is one the model, seeded with that state, serves at that capacity.
//!
//! The checks (each names the sentence it guards):
//! - explain, the moment: requested ≤ allocated; the reserved-but-unallocated share ≤ 100 %; the largest
//!   hole ≤ the holes' sum and ≥ every listed hole; each listed segment's blocks and holes sum to its size.
//! - explain, each recorded OOM: the GPU's memory is reserved + driver free; the verdict follows from the
//!   free bytes and the largest extent of the request's own pool (DESIGN.md §3.8); the free bytes the
//!   sentence adds up ("driver X + holes Y") are the free bytes it states; "no cached block fits" is never
//!   said where a hole of the request's pool holds the request; "reproduced" iff the model's first
//!   failure is the OOM.
//! - explain, the request bounds: device free = capacity − reserved; fits ≤ fragmentation bound; every
//!   probed request up to "fits" is served by the seeded caching model, none above the fragmentation
//!   bound is.
//! - replay, every strategy: utilisation in [0, 100 %] and = peak allocated / peak reserved; no negative
//!   ratio; allocated ≤ in blocks ≤ footprint, and the rows that split the footprint add up; a "capacity"
//!   failure has fewer free bytes than its request, a "fragmentation" failure at least as many; the count
//!   line adds up.
//! - a feasible byte-granular minimalloc instance (buffers that fit byte for byte) reports no capacity
//!   failure on any strategy.

mod common;

use std::path::{Path, PathBuf};

use common::pickle::{block, pickle, V};
use gpuheap::analysis::FailureClass;
use gpuheap::explain::{explain_with_bytes, Explanation, Moment, Verdict};
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{replay, ReplayOptions, ReplayReport};
use gpuheap::trace::{parse_trace, read_trace_and_bytes, DeviceTrace, Event, EventKind, Trace};
use gpuheap::units::fmt_bytes;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// The traces shipped under `data/` (four, each read by the README or the tests), and the shared ones
/// (none, after a printed "skipped", when the shared folder is absent; a failure under
/// `GPUHEAP_REQUIRE_SHARED=1`).
fn inputs() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let exts = ["pickle", "pkl", "csv"];
    let data = common::data_file("ATTRIBUTION.md").parent().unwrap().to_path_buf();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|x| x.to_str()).is_some_and(|x| exts.contains(&x)))
        .collect();
    v.sort();
    let mut shared = common::shared_files("traces", &exts);
    shared.extend(common::shared_files("cases/inputs", &exts));
    (v, shared)
}

/// The violations of one explanation and its page.
fn check_explanation(t: &Trace, e: &Explanation) -> Vec<String> {
    let text = e.render_text();
    let mut bad = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            bad.push(what);
        }
    };
    if e.moment != Moment::PeakAllocated {
        check(e.requested <= e.allocated, format!("requested {} > allocated {}", e.requested, e.allocated));
        check(
            e.reserved_unallocated <= e.reserved,
            format!("reserved-unallocated {} > reserved {} (share above 100 %)", e.reserved_unallocated, e.reserved),
        );
        check(
            e.largest_hole <= e.reserved_unallocated,
            format!("largest hole {} > holes {}", e.largest_hole, e.reserved_unallocated),
        );
    }
    let listed: u64 = e.segments_with_holes.iter().map(|s| s.hole_bytes()).sum();
    check(listed <= e.reserved_unallocated, format!("listed holes {listed} > reserved-unallocated"));
    for s in &e.segments_with_holes {
        check(s.largest_hole() <= e.largest_hole, format!("segment {:#x}'s hole > the largest hole", s.addr));
        check(
            s.allocated + s.hole_bytes() == s.size,
            format!("segment {:#x}: {} allocated + {} holes != {} B", s.addr, s.allocated, s.hole_bytes(), s.size),
        );
    }
    let dev = &t.devices[e.device.index];
    for o in &e.ooms {
        let at = format!("OOM at event {}", o.event);
        let pool = dev.mempool(dev.events[o.event].mempool);
        let usable: Vec<u64> = gpuheap::facts::usable_holes(&o.state, pool);
        let usable_sum: u64 = usable.iter().sum();
        let usable_max = usable.iter().copied().max().unwrap_or(0);
        if let (Some(f), Some(c)) = (o.device_free, o.capacity) {
            check(c == o.reserved + f, format!("{at}: capacity {c} != reserved {} + free {f}", o.reserved));
            let free = f + usable_sum;
            let largest = f.max(usable_max);
            check(o.free_total == Some(free), format!("{at}: free total {:?} != {free}", o.free_total));
            check(o.largest_extent == Some(largest), format!("{at}: largest {:?} != {largest}", o.largest_extent));
            let verdict = if free < o.request {
                Verdict::Capacity
            } else if largest < o.request {
                Verdict::Fragmentation
            } else {
                Verdict::Fits
            };
            check(o.verdict == verdict, format!("{at}: verdict {:?}, the numbers say {verdict:?}", o.verdict));
            check(o.shortfall == o.request.saturating_sub(free), format!("{at}: shortfall {}", o.shortfall));
            if matches!(o.verdict, Verdict::Capacity | Verdict::Fragmentation) {
                // "... free (driver X + holes Y)": X + Y is the free total the sentence states.
                let sum = format!("(driver {} + holes {})", fmt_bytes(f), fmt_bytes(usable_sum));
                check(text.contains(&sum), format!("{at}: the page does not add up the free bytes as {sum}"));
            }
        } else {
            check(o.verdict == Verdict::Undetermined, format!("{at}: a verdict without the driver's free bytes"));
        }
        if usable_max >= o.request {
            check(
                !text.contains("no cached block"),
                format!("{at}: \"no cached block fits\" beside a hole of {} for {}", usable_max, o.request),
            );
        }
        if let Some(r) = &o.replay {
            check(r.reproduced == (r.first_failure == Some(o.event)), format!("{at}: reproduced {}", r.reproduced));
        }
    }
    if let Some(b) = &e.request_bounds {
        check(b.device_free == b.capacity.saturating_sub(e.reserved), format!("device free {}", b.device_free));
        check(b.fits_up_to <= b.fragmentation_up_to, format!("fits {} > fragmentation bound", b.fits_up_to));
        check(
            b.fragmentation_up_to <= b.capacity.saturating_sub(e.allocated),
            format!("fragmentation bound {} > capacity − allocated", b.fragmentation_up_to),
        );
    }
    if let Some(tune) = &e.tune {
        for r in &tune.rows {
            check(!r.fits || r.failed == 0, format!("tune row {}: \"fits\" with {} failed", r.setting, r.failed));
            check(
                r.fits == r.min_capacity.is_some_and(|m| m <= tune.capacity.bytes),
                format!("tune row {}: fits {} beside a least capacity of {:?}", r.setting, r.fits, r.min_capacity),
            );
        }
    }
    bad
}

/// `dev` with one more request of `size` bytes on stream `stream` of the default pool at the end.
fn with_request(dev: &DeviceTrace, size: u64, stream: i64) -> DeviceTrace {
    let mut d = dev.clone();
    let id = d.block_ids;
    d.block_ids += 1;
    let last = d.events.last().copied();
    d.events.push(Event {
        kind: EventKind::Alloc,
        mempool: 0,
        id,
        addr: u64::MAX - (1 << 40),
        size,
        stream,
        time_us: last.and_then(|e| e.time_us),
    });
    d
}

/// Whether the caching model, seeded with `dev`'s state, serves one more request of `size` at `capacity`.
fn model_serves(t: &Trace, dev: &DeviceTrace, size: u64, stream: i64, capacity: u64) -> bool {
    let d = with_request(dev, size, stream);
    let mut opts = ReplayOptions::new(StrategyKind::Caching);
    opts.capacity = Some(capacity);
    opts.timeline_points = 1;
    let r = replay(t, &d, &opts, None, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    r.failed.is_empty()
}

/// The request sizes to probe below a bound: 512 B, 1 MiB, just above 1 MiB, 5 MiB, 10 MiB, the bound.
fn probes(up_to: u64) -> Vec<u64> {
    let mut v: Vec<u64> =
        [512, MIB, MIB + 512, 5 * MIB, 10 * MIB, up_to].into_iter().filter(|&s| (1..=up_to).contains(&s)).collect();
    v.dedup();
    v
}

/// "fits" only where the model served the request; "fails" only where it did not.
fn check_bounds_against_model(t: &Trace, e: &Explanation) -> Vec<String> {
    let (Some(b), Moment::DumpedState) = (&e.request_bounds, e.moment) else { return Vec::new() };
    let dev = &t.devices[e.device.index];
    if b.capacity < gpuheap::reference::caching::SMALL_BUFFER || dev.final_state.is_none() && !dev.events.is_empty() {
        return Vec::new();
    }
    let stream = dev.initial_segments.first().map_or(0, |s| s.stream);
    let mut bad = Vec::new();
    for s in probes(b.fits_up_to) {
        if !model_serves(t, dev, s, stream, b.capacity) {
            bad.push(format!("\"a request up to {} fits\", but the model fails one of {s} B", b.fits_up_to));
        }
    }
    let above = b.fragmentation_up_to + 1;
    if above <= gpuheap::reference::MAX_BYTES && model_serves(t, dev, above, stream, b.capacity) {
        bad.push(format!("\"a larger one fails for capacity\", but the model serves {above} B"));
    }
    bad
}

/// The violations of one replay and its page.
fn check_replay(r: &ReplayReport, feasible_bytes: bool) -> Vec<String> {
    let text = r.render_text("");
    let s = r.strategy.as_str();
    let mut bad = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            bad.push(format!("{s}: {what}"));
        }
    };
    check((0.0..=1.0).contains(&r.utilisation), format!("utilisation {}", r.utilisation));
    if r.peak_reserved > 0 {
        let u = r.peak_allocated as f64 / r.peak_reserved as f64;
        check((r.utilisation - u).abs() < 1e-9, format!("utilisation {} != {u}", r.utilisation));
    }
    check(r.johnstone_wilson >= 0.0, format!("Johnstone-Wilson {}", r.johnstone_wilson));
    for (name, f) in [("at peak", &r.at_peak), ("at end", &r.at_end)] {
        check(
            f.allocated <= f.in_use && f.in_use <= f.footprint,
            format!("{name}: allocated {} in blocks {} footprint {}", f.allocated, f.in_use, f.footprint),
        );
        check(
            f.rounding_waste + f.holes == f.reserved_unallocated,
            format!("{name}: rounding {} + holes {} != {}", f.rounding_waste, f.holes, f.reserved_unallocated),
        );
        check(f.largest_free <= f.free, format!("{name}: largest free {} > free {}", f.largest_free, f.free));
        check((f.free == 0) == (f.free_blocks == 0), format!("{name}: {} B free in {}", f.free, f.free_blocks));
        check((0.0..=1.0).contains(&f.external), format!("{name}: external {}", f.external));
    }
    for f in &r.failed {
        let at = format!("failure at {:?} of {} B", f.event, f.size);
        match f.class {
            FailureClass::Capacity => check(f.free < f.size, format!("{at}: \"capacity\" with {} B free", f.free)),
            FailureClass::Fragmentation => {
                check(f.free >= f.size, format!("{at}: \"fragmentation\" with {} B free", f.free))
            }
            _ => {}
        }
        if feasible_bytes {
            check(f.class != FailureClass::Capacity, format!("{at}: capacity failure of a feasible instance"));
        }
    }
    let counted = format!("failed         {} requests (", r.failed.len());
    check(text.contains(&counted), format!("the count line is not {counted:?}"));
    let classes = ["capacity", "fragmentation", "rounding", "rejected"];
    let line = text.lines().find(|l| l.starts_with("failed ")).unwrap_or_default();
    let sum: usize = classes
        .iter()
        .filter_map(|c| {
            let i = line.find(&format!(" {c}"))?;
            line[..i].rsplit([' ', '(']).next()?.parse::<usize>().ok()
        })
        .sum();
    check(sum == r.failed.len(), format!("the count line {line:?} adds up to {sum}"));
    bad
}

/// Replays `dev` through every strategy that accepts it.
fn replays(t: &Trace, dev: &DeviceTrace, capacity: Option<u64>) -> Vec<ReplayReport> {
    StrategyKind::ALL
        .into_iter()
        .filter_map(|k| {
            let mut opts = ReplayOptions::new(k);
            opts.capacity = capacity;
            replay(t, dev, &opts, None, &mut |_| {}).ok()
        })
        .collect()
}

/// The violations of one file, and how many pages were checked (0: the file is not a trace).
fn check_file(path: &Path) -> (usize, Vec<String>) {
    let Ok((t, bytes)) = read_trace_and_bytes(path) else { return (0, Vec::new()) };
    let name = path.display().to_string();
    let mut bad = Vec::new();
    let (mut index, mut pages) = (0, 0);
    if let Ok(mut e) = explain_with_bytes(&t, Some(&bytes), None, None) {
        index = e.device.index;
        pages += 1;
        // The settings search, as `explain` runs it: "fits" only where the replay at the capacity failed nothing.
        e.tune = gpuheap::explain::tune::tune(&t, &t.devices[index], &e.capacity, &|| {}).ok();
        bad.extend(check_explanation(&t, &e));
        bad.extend(check_bounds_against_model(&t, &e));
    }
    if let Some(dev) = t.devices.get(index) {
        let heap = if index == 0 { device_heap_replay(&t) } else { None };
        for r in replays(&t, dev, None).iter().chain(heap.as_ref()) {
            pages += 1;
            bad.extend(check_replay(r, false));
        }
    }
    (pages, bad.into_iter().map(|b| format!("{name}: {b}")).collect())
}

#[test]
fn every_sentence_of_every_shipped_and_shared_trace_agrees_with_its_numbers() {
    let (shipped, shared) = inputs();
    assert!(shipped.len() >= 4, "the traces shipped under data/ are missing: {shipped:?}");
    let files: Vec<PathBuf> = shipped.iter().chain(&shared).cloned().collect();
    let (mut bad, mut unread) = (Vec::new(), Vec::new());
    let (mut read, mut pages) = (0, 0);
    for p in &files {
        let (n, b) = check_file(p);
        read += (n > 0) as usize;
        pages += n;
        if n == 0 && shipped.contains(p) {
            unread.push(p);
        }
        println!("{}: {n} pages checked", p.display());
        bad.extend(b);
    }
    println!("{pages} pages of {read} traces checked");
    assert!(unread.is_empty(), "shipped traces that could not be read: {unread:?}");
    assert!(bad.is_empty(), "{} inconsistencies:\n{}", bad.len(), bad.join("\n"));
}

// --- Generated snapshots -------------------------------------------------------------------------------

/// One generated segment: its pool kind, its size in 512 B units and its blocks as (units, live).
#[derive(Clone, Debug)]
struct GenSegment {
    small: bool,
    private: bool,
    blocks: Vec<(u64, bool)>,
}

fn gen_segment() -> impl Strategy<Value = GenSegment> {
    (any::<bool>(), prop::bool::weighted(0.2), prop::collection::vec((1u64..=8192, any::<bool>()), 1..6)).prop_map(
        |(small, private, mut blocks)| {
            if small {
                // A small-pool segment is 2 MiB: 4096 units.
                let mut left = 4096u64;
                for b in blocks.iter_mut() {
                    b.0 = b.0.min(left).max(1);
                    left -= b.0.min(left);
                }
                blocks.retain(|b| b.0 > 0);
                let used: u64 = blocks.iter().map(|b| b.0).sum();
                if used < 4096 {
                    blocks.push((4096 - used, false));
                }
            }
            // At least one live block: a snapshot with nothing allocated has nothing to explain.
            blocks[0].1 = true;
            GenSegment { small, private, blocks }
        },
    )
}

/// A snapshot of `segs` (no history, or an `oom` event of `oom.0` bytes with `oom.1` bytes free).
fn gen_pickle(segs: &[GenSegment], oom: Option<(u64, u64)>) -> Vec<u8> {
    let mut addr = 0x7f00_0000_0000u64;
    let mut list = Vec::new();
    for s in segs {
        let total: u64 = s.blocks.iter().map(|b| b.0 * 512).sum();
        let mut at = addr;
        let blocks: Vec<V> = s
            .blocks
            .iter()
            .map(|&(units, live)| {
                let size = units * 512;
                let b = block(
                    at,
                    size,
                    if live { size - 100 } else { 0 },
                    if live { "active_allocated" } else { "inactive" },
                );
                at += size;
                b
            })
            .collect();
        let pool = if s.private { (1, 0) } else { (0, 0) };
        list.push(V::Dict(vec![
            ("device", V::Int(0)),
            ("address", V::Int(addr as i128)),
            ("total_size", V::Int(total as i128)),
            ("stream", V::Int(0)),
            ("segment_type", V::Str(if s.small { "small" } else { "large" })),
            ("segment_pool_id", V::Tuple(vec![V::Int(pool.0), V::Int(pool.1)])),
            ("is_expandable", V::Bool(false)),
            ("blocks", V::List(blocks)),
        ]));
        addr += total.div_ceil(1 << 30).max(1) << 30;
    }
    let mut top = vec![("segments", V::List(list))];
    if let Some((size, free)) = oom {
        let ev = V::Dict(vec![
            ("action", V::Str("oom")),
            ("addr", V::Int(0)),
            ("device_free", V::Int(free as i128)),
            ("size", V::Int(size as i128)),
            ("stream", V::Int(0)),
        ]);
        top.push(("device_traces", V::List(vec![V::List(vec![ev])])));
    }
    pickle(&V::Dict(top))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Dumped states (no history) at a capacity of reserved + `extra`: the page agrees with itself and the
    /// bounds with the seeded model.
    #[test]
    fn generated_dumped_states_agree_with_their_numbers(
        segs in prop::collection::vec(gen_segment(), 1..5),
        extra in prop_oneof![Just(0u64), 1u64..(64 * MIB), Just(20 * MIB), Just(2 * MIB)],
    ) {
        let bytes = gen_pickle(&segs, None);
        let t = parse_trace(Path::new("generated.pickle"), &bytes).unwrap();
        let reserved: u64 = segs.iter().flat_map(|s| &s.blocks).map(|b| b.0 * 512).sum();
        let capacity = (reserved + extra).max(gpuheap::facts::MIN_CAPACITY);
        let e = explain_with_bytes(&t, Some(&bytes), None, Some(capacity)).unwrap();
        let mut bad = check_explanation(&t, &e);
        bad.extend(check_bounds_against_model(&t, &e));
        prop_assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    /// A recorded OOM on a generated state: the verdict and its sentence follow from the numbers.
    #[test]
    fn generated_ooms_agree_with_their_numbers(
        segs in prop::collection::vec(gen_segment(), 1..5),
        request in 1u64..(64 * MIB),
        free in prop_oneof![Just(0u64), 0u64..(64 * MIB)],
    ) {
        let bytes = gen_pickle(&segs, Some((request, free)));
        let t = parse_trace(Path::new("generated.pickle"), &bytes).unwrap();
        let e = explain_with_bytes(&t, Some(&bytes), None, None).unwrap();
        let bad = check_explanation(&t, &e);
        prop_assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    /// A minimalloc instance whose buffers fit byte for byte (a packing into `capacity` bytes exists by
    /// construction: the buffers tile columns of the range) reports no capacity failure on any strategy.
    #[test]
    fn a_feasible_byte_granular_instance_reports_no_capacity_failure(
        columns in prop::collection::vec(prop::collection::vec(1u64..40_000, 1..4), 1..6),
        times in prop::collection::vec(1u64..50, 1..4),
    ) {
        // Column c holds its buffers one after another in time, each as wide as the column's largest
        // width: buffer sizes vary byte by byte, and at any time the live buffers fit side by side.
        let mut csv = String::from("id,lower,upper,size\n");
        let mut id = 0;
        let mut capacity = 0u64;
        for widths in &columns {
            let width = *widths.iter().max().unwrap();
            capacity += width;
            let mut t0 = 0u64;
            for (k, &w) in widths.iter().enumerate() {
                let t1 = t0 + times[k % times.len()];
                csv += &format!("{id},{t0},{t1},{w}\n");
                id += 1;
                t0 = t1;
            }
        }
        let capacity = capacity.max(gpuheap::facts::MIN_CAPACITY);
        let name = format!("generated.{capacity}.csv");
        let t = parse_trace(Path::new(&name), csv.as_bytes()).unwrap();
        let mut bad = Vec::new();
        for r in replays(&t, &t.devices[0], None) {
            prop_assert_eq!(r.capacity.bytes, capacity);
            bad.extend(check_replay(&r, true));
        }
        if let Some(r) = device_heap_replay(&t) {
            bad.extend(check_replay(&r, true));
        }
        prop_assert!(bad.is_empty(), "{}\n{csv}", bad.join("\n"));
    }
}

/// The device heap's replay of `t` on the CPU backend; `None` for a capacity below the heap's minimum.
fn device_heap_replay(t: &Trace) -> Option<ReplayReport> {
    let opts = gpuheap::replay::DeviceReplayOptions::default();
    match gpuheap::replay::replay_device(t, &t.devices[0], &gpuheap::backend::Backend::cpu(), &opts, &mut |_| {}) {
        Ok(r) => Some(r),
        Err(e) if e.is_input() => None,
        Err(e) => panic!("{e}"),
    }
}

/// The instance of the report: two buffers of 4,000 and 4,192 B live together in 8,192 B fit byte for byte;
/// rounded to 256 B they need 8,448 B.
#[test]
fn a_byte_granular_pair_that_fits_exactly_fails_nothing_for_capacity() {
    let csv = "id,lower,upper,size\n0,0,10,4000\n1,1,10,4192\n";
    let t = parse_trace(Path::new("pair.8192.csv"), csv.as_bytes()).unwrap();
    let reports = replays(&t, &t.devices[0], None);
    assert!(reports.len() >= 6, "{} strategies ran", reports.len());
    for r in reports.iter().chain(device_heap_replay(&t).as_ref()) {
        let bad = check_replay(r, true);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
    for k in [StrategyKind::FirstFit, StrategyKind::BestFit, StrategyKind::Tlsf] {
        let r = reports.iter().find(|r| r.strategy == k.as_str()).unwrap();
        assert!(r.failed.is_empty(), "{k} fails {:?}", r.failed);
    }
}

/// A 1.5 MiB request failed with nothing free on the device beside an empty 2 MiB small-pool segment of its
/// own pool: the hole holds it by size, so the page names it instead of saying no cached block fits (a
/// request above 1 MiB is served from the large pool only, `get_pool`).
#[test]
fn a_fits_verdict_names_the_hole_that_holds_the_request() {
    let segs = [GenSegment { small: true, private: false, blocks: vec![(1, true), (4095, false)] }];
    let bytes = gen_pickle(&segs, Some((3 * MIB / 2, 0)));
    let t = parse_trace(Path::new("fits.pickle"), &bytes).unwrap();
    let e = explain_with_bytes(&t, Some(&bytes), None, None).unwrap();
    let o = &e.ooms[0];
    assert_eq!((o.verdict, o.largest_pool_hole), (Verdict::Fits, 2 * MIB - 512));
    let bad = check_explanation(&t, &e);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let text = e.render_text();
    assert!(text.contains("a cached hole of the request's pool holds it by size (2.00 MiB)"), "{text}");
    assert!(text.contains("a whole segment of 20.00 MiB, more than the 0 B free"), "{text}");
}
