//! Runs the growable-arrays user kernel (crate `growable-arrays-kernels`)
//! on a gpuheap backend: the pattern for any crate that ships its own
//! kernels on top of the device heap.

use gpuheap::backend::{Backend, LaunchConfig, Result};
use gpuheap::device_heap::DeviceHeap;
use growable_arrays_kernels::{GrowParams, GROW};

/// The PTX of the kernel crate (empty when the nvptx toolchain is missing).
pub const PTX: &str = include_str!(env!("GROWABLE_ARRAYS_PTX"));

/// What one run produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowRun {
    /// Per-thread checksums (0: that thread's array could not grow).
    pub checksums: Vec<u64>,
    /// Per-thread final capacities (elements).
    pub capacities: Vec<u64>,
}

/// `threads` threads each grow an array to `1 + (i * 7919) % max_pushes`
/// elements on `heap`.
///
/// # Errors
/// [`BackendError::WrongBackend`](gpuheap::backend::BackendError::WrongBackend) when `heap` was
/// not made on `backend` (checked first, as every safe wrapper of a launch must); backend errors.
pub fn run(backend: &Backend, heap: &DeviceHeap, threads: u64, max_pushes: u64) -> Result<GrowRun> {
    backend.check_owner("growable_arrays::run", heap.data())?;
    let module = if backend.is_gpu() { backend.load_module(PTX)? } else { None };
    let checksums = backend.alloc_zeroed(threads as usize * 8)?;
    let capacities = backend.alloc_zeroed(threads as usize * 8)?;
    let p = GrowParams {
        heap: heap.handle(),
        threads,
        max_pushes,
        checksums: checksums.device_ptr(),
        capacities: capacities.device_ptr(),
    };
    // SAFETY: the heap is memory of `backend` (checked) and outlives the launch; both outputs hold
    // `threads` u64s of `backend`.
    unsafe { backend.launch_in(module.as_ref(), &GROW, LaunchConfig::for_threads(threads, 128)?, &p)? };
    Ok(GrowRun { checksums: checksums.read()?, capacities: capacities.read()? })
}
