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
//! * [`facts`]: what a trace records, for every caller: the devices and the one reported, peaks and
//!   PyTorch's reserved bytes, the GPU's memory from the evidence, the allocator state at a moment;
//! * [`explain`]: recorded OOMs explained from the trace itself, and the allocator-settings search
//!   ([`explain::tune`]);
//! * [`trace`]: allocation trace readers;
//! * [`replay`]: trace replay through the strategies and the compaction
//!   kernel, reports and plots;
//! * [`html`]: self-contained HTML reports (interactive timeline, tables,
//!   parameters) from a small data model of their own;
//! * [`mod@bench`]: the suites behind `gpuheap bench`;
//! * [`units`]: byte counts, durations, percentages and rates as people read and write them.
#![warn(missing_docs)]

pub mod analysis;
pub mod backend;
pub mod bench;
pub mod compaction;
pub mod device_heap;
pub mod explain;
pub mod facts;
pub mod html;
pub mod ops;
pub mod ptx;
pub mod reference;
pub mod replay;
pub mod trace;
pub mod units;

pub use backend::{Backend, BackendChoice, BackendError, DeviceBuffer, LaunchConfig, LaunchTiming};
