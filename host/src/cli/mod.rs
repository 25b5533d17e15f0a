//! The `gpuheap` command line (subcommands in one file each).

pub mod bench_compact;

use clap::{Parser, Subcommand};

/// gpuheap: GPU memory management tools.
#[derive(Debug, Parser)]
#[command(name = "gpuheap", version)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Benchmarks.
    #[command(subcommand)]
    Bench(Bench),
}

/// `gpuheap bench …`.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Compaction throughput against a plain copy of the same bytes.
    Compact(bench_compact::Args),
}

/// Parses the command line and runs it; the process exit code.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Bench(Bench::Compact(a)) => bench_compact::run(&a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuheap: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
