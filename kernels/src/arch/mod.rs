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
