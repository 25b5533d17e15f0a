//! `gpuheap bench launch-limit [--json] [--blocks LIST]`: the launch-limit probe
//! ([`crate::bench::launch`]), GPU backend only.

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
/// No GPU (exit code 1); a row where gpuheap's check and the driver disagree (exit code 1, after
/// the table).
pub(crate) fn run(a: &Args) -> Result<(), Error> {
    let backend = a.backend.select()?;
    let rows = launch::run(&backend, &a.blocks).map_err(|e| match e {
        // Here the probe's own refusal (no GPU), not an option: a run-time failure.
        e @ BackendError::InvalidArgument(_) => Error::runtime(e),
        e => e.into(),
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| Error::internal(e.to_string()))?);
    } else {
        println!("gpuheap bench launch-limit on {}\n", backend.describe());
        print!("{}", launch::table(&rows));
    }
    if let Some(r) = rows.iter().find(|r| !r.agree) {
        return Err(Error::runtime(format!(
            "{} at {} threads: gpuheap's launch check says {:?}, the driver {:?}",
            r.kernel, r.block, r.checked, r.driver
        )));
    }
    Ok(())
}
