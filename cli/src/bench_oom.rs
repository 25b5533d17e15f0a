//! `gpuheap bench oom [--json] [--backend B] [--sizes LIST] [--threads-log2 LIST] [--reps N]`: the
//! out-of-memory latency probe ([`crate::bench::oom`]).

use crate::bench::oom::{self, OomConfig};

use super::args::BackendArgs;
use gpuheap::Error;

/// Arguments of `gpuheap bench oom`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print the report as JSON (after the table's rows, which stream as they finish, on stderr).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Request sizes in bytes, comma-separated (default 65536,16).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Thread counts of the failing launch as log2, comma-separated (default 12,16,20 on a GPU,
    /// 12,14,16 on the CPU).
    #[arg(long, value_delimiter = ',')]
    pub threads_log2: Vec<u32>,
    /// Timed launches per row, 1 … 10000 (default 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub reps: Option<u32>,
}

/// Runs the probe, printing each row as it finishes.
///
/// # Errors
/// An option the probe cannot run (exit code 2); backend failures (exit code 1).
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    let backend = a.backend.select()?;
    let mut cfg = OomConfig::for_backend(&backend);
    if !a.sizes.is_empty() {
        cfg.sizes = a.sizes.clone();
    }
    if !a.threads_log2.is_empty() {
        cfg.threads_log2 = a.threads_log2.clone();
    }
    if let Some(r) = a.reps {
        cfg.reps = r as usize;
    }
    cfg.validate().map_err(|e| Error::input(e.to_string()))?;
    let head = format!(
        "gpuheap bench oom on {}: a {} B heap run dry, then one launch of failing requests",
        backend.describe(),
        oom::POOL_BYTES
    );
    // Rows go out as they finish, so a run stopped by a time limit keeps them.
    let (json, progress_to_stdout) = (a.json, !a.json);
    // Progress lines: a closed stdout is reported by the final write.
    let say = |line: &str| {
        if progress_to_stdout {
            let _ = super::stdout::line(line);
        } else {
            super::stdout::err(format_args!("{line}\n"))
        }
    };
    say(&head);
    say("");
    say(oom::TABLE_HEADER);
    let report = oom::run(&backend, &cfg, |r| say(&oom::row_line(r)))?;
    if json {
        super::stdout::line(serde_json::to_string_pretty(&report).map_err(|e| Error::internal(e.to_string()))?)?;
    }
    Ok(())
}
