//! The `gpuheap bench compact` suite's layouts from real traces (`gpuheap_cli::bench::compact`).

#[path = "../../host/tests/common/mod.rs"]
mod common;

use gpuheap::backend::Backend;
use gpuheap::compaction::GRANULE;

/// Layouts from real traces (`gpuheap bench compact`'s extra rows): the final segments of the shipped
/// snapshot (and of the training-step trace when present), per segment and as one region, compacted by
/// the kernel on the CPU backend and checked against the reference slide, then measured beside the copy.
#[test]
fn bench_layouts_from_trace_snapshots_compact_like_the_reference() {
    use gpuheap::compaction::{CompactTuning, Compactor, BLOCK_PINNED};
    use gpuheap_cli::bench::compact::{measure_trace, trace_layout, TraceMode};
    let mut paths = vec![common::data_file("1.3b_snapshot.pickle")];
    paths.extend(common::shared("traces/memory_ctx512_fullstep_.pickle"));
    let backend = Backend::cpu();
    let mut compactor = Compactor::new(CompactTuning::for_backend(&backend));
    for p in paths {
        let t = gpuheap::trace::read_trace(&p).unwrap();
        let fin = t.devices[0].final_state.as_ref().unwrap();
        let active = fin.blocks().filter(|b| b.state != gpuheap::trace::BlockStatus::Inactive).count();
        for mode in [TraceMode::PerSegment, TraceMode::OneRegion] {
            let limit = 8 << 20;
            let l = trace_layout(&p, limit, mode).unwrap();
            assert!(l.capacity <= limit && l.scaled_by.is_power_of_two() && l.scaled_by > 1, "{}", l.name);
            assert!(l.name.contains(&format!("scaled 1/{}", l.scaled_by)), "{}", l.name);
            assert_eq!(l.segments, fin.segment_count());
            assert_eq!(l.full_bytes, fin.reserved_bytes());
            assert_eq!(l.blocks.len(), active + l.separators);
            let seps = l.blocks.iter().filter(|b| b.flags & BLOCK_PINNED != 0).count();
            assert_eq!(seps, l.pinned + l.separators);
            for w in l.blocks.windows(2) {
                assert!(w[0].offset + w[0].size <= w[1].offset, "address order, no overlap");
            }
            assert!(l.blocks.iter().all(|b| b.offset % GRANULE == 0 && b.size % GRANULE == 0));
            // The kernel's layout equals the reference slide, and every moved byte arrives.
            let fill: Vec<u8> = (0..l.capacity).map(|i| (i * 7 + 3) as u8).collect();
            let mut region = backend.upload(&fill).unwrap();
            let run = compactor.compact(&backend, &mut region, &l.blocks, None).unwrap();
            assert_eq!(
                run.new_offsets,
                gpuheap::compaction::oracle::plan(&l.blocks).expect("valid layout"),
                "{}",
                l.name
            );
            let after: Vec<u8> = region.read().unwrap();
            for (b, &d) in l.blocks.iter().zip(&run.new_offsets) {
                let (s, d, n) = (b.offset as usize, d as usize, b.size as usize);
                assert_eq!(&after[d..d + n], &fill[s..s + n], "{}: block at {s}", l.name);
            }
            if mode == TraceMode::PerSegment {
                // Nothing crosses a segment: each block stays between its separators.
                let mut seg_start = 0;
                for (b, &d) in l.blocks.iter().zip(&run.new_offsets) {
                    assert!(d >= seg_start, "{}", l.name);
                    if b.handle == gpuheap_kernels::compact::NO_HANDLE {
                        seg_start = b.offset + b.size;
                    }
                }
            }
            let row = measure_trace(&backend, &mut compactor, &l, 1).unwrap();
            assert_eq!(row.scaled_by, l.scaled_by);
            assert_eq!(row.blocks as usize, active);
            assert!(row.compact_ms > 0.0 && row.copy_ms > 0.0 || row.bytes_moved == 0);
        }
    }
}
