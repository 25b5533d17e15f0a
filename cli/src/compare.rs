//! `gpuheap compare TRACE [--capacity BYTES] [--compact P] [--backend B] [--device N]
//! [--device-heap-limit BYTES] [--verbose] [--json] [--plot FILE] [--html FILE]`: every strategy over
//! the same trace, side by side, plus what PyTorch itself reserved according to the snapshot; one table
//! and one plot ([`gpuheap::run_compare`]).
//!
//! The table has one row per contender; under it, one summary line per strategy that compacted (count,
//! bytes planned, kernel measurements full size / scaled / not measured and why). `--verbose` lists every
//! compaction as `gpuheap replay` does; `--json` always has them all.

use std::path::PathBuf;

use super::args::{CommandOptions, ReplayArgs, COMPARE};
use super::progress::Progress;
use gpuheap::trace::read_trace;
use gpuheap::Error;
use gpuheap::Snapshot;

/// Arguments of `gpuheap compare`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Trace file (as for `gpuheap replay`).
    pub trace: PathBuf,
    #[command(flatten)]
    pub options: CommandOptions<COMPARE>,
    #[command(flatten)]
    pub common: ReplayArgs,
}

/// Runs `gpuheap compare`.
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    let plot = a.common.check_outputs(&a.trace)?;
    let progress = Progress::new(a.common.json);
    let snap = Snapshot::from_trace(progress.reading(&a.trace, || read_trace(&a.trace))?);
    let opts = a.common.options(&a.options.options);
    let out = gpuheap::run_compare(&snap, &opts, &progress)?;
    a.common.write(plot, &out)
}
