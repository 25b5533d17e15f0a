//! `gpuheap compare TRACE [--capacity BYTES] [--compact P] [--backend B] [--device N]
//! [--device-heap-limit BYTES] [--verbose] [--json] [--plot FILE] [--html FILE]`: every strategy over
//! the same trace, side by side, plus what PyTorch itself reserved according to the snapshot; one table
//! and one plot ([`gpuheap::app::run_compare`]).
//!
//! The table has one row per contender; under it, one summary line per strategy that compacted (count,
//! bytes planned, kernel measurements full size / scaled / not measured and why). `--verbose` lists every
//! compaction as `gpuheap replay` does; `--json` always has them all.

use std::path::PathBuf;

use super::args::ReplayArgs;
use super::progress::Progress;
use gpuheap::app::{self, parse_bytes, Snapshot};
use gpuheap::trace::read_trace;
use gpuheap::Error;

/// Arguments of `gpuheap compare`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Trace file (as for `gpuheap replay`).
    pub trace: PathBuf,
    #[command(flatten)]
    pub common: ReplayArgs,
    /// Largest device heap the device allocator's row creates before it replays a scaled trace (all
    /// sizes divided by a power of two; the row is then labelled "scaled 1/N"): bytes or with a unit.
    /// Default: 8GiB on the CPU backend, 75 % of free memory on a GPU.
    #[arg(long, value_parser = parse_bytes)]
    pub device_heap_limit: Option<u64>,
    /// List every compaction of every strategy (default: one summary line per strategy).
    #[arg(long)]
    pub verbose: bool,
}

/// Runs `gpuheap compare`.
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    let plot = a.common.check_outputs(&a.trace)?;
    let progress = Progress::new(a.common.json);
    let snap = Snapshot::from_trace(progress.reading(&a.trace, || read_trace(&a.trace))?);
    let mut opts = a.common.options();
    opts.device_heap_limit = a.device_heap_limit;
    opts.verbose = a.verbose;
    let out = app::run_compare(&snap, &opts, &progress)?;
    a.common.write(plot, &out)
}
