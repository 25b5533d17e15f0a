//! The CPU backend: kernel bodies run on host threads with emulated indices.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gpuheap_kernels::arch::emu::{run_block_sequential, run_thread, BlockShared, ItsBlock, ThreadCtx, WarpRendezvous};
use gpuheap_kernels::arch::WARP_SIZE;
use gpuheap_kernels::Kernel;
use rayon::prelude::*;

use super::{BackendError, BackendId, LaunchConfig, LaunchTiming, Result};

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
    /// Independent thread scheduling, adversarially (Volta and later GPUs):
    /// every thread of a block is an OS thread, one runs at a time under a
    /// scheduler seeded by `seed` that preempts at atomics and spins;
    /// `active_mask` returns groups of every shape (a lone lane, partial
    /// groups, the whole warp); a `*.sync` collective meets exactly the
    /// lanes of its mask, and one that names a lane that exited or cannot
    /// arrive fails the launch with a [`BackendError::KernelPanic`] naming
    /// the kernel, the call site, the warp and the lanes. Launch `i` of this
    /// backend runs with seed `seed + i` (blocks one after another), so a
    /// failing test replays from `seed`. See
    /// `gpuheap_kernels::arch::emu::its`.
    Independent {
        /// Seed of the schedule.
        seed: u64,
    },
}

impl CpuMode {
    /// Lanes per emulated warp: 1 in sequential mode, 32 otherwise.
    #[doc(hidden)]
    pub fn warp_lanes(self) -> u32 {
        match self {
            CpuMode::Sequential => 1,
            CpuMode::Lockstep | CpuMode::Independent { .. } => WARP_SIZE,
        }
    }

    /// The mode named by `GPUHEAP_CPU_WARPS` (`sequential`, `lockstep`, or
    /// `independent`; unset: sequential), with the seed of independent mode
    /// from `GPUHEAP_CPU_SEED` (decimal or `0x` hex; default 0).
    ///
    /// # Errors
    /// `InvalidArgument` naming the variable and the value.
    #[doc(hidden)]
    pub fn from_env() -> Result<Self> {
        let seed = match std::env::var("GPUHEAP_CPU_SEED") {
            Err(_) => 0,
            Ok(v) => {
                let t = v.trim();
                let parsed = match t.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => t.parse(),
                };
                parsed.map_err(|_| {
                    BackendError::InvalidArgument(format!("GPUHEAP_CPU_SEED={v:?} is not a 64-bit number"))
                })?
            }
        };
        match std::env::var("GPUHEAP_CPU_WARPS").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("sequential") => Ok(CpuMode::Sequential),
            Ok("lockstep") => Ok(CpuMode::Lockstep),
            Ok("independent") | Ok("its") => Ok(CpuMode::Independent { seed }),
            Ok(v) => Err(BackendError::InvalidArgument(format!(
                "GPUHEAP_CPU_WARPS={v:?} (expected sequential, lockstep or independent)"
            ))),
        }
    }
}

/// The CPU backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    mode: CpuMode,
    /// Launches so far (independent mode derives each launch's seed from it).
    launches: Arc<AtomicU64>,
    /// [`BackendId::HOST`], except in the owner-check tests.
    id: BackendId,
}

impl CpuBackend {
    /// A CPU backend running blocks in `mode`.
    #[doc(hidden)]
    pub fn new(mode: CpuMode) -> Self {
        Self { mode, launches: Arc::new(AtomicU64::new(0)), id: BackendId::HOST }
    }

    /// A CPU backend (host memory, host kernel bodies) that claims the identity
    /// [`BackendId::test`]`(n)`: the tests of the owner checks pair it with buffers of a real CPU
    /// backend, the one mismatch a machine without a GPU can make.
    #[cfg(test)]
    pub(crate) fn with_test_id(mode: CpuMode, n: u32) -> Self {
        Self { id: BackendId::test(n), ..Self::new(mode) }
    }

    /// The mode.
    #[doc(hidden)]
    pub fn mode(&self) -> CpuMode {
        self.mode
    }

    /// The identity of this backend's memory: [`BackendId::HOST`] in every mode (see
    /// [`BackendId`]).
    #[doc(hidden)]
    pub fn id(&self) -> BackendId {
        self.id
    }

    pub(super) fn describe(&self) -> String {
        let mode = match self.mode {
            CpuMode::Sequential => "sequential blocks, 1-lane warps".to_string(),
            CpuMode::Lockstep => "lockstep 32-lane warps".to_string(),
            CpuMode::Independent { seed } => format!("independent-thread-scheduling 32-lane warps, seed {seed:#x}"),
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
        let launch = self.launches.fetch_add(1, Ordering::Relaxed);
        if let CpuMode::Independent { seed } = self.mode {
            let seed = seed.wrapping_add(launch);
            for b in 0..cfg.grid {
                let its = Arc::new(ItsBlock::new(b, cfg.block, seed));
                let outcome = catch_unwind(AssertUnwindSafe(|| run_block_its(cfg, b, &its, &run)));
                if let Some(message) = its.error() {
                    return Err(BackendError::KernelPanic {
                        kernel: k.name(),
                        message: format!("{message}; launch {launch} of this backend (replay: CpuMode::Independent {{ seed: {:#x} }}, or GPUHEAP_CPU_WARPS=independent GPUHEAP_CPU_SEED={:#x})", seed.wrapping_sub(launch), seed.wrapping_sub(launch)),
                    });
                }
                outcome.map_err(|e| BackendError::KernelPanic { kernel: k.name(), message: panic_message(e) })?;
            }
            return Ok(LaunchTiming { elapsed: start.elapsed() });
        }
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
                    its: None,
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

/// Runs block `b` in independent-thread-scheduling mode: an OS thread per
/// GPU thread, one running at a time under `its`.
fn run_block_its(cfg: LaunchConfig, b: u32, its: &Arc<ItsBlock>, run: &(impl Fn(ThreadCtx) + Sync)) {
    let block = Arc::new(BlockShared::new(None, cfg.shared_bytes as usize));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.block)
            .map(|t| {
                let ctx = ThreadCtx {
                    thread_idx: t,
                    block_idx: b,
                    block_dim: cfg.block,
                    grid_dim: cfg.grid,
                    warp: None,
                    block: Some(block.clone()),
                    its: Some(its.clone()),
                };
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, move || run(ctx))
                    .expect("spawning an emulated GPU thread")
            })
            .collect();
        its.start(handles.iter().map(|h| h.thread().clone()).collect());
        let mut panic = None;
        for h in handles {
            if let Err(e) = h.join() {
                panic.get_or_insert(e);
            }
        }
        its.finish();
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
