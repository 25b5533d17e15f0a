//! Architecture primitives: everything a kernel needs from the machine.
//!
//! Each function has two implementations selected by `target_arch`:
//! inline PTX on `nvptx64` and an emulation on the host ([`emu`]). Kernels use
//! only this module, never `core::arch::nvptx` or `core::sync::atomic`
//! directly, so the same source runs on both backends.
//!
//! * [`index`]: thread, block, grid, lane and warp indices (x dimension).
//! * [`atomic`]: GPU-scoped (`.gpu`) atomics with explicit semantics.
//!   `core::sync::atomic` cannot be used on the GPU: rustc drops the ordering
//!   of read-modify-writes and gives every ordered operation system scope
//!   (rust-lang/rust#136480).
//! * [`warp`]: active mask, ballot, shuffle, match, warp barrier.
//! * [`block`]: block barrier and dynamic shared memory.
//! * [`time`]: `nanosleep` back-off and a cycle counter.
//! * [`mem`]: 16-byte vector loads and stores.

pub mod atomic;
pub mod block;
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
pub mod index;
pub mod mem;
pub mod time;
pub mod warp;

/// Threads per warp on every NVIDIA GPU to date (and in the CPU emulator).
pub const WARP_SIZE: u32 = 32;

/// Returns `x`, through an optimisation barrier: the compiler cannot see
/// that the result equals `x`, so what is derived from it is computed after
/// this point, where it is used, instead of once before a loop and kept in
/// registers across the calls inside it (DESIGN.md §4.1: `ptxas` charges a
/// call every register live across it). One `mov` on the GPU; the identity
/// on the host.
#[inline(always)]
pub fn opaque_u32(x: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let mut x = x;
        // SAFETY: a register move; no memory is touched.
        unsafe { core::arch::asm!("mov.b32 {x}, {x};", x = inout(reg32) x, options(nomem, nostack)) };
        x
    }
    #[cfg(not(target_arch = "nvptx64"))]
    x
}

/// 1, computed as `popc(%lanemask_eq)` so that `ptxas` cannot prove it the
/// same on every lane. `ptxas` warp-aggregates an atomic add whose address
/// and value it can prove warp-uniform (a vote, a leader, a population count
/// and a shuffle of the result around the one atomic): right for code that
/// all lanes execute, pure overhead (registers and instructions) in code
/// that one lane executes, like the device heap's slow paths. Scaling such
/// an add's constant by this value keeps it a single atomic. Two
/// instructions on the GPU; 1 on the host.
#[inline(always)]
pub fn nonuniform_one() -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let m: u32;
        // SAFETY: reads a special register; no memory is touched.
        unsafe { core::arch::asm!("mov.u32 {m}, %lanemask_eq;", m = out(reg32) m, options(pure, nomem, nostack)) };
        m.count_ones()
    }
    #[cfg(not(target_arch = "nvptx64"))]
    1
}

/// [`opaque_u32`] for a `u64`.
#[inline(always)]
pub fn opaque_u64(x: u64) -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let mut x = x;
        // SAFETY: a register move; no memory is touched.
        unsafe { core::arch::asm!("mov.b64 {x}, {x};", x = inout(reg64) x, options(nomem, nostack)) };
        x
    }
    #[cfg(not(target_arch = "nvptx64"))]
    x
}
