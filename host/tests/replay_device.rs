//! The device allocator as a replay contender (`gpuheap::replay::device`): the shipped traces and the
//! training-step trace replayed through a `DeviceHeap` on the CPU backend, every block filled with a
//! pattern when it is allocated and checked when it is freed (so no two live blocks share a byte and
//! each holds its whole request), the heap's metadata checked against the replay's view, failures
//! classified, scaling labelled.

use gpuheap::backend::Backend;
use gpuheap::facts::demand_peak;
use gpuheap::replay::{alignment_for, default_capacity, replay_device, DeviceReplayOptions, ReplayError, ReplayReport};
use gpuheap::replay::{DEVICE_HEAP, POLICY_NA};
use gpuheap::trace::{read_trace, EventKind, Trace};

mod common;
use common::workspace;

fn run(trace: &Trace, opts: &DeviceReplayOptions) -> ReplayReport {
    replay_device(trace, &trace.devices[0], &Backend::cpu(), opts, &mut |_| {}).expect("replays")
}

/// The bytes sent to `malloc` for each successful request, summed independently of the replay: the
/// request rounded to the trace's alignment, divided by the scale (rounded up).
fn sent_bytes(trace: &Trace, r: &ReplayReport, scale: u64) -> u64 {
    let d = &trace.devices[0];
    let align = alignment_for(trace);
    let send = |s: u64| s.max(1).div_ceil(align) * align;
    let failed_events: Vec<Option<usize>> = r.failed.iter().map(|f| f.event).collect();
    // Initial failures are not tied to an event; with none, every initial block counts.
    assert!(!failed_events.contains(&None), "no initial block fails in these tests");
    let mut total: u64 = d.initial_blocks.iter().map(|b| send(b.size).div_ceil(scale).max(1)).sum();
    for (i, e) in d.events.iter().enumerate() {
        if e.kind == EventKind::Alloc && !failed_events.contains(&Some(i)) {
            total += send(e.size).div_ceil(scale).max(1);
        }
    }
    total
}

/// What every device replay must satisfy.
fn check_common(trace: &Trace, r: &ReplayReport, scale: u64) {
    let d = &trace.devices[0];
    let dh = r.device_heap.as_ref().expect("device figures");
    assert_eq!(dh.scaled_by, scale);
    if scale == 1 {
        assert_eq!(r.strategy, DEVICE_HEAP);
        assert!(dh.scale_reason.is_none());
    } else {
        assert_eq!(r.strategy, format!("{DEVICE_HEAP} (scaled 1/{scale})"));
        assert!(dh.scale_reason.as_deref().unwrap().contains("device-heap limit"));
        assert!(r.capacity.describe().contains(&format!("scaled 1/{scale}")), "{}", r.capacity.describe());
    }
    assert_eq!(dh.heap_capacity, dh.trace_capacity / scale / 4096 * 4096, "capacity divided by the scale");
    assert_eq!(r.capacity.bytes, dh.heap_capacity);
    assert_eq!(r.policy, POLICY_NA);
    assert!(r.compactions.is_empty());
    assert_eq!(r.events, d.events.len());
    assert_eq!(r.allocs, d.count(EventKind::Alloc));
    let successes = (d.initial_blocks.len() + r.allocs) as u64 - r.failed.len() as u64;
    assert_eq!(dh.checked_allocations, successes, "every non-null pointer checked (data region, alignment, disjoint)");
    assert_eq!(dh.heap_failed_counter, r.failed.len() as u64, "the heap counted the same null returns");
    assert!(dh.malloc_launches >= 1 && dh.malloc_launches <= (d.count(EventKind::Alloc) + 1) as u64);
    // Patterns: every successful block was filled over the bytes sent and read back intact, so no two
    // live blocks overlapped and each block held its whole request.
    assert_eq!(dh.verified_bytes, Some(sent_bytes(trace, r, scale)), "every block's bytes verified");
    for f in &r.failed {
        assert!(["capacity", "fragmentation", "rounding"].contains(&f.class.as_str()), "{f:?}");
        assert!(f.largest_free <= f.free);
    }
    assert!(r.peak_reserved <= r.capacity.bytes);
    if r.failed.is_empty() && scale == 1 {
        assert_eq!(r.peak_allocated, demand_peak(d).1, "no failure: the whole demand was served");
    }
    for s in [&r.at_peak, &r.at_end] {
        assert!(s.in_use >= s.allocated, "blocks hold their requests");
        assert!(s.footprint >= s.in_use, "the footprint holds the blocks");
        assert_eq!(s.reserved_unallocated, s.footprint - s.allocated);
        assert_eq!(s.holes + s.rounding_waste, s.reserved_unallocated);
        assert!(s.free + s.in_use <= r.capacity.bytes);
        assert!((0.0..=1.0).contains(&s.external));
    }
    // Buddy accounting at the end: free bytes, slab pages and large blocks tile the data region.
    assert!(dh.free_bytes + dh.slab_pages * 65536 <= dh.heap_capacity);
    assert!(dh.metadata_high_water >= r.at_end.footprint, "the metadata's high-water mark includes kept pages");
    assert!(!r.timeline.is_empty() || d.events.is_empty());
}

#[test]
fn device_heap_replays_the_minimalloc_csv_with_disjoint_blocks() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let r = run(&t, &{
        let mut o = DeviceReplayOptions::default();
        o.verify_bytes = true;
        o
    });
    check_common(&t, &r, 1);
    assert_eq!(r.capacity.bytes, 1 << 20, "the capacity from the file name, unscaled");
    assert!(!r.failed.is_empty(), "1 MiB with power-of-two blocks cannot hold this instance");
    assert_eq!(r.at_end.allocated, 0, "every buffer of the instance ends");
    assert_eq!(r.at_end.in_use, 0);
    let dh = r.device_heap.unwrap();
    assert_eq!(dh.free_bytes + dh.slab_pages * 65536, 1 << 20, "everything free or in kept slab pages");
}

#[test]
fn device_heap_replays_the_shipped_snapshot_at_full_size() {
    let t = read_trace(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    let d = &t.devices[0];
    // At full size without filling (5.3 GiB live): the checks of pointers and metadata still run.
    let r = run(&t, &DeviceReplayOptions::default());
    let cap = default_capacity(&t, d).unwrap().bytes;
    assert_eq!(cap, 7_608_467_456, "PyTorch's recorded peak reserved bytes, every command's capacity");
    assert_eq!(r.device_heap.as_ref().unwrap().scaled_by, 1, "7.09 GiB fits the CPU default limit of 8 GiB");
    assert!(r.failed.is_empty(), "{:?}", r.failed.first());
    assert_eq!(r.peak_allocated, demand_peak(d).1);
    assert_eq!(r.initial_blocks, 786);
    assert_eq!(r.device_heap.as_ref().unwrap().checked_allocations, 786 + r.allocs as u64);
    assert!(r.peak_reserved >= r.peak_allocated && r.peak_reserved <= cap);
    // Filled and checked on a scaled trace.
    let limit = 512 << 20;
    let s = run(&t, &{
        let mut o = DeviceReplayOptions::default();
        o.verify_bytes = true;
        o.heap_limit = Some(limit);
        o
    });
    check_common(&t, &s, 16);
    assert_eq!(
        s.capacity.bytes,
        cap / 16,
        "the trace's capacity, scaled 1/16 below the 512 MiB limit: {:?}",
        s.capacity
    );
}

#[test]
fn device_heap_replays_the_training_step_trace() {
    let Some(p) = common::shared("traces/memory_ctx512_fullstep_.pickle") else { return };
    let t = read_trace(&p).unwrap();
    let r = run(&t, &{
        let mut o = DeviceReplayOptions::default();
        o.verify_bytes = true;
        o.heap_limit = Some(512 << 20);
        o
    });
    // 59 GiB scaled to at most 512 MiB: 1/128.
    check_common(&t, &r, 128);
    assert!(r.failed.iter().any(|f| f.class == "fragmentation"), "power-of-two blocks fragment this trace");
    assert!(r.timeline.len() <= 2001);
}

#[test]
fn device_heap_bad_capacity_is_input_and_scaling_is_explained() {
    let t = read_trace(workspace().join("data/K.1048576.csv")).unwrap();
    let e = replay_device(
        &t,
        &t.devices[0],
        &Backend::cpu(),
        &{
            let mut o = DeviceReplayOptions::default();
            o.capacity = Some(100);
            o
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.is_input(), "{e}");
    assert!(matches!(e, ReplayError::Config(_)));
    // A limit below the capacity scales by the next power of two, labelled.
    let r = run(&t, &{
        let mut o = DeviceReplayOptions::default();
        o.heap_limit = Some(300 << 10);
        o.verify_bytes = true;
        o
    });
    check_common(&t, &r, 4);
    assert_eq!(r.capacity.bytes, 256 << 10);
}
