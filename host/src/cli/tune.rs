//! `gpuheap tune TRACE [--device N] [--capacity C] [--json]`: which allocator setting would have saved
//! the run, and how much GPU memory the run needs under each. Replays the trace under a grid of
//! `PYTORCH_CUDA_ALLOC_CONF` settings, the caching model with compaction on OOM and every host
//! strategy ([`gpuheap::explain::tune`]), in parallel, with one progress bar on stderr. The page is
//! rendered by the library ([`gpuheap::explain::tune::TunePage::render_text`]).
//!
//! Bad input exits with code 2 and one line on stderr.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use gpuheap::explain::tune::{self, TunePage, TuneReport};
use gpuheap::explain::ExplainError;
use gpuheap::facts::Capacity;
use gpuheap::trace::{read_trace, DeviceTrace, Trace};

use super::CliError;

/// The arguments `gpuheap explain` and `gpuheap tune` share (flattened into each command's own).
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`), or any trace `replay` reads.
    pub trace: PathBuf,
    /// Device to report on (default: the one with a recorded OOM, else the most allocation events).
    #[arg(long)]
    pub device: Option<i64>,
    /// The GPU's memory: bytes or with a unit (80GiB). Default: PyTorch's reserved bytes at a recorded
    /// OOM plus the driver's free bytes then; else PyTorch's peak reserved bytes.
    #[arg(long, value_parser = super::replay::parse_capacity)]
    pub capacity: Option<u64>,
    /// Print a JSON report on stdout instead of the page.
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report: interactive timeline, the tables, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

/// Arguments of `gpuheap tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace, device, capacity and output options shared with `gpuheap explain`.
    #[command(flatten)]
    pub common: TraceArgs,
}

/// Reads a trace; any failure is bad input.
pub(crate) fn load_trace(path: &Path) -> Result<Trace, CliError> {
    read_trace(path).map_err(|e| CliError::Input(e.to_string()))
}

pub(crate) fn explain_error(e: ExplainError) -> CliError {
    if e.is_input() {
        CliError::Input(e.to_string())
    } else {
        CliError::Runtime(e.to_string())
    }
}

/// One progress bar on stderr (hidden under `--json` or when stderr is not a terminal).
fn progress_bar(json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} tune: {pos} replays ({per_sec}) {elapsed}") {
        pb.set_style(style);
    }
    pb
}

/// Runs the search with one progress bar on stderr.
pub(crate) fn search(trace: &Trace, dev: &DeviceTrace, cap: &Capacity, json: bool) -> Result<TuneReport, CliError> {
    let pb = progress_bar(json);
    let r = tune::tune(trace, dev, cap, &|| pb.inc(1)).map_err(explain_error);
    pb.finish_and_clear();
    r
}

pub fn run(a: &Args) -> Result<(), CliError> {
    let c = &a.common;
    c.html.as_deref().map(|p| super::replay::check_output(p, &c.trace)).transpose()?;
    let trace = load_trace(&c.trace)?;
    let pb = progress_bar(c.json);
    let page: Result<TunePage, _> = tune::tune_page(&trace, c.device, c.capacity, &|| pb.inc(1));
    pb.finish_and_clear();
    let page = page.map_err(explain_error)?;
    if let Some(p) = &c.html {
        let title = format!("{} — tune", super::replay::file_name(&c.trace));
        let dev = &trace.devices[page.device.index];
        let html = gpuheap::html::pages::tune_page(&title, &trace, dev, &page.tune, &page.tune.capacity)
            .map_err(super::replay::map_replay_err)?;
        super::html::write(p, &html)?;
    }
    print_page(&page, c.json)
}

/// Prints the page of `explain` or `tune`: its JSON with `--json`, else the text the library renders.
///
/// # Errors
/// [`CliError::Runtime`] when the report cannot be serialised.
pub(crate) fn print_page<T: serde::Serialize + std::fmt::Display>(page: &T, json: bool) -> Result<(), CliError> {
    if json {
        let s = serde_json::to_string_pretty(page).map_err(|e| CliError::Runtime(e.to_string()))?;
        println!("{s}");
    } else {
        print!("{page}");
    }
    Ok(())
}
