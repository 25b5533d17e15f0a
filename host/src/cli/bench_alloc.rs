//! `gpuheap bench alloc [--quick] [--json]`: runs
//! [`gpuheap::bench::alloc`] and prints its table (or JSON).
//!
//! Written to be merged into the CLI tree under `host/src/cli/`: an
//! [`Args`] struct and a [`run`] function, nothing else.

use std::path::PathBuf;

use gpuheap::backend::{Backend, BackendChoice};
use gpuheap::bench::alloc::{self, AllocBenchConfig};

/// Arguments of `gpuheap bench alloc`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Fewer sizes and iterations (fewer than 50: a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Backend: auto, cpu or gpu.
    #[arg(long, env = "GPUHEAP_BACKEND", default_value = "auto")]
    pub backend: BackendChoice,
    /// Override the iteration count.
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Override N (threads) as log2.
    #[arg(long)]
    pub threads_log2: Option<u32>,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the suite.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let backend = Backend::select(args.backend)?;
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
    })?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &args.out {
        std::fs::write(p, &json)?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
