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
use gpuheap::replay::{self, CompactPolicy, MeasureOutcome, ReplayOptions, ReplayReport};
use gpuheap::trace::{read_trace, DeviceTrace, Trace};
use gpuheap::units::{self, fmt_bytes, fmt_ns, fmt_rate, pct};

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
        print!("{}", table(&report, &note));
    }
    Ok(())
}

pub(crate) fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn ev(e: Option<usize>) -> String {
    e.map_or_else(|| "start".to_string(), |i| i.to_string())
}

/// One line per compaction.
pub(crate) fn compaction_lines(r: &ReplayReport) -> String {
    let mut s = String::new();
    for c in &r.compactions {
        s += &format!(
            "  event {:>7} {:<9} planned {} in {} of {} units; F_ext {:.3} -> {:.3}; reserved {} -> {}",
            c.event,
            c.trigger,
            fmt_bytes(c.planned_bytes_moved),
            c.planned_units_moved,
            c.units,
            c.external_before,
            c.external_after,
            fmt_bytes(c.footprint_before),
            fmt_bytes(c.footprint_after)
        );
        if let Some(ok) = c.retry_succeeded {
            s += if ok { "; retry succeeded" } else { "; retry failed" };
        }
        s += "\n";
        match &c.measurement {
            MeasureOutcome::Measured(m) => {
                let scale = if m.scaled_by == 1 {
                    "full size".to_string()
                } else {
                    format!("scaled image 1/{} (figures are the scaled image's)", m.scaled_by)
                };
                s += &format!(
                    "    measured on {}, {scale}: {} moved in {} blocks, kernel {} (plan {}, move {}){}; \
                     layout = reference plan, bytes checked\n",
                    m.backend,
                    fmt_bytes(m.bytes_moved),
                    m.blocks_moved,
                    fmt_ns(m.kernel_ns),
                    fmt_ns(m.plan_ns),
                    fmt_ns(m.move_ns),
                    fmt_rate(m.bytes_moved, m.kernel_ns)
                );
            }
            MeasureOutcome::NotMeasured { reason } => s += &format!("    not measured: {reason}\n"),
        }
    }
    s
}

/// The summary table of one replay; `strategy_note` follows the strategy's name (why it was chosen).
pub fn table(r: &ReplayReport, strategy_note: &str) -> String {
    let mut s = String::new();
    s += &format!("trace          {} ({}), device {}\n", r.trace, r.format, r.device);
    s += &format!(
        "strategy       {}{strategy_note}\ncapacity       {} ({}), requests aligned to {} B ({}), compaction {}\n",
        r.strategy,
        fmt_bytes(r.capacity.bytes),
        r.capacity.describe(),
        r.align,
        r.align_source,
        r.policy
    );
    s += &format!(
        "events         {} ({} alloc, {} free_completed, {} free_requested) after {} initial blocks\n",
        r.events, r.allocs, r.frees, r.free_requests, r.initial_blocks
    );
    s += &format!(
        "replay speed   {:.2} M events/s ({} for the event loop; reading excluded)\n",
        r.events_per_s / 1e6,
        fmt_ns(r.replay_ns)
    );
    s += &format!(
        "peak allocated {}   peak reserved {} (event {})   utilisation {}   Johnstone-Wilson #4 {:.3}\n\n",
        fmt_bytes(r.peak_allocated),
        fmt_bytes(r.peak_reserved),
        ev(r.peak_reserved_event),
        pct(r.utilisation),
        r.johnstone_wilson
    );
    let (p, e) = (&r.at_peak, &r.at_end);
    s += &format!(
        "{:<26}{:>22}{:>22}\n",
        "",
        format!("at peak (event {})", ev(p.event)),
        format!("at end (event {})", ev(e.event))
    );
    let rows: [(&str, u64, u64); 9] = [
        ("allocated (requested)", p.allocated, e.allocated),
        ("in blocks (rounded)", p.in_use, e.in_use),
        ("reserved (footprint)", p.footprint, e.footprint),
        ("reserved-unallocated", p.reserved_unallocated, e.reserved_unallocated),
        ("  rounding waste", p.rounding_waste, e.rounding_waste),
        ("  holes", p.holes, e.holes),
        ("free (all extents)", p.free, e.free),
        ("largest free extent", p.largest_free, e.largest_free),
        ("free extents (count)", p.free_blocks, e.free_blocks),
    ];
    for (name, a, b) in rows {
        let f = |x: u64| if name.contains("count") { x.to_string() } else { fmt_bytes(x) };
        s += &format!("{name:<26}{:>22}{:>22}\n", f(a), f(b));
    }
    s += &format!(
        "{:<26}{:>22}{:>22}\n",
        "external fragmentation",
        format!("{:.3} ({})", p.external, p.level),
        format!("{:.3} ({})", e.external, e.level)
    );
    s += &format!("{:<26}{:>22}{:>22}\n\n", "RMS fragmentation", format!("{:.3}", p.rms), format!("{:.3}", e.rms));
    if let Some(pt) = &r.pytorch {
        s += &format!(
            "PyTorch        reserved: {} at start, peak {} (event {}), {} at end ({} segments)",
            fmt_bytes(pt.initial),
            fmt_bytes(pt.peak),
            ev(pt.peak_event),
            fmt_bytes(pt.end),
            pt.end_segments
        );
        if let (Some(res), Some(n)) = (pt.snapshot_reserved, pt.snapshot_segments) {
            s += &format!("; snapshot final state {} in {n} segments", fmt_bytes(res));
        }
        s += "\n";
    }
    if let (Some(c), Some(f)) = (&r.caching_end, r.end_fidelity()) {
        // A ratio to nothing is no figure: against a snapshot of 0 B (or 0 segments) the bytes are said.
        let d = |x: Option<f64>, snap: String| {
            x.map_or_else(|| format!("n/a (the snapshot has {snap})"), |x| format!("{:+.2} %", x * 100.0))
        };
        s += &format!(
            "caching model  at end {} in {} segments ({} seeded): {} reserved, {} segments vs the snapshot\n",
            fmt_bytes(c.reserved),
            c.segments,
            c.seeded_segments,
            d(f.reserved, fmt_bytes(f.snapshot_reserved)),
            d(f.segments, f.snapshot_segments.to_string())
        );
    }
    let count = |c: &str| r.failed.iter().filter(|f| f.class == c).count();
    s += &format!(
        "failed         {} requests ({} capacity, {} fragmentation, {} rejected)\n",
        r.failed.len(),
        count("capacity"),
        count("fragmentation"),
        count("rejected")
    );
    for f in r.failed.iter().take(10) {
        s += &format!(
            "  event {:>7}  {:>12}  {:<13} (free {}, largest free {})\n",
            ev(f.event),
            fmt_bytes(f.size),
            f.class,
            fmt_bytes(f.free),
            fmt_bytes(f.largest_free)
        );
    }
    if r.failed.len() > 10 {
        s += &format!("  ... {} more (all in --json)\n", r.failed.len() - 10);
    }
    s += &tier_lines(r);
    s += &format!("compactions    {}\n", r.compactions.len());
    s += &compaction_lines(r);
    s
}

/// The tiered strategy's per-tier lines (empty for the other strategies).
pub(crate) fn tier_lines(r: &ReplayReport) -> String {
    let Some(tiers) = &r.tiers else { return String::new() };
    let mut s =
        format!("tiers of {}    requests (failed), requested bytes, peak live, internal fragmentation\n", r.strategy);
    for t in tiers {
        let range = if t.max_size == u64::MAX {
            format!(">= {}", fmt_bytes(t.min_size))
        } else {
            format!("{}..{}", fmt_bytes(t.min_size), fmt_bytes(t.max_size))
        };
        s += &format!(
            "  {:<7}{:<26}{:>9} ({}){:>14}{:>14}{:>8.3}\n",
            t.tier,
            range,
            t.requests,
            t.failed,
            fmt_bytes(t.requested_bytes),
            fmt_bytes(t.peak_live),
            t.internal_fragmentation
        );
    }
    s
}
