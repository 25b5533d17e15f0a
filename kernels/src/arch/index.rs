//! Thread, block and grid indices (x dimension; gpuheap launches 1-D grids).
//!
//! On the host the values come from the emulator's thread-local context
//! ([`super::emu`]); outside a launch they read as a 1×1 grid.

#[cfg(target_arch = "nvptx64")]
mod imp {
    use core::arch::nvptx;

    #[inline(always)]
    pub fn thread_idx_x() -> u32 {
        // SAFETY: reading a special register has no preconditions.
        unsafe { nvptx::_thread_idx_x() as u32 }
    }
    #[inline(always)]
    pub fn block_idx_x() -> u32 {
        // SAFETY: reading a special register has no preconditions.
        unsafe { nvptx::_block_idx_x() as u32 }
    }
    #[inline(always)]
    pub fn block_dim_x() -> u32 {
        // SAFETY: reading a special register has no preconditions.
        unsafe { nvptx::_block_dim_x() as u32 }
    }
    #[inline(always)]
    pub fn grid_dim_x() -> u32 {
        // SAFETY: reading a special register has no preconditions.
        unsafe { nvptx::_grid_dim_x() as u32 }
    }
    #[inline(always)]
    pub fn lane_id() -> u32 {
        let r: u32;
        // SAFETY: reads the %laneid special register; no memory is touched.
        unsafe { core::arch::asm!("mov.u32 {r}, %laneid;", r = out(reg32) r, options(pure, nomem, nostack)) };
        r
    }
    #[inline(always)]
    pub fn sm_id() -> u32 {
        let r: u32;
        // SAFETY: reads the %smid special register; no memory is touched.
        unsafe { core::arch::asm!("mov.u32 {r}, %smid;", r = out(reg32) r, options(nomem, nostack)) };
        r
    }
}

#[cfg(not(target_arch = "nvptx64"))]
mod imp {
    use super::super::emu;

    #[inline(always)]
    pub fn thread_idx_x() -> u32 {
        emu::ctx(|c| c.thread_idx)
    }
    #[inline(always)]
    pub fn block_idx_x() -> u32 {
        emu::ctx(|c| c.block_idx)
    }
    #[inline(always)]
    pub fn block_dim_x() -> u32 {
        emu::ctx(|c| c.block_dim)
    }
    #[inline(always)]
    pub fn grid_dim_x() -> u32 {
        emu::ctx(|c| c.grid_dim)
    }
    #[inline(always)]
    pub fn lane_id() -> u32 {
        emu::ctx(|c| c.lane_id())
    }
    #[inline(always)]
    pub fn sm_id() -> u32 {
        emu::ctx(|c| c.block_idx)
    }
}

/// Index of this thread in its block, `0..block_dim_x()`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    imp::thread_idx_x()
}
/// Index of this block in the grid, `0..grid_dim_x()`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    imp::block_idx_x()
}
/// Threads per block.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    imp::block_dim_x()
}
/// Blocks in the grid.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    imp::grid_dim_x()
}
/// Lane of this thread in its warp, `0..32`. On the host: `thread_idx_x() % 32`
/// in warp mode, 0 otherwise (one-lane warps).
#[inline(always)]
pub fn lane_id() -> u32 {
    imp::lane_id()
}
/// Streaming multiprocessor this thread runs on (`%smid`); on the host, the
/// block index. Use only as a hint to spread contention, never for correctness.
#[inline(always)]
pub fn sm_id() -> u32 {
    imp::sm_id()
}
/// Global thread index `block_idx_x() * block_dim_x() + thread_idx_x()` (64-bit,
/// so grids past 2^32 threads do not wrap).
#[inline(always)]
pub fn global_thread_id() -> u64 {
    block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64
}
/// [`global_thread_id`] read again from the special registers: the compiler
/// does not merge it with an earlier read, so a caller can recompute the
/// index after a call instead of keeping it (and what it derived from it)
/// live across the call (DESIGN.md §4.1).
#[inline(always)]
pub fn global_thread_id_reread() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let (t, b, d): (u32, u32, u32);
        // SAFETY: reads special registers; no memory is touched. Not `pure`,
        // so that it is not merged with an earlier read.
        unsafe {
            core::arch::asm!(
                "mov.u32 {t}, %tid.x; mov.u32 {b}, %ctaid.x; mov.u32 {d}, %ntid.x;",
                t = out(reg32) t,
                b = out(reg32) b,
                d = out(reg32) d,
                options(nomem, nostack)
            )
        };
        b as u64 * d as u64 + t as u64
    }
    #[cfg(not(target_arch = "nvptx64"))]
    global_thread_id()
}
/// Threads in the whole grid.
#[inline(always)]
pub fn grid_threads() -> u64 {
    grid_dim_x() as u64 * block_dim_x() as u64
}
/// [`global_warp_id`] read again from the special registers (see
/// [`global_thread_id_reread`]).
#[inline(always)]
pub fn global_warp_id_reread() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        global_thread_id_reread() / super::WARP_SIZE as u64
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        global_warp_id()
    }
}
/// Global warp index (`global_thread_id / 32` for full warps; on the host in
/// sequential mode every thread is its own warp).
#[inline(always)]
pub fn global_warp_id() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        global_thread_id() / super::WARP_SIZE as u64
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        super::emu::ctx(|c| c.global_warp_id())
    }
}
