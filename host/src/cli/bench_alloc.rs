//! `gpuheap bench alloc [--quick] [--json]`: runs
//! [`gpuheap::bench::alloc`] and prints its table (or JSON).

use std::path::PathBuf;

use gpuheap::bench::alloc::{self, AllocBenchConfig};

use super::{backend_error, BackendArgs, CliError};

/// Arguments of `gpuheap bench alloc`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Fewer sizes and iterations (fewer than 50: a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Override the iteration count.
    #[arg(long)]
    pub iterations: Option<usize>,
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
/// An option the suite cannot run (exit code 2); backend failures and an unwritable `--out` file
/// (exit code 1).
pub fn run(args: &Args) -> Result<(), CliError> {
    let rt = |e: &dyn std::fmt::Display| CliError::Runtime(e.to_string());
    let backend = args.backend.backend()?;
    let mut cfg = AllocBenchConfig::for_backend(&backend, args.quick);
    if let Some(i) = args.iterations {
        cfg.iterations = i.max(1);
    }
    if let Some(k) = args.threads_log2 {
        cfg.threads = 1 << k;
        cfg.scaling_max_log2 = cfg.scaling_max_log2.min(k);
    }
    eprintln!("gpuheap bench alloc on {}", backend.describe());
    let report = alloc::run(&backend, &cfg, |r| {
        eprintln!("  {} {} {} x{} {}: {:.4} ms", r.workload, r.allocator, r.size, r.threads, r.state, r.alloc_ms)
    })
    .map_err(backend_error)?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| rt(&e))?;
    if let Some(p) = &args.out {
        std::fs::write(p, &json).map_err(|e| CliError::Runtime(format!("{}: {e}", p.display())))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
