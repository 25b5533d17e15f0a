//! The C ABI of the device heap (`gpuheap_kernels::capi`, declared for CUDA C/C++ in
//! `gpuheap.cuh`) on the CPU backends: a kernel written against the five `extern "C"` functions
//! only, as a CUDA C++ kernel calls them, allocates, resolves and frees, and the heap's own
//! accounting and the movable region's agree with what it did. (The same functions linked into
//! sm_80 and sm_90 cubins are checked by examples/cuda-cpp/link.py.)

use gpuheap::backend::{Backend, LaunchConfig};
use gpuheap::device_heap::DeviceHeap;
use gpuheap_kernels::arch::index::global_thread_id;
use gpuheap_kernels::capi::{
    gpuheap_free, gpuheap_handle_alloc, gpuheap_handle_free, gpuheap_handle_resolve, gpuheap_malloc,
};
use gpuheap_kernels::heap::Heap;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    heap: Heap,
    threads: u64,
    /// `threads * 5` u64s per thread: malloc pointer, handle, resolved pointer, first and
    /// second `gpuheap_handle_free` results.
    out: u64,
}

/// Thread `i` allocates `16 + i % 200` bytes and a 40-byte movable block, fills both, resolves
/// the handle, frees both, and frees the handle a second time (which must be refused).
unsafe fn body(p: &Params) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let heap = &p.heap as *const Heap;
    // SAFETY: a live heap (the test keeps it alive over the launch); every lane of the warp
    // calls the collective functions (the thread count is a multiple of 32).
    unsafe {
        let size = 16 + i % 200;
        let ptr = gpuheap_malloc(heap, size);
        if !ptr.is_null() {
            core::ptr::write_bytes(ptr, i as u8, size as usize);
        }
        let h = gpuheap_handle_alloc(heap, 40);
        let r = gpuheap_handle_resolve(heap, h);
        if !r.is_null() {
            core::ptr::write_bytes(r, !(i as u8), 40);
        }
        gpuheap_free(heap, ptr);
        let first = gpuheap_handle_free(heap, h);
        let second = gpuheap_handle_free(heap, h);
        let out = (p.out as *mut u64).add(i as usize * 5);
        for (k, v) in [ptr as u64, h, r as u64, first as u64, second as u64].into_iter().enumerate() {
            out.add(k).write(v);
        }
    }
}

gpuheap_kernels::kernel_entry! {
    static CAPI: Params = gpuheap_test_capi => body;
}

#[test]
fn the_c_abi_allocates_resolves_and_frees_like_the_rust_api() {
    const THREADS: u64 = 256;
    for backend in [Backend::cpu(), Backend::cpu_lockstep()] {
        let mut heap = DeviceHeap::with_movable(&backend, 16 << 20, 1 << 20, 1024).unwrap();
        let h = heap.handle();
        let out = backend.alloc_zeroed(THREADS as usize * 5 * 8).unwrap();
        let p = Params { heap: h, threads: THREADS, out: out.device_ptr() };
        // SAFETY: the heap and `out` (THREADS * 5 u64s) live over the launch.
        unsafe { backend.launch(&CAPI, LaunchConfig::for_threads(THREADS, 64).unwrap(), &p) }.unwrap();
        let rows: Vec<u64> = out.read().unwrap();
        let movable = (h.base + h.movable_off)..(h.base + h.movable_off + h.movable_bytes);
        for (i, row) in rows.chunks(5).enumerate() {
            let [ptr, handle, resolved, first, second] = row.try_into().unwrap();
            assert!(ptr != 0 && ptr % 16 == 0, "{backend:?} thread {i}: malloc gave {ptr:#x}");
            assert!((h.base..h.base + h.capacity).contains(&ptr) && !movable.contains(&ptr), "{backend:?} {i}");
            assert_ne!(handle, 0, "{backend:?} thread {i}: no handle");
            assert!(movable.contains(&resolved) && resolved % 16 == 0, "{backend:?} {i}: resolved {resolved:#x}");
            assert_eq!((first, second), (1, 0), "{backend:?} thread {i}: handle frees");
        }
        let s = heap.stats().unwrap();
        assert_eq!((s.bytes_in_use(), s.failed_requests), (0, 0), "{backend:?}: every block was freed: {s:?}");
        let m = heap.movable().unwrap().stats().unwrap();
        assert_eq!((m.live_handles, m.failed_requests), (0, 0), "{backend:?}: {m:?}");
        assert_eq!(m.cursor, THREADS * 48, "{backend:?}: 40-byte blocks take 48 bytes of the span");
    }
}
