//! The text pages of `gpuheap replay` ([`ReplayReport::render_text`]) and `gpuheap compare`
//! ([`Comparison::render_text`]), rendered from the same fields as their JSON: the command line and
//! the Python package print these.

use super::compare::{Comparison, NotRun};
use super::{MeasureOutcome, ReplayReport};
use crate::units::{fmt_bytes, fmt_ns, fmt_rate, pct};

impl ReplayReport {
    /// The page `gpuheap replay` prints: the run, the peaks, fragmentation at the demand peak and at the
    /// end, PyTorch's own reserved bytes, the failed requests (the first 10), the tiers and the
    /// compactions. `strategy_note` follows the strategy's name (why it was chosen, or "").
    pub fn render_text(&self, strategy_note: &str) -> String {
        table(self, strategy_note)
    }
}

impl Comparison {
    /// The page `gpuheap compare` prints: one row per contender, PyTorch's own row, and one summary
    /// line per strategy that compacted (with `verbose` also every compaction). `demand` is the trace's
    /// peak of live requested bytes ([`crate::facts::demand_peak`]; PyTorch's row: PyTorch served every
    /// request).
    pub fn render_text(&self, demand: u64, verbose: bool) -> String {
        compare_table(&self.strategies, &self.not_run, demand, verbose)
    }
}

/// An event index for a table: the index, or `start` for the moment before the first event.
pub(crate) fn ev(e: Option<usize>) -> String {
    e.map_or_else(|| "start".to_string(), |i| i.to_string())
}

/// One line per compaction.
fn compaction_lines(r: &ReplayReport) -> String {
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
fn table(r: &ReplayReport, strategy_note: &str) -> String {
    let mut s = String::new();
    s += &format!("trace          {} ({}), device {}\n", r.trace, r.format, r.device);
    s += &format!("strategy       {}{strategy_note}\ncapacity       {}\n", r.strategy, setup_line(r));
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
    // Rounding failures (the strategy's rounding, not the capacity, left too few bytes) are named where
    // there are any.
    let rounding = match count("rounding") {
        0 => String::new(),
        n => format!(", {n} rounding"),
    };
    s += &format!(
        "failed         {} requests ({} capacity, {} fragmentation{rounding}, {} rejected)\n",
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
fn tier_lines(r: &ReplayReport) -> String {
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

/// The comparison table.
///
/// The replay's setup after "capacity": the capacity and where it came from, the request alignment and
/// its source, the compaction policy (the replay and the compare pages).
fn setup_line(r: &ReplayReport) -> String {
    format!(
        "{} ({}), requests aligned to {} B ({}), compaction {}",
        fmt_bytes(r.capacity.bytes),
        r.capacity.describe(),
        r.align,
        r.align_source,
        r.policy
    )
}

/// `demand` is the trace's peak of live requested bytes (PyTorch's row: PyTorch served every request).
/// Compactions: one summary line per strategy that compacted ([`compaction_summary`]); with `verbose`
/// also every compaction.
fn compare_table(reports: &[ReplayReport], not_run: &[NotRun], demand: u64, verbose: bool) -> String {
    let Some(first) = reports.first() else { return String::new() };
    let mut s = format!(
        "trace {} ({}), device {}: {} events, {} initial blocks\ncapacity {}\n\n",
        first.trace,
        first.format,
        first.device,
        first.events,
        first.initial_blocks,
        setup_line(first)
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
        let count = |c: &str| r.failed.iter().filter(|f| f.class == c).count();
        let (cap, frag, rnd, rej) = (count("capacity"), count("fragmentation"), count("rounding"), count("rejected"));
        let mut failed = format!("{cap}/{frag}");
        if rnd > 0 {
            failed += &format!(" +{rnd}rnd");
        }
        if rej > 0 {
            failed += &format!(" +{rej}rej");
        }
        s += &format!(
            "{:<28}{:>12}{:>12}{:>8}{:>8.3}{:>16}{:>12}{:>16}{:>12}{:>16}{:>12}{:>9.2}\n",
            r.strategy,
            fmt_bytes(r.peak_allocated),
            fmt_bytes(r.peak_reserved),
            pct(r.utilisation),
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
        let (util, jw) = crate::facts::pytorch_ratios(demand, pt.peak, &first.history);
        s += &format!(
            "{:<28}{:>12}{:>12}{:>8}{:>8}{:>16}{:>12}{:>16}{:>12}{:>16}{:>12}{:>9}\n",
            "PyTorch (snapshot)",
            fmt_bytes(demand),
            fmt_bytes(pt.peak),
            util.map_or_else(|| "n/a".into(), pct),
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
    if reports.iter().any(|r| r.failed.iter().any(|f| f.class == "rounding")) {
        s += "rnd: failed for the strategy's rounding (the capacity holds the live requests and this one byte for \
              byte, not as rounded)\n";
    }
    if reports.iter().any(|r| r.device_heap.is_some()) {
        s += "device heap: compaction n/a (raw malloc blocks are pinned; only handle blocks of the movable region move)\n";
    }
    for r in reports.iter().filter(|r| r.tiers.is_some()) {
        s += "\n";
        s += &tier_lines(r);
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
            s += &format!("\ncompactions of {}:\n{}", r.strategy, compaction_lines(r));
        }
    }
    s
}

/// One line summing up `r`'s compactions: how many, bytes the plans move at full size, then the kernel
/// measurements in three groups (full size, scaled images, not measured with the reasons and their
/// counts), each with its bytes, kernel time and aggregate GB/s (bytes / summed kernel time, 10^9 B/s).
/// Scaled images are summed apart: their bytes are the images', not the layout's.
fn compaction_summary(r: &ReplayReport) -> String {
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
        format!("{n} ({} in {}{})", fmt_bytes(bytes), fmt_ns(ns), fmt_rate(bytes, ns))
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
