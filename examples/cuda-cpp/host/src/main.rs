//! `cuda-cpp-grow [CUBIN_DIR]`: runs the CUDA C++ kernel of `examples/cuda-cpp/grow.cu`,
//! linked with gpuheap's device library by `examples/cuda-cpp/link.py` into
//! `CUBIN_DIR/grow_sm<NN>.cubin` (default `examples/cuda-cpp/out`), on the first GPU, and checks
//! every thread's checksum and capacity against the host model of `examples/growable-arrays` (the
//! same kernel in Rust), then that the heap is empty again.
//!
//! The host side a CUDA C++ kernel needs from gpuheap: a `DeviceHeap` on the GPU backend, whose
//! descriptor `DeviceHeap::handle()` (`gpuheap_heap` in `gpuheap.cuh`) goes into the kernel's
//! by-value parameter struct; the cubin is loaded and launched through cudarc, on the backend's
//! context and stream.
//!
//! Exit status: 0 when every check passed, 1 when one failed, 3 when there is no usable GPU or
//! no cubin for it (nothing was checked).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cudarc::driver::{DeviceRepr, PushKernelArg};
use gpuheap::backend::Backend;
use gpuheap::device_heap::DeviceHeap;
use growable_arrays_kernels::{checksum, pushes, GrowParams};

/// `grow.cu`'s `grow_params` by value.
#[repr(transparent)]
struct Arg(GrowParams);

// SAFETY: `GrowParams` is `#[repr(C)]` plain old data without padding (`bytemuck::Pod`) holding
// device addresses as `u64`, the layout of `grow_params` in grow.cu (a `gpuheap_heap` of
// `GPUHEAP_HEAP_WORDS` u64 words, then four 8-byte fields; grow.cu asserts its size).
unsafe impl DeviceRepr for Arg {}

enum Outcome {
    /// Nothing was checked (no GPU, no cubin for it).
    Skip(String),
    /// A check failed, or the launch did.
    Fail(String),
}

fn fail(e: impl std::fmt::Display) -> Outcome {
    Outcome::Fail(e.to_string())
}

const THREADS: u64 = 300;
const MAX_PUSHES: u64 = 3000; // up to 12 KB arrays: slab and buddy sizes
const BLOCK: u32 = 128;

fn run(dir: &Path) -> Result<String, Outcome> {
    let backend = Backend::gpu().map_err(|e| Outcome::Skip(format!("no GPU: {e}")))?;
    let Backend::Gpu(gpu) = &backend else { return Err(Outcome::Skip("no GPU backend".into())) };
    let (major, minor) = gpu.compute_capability().map_err(fail)?;
    let cubin = dir.join(format!("grow_sm{major}{minor}.cubin"));
    let image = std::fs::read(&cubin).map_err(|e| {
        Outcome::Skip(format!(
            "{}: {e} (link.py builds sm_80 and sm_90 cubins; this GPU is sm_{major}{minor})",
            cubin.display()
        ))
    })?;
    let heap = DeviceHeap::new(&backend, 64 << 20).map_err(fail)?;
    let checksums = backend.alloc_zeroed(THREADS as usize * 8).map_err(fail)?;
    let capacities = backend.alloc_zeroed(THREADS as usize * 8).map_err(fail)?;
    let arg = Arg(GrowParams {
        heap: heap.handle(),
        threads: THREADS,
        max_pushes: MAX_PUSHES,
        checksums: checksums.device_ptr(),
        capacities: capacities.device_ptr(),
    });
    let module = gpu.context().load_module(cudarc::nvrtc::Ptx::from_binary(image)).map_err(fail)?;
    let f = module.load_function("gpuheap_example_grow").map_err(fail)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&arg);
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (THREADS.div_ceil(BLOCK as u64) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel takes one `grow_params` by value (`Arg`); the heap and both output
    // buffers (THREADS u64 each) belong to this backend and outlive the synchronised launch.
    unsafe { launch.launch(cfg) }.map_err(fail)?;
    gpu.stream().synchronize().map_err(fail)?;
    let sums: Vec<u64> = checksums.read().map_err(fail)?;
    let caps: Vec<u64> = capacities.read().map_err(fail)?;
    for i in 0..THREADS {
        let n = pushes(i, MAX_PUSHES);
        let (want_sum, want_cap) = (checksum(i, n), n.max(4).next_power_of_two());
        if (sums[i as usize], caps[i as usize]) != (want_sum, want_cap) {
            return Err(Outcome::Fail(format!(
                "thread {i} ({n} values): checksum {:#x}, capacity {} (expected {want_sum:#x}, {want_cap})",
                sums[i as usize], caps[i as usize]
            )));
        }
    }
    let s = heap.stats().map_err(fail)?;
    if (s.bytes_in_use(), s.failed_requests) != (0, 0) {
        return Err(Outcome::Fail(format!("the heap is not empty after the kernel freed every array: {s:?}")));
    }
    Ok(format!(
        "cuda-cpp-grow: {} (sm_{major}{minor}), {}: {THREADS} threads grew, checked and freed their arrays; heap empty",
        gpu.name(),
        cubin.display()
    ))
}

fn main() -> ExitCode {
    let dir = std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("examples/cuda-cpp/out"));
    match run(&dir) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(Outcome::Skip(why)) => {
            eprintln!("cuda-cpp-grow: nothing checked: {why}");
            ExitCode::from(3)
        }
        Err(Outcome::Fail(why)) => {
            eprintln!("cuda-cpp-grow: FAILED: {why}");
            ExitCode::FAILURE
        }
    }
}
