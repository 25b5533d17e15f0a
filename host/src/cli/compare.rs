//! `gpuheap compare TRACE [--capacity BYTES] [--compact P] [--backend B] [--device N]
//! [--device-heap-limit BYTES] [--verbose] [--json] [--plot FILE]`: every strategy over the same trace,
//! side by side, plus what PyTorch itself reserved according to the snapshot; one table and one plot.
//!
//! The table has one row per contender; under it, one summary line per strategy that compacted (count,
//! bytes planned, kernel measurements full size / scaled / not measured and why). `--verbose` lists every
//! compaction as `gpuheap replay` does; `--json` always has them all.
//!
//! The rows and the loop are the library's ([`gpuheap::replay::compare`], shared with the Python
//! package); this file adds the progress bar, the advice on the CLI's own flags, the table and the plot.

use gpuheap::reference::StrategyKind;
use gpuheap::replay::compare::{compare, contenders, CompareOptions, Contender, NotRun};
use gpuheap::replay::{MeasureOutcome, ReplayReport};
use gpuheap::units::{self, fmt_bytes};

use super::replay::{self as cli_replay, Common};
use super::CliError;

/// Arguments of `gpuheap compare`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace file (as for `gpuheap replay`).
    pub trace: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
    /// Largest device heap the device allocator's row creates before it replays a scaled trace (all
    /// sizes divided by a power of two; the row is then labelled "scaled 1/N"): bytes or with a unit.
    /// Default: 8GiB on the CPU backend, 75 % of free memory on a GPU.
    #[arg(long, value_parser = parse_limit)]
    pub device_heap_limit: Option<u64>,
    /// List every compaction of every strategy (default: one summary line per strategy).
    #[arg(long)]
    pub verbose: bool,
}

fn parse_limit(s: &str) -> Result<u64, units::ParseError> {
    units::parse_bytes(s)
}

/// Runs `gpuheap compare`.
///
/// # Errors
/// [`CliError::Input`] for bad input (exit 2), [`CliError::Runtime`] otherwise (exit 1).
pub fn run(a: &Args) -> Result<(), CliError> {
    let plot_format = a.common.plot.as_deref().map(|p| cli_replay::check_plot_path(p, &a.trace)).transpose()?;
    a.common.html.as_deref().map(|p| super::replay::check_output(p, &a.trace)).transpose()?;
    let (trace, idx) = cli_replay::load(&a.trace, a.common.device)?;
    let dev = &trace.devices[idx];
    cli_replay::check_capacity(&trace, dev, &a.common)?;
    let backend = cli_replay::backend_for(&a.common)?;
    // The device row always runs on a backend, whatever the compaction policy.
    let owned;
    let device_backend = match &backend {
        Some(b) => b,
        None => {
            owned = a.common.backend.backend()?;
            &owned
        }
    };
    // Built for tiered so that `--tiers` is kept; each row sets its own strategy.
    let opts = CompareOptions::new(cli_replay::replay_options(&a.common, StrategyKind::Tiered), a.device_heap_limit);
    let pb = cli_replay::progress_bar(dev.events.len() * contenders().len(), a.common.json, "compare");
    let cmp = compare(&trace, dev, |c| {
        pb.set_message(c.name());
        pb.set_position(0);
        let mut progress = |n: usize| pb.set_position(n as u64);
        let r = c.replay(&trace, dev, &opts, backend.as_ref(), device_backend, &mut progress);
        match c {
            Contender::Host(_) => r.map_err(cli_replay::with_advice),
            Contender::Device => r,
        }
    })
    .map_err(cli_replay::map_replay_err)?;
    pb.finish_and_clear();
    let (reports, not_run) = (&cmp.strategies, &cmp.not_run);
    let refs: Vec<&ReplayReport> = reports.iter().collect();
    if let (Some(p), Some(f)) = (&a.common.plot, plot_format) {
        let title = format!("{} — all strategies", cli_replay::file_name(&a.trace));
        cli_replay::write_plot(p, f, &title, &refs)?;
    }
    if let Some(p) = &a.common.html {
        let title = format!("{} — all strategies", cli_replay::file_name(&a.trace));
        let not_run: Vec<(String, String)> = not_run.iter().map(|n| (n.strategy.clone(), n.reason.clone())).collect();
        let page = gpuheap::html::pages::compare_page(&title, &refs, &not_run, gpuheap::facts::demand_peak(dev).1);
        super::html::write(p, &page)?;
    }
    if a.common.json {
        println!("{}", serde_json::to_string_pretty(&cmp).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        print!("{}", table(reports, not_run, gpuheap::facts::demand_peak(dev).1, a.verbose));
    }
    Ok(())
}

/// The comparison table.
///
/// `demand` is the trace's peak of live requested bytes (PyTorch's row: PyTorch served every request).
/// Compactions: one summary line per strategy that compacted ([`compaction_summary`]); with `verbose`
/// also every compaction.
pub fn table(reports: &[ReplayReport], not_run: &[NotRun], demand: u64, verbose: bool) -> String {
    let Some(first) = reports.first() else { return String::new() };
    let mut s = format!(
        "trace {} ({}), device {}: {} events, {} initial blocks\ncapacity {} ({}), requests aligned to {} B ({}), compaction {}\n\n",
        first.trace,
        first.format,
        first.device,
        first.events,
        first.initial_blocks,
        fmt_bytes(first.capacity.bytes),
        first.capacity.describe(),
        first.align,
        first.align_source,
        first.policy
    );
    s += &format!(
        "{:<28}{:>12}{:>12}{:>8}{:>8}{:>16}{:>12}{:>16}{:>12}{:>16}{:>12}{:>9}\n",
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
            "{:<28}{:>12}{:>12}{:>8}{:>8.3}{:>16}{:>12}{:>16}{:>12}{:>16}{:>12}{:>9.2}\n",
            r.strategy,
            fmt_bytes(r.peak_allocated),
            fmt_bytes(r.peak_reserved),
            units::pct(r.utilisation),
            r.johnstone_wilson,
            failed,
            fmt_bytes(r.at_peak.reserved_unallocated),
            format!("{:.3} {}", r.at_peak.external, r.at_peak.level),
            fmt_bytes(r.at_end.footprint),
            format!("{:.3} {}", r.at_end.external, r.at_end.level),
            if r.device_heap.is_some() { "n/a".to_string() } else { r.compactions.len().to_string() },
            r.events_per_s / 1e6
        );
    }
    for n in not_run {
        s += &format!("{:<28}not run: {}\n", n.strategy, n.reason);
    }
    if let Some(pt) = &first.pytorch {
        // No ratio from what the history is missing (`facts::pytorch_ratios`).
        let (util, jw) = gpuheap::facts::pytorch_ratios(demand, pt.peak, &first.history);
        s += &format!(
            "{:<28}{:>12}{:>12}{:>8}{:>8}{:>16}{:>12}{:>16}{:>12}{:>16}{:>12}{:>9}\n",
            "PyTorch (snapshot)",
            fmt_bytes(demand),
            fmt_bytes(pt.peak),
            util.map_or_else(|| "n/a".into(), units::pct),
            jw.map_or_else(|| "n/a".into(), |j| format!("{j:.3}")),
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
    let scaled: Vec<&ReplayReport> =
        reports.iter().filter(|r| r.device_heap.as_ref().is_some_and(|d| d.scaled_by > 1)).collect();
    for r in scaled {
        let d = r.device_heap.as_ref().expect("filtered");
        s += &format!(
            "\n{}: replayed scaled 1/{} on {} ({}); its byte figures are the scaled replay's (capacity {} for \
             the trace's {}), its ratios compare with the other rows\n",
            r.strategy,
            d.scaled_by,
            d.backend,
            d.scale_reason.as_deref().unwrap_or("scaled"),
            fmt_bytes(d.heap_capacity),
            fmt_bytes(d.trace_capacity)
        );
    }
    s += "Fext: external fragmentation 1 - largest free / free at the demand peak and at the end, with its level \
          (low < 0.1, medium < 0.3, high < 0.6, severe)\n";
    if reports.iter().any(|r| r.device_heap.is_some()) {
        s += "device heap: compaction n/a (raw malloc blocks are pinned; only handle blocks of the movable region move)\n";
    }
    for r in reports.iter().filter(|r| r.tiers.is_some()) {
        s += "\n";
        s += &cli_replay::tier_lines(r);
    }
    let compacted: Vec<&ReplayReport> = reports.iter().filter(|r| !r.compactions.is_empty()).collect();
    if !compacted.is_empty() {
        s += "\ncompactions (one line per strategy; --verbose lists each, --json has all):\n";
        for r in &compacted {
            s += &format!("  {:<12}{}\n", r.strategy, compaction_summary(r));
        }
    }
    if verbose {
        for r in compacted {
            s += &format!("\ncompactions of {}:\n{}", r.strategy, cli_replay::compaction_lines(r));
        }
    }
    s
}

/// One line summing up `r`'s compactions: how many, bytes the plans move at full size, then the kernel
/// measurements in three groups (full size, scaled images, not measured with the reasons and their
/// counts), each with its bytes, kernel time and aggregate GB/s (bytes / summed kernel time, 10^9 B/s).
/// Scaled images are summed apart: their bytes are the images', not the layout's.
pub fn compaction_summary(r: &ReplayReport) -> String {
    let planned: u64 = r.compactions.iter().map(|c| c.planned_bytes_moved).sum();
    let (mut full, mut scaled) = ((0u64, 0u64, 0usize), (0u64, 0u64, 0usize));
    let mut factors: Vec<u64> = Vec::new();
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for c in &r.compactions {
        match &c.measurement {
            MeasureOutcome::Measured(m) => {
                let g = if m.scaled_by == 1 { &mut full } else { &mut scaled };
                g.0 += m.bytes_moved;
                g.1 += m.kernel_ns;
                g.2 += 1;
                if m.scaled_by > 1 && !factors.contains(&m.scaled_by) {
                    factors.push(m.scaled_by);
                }
            }
            MeasureOutcome::NotMeasured { reason } => match reasons.iter_mut().find(|(r, _)| r == reason) {
                Some(e) => e.1 += 1,
                None => reasons.push((reason.clone(), 1)),
            },
        }
    }
    let group = |(bytes, ns, n): (u64, u64, usize)| {
        if n == 0 {
            return "0".to_string();
        }
        format!("{n} ({} in {}{})", fmt_bytes(bytes), units::fmt_ns(ns), units::fmt_rate(bytes, ns))
    };
    let retried = r.compactions.iter().filter(|c| c.retry_succeeded == Some(true)).count();
    let mut s = format!("{} compactions, {} planned", r.compactions.len(), fmt_bytes(planned));
    if r.compactions.iter().any(|c| c.retry_succeeded.is_some()) {
        s += &format!(", {retried} retries succeeded");
    }
    s += &format!("; measured full size {}", group(full));
    factors.sort_unstable();
    let f: Vec<String> = factors.iter().map(|f| format!("1/{f}")).collect();
    s += &format!("; scaled {}", group(scaled));
    if !f.is_empty() {
        s += &format!(" [{}]", f.join(", "));
    }
    let not: usize = reasons.iter().map(|r| r.1).sum();
    s += &format!("; not measured {not}");
    if not > 0 {
        let why: Vec<String> = reasons.iter().map(|(r, n)| format!("{n}: {r}")).collect();
        s += &format!(" ({})", why.join("; "));
    }
    s
}
