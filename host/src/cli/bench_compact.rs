//! `gpuheap bench compact [--quick] [--json] [--backend B] [--reps N]`.

use gpuheap::bench::compact;

use super::{BackendArgs, CliError};

/// Arguments of `gpuheap bench compact`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Smaller layouts (32 MiB instead of 256 MiB) and 3 runs.
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Runs per layout (0: 3 with --quick, else 7); medians are reported.
    #[arg(long, default_value_t = 0)]
    pub reps: usize,
    /// Tile (and copy chunk) size in bytes, a multiple of 16 (default: the
    /// backend's, see `CompactTuning::for_backend`).
    #[arg(long)]
    pub tile_bytes: Option<u32>,
}

/// Runs the benchmark and prints the report.
///
/// # Errors
/// Backend and compaction errors (exit code 1).
pub fn run(a: &Args) -> Result<(), CliError> {
    let backend = a.backend.backend()?;
    let report = compact::run(&backend, a.quick, a.reps, a.tile_bytes).map_err(|e| CliError::Runtime(e.to_string()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        print!("{}", compact::table(&report));
    }
    Ok(())
}
