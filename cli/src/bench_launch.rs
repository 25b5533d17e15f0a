//! `gpuheap bench launch-limit [--json] [--blocks LIST]`: the launch-limit probe
//! ([`crate::bench::launch`]), GPU backend only: on the CPU it exits 2 saying so.

use crate::bench::launch;
use gpuheap::backend::BackendError;

use super::args::BackendArgs;
use gpuheap::Error;

/// Arguments of `gpuheap bench launch-limit`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Threads per block to try, comma-separated (each 1 … 1024).
    #[arg(long, value_delimiter = ',', default_value = "256,768,1024",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub blocks: Vec<u32>,
}

/// Runs the probe and prints its rows.
///
/// # Errors
/// The CPU backend, chosen or the only one (exit code 2: the command cannot be used there, and the
/// message says it needs a GPU); a row where gpuheap's check and the driver disagree (exit code 1,
/// after the table).
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    let backend = a.backend.select()?;
    if !backend.is_gpu() {
        return Err(Error::input(format!(
            "bench launch-limit needs a GPU: it asks the CUDA driver which launches succeed, and the CPU \
             emulator ({}) has no launch limit to probe; run it on a machine with an NVIDIA GPU",
            backend.describe()
        )));
    }
    let rows = launch::run(&backend, &a.blocks).map_err(|e| match e {
        // The probe's refusal of a launch configuration on the GPU: a run-time failure.
        e @ BackendError::InvalidArgument(_) => Error::runtime(e),
        e => e.into(),
    })?;
    if a.json {
        super::stdout::line(serde_json::to_string_pretty(&rows).map_err(|e| Error::internal(e.to_string()))?)?;
    } else {
        super::stdout::line(format_args!("gpuheap bench launch-limit on {}\n", backend.describe()))?;
        super::stdout::text(launch::table(&rows))?;
    }
    if let Some(r) = rows.iter().find(|r| !r.agree) {
        return Err(Error::runtime(format!(
            "{} at {} threads: gpuheap's launch check says {:?}, the driver {:?}",
            r.kernel, r.block, r.checked, r.driver
        )));
    }
    Ok(())
}
