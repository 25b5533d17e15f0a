//! `gpuheap replay TRACE [--strategy S] [--capacity BYTES] [--align BYTES] [--tiers SMALL_MAX,LARGE_MIN]
//! [--compact never|on-oom|threshold=F] [--backend cpu|gpu] [--device N] [--materialize-limit BYTES]
//! [--json] [--plot FILE] [--html FILE]`: [`gpuheap::run_replay`].
//!
//! Without `--strategy` the strategy is the format's own ([`gpuheap::replay::default_strategy`]: the
//! PyTorch caching model for PyTorch snapshots, best-fit otherwise); the output says so. Bad input (an
//! unreadable or inconsistent trace, a bad option) exits with code 2 and one line on stderr; nothing is
//! written.

use std::path::PathBuf;

use super::args::{CommandOptions, ReplayArgs, REPLAY};
use super::progress::Progress;
use gpuheap::trace::read_trace;
use gpuheap::Error;
use gpuheap::Snapshot;

/// Arguments of `gpuheap replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Trace file: PyTorch memory snapshot pickle, minimalloc CSV (id,lower,upper,size) or RMM log CSV.
    pub trace: PathBuf,
    #[command(flatten)]
    pub options: CommandOptions<REPLAY>,
    #[command(flatten)]
    pub common: ReplayArgs,
}

/// Runs `gpuheap replay`.
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    let plot = a.common.check_outputs(&a.trace)?;
    let progress = Progress::new(a.common.json);
    let snap = Snapshot::from_trace(progress.reading(&a.trace, || read_trace(&a.trace))?);
    let opts = a.common.options(&a.options.options);
    let out = gpuheap::run_replay(&snap, &opts, &progress)?;
    a.common.write(plot, &out)
}
