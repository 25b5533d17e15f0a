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
use gpuheap::replay::compare::{compare, contenders, CompareOptions, Contender};
use gpuheap::replay::ReplayReport;
use gpuheap::units;

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
    let reports = &cmp.strategies;
    let refs: Vec<&ReplayReport> = reports.iter().collect();
    if let (Some(p), Some(f)) = (&a.common.plot, plot_format) {
        let title = format!("{} — all strategies", cli_replay::file_name(&a.trace));
        cli_replay::write_plot(p, f, &title, &refs)?;
    }
    if let Some(p) = &a.common.html {
        let title = format!("{} — all strategies", cli_replay::file_name(&a.trace));
        let page = gpuheap::html::pages::compare_page(&title, &cmp, gpuheap::facts::demand_peak(dev).1);
        super::html::write(p, &page)?;
    }
    if a.common.json {
        println!("{}", serde_json::to_string_pretty(&cmp).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        print!("{}", cmp.render_text(gpuheap::facts::demand_peak(dev).1, a.verbose));
    }
    Ok(())
}
