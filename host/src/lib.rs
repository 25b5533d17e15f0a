//! # gpuheap
//!
//! The host side of gpuheap (see README.md for the overview).
//!
//! **The front door** is [`app`]: the commands `replay`, `compare`, `explain` and `tune` as functions
//! over a read trace and one [`app::Options`], each returning the JSON, text and HTML the command line
//! prints; errors are [`Error`], of an [`ErrorKind`]. The command line (the crate `gpuheap-cli`) and the
//! Python package only map their arguments onto it.
//!
//! Below it, one module per layer, each using only those listed after it:
//!
//! * [`explain`]: recorded OOMs explained from the trace itself, and the allocator-settings search
//!   ([`explain::tune`]); [`html`]: self-contained HTML reports (interactive timeline, tables,
//!   parameters) from a small data model of their own;
//! * [`replay`]: trace replay through the strategies and the compaction
//!   kernel, reports, their text pages and plots;
//! * [`facts`]: what a trace records, for every caller: the devices and the one reported, peaks and
//!   PyTorch's reserved bytes, the GPU's memory from the evidence, the allocator state at a moment;
//! * [`analysis`]: fragmentation metrics and OOM diagnosis;
//! * [`mod@reference`]: host reference allocators (first-fit, best-fit, buddy,
//!   TLSF, slab, tiered, PyTorch-style caching) and the reference compaction;
//! * [`trace`]: allocation trace readers, one row of [`trace::FORMATS`] per format;
//! * [`compaction`]: relocatable blocks (handles) and in-place compaction;
//!   [`device_heap`]: the device allocator (`malloc`/`free` inside kernels): creation, statistics, live
//!   blocks, reset, the movable region of handles; [`ops`]: safe host wrappers of the basic kernels
//!   (fill/verify, bump);
//! * [`backend`]: where kernels run: the GPU (CUDA driver through `cudarc`)
//!   or the CPU emulation of the same kernel code; device buffers, launches; [`ptx`]: the embedded PTX of
//!   `gpuheap-kernels`;
//! * [`units`]: byte counts, durations, percentages and rates as people read and write them.
#![warn(missing_docs)]

pub mod analysis;
pub mod app;
pub mod backend;
mod cancel;
pub mod compaction;
pub mod device_heap;
mod error;
pub mod explain;
pub mod facts;
pub mod html;
pub mod ops;
pub mod ptx;
pub mod reference;
pub mod replay;
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod units;

pub use app::{run_compare, run_explain, run_replay, run_tune, Options, Output, Snapshot};
pub use error::{Error, ErrorKind};
