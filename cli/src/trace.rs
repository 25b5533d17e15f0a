//! `gpuheap trace ...`: commands that make trace files.
//!
//! `gpuheap trace repeat IN OUT --steps N [--gap-us G]` writes a PyTorch memory snapshot that repeats IN's
//! history N times as a run of N steps would record it ([`gpuheap::trace::repeat`] says what that means
//! and which histories are refused). The file is written to a temporary file in OUT's folder, read back
//! and checked ([`Repeat::verify`]), then renamed to OUT, so an error never leaves a partial or
//! inconsistent file. One line on stdout says what was written.
//!
//! Bad input (an unreadable trace, one that cannot be repeated, a bad option or output path) exits with
//! code 2 and one line on stderr; a write failure exits with 1.

use std::io::{Read, Seek, Write};
use std::path::PathBuf;

use super::output;
use gpuheap::trace::read_trace_and_bytes;
use gpuheap::trace::repeat::{Repeat, RepeatOptions};
use gpuheap::Error;

/// The `trace` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Writes a PyTorch snapshot that repeats IN's history N times, as a run of N identical steps records
    /// it: same addresses and frames, times shifted per step, the step's leftovers freed between steps.
    Repeat(RepeatArgs),
}

/// Arguments of `gpuheap trace repeat`.
#[derive(Debug, clap::Args)]
pub(crate) struct RepeatArgs {
    /// The PyTorch memory snapshot to repeat (`torch.cuda.memory._dump_snapshot`).
    pub input: PathBuf,
    /// The snapshot to write (replaced if it exists; never the input).
    pub output: PathBuf,
    /// Number of steps (1 writes the input again).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub steps: u32,
    /// Microseconds between the last event of a step and the first of the next.
    #[arg(long, default_value_t = 1000)]
    pub gap_us: u64,
}

/// Runs a `trace` subcommand.
pub(crate) fn run(c: &Command) -> Result<(), Error> {
    match c {
        Command::Repeat(a) => repeat(a),
    }
}

fn repeat(a: &RepeatArgs) -> Result<(), Error> {
    output::check_stdout(&a.input)?;
    output::check_output(&a.output, &a.input)?;
    let (trace, bytes) = read_trace_and_bytes(&a.input)?;
    let plan = Repeat::new(&trace, &bytes, RepeatOptions::new(a.steps, a.gap_us))?;
    let out = &a.output;
    let mut size = 0;
    output::write_atomically(out, |tmp, file| {
        let cannot = |e: std::io::Error| Error::runtime(format!("{}: cannot write: {e}", out.display()));
        let file = file.try_clone().map_err(cannot)?;
        let mut file = plan.write_to(std::io::BufWriter::new(file)).map_err(cannot)?;
        file.flush().map_err(cannot)?;
        // Read back through the file created (never by its name, which a link could meanwhile take).
        let mut written = Vec::new();
        let mut back = file.into_inner().map_err(|e| cannot(e.into_error()))?;
        back.seek(std::io::SeekFrom::Start(0)).map_err(cannot)?;
        back.read_to_end(&mut written).map_err(cannot)?;
        size = written.len();
        plan.verify(tmp, &written)
            .map_err(|e| Error::internal(format!("{}: not written: {e} (a bug; please report it)", out.display())))
    })?;
    super::stdout::line(plan.summary(&a.input, out, size))?;
    Ok(())
}
