//! The C ABI of the device heap: `malloc`/`free` and the movable region's
//! handle functions as `extern "C"` device functions, for kernels written in
//! CUDA C/C++ (declared in `include/gpuheap.cuh`).
//!
//! # The device library
//!
//! With the cargo feature `device-library` this crate builds to a
//! **relocatable device library**: one PTX module whose only symbols are the
//! functions below as `.visible .func` (no `.entry`: the feature drops every
//! [`kernel_entry!`](crate::kernel_entry) kernel, this crate's and a
//! dependent's). A CUDA C++ program compiled with `-rdc=true` (nvcc or NVRTC)
//! links it like any other PTX input: nvJitLink (`NVJITLINK_INPUT_PTX`),
//! `cuLinkAddData(CU_JIT_INPUT_PTX)`, or `ptxas -c` to a relocatable cubin for
//! `nvlink`/`nvcc -dlink`. The host crate builds it as
//! `gpuheap::ptx::DEVICE_LIBRARY_PTX` (`host/build.rs`);
//! `scripts/device-library DIR` writes it with the header.
//! `examples/cuda-cpp/` compiles a CUDA C++ kernel with NVRTC and links it
//! with this library into sm_80 and sm_90 cubins.
//!
//! Without the feature these are plain Rust functions with the C calling
//! convention: no symbol is exported (they are not `#[no_mangle]`), the
//! host's own PTX module does not contain them, and the CPU backend's tests
//! call them like the rest of the crate.
//!
//! # Contract (the header repeats it for C++ readers)
//!
//! * `heap` points to the [`Heap`] handle of a live, initialised device heap
//!   (`gpuheap::device_heap::DeviceHeap::handle`, 152 bytes, `gpuheap_heap`
//!   in C), typically the kernel's own by-value parameter; it is only read.
//! * [`gpuheap_malloc`] and [`gpuheap_handle_alloc`] are warp-collective over
//!   the lanes active at the call ([`crate::heap::malloc`]): lanes that need
//!   nothing pass 0. The others are not collective.
//! * Pointers are 16-byte aligned (large blocks 4 KiB); null means the size
//!   was 0 or the request could not be met (see [`crate::heap`] for the exact
//!   guarantee).
//! * Registers: linked as relocatable code, a kernel that calls these
//!   functions uses at least the allocator's register count per thread;
//!   `include/gpuheap.cuh` states it for sm_80 and sm_90 with the largest
//!   block a calling kernel can be launched with, figures that
//!   `examples/cuda-cpp/link.py` measures on a linked kernel and checks
//!   against the header in `scripts/test`.

use crate::compact::movable;
use crate::heap::{self, Heap};

/// `heap::malloc(heap, size)`: a 16-byte aligned block of `size` bytes, or
/// null when `size` is 0 or the heap cannot provide it.
///
/// # Safety
/// `heap` points to the handle of a live, initialised heap on this device;
/// every lane active at the call calls it (warp-collective, see
/// [`heap::malloc`]).
#[cfg_attr(all(target_arch = "nvptx64", feature = "device-library"), no_mangle)]
pub unsafe extern "C" fn gpuheap_malloc(heap: *const Heap, size: u64) -> *mut u8 {
    // SAFETY: the caller's contract: a valid pointer to a live heap's handle,
    // and a warp-collective call.
    unsafe { heap::malloc(&*heap, size) }
}

/// `heap::free(heap, ptr)`: frees a block from [`gpuheap_malloc`] on the same
/// heap (any thread, any later kernel); null is ignored. Not collective.
///
/// # Safety
/// As for [`gpuheap_malloc`] (but not collective); `ptr` is null or a live
/// block of this heap that nobody uses after the call.
#[cfg_attr(all(target_arch = "nvptx64", feature = "device-library"), no_mangle)]
pub unsafe extern "C" fn gpuheap_free(heap: *const Heap, ptr: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe { heap::free(&*heap, ptr) }
}

/// `movable::handle_alloc(heap, size)`: a movable block of `size` bytes
/// (rounded up to 16) named by the returned handle, or 0 when `size` is 0,
/// the heap has no movable region, or the region or its handle table is
/// exhausted.
///
/// # Safety
/// As for [`gpuheap_malloc`] (warp-collective), and no compaction of the heap
/// runs during the kernel.
#[cfg_attr(all(target_arch = "nvptx64", feature = "device-library"), no_mangle)]
pub unsafe extern "C" fn gpuheap_handle_alloc(heap: *const Heap, size: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { movable::handle_alloc(&*heap, size) }
}

/// `movable::resolve(heap, handle)`: the block's current address (valid for
/// its size rounded up to 16 bytes, until the kernel ends), or null when the
/// handle is not live. Not collective.
///
/// # Safety
/// As for [`gpuheap_handle_alloc`] (but not collective).
#[cfg_attr(all(target_arch = "nvptx64", feature = "device-library"), no_mangle)]
pub unsafe extern "C" fn gpuheap_handle_resolve(heap: *const Heap, handle: u64) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { movable::resolve(&*heap, handle) }
}

/// `movable::handle_free(heap, handle)`: 1 when the block was freed (its bytes
/// are reclaimed by the next compaction), 0, changing nothing, for a handle
/// that is not live (0, stale, freed already) or pinned. Not collective.
/// Returns `i32` rather than `bool`: one C ABI for every compiler.
///
/// # Safety
/// As for [`gpuheap_handle_resolve`]; nobody uses the block after the call.
#[cfg_attr(all(target_arch = "nvptx64", feature = "device-library"), no_mangle)]
pub unsafe extern "C" fn gpuheap_handle_free(heap: *const Heap, handle: u64) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { movable::handle_free(&*heap, handle) as i32 }
}

/// The exported names, in the order of `include/gpuheap.cuh` (the host's
/// device-library test checks that the PTX exports exactly these, as
/// `.visible .func`, and the header declares exactly these).
pub const EXPORTS: &[&str] =
    &["gpuheap_malloc", "gpuheap_free", "gpuheap_handle_alloc", "gpuheap_handle_resolve", "gpuheap_handle_free"];
