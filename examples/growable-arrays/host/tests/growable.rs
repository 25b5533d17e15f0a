//! The user kernel on the CPU backend (sequential and lockstep warps) and on
//! the GPU when present, checked against the host model of each array.

use gpuheap::backend::Backend;
use gpuheap::device_heap::DeviceHeap;
use growable_arrays_kernels::{checksum, pushes};

/// The CPU backend in sequential and lockstep mode and the GPU when usable; `GPUHEAP_TEST_BACKENDS`
/// (a comma-separated subset of `sequential`, `lockstep`, `gpu`) keeps only those, and with
/// `GPUHEAP_REQUIRE_GPU=1` a GPU that cannot run the example is a failure, not a skip (as in
/// gpuheap's own tests, `host/tests/common`).
fn backends() -> Vec<Backend> {
    let only = std::env::var("GPUHEAP_TEST_BACKENDS").unwrap_or_default();
    let want = |name: &str| only.trim().is_empty() || only.split(',').any(|s| s.trim() == name);
    let required = std::env::var("GPUHEAP_REQUIRE_GPU").is_ok_and(|v| v.trim() == "1");
    let mut v = Vec::new();
    if want("sequential") {
        v.push(Backend::cpu());
    }
    if want("lockstep") {
        v.push(Backend::cpu_lockstep());
    }
    if want("gpu") {
        let why = match Backend::gpu() {
            Ok(g) if !growable_arrays::PTX.is_empty() => {
                v.push(g);
                None
            }
            Ok(_) => Some("the example's PTX was not built".to_string()),
            Err(e) => Some(e.to_string()),
        };
        match why {
            Some(why) if required => panic!("GPUHEAP_REQUIRE_GPU=1 but the GPU part cannot run: {why}"),
            Some(why) => eprintln!("GPU part skipped: {why}"),
            None => {}
        }
    }
    assert!(
        !v.is_empty() || want("gpu"),
        "GPUHEAP_TEST_BACKENDS={only:?} names no backend this test runs on (sequential, lockstep, gpu)"
    );
    v
}

#[test]
fn arrays_grow_copy_and_free_through_the_device_heap() {
    for b in backends() {
        let heap = DeviceHeap::new(&b, 64 << 20).unwrap();
        let (threads, max_pushes) = (300, 3000); // up to 12 KB arrays: slab and buddy sizes
        let run = growable_arrays::run(&b, &heap, threads, max_pushes).unwrap();
        for i in 0..threads {
            let n = pushes(i, max_pushes);
            assert_eq!(run.checksums[i as usize], checksum(i, n), "{b:?}: thread {i} ({n} values)");
            assert_eq!(run.capacities[i as usize], n.max(4).next_power_of_two().max(4), "{b:?}: thread {i}");
        }
        let s = heap.stats().unwrap();
        assert_eq!((s.bytes_in_use(), s.failed_requests), (0, 0), "{b:?}: every array was freed: {s:?}");
        assert_eq!(s.accounted_bytes(), s.capacity);
    }
}
