//! `gpuheap bench alloc [--quick] [--json]`: runs
//! [`crate::bench::alloc`] and prints its table (or JSON).

use std::path::PathBuf;

use crate::bench::alloc::{self, AllocBenchConfig};

use super::args::BackendArgs;
use super::output;
use gpuheap::Error;

/// Arguments of `gpuheap bench alloc`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// Fewer sizes and iterations (fewer than 50: a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Override the iteration count, 1 … 100000 (a real run takes 50).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub iterations: Option<u32>,
    /// Override N (threads) as log2, 0 … 32.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=32))]
    pub threads_log2: Option<u32>,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the suite.
///
/// # Errors
/// An option the suite cannot run or an `--out` path that cannot take a file (exit code 2, before the
/// run); backend failures and a write of `--out` that fails after the run (exit code 1, the report
/// printed first).
pub(crate) fn run(args: &Args) -> Result<(), Error> {
    // An `--out` that cannot be written is refused before the run, not after it (the report was lost).
    args.out.as_deref().map(output::check_output_path).transpose()?;
    let backend = args.backend.select()?;
    let mut cfg = AllocBenchConfig::for_backend(&backend, args.quick);
    if let Some(i) = args.iterations {
        cfg.iterations = i as usize;
    }
    if let Some(k) = args.threads_log2 {
        cfg.threads = 1 << k;
        cfg.scaling_max_log2 = cfg.scaling_max_log2.min(k);
    }
    super::stdout::err(format_args!("gpuheap bench alloc on {}\n", backend.describe()));
    let report = alloc::run(&backend, &cfg, |r| {
        super::stdout::err(format_args!(
            "  {} {} {} x{} {}: {:.4} ms\n",
            r.workload, r.allocator, r.size, r.threads, r.state, r.alloc_ms
        ))
    })
    .map_err(Error::from)?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| Error::internal(e.to_string()))?;
    // The report is printed before the file is written, so that a write that fails anyway loses nothing.
    if args.json {
        super::stdout::line(&json)?;
    } else {
        super::stdout::text(report.table())?;
    }
    if let Some(p) = &args.out {
        output::write_file(p, json.as_bytes())?;
    }
    Ok(())
}
