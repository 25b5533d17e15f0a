//! The `gpuheap` command line (minimal until the CLI tree in `host/src/cli/`
//! lands; only `gpuheap bench alloc` for now).

use clap::{Parser, Subcommand};

#[path = "cli/bench_alloc.rs"]
mod bench_alloc;

#[derive(Parser, Debug)]
#[command(name = "gpuheap", about = "GPU memory management: device allocator, benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        suite: BenchSuite,
    },
}

#[derive(Subcommand, Debug)]
enum BenchSuite {
    /// The device allocator against the survey's workloads, with baselines.
    Alloc(bench_alloc::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Bench { suite: BenchSuite::Alloc(a) } => bench_alloc::run(a),
    };
    if let Err(e) = result {
        eprintln!("gpuheap: {e}");
        std::process::exit(1);
    }
}
