//! `gpuheap explain TRACE [--device N] [--capacity C] [--no-tune] [--json]`: the answer page for a
//! snapshot of a run that died with "CUDA out of memory": what happened at the OOM (capacity or
//! fragmentation, with the numbers that decide it), the largest live tensors with the code that
//! allocated them, where the reserved-but-unallocated bytes sit, and the best allocator setting found
//! by `gpuheap tune`, as the `PYTORCH_CUDA_ALLOC_CONF=...` line to set. The page is rendered by the
//! library ([`gpuheap::explain::Explanation::render_text`]).
//!
//! Bad input (an unreadable trace, a device the file lacks, sizes that cannot be represented) exits
//! with code 2 and one line on stderr.

use gpuheap::explain;
/// The device lines, rendered by the library (`gpuheap replay` prints them too).
pub(crate) use gpuheap::explain::devices_text;

use gpuheap::trace::read_trace_and_bytes;

use super::tune::{self as cli_tune, TraceArgs};
use super::CliError;

/// Arguments of `gpuheap explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace, device, capacity and output options shared with `gpuheap tune`.
    #[command(flatten)]
    pub common: TraceArgs,
    /// Skip the settings search (`gpuheap tune`).
    #[arg(long)]
    pub no_tune: bool,
}

pub fn run(a: &Args) -> Result<(), CliError> {
    let c = &a.common;
    c.html.as_deref().map(|p| super::replay::check_output(p, &c.trace)).transpose()?;
    // Read once: the stack frames come from the same bytes (a pipe cannot be read twice).
    let (trace, bytes) = read_trace_and_bytes(&c.trace).map_err(|e| CliError::Input(e.to_string()))?;
    let mut page =
        explain::explain_with_bytes(&trace, Some(&bytes), c.device, c.capacity).map_err(cli_tune::explain_error)?;
    drop(bytes);
    if !a.no_tune {
        let dev = &trace.devices[page.device.index];
        page.tune = Some(cli_tune::search(&trace, dev, &page.capacity, c.json)?);
    }
    if let Some(p) = &c.html {
        let title = format!("{} — explain", super::replay::file_name(&c.trace));
        let html = gpuheap::html::pages::explain_page(&title, &trace, &page).map_err(super::replay::map_replay_err)?;
        super::html::write(p, &html)?;
    }
    cli_tune::print_page(&page, c.json)
}
