//! The trace readers on the real traces: the Apache-2.0 files shipped in `data/` and the
//! unlicensed training-step snapshot read from `../shared/traces/` (skipped when absent).
//! Expected values are the ones documented in `data/ATTRIBUTION.md` and `shared/traces/SOURCES.md`;
//! the tests compute them from what the readers return.

use std::collections::HashMap;
use std::path::PathBuf;

use gpuheap::trace::{
    read_trace, validate, AddressKind, BlockStatus, DeviceTrace, EventKind, Pool, SnapshotLayout, TimeUnit,
    TraceFormat, NO_ID,
};

const GIB: f64 = (1u64 << 30) as f64;

mod common;
use common::workspace;

fn data(name: &str) -> PathBuf {
    workspace().join("data").join(name)
}

/// The unlicensed snapshot is not shipped: read it from the shared folder (a failure under
/// `GPUHEAP_REQUIRE_SHARED=1` when it is absent).
fn shared(name: &str) -> Option<PathBuf> {
    common::shared(&format!("traces/{name}"))
}

fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / GIB)
}

/// Ids are dense, an alloc and its frees share one, and the stream validates.
fn check_ids(d: &DeviceTrace) {
    // The strictest check (`Device`: addr + size in range); the row handles of the CSVs here pass it too.
    validate(d, AddressKind::Device).expect("stream validates");
    let mut alloc_ids = Vec::new();
    let mut by_id: HashMap<u32, u64> = HashMap::new();
    for s in &d.initial_blocks {
        by_id.insert(s.id, s.addr);
    }
    for e in &d.events {
        match e.kind {
            EventKind::Alloc => {
                alloc_ids.push(e.id);
                by_id.insert(e.id, e.addr);
            }
            EventKind::FreeRequested | EventKind::Free => assert_eq!(by_id[&e.id], e.addr, "free id names its block"),
            EventKind::SegmentAlloc | EventKind::SegmentFree => assert!(e.id < d.segment_ids),
            _ => assert_eq!(e.id, NO_ID),
        }
    }
    let n0 = d.initial_blocks.len() as u32;
    assert_eq!(alloc_ids, (n0..n0 + alloc_ids.len() as u32).collect::<Vec<_>>(), "alloc ids are dense, after seeds");
    assert_eq!(d.block_ids, n0 + alloc_ids.len() as u32);
}

/// Requested bytes of the initial blocks, plus allocs, minus completed frees, must equal the
/// requested bytes of the final state's active blocks; the same for segments and reserved bytes.
fn check_seeds_against_final_state(d: &DeviceTrace) {
    let fin = d.final_state.as_ref().unwrap();
    let mut live: i128 = d.initial_blocks.iter().map(|b| b.size as i128).sum();
    let mut reserved: i128 = d.initial_segments.iter().map(|s| s.size as i128).sum();
    for e in &d.events {
        match e.kind {
            EventKind::Alloc => live += e.size as i128,
            EventKind::Free => live -= e.size as i128,
            EventKind::SegmentAlloc => reserved += e.size as i128,
            EventKind::SegmentFree => reserved -= e.size as i128,
            _ => {}
        }
    }
    assert_eq!(live, fin.requested_bytes() as i128, "seeds + events reproduce the final requested bytes");
    assert_eq!(reserved, fin.reserved_bytes() as i128, "seeds + events reproduce the final reserved bytes");
}

#[test]
fn recent_snapshot_training_step() {
    let Some(path) = shared("memory_ctx512_fullstep_.pickle") else { return };
    let t0 = std::time::Instant::now();
    let trace = read_trace(&path).unwrap();
    println!("read {} in {:?} (test profile)", path.display(), t0.elapsed());
    assert_eq!(trace.format, TraceFormat::PytorchSnapshot(SnapshotLayout::Recent));
    assert_eq!(trace.addresses, AddressKind::Device);
    assert_eq!(trace.time_unit, TimeUnit::Microseconds);
    assert_eq!(trace.devices.len(), 1);
    let d = &trace.devices[0];
    assert_eq!(d.device, 0);

    // SOURCES.md: 19,936 events: 6,769 alloc, 5,894 free_requested, 5,894 free_completed,
    // 589 segment_alloc, 790 segment_free.
    assert_eq!(d.events.len(), 19_936);
    let counts: Vec<usize> =
        [EventKind::Alloc, EventKind::FreeRequested, EventKind::Free, EventKind::SegmentAlloc, EventKind::SegmentFree]
            .iter()
            .map(|&k| d.count(k))
            .collect();
    assert_eq!(counts, [6_769, 5_894, 5_894, 589, 790]);
    // 0.52 s of events, time stamps non-decreasing.
    let times: Vec<i64> = d.events.iter().map(|e| e.time_us.unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(format!("{:.2}", (times[times.len() - 1] - times[0]) as f64 / 1e6), "0.52");
    // Alloc sizes 1 B to 528 MiB, 24 distinct.
    let sizes: std::collections::BTreeSet<u64> =
        d.events.iter().filter(|e| e.kind == EventKind::Alloc).map(|e| e.size).collect();
    assert_eq!(sizes.len(), 24);
    assert_eq!((*sizes.first().unwrap(), *sizes.last().unwrap()), (1, 553_648_128));

    // Final state: 820 segments (783 large, 37 small), 1,703 blocks (1,201 active, 502 inactive),
    // reserved 58.52 GiB, allocated 51.03 GiB, largest inactive 100 MiB.
    let fin = d.final_state.as_ref().unwrap();
    assert_eq!(fin.segment_count(), 820);
    assert_eq!(fin.segments.iter().filter(|s| s.pool == Pool::Large).count(), 783);
    assert_eq!(fin.segments.iter().filter(|s| s.pool == Pool::Small).count(), 37);
    assert_eq!(fin.block_count(), 1_703);
    assert_eq!(fin.blocks().filter(|b| b.state == BlockStatus::ActiveAllocated).count(), 1_201);
    assert_eq!(fin.blocks().filter(|b| b.state == BlockStatus::Inactive).count(), 502);
    assert_eq!(gib(fin.reserved_bytes()), "58.52");
    assert_eq!(gib(fin.allocated_bytes()), "51.03");
    assert_eq!(gib(fin.reserved_bytes() - fin.allocated_bytes()), "7.48");
    assert_eq!(fin.largest_free_block(), 100 << 20);
    for s in &fin.segments {
        assert_eq!(s.blocks.iter().map(|b| b.size).sum::<u64>(), s.size, "blocks tile their segment");
    }

    // Allocator settings: default caching allocator.
    let st = d.allocator_settings.as_ref().unwrap();
    assert_eq!(st.expandable_segments, Some(false));
    assert_eq!(st.max_split_size, Some(-1));
    assert_eq!(st.alloc_conf.as_deref(), Some(""));
    assert_eq!(st.roundup_power2_divisions.len(), 16);

    // Recording began after the model was built: the 790 segment_free events free segments the
    // trace never allocated, and 326 parameter/optimizer blocks are live throughout.
    assert_eq!(d.initial_segments.len(), 820 - 589 + 790);
    assert_eq!(d.initial_blocks.len(), 326);
    assert!(d.initial_blocks.iter().all(|b| !b.pending_free));
    check_ids(d);
    check_seeds_against_final_state(d);
}

#[test]
fn legacy_snapshot_inference() {
    let trace = read_trace(data("1.3b_snapshot.pickle")).unwrap();
    assert_eq!(trace.format, TraceFormat::PytorchSnapshot(SnapshotLayout::Legacy2_0));
    assert_eq!(trace.devices.len(), 1);
    let d = &trace.devices[0];
    let fin = d.final_state.as_ref().unwrap();
    // ATTRIBUTION.md: 257 segments (254 large, 3 small), 948 blocks (785 active, 163 inactive),
    // reserved 7.09 GiB, allocated 5.29 GiB, largest inactive 198 MiB.
    assert_eq!(fin.segment_count(), 257);
    assert_eq!(fin.segments.iter().filter(|s| s.pool == Pool::Small).count(), 3);
    assert_eq!(fin.block_count(), 948);
    assert_eq!(fin.blocks().filter(|b| b.state == BlockStatus::ActiveAllocated).count(), 785);
    assert_eq!(fin.blocks().filter(|b| b.state == BlockStatus::Inactive).count(), 163);
    assert_eq!(gib(fin.reserved_bytes()), "7.09");
    assert_eq!(gib(fin.allocated_bytes()), "5.29");
    assert_eq!(fin.largest_free_block(), 198 << 20);
    let mut seg_sizes: HashMap<u64, usize> = HashMap::new();
    for s in &fin.segments {
        *seg_sizes.entry(s.size).or_default() += 1;
    }
    assert_eq!((seg_sizes[&(20 << 20)], seg_sizes[&(32 << 20)], seg_sizes[&(198 << 20)]), (149, 96, 5));
    // Implicit addresses: each block starts where the previous one ends.
    for s in &fin.segments {
        let mut cursor = s.addr;
        for b in &s.blocks {
            assert_eq!(b.addr, cursor);
            cursor += b.size;
        }
        assert_eq!(cursor, s.addr + s.size);
    }
    // One free_completed of a block allocated before recording began (with no free_requested in
    // the trace, so it was already pending), inside one of the 20 MiB segments.
    assert_eq!(d.events.len(), 1);
    let e = d.events[0];
    assert_eq!((e.kind, e.addr, e.size, e.time_us), (EventKind::Free, 140_500_535_853_056, 8_896_512, None));
    let seed = d.initial_blocks.iter().find(|b| b.addr == e.addr).unwrap();
    assert!(seed.pending_free);
    assert_eq!(seed.id, e.id);
    assert_eq!(d.initial_blocks.len(), 785 + 1);
    assert_eq!(d.initial_segments.len(), 257);
    assert!(d.allocator_settings.is_none());
    check_ids(d);
    check_seeds_against_final_state(d);
}

#[test]
fn lifetime_csv_minimalloc() {
    let trace = read_trace(data("K.1048576.csv")).unwrap();
    assert_eq!(trace.format, TraceFormat::LifetimeCsv);
    assert_eq!(trace.addresses, AddressKind::Handle);
    assert_eq!(trace.time_unit, TimeUnit::Ticks);
    let d = &trace.devices[0];
    assert_eq!(d.count(EventKind::Alloc), 454);
    assert_eq!(d.count(EventKind::Free), 454);
    assert_eq!(d.block_ids, 454);
    // Ordered by time, frees before allocs at equal times.
    for w in d.events.windows(2) {
        let (a, b) = (w[0].time_us.unwrap(), w[1].time_us.unwrap());
        assert!(a < b || (a == b && !(w[0].kind == EventKind::Alloc && w[1].kind == EventKind::Free)));
    }
    // Peak live bytes = the capacity in the file name; times span 0..1,048,576; sizes ≤ 858,112.
    let (mut live, mut peak) = (0u64, 0u64);
    for e in &d.events {
        match e.kind {
            EventKind::Alloc => live += e.size,
            _ => live -= e.size,
        }
        peak = peak.max(live);
    }
    assert_eq!(live, 0);
    assert_eq!(peak, 1_048_576);
    assert_eq!(d.events.first().unwrap().time_us, Some(0));
    assert_eq!(d.events.last().unwrap().time_us, Some(1_048_576));
    assert_eq!(d.events.iter().map(|e| e.size).max(), Some(858_112));
    // Row 0 of the file: `0,277504,279552,528384`.
    let row0: Vec<_> = d.events.iter().filter(|e| e.addr == 0).collect();
    assert_eq!((row0[0].kind, row0[0].time_us, row0[0].size), (EventKind::Alloc, Some(277_504), 528_384));
    assert_eq!((row0[1].kind, row0[1].time_us), (EventKind::Free, Some(279_552)));
    check_ids(d);
}

fn temp_file(name: &str, content: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuheap-trace-readers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

#[test]
fn rmm_log() {
    let log = "Thread,Time,Action,Pointer,Size,Stream\n\
               2342727,23:59:59.999000,allocate,0x7f0000000000,1048576,0x0\n\
               2342727,23:59:59.999500,allocate,0x7f0000100000,256,0x5603e2c0\n\
               2342728,00:00:00.000100,free,0x7f0000000000,1048576,0x0\n\
               2342728,00:00:00.000200,allocate failure,0x0,9000000000000,0x0\n\
               2342727,00:00:00.001000,deallocate,0x7f0000100000,256,0x5603e2c0\n";
    let path = temp_file("rmm_log.dev1.csv", log.as_bytes());
    let trace = read_trace(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(trace.format, TraceFormat::RmmLog);
    let d = &trace.devices[0];
    assert_eq!(d.device, 1);
    let kinds: Vec<_> = d.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Alloc, EventKind::Alloc, EventKind::Free, EventKind::Oom, EventKind::Free]);
    assert_eq!(d.events[1].stream, 0x5603e2c0);
    assert_eq!(d.events[3].size, 9_000_000_000_000);
    assert_eq!(d.ooms.len(), 1);
    // Midnight wrap: times keep increasing.
    let t: Vec<i64> = d.events.iter().map(|e| e.time_us.unwrap()).collect();
    assert_eq!(t[2] - t[0], 1_100);
    assert!(t.windows(2).all(|w| w[0] < w[1]));
    assert_eq!((d.events[0].id, d.events[2].id, d.events[1].id, d.events[4].id), (0, 0, 1, 1));
    check_ids(d);
}

#[test]
fn recent_snapshot_from_python_text_and_expandable() {
    // A protocol-0 snapshot with an empty device 0 trace, a device 1 trace, an expandable segment
    // mapped during the trace, and an oom:
    // {"segments": [{"device": 1, "address": 4096, "total_size": 8192, "is_expandable": True,
    //   "blocks": [{"address": 4096, "size": 8192, "requested_size": 100, "state": "active_allocated"}]}],
    //  "device_traces": [[], [{"action": "segment_map", "addr": 4096, "size": 8192, "stream": 0},
    //   {"action": "alloc", "addr": 4096, "size": 100, "time_us": 12.0},
    //   {"action": "oom", "size": 99999, "device_free": 7}]]}
    // `pickle.dumps(obj, protocol=0)` of the object in the comment above, checked to load back
    // equal in Python.
    let p = b"(dp0\nVsegments\np1\n(lp2\n(dp3\nVdevice\np4\nI1\nsVaddress\np5\nI4096\nsVtotal_size\np6\nI8192\n\
sVis_expandable\np7\nI01\nsVblocks\np8\n(lp9\n(dp10\ng5\nI4096\nsVsize\np11\nI8192\nsVrequested_size\np12\nI100\n\
sVstate\np13\nVactive_allocated\np14\nsasasVdevice_traces\np15\n(lp16\n(lp17\na(lp18\n(dp19\nVaction\np20\n\
Vsegment_map\np21\nsVaddr\np22\nI4096\nsg11\nI8192\nsVstream\np23\nI0\nsa(dp24\ng20\nValloc\np25\nsg22\nI4096\nsg11\n\
I100\nsVtime_us\np26\nF12.0\nsa(dp27\ng20\nVoom\np28\nsg11\nI99999\nsVdevice_free\np29\nI7\nsaas.";
    let path = temp_file("tiny.pickle", p);
    let trace = read_trace(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(trace.devices.len(), 1);
    let d = &trace.devices[0];
    assert_eq!(d.device, 1);
    let kinds: Vec<_> = d.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::SegmentMap, EventKind::Alloc, EventKind::Oom]);
    assert_eq!(d.events[1].time_us, Some(12));
    assert_eq!(d.ooms[0].device_free, Some(7));
    assert_eq!(d.events[2].size, 99_999);
    assert!(d.final_state.as_ref().unwrap().segments[0].is_expandable);
    assert!(d.initial_blocks.is_empty(), "the final block is the one the trace allocates");
    check_ids(d);
}

#[test]
fn fuzz_seed_pickles_are_valid_traces() {
    let dir = workspace().join("fuzz/seeds/pickle");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let trace = read_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        let d = &trace.devices[0];
        assert!(!d.events.is_empty());
        check_ids(d);
        if path.to_string_lossy().contains("recent") {
            assert_eq!(d.count(EventKind::Alloc), 2);
            assert_eq!(d.ooms[0].device_free, Some(5));
            assert_eq!(d.allocator_settings.as_ref().unwrap().roundup_power2_divisions, [(1, 0), (2, 4)]);
            check_seeds_against_final_state(d);
        } else {
            assert_eq!(trace.format, TraceFormat::PytorchSnapshot(SnapshotLayout::Legacy2_0));
            assert_eq!(d.initial_blocks.len(), 2);
        }
        n += 1;
    }
    assert_eq!(n, 4);
}
