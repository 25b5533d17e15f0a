//! # gpuheap-kernels
//!
//! The device side of gpuheap: GPU kernels written in plain Rust, compiled from
//! the same source to two targets.
//!
//! * **`nvptx64-nvidia-cuda`** — one PTX module that the host crate (`gpuheap`)
//!   embeds and loads through the CUDA driver. Built by `gpuheap-builder`.
//! * **the host** — the *CPU backend*: the host crate runs the very same kernel
//!   bodies on a thread pool with emulated grid/block/thread indices, so every
//!   kernel is tested without a GPU.
//!
//! ## Layers (one folder or file each, lower layers never use higher ones)
//!
//! | layer | where | what |
//! |---|---|---|
//! | architecture primitives | [`arch`] | indices, scoped atomics, fences, warp vote/shuffle, block barrier, shared memory, back-off; inline PTX on the GPU, `core::sync::atomic` (or loom) plus an emulator on the host |
//! | kernel ABI | [`kernel`] | the [`Kernel`] descriptor and the [`kernel_entry!`] macro that turns a kernel body into a PTX `.entry` |
//! | basic kernels | [`fill`], [`bump`] | fill/verify, the warp-aggregated bump allocator (the allocation baseline) |
//! | device heap | [`heap`] | `malloc`/`free` for kernels: slabs + lock-free buddy (see its docs) |
//! | compaction | [`compact`] | the handle table and the in-place parallel compaction |
//! | C ABI | [`capi`] | `gpuheap_malloc`, `gpuheap_free` and the movable region's handle functions for CUDA C/C++ kernels (`include/gpuheap.cuh`; the relocatable device library with the feature `device-library`) |
//!
//! The crate is `#![no_std]`. On the host it links `std` only for the emulator
//! ([`arch::emu`]): thread-local indices and the CPU warp rendezvous.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch, stdarch_nvptx))]
#![warn(missing_docs)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod arch;
#[cfg(not(any(loom, shuttle)))]
pub mod capi;
// Kernels view device memory through `from_ptr`, which loom and shuttle
// atomics cannot offer; model-checking builds keep the protocol cores only.
#[cfg(not(any(loom, shuttle)))]
pub mod bump;
#[cfg(not(any(loom, shuttle)))]
pub mod compact;
#[cfg(not(any(loom, shuttle)))]
pub mod fill;
pub mod heap;
pub mod kernel;

pub use kernel::Kernel;

/// The PTX entry names of every kernel this crate declares with
/// [`kernel_entry!`], read from the descriptors themselves.
///
/// The host's PTX check (`host/tests/ptx_check.rs`) asserts that the
/// assembled PTX has exactly these entries, each within its resource
/// budget: a kernel added without an entry here, or an entry whose kernel
/// is gone, fails that check.
#[cfg(not(any(loom, shuttle)))]
pub static KERNEL_NAMES: &[&str] = &[
    fill::FILL.name(),
    fill::VERIFY.name(),
    bump::BUMP_ALLOC.name(),
    compact::plan::PLAN.name(),
    compact::mover::MOVE.name(),
    compact::mover::COPY.name(),
    compact::handle::HANDLE_FILL.name(),
    compact::movable::HEAP_HANDLE_ALLOC.name(),
    compact::movable::HEAP_HANDLE_FREE.name(),
    compact::movable::HEAP_HANDLE_TOUCH.name(),
    heap::kernels::HEAP_MALLOC.name(),
    heap::kernels::HEAP_FREE.name(),
    heap::kernels::HEAP_TOUCH.name(),
    heap::kernels::HEAP_CHURN.name(),
    heap::kernels::HEAP_LOOP.name(),
    heap::kernels::HEAP_USER_LIST.name(),
    heap::kernels::NOOP.name(),
    heap::kernels::CUDA_MALLOC.name(),
    heap::kernels::CUDA_FREE.name(),
];

/// Traps the GPU thread (the kernel launch fails with `CUDA_ERROR_LAUNCH_FAILED`
/// or an illegal-instruction error). Kernels must not panic; this handler only
/// exists because `core` requires one.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` has no preconditions; it ends the thread's execution.
    unsafe { core::arch::nvptx::trap() }
}
