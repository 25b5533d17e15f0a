//! `gpuheap replay TRACE [--strategy S] [--capacity BYTES] [--align BYTES] [--tiers SMALL_MAX,LARGE_MIN]
//! [--compact never|on-oom|threshold=F] [--backend cpu|gpu] [--device N] [--materialize-limit BYTES]
//! [--json] [--plot FILE]`.
//!
//! Without `--strategy` the strategy is the format's own ([`replay::default_strategy`]: the PyTorch caching
//! model for PyTorch snapshots, best-fit otherwise); the output says so. The shared options live in
//! [`Common`] (one struct, flattened into `replay` and `compare`; a new option is one field there).
//!
//! Bad input (an unreadable or inconsistent trace, a bad option) exits with code 2 and one line on
//! stderr; nothing is written. Output files are written to a temporary file in the same folder and
//! renamed at the end, so an error never leaves a partial file.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use gpuheap::backend::Backend;
use gpuheap::reference::StrategyKind;
use gpuheap::replay::plot::{self, PlotFormat};
use gpuheap::replay::{self, CompactPolicy, ReplayOptions, ReplayReport};
use gpuheap::trace::{read_trace, DeviceTrace, Trace};
use gpuheap::units;

use super::{BackendArgs, CliError};

/// Arguments of `gpuheap replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace file: PyTorch memory snapshot pickle, minimalloc CSV (id,lower,upper,size) or RMM log CSV.
    pub trace: PathBuf,
    /// Strategy: first-fit, best-fit, buddy, tlsf, slab, tiered or caching (PyTorch's model).
    /// Default: caching for PyTorch snapshots, best-fit for the other formats.
    #[arg(long, value_parser = parse_strategy)]
    pub strategy: Option<StrategyKind>,
    #[command(flatten)]
    pub common: Common,
}

/// Options shared by `replay` and `compare`.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// Managed capacity: bytes (1073741824), a float (1.5e9) or with a unit (80GiB, 512MiB, 2GB).
    /// Default: the GPU's memory at a recorded OOM (reserved + the driver's free bytes), else PyTorch's
    /// peak reserved rounded up to a GiB (snapshots), the capacity in a minimalloc file name, else twice
    /// the peak of live bytes.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// Alignment of every request, bytes (a power of two). Default: the format's own: 512 B for PyTorch
    /// snapshots (PyTorch's kMinBlockSize), 1 B for minimalloc CSV (defined at byte granularity), 256 B
    /// for RMM logs (cudaMalloc's alignment). The output states which was used.
    #[arg(long, value_parser = units::parse_align)]
    pub align: Option<u64>,
    /// Tier thresholds of the tiered strategy, SMALL_MAX,LARGE_MIN (bytes or with units, e.g. 1KiB,1MiB):
    /// requests up to SMALL_MAX go to the slab tier, from LARGE_MIN to the top-down large tier.
    /// Default: 64 KiB and min(10 MiB, capacity/16).
    #[arg(long, value_parser = units::parse_tiers)]
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
    #[arg(long, value_parser = parse_bytes_arg)]
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

fn parse_strategy(s: &str) -> Result<StrategyKind, String> {
    s.parse::<StrategyKind>().map_err(|e| e.to_string())
}

fn parse_bytes_arg(s: &str) -> Result<u64, units::ParseError> {
    units::parse_bytes(s)
}

/// A `--capacity`: a byte count (as [`replay::parse_bytes`]) in the range the strategies model,
/// [`gpuheap::facts::MIN_CAPACITY`] to [`gpuheap::reference::MAX_BYTES`] (2^48 B).
pub(crate) fn parse_capacity(s: &str) -> Result<u64, String> {
    let c = units::parse_bytes(s).map_err(|e| e.to_string())?;
    gpuheap::facts::check_capacity(c).map_err(|e| e.to_string())
}

fn parse_policy(s: &str) -> Result<CompactPolicy, replay::PolicyError> {
    s.parse()
}

/// Reads the trace and picks the device ([`gpuheap::facts::choose_device`]: `--device`, else the
/// one with a recorded OOM, else the most allocation events); when the file has other devices, one
/// line on stderr says which was chosen and how to pick another. Bad input is [`CliError::Input`].
pub(crate) fn load(path: &Path, device: Option<i64>) -> Result<(Trace, usize), CliError> {
    let trace = read_trace(path).map_err(|e| CliError::Input(e.to_string()))?;
    let devices = gpuheap::facts::summarize(&trace);
    let choice = gpuheap::facts::choose_device(&trace, &devices, device).map_err(|e| CliError::Input(e.to_string()))?;
    if !choice.others.is_empty() {
        eprint!("{}", super::explain::devices_text(&devices, &choice));
    }
    eprint!("{}", gpuheap::explain::settings_warnings_text(&trace.devices[choice.index]));
    Ok((trace, choice.index))
}

/// Without `--capacity`, checks once that a capacity can be derived from the trace (BL-23: a buffer
/// larger than any device is refused naming its line), so that every row does not repeat the error.
pub(crate) fn check_capacity(trace: &Trace, dev: &DeviceTrace, common: &Common) -> Result<(), CliError> {
    if common.capacity.is_none() {
        replay::default_capacity(trace, dev).map_err(|e| CliError::Input(e.to_string()))?;
    }
    Ok(())
}

/// The backend for compaction measurements (`None` when the policy never compacts).
///
/// An explicit `--backend gpu` is resolved even then, so that asking for a GPU
/// that is not there is an error rather than silently ignored.
pub(crate) fn backend_for(common: &Common) -> Result<Option<Backend>, CliError> {
    if common.policy == CompactPolicy::Never && common.backend.backend != gpuheap::BackendChoice::Gpu {
        return Ok(None);
    }
    common.backend.backend().map(Some)
}

/// A progress bar on stderr for long traces, hidden under `--json` or when stderr is not a terminal.
pub(crate) fn progress_bar(events: usize, json: bool, label: &str) -> indicatif::ProgressBar {
    if json || events < 200_000 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(events as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events ({per_sec})") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(label.to_string());
    pb
}

/// Validates the plot path before any work: the extension, then [`check_output`].
pub(crate) fn check_plot_path(p: &Path, trace: &Path) -> Result<PlotFormat, CliError> {
    let f = PlotFormat::of(p).map_err(CliError::Input)?;
    check_output(p, trace)?;
    Ok(f)
}

/// [`check_output_path`], and the path is not the trace being read (writing there would replace the
/// input).
///
/// # Errors
/// [`CliError::Input`] (exit 2) naming the path.
pub(crate) fn check_output(p: &Path, trace: &Path) -> Result<(), CliError> {
    if let (Ok(out), Ok(input)) = (p.canonicalize(), trace.canonicalize()) {
        if out == input {
            return Err(CliError::Input(format!(
                "{}: is the trace being read; writing the report there would replace it (choose another file)",
                p.display()
            )));
        }
    }
    check_output_path(p)
}

/// Checks an output path (`--html`, `--plot`, `bench alloc --out`) before any work: its folder exists and
/// takes a new file, and it is not a folder nor another non-regular file (a device such as /dev/null, a
/// pipe).
///
/// The folder is probed by creating and removing the temporary file that
/// [`write_atomically`] writes, so an unwritable folder is reported here, with exit
/// code 2, rather than after the work.
///
/// # Errors
/// [`CliError::Input`] (exit 2) naming the path.
pub(crate) fn check_output_path(p: &Path) -> Result<(), CliError> {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(CliError::Input(format!("{}: folder {} does not exist", p.display(), dir.display())));
    }
    if p.is_dir() {
        return Err(CliError::Input(format!("{}: is a directory", p.display())));
    }
    // The write renames a temporary file onto `p`: onto /dev/null or /dev/stdout (as root) that would
    // replace the device node or link, so only a regular file (or a new path) is taken.
    if let Ok(m) = std::fs::metadata(p) {
        if !m.is_file() {
            return Err(CliError::Input(format!(
                "{}: is not a regular file (a device, pipe or socket): the report is written to a temporary \
                 file renamed into place, which would replace it; give a file path",
                p.display()
            )));
        }
    }
    let tmp = temp_path(p);
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
        Ok(_) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
        Err(e) => Err(CliError::Input(format!("{}: cannot write in folder {}: {e}", p.display(), dir.display()))),
    }
}

/// The temporary file [`write_atomically`] writes before renaming it to `path`: in the same folder,
/// keeping the extension (plotters picks the image format from it).
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("tmp");
    dir.join(format!(".{name}.{}.partial.{ext}", std::process::id()))
}

/// Writes a file through a temporary file in the same folder, renamed into place at the end (removed on
/// error). The temporary name keeps the extension (plotters picks the image format from it).
pub(crate) fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<(), String>) -> Result<(), CliError> {
    let tmp = temp_path(path);
    let r = write(&tmp)
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| format!("{}: cannot write: {e}", path.display())));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(CliError::Runtime)
}

/// Writes the plot of `reports` to `path`.
pub(crate) fn write_plot(
    path: &Path,
    format: PlotFormat,
    title: &str,
    reports: &[&ReplayReport],
) -> Result<(), CliError> {
    let mut note = None;
    write_atomically(path, |tmp| {
        note = plot::write_timeline(tmp, format, title, reports).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(())
    })?;
    if let Some(n) = note {
        eprintln!("gpuheap: note: {n}");
    }
    Ok(())
}

pub(crate) fn map_replay_err(e: replay::ReplayError) -> CliError {
    if e.is_input() {
        CliError::Input(e.to_string())
    } else {
        CliError::Runtime(e.to_string())
    }
}

/// The replay options of `common` for `strategy` (used by `replay` and `compare`).
pub(crate) fn replay_options(common: &Common, strategy: StrategyKind) -> ReplayOptions {
    ReplayOptions {
        capacity: common.capacity,
        align: common.align,
        // The tiers are the tiered strategy's; the other strategies (compare's rows) ignore them.
        tiers: common.tiers.filter(|_| strategy == StrategyKind::Tiered),
        policy: common.policy,
        materialize_limit: common.materialize_limit,
        ..ReplayOptions::new(strategy)
    }
}

/// A host strategy's replay error with the advice on the CLI's flags added to an invalid configuration.
pub(crate) fn with_advice(e: replay::ReplayError) -> replay::ReplayError {
    e.with_advice("choose another strategy with --strategy, or a larger --capacity")
}

/// Replays one strategy (`replay`).
pub(crate) fn run_one(
    trace: &Trace,
    dev: &DeviceTrace,
    strategy: StrategyKind,
    common: &Common,
    backend: Option<&Backend>,
    pb: &indicatif::ProgressBar,
) -> Result<ReplayReport, CliError> {
    let opts = replay_options(common, strategy);
    pb.set_position(0);
    let mut progress = |n: usize| pb.set_position(n as u64);
    replay::replay(trace, dev, &opts, backend, &mut progress).map_err(|e| map_replay_err(with_advice(e)))
}

/// Runs `gpuheap replay`.
///
/// # Errors
/// [`CliError::Input`] for bad input (exit 2), [`CliError::Runtime`] otherwise (exit 1).
pub fn run(a: &Args) -> Result<(), CliError> {
    let plot_format = a.common.plot.as_deref().map(|p| check_plot_path(p, &a.trace)).transpose()?;
    a.common.html.as_deref().map(|p| check_output(p, &a.trace)).transpose()?;
    let (trace, idx) = load(&a.trace, a.common.device)?;
    let dev = &trace.devices[idx];
    check_capacity(&trace, dev, &a.common)?;
    let backend = backend_for(&a.common)?;
    let strategy = a.strategy.unwrap_or_else(|| replay::default_strategy(&trace));
    if a.common.tiers.is_some() && strategy != StrategyKind::Tiered {
        return Err(CliError::Input(format!("--tiers applies to --strategy tiered, not {strategy}")));
    }
    let pb = progress_bar(dev.events.len(), a.common.json, strategy.as_str());
    let report = run_one(&trace, dev, strategy, &a.common, backend.as_ref(), &pb)?;
    pb.finish_and_clear();
    if let (Some(p), Some(f)) = (&a.common.plot, plot_format) {
        let title = format!("{} — {}", file_name(&a.trace), strategy);
        write_plot(p, f, &title, &[&report])?;
    }
    if let Some(p) = &a.common.html {
        let title = format!("{} — {}", file_name(&a.trace), strategy);
        super::html::write(p, &gpuheap::html::pages::replay_page(&title, &report))?;
    }
    if a.common.json {
        let s = serde_json::to_string_pretty(&report).map_err(|e| CliError::Runtime(e.to_string()))?;
        println!("{s}");
    } else {
        let note = if a.strategy.is_none() {
            format!(" (the default for a {}; choose another with --strategy)", trace.format)
        } else {
            String::new()
        };
        print!("{}", report.render_text(&note));
    }
    Ok(())
}

pub(crate) fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}
