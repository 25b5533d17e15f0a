//! `gpuheap info [--backend auto|cpu|gpu] [--device N]`: the embedded PTX, the backend kernels run on,
//! and the GPU's memory ([`crate::machine::write_info`]).

use super::args::BackendArgs;
use crate::machine::write_info;
use gpuheap::Error;

/// Arguments of `gpuheap info`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Device index.
    #[arg(long, default_value_t = 0)]
    device: u32,
    #[command(flatten)]
    backend: BackendArgs,
    /// Also load gpuheap's PTX on the GPU: load and JIT time, the JIT log, and each kernel's
    /// registers, memory, largest block and occupancy (see `app::kernels`).
    #[arg(long)]
    kernels: bool,
}

/// Runs `gpuheap info`.
pub(crate) fn run(a: Args) -> Result<(), Error> {
    write_info(&mut std::io::stdout().lock(), a.backend.backend.into(), a.device, a.kernels)
}
