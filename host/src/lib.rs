//! # gpuheap
//!
//! The host side of gpuheap (see README.md for the overview).
//!
//! **The front door** is four functions, [`run_replay`], [`run_compare`], [`run_explain`] and
//! [`run_tune`]: the commands of the same names over a read [`Snapshot`] and one [`Options`], each
//! returning the JSON, text and HTML the command line prints ([`Output`]), reporting progress to an
//! [`Observer`]; errors are [`Error`], of an [`ErrorKind`]. The command line (the crate `gpuheap-cli`)
//! and the Python package only map their arguments onto them.
//!
//! ```no_run
//! use gpuheap::{run_explain, Options, Quiet, Snapshot};
//!
//! let snap = Snapshot::read("oom_snapshot.pickle")?;
//! let out = run_explain(&snap, &Options::default(), &Quiet)?;
//! print!("{}", out.text);
//! # Ok::<(), gpuheap::Error>(())
//! ```
//!
//! Below it, one module per layer, each using only those listed after it:
//!
//! * [`explain`]: recorded OOMs explained from the trace itself, and the allocator-settings search
//!   ([`explain::tune`]);
//! * [`replay`]: trace replay through the strategies and the compaction kernel, and its reports;
//! * [`facts`]: what a trace records, for every caller: the devices and the one reported, the GPU's
//!   memory from the evidence, the allocator state at a moment;
//! * [`analysis`]: fragmentation metrics and OOM diagnosis;
//! * [`mod@reference`]: host reference allocators (first-fit, best-fit, buddy, TLSF, slab, tiered,
//!   PyTorch-style caching, [`reference::caching`]) behind one trait, [`reference::SubAllocator`];
//! * [`trace`]: allocation trace readers ([`trace::read_trace`]);
//! * [`compaction`]: relocatable blocks (handles) and in-place compaction; [`device_heap`]: the device
//!   allocator (`malloc`/`free` inside kernels): creation, statistics, the movable region of handles;
//! * [`backend`]: where kernels run: the GPU (CUDA driver through `cudarc`) or the CPU emulation of the
//!   same kernel code; device buffers, launches; [`ptx`]: the embedded PTX and CUDA C++ header of
//!   `gpuheap-kernels`;
//! * [`units`]: byte counts as people read and write them.
//!
//! ## What is public
//!
//! The items these pages show are the API, listed one per line in `host/public-api.txt` (checked in
//! CI by `scripts/public-api --check`, so every change to the surface is a reviewed diff). Items
//! marked `#[doc(hidden)]` (the `app` option parsers, the HTML page model, the host-side kernel
//! wrappers, the model's seeding and test oracles) serve the crate's own command line
//! (`gpuheap-cli`), Python package, tests and benches, which are released with it; they are not part
//! of the API and may change in any release.
#![warn(missing_docs)]

pub mod analysis;
mod app;
pub mod backend;
pub mod compaction;
pub mod device_heap;
mod error;
pub mod explain;
pub mod facts;
#[doc(hidden)]
pub mod html;
#[doc(hidden)]
pub mod ops;
pub mod ptx;
pub mod reference;
pub mod replay;
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod units;

/// The command line's option parsers and checks (`--capacity`, `--align`, `--tiers`, …): shared by
/// `gpuheap-cli` and the Python package so both read options alike; not part of the API.
#[doc(hidden)]
pub use app::options;
pub use app::{run_compare, run_explain, run_replay, run_tune, Observer, Options, Output, Quiet, Snapshot};
pub use error::{Error, ErrorKind};
