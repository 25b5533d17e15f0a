//! Command-line interface: one module per subcommand.
//!
//! Exit codes: 0 success; 1 a run-time failure (a kernel, the driver, a
//! failed self-check); 2 bad input or usage (clap's own usage errors are 2 too).

mod bench_alloc;
mod bench_compact;
mod check;
mod compare;
mod explain;
mod html;
mod info;
mod replay;
mod tune;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpuheap::backend::{Backend, BackendChoice};

/// gpuheap: GPU memory allocation, compaction and fragmentation analysis.
#[derive(Parser)]
#[command(name = "gpuheap", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The GPU's memory as NVML (or the driver) reports it: used / total in % (occupancy) and bytes; the backend.
    Info(info::Args),
    /// Runs the basic kernels (fill/verify, bump allocator) on a backend and checks them.
    Check(check::Args),
    /// Benchmarks, each side by side with its baseline in the same run.
    #[command(subcommand)]
    Bench(Bench),
    /// Replays an allocation trace through one strategy: fragmentation, failures, compactions.
    Replay(replay::Args),
    /// Replays a trace through every strategy side by side, with PyTorch's own reserved bytes.
    Compare(compare::Args),
    /// Explains a PyTorch snapshot's out-of-memory: capacity or fragmentation, the largest live tensors,
    /// where the cached bytes sit, and the allocator setting that would have avoided it.
    Explain(explain::Args),
    /// Replays a trace under a grid of PYTORCH_CUDA_ALLOC_CONF settings and every strategy: the least
    /// GPU memory each needs, ranked; the best setting as an env line.
    Tune(tune::Args),
}

#[derive(Subcommand)]
enum Bench {
    /// The device allocator on the survey's workloads, with the bump allocator
    /// (and CUDA's device malloc on a GPU) side by side.
    Alloc(bench_alloc::Args),
    /// Compaction throughput against a plain copy of the same bytes.
    Compact(bench_compact::Args),
}

/// Options shared by every command that runs kernels.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct BackendArgs {
    /// Where kernels run: auto (the GPU when usable), cpu or gpu.
    #[arg(long, value_enum, env = "GPUHEAP_BACKEND", default_value = "auto")]
    pub backend: BackendChoice,
}

impl BackendArgs {
    /// The selected backend (an error for `gpu` without a usable GPU).
    pub fn backend(&self) -> Result<Backend, CliError> {
        Backend::select(self.backend).map_err(|e| CliError::Runtime(e.to_string()))
    }
}

/// A backend error as a command's failure: an invalid argument (a size, count or tuning that the
/// options gave) is bad input (exit 2), anything else a run-time failure (exit 1).
pub fn backend_error(e: gpuheap::BackendError) -> CliError {
    match e {
        gpuheap::BackendError::InvalidArgument(_) => CliError::Input(e.to_string()),
        e => CliError::Runtime(e.to_string()),
    }
}

/// A command's failure, mapped to the exit code.
#[derive(Debug)]
pub enum CliError {
    /// Bad input: exit code 2.
    Input(String),
    /// Run-time failure: exit code 1.
    Runtime(String),
}

/// Runs the command line `args` (the program name first, as [`std::env::args_os`] gives them): parses
/// them, runs the command, and writes its output on stdout and any error as one line on stderr.
/// Returns the exit code (see the [module docs](self)).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            // Usage errors on stderr (exit 2), `--help` and `--version` on stdout (exit 0), as clap's
            // own `parse` does.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let r = match cli.command {
        Command::Info(a) => info::run(a),
        Command::Check(a) => check::run(a),
        Command::Bench(Bench::Alloc(a)) => bench_alloc::run(&a),
        Command::Bench(Bench::Compact(a)) => bench_compact::run(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Compare(a) => compare::run(&a),
        Command::Explain(a) => explain::run(&a),
        Command::Tune(a) => tune::run(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Input(m)) => {
            eprintln!("gpuheap: error: {m}");
            ExitCode::from(2)
        }
        Err(CliError::Runtime(m)) => {
            eprintln!("gpuheap: error: {m}");
            ExitCode::from(1)
        }
    }
}
