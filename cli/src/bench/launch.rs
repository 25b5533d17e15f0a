//! `gpuheap bench launch-limit`: does a kernel that calls `malloc` launch with large blocks, and
//! does gpuheap's own launch check ([`KernelInfo::check`]) say what the driver says?
//!
//! For each block size (default 256, 768 and 1024 threads) `gpuheap_heap_malloc` is launched with
//! an empty request (no thread takes part, so only the launch itself is tested) twice: through the
//! backend's checked launch, and once more without the check, so that the driver alone decides
//! (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` or not). Each row gives both verdicts and the limits: the
//! driver's `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK` and the occupancy arithmetic's figure for
//! the registers the driver's JIT allocated ([`Arch::max_block_threads`]). GPU backend only.

use serde::Serialize;

use gpuheap::backend::{Arch, Backend, BackendError, KernelInfo, LaunchConfig, Result};
use gpuheap::device_heap::DeviceHeap;
use gpuheap_kernels::heap::kernels::{MallocParams, HEAP_MALLOC};

/// One launch geometry.
#[derive(Clone, Debug, Serialize)]
pub struct LaunchRow {
    /// Kernel name.
    pub kernel: String,
    /// Threads per block asked for.
    pub block: u32,
    /// Registers per thread after the driver's JIT.
    pub registers: u32,
    /// The driver's largest block for the kernel.
    pub driver_limit: u32,
    /// The occupancy arithmetic's largest block for those registers.
    pub computed_limit: u32,
    /// gpuheap's checked launch: `ok`, or the error.
    pub checked: String,
    /// The driver's verdict on the same launch without gpuheap's check: `ok`, or the error.
    pub driver: String,
    /// Both verdicts agree (both launched, or both refused).
    pub agree: bool,
}

/// The probe on `backend` (the GPU backend) at each of `blocks` threads per block.
///
/// # Errors
/// `InvalidArgument` on the CPU backend (there is no driver to ask); errors that are not a launch
/// verdict (the heap's allocation, a missing module).
pub fn run(backend: &Backend, blocks: &[u32]) -> Result<Vec<LaunchRow>> {
    let Backend::Gpu(g) = backend else {
        return Err(BackendError::InvalidArgument(
            "the launch-limit probe asks the driver: GPU backend only (--backend gpu)".into(),
        ));
    };
    let info: KernelInfo = g.builtin()?.kernel(HEAP_MALLOC.name())?.clone();
    let arch: Arch = g.arch()?;
    let heap = DeviceHeap::new(backend, 1 << 20)?;
    let p = MallocParams { heap: heap.handle(), sizes: 0, size: 16, threads: 0, out: 0, warp_mode: 0 };
    let verdict = |r: Result<gpuheap::backend::LaunchTiming>| match r {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    let mut rows = Vec::new();
    for &block in blocks {
        let cfg = LaunchConfig { grid: 1, block, shared_bytes: 0 };
        // SAFETY: no thread takes part (`threads` is 0), so no address in `p` is used.
        let checked = unsafe { backend.launch(&HEAP_MALLOC, cfg, &p) };
        let refused_by_check = matches!(checked, Err(BackendError::LaunchLimit { .. }));
        // SAFETY: as above.
        let driver = unsafe { g.launch_unchecked(&HEAP_MALLOC, cfg, &p) };
        let agree = checked.is_ok() == driver.is_ok() && (driver.is_ok() || refused_by_check);
        rows.push(LaunchRow {
            kernel: info.name.clone(),
            block,
            registers: info.registers,
            driver_limit: info.max_threads_per_block,
            computed_limit: arch.max_block_threads(info.registers),
            checked: verdict(checked),
            driver: verdict(driver),
            agree,
        });
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn table(rows: &[LaunchRow]) -> String {
    let mut s = "| kernel | block | registers | driver limit | computed limit | gpuheap check | driver | agree |\n\
                 |---|---:|---:|---:|---:|---|---|---|\n"
        .to_string();
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.kernel,
            r.block,
            r.registers,
            r.driver_limit,
            r.computed_limit,
            r.checked,
            r.driver,
            if r.agree { "yes" } else { "**no**" }
        );
    }
    s
}
