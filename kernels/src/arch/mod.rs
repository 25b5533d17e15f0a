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
