//! The arguments several commands share, as clap mirrors of [`Options`]: [`ReplayArgs`] (`replay`,
//! `compare`), [`TraceArgs`] (`explain`, `tune`) and [`BackendArgs`] (every command that runs
//! kernels). The parsers are the front door's ([`gpuheap::app::options`]); each struct maps itself
//! onto [`Options`] and knows its output paths.

use std::path::{Path, PathBuf};

use super::output::{self, Plot};
use gpuheap::app::{parse_align, parse_bytes, parse_capacity, parse_policy, parse_tiers};
use gpuheap::app::{Options, Output};
use gpuheap::backend::{Backend, BackendChoice};
use gpuheap::replay::CompactPolicy;
use gpuheap::Error;

/// Options shared by every command that runs kernels.
#[derive(clap::Args, Clone, Copy, Debug)]
pub(crate) struct BackendArgs {
    /// Where kernels run: auto (the GPU when usable), cpu or gpu.
    #[arg(long, value_enum, env = "GPUHEAP_BACKEND", default_value = "auto")]
    pub backend: Choice,
}

/// The clap mirror of [`BackendChoice`] (the library names no clap): the same values and help.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(crate) enum Choice {
    /// The GPU when usable, else the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The GPU backend (an error when no GPU is usable).
    Gpu,
}

impl From<Choice> for BackendChoice {
    fn from(c: Choice) -> Self {
        match c {
            Choice::Auto => BackendChoice::Auto,
            Choice::Cpu => BackendChoice::Cpu,
            Choice::Gpu => BackendChoice::Gpu,
        }
    }
}

impl BackendArgs {
    /// The selected backend (a run-time failure for `gpu` without a usable GPU; bad input for an invalid
    /// CPU mode or seed).
    pub fn select(&self) -> Result<Backend, Error> {
        // An invalid GPUHEAP_CPU_WARPS or GPUHEAP_CPU_SEED is bad input (exit 2), a missing GPU a run-time failure.
        Backend::select(self.backend.into()).map_err(Error::from)
    }
}

/// Options shared by `replay` and `compare`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// Managed capacity: bytes (1073741824), a float (1.5e9) or with a unit (80GiB, 512MiB, 2GB).
    /// Default: the GPU's memory at a recorded OOM (reserved + the driver's free bytes), else PyTorch's
    /// peak reserved rounded up to a GiB (snapshots), the capacity in a minimalloc file name, else twice
    /// the peak of live bytes.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// Alignment of every request, bytes (a power of two). Default: the format's own: 512 B for PyTorch
    /// snapshots (PyTorch's kMinBlockSize), 1 B for minimalloc CSV (defined at byte granularity), 256 B
    /// for RMM logs (cudaMalloc's alignment). The output states which was used.
    #[arg(long, value_parser = parse_align)]
    pub align: Option<u64>,
    /// Tier thresholds of the tiered strategy, SMALL_MAX,LARGE_MIN (bytes or with units, e.g. 1KiB,1MiB):
    /// requests up to SMALL_MAX go to the slab tier, from LARGE_MIN to the top-down large tier.
    /// Default: 64 KiB and min(10 MiB, capacity/16).
    #[arg(long, value_parser = parse_tiers)]
    pub tiers: Option<(u64, u64)>,
    /// Compaction policy: never, on-oom (compact and retry a request that fails for fragmentation) or
    /// threshold=F (compact when a free leaves external fragmentation above F in [0, 1]).
    #[arg(long = "compact", default_value = "never", value_parser = parse_policy)]
    pub policy: CompactPolicy,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Device of the trace to replay (default: the one with a recorded OOM, else the most allocation events).
    #[arg(long)]
    pub device: Option<i64>,
    /// Largest image a compaction materialises on the backend before it compacts a scaled image
    /// (default: 1GiB on the CPU, 80 % of free memory on the GPU).
    #[arg(long, value_parser = parse_bytes)]
    pub materialize_limit: Option<u64>,
    /// Print a JSON report on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a timeline plot (.svg or .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write a self-contained HTML report: interactive timeline, tables, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

impl ReplayArgs {
    /// The front door's options.
    pub fn options(&self) -> Options {
        let mut o = Options::default();
        o.capacity = self.capacity;
        o.align = self.align;
        o.tiers = self.tiers;
        o.policy = self.policy;
        o.backend = self.backend.backend.into();
        o.device = self.device;
        o.materialize_limit = self.materialize_limit;
        o.html = self.html.is_some();
        o.flag_advice = true;
        o
    }

    /// Checks standard output and the output paths before any work ([`output::check_stdout`],
    /// [`output::check_output`]); returns the plot to write.
    pub fn check_outputs(&self, trace: &Path) -> Result<Option<Plot>, Error> {
        output::check_stdout(trace)?;
        let plot = self.plot.as_deref().map(|p| output::check_plot(p, trace)).transpose()?;
        self.html.as_deref().map(|p| output::check_output(p, trace)).transpose()?;
        Ok(plot)
    }

    /// Writes the plot and the HTML page, then prints the JSON or the text.
    pub fn write(&self, plot: Option<Plot>, out: &Output) -> Result<(), Error> {
        if let Some(p) = plot {
            p.write(out)?;
        }
        output::finish(self.html.as_deref(), self.json, out)
    }
}

/// The arguments `gpuheap explain` and `gpuheap tune` share (flattened into each command's own).
#[derive(Debug, clap::Args)]
pub(crate) struct TraceArgs {
    /// PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`), or any trace `replay` reads.
    pub trace: PathBuf,
    /// Device to report on (default: the one with a recorded OOM, else the most allocation events).
    #[arg(long)]
    pub device: Option<i64>,
    /// The GPU's memory: bytes or with a unit (80GiB). Default: PyTorch's reserved bytes at a recorded
    /// OOM plus the driver's free bytes then; else PyTorch's peak reserved bytes.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// Print a JSON report on stdout instead of the page.
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report: interactive timeline, the tables, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

impl TraceArgs {
    /// The front door's options.
    pub fn options(&self) -> Options {
        let mut o = Options::default();
        o.capacity = self.capacity;
        o.device = self.device;
        o.html = self.html.is_some();
        o.flag_advice = true;
        o
    }

    /// Checks standard output and the HTML path before any work ([`output::check_stdout`],
    /// [`output::check_output`]).
    pub fn check_outputs(&self) -> Result<(), Error> {
        output::check_stdout(&self.trace)?;
        self.html.as_deref().map(|p| output::check_output(p, &self.trace)).transpose()?;
        Ok(())
    }

    /// Writes the HTML page, then prints the JSON or the text.
    pub fn write(&self, out: &Output) -> Result<(), Error> {
        output::finish(self.html.as_deref(), self.json, out)
    }
}
