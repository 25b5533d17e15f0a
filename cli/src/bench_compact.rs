//! `gpuheap bench compact [--quick] [--json] [--backend B] [--reps N] [--tile-bytes N] [--layout NAME]... [--trace FILE]...`.

use crate::bench::compact;

use gpuheap::compaction::CompactionError;

use super::args::BackendArgs;
use gpuheap::Error;

/// Arguments of `gpuheap bench compact`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Smaller layouts (32 MiB instead of 256 MiB) and 3 runs.
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Runs per layout, 0 … 10000 (0: 3 with --quick, else 7); medians are reported.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub reps: u32,
    /// Tile (and copy chunk) size in bytes, a multiple of 16 (default: the
    /// backend's, see `CompactTuning::for_backend`).
    #[arg(long)]
    pub tile_bytes: Option<u32>,
    /// Only this synthetic layout (repeatable: uniform, power-law, tiny, huge, hole-at-start); the
    /// default traces are then left out (name them with --trace).
    #[arg(long = "layout")]
    pub layouts: Vec<String>,
    /// PyTorch snapshot whose final segments give one more layout (repeatable). Default (without
    /// --layout): the shipped data/1.3b_snapshot.pickle and
    /// ../shared/traces/memory_ctx512_fullstep_.pickle when present.
    #[arg(long = "trace")]
    pub traces: Vec<std::path::PathBuf>,
}

/// Runs the benchmark and prints the report.
///
/// # Errors
/// A `--tile-bytes` the kernels cannot run with (exit code 2); backend and compaction errors (exit
/// code 1).
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    if let Some(n) = a.layouts.iter().find(|n| !compact::LAYOUT_NAMES.contains(&n.as_str())) {
        return Err(Error::input(format!("--layout {n:?}: expected one of {}", compact::LAYOUT_NAMES.join(", "))));
    }
    let backend = a.backend.select()?;
    let traces = match (a.traces.is_empty(), a.layouts.is_empty()) {
        (true, true) => compact::default_traces(),
        _ => a.traces.clone(),
    };
    let report =
        compact::run(&backend, a.quick, a.reps as usize, a.tile_bytes, &a.layouts, &traces).map_err(|e| match e {
            // A `--tile-bytes` the kernels cannot run with is bad input.
            CompactionError::InvalidTuning(_) => Error::input(format!("--tile-bytes: {e}")),
            CompactionError::Backend(b) => b.into(),
            e => Error::runtime(e),
        })?;
    if a.json {
        super::stdout::line(serde_json::to_string_pretty(&report).map_err(|e| Error::internal(e.to_string()))?)?;
    } else {
        super::stdout::text(compact::table(&report))?;
    }
    Ok(())
}
