//! The CPU backend: kernel bodies run on host threads with emulated indices.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use gpuheap_kernels::arch::emu::{run_block_sequential, run_thread, BlockShared, ThreadCtx, WarpRendezvous};
use gpuheap_kernels::arch::WARP_SIZE;
use gpuheap_kernels::Kernel;
use rayon::prelude::*;

use super::{BackendError, LaunchConfig, LaunchTiming, Result};

/// How the CPU backend runs the threads of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuMode {
    /// Blocks run in parallel on the rayon pool; a block's threads run one
    /// after another; warps have one lane. Kernels that use `sync_threads`
    /// are run in lockstep regardless.
    Sequential,
    /// Every thread of a block is an OS thread; the lanes of each 32-thread
    /// warp meet at each warp intrinsic; `sync_threads` is a barrier. Blocks
    /// run one after another.
    Lockstep,
}

/// The CPU backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    mode: CpuMode,
}

impl CpuBackend {
    /// A CPU backend running blocks in `mode`.
    pub fn new(mode: CpuMode) -> Self {
        Self { mode }
    }

    /// The mode.
    pub fn mode(&self) -> CpuMode {
        self.mode
    }

    pub(super) fn describe(&self) -> String {
        let mode = match self.mode {
            CpuMode::Sequential => "sequential blocks, 1-lane warps",
            CpuMode::Lockstep => "lockstep 32-lane warps",
        };
        format!("CPU backend ({} worker threads, {mode})", rayon::current_num_threads())
    }

    /// Runs `k` over the grid and returns when every thread has finished.
    ///
    /// # Safety
    /// As for [`super::Backend::launch`].
    pub(super) unsafe fn launch<P: Sync>(&self, k: &Kernel<P>, cfg: LaunchConfig, params: &P) -> Result<LaunchTiming> {
        let start = Instant::now();
        let body = k.body();
        let run = |ctx: ThreadCtx| {
            // SAFETY: the caller upholds the kernel's contract for `params`.
            run_thread(ctx, || unsafe { body(params) })
        };
        let lockstep = k.block_sync() || self.mode == CpuMode::Lockstep;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if lockstep {
                for b in 0..cfg.grid {
                    run_block_lockstep(cfg, b, &run);
                }
            } else {
                (0..cfg.grid).into_par_iter().for_each(|b| {
                    let block =
                        (cfg.shared_bytes > 0).then(|| Arc::new(BlockShared::new(None, cfg.shared_bytes as usize)));
                    // SAFETY: the caller upholds the kernel's contract for `params`.
                    run_block_sequential(b, cfg.block, cfg.grid, block, || unsafe { body(params) });
                });
            }
        }));
        outcome.map_err(|e| BackendError::KernelPanic { kernel: k.name(), message: panic_message(e) })?;
        Ok(LaunchTiming { elapsed: start.elapsed() })
    }
}

fn run_block_lockstep(cfg: LaunchConfig, b: u32, run: &(impl Fn(ThreadCtx) + Sync)) {
    let block = Arc::new(BlockShared::new(Some(cfg.block), cfg.shared_bytes as usize));
    let warps: Vec<Arc<WarpRendezvous>> = (0..cfg.block.div_ceil(WARP_SIZE))
        .map(|w| {
            let lanes = (cfg.block - w * WARP_SIZE).min(WARP_SIZE);
            let live = if lanes == 32 { u32::MAX } else { (1u32 << lanes) - 1 };
            Arc::new(WarpRendezvous::new(live))
        })
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.block)
            .map(|t| {
                let ctx = ThreadCtx {
                    thread_idx: t,
                    block_idx: b,
                    block_dim: cfg.block,
                    grid_dim: cfg.grid,
                    warp: Some(warps[(t / WARP_SIZE) as usize].clone()),
                    block: Some(block.clone()),
                };
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, move || run(ctx))
                    .expect("spawning an emulated GPU thread")
            })
            .collect();
        let mut panic = None;
        for h in handles {
            if let Err(e) = h.join() {
                panic.get_or_insert(e);
            }
        }
        if let Some(e) = panic {
            std::panic::resume_unwind(e);
        }
    });
}

fn panic_message(e: Box<dyn Any + Send>) -> String {
    if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
