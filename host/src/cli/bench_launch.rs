//! `gpuheap bench launch-limit [--json] [--blocks LIST]`: the launch-limit probe
//! ([`gpuheap::bench::launch`]), GPU backend only.

use gpuheap::bench::launch;

use super::{backend_error, BackendArgs, CliError};

/// Arguments of `gpuheap bench launch-limit`.
#[derive(Debug, clap::Args)]
pub struct Args {
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
pub fn run(a: &Args) -> Result<(), CliError> {
    let backend = a.backend.backend()?;
    let rows = launch::run(&backend, &a.blocks).map_err(|e| match e {
        gpuheap::BackendError::InvalidArgument(m) => CliError::Runtime(m),
        e => backend_error(e),
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        println!("gpuheap bench launch-limit on {}\n", backend.describe());
        print!("{}", launch::table(&rows));
    }
    if let Some(r) = rows.iter().find(|r| !r.agree) {
        return Err(CliError::Runtime(format!(
            "{} at {} threads: gpuheap's launch check says {:?}, the driver {:?}",
            r.kernel, r.block, r.checked, r.driver
        )));
    }
    Ok(())
}
