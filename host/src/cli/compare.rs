//! `gpuheap compare TRACE [--capacity BYTES] [--compact P] [--backend B] [--device N] [--json]
//! [--plot FILE]`: every strategy over the same trace, side by side, plus what PyTorch itself reserved
//! according to the snapshot; one table and one plot.
//!
//! # Extension point
//! The rows come from [`contenders`]. The device-side allocator will be one more [`Contender`] variant
//! whose [`run_contender`] arm replays the trace on the chosen backend and returns a
//! [`ReplayReport`]; the table, the JSON and the plot need no change.

use serde::Serialize;

use gpuheap::backend::Backend;
use gpuheap::reference::StrategyKind;
use gpuheap::replay::{fmt_bytes, PytorchReserved, ReplayReport};
use gpuheap::trace::{DeviceTrace, Trace};

use super::replay::{self as cli_replay, Common};
use super::CliError;

/// Arguments of `gpuheap compare`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace file (as for `gpuheap replay`).
    pub trace: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

/// One row of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// A host reference strategy.
    Host(StrategyKind),
    // The device allocator goes here (`Device`), replayed on the chosen backend.
}

/// The rows, in order: every host strategy (the device allocator will be appended here).
pub fn contenders() -> Vec<Contender> {
    StrategyKind::ALL.iter().map(|&k| Contender::Host(k)).collect()
}

fn run_contender(
    c: Contender,
    trace: &Trace,
    dev: &DeviceTrace,
    common: &Common,
    backend: Option<&Backend>,
    pb: &indicatif::ProgressBar,
) -> Result<ReplayReport, CliError> {
    match c {
        Contender::Host(k) => {
            pb.set_message(k.to_string());
            cli_replay::run_one(trace, dev, k, common, backend, pb)
        }
    }
}

#[derive(Serialize)]
struct CompareReport<'a> {
    trace: String,
    device: i64,
    pytorch: Option<&'a PytorchReserved>,
    strategies: Vec<&'a ReplayReport>,
    not_run: &'a [NotRun],
}

/// A contender that could not run with the given options.
#[derive(Serialize)]
pub struct NotRun {
    /// Its name.
    pub strategy: String,
    /// Why.
    pub reason: String,
}

/// Runs `gpuheap compare`.
///
/// # Errors
/// [`CliError::Input`] for bad input (exit 2), [`CliError::Runtime`] otherwise (exit 1).
pub fn run(a: &Args) -> Result<(), CliError> {
    let plot_format = a.common.plot.as_deref().map(cli_replay::check_plot_path).transpose()?;
    let (trace, idx) = cli_replay::load(&a.trace, a.common.device)?;
    let dev = &trace.devices[idx];
    let backend = cli_replay::backend_for(&a.common)?;
    let list = contenders();
    let pb = cli_replay::progress_bar(dev.events.len() * list.len(), a.common.json, "compare");
    let mut reports = Vec::with_capacity(list.len());
    let mut not_run: Vec<NotRun> = Vec::new();
    for c in list {
        match run_contender(c, &trace, dev, &a.common, backend.as_ref(), &pb) {
            Ok(r) => reports.push(r),
            // A strategy that cannot use these options (e.g. the caching model below 2 MiB) is a row
            // with the reason, not a failure of the whole comparison.
            Err(CliError::Input(reason)) => {
                let Contender::Host(k) = c;
                not_run.push(NotRun { strategy: k.to_string(), reason });
            }
            Err(e) => return Err(e),
        }
    }
    if reports.is_empty() {
        let why: Vec<String> = not_run.iter().map(|n| format!("{}: {}", n.strategy, n.reason)).collect();
        return Err(CliError::Input(why.join("; ")));
    }
    pb.finish_and_clear();
    let refs: Vec<&ReplayReport> = reports.iter().collect();
    if let (Some(p), Some(f)) = (&a.common.plot, plot_format) {
        let title = format!("{} — all strategies", cli_replay::file_name(&a.trace));
        cli_replay::write_plot(p, f, &title, &refs)?;
    }
    let pytorch = reports.first().and_then(|r| r.pytorch.as_ref());
    if a.common.json {
        let out = CompareReport {
            trace: trace.source.display().to_string(),
            device: dev.device,
            pytorch,
            strategies: refs,
            not_run: &not_run,
        };
        println!("{}", serde_json::to_string_pretty(&out).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        print!("{}", table(&reports, &not_run, gpuheap::replay::demand_peak(dev).1));
    }
    Ok(())
}

/// The comparison table.
///
/// `demand` is the trace's peak of live requested bytes (PyTorch's row: PyTorch served every request).
pub fn table(reports: &[ReplayReport], not_run: &[NotRun], demand: u64) -> String {
    let Some(first) = reports.first() else { return String::new() };
    let mut s = format!(
        "trace {} ({}), device {}: {} events, {} initial blocks\ncapacity {} ({}), requests aligned to {} B, compaction {}\n\n",
        first.trace,
        first.format,
        first.device,
        first.events,
        first.initial_blocks,
        fmt_bytes(first.capacity.bytes),
        first.capacity.source,
        first.align,
        first.policy
    );
    s += &format!(
        "{:<20}{:>12}{:>12}{:>8}{:>8}{:>16}{:>12}{:>9}{:>12}{:>9}{:>12}{:>9}\n",
        "strategy",
        "peak alloc",
        "peak resv",
        "util",
        "J-W #4",
        "failed cap/frag",
        "unalloc@pk",
        "Fext@pk",
        "resv@end",
        "Fext@end",
        "compactions",
        "Mev/s"
    );
    for r in reports {
        let cap = r.failed.iter().filter(|f| f.class == "capacity").count();
        let frag = r.failed.iter().filter(|f| f.class == "fragmentation").count();
        let rej = r.failed.len() - cap - frag;
        let failed = if rej > 0 { format!("{cap}/{frag} +{rej}rej") } else { format!("{cap}/{frag}") };
        s += &format!(
            "{:<20}{:>12}{:>12}{:>8}{:>8.3}{:>16}{:>12}{:>9.3}{:>12}{:>9.3}{:>12}{:>9.2}\n",
            r.strategy,
            fmt_bytes(r.peak_allocated),
            fmt_bytes(r.peak_reserved),
            cli_replay::pct(r.utilisation),
            r.johnstone_wilson,
            failed,
            fmt_bytes(r.at_peak.reserved_unallocated),
            r.at_peak.external,
            fmt_bytes(r.at_end.footprint),
            r.at_end.external,
            r.compactions.len(),
            r.events_per_s / 1e6
        );
    }
    for n in not_run {
        s += &format!("{:<20}not run: {}\n", n.strategy, n.reason);
    }
    if let Some(pt) = &first.pytorch {
        let util = if pt.peak == 0 { 1.0 } else { demand as f64 / pt.peak as f64 };
        let jw = if demand == 0 { 0.0 } else { (pt.peak as f64 - demand as f64) / demand as f64 };
        s += &format!(
            "{:<20}{:>12}{:>12}{:>8}{:>8.3}{:>16}{:>12}{:>9}{:>12}{:>9}{:>12}{:>9}\n",
            "PyTorch (snapshot)",
            fmt_bytes(demand),
            fmt_bytes(pt.peak),
            cli_replay::pct(util),
            jw,
            format!("{} oom", pt.ooms),
            "",
            "",
            fmt_bytes(pt.snapshot_reserved.unwrap_or(pt.end)),
            "",
            "",
            ""
        );
        if let (Some(res), Some(n)) = (pt.snapshot_reserved, pt.snapshot_segments) {
            s += &format!(
                "\nPyTorch's own reserved bytes: {} at start, peak {} (segment events), snapshot final state {} in {n} segments\n",
                fmt_bytes(pt.initial),
                fmt_bytes(pt.peak),
                fmt_bytes(res)
            );
        }
    }
    for r in reports.iter().filter(|r| !r.compactions.is_empty()) {
        s += &format!("\ncompactions of {}:\n{}", r.strategy, cli_replay::compaction_lines(r));
    }
    s
}
