//! # gpuheap-cli
//!
//! The `gpuheap` command line over the library crate `gpuheap` (as ripgrep's binary sits over its
//! library crates): the arguments of each command, mapped onto the library's front door
//! ([`gpuheap::run_replay`] and its siblings: `replay`, `compare`, `explain`, `tune`) or onto the kernel and benchmark suites
//! (`info`, `check`, `bench`), and the outputs written. [`main`] is the whole program: the `gpuheap`
//! binary (`cli/src/main.rs`) is one call of it, so any other launcher (the Python package's `gpuheap`
//! command) prints the same `--help` and behaves the same. What only the command line needs lives
//! here, not in the library: the argument parser (clap), the benchmark suites behind `gpuheap bench`
//! ([`mod@bench`]), the `--plot` timelines (`plot`, plotters), the progress bars (indicatif) and the
//! machine report of `gpuheap info` (`machine`, `kernels`; NVML).
//!
//! One file per command (argument mapping only; no command uses another); `args` holds the arguments
//! that several commands share, `output` the checks and atomic writes of output files, `progress`
//! the notes and progress bars on stderr.
//!
//! Exit codes: 0 success; 1 a run-time failure (a kernel, the driver, a failed self-check); 2 bad
//! input or usage (clap's own usage errors are 2 too): [`gpuheap::Error::exit_code`].

mod args;
pub mod bench;
mod bench_alloc;
mod bench_compact;
mod bench_launch;
mod bench_oom;
mod check;
mod compare;
mod explain;
mod info;
mod kernels;
mod machine;
mod output;
mod plot;
mod progress;
mod replay;
mod stdout;
mod trace;
mod tune;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// gpuheap: GPU memory allocation, compaction and fragmentation analysis.
#[derive(Parser)]
#[command(name = "gpuheap", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The memory ceiling of reading a trace (e.g. `8GiB`): an input may be at most a quarter of it, and
    /// what reading makes of the input at most all of it (default: half of the machine's memory).
    #[arg(long, global = true, env = "GPUHEAP_MAX_MEMORY", value_parser = parse_max_memory)]
    max_memory: Option<u64>,
}

/// `--max-memory`: a byte count ([`gpuheap::options::parse_bytes`]) of at least 1 MiB.
fn parse_max_memory(s: &str) -> Result<u64, String> {
    let b = gpuheap::options::parse_bytes(s).map_err(|e| e.to_string())?;
    if b < 1 << 20 {
        return Err(format!("{b} B is below the least ceiling of 1 MiB"));
    }
    Ok(b)
}

/// The commands, in the order people use them (`--help` lists them so): the snapshot's questions first,
/// then the trace tools, then the machine's own checks and benchmarks.
#[derive(Subcommand)]
enum Command {
    /// Explains a PyTorch snapshot's out-of-memory: capacity or fragmentation, the largest live tensors,
    /// where the cached bytes sit, and the allocator setting that would have avoided it.
    Explain(explain::Args),
    /// Replays a trace under a grid of PYTORCH_CUDA_ALLOC_CONF settings and every strategy: the least
    /// GPU memory each needs, ranked; the best setting as an env line.
    Tune(tune::Args),
    /// Replays a trace through every strategy side by side, with PyTorch's own reserved bytes.
    Compare(compare::Args),
    /// Replays an allocation trace through one strategy: fragmentation, failures, compactions.
    Replay(replay::Args),
    /// Makes trace files: `trace repeat` repeats a snapshot's history as a run of N steps.
    #[command(subcommand)]
    Trace(trace::Command),
    /// The GPU's memory as NVML (or the driver) reports it: used / total in % (occupancy) and bytes; the backend.
    Info(info::Args),
    /// Runs the basic kernels (fill/verify, bump allocator) on a backend and checks them.
    Check(check::Args),
    /// Benchmarks, each side by side with its baseline in the same run.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// The device allocator on the survey's workloads, with the bump allocator
    /// (and CUDA's device malloc on a GPU) side by side.
    Alloc(bench_alloc::Args),
    /// Compaction throughput against a plain copy of the same bytes.
    Compact(bench_compact::Args),
    /// Out-of-memory latency: a launch whose every request fails on a dry heap, beside the same
    /// launch succeeding.
    Oom(bench_oom::Args),
    /// Whether `malloc`'s kernel launches at large blocks, and whether gpuheap's launch check
    /// agrees with the driver (GPU only).
    LaunchLimit(bench_launch::Args),
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
    gpuheap::trace::limits::set_max_memory(cli.max_memory);
    let r = match cli.command {
        Command::Info(a) => info::run(a),
        Command::Check(a) => check::run(a),
        Command::Bench(Bench::Alloc(a)) => bench_alloc::run(&a),
        Command::Bench(Bench::Compact(a)) => bench_compact::run(&a),
        Command::Bench(Bench::Oom(a)) => bench_oom::run(&a),
        Command::Bench(Bench::LaunchLimit(a)) => bench_launch::run(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Compare(a) => compare::run(&a),
        Command::Explain(a) => explain::run(&a),
        Command::Tune(a) => tune::run(&a),
        Command::Trace(c) => trace::run(&c),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if stdout::is_broken_pipe(&e) => ExitCode::from(stdout::BROKEN_PIPE_STATUS),
        Err(e) => {
            stdout::err(format_args!("gpuheap: error: {e}\n"));
            ExitCode::from(e.exit_code())
        }
    }
}
