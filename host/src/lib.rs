//! # gpuheap
//!
//! The host side of gpuheap (see README.md for the overview):
//!
//! * [`backend`]: where kernels run — the GPU (CUDA driver through `cudarc`)
//!   or the CPU emulation of the same kernel code;
//! * [`ptx`]: the embedded PTX of `gpuheap-kernels`;
//! * [`bench`]: benchmark suites (`gpuheap bench alloc`);
//! * [`device_heap`]: the device heap (`malloc`/`free` inside kernels):
//!   creation, statistics, live blocks, reset, and its kernels' wrappers;
//! * [`ops`]: safe host wrappers of the basic kernels (fill/verify, bump);
//! * [`compaction`]: relocatable blocks (handles) and in-place compaction;
//! * [`mod@bench`]: benchmarks behind `gpuheap bench`;
//! * [`mod@reference`]: host reference allocators (first-fit, best-fit, buddy,
//!   TLSF, slab, tiered, PyTorch-style caching);
//! * [`analysis`]: fragmentation metrics;
//! * [`trace`]: allocation trace readers;
//! * [`replay`]: trace replay through the strategies and the compaction kernel, reports and plots.
#![warn(missing_docs)]

pub mod analysis;
pub mod backend;
pub mod bench;
pub mod compaction;
pub mod device_heap;
pub mod ops;
pub mod ptx;
pub mod reference;
pub mod replay;
pub mod trace;

pub use backend::{Backend, BackendChoice, BackendError, DeviceBuffer, LaunchConfig, LaunchTiming};
