//! `gpuheap bench compact [--quick] [--json] [--backend B] [--reps N]`.

use gpuheap::backend::{Backend, BackendChoice};
use gpuheap::bench::compact;

/// Arguments of `gpuheap bench compact`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Smaller layouts (32 MiB instead of 256 MiB) and 3 runs.
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Backend: auto, cpu or gpu.
    #[arg(long, env = "GPUHEAP_BACKEND", default_value = "auto")]
    pub backend: BackendChoice,
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
/// Backend and compaction errors, as text.
pub fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let backend = Backend::select(a.backend)?;
    let report = compact::run(&backend, a.quick, a.reps, a.tile_bytes)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", compact::table(&report));
    }
    Ok(())
}
