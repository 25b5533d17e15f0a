//! `gpuheap tune TRACE [--device N] [--capacity C] [--json] [--html FILE]`: which allocator setting
//! would have saved the run, and how much GPU memory the run needs under each
//! ([`gpuheap::run_tune`]). Replays the trace under a grid of `PYTORCH_CUDA_ALLOC_CONF` settings, the
//! caching model with compaction on OOM and every host strategy ([`gpuheap::explain::tune`]), in
//! parallel, with one progress spinner on stderr.
//!
//! Bad input exits with code 2 and one line on stderr.

use super::args::{CommandOptions, TraceArgs, TUNE};
use super::progress::Progress;
use gpuheap::trace::read_trace;
use gpuheap::Error;
use gpuheap::Snapshot;

/// Arguments of `gpuheap tune`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The options of the library's table that `tune` takes.
    #[command(flatten)]
    pub options: CommandOptions<TUNE>,
    /// The trace and the outputs, shared with `gpuheap explain`.
    #[command(flatten)]
    pub common: TraceArgs,
}

/// Runs `gpuheap tune`.
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    a.common.check_outputs()?;
    let progress = Progress::new(a.common.json);
    let snap = Snapshot::from_trace(progress.reading(&a.common.trace, || read_trace(&a.common.trace))?);
    let out = gpuheap::run_tune(&snap, &a.common.options(&a.options.options), &progress)?;
    a.common.write(&out)
}
