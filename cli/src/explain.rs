//! `gpuheap explain TRACE [--device N] [--capacity C] [--no-tune] [--without SITE]... [--json] [--html FILE]`: the answer
//! page for a snapshot of a run that died with "CUDA out of memory" ([`gpuheap::app::run_explain`]):
//! what happened at the OOM (capacity or fragmentation, with the numbers that decide it), the largest
//! live tensors with the code that allocated them, where the reserved-but-unallocated bytes sit, and
//! the best allocator setting found by `gpuheap tune`, as the `PYTORCH_CUDA_ALLOC_CONF=...` line to
//! set.
//!
//! Bad input (an unreadable trace, a device the file lacks, sizes that cannot be represented) exits
//! with code 2 and one line on stderr.

use super::args::TraceArgs;
use super::progress::Progress;
use gpuheap::app::{self, Snapshot};
use gpuheap::Error;

/// Arguments of `gpuheap explain`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The trace, device, capacity and output options shared with `gpuheap tune`.
    #[command(flatten)]
    pub common: TraceArgs,
    /// Skip the settings search (`gpuheap tune`).
    #[arg(long)]
    pub no_tune: bool,
    /// Replay the trace without the allocations whose stack has a frame matching SITE (`FILE:LINE`,
    /// `FILE:LINE FUNCTION` as the breakdown prints it, or a function) and their frees: does the OOM go
    /// away, and how much GPU memory does the run then need? Repeatable (the union).
    #[arg(long, value_name = "SITE")]
    pub without: Vec<String>,
}

/// Runs `gpuheap explain`.
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    a.common.check_outputs()?;
    // Read once, the bytes kept: the stack frames come from them (a pipe cannot be read twice).
    let progress = Progress::new(a.common.json);
    let snap = progress.reading(&a.common.trace, || Snapshot::read(&a.common.trace))?;
    let mut opts = a.common.options();
    opts.tune = !a.no_tune;
    opts.without = a.without.clone();
    let out = app::run_explain(&snap, &opts, &progress)?;
    a.common.write(&out)
}
