//! `gpuheap explain TRACE [--device N] [--capacity C] [--no-tune] [--without SITE]... [--json] [--html FILE]`: the answer
//! page for a snapshot of a run that died with "CUDA out of memory" ([`gpuheap::run_explain`]):
//! what happened at the OOM (capacity or fragmentation, with the numbers that decide it), the largest
//! live tensors with the code that allocated them, where the reserved-but-unallocated bytes sit, and
//! the best allocator setting found by `gpuheap tune`, as the `PYTORCH_CUDA_ALLOC_CONF=...` line to
//! set.
//!
//! Bad input (an unreadable trace, a device the file lacks, sizes that cannot be represented) exits
//! with code 2 and one line on stderr.

use super::args::{CommandOptions, TraceArgs, EXPLAIN};
use super::progress::Progress;
use gpuheap::Error;
use gpuheap::Snapshot;

/// Arguments of `gpuheap explain`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The options of the library's table that `explain` takes.
    #[command(flatten)]
    pub options: CommandOptions<EXPLAIN>,
    /// The trace and the outputs, shared with `gpuheap tune`.
    #[command(flatten)]
    pub common: TraceArgs,
}

/// Runs `gpuheap explain`.
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    a.common.check_outputs()?;
    // Read once, the bytes kept: the stack frames come from them (a pipe cannot be read twice).
    let progress = Progress::new(a.common.json);
    let snap = progress.reading(&a.common.trace, || Snapshot::read(&a.common.trace))?;
    let opts = a.common.options(&a.options.options);
    let out = gpuheap::run_explain(&snap, &opts, &progress)?;
    a.common.write(&out)
}
