//! The user kernel on the CPU backend (sequential and lockstep warps) and on
//! the GPU when present, checked against the host model of each array.

use gpuheap::backend::Backend;
use gpuheap::device_heap::DeviceHeap;
use growable_arrays_kernels::{checksum, pushes};

fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::cpu(), Backend::cpu_lockstep()];
    match Backend::gpu() {
        Ok(g) if !growable_arrays::PTX.is_empty() => v.push(g),
        Ok(_) => eprintln!("GPU part skipped: the example's PTX was not built"),
        Err(e) => eprintln!("GPU part skipped: {e}"),
    }
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
