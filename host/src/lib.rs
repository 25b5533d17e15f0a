//! # gpuheap
//!
//! The host side of gpuheap (see README.md for the overview), one module per
//! layer:
//!
//! * [`backend`]: where kernels run: the GPU (CUDA driver through `cudarc`)
//!   or the CPU emulation of the same kernel code; device buffers, launches;
//! * [`ptx`]: the embedded PTX of `gpuheap-kernels`;
//! * [`ops`]: safe host wrappers of the basic kernels (fill/verify, bump);
//! * [`device_heap`]: the device allocator (`malloc`/`free` inside kernels):
//!   creation, statistics, live blocks, reset, the movable region of handles;
//! * [`compaction`]: relocatable blocks (handles) and in-place compaction;
//! * [`mod@reference`]: host reference allocators (first-fit, best-fit, buddy,
//!   TLSF, slab, tiered, PyTorch-style caching) and the reference compaction;
//! * [`analysis`]: fragmentation metrics and OOM diagnosis;
//! * [`explain`]: recorded OOMs explained from the trace itself, device and capacity from the
//!   evidence, and the allocator-settings search ([`explain::tune`]);
//! * [`trace`]: allocation trace readers;
//! * [`replay`]: trace replay through the strategies and the compaction
//!   kernel, reports and plots;
//! * [`html`]: self-contained HTML reports (interactive timeline, tables,
//!   parameters) from a small data model of their own;
//! * [`mod@bench`]: the suites behind `gpuheap bench`.
#![warn(missing_docs)]

// The command line's modules (`cli`, the binary's until it moved here) name the library `gpuheap::`.
#[cfg(feature = "cli")]
extern crate self as gpuheap;

pub mod analysis;
pub mod backend;
pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod compaction;
pub mod device_heap;
pub mod explain;
pub mod html;
pub mod ops;
pub mod ptx;
pub mod reference;
pub mod replay;
pub mod trace;

pub use backend::{Backend, BackendChoice, BackendError, DeviceBuffer, LaunchConfig, LaunchTiming};
