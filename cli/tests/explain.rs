//! `gpuheap explain` and `gpuheap tune`, and the library behind them (`gpuheap::explain`): recorded
//! OOMs explained with numbers worked out by hand from hand-made snapshots, device choice (BL-19),
//! checked sizes (BL-23), and the real snapshots' own records (reserved at the peak, the dumped
//! state's totals) where they are present.

use std::path::{Path, PathBuf};
use std::process::Output;

use gpuheap::explain::{self, Moment, Verdict};
use gpuheap::facts::{self, CapacitySource, DeviceReason};
use gpuheap::trace::{parse_trace, read_trace, Trace};

#[path = "../../host/tests/common/mod.rs"]
mod common;
use common::pickle::{pickle, V};
use common::{gpuheap, workspace};

const MIB: u64 = 1 << 20;

fn json(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn write_temp(name: &str, bytes: &[u8]) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuheap-explain-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// `DIR/FILE` of the shared folder (`None`, or a failure under `GPUHEAP_REQUIRE_SHARED=1`, when it is
/// absent).
fn shared(dir: &str, file: &str) -> Option<PathBuf> {
    common::shared(&format!("{dir}/{file}"))
}

fn i(v: u64) -> V<'static> {
    V::Int(v as i128)
}

fn event<'a>(action: &'a str, addr: u64, size: u64, frames: Vec<V<'a>>) -> V<'a> {
    V::Dict(vec![
        ("action", V::Str(action)),
        ("addr", i(addr)),
        ("size", i(size)),
        ("stream", V::Int(0)),
        ("frames", V::List(frames)),
    ])
}

fn frame<'a>(name: &'a str, filename: &'a str, line: u64) -> V<'a> {
    V::Dict(vec![("name", V::Str(name)), ("filename", V::Str(filename)), ("line", i(line))])
}

fn oom<'a>(size: u64, device_free: u64) -> V<'a> {
    V::Dict(vec![
        ("action", V::Str("oom")),
        ("size", i(size)),
        ("device_free", i(device_free)),
        ("stream", V::Int(0)),
        ("frames", V::List(vec![])),
    ])
}

const S1: u64 = 0x7f00_0000_0000;
const S2: u64 = 0x7f00_1000_0000;

/// Two 20 MiB segments recorded from empty, as PyTorch makes them (a request below 10 MiB gets a 20 MiB
/// segment, `kLargeBuffer`): S1 holds A (8 MiB), B (4 MiB, freed) and C (8 MiB); S2 holds D (8 MiB),
/// E (6 MiB) and a 6 MiB free tail. Then, at event 9, an `oom` of `request` with `device_free` bytes free.
///
/// At the OOM, by hand: reserved 40 MiB; allocated 8 + 8 + 8 + 6 = 30 MiB; holes 4 MiB (S1) and 6 MiB
/// (S2): 10 MiB reserved but unallocated, the largest 6 MiB.
fn oom_snapshot(request: u64, device_free: u64) -> Vec<u8> {
    oom_snapshot_with(request, device_free, None)
}

/// [`oom_snapshot`] with `allocator_settings`.
fn oom_snapshot_with(request: u64, device_free: u64, settings: Option<V<'_>>) -> Vec<u8> {
    let user = || {
        vec![
            frame("malloc", "CUDACachingAllocator.cpp", 0),
            frame("forward", "torch/nn/modules/linear.py", 125),
            frame("train_step", "train.py", 42),
            frame("main", "train.py", 90),
        ]
    };
    let events = vec![
        event("segment_alloc", S1, 20 * MIB, vec![]),
        event("alloc", S1, 8 * MIB, user()),
        event("alloc", S1 + 8 * MIB, 4 * MIB, vec![]),
        event("alloc", S1 + 12 * MIB, 8 * MIB, vec![]),
        event("free_requested", S1 + 8 * MIB, 4 * MIB, vec![]),
        event("free_completed", S1 + 8 * MIB, 4 * MIB, vec![]),
        event("segment_alloc", S2, 20 * MIB, vec![]),
        event("alloc", S2, 8 * MIB, vec![frame("load", "data/loader.py", 7)]),
        event("alloc", S2 + 8 * MIB, 6 * MIB, vec![]),
        oom(request, device_free),
    ];
    let mut top = vec![("segments", V::List(vec![])), ("device_traces", V::List(vec![V::List(events)]))];
    top.extend(settings.map(|s| ("allocator_settings", s)));
    pickle(&V::Dict(top))
}

fn parse(name: &str, bytes: &[u8]) -> Trace {
    parse_trace(Path::new(name), bytes).expect("parses")
}

#[test]
fn fragmentation_oom_explained_by_hand() {
    // BL-02 (a) in small: an 8 MiB request, 6 MiB free on the device, 10 MiB of holes, none ≥ 8 MiB.
    let path = write_temp("frag.pickle", &oom_snapshot(8 * MIB, 6 * MIB));
    let trace = read_trace(&path).unwrap();
    let e = explain::explain(&trace, None, None).unwrap();
    assert_eq!(e.device.reason, DeviceReason::RecordedOom);
    assert_eq!(e.ooms.len(), 1);
    let o = &e.ooms[0];
    assert_eq!((o.event, o.request, o.segment_request), (9, 8 * MIB, 20 * MIB));
    assert_eq!(
        (o.reserved, o.allocated, o.reserved_unallocated, o.largest_hole),
        (40 * MIB, 30 * MIB, 10 * MIB, 6 * MIB)
    );
    assert_eq!((o.device_free, o.capacity), (Some(6 * MIB), Some(46 * MIB)));
    assert_eq!((o.free_total, o.largest_extent, o.shortfall), (Some(16 * MIB), Some(6 * MIB), 0));
    assert_eq!(o.verdict, Verdict::Fragmentation);
    // Capacity from the evidence: reserved at the OOM + device_free.
    assert_eq!(e.capacity.bytes, 46 * MIB);
    assert_eq!(e.capacity.source, CapacitySource::RecordedOom { event: 9, reserved: 40 * MIB, device_free: 6 * MIB });
    // The caching model at 46 MiB: no cached block holds 8 MiB, a new 20 MiB segment does not fit in the
    // 6 MiB left, no segment is wholly free to release: the same request fails.
    let r = o.replay.as_ref().unwrap();
    assert_eq!((r.capacity, r.first_failure, r.reproduced), (46 * MIB, Some(9), true));
    assert_eq!(e.gpu_capacity, Some(46 * MIB));
    // The detail is about the OOM: largest tensors first, with their user frames only.
    assert_eq!(e.moment, Moment::RecordedOom);
    let sizes: Vec<(u64, Option<usize>)> =
        e.largest_tensors.iter().map(|t| (t.block.requested, t.block.alloc_event)).collect();
    assert_eq!(sizes, vec![(8 * MIB, Some(1)), (8 * MIB, Some(3)), (8 * MIB, Some(7)), (6 * MIB, Some(8))]);
    let d = &e.largest_tensors[2];
    assert_eq!(d.frames.iter().map(|f| (f.filename.as_str(), f.line)).collect::<Vec<_>>(), vec![("data/loader.py", 7)]);
    assert!(e.largest_tensors[1].frames.is_empty());
    let a = &e.largest_tensors[0];
    assert_eq!(
        a.frames.iter().map(|f| (f.name.as_str(), f.line)).collect::<Vec<_>>(),
        vec![("train_step", 42), ("main", 90)]
    );
    // Holes per segment, most first.
    let holes: Vec<(u64, u64, u64)> =
        e.segments_with_holes.iter().map(|s| (s.addr, s.hole_bytes(), s.holes[0].addr)).collect();
    assert_eq!(holes, vec![(S2, 6 * MIB, S2 + 14 * MIB), (S1, 4 * MIB, S1 + 8 * MIB)]);
    // tune: the OOM request is replayed where it failed; the snapshot's own setting fails it at 46 MiB.
    let t = explain::tune::tune(&trace, &trace.devices[0], &e.capacity, &|| {}).unwrap();
    let own = t.rows.iter().find(|r| r.own).unwrap();
    assert_eq!((own.failed, own.first_failure, own.fits), (1, Some(9), false));
    // Expandable segments map the large pool in 20 MiB pages (`kLargeBuffer`, PyTorch's
    // `ExpandableSegment` segment size): the 30 MiB of blocks span two pages (4 and 6 MiB free in
    // them), the 8 MiB request needs a third: 60 MiB, more than the GPU had.
    let exp = t.rows.iter().find(|r| r.setting == "expandable_segments:True").unwrap();
    assert_eq!((exp.failed, exp.fits, exp.min_capacity), (1, false, Some(60 * MIB)), "{exp:?}");
    // First-fit over one flat range: A 0-8, B 8-12 (freed), C 12-20, D 20-28, E 28-34 MiB; the request
    // goes to 34-42 MiB: 42 MiB suffice, so it would have avoided the OOM.
    let ff = t.rows.iter().find(|r| r.setting == "first-fit").unwrap();
    assert_eq!((ff.failed, ff.fits, ff.min_capacity), (0, true, Some(42 * MIB)), "{ff:?}");
}

#[test]
fn capacity_oom_is_never_called_fragmentation() {
    // BL-02 (b) in small: a 20 MiB request with 4 MiB free on the device and 10 MiB of holes: 14 MiB
    // even after a perfect compaction, 6 MiB short.
    let trace = parse("cap.pickle", &oom_snapshot(20 * MIB, 4 * MIB));
    let o = explain::explain_oom(
        &trace.devices[0],
        9,
        Some(4 * MIB),
        &gpuheap::reference::caching::config_for_trace(&trace.devices[0], 1 << 40).0,
    )
    .unwrap();
    assert_eq!(o.verdict, Verdict::Capacity);
    assert_eq!((o.free_total, o.shortfall, o.capacity), (Some(14 * MIB), 6 * MIB, Some(44 * MIB)));
    // Without the driver's free bytes the verdict is not guessed.
    let o = explain::explain_oom(
        &trace.devices[0],
        9,
        None,
        &gpuheap::reference::caching::config_for_trace(&trace.devices[0], 1 << 40).0,
    )
    .unwrap();
    assert_eq!(o.verdict, Verdict::Undetermined);
}

#[test]
fn given_capacity_sets_the_device_free_bytes() {
    // With a 60 MiB GPU, 20 MiB are free beside the 40 MiB reserved: the 8 MiB request fits.
    let path = write_temp("given.pickle", &oom_snapshot(8 * MIB, 6 * MIB));
    let trace = read_trace(&path).unwrap();
    let e = explain::explain(&trace, None, Some(60 * MIB)).unwrap();
    assert_eq!(e.capacity.source, CapacitySource::Given);
    assert_eq!(e.ooms[0].device_free, Some(20 * MIB));
    assert_eq!(e.ooms[0].verdict, Verdict::Fits);
    assert_eq!(e.gpu_capacity, Some(46 * MIB));
}

/// A given capacity outside [4 KiB, 2^48 B] is refused by the library's `explain` and `tune_page` as
/// `--capacity` refuses it (they took 0 B, 1 B and 2^48 + 1 B and explained at them: the Python API passes
/// its `capacity` straight to them).
#[test]
fn explain_and_tune_refuse_a_given_capacity_outside_the_modelled_range() {
    let path = write_temp("given_out_of_range.pickle", &oom_snapshot(8 * MIB, 6 * MIB));
    let trace = read_trace(&path).unwrap();
    for c in [0, 1, 4095, (1u64 << 48) + 1, u64::MAX] {
        let m = match explain::explain(&trace, None, Some(c)) {
            Err(e @ explain::ExplainError::Capacity(_)) => e.to_string(),
            Err(e) => panic!("explain at {c} B: {e}"),
            Ok(_) => panic!("explain at {c} B was answered"),
        };
        assert!(m.contains(&format!("capacity {c} B is outside [4096 B, 2^48 B]")), "{m}");
        let m = match explain::tune::tune_page(&trace, None, Some(c), &|| {}) {
            Err(e @ explain::ExplainError::Capacity(_)) => e.to_string(),
            Err(e) => panic!("tune_page at {c} B: {e}"),
            Ok(_) => panic!("tune_page at {c} B was answered"),
        };
        assert!(m.contains("is outside [4096 B, 2^48 B]"), "{m}");
    }
    assert!(explain::explain(&trace, None, Some(4096)).is_ok());
}

#[test]
fn expandable_mapping_counted_once() {
    // Issue 9's smallest input: 20 MiB reserved at the peak, not 40.
    let bytes = expandable_snapshot();
    let trace = parse("exp.pickle", &bytes);
    let s = &facts::summarize(&trace)[0];
    assert_eq!((s.peak_reserved, s.peak_allocated), (Some(20 * MIB), Some(4 * MIB)));
    let st = facts::state_after(&trace.devices[0], Some(1)).unwrap();
    assert_eq!((st.reserved, st.allocated, st.hole_bytes, st.segments.len()), (20 * MIB, 4 * MIB, 16 * MIB, 1));
    assert!(st.segments[0].expandable);
}

#[test]
fn explain_and_tune_cli_json() {
    let path = write_temp("cli.pickle", &oom_snapshot(8 * MIB, 6 * MIB));
    let p = path.to_str().unwrap();
    let v = json(&gpuheap(&["explain", p, "--json"]));
    assert_eq!(v["ooms"][0]["verdict"], "fragmentation");
    assert_eq!(v["ooms"][0]["event"], 9);
    assert_eq!(v["ooms"][0]["replay"]["reproduced"], true);
    let reserved = v["ooms"][0]["reserved"].as_u64().unwrap();
    let free = v["ooms"][0]["device_free"].as_u64().unwrap();
    assert_eq!(v["capacity"]["bytes"].as_u64().unwrap(), reserved + free);
    assert_eq!(v["capacity"]["source"]["kind"], "recorded-oom");
    assert_eq!(v["device"]["device"], 0);
    assert_eq!(v["largest_tensors"][0]["requested"], 8 * MIB);
    assert_eq!(v["largest_tensors"][0]["frames"][0]["filename"], "train.py");
    let tune = &v["tune"];
    let rows = tune["rows"].as_array().unwrap();
    assert!(rows.len() >= 10, "a grid of settings: {rows:?}");
    assert!(tune["best_env"].as_str().unwrap().starts_with("PYTORCH_CUDA_ALLOC_CONF="));
    // Every row that ran replays the whole trace at its minimum capacity, a multiple of 2 MiB at least
    // as large as the live bytes at the OOM (30 MiB of blocks).
    for r in rows.iter().filter(|r| r["note"].is_null()) {
        let m = r["min_capacity"].as_u64().unwrap();
        assert_eq!(m % (2 * MIB), 0, "{r}");
        assert!(m >= 30 * MIB, "{r}");
        assert_eq!(r["fits"].as_bool().unwrap(), m <= 46 * MIB, "{r}");
    }
    let own = rows.iter().find(|r| r["own"] == true).unwrap();
    assert_eq!(own["kind"], "pytorch");

    let t = json(&gpuheap(&["tune", p, "--json"]));
    assert_eq!(t["capacity"]["bytes"].as_u64().unwrap(), 46 * MIB);
    assert_eq!(t["rows"].as_array().unwrap().len(), rows.len());
    assert_eq!(t["recorded_ooms"], 1);

    // At 46 MiB no PyTorch row fits, and none is recommended (issue 37); at 80 MiB one is.
    assert!(
        tune["conclusion"]["recommended_env"].is_null()
            || rows.iter().any(|r| r["kind"] == "pytorch" && r["fits"] == true)
    );
    let out = String::from_utf8(gpuheap(&["explain", p]).stdout).unwrap();
    assert!(out.contains("Verdict: fragmentation"), "{out}");
    assert!(!out.contains("Best PyTorch setting"), "{out}");
    let text = gpuheap(&["explain", p, "--capacity", "80MiB"]);
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(out.contains("Best PyTorch setting (least memory needed for the whole trace: "), "{out}");

    // The settings advice follows PyTorch's current parser: `per_process_memory_fraction` is read from
    // PYTORCH_CUDA_ALLOC_CONF since 2.10 (c10/cuda/CUDAAllocatorConfig.cpp, parsePerProcessMemoryFraction,
    // pytorch/pytorch#161035); older releases need the call, which takes a float.
    assert!(!out.contains("torch_npu's option"), "{out}");
    assert!(
        out.contains(
            "`per_process_memory_fraction:1` is read by PyTorch 2.10 and later (c10/cuda/CUDAAllocatorConfig.cpp, \
             CUDAAllocatorConfig::parsePerProcessMemoryFraction; pytorch/pytorch#161035); before 2.10, leave it out \
             and call torch.cuda.set_per_process_memory_fraction(1.0)."
        ),
        "{out}"
    );
    // Every key of the best setting's line is followed by the releases that accept it, in order.
    let mut after = out.lines().skip_while(|l| !l.starts_with("Best PyTorch setting")).skip(1);
    let line = after.next().unwrap().trim();
    // PyTorch's defaults print no key.
    let env = line.strip_prefix("PYTORCH_CUDA_ALLOC_CONF=").unwrap_or("");
    let keys: Vec<&str> = after.map_while(|l| l.strip_prefix("  `")).map(|l| l.split(':').next().unwrap()).collect();
    let named: Vec<&str> = env
        .split(',')
        .filter_map(|kv| kv.split_once(':'))
        .map(|(k, _)| k)
        .filter(|k| k.starts_with(char::is_alphabetic))
        .collect();
    assert_eq!(keys, named, "{line}: {out}");
    assert_eq!(keys.is_empty(), line.starts_with("PyTorch's defaults"), "{out}");
}

#[test]
fn explain_bad_input_exits_2() {
    let path = write_temp("dev.pickle", &oom_snapshot(8 * MIB, 6 * MIB));
    for args in [
        vec!["explain", path.to_str().unwrap(), "--device", "5"],
        vec!["tune", path.to_str().unwrap(), "--device", "5"],
        vec!["explain", "/nonexistent/trace.pickle"],
        vec!["tune", "/nonexistent/trace.pickle", "--json"],
    ] {
        let out = gpuheap(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    }
}

/// BL-19: device 0 has annotations only, device 2 the allocations: the report is about device 2 and
/// says which devices exist.
#[test]
fn bl19_default_device_has_allocations() {
    let path = workspace().join("host/tests/inputs/bl19_annotations_on_dev0.pickle");
    let trace = read_trace(&path).unwrap();
    let sums = facts::summarize(&trace);
    let choice = facts::choose_device(&trace, &sums, None).unwrap();
    assert_eq!((choice.device, choice.reason), (2, DeviceReason::MostAllocations));
    assert_eq!(choice.others, vec![0]);
    let s2 = sums.iter().find(|s| s.device == 2).unwrap();
    assert_eq!((s2.alloc_events, s2.peak_allocated, s2.peak_reserved), (2, Some(12 * MIB), Some(20 * MIB)));
    for cmd in ["replay", "compare"] {
        let out = gpuheap(&[cmd, path.to_str().unwrap()]);
        let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{cmd}: {err}");
        assert!(text.contains("device 2"), "{cmd}: {text}");
        assert!(err.contains("device 2 is reported") && err.contains("also has device 0"), "{cmd}: {err}");
        assert!(text.contains("12.00 MiB"), "{cmd}: the 4 + 8 MiB peak, not an all-zero report: {text}");
    }
    for cmd in ["explain", "tune"] {
        let out = gpuheap(&[cmd, path.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("device 2 is reported"), "{cmd}: {text}");
        assert!(text.contains("also has device 0") && text.contains("--device N"), "{cmd}: {text}");
    }
}

/// BL-23: a 2^64 − 1 B buffer: no capacity can be derived from it, so the file is refused naming the
/// line; with a capacity given the huge requests fail as capacity failures and the 1 KiB one is placed.
#[test]
fn bl23_huge_sizes_never_wrap() {
    let one = write_temp("bl23_one_huge.csv", b"id,lower,upper,size\n0,0,10,18446744073709551615\n");
    let two = write_temp(
        "bl23_huge.csv",
        b"id,lower,upper,size\n0,0,10,18446744073709551615\n1,0,10,18446744073709551361\n2,1,5,1024\n",
    );
    for p in [&one, &two] {
        let trace = read_trace(p).unwrap();
        let err = facts::capacity_from_evidence(&trace, &trace.devices[0], None).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("--capacity"), "{err}");
        let s = &facts::summarize(&trace)[0];
        let expect = if p == &one { Some(u64::MAX) } else { None };
        assert_eq!(s.peak_allocated, expect, "a sum beyond 2^64 - 1 is not representable, never wrapped");
        for cmd in ["explain", "tune", "compare", "replay"] {
            let out = gpuheap(&[cmd, p.to_str().unwrap(), "--json"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
            assert!(err.contains("line 2") && err.contains("18446744073709551615 B"), "{cmd}: {err}");
            assert_eq!(err.lines().count(), 1, "{cmd}: one line: {err}");
        }
        // With a capacity the huge requests fail for capacity and the 1 KiB buffer is placed.
        let v = json(&gpuheap(&["compare", p.to_str().unwrap(), "--capacity", "1GiB", "--json"]));
        for r in v["strategies"].as_array().unwrap() {
            let failed = r["failed"].as_array().unwrap();
            assert_eq!(failed.len(), if p == &one { 1 } else { 2 }, "{}", r["strategy"]);
            assert!(failed.iter().all(|f| f["size"].as_u64().unwrap() > 1 << 60), "{}", r["strategy"]);
            let peak = r["peak_allocated"].as_u64().unwrap();
            assert_eq!(peak, if p == &one { 0 } else { 1024 }, "{}: only the 1 KiB buffer is placed", r["strategy"]);
            assert!(r["capacity"]["bytes"].as_u64().unwrap() == 1 << 30, "{}", r["strategy"]);
        }
        let v = json(&gpuheap(&["tune", p.to_str().unwrap(), "--capacity", "1GiB", "--json"]));
        for r in v["rows"].as_array().unwrap().iter().filter(|r| r["note"].is_null()) {
            assert_eq!(r["failed"].as_u64().unwrap(), if p == &one { 1 } else { 2 }, "{r}");
            assert!(r["min_capacity"].is_null(), "no device holds 2^64 - 1 B: {r}");
            assert!(r["peak_reserved"].as_u64().unwrap() <= 1 << 30, "{r}");
        }
    }
}

/// The real snapshots: what explain reports agrees with what the snapshot records.
#[test]
fn real_snapshots_agree_with_their_records() {
    {
        let trace = read_trace(workspace().join("data/equivariant-posteriors_oom_snapshot_new.pickle")).unwrap();
        let e = explain::explain(&trace, None, None).unwrap();
        assert_eq!(e.moment, Moment::DumpedState);
        // SOURCES.md: reserved 40,691,040,256 B, allocated 39,293,964,288 B, 155 active blocks, 62 segments.
        assert_eq!((e.reserved, e.allocated, e.live_blocks, e.segments), (40_691_040_256, 39_293_964_288, 155, 62));
        assert_eq!(e.reserved_unallocated, e.reserved - e.allocated);
        assert_eq!(e.capacity.source, CapacitySource::PeakReserved);
        let b = e.request_bounds.unwrap();
        assert_eq!((b.device_free, b.fits_up_to), (0, e.largest_hole));
    }
    let mut files = vec![workspace().join("data/decomfl_opt_zo_federated_memory.pickle")];
    files.extend(shared("traces", "memory_ctx512_fullstep_.pickle"));
    files.extend(shared("traces", "sqattn_qwen2_layerwise_calibration.pickle"));
    for p in files {
        let f = p.display();
        let trace = read_trace(&p).unwrap();
        let dev = &trace.devices[0];
        let e = explain::explain(&trace, None, None).unwrap();
        let pt = facts::pytorch_series(dev);
        assert_eq!(e.moment, Moment::PeakReserved, "{f}");
        assert_eq!(e.reserved, pt.peak, "{f}: reserved at the moment = PyTorch's peak reserved");
        assert_eq!(e.capacity.bytes, pt.peak, "{f}");
        // At the end the rebuilt state equals the snapshot's own segments.
        let end = facts::state_after(dev, dev.events.len().checked_sub(1)).unwrap();
        let fin = dev.final_state.as_ref().unwrap();
        assert_eq!((end.reserved, end.segments.len()), (fin.reserved_bytes(), fin.segment_count()), "{f}");
        assert_eq!(
            end.live.len(),
            fin.blocks().filter(|b| b.state != gpuheap::trace::BlockStatus::Inactive).count(),
            "{f}"
        );
    }
}

/// Issue 9's smallest input as a snapshot: one 20 MiB expandable segment, its `segment_map` of 20 MiB,
/// one 4 MiB alloc.
fn expandable_snapshot() -> Vec<u8> {
    let seg = V::Dict(vec![
        ("device", V::Int(0)),
        ("address", i(S1)),
        ("total_size", i(20 * MIB)),
        ("is_expandable", V::Int(1)),
        ("segment_type", V::Str("large")),
        (
            "blocks",
            V::List(vec![
                V::Dict(vec![
                    ("address", i(S1)),
                    ("size", i(4 * MIB)),
                    ("requested_size", i(4 * MIB)),
                    ("state", V::Str("active_allocated")),
                ]),
                V::Dict(vec![
                    ("address", i(S1 + 4 * MIB)),
                    ("size", i(16 * MIB)),
                    ("requested_size", i(0)),
                    ("state", V::Str("inactive")),
                ]),
            ]),
        ),
    ]);
    let events = vec![event("segment_map", S1, 20 * MIB, vec![]), event("alloc", S1, 4 * MIB, vec![])];
    pickle(&V::Dict(vec![("segments", V::List(vec![seg])), ("device_traces", V::List(vec![V::List(events)]))]))
}

/// One reserved-bytes series: the peaks of the facts ([`facts::summarize`]), the replay's PyTorch series
/// (`facts::pytorch_series`) and the caching model's fidelity run (`caching::fidelity`, which also
/// replays the model) agree on PyTorch's reserved bytes, expandable segments counted once (issue 9's
/// smallest input: 0 at the start, 20 MiB at the peak and the end), and the model matches them.
#[test]
fn one_reserved_series_for_explain_replay_and_model() {
    use gpuheap::reference::caching;
    let mut traces = vec![("issue-9 expandable".to_string(), parse("exp.pickle", &expandable_snapshot()))];
    for name in [
        "memsnapdump_npu_resnet_expandable_empty_cache.pickle",
        "memory_ctx512_fullstep_.pickle",
        "sqattn_qwen2_layerwise_calibration.pickle",
        "select_n_llama7b_offload_multistream.pickle",
    ] {
        if let Some(p) = shared("traces", name) {
            traces.push((name.to_string(), read_trace(&p).unwrap()));
        }
    }
    for (name, trace) in &traces {
        let dev = &trace.devices[0];
        let s = &facts::summarize(trace)[0];
        let pt = facts::pytorch_series(dev);
        // The replay's capacity from the evidence: the releases PyTorch's allocator made after a failed
        // cudaMalloc (select_n) are the model's to make, and it makes them only on a GPU that small.
        let cap = gpuheap::replay::default_capacity(trace, dev).unwrap().bytes;
        let f = caching::fidelity(dev, caching::config_for_trace(dev, cap).0).unwrap();
        assert_eq!(s.peak_reserved, Some(pt.peak), "{name}: explain = replay's series");
        assert_eq!((f.pytorch_initial, f.pytorch_peak, f.pytorch_end), (pt.initial, pt.peak, pt.end), "{name}");
        assert_eq!(f.model_peak, f.pytorch_peak, "{name}: the model's peak reserved");
        if name.starts_with("issue-9") {
            assert_eq!((pt.initial, pt.peak, pt.end), (0, 20 * MIB, 20 * MIB));
        }
    }
}

/// `tune`'s grid goes through the model's settings API: every PyTorch row other than the snapshot's own
/// replays exactly the configuration its `PYTORCH_CUDA_ALLOC_CONF` string sets
/// (`CachingConfig::from_env` of the row's env = what the replay reads), no row says "not modelled",
/// and the garbage-collection rows set a memory fraction, without which PyTorch never collects
/// (`c10/cuda/CUDACachingAllocator.cpp` malloc: `set_fraction && garbage_collection_threshold() > 0`).
#[test]
fn tune_grid_uses_the_caching_config() {
    use gpuheap::explain::tune::{grid, Setting, GC_MEMORY_FRACTION};
    use gpuheap::reference::caching::CachingConfig;
    let trace = read_trace(write_temp("grid.pickle", &oom_snapshot(8 * MIB, 6 * MIB))).unwrap();
    let dev = &trace.devices[0];
    let rows: Vec<(String, CachingConfig)> = grid(dev)
        .into_iter()
        .skip(1)
        .filter_map(|s| match s {
            Setting::Pytorch { env, settings } => Some((env, CachingConfig::from_settings(&settings, 1 << 30).0)),
            _ => None,
        })
        .collect();
    // Its requests are 8 MiB and smaller, powers of two or below 20 MiB of divisions: only the rounding
    // rows that move one of them into another block size are tried (1 division and the list form).
    assert!(rows.len() >= 6, "{rows:?}");
    let mut gc_rows = 0;
    for (env, cfg) in &rows {
        let (parsed, warnings) = CachingConfig::from_env(env, 1 << 30).unwrap();
        assert_eq!(&parsed, cfg, "{env}");
        assert!(warnings.is_empty(), "{env}: {warnings:?}");
        assert_eq!(cfg.to_env(), *env);
        if cfg.garbage_collection_threshold > 0.0 {
            gc_rows += 1;
            assert!(cfg.gc_active(), "{env}");
            assert_eq!(cfg.memory_fraction, Some(GC_MEMORY_FRACTION), "{env}");
            assert!(env.contains("per_process_memory_fraction:1"), "{env}");
        }
    }
    assert_eq!(gc_rows, 3, "0.6, 0.8, and 0.8 with expandable segments (no max_split_size candidate here)");
    let e = explain::explain(&trace, None, None).unwrap();
    let t = explain::tune::tune(&trace, dev, &e.capacity, &|| {}).unwrap();
    for r in &t.rows {
        assert!(r.note.as_deref().is_none_or(|n| !n.contains("not modelled")), "{r:?}");
        assert_eq!(r.memory_fraction.is_some(), r.setting.contains("garbage_collection_threshold"), "{r:?}");
    }
}

/// BL-31 with `tune`: `roundup_power2_divisions` rows need what PyTorch's rounding gives by hand. The
/// snapshot's one request is 514 MiB, in the interval [512 MiB, 1 GiB): with N divisions it is rounded
/// up to a multiple of 512 MiB / N (`roundup_power2_next_division`, c10/cuda/CUDACachingAllocator.cpp),
/// a segment of its own size (≥ 10 MiB): 16 → 544 MiB, 8 → 576 MiB, 4 → 640 MiB, 2 → 768 MiB,
/// 1 → 1 GiB (the snapshot's own, which PyTorch reserved). The 2 MiB bisection finds exactly that.
#[test]
fn bl31_tune_roundup_rows_by_hand() {
    let Some(p) = shared("cases", "inputs/bl31_roundup_settings.pickle") else { return };
    let v = json(&gpuheap(&["tune", p.to_str().unwrap(), "--json"]));
    let rows = v["rows"].as_array().unwrap();
    let min = |prefix: &str| {
        let r = rows
            .iter()
            .find(|r| r["setting"].as_str().unwrap().starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix}"));
        r["min_capacity"].as_u64().unwrap()
    };
    for (d, mib) in [(16, 544), (8, 576), (4, 640), (2, 768)] {
        assert_eq!(min(&format!("roundup_power2_divisions:{d},")), mib * MIB, "{d} divisions");
    }
    let own = rows.iter().find(|r| r["own"] == true).unwrap();
    assert_eq!(own["min_capacity"].as_u64().unwrap(), 1024 * MIB);
    // The snapshot's threshold has no effect without a memory fraction, and the report says so.
    let names: Vec<&str> = v["warnings"].as_array().unwrap().iter().map(|w| w["option"].as_str().unwrap()).collect();
    assert_eq!(names, ["garbage_collection_threshold"]);
}

/// BL-31: settings the model does not implement, or that have no effect as recorded, are named by
/// `explain` and `tune` (text and JSON), never ignored silently.
#[test]
fn bl31_settings_warnings_are_shown() {
    let conf = "backend:cudaMallocAsync,garbage_collection_threshold:0.6";
    let settings =
        V::Dict(vec![("PYTORCH_CUDA_ALLOC_CONF", V::Str(conf)), ("garbage_collection_threshold", V::Float(0.6))]);
    let bytes = oom_snapshot_with(8 * MIB, 6 * MIB, Some(settings));
    let path = write_temp("bl31_warn.pickle", &bytes);
    let p = path.to_str().unwrap();
    for args in [vec!["explain", p, "--no-tune"], vec!["tune", p]] {
        let out = gpuheap(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("warning: allocator option `backend` = cudaMallocAsync"), "{args:?}: {text}");
        assert!(text.contains("warning: allocator option `garbage_collection_threshold` = 0.6: no effect"), "{text}");
    }
    let v = json(&gpuheap(&["explain", p, "--no-tune", "--json"]));
    let names: Vec<&str> = v["warnings"].as_array().unwrap().iter().map(|w| w["option"].as_str().unwrap()).collect();
    assert_eq!(names, ["backend", "garbage_collection_threshold"]);
    let v = json(&gpuheap(&["tune", p, "--json"]));
    assert_eq!(v["warnings"].as_array().unwrap().len(), 2);
    // replay and compare name them on stderr.
    for cmd in ["replay", "compare"] {
        let out = gpuheap(&[cmd, p]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{cmd}: {err}");
        assert!(err.contains("warning: allocator option `backend` = cudaMallocAsync"), "{cmd}: {err}");
    }
}

/// A retry loop that records thousands of OOMs: each one explained cost a replay of the trace up to
/// it (time quadratic in the file: 20,000 OOMs after 40,000 events ran for minutes). The first
/// `MAX_EXPLAINED_OOMS` are explained, the rest counted, and the text says so.
#[test]
fn many_recorded_ooms_explained_in_bounded_time() {
    const N: usize = 5000;
    let mut events = Vec::new();
    for k in 0..N as u64 {
        let a = S1 + (k % 16) * 2 * MIB;
        if k < 16 {
            events.push(event("segment_alloc", a, 2 * MIB, vec![]));
        }
        events.push(event("alloc", a, 2 * MIB, vec![]));
        events.push(oom(64 * MIB, MIB));
        events.push(event("free_requested", a, 2 * MIB, vec![]));
        events.push(event("free_completed", a, 2 * MIB, vec![]));
    }
    let bytes =
        pickle(&V::Dict(vec![("segments", V::List(vec![])), ("device_traces", V::List(vec![V::List(events)]))]));
    let t = read_trace(write_temp("many_ooms.pickle", &bytes)).expect("reads");
    assert_eq!(t.devices[0].ooms.len(), N);
    let start = std::time::Instant::now();
    let x = explain::explain(&t, None, None).expect("explains");
    println!("explain of {N} OOMs: {:?}", start.elapsed());
    assert_eq!(x.ooms.len(), explain::MAX_EXPLAINED_OOMS);
    assert_eq!(x.ooms_not_explained, N - explain::MAX_EXPLAINED_OOMS);
    assert_eq!(x.ooms[0].event, 2, "the first OOM follows a segment alloc and an alloc");
    assert!(x.ooms.iter().all(|o| o.verdict == Verdict::Capacity && o.request == 64 * MIB));
    let text = x.to_string();
    assert!(text.contains(&format!("{} more recorded OOM events are not explained", N - 32)), "{text}");
}

/// Recorded allocator settings PyTorch never writes (it refuses or raises them when they are set) and an
/// OOM whose reserved + `device_free` is no GPU: rejected as bad input naming the file and the key or
/// event, by every command. They used to reach the caching model, whose "invalid configuration" named
/// neither the file nor the setting (`garbage_collection_threshold` NaN was even taken as 0 silently).
#[test]
fn impossible_recorded_settings_and_oom_capacity_exit_2_naming_them() {
    let settings = |k: &'static str, v: V<'static>| oom_snapshot_with(8 * MIB, 6 * MIB, Some(V::Dict(vec![(k, v)])));
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("split0.pickle", settings("max_split_size", V::Int(0)), &["key `allocator_settings`", "max_split_size 0 B"]),
        (
            "gc_nan.pickle",
            settings("garbage_collection_threshold", V::Float(f64::NAN)),
            &["key `allocator_settings`", "garbage_collection_threshold NaN is outside [0, 1)"],
        ),
        (
            "gc_two.pickle",
            settings("garbage_collection_threshold", V::Float(2.0)),
            &["garbage_collection_threshold 2 is outside [0, 1)"],
        ),
        (
            "div3.pickle",
            settings("roundup_power2_divisions", V::Dict(vec![("1", V::Int(3))])),
            &["roundup_power2_divisions: 3 divisions", "not 0 or a power of two"],
        ),
        // 0 reserved + 1 MiB free is a GPU another process fills (`oom_first_on_a_gpu_held_elsewhere`);
        // below 4 KiB nothing is modelled.
        (
            "tiny_gpu.pickle",
            pickle(&V::Dict(vec![("device_traces", V::List(vec![V::List(vec![oom(8 * MIB, 1000)])]))])),
            &["device 0, event 0, field `device_free`", "= 1000 B, is outside [4 KiB, 2^48 B]"],
        ),
        ("huge_gpu.pickle", oom_snapshot(8 * MIB, 1 << 60), &["device 0, event 9, field `device_free`", "2^48 B"]),
    ];
    for (name, bytes, needles) in cases {
        let path = write_temp(name, &bytes);
        for cmd in ["explain", "replay", "compare", "tune"] {
            let out = gpuheap(&[cmd, path.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}: {err}");
            let line = err.lines().last().unwrap_or("");
            assert!(line.contains(path.to_str().unwrap()), "{cmd} {name} names the file: {err}");
            if cmd == "explain" || name.ends_with("gc_nan.pickle") {
                for n in needles {
                    assert!(line.contains(n), "{cmd} {name}: {line:?} should contain {n:?}");
                }
            }
        }
    }
}

/// An OOM as the first event, with nothing reserved and 1 MiB free: the GPU is held by another process
/// (a shared GPU). Explained as a capacity OOM at 1 MiB, without a replay (the caching model's least device
/// is one 2 MiB segment), never refused as a GPU too small to model.
#[test]
fn oom_first_on_a_gpu_held_elsewhere() {
    let path = write_temp(
        "held_elsewhere.pickle",
        &pickle(&V::Dict(vec![("device_traces", V::List(vec![V::List(vec![oom(20 * MIB, MIB)])]))])),
    );
    let v = json(&gpuheap(&["explain", path.to_str().unwrap(), "--no-tune", "--json"]));
    let o = &v["ooms"][0];
    assert_eq!((o["verdict"].as_str(), o["capacity"].as_u64()), (Some("capacity"), Some(MIB)), "{o}");
    assert!(o["replay"].is_null(), "{o}");
    let out = gpuheap(&["explain", path.to_str().unwrap(), "--no-tune"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PyTorch had reserved nothing: the GPU's memory was held outside its cache"), "{text}");
    for cmd in ["tune", "compare"] {
        let out = gpuheap(&[cmd, path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // `replay` runs the caching model alone by default: at 1 MiB it says so and what to do.
    let out = gpuheap(&["replay", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("1048576 B") && err.contains("choose another strategy with --strategy"), "{err}");
}

/// `replay` of the snapshot above refuses the caching model at the derived 1 MiB: the message names the
/// file and where that capacity came from (the recorded OOM, with the driver's free bytes), which the user
/// did not give; with `--capacity` given it names the file only.
#[test]
fn replay_refusing_a_derived_capacity_names_the_file_and_the_capacity_source() {
    let path = write_temp(
        "held_elsewhere_replay.pickle",
        &pickle(&V::Dict(vec![("device_traces", V::List(vec![V::List(vec![oom(20 * MIB, MIB)])]))])),
    );
    let p = path.to_str().unwrap();
    let out = gpuheap(&["replay", p]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(p), "names the file: {err}");
    assert!(err.contains("the GPU's memory at the recorded OOM (event 0)"), "says where 1 MiB came from: {err}");
    let out = gpuheap(&["replay", p, "--capacity", "1MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(p) && !err.contains("derived"), "{err}");
}

/// `gpuheap explain /dev/stdin < FILE` (or `<(...)`): explain read the file a second time for the stack
/// frames, got nothing from the spent pipe and exited 2 with "corrupt pickle". The file is read once.
#[cfg(unix)]
#[test]
fn explain_reads_a_piped_snapshot_once() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let bytes = oom_snapshot(8 * MIB, 6 * MIB);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuheap"))
        .args(["explain", "/dev/stdin", "--no-tune", "--json"])
        .env("GPUHEAP_BACKEND", "cpu")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    let v = json(&out);
    let frames = &v["largest_tensors"][0]["frames"];
    assert_eq!(frames[0]["filename"], "train.py", "the frames come from the piped bytes: {frames}");
}

/// No page recommends a setting that does not fit the GPU it names (issue 37, Deliver 6): on
/// `qwen3_train_oom` (a capacity OOM on a 78.51 GiB GPU; every PyTorch setting of the grid needs more)
/// the text, JSON and HTML pages give the same conclusion, word for word from the page model, and none
/// of them calls a setting "best" or recommends one; PyTorch settings and gpuheap's own strategies are
/// ranked apart (each group from rank 1, PyTorch's first).
#[test]
fn a_setting_that_does_not_fit_the_gpu_is_never_recommended() {
    let Some(path) = shared("traces", "qwen3_train_oom.pickle") else { return };
    let p = path.to_str().unwrap();
    let v = json(&gpuheap(&["explain", p, "--json"]));
    let t = &v["tune"];
    let cap = v["capacity"]["bytes"].as_u64().unwrap();
    let rows = t["rows"].as_array().unwrap();
    // Independently of the conclusion: every PyTorch row needs more than the GPU.
    let pytorch: Vec<&serde_json::Value> = rows.iter().filter(|r| r["kind"] == "pytorch").collect();
    assert!(!pytorch.is_empty());
    assert!(pytorch.iter().all(|r| r["min_capacity"].as_u64().is_none_or(|m| m > cap)), "{rows:?}");
    assert!(t["conclusion"]["recommended_env"].is_null(), "{t}");
    let headline = t["conclusion"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("No PyTorch setting of the grid fits in the 78.51 GiB capacity"), "{headline}");
    // Ranked apart: the PyTorch rows first, each group ranked from 1 in its order.
    let kinds: Vec<bool> = rows.iter().map(|r| r["kind"] == "pytorch").collect();
    assert!(kinds.windows(2).all(|w| w[0] >= w[1]), "PyTorch rows first: {kinds:?}");
    for group in [true, false] {
        let ranks: Vec<u64> =
            rows.iter().filter(|r| (r["kind"] == "pytorch") == group).map(|r| r["rank"].as_u64().unwrap()).collect();
        assert_eq!(ranks, (1..=ranks.len() as u64).collect::<Vec<_>>());
    }
    let text = String::from_utf8(gpuheap(&["explain", p]).stdout).unwrap();
    assert!(text.contains(headline), "{text}");
    assert!(!text.contains("Best PyTorch setting"), "{text}");
    assert!(text.contains("gpuheap's own strategies, for comparison (PyTorch cannot use them; ranked apart):"));
    let d = std::env::temp_dir().join(format!("gpuheap-explain-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    for cmd in ["explain", "tune"] {
        let html = d.join(format!("qwen3-{cmd}.html"));
        let out = gpuheap(&[cmd, p, "--html", html.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(
            page.contains(&gpuheap::html::escape(headline)),
            "{cmd}: the HTML gives the conclusion of the text page"
        );
        assert!(!page.contains("Best PyTorch setting"), "{cmd}: the HTML recommends a setting that does not fit");
    }
    let tune = json(&gpuheap(&["tune", p, "--json"]));
    assert_eq!(tune["conclusion"], t["conclusion"]);
}

/// Dumps without history are said for what they are on every page (issue 37, Deliver 3): on the shipped
/// dump and every shared snapshot whose moment is a dumped state, the JSON's `dump_caveat` says what the
/// dump cannot tell (the peak, a request, the driver's free bytes) and that nothing records an OOM (no
/// page claims an OOM observer wrote it); the text page gives it word for word and calls no figure of a
/// history-less device a peak; `tune` says that only the tensors live at the dump were packed, counting
/// them as the explanation does; the HTML pages give both.
#[test]
fn dumps_without_history_are_said_for_what_they_are() {
    let mut files = vec![workspace().join("data/equivariant-posteriors_oom_snapshot_new.pickle")];
    files.extend(common::shared_files("traces", &["pickle", "pkl"]));
    let d = std::env::temp_dir().join(format!("gpuheap-explain-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let mut dumps = 0;
    for path in &files {
        let p = path.to_str().unwrap();
        let out = gpuheap(&["explain", p, "--no-tune", "--json"]);
        if out.status.code() != Some(0) {
            continue; // files that exit 2 are tested apart
        }
        let v = json(&out);
        let caveat = v["dump_caveat"].as_str();
        if v["moment"] != "dumped-state" {
            assert!(caveat.is_none(), "{p}: a dump caveat for moment {}", v["moment"]);
            continue;
        }
        dumps += 1;
        let caveat = caveat.unwrap_or_else(|| panic!("{p}: a dumped state without a caveat"));
        for needed in [
            "cannot tell the peak before the dump, a request that failed, nor the driver's free bytes",
            "Nothing in the file records an OOM",
        ] {
            assert!(caveat.contains(needed), "{p}: {caveat}");
        }
        let text = String::from_utf8(gpuheap(&["explain", p, "--no-tune"]).stdout).unwrap();
        assert!(text.contains(caveat), "{p}: {text}");
        assert!(!text.contains("OOM observer's dump") && !text.contains("dumped by an OOM observer"), "{p}: {text}");
        for line in text.lines().filter(|l| l.contains("no history (no event recorded)")) {
            assert!(!line.contains("peak allocated") && !line.contains("peak reserved"), "{p}: {line}");
        }
        let t = json(&gpuheap(&["tune", p, "--json"]));
        let scope = t["conclusion"]["scope"].as_str().unwrap_or_else(|| panic!("{p}: tune on a dump without scope"));
        let live = v["live_blocks"].as_u64().unwrap();
        assert!(scope.contains(&format!("packs only the {live} tensors live when it was dumped")), "{p}: {scope}");
        let tune_text = String::from_utf8(gpuheap(&["tune", p]).stdout).unwrap();
        assert!(tune_text.contains(scope), "{p}: {tune_text}");
        if dumps <= 2 {
            let html = d.join("dump.html");
            let out = gpuheap(&["explain", p, "--html", html.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
            let page = std::fs::read_to_string(&html).unwrap();
            for s in [caveat, scope] {
                let plain = s.split('`').next().unwrap();
                assert!(page.contains(&gpuheap::html::escape(plain)), "{p}: the HTML lacks {plain:?}");
            }
        }
    }
    assert!(dumps >= 1, "no dumped state among {files:?}");
}

/// `tune`'s candidates come from the sizes where a setting changes a decision (issue 37, Deliver 4),
/// and each row says why it was tried. Worked out from the file apart from the grid: every
/// `max_split_size_mb:M` row has a request whose rounded size is in `[M MiB, M+1 MiB)` (PyTorch calls a
/// block of `max_split_size` bytes or more oversize, so M makes that request oversize; M + 1 would
/// not), and every `roundup_power2_divisions` row moves some request into another block size. On
/// `cs336_naive_attention_…` (one 512 MiB request) that is `max_split_size_mb:512`, which by the model
/// needs less than the snapshot's own defaults; 513, a no-op, is not offered.
#[test]
fn tune_candidates_sit_where_a_setting_changes_a_decision() {
    use gpuheap::reference::caching::CachingConfig;
    let Some(path) = shared("traces", "cs336_naive_attention_fwd_bwd_512mib_scores.pickle") else { return };
    let trace = read_trace(&path).unwrap();
    let dev = &trace.devices[0];
    let base = CachingConfig::new(1 << 40);
    let sizes: Vec<u64> = dev
        .events
        .iter()
        .filter(|e| e.kind == gpuheap::trace::EventKind::Alloc)
        .map(|e| e.size)
        .chain(dev.initial_blocks.iter().map(|b| b.size))
        .collect();
    let v = json(&gpuheap(&["tune", path.to_str().unwrap(), "--json"]));
    let rows = v["rows"].as_array().unwrap();
    let own = rows.iter().find(|r| r["own"] == true).unwrap();
    assert_eq!(own["setting"], "(defaults)");
    let mut splits = Vec::new();
    for r in rows.iter().filter(|r| r["kind"] == "pytorch" && r["own"] == false) {
        let label = r["setting"].as_str().unwrap();
        let why = r["why"].as_str().unwrap_or_else(|| panic!("{label}: no reason given"));
        if let Some(mb) = label.strip_prefix("max_split_size_mb:").filter(|m| !m.contains(',')) {
            let mb: u64 = mb.parse().unwrap();
            let block = |s: u64| base.round_size(s).unwrap();
            assert!(
                sizes.iter().any(|&s| block(s) >= mb * MIB && block(s) < (mb + 1) * MIB),
                "{label}: no request at it"
            );
            assert!(why.contains("become oversize"), "{label}: {why}");
            splits.push(mb);
        }
        if let Some(d) = label.strip_prefix("roundup_power2_divisions:") {
            let d: u64 = d.parse().unwrap_or(0);
            if d > 0 {
                let cfg = base.roundup_divisions(d);
                assert!(sizes.iter().any(|&s| cfg.round_size(s) != base.round_size(s)), "{label} moves no request");
            }
            assert!(why.contains("into another block size"), "{label}: {why}");
        }
    }
    assert_eq!(splits, [512], "{rows:?}");
    let m512 = rows.iter().find(|r| r["setting"] == "max_split_size_mb:512").unwrap();
    assert!(m512["min_capacity"].as_u64().unwrap() < own["min_capacity"].as_u64().unwrap(), "{m512} vs {own}");
    let text = String::from_utf8(gpuheap(&["tune", path.to_str().unwrap()]).stdout).unwrap();
    assert!(text.contains(&format!("  max_split_size_mb:512: {}", m512["why"].as_str().unwrap())), "{text}");
}

/// A snapshot whose device slots recorded nothing (`sam2_ppo_ddp_empty_expandable_4dev`: four empty
/// `device_traces`, no segment) is bad input for every page command: exit code 2, and the message says
/// that no device recorded anything (issue 37), not "(no devices)".
#[test]
fn an_empty_multi_device_snapshot_exits_2_saying_no_device_recorded_anything() {
    let Some(path) = shared("traces", "sam2_ppo_ddp_empty_expandable_4dev.pickle") else { return };
    let p = path.to_str().unwrap();
    for cmd in ["explain", "tune"] {
        let out = gpuheap(&[cmd, p]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(err.contains("no device recorded anything"), "{cmd}: {err}");
        assert!(!err.contains("(no devices)") && !err.contains("panicked"), "{cmd}: {err}");
    }
}

/// A snapshot that records no allocator settings has no "own" settings (issue 37): its row and replays
/// are PyTorch's defaults, said to be assumed, on the text and HTML pages; a snapshot that records
/// PyTorch's defaults keeps "snapshot's own".
#[test]
fn a_snapshot_without_recorded_settings_is_not_said_to_have_its_own() {
    let none = write_temp("no-settings.pickle", &oom_snapshot(8 * MIB, 6 * MIB));
    let out = String::from_utf8(gpuheap(&["explain", none.to_str().unwrap(), "--capacity", "80MiB"]).stdout).unwrap();
    assert!(!out.contains("snapshot's own"), "{out}");
    assert!(out.contains("(defaults) [defaults: no settings recorded]"), "{out}");
    assert!(
        out.contains(
            "Replay: the caching model with PyTorch's defaults (assumed: the snapshot records no allocator settings)"
        ),
        "{out}"
    );
    let html = std::env::temp_dir().join(format!("gpuheap-explain-{}/no-settings.html", std::process::id()));
    assert_eq!(gpuheap(&["tune", none.to_str().unwrap(), "--html", html.to_str().unwrap()]).status.code(), Some(0));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("snapshot&#39;s own") && !page.contains("snapshot's own]"), "the HTML names own settings");
    let recorded = oom_snapshot_with(8 * MIB, 6 * MIB, Some(V::Dict(vec![("expandable_segments", V::Bool(false))])));
    let with = write_temp("default-settings.pickle", &recorded);
    let out = String::from_utf8(gpuheap(&["explain", with.to_str().unwrap(), "--capacity", "80MiB"]).stdout).unwrap();
    assert!(out.contains("(defaults) [snapshot's own]"), "{out}");
}
