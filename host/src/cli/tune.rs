//! `gpuheap tune TRACE [--device N] [--capacity C] [--json]`: which allocator setting would have saved
//! the run, and how much GPU memory the run needs under each. Replays the trace under a grid of
//! `PYTORCH_CUDA_ALLOC_CONF` settings, the caching model with compaction on OOM and every host
//! strategy ([`gpuheap::explain::tune`]), in parallel, with one progress bar on stderr.
//!
//! Bad input exits with code 2 and one line on stderr.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpuheap::explain::tune::{self, RowKind, TuneReport};
use gpuheap::explain::{self, Capacity, ExplainError};
use gpuheap::replay::fmt_bytes;
use gpuheap::trace::{read_trace, DeviceTrace, Trace};
use serde::Serialize;

use super::explain::{capacity_text, devices_text};
use super::CliError;

/// Arguments of `gpuheap tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PyTorch memory snapshot, or any trace `replay` reads.
    pub trace: PathBuf,
    /// Device to replay (default: the one with a recorded OOM, else the most allocation events).
    #[arg(long)]
    pub device: Option<i64>,
    /// The GPU's memory for the "failed" column: bytes or with a unit (80GiB). Default: PyTorch's
    /// reserved bytes at a recorded OOM plus the driver's free bytes then; else its peak reserved bytes.
    #[arg(long, value_parser = parse_bytes_arg)]
    pub capacity: Option<u64>,
    /// Print a JSON report on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report: interactive timeline, the ranked table, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

pub(crate) fn parse_bytes_arg(s: &str) -> Result<u64, String> {
    gpuheap::replay::parse_bytes(s)
}

/// Reads a trace; any failure is bad input.
pub(crate) fn load_trace(path: &Path) -> Result<Trace, CliError> {
    read_trace(path).map_err(|e| CliError::Input(e.to_string()))
}

pub(crate) fn explain_error(e: ExplainError) -> CliError {
    if e.is_input() {
        CliError::Input(e.to_string())
    } else {
        CliError::Runtime(e.to_string())
    }
}

/// Runs the search with one progress bar on stderr (hidden under `--json` or when stderr is not a
/// terminal).
pub(crate) fn search(trace: &Trace, dev: &DeviceTrace, cap: &Capacity, json: bool) -> Result<TuneReport, CliError> {
    let pb = if json || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new_spinner();
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{spinner} tune: {pos} replays ({per_sec}) {elapsed}")
        {
            pb.set_style(style);
        }
        pb
    };
    let r = tune::tune(trace, dev, cap, &|| pb.inc(1)).map_err(explain_error);
    pb.finish_and_clear();
    r
}

#[derive(Serialize)]
struct TuneOutput<'a> {
    trace: String,
    devices: Vec<explain::DeviceSummary>,
    device: explain::DeviceChoice,
    gpu_capacity: Option<u64>,
    recorded_ooms: usize,
    wall_s: f64,
    #[serde(flatten)]
    tune: &'a TuneReport,
}

pub fn run(a: &Args) -> Result<(), CliError> {
    a.html.as_deref().map(super::html::check_path).transpose()?;
    let trace = load_trace(&a.trace)?;
    let devices = explain::summarize(&trace);
    let choice = explain::choose_device(&trace, &devices, a.device).map_err(CliError::Input)?;
    let dev = &trace.devices[choice.index];
    let cap = explain::capacity_from_evidence(&trace, dev, a.capacity).map_err(|e| CliError::Input(e.to_string()))?;
    let gpu = explain::gpu_capacity_at_oom(&trace, dev).map_err(|e| CliError::Input(e.to_string()))?.map(|c| c.bytes);
    let t = Instant::now();
    let report = search(&trace, dev, &cap, a.json)?;
    let wall_s = t.elapsed().as_secs_f64();
    if let Some(p) = &a.html {
        let title = format!("{} — tune", super::replay::file_name(&a.trace));
        super::html::write(p, &super::html::tune_page(&title, &trace, dev, &report, &cap)?)?;
    }
    if a.json {
        let out = TuneOutput {
            trace: trace.source.display().to_string(),
            devices,
            device: choice,
            gpu_capacity: gpu,
            recorded_ooms: dev.ooms.len(),
            wall_s,
            tune: &report,
        };
        let s = serde_json::to_string_pretty(&out).map_err(|e| CliError::Runtime(e.to_string()))?;
        println!("{s}");
    } else {
        let mut s = format!("trace {} ({})\n", trace.source.display(), trace.format);
        s += &devices_text(&devices, &choice);
        s += &capacity_text(&cap);
        let _ = writeln!(s, "\n{} settings, {} replays in {wall_s:.1} s", report.rows.len(), report.replays);
        let oom = !dev.ooms.is_empty();
        s += "\n";
        s += &table(&report, oom);
        print!("{s}");
    }
    Ok(())
}

/// The ranked table and the best setting's env line; `oom`: the trace records an OOM (rows that fit
/// are then marked "would have avoided the OOM").
pub(crate) fn table(t: &TuneReport, oom: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Settings ranked by the least GPU memory that replays the whole trace without a failed request \
         (bisection at 2 MiB); failed = requests that fail at {}:",
        fmt_bytes(t.capacity.bytes)
    );
    let _ = writeln!(s, "{:>4}  {:<64} {:>11} {:>7} {:>13}", "rank", "setting", "peak resv", "failed", "min capacity");
    for (i, r) in t.rows.iter().enumerate() {
        let kind = match r.kind {
            RowKind::Pytorch if r.own => " [snapshot's own]",
            RowKind::Pytorch => "",
            RowKind::Compacting => " [a compacting allocator]",
            RowKind::Host => " [host strategy]",
        };
        let label = format!("{}{kind}", r.setting);
        let min = r.min_capacity.map_or_else(|| "none".to_string(), fmt_bytes);
        let mut mark = match (r.min_capacity, r.fits, oom) {
            (None, _, _) => "  not run".to_string(),
            (Some(_), true, true) => "  would have avoided the OOM".into(),
            (Some(_), true, false) => "  fits".into(),
            (Some(_), false, _) => String::new(),
        };
        if let Some(n) = &r.note {
            mark += &format!(" ({n})");
        }
        let _ = writeln!(
            s,
            "{:>4}  {:<64} {:>11} {:>7} {:>13}{mark}",
            i + 1,
            label,
            fmt_bytes(r.peak_reserved),
            r.failed,
            min
        );
    }
    match (t.best, &t.best_env) {
        (Some(b), Some(env)) => {
            let r = &t.rows[b];
            let own = t.rows.iter().find(|r| r.own);
            let _ = writeln!(
                s,
                "\nBest PyTorch setting (least memory needed: {}):",
                r.min_capacity.map_or_else(String::new, fmt_bytes)
            );
            if env.trim_end() == "PYTORCH_CUDA_ALLOC_CONF=" {
                s += "  PyTorch's defaults (PYTORCH_CUDA_ALLOC_CONF unset)\n";
            } else {
                let _ = writeln!(s, "  {env}");
            }
            if let Some(o) = own.filter(|o| o.env.as_ref().is_none_or(|e| e != env)) {
                let _ = writeln!(
                    s,
                    "  (the snapshot's own settings need {})",
                    o.min_capacity.map_or_else(|| "more than any device modelled".to_string(), fmt_bytes)
                );
            } else {
                s += "  (that is the snapshot's own setting: no PyTorch setting of the grid needs less)\n";
            }
        }
        _ => s += "\nNo PyTorch setting of the grid replays the whole trace on any device modelled.\n",
    }
    s
}
